"""SmolLM2-135M-Instruct's greedy continuations in float32 by transformers
(``tests/data/smollm2_greedy.json``, written by ``scripts/export_torch_fixtures.py --smollm2-greedy``):
the reference of the f16 and Q4_1 accuracy tests. eggfuse's fp32 plan gives the same 24 tokens on
all five prompts (bench/results/quant_accuracy_lavapipe.json and f16_accuracy_lavapipe.json hold its
ids), and tests/gpu/test_generate.py checks it against the numpy oracle."""

from __future__ import annotations

import json
from pathlib import Path

GREEDY = Path(__file__).parent / "data" / "smollm2_greedy.json"


def greedy_reference() -> list[dict]:
    """One dict per prompt: ``prompt``, ``input_ids`` (transformers' tokenizer of the GGUF file) and
    ``generated_ids`` (24 argmax steps, no stop at end of sequence)."""
    return json.loads(GREEDY.read_text())["prompts"]


def reference_for(prompt: str) -> dict:
    """The reference row of ``prompt``; KeyError naming the file for a prompt it does not hold."""
    row = next((r for r in greedy_reference() if r["prompt"] == prompt), None)
    if row is None:
        raise KeyError(f"{GREEDY} holds no continuation of {prompt!r}: add the prompt to GREEDY_PROMPTS of "
                       "scripts/export_torch_fixtures.py and run it with --smollm2-greedy")
    return row
