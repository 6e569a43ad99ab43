"""The f16 family: f32 weights stored as float16 where the rewrite engine chooses it.

``ToF16(x0, x1, ...)`` is the matrix [sum of rows, cols] that stacks its f32 inputs [rows_i, cols]
along axis 0 (as ``Concat(..., axis=0)``), rounded to float16 and stored as rows of the ``f16``
format of :mod:`.quant` (u32 [rows, cols / 2], two halves a word, the lower one first).
``Dequant(ToF16(...), format='f16')`` reads it back as f32, so the folding rules of
:mod:`.quant` turn a matmul or an embedding of it into ``QuantMatMul`` /
``QuantRmsNormMatMul`` / ``QuantEmbedding`` with format ``f16``, whose kernels decode the
halves while loading (``shaders/quant_decode.wgsl``) and compute in f32.

Of parameters only (the weights of inference), ``ToF16`` is a derived parameter: a session
rounds and packs it once, on the host (numpy's round to nearest even), and the cost model
charges nothing for it, so a matmul's bytes of B are halved. Of computed tensors (or of
parameters a training step updates in place) it is one dispatch per input (WGSL
``pack2x16float``).

Rounding changes values, so the rules that introduce ``ToF16`` are not equalities of the
f32 graph: they live in the ``f16`` ruleset, which only ``compile(..., precision="f16")`` runs
(:data:`eggfuse.rewrites.rulesets.OPTIONAL`). Their soundness examples hold within the error
of rounding a weight to float16 (a relative 2^-11 per weight, IEEE 754 binary16's unit
roundoff) instead of float64 rounding. The packing twins (QKV, gate/up) are exact.

What is stored f16: every matmul weight stored [N, K] (``MatMulBT``: the LLaMA family's and
the BERT family's linear layers; K a multiple of 32), every one stored [K, N] (``MatMul``: an
ONNX exporter's linear layers, as ``ToF16(P, transposed)``: the rows of P^T; K a multiple of 32)
and every table whose rows are a multiple of 32 long that an ``Embedding`` or an export's
``Gather`` (axis 0, i32 ids) reads. Activations, norms' weights and biases stay f32.
"""

from __future__ import annotations

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, example, need, need_f32, no_grad, op, rules
from ..types import DType, TensorType
from .attention import bert_attention, packed_encoder_qkv_rules, packed_qkv_rule
from .kv_cache import decode_step, packed_decode_rule
from .quant import BLOCK, f16_rows

FAMILY = "f16"

#: Tolerance of the soundness examples of the rules that round weights to f16 (relative and
#: absolute, on outputs of sums of up to 96 products of standard normal values).
F16_RULE_TOL = 2e-2


