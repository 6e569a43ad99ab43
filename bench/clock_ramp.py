"""Why a run can take several times its usual time: the GPU's clock after an idle spell.

For each SmolLM2 plan of ``--graphs`` (``bench/models.py --save-graphs``), one session, then for each
idle time of ``--idle`` (seconds of sleep with nothing submitted): ``--samples`` samples of
``--calls`` back-to-back runs (wall clock around them, one wait), printed one per sample, then the
GPU time per run by timestamps. With ``nvidia-smi`` on the path, its SM clock and power are logged
every 50 ms meanwhile (``--clocks``, CSV), to line the samples up with the clock::

    python3 bench/clock_ramp.py --graphs bench/graphs --json bench/results/clock_ramp_h200/ramp.json \\
        --clocks bench/results/clock_ramp_h200/clocks.csv

JSON rows: ``model``, ``idle_s``, ``wall_ms`` (per run, one value per sample, in order), ``gpu_ms``
(timestamps, after the samples), ``t_start`` (``time.time()`` at the first sample, the clock log's
time base).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import Session  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="folder of bench/models.py --save-graphs")
    ap.add_argument("--models", default="smollm2_prefill,smollm2_decode")
    ap.add_argument("--idle", default="2,0.5,0", help="idle seconds before each series (default 2,0.5,0)")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "clock_ramp.json")
    ap.add_argument("--clocks", type=Path, help="CSV of nvidia-smi's SM clock and power every 50 ms")
    args = ap.parse_args()
    loaded, meta = models.load_graphs(args.graphs)
    logger = log = None
    if args.clocks and shutil.which("nvidia-smi"):
        args.clocks.parent.mkdir(parents=True, exist_ok=True)
        log = args.clocks.open("w")
        logger = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw",
                                   "--format=csv", "-lms", "50"], stdout=log)
    rows = []
    try:
        for kind in [m.strip() for m in args.models.split(",") if m.strip()]:
            unfused, fused = loaded[kind]
            params = models.random_params(kind, unfused, meta["layers"], meta["weights"])
            inputs = models.model_inputs(kind, meta["seq"], meta["batch"], padded=False)
            feeds = models.our_feeds(kind, inputs, meta["seq"], args.calls)
            session = Session(lower_for(fused), {k: v for k, v in params.items() if k in fused.parameters})
            session.run(feeds[0], read=())
            session.wait()
            for idle in (float(v) for v in args.idle.split(",")):
                time.sleep(idle)
                start, samples = time.time(), []
                for _ in range(args.samples):
                    t = time.perf_counter()
                    for feed in feeds:
                        session.run(feed, read=())
                    session.wait()
                    samples.append((time.perf_counter() - t) / len(feeds) * 1e3)
                gpu = gpu_timing.gpu_per_call(session, args.calls, 10)
                gpu_ms = gpu_timing.median_p90(gpu)[0] * 1e3 if gpu else None
                rows.append({"model": kind, "idle_s": idle, "wall_ms": samples, "gpu_ms": gpu_ms, "t_start": start})
                print(f"{kind} after {idle:g} s idle: ms per run " + " ".join(f"{v:.2f}" for v in samples)
                      + (f" | GPU {gpu_ms:.3f}" if gpu_ms else ""), flush=True)
            del session
    finally:
        if logger is not None:
            logger.terminate()
            logger.wait()
            log.close()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}" + (f" and {args.clocks}" if logger else ""))


if __name__ == "__main__":
    main()
