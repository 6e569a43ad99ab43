"""Recognition of exported attention, masks, RoPE and the movement / matmul plumbing around
them: the recognised op is in the extracted graph, and the extracted graph computes what
onnxruntime computes on the ONNX graph (the numpy reference, no GPU). The rules' soundness
examples run in test_rule_soundness.py; the GPU runs of these graphs in
tests/gpu/test_exported_recognition_gpu.py."""

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from eggfuse.ir import DType, Graph, TensorType, evaluate
from eggfuse.ir.facts import baked, facts_of
from eggfuse.ir.ops.attention_exported import bool_mask, safe_softmax, scores_of
from eggfuse.ir.ops.rope_exported import rope_tables
from eggfuse.onnx import load
from eggfuse.rewrites import optimize
from eggfuse.rewrites.soundness import check_sound
from tests.exported_graphs import Attn, attention_model, expected_outputs, feeds
from tests.onnx_models import F, model, node

DATA = Path(__file__).resolve().parent.parent / "data" / "exported"


def ort(proto, inputs):
    import onnxruntime

    return onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)


def dispatched(g: Graph) -> Counter:
    return Counter(n.op for n in g.live_nodes() if g.dispatches(n))


def optimised_against_ort(proto, inputs, atol=2e-6):
    """The optimised graph of ``proto`` (checked against onnxruntime on the reference) and its report."""
    g, params = load(proto)
    opt, rep = optimize(g)
    want = ort(proto, inputs)
    got = evaluate(opt, {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in inputs.items()}, params)
    assert len(got) == len(want)
    for k, (x, y) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol, err_msg=f"output {k}")
    return opt, rep


# --- attention blocks in the exporters' forms -----------------------------------------------

CASES = {
    # name: (block, the op the plan must contain)
    # (its projections without biases are one packed product, as a causal attention's: _packed_qkv_unbiased)
    "dynamo_no_mask": (Attn(), "FullAttentionPacked"),
    "classic_causal_constant": (Attn(kt="classic", mask="causal"), "CausalAttention"),
    "eager_causal_min_rank2_no_guard": (Attn(kt="classic", scale="mul", mask="causal_min", guard=False),
                                        "CausalAttention"),
    "gqa_rope_causal": (Attn(heads=4, kv_heads=2, mask="causal", rope=True), "CausalAttentionRoPE"),
    "gqa_rope_eager": (Attn(heads=6, kv_heads=1, kt="classic", scale="mul", mask="causal_min", guard=False, rope=True,
                            theta=500000.0, head_dim=4), "CausalAttentionRoPE"),
    # a causal row keeping no key (the third sequence's, and the fourth's first two: left padding) is zero with
    # -inf (the classic exporter's bool mask and causal flag: masked_rows "zero") and, with float32's min (the
    # dynamo exporter's), the mean of all the sequence's v rows, the keys past its diagonal too ("mean")
    "padding_and_causal_gqa_rope": (Attn(batch=4, heads=4, kv_heads=2, mask="padding_causal", rope=True),
                                    "CausalAttentionRoPE"),
    "padding_min_and_causal_gqa_rope": (Attn(batch=4, heads=4, kv_heads=2, mask="padding_causal_min", rope=True),
                                        "CausalAttentionRoPE"),
    "padding_min_and_causal": (Attn(batch=4, mask="padding_causal_min", guard=False), "CausalAttention"),
    # (a sequence without a kept key: FullAttention's masked_rows "zero" gives ONNX's zero rows)
    "bert_padding_fully_masked_row": (Attn(batch=3, kt="bert", scale="div", mask="padding", proj_bias=True),
                                      "FullAttentionPacked"),
    # float32's min for -inf (the dynamo exporter's, And-ed with its all-true [1, 1, S, 1]; and without the And):
    # the fully masked sequence's scores all round to that min, so its rows are the mean of v, masked_rows "mean"
    "bert_min_padding_fully_masked_row": (Attn(batch=3, kt="bert", mask="padding_true_min", proj_bias=True),
                                          "FullAttentionPacked"),
    "bert_min_padding_unguarded": (Attn(batch=3, kt="bert", mask="padding_min", guard=False, proj_bias=True),
                                   "FullAttentionPacked"),

    "per_head_bias": (Attn(mask="bias"), "GeneralAttention"),
    "probabilities_also_an_output": (Attn(mask="causal", probs_output=True), "CausalAttention"),
    # the raw scores are computed anyway (AttentionScores, mode 0), the attention from them by whichever op of
    # equal cost extraction picks
    "scores_also_an_output": (Attn(heads=2, kv_heads=1, mask="causal", rope=True, scores_output=True),
                              ("CausalAttention", "CausalAttentionRoPE", "GeneralAttention")),
}


