"""Where a model's wall time per run goes beyond its GPU time: the device's idle time between
back-to-back runs, each run's command buffer stamped by the GPU.

``bench/models.py`` reports two times per run of a plan: wall clock around N back-to-back
``Session.run(read=())`` calls divided by N, and GPU time from timestamps around N copies of the plan
in one command buffer. This script times the same plan in the ways below, in one process, and prints
each as microseconds per run:

- ``wall_runs``: as bench/models.py (``gpu_timing.wall_per_call``), the session's waits as it makes them;
  ``wall_runs_blocking`` and ``wall_runs_spinning`` the same with every wait of the session one blocking
  poll, or (GPU adapters) polls that return at once (``eggfuse.runtime.session.SPIN_WAIT_S``);
  ``wall_runs_1_*`` with one run per sample; ``run_read_1_*`` one ``Session.run`` reading every output
  back, the call as a program makes it;
- ``gpu_one_buffer``: as bench/models.py (``gpu_timing.gpu_per_call``);
- ``wall_one_buffer``: wall clock around one submission of N copies of the plan (one compute pass
  each) and one wait: what the runs would cost with no submission boundaries;
- ``stamped_submits``: N submissions, each one run as Session.run records it (the session's input
  bytes written first, then one compute pass), with a timestamp at the beginning and the end of each
  pass: per run its ``busy`` time (end - beginning) and the ``gap`` from the previous run's end to
  its beginning, on the GPU's clock; and ``wall`` around the N;
- ``stamped_one_submit``: the same N command buffers given to one ``queue.submit`` call;
- ``stamped_unwritten``: as ``stamped_submits`` without the input writes (the runs compute on
  the inputs last written): what the write (wgpu's pending-writes command buffer, its copy)
  adds to a submission;
- ``stamped_copied``: as ``stamped_unwritten``, each command buffer copying the input bytes
  from a buffer of their own into the input buffer before its pass (what a run costs when its
  inputs come from a copy it records itself instead of ``queue.write_buffer``);
- ``wall_runs_ring_<R>``: ``wall_runs`` of sessions made with ``INPUT_RING`` = R (0: the inputs
  written with ``queue.write_buffer``; ``--rings``), one session per value and round, the values
  alternating over ``--rounds`` rounds: medians of each round (``*_us_rounds``) and their mean;
- ``stamped_one_buffer``: the N passes in one command buffer, one submission: the gap between
  two compute passes alone;
- ``wall_runs_spin_<S>`` (``--spin-caps S ...``): ``wall_runs`` of one session with ``SPIN_WAIT_S`` = S,
  the values alternating over ``--rounds`` rounds (spin_rounds);
- ``one_buffer_scaling`` (``--scaling N ...``): one command buffer of N plan copies per N, the host's
  submit and wait times and the wall time against the GPU's stamped span: whether the wall time's
  excess over the GPU time is a fixed latency or grows with the work in the buffer.

The gaps show what a submission costs on the device (wgpu's fences and barriers between
command buffers, the input copy) apart from the host. Graphs are those of ``bench/models.py
--save-graphs``; parameters and inputs its random ones.

    python3 bench/submit_gaps.py --graphs bench/graphs --model minilm --json gaps.json   # GPU machine

JSON: one object per model with each way's ``*_us`` medians (and p90 where sampled), the per-run
``busy_us`` and ``gap_us`` medians of both stamped ways, ``calls``, ``samples``, ``dispatches``,
``adapter``.
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


def _record(session: Session, encoder, query=None, first: int = 0) -> None:
    # One run of the plan as one compute pass (Session._record_plan's pass), stamped at its
    # beginning and end into ``query`` entries ``first`` and ``first + 1`` when given.
    stamps = None if query is None else {"query_set": query, "beginning_of_pass_write_index": first,
                                         "end_of_pass_write_index": first + 1}
    compute = encoder.begin_compute_pass(timestamp_writes=stamps)
    for pipeline, bind_group, grid in session._commands:
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*grid)
    compute.end()


def _write_inputs(session: Session) -> None:
    # The input bytes of a run, as Session.run writes them (its packed input buffer)
    if session._input_staging.size:
        session.device.queue.write_buffer(session._input_buffer, 0, session._input_staging)


def stamped(session: Session, calls: int, one_submit: bool, write: bool = True, one_buffer: bool = False,
            copied: bool = False) -> dict:
    """``calls`` runs as separate command buffers, each a stamped compute pass after the input
    write; submitted one by one, or (``one_submit``) all in one ``queue.submit``; without ``write``
    the inputs are not written (with ``copied``, copied in each command buffer from a buffer holding
    them); with ``one_buffer`` the passes go in one command buffer (one
    submission, one write). Returns the GPU's ``busy`` and ``gap`` per run (seconds; gaps from the
    second run on) and the ``wall`` per run."""
    device = session.device
    query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * calls)
    resolve = device.create_buffer(size=16 * calls, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    buffers, encoder = [], None
    source = None
    if copied and session._input_staging.size:
        source = device.create_buffer_with_data(data=session._input_staging, usage=wgpu.BufferUsage.COPY_SRC)
    for i in range(calls):
        if encoder is None or not one_buffer:
            encoder = device.create_command_encoder()
        if source is not None:
            encoder.copy_buffer_to_buffer(source, 0, session._input_buffer, 0, source.size)
        _record(session, encoder, query, 2 * i)
        if i == calls - 1:
            encoder.resolve_query_set(query, 0, 2 * calls, resolve, 0)
        if not one_buffer or i == calls - 1:
            buffers.append(encoder.finish())
    session.wait()
    t = time.perf_counter()
    if one_submit or one_buffer:
        _write_inputs(session)
        device.queue.submit(buffers)
    else:
        for b in buffers:
            if write:
                _write_inputs(session)
            device.queue.submit([b])
    session.wait()
    wall = (time.perf_counter() - t) / calls
    ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64)
    ticks = (ticks - ticks[0]).astype(np.float64) * 1e-9  # from the first stamp, in integers: ns kept
    begin, end = ticks[0::2], ticks[1::2]
    return {"busy": list(end - begin), "gap": list(begin[1:] - end[:-1]), "wall": wall}


def wall_one_buffer(session: Session, calls: int) -> float:
    """Seconds per run: wall clock around one command buffer of ``calls`` compute passes, each the
    plan, submitted once after the input write, and one wait."""
    encoder = session.device.create_command_encoder()
    for _ in range(calls):
        _record(session, encoder)
    buffer = encoder.finish()
    session.wait()
    t = time.perf_counter()
    _write_inputs(session)
    session.device.queue.submit([buffer])
    session.wait()
    return (time.perf_counter() - t) / calls


def one_buffer_scaling(session: Session, counts: list[int], samples: int) -> dict[int, dict[str, float]]:
    """Per count n of ``counts``: one command buffer of n copies of the plan (one compute pass each; n = 0: one
    empty pass), stamped at the beginning of the first pass and the end of the last, submitted after a wait and
    waited for, ``samples`` times. Medians in microseconds of the whole buffer: ``submit`` (the host's
    ``queue.submit`` call), ``wait`` (from its return to the wait's), ``wall`` (both), ``gpu`` (first stamp to
    last) and ``rest`` (wall - gpu: the host's and the device's latency around the GPU's work). A ``rest`` that
    grows with n is work per plan copy outside the stamped span. The copies compute on the inputs the session
    last wrote."""
    device = session.device
    query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolve = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    out = {}
    for n in counts:
        values: dict[str, list[float]] = {"submit": [], "wait": [], "wall": [], "gpu": []}
        for _ in range(samples):
            buffer = gpu_timing.stamped_copies(session, query, resolve, max(n, 1), 1 if n else 0)
            session.wait()
            t0 = time.perf_counter()
            device.queue.submit([buffer])
            t1 = time.perf_counter()
            session.wait()
            t2 = time.perf_counter()
            ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64)
            values["submit"].append(t1 - t0)
            values["wait"].append(t2 - t1)
            values["wall"].append(t2 - t0)
            values["gpu"].append(float(ticks[1] - ticks[0]) * 1e-9)
        row = {key: float(np.median(v)) * 1e6 for key, v in values.items()}
        row["rest"] = float(np.median(np.array(values["wall"]) - np.array(values["gpu"]))) * 1e6
        out[n] = row
    return out


def spin_rounds(plan, params: dict, feeds: list[dict], samples: int, caps: list[float], rounds: int) -> dict:
    """``wall_runs`` (gpu_timing.wall_per_call) of one session with each ``session.SPIN_WAIT_S`` of ``caps``
    (the longest a wait polls without blocking before it blocks; read at each wait, so one session serves all,
    though a cap of 0 there still polls once before blocking), alternating, ``rounds`` times: per cap the
    median of each round (seconds per run)."""
    from eggfuse.runtime import session as session_module

    out: dict[float, list[float]] = {c: [] for c in caps}
    before = session_module.SPIN_WAIT_S
    s = Session(plan, {k: v for k, v in params.items() if k in plan.parameters})
    s.run(feeds[0])
    try:
        for _ in range(rounds):
            for cap in caps:
                session_module.SPIN_WAIT_S = cap
                out[cap].append(gpu_timing.median_p90(gpu_timing.wall_per_call(s, feeds, samples))[0])
    finally:
        session_module.SPIN_WAIT_S = before
    return out


def ring_rounds(plan, params: dict, feeds: list[dict], samples: int, rings: list[int], rounds: int) -> dict:
    """``wall_runs`` (gpu_timing.wall_per_call) of a session made with each ``session.INPUT_RING`` of
    ``rings``, alternating, ``rounds`` times: per ring the median of each round (seconds per run)."""
    from eggfuse.runtime import session as session_module

    out: dict[int, list[float]] = {r: [] for r in rings}
    before = session_module.INPUT_RING
    try:
        for _ in range(rounds):
            for ring in rings:
                session_module.INPUT_RING = ring
                s = Session(plan, {k: v for k, v in params.items() if k in plan.parameters})
                s.run(feeds[0])
                out[ring].append(gpu_timing.median_p90(gpu_timing.wall_per_call(s, feeds, samples))[0])
                del s
    finally:
        session_module.INPUT_RING = before
    return out


def measure(plan, params: dict, feeds: list[dict], calls: int, samples: int) -> dict:
    s = Session(plan, {k: v for k, v in params.items() if k in plan.parameters})
    s.run(feeds[0])
    out = {"calls": calls, "samples": samples, "dispatches": len(plan.dispatches), "adapter": s.adapter}
    spin_allowed, ways = s._spin, {}
    for mode in ("blocking", "spinning") if spin_allowed else ("blocking",):
        s._spin = mode == "spinning"  # Session.wait and the read-back: polls that return at once, or one that blocks
        ways[f"wall_runs_{mode}"] = gpu_timing.wall_per_call(s, feeds, samples)
        ways[f"wall_runs_1_{mode}"] = gpu_timing.wall_per_call(s, feeds[:1], samples)
        ways[f"run_read_1_{mode}"] = []
        for _ in range(samples):  # one run read back, as a program that wants its output calls it
            t = time.perf_counter()
            s.run(feeds[0])
            ways[f"run_read_1_{mode}"].append(time.perf_counter() - t)
    s._spin = spin_allowed
    wall = gpu_timing.wall_per_call(s, feeds, samples)
    for key, values in ways.items():
        median, p90 = gpu_timing.median_p90(values)
        out[f"{key}_us"], out[f"{key}_p90_us"] = median * 1e6, p90 * 1e6
    s.run(feeds[0], read=())
    gpu = gpu_timing.gpu_per_call(s, calls, samples)
    one = [wall_one_buffer(s, calls) for _ in range(samples)]
    for key, values in (("wall_runs", wall), ("gpu_one_buffer", gpu), ("wall_one_buffer", one)):
        if values:
            median, p90 = gpu_timing.median_p90(values)
            out[f"{key}_us"], out[f"{key}_p90_us"] = median * 1e6, p90 * 1e6
    if gpu_timing.has_timestamps(s.device):
        for key, how in (("stamped_submits", {}), ("stamped_one_submit", {"one_submit": True}),
                         ("stamped_unwritten", {"write": False}), ("stamped_copied", {"write": False, "copied": True}),
                         ("stamped_one_buffer", {"one_buffer": True})):
            runs = [stamped(s, calls, **{"one_submit": False, **how}) for _ in range(samples)]
            out[f"{key}_wall_us"] = float(np.median([r["wall"] for r in runs])) * 1e6
            out[f"{key}_busy_us"] = float(np.median([b for r in runs for b in r["busy"]])) * 1e6
            out[f"{key}_gap_us"] = float(np.median([g for r in runs for g in r["gap"]])) * 1e6
            out[f"{key}_gap_p90_us"] = float(np.percentile([g for r in runs for g in r["gap"]], 90)) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="a folder of bench/models.py --save-graphs")
    ap.add_argument("--model", action="append", choices=models.MODELS, help="(repeatable; default minilm)")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back runs per sample")
    ap.add_argument("--repeats", type=int, default=20, help="samples of each way")
    ap.add_argument("--rings", type=int, nargs="*", default=[3, 0], help="INPUT_RING values to alternate")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the --rings alternation")
    ap.add_argument("--scaling", type=int, nargs="*", default=[],
                    help="plan copies per command buffer to time one submission of each (one_buffer_scaling)")
    ap.add_argument("--spin-caps", type=float, nargs="*", default=[],
                    help="SPIN_WAIT_S values (seconds) to alternate over --rounds rounds (spin_rounds)")
    ap.add_argument("--only-scaling", action="store_true", help="time nothing but --scaling and --spin-caps")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    if min(args.calls, args.repeats) < 2:
        raise SystemExit("--calls and --repeats must be at least 2")
    if args.only_scaling and not (args.scaling or args.spin_caps):
        raise SystemExit("--only-scaling times --scaling's counts and --spin-caps: give them (e.g. --scaling 1 10)")
    rows = []
    for kind in args.model or ["minilm"]:
        fused, params, feeds, meta = models.saved_model(args.graphs, kind, args.calls)
        plan = lower_for(fused)
        row = {"model": kind, "weights": meta["weights"]}
        if not args.only_scaling:
            row.update(measure(plan, params, feeds, args.calls, args.repeats))
            for ring, values in ring_rounds(plan, params, feeds, args.repeats, args.rings, args.rounds).items():
                row[f"wall_runs_ring_{ring}_us_rounds"] = [v * 1e6 for v in values]
                row[f"wall_runs_ring_{ring}_us"] = float(np.mean(values)) * 1e6
        if args.spin_caps:
            for cap, values in spin_rounds(plan, params, feeds, args.repeats, args.spin_caps, args.rounds).items():
                row[f"wall_runs_spin_{cap:g}_us_rounds"] = [v * 1e6 for v in values]
                row[f"wall_runs_spin_{cap:g}_us"] = float(np.mean(values)) * 1e6
        if args.scaling:
            s = Session(plan, {k: v for k, v in params.items() if k in plan.parameters})
            if not gpu_timing.has_timestamps(s.device):
                raise SystemExit(f"--scaling needs timestamp queries, which {s.adapter} lacks")
            s.run(feeds[0], read=())
            gpu_timing.wall_per_call(s, feeds, 2)  # warm: the clock ramps up
            row["one_buffer_scaling"] = one_buffer_scaling(s, args.scaling, args.repeats)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
