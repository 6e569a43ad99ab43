"""Scans and selections along one axis, with ONNX's semantics: CumSum, CumProd, and TopK's
two outputs as two ops, TopKValues and TopKIndices (an IR op has one output); and
PaddedPositionIds, the position ids RoBERTa's embeddings count from the padding, which the
recognition rules here find in an exporter's Equal, Not, Cast, CumSum, Mul and Add.

Each views its input as [outer, n, inner] around the axis (:func:`.reduce_axes.line_params`).
i32 arithmetic wraps, and the references wrap likewise.
"""

from __future__ import annotations

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, example, need, need_axes, op, rules
from ..types import DType, TensorType
from .reduce_axes import INFERENCE, line_params, wrap_i32

FAMILY = "scans"

#: Lines at least this long are scanned by a workgroup each (kernel entry ``per_group``).
SCAN_GROUP_MIN_LEN = 128


def _numeric_axis(ts, a) -> TensorType:
    x = ts[0]
    need(x.dtype in (DType.F32, DType.I32), f"input must be f32 or i32, got {x}")
    need_axes([a["axis"]], x)
    return x


# --- CumSum, CumProd -----------------------------------------------------------------------------


def _scan_ref(fn, identity):
    def ref(xs, a):
        x, axis = xs[0], a["axis"]
        if a["reverse"]:
            x = np.flip(x, axis=axis)
        y = fn(x, axis=axis)
        if a["exclusive"]:
            first = np.full_like(np.take(y, [0], axis=axis), identity)
            y = np.concatenate([first, np.take(y, range(x.shape[axis] - 1), axis=axis)], axis=axis)
        if a["reverse"]:
            y = np.flip(y, axis=axis)
        return wrap_i32(y) if x.dtype.kind in "iu" else y

    return ref


def _scan_dispatch(name: str, x: TensorType, axis: int, slots: dict, **kw) -> Kernel:
    # scan.wgsl along ``axis`` of ``x``: an invocation per line, or a workgroup per long line (SCAN_GROUP_MIN_LEN)
    params, lines = line_params(x.shape, axis)
    per_group = x.shape[axis] >= SCAN_GROUP_MIN_LEN
    entry = "per_group" if per_group else "per_element"
    return Kernel(f"{name}_{entry}", "scan.wgsl", lines if per_group else elementwise_groups(lines), params=params,
                  entry_point=entry, slots=slots, **kw)


def _scan_kernel(node, ins, target) -> Kernel:
    x, t, prod = ins[0], ins[0].dtype.wgsl, node.op == "CumProd"
    return _scan_dispatch(f"{node.op.lower()}_{t}", x, node.attrs["axis"],
                          {"T": t, "COMBINE": "a * b" if prod else "a + b", "IDENTITY": f"{t}({int(prod)})",
                           "EXCLUSIVE": "true" if node.attrs["exclusive"] else "false",
                           "REVERSE": "true" if node.attrs["reverse"] else "false",
                           "PROLOGUE": "return v;", "EPILOGUE": "return acc;"})


_SCAN_ATTRS = (Attr("axis", "int"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False))
op("CumSum", ("x",), _numeric_axis, _scan_ref(np.cumsum, 0), attrs=_SCAN_ATTRS, vjp=INFERENCE, kernel=_scan_kernel,
   doc="running sum along axis, inclusive or (exclusive) of the elements before, from the end when reverse; "
       "ONNX CumSum (https://onnx.ai/onnx/operators/onnx__CumSum.html)")
op("CumProd", ("x",), _numeric_axis, _scan_ref(np.cumprod, 1), attrs=_SCAN_ATTRS, vjp=INFERENCE, kernel=_scan_kernel,
   doc="running product along axis, inclusive or (exclusive) of the elements before, from the end when reverse; "
       "ONNX CumProd (https://onnx.ai/onnx/operators/onnx__CumProd.html)")