def test_classic_encoder_attention_keeps_no_scale_or_mask_arithmetic():
    # the classic exporter's BERT attention: q and the k^T of the [B,S,H,D] view each scaled by d^-1/4, the
    # padding mask And-ed with an all-true constant; the plan is the packed projection, the attention reading it
    # and the bool mask, and the output projection, nothing else (before the scale left the product: a Mul of k per
    # layer, and the And; before the key-mask rule: three projections and GeneralAttention, 5 dispatches; before
    # the attention read bool masks: the mask's Cast to f32, 4)
    block = Attn(batch=3, kt="bert", scale="split", mask="padding_true", proj_bias=True)
    opt, _ = optimised_against_ort(attention_model(block), feeds(block))
    ops = dispatched(opt)
    assert ops["FullAttentionPacked"] == 1 and opt.dispatch_count() == 3, ops
    assert not ops["Mul"] and not ops["And"] and not ops["Fused"], ops


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_attention_is_recognised(case):
    block, want = CASES[case]
    opt, _ = optimised_against_ort(attention_model(block), feeds(block))
    ops = dispatched(opt)
    assert sum(ops[w] for w in ((want,) if isinstance(want, str) else want)) == 1, ops
    # nothing of the unfused attention is left: no batched product, no softmax, no mask arithmetic
    assert not ops["BatchMatMul"] and not ops["Softmax"] and not ops["Where"] and not ops["Expand"], ops


def test_a_mask_of_minus_ten_thousand_keeps_general_attention():
    # -10000 for the masked keys (older transformers): a fully masked row is the softmax of its scores, neither the
    # mean nor zeros, so no fused attention may take it. (onnxruntime adds -10000 in float32, whose spacing there is
    # 2^-10: its weights of that row are off by up to 5e-4 relative, the reference's are not; hence the tolerance)
    block = Attn(batch=3, kt="bert", mask="padding_ten_thousand", proj_bias=True)
    opt, _ = optimised_against_ort(attention_model(block), feeds(block), atol=1e-3)
    ops = dispatched(opt)
    assert ops["GeneralAttention"] == 1 and not ops["FullAttention"] and not ops["FullAttentionPacked"], ops


def test_the_probabilities_output_keeps_its_value_and_the_output_its_fused_attention():
    # (the output: FullAttention reading the bool padding mask; GeneralAttention while the mask took a Cast to f32)
    block = Attn(mask="padding", batch=3, probs_output=True)
    opt, _ = optimised_against_ort(attention_model(block), feeds(block))
    ops = dispatched(opt)
    assert ops["FullAttention"] == 1 and ops["AttentionScores"] == 1 and not ops["Cast"], ops


def test_a_mask_that_enlarges_the_scores_blocks_the_recognition():
    # scores [1, H, S, S] plus a mask [2, 1, S, S]: the sum is larger than the scores
    g = Graph()
    q, k, v = (g.input(n, [1, 2, 3, 4]) for n in "qkv")
    probs = safe_softmax(g, g.add(scores_of(g, q, k, 0.5), g.input("m", [2, 1, 3, 3])))
    g.set_outputs([g.add_node("BatchMatMul", (probs, v))])
    opt, _ = optimize(g, verify=True)
    ops = dispatched(opt)
    modes = [n.attrs["mode"] for n in opt.live_nodes() if n.op == "AttentionScores"]
    assert not ops["GeneralAttention"] and modes in ([], [0]) and ops["Softmax"] == 1, ops


