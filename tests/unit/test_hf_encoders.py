"""BERT / RoBERTa / XLM-R folders (tests/hf_folders.py) and the shipped all-MiniLM-L6-v2 folder
through eggfuse.load_model, on the numpy reference interpreter, against tests/hf_numpy.py: no GPU."""

from __future__ import annotations

import json
import re
import shutil

import hf_checks  # tests/: the config check both families share
import hf_folders  # tests/: the folder writer and the oracle (pytest pythonpath)
import hf_numpy
import numpy as np
import pytest

import eggfuse
from eggfuse.ir import ModelError
from eggfuse.models import minilm
from eggfuse.models.minilm import Pooling, SentenceEncoder

SENTENCES = ["A man is eating food.", "Hi", "The weather is lovely today, it's so sunny outside!"]
#: (model_type, generation, pooling in sentence-transformers' files (None: no files), normalize, name prefix)
CASES = [
    ("bert", 4, "mean", True, ""),
    ("bert", 5, "cls", False, "bert."),
    ("bert", 4, "mean_sqrt_len", True, ""),
    ("roberta", 4, "mean", True, "roberta."),
    ("roberta", 5, "lasttoken", True, ""),
    ("xlm-roberta", 4, None, True, "roberta."),
    ("xlm-roberta", 5, "weightedmean", False, ""),
]


