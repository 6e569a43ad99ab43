"""Whole model plans with each f32 vec4 quad load of the matmul kernels in two forms, timed
alternately in one process: "branch" (the load behind ``if (r < rows && c < cols)``, zero outside)
and "select" (the load at a clamped position, dropped by ``select`` outside; the form the GEMV
takes, ``_QUAD_VEC4_SELECT`` in ir/ops/matmul_kernel.py).

The select form is made by rewriting the generated source of every dispatch whose quads are in
the branch form; on trees since the GEMV took the select form, only the tiled kernels' quads are
(the run in bench/results/gemv_prologue_h200/select_ab.json was at 7ff34db, where every kernel's
were). Graphs are those of ``bench/models.py --save-graphs``; timing is ``models.time_plan``.

    python3 bench/quad_select_ab.py --graphs bench/graphs --json select_ab.json   # GPU machine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402

_BRANCH = re.compile(r"    if \(r < ([\w.]+) && c < ([\w.]+)\) \{\n        return (\w+)\[\(r \* \2 \+ c\) / 4u\];\n"
                     r"    \}\n    return vec4<f32>\(\);")


def select_form(source: str) -> str:
    """``source`` with every branch-form vec4 quad load in the select form."""
    return _BRANCH.sub(lambda m: f"    return select(vec4<f32>(), {m[3]}[(min(r, {m[1]} - 1u) * {m[2]} + "
                                 f"min(c, {m[2]} - 4u)) / 4u], r < {m[1]} && c < {m[2]});", source)


def select_plan(plan):
    """(``plan`` with every dispatch's quads in the select form, the number of dispatches changed)."""
    dispatches = [dataclasses.replace(d, source=select_form(d.source)) for d in plan.dispatches]
    changed = sum(a.source != b.source for a, b in zip(plan.dispatches, dispatches, strict=True))
    return dataclasses.replace(plan, dispatches=tuple(dispatches)), changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="a folder of bench/models.py --save-graphs")
    ap.add_argument("--models", default="minilm,smollm2_prefill,smollm2_decode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    for kind in args.models.split(","):
        if kind not in models.MODELS:
            raise SystemExit(f"unknown model {kind!r}: one of {', '.join(models.MODELS)}")
        fused, params, feeds, _ = models.saved_model(args.graphs, kind, args.calls)
        base = lower_for(fused)
        select, changed = select_plan(base)
        print(f"{kind}: {changed} of {len(base.dispatches)} dispatches have branch-form quads", flush=True)
        if not changed:
            continue
        outputs = {}
        for r in range(args.rounds):
            sides = (("branch", base), ("select", select))
            for side, plan in sides if r % 2 == 0 else sides[::-1]:  # each side first in alternate rounds
                t = models.time_plan(plan, params, feeds, args.calls, args.repeats)
                outputs.setdefault(side, t["output"])
                rows.append(dict(model=kind, graphs=str(args.graphs), side=side, round=r, edited=changed,
                                 wall_us=gpu_timing.median_p90(t["wall"])[0] * 1e6,
                                 gpu_us=gpu_timing.median_p90(t["gpu"])[0] * 1e6 if t["gpu"] else None))
                print(rows[-1], flush=True)
        rows.append(dict(model=kind, graphs=str(args.graphs),
                         max_abs_diff=float(np.max(np.abs(outputs["branch"] - outputs["select"])))))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
