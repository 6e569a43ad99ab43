"""In-place updates: optimiser steps and state tensors on the device, scheduling hazards."""

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, LoweringError, evaluate
from eggfuse.lowering import lower
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session


def _sgd_graph(lr=0.1):
    g = Graph()
    x = g.input("x", [4, 3])
    w = g.parameter("w", [3, 2])
    loss = g.mean_all(g.mul(y := g.matmul(x, w), y))
    dw = g.matmul_at(x, g.mul(y, g.constant(np.full((4, 2), 2.0 / 8.0))))  # d loss / d w
    g.set_outputs([loss, g.add_node("SgdUpdate", (w, dw), lr=lr)])
    return g


def test_sgd_steps_update_the_parameter_on_the_device(device):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    w0_copy = w0.copy()
    g = _sgd_graph()
    s = Session(lower_for(g, device), {"w": w0}, device=device)
    w = w0.astype(np.float64)
    for _ in range(3):
        loss, w_new = s.run({"x": x})
        want_loss, want_w = evaluate(g, {"x": x}, {"w": w})
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        np.testing.assert_allclose(w_new, want_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.read_parameter("w"), want_w, rtol=1e-5, atol=1e-6)
        w = want_w
    assert not np.allclose(w0, w)  # the device copy moved
    assert np.array_equal(w0, w0_copy)  # the caller's array did not


def test_adam_and_momentum_match_the_reference_over_steps(device):
    rng = np.random.default_rng(1)
    g = Graph()
    p = g.parameter("p", [5, 3])
    grad = g.input("g", [5, 3])
    step = g.input("t", [1], DType.U32)
    mv = g.add_node("AdamMoments", (g.state("mv", [2, 5, 3]), grad), beta1=0.9, beta2=0.999)
    p_new = g.add_node("AdamStep", (p, mv, step), lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    q = g.parameter("q", [5, 3])
    vel = g.add_node("SgdMomentum", (g.state("vel", [5, 3]), grad, q), momentum=0.9)
    q_new = g.add_node("SgdUpdate", (q, vel), lr=0.05)
    g.set_outputs([p_new, q_new])
    p0, q0 = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    s = Session(lower_for(g, device), {"p": p0, "q": q0}, device=device)
    state = {"p": p0, "q": q0, "mv": np.zeros((2, 5, 3)), "vel": np.zeros((5, 3))}
    for t in range(1, 5):
        gv = rng.standard_normal((5, 3)).astype(np.float32)
        got_p, got_q = s.run({"g": gv, "t": [t]})
        # the reference: the same graph evaluated on the previous state
        want = evaluate(g, {"g": gv, "t": [t]}, state, outputs=[mv, p_new, vel, q_new])
        state = {"mv": want[0], "p": want[1], "vel": want[2], "q": want[3]}
        np.testing.assert_allclose(got_p, state["p"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_q, state["q"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.read_parameter("mv"), state["mv"], rtol=1e-5, atol=1e-7)


def test_readers_of_the_old_value_run_before_the_update():
    g = Graph()
    w = g.parameter("w", [3])
    upd = g.add_node("SgdUpdate", (w, g.input("d", [3])), lr=1.0)
    late = g.relu(w)  # built after the update, reads the old value: scheduled before it
    g.set_outputs([upd, late])
    plan = lower(g)
    order = [d.op for d in plan.dispatches]
    assert order.index("Relu") < order.index("SgdUpdate")


def test_returning_the_overwritten_value_is_refused():
    g = Graph()
    w = g.parameter("w", [3])
    upd = g.add_node("SgdUpdate", (w, g.input("d", [3])), lr=1.0)
    g.set_outputs([upd, w])
    with pytest.raises(LoweringError, match="in-place"):
        lower(g)


def test_reading_the_old_value_after_depending_on_the_update_is_refused():
    g = Graph()
    w = g.parameter("w", [3])
    upd = g.add_node("SgdUpdate", (w, g.input("d", [3])), lr=1.0)
    g.set_outputs([g.add(g.relu(upd), w)])  # needs both the new and the old contents at once
    with pytest.raises(LoweringError, match="old contents"):
        lower(g)
