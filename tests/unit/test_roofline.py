"""The roofline cost model, its calibration fit and the cost-model names; predictions are
checked against the formula worked by hand."""

import numpy as np
import pytest

from eggfuse.ir import DType, InputError, TensorType
from eggfuse.rewrites import CostModel, KernelInfo, RooflineCostModel
from eggfuse.rewrites.cost import kernel_info
from eggfuse.rewrites.roofline import DeviceProfile, cost_model_from_spec, fit_profile

P = DeviceProfile("test", dispatch_s=5e-6, bandwidth=1e12, peak_flops=1e13)


def test_kernel_cost_is_latency_plus_the_longer_of_memory_and_compute():
    m = RooflineCostModel(P)
    # 1 MB moved, 1 MFLOP: memory-bound, 1 us of traffic + 5 us of launch
    assert m.kernel_cost(KernelInfo("Add", 1, 600_000, 400_000, 1_000_000)) == pytest.approx(6_000, rel=1e-12)
    # 1 KB, 1 GFLOP: compute-bound, 100 us + 5 us
    assert m.kernel_cost(KernelInfo("MatMul", 1, 512, 512, 10**9)) == pytest.approx(105_000, rel=1e-12)
    # an epilogue operand read: no dispatch
    assert m.kernel_cost(KernelInfo("epilogue:bias", 0, 4_000_000, 0, 0)) == pytest.approx(4_000, rel=1e-12)
    # under a nanosecond: 300 bytes at 1 TB/s is 0.3 ns, not rounded to 0 (nor 1000 such reads to 0)
    assert m.kernel_cost(KernelInfo("epilogue:bias", 0, 300, 0, 0)) == pytest.approx(0.3, rel=1e-12)


def test_kernel_info_carries_shapes_dtypes_attributes_and_flops():
    a, b, out = TensorType((8, 64)), TensorType((64, 32)), TensorType((8, 32))
    k = kernel_info("MatMul", {}, (a, b), out)
    assert k.inputs == (a, b) and k.output == out and k.output.dtype is DType.F32
    assert k.flops == 2 * 8 * 64 * 32  # one multiply and one add per term of each dot product
    assert (k.bytes_read, k.bytes_written) == ((8 * 64 + 64 * 32) * 4, 8 * 32 * 4)


def test_fit_recovers_the_constants_of_a_roofline():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(60):
        nbytes, flops = int(rng.integers(1e3, 1e8)), int(rng.integers(1e3, 1e11))
        t = 5e-6 + max(nbytes / 1e12, flops / 1e13)  # the formula, worked out here
        samples.append((KernelInfo("X", 1, nbytes, 0, flops), t))
    got = fit_profile(samples, "fitted")
    assert got.dispatch_s == pytest.approx(5e-6, rel=1e-6)
    assert got.bandwidth == pytest.approx(1e12, rel=1e-6)
    assert got.peak_flops == pytest.approx(1e13, rel=1e-6)


def test_fit_refuses_too_few_samples():
    with pytest.raises(InputError, match="at least 3"):
        fit_profile([(KernelInfo("X", 1, 1, 1, 1), 1e-6)], "x")


def test_cost_models_by_name():
    assert type(cost_model_from_spec("bytes")) is CostModel
    assert cost_model_from_spec("roofline").profile.name == "h200"
    assert cost_model_from_spec("roofline:lavapipe").profile.name == "lavapipe"
    assert type(cost_model_from_spec("eggfuse.rewrites.roofline:RooflineCostModel")) is RooflineCostModel
    with pytest.raises(InputError, match="unknown device profile 'tpu'"):
        cost_model_from_spec("roofline:tpu")
    with pytest.raises(InputError, match="unknown cost model 'flops'"):
        cost_model_from_spec("flops")
    with pytest.raises(InputError, match="cannot import 'no_such_module_here'"):
        cost_model_from_spec("no_such_module_here:Model")
    with pytest.raises(InputError, match="not a subclass"):
        cost_model_from_spec("eggfuse.rewrites.roofline:DeviceProfile")


def test_a_cost_model_of_ones_own_from_a_file_or_the_current_folder(tmp_path, monkeypatch):
    # a module of the folder the command runs from did not import under the console script; a class needing
    # arguments was Python's TypeError; a file had no form
    (tmp_path / "my_costs.py").write_text(
        "from eggfuse.rewrites import CostModel\n"
        "class Flat(CostModel):\n    def kernel_cost(self, k):\n        return 1.0\n"
        "class NeedsArg(CostModel):\n    def __init__(self, scale):\n        super().__init__()\n")
    monkeypatch.chdir(tmp_path)
    assert type(cost_model_from_spec("my_costs:Flat")).__name__ == "Flat"
    assert type(cost_model_from_spec(f"{tmp_path / 'my_costs.py'}:Flat")).__name__ == "Flat"
    with pytest.raises(InputError, match=r"cost model 'my_costs:NeedsArg': eggfuse calls NeedsArg\(\) with no "
                                         r"arguments, but NeedsArg\(scale\) requires some .*name a class that takes"):
        cost_model_from_spec("my_costs:NeedsArg")
    with pytest.raises(InputError, match="my_costs has no class 'Missing'"):
        cost_model_from_spec("my_costs:Missing")


def test_the_cost_models_load_without_egglog():
    import subprocess
    import sys

    code = ("import sys; sys.modules['egglog'] = None\n"  # any import of egglog now fails
            "from eggfuse.rewrites.roofline import DeviceProfile, RooflineCostModel\n"
            "from eggfuse.rewrites import CostModel, KernelInfo\n"
            "m = RooflineCostModel(DeviceProfile('d', 6e-6, 1e12, 1e13))\n"
            "print(m.kernel_cost(KernelInfo('Add', 1, 0, 0, 0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == pytest.approx(6000, rel=1e-12)
