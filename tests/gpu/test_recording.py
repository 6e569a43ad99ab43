"""Recording: the compiled loop, the next run recorded in the background, and the cffi fallback."""

import os
import subprocess
import sys

import numpy as np
import pytest

from eggfuse.ir import Graph, evaluate
from eggfuse.pipeline import lower_for
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
    s = Session(lower_for(g, device), {"w": w0}, device=device, prerecord=prerecord)
    _check_steps(s, g, x, w0)
    assert (s._next is not None) == prerecord  # the next run's commands are ready (or not kept)


def test_prerecorded_run_sees_new_inputs_and_parameters(device):
    # A command buffer recorded before the inputs and a parameter change reads the new values.
    g = _dag()
    w0 = np.full((7, 3), 0.1, dtype=np.float32)
    s = Session(lower_for(g, device), {"w": w0}, device=device)
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
    s = Session(lower_for(g, device), {"w": np.full((7, 3), 0.1)}, device=device)
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
    # At interpreter exit the recording thread stops and refuses new work: runs go on,
    # recorded in run().
    g = _dag()
    x = np.ones((5, 7), dtype=np.float32)
    w0 = np.full((7, 3), 0.2, dtype=np.float32)
    s = Session(lower_for(g, device), {"w": w0}, device=device)
    s.run({"x": x}, read=())

    closed = session_module._Recorder()
    closed.close()  # what the exit handler does
    assert not closed._thread.is_alive()
    monkeypatch.setattr(session_module, "_recorder", closed)
    s.run({"x": x}, read=())  # the second run would start pre-recording
    assert s._next is None and not s._prerecord
    w = evaluate(g, {"x": x}, {"w": w0})[-1]
    w = evaluate(g, {"x": x}, {"w": w})[-1]
    want = evaluate(g, {"x": x}, {"w": w})
    for got, ref in zip(s.run({"x": x}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_an_error_met_while_recording_in_the_background_is_raised_by_the_next_run(device, monkeypatch):
    import wgpu

    from eggfuse.ir import DeviceError

    g = _dag()
    x = np.ones((5, 7), dtype=np.float32)
    s = Session(lower_for(g, device), {"w": np.full((7, 3), 0.1)}, device=device)
    s.run({"x": x}, read=())
    s.run({"x": x}, read=())  # the next run is being recorded from here on
    assert s._next is not None

    def failing(*args):
        raise wgpu.GPUValidationError("invalid bind group")

    monkeypatch.setattr(s, "_record_for_run", failing)  # what the next hand-over gives the thread
    s.run({"x": x}, read=())  # starts recording the next run, which fails on the recording thread
    with pytest.raises(DeviceError, match="running the plan: GPUValidationError: invalid bind group"):
        s.run({"x": x}, read=())
    monkeypatch.undo()
    s.run({"x": x}, read=())  # the failed command buffer is not kept: later runs record again
    w = s.read_parameter("w")  # after the failed run, which submitted nothing
    (got,) = s.run({"x": x}, read=[0])
    np.testing.assert_allclose(got, evaluate(g, {"x": x}, {"w": w})[0], rtol=1e-5)


def test_compiled_staging_copies_and_checks_inputs_of_their_type_and_leaves_the_rest():
    rec = session_module._c_record
    if rec is None:
        pytest.skip("the compiled recording loop is not built")
    staging = np.zeros(64, dtype=np.uint8)
    slots = (("x", 0, (2, 3), 0, -1), ("ids", 32, (4,), 1, 5))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([0, 4, 2, 1], dtype=np.uint32)
    assert rec.stage(staging, {"x": x, "ids": ids}, slots) == []
    np.testing.assert_array_equal(staging[:24].view(np.float32), x.ravel())
    np.testing.assert_array_equal(staging[32:48].view(np.uint32), ids)
    left = [
        ({"x": x.astype(np.float64)}, [0]),                     # another dtype
        ({"x": x.T.copy()}, [0]),                               # another shape
        ({"x": np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]}, [0]),  # not contiguous
        ({"x": x.tolist()}, [0]),                               # no buffer protocol
        ({"x": x.astype(">f4")}, [0]),                          # big-endian
        ({"x": np.where(x == 4, np.nan, x).astype(np.float32)}, [0]),   # NaN
        ({"x": np.where(x == 5, -np.inf, x).astype(np.float32)}, [0]),  # infinity
        ({"ids": np.array([0, 5, 1, 1], np.uint32)}, [1]),     # an index of row 5 of 5
        ({"ids": ids.astype(np.int32)}, [1]),                   # signed
        ({"x": x.astype(np.uint32), "ids": ids.astype(np.float32)}, [0, 1]),
    ]
    for change, want in left:
        assert rec.stage(staging, {"x": x, "ids": ids, **change}, slots) == want, change
    assert rec.stage(staging, {"x": x, "ids": ids}, (("x", 48, (2, 3), 0, -1),)) == [0]  # past the end
    for offset in (-4, sys.maxsize - 8, sys.maxsize):  # before the start, and offset + size overflowing
        assert rec.stage(staging, {"x": x, "ids": ids}, (("x", offset, (2, 3), 0, -1),)) == [0]
    for bits in (0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFF800000, 0x7F800000):  # NaNs and infinities
        bad = x.copy()
        bad.view(np.uint32)[1, 2] = bits
        assert rec.stage(staging, {"x": bad, "ids": ids}, slots) == [0], hex(bits)
    big = np.finfo(np.float32).max
    edge = np.array([[big, -big, 1e-45], [-0.0, np.finfo(np.float32).tiny, -1.0]], np.float32)  # all finite
    assert rec.stage(staging, {"x": edge, "ids": ids}, slots) == []
    for k in range(6):  # one infinity anywhere (the check's loop runs in vector-wide steps)
        assert rec.stage(staging, {"x": np.where(np.arange(6).reshape(2, 3) == k, np.inf, edge).astype(np.float32),
                                   "ids": ids}, slots) == [0], k
    wide, long = np.zeros(4096, np.uint8), (("v", 0, (1000,), 0, -1), ("i", 4000, (23,), 1, 1000))
    for k in (0, 517, 999):
        v = np.linspace(-1, 1, 1000, dtype=np.float32)
        assert rec.stage(wide, {"v": v, "i": np.arange(23, dtype=np.uint32) * 43}, long) == []
        v[k] = np.nan
        i = np.arange(23, dtype=np.uint32) * 43
        i[k % 23] = 1000
        assert rec.stage(wide, {"v": v, "i": i}, long) == [0, 1], k
    top = np.array([0, 0, 0, 4], np.uint32)  # the largest index last, and one at 2^32 - 1
    assert rec.stage(staging, {"x": x, "ids": top}, slots) == []
    assert rec.stage(staging, {"x": x, "ids": np.array([0, 2**32 - 1, 0, 0], np.uint32)}, slots) == [1]
    with pytest.raises(KeyError):
        rec.stage(staging, {"x": x}, slots)
    with pytest.raises(BufferError):
        rec.stage(b"\x00" * 64, {"x": x, "ids": ids}, slots)  # read-only staging


@pytest.mark.parametrize("compiled", [True, False])
def test_inputs_staged_with_and_without_the_compiled_staging(compiled, device, monkeypatch):
    from types import MappingProxyType

    from eggfuse.ir import DType, InputError

    if compiled and session_module._c_record is None:
        pytest.skip("the compiled recording loop is not built")
    left, real = [], session_module._c_record  # what each compiled staging left to Python

    class Counting:  # the compiled module, with its staging results recorded
        record = real.record if compiled else None

        @staticmethod
        def stage(*args):
            left.append(real.stage(*args))
            return left[-1]

    monkeypatch.setattr(session_module, "_c_record", Counting() if compiled else None)
    g = Graph()
    a, ids = g.input("a", [3, 5]), g.input("ids", [4], DType.U32)
    g.set_outputs([g.tanh(a), g.embedding(ids, g.parameter("table", [6, 5]))])
    params = {"table": np.random.default_rng(1).standard_normal((6, 5))}
    s = Session(lower_for(g, device), params, device=device)
    assert (s._stage_slots is not None) == compiled
    rng = np.random.default_rng(2)
    for feeds in ({"a": rng.standard_normal((3, 5)).astype(np.float32), "ids": np.array([5, 0, 3, 3], np.uint32)},
                  {"a": rng.standard_normal((3, 5)), "ids": [1, 2, 3, 4]},     # converted
                  MappingProxyType({"a": np.ones((3, 5), np.float32), "ids": np.zeros(4, np.uint32)})):
        for got, want in zip(s.run(feeds), evaluate(g, dict(feeds), params), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # compiled: the first feeds staged entirely in C, the second's converted in Python, the
    # third (not a dict) not staged in C at all
    assert left == ([[], [0, 1]] if compiled else [])
    good = {"a": np.ones((3, 5), np.float32), "ids": np.zeros(4, np.uint32)}
    for bad, match in (({"ids": np.array([0, 6, 0, 0], np.uint32)}, "input 'ids': index 6 out of range"),
                       ({"a": np.full((3, 5), np.nan, np.float32)}, "input 'a': contains NaN"),
                       ({"b": good["a"]}, r"input\(s\) not given: 'a'")):
        feeds = {**good, **bad}
        if "b" in bad:
            del feeds["a"]
        with pytest.raises(InputError, match=match):
            s.run(feeds)


def _subprocess(code: str) -> subprocess.CompletedProcess:
    # ``code`` run by this interpreter in a fresh process (the exit path, a lost device).
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


_TINY = """
import numpy as np
from eggfuse.ir import Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
g = Graph()
g.set_outputs([g.tanh(g.add(g.input("x", [3, 4]), g.parameter("w", [3, 4])))])
"""


def test_a_process_exits_cleanly_with_a_recording_queued():
    # Runs with read=() leave the next run being recorded on the thread when the script ends.
    done = _subprocess(_TINY + """
s = Session(lower_for(g), {"w": np.ones((3, 4))})
for _ in range(3):
    s.run({"x": np.zeros((3, 4), np.float32)}, read=())
print("ran")
""")
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    assert "Traceback" not in done.stderr and "panic" not in done.stderr, done.stderr


def test_a_lost_device_is_a_device_error_on_a_run_that_reads_nothing():
    done = _subprocess(_TINY + """
import wgpu
from eggfuse.ir import DeviceError
device = wgpu.gpu.request_adapter_sync().request_device_sync()
s = Session(lower_for(g, device), {"w": np.ones((3, 4))}, device=device)
for _ in range(3):
    s.run({"x": np.zeros((3, 4), np.float32)}, read=())
s.wait()
device.destroy()
try:
    s.run({"x": np.zeros((3, 4), np.float32)}, read=())
except DeviceError as e:
    print("DeviceError:", e)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("DeviceError: running the plan:"), (done.stdout, done.stderr)


def test_a_dropped_session_is_not_kept_alive_by_the_recording_thread(device):
    import weakref

    from dropped import collected  # tests/dropped.py

    g = _dag()
    s = Session(lower_for(g, device), {"w": np.full((7, 3), 0.1)}, device=device)
    for _ in range(3):
        s.run({"x": np.ones((5, 7), np.float32)}, read=())
    s._next.result()  # the thread's job is done
    ref = weakref.ref(s)
    del s
    assert collected(ref)
