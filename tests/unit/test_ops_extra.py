"""The rest of the seed's ops (Abs, Log, Recip, Greater, LogSoftmax, BceLoss, windowed
attention, vision): shape rules (one row per op, good and bad shapes) and the references
checked against independent definitions (naive loops, the existing attention ops they
generalise, adjoint identities, known values). Their gradients are checked against finite
differences in test_autodiff.py and their kernels in tests/gpu/test_ops.py.
"""

import itertools
import math

import numpy as np
import pytest
from shape_rules import shape_rule_tests  # tests/shape_rules.py (pytest pythonpath)

from eggfuse.ir import NO_GRAD, OPS, Graph, GraphError, evaluate
from eggfuse.ir.ops.attention import MASK_SENTINEL, attention_band, attention_reference, windowed_attention

SWA = dict(num_heads=4, num_kv_heads=2, head_dim=2, window_size=3, batch=2)
CROSS = dict(num_heads=4, num_kv_heads=2, head_dim=2, batch=2)
CONV = dict(stride=2, padding_h=1, padding_w=0)
POOL = dict(kernel_h=3, kernel_w=2, stride=2, padding=1)

# op, input shapes, attrs, expected output shape
GOOD = [
    *[(op, [[3, 5]], {}, (3, 5)) for op in ("Abs", "Log", "Recip", "LogSoftmax")],
    *[(op, [[3, 5], [3, 5]], {}, (3, 5)) for op in ("AbsGrad", "LogGrad", "RecipGrad", "LogSoftmaxGrad")],
    ("Greater", [[3, 5], [5]], {}, (3, 5)),
    ("BceLoss", [[3, 5], [3, 5]], {}, (1,)),
    ("BceLossGrad", [[3, 5], [3, 5]], {}, (3, 5)),
    ("SlidingWindowAttention", [[6, 8], [6, 4], [6, 4], [2, 3]], SWA, (6, 8)),
    ("SlidingWindowAttentionGradQ", [[6, 8], [6, 8], [6, 4], [6, 4]], SWA, (6, 8)),
    ("SlidingWindowAttentionGradK", [[6, 8], [6, 8], [6, 4], [6, 4], [2, 3]], SWA, (6, 4)),
    ("SlidingWindowAttentionGradV", [[6, 8], [6, 8], [6, 4], [6, 4]], SWA, (6, 4)),
    ("CrossAttention", [[6, 8], [10, 4], [10, 4], [2, 5]], CROSS, (6, 8)),
    ("CrossAttentionGradQ", [[6, 8], [6, 8], [10, 4], [10, 4]], CROSS, (6, 8)),
    ("CrossAttentionGradK", [[6, 8], [6, 8], [10, 4], [10, 4]], CROSS, (10, 4)),
    ("CrossAttentionGradV", [[6, 8], [6, 8], [10, 4], [10, 4], [2, 5]], CROSS, (10, 4)),
    ("Conv2d", [[2, 3, 7, 9], [5, 3, 3, 2]], CONV, (2, 5, 4, 4)),
    ("Conv2dGradInput", [[2, 5, 4, 4], [5, 3, 3, 2]], {**CONV, "in_h": 7, "in_w": 9}, (2, 3, 7, 9)),
    ("Conv2dGradWeight", [[2, 5, 4, 4], [2, 3, 7, 9]], {**CONV, "kernel_h": 3, "kernel_w": 2}, (5, 3, 3, 2)),
    ("MaxPool2d", [[2, 3, 7, 9]], POOL, (2, 3, 4, 5)),
    ("MaxPool2dGrad", [[2, 3, 4, 5], [2, 3, 7, 9]], POOL, (2, 3, 7, 9)),
    ("GlobalAvgPool", [[2, 3, 7, 9]], {}, (2, 3)),
    ("GlobalAvgPoolGrad", [[2, 3]], {"shape": (2, 3, 7, 9)}, (2, 3, 7, 9)),
    ("Upsample2x", [[2, 3, 7, 9]], {}, (2, 3, 14, 18)),
    ("Upsample2xGrad", [[2, 3, 14, 18]], {}, (2, 3, 7, 9)),
]

