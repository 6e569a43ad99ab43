"""The compile cache: optimised graphs and lowered plans on disk, so that a process compiling a
graph an earlier process compiled skips the rewrite engine and lowering.

An entry is keyed by a SHA-256 of everything its contents depend on:

- the graph: every node's op, inputs, attributes and type (so leaf names and shapes), the
  constants' values and the outputs; never parameter values, which each session uploads;
- what reaches the rewrite engine (:func:`optimizer_identity`): the cost model (its class and
  attributes) and the rulesets (the shipped ones by default, else the text of their rules);
- the device (:func:`device_identity`): the adapter's description and the limits lowering
  reads, and whether reductions use subgroup operations and kernels keep naga's runtime checks
  (EGGFUSE_RUNTIME_CHECKS);
- whether the graph is fused, and the versions of eggfuse (its version and a digest of its
  source files, so an edited rule or kernel is a miss), egglog, wgpu-py and wgpu-native.

The folder is ``$EGGFUSE_CACHE`` when set, else platformdirs' user cache folder for eggfuse
(``~/.cache/eggfuse`` on Linux). An entry is one file, ``<key>.json``: a header line (the
format, the key, the SHA-256 and length of the body), then the body, JSON with arrays as
base64 of their bytes (dtype and shape beside them). Nothing in it can run code when loaded
(no pickle). An entry that does not check out (unreadable, a checksum or key that differs, a
graph whose shape rules disagree with its stored types, a plan that does not fit its graph)
is ignored with a warning, and the compile that follows rewrites it. Writes go to a temporary
file renamed into place, so a reader never sees half an entry; a folder that cannot be
written only costs the cache.

wgpu's own pipeline cache (``VkPipelineCache``, the adapter feature ``pipeline-cache``, which
lavapipe reports) is not used: wgpu-native 29 (wgpu-py 0.32) exposes the feature but no function
to create one (its library exports no ``wgpuDeviceCreatePipelineCache``, its pipeline
descriptors pass no cache, and wgpu-py has no ``GPUDevice.create_pipeline_cache``;
wgpu-native's open pull request 618 adds them). Mesa's drivers (lavapipe included) keep their
own on-disk shader cache.

The models that generation loads from GGUF files have a cache of their own in the same folder
(:mod:`eggfuse.model_cache`).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eggfuse.ir import DType, Graph, TensorType
from eggfuse.ir.spec import OPS
from eggfuse.lowering import ExecutionPlan
from eggfuse.lowering.limits import resolve_limits
from eggfuse.lowering.plan import BufferSpec, DerivedParameter, Dispatch, IndexPart

if TYPE_CHECKING:
    from eggfuse.rewrites import Report

log = logging.getLogger("eggfuse.cache")

#: The environment variable that moves the cache folder.
ENV = "EGGFUSE_CACHE"
#: The environment variable that sets the most megabytes of compile-cache entries kept (:data:`MAX_MB` by default).
MAX_ENV = "EGGFUSE_CACHE_MAX_MB"
#: Megabytes of compile-cache entries kept: past it a store removes the least recently used entries (loading one
#: marks it used) down to 90% of it. An entry of MiniLM or SmolLM2 holds about 0.3 to 0.5 MB; one is written for
#: each new shape a model runs at (a sentence length, a prompt length), so the folder grew without end.
MAX_MB = 1024
#: The entry format; part of every key, so a new format never reads an old entry.
FORMAT = 10  # 10: the plan's unused inputs and parameters apart (9: unused leaves with their types)
_ENTRY = re.compile(r"^[0-9a-f]{64}\.json$")
_TEMP = re.compile(r"^\.[0-9a-f]{64}\.\d+\.tmp$")
#: The packages whose source files the eggfuse digest covers.
_PACKAGES = ("eggfuse", "eggfuse.ir", "eggfuse.rewrites", "eggfuse.lowering", "eggfuse.runtime", "eggfuse.shaders",
             "eggfuse.models")
_ARRAY_DTYPES = {np.dtype(t).str for t in (np.float32, np.float64, np.uint32, np.int32, np.int64, np.bool_)}


class CorruptEntry(Exception):
    """An entry that does not check out (internal: it is ignored and rewritten)."""


class Unstorable(Exception):
    """A compile the cache cannot key or store: a value that is not plain data (internal: the
    compile runs uncached)."""


def _max_bytes() -> int:
    # MAX_MB, or $EGGFUSE_CACHE_MAX_MB, in bytes
    text = os.environ.get(MAX_ENV)
    if not text:
        return MAX_MB * 2**20
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        from eggfuse.ir import InputError

        raise InputError(f"${MAX_ENV} is the most megabytes of compile-cache entries kept: a positive number, got "
                         f"{text!r}")
    return int(value * 2**20)


def not_a_folder(folder: Path) -> str:
    """Why ``folder`` cannot be a cache folder where it, or a folder above it, is a file ("" otherwise): a
    bare ``[Errno 17] File exists`` says neither which nor what to do."""
    for p in (folder, *folder.parents):
        if p.exists() and not p.is_dir():
            return f"{p} is a file, not a folder; point ${ENV} at a folder"
    return ""


def cache_dir() -> Path:
    """The cache folder: ``$EGGFUSE_CACHE`` when set, else platformdirs' user cache folder."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("eggfuse", appauthor=False))


