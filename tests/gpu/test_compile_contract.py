"""compile() and run(): fused and unfused accept the same feeds and parameters, and refuse
bad ones with errors that name the problem."""

from __future__ import annotations

import numpy as np
import pytest

import eggfuse
from eggfuse.ir import Graph, GraphError, InputError, evaluate

RNG = np.random.default_rng(13)


def _with_dead_leaves() -> tuple[Graph, dict, dict]:
    # y = relu(x @ w + b); the parameter 'dead_w' and the input 'unused_in' feed no output
    g = Graph()
    x = g.input("x", [3, 5])
    w = g.parameter("w", [5, 4])
    b = g.parameter("b", [4])
    dead_w = g.parameter("dead_w", [2, 2])
    g.input("unused_in", [7])
    g.neg(dead_w)  # a dead node reading a dead leaf
    g.set_outputs([g.relu(g.bias_add(g.matmul(x, w), b))])
    params = {"w": RNG.standard_normal((5, 4)), "b": RNG.standard_normal(4), "dead_w": np.zeros((2, 2))}
    feeds = {"x": RNG.standard_normal((3, 5)), "unused_in": np.zeros(7)}
    return g, params, feeds


@pytest.mark.parametrize("fuse", [True, False])
def test_dead_leaves_are_accepted_fused_and_unfused(fuse, device):
    g, params, feeds = _with_dead_leaves()
    compiled = eggfuse.compile(g, params, fuse=fuse, device=device)
    (got,) = compiled.run(feeds)
    (want,) = evaluate(g, feeds, params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the dead leaves may also be left out, as unfused
    live_params = {k: v for k, v in params.items() if k != "dead_w"}
    (again,) = eggfuse.compile(g, live_params, fuse=fuse, device=device).run({"x": feeds["x"]})
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("fuse", [True, False])
def test_the_compiled_graph_is_not_the_callers(fuse, device):
    # Compiled.graph is the graph that runs: the caller's graph, changed after compile, changes neither it nor the
    # results (with fuse=False it was the caller's object itself)
    g, params, feeds = _with_dead_leaves()
    compiled = eggfuse.compile(g, params, fuse=fuse, device=device, cache=False)
    (want,) = evaluate(g, feeds, params)
    outputs = list(compiled.graph.outputs)
    g.set_outputs([g.neg(g.outputs[0])])
    assert compiled.graph is not g and compiled.graph.outputs == outputs
    np.testing.assert_allclose(compiled.run(feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_a_compiled_graph_and_its_plan_print_as_one_line(device):
    # what a REPL shows for `compiled` and `compiled.plan`: counts, not every dispatch's WGSL
    g, params, _ = _with_dead_leaves()
    compiled = eggfuse.compile(g, params, device=device)
    text, plan = repr(compiled), repr(compiled.plan)
    assert "\n" not in text + plan and len(text) < 400 and len(plan) < 400
    assert f"{compiled.plan_dispatches} dispatches per run" in text and compiled.adapter in text
    assert plan.startswith(f"ExecutionPlan({len(compiled.plan.dispatches)} dispatches") and "f32[3,4]" in plan


def test_optimize_keeps_the_leaves_of_the_graph_it_was_given():
    g, _, _ = _with_dead_leaves()
    opt, _ = eggfuse.optimize(g)
    assert opt.inputs == g.inputs and opt.parameters == g.parameters
    assert {n.attrs["name"] for n in opt.live_nodes() if n.op in ("Input", "Parameter")} == {"x", "w", "b"}


@pytest.mark.parametrize("fuse", [True, False])
def test_parameters_given_as_a_list_are_an_input_error(fuse, device):
    g, params, _ = _with_dead_leaves()
    with pytest.raises(InputError, match=r"parameters must be a mapping of name -> array \(a dict\), got list; "
                                         r"the graph's parameters are: 'w', 'b', 'dead_w'"):
        eggfuse.compile(g, [params["w"]], fuse=fuse, device=device)


@pytest.mark.parametrize("fuse", [True, False])
def test_a_graph_without_outputs_is_a_graph_error(fuse, device):
    g = Graph()
    g.neg(g.input("x", [2, 3]))
    with pytest.raises(GraphError, match=r"the graph has no outputs \(2 nodes\); call graph.set_outputs"):
        eggfuse.compile(g, {}, fuse=fuse, device=device)


def test_optimize_and_evaluate_without_outputs_are_graph_errors():
    g = Graph()
    g.neg(g.input("x", [2, 3]))
    with pytest.raises(GraphError, match="the graph has no outputs"):
        eggfuse.optimize(g)
    with pytest.raises(GraphError, match="the graph has no outputs"):
        evaluate(g, {"x": np.zeros((2, 3))}, {})


@pytest.mark.parametrize("fuse", [True, False])
def test_a_misspelt_feed_is_named_with_the_closest_known_name(fuse, device):
    g, params, feeds = _with_dead_leaves()
    compiled = eggfuse.compile(g, params, fuse=fuse, device=device)
    with pytest.raises(InputError, match=r"input\(s\) not given: 'x' \(f32\[3,5\]\); "
                                         r"unknown input\(s\) 'X' \(did you mean 'x'\?\)"):
        compiled.run({"X": feeds["x"]})
    with pytest.raises(InputError, match=r"parameter\(s\) not given: 'w' \(f32\[5,4\]\); "
                                         r"unknown parameter\(s\) 'W' \(did you mean 'w'\?\)"):
        eggfuse.compile(g, {"W": params["w"], "b": params["b"]}, fuse=fuse, device=device)
    with pytest.raises(InputError, match=r"unknown input\(s\) 'zzz'; the graph's inputs are: 'x'"):
        compiled.run({"x": feeds["x"], "zzz": np.zeros(1)})


@pytest.mark.parametrize("fuse", [True, False])
def test_none_as_a_feed_is_named_as_none(fuse, device):
    # np.asarray(None) has shape (): "expected shape [3, 5] ... got []" before
    g, params, feeds = _with_dead_leaves()
    compiled = eggfuse.compile(g, params, fuse=fuse, device=device)
    with pytest.raises(InputError, match=r"^input 'x': got None, not an array; pass an array of shape "
                                         r"\[3, 5\] and dtype float32 \(f32\[3,5\]\)$"):
        compiled.run({"x": None})


@pytest.mark.parametrize("fuse", [True, False])
def test_integer_feeds_of_an_f32_input_must_convert_exactly(fuse, device):
    # 2**24 + 1 became 16777216 before; onnx.Model.run refuses such a feed too
    g = Graph()
    g.set_outputs([g.neg(g.input("x", [2, 3]))])
    compiled = eggfuse.compile(g, {}, fuse=fuse, device=device)
    exact = np.array([[-2**24, 3, 2**31], [2**40, -(2**62), 7]], np.int64)  # float32 holds each exactly
    np.testing.assert_array_equal(compiled.run({"x": exact})[0], -exact.astype(np.float32))
    np.testing.assert_array_equal(compiled.run({"x": np.arange(6, dtype=np.int32).reshape(2, 3)})[0],
                                  -np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(InputError, match=r"^input 'x': 2 of 6 integer values have no exact float32 for f32\[2,3\], "
                                         r"the first 16777217 at \[0, 2\] .*; pass float32 values"):
        compiled.run({"x": np.array([[1, 2, 2**24 + 1], [0, 2**62 + 1, 0]], np.int64)})
    with pytest.raises(InputError, match=r"the first 4294967295 at \[1, 0\]"):
        compiled.run({"x": np.array([[0, 0, 0], [2**32 - 1, 0, 0]], np.uint32)})


@pytest.mark.parametrize("n", [7, 16])
def test_a_concat_of_up_to_16_computed_inputs_compiles_fused(n, device):
    # 'node 7 (Concat, f32[3,35]): 7 inputs; give op Concat a constructor' before
    g = Graph()
    v = g.input("v", [3, 5])
    c = g.concat([g.sigmoid(g.mul(v, g.parameter(f"p{i}", [3, 5]))) for i in range(n)], axis=1)
    g.set_outputs([g.relu(g.matmul(c, g.parameter("w", [5 * n, 6])))])
    params = {f"p{i}": RNG.standard_normal((3, 5)) for i in range(n)} | {"w": RNG.standard_normal((5 * n, 6))}
    feeds = {"v": RNG.standard_normal((3, 5))}
    compiled = eggfuse.compile(g, params, device=device)
    # relu in the matmul, and each Sigmoid(Mul(v, p)) one generated kernel
    assert compiled.report.dispatches_after == compiled.report.dispatches_before - 1 - n
    (got,) = compiled.run(feeds)
    np.testing.assert_allclose(got, evaluate(g, feeds, params)[0], rtol=1e-5, atol=1e-5)


def test_a_ruleset_of_ones_own_reaches_the_compiled_graph(device):
    from eggfuse.rewrites import make_ruleset, optimization_rulesets

    def abs_of_abs(e):
        (x,) = e.vars("x")
        # Abs(Abs(x)) -> Abs(x): no shipped rule says so
        yield e.equal("Abs(Abs(x)) -> Abs(x)", e.Abs(e.Abs(x)), e.Abs(x))

    g = Graph()
    g.set_outputs([g.add_node("Abs", [g.add_node("Abs", [g.input("x", [3, 5])])])])
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    shipped = eggfuse.compile(g, {}, device=device)
    mine = eggfuse.compile(g, {}, rulesets=[*optimization_rulesets(), make_ruleset("mine", abs_of_abs)],
                           device=device)
    # shipped: both Abs in one generated kernel; mine: one Abs
    assert [n.attrs["expr"] for n in shipped.graph.live_nodes() if n.op == "Fused"][0][1:] == \
        (("Abs", (), (0,)), ("Abs", (), (1,)))
    assert [n.op for n in mine.graph.live_nodes()].count("Abs") == 1
    assert mine.report.rules_fired["Abs(Abs(x)) -> Abs(x)"] >= 1
    assert mine.dispatches_fused == 1
    np.testing.assert_array_equal(mine.run({"x": x})[0], np.abs(x))
