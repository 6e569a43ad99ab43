"""Small Hugging Face model folders with random weights, written the way transformers and
sentence-transformers write them, for the tests.

Each folder has a ``config.json`` with the key set a real checkpoint of that ``model_type``
carries (``generation=4``: as transformers 4 wrote them, e.g. SmolLM2, Llama-3.2, Mistral-7B,
Qwen2.5, Qwen3 and SmolLM3 on the Hub: ``torch_dtype``, ``rope_theta``, ``rope_scaling``;
``generation=5``: as transformers 5 writes them: ``dtype``, ``rope_parameters``,
``layer_types``), seeded random weights under the Hugging Face tensor names in
``model.safetensors`` (or shards with ``model.safetensors.index.json``), a ``tokenizer.json``
trained with the ``tokenizers`` library on a fixed text (byte-level BPE as Llama 3 and Qwen
use, a Metaspace BPE as Mistral's, WordPiece as BERT's, Unigram as XLM-R's) whose
post-processor adds BOS (or CLS/SEP) as the real one does, a ``tokenizer_config.json`` and a
chat template. Encoder folders get the sentence-transformers files (``modules.json``,
``1_Pooling/config.json``) when asked.

Nothing here imports eggfuse: the folders are test inputs, the oracles (``hf_numpy.py``)
read them on their own, and the same module serves the transformers cross-check
(``tests/crosscheck_transformers.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "A man is eating food.", "A man is eating a piece of bread.",
    "The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.",
    "What is the capital of France? The capital of France is Paris.", "Hello, world! How are you today?",
    "Numbers like 12, 345 and 2024 appear in text.", "naïve café — 東京", "Tokenizers split text into pieces.",
    "The girl is carrying a baby.", "A cat sat on the mat and looked at the dog.",
]
HIDDEN, HEADS, KV_HEADS, INTER, LAYERS, MAX_POS = 32, 4, 2, 64, 2, 128
DECODER_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta")
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64, "rope_type": "llama3"}

# --- chat templates: the forms of the real ones (Llama 3, Mistral v0.1, Qwen2.5, Qwen3, SmolLM3) ---

CHAT_TEMPLATES = {
    "llama": ("{{- bos_token }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + "
              "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n"
              "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
              "{%- endif %}\n"),
    "mistral": ("{{ bos_token }}{% for message in messages %}"
                "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
                "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    "qwen2": ("{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0]['content'] + "
              "'<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
              "You are a helpful assistant.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}\n"
              "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
              "(message.role == \"assistant\") %}\n"
              "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
              "    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
              "    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"),
    # block tags on lines of their own: renders right only with trim_blocks and lstrip_blocks
    "qwen3": ("{% for message in messages %}\n    {% if loop.first and message['role'] != 'system' %}\n"
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n    {% endif %}\n"
              "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}\n"
              "{% if add_generation_prompt %}\n<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}\n"),
    # transformers' {% generation %} block around assistant text
    "smollm3": ("{%- for message in messages %}\n{%- if message['role'] == 'assistant' %}\n"
                "{{- '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>\\n' }}"
                "{% endgeneration %}\n{%- else %}\n{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                "+ '<|im_end|>\\n' }}\n{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}"
                "{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
}

#: The prompt each template makes of the user turn "Hi there" (with add_generation_prompt).
CHAT_RENDERED = {
    "llama": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "<s>[INST] Hi there [/INST]",
    "qwen2": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "smollm3": "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
}

# --- tokenizers ----------------------------------------------------------------------------------

_LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: per tokenizer style: special tokens (their ids in this order), BOS, EOS, pad
TOKENIZER_STYLES = {
    "llama3": dict(specials=_LLAMA3_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None),
    "smollm3": dict(specials=[*_LLAMA3_SPECIALS, "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                    pad="<|end_of_text|>"),
    "mistral": dict(specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], bos="<s>", eos="</s>", pad=None),
    "qwen": dict(specials=_QWEN_SPECIALS, bos=None, eos="<|im_end|>", pad="<|endoftext|>"),
    "bert": dict(specials=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], bos=None, eos=None, pad="[PAD]"),
    "roberta": dict(specials=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], bos="<s>", eos="</s>", pad="<pad>"),
    "xlm-roberta": dict(specials=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], bos="<s>", eos="</s>", pad="<pad>"),
}
STYLE_OF = {"llama": "llama3", "mistral": "mistral", "qwen2": "qwen", "qwen3": "qwen", "smollm3": "smollm3",
            "bert": "bert", "roberta": "roberta", "xlm-roberta": "xlm-roberta"}


def build_tokenizer(style: str, vocab_size: int = 300):
    """A ``tokenizers.Tokenizer`` of a style (see :data:`TOKENIZER_STYLES`), trained on :data:`CORPUS`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    s = TOKENIZER_STYLES[style]
    specials = s["specials"]
    if style in ("llama3", "smollm3", "qwen", "roberta"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif style == "mistral":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    elif style == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    else:  # xlm-roberta: a SentencePiece-style Unigram
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    tok.train_from_iterator(CORPUS * 3, trainer)
    ids = {t: tok.token_to_id(t) for t in specials}
    if style in ("llama3", "mistral"):
        bos = s["bos"]
        template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                 special_tokens=[(bos, ids[bos])])
        tok.post_processor = (processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
                              if style == "llama3" else template)
    elif style in ("qwen", "smollm3"):
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
        # all-MiniLM-L6-v2's tokenizer.json pads and truncates to a fixed 128: the loader must override it
        tok.enable_truncation(max_length=128)
        tok.enable_padding(pad_id=ids["[PAD]"], pad_token="[PAD]", length=128)
    elif style == "roberta":
        tok.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    return tok


