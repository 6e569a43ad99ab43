"""ONNX Attention, RotaryEmbedding and SwiGLU through eggfuse.onnx.Model on the GPU, against
onnxruntime (SwiGLU, which onnxruntime does not run, against onnx's reference evaluator):
the fused attention kernels where the options fit, the general kernel elsewhere (masks of
every rank and kind, GQA, softcap, scale, past key / value, qk_matmul_output modes,
nonpad_kv_seqlen, windows), and the refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx_models import I64, F, model, node  # tests/onnx_models.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model

B = TensorProto.BOOL


def _ort(m, feeds):
    m.ir_version = 10
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m, feeds, rtol=2e-4, atol=2e-5, ops=None, oracle="onnxruntime"):
    """eggfuse's outputs against onnxruntime's (or, ``oracle`` "reference", onnx's reference
    evaluator: for masks onnxruntime does not take, shorter than the keys or broadcast over the
    queries); ``ops``: op names the imported graph must hold."""
    from onnx.reference import ReferenceEvaluator

    em = Model(m)
    got = em.run(feeds)
    want = _ort(m, feeds) if oracle == "onnxruntime" else ReferenceEvaluator(m).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    graph = next(iter(em.plans.values())).graph
    if ops is not None:
        assert set(ops) <= {n.op for n in graph.nodes}, {n.op for n in graph.nodes}
    return graph


def _rand(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _attention(inputs, outputs, opset=23, **attrs):
    names = [n for n, _, _ in inputs]
    ins = [n if n in names else "" for n in ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad")]
    while not ins[-1]:
        ins.pop()
    return model([node("Attention", ins, [n for n, _, _ in outputs], name="attn", **attrs)], inputs, outputs,
                 opset=opset)


@pytest.mark.parametrize("causal", [0, 1])
def test_3d_self_attention_with_gqa_maps_onto_the_fused_kernels(causal):
    rng = np.random.default_rng(causal)
    b, s, nh, nkv, d = 2, 7, 6, 2, 8
    m = _attention([("Q", F, [b, s, nh * d]), ("K", F, [b, s, nkv * d]), ("V", F, [b, s, nkv * d])],
                   [("Y", F, None)], q_num_heads=nh, kv_num_heads=nkv, is_causal=causal)
    feeds = {"Q": _rand(rng, b, s, nh * d), "K": _rand(rng, b, s, nkv * d), "V": _rand(rng, b, s, nkv * d)}
    graph = _check(m, feeds, ops=["CausalAttention" if causal else "FullAttention"])
    assert "GeneralAttention" not in {n.op for n in graph.nodes}


def test_4d_single_head_maps_onto_the_fused_kernel_and_other_options_onto_the_general_one():
    rng = np.random.default_rng(1)
    one = _attention([("Q", F, [3, 1, 5, 16]), ("K", F, [3, 1, 5, 16]), ("V", F, [3, 1, 5, 16])], [("Y", F, None)],
                     is_causal=1)
    _check(one, {k: _rand(rng, 3, 1, 5, 16) for k in "QKV"}, ops=["CausalAttention"])
    scaled = _attention([("Q", F, [2, 3, 5, 16]), ("K", F, [2, 3, 5, 16]), ("V", F, [2, 3, 5, 16])],
                        [("Y", F, None)], scale=0.3, softcap=2.5)
    _check(scaled, {k: _rand(rng, 2, 3, 5, 16) for k in "QKV"}, ops=["GeneralAttention"])


_MASKS = [([6, 9], F, 4, 2), ([2, 1, 6, 9], F, 4, 2), ([3, 6, 9], F, 3, 1), ([9], B, 4, 2), ([1, 9], B, 4, 2),
          ([2, 4, 6, 9], B, 4, 2), ([1, 1, 6, 7], B, 2, 2), ([6, 7], F, 2, 1)]


@pytest.mark.parametrize("mask_shape,elem,nh,nkv", _MASKS)
def test_masks_of_every_rank_and_kind_broadcast_over_gqa_heads(mask_shape, elem, nh, nkv):
    # a mask covering fewer keys (7 of 9) leaves the others out
    rng = np.random.default_rng(len(mask_shape) + nh)
    b, sq, skv, d, dv = 2, 6, 9, 8, 5
    if elem == B:
        mask = rng.random(mask_shape) < 0.7
    else:
        mask = _rand(rng, *mask_shape)
    m = _attention([("Q", F, [b, nh, sq, d]), ("K", F, [b, nkv, skv, d]), ("V", F, [b, nkv, skv, dv]),
                    ("attn_mask", elem, mask_shape)], [("Y", F, None)])
    feeds = {"Q": _rand(rng, b, nh, sq, d), "K": _rand(rng, b, nkv, skv, d), "V": _rand(rng, b, nkv, skv, dv),
             "attn_mask": mask}
    fits_ort = mask_shape[-1] == skv and (len(mask_shape) == 1 or mask_shape[-2] == sq) and len(mask_shape) > 1
    _check(m, feeds, ops=["GeneralAttention"], oracle="onnxruntime" if fits_ort else "reference")


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_3d_past_and_present_with_a_mask_softcap_and_every_qk_output_mode(mode):
    rng = np.random.default_rng(mode)
    b, nh, nkv, sq, skv, past, d, dv = 2, 4, 2, 3, 4, 5, 8, 6
    m = _attention([("Q", F, [b, sq, nh * d]), ("K", F, [b, skv, nkv * d]), ("V", F, [b, skv, nkv * dv]),
                    ("attn_mask", F, [sq, past + skv]), ("past_key", F, [b, nkv, past, d]),
                    ("past_value", F, [b, nkv, past, dv])],
                   [("Y", F, None), ("present_key", F, None), ("present_value", F, None), ("qk", F, None)],
                   q_num_heads=nh, kv_num_heads=nkv, softcap=1.5, qk_matmul_output_mode=mode)
    feeds = {"Q": _rand(rng, b, sq, nh * d), "K": _rand(rng, b, skv, nkv * d), "V": _rand(rng, b, skv, nkv * dv),
             "attn_mask": _rand(rng, sq, past + skv), "past_key": _rand(rng, b, nkv, past, d),
             "past_value": _rand(rng, b, nkv, past, dv)}
    _check(m, feeds, ops=["SplitHeads", "Concat", "GeneralAttention", "AttentionScores"])


def test_4d_causal_decode_with_a_past_cache_uses_the_offset_frontier():
    rng = np.random.default_rng(5)
    b, nh, nkv, past, d = 2, 6, 3, 7, 16
    m = _attention([("Q", F, [b, nh, 2, d]), ("K", F, [b, nkv, 2, d]), ("V", F, [b, nkv, 2, d]),
                    ("past_key", F, [b, nkv, past, d]), ("past_value", F, [b, nkv, past, d])],
                   [("Y", F, None), ("present_key", F, None), ("present_value", F, None)], is_causal=1)
    feeds = {"Q": _rand(rng, b, nh, 2, d), "K": _rand(rng, b, nkv, 2, d), "V": _rand(rng, b, nkv, 2, d),
             "past_key": _rand(rng, b, nkv, past, d), "past_value": _rand(rng, b, nkv, past, d)}
    _check(m, feeds)


def test_nonpad_kv_seqlen_opset_24_and_a_sliding_window_opset_25():
    rng = np.random.default_rng(6)
    q, k, v = _rand(rng, 2, 2, 3, 8), _rand(rng, 2, 2, 8, 8), _rand(rng, 2, 2, 8, 8)
    qkv = [("Q", F, [2, 2, 3, 8]), ("K", F, [2, 2, 8, 8]), ("V", F, [2, 2, 8, 8])]
    lens = _attention([*qkv, ("nonpad", I64, [2])], [("Y", F, None)], opset=24, is_causal=1)
    _check(lens, {"Q": q, "K": k, "V": v, "nonpad": np.array([8, 5], dtype=np.int64)})
    window = _attention(qkv, [("Y", F, None)], opset=25, is_causal=1, left_window_size=2)
    _check(window, {"Q": q, "K": k, "V": v})
    both = _attention(qkv, [("Y", F, None)], opset=25, left_window_size=1, right_window_size=3)
    _check(both, {"Q": q, "K": k, "V": v})


def test_rotary_embedding_then_attention_a_small_chain():
    # RotaryEmbedding on Q and K (4-D, position ids fed), then Attention with GQA and a bool mask
    rng = np.random.default_rng(7)
    b, nh, nkv, s, d = 2, 4, 2, 6, 16
    nodes = [node("RotaryEmbedding", ["Q", "cos", "sin", "pos"], ["qr"]),
             node("RotaryEmbedding", ["K", "cos", "sin", "pos"], ["kr"]),
             node("Attention", ["qr", "kr", "V", "mask"], ["Y"], is_causal=1)]
    m = model(nodes, [("Q", F, [b, nh, s, d]), ("K", F, [b, nkv, s, d]), ("V", F, [b, nkv, s, d]),
                      ("pos", I64, [b, s]), ("mask", B, [b, 1, s, s])], [("Y", F, None)],
              [("cos", np.cos(np.arange(20)[:, None] * 0.1 * np.arange(1, 9)).astype(np.float32)),
               ("sin", np.sin(np.arange(20)[:, None] * 0.1 * np.arange(1, 9)).astype(np.float32))], opset=23)
    mask = rng.random((b, 1, s, s)) < 0.8
    feeds = {"Q": _rand(rng, b, nh, s, d), "K": _rand(rng, b, nkv, s, d), "V": _rand(rng, b, nkv, s, d),
             "pos": np.array([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 19]], dtype=np.int64), "mask": mask}
    _check(m, feeds, ops=["RotaryEmbedding", "GeneralAttention"])


@pytest.mark.parametrize("interleaved,rot", [(0, 0), (1, 0), (0, 6), (1, 4)])
def test_rotary_embedding_3d_with_partial_rotation(interleaved, rot):
    rng = np.random.default_rng(interleaved + rot)
    half = (rot or 10) // 2
    m = model([node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=3, interleaved=interleaved,
                    rotary_embedding_dim=rot)],
              [("x", F, [2, 5, 30]), ("cos", F, [11, half]), ("sin", F, [11, half]), ("pos", I64, [2, 5])],
              [("y", F, None)], opset=23)
    feeds = {"x": _rand(rng, 2, 5, 30), "cos": _rand(rng, 11, half), "sin": _rand(rng, 11, half),
             "pos": rng.integers(0, 11, (2, 5))}
    _check(m, feeds)


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_swiglu_against_onnx_reference(alpha):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(8)
    m = model([node("SwiGLU", ["a", "b"], ["y"], alpha=alpha)], [("a", F, [3, 5, 7]), ("b", F, [3, 5, 7])],
              [("y", F, None)], opset=28)
    feeds = {"a": _rand(rng, 3, 5, 7, scale=3.0), "b": _rand(rng, 3, 5, 7)}
    em = Model(m)
    (got,) = em.run(feeds)
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ops = {n.op for n in next(iter(em.plans.values())).graph.nodes}
    assert ("SwiGLU" in ops) == (alpha == 1.0)


def test_attention_refusals_name_the_node():
    qkv = [("Q", F, [1, 4, 8]), ("K", F, [1, 4, 8]), ("V", F, [1, 4, 8])]
    with pytest.raises(OnnxError, match=r"Attention node 'attn': Q is 3-D \[1, 4, 8\]: q_num_heads"):
        Model(_attention(qkv, [("Y", F, None)])).specialise()
    with pytest.raises(OnnxError, match=r"Attention node 'attn': past_key and past_value must be given together"):
        Model(_attention([*qkv, ("past_key", F, [1, 2, 3, 4])], [("Y", F, None)], q_num_heads=2,
                         kv_num_heads=2)).specialise()
    with pytest.raises(OnnxError, match=r"qk_matmul_output_mode=7"):
        Model(_attention(qkv, [("Y", F, None)], q_num_heads=2, kv_num_heads=2, qk_matmul_output_mode=7)).specialise()
    with pytest.raises(OnnxError, match=r"head sizes must match"):
        Model(_attention([("Q", F, [1, 2, 4, 8]), ("K", F, [1, 2, 4, 6]), ("V", F, [1, 2, 4, 6])],
                         [("Y", F, None)])).specialise()
    with pytest.raises(OnnxError, match=r"RotaryEmbedding node .*3-D: the num_heads attribute must be given"):
        Model(model([node("RotaryEmbedding", ["x", "c", "s"], ["y"])],
                    [("x", F, [1, 2, 8]), ("c", F, [1, 2, 4]), ("s", F, [1, 2, 4])], [("y", F, None)],
                    opset=23)).specialise()
    with pytest.raises(OnnxError, match=r"SwiGLU node .*must have the same shape"):
        Model(model([node("SwiGLU", ["a", "b"], ["y"])], [("a", F, [2, 3]), ("b", F, [1, 3])], [("y", F, None)],
                    opset=28)).specialise()


def test_fully_masked_rows_are_zero():
    # ONNX's fully-masked-row rule (onnxruntime and onnx's reference agree), not the average of the values
    rng = np.random.default_rng(9)
    m = _attention([("Q", F, [1, 2, 3, 8]), ("K", F, [1, 2, 4, 8]), ("V", F, [1, 2, 4, 8]),
                    ("attn_mask", B, [3, 4])], [("Y", F, None)], is_causal=1)
    feeds = {"Q": _rand(rng, 1, 2, 3, 8), "K": _rand(rng, 1, 2, 4, 8), "V": _rand(rng, 1, 2, 4, 8),
             "attn_mask": np.array([[0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1]], dtype=bool)}
    (got,) = Model(m).run(feeds)
    assert not got[0, :, 0].any() and not got[0, :, 2].any()  # rows 0 and 2: no key left by mask and causality
    assert got[0, :, 1].any()
    _check(m, feeds)
    _check(m, feeds, oracle="reference")
