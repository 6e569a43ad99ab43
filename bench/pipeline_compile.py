"""Seconds to compile a saved model plan's pipelines, with the kernels' parameters as WGSL constants
(``lower_for(..., constant_params=True)``, a pipeline per size) and read from the uniform
(``constant_params=False``), each in a fresh process with the drivers' shader disk caches off.

Why: with constants a plan has more distinct kernels than with the uniform (a product of another
shape is another source), and a plan's first run compiles every one of them; this is the time to a
first token or embedding that the form costs, beside the GPU time it saves (``bench/plan_ab.py
--variant uniform:eggfuse.pipeline.CONSTANT_PARAMS=False``).

Each sample is a child process that lowers the model's fused graph (``bench/models.py
--save-graphs`` folder), then times ``Session(plan, params)`` and its first ``run`` with the wait for
the device: the pipelines' compilation (naga's translation and the driver's), bind groups and the
parameters' upload. The child sets ``__GL_SHADER_DISK_CACHE=0`` (NVIDIA) and
``MESA_SHADER_CACHE_DISABLE=true`` (Mesa) before the device exists, so the driver compiles every
pipeline; forms alternate, each first in every other repeat, ``--repeats`` children each.

    python3 bench/pipeline_compile.py --graphs bench/graphs --model smollm2_decode --json out.json

JSON: one row per child with ``model``, ``form`` (``constants`` or ``uniform``), ``repeat``,
``dispatches``, ``sources`` (distinct kernel sources: the pipelines compiled), ``lower_s``,
``first_run_s`` (session creation, first run and wait), ``adapter``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMS = ("constants", "uniform")


def child(graphs: Path, model: str, form: str) -> dict:
    """One sample, in this (fresh) process: lower, then create the session and run it once."""
    import models
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session, get_device
    from eggfuse.runtime.device import adapter_description

    fused, params, feeds, _ = models.saved_model(graphs, model, 1)
    device = get_device()
    start = time.perf_counter()
    plan = lower_for(fused, device, constant_params=form == "constants")
    lowered = time.perf_counter()
    session = Session(plan, params, device=device)
    session.run(feeds[0], read=())
    session.wait()
    done = time.perf_counter()
    return {"model": model, "form": form, "dispatches": len(plan.dispatches),
            "sources": len({d.source for d in plan.dispatches}), "lower_s": lowered - start,
            "first_run_s": done - lowered, "adapter": adapter_description(device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="a folder of bench/models.py --save-graphs")
    ap.add_argument("--model", action="append", default=[], help="a model of --graphs (repeatable; default all)")
    ap.add_argument("--repeats", type=int, default=3, help="children per model and form (default 3)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "FORM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.graphs, *args.child)))
        return
    import models

    env = {**os.environ, "__GL_SHADER_DISK_CACHE": "0", "MESA_SHADER_CACHE_DISABLE": "true"}
    rows = []
    for model in args.model or list(models.MODELS):
        for repeat in range(args.repeats):
            for form in FORMS if repeat % 2 == 0 else FORMS[::-1]:  # each form first in every other repeat
                out = subprocess.run([sys.executable, __file__, "--graphs", str(args.graphs), "--child", model, form],
                                     env=env, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{model} {form}: the child failed:\n{out.stderr[-2000:]}")
                row = {**json.loads(out.stdout.strip().splitlines()[-1]), "repeat": repeat}
                rows.append(row)
                print(f"{model:<16} {form:<10} {row['sources']:>4} sources of {row['dispatches']:>4} dispatches: "
                      f"lowered in {row['lower_s']:.2f} s, first run {row['first_run_s']:.2f} s", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
