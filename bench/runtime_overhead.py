"""Host overhead of the runtime: time to record one dispatch, and a plan run against its GPU time.

Measures in one run on the current adapter, for each plan:

- record: host time to record the whole plan and submit it (``Session.record_and_submit``),
  per dispatch, against the peer: the same plan recorded with wgpu-py's own API calls
  (``GPUComputePassEncoder.set_pipeline`` ...);
- run host time: ``Session.run(inputs, read=())`` until it returns, per dispatch (issue 7's
  target is <= 2 us), with the run's command buffer pre-recorded while the previous run
  executed (the default) and recorded inside ``run`` (``prerecord=False``);
- run: wall time of ``Session.run`` (write inputs, submit, wait, read back);
- GPU: the plan's summed GPU time from timestamp queries (when the device has them).

Plans: ``chain``, ``--dispatches`` tiny dependent elementwise kernels (GPU work negligible),
and with ``--graphs DIR`` the fused model plans saved by ``bench/models.py --save-graphs``
(SmolLM2 decode and prefill, MiniLM), with random weights of the real shapes.

    .venv/bin/python bench/runtime_overhead.py [--dispatches 1000] [--graphs bench/graphs] [--json FILE]
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
    s = Session(graph, params, device=device)
    s_sync = Session(graph, params, device=device, share=s, prerecord=False)
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
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.run(inputs)
        runs.append(time.perf_counter() - t)
    row["run_ms"] = statistics.median(runs) * 1e3
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
          + (f"; GPU time {gpu:.2f} ms summed over dispatches" if gpu is not None else ""))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--graphs", type=Path, help="folder of plans saved by bench/models.py --save-graphs")
    ap.add_argument("--context", type=int, default=128, help="decode position for the SmolLM2 decode plan")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "runtime_overhead.json")
    args = ap.parse_args()

    device = get_device()
    plans = {"chain": lambda: chain(args.dispatches)}
    if args.graphs:
        for name in ("smollm2_decode", "smollm2_prefill", "minilm"):
            if (args.graphs / f"{name}.pkl").exists():
                plans[name] = lambda name=name: saved_plan(args.graphs, name, args.context)
    rows = [measure(name, *build(), args.repeats, device) for name, build in plans.items()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
