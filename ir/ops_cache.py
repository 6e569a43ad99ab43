"""KV-cache ops for autoregressive decoding: RoPE at a run-time position, an in-place cache
write, and attention of new query rows over the cache.

A cache is a state tensor (``Graph.state``) [max_seq, kv_width] whose row j holds the key
(or value) of position j. Every op here takes the position of its first new row as an
input ``pos`` u32[1], so one compiled plan serves every decoding step (meganeura 0.2.0
``graph.rs``: ``rope_dynamic_offset``, ``CacheWrite``, ``CachedAttention``, generalised
from one new row to n). Same conventions as :mod:`ops`: one block per op, a shape rule
raising :class:`ShapeError` and a float64 numpy reference.

Inference only (:data:`INFERENCE_OPS`): these ops have no gradient rules; ``autodiff.grad``
raises GraphError when a gradient would have to flow through one.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .ops import OpDef, _f32, _need, _rope, _rope_ref, attention_reference, register
from .types import DType, TensorType

#: The ops of this module: inference only, so no gradient rules (tests exclude them).
INFERENCE_OPS = ("RoPEDynamic", "CacheWrite", "CachedAttention", "CacheWriteRoPE", "CachedAttentionRoPE")


def _position(t: TensorType, what: str) -> None:
    _need(t.dtype is DType.U32 and t.shape == (1,), f"{what} must be u32[1], got {t}")


def _rows_fit(op: str, pos: np.ndarray, rows: int, cache_rows: int) -> int:
    """The first new row's position, after checking that ``rows`` rows from it fit the cache."""
    p = int(pos[0])
    if p + rows > cache_rows:
        raise InputError(f"{op}: rows {p}..{p + rows - 1} do not fit a cache of {cache_rows} rows (max_seq)")
    return p


# --- RoPEDynamic: RoPE whose position offset is an input --------------------------------------

#: The RoPE attributes of RoPEDynamic and of the fused forms below (no pos_offset, no batch).
_ROPE_ATTRS = ("theta", "head_dim", "pairing", "scaling")
_ROPE_DEFAULTS = {"pairing": "half", "scaling": None}


def _rope_dynamic(ts, a):
    x, offset = ts
    _position(offset, "offset")
    return _rope([x], {**a, "batch": 1})


def _rope_dynamic_ref(xs, a):
    x, offset = xs
    return _rope_ref([x], {**a, "batch": 1, "pos_offset": int(offset[0])})


register(OpDef(
    "RoPEDynamic", 2, 2, _rope_dynamic, _rope_dynamic_ref, attrs=_ROPE_ATTRS, defaults=_ROPE_DEFAULTS,
    doc="RoPE (Su et al. 2021) of x [rows, heads*head_dim] where row r has position offset[0] + r; "
        "inputs [x, offset u32[1]] (seed: rope_dynamic_offset). Pairing as RoPE's (ops.rope_pairs)",
))


# --- CacheWrite: new rows into a cache, in place ---------------------------------------------


def _cache_write(ts, a):
    cache, new, pos = ts
    _f32(cache, "cache")
    _f32(new, "new rows")
    _need(cache.rank == 2 and new.rank == 2 and new.shape[1] == cache.shape[1],
          f"cache [max_seq, W] and new rows [n, W] must be 2-D of the same width, got {cache} and {new}")
    _need(new.shape[0] <= cache.shape[0], f"{new.shape[0]} new rows do not fit a cache of {cache.shape[0]} rows")
    _position(pos, "pos")
    return cache


def _cache_write_ref(xs, a):
    cache, new, pos = xs
    p = _rows_fit("CacheWrite", pos, new.shape[0], cache.shape[0])
    out = cache.copy()
    out[p:p + new.shape[0]] = new
    return out


register(OpDef(
    "CacheWrite", 3, 3, _cache_write, _cache_write_ref, writes=0,
    doc="cache[pos + r] <- new[r] for r < n, in place; inputs [cache [max_seq, W] (a state tensor), "
        "new [n, W], pos u32[1]]; the value is the whole updated cache. Raises InputError (reference) "
        "when pos + n > max_seq; the kernel then writes only the rows that fit (seed: CacheWrite)",
))


