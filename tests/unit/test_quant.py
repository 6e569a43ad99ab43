"""Quantised weights (ir/ops/quant.py, models/gguf.py) without a GPU: the reference decoder against
gguf's dequantisers, the ops' shape rules and errors, the rewrite rules on LLaMA graphs whose
weights are blocks (every Dequant folded into a kernel, QKV and gate/up still packed), the
storage conversions of models/gguf.py and the memory figures of a plan."""

from __future__ import annotations

import zlib

import gguf
import numpy as np
import pytest

from eggfuse.ir import DType, Graph, GraphError, InputError, evaluate
from eggfuse.ir.ops.fused_epilogue import is_expr
from eggfuse.ir.ops.quant import FORMATS, block_bytes, dequantize, pack_rows
from eggfuse.lowering import lower
from eggfuse.models import gguf as model_gguf
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
from eggfuse.rewrites import optimize, random_feeds
from eggfuse.rewrites.rulesets import optimization_rulesets, rules_of, select

QTYPE = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
         "q8_0": gguf.GGMLQuantizationType.Q8_0, "f16": gguf.GGMLQuantizationType.F16}

#: A LLaMA whose rows are whole blocks: hidden 64, GQA 2/1 heads of 32, 2 layers.
TINY = LlamaConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96,
                   vocab_size=40, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=32)

#: The rules that move elementwise ops into a product's store (ir/ops/epilogue_rules.py).
REGION_RULES = [r for rs in optimization_rulesets() for r in rules_of(rs) or () if "+[ex " in r]


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))


# --- the reference decoder -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("cols", [32, 96, 576])
def test_dequantize_matches_gguf(fmt, cols):
    x = _rng(f"{fmt}{cols}").standard_normal((7, cols)).astype(np.float32) * 3
    x[0] = 0.0  # a zero row: zero scales
    x[1, :32] = np.linspace(-1e-6, 1e-6, 32)  # subnormal float16 scales
    raw = gguf.quants.quantize(x, QTYPE[fmt]).view(np.uint8).reshape(7, -1)  # F16 gives halves: their bytes
    words = pack_rows(raw)
    assert words.dtype == np.uint32 and words.shape == (7, FORMATS[fmt].row_words(cols))
    np.testing.assert_array_equal(block_bytes(words, fmt, cols).reshape(7, -1), raw)  # padding dropped again
    np.testing.assert_array_equal(dequantize(words, fmt, cols).astype(np.float32),
                                  gguf.quants.dequantize(gguf.quants.quantize(x, QTYPE[fmt]), QTYPE[fmt]))


def test_rows_are_padded_to_whole_words():
    # three Q8_0 blocks are 102 bytes: a row of 26 words, the last two bytes zero
    raw = gguf.quants.quantize(_rng("pad").standard_normal((2, 96)).astype(np.float32), QTYPE["q8_0"])
    words = pack_rows(raw)
    assert words.shape == (2, 26) and not (words[:, -1] >> 16).any()
    assert FORMATS["q4_1"].row_words(576) == 90 and FORMATS["q8_0"].row_words(576) == 153


# --- shape rules -------------------------------------------------------------------------------


def _blocks(g, rows, words, dtype=DType.U32):
    return g.parameter("q", [rows, words], dtype)


@pytest.mark.parametrize("build, message", [
    (lambda g: g.add_node("Dequant", (_blocks(g, 4, 5),), format="q4_1", cols=40), "multiple of 32"),
    (lambda g: g.add_node("Dequant", (_blocks(g, 4, 6),), format="q4_1", cols=32), r"u32 \[rows, 5\]"),
    (lambda g: g.add_node("Dequant", (_blocks(g, 4, 5, DType.F32),), format="q4_1", cols=32), r"got f32\[4,5\]"),
    (lambda g: g.add_node("Dequant", (_blocks(g, 4, 5),), format="q5_0", cols=32), "formats: q4_0, q4_1, q8_0"),
    (lambda g: g.add_node("QuantMatMul", (g.input("a", [3, 64]), _blocks(g, 8, 5)), format="q4_1"),
     r"64 weights a row in q4_1"),
    (lambda g: g.add_node("QuantRmsNormMatMul", (g.input("x", [3, 32]), g.parameter("w", [31]), _blocks(g, 8, 5)),
                          eps=1e-5, format="q4_1"), r"w_norm must be \[32\]"),
    (lambda g: g.add_node("QuantMatMul", (g.input("a", [3, 32]), _blocks(g, 8, 5), g.input("d", [3, 7])),
                          format="q4_1", epilogue=("add",)), r"epilogue add operand must be \(3, 8\)"),
    (lambda g: g.add_node("QuantEmbedding", (g.input("t", [2]), _blocks(g, 8, 5)), format="q4_1", cols=32),
     "indices must be u32"),
])
def test_shape_rules_name_the_problem(build, message):
    with pytest.raises(GraphError, match=message):
        build(Graph())


def test_quantised_graph_reference_equals_the_dequantised_f32_graph():
    params = random_feeds(build_llama_graph(TINY, 1), 1)[1]
    qparams, quant = model_gguf.requantise(params, {}, "q4_1")
    assert set(quant) == {n for n, a in params.items() if a.ndim == 2}  # every 2-D weight, the embedding too
    fparams, none = model_gguf.requantise(qparams, quant, "f32")
    assert not none and all(fparams[n].dtype == np.float32 for n in fparams)
    tokens = np.array([3, 1, 4, 1, 5], dtype=np.uint32)
    want = evaluate(build_llama_graph(TINY, 5), {"tokens": tokens}, fparams)[0]
    got = evaluate(build_llama_graph(TINY, 5, quant=quant), {"tokens": tokens}, qparams)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


