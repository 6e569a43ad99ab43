"""Exported attention blocks and the 2-layer fixtures compiled with the recognition rules and run
on the GPU (lavapipe without one) through eggfuse.onnx.Model: the recognised op is in the plan
that runs, and the outputs are onnxruntime's (torch's for the fixtures, but onnxruntime's at the
rows where the exported graph is not torch: tests/exported_graphs.py GRAPH_NOT_TORCH)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from eggfuse.onnx import Model
from tests.exported_graphs import Attn, attention_model, expected_outputs, feeds
from tests.onnx_ort_check import check_against_ort

DATA = Path(__file__).resolve().parent.parent / "data" / "exported"

CASES = {
    "causal_gqa_rope": (Attn(heads=4, kv_heads=2, mask="causal", rope=True), "CausalAttentionRoPE"),
    "eager_causal_min": (Attn(kt="classic", scale="mul", mask="causal_min", guard=False), "CausalAttention"),
    # one sequence keeps no key: zero rows (masked_rows "zero"), and with float32's min the mean of v ("mean")
    "padding_fully_masked_row": (Attn(batch=3, kt="bert", scale="div", mask="padding", proj_bias=True),
                                 "FullAttentionPacked"),
    "min_padding_fully_masked_row": (Attn(batch=3, kt="bert", mask="padding_true_min", proj_bias=True),
                                     "FullAttentionPacked"),
    # causal rows and padding (the fourth sequence left padded: its first two rows keep no key of their own)
    "padding_and_causal_gqa": (Attn(batch=4, heads=4, kv_heads=2, mask="padding_causal", rope=True),
                               "CausalAttentionRoPE"),
    "min_padding_and_causal_gqa": (Attn(batch=4, heads=4, kv_heads=2, mask="padding_causal_min", rope=True),
                                   "CausalAttentionRoPE"),
    "probabilities_also_an_output": (Attn(mask="padding", batch=3, probs_output=True), "FullAttention"),
    "no_mask": (Attn(head_dim=8), "FullAttentionPacked"),  # projections without biases, packed into one product
}


def _ops(model: Model) -> set[str]:
    (spec,) = model.plans.values()
    return {n.op for n in spec.compiled.graph.live_nodes()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_recognised_attention_runs_as_onnxruntime(case, device):
    block, op = CASES[case]
    model = check_against_ort(attention_model(block), feeds(block), rtol=1e-4, atol=2e-5, device=device)
    ops = _ops(model)
    assert op in ops and "Softmax" not in ops and "BatchMatMul" not in ops, ops


@pytest.mark.parametrize("name, op", [("bert_tiny.dynamo.onnx", "FullAttentionPacked"),
                                      ("llama_tiny.classic.onnx", "CausalAttentionRoPE"),
                                      ("llama_tiny.dynamo.onnx", "CausalAttentionRoPE"),
                                      ("gpt2_tiny.classic.onnx", "CausalAttention"),
                                      ("gpt2_tiny.dynamo.onnx", "CausalAttention")])
def test_exported_fixture_runs_fused_as_torch(name, op, device):
    data = np.load(DATA / (name.split(".")[0] + ".npz"))
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input.")}
    model = Model(DATA / name, device=device)
    outs = model.run(inputs)
    want = expected_outputs(DATA / name, data)  # torch's, onnxruntime's where the graph is not torch
    for out, vi in zip(outs, onnx.load(DATA / name).graph.output, strict=True):
        np.testing.assert_allclose(out, want[vi.name], rtol=1e-4, atol=3e-5)
    assert op in _ops(model)
