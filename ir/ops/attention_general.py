"""Attention as ONNX defines it, for what the fused attention ops do not cover: GeneralAttention
(any mask, softcap, scale, causal offset, window, kv lengths, head sizes of V apart from Q/K,
3-D or 4-D layouts), AttentionScores (ONNX Attention's ``qk_matmul_output``) and SplitHeads
(the [B, S, H*D] -> [B, H, S, D] layout change that ONNX's present key and value need).

Layouts (ONNX Attention, https://onnx.ai/onnx/operators/onnx__Attention.html): a rank-4
tensor is [B, heads, S, D]; a rank-3 one is [B, S, heads * D], its head count given by the
``num_heads`` (q) or ``kv_num_heads`` (k, v) attribute. Query head h reads kv head
h // (H / KV) (GQA). The attention bias of query row i and key j is -inf (the key is not
allowed) unless j < the batch's kv length, and, when ``causal``, j <= i + offset, and, for
each window side >= 0, i + offset - left_window <= j <= i + offset + right_window; a bool
mask must be true there, an additive float mask not -inf (its value is added to the
softcapped score). The mask broadcasts to [B, H, Sq, L] over its leading dimensions, L <= Skv
keys, keys j >= L not allowed (ONNX pads a short mask with -inf / false). ``offset`` is the
attribute, or with kv_lens [B] (ONNX's nonpad_kv_seqlen) kv_lens[b] - Sq. A query row without
any allowed key has a zero output (ONNX's fully-masked-row rule, not the average the fused
attention ops give), and so has a row whose softmax is NaN (a NaN or +inf score); with ``masked_rows``
``nan`` such rows are NaN instead, what a softmax of the masked scores without SDPA's guard gives there
(exp(-inf - -inf)), which the recognition of an exporter's unguarded softmax over a mask of unknown values
(T5's relative position bias) needs. GeneralAttention with ``packed`` reads q, k and v as the column ranges of
one [B, S, (H + 2 KV) D] tensor (given three times: the product of the packed Q/K/V projections), each at its
column offset.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError, LoweringError
from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType
from .attention import ATTENTION_TILE_BYTES, LaneAddressing, LaneTiles, attention_io, lane_tiles, lanes_slots

FAMILY = "attention_general"

#: Bytes of workgroup memory attention_general.wgsl's tiles may take (the WebGPU default of
#: maxComputeWorkgroupStorageSize, which every device offers).
GENERAL_TILE_BYTES = 16384
#: Invocations per workgroup of attention_general.wgsl.
GENERAL_WG = 256

#: What a query row without an allowed key gives (the ``masked_rows`` attribute).
MASKED_ROWS = ("zero", "nan")

_NO_GRAD = no_grad("an inference op of the ONNX import (training graphs use FullAttention / CausalAttention)")


# --- shapes ------------------------------------------------------------------------------------


def _heads(t: TensorType, heads: int, what: str) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head size) of a rank-3 [B, S, heads*D] or rank-4 [B, heads, S, D] tensor."""
    need_f32(t, what)
    need(t.rank in (3, 4), f"{what} must be 3-D [B, S, heads*D] or 4-D [B, heads, S, D], got {t}")
    if t.rank == 4:
        need(heads in (0, t.shape[1]), f"{what} {t} has {t.shape[1]} heads, the attribute says {heads}")
        return t.shape[0], t.shape[1], t.shape[2], t.shape[3]
    need(heads >= 1, f"{what} is 3-D ({t}): its head count attribute must be >= 1, got {heads}")
    need(t.shape[2] % heads == 0, f"{what} {t}: width {t.shape[2]} is not a multiple of {heads} heads")
    return t.shape[0], heads, t.shape[1], t.shape[2] // heads


def packed_widths(x: TensorType, a) -> tuple[int, int, int]:
    """The column widths (q, k, v) of a packed GeneralAttention's [B, S, W] input: heads H and KV of
    one head size D = W / (H + 2 KV), q's H D columns first, then k's and v's KV D each."""
    need(x.rank == 3, f"a packed q/k/v input must be 3-D [B, S, (H + 2 KV) D], got {x}")
    h, kv = a["num_heads"], a["kv_num_heads"]
    need(h >= 1 and kv >= 1, f"packed: num_heads and kv_num_heads must be >= 1, got {h} and {kv}")
    need(x.shape[2] % (h + 2 * kv) == 0,
         f"packed: width {x.shape[2]} of {x} is not (num_heads + 2 kv_num_heads) = {h + 2 * kv} head sizes")
    d = x.shape[2] // (h + 2 * kv)
    return h * d, kv * d, kv * d


