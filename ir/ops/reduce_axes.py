"""Reductions over any set of axes, with ONNX's semantics: ReduceSum, ReduceMean, ReduceMax,
ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare,
InvStdDev (LayerNormalization's third output), and ArgMax / ArgMin along one axis.

Every reduce op runs one kernel, ``shaders/reduce_axes.wgsl``: the input is viewed through
:func:`axis_layout` as at most 4 kept and 4 reduced dimensions with their strides, and the
op fills the kernel's combining slots (term, combine, finish). Floats accumulate in f32;
i32 accumulates in i32 and wraps, and the references wrap likewise (:func:`wrap_i32`).
Attributes hold the reduced axes already resolved: non-negative, sorted, without repeats
(the ONNX converter resolves negative axes, the axes input and ``noop_with_empty_axes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import LoweringError
from ..kernel import Kernel, elementwise_groups
from ..spec import Attr, need, need_axes, no_grad, op
from ..types import DType, TensorType

FAMILY = "reduce_axes"

#: The reason autodiff gives for the ops of this module and its ONNX companions.
INFERENCE = no_grad("it serves ONNX inference; the ops eggfuse trains with (SumAll, MeanAll, Softmax, LayerNorm, "
                    "RmsNorm, GroupNorm, ...) have gradients")

#: Reductions at least this long get a workgroup per output element (kernel entry ``per_group``).
GROUP_MIN_LEN = 64
#: Outputs from which an innermost kept axis makes one invocation per output the faster form
#: (neighbouring invocations read neighbouring elements).
COALESCED_MIN_OUT = 1024


def wrap_i32(a: np.ndarray) -> np.ndarray:
    """Integers wrapped to int32 as the device's i32 arithmetic wraps (returned as int64)."""
    return ((np.asarray(a, dtype=np.int64) + 2**31) % 2**32) - 2**31


def axis_layout(shape: tuple[int, ...], axes: tuple[int, ...]) -> dict[str, list[int]]:
    """The kernel's view of a contiguous ``shape`` reduced over ``axes``.

    Size-1 axes are dropped and neighbours that are both kept or both reduced merged into
    one strided dimension. Returns ``keep_dims``/``keep_st`` and ``red_dims``/``red_st``
    (sizes and element strides, outermost first, padded at the front to 4 with size 1,
    stride 0) and ``inner_kept`` ([1] when the innermost merged dimension is kept, else [0]).
    Raises LoweringError when more than 4 kept or 4 reduced dimensions remain (axes that
    alternate over a rank above 8).
    """
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    runs: list[list] = []  # [size, stride, reduced]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        red = d in axes
        if runs and runs[-1][2] == red:
            runs[-1][0] *= size
            runs[-1][1] = strides[d]
        else:
            runs.append([size, strides[d], red])
    out: dict[str, list[int]] = {}
    for kind, red in (("keep", False), ("red", True)):
        sel = [r for r in runs if r[2] == red]
        if len(sel) > 4:
            raise LoweringError(f"reduction of {list(shape)} over axes {list(axes)} alternates {len(runs)} kept and "
                                "reduced dimensions after merging; the kernels over axes take 4 of each")
        pad = 4 - len(sel)
        out[f"{kind}_dims"] = [1] * pad + [r[0] for r in sel]
        out[f"{kind}_st"] = [0] * pad + [r[1] for r in sel]
    out["inner_kept"] = [int(bool(runs) and not runs[-1][2])]
    return out


