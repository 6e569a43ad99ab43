"""Matmul time: eggfuse's WGSL kernel against cuBLAS (torch.matmul, fp32, TF32 off, or bf16), both over
the same N back-to-back calls, in one run.

Each shape is one graph holding one matmul, lowered by eggfuse (tile chosen by
``matmul_tile``) and run through its runtime's pipelines and bind groups: square shapes as
MatMul, A [M,K] @ B [K,N]; LLM shapes as MatMulBT, x [M,K] @ W[N,K]^T (the layout of linear
weights). LLM shapes: M in 1, 2, 4, ..., 512 with the (K, N) of SmolLM2-135M (576->192 k/v,
576->576 q/o, 576->1536 gate/up, 1536->576 down, 576->49152 LM head) and all-MiniLM-L6-v2
(384->384, 384->1536, 1536->384); square 4096^3 (``--big``: also 8192^3). ``--shapes`` gives
other MatMulBT shapes (``MatMul:M,K,N``: B stored [K,N]). ``--weights FORMAT`` (q4_0, q4_1, q8_0,
f16) stores B as gguf's blocks of it (QuantMatMul: the kernel decodes them while loading; MatMulBT
shapes only) and gives the peer the blocks' values; ``--peer-dtype bf16`` runs cuBLAS in bf16, the
quantised decode's peer.

Both sides re-read the same B call after call, so a B of up to tens of MiB is read from the L2 cache (50 MiB
on an H100 or H200), not from memory as a model's weights are, each read once a run. ``--cold`` reads it from
memory: each call reads the next of as many copies of B as hold ``gpu_timing.COLD_BYTES`` (200 MiB; at least 2,
at most 1024 copies), ours through bind groups that differ in B alone (``gpu_timing.weight_copies``), cuBLAS
through copies of the tensor in its captured calls; both still write one output, call after call. N is then a
multiple of the copies (``gpu_timing.cold_calls``), so that every copy is read that many calls after its last use.

Timing, per shape, N calls (N sized so that N of our calls take about ``--budget`` /
``--repeats`` seconds, 2..1000), ``--repeats`` samples, median and p90:

- ours: N dispatches of the kernel recorded back-to-back into one compute pass, GPU
  timestamps at the pass's beginning and end (``ours_timing`` "timestamps"; wall clock around
  submit + wait where the device has no ``timestamp-query``). The dispatches write the same
  output, so they run one after another.
- peer: ``torch.matmul(a, w, out=c)`` N times captured in one ``torch.cuda.CUDAGraph``
  (warmed up on a side stream first, as the torch docs ask), the replay timed by CUDA events
  (``peer_timing`` "cuda-graph"): no Python launch overhead, as none is in ours.

Columns (JSON fields, one row per shape): ``op``, ``m``, ``k``, ``n``, ``calls`` (N);
``ours_us``/``ours_p90_us`` and ``peer_us``/``peer_p90_us``: microseconds per matmul;
``ratio`` = ours_us / peer_us (below 1: ours faster); ``ours_gflops``/``peer_gflops``
(2*M*N*K flops per matmul); ``kernel``/``tile``/``splits``: our kernels (a split-K product
has two: the tiled kernel over ``splits`` K ranges and the reduction); ``gemv_cols``: the GEMV
column count ``--gemv-cols`` forced (``matmul_choice``), or None; ``weight_copies``: the copies of B each side
read in turn (1; ``--cold``: more). Without CUDA (or with
``--no-torch``) the peer fields say "skipped: no CUDA". The rows go to ``--json`` (a list), a
PNG beside it when matplotlib is importable.

``--sweep`` times ours alone at every tile shape and split-K count (``matmul_choice``) for the
LLM shapes at M in SWEEP_M (plus SmolLM2's packed QKV and gate/up widths and MiniLM's QKV),
one row per (shape, tile, splits) with ``chosen`` true for the heuristic's pick
(``matmul_tile``, ``matmul_splits``), and prints each shape's best against the pick; each
configuration runs SWEEP_WARMUP_S of calls before its samples. ``--sweep-shapes``,
``--sweep-tiles`` (names such as ``64x64x16`` or ``64x64x16m8x8``; the pick is always timed) and
``--sweep-splits`` narrow it.

    .venv/bin/python bench/matmul.py --quick                             # here (lavapipe), ~1 minute
    python3 bench/matmul.py --json bench/results/matmul_h200.json        # GPU machine, ~2 minutes
    python3 bench/matmul.py --sweep --json bench/results/matmul_sweep_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops.matmul_kernel import (
    DEEP_STORAGE,
    MATMUL_TILES_ALL,
    MatmulTile,
    fitted_tile,
    matmul_choice,
    matmul_splits,
    matmul_tile,
)
from eggfuse.ir.ops.quant import BLOCK, FORMATS
from eggfuse.models.gguf import requantise
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session, get_device

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

LLM_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LLM_KN = ((576, 192), (576, 576), (576, 1536), (1536, 576), (576, 49152),  # SmolLM2-135M
          (384, 384), (384, 1536), (1536, 384))                            # all-MiniLM-L6-v2
SWEEP_M = (16, 128, 512, 1024)
SWEEP_KN = LLM_KN[:4] + LLM_KN[5:] + ((576, 960), (576, 3072), (384, 1152))
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8)
#: Seconds of back-to-back calls of each shape and swept configuration before its samples: making its
#: session leaves the GPU idle long enough for its SM clock to fall (gpu_timing.WARMUP_S); without this,
#: samples of a few milliseconds each were timed at the low clock, up to 5x the configuration's time
#: (a Q8_0 GEMV of 1 x 576 x 49152 after seconds of quantising: 109 us a call, against 27 with the clock up).
#: 0.1 s was too short on an H100 at ``--budget 0.05``: the heuristic's picks of 256 x 1536 x 576, 512 x 1536 x 576
#: and 128 x 576 x 1536 timed 136.5, 50.8 and 57.8 us a call, against 27.8, 43.6 and 17.1 with 0.5 s
#: (bench/results/token_pool_chunks_h100/sweep_split.json; VARIANTS.md there).
SWEEP_WARMUP_S = 0.5
SQUARE = (4096,)
BIG = (8192,)
QUICK = [("MatMul", 256, 256, 256), ("MatMulBT", 1, 576, 1536), ("MatMulBT", 16, 576, 192),
         ("MatMulBT", 64, 1536, 576)]
WARMUP = ("MatMul", 4096, 4096, 4096)
RESULTS = Path(__file__).parent / "results"
SKIPPED = "skipped: no CUDA"


def _triple(text: str) -> tuple[int, int, int]:
    """(M, K, N) of "M,K,N" (--shapes, --sweep-shapes)."""
    try:
        m, k, n = (int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"a shape is M,K,N (three integers), got {text!r}") from None
    if min(m, k, n) < 1:
        raise SystemExit(f"a shape's sizes are positive, got {text!r}")
    return m, k, n


def _op_shape(text: str) -> tuple[str, int, int, int]:
    """(op, M, K, N) of "M,K,N" (MatMulBT) or "MatMul:M,K,N" (--shapes)."""
    op, _, sizes = text.rpartition(":")
    if op not in ("", "MatMul", "MatMulBT"):
        raise SystemExit(f"a shape's op is MatMul or MatMulBT (B stored [K,N] or [N,K]), got {op!r} in {text!r}")
    return (op or "MatMulBT", *_triple(sizes))


def shapes(quick: bool, big: bool) -> list[tuple[str, int, int, int]]:
    """(op, M, K, N) of every benchmarked matmul."""
    if quick:
        return QUICK
    out = [("MatMulBT", m, k, n) for k, n in LLM_KN for m in LLM_M]
    return out + [("MatMul", s, s, s) for s in SQUARE + (BIG if big else ())]


def sweep(device, budget: float, repeats: int, todo: list[tuple[int, int, int]], out: Path,
          tiles: tuple[MatmulTile, ...] = MATMUL_TILES_ALL,
          split_counts: tuple[int, ...] = SWEEP_SPLITS, weights: str = "f32") -> list[dict]:
    """Ours at every (tile of ``tiles``, split count of ``split_counts`` or the heuristic's for the tile)
    and at the heuristic's pick for the (M, K, N) of ``todo`` (MatMulBT), rows written to ``out`` as
    they come."""
    rows = []
    storage = int(device.limits["max-compute-workgroup-storage-size"])  # what a forced tile may take
    for m, k, n in todo:
        if True:
            pick = fitted_tile(matmul_tile(m, k, n, "BT", quantised=weights != "f32"), storage)
            pick_splits = matmul_splits(pick, m, k, n)
            best = None
            for tile in dict.fromkeys((*tiles, pick)):  # the heuristic's pick even when not among ``tiles``
                if not tile.gemv and not all(side == 32 or dim >= side for side, dim in ((tile.bm, m), (tile.bn, n))):
                    continue
                if tile.storage > storage:
                    continue
                for splits in ([1] if tile.gemv else sorted({*split_counts, matmul_splits(tile, m, k, n)})):
                    if splits > 1 and k // splits < 64:
                        continue
                    # the GEMV pick (gemv_bt_rows, 5-16 rows) as the lowering makes it; tiles through matmul_choice
                    with contextlib.nullcontext() if tile.gemv else matmul_choice(tile=tile, splits=splits):
                        session = matmul_session("MatMulBT", m, k, n, device, weights=weights)
                    calls = calls_for(session, budget, repeats)
                    warm_up(session, SWEEP_WARMUP_S, calls)
                    us = gpu_timing.median_p90(time_ours(session, calls, repeats))[0] * 1e6
                    del session
                    row = {"op": "MatMulBT", "m": m, "k": k, "n": n, "weights": weights, "tile": tile.name,
                           "splits": splits, "ours_us": us, "chosen": tile == pick and splits == pick_splits}
                    rows.append(row)
                    best = row if best is None or us < best["ours_us"] else best
            chosen = next(r for r in rows[::-1] if r["chosen"] and (r["m"], r["k"], r["n"]) == (m, k, n))
            print(f"[{m},{k},{n}] best {best['tile']} split {best['splits']}: {best['ours_us']:.2f} us; "
                  f"chosen {chosen['tile']} split {chosen['splits']}: {chosen['ours_us']:.2f} us "
                  f"({chosen['ours_us'] / best['ours_us']:.2f}x)", flush=True)
            out.write_text(json.dumps(rows, indent=1))
    return rows


def _tile(op: str, m: int, k: int, n: int, gemv_cols: int | None, weights: str = "f32",
          storage: int = DEEP_STORAGE) -> MatmulTile:
    """The tile our kernel takes on a device of ``storage`` bytes of workgroup memory: the heuristic's (B stored as
    ``weights``), or the GEMV with ``gemv_cols`` columns forced."""
    tile = fitted_tile(matmul_tile(m, k, n, "BT" if op == "MatMulBT" else "", quantised=weights != "f32"), storage)
    if gemv_cols is not None and op == "MatMulBT" and tile.gemv:
        return MatmulTile(tile.bm, gemv_cols, 0, gemv=True)  # the rows of a workgroup's block (gemv_tile)
    return tile


@functools.lru_cache(maxsize=2)
def weight_values(op: str, k: int, n: int, weights: str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """(the stored B, its float32 values) for ``op`` of [K,N] on random normal weights (seed 0):
    fp32 [N,K] ('BT') or [K,N]; a block format of ``eggfuse.ir.ops.quant`` (MatMulBT only): the
    u32 rows of gguf's blocks of the fp32 [N,K], and those blocks dequantised (what the peer gets).
    Cached (quantising takes seconds, which would leave the GPU idle before the peer's timing); the
    arrays are shared, so callers do not modify them."""
    b_shape = [n, k] if op == "MatMulBT" else [k, n]
    b = np.random.default_rng(0).standard_normal(b_shape, dtype=np.float32)
    if weights == "f32":
        return b, b
    if op != "MatMulBT":
        raise SystemExit(f"--weights {weights} applies to MatMulBT (B [N,K]: blocks along K) only, not {op}")
    if k % BLOCK:
        raise SystemExit(f"--weights {weights} needs K a multiple of {BLOCK} (whole blocks along K), got K = {k}")
    stored, formats = requantise({"b": b}, {}, weights)
    return stored["b"], requantise(stored, formats, "f32")[0]["b"]


def matmul_session(op: str, m: int, k: int, n: int, device, lower=lower_for, weights: str = "f32") -> Session:
    """A session of one ``op`` (MatMul or MatMulBT) of [M,K] x [K,N], lowered by ``lower(graph, device)``,
    on random weights (:func:`weight_values`: a block format makes the op QuantMatMul, decoding the
    blocks while loading) and a random A (seed 1), run once."""
    g = Graph()
    stored = weight_values(op, k, n, weights)[0]
    a = g.input("a", [m, k])
    if weights != "f32":
        b = g.parameter("b", list(stored.shape), DType.U32)
        g.set_outputs([g.add_node("QuantMatMul", (a, b), format=weights, epilogue=())])
    else:
        b = g.parameter("b", list(stored.shape))
        g.set_outputs([g.matmul_bt(a, b) if op == "MatMulBT" else g.matmul(a, b)])
    session = Session(lower(g, device), {"b": stored}, device=device)
    a_values = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    session.run({"a": a_values})  # uploads a, compiles, warms up
    return session


def _wall_per_call(session: Session, calls: int, samples: int) -> list[float]:
    # Without timestamp queries: wall clock around one submit of `calls` dispatches and a wait.
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        encoder = session.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for _ in range(calls):
            for pipeline, bind_group, grid in session._commands:  # a split-K product after the RmsNorm prologue has two
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(*grid)
        compute.end()
        session.device.queue.submit([encoder.finish()])
        session.wait()
        out.append((time.perf_counter() - t) / calls)
    return out


def time_ours(session: Session, calls: int, samples: int, commands: list[list[tuple]] | None = None) -> list[float]:
    """Seconds per dispatch, one value per sample of ``calls`` back-to-back dispatches in one pass;
    ``commands`` (``gpu_timing.weight_copies``, ``--cold``): on those copies of B in turn. Wall clock (hot
    only) where the device has no ``timestamp-query``."""
    stamps = gpu_timing.gpu_per_call(session, calls, samples, one_pass=True, commands=commands)
    if stamps is None and commands is not None and len(commands) > 1:
        raise SystemExit("--cold needs GPU timestamps (the device's timestamp-query feature)")
    return stamps if stamps is not None else _wall_per_call(session, calls, samples)


def warm_up(session: Session, seconds: float, calls: int, commands: list[list[tuple]] | None = None) -> None:
    """Samples of ``calls`` back-to-back dispatches of ours for ``seconds``, so that the GPU's clock is
    up when timing starts (gpu_timing.WARMUP_S)."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        time_ours(session, calls, 1, commands)


def calls_for(session: Session, budget_s: float, samples: int, commands: list[list[tuple]] | None = None) -> int:
    """N back-to-back calls so that one sample of ours takes about ``budget_s / samples``."""
    one = time_ours(session, 2, 1, commands)[0]
    return int(min(1000, max(2, budget_s / samples / max(one, 1e-7))))


def time_peer(torch, op: str, m: int, k: int, n: int, calls: int, samples: int, dtype: str = "fp32",
              values: np.ndarray | None = None, copies: int = 1) -> list[float]:
    """Seconds per torch.matmul (``dtype`` fp32 with TF32 off, or bf16), one value per sample:
    ``calls`` matmuls captured in one CUDA graph, each replay timed by CUDA events. ``values``: B's
    values (default random). ``copies`` (``--cold``): the calls read that many copies of B in turn, as ours
    do (``gpu_timing.weight_copies``), writing the same output on one stream."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(m, k, device="cuda", dtype=dt)
    b = (torch.from_numpy(values).to("cuda", dt) if values is not None
         else torch.randn((n, k) if op == "MatMulBT" else (k, n), device="cuda", dtype=dt))
    ws = [b.t() if op == "MatMulBT" else b]  # x @ W^T, as F.linear computes it
    ws += [w.clone() for w in ws * (copies - 1)]  # a clone of a transposed view keeps its strides
    c = torch.empty(m, n, device="cuda", dtype=dt)
    turn = itertools.cycle(ws)
    # warm-up (cuBLAS handle, workspace) on a side stream, then the capture and its replays
    return gpu_timing.cuda_graph_per_call(torch, lambda: torch.matmul(a, next(turn), out=c), calls, samples)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    peer = any(r["peer_us"] for r in rows)
    key, label = ("ratio", "ours / cuBLAS time (below 1: ours faster)") if peer else ("ours_gflops", "ours GFLOP/s")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, n in dict.fromkeys((r["k"], r["n"]) for r in rows if r["op"] == "MatMulBT"):
        mine = [r for r in rows if r["op"] == "MatMulBT" and (r["k"], r["n"]) == (k, n)]
        ax.plot([r["m"] for r in mine], [r[key] for r in mine], marker="o", label=f"K={k}, N={n}")
    for r in rows:
        if r["op"] == "MatMul":
            ax.axhline(r[key], linestyle=":", color="gray")
            ax.annotate(f"{r['m']}^3", (1, r[key]), fontsize=7)
    if peer:
        ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (rows)")
    ax.set_ylabel(label)
    vs = f"vs {rows[0]['peer']} ({rows[0]['peer_timing']})" if peer else f"(peer {SKIPPED})"
    dtype = "" if peer and rows[0]["peer_dtype"] == "fp32" else f" against {rows[0]['peer_dtype']}"
    ax.set_title(f"matmul, B {rows[0]['weights']}{dtype}, {rows[0]['adapter']} {vs}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _print_row(row: dict) -> None:
    def f(key: str, spec: str) -> str:
        return "-" if row.get(key) is None else format(row[key], spec)

    shape = f"{row['op']}[{row['m']},{row['k']},{row['n']}]"
    print(f"{shape:<26}{row['kernel'][:27]:<28}{row['calls']:>6}{f('ours_us', '.2f'):>11}{f('ours_p90_us', '.2f'):>9}"
          f"{f('peer_us', '.2f'):>11}{f('peer_p90_us', '.2f'):>9}{f('ratio', '.3f'):>8}"
          f"{f('ours_gflops', '.0f'):>10}{f('peer_gflops', '.0f'):>10}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (lavapipe)")
    ap.add_argument("--big", action="store_true", help="also 8192^3 (~1 GiB)")
    ap.add_argument("--repeats", type=int, default=10, help="samples per shape and side, for median and p90")
    ap.add_argument("--budget", type=float, default=0.25, help="GPU seconds of our calls per shape (sizes N)")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds of matmuls run first, so that an idle GPU's clocks are up when timing starts")
    ap.add_argument("--no-torch", action="store_true", help="skip the peer even when torch with CUDA is importable")
    ap.add_argument("--sweep", action="store_true", help="ours at every tile and split-K count (no peer)")
    ap.add_argument("--sweep-shapes", help="M,K,N;M,K,N;... for --sweep (default SWEEP_M x SWEEP_KN)")
    ap.add_argument("--sweep-tiles", help="BMxBNxBK,... for --sweep (default every tile of MATMUL_TILES_ALL)")
    ap.add_argument("--sweep-splits", help=f"split-K counts for --sweep, e.g. 1,2,4 (default "
                                           f"{','.join(map(str, SWEEP_SPLITS))}; each tile's own count is "
                                           f"always timed)")
    ap.add_argument("--max-m", type=int, help="only the shapes of at most this M (e.g. 4: the GEMV kernel's)")
    ap.add_argument("--gemv-cols", type=int, help="output columns per workgroup of every 'BT' GEMV (M <= 4, or "
                    "5-16 rows where gemv_bt_rows says) instead of gemv_bt_cols's (matmul_choice)")
    ap.add_argument("--weights", default="f32", choices=("f32", *FORMATS),
                    help="B's storage: fp32, or a block format of eggfuse.ir.ops.quant (QuantMatMul, MatMulBT shapes "
                         "only; the peer gets the blocks' values)")
    ap.add_argument("--peer-dtype", default="fp32", choices=("fp32", "bf16"),
                    help="cuBLAS's dtype (fp32 with TF32 off, or bf16: the quantised decode's peer)")
    ap.add_argument("--shapes", help="M,K,N;M,K,N;... MatMulBT shapes instead of the default list; "
                                     "MatMul:M,K,N for B stored [K,N]")
    ap.add_argument("--cold", action="store_true",
                    help="both sides read B from memory, not the L2 cache: each call reads the next of as many "
                         "copies of B as hold gpu_timing.COLD_BYTES (200 MiB; at most 1024 copies)")
    ap.add_argument("--json", type=Path, default=RESULTS / "matmul.json")
    ap.add_argument("--set", action="append", default=[], help="MODULE.NAME=VALUE: a constant of an eggfuse module "
                    "set before lowering (bench/plan_ab.py's form), e.g. "
                    "eggfuse.ir.ops.matmul_kernel.MATMUL_OUT_VEC4=False; as often as needed")
    args = ap.parse_args()
    if args.set:
        from plan_ab import parse_setting  # bench/plan_ab.py

        for module, name, value in map(parse_setting, args.set):
            setattr(importlib.import_module(module), name, value)

    device = get_device()
    torch = None if args.no_torch else _torch_cuda()
    if args.sweep and (args.max_m is not None or args.gemv_cols is not None or args.cold):
        raise SystemExit("--max-m, --gemv-cols and --cold apply to the timed run, not to --sweep (--sweep-shapes "
                         "picks its shapes)")
    listed = ([_op_shape(t) for t in args.shapes.split(";")] if args.shapes
              else shapes(args.quick, args.big))
    if args.weights != "f32":
        listed = [t for t in listed if t[0] == "MatMulBT"]
        if not listed:
            raise SystemExit(f"--weights {args.weights} stores B as blocks along K, which only MatMulBT shapes have "
                             "(B [N,K]): give M,K,N shapes without MatMul:")
    todo = [t for t in listed if args.max_m is None or t[1] <= args.max_m]
    if not todo:
        raise SystemExit(f"no shape has M <= {args.max_m}")
    warm = matmul_session(*(todo[0] if args.quick or args.shapes else WARMUP), device)
    ours_timing = "timestamps" if gpu_timing.has_timestamps(device) else "wall"
    dtype = "fp32, TF32 off" if args.peer_dtype == "fp32" else args.peer_dtype
    peer = f"torch.matmul on {torch.cuda.get_device_name()} (cuBLAS {dtype}), CUDA-graph replay" if torch \
        else SKIPPED
    print(f"B stored as {args.weights}")
    print(f"adapter: {warm.adapter}; ours timed by {ours_timing}; peer: {peer}")
    warm_up(warm, args.warmup, calls_for(warm, 0.5, 1))
    del warm
    if args.sweep:
        todo = [_triple(t) for t in args.sweep_shapes.split(";")] if args.sweep_shapes \
            else [(m, k, n) for k, n in SWEEP_KN for m in SWEEP_M]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        every = {t.name: t for t in MATMUL_TILES_ALL}
        names = args.sweep_tiles.split(",") if args.sweep_tiles else list(every)
        if bad := [t for t in names if t not in every]:
            raise SystemExit(f"unknown tiles {bad}: each one of {', '.join(every)}")
        counts = tuple(int(s) for s in args.sweep_splits.split(",")) if args.sweep_splits else SWEEP_SPLITS
        sweep(device, args.budget / 10, max(3, args.repeats // 2), todo, args.json, tuple(every[t] for t in names),
              counts, args.weights)
        print(f"wrote {args.json}")
        return
    print(f"{'shape':<26}{'kernel':<28}{'N':>6}{'ours us':>11}{'p90':>9}{'cuBLAS us':>11}{'p90':>9}{'ratio':>8}"
          f"{'ours GF/s':>10}{'peer GF/s':>10}")
    rows = []
    for op, m, k, n in todo:
        with matmul_choice(gemv_cols=args.gemv_cols):
            session = matmul_session(op, m, k, n, device, weights=args.weights)
        copies = gpu_timing.copies_for(session) if args.cold else 1
        commands = gpu_timing.weight_copies(session, copies) if args.cold else None
        calls = gpu_timing.cold_calls(calls_for(session, args.budget, args.repeats, commands), copies)
        warm_up(session, SWEEP_WARMUP_S, calls, commands)  # making the session (quantising B: seconds) idles the GPU
        flops = 2.0 * m * n * k
        ours, ours_p90 = gpu_timing.median_p90(time_ours(session, calls, args.repeats, commands))
        row = {"op": op, "m": m, "k": k, "n": n, "calls": calls, "samples": args.repeats,
               "kernel": "; ".join(d.kernel for d in session.plan.dispatches),
               "tile": (tile := _tile(op, m, k, n, args.gemv_cols, args.weights,
                                      int(device.limits["max-compute-workgroup-storage-size"]))).name,
               "gemv_cols": args.gemv_cols,
               "splits": matmul_splits(tile, m, k, n),
               "adapter": session.adapter, "ours_timing": ours_timing, "ours_us": ours * 1e6,
               "ours_p90_us": ours_p90 * 1e6, "ours_gflops": flops / ours * 1e-9,
               "weights": args.weights, "weight_copies": copies, "peer": SKIPPED, "peer_dtype": args.peer_dtype,
               "peer_tf32": False,
               "peer_timing": SKIPPED,
               "peer_us": None, "peer_p90_us": None, "peer_gflops": None, "ratio": None}
        del session, commands
        if torch is not None:
            values = weight_values(op, k, n, args.weights)[1] if args.weights != "f32" else None
            peer, peer_p90 = gpu_timing.median_p90(time_peer(torch, op, m, k, n, calls, args.repeats,
                                                             args.peer_dtype, values, copies))
            row.update({"peer": f"torch.matmul (cuBLAS) on {torch.cuda.get_device_name()}", "peer_timing": "cuda-graph",
                        "peer_us": peer * 1e6, "peer_p90_us": peer_p90 * 1e6, "peer_gflops": flops / peer * 1e-9,
                        "ratio": ours / peer, "torch": torch.__version__})
        rows.append(row)
        _print_row(row)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    png = args.json.with_suffix(".png")
    print(f"wrote {args.json}" + (f" and {png}" if _plot(rows, png) else " (no matplotlib: no plot)"))


if __name__ == "__main__":
    main()
