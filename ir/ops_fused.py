"""Ops the rewrite engine produces (fused kernels, packed weights) and the vision norms.

Same conventions as :mod:`ops`: one block per op with its shape rule and numpy reference.
"""

from __future__ import annotations

import numpy as np

from .ops import (
    ROPE_ATTRS,
    ROPE_DEFAULTS,
    UNARY_FNS,
    OpDef,
    ShapeError,
    _f32,
    _fused_matmul,
    _matmul_ref,
    _need,
    _rms_norm_ref,
    _rope_ref,
    apply_epilogue,
    attention_reference,
    register,
)
from .types import TensorType

# --- FusedRmsNormMatMul: C = epilogue(RmsNorm(x, w_norm) op W) ------------------------------


def _fused_rms_norm_matmul(ts, a):
    x, w_norm = ts[0], ts[1]
    _f32(x, "x")
    _f32(w_norm, "w_norm")
    _need(a["variant"] in ("", "BT"), f"variant must be '' or 'BT' (x is not transposed), got {a['variant']!r}")
    _need(x.rank == 2 and w_norm.shape == (x.shape[1],), f"w_norm must be [{x.shape[-1]}] for x {x}, got {w_norm}")
    return _fused_matmul([x, *ts[2:]], a)


def _fused_rms_norm_matmul_ref(xs, a):
    normed = _rms_norm_ref(xs[:2], a)
    return apply_epilogue(_matmul_ref(normed, xs[2], a["variant"]), a["epilogue"], xs[3:])


register(OpDef(
    "FusedRmsNormMatMul", 3, 16, _fused_rms_norm_matmul, _fused_rms_norm_matmul_ref,
    attrs=("eps", "variant", "epilogue"), defaults={"variant": "", "epilogue": ()},
    doc="C = epilogue(RmsNorm(x, w_norm, eps) op W); inputs [x, w_norm, W, *epilogue operands]; "
        "the seed's FusedRmsNormMatMul with a matmul variant and an epilogue chain",
))


# --- Concat / SliceCols: packed weights and their parts ------------------------------------