def layout_params(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple, dict[str, str], int, bool]:
    """The kernels' view of :func:`axis_layout`: uniform fields keep_dims, keep_st, red_dims,
    red_st, n (groups) and red_len; the slots KEEP_AT and RED_AT (the offset of group o and
    of its r-th element: one multiply where one merged dimension remains, ``at`` of
    axes_common.wgsl otherwise); n; whether ``per_group`` is the better entry point."""
    lay = axis_layout(shape, axes)
    n, red_len = math.prod(lay["keep_dims"]), math.prod(lay["red_dims"])
    params = tuple((k, "vec4<u32>", lay[k]) for k in ("keep_dims", "keep_st", "red_dims", "red_st"))
    params += (("n", "u32", n), ("red_len", "u32", red_len))
    slots = {}
    for kind, v in (("keep", "o"), ("red", "r")):
        single = sum(d > 1 for d in lay[f"{kind}_dims"]) <= 1
        slots[f"{kind.upper()}_AT"] = f"{v} * p.{kind}_st.w" if single else f"at({v}, p.{kind}_dims, p.{kind}_st)"
    coalesced = lay["inner_kept"][0] and n >= COALESCED_MIN_OUT
    return params, slots, n, red_len >= GROUP_MIN_LEN and not coalesced


def check_axes(t: TensorType, axes: tuple[int, ...]) -> None:
    need_axes(axes, t, "axes")
    need(list(axes) == sorted(set(axes)), f"axes {list(axes)} must be sorted and distinct")


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in axes)


