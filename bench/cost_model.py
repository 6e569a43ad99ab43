"""Do the cost models predict GPU time? Predicted against measured time, per kernel and per plan,
for each cost model, on the shipped models' plans (unfused, and fused under each cost model).

Two steps, because the GPU machine has no egglog: the graphs are optimised here and pickled,
then timed there with timestamp queries (this script's timing and pricing need only the IR,
lowering, runtime and ``eggfuse.rewrites.cost``/``roofline``, which load without egglog)::

    .venv/bin/python bench/cost_model.py --save-graphs bench/graphs/cost              # here (egglog)
    python3 bench/cost_model.py --graphs bench/graphs/cost --calibrate h200 \\
        --json bench/results/cost_model_h200.json                                     # on the GPU machine

A smoke test on lavapipe: ``--save-graphs /tmp/gc --quick`` then ``--graphs /tmp/gc``.

Models (``bench/models.py``'s graphs, random weights of the real shapes): ``minilm`` (batch x
seq tokens), ``smollm2_prefill`` (seq tokens), ``smollm2_decode`` (one token over a 512-position
KV cache). Plans: ``unfused``, and ``fused:<cost model>`` for each of ``--cost-models`` at
``--save-graphs`` (default ``bytes``, ``roofline:h200``, ``roofline:lavapipe``).

Measured: every dispatch in its own timestamped compute pass (``runtime.profile.profile``,
median of ``--repeats``), summed per graph node (a kernel: one node may lower to several
dispatches); and the whole plan, as a session runs it (one compute pass), by timestamps
around ``--calls`` back-to-back copies (``gpu_timing.gpu_per_call``). Predicted: each cost
model's ``kernel_cost`` of the node's :class:`~eggfuse.rewrites.KernelInfo`: ``bytes``
(byte-equivalents, :class:`~eggfuse.rewrites.CostModel`), ``roofline:<profile>`` for every
profile of ``eggfuse.rewrites.roofline.PROFILES`` (nanoseconds), and with ``--calibrate NAME``
a profile fitted to this run's kernels (``fit_profile``; in-sample, so labelled ``fitted``).

Reported per cost model (JSON ``summary``): ``kernel_spearman`` (Spearman's rank correlation of
predicted and measured kernel times, all plans pooled), ``kernel_mdape`` (median absolute
percentage error after scaling the prediction by one factor fitted over all kernels, the
geometric mean of measured / predicted: the byte model has no time unit), ``kernel_mdape_raw``
(roofline models: unscaled), ``plan_spearman`` and ``plan_mdape`` (the same over whole plans:
predicted sum against the measured one-pass plan time). ``plans`` lists each plan's measured
times (``gpu_ms`` one pass, ``kernels_ms`` summed) and predictions; ``default_check`` compares
the measured plan time of the plans fused under each cost model, per model: a cost model may
become the default only if no model's plan gets slower (``slower_than_bytes``: more than 2%
slower than the plan fused under ``bytes``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import sys
from pathlib import Path

import numpy as np

from eggfuse.ir import Graph
from eggfuse.rewrites.cost import CostModel, kernel_info
from eggfuse.rewrites.roofline import PROFILES, RooflineCostModel, fit_profile

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402


def _bench_models():
    # bench/models.py (the graphs, inputs and feeds; it imports torch only to run the peers), by path:
    # the name ``models`` is also the repository's models/ package
    spec = importlib.util.spec_from_file_location("bench_models", Path(__file__).with_name("models.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_models = _bench_models()

DEFAULT_FUSED = ("bytes", "roofline:h200", "roofline:lavapipe")


def save_graphs(out: Path, meta: dict, cost_models: list[str]) -> None:
    from eggfuse.rewrites import optimize
    from eggfuse.rewrites.roofline import cost_model_from_spec

    out.mkdir(parents=True, exist_ok=True)
    for name, g in bench_models.graphs(meta["seq"], meta["batch"], meta["layers"]).items():
        fused = {}
        for spec in cost_models:
            fused[spec], rep = optimize(g, cost_model=cost_model_from_spec(spec))
            print(f"{name} fused:{spec}: dispatches {rep.dispatches_before} -> {rep.dispatches_after}")
        (out / f"{name}.pkl").write_bytes(pickle.dumps({"unfused": g, "fused": fused, "meta": meta}))
    print(f"wrote {out}/*.pkl ({meta})")


def models_to_price(calibrated=None) -> dict[str, CostModel]:
    out: dict[str, CostModel] = {"bytes": CostModel()}
    out.update({f"roofline:{p}": RooflineCostModel(p) for p in PROFILES})
    if calibrated is not None:
        out[f"roofline:{calibrated.name} (fitted)"] = RooflineCostModel(calibrated)
    return out


def node_kernels(graph: Graph) -> dict[int, object]:
    """KernelInfo of every live node that dispatches, by node id."""
    out = {}
    for node in graph.live_nodes():
        if (n := graph.dispatches(node)) == 0:
            continue
        ins = tuple(graph.node(i).type for i in node.inputs)
        out[node.id] = kernel_info(node.op, node.attrs, ins, node.type, n)
    return out


def measure(graph: Graph, kind: str, meta: dict, args) -> dict:
    """Per-node GPU seconds (timestamps, each dispatch in its own pass) and the plan's one-pass GPU seconds."""
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session
    from eggfuse.runtime.profile import profile

    inputs, params = bench_models.random_values(graph)
    feeds = bench_models.our_feeds(kind, bench_models.model_inputs(kind, meta["seq"], meta["batch"], padded=False),
                                   meta["seq"], 1)[0]
    session = Session(lower_for(graph), {k: v for k, v in params.items() if k in graph.parameters})
    prof = profile(session, feeds, repeats=args.repeats)
    per_node: dict[int, float] = {}
    labels: dict[int, str] = {}
    for d, k in zip(session.plan.dispatches, prof.kernels, strict=True):
        per_node[d.node] = per_node.get(d.node, 0.0) + k.gpu_ms * 1e-3
        labels.setdefault(d.node, d.label)
    session.run(feeds, read=())
    plan = gpu_timing.gpu_per_call(session, args.calls, args.repeats)
    return {"per_node": per_node, "labels": labels, "plan_s": float(np.median(plan)) if plan else None,
            "adapter": session.adapter, "dispatches": len(session.plan.dispatches)}


