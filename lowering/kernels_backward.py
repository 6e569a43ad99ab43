"""Lowering entries of the training ops (ir/ops_backward.py): the losses, the elementwise,
norm, SwiGLU, softmax and attention gradients, the adjoints of broadcasting and slicing,
and ScatterAdd. Same conventions as :mod:`.kernels` (bindings: the node's inputs in order,
then the output, then the uniform); every op here is one dispatch.

Kernels that are knowingly slow at scale, each for want of float atomics or of saved
forward statistics, say so in their WGSL header: CrossEntropyLoss (one workgroup),
LayerNormGradW / RmsNormGradW (one workgroup per 256 columns walking every row),
GroupNormGradWeight (group statistics recomputed per channel), ScatterAdd (every output
element scans all indices) and AttentionGradK / AttentionGradV (softmax statistics
recomputed per block of 64 key rows).
"""

from __future__ import annotations

import math

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import MAX_ATTENTION_HEAD_DIM, KernelCall, _elementwise_groups, broadcast_strides, kernel
from .wgsl import render, uniform_bytes

# --- elementwise gradients -------------------------------------------------------------------

#: WGSL of f'({x}) for each unary op with a ``<Op>Grad`` (ir.ops_backward UNARY_DERIVATIVES);
#: the helpers live in derivatives.wgsl.
DERIVATIVE_WGSL: dict[str, str] = {
    "Relu": "select(0.0, 1.0, {x} > 0.0)",
    "Sigmoid": "dsigmoid({x})",
    "Tanh": "dtanh({x})",
    "Gelu": "dgelu_erf({x})",
    "GeluTanh": "dgelu_tanh({x})",
    "Silu": "dsilu({x})",
}

#: Elementwise gradient ops: their WGSL expression of g = dy[i], v = x[i] (and up[i]).
GRAD_WGSL: dict[str, str] = {
    **{f"{op}Grad": "g * " + expr.format(x="v") for op, expr in DERIVATIVE_WGSL.items()},
    "SwiGLUGradGate": "g * up[i] * dsilu(v)",
    "SwiGLUGradUp": "g * silu(v)",
}


@kernel(*GRAD_WGSL)
def _elementwise_grad(node: Node, ins: list[TensorType]) -> KernelCall:
    names = ("dy", "x", "up")[:len(ins)]
    src = render(
        "elementwise_grad.wgsl",
        INPUTS="\n".join(f"@group(0) @binding({i}) var<storage, read> {n}: array<f32>;" for i, n in enumerate(names)),
        EXPR=GRAD_WGSL[node.op],
        OUT=len(ins),
        UNIFORM=len(ins) + 1,
    )
    n = node.type.num_elements
    return KernelCall(f"grad_{node.op}", src, uniform_bytes(n), _elementwise_groups(n))