def _added_tokens_decoder(tok, specials) -> dict:
    return {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for t in specials}


def write_tokenizer_files(folder: Path, model_type: str, generation: int, *, chat: bool = True) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json (and chat_template.jinja for generation 5) of a
    model_type; returns the ids of its special tokens."""
    style = STYLE_OF[model_type]
    s = TOKENIZER_STYLES[style]
    tok = build_tokenizer(style)
    tok.save(str(folder / "tokenizer.json"))
    named = {"bos_token": s["bos"], "eos_token": s["eos"], "pad_token": s["pad"]}
    if style in ("bert", "roberta", "xlm-roberta"):
        named.update(unk_token="[UNK]" if style == "bert" else "<unk>", mask_token=s["specials"][-1],
                     cls_token="[CLS]" if style == "bert" else "<s>", sep_token="[SEP]" if style == "bert" else "</s>")
    named = {k: v for k, v in named.items() if v is not None}
    template = CHAT_TEMPLATES.get(model_type) if chat else None
    if generation == 5:
        cfg = {"backend": "tokenizers", **named, "model_max_length": MAX_POS, "tokenizer_class": "TokenizersBackend"}
        if template:
            (folder / "chat_template.jinja").write_text(template)
    else:
        cfg = {"add_bos_token": s["bos"] is not None and style in ("llama3", "mistral"), "add_eos_token": False,
               "added_tokens_decoder": _added_tokens_decoder(tok, s["specials"]), **named,
               "clean_up_tokenization_spaces": False, "model_max_length": MAX_POS,
               "tokenizer_class": "BertTokenizer" if style == "bert" else "PreTrainedTokenizerFast"}
        if template:
            cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return {t: tok.token_to_id(t) for t in s["specials"]} | {"vocab": tok.get_vocab_size()}


# --- config.json -----------------------------------------------------------------------------------


def decoder_config(model_type: str, generation: int, vocab: int, ids: dict[str, int], *, tied: bool | None = None,
                   rope_scaling: dict | None = None, **overrides) -> dict:
    """A config.json dict for a decoder of ``model_type`` in the key set of ``generation`` 4 or 5."""
    style = TOKENIZER_STYLES[STYLE_OF[model_type]]
    bos = ids.get(style["bos"]) if style["bos"] else None
    eos = ids[style["eos"]]
    layers = 4 if model_type == "smollm3" else LAYERS  # a layer without RoPE (no_rope_layers[3] == 0)
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}[model_type]],
           "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos, "hidden_act": "silu",
           "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": INTER,
           "max_position_embeddings": MAX_POS, "model_type": model_type, "num_attention_heads": HEADS,
           "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-06,
           "tie_word_embeddings": model_type in ("llama", "qwen2", "qwen3", "smollm3") if tied is None else tied,
           "use_cache": True, "vocab_size": vocab}
    if model_type in ("llama", "qwen3", "smollm3"):
        cfg["attention_bias"] = False
    if model_type in ("llama", "smollm3"):
        cfg.update(mlp_bias=False, pretraining_tp=1)
    if model_type in ("llama", "mistral", "qwen3"):
        cfg["head_dim"] = 16 if model_type == "qwen3" else HIDDEN // HEADS  # Qwen3: heads * head_dim != hidden
    if model_type == "mistral":
        cfg["sliding_window"] = 4096  # Mistral-7B-v0.1
    if model_type in ("qwen2", "qwen3", "smollm3"):
        cfg.update(max_window_layers=28 if model_type != "smollm3" else layers, sliding_window=None,
                   use_sliding_window=False)
    if model_type == "qwen2" and generation == 4:
        cfg["sliding_window"] = MAX_POS  # Qwen2.5 stores a window but does not use it
    if model_type == "smollm3":
        cfg.update(no_rope_layer_interval=4, no_rope_layers=[1, 1, 1, 0], pad_token_id=ids[style["pad"]])
    theta = {"smollm3": 5000000.0, "qwen2": 1000000.0, "qwen3": 1000000.0}.get(model_type, 500000.0)
    if generation == 5:
        cfg["dtype"] = "float32"
        cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default", **(rope_scaling or {})}
        if model_type in ("qwen2", "qwen3", "smollm3"):
            cfg["layer_types"] = ["full_attention"] * layers
        cfg["transformers_version"] = "5.24.0"
        cfg.setdefault("pad_token_id", None)
    else:
        cfg.update(rope_theta=theta, rope_scaling=rope_scaling, torch_dtype="float32",
                   transformers_version="4.51.0")
    cfg.update(overrides)
    return dict(sorted(cfg.items()))


def encoder_config(model_type: str, generation: int, vocab: int) -> dict:
    """A config.json dict for an encoder (bert, roberta, xlm-roberta) in the key set of ``generation``."""
    roberta = model_type != "bert"
    cfg = {"architectures": [{"bert": "BertModel", "roberta": "RobertaForMaskedLM",
                              "xlm-roberta": "XLMRobertaForMaskedLM"}[model_type]],
           "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
           "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": INTER,
           "layer_norm_eps": 1e-05 if roberta else 1e-12, "max_position_embeddings": 66 if roberta else 64,
           "model_type": model_type, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
           "pad_token_id": 1 if roberta else 0, "type_vocab_size": 1 if roberta else 2, "vocab_size": vocab}
    if roberta:
        cfg.update(bos_token_id=0, eos_token_id=2)
    if generation == 5:
        cfg.update(dtype="float32", is_decoder=False, add_cross_attention=False, classifier_dropout=None,
                   tie_word_embeddings=True, transformers_version="5.24.0", use_cache=True)
    else:
        cfg.update(position_embedding_type="absolute", torch_dtype="float32", transformers_version="4.8.2",
                   use_cache=True, gradient_checkpointing=False)
    return dict(sorted(cfg.items()))


# --- weights ---------------------------------------------------------------------------------------


def _normal(rng, shape, scale):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def decoder_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under the Hugging Face names of a decoder config (lm_head only when untied)."""
    rng = np.random.default_rng(seed)
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    mt = cfg["model_type"]
    w = {"model.embed_tokens.weight": _normal(rng, (v, h), 1.0), "model.norm.weight": 1 + _normal(rng, (h,), 0.1)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = _normal(rng, (v, h), h ** -0.5)
    attention_bias = cfg.get("attention_bias", False)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = 1 + _normal(rng, (h,), 0.1)
        w[f"{p}.post_attention_layernorm.weight"] = 1 + _normal(rng, (h,), 0.1)
        for name, (n_out, n_in) in {"self_attn.q_proj": (nq, h), "self_attn.k_proj": (nkv, h),
                                    "self_attn.v_proj": (nkv, h), "self_attn.o_proj": (h, nq),
                                    "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                                    "mlp.down_proj": (h, inter)}.items():
            w[f"{p}.{name}.weight"] = _normal(rng, (n_out, n_in), n_in ** -0.5)
            attn = name.startswith("self_attn")
            if (mt == "qwen2" and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")) or \
                    (attn and attention_bias) or (not attn and cfg.get("mlp_bias", False)):
                w[f"{p}.{name}.bias"] = _normal(rng, (n_out,), 0.1)
        if mt == "qwen3":
            w[f"{p}.self_attn.q_norm.weight"] = 1 + _normal(rng, (hd,), 0.1)
            w[f"{p}.self_attn.k_norm.weight"] = 1 + _normal(rng, (hd,), 0.1)
    return w


def encoder_weights(cfg: dict, seed: int = 0, prefix: str = "") -> dict[str, np.ndarray]:
    """Random weights under the Hugging Face names of a BERT-family config (``prefix``:
    ``bert.`` / ``roberta.`` as task-head checkpoints save them), with the pooler and an int64
    ``position_ids`` buffer as old checkpoints have."""
    rng = np.random.default_rng(seed)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    w = {"embeddings.word_embeddings.weight": _normal(rng, (cfg["vocab_size"], h), 1.0),
         "embeddings.position_embeddings.weight": _normal(rng, (cfg["max_position_embeddings"], h), 1.0),
         "embeddings.token_type_embeddings.weight": _normal(rng, (cfg["type_vocab_size"], h), 1.0),
         "embeddings.position_ids": np.arange(cfg["max_position_embeddings"], dtype=np.int64)[None, :]}

    def linear(name, n_out, n_in):
        w[f"{name}.weight"], w[f"{name}.bias"] = _normal(rng, (n_out, n_in), n_in ** -0.5), _normal(rng, (n_out,), 0.1)

    def norm(name):
        w[f"{name}.weight"], w[f"{name}.bias"] = 1 + _normal(rng, (h,), 0.1), _normal(rng, (h,), 0.1)

    norm("embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            linear(f"{p}.attention.self.{name}", h, h)
        linear(f"{p}.attention.output.dense", h, h)
        norm(f"{p}.attention.output.LayerNorm")
        linear(f"{p}.intermediate.dense", inter, h)
        linear(f"{p}.output.dense", h, inter)
        norm(f"{p}.output.LayerNorm")
    linear("pooler.dense", h, h)
    return {prefix + k: v for k, v in w.items()}


def write_weights(folder: Path, weights: dict[str, np.ndarray], shards: int = 1, dtype: str = "float32") -> None:
    """model.safetensors, or ``shards`` files and the index as ``save_pretrained`` names them."""
    if dtype in ("bfloat16", "float16"):
        import ml_dtypes

        kind = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
        weights = {k: v.astype(kind) if v.dtype == np.float32 else v for k, v in weights.items()}
    if shards == 1:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(weights)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(int(a.nbytes) for a in weights.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))


# --- folders ---------------------------------------------------------------------------------------


def decoder_folder(folder: Path, model_type: str, *, generation: int = 4, seed: int = 0, shards: int = 1,
                   dtype: str = "float32", chat: bool = True, **config) -> Path:
    """A decoder folder: config.json, weights, tokenizer files, generation_config.json.
    ``config`` goes to :func:`decoder_config` (``tied``, ``rope_scaling``, overrides)."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer_files(folder, model_type, generation, chat=chat)
    cfg = decoder_config(model_type, generation, vocab=ids["vocab"] + 20, ids=ids, **config)  # a padded table
    if generation == 5:
        cfg["dtype"] = dtype
    else:
        cfg["torch_dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    eos = [cfg["eos_token_id"]]
    if model_type in ("qwen2", "qwen3"):
        eos.append(ids["<|endoftext|>"])  # as Qwen2.5-Instruct's generation_config.json
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": eos, "transformers_version": "4.51.0"}, indent=2))
    write_weights(folder, decoder_weights(cfg, seed), shards, dtype)
    return folder


def encoder_folder(folder: Path, model_type: str, *, generation: int = 4, seed: int = 0, pooling: str | None = "mean",
                   normalize: bool = True, prefix: str = "", shards: int = 1) -> Path:
    """An encoder folder: config.json, weights (names with ``prefix``), tokenizer files, and with
    ``pooling`` the sentence-transformers files (modules.json, 1_Pooling/config.json,
    sentence_bert_config.json); ``pooling=None`` writes a bare transformers folder."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer_files(folder, model_type, generation, chat=False)
    cfg = encoder_config(model_type, generation, vocab=ids["vocab"])
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_weights(folder, encoder_weights(cfg, seed, prefix), shards)
    if pooling is not None:
        write_sentence_transformers_files(folder, pooling, normalize, generation)
    return folder


def write_sentence_transformers_files(folder: Path, pooling: str, normalize: bool, generation: int) -> None:
    """modules.json, 1_Pooling/config.json (2_Normalize/), sentence_bert_config.json as
    sentence-transformers writes them: version 2-3 for ``generation`` 4 (a boolean per pooling
    mode), version 6 for 5 (``pooling_mode``, module types under ``sentence_transformers.base``)."""
    old = generation == 4
    kinds = {"Transformer": "sentence_transformers.models.Transformer" if old else
             "sentence_transformers.base.modules.transformer.Transformer",
             "Pooling": "sentence_transformers.models.Pooling" if old else
             "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
             "Normalize": "sentence_transformers.models.Normalize" if old else
             "sentence_transformers.base.modules.normalize.Normalize"}
    modules = [{"idx": 0, "name": "0", "path": "", "type": kinds["Transformer"]},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": kinds["Pooling"]}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": kinds["Normalize"]})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    if old:
        keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens",
                "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
        cfg = {"word_embedding_dimension": HIDDEN, **{key: pooling == mode for mode, key in keys.items()},
               "include_prompt": True}
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    else:
        mode = {"mean_sqrt_len": "mean_sqrt_len_tokens"}.get(pooling, pooling)
        cfg = {"embedding_dimension": HIDDEN, "pooling_mode": mode, "include_prompt": True}
        (folder / "sentence_bert_config.json").write_text(json.dumps(
            {"transformer_task": "feature-extraction", "modality_config": {"text": {
                "method": "forward", "method_output_name": "last_hidden_state"}},
             "module_output_name": "token_embeddings"}, indent=4))
        if normalize:
            (folder / "2_Normalize").mkdir(exist_ok=True)
            (folder / "2_Normalize" / "config.json").write_text(json.dumps(
                {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=4))
