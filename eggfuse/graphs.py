"""Graph sources for the commands that optimise a graph (``eggfuse optimize``, ``eggfuse sweep``):
a shipped model, an ONNX file, or ``module:function`` returning a :class:`~eggfuse.ir.Graph`.

A shipped model's graph is built once per process and kept (``smollm2``'s config comes from
its GGUF file, whose reader takes seconds to parse the file); every caller gets the same
:class:`Graph`, which the rewrite engine does not modify (do not modify it either).
"""

from __future__ import annotations

import functools
import hashlib
import os

from eggfuse.ir import Graph, InputError
from eggfuse.ir.sources import call_without_arguments, named_object

SHIPPED = ("minilm", "smollm2", "llama:LAYERS")


def describe(spec: str) -> str:
    """What kind of source ``spec`` names: ``"onnx"`` (a name ending in .onnx, in any case, or another file that
    is not a .py one), ``"function"`` or ``"model"``."""
    if spec in ("minilm", "smollm2") or spec.startswith("llama:"):
        return "model"
    if spec.lower().endswith(".onnx") or (os.path.isfile(spec) and not spec.lower().endswith(".py")):
        return "onnx"
    if ":" in spec and not spec.startswith("llama:"):
        return "function"
    return "model"


def load_graph(spec: str, *, seq: int = 16, batch: int = 2, training: bool = False,
               shapes: dict[str, list[int]] | None = None, values: dict | None = None) -> tuple[Graph, dict]:
    """The graph ``spec`` names, and facts about its source (``source``; for an ONNX file
    ``onnx_nodes``, its node count, and ``origin``, graph node id -> the ONNX node it came from).

    ``spec``: a shipped model (``minilm``, ``smollm2``, ``llama:LAYERS``; ``seq``, ``batch``
    and ``training`` as :func:`eggfuse.api.model_graph`), an ``.onnx`` file (``shapes`` gives
    the symbolic input dimensions, 1 where not given; ``values`` inputs fixed at load time, as
    ``eggfuse.onnx.load(..., values=)``; ``input_shapes`` in ``source``: each graph input's shape as sized,
    ``defaulted``: the inputs with a dimension taken as 1), or ``module:function`` /
    ``path/to/file.py:function``: a function called with no arguments that returns a
    ``Graph`` (``training=True`` then appends its backward pass, as for a model).

    Raises :class:`~eggfuse.ir.InputError` for an unknown model, a shape for a name that is not
    an input of the ONNX file, a module or function that
    does not import, one that does not return a Graph, or ``training`` with an ONNX file;
    :class:`~eggfuse.ir.ModelError` when a model package is missing.
    """
    kind = describe(spec)
    if kind == "onnx":
        if training:
            raise InputError("--training applies to the shipped models and functions, not to an ONNX file")
        key = tuple(sorted((k, tuple(v)) for k, v in (shapes or {}).items()))
        if values:  # arrays: not a cache key
            from eggfuse.cli_onnx import onnx_graph

            graph, nodes, origin, defaulted = onnx_graph(spec, {k: list(v) for k, v in key}, values)
        else:
            graph, nodes, origin, defaulted = _onnx(spec, key)
        sized = {name: list(ty.shape) for name, ty in graph.inputs.items()}
        return graph, {"source": "onnx", "onnx_nodes": nodes, "origin": origin, "input_shapes": sized,
                       "defaulted": defaulted}
    if kind == "function":
        graph = from_function(spec)
        if training:
            from eggfuse.api import training_graph

            graph = training_graph(graph)
        return graph, {"source": "function"}
    if spec not in ("minilm", "smollm2") and not spec.startswith("llama:"):
        hint = " (a .py file names its function: file.py:function)" if spec.lower().endswith(".py") else ""
        raise InputError(f"unknown model {spec!r}{hint}: give minilm, smollm2, llama:LAYERS, an .onnx file, or "
                         "module:function (or file.py:function) returning an eggfuse Graph")
    return _model(spec, seq, batch, training), {"source": "model"}


@functools.lru_cache(maxsize=32)
def _model(spec: str, seq: int, batch: int, training: bool) -> Graph:
    from eggfuse.api import model_graph

    return model_graph(spec, seq=seq, batch=batch, training=training)


@functools.lru_cache(maxsize=8)
def _onnx(path: str, shapes: tuple) -> tuple[Graph, int, dict[int, str], list[str]]:
    from eggfuse.cli_onnx import onnx_graph

    return onnx_graph(path, {k: list(v) for k, v in shapes})


def from_function(spec: str) -> Graph:
    """Call ``module:function`` (a module importable, or in the current folder) or ``file.py:function`` with no
    arguments; its Graph. Raises InputError for a module that does not import, a missing or uncallable
    name, a function that needs arguments or returns no Graph."""
    fn = named_object(spec, "graph source", "function")
    if not callable(fn):
        where, _, name = spec.rpartition(":")
        raise InputError(f"graph source {spec!r}: {where} has no function {name!r}")
    graph = call_without_arguments(fn, spec, "graph source")
    if not isinstance(graph, Graph):
        name = getattr(fn, "__name__", spec)
        raise InputError(f"graph source {spec!r}: {name}() returned {type(graph).__name__}, not an eggfuse Graph")
    return graph


def graph_hash(graph: Graph) -> str:
    """A short hash of the live graph (ops, attributes, types, edges, outputs): equal graphs
    give equal hashes, so sweep rows of the same graph can be matched."""
    h = hashlib.sha256()
    for node in graph.live_nodes():
        attrs = sorted((k, repr(v)) for k, v in node.attrs.items())
        h.update(repr((node.id, node.op, tuple(node.inputs), str(node.type), attrs)).encode())
    h.update(repr(tuple(graph.outputs)).encode())
    return h.hexdigest()[:16]


__all__ = ["SHIPPED", "describe", "from_function", "graph_hash", "load_graph"]
