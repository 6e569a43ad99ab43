"""Session behaviour: uploads, validation, outputs that alias, limits, caching."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref

import numpy as np
import pytest
import wgpu

from eggfuse.ir import DeviceError, DType, Graph, InputError, LoweringError, evaluate
from eggfuse.ir.ops.matmul_kernel import MATMUL_TILES, matmul_choice
from eggfuse.lowering import lower
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
from eggfuse.runtime import device as device_module
from eggfuse.runtime import pipelines as pipeline_cache

RNG = np.random.default_rng(7)
TILE_32 = MATMUL_TILES[-1]  # 32x32x32


def _linear() -> Graph:
    g = Graph()
    x = g.input("x", [5, 6])
    w = g.parameter("w", [6, 4])
    b = g.parameter("b", [4])
    g.set_outputs([g.relu(g.bias_add(g.matmul(x, w), b))])
    return g


def _params():
    return {"w": RNG.standard_normal((6, 4)), "b": RNG.standard_normal(4)}


def _close(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_parameters_uploaded_once_and_runs_repeat(device):
    g, params = _linear(), _params()
    kept = {k: v.copy() for k, v in params.items()}
    s = Session(lower_for(g, device), params, device=device)
    params["w"][:] = 0.0  # the session holds its own copy from creation time
    for _ in range(2):
        x = {"x": RNG.standard_normal((5, 6))}
        _close(s.run(x), evaluate(g, x, kept))


def test_inputs_and_params_are_not_modified(device):
    g, params = _linear(), _params()
    x = RNG.standard_normal((5, 6))  # float64: converted, never written back
    x.setflags(write=False)
    before = (x.copy(), params["w"].copy())
    Session(lower_for(g, device), params, device=device).run({"x": x})
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(params["w"], before[1])
    assert x.dtype == np.float64


def _packed_mlp() -> Graph:
    # The SwiGLU weights packed side by side (a derived parameter), a Concat of the packed
    # weight (a dispatch) and a derived parameter that is an output.
    g = Graph()
    x = g.input("x", [5, 6])
    wg, wu, b = g.parameter("wg", [6, 4]), g.parameter("wu", [6, 4]), g.parameter("b", [1, 8])
    packed = g.concat([wg, wu], axis=1)
    h = g.swiglu_concat(g.bias_add(g.matmul(x, packed), b))
    g.set_outputs([h, g.concat([packed, b], axis=0), g.concat([wu, wg], axis=0)])
    return g


def test_derived_parameters_are_packed_once(device):
    g = _packed_mlp()
    plan = lower(g)
    assert len(plan.derived) == 2 and len(plan.dispatches) == g.dispatch_count() == 4
    assert {n: plan.buffers[i].kind for n, i in plan.parameters.items()} == {
        "wg": "host", "wu": "host", "b": "parameter"}
    w = RNG.standard_normal((4, 6))
    params = {"wg": w.T, "wu": RNG.standard_normal((6, 4)).astype(np.float32), "b": RNG.standard_normal((1, 8))}
    kept = {k: v.copy() for k, v in params.items()}
    for arr in params.values():
        arr.setflags(write=False)
    s = Session(plan, params, device=device)
    for _ in range(2):
        x = {"x": RNG.standard_normal((5, 6))}
        _close(s.run(x), evaluate(g, x, kept))
    for k, v in params.items():
        np.testing.assert_array_equal(v, kept[k])
        assert v.dtype == kept[k].dtype
    assert not params["wg"].flags.c_contiguous  # a transposed view was packed correctly


def test_state_starts_at_zero_on_reused_device_memory(device):
    # State tensors not given are not uploaded: WebGPU creates buffers zero-filled. Memory
    # that held other values first must not show through.
    for _ in range(3):
        dirty = device.create_buffer(size=1 << 20, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        device.queue.write_buffer(dirty, 0, np.full(1 << 18, 7.0, np.float32))
        device.queue.submit([])
        dirty.destroy()
    g = Graph()
    cache, rows = g.state("cache", [512, 256]), g.input("rows", [1, 256])
    written = g.add_node("CacheWrite", (cache, rows, g.input("pos", [1], DType.U32)))
    g.set_outputs([written])
    s = Session(lower_for(g, device), {}, device=device)
    np.testing.assert_array_equal(s.read_parameter("cache"), np.zeros((512, 256), np.float32))
    (out,) = s.run({"rows": np.ones((1, 256)), "pos": [3]})
    want = np.zeros((512, 256), np.float32)
    want[3] = 1.0
    np.testing.assert_array_equal(out, want)


def test_packed_sources_kept_as_given_only_when_no_one_can_write_them(device):
    # Parameters are uploaded without a copy; the sources of a derived parameter are kept for
    # write_parameter's repacking: as given when read-only down to read-only memory (a
    # memory map, bytes), else copied, so that a caller changing its array later changes nothing.
    g = Graph()
    a, b, c = g.parameter("a", [2, 3]), g.parameter("b", [1, 3]), g.parameter("c", [2, 3])
    g.set_outputs([g.matmul_bt(g.input("x", [1, 3]), g.concat([a, b, c], axis=0))])
    frozen = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(), np.float32).reshape(2, 3)
    mine = np.ones((1, 3), np.float32)
    c_t = np.full((3, 2), 2.0, np.float32).T  # not contiguous
    s = Session(lower_for(g, device), {"a": frozen, "b": mine, "c": c_t}, device=device)
    assert s._packed_sources["a"] is frozen and s._packed_sources["b"] is not mine
    mine[...] = 5.0  # after the session took it
    s.write_parameter("a", np.zeros((2, 3)))  # repacks from the kept b
    (y,) = s.run({"x": np.ones((1, 3))})
    np.testing.assert_array_equal(y, [[0.0, 0.0, 3.0, 6.0, 6.0]])


@pytest.mark.parametrize("mapped", ["1", "0"])
def test_uploads_through_mappings_or_the_queue_give_the_same_results(device, monkeypatch, mapped):
    # On a CPU adapter (lavapipe) the device has mappable-primary-buffers and a session writes
    # its parameters straight into their buffers' mappings; EGGFUSE_MAPPED_UPLOADS=0 (and any
    # other device) uploads through the queue. Offsets not a multiple of 8 are packed first.
    monkeypatch.setenv("EGGFUSE_MAPPED_UPLOADS", mapped)
    g = _packed_mlp()
    params = {"wg": RNG.standard_normal((6, 4)), "wu": RNG.standard_normal((6, 4)), "b": RNG.standard_normal((1, 8))}
    s = Session(lower(g), params, device=device)
    expect_mapped = mapped == "1" and device_module.mapped_uploads(device)
    assert device_module.mapped_uploads(device) == (mapped == "1" and device_module.MAPPABLE in device.features)
    b = s._buffers[s.plan.parameters["b"]]
    assert bool(b.usage & wgpu.BufferUsage.MAP_WRITE) == expect_mapped and b.map_state == "unmapped"
    x = {"x": RNG.standard_normal((5, 6))}
    _close(s.run(x), evaluate(g, x, params))
    s.write_parameter("b", np.zeros((1, 8)))  # through the queue, into a buffer once mapped
    _close(s.run(x), evaluate(g, x, {**params, "b": np.zeros((1, 8))}))
    if device.adapter.info.get("adapter_type") == "CPU" and device_module.MAPPABLE in device.adapter.features:
        assert device_module.MAPPABLE in device.features


def test_parameters_only_packed_get_no_device_buffer(device):
    g = Graph()
    x = g.input("x", [3, 8])
    ws = [g.parameter(name, [4, 8]) for name in ("wq", "wk", "wv")]
    g.set_outputs([g.matmul_bt(x, g.concat(ws, axis=0))])
    params = {name: RNG.standard_normal((4, 8)) for name in ("wq", "wk", "wv")}
    s = Session(lower_for(g, device), params, device=device)
    assert all(s._buffers[s.plan.parameters[name]] is None for name in params)
    feeds = {"x": RNG.standard_normal((3, 8))}
    for _ in range(2):
        _close(s.run(feeds), evaluate(g, feeds, params))
    with pytest.raises(InputError, match=r"'wv' \(f32\[4,8\]\)"):  # packed sources are still checked
        Session(lower_for(g, device), {"wq": params["wq"], "wk": params["wk"]}, device=device)


def test_concat_and_slice_copy_u32_indices(device):
    g = Graph()
    a, b = g.input("a", [2, 3], DType.U32), g.input("b", [2, 2], DType.U32)
    both = g.concat([a, b], axis=1)
    g.set_outputs([both, g.slice_cols(both, 1, 3)])
    feeds = {"a": np.array([[0, 1, 2**32 - 1], [7, 8, 9]]), "b": np.array([[2**31, 5], [6, 2**23 + 1]])}
    got = Session(lower_for(g, device), {}, device=device).run(feeds)
    want = np.concatenate([feeds["a"], feeds["b"]], axis=1).astype(np.uint32)
    assert got[0].dtype == np.uint32
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want[:, 1:4])


def test_adapter_is_described(device):
    s = Session(lower_for(_linear(), device), _params(), device=device)
    assert s.adapter.count(" / ") == 2


@pytest.mark.parametrize("params, match", [
    ({"w": np.zeros((6, 4))}, r"'b' \(f32\[4\]\)"),
    ({"w": np.zeros((4, 6)), "b": np.zeros(4)}, r"parameter 'w': expected shape \[6, 4\].*got \[4, 6\]"),
    ({"w": np.zeros((6, 4)), "b": np.zeros(4), "wq": np.zeros(3)}, r"unknown parameter.*'wq'"),
    ({"w": np.full((6, 4), np.nan), "b": np.zeros(4)}, "NaN"),
])
def test_bad_parameters_raise_input_error(params, match, device):
    with pytest.raises(InputError, match=match):
        Session(lower_for(_linear(), device), params, device=device)


@pytest.mark.parametrize("inputs, match", [
    ({}, r"'x' \(f32\[5,6\]\)"),
    ({"x": np.zeros((6, 5))}, r"input 'x': expected shape \[5, 6\].*got \[6, 5\]"),
    ({"x": np.zeros((5, 6)), "y": np.zeros(1)}, r"unknown input.*'y'"),
    ({"x": np.array([["a"] * 6] * 5)}, "expected numbers"),
])
def test_bad_inputs_raise_input_error(inputs, match, device):
    s = Session(lower_for(_linear(), device), _params(), device=device)
    with pytest.raises(InputError, match=match):
        s.run(inputs)


def test_embedding_index_out_of_range_is_rejected(device):
    g = Graph()
    g.set_outputs([g.embedding(g.input("ids", [3], DType.U32), g.parameter("table", [4, 2]))])
    s = Session(lower_for(g, device), {"table": np.ones((4, 2))}, device=device)
    with pytest.raises(InputError, match="index 4 out of range.*4 rows"):
        s.run({"ids": np.array([0, 4, 1])})


def test_outputs_that_alias_or_are_consumed(device):
    g = Graph()
    x = g.input("x", [4, 6])
    w = g.parameter("w", [6, 6])
    h = g.matmul(x, w)  # consumed by gelu and also an output
    flat = g.reshape(h, [24])  # an Identity of an intermediate
    y = g.gelu(h)
    z = g.add(y, h)
    g.set_outputs([flat, h, z, y, x, g.reshape(x, [6, 4]), w])
    params = {"w": RNG.standard_normal((6, 6))}
    feeds = {"x": RNG.standard_normal((4, 6))}
    plan = lower(g)
    assert len(plan.dispatches) == 3 and len(set(plan.outputs)) == 5
    got = Session(plan, params, device=device).run(feeds)
    _close(got, evaluate(g, feeds, params))
    got[1][:] = 0.0  # outputs sharing a buffer are still separate arrays
    assert np.abs(got[0]).max() > 0


def test_two_outputs_sharing_nodes_and_a_constant(device):
    g = Graph()
    x = g.input("x", [3, 5])
    c = g.constant(np.arange(5, dtype=np.float32) / 5.0, [1, 5])
    t = g.tanh(g.add(x, c))
    g.set_outputs([g.sum_all(t), g.softmax(t)])
    feeds = {"x": RNG.standard_normal((3, 5))}
    _close(Session(lower_for(g, device), {}, device=device).run(feeds), evaluate(g, feeds, {}))


def _with_unused_leaves() -> Graph:
    # -x, beside a parameter 'pooler' [3, 3] and an input 'unused' [1] that no output depends on
    g = Graph()
    x = g.input("x", [2, 3])
    g.parameter("pooler", [3, 3])
    g.input("unused", [1])
    g.set_outputs([g.neg(x)])
    return g


def test_unused_leaves_are_accepted(device):
    s = Session(lower_for(_with_unused_leaves(), device), {"pooler": np.zeros((3, 3))}, device=device)
    (got,) = s.run({"x": np.ones((2, 3)), "unused": np.zeros(1)})
    np.testing.assert_array_equal(got, -np.ones((2, 3)))


@pytest.mark.parametrize("kind, value, says", [
    ("input", np.ones((7, 7)), r"input 'unused' \(which no output reads\).*\[1\]"),
    ("input", np.full(1, np.nan), r"input 'unused' \(which no output reads\).*(NaN|finite)"),
    ("input", "garbage", r"input 'unused' \(which no output reads\).*text"),
    ("parameter", np.ones(9), r"parameter 'pooler' \(which no output reads\).*\[3, 3\]"),
])
def test_a_bad_value_for_an_unused_leaf_is_refused(kind, value, says, device):
    # a leaf no output reads is still declared: a value that does not fit it is a mistake, refused as for a used one
    plan = lower_for(_with_unused_leaves(), device)
    params = {"pooler": value if kind == "parameter" else np.zeros((3, 3))}
    with pytest.raises(InputError, match=says):
        Session(plan, params, device=device).run({"x": np.ones((2, 3)), "unused": value})


def test_an_unused_leaf_is_given_under_its_own_kind(device):
    # an unused input's name among the parameters (or the reverse) is an unknown name there, as for a used leaf
    plan = lower_for(_with_unused_leaves(), device)
    with pytest.raises(InputError, match=r"unknown parameter\(s\) 'unused'"):
        Session(plan, {"pooler": np.zeros((3, 3)), "unused": np.zeros(1)}, device=device)
    session = Session(plan, {"pooler": np.zeros((3, 3))}, device=device)
    with pytest.raises(InputError, match=r"unknown input\(s\) 'pooler'"):
        session.run({"x": np.ones((2, 3)), "pooler": np.zeros((3, 3))})


@pytest.mark.parametrize("constant", [False, True])
def test_pipelines_are_shared_between_sessions(constant, device, monkeypatch):
    # sizes in the uniform (constant_params=False): one pipeline serves every size; sizes as WGSL constants (the
    # default on a GPU): a pipeline per size, shared by sessions of the same sizes
    monkeypatch.setattr(pipeline_cache, "CACHE_SIZE", 10**9)  # nothing dropped: the count shows what is compiled
    first = lower_for(_linear(), device, constant_params=constant)
    Session(first, _params(), device=device)
    count = len(pipeline_cache._pipelines)
    g = Graph()  # same kernels (matmul: same tile, and N % 4 == 0 as before), other shapes
    x = g.input("x", [9, 2])
    g.set_outputs([g.relu(g.bias_add(g.matmul(x, g.parameter("w", [2, 8])), g.parameter("b", [8])))])
    plan = lower_for(g, device, constant_params=constant)
    Session(plan, {"w": np.ones((2, 8)), "b": np.ones(8)}, device=device)
    grown = len(pipeline_cache._pipelines) - count
    new_sources = {d.source for d in plan.dispatches} - {d.source for d in first.dispatches}
    assert grown == len(new_sources) and (grown > 0) == constant
    Session(lower_for(g, device, constant_params=constant), {"w": np.ones((2, 8)), "b": np.ones(8)}, device=device)
    assert len(pipeline_cache._pipelines) - count == grown


def _doubled(rows: int) -> Graph:
    g = Graph()
    g.set_outputs([g.add(*[g.input("x", [rows, 5])] * 2)])
    return g


def test_the_pipeline_cache_keeps_the_most_recently_used(device, monkeypatch):
    # runtime.pipelines.CACHE_SIZE: past it the least recently used pipeline (and module) is dropped; a session
    # keeps the pipelines it holds, and a later session of a dropped kernel compiles it again. Sizes as WGSL
    # constants make x + x of 3, 4 and 5 rows three kernels.
    monkeypatch.setattr(pipeline_cache, "CACHE_SIZE", 2)
    monkeypatch.setattr(pipeline_cache, "_pipelines", type(pipeline_cache._pipelines)())
    monkeypatch.setattr(pipeline_cache, "_modules", type(pipeline_cache._modules)())
    plans = {rows: lower_for(_doubled(rows), device, constant_params=True) for rows in (3, 4, 5)}
    assert len({d.source for p in plans.values() for d in p.dispatches}) == 3
    keys, sessions = {}, {}
    for rows in (3, 4, 5):
        before = set(pipeline_cache._pipelines), set(pipeline_cache._modules)
        sessions[rows] = Session(plans[rows], {}, device=device)
        keys[rows] = set(pipeline_cache._pipelines) - before[0], set(pipeline_cache._modules) - before[1]
        assert all(len(new) == 1 for new in keys[rows])  # one pipeline and one module compiled
        if rows == 4:
            Session(plans[3], {}, device=device)  # a hit: 3 rows' pipeline is now the most recently used
    # the third kernel dropped 4 rows' pipeline, the least recently used, and kept 3 rows'; the modules, used only
    # to compile pipelines, dropped 3 rows' (the hit on its pipeline did not touch it)
    assert set(pipeline_cache._pipelines) == keys[3][0] | keys[5][0]
    assert set(pipeline_cache._modules) == keys[4][1] | keys[5][1]
    for rows in (4, 5, 3):  # 4 rows' compiled again; every session's numbers as the reference's
        x = RNG.standard_normal((rows, 5)).astype(np.float32)
        before = set(pipeline_cache._pipelines)
        (got,) = Session(plans[rows], {}, device=device).run({"x": x})
        np.testing.assert_array_equal(got, x + x)
        if rows == 4:
            assert set(pipeline_cache._pipelines) - before  # a new entry: 4 rows' kernel compiled again
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    (got,) = sessions[4].run({"x": x})  # a session whose pipeline left the cache still runs it
    np.testing.assert_array_equal(got, x + x)


def test_no_adapter_is_a_device_error(monkeypatch):
    monkeypatch.setattr(device_module, "_device", None)
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **kw: None)
    with pytest.raises(DeviceError, match="mesa-vulkan-drivers"):
        device_module.get_device()


def test_wgpu_errors_surface_as_device_errors(device):
    plan = lower(_linear())
    broken = dataclasses.replace(plan.dispatches[0], source="fn main( {")
    plan.dispatches[0] = broken
    with pytest.raises(DeviceError, match=r"compiling kernel for matmul_\w+: node 3 MatMul"):
        Session(plan, _params(), device=device)


# --- limits ------------------------------------------------------------------------------


def test_binding_size_limit_is_refused_with_its_name():
    with pytest.raises(LoweringError, match=r"maxStorageBufferBindingSize = 64 .*MatMul.*f32\[5,6\]"):
        lower(_linear(), {"max-storage-buffer-binding-size": 64})


def test_buffer_size_limit_is_refused_with_its_name():
    with pytest.raises(LoweringError, match=r"maxBufferSize = 100 .*'x'.*f32\[5,6\]"):
        lower(_linear(), {"max-buffer-size": 100})


def test_storage_buffer_count_limit_is_refused_with_its_name():
    g = Graph()
    a, b = g.input("a", [3, 4]), g.parameter("b", [4, 5])
    res = [g.input(f"r{i}", [3, 5]) for i in range(7)]
    g.set_outputs([g.add_node("FusedMatMul", (a, b, *res), variant="", epilogue=("add",) * 7)])
    with pytest.raises(LoweringError, match=r"maxStorageBuffersPerShaderStage = 8 .*binds 10 .*FusedMatMul"):
        lower(g)
    assert len(lower(g, {"max-storage-buffers-per-shader-stage": 10}).dispatches) == 1


def test_small_workgroup_limit_splits_the_grid(device):
    g = Graph()
    x = g.input("x", [50, 70])  # 3500 elements: 14 workgroups of 256
    w = g.parameter("w", [70, 130])
    y = g.silu(x)
    mm = g.matmul(y, w)  # 2 x 5 tiles of 32x32 (pinned below: ir/ops/matmul_kernel.py matmul_choice)
    q = g.reshape(mm, [100, 65])
    # 7 workgroups of 15 query rows (ir/ops/attention.py attention_tiles)
    att = g.causal_attention(q, q, q, num_heads=1, num_kv_heads=1, head_dim=65, batch=1)
    g.set_outputs([y, mm, att])
    with matmul_choice(tile=TILE_32):
        plan = lower(g, {"max-compute-workgroups-per-dimension": 4})
    assert [d.workgroups for d in plan.dispatches] == [(4, 4, 1), (4, 3, 1), (4, 2, 1)]
    params = {"w": RNG.standard_normal((70, 130)) * 0.1}
    feeds = {"x": RNG.standard_normal((50, 70))}
    _close(Session(plan, params, device=device).run(feeds), evaluate(g, feeds, params))
    with matmul_choice(tile=TILE_32):
        plan = lower(g, {"max-compute-workgroups-per-dimension": 3})  # 14 groups need a 3-D grid
    assert plan.dispatches[0].workgroups == (3, 3, 2)
    _close(Session(plan, params, device=device).run(feeds)[:1], evaluate(g, feeds, params)[:1])
    with pytest.raises(LoweringError, match="maxComputeWorkgroupsPerDimension = 1"):
        lower(g, {"max-compute-workgroups-per-dimension": 1})


def test_split_matmul_grid_covers_every_tile(device):
    g = Graph()
    a, b = g.input("a", [130, 20]), g.parameter("b", [20, 200])
    g.set_outputs([g.matmul(a, b)])  # 5 x 7 = 35 tiles of 32x32 (ir/ops/matmul_kernel.py matmul_choice)
    with matmul_choice(tile=TILE_32):
        plan = lower(g, {"max-compute-workgroups-per-dimension": 5})
    assert plan.dispatches[0].workgroups == (5, 4, 2)  # 40 >= 35 workgroups on a 3-D grid
    params, feeds = {"b": RNG.standard_normal((20, 200))}, {"a": RNG.standard_normal((130, 20))}
    _close(Session(plan, params, device=device).run(feeds), evaluate(g, feeds, params))


def test_inputs_share_one_buffer_and_are_rewritten_each_run(device):
    g = Graph()
    x = g.input("x", [3, 5])
    b = g.input("b", [5])
    ids = g.input("ids", [7], DType.U32)
    table = g.parameter("table", [4, 5])
    g.set_outputs([g.bias_add(g.embedding(ids, table), b), x, g.reshape(b, [1, 5]), g.tanh(x)])
    params = {"table": RNG.standard_normal((4, 5))}
    s = Session(lower_for(g, device), params, device=device)
    slots = [s.plan.inputs[n] for n in ("x", "b", "ids")]
    assert len({id(s._buffers[i]) for i in slots}) == 1  # one device buffer for the three inputs
    offsets = sorted(s._offsets[i] for i in slots)
    align = device.limits["min-storage-buffer-offset-alignment"]
    assert offsets[0] == 0 and all(o % align == 0 for o in offsets) and len(set(offsets)) == 3
    for _ in range(3):  # new values every run; outputs read from their offsets
        feeds = {"x": RNG.standard_normal((3, 5)), "b": RNG.standard_normal(5),
                 "ids": RNG.integers(0, 4, 7)}
        _close(s.run(feeds), evaluate(g, feeds, params))
    s.run(feeds, read=())  # inputs that are outputs, read later from their offsets
    want = evaluate(g, feeds, params)
    _close([s.read_output(i) for i in range(4)], want)


def _cache_rows() -> Graph:
    # Each run writes its input row into row ``pos`` of a state tensor, after a product slow enough on a CPU
    # adapter (about a millisecond) that back-to-back runs queue up behind the host.
    g = Graph()
    cache, rows, pos = g.state("cache", [16, 64]), g.input("rows", [1, 64]), g.input("pos", [1], DType.U32)
    a = g.input("a", [96, 96])
    g.set_outputs([g.add_node("CacheWrite", (cache, rows, pos)), g.matmul(g.tanh(g.matmul(a, a)), a)])
    return g


@pytest.mark.parametrize("ring", [0, 1, 3])
def test_back_to_back_runs_each_read_their_own_inputs(ring, device, monkeypatch):
    # Runs submitted without reading anything, more of them than the input ring has buffers: each run's
    # inputs reach its own dispatches (through the ring: the buffer of a run INPUT_RING runs back, written
    # only once that run is done; with 0, through queue.write_buffer), whichever runs are still queued.
    from eggfuse.runtime import session as session_module

    monkeypatch.setattr(session_module, "INPUT_RING", ring)
    g = _cache_rows()
    s = Session(lower_for(g, device), {}, device=device)
    assert len(s._ring) == ring
    rows = RNG.standard_normal((16, 64)).astype(np.float32)
    a = RNG.standard_normal((96, 96)) * 0.1
    for sweep in range(2):  # every row written twice, the second time with other values
        for i in range(16):
            s.run({"rows": rows[i:i + 1] + sweep, "a": a, "pos": [i]}, read=())
    np.testing.assert_array_equal(s.read_parameter("cache"), rows + 1)
    feeds = {"rows": rows[:1], "a": a, "pos": [0]}
    _close(s.run(feeds), evaluate(g, feeds, {"cache": rows + 1}))


def test_a_run_that_fails_before_its_submission_leaves_the_input_ring_usable(device, monkeypatch):
    # The run wrote its inputs into a ring buffer and failed before submitting: the next run that takes that
    # buffer maps it again. A dropped session's map requests are forgotten.
    import weakref

    from dropped import collected  # tests/dropped.py

    from eggfuse.runtime import session as session_module

    monkeypatch.setattr(session_module, "INPUT_RING", 3)
    g = _cache_rows()
    s = Session(lower_for(g, device), {}, device=device)
    assert len(s._ring) == 3
    a, rows = np.eye(96), RNG.standard_normal((16, 64)).astype(np.float32)
    for i in range(2):
        s.run({"rows": rows[i:i + 1], "a": a, "pos": [i]}, read=())
    with monkeypatch.context() as m:
        m.setattr(s, "_take_recorded", lambda *args: (_ for _ in ()).throw(RuntimeError("recording failed")))
        with pytest.raises(RuntimeError, match="recording failed"):
            s.run({"rows": rows[2:3], "a": a, "pos": [2]}, read=())
    for i in range(2, 16):
        s.run({"rows": rows[i:i + 1], "a": a, "pos": [i]}, read=())
    np.testing.assert_array_equal(s.read_parameter("cache"), rows)
    requests = [r for r in s._ring_requests if r is not None]
    assert requests and all(r in session_module._ring_live for r in requests)
    s._next.result()  # the recording thread's job done
    ref = weakref.ref(s)
    del s
    assert collected(ref)
    assert not any(r in session_module._ring_live or r in session_module._ring_status for r in requests)


def test_a_large_input_is_written_to_a_buffer_of_its_own(device, monkeypatch):
    from eggfuse.runtime import session as session_module

    monkeypatch.setattr(session_module, "PACK_MAX_BYTES", 64)
    g = Graph()
    small, large = g.input("small", [5]), g.input("large", [3, 7])
    g.set_outputs([g.bias_add(g.tanh(large), g.input("bias", [7])), small])
    s = Session(lower_for(g, device), {}, device=device)
    index = {n: s.plan.inputs[n] for n in ("small", "large", "bias")}
    assert s._buffers[index["large"]] is not s._buffers[index["small"]]
    assert s._buffers[index["small"]] is s._buffers[index["bias"]]
    for _ in range(2):
        large = RNG.standard_normal((7, 3)).astype(np.float32).T  # f32, not contiguous
        feeds = {"small": RNG.standard_normal(5), "large": large, "bias": RNG.standard_normal(7)}
        _close(s.run(feeds), evaluate(g, feeds, {}))


def test_input_layouts_and_dtypes_are_converted_without_touching_the_caller(device):
    g = Graph()
    x = g.input("x", [5, 6])
    ids = g.input("ids", [4], DType.U32)
    table = g.parameter("table", [3, 6])
    g.set_outputs([g.tanh(x), g.embedding(ids, table)])
    params = {"table": RNG.standard_normal((3, 6))}
    s = Session(lower_for(g, device), params, device=device)
    base = RNG.standard_normal((6, 5)).astype(np.float32)
    cases = [
        {"x": base.T, "ids": np.array([2, 0, 1, 2], np.uint32)},          # f32, not contiguous
        {"x": np.asfortranarray(base.T), "ids": np.array([1, 1, 0, 2])},   # Fortran order, int64 ids
        {"x": base.T.astype(np.float64), "ids": [0, 1, 2, 0]},             # float64, a list of ids
    ]
    for feeds in cases:
        kept = {k: np.array(v, copy=True) for k, v in feeds.items()}
        for v in feeds.values():
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        _close(s.run(feeds), evaluate(g, feeds, params))
        for k, v in feeds.items():
            np.testing.assert_array_equal(v, kept[k])


@pytest.mark.parametrize("x, ids, match", [
    (np.full((5, 6), np.nan, np.float32), [0, 0, 0, 0], "input 'x': contains NaN"),
    (np.full((5, 6), np.inf), [0, 0, 0, 0], "input 'x': contains NaN or infinity"),
    (np.full((5, 6), -1e300), [0, 0, 0, 0], r"input 'x': -1e\+300 is beyond float32's range"),  # finite in float64
    (np.zeros((5, 6), np.float32), np.array([0, 3, 0, 0], np.uint32), "input 'ids': index 3 out of range.*3 rows"),
    (np.zeros((5, 6), np.float32), np.array([0, -1, 0, 0]),
     r"input 'ids': index -1 out of range for the 3 rows that .* give indices from 0 to 2"),
    (np.zeros((6, 5), np.float32), [0, 0, 0, 0], r"input 'x': expected shape \[5, 6\]"),
    (np.zeros((5, 6), np.float32), np.zeros(4, np.float32), "input 'ids': expected integer indices"),
    (np.zeros((5, 6), np.float32), np.ones(4, bool),
     r"input 'ids': expected integer indices for u32\[4\], got dtype bool"),
])
def test_bad_input_values_are_refused_by_name(x, ids, match, device):
    g = Graph()
    g.set_outputs([g.tanh(g.input("x", [5, 6])),
                   g.embedding(g.input("ids", [4], DType.U32), g.parameter("table", [3, 6]))])
    s = Session(lower_for(g, device), {"table": np.ones((3, 6))}, device=device)
    with pytest.raises(InputError, match=match):
        s.run({"x": x, "ids": ids})


def test_an_input_updated_in_place_keeps_a_buffer_of_its_own(device):
    g = Graph()
    x = g.input("x", [4, 3])
    w = g.input("w", [3, 2])  # an input that an optimiser step writes in place
    y = g.matmul(x, w)
    g.set_outputs([y, g.add_node("SgdUpdate", (w, g.matmul_at(x, y)), lr=0.1)])
    s = Session(lower_for(g, device), {}, device=device)
    assert s._buffers[s.plan.inputs["w"]] is not s._buffers[s.plan.inputs["x"]]
    for _ in range(2):
        feeds = {"x": RNG.standard_normal((4, 3)), "w": RNG.standard_normal((3, 2))}
        _close(s.run(feeds), evaluate(g, feeds, {}))


def test_shared_intermediate_storage_gives_the_reference_numbers(device):
    g = Graph()
    x = g.input("x", [3, 7])
    w = g.parameter("w", [7, 7])
    h = g.tanh(g.matmul(x, w))
    keep = g.gelu(h)  # read again at the end, across the chain
    for _ in range(5):
        h = g.neg(g.add(h, g.mul(h, h)))
    wide = g.matmul(g.reshape(h, [7, 3]), g.input("y", [3, 11]))  # larger than the allocations before it
    g.set_outputs([g.add(g.sum_all(wide), g.sum_all(g.matmul(keep, w))), h, wide])
    params = {"w": RNG.standard_normal((7, 7)) * 0.3}
    shared, own = lower(g), lower(g, share_storage=False)
    assert len(shared.storage_sizes) < len(shared.storage) and not own.storage
    s_shared, s_own = Session(shared, params, device=device), Session(own, params, device=device)
    for _ in range(2):
        feeds = {"x": RNG.standard_normal((3, 7)), "y": RNG.standard_normal((3, 11))}
        want = evaluate(g, feeds, params)
        _close(s_shared.run(feeds), want)
        _close(s_own.run(feeds), want)


def test_a_refused_input_names_itself_and_the_next_run_is_unaffected(device):
    # Inputs already of their dtype are copied into the input buffer's host copy and checked
    # there; the error still names the input, and nothing stale reaches the next run.
    g = Graph()
    a, b = g.input("a", [3, 4]), g.input("b", [4])
    ids = g.input("ids", [5], DType.U32)
    g.set_outputs([g.bias_add(a, b), g.embedding(ids, g.parameter("table", [6, 4]))])
    params = {"table": RNG.standard_normal((6, 4))}
    s = Session(lower_for(g, device), params, device=device)
    good = {"a": RNG.standard_normal((3, 4)).astype(np.float32), "b": np.ones(4, np.float32),
            "ids": np.arange(5, dtype=np.uint32)}
    for bad, match in (({"b": np.array([1, np.inf, 1, 1], np.float32)}, "input 'b': contains NaN or infinity"),
                       ({"a": np.full((3, 4), np.nan, np.float32)}, "input 'a': contains NaN"),
                       ({"ids": np.array([0, 1, 6, 2, 3], np.uint32)}, "input 'ids': index 6 out of range")):
        with pytest.raises(InputError, match=match):
            s.run({**good, **bad})
        _close(s.run(good), evaluate(g, good, params))


def test_a_plan_without_dispatches_runs_and_reads_back(device):
    g = Graph()
    x = g.input("x", [3])
    g.set_outputs([x, g.reshape(x, [1, 3])])
    s = Session(lower_for(g, device), {}, device=device)
    assert not s.plan.dispatches
    for k in range(3):
        feeds = {"x": np.arange(3.0) + k}
        assert s.run(feeds, read=()) == []
        _close([s.read_output(0), s.read_output(1)], evaluate(g, feeds, {}))
        _close(s.run(feeds), evaluate(g, feeds, {}))


def test_a_misnamed_input_with_a_buffer_of_its_own_is_refused_by_name(device, monkeypatch):
    from eggfuse.runtime import session as session_module

    monkeypatch.setattr(session_module, "PACK_MAX_BYTES", 16)  # "big" and "big2" get buffers of their own
    g = Graph()
    g.set_outputs([g.add(g.input("big", [2, 4]), g.bias_add(g.input("big2", [2, 4]), g.input("small", [4])))])
    s = Session(lower_for(g, device), {}, device=device)
    assert [slot.packed for slot in s._input_slots.values()].count(True) == 1
    feeds = {"big": np.ones((2, 4)), "big2": np.ones((2, 4)), "small": np.ones(4)}
    _close(s.run(feeds), evaluate(g, feeds, {}))
    with pytest.raises(InputError, match=r"input\(s\) not given: 'big'"):
        s.run({"bgi": feeds["big"], "big2": feeds["big2"], "small": feeds["small"]})


def test_read_takes_any_sequence_of_output_indices(device):
    g, params = _linear(), _params()
    g.set_outputs([g.outputs[0], g.tanh(g.outputs[0])])
    s = Session(lower_for(g, device), params, device=device)
    feeds = {"x": RNG.standard_normal((5, 6))}
    want = evaluate(g, feeds, params)
    _close(s.run(feeds, read=np.array([1, 0])), [want[1], want[0]])
    assert s.run(feeds, read=np.array([], dtype=int)) == [] and s.run(feeds, read=[]) == []
    _close(s.run(feeds, read=range(1, 2)), [want[1]])


@pytest.mark.parametrize("limit", [None, 8, 4, 2], ids=["device", "8", "4", "2"])
@pytest.mark.parametrize("shapes, axis", [
    ([[3, 1 + i % 3] for i in range(16)], 1),
    ([[1 + i % 4, 5] for i in range(11)], 0),
    ([[2, 1 + i % 2, 3] for i in range(9)], 1),
], ids=["16-axis1", "11-axis0", "9-rank3-axis1"])
def test_a_concat_split_over_several_dispatches_gives_the_reference(shapes, axis, limit, device):
    # limit None: the device's own maxStorageBuffersPerShaderStage; the others split the Concat
    g = Graph()
    xs = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.set_outputs([g.neg(g.concat(xs, axis=axis))])  # the Concat's output read by a kernel
    limits = dict(device.limits)
    if limit is not None:
        limits["max-storage-buffers-per-shader-stage"] = limit
    plan = lower(g, limits)
    parts = -(-len(shapes) // (limits["max-storage-buffers-per-shader-stage"] - 1))
    assert sum(d.op == "Concat" for d in plan.dispatches) == parts
    feeds = {f"x{i}": RNG.standard_normal(s) for i, s in enumerate(shapes)}
    (got,) = Session(plan, {}, device=device).run(feeds)
    np.testing.assert_array_equal(got, evaluate(g, feeds, {})[0].astype(np.float32))


@pytest.mark.parametrize("polls", [True, False], ids=["polls", "deadline-passed"])
def test_waits_that_poll_without_blocking_read_the_reference_numbers(device, monkeypatch, polls):
    # The discrete GPUs' wait (session.SPIN_WAIT_S, _spin_until_idle), forced on here, where a CPU adapter
    # blocks; with the polling's deadline passed the waits block. Reads go through wgpu-native's C
    # functions either way (session._map_read), never through wgpu-py's map_async.
    from eggfuse.runtime import session as session_module

    spun, spin = [], session_module._spin_until_idle
    monkeypatch.setattr(session_module, "_spin_until_idle", lambda dev: spun.append(polls and spin(dev)) or spun[-1])
    monkeypatch.setattr(session_module, "SPIN_WAIT_S", 5.0)  # a slow, busy machine still polls to the end
    g, params = _linear(), _params()
    g.set_outputs([g.outputs[0], g.tanh(g.outputs[0])])
    plan = lower_for(g, device)  # first: its subgroup probe (once a device) reads back through wgpu-py
    kind = type(device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ))
    maps, map_async = [], kind.map_async
    monkeypatch.setattr(kind, "map_async", lambda buf, *a, **k: maps.append(a) or map_async(buf, *a, **k))
    s = Session(plan, params, device=device)
    assert not s._spin or device.adapter.info.get("adapter_type") == "DiscreteGPU"
    s._spin = True
    for _ in range(3):  # a round: one wait, a read of both outputs, a read of one
        feeds = {"x": RNG.standard_normal((5, 6))}
        s.run(feeds, read=())
        s.wait()
        _close(s.run(feeds), evaluate(g, feeds, params))
        _close(s.run(feeds, read=[1]), evaluate(g, feeds, params)[1:])
    assert len(spun) == 9 and all(spun) == polls and maps == []
    assert session_module._map_status == {}  # every map request settled and forgotten


def test_a_failed_read_back_leaves_no_buffer_mapped(device, monkeypatch):
    # a read that fails after its buffers were mapped unmaps them: the next run copies into them again
    from eggfuse.runtime import session as session_module

    g, params = _linear(), _params()
    g.set_outputs([g.outputs[0], g.tanh(g.outputs[0])])
    s = Session(lower_for(g, device), params, device=device)
    feeds = {"x": RNG.standard_normal((5, 6))}

    def failing(*args):
        raise RuntimeError("read failed")

    with monkeypatch.context() as m:
        m.setattr(session_module, "bytearray", failing, raising=False)  # the copy out of a mapped range
        with pytest.raises(RuntimeError, match="read failed"):
            s.run(feeds)
    assert session_module._map_status == {}
    _close(s.run(feeds), evaluate(g, feeds, params))
    with monkeypatch.context() as m:  # maps that stay pending past the wait: aborted, named, forgotten
        m.setattr(session_module, "MAP_WAIT_S", -1.0)
        with pytest.raises(DeviceError, match=r"2 read-back map\(s\) still pending after -1 s; .* make a new"):
            s.run(feeds)
    assert session_module._map_status == {}
    _close(s.run(feeds), evaluate(g, feeds, params))


def test_outputs_sharing_a_buffer_read_back_as_arrays_of_their_own(device):
    # the first output of a buffer takes the bytes read, the others copies
    g, params = _linear(), _params()
    y = g.outputs[0]
    g.set_outputs([y, y, g.reshape(y, [20])])
    s = Session(lower_for(g, device), params, device=device)
    feeds = {"x": RNG.standard_normal((5, 6))}
    for read in (None, [0, 0], [2, 1]):
        got = s.run(feeds, read=read)
        assert not any(np.shares_memory(a, b) for i, a in enumerate(got) for b in got[i + 1:])
        want = evaluate(g, feeds, params)
        _close(got, [want[i] for i in (range(3) if read is None else read)])


def test_reads_without_wgpu_natives_c_functions_map_through_wgpu_py(device, monkeypatch):
    # the read-back for another wgpu-py backend (no C functions): map_sync, read_mapped, unmap; the staging
    # buffers of a run read back hold its outputs, read here again that way
    from eggfuse.runtime import session as session_module

    g, params = _linear(), _params()
    g.set_outputs([g.outputs[0], g.tanh(g.outputs[0])])
    s = Session(lower_for(g, device), params, device=device)
    feeds = {"x": RNG.standard_normal((5, 6))}
    want = s.run(feeds)
    monkeypatch.setattr(session_module, "_libf", None)
    raw = s._read_back({i: s._staging[i] for i in s.plan.outputs})
    for i, expected in zip(s.plan.outputs, want, strict=True):
        ty = s.plan.output_types[s.plan.outputs.index(i)]
        np.testing.assert_array_equal(session_module._host_array(raw[i], ty), expected)
        assert isinstance(raw[i], memoryview)  # wgpu-py's read_mapped: a copy, copied again into the array


def test_read_back_copies_ride_in_the_prerecorded_command_buffer(device, monkeypatch):
    # The next run's command buffer, recorded in the background, holds the copies of the outputs the last
    # run read; run() records a copy buffer of its own only where those lack one it reads. Every read
    # gives the reference numbers, whichever outputs the run before read.
    g, params = _linear(), _params()
    g.set_outputs([g.outputs[0], g.tanh(g.outputs[0])])
    s = Session(lower_for(g, device), params, device=device)
    main, made, create = threading.get_ident(), [], device.create_command_encoder
    monkeypatch.setattr(device, "create_command_encoder",
                        lambda *a, **k: made.append(threading.get_ident() == main) or create(*a, **k))
    last = set()  # the outputs the last run read
    for n, read in enumerate(([0], [0], [0], [1], [0, 1], [1], None, None, (), [1], [1]), start=1):
        feeds = {"x": RNG.standard_normal((5, 6))}
        made.clear()
        got = s.run(feeds, read=read)
        want = evaluate(g, feeds, params)
        _close(got, [want[i] for i in (range(2) if read is None else read)])
        s.wait()
        # the first two runs are recorded in run() (pre-recording starts after the second), with their own
        # copies; then run() makes a copy buffer only for outputs the last run did not read
        wanted = set(range(2) if read is None else read)
        holds = wanted if n <= 2 else last
        assert made.count(True) == (n <= 2) + bool(wanted - holds), (n, read, made)
        last = wanted


def test_bool_parameters_are_uploaded_and_written_as_words(device):
    # a BOOL parameter lives as u32 0 or 1 on the device (DType.BOOL): numpy's one-byte booleans are widened when
    # uploaded and when written (they were copied byte for byte, so a Gather of the table read the wrong rows)
    g = Graph()
    g.set_outputs([g.add_node("Gather", (g.parameter("w", [4, 3], DType.BOOL), g.input("i", [3], DType.I32)), axis=0)])
    w = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0]], bool)
    feeds = {"i": np.array([3, 0, 2], np.int32)}
    session = Session(lower(g), {"w": w}, device=device)
    np.testing.assert_array_equal(session.run(feeds)[0], w[[3, 0, 2]])
    session.write_parameter("w", ~w)
    np.testing.assert_array_equal(session.run(feeds)[0], ~w[[3, 0, 2]])
    np.testing.assert_array_equal(session.read_parameter("w"), ~w)


def test_a_bool_input_of_its_own_buffer_is_uploaded_as_words(device):
    # an input above PACK_MAX_BYTES keeps a buffer of its own, written at each run: booleans widened to u32 there
    # too (they were written byte for byte: half of 300,000 came out wrong)
    from eggfuse.runtime.session import PACK_MAX_BYTES

    n = 300_000
    assert 4 * n > PACK_MAX_BYTES
    g = Graph()
    g.set_outputs([g.add_node("Where", (g.input("m", [n], DType.BOOL), g.input("a", [n]), g.input("b", [n])))])
    rng = np.random.default_rng(5)
    feeds = {"m": rng.random(n) < 0.5, "a": np.ones(n, np.float32), "b": np.zeros(n, np.float32)}
    (got,) = Session(lower(g), {}, device=device).run(feeds)
    np.testing.assert_array_equal(got, feeds["m"].astype(np.float32))


def test_one_session_run_from_two_threads_runs_one_call_at_a_time(device):
    # two runs at once had one map the staging buffers the other had submitted with: wgpu aborted the process
    import eggfuse

    g = Graph()
    g.set_outputs([g.relu(g.matmul(g.input("x", [8, 64]), g.parameter("w", [64, 32])))])
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    c = eggfuse.compile(g, {"w": w}, device=device, cache=False)
    errors = []

    def worker(k: int) -> None:
        x = np.full((8, 64), k + 1.0, np.float32)  # each thread's own input, so a mixed-up output shows
        want = np.maximum(x @ w, 0)
        for _ in range(60):
            got = c.run({"x": x})[0]
            if not np.allclose(got, want, rtol=1e-5, atol=1e-4):
                errors.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_read_takes_output_indices_only(device):
    # read=[0.0] and read="0" were raw TypeErrors
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [2, 4]))])
    session = Session(lower(g, dict(device.limits)), {}, device=device)
    x = np.ones((2, 4), np.float32)
    for read, message in (([0.0], r"read must hold output indices \(ints\), got \[0.0\]"),
                          ("0", "read must be a sequence of output indices, got '0'"), ([True], "ints")):
        with pytest.raises(InputError, match=message):
            session.run({"x": x}, read=read)
    np.testing.assert_array_equal(session.run({"x": x}, read=[0])[0], x)


def test_a_dropped_session_destroys_its_buffers_once_no_session_sharing_them_is_left(device):
    # wgpu-native 29 never frees what a finished command buffer that is never submitted binds (the next run's,
    # pre-recorded from the second run on): a session destroys the buffers it created when it and every session
    # sharing them are collected
    g, params = _linear(), _params()
    plan = lower_for(g, device)
    s = Session(plan, params, device=device)
    x = {"x": RNG.standard_normal((5, 6))}
    for _ in range(3):
        s.run(x)
    assert s._next is not None  # the pre-recorded run, left unsubmitted
    other = Session(plan, {}, device=device, share=s)
    owned = weakref.ref(s._owned)
    kept = next(b for b in s._buffers if b is not None and b in s._owned.buffers)
    del s
    gc.collect()
    assert owned() is not None  # the sharing session holds them, and runs on them
    _close(other.run(x), evaluate(g, x, params))
    del other
    gc.collect()
    assert owned() is None
    with pytest.raises(wgpu.GPUValidationError):  # destroyed
        device.queue.write_buffer(kept, 0, np.zeros(1, dtype=np.float32))


def test_sessions_dropped_after_several_runs_give_their_memory_back(device):
    # On a CPU adapter device memory is host memory, so the process's resident memory shows a session's
    # buffers left behind (before the fix: every dropped session kept its 32 MB table)
    if device.adapter.info.get("adapter_type") != "CPU":
        pytest.skip("device memory shows in the process's resident memory on a CPU adapter only")
    g = Graph()
    g.set_outputs([g.embedding(g.input("ids", [1], DType.U32), g.parameter("table", [8192, 1024]))])
    plan = lower_for(g, device)
    table = np.ones((8192, 1024), dtype=np.float32)
    table.setflags(write=False)

    def resident_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    def round_trip() -> None:
        s = Session(plan, {"table": table}, device=device)
        for i in range(3):
            assert s.run({"ids": np.array([i], dtype=np.uint32)})[0].shape == (1, 1024)
        del s
        gc.collect()

    round_trip()
    before = resident_mb()
    for _ in range(6):
        round_trip()
    assert resident_mb() - before < 64, "dropped sessions kept their device memory"  # 6 x 32 MB if kept


def test_finite_inputs_false_holds_with_an_input_no_output_reads(device):
    # an input no output reads sent run() through another check, which refused the NaN of the input read
    xv = np.array([[np.nan, 1.0], [np.inf, -2.0]], np.float32)
    for unused in (False, True):
        g = Graph()
        x = g.input("x", [2, 2])
        if unused:
            g.input("y", [2, 2])
        g.set_outputs([g.relu(x)])
        feeds = {"x": xv, **({"y": np.zeros((2, 2), np.float32)} if unused else {})}
        s = Session(lower_for(g, device), {}, device=device, finite_inputs=False)
        np.testing.assert_array_equal(s.run(feeds)[0], np.array([[np.nan, 1.0], [np.inf, 0.0]], np.float32))


@pytest.mark.parametrize("length", [5, 300])  # an invocation a group, and a workgroup a group
def test_mean_variance_normalization_of_a_line_of_equal_values_is_zero(length, device):
    # the float32 mean of equal values came out beside them, and (v - mean) / (std + 1e-9) gave 0.88 to 0.99
    x = np.repeat(np.array([[0.1049], [-0.2188], [1.9603], [0.3]], np.float32), length, axis=1)
    x[3] = np.linspace(-1, 1, length)  # and a line that is not constant, against the reference
    g = Graph()
    g.set_outputs([g.add_node("MeanVarianceNormalization", [g.input("x", list(x.shape))], axes=[1])])
    (got,) = Session(lower_for(g, device), {}, device=device).run({"x": x})
    (want,) = evaluate(g, {"x": x}, {})
    np.testing.assert_array_equal(got[:3], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
