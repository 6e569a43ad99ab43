"""Hugging Face decoder folders (tests/hf_folders.py) through eggfuse.load_model, on the numpy
reference interpreter, against the independent oracle tests/hf_numpy.py: no GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import hf_checks  # tests/: the config check both families share
import hf_folders  # tests/: the folder writer and the oracle (pytest pythonpath)
import hf_numpy
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import eggfuse
from eggfuse.ir import InputError, ModelError
from eggfuse.models.causal_lm import CausalLM
from eggfuse.models.llama import PROJECTIONS

PROMPT = "The capital of France is Paris. The quick brown fox jumps"
DECODERS = [(mt, gen) for mt in hf_folders.DECODER_TYPES for gen in (4, 5)]


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def check_against_oracle(folder, prompt: str = PROMPT) -> CausalLM:
    model = eggfuse.load_model(folder)
    ids = model.encode(prompt)
    cfg, weights = hf_numpy.load_folder(folder)
    assert relative_error(model.reference_logits(ids), hf_numpy.causal_lm_logits(cfg, weights, ids)) < 1e-9
    return model


@pytest.mark.parametrize("model_type, generation", DECODERS, ids=[f"{m}-tf{g}" for m, g in DECODERS])
def test_logits_match_the_oracle(hf_folder, model_type, generation):
    model = check_against_oracle(hf_folder(f"{model_type}{generation}", "decoder", model_type, generation=generation))
    assert isinstance(model, CausalLM) and model.kind == model_type and model.dtype == "float32"


@pytest.mark.parametrize("model_type", hf_folders.DECODER_TYPES)
def test_both_config_generations_give_one_config(hf_folder, model_type):
    old, new = (eggfuse.load_model(hf_folder(f"{model_type}{g}", "decoder", model_type, generation=g)).config
                for g in (4, 5))
    assert old == new


def test_what_each_model_type_sets(hf_folder):
    cfg = {mt: eggfuse.load_model(hf_folder(f"{mt}4", "decoder", mt, generation=4)).config
           for mt in hf_folders.DECODER_TYPES}
    assert cfg["qwen2"].biases == {"attn_q", "attn_k", "attn_v"} and not cfg["llama"].biases
    qwen3 = cfg["qwen3"]
    assert qwen3.qk_norm and (qwen3.num_heads, qwen3.head_dim, qwen3.hidden_size) == (4, 16, 32)
    assert cfg["smollm3"].rope_layers == (True, True, True, False) and cfg["llama"].rope_layers is None
    assert cfg["mistral"].sliding_window == 4096 and cfg["mistral"].max_seq == 128  # the window is past the context
    assert (cfg["llama"].num_heads, cfg["llama"].num_kv_heads) == (4, 2)  # GQA
    assert cfg["llama"].tied_embeddings and not cfg["mistral"].tied_embeddings
    assert (cfg["qwen2"].rope_theta, cfg["smollm3"].rope_theta) == (1e6, 5e6)


def test_untied_head_and_a_stored_head_of_tied_embeddings(hf_folder, tmp_path):
    untied = check_against_oracle(hf_folder("llama-untied", "decoder", "llama", tied=False))
    assert not untied.config.tied_embeddings and "output.weight" in untied.params
    # tied: transformers ties lm_head to the embedding even if the file stores one, and so do we
    folder = hf_folders.decoder_folder(tmp_path / "tied", "llama")
    w = load_file(str(folder / "model.safetensors"))
    save_file({**w, "lm_head.weight": np.ones_like(w["model.embed_tokens.weight"])}, str(folder / "model.safetensors"))
    tied = eggfuse.load_model(folder)
    assert "output.weight" not in tied.params
    ids = tied.encode(PROMPT)
    cfg, weights = hf_numpy.load_folder(folder)
    assert relative_error(tied.reference_logits(ids), hf_numpy.causal_lm_logits(cfg, weights, ids)) < 1e-9


def test_attention_and_mlp_biases(hf_folder):
    model = check_against_oracle(hf_folder("llama-bias", "decoder", "llama", attention_bias=True, mlp_bias=True))
    assert model.config.biases == set(PROJECTIONS)
    assert {f"blk.1.{p}.bias" for p in PROJECTIONS} <= model.params.keys()


@pytest.mark.parametrize("generation, params", [
    (4, {"type": "linear", "factor": 4.0}),                 # transformers 4: rope_scaling, old key "type"
    (4, {**hf_folders.LLAMA3_SCALING}),
    (5, {"rope_type": "linear", "factor": 2.0}),            # transformers 5: inside rope_parameters
    (5, {**hf_folders.LLAMA3_SCALING}),
], ids=["tf4-linear", "tf4-llama3", "tf5-linear", "tf5-llama3"])
def test_rope_scaling(hf_folder, generation, params):
    name = f"llama-rope-{generation}-{params.get('rope_type', params.get('type'))}"
    model = check_against_oracle(hf_folder(name, "decoder", "llama", generation=generation, rope_scaling=params),
                                 PROMPT * 2)
    assert model.config.rope_scaling[0] == params.get("rope_type", params.get("type"))
    ids = model.encode(PROMPT * 2)
    plain = CausalLM(dataclasses.replace(model.config, rope_scaling=None), model.params, model.tokenizer,
                     bos_id=None, eos_ids=[])
    assert relative_error(plain.reference_logits(ids), model.reference_logits(ids)) > 1e-3  # the scaling matters


def test_sharded_checkpoint(hf_folder):
    one = eggfuse.load_model(hf_folder("qwen2-4", "decoder", "qwen2", generation=4))
    folder = hf_folder("qwen2-sharded", "decoder", "qwen2", shards=3)
    assert not (folder / "model.safetensors").exists() and (folder / "model-00003-of-00003.safetensors").is_file()
    sharded = check_against_oracle(folder)
    assert sharded.params.keys() == one.params.keys()
    assert all(np.array_equal(sharded.params[k], one.params[k]) for k in one.params)


def test_half_precision_weights(hf_folder):
    model = check_against_oracle(hf_folder("qwen3-bf16", "decoder", "qwen3", generation=5, dtype="bfloat16"))
    assert model.dtype == "bfloat16" and model.params["token_embd.weight"].dtype == np.float32
    assert np.unique(model.params["token_embd.weight"].view(np.uint32) & 0xFFFF).tolist() == [0]  # bf16 values
    half = check_against_oracle(hf_folder("llama-fp16", "decoder", "llama", dtype="float16"))
    assert half.dtype == "float16" and np.array_equal(half.params["token_embd.weight"].astype(np.float16),
                                                      half.params["token_embd.weight"])


def test_sliding_window_bounds_the_context(hf_folder):
    mistral = check_against_oracle(hf_folder("mistral-window", "decoder", "mistral", sliding_window=16), "Hello there")
    assert (mistral.config.sliding_window, mistral.config.max_seq) == (16, 16)
    with pytest.raises(InputError, match="more than max_seq 16 .*sliding_window"):
        mistral.encode(PROMPT * 3)
    with pytest.raises(InputError, match="max_seq must lie in .*sliding_window"):
        eggfuse.Generator(mistral, max_seq=32)
    # Qwen: only with use_sliding_window, and only from layer max_window_layers on
    qwen = eggfuse.load_model(hf_folder("qwen2-window", "decoder", "qwen2", use_sliding_window=True,
                                        sliding_window=16, max_window_layers=1))
    assert qwen.config.max_seq == 16
    unused = eggfuse.load_model(hf_folder("qwen2-4", "decoder", "qwen2", generation=4))
    assert unused.config.sliding_window is None and unused.config.max_seq == 128


# --- tokenizer, chat template, special tokens --------------------------------------------------


def test_bos_as_the_post_processor_adds_it(hf_folder):
    for mt, bos in (("llama", "<|begin_of_text|>"), ("mistral", "<s>")):
        model = eggfuse.load_model(hf_folder(f"{mt}4", "decoder", mt, generation=4))
        ids = model.encode("Hello")
        assert model.tokenizer.id_to_token(int(ids[0])) == bos and model.bos_id == ids[0]
        assert model.tokenizer.id_to_token(int(model.encode("Hello", special_tokens=False)[0])) != bos
    qwen = eggfuse.load_model(hf_folder("qwen24", "decoder", "qwen2", generation=4))
    assert qwen.encode("Hello").tolist() == qwen.encode("Hello", special_tokens=False).tolist()
    assert qwen.bos_id is None


@pytest.mark.parametrize("model_type, generation", DECODERS, ids=[f"{m}-tf{g}" for m, g in DECODERS])
def test_chat_template_rendered_as_transformers_does(hf_folder, model_type, generation):
    folder = hf_folder(f"{model_type}{generation}", "decoder", model_type, generation=generation)
    model = eggfuse.load_model(folder)
    assert (folder / "chat_template.jinja").is_file() == (generation == 5)
    text = model.chat_prompt("Hi there")
    assert text == hf_folders.CHAT_RENDERED[model_type]
    ids = model.encode(text, special_tokens=False)
    if model.bos_id is not None:  # the template wrote the BOS; encoding must not add a second one
        assert ids.tolist().count(model.bos_id) == 1 and ids[0] == model.bos_id


def test_chat_template_errors(hf_folder, tmp_path):
    mistral = eggfuse.load_model(hf_folder("mistral4", "decoder", "mistral", generation=4))
    with pytest.raises(InputError, match="roles must alternate"):  # the template's raise_exception
        mistral.chat_prompt("Hi", system="Be brief.")
    bare = eggfuse.load_model(hf_folders.decoder_folder(tmp_path / "nochat", "llama", chat=False))
    with pytest.raises(ModelError, match="no chat template"):
        bare.chat_prompt("Hi")
    broken = hf_folders.decoder_folder(tmp_path / "broken", "qwen2", generation=5)
    (broken / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ModelError, match="chat_template.jinja: the chat template does not compile"):
        eggfuse.load_model(broken)


def test_chat_template_jinja_file_wins_over_tokenizer_config(tmp_path):
    folder = hf_folders.decoder_folder(tmp_path / "both", "qwen2", generation=4)
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] | upper }}")
    assert eggfuse.load_model(folder).chat_prompt("hi") == "HI"


def test_end_of_sequence_ids(hf_folder):
    qwen = eggfuse.load_model(hf_folder("qwen24", "decoder", "qwen2", generation=4))
    tok = qwen.tokenizer
    # config.json's eos (<|im_end|>) and generation_config.json's second one (<|endoftext|>)
    assert [tok.id_to_token(i) for i in qwen.eos_ids] == ["<|im_end|>", "<|endoftext|>"]
    llama = eggfuse.load_model(hf_folder("llama4", "decoder", "llama", generation=4))
    assert [llama.tokenizer.id_to_token(i) for i in llama.eos_ids] == ["<|eot_id|>"]


# --- errors --------------------------------------------------------------------------------------


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gpt2"}, r"model_type 'gpt2' is not supported; supported: llama, mistral"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_type 'yarn' \(rope_scaling\) is not supported"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_type 'dynamic' \(rope_scaling\) is not supported"),
    ({"rope_scaling": {"rope_type": "linear"}}, r"rope_scaling of rope_type 'linear' lacks 'factor'"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"num_key_value_heads": 3}, "a multiple of num_key_value_heads 3"),
    ({"hidden_size": None}, "lacks 'hidden_size'"),
    ({"torch_dtype": "int8"}, "dtype 'int8' is not supported"),
    ({"quantization_config": {"quant_method": "awq"}}, r"quantized checkpoints .*'awq'"),
])
def test_config_errors_name_the_setting(tmp_path, changes, message):
    folder = hf_folders.decoder_folder(tmp_path / "m", "llama")
    _edit_config(folder, **changes)
    with pytest.raises(ModelError, match=message) as err:
        eggfuse.load_model(folder)
    assert str(folder) in str(err.value)


def test_missing_files_and_tensors_are_named(tmp_path):
    folder = hf_folders.decoder_folder(tmp_path / "m", "qwen2")
    w = load_file(str(folder / "model.safetensors"))
    del w["model.layers.1.self_attn.q_proj.bias"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=r"lack tensor model\.layers\.1\.self_attn\.q_proj\.bias \(parameter "
                                         r"blk\.1\.attn_q\.bias\) f32\[32\]"):
        eggfuse.load_model(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match=rf"{folder}: missing model\.safetensors .*pytorch_model\.bin only"):
        eggfuse.load_model(folder)
    sharded = hf_folders.decoder_folder(tmp_path / "s", "llama", shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match=r"missing weight shard\(s\) model-00002-of-00002\.safetensors"):
        eggfuse.load_model(sharded)
    with pytest.raises(ModelError, match="not a Hugging Face model folder: no config.json"):
        eggfuse.load_model(tmp_path)
    with pytest.raises(ModelError, match="no such file or folder"):
        eggfuse.load_model(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelError, match="not a model"):
        eggfuse.load_model(tmp_path / "notes.txt")
    for not_a_path in (None, 3, b"folder"):  # pathlib's raw TypeError before
        with pytest.raises(InputError, match=rf"load_model takes a path .*got {re.escape(repr(not_a_path))} "):
            eggfuse.load_model(not_a_path)


def _as_int32(a):
    return a.astype(np.int32)


def _one_infinity(a):
    a = a.copy()
    a.flat[0] = np.inf
    return a


@pytest.mark.parametrize("tensor, damage, says", [
    # load_safetensors leaves out integer tensors (buffers such as position_ids): such a weight read as missing
    ("model.norm.weight", _as_int32,
     "tensor 'model.norm.weight' is stored as int32; eggfuse reads weights stored as floats (f32, f16 or bf16): save "
     "it as one"),
    # refused only when a session was made, under the graph's GGUF-style name (blk.0.ffn_up.weight)
    ("model.layers.0.mlp.up_proj.weight", _one_infinity,
     "tensor 'model.layers.0.mlp.up_proj.weight' holds NaN or infinity (1 of "),
], ids=["integers", "infinity"])
def test_a_damaged_weight_is_named_with_its_file_at_load_time(tmp_path, tensor, damage, says):
    folder = hf_folders.decoder_folder(tmp_path / "m", "llama")
    w = load_file(str(folder / "model.safetensors"))
    w[tensor] = damage(w[tensor])
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=re.escape(f"{folder / 'model.safetensors'}: {says}")):
        eggfuse.load_model(folder)


def test_lfs_pointer_instead_of_weights(tmp_path):
    folder = hf_folders.decoder_folder(tmp_path / "m", "mistral")
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\n")
    with pytest.raises(ModelError, match="Git LFS pointer"):
        eggfuse.load_model(folder)


def test_an_encoder_is_refused_by_generate_and_a_decoder_by_embed(hf_folder):
    with pytest.raises(InputError, match=r"is an encoder \(bert SentenceEncoder\), not a decoder: use embed"):
        eggfuse.generate("hi", model=hf_folder("bert", "encoder", "bert"))
    with pytest.raises(InputError, match=r"is a decoder \(llama CausalLM\), not an encoder: use generate"):
        eggfuse.embed(["hi"], model=hf_folder("llama4", "decoder", "llama", generation=4))


# --- malformed values: a ModelError naming the file, the key and the value ------------------------


def _copy(hf_folder, tmp_path, model_type="llama", **options):
    """A fresh copy of a session-wide decoder folder, to edit."""
    folder = tmp_path / "m"
    shutil.copytree(hf_folder(f"{model_type}-malformed", "decoder", model_type, **options), folder)
    return folder


def _edit(folder, name, **changes):
    path = folder / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("key, value, expected", [
    ("num_hidden_layers", -1, "an integer >= 1"),    # was a GraphError naming no file
    ("num_hidden_layers", 0, "an integer >= 1"),
    ("num_attention_heads", 0, "an integer >= 1"),
    ("max_position_embeddings", 0, "an integer >= 1"),
    ("num_key_value_heads", 0, "an integer >= 1"),
    ("head_dim", 0, "an integer >= 1"),
    ("hidden_size", "32", "an integer >= 1"),
    ("intermediate_size", 64.0, "an integer >= 1"),
    ("vocab_size", False, "an integer >= 1"),
    ("rope_theta", "abc", "a positive finite number"),  # was a ValueError
    ("rope_theta", -1.0, "a positive finite number"),
    ("rms_norm_eps", 0, "a positive finite number"),
    ("tie_word_embeddings", "false", "true or false"),   # was read as true
    ("attention_bias", 1, "true or false"),
])
def test_malformed_config_values_are_named(hf_folder, tmp_path, key, value, expected):
    hf_checks.check_config_value_refused(_copy(hf_folder, tmp_path), key, value, expected)


@pytest.mark.parametrize("model_type, generation, changes, message", [
    ("llama", 4, {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
     r"rope_scaling\.factor must be a positive finite number, got '2'"),
    ("llama", 5, {"rope_parameters": {"rope_type": "default", "rope_theta": None}, "rope_theta": "1e4"},
     r"rope_theta must be a positive finite number, got '1e4'"),
    ("llama", 5, {"rope_parameters": {**hf_folders.LLAMA3_SCALING, "original_max_position_embeddings": 64.5}},
     r"rope_parameters\.original_max_position_embeddings must be an integer >= 1, got 64\.5"),
    ("llama", 4, {"rope_scaling": {"rope_type": ["linear"], "factor": 2.0}},
     r"RoPE scaling rope_type \['linear'\] \(rope_scaling\) is not supported"),
    ("llama", 4, {"partial_rotary_factor": "half"}, r"partial_rotary_factor must be a positive finite number"),
    ("llama", 4, {"hidden_size": 2, "head_dim": None}, r"head_dim would be hidden_size 2 // num_attention_heads 4 = 0"),
    ("smollm3", 4, {"no_rope_layers": ["yes", 1, 1, 0]}, r"no_rope_layers must be a list of flags, 1 or 0"),
    ("qwen2", 4, {"use_sliding_window": "true"}, r"use_sliding_window must be true or false, got 'true'"),
    ("qwen2", 4, {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": -1},
     r"max_window_layers must be an integer >= 0, got -1"),
    ("qwen2", 5, {"use_sliding_window": True, "sliding_window": 16, "layer_types": "sliding_attention"},
     r"layer_types must be a list of attention types"),
    ("mistral", 4, {"sliding_window": 0}, r"sliding_window must be an integer >= 1, got 0"),
])
def test_malformed_nested_and_family_values_are_named(tmp_path, model_type, generation, changes, message):
    folder = hf_folders.decoder_folder(tmp_path / "m", model_type, generation=generation)
    _edit(folder, "config.json", **changes)
    with pytest.raises(ModelError, match=re.escape(f"{folder / 'config.json'}: ") + message):
        eggfuse.load_model(folder)


@pytest.mark.parametrize("name, value", [
    ("config.json", 4.7),            # was truncated to 4
    ("config.json", "</s>"),
    ("config.json", True),
    ("config.json", [4, [5]]),
    ("config.json", -1),
    ("config.json", 10**6),          # past the vocabulary: no token could end the text
    ("generation_config.json", 4.7),
    ("generation_config.json", "x"),
    ("generation_config.json", [4, 5.5]),
])
def test_malformed_end_of_sequence_ids_are_named(hf_folder, tmp_path, name, value):
    folder = _copy(hf_folder, tmp_path)
    _edit(folder, name, eos_token_id=value)
    with pytest.raises(ModelError) as err:
        eggfuse.load_model(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert str(err.value) == (f"{folder / name}: eos_token_id must be a token id (an integer in [0, vocab_size "
                              f"{vocab})) or a list of them, got {value!r}; correct it in the file")


def test_end_of_sequence_ids_as_lists_of_ints(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    tok = eggfuse.load_model(folder).tokenizer
    _edit(folder, "config.json", eos_token_id=[tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")])
    _edit(folder, "generation_config.json", eos_token_id=[tok.token_to_id("<|start_header_id|>")])
    model = eggfuse.load_model(folder)
    assert [tok.id_to_token(i) for i in model.eos_ids] == ["<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>"]
    _edit(folder, "config.json", bos_token_id="<|begin_of_text|>")
    with pytest.raises(ModelError, match=r"config\.json: bos_token_id must be a token id"):
        eggfuse.load_model(folder)


@pytest.mark.parametrize("name, document, message", [
    ("generation_config.json", [], r"must hold a JSON object .*, got a JSON array"),
    ("tokenizer_config.json", [], r"must hold a JSON object .*, got a JSON array"),
    ("tokenizer_config.json", {"eos_token": 4.7}, r"eos_token must be the token's text .*, got 4\.7"),
    ("tokenizer_config.json", {"bos_token": {"content": 0}}, r"bos_token must be the token's text .*, "
                                                             r"got \{'content': 0\}"),
    ("tokenizer_config.json", {"chat_template": 5}, r"chat_template must be a string .*, got 5"),
    ("tokenizer_config.json", {"chat_template": [{"name": "default", "template": None}]},
     r"chat_template's 'default' template must be a string"),
    ("tokenizer_config.json", {"chat_template": [{"template": "x"}, {"name": "tool_use", "template": "y"}]},
     r"chat_template lists templates \['None', 'tool_use'\] but none named 'default'"),
])
def test_malformed_side_files_are_named(hf_folder, tmp_path, name, document, message):
    folder = _copy(hf_folder, tmp_path)
    (folder / name).write_text(json.dumps(document))
    with pytest.raises(ModelError, match=re.escape(f"{folder / name}: ") + message):
        eggfuse.load_model(folder)
