"""``bench/matmul.py --cold``'s copies of a plan's weights (``bench/gpu_timing.weight_copies``): each copy of the
dispatches computes the product of the numpy reference and reads weights of its own (a write to the session's
weight after the copies are made changes copy 0 only), for weights read as stored (a 'BT' GEMV, B stored [K, N] on
the tiled kernel), one the session packs transposed for the tiled kernel (B stored [N, K]) and a split-K product;
and the calls of a cold sample."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from eggfuse.ir import Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import gpu_timing  # noqa: E402


def _run(session: Session, commands: list[tuple]) -> np.ndarray:
    # the dispatches of one copy, recorded and submitted after the output is cleared; the output read back
    out = session.plan.outputs[0]
    session.device.queue.write_buffer(session._buffers[out], session._offsets[out],
                                      np.zeros(session.plan.buffers[out].size_bytes, np.uint8))
    encoder = session.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    for pipeline, bind_group, grid in commands:
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*grid)
    compute.end()
    session.device.queue.submit([encoder.finish()])
    return session.read_output(0)


@pytest.mark.parametrize(("bt", "m", "k", "n"), [(True, 1, 40, 24), (False, 33, 20, 70), (True, 33, 20, 72),
                                                 (True, 17, 600, 36)],
                         ids=["gemv_bt", "tiled_kn", "tiled_transposed", "split_k"])
def test_weight_copies_compute_the_product_from_their_own_weights(device, bt, m, k, n):
    rng = np.random.default_rng(3)
    g = Graph()
    a = g.input("a", [m, k])
    b = g.parameter("b", [n, k] if bt else [k, n])
    g.set_outputs([g.matmul_bt(a, b) if bt else g.matmul(a, b)])
    av = rng.standard_normal((m, k), dtype=np.float32)
    bv = rng.standard_normal((n, k) if bt else (k, n), dtype=np.float32)
    session = Session(lower_for(g, device), {"b": bv}, device=device)
    session.run({"a": av})
    if bt and m == 17:  # K ranges, added by the last workgroup of each tile (matmul_kernel.last_split)
        assert "split" in session.plan.dispatches[0].kernel, [d.kernel for d in session.plan.dispatches]
    if bt and m == 33:  # the weight read from its copy transposed for the tiled kernel (lowering/layout.py)
        assert session.plan.derived and not session.plan.dispatches[0].kernel.startswith("matmul_BT")
    expected = av.astype(np.float64) @ (bv.T if bt else bv)
    assert gpu_timing.weight_bytes(session) >= bv.nbytes
    copies = gpu_timing.weight_copies(session, 3)
    assert len(copies) == 3 and copies[0] == session._commands
    for commands in copies:
        np.testing.assert_allclose(_run(session, commands), expected, rtol=1e-4, atol=1e-4)
    session.write_parameter("b", np.zeros_like(bv))  # the session's own weight (and what it packs) only
    np.testing.assert_array_equal(_run(session, copies[0]), 0)
    for commands in copies[1:]:
        np.testing.assert_allclose(_run(session, commands), expected, rtol=1e-4, atol=1e-4)


def test_copies_for_fills_the_cold_bytes(device):
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("a", [2, 64]), g.parameter("b", [32, 64]))])
    session = Session(lower_for(g, device), {"b": np.ones((32, 64), np.float32)}, device=device)
    size = gpu_timing.weight_bytes(session)
    assert size == 32 * 64 * 4
    assert gpu_timing.copies_for(session, 10 * size) == 10
    assert gpu_timing.copies_for(session, size) == 2  # at least one copy besides the session's own
    assert gpu_timing.copies_for(session, 10**12) == gpu_timing.COLD_MAX_COPIES


def test_cold_calls_are_whole_rounds_of_the_copies():
    assert gpu_timing.cold_calls(1000, 475) == 950
    assert gpu_timing.cold_calls(100, 475) == 475  # at least one round
    assert gpu_timing.cold_calls(7, 4) == 4
    assert gpu_timing.cold_calls(283, 1) == 283  # one copy: as asked
