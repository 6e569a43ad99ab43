"""Where a plan's GPU time goes along its chain of dependent dispatches: each saved model's fused
plan timed in full and then with the dispatches of one op at one output type left out, so that the difference
bounds what fusing that op away (or making its kernel free) can save.

The profile (``bench/profile_models.py``) gives each kernel's time in a compute pass of its own,
which counts a dispatch's launch and drain once per kernel; here every variant is timed as the
models are (``bench/gpu_timing.gpu_per_call``: GPU timestamps around ``--calls`` back-to-back
copies of the plan, one compute pass per copy, as ``Session.run`` records a run), so what a
dispatch costs inside the chain shows, barriers and overlaps with its neighbours included.
A plan without some dispatches computes wrong numbers (later dispatches read stale buffers);
only its time is of use, and no output is read.

    .venv/bin/python bench/models.py --save-graphs bench/graphs [--weights q4_1]   # here
    python3 bench/ablation.py --graphs bench/graphs --json bench/results/ablation_h200.json

JSON: one row per (model, variant): ``model``, ``weights``, ``left_out`` (``op->output type``s, or
for one part of nodes of several dispatches ``op->output type part i/n``, or ``[]`` for the whole
plan, timed first and again last: the two show the drift between),
``dispatches``, ``left_out_dispatches``, ``ms`` and ``p90_ms`` (per plan run, median and p90 over
``--repeats`` samples), ``saved_ms`` (the whole plan's first median less this one's) and
``saved_us_per_dispatch``, with the adapter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

import models as mb  # noqa: E402

#: Op groups left out together as well as one by one: a decode step's two cache writes.
GROUPS = (("CacheWrite", "CacheWriteRoPE"),)


def _group(dispatch) -> str:
    """A dispatch's op and output type (its label's ``-> f32[1,960]``): the products of one op
    at different shapes are left out separately."""
    # a node of several dispatches labels them "<node> part i/n: inputs ... [-> scratch]": the node's own
    # output type groups them all
    out = dispatch.label.split(" part ")[0].rpartition("-> ")[2].split(" ")[0]
    return f"{dispatch.op}->{out}" if out else dispatch.op


def _part(dispatch) -> str | None:
    """For one of a node's several dispatches (a split-K product's partial sums and its reduction),
    its group and part (``FusedMatMul->f32[128,576] part 2/2``); None for a node of one dispatch."""
    _, sep, rest = dispatch.label.partition(" part ")
    return f"{_group(dispatch)} part {rest.split(':')[0]}" if sep else None


def variants(keys: list[str], parts: list[str | None] = ()) -> list[tuple[str, ...]]:
    """The dispatch groups (:func:`_group`) to leave out, one variant each: nothing, each group of
    the plan, then for each of GROUPS all the plan's groups of its ops, where it has several, then
    each part (:func:`_part`) of the nodes of several dispatches, and each part number across all of
    them (``part 2/2`` of every split-K product)."""
    present = sorted(set(keys), key=keys.index)
    out = [(), *((k,) for k in present)]
    for ops in GROUPS:
        joined = tuple(k for k in present if k.split("->")[0] in ops)
        if len(joined) > 1:
            out.append(joined)
    named = [p for p in parts if p is not None]
    split = sorted(set(named), key=named.index)
    out.extend((p,) for p in split)
    for number in sorted({p.rpartition(" part ")[2] for p in split}):
        same = tuple(p for p in split if p.endswith(f" part {number}"))
        if len(same) > 1:
            out.append(same)
    return out


def ablate(kind: str, graph, params: dict, meta: dict, calls: int, samples: int) -> list[dict]:
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session

    s = Session(lower_for(graph), {k: v for k, v in params.items() if k in graph.parameters})
    inputs = mb.model_inputs(kind, meta["seq"], meta["batch"], padded=False)
    s.run(mb.our_feeds(kind, inputs, meta["seq"], 1)[0], read=())
    commands, ops = list(s._commands), [_group(d) for d in s.plan.dispatches]
    parts = [_part(d) for d in s.plan.dispatches]
    if not gpu_timing.has_timestamps(s.device):
        raise SystemExit(f"{s.adapter} has no timestamp-query: nothing to time")
    rows = []
    # the whole plan first and again last (left_out []), to show how far the device drifted between
    for left_out in [*variants(ops, parts), ()]:
        s._commands = [c for c, op, part in zip(commands, ops, parts, strict=True)
                       if op not in left_out and part not in left_out]
        if not s._commands:  # nothing left to time
            continue
        med, p90 = gpu_timing.median_p90(gpu_timing.gpu_per_call(s, calls, samples))
        rows.append({"model": kind, "weights": meta["weights"], "left_out": list(left_out),
                     "dispatches": len(commands), "left_out_dispatches": len(commands) - len(s._commands),
                     "ms": med * 1e3, "p90_ms": p90 * 1e3, "adapter": s.adapter})
    s._commands = commands
    whole = rows[0]["ms"]  # the first run of the whole plan; the last row is the second
    for r in rows:
        r["saved_ms"] = whole - r["ms"]
        r["saved_us_per_dispatch"] = 1e3 * r["saved_ms"] / r["left_out_dispatches"] if r["left_out_dispatches"] \
            else 0.0
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="folder of bench/models.py --save-graphs")
    ap.add_argument("--models", default=",".join(mb.MODELS))
    ap.add_argument("--calls", type=int, default=20, help="back-to-back plan runs per sample (default 20)")
    ap.add_argument("--repeats", type=int, default=15, help="samples per variant (default 15)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "ablation.json")
    args = ap.parse_args()
    args.seq = args.batch = args.layers = args.weights = None  # the shapes the saved graphs have
    args.quick = False
    models, meta = mb.select_graphs(args)
    _, params = mb.hf_models(models, meta["layers"], None, None, "", meta["weights"])  # random weights
    out = []
    for kind, (_, fused) in models.items():
        rows = ablate(kind, fused, params[kind], meta, args.calls, args.repeats)
        print(f"{kind} ({meta['weights']}, {rows[0]['dispatches']} dispatches, {rows[0]['adapter']}): "
              f"{rows[0]['ms']:.3f} ms (p90 {rows[0]['p90_ms']:.3f})")
        for r in rows[1:-1]:
            print(f"  without {'+'.join(r['left_out']):<40} {r['left_out_dispatches']:>4} dispatches  "
                  f"{r['ms']:.3f} ms  saves {r['saved_ms']:.3f} ms = {r['saved_us_per_dispatch']:.2f} us each")
        print(f"  whole plan again: {rows[-1]['ms']:.3f} ms (p90 {rows[-1]['p90_ms']:.3f})")
        out.extend(rows)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
