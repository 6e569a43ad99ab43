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


def _append_graph(nh, nkv, hd, rows, n, packed, extra_reader=False):
    # CachedAttentionRoPEAppend on state caches, and the same step as the three ops it replaces (the
    # reference for the caches' new contents: CacheWriteRoPE's and CacheWrite's values)
    widths = (nh * hd, nkv * hd, nkv * hd)
    rope = dict(theta=10000.0, head_dim=hd, pairing="half")
    g = Graph()
    pos = g.input("pos", [1], DType.U32)
    if packed:
        x = g.input("qkv", [n, sum(widths)])
        ins, starts = (x, x, x), (0, widths[0], widths[0] + widths[1])
    else:
        ins, starts = tuple(g.input(t, [n, w]) for t, w in zip("qkv", widths, strict=True)), (-1, -1, -1)
    kc, vc = g.state("k_cache", [rows, nkv * hd]), g.state("v_cache", [rows, nkv * hd])
    outputs = [g.add_node("CachedAttentionRoPEAppend", (*ins, kc, vc, pos), num_heads=nh, num_kv_heads=nkv, **rope,
                          **dict(zip(("q_start", "k_start", "v_start"), starts, strict=True)))]
    if extra_reader:  # a reader of the caches' old contents, which must run before the update
        outputs.append(g.add(kc, vc))
    ref = Graph()
    pos_r = ref.input("pos", [1], DType.U32)
    ins_r = (ref.input("qkv", [n, sum(widths)]),) * 3 if packed else \
        tuple(ref.input(t, [n, w]) for t, w in zip("qkv", widths, strict=True))
    kw = ref.add_node("CacheWriteRoPE", (ref.state("k_cache", [rows, nkv * hd]), ins_r[1], pos_r), **rope,
                      col_start=starts[1])
    vw = ref.add_node("CacheWrite", (ref.state("v_cache", [rows, nkv * hd]), ins_r[2], pos_r), col_start=starts[2])
    ref.set_outputs([ref.add_node("CachedAttentionRoPE", (ins_r[0], kw, vw, pos_r), num_heads=nh, num_kv_heads=nkv,
                                  **rope, col_start=starts[0]), kw, vw])
    g.set_outputs(outputs)
    return g, ref


@pytest.mark.parametrize("nh, nkv, hd, rows, n, packed", [
    (9, 3, 64, 40, 1, True),    # SmolLM2's heads, the decode step's packed projection
    (4, 2, 8, 12, 3, False),    # several new rows, inputs of their own
    (4, 2, 6, 12, 2, True),     # element-wise reads and writes
])
def test_append_attention_updates_the_caches_as_the_ops_it_replaces(device, nh, nkv, hd, rows, n, packed):
    # three steps, each at the position the last one ended: the attention output and both caches against
    # the reference of CacheWriteRoPE, CacheWrite and CachedAttentionRoPE, carried over the steps
    g, ref = _append_graph(nh, nkv, hd, rows, n, packed, extra_reader=True)
    rng = np.random.default_rng(11)
    caches = {name: rng.standard_normal((rows, nkv * hd)).astype(np.float32) for name in ("k_cache", "v_cache")}
    session = Session(lower_for(g, device), dict(caches), device=device)
    # one dispatch for one new row; for several the three it replaces (the cache writes, then the attention)
    assert [d.op for d in session.plan.dispatches].count("CachedAttentionRoPEAppend") == (1 if n == 1 else 3)
    for step, pos in enumerate((1, 1 + n, 1 + 2 * n)):
        feeds = {name: rng.standard_normal(ty.shape).astype(np.float32) for name, ty in ref.inputs.items()
                 if name != "pos"} | {"pos": np.array([pos], np.uint32)}
        attn, k_new, v_new = evaluate(ref, feeds, caches)
        got, old_sum = session.run(feeds)
        np.testing.assert_allclose(got, attn, rtol=1e-5, atol=1e-5 * np.abs(attn).max(), err_msg=f"step {step}")
        np.testing.assert_allclose(old_sum, caches["k_cache"] + caches["v_cache"], rtol=1e-6, atol=1e-6)
        for name, want in (("k_cache", k_new), ("v_cache", v_new)):
            np.testing.assert_allclose(session.read_parameter(name), want, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name} after step {step}")
        caches = {"k_cache": k_new.astype(np.float32), "v_cache": v_new.astype(np.float32)}


def test_append_attention_past_the_cache_end_writes_only_the_rows_that_fit(device):
    # the reference refuses such a position (InputError); the kernel must neither read nor write past the caches
    g, _ = _append_graph(2, 1, 8, 6, 3, False)
    rng = np.random.default_rng(2)
    caches = {name: rng.standard_normal((6, 8)).astype(np.float32) for name in ("k_cache", "v_cache")}
    feeds = {t: rng.standard_normal((3, w)).astype(np.float32) for t, w in (("q", 16), ("k", 8), ("v", 8))}
    with pytest.raises(InputError, match="do not fit a cache of 6 rows"):
        evaluate(g, {**feeds, "pos": np.array([4])}, caches)
    session = Session(lower_for(g, device), dict(caches), device=device)
    session.run({**feeds, "pos": np.array([4])})
    v_cache = session.read_parameter("v_cache")
    np.testing.assert_array_equal(v_cache[:4], caches["v_cache"][:4])
    np.testing.assert_array_equal(v_cache[4:], feeds["v"][:2])  # rows 4 and 5; row 6 would be past the end
    session.run({**feeds, "pos": np.array([2**32 - 1])})  # no wrap-around to row 0
    np.testing.assert_array_equal(session.read_parameter("v_cache")[:4], caches["v_cache"][:4])


