"""One lowering entry per op: which WGSL kernel runs it, specialised how, with which
uniform parameters and how many workgroups.

A builder takes the node and its input types and returns a :class:`KernelCall`. Its
storage bindings are always the node's input buffers in ``node.inputs`` order
(read-only) followed by the output buffer (read_write); the uniform, when ``params`` is
non-empty, comes right after. Sizes travel in uniforms, so one pipeline serves every
shape; templating is used only where the code's structure changes (epilogue chains,
RmsNorm prologue and tile of the matmul, the unary/binary/softmax expressions, attention
masking, tiles, head size and RoPE, the number of Concat inputs, the element type of copies). A variant of a
kernel fills hook functions from its own file (``matmul_prologue_*.wgsl``,
``attention_qk*.wgsl``) instead of copying the kernel. The entries of the training ops
(losses, gradients) live in :mod:`.kernels_backward`, the matmul family's in
:mod:`.kernels_matmul`; RoPEGrad shares RoPE's below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .wgsl import render, shader_text, uniform_bytes

#: Invocations per workgroup of the elementwise kernels (one element each).
ELEMENTWISE_WG = 256
#: Invocations per workgroup of the attention kernel (attention.wgsl).
ATTENTION_WG = 256
#: Query rows per workgroup of attention.wgsl at most.
ATTENTION_MAX_ROWS = 64
#: Bytes of workgroup memory attention.wgsl's tiles may take (Q block, K and V tiles,
#: scores and row statistics): the WebGPU default of maxComputeWorkgroupStorageSize,
#: which every device offers.
ATTENTION_TILE_BYTES = 16384
#: Largest head_dim of the attention kernels: the RoPE uniform holds 32 vec4 of frequencies
#: (128 pairs), and CachedAttention needs head_dim / 4 <= its 256 invocations.
MAX_ATTENTION_HEAD_DIM = 256
#: Largest head_dim the RoPE uniform holds frequencies for (64 vec4 = 256 pairs).
MAX_ROPE_HEAD_DIM = 512


@dataclass(frozen=True)
class KernelCall:
    """A specialised kernel for one node: WGSL text, uniform bytes, logical workgroups.

    ``groups`` is the number of workgroups as one linear count; the lowering lays it out
    on a grid that respects maxComputeWorkgroupsPerDimension. ``inputs`` lists the positions
    in ``node.inputs`` that this dispatch binds, in order, when it binds only some (one part
    of a node split over several dispatches, :data:`SPLIT_KERNELS`); None binds them all.
    """

    kernel: str
    source: str
    params: bytes
    groups: int
    entry_point: str = "main"
    inputs: tuple[int, ...] | None = None


KernelBuilder = Callable[[Node, list[TensorType]], KernelCall]

#: Op name -> lowering entry. Ops missing here cannot be lowered (LoweringError).
KERNELS: dict[str, KernelBuilder] = {}

#: Ops whose work the lowering spreads over several dispatches when one would bind more
#: storage buffers than maxStorageBuffersPerShaderStage: op name -> builder(node, input
#: types, the most storage buffers a dispatch may bind) of the dispatches, in order.
SPLIT_KERNELS: dict[str, Callable[[Node, list[TensorType], int], list[KernelCall]]] = {}


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


def unary_call(node: Node, expr: str) -> KernelCall:
    """unary.wgsl applying the WGSL expression ``expr`` on ``{x}`` to each element of the node."""
    n = node.type.num_elements
    src = render("unary.wgsl", EXPR=expr.format(x="v"))
    return KernelCall(f"unary_{node.op}", src, uniform_bytes(n), _elementwise_groups(n))


@kernel(*UNARY_WGSL)
def _unary(node: Node, ins: list[TensorType]) -> KernelCall:
    return unary_call(node, UNARY_WGSL[node.op])


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


#: Inputs the concat kernel takes at most (ir.ops_fused Concat), one binding each.
MAX_CONCAT_INPUTS = 16


@kernel("Concat")
def _concat(node: Node, ins: list[TensorType]) -> KernelCall:
    # Concat of computed tensors; a Concat of parameters is a derived parameter (plan.py).
    if len(ins) > MAX_CONCAT_INPUTS:
        raise LoweringError(f"Concat (node {node.id}): {len(ins)} inputs, the kernel takes {MAX_CONCAT_INPUTS}")
    return _concat_part(node, ins, range(len(ins)))


def _concat_split(node: Node, ins: list[TensorType], max_storage: int) -> list[KernelCall]:
    # One dispatch per run of at most max_storage - 1 inputs (and the output), each writing its
    # inputs' range along the axis of the one output buffer.
    per = max(1, max_storage - 1)
    return [_concat_part(node, ins, range(k, min(k + per, len(ins)))) for k in range(0, len(ins), per)]


SPLIT_KERNELS["Concat"] = _concat_split


def _concat_part(node: Node, ins: list[TensorType], part: range) -> KernelCall:
    # concat.wgsl for the inputs ``part`` (consecutive positions): the output's positions
    # [base, base + their total width) along the axis.
    axis, shape = node.attrs["axis"], node.type.shape
    base = sum(ins[t].shape[axis] for t in range(part.start))
    offsets = [0]
    for t in part:
        offsets.append(offsets[-1] + ins[t].shape[axis])
    part_width = offsets[-1]
    offsets += [0] * (4 * 5 - len(offsets))  # concat.wgsl Params.off: 5 x vec4<u32>
    count = len(part)
    last = count - 1
    select = [f"    if (c < off({t + 1}u)) {{ return x{t}[at({t}u, o, c, r)]; }}" for t in range(last)]
    select.append(f"    return x{last}[at({last}u, o, c, r)];")
    dtype = node.type.dtype.value
    src = render(
        "concat.wgsl",
        T=dtype,
        INPUTS="\n".join(f"@group(0) @binding({t}) var<storage, read> x{t}: array<{dtype}>;" for t in range(count)),
        SELECT="\n".join(select),
        OUT=count,
        UNIFORM=count + 1,
    )
    inner = math.prod(shape[axis + 1:])
    n = math.prod(shape[:axis]) * part_width * inner
    params = uniform_bytes(*offsets, n, shape[axis], inner, base, part_width)
    inputs = None if count == len(ins) else tuple(part)
    return KernelCall(f"concat{count}_{dtype}", src, params, _elementwise_groups(n), inputs=inputs)


@kernel("SliceCols")
def _slice_cols(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, size = node.type.shape
    n = rows * size
    params = uniform_bytes(n, size, ins[0].shape[1], node.attrs["start"])
    dtype = node.type.dtype.value
    return KernelCall(f"slice_cols_{dtype}", render("slice_cols.wgsl", T=dtype), params, _elementwise_groups(n))


@kernel("SwiGLUConcat")
def _swiglu_concat(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.num_elements
    return KernelCall("swiglu_concat", render("swiglu_concat.wgsl"), uniform_bytes(n, node.type.shape[1]),
                      _elementwise_groups(n))


# --- matmul family: lowering/kernels_matmul.py ------------------------------------------


# --- rows: softmax, norms, reductions ------------------------------------------------------


@kernel("Softmax")
def _softmax(node: Node, ins: list[TensorType]) -> KernelCall:
    n = node.type.shape[-1]
    rows = node.type.num_elements // n
    src = render("softmax.wgsl", NORM="1.0 / total", OUT="exp(z) * norm")
    return KernelCall("softmax", src, uniform_bytes(rows, n), rows)


@kernel("LayerNorm", "RmsNorm")
def _norm(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, n = node.type.shape
    file = "layer_norm.wgsl" if node.op == "LayerNorm" else "rms_norm.wgsl"
    return KernelCall(file[:-5], render(file), uniform_bytes(rows, n, float(node.attrs["eps"])), rows)


@kernel("GroupNorm", "GroupNormSilu")
def _group_norm(node: Node, ins: list[TensorType]) -> KernelCall:
    n, c, size = node.type.shape
    g = node.attrs["num_groups"]
    silu = node.op == "GroupNormSilu"
    src = render("group_norm.wgsl", ACT="silu(v)" if silu else "v")
    params = uniform_bytes(n * g, g, c // g * size, c // g, size, float(node.attrs["eps"]))
    return KernelCall("group_norm" + ("_silu" if silu else ""), src, params, n * g)


@kernel("SumAll", "MeanAll")
def _reduce_all(node: Node, ins: list[TensorType]) -> KernelCall:
    n = ins[0].num_elements
    scale = 1.0 if node.op == "SumAll" else 1.0 / n
    return KernelCall("reduce_all", render("reduce_all.wgsl"), uniform_bytes(n, float(scale)), 1)


# --- transformer -------------------------------------------------------------------------


def _inv_freq(theta: float, head_dim: int, slots: int) -> list[float]:
    # RoPE frequencies theta^(-2j/head_dim), computed in float64, padded to ``slots`` floats.
    inv_freq = [float(theta ** (-2.0 * j / head_dim)) for j in range(head_dim // 2)]
    return inv_freq + [0.0] * (slots - len(inv_freq))


def rope_uniform(node: Node, batch: int, pos_offset: float, sign: float = 1.0,
                 shape: tuple[int, ...] | None = None) -> tuple[bytes, int]:
    """The Params of rope_rotate.wgsl for the [rows, width] node of ``batch`` sequences (or
    the rows ``shape`` it rotates, when its own shape differs), the frequencies multiplied
    by ``sign``, and the number of pairs to rotate (rows * width / 2).

    Raises LoweringError for a head_dim above MAX_ROPE_HEAD_DIM.
    """
    rows, width = shape or node.type.shape
    a = node.attrs
    hd = a["head_dim"]
    if hd > MAX_ROPE_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, {node.type}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ROPE_HEAD_DIM}")
    n = rows * width // 2
    inv_freq = [sign * f for f in _inv_freq(a["theta"], hd, MAX_ROPE_HEAD_DIM // 2)]
    params = uniform_bytes(*inv_freq, n, width // 2, hd // 2,
                           rows // batch, pos_offset, int(a["pairing"] == "adjacent"))
    return params, n


@kernel("RoPE", "RoPEGrad")
def _rope(node: Node, ins: list[TensorType]) -> KernelCall:
    # RoPEGrad rotates every pair by the opposite angle, R(pos)^T = R(-pos): the same
    # kernel with the frequencies negated.
    sign = -1.0 if node.op == "RoPEGrad" else 1.0
    params, n = rope_uniform(node, node.attrs["batch"], float(node.attrs["pos_offset"]), sign)
    return KernelCall("rope", render("rope.wgsl"), params, _elementwise_groups(n))


#: The uniform fields attention_qk_rope.wgsl reads (they come first: the array is 16-byte
#: aligned). pos_offset is not among them: it cancels out of every score (see that file).
_ATTENTION_ROPE_PARAMS = """    inv_freq: array<vec4<f32>, 32>,  // theta^(-2t/HD), t < HD/2, from the host in float64
    adjacent: u32,                   // 1 for the 'adjacent' pairing, 0 for 'half'"""