@kernel("SwiGLUConcatGrad")
def _swiglu_concat_grad(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.num_elements
    return KernelCall("swiglu_concat_grad", render("swiglu_concat_grad.wgsl"),
                      uniform_bytes(n, ins[0].shape[1]), _elementwise_groups(n))


# --- adjoints of broadcasting and slicing ----------------------------------------------------

#: Output elements below which ReduceTo uses a workgroup per output element (when each sums
#: at least ``_GROUP_REDUCE_MIN_LEN`` values): too few invocations otherwise.
_GROUP_REDUCE_MAX_OUT = 4096
_GROUP_REDUCE_MIN_LEN = 256


def reduce_dims(x: tuple[int, ...], target: tuple[int, ...]) -> tuple[list[int], list[bool]]:
    """x's shape merged into runs of kept or reduced dimensions, for a sum to ``target``.

    Size-1 dimensions of x are dropped and neighbours of the same kind merged (x is
    contiguous, so any run of them is one strided dimension). Returns sizes and a
    reduced flag per merged dimension, outermost first, padded to 4 with kept 1s; raises
    LoweringError when more than 4 remain (alternating kept and reduced axes).
    """
    target = (1,) * (len(x) - len(target)) + tuple(target)
    dims: list[int] = []
    reduced: list[bool] = []
    for d, t in zip(x, target, strict=True):
        if d == 1:
            continue
        red = t == 1
        if dims and reduced[-1] == red:
            dims[-1] *= d
        else:
            dims.append(d)
            reduced.append(red)
    if len(dims) > 4:
        raise LoweringError(f"sum of {list(x)} to {list(target)} alternates {len(dims)} kept and reduced "
                            "dimensions; the reduce_to kernel handles 4")
    pad = 4 - len(dims)
    return [1] * pad + dims, [False] * pad + reduced


@kernel("SumRows", "ReduceTo")
def _reduce_to(node: Node, ins: list[TensorType]) -> KernelCall:
    dims, reduced = reduce_dims(ins[0].shape, node.type.shape)
    strides = [math.prod(dims[d + 1:]) for d in range(4)]
    out_dims = [1 if r else d for d, r in zip(dims, reduced, strict=True)]
    red_dims = [d if r else 1 for d, r in zip(dims, reduced, strict=True)]
    n, red_len = math.prod(out_dims), math.prod(red_dims)
    params = uniform_bytes(*out_dims, *red_dims, *strides, n, red_len)
    src = render("reduce_to.wgsl")
    if n <= _GROUP_REDUCE_MAX_OUT and red_len >= _GROUP_REDUCE_MIN_LEN:
        return KernelCall("reduce_to_per_group", src, params, n, entry_point="per_group")
    return KernelCall("reduce_to_per_element", src, params, _elementwise_groups(n), entry_point="per_element")


@kernel("BroadcastTo")
def _broadcast_to(node: Node, ins: list[TensorType]) -> KernelCall:
    dims, sx, _ = broadcast_strides(node.type.shape, ins[0].shape, ins[0].shape)
    n = node.type.num_elements
    return KernelCall("broadcast_to", render("broadcast_to.wgsl"), uniform_bytes(*dims, *sx, n),
                      _elementwise_groups(n))


@kernel("PadCols")
def _pad_cols(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, width = node.type.shape
    n = rows * width
    return KernelCall("pad_cols", render("pad_cols.wgsl"),
                      uniform_bytes(n, width, ins[0].shape[1], node.attrs["start"]), _elementwise_groups(n))


# --- losses, softmax, norms ---------------------------------------------------------------


@kernel("CrossEntropyLoss", "CrossEntropyLossGrad")
def _cross_entropy(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, n = ins[0].shape
    params = uniform_bytes(rows, n, 1.0 / rows)
    if node.op == "CrossEntropyLoss":
        return KernelCall("cross_entropy", render("cross_entropy.wgsl"), params, 1)
    return KernelCall("cross_entropy_grad", render("cross_entropy_grad.wgsl"), params, rows)


@kernel("SoftmaxGrad")
def _softmax_grad(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.shape[-1]
    rows = node.type.num_elements // n
    src = render("softmax_grad.wgsl", TERM="dy[i] * y[i]", GRAD="y[i] * (dy[i] - total)")
    return KernelCall("softmax_grad", src, uniform_bytes(rows, n), rows)


@kernel("LayerNormGradX", "RmsNormGradX", "GroupNormGradInput")
def _norm_grad_x(node: Node, ins: list[TensorType]) -> KernelCall:
    eps = float(node.attrs["eps"])
    if node.op == "GroupNormGradInput":
        n, c, size = node.type.shape
        g = node.attrs["num_groups"]
        params = uniform_bytes(n * g, g, c // g * size, c // g, size, eps)
        segs = n * g
    else:
        segs, width = node.type.shape
        params = uniform_bytes(segs, 1, width, width, 1, eps)
    centered = node.op != "RmsNormGradX"
    src = render("norm_grad_x.wgsl", CENTERED="true" if centered else "false")
    return KernelCall("norm_grad_x" + ("" if centered else "_rms"), src, params, segs)


@kernel("LayerNormGradW", "RmsNormGradW")
def _norm_grad_w(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, n = ins[1].shape
    blocks = math.ceil(n / 256)
    centered = node.op == "LayerNormGradW"
    src = render("norm_grad_w.wgsl", CENTERED="true" if centered else "false")
    return KernelCall("norm_grad_w" + ("" if centered else "_rms"), src,
                      uniform_bytes(rows, n, blocks, float(node.attrs["eps"])), blocks)


@kernel("GroupNormGradWeight")
def _group_norm_grad_w(node: Node, ins: list[TensorType]) -> KernelCall:
    n, c, size = ins[1].shape
    cpg = c // node.attrs["num_groups"]
    return KernelCall("group_norm_grad_w", render("group_norm_grad_w.wgsl"),
                      uniform_bytes(c, n, cpg, size, float(node.attrs["eps"])), c)


# --- transformer ---------------------------------------------------------------------------


@kernel("ScatterAdd")
def _scatter_add(node: Node, ins: list[TensorType]) -> KernelCall:
    t, h = ins[1].shape
    n = node.type.num_elements
    return KernelCall("scatter_add", render("scatter_add.wgsl"), uniform_bytes(n, h, t), _elementwise_groups(n))


#: Rows (query rows for dq, key rows for dk / dv) per workgroup of the attention gradients.
ATTENTION_GRAD_ROWS = 64


@kernel("AttentionGradQ", "AttentionGradK", "AttentionGradV")
def _attention_grad(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    nh, nkv, hd, batch, causal = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"], a["causal"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[1]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    masked = len(ins) == 5
    part = node.op[-1]
    slots = dict(
        HEAD_DIM=hd,
        MASK_BINDING="@group(0) @binding(4) var<storage, read> key_mask: array<f32>;" if masked else "",
        KEPT="key_mask[b * p.seq + j] > 0.0" if masked else "true",
        KEY_END="qi + 1u" if causal else "p.seq",
        OUT=len(ins),
        UNIFORM=len(ins) + 1,
    )
    if part == "Q":
        src = render("attention_grad_q.wgsl", **slots)
    else:
        src = render("attention_grad_kv.wgsl", WANT_K="true" if part == "K" else "false",
                     CAUSAL="true" if causal else "false", **slots)
    seq = ins[1].shape[0] // batch
    blocks = math.ceil(seq / ATTENTION_GRAD_ROWS)
    total = batch * (nh if part == "Q" else nkv) * blocks
    params = uniform_bytes(seq, nh, nkv, nh // nkv, blocks, total, float(1.0 / math.sqrt(hd)))
    name = f"attention_grad_{part.lower()}_hd{hd}" + ("_causal" if causal else "") + ("_mask" if masked else "")
    return KernelCall(name, src, params, total)
