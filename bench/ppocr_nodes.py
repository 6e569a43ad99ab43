"""PP-OCR's dispatches against onnxruntime's optimised graph: for each of rapidocr-onnxruntime's
three models (PP-OCRv4 det, PP-OCRv4 rec, PP-OCR mobile v2 cls) at the static input shapes of
``tests/gpu/test_onnx_files.py``, the nodes of the graph onnxruntime runs after its graph
optimisations (``GraphOptimizationLevel.ORT_ENABLE_ALL``, CPU execution provider, written out
through ``SessionOptions.optimized_model_filepath``), counted in total and by op type, and at
``ORT_ENABLE_EXTENDED`` (the same fusions without the NCHWc layout transform, whose
ReorderInput / ReorderOutput nodes are a CPU layout's), beside
eggfuse's dispatches before and after fusion (what ``eggfuse optimize FILE.onnx --shape x=...
--json`` reports as ``dispatches_before`` / ``dispatches_after``).

onnxruntime runs one kernel per node of its optimised graph, so its node count is the number of
kernels it launches per run; eggfuse's dispatches are the compute passes of its plan (views and
folded constants launch none).

    .venv/bin/python bench/ppocr_nodes.py            # a table
    .venv/bin/python bench/ppocr_nodes.py --json     # one JSON object per model, a line each

JSON fields: ``model``, ``input``, ``onnx_nodes`` (of the file), ``ort_nodes`` (of its optimised
graph), ``ort_ops`` (op type -> count, ``domain:`` prefixed outside the ONNX domain),
``ort_extended_nodes`` (of the graph at ORT_ENABLE_EXTENDED),
``dispatches_before``, ``dispatches_after``, ``optimize_s``.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from onnx_files import ort_optimised, ppocr  # noqa: E402  (tests/onnx_files.py: the files the tests run)

#: (model, static input shape): the shapes of tests/gpu/test_onnx_files.py.
MODELS = (("det", (1, 3, 64, 256)), ("rec", (1, 3, 48, 320)), ("cls", (1, 3, 48, 192)))


def eggfuse_dispatches(path: Path, shape: tuple[int, ...]) -> dict:
    """``eggfuse optimize PATH --shape x=... --json`` (a process of its own, as a user runs it)."""
    exe = Path(sys.executable).with_name("eggfuse")
    cmd = [str(exe), "optimize", str(path), "--shape", "x=" + "x".join(map(str, shape)), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(kind: str, shape: tuple[int, ...], tmp: Path) -> dict:
    path = ppocr(kind)
    opt = ort_optimised(path, shape, tmp / f"{kind}.ort.onnx")
    ops = collections.Counter((f"{n.domain}:" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                              for n in opt.graph.node)
    extended = ort_optimised(path, shape, tmp / f"{kind}.ext.onnx", "ORT_ENABLE_EXTENDED")
    ours = eggfuse_dispatches(path, shape)
    return {"model": kind, "input": list(shape), "onnx_nodes": len(onnx.load(str(path)).graph.node),
            "ort_nodes": len(opt.graph.node), "ort_ops": dict(ops.most_common()),
            "ort_extended_nodes": len(extended.graph.node),
            "dispatches_before": ours["dispatches_before"], "dispatches_after": ours["dispatches_after"],
            "optimize_s": round(ours["total_s"], 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per model")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(kind, shape, Path(d)) for kind, shape in MODELS]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"onnxruntime {ort.__version__}, CPU provider: nodes at ORT_ENABLE_ALL (ORT_ENABLE_EXTENDED)")
    print(f"{'model':5} {'input':16} {'ONNX nodes':>10} {'ORT nodes':>12} {'ours unfused -> fused':>22}")
    for r in rows:
        ort_nodes = f"{r['ort_nodes']} ({r['ort_extended_nodes']})"
        print(f"{r['model']:5} {str(r['input']):16} {r['onnx_nodes']:>10} {ort_nodes:>12} "
              f"{r['dispatches_before']:>12} -> {r['dispatches_after']:<6}")
    for r in rows:
        print(f"{r['model']} ORT ops: " + ", ".join(f"{k} {v}" for k, v in r["ort_ops"].items()))


if __name__ == "__main__":
    main()
