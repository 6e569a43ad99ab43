"""Gradient ops: shape rules (one row per op, good and bad shapes) and references on known values.

The references' derivatives are checked against finite differences in test_autodiff.py;
here they are checked where a closed form is simple to state by hand.
"""

import numpy as np
import pytest
from shape_rules import shape_rule_tests  # tests/shape_rules.py (pytest pythonpath)

from eggfuse.ir import NO_GRAD, OPS, DType, Graph, evaluate
from eggfuse.ir.ops.elementwise import UNARY

ATTN = dict(causal=False, num_heads=4, num_kv_heads=2, head_dim=2, batch=2)

# op, input shapes (u32 marked by a leading "u"), attrs, expected output shape
GOOD = [
    ("CrossEntropyLoss", [[3, 5], [3, 5]], {}, (1,)),
    ("CrossEntropyLossGrad", [[3, 5], [3, 5]], {}, (3, 5)),
    ("SumRows", [[3, 5]], {}, (5,)),
    ("ReduceTo", [[2, 3, 5]], {"shape": (3, 1)}, (3, 1)),
    ("BroadcastTo", [[1]], {"shape": (3, 5)}, (3, 5)),
    ("PadCols", [[3, 2]], {"start": 4, "width": 7}, (3, 7)),
    *[(f"{u.name}Grad", [[3, 5], [3, 5]], {}, (3, 5)) for u in UNARY  # every gradient of the unary table
      if u.derivative is not None and u.name not in ("Abs", "Log", "Recip")],  # those: test_ops_extra.py
    ("SwiGLUGradGate", [[3, 5], [3, 5], [3, 5]], {}, (3, 5)),
    ("SwiGLUGradUp", [[3, 5], [3, 5]], {}, (3, 5)),
    ("SwiGLUConcatGrad", [[3, 5], [3, 10]], {}, (3, 10)),
    ("SoftmaxGrad", [[3, 5], [3, 5]], {}, (3, 5)),
    ("LayerNormGradX", [[3, 5], [3, 5], [5]], {"eps": 1e-5}, (3, 5)),
    ("LayerNormGradW", [[3, 5], [3, 5]], {"eps": 1e-5}, (5,)),
    ("RmsNormGradX", [[3, 5], [3, 5], [5]], {"eps": 1e-5}, (3, 5)),
    ("RmsNormGradW", [[3, 5], [3, 5]], {"eps": 1e-5}, (5,)),
    ("RmsNormGradX", [[2, 3, 5], [2, 3, 5], [5]], {"eps": 1e-5}, (2, 3, 5)),
    ("LayerNormGradW", [[2, 3, 5], [2, 3, 5]], {"eps": 1e-5}, (5,)),
    ("GroupNormGradInput", [[2, 6, 4], [2, 6, 4], [6]], {"num_groups": 3, "eps": 1e-5}, (2, 6, 4)),
    ("GroupNormGradWeight", [[2, 6, 4], [2, 6, 4]], {"num_groups": 3, "eps": 1e-5}, (6,)),
    ("ScatterAdd", [["u", 7], [7, 3]], {"vocab_size": 11}, (11, 3)),
    ("RoPEGrad", [[6, 8]], {"theta": 1e4, "head_dim": 4, "batch": 2}, (6, 8)),
    ("AttentionGradQ", [[6, 8], [6, 8], [6, 4], [6, 4], [2, 3]], ATTN, (6, 8)),
    ("AttentionGradK", [[6, 8], [6, 8], [6, 4], [6, 4]], {**ATTN, "causal": True}, (6, 4)),
    ("AttentionGradV", [[6, 8], [6, 8], [6, 4], [6, 4]], ATTN, (6, 4)),
]

BAD = [
    ("CrossEntropyLoss", [[3, 5], [3, 4]], {}, "labels"),
    ("CrossEntropyLossGrad", [[15], [15]], {}, r"\[M, V\]"),
    ("SumRows", [[15]], {}, "2-D"),
    ("ReduceTo", [[3, 5]], {"shape": (3,)}, "does not broadcast"),
    ("BroadcastTo", [[3, 5]], {"shape": (5, 3)}, "does not broadcast"),
    ("PadCols", [[3, 4]], {"start": 4, "width": 7}, "do not fit"),
    ("ReluGrad", [[3, 5], [5, 3]], {}, "dy"),
    ("SwiGLUGradGate", [[3, 5], [3, 5], [3, 4]], {}, "up"),
    ("SwiGLUConcatGrad", [[3, 5], [3, 9]], {}, r"\[M,2N\]"),
    ("LayerNormGradX", [[3, 5], [3, 5], [4]], {"eps": 1e-5}, "weight"),
    ("RmsNormGradW", [[3, 5], [5, 3]], {"eps": 1e-5}, "dy"),
    ("GroupNormGradInput", [[2, 6, 4], [2, 6, 4], [6]], {"num_groups": 4, "eps": 1e-5}, "groups"),
    ("ScatterAdd", [[7], [7, 3]], {"vocab_size": 11}, "u32"),
    ("ScatterAdd", [["u", 7], [6, 3]], {"vocab_size": 11}, "src"),
    ("RoPEGrad", [[6, 8]], {"theta": 1e4, "head_dim": 3}, "even"),
    ("AttentionGradQ", [[6, 4], [6, 8], [6, 4], [6, 4]], ATTN, "dO"),
    ("AttentionGradQ", [[6, 8], [6, 8], [6, 4], [6, 4], [2, 3]], {**ATTN, "causal": True}, "key_mask"),
    ("AttentionGradK", [[6, 8], [6, 8], [6, 6], [6, 4]], ATTN, "k must be"),
]


