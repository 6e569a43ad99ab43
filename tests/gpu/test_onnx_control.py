"""Scan and Loop unrolled at load time (eggfuse/onnx/control.py) against onnxruntime: states and
scan outputs, axes and directions, a Loop's trip count and condition bound from fed inputs, and
the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_models import I64, B, F, model, node  # tests/onnx_models.py
from onnx_ort_check import check_against_ort, plan_ops  # tests/onnx_ort_check.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model, load
from eggfuse.onnx.importer import NeedsValuesError

RNG = np.random.default_rng(5)
vi = helper.make_tensor_value_info


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _scan_body():
    # state s [2]: s + x_t; scan outputs s * x_t and tanh(x_t)
    return helper.make_graph([node("Add", ["s", "x"], ["s2"]), node("Mul", ["s2", "x"], ["y"]),
                              node("Tanh", ["x"], ["z"])], "body",
                             [vi("s", F, [2]), vi("x", F, [2])], [vi("s2", F, [2]), vi("y", F, [2]), vi("z", F, [2])])


@pytest.mark.parametrize("in_axis,in_dir,out_axes,out_dirs", [(0, 0, [0, 0], [0, 0]), (1, 1, [1, 0], [1, 0]),
                                                              (-1, 0, [-1, 1], [0, 1])])
def test_scan_states_and_outputs_over_axes_and_directions(in_axis, in_dir, out_axes, out_dirs, device):
    x_shape = [4, 2] if in_axis == 0 else [2, 4]
    scan = node("Scan", ["s0", "x"], ["s", "y", "z"], body=_scan_body(), num_scan_inputs=1,
                scan_input_axes=[in_axis], scan_input_directions=[in_dir], scan_output_axes=out_axes,
                scan_output_directions=out_dirs)
    m = model([scan], [("s0", F, [2]), ("x", F, x_shape)], [("s", F, None), ("y", F, None), ("z", F, None)], opset=16)
    eg = check_against_ort(m, {"s0": _f(2), "x": _f(*x_shape)}, device=device)
    ops = plan_ops(eg)
    assert ops.count("Add") == 4 and ops.count("Tanh") == 4  # one body per step of the scan axis


def test_loop_with_a_fed_trip_count_and_condition_is_unrolled_per_value(device):
    # y = y + x[i] while i < M and cond; the scan output stacks y after each iteration
    body = helper.make_graph(
        [node("Identity", ["c"], ["c2"]), node("Gather", ["table", "i"], ["row"], axis=0),
         node("Add", ["y", "row"], ["y2"]), node("Identity", ["y2"], ["out"])], "body",
        [vi("i", I64, []), vi("c", B, []), vi("y", F, [3])], [vi("c2", B, []), vi("y2", F, [3]), vi("out", F, [3])])
    loop = node("Loop", ["M", "cond", "y0"], ["y", "ys"], body=body)
    table = _f(6, 3)
    m = model([loop], [("M", I64, []), ("cond", B, []), ("y0", F, [3])], [("y", F, None), ("ys", F, None)],
              [("table", table)], opset=13)
    y0 = _f(3)
    for trip in (1, 4):
        check_against_ort(m, {"M": np.array(trip, np.int64), "cond": np.array(True), "y0": y0}, device=device)
    eg = Model(m, device=device)
    y, ys = eg.run({"M": np.array(4, np.int64), "cond": np.array(True), "y0": y0})
    np.testing.assert_allclose(ys, y0 + np.cumsum(table[:4], axis=0), rtol=1e-5)
    assert ys.shape == (4, 3)


def test_a_loop_whose_condition_depends_on_data_needs_the_data_at_load_time(device):
    # doubling y until its sum reaches 100: the iteration count depends on y0's value
    body = helper.make_graph(
        [node("Add", ["y", "y"], ["y2"]), node("ReduceSum", ["y2"], ["t"], keepdims=0),
         node("Less", ["t", "lim"], ["c2"])], "body",
        [vi("i", I64, []), vi("c", B, []), vi("y", F, [3])], [vi("c2", B, []), vi("y2", F, [3])])
    m = model([node("Loop", ["", "cond", "y0"], ["y"], name="grow", body=body)],
              [("cond", B, []), ("y0", F, [3])], [("y", F, None)], [("lim", np.array(100.0, np.float32))], opset=13)
    with pytest.raises(NeedsValuesError, match=r"Loop node 'grow': its condition after iteration 0 depends on the "
                                               r"graph's inputs 'y0'"):
        load(m, values={"cond": np.array(True)})
    eg = check_against_ort(m, {"cond": np.array(True), "y0": np.ones(3, np.float32)}, device=device)
    check_against_ort(m, {"cond": np.array(True), "y0": np.full(3, 10.0, np.float32)}, device=device)
    assert len(eg.plans) == 1  # eggfuse.onnx.Model binds y0: one plan per value


def test_a_scan_of_opset_8_is_refused_with_what_to_do():
    body = helper.make_graph([node("Add", ["s", "x"], ["s2"])], "body", [vi("s", F, [2]), vi("x", F, [2])],
                             [vi("s2", F, [2])])
    m = model([node("Scan", ["", "s0", "x"], ["s"], name="old", body=body, num_scan_inputs=1)],
              [("s0", F, [1, 2]), ("x", F, [1, 3, 2])], [("s", F, None)], opset=8)
    with pytest.raises(OnnxError, match=r"Scan node 'old': opset 8's Scan .* upgrade the model to opset 9"):
        Model(m).run({"s0": _f(1, 2), "x": _f(1, 3, 2)})


def test_an_if_inside_a_function_body_reads_the_bodys_names(device):
    # the branches read the function's input x and its local 'one' (renamed when the body is expanded)
    then = helper.make_graph([node("Add", ["x", "one"], ["t"])], "then", [], [vi("t", F, [3])])
    other = helper.make_graph([node("Sub", ["x", "one"], ["e"])], "else", [], [vi("e", F, [3])])
    fn = helper.make_function(
        "local", "AddOrSub", ["x", "c"], ["y"],
        [helper.make_node("Constant", [], ["one"], value=helper.make_tensor("v", F, [], [1.5])),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [helper.make_opsetid("", 13)])
    m = model([helper.make_node("AddOrSub", ["x", "c"], ["y"], domain="local")], [("x", F, [3]), ("c", B, [])],
              [("y", F, None)], opset=13)
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("local", 1))
    for c in (True, False):
        check_against_ort(m, {"x": _f(3), "c": np.array(c)}, device=device)


def test_a_branch_inside_a_function_body_takes_the_callers_attributes(device):
    # a node of an If's branch inside a model-local function refers to the function's attribute alpha
    # (ref_attr_name): filled in from the calling node at any depth (it was only in the body's own nodes)
    leaky = helper.make_node("LeakyRelu", ["x"], ["t"])
    leaky.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    then = helper.make_graph([leaky], "then", [], [vi("t", F, [4])])
    other = helper.make_graph([node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [4])])
    fn = helper.make_function("local", "LeakyOrNeg", ["x", "c"], ["y"],
                              [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                              [helper.make_opsetid("", 13)], attributes=["alpha"])
    m = model([helper.make_node("LeakyOrNeg", ["x", "c"], ["y"], domain="local", alpha=0.25)],
              [("x", F, [4]), ("c", B, [])], [("y", F, None)], opset=13)
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("local", 1))
    x = np.array([-2.0, -0.5, 1.0, 3.0], np.float32)
    (got,) = Model(m, cache=False).run({"x": x, "c": np.array(True)})
    np.testing.assert_allclose(got, np.where(x < 0, 0.25 * x, x), rtol=1e-6)
    for c in (True, False):
        check_against_ort(m, {"x": x, "c": np.array(c)}, device=device)


@pytest.mark.parametrize("outer_k", [False, True])
def test_initializers_of_subgraphs_are_their_own_and_hide_the_enclosing_graphs(outer_k, device):
    # a branch's and a body's initializers were ignored: the outer value of the name was taken in their stead, or
    # a valid model was refused ("computed by no earlier node")
    then_g = helper.make_graph([node("Add", ["x", "k"], ["o"])], "then", [], [vi("o", F, [2, 3])],
                               [helper.make_tensor("k", F, [], [100.0])])
    else_g = helper.make_graph([node("Neg", ["x"], ["o2"])], "else", [], [vi("o2", F, [2, 3])])
    body = helper.make_graph([node("Identity", ["c"], ["c2"]), node("Mul", ["s", "k"], ["s2"])], "body",
                             [vi("i", I64, []), vi("c", B, []), vi("s", F, [2, 3])],
                             [vi("c2", B, []), vi("s2", F, [2, 3])], [helper.make_tensor("k", F, [3], [2.0, 3.0, 4.0])])
    nodes = [node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             node("Loop", ["M", "", "x"], ["z"], body=body)]
    outs = [("y", F, None), ("z", F, None)]
    inits = [("M", np.array(2, np.int64))]
    if outer_k:  # the graph's own k, read by the graph too
        nodes.append(node("Sub", ["x", "k"], ["w"]))
        outs.append(("w", F, None))
        inits.append(("k", np.array(1.0, np.float32)))
    m = model(nodes, [("x", F, [2, 3]), ("c", B, [])], outs, inits, opset=17)
    x = _f(2, 3)
    ys = check_against_ort(m, {"x": x, "c": np.array(True)}, device=device).run({"x": x, "c": np.array(True)})
    np.testing.assert_allclose(ys[0], x + 100.0, rtol=1e-6)
    np.testing.assert_allclose(ys[1], x * np.array([4.0, 9.0, 16.0], np.float32), rtol=1e-6)
