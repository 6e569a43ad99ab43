"""The shape-rule tests of an op table, shared by tests/unit/test_ops_backward.py and
tests/unit/test_ops_extra.py (on pytest's pythonpath, like bert_numpy.py)."""

import pytest

from eggfuse.ir import DType, Graph, GraphError


def leaves(g: Graph, shapes) -> list[int]:
    """One input per shape; a shape with a leading "u" is a u32 input, else f32."""
    ids = []
    for i, s in enumerate(shapes):
        if s[0] == "u":
            ids.append(g.input(f"in{i}", s[1:], DType.U32))
        else:
            ids.append(g.input(f"in{i}", s))
    return ids


def shape_rule_tests(good: list, bad: list):
    """The two parametrized tests of a table, bind them to module-level names for pytest:
    each good row (op, input shapes, attrs, output shape) builds an f32 node of that shape;
    each bad row (op, input shapes, attrs, message regex) raises GraphError naming the op."""

    @pytest.mark.parametrize("op,shapes,attrs,out", good, ids=[r[0] for r in good])
    def test_shape_rule_accepts(op, shapes, attrs, out):
        g = Graph()
        node = g.node(g.add_node(op, leaves(g, shapes), **attrs))
        assert node.type.shape == out and node.type.dtype is DType.F32

    @pytest.mark.parametrize("op,shapes,attrs,match", bad, ids=[f"{r[0]}-{r[3]}" for r in bad])
    def test_shape_rule_rejects(op, shapes, attrs, match):
        g = Graph()
        with pytest.raises(GraphError, match=match) as e:
            g.add_node(op, leaves(g, shapes), **attrs)
        assert op in str(e.value)

    return test_shape_rule_accepts, test_shape_rule_rejects
