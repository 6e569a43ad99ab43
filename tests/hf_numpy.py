"""Independent float64 numpy forwards of Hugging Face model folders: the oracles of the folder tests.

They read a folder on their own (``config.json`` as a dict, every ``*.safetensors`` file by
Hugging Face tensor name) and follow transformers 5's code, not eggfuse's: the decoders from
``modeling_llama.py`` / ``modeling_mistral.py`` / ``modeling_qwen2.py`` / ``modeling_qwen3.py``
/ ``modeling_smollm3.py`` (biases by ``nn.Linear(..., bias=...)``, Qwen3's ``q_norm`` /
``k_norm`` on the head dimension, SmolLM3's ``use_rope = no_rope_layers[i]``, the sliding
window mask ``q - k < window``) and ``modeling_rope_utils.py`` (default, linear and llama3
frequencies); the encoders from ``modeling_roberta.py``'s position ids and
sentence-transformers' ``Pooling``. Shared pieces come from ``llama_numpy`` and
``bert_numpy``. Nothing here imports eggfuse.
"""

from __future__ import annotations

import math
from pathlib import Path

import bert_numpy
import llama_numpy
import numpy as np


def load_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, every tensor of every ``*.safetensors`` in the folder as float64)."""
    import json

    from safetensors.numpy import load_file

    try:
        import ml_dtypes  # noqa: F401 - bfloat16 for safetensors.numpy
    except ImportError:
        pass
    weights = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        for name, arr in load_file(str(path)).items():
            weights[name] = arr.astype(np.float64) if arr.dtype.kind in "fV" or arr.dtype.name == "bfloat16" else arr
    return json.loads((Path(folder) / "config.json").read_text()), weights


# --- decoders ----------------------------------------------------------------------------------


def rope_parameters(cfg: dict) -> dict:
    """``standardize_rope_params``: one dict with rope_type and rope_theta, from either config generation."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params.setdefault("rope_type", params.get("type", "default"))
    default_theta = 2000000.0 if cfg["model_type"] == "smollm3" else 10000.0
    params.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
    if params["rope_type"] == "llama3":
        params.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return params