def _concat(ts, a):
    axis = a["axis"]
    first = ts[0]
    _need(axis in range(first.rank), f"axis {axis} out of range for {first}")
    for t in ts[1:]:
        _need(t.dtype == first.dtype and t.rank == first.rank
              and all(d == e for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis),
              f"cannot concatenate {t} with {first} along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return TensorType(tuple(shape), first.dtype)


register(OpDef("Concat", 1, 16, _concat, lambda xs, a: np.concatenate(xs, axis=a["axis"]), attrs=("axis",),
               doc="concatenation along ``axis``; of parameters only, it is a derived parameter that "
                   "lowering packs once at session creation (no dispatch)"))


def _slice_cols(ts, a):
    x = ts[0]
    start, size = a["start"], a["size"]
    _need(x.rank == 2, f"input must be 2-D, got {x}")
    _need(start >= 0 and size >= 1 and start + size <= x.shape[1],
          f"columns [{start}, {start + size}) out of range for {x}")
    return TensorType((x.shape[0], size), x.dtype)


register(OpDef("SliceCols", 1, 1, _slice_cols, lambda xs, a: xs[0][:, a["start"]:a["start"] + a["size"]],
               attrs=("start", "size"), doc="out[i, j] = x[i, start + j] for j < size"))


# --- SwiGLUConcat: silu(x[:, :N]) * x[:, N:] ------------------------------------------------


def _swiglu_concat(ts, a):
    x = ts[0]
    _f32(x, "input")
    _need(x.rank == 2 and x.shape[1] % 2 == 0, f"input must be [M, 2N], got {x}")
    return TensorType((x.shape[0], x.shape[1] // 2))


def _swiglu_concat_ref(xs, a):
    n = xs[0].shape[1] // 2
    return UNARY_FNS["Silu"](xs[0][:, :n]) * xs[0][:, n:]


register(OpDef("SwiGLUConcat", 1, 1, _swiglu_concat, _swiglu_concat_ref,
               doc="gate = x[:, :N], up = x[:, N:], out = silu(gate) * up (seed: SwiGLUConcat)"))


# --- CausalAttentionRoPE: attention over RoPE(q), RoPE(k), v ---------------------------------


def split_packed_qkv(x, a):
    """Columns of a packed [rows, (H + 2 KV) * D] projection: (q, k, v) views or types."""
    nq, nkv = a["num_heads"] * a["head_dim"], a["num_kv_heads"] * a["head_dim"]
    if isinstance(x, TensorType):
        _need(x.rank == 2 and x.shape[1] == nq + 2 * nkv,
              f"packed qkv must be [rows, {nq + 2 * nkv}] (q {nq} + k {nkv} + v {nkv} columns), got {x}")
        return [TensorType((x.shape[0], w)) for w in (nq, nkv, nkv)]
    return [x[:, :nq], x[:, nq:nq + nkv], x[:, nq + nkv:]]


def _attention_rope(ts, a):
    from .ops import _attention, _rope

    _need(len(ts) in (1, 3), f"takes q, k, v or one packed qkv input, got {len(ts)} inputs")
    if len(ts) == 1:
        _f32(ts[0], "packed qkv")
        ts = split_packed_qkv(ts[0], a)
    out = _attention(ts, a)
    for t, what in ((ts[0], "q"), (ts[1], "k")):
        try:
            _rope([t], a)
        except ShapeError as e:
            raise ShapeError(f"{what}: {e}") from None
    return out


def _attention_rope_ref(xs, a):
    q, k, v = split_packed_qkv(xs[0], a) if len(xs) == 1 else xs
    return attention_reference(_rope_ref([q], a), _rope_ref([k], a), v, a, causal=True)


register(OpDef(
    "CausalAttentionRoPE", 1, 3, _attention_rope, _attention_rope_ref,
    attrs=("num_heads", "num_kv_heads", *ROPE_ATTRS),
    defaults=ROPE_DEFAULTS,
    doc="CausalAttention(RoPE(q), RoPE(k), v): the rotation is applied inside the attention kernel "
        "(seed: CausalAttentionRoPE). Inputs q, k, v, or one packed [rows, (H + 2 KV) * D] projection "
        "whose columns are q, k, v in that order",
))


# --- GroupNorm, GroupNormSilu ------------------------------------------------------------


def _group_norm(ts, a):
    x = ts[0]
    _f32(x, "input")
    _need(x.rank == 3, f"input must be [N, C, S] (batch, channels, spatial), got {x}")
    c, g = x.shape[1], a["num_groups"]
    _need(g >= 1 and c % g == 0, f"{c} channels do not split into {g} groups")
    for t, what in zip(ts[1:], ("weight", "bias"), strict=True):
        _need(t.shape == (c,), f"{what} must be [{c}], got {t}")
    return x


def _group_norm_ref(xs, a):
    x, w, b = xs
    n, c, s = x.shape
    g = x.reshape(n, a["num_groups"], -1)
    mu = g.mean(-1, keepdims=True)
    var = ((g - mu) ** 2).mean(-1, keepdims=True)
    y = ((g - mu) / np.sqrt(var + a["eps"])).reshape(n, c, s)
    return y * w[None, :, None] + b[None, :, None]


register(OpDef("GroupNorm", 3, 3, _group_norm, _group_norm_ref, attrs=("num_groups", "eps"),
               doc="normalise each group of C/num_groups channels over channels and space, then "
                   "scale and shift per channel (Wu & He 2018); x [N, C, S]"))
register(OpDef("GroupNormSilu", 3, 3, _group_norm, lambda xs, a: UNARY_FNS["Silu"](_group_norm_ref(xs, a)),
               attrs=("num_groups", "eps"), doc="Silu(GroupNorm(x, w, b)) in one kernel (seed: GroupNormSilu)"))
