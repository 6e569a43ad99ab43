"""Lowering entries of the ops in ir/ops_extra.py (Abs, Log, Recip, Greater, LogSoftmax,
BceLoss, SlidingWindowAttention, CrossAttention, Conv2d, MaxPool2d, GlobalAvgPool,
Upsample2x and their gradients). Same conventions as :mod:`.kernels`: storage bindings are
the node's inputs in order, then the output, then the uniform; every op is one dispatch;
each kernel derives its linear workgroup index with ``linear_workgroup`` and returns past
its logical count, so the plan's 2-D grid split, binding-count and binding-size checks
(plan.py) apply unchanged (at most 6 storage bindings here: an attention gradient with a
key mask).

The elementwise ops reuse the templates of :mod:`.kernels` and :mod:`.kernels_backward`
(unary.wgsl, binary.wgsl, elementwise_grad.wgsl) with their own expressions, LogSoftmax and
its gradient those of Softmax (softmax.wgsl, softmax_grad.wgsl). Knowingly slow
at scale, as their WGSL headers say: Conv2d / Conv2dGradInput (direct convolution, no
workgroup-memory reuse), MaxPool2dGrad (each input rescans the windows that contain it),
BceLoss (one workgroup) and CrossAttentionGradK / V (softmax statistics recomputed per block
of 64 key rows).
"""

from __future__ import annotations

import math

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import MAX_ATTENTION_HEAD_DIM, KernelCall, _elementwise_groups, broadcast_strides, kernel, unary_call
from .wgsl import render, uniform_bytes

# --- elementwise ---------------------------------------------------------------------------

#: WGSL of each unary op on ``{x}``. Log is defined on the whole line, as numpy: WGSL leaves
#: log(x <= 0) indeterminate, so the kernel selects the IEEE results itself, -inf at 0 and a
#: quiet NaN below, built with bitcast (WGSL has no infinity or NaN literals). Recip is a plain
#: IEEE division: +-inf at +-0 on every adapter we know, though WGSL does not promise it.
EXTRA_UNARY_WGSL: dict[str, str] = {
    "Abs": "abs({x})",
    "Log": "select(bitcast<f32>(select(0x7fc00000u, 0xff800000u, {x} == 0.0)), log({x}), {x} > 0.0)",
    "Recip": "1.0 / ({x})",
}

#: Gradients of the unary ops above, on g = dy[i] and v = x[i] (WGSL sign(0) = 0).
EXTRA_GRAD_WGSL: dict[str, str] = {
    "AbsGrad": "g * sign(v)",
    "LogGrad": "g / v",
    "RecipGrad": "-(g / v) / v",
}


@kernel(*EXTRA_UNARY_WGSL)
def _unary(node: Node, ins: list[TensorType]) -> KernelCall:
    return unary_call(node, EXTRA_UNARY_WGSL[node.op])


@kernel(*EXTRA_GRAD_WGSL)
def _unary_grad(node: Node, ins: list[TensorType]) -> KernelCall:
    src = render(
        "elementwise_grad.wgsl",
        INPUTS="@group(0) @binding(0) var<storage, read> dy: array<f32>;\n"
               "@group(0) @binding(1) var<storage, read> x: array<f32>;",
        EXPR=EXTRA_GRAD_WGSL[node.op],
        OUT=2,
        UNIFORM=3,
    )
    n = node.type.num_elements
    return KernelCall(f"grad_{node.op}", src, uniform_bytes(n), _elementwise_groups(n))


@kernel("Greater")
def _greater(node: Node, ins: list[TensorType]) -> KernelCall:
    dims, sa, sb = broadcast_strides(node.type.shape, ins[0].shape, ins[1].shape)
    n = node.type.num_elements
    src = render("binary.wgsl", EXPR="select(0.0, 1.0, av > bv)")
    return KernelCall("binary_Greater", src, uniform_bytes(*dims, *sa, *sb, n), _elementwise_groups(n))


# --- rows and losses --------------------------------------------------------------------------


@kernel("LogSoftmax", "LogSoftmaxGrad")
def _log_softmax(node: Node, ins: list[TensorType]) -> KernelCall:
    # The templates of Softmax and SoftmaxGrad with the log-softmax expressions.
    n = node.type.shape[-1]
    rows = node.type.num_elements // n
    if node.op == "LogSoftmax":
        name, src = "log_softmax", render("softmax.wgsl", NORM="log(total)", OUT="z - norm")
    else:
        name, src = "log_softmax_grad", render("softmax_grad.wgsl", TERM="dy[i]", GRAD="dy[i] - exp(y[i]) * total")
    return KernelCall(name, src, uniform_bytes(rows, n), rows)


@kernel("BceLoss", "BceLossGrad")
def _bce(node: Node, ins: list[TensorType]) -> KernelCall:
    n = ins[0].num_elements
    params = uniform_bytes(n, 1.0 / n)
    if node.op == "BceLoss":
        return KernelCall("bce_loss", render("bce_loss.wgsl"), params, 1, entry_point="loss")
    return KernelCall("bce_loss_grad", render("bce_loss.wgsl"), params, _elementwise_groups(n), entry_point="grad")


# --- SlidingWindowAttention, CrossAttention and their gradients -------------------------------

