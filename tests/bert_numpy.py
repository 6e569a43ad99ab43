"""Independent float64 numpy BERT + mean pooling + L2 normalisation: the test oracle.

Written from Hugging Face ``transformers`` ``modeling_bert.py`` (BertEmbeddings,
BertSelfAttention with the additive extended attention mask, BertSelfOutput,
BertIntermediate, BertOutput) and the sentence-transformers ``Pooling`` (mean) and
``Normalize`` modules, on [B, S, H] arrays. It deliberately does not import eggfuse, so
a bug shared with the graph builder or the IR reference cannot hide here.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    # torch.nn.Linear: y = x W^T + b with W [out, in]
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def _layer_norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)  # biased, as torch.nn.LayerNorm
    return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    # transformers ACT2FN["gelu"]: exact erf GELU
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def bert_hidden_states(weights: dict[str, np.ndarray], input_ids: np.ndarray, attention_mask: np.ndarray,
                       num_heads: int, eps: float = 1e-12,
                       token_type_ids: np.ndarray | None = None, position_ids: np.ndarray | None = None) -> np.ndarray:
    """Last hidden state [B, S, H] (float64) of ``BertModel`` for int ids [B, S] and a 0/1 mask [B, S].

    ``position_ids`` [B, S] default to 0..S-1 (BERT); RoBERTa's start after the padding id.
    Names may carry a ``bert.`` or ``roberta.`` prefix.
    """
    w = {k.removeprefix("bert.").removeprefix("roberta."): np.asarray(v, dtype=np.float64)
         for k, v in weights.items() if np.issubdtype(np.asarray(v).dtype, np.floating)}
    ids = np.asarray(input_ids).astype(np.int64)
    b, s = ids.shape
    types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids).astype(np.int64)
    positions = np.tile(np.arange(s), (b, 1)) if position_ids is None else np.asarray(position_ids, dtype=np.int64)
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][positions]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    h = x.shape[-1]
    d = h // num_heads
    # get_extended_attention_mask: (1 - mask) * finfo(float32).min, broadcast [B, 1, 1, S]
    mask = np.asarray(attention_mask, dtype=np.float64)
    additive = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}"

        def heads(t: np.ndarray) -> np.ndarray:  # [B, S, H] -> [B, heads, S, d]
            return t.reshape(b, s, num_heads, d).transpose(0, 2, 1, 3)

        q = heads(_linear(x, w, f"{p}.attention.self.query"))
        k = heads(_linear(x, w, f"{p}.attention.self.key"))
        v = heads(_linear(x, w, f"{p}.attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + additive
        ctx = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        x = _layer_norm(_linear(ctx, w, f"{p}.attention.output.dense") + x, w,
                        f"{p}.attention.output.LayerNorm", eps)
        mid = _gelu(_linear(x, w, f"{p}.intermediate.dense"))
        x = _layer_norm(_linear(mid, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm", eps)
        layer += 1
    if layer == 0:
        raise KeyError("no encoder.layer.0 weights found")
    return x


def mean_pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers Pooling(mean) then Normalize: [B, S, H] -> unit rows [B, H]."""
    m = np.asarray(attention_mask, dtype=np.float64)[:, :, None]
    pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    norm = np.linalg.norm(pooled, axis=1, keepdims=True)
    return pooled / np.maximum(norm, 1e-12)  # torch.nn.functional.normalize(p=2, eps=1e-12)


def sentence_embeddings(weights: dict[str, np.ndarray], input_ids: np.ndarray, attention_mask: np.ndarray,
                        num_heads: int, eps: float = 1e-12) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings [B, H] (float64) for a padded batch."""
    hidden = bert_hidden_states(weights, input_ids, attention_mask, num_heads, eps)
    return mean_pool_normalize(hidden, attention_mask)