def test_a_softmax_without_guard_over_a_runtime_mask_keeps_its_nan_rows():
    # Where(mask, 0, -inf) may mask a whole row (the third sequence's here): the softmax gives NaN there, as
    # GeneralAttention does with masked_rows nan (with zeros, ONNX's rule, the output would change silently)
    block = Attn(batch=3, mask="padding", guard=False)
    opt, _ = optimised_against_ort(attention_model(block), feeds(block))  # NaN where onnxruntime has NaN
    (att,) = [n for n in opt.live_nodes() if n.op == "GeneralAttention"]
    assert att.attrs["masked_rows"] == "nan" and not dispatched(opt)["Softmax"], dispatched(opt)
    g, params = load(attention_model(block))
    (y,) = evaluate(opt, feeds(block), params)
    assert np.isnan(y[2]).all() and np.isfinite(y[:2]).all()


# --- the facts ----------------------------------------------------------------------------------


def facts(value, dtype=DType.F32):
    arr = np.asarray(value)
    return {f.name: args for f, args in facts_of(arr, TensorType(arr.shape, dtype))}


def test_causal_mask_fact():
    tril = np.tril(np.ones((4, 6), dtype=bool), 2)
    assert facts(tril, DType.BOOL)["causal_mask"] == (2,)
    assert facts(np.where(tril, 0.0, -np.inf)[None, None])["causal_mask"] == (2,)
    assert facts(np.broadcast_to(np.where(tril, 0.0, np.finfo(np.float32).min), (3, 1, 4, 6)))["causal_mask"] == (2,)
    assert "causal_mask" not in facts(np.where(tril, 0.0, -1.0))  # -1 is not masked
    assert "causal_mask" not in facts(np.tril(np.ones((4, 4), dtype=bool), -1), DType.BOOL)  # row 0 fully masked
    assert "causal_mask" not in facts(np.stack([tril, ~tril]), DType.BOOL)  # the batch slices differ
    assert "causal_mask" not in facts(np.triu(np.ones((4, 4), dtype=bool)), DType.BOOL)


def test_rope_table_fact_reads_theta_scaling_and_kind():
    cos, sin = rope_tables(9, 500000.0, 8)
    assert facts(cos.astype(np.float32)[None, None])["rope_table"] == ("cos", 500000.0, 8, "null")
    assert facts(np.broadcast_to(sin.astype(np.float32), (2, 1, 9, 8)))["rope_table"] == ("sin", 500000.0, 8, "null")
    cos, _ = rope_tables(9, 10000.0, 16, ("linear", 4.0))
    assert facts(cos.astype(np.float32))["rope_table"] == ("cos", 10000.0, 16, '["linear", 4.0]')
    assert "rope_table" not in facts((cos * 1.5).astype(np.float32))  # an attention scaling other than 1
    assert "rope_table" not in facts(np.random.default_rng(0).standard_normal((9, 16)).astype(np.float32))


def test_iota_and_index_grid_facts():
    assert facts(np.arange(12, dtype=np.int32).reshape(2, 1, 1, 6), DType.I32)["iota"] == (12,)
    assert "iota" not in facts(np.arange(12, dtype=np.int32)[::-1].copy(), DType.I32)
    assert "iota" not in facts(np.arange(1, 13, dtype=np.int32), DType.I32)  # not from 0
    assert "iota" not in facts(np.arange(12, dtype=np.float32))  # indices are i32
    grid = np.stack(np.meshgrid(np.arange(2), np.arange(7), indexing="ij"), axis=-1).astype(np.int32)
    assert facts(grid.reshape(2, 1, 1, 7, 2), DType.I32)["index_grid"] == (2, 7)
    assert facts(grid[:, :6].copy(), DType.I32)["index_grid"] == (2, 6)  # the grid of a [2, 6] tensor
    assert "index_grid" not in facts(grid.transpose(1, 0, 2).copy(), DType.I32)  # column-major order
    assert "index_grid" not in facts(np.delete(grid.reshape(-1, 2), 3, axis=0), DType.I32)  # a pair missing
    assert "index_grid" not in facts(grid[..., :1].copy(), DType.I32)  # one index a row: a Gather's


