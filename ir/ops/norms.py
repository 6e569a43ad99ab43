"""Normalisations over rows or groups, and the softmaxes: RmsNorm, LayerNorm, GroupNorm
(and GroupNormSilu, its fusion with SiLU), Softmax, LogSoftmax and their gradients.

Row ops run one workgroup per row (or group) and reduce in workgroup memory. Gradient
kernels that are knowingly slow at scale say so in their WGSL header: LayerNormGradW /
RmsNormGradW (one workgroup per 256 columns walking every row) and GroupNormGradWeight
(group statistics recomputed per channel), for want of float atomics or saved statistics.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError, InputError
from ..kernel import REDUCTION_ITERATIONS, Kernel
from ..spec import NO_GRAD, OPS, VIEW_ALIGN, Attr, example, need, need_f32, no_grad, op, rules
from ..types import DType, TensorType
from .elementwise import like, sigmoid

FAMILY = "norms"


def _row_norm(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank >= 1, f"input must have rank >= 1 (rows of its last axis), got {x}")
    n = x.shape[-1]
    for t, what in zip(ts[1:], ("weight", "bias"), strict=False):
        need(t.shape == (n,), f"{what} must be [{n}] (the input's last axis), got {t}")
    return x


def _weight(xs):
    # the weight, or 1 where the op has none (RmsNorm(x), LayerNorm(x))
    return xs[1] if len(xs) > 1 else 1.0


def rms_norm_ref(xs, a):
    x = xs[0]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + a["eps"]) * _weight(xs)


def _layer_norm_ref(xs, a):
    x = xs[0]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + a["eps"]) * _weight(xs) + (xs[2] if len(xs) > 2 else 0.0)


def _rows(t: TensorType) -> tuple[int, int]:
    """(rows, n) of a tensor normalised over its last axis: n = its last dimension."""
    n = t.shape[-1]
    return t.num_elements // n, n


#: LayerNorm with its weight and bias, and RmsNorm with its weight, on matmul_split_layer_norm.wgsl's rows of lanes
#: (ir/ops/matmul_kernel.py layer_norm_lanes: quads, a row's values held in registers through both passes, the row
#: sums in subgroups) instead of layer_norm.wgsl and rms_norm.wgsl (one workgroup a row, every pass reading x).
#: GPT-2 small's exported plan at 8 x 128 tokens (24 LayerNorms of 768) on an H100, three alternated rounds: 6,490-6,523
#: us GPU against 6,540-6,555 with layer_norm.wgsl (bench/results/norm_lanes_h100/ab_norm_lanes_gpt2.json).
ROW_NORM_LANES = True


def _row_norm_kernel(node, ins, target) -> Kernel:
    rows, n = _rows(node.type)
    centred = node.op == "LayerNorm"
    if ROW_NORM_LANES and len(ins) == (3 if centred else 2):
        return _row_norm_lanes(node.op, rows, n, node.attrs["eps"])
    return row_norm_kernel(node.op, rows, n, node.attrs["eps"], len(ins) > 1, len(ins) > 2)


def _row_norm_lanes(op: str, rows: int, n: int, eps: float) -> Kernel:
    # matmul_split_layer_norm.wgsl with VALUE reading x (bound as vec4 where a row is quads): the weights' bindings
    # come first there, so inputs (w, bias, x) or (w, x)
    from ..kernel import Buffer
    from .matmul_kernel import layer_norm_groups, layer_norm_stage, layer_norm_value

    centred = op == "LayerNorm"
    lanes, slots, weights, out = layer_norm_stage(n, centred)
    if slots["WIDTH"] == 4:
        value = "fn value4(i: u32, j: u32) -> vec4<f32> {\n    return x[(i * p.n + j) / 4u];\n}"
        x = Buffer("x", "vec4<f32>")
    else:
        value, x = layer_norm_value(1, "fn value(i: u32, j: u32) -> f32 {\n    return x[i * p.n + j];\n}"), Buffer("x")
    slots.update(SPLITS=1, EPILOGUE="", VALUE=value)
    return Kernel(f"{'layer' if centred else 'rms'}_norm_lanes", "matmul_split_layer_norm.wgsl",
                  layer_norm_groups(rows, lanes), params=(("m", "u32", rows), ("n", "u32", n), ("eps", "f32", eps)),
                  slots=slots, bindings=(*weights, x, out), inputs=(1, 2, 0) if centred else (1, 0))


def row_norm_kernel(op: str, rows: int, n: int, eps: float, weight: bool, bias: bool) -> Kernel:
    """The kernel of ``op`` (LayerNorm or RmsNorm) over ``rows`` rows of ``n``, with its weight
    ``w`` and (LayerNorm) ``bias`` read or taken as 1 and 0 (also the first dispatch of a
    FusedLayerNormMatMul of few rows: ir/ops/matmul_kernel.py)."""
    body = "layer_norm.wgsl" if op == "LayerNorm" else "rms_norm.wgsl"
    affine = ("" if weight else "_noweight") + ("_nobias" if op == "LayerNorm" and not bias else "")
    return Kernel(body[:-5] + affine, body, rows, params=(("rows", "u32", rows), ("n", "u32", n), ("eps", "f32", eps)),
                  slots={"W": "w[j]" if weight else "1.0",
                         **({"B": "bias[j]" if bias else "0.0"} if op == "LayerNorm" else {})})


def _ones(b, x):
    """The weight of a norm that has none: ones over ``x``'s last axis (a Constant)."""
    return b.const(np.ones(b.type(x).shape[-1]))


def _rms_norm_vjp(b, node, dy, want):
    x = node.inputs[0]
    w = node.inputs[1] if len(node.inputs) > 1 else _ones(b, x)
    eps = node.attrs["eps"]
    grads = [b.emit("RmsNormGradX", (dy, x, w), eps=eps) if want[0] else None]
    if len(node.inputs) > 1:
        grads.append(b.emit("RmsNormGradW", (dy, x), eps=eps) if want[1] else None)
    return grads


def _layer_norm_vjp(b, node, dy, want):
    x = node.inputs[0]
    w = node.inputs[1] if len(node.inputs) > 1 else _ones(b, x)
    eps = node.attrs["eps"]
    grads = [b.emit("LayerNormGradX", (dy, x, w), eps=eps) if want[0] else None]
    if len(node.inputs) > 1:
        grads.append(b.emit("LayerNormGradW", (dy, x), eps=eps) if want[1] else None)
    if len(node.inputs) > 2:
        grads.append(b.emit("SumRows", (b.reshape(dy, _rows(b.type(dy))),)) if want[2] else None)
    return grads


_EPS = (Attr("eps", "float", 1e-5, minimum=0.0),)
op("RmsNorm", ("x", "w?"), _row_norm, rms_norm_ref, attrs=_EPS, vjp=_rms_norm_vjp, kernel=_row_norm_kernel,
   flops=lambda ins, out, a: 4 * out.num_elements,
   doc="x / sqrt(mean(x^2) + eps) * w over the last axis of x (rank >= 1; w [N], or none: 1) "
       "(Zhang & Sennrich 2019)")
