"""Attention: FullAttention, FullAttentionPacked (one packed q/k/v input), CausalAttention,
CausalAttentionRoPE (RoPE inside the kernel), SlidingWindowAttention, CrossAttention and their
gradients, with the rules that move RoPE into the attention kernel and pack the Q/K/V projections.

Rows hold ``batch`` sequences: q [B*S, H*D], k/v [B*S, KV*D]; query head h reads kv head
h // (H / KV) (GQA). Masked scores are set to the finite :data:`MASK_SENTINEL` before the
max-subtracted softmax, so a fully masked row averages all values instead of producing NaN.
Gradient kernels recompute the probabilities (the IR keeps no logsumexp side buffer) and
say in their WGSL header where that makes them slow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..errors import DeviceLimitError, GraphError, LoweringError
from ..kernel import Buffer, Include, Kernel
from ..spec import NO_GRAD, Attr, example, need, need_f32, op, rules
from ..types import DType, TensorType
from .transformer import ROPE_ATTR_NAMES, SCALING, inv_freq, rope_ref, rope_rule

FAMILY = "attention"

#: Sentinel score for masked attention positions (finite, so no inf arithmetic anywhere).
MASK_SENTINEL = -1.0e30
#: What the attention ops with a key_mask give for a query row that keeps no key (their
#: ``masked_rows`` attribute): ``mean``, the mean of v over all the sequence's keys (every score is
#: then :data:`MASK_SENTINEL`, the keys past a causal row's diagonal included: the default, as
#: eggfuse's own graphs and an exporter's additive ``finfo.min`` mask give), or ``zero``, zeros (ONNX
#: Attention's rule for a row without an allowed key, and what SDPA's ``Where(IsNaN(p), 0, p)`` guard
#: makes of a boolean mask). A causal row keeps no key when the mask drops every key up to its own.
MASKED_ROWS = ("mean", "zero")
#: Invocations per workgroup of attention.wgsl.
ATTENTION_WG = 256
#: Query rows per workgroup of attention.wgsl at most.
ATTENTION_MAX_ROWS = 64
#: Bytes of workgroup memory attention.wgsl's tiles take at most (attention_tile_bytes) where the
#: device's limit is not known or the kernel has enough workgroups to fill the GPU
#: (ATTENTION_FULL_GPU), and attention_lanes.wgsl's where the device's limit is not known (lane_tiles):
#: the WebGPU default of maxComputeWorkgroupStorageSize, which every device offers.
ATTENTION_TILE_BYTES = 16384
#: Largest head_dim of the attention kernels: the RoPE uniform holds 32 vec4 of frequencies
#: (128 pairs), and CachedAttention needs head_dim / 4 <= its 256 invocations.
MAX_ATTENTION_HEAD_DIM = 256
#: Rows (query rows for dq, key rows for dk / dv) per workgroup of the attention gradients
#: and of the windowed attention kernels.
ATTENTION_GRAD_ROWS = 64


def check_head_dim(node, q: TensorType) -> None:
    """LoweringError when the node's head_dim is above the kernels' maximum."""
    hd = node.attrs["head_dim"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {q}): head_dim {hd} is above the kernel's maximum of "
                            f"{MAX_ATTENTION_HEAD_DIM}")


# --- the reference -----------------------------------------------------------------------------


def check_heads(q: TensorType, k: TensorType, v: TensorType, a) -> None:
    """q [rows, H*D], k and v [rows, KV*D] (2-D f32), H a multiple of KV."""
    nh, nkv, hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    for t, w, what in ((q, nh * hd, "q"), (k, nkv * hd, "k"), (v, nkv * hd, "v")):
        need_f32(t, what)
        need(t.rank == 2 and t.shape[1] == w, f"{what} must be [rows,{w}], got {t}")
    need(nkv >= 1 and nh % nkv == 0, f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")


#: The dtypes a forward attention's key_mask may have, and which of its values keep a key: f32 where > 0
#: (eggfuse's own 1 / 0 masks), i32 where != 0 and bool where true (an exporter's padding mask as
#: Cast(mask, bool) reads it, without the cast to f32; rule in attention_layout.py).
KEY_MASK_DTYPES = (DType.F32, DType.I32, DType.BOOL)


def key_kept(mask: np.ndarray) -> np.ndarray:
    """The keys a key_mask keeps (bool, its shape): :data:`KEY_MASK_DTYPES`' rule for its dtype."""
    return mask > 0 if mask.dtype.kind == "f" else mask != 0


def key_dropped_wgsl(value: str, dtype: DType) -> str:
    """WGSL bool of a key_mask element ``value`` (its storage type, DType.wgsl) that drops the key."""
    return {DType.F32: f"{value} <= 0.0", DType.I32: f"{value} == 0i", DType.BOOL: f"{value} == 0u"}[dtype]


def attention_rule(ts, a):
    """Shape rule of FullAttention / CausalAttention: q [rows, H*D], k and v [rows, KV*D], an
    optional key_mask [batch, seq] (f32, i32 or bool: :data:`KEY_MASK_DTYPES`)."""
    q, k, v = ts[:3]
    nh, hd, batch = a["num_heads"], a["head_dim"], a["batch"]
    check_heads(q, k, v, a)
    need(k.shape[0] == q.shape[0] and v.shape[0] == q.shape[0],
         f"q {q}, k {k} and v {v} must have the same number of rows")
    need(batch >= 1 and q.shape[0] % batch == 0, f"{q.shape[0]} rows do not split into {batch} sequences")
    if len(ts) == 4:
        seq = q.shape[0] // batch
        need(ts[3].dtype in KEY_MASK_DTYPES, f"key_mask must be f32, i32 or bool, got {ts[3]}")
        need(ts[3].shape == (batch, seq), f"key_mask must be [{batch},{seq}], got {ts[3]}")
    need(a.get("masked_rows", "mean") in MASKED_ROWS,
         f"masked_rows must be one of {MASKED_ROWS}, got {a.get('masked_rows')!r}")
    return TensorType((q.shape[0], nh * hd))


def attention_reference(q, k, v, a, causal: bool, key_mask=None) -> np.ndarray:
    """Scaled dot-product attention per sequence and head, GQA and key masking.

    Query head h reads kv head h // (num_heads / num_kv_heads). Masked scores are set to
    the finite :data:`MASK_SENTINEL` before the max-subtracted softmax, so a fully masked
    row averages all values instead of producing NaN (Vaswani et al. 2017, eq. 1), or with
    ``masked_rows`` ``zero`` is zero (:data:`MASKED_ROWS`). ``causal`` masks the keys past a
    row's diagonal the same way: a causal row that the key mask leaves no key of its own
    averages the values of every key of its sequence. ``key_mask`` keeps keys as
    :func:`key_kept` says for its dtype.
    """
    zero = a.get("masked_rows", "mean") == "zero"
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a.get("batch", 1)
    seq = q.shape[0] // batch
    group = nh // nkv
    out = np.zeros((q.shape[0], nh * hd))
    scale = 1.0 / math.sqrt(hd)
    for b in range(batch):
        rows = slice(b * seq, (b + 1) * seq)
        for h in range(nh):
            kh = h // group
            qh = q[rows, h * hd:(h + 1) * hd]
            kk = k[rows, kh * hd:(kh + 1) * hd]
            vv = v[rows, kh * hd:(kh + 1) * hd]
            s = (qh @ kk.T) * scale
            keep = np.ones_like(s, dtype=bool)
            if causal:
                keep &= np.tril(np.ones((seq, seq), dtype=bool))
            if key_mask is not None:
                keep &= key_kept(key_mask[b])[None, :]
            s = np.where(keep, s, MASK_SENTINEL)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            if zero:
                p[~keep.any(axis=-1)] = 0.0
            out[rows, h * hd:(h + 1) * hd] = p @ vv
    return out