def spearman(a, b) -> float:
    """Spearman's rank correlation (ties get their average rank), numpy only."""
    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):  # average rank of ties
            tie = x == v
            r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def mdape(pred, meas) -> float:
    pred, meas = np.asarray(pred, dtype=np.float64), np.asarray(meas, dtype=np.float64)
    return float(np.median(np.abs(pred - meas) / meas))


def scale_of(pred, meas) -> float:
    """The one factor s minimising the log error of s * pred: the geometric mean of meas / pred."""
    pred, meas = np.asarray(pred, dtype=np.float64), np.asarray(meas, dtype=np.float64)
    ok = pred > 0
    return float(np.exp(np.mean(np.log(meas[ok] / pred[ok])))) if ok.any() else float("nan")


def evaluate(plans: list[dict], cost_models: dict[str, CostModel]) -> dict:
    summary = {}
    for name, model in cost_models.items():
        pred_k, meas_k, plan_pred, plan_meas = [], [], [], []
        for p in plans:
            ks = [(model.kernel_cost(p["kernels"][n]), t) for n, t in p["measured"].items() if n in p["kernels"]]
            pred_k += [c for c, _ in ks]
            meas_k += [t for _, t in ks]
            plan_pred.append(sum(c for c, _ in ks))
            plan_meas.append(p["gpu_s"] or sum(t for _, t in ks))
        s = scale_of(pred_k, meas_k)
        row = {"kernels": len(pred_k), "kernel_spearman": spearman(pred_k, meas_k),
               "kernel_mdape": mdape(np.asarray(pred_k) * s, meas_k), "scale_s_per_unit": s,
               "plan_spearman": spearman(plan_pred, plan_meas),
               "plan_mdape": mdape(np.asarray(plan_pred) * s, plan_meas)}
        if isinstance(model, RooflineCostModel):
            row["kernel_mdape_raw"] = mdape(np.asarray(pred_k) * 1e-9, meas_k)
            row["plan_mdape_raw"] = mdape(np.asarray(plan_pred) * 1e-9, plan_meas)
        summary[name] = row
        for p, pp in zip(plans, plan_pred, strict=True):
            p["predicted"][name] = pp
    return summary


