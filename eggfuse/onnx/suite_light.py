"""The ``light`` kind of :mod:`eggfuse.onnx.suite`: the nine models the onnx wheel ships.

onnx's ``real`` model cases point (``url``) at ``onnx/backend/test/data/light/light_*.onnx``
for the models whose files the wheel holds (the others are downloads). onnx's runner makes
their inputs with ``Runner.generate_dummy_data(input, seed=0, random=False)`` (``arange(n) / n``,
float32) and takes the expected outputs from the ``light_*_output_<i>.pb`` files beside them;
:func:`light_data` does the same through the runner's own function. Every weight of these
models is a ConstantOfShape of 0.02, so every channel of a layer holds one value and seven of
the nine expected outputs are a uniform softmax (0.001 whatever the logits):
:func:`logits_check` compares the tensor entering the last Softmax with onnxruntime.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Where the ``url`` of onnx's real-model cases points for the models the wheel ships.
LIGHT_URL = "onnx/backend/test/data/light/"


def light_cases(cases: list) -> list:
    """The cases of onnx's ``real`` kind whose model file the wheel ships."""
    return [c for c in cases if (c.url or "").startswith(LIGHT_URL)]


def light_path(case) -> Path:
    """The ``.onnx`` file of a light case, where onnx's runner finds it (``url`` under the
    folder holding the ``onnx`` package)."""
    import onnx

    return Path(onnx.__file__).resolve().parent.parent / case.url


def read_tensor(path: Path) -> np.ndarray:
    """The array in a serialised ``TensorProto`` file (onnx's ``*.pb`` data)."""
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def light_data(case, model) -> list[tuple[list, list]]:
    """The one data set of a light case: inputs from onnx's ``Runner.generate_dummy_data``
    (seed 0, not random: ``arange(n) / n``), outputs from ``light_<name>_output_<i>.pb``."""
    from onnx.backend.test.runner import Runner

    inits = {t.name for t in model.graph.initializer}
    inputs = [Runner.generate_dummy_data(vi, seed=0, name=case.model_name, random=False)
              for vi in model.graph.input if vi.name not in inits]
    path = light_path(case)
    outputs = []
    for i in range(len(model.graph.output)):
        f = path.with_name(f"{path.stem}_output_{i}.pb")
        if not f.exists():
            raise FileNotFoundError(f"{case.name}: no expected output {f}")
        outputs.append(read_tensor(f))
    return [(inputs, outputs)]


def logits_check(model, inputs: list, fuse: bool) -> dict | None:
    """The tensor entering ``model``'s last Softmax, computed by eggfuse and by onnxruntime
    from ``inputs``: ``tensor`` (its name), ``abs``/``rel`` (the largest errors), or ``skip``
    (why not); None when the model has no Softmax."""
    import onnx

    from .suite import max_errors

    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    if not softmax:
        return None
    name = softmax[-1].input[0]
    try:
        import onnxruntime
    except ImportError:
        return {"tensor": name, "skip": "onnxruntime is not installed"}
    cut = onnx.shape_inference.infer_shapes(model)  # a copy, with the tensor's type among value_info
    info = next((vi for vi in cut.graph.value_info if vi.name == name), None)
    if info is None:
        return {"tensor": name, "skip": "onnx's shape inference gives no type for it"}
    del cut.graph.output[:]
    cut.graph.output.append(info)
    from eggfuse.onnx.backend import EggfuseBackend

    got = list(EggfuseBackend.prepare(cut, "CPU", fuse=fuse).run(inputs))
    session = onnxruntime.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs, strict=True))
    abs_err, rel_err = max_errors(got, session.run(None, feeds))
    return {"tensor": name, "abs": abs_err, "rel": rel_err}


def light_table(results: list[dict], seconds: float, ci: Sequence[str] = (), load: float | None = None) -> str:
    """The markdown table of the light models: one row per model (see :func:`run_case`'s
    ``measure``); ``ci`` names the cases tests/onnx/test_light_models.py runs, ``load`` the
    machine's 1-minute load average when the run began."""
    passed = sum(r["status"] == "passed" for r in results)
    adapter = next((r["adapter"] for r in results if r.get("adapter")), "?")
    where = f"On {adapter}, {os.cpu_count()} CPU cores" + (f", load average {load:.1f} at the start" if load else "")

    def num(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "-"

    def logits(r: dict) -> str:
        lg = r.get("logits")
        if lg is None:
            return "no Softmax"
        if "skip" in lg:
            return lg["skip"].replace("|", "\\|")
        return f"{lg['abs']:.2g} / {lg['rel']:.2g}"

    lines = ["# onnx backend light models through eggfuse", "",
             "Regenerate with `python -m eggfuse.onnx.suite --kind light` (lavapipe or any GPU): onnx's `real` "
             "model cases whose files the wheel ships (`onnx/backend/test/data/light/light_*.onnx`, opset 9, every "
             "weight a ConstantOfShape of 0.02). Inputs are made by onnx's runner, `Runner.generate_dummy_data(input, "
             "seed=0, random=False)`; expected outputs are the `light_*_output_0.pb` files. A model passes when its "
             "output has the expected dtype and shape and `assert_allclose` holds at the case's rtol/atol.", "",
             "With constant weights every channel of every layer holds the same value, so seven of the nine expected "
             "outputs are a uniform softmax (0.001 everywhere) that any equal logits give. The last column checks the "
             "numbers behind them: the tensor entering the last Softmax, eggfuse against onnxruntime (CPU) on the "
             "same inputs (max abs / max rel error).", "",
             f"**{passed} of {len(results)} models pass** ({seconds:.0f} s). {where}. Times in seconds: prepare "
             "(import, optimisation, lowering, binding; the compile cache on), the first run and a second run. "
             "*in CI*: the models `--ci-seconds` admits, fastest first (tests/onnx/light_ci.txt, run by "
             "tests/onnx/test_light_models.py).", "",
             "| model | ONNX nodes | dispatches unfused -> fused | prepare | first run | run | max abs err | "
             "max rel err | rtol / atol | passes | pre-Softmax vs onnxruntime | in CI |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ok = "yes" if r["status"] == "passed" else f"no: {r['reason']}, {r['detail'][:120]}".replace("|", "\\|")
        disp = f"{r['dispatches_unfused']} -> {r['dispatches_fused']}" if "dispatches_fused" in r else "-"
        tol = f"{r['rtol']:g} / {r['atol']:g}" if "rtol" in r else "-"
        lines.append(f"| {r['name'].removeprefix('test_')} | {r.get('onnx_nodes', '-')} | {disp} | "
                     f"{num(r, 'prepare_s', '.1f')} | {num(r, 'first_run_s', '.1f')} | {num(r, 'run_s', '.1f')} | "
                     f"{num(r, 'max_abs_err', '.2g')} | {num(r, 'max_rel_err', '.2g')} | {tol} | {ok} | {logits(r)} | "
                     f"{'yes' if r['name'] in ci else 'no'} |")
    return "\n".join(lines) + "\n"


def light_ci_subset(results: list[dict], budget_s: float) -> list[str]:
    """The passing models, fastest first, while their ``seconds`` (prepare and runs) add up to at
    most ``budget_s``, sorted by name."""
    names, total = [], 0.0
    for r in sorted((r for r in results if r["status"] == "passed"), key=lambda r: r["seconds"]):
        if total + r["seconds"] > budget_s:
            break
        names.append(r["name"])
        total += r["seconds"]
    return sorted(names)