def test_value_fact_and_what_the_importer_bakes():
    assert facts(np.float32(-np.inf).reshape(1, 1))["value"] == (-np.inf,)
    assert "value" not in facts(np.array([np.nan], np.float32)) and "value" not in facts(np.zeros(2, np.float32))
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    assert not baked(w, TensorType((16, 16))) and baked(np.float32(0.5), TensorType(()))
    # an initializer the rules read (a scalar, a RoPE table) is a Constant, a weight a Parameter
    cos, _ = rope_tables(5, 10000.0, 4)
    proto = model([node("Mul", ["x", "c"], ["a"]), node("Add", ["a", "cos"], ["b"]), node("MatMul", ["b", "w"], ["y"])],
                  [("x", F, [5, 4])], [("y", F, [5, 4])],
                  [("c", np.float32(2.0)), ("cos", cos.astype(np.float32)), ("w", w[:4, :4])])
    g, params = load(proto)
    assert list(params) == ["w"] and sum(n.op == "Constant" for n in g.live_nodes()) == 2


# --- movement and matmul plumbing ---------------------------------------------------------------


def test_transpose_of_a_weight_folds_into_matmul_bt():
    w = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    proto = model([node("Transpose", ["w"], ["wt"], perm=[1, 0]), node("MatMul", ["x", "wt"], ["y"])],
                  [("x", F, [3, 5]), ("w", F, [6, 5])], [("y", F, [3, 6])])
    opt, _ = optimised_against_ort(proto, {"x": np.ones((3, 5), np.float32), "w": w})
    (mm,) = [n for n in opt.live_nodes() if opt.dispatches(n)]
    assert mm.op in ("MatMulBT", "FusedMatMul") and mm.attrs.get("variant", "BT") == "BT"


def test_transpose_pairs_cancel_and_last_axes_fold_into_batch_matmul():
    rng = np.random.default_rng(0)
    proto = model([node("Transpose", ["x"], ["a"], perm=[0, 2, 1, 3]),
                   node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),
                   node("Transpose", ["y"], ["yt"], perm=[0, 1, 3, 2]), node("MatMul", ["b", "yt"], ["z"])],
                  [("x", F, [2, 3, 4, 5]), ("y", F, [2, 3, 7, 5])], [("z", F, [2, 3, 4, 7])])
    opt, _ = optimised_against_ort(proto, {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
                                           "y": rng.standard_normal((2, 3, 7, 5)).astype(np.float32)})
    (bmm,) = [n for n in opt.live_nodes() if opt.dispatches(n)]
    assert bmm.op == "BatchMatMul" and bmm.attrs["trans_b"]


# --- the exported fixtures (tests/data/exported, scripts/export_torch_fixtures.py) ---------------

