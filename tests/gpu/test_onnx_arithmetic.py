"""The ONNX converters of the broadcasting elementwise ops (eggfuse/onnx/ops/arithmetic.py):
small models built with onnx.helper, run by eggfuse.onnx.Model on the GPU against onnxruntime
(onnx's reference evaluator for BitShift on signed types, which onnxruntime lacks): chains of
several ops, odd and broadcast shapes up to rank 6, int64 / int32 / bool values, opset
variants, and the refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_models import I64, B, F, model, node  # tests/onnx_models.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model

I32 = TensorProto.INT32
_RNG = np.random.default_rng(11)


def _run_both(m, feeds, device, reference: str = "onnxruntime"):
    got = Model(m, device=device).run(feeds)
    if reference == "onnxruntime":
        want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    else:
        want = ReferenceEvaluator(m).run(None, feeds)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
    return got


def _n(op: str, inputs: str, output: str, **attrs):
    return node(op, inputs.split(), [output], **attrs)


def _f(*shape, scale=1.0):
    return (scale * _RNG.standard_normal(shape)).astype(np.float32)


def test_a_float_chain_of_arithmetic_comparison_and_selection(device):
    nodes = [_n("Sub", "x y", "d"), _n("Div", "d z", "q"), _n("Pow", "q two", "p"),
             _n("Max", "p y z", "mx"), _n("Min", "mx x", "mn"), _n("Mean", "mn y p", "me"),
             _n("Sum", "me x", "s"), _n("Greater", "s y", "gt"), _n("LessOrEqual", "s x", "le"),
             _n("Xor", "gt le", "xo"), _n("Not", "xo", "nx"), _n("Where", "nx s d", "w"),
             _n("PRelu", "w slope", "pr"), _n("Sign", "pr", "sg"), _n("Mod", "pr z", "md", fmod=1),
             _n("Clip", "md lo hi", "c"), _n("Cast", "gt", "gf", to=F), _n("Mul", "c gf", "out")]
    m = model(nodes, [("x", F, [2, 3, 5]), ("y", F, [5]), ("z", F, [3, 1])],
              [("out", F, None), ("sg", F, None), ("nx", B, None)],
              [("two", np.array(2.0, np.float32)), ("slope", np.array([0.1, -0.2, 0.3, 0.5, 2.0], np.float32)),
               ("lo", np.array(-0.5, np.float32)), ("hi", np.array(0.75, np.float32))])
    z = np.where(np.abs(zz := _f(3, 1)) < 0.2, 0.7, zz).astype(np.float32)
    _run_both(m, {"x": _f(2, 3, 5, scale=2.0), "y": _f(5), "z": z}, device)


def test_an_int64_chain_keeps_int64_and_truncates_division(device):
    nodes = [_n("Add", "a b", "s"), _n("Mul", "s a", "p"), _n("Div", "p b", "q"),
             _n("Mod", "q b", "m0"), _n("Mod", "q b", "m1", fmod=1), _n("Sub", "m0 m1", "d"),
             _n("BitwiseAnd", "d q", "ba"), _n("BitwiseOr", "ba a", "bo"),
             _n("BitwiseXor", "bo b", "bx"), _n("BitwiseNot", "bx", "bn"), _n("Max", "bn q", "mx"),
             _n("Pow", "mx e", "pw"), _n("Equal", "pw q", "eq"), _n("GreaterOrEqual", "pw a", "ge"),
             _n("Or", "eq ge", "or"), _n("Where", "or pw s", "w"), _n("Sign", "w", "sg")]
    m = model(nodes, [("a", I64, [2, 1, 3, 1, 4, 1]), ("b", I64, [1, 5, 4, 3])], [("w", I64, None), ("sg", I64, None)],
              [("e", np.array([2, 3, 0], np.int64))], opset=18)
    b = _RNG.integers(-9, 10, (1, 5, 4, 3))
    _run_both(m, {"a": _RNG.integers(-20, 21, (2, 1, 3, 1, 4, 1)), "b": np.where(b == 0, 3, b)}, device)


def test_int32_and_bool_values_and_casts_between_every_type(device):
    nodes = [_n("Cast", "x", "xi", to=I32), _n("Cast", "x", "xl", to=I64), _n("Cast", "x", "xb", to=B),
             _n("Cast", "xi", "back", to=F), _n("CastLike", "xb k", "bk"), _n("Add", "xi k", "s"),
             _n("Cast", "xl", "l2i", to=I32), _n("And", "xb flag", "an"), _n("Cast", "an", "af", to=F)]
    m = model(nodes, [("x", F, [4, 7]), ("k", I32, [7]), ("flag", B, [4, 1])],
              [("back", F, None), ("bk", I32, None), ("s", I32, None), ("l2i", I32, None), ("af", F, None)])
    x = _f(4, 7, scale=4.0)
    x[0, :3] = 0.0
    _run_both(m, {"x": x, "k": _RNG.integers(-5, 6, 7).astype(np.int32), "flag": np.array([[True], [False], [True],
                                                                                            [True]])}, device)


@pytest.mark.parametrize("opset, bounds", [(10, {"min": -0.5, "max": 0.5}), (10, {"max": 0.25}), (10, {}),
                                           (13, ("lo", "hi")), (13, ("lo", "")), (13, ("", "hi")), (13, ())])
def test_clip_bounds_as_attributes_and_as_optional_inputs(device, opset, bounds):
    inits = [("lo", np.array(-0.3, np.float32)), ("hi", np.array(0.6, np.float32))]
    if opset < 11:
        n, inits = node("Clip", ["x"], ["y"], **bounds), []
    else:
        n = node("Clip", ["x", *bounds], ["y"])
        inits = [(k, v) for k, v in inits if k in bounds]
    m = model([n], [("x", F, [3, 17])], [("y", F, None)], inits, opset=opset)
    _run_both(m, {"x": _f(3, 17)}, device)


def test_clip_bounds_fed_at_run_time_and_on_int64(device):
    m = model([node("Clip", ["x", "lo", "hi"], ["y"]), node("Clip", ["k", "", "kmax"], ["z"])],
              [("x", F, [5, 6]), ("lo", F, []), ("hi", F, []), ("k", I64, [6])], [("y", F, None), ("z", I64, None)],
              [("kmax", np.array(3, np.int64))])
    _run_both(m, {"x": _f(5, 6), "lo": np.array(-0.2, np.float32), "hi": np.array(0.4, np.float32),
                  "k": np.arange(-2, 4, dtype=np.int64) * 2}, device)


def test_pow_with_mixed_operand_types_and_rank_0_values(device):
    m = model([node("Pow", ["x", "n"], ["a"]), node("Pow", ["k", "f"], ["b"]), node("Pow", ["k", "n"], ["c"]),
               node("Mul", ["s", "x"], ["d"])],
              [("x", F, [2, 3]), ("n", I64, [3]), ("k", I64, [2, 3]), ("f", F, []), ("s", F, [])],
              [("a", F, None), ("b", I64, None), ("c", I64, None), ("d", F, None)])
    _run_both(m, {"x": _f(2, 3), "n": np.array([2, 3, -1]), "k": _RNG.integers(1, 5, (2, 3)),
                  "f": np.array(2.0, np.float32), "s": np.array(-1.5, np.float32)}, device)


def test_variadic_ops_of_one_input_and_the_opset_7_comparisons(device):
    m = model([node("Max", ["x"], ["a"]), node("Sum", ["x"], ["b"]), node("Mean", ["x", "y"], ["c"]),
               node("Less", ["x", "y"], ["d"]), node("Equal", ["k", "j"], ["e"])],
              [("x", F, [3, 4]), ("y", F, [3, 4]), ("k", I64, [4]), ("j", I64, [3, 1])],
              [("a", F, None), ("b", F, None), ("c", F, None), ("d", B, None), ("e", B, None)], opset=8)
    _run_both(m, {"x": _f(3, 4), "y": _f(3, 4), "k": np.array([0, 1, 2, 3]), "j": np.array([[1], [2], [5]])}, device)


def test_bitshift_on_signed_types_against_onnx_reference(device):
    m = model([_n("BitShift", "a s", "l", direction="LEFT"), _n("BitShift", "a s", "r", direction="RIGHT")],
              [("a", I32, [2, 4]), ("s", I32, [4])], [("l", I32, None), ("r", I32, None)], opset=28)
    _run_both(m, {"a": np.array([[1, -8, 2**30, -1], [7, -7, 3, 2**31 - 1]], np.int32),
                  "s": np.array([1, 3, 1, 40], np.int32)}, device, reference="onnx")


def _fails(m, feeds, match):
    with pytest.raises(OnnxError, match=match):
        Model(m).run(feeds)


def test_refusals_name_the_node_and_what_to_do():
    x = {"x": _f(2, 3)}
    _fails(model([node("Cast", ["x"], ["y"], to=TensorProto.UINT8, name="c1")], [("x", F, [2, 3])],
                 [("y", TensorProto.UINT8, None)]), x,
           r"Cast node 'c1': a cast to element type UINT8 is not supported")
    _fails(model([node("Mod", ["x", "x"], ["y"], fmod=2, name="m1")], [("x", F, [2, 3])], [("y", F, None)]), x,
           r"Mod node 'm1': attribute fmod=2 is not 0 or 1")
    _fails(model([node("PRelu", ["x", "s"], ["y"], name="p1")], [("x", F, [2, 3]), ("s", F, [4, 2, 3])],
                 [("y", F, None)]), {**x, "s": _f(4, 2, 3)}, r"PRelu node 'p1'.*slope f32\[4,2,3\] must broadcast to x")
    _fails(model([node("Add", ["b", "b"], ["y"], name="a1")], [("b", B, [3])], [("y", B, None)]),
           {"b": np.array([True, False, True])}, r"Add node 'a1'.*dtypes \(bool, bool\) are not supported; Add takes")
    _fails(model([node("Clip", ["x", "lo"], ["y"], name="k1")], [("x", F, []), ("lo", F, [2])], [("y", F, None)]),
           {"x": np.array(1.0, np.float32), "lo": _f(2)}, r"Clip node 'k1': min and max must be scalars")


def test_a_function_of_the_model_expands_into_the_converters(device):
    # a model-local function (expanded by the importer, as the standard functions are) built of these ops
    fn = helper.make_function("local", "ClampedStep", ["a", "b"], ["y"], [
        helper.make_node("Sub", ["a", "b"], ["d"]), helper.make_node("Constant", [], ["z"], value_float=0.0),
        helper.make_node("Greater", ["d", "z"], ["pos"]), helper.make_node("Clip", ["d", "z"], ["c"]),
        helper.make_node("Where", ["pos", "c", "b"], ["y"])], [helper.make_opsetid("", 17)])
    m = model([helper.make_node("ClampedStep", ["x", "w"], ["y"], domain="local")], [("x", F, [4, 5]), ("w", F, [5])],
              [("y", F, None)])
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.functions.append(fn)
    _run_both(m, {"x": _f(4, 5), "w": _f(5)}, device)
