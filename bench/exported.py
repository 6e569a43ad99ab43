"""What the compiler makes of an exported ONNX model: node counts, e-graph size, phase times,
dispatches before and after optimisation, and the ops of the optimised plan.

For each ``.onnx`` file: its ONNX node count and op histogram; the import
(``eggfuse.onnx.load``) at the shapes of the inputs in ``NAME.npz`` beside it (the files of
``scripts/export_torch_fixtures.py``: ``input.*`` and ``output.*`` arrays), else ``--shape``,
else 1 for symbolic dimensions (as ``eggfuse optimize MODEL.onnx``); the rewrite engine's
report (``eggfuse.rewrites.optimize``: e-classes, e-nodes, the time of each phase, rules
fired, dispatches before and after); the lowering of the optimised graph for the device
(``eggfuse.pipeline.lower_for``); and the op histogram of the imported and the optimised
graph (live nodes), whose difference is what the rewrites built. Times are wall-clock
seconds of one run in this process (the first optimisation also registers egglog's rules:
``--warm`` runs a small model first so that this is not counted).

``--run`` also compiles and runs the model on the inputs of ``NAME.npz`` and compares each
output with torch's: max |diff| against max |torch|, and for ``logits`` the argmax at every
position; with an ``attention_mask`` input that drops some rows, also at the rows it keeps (a
padding row's value is each exporter's graph's own rule, not always torch's).
``--minilm-embeddings`` compares the sentence embeddings of an exported
all-MiniLM-L6-v2 (mean pooling over the attention mask and L2 normalisation, in numpy,
after eggfuse ran the encoder) with the hand-built path (``eggfuse.embed``) and with
sentence-transformers' as torch computed them. ``--precision f16`` compiles as
``compile(..., precision="f16")`` does (weights stored as float16, the hand-built path's too).

    .venv/bin/python bench/exported.py tests/data/exported/*.onnx [--run] [--json FILE]
    .venv/bin/python bench/exported.py build/exported/minilm.classic.onnx --run --minilm-embeddings
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np
import onnx

from eggfuse.onnx import Model, load
from eggfuse.onnx.importer import _dims, graph_inputs
from eggfuse.pipeline import PRECISIONS, lower_for, precision_rulesets
from eggfuse.rewrites import optimize

PHASES = ("insert", "analysis", "saturation", "extraction", "rebuild")


def npz_for(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``NAME.npz`` beside ``NAME.<exporter>.onnx``, if there is one."""
    npz = path.with_name(path.name.split(".")[0] + ".npz")
    return dict(np.load(npz)) if npz.is_file() else None


def input_shapes(proto: onnx.ModelProto, data: dict | None, given: dict[str, list[int]]) -> dict[str, list[int]]:
    shapes = {}
    for vi in graph_inputs(proto):
        if vi.name in given:
            shapes[vi.name] = given[vi.name]
        elif data is not None and f"input.{vi.name}" in data:
            shapes[vi.name] = list(data[f"input.{vi.name}"].shape)
        else:
            shapes[vi.name] = [d if isinstance(d, int) and d > 0 else 1 for d in _dims(vi)]
    return shapes


def histogram(nodes) -> dict[str, int]:
    return dict(collections.Counter(n.op for n in nodes).most_common())


def measure(path: Path, given: dict[str, list[int]], run: bool, precision: str = "f32") -> dict:
    t = time.perf_counter()
    proto = onnx.load(str(path))
    read_s = time.perf_counter() - t
    onnx_hist = collections.Counter(n.op_type for n in proto.graph.node)
    data = npz_for(path)
    shapes = input_shapes(proto, data, given)
    t = time.perf_counter()
    graph, params = load(proto, shapes=shapes)
    import_s = time.perf_counter() - t
    opt, rep = optimize(graph, rulesets=precision_rulesets(precision))
    t = time.perf_counter()
    plan = lower_for(opt)
    lower_s = time.perf_counter() - t
    before, after = histogram(graph.live_nodes()), histogram(opt.live_nodes())
    built = {op: {"before": before.get(op, 0), "after": n} for op, n in after.items() if n > before.get(op, 0)}
    row = {
        "model": str(path), "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "shapes": shapes, "onnx_nodes": len(proto.graph.node), "onnx_histogram": dict(onnx_hist.most_common()),
        "graph_nodes": len(graph.live_nodes()), "graph_nodes_after": len(opt.live_nodes()),
        "eclasses": rep.eclasses, "enodes": rep.enodes, "iterations": rep.iterations, "stop_reason": rep.stop_reason,
        "read_s": read_s, "import_s": import_s, "optimize_s": rep.total_s,
        **{f"{p}_s": rep.phases[p].seconds if p in rep.phases else None for p in PHASES},
        "lower_s": lower_s, "dispatches_before": rep.dispatches_before, "dispatches_after": rep.dispatches_after,
        "plan_dispatches": len(plan.dispatches), "precision": precision,
        "weights_bytes": plan.memory()["weights_bytes"], "rules_fired": rep.rules_fired,
        "graph_ops_before": before, "graph_ops_after": after, "ops_built": built,
    }
    if run:
        row["run"] = run_against_torch(path, data, precision)
    return row


