"""The recognition of RoBERTa's position ids (ir/ops/scans.py _padded_position_ids): the exporters'
Add(Mul(CumSum(m), m), pad) with m = Cast(Not(Equal(ids, pad)), i32) becomes one PaddedPositionIds
only where that is the same function (one pad, an inclusive forward scan, the ids' shape), and the
optimised graph computes what the imported one does (numpy reference); the int_value fact it reads."""

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, TensorType, evaluate
from eggfuse.ir.facts import facts_of
from eggfuse.rewrites import optimize


def _chain(shape, axis=1, pad=1, pad2=None, exclusive=False, reverse=False, const_shape=()):
    g = Graph()
    ids = g.input("ids", shape, DType.I32)

    def const(v):
        return g.constant(np.full(const_shape, v, dtype=np.int32), shape=const_shape, dtype=DType.I32)

    m = g.add_node("Cast", (g.add_node("Not", (g.add_node("Equal", (ids, const(pad))),)),), to="i32")
    scan = g.add_node("CumSum", (m,), axis=axis, exclusive=exclusive, reverse=reverse)
    g.set_outputs([g.add_node("Add", (g.add_node("Mul", (scan, m)), const(pad if pad2 is None else pad2)))])
    return g


def _recognised(g: Graph) -> tuple[int, Graph]:
    opt, _ = optimize(g)
    return sum(n.op == "PaddedPositionIds" for n in opt.live_nodes()), opt


@pytest.mark.parametrize("shape,axis,const_shape",
                         [([3, 7], 1, ()), ([7, 3], 0, ()), ([7], 0, [1]), ([2, 5], 1, [1, 1])])
def test_the_chain_is_one_op_computing_the_same_ids(shape, axis, const_shape):
    g = _chain(shape, axis, pad=1, const_shape=const_shape)
    found, opt = _recognised(g)
    assert found == 1
    ids = np.random.default_rng(0).integers(-1, 4, shape).astype(np.int32)
    np.testing.assert_array_equal(evaluate(opt, {"ids": ids}, {})[0], evaluate(g, {"ids": ids}, {})[0])


@pytest.mark.parametrize("kw", [dict(pad=1, pad2=2), dict(exclusive=True), dict(reverse=True),
                                dict(const_shape=[1, 1])], ids=["two pads", "exclusive", "reverse", "broadcast"])
def test_a_chain_that_is_another_function_is_left_alone(kw):
    # two different pad constants; an exclusive or reverse scan; [1, 1] constants that make a [7] chain [1, 7]
    shape = [7] if kw.get("const_shape") else [3, 7]
    g = _chain(shape, axis=0 if kw.get("const_shape") else 1, **kw)
    found, opt = _recognised(g)
    assert found == 0
    ids = np.random.default_rng(1).integers(-1, 4, shape).astype(np.int32)
    np.testing.assert_array_equal(evaluate(opt, {"ids": ids}, {})[0], evaluate(g, {"ids": ids}, {})[0])


def test_int_value_holds_of_one_element_i32_constants_only():
    def fact(value, dtype):
        return {f.name: args for f, args in facts_of(value, TensorType(value.shape, dtype))}.get("int_value")

    assert fact(np.array([[-7]], np.int32), DType.I32) == (-7,)
    assert fact(np.array(1, np.int32), DType.I32) == (1,)
    assert fact(np.array([1, 1], np.int32), DType.I32) is None
    assert fact(np.array(1.0, np.float32), DType.F32) is None
    assert fact(np.array(True), DType.BOOL) is None
