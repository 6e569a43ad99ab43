"""Recognition of fused ops in exported chains (ir/ops/recognize.py, recognize_norms.py), on
the numpy reference: the ``scalar`` facts rules read constants by, which chains become which
op, the shapes and operand orders that must not be recognised, and the e-graph's size."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.rewrites import make_ruleset, optimize
from eggfuse.rewrites.engine import random_feeds


def _times_one(e):
    x, c = e.vars("x c")
    # Mul(x, c) -> Neg(Neg(x)) when c is the scalar constant 1 (a rule reading a scalar fact)
    yield e.equal("Mul(x, 1) -> Neg(Neg(x)) (test)", e.Mul(x, c), e.Neg(e.Neg(x)), e.eq(e.scalar(c)).to(e.f64(1.0)))


@pytest.mark.parametrize("leaf,fires", [("constant []", True), ("constant [1, 1]", True), ("constant of 2", False),
                                        ("constant 2.0", False), ("parameter", False)])
def test_a_one_element_constant_has_a_scalar_fact(leaf, fires):
    g = Graph()
    x = g.input("x", [3, 2])
    c = {"constant []": lambda: g.constant(np.float32(1.0), shape=()),
         "constant [1, 1]": lambda: g.constant(np.ones((1, 1), np.float32), shape=(1, 1)),
         "constant of 2": lambda: g.constant(np.ones(2, np.float32), shape=(2,)),
         "constant 2.0": lambda: g.constant(np.float32(2.0), shape=()),
         "parameter": lambda: g.parameter("c", [1])}[leaf]()
    g.set_outputs([g.mul(x, c)])
    _, rep = optimize(g, rulesets=[make_ruleset("scalar_for_test", _times_one)])
    assert bool(rep.rules_fired.get("Mul(x, 1) -> Neg(Neg(x)) (test)")) is fires


def test_scalar_value_of_f32_and_i32_constants_only():
    from eggfuse.rewrites.encode import scalar_value

    g = Graph()
    nodes = [g.constant(np.float32(1e-12), shape=()), g.constant(np.int32(3), shape=(1,), dtype=DType.I32),
             g.constant(np.ones(3, np.float32)), g.constant(np.float32(np.inf), shape=()), g.input("x", [1])]
    assert [scalar_value(g.node(n)) for n in nodes] == [float(np.float32(1e-12)), 3.0, None, None, None]


def _close(a: Graph, b: Graph) -> None:
    inputs, params = random_feeds(a, 0)
    for x, y in zip(evaluate(a, inputs, params), evaluate(b, inputs, params), strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-9, atol=1e-12)
