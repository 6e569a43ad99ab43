"""Single products lowered as this tree lowers them and with some of the lowering's constants changed,
timed alternately in one process: GPU time per call of each variant, and each variant's largest output
difference from the tree's and from numpy's.

Why: ``bench/matmul.py --set`` runs one configuration a process, and on the GPU machines two processes
run minutes apart can differ by 30% at the same kernel (the clock, other tenants); alternating the
variants within one process, round after round, compares them under the same conditions.

Each ``--variant NAME:MODULE.NAME=VALUE[,MODULE.NAME=VALUE...]`` (``bench/plan_ab.py``'s settings, set
while lowering only; ``cols=N`` puts every 'BT' GEMV on N columns a workgroup, ``tile=NAME`` every tiled product
on that tile of ``MATMUL_TILES_ALL`` (e.g. ``64x64x16m8x4``) and ``splits=N`` in N K ranges: ``matmul_choice``) adds a
plan per shape beside the tree's (``tree``). Timing is ``bench/matmul.py``'s
(``time_ours``: GPU timestamps around ``calls`` back-to-back dispatches in one pass, ``--repeats``
samples, their median), after ``--warmup`` seconds of calls of the first plan, and every round times each
variant again after a short warm-up of its own. Inputs and weights are ``bench/matmul.py``'s
(``matmul_session``).

    python3 bench/matmul_ab.py --shapes "4,1536,576;8,576,1536" \\
        --variant "loop:eggfuse.ir.ops.matmul_kernel.GEMV_UNROLL_MIN_ROWS=99" --json ab.json

``--weights FORMAT`` stores B as blocks and ``--cold`` reads B from memory, not the L2 cache (``bench/matmul.py``'s
options; every variant on as many copies of B as the tree's plan takes). JSON: one row per (shape, variant, round)
with ``op``, ``m``, ``k``, ``n``, ``weights``, ``variant``, ``round``, ``us`` (median), ``p90_us``, ``calls``,
``weight_copies`` (1 unless ``--cold``), ``kernels`` (the plan's dispatches), ``max_abs_diff`` (against the tree's
output), ``max_abs_err`` (against numpy's float64 product) and ``adapter``; with ``--per-dispatch``, ``dispatch_us``:
each dispatch's median GPU µs per call when it runs alone (a split product's K ranges, its reduction).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402
import matmul as mb  # noqa: E402
from plan_ab import parse_setting, settings_applied  # noqa: E402

from eggfuse.ir.ops.matmul_kernel import GEMV_COLS_ALLOWED, MATMUL_TILES_ALL, matmul_choice  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import get_device  # noqa: E402
from eggfuse.runtime.device import adapter_description  # noqa: E402


def lower_with(settings: list[tuple[str, str, object]], cols: int | None = None, choice: dict | None = None):
    """A ``lower(graph, device)`` that lowers with ``settings`` in force (and every 'BT' GEMV on ``cols``
    columns a workgroup, every tiled product on ``choice``'s ``tile`` and ``splits``: ``matmul_choice``),
    restoring them afterwards."""
    def lower(graph, device):
        with settings_applied(settings), matmul_choice(gemv_cols=cols, **(choice or {})):
            return lower_for(graph, device)
    return lower


_TILES = {t.name: t for t in MATMUL_TILES_ALL}


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, object]], int | None, dict]:
    """``NAME:SETTING[,SETTING...]`` -> (name, settings, GEMV columns, tiled products' choice); a SETTING is
    ``eggfuse.MODULE.NAME=VALUE``, ``cols=N``, ``tile=NAME`` or ``splits=N``; SystemExit naming the problem for a
    bad one."""
    name, sep, rest = text.partition(":")
    if not sep or not name or name == "tree":
        raise SystemExit(f"variant {text!r}: write NAME:eggfuse.MODULE.NAME=VALUE[,...] (NAME not 'tree')")
    settings, cols, choice = [], None, {}
    for item in re.split(r",(?=eggfuse\.|cols=|tile=|splits=)", rest):  # a VALUE may hold commas
        if item.startswith("cols="):
            if not item[5:].isdigit() or int(item[5:]) not in GEMV_COLS_ALLOWED:
                raise SystemExit(f"variant {text!r}: cols is one of {GEMV_COLS_ALLOWED}")
            cols = int(item[5:])
        elif item.startswith("tile="):
            if item[5:] not in _TILES:
                raise SystemExit(f"variant {text!r}: tile is one of {', '.join(_TILES)}")
            choice["tile"] = _TILES[item[5:]]
        elif item.startswith("splits="):
            if not item[7:].isdigit() or int(item[7:]) < 1:
                raise SystemExit(f"variant {text!r}: splits is a positive integer")
            choice["splits"] = int(item[7:])
        elif item:
            settings.append(parse_setting(item))
    return name, settings, cols, choice


def output_of(session, a: np.ndarray) -> np.ndarray:
    """The product of a session of ``matmul_session`` on ``a``, read back."""
    out = session.run({"a": a})
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else next(iter(out.values())))


def dispatch_times(session, calls: int, samples: int, commands: list[list[tuple]] | None) -> list[float]:
    """Median GPU µs per call of each of the plan's dispatches alone: ``calls`` back-to-back calls of that one
    dispatch in one pass (``gpu_timing.gpu_per_call`` on a one-dispatch command list; with ``--cold``, on each
    copy of B in turn). A later dispatch then reads what its own last call left, not what the one before it
    wrote: the time of its work, not of the plan's order. Wall clock is no use here: NaN without timestamps."""
    out = []
    for i in range(len(session._commands)):
        alone = [[copy[i]] for copy in (commands or [session._commands])]
        stamps = gpu_timing.gpu_per_call(session, calls, samples, one_pass=True, commands=alone)
        out.append(gpu_timing.median_p90(stamps)[0] * 1e6 if stamps else float("nan"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="M,K,N;... MatMulBT shapes (MatMul:M,K,N: B stored [K,N])")
    ap.add_argument("--variant", action="append", default=[], help="NAME:MODULE.NAME=VALUE[,...] (repeatable)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every variant per shape (default 3)")
    ap.add_argument("--repeats", type=int, default=5, help="samples per round, for the median (default 5)")
    ap.add_argument("--budget", type=float, default=0.1, help="GPU seconds of one round's calls (sizes N)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of calls before the first shape")
    ap.add_argument("--weights", default="f32", choices=("f32", *mb.FORMATS),
                    help="B's storage: f32, or a block format of eggfuse.ir.ops.quant (MatMulBT shapes only)")
    ap.add_argument("--cold", action="store_true",
                    help="read B from memory, not the L2 cache (bench/matmul.py --cold: copies of B in turn)")
    ap.add_argument("--per-dispatch", action="store_true",
                    help="also time each dispatch of a plan alone, the same number of calls back to back")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    variants = [("tree", [], None, {})] + [parse_variant(v) for v in args.variant]
    device = get_device()
    adapter = adapter_description(device)
    rows, warmed = [], False
    for op, m, k, n in (mb._op_shape(t) for t in args.shapes.split(";")):
        a = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)  # matmul_session's A
        if args.weights != "f32" and op != "MatMulBT":
            raise SystemExit(f"--weights {args.weights} stores B as blocks along K: give MatMulBT shapes")
        b = mb.weight_values(op, k, n, args.weights)[1].astype(np.float64)  # the blocks' values
        exact = a.astype(np.float64) @ (b.T if op == "MatMulBT" else b)
        sessions = {name: mb.matmul_session(op, m, k, n, device, lower=lower_with(settings, cols, choice),
                                            weights=args.weights) for name, settings, cols, choice in variants}
        outputs = {name: output_of(s, a) for name, s in sessions.items()}
        copies = gpu_timing.copies_for(sessions["tree"]) if args.cold else 1
        commands = {name: gpu_timing.weight_copies(s, copies) if args.cold else None for name, s in sessions.items()}
        if not warmed:
            mb.warm_up(sessions["tree"], args.warmup, 50, commands["tree"])
            warmed = True
        calls = mb.calls_for(sessions["tree"], args.budget, args.repeats, commands["tree"])
        calls = gpu_timing.cold_calls(calls, copies)  # unchanged with one copy
        for r in range(args.rounds):
            for name, session in sessions.items():
                mb.warm_up(session, 0.05, calls, commands[name])
                median, p90 = gpu_timing.median_p90(mb.time_ours(session, calls, args.repeats, commands[name]))
                rows.append({"op": op, "m": m, "k": k, "n": n, "weights": args.weights, "variant": name, "round": r,
                             "us": median * 1e6, "p90_us": p90 * 1e6, "calls": calls, "weight_copies": copies,
                             "kernels": [d.kernel for d in session.plan.dispatches],
                             "max_abs_diff": float(np.abs(outputs[name] - outputs["tree"]).max()),
                             "max_abs_err": float(np.abs(outputs[name] - exact).max()), "adapter": adapter})
                if args.per_dispatch:
                    rows[-1]["dispatch_us"] = dispatch_times(session, calls, args.repeats, commands[name])
                print(f"{op}[{m},{k},{n}] {name:<12} round {r}: {median * 1e6:8.2f} us  "
                      f"{'+'.join(rows[-1]['kernels'])}  err {rows[-1]['max_abs_err']:.2e}"
                      + (f"  alone {' + '.join(f'{t:.2f}' for t in rows[-1]['dispatch_us'])}"
                         if args.per_dispatch else ""), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
