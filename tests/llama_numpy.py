"""An independent LLaMA forward in plain float64 numpy: the oracle for the eggfuse LLaMA graph.

Written from Hugging Face ``transformers`` ``modeling_llama.py`` (LlamaRMSNorm,
LlamaRotaryEmbedding + apply_rotary_pos_emb with rotate_half, repeat_kv,
eager_attention_forward, LlamaMLP, LlamaForCausalLM's lm_head), so it expects Q/K weights
in HF layout (un-permuted). It imports only numpy: nothing from eggfuse or its IR.
Weights are keyed by GGUF tensor names; ``config`` is any object with the LlamaConfig
attributes (hidden_size, num_heads, num_kv_heads, head_dim, rope_theta, norm_eps,
num_layers, tied_embeddings).
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """LlamaRMSNorm: w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1 | x2] -> [-x2 | x1] over the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_cos_sin(seq: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [seq, head_dim] of LlamaRotaryEmbedding (default rope type)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    freqs = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(x: np.ndarray, w: dict, p: str, cfg) -> np.ndarray:
    """LlamaAttention for one sequence x [S, H] (causal, GQA via repeat_kv)."""
    s, d = x.shape[0], cfg.head_dim
    q = (x @ w[f"{p}.attn_q.weight"].T).reshape(s, cfg.num_heads, d).transpose(1, 0, 2)
    k = (x @ w[f"{p}.attn_k.weight"].T).reshape(s, cfg.num_kv_heads, d).transpose(1, 0, 2)
    v = (x @ w[f"{p}.attn_v.weight"].T).reshape(s, cfg.num_kv_heads, d).transpose(1, 0, 2)
    cos, sin = rope_cos_sin(s, d, cfg.rope_theta)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)  # repeat_kv: head h reads kv h // rep
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(s, cfg.num_heads * d)
    return out @ w[f"{p}.attn_output.weight"].T


def mlp(x: np.ndarray, w: dict, p: str) -> np.ndarray:
    """LlamaMLP: down(silu(gate x) * up x)."""
    gate = x @ w[f"{p}.ffn_gate.weight"].T
    up = x @ w[f"{p}.ffn_up.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * up) @ w[f"{p}.ffn_down.weight"].T


def logits(weights: dict, tokens, cfg, layers: int | None = None) -> np.ndarray:
    """Logits [S, V] (float64) of the token ids ``tokens`` [S] after ``layers`` blocks (default all)."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()
         if not k.startswith("blk.") or int(k.split(".")[1]) < (cfg.num_layers if layers is None else layers)}
    x = w["token_embd.weight"][np.asarray(tokens, dtype=np.int64)]
    for i in range(cfg.num_layers if layers is None else layers):
        p = f"blk.{i}"
        x = x + attention(rms_norm(x, w[f"{p}.attn_norm.weight"], cfg.norm_eps), w, p, cfg)
        x = x + mlp(rms_norm(x, w[f"{p}.ffn_norm.weight"], cfg.norm_eps), w, p)
    x = rms_norm(x, w["output_norm.weight"], cfg.norm_eps)
    head = w["token_embd.weight"] if cfg.tied_embeddings else w["output.weight"]
    return x @ head.T