def attention_grads(do, q, k, v, a, causal: bool, key_mask=None):
    """(dq, dk, dv) of :func:`attention_reference`, probabilities recomputed.

    Per sequence and head, with P = softmax(mask(scale q k^T)): dV = P^T dO,
    dS = P * (dO V^T - rowsum(P * dO V^T)) zeroed at masked scores (they are constants),
    dQ = scale dS K, dK = scale dS^T Q. A kv head's dK and dV sum over the query heads of
    its GQA group (FlashAttention-2 backward, Dao 2023, Algorithm 2, without tiling).
    """
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    seq = q.shape[0] // batch
    group = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(batch):
        rows = slice(b * seq, (b + 1) * seq)
        for h in range(nh):
            qc, kc = slice(h * hd, (h + 1) * hd), slice((h // group) * hd, (h // group + 1) * hd)
            qh, kh, vh, doh = q[rows, qc], k[rows, kc], v[rows, kc], do[rows, qc]
            keep = np.ones((seq, seq), dtype=bool)
            if causal:
                keep &= np.tril(keep)
            if key_mask is not None:
                keep &= (key_mask[b] > 0)[None, :]
            s = np.where(keep, (qh @ kh.T) * scale, MASK_SENTINEL)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            dp = doh @ vh.T
            ds = np.where(keep, p * (dp - (p * dp).sum(axis=-1, keepdims=True)), 0.0)
            dv[rows, kc] += p.T @ doh
            dq[rows, qc] = scale * ds @ kh
            dk[rows, kc] += scale * ds.T @ qh
    return dq, dk, dv


# --- the forward kernel ------------------------------------------------------------------------

#: The uniform fields attention_qk_rope.wgsl reads (they come first: the array is 16-byte
#: aligned). pos_offset is not among them: it cancels out of every score (see that file).
def rope_uniform_fields(node) -> tuple:
    a = node.attrs
    return (("inv_freq", f"array<vec4<f32>, {MAX_ATTENTION_HEAD_DIM // 8}>", inv_freq(a, MAX_ATTENTION_HEAD_DIM // 2)),
            ("adjacent", "u32", int(a["pairing"] == "adjacent")))


def attention_io(names: tuple[str, ...], hd: int, vec: bool | None = None) -> tuple[tuple[Buffer, ...], Buffer, str]:
    """The storage bindings of the attention inputs ``names`` (one per distinct name) and of the
    output, and the accessors attention kernels read through.

    ``NAME4(base, c)`` is vec4 ``c`` of the HD-element row starting at element ``base`` (zero
    past HD); ``store_out(base, c, v)`` writes vec4 ``c`` of an output row. When ``hd % 4 ==
    0`` every row start is a multiple of 4 elements and the arrays are bound as
    ``array<vec4<f32>>`` (one 16-byte load per vec4); otherwise as ``array<f32>``, read
    element by element. ``vec=False`` asks for the element form whatever ``hd`` (a caller
    whose row starts are not all multiples of 4).
    """
    vec = hd % 4 == 0 and vec is not False
    elem = "vec4<f32>" if vec else "f32"
    lines = [f"const VW: u32 = {4 if vec else 1}u;  // elements per array entry"]
    unique = list(dict.fromkeys(names))
    for n in unique:
        if vec:
            lines.append(f"fn {n}4(base: u32, c: u32) -> vec4<f32> {{ return {n}[base / 4u + c]; }}")
        else:
            lines += [f"fn {n}4(base: u32, c: u32) -> vec4<f32> {{",
                      "    var r = vec4<f32>();",
                      "    for (var e = 0u; e < 4u; e = e + 1u) {",
                      f"        if (4u * c + e < HD) {{ r[e] = {n}[base + 4u * c + e]; }}",
                      "    }",
                      "    return r;",
                      "}"]
    lines.append(store_accessor("out", vec))
    return tuple(Buffer(n, elem) for n in unique), Buffer("out", elem, write=True), "\n".join(lines)


def store_accessor(name: str, vec: bool) -> str:
    """WGSL ``store_NAME(base, c, v)``: writes vec4 ``c`` of the HD-element row of binding
    ``name`` starting at element ``base`` (elements past HD are not written; see
    :func:`attention_io` for the two forms)."""
    if vec:
        return f"fn store_{name}(base: u32, c: u32, v: vec4<f32>) {{ {name}[base / 4u + c] = v; }}"
    return "\n".join([f"fn store_{name}(base: u32, c: u32, v: vec4<f32>) {{",
                      "    for (var e = 0u; e < 4u; e = e + 1u) {",
                      f"        if (4u * c + e < HD) {{ {name}[base + 4u * c + e] = v[e]; }}",
                      "    }",
                      "}"])


def attention_tile_bytes(hd: int, bq: int, bk: int, wg: int = ATTENTION_WG) -> int:
    """Workgroup memory of attention.wgsl for head size ``hd``, ``bq`` query rows, ``bk`` keys
    per tile and ``wg`` invocations: the Q block, the K tile (rows padded by one vec4) and the V
    tile at 16 bytes per vec4, then the weights, the lanes' partials (wg / bq per row) and three
    f32 statistics per row."""
    hd4 = math.ceil(hd / 4)
    return 16 * (bq * hd4 + bk * (hd4 + 1) + bk * hd4) + 4 * (bq * bk + bq * (wg // bq) + 3 * bq)


def attention_rows(hd: int, wg: int = ATTENTION_WG) -> int:
    """BQ, the query rows per workgroup of ``wg`` invocations of attention.wgsl for head size
    ``hd``: wg / ceil(hd / 4), at most ATTENTION_MAX_ROWS (each invocation owns one vec4 of the
    output block)."""
    return max(1, min(ATTENTION_MAX_ROWS, wg // math.ceil(hd / 4)))


#: Workgroups of attention.wgsl from which its tiles keep to ATTENTION_TILE_BYTES even where the
#: device offers more workgroup memory: enough of them fill the GPU, and smaller tiles let more of
#: them reside on each multiprocessor. On an H200 (bench/attention.py, bench/results/attention_h200.json)
#: MiniLM's 384 workgroups took 37.6 us with 16-key tiles and 45.8 us with 64-key tiles (48 KiB), and
#: SmolLM2's 128-row prefill, 72 workgroups, 34.9 us with 16-key tiles and 20.3 us with 64.
ATTENTION_FULL_GPU = 256


class AttentionTiles(NamedTuple):
    """The work split of attention.wgsl: ``wg`` invocations per workgroup, ``bq`` query rows
    per workgroup, ``bk`` keys per tile."""

    wg: int
    bq: int
    bk: int


def attention_tiles(hd: int, storage: int = ATTENTION_TILE_BYTES,
                    workgroups_at: Callable[[int], int] | None = None) -> AttentionTiles:
    """The :class:`AttentionTiles` of attention.wgsl for head size ``hd``.

    WG = ATTENTION_WG invocations; BQ = WG / ceil(hd / 4) (at most ATTENTION_MAX_ROWS), so that
    each invocation owns one vec4 of the output block; BK the most keys, a power of two from 4 to
    64, whose tiles fit the workgroup memory (:func:`attention_tile_bytes`): ``storage``
    bytes (the device's maxComputeWorkgroupStorageSize) when the kernel has fewer than
    :data:`ATTENTION_FULL_GPU` workgroups (``workgroups_at(bq)``: its workgroups at BQ rows each;
    None: not known), else ATTENTION_TILE_BYTES. At 16 KiB: hd 64: (16, 16); hd 32: (32, 16);
    hd 256: (4, 4); with an H200's 48 KiB, hd 64 and 32 take 64-key tiles: a quarter of the
    tiles, barriers and K and V loads per query block. Smaller workgroups (more of them, as many
    invocations a row) on the H200 (bench/attention.py, bench/results/attention_h200.json, their
    best BK each): SmolLM2's prefill took 20.3 us with 256 invocations, 28.5 with 128 and 44.8
    with 64; MiniLM's 37.6, 36.3 and 52.4 (128 was 2.2% faster with the previous kernel too,
    attention_variants_h200/indexed_2d_before.json: 8 us of a 1.6 ms batch, one shape, not taken). Raises
    LoweringError when even 4-key tiles do not fit ``storage`` (a head_dim above 256 or a device
    below WebGPU's 16 KiB).
    """
    wg = ATTENTION_WG
    bq = attention_rows(hd, wg)
    if workgroups_at is not None and workgroups_at(bq) >= ATTENTION_FULL_GPU:
        storage = min(storage, ATTENTION_TILE_BYTES)
    bk = 64
    while bk > 4 and attention_tile_bytes(hd, bq, bk, wg) > storage:
        bk //= 2
    if attention_tile_bytes(hd, bq, bk, wg) > storage:
        raise DeviceLimitError(f"attention with head_dim {hd} needs {attention_tile_bytes(hd, bq, bk, wg)} bytes of "
                               f"workgroup memory for its smallest tiles ({bq} query rows, {bk} keys); this device "
                               f"offers {storage} (maxComputeWorkgroupStorageSize): use a smaller head_dim")
    return AttentionTiles(wg, bq, bk)


def _score_dots(wg: int, bq: int, bk: int) -> str:
    """attention.wgsl's SCORE_DOTS: a lane's KPT = ceil(bk / (wg / bq)) dot products of its row of
    q_tile with keys st, st + TPR, ... of k_tile, side by side in named accumulators over one loop
    of the row's quads, then stored into ``scores``. Unrolled here: written as a loop over
    ``scores`` inside the loop over the quads, it ran slower on the H200 than one key after
    another (SmolLM2's prefill attention 31.5 us against 27.3, in another call); unrolled, 20.9 (against
    27.2 in the same call)."""
    kpt = math.ceil(bk / (wg // bq))
    lines = [f"            var d{i} = 0.0;" for i in range(kpt)]
    lines += ["            for (var c = 0u; c < HD4; c = c + 1u) {",
              "                let qc = q_tile[sr][c];"]
    lines += [f"                d{i} = d{i} + dot(qc, k_tile[min(st + {i}u * TPR, BK - 1u)][c]);"
              for i in range(kpt)]
    lines.append("            }")
    lines += [f"            scores[{i}] = d{i};" for i in range(kpt)]
    return "\n".join(lines)


#: Largest head_dim for which the lowering takes attention_lanes.wgsl (lane_tiles): a lane holds q and its
#: output row in registers (2 * head_dim / 4 vec4s). On the H200 (bench/attention.py,
#: bench/results/attention_lanes_h200/sweep.json, every split) its best at head_dim 32 (MiniLM: 8 x 128 rows,
#: 12 heads, a key mask) took 18.0 us against attention.wgsl's best 25.6 (SDPA fp32: 27.7); at head_dim 64
#: (128 causal rows, 9 heads on 3) 12.1 against 10.7, with RoPE 21.0 against 15.9: there attention.wgsl.
LANES_MAX_HEAD_DIM = 32
#: Above LANES_MAX_HEAD_DIM and up to this head_dim the lowering takes attention_lanes.wgsl for
#: LANES_WIDE_OPS where it has many workgroups (LANES_WIDE_MIN_WORKGROUPS) at its full split (LANES_ROWS rows).
#: On an H100 (bench/attention.py, bench/results/attention_hd64_h100/attention_hd64.json, every split), at
#: 8 x 128 rows and 12 heads of 64 (192 workgroups of 64 rows): GPT-2's CausalAttention with an i32 key mask took
#: 33.1 us at (64, 2, 16) against attention.wgsl's default 41.0 and its best 39.4 (SDPA fp32, one boolean mask:
#: 33.7); BERT-base's FullAttention with a key mask 41.2 against 54.9 (SDPA: 31.6). On an H200 (attention_hd64_h200/
#: attention_threshold.json) GPT-2's attention at batch 4 (96 workgroups) took 22.4 against 24.9, at batch 2 (48)
#: 15.6 with attention.wgsl against lanes' best 18.1, at batch 1 10.9 against SDPA's 23.0; SmolLM2's 128 causal rows
#: of 9 heads on 3 (18 workgroups) ran slower there (12.1 against 10.7 us, above). In GPT-2 small's exported plan at
#: 8 x 128 tokens on an H100, 6,545-6,566 us GPU against 6,593-6,601 with attention.wgsl (three alternated rounds,
#: attention_hd64_h100/ab_lanes_gpt2_rule.json).
LANES_WIDE_MAX_HEAD_DIM = 64
LANES_WIDE_MIN_WORKGROUPS = 96
LANES_WIDE_OPS = ("FullAttention", "FullAttentionPacked", "CausalAttention")
#: attention_lanes.wgsl's split where the memory allows (lane_tiles): query rows per workgroup, lanes per
#: row and keys per tile. MiniLM's plan, alternated (bench/plan_ab.py, attention_lanes_h200/ab_minilm.json):
#: 1112.1-1112.3 us GPU at (64, 2, 16), 1113.7-1121.0 at (32, 2, 32), 1184.0-1187.8 at (32, 4, 32) and
#: 1144.6-1148.0 with attention.wgsl.
LANES_ROWS = 64
LANES_PER_ROW = 2
LANES_MAX_KEYS = 16
#: The ops the lowering puts on attention_lanes.wgsl (up to LANES_MAX_HEAD_DIM): those measured there,
#: MiniLM's. The kernel also takes CausalAttention and CausalAttentionRoPE (tests/gpu/test_attention_lanes.py);
#: at head_dim 32 (4 x 128 rows, 8 heads on 2) attention.wgsl was faster on an H200, 10.1 against 10.7 us causal
#: and 12.1 against 14.4 with RoPE, the lanes' best of five splits (bench/results/attention_hd64_h200/
#: attention_threshold.json), so attention.wgsl keeps them.
LANES_OPS = ("FullAttention", "FullAttentionPacked")


class LaneTiles(NamedTuple):
    """The work split of attention_lanes.wgsl: ``rows`` query rows per workgroup, ``lanes``
    invocations per row (a power of two), ``bk`` keys per tile (a multiple of ``lanes``), and
    ``per_lane`` rows each invocation holds (dividing ``rows``): rows / per_lane * lanes
    invocations."""

    rows: int
    lanes: int
    bk: int
    per_lane: int = 1


def lane_tile_bytes(hd: int, tiles: LaneTiles, rope: bool = False) -> int:
    """Workgroup memory of attention_lanes.wgsl: the K and V tiles (rows padded by one vec4) at 16
    bytes per vec4, the merge buffer (rows * max(lanes / 2, 1) output rows) and with
    ``rope`` the Q block (rows), then the tile's mask flags and two f32 statistics per row and
    lane, each of these three arrays rounded up to 16 bytes (WebGPU sizes a workgroup variable in
    multiples of 16)."""
    hd4, (rows, lanes, bk, _) = math.ceil(hd / 4), tiles
    q_block = rows * hd4 if rope else 0

    def f32s(n: int) -> int:
        return 16 * math.ceil(4 * n / 16)

    return 16 * (2 * bk * (hd4 + 1) + rows * max(lanes // 2, 1) * hd4 + q_block) + f32s(bk) + 2 * f32s(rows * lanes)


def lane_split_ok(tiles: LaneTiles) -> bool:
    """Whether attention_lanes.wgsl can take ``tiles``: lanes a power of two dividing the keys per
    tile, rows a multiple of the rows per lane, at most 256 invocations (WebGPU's default
    maxComputeInvocationsPerWorkgroup)."""
    rows, lanes, bk, per_lane = tiles
    return (lanes >= 1 and not lanes & (lanes - 1) and bk >= lanes and bk % lanes == 0 and per_lane >= 1
            and rows % per_lane == 0 and rows // per_lane * lanes <= 256)


def lane_tiles(hd: int, storage: int = ATTENTION_TILE_BYTES, rope: bool = False) -> LaneTiles | None:
    """The :class:`LaneTiles` of attention_lanes.wgsl for head size ``hd``, or None where it cannot run
    (``hd`` above :data:`LANES_MAX_HEAD_DIM` and :data:`LANES_WIDE_MAX_HEAD_DIM`, or no tiles fit; whether
    the lowering takes it is :func:`takes_lanes`'s):
    :data:`LANES_PER_ROW` lanes a row, the most rows (:data:`LANES_ROWS`, half or a quarter of
    it), then the most keys per tile (:data:`LANES_MAX_KEYS` down to an eighth, at least one a
    lane) that the kernel takes (:func:`lane_split_ok`) and whose memory (:func:`lane_tile_bytes`,
    with the Q block for ``rope``) fits ``storage`` bytes (the device's
    maxComputeWorkgroupStorageSize). The lowering takes it as :func:`takes_lanes` says."""
    if hd > max(LANES_MAX_HEAD_DIM, LANES_WIDE_MAX_HEAD_DIM):
        return None
    lanes = LANES_PER_ROW
    for rows in (LANES_ROWS, max(LANES_ROWS // 2, 1), max(LANES_ROWS // 4, 1)):
        for bk in (LANES_MAX_KEYS, LANES_MAX_KEYS // 2, LANES_MAX_KEYS // 4, LANES_MAX_KEYS // 8):
            tiles = LaneTiles(rows, lanes, bk)
            if lane_split_ok(tiles) and lane_tile_bytes(hd, tiles, rope) <= storage:
                return tiles
    return None


def takes_lanes(op: str, hd: int, tiles: LaneTiles | None, workgroups: int) -> bool:
    """Whether the lowering puts ``op`` at head size ``hd`` on attention_lanes.wgsl at ``tiles`` (:func:`lane_tiles`;
    None: no split fits), which gives ``workgroups`` workgroups: :data:`LANES_OPS` up to :data:`LANES_MAX_HEAD_DIM`;
    :data:`LANES_WIDE_OPS` above that and up to :data:`LANES_WIDE_MAX_HEAD_DIM` at :data:`LANES_ROWS` rows a workgroup
    and at least :data:`LANES_WIDE_MIN_WORKGROUPS` workgroups."""
    if tiles is None:
        return False
    if hd <= LANES_MAX_HEAD_DIM and op in LANES_OPS:
        return True
    return (LANES_MAX_HEAD_DIM < hd <= LANES_WIDE_MAX_HEAD_DIM and op in LANES_WIDE_OPS and tiles.rows == LANES_ROWS
            and workgroups >= LANES_WIDE_MIN_WORKGROUPS)


class LaneAddressing(NamedTuple):
    """Where attention_lanes.wgsl finds its rows: WGSL text, ``{u}`` standing for the lane's row index u < P
    (row ``qi{u}``). ``row0``: the ROW0 statement (the first row of the (sequence, head)); ``kv_base``: the
    KV_BASE expression (key ``k0 + i / HD4``'s row in k and v before ``p.k_off`` / ``p.v_off``); ``q_row`` and
    ``out_row``: the element where row ``qi{u}``'s q and output start; ``rows``: the query rows of the sequence.
    GeneralAttention's (ir/ops/attention_general.py) adds ``mask_row``, a statement per row of its mask's row
    base, ``score``, the expression of an allowed key's score (``d{u}_{i}`` the log2-scaled q.k of key ``j{i}``),
    ``score_fn``, WGSL functions it calls, and ``empty_row``, the output of a row without an allowed key
    (then ``lr > 0`` decides, as attention_general.wgsl does, instead of the MASK_SENTINEL test); ``exp``: the
    weights' exponential, ``exp2`` of log2(e)-scaled scores or ``exp`` of the scores as they are."""

    row0: str
    kv_base: str
    q_row: str
    out_row: str
    rows: str
    mask_row: str = ""
    score: str = ""
    score_fn: str = ""
    empty_row: str = ""
    exp: str = "exp2"


#: FullAttention's rows: ``batch`` sequences of ``p.seq`` rows, q [rows, nh * HD] (``p.q_stride`` apart), k and v
#: [rows, nkv * HD] (``p.kv_stride``), out [rows, nh * HD].
FULL_ADDRESSING = LaneAddressing(row0="    let row0 = b * p.seq;",
                                 kv_base="(row0 + k0 + i / HD4) * p.kv_stride + kh * HD",
                                 q_row="(row0 + min(qi{u}, p.seq - 1u)) * p.q_stride + h * HD",
                                 out_row="(row0 + qi{u}) * p.nh * HD + h * HD", rows="p.seq")


def lanes_slots(hd: int, tiles: LaneTiles, masked: bool, q: str, rope: bool, zero_rows: bool = False,
                 mean_rows: bool = False, mask_dtype: DType = DType.F32,
                 addr: LaneAddressing = FULL_ADDRESSING) -> dict[str, str]:
    # attention_lanes.wgsl's unrolled statements over named registers: of row u < P, q's quads qv{u}_{c} and the
    # output's ov{u}_{c} (c < hd4), the running m{u} and l{u}, the scores d{u}_{i} of the lane's keys
    # j{i} = lane + i * L (i < BK / L)
    hd4, kpl = math.ceil(hd / 4), tiles.bk // tiles.lanes
    quads, keys, us = range(hd4), range(kpl), range(tiles.per_lane)
    i8, i12 = " " * 8, " " * 12
    setup = []
    for u in us:
        setup += [f"    let r{u} = g * P + {u}u;",
                  f"    let qi{u} = q0 + r{u};",
                  f"    let key_end{u} = key_end_of(qi{u});",
                  f"    let qbase{u} = {addr.q_row.format(u=u)};"]
        if addr.mask_row:
            setup.append(addr.mask_row.format(u=u))
        setup += [f"    let qv{u}_{c} = " + (f"q_tile[r{u}][{c}u]" if rope else f"{q}4(qbase{u}, {c}u)") + " * qs;"
                  for c in quads]
        setup += [f"    var ov{u}_{c} = vec4<f32>();" for c in quads]
        setup += [f"    var m{u} = MAX_INIT;", f"    var l{u} = 0.0;"]
    dots = [f"{i8}let j{i} = lane + {i}u * L;" for i in keys]
    dots += [f"{i8}var d{u}_{i} = 0.0;" for u in us for i in keys]
    for c in quads:
        for i in keys:
            dots.append(f"{i8}{{ let kq = k_tile[j{i}][{c}u]; "
                        + " ".join(f"d{u}_{i} = d{u}_{i} + dot(qv{u}_{c}, kq);" for u in us) + " }")
    pv = [f"{i8}let km{i} = k_masked[j{i}] > 0.0;" for i in keys] if masked else []
    for u in us:
        for i in keys:
            pv += [f"{i8}var s{u}_{i} = MAX_INIT;",
                   f"{i8}if (j{i} < nk && k0 + j{i} < key_end{u}) {{",
                   f"{i8}    s{u}_{i} = " + (f"select(d{u}_{i}, MASK_SENTINEL, km{i});" if masked
                                             else addr.score.format(u=u, i=i) + ";" if addr.score else f"d{u}_{i};"),
                   f"{i8}}}"]
        smax = f"s{u}_{kpl - 1}"
        for i in reversed(range(kpl - 1)):
            smax = f"max(s{u}_{i}, {smax})"
        pv += [f"{i8}let mt{u} = max(m{u}, {smax});",
               f"{i8}let corr{u} = {addr.exp}(m{u} - mt{u});",
               f"{i8}m{u} = mt{u};"]
        pv += [f"{i8}let w{u}_{i} = weight(s{u}_{i}, mt{u});" for i in keys]
        pv.append(f"{i8}l{u} = l{u} * corr{u} + ({' + '.join(f'w{u}_{i}' for i in keys)});")
        pv += [f"{i8}ov{u}_{c} = ov{u}_{c} * corr{u};" for c in quads]
    for c in quads:
        for i in keys:
            pv.append(f"{i8}{{ let vq = v_tile[j{i}][{c}u]; "
                      + " ".join(f"ov{u}_{c} = ov{u}_{c} + w{u}_{i} * vq;" for u in us) + " }")
    mask_load = ""
    if masked:
        mask_load = "\n".join([
            "        for (var i = li; i < BK; i = i + WG) {",
            "            k_masked[i] = select(0.0, 1.0, k0 + i < p.seq && "
            f"{key_dropped_wgsl('key_mask[b * p.seq + k0 + i]', mask_dtype)});",
            "        }"])
    stats = [f"    lane_m[r{u} * L + lane] = m{u};" for u in us] + ["    workgroupBarrier();"]
    for u in us:
        stats += [f"    var mr{u} = MAX_INIT;",
                  "    for (var t = 0u; t < L; t = t + 1u) {",
                  f"        mr{u} = max(mr{u}, lane_m[r{u} * L + t]);",
                  "    }",
                  f"    let f{u} = {addr.exp}(m{u} - mr{u});  // 0 for a lane that saw no key; 1 where no lane did",
                  f"    lane_l[r{u} * L + lane] = l{u} * f{u};"]
        stats += [f"    ov{u}_{c} = ov{u}_{c} * f{u};" for c in quads]
    store = []
    for u in us:
        store += [f"{i8}if (qi{u} < {addr.rows}) {{",
                  f"{i12}var lr = 0.0;",
                  f"{i12}for (var t = 0u; t < L; t = t + 1u) {{",
                  f"{i12}    lr = lr + lane_l[r{u} * L + t];",
                  f"{i12}}}",
                  f"{i12}let inv = " + (f"select(1.0 / lr, 0.0, mr{u} <= MASK_SENTINEL);  // no key kept: zeros"
                                        if zero_rows else "1.0 / lr;"),
                  f"{i12}let obase = {addr.out_row.format(u=u)};"]
        if addr.empty_row:  # GeneralAttention: a row without an allowed key, or whose sum is NaN
            store += [f"{i12}store_out(obase, {c}u, select(vec4<f32>({addr.empty_row}), ov{u}_{c} * inv, lr > 0.0));"
                      for c in quads]
        elif mean_rows:  # a causal row that keeps no key: the mean of all the sequence's v rows
            store += [f"{i12}if (mr{u} <= MASK_SENTINEL) {{"]
            store += [f"{i12}    store_out(obase, {c}u, mean_v(row0, kh, {c}u));" for c in quads]
            store += [f"{i12}}} else {{"]
            store += [f"{i12}    store_out(obase, {c}u, ov{u}_{c} * inv);" for c in quads]
            store += [f"{i12}}}"]
        else:
            store += [f"{i12}store_out(obase, {c}u, ov{u}_{c} * inv);" for c in quads]
        store.append(f"{i8}}}")
    q_prepare = "\n".join([
        "    for (var i = li; i < R * HD4; i = i + WG) {",
        "        let qi = q0 + i / HD4;",
        "        var v = vec4<f32>();",
        "        if (qi < p.seq) {",
        f"            v = {q}4((row0 + qi) * p.q_stride + h * HD, i % HD4);",
        "        }",
        "        q_tile[i / HD4][i % HD4] = v;",
        "    }",
        "    workgroupBarrier();",
        "    prepare_q_tile(li, q0);"]) if rope else ""
    return dict(ROW0=addr.row0, KV_BASE=addr.kv_base, SCORE_FN=addr.score_fn, EXP=addr.exp,
                LOG2E="1.4426950408889634" if addr.exp == "exp2" else "1.0",
                Q_TILE="const BQ: u32 = R;\nvar<workgroup> q_tile: array<array<vec4<f32>, HD4>, BQ>;" if rope else "",
                QK=Include("attention_qk_rope.wgsl") if rope else "", Q_PREPARE=q_prepare,
                K_PREPARE="        prepare_k_tile(li, k0, nk);" if rope else "",
                ROW_SETUP="\n".join(setup), SCORE_DOTS="\n".join(dots), SOFTMAX_PV="\n".join(pv),
                MASK_LOAD=mask_load, MERGE_STATS="\n".join(stats),
                REDUCE_WRITE="\n".join(f"{i12}merge[r{u} * HALF + lane - step][{c}u] = ov{u}_{c};"
                                       for u in us for c in quads),
                REDUCE_ADD="\n".join(f"{i12}ov{u}_{c} = ov{u}_{c} + merge[r{u} * HALF + lane][{c}u];"
                                     for u in us for c in quads),
                STORE="\n".join(store))


class _Form(NamedTuple):
    """What both attention kernels need to know of a node: its heads, rows and inputs."""

    nh: int
    nkv: int
    hd: int
    batch: int
    seq: int
    masked: bool  # a key_mask input
    mask_dtype: DType  # its dtype (KEY_MASK_DTYPES; F32 when there is none)
    packed: bool  # one [rows, (nh + 2 nkv) * hd] projection: q, k, v side by side
    causal: bool
    rope: bool
    names: tuple[str, str, str]  # the bindings q, k and v are read from
    zero_rows: bool  # masked_rows "zero": a row whose mask keeps no key is stored as zeros
    mean_rows: bool  # causal, masked_rows "mean": such a row is stored as the mean of all its sequence's v rows


def _form(node, ins) -> _Form:
    a = node.attrs
    causal = node.op not in ("FullAttention", "FullAttentionPacked")
    packed = node.op == "FullAttentionPacked" or (causal and len(ins) in (1, 2))
    masked = len(ins) == (2 if packed else 4)
    mean = a.get("masked_rows", "mean") == "mean"
    return _Form(a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"], ins[0].shape[0] // a["batch"],
                 masked, ins[-1].dtype if masked else DType.F32, packed, causal, node.op == "CausalAttentionRoPE",
                 ("qkv",) * 3 if packed else ("q", "k", "v"), masked and not mean, masked and mean and causal)


def _mean_v(f: _Form) -> str:
    # both kernels' MEAN_V slot: for a causal row whose key_mask keeps none of its keys (masked_rows "mean"), the
    # mean of v over all the sequence's keys (every other score is MASK_SENTINEL too: the reference's uniform row)
    if not f.mean_rows:
        return ""
    return "\n".join([
        "fn mean_v(row0: u32, kh: u32, c: u32) -> vec4<f32> {",
        "    var sum = vec4<f32>();",
        "    for (var j = 0u; j < p.seq; j = j + 1u) {",
        f"        sum = sum + {f.names[2]}4((row0 + j) * p.kv_stride + kh * HD + p.v_off, c);",
        "    }",
        "    return sum / f32(p.seq);",
        "}"])


def _attention_dispatch(node, f: _Form, body: str, rows: int, name: str, slots: dict) -> Kernel:
    # attention.wgsl's or attention_lanes.wgsl's dispatch at `rows` query rows per workgroup: the bindings (with
    # the IO slot of their accessors) and the Params both read, RoPE's fields first
    io, out, accessors = attention_io(f.names, f.hd)
    q_blocks = math.ceil(f.seq / rows)
    total = f.batch * f.nh * q_blocks
    width = (f.nh + 2 * f.nkv) * f.hd
    strides = (width, width, f.nh * f.hd, (f.nh + f.nkv) * f.hd) if f.packed else (f.nh * f.hd, f.nkv * f.hd, 0, 0)
    params = (*(rope_uniform_fields(node) if f.rope else ()), ("seq", "u32", f.seq), ("nh", "u32", f.nh),
              ("nkv", "u32", f.nkv), ("group", "u32", f.nh // f.nkv), ("q_blocks", "u32", q_blocks),
              ("total", "u32", total), ("scale", "f32", 1.0 / math.sqrt(f.hd)),
              *zip(("q_stride", "kv_stride", "k_off", "v_off"), ("u32",) * 4, strides, strict=True))
    name += (("_causal" if f.causal else "") + ("_mask" if f.masked else "")
             + (f"_{f.mask_dtype.value}" if f.masked and f.mask_dtype is not DType.F32 else "")
             + ("_zero" if f.zero_rows else "")
             + ("_mean" if f.mean_rows else "")
             + ("_rope" if f.rope else "") + ("_packed" if f.packed else ""))
    bindings = (*io, *((Buffer("key_mask", f.mask_dtype.wgsl),) if f.masked else ()), out)
    return Kernel(name, body, total, params=params, slots={**slots, "IO": accessors}, bindings=bindings)


def _lanes_kernel(node, ins, tiles: LaneTiles, storage: int) -> Kernel:
    # attention_lanes.wgsl for FullAttention, FullAttentionPacked, CausalAttention and CausalAttentionRoPE
    f = _form(node, ins)
    hd = f.hd
    rows, lanes, bk, per_lane = tiles
    what = f"{node.op} (node {node.id}, q {ins[0]}, {f.nh} heads of {hd})"
    if not lane_split_ok(tiles):
        raise LoweringError(f"{what}: attention_lanes.wgsl cannot take the split {tiles} given by lane_tiles: lanes "
                            f"must be a power of two dividing the keys per tile, rows a multiple of the rows per "
                            f"lane, and rows / per_lane * lanes at most 256 invocations; force a split that is, or "
                            f"leave the choice to lane_tiles")
    if (size := lane_tile_bytes(hd, tiles, f.rope)) > storage:
        raise DeviceLimitError(f"{what}: attention_lanes.wgsl at the split {tiles} given by lane_tiles needs {size} "
                               f"bytes of workgroup memory; this device offers {storage} "
                               f"(maxComputeWorkgroupStorageSize): force fewer rows or keys per tile, or leave the "
                               f"choice to lane_tiles")
    slots = dict(HEAD_DIM=hd, ROWS=rows, LANES=lanes, BK=bk, PER_LANE=per_lane, K=f.names[1], V=f.names[2],
                 KEY_END="qi + 1u" if f.causal else "p.seq",
                 TILES_END="min(p.seq, q0 + R)" if f.causal else "p.seq",
                 MEAN_V=_mean_v(f), **lanes_slots(hd, tiles, f.masked, f.names[0], f.rope, f.zero_rows, f.mean_rows,
                                                    f.mask_dtype))
    name = f"attention_lanes_hd{hd}_{rows}x{lanes}k{bk}" + (f"p{per_lane}" if per_lane > 1 else "")
    return _attention_dispatch(node, f, "attention_lanes.wgsl", rows, name, slots)


def _attention_kernel(node, ins, target) -> Kernel:
    check_head_dim(node, ins[0])
    f = _form(node, ins)
    storage = target.limits.get("max-compute-workgroup-storage-size", ATTENTION_TILE_BYTES)
    lanes = lane_tiles(f.hd, storage, f.rope)
    if takes_lanes(node.op, f.hd, lanes, f.batch * f.nh * math.ceil(f.seq / lanes.rows) if lanes else 0):
        return _lanes_kernel(node, ins, lanes, storage)
    wg, bq, bk = attention_tiles(f.hd, storage, lambda rows: f.batch * f.nh * math.ceil(f.seq / rows))
    if bk < 4 or bk % 4:
        raise LoweringError(f"{node.op}: attention.wgsl takes tiles of a multiple of 4 keys, got {bk} "
                            f"(attention_tiles)")
    slots = dict(HEAD_DIM=f.hd, BQ=bq, BK=bk, WG=wg, SCORE_DOTS=_score_dots(wg, bq, bk), Q=f.names[0],
                 K=f.names[1], V=f.names[2],
                 QK=Include("attention_qk_rope.wgsl" if f.rope else "attention_qk.wgsl"),
                 MASK=f"                if ({key_dropped_wgsl('key_mask[b * p.seq + k0 + j]', f.mask_dtype)}) "
                 "{ s = MASK_SENTINEL; }" if f.masked else "",
                 MASKED_ROWS="        if (row_m[orow] <= MASK_SENTINEL) { o = vec4<f32>(); }  // no key kept: zeros"
                 if f.zero_rows else "        if (row_m[orow] <= MASK_SENTINEL) { o = mean_v(row0, kh, col); }"
                 if f.mean_rows else "", MEAN_V=_mean_v(f),
                 KEY_END="qi + 1u" if f.causal else "p.seq",  # of key_end_of(qi)
                 TILES_END="min(p.seq, q0 + BQ)" if f.causal else "p.seq")
    return _attention_dispatch(node, f, "attention.wgsl", bq, f"attention_hd{f.hd}", slots)


def _attention_flops(ins, out, a) -> int:
    rows = ins[0].shape[0]
    seq = rows // a.get("batch", 1)
    return 4 * rows * seq * a["num_heads"] * a["head_dim"]


def _attention_grad_nodes(b, dy, q, k, v, mask, causal: bool, attrs: dict, want) -> list:
    ins = (dy, q, k, v) if mask is None else (dy, q, k, v, mask)
    return [b.emit(f"AttentionGrad{part}", ins, causal=causal, **attrs) if w else None
            for part, w in zip("QKV", want, strict=False)]


_ATTN_ATTRS = (Attr("num_heads", "int"), Attr("num_kv_heads", "int"), Attr("head_dim", "int"), Attr("batch", "int", 1))
_ATTN_NAMES = tuple(x.name for x in _ATTN_ATTRS)
_FULL_ATTRS = (*_ATTN_ATTRS, Attr("masked_rows", "str", "mean",
                                  doc="a query row whose key_mask keeps no key: 'mean' of v or 'zero' (MASKED_ROWS)"))


def _f32_key_mask(b, mask):
    # The gradient ops' key_mask: f32, 1 where ``mask`` keeps a key and 0 where it drops it (an i32 or bool
    # mask through Cast to bool, as key_kept reads it), or None
    if mask is None or b.type(mask).dtype is DType.F32:
        return mask
    flags = mask if b.type(mask).dtype is DType.BOOL else b.emit("Cast", (mask,), to="bool")
    return b.emit("Cast", (flags,), to="f32")


def _kept_rows_dy(b, node, dy, mask):
    # dO as the gradients see it: with masked_rows "zero" a row whose key_mask keeps no key is a constant zero, so
    # its dO reaches nothing (the gradient ops, written for the mean, would pass dO / seq to each v row):
    # dO [B*S, C] times kept[b] = (max_t key_mask[b, t] > 0) per sequence, as [B, S*C] * [B, 1]
    if mask is None or node.attrs.get("masked_rows", "mean") != "zero":
        return dy
    rows, width = b.type(dy).shape
    batch = node.attrs["batch"]
    kept = b.emit("Greater", (b.emit("ReduceMax", (mask,), axes=[1], keepdims=True), b.const(np.zeros(()))))
    return b.reshape(b.emit("Mul", (b.reshape(dy, [batch, rows // batch * width]), kept)), [rows, width])


def _qkv_parts(xs, a) -> tuple[list, object | None]:
    # ([q, k, v], key_mask or None) of CausalAttention's and CausalAttentionRoPE's inputs (types or values):
    # q, k, v(, key_mask), or one packed qkv(, key_mask)
    packed = len(xs) in (1, 2)
    qkv = split_packed_qkv(xs[0], a) if packed else list(xs[:3])
    return qkv, (xs[1] if len(xs) == 2 else xs[3] if len(xs) == 4 else None)


def _causal_rule(ts, a):
    # CausalAttention's and CausalAttentionRoPE's shape rule: q, k, v or one packed qkv, then a key_mask
    need(len(ts) in (1, 2, 3, 4), f"takes q, k, v or one packed qkv input, and an optional key_mask; got {len(ts)} "
                                  "inputs")
    if len(ts) in (1, 2):
        need_f32(ts[0], "packed qkv")
    qkv, mask = _qkv_parts(ts, a)
    return attention_rule(qkv if mask is None else [*qkv, mask], a)


def _no_causal_mask_grad(b, node, mask) -> None:
    if mask is not None and node.op != "FullAttention" and node.op != "FullAttentionPacked":
        raise GraphError(f"node {node.id} {node.op} (q {b.type(node.inputs[0])}, key_mask node {mask} "
                         f"{b.type(mask)}): a causal attention with a key_mask has no gradient (the AttentionGrad "
                         "kernels take a key_mask only without causal rows); differentiate the graph without the "
                         "key_mask")


def _attention_vjp(b, node, dy, want):
    if node.op == "CausalAttention" and len(node.inputs) in (1, 2):  # packed: q, k, v are column slices of one
        _no_causal_mask_grad(b, node, node.inputs[1] if len(node.inputs) == 2 else None)
        if not want[0]:
            return [None] * len(node.inputs)
        grads = _attention_grad_nodes(b, dy, *_packed_slices(b, node), None, True,
                                      {a: node.attrs[a] for a in _ATTN_NAMES}, (True, True, True))
        return [b.emit("Concat", grads, axis=1)]
    q, k, v, *mask = node.inputs
    _no_causal_mask_grad(b, node, mask[0] if mask else None)
    attrs = {a: node.attrs[a] for a in _ATTN_NAMES}
    key_mask = _f32_key_mask(b, mask[0] if mask else None)
    dy = _kept_rows_dy(b, node, dy, key_mask)
    grads = _attention_grad_nodes(b, dy, q, k, v, key_mask, node.op == "CausalAttention", attrs, want)
    return grads + [None] * len(mask)  # key_mask is piecewise constant: no gradient


op("FullAttention", ("q", "k", "v", "key_mask?"), attention_rule,
   lambda xs, a: attention_reference(*xs[:3], a, False, xs[3] if len(xs) > 3 else None), attrs=_FULL_ATTRS,
   vjp=_attention_vjp, kernel=_attention_kernel, flops=_attention_flops,
   doc="non-causal GQA attention (Vaswani et al. 2017, eq. 1); optional 4th input key_mask [batch, seq], "
       "f32 > 0, i32 != 0 or bool true keeps a key; a query row whose mask keeps no key gives the mean of v or, "
       "masked_rows 'zero', zeros")
op("CausalAttention", ("q", "k?", "v?", "key_mask?"), _causal_rule,
   lambda xs, a: attention_reference(*_qkv_parts(xs, a)[0], a, True, _qkv_parts(xs, a)[1]),
   attrs=_FULL_ATTRS, vjp=_attention_vjp, kernel=_attention_kernel, flops=_attention_flops,
   doc="causal GQA attention (Vaswani et al. 2017, eq. 1). Inputs q, k, v, or one packed [rows, (H + 2 KV) * D] "
       "projection whose columns are q, k, v in that order (GPT-2's fused c_attn); then an optional key_mask "
       "[batch, seq] (as FullAttention's); a query row whose mask keeps none of the keys up to its own gives the mean "
       "of v over all the sequence's keys or, masked_rows 'zero', zeros (no gradient with a key_mask)")


def _packed_slices(b, node):
    # q, k, v as SliceCols of a packed projection (the first input)
    nq, nkv = node.attrs["num_heads"] * node.attrs["head_dim"], node.attrs["num_kv_heads"] * node.attrs["head_dim"]
    return [b.emit("SliceCols", node.inputs[:1], start=start, size=size)
            for start, size in ((0, nq), (nq, nkv), (nq + nkv, nkv))]


def _full_packed_rule(ts, a):
    need(len(ts) in (1, 2), f"takes one packed qkv input and an optional key_mask, got {len(ts)} inputs")
    need_f32(ts[0], "packed qkv")
    return attention_rule([*split_packed_qkv(ts[0], a), *ts[1:]], a)


def _full_packed_vjp(b, node, dy, want):
    if not want[0]:
        return [None] * len(node.inputs)
    q, k, v = _packed_slices(b, node)
    mask = _f32_key_mask(b, node.inputs[1] if len(node.inputs) > 1 else None)
    dy = _kept_rows_dy(b, node, dy, mask)
    grads = _attention_grad_nodes(b, dy, q, k, v, mask, False, {a: node.attrs[a] for a in _ATTN_NAMES},
                                  (True, True, True))
    return [b.emit("Concat", grads, axis=1)] + [None] * (len(node.inputs) - 1)


op("FullAttentionPacked", ("qkv", "key_mask?"), _full_packed_rule,
   lambda xs, a: attention_reference(*split_packed_qkv(xs[0], a), a, False, xs[1] if len(xs) > 1 else None),
   attrs=_FULL_ATTRS, vjp=_full_packed_vjp, kernel=_attention_kernel, flops=_attention_flops,
   doc="FullAttention(q, k, v, key_mask?) of one packed [rows, (H + 2 KV) * D] projection whose columns are q, "
       "k, v in that order (an encoder's Q, K and V projections as one product); optional key_mask [batch, seq], "
       "masked_rows as FullAttention's")


# --- CausalAttentionRoPE -----------------------------------------------------------------------


def split_packed_qkv(x, a):
    """Columns of a packed [rows, (H + 2 KV) * D] projection: (q, k, v) views or types."""
    nq, nkv = a["num_heads"] * a["head_dim"], a["num_kv_heads"] * a["head_dim"]
    if isinstance(x, TensorType):
        need(x.rank == 2 and x.shape[1] == nq + 2 * nkv,
             f"packed qkv must be [rows, {nq + 2 * nkv}] (q {nq} + k {nkv} + v {nkv} columns), got {x}")
        return [TensorType((x.shape[0], w)) for w in (nq, nkv, nkv)]
    return [x[:, :nq], x[:, nq:nq + nkv], x[:, nq + nkv:]]


def _attention_rope(ts, a):
    out = _causal_rule(ts, a)
    ts, _ = _qkv_parts(ts, a)
    for t, what in ((ts[0], "q"), (ts[1], "k")):
        try:
            rope_rule([t], a)
        except ValueError as e:
            need(False, f"{what}: {e}")
    return out


def _attention_rope_ref(xs, a):
    (q, k, v), mask = _qkv_parts(xs, a)
    return attention_reference(rope_ref([q], a), rope_ref([k], a), v, a, causal=True, key_mask=mask)


def _attention_rope_vjp(b, node, dy, want):
    # packed: q, k, v are column slices of the one input, and its gradient is theirs side by side
    packed = len(node.inputs) in (1, 2)
    _no_causal_mask_grad(b, node, node.inputs[-1] if len(node.inputs) in (2, 4) else None)
    if packed:
        if not want[0]:
            return [None]
        q, k, v = _packed_slices(b, node)
        want = (True, True, True)
    else:
        q, k, v = node.inputs
    rope = {a: node.attrs[a] for a in ROPE_ATTR_NAMES}
    qr, kr = b.emit("RoPE", (q,), **rope), b.emit("RoPE", (k,), **rope)
    dq, dk, dv = _attention_grad_nodes(b, dy, qr, kr, v, None, True, {a: node.attrs[a] for a in _ATTN_NAMES}, want)
    grads = [None if dq is None else b.emit("RoPEGrad", (dq,), **rope),
             None if dk is None else b.emit("RoPEGrad", (dk,), **rope), dv]
    return [b.emit("Concat", grads, axis=1)] if packed else grads


op("CausalAttentionRoPE", ("q", "k?", "v?", "key_mask?"), _attention_rope, _attention_rope_ref,
   attrs=(*_FULL_ATTRS, Attr("theta", "float"), Attr("pos_offset", "int", 0), Attr("pairing", "str", "half"), SCALING),
   vjp=_attention_rope_vjp, kernel=_attention_kernel, flops=_attention_flops,
   doc="CausalAttention(RoPE(q), RoPE(k), v, key_mask?): the rotation is applied inside the attention kernel "
       "(seed: CausalAttentionRoPE). Inputs q, k, v, or one packed [rows, (H + 2 KV) * D] projection whose columns "
       "are q, k, v in that order; then an optional key_mask [batch, seq] (the second input when packed), "
       "masked_rows as CausalAttention's (no gradient with a key_mask)")


def _llama_attention(g, dim, *, rope: bool = True, masked: bool = False):
    # masked: two sequences and a key mask [2, seq] of an input (standard normal: > 0 keeps about half the keys,
    # and at seq <= 5 some rows keep none of theirs)
    hd = 2 * dim("half_head", 1, 3)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    seq, width, batch = dim("seq", 1, 5), dim("width", 2, 6), 2 if masked else 1
    h = g.input("h", [batch * seq, width])
    mask = dict(key_mask=g.input("key_mask", [batch, seq]), masked_rows="mean") if masked else {}
    q = g.matmul_bt(h, g.parameter("wq", [nh * hd, width]))
    k = g.matmul_bt(h, g.parameter("wk", [nkv * hd, width]))
    v = g.matmul_bt(h, g.parameter("wv", [nkv * hd, width]))
    if rope:
        q, k = g.rope(q, 100.0, hd, batch=batch), g.rope(k, 100.0, hd, batch=batch)
        out = g.causal_attention(q, k, v, nh, nkv, hd, batch, **mask)
    else:
        out = g.causal_attention_rope(q, k, v, nh, nkv, hd, 100.0, batch=batch, **mask)
    g.set_outputs([out])


@rules("attention")
def _rope_into_attention(e):
    q, k, v = e.vars("q k v")
    nh, nkv, hd, batch, pos = e.vars("nh nkv hd batch pos", e.i64)
    (theta,) = e.vars("theta", e.f64)
    pairing, scaling = e.vars("pairing scaling", e.String)
    (m,) = e.vars("m")
    (rows,) = e.vars("rows", e.String)
    rope = dict(theta=theta, head_dim=hd, pos_offset=pos, pairing=pairing, batch=batch, scaling=scaling)
    attn = dict(num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch, masked_rows=rows)
    # CausalAttention(RoPE(q), RoPE(k), v[, m]) -> CausalAttentionRoPE(q, k, v[, m])   if head size and sequences
    # agree
    for masked in (False, True):
        extra, label = ((m,), ", m") if masked else ((), "")
        yield e.equal(f"CausalAttention(RoPE(q), RoPE(k), v{label}) -> CausalAttentionRoPE(q, k, v{label})",
                      e.CausalAttention(e.RoPE(q, **rope), e.RoPE(k, **rope), v, *extra, **attn),
                      e.CausalAttentionRoPE(q, k, v, *extra, **attn, theta=theta, pos_offset=pos, pairing=pairing,
                                            scaling=scaling),
                      example=example(lambda g, dim, masked=masked: _llama_attention(g, dim, masked=masked)))


def projection_slices(e, packed, projections):
    """The actions joining each of the projections ``(term, columns)`` (q, k, v in order) with
    its SliceCols of the packed product ``packed``: q its first columns, k the next, v the last."""
    start, out = e.i64(0), []
    for term, cols in projections:
        out.append(e.union(term).with_(e.SliceCols(packed, start=start, size=cols)))
        start = start + cols
    return out


def packed_qkv_rule(e, projections, packed, *, name: str, example_fn, mask=None):
    """The rule packing a prefill attention's Q, K and V projections: anchored on
    ``CausalAttentionRoPE(q, k, v[, mask])`` over the projections ``(term, columns)``, it joins
    the attention with ``CausalAttentionRoPE(packed[, mask])`` and each projection with its
    SliceCols of ``packed`` (:func:`projection_slices`). The weights' forms (Parameters [N, K]
    or [K, N], blocks kept quantised, f16) are the callers'."""
    attrs = e.attrs_of("CausalAttentionRoPE")
    extra = () if mask is None else (mask,)
    attn = e.CausalAttentionRoPE(*(t for t, _ in projections), *extra, **attrs)
    return e.rule(attn, name=name, example=example(example_fn)).then(
        e.union(attn).with_(e.CausalAttentionRoPE(packed, *extra, **attrs)), *projection_slices(e, packed, projections))


def _llama_attention_kn(g, dim, masked: bool = False):
    """_llama_attention with [K, N] weights (MatMul), as ONNX exports store them."""
    hd = 2 * dim("half_head", 1, 3)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    seq, width, batch = dim("seq", 1, 5), dim("width", 2, 6), 2 if masked else 1
    h = g.input("h", [batch * seq, width])
    mask = dict(key_mask=g.input("key_mask", [batch, seq]), masked_rows="zero") if masked else {}
    q, k, v = (g.matmul(h, g.parameter(n, [width, w * hd])) for n, w in (("wq", nh), ("wk", nkv), ("wv", nkv)))
    g.set_outputs([g.causal_attention_rope(q, k, v, nh, nkv, hd, 100.0, batch=batch, **mask)])


@rules("attention")
def _packed_qkv(e):
    (h, m) = e.vars("h m")
    nq, nk, nv = e.vars("nq nk nv", e.String)
    # one shape variable per weight: a shared one would make egglog join every pair of same-shaped
    # parameters of the model (29 ms per 64-layer saturation against 1 ms); the attention's shape
    # rule already makes k and v alike
    sq, sk, sv = e.vars("sq sk sv", e.Vec[e.i64])
    wq, wk, wv = e.Parameter(nq, sq), e.Parameter(nk, sk), e.Parameter(nv, sv)
    # CausalAttentionRoPE(h@Wq^T, h@Wk^T, h@Wv^T[, m]) -> CausalAttentionRoPE(P[, m]),  P = h@Concat(Wq,Wk,Wv)^T
    # and h@Wq^T = SliceCols(P, 0, q), h@Wk^T = SliceCols(P, q, k), h@Wv^T = SliceCols(P, q+k, v); the same for
    # weights [K, N] (MatMul, as exporters store them): P = h@Concat(Wq,Wk,Wv, axis 1), columns s[1]
    layouts = (("h@Wq^T, h@Wk^T, h@Wv^T", "h@Concat(Wq,Wk,Wv)^T", e.MatMulBT, 0,
                lambda g, dim, masked: _llama_attention(g, dim, rope=False, masked=masked)),
               ("h@Wq, h@Wk, h@Wv", "h@Concat(Wq,Wk,Wv, axis 1)", e.MatMul, 1, _llama_attention_kn))
    for each, packed, product, cols, build in layouts:
        for masked in (False, True):
            label = ", m" if masked else ""
            yield packed_qkv_rule(e, [(product(h, w), s[cols]) for w, s in ((wq, sq), (wk, sk), (wv, sv))],
                                  product(h, e.Concat(wq, wk, wv, axis=cols)),
                                  name=f"CausalAttentionRoPE({each}{label}) -> CausalAttentionRoPE({packed}{label})",
                                  example_fn=lambda g, dim, masked=masked, build=build: build(g, dim, masked=masked),
                                  mask=m if masked else None)


def bert_attention(g, dim, *, masked: bool, weight=None, width_multiple: int = 1, kn: bool = False):
    """An encoder's attention, the example of the packing rules below: Q, K and V projections with
    biases (``bias_add(matmul_bt(h, W), b)``; ``weight(g, name, rows, cols)`` builds W, by default a
    Parameter; the input width a multiple of ``width_multiple``; ``kn``: ``bias_add(matmul(h, W), b)``
    of Parameters W [K, N], as exporters store them), FullAttention over ``batch`` sequences, with a key
    mask or none."""
    weight = weight or (lambda g, name, rows, cols: g.parameter(name, [rows, cols]))
    hd, kv, batch = dim("head", 1, 3), dim("kv", 1, 2), dim("batch", 1, 2)
    heads = kv * dim("group", 1, 2)  # GQA: K and V narrower than Q
    seq, width = dim("seq", 1, 4), dim("width", 2, 6) * width_multiple
    h = g.input("h", [batch * seq, width])
    q, k, v = (g.bias_add(g.matmul(h, g.parameter(f"w{n}", [width, rows * hd])) if kn else
                          g.matmul_bt(h, weight(g, f"w{n}", rows * hd, width)), g.parameter(f"b{n}", [rows * hd]))
               for n, rows in (("q", heads), ("k", kv), ("v", kv)))
    mask = g.input("mask", [batch, seq]) if masked else None
    g.set_outputs([g.full_attention(q, k, v, heads, kv, hd, batch=batch, key_mask=mask)])


def packed_encoder_qkv_rules(e, weights, packed_weight, *, name: str, example_fn, product=None):
    """The rules packing an encoder's biased Q, K and V projections, with a key mask and without:
    ``FullAttention(h@Wq^T+bq, h@Wk^T+bk, h@Wv^T+bv, mask?)`` joins
    ``FullAttentionPacked(h@P^T + Concat(bq,bk,bv), mask?)``, each projection its SliceCols of
    the packed product. ``weights`` are the (term, rows) of Wq, Wk, Wv [N, K], ``packed_weight``
    the term P of their rows stacked (Concat, or a stored form of it); ``example_fn(g, dim,
    masked)`` builds the rules' example; ``product(h, w)`` the projection's product term
    (default ``MatMulBT(h, w)``; ``MatMul`` for weights [K, N] and P their columns side by side).
    Only biases [N] match (BiasAdd also takes [1, N], whose Concat along axis 0 would stack rows)."""
    product = product or e.MatMulBT
    (h, mask) = e.vars("h mask")
    nh, nkv, hd, batch = e.vars("nh nkv hd batch", e.i64)
    bnames = e.vars("bq bk bv", e.String)
    bshapes = e.vars("tq tk tv", e.Vec[e.i64])  # one shape variable per parameter, as in _packed_qkv
    bias = [e.Parameter(n, s) for n, s in zip(bnames, bshapes, strict=True)]
    attrs = dict(num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch, masked_rows=e.var("masked_rows", e.String))
    projections = [(e.BiasAdd(product(h, w), b), rows) for (w, rows), b in zip(weights, bias, strict=True)]
    packed = e.BiasAdd(product(h, packed_weight), e.Concat(*bias, axis=0))
    terms = [t for t, _ in projections]
    for masked in (True, False):
        extra = (mask,) if masked else ()
        attn = e.FullAttention(*terms, *extra, **attrs)
        one_d = [e.eq(s.length()).to(e.i64(1)) for s in bshapes]
        yield e.rule(attn, *one_d, name=name + (" (with a key mask)" if masked else ""),
                     example=example(lambda g, dim, m=masked: example_fn(g, dim, m))).then(
            e.union(attn).with_(e.FullAttentionPacked(packed, *extra, **attrs)),
            *projection_slices(e, packed, projections))


@rules("attention")
def _packed_qkv_bias(e):
    names = e.vars("nq nk nv", e.String)
    shapes = e.vars("sq sk sv", e.Vec[e.i64])  # one per weight, as in _packed_qkv
    w = [e.Parameter(n, s) for n, s in zip(names, shapes, strict=True)]
    # FullAttention(h@Wq^T + bq, h@Wk^T + bk, h@Wv^T + bv, mask?) -> FullAttentionPacked(P, mask?),
    # P = h@Concat(Wq,Wk,Wv)^T + Concat(bq,bk,bv); each projection is a SliceCols of P
    yield from packed_encoder_qkv_rules(
        e, [(wi, s[0]) for wi, s in zip(w, shapes, strict=True)], e.Concat(*w, axis=0),
        name="FullAttention(h@Wq^T+bq, h@Wk^T+bk, h@Wv^T+bv) -> "
             "FullAttentionPacked(h@Concat(Wq,Wk,Wv)^T + Concat(bq,bk,bv))",
        example_fn=lambda g, dim, masked: bert_attention(g, dim, masked=masked))
    # the same of weights [K, N] (an exporter's): P = h@Concat(Wq,Wk,Wv, axis 1) + Concat(bq,bk,bv)
    yield from packed_encoder_qkv_rules(
        e, [(wi, s[1]) for wi, s in zip(w, shapes, strict=True)], e.Concat(*w, axis=1),
        name="FullAttention(h@Wq+bq, h@Wk+bk, h@Wv+bv) -> FullAttentionPacked(h@Concat(Wq,Wk,Wv, axis 1) + "
             "Concat(bq,bk,bv))",
        example_fn=lambda g, dim, masked: bert_attention(g, dim, masked=masked, kn=True), product=e.MatMul)


def _unbiased_attention(op: str, kn: bool, masked: bool):
    # op (FullAttention or CausalAttention) of projections without biases, weights [N, K] (matmul_bt) or [K, N]
    def build(g, dim):
        hd, kv, batch = dim("head", 1, 3), dim("kv", 1, 2), dim("batch", 1, 2)
        heads, seq, width = kv * dim("group", 1, 2), dim("seq", 1, 4), dim("width", 2, 6)
        h = g.input("h", [batch * seq, width])
        q, k, v = (g.matmul(h, g.parameter(f"w{n}", [width, rows * hd])) if kn else
                   g.matmul_bt(h, g.parameter(f"w{n}", [rows * hd, width]))
                   for n, rows in (("q", heads), ("k", kv), ("v", kv)))
        mask = dict(key_mask=g.input("mask", [batch, seq])) if masked else {}
        attend = g.full_attention if op == "FullAttention" else g.causal_attention
        g.set_outputs([attend(q, k, v, heads, kv, hd, batch=batch, **mask)])

    return build


@rules("attention")
def _packed_qkv_unbiased(e):
    (h, m) = e.vars("h m")
    names = e.vars("nq nk nv", e.String)
    shapes = e.vars("sq sk sv", e.Vec[e.i64])  # one per weight, as in _packed_qkv
    w = [e.Parameter(n, s) for n, s in zip(names, shapes, strict=True)]
    # FullAttention(h@Wq, h@Wk, h@Wv, mask?) -> FullAttentionPacked(h@Concat(Wq,Wk,Wv), mask?) and
    # CausalAttention(...) -> CausalAttention(h@Concat(Wq,Wk,Wv), mask?): projections without biases (T5's, a
    # GPT-style decoder's without RoPE), weights [N, K] (P = h@Concat(W)^T) or [K, N] (an exporter's: P =
    # h@Concat(W, axis 1)); each projection is a SliceCols of P, as in the biased encoders' and RoPE rules
    for product, axis, kn, layout in ((e.MatMulBT, 0, False, "^T"), (e.MatMul, 1, True, "")):
        projections = [(product(h, wi), s[axis]) for wi, s in zip(w, shapes, strict=True)]
        packed = product(h, e.Concat(*w, axis=e.i64(axis)))
        for name, packed_op in (("FullAttention", "FullAttentionPacked"), ("CausalAttention", "CausalAttention")):
            for masked in (False, True):
                attrs, extra = e.attrs_of(name), (m,) if masked else ()
                attn = getattr(e, name)(*(t for t, _ in projections), *extra, **attrs)
                label = ", m" if masked else ""
                yield e.rule(attn, name=f"{name}(h@Wq{layout}, h@Wk{layout}, h@Wv{layout}{label}) -> {packed_op}("
                                        f"h@Concat(Wq,Wk,Wv{', axis 1' if kn else ''}){layout}{label})",
                             example=example(_unbiased_attention(name, kn, masked))).then(
                    e.union(attn).with_(getattr(e, packed_op)(packed, *extra, **attrs)),
                    *projection_slices(e, packed, projections))


# --- attention gradients -----------------------------------------------------------------------


def _attention_grad_op(index: int, part: str) -> None:
    def infer(ts, a):
        need(not (a["causal"] and len(ts) == 5), "a key_mask is only taken with causal=False")
        if len(ts) == 5:
            need_f32(ts[4], "key_mask")
        out = attention_rule(ts[1:], a)
        need_f32(ts[0], "dO")
        need(ts[0] == out, f"dO must be {out}, got {ts[0]}")
        return ts[1 + index]

    def reference(xs, a):
        mask = xs[4] if len(xs) == 5 else None
        return attention_grads(xs[0], xs[1], xs[2], xs[3], a, a["causal"], mask)[index]

    op(f"AttentionGrad{part}", ("dO", "q", "k", "v", "key_mask?"), infer, reference,
       attrs=(Attr("causal", "bool"), *_ATTN_ATTRS), vjp=NO_GRAD, kernel=_attention_grad_kernel,
       flops=lambda ins, out, a: 2 * _attention_flops(ins[1:], out, a),
       doc=f"d{part.lower()} of FullAttention (causal=False, optional key_mask) or CausalAttention; inputs "
           f"[dO, q, k, v(, key_mask)], see attention_grads (seed: MultiHeadAttnGrad{part})")


def _grad_bindings(masked: bool) -> tuple[Buffer, ...]:
    return (Buffer("dout"), Buffer("q"), Buffer("k"), Buffer("v"), *((Buffer("key_mask"),) if masked else ()),
            Buffer("out", write=True))


def _attention_grad_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    nh, nkv, hd, batch, causal = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"], a["causal"]
    check_head_dim(node, ins[1])
    masked = len(ins) == 5
    part = node.op[-1]
    slots = dict(HEAD_DIM=hd, KEPT="key_mask[b * p.seq + j] > 0.0" if masked else "true",
                 KEY_END="qi + 1u" if causal else "p.seq")
    if part == "Q":
        body = "attention_grad_q.wgsl"
    else:
        body = "attention_grad_kv.wgsl"
        slots.update(WANT_K="true" if part == "K" else "false", CAUSAL="true" if causal else "false")
    seq = ins[1].shape[0] // batch
    blocks = math.ceil(seq / ATTENTION_GRAD_ROWS)
    total = batch * (nh if part == "Q" else nkv) * blocks
    params = (("seq", "u32", seq), ("nh", "u32", nh), ("nkv", "u32", nkv), ("group", "u32", nh // nkv),
              ("blocks", "u32", blocks), ("total", "u32", total), ("scale", "f32", 1.0 / math.sqrt(hd)))
    name = f"attention_grad_{part.lower()}_hd{hd}" + ("_causal" if causal else "") + ("_mask" if masked else "")
    return Kernel(name, body, total, params=params, slots=slots, bindings=_grad_bindings(masked))


for _i, _part in enumerate("QKV"):
    _attention_grad_op(_i, _part)


# --- SlidingWindowAttention, CrossAttention and their gradients -------------------------------------


def _windowed_rule(ts, a, cross: bool):
    q, k, v = ts[:3]
    nh, hd, batch = a["num_heads"], a["head_dim"], a["batch"]
    check_heads(q, k, v, a)
    need(v.shape[0] == k.shape[0], f"k {k} and v {v} must have the same number of rows")
    need(cross or k.shape[0] == q.shape[0], f"q {q} and k {k} must have the same number of rows")
    need(batch >= 1 and q.shape[0] % batch == 0 and k.shape[0] % batch == 0,
         f"q {q} and k {k} rows do not split into {batch} sequences")
    if not cross:
        need(a["window_size"] >= 1, f"window_size must be an int >= 1, got {a['window_size']!r}")
    if len(ts) == 4:
        kv_seq = k.shape[0] // batch
        need_f32(ts[3], "key_mask")
        need(ts[3].shape == (batch, kv_seq), f"key_mask must be [{batch},{kv_seq}], got {ts[3]}")
    return TensorType((q.shape[0], nh * hd))


def attention_band(q_seq: int, kv_seq: int, window: int) -> np.ndarray:
    """[q_seq, kv_seq] bool: the keys query row i may see. window 0: all (CrossAttention);
    else the ``window`` rows up to and including i (i - window < j <= i, Mistral / Beltagy
    et al. 2020), as the seed's ``my_kv_start = my_kv_len - min(my_kv_len, window_size)``."""
    i, j = np.arange(q_seq)[:, None], np.arange(kv_seq)[None, :]
    if window == 0:
        return np.ones((q_seq, kv_seq), dtype=bool)
    return (j <= i) & (j > i - window)


def _scores(qh, kh, band, kept, scale):
    # Softmax of one (sequence, head): key-masked scores become MASK_SENTINEL, keys outside the
    # band get weight 0, so a row whose keys are all masked averages the values in its band.
    s = np.where(kept[None, :], (qh @ kh.T) * scale, MASK_SENTINEL)
    m = np.where(band, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.exp(np.where(band, s - m, -np.inf))
    return e / e.sum(axis=-1, keepdims=True)


def windowed_attention(q, k, v, a, window: int, key_mask=None, do=None):
    """Attention of each query row over its band (:func:`attention_band`), GQA and key masking.

    Rows hold ``batch`` sequences: q [B*Sq, H*D], k/v [B*Skv, KV*D]; query head h reads kv head
    h // (H / KV). Without ``do``: the output (Vaswani et al. 2017, eq. 1). With ``do`` (dO):
    (dq, dk, dv) by the FlashAttention-2 backward (Dao 2023, Algorithm 2, untiled): dV = P^T dO,
    dS = P * (dO V^T - rowsum(P * dO V^T)) zeroed at masked keys, dQ = scale dS K, dK = scale dS^T Q.
    """
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    sq, skv = q.shape[0] // batch, k.shape[0] // batch
    group, scale = nh // nkv, 1.0 / math.sqrt(hd)
    band = attention_band(sq, skv, window)
    out = np.zeros((q.shape[0], nh * hd))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(batch):
        qr, kr = slice(b * sq, (b + 1) * sq), slice(b * skv, (b + 1) * skv)
        kept = np.ones(skv, dtype=bool) if key_mask is None else key_mask[b] > 0
        for h in range(nh):
            qc, kc = slice(h * hd, (h + 1) * hd), slice((h // group) * hd, (h // group + 1) * hd)
            qh, kh, vh = q[qr, qc], k[kr, kc], v[kr, kc]
            p = _scores(qh, kh, band, kept, scale)
            if do is None:
                out[qr, qc] = p @ vh
                continue
            doh = do[qr, qc]
            dp = doh @ vh.T
            ds = np.where(kept[None, :], p * (dp - (p * dp).sum(axis=-1, keepdims=True)), 0.0)
            dv[kr, kc] += p.T @ doh
            dq[qr, qc] = scale * ds @ kh
            dk[kr, kc] += scale * ds.T @ qh
    return out if do is None else (dq, dk, dv)


def _windowed_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    grad = "" if node.op in _WINDOW_KINDS else node.op[-5:]  # '', 'GradQ', 'GradK' or 'GradV'
    q, k = (ins[0], ins[1]) if not grad else (ins[1], ins[2])
    check_head_dim(node, q)
    masked = len(ins) == (5 if grad else 4)
    slots = dict(HEAD_DIM=hd, KEPT="key_mask[b * p.kv_seq + j] > 0.0" if masked else "true")
    if grad in ("GradK", "GradV"):
        body = "attention_window_grad_kv.wgsl"
        slots["WANT_K"] = "true" if grad == "GradK" else "false"
    else:
        body = "attention_window_grad_q.wgsl" if grad else "attention_window.wgsl"
    q_seq, kv_seq = q.shape[0] // batch, k.shape[0] // batch
    per_key = grad in ("GradK", "GradV")
    blocks = math.ceil((kv_seq if per_key else q_seq) / ATTENTION_GRAD_ROWS)
    total = batch * (nkv if per_key else nh) * blocks
    window = a.get("window_size", 0)
    params = (("q_seq", "u32", q_seq), ("kv_seq", "u32", kv_seq), ("nh", "u32", nh), ("nkv", "u32", nkv),
              ("group", "u32", nh // nkv), ("blocks", "u32", blocks), ("total", "u32", total),
              ("scale", "f32", 1.0 / math.sqrt(hd)), ("window", "u32", window))
    kind = "window" if window else "cross"
    name = f"attention_{kind}{('_' + grad.lower()) if grad else ''}_hd{hd}" + ("_mask" if masked else "")
    if grad:
        bindings = _grad_bindings(masked)
    else:
        bindings = (Buffer("q"), Buffer("k"), Buffer("v"), *((Buffer("key_mask"),) if masked else ()),
                    Buffer("out", write=True))
    return Kernel(name, body, total, params=params, slots=slots, bindings=bindings)


def _windowed_vjp(b, node, dy, want):
    q, k, v, *mask = node.inputs
    from ..spec import OPS

    attrs = {x: node.attrs[x] for x in OPS[node.op].attr_names}
    grads = [b.emit(f"{node.op}Grad{part}", (dy, *node.inputs), **attrs) if w else None
             for part, w in zip("QKV", want, strict=False)]
    return grads + [None] * len(mask)  # key_mask is piecewise constant: no gradient


_WINDOW_KINDS = {
    # op: (cross, attrs, window of the attrs, doc)
    "SlidingWindowAttention": (False, (*_ATTN_ATTRS[:3], Attr("window_size", "int"), _ATTN_ATTRS[3]),
                               lambda a: a["window_size"],
                               "causal GQA attention where row i sees keys i - window_size < j <= i; q, k, v [B*S, .]; "
                               "optional key_mask [B, S] (1 keeps a key): a row whose window is fully masked averages "
                               "the values in its window (Beltagy et al. 2020, Longformer; Jiang et al. 2023, Mistral "
                               "7B; seed: SlidingWindowAttention)"),
    "CrossAttention": (True, _ATTN_ATTRS, lambda a: 0,
                       "non-causal GQA attention of q [B*Sq, H*D] over k, v [B*Skv, KV*D] of another sequence; "
                       "optional key_mask [B, Skv]: a fully masked row averages all values (encoder-decoder "
                       "attention, Vaswani et al. 2017; seed: CrossAttention, and MultiHeadAttn with is_cross)"),
}


def _windowed_ops(name, cross, attrs, window, doc) -> None:
    def ref(xs, a):
        return windowed_attention(*xs[:3], a, window(a), xs[3] if len(xs) > 3 else None)

    def flops(ins, out, a):
        return 4 * ins[0].shape[0] * (ins[1].shape[0] // a["batch"]) * a["num_heads"] * a["head_dim"]

    op(name, ("q", "k", "v", "key_mask?"), lambda ts, a: _windowed_rule(ts, a, cross), ref, attrs=attrs,
       vjp=_windowed_vjp, kernel=_windowed_kernel, flops=flops, doc=doc)
    for index, part in enumerate("QKV"):
        def infer(ts, a, index=index):
            out = _windowed_rule(ts[1:], a, cross)
            need_f32(ts[0], "dO")
            need(ts[0] == out, f"dO must be {out}, got {ts[0]}")
            return ts[1 + index]

        def grad_ref(xs, a, index=index):
            mask = xs[4] if len(xs) == 5 else None
            return windowed_attention(*xs[1:4], a, window(a), mask, do=xs[0])[index]

        op(f"{name}Grad{part}", ("dO", "q", "k", "v", "key_mask?"), infer, grad_ref, attrs=attrs, vjp=NO_GRAD,
           kernel=_windowed_kernel, flops=lambda ins, out, a: 2 * flops(ins[1:], out, a),
           doc=f"d{part.lower()} of {name}; inputs [dO, q, k, v(, key_mask)], probabilities recomputed (see "
               f"windowed_attention; seed: MultiHeadAttnGrad{part}, without its saved LSE)")


for _name, _kind in _WINDOW_KINDS.items():
    _windowed_ops(_name, *_kind)
