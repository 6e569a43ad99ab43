"""One model plan lowered with the heuristic's matmul choices ("base") and with other choices for
chosen product shapes (tile, split-K count, GEMV columns per workgroup), timed alternately in one
process: our wall and GPU time per run, and each variant's largest output difference from base.

A variant is ``NAME=CHOICE[;CHOICE...]``, each CHOICE ``M,K,N:key=value[,key=value]`` for the
[M,K] x [K,N] products of that shape, with keys ``tile`` (a name of MATMUL_TILES_ALL, e.g.
``64x64x16m8x4``; tiled products, M > 4), ``splits`` (split-K count) and ``cols`` (output columns per
workgroup of a 'BT' GEMV: M <= 4, or 5-16 rows where ``matmul_kernel.gemv_bt_rows`` gives one; a ``tile``
puts such a product on the tiled kernel), applied through
``eggfuse.ir.ops.matmul_kernel.matmul_choice(..., shapes=...)``. Graphs are those of
``bench/models.py --save-graphs``; parameters and inputs are its random ones. Timing is
bench/models.py's (``time_plan``: ``gpu_timing.wall_per_call``, N back-to-back runs and one wait,
then ``gpu_timing.gpu_per_call``), after its warm-up.

    python3 bench/plan_variants.py --graphs bench/graphs/q4_1 bench/graphs --model smollm2_decode \\
        --variant "down_cols4=1,1536,576:cols=4" --variant "down_cols2=1,1536,576:cols=2" \\
        --json out.json   # GPU machine

A variant whose plan has the same kernels and grids as base's (no product of its shapes in the
plan, or keys that do not apply to those products: ``tile`` and ``splits`` to tiled ones, ``cols``
to 'BT' GEMVs) stops the run with that message, as does a malformed or repeated name or shape.

JSON: one row per (graphs folder, variant, round): ``model``, ``graphs``, ``weights``, ``variant``,
``spec``, ``round``, ``wall_us``, ``gpu_us`` (medians over ``--repeats`` samples; gpu None without
timestamps), ``dispatches``, ``max_abs_diff`` (against base's output), ``adapter``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import models  # noqa: E402
from eggfuse.ir import LoweringError  # noqa: E402
from eggfuse.ir.ops.matmul_kernel import (  # noqa: E402
    GEMV_COLS_ALLOWED,
    MATMUL_TILES_ALL,
    matmul_choice,
)
from eggfuse.pipeline import lower_for  # noqa: E402

TILES = {t.name: t for t in MATMUL_TILES_ALL}
KEYS = ("tile", "splits", "cols")


def parse_variant(text: str) -> tuple[str, list[tuple[tuple[int, int, int], dict]]]:
    """``NAME=M,K,N:key=value,...;...`` -> (name, [((m, k, n), {"tile": MatmulTile, "splits": int,
    "cols": int}), ...]); raises SystemExit with the reason for a malformed one."""
    name, sep, rest = text.partition("=")
    if not sep or not name or name == "base":
        raise SystemExit(f"--variant {text!r}: write NAME=M,K,N:key=value[,key=value][;...] (NAME not 'base')")
    choices = []
    for part in rest.split(";"):
        shape, sep, settings = part.partition(":")
        try:
            m, k, n = (int(v) for v in shape.split(","))
            values = dict(kv.split("=") for kv in settings.split(","))
            choice = {key: TILES.get(v) if key == "tile" else int(v) for key, v in values.items()}
        except ValueError:
            raise SystemExit(f"--variant {text!r}: {part!r} is not M,K,N:key=value[,key=value] "
                             f"(M, K, N, splits and cols integers)") from None
        if not sep or set(values) - set(KEYS):
            raise SystemExit(f"--variant {text!r}: {part!r} needs keys among {KEYS}")
        if min(m, k, n) < 1:
            raise SystemExit(f"--variant {text!r}: shape {m},{k},{n} is not three positive integers")
        if "tile" in values and choice["tile"] is None:
            raise SystemExit(f"--variant {text!r}: tile {values['tile']!r} is not one of {', '.join(TILES)}")
        if choice.get("splits", 1) < 1 or choice.get("cols", 1) not in GEMV_COLS_ALLOWED:
            raise SystemExit(f"--variant {text!r}: splits must be at least 1 and cols one of {GEMV_COLS_ALLOWED}")
        if (m, k, n) in dict(choices):
            raise SystemExit(f"--variant {text!r}: shape {m},{k},{n} twice; give all its keys in one choice")
        choices.append(((m, k, n), choice))
    return name, choices


def _work(plan) -> list[tuple[str, tuple[int, int, int]]]:
    # what a plan dispatches: each dispatch's kernel and grid
    return [(d.kernel, d.workgroups) for d in plan.dispatches]


def lowered(graph, choices):
    """``graph`` lowered for the device, each shape of ``choices`` taking its choice."""
    with contextlib.ExitStack() as stack:
        for shape, choice in choices:
            stack.enter_context(matmul_choice(tile=choice.get("tile"), splits=choice.get("splits"),
                                              gemv_cols=choice.get("cols"), shapes=[shape]))
        return lower_for(graph)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, nargs="+", required=True, help="folders of bench/models.py --save-graphs")
    ap.add_argument("--model", default="smollm2_decode", choices=models.MODELS)
    ap.add_argument("--variant", action="append", default=[], help="NAME=M,K,N:key=value[,...][;...] (repeatable)")
    ap.add_argument("--rounds", type=int, default=2, help="the variants alternated this many times")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back runs per sample")
    ap.add_argument("--repeats", type=int, default=20, help="samples per round and variant")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    if min(args.rounds, args.calls, args.repeats) < 1:
        raise SystemExit("--rounds, --calls and --repeats must be at least 1")
    parsed = [parse_variant(v) for v in args.variant]
    if len({name for name, _ in parsed}) < len(parsed):
        raise SystemExit("--variant: each variant needs a name of its own")
    variants = {"base": []} | dict(parsed)
    specs = {"base": "heuristic"} | {v.partition("=")[0]: v.partition("=")[2] for v in args.variant}
    rows = []
    for folder in args.graphs:
        fused, params, feeds, meta = models.saved_model(folder, args.model, args.calls)
        try:
            plans = {name: lowered(fused, choices) for name, choices in variants.items()}
        except LoweringError as e:
            raise SystemExit(f"lowering a variant of {args.model} ({folder}): {e}") from None
        same = [name for name, plan in plans.items() if name != "base" and _work(plan) == _work(plans["base"])]
        if same:
            raise SystemExit(f"{folder}: the variants {same} lower {args.model} to base's kernels and grids: no "
                             f"product of their shapes, or keys that do not apply to it (tile, splits: tiled products; "
                             f"cols: 'BT' GEMVs, M <= 4 or gemv_bt_rows)")
        timed = models.time_alternately(plans, params, feeds, args.calls, args.repeats, args.rounds)
        rows += [{"model": args.model, "graphs": str(folder), "weights": meta["weights"], "spec": specs[row["variant"]],
                  **row} for row in timed]
        for name in plans:
            mine = [row for row in rows if row["variant"] == name and row["graphs"] == str(folder)]
            gpu = [row["gpu_us"] for row in mine if row["gpu_us"] is not None]
            print(f"{meta['weights']:>5} {name:<24} wall {np.mean([row['wall_us'] for row in mine]):8.1f} us"
                  + (f"  GPU {np.mean(gpu):8.1f} us" if gpu else "") + f"  (mean of {len(mine)} rounds)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
