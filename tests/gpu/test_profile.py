"""GPU timestamps per dispatch, the Chrome trace, and the record fast path."""

import json

import numpy as np

from eggfuse.ir import Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
from eggfuse.runtime.profile import profile


def test_profile_times_every_dispatch_and_writes_a_trace(device, tmp_path):
    g = Graph()
    x = g.input("x", [64, 64])
    h = g.relu(g.matmul(x, g.parameter("w", [64, 64])))
    g.set_outputs([g.softmax(h)])
    s = Session(lower_for(g, device), {"w": np.eye(64)}, device=device)
    p = profile(s, {"x": np.ones((64, 64))}, repeats=2)
    assert [k.label for k in p.kernels] == [d.label for d in s.plan.dispatches]
    assert all(k.gpu_ms > 0 for k in p.kernels)
    assert p.gpu_ms < 10 * p.run_ms  # timestamps are read as nanoseconds: same scale as wall time
    assert "matmul" in p.table()
    path = tmp_path / "trace.json"
    p.write_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) == len(s.plan.dispatches) and all(e["ph"] == "X" for e in events)


def test_record_and_submit_matches_run(device):
    g = Graph()
    h = g.input("x", [8])
    for _ in range(20):
        h = g.neg(h)
    g.set_outputs([h])
    s = Session(lower_for(g, device), {}, device=device)
    (out,) = s.run({"x": np.arange(8)})
    np.testing.assert_array_equal(out, np.arange(8))
    s.record_and_submit()
    s.wait()
    (out,) = s.run({"x": -np.arange(8)})
    np.testing.assert_array_equal(out, -np.arange(8))
