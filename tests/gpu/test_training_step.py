"""A training step on the GPU: loss and gradients of an optimised training graph against the
numpy reference of the unoptimised one.

Each model is differentiated with ``ir.autodiff.grad``, optimised with ``rewrites.optimize``
and run by a :class:`Session`; the loss and every gradient must match ``ir.evaluate`` of the
training graph as autodiff built it, to 1e-4 of each output's largest magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import Graph, evaluate
from eggfuse.ir.autodiff import grad
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import optimize
from eggfuse.runtime import Session


def _one_hot(rows: int, classes: int, rng: np.random.Generator, padding_row: int) -> np.ndarray:
    labels = np.eye(classes)[rng.integers(0, classes, rows)]
    labels[padding_row] = 0.0  # a padding row: adds nothing to the loss or the gradients
    return labels


def mlp() -> tuple[Graph, int, dict[str, np.ndarray]]:
    """x [8,13] -> matmul + bias + relu -> matmul + bias -> CrossEntropyLoss vs one-hot labels."""
    rng = np.random.default_rng(11)
    g = Graph()
    x, labels = g.input("x", [8, 13]), g.input("labels", [8, 5])
    w1, b1 = g.parameter("w1", [13, 9]), g.parameter("b1", [9])
    w2, b2 = g.parameter("w2", [9, 5]), g.parameter("b2", [5])
    h = g.relu(g.bias_add(g.matmul(x, w1), b1))
    loss = g.add_node("CrossEntropyLoss", (g.bias_add(g.matmul(h, w2), b2), labels))
    values = {"x": rng.standard_normal((8, 13)), "labels": _one_hot(8, 5, rng, padding_row=3),
              "w1": rng.standard_normal((13, 9)) / np.sqrt(13), "b1": 0.1 * rng.standard_normal(9),
              "w2": rng.standard_normal((9, 5)) / np.sqrt(9), "b2": 0.1 * rng.standard_normal(5)}
    return g, loss, values


HID, NH, NKV, HD, SEQ, BATCH, FFN, VOCAB, THETA = 16, 4, 2, 4, 5, 2, 12, 11, 100.0


def llama_block() -> tuple[Graph, int, dict[str, np.ndarray]]:
    """One LLaMA-style layer on x [BATCH * SEQ, HID]: RmsNorm, q/k/v projections, RoPE on q and
    k, causal GQA attention, output projection and residual, RmsNorm, SwiGLU MLP and residual,
    then logits through an lm_head and CrossEntropyLoss."""
    rng = np.random.default_rng(12)
    g = Graph()
    rows = BATCH * SEQ
    shapes = {"attn_norm": [HID], "wq": [NH * HD, HID], "wk": [NKV * HD, HID], "wv": [NKV * HD, HID],
              "wo": [HID, NH * HD], "mlp_norm": [HID], "gate": [FFN, HID], "up": [FFN, HID], "down": [HID, FFN],
              "lm_head": [VOCAB, HID]}
    p = {name: g.parameter(name, shape) for name, shape in shapes.items()}
    x, labels = g.input("x", [rows, HID]), g.input("labels", [rows, VOCAB])
    h = g.rms_norm(x, p["attn_norm"])
    q = g.rope(g.matmul_bt(h, p["wq"]), THETA, HD, batch=BATCH)
    k = g.rope(g.matmul_bt(h, p["wk"]), THETA, HD, pairing="half", batch=BATCH)
    att = g.causal_attention(q, k, g.matmul_bt(h, p["wv"]), NH, NKV, HD, batch=BATCH)
    x1 = g.add(x, g.matmul_bt(att, p["wo"]))
    h = g.rms_norm(x1, p["mlp_norm"])
    mlp_out = g.matmul_bt(g.swiglu(g.matmul_bt(h, p["gate"]), g.matmul_bt(h, p["up"])), p["down"])
    logits = g.matmul_bt(g.add(x1, mlp_out), p["lm_head"])
    loss = g.add_node("CrossEntropyLoss", (logits, labels))
    values = {"x": rng.standard_normal((rows, HID)), "labels": _one_hot(rows, VOCAB, rng, padding_row=7)}
    for name, shape in shapes.items():
        if name.endswith("norm"):
            values[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            values[name] = rng.standard_normal(shape) / np.sqrt(shape[-1])
    return g, loss, values


@pytest.mark.parametrize("model", [mlp, llama_block], ids=["mlp", "llama_block"])
def test_optimised_training_step_matches_reference(model, device):
    g, loss, values = model()
    wrt = [*g.parameters, "x"] if model is llama_block else None  # the block also gives d loss / d x
    tg = grad(g, loss, wrt)
    og, report = optimize(tg)
    assert len(og.outputs) == len(tg.outputs) and report.dispatches_after <= report.dispatches_before
    inputs = {name: values[name] for name in tg.inputs}
    params = {name: values[name] for name in tg.parameters}
    want = evaluate(tg, inputs, params)
    got = Session(lower_for(og, device), {name: values[name] for name in og.parameters}, device=device).run(
        {name: values[name] for name in og.inputs})
    names = ["loss", *tg.grad_outputs]
    for name, a, b in zip(names, got, want, strict=True):
        assert a.shape == b.shape and np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()), err_msg=name)
    assert all(np.abs(w).max() > 0 for w in want), "a gradient is identically zero: the test would be vacuous"