test_shape_rule_accepts, test_shape_rule_rejects = shape_rule_tests(GOOD, BAD)


#: Gradient ops whose shape rows are in test_ops_extra.py (with their forward ops).
EXTRA_GRAD_OPS = {"AbsGrad", "LogGrad", "RecipGrad", "LogSoftmaxGrad", "BceLossGrad", "Conv2dGradInput",
                  "Conv2dGradWeight", "MaxPool2dGrad", "GlobalAvgPoolGrad", "Upsample2xGrad",
                  *(f"{a}Grad{p}" for a in ("SlidingWindowAttention", "CrossAttention") for p in "QKV")}


def test_every_gradient_op_has_a_shape_row_and_a_doc():
    grad_ops = {op for op, spec in OPS.items() if spec.vjp is NO_GRAD}
    assert (grad_ops - EXTRA_GRAD_OPS) | {"CrossEntropyLoss"} == {r[0] for r in GOOD}
    for op in grad_ops:
        assert OPS[op].doc, op


def _run(op, arrays, **attrs):
    g = Graph()
    ids = []
    feeds = {}
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        dtype = DType.U32 if a.dtype.kind == "u" else DType.F32
        ids.append(g.input(f"in{i}", a.shape, dtype))
        feeds[f"in{i}"] = a
    g.set_outputs([g.add_node(op, ids, **attrs)])
    return evaluate(g, feeds, {})[0]


def test_cross_entropy_known_values():
    logits = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    labels = np.array([[1.0, 0.0], [0.0, 1.0]])
    # rows: -log(1/2), -log(1/4); mean over the 2 rows
    np.testing.assert_allclose(_run("CrossEntropyLoss", [logits, labels]), [(np.log(2) + np.log(4)) / 2], rtol=1e-7)
    big = np.array([[1000.0, 0.0]])  # max-subtracted: no overflow
    np.testing.assert_allclose(_run("CrossEntropyLoss", [big, np.array([[0.0, 1.0]])]), [1000.0])
    grad = _run("CrossEntropyLossGrad", [logits, np.array([[1.0, 0.0], [0.0, 0.0]])])
    # (softmax - labels) / M on row 0; a zero label row has no gradient
    np.testing.assert_allclose(grad, [[-0.25, 0.25], [0.0, 0.0]], atol=1e-7)


def test_reductions_and_their_adjoints():
    x = np.arange(30, dtype=np.float64).reshape(2, 3, 5)
    np.testing.assert_array_equal(_run("ReduceTo", [x], shape=(3, 1)), x.sum(axis=(0, 2))[:, None])
    np.testing.assert_array_equal(_run("ReduceTo", [x], shape=(1, 5)), x.sum(axis=(0, 1))[None, :])
    np.testing.assert_array_equal(_run("SumRows", [x[0]]), x[0].sum(axis=0))
    np.testing.assert_array_equal(_run("BroadcastTo", [np.array([2.0])], shape=(2, 3)), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(_run("PadCols", [np.ones((2, 2))], start=1, width=4),
                                  [[0, 1, 1, 0], [0, 1, 1, 0]])


def test_scatter_add_accumulates_repeated_indices():
    out = _run("ScatterAdd", [np.array([2, 0, 2], dtype=np.uint32), np.array([[1.0], [2.0], [4.0]])], vocab_size=4)
    np.testing.assert_array_equal(out, [[2.0], [0.0], [5.0], [0.0]])


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_rope_grad_inverts_rope(pairing):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    attrs = dict(theta=100.0, head_dim=4, pos_offset=2, pairing=pairing, batch=2)
    g = Graph()
    back = g.add_node("RoPEGrad", (g.rope(g.input("x", [6, 8]), **attrs),), **attrs)
    g.set_outputs([back])
    np.testing.assert_allclose(evaluate(g, {"x": x}, {})[0], x, atol=1e-12)


def test_relu_grad_is_zero_at_zero():
    np.testing.assert_array_equal(_run("ReluGrad", [np.ones(3), np.array([-1.0, 0.0, 2.0])]), [0.0, 0.0, 1.0])
