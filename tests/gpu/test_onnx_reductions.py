"""ONNX reductions, arg-reductions, scans and TopK (eggfuse/onnx/ops/reductions.py) through
eggfuse.onnx.Model on the GPU, against onnxruntime (onnx's reference evaluator for CumProd,
which onnxruntime lacks): opset variants (axes as attribute and as input), keepdims,
noop_with_empty_axes, negative axes, odd shapes, int32 / int64 / bool inputs, ties; and the
converters' refusals, each naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import I64, B, F, model, node  # tests/onnx_models.py
from onnx_vs_ort import I32, check, feed  # tests/onnx_vs_ort.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model, load
from eggfuse.onnx.importer import NeedsValuesError

_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceSumSquare"]
_AXES = [((1,), 1), ((0, 2), 0), ((-1,), 1), ((-3, -1), 0), (None, 1), (None, 0)]


def _reduce_model(op: str, shape, axes, keepdims: int, opset: int, elem: int = F, **attrs):
    as_input = opset >= (13 if op == "ReduceSum" else 18)
    inits, ins = [], ["x"]
    if axes is not None and as_input:
        inits, ins = [("axes", np.array(axes, dtype=np.int64))], ["x", "axes"]
    elif axes is not None:
        attrs["axes"] = list(axes)
    return model([node(op, ins, ["y"], keepdims=keepdims, **attrs)], [("x", elem, shape)], [("y", elem, None)],
                 inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("op", _REDUCE)
def test_reductions_over_axes_as_attribute_and_input(op, opset):
    for axes, keepdims in _AXES:
        x = feed(F, [3, 5, 7])
        if op in ("ReduceLogSum",):
            x = np.abs(x) + 0.1  # the log of a positive sum
        if op == "ReduceProd":
            x = (1.0 + 0.1 * x).astype(np.float32)
        check(_reduce_model(op, [3, 5, 7], axes, keepdims, opset), {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceSumSquare"])
@pytest.mark.parametrize("elem", [I32, I64])
def test_integer_reductions(op, elem):
    for axes, keepdims in ((1,), 1), ((0, 2), 0), (None, 0):
        check(_reduce_model(op, [3, 4, 5], axes, keepdims, 18, elem), {"x": feed(elem, [3, 4, 5])})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_bool_reductions(op):
    # onnxruntime has no bool ReduceMax / ReduceMin: onnx's reference evaluator
    for axes, keepdims in ((1,), 1), ((0, 2), 0), (None, 1):
        check(_reduce_model(op, [3, 4, 5], axes, keepdims, 20, B), {"x": feed(B, [3, 4, 5])}, reference="onnx")


def test_noop_with_empty_axes_and_rank_zero_results():
    x = feed(F, [2, 3])
    (y,) = check(_reduce_model("ReduceSum", [2, 3], None, 1, 18, noop_with_empty_axes=1), {"x": x})
    np.testing.assert_array_equal(y, x)
    (y,) = check(_reduce_model("ReduceMean", [2, 3], None, 0, 18), {"x": x})
    assert y.shape == ()


@pytest.mark.parametrize("op", _REDUCE)
def test_noop_with_empty_axes_keeps_each_reductions_elementwise_part(op):
    # a reduction over no axes: ReduceSumSquare squares, ReduceL1 / ReduceL2 take |x|, ReduceLogSum the log
    x = np.array([[-2.0, 0.5, 3.0], [1.5, -0.25, 4.0]], np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x)
    for axes in (None, ()):  # no axes input, and an empty one
        (y,) = check(_reduce_model(op, [2, 3], axes, 1, 18, noop_with_empty_axes=1), {"x": x})
        assert y.shape == x.shape


def test_axes_fed_as_an_input_are_bound_at_load_time():
    m = model([node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)], [("x", F, [4, 6]), ("axes", I64, [1])],
              [("y", F, None)], opset=18)
    eg = Model(m)
    x = feed(F, [4, 6])
    for axes in ([0], [1], [-1]):
        (y,) = eg.run({"x": x, "axes": np.array(axes)})
        np.testing.assert_allclose(y, x.max(axis=axes[0]))
    assert len(eg.plans) == 3  # a plan per value of axes


def test_an_empty_axes_input_is_bound_at_load_time_and_empty_data_too():
    m = model([node("ReduceSum", ["x", "axes"], ["y"])], [("x", F, [2, 3]), ("axes", I64, [0])], [("y", F, None)],
              opset=18)
    with pytest.raises(NeedsValuesError, match=r"input 'axes' has shape \[0\]: an empty tensor cannot be fed"):
        load(m)
    x = feed(F, [2, 3])
    (y,) = Model(m).run({"x": x, "axes": np.zeros(0, dtype=np.int64)})
    np.testing.assert_allclose(y, x.sum(keepdims=True), rtol=1e-6)
    # empty data has no contents: bound at load time, the sum over it folds (0 where nothing is summed)
    empty = model([node("ReduceSum", ["x"], ["y"])], [("x", F, [2, 0])], [("y", F, None)], opset=18)
    with pytest.raises(NeedsValuesError, match=r"input 'x' has shape \[2, 0\]: an empty tensor cannot be fed"):
        load(empty)
    (y,) = Model(empty).run({"x": np.zeros((2, 0), np.float32)})
    assert y.shape == (1, 1) and y[0, 0] == 0.0


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions(op):
    for elem in (F, I32, I64):
        for axis, keepdims, last in ((0, 1, 0), (1, 0, 1), (-1, 1, 1), (2, 0, 0)):
            m = model([node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
                      [("x", elem, [3, 70, 5])], [("y", I64, None)], opset=13)
            check(m, {"x": feed(elem, [3, 70, 5])})  # int inputs in [-4, 4]: many ties


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_scans(op):
    reference = "ort" if op == "CumSum" else "onnx"
    opset = 14 if op == "CumSum" else 26
    for elem in (F, I32, I64):
        for axis, exclusive, reverse in ((0, 0, 0), (1, 1, 0), (-1, 0, 1), (2, 1, 1), (1, 0, 0)):
            m = model([node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                      [("x", elem, [3, 300, 4])], [("y", elem, None)], [("axis", np.array(axis, dtype=np.int64))],
                      opset=opset)
            x = feed(elem, [3, 300, 4])
            if op == "CumProd":
                x = (1.0 + 0.01 * x).astype(np.float32) if elem == F else np.clip(x, -1, 2).astype(x.dtype)
            # a float sum along the 300-long axis is added in another order than onnxruntime's: partial sums of
            # N(0, 1) terms (up to about 40 in size) differ by rounding, about 1e-5 where they cross zero (1.8e-5
            # was seen); a term left out or added twice would differ by about 1
            check(m, {"x": x}, reference=reference, rtol=1e-4 if op == "CumSum" else 3e-4,
                  atol=1e-4 if op == "CumSum" else 1e-5)


def test_top_k_opsets_and_outputs():
    x = np.round(feed(F, [4, 9, 3]) * 2) / 2  # halves: ties
    for opset, axis, k, largest in ((11, -1, 2, 1), (11, 1, 9, 0), (11, 0, 3, 1), (10, 1, 4, None), (9, 1, 5, None)):
        attrs = {"axis": axis} | ({"largest": largest} if largest is not None else {})
        if opset < 10:  # TopK-1: k an attribute
            m = model([node("TopK", ["x"], ["v", "i"], k=k, **attrs)], [("x", F, [4, 9, 3])],
                      [("v", F, None), ("i", I64, None)], opset=opset)
        else:
            m = model([node("TopK", ["x", "k"], ["v", "i"], **attrs)], [("x", F, [4, 9, 3])],
                      [("v", F, None), ("i", I64, None)], [("k", np.array([k], dtype=np.int64))], opset=opset)
        check(m, {"x": x})
    # only the indices read, of an int64 input: the values' op is dead code
    m = model([node("TopK", ["x", "k"], ["v", "i"], axis=1)], [("x", I64, [4, 9])], [("i", I64, None)],
              [("k", np.array([3], dtype=np.int64))], opset=11)
    g, _ = load(m)
    assert [n.op for n in g.live_nodes() if n.op.startswith("TopK")] == ["TopKIndices"]
    check(m, {"x": feed(I64, [4, 9])})


def test_a_chain_of_reductions_scans_and_top_k():
    # ReduceMean over axis 2 -> CumSum over axis 1 -> TopK along axis 1 -> ArgMax of the values
    nodes = [node("ReduceMean", ["x"], ["m"], axes=[2], keepdims=0),
             node("CumSum", ["m", "ax"], ["c"], reverse=1),
             node("TopK", ["c", "k"], ["v", "i"], axis=1),
             node("ArgMin", ["v"], ["a"], axis=0, keepdims=0),
             node("ReduceLogSumExp", ["v"], ["l"], axes=[0, 1], keepdims=1)]
    m = model(nodes, [("x", F, [5, 11, 7])], [("v", F, None), ("i", I64, None), ("a", I64, None), ("l", F, None)],
              [("ax", np.array(1, dtype=np.int64)), ("k", np.array([4], dtype=np.int64))], opset=17)
    check(m, {"x": feed(F, [5, 11, 7])})


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "inputs", "inits", "opset", "message"), [
    ([node("ReduceL2", ["x"], ["y"], name="r")], [("x", I32, [3, 4])], [], 13,
     r"ReduceL2 node 'r': its input 'x' is INT32; eggfuse runs this op on FLOAT"),
    ([node("ReduceSum", ["x"], ["y"], name="r", axes=[0, -2])], [("x", F, [3, 4])], [], 11,
     r"ReduceSum node 'r': axes \[0, -2\] name an axis twice"),
    ([node("ReduceMax", ["x"], ["y"], name="r", axes=[2])], [("x", F, [3, 4])], [], 11,
     r"ReduceMax node 'r': axis 2 is out of range for an input of rank 2"),
    ([node("ReduceSum", ["x"], ["y"], name="r", keepdims=1, select_last_index=1)], [("x", F, [3, 4])], [], 11,
     r"ReduceSum node 'r': attribute 'select_last_index' is not one of ReduceSum's at opset 11 \(its attributes: "
     r"axes, keepdims\)"),
    ([node("TopK", ["x", "k"], ["v", "i"], name="t")], [("x", F, [3, 4])], [("k", np.array([5]))], 11,
     r"TopK node 't': k = 5 must lie in 1\.\.4"),
    ([node("CumSum", ["x", "a"], ["y"], name="c")], [("x", F, [3, 4])], [("a", np.array([0, 1]))], 14,
     r"CumSum node 'c': axis must hold one value"),
    ([node("ArgMax", ["x"], ["y"], name="a")], [("x", B, [3, 4])], [], 13,
     r"ArgMax node 'a': its input 'x' is BOOL"),
])
def test_refusals_name_the_node(nodes, inputs, inits, opset, message):
    m = model(nodes, inputs, [("y" if nodes[0].output[0] == "y" else "v", F, None)], inits, opset=opset)
    with pytest.raises(OnnxError, match=message):
        load(m)