# --- rewrites ----------------------------------------------------------------------------------


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.live_nodes()]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_dequant_folds_and_the_weights_stay_packed(fmt):
    names = build_llama_graph(TINY, 1).parameters
    quant = {n: fmt for n, t in names.items() if len(t.shape) == 2}
    builds = (lambda q: build_llama_graph(TINY, 6, quant=q), lambda q: build_llama_cache_graph(TINY, 1, 16, quant=q))
    gated = 0
    for build in builds:
        f32, _ = optimize(build(None))
        opt, _ = optimize(build(quant))
        ops = _ops(opt)
        assert "Dequant" not in ops and ops.count("QuantEmbedding") == 1
        # the f32 plan's fused matmuls, one for one, now on blocks
        assert ops.count("QuantRmsNormMatMul") == _ops(f32).count("FusedRmsNormMatMul")
        assert ops.count("QuantMatMul") == _ops(f32).count("FusedMatMul")
        assert ops.count("QuantSwiGLUMatMul") == _ops(f32).count("FusedSwiGLUMatMul")
        gated += ops.count("QuantSwiGLUMatMul")
        assert opt.dispatch_count() == f32.dispatch_count()
        packed = [n for n in opt.live_nodes() if n.op == "Concat"]
        assert packed and all(opt.is_derived_parameter(n) and n.type.dtype is DType.U32 for n in packed)
        plan = lower(opt)
        assert not any("dequant" in d.kernel for d in plan.dispatches)
    assert gated == TINY.num_layers  # the decode step's down projections take SwiGLU as they load
    prefill = optimize(build_llama_graph(TINY, 6, quant=quant))[0]
    widths = sorted(len(n.inputs) for n in prefill.live_nodes() if n.op == "Concat")
    assert widths == [2, 2, 3, 3]  # gate/up and q/k/v of both layers (SwiGLU never joins a store: NEVER_JOIN)
    assert not any(n.op == "QuantRmsNormMatMul" and any(is_expr(s) for s in n.attrs["epilogue"])
                   for n in prefill.live_nodes())


def test_weights_of_different_formats_are_not_packed():
    quant = {n: "q4_1" for n, t in build_llama_graph(TINY, 1).parameters.items() if len(t.shape) == 2}
    quant["blk.0.attn_k.weight"] = "q8_0"
    quant["blk.0.ffn_up.weight"] = "q8_0"
    # without the epilogue region rules, which would leave gate/up unpacked (see above)
    opt, _ = optimize(build_llama_graph(TINY, 6, quant=quant), rulesets=select(disable=REGION_RULES))
    assert "Dequant" not in _ops(opt)
    packed = sorted(len(n.inputs) for n in opt.live_nodes() if n.op == "Concat")
    assert packed == [2, 3]  # layer 1 only: one kernel decodes one format


def test_a_dequant_no_rule_folds_gets_a_kernel_of_its_own():
    # MatMul (B [K,N]): blocks would lie along N, so the weight is dequantised by its own kernel
    g = Graph()
    w = g.add_node("Dequant", (g.parameter("q", [64, 5], DType.U32),), format="q4_1", cols=32)
    g.set_outputs([g.matmul(g.input("x", [3, 64]), w)])
    opt, _ = optimize(g)
    assert sorted(_ops(opt)) == ["Dequant", "Input", "MatMul", "Parameter"]
    assert [d.kernel for d in lower(opt).dispatches][0] == "dequant_q4_1"


# --- storage conversions, memory ------------------------------------------------------------------


def test_requantise_keeps_blocks_and_quantises_float_weights():
    w = _rng("rq").standard_normal((4, 64)).astype(np.float32)
    blocks = pack_rows(gguf.quants.quantize(w, QTYPE["q4_1"]))
    params = {"a": blocks, "b": w, "norm": np.ones(64, np.float32), "odd": np.ones((2, 48), np.float32)}
    out, quant = model_gguf.requantise(params, {"a": "q4_1"}, "q8_0")
    assert quant == {"a": "q4_1", "b": "q8_0"} and out["a"] is blocks  # not quantised twice
    assert out["norm"] is params["norm"] and out["odd"] is params["odd"]  # 1-D, and rows of 48 weights
    np.testing.assert_array_equal(dequantize(out["b"], "q8_0", 64).astype(np.float32),
                                  gguf.quants.dequantize(gguf.quants.quantize(w, QTYPE["q8_0"]), QTYPE["q8_0"]))
    assert params["b"] is w and set(params) == {"a", "b", "norm", "odd"}  # nothing passed in is modified
    with pytest.raises(InputError, match="weights must be one of f32, q4_0, q4_1, q8_0, f16, got 'q4_k'"):
        model_gguf.requantise(params, {}, "q4_k")


def test_plan_memory_counts_weights_cache_and_intermediates():
    g = Graph()
    x = g.input("x", [1, 64])
    cache = g.state("cache", [16, 8])
    w = g.add_node("Dequant", (g.parameter("q", [8, 10], DType.U32),), format="q4_1", cols=64)
    y = g.matmul_bt(x, w)
    g.set_outputs([g.add_node("CacheWrite", (cache, y, g.input("pos", [1], DType.U32))), g.relu(y)])
    opt, _ = optimize(g)
    mem = lower(opt).memory()
    # weights: 8 rows of 10 words; cache 16 x 8 floats; intermediates: the product and the Relu
    # (their own allocations or shared ones) plus the inputs x and pos
    assert mem["weights_bytes"] == 8 * 10 * 4 and mem["cache_bytes"] == 16 * 8 * 4
    assert 64 * 4 + 4 + 8 * 4 <= mem["intermediate_bytes"] <= 64 * 4 + 4 + 2 * 8 * 4
