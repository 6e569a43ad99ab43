"""Where a plan's time goes along its chain of dispatches, and what the L2 prefetch of narrow dispatches
(``lowering/prefetch.py``) gives: each model's fused plan timed in four forms, alternated over rounds
in one process:

- ``prefetch``: the plan as lowered (narrow attention dispatches prefetch the next dispatches' weights);
- ``none``: lowered with ``prefetch=False``;
- ``l2_bound``: ``none`` with every dispatch's weight buffers replaced by those of the first dispatch
  of the same kernel (so from the second layer on the weights come from the L2 cache; the outputs are
  wrong, the times are the bound of what prefetching can give);
- ``floor``: ``none`` with every kernel replaced by one that stores one word from one workgroup, the
  bind groups and grids unchanged: the fixed cost of the chain (barriers, launches, pipeline changes).

Times as ``bench/models.py`` takes ours: wall clock around ``--calls`` back-to-back runs with one
wait (median and p90 of ``--repeats`` samples), and GPU timestamps around as many plan copies.
The graphs are those ``bench/models.py --save-graphs`` pickles (random weights, as there)::

    .venv/bin/python bench/models.py --save-graphs bench/graphs                 # here (egglog)
    python3 bench/prefetch.py --graphs bench/graphs --json bench/results/prefetch_h200/f32.json
    python3 bench/prefetch.py --graphs bench/graphs/q4_1 --models smollm2_decode --json .../q4_1.json

JSON rows: ``model``, ``weights``, ``variant``, ``round``, ``wall_ms``, ``wall_p90_ms``, ``gpu_ms``,
``dispatches``, ``prefetched_bytes`` (summed over the plan's dispatches), ``adapter``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import Session  # noqa: E402

VARIANTS = ("prefetch", "none", "l2_bound", "floor")


def _weights(plan, d) -> list[int]:
    return [i for i in d.inputs if plan.buffers[i].kind in ("parameter", "derived")
            and plan.buffers[i].name not in plan.state]


def l2_bound(session: Session) -> int:
    """Rebind every dispatch's weights to those of the first dispatch of its kernel; how many were rebound."""
    plan, first, moved = session.plan, {}, 0
    for d in plan.dispatches:
        for slot, i in enumerate(d.inputs):
            if i not in _weights(plan, d):
                continue
            key = (d.kernel, slot, plan.buffers[i].size_bytes)
            if first.setdefault(key, i) != i:
                session._buffers[i] = session._buffers[first[key]]
                moved += 1
    _rebind(session, [None] * len(plan.dispatches))
    return moved


def floor(session: Session) -> int:
    """Replace every kernel by one that stores a word from one workgroup; the pipelines made."""
    plan, device, made = session.plan, session.device, {}
    pipelines = []
    for d in plan.dispatches:
        bgl = session._pipeline(d)[1]
        last = len(d.bindings) - 1
        access = ["read_write" if slot == last or slot in d.writable else "read" for slot in range(last + 1)]
        decls = [f"@group(0) @binding({slot}) var<storage, {a}> b{slot}: array<u32>;" for slot, a in enumerate(access)]
        source = "\n".join(decls) + f"""
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    if (wid.x == 0u && wid.y == 0u && wid.z == 0u && li == 0u) {{
        b{last}[0] = 0u;
    }}
}}
"""
        key = (source, id(bgl))
        if key not in made:
            module = device.create_shader_module(code=source)
            made[key] = device.create_compute_pipeline(
                layout=device.create_pipeline_layout(bind_group_layouts=[bgl]),
                compute={"module": module, "entry_point": "main"})
        pipelines.append(made[key])
    _rebind(session, pipelines)
    return len(made)


def _rebind(session: Session, pipelines: list) -> None:
    # the session's commands made again from its (possibly replaced) buffers, with the given pipelines
    session._commands = session._rebound(pipelines=pipelines)
    session._native = None  # recorded again from the new commands on the next run


def run(kind: str, fused, params: dict, meta: dict, variant: str, args) -> dict:
    plan = lower_for(fused, prefetch=variant == "prefetch")
    session = Session(plan, {k: v for k, v in params.items() if k in fused.parameters})
    if variant == "l2_bound":
        l2_bound(session)
    elif variant == "floor":
        floor(session)
    seq = meta["seq"]
    inputs = models.model_inputs(kind, seq, meta["batch"], padded=False)
    feeds = models.our_feeds(kind, inputs, seq, args.calls)
    wall = gpu_timing.wall_per_call(session, feeds, args.repeats)
    session.run(feeds[0], read=())
    gpu = gpu_timing.gpu_per_call(session, args.calls, args.repeats)
    median, p90 = gpu_timing.median_p90(wall)
    return {"model": kind, "weights": meta["weights"], "variant": variant, "wall_ms": median * 1e3,
            "wall_p90_ms": p90 * 1e3, "gpu_ms": gpu_timing.median_p90(gpu)[0] * 1e3 if gpu else None,
            "dispatches": len(plan.dispatches),
            "prefetched_bytes": sum(plan.buffers[i].size_bytes for d in plan.dispatches for i in d.prefetch),
            "adapter": session.adapter}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="folder of bench/models.py --save-graphs")
    ap.add_argument("--models", default=",".join(models.MODELS), help="which of " + ",".join(models.MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which of " + ",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every variant, alternated (default 2)")
    ap.add_argument("--repeats", type=int, default=20, help="samples, for median and p90 (default 20)")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back runs per sample (default 10)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "prefetch.json")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    if bad := [v for v in variants if v not in VARIANTS] + [m for m in wanted if m not in models.MODELS]:
        raise SystemExit(f"unknown variants or models: {bad}")
    loaded, meta = models.load_graphs(args.graphs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'model':<16}{'weights':<8}{'variant':<10}{'round':>6}{'wall ms':>10}{'p90':>10}{'GPU ms':>10}"
          f"{'dispatches':>11}{'prefetched MB':>15}")
    for kind in wanted:
        unfused, fused = loaded[kind]
        params = models.random_params(kind, unfused, meta["layers"], meta["weights"])
        for r in range(args.rounds):
            for variant in variants:
                row = {**run(kind, fused, params, meta, variant, args), "round": r}
                rows.append(row)
                gpu = "-" if row["gpu_ms"] is None else f"{row['gpu_ms']:.3f}"
                print(f"{kind:<16}{row['weights']:<8}{variant:<10}{r:>6}{row['wall_ms']:>10.3f}"
                      f"{row['wall_p90_ms']:>10.3f}{gpu:>10}{row['dispatches']:>11}"
                      f"{row['prefetched_bytes'] / 1e6:>15.1f}", flush=True)
                args.json.write_text(json.dumps(rows, indent=1))
    for kind in wanted:  # medians over the rounds, relative to "none"
        by = {v: float(np.median([r["gpu_ms"] or r["wall_ms"] for r in rows if r["model"] == kind
                                  and r["variant"] == v])) for v in variants}
        if "none" in by:
            print(f"{kind}: GPU ms " + ", ".join(f"{v} {t:.3f} ({t / by['none']:.3f}x none)" for v, t in by.items()))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
