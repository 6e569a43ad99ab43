"""f16 weight storage without a GPU: the ``f16`` format against numpy's float16 (and gguf's F16
rows), ToF16's reference, the storage conversion of models/gguf.py, and the ``f16`` ruleset on
LLaMA and BERT graphs (every matmul weight and embedding table stored f16, packed QKV and gate/up
kept, the dispatches of the f32 plan, half the weight bytes)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from eggfuse.ir import DType, Graph, GraphError, InputError, evaluate
from eggfuse.ir.ops.quant import F16_MAX, dequantize, f16_rows
from eggfuse.lowering import lower
from eggfuse.models import gguf as model_gguf
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
from eggfuse.models.minilm import BertConfig, build_bert_graph
from eggfuse.pipeline import precision_rulesets
from eggfuse.rewrites import optimize, random_feeds

TINY = LlamaConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96,
                   vocab_size=40, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=32)
TINY_BERT = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                       vocab_size=50, max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12)


def test_f16_rows_are_numpys_halves_and_ggufs_f16_bytes():
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32) * 100
    x[0, :4] = [0.0, -0.0, 6e-8, 65504.0]  # zero, negative zero, a subnormal half, the largest half
    words = f16_rows(x)
    assert words.dtype == np.uint32 and words.shape == (5, 32)
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.F16)
    np.testing.assert_array_equal(words.view(np.uint8).reshape(5, -1), raw.view(np.uint8).reshape(5, -1))
    np.testing.assert_array_equal(dequantize(words, "f16", 64), x.astype(np.float16).astype(np.float64))


def test_to_f16_stacks_its_inputs_then_rounds():
    g = Graph()
    a, b = g.parameter("a", [3, 64]), g.parameter("b", [2, 64])
    g.set_outputs([g.add_node("ToF16", (a, b))])
    assert g.node(g.outputs[0]).type.shape == (5, 32) and g.node(g.outputs[0]).type.dtype is DType.U32
    rng = np.random.default_rng(1)
    pa, pb = rng.standard_normal((3, 64)).astype(np.float32), rng.standard_normal((2, 64)).astype(np.float32)
    (got,) = evaluate(g, {}, {"a": pa, "b": pb})
    want = np.concatenate([pa, pb]).astype(np.float16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(got, want[:, 0::2] | (want[:, 1::2] << 16))


def test_to_f16_refuses_odd_columns_and_non_f32():
    g = Graph()
    with pytest.raises(GraphError, match=r"input 0 is f32\[3,5\].* the same even number of columns \(\[N_i, K\], K "
                                         r"even\); pad K to an even size"):
        g.add_node("ToF16", (g.parameter("a", [3, 5]),))
    with pytest.raises(GraphError, match=r"input 1 is f32\[4,3\], beside input 0 f32\[6,3\]: .* same even number "
                                         r"of rows \(transposed: \[K, N_i\], K even\)"):
        g.add_node("ToF16", (g.parameter("w", [6, 3]), g.parameter("x", [4, 3])), transposed=True)
    with pytest.raises(Exception, match="f32"):
        g.add_node("ToF16", (g.parameter("q", [3, 4], DType.U32),))


def test_requantise_to_f16_rounds_floats_and_dequantised_blocks():
    rng = np.random.default_rng(2)
    w, blocks_src = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((3, 64)).astype(np.float32)
    raw = gguf.quants.quantize(blocks_src, gguf.GGMLQuantizationType.Q4_1)
    params = {"w": w, "q": model_gguf.pack_rows(raw), "norm": np.ones(64, np.float32)}
    out, formats = model_gguf.requantise(params, {"q": "q4_1"}, "f16")
    assert formats == {"w": "f16", "q": "f16"} and out["norm"] is params["norm"]
    np.testing.assert_array_equal(dequantize(out["w"], "f16", 64), w.astype(np.float16))
    q41 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1)  # gguf's values, then rounded once
    np.testing.assert_array_equal(dequantize(out["q"], "f16", 64), q41.astype(np.float16))
    assert params["w"] is w and params["q"].dtype == np.uint32  # nothing passed in is modified
    with pytest.raises(InputError, match=r"weight 'big' \[2, 32\] holds 70000, beyond float16's largest value 65504"):
        model_gguf.requantise({"big": np.full((2, 32), 7e4, np.float32)}, {}, "f16")
    assert F16_MAX == float(np.finfo(np.float16).max)


def _f16(graph: Graph) -> Graph:
    return optimize(graph, rulesets=precision_rulesets("f16"))[0]


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.live_nodes()]


@pytest.mark.parametrize("build", [lambda: build_llama_graph(TINY, 6), lambda: build_llama_cache_graph(TINY, 1, 16)],
                         ids=["prefill", "decode"])
def test_llama_in_f16_stores_every_weight_as_halves(build):
    f32, f16 = optimize(build())[0], _f16(build())
    ops = _ops(f16)
    assert not {"FusedMatMul", "FusedRmsNormMatMul", "FusedRmsNormMatMulSwiGLU", "Dequant"} & set(ops)
    assert ops.count("QuantMatMul") == _ops(f32).count("FusedMatMul")
    assert ops.count("QuantRmsNormMatMul") == _ops(f32).count("FusedRmsNormMatMul")
    assert ops.count("QuantRmsNormMatMulSwiGLU") == _ops(f32).count("FusedRmsNormMatMulSwiGLU")
    assert ops.count("QuantEmbedding") == 1 and f16.dispatch_count() == f32.dispatch_count()
    assert {n.attrs["format"] for n in f16.live_nodes() if n.op.startswith("Quant")} == {"f16"}
    packed = [n for n in f16.live_nodes() if n.op == "ToF16"]
    assert all(f16.is_derived_parameter(n) for n in packed)
    # packed as the f32 plan packs (prefill: gate/up and q/k/v of both layers; decode: gate/up)
    assert sorted(len(n.inputs) for n in packed if len(n.inputs) > 1) == \
        sorted(len(n.inputs) for n in f32.live_nodes() if n.op == "Concat")
    assert sum(len(n.inputs) for n in packed) == 1 + 7 * TINY.num_layers  # the table (tied LM head), 7 a layer
    plan, plan32 = lower(f16), lower(f32)
    assert {d.store for d in plan.derived.values()} == {"f16"} and not any("to_f16" in d.kernel
                                                                            for d in plan.dispatches)
    norms = sum(t.size_bytes for n, t in build().parameters.items() if len(t.shape) == 1)
    assert plan.memory()["weights_bytes"] - norms == (plan32.memory()["weights_bytes"] - norms) // 2


def test_bert_in_f16_stores_every_linear_weight_and_table_as_halves():
    graph = build_bert_graph(TINY_BERT, 2, 8)
    f32, f16 = optimize(graph)[0], _f16(graph)
    ops = _ops(f16)
    assert not [n for n in f16.live_nodes() if n.op in ("FusedMatMul", "FusedMatMulLayerNorm")
                and f16.node(n.inputs[1]).op == "Parameter"]
    # word, position and token type tables read as halves by the embedding layer's one kernel
    (emb,) = [n for n in f16.live_nodes() if n.op == "EmbeddingSumLayerNorm"]
    assert emb.attrs["format"] == "f16" and [f16.node(t).op for t in emb.inputs[3::2]] == ["ToF16"] * 3
    assert "Embedding" not in ops and "QuantEmbedding" not in ops
    assert ops.count("QuantMatMul") == sum(1 for n in f32.live_nodes() if n.op == "FusedMatMul"  # Q/K/V packed
                                           and f32.node(n.inputs[1]).op in ("Parameter", "Concat"))
    # the attention output and FFN down projections, with their LayerNorms (ir/ops/matmul_rows.py)
    layers = TINY_BERT.num_hidden_layers
    assert ops.count("QuantMatMulLayerNorm") == _ops(f32).count("FusedMatMulLayerNorm") == 2 * layers
    assert ops.count("FullAttentionPacked") == 2
    assert f16.dispatch_count() == f32.dispatch_count()
    plan, plan32 = lower(f16), lower(f32)
    mats = sum(t.size_bytes for t in graph.parameters.values() if len(t.shape) == 2)
    assert plan32.memory()["weights_bytes"] - plan.memory()["weights_bytes"] == mats // 2


def test_a_linear_layer_before_an_rms_norm_stores_its_weight_as_halves():
    # RmsNorm(x @ W^T + b, w) fuses into FusedMatMulRmsNorm, whose quantised form keeps W in f16 (K % 32 == 0)
    g = Graph()
    h = g.bias_add(g.matmul_bt(g.input("x", [64, 64]), g.parameter("w", [48, 64])), g.parameter("b", [48]))
    g.set_outputs([g.rms_norm(h, g.parameter("w_norm", [48]))])
    f16 = _f16(g)
    (norm,) = [n for n in f16.live_nodes() if n.op == "QuantMatMulRmsNorm"]
    assert norm.attrs["format"] == "f16" and f16.node(norm.inputs[1]).op == "ToF16"
    assert not {"FusedMatMulRmsNorm", "RmsNorm", "FusedMatMul"} & set(_ops(f16))
    assert lower(f16).memory()["weights_bytes"] == 48 * 64 * 2 + 2 * 48 * 4  # W halves; bias, w_norm f32


def test_f16_plan_reference_is_the_f32_graph_on_rounded_weights():
    graph = build_llama_graph(TINY, 5)
    params = random_feeds(graph, 3)[1]
    rounded = {n: a.astype(np.float16).astype(np.float32) if a.ndim == 2 else a for n, a in params.items()}
    tokens = np.array([3, 1, 4, 1, 5], dtype=np.uint32)
    want = evaluate(graph, {"tokens": tokens}, rounded)[0]
    got = evaluate(_f16(graph), {"tokens": tokens}, params)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_precision_is_checked():
    with pytest.raises(InputError, match="precision must be one of f32, f16, got 'bf16'"):
        precision_rulesets("bf16")


def test_optimize_cli_precision_f16_halves_the_weight_bytes_the_cost_model_sees(capsys):
    from eggfuse import cli

    got = {}
    for precision in ("f32", "f16"):
        assert cli.main(["optimize", "llama:2", "--precision", precision, "--json"]) == 0
        got[precision] = json.loads(capsys.readouterr().out)
    assert got["f16"]["dispatches_after"] == got["f32"]["dispatches_after"]
    params = build_llama_graph(LlamaConfig.smollm2_135m(), 16, layers=2).parameters
    weights = sum(t.size_bytes for t in params.values() if len(t.shape) == 2)
    # every 2-D weight read once, the tied table twice (the embedding lookup, charged its whole table by
    # the cost model, and the LM head), each read at half the bytes
    saved = got["f32"]["bytes_after"] - got["f16"]["bytes_after"]
    assert saved == (weights + params["token_embd.weight"].size_bytes) // 2
    assert cli.main(["optimize", "llama:2", "--precision", "f16", "--verify"]) == 2
    assert "--verify compares with the f32 graph" in capsys.readouterr().err
