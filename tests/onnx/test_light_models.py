"""The light models the onnx wheel ships (onnx/backend/test/data/light/light_*.onnx), driven by
onnx's own test runner through eggfuse.onnx.backend: the runner makes the inputs
(``generate_dummy_data``, seed 0, not random), writes them under ``ONNX_MODELS`` (here a
temporary folder) beside the expected outputs it copies from the wheel, and compares at the
case's rtol/atol. tests/onnx/light_ci.txt lists the models fast enough for CI on lavapipe
(``python -m eggfuse.onnx.suite --kind light --jobs 1 --ci-list tests/onnx/light_ci.txt``: the
fastest, within 60 s); the others (vgg19 always, at 224 x 224) run in the full command, whose
table is tests/onnx/light_suite.md."""

from pathlib import Path

import numpy as np
import onnx.backend.test
import pytest

from eggfuse.onnx.backend import EggfuseBackend

CASES = (Path(__file__).parent / "light_ci.txt").read_text().split()

backend_test = onnx.backend.test.BackendTest(EggfuseBackend, __name__)
_wanted = {f"{name}_cpu" for name in CASES}
_classes = backend_test.test_cases  # a property that builds new classes on each access
for _cls in _classes.values():
    for _attr in [a for a in vars(_cls) if a.startswith("test_") and a not in _wanted]:
        delattr(_cls, _attr)
globals().update({k: c for k, c in _classes.items() if any(a.startswith("test_") for a in vars(c))})


@pytest.fixture(autouse=True)
def _onnx_models_folder(tmp_path, monkeypatch):
    """The runner writes each model's test_data_set_0 under ONNX_MODELS: a folder of the test's own."""
    monkeypatch.setenv("ONNX_MODELS", str(tmp_path))


def test_the_subset_is_not_empty_and_every_case_is_a_light_model():
    from eggfuse.onnx.suite import load_cases

    known = {c.name for c in load_cases("light")}
    assert len(known) == 9 and CASES and set(CASES) <= known, sorted(set(CASES) - known)
    assert sum(a in _wanted for c in _classes.values() for a in vars(c)) == len(CASES)


def test_the_split_fully_connected_layer_of_alexnet_matches_onnxruntime_before_the_softmax():
    # its expected output is a uniform softmax (constant weights): the logits carry the numbers
    pytest.importorskip("onnxruntime")
    from eggfuse.onnx.suite import case_model, load_cases, logits_check
    from eggfuse.onnx.suite_light import light_data

    (case,) = load_cases("light", "alexnet")
    model = case_model(case)
    ((inputs, _),) = light_data(case, model)
    assert inputs[0].dtype == np.float32  # the runner's inputs: arange(n) / n
    np.testing.assert_array_equal(inputs[0].reshape(-1)[:3], (np.arange(3) / inputs[0].size).astype(np.float32))
    check = logits_check(model, inputs, fuse=True)
    assert check["tensor"] == "r24"  # fc8, the input of prob
    assert check["rel"] < 1e-4, check