FIXTURES = {
    # file: (ops the plan must contain, dispatches at most; before these rules 62 / 63 / 116 / 115; the classic
    # BERT took 29 while its k^T scale stayed a Mul per layer and its mask's And with an all-true constant a dispatch,
    # the BERTs 26 / 27 while their masked attention stayed GeneralAttention of three projections, 21 while their
    # embeddings were two Gathers, an Add and a LayerNorm; every text model one more while its i32 padding mask was
    # cast to f32 for the attention: _key_mask_without_casts)
    "bert_tiny.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 17),
    "bert_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 17),
    # BERT without the pooler, then sentence-transformers' mean pooling and Normalize (its third sequence keeps no
    # token: the count's and the norm's clamps) as one TokenPool (22 while they were a Mul, two ReduceSums, a
    # ReduceL2 and two Fused dispatches of Clip and Div)
    "bert_tiny_pooled.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1, "TokenPool": 1}, 16),
    "bert_tiny_pooled.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1, "TokenPool": 1}, 16),
    # word rows and folded position rows; its third sequence keeps no key (torch's rows there: zeros)
    "distilbert_tiny.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 15),
    "distilbert_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 15),
    # padding and causal rows: the packed projection, CausalAttentionRoPE with the key mask (23 dispatches while
    # they stayed GeneralAttention of three projections and two RoPEs a layer)
    "llama_tiny.classic.onnx": ({"CausalAttentionRoPE": 2}, 14),
    "llama_tiny.dynamo.onnx": ({"CausalAttentionRoPE": 2}, 14),
    # the fused c_attn product read by CausalAttention with the key mask (25 while q, k and v were three Slices)
    "gpt2_tiny.classic.onnx": ({"CausalAttention": 2}, 18),
    "gpt2_tiny.dynamo.onnx": ({"CausalAttention": 2}, 18),
    # RoBERTa's embeddings: three Gathers (position ids computed from the padding: CumSum) into one kernel (24 while
    # they were three Gathers, their sum and a LayerNorm); the position ids one PaddedPositionIds (19 while they
    # were Equal/Not/Cast, CumSum and Mul/Add); the token types, a GatherElements of a zero buffer, a Constant of
    # zeros at import (17 while a dispatch)
    "roberta_tiny.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1, "PaddedPositionIds": 1}, 16),
    "roberta_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1, "PaddedPositionIds": 1}, 16),
    # ViT: the dynamo export's all-zero mask, read as causal with offset S - 1, dropped (23 while it kept the
    # attention GeneralAttention of three projections)
    "vit_tiny.classic.onnx": ({"FullAttentionPacked": 2}, 19),
    "vit_tiny.dynamo.onnx": ({"FullAttentionPacked": 2}, 19),
    # T5: unscaled scores plus the relative position bias (a parameter: its values unknown to the rules) under the
    # padding mask, softmaxed without SDPA's guard: GeneralAttention with masked_rows nan on the projections' rows
    # (29 while the unguarded softmax stayed AttentionScores, Softmax, a batched product and four Permutes a layer),
    # reading one packed Q/K/V product (17 while three)
    "t5_tiny.classic.onnx": ({"GeneralAttention": 2, "FusedRmsNormMatMul": 4}, 13),
    # MPNet: the relative position bias, then the padding mask, added to the scores (one mask, their sum, for
    # GeneralAttention with masked_rows nan: 37 while the second Add kept the attention apart), and word rows plus
    # positions counted from the padding into EmbeddingSumLayerNorm (24 while two Gathers, an Add and a LayerNorm);
    # the attention reads one packed Q/K/V product (21 while three)
    "mpnet_tiny.classic.onnx": ({"GeneralAttention": 2, "EmbeddingSumLayerNorm": 1, "PaddedPositionIds": 1}, 17),
    "mpnet_tiny.dynamo.onnx": ({"GeneralAttention": 2, "EmbeddingSumLayerNorm": 1, "PaddedPositionIds": 1}, 17),
    # ALBERT and ELECTRA: embeddings of 16 projected to the hidden 32 (a FusedMatMul after EmbeddingSumLayerNorm),
    # then BERT's layers (ALBERT's share their weights)
    "albert_tiny.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 16),
    "albert_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 16),
    "electra_tiny.classic.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 16),
    "electra_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "EmbeddingSumLayerNorm": 1}, 16),
    # Qwen2: LLaMA's layers with biased Q/K/V projections (GQA 4 on 2)
    "qwen2_tiny.classic.onnx": ({"CausalAttentionRoPE": 2, "FusedRmsNormMatMulSwiGLU": 2}, 18),
    "qwen2_tiny.dynamo.onnx": ({"CausalAttentionRoPE": 2, "FusedRmsNormMatMulSwiGLU": 2}, 18),
    # DeBERTa-v2's disentangled attention: the scores of merged heads [B H, S, D] (q times the scaled k^T) plus the
    # content-to-position and position-to-content terms (products with the position projections, gathered by
    # relative position buckets), under float32's min where the pairwise padding mask drops a pair, softmaxed and
    # times v: GeneralAttention over that bias (51 while its scores, sum, mask, softmax, product and three
    # Permutes a layer stayed apart; 39 while the position terms' sum, divided by the scale, was a kernel apart
    # from the mask's, its [B, H, S, T] view between them); the position terms' products and gathers stay, and
    # read q and k as heads
    "deberta_tiny.classic.onnx": ({"GeneralAttention": 2, "FusedMatMulLayerNorm": 4}, 37),
    "deberta_tiny.dynamo.onnx": ({"GeneralAttention": 2, "FusedMatMulLayerNorm": 4}, 37),
}
#: fixtures whose attention reads terms that batched products compute (DeBERTa's relative position scores): their
#: BatchMatMuls stay, and q and k are read as heads, not packed
POSITION_PRODUCTS = {"deberta_tiny.classic.onnx", "deberta_tiny.dynamo.onnx"}


