"""Gather from a table larger than one binding (maxStorageBufferBindingSize; GPT-2 small's f32 token table of
154 MB on lavapipe's 128 MiB): the kernel reads it through windows of the table's buffer, each a binding of its
own (ir/kernel.py Window, lowering/plan.py BufferSpec.window), against the numpy reference
(``eggfuse.ir.evaluate``) and, imported from ONNX, against onnxruntime. The limit is lowered here so that small
tables need windows; a window may end inside a row (every element picks its window)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from eggfuse import cache, pipeline
from eggfuse.ir import DType, Graph, LoweringError, evaluate
from eggfuse.ir.errors import DeviceLimitError
from eggfuse.ir.kernel import windows
from eggfuse.lowering import check_limits, lower
from eggfuse.runtime import Session

_ALIGN = 256


def _limits(binding: int) -> dict:
    return {"max-storage-buffer-binding-size": binding, "min-storage-buffer-offset-alignment": _ALIGN}


def _run(g: Graph, feeds: dict, params: dict, binding: int, device):
    plan = lower(g, _limits(binding))
    (want,) = evaluate(g, feeds, params)
    (got,) = Session(plan, params, device=device).run(feeds)
    np.testing.assert_array_equal(got, want)
    return plan


# (table shape, axis, ids shape, binding limit in bytes, table dtype): windows ending inside a row, the last one
# short; axis 1 of a 3-D table (every outer slice spans windows); i32 data; windows of exactly 16 rows
CASES = [((1000, 37), 0, (3, 5), 40960, DType.F32),
         ((301, 7), 0, (11,), 2048, DType.F32),
         ((3, 500, 9), 1, (2, 4), 16384, DType.F32),
         ((700, 13), 0, (6,), 8192, DType.I32),
         ((64, 64), 0, (5,), 4096, DType.F32)]


@pytest.mark.parametrize("shape, axis, ids, binding, dtype", CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-axis{c[1]}-{c[3]}B-{c[4].value}" for c in CASES])
def test_windowed_gather_matches_the_reference(shape, axis, ids, binding, dtype, device):
    g = Graph()
    w = g.parameter("w", list(shape), dtype)
    g.set_outputs([g.add_node("Gather", (w, g.input("ids", list(ids), DType.I32)), axis=axis)])
    rng = np.random.default_rng(0)
    table = (rng.standard_normal(shape).astype(np.float32) if dtype is DType.F32
             else rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int32))
    dim = shape[axis]
    feeds = {"ids": rng.integers(-dim, dim, ids).astype(np.int32)}
    feeds["ids"].flat[:2] = (dim - 1, -dim)  # the last row and the first, from the end
    plan = _run(g, feeds, {"w": table}, binding, device)
    parts = windows(table.nbytes, 4, _limits(binding))
    assert len(parts) > 1
    (d,) = plan.dispatches
    assert d.kernel == f"gather_{dtype.wgsl}_windows{len(parts)}"
    bound = [plan.buffers[i] for i in d.bindings[:-2]]
    assert [(b.kind, b.window[1], b.size_bytes) for b in bound] == [("window", off, size) for off, size in parts]
    assert all(b.window[0] == plan.parameters["w"] and b.size_bytes <= binding and b.window[1] % _ALIGN == 0
               for b in bound)
    assert plan.memory()["weights_bytes"] == table.nbytes  # the windows are the table's bytes, not copies


def test_windows_of_one_table_are_shared_and_a_whole_binding_of_it_is_refused(device):
    # two Gathers of one table (token and position rows of one table): the same windows; the table is uploaded
    # once and bound in windows only; another op binding it whole stays refused
    g = Graph()
    w = g.parameter("w", [500, 16])
    a = g.add_node("Gather", (w, g.input("i", [4], DType.I32)), axis=0)
    b = g.add_node("Gather", (w, g.input("j", [2, 3], DType.I32)), axis=0)
    g.set_outputs([a, b])
    rng = np.random.default_rng(1)
    table = rng.standard_normal((500, 16)).astype(np.float32)
    feeds = {"i": np.array([0, 499, -1, 250], np.int32), "j": rng.integers(0, 500, (2, 3)).astype(np.int32)}
    plan = lower(g, _limits(8192))
    windows_bound = [d.bindings[:-2] for d in plan.dispatches]
    assert len(windows_bound) == 2 and windows_bound[0] == windows_bound[1] and len(windows_bound[0]) == 4
    assert sum(b.kind == "window" for b in plan.buffers) == 4
    got = Session(plan, {"w": table}, device=device).run(feeds)
    for x, y in zip(got, evaluate(g, feeds, {"w": table}), strict=True):
        np.testing.assert_array_equal(x, y)
    g2 = Graph()
    w2 = g2.parameter("w", [500, 16])
    g2.set_outputs([g2.add_node("Gather", (w2, g2.input("i", [4], DType.I32)), axis=0),
                    g2.matmul(g2.input("x", [2, 500]), w2)])
    with pytest.raises(DeviceLimitError, match=r"maxStorageBufferBindingSize = 8192 exceeded: binding 1 of node \d+ "
                                               r"MatMul.*'w', f32\[500,16\]\) of 32000 bytes"):
        lower(g2, _limits(8192))


def test_more_windows_than_the_device_binds_are_refused_by_name():
    g = Graph()
    g.set_outputs([g.add_node("Gather", (g.parameter("w", [64, 64]), g.input("i", [4], DType.I32)), axis=0)])
    with pytest.raises(DeviceLimitError, match=r"maxStorageBuffersPerShaderStage = 8 exceeded: kernel "
                                               r"gather_f32_windows16 binds 18 storage buffers for node \d+ Gather.*; "
                                               r"'w' \(f32\[64,64\], 16384 bytes\) is read through 16 windows of up "
                                               r"to 1024 bytes \(the binding limit\); run on a device that binds "
                                               r"larger"):
        lower(g, _limits(1024))


def test_a_computed_table_too_large_for_a_binding_is_refused_by_name():
    g = Graph()
    table = g.relu(g.parameter("w", [500, 16]))
    g.set_outputs([g.add_node("Gather", (table, g.input("i", [4], DType.I32)), axis=0)])
    with pytest.raises(DeviceLimitError, match=r"maxStorageBufferBindingSize = 8192 exceeded: kernel "
                                               r"gather_f32_windows4 reads input 0 of node \d+ "
                                               r"Gather\(f32\[500,16\], i32\[4\]\).*"
                                               r"intermediate 'Relu%\d+' \(f32\[500,16\], 32000 bytes\).*only a "
                                               r"weight \(a parameter, a constant or one packed from parameters\)"):
        lower(g, _limits(8192))
    fed = Graph()  # a table fed at run time: give it as a parameter
    fed.set_outputs([fed.add_node("Gather", (fed.input("t", [500, 16]), fed.input("i", [4], DType.I32)), axis=0)])
    with pytest.raises(DeviceLimitError, match=r"input 't' \(f32\[500,16\], 32000 bytes\).*give it as a parameter"):
        lower(fed, _limits(8192))


def test_a_plan_whose_windows_the_device_cannot_bind_is_refused_and_the_cache_keeps_them():
    g = Graph()
    w = g.parameter("w", [500, 16])
    g.set_outputs([g.add_node("Gather", (w, g.input("i", [4], DType.I32)), axis=0)])
    plan = lower(g, _limits(8000))  # windows of 7936 bytes: a multiple of 256, not of 512
    with pytest.raises(DeviceLimitError, match=r"minStorageBufferOffsetAlignment = 512: buffer \d+ "
                                               r"\('w\[7936:15872\]'\) is a window of buffer 0 from byte 7936.*"
                                               r"lower it for this one"):
        check_limits(plan, {**_limits(8000), "min-storage-buffer-offset-alignment": 512})
    back = cache.decode_plan(json.loads(json.dumps(cache.encode_plan(plan))), g)
    assert back.buffers == plan.buffers and back.dispatches == plan.dispatches
    doc = json.loads(json.dumps(cache.encode_plan(plan)))
    for corrupt, message in (([len(doc["buffers"]), 0], "not a window of a weight"),  # of no buffer
                             ([1, 0], "not a window of a weight"),  # of the ids, an input
                             ([0, 31800], "not a window of a weight"),  # past the table's end
                             (None, "a window of nothing")):
        bad = json.loads(json.dumps(doc))
        bad["buffers"][-1][7] = corrupt
        with pytest.raises(cache.CorruptEntry, match=message):
            cache.decode_plan(bad, g)


def test_window_helper_covers_the_table_within_the_limit_at_aligned_offsets():
    for total, binding, align in ((154_389_504, 134_217_728, 32), (1000, 256, 256), (4, 4, 256), (10**6, 1000, 96)):
        parts = windows(total, 4, {"max-storage-buffer-binding-size": binding,
                                   "min-storage-buffer-offset-alignment": align})
        assert parts[0][0] == 0 and sum(size for _, size in parts) == total
        assert all(a + s == b for (a, s), (b, _) in zip(parts, parts[1:], strict=False))
        assert all(0 < s <= binding and a % align == 0 and a % 4 == 0 for a, s in parts)
    with pytest.raises(LoweringError, match=r"no window of a table of 1000 bytes fits: maxStorageBufferBindingSize = "
                                            r"100 bytes is less than the windows' step of 256 bytes"):
        windows(1000, 4, {"max-storage-buffer-binding-size": 100, "min-storage-buffer-offset-alignment": 256})


def test_an_onnx_token_table_past_the_binding_limit_runs_as_onnxruntime_does(monkeypatch, device):
    # GPT-2's embeddings as torch.onnx exports them (Gather of the token and position tables, Add, LayerNorm, the
    # first product) with the token table above the binding limit, the other weights below it
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(2)
    vocab, hidden, seq = 2000, 16, 5
    inits = {"wte": rng.standard_normal((vocab, hidden)).astype(np.float32),
             "wpe": rng.standard_normal((seq, hidden)).astype(np.float32),
             "pos": np.arange(seq, dtype=np.int64)[None], "gamma": rng.standard_normal(hidden).astype(np.float32),
             "beta": rng.standard_normal(hidden).astype(np.float32),
             "w": rng.standard_normal((hidden, 24)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], ["tok"]),
             helper.make_node("Gather", ["wpe", "pos"], ["posv"]),
             helper.make_node("Add", ["tok", "posv"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["x"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "embeddings", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [2, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, seq, 24])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    ids = rng.integers(0, vocab, (2, seq)).astype(np.int64)
    ids[0, 0], ids[1, -1] = vocab - 1, 0
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids})
    real = pipeline.lower
    monkeypatch.setattr(pipeline, "lower", lambda g, limits, **kw: real(g, {**limits, **_limits(32768)}, **kw))
    from eggfuse.onnx import Model

    m = Model(model, cache=False, device=device)
    (got,) = m.run({"input_ids": ids})
    assert float(np.abs(got - want).max()) <= 2e-5 * float(np.abs(want).max())
    plan = m.specialise({"input_ids": ids}).compiled.plan
    windowed = {plan.buffers[b.window[0]].name for b in plan.buffers if b.window}
    assert windowed == {"wte"} and any("_windows" in d.kernel for d in plan.dispatches), plan.summary()


@pytest.mark.parametrize("storage_buffers", [32, 8], ids=["one dispatch", "two dispatches"])
def test_embedding_sum_layer_norm_reads_a_large_table_through_windows(storage_buffers, device):
    # BERT's embeddings as the rules fuse them (word, position and token-type rows summed, then LayerNorm), the
    # word table past the limit: in one dispatch, or where the device binds 8 storage buffers, the first two
    # tables' sum, then the LayerNorm with the third; both with the windows of the word table
    g = Graph()
    h, rows = 24, 7
    w, bias = g.parameter("w", [h]), g.parameter("bias", [h])
    tables = [g.parameter(f"t{k}", [v, h]) for k, v in enumerate((900, 16, 3))]
    ids = [g.input(f"i{k}", [rows], DType.I32 if k == 0 else DType.U32) for k in range(3)]
    g.set_outputs([g.add_node("EmbeddingSumLayerNorm", (w, bias, ids[0], tables[0], ids[1], tables[1], ids[2],
                                                        tables[2]), eps=1e-5)])
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal(h).astype(np.float32), "bias": rng.standard_normal(h).astype(np.float32),
              **{f"t{k}": rng.standard_normal((v, h)).astype(np.float32) for k, v in enumerate((900, 16, 3))}}
    feeds = {"i0": np.array([899, -900, 0, 5, -1, 450, 7], np.int32),
             "i1": rng.integers(0, 16, rows).astype(np.uint32), "i2": rng.integers(0, 3, rows).astype(np.uint32)}
    plan = lower(g, {**_limits(32768), "max-storage-buffers-per-shader-stage": storage_buffers})
    assert [d.kernel.removesuffix("+sg") for d in plan.dispatches] == (
        ["embedding3_i32p0_windows_layer_norm"] if storage_buffers == 32
        else ["embedding2_i32p0_windows_sum", "embedding1_add_layer_norm"])
    assert sum(b.kind == "window" for b in plan.buffers) == 3  # 86,400 bytes of the word table in 3
    if storage_buffers == 8:  # the labels name the windowed input once
        assert plan.dispatches[0].label.endswith("part 1/2: inputs 2, 3 (3 windows), 4, 5 -> scratch")
    (want,) = evaluate(g, feeds, params)
    (got,) = Session(plan, params, device=device).run(feeds)
    assert float(np.abs(got - want).max()) <= 1e-5


def test_windows_of_a_constant_and_of_a_packed_table_follow_writes_and_shared_sessions(device):
    # a constant table; a table packed from two parameters (Concat: a derived parameter, repacked when one of its
    # sources is written); a second session sharing the first's buffers (share=), lowered without windows
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((300, 8)).astype(np.float32), rng.standard_normal((200, 8)).astype(np.float32)
    c = rng.integers(-2**31, 2**31 - 1, (700, 5), dtype=np.int32)
    g = Graph()
    table = g.concat([g.parameter("a", [300, 8]), g.parameter("b", [200, 8])], axis=0)
    i = g.input("i", [6], DType.I32)
    g.set_outputs([g.add_node("Gather", (table, i), axis=0),
                   g.add_node("Gather", (g.constant(c, dtype=DType.I32), i), axis=0)])
    plan = lower(g, _limits(4096))
    assert {plan.buffers[b_.window[0]].kind for b_ in plan.buffers if b_.window} == {"derived", "constant"}
    assert [plan.buffers[plan.parameters[n]].kind for n in ("a", "b")] == ["host", "host"]
    feeds = {"i": np.array([0, 499, -1, 299, 300, 17], np.int32)}
    session = Session(plan, {"a": a, "b": b}, device=device)
    for got, want in zip(session.run(feeds), evaluate(g, feeds, {"a": a, "b": b}), strict=True):
        np.testing.assert_array_equal(got, want)
    session.write_parameter("b", b + 1)  # repacks the derived table: the windows read the new rows
    (got, _) = session.run(feeds)
    np.testing.assert_array_equal(got, evaluate(g, feeds, {"a": a, "b": b + 1})[0])
    shared = Session(lower(g), {}, device=device, share=session)  # whole bindings of the same device buffers
    for x, y in zip(shared.run(feeds), session.run(feeds), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("pairs", [1, 2])
def test_embeddings_with_positions_split_where_windows_pass_the_binding_count(pairs, device):
    # BERT's layout (word and token-type tables, a positions table) and one table with positions, the word table
    # read through 3 windows on a device binding 8 storage buffers (or 6): the one dispatch would bind 10 (or 7),
    # so the word table's rows are summed first, then the LayerNorm with the rest and the positions
    g = Graph()
    h, seq, rows = 24, 7, 14
    w, bias = g.parameter("w", [h]), g.parameter("bias", [h])
    vocabs = (900, 2)[:pairs]
    tables = [g.parameter(f"t{k}", [v, h]) for k, v in enumerate(vocabs)]
    ids = [g.input(f"i{k}", [rows], DType.U32) for k in range(pairs)]
    flat = [x for k in range(pairs) for x in (ids[k], tables[k])]
    g.set_outputs([g.add_node("EmbeddingSumLayerNorm", (w, bias, *flat, g.parameter("pos", [seq, h])), eps=1e-5,
                              positions=seq)])
    rng = np.random.default_rng(6)
    params = {"w": rng.standard_normal(h).astype(np.float32), "bias": rng.standard_normal(h).astype(np.float32),
              "pos": rng.standard_normal((seq, h)).astype(np.float32),
              **{f"t{k}": rng.standard_normal((v, h)).astype(np.float32) for k, v in enumerate(vocabs)}}
    feeds = {f"i{k}": rng.integers(0, v, rows).astype(np.uint32) for k, v in enumerate(vocabs)}
    feeds["i0"][:2] = (899, 0)
    plan = lower(g, {**_limits(32768), "max-storage-buffers-per-shader-stage": 8 if pairs == 2 else 6})
    assert [d.kernel.removesuffix("+sg") for d in plan.dispatches] == [
        "embedding1_windows_sum", f"embedding{pairs - 1}_positions_add_layer_norm"]
    (want,) = evaluate(g, feeds, params)
    (got,) = Session(plan, params, device=device).run(feeds)
    assert float(np.abs(got - want).max()) <= 1e-5
