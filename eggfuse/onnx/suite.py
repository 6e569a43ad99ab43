"""Run onnx's backend test cases through eggfuse and tabulate them per op type.

::

    python -m eggfuse.onnx.suite                      # every node case: tests/onnx/node_suite.md
    python -m eggfuse.onnx.suite -k "relu|gemm"       # the cases whose names match
    python -m eggfuse.onnx.suite --kind simple        # the model cases the onnx wheel ships
    python -m eggfuse.onnx.suite --kind light         # the nine light_*.onnx models: tests/onnx/light_suite.md

Each case is a model with its inputs and the outputs onnx's reference computed; it passes
when every output has the expected dtype and shape and ``np.testing.assert_allclose`` holds
with the case's ``rtol``/``atol`` (the suite's defaults, 1e-3 / 1e-7, unless the case gives
others), as ``onnx.backend.test.runner`` checks. A failure gets a reason: ``unsupported op``,
``unsupported dtype``, ``unsupported attribute``, ``import`` (another refusal by the
importer, with its message), ``tolerance`` (with the largest error), ``shape``/``dtype``
mismatches, or ``error`` (an exception that is not an eggfuse error: a bug). Cases run in
worker processes (``--jobs``); a worker that dies is restarted and its case counted as a
``crash``.

``light`` is onnx's ``real`` kind restricted to the models the wheel ships
(``onnx/backend/test/data/light/light_*.onnx``; the other real models are downloads). Their
inputs are made as onnx's runner makes them, by ``Runner.generate_dummy_data(input, seed=0,
random=False)``, and their expected outputs are the ``light_*_output_0.pb`` files beside them.
Their table is per model: ONNX nodes, dispatches, timings, the largest errors, and (their
weights being constants, seven of the nine outputs are a uniform softmax, 0.001 whatever the
logits) the error of the tensor that enters the last Softmax against onnxruntime, when it is
installed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from .suite_light import light_cases, light_ci_subset, light_data, light_path, light_table, logits_check, read_tensor

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")



def load_cases(kind: str = "node", pattern: str | None = None) -> list:
    """onnx's test cases of ``kind`` (node cases are built in memory), filtered by ``pattern``."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "light":
            cases = light_cases(load_model_tests(kind="real"))
        else:
            cases = load_model_tests(kind=kind)
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.name)]
    return sorted(cases, key=lambda c: c.name)


def op_type_of(case, by_name: dict[str, str]) -> str:
    """The op type a case tests: its single node's, or (an ``_expanded`` function body) that of
    the case it expands."""
    model = case_model(case)
    nodes = model.graph.node
    if len(nodes) == 1:
        return nodes[0].op_type
    base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
    if base in by_name:
        return by_name[base]
    return "(model)" if case.kind != "node" else Counter(n.op_type for n in nodes).most_common(1)[0][0]


def case_model(case):
    import onnx

    if case.model is not None:
        return case.model
    if case.model_dir is None:
        return onnx.load(str(light_path(case)))
    return onnx.load(str(Path(case.model_dir) / "model.onnx"))