def run_against_torch(path: Path, data: dict | None, precision: str = "f32") -> dict:
    if data is None:
        return {"error": f"no {path.name.split('.')[0]}.npz beside the model: nothing to compare with"}
    model = Model(path, cache=False, precision=precision)
    # the inputs the file declares: an exporter drops one the model does not read (DeBERTa's token types)
    feeds = {k.removeprefix("input."): v for k, v in data.items()
             if k.startswith("input.") and k.removeprefix("input.") in model.input_names}
    t = time.perf_counter()
    outs = model.run(feeds)
    first_s = time.perf_counter() - t
    spec = next(iter(model.plans.values()))
    t = time.perf_counter()
    model.run(feeds)
    out = {"first_run_s": first_s, "second_run_s": time.perf_counter() - t, "timings": spec.timings,
           "dispatches_unfused": spec.compiled.dispatches_unfused, "dispatches_fused": spec.compiled.dispatches_fused,
           "outputs": {}, "got": dict(zip(model.output_names, outs, strict=True))}
    mask = feeds.get("attention_mask")
    for name, got in out["got"].items():
        want = data.get(f"output.{name}")
        if want is None:
            continue
        diff = np.abs(got.astype(np.float64) - want)
        o = {"max_abs_diff": float(diff.max()), "scale": float(np.abs(want).max())}
        kept = mask.astype(bool) if mask is not None and got.shape[:2] == mask.shape else None
        if kept is not None and not kept.all():  # rows of padding: each exporter's graph has its own rule there
            o["max_abs_diff_kept"] = float(diff[kept].max())
        if name == "logits":
            same = got.argmax(-1) == want.argmax(-1)
            o.update(argmax_equal=int(same.sum()), positions=int(same.size))
            if kept is not None and not kept.all():
                o.update(argmax_equal_kept=int(same[kept].sum()), kept_positions=int(kept.sum()))
        out["outputs"][name] = o
    return out


def minilm_embeddings(row: dict, data: dict) -> dict:
    """The exported MiniLM's sentence embeddings (eggfuse ran the encoder) against eggfuse's
    hand-built path and sentence-transformers' (torch)."""
    import eggfuse

    hidden = row["run"]["got"]["last_hidden_state"].astype(np.float64)
    mask = data["input.attention_mask"][..., None].astype(np.float64)
    pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    emb = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    sentences = [str(s) for s in data["sentences"]]
    hand = eggfuse.embed(sentences, cache=False, precision=row["precision"])
    torch_emb = data["sentence_embedding"].astype(np.float64)
    cos = (emb * torch_emb).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(torch_emb, axis=1)
    return {"sentences": sentences, "vs_hand_built": float(np.abs(emb - hand.embeddings).max()),
            "cosine_vs_torch_min": float(cos.min()),
            "vs_torch": float(np.abs(emb - data["sentence_embedding"]).max()),
            "hand_built_vs_torch": float(np.abs(hand.embeddings - data["sentence_embedding"]).max()),
            "hand_built_dispatches": hand.dispatches_fused}