op("LayerNorm", ("x", "w?", "bias?"), _row_norm, _layer_norm_ref, attrs=_EPS, vjp=_layer_norm_vjp,
   kernel=_row_norm_kernel, flops=lambda ins, out, a: 7 * out.num_elements,
   doc="(x - mean) / sqrt(var + eps) * w + b over the last axis of x (rank >= 1), biased variance; w, b [N] "
       "or none (1 and 0) (Ba et al. 2016)")


# --- row norm gradients ------------------------------------------------------------------------


def _norm_grad_x(ts, a):
    like(ts, "x", 1)
    x, w = ts[1], ts[2]
    need(x.rank >= 1 and w.shape == (x.shape[-1],), f"needs x [..., N] and weight [N], got x {x}, weight {w}")
    return x


def _norm_grad_w(ts, a):
    x = like(ts, "x", 1)
    need(x.rank >= 1, f"x must have rank >= 1, got {x}")
    return TensorType((x.shape[-1],))


def _over_rows(v):
    """Sum over every axis but the last: [..., N] -> [N]."""
    return v.reshape(-1, v.shape[-1]).sum(axis=0)


def _layer_norm_parts(x, eps):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mu) * rstd, rstd


def _layer_norm_grad_x_ref(xs, a):
    dy, x, w = xs
    xhat, rstd = _layer_norm_parts(x, a["eps"])
    g = dy * w
    return rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))


def _rms_rstd(x, eps):
    return 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _rms_norm_grad_x_ref(xs, a):
    dy, x, w = xs
    r = _rms_rstd(x, a["eps"])
    g = dy * w
    return r * (g - x * r * r * (g * x).mean(axis=-1, keepdims=True))