def default_check(plans: list[dict]) -> dict:
    """Per model, the measured one-pass plan time of the plan fused under each cost model."""
    out: dict[str, dict] = {}
    for p in plans:
        if p["plan"].startswith("fused:"):
            out.setdefault(p["model"], {})[p["plan"][6:]] = p["gpu_ms"]
    for times in out.values():
        base = times.get("bytes")
        times["slower_than_bytes"] = sorted(k for k, v in times.items() if base and v and v > base * 1.02)
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save-graphs", type=Path, help="optimise the graphs (needs egglog) and pickle them here")
    ap.add_argument("--graphs", type=Path, help="folder of graphs saved by --save-graphs")
    ap.add_argument("--cost-models", default=",".join(DEFAULT_FUSED),
                    help="with --save-graphs: the cost models to fuse under (default bytes,roofline:h200,"
                         "roofline:lavapipe)")
    ap.add_argument("--quick", action="store_true", help="small shapes (seq 16, batch 2, 2 layers)")
    ap.add_argument("--seq", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--models", default=",".join(bench_models.MODELS))
    ap.add_argument("--repeats", type=int, default=5, help="timestamped runs per plan (median)")
    ap.add_argument("--calls", type=int, default=5, help="back-to-back plan copies per one-pass plan timing")
    ap.add_argument("--calibrate", metavar="NAME", help="fit a device profile NAME to the measured kernels")
    ap.add_argument("--json", type=Path, help="write the results here")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    meta = {"seq": 16, "batch": 2, "layers": 2} if args.quick else {"seq": 128, "batch": 8, "layers": None}
    meta.update({k: v for k, v in {"seq": args.seq, "batch": args.batch, "layers": args.layers}.items()
                 if v is not None})
    if args.save_graphs:
        save_graphs(args.save_graphs, meta, [c for c in args.cost_models.split(",") if c])
        return
    if not args.graphs:
        raise SystemExit("give --save-graphs DIR (here, with egglog) or --graphs DIR (saved by --save-graphs)")
    plans, adapter = [], ""
    for kind in args.models.split(","):
        path = args.graphs / f"{kind}.pkl"
        if not path.exists():
            raise SystemExit(f"{path} is missing: .venv/bin/python bench/cost_model.py --save-graphs {args.graphs}")
        saved = pickle.loads(path.read_bytes())
        meta = saved["meta"]
        for plan, graph in [("unfused", saved["unfused"]), *((f"fused:{k}", g) for k, g in saved["fused"].items())]:
            m = measure(graph, kind, meta, args)
            adapter = m["adapter"]
            ks = node_kernels(graph)
            plans.append({"model": kind, "plan": plan, "dispatches": m["dispatches"], "kernels": ks,
                          "measured": m["per_node"], "labels": m["labels"], "gpu_s": m["plan_s"],
                          "gpu_ms": m["plan_s"] and m["plan_s"] * 1e3,
                          "kernels_ms": sum(m["per_node"].values()) * 1e3, "predicted": {}})
            print(f"{kind} {plan}: {m['dispatches']} dispatches, plan {plans[-1]['gpu_ms'] or float('nan'):.3f} ms "
                  f"(kernels summed {plans[-1]['kernels_ms']:.3f} ms)", flush=True)
    fitted = None
    if args.calibrate:
        samples = [(p["kernels"][n], t) for p in plans for n, t in p["measured"].items() if n in p["kernels"] and t > 0]
        fitted = fit_profile(samples, args.calibrate, f"fitted by bench/cost_model.py on {adapter}, "
                                                      f"{len(samples)} kernels of {meta}")
        print(f"fitted profile: {fitted!r}")
    summary = evaluate(plans, models_to_price(fitted))
    print(f"{'cost model':<30}{'kernel rho':>11}{'kernel err':>11}{'raw err':>9}{'plan rho':>10}{'plan err':>10}")
    for name, r in summary.items():
        raw = r.get("kernel_mdape_raw")
        print(f"{name:<30}{r['kernel_spearman']:>11.3f}{r['kernel_mdape']:>11.1%}"
              f"{'' if raw is None else f'{raw:.1%}':>9}{r['plan_spearman']:>10.3f}{r['plan_mdape']:>10.1%}")
    check = default_check(plans)
    print("measured plan ms by the cost model it was fused under:", json.dumps(check))
    if args.json:
        rows = []
        for p in plans:
            kernels = [{"node": n, "label": p["labels"].get(n, ""), "op": p["kernels"][n].op, "measured_s": t,
                        "bytes": p["kernels"][n].bytes_read + p["kernels"][n].bytes_written,
                        "flops": p["kernels"][n].flops}
                       for n, t in p["measured"].items() if n in p["kernels"]]
            rows.append({k: v for k, v in p.items() if k not in ("kernels", "measured", "labels", "gpu_s")}
                        | {"kernel_rows": kernels})
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"adapter": adapter, "meta": meta, "summary": summary,
                                         "profile": fitted and fitted.to_dict(), "default_check": check,
                                         "plans": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
