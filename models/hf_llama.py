"""LLaMA-family decoders from Hugging Face model folders: ``config.json`` -> :class:`LlamaConfig`,
safetensors names -> the graph's parameter names, and the tokenizer, chat template and
end-of-sequence ids of the folder.

Written from transformers 5's ``configuration_*.py`` and ``modeling_*.py`` of each
``model_type``: ``llama`` (also SmolLM and SmolLM2), ``mistral``, ``qwen2``, ``qwen3`` and
``smollm3``. A key a config.json omits takes the default of transformers' config class. The
config's ``head_dim`` (Qwen3: 128 when absent), ``num_key_value_heads`` (GQA),
``tie_word_embeddings``, biases (Qwen2: q/k/v always; ``attention_bias``: q/k/v/o;
``mlp_bias``: gate/up/down), Qwen3's q/k RMSNorm, SmolLM3's ``no_rope_layers`` and RoPE as
``rope_theta`` + ``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5) of
rope type ``default``, ``linear`` or ``llama3`` are implemented; other settings raise a
:class:`ModelError` naming them. A sliding window (Mistral's ``sliding_window``; Qwen's and
SmolLM3's when ``use_sliding_window``) bounds the context at the window, within which it
equals causal attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eggfuse.ir import ModelError

from .config_fields import ConfigFields, read_json_object
from .hf import config_dtype, load_safetensors, read_config
from .llama import LlamaConfig, graph_parameters
from .text import ChatTemplate, find_chat_template, load_tokenizer_json, special_tokens

_ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_output")
_MLP = ("ffn_gate", "ffn_up", "ffn_down")

#: Per model_type, transformers' defaults for keys a config may omit, and which projections
#: carry a bias: always (``bias``), or when ``attention_bias`` / ``mlp_bias`` is true.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(num_key_value_heads=None, max_position_embeddings=2048, rope_theta=10000.0,
                  tie_word_embeddings=False, head_dim=None, bias=(), attention_bias=_ATTENTION, mlp_bias=_MLP),
    "mistral": dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rope_theta=10000.0,
                    tie_word_embeddings=False, head_dim=None, bias=(), sliding_window=4096),
    "qwen2": dict(num_key_value_heads=32, max_position_embeddings=32768, rope_theta=10000.0,
                  tie_word_embeddings=False, head_dim=None, bias=("attn_q", "attn_k", "attn_v"), sliding_window=4096),
    "qwen3": dict(num_key_value_heads=32, max_position_embeddings=32768, rope_theta=10000.0,
                  tie_word_embeddings=False, head_dim=128, bias=(), attention_bias=_ATTENTION, sliding_window=4096),
    "smollm3": dict(num_key_value_heads=4, max_position_embeddings=32768, rope_theta=2000000.0,
                    tie_word_embeddings=True, head_dim=None, bias=(), attention_bias=_ATTENTION, mlp_bias=_MLP),
}

#: Hugging Face tensor names -> graph parameter names (GGUF's, as llama.cpp's converter maps them).
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_HF_OF_LAYER = {v: k for k, v in LAYER_NAMES.items()}
_HF_OF_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}


def graph_name(hf: str) -> str | None:
    """The graph parameter of a Hugging Face tensor name (None for one the graph does not read)."""
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    parts = hf.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        module = ".".join(parts[3:-1])
        if module in LAYER_NAMES:
            return f"blk.{parts[2]}.{LAYER_NAMES[module]}.{parts[-1]}"
    return None


def hf_name(graph: str) -> str:
    """The Hugging Face tensor name of a graph parameter (inverse of :func:`graph_name`)."""
    if graph in _HF_OF_GLOBAL:
        return _HF_OF_GLOBAL[graph]
    _, layer, module, kind = graph.split(".")
    return f"model.layers.{layer}.{_HF_OF_LAYER[module]}.{kind}"


def config_from_hf(raw: dict, where: str = "config.json") -> LlamaConfig:
    """The :class:`LlamaConfig` of a decoder's ``config.json`` (see the module docstring).

    Raises :class:`ModelError` naming ``where``, the key and the value for a missing required
    key, a malformed value (sizes and counts must be integers >= 1, ``rope_theta``, epsilons
    and RoPE factors positive numbers, flags true or false), a model_type not in
    :data:`FAMILIES`, or a setting the graph does not implement (another activation, partial
    rotary, another rope type, per-layer RoPE parameters, an odd head_dim, heads not a
    multiple of KV heads).
    """
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ModelError(f"{where}: model_type {model_type!r} is not a LLaMA-family decoder ({', '.join(FAMILIES)})")
    family = FAMILIES[model_type]
    read = ConfigFields(raw, where, f"a {model_type} config")

    def family_int(key: str) -> Any:
        # transformers' default when absent; a null stays None (the value then follows from others)
        return read.integer(key, default=None) if key in raw else family.get(key)

    hidden, heads, layers = (read.integer(k) for k in ("hidden_size", "num_attention_heads", "num_hidden_layers"))
    kv_heads = family_int("num_key_value_heads") or heads
    head_dim = family_int("head_dim") or hidden // heads
    if head_dim < 1:
        raise ModelError(f"{where}: head_dim would be hidden_size {hidden} // num_attention_heads {heads} = 0; "
                         "correct them or set head_dim in the file")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{where}: hidden_act {raw['hidden_act']!r} is not supported (only 'silu', SwiGLU)")
    if head_dim % 2 or heads % kv_heads:
        raise ModelError(f"{where}: head_dim {head_dim} must be even and num_attention_heads {heads} a multiple "
                         f"of num_key_value_heads {kv_heads}")
    max_seq = read.integer("max_position_embeddings", default=family["max_position_embeddings"])
    theta, scaling = _rope(raw, family["rope_theta"], max_seq, where)
    biases = set(family["bias"])
    for key in ("attention_bias", "mlp_bias"):
        if read.flag(key) and key in family:
            biases.update(family[key])
    rope_layers = None
    if model_type == "smollm3":
        interval = read.integer("no_rope_layer_interval", default=4)
        flags = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        if not isinstance(flags, list) or not all(isinstance(f, int) and f in (0, 1) for f in flags):
            raise read.fail("no_rope_layers", flags, "a list of flags, 1 or 0 (the layer applies RoPE or not)")
        if len(flags) != layers:
            raise ModelError(f"{where}: no_rope_layers has {len(flags)} entries for {layers} layers")
        rope_layers = tuple(bool(f) for f in flags)
    window = _sliding_window(read, model_type, family_int, layers, rope_layers)
    tied = read.flag("tie_word_embeddings") if "tie_word_embeddings" in raw else family["tie_word_embeddings"]
    return LlamaConfig(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=read.integer("intermediate_size"), vocab_size=read.integer("vocab_size"),
        rope_theta=theta, norm_eps=read.number("rms_norm_eps", default=1e-6),
        tied_embeddings=tied, max_seq=max_seq if window is None else min(max_seq, window),
        biases=frozenset(biases), qk_norm=model_type == "qwen3", rope_scaling=scaling, rope_layers=rope_layers,
        sliding_window=window)


#: The keys each RoPE scaling type reads from its parameters.
_ROPE_KEYS = {"default": (), "linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def _rope(raw: dict, default_theta: float, max_positions: int, where: str) -> tuple[float, tuple | None]:
    """RoPE's base and scaling from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4), as ``RotaryEmbeddingConfigMixin.standardize_rope_params``."""
    params = raw.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = raw.get("rope_scaling") or {}, "rope_scaling"
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise ModelError(f"{where}: {key} {params!r} is not supported (only one set of RoPE parameters for "
                         "every layer)")
    top, rope = ConfigFields(raw, where), ConfigFields(params, where, prefix=f"{key}.")
    theta = rope.number("rope_theta", default=None) or top.number("rope_theta", default=default_theta)
    partial = rope.number("partial_rotary_factor", default=None) or top.number("partial_rotary_factor", default=1.0)
    if partial != 1.0:
        raise ModelError(f"{where}: partial_rotary_factor {partial} is not supported (RoPE on whole heads only)")
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str) or kind not in _ROPE_KEYS:
        raise ModelError(f"{where}: RoPE scaling rope_type {kind!r} ({key}) is not supported; supported: "
                         f"{', '.join(_ROPE_KEYS)}")
    for name in _ROPE_KEYS[kind]:
        if params.get(name) is None:
            raise ModelError(f"{where}: {key} of rope_type {kind!r} lacks {name!r}")
    if kind == "linear":
        return theta, ("linear", rope.number("factor"))
    if kind == "llama3":
        context = rope.integer("original_max_position_embeddings", default=max_positions)
        return theta, ("llama3", *(rope.number(k) for k in _ROPE_KEYS[kind]), float(context))
    return theta, None