def _name(case) -> str:
    mt, gen, pooling, normalize, prefix = case
    return f"{mt}-tf{gen}-{pooling or 'default'}{'-norm' if normalize else ''}{'-' + prefix[:-1] if prefix else ''}"


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_embeddings_match_the_oracle(hf_folder, case):
    mt, gen, pooling, normalize, prefix = case
    folder = hf_folder(_name(case), "encoder", mt, generation=gen, pooling=pooling, normalize=normalize, prefix=prefix)
    model = eggfuse.load_model(folder)
    assert isinstance(model, SentenceEncoder) and model.kind == mt
    batch = model.tokenize(SENTENCES)
    assert len(set(batch.attention_mask.sum(1).tolist())) == 3  # three lengths: padded
    cfg, weights = hf_numpy.load_folder(folder)
    want = hf_numpy.sentence_embeddings(cfg, weights, batch.input_ids, batch.attention_mask, pooling or "mean",
                                        normalize)
    np.testing.assert_allclose(model.reference_embeddings(SENTENCES), want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert model.pooling.mode == (pooling or "mean") and model.pooling.normalize == normalize
    if pooling is None:
        assert model.pooling.source.startswith("default: the folder has no sentence-transformers modules.json")
    else:
        assert model.pooling.source == "modules.json, 1_Pooling/config.json"


def test_tokenizer_of_each_family(hf_folder):
    bert = eggfuse.load_model(hf_folder(_name(CASES[0]), "encoder", "bert"))
    batch = bert.tokenize(["Hi", "A man is eating food."])
    tok = bert.tokenizer
    assert tok.id_to_token(int(batch.input_ids[0, 0])) == "[CLS]" and batch.input_ids.shape[1] < 128  # not padded
    assert batch.input_ids[0, -1] == tok.token_to_id("[PAD]") and bert.max_length == 48  # sentence_bert_config.json
    roberta = eggfuse.load_model(hf_folder(_name(CASES[3]), "encoder", "roberta", prefix="roberta."))
    batch = roberta.tokenize(["Hi", "A man is eating food."])
    assert [roberta.tokenizer.id_to_token(int(i)) for i in (batch.input_ids[0, 0], batch.input_ids[0, -1])] == [
        "<s>", "<pad>"]
    assert roberta.pad_id == 1 and roberta.config.position_offset == 2
    f = roberta.graph_for(["Hi", "A man is eating food."])[1]
    n = int(batch.attention_mask[0].sum())
    # RoBERTa's positions start at padding_idx + 1; padding gets padding_idx
    assert f["position_ids"][:batch.seq].tolist() == [*range(2, 2 + n), *[1] * (batch.seq - n)]


def test_sentence_transformers_folder_with_a_transformer_subfolder(hf_folder, tmp_path):
    src = hf_folder(_name(CASES[0]), "encoder", "bert")
    root = tmp_path / "st"
    shutil.copytree(src, root / "0_Transformer")
    for name in ("modules.json", "1_Pooling", "sentence_bert_config.json"):
        shutil.move(root / "0_Transformer" / name, root / name)
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    model = eggfuse.load_model(root)
    np.testing.assert_allclose(model.reference_embeddings(SENTENCES),
                               eggfuse.load_model(src).reference_embeddings(SENTENCES), rtol=0, atol=1e-12)


def test_the_shipped_minilm_folder():
    folder = minilm.find_model_dir()
    model = eggfuse.load_model(folder)
    assert model.pooling == Pooling("mean", True, "modules.json, 1_Pooling/config.json") and model.max_length == 256
    batch = model.tokenize(SENTENCES)
    cfg, weights = hf_numpy.load_folder(folder)
    want = hf_numpy.sentence_embeddings(cfg, weights, batch.input_ids, batch.attention_mask)
    np.testing.assert_allclose(model.reference_embeddings(SENTENCES), want, rtol=0, atol=1e-5)


# --- errors --------------------------------------------------------------------------------------


def test_a_user_folder_without_weights_names_the_file_not_the_package(hf_folder, tmp_path):
    folder = tmp_path / "bert"
    shutil.copytree(hf_folder(_name(CASES[0]), "encoder", "bert"), folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=rf"{folder}: missing model\.safetensors$") as err:
        eggfuse.load_model(folder)
    assert "pip install" not in str(err.value)


@pytest.mark.parametrize("generation, message", [
    (4, r"pooling_mode_max_tokens \(max pooling\) is not supported; supported: mean, cls"),
    (5, r"pooling_mode \(max pooling\) is not supported; supported: mean, cls"),
])
def test_max_pooling_is_refused(tmp_path, generation, message):
    folder = hf_folders.encoder_folder(tmp_path / "m", "bert", pooling="max", generation=generation)
    with pytest.raises(ModelError, match=message):
        eggfuse.load_model(folder)


def test_unsupported_modules_and_pooling_combinations(tmp_path):
    folder = hf_folders.encoder_folder(tmp_path / "m", "bert")
    cfg = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({**cfg, "pooling_mode_cls_token": True}))
    with pytest.raises(ModelError, match=r"pooling modes \['mean', 'cls'\] are not supported"):
        eggfuse.load_model(folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["mean", "lasttoken"]}))
    with pytest.raises(ModelError, match=r"pooling modes \['mean', 'lasttoken'\] are not supported"):
        eggfuse.load_model(folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelError, match=r"module 'sentence_transformers.models.Dense' \(2_Dense\) is not supported"):
        eggfuse.load_model(folder)
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(ModelError, match="no Pooling module"):
        eggfuse.load_model(folder)
    # the Pooling module's folder gone: sentence-transformers cannot load it; it was taken as mean pooling, with
    # the missing file named as the source
    (folder / "modules.json").write_text(json.dumps([m for m in modules if m["path"] != "2_Dense"]))
    shutil.rmtree(folder / "1_Pooling")
    with pytest.raises(ModelError, match=re.escape(f"{folder / '1_Pooling' / 'config.json'}: missing, though "
                                                   "modules.json names a Pooling module at 1_Pooling")):
        eggfuse.load_model(folder)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported"),
    ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
    ({"model_type": "distilbert"}, "model_type 'distilbert' is not supported"),
])
def test_config_errors(tmp_path, changes, message):
    folder = hf_folders.encoder_folder(tmp_path / "m", "roberta")
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(ModelError, match=message):
        eggfuse.load_model(folder)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = hf_folders.encoder_folder(tmp_path / "m", "roberta", prefix="roberta.")
    w = load_file(str(folder / "model.safetensors"))
    del w["roberta.encoder.layer.1.output.dense.bias"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=r"lack tensor 'encoder\.layer\.1\.output\.dense\.bias' f32\[32\]"):
        eggfuse.load_model(folder)
    # stored as integers it is named so (load_safetensors leaves integer buffers out; it read as missing)
    w["roberta.encoder.layer.1.output.dense.bias"] = np.arange(32, dtype=np.int16)
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=re.escape(
            f"{folder / 'model.safetensors'}: tensor 'encoder.layer.1.output.dense.bias' is stored as int16")):
        eggfuse.load_model(folder)
    w["roberta.encoder.layer.1.output.dense.bias"] = np.full(32, np.nan, np.float32)  # damaged: named at load time
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=re.escape(
            f"{folder / 'model.safetensors'}: tensor 'encoder.layer.1.output.dense.bias' holds NaN or infinity "
            "(32 of 32 elements)")):
        eggfuse.load_model(folder)


