"""Host overhead of the runtime: time to record one dispatch, and a plan run against its GPU time.

Builds a plan of ``--dispatches`` tiny dependent elementwise kernels (so the GPU work is
negligible), then measures in one run on the current adapter:

- record: host time to record the whole plan into one compute pass and submit it, per
  dispatch (the runtime's own per-dispatch cost; issue 7's target is <= 2 us);
- run: wall time of ``Session.run`` (write inputs, record, submit, wait, read back);
- GPU: the plan's summed GPU time from timestamp queries (when the device has them).

    .venv/bin/python bench/runtime_overhead.py [--dispatches 1000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from eggfuse.ir import Graph
from eggfuse.runtime import Session, get_device
from eggfuse.runtime.profile import profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "runtime_overhead.json")
    args = ap.parse_args()

    g = Graph()
    x = g.input("x", [64])
    h = x
    for _ in range(args.dispatches):
        h = g.neg(h)
    g.set_outputs([h])
    device = get_device()
    session = Session(g, {}, device=device)
    inputs = {"x": np.ones(64, dtype=np.float32)}
    session.run(inputs)

    record = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        session.record_and_submit()
        record.append(time.perf_counter() - t)
        session.wait()
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        session.run(inputs)
        runs.append(time.perf_counter() - t)
    gpu_ms = None
    if "timestamp-query" in device.features:
        gpu_ms = profile(session, inputs, repeats=3).gpu_ms
    rec_us = statistics.median(record) / args.dispatches * 1e6
    result = {
        "adapter": session.adapter, "dispatches": args.dispatches,
        "record_us_per_dispatch": rec_us, "run_ms": statistics.median(runs) * 1e3,
        "gpu_ms_summed_per_dispatch_passes": gpu_ms,
    }
    print(f"adapter: {session.adapter}")
    print(f"record + submit: {rec_us:.2f} us per dispatch ({args.dispatches} dispatches in one compute pass); "
          f"target <= 2 us")
    print(f"Session.run: {result['run_ms']:.2f} ms for the plan "
          f"({result['run_ms'] * 1e3 / args.dispatches:.2f} us per dispatch, waiting for the GPU included)")
    if gpu_ms is not None:
        print(f"GPU time (one pass per dispatch, timestamps): {gpu_ms:.2f} ms "
              f"({gpu_ms * 1e3 / args.dispatches:.2f} us per dispatch)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