BAD = [
    ("AbsGrad", [[3, 5], [5, 3]], {}, "dy"),
    ("Greater", [[3, 5], [4]], {}, "broadcast"),
    ("BceLoss", [[3, 5], [3, 4]], {}, "labels"),
    ("LogSoftmaxGrad", [[3, 5], [3, 4]], {}, "dy"),
    ("SlidingWindowAttention", [[6, 8], [4, 4], [4, 4]], SWA, "same number of rows"),
    ("SlidingWindowAttention", [[6, 8], [6, 4], [6, 4]], {**SWA, "window_size": 0}, "window_size"),
    ("CrossAttention", [[6, 8], [10, 4], [9, 4]], CROSS, "same number of rows"),
    ("CrossAttention", [[6, 8], [9, 4], [9, 4]], CROSS, "sequences"),
    ("CrossAttention", [[6, 8], [10, 4], [10, 4], [2, 3]], CROSS, "key_mask"),
    ("CrossAttention", [[6, 8], [10, 6], [10, 6]], {**CROSS, "num_kv_heads": 3}, "multiple"),
    ("CrossAttentionGradQ", [[6, 4], [6, 8], [10, 4], [10, 4]], CROSS, "dO"),
    ("Conv2d", [[2, 3, 7, 9], [5, 4, 3, 3]], CONV, "input channels"),
    ("Conv2d", [[2, 3, 7], [5, 3, 3, 3]], CONV, r"\[N, C, H, W\]"),
    ("Conv2d", [[2, 3, 2, 2], [5, 3, 5, 5]], CONV, "larger than the padded input"),
    ("Conv2d", [[2, 3, 7, 9], [5, 3, 3, 3]], {**CONV, "stride": 0}, "stride"),
    ("Conv2dGradInput", [[2, 5, 3, 4], [5, 3, 3, 2]], {**CONV, "in_h": 7, "in_w": 9}, "dy is 3x4"),
    ("Conv2dGradWeight", [[2, 5, 4, 4], [3, 3, 7, 9]], {**CONV, "kernel_h": 3, "kernel_w": 2}, "batch"),
    ("MaxPool2d", [[2, 3, 7, 9]], {**POOL, "kernel_h": 0}, "kernel"),
    ("MaxPool2dGrad", [[2, 3, 4, 4], [2, 3, 7, 9]], POOL, "dy"),
    ("GlobalAvgPool", [[2, 3]], {}, r"\[N, C, S\]"),
    ("GlobalAvgPoolGrad", [[2, 4]], {"shape": (2, 3, 7, 9)}, "dy"),
    ("Upsample2xGrad", [[2, 3, 13, 18]], {}, "2H"),
]


test_shape_rule_accepts, test_shape_rule_rejects = shape_rule_tests(GOOD, BAD)


def test_every_op_has_a_shape_row_a_doc_and_a_kind():
    for op in {r[0] for r in GOOD}:
        assert OPS[op].doc, op
        assert (OPS[op].vjp is NO_GRAD) == ("Grad" in op), op


