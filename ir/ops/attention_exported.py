"""Scaled dot-product attention as exporters spell it, recognised into the attention ops.

torch.onnx.export (either exporter) and transformers write attention as primitives on
[batch, heads, seq, head_dim] tensors (after the ONNX import):

    scores = BatchMatMul(Mul(q, c), Mul(k^T, c))       c = d^-1/4, or Mul / Div of the product
    scores = Add(scores, mask)                          additive, often Where(bool, 0, -inf)
    p      = Softmax(scores)
    p      = Where(IsNaN(p), 0, p)                      SDPA's guard of fully masked rows
    out    = BatchMatMul(p, v)

with k^T a Permute (or a Reshape-Permute-Reshape) of k, and k, v repeated over the query
heads of a GQA group by Reshape(Expand(Reshape(kv))) (transformers' ``repeat_kv``). The rules
here rebuild it in steps, each an equality of the IR's reference semantics:

1. the product of q and k^T is ``AttentionScores`` (mode 0, ONNX's qk_matmul_output), and
   every scalar constant multiplying q, k or the scores folds into its ``scale`` (one on k^T
   leaves the product first: ``BatchMatMul(a, Mul(b, c))`` is ``Mul(BatchMatMul(a, b), c)``);
2. a GQA repeat of k (and of k and v together) is dropped: the attention ops read kv head
   h // (H / KV) themselves;
3. an added mask makes mode 2; the softmax of mode 2 with SDPA's NaN guard, or without it
   where no row can be fully masked (a finite mask, a causal one), is mode 3;
4. mode 3 times v is ``GeneralAttention``; a causal mask constant becomes its ``causal``
   flag, a bool mask ``Where(b, 0, -inf)`` the bool mask ``b``, and ``And(c, b)`` of an
   all-true constant c the mask ``b``;
5. ``GeneralAttention`` on head-split views of [batch, seq, heads * head_dim] tensors runs on
   those tensors (its 3-D layout), which without mask or options is ``CausalAttention`` or
   ``FullAttention`` on [batch * seq, heads * head_dim] rows (``attention_layout.py``).

DeBERTa writes the products on merged heads, [B H, S, D] views of the 4-D heads, and adds its relative
position terms to the scores before masking them with ``Where(pairwise mask, float32 min, .)``: a product
of merged-head views is the view of the heads' product, the view of a sum of same-shaped operands the sum
of their views, and that ``Where`` under the softmax the ``Where`` of the added terms alone (the mask of
step 3).

Masks use the value facts of constants (``eggfuse.ir.facts``): ``value(c, v)`` for scalars and
``all_true(c)``, and ``causal_mask(m, offset)``, defined here. Fully masked rows: mode 3 and
GeneralAttention give zero rows, as SDPA's guard does; a softmax without the guard gives NaN
there, so it is only recognised where no row can be fully masked.
"""

from __future__ import annotations

import numpy as np

from ..facts import uniform_leading, value_fact
from ..spec import example, rules
from ..types import DType, TensorType

FAMILY = "attention_exported"

#: An additive mask entry at or below this is masked: its exp underflows to 0 against any score
#: below 1e29 in magnitude, in float32 and in float64 alike (transformers uses float32's min).
MASKED_BELOW = -1e30


# --- the causal-mask fact ----------------------------------------------------------------------


@value_fact("causal_mask", ("int",),
            doc="causal_mask(m, offset): over its last two axes [Sq, Skv] (every leading index holding the same "
                "slice), m allows key j of query row i exactly when j <= i + offset, offset >= 0 (so no row is fully "
                "masked): a bool mask true there, or an f32 additive mask 0 there and -inf or at most MASKED_BELOW "
                "elsewhere (transformers' and the exporters' causal masks, folded at load time)")
def _causal_mask(value: np.ndarray, ty: TensorType):
    if ty.rank < 2 or ty.dtype not in (DType.BOOL, DType.F32):
        return None
    m = uniform_leading(value, 2)
    if m is None:
        return None
    if ty.dtype is DType.BOOL:
        allowed = m.astype(bool)
    else:
        allowed = m == 0
        if not (allowed | (m <= MASKED_BELOW)).all():
            return None
    sq, skv = m.shape
    offset = int(allowed[0].sum()) - 1
    if offset < 0:
        return None
    i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
    return (offset,) if np.array_equal(allowed, j <= i + offset) else None


# --- finite: derived through the ops that only move or select elements -------------------------


@rules("analysis")
def _finite_facts(e):
    b, x, y = e.vars("b x y")
    s = e.var("s", e.Vec[e.i64])
    # finite(Where(b, x, y)) if finite(x) and finite(y); finite of a view, Expand or Permute of a finite x
    yield e.rule(e.Where(b, x, y), e.finite(x), e.finite(y), name="finite(Where(b, x, y))").then(
        e.finite(e.Where(b, x, y)))
    for label, term in (("Reshape", e.Identity(x, shape=s)), ("Expand", e.Expand(x, shape=s)),
                        ("Permute", e.Permute(x, perm=s))):
        yield e.rule(term, e.finite(x), name=f"finite({label}(x))").then(e.finite(term))


# --- the rules ---------------------------------------------------------------------------------

#: AttentionScores' and GeneralAttention's attributes besides scale (and mode).
_OPTIONS = ("num_heads", "kv_num_heads", "softcap", "causal", "offset", "left_window", "right_window", "masked_rows")


def _plain(e, scale) -> dict:
    """The attributes of a plain 4-D attention: ``scale``, heads from the layout, no options."""
    return dict(scale=scale, num_heads=e.i64(0), kv_num_heads=e.i64(0), softcap=e.f64(0.0), causal=e.Bool(False),
                offset=e.i64(0), left_window=e.i64(-1), right_window=e.i64(-1), masked_rows=e.String("zero"))


def _raw_options(e) -> dict:
    """:func:`_option_vars` with no softcap, causal flag, offset or window: scores whose mode 0 (the raw product)
    and modes 1-3 differ only by the mask and the softmax."""
    return {**_option_vars(e), "softcap": e.f64(0.0), "causal": e.Bool(False), "offset": e.i64(0),
            "left_window": e.i64(-1), "right_window": e.i64(-1)}


def _option_vars(e) -> dict:
    nh, nkv, off, lw, rw = e.vars("nh nkv off lw rw", e.i64)
    (cap,) = e.vars("cap", e.f64)
    (causal,) = e.vars("causal", e.Bool)
    (rows,) = e.vars("masked_rows", e.String)
    return dict(num_heads=nh, kv_num_heads=nkv, softcap=cap, causal=causal, offset=off, left_window=lw,
                right_window=rw, masked_rows=rows)


