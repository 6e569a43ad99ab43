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
#: (M, K, N): a product in one K range and one split across workgroups; N a multiple of 4 (lowering.layout)
SHAPES = [(37, 67, 72), (24, 403, 44)]


def _run(g: Graph, device, transpose: bool, seed: int = 0) -> tuple[Session, list[np.ndarray]]:
    inputs, params = _leaves(g, seed)
    session = Session(_lower(g, device, transpose), params, device=device)
    return session, session.run(inputs)


def _lower(g: Graph, device, transpose: bool):
    from eggfuse.lowering import lower

    return lower(g, dict(device.limits), transpose_weights=transpose)


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


@pytest.mark.parametrize("op", ["MatMulBT", "FusedMatMul"])
def test_a_wide_product_of_few_rows_on_the_deep_tile_either_way(op, device):
    # as wide as an LM head of 17 rows, no prologue: NARROW_HEAD_TILE (matmul_kernel.matmul_tile) whether the weight is
    # read transposed or as stored, so the same sums, bit for bit
    g = _product(op, 17, 579, 18444)
    kn, got = _run(g, device, True)
    nk, want = _run(g, device, False)
    assert kn.plan.dispatches[0].kernel.startswith("matmul_32x64x32m4x8_"), kn.plan.dispatches[0].kernel
    assert nk.plan.dispatches[0].kernel.startswith("matmul_BT_32x64x32m4x8_"), nk.plan.dispatches[0].kernel
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
    # the GEMV (few rows) and the tiles of 128 rows or more (WIDE_HEAD_TILE's 256) read B as stored;
    # TRANSPOSE_WEIGHTS False turns it off
    from eggfuse.ir.ops.matmul_kernel import matmul_tile

    shapes = ((3, 64, 96), (12, 64, 96), (640, 16, 8188), (1000, 16, 8192))
    for (m, k, n), rows in zip(shapes, (3, 4, 128, 256), strict=True):  # 12 rows: GEMV blocks of 4 (GEMV_ROW_BLOCK)
        g = Graph()
        g.set_outputs([g.add_node("MatMulBT", (g.input("x", (m, k)), g.parameter("w", (n, k))))])
        plan = _lower(g, device, True)
        tile = matmul_tile(m, k, n, "BT")
        assert tile.bm == rows and tile.gemv == (m < 128)
        assert not any(b.name == "w.T" for b in plan.buffers) and "_BT_" in plan.dispatches[0].kernel
    g = _product("MatMulBT", 37, 67, 72)
    monkeypatch.setattr(layout, "TRANSPOSE_WEIGHTS", False)
    assert "_BT_" in lower_for(g, device).dispatches[0].kernel