# --- the reduce ops -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    """One reduce op: its numpy reference ``fn(x, axes, attrs)`` (kept dimensions; the caller
    wraps i32 results and drops the reduced dimensions unless keepdims),
    the WGSL of its term, combine and finish for floats and (``int_ok``) for i32, its centre
    (0 none, 1 max, 2 mean), whether bool inputs are allowed, and its doc."""

    name: str
    fn: object
    term: str
    combine: str
    finish: str
    doc: str
    int_ok: bool = True
    bool_ok: bool = False
    centre: int = 0
    int_combine: str | None = None
    int_finish: str | None = None


def _lse(x, axes, a):
    # log(sum(exp(x))) with the max subtracted; -inf where every term is -inf, +inf where one is
    m = np.max(x, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        safe = np.where(np.isfinite(m), m, 0.0)
        s = np.sum(np.exp(x - safe), axis=axes, keepdims=True)
        return np.where(np.isinf(m), m, safe + np.log(s))


def _log(v):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(v)


def _inv_std(x, axes, a):
    mu = np.mean(x, axis=axes, keepdims=True)
    return 1.0 / np.sqrt(np.mean((x - mu) ** 2, axis=axes, keepdims=True) + a["epsilon"])


def _mean(x, axes, a):
    if x.dtype.kind not in "iu":
        return np.mean(x, axis=axes, keepdims=True)
    s = wrap_i32(np.sum(x, axis=axes, keepdims=True))
    count = math.prod(x.shape[d] for d in axes)
    return np.sign(s) * (np.abs(s) // count)  # WGSL's i32 division truncates toward zero


_SPEC = "ONNX {} (https://onnx.ai/onnx/operators/onnx__{}.html)"

REDUCTIONS: tuple[Reduction, ...] = (
    Reduction("ReduceSum", lambda x, ax, a: np.sum(x, axis=ax, keepdims=True), "v", "a + b", "a",
              "sum over the axes; " + _SPEC.format("ReduceSum", "ReduceSum")),
    Reduction("ReduceMean", _mean, "v", "a + b", "a / f32(p.red_len)",
              "mean over the axes (i32: the wrapped sum divided by the count, truncated toward zero); "
              + _SPEC.format("ReduceMean", "ReduceMean"), int_finish="a / i32(p.red_len)"),
    Reduction("ReduceMax", lambda x, ax, a: np.max(x, axis=ax, keepdims=True), "v", "max_nan(a, b)", "a",
              "maximum over the axes, NaN if any element is NaN (numpy maximum); bool: any; "
              + _SPEC.format("ReduceMax", "ReduceMax"), bool_ok=True, int_combine="max(a, b)"),
    Reduction("ReduceMin", lambda x, ax, a: np.min(x, axis=ax, keepdims=True), "v", "min_nan(a, b)", "a",
              "minimum over the axes, NaN if any element is NaN (numpy minimum); bool: all; "
              + _SPEC.format("ReduceMin", "ReduceMin"), bool_ok=True, int_combine="min(a, b)"),
    Reduction("ReduceProd", lambda x, ax, a: np.prod(x, axis=ax, keepdims=True), "v", "a * b", "a",
              "product over the axes; " + _SPEC.format("ReduceProd", "ReduceProd")),
    Reduction("ReduceL1", lambda x, ax, a: np.sum(np.abs(x), axis=ax, keepdims=True), "abs(v)", "a + b", "a",
              "sum of |x| over the axes; " + _SPEC.format("ReduceL1", "ReduceL1")),
    Reduction("ReduceL2", lambda x, ax, a: np.sqrt(np.sum(x * x, axis=ax, keepdims=True)), "v * v", "a + b", "sqrt(a)",
              "sqrt of the sum of x^2 over the axes (float only); " + _SPEC.format("ReduceL2", "ReduceL2"),
              int_ok=False),
    Reduction("ReduceLogSum", lambda x, ax, a: _log(np.sum(x, axis=ax, keepdims=True)), "v", "a + b", "log_ieee(a)",
              "log of the sum over the axes, -inf at 0 and NaN below (float only); "
              + _SPEC.format("ReduceLogSum", "ReduceLogSum"), int_ok=False),
    Reduction("ReduceLogSumExp", _lse, "exp(v - c)", "a + b",
              "select(select(c + log(a), neg_inf(), a <= 0.0), c, abs(c) > 3.4028234663852886e38)",  # c infinite
              "log(sum(exp(x))) over the axes, the maximum m subtracted first: m + log(sum(exp(x - m))), so large x "
              "do not overflow; -inf where every element is -inf, +inf where one is +inf (float only); "
              + _SPEC.format("ReduceLogSumExp", "ReduceLogSumExp"), int_ok=False, centre=1),
    Reduction("ReduceSumSquare", lambda x, ax, a: np.sum(x * x, axis=ax, keepdims=True), "v * v", "a + b", "a",
              "sum of x^2 over the axes; " + _SPEC.format("ReduceSumSquare", "ReduceSumSquare")),
    Reduction("InvStdDev", _inv_std, "(v - c) * (v - c)", "a + b", "1.0 / sqrt(a / f32(p.red_len) + p.eps)",
              "1 / sqrt(var + epsilon) over the axes, var the biased variance computed around the mean in a second "
              "pass: the InvStdDev output of ONNX LayerNormalization "
              "(https://onnx.ai/onnx/operators/onnx__LayerNormalization.html)", int_ok=False, centre=2),
)
REDUCTION_BY_NAME = {r.name: r for r in REDUCTIONS}


def _reduce_infer(name: str):
    r = REDUCTION_BY_NAME[name]

    def infer(ts, a):
        x = ts[0]
        ok = {DType.F32} | ({DType.I32} if r.int_ok else set()) | ({DType.BOOL} if r.bool_ok else set())
        need(x.dtype in ok, f"input must be {' or '.join(sorted(d.value for d in ok))}, got {x}")
        check_axes(x, a["axes"])
        return TensorType(reduced_shape(x.shape, a["axes"], a["keepdims"]), x.dtype)

    return infer


def _reduce_ref(name: str):
    r = REDUCTION_BY_NAME[name]

    def ref(xs, a):
        x, axes = xs[0], tuple(a["axes"])
        y = r.fn(x, axes, a)
        if x.dtype.kind in "iu":
            y = wrap_i32(y)
        return y.reshape(reduced_shape(x.shape, axes, a["keepdims"]))

    return ref


def _reduce_kernel(node, ins, target) -> Kernel:
    r = REDUCTION_BY_NAME[node.op]
    x = ins[0]
    params, offsets, n, per_group = layout_params(x.shape, node.attrs["axes"])
    eps = node.attrs.get("epsilon", 0.0)
    t = x.dtype.wgsl
    integer = x.dtype is not DType.F32
    combine = (r.int_combine or r.combine) if integer else r.combine
    finish = (r.int_finish or r.finish) if x.dtype is DType.I32 else r.finish
    entry = "per_group" if per_group else "per_element"
    return Kernel(f"{node.op}_{t}_{entry}", "reduce_axes.wgsl", n if per_group else elementwise_groups(n),
                  params=(*params, ("eps", "f32", eps)), entry_point=entry,
                  slots={"T": t, "CENTRE": str(r.centre), "TERM": r.term, "COMBINE": combine, "FINISH": finish,
                         **offsets})


_AXES = (Attr("axes", "ints", doc="the reduced axes: non-negative, sorted, distinct (none: a copy)"),
         Attr("keepdims", "bool", True))

for _r in REDUCTIONS:
    op(_r.name, ("x",), _reduce_infer(_r.name), _reduce_ref(_r.name),
       attrs=_AXES + ((Attr("epsilon", "float", 1e-5),) if _r.name == "InvStdDev" else ()),
       vjp=INFERENCE, kernel=_reduce_kernel, flops=lambda ins, out, a: ins[0].num_elements, doc=_r.doc)


# --- ArgMax, ArgMin, and the shared kernel of Hardmax -----------------------------------------------


def line_params(shape: tuple[int, ...], axis: int) -> tuple[tuple, int]:
    """The [outer, n, inner] view of ``shape`` around ``axis``: uniform fields lines (outer
    * inner), n and inner, and the number of lines."""
    n, inner = shape[axis], math.prod(shape[axis + 1:])
    lines = math.prod(shape) // n
    return (("lines", "u32", lines), ("n", "u32", n), ("inner", "u32", inner)), lines


def arg_kernel(node, x: TensorType, axis: int, cmp: str, last: bool, store: str) -> Kernel:
    """arg_reduce.wgsl for ArgMax/ArgMin/Hardmax: ``cmp`` of bv, av says when a value wins,
    ``last`` prefers the higher index among equals, ``store`` is the store function's body."""
    params, lines = line_params(x.shape, axis)
    per_group = x.shape[axis] >= GROUP_MIN_LEN
    t = x.dtype.wgsl
    entry = "per_group" if per_group else "per_element"
    groups = lines if per_group else elementwise_groups(lines)
    return Kernel(f"{node.op.lower()}_{t}_{entry}", "arg_reduce.wgsl", groups, params=params, entry_point=entry,
                  slots={"T": t, "NAN": "is_nan(v)" if t == "f32" else "false", "CMP": cmp,
                         "LAST": "true" if last else "false", "STORE": store})