def case_data(case, model) -> list[tuple[list, list]]:
    """(inputs, expected outputs) of each data set of ``case``."""
    if case.data_sets is not None:  # as onnx's runner reads them: a TensorProto becomes its array
        from onnx import TensorProto, numpy_helper

        def arrays(xs) -> list:
            return [numpy_helper.to_array(x) if isinstance(x, TensorProto) else x for x in xs]

        return [(arrays(i), arrays(o)) for i, o in case.data_sets]
    if case.model_dir is None:
        return light_data(case, model)
    out = []
    for d in sorted(Path(case.model_dir).glob("test_data_set*")):
        def read(prefix: str, d: Path = d) -> list:
            files = sorted(d.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
            return [read_tensor(f) for f in files]

        out.append((read("input"), read("output")))
    return out


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason kind, message) of an exception raised for a case."""
    from eggfuse.ir import EggfuseError, OnnxError, UnsupportedOpsError

    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, UnsupportedOpsError):
        if "inputs of element types it does not run" in msg:  # a case eggfuse cannot feed, whatever its ops
            return "unsupported dtype", msg.split("; and ")[-1]
        return "unsupported op", ", ".join(sorted(exc.ops))
    if isinstance(exc, OnnxError):
        if "element type" in msg:
            return "unsupported dtype", msg
        if "attribute" in msg:
            return "unsupported attribute", msg
        return "import", msg
    if isinstance(exc, EggfuseError):
        return type(exc).__name__, msg
    return "error", f"{type(exc).__name__}: {msg}"


def compare(got: list, want: list, rtol: float, atol: float) -> tuple[str, str] | None:
    """None when ``got`` matches ``want`` as onnx's runner checks, else (reason, detail)."""
    if len(got) != len(want):
        return "outputs", f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, list | tuple) or w is None:
            return "outputs", f"output {k} is a sequence or an optional, which eggfuse does not return"
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype:
            return "dtype", f"output {k}: {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            return "shape", f"output {k}: {list(g.shape)}, expected {list(w.shape)}"
        try:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        except AssertionError:
            with np.errstate(all="ignore"):
                err = np.abs(g.astype(np.float64) - w.astype(np.float64))
                err = np.where(np.isnan(err), np.inf, err)
                rel = err / np.maximum(np.abs(w.astype(np.float64)), 1e-30)
            return "tolerance", (f"output {k}: max abs err {float(np.max(err)):.3g}, max rel err "
                                 f"{float(np.max(rel)):.3g} (rtol {rtol:g}, atol {atol:g})")
    return None


def max_errors(got: list, want: list) -> tuple[float, float]:
    """The largest absolute and relative error over the outputs of ``got`` that have the
    shape of their ``want`` (relative to ``|want|``, floored at 1e-30, as :func:`compare`)."""
    abs_err = rel_err = 0.0
    for g, w in zip(got, want, strict=False):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape or not g.size:
            continue
        with np.errstate(all="ignore"):
            err = np.abs(g - w)
            err = np.where(np.isnan(err), np.inf, err)
            abs_err = max(abs_err, float(err.max()))
            rel_err = max(rel_err, float((err / np.maximum(np.abs(w), 1e-30)).max()))
    return abs_err, rel_err


def run_case(case, fuse: bool = True, measure: bool = False) -> dict:
    """The result of one case: ``status`` passed / failed, ``reason``, ``detail``, ``seconds``.

    ``measure`` adds ``onnx_nodes``, ``dispatches_unfused``/``fused``, ``prepare_s`` (import,
    optimisation, lowering), ``first_run_s``, ``run_s`` (a second run), ``max_abs_err``,
    ``max_rel_err`` and ``logits`` (:func:`logits_check`)."""
    from eggfuse.onnx.backend import EggfuseBackend

    t = time.perf_counter()
    res = {"name": case.name, "status": "failed", "reason": "", "detail": ""}
    try:
        model = case_model(case)
        rep = EggfuseBackend.prepare(model, "CPU", fuse=fuse)
        res["prepare_s"] = round(time.perf_counter() - t, 3)
        for inputs, outputs in case_data(case, model):
            t1 = time.perf_counter()
            got = list(rep.run(inputs))
            if measure:
                t2 = time.perf_counter()
                rep.run(inputs)
                res["first_run_s"], res["run_s"] = round(t2 - t1, 3), round(time.perf_counter() - t2, 3)
                res["max_abs_err"], res["max_rel_err"] = max_errors(got, outputs)
            bad = compare(got, outputs, case.rtol, case.atol)
            if bad:
                res["reason"], res["detail"] = bad
                break
        else:
            res["status"] = "passed"
        plans = [p.compiled for p in rep.model.plans.values() if p.compiled is not None]
        res["dispatches"] = sum(c.dispatches_fused for c in plans)  # 0: no kernel ran (folded, or passed through)
        if measure:
            res["onnx_nodes"] = len(model.graph.node)
            res["dispatches_unfused"] = sum(c.dispatches_unfused for c in plans)
            res["dispatches_fused"] = sum(c.dispatches_fused for c in plans)
            res["adapter"] = plans[0].adapter if plans else ""
            res["rtol"], res["atol"] = case.rtol, case.atol
            try:
                res["logits"] = logits_check(model, inputs, fuse)
            except Exception as e:  # noqa: BLE001 - reported in its column, the case stands
                res["logits"] = {"skip": "{}: {}".format(*classify(e))}
    except Exception as e:  # noqa: BLE001 - every failure is tabulated
        res["reason"], res["detail"] = classify(e)
    res["seconds"] = round(time.perf_counter() - t, 3)
    return res


