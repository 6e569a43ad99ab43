"""Attention: RoPE applied inside the attention kernel, and Q/K/V projections packed."""

from __future__ import annotations

from egglog import String, Vec, eq, i64, rule, ruleset, union

from .dsl import equal
from .sorts import T, rope_fits_attention, shape

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
    packed = T.matmul_bt(h, T.concat3(0, wq, wk, wv))
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