# --- malformed files: a ModelError naming the file, the key and the value ------------------------


def _copy(hf_folder, tmp_path, **options):
    """A fresh copy of a session-wide BERT folder, to edit."""
    folder = tmp_path / "m"
    shutil.copytree(hf_folder("bert-malformed", "encoder", "bert", **options), folder)
    return folder


def _write(folder, name, document):
    (folder / name).write_text(json.dumps(document))


def _edit(folder, name, **changes):
    _write(folder, name, {**json.loads((folder / name).read_text()), **changes})


@pytest.mark.parametrize("key, value, expected", [
    ("num_hidden_layers", -1, "an integer >= 1"),
    ("num_hidden_layers", 0, "an integer >= 1"),
    ("num_hidden_layers", 2.0, "an integer >= 1"),
    ("num_hidden_layers", "2", "an integer >= 1"),
    ("num_hidden_layers", True, "an integer >= 1"),
    ("num_attention_heads", 0, "an integer >= 1"),
    ("hidden_size", -32, "an integer >= 1"),
    ("intermediate_size", 0, "an integer >= 1"),
    ("vocab_size", 0, "an integer >= 1"),
    ("max_position_embeddings", 0, "an integer >= 1"),
    ("type_vocab_size", 0, "an integer >= 1"),
    ("layer_norm_eps", 0, "a positive finite number"),
    ("layer_norm_eps", -1e-12, "a positive finite number"),
    ("layer_norm_eps", "1e-12", "a positive finite number"),
    ("pad_token_id", -1, "an integer >= 0"),
])
def test_malformed_config_values_are_named(hf_folder, tmp_path, key, value, expected):
    hf_checks.check_config_value_refused(_copy(hf_folder, tmp_path), key, value, expected)


