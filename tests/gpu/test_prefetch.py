"""L2 prefetch in narrow attention dispatches (lowering/prefetch.py): which buffers a dispatch
prefetches, and that plans with it compute bit for bit what plans without it compute, and what
the numpy reference computes, through several decode steps and a prefill."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from kv_runs import lowerings_agree

from eggfuse.cache import decode_plan, encode_plan
from eggfuse.lowering import lower
from eggfuse.lowering import prefetch as pf
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import optimize

# weights of 64 KiB and more (the smallest a dispatch prefetches), a vocabulary whose head is smaller
SMALL = LlamaConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256,
                    vocab_size=64, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False, max_seq=32)


@pytest.fixture(scope="module")
def graphs():
    decode, _ = optimize(build_llama_cache_graph(SMALL, 1, 16), max_iterations=4)
    prefill, _ = optimize(build_llama_cache_graph(SMALL, 5, 16))
    return decode, prefill


def _expected_prefetch(plan, k: int) -> tuple[int, ...]:
    # every weight of 64 KiB or more the dispatches read up to the next attention, in order of first use
    narrow = [i for i, d in enumerate(plan.dispatches) if d.prefetch]
    end = next((i for i in narrow if i > k), len(plan.dispatches))
    written = {d.output for d in plan.dispatches} | {d.bindings[i] for d in plan.dispatches for i in d.writable}
    out = []
    for d in plan.dispatches[k + 1:end]:
        for i in d.inputs:
            b = plan.buffers[i]
            if (i not in out and i not in written and b.kind in ("parameter", "derived", "constant")
                    and b.name not in plan.state and b.size_bytes >= 64 << 10):
                out.append(i)
    return tuple(out)


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_attention_dispatches_prefetch_the_weights_up_to_the_next_attention(graphs, which):
    graph = graphs[0] if which == "decode" else graphs[1]
    plan = lower(graph)  # WebGPU's default limits: 8 storage buffers a stage
    narrow = [k for k, d in enumerate(plan.dispatches) if d.prefetch]
    assert [plan.dispatches[k].op for k in narrow] == ["CachedAttentionRoPEAppend" if which == "decode"
                                                       else "CachedAttentionRoPE"] * SMALL.num_layers, \
        [d.op for d in plan.dispatches]
    for k in narrow:
        d = plan.dispatches[k]
        want = _expected_prefetch(plan, k)[:8 - len(d.bindings)]
        assert d.prefetch == want and d.prefetch, (d.label, d.prefetch, want)
        assert not {plan.buffers[i].name for i in d.prefetch} & plan.state  # never a KV cache
        assert d.kernel.endswith("+prefetch") and "prefetch_l2(" in d.source and pf.PREFETCH_HOOK not in d.source
    # without the pass: the same dispatches, none prefetching, fewer workgroups
    plain = lower(graph, prefetch=False)
    assert [d.op for d in plain.dispatches] == [d.op for d in plan.dispatches]
    assert not any(d.prefetch for d in plain.dispatches)
    for k in narrow:
        assert np.prod(plan.dispatches[k].workgroups) == np.prod(plain.dispatches[k].workgroups) \
            + pf.PREFETCH_WORKGROUPS


def test_the_limits_and_the_byte_budget_bound_what_is_prefetched(graphs, monkeypatch):
    graph = graphs[0]
    plan = lower(graph)
    d = next(d for d in plan.dispatches if d.prefetch)
    one = lower(graph, {"max-storage-buffers-per-shader-stage": len(d.bindings) + 1})
    assert [len(x.prefetch) for x in one.dispatches if x.prefetch] == [1] * SMALL.num_layers
    none = lower(graph, {"max-storage-buffers-per-shader-stage": len(d.bindings)})
    assert not any(x.prefetch for x in none.dispatches)
    first = plan.buffers[d.prefetch[0]].size_bytes
    monkeypatch.setattr(pf, "MAX_BYTES", first)  # room for the first buffer only
    assert [len(x.prefetch) for x in lower(graph).dispatches if x.prefetch] == [1] * SMALL.num_layers
    monkeypatch.setattr(pf, "NARROW_WORKGROUPS", 1)  # no dispatch is narrow
    assert not any(x.prefetch for x in lower(graph).dispatches)


def test_a_subgroup_plan_still_says_it_uses_subgroups(graphs):
    plan = lower(graphs[0], subgroups=True)
    assert plan.subgroups and any(d.prefetch for d in plan.dispatches)
    assert all(d.kernel.endswith("+prefetch+sg") for d in plan.dispatches if d.prefetch)


def test_lower_for_prefetches_on_gpus_only(graphs, device):
    cpu = device.adapter.info.get("adapter_type") == "CPU"
    assert any(d.prefetch for d in lower_for(graphs[0], device).dispatches) != cpu
    assert any(d.prefetch for d in lower_for(graphs[0], device, prefetch=True).dispatches)


def test_a_prefetched_buffer_past_the_budget_is_left_out_and_later_ones_taken(graphs, monkeypatch):
    roomy = {"max-storage-buffers-per-shader-stage": 64}  # the byte budget, not the bindings, binds
    plan = lower(graphs[0], roomy)
    d = next(d for d in plan.dispatches if d.prefetch)
    sizes = [plan.buffers[i].size_bytes for i in d.prefetch]
    assert len(sizes) >= 3 and sizes[1] > sizes[2], sizes  # the output projection, gate/up, down, ...
    monkeypatch.setattr(pf, "MAX_BYTES", sizes[0] + sizes[2])  # gate/up does not fit after the first
    got = next(x for x in lower(graphs[0], roomy).dispatches if x.prefetch).prefetch
    assert got == (d.prefetch[0], d.prefetch[2])


def test_a_prefetching_plan_round_trips_through_the_compile_cache(graphs):
    graph = graphs[0]
    plan = lower(graph)
    back = decode_plan(encode_plan(plan), graph)
    assert [d.prefetch for d in back.dispatches] == [d.prefetch for d in plan.dispatches]
    assert [(d.source, d.workgroups) for d in back.dispatches] == [(d.source, d.workgroups) for d in plan.dispatches]


def test_prefetching_plans_compute_what_plans_without_prefetch_compute(graphs, device):
    decode_graph, prefill_graph = graphs
    plans = lowerings_agree(SMALL, decode_graph, prefill_graph, device, [{"prefetch": True}, {"prefetch": False}],
                            seed=5, prompt=5, total=8, cache="blk.1.k_cache")
    for (decode, prefill), prefetch in zip(plans, (True, False), strict=True):
        assert any(d.prefetch for d in decode.dispatches) == prefetch
        assert any(d.prefetch for d in prefill.dispatches) == prefetch


def test_only_a_dispatch_with_the_hook_and_few_workgroups_is_narrow():
    d = lower(build_llama_cache_graph(SMALL, 1, 16), prefetch=False).dispatches[0]
    hooked = d.source + "\n" + pf.PREFETCH_HOOK
    assert pf.is_narrow(dataclasses.replace(d, source=hooked, workgroups=(9, 1, 1)))
    assert not pf.is_narrow(dataclasses.replace(d, source=hooked, workgroups=(pf.NARROW_WORKGROUPS, 1, 1)))
    assert not pf.is_narrow(dataclasses.replace(d, source=hooked.replace(pf.PREFETCH_HOOK, ""), workgroups=(9, 1, 1)))
