"""Hugging Face model folders (tests/hf_folders.py) compiled and run on the GPU (lavapipe without
one), against the independent numpy oracle tests/hf_numpy.py; the --model options of the CLI."""

from __future__ import annotations

import json
import shutil

import hf_folders  # tests/: the folder writer and the oracle (pytest pythonpath)
import hf_numpy
import numpy as np
import pytest

import eggfuse
from eggfuse import cli
from eggfuse.models import gguf

PROMPT = "The capital of France is Paris. The quick brown fox"
SENTENCES = ["A man is eating food.", "Hi", "The weather is lovely today."]
#: (folder name, model_type, options): every decoder model_type; RoPE scaling, an untied head, bf16
DECODERS = [
    ("llama4", "llama", {"generation": 4}),
    ("llama-llama3-untied", "llama", {"generation": 5, "tied": False, "rope_scaling": hf_folders.LLAMA3_SCALING}),
    ("mistral4", "mistral", {"generation": 4}),
    ("qwen24", "qwen2", {"generation": 4}),
    ("qwen35", "qwen3", {"generation": 5}),
    ("qwen3-bf16", "qwen3", {"generation": 5, "dtype": "bfloat16"}),
    ("smollm35", "smollm3", {"generation": 5}),
]
ENCODERS = [("bert", "bert", {}), ("roberta-cls", "roberta", {"pooling": "cls", "prefix": "roberta."}),
            ("xlm-roberta-default", "xlm-roberta", {"pooling": None})]


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name, model_type, options", DECODERS, ids=[d[0] for d in DECODERS])
def test_decoder_logits_and_greedy_tokens_match_the_oracle(hf_folder, name, model_type, options):
    folder = hf_folder(name, "decoder", model_type, **options)
    model = eggfuse.load_model(folder)
    gen = eggfuse.Generator(model, max_seq=48)
    ids = model.encode(PROMPT)
    cfg, weights = hf_numpy.load_folder(folder)
    err = relative_error(gen.prefill(ids, last_logits=False), hf_numpy.causal_lm_logits(cfg, weights, ids))
    result = gen.generate(ids, 5, stop_at_eos=False)
    want = hf_numpy.greedy(cfg, weights, ids, 5)
    # the decode plan (KV cache) step by step, each step's logits against the oracle's on the whole sequence
    seq = [*ids.tolist(), *want]
    gen.prefill(ids)
    step_err = max(relative_error(gen.step(seq[pos], pos), hf_numpy.causal_lm_logits(cfg, weights, seq[:pos + 1])[-1])
                   for pos in range(ids.size, len(seq)))
    print(f"{name}: prefill logits relative error {err:.1e}, decode steps {step_err:.1e}; greedy "
          f"{result.generated_ids}; dispatches per decode step {result.dispatches_per_decode_step_unfused} -> "
          f"{result.dispatches_per_decode_step}")
    assert err < 1e-4 and step_err < 1e-4
    assert result.generated_ids == want
    assert result.dispatches_per_decode_step < result.dispatches_per_decode_step_unfused


def test_generate_api_with_a_folder_and_its_chat_template(hf_folder):
    folder = hf_folder("qwen24", "decoder", "qwen2", generation=4)
    result = eggfuse.generate("Hi there", 3, chat=True, model=str(folder), max_seq=128)
    model = eggfuse.load_model(folder)
    assert result.prompt == hf_folders.CHAT_RENDERED["qwen2"] and result.model == str(folder)
    assert result.prompt_ids == model.encode(result.prompt, special_tokens=False).tolist()
    cfg, weights = hf_numpy.load_folder(folder)
    assert result.generated_ids == hf_numpy.greedy(cfg, weights, result.prompt_ids, len(result.generated_ids))
    again = eggfuse.generate("Hi there", 3, chat=True, model=model, max_seq=128)  # a loaded model works too
    assert again.generated_ids == result.generated_ids


