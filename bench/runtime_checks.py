"""What naga's runtime checks cost: each model's fused plan and single matmuls timed lowered with the
checks (``lower(..., runtime_checks=True)``, WebGPU's default) and without (eggfuse's default),
alternated over rounds in one process, with the largest difference between the two plans' outputs.

Without the checks (``runtime.pipelines.create_module``) naga neither clamps dynamic indices into
workgroup and function arrays nor bounds loops with counters of its own. Kernels that keep the checks
in an unchecked plan (``Kernel.runtime_checks``: the tiled matmul's 128-row tiles,
``ir.ops.matmul_kernel.keeps_runtime_checks``) keep them in both; ``--all-unchecked`` drops them there
too, to measure that choice. Times as ``bench/prefetch.py`` takes them (GPU timestamps around ``--calls``
back-to-back plan copies, median of ``--repeats`` samples); matmuls as ``bench/matmul.py`` (one pass of
back-to-back dispatches sized to about 30 ms, after ``SWEEP_WARMUP_S`` of them). The graphs are
those ``bench/models.py --save-graphs`` pickles (random weights)::

    .venv/bin/python bench/models.py --save-graphs bench/graphs                 # here (egglog)
    python3 bench/runtime_checks.py --graphs bench/graphs --json bench/results/runtime_checks_h200/f32.json

JSON rows: plans ``model``, ``weights``, ``checks`` (``checked``, ``unchecked``, ``all-unchecked``),
``round``, ``gpu_ms``, ``dispatches``, ``unchecked_dispatches``, ``adapter``, and per model one row with
``max_abs_diff`` (unchecked against checked outputs); matmuls ``m``, ``k``, ``n``, ``tile``, ``checks``,
``round``, ``us``, ``tflops``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402
import matmul as mm  # noqa: E402

import models  # noqa: E402
from eggfuse.ir import Graph  # noqa: E402
from eggfuse.ir.ops import matmul_kernel  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import Session, get_device  # noqa: E402

#: M, K, N of the matmuls: the 4096^3 target, SmolLM2's prefill products and LM head, MiniLM's.
MATMULS = ((4096, 4096, 4096), (128, 576, 960), (128, 576, 576), (128, 576, 3072), (128, 1536, 576),
           (128, 576, 49152), (1024, 384, 1152), (1024, 384, 1536), (1024, 1536, 384))


def _lower(graph: Graph, checks: str):
    if checks == "all-unchecked":
        with mock.patch.object(matmul_kernel, "keeps_runtime_checks", lambda tile: False):
            return lower_for(graph, runtime_checks=False)
    return lower_for(graph, runtime_checks=checks == "checked")


def plan_rows(kind: str, unfused, fused, meta: dict, variants: list[str], args) -> list[dict]:
    params = models.random_params(kind, unfused, meta["layers"], meta["weights"])
    params = {k: v for k, v in params.items() if k in fused.parameters}
    inputs = models.model_inputs(kind, meta["seq"], meta["batch"], padded=False)
    feeds = models.our_feeds(kind, inputs, meta["seq"], args.calls)
    plans = {v: _lower(fused, v) for v in variants}
    rows, outputs = [], {}
    for r in range(args.rounds):
        for v, plan in plans.items():
            session = Session(plan, params)
            outputs.setdefault(v, [np.array(o) for o in session.run(feeds[0])])
            gpu_timing.wall_per_call(session, feeds, 0)  # only the warm-up of bench/models.py (gpu_timing.WARMUP_S)
            session.run(feeds[0], read=())
            gpu = gpu_timing.gpu_per_call(session, args.calls, args.repeats)
            rows.append({"model": kind, "weights": meta["weights"], "checks": v, "round": r,
                         "gpu_ms": gpu_timing.median_p90(gpu)[0] * 1e3 if gpu else None,
                         "dispatches": len(plan.dispatches),
                         "unchecked_dispatches": sum(not d.runtime_checks for d in plan.dispatches),
                         "adapter": session.adapter})
            print(f"{kind:<16}{meta['weights']:<8}{v:<15}{r:>6}{rows[-1]['gpu_ms'] or float('nan'):>10.3f}"
                  f"{rows[-1]['dispatches']:>11}{rows[-1]['unchecked_dispatches']:>11}", flush=True)
    if "checked" in outputs:
        for v in outputs:
            if v != "checked":
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs[v], outputs["checked"], strict=True))
                rows.append({"model": kind, "weights": meta["weights"], "checks": v, "max_abs_diff": diff})
                print(f"{kind}: {v} outputs within {diff:.3g} of the checked plan's", flush=True)
    return rows


def matmul_rows(variants: list[str], args) -> list[dict]:
    rows = []
    device = get_device()
    for m, k, n in MATMULS:
        for r in range(args.rounds):
            for v in variants:
                session = mm.matmul_session("MatMulBT", m, k, n, device, lower=lambda g, _, v=v: _lower(g, v))
                plan = session.plan
                calls = mm.calls_for(session, 0.3, 10)
                mm.warm_up(session, mm.SWEEP_WARMUP_S, calls)
                t = float(np.median(mm.time_ours(session, calls, 10)))
                rows.append({"m": m, "k": k, "n": n, "tile": plan.dispatches[0].kernel, "checks": v, "round": r,
                             "us": t * 1e6, "tflops": 2 * m * k * n / t / 1e12})
                print(f"{m:>5} x {k:>5} x {n:>6} {v:<15}{r:>3}{t * 1e6:>10.2f} us {rows[-1]['tflops']:>7.2f} TFLOP/s  "
                      f"{plan.dispatches[0].kernel}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, help="folder of bench/models.py --save-graphs (omit: matmuls only)")
    ap.add_argument("--models", default=",".join(models.MODELS), help="which of " + ",".join(models.MODELS))
    ap.add_argument("--all-unchecked", action="store_true", help="also time plans with every kernel unchecked")
    ap.add_argument("--no-matmuls", action="store_true", help="leave the single matmuls out")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every variant, alternated (default 2)")
    ap.add_argument("--repeats", type=int, default=20, help="samples, for the median (default 20)")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back runs per sample (default 10)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "runtime_checks.json")
    args = ap.parse_args()
    variants = ["checked", "unchecked"] + (["all-unchecked"] if args.all_unchecked else [])
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    if bad := [m for m in wanted if m not in models.MODELS]:
        raise SystemExit(f"unknown models: {bad}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.graphs is not None:
        loaded, meta = models.load_graphs(args.graphs)
        print(f"{'model':<16}{'weights':<8}{'checks':<15}{'round':>6}{'GPU ms':>10}{'dispatches':>11}{'unchecked':>11}")
        for kind in wanted:
            rows += plan_rows(kind, *loaded[kind], meta, variants, args)
            args.json.write_text(json.dumps(rows, indent=1))
    if not args.no_matmuls:
        rows += matmul_rows(variants, args)
        args.json.write_text(json.dumps(rows, indent=1))
    print("medians over the rounds:")
    for key in sorted({(r["model"], r["weights"]) for r in rows if "gpu_ms" in r}):
        by = {v: float(np.median([r["gpu_ms"] for r in rows if (r.get("model"), r.get("weights")) == key
                                  and r["checks"] == v and "gpu_ms" in r])) for v in variants}
        print(f"  {key[0]} ({key[1]}): "
              + ", ".join(f"{v} {t:.3f} ms ({t / by['checked']:.3f}x)" for v, t in by.items()))
    for m, k, n in MATMULS:
        by = {v: [r["us"] for r in rows if (r.get("m"), r.get("k"), r.get("n")) == (m, k, n) and r["checks"] == v]
              for v in variants}
        if all(by.values()):
            med = {v: float(np.median(t)) for v, t in by.items()}
            print(f"  {m} x {k} x {n}: " + ", ".join(f"{v} {t:.2f} us ({t / med['checked']:.3f}x)"
                                                     for v, t in med.items()))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