def inv_freq(cfg: dict, head_dim: int) -> np.ndarray:
    """``ROPE_INIT_FUNCTIONS[rope_type]`` (or the default): float64 [head_dim / 2]."""
    p = rope_parameters(cfg)
    freq = 1.0 / (p["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if p["rope_type"] == "linear":
        return freq / p["factor"]
    if p["rope_type"] == "llama3":
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        old = p["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        out = np.where(wavelen > old / low, freq / factor, freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, out)
    assert p["rope_type"] == "default", p
    return freq


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y  # nn.Linear(bias=...) as the checkpoint has it


def _head_dim(cfg: dict) -> int:
    if cfg.get("head_dim"):
        return cfg["head_dim"]
    return 128 if cfg["model_type"] == "qwen3" and "head_dim" not in cfg else cfg["hidden_size"] // cfg[
        "num_attention_heads"]


def _window(cfg: dict, layer: int) -> int | None:
    # the sliding window of a layer (None: full causal attention), as each model's attention sets it
    mt = cfg["model_type"]
    if mt == "mistral":
        return cfg.get("sliding_window", 4096)
    if mt in ("qwen2", "qwen3", "smollm3") and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        types = cfg.get("layer_types")
        if types is None and mt == "smollm3":
            types = ["full_attention" if r else "sliding_attention" for r in cfg["no_rope_layers"]]
        elif types is None:
            types = ["sliding_attention" if i >= cfg.get("max_window_layers", 28) else "full_attention"
                     for i in range(cfg["num_hidden_layers"])]
        return cfg["sliding_window"] if types[layer] == "sliding_attention" else None
    return None


def causal_lm_logits(cfg: dict, weights: dict, tokens) -> np.ndarray:
    """Logits [S, V] (float64) of ``XForCausalLM`` for token ids [S] (one sequence, positions 0..S-1)."""
    w = weights
    eps = cfg.get("rms_norm_eps", 1e-6)
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    d = _head_dim(cfg)
    x = w["model.embed_tokens.weight"][np.asarray(tokens, dtype=np.int64)]
    s = x.shape[0]
    freqs = np.outer(np.arange(s, dtype=np.float64), inv_freq(cfg, d))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = llama_numpy.rms_norm(x, w[f"{p}.input_layernorm.weight"], eps)
        q = _linear(h, w, f"{p}.self_attn.q_proj").reshape(s, nh, d)
        k = _linear(h, w, f"{p}.self_attn.k_proj").reshape(s, nkv, d)
        v = _linear(h, w, f"{p}.self_attn.v_proj").reshape(s, nkv, d).transpose(1, 0, 2)
        if f"{p}.self_attn.q_norm.weight" in w:  # Qwen3: RMSNorm over head_dim, before RoPE
            q = llama_numpy.rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], eps)
            k = llama_numpy.rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 0, 2), k.transpose(1, 0, 2)
        if cfg["model_type"] != "smollm3" or cfg["no_rope_layers"][i]:
            q = q * cos + llama_numpy.rotate_half(q) * sin
            k = k * cos + llama_numpy.rotate_half(k) * sin
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        qi, ki = np.arange(s)[:, None], np.arange(s)[None, :]
        visible = ki <= qi
        if (window := _window(cfg, i)) is not None:
            visible &= qi - ki < window
        scores = np.where(visible, scores, -np.inf)
        att = (llama_numpy.softmax(scores) @ v).transpose(1, 0, 2).reshape(s, nh * d)
        x = x + _linear(att, w, f"{p}.self_attn.o_proj")
        h = llama_numpy.rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], eps)
        gate, up = _linear(h, w, f"{p}.mlp.gate_proj"), _linear(h, w, f"{p}.mlp.up_proj")
        x = x + _linear(gate / (1.0 + np.exp(-gate)) * up, w, f"{p}.mlp.down_proj")
    x = llama_numpy.rms_norm(x, w["model.norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", cfg["model_type"] == "smollm3")
    return x @ (w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]).T


def greedy(cfg: dict, weights: dict, prompt, n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` (each step reruns the whole sequence)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(causal_lm_logits(cfg, weights, ids)[-1])))
    return ids[len(prompt):]


# --- encoders ----------------------------------------------------------------------------------


def position_ids(cfg: dict, input_ids: np.ndarray) -> np.ndarray:
    """BertEmbeddings: 0..S-1; RobertaEmbeddings / XLM-R: ``create_position_ids_from_input_ids``."""
    ids = np.asarray(input_ids, dtype=np.int64)
    if cfg["model_type"] == "bert":
        return np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1))
    pad = cfg["pad_token_id"]
    mask = (ids != pad).astype(np.int64)
    return np.cumsum(mask, axis=1) * mask + pad


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """sentence-transformers ``Pooling.forward`` for one mode: [B, S, H] -> [B, H]."""
    m = np.asarray(mask, dtype=np.float64)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        s = m.shape[1]
        values, indices = m[:, ::-1].max(axis=1), m[:, ::-1].argmax(axis=1)
        last = s - np.where(values == 0, s - 1, indices) - 1
        return hidden[np.arange(hidden.shape[0]), last]
    if mode == "weightedmean":
        m = m * np.arange(1, m.shape[1] + 1)[None, :]
    summed = (hidden * m[:, :, None]).sum(axis=1)
    count = np.clip(m.sum(axis=1, keepdims=True), 1e-9, None)
    return summed / (np.sqrt(count) if mode == "mean_sqrt_len" else count)


def sentence_embeddings(cfg: dict, weights: dict, input_ids: np.ndarray, mask: np.ndarray, mode: str = "mean",
                        normalize: bool = True) -> np.ndarray:
    """Encoder + Pooling (+ Normalize) of a BERT / RoBERTa / XLM-R folder: [B, H] float64."""
    hidden = bert_numpy.bert_hidden_states(weights, input_ids, mask, cfg["num_attention_heads"],
                                           cfg["layer_norm_eps"], position_ids=position_ids(cfg, input_ids))
    out = pool(hidden, mask, mode)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12) if normalize else out