# --- example builders (soundness examples here and in attention_layout.py) -----------------------


def example_dims(dim, square: bool = False):
    """(b, h, kv, s, t, d) drawn by a soundness example's ``dim``: h = kv * group, t = s when ``square``."""
    b, kv, g = dim("b", 1, 2), dim("kv", 1, 2), dim("g", 1, 2)
    s = dim("s", 1, 5)
    return b, kv * g, kv, s, s if square else dim("t", 1, 5), dim("d", 1, 5)


def _qkv(g, dim, square: bool = False, gqa: bool = False):
    # q [b, h, s, d] and k, v [b, h or kv, t, d] as graph inputs
    b, h, kv, s, t, d = example_dims(dim, square)
    q = g.input("q", [b, h, s, d])
    heads = kv if gqa else h
    return q, g.input("k", [b, heads, t, d]), g.input("v", [b, heads, t, d]), (b, h, kv, s, t, d)


def scores_of(g, q, k, scale: float | None = None):
    """BatchMatMul(q, k^T), times the scalar constant ``scale`` when given."""
    s = g.add_node("BatchMatMul", (q, k), trans_b=True)
    return s if scale is None else g.mul(s, g.constant(np.array(scale), shape=()))


def bool_mask(g, shape):
    """A runtime bool mask (about half the keys masked, so fully masked rows occur)."""
    return g.add_node("Less", (g.input("m", shape), g.constant(np.array(0.0), shape=())))


def repeat_kv(g, x, group: int):
    """transformers' repeat_kv: [b, kv, t, d] -> [b, kv * group, t, d] through Reshape/Expand/Reshape."""
    b, kv, t, d = g.node(x).type.shape
    x5 = g.reshape(x, [b, kv, 1, t, d])
    return g.reshape(g.add_node("Expand", (x5,), shape=[b, kv, group, t, d]), [b, kv * group, t, d])


def safe_softmax(g, x):
    """SDPA's guarded softmax: Where(IsNaN(p), 0, p), p = Softmax(x)."""
    p = g.softmax(x)
    return g.add_node("Where", (g.add_node("IsNaN", (p,)), g.constant(np.array(0.0), shape=()), p))


@rules("attention")
def _scores_of_a_product(e):
    q, k = e.vars("q k")
    sq, sk = e.vars("sq sk", e.Vec[e.i64])
    # BatchMatMul(q, k, trans_b) -> AttentionScores(q, k, scale 1)   q [B,H,Sq,D], k [B,H,Skv,D]
    yield e.equal("BatchMatMul(q, k^T) -> AttentionScores(q, k)",
                  e.BatchMatMul(q, k, trans_a=e.Bool(False), trans_b=e.Bool(True)),
                  e.AttentionScores(q, k, **_plain(e, e.f64(1.0)), mode=e.i64(0)),
                  e.eq(e.shape(q)).to(sq), e.eq(e.shape(k)).to(sk), e.eq(sq.length()).to(e.i64(4)),
                  e.eq(sk.length()).to(e.i64(4)), e.eq(sq[0]).to(sk[0]), e.eq(sq[1]).to(sk[1]),
                  e.eq(sq[3]).to(sk[3]),
                  example=example(lambda g, dim: g.set_outputs([scores_of(g, *_qkv(g, dim)[:2])])))


def _scaled_operand_example(side: str, first: bool):
    def build(g, dim):
        q, k, _, _ = _qkv(g, dim)
        c = g.constant(np.array(0.59), shape=())
        x = q if side == "q" else k
        x = g.mul(c, x) if first else g.mul(x, c)
        g.set_outputs([scores_of(g, x, k) if side == "q" else scores_of(g, q, x)])

    return build


@rules("attention")
def _scale_into_scores(e):
    q, k, c, m, x = e.vars("q k c m x")
    s, v = e.vars("s v", e.f64)
    (mode,) = e.vars("mode", e.i64)
    opts = _option_vars(e)
    # AttentionScores(Mul(q, c), k, s) -> AttentionScores(q, k, s v)   (and Mul(c, q), and the same on k)
    # for a finite one-element constant c (value(c, v); an infinite scale stays a Mul) that keeps q's shape; any
    # mode (a mask is added to the scores only once they are scaled: the rule that adds it matches every form of the
    # scores)
    for side in ("q", "k"):
        for first in (False, True):
            scaled = e.Mul(c, x) if first else e.Mul(x, c)
            args = (scaled, k) if side == "q" else (q, scaled)
            new = (x, k) if side == "q" else (q, x)
            label = f"Mul({'c, ' if first else ''}{side}{'' if first else ', c'})"
            yield e.equal(f"AttentionScores({'q' if side == 'k' else label}, {label if side == 'k' else 'k'}, s) -> "
                          "AttentionScores(q, k, s v)",
                          e.AttentionScores(*args, scale=s, **opts, mode=mode),
                          e.AttentionScores(*new, scale=s * v, **opts, mode=mode),
                          e.value(c, v), e.finite(c), e.eq(e.shape(scaled)).to(e.shape(x)),
                          example=example(_scaled_operand_example(side, first)))
    # Mul(AttentionScores(q, k, s), c) -> AttentionScores(q, k, s v), Mul(c, .) and Div(., c): s / v   (mode 0)
    scores = e.AttentionScores(q, k, scale=s, **opts, mode=e.i64(0))
    for label, lhs, new_scale, ex in (
            ("Mul(AttentionScores(q, k, s), c)", e.Mul(scores, c), s * v, 0.35),
            ("Mul(c, AttentionScores(q, k, s))", e.Mul(c, scores), s * v, 0.35),
            ("Div(AttentionScores(q, k, s), c)", e.Div(scores, c), s / v, 2.83)):
        def build(g, dim, label=label, ex=ex):
            q, k, _, _ = _qkv(g, dim)
            c = g.constant(np.array(ex), shape=())
            op = "Div" if label.startswith("Div") else "Mul"
            sc = scores_of(g, q, k)
            g.set_outputs([g.add_node(op, (c, sc) if label.startswith("Mul(c") else (sc, c))])

        guards = (e.value(c, v), e.finite(c), e.eq(e.shape(lhs)).to(e.shape(scores)))
        if label.startswith("Div"):
            guards += (e.ne(v).to(e.f64(0.0)),)
        yield e.equal(f"{label} -> AttentionScores(q, k, {'s / v' if label.startswith('Div') else 's v'})", lhs,
                      e.AttentionScores(q, k, scale=new_scale, **opts, mode=e.i64(0)), *guards,
                      example=example(build))


