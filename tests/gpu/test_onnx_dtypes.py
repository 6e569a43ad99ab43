"""DOUBLE, FLOAT16 and BFLOAT16 tensors computed in float32 (eggfuse/onnx/importer.py,
COMPUTED_IN_F32): outputs come back in the declared type, a Cast to float16 or bfloat16 rounds
on the device; empty inputs are bound at load time."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx_models import F, model, node  # tests/onnx_models.py
from onnx_ort_check import check_against_ort, plan_ops  # tests/onnx_ort_check.py

from eggfuse.ir import InputError, OnnxError
from eggfuse.onnx import Model

D, H, BF = TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16
RNG = np.random.default_rng(9)


def test_a_double_model_runs_in_float32_and_returns_float64(device):
    w = RNG.standard_normal((4, 3))  # a float64 initializer: a parameter in float32
    m = model([node("MatMul", ["x", "w"], ["h"]), node("Tanh", ["h"], ["y"])], [("x", D, [2, 4])], [("y", D, None)],
              [("w", w)], opset=13)
    x = RNG.standard_normal((2, 4))
    eg = check_against_ort(m, {"x": x}, rtol=1e-5, atol=1e-6, device=device)  # dtype float64 checked there
    (spec,) = eg.plans.values()
    assert spec.params["w"].dtype == np.float32


def test_double_values_beyond_float32_are_refused_naming_the_tensor(device):
    # a finite float64 beyond float32's range would become an infinity: refused, not run
    m = model([node("Mul", ["x", "w"], ["y"])], [("x", D, [3])], [("y", D, None)], [("w", np.array([1e200, 1, 2]))],
              opset=13)
    with pytest.raises(OnnxError, match=r"tensor 'w': 1 value\(s\) up to 1e\+200 lie beyond float32's range"):
        Model(m, device=device).run({"x": np.ones(3)})
    ok = model([node("Mul", ["x", "x"], ["y"])], [("x", D, [3])], [("y", D, None)], opset=13)
    with pytest.raises(InputError, match=r"input 'x': 1 value\(s\) up to 3e\+39"):
        Model(ok, device=device).run({"x": np.array([1.0, 3e39, -2.0])})
    (y,) = Model(ok, device=device).run({"x": np.array([1.0, np.inf, -2.0])})  # an infinity stays one
    np.testing.assert_array_equal(y, [1.0, np.inf, 4.0])


def test_float16_inputs_are_exact_in_float32_and_outputs_round_once(device):
    m = model([node("Mul", ["a", "b"], ["p"]), node("Add", ["p", "a"], ["y"])], [("a", H, [64]), ("b", H, [64])],
              [("y", H, None)], opset=13)
    a, b = (RNG.standard_normal(64).astype(np.float16) for _ in range(2))
    (y,) = Model(m, device=device).run({"a": a, "b": b})
    assert y.dtype == np.float16
    want = (a.astype(np.float32) * b.astype(np.float32) + a.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(y, want)  # f32 arithmetic is exact here, then one rounding


def test_a_float16_output_past_its_range_is_inf_without_a_warning(device):
    import warnings

    m = model([node("Mul", ["a", "k"], ["y"])], [("a", H, [3])], [("y", H, None)], [("k", np.array(1e4, np.float16))],
              opset=13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" was printed
        (y,) = Model(m, device=device).run({"a": np.array([1.0, 10.0, -100.0], np.float16)})
    np.testing.assert_array_equal(y, np.array([1e4, np.inf, -np.inf], np.float16))


@pytest.mark.parametrize("to", [H, BF])
def test_a_cast_to_a_narrow_float_rounds_on_the_device(to, device):
    # Cast(x, to) feeds a float32 Mul: the rounding happens in the graph, not at the output
    ml_dtypes = pytest.importorskip("ml_dtypes")  # onnx's dependency
    m = model([node("Cast", ["x"], ["h"], to=to), node("Cast", ["h"], ["f"], to=F), node("Mul", ["f", "three"], ["y"])],
              [("x", F, [1000])], [("y", F, None)], [("three", np.array(3.0, np.float32))], opset=13)
    x = (RNG.standard_normal(1000) * 10.0 ** RNG.uniform(-6, 4.5, 1000)).astype(np.float32)
    eg = Model(m, device=device)
    (y,) = eg.run({"x": x})
    narrow = np.float16 if to == H else ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, x.astype(narrow).astype(np.float32) * np.float32(3.0))
    assert ("RoundToFloat16" if to == H else "RoundToBFloat16") in plan_ops(eg)


def test_an_empty_input_is_bound_at_load_time(device):
    # CastLike takes only the element type of its empty 'like'; a sum over an empty axis is 0
    m = model([node("CastLike", ["x", "like"], ["y"]), node("ReduceSum", ["e", "axes"], ["s"], keepdims=1)],
              [("x", F, [3]), ("like", H, [0]), ("e", F, [2, 0])], [("y", H, None), ("s", F, None)],
              [("axes", np.array([1], np.int64))], opset=13)
    x = np.array([1.0, 1e-4, 70000.0], np.float32)  # 70000 is past float16's range: inf
    y, s = Model(m, device=device).run({"x": x, "like": np.zeros(0, np.float16), "e": np.zeros((2, 0), np.float32)})
    assert y.dtype == np.float16 and np.array_equal(y, np.float16([1.0, 1e-4, np.inf]))
    assert s.shape == (2, 1) and not s.any()


def test_an_unsupported_element_type_is_refused_with_the_supported_ones():
    m = model([node("Relu", ["x"], ["y"])], [("x", TensorProto.INT8, [3])], [("y", TensorProto.INT8, None)])
    with pytest.raises(OnnxError, match=r"input 'x' has element type INT8, which eggfuse does not run \(inputs of "
                                        r"float32, int32, int64 and bool; float64, float16 and bfloat16 computed in "
                                        r"float32 are supported\)"):
        Model(m).run({"x": np.zeros(3, np.int8)})