# --- PaddedPositionIds ---------------------------------------------------------------------------


def _padded_positions_infer(ts, a):
    x = ts[0]
    need(x.dtype is DType.I32, f"ids must be i32, got {x}")
    need_axes([a["axis"]], x)
    return x


def _padded_positions_ref(xs, a):
    kept = (xs[0] != a["pad"]).astype(np.int64)
    return wrap_i32(np.cumsum(kept, axis=a["axis"]) * kept + a["pad"])


def _padded_positions_kernel(node, ins, target) -> Kernel:
    # scan.wgsl's running sum of the kept flags, stored as pad + that count, or pad at a padding id
    pad = node.attrs["pad"]
    return _scan_dispatch("padded_position_ids", ins[0], node.attrs["axis"],
                          {"T": "i32", "COMBINE": "a + b", "IDENTITY": "i32(0)", "EXCLUSIVE": "false",
                           "REVERSE": "false", "PROLOGUE": f"return select(0i, 1i, v != i32({pad}));",
                           "EPILOGUE": f"return select(i32({pad}), acc + i32({pad}), v != i32({pad}));"},
                          bindings=(Buffer("x", "i32"), Buffer("out", "i32", write=True)))


op("PaddedPositionIds", ("ids",), _padded_positions_infer, _padded_positions_ref,
   attrs=(Attr("axis", "int"), Attr("pad", "int")), vjp=INFERENCE, kernel=_padded_positions_kernel,
   doc="i32 position ids of token ids along axis: pad + the count of non-pad ids up to and including each one, "
       "pad at a pad id, i.e. (cumsum(ids != pad) * (ids != pad)) + pad (i32 wrapping); transformers' "
       "create_position_ids_from_input_ids (RoBERTa, XLM-RoBERTa), recognised from an exporter's Equal, Not, Cast, "
       "CumSum, Mul and Add")


def _padded_positions_example(eq_first: bool, mul_first: bool, add_first: bool, pad: int = 1):
    # ids of both signs around pad (Cast(2 x, i32) of an input: the soundness inputs' i32 leaves are zeros), and
    # the exporters' chain over them in one operand order of each of Equal, Mul and Add
    def build(g, dim):
        shape = [dim("b", 1, 3), dim("s", 1, 6)]
        doubled = g.add_node("Mul", (g.input("x", shape), g.constant(np.array(2.0), shape=())))
        ids = g.add_node("Cast", (doubled,), to="i32")
        c = g.constant(np.array(pad, dtype=np.int32), shape=(), dtype=DType.I32)
        eq = g.add_node("Equal", (ids, c) if eq_first else (c, ids))
        m = g.add_node("Cast", (g.add_node("Not", (eq,)),), to="i32")
        cs = g.add_node("CumSum", (m,), axis=1)
        prod = g.add_node("Mul", (cs, m) if mul_first else (m, cs))
        c2 = g.constant(np.array(pad, dtype=np.int32), shape=(), dtype=DType.I32)
        g.set_outputs([g.add_node("Add", (prod, c2) if add_first else (c2, prod))])

    return example(build)


