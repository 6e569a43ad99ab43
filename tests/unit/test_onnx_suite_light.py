"""The light kind of eggfuse.onnx.suite without a device: which cases, their data, the CI
budget and the table's rows."""

import numpy as np

from eggfuse.onnx.suite import load_cases, max_errors
from eggfuse.onnx.suite_light import light_ci_subset, light_data, light_path, light_table

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]


def test_the_light_cases_are_the_nine_shipped_models_with_their_expected_outputs():
    cases = load_cases("light")
    assert [c.name for c in cases] == [f"test_{n}" for n in LIGHT]
    for c in cases:
        assert light_path(c).name == f"light_{c.model_name}.onnx" and light_path(c).exists()
    squeezenet = next(c for c in cases if c.model_name == "squeezenet")
    import onnx

    ((inputs, outputs),) = light_data(squeezenet, onnx.load(str(light_path(squeezenet))))
    (x,) = inputs
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32 and x.flat[0] == 0 and x.max() < 1
    assert [o.shape for o in outputs] == [(1, 1000, 1, 1)] and outputs[0].dtype == np.float32


def test_max_errors_counts_only_outputs_of_the_expected_shape_and_nan_as_infinite():
    want = [np.array([1.0, 2.0]), np.zeros(3)]
    assert max_errors([np.array([1.5, 2.0]), np.zeros(2)], want) == (0.5, 0.5)
    assert max_errors([np.array([np.nan, 2.0])], want)[0] == np.inf


def _result(name, seconds, status="passed"):
    return {"name": name, "status": status, "reason": "" if status == "passed" else "tolerance",
            "detail": "", "seconds": seconds}


def test_the_ci_subset_takes_the_fastest_passing_models_within_the_budget():
    results = [_result("test_a", 30), _result("test_b", 5), _result("test_c", 20), _result("test_d", 1, "failed"),
               _result("test_e", 40)]
    assert light_ci_subset(results, 60) == ["test_a", "test_b", "test_c"]  # 5 + 20 + 30 s; e would pass 60
    assert light_ci_subset(results, 4) == []


def test_the_table_has_a_row_per_model_saying_whether_it_passes_and_is_in_ci():
    ok = {**_result("test_vgg19", 50), "onnx_nodes": 82, "dispatches_unfused": 106, "dispatches_fused": 92,
          "prepare_s": 9.1, "first_run_s": 20.0, "run_s": 10.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
          "rtol": 1e-3, "atol": 1e-7, "logits": {"tensor": "fc8", "abs": 2.0, "rel": 3e-6}, "adapter": "llvmpipe"}
    bad = {**_result("test_resnet50", 3, "failed"), "detail": "output 0: max abs err 1 | x", "logits": None}
    text = light_table([ok, bad], 60.0, ci=["test_resnet50"], load=1.5)
    assert "**1 of 2 models pass**" in text and "llvmpipe" in text and "load average 1.5" in text
    row = next(line for line in text.splitlines() if line.startswith("| vgg19 "))
    assert "| 82 | 106 -> 92 | 9.1 | 20.0 | 10.0 |" in row and "| yes | 2 / 3e-06 | no |" in row
    row = next(line for line in text.splitlines() if line.startswith("| resnet50 "))
    assert "no: tolerance, output 0: max abs err 1 \\| x" in row and row.endswith("| no Softmax | yes |")