def _sliding_window(read: ConfigFields, model_type: str, family_int, layers: int, rope_layers) -> int | None:
    """The attention window of the windowed layers (None: every layer attends causally)."""
    if model_type == "llama":
        return None
    window = family_int("sliding_window")
    if model_type == "mistral":
        return window
    if not read.flag("use_sliding_window") or window is None:
        return None
    types = read.raw.get("layer_types")
    if types is None and model_type == "smollm3":
        types = ["full_attention" if rope_layers[i] else "sliding_attention" for i in range(layers)]
    elif types is None:
        first = read.integer("max_window_layers", minimum=0, default=28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    elif not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise read.fail("layer_types", types, "a list of attention types ('full_attention', 'sliding_attention')")
    return window if "sliding_attention" in types else None


def load_causal_lm(folder: Path, raw: dict | None = None):
    """A :class:`.causal_lm.CausalLM` from a Hugging Face decoder folder.

    Reads ``config.json`` (:func:`config_from_hf`), the safetensors weights (mapped by
    :func:`graph_name`; with tied embeddings the LM head is the embedding table and a stored
    ``lm_head.weight`` is not read, as transformers ties them), ``tokenizer.json``, the
    special tokens of ``tokenizer_config.json``, the chat template (:func:`.text.find_chat_template`),
    and the end-of-sequence ids: config.json's and ``generation_config.json``'s
    ``eos_token_id`` (an id or a list of ids, each in the vocabulary) and the tokenizer's
    ``eos_token``. Raises :class:`ModelError` naming the file and the key, value or tensor at
    fault.
    """
    from .causal_lm import CausalLM

    where = str(folder / "config.json")
    raw = read_config(folder) if raw is None else raw
    config = config_from_hf(raw, where)
    read, vocab = ConfigFields(raw, where), config.vocab_size
    dtype = config_dtype(raw, where)
    weights = {}
    loaded = load_safetensors(folder)
    for name, arr in loaded.items():
        if (graph := graph_name(name)) is not None and not (graph == "output.weight" and config.tied_embeddings):
            weights[graph] = arr
    for name in loaded.skipped:  # a weight the graph reads, stored as integers: not "missing"
        if (graph := graph_name(name)) is not None and not (graph == "output.weight" and config.tied_embeddings):
            raise ModelError(loaded.not_float(name))
    params = graph_parameters(config, weights, where=f"the safetensors files of {folder}", file_name=hf_name)
    for name in params:  # named as the file names them, at load time (a session would name the graph's name)
        loaded.check_finite(hf_name(name))
    tokenizer = load_tokenizer_json(folder / "tokenizer.json")
    tokens = special_tokens(folder)
    eos = read.token_ids("eos_token_id", vocab)
    if (generation := folder / "generation_config.json").is_file():
        eos += ConfigFields(read_json_object(generation), generation).token_ids("eos_token_id", vocab)
    if "eos_token" in tokens and tokenizer.token_to_id(tokens["eos_token"]) is not None:
        eos.append(tokenizer.token_to_id(tokens["eos_token"]))
    bos_ids = read.token_ids("bos_token_id", vocab)
    bos = tokenizer.token_to_id(tokens["bos_token"]) if "bos_token" in tokens else None
    if bos is None and bos_ids:
        bos = bos_ids[0]
    found = find_chat_template(folder)
    chat = None if found is None else ChatTemplate(found[0], tokens, str(folder / found[1]))
    return CausalLM(config, params, tokenizer, bos_id=bos, eos_ids=eos, chat=chat, name=str(folder),
                    kind=raw["model_type"], dtype=dtype)
