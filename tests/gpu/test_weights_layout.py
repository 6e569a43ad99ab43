"""Weights stored [K, N] for the tiled matmul (lowering/layout.py): the products of a weight stored [N, K]
that take the tiled kernel read a derived parameter of their own, the weight transposed by the session,
and give the numbers of the plan that reads the weight as stored, bit for bit, and of the numpy reference
(``eggfuse.ir.evaluate``). Every matmul op with a ``variant``, at odd sizes (edge tiles in M and N, K not
a multiple of 4), split and whole, a weight packed from several parameters (Q/K/V), a weight two products
share, and the weights that keep their layout."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.lowering import layout
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session


def _leaves(g: Graph, seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    inputs = {k: rng.standard_normal(t.shape).astype(np.float32) for k, t in g.inputs.items() if t.dtype == DType.F32}
    params = {k: rng.standard_normal(t.shape).astype(np.float32) for k, t in g.parameters.items()}
    return inputs, params


def _product(op: str, m: int, k: int, n: int) -> Graph:
    # one product of a weight stored [N, K] with the op's prologue, an epilogue and a second use of the input
    g = Graph()
    x = g.input("x", (m, k))
    w = g.parameter("w", (n, k))
    if op == "MatMulBT":
        y = g.add_node("MatMulBT", (x, w))
    elif op == "FusedMatMul":
        y = g.add_node(op, (x, w, g.parameter("bias", (n,))), variant="BT", epilogue=("bias", "Gelu"))
    elif op == "FusedRmsNormMatMul":
        y = g.add_node(op, (x, g.parameter("g", (k,)), w), eps=1e-6, variant="BT", epilogue=())
    elif op == "FusedRmsNormMatMulSwiGLU":
        y = g.add_node(op, (x, g.parameter("g", (k,)), w), eps=1e-6, variant="BT", epilogue=())
    elif op == "FusedLayerNormMatMul":
        y = g.add_node(op, (x, g.parameter("ga", (k,)), g.parameter("be", (k,)), w), eps=1e-5, variant="BT",
                       epilogue=())
    elif op == "FusedMatMulLayerNorm":
        y = g.add_node(op, (x, w, g.parameter("ga", (n,)), g.parameter("be", (n,)), g.input("r", (m, n))),
                       eps=1e-5, variant="BT", epilogue=("add",))
    else:
        raise AssertionError(op)
    g.set_outputs([y, g.add_node("Relu", (x,))])  # x read again: the product's input outlives it
    return g


OPS = ["MatMulBT", "FusedMatMul", "FusedRmsNormMatMul", "FusedRmsNormMatMulSwiGLU", "FusedLayerNormMatMul",
       "FusedMatMulLayerNorm"]
#: (M, K, N): a product in one K range and one split across workgroups; N even (SwiGLU halves it)
SHAPES = [(37, 67, 70), (24, 403, 38)]


def _run(g: Graph, device, along_n: bool, seed: int = 0) -> tuple[Session, list[np.ndarray]]:
    inputs, params = _leaves(g, seed)
    session = Session(_lower(g, device, along_n), params, device=device)
    return session, session.run(inputs)


def _lower(g: Graph, device, along_n: bool):
    from eggfuse.lowering import lower

    return lower(g, dict(device.limits), weights_along_n=along_n)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_weight_read_transposed_gives_the_numbers_of_the_weight_as_stored(op, shape, device):
    g = _product(op, *shape)
    kn, got = _run(g, device, True)
    nk, want = _run(g, device, False)
    # the product reads the transposed copy, a derived parameter; the parameter needs no device buffer
    (t,) = [b for b in kn.plan.buffers if b.name == "w.T"]
    assert t.kind == "derived" and t.shape == (shape[1], shape[2]) and kn.plan.derived[t.index].transpose
    assert kn.plan.buffers[kn.plan.parameters["w"]].kind == "host"
    assert "_BT_" not in kn.plan.dispatches[0].kernel and "_BT_" in nk.plan.dispatches[0].kernel
    assert kn.plan.dispatches[0].op == op  # the graph's op, as the profiles and errors name it
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    inputs, params = _leaves(g, 0)
    ref = evaluate(g, inputs, params)[0]
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_packed_and_shared_weights(device):
    # Q/K/V weights packed along N (a derived Concat) read transposed as one; a weight two products read
    # transposed once; a weight another op reads too (an embedding table tied to an LM head) keeps its layout
    g = Graph()
    x = g.input("x", (40, 36))
    ws = [g.parameter(f"w{i}", (20, 36)) for i in range(3)]
    qkv = g.add_node("MatMulBT", (x, g.add_node("Concat", ws, axis=0)))
    shared = g.parameter("s", (44, 60))
    first = g.add_node("MatMulBT", (qkv, shared))
    second = g.add_node("MatMulBT", (g.add_node("Relu", (qkv,)), shared))
    table = g.parameter("table", (52, 44))
    ids = g.input("ids", (40,), DType.U32)
    emb = g.add_node("Embedding", (ids, table))
    head = g.add_node("MatMulBT", (first, table))
    g.set_outputs([first, second, head, emb])
    inputs, params = _leaves(g, 1)
    inputs["ids"] = np.random.default_rng(2).integers(0, 52, size=(40,)).astype(np.uint32)
    kn = Session(_lower(g, device, True), params, device=device)
    nk = Session(_lower(g, device, False), params, device=device)
    got, want = kn.run(inputs), nk.run(inputs)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    names = {b.name: b for b in kn.plan.buffers}
    packed = [b for b in kn.plan.buffers if b.name.endswith(".T") and b.name.startswith("Concat")]
    assert len(packed) == 1 and kn.plan.derived[packed[0].index].sources == ("w0", "w1", "w2")
    assert names["s.T"].kind == "derived" and sum(b.name == "s.T" for b in kn.plan.buffers) == 1
    assert "table.T" not in names and names["table"].kind == "parameter"
    # the Concat as stored is no longer packed: no device buffer, no derived entry
    (concat,) = [b for b in kn.plan.buffers if b.name.startswith("Concat") and not b.name.endswith(".T")]
    assert concat.kind == "host" and concat.index not in kn.plan.derived
    assert kn.plan.memory()["weights_bytes"] == nk.plan.memory()["weights_bytes"]


def test_weights_that_keep_their_layout(device, monkeypatch):
    # the GEMV (few rows) and the tiles of 128 rows read B as stored; WEIGHTS_ALONG_N False turns it off
    from eggfuse.ir.ops.matmul_kernel import matmul_tile

    for m, k, n in ((3, 64, 96), (12, 64, 96), (640, 16, 8192)):
        g = Graph()
        g.set_outputs([g.add_node("MatMulBT", (g.input("x", (m, k)), g.parameter("w", (n, k))))])
        plan = _lower(g, device, True)
        tile = matmul_tile(m, k, n, "BT")
        assert tile.gemv or tile.bm == 128
        assert not any(b.name == "w.T" for b in plan.buffers) and "_BT_" in plan.dispatches[0].kernel
    g = _product("MatMulBT", 37, 67, 70)
    monkeypatch.setattr(layout, "WEIGHTS_ALONG_N", False)
    assert "_BT_" in lower_for(g, device).dispatches[0].kernel


def test_a_session_sharing_weights_reads_them_as_stored(device, tmp_path, monkeypatch):
    # eggfuse.compile with share: the other session's buffers are the weights as stored, so no transposed copy
    # (eggfuse generate's prefill plans share the decode plan's weights); the compile cache keys the choice
    from eggfuse.pipeline import compile as compile_graph

    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path))
    g = _product("FusedMatMul", 37, 67, 70)
    inputs, params = _leaves(g, 3)
    first = compile_graph(g, params, device=device, fuse=False)
    assert any(b.name == "w.T" for b in first.plan.buffers) and first.cache == "miss"
    shared = compile_graph(g, params, device=device, fuse=False, share=first.session)
    assert shared.cache == "miss" and not any(b.name.endswith(".T") for b in shared.plan.buffers)
    assert shared.plan.buffers[shared.plan.parameters["w"]].kind == "parameter"
    for a, b in zip(first.session.run(inputs), shared.session.run(inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert compile_graph(g, params, device=device, fuse=False).cache == "hit"