def unpacked(ts, a) -> list:
    """GeneralAttention's inputs with a packed q, k, v (the ``packed`` attribute: three times the same
    [B, S, (H + 2 KV) D] tensor) as the q [B, S, H D], k and v [B, S, KV D] they hold: types, or arrays
    (their column slices); the inputs as they are when not packed."""
    if not a.get("packed"):
        return list(ts)
    x = ts[0]
    typed = isinstance(x, TensorType)
    need(not typed or all(t == x for t in ts[1:3]), f"packed: q, k and v must be one tensor's type, got {ts[:3]}")
    wq, wk, wv = packed_widths(x if typed else TensorType(x.shape), a)
    cuts = ((0, wq), (wq, wq + wk), (wq + wk, wq + wk + wv))
    if typed:
        parts = [TensorType((*x.shape[:2], hi - lo), x.dtype) for lo, hi in cuts]
    else:
        parts = [t[..., lo:hi] for t, (lo, hi) in zip(ts[:3], cuts, strict=True)]
    return [*parts, *ts[3:]]


def attention_dims(ts, a, with_v: bool = True) -> dict[str, int]:
    """B, H, KV, Sq, Skv, D, Dv of GeneralAttention (q, k, v, mask?, kv_lens?) or, ``with_v``
    False, of AttentionScores (q, k, mask?, kv_lens?); ShapeError for inputs that do not fit."""
    if with_v:
        ts = unpacked(ts, a)
    b, nh, sq, d = _heads(ts[0], a["num_heads"], "q")
    kb, nkv, skv, dk = _heads(ts[1], a["kv_num_heads"], "k")
    need(kb == b, f"q {ts[0]} and k {ts[1]} have different batch sizes")
    need(dk == d, f"q {ts[0]} and k {ts[1]} have different head sizes ({d}, {dk})")
    need(nh % nkv == 0, f"{nh} query heads are not a multiple of {nkv} kv heads")
    dv = d
    if with_v:
        vb, vkv, vs, dv = _heads(ts[2], a["kv_num_heads"], "v")
        need((vb, vkv, vs) == (b, nkv, skv), f"v {ts[2]} does not match k {ts[1]} (batch, heads, rows)")
    rest = ts[3 if with_v else 2:]
    if rest:
        m = rest[0]
        need(m.dtype in (DType.F32, DType.BOOL), f"mask must be f32 (added) or bool (true keeps), got {m}")
        need(1 <= m.rank <= 4, f"mask must have rank 1..4, got {m}")
        need(m.shape[-1] <= skv, f"mask {m} covers {m.shape[-1]} keys, more than the {skv} keys")
        lead = (b, nh, sq)[3 - (m.rank - 1):] if m.rank > 1 else ()
        need(all(x in (1, y) for x, y in zip(m.shape[:-1], lead, strict=True)),
             f"mask {m} does not broadcast to [{b},{nh},{sq},{m.shape[-1]}]")
    if len(rest) == 2:
        need(rest[1].dtype is DType.I32 and rest[1].shape == (b,), f"kv_lens must be i32 [{b}], got {rest[1]}")
    for name in ("left_window", "right_window"):
        need(a[name] >= -1, f"{name} must be -1 (unbounded) or >= 0, got {a[name]}")
    need(a["masked_rows"] in MASKED_ROWS, f"masked_rows must be one of {MASKED_ROWS}, got {a['masked_rows']!r}")
    need(a["softcap"] >= 0, f"softcap must be >= 0 (0: none), got {a['softcap']}")
    return dict(B=b, H=nh, KV=nkv, Sq=sq, Skv=skv, D=d, Dv=dv)


def _general_rule(ts, a):
    d = attention_dims(ts, a)
    if ts[0].rank == 4:
        return TensorType((d["B"], d["H"], d["Sq"], d["Dv"]))
    return TensorType((d["B"], d["Sq"], d["H"] * d["Dv"]))