def _worker(conn, kind: str, pattern: str | None, fuse: bool) -> None:
    warnings.simplefilter("ignore")
    cases = {c.name: c for c in load_cases(kind, pattern)}
    while True:
        name = conn.recv()
        if name is None:
            return
        conn.send(run_case(cases[name], fuse, measure=kind == "light"))


def run_all(kind: str, pattern: str | None, jobs: int, fuse: bool, progress: bool = True) -> list[dict]:
    """Every case's result, run in ``jobs`` worker processes (a crashed worker's case is a crash)."""
    names = [c.name for c in load_cases(kind, pattern)]
    ctx = mp.get_context("spawn")
    todo = list(reversed(names))
    results: dict[str, dict] = {}
    workers: list[list] = []  # [process, connection, current case]

    def start() -> list:
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(b, kind, pattern, fuse), daemon=True)
        p.start()
        return [p, a, None]

    workers = [start() for _ in range(max(1, min(jobs, len(names))))]
    t0 = time.perf_counter()
    while todo or any(w[2] for w in workers):
        for w in workers:
            if w[2] is None and todo:
                w[2] = todo.pop()
                w[1].send(w[2])
        for w in workers:
            if w[2] is None:
                continue
            if w[1].poll(0.01):
                try:
                    r = w[1].recv()
                except EOFError:
                    r = None
                if r is not None:
                    results[w[2]] = r
                    w[2] = None
                    if progress:
                        done = len(results)
                        print(f"\r{done}/{len(names)} ({time.perf_counter() - t0:.0f} s)", end="", file=sys.stderr)
                    continue
            if not w[0].is_alive():
                results[w[2]] = {"name": w[2], "status": "failed", "reason": "crash",
                                 "detail": f"the worker process died (exit code {w[0].exitcode})", "seconds": 0.0}
                w[:] = start()
    for w in workers:
        w[1].send(None)
        w[0].join(5)
    if progress:
        print(file=sys.stderr)
    return [results[n] for n in names]


def table(results: list[dict], ops: dict[str, str], kind: str, seconds: float) -> str:
    """The markdown table: per op type, cases, passed, failed and the failures' reasons."""
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_op[ops[r["name"]]].append(r)
    passed = sum(r["status"] == "passed" for r in results)
    folded = sum(r["status"] == "passed" and not r.get("dispatches") for r in results)
    reasons = Counter(r["reason"] for r in results if r["status"] != "passed")
    lines = [f"# onnx backend {kind} cases through eggfuse", "",
             "Regenerate with `python -m eggfuse.onnx.suite" + ("" if kind == "node" else f" --kind {kind}") + "` "
             "(lavapipe or any GPU). A case passes when every output has the expected dtype, shape and values "
             "within the case's rtol/atol (onnx's defaults, 1e-3 / 1e-7, unless the case sets others).", "",
             f"**{passed} of {len(results)} cases pass** ({seconds:.0f} s; {folded} of them ran no kernel). "
             "Failures by reason: "
             + ", ".join(f"{k} {v}" for k, v in reasons.most_common()) + ".", "",
             "*no kernel*: passing cases in which no dispatch ran: every output was computed at load time (the "
             "importer folds a node whose inputs are all known with onnx's reference evaluator: shape arithmetic, "
             "inputs bound at load time such as an empty tensor or a Range's bounds), or is an input passed through "
             "(a Cast between types computed alike: float32 and float64, int32 and int64).", "",
             "| op type | cases | passed | no kernel | failed | reasons of the failures (count: first case, detail) |",
             "|---|---|---|---|---|---|"]
    for op in sorted(by_op):
        rs = by_op[op]
        ok = sum(r["status"] == "passed" for r in rs)
        fails: dict[str, list[dict]] = defaultdict(list)
        for r in rs:
            if r["status"] != "passed":
                fails[r["reason"]].append(r)
        why = "; ".join(f"{k} {len(v)}: {v[0]['name']}, {v[0]['detail'][:140]}".replace("|", "\\|")
                        for k, v in sorted(fails.items()))
        folded = sum(r["status"] == "passed" and not r.get("dispatches") for r in rs)
        lines.append(f"| {op} | {len(rs)} | {ok} | {folded} | {len(rs) - ok} | {why} |")
    return "\n".join(lines) + "\n"


