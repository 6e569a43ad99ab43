"""One lowering entry per op: which WGSL kernel runs it, specialised how, with which
uniform parameters and how many workgroups.

A builder takes the node and its input types and returns a :class:`KernelCall`. Its
storage bindings are always the node's input buffers in ``node.inputs`` order
(read-only) followed by the output buffer (read_write); the uniform, when ``params`` is
non-empty, comes right after. Sizes travel in uniforms, so one pipeline serves every
shape; templating is used only where the code's structure changes (epilogue chains,
the unary/binary expression, attention masking and head size).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.ops import EPILOGUE_BINARY
from ..ir.types import TensorType
from .wgsl import render, uniform_bytes

#: Invocations per workgroup of the elementwise kernels (one element each).
ELEMENTWISE_WG = 256
#: Output tile side of the matmul kernel (matmul.wgsl TILE).
MATMUL_TILE = 64
#: Query rows per workgroup of the attention kernel (attention.wgsl workgroup size).
ATTENTION_ROWS = 64
#: Largest head_dim the attention kernel keeps in per-invocation arrays.
MAX_ATTENTION_HEAD_DIM = 256
#: Largest head_dim the RoPE uniform holds frequencies for (64 vec4 = 256 pairs).
MAX_ROPE_HEAD_DIM = 512


@dataclass(frozen=True)
class KernelCall:
    """A specialised kernel for one node: WGSL text, uniform bytes, logical workgroups.

    ``groups`` is the number of workgroups as one linear count; the lowering lays it out
    on a grid that respects maxComputeWorkgroupsPerDimension.
    """

    kernel: str
    source: str
    params: bytes
    groups: int
    entry_point: str = "main"


KernelBuilder = Callable[[Node, list[TensorType]], KernelCall]

#: Op name -> lowering entry. Ops missing here cannot be lowered (LoweringError).
KERNELS: dict[str, KernelBuilder] = {}


def kernel(*ops: str) -> Callable[[KernelBuilder], KernelBuilder]:
    """Register the decorated builder as the lowering entry of ``ops``."""

    def deco(fn: KernelBuilder) -> KernelBuilder:
        for op in ops:
            if op in KERNELS:
                raise ValueError(f"kernel for {op} registered twice")
            KERNELS[op] = fn
        return fn

    return deco


def _elementwise_groups(n: int) -> int:
    return math.ceil(n / ELEMENTWISE_WG)


# --- elementwise -----------------------------------------------------------------------

#: WGSL expression of each unary op applied to ``{x}``; helpers live in common.wgsl. The
#: same table serves the unary kernel and the matmul epilogue steps.
UNARY_WGSL: dict[str, str] = {
    "Relu": "max({x}, 0.0)",
    "Sigmoid": "sigmoid({x})",
    "Tanh": "tanh_clamped({x})",
    "Neg": "-({x})",
    "Gelu": "gelu_erf({x})",
    "GeluTanh": "gelu_tanh({x})",
    "Silu": "silu({x})",
}

#: WGSL expression of each binary op on the operand values ``av`` and ``bv``.
BINARY_WGSL: dict[str, str] = {
    "Add": "av + bv",
    "Mul": "av * bv",
    "BiasAdd": "av + bv",
    "SwiGLU": "silu(av) * bv",
}


@kernel(*UNARY_WGSL)
def _unary(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.num_elements
    src = render("unary.wgsl", EXPR=UNARY_WGSL[node.op].format(x="v"))
    return KernelCall(f"unary_{node.op}", src, uniform_bytes(n), _elementwise_groups(n))


def broadcast_strides(out: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
                      ) -> tuple[list[int], list[int], list[int]]:
    """Output dims and per-dim element strides of a and b (0 where broadcast), rank 4.

    Size-1 output dims are dropped and neighbouring dims merged where both operands are
    contiguous across them, so any rank lowers as long as at most 4 dims remain (numpy
    broadcasting, https://numpy.org/doc/stable/user/basics.broadcasting.html). Raises
    LoweringError beyond that.
    """
    rank = len(out)

    def strides(shape: tuple[int, ...]) -> list[int]:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        st, acc = [0] * rank, 1
        for d in reversed(range(rank)):
            st[d] = 0 if shape[d] == 1 else acc
            acc *= shape[d]
        return st

    sa, sb = strides(a), strides(b)
    dims: list[int] = []
    ma: list[int] = []
    mb: list[int] = []
    for d in range(rank):
        if out[d] == 1:
            continue
        if dims and ma[-1] == sa[d] * out[d] and mb[-1] == sb[d] * out[d]:
            dims[-1] *= out[d]
            ma[-1], mb[-1] = sa[d], sb[d]
        else:
            dims.append(out[d])
            ma.append(sa[d])
            mb.append(sb[d])
    if len(dims) > 4:
        raise LoweringError(f"broadcast of {list(a)} and {list(b)} to {list(out)} needs {len(dims)} "
                            "dimensions after merging; the binary kernel handles 4")
    pad = 4 - len(dims)
    return [1] * pad + dims, [0] * pad + ma, [0] * pad + mb


@kernel(*BINARY_WGSL)
def _binary(node: Node, ins: list[TensorType]) -> KernelCall:
    out = node.type.shape
    b_shape = ins[1].shape if node.op != "BiasAdd" else (1, ins[1].shape[-1])
    dims, sa, sb = broadcast_strides(out, ins[0].shape, b_shape)
    n = node.type.num_elements
    src = render("binary.wgsl", EXPR=BINARY_WGSL[node.op])
    return KernelCall(f"binary_{node.op}", src, uniform_bytes(*dims, *sa, *sb, n), _elementwise_groups(n))


@kernel("Transpose")
def _transpose(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, cols = ins[0].shape
    n = rows * cols
    return KernelCall("transpose", render("transpose.wgsl"), uniform_bytes(rows, cols, n),
                      _elementwise_groups(n))


@kernel("Embedding")
def _embedding(node: Node, ins: list[TensorType]) -> KernelCall:
    vocab, h = ins[1].shape
    n = node.type.num_elements
    return KernelCall("embedding", render("embedding.wgsl"), uniform_bytes(n, h, vocab),
                      _elementwise_groups(n))


# --- matmul family -------------------------------------------------------------------------


def matmul_source(variant: str, epilogue: tuple[str, ...]) -> str:
    """WGSL of the tiled matmul for ``variant`` ('' | 'AT' | 'BT') and an epilogue chain.

    Epilogue operands bind at 2, 3, ... in chain order; 'bias' reads operand[j],
    'add' reads operand[i * N + j]; unary steps use :data:`UNARY_WGSL`.
    """
    operands, lines = [], []
    for step in epilogue:
        if step in EPILOGUE_BINARY:
            e = len(operands)
            operands.append(f"@group(0) @binding({2 + e}) var<storage, read> e{e}: array<f32>;")
            index = "j" if step == "bias" else "i * p.n + j"
            lines.append(f"    v = v + e{e}[{index}];  // {step}")
        elif step in UNARY_WGSL:
            lines.append(f"    v = {UNARY_WGSL[step].format(x='v')};")
        else:
            raise LoweringError(f"FusedMatMul: epilogue step {step!r} has no WGSL lowering")
    return render(
        "matmul.wgsl",
        A_INDEX="kk * p.m + i" if variant == "AT" else "i * p.k + kk",
        B_INDEX="j * p.k + kk" if variant == "BT" else "kk * p.n + j",
        OPERANDS="\n".join(operands),
        EPILOGUE="\n".join(lines),
        OUT=2 + len(operands),
        UNIFORM=3 + len(operands),
    )


_MATMUL_VARIANT = {"MatMul": "", "MatMulAT": "AT", "MatMulBT": "BT"}


@kernel("MatMul", "MatMulAT", "MatMulBT", "FusedMatMul")
def _matmul(node: Node, ins: list[TensorType]) -> KernelCall:
    variant = node.attrs["variant"] if node.op == "FusedMatMul" else _MATMUL_VARIANT[node.op]
    epilogue = tuple(node.attrs.get("epilogue", ()))
    m, n = node.type.shape
    k = ins[0].shape[0] if variant == "AT" else ins[0].shape[1]
    tiles_n = math.ceil(n / MATMUL_TILE)
    tiles = math.ceil(m / MATMUL_TILE) * tiles_n
    name = "matmul" + (f"_{variant}" if variant else "") + "".join(f"+{s}" for s in epilogue)
    return KernelCall(name, matmul_source(variant, epilogue), uniform_bytes(m, k, n, tiles_n, tiles), tiles)


# --- rows: softmax, norms, reductions ------------------------------------------------------


@kernel("Softmax")
def _softmax(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.shape[-1]
    rows = node.type.num_elements // n
    return KernelCall("softmax", render("softmax.wgsl"), uniform_bytes(rows, n), rows)


@kernel("LayerNorm", "RmsNorm")
def _norm(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, n = node.type.shape
    file = "layer_norm.wgsl" if node.op == "LayerNorm" else "rms_norm.wgsl"
    return KernelCall(file[:-5], render(file), uniform_bytes(rows, n, float(node.attrs["eps"])), rows)


@kernel("SumAll", "MeanAll")
def _reduce_all(node: Node, ins: list[TensorType]) -> KernelCall:
    n = ins[0].num_elements
    scale = 1.0 if node.op == "SumAll" else 1.0 / n
    return KernelCall("reduce_all", render("reduce_all.wgsl"), uniform_bytes(n, float(scale)), 1)


# --- transformer -------------------------------------------------------------------------


@kernel("RoPE")
def _rope(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, width = node.type.shape
    a = node.attrs
    hd = a["head_dim"]
    if hd > MAX_ROPE_HEAD_DIM:
        raise LoweringError(f"RoPE (node {node.id}, {node.type}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ROPE_HEAD_DIM}")
    inv_freq = [float(a["theta"] ** (-2.0 * j / hd)) for j in range(hd // 2)]
    inv_freq += [0.0] * (MAX_ROPE_HEAD_DIM // 2 - len(inv_freq))
    n = rows * width // 2
    params = uniform_bytes(*inv_freq, n, width // 2, hd // 2, rows // a["batch"],
                           float(a["pos_offset"]), int(a["pairing"] == "adjacent"))
    return KernelCall("rope", render("rope.wgsl"), params, _elementwise_groups(n))


@kernel("FullAttention", "CausalAttention")
def _attention(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    masked = len(ins) == 4
    causal = node.op == "CausalAttention"
    src = render(
        "attention.wgsl",
        HEAD_DIM=hd,
        MASK_BINDING="@group(0) @binding(3) var<storage, read> key_mask: array<f32>;" if masked else "",
        MASK="        if (key_mask[b * p.seq + j] <= 0.0) { s = MASK_SENTINEL; }" if masked else "",
        KEY_END="qi + 1u" if causal else "p.seq",
        OUT=len(ins),
        UNIFORM=len(ins) + 1,
    )
    seq = ins[0].shape[0] // batch
    q_blocks = math.ceil(seq / ATTENTION_ROWS)
    total = batch * nh * q_blocks
    params = uniform_bytes(seq, nh, nkv, nh // nkv, q_blocks, total, float(1.0 / math.sqrt(hd)))
    name = f"attention_hd{hd}" + ("_causal" if causal else "") + ("_mask" if masked else "")
    return KernelCall(name, src, params, total)