# --- what a key holds -----------------------------------------------------------------------


@functools.cache
def source_digest() -> str:
    """SHA-256 of eggfuse's source files (``*.py``, ``*.wgsl``: paths and contents)."""
    h = hashlib.sha256()
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in spec.submodule_search_locations if spec is not None else ():
            root = Path(folder)
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".wgsl") and "__pycache__" not in path.parts:
                    h.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
                    h.update(path.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def versions() -> dict[str, str]:
    """The versions a compiled result depends on: eggfuse (version + source digest), egglog,
    wgpu-py and wgpu-native."""
    try:
        from wgpu.backends import wgpu_native

        native = str(getattr(wgpu_native, "__version__", "unknown"))
    except ImportError:
        native = "none"
    return {"eggfuse": f"{_version('eggfuse')}+{source_digest()[:16]}", "egglog": _version("egglog"),
            "wgpu": _version("wgpu"), "wgpu-native": native}


def device_identity(device) -> dict[str, Any]:
    """What of ``device`` a plan depends on: the adapter's description (every field of
    ``adapter.info``) and the limits lowering reads (``lowering.limits.resolve_limits``)."""
    info = device.adapter.info
    return {"adapter": {str(k): str(info[k]) for k in sorted(info)},
            "limits": resolve_limits(dict(device.limits))}


def _code_identity(cls: type) -> list:
    # The classes of an object outside eggfuse, by name and source text (eggfuse's own are
    # covered by the source digest of versions()).
    out = []
    for c in cls.__mro__[:-1]:
        entry = [c.__module__, c.__qualname__]
        if c.__module__.split(".")[0] != "eggfuse":
            try:
                entry.append(hashlib.sha256(inspect.getsource(c).encode()).hexdigest())
            except (OSError, TypeError):
                raise Unstorable(f"the source of {c.__qualname__} is not available") from None
        out.append(entry)
    return out


def optimizer_identity(args: Mapping[str, Any]) -> dict[str, Any]:
    """The key's part for the arguments that reach the rewrite engine (``cost_model=``,
    ``rulesets=``; None: the shipped ones, covered by the source digest). A cost model is its
    classes (their source text, outside eggfuse) and attributes, rulesets the text of their
    rules (a shipped one its name: the source digest covers it); any other argument must be plain
    data. Code a cost model calls outside its own classes is not covered: compile with
    ``cache=False`` while changing such code. Raises :class:`Unstorable` for what cannot be keyed."""
    out: dict[str, Any] = {}
    for name, value in sorted(args.items()):
        if value is None:
            out[name] = "shipped"
        elif name == "cost_model":
            out[name] = {"classes": _code_identity(type(value)), "attributes": _plain(vars(value), digest=True)}
        elif name == "rulesets":
            from eggfuse.rewrites.rulesets import fingerprint, shipped_name

            # a shipped ruleset by its name (the source digest covers its rules; its text would build a lazy
            # one's rules, seconds for conv_epilogue), any other by the text of its rules
            out[name] = [f"shipped:{n}" if (n := shipped_name(r)) else
                         hashlib.sha256(fingerprint(r).encode()).hexdigest() for r in value]
        else:
            out[name] = _plain(value, digest=True)
    return out


def entry_key(graph: Graph, *, fuse: bool, optimizer: Mapping[str, Any], device: Mapping[str, Any],
              subgroups: bool, runtime_checks: bool = False, constant_params: bool = False,
              transpose_weights: bool = True) -> str:
    """The key (64 hex digits) of compiling ``graph``: see the module docstring. ``device`` is
    :func:`device_identity`'s dict. Raises :class:`Unstorable` for a graph or optimiser
    argument that is not plain data."""
    doc = {"format": FORMAT, "versions": versions(), "graph": encode_graph(graph, digest=True), "fuse": bool(fuse),
           "optimizer": optimizer_identity(optimizer) if fuse else None, "device": dict(device),
           "subgroups": bool(subgroups), "runtime_checks": bool(runtime_checks),
           "constant_params": bool(constant_params), "transpose_weights": bool(transpose_weights)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- plain data <-> JSON --------------------------------------------------------------------


def _array(a: np.ndarray, digest: bool) -> dict:
    a = np.ascontiguousarray(a)
    if a.dtype.str not in _ARRAY_DTYPES:
        raise Unstorable(f"an array of dtype {a.dtype}")
    data = a.tobytes()
    body = hashlib.sha256(data).hexdigest() if digest else base64.b64encode(data).decode()
    return {"array": a.dtype.str, "shape": list(a.shape), "sha256" if digest else "data": body}


def _plain(v: Any, digest: bool = False) -> Any:
    """``v`` as JSON data, tagged where JSON has no type of its own (``digest``: arrays by hash)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, tuple):
        return {"tuple": [_plain(x, digest) for x in v]}
    if isinstance(v, list):
        return {"list": [_plain(x, digest) for x in v]}
    if isinstance(v, dict):
        return {"dict": [[_plain(k, digest), _plain(x, digest)] for k, x in v.items()]}
    if isinstance(v, frozenset):  # in a canonical order: a set's iteration order varies between processes
        return {"frozenset": sorted((_plain(x, digest) for x in v), key=lambda e: json.dumps(e, sort_keys=True))}
    if isinstance(v, TensorType):
        return {"type": [list(v.shape), v.dtype.value]}
    if isinstance(v, DType):
        return {"dtype": v.value}
    if isinstance(v, np.ndarray):
        return _array(v, digest)
    raise Unstorable(f"a value of type {type(v).__name__}")


def _value(v: Any) -> Any:
    """The value :func:`_plain` encoded (without ``digest``). Raises CorruptEntry."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if not isinstance(v, dict) or len(v) == 0:
        raise CorruptEntry(f"unexpected value {v!r:.80}")
    if "tuple" in v:
        return tuple(_value(x) for x in v["tuple"])
    if "list" in v:
        return [_value(x) for x in v["list"]]
    if "dict" in v:
        return {_value(k): _value(x) for k, x in v["dict"]}
    if "frozenset" in v:
        return frozenset(_value(x) for x in v["frozenset"])
    if "type" in v:
        return _type(v["type"])
    if "dtype" in v:
        return DType(v["dtype"])
    if "array" in v:
        if v["array"] not in _ARRAY_DTYPES:
            raise CorruptEntry(f"an array of dtype {v['array']!r}")
        a = np.frombuffer(base64.b64decode(v["data"], validate=True), dtype=np.dtype(v["array"]))
        a = a.reshape([_int(d) for d in v["shape"]]).copy()
        a.setflags(write=False)
        return a
    raise CorruptEntry(f"unexpected value {v!r:.80}")


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise CorruptEntry(f"expected an integer, got {v!r:.40}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise CorruptEntry(f"expected true or false, got {v!r:.40}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise CorruptEntry(f"expected a string, got {v!r:.40}")
    return v


def _type(v: Any) -> TensorType:
    shape, dtype = v
    return TensorType(tuple(_int(d) for d in shape), DType(dtype))


def encode_graph(graph: Graph, *, digest: bool = False) -> dict:
    """``graph`` as JSON data: nodes as [op, inputs, attributes, type], and the outputs
    (``digest``: constants' values by hash, for keys). Raises Unstorable."""
    nodes = [[n.op, list(n.inputs), {k: _plain(v, digest) for k, v in n.attrs.items()}, _plain(n.type)]
             for n in graph.nodes]
    return {"nodes": nodes, "outputs": list(graph.outputs)}


def decode_graph(doc: dict) -> Graph:
    """The graph :func:`encode_graph` encoded, rebuilt through the IR's builders (every shape
    rule checked again, every node's type compared with the stored one). Raises CorruptEntry."""
    g = Graph()
    for op, inputs, attrs, ty in doc["nodes"]:
        attrs = {_str(k): _value(v) for k, v in attrs.items()}
        want = _value(ty)
        if op == "Input":
            nid = g.input(attrs["name"], want.shape, want.dtype)
        elif op == "Parameter":
            nid = g.state(attrs["name"], want.shape) if attrs.get("state") else \
                g.parameter(attrs["name"], want.shape, want.dtype)
        elif op == "Constant":
            nid = g.constant(attrs["value"], shape=want.shape, dtype=want.dtype)
        elif op in OPS and not OPS[op].leaf:
            nid = g.add_node(op, [_int(i) for i in inputs], **attrs)
        else:
            raise CorruptEntry(f"unknown op {op!r:.40}")
        node = g.node(nid)
        if node.type != want or node.attrs.get("name") != attrs.get("name"):
            raise CorruptEntry(f"{node.describe()} does not match its stored type {want}")
    g.set_outputs([_int(o) for o in doc["outputs"]])
    return g


_PLAN_FIELDS = {"buffers", "dispatches", "inputs", "parameters", "constants", "outputs", "output_types",
                "unused_inputs", "unused_parameters", "index_bounds", "index_readers", "index_parts", "derived",
                "limits", "state", "subgroups", "storage", "storage_sizes"}


def encode_plan(plan: ExecutionPlan) -> dict:
    """``plan`` as JSON data (each WGSL source stored once). Raises Unstorable for a plan with
    fields this module does not know."""
    unknown = {f.name for f in fields(ExecutionPlan)} - _PLAN_FIELDS
    if unknown:
        raise Unstorable(f"ExecutionPlan fields the cache does not store: {sorted(unknown)}")
    sources: dict[str, int] = {}
    dispatches = [[d.node, d.op, d.kernel, sources.setdefault(d.source, len(sources)), d.entry_point,
                   list(d.bindings), base64.b64encode(d.params).decode(), list(d.workgroups), d.label,
                   list(d.writable), list(d.prefetch), bool(d.runtime_checks), int(d.loop_iterations)]
                  for d in plan.dispatches]
    return {
        "buffers": [[b.index, b.size_bytes, b.dtype.value, b.kind, b.name, b.node, list(b.shape),
                     list(b.window) if b.window else None] for b in plan.buffers],
        "sources": list(sources), "dispatches": dispatches,
        "inputs": plan.inputs, "parameters": plan.parameters,
        "constants": [[i, _array(a, False)] for i, a in plan.constants.items()],
        "outputs": plan.outputs, "output_types": [_plain(t) for t in plan.output_types],
        "unused_inputs": [[name, _plain(t)] for name, t in sorted(plan.unused_inputs.items())],
        "unused_parameters": [[name, _plain(t)] for name, t in sorted(plan.unused_parameters.items())],
        "index_bounds": plan.index_bounds,
        "index_readers": plan.index_readers,
        "index_parts": {name: [[p.rows, _array(p.positions, False), p.reader] for p in parts]
                        for name, parts in plan.index_parts.items()},
        "derived": [[i, list(d.sources), d.axis, d.store, d.transpose] for i, d in plan.derived.items()],
        "limits": plan.limits, "state": sorted(plan.state), "subgroups": plan.subgroups,
        "storage": [[i, j] for i, j in plan.storage.items()], "storage_sizes": plan.storage_sizes,
    }


def decode_plan(doc: dict, graph: Graph) -> ExecutionPlan:
    """The plan :func:`encode_plan` encoded, checked against ``graph`` (the graph it runs):
    buffers of its nodes' types, bindings and outputs in range. Raises CorruptEntry."""
    sources = [_str(s) for s in doc["sources"]]
    buffers = [BufferSpec(_int(i), _int(size), DType(dt), _str(kind), _str(name), _int(node),
                          tuple(_int(d) for d in shape), None if window is None else (_int(window[0]), _int(window[1])))
               for i, size, dt, kind, name, node, shape, window in doc["buffers"]]
    dispatches = [Dispatch(_int(node), _str(op), _str(kernel), sources[_int(src)], _str(entry),
                           tuple(_int(b) for b in binds), base64.b64decode(params, validate=True),
                           tuple(_int(w) for w in wg), _str(label), tuple(_int(i) for i in writable),
                           tuple(_int(i) for i in prefetch), _bool(checks), _int(loops))
                  for node, op, kernel, src, entry, binds, params, wg, label, writable, prefetch, checks, loops
                  in doc["dispatches"]]
    names = lambda m: {_str(k): _int(v) for k, v in m.items()}  # noqa: E731
    plan = ExecutionPlan(
        buffers=buffers, dispatches=dispatches, inputs=names(doc["inputs"]), parameters=names(doc["parameters"]),
        constants={_int(i): _value(a) for i, a in doc["constants"]}, outputs=[_int(o) for o in doc["outputs"]],
        output_types=[_value(t) for t in doc["output_types"]],
        unused_inputs={_str(n): _value(t) for n, t in doc["unused_inputs"]},
        unused_parameters={_str(n): _value(t) for n, t in doc["unused_parameters"]},
        index_bounds=names(doc["index_bounds"]),
        index_readers={_str(k): _str(v) for k, v in doc["index_readers"].items()},
        index_parts={_str(name): [IndexPart(_int(rows), _positions(pos), _str(reader)) for rows, pos, reader in parts]
                     for name, parts in doc["index_parts"].items()},
        derived={_int(i): DerivedParameter(tuple(_str(s) for s in srcs), _int(axis), _str(store), bool(transpose))
                 for i, srcs, axis, store, transpose in doc["derived"]},
        limits=names(doc["limits"]), state=frozenset(_str(n) for n in doc["state"]),
        subgroups=bool(doc["subgroups"]), storage={_int(i): _int(j) for i, j in doc["storage"]},
        storage_sizes=[_int(s) for s in doc["storage_sizes"]])
    _check_plan(plan, graph)
    return plan


def _is_node_buffer(b, graph: Graph) -> bool:
    # a node's scratch buffer (lowering.plan: Kernel.scratch), a flat f32 intermediate, or its
    # counters (Kernel.counters), a flat u32 buffer of kind 'counters'
    op = graph.node(b.node).op
    return len(b.shape) == 1 and ((b.kind, b.dtype, b.name) == ("intermediate", DType.F32, f"{op}%{b.node}.scratch")
                                  or (b.kind, b.dtype, b.name) == ("counters", DType.U32, f"{op}%{b.node}.counters"))


def _is_transposed_weight(plan: ExecutionPlan, b, graph: Graph) -> bool:
    # a weight the tiled matmul reads stored [K, N] (lowering.layout): a derived parameter, packed transposed,
    # of the weight's transposed type
    d = plan.derived.get(b.index)
    t = graph.node(b.node).type
    return (b.kind == "derived" and d is not None and d.transpose and len(b.shape) == 2
            and (b.shape[::-1], b.dtype) == (t.shape, t.dtype))


def _positions(v: Any) -> np.ndarray:
    a = _value(v)
    if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != 1:
        raise CorruptEntry("an index part's positions are not a list of int64")
    return a


def _check_plan(plan: ExecutionPlan, graph: Graph) -> None:
    n = len(plan.buffers)
    for i, b in enumerate(plan.buffers):
        if b.window is not None:  # bytes of a weight's buffer, or a view's (Select) of another value's
            base = plan.buffers[b.window[0]] if 0 <= b.window[0] < n else None
            src = graph.node(b.node) if 0 <= b.node < len(graph.nodes) else None
            view = src is not None and OPS[src.op].view
            while src is not None and (OPS[src.op].view or OPS[src.op].writes is not None):
                # the value whose buffer a view's window is of (an in-place update's value is in its input's)
                src = graph.node(src.inputs[0 if OPS[src.op].view else OPS[src.op].writes])
            if (b.kind != "window" or base is None or base.window is not None or src is None or base.node != src.id
                    or base.kind not in ("parameter", "derived", "constant",
                                         *(("intermediate", "input") if view else ()))
                    or b.window[1] < 0 or b.window[1] + b.size_bytes > base.size_bytes or b.dtype != base.dtype):
                raise CorruptEntry(f"buffer {i} is not a window of a weight of the plan, nor a view of a value")
        elif b.kind == "window":
            raise CorruptEntry(f"buffer {i} is a window of nothing")
        if b.index != i or not 0 <= b.node < len(graph.nodes) or (b.type != graph.node(b.node).type
                                                                   and not _is_node_buffer(b, graph) and not b.window
                                                                   and not _is_transposed_weight(plan, b, graph)):
            raise CorruptEntry(f"buffer {i} does not hold a value of the graph")
        if b.size_bytes < max(4, b.type.size_bytes) or b.size_bytes % 4:
            raise CorruptEntry(f"buffer {i} has {b.size_bytes} bytes for {b.type}")
    for d in plan.dispatches:
        if not d.bindings or any(not 0 <= i < n for i in d.bindings + d.prefetch) or len(d.workgroups) != 3 \
                or min(d.workgroups) < 1 or len(d.params) % 16 \
                or any(not 0 <= i < len(d.bindings) - 1 for i in d.writable) \
                or any(plan.buffers[i].kind not in ("parameter", "derived", "constant") for i in d.prefetch):
            raise CorruptEntry(f"dispatch {d.label!r:.60} does not fit the plan's buffers")
    leaves = {x.attrs["name"]: x.type for x in graph.nodes if x.op in ("Input", "Parameter")}
    kinds = {x.attrs["name"]: x.op for x in graph.nodes if x.op in ("Input", "Parameter")}
    for name, i in {**plan.inputs, **plan.parameters}.items():
        if not 0 <= i < n or leaves.get(name) != plan.buffers[i].type:
            raise CorruptEntry(f"leaf {name!r} does not match the graph's")
    if any(leaves.get(name) != t or kinds[name] != op
           for op, unused in (("Input", plan.unused_inputs), ("Parameter", plan.unused_parameters))
           for name, t in unused.items()) \
            or any(not 0 <= i < n for i in (*plan.outputs, *plan.constants, *plan.derived, *plan.storage)):
        raise CorruptEntry("the plan's leaves or outputs do not match the graph's")
    if plan.output_types != [graph.node(o).type for o in graph.outputs]:
        raise CorruptEntry("the plan's outputs do not match the graph's")
    if any(not 0 <= j < len(plan.storage_sizes) for j in plan.storage.values()):
        raise CorruptEntry("the plan's shared storage does not match its allocations")
    for name, parts in plan.index_parts.items():
        if name not in plan.inputs or any(len(p.positions) and not 0 <= int(p.positions.min()) <= int(
                p.positions.max()) < leaves[name].num_elements for p in parts):
            raise CorruptEntry(f"the index parts of input {name!r} do not fit it")


# --- the folder -----------------------------------------------------------------------------


@dataclass
class Loaded:
    """An entry read back: ``graph`` and its ``report`` (None for an unfused compile) and
    ``plan``; seconds spent: ``optimize_s`` (from the caller's start: key, read, checksum,
    graph and report), ``lower_s`` (the plan)."""

    graph: Graph | None
    report: Report | None
    plan: ExecutionPlan
    optimize_s: float
    lower_s: float


class CompileCache:
    """The entries in ``folder`` (default :func:`cache_dir`), at most ``$EGGFUSE_CACHE_MAX_MB`` (:data:`MAX_MB`)
    megabytes of them. Raises InputError for a ``$EGGFUSE_CACHE_MAX_MB`` that is not a positive number (before
    any compile work, which makes the cache first); with ``check_limit=False`` (``eggfuse cache``: listing and
    clearing need no limit) only when :meth:`trim` needs it."""

    def __init__(self, folder: str | os.PathLike | None = None, *, check_limit: bool = True) -> None:
        self.folder = Path(folder) if folder is not None else cache_dir()
        self.max_bytes = _max_bytes() if check_limit else None

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def load(self, key: str, *, runs: Graph | None = None, started: float | None = None) -> Loaded | None:
        """The entry of ``key``, or None when there is none or it does not check out (then a
        warning names the reason; the caller's compile rewrites it). ``runs`` is the graph
        that runs when the entry holds none (an unfused compile); ``started`` is when the
        caller began (perf_counter), counted into ``optimize_s``."""
        t = time.perf_counter() if started is None else started
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            if not not_a_folder(self.folder):  # else the store's warning names the file in the way: one a compile
                log.warning("eggfuse: cannot read compile-cache entry %s (%s); compiling instead", path, e)
            return None
        try:
            body = verified_body(raw, key)
            graph = report = None
            if runs is None:
                graph, report = decode_graph(body["graph"]), _report(body["report"])
            t_plan = time.perf_counter()
            plan = decode_plan(body["plan"], graph if runs is None else runs)
        except Exception as e:  # noqa: BLE001 - any failure to read an entry back means: ignore it
            log.warning("eggfuse: ignoring compile-cache entry %s (%s: %s); it is rewritten", path,
                        type(e).__name__, e)
            return None
        with contextlib.suppress(OSError):  # used now: the last that a trim removes
            os.utime(path)
        return Loaded(graph, report, plan, t_plan - t, time.perf_counter() - t_plan)

    def trim(self, max_bytes: int | None = None, keep: Path | None = None) -> int:
        """Remove the least recently used entries (by modification time, which :meth:`load` renews) while the
        entries hold more than ``max_bytes`` (default :attr:`max_bytes`), down to 90% of it, never the entry at
        ``keep`` (the one just stored); returns how many were removed. An entry another process removes
        meanwhile is skipped."""
        if max_bytes is None:
            max_bytes = self.max_bytes if self.max_bytes is not None else _max_bytes()
        sized = []
        for p in self.entries():
            with contextlib.suppress(OSError):
                st = p.stat()
                sized.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in sized)
        removed = 0
        if total <= max_bytes:
            return 0
        for _, size, p in sorted(sized, key=lambda e: e[0]):
            if total <= 0.9 * max_bytes:
                break
            if p == keep:
                continue
            with contextlib.suppress(OSError):
                p.unlink()
                removed += 1
            total -= size
        return removed

    def store(self, key: str, graph: Graph | None, report: Report | None, plan: ExecutionPlan) -> Path | None:
        """Write the entry of ``key`` (``graph`` and ``report`` None for an unfused compile);
        returns its path, or None when it could not be written (logged)."""
        try:
            body = json.dumps({"key": key, "graph": None if graph is None else encode_graph(graph),
                               "report": None if report is None else report.to_dict(), "plan": encode_plan(plan),
                               "versions": versions(), "created": time.time()}, separators=(",", ":")).encode()
        except (Unstorable, TypeError, ValueError) as e:
            log.info("eggfuse: not caching this compile: %s", e)
            return None
        path = self.path(key)
        try:
            write_replacing(path, self.folder / f".{key}.{os.getpid()}.tmp", framed("eggfuse_cache", FORMAT, key, body))
        except OSError as e:
            log.warning("eggfuse: cannot write the compile cache in %s (%s); continuing without it", self.folder,
                        not_a_folder(self.folder) or e)
            return None
        self.trim(keep=path)
        return path

    def entries(self) -> list[Path]:
        """The entry files, by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if _ENTRY.match(p.name) and p.is_file())

    def describe(self) -> list[dict[str, Any]]:
        """One dict per entry, the most recently used first (the order :meth:`trim` keeps them in): ``key``,
        ``bytes`` (file size), ``used`` (POSIX seconds: its last load or write), ``created`` (POSIX seconds),
        ``fused`` (whether it holds a rewritten graph), ``inputs`` (the graph's input names and shapes),
        ``parameters`` and ``outputs`` (counts), ``dispatches`` (the plan's), ``eggfuse`` (the version that
        wrote it); or, for an entry that does not check out (a compile with its key rewrites it), ``key``,
        ``bytes``, ``used`` and ``error`` (why). Reads every entry whole; changes none (not even its time of
        use)."""
        out = []
        for path in self.entries():
            try:
                st = path.stat()
            except OSError:  # removed meanwhile
                continue
            row: dict[str, Any] = {"key": path.stem, "bytes": st.st_size, "used": st.st_mtime}
            try:
                body = verified_body(path.read_bytes(), path.stem)
                plan = body["plan"]
                shapes = {b[0]: b[6] for b in plan["buffers"]}
                row |= {"created": float(body["created"]), "fused": body["graph"] is not None,
                        "inputs": {name: shapes.get(i) for name, i in plan["inputs"].items()},
                        "parameters": len(plan["parameters"]), "outputs": len(plan["outputs"]),
                        "dispatches": len(plan["dispatches"]), "eggfuse": body["versions"].get("eggfuse")}
            except Exception as e:  # noqa: BLE001 - any failure to read an entry: report it, as load ignores it
                row["error"] = f"{type(e).__name__}: {e}"
            out.append(row)
        return sorted(out, key=lambda r: -r["used"])

    def info(self) -> dict[str, Any]:
        """``folder`` (str), ``entries`` (count) and ``bytes`` (their total size)."""
        entries = self.entries()
        return {"folder": str(self.folder), "entries": len(entries), "bytes": sum(p.stat().st_size for p in entries)}

    def clear(self) -> int:
        """Remove every entry (and temporary files a killed write left); returns the number of
        entries removed. Other files in the folder are left alone."""
        removed = 0
        for p in self.entries():
            p.unlink(missing_ok=True)
            removed += 1
        if self.folder.is_dir():
            for p in self.folder.iterdir():
                if _TEMP.match(p.name):
                    p.unlink(missing_ok=True)
        return removed


def write_replacing(path: Path, temp: Path, data: bytes) -> None:
    """Write ``data`` to ``temp`` (its folder made first) and rename it onto ``path``, so that a reader
    sees the old file or the whole new one; on OSError the temporary file is removed and the error
    raised (the caches' writes)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(data)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        raise


def framed(tag: str, fmt: int, key: str, body: bytes, **extra: Any) -> bytes:
    """An entry file's bytes: a JSON header line (``tag``: the format ``fmt``, the key, the body's
    SHA-256 and length, ``extra``), then ``body`` (the compile cache's and the model cache's)."""
    header = {tag: fmt, "key": key, "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body), **extra}
    return json.dumps(header).encode() + b"\n" + body


def verified_body(raw: bytes, key: str, tag: str = "eggfuse_cache", fmt: int = FORMAT) -> dict:
    """The JSON body of entry bytes :func:`framed` wrote for ``key``; :class:`CorruptEntry` when the
    header names another format or key, the checksum fails, or the body holds another key."""
    head, sep, body = raw.partition(b"\n")
    if not sep:
        raise CorruptEntry("no header line")
    header = json.loads(head)
    if header.get(tag) != fmt or header.get("key") != key:
        raise CorruptEntry("another format or key")
    if header.get("bytes") != len(body) or header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise CorruptEntry("checksum mismatch")
    doc = json.loads(body)
    if doc.get("key") != key:
        raise CorruptEntry("the body holds another key")
    return doc


def _report(doc: dict | None) -> Report | None:
    from eggfuse.rewrites.report import Report  # plain data: no egglog

    return None if doc is None else Report.from_dict(doc)


__all__ = ["ENV", "MAX_ENV", "MAX_MB", "CompileCache", "Loaded", "cache_dir", "device_identity", "entry_key",
           "optimizer_identity", "versions"]