# --- CachedAttention: causal GQA attention of new rows over the cache --------------------------

_ATTRS = ("num_heads", "num_kv_heads", "head_dim")


def _cached_attention(ts, a):
    q, k, v, pos = ts
    nh, nkv, hd = (a[n] for n in _ATTRS)
    for t, w, what in ((q, nh * hd, "q"), (k, nkv * hd, "k_cache"), (v, nkv * hd, "v_cache")):
        _f32(t, what)
        _need(t.rank == 2 and t.shape[1] == w, f"{what} must be [rows,{w}], got {t}")
    _need(nkv >= 1 and nh % nkv == 0, f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    _need(k.shape == v.shape, f"k_cache {k} and v_cache {v} must have the same shape")
    _need(q.shape[0] <= k.shape[0], f"{q.shape[0]} query rows do not fit a cache of {k.shape[0]} rows")
    _position(pos, "pos")
    return q


def _cached_attention_ref(xs, a):
    # Row i of q sits at position pos + i and sees cache rows 0..pos+i: exactly row pos + i of
    # causal attention over the first pos + n cache rows, whatever the other query rows hold.
    q, k, v, pos = xs
    n = q.shape[0]
    p = _rows_fit("CachedAttention", pos, n, k.shape[0])
    q_full = np.zeros((p + n, q.shape[1]))
    q_full[p:] = q
    out = attention_reference(q_full, k[:p + n], v[:p + n], {**a, "batch": 1}, causal=True)
    return out[p:]


register(OpDef(
    "CachedAttention", 4, 4, _cached_attention, _cached_attention_ref, attrs=_ATTRS,
    doc="causal GQA attention (Vaswani et al. 2017, eq. 1) of the n query rows q [n, H*D] at positions "
        "pos..pos+n-1 over cache rows 0..pos+i (row i); inputs [q, k_cache, v_cache [max_seq, KV*D], "
        "pos u32[1]]; output [n, H*D] (seed: CachedAttention, generalised from n = 1)",
))


# --- fused forms the attention rules create: the rotation moved into its reader -----------------

def _cache_write_rope(ts, a):
    cache, new, pos = ts
    _rope_dynamic([new, pos], a)
    return _cache_write(ts, a)


def _cache_write_rope_ref(xs, a):
    cache, new, pos = xs
    return _cache_write_ref([cache, _rope_dynamic_ref([new, pos], a), pos], a)


register(OpDef(
    "CacheWriteRoPE", 3, 3, _cache_write_rope, _cache_write_rope_ref, attrs=_ROPE_ATTRS, writes=0,
    defaults=_ROPE_DEFAULTS,
    doc="CacheWrite(cache, RoPEDynamic(new, pos), pos) in one kernel: cache[pos + r] <- new[r] rotated "
        "(Su et al. 2021) at position pos + r, in place; inputs [cache [max_seq, W] (a state tensor), "
        "new [n, W], pos u32[1]]; the value is the whole updated cache. Raises InputError (reference) "
        "when pos + n > max_seq",
))


def _cached_attention_rope(ts, a):
    q, _, _, pos = ts
    _rope_dynamic([q, pos], a)
    return _cached_attention(ts, a)


def _cached_attention_rope_ref(xs, a):
    q, k, v, pos = xs
    return _cached_attention_ref([_rope_dynamic_ref([q, pos], a), k, v, pos], a)


register(OpDef(
    "CachedAttentionRoPE", 4, 4, _cached_attention_rope, _cached_attention_rope_ref,
    attrs=(*_ATTRS, *_ROPE_ATTRS), defaults=_ROPE_DEFAULTS,
    doc="CachedAttention(RoPEDynamic(q, pos), k_cache, v_cache, pos) in one kernel: the query rows are "
        "rotated (Su et al. 2021) at positions pos..pos+n-1 as they are loaded; inputs [q [n, H*D], "
        "k_cache, v_cache [max_seq, KV*D], pos u32[1]]; output [n, H*D]",
))