def _optimised_fixture(name: str, rulesets=None):
    """The fixture ``name`` imported at its .npz's input shapes and optimised (``rulesets``: None, the default),
    its outputs checked against torch's (onnxruntime's where the graph is not torch's); returns the dispatched
    op counts and the optimised graph."""
    data = np.load(DATA / (name.split(".")[0] + ".npz"))
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input.")}
    g, params = load(DATA / name, shapes={k: v.shape for k, v in inputs.items()})
    opt, _ = optimize(g, rulesets=rulesets)
    outs = evaluate(opt, {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in inputs.items()}, params)
    want = expected_outputs(DATA / name, data)
    for out, vi in zip(outs, onnx.load(DATA / name).graph.output, strict=True):
        np.testing.assert_allclose(out, want[vi.name], rtol=1e-4, atol=2e-5)
    return dispatched(opt), opt


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_exported_fixture_is_recognised_and_matches_torch(name):
    want_ops, most = FIXTURES[name]
    ops, opt = _optimised_fixture(name)
    assert all(ops[op] == n for op, n in want_ops.items()), ops
    assert opt.dispatch_count() <= most
    assert not ops["Softmax"] and (not ops["BatchMatMul"] or name in POSITION_PRODUCTS), ops
    if ops["GeneralAttention"] and name not in POSITION_PRODUCTS:  # it reads one packed Q/K/V product
        assert all(n.attrs["packed"] for n in opt.live_nodes() if n.op == "GeneralAttention"), name


def test_deberta_position_products_read_q_and_k_heads_in_place(monkeypatch):
    # At real sizes the dynamo export's position keys, repeated over the batch by a Tile, are imported as a
    # broadcast (importer.lazy_copies, from 1 MiB): each position product is then BatchMatMul(Permute(q heads),
    # keys [1, H, P, D]), which PermutedBatchMatMul computes reading q [B, S, H, D] in place, with no Permute
    # dispatch, and reading it where it lies in the packed Q/K/V product P (its column window), so the attention
    # reads P too: one product for the three projections; the position-to-content term's gather writes its value
    # transposed (GatherElementsBroadcast's perm), no Permute left. With the optional ruleset gathered_products,
    # each gather takes only the elements of the product it needs, computed alone (GatheredBatchMatMul), never
    # the [B H, S, P] product. The tiny fixture's copies are small; the threshold at 0 gives it the real form.
    # Outputs vs torch.
    import eggfuse.onnx.importer as importer
    from eggfuse.rewrites.rulesets import select

    monkeypatch.setattr(importer, "LAZY_COPY_BYTES", 0)
    ops, opt = _optimised_fixture("deberta_tiny.dynamo.onnx")
    assert ops["PermutedBatchMatMul"] == 4 and not ops["BatchMatMul"], ops
    assert not ops["Permute"] and not ops["GatheredBatchMatMul"], ops
    assert sorted(n.attrs["perm"] for n in opt.live_nodes() if n.op == "GatherElementsBroadcast") == [(), (), (0, 2, 1),
                                                                                                   (0, 2, 1)]
    assert ops["FusedMatMul"] == 4, ops  # a layer: the packed Q/K/V product and the FFN's first
    live = opt.live_nodes()
    assert all(n.attrs["packed"] for n in live if n.op == "GeneralAttention")
    windows = sorted((n.attrs["view"], n.attrs["start"]) for n in live if n.op == "PermutedBatchMatMul")
    assert windows == [((2, 7, 4, 8), 0)] * 2 + [((2, 7, 4, 8), 32)] * 2, windows  # q's columns, then k's
    assert opt.dispatch_count() == 27

    ops, opt = _optimised_fixture("deberta_tiny.dynamo.onnx", select(optional=["gathered_products"]))
    assert ops["GatheredBatchMatMul"] == 4 and not ops["PermutedBatchMatMul"] and not ops["GatherElementsBroadcast"]
    gathered = [n.attrs for n in opt.live_nodes() if n.op == "GatheredBatchMatMul"]
    assert sorted(a["out_perm"] for a in gathered) == [(), (), (0, 2, 1), (0, 2, 1)]
    assert sorted((a["view"], a["start"]) for a in gathered) == windows
    assert opt.dispatch_count() == 23


