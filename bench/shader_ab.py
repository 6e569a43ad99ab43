"""One model plan with a WGSL file of ``shaders/`` as a git revision had it (A) and as the tree has
it (B), lowered both ways and timed alternately in one process: our GPU time (timestamps) and wall
time per run, and the largest difference between the two plans' outputs.

The A text comes from ``git show REV:shaders/NAME`` (or ``--a-file``, for a machine without the
repository's history) and replaces the file for lowering only (``eggfuse.lowering.wgsl.shader_text``);
everything else is the tree's. Graphs are those of ``bench/models.py --save-graphs``; parameters
and inputs are its random ones. Timing is bench/models.py's (``time_plan``: ``gpu_timing.wall_per_call``,
N back-to-back runs and one wait, then ``gpu_timing.gpu_per_call``, after its warm-up).

    python3 bench/shader_ab.py --shader attention_cached.wgsl --rev 0bad600 \\
        --graphs bench/graphs bench/graphs/q4_1 --model smollm2_decode --json out.json   # GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models  # noqa: E402
from eggfuse.lowering import wgsl  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402


@contextlib.contextmanager
def shader_replaced(name: str, text: str | None):
    """Lowering inside takes ``text`` for shaders/``name`` (None: the tree's file). A slot the tree's lowering
    fills with nothing and ``text`` lacks (a hook added since that revision, empty where unused) is left out
    for it, so an older revision renders the kernels that leave the hook empty; one the tree fills (matmul.wgsl's
    LAST_SPLIT in a split product without the RmsNorm prologue) still raises LoweringError naming the slot."""
    real, real_render = wgsl.shader_text, wgsl.render

    def render(shader: str, **slots: object) -> str:
        if shader == name:
            wanted = set(wgsl._SLOT.findall(wgsl._expand(shader, {shader})))
            slots = {k: v for k, v in slots.items() if k in wanted or v != ""}
        return real_render(shader, **slots)

    if text is not None:
        wgsl.shader_text = lambda n: text if n == name else real(n)
        wgsl.render = render
    try:
        yield
    finally:
        wgsl.shader_text, wgsl.render = real, real_render


def lowered_with(graph, name: str, text: str | None):
    """``graph`` lowered for the device with shaders/``name`` replaced by ``text`` (None: the tree's)."""
    with shader_replaced(name, text):
        return lower_for(graph)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shader", required=True, help="a file of shaders/, e.g. attention_cached.wgsl")
    ap.add_argument("--rev", help="the git revision whose version of the file is A")
    ap.add_argument("--a-file", type=Path, help="the A version as a file, instead of --rev")
    ap.add_argument("--graphs", type=Path, nargs="+", required=True, help="folders of bench/models.py --save-graphs")
    ap.add_argument("--model", default="smollm2_decode", choices=models.MODELS)
    ap.add_argument("--rounds", type=int, default=3, help="A and B alternated this many times")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back runs per sample")
    ap.add_argument("--repeats", type=int, default=20, help="samples per round and side")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    if (args.rev is None) == (args.a_file is None):
        raise SystemExit("give exactly one of --rev and --a-file")
    a_text = args.a_file.read_text() if args.a_file else subprocess.run(
        ["git", "show", f"{args.rev}:shaders/{args.shader}"], check=True, capture_output=True, text=True).stdout
    rows = []
    for folder in args.graphs:
        fused, params, feeds, meta = models.saved_model(folder, args.model, args.calls)
        plans = {"A": lowered_with(fused, args.shader, a_text), "B": lowered_with(fused, args.shader, None)}
        outputs = {}
        for r in range(args.rounds):
            for side, plan in plans.items():
                t = models.time_plan(plan, params, feeds, args.calls, args.repeats)
                outputs.setdefault(side, t["output"])
                rows.append({"model": args.model, "weights": meta["weights"], "shader": args.shader,
                             "side": side, "version": (args.rev or str(args.a_file)) if side == "A" else "tree",
                             "round": r, "wall_ms": gpu_timing.median_p90(t["wall"])[0] * 1e3,
                             "gpu_ms": gpu_timing.median_p90(t["gpu"])[0] * 1e3 if t["gpu"] else None,
                             "adapter": t["adapter"]})
                print({k: rows[-1][k] for k in ("weights", "side", "round", "wall_ms", "gpu_ms")}, flush=True)
        diff = float(np.max(np.abs(outputs["A"] - outputs["B"])))
        rows.append({"model": args.model, "weights": meta["weights"], "max_abs_diff": diff})
        print(f"{meta['weights']}: max |B - A| {diff:.3g}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
