"""The LayerNorm prologue (FusedLayerNormMatMul) timed against its alternative, a LayerNorm dispatch
then the product, at GPT-2 small's pre-LN products (hidden 768: c_attn 768 -> 2304 with its bias,
c_fc 768 -> 3072 with its bias and tanh-GELU), M = 8 x 128 and 1 x 128 rows of random weights.

``save`` (needs egglog) builds one graph per M, each with both products behind their own LayerNorm,
optimises it twice (with the optional ``layer_norm_prologue`` ruleset; and with the default rulesets,
which keep the norm) and pickles both. ``time`` (the GPU machine) lowers them, times them alternately
(``models.time_alternately``: wall and GPU time per run, ``--calls`` back-to-back runs a sample,
``--repeats`` samples, ``--rounds`` rounds) and profiles each kernel (``plan_ab.kernel_times``).

    .venv/bin/python bench/layer_norm_prologue.py save --graphs bench/graphs_ln
    python3 bench/layer_norm_prologue.py time --graphs bench/graphs_ln --json ln_prologue.json

JSON: rows of ``models.time_alternately`` with ``rows`` (M) and ``variant`` (``prologue`` or
``separate``), then one ``profile`` row per (M, variant).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path

import numpy as np

from eggfuse.ir import Graph

sys.path.insert(0, str(Path(__file__).parent))

from plan_ab import kernel_times  # noqa: E402

import models  # noqa: E402

HIDDEN, PRODUCTS = 768, ((2304, ()), (3072, ("GeluTanh",)))
ROWS = (1024, 128)


def block(m: int) -> Graph:
    """x [m, 768] -> LayerNorm -> x W + b (W [768, N], GPT-2's Conv1D), for each of PRODUCTS."""
    g = Graph()
    x = g.input("x", [m, HIDDEN])
    outs = []
    for i, (n, steps) in enumerate(PRODUCTS):
        h = g.layer_norm(x, g.parameter(f"ln{i}.weight", [HIDDEN]), g.parameter(f"ln{i}.bias", [HIDDEN]), eps=1e-5)
        y = g.bias_add(g.matmul(h, g.parameter(f"w{i}", [HIDDEN, n])), g.parameter(f"b{i}", [n]))
        if "GeluTanh" in steps:
            y = g.gelu(y, "tanh")
        outs.append(y)
    g.set_outputs(outs)
    return g


def save(folder: Path) -> None:
    from eggfuse.rewrites import optimize
    from eggfuse.rewrites.rulesets import select

    folder.mkdir(parents=True, exist_ok=True)
    for m in ROWS:
        g = block(m)
        fused, rep = optimize(g, rulesets=select(optional=["layer_norm_prologue"]))
        separate, rep2 = optimize(g)
        (folder / f"ln_{m}.pkl").write_bytes(pickle.dumps({"prologue": fused, "separate": separate}))
        print(f"M={m}: dispatches {rep.dispatches_after} with the prologue, {rep2.dispatches_after} without")


def time(folder: Path, calls: int, repeats: int, rounds: int, out: Path) -> None:
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime.device import get_device

    rows = []
    for m in ROWS:
        graphs = pickle.loads((folder / f"ln_{m}.pkl").read_bytes())
        _, params = models.random_values(graphs["prologue"])
        rng = np.random.default_rng(m)
        feeds = [{"x": rng.standard_normal((m, HIDDEN)).astype(np.float32)} for _ in range(calls)]
        plans = {name: lower_for(g, get_device()) for name, g in graphs.items()}
        rows += [{"rows": m, **r} for r in models.time_alternately(plans, params, feeds, calls, repeats, rounds)]
        rows += [{"rows": m, "variant": name, "profile": kernel_times(plan, params, feeds[0])}
                 for name, plan in plans.items()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("command", choices=("save", "time"))
    ap.add_argument("--graphs", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.command == "save":
        save(args.graphs)
    elif args.json is None:
        raise SystemExit("time needs --json FILE")
    else:
        time(args.graphs, args.calls, args.repeats, args.rounds, args.json)


if __name__ == "__main__":
    main()
