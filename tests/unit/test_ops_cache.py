"""KV-cache ops (ir/ops/kv_cache.py) and the LLaMA cache graph on the numpy reference: no GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, GraphError, InputError, evaluate
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
from eggfuse.rewrites import optimize, random_feeds

#: A LLaMA small enough for float64 numpy: 2 layers, GQA 4/2 heads of 8.
TINY = LlamaConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                   vocab_size=50, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=64)


def _pos(g: Graph) -> int:
    return g.input("pos", [1], DType.U32)


# --- shape rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("build, message", [
    (lambda g: g.add_node("CacheWrite", (g.input("c", [8, 4]), g.input("n", [1, 5]), _pos(g))), "same width"),
    (lambda g: g.add_node("CacheWrite", (g.input("c", [2, 4]), g.input("n", [3, 4]), _pos(g))), "do not fit"),
    (lambda g: g.add_node("CacheWrite", (g.input("c", [8, 4]), g.input("n", [1, 4]), g.input("p", [1]))),
     r"pos must be u32\[1\]"),
    (lambda g: g.add_node("RoPEDynamic", (g.input("x", [3, 8]), g.input("o", [2], DType.U32)), theta=1e4,
                          head_dim=8), r"offset must be u32\[1\]"),
    (lambda g: g.add_node("RoPEDynamic", (g.input("x", [3, 12]), _pos(g)), theta=1e4, head_dim=8),
     "not a multiple of head_dim"),
    (lambda g: g.add_node("CachedAttention", (g.input("q", [1, 16]), g.input("k", [8, 8]), g.input("v", [9, 8]),
                                              _pos(g)), num_heads=2, num_kv_heads=1, head_dim=8), "same shape"),
    (lambda g: g.add_node("CachedAttention", (g.input("q", [9, 16]), g.input("k", [8, 8]), g.input("v", [8, 8]),
                                              _pos(g)), num_heads=2, num_kv_heads=1, head_dim=8), "do not fit"),
])
def test_shape_rules_name_the_problem(build, message):
    with pytest.raises(GraphError, match=message):
        build(Graph())


# --- references ------------------------------------------------------------------------------


def test_cache_write_overwrites_rows_and_refuses_rows_past_the_end():
    g = Graph()
    g.set_outputs([g.add_node("CacheWrite", (g.input("c", [5, 2]), g.input("n", [2, 2]), _pos(g)))])
    cache, new = np.arange(10.0).reshape(5, 2), -np.ones((2, 2))
    (out,) = evaluate(g, {"c": cache, "n": new, "pos": [3]}, {})
    np.testing.assert_array_equal(out, np.concatenate([cache[:3], new]))
    with pytest.raises(InputError, match=r"rows 4..5 do not fit a cache of 5 rows"):
        evaluate(g, {"c": cache, "n": new, "pos": [4]}, {})


def test_rope_dynamic_is_rope_at_the_offset():
    x = np.random.default_rng(0).standard_normal((6, 16))
    for pairing in ("half", "adjacent"):
        g = Graph()
        xi = g.input("x", [6, 16])
        dyn = g.add_node("RoPEDynamic", (xi, _pos(g)), theta=500.0, head_dim=8, pairing=pairing)
        g.set_outputs([dyn, g.rope(xi, 500.0, 8, pos_offset=13, pairing=pairing)])
        got, want = evaluate(g, {"x": x, "pos": [13]}, {})
        np.testing.assert_array_equal(got, want)


def test_cached_attention_is_softmax_over_the_cache_prefix():
    # Written from Vaswani et al. eq. 1 per query row: row i at position pos + i sees keys 0..pos+i.
    rng = np.random.default_rng(1)
    nh, nkv, hd, rows, n, pos = 4, 2, 8, 12, 3, 5
    # f32 values: the interpreter rounds its leaves to f32 before computing in float64
    q, k, v = (rng.standard_normal(shape).astype(np.float32).astype(np.float64)
               for shape in ((n, nh * hd), (rows, nkv * hd), (rows, nkv * hd)))
    g = Graph()
    g.set_outputs([g.add_node("CachedAttention", (g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape),
                                                  _pos(g)), num_heads=nh, num_kv_heads=nkv, head_dim=hd)])
    (got,) = evaluate(g, {"q": q, "k": k, "v": v, "pos": [pos]}, {})
    for i in range(n):
        for h in range(nh):
            kh = h // (nh // nkv)
            keys = k[:pos + i + 1, kh * hd:(kh + 1) * hd]
            s = keys @ q[i, h * hd:(h + 1) * hd] / np.sqrt(hd)
            w = np.exp(s - s.max())
            want = (w / w.sum()) @ v[:pos + i + 1, kh * hd:(kh + 1) * hd]
            np.testing.assert_allclose(got[i, h * hd:(h + 1) * hd], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="do not fit"):
        evaluate(g, {"q": q, "k": k, "v": v, "pos": [10]}, {})


# --- the cache graph ---------------------------------------------------------------------------


def _tiny_params(seed: int = 0) -> dict[str, np.ndarray]:
    _, params = random_feeds(build_llama_graph(TINY, 1), seed)
    return params


def _run_cache_graph(graph: Graph, tokens, pos: int, params: dict, state: dict) -> np.ndarray:
    # One run of a cache graph on the reference; ``state`` (the caches) is updated as a session would.
    writes = [n.id for n in graph.nodes if n.op == "CacheWrite"]
    logits, *caches = evaluate(graph, {"tokens": tokens, "pos": [pos]}, {**params, **state},
                               outputs=[graph.outputs[0], *writes])
    for node_id, cache in zip(writes, caches, strict=True):
        state[graph.node(graph.node(node_id).inputs[0]).attrs["name"]] = cache
    return logits


def test_cache_graph_prefill_then_decode_equals_the_plain_graph_on_the_whole_sequence():
    # The caches go back in as leaves, which the interpreter rounds to f32: hence rtol 1e-6.
    params = _tiny_params()
    tokens = np.random.default_rng(2).integers(0, TINY.vocab_size, 9)
    want = evaluate(build_llama_graph(TINY, 9), {"tokens": tokens}, params)[0]
    prefill, decode = build_llama_cache_graph(TINY, 5, 16), build_llama_cache_graph(TINY, 1, 16)
    state = {name: np.zeros(ty.shape) for name, ty in prefill.parameters.items() if name.endswith("_cache")}
    assert sorted(state) == ["blk.0.k_cache", "blk.0.v_cache", "blk.1.k_cache", "blk.1.v_cache"]
    np.testing.assert_allclose(_run_cache_graph(prefill, tokens[:5], 0, params, state), want[:5], rtol=1e-12)
    for pos in range(5, 9):
        got = _run_cache_graph(decode, tokens[pos:pos + 1], pos, params, state)
        np.testing.assert_allclose(got, want[pos:pos + 1], rtol=1e-6, atol=1e-6 * np.abs(want).max())
    last = build_llama_cache_graph(TINY, 5, 16, last_logits=True)
    np.testing.assert_allclose(_run_cache_graph(last, tokens[:5], 0, params, dict(state)), want[4:5], rtol=1e-12)


def test_cache_graph_arguments():
    with pytest.raises(GraphError, match=r"max_seq must lie in \[1, 64\]"):
        build_llama_cache_graph(TINY, 1, 65)
    with pytest.raises(GraphError, match=r"seq must lie in \[1, 8\]"):
        build_llama_cache_graph(TINY, 9, 8)
    untied = build_llama_cache_graph(dataclasses.replace(TINY, tied_embeddings=False), 2, 8, layers=1)
    assert "output.weight" in untied.parameters and list(untied.inputs) == ["tokens", "pos"]


def test_rewrite_engine_keeps_the_cache_writes_and_the_numbers():
    # verify=True evaluates both graphs on the reference (random caches, position 0)
    for seq in (1, 6):
        graph = build_llama_cache_graph(TINY, seq, 16)
        out, report = optimize(graph, verify=True, max_iterations=4)
        ops = [n.op for n in out.live_nodes()]
        if seq == 1:  # the writes of the decode step inside its attention, which appends k (rotated) and v
            assert ops.count("CachedAttentionRoPEAppend") == TINY.num_layers and "CacheWrite" not in ops
        else:
            assert ops.count("CacheWrite") == ops.count("CacheWriteRoPE") == TINY.num_layers  # v; k, rotated
        assert report.dispatches_after < report.dispatches_before


def test_smollm2_decode_step_dispatches_fused_and_unfused():
    # The figure eggfuse generate reports; meganeura 0.2.0 needs 423 dispatches per token.
    graph = build_llama_cache_graph(LlamaConfig.smollm2_135m(), 1, 256)
    out, report = optimize(graph)
    print(f"decode step: {report.dispatches_before} unfused -> {report.dispatches_after} fused dispatches "
          f"({report.total_s:.2f}s, {report.stop_reason})")
    assert report.saturated  # one-row graphs once grew bias chains without end
    # per layer 5: the packed Q/K/V projection with the RmsNorm prologue, CachedAttentionRoPEAppend reading q's
    # columns of it and appending k's (rotated) and v's to the caches, the output projection with the residual
    # add, the packed gate/up projection with the RmsNorm prologue, the down projection with SwiGLU as it
    # loads (FusedSwiGLUMatMul) and the residual add; then the embedding and the final norm with the LM head
    assert (report.dispatches_before, report.dispatches_after) == (513, 30 * 5 + 2)
    ops = [n.op for n in out.live_nodes()]
    assert ops.count("SliceCols") == 0  # the readers take their columns of the packed projection
