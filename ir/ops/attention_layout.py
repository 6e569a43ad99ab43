"""GeneralAttention on head-split views, and the fused attention ops it becomes.

Exporters split heads as ``Permute(Reshape(x, [B, S, H, D]), [0, 2, 1, 3])`` of a projection's
[B, S, H * D] (or [B * S, H * D]) rows and merge them back after the attention the same way.
``GeneralAttention``'s 3-D layout reads those rows directly, and without a mask, softcap or
window, with scale 1/sqrt(D) (within :data:`DEFAULT_SCALE_RTOL`), as many queries as keys and
one head size, it is ``CausalAttention`` or ``FullAttention`` on [B * S, H * D] rows: the ops
the RoPE and packed-projection rules of ``attention.py`` continue from. With a per-key mask
[B, 1, 1, Skv] (an encoder's padding) and no causal flag it is ``FullAttention`` with that mask
as its key mask: a bool mask with ``masked_rows`` ``zero`` (a sequence without a kept key gives
zeros, ONNX's rule), an additive ``Where(b, 0, c)`` of a finite c <= MASK_SENTINEL (float32's
min) with ``masked_rows`` ``mean`` (every score of such a row rounds to c: a uniform softmax).
A decoder's padding with causal rows is ``CausalAttention`` with the key mask: the bool mask with
the causal flag (``zero``), and ``Where(And(causal constant, b), 0, c)`` (``mean``: a row keeping
no key averages v over all the sequence's keys, those past its diagonal too, as CausalAttention's
``mean`` does). The casts an exporter puts between its int64 (i32) or bool padding mask and the f32
key mask leave the attention's input (``_key_mask_without_casts``): the attention ops read an i32
or bool key mask as ``Cast(mask, bool)`` reads it.
"""

from __future__ import annotations

import numpy as np

from ..spec import example, rules
from ..types import DType
from .attention_exported import bool_mask, example_dims, repeat_kv, safe_softmax, scores_of

FAMILY = "attention_layout"

#: Relative tolerance of "the scale is 1/sqrt(head_dim)" when the fused attention ops (which
#: apply exactly that scale) replace GeneralAttention: an exporter's d^-1/4 applied to q and k
#: separately is rounded to float32 (2^-24 relative), and so is its square.
DEFAULT_SCALE_RTOL = 1e-6


_HEADS = (0, 2, 1, 3)  # [B, S, H, D] <-> [B, H, S, D]


