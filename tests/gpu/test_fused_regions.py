"""Graphs of unfused elementwise ops compiled with the rewrite engine (generated elementwise
kernels, ir/ops/fused.py) and run on the device, against the numpy reference of the unfused
graph: chains, a value read twice, an intermediate that is also a graph output, one a norm
also reads, one two regions read, broadcasts of [1,N], [M,1], a scalar and rank 4 with size-1
axes, a comparison feeding Where, a region through a reshape view (and a view that is a graph
output, or of a broadcasting op, where it stops); with the dispatches before and after. And ONNX graphs
(onnx.helper) of an erf GELU after a matmul and a decomposed LayerNorm, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import F, model, node  # tests/onnx_models.py
from onnx_vs_ort import check  # tests/onnx_vs_ort.py

from eggfuse.ir import Graph, evaluate
from eggfuse.onnx import Model
from eggfuse.pipeline import compile as compile_graph
from eggfuse.rewrites import random_feeds


def _chain(g):
    x, b = g.input("x", [37, 29]), g.input("b", [1, 29])
    return [g.mul(g.add_node("Erf", (g.add(x, b),)), g.constant(0.5))]


def _diamond(g):
    h = g.matmul(g.input("x", [13, 6]), g.parameter("w", [6, 17]))
    # GELU-shaped, but 1.5 where GELU has sqrt 2: the recognition rules leave it a chain
    e = g.add_node("Erf", (g.add_node("Div", (h, g.constant(1.5))),))
    return [g.mul(g.mul(h, g.add(e, g.constant(1.0))), g.constant(0.5))]


def _output_too(g):
    x, y = g.input("x", [9, 31]), g.input("y", [9, 31])
    t = g.add_node("Sub", (x, y))
    return [g.neg(g.add_node("Exp", (t,))), t]


def _norm_reads(g):
    x, a, b = g.input("x", [7, 24]), g.input("a", [7, 24]), g.input("b", [1, 24])
    h = g.add(x, a)
    return [g.relu(g.add(h, g.mul(g.rms_norm(h, g.parameter("w", [24])), b)))]


def _two_regions(g):
    x, y = g.input("x", [5, 33]), g.input("y", [5, 1])
    t = g.add(x, y)
    return [g.neg(t), g.add_node("Tanh", (t,))]


def _outer(g):
    a, b, s = g.input("a", [21, 1]), g.input("b", [1, 19]), g.input("s", [])
    return [g.add_node("Sigmoid", (g.mul(g.add_node("Sub", (a, b)), s),))]


def _rank4(g):
    a, b = g.input("a", [2, 1, 3, 5]), g.input("b", [1, 4, 1, 5])
    c = g.input("c", [2, 4, 3, 1])
    return [g.add_node("Max", (g.mul(a, b), c))]


def _where(g):
    x, y = g.input("x", [11, 7]), g.input("y", [1, 7])
    mask = g.add_node("Less", (x, y))
    picked = g.add_node("Where", (mask, g.add_node("Cast", (g.add_node("Cast", (x,), to="i32"),), to="f32"), y))
    return [g.add(picked, g.add_node("Cast", (g.add_node("Not", (mask,)),), to="f32"))]


def _through_view(g):
    # Sub and Exp, a reshape view, then Mul with a broadcast operand of the new shape: one region
    x, y, c = g.input("x", [6, 35]), g.input("y", [6, 35]), g.input("c", [1, 7])
    t = g.reshape(g.add_node("Exp", (g.add_node("Sub", (x, y)),)), [30, 7])
    return [g.neg(g.mul(t, c))]


def _view_also_output(g):
    # the view is a graph output, so it is stored and the region ends there
    x, y = g.input("x", [5, 12]), g.input("y", [5, 12])
    t = g.reshape(g.add(x, y), [3, 20])
    return [g.add_node("Tanh", (t,)), t]


def _view_of_broadcast(g):
    # Add broadcasts [1, 12] over [5, 12]: its view [3, 20] is not the op of its operands' views
    x, b = g.input("x", [5, 12]), g.input("b", [1, 12])
    return [g.add_node("Tanh", (g.reshape(g.add(x, b), [3, 20]),))]


CASES = {  # name: (builder, dispatches unfused, fused; the diamond's region joins the matmul's store)
    "chain": (_chain, 3, 1), "diamond": (_diamond, 6, 1), "output-too": (_output_too, 3, 2),
    "norm-reads": (_norm_reads, 5, 3), "two-regions": (_two_regions, 3, 2), "outer-and-scalar": (_outer, 3, 1),
    "rank4": (_rank4, 2, 1), "where": (_where, 7, 1), "through-a-view": (_through_view, 4, 1),
    "view-also-output": (_view_also_output, 2, 2), "view-of-a-broadcast": (_view_of_broadcast, 2, 2),
}


@pytest.mark.parametrize("name", CASES)
def test_fused_graph_matches_the_unfused_reference(name, device):
    build, before, after = CASES[name]
    g = Graph()
    g.set_outputs(build(g))
    inputs, params = random_feeds(g, seed=3)
    compiled = compile_graph(g, params, device=device, cache=False)
    assert (compiled.dispatches_unfused, compiled.dispatches_fused) == (before, after)
    assert len(compiled.plan.dispatches) == after
    got = compiled.run(inputs)
    want = evaluate(g, inputs, params)
    for o, w in zip(got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5)


def _gelu(m=9, k=12, n=20, layer_norm=False):
    rng = np.random.default_rng(0)
    inits = [("W", rng.standard_normal((k, n)).astype(np.float32)), ("b", rng.standard_normal(n).astype(np.float32)),
             ("sqrt2", np.array(1.4142135, np.float32)), ("one", np.array(1.0, np.float32)),
             ("half", np.array(0.5, np.float32))]
    nodes = [node("MatMul", ["x", "W"], ["mm"]), node("Add", ["mm", "b"], ["h"]),
             node("Div", ["h", "sqrt2"], ["d"]), node("Erf", ["d"], ["e"]), node("Add", ["e", "one"], ["e1"]),
             node("Mul", ["h", "e1"], ["m"]), node("Mul", ["m", "half"], ["y" if not layer_norm else "gelu"])]
    if layer_norm:  # as torch.onnx.export's classic exporter spells LayerNorm
        inits += [("two", np.array(2.0, np.float32)), ("eps", np.array(1e-5, np.float32)),
                  ("g", rng.standard_normal(n).astype(np.float32)), ("beta", rng.standard_normal(n).astype(np.float32))]
        nodes += [node("ReduceMean", ["gelu"], ["mu"], axes=[-1]), node("Sub", ["gelu", "mu"], ["c"]),
                  node("Pow", ["c", "two"], ["sq"]), node("ReduceMean", ["sq"], ["var"], axes=[-1]),
                  node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]), node("Div", ["c", "sd"], ["nrm"]),
                  node("Mul", ["nrm", "g"], ["ng"]), node("Add", ["ng", "beta"], ["y"])]
    return model(nodes, [("x", F, [m, k])], [("y", F, [m, n])], inits, opset=17)


# the GELU's region runs at the matmul's store (ir/ops/epilogue_rules.py): one dispatch, then the LayerNorm's
@pytest.mark.parametrize(("layer_norm", "before", "after"), [(False, 7, 1), (True, 16, 2)])
def test_onnx_gelu_and_layer_norm_against_onnxruntime(layer_norm, before, after, device):
    # GELU: the matmul, then one kernel (bias and the recognised Gelu); the decomposed LayerNorm is
    # recognised as one LayerNorm (the recognition ruleset), so 16 dispatches become 3
    m = _gelu(layer_norm=layer_norm)
    x = np.random.default_rng(1).standard_normal((9, 12)).astype(np.float32)
    check(m, {"x": x}, rtol=1e-4, atol=1e-4)
    runner = Model(m, device=device)
    runner.run({"x": x})
    (spec,) = runner.plans.values()
    assert (spec.compiled.dispatches_unfused, spec.compiled.dispatches_fused) == (before, after)