def _arg_infer(ts, a):
    x = ts[0]
    need(x.dtype in (DType.F32, DType.I32), f"input must be f32 or i32, got {x}")
    need_axes([a["axis"]], x)
    return TensorType(reduced_shape(x.shape, (a["axis"],), a["keepdims"]), DType.I32)


def _arg_ref(fn):
    def ref(xs, a):
        x, axis = xs[0], a["axis"]
        if a["select_last_index"]:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        return np.expand_dims(idx, axis) if a["keepdims"] else idx

    return ref


def _arg_kernel(node, ins, target) -> Kernel:
    cmp = "bv > av" if node.op == "ArgMax" else "bv < av"
    return arg_kernel(node, ins[0], node.attrs["axis"], cmp, node.attrs["select_last_index"],
                      "if (li == 0u) { out[o] = i32(idx); }")


_ARG_ATTRS = (Attr("axis", "int"), Attr("keepdims", "bool", True), Attr("select_last_index", "bool", False))
for _name, _fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
    op(_name, ("x",), _arg_infer, _arg_ref(_fn), attrs=_ARG_ATTRS, vjp=INFERENCE, kernel=_arg_kernel,
       flops=lambda ins, out, a: ins[0].num_elements,
       doc=f"index (i32) of the {'largest' if _name == 'ArgMax' else 'smallest'} element along axis, the first "
           "one among equals (the last with select_last_index), a NaN before any number (numpy "
           f"{_fn.__name__}); " + _SPEC.format(_name, _name))
