"""Where a model plan's wall time per run goes beyond its GPU time: the wall time of N back-to-back
runs (as ``bench/models.py`` times ours), the host time of the ``Session.run`` calls alone, the GPU
span of N separately submitted runs, and the GPU time of N copies of the plan in one command buffer.

For each graphs folder, each of ``prerecord`` on and off (``Session(prerecord=...)``) and each N of
``--calls``, every run on the same inputs (decode: the token at position ``seq`` each time, so that
the attention's keys, and its time, are the same in all four measurements):

- ``wall_us``: ``gpu_timing.wall_per_call`` (N runs with ``read=()`` and one wait, per run);
- ``host_us``: the same N ``Session.run`` calls timed until the last returns, per run: writing
  inputs, recording the command buffer (without ``prerecord``) or waiting for the background
  thread to finish recording it (with), submitting;
- ``span_us``: GPU timestamps written by an empty compute pass submitted before N runs and one
  submitted after them, three runs submitted first so that the GPU is busy and the host ahead, per
  run: the GPU time of separate submissions with the gaps between them;
- ``gpu_us``: ``gpu_timing.gpu_per_call`` (N copies of the plan in one command buffer, per copy).

So ``span - gpu`` is what separate submissions cost the GPU per run, and ``wall - span`` what the
start and end of a sample (the first submission's latency, the final wait) add per run, or the
host when it falls behind. Medians over ``--repeats`` samples. Graphs are those of
``bench/models.py --save-graphs``; parameters and inputs its random ones.

    python3 bench/submit_gap.py --graphs bench/graphs/q4_1 --json out.json   # GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import wgpu

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import Session  # noqa: E402


def _stamp(device, query, index: int, resolve=None) -> None:
    # an empty compute pass writing timestamp `index` (at its start for 0, its end for 1), submitted
    encoder = device.create_command_encoder()
    key = "beginning_of_pass_write_index" if index == 0 else "end_of_pass_write_index"
    encoder.begin_compute_pass(timestamp_writes={"query_set": query, key: index}).end()
    if resolve is not None:
        encoder.resolve_query_set(query, 0, 2, resolve, 0)
    device.queue.submit([encoder.finish()])


def span_per_run(session, feeds: list[dict], samples: int) -> list[float]:
    """Seconds per run of the GPU span of ``len(feeds)`` separately submitted runs (module docstring)."""
    device = session.device
    query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolve = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    out = []
    for _ in range(samples):
        for feed in feeds[:3]:
            session.run(feed, read=())
        _stamp(device, query, 0)
        for feed in feeds:
            session.run(feed, read=())
        _stamp(device, query, 1, resolve)
        ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64)
        out.append(float(ticks[1] - ticks[0]) * 1e-9 / len(feeds))  # WebGPU timestamps are nanoseconds
    return out


def host_per_run(session, feeds: list[dict], samples: int) -> list[float]:
    """Seconds per run of ``len(feeds)`` ``Session.run(read=())`` calls until the last returns."""
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        for feed in feeds:
            session.run(feed, read=())
        out.append((time.perf_counter() - t) / len(feeds))
        session.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, nargs="+", required=True, help="folders of bench/models.py --save-graphs")
    ap.add_argument("--model", default="smollm2_decode", choices=models.MODELS)
    ap.add_argument("--calls", default="10,50", help="runs per sample, comma-separated")
    ap.add_argument("--repeats", type=int, default=15, help="samples per measurement")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    try:
        counts = [int(c) for c in args.calls.split(",")]
    except ValueError:
        raise SystemExit(f"--calls {args.calls!r}: write run counts separated by commas, e.g. 10,50") from None
    if min(counts) < 1 or args.repeats < 1:
        raise SystemExit("--calls counts and --repeats must be at least 1")
    rows = []
    for folder in args.graphs:
        fused, params, (feed,), meta = models.saved_model(folder, args.model, 1)
        plan = lower_for(fused)
        for prerecord in (True, False):
            session = Session(plan, {k: v for k, v in params.items() if k in plan.parameters}, prerecord=prerecord)
            if not gpu_timing.has_timestamps(session.device):
                raise SystemExit(f"{session.adapter} has no timestamp-query: the GPU span cannot be measured")
            for calls in counts:
                feeds = [feed] * calls  # the same inputs each run
                session.run(feeds[0])
                times = {"wall_us": gpu_timing.wall_per_call(session, feeds, args.repeats),
                         "host_us": host_per_run(session, feeds, args.repeats),
                         "span_us": span_per_run(session, feeds, args.repeats),
                         "gpu_us": gpu_timing.gpu_per_call(session, calls, args.repeats)}
                rows.append({"model": args.model, "weights": meta["weights"], "prerecord": prerecord,
                             "calls": calls, "dispatches": len(plan.dispatches), "adapter": session.adapter,
                             **{k: float(np.median(v)) * 1e6 for k, v in times.items()}})
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()
                       if k != "adapter"}, flush=True)
            del session
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
