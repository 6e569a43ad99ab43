"""Shape rules of the ops over axes (ir/ops/reduce_axes.py, scans.py, axis_norms.py): output
shapes and dtypes, the inputs and attributes each refuses (GraphError naming the op), the
kernel layout of merged axes, and autodiff's refusal naming the op. No GPU needed."""

from __future__ import annotations

import pytest
from shape_rules import shape_rule_tests  # tests/shape_rules.py

from eggfuse.ir import DType, Graph, GraphError
from eggfuse.ir.autodiff import grad
from eggfuse.ir.ops.reduce_axes import axis_layout

GOOD = [
    ("ReduceSum", [[2, 3, 4]], {"axes": (0, 2), "keepdims": True}, (1, 3, 1)),
    ("ReduceLogSumExp", [[2, 3, 4]], {"axes": (1,), "keepdims": False}, (2, 4)),
    ("ReduceMean", [[2, 3]], {"axes": (0, 1), "keepdims": False}, ()),
    ("InvStdDev", [[2, 3, 4]], {"axes": (1, 2)}, (2, 1, 1)),
    ("CumSum", [[2, 3]], {"axis": 1}, (2, 3)),
    ("TopKValues", [[2, 9, 3]], {"k": 4, "axis": 1}, (2, 4, 3)),
    ("SoftmaxAxis", [[2, 3, 4]], {"axis": 1}, (2, 3, 4)),
    ("Hardmax", [[5]], {"axis": 0}, (5,)),
    ("LpNormalization", [[2, 3]], {"axis": 0, "p": 1}, (2, 3)),
    ("MeanVarianceNormalization", [[2, 3, 4, 5]], {"axes": (0, 2, 3)}, (2, 3, 4, 5)),
    ("BatchNormalization", [[2, 3, 5], [3], [3], [3], [3]], {}, (2, 3, 5)),
    ("LRN", [[2, 5, 3]], {"size": 3}, (2, 5, 3)),
]
BAD = [
    ("ReduceSum", [[2, 3]], {"axes": (2,)}, r"axes \[2\] out of range"),
    ("ReduceSum", [[2, 3]], {"axes": (1, 0)}, r"must be sorted and distinct"),
    ("ArgMax", [[2, 3]], {"axis": 2}, r"axis 2 out of range"),
    ("TopKIndices", [[2, 3]], {"k": 4, "axis": 1}, r"k = 4 must lie in 1\.\.3"),
    ("LpNormalization", [[2, 3]], {"axis": 1, "p": 3}, r"p must be 1 or 2"),
    ("BatchNormalization", [[2, 3], [3], [3], [3], [2]], {}, r"input_var must be \[3\]"),
    ("LRN", [[5]], {"size": 3}, r"must be \[N, C, \.\.\.\]"),
    ("MeanVarianceNormalization", [[2, 3]], {"axes": (0, 0)}, r"sorted and distinct"),
]
test_shape_rule_accepts, test_shape_rule_rejects = shape_rule_tests(GOOD, BAD)


def test_dtypes_of_integer_and_bool_reductions():
    g = Graph()
    i, b = g.input("i", [4, 5], DType.I32), g.input("b", [4, 5], DType.BOOL)
    assert g.node(g.add_node("ReduceProd", (i,), axes=(1,))).type.dtype is DType.I32
    assert g.node(g.add_node("ReduceMin", (b,), axes=(0, 1))).type.dtype is DType.BOOL
    assert g.node(g.add_node("ArgMin", (g.input("f", [4, 5]),), axis=1)).type.dtype is DType.I32
    assert g.node(g.add_node("TopKIndices", (i,), k=2, axis=1)).type.dtype is DType.I32
    assert g.node(g.add_node("ReduceMax", (g.input("s", []),), axes=(), keepdims=False)).type.shape == ()
    for op, x in (("ReduceL2", i), ("ReduceLogSumExp", i), ("ReduceSum", b), ("CumSum", b), ("SoftmaxAxis", i)):
        attrs = {"axis": 1} if op in ("CumSum", "SoftmaxAxis") else {"axes": (1,)}
        with pytest.raises(GraphError, match=op):
            g.add_node(op, (x,), **attrs)


def test_axis_layout_merges_runs_and_drops_size_one_axes():
    lay = axis_layout((2, 3, 1, 4, 5), (1, 2, 3))
    assert lay["keep_dims"] == [1, 1, 2, 5] and lay["keep_st"] == [0, 0, 60, 1]
    assert lay["red_dims"] == [1, 1, 1, 12] and lay["red_st"] == [0, 0, 0, 5]
    assert lay["inner_kept"] == [1]
    lay = axis_layout((), ())
    assert lay["keep_dims"] == [1, 1, 1, 1] and lay["red_dims"] == [1, 1, 1, 1]


def test_autodiff_names_the_op_without_a_gradient():
    g = Graph()
    x = g.parameter("w", [3, 4])
    loss = g.add_node("SumAll", (g.add_node("SoftmaxAxis", (x,), axis=0),))
    with pytest.raises(GraphError, match=r"SoftmaxAxis.*ONNX inference"):
        grad(g, loss)