def attention_io(names: tuple[str, ...], hd: int, out: int) -> str:
    """WGSL storage bindings of the attention inputs ``names`` (one per distinct name, from
    @binding(0)) and of ``out`` (at @binding(``out``)), with the accessors attention
    kernels read through.

    ``NAME4(base, c)`` is vec4 ``c`` of the HD-element row starting at element ``base``
    (zero past HD); ``store_out(base, c, v)`` writes vec4 ``c`` of an output row. When
    ``hd % 4 == 0`` every row start is a multiple of 4 elements and
    the arrays are bound as ``array<vec4<f32>>`` (one 16-byte load per vec4); otherwise as
    ``array<f32>``, read element by element.
    """
    vec = hd % 4 == 0
    lines = [f"const VW: u32 = {4 if vec else 1}u;  // elements per array entry"]
    unique = list(dict.fromkeys(names))
    for i, n in enumerate(unique):
        if vec:
            lines += [f"@group(0) @binding({i}) var<storage, read> {n}: array<vec4<f32>>;",
                      f"fn {n}4(base: u32, c: u32) -> vec4<f32> {{ return {n}[base / 4u + c]; }}"]
        else:
            lines += [f"@group(0) @binding({i}) var<storage, read> {n}: array<f32>;",
                      f"fn {n}4(base: u32, c: u32) -> vec4<f32> {{",
                      "    var r = vec4<f32>();",
                      "    for (var e = 0u; e < 4u; e = e + 1u) {",
                      f"        if (4u * c + e < HD) {{ r[e] = {n}[base + 4u * c + e]; }}",
                      "    }",
                      "    return r;",
                      "}"]
    if vec:
        lines += [f"@group(0) @binding({out}) var<storage, read_write> out: array<vec4<f32>>;",
                  "fn store_out(base: u32, c: u32, v: vec4<f32>) { out[base / 4u + c] = v; }"]
    else:
        lines += [f"@group(0) @binding({out}) var<storage, read_write> out: array<f32>;",
                  "fn store_out(base: u32, c: u32, v: vec4<f32>) {",
                  "    for (var e = 0u; e < 4u; e = e + 1u) {",
                  "        if (4u * c + e < HD) { out[base + 4u * c + e] = v[e]; }",
                  "    }",
                  "}"]
    return "\n".join(lines)


