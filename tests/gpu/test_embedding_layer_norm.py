"""EmbeddingSumLayerNorm (ir/ops/norms.py): the ``norm_fusion`` rules find a BERT embedding layer
(LayerNorm of a sum of two or three Embedding lookups) in a graph, and the fused plan gives the numpy
reference's numbers (``eggfuse.ir.evaluate`` of the unfused graph): in one dispatch, and in two where
the device binds too few storage buffers for one; with the sum also a graph output, indices shared
by two tables, odd sizes, and a bad index refused before the run. An exporter's form (Gathers by i32
ids, negative and out-of-range ones among them, and the position rows folded into one [1, S, H]
tensor) is the op with a positions table, in one dispatch."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import run_optimised  # tests/op_table.py

from eggfuse.ir import DType, Graph, InputError, evaluate
from eggfuse.ir.errors import IndexRangeError, LoweringError
from eggfuse.lowering import lower
from eggfuse.pipeline import compile as compile_graph
from eggfuse.pipeline import precision_rulesets
from eggfuse.rewrites import optimize, random_feeds
from eggfuse.runtime import Session


def _bert_embeddings(t=23, h=37, vocabs=(50, 19, 2), shared=False, sum_out=False, grouping="(2)+1") -> Graph:
    # word + position + token type rows, added as BERT does ((E0 + E1) + E2) or grouped the other way,
    # then LayerNorm; ``shared``: the position table indexed by the word ids too
    g = Graph()
    ids = [g.input(f"ids{i}", [t], DType.U32) for i in range(len(vocabs))]
    if shared:
        ids[1] = ids[0]
    e = [g.embedding(ids[i], g.parameter(f"table{i}", [v, h])) for i, v in enumerate(vocabs)]
    x = g.add(g.add(e[0], e[1]), e[2]) if grouping == "(2)+1" else g.add(e[0], g.add(e[1], e[2]))
    y = g.layer_norm(x, g.parameter("w", [h]), g.parameter("b", [h]), 1e-12)
    g.set_outputs([y, x] if sum_out else [y])
    return g


def _feeds(g: Graph, seed: int = 3):
    inputs, params = random_feeds(g, seed=seed)
    for name, v in params.items():  # tables and affine parameters of unit scale
        params[name] = np.random.default_rng(seed).standard_normal(v.shape).astype(np.float32)
    return inputs, params


@pytest.mark.parametrize("grouping", ["(2)+1", "1+(2)"])
@pytest.mark.parametrize("shared", [False, True], ids=["own-ids", "shared-ids"])
def test_the_embedding_layer_is_one_dispatch_with_the_references_numbers(device, grouping, shared):
    g = _bert_embeddings(shared=shared, grouping=grouping)
    inputs, params = _feeds(g)
    opt, _ = run_optimised(g, device, inputs, params)
    assert [n.op for n in opt.nodes if n.op not in ("Input", "Parameter")] == ["EmbeddingSumLayerNorm"]
    plan = lower(opt, device.limits)
    assert [d.kernel.split("+")[0] for d in plan.dispatches] == ["embedding3_layer_norm"]


def test_a_sum_that_is_also_an_output_is_kept(device):
    g = _bert_embeddings(sum_out=True)
    inputs, params = _feeds(g)
    opt, (y, x) = run_optimised(g, device, inputs, params)  # both outputs checked against the reference
    ops = [n.op for n in opt.live_nodes()]
    assert "EmbeddingSumLayerNorm" in ops or "LayerNorm" in ops
    assert x.shape == y.shape == (23, 37)


def test_two_tables_through_the_rewrites(device):
    g = Graph()
    e = [g.embedding(g.input(f"ids{i}", [15], DType.U32), g.parameter(f"table{i}", [v, 40])) for i, v in
         enumerate((33, 4))]
    g.set_outputs([g.layer_norm(g.add(e[0], e[1]), g.parameter("w", [40]), g.parameter("b", [40]), 1e-5)])
    inputs, params = _feeds(g)
    opt, _ = run_optimised(g, device, inputs, params)
    assert [n.op for n in opt.nodes if n.op not in ("Input", "Parameter")] == ["EmbeddingSumLayerNorm"]
    # where the device binds 6 (the one dispatch binds 7): the first table's rows summed, then the LayerNorm with
    # the second's; below that, the second dispatch's 6 are refused with the limit named
    plan = lower(opt, {**device.limits, "max-storage-buffers-per-shader-stage": 6})
    assert [d.kernel.removesuffix("+sg") for d in plan.dispatches] == ["embedding1_sum", "embedding1_add_layer_norm"]
    (got,) = Session(plan, params, device=device).run(inputs)
    (want,) = evaluate(g, inputs, params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(LoweringError, match="StorageBuffersPerShaderStage = 5 exceeded: kernel embedding1_add_layer_"):
        lower(opt, {**device.limits, "max-storage-buffers-per-shader-stage": 5})


@pytest.mark.parametrize("broadcast", ["one-row", "one-column"])
def test_an_add_that_broadcasts_is_left_alone(device, broadcast):
    # LayerNorm(E0 + E1) where E1 is one row [1, H] (or its table one column, [T, 1]) broadcast by the Add:
    # not a sum of rows of one shape, so no EmbeddingSumLayerNorm, and the graph still runs right
    g = Graph()
    e0 = g.embedding(g.input("ids0", [6], DType.U32), g.parameter("table0", [10, 8]))
    rows, cols = (1, 8) if broadcast == "one-row" else (6, 1)
    ids1 = g.input("ids1", [rows], DType.U32)
    e1 = g.embedding(ids1, g.parameter("table1", [3, cols]))
    g.set_outputs([g.layer_norm(g.add(e0, e1), g.parameter("w", [8]), g.parameter("b", [8]), 1e-5)])
    inputs, params = _feeds(g)
    opt, _ = run_optimised(g, device, inputs, params)
    assert "EmbeddingSumLayerNorm" not in [n.op for n in opt.live_nodes()]


def _rounded(params: dict) -> dict:
    # what precision f16 stores: the tables (2-D) rounded to float16
    return {k: v.astype(np.float16).astype(np.float32) if v.ndim == 2 else v for k, v in params.items()}


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_three_tables_take_two_dispatches_where_eight_storage_buffers_are_bound_at_most(device, precision):
    g = _bert_embeddings(t=9, h=320, vocabs=(7, 5, 3))  # rows longer than the workgroup, of whole f16 blocks
    inputs, params = _feeds(g, seed=5)
    opt = optimize(g, rulesets=precision_rulesets(precision))[0]
    limited = {**device.limits, "max-storage-buffers-per-shader-stage": 8}
    plan = lower(opt, limited)
    tag = "" if precision == "f32" else "_f16"
    assert [d.kernel.split("+")[0] for d in plan.dispatches] == [f"embedding2{tag}_sum",
                                                                 f"embedding1{tag}_add_layer_norm"]
    assert all(len(d.bindings) <= 8 for d in plan.dispatches)
    (got,) = Session(plan, params, device=device).run(inputs)
    (want,) = evaluate(g, inputs, params if precision == "f32" else _rounded(params))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_precision_f16_reads_the_tables_as_halves_in_one_dispatch(device):
    g = _bert_embeddings(t=21, h=64, vocabs=(40, 9, 2))
    inputs, params = _feeds(g, seed=7)
    compiled = compile_graph(g, params, device=device, cache=False, precision="f16")
    assert [d.kernel.split("+")[0] for d in compiled.plan.dispatches] == ["embedding3_f16_layer_norm"]
    halved = sum(v.nbytes // (2 if v.ndim == 2 else 1) for v in params.values())  # the tables as halves
    assert compiled.plan.memory()["weights_bytes"] == halved
    (got,) = compiled.run(inputs)
    (want,) = evaluate(g, inputs, _rounded(params))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_an_index_past_a_table_is_refused_with_its_input_named(device):
    g = _bert_embeddings()
    inputs, params = _feeds(g)
    plan = lower(optimize(g)[0], device.limits)
    session = Session(plan, params, device=device)
    bad = {**inputs, "ids2": np.full(23, 2, np.uint32)}  # the token type table has 2 rows
    with pytest.raises(InputError, match=r"input 'ids2': index 2 out of range for the 2 rows that "
                                         r"EmbeddingSumLayerNorm \(node \d+\) of parameter '\w+' f32\[2,\d+\] indexes "
                                         r"with it; give indices below 2"):
        session.run(bad)
    assert (bad["ids2"] == 2).all()  # nothing passed in was changed
    (got,) = session.run(inputs)  # and the session still runs
    np.testing.assert_allclose(got, evaluate(g, inputs, params)[0], rtol=1e-4, atol=1e-4)
    # a negative id (or one from 2^32) was "indices must lie in [0, 2^32)", naming neither op nor table
    for ids, shown in ((np.r_[-1, np.zeros(22, np.int64)], "-1"), (np.r_[2**32 + 1, np.zeros(22, np.int64)],
                                                                       "4294967297")):
        with pytest.raises(IndexRangeError, match=rf"input 'ids2': index {shown} out of range for the 2 rows that "
                                                  r"EmbeddingSumLayerNorm \(node \d+\) of parameter '\w+' f32\[2,\d+\] "
                                                  r"indexes with it; give indices from 0 to 1"):
            session.run({**inputs, "ids2": ids})


def _exported_embeddings(pairs: int, flat: bool, b: int = 3, s: int = 7, h: int = 37, residual: bool = False) -> Graph:
    # an exporter's BERT embeddings: Gathers of the word (and token type) tables by i32 ids [B, S], the
    # folded position rows [1, S, H] added last, then LayerNorm over the [B S, H] view (flat) or [B, S, H];
    # the second table's ids are computed (ids1 + 1), so the runtime cannot check them and the kernel clamps
    g = Graph()
    ids = [g.input("ids0", [b, s], DType.I32)]
    if pairs == 2:
        one = g.constant(np.array(1, dtype=np.int32), shape=(), dtype=DType.I32)
        ids.append(g.add(g.input("ids1", [b, s], DType.I32), one))
    rows = [g.add_node("Gather", (g.parameter(f"table{i}", [v, h]), ids[i]), axis=0)
            for i, v in enumerate((50, 2)[:pairs])]
    x = g.add(rows[0], rows[1]) if pairs == 2 else rows[0]
    x = g.add(x, g.parameter("pos", [1, s, h]))
    y = g.layer_norm(g.reshape(x, [b * s, h]) if flat else x, g.parameter("w", [h]), g.parameter("b", [h]), 1e-12)
    # residual: the sum is read again, as a pre-LN transformer's first residual add reads it (GPT-2)
    g.set_outputs([g.add(y, g.reshape(x, [b * s, h]) if flat else x) if residual else y])
    return g


@pytest.mark.parametrize("flat", [True, False], ids=["rows", "3d"])
@pytest.mark.parametrize("pairs", [1, 2])
def test_an_exporters_gathers_and_position_rows_are_one_dispatch(device, pairs, flat):
    g = _exported_embeddings(pairs, flat)
    inputs, params = _feeds(g)
    rng = np.random.default_rng(11)
    # Gather's indices: negative ones count from the end; computed ones outside the table are clamped
    inputs["ids0"] = rng.integers(-50, 50, (3, 7)).astype(np.int32)
    if pairs == 2:
        inputs["ids1"] = rng.choice([-4, -2, -1, 0, 1, 2], (3, 7)).astype(np.int32)  # + 1: -3 and 3 clamped
    opt, (y,) = run_optimised(g, device, inputs, params)  # checked against the unfused graph's reference
    ops = sorted(n.op for n in opt.live_nodes() if opt.dispatches(n))
    assert ops == ["EmbeddingSumLayerNorm"] if pairs == 1 else ops == ["Add", "EmbeddingSumLayerNorm"]  # ids1 + 1
    plan = lower(opt, device.limits)
    assert plan.dispatches[-1].kernel.split("+")[0] == f"embedding{pairs}_i32_positions_layer_norm"
    assert y.shape == ((21, 37) if flat else (3, 7, 37))


@pytest.mark.parametrize("flat", [True, False], ids=["rows", "3d"])
@pytest.mark.parametrize("pairs, h", [(1, 32), (2, 32), (1, 37)])
def test_embeddings_whose_sum_a_residual_reads_store_it_with_their_layer_norm(device, pairs, h, flat):
    # GPT-2's first block: the sum of the token and position rows is normalised and read again by the residual
    # add; one dispatch stores both (EmbeddingSumLayerNormPair, read through Select views) where [B S, H] f32 is
    # a multiple of 256 bytes (2 x 4 x 32), else the sum and its norm are apart (2 x 4 x 37)
    g = _exported_embeddings(pairs, flat, b=2, s=4, h=h, residual=True)
    inputs, params = _feeds(g)
    inputs["ids0"] = np.random.default_rng(13).integers(-50, 50, (2, 4)).astype(np.int32)
    if pairs == 2:
        inputs["ids1"] = np.random.default_rng(14).choice([-2, -1, 0], (2, 4)).astype(np.int32)
    opt, _ = run_optimised(g, device, inputs, params)  # checked against the unfused graph's reference
    ops = [n.op for n in opt.live_nodes()]
    assert ("EmbeddingSumLayerNormPair" in ops) == (h == 32) and ("Select" in ops) == (h == 32), ops
    if h == 32:
        kernels = [d.kernel.split("+")[0] for d in lower(opt, device.limits).dispatches]
        assert f"embedding{pairs}_i32_positions_layer_norm_pair" in kernels, kernels


@pytest.mark.parametrize("pairs", [1, 2])
def test_an_exporters_embeddings_in_f16_read_halves_through_i32_ids(device, pairs):
    # precision f16: the Gathers' tables become halves (ToF16), read by the one kernel through the i32 ids
    # (negative ones from the end), the positions table f32; against the unfused graph on rounded tables
    g = _exported_embeddings(pairs, True, h=64)
    inputs, params = _feeds(g)
    rng = np.random.default_rng(12)
    inputs["ids0"] = rng.integers(-50, 50, (3, 7)).astype(np.int32)
    if pairs == 2:
        inputs["ids1"] = rng.choice([-2, -1, 0], (3, 7)).astype(np.int32)
    compiled = compile_graph(g, params, device=device, cache=False, precision="f16")
    assert compiled.plan.dispatches[-1].kernel.split("+")[0] == f"embedding{pairs}_f16_i32_positions_layer_norm"
    assert compiled.f16_weights == [f"table{i}" for i in range(pairs)]
    (got,) = compiled.run(inputs)
    rounded = {n: a.astype(np.float16).astype(np.float32) if n.startswith("table") else a for n, a in params.items()}
    (want,) = evaluate(g, inputs, rounded)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_position_rows_of_another_sequence_length_are_left_alone(device):
    # position rows [2, 7, H], one set per sequence, are no table of positions: no EmbeddingSumLayerNorm
    g = Graph()
    x = g.add_node("Gather", (g.parameter("table0", [20, 8]), g.input("ids0", [2, 7], DType.I32)), axis=0)
    x = g.add(x, g.parameter("pos", [2, 7, 8]))
    g.set_outputs([g.layer_norm(g.reshape(x, [14, 8]), g.parameter("w", [8]), g.parameter("b", [8]), 1e-5)])
    inputs, params = _feeds(g)
    inputs["ids0"] = np.random.default_rng(2).integers(0, 20, (2, 7)).astype(np.int32)
    opt, _ = run_optimised(g, device, inputs, params)
    assert "EmbeddingSumLayerNorm" not in [n.op for n in opt.live_nodes()]


@pytest.mark.parametrize("bad", [50, -51])
def test_an_i32_id_outside_the_table_is_refused_with_its_input_named(device, bad):
    # ONNX makes a Gather index outside [-50, 50) an error (onnxruntime raises): so does the session, before the run
    g = _exported_embeddings(1, True)
    inputs, params = _feeds(g)
    inputs["ids0"] = np.zeros((3, 7), np.int32)
    session = Session(lower(optimize(g)[0], device.limits), params, device=device)
    session.run(inputs)
    inputs["ids0"][1, 3] = bad
    with pytest.raises(InputError, match=rf"input 'ids0': index {bad} out of range for the axis of 50 that "
                                         rf"\w+ \(node \d+\) of parameter '\w+' f32\[50,\d+\] .*from -50 to 49"):
        session.run(inputs)
