"""The pipeline in one place: Graph -> egglog optimisation -> lowering -> wgpu Session."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from eggfuse.ir import Graph, InputError
from eggfuse.ir.reference import check_mapping

if TYPE_CHECKING:
    from eggfuse.rewrites import CostModel, Report


@dataclass
class Compiled:
    """A graph compiled for a device: run it with :meth:`run`.

    ``graph`` is the graph that runs (the optimised one unless ``fuse=False``), ``report``
    the rewrite engine's :class:`~eggfuse.rewrites.Report` (None when not fused).
    ``dispatches_unfused`` / ``dispatches_fused`` count GPU dispatches per run of the
    original and the compiled graph. ``timings`` holds seconds per stage.
    """

    graph: Graph
    session: object
    report: Report | None
    dispatches_unfused: int
    dispatches_fused: int
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def adapter(self) -> str:
        return self.session.adapter

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs (float32 / uint32 numpy arrays, in graph output order) for ``inputs``."""
        return self.session.run(inputs)


def compile(graph: Graph, params: Mapping[str, np.ndarray], *, fuse: bool = True,
            cost_model: CostModel | None = None, verify: bool = False, device=None) -> Compiled:
    """Optimise ``graph`` with the egglog rulesets (``fuse=True``), lower it and upload ``params``.

    Raises :class:`~eggfuse.ir.GraphError` for a graph without outputs,
    :class:`~eggfuse.ir.InputError` for ``params`` that is not a mapping and for missing or
    mis-shaped parameters,
    :class:`~eggfuse.ir.RewriteError` if ``verify=True`` finds the optimised graph differs,
    :class:`~eggfuse.ir.LoweringError` when the device's limits are exceeded and
    :class:`~eggfuse.ir.DeviceError` when no wgpu adapter exists. ``graph`` and ``params``
    are not modified.
    """
    from eggfuse.runtime import Session  # wgpu is only imported when something runs

    graph.check_outputs()  # both checked before the (slower) optimisation
    check_mapping("parameter", params, graph.parameters)
    timings: dict[str, float] = {}
    report = None
    run_graph = graph
    if fuse:
        from eggfuse.rewrites import optimize

        t = time.perf_counter()
        run_graph, report = optimize(graph, cost_model=cost_model, verify=verify)
        timings["optimize_s"] = time.perf_counter() - t
    t = time.perf_counter()
    session = Session(run_graph, params, device=device)
    timings["compile_s"] = time.perf_counter() - t
    return Compiled(run_graph, session, report, graph.dispatch_count(), run_graph.dispatch_count(), timings)


@functools.cache
def _minilm():
    from eggfuse.models.minilm import MiniLM

    return MiniLM.load()


@dataclass
class EmbedResult:
    """Sentence embeddings: ``embeddings`` float32 [B, 384], unit L2 norm per row."""

    sentences: list[str]
    embeddings: np.ndarray
    adapter: str
    dispatches_unfused: int
    dispatches_fused: int
    report: Report | None
    timings: dict[str, float]
    profile: object | None = None  # runtime.profile.Profile when asked for

    def similarity(self) -> np.ndarray:
        """Cosine similarity matrix [B, B] (the embeddings are normalised, so a dot product)."""
        e = self.embeddings.astype(np.float64)
        return e @ e.T

    def to_dict(self) -> dict:
        return {
            "sentences": self.sentences,
            "embeddings": self.embeddings.tolist(),
            "similarity": self.similarity().tolist(),
            "adapter": self.adapter,
            "dispatches_unfused": self.dispatches_unfused,
            "dispatches_fused": self.dispatches_fused,
            "report": None if self.report is None else self.report.to_dict(),
            "timings": self.timings,
            "profile": None if self.profile is None else [
                {"kernel": k.kernel, "op": k.label, "gpu_ms": k.gpu_ms} for k in self.profile.kernels],
        }


def embed(sentences: Sequence[str], *, fuse: bool = True, device=None, profile: bool = False) -> EmbedResult:
    """Embed sentences with all-MiniLM-L6-v2 (real weights) compiled by eggfuse and run on wgpu.

    Tokenisation, BERT encoder, mean pooling over real tokens and L2 normalisation, as
    sentence-transformers computes them (Reimers & Gurevych 2019). Returns an
    :class:`EmbedResult` with float32 embeddings [len(sentences), 384].

    Raises :class:`~eggfuse.ir.InputError` for an empty list or a non-string item,
    :class:`~eggfuse.ir.ModelError` when the weights package is not installed,
    :class:`~eggfuse.ir.DeviceError` when no wgpu adapter exists. ``profile=True`` also
    times every dispatch on the GPU (timestamp queries; ``result.profile``).
    """
    if isinstance(sentences, str):
        raise InputError("sentences must be a list of strings, got a single str")
    sentences = list(sentences)
    t = time.perf_counter()
    model = _minilm()
    load_s = time.perf_counter() - t
    graph, feeds = model.graph_for(sentences)
    compiled = compile(graph, model.params, fuse=fuse, device=device)
    t = time.perf_counter()
    (emb,) = compiled.run(feeds)
    run_s = time.perf_counter() - t
    timings = {"load_s": load_s, **compiled.timings, "run_s": run_s}
    prof = None
    if profile:
        from eggfuse.runtime.profile import profile as profile_session

        prof = profile_session(compiled.session, feeds)
    return EmbedResult(sentences, emb, compiled.adapter, compiled.dispatches_unfused, compiled.dispatches_fused,
                       compiled.report, timings, prof)


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
        from eggfuse.models import llama

        if spec == "smollm2":
            config, layers = llama.LlamaConfig.from_gguf(llama.find_gguf()), None
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


def training_graph(forward: Graph, loss: str = "cross_entropy") -> Graph:
    """Forward + backward graph: a loss on ``forward``'s first output, and the gradient of
    every parameter (outputs ``[loss, *grads]``, see :func:`eggfuse.ir.autodiff.grad`).

    ``loss="cross_entropy"``: CrossEntropyLoss of the output (logits [M, V]) against an
    input ``labels`` [M, V] (one-hot rows); ``"mse"``: mean((y - target)^2) against an input
    ``target`` of the output's shape. ``forward`` is not modified.
    """
    from eggfuse.ir.autodiff import grad

    g = forward.pruned()
    (y,) = g.outputs[:1]
    shape = g.node(y).type.shape
    if loss == "cross_entropy":
        value = g.add_node("CrossEntropyLoss", (y, g.input("labels", shape)))
    elif loss == "mse":
        diff = g.add(y, g.neg(g.input("target", shape)))
        value = g.mean_all(g.mul(diff, diff))
    else:
        raise InputError(f"unknown loss {loss!r}: use cross_entropy or mse")
    g.set_outputs([value])
    return grad(g, value)