def _scaled_factor_example(first: bool):
    def build(g, dim):
        # BatchMatMul(q, Mul(Permute(x, [0,2,3,1]), c)) of x [b, t, h, d]: the classic exporter's scaled k^T
        q, _, _, (b, h, kv, s, t, d) = _qkv(g, dim)
        kt = g.add_node("Permute", (g.input("x", [b, t, h, d]),), perm=[0, 2, 3, 1])
        c = g.constant(np.array(0.42), shape=())
        g.set_outputs([g.add_node("BatchMatMul", (q, g.mul(c, kt) if first else g.mul(kt, c)))])

    return build


@rules("attention")
def _scale_out_of_a_product(e):
    a, b, c = e.vars("a b c")
    (v,) = e.vars("v", e.f64)
    ta, tb = e.vars("ta tb", e.Bool)
    (sl,) = e.vars("sl", e.Vec[e.i64])
    # BatchMatMul(a, Mul(b, c)) -> Mul(BatchMatMul(a, b), c)   (and Mul(c, b)) for a one-element constant c
    # (value(c, v)) that keeps b's shape: the classic exporter's k^T = Mul(Permute(k, [0,2,3,1]), d^-1/4) leaves
    # the product, whose Permute the transpose flags take (linalg.py) and whose scale the scores take
    # (_scale_into_scores). The new product gets its shape fact, which those rules read. (Moving the scale into the
    # Permute instead, Mul(Permute(x), c) -> Permute(Mul(x, c)), gave every scaled head view a second form: MiniLM's
    # extraction took 3.5 to 11 s instead of 0.4 to 1.9 s, and the scaled k stayed a Mul of its own.)
    for first in (False, True):
        lhs = e.BatchMatMul(a, e.Mul(c, b) if first else e.Mul(b, c), trans_a=ta, trans_b=tb)
        product = e.BatchMatMul(a, b, trans_a=ta, trans_b=tb)
        yield e.rule(lhs, e.value(c, v), e.eq(e.shape(e.Mul(c, b) if first else e.Mul(b, c))).to(e.shape(b)),
                     e.eq(e.shape(lhs)).to(sl),
                     name=f"BatchMatMul(a, {'Mul(c, b)' if first else 'Mul(b, c)'}) -> Mul(BatchMatMul(a, b), c)",
                     example=example(_scaled_factor_example(first))).then(
            e.union(lhs).with_(e.Mul(product, c)), e.set_(e.shape(product)).to(sl))


def _merged_heads_example(scaled: str):
    def build(g, dim):
        # DeBERTa's exporters: q and k as [B H, S, D] views of their heads, k^T a Permute of that view, divided by the
        # scale: the product of [B H, S, D] and [B H, D, T]
        q, k, _, (b, h, kv, s, t, d) = _qkv(g, dim)
        kt = g.add_node("Permute", (g.reshape(k, [b * h, t, d]),), perm=[0, 2, 1])
        c = g.constant(np.array(2.83), shape=())
        if scaled == "Div":
            kt = g.add_node("Div", (kt, c))
        elif scaled:
            kt = g.mul(kt, c) if scaled == "Mul" else g.mul(c, kt)
        g.set_outputs([g.add_node("BatchMatMul", (g.reshape(q, [b * h, s, d]), kt))])

    return build


def _merged_probabilities_example(g, dim):
    # the probabilities [B, H, S, T] and v [B, H, T, D] as [B H, ...] views, multiplied (DeBERTa's exporters)
    _, _, v, (b, h, kv, s, t, d) = _qkv(g, dim)
    p = g.softmax(g.input("x", [b, h, s, t]))
    g.set_outputs([g.add_node("BatchMatMul", (g.reshape(p, [b * h, s, t]), g.reshape(v, [b * h, t, d])))])


@rules("attention")
def _merged_heads(e):
    a, b, c = e.vars("a b c")
    (v,) = e.vars("v", e.f64)
    sa, sb, sa3, sb3 = e.vars("sa sb sa3 sb3", e.Vec[e.i64])
    f = e.Bool(False)
    swap = e.Vec(e.i64(0), e.i64(2), e.i64(1))
    four = e.i64(4)
    heads = (e.eq(e.shape(a)).to(sa), e.eq(e.shape(b)).to(sb), e.eq(sa.length()).to(four),
             e.eq(sb.length()).to(four), e.eq(sa[0]).to(sb[0]), e.eq(sa[1]).to(sb[1]))
    merged_a = e.Identity(a, shape=sa3)
    merged_b = e.Identity(b, shape=sb3)
    # BatchMatMul(Reshape(a, [B H, S, D]), Permute(Reshape(b, [B H, T, D]), [0, 2, 1]) [/ c]) ->
    #   Reshape(BatchMatMul(a, b, trans_b) [/ c], [B H, S, T])   a [B, H, S, D], b [B, H, T, D]
    # (DeBERTa's scores, q times the scaled k^T of merged heads, as both exporters write them: as a product of
    # the 4-D heads, AttentionScores takes it). The [B H, ...] views keep the heads' element order, so the
    # product of each [S, D] and [D, T] pair is the same; the new product and its scaled form get shape facts.
    guards = (*heads, e.eq(sa3).to(e.Vec(sa[0] * sa[1], sa[2], sa[3])),
              e.eq(sb3).to(e.Vec(sb[0] * sb[1], sb[2], sb[3])), e.eq(sa[3]).to(sb[3]))
    kt = e.Permute(merged_b, perm=swap)
    product = e.BatchMatMul(a, b, trans_a=f, trans_b=e.Bool(True))
    out_shape = e.Vec(sa[0], sa[1], sa[2], sb[2])
    merged_out = e.Vec(sa[0] * sa[1], sa[2], sb[2])
    for scaled, rhs_of, operand in (("", lambda: product, kt), ("Div", lambda: e.Div(product, c), e.Div(kt, c)),
                                    ("Mul", lambda: e.Mul(product, c), e.Mul(kt, c)),
                                    ("Mul(c", lambda: e.Mul(c, product), e.Mul(c, kt))):
        lhs = e.BatchMatMul(merged_a, operand, trans_a=f, trans_b=f)
        rhs = rhs_of()
        scale = (e.value(c, v), e.eq(e.shape(operand)).to(e.shape(kt))) if scaled else ()
        if scaled == "Div":
            scale += (e.ne(v).to(e.f64(0.0)),)
        label = {"": "k^T", "Div": "Div(k^T, c)", "Mul": "Mul(k^T, c)", "Mul(c": "Mul(c, k^T)"}[scaled]
        actions = [e.union(lhs).with_(e.Identity(rhs, shape=merged_out)), e.set_(e.shape(product)).to(out_shape)]
        if scaled:
            actions.append(e.set_(e.shape(rhs)).to(out_shape))
        yield e.rule(lhs, *guards, *scale,
                     name=f"BatchMatMul(Reshape(q, [B H, S, D]), {label} of Reshape(k, [B H, T, D])) -> "
                          f"Reshape({'' if not scaled else 'Div(' if scaled == 'Div' else 'Mul('}"
                          f"BatchMatMul(q, k^T){', c)' if scaled else ''}, [B H, S, T])",
                     example=example(_merged_heads_example(scaled))).then(*actions)
    # BatchMatMul(Reshape(p, [B H, S, T]), Reshape(v, [B H, T, D])) -> Reshape(BatchMatMul(p, v), [B H, S, D])
    #   p [B, H, S, T], v [B, H, T, D] (DeBERTa's probabilities times v)
    lhs = e.BatchMatMul(merged_a, merged_b, trans_a=f, trans_b=f)
    product = e.BatchMatMul(a, b, trans_a=f, trans_b=f)
    yield e.rule(lhs, *heads, e.eq(sa3).to(e.Vec(sa[0] * sa[1], sa[2], sa[3])),
                 e.eq(sb3).to(e.Vec(sb[0] * sb[1], sb[2], sb[3])), e.eq(sa[3]).to(sb[2]),
                 name="BatchMatMul(Reshape(p, [B H, S, T]), Reshape(v, [B H, T, D])) -> "
                      "Reshape(BatchMatMul(p, v), [B H, S, D])",
                 example=example(_merged_probabilities_example)).then(
        e.union(lhs).with_(e.Identity(product, shape=e.Vec(sa[0] * sa[1], sa[2], sb[3]))),
        e.set_(e.shape(product)).to(e.Vec(sa[0], sa[1], sa[2], sb[3])))


