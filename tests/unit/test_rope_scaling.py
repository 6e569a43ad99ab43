"""RoPE frequency scaling (the ``scaling`` attribute of the RoPE ops) against transformers' formulas."""

from __future__ import annotations

import math

import hf_numpy  # tests/hf_numpy.py: written from transformers' modeling_rope_utils (pytest pythonpath)
import numpy as np
import pytest

from eggfuse.ir import Graph, GraphError, evaluate
from eggfuse.ir.ops.transformer import rope_inv_freq
from eggfuse.rewrites import optimize

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _hf(head_dim: int, theta: float, params: dict | None) -> np.ndarray:
    cfg = {"model_type": "llama", "rope_theta": theta, "rope_scaling": params, "max_position_embeddings": 128}
    return hf_numpy.inv_freq(cfg, head_dim)


@pytest.mark.parametrize("head_dim, theta", [(8, 10000.0), (64, 500000.0), (128, 10000.0)])
@pytest.mark.parametrize("scaling, params", [
    (None, None),
    (("linear", 4.0), {"type": "linear", "factor": 4.0}),
    (("llama3", 8.0, 1.0, 4.0, 64.0), LLAMA3),
    (("llama3", 32.0, 1.0, 4.0, 8192.0), {**LLAMA3, "factor": 32.0, "original_max_position_embeddings": 8192}),
])
def test_frequencies_match_transformers(head_dim, theta, scaling, params):
    np.testing.assert_allclose(rope_inv_freq(theta, head_dim, scaling), _hf(head_dim, theta, params), rtol=1e-12)


def test_llama3_bands_are_all_exercised():
    # wavelengths below L/high are kept, above L/low divided by factor, in between interpolated
    base = rope_inv_freq(10000.0, 32)
    scaled = rope_inv_freq(10000.0, 32, ("llama3", 8.0, 1.0, 4.0, 64.0))
    wavelen = 2 * math.pi / base
    kept, divided = wavelen < 16, wavelen > 64
    between = ~kept & ~divided
    assert kept.any() and divided.any() and between.any()
    np.testing.assert_array_equal(scaled[kept], base[kept])
    np.testing.assert_allclose(scaled[divided], base[divided] / 8)
    assert np.all((scaled[between] < base[between]) & (scaled[between] > base[between] / 8))


def test_linear_scaling_is_position_interpolation():
    # RoPE with frequencies / 4 at position 4 r equals unscaled RoPE at position r
    x = np.random.default_rng(0).standard_normal((1, 16))

    def rows(positions, scaling):
        g = Graph()
        xi = g.input("x", [1, 16])
        g.set_outputs([g.rope(xi, 100.0, 8, pos_offset=p, scaling=scaling) for p in positions])
        return np.concatenate(evaluate(g, {"x": x}, {}))

    np.testing.assert_allclose(rows([4 * r for r in range(6)], ("linear", 4.0)), rows(range(6), None), atol=1e-12)
    assert not np.allclose(rows(range(1, 6), ("linear", 4.0)), rows(range(1, 6), None))


@pytest.mark.parametrize("scaling, message", [
    (("yarn", 4.0), "kind in"),
    (("linear",), "takes 1 positive"),
    (("linear", -2.0), "takes 1 positive"),
    (("llama3", 8.0, 4.0, 1.0, 64.0), "high_freq_factor > low_freq_factor"),
    ("linear", "tuple"),
])
def test_bad_scaling_is_a_graph_error(scaling, message):
    g = Graph()
    with pytest.raises(GraphError, match=message):
        g.rope(g.input("x", [4, 16]), 100.0, 8, scaling=scaling)


def test_fusion_keeps_the_scaling():
    # RoPE moved into the attention kernel carries the scaling; the rebuilt graph agrees with the original
    sc = ("llama3", 8.0, 1.0, 4.0, 64.0)
    g = Graph()
    q, k, v = g.input("q", [9, 64]), g.input("k", [9, 32]), g.input("v", [9, 32])
    g.set_outputs([g.causal_attention(g.rope(q, 10000.0, 16, scaling=sc), g.rope(k, 10000.0, 16, scaling=sc),
                                      v, 4, 2, 16)])
    opt, _ = optimize(g, verify=True)
    (fused,) = [n for n in opt.live_nodes() if n.op == "CausalAttentionRoPE"]
    assert fused.attrs["scaling"] == sc
