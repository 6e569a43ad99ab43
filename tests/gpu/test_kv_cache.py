"""Sessions sharing weights and KV cache (Session(..., share=...)) on a tiny random LLaMA."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, InputError, evaluate
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import optimize, random_feeds
from eggfuse.runtime import Session

TINY = LlamaConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                   vocab_size=50, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=64)


def test_prefill_and_decode_sessions_share_weights_and_cache(device):
    _, params = random_feeds(build_llama_graph(TINY, 1), seed=3)
    tokens = np.random.default_rng(4).integers(0, TINY.vocab_size, 10)
    want = evaluate(build_llama_graph(TINY, 10), {"tokens": tokens}, params)[0]
    # both optimised, as eggfuse.generate compiles them (gate/up packed: a shared derived parameter)
    decode_graph, _ = optimize(build_llama_cache_graph(TINY, 1, 16), max_iterations=4)
    prefill_graph, _ = optimize(build_llama_cache_graph(TINY, 6, 16))
    decode = Session(lower_for(decode_graph, device), params, device=device)
    # nothing to upload: every buffer is shared
    prefill = Session(lower_for(prefill_graph, decode.device), {}, share=decode)
    def place(session, index):  # a device buffer and the offset in it
        return id(session._buffers[index]), session._offsets[index]

    for name, index in prefill.plan.parameters.items():
        if prefill._buffers[index] is not None:
            assert place(prefill, index) == place(decode, decode.plan.parameters[name]), name
    decode_places = {place(decode, i) for i in range(len(decode.plan.buffers))}
    assert prefill.plan.derived and all(place(prefill, i) in decode_places for i in prefill.plan.derived)

    (got,) = prefill.run({"tokens": tokens[:6], "pos": [0]})
    np.testing.assert_allclose(got, want[:6], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for pos in range(6, 10):  # decode continues from the cache prefill wrote
        (got,) = decode.run({"tokens": tokens[pos:pos + 1], "pos": [pos]})
        np.testing.assert_allclose(got, want[pos:pos + 1], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    k_cache = decode.read_parameter("blk.1.k_cache")
    np.testing.assert_array_equal(prefill.read_parameter("blk.1.k_cache"), k_cache)
    assert np.abs(k_cache[:10]).min() > 0 and not k_cache[10:].any()  # rows 0..9 written, the rest zero


def test_sharing_a_parameter_of_another_shape_is_refused(device):
    def graph(width: int) -> Graph:
        g = Graph()
        g.set_outputs([g.relu(g.add(g.input("x", [width]), g.parameter("w", [width])))])
        return g

    first = Session(lower_for(graph(3), device), {"w": np.ones(3)}, device=device)
    with pytest.raises(InputError, match=r"parameter 'w' is f32\[4\] in this plan but f32\[3\] in the shared"):
        Session(lower_for(graph(4), first.device), {"w": np.ones(4)}, share=first)
    (out,) = Session(lower_for(graph(3), first.device), {}, share=first).run({"x": [-2.0, 0.5, 1.0]})
    np.testing.assert_array_equal(out, [0.0, 1.5, 2.0])


def test_cache_write_past_the_end_writes_only_the_rows_that_fit(device):
    # The reference refuses such a position (InputError); the kernel must stay inside the cache.
    g = Graph()
    cache = g.state("cache", [4, 3])
    g.set_outputs([g.add_node("CacheWrite", (cache, g.input("new", [3, 3]), g.input("pos", [1], DType.U32)))])
    s = Session(lower_for(g, device), {}, device=device)
    new = np.arange(1.0, 10.0).reshape(3, 3)
    (out,) = s.run({"new": new, "pos": [2]})
    np.testing.assert_array_equal(out, np.concatenate([np.zeros((2, 3)), new[:2]]))
    (out,) = s.run({"new": -new, "pos": [2**32 - 1]})  # no wrap-around to row 0
    np.testing.assert_array_equal(out, np.concatenate([np.zeros((2, 3)), new[:2]]))



@pytest.mark.parametrize("hd, starts", [
    (8, (0, 32, 48)),   # the packed layout: q, k, v in order, vec4 loads
    (8, (18, 2, 10)),   # windows in any order, q's start not a multiple of 4: element loads
    (6, (5, 23, 35)),   # a head size that is not a multiple of 4
])
def test_readers_of_column_windows_match_the_reference(device, hd, starts):
    # CacheWrite, CacheWriteRoPE and CachedAttention(RoPE) reading their rows as columns col_start.. of one
    # wider input (what the decode step's packed Q/K/V projection leaves them), at a position past 0 over
    # caches that already hold rows
    nh, nkv, n, rows = 4, 2, 2, 7
    width = max(s + w for s, w in zip(starts, (nh * hd, nkv * hd, nkv * hd), strict=True)) + 3
    g = Graph()
    pos, packed = g.input("pos", [1], DType.U32), g.input("packed", [n, width])
    rope = dict(theta=100.0, head_dim=hd)
    k_cache = g.add_node("CacheWriteRoPE", (g.state("k_cache", [rows, nkv * hd]), packed, pos), **rope,
                         col_start=starts[1])
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), packed, pos), col_start=starts[2])
    heads = dict(num_heads=nh, num_kv_heads=nkv, head_dim=hd, col_start=starts[0])
    g.set_outputs([g.add_node("CachedAttentionRoPE", (packed, k_cache, v_cache, pos), theta=100.0, **heads),
                   g.add_node("CachedAttention", (packed, k_cache, v_cache, pos), **heads), k_cache, v_cache])
    rng = np.random.default_rng(5)
    caches = {name: rng.standard_normal((rows, nkv * hd)).astype(np.float32) for name in ("k_cache", "v_cache")}
    feeds = {"packed": rng.standard_normal((n, width)).astype(np.float32), "pos": np.array([3], np.uint32)}
    want = evaluate(g, feeds, caches)
    got = Session(lower_for(g, device), caches, device=device).run(feeds)
    for k, (x, y) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")
