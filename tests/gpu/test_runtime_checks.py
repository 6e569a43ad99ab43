"""Kernels compiled without naga's runtime checks (lower(..., runtime_checks=False), the default):
which dispatches keep the checks, that the choice survives the compile cache, that a kernel that
does not compile still fails with a DeviceError, and that unchecked plans compute bit for bit what
checked plans compute, and what the numpy reference computes."""

from __future__ import annotations

import numpy as np
import pytest
from kv_runs import lowerings_agree

from eggfuse.cache import decode_plan, encode_plan, entry_key
from eggfuse.ir import DeviceError, Graph, InputError
from eggfuse.ir.ops.matmul_kernel import MATMUL_TILES, keeps_runtime_checks, matmul_choice
from eggfuse.lowering import lower
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph
from eggfuse.pipeline import RUNTIME_CHECKS_ENV, compile, lower_for
from eggfuse.rewrites import optimize
from eggfuse.runtime import Session
from eggfuse.runtime import session as session_mod
from eggfuse.runtime.pipelines import get_pipeline

SMALL = LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                    vocab_size=50, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=16)


def _two_products() -> Graph:
    # two products whose tile a test may force, then a Relu (not fused: these graphs are not optimised)
    g = Graph()
    x, w, v = g.input("x", [130, 20]), g.parameter("w", [36, 20]), g.parameter("v", [7, 36])
    g.set_outputs([g.relu(g.matmul_bt(g.matmul_bt(x, w), v))])
    return g


@pytest.mark.parametrize("tile", MATMUL_TILES, ids=lambda t: t.name)
def test_an_unchecked_plan_keeps_the_checks_only_where_the_kernel_asks(tile):
    with matmul_choice(tile=tile, splits=1):
        plan = lower(_two_products())
        checked = lower(_two_products(), runtime_checks=True)
    assert [d.runtime_checks for d in plan.dispatches] == [keeps_runtime_checks(tile)] * 2 + [False]
    assert keeps_runtime_checks(tile) == (tile.bm == 128)
    assert all(d.runtime_checks for d in checked.dispatches)
    assert [d.source for d in plan.dispatches] == [d.source for d in checked.dispatches]  # the same WGSL
    assert plan.summary().count(" unchecked") == sum(not d.runtime_checks for d in plan.dispatches)


def test_the_choice_round_trips_through_the_compile_cache():
    g = _two_products()
    with matmul_choice(tile=MATMUL_TILES[0], splits=1):  # 128x128: this dispatch keeps its checks
        plan = lower(g)
    assert {d.runtime_checks for d in plan.dispatches} == {True, False}
    back = decode_plan(encode_plan(plan), g)
    assert [d.runtime_checks for d in back.dispatches] == [d.runtime_checks for d in plan.dispatches]


@pytest.mark.parametrize("bad", [None, 0, "no"])
def test_runtime_checks_must_be_a_bool(bad, device):
    with pytest.raises(InputError, match="runtime_checks must be True or False"):
        lower(_two_products(), runtime_checks=bad)
    if bad is not None:  # lower_for's None: the environment variable
        with pytest.raises(InputError, match="runtime_checks must be True or False"):
            lower_for(_two_products(), device, runtime_checks=bad)


def test_the_environment_variable_keeps_the_checks_and_changes_the_compile_key(device, monkeypatch):
    g = _two_products()
    monkeypatch.setenv(RUNTIME_CHECKS_ENV, "1")
    assert all(d.runtime_checks for d in lower_for(g, device).dispatches)
    params = {"w": np.ones((36, 20), np.float32), "v": np.ones((7, 36), np.float32)}
    assert all(d.runtime_checks for d in compile(g, params, device=device, fuse=False, cache=False).plan.dispatches)
    monkeypatch.setenv(RUNTIME_CHECKS_ENV, "0")
    assert not any(d.runtime_checks for d in lower_for(g, device).dispatches)
    monkeypatch.setenv(RUNTIME_CHECKS_ENV, "yes")
    with pytest.raises(InputError, match="EGGFUSE_RUNTIME_CHECKS must be 0 or 1, got 'yes'"):
        lower_for(g, device)
    keys = {entry_key(g, fuse=False, optimizer={}, device={"adapter": "x"}, subgroups=False, runtime_checks=c)
            for c in (True, False)}
    assert len(keys) == 2


def test_only_the_vulkan_backend_gets_modules_without_checks(device, monkeypatch):
    seen = []

    def spy(*args, checks=True, **kwargs):
        seen.append(checks)
        return get_pipeline(*args, checks=checks, **kwargs)

    monkeypatch.setattr(session_mod, "get_pipeline", spy)
    plan = lower(_two_products())
    params = {"w": np.ones((36, 20), np.float32), "v": np.ones((7, 36), np.float32)}
    assert device.adapter.info["backend_type"] == "Vulkan"  # lavapipe, and the GPUs the benchmarks ran on
    Session(plan, params, device=device)
    assert seen == [False] * 3
    seen.clear()
    monkeypatch.setattr(session_mod, "unchecked_modules_allowed", lambda device: False)  # as on Metal, DX12, GL
    Session(plan, params, device=device)
    assert seen == [True] * 3


@pytest.mark.parametrize("checks", [True, False])
def test_wgsl_that_does_not_compile_is_a_device_error_either_way(checks, device):
    source = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }"
    with pytest.raises(DeviceError, match="compiling kernel for broken kernel"):
        get_pipeline(device, source, "main", 1, False, label="broken kernel", checks=checks)


def test_unchecked_plans_compute_what_checked_plans_compute(device):
    decode_graph, _ = optimize(build_llama_cache_graph(SMALL, 1, 16), max_iterations=4)
    prefill_graph, _ = optimize(build_llama_cache_graph(SMALL, 5, 16))
    plans = lowerings_agree(SMALL, decode_graph, prefill_graph, device,
                            [{"runtime_checks": True}, {"runtime_checks": False}], seed=3, prompt=5, total=7,
                            cache="blk.1.v_cache")
    for (decode, prefill), checks in zip(plans, (True, False), strict=True):
        assert all(d.runtime_checks == checks for d in decode.dispatches + prefill.dispatches)


def test_a_forced_128_row_tile_next_to_unchecked_kernels_computes_the_product(device):
    g = _two_products()
    rng = np.random.default_rng(5)
    x, w, v = (rng.standard_normal(s, dtype=np.float32) for s in ((130, 20), (36, 20), (7, 36)))
    with matmul_choice(tile=MATMUL_TILES[1], splits=1):  # 128x64 on the first product
        plan = lower_for(g, device)
    assert plan.dispatches[0].runtime_checks and not plan.dispatches[-1].runtime_checks
    got = Session(plan, {"w": w, "v": v}, device=device).run({"x": x})[0]
    want = np.maximum((x.astype(np.float64) @ w.T.astype(np.float64)) @ v.T.astype(np.float64), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_without_the_trusted_entry_point_modules_keep_the_checks_and_a_warning_says_so(device, monkeypatch, caplog):
    from eggfuse.runtime import pipelines

    monkeypatch.setattr(pipelines, "_TRUSTED", False)
    monkeypatch.setattr(pipelines, "_warned", False)
    source = "@compute @workgroup_size(1) fn main() { }"
    with caplog.at_level("WARNING", logger="eggfuse.runtime"):
        for _ in range(2):
            assert pipelines.create_module(device, source, "empty", checks=False) is not None
    warnings = [r.getMessage() for r in caplog.records if "wgpuDeviceCreateShaderModuleTrusted" in r.getMessage()]
    assert len(warnings) == 1 and "kernels keep naga's runtime checks" in warnings[0]
