"""Attention kernel time per tile shape: attention.wgsl's (WG invocations, BQ query rows, BK keys per
tile) and attention_lanes.wgsl's (R query rows of L lanes, BK keys per tile) at the SmolLM2 prefill and
MiniLM shapes, against torch's scaled_dot_product_attention, in one run.

Each shape is one graph holding one attention op, lowered by eggfuse with the tile shape forced
(``ir.ops.attention.attention_tiles`` replaced for the lowering) for every (WG, BQ, BK) that fits
the device's workgroup memory: WG 256, 128 or 64, BQ = WG / ceil(hd / 4) (one output vec4 per
invocation), BK 16, 32 or 64; then attention_lanes.wgsl (``ir.ops.attention.lane_tiles`` replaced) at
R 16, 32 or 64 rows, L 1, 2, 4, 8 or 16 lanes, BK 16, 32, 64 or 128 and P 1 or 2 rows a lane (R / P * L
<= 256, 2 to 16 keys a lane and tile) where they fit (head_dim <= 64, beyond the lowering's
LANES_MAX_HEAD_DIM). The row marked ``default`` is what the lowering picks;
``kernel`` names the shader.

- ``smollm2_prefill``: CausalAttentionRoPE, 128 rows, 9 query and 3 key/value heads of 64 (RoPE
  applied inside our kernel; the peer gets q and k already rotated, so it does less);
- ``minilm``: FullAttention with a key mask, batch 8 x 128 rows, 12 heads of 32;
- ``causal_gqa``: CausalAttention (no RoPE), 128 rows, 9 query and 3 key/value heads of 64;
- ``causal_hd32`` and ``rope_hd32``: CausalAttention and CausalAttentionRoPE, batch 4 x 128 rows, 8 query and
  2 key/value heads of 32: the causal ops at a head size attention_lanes.wgsl could take (LANES_OPS);
- ``gpt2``: CausalAttention with a key mask (i32, a row keeping no key stored as zeros: what the exported GPT-2
  gives), batch 8 x 128 rows, 12 heads of 64; the peer gets the causal and key masks as one boolean mask;
- ``gpt2_b1``, ``gpt2_b2``, ``gpt2_b4``: the same at batch 1, 2 and 4 (fewer workgroups);
- ``bert_base``: FullAttention with a key mask, batch 8 x 128 rows, 12 heads of 64 (BERT-base, ViT-B);
- ``smollm2_decode``: CachedAttentionRoPE of one query row at position 128 over a cache of 512 rows
  (129 keys seen), 9 query and 3 key/value heads of 64, for each workgroup size of
  attention_cached.wgsl (``ir.ops.kv_cache.CACHED_ATTENTION_WG`` replaced for the lowering); the
  peer attends the same 129 keys with q already rotated; then CachedAttentionRoPEAppend, the same
  step with the new key and value appended to the caches inside the kernel (what the decode plans
  run; its q, k and v are windows of one packed projection), at the default workgroup size.

Timing: ours, N back-to-back dispatches in one compute pass between GPU timestamps; the peer
(``torch.nn.functional.scaled_dot_product_attention``, fp32, [B, H, S, D], ``is_causal`` /
boolean mask, ``enable_gqa``), N calls captured in one CUDA graph, the replay timed by CUDA
events. ``--repeats`` samples, median and p90, microseconds per call. ``max_err`` is each tile
shape's largest error against the numpy reference (``eggfuse.ir.evaluate``), relative to the
output's largest magnitude.

    python3 bench/attention.py --json bench/results/attention_h200.json    # GPU machine
    python3 bench/attention.py --shapes smollm2_decode                      # only the decode rows
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from unittest import mock

import numpy as np

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.ir.ops import attention, kv_cache
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session, get_device

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

#: name -> (op, batch, seq, heads, kv heads, head size, key mask: None, "f32" (masked rows: the mean of v) or
#: "i32" (masked rows: zeros))
SHAPES = {"smollm2_prefill": ("CausalAttentionRoPE", 1, 128, 9, 3, 64, None),
          "minilm": ("FullAttention", 8, 128, 12, 12, 32, "f32"),
          "causal_gqa": ("CausalAttention", 1, 128, 9, 3, 64, None),
          "causal_hd32": ("CausalAttention", 4, 128, 8, 2, 32, None),
          "rope_hd32": ("CausalAttentionRoPE", 4, 128, 8, 2, 32, None),
          "gpt2": ("CausalAttention", 8, 128, 12, 12, 64, "i32"),
          "gpt2_b1": ("CausalAttention", 1, 128, 12, 12, 64, "i32"),
          "gpt2_b2": ("CausalAttention", 2, 128, 12, 12, 64, "i32"),
          "gpt2_b4": ("CausalAttention", 4, 128, 12, 12, 64, "i32"),
          "bert_base": ("FullAttention", 8, 128, 12, 12, 64, "f32")}
#: the decode step: (heads, kv heads, head size, position, cache rows)
DECODE = (9, 3, 64, 128, 512)


def _graph(op: str, batch: int, seq: int, nh: int, nkv: int, hd: int, masked: str | None) -> tuple[Graph, dict]:
    g = Graph()
    rows = batch * seq
    q, k, v = g.input("q", [rows, nh * hd]), g.input("k", [rows, nkv * hd]), g.input("v", [rows, nkv * hd])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((rows, w), dtype=np.float32) for n, w in (("q", nh * hd), ("k", nkv * hd),
                                                                               ("v", nkv * hd))}
    mask, rows_of = None, {}
    if masked is not None:
        dtype = DType.I32 if masked == "i32" else DType.F32
        mask = g.input("mask", [batch, seq], dtype)
        feeds["mask"] = (rng.random((batch, seq)) < 0.9).astype(dtype.numpy)
        rows_of = {"masked_rows": "zero" if masked == "i32" else "mean"}
    if op == "CausalAttentionRoPE":
        out = g.causal_attention_rope(q, k, v, nh, nkv, hd, theta=100000.0, batch=batch, key_mask=mask, **rows_of)
    elif op == "CausalAttention":
        out = g.causal_attention(q, k, v, nh, nkv, hd, batch, key_mask=mask, **rows_of)
    else:
        out = g.full_attention(q, k, v, nh, nkv, hd, batch=batch, key_mask=mask, **rows_of)
    g.set_outputs([out])
    return g, feeds


def _decode_graph(nh: int, nkv: int, hd: int, pos: int, rows: int) -> tuple[Graph, dict, dict]:
    g = Graph()
    q, p = g.input("q", [1, nh * hd]), g.input("pos", [1], DType.U32)
    k, v = g.state("k_cache", [rows, nkv * hd]), g.state("v_cache", [rows, nkv * hd])
    g.set_outputs([g.add_node("CachedAttentionRoPE", (q, k, v, p), num_heads=nh, num_kv_heads=nkv, head_dim=hd,
                              theta=100000.0)])
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((1, nh * hd), dtype=np.float32), "pos": np.array([pos], np.uint32)}
    caches = {n: rng.standard_normal((rows, nkv * hd), dtype=np.float32) for n in ("k_cache", "v_cache")}
    return g, feeds, caches


def _append_graph(nh: int, nkv: int, hd: int, rows: int) -> Graph:
    # the decode step as the rewrite engine leaves it: CachedAttentionRoPEAppend reading q, k and v as windows
    # of the packed projection [1, (nh + 2 nkv) hd] and appending row pos to both caches
    g = Graph()
    qkv, p = g.input("qkv", [1, (nh + 2 * nkv) * hd]), g.input("pos", [1], DType.U32)
    k, v = g.state("k_cache", [rows, nkv * hd]), g.state("v_cache", [rows, nkv * hd])
    g.set_outputs([g.add_node("CachedAttentionRoPEAppend", (qkv, qkv, qkv, k, v, p), num_heads=nh, num_kv_heads=nkv,
                              head_dim=hd, theta=100000.0, q_start=0, k_start=nh * hd, v_start=(nh + nkv) * hd)])
    return g


def _decode_session(g: Graph, caches: dict, device, wg: int) -> Session:
    with mock.patch.object(kv_cache, "CACHED_ATTENTION_WG", wg):
        plan = lower_for(g, device)
    return Session(plan, caches, device=device)


def time_decode_peer(torch, nh: int, nkv: int, hd: int, pos: int, feeds: dict, caches: dict, calls: int,
                     samples: int) -> list[float]:
    dev = torch.device("cuda")
    q = torch.from_numpy(feeds["q"]).to(dev).view(1, 1, nh, hd).transpose(1, 2).contiguous()
    k, v = (torch.from_numpy(caches[n][:pos + 1]).to(dev).view(1, pos + 1, nkv, hd).transpose(1, 2).contiguous()
            for n in ("k_cache", "v_cache"))
    return _sdpa_per_call(torch, q, k, v, None, False, calls, samples)


def _decode_rows(device, torch, calls: int, samples: int) -> list[dict]:
    nh, nkv, hd, pos, cache_rows = DECODE
    g, feeds, caches = _decode_graph(nh, nkv, hd, pos, cache_rows)
    (want,) = evaluate(g, feeds, caches)
    peer = None
    if torch is not None:
        peer = gpu_timing.median_p90(time_decode_peer(torch, nh, nkv, hd, pos, feeds, caches, calls, samples))
    rows = []
    for wg in (256, 128, 64):
        session = _decode_session(g, caches, device, wg)
        (got,) = session.run(feeds)
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        med, p90 = gpu_timing.median_p90(time_ours(session, calls, samples))
        row = _row("smollm2_decode", "CachedAttentionRoPE", (wg, 1, wg), wg == kv_cache.CACHED_ATTENTION_WG, nh,
                   (med, p90), err, peer)
        rows.append(row)
        _print_row(row)
    # the same step with the cache writes inside (the op the decode plans run): the new key and value are
    # row pos of the packed projection, q its first columns; against the reference of the same op
    g = _append_graph(nh, nkv, hd, cache_rows)
    rng = np.random.default_rng(1)
    feeds = {"qkv": rng.standard_normal((1, (nh + 2 * nkv) * hd), dtype=np.float32), "pos": feeds["pos"]}
    (want,) = evaluate(g, feeds, caches)
    session = _decode_session(g, caches, device, kv_cache.CACHED_ATTENTION_WG)
    (got,) = session.run(feeds)
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    wg = kv_cache.CACHED_ATTENTION_WG
    row = _row("smollm2_decode", "CachedAttentionRoPEAppend", (wg, 1, wg), True, nh,
               gpu_timing.median_p90(time_ours(session, calls, samples)), err, peer)
    rows.append(row)
    _print_row(row)
    return rows


def _row(shape: str, op: str, tiles, default: bool, workgroups: int, ours: tuple, err: float, peer) -> dict:
    # one result row: ours and peer as (median, p90) seconds per call, peer None without CUDA; tiles an
    # attention.AttentionTiles (attention.wgsl), an attention.LaneTiles (attention_lanes.wgsl: wg = R * L, bq = R)
    # or the decode rows' (wg, 1, wg)
    med, p90 = ours
    if isinstance(tiles, attention.LaneTiles):
        kernel, lanes, per_lane = "attention_lanes.wgsl", tiles.lanes, tiles.per_lane
        wg, bq, bk = tiles.rows // tiles.per_lane * tiles.lanes, tiles.rows, tiles.bk
    else:
        (wg, bq, bk), kernel, lanes, per_lane = tiles, "attention.wgsl", None, None
    return {"shape": shape, "op": op, "kernel": kernel, "wg": wg, "bq": bq, "bk": bk, "lanes": lanes,
            "per_lane": per_lane, "default": default, "workgroups": workgroups,
            "ours_us": med * 1e6, "ours_p90_us": p90 * 1e6, "max_err": err,
            "peer": "torch scaled_dot_product_attention" if peer else "skipped: no CUDA",
            "peer_mode": "cuda-graph replay" if peer else None, "peer_dtype": "fp32" if peer else None,
            "peer_us": peer[0] * 1e6 if peer else None, "ratio": med / peer[0] if peer else None}


def _print_row(row: dict) -> None:
    lanes = f"L {row['lanes']:2d} P {row['per_lane']}" if row["lanes"] else "        "
    print(f"{row['shape']:16s} {row['op'][-6:]:6s} WG {row['wg']:3d} BQ {row['bq']:3d} BK {row['bk']:3d} {lanes} "
          f"{'default' if row['default'] else '       '} wg {row['workgroups']:4d}  err {row['max_err']:.1e}  "
          f"ours {row['ours_us']:8.2f} (p90 {row['ours_p90_us']:8.2f})  "
          + (f"peer (sdpa, cuda-graph replay, fp32) {row['peer_us']:7.2f}  ratio {row['ratio']:.2f}"
             if row["peer_us"] else row["peer"]), flush=True)


def _session(g: Graph, feeds: dict, device, tiles) -> Session:
    # lowered with attention.wgsl at AttentionTiles or attention_lanes.wgsl at LaneTiles
    if isinstance(tiles, attention.LaneTiles):
        forced = mock.patch.multiple(attention, lane_tiles=lambda hd, storage=0, rope=False: tiles,
                                     takes_lanes=lambda op, hd, tiles, workgroups: True)
    else:
        forced = mock.patch.multiple(attention, lane_tiles=lambda hd, storage=0, rope=False: None,
                                     attention_tiles=lambda hd, storage=0, workgroups_at=None: tiles)
    with forced:
        plan = lower_for(g, device)
    return Session(plan, {}, device=device)


def time_ours(session: Session, calls: int, samples: int) -> list[float]:
    return gpu_timing.gpu_per_call(session, calls, samples, one_pass=True)


def time_peer(torch, op: str, batch: int, seq: int, nh: int, nkv: int, hd: int, feeds: dict, calls: int,
              samples: int) -> list[float]:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as in every fp32 peer of the benchmarks
    dev = torch.device("cuda")

    def heads(x, n):
        return torch.from_numpy(x).to(dev).view(batch, seq, n, hd).transpose(1, 2).contiguous()

    q, k, v = heads(feeds["q"], nh), heads(feeds["k"], nkv), heads(feeds["v"], nkv)
    mask, causal = None, op != "FullAttention"
    if "mask" in feeds:
        mask = torch.from_numpy(feeds["mask"] > 0).to(dev).view(batch, 1, 1, seq)
        if causal:  # sdpa takes a mask or is_causal: both as one boolean [B, 1, S, S]
            mask = mask & torch.ones(seq, seq, dtype=torch.bool, device=dev).tril()
            causal = False
    return _sdpa_per_call(torch, q, k, v, mask, causal, calls, samples)


def _sdpa_per_call(torch, q, k, v, mask, causal: bool, calls: int, samples: int) -> list[float]:
    # q [B, H, S, D], k and v [B, KV, T, D] on the GPU: seconds per call, CUDA-graph replay
    f = torch.nn.functional.scaled_dot_product_attention
    out = torch.empty_like(q)

    def step():
        out.copy_(f(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]))

    return gpu_timing.cuda_graph_per_call(torch, step, calls, samples)


def candidates(hd: int, storage: int) -> list[attention.AttentionTiles]:
    """(WG, BQ, BK) to try: workgroups of 256, 128 or 64 invocations, BQ = WG / ceil(hd / 4) rows (one
    output vec4 per invocation), BK 16, 32, 64 where they fit."""
    out = []
    for wg in (256, 128, 64):
        bq = attention.attention_rows(hd, wg)
        for bk in (16, 32, 64):
            if attention.attention_tile_bytes(hd, bq, bk, wg) <= storage:
                out.append(attention.AttentionTiles(wg, bq, bk))
    return out


def lane_candidates(hd: int, storage: int, rope: bool) -> list[attention.LaneTiles]:
    """attention_lanes.wgsl's (R, L, BK, P) to try: R 16, 32 or 64 rows, L 1, 2, 4, 8 or 16 lanes, BK 16, 32, 64 or
    128, P 1 or 2 rows a lane (R / P * L <= 256 invocations; 2 to 16 keys a lane and tile, more spill registers:
    bench/results/attention_lanes_h200/sweep_first.json) where they fit; none past head_dim 64."""
    if hd > 64:  # past it q and the output row no longer fit a lane's registers
        return []
    return [t for r in (16, 32, 64) for lanes in (1, 2, 4, 8, 16) for bk in (16, 32, 64, 128) for per in (1, 2)
            if r // per * lanes <= 256 and 2 <= bk // lanes <= 16
            and attention.lane_tile_bytes(hd, t := attention.LaneTiles(r, lanes, bk, per), rope) <= storage]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--lanes", default=None,
                    help="attention_lanes.wgsl's splits to try, R,L,BK[,P] separated by ';' (default: every one)")
    ap.add_argument("--shapes", default=",".join([*SHAPES, "smollm2_decode"]),
                    help="which of " + ", ".join([*SHAPES, "smollm2_decode"]) + " (default: all)")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    if unknown := sorted(set(shapes) - {*SHAPES, "smollm2_decode"}):
        ap.error(f"unknown shapes {', '.join(unknown)}: take from {', '.join([*SHAPES, 'smollm2_decode'])}")
    device = get_device()
    storage = int(device.limits["max-compute-workgroup-storage-size"])
    try:
        import torch

        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None
    only = None
    if args.lanes is not None:
        try:
            only = [attention.LaneTiles(*(int(x) for x in s.split(","))) for s in args.lanes.split(";")]
        except (TypeError, ValueError):
            ap.error(f"--lanes {args.lanes!r}: write R,L,BK[,P] separated by ';'")
    rows = []
    print(f"{device.adapter.info['device']}; workgroup storage {storage} B; {args.calls} calls x {args.repeats}; us")
    for name, (op, batch, seq, nh, nkv, hd, masked) in SHAPES.items():
        if name not in shapes:
            continue
        g, feeds = _graph(op, batch, seq, nh, nkv, hd, masked)
        rope = op == "CausalAttentionRoPE"
        default = attention.lane_tiles(hd, storage, rope)
        if not attention.takes_lanes(op, hd, default, batch * nh * math.ceil(seq / default.rows) if default else 0):
            default = attention.attention_tiles(hd, storage,
                                                lambda rows, b=batch, h=nh, s=seq: b * h * math.ceil(s / rows))
        (want,) = evaluate(g, feeds, {})
        peer = None
        if torch is not None:
            peer = gpu_timing.median_p90(time_peer(torch, op, batch, seq, nh, nkv, hd, feeds, args.calls,
                                                   args.repeats))
        lanes = [t for t in lane_candidates(hd, storage, rope) if only is None or t in only]
        for tiles in [*candidates(hd, storage), *lanes]:
            bq = tiles.rows if isinstance(tiles, attention.LaneTiles) else tiles.bq
            session = _session(g, feeds, device, tiles)
            (got,) = session.run(feeds)  # uploads, compiles, warms up
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            med, p90 = gpu_timing.median_p90(time_ours(session, args.calls, args.repeats))
            picked = type(tiles) is type(default) and tiles == default
            row = _row(name, op, tiles, picked, batch * nh * math.ceil(seq / bq), (med, p90), err, peer)
            rows.append(row)
            _print_row(row)
    if "smollm2_decode" in shapes:
        rows += _decode_rows(device, torch, args.calls, args.repeats)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