def _split_heads_example(masked: bool):
    def build(g, dim):
        b, h, kv, s, t, d = example_dims(dim)
        views = []
        for name, rows, heads in (("q", s, h), ("k", t, kv), ("v", t, kv)):
            x = g.input(name, [b, rows, heads * d])
            views.append(g.add_node("Permute", (g.reshape(x, [b, rows, heads, d]),), perm=_HEADS))
        sc = scores_of(g, views[0], repeat_kv(g, views[1], h // kv), 0.5)
        if masked:
            sc = g.add(sc, g.add_node("Where", (bool_mask(g, [b, 1, 1, t]), g.constant(np.array(0.0), shape=()),
                                                g.constant(np.array(-np.inf), shape=()))))
        out = g.add_node("BatchMatMul", (safe_softmax(g, sc), repeat_kv(g, views[2], h // kv)))
        g.set_outputs([g.reshape(g.add_node("Permute", (out,), perm=_HEADS), [b, s, h * d])])

    return build


@rules("attention")
def _attention_on_rows(e):
    qx, kx, vx, m = e.vars("qx kx vx m")
    sq, sk, sv, so = e.vars("sq sk sv so", e.Vec[e.i64])
    (s, cap) = e.vars("s cap", e.f64)
    (off, lw, rw) = e.vars("off lw rw", e.i64)
    (causal,) = e.vars("causal", e.Bool)
    heads = e.Vec(*(e.i64(i) for i in _HEADS))
    rest = dict(softcap=cap, causal=causal, offset=off, left_window=lw, right_window=rw,
                masked_rows=e.var("masked_rows", e.String))
    flat = {x: e.Identity(x, shape=e.Vec(sx[0], sx[1], sx[2] * sx[3])) for x, sx in ((qx, sq), (kx, sk), (vx, sv))}
    # GeneralAttention(Permute(q, [0,2,1,3]), Permute(k, .), Permute(v, .)) with q [B,S,H,D], k and v [B,T,KV,D]
    #   -> Permute(Reshape(GeneralAttention(Reshape(q, [B,S,H D]), ...; num_heads H, kv_num_heads KV),
    #      [B,S,H,Dv]), [0,2,1,3])   (the 3-D layout reads the rows as they are; the Permute back
    #      cancels against the exporter's Permute of the output)
    for masked in (False, True):
        extra = (m,) if masked else ()
        lhs = e.GeneralAttention(e.Permute(qx, perm=heads), e.Permute(kx, perm=heads), e.Permute(vx, perm=heads),
                                 *extra, scale=s, num_heads=e.i64(0), kv_num_heads=e.i64(0), **rest,
                                 packed=e.Bool(False))
        rows = e.GeneralAttention(flat[qx], flat[kx], flat[vx], *extra, scale=s, num_heads=sq[2], kv_num_heads=sk[2],
                                  **rest, packed=e.Bool(False))
        split = e.Identity(rows, shape=e.Vec(sq[0], sq[1], sq[2], sv[3]))
        yield e.rule(lhs, e.eq(e.shape(qx)).to(sq), e.eq(e.shape(kx)).to(sk), e.eq(e.shape(vx)).to(sv),
                     e.eq(sq.length()).to(e.i64(4)), e.eq(sk.length()).to(e.i64(4)), e.eq(sv.length()).to(e.i64(4)),
                     name=f"GeneralAttention(Permute(q), Permute(k), Permute(v){', m' if masked else ''}) -> "
                          f"Permute(Reshape(GeneralAttention(q rows, k rows, v rows{', m' if masked else ''})))",
                     example=example(_split_heads_example(masked))).then(
            e.union(lhs).with_(e.Permute(split, perm=heads)),
            *(e.set_(e.shape(t)).to(e.Vec(sx[0], sx[1], sx[2] * sx[3])) for t, sx in
              ((flat[qx], sq), (flat[kx], sk), (flat[vx], sv))),
            e.set_(e.shape(rows)).to(e.Vec(sq[0], sq[1], sq[2] * sv[3])),
            e.set_(e.shape(split)).to(e.Vec(sq[0], sq[1], sq[2], sv[3])))


def _fused_example(causal: bool):
    def build(g, dim):
        b, h, kv, s, _, d = example_dims(dim, square=True)
        q, k, v = (g.input(n, [b, s, w * d]) for n, w in (("q", h), ("k", kv), ("v", kv)))
        g.set_outputs([g.add_node("GeneralAttention", (q, k, v), scale=1 / np.sqrt(d), num_heads=h, kv_num_heads=kv,
                                  causal=causal)])

    return build


def _fused_guards(e, q, k, v, sq, sk, sv, s, nh):
    """Guards that GeneralAttention(q, k, v; scale s, num_heads nh) on 3-D rows is what the fused
    attention ops compute: as many queries as keys, v's head size q's, head_dim at most the kernels'
    maximum, and s 1/sqrt(head_dim) within :data:`DEFAULT_SCALE_RTOL`."""
    from .attention import MAX_ATTENTION_HEAD_DIM

    hd = sq[2] / nh
    root = s * e.f64.from_i64(hd).sqrt()  # 1 when the scale is 1/sqrt(head_dim)
    return (e.eq(e.shape(q)).to(sq), e.eq(e.shape(k)).to(sk), e.eq(e.shape(v)).to(sv),
            e.eq(sq.length()).to(e.i64(3)), e.eq(sk[1]).to(sq[1]), e.eq(sv[2]).to(sk[2]),
            hd <= e.i64(MAX_ATTENTION_HEAD_DIM), root < e.f64(1 + DEFAULT_SCALE_RTOL),
            root > e.f64(1 - DEFAULT_SCALE_RTOL))


def _rows_of(e, q, k, v, sq, sk, sv):
    """q, k, v [B, S, width] as [B S, width] rows: their Reshape terms, and the actions that give the
    new terms their shapes (the fused ops' inputs)."""
    rows = {x: e.Identity(x, shape=e.Vec(sx[0] * sx[1], sx[2])) for x, sx in ((q, sq), (k, sk), (v, sv))}
    return rows, [e.set_(e.shape(rows[x])).to(e.Vec(sx[0] * sx[1], sx[2])) for x, sx in ((q, sq), (k, sk), (v, sv))]


@rules("attention")
def _fused_attention(e):
    q, k, v = e.vars("q k v")
    sq, sk, sv = e.vars("sq sk sv", e.Vec[e.i64])
    (s,) = e.vars("s", e.f64)
    nh, nkv = e.vars("nh nkv", e.i64)
    hd = sq[2] / nh
    guards = _fused_guards(e, q, k, v, sq, sk, sv, s, nh)
    rows, row_shapes = _rows_of(e, q, k, v, sq, sk, sv)
    # GeneralAttention(q, k, v; 3-D, scale 1/sqrt(D), causal or not, nothing else) -> Reshape(
    #   CausalAttention / FullAttention(Reshape(q, [B S, H D]), ..., batch B), [B, S, H D])
    #   if Sq = Skv and v's head size is q's (the fused ops' conditions, as the ONNX Attention import's)
    for causal, op in ((True, "CausalAttention"), (False, "FullAttention")):
        # (masked_rows either: without a mask, as many queries as keys and offset 0, every row allows a key)
        lhs = e.GeneralAttention(q, k, v, scale=s, num_heads=nh, kv_num_heads=nkv, softcap=e.f64(0.0),
                                 causal=e.Bool(causal), offset=e.i64(0), left_window=e.i64(-1), right_window=e.i64(-1),
                                 masked_rows=e.var("masked_rows", e.String), packed=e.Bool(False))
        fused = getattr(e, op)(rows[q], rows[k], rows[v], num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=sq[0],
                               masked_rows=e.String("mean"))
        yield e.rule(lhs, *guards, name=f"GeneralAttention(q, k, v{', causal' if causal else ''}) -> "
                                        f"Reshape({op}(q, k, v rows))",
                     example=example(_fused_example(causal))).then(
            e.union(lhs).with_(e.Identity(fused, shape=sq)), *row_shapes,
            e.set_(e.shape(fused)).to(e.Vec(sq[0] * sq[1], sq[2])))


def _key_mask_example(kind: str, causal: bool = False):
    # a padding mask [B, 1, 1, S] of an input (with s <= 5 keys, some rows keep none): "bool" as it is (with the
    # causal flag when causal), else Where(., 0, float32 min) of it ("additive"), or of its And with a constant
    # ("and": constant first, "and_last"): the dynamo exporter's all-true [1, 1, S, 1], or when causal its
    # lower-triangular [1, 1, S, S]
    def build(g, dim):
        b, h, kv, s, _, d = example_dims(dim, square=True)
        q, k, v = (g.input(n, [b, s, w * d]) for n, w in (("q", h), ("k", kv), ("v", kv)))
        mask = bool_mask(g, [b, 1, 1, s])
        if kind != "bool":
            if kind != "additive":
                part = (np.tril(np.ones((s, s), dtype=bool))[None, None] if causal else
                        np.ones((1, 1, s, 1), dtype=bool))
                c = g.constant(part, shape=list(part.shape), dtype=DType.BOOL)
                mask = g.add_node("And", (c, mask) if kind == "and" else (mask, c))
            mask = g.add_node("Where", (mask, g.constant(np.array(0.0), shape=()),
                                        g.constant(np.array(np.finfo(np.float32).min), shape=())))
        g.set_outputs([g.add_node("GeneralAttention", (q, k, v, mask), scale=1 / np.sqrt(d), num_heads=h,
                                  kv_num_heads=kv, causal=causal and kind == "bool")])

    return build


@rules("attention")
def _key_masked_fused_attention(e):
    from .attention import MASK_SENTINEL

    q, k, v, b, c, z, n = e.vars("q k v b c z n")
    sq, sk, sv, sc = e.vars("sq sk sv sc", e.Vec[e.i64])
    (s, nv) = e.vars("s nv", e.f64)
    nh, nkv = e.vars("nh nkv", e.i64)
    rows, row_shapes = _rows_of(e, q, k, v, sq, sk, sv)
    key_shape = e.Vec(sq[0], e.i64(1), e.i64(1), sk[1])  # [B, 1, 1, Skv]: one flag per sequence and key
    cast = e.Cast(b, to=e.String("f32"))  # cast, then viewed: the cast may join the casts that made b
    key_mask = e.Identity(cast, shape=e.Vec(sq[0], sk[1]))
    # masked_rows zero: a row keeping no key is zero (bool masks) or uniform (the finite ones), never NaN
    opts = dict(softcap=e.f64(0.0), offset=e.i64(0), left_window=e.i64(-1), right_window=e.i64(-1),
                masked_rows=e.String("zero"), packed=e.Bool(False))
    collapses = (e.value(z, e.f64(0.0)), e.value(n, nv), nv <= e.f64(MASK_SENTINEL), nv > e.f64(-np.inf))
    # the causal constant c spans [Sq, Skv] (its leading axes broadcast: causal_mask says they hold one slice)
    tril = (e.causal_mask(c, e.i64(0)), e.eq(e.shape(c)).to(sc), e.eq(sc[sc.length() - e.i64(2)]).to(sq[1]),
            e.eq(sc[sc.length() - e.i64(1)]).to(sk[1]))
    full, causal = e.Bool(False), e.Bool(True)
    # GeneralAttention(q, k, v, m; 3-D, scale 1/sqrt(D), no other options) -> Reshape(op(q, k, v rows,
    #   Reshape(Cast(b, f32), [B, Skv]); masked_rows), [B, S, H D])   for a per-key mask b of [B, 1, 1, Skv]:
    # FullAttention, without the causal flag:
    # 1. m = b, bool: a query row whose sequence keeps no key has no allowed key, and ONNX's rule (SDPA's NaN
    #    guard, from which the attention rules made the bool mask) makes it zero: masked_rows "zero";
    # 2. m = Where(b, 0, c), c finite and <= MASK_SENTINEL (an exporter's finfo.min): the masked keys' weights
    #    are exp(score + c - max) = 0 as with the sentinel, and where b keeps no key every score + c rounds
    #    to c (for scores below 2^75 in magnitude), so the softmax is uniform: the mean of v, masked_rows "mean";
    # 3. m = Where(And(t, b), 0, c), t an all-true constant (the dynamo exporter's [1, 1, S, 1]): as 2.
    # CausalAttention, a decoder's padding with causal rows:
    # 4. m = b with the causal flag (the classic exporter's, after the rules of attention_exported.py): a row
    #    without an allowed key (the padding drops every key up to its own) is zero, ONNX's rule: "zero";
    # 5. m = Where(And(c, b), 0, nv) (either order), c a causal constant (offset 0): as 2, a row keeping no key
    #    has every score + nv rounded to nv, the keys past its diagonal too, so its softmax is uniform over all
    #    Skv keys: CausalAttention's "mean"
    forms = (("b", b, full, (e.is_bool(b),), "zero", "FullAttention", _key_mask_example("bool")),
             ("Where(b, 0, c)", e.Where(b, z, n), full, collapses, "mean", "FullAttention",
              _key_mask_example("additive")),
             ("Where(And(t, b), 0, c)", e.Where(e.And(c, b), z, n), full, (*collapses, e.all_true(c)), "mean",
              "FullAttention", _key_mask_example("and")),
             ("Where(And(b, t), 0, c)", e.Where(e.And(b, c), z, n), full, (*collapses, e.all_true(c)), "mean",
              "FullAttention", _key_mask_example("and_last")),
             ("b, causal", b, causal, (e.is_bool(b),), "zero", "CausalAttention",
              _key_mask_example("bool", causal=True)),
             ("Where(And(c, b), 0, nv)", e.Where(e.And(c, b), z, n), full, (*collapses, *tril), "mean",
              "CausalAttention", _key_mask_example("and", causal=True)),
             ("Where(And(b, c), 0, nv)", e.Where(e.And(b, c), z, n), full, (*collapses, *tril), "mean",
              "CausalAttention", _key_mask_example("and_last", causal=True)))
    for label, mask, flag, extra, masked_rows, op, build in forms:
        lhs = e.GeneralAttention(q, k, v, mask, scale=s, num_heads=nh, kv_num_heads=nkv, causal=flag, **opts)
        fused = getattr(e, op)(rows[q], rows[k], rows[v], key_mask, num_heads=nh, num_kv_heads=nkv,
                               head_dim=sq[2] / nh, batch=sq[0], masked_rows=e.String(masked_rows))
        yield e.rule(lhs, *_fused_guards(e, q, k, v, sq, sk, sv, s, nh), e.eq(e.shape(b)).to(key_shape), *extra,
                     name=f"GeneralAttention(q, k, v, {label}) -> Reshape({op}(q, k, v rows, key mask b; "
                          f"masked_rows {masked_rows}))", example=example(build)).then(
            e.union(lhs).with_(e.Identity(fused, shape=sq)), *row_shapes,
            e.set_(e.shape(cast)).to(key_shape), e.set_(e.shape(key_mask)).to(e.Vec(sq[0], sk[1])),
            e.set_(e.shape(fused)).to(e.Vec(sq[0] * sq[1], sq[2])))


#: The forward attention ops with a key_mask, and how many tensors precede it (q, k, v, or one packed qkv).
_KEY_MASKED = (("FullAttention", 3), ("FullAttentionPacked", 1), ("CausalAttention", 3), ("CausalAttention", 1),
               ("CausalAttentionRoPE", 3), ("CausalAttentionRoPE", 1))


def _cast_key_mask_example(op: str, lead: int, form: str):
    # op's key mask [B, S] as an exporter casts its padding mask: viewed [B, 1, 1, S], Cast to bool (form "i32": an
    # i32 mask of both signs and zeros, Cast(2 x, i32) of an input; "bool": a bool mask), Cast to f32, viewed [B, S]
    def build(g, dim):
        b, h, kv, s, _, d = example_dims(dim, square=True)
        d *= 2 if op == "CausalAttentionRoPE" else 1  # RoPE rotates pairs: an even head_dim
        if form == "i32":
            doubled = g.add_node("Mul", (g.input("x", [b, s]), g.constant(np.array(2.0), shape=())))
            flags = g.add_node("Cast", (g.reshape(g.add_node("Cast", (doubled,), to="i32"), [b, 1, 1, s]),), to="bool")
        else:
            flags = g.reshape(bool_mask(g, [b, s]), [b, 1, 1, s])
        mask = g.reshape(g.add_node("Cast", (flags,), to="f32"), [b, s])
        widths = [(h + 2 * kv) * d] if lead == 1 else [h * d, kv * d, kv * d]
        ins = [g.input(f"t{i}", [b * s, w]) for i, w in enumerate(widths)]
        rope = dict(theta=100.0) if op == "CausalAttentionRoPE" else {}
        g.set_outputs([g.add_node(op, (*ins, mask), num_heads=h, num_kv_heads=kv, head_dim=d, batch=b,
                                  masked_rows="mean", **rope)])

    return build


@rules("attention")
def _key_mask_without_casts(e):
    x = e.var("x")
    s = e.var("s", e.Vec[e.i64])
    lead = e.vars("t0 t1 t2")
    # The attention ops read an i32 or bool key mask as Cast(mask, bool) reads it (ir/ops/attention.py
    # KEY_MASK_DTYPES), so the casts an exporter puts before the f32 mask leave the attention's input:
    # op(.., Reshape(Cast(b, f32), s)) -> op(.., Reshape(b, s))   for b bool: true keeps, 1.0 keeps;
    # op(.., Reshape(Cast(y, bool), s)) -> op(.., Reshape(y, s))   for y i32: y != 0 keeps, as the cast's true.
    # Together: an int64 padding mask (narrowed to i32) reaches the attention without a dispatch of its own.
    forms = (("Cast(b, f32)", e.Cast(x, to=e.String("f32")), e.is_bool(x), "b", "bool"),
             ("Cast(y, bool)", e.Cast(x, to=e.String("bool")), e.is_i32(x), "y", "i32"))
    for op, n in _KEY_MASKED:
        attrs = e.attrs_of(op)
        tensors = ", ".join(["q", "k", "v"] if n == 3 else ["qkv"])
        for label, cast, guard, var, form in forms:
            plain = e.Identity(x, shape=s)
            lhs = getattr(e, op)(*lead[:n], e.Identity(cast, shape=s), **attrs)
            yield e.rule(lhs, guard, name=f"{op}({tensors}, Reshape({label}, s)) -> {op}({tensors}, Reshape({var}, s))",
                         example=example(_cast_key_mask_example(op, n, form))).then(
                e.union(lhs).with_(getattr(e, op)(*lead[:n], plain, **attrs)), e.set_(e.shape(plain)).to(s))


def _fused_qkv_example(op: str, masked: bool):
    # one [B S, (H + 2 KV) D] product (GPT-2's c_attn) viewed [B, S, width] and split on its last axis into q, k and
    # v, whose [B S, .] rows the attention reads
    def build(g, dim):
        b, h, kv, s, _, d = example_dims(dim, square=True)
        d *= 2 if op == "CausalAttentionRoPE" else 1  # RoPE rotates pairs: an even head_dim
        width = (h + 2 * kv) * d
        x = g.reshape(g.input("p", [b * s, width]), [b, s, width])
        parts, start = [], 0
        for w in (h * d, kv * d, kv * d):
            part = g.add_node("Slice", (x,), starts=[start], ends=[start + w], axes=[2], steps=[1])
            parts.append(g.reshape(part, [b * s, w]))
            start += w
        mask = dict(key_mask=g.input("key_mask", [b, s])) if masked else {}
        if op == "CausalAttentionRoPE":
            out = g.causal_attention_rope(*parts, h, kv, d, 100.0, batch=b, **mask)
        elif op == "CausalAttention":
            out = g.causal_attention(*parts, h, kv, d, b, **mask)
        else:
            out = g.full_attention(*parts, h, kv, d, b, **mask)
        g.set_outputs([out])

    return build


@rules("attention")
def _fused_qkv_product(e):
    x, p, m = e.vars("x p m")
    sx, so, sp, st, en, ax, sl = e.vars("sx so sp st en ax sl", e.Vec[e.i64])
    nq, nk = e.vars("nq nk", e.i64)
    lhs = e.Identity(e.Slice(x, starts=st, ends=en, axes=ax, steps=sl), shape=so)
    a, z = st[e.i64(0)], en[e.i64(0)]
    rows = e.Identity(x, shape=e.Vec(sx[0] * sx[1], sx[2]))
    cols = e.SliceCols(rows, start=a, size=z - a)
    # Reshape(Slice(x, [a:z] on its last axis), [B S, z - a]) -> SliceCols(Reshape(x, [B S, W]), a, z - a)   for x
    # [B, S, W] (a fused projection's columns, as exporters split GPT-2's c_attn into q, k and v)
    yield e.rule(lhs, e.eq(e.shape(x)).to(sx), e.eq(sx.length()).to(e.i64(3)), e.eq(so.length()).to(e.i64(2)),
                 e.eq(st.length()).to(e.i64(1)), e.eq(ax).to(e.Vec(e.i64(2))), e.eq(sl).to(e.Vec(e.i64(1))),
                 e.eq(so[0]).to(sx[0] * sx[1]), e.eq(so[1]).to(z - a), a >= e.i64(0), z <= sx[2],
                 name="Reshape(Slice(x, [a:z] on its last axis), [B S, z - a]) -> SliceCols(Reshape(x, [B S, W]), a, "
                      "z - a)", example=example(_fused_qkv_example("CausalAttention", False))).then(
        e.union(lhs).with_(cols), e.set_(e.shape(rows)).to(e.Vec(sx[0] * sx[1], sx[2])),
        e.set_(e.shape(cols)).to(e.Vec(sx[0] * sx[1], z - a)))
    # op(SliceCols(P, 0, nq), SliceCols(P, nq, nk), SliceCols(P, nq + nk, nk)[, m]) -> op'(P[, m])   for P of
    # nq + 2 nk columns: the attention reads q, k and v from the packed product (op' FullAttentionPacked for
    # FullAttention, the causal ops themselves with one packed input)
    parts = (e.SliceCols(p, start=e.i64(0), size=nq), e.SliceCols(p, start=nq, size=nk),
             e.SliceCols(p, start=nq + nk, size=nk))
    for op, packed_op in (("CausalAttention", "CausalAttention"), ("CausalAttentionRoPE", "CausalAttentionRoPE"),
                          ("FullAttention", "FullAttentionPacked")):
        attrs = e.attrs_of(op)
        for masked in (False, True):
            extra, label = ((m,), ", m") if masked else ((), "")
            yield e.equal(f"{op}(SliceCols(P, 0, q), SliceCols(P, q, k), SliceCols(P, q + k, k){label}) -> "
                          f"{packed_op}(P{label})",
                          getattr(e, op)(*parts, *extra, **attrs), getattr(e, packed_op)(p, *extra, **attrs),
                          e.eq(e.shape(p)).to(sp), e.eq(sp[1]).to(nq + nk + nk),
                          example=example(_fused_qkv_example(op, masked)))


def _split_heads_scores_example(masked: bool):
    def build(g, dim):
        b, h, kv, s, t, d = example_dims(dim)
        views = [g.add_node("Permute", (g.reshape(g.input(n, [b, rows, w * d]), [b, rows, w, d]),), perm=_HEADS)
                 for n, rows, w in (("q", s, h), ("k", t, h))]
        sc = scores_of(g, *views, 0.5)
        if masked:
            sc = g.add(sc, g.input("m", [b, 1, s, t]))
        g.set_outputs([safe_softmax(g, sc)])

    return build


@rules("attention")
def _scores_on_rows(e):
    qx, kx, m = e.vars("qx kx m")
    sq, sk = e.vars("sq sk", e.Vec[e.i64])
    (s, cap) = e.vars("s cap", e.f64)
    (off, lw, rw) = e.vars("off lw rw", e.i64)
    (causal,) = e.vars("causal", e.Bool)
    heads = e.Vec(*(e.i64(i) for i in _HEADS))
    rest = dict(softcap=cap, causal=causal, offset=off, left_window=lw, right_window=rw, mode=e.i64(3),
                masked_rows=e.var("masked_rows", e.String))
    flat = {x: e.Identity(x, shape=e.Vec(sx[0], sx[1], sx[2] * sx[3])) for x, sx in ((qx, sq), (kx, sk))}
    # AttentionScores(Permute(q, [0,2,1,3]), Permute(k, .); mode 3) -> AttentionScores(Reshape(q, [B,S,H D]), ...;
    #   num_heads H, kv_num_heads KV)   (the probabilities are [B, H, Sq, Skv] in either layout; only mode 3, which
    #   a graph output of the probabilities needs: every mode of every attention would be another form to extract)
    for masked in (False, True):
        extra = (m,) if masked else ()
        lhs = e.AttentionScores(e.Permute(qx, perm=heads), e.Permute(kx, perm=heads), *extra, scale=s,
                                num_heads=e.i64(0), kv_num_heads=e.i64(0), **rest)
        rows = e.AttentionScores(flat[qx], flat[kx], *extra, scale=s, num_heads=sq[2], kv_num_heads=sk[2], **rest)
        yield e.rule(lhs, e.eq(e.shape(qx)).to(sq), e.eq(e.shape(kx)).to(sk), e.eq(sq.length()).to(e.i64(4)),
                     e.eq(sk.length()).to(e.i64(4)),
                     name=f"AttentionScores(Permute(q), Permute(k){', m' if masked else ''}, mode 3) -> "
                          f"AttentionScores(q rows, k rows{', m' if masked else ''}, mode 3)",
                     example=example(_split_heads_scores_example(masked))).then(
            e.union(lhs).with_(rows),
            *(e.set_(e.shape(t)).to(e.Vec(sx[0], sx[1], sx[2] * sx[3])) for t, sx in ((flat[qx], sq), (flat[kx], sk))))


# --- packed projections for GeneralAttention ----------------------------------------------------


def _packed_general_example(biased: bool, masked: bool):
    # an exporter's projections of one h [B S, E] by weights [E, N] (MatMul), with biases or not, viewed [B, S, N]
    # and read by GeneralAttention on rows, with an additive mask [1, H, S, S] of unknown values or none
    def build(g, dim):
        b, h, kv, s, _, d = example_dims(dim, square=True)
        width = dim("e", 1, 6)
        x = g.input("h", [b * s, width])
        views = []
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            p = g.matmul(x, g.parameter(f"w{name}", [width, heads * d]))
            if biased:
                p = g.bias_add(p, g.parameter(f"b{name}", [heads * d]))
            views.append(g.reshape(p, [b, s, heads * d]))
        mask = [g.input("m", [1, h, s, s])] if masked else []
        g.set_outputs([g.add_node("GeneralAttention", (*views, *mask), scale=1 / np.sqrt(d), num_heads=h,
                                  kv_num_heads=kv, masked_rows="nan")])

    return build


@rules("attention")
def _packed_general_attention(e):
    h, m = e.vars("h m")
    names, bnames = e.vars("nq nk nv", e.String), e.vars("bq bk bv", e.String)
    # one shape variable per parameter, as in attention.py's _packed_qkv (a shared one joins every pair of
    # same-shaped parameters)
    shapes, bshapes = e.vars("wq wk wv", e.Vec[e.i64]), e.vars("tq tk tv", e.Vec[e.i64])
    w = [e.Parameter(n, s) for n, s in zip(names, shapes, strict=True)]
    bias = [e.Parameter(n, s) for n, s in zip(bnames, bshapes, strict=True)]
    sq, sk, sv, sh = e.vars("sq sk sv sh", e.Vec[e.i64])
    (s, cap) = e.vars("s cap", e.f64)
    nh, nkv, off, lw, rw = e.vars("nh nkv off lw rw", e.i64)
    attrs = dict(scale=s, num_heads=nh, kv_num_heads=nkv, softcap=cap, causal=e.var("causal", e.Bool), offset=off,
                 left_window=lw, right_window=rw, masked_rows=e.var("masked_rows", e.String))
    hd = sq[2] / nh
    width = sq[2] + sk[2] + sv[2]
    # GeneralAttention(Reshape(h@Wq + bq, [B, S, H D]), Reshape(h@Wk + bk), Reshape(h@Wv + bv), m?; rows)
    #   -> GeneralAttention(P, P, P, m?; packed)   P = Reshape(h@Concat(Wq, Wk, Wv, axis 1) + Concat(bq, bk, bv),
    #   [B, S, (H + 2 KV) D]), and the same without biases (T5): one product for the three projections, which the
    #   attention reads at its column offsets. q, k and v of one head size D over the same rows of h [B S, E].
    #   Each projection is also SliceCols(P2, its columns) of the 2-D product P2, for its other readers (DeBERTa's
    #   position terms read q and k, through PermutedBatchMatMul where they lie in P2)
    from .attention import projection_slices

    for biased in (True, False):
        proj = [e.BiasAdd(e.MatMul(h, wi), bi) if biased else e.MatMul(h, wi) for wi, bi in zip(w, bias, strict=True)]
        product = e.MatMul(h, e.Concat(*w, axis=e.i64(1)))
        flat = e.BiasAdd(product, e.Concat(*bias, axis=e.i64(0))) if biased else product
        packed = e.Identity(flat, shape=e.Vec(sq[0], sq[1], width))
        guards = (e.eq(e.shape(h)).to(sh), e.eq(sh.length()).to(e.i64(2)), e.eq(sh[0]).to(sq[0] * sq[1]),
                  e.eq(sq.length()).to(e.i64(3)), e.eq(sk[0]).to(sq[0]), e.eq(sk[1]).to(sq[1]), e.eq(sv).to(sk),
                  nh >= e.i64(1), nkv >= e.i64(1), e.eq(hd * nh).to(sq[2]), e.eq(hd * nkv).to(sk[2]),
                  *(e.eq(t.length()).to(e.i64(2)) for t in shapes),
                  *((e.eq(t.length()).to(e.i64(1)) for t in bshapes) if biased else ()))
        for masked in (False, True):
            extra = (m,) if masked else ()
            lhs = e.GeneralAttention(*(e.Identity(p, shape=x) for p, x in zip(proj, (sq, sk, sv), strict=True)),
                                     *extra, **attrs, packed=e.Bool(False))
            label = "h@W + b" if biased else "h@W"
            yield e.rule(lhs, *guards,
                         name=f"GeneralAttention(Reshape({label}) x3{', m' if masked else ''}) -> "
                              f"GeneralAttention(P, P, P{', m' if masked else ''}; packed)",
                         example=example(_packed_general_example(biased, masked))).then(
                e.union(lhs).with_(e.GeneralAttention(packed, packed, packed, *extra, **attrs, packed=e.Bool(True))),
                e.set_(e.shape(packed)).to(e.Vec(sq[0], sq[1], width)),
                e.set_(e.shape(flat)).to(e.Vec(sq[0] * sq[1], width)),
                *projection_slices(e, flat, list(zip(proj, (sq[2], sk[2], sv[2]), strict=True))))