def show(row: dict) -> None:
    top = ", ".join(f"{op} {n}" for op, n in list(row["onnx_histogram"].items())[:10])
    print(f"{row['model']} (opset {row['opset']}, inputs {row['shapes']})")
    print(f"  ONNX nodes {row['onnx_nodes']}: {top}")
    print(f"  graph nodes {row['graph_nodes']} -> {row['graph_nodes_after']}; e-graph {row['eclasses']} e-classes, "
          f"{row['enodes']} e-nodes, {row['iterations']} iterations ({row['stop_reason']})")
    phases = ", ".join(f"{p} {row[f'{p}_s']:.3f}" for p in PHASES if row[f"{p}_s"] is not None)
    print(f"  seconds: read {row['read_s']:.3f}, import {row['import_s']:.3f}, optimize {row['optimize_s']:.3f} "
          f"({phases}), lower {row['lower_s']:.3f}")
    print(f"  dispatches {row['dispatches_before']} -> {row['dispatches_after']} (plan: {row['plan_dispatches']}); "
          f"weights {row['weights_bytes'] / 2**20:.1f} MiB ({row['precision']})")
    print("  ops built by the rewrites: " + (", ".join(f"{op} x{c['after']}" + (f" (was {c['before']})"
                                                   if c["before"] else "") for op, c in row["ops_built"].items())
                                            or "none"))
    print("  ops of the optimised graph: " + ", ".join(f"{op} {n}" for op, n in row["graph_ops_after"].items()))
    fired = sorted(row["rules_fired"].items(), key=lambda kv: -kv[1])
    print("  rules fired: " + (", ".join(f"{k} {v}" for k, v in fired) or "none"))
    run = row.get("run")
    if run and "error" in run:
        print(f"  run: {run['error']}")
    elif run:
        print(f"  run: first {run['first_run_s']:.2f} s (import + compile + run), second {run['second_run_s']:.3f} s; "
              f"dispatches {run['dispatches_unfused']} -> {run['dispatches_fused']}")
        for name, o in run["outputs"].items():
            extra = f", argmax equal at {o['argmax_equal']}/{o['positions']}" if "argmax_equal" in o else ""
            if "max_abs_diff_kept" in o:
                extra += f"; at the attention_mask's kept rows {o['max_abs_diff_kept']:.3g}"
                if "argmax_equal_kept" in o:
                    extra += f", argmax equal at {o['argmax_equal_kept']}/{o['kept_positions']}"
            print(f"  {name}: max |eggfuse - torch| {o['max_abs_diff']:.3g} (scale {o['scale']:.3g}){extra}")
    emb = row.get("minilm_embeddings")
    if emb:
        print(f"  sentence embeddings: max |export - hand-built| {emb['vs_hand_built']:.3g}, |export - torch| "
              f"{emb['vs_torch']:.3g} (cosine >= {emb['cosine_vs_torch_min']:.7f}), |hand-built - torch| "
              f"{emb['hand_built_vs_torch']:.3g} "
              f"(hand-built plan: {emb['hand_built_dispatches']} dispatches)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path, help=".onnx files")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=DxD", help="an input's shape")
    ap.add_argument("--run", action="store_true", help="also run each model and compare with torch's outputs")
    ap.add_argument("--minilm-embeddings", action="store_true", help="(an exported MiniLM) compare embeddings")
    ap.add_argument("--warm", action="store_true", help="optimise a small fixture first (egglog's one-time set-up)")
    ap.add_argument("--precision", choices=PRECISIONS, default="f32",
                    help="f16: weights stored as float16 where the rewrite engine chooses it (compile's precision)")
    ap.add_argument("--json", type=Path, help="write the rows to this file")
    args = ap.parse_args()
    given = {}
    for s in args.shape:
        name, _, dims = s.rpartition("=")
        given[name] = [int(d) for d in dims.split("x")]
    if args.warm:
        warm = Path(__file__).resolve().parent.parent / "tests" / "data" / "exported" / "bert_tiny.dynamo.onnx"
        optimize(load(warm, shapes={"input_ids": [2, 7], "token_type_ids": [2, 7], "attention_mask": [2, 7]})[0])
    from eggfuse.runtime import get_device

    get_device()  # created once per process: not part of the first model's lowering
    rows = []
    for path in args.models:
        row = measure(path, given, args.run or args.minilm_embeddings, args.precision)
        if args.minilm_embeddings and "last_hidden_state" in row.get("run", {}).get("got", {}):
            row["minilm_embeddings"] = minilm_embeddings(row, npz_for(path))
        row.get("run", {}).pop("got", None)
        show(row)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
