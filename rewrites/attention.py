"""Attention: RoPE applied inside the attention kernel (and inside the KV-cache write and the
cached attention of decoding), and Q/K/V projections packed."""

from __future__ import annotations

from egglog import String, Vec, eq, i64, rule, ruleset, union

from .dsl import equal
from .sorts import T, args, rope_fits_attention, shape

attention_ruleset = ruleset(name="attention")


@attention_ruleset.register
def _rope_into_attention(aa: String, ra: String, q: T, k: T, v: T):
    # CausalAttention(RoPE(q), RoPE(k), v) -> CausalAttentionRoPE(q, k, v)   if the RoPE's positions fit
    yield equal("CausalAttention(RoPE(q), RoPE(k), v) -> CausalAttentionRoPE(q, k, v)",
                T.causal_attention(aa, T.rope(ra, q), T.rope(ra, k), v),
                T.causal_attention_rope(aa, ra, q, k, v),
                rope_fits_attention(ra, aa))


@attention_ruleset.register
def _packed_qkv(h: T, nq: String, nk: String, nv: String, sq: Vec[i64], skv: Vec[i64], aa: String, ra: String):
    wq, wk, wv = T.parameter(nq, sq), T.parameter(nk, skv), T.parameter(nv, skv)
    q, k, v = T.matmul_bt(h, wq), T.matmul_bt(h, wk), T.matmul_bt(h, wv)
    packed = T.matmul_bt(h, T.concat(0, args(wq, wk, wv)))
    attn = T.causal_attention_rope(aa, ra, q, k, v)
    # CausalAttentionRoPE(h@Wq^T, h@Wk^T, h@Wv^T) -> CausalAttentionRoPE(P),  P = h@Concat(Wq,Wk,Wv)^T
    # and h@Wq^T = SliceCols(P, 0, q), h@Wk^T = SliceCols(P, q, kv), h@Wv^T = SliceCols(P, q+kv, kv)
    yield rule(attn, eq(shape(wq)).to(sq), eq(shape(wk)).to(skv), eq(shape(wv)).to(skv),
               name="CausalAttentionRoPE(h@Wq^T, h@Wk^T, h@Wv^T) -> CausalAttentionRoPE(h@Concat(Wq,Wk,Wv)^T)").then(
        union(attn).with_(T.causal_attention_rope_packed(aa, ra, packed)),
        union(q).with_(T.slice_cols(packed, 0, sq[0])),
        union(k).with_(T.slice_cols(packed, sq[0], skv[0])),
        union(v).with_(T.slice_cols(packed, sq[0] + skv[0], skv[0])),
    )


@attention_ruleset.register
def _rope_into_cache(ca: String, aa: String, ra: String, c: T, k: T, q: T, kc: T, vc: T, p: T):
    # CacheWrite(c, RoPEDynamic(k, p), p) -> CacheWriteRoPE(c, k, p)
    yield equal("CacheWrite(c, RoPEDynamic(k, p), p) -> CacheWriteRoPE(c, k, p)",
                T.op3("CacheWrite", ca, c, T.op2("RoPEDynamic", ra, k, p), p),
                T.op3("CacheWriteRoPE", ra, c, k, p))
    # CachedAttention(RoPEDynamic(q, p), kc, vc, p) -> CachedAttentionRoPE(q, kc, vc, p)   if the head sizes agree
    yield equal("CachedAttention(RoPEDynamic(q, p), kc, vc, p) -> CachedAttentionRoPE(q, kc, vc, p)",
                T.op4("CachedAttention", aa, T.op2("RoPEDynamic", ra, q, p), kc, vc, p),
                T.cached_attention_rope(aa, ra, q, kc, vc, p),
                rope_fits_attention(ra, aa))
