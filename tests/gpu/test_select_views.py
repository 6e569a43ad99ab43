"""Select, a view of one part of a tensor along its first axis (ir/ops/shape.py): lowered as a window of the
buffer that holds the tensor (lowering/plan.py ``_view_buffer``, ``BufferSpec.window``), bound at the part's
offset, with no dispatch. Parts of inputs, parameters and intermediates, a part of a part, a part as a graph
output, and the intermediate's allocation kept alive for its parts' readers (``share_storage_of``), against the
numpy reference (``eggfuse.ir.evaluate``)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from eggfuse import cache
from eggfuse.ir import DType, Graph, GraphError, LoweringError, evaluate
from eggfuse.lowering import lower
from eggfuse.runtime import Session


def _check(g: Graph, feeds: dict, params: dict, device) -> None:
    plan = lower(g, dict(device.limits))
    got = Session(plan, params, device=device).run(feeds)
    want = evaluate(g, feeds, params)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return plan


def _storage_spans(plan) -> None:
    # every shared allocation's members live (first .. last dispatch binding them or a window of them) apart
    whole = {b.index: b.window[0] if b.window else b.index for b in plan.buffers}
    span: dict[int, list[int]] = {}
    for i, d in enumerate(plan.dispatches):
        for b in d.bindings:
            span.setdefault(whole[b], [i, i])[1] = i
    by_alloc: dict[int, list[int]] = {}
    for b, a in plan.storage.items():
        by_alloc.setdefault(a, []).append(b)
    for members in by_alloc.values():
        spans = sorted(span[b] for b in members)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end < start, f"overlapping lifetimes in one allocation: {spans}"


def test_parts_of_an_input_and_a_parameter_and_a_part_of_a_part(device):
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [3, 8, 8])  # parts of 256 bytes
    w = g.parameter("w", [2, 3, 64])  # parts of 768 bytes, their parts of 256
    y = g.add(g.add_node("Select", (x,), index=2), g.add_node("Select", (x,), index=0))
    inner = g.add_node("Select", (g.add_node("Select", (w,), index=1),), index=2)  # bytes 1280 .. 1536 of w
    out = g.add(g.reshape(y, [64]), inner)
    g.set_outputs([out])
    feeds = {"x": rng.standard_normal((3, 8, 8)).astype(np.float32)}
    params = {"w": rng.standard_normal((2, 3, 64)).astype(np.float32)}
    plan = _check(g, feeds, params, device)
    bound = {b for d in plan.dispatches for b in d.bindings}
    windows = sorted(plan.buffers[b].window for b in bound if plan.buffers[b].window)
    assert windows == [(plan.inputs["x"], 0), (plan.inputs["x"], 512), (plan.parameters["w"], 1280)], windows
    assert len(plan.dispatches) == 2  # the two adds: the views dispatch nothing


def test_an_intermediate_lives_as_long_as_its_parts_are_read(device):
    # the parts of t are read at the start and at the end of a chain whose intermediates would take its
    # allocation if its last reader were taken to be the first
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input("x", [2, 4, 16])
    t = g.tanh(x)
    first = g.add_node("Select", (t,), index=0)
    h = g.neg(first)
    for _ in range(4):
        h = g.add(g.tanh(h), g.mul(h, h))
    g.set_outputs([g.add(h, g.add_node("Select", (t,), index=1))])
    plan = _check(g, {"x": rng.standard_normal((2, 4, 16)).astype(np.float32)}, {}, device)
    _storage_spans(plan)
    assert len(plan.storage_sizes) < len(plan.storage)  # some allocations are shared


def test_a_part_as_a_graph_output_is_read_back_from_its_offset(device):
    rng = np.random.default_rng(2)
    g = Graph()
    t = g.tanh(g.input("x", [2, 5, 64]))
    g.set_outputs([g.add_node("Select", (t,), index=1), g.neg(g.add_node("Select", (t,), index=0))])
    plan = _check(g, {"x": rng.standard_normal((2, 5, 64)).astype(np.float32)}, {}, device)
    out = plan.buffers[plan.outputs[0]]
    assert out.kind == "window" and out.window[1] == 5 * 64 * 4
    assert out.window[0] not in plan.storage  # the whole intermediate keeps a buffer of its own
    back = cache.decode_plan(json.loads(json.dumps(cache.encode_plan(plan))), g)
    assert back.buffers == plan.buffers
    bad = json.loads(json.dumps(cache.encode_plan(plan)))
    bad["buffers"][plan.outputs[0]][7] = [plan.outputs[1], 0]  # a window of a buffer that is not the value's
    with pytest.raises(cache.CorruptEntry, match="not a window of a weight of the plan, nor a view of a value"):
        cache.decode_plan(bad, g)


@pytest.mark.parametrize("shape, index, message", [
    ([2, 3, 5], 1, r"a part of f32\[2,3,5\] is 60 bytes, not a multiple of 256 .* take other parts with Slice"),
    ([2, 64], 2, r"index 2 is outside the input's 2 parts"),
    ([64], 0, r"at least 2 dimensions"),
])
def test_select_refuses_parts_it_cannot_view(shape, index, message):
    g = Graph()
    x = g.input("x", shape)
    with pytest.raises(GraphError, match=message):
        g.add_node("Select", (x,), index=index)


def test_an_in_place_update_of_a_part_of_an_input_runs(device):
    # CacheWrite into part 1 of an input: the input keeps a buffer of its own (a buffer written in place is not
    # packed with the inputs one dispatch reads), so the dispatch does not bind one buffer read-only and writable
    rng = np.random.default_rng(3)
    g = Graph()
    c = g.input("c", [2, 4, 64])
    part = g.add_node("Select", (c,), index=1)
    g.set_outputs([g.add_node("CacheWrite", (part, g.input("new", [1, 64]), g.input("pos", [1], DType.U32)))])
    _check(g, {"c": rng.standard_normal((2, 4, 64)).astype(np.float32),
               "new": rng.standard_normal((1, 64)).astype(np.float32), "pos": np.array([2], np.uint32)}, {}, device)


@pytest.mark.parametrize("through", ["Select", "Identity"])
def test_a_dispatch_that_writes_a_buffer_it_also_reads_is_refused_by_name(through):
    # SgdUpdate of part 1 of p by part 0 of p (or of p by a reshape of p): one buffer read and written by one
    # dispatch, which WebGPU refuses; lowering names the node and the parameter instead
    g = Graph()
    p = g.parameter("p", [2, 64])
    if through == "Select":
        update = (g.add_node("Select", (p,), index=1), g.add_node("Select", (p,), index=0))
    else:
        update = (p, g.reshape(p, [2, 64]))
    g.set_outputs([g.add_node("SgdUpdate", update, lr=0.5)])
    with pytest.raises(LoweringError, match=r"node \d+ SgdUpdate\(.*\) -> f32\[.*\] writes parameter 'p' "
                                            r"\(f32\[2,64\]\) and reads it again in the same dispatch .* keep the "
                                            r"value it reads in a tensor"):
        lower(g)


def test_a_part_of_an_in_place_update_and_a_part_of_a_large_weight(device):
    # a Select of a reshape of CacheWrite's value (a window of the state's buffer) survives the compile cache's
    # check; a Gather of a part of a weight larger than a binding reads it through windows of the weight's buffer
    rng = np.random.default_rng(4)
    g = Graph()
    w = g.add_node("CacheWrite", (g.state("kv", [4, 64]), g.input("new", [1, 64]), g.input("pos", [1], DType.U32)))
    g.set_outputs([g.add_node("Select", (g.reshape(w, [2, 2, 64]),), index=1)])
    plan = lower(g, dict(device.limits))
    assert cache.decode_plan(json.loads(json.dumps(cache.encode_plan(plan))), g).buffers == plan.buffers

    g = Graph()
    table = g.parameter("w", [2, 304, 8])  # parts of 9,728 bytes, read through windows of at most 2,048
    g.set_outputs([g.add_node("Gather", (g.add_node("Select", (table,), index=1), g.input("ids", [5], DType.I32)),
                              axis=0)])
    params = {"w": rng.standard_normal((2, 304, 8)).astype(np.float32)}
    feeds = {"ids": np.array([0, 5, 303, 100, -1], np.int32)}
    plan = lower(g, {**dict(device.limits), "max-storage-buffer-binding-size": 2048})
    starts = sorted(b.window[1] for b in plan.buffers if b.kind == "window" and b.node == g.nodes[table].id)
    assert starts[0] == 9728 and len(starts) == 5, starts
    np.testing.assert_array_equal(Session(plan, params, device=device).run(feeds)[0], evaluate(g, feeds, params)[0])


def test_computed_indices_read_in_parts_by_tables_of_different_sizes_run(device):
    # indices the graph computes are not checked at run time (a kernel clamps them), so parts of them may index
    # tables of different sizes
    rng = np.random.default_rng(5)
    g = Graph()
    ids = g.add(g.input("ids", [2, 64], DType.I32), g.constant(np.zeros((), np.int32), shape=(), dtype=DType.I32))
    outs = [g.add_node("Gather", (g.parameter(f"t{i}", [rows, 8]), g.add_node("Select", (ids,), index=i)), axis=0)
            for i, rows in enumerate((10, 100))]
    g.set_outputs(outs)
    feeds = {"ids": np.stack([rng.integers(0, 10, 64), rng.integers(0, 100, 64)]).astype(np.int32)}
    params = {"t0": rng.standard_normal((10, 8)).astype(np.float32),
              "t1": rng.standard_normal((100, 8)).astype(np.float32)}
    _check(g, feeds, params, device)
