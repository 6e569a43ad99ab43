"""The quant family: weights kept in llama.cpp's block formats (Q4_0, Q4_1, Q8_0) or as float16,
and decoded inside the kernels that read them.

A quantised weight is a u32 :class:`Parameter` ``q`` [rows, row_words]: each row holds the
blocks of one row of the f32 matrix [rows, cols] (32 consecutive weights per block, so blocks
lie along the columns), as llama.cpp writes them (``ggml-common.h``), zero-padded to a whole
word. ``Dequant(q)`` is that f32 matrix, a term like any other, so every rule of the f32 graph
applies to it unchanged. The rules below fold a ``Dequant`` into the op that reads it, whose
kernel then decodes the blocks while loading: a matmul with B stored [N,K] (``MatMulBT``, the
LLM layout, blocks along K) becomes :data:`QuantMatMul` (the tiled kernel for prefill and the
GEMV for decode, with every epilogue), the RmsNorm prologue :data:`QuantRmsNormMatMul`, and an
embedding lookup :data:`QuantEmbedding`. A ``Dequant`` no rule folds away is computed by a
kernel of its own (an f32 copy of the matrix), so a plan is never wrong, only larger.

Packing. Concatenating the rows of two quantised matrices concatenates their blocks, since a
row's blocks never span two rows: ``Concat(Dequant(q1), Dequant(q2), axis=0) =
Dequant(Concat(q1, q2, axis=0))`` when both have the same format and columns. So the packed
QKV projection and the packed gate/up matmul (``attention``/``swiglu`` rulesets) get quantised
twins here, matching weights ``Dequant(Parameter)`` instead of ``Parameter``; the packed
blocks are a derived parameter, packed once per session. Weights of different formats are
not packed (one kernel decodes one format), and matmuls of another variant than 'BT' (B
[K,N]: blocks along N) keep their ``Dequant``.

Block layouts (llama.cpp ``ggml-common.h``, ``dequantize_row_*`` in ``ggml-quants.c``), d
and m float16:

- ``q4_0``: 18 bytes: d, then 16 bytes qs; weight j = d * (qs[j] & 15) - 8 d for j < 16,
  d * (qs[j - 16] >> 4) - 8 d above.
- ``q4_1``: 20 bytes (5 words): d, m, 16 bytes qs; weight j = d * nibble(j) + m.
- ``q8_0``: 34 bytes: d, then 32 int8 qs; weight j = d * qs[j].
- ``f16``: 64 bytes: 32 IEEE 754 binary16 weights (ggml's F16 rows, cut into blocks of 32 so
  that every format here is rows of blocks); weight j is half j, unpacked with core WGSL's
  ``unpack2x16float`` (two halves a word, the lower one first), so no ``shader-f16`` needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..kernel import Buffer, Include, Kernel, elementwise_groups
from ..spec import Attr, example, need, need_f32, no_grad, op, rules
from ..types import DType, TensorType
from .attention import packed_qkv_rule
from .fused_epilogue import epilogue_ops
from .kv_cache import decode_step, packed_decode_rule
from .matmul import SWIGLU_PROLOGUE_MAX_ROWS, apply_epilogue, check_epilogue
from .matmul_kernel import matmul_kernel_for, max_scratch_bytes, max_storage_buffers, workgroup_storage

FAMILY = "quant"

#: Weights per block, in every format here.
BLOCK = 32


@dataclass(frozen=True)
class QuantFormat:
    """A block format: ``name`` (as the ops' ``format`` attribute), bytes per block of 32."""

    name: str
    block_bytes: int

    def row_words(self, cols: int) -> int:
        """u32 words per stored row of ``cols`` weights (a multiple of 32): its blocks, zero-padded."""
        return math.ceil(cols // BLOCK * self.block_bytes / 4)


FORMATS = {f.name: f for f in (QuantFormat("q4_0", 18), QuantFormat("q4_1", 20), QuantFormat("q8_0", 34),
                                QuantFormat("f16", 64))}

#: The largest finite float16 (IEEE 754 binary16): a weight beyond it has no f16 storage.
F16_MAX = 65504.0

_NO_GRAD = no_grad("quantised blocks are integer data: gradients stop at them (train f32 weights, then quantise); "
                   "the rewrite engine introduces this op after autodiff, from MatMulBT/Embedding of a Dequant")


def quant_format(name: str) -> QuantFormat:
    """The format called ``name``; ShapeError naming the known ones otherwise."""
    need(name in FORMATS, f"unknown block format {name!r}; formats: {', '.join(FORMATS)}")
    return FORMATS[name]


def check_blocks(q: TensorType, fmt: str, cols: int, what: str = "q") -> QuantFormat:
    """ShapeError unless ``q`` is u32 [rows, row_words] holding rows of ``cols`` weights in ``fmt``."""
    f = quant_format(fmt)
    need(cols >= BLOCK and cols % BLOCK == 0, f"{what}: a row of {fmt} blocks holds a multiple of {BLOCK} weights, "
                                              f"got {cols} columns")
    if q.dtype is not DType.U32 or q.rank != 2 or q.shape[1] != f.row_words(cols):
        need(False, f"{what} must be u32 [rows, {f.row_words(cols)}] ({cols} weights a row in {fmt}), got {q}")
    return f


# --- host side: rows of blocks as words, the reference decoder ----------------------------------


def pack_rows(blocks: np.ndarray) -> np.ndarray:
    """Rows of block bytes (uint8 [rows, row_bytes]) as u32 words [rows, ceil(row_bytes / 4)],
    each row zero-padded to a whole word (little-endian, as the device reads them)."""
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    rows, nbytes = blocks.shape
    padded = np.zeros((rows, -(-nbytes // 4) * 4), dtype=np.uint8)
    padded[:, :nbytes] = blocks
    return padded.view("<u4").astype(np.uint32).reshape(rows, -1)


def f16_rows(arr: np.ndarray) -> np.ndarray:
    """A float matrix [rows, cols] (cols even) rounded to float16 (numpy's round to nearest even)
    and stored as rows of the ``f16`` format: u32 [rows, cols / 2]. The caller checks the range
    (:data:`F16_MAX`); a larger value becomes an infinity."""
    halves = np.ascontiguousarray(np.asarray(arr).astype("<f2"))
    return halves.view("<u4").astype(np.uint32).reshape(halves.shape[0], -1)


def block_bytes(words: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """The inverse of :func:`pack_rows`: uint8 [rows, cols / 32, block_bytes]."""
    f = FORMATS[fmt]
    w = np.ascontiguousarray(words, dtype="<u4")
    raw = w.view(np.uint8).reshape(w.shape[0], -1)[:, :cols // BLOCK * f.block_bytes]
    return raw.reshape(w.shape[0], cols // BLOCK, f.block_bytes)


def dequantize(words: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """The float64 weights [rows, cols] of quantised rows (llama.cpp ``dequantize_row_q4_0``,
    ``_q4_1``, ``_q8_0``; the formats in the module docstring; ``f16``: the halves as they are)."""
    b = block_bytes(words, fmt, cols)
    if fmt == "f16":
        return np.ascontiguousarray(b).reshape(words.shape[0], -1).view("<f2").astype(np.float64)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float64)  # [rows, nb, 1]
    if fmt == "q8_0":
        vals = b[..., 2:34].view(np.int8).astype(np.float64) * d
    else:
        qs = b[..., 4:20] if fmt == "q4_1" else b[..., 2:18]
        nib = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)  # [rows, nb, 32]
        if fmt == "q4_1":
            vals = d * nib + b[..., 2:4].copy().view(np.float16).astype(np.float64)
        else:
            vals = d * (nib - 8.0)
    return vals.reshape(words.shape[0], cols)


# --- Dequant: the f32 matrix of quantised rows ------------------------------------------------

_FORMAT = Attr("format", "str", doc="block format: q4_0, q4_1, q8_0 or f16")


def _dequant(ts, a):
    check_blocks(ts[0], a["format"], a["cols"])
    return TensorType((ts[0].shape[0], a["cols"]))


def _rows_kernel(name: str, row: str, rows: int, cols: int, fmt: str, words: int, bindings, extra=()) -> Kernel:
    # One invocation per quad (4 weights of an output row) of dequant.wgsl; ``row``: the block row
    # output row r decodes.
    quads = rows * cols // 4
    return Kernel(f"{name}_{fmt}", "dequant.wgsl", elementwise_groups(quads),
                  params=(("quads", "u32", quads), ("cols", "u32", cols), ("row_words", "u32", words), *extra),
                  slots={"FORMAT": fmt, "ROW": row, "DECODE": Include("quant_decode.wgsl")}, bindings=bindings)


def _dequant_kernel(node, ins, target) -> Kernel:
    rows, words = ins[0].shape
    return _rows_kernel("dequant", "r", rows, node.attrs["cols"], node.attrs["format"], words,
                        (Buffer("q", "u32"), Buffer("out", write=True)))


op("Dequant", ("q",), _dequant, lambda xs, a: dequantize(xs[0], a["format"], a["cols"]),
   attrs=(_FORMAT, Attr("cols", "int")), vjp=_NO_GRAD, kernel=_dequant_kernel, flops=lambda ins, out, a: 0,
   doc="the f32 matrix [rows, cols] of quantised rows q u32 [rows, row_words] in llama.cpp's block format "
       "(ggml-common.h block_q4_0 / block_q4_1 / block_q8_0; ggml-quants.c dequantize_row_*) or as float16")


# --- QuantMatMul, QuantRmsNormMatMul: the fused matmuls with B as blocks -----------------------


def _quant_matmul(ts, a):
    x, q = ts[0], ts[1]
    need_f32(x, "A")
    need(x.rank == 2, f"A must be 2-D, got {x}")
    check_blocks(q, a["format"], x.shape[1])
    check_epilogue(x.shape[0], q.shape[0], a["epilogue"], ts[2:])
    return TensorType((x.shape[0], q.shape[0]))


def _quant_flops(first: int):
    def flops(ins, out, attrs):
        m, k = ins[0].shape
        n = ins[first].shape[0]
        return 2 * m * k * n + out.num_elements * epilogue_ops(attrs["epilogue"]) + (3 * m * k if first == 2 else 0)

    return flops


def _quant_matmul_kernel(node, ins, target) -> Kernel | list[Kernel]:
    rms = node.op == "QuantRmsNormMatMul"
    swiglu = node.op == "QuantSwiGLUMatMul"
    (m, k), (n, words) = ins[0].shape, ins[2 if rms else 1].shape
    return matmul_kernel_for("BT", tuple(node.attrs["epilogue"]), m, k // 2 if swiglu else k, n, rms_norm=rms,
                             eps=float(node.attrs["eps"]) if rms else 0.0, quant=node.attrs["format"], row_words=words,
                             operand_types=tuple(ins[3 if rms else 2:]), swiglu=swiglu,
                             max_scratch_bytes=max_scratch_bytes(target), storage_buffers=max_storage_buffers(target),
                             device_barriers=target.device_barriers, workgroup_storage=workgroup_storage(target))


_EPILOGUE = Attr("epilogue", "epilogue", ())

op("QuantMatMul", ("a", "q", "*operands"), _quant_matmul,
   lambda xs, a: apply_epilogue(xs[0] @ dequantize(xs[1], a["format"], xs[0].shape[1]).T, a["epilogue"], xs[2:]),
   attrs=(_FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_quant_matmul_kernel, flops=_quant_flops(1),
   doc="C = epilogue(A @ Dequant(q)^T): FusedMatMul 'BT' with B [N,K] as N rows of K weights in blocks "
       "(q u32 [N, row_words]), decoded by the matmul kernels' loader; inputs [A, q, *epilogue operands]")


def _quant_rms_norm_matmul(ts, a):
    x, w_norm = ts[0], ts[1]
    need_f32(w_norm, "w_norm")
    need(x.rank == 2 and w_norm.shape == (x.shape[1],), f"w_norm must be [{x.shape[-1]}] for x {x}, got {w_norm}")
    return _quant_matmul([x, *ts[2:]], a)


def _quant_rms_norm_matmul_ref(xs, a):
    from .norms import rms_norm_ref

    normed = rms_norm_ref(xs[:2], a)
    return apply_epilogue(normed @ dequantize(xs[2], a["format"], xs[0].shape[1]).T, a["epilogue"], xs[3:])


op("QuantRmsNormMatMul", ("x", "w_norm", "q", "*operands"), _quant_rms_norm_matmul, _quant_rms_norm_matmul_ref,
   attrs=(Attr("eps", "float"), _FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_quant_matmul_kernel,
   flops=_quant_flops(2),
   doc="C = epilogue(RmsNorm(x, w_norm, eps) @ Dequant(q)^T): FusedRmsNormMatMul 'BT' with quantised B "
       "(Zhang & Sennrich 2019 for the norm); inputs [x, w_norm, q, *epilogue operands]")


def _quant_swiglu_matmul(ts, a):
    x = ts[0]
    need_f32(x, "x")
    need(x.rank == 2 and x.shape[1] % 2 == 0, f"x must be [M, 2K] (gate and up side by side), got {x}")
    return _quant_matmul([TensorType((x.shape[0], x.shape[1] // 2)), *ts[1:]], a)


def _quant_swiglu_matmul_ref(xs, a):
    from .elementwise import _swiglu_concat_ref

    gated = _swiglu_concat_ref(xs[:1], {})
    return apply_epilogue(gated @ dequantize(xs[1], a["format"], gated.shape[1]).T, a["epilogue"], xs[2:])


def _quant_swiglu_flops(ins, out, attrs):
    m, k = ins[0].shape[0], ins[0].shape[1] // 2
    return 2 * m * k * ins[1].shape[0] + 5 * m * k + out.num_elements * epilogue_ops(attrs["epilogue"])


op("QuantSwiGLUMatMul", ("x", "q", "*operands"), _quant_swiglu_matmul, _quant_swiglu_matmul_ref,
   attrs=(_FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_quant_matmul_kernel, flops=_quant_swiglu_flops,
   doc="C = epilogue(SwiGLUConcat(x) @ Dequant(q)^T): FusedSwiGLUMatMul 'BT' with quantised B, x [M, 2K] the "
       "gate and up projections side by side (Shazeer 2020); inputs [x, q, *epilogue operands]")


# --- QuantEmbedding ---------------------------------------------------------------------------


def _quant_embedding(ts, a):
    idx, q = ts
    need(idx.dtype in (DType.U32, DType.I32) and idx.rank == 1, f"indices must be u32 or i32 1-D, got {idx}")
    check_blocks(q, a["format"], a["cols"], "table")
    return TensorType((idx.shape[0], a["cols"]))


def _quant_embedding_ref(xs, a):
    from .indexing import normalise
    from .transformer import _embedding_ref

    idx, table = xs[0], dequantize(xs[1], a["format"], a["cols"])
    if idx.dtype.kind == "i":  # ONNX Gather's indices: negative ones from the end, the rest clamped
        return table[normalise(idx, table.shape[0])]
    return _embedding_ref([idx, table], a)


def _quant_embedding_kernel(node, ins, target) -> Kernel:
    rows, words = ins[1].shape  # cols % 32 == 0 (the shape rule): whole quads
    signed = ins[0].dtype is DType.I32
    from .indexing import normalise_wgsl

    row = normalise_wgsl("indices[r]", "p.vocab") if signed else "min(indices[r], p.vocab - 1u)"
    return _rows_kernel("quant_embedding" + ("_i32" if signed else ""), row, ins[0].shape[0], node.attrs["cols"],
                        node.attrs["format"], words, (Buffer("indices", "i32" if signed else "u32"), Buffer("q", "u32"),
                                                      Buffer("out", write=True)), (("vocab", "u32", rows),))


op("QuantEmbedding", ("indices", "q"), _quant_embedding, _quant_embedding_ref,
   attrs=(_FORMAT, Attr("cols", "int")), vjp=_NO_GRAD, kernel=_quant_embedding_kernel,
   flops=lambda ins, out, a: 0, index_bounds=lambda ins, a: {0: ins[1].shape[0]},
   doc="out[t] = Dequant(q)[indices[t]]: Embedding of a table of quantised rows, only the rows looked up "
       "decoded (llama.cpp's get_rows of a quantised tensor); indices u32 [T], or i32 [T] read as ONNX Gather "
       "reads them (negative ones from the end, the rest clamped: an export's Gather of a table stored f16)")


# --- rules -------------------------------------------------------------------------------------


def _quant_param(g, name: str, rows: int, cols: int, fmt: str = "q4_1") -> int:
    return g.add_node("Dequant", (g.parameter(name, [rows, FORMATS[fmt].row_words(cols)], DType.U32),),
                      format=fmt, cols=cols)


def _k(dim) -> int:
    return BLOCK * dim("kb", 1, 3)


def _qmm_example(g, dim, fmt: str = "q4_1", rms: bool = False) -> None:
    k, n = _k(dim), dim("n")
    x = g.input("x", [dim("m"), k])
    if rms:
        x = g.rms_norm(x, g.parameter("w", [k]))
    g.set_outputs([g.relu(g.matmul_bt(x, _quant_param(g, "W", n, k, fmt)))])


def _qswiglu_example(g, dim) -> None:
    k, n = _k(dim), dim("n")
    h = g.swiglu_concat(g.input("x", [dim("m", 1, SWIGLU_PROLOGUE_MAX_ROWS), 2 * k]))  # decode rows
    g.set_outputs([g.add(g.matmul_bt(h, _quant_param(g, "W", n, k, "q4_1")), g.input("r", [dim("m"), n]))])


def _qgather_example(g, dim, rank: int) -> None:
    # ONNX Gather of a quantised table by i32 ids, negative ones among them (from the end)
    rows, k = dim("rows"), _k(dim)
    ids = g.input("ids", [dim("b", 1, 3), dim("t")][2 - rank:], DType.I32)
    g.set_outputs([g.add_node("Gather", (_quant_param(g, "E", rows, k, "q8_0"), ids), axis=0)])


def _qemb_example(g, dim) -> None:
    rows, k = dim("rows"), _k(dim)
    g.set_outputs([g.embedding(g.input("tokens", [dim("t")], DType.U32), _quant_param(g, "E", rows, k, "q8_0"))])


@rules("quant")
def _fold_dequant(e):
    a, q, x, w = e.vars("a q x w")
    f, = e.vars("f", e.String)
    c, = e.vars("c", e.i64)
    eps, = e.vars("eps", e.f64)
    ep, = e.vars("e", e.Epi)
    dq = e.Dequant(q, format=f, cols=c)
    # FusedMatMul(a, Dequant(q), 'BT', e) -> QuantMatMul(a, q, e)   (blocks along K: decoded by the loader)
    yield e.equal("FusedMatMulBT(a, Dequant(q), e) -> QuantMatMul(a, q, e)",
                  e.FusedMatMul(a, dq, variant=e.String("BT"), epilogue=ep), e.QuantMatMul(a, q, format=f, epilogue=ep),
                  example=example(_qmm_example))
    # FusedRmsNormMatMul(x, w, Dequant(q), 'BT', e) -> QuantRmsNormMatMul(x, w, q, e)
    yield e.equal("FusedRmsNormMatMulBT(x, w, Dequant(q), e) -> QuantRmsNormMatMul(x, w, q, e)",
                  e.FusedRmsNormMatMul(x, w, dq, eps=eps, variant=e.String("BT"), epilogue=ep),
                  e.QuantRmsNormMatMul(x, w, q, eps=eps, format=f, epilogue=ep),
                  example=example(lambda g, dim: _qmm_example(g, dim, "q8_0", rms=True)))
    # FusedSwiGLUMatMul(x, Dequant(q), 'BT', e) -> QuantSwiGLUMatMul(x, q, e)
    yield e.equal("FusedSwiGLUMatMulBT(x, Dequant(q), e) -> QuantSwiGLUMatMul(x, q, e)",
                  e.FusedSwiGLUMatMul(x, dq, variant=e.String("BT"), epilogue=ep),
                  e.QuantSwiGLUMatMul(x, q, format=f, epilogue=ep), example=example(_qswiglu_example))
    # Embedding(i, Dequant(q)) -> QuantEmbedding(i, q)   (only the rows looked up are decoded)
    yield e.equal("Embedding(i, Dequant(q)) -> QuantEmbedding(i, q)", e.Embedding(a, dq),
                  e.QuantEmbedding(a, q, format=f, cols=c), example=example(_qemb_example))
    # Gather(Dequant(q), i, axis 0) -> Reshape(QuantEmbedding(Reshape(i, [B S]), q), [B, S, cols])   for i32 ids
    # [B, S] (an export's embedding lookup of a table the f16 ruleset stored as halves), or [T] without the Reshapes
    si = e.var("si", e.Vec[e.i64])
    gather = e.Gather(dq, a, axis=e.i64(0))
    yield e.equal("Gather(Dequant(q), i [T], axis 0) -> QuantEmbedding(i, q)", gather,
                  e.QuantEmbedding(a, q, format=f, cols=c), e.eq(e.shape(a)).to(si), e.eq(si.length()).to(e.i64(1)),
                  example=example(lambda g, dim: _qgather_example(g, dim, 1)))
    flat = e.Identity(a, shape=e.Vec(si[0] * si[1]))
    rows = e.QuantEmbedding(flat, q, format=f, cols=c)
    yield e.rule(gather, e.eq(e.shape(a)).to(si), e.eq(si.length()).to(e.i64(2)),
                 name="Gather(Dequant(q), i [B,S], axis 0) -> Reshape(QuantEmbedding(Reshape(i, [B S]), q), "
                      "[B,S,cols])",
                 example=example(lambda g, dim: _qgather_example(g, dim, 2))).then(
        e.union(gather).with_(e.Identity(rows, shape=e.Vec(si[0], si[1], c))),
        e.set_(e.shape(flat)).to(e.Vec(si[0] * si[1])), e.set_(e.shape(rows)).to(e.Vec(si[0] * si[1], c)))


def _gate_up_example(g, dim) -> None:
    k, n = _k(dim), dim("n")
    h = g.input("h", [dim("m"), k])
    g.set_outputs([g.swiglu(g.matmul_bt(h, _quant_param(g, "wg", n, k)), g.matmul_bt(h, _quant_param(g, "wu", n, k)))])


@rules("swiglu")
def _quant_gate_up_concat(e):
    (h,) = e.vars("h")
    ng, nu, f = e.vars("ng nu f", e.String)
    sg, su = e.vars("sg su", e.Vec[e.i64])
    (c,) = e.vars("c", e.i64)
    pg, pu = e.Parameter(ng, sg), e.Parameter(nu, su)
    # SwiGLU(h@Dequant(Pg)^T, h@Dequant(Pu)^T) -> SwiGLUConcat(h@Dequant(Concat0(Pg,Pu))^T)   (one format and
    # K: the rows of both weights' blocks, stacked; swiglu's _gate_up_concat for weights kept quantised)
    gate, up = (e.MatMulBT(h, e.Dequant(p, format=f, cols=c)) for p in (pg, pu))
    yield e.equal("SwiGLU(h@Dequant(Pg)^T, h@Dequant(Pu)^T) -> SwiGLUConcat(h@Dequant(Concat(Pg,Pu))^T)",
                  e.SwiGLU(gate, up),
                  e.SwiGLUConcat(e.MatMulBT(h, e.Dequant(e.Concat(pg, pu, axis=0), format=f, cols=c))),
                  example=example(_gate_up_example))


def _qkv_example(g, dim, masked: bool = False) -> None:
    nh, nkv, hd, batch = 2, 1, 32, 2 if masked else 1
    s = dim("s")
    h = g.input("h", [batch * s, 64])
    mask = dict(key_mask=g.input("key_mask", [batch, s])) if masked else {}
    q, k, v = (g.matmul_bt(h, _quant_param(g, f"w{t}", heads * hd, 64)) for t, heads in (("q", nh), ("k", nkv),
                                                                                         ("v", nkv)))
    g.set_outputs([g.causal_attention_rope(q, k, v, nh, nkv, hd, 100.0, batch=batch, **mask)])


@rules("attention")
def _quant_packed_qkv(e):
    (h, m) = e.vars("h m")
    nq, nk, nv, f = e.vars("nq nk nv f", e.String)
    sq, sk, sv = e.vars("sq sk sv", e.Vec[e.i64])  # one per weight, as attention.py's _packed_qkv says why
    (c,) = e.vars("c", e.i64)
    pq, pk, pv = e.Parameter(nq, sq), e.Parameter(nk, sk), e.Parameter(nv, sv)
    # CausalAttentionRoPE(h@Dequant(Wq)^T, h@Dequant(Wk)^T, h@Dequant(Wv)^T[, m]) -> CausalAttentionRoPE(P[, m]),
    # P = h@Dequant(Concat0(Wq,Wk,Wv))^T, and each projection the SliceCols of P (attention.py's _packed_qkv
    # for weights kept quantised: the rows of q, k and v's blocks stacked, one format and K)
    for masked in (False, True):
        label = ", m" if masked else ""
        yield packed_qkv_rule(
            e, [(e.MatMulBT(h, e.Dequant(w, format=f, cols=c)), s[0]) for w, s in ((pq, sq), (pk, sk), (pv, sv))],
            e.MatMulBT(h, e.Dequant(e.Concat(pq, pk, pv, axis=0), format=f, cols=c)),
            name=f"CausalAttentionRoPE(h@Dequant(W)^T, W=Wq,Wk,Wv{label}) -> "
                 f"CausalAttentionRoPE(h@Dequant(Concat(Wq,Wk,Wv))^T{label})",
            example_fn=lambda g, dim, masked=masked: _qkv_example(g, dim, masked), mask=m if masked else None)


@rules("attention")
def _quant_packed_qkv_decode(e):
    nq, nk, nv, f = e.vars("nq nk nv f", e.String)
    sq, sk, sv = e.vars("sq sk sv", e.Vec[e.i64])  # one per weight, as attention.py's _packed_qkv says why
    (c,) = e.vars("c", e.i64)
    pq, pk, pv = e.Parameter(nq, sq), e.Parameter(nk, sk), e.Parameter(nv, sv)
    # kv_cache.py's decode packing for weights kept quantised: h@Dequant(Wq)^T, ... -> SliceCols of
    # h@Dequant(Concat(Wq,Wk,Wv))^T (the rows of q, k and v's blocks stacked; one format and K)
    yield packed_decode_rule(
        e, tuple((e.Dequant(w, format=f, cols=c), s[0]) for w, s in ((pq, sq), (pk, sk), (pv, sv))),
        e.Dequant(e.Concat(pq, pk, pv, axis=0), format=f, cols=c),
        name="decode: h@Dequant(Wq)^T, h@Dequant(Wk)^T, h@Dequant(Wv)^T -> SliceCols of "
             "h@Dequant(Concat(Wq,Wk,Wv))^T",
        example_fn=lambda g, dim: decode_step(g, dim, lambda g, h, name, rows, cols: g.matmul_bt(
            h, _quant_param(g, name, rows, cols))))
