"""The references of GeneralAttention, AttentionScores and RotaryEmbedding (the oracles of their
GPU rows) against onnx's own reference implementations, over random option combinations;
the shape rules' refusals (no GPU needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx.reference.ops.op_attention import _compute_attention
from onnx.reference.ops.op_rotary_embedding import rotary_embedding

from eggfuse.ir import DType, Graph, GraphError, InputError
from eggfuse.ir.ops.attention_general import attention_scores_ref, general_attention_ref
from eggfuse.ir.ops.transformer import rotary_embedding_ref


def _case(seed: int):
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([3, 4]))
    b, kv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    nh = kv * int(rng.integers(1, 3))
    sq, skv, d, dv = (int(x) for x in rng.integers(1, 7, 4))
    past = int(rng.integers(0, 3)) if rank == 4 else 0
    q = rng.standard_normal((b, nh, sq, d))
    k, v = rng.standard_normal((b, kv, skv, d)), rng.standard_normal((b, kv, skv, dv))
    pk, pv = rng.standard_normal((b, kv, past, d)), rng.standard_normal((b, kv, past, dv))
    total = past + skv
    mask = None
    kind = rng.integers(0, 3)
    if kind:
        shape = [b, nh, sq, total][4 - int(rng.integers(2, 5)):]  # rank 1: the reference fails with is_causal
        shape = [s if rng.random() < 0.6 else 1 for s in shape[:-1]] + [int(rng.integers(1, total + 1))]
        mask = rng.random(shape) < 0.7 if kind == 1 else np.where(rng.random(shape) < 0.2, -np.inf,
                                                                  rng.standard_normal(shape))
    lens = None
    if past == 0 and rng.random() < 0.3:
        lens = rng.integers(0, total + 1, b)
    attrs = dict(scale=float(rng.choice([1 / math.sqrt(d), 0.3])), softcap=float(rng.choice([0.0, 1.5])),
                 causal=bool(rng.integers(0, 2)), left_window=int(rng.choice([-1, 0, 2])),
                 right_window=int(rng.choice([-1, 1])))
    return rank, q, k, v, pk, pv, mask, lens, past, attrs


@pytest.mark.parametrize("seed", range(60))
def test_general_attention_and_scores_match_onnx_reference(seed):
    rank, q, k, v, pk, pv, mask, lens, past, a = _case(seed)
    nh, nkv = q.shape[1], k.shape[1]
    want = {}
    for mode in (1, 2, 3):
        y, _, _, want[mode] = _compute_attention(
            q, k, v, attn_mask=mask, past_key=pk if past else None, past_value=pv if past else None,
            nonpad_kv_seqlen=lens, scale=a["scale"], is_causal=a["causal"], softcap=a["softcap"],
            qk_matmul_output_mode=mode, left_window_size=a["left_window"], right_window_size=a["right_window"],
            _validate_attention25=False)
    kk, vv = (np.concatenate([pk, k], axis=2), np.concatenate([pv, v], axis=2)) if past else (k, v)
    if rank == 3:  # the same values in ONNX's 3-D layout
        q, kk, vv, y = (x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1) for x in (q, kk, vv, y))
    attrs = dict(a, num_heads=nh, kv_num_heads=nkv, offset=past)
    if lens is not None and mask is None:
        mask = np.zeros(kk.shape[-2])  # GeneralAttention takes kv_lens after a mask
    extra = [x for x in (mask, lens) if x is not None]
    np.testing.assert_allclose(general_attention_ref([q, kk, vv, *extra], attrs), y, rtol=1e-10, atol=1e-12)
    for mode in (1, 2, 3):
        got = attention_scores_ref([q, kk, *extra], dict(attrs, mode=mode))
        np.testing.assert_allclose(got, want[mode], rtol=1e-10, atol=1e-12)


def test_mode_0_is_the_scaled_product_before_the_softcap():
    # the spec (and onnxruntime): mode 0 is the output of the QK matmul; mode 1 adds the softcap
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4))
    a = dict(scale=0.5, softcap=1.5, causal=False, offset=0, left_window=-1, right_window=-1, num_heads=0,
             kv_num_heads=0)
    raw = np.einsum("bhid,bhjd->bhij", q, k) * 0.5
    np.testing.assert_allclose(attention_scores_ref([q, k], dict(a, mode=0)), raw)
    np.testing.assert_allclose(attention_scores_ref([q, k], dict(a, mode=1)), 1.5 * np.tanh(raw / 1.5))


@pytest.mark.parametrize("interleaved,rot,ids", [(0, 0, True), (1, 0, True), (0, 4, False), (1, 6, False)])
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_embedding_matches_onnx_reference(interleaved, rot, ids, rank):
    rng = np.random.default_rng(rot + rank)
    b, nh, s, d = 2, 3, 5, 8
    half = (rot or d) // 2
    x = rng.standard_normal((b, nh, s, d) if rank == 4 else (b, s, nh * d))
    cos, sin = (rng.standard_normal((11, half) if ids else (b, s, half)) for _ in range(2))
    pos = rng.integers(0, 11, (b, s)) if ids else None
    want = rotary_embedding(x, cos, sin, pos, interleaved=interleaved, rotary_embedding_dim=rot,
                            num_heads=nh if rank == 3 else 0)
    xs = [x, cos, sin] + ([pos] if ids else [])
    got = rotary_embedding_ref(xs, dict(interleaved=bool(interleaved), rotary_embedding_dim=rot, num_heads=nh))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_rotary_embedding_refuses_position_ids_outside_the_cache():
    x, cache = np.zeros((1, 1, 2, 4)), np.zeros((3, 2))
    with pytest.raises(InputError, match=r"position ids 0\.\.3 are outside the 3 rows"):
        rotary_embedding_ref([x, cache, cache, np.array([[0, 3]])], dict(interleaved=False, rotary_embedding_dim=0,
                                                                         num_heads=0))


def test_shape_rules_refuse_what_does_not_fit():
    g = Graph()
    q, k, v = g.input("q", [2, 4, 3, 8]), g.input("k", [2, 3, 5, 8]), g.input("v", [2, 3, 5, 8])
    with pytest.raises(GraphError, match=r"4 query heads are not a multiple of 3 kv heads"):
        g.add_node("GeneralAttention", (q, k, v), scale=1.0)
    k2, v2 = g.input("k2", [2, 2, 5, 6]), g.input("v2", [2, 2, 5, 8])
    with pytest.raises(GraphError, match=r"different head sizes \(8, 6\)"):
        g.add_node("GeneralAttention", (q, k2, v2), scale=1.0)
    k3 = g.input("k3", [2, 2, 5, 8])
    with pytest.raises(GraphError, match=r"mask .* covers 6 keys, more than the 5 keys"):
        g.add_node("GeneralAttention", (q, k3, v2, g.input("m", [3, 6])), scale=1.0)
    with pytest.raises(GraphError, match=r"does not broadcast to \[2,4,3,5\]"):
        g.add_node("GeneralAttention", (q, k3, v2, g.input("m2", [2, 3, 5])), scale=1.0)
    with pytest.raises(GraphError, match=r"kv_lens must be i32 \[2\]"):
        g.add_node("GeneralAttention", (q, k3, v2, g.input("m3", [5]), g.input("lens", [3], DType.I32)), scale=1.0)
    with pytest.raises(GraphError, match=r"q is 3-D .*head count attribute must be >= 1"):
        g.add_node("GeneralAttention", (g.input("q3", [2, 3, 16]), k3, v2), scale=1.0)
    with pytest.raises(GraphError, match=r"mode must be 0, 1, 2 or 3"):
        g.add_node("AttentionScores", (q, k3), scale=1.0, mode=4)
    with pytest.raises(GraphError, match=r"rotary_embedding_dim 10 must be even and in \[2, 8\]"):
        g.add_node("RotaryEmbedding", (q, g.input("c", [9, 5]), g.input("s", [9, 5]), g.input("p", [2, 3], DType.I32)),
                   rotary_embedding_dim=10)
