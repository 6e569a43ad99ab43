"""Host overhead of the runtime: time to record one dispatch, and a plan run against its GPU time.

Measures in one run on the current adapter, for each plan:

- record: host time to record the whole plan and submit it (``Session.record_and_submit``),
  per dispatch, against the peer: the same plan recorded with wgpu-py's own API calls
  (``GPUComputePassEncoder.set_pipeline`` ...);
- run host time: ``Session.run(inputs, read=())`` until it returns, per dispatch (issue 7's
  target is <= 2 us), with the run's command buffer pre-recorded while the previous run
  executed (the default) and recorded inside ``run`` (``prerecord=False``);
- run: wall time of ``Session.run`` (write inputs, submit, wait, read back), against the
  peer ``run(read=())`` followed by wgpu-py's ``queue.read_buffer`` of each output
  (``run_read_buffer_peer_ms``);
- wait: ``Session.wait`` on an idle device (``wait_idle_us``) against a 4-byte
  ``queue.read_buffer`` (``read_buffer_4_bytes_idle_us``), wgpu-py's public way to wait;
- GPU: the plan's summed GPU time from timestamp queries (when the device has them).

Plans: ``chain``, ``--dispatches`` tiny dependent elementwise kernels (GPU work negligible),
and with ``--graphs DIR`` the fused model plans saved by ``bench/models.py --save-graphs``
(SmolLM2 decode and prefill, MiniLM), with random weights of the real shapes.

The rows go to ``--json`` and, when matplotlib is importable, a bar plot of the host times per
dispatch (with the 2 us target) next to it as PNG. ``--plot-from A.json B.json ...`` draws that
plot from saved runs instead of measuring (bars at the median of the runs, whiskers at their
minimum and maximum).

    .venv/bin/python bench/runtime_overhead.py [--dispatches 1000] [--graphs bench/graphs] [--json FILE]
    .venv/bin/python bench/runtime_overhead.py --plot-from run1.json run2.json --json out.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from eggfuse.ir import Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session, get_device
from eggfuse.runtime.profile import profile

sys.path.insert(0, str(Path(__file__).parent))


def chain(n: int) -> tuple[Graph, dict, dict]:
    g = Graph()
    h = g.input("x", [64])
    for _ in range(n):
        h = g.neg(h)
    g.set_outputs([h])
    return g, {"x": np.ones(64, dtype=np.float32)}, {}


def saved_plan(directory: Path, name: str, context: int) -> tuple[Graph, dict, dict]:
    from models import random_values

    saved = pickle.loads((directory / f"{name}.pkl").read_bytes())
    inputs, params = random_values(saved["unfused"])
    fused = saved["fused"]
    if name == "smollm2_decode":
        inputs = {"tokens": np.array([1], np.uint32), "pos": np.array([context], np.uint32)}
    return fused, inputs, {k: v for k, v in params.items() if k in fused.parameters}


def wgpu_py_record(session: Session) -> None:
    # The peer: the same plan recorded through wgpu-py's public API in one compute pass.
    encoder = session.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    for pipeline, bind_group, grid in session._commands:
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*grid)
    compute.end()
    session.device.queue.submit([encoder.finish()])


def median_us_per_dispatch(fn, session: Session, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        session.wait()
    return statistics.median(times) / len(session.plan.dispatches) * 1e6


def measure(name: str, graph: Graph, inputs: dict, params: dict, repeats: int, device) -> dict:
    s = Session(lower_for(graph, device), params, device=device)
    s_sync = Session(lower_for(graph, device), params, device=device, share=s, prerecord=False)
    n = len(s.plan.dispatches)
    row = {"plan": name, "dispatches": n, "adapter": s.adapter, "recording": s.recording}
    for session in (s, s_sync):
        session.run(inputs)
    row["wgpu_py_record_us_per_dispatch"] = median_us_per_dispatch(lambda: wgpu_py_record(s), s, repeats)
    row["record_us_per_dispatch"] = median_us_per_dispatch(s.record_and_submit, s, repeats)
    # a run that reads nothing back (a training step, say): host time until run() returns
    row["run_host_us_per_dispatch_prerecorded"] = median_us_per_dispatch(lambda: s.run(inputs, read=()), s, repeats)
    row["run_host_us_per_dispatch_recorded_in_run"] = median_us_per_dispatch(
        lambda: s_sync.run(inputs, read=()), s_sync, repeats)
    row["run_ms"] = _median_ms(lambda: s.run(inputs), repeats)
    # the peer of run()'s read-back: run(read=()), then wgpu-py's queue.read_buffer of each output
    out = [(s._buffers[i], s._offsets[i], s.plan.buffers[i].size_bytes) for i in s.plan.outputs]
    row["run_read_buffer_peer_ms"] = _median_ms(lambda: [s.run(inputs, read=()),
                                                         *(device.queue.read_buffer(*o) for o in out)], repeats)
    s.wait()
    row["wait_idle_us"] = _median_ms(s.wait, repeats) * 1e3  # nothing in flight
    b, offset, _ = out[0]
    row["read_buffer_4_bytes_idle_us"] = _median_ms(lambda: device.queue.read_buffer(b, offset, 4), repeats) * 1e3
    if "timestamp-query" in device.features:
        row["gpu_ms_one_pass_per_dispatch"] = profile(s, inputs, repeats=3).gpu_ms
    peer, rec = row["wgpu_py_record_us_per_dispatch"], row["record_us_per_dispatch"]
    print(f"{name}: {n} dispatches on {row['adapter']} (recording: {row['recording']})")
    print(f"  record + submit, wgpu-py API calls (peer): {peer:.2f} us per dispatch")
    print(f"  record + submit, eggfuse: {rec:.2f} us per dispatch ({peer / rec:.1f}x faster than the peer)")
    print(f"  run(read=()) host time: {row['run_host_us_per_dispatch_prerecorded']:.2f} us per dispatch "
          f"with the run pre-recorded, {row['run_host_us_per_dispatch_recorded_in_run']:.2f} recorded in run(); "
          f"target <= 2 us")
    gpu = row.get("gpu_ms_one_pass_per_dispatch")
    print(f"  Session.run: {row['run_ms']:.2f} ms (waiting and read-back included)"
          + (f"; GPU time {gpu:.2f} ms summed over dispatches" if gpu is not None else "")
          + f"; run(read=()) then wgpu-py's queue.read_buffer of the outputs (peer): "
            f"{row['run_read_buffer_peer_ms']:.2f} ms")
    print(f"  Session.wait on an idle device: {row['wait_idle_us']:.1f} us; a 4-byte queue.read_buffer "
          f"(peer): {row['read_buffer_4_bytes_idle_us']:.1f} us")
    return row


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


#: The bars of the plot: JSON key and legend label.
PLOT_BARS = {"wgpu_py_record_us_per_dispatch": "record + submit, wgpu-py calls (peer)",
             "record_us_per_dispatch": "record + submit, eggfuse",
             "run_host_us_per_dispatch_recorded_in_run": "run(read=()), recorded in run()",
             "run_host_us_per_dispatch_prerecorded": "run(read=()), pre-recorded"}


def plot(runs: list[list[dict]], path: Path) -> bool:
    """Bars of host us per dispatch per plan (median over ``runs``, whiskers at min / max),
    with the 2 us target; False when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    plans = [row["plan"] for row in runs[0]]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(PLOT_BARS)
    for k, (key, label) in enumerate(PLOT_BARS.items()):
        values = [[next(r[key] for r in run if r["plan"] == plan) for run in runs] for plan in plans]
        mid = [statistics.median(v) for v in values]
        spread = [[m - min(v) for m, v in zip(mid, values, strict=True)],
                  [max(v) - m for m, v in zip(mid, values, strict=True)]]
        ax.bar([j + k * width for j in range(len(plans))], mid, width, yerr=spread, capsize=2, label=label)
    ax.axhline(2.0, color="black", linestyle="--", linewidth=1, label="target: 2 us per dispatch")
    labels = [f"{row['plan']}\n({row['dispatches']} dispatches)" for row in runs[0]]
    ax.set_xticks([j + width * (len(PLOT_BARS) - 1) / 2 for j in range(len(plans))], labels, fontsize=8)
    ax.set_ylabel("host us per dispatch")
    ax.set_title(f"runtime host time on {runs[0][0]['adapter']} ({len(runs)} run(s))", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--graphs", type=Path, help="folder of plans saved by bench/models.py --save-graphs")
    ap.add_argument("--context", type=int, default=128, help="decode position for the SmolLM2 decode plan")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "runtime_overhead.json")
    ap.add_argument("--plot-from", type=Path, nargs="+", metavar="JSON",
                    help="draw the plot of these saved runs (to --json's name, .png) instead of measuring")
    args = ap.parse_args()
    png = args.json.with_suffix(".png")
    if args.plot_from:
        runs = [json.loads(path.read_text()) for path in args.plot_from]
        print(f"wrote {png}" if plot(runs, png) else "matplotlib is not importable: no plot")
        return

    device = get_device()
    plans = {"chain": lambda: chain(args.dispatches)}
    if args.graphs:
        for name in ("smollm2_decode", "smollm2_prefill", "minilm"):
            if (args.graphs / f"{name}.pkl").exists():
                plans[name] = lambda name=name: saved_plan(args.graphs, name, args.context)
    rows = [measure(name, *build(), args.repeats, device) for name, build in plans.items()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}" + (f" and {png}" if plot([rows], png) else " (no matplotlib: no plot)"))


if __name__ == "__main__":
    main()