def _merged_sum_example(first: bool):
    def build(g, dim):
        # DeBERTa: the scores of merged heads [B H, S, T] plus its relative position bias, viewed as [B, H, S, T]
        b, h, s, t = dim("b", 1, 3), dim("h", 1, 3), dim("s", 1, 5), dim("t", 1, 5)
        x3 = g.reshape(g.input("x", [b, h, s, t]), [b * h, s, t])
        y = g.input("y", [b * h, s, t])
        g.set_outputs([g.reshape(g.add(y, x3) if first else g.add(x3, y), [b, h, s, t])])

    return build


@rules("attention")
def _merged_sum(e):
    x, y = e.vars("x y")
    s3, s4 = e.vars("s3 s4", e.Vec[e.i64])
    # Reshape(Add(Reshape(x, s3), y), s4) -> Add(x, Reshape(y, s4))   (and Add(y, Reshape(x, s3))) where x has shape
    # s4 and y the sum's shape s3: the view of a sum of same-shaped operands is the sum of their views (DeBERTa's
    # scores of merged heads plus its position bias, viewed as [B, H, S, T], are the 4-D scores plus a 4-D bias,
    # which the mask rule reads)
    for first in (False, True):
        merged = e.Identity(x, shape=s3)
        inner = e.Add(y, merged) if first else e.Add(merged, y)
        lhs = e.Identity(inner, shape=s4)
        view = e.Identity(y, shape=s4)
        rhs = e.Add(view, x) if first else e.Add(x, view)
        yield e.rule(lhs, e.eq(e.shape(x)).to(s4), e.eq(e.shape(y)).to(s3), e.eq(e.shape(inner)).to(s3),
                     name=f"Reshape(Add({'y, Reshape(x, s3)' if first else 'Reshape(x, s3), y'}), s4) -> "
                          f"Add({'Reshape(y, s4), x' if first else 'x, Reshape(y, s4)'})   (x of shape s4)",
                     example=example(_merged_sum_example(first))).then(
            e.union(lhs).with_(rhs), e.set_(e.shape(view)).to(s4), e.set_(e.shape(rhs)).to(s4))


def _repeat_guards(e, rep, inner, x, s5, sx, sr):
    """Guards that ``rep`` = Reshape(Expand(Reshape(x, [B,KV,1,S,D]), [B,KV,G,S,D]), [B,KV G,S,D])."""
    return (e.eq(e.shape(x)).to(sx), e.eq(sx.length()).to(e.i64(4)), e.eq(s5).to(e.Vec(sx[0], sx[1], e.i64(1), sx[2],
                                                                                          sx[3])),
            e.eq(e.shape(inner)).to(e.Vec(sx[0], sx[1], sr[1] / sx[1], sx[2], sx[3])),
            e.eq(e.shape(rep)).to(sr), e.eq(sr[0]).to(sx[0]), e.eq(sr[2]).to(sx[2]), e.eq(sr[3]).to(sx[3]))


@rules("attention")
def _gqa(e):
    q, k, v, m, kx, vx = e.vars("q k v m kx vx")
    sk5, se, sr, sx, sv5, sve, svr, svx = e.vars("sk5 se sr sx sv5 sve svr svx", e.Vec[e.i64])
    (s,) = e.vars("s", e.f64)
    (mode,) = e.vars("mode", e.i64)
    opts = _option_vars(e)
    expand = e.Expand(e.Identity(kx, shape=sk5), shape=se)
    rep = e.Identity(expand, shape=sr)
    guards = _repeat_guards(e, rep, expand, kx, sk5, sx, sr)
    # AttentionScores(q, repeat_kv(k)) -> AttentionScores(q, k)   (query head h reads kv head h // group; the
    # masked forms follow from it, as the mask rules match every form of the scores)
    yield e.equal("AttentionScores(q, repeat_kv(k)) -> AttentionScores(q, k)",
                  e.AttentionScores(q, rep, scale=s, **opts, mode=mode),
                  e.AttentionScores(q, kx, scale=s, **opts, mode=mode), *guards, example=example(_gqa_scores_example))
    # GeneralAttention(q, repeat_kv(k), repeat_kv(v)) -> GeneralAttention(q, k, v)   (one group size)
    vexpand = e.Expand(e.Identity(vx, shape=sv5), shape=sve)
    vrep = e.Identity(vexpand, shape=svr)
    vguards = _repeat_guards(e, vrep, vexpand, vx, sv5, svx, svr)
    for masked in (False, True):
        extra = (m,) if masked else ()
        yield e.equal(f"GeneralAttention(q, repeat_kv(k), repeat_kv(v){', m' if masked else ''}) -> "
                      f"GeneralAttention(q, k, v{', m' if masked else ''})",
                      e.GeneralAttention(q, rep, vrep, *extra, scale=s, **opts, packed=e.Bool(False)),
                      e.GeneralAttention(q, kx, vx, *extra, scale=s, **opts, packed=e.Bool(False)), *guards, *vguards,
                      e.eq(sr[1]).to(svr[1]), e.eq(sx[1]).to(svx[1]),
                      example=example(lambda g, dim, masked=masked: _gqa_attention_example(g, dim, masked)))


