"""Matmul throughput: eggfuse's WGSL kernels against torch (cuBLAS) on the same shapes, in one run.

Each shape is one graph holding one matmul (square shapes: MatMul, A [M,K] @ B [K,N];
LLM shapes: MatMulBT, x [M,K] @ W[N,K]^T, the layout of linear weights), lowered by
eggfuse (tile chosen by ``matmul_tile``) and run through its runtime's pipelines and bind
groups. GPU time per matmul is the median over a few samples of ``reps`` dispatches
recorded into one compute pass: from timestamp queries written at the pass's beginning and
end when the device has ``timestamp-query``, else wall-clock around submit + wait. The
dispatches all write the same output, so they run one after another.

When torch with CUDA is importable, the same shapes run through ``torch.matmul`` (CUDA
events, same repetition scheme) with TF32 off (``torch.backends.cuda.matmul.allow_tf32 =
False``: true fp32, the fair comparison) and on. The table prints GFLOP/s (2*M*N*K flops
per matmul) and ours / torch; JSON and, if matplotlib is importable, a PNG go to
bench/results/.

    .venv/bin/python bench/matmul.py            # all shapes (a GPU; 8192^3 needs ~1 GiB)
    .venv/bin/python bench/matmul.py --quick    # a small subset (lavapipe: about a minute)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import wgpu

from eggfuse.ir import Graph
from eggfuse.ir.ops.matmul_kernel import matmul_tile
from eggfuse.runtime import Session, get_device

SQUARE = (512, 1024, 2048, 4096, 8192)
LLM_M = (1, 16, 64, 256, 512)
LLM_KN = ((576, 1536), (1536, 576), (576, 49152))  # SmolLM2-135M: up/gate, down, LM head
QUICK = [("MatMul", 256, 256, 256), ("MatMul", 512, 512, 512), ("MatMulBT", 1, 576, 1536),
         ("MatMulBT", 16, 576, 1536), ("MatMulBT", 64, 1536, 576)]
WARMUP = ("MatMul", 4096, 4096, 4096)
RESULTS = Path(__file__).parent / "results"


def shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """(op, M, K, N) of every benchmarked matmul."""
    if quick:
        return QUICK
    out = [("MatMul", s, s, s) for s in SQUARE]
    out += [("MatMulBT", m, k, n) for k, n in LLM_KN for m in LLM_M]
    return out


def _session(op: str, m: int, k: int, n: int, device) -> Session:
    g = Graph()
    b_shape = [n, k] if op == "MatMulBT" else [k, n]
    a, b = g.input("a", [m, k]), g.parameter("b", b_shape)
    g.set_outputs([g.matmul_bt(a, b) if op == "MatMulBT" else g.matmul(a, b)])
    rng = np.random.default_rng(0)
    session = Session(g, {"b": rng.standard_normal(b_shape, dtype=np.float32)}, device=device)
    session.run({"a": rng.standard_normal((m, k), dtype=np.float32)})  # uploads a, compiles, warms up
    return session


def _time_dispatches(session: Session, reps: int, query) -> float:
    # Seconds per dispatch of the session's single kernel, `reps` of them in one pass.
    # Session._commands holds each dispatch's pipeline, bind group and grid (as runtime.profile uses it).
    device = session.device
    pipeline, bind_group, grid = session._commands[0]
    encoder = device.create_command_encoder()
    stamps = None
    if query:
        stamps = {"query_set": query[0], "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
    compute = encoder.begin_compute_pass(timestamp_writes=stamps)
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, bind_group)
    for _ in range(reps):
        compute.dispatch_workgroups(*grid)
    compute.end()
    if query:
        encoder.resolve_query_set(query[0], 0, 2, query[1], 0)
    t = time.perf_counter()
    device.queue.submit([encoder.finish()])
    session.wait()
    wall = time.perf_counter() - t
    if query:
        ticks = np.frombuffer(device.queue.read_buffer(query[1]), dtype=np.uint64)
        return float(ticks[1] - ticks[0]) * 1e-9 / reps
    return wall / reps


def time_ours(session: Session, budget_s: float, samples: int = 5) -> float:
    """Median seconds per dispatch: a calibration pass sizes `reps` to ~budget_s / samples."""
    device = session.device
    query = None
    if "timestamp-query" in device.features:
        query = (device.create_query_set(type=wgpu.QueryType.timestamp, count=2),
                 device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))
    one = _time_dispatches(session, 2, query)
    reps = int(min(1000, max(2, budget_s / samples / max(one, 1e-7))))
    return statistics.median(_time_dispatches(session, reps, query) for _ in range(samples))


def time_torch(torch, op: str, m: int, k: int, n: int, tf32: bool, budget_s: float, samples: int = 5) -> float:
    """Median seconds per torch.matmul on CUDA (events around `reps` back-to-back calls)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(m, k, device="cuda")
    b = torch.randn((n, k) if op == "MatMulBT" else (k, n), device="cuda")
    w = b.t() if op == "MatMulBT" else b
    c = torch.matmul(a, w)

    def run(reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.matmul(a, w, out=c)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e-3 / reps

    one = run(3)
    reps = int(min(1000, max(3, budget_s / samples / max(one, 1e-7))))
    return statistics.median(run(reps) for _ in range(samples))


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _plot(rows: list[dict], path: Path, adapter: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [r["shape"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(rows)), 5))
    series = [("ours", "ours_gflops")]
    if any(r.get("torch_fp32_gflops") for r in rows):
        series += [("torch fp32", "torch_fp32_gflops"), ("torch tf32", "torch_tf32_gflops")]
    width = 0.8 / len(series)
    for s, (name, key) in enumerate(series):
        ax.bar(x + s * width, [r.get(key) or 0 for r in rows], width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2, labels, rotation=60, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"matmul throughput, {adapter}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _print_row(row: dict) -> None:
    def fmt(key: str, spec: str) -> str:
        return format(row[key], spec) if key in row else "-"

    print(f"{row['shape']:<26}{row['kernel'][:29]:<30}{row['ours_gflops']:>13.1f}"
          f"{fmt('torch_fp32_gflops', '.1f'):>12}{fmt('ratio_fp32', '.3f'):>8}"
          f"{fmt('torch_tf32_gflops', '.1f'):>12}{fmt('ratio_tf32', '.3f'):>8}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (lavapipe)")
    ap.add_argument("--budget", type=float, default=0.5, help="GPU seconds to spend per shape and implementation")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds of matmuls run first, so that an idle GPU's clocks are up when timing starts")
    ap.add_argument("--no-torch", action="store_true", help="skip torch even when it is importable")
    ap.add_argument("--json", type=Path, default=RESULTS / "matmul.json")
    args = ap.parse_args()

    device = get_device()
    torch = None if args.no_torch else _torch_cuda()
    todo = shapes(args.quick)
    warm = _session(*(todo[0] if args.quick else WARMUP), device)
    print(f"adapter: {warm.adapter}; timing: {'timestamps' if 'timestamp-query' in device.features else 'wall'}; "
          f"torch: {torch.cuda.get_device_name() if torch else 'absent'}")
    start = time.perf_counter()
    while time.perf_counter() - start < args.warmup:
        time_ours(warm, 0.5, samples=1)
    del warm
    print(f"{'shape':<26}{'kernel':<30}{'ours GFLOP/s':>13}{'torch fp32':>12}{'ratio':>8}"
          f"{'torch tf32':>12}{'ratio':>8}")
    rows = []
    for op, m, k, n in todo:
        session = _session(op, m, k, n, device)
        adapter = session.adapter
        flops = 2.0 * m * n * k
        ours = time_ours(session, args.budget)
        tile = matmul_tile(m, n, "BT" if op == "MatMulBT" else "")
        row = {"op": op, "m": m, "k": k, "n": n, "shape": f"{op}[{m},{k},{n}]",
               "kernel": session.plan.dispatches[0].kernel, "tile": tile.name,
               "ours_s": ours, "ours_gflops": flops / ours * 1e-9}
        del session
        if torch is not None:
            for tf32 in (False, True):
                t = time_torch(torch, op, m, k, n, tf32, args.budget)
                key = "tf32" if tf32 else "fp32"
                row[f"torch_{key}_s"] = t
                row[f"torch_{key}_gflops"] = flops / t * 1e-9
                row[f"ratio_{key}"] = t / ours
        rows.append(row)
        _print_row(row)
    result = {"adapter": adapter, "torch": torch.cuda.get_device_name() if torch else None,
              "timing": "timestamps" if "timestamp-query" in device.features else "wall", "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    png = args.json.with_suffix(".png")
    print(f"wrote {args.json}" + (f" and {png}" if _plot(rows, png, adapter) else " (no matplotlib: no plot)"))


if __name__ == "__main__":
    main()
