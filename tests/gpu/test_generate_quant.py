"""SmolLM2-135M (real weights) with its weights kept as blocks (``generate --weights q4_1``: the
file's Q4_1 layers and Q8_0 embedding, decoded inside the kernels) against the fp32 plan of the
same weights dequantised (``--weights f32``, what eggfuse ran before).

The full 30-layer model: prefill logits of a 16-token prompt and three decode steps within
1e-3 of the logits' scale, the plans' memory and dispatches, and greedy tokens identical for 6
tokens on two prompts to the fp32 reference (transformers in float32, ``tests/smollm2_reference.py``;
eggfuse's fp32 plan gives the same tokens). The comparison with the fp32 plan for 24 tokens on
five prompts takes minutes on lavapipe: ``bench/quant_accuracy.py`` runs it
(bench/results/quant_accuracy_lavapipe.json).
The API, the CLI and the errors run 2 layers.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from smollm2_reference import reference_for

import eggfuse
from eggfuse import cli
from eggfuse.generate import Generator
from eggfuse.ir import InputError

gen_mod = importlib.import_module("eggfuse.generate")

PROMPT_16 = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
PROMPTS = ("def fibonacci(n):", "Once upon a time, in a small village,")
SMALL = {"max_seq": 32, "layers": 2}


@pytest.fixture(scope="module")
def q4_1():
    return gen_mod._model("q4_1")


@pytest.fixture(scope="module")
def gens(q4_1):
    f32 = q4_1.with_weights("f32")
    return {"q4_1": Generator(q4_1, max_seq=64), "f32": Generator(f32, max_seq=64)}


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_the_dequantised_model_is_what_weights_f32_loads(q4_1):
    f32 = gen_mod._model("f32")
    assert q4_1.weight_formats() == {"f32": 61, "q4_1": 210, "q8_0": 1} and f32.weight_formats() == {"f32": 272}
    mine = q4_1.with_weights("f32").params
    assert mine.keys() == f32.params.keys()
    for name, value in f32.params.items():
        np.testing.assert_array_equal(mine[name], value, err_msg=name)


def test_full_model_logits_match_the_fp32_plan(q4_1, gens):
    ids = q4_1.encode(PROMPT_16)[:16]
    logits = {w: g.prefill(ids, last_logits=False) for w, g in gens.items()}
    err = relative_error(logits["q4_1"], logits["f32"])
    steps = []
    token = int(np.argmax(logits["f32"][-1]))
    for pos in range(16, 19):
        step = {w: g.step(token, pos) for w, g in gens.items()}
        steps.append(relative_error(step["q4_1"], step["f32"]))
        token = int(np.argmax(step["f32"]))
    print(f"q4_1 vs f32: prefill logits [16, V] relative error {err:.2e}, decode steps {steps}")
    assert err < 1e-3 and max(steps) < 1e-3

    # the same plans, on blocks: every matmul and the embedding decode them, nothing is dequantised
    q, f = gens["q4_1"].decode.plan, gens["f32"].decode.plan
    assert len(q.dispatches) == len(f.dispatches) == 30 * 5 + 2  # tests/unit/test_ops_cache.py counts them
    assert not any("dequant" in d.kernel for d in q.dispatches)
    # per layer the packed Q/K/V, output, packed gate/up and down projections decode their blocks (SwiGLU
    # never joins a store: ir/ops/epilogue_rules.py NEVER_JOIN)
    assert sum("_q4_1" in d.kernel for d in q.dispatches) == 30 * 4 and "quant_embedding_q8_0" in q.dispatches[0].kernel
    mq, mf = q.memory(), f.memory()
    print(f"decode plan memory: q4_1 {mq}, f32 {mf}")
    assert mq["weights_bytes"] <= 100e6 < 500e6 < mf["weights_bytes"]
    assert mq["cache_bytes"] == mf["cache_bytes"] == 30 * 2 * 64 * 192 * 4


def test_greedy_tokens_equal_the_fp32_reference(q4_1, gens):
    for prompt in PROMPTS:
        ref = reference_for(prompt)
        assert q4_1.encode(prompt).tolist() == ref["input_ids"]
        got = gens["q4_1"].generate(prompt, 6, stop_at_eos=False).generated_ids
        print(f"{prompt!r}: {q4_1.decode(got)!r}")
        assert got == ref["generated_ids"][:6], prompt


# --- 2 layers: the API, the CLI, errors -----------------------------------------------------------


def test_generate_api_reports_weights_and_memory():
    result = eggfuse.generate("The capital of France is", 3, stop_at_eos=False, weights="q4_1", **SMALL)
    # the 2-layer plans hold 7 Q4_1 matrices and 2 norms a layer, the tied embedding (Q8_0) and the final norm
    assert result.weights == "q4_1" and result.weight_formats == {"f32": 5, "q4_1": 14, "q8_0": 1}
    assert set(result.memory) == {"decode", "prefill"}
    decode = result.memory["decode"]
    assert set(decode) == {"weights_bytes", "cache_bytes", "intermediate_bytes"}
    assert decode["cache_bytes"] == 2 * 2 * 32 * 192 * 4  # 2 layers, k and v, 32 positions of 3 heads x 64
    # the 2-layer plans bind the embedding (Q8_0) and two layers of Q4_1 blocks
    embedding, layer = 49152 * 153 * 4, (576 * 2 + 192 * 2 + 1536 * 2) * 90 * 4 + 576 * 240 * 4
    assert decode["weights_bytes"] == embedding + 2 * layer + 5 * 576 * 4
    f32 = eggfuse.generate("The capital of France is", 3, stop_at_eos=False, weights="f32", **SMALL)
    assert f32.generated_ids == result.generated_ids and f32.weight_formats == {"f32": 20}


def test_cli_weights_json_and_text(capsys):
    args = ["generate", "The capital of France is", "--max-new-tokens", "2", "--max-seq", "32", "--layers", "2",
            "--weights", "q4_1"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights"] == "q4_1" and out["memory"]["decode"]["weights_bytes"] < 40e6
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    # what the 2-layer plans hold, and that the embedding's Q8_0 is the file's own
    assert "weights: q4_1 (5 f32, 14 q4_1, 1 q8_0 parameters; q8_0: the file's blocks, kept as stored)" in text
    assert "device memory: decode plan: weights " in text and "prefill plan: weights" in text


def test_unknown_weights_is_a_clear_error(capsys):
    with pytest.raises(InputError, match="weights must be one of f32, q4_0, q4_1, q8_0, f16, got 'q4_k'"):
        eggfuse.generate("hi", weights="q4_k")
    with pytest.raises(SystemExit):
        cli.main(["generate", "hi", "--weights", "q4_k"])
    assert "invalid choice: 'q4_k'" in capsys.readouterr().err