def test_an_output_of_a_cache_the_append_attention_updates_is_refused(device):
    from eggfuse.ir import LoweringError

    g, _ = _append_graph(2, 1, 8, 6, 1, False)
    g.set_outputs([*g.outputs, next(n.id for n in g.nodes if n.attrs.get("name") == "k_cache")])
    with pytest.raises(LoweringError, match="a later in-place update overwrites"):
        lower_for(g, device)


def test_decode_step_appends_inside_the_attention(device):
    # the rule's effect on a LLaMA decode step: one dispatch per layer where CacheWriteRoPE, CacheWrite and
    # CachedAttentionRoPE were three; a prefill of several rows keeps the three (the kernel's new keys go one
    # at a time)
    decode, _ = optimize(build_llama_cache_graph(TINY, 1, 16))
    prefill, _ = optimize(build_llama_cache_graph(TINY, 6, 16))
    ops = [[d.op for d in lower_for(g, device).dispatches] for g in (decode, prefill)]
    assert ops[0].count("CachedAttentionRoPEAppend") == TINY.num_layers and "CacheWrite" not in ops[0]
    assert "CachedAttentionRoPEAppend" not in ops[1] and ops[1].count("CacheWrite") == TINY.num_layers


def test_one_row_append_attention_at_the_cache_end_writes_nothing(device):
    # one new row (the fused kernel) at a position the cache has no row for: the reference refuses it, the
    # kernel leaves both caches as they were
    g, _ = _append_graph(2, 1, 8, 6, 1, True)
    rng = np.random.default_rng(3)
    caches = {name: rng.standard_normal((6, 8)).astype(np.float32) for name in ("k_cache", "v_cache")}
    session = Session(lower_for(g, device), dict(caches), device=device)
    qkv = rng.standard_normal((1, 32)).astype(np.float32)
    for pos in (6, 7, 2**32 - 1):
        with pytest.raises(InputError, match="do not fit a cache of 6 rows"):
            evaluate(g, {"qkv": qkv, "pos": np.array([pos])}, caches)
        session.run({"qkv": qkv, "pos": np.array([pos])})
        for name in ("k_cache", "v_cache"):
            np.testing.assert_array_equal(session.read_parameter(name), caches[name], err_msg=f"{name} at {pos}")


def _step(g, q_rows: int, kv_rows: int, readers: int, nh=4, nkv=2, hd=8, rows=16):
    # CacheWriteRoPE, CacheWrite and `readers` CachedAttentionRoPE of the updated caches, each with a q of its
    # own; outputs the attentions, then the updated caches
    rope = dict(theta=10000.0, head_dim=hd, pairing="half")
    pos = g.input("pos", [1], DType.U32)
    k, v = g.input("k", [kv_rows, nkv * hd]), g.input("v", [kv_rows, nkv * hd])
    kw = g.add_node("CacheWriteRoPE", (g.state("k_cache", [rows, nkv * hd]), k, pos), **rope)
    vw = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), v, pos))
    return [g.add_node("CachedAttentionRoPE", (g.input(f"q{i}", [q_rows, nh * hd]), kw, vw, pos), num_heads=nh,
                       num_kv_heads=nkv, **rope) for i in range(readers)], (kw, vw)


@pytest.mark.parametrize("q_rows, kv_rows, readers", [
    (1, 3, 1),  # one query row over three new keys (a last-token prefill): all three rows are appended
    (1, 1, 2),  # two attentions of one cache update: both fused, neither waits for the other
])
def test_optimised_cache_steps_append_every_row_the_unfused_graph_writes(device, q_rows, kv_rows, readers):
    g = Graph()
    attns, caches_out = _step(g, q_rows, kv_rows, readers)
    g.set_outputs(attns)
    ref = Graph()
    ref_attns, ref_caches = _step(ref, q_rows, kv_rows, readers)
    ref.set_outputs([*ref_attns, *ref_caches])
    out, _ = optimize(g)
    assert [n.op for n in out.live_nodes()].count("CachedAttentionRoPEAppend") == readers
    rng = np.random.default_rng(8)
    caches = {name: rng.standard_normal((16, 16)).astype(np.float32) for name in ("k_cache", "v_cache")}
    feeds = {name: rng.standard_normal(ty.shape).astype(np.float32) for name, ty in ref.inputs.items()
             if name != "pos"} | {"pos": np.array([3], np.uint32)}
    *want_attns, want_k, want_v = evaluate(ref, feeds, caches)
    session = Session(lower_for(out, device), dict(caches), device=device)
    for got, want in zip(session.run(feeds), want_attns, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    for name, want in (("k_cache", want_k), ("v_cache", want_v)):
        np.testing.assert_allclose(session.read_parameter(name), want, rtol=1e-6, atol=1e-6, err_msg=name)