def f32(a) -> np.ndarray:
    """``a`` rounded to float32 values, as ir.evaluate rounds its leaves."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _run(op, arrays, **attrs):
    g = Graph()
    ids, feeds = [], {}
    for i, a in enumerate(arrays):
        a = np.asarray(a, dtype=np.float64)
        ids.append(g.input(f"in{i}", a.shape))
        feeds[f"in{i}"] = a
    g.set_outputs([g.add_node(op, ids, **attrs)])
    return evaluate(g, feeds, {})[0]


# --- elementwise and losses ---------------------------------------------------------------------


def test_log_and_recip_follow_numpy_off_their_domain():
    out = _run("Log", [[-1.0, -0.0, 0.0, 1.0, np.e]])
    assert np.isnan(out[0]) and out[1] == -np.inf and out[2] == -np.inf
    np.testing.assert_allclose(out[3:], [0.0, 1.0])
    np.testing.assert_array_equal(_run("Recip", [[-0.0, 0.0, 4.0]]), [-np.inf, np.inf, 0.25])


def test_greater_is_strict_and_broadcasts():
    np.testing.assert_array_equal(_run("Greater", [[[1.0, 2.0, 3.0]], [2.0]]), [[0.0, 0.0, 1.0]])
    np.testing.assert_array_equal(_run("Greater", [[0.0, -0.0], [-0.0, 0.0]]), [0.0, 0.0])


def test_bce_known_values_and_clamp():
    # -(log 0.5 + log 0.75) / 2 for (p, t) = (0.5, 1), (0.25, 0)
    np.testing.assert_allclose(_run("BceLoss", [[0.5, 0.25], [1.0, 0.0]]), [-(np.log(0.5) + np.log(0.75)) / 2])
    # p = 0 with t = 1 and p = 1 with t = 0 each cost the clamp, 100; the right labels cost 0
    np.testing.assert_allclose(_run("BceLoss", [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0]]), [50.0])
    grad = _run("BceLossGrad", [[0.0, 1.0, 0.5], [1.0, 0.0, 0.25]])
    # clamped logs have slope 0; at p = 0.5: -(t/p - (1-t)/(1-p)) / n = -(0.5 - 1.5) / 3
    np.testing.assert_allclose(grad, [0.0, 0.0, 1.0 / 3.0])


def test_log_softmax_is_log_of_softmax_and_stays_finite():
    x = np.array([[1e3, 999.0, 0.0], [MASK_SENTINEL] * 3, [0.5, -2.0, 3.0]])
    out = _run("LogSoftmax", [x])
    np.testing.assert_allclose(out[2], np.log(np.exp(x[2]) / np.exp(x[2]).sum()))
    np.testing.assert_allclose(out[1], np.full(3, -np.log(3.0)))
    np.testing.assert_allclose(out[0, :2], [-np.log1p(np.exp(-1.0)), -1.0 - np.log1p(np.exp(-1.0))])


# --- attention --------------------------------------------------------------------------------


def test_attention_band():
    assert attention_band(4, 4, 2).astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert attention_band(2, 3, 0).all()


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    a = dict(num_heads=4, num_kv_heads=2, head_dim=3, batch=2)
    return rng.standard_normal((10, 12)), rng.standard_normal((10, 6)), rng.standard_normal((10, 6)), a


def test_wide_sliding_window_is_causal_attention(qkv):
    q, k, v, a = qkv
    np.testing.assert_allclose(windowed_attention(q, k, v, a, window=5), attention_reference(q, k, v, a, causal=True))
    # window 1: each row sees only its own key, so the output is its value row
    out = windowed_attention(q, k, v, a, window=1)
    np.testing.assert_allclose(out, np.repeat(v.reshape(10, 2, 3), 2, axis=1).reshape(10, 12))


def test_cross_attention_over_the_same_rows_is_full_attention(qkv):
    q, k, v, a = qkv
    mask = np.array([[1.0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])  # sequence 1 fully masked
    np.testing.assert_allclose(windowed_attention(q, k, v, a, 0, mask), attention_reference(q, k, v, a, False, mask))


def test_fully_masked_window_averages_its_window(qkv):
    q, k, v, a = qkv
    mask = np.array([[0.0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = windowed_attention(q, k, v, a, window=2, key_mask=mask)
    np.testing.assert_allclose(out[1, :3], v[:2, :3].mean(axis=0))  # row 1 sees keys 0, 1: both masked
    np.testing.assert_allclose(out[0, 3:6], v[0, :3])


# --- vision ----------------------------------------------------------------------------------

_GEOMETRIES = [((7, 9), (3, 2), 2, (1, 0)), ((5, 6), (1, 3), 1, (2, 1)), ((10, 7), (2, 4), 3, (2, 0))]


def _naive_conv(x, w, stride, ph, pw):
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    oh, ow = (h + 2 * ph - kh) // stride + 1, (wd + 2 * pw - kw) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    for b, o, y, xx, c, i, j in itertools.product(*map(range, (n, cout, oh, ow, cin, kh, kw))):
        iy, ix = y * stride - ph + i, xx * stride - pw + j
        if 0 <= iy < h and 0 <= ix < wd:
            out[b, o, y, xx] += x[b, c, iy, ix] * w[o, c, i, j]
    return out


@pytest.mark.parametrize("hw,k,stride,pad", _GEOMETRIES)
def test_conv2d_matches_loops_and_its_gradients_are_adjoint(hw, k, stride, pad):
    rng = np.random.default_rng(1)
    x, w = f32(rng.standard_normal((2, 3, *hw))), f32(rng.standard_normal((4, 3, *k)))
    attrs = dict(stride=stride, padding_h=pad[0], padding_w=pad[1])
    y = _run("Conv2d", [x, w], **attrs)
    np.testing.assert_allclose(y, _naive_conv(x, w, stride, *pad), atol=1e-12)
    dy = f32(rng.standard_normal(y.shape))
    dx = _run("Conv2dGradInput", [dy, w], in_h=hw[0], in_w=hw[1], **attrs)
    dw = _run("Conv2dGradWeight", [dy, x], kernel_h=k[0], kernel_w=k[1], **attrs)
    # <conv(x, w), dy> = <x, dx> = <w, dw>: both gradients are the adjoint maps
    np.testing.assert_allclose((y * dy).sum(), (x * dx).sum())
    np.testing.assert_allclose((y * dy).sum(), (w * dw).sum())


@pytest.mark.parametrize("k,stride,pad", [((2, 2), 2, 0), ((3, 2), 2, 1), ((1, 1), 2, 1), ((2, 2), 3, 2)])
def test_max_pool_matches_loops(k, stride, pad):
    x = f32(np.random.default_rng(2).standard_normal((1, 2, 7, 6)))
    out = _run("MaxPool2d", [x], kernel_h=k[0], kernel_w=k[1], stride=stride, padding=pad)
    _, _, h, w = x.shape
    for c, y, xx in itertools.product(range(2), range(out.shape[2]), range(out.shape[3])):
        taps = [x[0, c, y * stride - pad + i, xx * stride - pad + j] for i in range(k[0]) for j in range(k[1])
                if 0 <= y * stride - pad + i < h and 0 <= xx * stride - pad + j < w]
        assert out[0, c, y, xx] == (max(taps) if taps else MASK_SENTINEL)


@pytest.mark.parametrize("op", ["MaxPool2d", "MaxPool2dGrad"])
def test_max_pool_stride_must_be_given(op):
    # torch.nn.MaxPool2d's default stride is the kernel size, not 1: a pool without one is refused
    g = Graph()
    x = g.input("x", [1, 1, 4, 4])
    ins = [x] if op == "MaxPool2d" else [g.input("dy", [1, 1, 2, 2]), x]
    with pytest.raises(GraphError, match=f"{op}: missing attribute stride"):
        g.add_node(op, ins, kernel_h=2, kernel_w=2)


def test_max_pool_gradient_goes_to_the_first_maximum():
    x = np.array([[[[1.0, 3.0, 3.0], [0.0, 3.0, 2.0], [0.0, 0.0, 0.0]]]])
    attrs = dict(kernel_h=2, kernel_w=2, stride=1, padding=0)
    dy = np.array([[[[1.0, 10.0], [100.0, 1000.0]]]])
    dx = _run("MaxPool2dGrad", [dy, x], **attrs)
    # windows (0,0) and (0,1) tie on 3s: the first in row-major order wins; (1,0) and (1,1) -> x[1,1]
    np.testing.assert_array_equal(dx[0, 0], [[0.0, 11.0, 0.0], [0.0, 1100.0, 0.0], [0.0, 0.0, 0.0]])


def test_pool_and_upsample_pairs_are_adjoint():
    rng = np.random.default_rng(3)
    x, dy = f32(rng.standard_normal((2, 3, 4, 5))), f32(rng.standard_normal((2, 3)))
    pooled = _run("GlobalAvgPool", [x])
    np.testing.assert_allclose(pooled, x.mean(axis=(2, 3)))
    np.testing.assert_allclose((pooled * dy).sum(), (x * _run("GlobalAvgPoolGrad", [dy], shape=x.shape)).sum())
    up = _run("Upsample2x", [x])
    assert up[1, 2, 7, 9] == x[1, 2, 3, 4] and up.shape == (2, 3, 8, 10)
    d_up = f32(rng.standard_normal(up.shape))
    np.testing.assert_allclose((up * d_up).sum(), (x * _run("Upsample2xGrad", [d_up])).sum())


def test_channel_split_is_slice_cols_between_views():
    # The seed's SplitA / SplitB as ir.seed_ops maps them (and Concat's gradient emits them)
    x = np.arange(2 * 5 * 3 * 4, dtype=np.float64).reshape(2, 5, 3, 4)
    g = Graph()
    flat = g.reshape(g.input("x", x.shape), [2, 5 * 12])
    a = g.reshape(g.slice_cols(flat, 0, 2 * 12), [2, 2, 3, 4])
    b = g.reshape(g.slice_cols(flat, 2 * 12, 3 * 12), [2, 3, 3, 4])
    g.set_outputs([a, b])
    got_a, got_b = evaluate(g, {"x": x}, {})
    np.testing.assert_array_equal(got_a, x[:, :2])
    np.testing.assert_array_equal(got_b, x[:, 2:])
    assert math.prod(got_b.shape) == 2 * 3 * 12