def _gqa_scores_example(g, dim):
    q, k, v, (b, h, kv, s, t, d) = _qkv(g, dim, gqa=True)
    g.set_outputs([scores_of(g, q, repeat_kv(g, k, h // kv), 0.5)])


def _gqa_attention_example(g, dim, masked: bool):
    q, k, v, (b, h, kv, s, t, d) = _qkv(g, dim, gqa=True)
    sc = scores_of(g, q, repeat_kv(g, k, h // kv), 0.5)
    if masked:
        sc = g.add(sc, g.add_node("Where", (bool_mask(g, [b, 1, 1, t]), g.constant(np.array(0.0), shape=()),
                                            g.constant(np.array(-np.inf), shape=()))))
    g.set_outputs([g.add_node("BatchMatMul", (safe_softmax(g, sc), repeat_kv(g, v, h // kv)))])


def _masked_scores_example(first: bool, rank: int):
    def build(g, dim):
        q, k, _, (b, h, kv, s, t, d) = _qkv(g, dim)
        lead = [b, 1, s][3 - (rank - 1):] if rank > 1 else []
        mask = g.input("m", [*lead, t])
        sc = scores_of(g, q, k, 0.5)
        g.set_outputs([g.add(mask, sc) if first else g.add(sc, mask)])

    return build


@rules("attention")
def _mask_into_scores(e):
    q, k, m = e.vars("q k m")
    (s,) = e.vars("s", e.f64)
    sa, sm = e.vars("sa sm", e.Vec[e.i64])
    # raw scores without a softcap, causal flag or window: mode 0 applies none of them, mode 2 all
    opts = _raw_options(e)
    scores = e.AttentionScores(q, k, scale=s, **opts, mode=e.i64(0))
    # Add(AttentionScores(q, k), m) -> AttentionScores(q, k, m, mode 2)   (and Add(m, .)) for an f32 mask m
    # of rank <= 4 over all Skv keys that does not enlarge the scores (it broadcasts to them)
    for first, rank in ((False, 4), (True, 2)):
        lhs = e.Add(m, scores) if first else e.Add(scores, m)
        yield e.equal(f"{'Add(m, AttentionScores(q, k))' if first else 'Add(AttentionScores(q, k), m)'} -> "
                      "AttentionScores(q, k, m, mode 2)", lhs,
                      e.AttentionScores(q, k, m, scale=s, **opts, mode=e.i64(2)),
                      e.eq(e.shape(lhs)).to(sa), e.eq(e.shape(scores)).to(sa), e.eq(e.shape(m)).to(sm),
                      sm.length() <= e.i64(4), e.eq(sm[sm.length() - e.i64(1)]).to(sa[e.i64(3)]),
                      example=example(_masked_scores_example(first, rank)))
    # Add(Add(AttentionScores(q, k), m), m2) -> Add(AttentionScores(q, k), Add(m, m2))   (each Add in either operand
    # order) for masks m, m2 [4-D] that broadcast to the scores without enlarging them: the scores plus a relative
    # position bias, then plus a padding mask (MPNet), are the scores plus one mask, which the rule above makes
    # mode 2 (and a third mask joins the sum in turn). In the reference's float64 the two sums of f32 values are
    # equal, infinities and NaN included. The sum's shape is the larger of each axis (each is 1 or the scores').
    m2, sm2 = e.var("m2"), e.var("sm2", e.Vec[e.i64])
    summed = e.Add(m, m2)
    four = e.i64(4)
    for inner_first in (False, True):
        inner = e.Add(m, scores) if inner_first else e.Add(scores, m)
        for outer_first in (False, True):
            lhs = e.Add(m2, inner) if outer_first else e.Add(inner, m2)
            label = (f"Add({'m2, ' if outer_first else ''}Add({'m, S' if inner_first else 'S, m'})"
                     f"{'' if outer_first else ', m2'})")
            yield e.rule(lhs, e.eq(e.shape(lhs)).to(sa), e.eq(e.shape(inner)).to(sa), e.eq(e.shape(scores)).to(sa),
                         e.eq(e.shape(m)).to(sm), e.eq(e.shape(m2)).to(sm2), e.eq(sm.length()).to(four),
                         e.eq(sm2.length()).to(four),
                         name=f"{label} -> Add(S, Add(m, m2))   (S = AttentionScores(q, k))",
                         example=example(_second_mask_example(inner_first, outer_first))).then(
                e.union(lhs).with_(e.Add(scores, summed)),
                e.set_(e.shape(summed)).to(e.Vec(*(sm[e.i64(i)].max(sm2[e.i64(i)]) for i in range(4)))),
                e.set_(e.shape(e.Add(scores, summed))).to(sa))


def _second_mask_example(inner_first: bool, outer_first: bool):
    # scores plus a relative position bias [1, H, S, T] (an input: values unknown), then plus a padding mask
    # [B, 1, 1, T] of -inf and zeros, as MPNet adds them, and their softmax (the sum's mode 2, then mode 3)
    def build(g, dim):
        q, k, _, (b, h, kv, s, t, d) = _qkv(g, dim)
        sc, bias = scores_of(g, q, k, 0.5), g.input("bias", [1, h, s, t])
        biased = g.add(bias, sc) if inner_first else g.add(sc, bias)
        pad = g.add_node("Where", (bool_mask(g, [b, 1, 1, t]), g.constant(np.array(0.0), shape=()),
                                   g.constant(np.array(-np.inf), shape=())))
        g.set_outputs([g.softmax(g.add(pad, biased) if outer_first else g.add(biased, pad))])

    return build


def _softmax_example(kind: str):
    def build(g, dim):
        q, k, _, (b, h, kv, s, t, d) = _qkv(g, dim, square=kind == "causal")
        sc = scores_of(g, q, k, 0.5)
        if kind == "guard":
            m = g.add_node("Where", (bool_mask(g, [b, 1, s, t]), g.constant(np.array(0.0), shape=()),
                                     g.constant(np.array(-np.inf), shape=())))
            g.set_outputs([safe_softmax(g, g.add(sc, m))])
        elif kind == "finite":
            m = g.add_node("Where", (bool_mask(g, [b, 1, 1, t]), g.constant(np.array(0.0), shape=()),
                                     g.constant(np.array(np.finfo(np.float32).min), shape=())))
            g.set_outputs([g.softmax(g.add(sc, m))])
        elif kind == "causal":
            causal = np.where(np.tril(np.ones((s, s), dtype=bool)), 0.0, -np.inf)
            g.set_outputs([g.softmax(g.add(sc, g.constant(causal, shape=[1, 1, s, s])))])
        elif kind == "plain":
            g.set_outputs([g.softmax(sc)])
        elif kind == "unguarded":  # a bias of unknown values (an input), -inf where a random bool mask drops a key
            m = g.add_node("Where", (bool_mask(g, [b, 1, s, t]), g.input("bias", [1, h, s, t]),
                                     g.constant(np.array(-np.inf), shape=())))
            g.set_outputs([g.softmax(g.add(sc, m))])
        else:  # the guard after a softmax that needs none
            g.set_outputs([safe_softmax(g, sc)])

    return build


@rules("attention")
def _softmax_of_scores(e):
    q, k, m, z, p = e.vars("q k m z p")
    (s,) = e.vars("s", e.f64)
    (off,) = e.vars("off", e.i64)
    opts = _option_vars(e)
    probs = e.AttentionScores(q, k, m, scale=s, **opts, mode=e.i64(3))
    masked = e.Softmax(e.AttentionScores(q, k, m, scale=s, **opts, mode=e.i64(2)))
    # Where(IsNaN(Softmax(S)), 0, Softmax(S)) -> AttentionScores(q, k, m, mode 3)   S = AttentionScores(q, k, m, mode 2)
    # (SDPA's guard: a fully masked row, NaN after the softmax, is zero, as in mode 3)
    yield e.equal("Where(IsNaN(Softmax(S)), 0, Softmax(S)) -> AttentionScores(q, k, m, mode 3)",
                  e.Where(e.IsNaN(masked), z, masked), probs, e.value(z, e.f64(0.0)),
                  example=example(_softmax_example("guard")))
    # Softmax(AttentionScores(q, k, m, mode 2)) -> AttentionScores(q, k, m, mode 3)   if m is finite or causal
    # (no row is then fully masked, and the softmax of a row is mode 3's)
    # (no option may leave a row without a key either: no causal flag, no window)
    alone = {**opts, "causal": e.Bool(False), "offset": e.i64(0), "left_window": e.i64(-1), "right_window": e.i64(-1)}
    masked_alone = e.Softmax(e.AttentionScores(q, k, m, scale=s, **alone, mode=e.i64(2)))
    probs_alone = e.AttentionScores(q, k, m, scale=s, **alone, mode=e.i64(3))
    yield e.equal("Softmax(AttentionScores(q, k, m, mode 2)) -> AttentionScores(q, k, m, mode 3) (m finite)",
                  masked_alone, probs_alone, e.finite(m), example=example(_softmax_example("finite")))
    yield e.equal("Softmax(AttentionScores(q, k, m, mode 2)) -> AttentionScores(q, k, m, mode 3) (m causal)",
                  masked_alone, probs_alone, e.causal_mask(m, off), example=example(_softmax_example("causal")))
    # Softmax(AttentionScores(q, k, m, mode 2)) -> AttentionScores(q, k, m, mode 3; masked_rows nan)   for any m
    # (a mask of unknown values: a parameter, a computed bias): where every key of a row is masked, the softmax's
    # exp(-inf - -inf) makes the row NaN, as masked_rows nan does
    zero_rows = {**opts, "masked_rows": e.String("zero")}
    yield e.equal("Softmax(AttentionScores(q, k, m, mode 2)) -> AttentionScores(q, k, m, mode 3; masked_rows nan)",
                  e.Softmax(e.AttentionScores(q, k, m, scale=s, **zero_rows, mode=e.i64(2))),
                  e.AttentionScores(q, k, m, scale=s, **{**opts, "masked_rows": e.String("nan")}, mode=e.i64(3)),
                  example=example(_softmax_example("unguarded")))
    # Softmax(AttentionScores(q, k)) -> AttentionScores(q, k, mode 3)   (no mask; no softcap, causal flag or window,
    # which mode 0 does not apply and mode 3 does; no row is then empty, so mode 3 has no NaN)
    raw = _raw_options(e)
    plain = e.AttentionScores(q, k, scale=s, **raw, mode=e.i64(3))
    yield e.equal("Softmax(AttentionScores(q, k)) -> AttentionScores(q, k, mode 3)",
                  e.Softmax(e.AttentionScores(q, k, scale=s, **raw, mode=e.i64(0))), plain,
                  example=example(_softmax_example("plain")))
    # Where(IsNaN(p), 0, p) -> p   for p = AttentionScores(q, k, mode 3), which has no NaN
    yield e.equal("Where(IsNaN(p), 0, p) -> p (p = AttentionScores(q, k, mode 3))", e.Where(e.IsNaN(p), z, p), p,
                  e.eq(p).to(plain), e.value(z, e.f64(0.0)), example=example(_softmax_example("unneeded guard")))


def _where_into_scores_example(first: bool):
    def build(g, dim):
        # DeBERTa: scores plus a bias of unknown values (an input), then Where(b, float32 min, .) of a pairwise bool
        # mask [B, 1, S, T] (about half the pairs masked, so fully masked rows occur), then the softmax
        q, k, _, (b, h, kv, s, t, d) = _qkv(g, dim)
        bias, sc = g.input("bias", [b, h, s, t]), scores_of(g, q, k, 0.5)
        masked = g.add_node("Where", (bool_mask(g, [b, 1, s, t]), g.constant(np.array(np.finfo(np.float32).min),
                                                                              shape=()),
                                      g.add(bias, sc) if first else g.add(sc, bias)))
        g.set_outputs([g.softmax(masked)])

    return build


@rules("attention")
def _where_into_scores(e):
    q, k, m, b, c = e.vars("q k m b c")
    s, v = e.vars("s v", e.f64)
    sa, sb, sm = e.vars("sa sb sm", e.Vec[e.i64])
    four = e.i64(4)
    # raw scores (no softcap, causal flag, offset or window: a score replaced by c would undo the masking)
    scores = e.AttentionScores(q, k, scale=s, **_raw_options(e), mode=e.i64(0))
    mask = e.Where(b, c, m)
    # Softmax(Where(b, c, Add(S, m))) -> Softmax(Add(S, Where(b, c, m)))   (and Add(m, S)) for the scores S, a scalar
    # c <= MASKED_BELOW, and b, m [4-D] that broadcast to the scores without enlarging them, m over every key (an
    # f32 term added to them: DeBERTa's relative position bias under float32's min where its pairwise mask drops a
    # pair): where b holds, the score S + c of the right-hand side rounds to c itself for scores below half c's ulp
    # in magnitude (float64's: 7e13 at c = -1e30, 1.9e22 at float32's min; float32's: 3.8e22 and 1e31), and where a
    # row keeps keys, c's exp underflows to 0 against them on both sides, so the two softmaxes are equal (a row that
    # b masks wholly is uniform on both sides); the mask rule then makes the sum mode 2
    for first in (False, True):
        summed = e.Add(m, scores) if first else e.Add(scores, m)
        lhs = e.Softmax(e.Where(b, c, summed))
        new = e.Add(scores, mask)
        yield e.rule(lhs, e.value(c, v), v <= e.f64(MASKED_BELOW), e.eq(e.shape(scores)).to(sa),
                     e.eq(e.shape(summed)).to(sa), e.eq(e.shape(e.Where(b, c, summed))).to(sa),
                     e.eq(e.shape(b)).to(sb), e.eq(e.shape(m)).to(sm), e.eq(sb.length()).to(four),
                     e.eq(sm.length()).to(four), e.eq(sm[e.i64(3)]).to(sa[e.i64(3)]),
                     name=f"Softmax(Where(b, c, Add({'m, S' if first else 'S, m'}))) -> Softmax(Add(S, Where(b, c, m)))"
                          "   (S = AttentionScores(q, k), c <= MASKED_BELOW)",
                     example=example(_where_into_scores_example(first))).then(
            e.union(lhs).with_(e.Softmax(new)),
            e.set_(e.shape(mask)).to(e.Vec(*(sb[e.i64(i)].max(sm[e.i64(i)]) for i in range(4)))),
            e.set_(e.shape(new)).to(sa))


def _attention_example(masked: bool):
    def build(g, dim):
        q, k, v, (b, h, kv, s, t, d) = _qkv(g, dim)
        sc = scores_of(g, q, k, 0.5)
        if masked:
            sc = g.add(sc, g.add_node("Where", (bool_mask(g, [b, 1, s, t]), g.constant(np.array(0.0), shape=()),
                                                g.constant(np.array(-np.inf), shape=()))))
        g.set_outputs([g.add_node("BatchMatMul", (safe_softmax(g, sc), v))])

    return build


@rules("attention")
def _attention_of_probabilities(e):
    q, k, v, m = e.vars("q k v m")
    (s,) = e.vars("s", e.f64)
    sk, sv = e.vars("sk sv", e.Vec[e.i64])
    opts = _option_vars(e)
    # BatchMatMul(AttentionScores(q, k, m, mode 3), v) -> GeneralAttention(q, k, v, m)   v [B, KV, Skv, Dv]
    for masked in (False, True):
        extra = (m,) if masked else ()
        probs = e.AttentionScores(q, k, *extra, scale=s, **opts, mode=e.i64(3))
        yield e.equal(f"BatchMatMul(AttentionScores(q, k{', m' if masked else ''}, mode 3), v) -> "
                      f"GeneralAttention(q, k, v{', m' if masked else ''})",
                      e.BatchMatMul(probs, v, trans_a=e.Bool(False), trans_b=e.Bool(False)),
                      e.GeneralAttention(q, k, v, *extra, scale=s, **opts, packed=e.Bool(False)),
                      e.eq(e.shape(k)).to(sk), e.eq(e.shape(v)).to(sv), e.eq(sk.length()).to(e.i64(4)),
                      e.eq(sv.length()).to(e.i64(4)),
                      e.eq(sv[0]).to(sk[0]), e.eq(sv[1]).to(sk[1]), e.eq(sv[2]).to(sk[2]),
                      example=example(_attention_example(masked)))


def _causal_example(kind: str, op: str):
    def build(g, dim):
        q, k, v, (b, h, kv, s, t, d) = _qkv(g, dim, square=True)
        tril = np.tril(np.ones((s, s), dtype=bool))
        if kind == "additive":
            m = g.constant(np.where(tril, 0.0, np.finfo(np.float32).min), shape=[1, 1, s, s])
        else:
            if kind.startswith("true"):  # all true, [1, 1, S, 1] (the classic exporter's query index >= 0)
                c = g.constant(np.ones((1, 1, s, 1), dtype=bool), shape=[1, 1, s, 1], dtype=DType.BOOL)
            else:
                c = g.constant(tril, shape=[1, 1, s, s], dtype=DType.BOOL)
            pad = bool_mask(g, [b, 1, 1, s])
            m = g.add_node("Where", (g.add_node("And", (c, pad) if kind in ("and", "true") else (pad, c)),
                                     g.constant(np.array(0.0), shape=()), g.constant(np.array(-np.inf), shape=())))
        p = safe_softmax(g, g.add(scores_of(g, q, k, 0.5), m))
        g.set_outputs([p if op == "AttentionScores" else g.add_node("BatchMatMul", (p, v))])

    return build


@rules("attention")
def _masks_as_options(e):
    q, k, v, m, b, c, p, z, n = e.vars("q k v m b c p z n")
    (s,) = e.vars("s", e.f64)
    (mode, off) = e.vars("mode off", e.i64)
    sq, sk, sm, sb, sp = e.vars("sq sk sm sb sp", e.Vec[e.i64])
    nh, nkv, lw, rw = e.vars("nh nkv lw rw", e.i64)
    (cap,) = e.vars("cap", e.f64)
    opts = dict(num_heads=nh, kv_num_heads=nkv, softcap=cap, left_window=lw, right_window=rw,
                masked_rows=e.var("masked_rows", e.String))
    no_causal = dict(causal=e.Bool(False), offset=e.i64(0))

    def ops(*tensors, probs: bool = False, windowed: bool = True, **attrs):  # two ops a mask means the same for
        # (windowed False: no window, for the rules that move the offset the windows are measured from)
        o = opts if windowed else {**opts, "left_window": e.i64(-1), "right_window": e.i64(-1)}
        return (("AttentionScores", e.AttentionScores(q, k, *tensors, scale=s, **o, **attrs,
                                                      mode=e.i64(3) if probs else mode)),
                ("GeneralAttention", e.GeneralAttention(q, k, v, *tensors, scale=s, **o, **attrs,
                                                        packed=e.Bool(False))))

    rows = (e.eq(e.shape(q)).to(sq), e.eq(e.shape(k)).to(sk))

    def spans(mask, shape):  # the mask's last two axes are the [Sq, Skv] of q and k (no broadcast there)
        return (e.eq(e.shape(mask)).to(shape), e.eq(shape[shape.length() - e.i64(2)]).to(sq[sq.length() - e.i64(2)]),
                e.eq(shape[shape.length() - e.i64(1)]).to(sk[sk.length() - e.i64(2)]))

    # op(q, k, [v], m) -> op(q, k, [v], causal, offset)   if causal_mask(m, offset) over all [Sq, Skv]; of
    # AttentionScores only the probabilities (mode 3): an additive mask's finite masked entries stay finite in
    # mode 2, and the softmax alone makes them the zeros a causal flag gives
    # (without windows: they are measured from the offset, which the causal flag moves)
    for (name, lhs), (_, rhs) in zip(ops(m, probs=True, windowed=False, **no_causal),
                                     ops(probs=True, windowed=False, causal=e.Bool(True), offset=off), strict=True):
        yield e.equal(f"{name}(q, k{', v' if name[0] == 'G' else ''}, causal m) -> {name}(q, k"
                      f"{', v' if name[0] == 'G' else ''}, causal)", lhs, rhs, e.causal_mask(m, off), *rows,
                      *spans(m, sm), example=example(_causal_example("additive", name)))
    # op(q, k, [v], And(c, b)) -> op(q, k, [v], b, causal)   for a bool b over all keys and a causal c (either order)
    for first in (False, True):
        both = e.And(b, c) if first else e.And(c, b)
        for (name, lhs), (_, rhs) in zip(ops(both, windowed=False, **no_causal),
                                         ops(b, windowed=False, causal=e.Bool(True), offset=off), strict=True):
            yield e.equal(f"{name}(q, k{', v' if name[0] == 'G' else ''}, {'And(b, c)' if first else 'And(c, b)'}) "
                          f"-> {name}(q, k{', v' if name[0] == 'G' else ''}, b, causal)", lhs, rhs,
                          e.causal_mask(c, off), *rows, *spans(c, sm), e.eq(e.shape(b)).to(sb),
                          sb.length() <= e.i64(4), e.eq(sb[sb.length() - e.i64(1)]).to(sk[sk.length() - e.i64(2)]),
                          example=example(_causal_example("and_first" if first else "and", name)))
    causal_opts = dict(causal=e.var("cz", e.Bool), offset=e.var("oz", e.i64))
    # op(q, k, [v], And(c, b)) -> op(q, k, [v], b)   for an all-true constant c (all_true(c)), either order, any
    # options, if b has the And's last axis (the keys: the attention broadcasts the leading axes, but would read a
    # shorter mask as keys left out). The classic exporter's encoder mask is And(kv_idx >= 0 folded, padding).
    for first in (False, True):
        both = e.And(b, c) if first else e.And(c, b)
        for (name, lhs), (_, rhs) in zip(ops(both, **causal_opts), ops(b, **causal_opts), strict=True):
            yield e.equal(f"{name}(q, k{', v' if name[0] == 'G' else ''}, {'And(b, c)' if first else 'And(c, b)'}) "
                          f"-> {name}(q, k{', v' if name[0] == 'G' else ''}, b)   (c all true)", lhs, rhs,
                          e.all_true(c), e.eq(e.shape(both)).to(sm), e.eq(e.shape(b)).to(sb),
                          e.eq(sb[sb.length() - e.i64(1)]).to(sm[sm.length() - e.i64(1)]),
                          example=example(_causal_example("true_first" if first else "true", name)))
    # op(q, k, [v], Where(b, 0, -inf)) -> op(q, k, [v], b)   (an additive -inf mask is the bool mask; any options)
    where = e.Where(b, z, n)
    for (name, lhs), (_, rhs) in zip(ops(where, **causal_opts), ops(b, **causal_opts), strict=True):
        yield e.equal(f"{name}(q, k{', v' if name[0] == 'G' else ''}, Where(b, 0, -inf)) -> {name}(q, k"
                      f"{', v' if name[0] == 'G' else ''}, b)", lhs, rhs, e.value(z, e.f64(0.0)),
                      e.value(n, e.f64(-np.inf)), e.eq(e.shape(where)).to(e.shape(b)),
                      example=example(_causal_example("and", name)))


def _all_keys_example(op: str):
    # a mask allowing every key (an exporter's additive mask of zeros, [1, 1, S, T]): causal_mask reads it as causal
    # with offset T - 1, which the rule below drops
    def build(g, dim):
        q, k, v, (b, h, kv, s, t, d) = _qkv(g, dim)
        m = g.constant(np.zeros((1, 1, s, t)), shape=[1, 1, s, t])
        p = g.softmax(g.add(scores_of(g, q, k, 0.5), m))
        g.set_outputs([p if op == "AttentionScores" else g.add_node("BatchMatMul", (p, v))])

    return build


@rules("attention")
def _causal_over_every_key(e):
    q, k, v = e.vars("q k v")
    (s, cap) = e.vars("s cap", e.f64)
    nh, nkv, off, mode = e.vars("nh nkv off mode", e.i64)
    sk = e.var("sk", e.Vec[e.i64])
    opts = dict(scale=s, num_heads=nh, kv_num_heads=nkv, softcap=cap, left_window=e.i64(-1), right_window=e.i64(-1),
                masked_rows=e.var("masked_rows", e.String))
    keys = sk[sk.length() - e.i64(2)]  # Skv: k is [B, heads, Skv, D] or [B, Skv, heads D]
    # op(q, k, [v]; causal, offset) -> op(q, k, [v])   if offset >= Skv - 1, no window and no kv lengths: row i
    # allows key j <= i + offset, every key of every row (an all-allowed mask, which causal_mask reads as causal
    # with offset Skv - 1: ViT's export)
    for op in ("AttentionScores", "GeneralAttention"):
        tensors = (q, k) if op == "AttentionScores" else (q, k, v)
        extra = dict(mode=mode) if op == "AttentionScores" else dict(packed=e.Bool(False))
        lhs = getattr(e, op)(*tensors, **opts, causal=e.Bool(True), offset=off, **extra)
        rhs = getattr(e, op)(*tensors, **opts, causal=e.Bool(False), offset=e.i64(0), **extra)
        yield e.equal(f"{op}(q, k{', v' if op[0] == 'G' else ''}; causal, offset >= Skv - 1) -> "
                      f"{op}(q, k{', v' if op[0] == 'G' else ''})", lhs, rhs, e.eq(e.shape(k)).to(sk),
                      off >= keys - e.i64(1), example=example(_all_keys_example(op)))