def test_a_session_sharing_weights_reads_them_as_stored(device, tmp_path, monkeypatch):
    # eggfuse.compile with share: the other session's buffers are the weights as stored, so no transposed copy
    # (eggfuse generate's prefill plans share the decode plan's weights); the compile cache keys the choice
    from eggfuse.pipeline import compile as compile_graph

    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path))
    g = _product("FusedMatMul", 37, 67, 72)
    inputs, params = _leaves(g, 3)
    first = compile_graph(g, params, device=device, fuse=False)
    assert any(b.name == "w.T" for b in first.plan.buffers) and first.cache == "miss"
    stored = compile_graph(g, params, device=device, fuse=False, transpose_weights=False)
    assert stored.cache == "miss" and not any(b.name.endswith(".T") for b in stored.plan.buffers)
    shared = compile_graph(g, params, device=device, fuse=False, share=stored.session)
    assert shared.cache == "hit" and shared.plan.buffers[shared.plan.parameters["w"]].kind == "parameter"
    for a, b in zip(first.session.run(inputs), shared.session.run(inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert compile_graph(g, params, device=device, fuse=False).cache == "hit"


def test_a_weight_stored_k_by_n_on_128_row_tiles_is_read_as_n_by_k(device):
    # the other direction: MatMul (B [K, N], an exporter's layout) on 128x128 tiles reads a copy stored [N, K]
    from eggfuse.ir.ops.matmul_kernel import matmul_tile

    for op in ("MatMul", "FusedMatMul"):
        g = Graph()
        x, w = g.input("x", (640, 16)), g.parameter("w", (16, 8188))  # N below WIDE_HEAD_MIN_N: 128x128
        y = g.add_node("MatMul", (x, w)) if op == "MatMul" else g.add_node(
            op, (x, w, g.parameter("bias", (8188,))), variant="", epilogue=("bias",))
        g.set_outputs([y])
        assert matmul_tile(640, 16, 8188, "").bm == 128
        kn, got = _run(g, device, True)
        _, want = _run(g, device, False)
        (t,) = [b for b in kn.plan.buffers if b.name == "w.T"]
        assert t.shape == (8188, 16) and "_BT_128x128x8_" in kn.plan.dispatches[0].kernel
        assert kn.plan.dispatches[0].op == op
        np.testing.assert_array_equal(got[0], want[0])


def test_a_forced_tile_decides_the_layout(device):
    # under matmul_choice (bench/matmul.py --sweep, bench/plan_variants.py) the layout follows the tile the product
    # takes, not matmul_tile's pick: a 128-row tile forced on a [N, K] weight whose pick has 64 rows keeps it
    # [N, K], a 64-row tile forced on a [K, N] weight whose pick has 128 rows reads it [K, N] as stored
    from eggfuse.ir.ops.matmul_kernel import MATMUL_TILES_ALL, matmul_choice, matmul_tile

    tiles = {t.name: t for t in MATMUL_TILES_ALL}
    for op, (m, k, n), forced, flipped in (("MatMulBT", (256, 64, 256), "128x128x8", False),
                                           ("MatMulBT", (256, 64, 256), "64x64x16", True),
                                           ("MatMul", (640, 16, 8188), "64x64x16", False),
                                           ("MatMul", (640, 16, 8188), "128x128x8", True)):
        g = Graph()
        shape = (n, k) if op == "MatMulBT" else (k, n)
        g.set_outputs([g.add_node(op, (g.input("x", (m, k)), g.parameter("w", shape)))])
        assert (matmul_tile(m, k, n, "BT" if op == "MatMulBT" else "").bm == 128) == (op == "MatMul")
        with matmul_choice(tile=tiles[forced], splits=1):
            plan = _lower(g, device, True)
        assert any(b.name == "w.T" for b in plan.buffers) == flipped, (op, forced)
        assert plan.dispatches[0].kernel.startswith(f"matmul_{'BT_' if forced.startswith('128') else ''}{forced}_")


def test_weights_kept_as_stored_output_and_rows_not_of_quads(device):
    # a weight that is also a graph output keeps its one buffer; so does one whose other layout's rows would
    # not load as quads (N not a multiple of 4 for a weight stored [N, K])
    g = Graph()
    w = g.parameter("w", (70, 64))
    g.set_outputs([g.add_node("MatMulBT", (g.input("x", (100, 64)), w)), w])
    assert not any(b.name == "w.T" for b in _lower(g, device, True).buffers)
    g = Graph()
    g.set_outputs([g.add_node("MatMulBT", (g.input("x", (100, 64)), g.parameter("w", (70, 64))))])
    assert "_BT_" in _lower(g, device, True).dispatches[0].kernel
    g = Graph()
    g.set_outputs([g.add_node("MatMulBT", (g.input("x", (100, 64)), g.parameter("w", (72, 64))))])
    assert "_BT_" not in _lower(g, device, True).dispatches[0].kernel


def test_sharing_with_a_session_that_holds_a_weight_only_transposed_is_refused(device):
    # A reads w only through its transposed copy; B reads w as stored (a GEMV of 2 rows): B cannot bind A's w, so
    # it is refused with what to do, rather than uploading a second copy that A's writes would not reach
    from eggfuse.ir import InputError
    from eggfuse.pipeline import compile as compile_graph

    g = _product("MatMulBT", 37, 64, 72)
    inputs, params = _leaves(g, 4)
    a = compile_graph(g, params, device=device, fuse=False, cache=False)
    assert a.plan.buffers[a.plan.parameters["w"]].kind == "host"
    decode = Graph()
    decode.set_outputs([decode.add_node("MatMulBT", (decode.input("x", (2, 64)), decode.parameter("w", (72, 64))))])
    with pytest.raises(InputError, match="parameter 'w': the shared session holds it only transposed"):
        compile_graph(decode, {}, device=device, fuse=False, cache=False, share=a.session)
    # compiled with transpose_weights=False, A holds w as stored, and the decode session shares it
    a = compile_graph(g, params, device=device, fuse=False, cache=False, transpose_weights=False)
    b = compile_graph(decode, {}, device=device, fuse=False, cache=False, share=a.session)
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(b.session.run({"x": x})[0], x @ params["w"].T, rtol=1e-5, atol=1e-5)
    a.session.write_parameter("w", params["w"] * 2)
    np.testing.assert_allclose(b.session.run({"x": x})[0], x @ (2 * params["w"]).T, rtol=1e-5, atol=1e-5)
    # a plan lowered with its own transposed copy refuses a session holding the weight as stored
    with pytest.raises(InputError, match="this plan reads them transposed"):
        Session(_lower(g, device, True), {}, device=device, share=a.session)


def test_a_kernel_builders_error_names_the_graphs_node(device):
    # an error raised while building a product on a transposed weight names the node as the graph has it
    from eggfuse.ir.errors import LoweringError
    from eggfuse.lowering import lower

    g = _product("MatMulBT", 37, 67, 72)
    with pytest.raises(LoweringError, match=r"node 2 MatMulBT\(f32\[37,67\], f32\[72,67\]\)"):
        lower(g, {"max-compute-workgroup-storage-size": 1024}, transpose_weights=True)


def test_a_transposed_weight_is_read_written_and_not_kept_on_the_host(device):
    # the session keeps no host copy of a weight it only holds transposed: read_parameter reads the device's copy
    # back, write_parameter repacks it from the value written
    g = _product("FusedMatMul", 37, 67, 72)
    inputs, params = _leaves(g, 6)
    s = Session(_lower(g, device, True), params, device=device)
    assert "w" not in s._packed_sources
    np.testing.assert_array_equal(s.read_parameter("w"), params["w"])
    w2 = (params["w"] * -0.5).astype(np.float32)
    s.write_parameter("w", w2)
    assert "w" not in s._packed_sources
    np.testing.assert_array_equal(s.read_parameter("w"), w2)
    want = evaluate(g, inputs, {**params, "w": w2})[0]
    np.testing.assert_allclose(s.run(inputs)[0], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_a_weight_the_shared_session_packs_with_others_is_uploaded_as_before(device):
    # a shared session holding w0 only inside a packed weight (Q/K/V-like, not transposed): this session uploads
    # its own w0, as before the layouts; only a weight held transposed alone is refused
    a = Graph()
    w = [a.parameter(f"w{i}", (8, 64)) for i in range(2)]
    a.set_outputs([a.add_node("MatMulBT", (a.input("x", (2, 64)), a.add_node("Concat", w, axis=0)))])
    _, params = _leaves(a, 7)
    first = Session(_lower(a, device, True), params, device=device)
    assert first.plan.buffers[first.plan.parameters["w0"]].kind == "host"
    b = Graph()
    b.set_outputs([b.add_node("MatMulBT", (b.input("x", (2, 64)), b.parameter("w0", (8, 64))))])
    second = Session(_lower(b, device, True), {"w0": params["w0"]}, device=device, share=first)
    x = np.random.default_rng(8).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(second.run({"x": x})[0], x @ params["w0"].T, rtol=1e-5, atol=1e-5)