def attention_tiles(hd: int) -> tuple[int, int]:
    """(BQ query rows per workgroup, BK keys per tile) of attention.wgsl for head size ``hd``.

    BQ = ATTENTION_WG / ceil(hd / 4) (at most ATTENTION_MAX_ROWS), so that each invocation
    owns one vec4 of the output block; BK the most keys, a power of two of at most 64,
    whose tiles fit ATTENTION_TILE_BYTES: the Q block and the K and V tiles (16 bytes per
    vec4), the BQ x BK scores and three f32 statistics per row. hd 64: (16, 16); hd 32:
    (32, 16); hd 256: (4, 4).
    """
    hd4 = math.ceil(hd / 4)
    bq = max(1, min(ATTENTION_MAX_ROWS, ATTENTION_WG // hd4))
    bk = 64
    while bk > 1 and 16 * hd4 * (bq + 2 * bk) + 4 * bq * (bk + 3) > ATTENTION_TILE_BYTES:
        bk //= 2
    return bq, bk


@kernel("FullAttention", "CausalAttention", "CausalAttentionRoPE")
def _attention(node: Node, ins: list[TensorType]) -> KernelCall:
    a = node.attrs
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    masked = len(ins) == 4
    packed = len(ins) == 1  # one [rows, (nh + 2 nkv) * hd] projection: q, k, v side by side
    causal = node.op != "FullAttention"
    rope = node.op == "CausalAttentionRoPE"
    names = ("qkv",) * 3 if packed else ("q", "k", "v")
    seq = ins[0].shape[0] // batch
    bq, bk = attention_tiles(hd)
    qk = shader_text("attention_qk_rope.wgsl" if rope else "attention_qk.wgsl")
    mask = "                if (key_mask[b * p.seq + k0 + j] <= 0.0) { s = MASK_SENTINEL; }"
    src = render(
        "attention.wgsl",
        HEAD_DIM=hd,
        BQ=bq,
        BK=bk,
        WG=ATTENTION_WG,
        Q=names[0],
        ROPE_PARAMS=_ATTENTION_ROPE_PARAMS if rope else "",
        IO=attention_io(names, hd, len(ins)),
        V=names[2],
        K=names[1],
        QK=qk,
        MASK_BINDING="@group(0) @binding(3) var<storage, read> key_mask: array<f32>;" if masked else "",
        MASK=mask if masked else "",
        KEY_END="qi + 1u" if causal else "p.seq",  # of key_end_of(qi)
        TILES_END="min(p.seq, q0 + BQ)" if causal else "p.seq",
        UNIFORM=len(ins) + 1,
    )
    q_blocks = math.ceil(seq / bq)
    total = batch * nh * q_blocks
    rope_params = []
    if rope:
        rope_params = [*_inv_freq(a["theta"], hd, MAX_ATTENTION_HEAD_DIM // 2), int(a["pairing"] == "adjacent")]
    width = (nh + 2 * nkv) * hd
    strides = (width, width, nh * hd, (nh + nkv) * hd) if packed else (nh * hd, nkv * hd, 0, 0)
    params = uniform_bytes(*rope_params, seq, nh, nkv, nh // nkv, q_blocks, total, float(1.0 / math.sqrt(hd)),
                           *strides)
    name = (f"attention_hd{hd}" + ("_causal" if causal else "") + ("_mask" if masked else "")
            + ("_rope" if rope else "") + ("_packed" if packed else ""))
    return KernelCall(name, src, params, total)