def _to_f16(ts, a):
    first = ts[0]
    k = 0 if a.get("transposed") else 1  # the axis the inputs share (the f16 rows' cols)
    for i, t in enumerate(ts):
        need_f32(t, f"input {i}")
        need(t.rank == 2 and t.shape[k] == first.shape[k] and t.shape[k] % 2 == 0,
             f"input {i} is {t}, beside input 0 {first}: every input must be 2-D f32 with the same even number of "
             f"{'rows (transposed: [K, N_i], K even)' if k == 0 else 'columns ([N_i, K], K even)'}; pad K to an "
             "even size or store the weight f32")
    return TensorType((sum(t.shape[1 - k] for t in ts), first.shape[k] // 2), DType.U32)


def _to_f16_ref(xs, a):
    if a.get("transposed"):
        return f16_rows(np.concatenate([np.asarray(x) for x in xs], axis=1).T)
    return f16_rows(np.concatenate([np.asarray(x) for x in xs], axis=0))


def _to_f16_kernel(node, ins, target) -> list[Kernel]:
    # one dispatch per input: its words, at its rows' offset in the output (transposed: an input [K, n] gives n
    # rows of K / 2 words, word c of row r the halves of x[2c][r] and x[2c + 1][r])
    words = node.type.shape[1]
    transposed = node.attrs.get("transposed", False)
    kernels, first = [], 0
    for t, ty in enumerate(ins):
        rows = ty.shape[1] if transposed else ty.shape[0]
        n = rows * words
        kernels.append(Kernel("to_f16", "to_f16.wgsl", elementwise_groups(n),
                              params=(("words", "u32", n), ("first", "u32", first),
                                      ("cols", "u32", ty.shape[1] if transposed else 0), ("row_words", "u32", words)),
                              bindings=(Buffer("x"), Buffer("out", "u32", write=True)), inputs=(t,)))
        first += n
    return kernels


op("ToF16", ("x", "*xs"), _to_f16, _to_f16_ref, attrs=(Attr("transposed", "bool", False),),
   packs_parameters=True, pack_store="f16", kernel=_to_f16_kernel,
   vjp=no_grad("rounding to float16 storage: the f16 ruleset introduces this op after autodiff, for weights"),
   flops=lambda ins, out, a: 0,
   doc="the f32 inputs [rows_i, cols] stacked along axis 0, rounded to float16 (IEEE 754 binary16, round "
       "to nearest even) and stored two halves a u32 word: u32 [sum rows_i, cols / 2], the f16 rows of "
       "ir/ops/quant.py; transposed: inputs [cols, rows_i] (weights [K, N], as exporters store them) stacked "
       "along axis 1, then transposed. Of parameters only, a derived parameter packed once by a session (no "
       "dispatch)")


# --- rules: where weights become f16 ----------------------------------------------------------


def _f16_matmul_example(g, dim) -> None:
    k = BLOCK * dim("kb", 1, 3)
    x = g.input("x", [dim("m"), k])
    g.set_outputs([g.relu(g.matmul_bt(x, g.parameter("W", [dim("n"), k])))])


def _f16_matmul_kn_example(g, dim) -> None:
    k = BLOCK * dim("kb", 1, 3)
    x = g.input("x", [dim("m"), k])
    g.set_outputs([g.relu(g.matmul(x, g.parameter("W", [k, dim("n")])))])


def _f16_packed_example(g, dim, kn: bool) -> None:
    k = BLOCK * dim("kb", 1, 3)
    x = g.input("x", [dim("m"), k])
    ws = [g.parameter(f"W{i}", [k, dim(f"n{i}")] if kn else [dim(f"n{i}"), k]) for i in range(3)]
    packed = g.add_node("Concat", ws, axis=1 if kn else 0)
    g.set_outputs([g.relu(g.matmul(x, packed) if kn else g.matmul_bt(x, packed))])


def _f16_gather_example(g, dim) -> None:
    table = g.parameter("E", [dim("rows"), BLOCK * dim("kb", 1, 2)])
    g.set_outputs([g.add_node("Gather", (table, g.input("ids", [dim("b", 1, 3), dim("t")], DType.I32)), axis=0)])


def _f16_embedding_example(g, dim) -> None:
    table = g.parameter("E", [dim("rows"), BLOCK * dim("kb", 1, 2)])
    g.set_outputs([g.embedding(g.input("tokens", [dim("t")], DType.U32), table)])


@rules("f16")
def _store_f16(e):
    (a,) = e.vars("a")
    (n,) = e.vars("n", e.String)
    (s,) = e.vars("s", e.Vec[e.i64])
    p = e.Parameter(n, s)
    half = e.Dequant(e.ToF16(p, transposed=e.Bool(False)), format=e.String("f16"), cols=s[1])
    whole_blocks = e.eq(s[1] % BLOCK).to(e.i64(0))
    # MatMulBT(a, P) -> MatMulBT(a, Dequant(ToF16(P)))   (P [N,K] rounded to f16; K % 32 == 0)
    yield e.equal("MatMulBT(a, P) -> MatMulBT(a, Dequant(ToF16(P)))", e.MatMulBT(a, p), e.MatMulBT(a, half),
                  whole_blocks, example=example(_f16_matmul_example, tol=F16_RULE_TOL))
    # Embedding(i, P) -> Embedding(i, Dequant(ToF16(P)))   (the table rounded to f16; rows % 32 == 0)
    yield e.equal("Embedding(i, P) -> Embedding(i, Dequant(ToF16(P)))", e.Embedding(a, p), e.Embedding(a, half),
                  whole_blocks, example=example(_f16_embedding_example, tol=F16_RULE_TOL))
    # Gather(P, i, axis 0) -> Gather(Dequant(ToF16(P)), i, axis 0)   (an export's embedding table [V, H] rounded to
    # f16; H % 32 == 0)
    yield e.equal("Gather(P, i, axis 0) -> Gather(Dequant(ToF16(P)), i, axis 0)", e.Gather(p, a, axis=e.i64(0)),
                  e.Gather(half, a, axis=e.i64(0)), e.eq(s.length()).to(e.i64(2)), whole_blocks,
                  example=example(_f16_gather_example, tol=F16_RULE_TOL))
    # MatMul(a, P) -> MatMulBT(a, Dequant(ToF16(P, transposed)))   (P [K,N], as exporters store a linear layer's
    # weight, rounded to f16 as the rows of P^T; K % 32 == 0)
    transposed = e.Dequant(e.ToF16(p, transposed=e.Bool(True)), format=e.String("f16"), cols=s[0])
    yield e.equal("MatMul(a, P) -> MatMulBT(a, Dequant(ToF16(P, transposed)))", e.MatMul(a, p),
                  e.MatMulBT(a, transposed), e.eq(s.length()).to(e.i64(2)), e.eq(s[0] % BLOCK).to(e.i64(0)),
                  example=example(_f16_matmul_kn_example, tol=F16_RULE_TOL))
    # the same of three weights packed side by side (a packed Q/K/V product the attention rules built of f32
    # weights: attention.py's _packed_qkv_unbiased, attention_layout.py's packed GeneralAttention):
    # MatMulBT(a, Concat(P0, P1, P2)) -> MatMulBT(a, Dequant(ToF16(P0, P1, P2))) and MatMul(a, Concat(P0, P1, P2,
    # axis 1)) -> MatMulBT(a, Dequant(ToF16(P0, P1, P2, transposed))); one shape variable per parameter
    names, shapes = e.vars("n0 n1 n2", e.String), e.vars("s0 s1 s2", e.Vec[e.i64])
    ps = [e.Parameter(ni, si) for ni, si in zip(names, shapes, strict=True)]
    for kn in (False, True):
        k = shapes[0][0] if kn else shapes[0][1]
        stored = e.Dequant(e.ToF16(*ps, transposed=e.Bool(kn)), format=e.String("f16"), cols=k)
        lhs = e.MatMul(a, e.Concat(*ps, axis=e.i64(1))) if kn else e.MatMulBT(a, e.Concat(*ps, axis=e.i64(0)))
        yield e.equal(f"{'MatMul' if kn else 'MatMulBT'}(a, Concat(P0, P1, P2{', axis 1' if kn else ''})) -> "
                      f"MatMulBT(a, Dequant(ToF16(P0, P1, P2{', transposed' if kn else ''})))", lhs,
                      e.MatMulBT(a, stored), *(e.eq(si.length()).to(e.i64(2)) for si in shapes),
                      e.eq(k % BLOCK).to(e.i64(0)),
                      example=example(lambda g, dim, kn=kn: _f16_packed_example(g, dim, kn), tol=F16_RULE_TOL))


def _f16_param(g, name: str, rows: int, cols: int, transposed: bool = False) -> int:
    # a weight [rows, cols] stored f16: of a Parameter [rows, cols], or transposed of one [cols, rows] (exporters')
    p = g.parameter(name, [cols, rows] if transposed else [rows, cols])
    return g.add_node("Dequant", (g.add_node("ToF16", (p,), transposed=transposed),), format="f16", cols=cols)


def _gate_up_example(g, dim, transposed: bool = False) -> None:
    k, n = BLOCK * dim("kb", 1, 3), dim("n")
    h = g.input("h", [dim("m"), k])
    g.set_outputs([g.swiglu(*(g.matmul_bt(h, _f16_param(g, name, n, k, transposed)) for name in ("wg", "wu")))])


@rules("swiglu")
def _f16_gate_up_concat(e):
    (h,) = e.vars("h")
    ng, nu = e.vars("ng nu", e.String)
    sg, su = e.vars("sg su", e.Vec[e.i64])
    (c,) = e.vars("c", e.i64)
    pg, pu = e.Parameter(ng, sg), e.Parameter(nu, su)
    f16 = e.String("f16")
    # SwiGLU(h@Dequant(ToF16(Pg))^T, h@Dequant(ToF16(Pu))^T) -> SwiGLUConcat(h@Dequant(ToF16(Pg,Pu))^T)
    # (rounding is per element, so the rows of both weights' halves stacked: quant.py's twin, for f16; of weights
    # [N, K] or, transposed, [K, N]: ToF16(Pg, Pu, transposed) stacks Pg^T and Pu^T)
    for transposed in (False, True):
        t = e.Bool(transposed)
        gate, up = (e.MatMulBT(h, e.Dequant(e.ToF16(p, transposed=t), format=f16, cols=c)) for p in (pg, pu))
        yield e.equal("SwiGLU(h@Dequant(ToF16(Pg))^T, h@Dequant(ToF16(Pu))^T) -> "
                      f"SwiGLUConcat(h@Dequant(ToF16(Pg,Pu))^T){_twin_label(transposed)}", e.SwiGLU(gate, up),
                      e.SwiGLUConcat(e.MatMulBT(h, e.Dequant(e.ToF16(pg, pu, transposed=t), format=f16, cols=c))),
                      example=example(lambda g, dim, t=transposed: _gate_up_example(g, dim, t)))


def _qkv_example(g, dim, transposed: bool = False, masked: bool = False) -> None:
    nh, nkv, hd, batch = 2, 1, 32, 2 if masked else 1
    s = dim("s")
    h = g.input("h", [batch * s, 64])
    mask = dict(key_mask=g.input("key_mask", [batch, s])) if masked else {}
    q, k, v = (g.matmul_bt(h, _f16_param(g, f"w{t}", heads * hd, 64, transposed))
               for t, heads in (("q", nh), ("k", nkv), ("v", nkv)))
    g.set_outputs([g.causal_attention_rope(q, k, v, nh, nkv, hd, 100.0, batch=batch, **mask)])


def _f16_qkv_weights(e, transposed: bool = False):
    # ([(Dequant(ToF16(W)), output columns of h@W)] for W = Wq, Wk, Wv, and Dequant(ToF16(Wq, Wk, Wv))): the
    # projection weights stored f16 and their rows stacked, for the packing rules' f16 twins; transposed: the
    # weights [K, N] (exporters'), ToF16(Wq, Wk, Wv, transposed) stacking their transposes
    names = e.vars("nq nk nv", e.String)
    shapes = e.vars("sq sk sv", e.Vec[e.i64])  # one shape variable per weight, as attention.py's rules
    (c,) = e.vars("c", e.i64)
    w = [e.Parameter(n, s) for n, s in zip(names, shapes, strict=True)]
    f16, t = e.String("f16"), e.Bool(transposed)
    return ([(e.Dequant(e.ToF16(wi, transposed=t), format=f16, cols=c), s[1 if transposed else 0])
             for wi, s in zip(w, shapes, strict=True)], e.Dequant(e.ToF16(*w, transposed=t), format=f16, cols=c))


def _twin_label(transposed: bool) -> str:
    return " (W [K,N], transposed)" if transposed else ""


@rules("attention")
def _f16_packed_qkv(e):
    (h, m) = e.vars("h m")
    # CausalAttentionRoPE(h@Dequant(ToF16(W))^T, W=Wq,Wk,Wv[, m]) -> CausalAttentionRoPE(P[, m]),
    # P = h@Dequant(ToF16(Wq,Wk,Wv))^T, each projection the SliceCols of P (quant.py's twin, for f16), of weights
    # [N, K] or, transposed, [K, N] (an export's, with or without its key mask)
    for transposed in (False, True):
        for masked in (False, True):
            weights, packed = _f16_qkv_weights(e, transposed)
            label = ", m" if masked else ""
            yield packed_qkv_rule(
                e, [(e.MatMulBT(h, w), cols) for w, cols in weights], e.MatMulBT(h, packed),
                name=f"CausalAttentionRoPE(h@Dequant(ToF16(W))^T, W=Wq,Wk,Wv{label}) -> "
                     f"CausalAttentionRoPE(h@Dequant(ToF16(Wq,Wk,Wv))^T{label}){_twin_label(transposed)}",
                example_fn=lambda g, dim, t=transposed, m=masked: _qkv_example(g, dim, t, m),
                mask=m if masked else None)


@rules("attention")
def _f16_packed_qkv_bias(e):
    # attention.py's encoder packing for weights stored f16: FullAttention(h@Dequant(ToF16(W))^T + b, W=Wq,Wk,Wv,
    # mask?) -> FullAttentionPacked(h@Dequant(ToF16(Wq,Wk,Wv))^T + Concat(bq,bk,bv), mask?), of weights [N, K] or,
    # transposed, [K, N]
    for transposed in (False, True):
        yield from packed_encoder_qkv_rules(
            e, *_f16_qkv_weights(e, transposed),
            name="FullAttention(h@Dequant(ToF16(W))^T+b, W=Wq,Wk,Wv) -> "
                 f"FullAttentionPacked(h@Dequant(ToF16(Wq,Wk,Wv))^T + Concat(bq,bk,bv)){_twin_label(transposed)}",
            example_fn=lambda g, dim, masked, t=transposed: bert_attention(
                g, dim, masked=masked, width_multiple=BLOCK,
                weight=lambda g, name, rows, cols: _f16_param(g, name, rows, cols, t)))


@rules("attention")
def _f16_packed_qkv_decode(e):
    weights, packed = _f16_qkv_weights(e)
    # kv_cache.py's decode packing for weights stored f16: h@Dequant(ToF16(Wq))^T, ... -> SliceCols of
    # h@Dequant(ToF16(Wq,Wk,Wv))^T (rounding is per element, so the stacked rows' halves)
    yield packed_decode_rule(
        e, tuple(weights), packed,
        name="decode: h@Dequant(ToF16(Wq))^T, h@Dequant(ToF16(Wk))^T, h@Dequant(ToF16(Wv))^T -> SliceCols of "
             "h@Dequant(ToF16(Wq,Wk,Wv))^T",
        example_fn=lambda g, dim: decode_step(g, dim, lambda g, h, name, rows, cols: g.matmul_bt(
            h, _f16_param(g, name, rows, cols))))