#: pre-LN fixtures with the optional layer_norm_prologue ruleset: {op: count}, dispatches (GPT-2's pre-MLP, final and
#: second pre-attention LayerNorms, ViT's pre-attention and pre-MLP ones, as the next products' prologue; GPT-2's
#: first, of the embeddings' sum, stored with that sum by the embedding kernel)
PROLOGUE_FIXTURES = {"gpt2_tiny.classic.onnx": ({"CausalAttention": 2, "FusedLayerNormMatMul": 4,
                                                 "EmbeddingSumLayerNormPair": 1}, 12),
                     "gpt2_tiny.dynamo.onnx": ({"CausalAttention": 2, "FusedLayerNormMatMul": 4,
                                                "EmbeddingSumLayerNormPair": 1}, 12),
                     "vit_tiny.classic.onnx": ({"FullAttentionPacked": 2, "FusedLayerNormMatMul": 4}, 15),
                     "vit_tiny.dynamo.onnx": ({"FullAttentionPacked": 2, "FusedLayerNormMatMul": 4}, 15)}


@pytest.mark.parametrize("name", sorted(PROLOGUE_FIXTURES))
def test_exported_pre_ln_fixture_with_the_layer_norm_prologue_matches_torch(name):
    from eggfuse.rewrites.rulesets import select

    want_ops, dispatches = PROLOGUE_FIXTURES[name]
    ops, opt = _optimised_fixture(name, select(optional=["layer_norm_prologue"]))
    assert all(ops[op] == n for op, n in want_ops.items()) and opt.dispatch_count() == dispatches, ops


# --- additive masks of unknown values: the unguarded softmax, several masks, +inf and windows ----------------


def _masked_attention(masks, b=2, h=2, s=3, t=4, d=4, pad_first=False) -> Graph:
    # softmax(scores + masks...) v on [B, H, S, D] inputs; masks: shapes of f32 inputs (values unknown), and with
    # pad_first a Where(bool, 0, -inf) padding mask added before them (the rules make that one a bool mask)
    g = Graph()
    q, k, v = g.input("q", [b, h, s, d]), g.input("k", [b, h, t, d]), g.input("v", [b, h, t, d])
    x = scores_of(g, q, k, 0.5)
    if pad_first:
        x = g.add(x, g.add_node("Where", (bool_mask(g, [b, 1, 1, t]), g.constant(np.array(0.0), shape=()),
                                          g.constant(np.array(-np.inf), shape=()))))
    for i, shape in enumerate(masks):
        x = g.add(x, g.input(f"m{i}", shape))
    g.set_outputs([g.add_node("BatchMatMul", (g.softmax(x), v))])
    return g


@pytest.mark.parametrize("masks, pad_first", [([[1, 2, 3, 4], [2, 1, 1, 4]], False), ([[1, 2, 3, 4]] * 3, False),
                                              ([[1, 2, 3, 4]], True)], ids=["two", "three", "padding-first"])
def test_additive_masks_of_unknown_values_make_one_general_attention(masks, pad_first):
    # a relative position bias then a padding mask (MPNet), three masks, and a -inf padding mask first (which the
    # rules also read as a bool mask: the masks' sum must be built of the f32 forms only)
    opt, _ = optimize(_masked_attention(masks, pad_first=pad_first), verify=True)
    (att,) = [n for n in opt.live_nodes() if n.op == "GeneralAttention"]
    assert att.attrs["masked_rows"] == "nan" and not dispatched(opt)["Softmax"], dispatched(opt)