@pytest.mark.parametrize("name, model_type, options", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_embeddings_match_the_oracle(hf_folder, name, model_type, options):
    folder = hf_folder(name, "encoder", model_type, **options)
    result = eggfuse.embed(SENTENCES, model=folder)
    model = eggfuse.load_model(folder)
    batch = model.tokenize(SENTENCES)
    cfg, weights = hf_numpy.load_folder(folder)
    mode = options.get("pooling", "mean") or "mean"
    want = hf_numpy.sentence_embeddings(cfg, weights, batch.input_ids, batch.attention_mask, mode)
    assert result.embeddings.shape == (3, hf_folders.HIDDEN) and result.model == str(folder)
    assert np.abs(result.embeddings - want).max() < 1e-4 * np.abs(want).max()
    assert result.pooling["mode"] == mode and result.dispatches_fused < result.dispatches_unfused


# --- the command line ----------------------------------------------------------------------------


def test_cli_embed_with_a_model_folder(hf_folder, capsys):
    folder = hf_folder("xlm-roberta-default", "encoder", "xlm-roberta", pooling=None)
    assert cli.main(["embed", "--model", str(folder), "--json", *SENTENCES]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("sentences", "embeddings", "similarity", "adapter", "dispatches_unfused", "dispatches_fused",
                "report", "timings", "model", "pooling"):
        assert key in out
    assert out["pooling"] == {"mode": "mean", "normalize": True,
                              "source": "default: the folder has no sentence-transformers modules.json"}
    assert cli.main(["embed", "--model", str(folder), *SENTENCES[:2]]) == 0
    text = capsys.readouterr().out
    assert f"model: {folder}\n" in text
    assert "pooling: mean, L2-normalised (default: the folder has no sentence-transformers modules.json)" in text


def test_cli_embed_default_model_says_its_pooling(capsys):
    assert cli.main(["embed", "first sentence", "second one"]) == 0
    assert "pooling: mean, L2-normalised (modules.json, 1_Pooling/config.json)" in capsys.readouterr().out


def test_cli_generate_with_a_folder_and_with_a_gguf_path(hf_folder, capsys):
    folder = hf_folder("smollm35", "decoder", "smollm3", generation=5)
    args = ["generate", "Hello", "--model", str(folder), "--max-new-tokens", "3", "--max-seq", "32"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(folder) and len(out["generated_ids"]) == 3 and out["layers"] == 4
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert f"model: {folder}\n" in text and "meganeura" not in text
    path = gguf.find_gguf()
    assert cli.main(["generate", "The capital of France is", "--model", str(path), "--max-new-tokens", "2",
                     "--layers", "2", "--max-seq", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(path)


def test_cli_model_errors_are_one_line(hf_folder, tmp_path, capsys):
    encoder, decoder = tmp_path / "bert", tmp_path / "llama"
    shutil.copytree(hf_folder("bert", "encoder", "bert"), encoder)
    shutil.copytree(hf_folder("llama4", "decoder", "llama", generation=4), decoder)
    for path, changes in ((encoder / "config.json", {"num_hidden_layers": -1}),
                          (decoder / "generation_config.json", {"eos_token_id": 4.7})):
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    for argv, message in ((["generate", "hi", "--model", str(tmp_path / "nowhere")], "no such file or folder"),
                          (["embed", "hi", "--model", str(tmp_path / "nowhere")],
                           "no such folder (give a Hugging Face or sentence-transformers encoder folder"),
                          (["embed", "hi", "--model", str(hf_folder("llama4", "decoder", "llama", generation=4))],
                           "not an encoder: use generate"),
                          (["embed", "hi", "--model", str(encoder)],
                           f"{encoder / 'config.json'}: num_hidden_layers must be an integer >= 1, got -1"),
                          (["generate", "hi", "--model", str(decoder)],
                           f"{decoder / 'generation_config.json'}: eos_token_id must be a token id")):
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert captured.out == "" and len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize("weights", ["q8_0", "q4_0"])
def test_decoder_folder_quantised_at_load_matches_the_oracle_on_its_blocks(hf_folder, weights):
    # a Hugging Face folder's f32 weights quantised to blocks when loaded (gguf's quantisers), run on
    # the kernels that decode them, against the numpy oracle given the blocks' values (gguf's dequantiser)
    import gguf as gguf_lib

    folder = hf_folder("qwen24", "decoder", "qwen2", generation=4)
    model = eggfuse.load_model(folder, weights=weights)
    assert model.weights == weights and model.weight_formats()[weights] == 1 + 2 * 7  # embedding, 7 per layer
    cfg, stored = hf_numpy.load_folder(folder)
    qtype = gguf_lib.GGMLQuantizationType[weights.upper()]
    values = {name: gguf_lib.quants.dequantize(gguf_lib.quants.quantize(w.astype(np.float32), qtype), qtype)
              if w.ndim == 2 else w for name, w in stored.items()}
    ids = model.encode(PROMPT)
    gen = eggfuse.Generator(model, max_seq=48)
    err = relative_error(gen.prefill(ids, last_logits=False), hf_numpy.causal_lm_logits(cfg, values, ids))
    assert err < 1e-4
    assert gen.generate(ids, 5, stop_at_eos=False).generated_ids == hf_numpy.greedy(cfg, values, ids, 5)
    assert not any("dequant" in d.kernel for d in gen.decode.plan.dispatches)
