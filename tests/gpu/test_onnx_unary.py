"""ONNX unary math and activation ops through eggfuse.onnx.Model against onnxruntime (the
test-only reference): every op, default and given attributes, opset variants, odd shapes from
rank 0 to rank 5, integer inputs, NaN and infinities; and the refusals (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx_models import I64, F, model, node  # tests/onnx_models.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model, load

I32, BOOL = TensorProto.INT32, TensorProto.BOOL
#: ORT's float kernels (MLAS) approximate exp, tanh, logistic and erf to about 1e-6 relative.
RTOL, ATOL = 1e-5, 1e-6


def ort_run(m, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(m, feeds: dict, rtol: float = RTOL, atol: float = ATOL) -> list[np.ndarray]:
    want = ort_run(m, feeds)
    got = Model(m).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def one_op(op: str, shape, opset: int = 17, elem: int = F, out_elem: int | None = None, **attrs):
    return model([node(op, ["x"], ["y"], **attrs)], [("x", elem, list(shape))], [("y", out_elem or elem, None)],
                 opset=opset)


#: Where each op's inputs are drawn (uniformly); the others draw 2 N(0, 1).
DOMAIN = {"Sqrt": (0.01, 9.0), "Log": (0.01, 9.0), "Asin": (-0.99, 0.99), "Acos": (-0.99, 0.99),
          "Atanh": (-0.99, 0.99), "Acosh": (1.01, 9.0), "Reciprocal": (0.5, 3.0)}

#: (op, opset, attributes): every op, at the opset its current form arrived in or later.
CASES = [
    *[(op, 13, {}) for op in ("Sqrt", "Exp", "Log", "Reciprocal", "Neg", "Abs", "Sigmoid", "Tanh", "Erf", "Floor",
                              "Ceil")],
    *[(op, 9, {}) for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")],
    ("Relu", 14, {}), ("Round", 11, {}), ("Softplus", 7, {}), ("Softsign", 7, {}),
    ("HardSigmoid", 7, {}), ("HardSigmoid", 17, {"alpha": 0.35, "beta": 0.45}),
    ("HardSwish", 14, {}), ("LeakyRelu", 7, {}), ("LeakyRelu", 16, {"alpha": 0.3}),
    ("Elu", 7, {}), ("Elu", 17, {"alpha": 0.4}), ("Selu", 7, {}), ("Selu", 17, {"alpha": 1.5, "gamma": 2.5}),
    ("Celu", 12, {}), ("Celu", 17, {"alpha": 0.7}), ("ThresholdedRelu", 10, {}),
    ("ThresholdedRelu", 17, {"alpha": -0.3}), ("Mish", 18, {}), ("Shrink", 9, {}),
    ("Shrink", 17, {"bias": 0.25, "lambd": 1.2}), ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}),
]


def _feed(op: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if op in DOMAIN:
        return np.asarray(rng.uniform(*DOMAIN[op], size=shape), dtype=np.float32)
    return np.asarray(2.0 * rng.standard_normal(shape), dtype=np.float32)


@pytest.mark.parametrize("op,opset,attrs", CASES, ids=[f"{c[0]}-opset{c[1]}{''.join(f'-{k}' for k in c[2])}"
                                                        for c in CASES])
def test_op_matches_onnxruntime(op, opset, attrs):
    shape = (3, 5, 7)
    check(one_op(op, shape, opset, **attrs), {"x": _feed(op, shape)})


@pytest.mark.parametrize("shape", [(), (1,), (2, 3, 1, 4, 5)], ids=["rank0", "rank1", "rank5"])
def test_a_chain_of_unary_ops_at_odd_ranks(shape):
    nodes = [node("Abs", ["x"], ["a"]), node("Sqrt", ["a"], ["b"]), node("Sin", ["b"], ["c"]),
             node("LeakyRelu", ["c"], ["d"], alpha=0.2), node("Elu", ["d"], ["e"], alpha=0.5),
             node("Atan", ["e"], ["f"]), node("Mish", ["f"], ["g"]), node("Softsign", ["g"], ["h"]),
             node("HardSigmoid", ["h"], ["y"], alpha=0.3, beta=0.4), node("Tanh", ["c"], ["z"])]
    m = model(nodes, [("x", F, list(shape))], [("y", F, None), ("z", F, None), ("c", F, None)], opset=18)
    check(m, {"x": _feed("", shape, seed=5)})


def test_swish_at_opset_24_and_its_alpha_one_form_is_silu():
    x = _feed("", (4, 9))
    for alpha in (1.0, 0.6):
        m = one_op("Swish", x.shape, 24, alpha=alpha)
        want = x * (1.0 / (1.0 + np.exp(-alpha * x.astype(np.float64))))
        np.testing.assert_allclose(Model(m).run({"x": x})[0], want, rtol=RTOL, atol=ATOL)
        g, _ = load(m)
        assert g.node(g.outputs[0]).op == ("Silu" if alpha == 1.0 else "Swish")


def test_reciprocal_and_gelu_map_to_the_ir_ops_the_rules_know():
    for op, attrs, ir in (("Reciprocal", {}, "Recip"), ("Gelu", {}, "Gelu"), ("Gelu", {"approximate": "tanh"},
                                                                               "GeluTanh")):
        g, _ = load(one_op(op, [3], 20, **attrs))
        assert g.node(g.outputs[0]).op == ir


@pytest.mark.parametrize("elem", [I64, I32], ids=["int64", "int32"])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Relu"])
def test_integer_forms_keep_the_element_type(op, elem):
    dtype = np.int64 if elem == I64 else np.int32
    x = np.array([[-7, -1, 0], [1, 5, 2**31 - 1], [-2**31 + 1, 3, -3]], dtype=dtype)
    m = one_op(op, x.shape, 14, elem=elem)
    if op == "Relu" and elem == I64:  # onnxruntime has no int64 Relu: numpy's, as ONNX defines it
        got = Model(m).run({"x": x})[0]
        assert got.dtype == np.int64 and np.array_equal(got, np.maximum(x, 0))
    else:
        check(m, {"x": x})


def test_isnan_and_isinf_take_nan_and_infinity_feeds():
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -1.5], [3.0, -np.inf, np.nan, 1e38, -0.0]], dtype=np.float32)
    check(one_op("IsNaN", x.shape, 13, out_elem=BOOL), {"x": x})
    for neg, pos in ((1, 1), (0, 1), (1, 0)):
        check(one_op("IsInf", x.shape, 10, out_elem=BOOL, detect_negative=neg, detect_positive=pos), {"x": x})
    # the math functions give IEEE 754's results for them (onnxruntime's as well)
    for op in ("Sqrt", "Log", "Exp", "Tanh", "Atan"):
        check(one_op(op, x.shape, 13), {"x": x})


def test_refusals_name_the_node_and_the_reason():
    with pytest.raises(OnnxError, match=r"Gelu node .*approximate='fast' is not defined"):
        load(one_op("Gelu", [3], 20, approximate="fast"))
    with pytest.raises(OnnxError, match=r"LeakyRelu node .*attribute 'beta' is not one of LeakyRelu's at opset 16"):
        load(one_op("LeakyRelu", [3], 16, alpha=0.1, beta=0.2))
    with pytest.raises(OnnxError, match=r"Celu node .*alpha = 0 is not defined"):
        load(one_op("Celu", [3], 12, alpha=0.0))
    with pytest.raises(OnnxError, match=r"Sqrt node .*element type INT64; eggfuse runs Sqrt on float32 tensors"):
        load(one_op("Sqrt", [3], 13, elem=I64))
    with pytest.raises(OnnxError, match=r"Shrink node .*element type INT32; eggfuse runs Shrink on float32"):
        load(one_op("Shrink", [3], 9, elem=I32))


#: Activations whose WGSL was written with max, min or clamp, which WGSL lets drop a NaN operand.
NAN_CASES = [("Relu", 14, {}), ("HardSigmoid", 7, {}), ("HardSigmoid", 17, {"alpha": 0.35, "beta": 0.45}),
             ("Celu", 12, {}), ("HardSwish", 14, {}), ("Softplus", 7, {}), ("Clip", 6, {"min": -0.5, "max": 0.5})]


@pytest.mark.parametrize("op, opset, attrs", NAN_CASES, ids=[f"{c[0]}-{c[1]}" for c in NAN_CASES])
def test_activations_keep_nan(op, opset, attrs):
    # NaN in, NaN out, as onnxruntime and numpy's maximum and clip give (Relu, HardSigmoid and Celu gave 0)
    x = np.array([[np.nan, 1.0, -2.0, 3.0], [0.25, np.nan, -0.75, np.inf]], dtype=np.float32)
    got = check(one_op(op, x.shape, opset, **attrs), {"x": x})[0]
    assert np.isnan(got[0, 0]) and np.isnan(got[1, 1])


def test_relu_fused_into_matmul_keeps_nan():
    # a NaN row of A makes its row of C NaN, through the matmul's Relu epilogue too
    x = np.array([[np.nan, 1, -2, 3], [1, 2, 3, 4], [-1, 0.5, 2, -3]], dtype=np.float32)
    w = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    m = model([node("MatMul", ["x", "w"], ["t"]), node("Relu", ["t"], ["y"])], [("x", F, [3, 4])], [("y", F, None)],
              [("w", w)], opset=14)
    got = check(m, {"x": x})[0]
    assert np.isnan(got[0]).all() and not np.isnan(got[1:]).any()