def test_config_values_checked_against_each_other(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    _edit(folder, "config.json", pad_token_id=5000)  # the folder's vocabulary is smaller
    with pytest.raises(ModelError, match=r"config\.json: pad_token_id must be an id below vocab_size \d+, got 5000"):
        eggfuse.load_model(folder)
    roberta = tmp_path / "roberta"
    shutil.copytree(hf_folder("roberta-malformed", "encoder", "roberta"), roberta)
    # RoBERTa's positions start at pad_token_id + 1 = 2: three positions hold one, not [CLS] and [SEP]
    _edit(roberta, "config.json", max_position_embeddings=3)
    with pytest.raises(ModelError, match=r"config\.json: max_position_embeddings must be at least 4, to hold \[CLS\] "
                                         r"and \[SEP\] \(RoBERTa's positions start at pad_token_id \+ 1 = 2\), got 3"):
        eggfuse.load_model(roberta)


def test_the_shipped_minilm_folder_with_no_layers_is_refused(tmp_path):
    # all-MiniLM-L6-v2 with num_hidden_layers -1 used to run as an encoder of no layers
    shipped = minilm.find_model_dir()
    folder = tmp_path / "minilm"
    shutil.copytree(shipped, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "model.safetensors").symlink_to(shipped / "model.safetensors")
    for layers in (-1, 0):
        _edit(folder, "config.json", num_hidden_layers=layers)
        with pytest.raises(ModelError, match=rf"config\.json: num_hidden_layers must be an integer >= 1, got {layers}"):
            eggfuse.embed(["hello world"], model=folder, cache=False)


@pytest.mark.parametrize("name, document, message", [
    ("modules.json", ["sentence_transformers.models.Transformer"],
     r"modules\.json: entry 0 must be a module object .*, got 'sentence_transformers\.models\.Transformer'"),
    ("modules.json", {"0": "Transformer"}, r"modules\.json: must hold a JSON array of module objects .*, got a JSON "
                                           "object"),
    ("modules.json", [{"type": "sentence_transformers.models.Pooling", "path": 1}],
     r"modules\.json: entry 0: path must be a string, got 1"),
    ("1_Pooling/config.json", [], r"1_Pooling/config\.json: must hold a JSON object .*, got a JSON array"),
    ("1_Pooling/config.json", {"pooling_mode": 3}, r"1_Pooling/config\.json: pooling_mode must be a mode's name .*, "
                                                   r"got 3"),
    ("1_Pooling/config.json", {"pooling_mode": [["mean"]]},
     r"pooling_mode must be a mode's name .*, got \[\['mean'\]\]"),
    ("sentence_bert_config.json", [], r"sentence_bert_config\.json: must hold a JSON object .*, got a JSON array"),
    ("sentence_bert_config.json", {"max_seq_length": "256"}, r"sentence_bert_config\.json: max_seq_length must be an "
                                                             r"integer >= 2, got '256'"),
    ("sentence_bert_config.json", {"max_seq_length": 1}, r"max_seq_length must be an integer >= 2, got 1"),
    ("tokenizer_config.json", [], r"tokenizer_config\.json: must hold a JSON object .*, got a JSON array"),
    ("tokenizer_config.json", {"pad_token": 0}, r"tokenizer_config\.json: pad_token must be the token's text .*, "
                                                r"got 0"),
    ("config.json", [], r"config\.json: must hold a JSON object .*, got a JSON array"),
])
def test_malformed_side_files_are_named(hf_folder, tmp_path, name, document, message):
    folder = _copy(hf_folder, tmp_path)
    _write(folder, name, document)
    with pytest.raises(ModelError, match=message) as err:
        eggfuse.load_model(folder)
    assert str(folder / name) in str(err.value)


def test_a_malformed_model_max_length_is_named(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    (folder / "sentence_bert_config.json").unlink()  # the tokenizer's limit is read only without it
    for value in ("128", 1):
        _edit(folder, "tokenizer_config.json", model_max_length=value)
        with pytest.raises(ModelError, match=rf"tokenizer_config\.json: model_max_length must be .*, got {value!r}"):
            eggfuse.load_model(folder)
    _edit(folder, "tokenizer_config.json", model_max_length=1e30)  # transformers' "no limit"
    assert eggfuse.load_model(folder).max_length == 64  # the position table's


@pytest.mark.parametrize("document, message", [
    ([], r"must hold a JSON object .*, got a JSON array"),
    ({"weight_map": {"embeddings.word_embeddings.weight": 1}},
     r"weight_map\['embeddings\.word_embeddings\.weight'\] must be a shard's file name, got 1"),
])
def test_a_malformed_shard_index_is_named(hf_folder, tmp_path, document, message):
    folder = tmp_path / "sharded"
    shutil.copytree(hf_folder("bert-sharded", "encoder", "bert", shards=2), folder)
    _write(folder, "model.safetensors.index.json", document)
    with pytest.raises(ModelError, match=re.escape(f"{folder / 'model.safetensors.index.json'}: ") + message):
        eggfuse.load_model(folder)