def _scores_rule(ts, a):
    need(a["mode"] in (0, 1, 2, 3), f"mode must be 0, 1, 2 or 3, got {a['mode']}")
    d = attention_dims(ts, a, with_v=False)
    return TensorType((d["B"], d["H"], d["Sq"], d["Skv"]))


# --- the reference -----------------------------------------------------------------------------


def to_bhsd(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, S, heads*D] -> [B, heads, S, D]; a rank-4 array as it is."""
    if x.ndim == 4:
        return x
    b, s, w = x.shape
    return x.reshape(b, s, heads, w // heads).transpose(0, 2, 1, 3)


def attention_bias(shape: tuple[int, int, int, int], a, mask=None, kv_lens=None) -> tuple[np.ndarray, np.ndarray]:
    """(allowed bool [B, H, Sq, Skv], additive float64 bias of the allowed keys) of the
    module docstring's rules (ONNX Attention's attn_bias, -inf where not allowed)."""
    b, nh, sq, skv = shape
    if kv_lens is None:
        lens, off = np.full(b, skv), np.full(b, a["offset"])
    else:
        lens = np.asarray(kv_lens, dtype=np.int64)
        if lens.min() < 0 or lens.max() > skv:
            raise InputError(f"GeneralAttention: kv lengths {lens.tolist()} must lie in [0, {skv}]")
        off = lens - sq
    i = np.arange(sq)[None, :, None]
    j = np.arange(skv)[None, None, :]
    pos = i + off[:, None, None]
    allowed = j < lens[:, None, None]
    if a["causal"]:
        allowed = allowed & (j <= pos)
    if a["left_window"] >= 0:
        allowed = allowed & (pos - j <= a["left_window"])
    if a["right_window"] >= 0:
        allowed = allowed & (j - pos <= a["right_window"])
    allowed = np.broadcast_to(allowed[:, None], shape).copy()
    add = np.zeros(shape)
    if mask is not None:
        length = mask.shape[-1]
        m = np.broadcast_to(mask, (b, nh, sq, length))
        allowed[..., length:] = False
        if m.dtype == np.bool_:
            allowed[..., :length] &= m
        else:
            allowed[..., :length] &= ~np.isneginf(m)
            add[..., :length] = np.where(np.isneginf(m), 0.0, m)
    return allowed, add


def _scores(xs, a, with_v: bool):
    q, k = xs[0], xs[1]
    rest = xs[3 if with_v else 2:]
    mask = rest[0] if rest else None
    kv_lens = rest[1] if len(rest) == 2 else None
    nh = a["num_heads"] or q.shape[1]
    nkv = a["kv_num_heads"] or k.shape[1]
    q4, k4 = to_bhsd(q, nh), to_bhsd(k, nkv)
    k4 = np.repeat(k4, nh // nkv, axis=1)
    raw = np.einsum("bhid,bhjd->bhij", q4, k4) * a["scale"]
    capped = a["softcap"] * np.tanh(raw / a["softcap"]) if a["softcap"] > 0 else raw
    allowed, add = attention_bias(raw.shape, a, mask, kv_lens)
    s = np.where(allowed, capped + add, -np.inf)
    m = np.where(allowed, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    # a row without an allowed key, or whose softmax is NaN (a NaN or +inf score: a softmax's whole row is NaN there)
    empty = 0.0 if a.get("masked_rows", "zero") == "zero" else np.nan
    ok = (total > 0) & np.isfinite(total)
    probs = np.where(ok, e / np.where(ok, total, 1.0), empty)
    return raw, capped, s, probs


def general_attention_ref(xs, a):
    """ONNX Attention's Y for the present K and V (onnx.reference ``_compute_attention``), float64."""
    xs = unpacked(xs, a)
    probs = _scores(xs, a, with_v=True)[3]
    nh, nkv = a["num_heads"] or xs[0].shape[1], a["kv_num_heads"] or xs[1].shape[1]
    v4 = np.repeat(to_bhsd(xs[2], nkv), nh // nkv, axis=1)
    y = probs @ v4
    if xs[0].ndim == 3:
        b, h, s, dv = y.shape
        return y.transpose(0, 2, 1, 3).reshape(b, s, h * dv)
    return y


def attention_scores_ref(xs, a):
    """ONNX Attention's qk_matmul_output of ``mode`` 0 (scale q.k), 1 (softcapped), 2 (plus
    the bias, -inf where not allowed) or 3 (the softmax, zero rows where none is allowed)."""
    return _scores(xs, a, with_v=False)[a["mode"]]


# --- kernels -----------------------------------------------------------------------------------


def layout_strides(t: TensorType, heads: int, dim: int, packed: TensorType | None = None) -> tuple[int, int, int]:
    """Element strides (batch, head, row) of a rank-3 [B, S, heads*dim] or rank-4 [B, heads, S, dim] tensor, or of
    ``t``'s columns in the rows of the ``packed`` [B, S, W] tensor that holds them (a packed GeneralAttention)."""
    if packed is not None:
        _, s, w = packed.shape
        return s * w, dim, w
    if t.rank == 4:
        _, h, s, _ = t.shape
        return h * s * dim, s * dim, dim
    _, s, _ = t.shape
    return s * heads * dim, dim, heads * dim


def _accessor(name: str, dim: str, vec: bool) -> list[str]:
    if vec:
        return [f"fn {name}4(base: u32, c: u32) -> vec4<f32> {{ return {name}[base / 4u + c]; }}"]
    return [f"fn {name}4(base: u32, c: u32) -> vec4<f32> {{",
            "    var r = vec4<f32>();",
            "    for (var e = 0u; e < 4u; e = e + 1u) {",
            f"        if (4u * c + e < {dim}) {{ r[e] = {name}[base + 4u * c + e]; }}",
            "    }",
            "    return r;",
            "}"]


def _io(hd: int, dv: int) -> str:
    """The q4, k4, v4 and store_out accessors of attention_general.wgsl (vec4 arrays where the
    head size is a multiple of 4: every row then starts at a multiple of 4 elements)."""
    lines = _accessor("q", "HD", hd % 4 == 0) + _accessor("k", "HD", hd % 4 == 0) + _accessor("v", "DV", dv % 4 == 0)
    if dv % 4 == 0:
        lines.append("fn store_out(base: u32, c: u32, v: vec4<f32>) { out[base / 4u + c] = v; }")
    else:
        lines += ["fn store_out(base: u32, c: u32, v: vec4<f32>) {",
                  "    for (var e = 0u; e < 4u; e = e + 1u) {",
                  "        if (4u * c + e < DV) { out[base + 4u * c + e] = v[e]; }",
                  "    }",
                  "}"]
    return "\n".join(lines)


def _tile_bytes(hd4: int, dv4: int, bq: int, bk: int) -> int:
    return 16 * (bq * hd4 + bk * hd4 + bk * dv4) + 8 * bq * bk + 12 * bq


def general_tiles(hd: int, dv: int) -> tuple[int, int] | None:
    """(BQ query rows, BK keys per tile) of attention_general.wgsl for head sizes ``hd`` (q, k)
    and ``dv`` (v), or None when not even one row and one key fit GENERAL_TILE_BYTES: BQ = WG /
    ceil(dv / 4) rows (one output vec4 per invocation, at most 64 rows), halved until a tile of
    one key fits, then the most keys (a power of two <= 64) that fit."""
    hd4, dv4 = math.ceil(hd / 4), math.ceil(dv / 4)
    bq = max(1, min(64, GENERAL_WG // dv4))
    while bq > 1 and _tile_bytes(hd4, dv4, bq, 1) > GENERAL_TILE_BYTES:
        bq //= 2
    if _tile_bytes(hd4, dv4, bq, 1) > GENERAL_TILE_BYTES:
        return None
    bk = 64
    while bk > 1 and _tile_bytes(hd4, dv4, bq, bk) > GENERAL_TILE_BYTES:
        bk //= 2
    return bq, bk


def _mask_code(ins, first_extra: int) -> tuple[str, tuple, tuple]:
    """The MASK slot, its uniform fields and binding for the mask input (if any) at ``first_extra``."""
    if len(ins) <= first_extra:
        return "", (("mask_len", "u32", 0), ("m_sb", "u32", 0), ("m_sh", "u32", 0), ("m_sq", "u32", 0)), ()
    m = ins[first_extra]
    length = m.shape[-1]
    shape = (1,) * (4 - m.rank) + m.shape
    strides = [0, 0, 0]
    acc = length
    for axis in (2, 1, 0):
        if shape[axis] != 1:
            strides[axis] = acc
        acc *= shape[axis]
    at = "mask[b * p.m_sb + h * p.m_sh + qi * p.m_sq + j]"
    if m.dtype is DType.BOOL:
        lines = [f"if (j >= p.mask_len || {at} == 0u) {{", "    ok = false;", "}"]
    else:  # an additive mask: -inf excludes the key
        lines = ["if (j >= p.mask_len) {", "    ok = false;", "} else {", f"    let mv = {at};",
                 "    if (is_neg_inf(mv)) {", "        ok = false;", "    } else {", "        s = s + mv;", "    }",
                 "}"]
    code = "\n".join(" " * 16 + line for line in lines)
    fields = (("mask_len", "u32", length), *zip(("m_sb", "m_sh", "m_sq"), ("u32",) * 3, strides, strict=True))
    return code, fields, (Buffer("mask", m.dtype.wgsl),)


def _common(node, ins, with_v: bool):
    """Uniform fields, slots and extra bindings shared by both kernels."""
    a = node.attrs
    d = attention_dims(ins, a, with_v)
    first_extra = 3 if with_v else 2
    mask_code, mask_fields, mask_buf = _mask_code(ins, first_extra)
    lens = len(ins) == first_extra + 2
    slots = dict(HEAD_DIM=d["D"], MASK=mask_code, EMPTY_ROW="0.0" if a["masked_rows"] == "zero" else "nan_f32()",
                 KV_LEN="u32(clamp(kv_lens[b], 0, i32(p.kv_seq)))" if lens else "p.kv_seq",
                 OFFSET="kv_lens[b] - i32(p.q_seq)" if lens else "p.offset")
    qs, ks = (layout_strides(t, heads, d["D"], packed=ins[0] if a.get("packed") else None)
              for t, heads in zip(unpacked(ins, a)[:2], (d["H"], d["KV"]), strict=True))
    fields = (("q_seq", "u32", d["Sq"]), ("kv_seq", "u32", d["Skv"]), ("nh", "u32", d["H"]),
              ("group", "u32", d["H"] // d["KV"]), ("scale", "f32", a["scale"]), ("softcap", "f32", a["softcap"]),
              ("causal", "u32", int(a["causal"])), ("offset", "i32", a["offset"]), ("left", "i32", a["left_window"]),
              ("right", "i32", a["right_window"]),
              *zip(("q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss"), ("u32",) * 6, qs + ks, strict=True), *mask_fields)
    extra = (*mask_buf, *((Buffer("kv_lens", "i32"),) if lens else ()))
    return d, fields, slots, extra


#: Largest head size (q, k and v alike) at which GeneralAttention runs on attention_lanes.wgsl
#: (:func:`general_lanes_tiles`) instead of attention_general.wgsl; 0 keeps every GeneralAttention on the latter.
GENERAL_LANES_MAX_HEAD_DIM = 64
#: Whether GeneralAttention's weights on attention_lanes.wgsl are exp2 of log2(e)-scaled scores (the other ops'
#: form) instead of exp of the scores. Off: a mask value past f32 max / log2(e), about 2.4e38, overflows there
#: (+inf empties its row, -inf is held above MAX_INIT with every other such key), unlike the reference.
GENERAL_LANES_EXP2 = False

#: attention_lanes.wgsl's score of an allowed key of GeneralAttention (weights by exp) from its scaled q.k ``d``
#: and its mask value: ``d`` plus an additive float mask's value (-inf: the key is not allowed, MAX_INIT), a bool
#: mask's key kept where true. A NaN score becomes +inf, which makes the row's sum NaN and the row empty (zeros,
#: or NaN with masked_rows nan), as the reference's NaN softmax; a finite ``d`` plus the mask is held above
#: MAX_INIT (a mask of the lowest f32, as transformers' masked_fill writes, stays an allowed key, as in the
#: reference), a ``d`` of -inf (infinite inputs) weighs 0.
_LANES_SCORE_COMMON = "\n".join([
    "const ALLOWED_MIN: f32 = -3.4028232635611926e38;  // the f32 above MAX_INIT",
    "fn allowed_score(d: f32, s: f32) -> f32 {",
    "    if ((bitcast<u32>(s) & 0x7fffffffu) > 0x7f800000u) {  // NaN",
    "        return bitcast<f32>(0x7f800000u);",
    "    }",
    "    return select(s, max(s, ALLOWED_MIN), bitcast<u32>(d) != 0xff800000u);",
    "}"])
_LANES_SCORE_FN = {
    None: _LANES_SCORE_COMMON + "\nfn general_score(d: f32) -> f32 { return allowed_score(d, d); }",
    DType.F32: "\n".join([
        _LANES_SCORE_COMMON,
        "fn general_score(d: f32, mv: f32) -> f32 {",
        "    if (bitcast<u32>(mv) == 0xff800000u) {  // -inf: not allowed",
        "        return MAX_INIT;",
        "    }",
        "    return allowed_score(d, d + mv * MASK_SCALE);",
        "}"]),
    DType.BOOL: _LANES_SCORE_COMMON + "\nfn general_score(d: f32, keep: u32) -> f32 { return select(MAX_INIT, "
                                      "allowed_score(d, d), keep != 0u); }"}


def general_lanes_tiles(node, ins, storage: int) -> LaneTiles | None:
    """The attention_lanes.wgsl split (ir/ops/attention.py :func:`lane_tiles`) GeneralAttention ``node`` runs at,
    or None where it runs on attention_general.wgsl: head sizes above :data:`GENERAL_LANES_MAX_HEAD_DIM` or v's
    apart from q's, causal, a window, a softcap, kv lengths, v laid out apart from k, or no split that fits
    ``storage`` bytes of workgroup memory."""
    a = node.attrs
    d = attention_dims(ins, a)
    if (d["D"] != d["Dv"] or d["D"] > GENERAL_LANES_MAX_HEAD_DIM or a["causal"] or a["left_window"] >= 0
            or a["right_window"] >= 0 or a["softcap"] > 0 or len(ins) > 4):
        return None
    k, v = unpacked(ins, a)[1:3]
    packed = ins[0] if a.get("packed") else None
    if layout_strides(k, d["KV"], d["D"], packed) != layout_strides(v, d["KV"], d["Dv"], packed):
        return None
    return lane_tiles(d["D"], storage)


def _general_lanes_kernel(node, ins, tiles: LaneTiles) -> Kernel:
    # GeneralAttention on attention_lanes.wgsl: q, k, v and out through their (batch, head, row) strides, the mask
    # read per (row, key) where the key is scored
    a = node.attrs
    d, fields, _, _ = _common(node, ins, True)
    hd, packed = d["D"], bool(a.get("packed"))
    masked = len(ins) == 4
    mask_dtype = ins[3].dtype if masked else DType.F32
    os = layout_strides(node.type, d["H"], d["Dv"])
    wq, wk, _ = packed_widths(ins[0], a) if packed else (0, 0, 0)
    q_blocks = math.ceil(d["Sq"] / tiles.rows)
    total = d["B"] * d["H"] * q_blocks
    key_end = min(d["Skv"], ins[3].shape[-1]) if masked else d["Skv"]
    params = (*fields, *zip(("o_sb", "o_sh", "o_ss"), ("u32",) * 3, os, strict=True),
              ("q_blocks", "u32", q_blocks), ("total", "u32", total), ("key_end", "u32", key_end),
              ("q_off", "u32", 0), ("k_off", "u32", wq), ("v_off", "u32", wq + wk))
    addr = LaneAddressing(
        row0="", kv_base="b * p.k_sb + kh * p.k_sh + (k0 + i / HD4) * p.k_ss",
        q_row="p.q_off + b * p.q_sb + h * p.q_sh + min(qi{u}, p.q_seq - 1u) * p.q_ss",
        out_row="b * p.o_sb + h * p.o_sh + qi{u} * p.o_ss", rows="p.q_seq",
        mask_row="    let mrow{u} = b * p.m_sb + h * p.m_sh + min(qi{u}, p.q_seq - 1u) * p.m_sq;" if masked else "",
        score="general_score(d{u}_{i}, mask[mrow{u} + k0 + j{i}])" if masked else "general_score(d{u}_{i})",
        score_fn=f"const MASK_SCALE: f32 = {1.4426950408889634 if GENERAL_LANES_EXP2 else 1.0};\n"
        + _LANES_SCORE_FN[mask_dtype if masked else None],
        empty_row="0.0" if a["masked_rows"] == "zero" else "nan_f32()", exp="exp2" if GENERAL_LANES_EXP2 else "exp")
    names = ("qkv",) * 3 if packed else ("q", "k", "v")
    io, out, accessors = attention_io(names, hd)
    rows, lanes, bk, per_lane = tiles
    slots = dict(HEAD_DIM=hd, ROWS=rows, LANES=lanes, BK=bk, PER_LANE=per_lane, K=names[1], V=names[2],
                 KEY_END="p.key_end", TILES_END="p.key_end", MEAN_V="", IO=accessors,
                 **lanes_slots(hd, tiles, False, names[0], False, addr=addr))
    bindings = (*io, *((Buffer("mask", mask_dtype.wgsl),) if masked else ()), out)
    inputs = ((0, 3) if masked else (0,)) if packed else None
    name = (f"attention_lanes_general_hd{hd}_{rows}x{lanes}k{bk}" + (f"p{per_lane}" if per_lane > 1 else "")
            + (f"_mask_{mask_dtype.value}" if masked else "") + ("_packed" if packed else ""))
    return Kernel(name, "attention_lanes.wgsl", total, params=params, slots=slots, bindings=bindings, inputs=inputs)


def _general_kernel(node, ins, target) -> Kernel:
    lanes = general_lanes_tiles(node, ins, target.limits.get("max-compute-workgroup-storage-size",
                                                             ATTENTION_TILE_BYTES))
    if lanes is not None:
        return _general_lanes_kernel(node, ins, lanes)
    d, fields, slots, extra = _common(node, ins, True)
    tiles = general_tiles(d["D"], d["Dv"])
    if tiles is None:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}, v {ins[2]}): head sizes {d['D']} and "
                            f"{d['Dv']} do not fit the kernel's tiles in {GENERAL_TILE_BYTES} bytes of workgroup "
                            "memory (maxComputeWorkgroupStorageSize)")
    bq, bk = tiles
    q_blocks = math.ceil(d["Sq"] / bq)
    total = d["B"] * d["H"] * q_blocks
    dv4 = math.ceil(d["Dv"] / 4)
    packed = node.attrs["packed"]
    vs = layout_strides(unpacked(ins, node.attrs)[2], d["KV"], d["Dv"], packed=ins[0] if packed else None)
    os = layout_strides(node.type, d["H"], d["Dv"])
    wq, wk, _ = packed_widths(ins[0], node.attrs) if packed else (0, 0, 0)
    params = (*fields, *zip(("v_sb", "v_sh", "v_ss", "o_sb", "o_sh", "o_ss"), ("u32",) * 6, vs + os, strict=True),
              ("q_blocks", "u32", q_blocks), ("total", "u32", total),
              ("q_off", "u32", 0), ("k_off", "u32", wq), ("v_off", "u32", wq + wk))
    slots.update(V_DIM=d["Dv"], BQ=bq, BK=bk, WG=GENERAL_WG, NACC=math.ceil(bq * dv4 / GENERAL_WG),
                 IO=_io(d["D"], d["Dv"]))
    vec = ("vec4<f32>" if d["D"] % 4 == 0 else "f32", "vec4<f32>" if d["Dv"] % 4 == 0 else "f32")
    bindings = (Buffer("q", vec[0]), Buffer("k", vec[0]), Buffer("v", vec[1]), *extra,
                Buffer("out", vec[1], write=True))
    name = (f"attention_general_hd{d['D']}_dv{d['Dv']}" + ("_mask" if len(ins) > 3 else "")
            + ("_lens" if len(ins) > 4 else "") + ("_packed" if packed else ""))
    return Kernel(name, "attention_general.wgsl", total, params=params, slots=slots, bindings=bindings)


def _scores_kernel(node, ins, target) -> Kernel:
    d, fields, slots, extra = _common(node, ins, False)
    rows = d["B"] * d["H"] * d["Sq"]
    slots["MODE"] = node.attrs["mode"]
    bindings = (Buffer("q"), Buffer("k"), *extra, Buffer("out", write=True))
    name = f"attention_scores_mode{node.attrs['mode']}" + ("_mask" if len(ins) > 2 else "")
    return Kernel(name, "attention_scores.wgsl", rows, params=(*fields, ("rows", "u32", rows)), slots=slots,
                  bindings=bindings)


_ATTRS = (Attr("scale", "float", doc="multiplies q.k"),
          Attr("num_heads", "int", 0, "query heads of a 3-D q (0: a 4-D q's dim 1)"),
          Attr("kv_num_heads", "int", 0, "kv heads of a 3-D k / v (0: a 4-D k's dim 1)"),
          Attr("softcap", "float", 0.0, "c tanh(s / c) of the scaled scores when > 0"),
          Attr("causal", "bool", False), Attr("offset", "int", 0, "the causal / window offset without kv_lens"),
          Attr("left_window", "int", -1), Attr("right_window", "int", -1),
          Attr("masked_rows", "str", "zero", "a query row without an allowed key: zero (ONNX) or nan (an unguarded "
                                             "softmax)"))


def _general_flops(ins, out, a) -> int:
    d = attention_dims(ins, a)
    return 2 * d["B"] * d["H"] * d["Sq"] * d["Skv"] * (d["D"] + d["Dv"])


op("GeneralAttention", ("q", "k", "v", "mask?", "kv_lens?"), _general_rule, general_attention_ref,
   attrs=(*_ATTRS, Attr("packed", "bool", False, "q, k and v are one [B, S, (H + 2 KV) D] tensor, given three "
                                                 "times: q's columns, then k's, then v's (unpacked)")),
   vjp=_NO_GRAD, kernel=_general_kernel, flops=_general_flops, fallback=True,
   read_bytes=lambda ins, a: sum(t.size_bytes for t in (ins[:1] + ins[3:] if a.get("packed") else ins)),
   doc="ONNX Attention's output Y (https://onnx.ai/onnx/operators/onnx__Attention.html; onnx.reference "
       "_compute_attention) for the present key and value: softmax(softcap(scale q k^T) + bias) v over the "
       "allowed keys (see the module docstring), a zero row where none is allowed (NaN with masked_rows nan); q, k, "
       "v 3-D or 4-D, "
       "v's head size free, output in q's layout")
op("AttentionScores", ("q", "k", "mask?", "kv_lens?"), _scores_rule, attention_scores_ref,
   attrs=(*_ATTRS, Attr("mode", "int", 0)), vjp=_NO_GRAD, kernel=_scores_kernel,
   flops=lambda ins, out, a: 2 * out.num_elements * attention_dims(ins, a, with_v=False)["D"],
   doc="ONNX Attention's qk_matmul_output [B, H, Sq, Skv] of qk_matmul_output_mode ``mode``: 0 scale q k^T, 1 "
       "after the softcap, 2 plus the attention bias (-inf where a key is not allowed), 3 the softmax (zero rows "
       "where no key is allowed, NaN rows with masked_rows nan) (https://onnx.ai/onnx/operators/onnx__Attention.html)")


# --- SplitHeads --------------------------------------------------------------------------------


def _split_heads(ts, a):
    x, nh = ts[0], a["num_heads"]
    need_f32(x, "input")
    need(x.rank == 3, f"input must be 3-D [B, S, heads*D], got {x}")
    need(nh >= 1 and x.shape[2] % nh == 0, f"width {x.shape[2]} of {x} is not a multiple of {nh} heads")
    return TensorType((x.shape[0], nh, x.shape[1], x.shape[2] // nh))


def _split_heads_kernel(node, ins, target) -> Kernel:
    b, nh, s, hd = node.type.shape
    n = node.type.num_elements
    return Kernel("split_heads", "split_heads.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("nh", "u32", nh), ("seq", "u32", s), ("hd", "u32", hd)))


op("SplitHeads", ("x",), _split_heads, lambda xs, a: to_bhsd(xs[0], a["num_heads"]),
   attrs=(Attr("num_heads", "int"),), vjp=_NO_GRAD, kernel=_split_heads_kernel, flops=lambda ins, out, a: 0,
   doc="x [B, S, H*D] -> [B, H, S, D]: out[b, h, s, d] = x[b, s, h*D + d] (reshape then transpose (0, 2, 1, 3), "
       "as ONNX Attention reshapes 3-D inputs)")