@rules("recognition")
def _padded_position_ids(e):
    ids, c1, c2 = e.vars("ids c1 c2")
    ax, pad = e.vars("ax pad", e.i64)
    # Add(Mul(CumSum(m, ax), m), pad) -> PaddedPositionIds(ids, ax, pad)   for m = Cast(Not(Equal(ids, pad)), i32),
    # ids i32, the two constants the same i32 scalar, and the sum of ids' shape (each op's operands in either order)
    for eq_first in (True, False):
        m = e.Cast(e.Not(e.Equal(ids, c1) if eq_first else e.Equal(c1, ids)), to=e.String("i32"))
        scan = e.CumSum(m, axis=ax, exclusive=e.Bool(False), reverse=e.Bool(False))
        for mul_first in (True, False):
            prod = e.Mul(scan, m) if mul_first else e.Mul(m, scan)
            for add_first in (True, False):
                lhs = e.Add(prod, c2) if add_first else e.Add(c2, prod)
                label = (f"Add({'Mul(CumSum(m), m)' if mul_first else 'Mul(m, CumSum(m))'}, pad)" if add_first
                         else f"Add(pad, {'Mul(CumSum(m), m)' if mul_first else 'Mul(m, CumSum(m))'})")
                which = "Equal(ids, pad)" if eq_first else "Equal(pad, ids)"
                yield e.equal(f"{label} -> PaddedPositionIds(ids, pad)   (m = Cast(Not({which}), i32))", lhs,
                              e.PaddedPositionIds(ids, axis=ax, pad=pad), e.is_i32(ids), e.int_value(c1, pad),
                              e.int_value(c2, pad), e.eq(e.shape(lhs)).to(e.shape(ids)),
                              example=_padded_positions_example(eq_first, mul_first, add_first))


# --- TopK ----------------------------------------------------------------------------------------


def _top_k_infer(indices: bool):
    def infer(ts, a):
        x = _numeric_axis(ts, a)
        k = a["k"]
        need(1 <= k <= x.shape[a["axis"]], f"k = {k} must lie in 1..{x.shape[a['axis']]} (the axis of {x})")
        shape = list(x.shape)
        shape[a["axis"]] = k
        return TensorType(tuple(shape), DType.I32 if indices else x.dtype)

    return infer


def top_k_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices along ``axis`` that sort ``x`` best first, equal values by their index (the
    reference implementation of ONNX TopK: numpy lexsort, NaN as the largest)."""
    ind = np.indices(x.shape)[axis]
    order = np.lexsort((-ind if largest else ind, x), axis=axis)
    return np.flip(order, axis=axis) if largest else order


def _top_k_ref(indices: bool):
    def ref(xs, a):
        x, axis = xs[0], a["axis"]
        order = np.take(top_k_order(x, axis, a["largest"]), range(a["k"]), axis=axis)
        return order if indices else np.take_along_axis(x, order, axis=axis)

    return ref


def _top_k_kernel(node, ins, target) -> Kernel:
    x, axis = ins[0], node.attrs["axis"]
    params, lines = line_params(x.shape, axis)
    t = x.dtype.wgsl
    store = "i32(i)" if node.op == "TopKIndices" else "v"
    return Kernel(f"{node.op.lower()}_{t}", "top_k.wgsl", elementwise_groups(lines * x.shape[axis]),
                  params=(*params, ("k", "u32", node.attrs["k"])),
                  slots={"T": t, "NAN": "is_nan(v)" if t == "f32" else "false", "STORE": store,
                         "LARGEST": "true" if node.attrs["largest"] else "false"},
                  loop_iterations=x.shape[axis])


_TOP_K_ATTRS = (Attr("k", "int"), Attr("axis", "int"), Attr("largest", "bool", True))
_TOP_K_DOC = ("the k {} along axis, largest first (or smallest first), equal values in index order; a NaN counts "
              "as larger than every number. ONNX TopK's {} output, sorted "
              "(https://onnx.ai/onnx/operators/onnx__TopK.html); the kernel is O(n^2) per line")
op("TopKValues", ("x",), _top_k_infer(False), _top_k_ref(False), attrs=_TOP_K_ATTRS, vjp=INFERENCE,
   kernel=_top_k_kernel, flops=lambda ins, out, a: ins[0].num_elements * ins[0].shape[a["axis"]],
   doc=_TOP_K_DOC.format("values", "Values"))
op("TopKIndices", ("x",), _top_k_infer(True), _top_k_ref(True), attrs=_TOP_K_ATTRS, vjp=INFERENCE,
   kernel=_top_k_kernel, flops=lambda ins, out, a: ins[0].num_elements * ins[0].shape[a["axis"]],
   doc=_TOP_K_DOC.format("indices (i32)", "Indices"))