def _norm_grad_x_kernel(node, ins, target) -> Kernel:
    eps = node.attrs["eps"]
    if node.op == "GroupNormGradInput":
        n, c, size = node.type.shape
        g = node.attrs["num_groups"]
        segs, geometry = n * g, (g, c // g * size, c // g, size)
    else:
        segs, width = _rows(node.type)
        geometry = (1, width, width, 1)
    centered = node.op != "RmsNormGradX"
    params = (("segs", "u32", segs), *zip(("g", "len", "cpg", "s"), ("u32",) * 4, geometry, strict=True),
              ("eps", "f32", eps))
    return Kernel("norm_grad_x" + ("" if centered else "_rms"), "norm_grad_x.wgsl", segs, params=params,
                  slots={"CENTERED": "true" if centered else "false"})


def _norm_grad_w_kernel(node, ins, target) -> Kernel:
    rows, n = _rows(ins[1])
    blocks = math.ceil(n / 256)
    centered = node.op == "LayerNormGradW"
    return Kernel("norm_grad_w" + ("" if centered else "_rms"), "norm_grad_w.wgsl", blocks,
                  params=(("rows", "u32", rows), ("n", "u32", n), ("blocks", "u32", blocks),
                          ("eps", "f32", node.attrs["eps"])),
                  slots={"CENTERED": "true" if centered else "false"})


op("LayerNormGradX", ("dy", "x", "w"), _norm_grad_x, _layer_norm_grad_x_ref, attrs=_EPS, vjp=NO_GRAD,
   kernel=_norm_grad_x_kernel,
   doc="dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w, xhat = (x - mean) rstd, rstd = 1/sqrt(var + "
       "eps), means over the last axis; inputs [dy, x, w], x [..., N] (seed: LayerNormGradX)")
op("LayerNormGradW", ("dy", "x"), _norm_grad_w,
   lambda xs, a: _over_rows(xs[0] * _layer_norm_parts(xs[1], a["eps"])[0]), attrs=_EPS, vjp=NO_GRAD,
   kernel=_norm_grad_w_kernel,
   doc="dw[j] = sum_i dy[i,j] xhat[i,j] over every row i of x [..., N]; inputs [dy, x] -> [N]. The seed's "
       "LayerNormGradWB split in two: the bias gradient is SumRows(dy)")
op("RmsNormGradX", ("dy", "x", "w"), _norm_grad_x, _rms_norm_grad_x_ref, attrs=_EPS, vjp=NO_GRAD,
   kernel=_norm_grad_x_kernel,
   doc="dx[i,j] = r_i (dy[i,j] w[j] - x[i,j] s_i), s_i = r_i^2 mean_j(dy w x)[i], r_i = 1/sqrt(mean_j "
       "x[i,j]^2 + eps) over the last axis; inputs [dy, x, w], x [..., N] (seed: RmsNormGradX)")
op("RmsNormGradW", ("dy", "x"), _norm_grad_w, lambda xs, a: _over_rows(xs[0] * xs[1] * _rms_rstd(xs[1], a["eps"])),
   attrs=_EPS, vjp=NO_GRAD, kernel=_norm_grad_w_kernel,
   doc="dw[j] = sum_i dy[i,j] x[i,j] r_i over every row i of x [..., N]; inputs [dy, x] -> [N] (seed: "
       "RmsNormGradW, which also takes w only for its shape)")


# --- GroupNorm, GroupNormSilu ------------------------------------------------------------------


def _group_norm(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank == 3, f"input must be [N, C, S] (batch, channels, spatial), got {x}")
    c, g = x.shape[1], a["num_groups"]
    need(g >= 1 and c % g == 0, f"{c} channels do not split into {g} groups")
    for t, what in zip(ts[1:], ("weight", "bias"), strict=True):
        need(t.shape == (c,), f"{what} must be [{c}], got {t}")
    return x


def _group_norm_ref(xs, a):
    x, w, b = xs
    n, c, s = x.shape
    g = x.reshape(n, a["num_groups"], -1)
    mu = g.mean(-1, keepdims=True)
    var = ((g - mu) ** 2).mean(-1, keepdims=True)
    y = ((g - mu) / np.sqrt(var + a["eps"])).reshape(n, c, s)
    return y * w[None, :, None] + b[None, :, None]


def _group_geometry(node, shape) -> tuple:
    n, c, size = shape
    g = node.attrs["num_groups"]
    return (("groups", "u32", n * g), ("g", "u32", g), ("len", "u32", c // g * size), ("cpg", "u32", c // g),
            ("s", "u32", size), ("eps", "f32", node.attrs["eps"]))


def _group_norm_kernel(node, ins, target) -> Kernel:
    silu = node.op == "GroupNormSilu"
    params = _group_geometry(node, node.type.shape)
    return Kernel("group_norm" + ("_silu" if silu else ""), "group_norm.wgsl", params[0][2], params=params,
                  slots={"ACT": "silu(v)" if silu else "v"})


def _group_norm_vjp(b, node, dy, want):
    x, w, _ = node.inputs
    attrs = {"num_groups": node.attrs["num_groups"], "eps": node.attrs["eps"]}
    c = b.type(x).shape[1]
    return [b.emit("GroupNormGradInput", (dy, x, w), **attrs) if want[0] else None,
            b.emit("GroupNormGradWeight", (dy, x), **attrs) if want[1] else None,
            b.reshape(b.emit("ReduceTo", (dy,), shape=(c, 1)), (c,)) if want[2] else None]


def _group_norm_silu_vjp(b, node, dy, want):
    z = b.emit("GroupNorm", node.inputs, num_groups=node.attrs["num_groups"], eps=node.attrs["eps"])
    return _group_norm_vjp(b, b.g.node(z), b.emit("SiluGrad", (dy, z)), want)


_GROUP_ATTRS = (Attr("num_groups", "int"), Attr("eps", "float", 1e-5, minimum=0.0))
op("GroupNorm", ("x", "w", "bias"), _group_norm, _group_norm_ref, attrs=_GROUP_ATTRS, vjp=_group_norm_vjp,
   kernel=_group_norm_kernel, flops=lambda ins, out, a: 7 * out.num_elements,
   doc="normalise each group of C/num_groups channels over channels and space, then scale and shift per "
       "channel (Wu & He 2018); x [N, C, S]")
op("GroupNormSilu", ("x", "w", "bias"), _group_norm,
   lambda xs, a: (y := _group_norm_ref(xs, a)) * sigmoid(y), attrs=_GROUP_ATTRS, vjp=_group_norm_silu_vjp,
   kernel=_group_norm_kernel, flops=lambda ins, out, a: 9 * out.num_elements,
   doc="Silu(GroupNorm(x, w, b)) in one kernel (seed: GroupNormSilu)")


@rules("norm_fusion")
def _group_norm_silu(e):
    x, w, b = e.vars("x w b")
    attrs = e.attrs_of("GroupNorm")
    # Silu(GroupNorm(x, w, b)) -> GroupNormSilu(x, w, b)
    yield e.equal("Silu(GroupNorm(x,w,b)) -> GroupNormSilu(x,w,b)", e.Silu(e.GroupNorm(x, w, b, **attrs)),
                  e.GroupNormSilu(x, w, b, **attrs),
                  example=example(lambda g, dim: g.set_outputs([g.silu(g.group_norm(
                      g.input("x", [dim("n"), dim("g") * dim("cpg"), dim("s")]),
                      g.parameter("w", [dim("g") * dim("cpg")]), g.parameter("b", [dim("g") * dim("cpg")]),
                      num_groups=dim("g")))])))


def _group_norm_grad(ts, a):
    x = like(ts, "x", 1)
    need(x.rank == 3, f"x must be [N, C, S], got {x}")
    c, g = x.shape[1], a["num_groups"]
    need(g >= 1 and c % g == 0, f"{c} channels do not split into {g} groups")
    if len(ts) == 3:
        need(ts[2].shape == (c,), f"weight must be [{c}], got {ts[2]}")
        return x
    return TensorType((c,))


def _group_norm_xhat(x, a):
    g = x.reshape(x.shape[0], a["num_groups"], -1)
    mu = g.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((g - mu) ** 2).mean(-1, keepdims=True) + a["eps"])
    return (g - mu) * rstd, rstd


def _group_norm_grad_input_ref(xs, a):
    dy, x, w = xs
    xhat, rstd = _group_norm_xhat(x, a)
    g = (dy * w[None, :, None]).reshape(xhat.shape)
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx.reshape(x.shape)


def _group_norm_grad_w_kernel(node, ins, target) -> Kernel:
    n, c, size = ins[1].shape
    cpg = c // node.attrs["num_groups"]
    blocks = -(-(cpg * size) // 256)  # a group's elements an invocation walks
    # every sample by the whole workgroup: two passes over its group and two reductions, one over the channel
    per_sample = 1 + 2 * blocks + -(-size // 256) + 2 * REDUCTION_ITERATIONS
    return Kernel("group_norm_grad_w", "group_norm_grad_w.wgsl", c,
                  params=(("channels", "u32", c), ("samples", "u32", n), ("cpg", "u32", cpg), ("s", "u32", size),
                          ("eps", "f32", node.attrs["eps"])),
                  loop_iterations=n * per_sample + REDUCTION_ITERATIONS)


op("GroupNormGradInput", ("dy", "x", "w"), _group_norm_grad, _group_norm_grad_input_ref, attrs=_GROUP_ATTRS,
   vjp=NO_GRAD, kernel=_norm_grad_x_kernel,
   doc="LayerNormGradX per (sample, group) over its C/G channels x S positions, with g = dy * w[c]; inputs "
       "[dy, x, w], x [N, C, S] (seed: GroupNormGradInput)")
op("GroupNormGradWeight", ("dy", "x"), _group_norm_grad,
   lambda xs, a: (xs[0] * _group_norm_xhat(xs[1], a)[0].reshape(xs[1].shape)).sum(axis=(0, 2)), attrs=_GROUP_ATTRS,
   vjp=NO_GRAD, kernel=_group_norm_grad_w_kernel,
   doc="dw[c] = sum_{n,s} dy[n,c,s] xhat[n,c,s]; inputs [dy, x] -> [C]. The seed's GroupNormGradWeightBias "
       "split in two: the bias gradient is ReduceTo(dy, [C,1])")


# --- Softmax, LogSoftmax -----------------------------------------------------------------------


def _same_f32(ts, a):
    need_f32(ts[0], "input")
    return ts[0]


def _over_last_axis(ts, a):
    # Softmax / LogSoftmax: rows of the last axis, so rank >= 1 (a scalar passed the builder and failed lowering
    # with an IndexError)
    need(ts[0].rank >= 1, f"input must have rank >= 1 (rows of its last axis), got {ts[0]}")
    return _same_f32(ts, a)


def softmax_ref(xs, a):
    x = xs[0]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _rows_of(t: TensorType) -> tuple[tuple, int]:
    n = t.shape[-1]
    rows = t.num_elements // n
    return (("rows", "u32", rows), ("n", "u32", n)), rows


def _softmax_kernel(node, ins, target) -> Kernel:
    params, rows = _rows_of(node.type)
    if node.op == "Softmax":
        return Kernel("softmax", "softmax.wgsl", rows, params=params, slots={"NORM": "1.0 / total",
                                                                             "OUT": "exp(z) * norm"})
    return Kernel("log_softmax", "softmax.wgsl", rows, params=params, slots={"NORM": "log(total)", "OUT": "z - norm"})


def _softmax_grad_kernel(node, ins, target) -> Kernel:
    params, rows = _rows_of(node.type)
    if node.op == "SoftmaxGrad":
        return Kernel("softmax_grad", "softmax_grad.wgsl", rows, params=params,
                      slots={"TERM": "dy[i] * y[i]", "GRAD": "y[i] * (dy[i] - total)"})
    return Kernel("log_softmax_grad", "softmax_grad.wgsl", rows, params=params,
                  slots={"TERM": "dy[i]", "GRAD": "dy[i] - exp(y[i]) * total"})


op("Softmax", ("x",), _over_last_axis, softmax_ref, kernel=_softmax_kernel,
   flops=lambda ins, out, a: 4 * out.num_elements,
   vjp=lambda b, node, dy, want: [b.emit("SoftmaxGrad", (dy, node.id))],
   doc="softmax over the last axis, max-subtracted: exp(x - max) / sum exp(x - max)")
op("SoftmaxGrad", ("dy", "y"), lambda ts, a: like(ts, "y", 1),
   lambda xs, a: xs[1] * (xs[0] - (xs[0] * xs[1]).sum(axis=-1, keepdims=True)), vjp=NO_GRAD,
   kernel=_softmax_grad_kernel,
   doc="dx = y * (dy - sum_j dy[.,j] y[.,j]) over the last axis; inputs [dy, y] with y the Softmax output "
       "(Jacobian y_i (delta_ij - y_j))")
op("LogSoftmax", ("x",), _over_last_axis, lambda xs, a: log_softmax(xs[0]), kernel=_softmax_kernel,
   flops=lambda ins, out, a: 4 * out.num_elements,
   vjp=lambda b, node, dy, want: [b.emit("LogSoftmaxGrad", (dy, node.id))],
   doc="x - max - log(sum exp(x - max)) over the last axis, max-subtracted so it is exact for large logits "
       "(Goodfellow et al. 2016, Deep Learning, sec. 4.1; seed: LogSoftmax)")
op("LogSoftmaxGrad", ("dy", "y"), lambda ts, a: like(ts, "y", 1),
   lambda xs, a: xs[0] - np.exp(xs[1]) * xs[0].sum(axis=-1, keepdims=True), vjp=NO_GRAD,
   kernel=_softmax_grad_kernel,
   doc="dx = dy - exp(y) * sum_j dy[., j] over the last axis, y the LogSoftmax output (Jacobian delta_ij - "
       "softmax_j); inputs [dy, y]")


# --- EmbeddingSumLayerNorm: LayerNorm of a sum of embedding rows -----------------------------


def _pairs_of(n_inputs: int, a) -> int:
    """The (indices, table) pairs of an EmbeddingSumLayerNorm of ``n_inputs`` inputs."""
    return (n_inputs - 2 - (1 if a["positions"] else 0)) // 2


def _embedding_sum_layer_norm(ts, a):
    positions = a["positions"]
    need(positions >= 0, f"positions must be >= 0, got {positions}")
    need(len(ts) in ((5, 7) if positions else (6, 8)),
         f"takes w, bias and two or three (indices, table) pairs, or with positions > 0 one or two pairs and the "
         f"positions table, got {len(ts)} inputs")
    from .quant import check_blocks

    w, bias = ts[0], ts[1]
    pairs = [ts[i:i + 2] for i in range(2, 2 + 2 * _pairs_of(len(ts), a), 2)]
    need_f32(w, "weight")
    need(w.rank == 1, f"weight must be [H], got {w}")
    h = w.shape[0]
    need_f32(bias, "bias")
    need(bias.shape == (h,), f"bias must be [{h}] as the weight, got {bias}")
    need(a["format"] in ("f32", "f16"), f"format must be 'f32' or 'f16', got {a['format']!r}")
    idx0 = pairs[0][0]
    need(idx0.dtype in (DType.U32, DType.I32) and idx0.rank == 1, f"indices must be u32 or i32 1-D, got {idx0}")
    for i, (idx, table) in enumerate(pairs):
        need(idx.dtype in (DType.U32, DType.I32) and idx.shape == idx0.shape,
             f"indices {i} must be u32 or i32 {list(idx0.shape)} as indices 0, got {idx}")
        if a["format"] == "f32":
            need(table.dtype is DType.F32 and table.rank == 2 and table.shape[1] == h,
                 f"table {i} must be f32 [rows, {h}], got {table}")
        else:
            check_blocks(table, "f16", h, f"table {i}")
    if positions:
        need(ts[-1].dtype is DType.F32 and ts[-1].shape == (positions, h),
             f"the positions table must be f32 [{positions}, {h}], got {ts[-1]}")
        need(idx0.shape[0] % positions == 0,
             f"{idx0.shape[0]} rows are not sequences of {positions} positions")
    return TensorType((idx0.shape[0], h))


def _embedding_rows(xs, a):
    # the summed embedding rows, float64 [T, H]: sum over pairs of table[indices], in input order, then the
    # positions table's row t % positions
    from .indexing import normalise
    from .quant import dequantize

    total = None
    for i in range(2, 2 + 2 * _pairs_of(len(xs), a), 2):
        idx, table = xs[i], xs[i + 1]
        if a["format"] != "f32":
            table = dequantize(table, a["format"], xs[0].shape[0])
        if idx.dtype.kind == "u":
            bad = idx >= table.shape[0]
            if bad.any():
                raise InputError(f"EmbeddingSumLayerNorm: index {int(idx[bad][0])} of indices {(i - 2) // 2} out "
                                 f"of range for a table of {table.shape[0]} rows; give indices below "
                                 f"{table.shape[0]}")
        else:  # i32: ONNX Gather's indices (negative ones from the end, the rest clamped)
            idx = normalise(idx, table.shape[0])
        rows = table[idx.astype(np.int64)].astype(np.float64)
        total = rows if total is None else total + rows
    if a["positions"]:
        total = total + np.tile(xs[-1].astype(np.float64), (total.shape[0] // a["positions"], 1))
    return total


def _embedding_sum_layer_norm_ref(xs, a):
    return _layer_norm_ref([_embedding_rows(xs, a), xs[0], xs[1]], a)


def _gathers(vocabs: list[int], fmt: str, signed: list[bool], readers: str, first: str = "", positions: int = 0
             ) -> tuple[str, tuple]:
    # The VALUE of matmul_split_layer_norm.wgsl and embedding_sum.wgsl for tables ``vocabs`` bound as
    # ids0/table0, ... (read through ``readers``' read_table0, ...: _pair_reads): element (i, j) of the rows summed
    # (``first``, a term before them), a u32 index past a
    # table's last row clamped to it, an i32 one (``signed``) counted from the end when negative, then clamped
    # (f16: a row of n / 2 words of two halves), then with ``positions`` the positions table's row i % positions;
    # and the params of the tables' rows (and of the positions)
    from .indexing import normalise_wgsl

    row = "p.n" if fmt == "f32" else "(p.n / 2u)"
    at = "j" if fmt == "f32" else "j / 2u"
    terms = [first] if first else []
    for i in range(len(vocabs)):
        if signed[i]:
            k = f"ids{i}[i]"
            index = normalise_wgsl(k, f"p.vocab{i}")
        else:
            index = f"min(ids{i}[i], p.vocab{i} - 1u)"
        word = f"read_table{i}({index} * {row} + {at})"
        terms.append(word if fmt == "f32" else f"unpack2x16float({word})[j % 2u]")
    if positions:
        terms.append("positions[(i % p.positions) * p.n + j]")
    value = readers + "\n\nfn value(i: u32, j: u32) -> f32 {\n    return " + " + ".join(terms) + ";\n}"
    params = tuple((f"vocab{i}", "u32", v) for i, v in enumerate(vocabs))
    return value, params + ((("positions", "u32", positions),) if positions else ())


def _pair_reads(pairs: list[int], ins, fmt: str, signed: list[bool], limits) -> tuple[str, tuple, tuple]:
    # The (indices, table) pairs ``pairs`` (by position) of a dispatch, numbered 0, 1, ... in it: the functions
    # read_table0, ... (_gathers), the bindings ids0, table0 (or its windows table00, table01, ... where the table
    # is past the binding limit: ir/kernel.py windowed_reader), ..., and their Kernel.inputs entries
    from ..kernel import Buffer, windowed_reader

    fns, bindings, inputs = [], [], []
    for k, p in enumerate(pairs):
        fn, tables, entries = windowed_reader(f"table{k}", "f32" if fmt == "f32" else "u32", 3 + 2 * p,
                                              ins[3 + 2 * p].size_bytes, limits)
        fns.append(fn)
        bindings += [Buffer(f"ids{k}", "i32" if signed[p] else "u32"), *tables]
        inputs += [2 + 2 * p, *entries]
    return "\n\n".join(fns), tuple(bindings), tuple(inputs)


def _embedding_sum_layer_norm_kernel(node, ins, target) -> Kernel | list[Kernel]:
    # One dispatch (matmul_split_layer_norm.wgsl, its VALUE the rows' sum) where its bindings fit the
    # device's storage buffers per stage; else two: the first two tables' rows (of three; else the first
    # table's) summed into the node's scratch buffer (embedding_sum.wgsl), then the LayerNorm of that sum plus
    # the other tables' rows and the positions' (three tables bind 9 under WebGPU's default of 8; a table read
    # through windows binds more).
    from ..kernel import SCRATCH, Buffer, elementwise_groups
    from .matmul_kernel import layer_norm_groups, layer_norm_stage, layer_norm_value

    pair = node.op == "EmbeddingSumLayerNormPair"  # the output [2, T, H]: the rows' sums, then their LayerNorm
    rows, n = _rows(TensorType(node.type.shape[-2:]))
    lanes, norm, norm_weights, norm_out = layer_norm_stage(n, centred=True, pair=pair)
    norm_groups = layer_norm_groups(rows, lanes)
    paired = "_pair" if pair else ""
    pairs, fmt, positions = _pairs_of(len(ins), node.attrs), node.attrs["format"], node.attrs["positions"]
    vocabs = [ins[3 + 2 * i].shape[0] for i in range(pairs)]
    signed = [ins[2 + 2 * i].dtype is DType.I32 for i in range(pairs)]
    def tag(pairs_signed: list[bool], pos: bool = False) -> str:  # the name tells the WGSL variants apart
        signed_tag = ("" if not pairs_signed else "_i32" if all(pairs_signed) else
                      "_i32p" + "".join(str(i) for i, s in enumerate(pairs_signed) if s) if any(pairs_signed) else "")
        return ("" if fmt == "f32" else f"_{fmt}") + signed_tag + ("_positions" if pos else "")

    common = (("m", "u32", rows), ("n", "u32", n), ("eps", "f32", node.attrs["eps"]))
    norm.update(SPLITS=1, EPILOGUE="")
    # a table past the binding limit is read through windows of it, a binding each (_pair_reads); a dispatch that
    # still binds more than the device allows fails check_limits, which names the tables and their windows
    readers, pair_bindings, pair_inputs = _pair_reads(list(range(pairs)), ins, fmt, signed, target.limits)
    name = "_windows" if len(pair_bindings) > 2 * pairs else ""  # (per dispatch: the one binding windows)
    if 3 + len(pair_bindings) + bool(positions) <= target.limits.get("max-storage-buffers-per-shader-stage", 8):
        value, vocab_params = _gathers(vocabs, fmt, signed, readers, positions=positions)
        return Kernel(f"embedding{pairs}{tag(signed, bool(positions))}{name}_layer_norm{paired}",
                      "matmul_split_layer_norm.wgsl", norm_groups,
                      params=(*common, *vocab_params), slots={**norm, "VALUE": layer_norm_value(norm["WIDTH"], value)},
                      bindings=(*norm_weights, *pair_bindings, *((Buffer("positions"),) if positions else ()),
                                norm_out),
                      inputs=(0, 1, *pair_inputs, *((len(ins) - 1,) if positions else ())))
    head = [0, 1] if pairs == 3 else [0]  # the pairs the first dispatch sums
    tail = [p for p in range(pairs) if p not in head]
    readers, pair_bindings, pair_inputs = _pair_reads(head, ins, fmt, signed, target.limits)
    name = "_windows" if len(pair_bindings) > 2 * len(head) else ""
    value, vocab_params = _gathers([vocabs[p] for p in head], fmt, [signed[p] for p in head], readers)
    first = Kernel(f"embedding{len(head)}{tag([signed[p] for p in head])}{name}_sum", "embedding_sum.wgsl",
                   elementwise_groups(rows * n), params=(*common, *vocab_params), slots={"VALUE": value},
                   bindings=(*pair_bindings, Buffer("out", write=True)), inputs=pair_inputs, scratch=rows * n)
    readers, pair_bindings, pair_inputs = _pair_reads(tail, ins, fmt, signed, target.limits)
    name = "_windows" if len(pair_bindings) > 2 * len(tail) else ""
    value, vocab_params = _gathers([vocabs[p] for p in tail], fmt, [signed[p] for p in tail], readers,
                                   first="x[i * p.n + j]", positions=positions)
    second = Kernel(f"embedding{len(tail)}{tag([signed[p] for p in tail], bool(positions))}{name}_add_layer_norm"
                    f"{paired}",
                    "matmul_split_layer_norm.wgsl", norm_groups,
                    params=(*common, *vocab_params), slots={**norm, "VALUE": layer_norm_value(norm["WIDTH"], value)},
                    bindings=(*norm_weights, Buffer("x"), *pair_bindings,
                              *((Buffer("positions"),) if positions else ()), norm_out),
                    inputs=(0, 1, SCRATCH, *pair_inputs, *((len(ins) - 1,) if positions else ())))
    return [first, second]


def _embedding_sum_layer_norm_vjp(b, node, dy, want):
    # x = sum of the embeddings (rebuilt), then LayerNorm's gradients; each f32 table's is ScatterAdd of
    # dx (f16 tables, u32 words of halves, have none, as QuantEmbedding's; nor tables read through i32
    # indices, as ONNX Gather's), the positions table's the sum of dx over the sequences
    w, bias, *rest = node.inputs
    fmt, positions = node.attrs["format"], node.attrs["positions"]
    pairs = _pairs_of(len(node.inputs), node.attrs)
    flat = rest[:2 * pairs]
    table_wants = want[3:3 + 2 * pairs:2]
    if fmt != "f32" and any(table_wants):
        raise GraphError(f"node {node.id} EmbeddingSumLayerNorm: its {fmt} tables (u32 words) have no gradient; "
                         "differentiate the f32 graph, before the f16 ruleset rounds its tables")
    signed = [b.type(idx).dtype is DType.I32 for idx in flat[::2]]
    if any(w_ and s for w_, s in zip(table_wants, signed, strict=True)):
        raise GraphError(f"node {node.id} EmbeddingSumLayerNorm: a table read through i32 indices (ONNX Gather's) "
                         "has no gradient, as Gather has none; give the table u32 indices (Embedding) to train it")
    x = None
    for idx, table, s in zip(flat[::2], flat[1::2], signed, strict=True):
        e = (b.emit("Gather", (table, idx), axis=0) if s else b.emit("Embedding", (idx, table)) if fmt == "f32" else
             b.emit("QuantEmbedding", (idx, table), format=fmt, cols=b.type(w).shape[0]))
        x = e if x is None else b.emit("Add", (x, e))
    rows, h = b.type(x).shape
    if positions:
        x = b.reshape(b.emit("Add", (b.reshape(x, [rows // positions, positions, h]), rest[-1])), [rows, h])
    eps = node.attrs["eps"]
    need_dx = any(table_wants) or (positions and want[-1])
    dx = b.emit("LayerNormGradX", (dy, x, w), eps=eps) if need_dx else None
    grads = [b.emit("LayerNormGradW", (dy, x), eps=eps) if want[0] else None,
             b.emit("SumRows", (dy,)) if want[1] else None]
    for k, table in enumerate(flat[1::2]):
        grads += [None, b.emit("ScatterAdd", (flat[2 * k], dx), vocab_size=b.type(table).shape[0])
                  if want[3 + 2 * k] else None]
    if positions:
        grads.append(b.reduce_to(b.reshape(dx, [rows // positions, positions, h]), [positions, h])
                     if want[-1] else None)
    return grads


op("EmbeddingSumLayerNorm", ("w", "bias", "indices0", "table0", "indices1?", "table1?", "indices2?", "table2?",
                             "positions?"),
   _embedding_sum_layer_norm, _embedding_sum_layer_norm_ref,
   attrs=(*_EPS, Attr("format", "str", "f32", doc="the tables' storage: f32, or f16 (u32 words of two halves, "
                                                  "ir/ops/quant.py)"),
          Attr("positions", "int", 0, doc="> 0: the last input is a positions table f32 [positions, H] whose row "
                                          "t % positions is added to row t (sequences of that many rows)")),
   vjp=_embedding_sum_layer_norm_vjp,
   kernel=_embedding_sum_layer_norm_kernel, flops=lambda ins, out, a: 9 * out.num_elements,
   index_bounds=lambda ins, a: {i: ins[i + 1].shape[0] for i in range(2, 2 + 2 * _pairs_of(len(ins), a), 2)},
   doc="LayerNorm(sum_i table_i[indices_i] (+ positions[t % P]), w, bias, eps) over rows of H: a BERT-style "
       "embedding layer (word, position and token type rows added, then normalised) in one dispatch (two with "
       "three tables where the device binds 8 storage buffers at most); two or three (indices, table) pairs, or "
       "with positions P > 0 one or two pairs and the positions table f32 [P, H] last (an exporter's folded "
       "position rows, added to row t at t % P); indices u32 [T] (an index past the table an InputError) or "
       "i32 [T] (ONNX Gather's: negative ones from the end, the rest clamped), tables f32 [rows_i, H] (format "
       "f16: u32 [rows_i, H / 2]), w and bias [H] -> [T, H]; the sum is taken in input order (LayerNorm: Ba "
       "et al. 2016)")


def _embedding_sum_pair(ts, a):
    out = _embedding_sum_layer_norm(ts, a)
    return TensorType((2, *out.shape))


def _embedding_sum_pair_ref(xs, a):
    rows = _embedding_rows(xs, a)
    return np.stack([rows, _layer_norm_ref([rows, xs[0], xs[1]], a)])


op("EmbeddingSumLayerNormPair", ("w", "bias", "indices0", "table0", "indices1?", "table1?", "indices2?", "table2?",
                                 "positions?"),
   _embedding_sum_pair, _embedding_sum_pair_ref, attrs=OPS["EmbeddingSumLayerNorm"].attrs,
   vjp=no_grad("the optimiser makes it of an embedding sum and its LayerNorm: differentiate the graph before "
               "optimising it"),
   kernel=_embedding_sum_layer_norm_kernel, flops=lambda ins, out, a: 5 * out.num_elements,
   index_bounds=OPS["EmbeddingSumLayerNorm"].index_bounds,
   doc="[S, LayerNorm(S, w, bias, eps)] for S the rows' sum of EmbeddingSumLayerNorm (its inputs and "
       "attributes), output [2, T, H]: a pre-LN transformer's embeddings (GPT-2: Radford et al. 2019), which the "
       "first residual add reads, and their LayerNorm, which the first block reads, each through a Select view; "
       "the same dispatches as EmbeddingSumLayerNorm, whose stage also stores the sum")


def _embedding_ln_example(terms: str):
    def build(g, dim):
        t, h = dim("t"), dim("h")
        e = [g.embedding(g.input(f"ids{i}", [t], DType.U32), g.parameter(f"table{i}", [dim(f"v{i}"), h]))
             for i in range(3 if terms != "2" else 2)]
        x = {"2": lambda: g.add(e[0], e[1]), "(2)+1": lambda: g.add(g.add(e[0], e[1]), e[2]),
             "1+(2)": lambda: g.add(e[0], g.add(e[1], e[2]))}[terms]()
        g.set_outputs([g.layer_norm(x, g.parameter("w", [h]), g.parameter("b", [h]), 1e-12)])

    return example(build)


@rules("norm_fusion")
def _embedding_sum_layer_norm_rules(e):
    i0, t0, i1, t1, i2, t2, w, bias = e.vars("i0 t0 i1 t1 i2 t2 w bias")
    (eps,) = e.vars("eps", e.f64)
    plain = dict(format=e.String("f32"), positions=e.i64(0))
    emb = [e.Embedding(i, t) for i, t in ((i0, t0), (i1, t1), (i2, t2))]
    # the lookups of one shape [T, H]: an Add that broadcasts (a lookup of one row, a table of one column)
    # is no sum of rows the op takes
    same = [e.eq(e.shape(emb[k])).to(e.shape(emb[0])) for k in (1, 2)]
    # LayerNorm(E0 + E1) -> EmbeddingSumLayerNorm(E0, E1); three embeddings in either grouping (the sum
    # E0 + (E1 + E2) is (E1 + E2) + E0 exactly: a float add commutes)
    yield e.equal("LayerNorm(E0+E1) -> EmbeddingSumLayerNorm(E0,E1)",
                  e.LayerNorm(e.Add(emb[0], emb[1]), w, bias, eps=eps),
                  e.EmbeddingSumLayerNorm(w, bias, i0, t0, i1, t1, eps=eps, **plain), same[0],
                  example=_embedding_ln_example("2"))
    yield e.equal("LayerNorm((E0+E1)+E2) -> EmbeddingSumLayerNorm(E0,E1,E2)",
                  e.LayerNorm(e.Add(e.Add(emb[0], emb[1]), emb[2]), w, bias, eps=eps),
                  e.EmbeddingSumLayerNorm(w, bias, i0, t0, i1, t1, i2, t2, eps=eps, **plain), *same,
                  example=_embedding_ln_example("(2)+1"))
    yield e.equal("LayerNorm(E0+(E1+E2)) -> EmbeddingSumLayerNorm(E1,E2,E0)",
                  e.LayerNorm(e.Add(emb[0], e.Add(emb[1], emb[2])), w, bias, eps=eps),
                  e.EmbeddingSumLayerNorm(w, bias, i1, t1, i2, t2, i0, t0, eps=eps, **plain), *same,
                  example=_embedding_ln_example("1+(2)"))


def _gathered_ln_example(form: str, flat: bool, pair: bool = False):
    # pair: the sum is a graph output too (as a pre-LN transformer's first residual reads it), rows of 64
    def build(g, dim):
        b, s, h = dim("b", 1, 3), dim("s", 1, 4), 64 if pair else dim("h")
        rows = [g.add_node("Gather", (g.parameter(f"table{i}", [dim(f"v{i}"), h]),
                                      g.input(f"ids{i}", [b, s], DType.I32)), axis=0) for i in range(3)]
        pos = g.parameter("pos", [1, s, h])
        x = (g.add(g.add(rows[0], rows[1]), pos) if form == "2" else g.add(rows[0], pos) if form == "1" else
             g.add(rows[0], rows[1]) if form == "2g" else g.add(g.add(rows[0], rows[1]), rows[2]))
        g.set_outputs([g.layer_norm(g.reshape(x, [b * s, h]) if flat else x, g.parameter("w", [h]),
                                    g.parameter("b", [h]), 1e-12), *((x,) if pair else ())])

    return example(build)


@rules("norm_fusion")
def _gathered_embedding_layer_norm_rules(e):
    i0, t0, i1, t1, p, w, bias = e.vars("i0 t0 i1 t1 p w bias")
    (eps,) = e.vars("eps", e.f64)
    sg, sl = e.vars("sg sl", e.Vec[e.i64])
    rows = [e.Gather(t, i, axis=e.i64(0)) for t, i in ((t0, i0), (t1, i1))]
    tokens = sg[0] * sg[1]
    ids = [e.Identity(i, shape=e.Vec(tokens)) for i in (i0, i1)]
    pos = e.Identity(p, shape=e.Vec(sg[1], sg[2]))
    # an exporter's embeddings: Gathers of tables [V, H] by i32 ids [B, S], and the position rows folded into
    # a tensor p [1, S, H] (position_ids a constant arange, so its Gather was folded at load time)
    guards = (e.eq(e.shape(rows[0])).to(sg), e.eq(sg.length()).to(e.i64(3)),
              e.eq(e.shape(i0)).to(e.Vec(sg[0], sg[1])), e.eq(e.shape(p)).to(e.Vec(e.i64(1), sg[1], sg[2])))
    second = (e.eq(e.shape(rows[1])).to(sg), e.eq(e.shape(i1)).to(e.Vec(sg[0], sg[1])))
    # LayerNorm(Reshape((G0 + G1) + p, [B S, H])) -> EmbeddingSumLayerNorm(Reshape(i0, [B S]), T0, Reshape(i1), T1,
    #   Reshape(p, [S, H]); positions S)   (BERT: word + token type, then the positions, in that order) and
    # LayerNorm(Reshape(G0 + p)) (DistilBERT: word + positions); the same on the [B, S, H] sum, as a Reshape of
    # the op. The op reads i32 indices as Gather does (negative from the end, then clamped)
    for label, total, pairs, extra in (("(G0+G1)+P", e.Add(e.Add(rows[0], rows[1]), p), (ids[0], t0, ids[1], t1),
                                        second),
                                       ("G0+P", e.Add(rows[0], p), (ids[0], t0), ())):
        fused = e.EmbeddingSumLayerNorm(w, bias, *pairs, pos, eps=eps, format=e.String("f32"), positions=sg[1])
        both = e.EmbeddingSumLayerNormPair(w, bias, *pairs, pos, eps=eps, format=e.String("f32"), positions=sg[1])
        for flat in (True, False):
            lhs = e.LayerNorm(e.Identity(total, shape=sl) if flat else total, w, bias, eps=eps)
            shape_of_x = (e.eq(sl).to(e.Vec(tokens, sg[2])),) if flat else ()
            yield e.rule(lhs, *guards, *extra, *shape_of_x,
                         name=f"LayerNorm({'Reshape(' if flat else ''}{label}{')' if flat else ''}) of Gathers -> "
                              f"EmbeddingSumLayerNorm(..., positions)",
                         example=_gathered_ln_example("2" if len(pairs) == 4 else "1", flat)).then(
                e.union(lhs).with_(fused if flat else e.Identity(fused, shape=sg)),
                *(e.set_(e.shape(t)).to(e.Vec(tokens)) for t in pairs[::2]),
                e.set_(e.shape(pos)).to(e.Vec(sg[1], sg[2])), e.set_(e.shape(fused)).to(e.Vec(tokens, sg[2])))
            # and where the sum is read too (a pre-LN transformer's first residual add: GPT-2), the pair: the sum
            # -> Reshape(Select(P, 0)), the LayerNorm -> Select(P, 1), parts of a multiple of VIEW_ALIGN bytes
            normed = e.Select(both, index=1)
            yield e.rule(lhs, *guards, *extra, *shape_of_x,
                         e.eq((tokens * sg[2] * e.i64(4)) % e.i64(VIEW_ALIGN)).to(e.i64(0)),
                         name=f"LayerNorm({'Reshape(' if flat else ''}{label}{')' if flat else ''}) of Gathers -> "
                              f"Select(EmbeddingSumLayerNormPair(..., positions), 1)",
                         example=_gathered_ln_example("2" if len(pairs) == 4 else "1", flat, pair=True)).then(
                e.union(lhs).with_(normed if flat else e.Identity(normed, shape=sg)),
                e.union(total).with_(e.Identity(e.Select(both, index=0), shape=sg)),
                *(e.set_(e.shape(t)).to(e.Vec(tokens)) for t in pairs[::2]),
                e.set_(e.shape(pos)).to(e.Vec(sg[1], sg[2])))
    # LayerNorm(Reshape((G0 + G1) + G2, [B S, H])) -> EmbeddingSumLayerNorm(Reshape(i0, [B S]), T0, ..., T2)   for
    # three Gathers by i32 indices [B, S] (RoBERTa: word rows, token types, and positions whose ids are computed
    # from the padding, so no Gather of them is folded), and LayerNorm(Reshape(G0 + G1)) for two (MPNet: word rows
    # and such positions, no token types); the same on the [B, S, H] sum
    (i2, t2) = e.vars("i2 t2")
    third = e.Gather(t2, i2, axis=e.i64(0))
    ids3 = (*ids, e.Identity(i2, shape=e.Vec(tokens)))
    pairs3 = (ids3[0], t0, ids3[1], t1, ids3[2], t2)
    fused3 = e.EmbeddingSumLayerNorm(w, bias, *pairs3, eps=eps, format=e.String("f32"), positions=e.i64(0))
    gathers = (e.eq(e.shape(rows[0])).to(sg), e.eq(sg.length()).to(e.i64(3)), *second,
               e.eq(e.shape(third)).to(sg), *(e.eq(e.shape(i)).to(e.Vec(sg[0], sg[1])) for i in (i0, i2)))
    total3 = e.Add(e.Add(rows[0], rows[1]), third)
    fused2 = e.EmbeddingSumLayerNorm(w, bias, *pairs3[:4], eps=eps, format=e.String("f32"), positions=e.i64(0))
    forms = (("(G0+G1)+G2", total3, fused3, gathers, ids3, "3"),
             ("G0+G1", e.Add(rows[0], rows[1]), fused2, (e.eq(e.shape(rows[0])).to(sg), e.eq(sg.length()).to(e.i64(3)),
                                                         *second, e.eq(e.shape(i0)).to(e.Vec(sg[0], sg[1]))),
              ids3[:2], "2g"))
    for label, total, fused, guards_n, ids_n, form in forms:
        for flat in (True, False):
            lhs = e.LayerNorm(e.Identity(total, shape=sl) if flat else total, w, bias, eps=eps)
            shape_of_x = (e.eq(sl).to(e.Vec(tokens, sg[2])),) if flat else ()
            yield e.rule(lhs, *guards_n, *shape_of_x,
                         name=f"LayerNorm({'Reshape(' if flat else ''}{label}{')' if flat else ''}) of Gathers -> "
                              "EmbeddingSumLayerNorm(...)", example=_gathered_ln_example(form, flat)).then(
                e.union(lhs).with_(fused if flat else e.Identity(fused, shape=sg)),
                *(e.set_(e.shape(t)).to(e.Vec(tokens)) for t in ids_n), e.set_(e.shape(fused)).to(e.Vec(tokens, sg[2])))


def _embedding_ln_f16_example(pairs: int, positions: bool = False):
    # positions: i32 ids (an export's) and a positions table of S rows over sequences of S
    def build(g, dim):
        s, h = dim("t"), 32 * dim("hb", 1, 2)  # whole blocks of 32 halves a row (the f16 rule's guard)
        t = s * (dim("b", 1, 3) if positions else 1)
        flat = []
        for i in range(pairs):
            half = g.add_node("ToF16", (g.parameter(f"table{i}", [dim(f"v{i}"), h]),))
            flat += [g.input(f"ids{i}", [t], DType.I32 if positions else DType.U32),
                     g.add_node("Dequant", (half,), format="f16", cols=h)]
        pos = (g.parameter("positions", [s, h]),) if positions else ()
        g.set_outputs([g.add_node("EmbeddingSumLayerNorm", (g.parameter("w", [h]), g.parameter("b", [h]), *flat, *pos),
                                  eps=1e-12, positions=s if positions else 0)])

    return example(build)


@rules("quant")
def _embedding_sum_layer_norm_f16(e):
    i0, q0, i1, q1, i2, q2, w, bias = e.vars("i0 q0 i1 q1 i2 q2 w bias")
    (eps,) = e.vars("eps", e.f64)
    (c,) = e.vars("c", e.i64)
    f32 = dict(format=e.String("f32"), positions=e.i64(0))
    f16 = dict(format=e.String("f16"), positions=e.i64(0))
    dq = [e.Dequant(q, format=f16["format"], cols=c) for q in (q0, q1, q2)]
    # EmbeddingSumLayerNorm over Dequant(q, f16) tables (the f16 ruleset's rounded tables) -> the same op
    # reading the halves (its format f16): the tables stay halves in memory, as QuantEmbedding keeps them
    yield e.equal("EmbeddingSumLayerNorm(i, Dequant(q, f16), ...) -> EmbeddingSumLayerNorm f16(i, q, ...)",
                  e.EmbeddingSumLayerNorm(w, bias, i0, dq[0], i1, dq[1], eps=eps, **f32),
                  e.EmbeddingSumLayerNorm(w, bias, i0, q0, i1, q1, eps=eps, **f16),
                  example=_embedding_ln_f16_example(2))
    yield e.equal("EmbeddingSumLayerNorm(i, Dequant(q, f16), ... x3) -> EmbeddingSumLayerNorm f16(i, q, ... x3)",
                  e.EmbeddingSumLayerNorm(w, bias, i0, dq[0], i1, dq[1], i2, dq[2], eps=eps, **f32),
                  e.EmbeddingSumLayerNorm(w, bias, i0, q0, i1, q1, i2, q2, eps=eps, **f16),
                  example=_embedding_ln_f16_example(3))
    # the same with a positions table (an export's word and token-type tables, or word alone; the positions stay f32)
    (pos,) = e.vars("pos")
    (ps,) = e.vars("ps", e.i64)
    for pairs in (1, 2):
        flat32 = [i0, dq[0], i1, dq[1]][:2 * pairs]
        flat16 = [i0, q0, i1, q1][:2 * pairs]
        yield e.equal(f"EmbeddingSumLayerNorm(i, Dequant(q, f16) x{pairs}, positions) -> EmbeddingSumLayerNorm "
                      f"f16(i, q x{pairs}, positions)",
                      e.EmbeddingSumLayerNorm(w, bias, *flat32, pos, eps=eps, format=f32["format"], positions=ps),
                      e.EmbeddingSumLayerNorm(w, bias, *flat16, pos, eps=eps, format=f16["format"], positions=ps),
                      example=_embedding_ln_f16_example(pairs, positions=True))