def ci_subset(results: list[dict], per_op: int) -> list[str]:
    """Up to ``per_op`` passing cases of every op type that has one (cases that run a kernel before
    those that run none, cases testing the op itself before ``_expanded`` function bodies;
    among those the slowest last), sorted by name."""
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        if r["status"] == "passed":
            by_op[r["op_type"]].append(r)
    names = []
    for rs in by_op.values():
        rs.sort(key=lambda r: (not r.get("dispatches"), "_expanded" in r["name"], r["seconds"]))
        names += [r["name"] for r in rs[:per_op]]
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eggfuse.onnx.suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=KINDS, default="node", help="which of onnx's test cases (default node)")
    p.add_argument("-k", metavar="REGEX", help="only the cases whose names match")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--no-fuse", action="store_true", help="run the unoptimised graphs")
    p.add_argument("--table", type=Path, help="write the markdown table here (a full run in the repository: "
                   "tests/onnx/<kind>_suite.md)")
    p.add_argument("--json", type=Path, help="every case's result as JSON")
    p.add_argument("--ci-list", type=Path, metavar="FILE",
                   help="write the CI subset here: up to --ci-per-op passing cases per op type (--kind light: "
                        "the models --ci-seconds allows)")
    p.add_argument("--ci-per-op", type=int, default=2, help="cases per op type in --ci-list (default 2)")
    p.add_argument("--ci-seconds", type=float, default=60.0,
                   help="--kind light: the passing models, fastest first, whose seconds add up to at most this go to "
                        "--ci-list (default 60)")
    args = p.parse_args(argv)
    t = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cases = load_cases(args.kind, args.k)
    if not cases:
        print(f"no {args.kind} case matches {args.k!r}", file=sys.stderr)
        return 1
    by_name = {}
    for c in load_cases(args.kind):
        nodes = case_model(c).graph.node
        if len(nodes) == 1:
            by_name[c.name] = nodes[0].op_type
    ops = {c.name: op_type_of(c, by_name) for c in cases}
    results = run_all(args.kind, args.k, args.jobs, not args.no_fuse)
    for r in results:
        r["op_type"] = ops[r["name"]]
    seconds = time.perf_counter() - t
    if args.kind == "light":
        ci = light_ci_subset(results, args.ci_seconds)
        text = light_table(results, seconds, ci, load)
    else:
        ci = ci_subset(results, args.ci_per_op)
        text = table(results, ops, args.kind, seconds)
    out = args.table
    if out is None and args.k is None and Path("tests").is_dir():  # a full run in the repository
        out = Path("tests") / "onnx" / f"{args.kind.replace('-', '_')}_suite.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.ci_list:
        args.ci_list.write_text("\n".join(ci) + "\n")
        print(f"wrote {args.ci_list}")
    passed = sum(r["status"] == "passed" for r in results)
    print(f"{passed} of {len(results)} {args.kind} cases pass ({seconds:.0f} s)")
    if out is None:
        for r in results:
            print(f"{r['status']:7} {r['name']:60} {r['reason']} {r['detail'][:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
