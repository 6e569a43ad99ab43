"""Recording: the compiled loop, the next run recorded in the background, and the cffi fallback."""

import numpy as np
import pytest

from eggfuse.ir import Graph, evaluate
from eggfuse.runtime import Session
from eggfuse.runtime import session as session_module


def _dag() -> Graph:
    # 20-odd dispatches with multi-use intermediates, a shared input, an output that later
    # dispatches also read, and an in-place SGD update of a parameter read before it.
    g = Graph()
    x = g.input("x", [5, 7])
    w = g.parameter("w", [7, 3])
    y = g.matmul(x, w)
    a = g.relu(y)
    outs = [a]
    h = a
    for i in range(8):
        h = g.add(g.mul(h, a) if i % 2 else g.neg(h), y)
    outs.append(h)
    dw = g.matmul_at(x, g.mul(h, a))
    outs.append(g.add_node("SgdUpdate", (w, dw), lr=0.01))
    g.set_outputs(outs)
    return g


def _check_steps(session, g, x, w0, steps=4):
    # Every run against the reference; the in-place update makes each run depend on the last.
    w = w0.astype(np.float64)
    for _ in range(steps):
        want = evaluate(g, {"x": x}, {"w": w})
        for got, ref in zip(session.run({"x": x}), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        w = want[-1]
    np.testing.assert_allclose(session.read_parameter("w"), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("prerecord", [True, False])
def test_prerecorded_runs_match_the_reference(prerecord, device):
    g = _dag()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    w0 = rng.standard_normal((7, 3)).astype(np.float32)
    s = Session(g, {"w": w0}, device=device, prerecord=prerecord)
    _check_steps(s, g, x, w0)
    assert (s._next is not None) == prerecord  # the next run's commands are ready (or not kept)


def test_prerecorded_run_sees_new_inputs_and_parameters(device):
    # A command buffer recorded before the inputs and a parameter change reads the new values.
    g = _dag()
    w0 = np.full((7, 3), 0.1, dtype=np.float32)
    s = Session(g, {"w": w0}, device=device)
    x = np.ones((5, 7), dtype=np.float32)
    s.run({"x": x}, read=())
    s.run({"x": x}, read=())
    assert s._next is not None
    w1 = np.linspace(-1, 1, 21, dtype=np.float32).reshape(7, 3)
    s.write_parameter("w", w1)
    x2 = np.arange(35, dtype=np.float32).reshape(5, 7) / 35
    want = evaluate(g, {"x": x2}, {"w": w1})
    for got, ref in zip(s.run({"x": x2}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("c_loop", [True, False])
def test_cffi_loop_fallback_gives_the_same_numbers(c_loop, device, monkeypatch):
    if c_loop and (session_module._c_record is None or session_module._lib is None):
        pytest.skip("the compiled recording loop is not built")
    if not c_loop:
        monkeypatch.setattr(session_module, "_c_record", None)
    g = _dag()
    x = np.linspace(-1, 1, 35, dtype=np.float32).reshape(5, 7)
    s = Session(g, {"w": np.full((7, 3), 0.1)}, device=device)
    assert s.recording == ("C loop" if c_loop else "cffi loop")
    _check_steps(s, g, x, np.full((7, 3), 0.1))


def test_compiled_loop_rejects_malformed_commands():
    rec = session_module._c_record
    if rec is None:
        pytest.skip("the compiled recording loop is not built")
    fns = (1, 2, 3)
    with pytest.raises(ValueError, match=r"\[n, 5\]"):
        rec.record(1, np.zeros((2, 4), dtype=np.uint64), *fns)
    with pytest.raises(ValueError, match="null compute pass"):
        rec.record(0, np.ones((1, 5), dtype=np.uint64), *fns)
    with pytest.raises(ValueError, match="command 1 has a null"):
        rec.record(1, np.array([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=np.uint64), *fns)
    with pytest.raises(ValueError, match="C-contiguous uint64"):
        rec.record(1, np.ones((5, 5), dtype=np.uint64)[::2], *fns)  # not contiguous
    with pytest.raises(ValueError, match="C-contiguous uint64"):
        rec.record(1, np.ones((2, 5), dtype=np.float64), *fns)  # 8-byte items, not integers
    with pytest.raises(ValueError, match="C-contiguous uint64"):
        rec.record(1, np.ones((2, 10), dtype=np.uint32), *fns)  # [n, 5] words of 4 bytes
    with pytest.raises(ValueError, match="C-contiguous uint64"):
        rec.record(1, b"\x01" * 40, *fns)  # bytes: unsigned chars


def test_run_after_the_recording_thread_is_gone(device, monkeypatch):
    # At interpreter shutdown the executor refuses new work: runs go on, recorded in run().
    g = _dag()
    x = np.ones((5, 7), dtype=np.float32)
    w0 = np.full((7, 3), 0.2, dtype=np.float32)
    s = Session(g, {"w": w0}, device=device)
    s.run({"x": x}, read=())

    class Closed:
        def submit(self, *args, **kwargs):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(session_module, "_recorder", Closed())
    s.run({"x": x}, read=())  # the second run would start pre-recording
    assert s._next is None and not s._prerecord
    w = evaluate(g, {"x": x}, {"w": w0})[-1]
    w = evaluate(g, {"x": x}, {"w": w})[-1]
    want = evaluate(g, {"x": x}, {"w": w})
    for got, ref in zip(s.run({"x": x}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