#: Rows (query rows, or key rows for dk / dv) per workgroup of the windowed attention kernels.
WINDOW_ATTENTION_ROWS = 64
_WINDOW_OPS = {"SlidingWindowAttention", "CrossAttention"}


@kernel(*(f"{op}{grad}" for op in sorted(_WINDOW_OPS) for grad in ("", "GradQ", "GradK", "GradV")))
def _windowed_attention(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    grad = "" if node.op in _WINDOW_OPS else node.op[-5:]  # '', 'GradQ', 'GradK' or 'GradV'
    q, k = (ins[0], ins[1]) if not grad else (ins[1], ins[2])
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {q}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    masked = len(ins) == (5 if grad else 4)
    mask_at = 4 if grad else 3
    slots = dict(
        HEAD_DIM=hd,
        MASK_BINDING=f"@group(0) @binding({mask_at}) var<storage, read> key_mask: array<f32>;" if masked else "",
        KEPT="key_mask[b * p.kv_seq + j] > 0.0" if masked else "true",
        OUT=len(ins),
        UNIFORM=len(ins) + 1,
    )
    if grad in ("GradK", "GradV"):
        src = render("attention_window_grad_kv.wgsl", WANT_K="true" if grad == "GradK" else "false", **slots)
    else:
        src = render("attention_window_grad_q.wgsl" if grad else "attention_window.wgsl", **slots)
    q_seq, kv_seq = q.shape[0] // batch, k.shape[0] // batch
    per_key = grad in ("GradK", "GradV")
    blocks = math.ceil((kv_seq if per_key else q_seq) / WINDOW_ATTENTION_ROWS)
    total = batch * (nkv if per_key else nh) * blocks
    window = a["window_size"] if "window_size" in a else 0
    params = uniform_bytes(q_seq, kv_seq, nh, nkv, nh // nkv, blocks, total, float(1.0 / math.sqrt(hd)), window)
    kind = "window" if window else "cross"
    name = f"attention_{kind}{('_' + grad.lower()) if grad else ''}_hd{hd}" + ("_mask" if masked else "")
    return KernelCall(name, src, params, total)


# --- Conv2d and its gradients ----------------------------------------------------------------


def _conv_params(n: int, x: tuple[int, ...], k: tuple[int, ...], y: tuple[int, ...], stride: int,
                 ph: int, pw: int) -> bytes:
    # conv2d_common.wgsl Params from the NCHW shapes of input x, kernel k and output y
    return uniform_bytes(n, x[0], x[1], x[2], x[3], k[0], k[2], k[3], y[2], y[3], stride, ph, pw)


@kernel("Conv2d", "Conv2dGradInput", "Conv2dGradWeight")
def _conv2d(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    geometry = (a["stride"], a["padding_h"], a["padding_w"])
    n = node.type.num_elements
    if node.op == "Conv2d":
        x, k, y = ins[0].shape, ins[1].shape, node.type.shape
        file, groups = "conv2d.wgsl", _elementwise_groups(n)
    elif node.op == "Conv2dGradInput":
        x, k, y = node.type.shape, ins[1].shape, ins[0].shape
        file, groups = "conv2d_grad_input.wgsl", _elementwise_groups(n)
    else:  # one workgroup per weight element
        x, k, y = ins[1].shape, node.type.shape, ins[0].shape
        file, groups = "conv2d_grad_weight.wgsl", n
    return KernelCall(file[:-5], render(file), _conv_params(n, x, k, y, *geometry), groups)


# --- MaxPool2d, GlobalAvgPool, Upsample2x and their gradients ---------------------------------


@kernel("MaxPool2d", "MaxPool2dGrad")
def _max_pool(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    x = ins[-1].shape
    y = node.type.shape if node.op == "MaxPool2d" else ins[0].shape
    n = node.type.num_elements
    params = uniform_bytes(n, x[2], x[3], y[2], y[3], a["kernel_h"], a["kernel_w"], a["stride"], a["padding"])
    file = "max_pool.wgsl" if node.op == "MaxPool2d" else "max_pool_grad.wgsl"
    return KernelCall(file[:-5], render(file), params, _elementwise_groups(n))


@kernel("GlobalAvgPool", "GlobalAvgPoolGrad")
def _global_avg_pool(node: Node, ins: list[TensorType]) -> KernelCall:
    full = ins[0] if node.op == "GlobalAvgPool" else node.type
    rows = math.prod(full.shape[:2])
    spatial = math.prod(full.shape[2:])
    params = uniform_bytes(rows, spatial, 1.0 / spatial, full.num_elements)
    src = render("global_avg_pool.wgsl")
    if node.op == "GlobalAvgPool":
        return KernelCall("global_avg_pool", src, params, rows, entry_point="pool")
    return KernelCall("global_avg_pool_grad", src, params, _elementwise_groups(full.num_elements), entry_point="grad")


@kernel("Upsample2x", "Upsample2xGrad")
def _upsample(node: Node, ins: list[TensorType]) -> KernelCall:
    small = ins[0] if node.op == "Upsample2x" else node.type
    n = node.type.num_elements
    up = node.op == "Upsample2x"
    return KernelCall("upsample2x" if up else "upsample2x_grad", render("upsample.wgsl"),
                      uniform_bytes(n, small.shape[2], small.shape[3]), _elementwise_groups(n),
                      entry_point="up" if up else "grad")