def test_a_plus_infinite_mask_and_a_window_that_empties_rows_stay_sound():
    # a +inf score makes a softmax row NaN, which both masked_rows forms read as a row without a key; and a window
    # that leaves rows without a key keeps the finite and causal masks' softmax from being mode 3 with zero rows
    g = Graph()
    q, k = g.input("q", [1, 1, 2, 4]), g.input("k", [1, 1, 3, 4])
    m = np.zeros((1, 1, 2, 3))
    m[0, 0, 0, 0], m[0, 0, 1, :] = np.inf, -np.inf
    g.set_outputs([g.softmax(g.add(scores_of(g, q, k, 0.5), g.constant(m, shape=[1, 1, 2, 3])))])
    check_sound(g)
    for mask in (np.zeros((4, 2)), np.where(np.tril(np.ones((4, 2), bool)), 0.0, -np.inf)):
        g = Graph()
        q, k = g.input("q", [1, 1, 4, 4]), g.input("k", [1, 1, 2, 4])
        sc = g.add_node("AttentionScores", (q, k, g.constant(mask, shape=[4, 2])), scale=0.5, mode=2, left_window=0)
        g.set_outputs([g.softmax(sc)])
        check_sound(g)


def test_a_float32_min_mask_over_other_masks_stays_sound():
    # Where(b, float32 min, .) around scores that already carry a bool mask (an additive Where(c, 0, -inf), or a
    # causal And of a lower triangle and the padding): the rule that moves the Where onto an added f32 term must not
    # take a bool mask form for that term, nor drop the causal masking a float32-min score would bring back
    from eggfuse.rewrites.soundness import check_sound

    fmin = float(np.finfo(np.float32).min)
    b, h, s, d = 2, 2, 4, 4

    def build(causal: bool):
        g = Graph()
        q, k = g.input("q", [b, h, s, d]), g.input("k", [b, h, s, d])
        sc = g.mul(g.add_node("BatchMatMul", (q, k), trans_b=True), g.constant(np.array(0.5), shape=()))
        keep = g.add_node("Less", (g.input("m1", [b, 1, 1 if causal else s, s]), g.constant(np.array(0.0), shape=())))
        if causal:
            tril = g.constant(np.tril(np.ones((s, s), dtype=bool)), shape=[1, 1, s, s], dtype=DType.BOOL)
            keep = g.add_node("And", (tril, keep))
        masked = g.add(sc, g.add_node("Where", (keep, g.constant(np.array(0.0), shape=()),
                                                g.constant(np.array(-np.inf), shape=()))))
        pad = g.add_node("Less", (g.input("m2", [b, 1, s, s]), g.constant(np.array(0.0), shape=())))
        g.set_outputs([g.softmax(g.add_node("Where", (pad, g.constant(np.array(fmin), shape=()), masked)))])
        return g

    for causal in (False, True):
        check_sound(build(causal))
        _, rep = optimize(build(causal), verify=True)
        assert rep.verified_max_diff < 1e-12, rep.verified_max_diff


@pytest.mark.parametrize("options", [dict(softcap=0.5), dict(causal=True), dict(left_window=1, right_window=0)])
def test_raw_scores_with_options_are_not_given_them_by_a_mask_or_softmax(options):
    # ONNX Attention's qk_matmul_output (mode 0) is the raw scaled product: its softcap, causal flag and windows
    # apply from mode 1 on. A mask added to it, or its softmax, is not the attention's mode 2 or 3 with those options
    from eggfuse.rewrites.soundness import check_sound

    for masked in (False, True):
        g = Graph()
        q, k = g.input("q", [1, 2, 3, 5]), g.input("k", [1, 2, 4, 5])
        scores = g.add_node("AttentionScores", (q, k), scale=0.5, mode=0, **options)
        if masked:
            scores = g.add(scores, g.input("m", [1, 2, 3, 4]))
        g.set_outputs([g.softmax(scores)])
        check_sound(g)
        _, rep = optimize(g, verify=True)
        assert rep.verified_max_diff < 1e-12
