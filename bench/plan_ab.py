"""A model's plan as this tree lowers it, timed alternately in one process against plans lowered by
other revisions of eggfuse or with some of the lowering's constants changed: our wall and GPU time per
run, and each plan's largest output difference from this tree's.

``save`` lowers the model's fused graph (``bench/models.py --save-graphs`` folder) for the device and
pickles the ExecutionPlan with the adapter's name; run it with another revision on the path (e.g. a
``git archive`` of it installed in a folder of its own). ``time`` lowers the graph with this tree, loads
the saved plans (same adapter, same ExecutionPlan class layout: revisions near this one) and times all
of them by ``models.time_alternately`` (wall and GPU time per run, ``--calls`` back-to-back runs a
sample, ``--repeats`` samples, ``--rounds`` rounds). ``--set MODULE.NAME=VALUE`` (either command, as
often as needed) sets a constant of an eggfuse module before lowering, VALUE a Python literal: with
``save`` for the saved plan, with ``time`` for the tree's plan and every ``--variant``; each
``--variant NAME:MODULE.NAME=VALUE[,...]`` adds a plan lowered with its settings besides, and each
``--against-graphs NAME=FOLDER`` the model's graph from another ``--save-graphs`` folder (another
revision's optimisation, e.g. of a graph whose inputs changed), lowered by this tree and fed its own
random inputs (its ``max_abs_diff`` then compares other computations).

    PYTHONPATH=/tmp/old python3 bench/plan_ab.py save --graphs bench/graphs --model minilm --out old.pkl
    python3 bench/plan_ab.py time --graphs bench/graphs --model minilm --against old=old.pkl \\
        --variant "lanes256:eggfuse.ir.ops.matmul_kernel.LAYER_NORM_QUAD_MIN_LANES=256" --json ab.json

JSON: one row per (variant, round) with ``model``, ``variant`` (``tree``, a saved plan's name or a
``--variant``'s), ``round``, ``wall_us``, ``gpu_us`` (medians), ``dispatches``, ``max_abs_diff`` (against
the tree's output) and ``adapter``; with ``--profile`` then one row per variant with ``profile``, its
GPU time per kernel (``kernel``, ``source``: a digest of its WGSL, ``calls``, ``us``; every dispatch in a
compute pass of its own).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import json
import pickle
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import models  # noqa: E402


def parse_setting(text: str) -> tuple[str, str, object]:
    """``MODULE.NAME=VALUE`` -> (module, name, value); SystemExit naming the problem for a bad one."""
    target, sep, value = text.partition("=")
    module, _, name = target.rpartition(".")
    if not sep or not module.startswith("eggfuse.") or not name:
        raise SystemExit(f"setting {text!r}: write eggfuse.MODULE.NAME=VALUE")
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise SystemExit(f"setting {text!r}: {value!r} is not a Python literal") from None
    try:
        current = getattr(importlib.import_module(module), name)
    except ImportError:
        raise SystemExit(f"setting {text!r}: there is no module {module}") from None
    except AttributeError:
        raise SystemExit(f"setting {text!r}: {module} has no {name}") from None
    if current is not None and not isinstance(literal, type(current)):
        raise SystemExit(f"setting {text!r}: {module}.{name} holds {type(current).__name__} "
                         f"{current!r}, not {type(literal).__name__}")
    return module, name, literal


@contextlib.contextmanager
def settings_applied(settings: list[tuple[str, str, object]]):
    """Within the block, the module constants of ``settings`` (:func:`parse_setting`'s) hold their values;
    restored afterwards."""
    before = []
    for module, name, value in settings:
        mod = importlib.import_module(module)
        before.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)
    try:
        yield
    finally:
        for mod, name, value in reversed(before):
            setattr(mod, name, value)


def lowered(fused, settings: list[tuple[str, str, object]]):
    """``fused`` lowered for the device with ``settings`` in force (restored afterwards)."""
    from eggfuse.pipeline import lower_for

    with settings_applied(settings):
        return lower_for(fused)


def kernel_times(plan, params: dict, feed: dict) -> list[dict]:
    """``plan``'s GPU time per kernel (``eggfuse.runtime.profile.profile``: each dispatch in a
    timestamped compute pass of its own, median of 5 runs): rows ``kernel`` (the name), ``source``
    (the first 12 hex digits of the SHA-256 of its WGSL, so that a setting which changes a kernel's
    source but not its name shows as another row), ``calls``, ``us`` (summed), the largest first."""
    from eggfuse.runtime import Session
    from eggfuse.runtime.profile import profile

    prof = profile(Session(plan, {k: v for k, v in params.items() if k in plan.parameters}), feed, repeats=5)
    by: dict[tuple[str, str], list[float]] = {}
    for k in prof.kernels:
        digest = hashlib.sha256(plan.dispatches[k.index].source.encode()).hexdigest()[:12]
        by.setdefault((k.kernel, digest), []).append(k.gpu_ms * 1e3)
    return sorted(({"kernel": name, "source": digest, "calls": len(us), "us": sum(us)}
                   for (name, digest), us in by.items()), key=lambda r: -r["us"])


def fitted(graph, feeds: list[dict]) -> list[dict]:
    """``feeds`` for ``graph``'s inputs: each feed's array where its shape is the input's, else
    ``models.random_values``'s (a graph of another revision whose input changed: MiniLM's pooling
    weights, [B, B S] before they were [B, S])."""
    drawn, _ = models.random_values(graph)
    return [{name: f[name] if name in f and np.shape(f[name]) == ty.shape else drawn[name]
             for name, ty in graph.inputs.items()} for f in feeds]


def adapter_name() -> str:
    from eggfuse.runtime.device import get_device

    info = get_device().adapter.info
    return f"{info.get('device', '')} / {info.get('backend_type', '')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("command", choices=("save", "time"))
    ap.add_argument("--graphs", type=Path, required=True, help="a folder of bench/models.py --save-graphs")
    ap.add_argument("--model", required=True, choices=models.MODELS)
    ap.add_argument("--set", action="append", default=[], help="MODULE.NAME=VALUE before lowering the tree's plan")
    ap.add_argument("--out", type=Path, help="save: the pickle to write")
    ap.add_argument("--against", action="append", default=[], help="time: NAME=PLAN.pkl of save")
    ap.add_argument("--variant", action="append", default=[], help="time: NAME:MODULE.NAME=VALUE[,...]")
    ap.add_argument("--against-graphs", action="append", default=[],
                    help="time: NAME=FOLDER, the model's graph of another --save-graphs folder (another revision's "
                         "optimisation), lowered by this tree and fed its own inputs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", type=Path, help="time (required): where the rows go")
    ap.add_argument("--profile", action="store_true", help="time: then each plan's GPU time per kernel, as rows "
                    "with ``variant`` and ``profile`` (bench/profile_models.py's form of ours)")
    args = ap.parse_args()
    settings = [parse_setting(s) for s in args.set]
    if args.command == "save" and args.out is None:
        raise SystemExit("save needs --out FILE")
    if args.command == "time" and args.json is None:
        raise SystemExit("time needs --json FILE (where its rows go)")
    if args.command == "time" and args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    saved = {}
    for spec in args.against:
        name, sep, path = spec.partition("=")
        if not sep or not name or name == "tree" or name in saved:
            raise SystemExit(f"--against {spec!r}: write a new NAME=PLAN.pkl (NAME not 'tree')")
        if not Path(path).is_file():
            raise SystemExit(f"--against {spec!r}: there is no file {path!r} (make it with plan_ab.py save)")
        saved[name] = pickle.loads(Path(path).read_bytes())
    variants = {}
    for spec in args.variant:
        name, sep, rest = spec.partition(":")
        if not sep or not name or name in ("tree", *saved, *variants):
            raise SystemExit(f"--variant {spec!r}: write a new NAME:MODULE.NAME=VALUE[,...]")
        # settings split at the commas before "eggfuse.": a value may be a tuple
        variants[name] = [parse_setting(s) for s in re.split(r",(?=eggfuse\.)", rest)]
    fused, params, feeds, _ = models.saved_model(args.graphs, args.model, args.calls)
    other_graphs = {}
    for spec in args.against_graphs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or name in ("tree", *saved, *variants, *other_graphs):
            raise SystemExit(f"--against-graphs {spec!r}: write a new NAME=FOLDER")
        if not (Path(folder) / f"{args.model}.pkl").is_file():
            raise SystemExit(f"--against-graphs {spec!r}: no {args.model}.pkl in {folder!r} (bench/models.py "
                             "--save-graphs writes it)")
        other_graphs[name] = models.saved_model(Path(folder), args.model, args.calls)
    if args.command == "save":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(pickle.dumps({"adapter": adapter_name(), "model": args.model,
                                           "plan": lowered(fused, settings)}))
        print(f"wrote {args.out}")
        return
    plans = {"tree": lowered(fused, settings)}
    for name, plan in saved.items():
        if (plan["adapter"], plan["model"]) != (adapter_name(), args.model):
            raise SystemExit(f"--against {name}: lowered for {plan['model']} on {plan['adapter']}, "
                             f"not {args.model} on {adapter_name()}")
        plans[name] = plan["plan"]
    for name, extra in variants.items():
        plans[name] = lowered(fused, settings + extra)
    feeds_of = {name: feeds for name in plans}
    for name, (g, _, g_feeds, _) in other_graphs.items():
        plans[name], feeds_of[name] = lowered(g, settings), fitted(g, g_feeds)
        params = {**other_graphs[name][1], **params}  # its parameters of names the tree's graph lacks
    rows = [{"model": args.model, **row}
            for row in models.time_alternately(plans, params, feeds_of, args.calls, args.repeats, args.rounds)]
    if args.profile:
        rows += [{"model": args.model, "variant": name, "profile": kernel_times(plan, params, feeds_of[name][0])}
                 for name, plan in plans.items()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
