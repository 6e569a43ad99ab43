"""The training-step graph (ir.optim), without a GPU: structure, the optimisers' formulas on
the numpy reference, the errors, and what the rewrite engine and the scheduler make of it."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import OPS, DType, Graph, GraphError, InputError, evaluate
from eggfuse.ir.autodiff import grad
from eggfuse.ir.optim import SGD, STEP_INPUT, Adam, StepGraph, step_graph
from eggfuse.lowering import lower
from eggfuse.models.mlp import build_mlp_graph, init_mlp_params
from eggfuse.rewrites import optimize


def _regression() -> tuple[Graph, int]:
    """loss = mean((x w + b)^2) with an unused parameter and a frozen one."""
    g = Graph()
    x = g.input("x", [4, 3])
    w, b, scale = g.parameter("w", [3, 2]), g.parameter("b", [2]), g.parameter("scale", [1])
    g.parameter("unused", [5])
    y = g.mul(g.bias_add(g.matmul(x, w), b), scale)
    return g, g.mean_all(g.mul(y, y))


def _values(seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)  # f32-representable: evaluate rounds leaves to f32
    values = {"x": rng.standard_normal((4, 3)), "w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2),
              "scale": np.array([1.5]), "unused": np.ones(5)}
    return {k: v.astype(np.float32).astype(np.float64) for k, v in values.items()}


def _grads(g, loss, values, frozen=("scale",)) -> dict[str, np.ndarray]:
    tg = grad(g, loss, frozen=frozen)
    outs = evaluate(tg, {"x": values["x"]}, {k: v for k, v in values.items() if k != "x"})
    return {name: outs[i] for name, i in tg.grad_outputs.items()}


def _updated(sg: StepGraph, values, step=None) -> dict[str, np.ndarray]:
    inputs = {"x": values["x"]} | ({STEP_INPUT: [step]} if step is not None else {})
    params = {k: v for k, v in values.items() if k != "x"}
    params |= {name: np.zeros(shape) for name, shape in sg.state_shapes.items()}
    outs = evaluate(sg, inputs, params)
    return {name: outs[i] for name, i in sg.updates.items()}


def test_sgd_step_graph_structure_and_formula():
    g, loss = _regression()
    values = _values()
    sg = step_graph(g, loss, SGD(0.1, weight_decay=0.01), frozen=["scale"])
    assert list(sg.updates) == ["w", "b"] and sg.updates == {"w": 1, "b": 2}
    assert sg.frozen == ("scale", "unused") and sg.state_shapes == {} and sg.step_input is None
    assert [sg.node(o).op for o in sg.outputs] == ["MeanAll", "SgdUpdate", "SgdUpdate"]
    grads = _grads(g, loss, values)
    got = _updated(sg, values)
    for name in ("w", "b"):
        np.testing.assert_allclose(got[name], values[name] - 0.1 * (grads[name] + 0.01 * values[name]), rtol=1e-12)


def test_momentum_and_adam_first_step_formulas():
    g, loss = _regression()
    values = _values(1)
    grads = _grads(g, loss, values)
    sg = step_graph(g, loss, SGD(0.1, momentum=0.9), frozen=["scale"])
    assert sg.state_shapes == {"w.momentum": (3, 2), "b.momentum": (2,)}
    got = _updated(sg, values)
    for name in ("w", "b"):  # the first velocity is the gradient (torch.optim.SGD)
        np.testing.assert_allclose(got[name], values[name] - 0.1 * grads[name], rtol=1e-12)
    sg = step_graph(g, loss, Adam(0.01, betas=(0.8, 0.9), eps=1e-8), frozen=["scale"])
    assert sg.state_shapes == {"w.adam": (2, 3, 2), "b.adam": (2, 2)} and sg.step_input == STEP_INPUT
    assert sg.inputs[STEP_INPUT].dtype is DType.U32
    got = _updated(sg, values, step=1)
    for name in ("w", "b"):  # bias-corrected first step: m_hat = g, v_hat = g^2, so a step of lr sign(g)
        g_ = grads[name]
        np.testing.assert_allclose(got[name], values[name] - 0.01 * g_ / (np.abs(g_) + 1e-8), rtol=1e-9)


def test_input_graph_untouched_and_training_graph_accepted():
    g, loss = _regression()
    before = g.summary()
    tg = grad(g, loss, frozen=["scale"])
    sg = step_graph(tg, None, SGD(0.5))
    assert g.summary() == before and len(tg.outputs) == 4  # [loss, w, b, unused]: not modified
    assert list(sg.updates) == ["w", "b"]  # 'unused' has a zero gradient: not updated
    with pytest.raises(GraphError, match="TrainingGraph"):
        step_graph(g, None, SGD(0.5))


def test_errors():
    g, loss = _regression()
    with pytest.raises(GraphError, match="'x' is an Input"):
        step_graph(g, loss, SGD(0.1), wrt=["w", "x"])
    g.parameter("w.momentum", [3, 2])
    with pytest.raises(GraphError, match="already used"):
        step_graph(g, loss, SGD(0.1, momentum=0.5))
    for bad in (lambda: SGD(0.0), lambda: SGD(0.1, momentum=1.0), lambda: SGD(0.1, weight_decay=-1),
                lambda: Adam(-1.0), lambda: Adam(betas=(0.9, 1.0)), lambda: Adam(eps=0.0), lambda: Adam(betas=(0.9,)),
                lambda: Adam("x"), lambda: SGD(None), lambda: Adam(eps=True)):  # (float("x") was a ValueError)
        with pytest.raises(InputError):
            bad()


def test_every_update_follows_the_readers_of_its_parameter():
    g, loss = build_mlp_graph(8, (5, 4, 3))
    sg = step_graph(g, loss, Adam(0.01))
    plan = lower(sg)
    position = {d.node: i for i, d in enumerate(plan.dispatches)}
    for n in sg.live_nodes():
        if OPS[n.op].writes is None or n.op != "AdamStep":
            continue
        param = n.inputs[0]
        readers = [r.id for r in sg.live_nodes() if param in r.inputs and r.id != n.id and r.id in position]
        assert readers and all(position[r] < position[n.id] for r in readers), n.describe()


def test_rewrite_engine_keeps_the_step():
    """The whole step (forward, backward, updates) goes through egglog; the result computes
    the same updated parameters on the numpy reference."""
    g, loss = build_mlp_graph(8, (5, 4, 3))
    sg = step_graph(g, loss, SGD(0.1, momentum=0.9))
    og, report = optimize(sg, verify=True)
    assert report.dispatches_after < report.dispatches_before
    assert len(og.outputs) == len(sg.outputs)
    assert {n.attrs["name"] for n in og.leaves("Parameter") if n.attrs.get("state")} == set(sg.state_shapes)
    assert sorted(init_mlp_params((5, 4, 3))) == sorted(sg.updates)


def test_concat_of_updated_parameters_is_dispatched():
    # A packed weight whose sources a step updates must be recomputed at every run.
    g = Graph()
    a, b = g.parameter("a", [2, 3]), g.parameter("b", [2, 3])
    packed = g.concat([a, b], axis=0)
    assert g.is_derived_parameter(g.node(packed))
    loss = g.sum_all(g.mul(packed, g.input("x", [4, 3])))
    sg = step_graph(g, loss, SGD(0.1))
    assert not sg.is_derived_parameter(sg.node(packed))
    plan = lower(sg)
    assert "Concat" in [d.op for d in plan.dispatches] and not plan.derived


def test_a_loss_that_reaches_no_parameter_is_refused():
    # every step changed nothing, silently (torch refuses a loss that needs no gradient the same way)
    g = Graph()
    x = g.input("x", [4, 3])
    g.parameter("w", [3, 2])
    loss = g.mean_all(g.mul(x, x))
    with pytest.raises(GraphError, match=r"the loss \(.*MeanAll.*\) depends on none of the parameters it is "
                                         r"trained with respect to \('w'\): no step would change them"):
        step_graph(g, loss, SGD(0.1))
    g, loss = _regression()  # one unreached parameter among reached ones: left as it is
    assert step_graph(g, loss, SGD(0.1)).frozen == ("unused",)


def test_a_scalar_loss_trains_as_its_one_element_reshape():
    # an f32[] loss was refused ("the loss must be an f32[1] node"), where the command line's --training took it
    g, loss = _regression()
    scalar = g.reshape(loss, [])
    before = g.summary()
    values = _values()
    got = _updated(step_graph(g, scalar, SGD(0.1), frozen=["scale"]), values)
    want = _updated(step_graph(g, loss, SGD(0.1), frozen=["scale"]), values)
    assert g.summary() == before and got.keys() == want.keys() == {"w", "b"}
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])
    h = Graph()
    rows = h.matmul(h.input("x", [4, 3]), h.parameter("w", [3, 2]))
    with pytest.raises(GraphError, match=r"the loss must be an f32\[1\] or f32\[\] node, got .*f32\[4,2\]"):
        step_graph(h, rows, SGD(0.1))
