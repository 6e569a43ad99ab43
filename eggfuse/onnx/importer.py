"""ONNX ModelProto -> eggfuse Graph, specialised to static input shapes.

The import walks the graph's nodes in order. Each value is a :class:`Value`: its ONNX element
type and static shape, and its contents when they are known at load time (initializers,
``Constant`` nodes and whatever is computed from them alone) or the IR node computing it.
A node whose inputs are all known is folded at load time by onnx's reference evaluator
(shape arithmetic: ``Shape``, ``Gather``, ``Concat``, ``Range``, ...); any other node goes to
its converter (``eggfuse.onnx.ops``), which adds IR nodes. An op type without a converter is
expanded when the ONNX standard defines it as a function of other ops. An ``If`` whose
condition is known is inlined; Scan and Loop are unrolled (``eggfuse.onnx.control``).

ONNX int64 tensors become I32 (WGSL has no 64-bit integers): a known value out of the int32
range is an :class:`~eggfuse.ir.OnnxError` naming the tensor; fed values are checked at run
time. DOUBLE, FLOAT16 and BFLOAT16 tensors are computed in float32 (:data:`COMPUTED_IN_F32`).
Float initializers become parameters, named as in the model, except those a value fact
describes (``eggfuse.ir.facts``: one-element scalars, causal masks, RoPE tables, folded or not):
those stay constants, whose values the rewrite rules read (the value facts ``eggfuse.rewrites.encode``
writes), never a parameter's; and a tied table's transposed copy (:func:`transposed_copies`: an LM
head's W^T beside the embedding's W), which is read as ``Transpose(W)``, so the table is stored once.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from eggfuse.ir import (
    OPS,
    DamagedFileError,
    DType,
    Graph,
    GraphError,
    IndexRangeError,
    LoweringError,
    OnnxError,
    TensorType,
    UnsupportedOpsError,
)
from eggfuse.ir.facts import baked
from eggfuse.ir.graph import _dimension

#: The oldest default-domain opset the converters are written for.
MIN_OPSET = 7

_T = onnx.TensorProto
#: ONNX element types eggfuse imports and their IR dtype (int64 narrowed to 32 bits).
ELEM_DTYPE = {_T.FLOAT: DType.F32, _T.INT64: DType.I32, _T.INT32: DType.I32, _T.BOOL: DType.BOOL}

#: ONNX float types computed in float32. A tensor of one enters the import as FLOAT: fed values
#: and known ones are converted (exactly from FLOAT16 and BFLOAT16, rounded to the nearest f32
#: from DOUBLE), and a graph output the model declares as one is converted back to that type on
#: the host. A Cast to FLOAT16 or BFLOAT16 rounds on the device, so such a result is exact in its
#: type; other results carry f32 rounding (and DOUBLE inputs f32's range and precision).
COMPUTED_IN_F32 = frozenset({_T.DOUBLE, _T.FLOAT16, _T.BFLOAT16})

#: What the element-type refusals list.
SUPPORTED_ELEMS = "float32, int32, int64 and bool; float64, float16 and bfloat16 computed in float32"


def elem_name(elem: int) -> str:
    """The ONNX name of element type ``elem`` (``FLOAT``, ``INT64``, ...)."""
    try:
        return _T.DataType.Name(elem)
    except ValueError:
        return f"element type {elem}"


def elem_numpy(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def as_f32(values: Any, what: str, error: type[Exception] = OnnxError) -> np.ndarray:
    """``values`` (a DOUBLE, FLOAT16 or BFLOAT16 array) as float32; ``error`` naming ``what``
    when a finite value lies beyond float32's range (it would become an infinity)."""
    arr = np.asarray(values)
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    bad = np.isinf(out) & np.isfinite(arr)
    if bad.any():
        worst = float(np.max(np.abs(arr[bad])))
        raise error(f"{what}: {int(bad.sum())} value(s) up to {worst:.3g} lie beyond float32's range "
                    f"(+-{float(np.finfo(np.float32).max):.3g}); eggfuse computes {arr.dtype} in float32, so "
                    "this model cannot run here: rescale these values or run it with another runtime")
    return out


def _sets_type(node: onnx.NodeProto) -> bool:
    # a node whose attributes choose its output's element type (Cast's to, a generator's dtype): not its inputs'
    return any(a.name in ("to", "dtype", "output_dtype") for a in node.attribute) or node.op_type == "CastLike"


def in_f32(v: Value) -> Value:
    """``v``, or for a :data:`COMPUTED_IN_F32` type the FLOAT value eggfuse computes instead
    (its known contents converted to float32; :class:`OnnxError` when one lies beyond
    float32's range)."""
    if v.elem not in COMPUTED_IN_F32:
        return v
    const = None if v.const is None else as_f32(v.const, f"tensor {v.name!r}")
    return replace(v, elem=_T.FLOAT, const=const, declared=v.elem)


class NeedsValuesError(OnnxError):
    """A value the import must know (an ``If``'s condition, a Reshape's shape, Slice's
    starts, ...) is computed from graph inputs: ``inputs`` names them.
    :class:`~eggfuse.onnx.Model` then binds those inputs' fed values at load time (one plan
    per value) and imports again."""

    def __init__(self, message: str, inputs: frozenset[str]) -> None:
        super().__init__(message)
        self.inputs = inputs


@dataclass
class Value:
    """One ONNX value during import: ``elem`` (ONNX element type) and ``shape``; ``const``
    its contents when known at load time (in its ONNX dtype), ``node`` the IR node holding it
    once one exists; ``param``: it comes from an initializer (a parameter when it reaches the
    graph); ``blocked``: an unsupported node upstream computes it (the import goes on only to
    list every unsupported op); ``deps``: the graph inputs it is computed from; ``declared``:
    for a value of a :data:`COMPUTED_IN_F32` type (then ``elem`` is FLOAT), that type."""

    name: str
    elem: int
    shape: tuple[int, ...]
    const: np.ndarray | None = None
    node: int | None = None
    param: bool = False
    blocked: bool = False
    deps: frozenset[str] = frozenset()  # the graph inputs it is computed from
    declared: int = 0  # a value computed in float32 (elem FLOAT): its ONNX type (COMPUTED_IN_F32)


class NodeContext:
    """What a converter sees of one ONNX node: its attributes, inputs (``Value``) and the IR
    graph being built. Converters raise through :meth:`fail`, which names the node."""

    def __init__(self, importer: Importer, node: onnx.NodeProto, inputs: list[Value | None], opset: int) -> None:
        self.importer = importer
        self.node = node
        self.inputs = inputs
        self.opset = opset
        self.graph: Graph = importer.graph

    # --- naming and errors -------------------------------------------------------------

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def where(self) -> str:
        name = self.node.name or (self.node.output[0] if self.node.output else "")
        return f"{self.node.op_type} node {name!r}"

    def fail(self, msg: str) -> OnnxError:
        """An :class:`OnnxError` for this node (raise it): ``msg`` prefixed by the op type and name; where ``msg``
        names a shape (a bracketed list of integers), followed by the sizes the caller gave the model's symbolic
        input dimensions and the small input values it gave, if any (:meth:`Importer.chosen_sizes`)."""
        about_shapes = _SHAPE_IN_MESSAGE.search(msg) is not None
        return OnnxError(f"{self.where()}: {msg}{self.importer.chosen_sizes() if about_shapes else ''}")

    # --- attributes --------------------------------------------------------------------

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name`` as a Python value (ints, floats, str, tuples of them, a
        numpy array for a tensor, a GraphProto for a graph), or ``default``."""
        for a in self.node.attribute:
            if a.name == name:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    return v.decode()
                if isinstance(v, onnx.TensorProto):
                    return tensor_array(v, f"{self.where()}: attribute {name!r}")
                if isinstance(v, list):
                    return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
                return v
        return default

    def attrs_present(self) -> set[str]:
        """The node's attribute names but ONNX's reserved ones (beginning with ``__``: hints, which change nothing)."""
        return {a.name for a in self.node.attribute if not a.name.startswith("__")}

    def refuse_attrs(self, allowed: Sequence[str]) -> None:
        """Raise :meth:`fail` for any attribute outside ``allowed``."""
        extra = sorted(self.attrs_present() - set(allowed))
        if extra:
            raise self.fail(f"attribute(s) {', '.join(extra)} are not supported")

    # --- inputs ------------------------------------------------------------------------

    def has(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int) -> Value:
        if not self.has(i):
            raise self.fail(f"input {i} is required")
        return self.inputs[i]

    def shape(self, i: int) -> tuple[int, ...]:
        return self.value(i).shape

    def elem(self, i: int) -> int:
        return self.value(i).elem

    def const(self, i: int, what: str = "") -> np.ndarray:
        """The contents of input ``i``, which must be known at load time (a shape, axes,
        pads, ...); raises :meth:`fail` when it is computed from graph inputs."""
        v = self.value(i)
        if v.const is None:
            raise NeedsValuesError(
                f"{self.where()}: input {i} ({what or v.name!r}) must be known at load time (an initializer, a "
                f"Constant or computed from them), but it depends on the graph's inputs "
                f"{', '.join(map(repr, sorted(v.deps)))}: give them with load(..., values={{...}}) (eggfuse.onnx.Model "
                "does so itself, one plan per value; eggfuse optimize: --input NAME=FILE.npy or NAME=NUMBER)", v.deps)
        return v.const

    def tensor(self, i: int) -> int:
        """The IR node of input ``i`` (a known value becomes a Constant or, from an
        initializer, a Parameter)."""
        return self.importer.materialise(self.value(i), self)

    # --- building ----------------------------------------------------------------------

    def add(self, op: str, inputs: Sequence[int], **attrs: Any) -> int:
        """Add IR node ``op``; a GraphError becomes an OnnxError naming this ONNX node."""
        try:
            return self.graph.add_node(op, inputs, **attrs)
        except GraphError as e:  # shapes the op refuses: the last Slices whose end ONNX clamped are a likely cause
            clamped = self.importer.clamped[-3:]
            note = f" (earlier, {'; '.join(clamped)})" if clamped else ""
            raise self.fail(f"{e}; input shapes {[list(v.shape) if v else None for v in self.inputs]}{note}") from None

    def constant(self, value: Any, dtype: DType = DType.F32) -> int:
        """An IR Constant of ``value`` (its own shape, a 0-d value a scalar)."""
        arr = np.asarray(value)
        return self.graph.constant(arr, shape=arr.shape, dtype=dtype)

    def out(self, node: int, elem: int | None = None) -> Value:
        """The Value of IR node ``node``: ``elem`` defaults to FLOAT for f32, INT64 for i32
        (ONNX's index type) and BOOL for bool."""
        ty = self.graph.node(node).type
        if elem is None:
            elem = {DType.F32: _T.FLOAT, DType.I32: _T.INT64, DType.BOOL: _T.BOOL, DType.U32: _T.UINT32}[ty.dtype]
        return Value("", elem, ty.shape, node=node)

    def known(self, array: np.ndarray, elem: int | None = None) -> Value:
        """A Value known at load time (folded by the converter itself, e.g. ``Shape``)."""
        arr = np.asarray(array)
        if elem is None:
            elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
        return Value("", elem, tuple(arr.shape), const=arr)


def tensor_array(t: onnx.TensorProto, where: str) -> np.ndarray:
    """The array of a TensorProto (an initializer or a Constant's value); DamagedFileError (an OnnxError)
    naming ``where`` and its declared shape where the stored data does not fill it (a truncated or
    hand-edited file), OnnxError where the data is still in an external file (a ModelProto loaded with
    ``load_external_data=False``)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        # onnx would read the file named in external_data from the current folder (maybe another model's)
        location = next((e.value for e in t.external_data if e.key == "location"), "?")
        raise OnnxError(f"{where}: its data is in an external file ({location!r}) that was not loaded: give the "
                        "path of the .onnx file (its external data is read from beside it), or load the model "
                        "with onnx.load(path), which reads external data by default")
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, KeyError) as e:
        raise DamagedFileError(f"{where}: its stored data does not match its declared type {elem_name(t.data_type)} "
                               f"and shape {list(t.dims)} ({e}); the file is damaged: export it again") from None


Converter = Callable[[NodeContext], "Value | Sequence[Value | None]"]

#: ONNX op type -> converter (``eggfuse.onnx.ops`` registers them).
CONVERTERS: dict[str, Converter] = {}

#: Domains whose ops the ONNX standard defines: an op without a converter expands into its
#: schema's function body where it has one (the preview domains' FlexAttention, ...).
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.preview", "ai.onnx.preview.training")

#: Op types never folded at load time: random ops (a new value per run in other runtimes) and
#: BatchNormalization, whose reference implementation reads ``momentum`` as training mode for
#: opsets 9-13.
#: Identity and Dropout pass a value through (one leaf, keeping its name).
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
           "BatchNormalization", "If", "Loop", "Scan", "Identity", "Dropout"}

#: Copies known at load time whose result would take at least this many bytes (and their input's bytes at least
#: twice over) are imported as the op over its folded input, not folded into the copies, where the rewrite
#: engine reads them as broadcasts and nothing needs their values at load time (:func:`lazy_copies`): a float
#: Tile along the leading axis that products read as B, through a Transpose or not (a view of an Expand, which a
#: product reads as its broadcast operand: ir/ops/movement.py, linalg.py), and an integer Expand that only
#: GatherElements read as indices (GatherElementsBroadcast: ir/ops/indexing.py), the products' A and the
#: gathers' data computed at run time. DeBERTa's exporters repeat each layer's position
#: keys and queries over the batch so (folded, 12.6 MB each at 8 x 128 tokens, 151 MB for DeBERTa-v3-small's 12),
#: and its relative position buckets over the batch and heads (two tables of 6.3 MB at 8 x 128, 805 MB at
#: 32 x 512), each growing with the batch.
LAZY_COPY_BYTES = 1 << 20


def lazy_copies(graph: onnx.GraphProto, fed: set[str]) -> set[str]:
    """The outputs of ``graph``'s Tile and Expand nodes that LAZY_COPY_BYTES may leave unfolded, by their readers
    alone: a Tile of repeats [N, 1, ..., 1] (rank 2 to 4) whose readers are MatMuls reading it as B, directly or
    through Transposes read only so; an Expand whose readers are GatherElements reading it as indices. Every such
    product's A and gather's data depend on ``fed`` (the inputs given at run time, through any op but Shape and
    Size), so their results are run-time values either way, and none of these values is a graph output or read
    inside a subgraph. (The sizes and element types are checked at import, :func:`_large_tile`, ``_large_expand``.)
    """
    standard = [n for n in graph.node if n.domain in ("", "ai.onnx")]
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, k))
    kept = {o.name for o in graph.output}  # graph outputs and values a subgraph reads: not lazy
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                kept.update(x for n2 in sub.node for x in n2.input)
    runtime = set(fed)
    for node in graph.node:  # topologically sorted
        if node.op_type not in ("Shape", "Size") and any(x in runtime for x in node.input):
            runtime.update(node.output)

    def std(n: onnx.NodeProto, op_type: str) -> bool:
        return n.op_type == op_type and n.domain in ("", "ai.onnx")

    def read_as(name: str, op_type: str, through: str | None = None) -> bool:
        # name read only as input 1 of op_type nodes whose input 0 is a run-time value (or, with through, also
        # as the input of such nodes whose output is read so)
        rs = readers.get(name, [])
        return bool(rs) and name not in kept and all(
            (std(n, op_type) and j == 1 and n.input[0] in runtime)
            or (through is not None and std(n, through) and j == 0 and bool(n.output) and read_as(n.output[0], op_type))
            for n, j in rs)

    return {n.output[0] for n in standard if n.output and (
        (n.op_type == "Expand" and read_as(n.output[0], "GatherElements"))
        or (n.op_type == "Tile" and read_as(n.output[0], "MatMul", through="Transpose")))}


def _large_tile(given: list[Value]) -> bool:
    # a float Tile of known input and repeats [N, 1, ..., 1] (rank 2 to 4) whose copies LAZY_COPY_BYTES bounds
    if len(given) < 2 or given[0].elem != _T.FLOAT or given[1].const is None:
        return False
    reps = [int(r) for r in np.ravel(given[1].const)]
    if not 2 <= len(reps) <= 4 or len(reps) != len(given[0].shape) or any(r != 1 for r in reps[1:]):
        return False
    times = reps[0]
    return times >= 2 and given[0].const.nbytes * times >= LAZY_COPY_BYTES


def _large_expand(given: list[Value]) -> bool:
    # an integer Expand of known input and shape whose copies LAZY_COPY_BYTES bounds (narrowed to int32: 4 bytes)
    if len(given) < 2 or given[0].elem not in (_T.INT64, _T.INT32) or given[1].const is None:
        return False
    try:
        out = np.broadcast_shapes(given[0].shape, tuple(int(d) for d in given[1].const))
    except ValueError:
        return False  # the converter names the error
    size, elems = math.prod(out), math.prod(given[0].shape)
    return size >= 2 * elems and 4 * size >= LAZY_COPY_BYTES


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Decorator: register ``fn(ctx) -> Value | [Value | None, ...]`` for ``op_types``."""

    def deco(fn: Converter) -> Converter:
        for t in op_types:
            if t in CONVERTERS:
                raise ValueError(f"ONNX op {t} has two converters")
            CONVERTERS[t] = fn
        return fn

    return deco


def upgraded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or when its default-domain opset is older than :data:`MIN_OPSET` a copy
    upgraded to it by onnx's version converter (``model`` itself is not modified). Raises
    OnnxError when the converter cannot upgrade it."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or version >= MIN_OPSET:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter's C++ raises several kinds
        raise OnnxError(f"the model's opset is {version}; eggfuse imports opset {MIN_OPSET} and later, and onnx's "
                        f"version converter could not upgrade it: {str(e).splitlines()[0] if str(e) else e}") from None


def _subgraphs(g: onnx.GraphProto | onnx.FunctionProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    """``g`` and every graph nested in its nodes' attributes (If's branches, Loop's and Scan's bodies)."""
    yield g
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _subgraphs(sub)


def dense_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or where a graph of it (a subgraph too) has sparse initializers a copy in which each is a dense
    initializer of its name: zeros but at its ``indices`` (NNZ linear positions, or an [NNZ, rank] array of
    coordinates: https://onnx.ai/onnx/repo-docs/IR.html#sparse-tensors), which take its ``values``. Raises
    OnnxError for indices that do not fit its dims."""
    if not any(g.sparse_initializer for g in _subgraphs(model.graph)):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for g in _subgraphs(out.graph):
        for sp in g.sparse_initializer:
            name, dims = sp.values.name, [int(d) for d in sp.dims]
            values = tensor_array(sp.values, f"sparse initializer {name!r}").reshape(-1)
            idx = tensor_array(sp.indices, f"sparse initializer {name!r}'s indices").astype(np.int64)
            size = math.prod(dims)
            try:
                flat = idx.reshape(-1) if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), dims)
                if flat.shape != values.shape or np.any((flat < 0) | (flat >= size)):
                    raise ValueError(f"{flat.size} positions for {values.size} values in a tensor of {size}")
            except ValueError as e:
                raise OnnxError(f"sparse initializer {name!r} of dims {dims}: its indices {list(idx.shape)} do not "
                                f"place its {values.size} values ({e}); fix or densify it in the exporter") from None
            dense = np.zeros(size, values.dtype)
            dense[flat] = values
            g.initializer.append(numpy_helper.from_array(dense.reshape(dims), name))
        del g.sparse_initializer[:]
    return out


def _check_opset(model: onnx.ModelProto, what: str) -> None:
    # ONNX requires the default domain's opset to be imported where a node uses it; a model without it (a file cut
    # short, since protobuf writes opset_import after the graph) would otherwise import at the newest opset
    # (nodes of subgraphs, If's and Loop's bodies, count too, and those of a local function that imports no
    # default-domain opset of its own, which then takes the model's)
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if versions and max(versions) > onnx.defs.onnx_opset_version():  # before any input is looked at
        raise OnnxError(f"{what}: the model's opset is {max(versions)}, newer than this onnx package knows "
                        f"({onnx.defs.onnx_opset_version()}); upgrade onnx")
    if versions:
        return
    used = next((n for n in _all_nodes(model) if n.domain in ("", "ai.onnx")), None)
    if used is not None:
        label = used.name or (used.output[0] if used.output else used.op_type)
        raise OnnxError(f"{what} imports no opset of ONNX's default domain (its opset_import lists "
                        f"{[o.domain for o in model.opset_import] or 'nothing'}), yet its node {label!r} is a "
                        f"{used.op_type} of that domain: a file cut short loses its opset_import (written after the "
                        "graph); export or copy the model again")


_ATTRIBUTE_TYPES = {v: k for k, v in onnx.AttributeProto.AttributeType.items()}


@functools.lru_cache(maxsize=1024)
def _schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, version, "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return None


def check_attribute_types(node: onnx.NodeProto, version: int) -> None:
    """Refuse (OnnxError naming the node) an attribute of a standard op that its ONNX schema at ``version`` does
    not declare, or whose stored type is not the schema's (``axes=-1``, an INT, where ReduceMean takes INTS; a
    string or a float where an int belongs), as onnxruntime refuses such a model when it loads it. Ops without a
    schema (model-local functions, other domains) are left to their converters."""
    schema = _schema(node.op_type, version, node.domain)
    if schema is None:
        return
    label = f"{node.op_type} node {node.name or (node.output[0] if node.output else '(unnamed)')!r}"
    for a in node.attribute:
        if a.name.startswith("__") or a.ref_attr_name:  # ONNX's reserved names (hints, which its checker and
            continue  # onnxruntime let pass), and a function body's references to its caller's attributes
        declared = schema.attributes.get(a.name)
        if declared is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise OnnxError(f"{label}: attribute {a.name!r} is not one of {node.op_type}'s at opset {version} "
                            f"(its attributes: {known}); export the model again, or remove the attribute")
        want = int(declared.type)
        if a.type != want:
            got = _ATTRIBUTE_TYPES.get(a.type, str(a.type))
            raise OnnxError(f"{label}: attribute {a.name!r} is stored as {got}, where {node.op_type} (opset {version}) "
                            f"takes {_ATTRIBUTE_TYPES.get(want, str(want))}"
                            + (" (a list)" if _ATTRIBUTE_TYPES.get(want, "").endswith("S") else "")
                            + "; write it with that type (onnx.helper.make_attribute infers it from the Python value)")


def _check_text(model: onnx.ModelProto, what: str) -> None:
    # protobuf hands back a string field that is not UTF-8 (a damaged or hand-edited file) as bytes, which no later
    # step expects: refused here, naming where
    def bad(v) -> bool:
        return not isinstance(v, str)

    graphs = [*_subgraphs(model.graph), *(g for f in model.functions for g in _subgraphs(f))]
    for g in graphs:
        for v in (*g.input, *g.output, *getattr(g, "initializer", ())):  # a FunctionProto's are names
            if bad(v if isinstance(v, str | bytes) else v.name):
                raise DamagedFileError(f"{what}: a graph input, output or initializer name is not UTF-8 text "
                                       "(stored bytes of no text): the file is damaged; export or copy the model again")
        for i, n in enumerate(g.node):
            fields = (n.op_type, n.domain, n.name, *n.input, *n.output, *(a.name for a in n.attribute))
            if any(bad(f) for f in fields):
                raise DamagedFileError(f"{what}: node {i} of a graph has an op type, domain, name, input, output or "
                                       "attribute name that is not UTF-8 text: the file is damaged; export or copy the "
                                       "model again")


def unsupported_ops_error(nodes: Mapping[str, Sequence[str]], also: str = "") -> UnsupportedOpsError:
    """The error listing every op type eggfuse cannot run, from each one's node names (``nodes``), its count
    and its first node; ``also`` ends the message."""
    ops = {k: (len(v), v[0]) for k, v in nodes.items()}
    listing = "; ".join(f"{k} x{n} (first: {first!r})" for k, (n, first) in sorted(ops.items()))
    return UnsupportedOpsError(f"the model uses op types eggfuse cannot run: {listing}{also}", ops)


def raise_non_tensor(model: onnx.ModelProto, vi: onnx.ValueInfoProto) -> None:
    """Raise for graph input or output ``vi``, which is no tensor (a sequence, map or optional): an
    :class:`UnsupportedOpsError` listing the op types of the graph that eggfuse has no converter for (an ML
    pipeline's ZipMap, say, where they make that value), else an :class:`OnnxError` naming the value and the node
    that makes it."""
    kind = {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
            "sparse_tensor_type": "a sparse tensor"}.get(vi.type.WhichOneof("value"), "of no type")
    maker = next((n for n in model.graph.node if vi.name in n.output), None)
    made = f", made by {maker.op_type} node {maker.name or maker.output[0]!r}" if maker is not None else ""
    what = f"graph {'output' if any(o.name == vi.name for o in model.graph.output) else 'input'} {vi.name!r}"
    versions = {o.domain: o.version for o in model.opset_import}
    missing: dict[str, list[str]] = {}
    for n in model.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        if key in CONVERTERS or n.op_type in ("If", "Loop", "Scan", "Constant") and n.domain in ("", "ai.onnx"):
            continue  # (a Constant is computed at load time)
        schema = _schema(n.op_type, versions.get(n.domain, versions.get("ai.onnx", 1)), n.domain) \
            if n.domain in STANDARD_DOMAINS else None
        if schema is not None and (schema.function_opset_versions or schema.context_dependent_function_opset_versions):
            continue  # imported through its ONNX function
        if not any((f.domain, f.name) == (n.domain, n.op_type) for f in model.functions):
            missing.setdefault(key, []).append(n.name or (n.output[0] if n.output else key))
    note = f"{what} is {kind}, not a tensor{made}: eggfuse runs tensors only"
    if missing:
        raise unsupported_ops_error(missing, f"; and {note}")
    raise OnnxError(f"{note} (sequences, maps and optionals are not supported): export the model with tensor "
                    "inputs and outputs (an ML pipeline without its ZipMap, a sequence given as its tensors)")


def _all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    # the nodes that take the model's opsets: its graph's, then those of its local functions that import no
    # default-domain opset of their own, each with their subgraphs' (any depth)
    for root in (model.graph, *(f for f in model.functions
                                if not any(o.domain in ("", "ai.onnx") for o in f.opset_import))):
        for g in _subgraphs(root):
            yield from g.node


def _load_proto(model: str | os.PathLike | onnx.ModelProto | bytes) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        _check_text(model, "the model")
        _check_opset(model, "the model")
        return upgraded(dense_initializers(model))
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise OnnxError(f"no ONNX file at {path!r}")
        try:
            proto = onnx.load(path)
        except Exception as e:  # noqa: BLE001 - protobuf raises many kinds
            raise OnnxError(f"{path!r} is not a readable ONNX model: {e}") from None
        if not proto.graph.output:  # protobuf parses an empty file (or another message's bytes) as an empty model
            raise OnnxError(f"{path!r} is not an ONNX model with a graph: it declares no outputs "
                            f"({os.path.getsize(path)} bytes); give the exported .onnx file")
        _check_text(proto, repr(path))
        _check_opset(proto, repr(path))
        return upgraded(dense_initializers(proto))
    if isinstance(model, bytes | bytearray):  # a serialised model, as onnxruntime takes it
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:  # noqa: BLE001 - protobuf raises many kinds
            raise OnnxError(f"the bytes given are not a serialised ONNX model: {e}") from None
        if not proto.graph.output:
            raise OnnxError(f"the {len(model)} bytes given are not an ONNX model with a graph: it declares no outputs")
        _check_text(proto, "the model")
        _check_opset(proto, "the model")
        return upgraded(dense_initializers(proto))
    raise OnnxError(f"expected a path, an onnx.ModelProto or its serialised bytes, got {type(model).__name__}")


def matmul_b_readers(graph: onnx.GraphProto) -> dict[str, set[str]]:
    """Value name -> how the graph reads it: ``"MatMul"`` as a MatMul's B (input 1) in the graph itself,
    ``"other:<node>"`` by another input of a node or inside a subgraph (If, Loop, Scan), one entry a node."""
    readers: dict[str, set[str]] = {}
    count = iter(range(1 << 62))

    def scan(g: onnx.GraphProto, outer: bool) -> None:
        for node in g.node:
            at = next(count)
            for k, name in enumerate(node.input):
                kept = outer and (node.op_type, k) == ("MatMul", 1) and node.domain in ("", "ai.onnx")
                readers.setdefault(name, set()).add(node.op_type if kept else f"other:{at}")
            for a in node.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    scan(sub, False)

    scan(graph, True)
    return readers


def transposed_copies(graph: onnx.GraphProto, arrays: Mapping[str, np.ndarray],
                      readers: Mapping[str, set[str]] | None = None) -> dict[str, str]:
    """Initializers that are exactly the transpose of another: {copy: original}. An exporter stores a tied
    table twice, as the embedding's W [V, H] and as the LM head's W^T [H, V] (torch.onnx, classic and dynamo).
    The copy is one that only MatMul nodes read (as their B), so that the rewrite folds its Transpose into the
    product, and the original one that another node reads (the embedding's Gather): two MatMul weights that
    merely hold equal values (identity initialisations) stay two parameters, as training needs them. A pair
    of other readers, or an initializer a subgraph reads, is left alone. ``readers``: the graph's
    :func:`matmul_b_readers`, when computed already."""
    readers = matmul_b_readers(graph) if readers is None else readers
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, arr in arrays.items():
        if arr.ndim == 2 and arr.size >= 2:
            by_shape.setdefault(arr.shape, []).append(name)
    out: dict[str, str] = {}
    for name, arr in arrays.items():
        if arr.ndim != 2 or name in out or readers.get(name) != {"MatMul"}:
            continue
        for other in by_shape.get(arr.shape[::-1], ()):
            if (other != name and other not in out and readers.get(other, {"MatMul"}) != {"MatMul"}
                    and np.array_equal(arrays[other][:, 0], arr[0])  # one row first: most pairs differ there
                    and np.array_equal(arrays[other].T, arr)):
                out[name] = other
                break
    return out


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    out: list[int | str | None] = []
    for d in vi.type.tensor_type.shape.dim:
        # a negative dim_value (paddle2onnx writes -1) is an unknown dimension, as a dim_param is
        known = d.HasField("dim_value") and d.dim_value >= 0
        out.append(d.dim_value if known else (d.dim_param or None))
    return out


def unknown_input(name: str, names: Sequence[str], error: type = OnnxError, what: str = "",
                  defaults: Collection[str] = ()) -> Exception:
    """``error`` saying that ``name`` is not one of the model's inputs ``names``, with the closest name
    as a hint and every input listed; ``what`` prefixes the message (where the name came from).
    ``defaults``: the graph inputs that have an initializer (:func:`overridable_inputs`): one of them
    is named as such, a weight eggfuse keeps constant, not an input it feeds."""
    if name in defaults:
        return error(f"{what}{name!r} is an input of the model with a default value (an initializer), which eggfuse "
                     "treats as a constant weight, so it cannot be fed, nor given a shape or a value; to feed it, "
                     "remove the initializer from the model, which makes it a plain input (onnx's API: delete it "
                     "from model.graph.initializer); the inputs eggfuse feeds are: "
                     f"{', '.join(repr(n) for n in names) or 'none'}")
    same_case = [n for n in names if n.lower() == str(name).lower()]  # 'X' for 'x': too short for difflib
    close = same_case or difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return error(f"{what}{name!r} is not an input of the model{hint}; its inputs are: "
                 f"{', '.join(repr(n) for n in names) or 'none'}")


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def overridable_inputs(model: onnx.ModelProto) -> frozenset[str]:
    """The graph inputs that are initializers too (ONNX: an input with a default value): eggfuse
    treats them as constant weights, which a caller cannot feed."""
    return frozenset(vi.name for vi in model.graph.input) & frozenset(t.name for t in model.graph.initializer)


def checked_shapes(shapes: Any, model: onnx.ModelProto, what: str = "shapes") -> dict[str, tuple[int, ...]]:
    """``shapes`` (input name -> shape, as :func:`load` and :class:`~eggfuse.onnx.Model` take it) with
    each shape a tuple of ints. OnnxError where ``shapes`` is not a mapping (None is none), a name is
    not an input the caller feeds (an input with an initializer named as such), or a shape is not a
    sequence of positive integers (Python or numpy integers; a bool, a float or a str is refused, not
    truncated) of the input's declared rank, its fixed dimensions as declared."""
    if shapes is None:
        return {}
    if not isinstance(shapes, Mapping):
        raise OnnxError(f"{what} must be a mapping of input name -> shape, e.g. {{'x': [2, 4]}}; got a "
                        f"{type(shapes).__name__}: {shapes!r}")
    inputs = graph_inputs(model)
    names = [vi.name for vi in inputs]
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name not in names:
            raise unknown_input(name, names, what=f"{what}: ", defaults=overridable_inputs(model))
        bad = (f"{what}: input {name!r} given {shape!r}; a shape is a sequence of dimensions, every one a positive "
               "integer (a Python or numpy int; not a bool, a float or a str)")
        if isinstance(shape, str | bytes) or not isinstance(shape, Sequence | np.ndarray) or np.ndim(shape) != 1:
            raise OnnxError(f"{bad}, e.g. [2, 4]")
        sizes = []
        for k, d in enumerate(shape):
            try:
                size = _dimension(d)
            except TypeError:
                raise OnnxError(f"{bad}: its dimension {k} is a {type(d).__name__}, {d!r}") from None
            if size < 1:
                empty = (f"; an empty input can only be known at load time: leave it out of {what} and give its "
                         f"value, load(..., values={{{name!r}: ...}}) (eggfuse.onnx.Model takes it from the feed)"
                         if size == 0 else "")
                raise OnnxError(f"{bad}: its dimension {k} is {size}{empty}")
            sizes.append(size)
        dims = tuple(sizes)
        vi = inputs[names.index(name)]
        declared = _dims(vi) if vi.type.tensor_type.HasField("shape") else None
        if declared is not None and (len(declared) != len(dims) or any(
                isinstance(d, int) and d > 0 and d != s for d, s in zip(declared, dims, strict=True))):
            raise OnnxError(f"{what}: input {name!r} given {list(dims)}, but the model declares {declared}; give a "
                            "shape of its rank, its fixed dimensions as declared")
        out[name] = dims
    return out


#: NodeContext.fail: a message that names a shape (a bracketed list of integers, "[1, 200, 1, 1]")
_SHAPE_IN_MESSAGE = re.compile(r"\[-?\d+(, -?\d+)*\]")


class Importer:
    """One import of ``model`` for the given input shapes (see :func:`load`)."""

    def __init__(self, model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                 values: Mapping[str, np.ndarray], known_outputs: bool = False) -> None:
        self.known_outputs = known_outputs
        self.model = model
        self.graph = Graph()
        self.params: dict[str, np.ndarray] = {}
        self.opsets = {o.domain: o.version for o in model.opset_import}
        self.unsupported: dict[str, list[str]] = {}
        self.unsupported_inputs: list[tuple[str, str]] = []  # (input, its element type) eggfuse does not run
        self._names: set[str] = set()
        self._functions = {(f.domain, f.name): f for f in model.functions}
        self._count = 0
        self.shapes, self.values = shapes, values
        #: IR node id -> the name of the ONNX node whose import added it (its first output's name
        #: when it has none; the outermost node for an expanded function or an inlined If)
        self.origin: dict[int, str] = {}
        #: initializer name -> the initializer it is the transpose of (:func:`transposed_copies`): read as a
        #: Transpose of that one, so the table is stored once
        self.transposed_of: dict[str, str] = {}
        self._initializers: dict[str, Value] = {}
        self._readers: dict[str, set[str]] = {}  # value name -> its readers (matmul_b_readers)
        #: Slices whose end ONNX clamped to a shorter axis (a finite end, not the "to the end"
        #: idiom): a later shape error names the last three, as a sequence longer than a position
        #: table fails only at the Add that meets the shorter rows
        self.clamped: list[str] = []

    def chosen_sizes(self) -> str:
        """For a node's error (:meth:`NodeContext.fail`): the sizes the caller chose for the model's symbolic input
        dimensions (``shapes``, or a Model's feeds) and the input values of at most 8 elements the import was
        specialised to (``values``, or a Model's feeds of the inputs it reads by value), which a model fails on
        where its ops cannot take them (an image too small for a pooling window, a sample rate it has no branch
        for); empty where the caller chose neither."""
        chosen = []
        for vi in self.model.graph.input:
            given = self.shapes.get(vi.name)
            if given is not None and (not vi.type.tensor_type.HasField("shape")
                                      or any(not isinstance(d, int) for d in _dims(vi))):
                chosen.append(f"{vi.name!r} {list(given)} (declared {declared_shape(vi)})")
        values = [f"{name!r} = {np.array2string(np.asarray(v), separator=', ')}" for name, v in self.values.items()
                  if np.size(v) <= 8]
        if not chosen and not values:
            return ""
        given = "; ".join(([f"the model's inputs shaped {', '.join(chosen)}"] if chosen else [])
                          + ([f"the input values {', '.join(values)}"] if values else []))
        return f" (imported for {given}; where the model does not take these, give the sizes or values it was made for)"

    # --- values ------------------------------------------------------------------------

    def materialise(self, v: Value, ctx: NodeContext | None = None) -> int:
        """The IR node of ``v``, creating its leaf for a known value."""
        if v.node is not None:
            return v.node
        dtype = ELEM_DTYPE.get(v.elem)
        where = f"{ctx.where()}: " if ctx is not None else ""
        if dtype is None:
            raise OnnxError(f"{where}tensor {v.name!r} has element type {elem_name(v.elem)}, which eggfuse does not "
                            "run (it computes in float32, int32 and bool); cast the model to float32")
        arr = v.const
        if arr.size == 0:
            raise OnnxError(f"{where}tensor {v.name!r} has shape {list(arr.shape)}: eggfuse cannot store an empty "
                            "tensor on the device (every dimension must be >= 1)")
        if dtype is DType.I32 and arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < -2**31 or hi >= 2**31:
                raise OnnxError(f"{where}tensor {v.name!r} ({elem_name(v.elem)}) holds {lo}..{hi}, outside the int32 "
                                "range eggfuse narrows int64 tensors to (WGSL has no 64-bit integers)")
        if v.name in self.transposed_of and v.param and v is self._initializers.get(v.name):
            # a tied table's second copy (an LM head's W^T beside the embedding's W): W read transposed, which
            # the matmul rules fold into the product (MatMul(x, Transpose(W)) -> MatMulBT(x, W))
            v.node = self.graph.transpose(self.materialise(self._initializers[self.transposed_of[v.name]], ctx))
            return v.node
        if v.param and dtype is DType.F32 and not baked(arr, TensorType(tuple(arr.shape), dtype)):
            name = self._unique(v.name or "param")
            v.node = self.graph.parameter(name, arr.shape)
            self.params[name] = np.array(arr, dtype=np.float32, order="C")  # (ascontiguousarray makes 0-d 1-d)
        else:
            v.node = self.graph.constant(arr, shape=arr.shape, dtype=dtype)
        return v.node

    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self._names:
            name, k = f"{base}.{k}", k + 1
        self._names.add(name)
        return name

    # --- the walk ----------------------------------------------------------------------

    def run(self) -> tuple[Graph, dict[str, np.ndarray], list[Value]]:
        g = self.model.graph
        # a model of other domains only (ai.onnx.ml, training) gets the latest default opset:
        # its ops are refused by name below
        version = self.opsets.get("", self.opsets.get("ai.onnx", onnx.defs.onnx_opset_version()))
        if version < MIN_OPSET:
            raise OnnxError(f"the model's opset is {version}; eggfuse imports opset {MIN_OPSET} and later "
                            "(onnx.version_converter.convert_version can upgrade it)")
        if version > onnx.defs.onnx_opset_version():
            raise OnnxError(f"the model's opset is {version}, newer than this onnx package knows "
                            f"({onnx.defs.onnx_opset_version()}); upgrade onnx")
        env: dict[str, Value] = {}
        for t in g.initializer:
            arr = tensor_array(t, f"initializer {t.name!r}")
            env[t.name] = in_f32(Value(t.name, t.data_type, tuple(arr.shape), const=arr, param=True))
        self._initializers = {t.name: env[t.name] for t in g.initializer}
        self._readers = matmul_b_readers(g)
        self._lazy = lazy_copies(g, {vi.name for vi in g.input} - {t.name for t in g.initializer} - set(self.values))
        self.transposed_of = transposed_copies(g, {k: v.const for k, v in self._initializers.items()
                                                   if ELEM_DTYPE.get(v.elem) is DType.F32}, self._readers)
        self._inputs(g, env)
        self._nodes(g.node, env, version)
        inputs = ", ".join(f"{name!r} ({elem})" for name, elem in self.unsupported_inputs)
        if self.unsupported:
            raise unsupported_ops_error(self.unsupported, f"; and inputs of element types it does not run: {inputs} "
                                        f"(inputs of {SUPPORTED_ELEMS} are supported)" if inputs else "")
        if self.unsupported_inputs:
            name, elem = self.unsupported_inputs[0]
            raise OnnxError(f"input {name!r} has element type {elem}, which eggfuse does not run (inputs of "
                            f"{SUPPORTED_ELEMS} are supported)")
        outs = []
        for vi in g.output:
            if not vi.type.HasField("tensor_type"):
                raise_non_tensor(self.model, vi)
            if vi.name not in env:
                raise OnnxError(f"graph output {vi.name!r} is computed by no node")
            v = env[vi.name]
            declared = vi.type.tensor_type.elem_type or v.declared
            if declared in COMPUTED_IN_F32 and v.elem == _T.FLOAT:  # converted back on the host
                v = replace(v, elem=declared)
            outs.append(v)
        # outputs known at load time stay out of the graph when the caller returns them itself
        ids = [self.materialise(v) for v in outs if not (self.known_outputs and v.const is not None)]
        if ids:
            self.graph.set_outputs(ids)
            self._check_computed_indices()
        return self.graph, self.params, outs

    def _check_computed_indices(self) -> None:
        # Indices the graph computes (RoBERTa's position ids, counted with a CumSum) cannot be checked at run
        # time; where their range, bounded from the shapes, reaches past the table, ONNX would refuse such
        # values and the kernels would clamp them: refuse the shapes (ir/ranges.py)
        from eggfuse.ir.ranges import index_overruns

        for source, rows, (lo, hi) in index_overruns(self.graph):
            origin = self.origin.get(source.id)
            where = f"node {origin!r} ({source.op})" if origin else source.describe()
            raise OnnxError(f"{where}: the indices it computes from the inputs reach {lo}..{hi} at these input "
                            f"shapes, past the {rows} rows an op reads with them (ONNX allows [-{rows}, {rows})); "
                            f"the model takes shorter inputs (a position table of {rows} rows, say): give shorter "
                            "ones")

    def _inputs(self, g: onnx.GraphProto, env: dict[str, Value]) -> None:
        inits = {t.name for t in g.initializer}
        fed = [vi for vi in g.input if vi.name not in inits]
        names = [vi.name for vi in fed]
        for key in list(self.shapes) + list(self.values):
            if key not in names:
                raise unknown_input(key, names, defaults=overridable_inputs(self.model))
        named: dict[str, tuple[int, str]] = {}  # a named (dim_param) dimension: its size, the input that set it
        given: dict[str, set[int]] = {}  # a named dimension's sizes in the shapes given (one: an input without
        for vi in fed:                   # its own shape takes it)
            if vi.name in self.shapes and vi.type.tensor_type.HasField("shape"):
                for d, s in zip(_dims(vi), self.shapes[vi.name], strict=False):
                    if isinstance(d, str) and (d[:1].isalpha() or d[:1] == "_"):
                        given.setdefault(d, set()).add(int(s))
        for vi in fed:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise_non_tensor(self.model, vi)
            elem = tt.elem_type
            if vi.name in self.values:
                arr = _load_value(vi, self.values[vi.name])
                env[vi.name] = in_f32(Value(vi.name, elem, tuple(arr.shape), const=arr, deps=frozenset([vi.name])))
                continue
            if elem not in ELEM_DTYPE and elem not in COMPUTED_IN_F32:
                # refused after the nodes, with every op type eggfuse cannot run: what reads it is blocked
                self.unsupported_inputs.append((vi.name, elem_name(elem)))
                env[vi.name] = Value(vi.name, _T.FLOAT, (), blocked=True, deps=frozenset([vi.name]))
                continue
            declared = elem if elem in COMPUTED_IN_F32 else 0
            elem = _T.FLOAT if elem in COMPUTED_IN_F32 else elem
            dims = _dims(vi) if tt.HasField("shape") else None
            if vi.name in self.shapes:
                shape = tuple(int(d) for d in self.shapes[vi.name])
                if dims is not None and (len(dims) != len(shape) or any(
                        isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=False))):
                    raise OnnxError(f"input {vi.name!r}: shape {list(shape)} does not match the model's {dims}")
            elif dims is not None and all(isinstance(d, int) or len(given.get(d, ())) == 1 for d in dims):
                # its named dimensions sized by another input's shape (ONNX: a dim_param is one size)
                shape = tuple(d if isinstance(d, int) else next(iter(given[d])) for d in dims)
            elif dims is None or not all(isinstance(d, int) for d in dims):
                raise OnnxError(f"input {vi.name!r} has dimensions {dims} that are not fixed; give its shape "
                                f"(load(..., shapes={{{vi.name!r}: [...]}})), or run it through eggfuse.onnx.Model, "
                                "which takes them from the first feeds")
            else:
                shape = tuple(dims)
            # ONNX: a dim_param names one size across the graph's inputs (a batch, a sequence length); not a
            # placeholder ('?', paddle2onnx's) nor a name one input gives two sizes (then it names no size)
            own: dict[str, set[int]] = {}
            for d, s in zip(dims or (), shape, strict=False):
                if isinstance(d, str) and (d[:1].isalpha() or d[:1] == "_"):
                    own.setdefault(d, set()).add(s)
            for d, sizes in own.items():
                if len(sizes) == 1 and named.setdefault(d, (s := next(iter(sizes)), vi.name))[0] != s:
                    size, other = named[d]
                    raise OnnxError(f"input {vi.name!r} (shape {list(shape)}): its dimension {d!r} is {s}, but {size} "
                                    f"in input {other!r}; give the inputs that share a named dimension one size")
            if any(d < 1 for d in shape):  # empty axes, pads, a CastLike's type: no contents, known at load time
                raise NeedsValuesError(
                    f"input {vi.name!r} has shape {list(shape)}: an empty tensor cannot be fed at run time, "
                    f"only known at load time; give it with load(..., values={{{vi.name!r}: ...}}) "
                    "(eggfuse.onnx.Model does so itself)", frozenset([vi.name]))
            self._names.add(vi.name)
            nid = self.graph.input(vi.name, shape, ELEM_DTYPE[elem])
            env[vi.name] = Value(vi.name, elem, shape, node=nid, deps=frozenset([vi.name]), declared=declared)

    def _nodes(self, nodes: Sequence[onnx.NodeProto], env: dict[str, Value], version: int) -> None:
        for node in nodes:
            self._node(node, env, version)

    def _node(self, node: onnx.NodeProto, env: dict[str, Value], version: int) -> None:
        first = len(self.graph.nodes)
        try:
            self._convert(node, env, version)
        finally:
            name = node.name or (node.output[0] if node.output else node.op_type)
            self.origin.update(dict.fromkeys(range(first, len(self.graph.nodes)), name))

    def _convert(self, node: onnx.NodeProto, env: dict[str, Value], version: int) -> None:
        if node.domain in STANDARD_DOMAINS:
            check_attribute_types(node, self._domain_version(node.domain, version))
        ins: list[Value | None] = []
        for name in node.input:
            if not name:
                ins.append(None)
            elif name in env:
                ins.append(env[name])
            else:
                label = node.name or (f"computing {node.output[0]!r}" if node.output else "(unnamed)")
                raise OnnxError(f"{node.op_type} node {label if not node.name else repr(label)}: input {name!r} is "
                                "computed by no earlier node (ONNX lists nodes in topological order: sort the graph, "
                                "or export it again)")
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        blocked = any(v is not None and v.blocked for v in ins)
        given = [v for v in ins if v is not None]
        foldable = (node.domain in ("", "ai.onnx") and node.op_type not in NO_FOLD and not blocked
                    and all(v.const is not None for v in given)
                    and (given or node.op_type in ("Constant", "ConstantOfShape", "Range", "EyeLike")))
        if (foldable and node.op_type == "Transpose" and node.output and len(given) == 1 and given[0].param
                and given[0].const.ndim == 2 and self._readers.get(node.output[0]) == {"MatMul"}
                and len(self._readers.get(node.input[0], ())) > 1):
            # a weight that other nodes read too, transposed for MatMuls (the dynamo exporter's tied LM head, W
            # also the embedding): imported as a Transpose of the weight, which the matmul rules fold into the
            # products, rather than folded into a second copy of it
            foldable = False
        if foldable and node.output and node.output[0] in self._lazy and (
                _large_tile(given) if node.op_type == "Tile" else _large_expand(given)):
            foldable = False
        if blocked and key not in CONVERTERS and not self._expandable(node, version):
            self._mark_unsupported(key, node)
        if blocked:
            for o in node.output:
                env[o] = Value(o, _T.FLOAT, (), blocked=True)
            return
        if foldable:
            outs = self._fold(node, ins, version)
        elif key in CONVERTERS:
            ctx = NodeContext(self, node, ins, version)
            outs = CONVERTERS[key](ctx)
            if isinstance(outs, Value):
                outs = [outs]
        elif node.op_type == "If" and node.domain in ("", "ai.onnx"):
            outs = self._if(node, ins, env, version)
        elif node.op_type in ("Scan", "Loop") and node.domain in ("", "ai.onnx"):
            from . import control

            outs = (control.scan if node.op_type == "Scan" else control.loop)(self, node, ins, env, version)
        elif (body := self._expandable(node, version)) is not None:
            outs = self._expand(node, body, ins, env, version)
        else:
            self._mark_unsupported(key, node)
            for o in node.output:
                env[o] = Value(o, _T.FLOAT, (), blocked=True)
            return
        outs = list(outs)
        for k, name in enumerate(node.output):
            if not name:
                continue
            v = outs[k] if k < len(outs) else None
            if v is None:
                raise OnnxError(f"{node.op_type} node {node.name!r}: output {k} ({name!r}) is not supported")
            if any(v is i for i in ins):  # passed through (Identity): the same value, one leaf
                env[name] = v
                continue
            if v.const is not None:  # a value known at load time: from the inputs given by value, if any (their
                # values; not a Shape's or Size's, which read only the shape)
                shape_only = node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx")
                deps = v.deps or (frozenset() if shape_only else
                                  frozenset().union(*(i.deps for i in ins if i is not None and i.const is not None)))
            else:
                deps = v.deps or frozenset().union(*(i.deps for i in ins if i))
            declared = v.declared
            if not declared and v.elem == _T.FLOAT and not _sets_type(node):
                # a float16 (bfloat16) op computed in float32: its output is of its float inputs' type (ONNX's T)
                declared = next((i.declared for i in ins if i is not None and i.elem == _T.FLOAT and i.declared), 0)
            v = Value(name, v.elem, v.shape, v.const, v.node, v.param or (v.const is not None and any(
                i is not None and i.param for i in ins)), v.blocked, deps, declared)  # blocked stays so
            env[name] = in_f32(v)

    def note_clamped(self, where: str, shape: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                     steps: Sequence[int]) -> None:
        """Record a Slice (at ``where``) whose finite end ONNX clamps to a shorter axis, for
        :meth:`NodeContext.add` to name with a shape error; the INT_MAX "to the end" idiom is not
        recorded."""
        for a, v, step in zip(axes, ends, steps, strict=True):
            a = a % max(len(shape), 1)
            d = shape[a]
            if step > 0 and d < v < 2**31 - 1:
                self.clamped.append(f"{where} asked for rows up to {v} along axis {a} of {list(shape)}, and ONNX "
                                    f"clamps that to {d}: the model takes at most {d} there (a position table, "
                                    "say); give a shorter input")

    def _mark_unsupported(self, key: str, node: onnx.NodeProto) -> None:
        self.unsupported.setdefault(key, []).append(node.name or (node.output[0] if node.output else key))

    # --- folding, If, functions ----------------------------------------------------------

    def _fold(self, node: onnx.NodeProto, ins: list[Value | None], version: int) -> list[Value]:
        if node.op_type == "Constant":
            ctx = NodeContext(self, node, ins, version)
            for a in node.attribute:
                if a.name == "value":
                    arr = tensor_array(a.t, f"Constant node {node.name!r} (output {node.output[0]!r})")
                    return [Value("", a.t.data_type, tuple(arr.shape), const=arr)]
                if a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    v = ctx.attr(a.name)
                    elem = _T.FLOAT if "float" in a.name else _T.INT64
                    arr = np.asarray(v, dtype=elem_numpy(elem))
                    return [Value("", elem, tuple(arr.shape), const=arr)]
            raise OnnxError(f"Constant node {node.name!r}: only tensor, float and int values are supported")
        if node.op_type == "Gather" and len(ins) > 1 and ins[0] is not None and ins[1] is not None:
            # a folded Gather by indices known at load time (an exporter's arange of positions): ONNX refuses an
            # index outside [-dim, dim); say so in the model's terms, not numpy's
            data, idx = np.asarray(ins[0].const), np.asarray(ins[1].const)
            axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
            if data.ndim and idx.size and -data.ndim <= axis < data.ndim:
                dim = data.shape[axis]
                if (bad := first_out_of_range(idx, dim)) is not None:
                    fed_index_error(node, ins[1], bad, axis % data.ndim, data.shape)
                    raise OnnxError(f"Gather node {node.name!r}: index {bad} is out of range for axis "
                                    f"{axis % data.ndim} of {list(data.shape)} (ONNX refuses an index outside "
                                    f"[-{dim}, {dim})): the model takes at most {dim} there (a position table, say), "
                                    "and an input's length makes it index past that; give a shorter input")
        if (node.op_type == "GatherElements" and len(ins) > 1 and ins[0] is not None and ins[1] is not None
                and len(ins[0].shape) == len(ins[1].shape) >= 1):
            # onnx's reference evaluator refuses indices smaller than the data off the axis and more than 64 along
            # it; the IR op's reference (ir/ops/indexing.py) takes both
            data, idx = np.asarray(ins[0].const), np.asarray(ins[1].const).astype(np.int64)
            axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
            pairs = enumerate(zip(idx.shape, data.shape, strict=True))
            if -data.ndim <= axis < data.ndim and all(i <= d for k, (i, d) in pairs if k != axis % data.ndim):
                axis %= data.ndim
                dim = data.shape[axis]
                if (bad := first_out_of_range(idx, dim)) is not None:
                    fed_index_error(node, ins[1], bad, axis, data.shape)
                    raise OnnxError(f"GatherElements node {node.name!r}: index {bad} is out of range "
                                    f"for axis {axis} of {list(data.shape)} (ONNX refuses an index outside "
                                    f"[-{dim}, {dim}))")
                out = OPS["GatherElements"].reference([data, idx], {"axis": axis})
                return [Value("", ins[0].elem, tuple(out.shape), const=out)]
        if node.op_type == "Slice" and version >= 10 and ins[0] is not None:  # folded, yet it may clamp
            ends = [int(e) for e in np.asarray(ins[2].const).reshape(-1)]
            axes = ([int(a) % max(len(ins[0].shape), 1) for a in np.asarray(ins[3].const).reshape(-1)]
                    if len(ins) > 3 and ins[3] is not None else list(range(len(ends))))
            steps = ([int(s) for s in np.asarray(ins[4].const).reshape(-1)] if len(ins) > 4 and ins[4] is not None
                     else [1] * len(ends))
            if len(axes) == len(ends) == len(steps) and all(a < len(ins[0].shape) for a in axes):
                self.note_clamped(f"Slice node {node.name!r}", ins[0].shape, ends, axes, steps)
        from onnx.reference import ReferenceEvaluator

        names = [f"i{k}" if v is not None else "" for k, v in enumerate(ins)]
        outs = [f"o{k}" for k in range(len(node.output))]
        n2 = helper.make_node(node.op_type, names, outs, domain=node.domain)
        n2.attribute.extend(node.attribute)
        vis = [helper.make_tensor_value_info(nm, v.elem, v.shape) for nm, v in zip(names, ins, strict=True) if v]
        g2 = helper.make_graph([n2], "fold", vis, [helper.make_value_info(o, onnx.TypeProto()) for o in outs])
        m2 = helper.make_model(g2, opset_imports=[helper.make_opsetid("", version)])
        try:
            # numpy's warnings of a folded Log(0) or a Cast of inf (T5's and MPNet's relative position buckets take
            # log(0) at distance 0, then clamp it away) are the model's own arithmetic, not the user's concern
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                res = ReferenceEvaluator(m2).run(None, {nm: v.const for nm, v in zip(names, ins, strict=True) if v})
        except Exception as e:  # noqa: BLE001 - the evaluator raises what numpy raises
            # an empty batch or sequence is folded at load time, and an exporter's Flatten or Reshape of 0 rows
            # then fails in numpy: name the empty inputs as the likely cause
            empty = [f"{n!r} {list(s)}" for n, s in self.shapes.items() if 0 in tuple(s)]
            hint = (f". The input(s) {', '.join(empty)} have a dimension of size 0 (an empty batch or sequence), the "
                    "likely cause; give every input at least one row and one token (leave empty batches out before "
                    "calling run)") if empty else ""
            raise OnnxError(f"{node.op_type} node {node.name!r}: folding it at load time failed: {e}{hint}") from None
        return [Value("", helper.np_dtype_to_tensor_dtype(np.asarray(r).dtype), tuple(np.shape(r)),
                      const=np.asarray(r)) for r in res]

    def _if(self, node: onnx.NodeProto, ins: list[Value | None], env: dict[str, Value], version: int) -> list[Value]:
        cond = ins[0]
        if cond is None or cond.const is None:
            raise NeedsValuesError(
                f"If node {node.name!r}: its condition {node.input[0]!r} depends on the graph's inputs "
                f"{', '.join(map(repr, sorted(cond.deps if cond else ())))}; eggfuse inlines an If only when the "
                "condition is known at load time: give them with load(..., values={...}) (eggfuse.onnx.Model does "
                "so itself, one plan per value; eggfuse optimize: --input NAME=FILE.npy or NAME=NUMBER)",
                cond.deps if cond else frozenset())
        branch = "then_branch" if bool(np.asarray(cond.const).reshape(-1)[0]) else "else_branch"
        sub = next(a.g for a in node.attribute if a.name == branch)
        inner = dict(env)
        self.local_initializers(sub, inner)
        self._nodes(sub.node, inner, version)
        out = []
        for vi in sub.output:
            if vi.name not in inner:
                raise OnnxError(f"If node {node.name!r}: {branch} output {vi.name!r} is computed by no node")
            out.append(inner[vi.name])
        for k, v in inner.items():  # the branch's values stay visible to blocked-op bookkeeping only
            if k not in env and v.blocked:
                env[k] = v
        return out

    def local_initializers(self, sub: onnx.GraphProto, inner: dict[str, Value]) -> None:
        """Bind the initializers of subgraph ``sub`` (an If branch, a Loop or Scan body) in ``inner``, its scope:
        constants, which hide a value of the enclosing graph of the same name, as ONNX scoping has it."""
        for t in sub.initializer:
            arr = tensor_array(t, f"initializer {t.name!r} of subgraph {sub.name!r}")
            inner[t.name] = in_f32(Value(t.name, t.data_type, tuple(arr.shape), const=arr))

    def _domain_version(self, domain: str, version: int) -> int:
        """The opset of ``domain`` the model imports (``version`` for the default domain)."""
        return version if domain in ("", "ai.onnx") else self.opsets.get(domain, 1)

    def _expandable(self, node: onnx.NodeProto, version: int) -> Callable[[list], onnx.FunctionProto] | None:
        """A function giving the body that defines ``node``'s op (model-local, or a function
        of the ONNX standard for the model's opset), or None."""
        if (node.domain, node.op_type) in self._functions:
            fn = self._functions[(node.domain, node.op_type)]
            return lambda ins: fn
        if node.domain not in STANDARD_DOMAINS:
            return None
        version = self._domain_version(node.domain, version)
        try:
            schema = onnx.defs.get_schema(node.op_type, version, "" if node.domain == "ai.onnx" else node.domain)
        except onnx.defs.SchemaError:
            return None
        static = [v for v in schema.function_opset_versions if v <= version]
        context = [v for v in schema.context_dependent_function_opset_versions if v <= version]

        def parse(raw: bytes) -> onnx.FunctionProto:
            fn = onnx.FunctionProto()
            fn.ParseFromString(raw)
            return fn

        if static:
            return lambda ins: parse(schema.get_function_with_opset_version(max(static)))
        if context:
            def body(ins: list) -> onnx.FunctionProto:
                types = [helper.make_tensor_type_proto(v.elem, v.shape) if v else onnx.TypeProto() for v in ins]
                return parse(schema.get_context_dependent_function_with_opset_version(
                    max(context), node.SerializeToString(), [t.SerializeToString() for t in types]))
            return body
        return None

    def _expand(self, node: onnx.NodeProto, body: Callable[[list], onnx.FunctionProto], ins: list[Value | None],
                env: dict[str, Value], version: int) -> list[Value]:
        try:
            fn = body(ins)
        except Exception as e:  # noqa: BLE001 - the schema's C++ raises several kinds
            raise OnnxError(f"{node.op_type} node {node.name!r}: expanding its ONNX function failed: {e}") from None
        if not fn.node:
            raise OnnxError(f"{node.op_type} node {node.name!r}: its ONNX function has no body for opset {version}")
        self._count += 1
        prefix = f"{node.name or node.op_type}/{self._count}/"
        attrs = {a.name: a for a in node.attribute}
        for a in fn.attribute_proto:  # defaults of attributes the node leaves out
            attrs.setdefault(a.name, a)
        if node.domain in STANDARD_DOMAINS:  # a standard op's defaults are in its schema
            domain = "" if node.domain == "ai.onnx" else node.domain
            schema = onnx.defs.get_schema(node.op_type, self._domain_version(node.domain, version), domain)
            for name, a in schema.attributes.items():
                if a.default_value.type != onnx.AttributeProto.UNDEFINED:
                    attrs.setdefault(name, a.default_value)
        rename = {}
        for formal, actual in zip(fn.input, node.input, strict=False):
            rename[formal] = actual
        inner = dict(env)
        body_version = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), version)
        for sub in fn.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(sub)
            del n2.input[:]
            n2.input.extend(rename.get(i, prefix + i) if i else "" for i in sub.input)
            del n2.output[:]
            n2.output.extend(prefix + o if o else "" for o in sub.output)
            del n2.attribute[:]
            for a in sub.attribute:
                if a.ref_attr_name:
                    if a.ref_attr_name in attrs:
                        a2 = onnx.AttributeProto()
                        a2.CopyFrom(attrs[a.ref_attr_name])
                        a2.name = a.name
                        n2.attribute.append(a2)
                elif a.type == onnx.AttributeProto.GRAPH:  # an If's branch reads the body's names
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(a)
                    a2.g.CopyFrom(_scoped(a.g, lambda i: rename.get(i, prefix + i), attrs))
                    n2.attribute.append(a2)
                else:
                    n2.attribute.append(a)
            if not n2.name:
                n2.name = prefix + (sub.output[0] if sub.output else sub.op_type)
            self._node(n2, inner, body_version)
        out = []
        for formal in fn.output:
            v = inner.get(prefix + formal) or inner.get(rename.get(formal, ""))
            out.append(v)
        for k, v in inner.items():
            if k not in env and v.blocked:
                env[k] = v
        return out


def _scoped(graph: onnx.GraphProto, outer: Callable[[str], str],
            refs: Mapping[str, onnx.AttributeProto] | None = None) -> onnx.GraphProto:
    """A copy of the subgraph ``graph`` whose references to names of the enclosing scope (those
    it does not define itself) are renamed by ``outer``, in nested subgraphs too; with ``refs`` (a function's
    attributes as its caller gives them), its nodes' attribute references (``ref_attr_name``) are replaced by
    the attributes they name (left out where the caller gives none), at any depth."""
    g = onnx.GraphProto()
    g.CopyFrom(graph)
    inner = {vi.name for vi in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}

    def fix(name: str) -> str:
        return name if not name or name in inner else outer(name)

    for n in g.node:
        names = [fix(i) for i in n.input]
        del n.input[:]
        n.input.extend(names)
        if refs is not None and any(a.ref_attr_name for a in n.attribute):
            kept = []
            for a in n.attribute:
                if not a.ref_attr_name:
                    kept.append(a)
                elif a.ref_attr_name in refs:
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(refs[a.ref_attr_name])
                    a2.name = a.name
                    kept.append(a2)
            del n.attribute[:]
            n.attribute.extend(kept)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                a.g.CopyFrom(_scoped(a.g, fix, refs))
    for vi in g.output:
        vi.name = fix(vi.name)
    return g


def declared_shape(vi: onnx.ValueInfoProto) -> str:
    """An input's declared shape as messages print it: "[batch, 3, ?]" (a name for a symbolic dimension, ? for an
    unknown one), or "of any shape" where it declares none."""
    if not vi.type.tensor_type.HasField("shape"):
        return "of any shape"
    return f"[{', '.join('?' if d is None else str(d) for d in _dims(vi))}]"


def takes_kind(elem: int, dtype: np.dtype) -> bool:
    """Whether an array of ``dtype`` may stand for an input of ONNX element type ``elem`` (eggfuse runs it, or
    computes it in float32), converted to it: its own dtype, the same kind of number, any integers for an integer
    input, integers or floats for a float one (DOUBLE, FLOAT16 and BFLOAT16 too: bfloat16 is no numpy float kind)."""
    want = elem_numpy(elem)
    kind = "f" if elem in COMPUTED_IN_F32 else want.kind
    return dtype == want or dtype.kind == kind or (kind in "iu" and dtype.kind in "iu") or (
        kind == "f" and dtype.kind in "iuf")


def declared_mismatch(vi: onnx.ValueInfoProto, shape: Sequence[int]) -> str | None:
    """How ``shape`` differs from the input's declared shape ('rank 3', or 'dimension 1 is 4, ...'), or None where it
    fits it or the input declares none: a named or unknown dimension takes any size (as onnxruntime checks feeds)."""
    if not vi.type.tensor_type.HasField("shape"):
        return None
    dims = _dims(vi)
    if len(dims) != len(shape):
        return f"rank {len(shape)}"
    wrong = [f"dimension {i} is {g}" for i, (d, g) in enumerate(zip(dims, shape, strict=True))
             if isinstance(d, int) and d != g]
    return ", ".join(wrong) or None


def _load_value(vi: onnx.ValueInfoProto, value: Any) -> np.ndarray:
    # a value given for an input at load time (load's ``values``, a Model's inputs bound at load), as its element
    # type: OnnxError for None, what numpy makes no array of numbers from, another kind of number than the input's
    # (floats for an integer input, numbers for a bool one; integers for a float one are taken), an integer the type
    # does not hold, or a rank or fixed dimension other than the input declares
    elem = vi.type.tensor_type.elem_type
    if elem not in ELEM_DTYPE and elem not in COMPUTED_IN_F32:
        return np.asarray(value)  # a type eggfuse does not run: the import refuses it, with every op it cannot run
    want = elem_numpy(elem)
    declared = f"{elem_name(elem)} {declared_shape(vi)}"
    what = f"values: input {vi.name!r} ({declared})"
    try:
        arr = None if value is None else np.asarray(value)
    except (ValueError, TypeError) as e:
        raise OnnxError(f"{what}: numpy makes no array of the {type(value).__name__} given ({e}); "
                        "give an array") from None
    if arr is None or arr.dtype.kind not in "biuf":
        got = "None" if arr is None else f"{type(value).__name__} {value!r:.40} (to numpy an array of {arr.dtype})"
        raise OnnxError(f"{what}: got {got}; give an array of {want.name}")
    if not takes_kind(elem, arr.dtype):
        raise OnnxError(f"{what}: got an array of {arr.dtype}; give it as {want.name} "
                        f"(numpy: arr.astype({want.name!r}))")
    if want.kind in "iu" and arr.size and (arr.min() < np.iinfo(want).min or arr.max() > np.iinfo(want).max):
        raise OnnxError(f"{what}: a value outside {want.name}'s range")
    if declared_mismatch(vi, arr.shape):
        raise OnnxError(f"{what}: got shape {list(arr.shape)}; give an array of the declared shape (named "
                        "dimensions take any size)")
    return arr.astype(want)


def load(model: str | os.PathLike | onnx.ModelProto | bytes, shapes: Mapping[str, Sequence[int]] | None = None, *,
         values: Mapping[str, Any] | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """Import an ONNX model as an eggfuse graph and its parameters.

    ``model``: a path to an ``.onnx`` file, an ``onnx.ModelProto`` (not modified) or its serialised bytes.
    ``shapes``: input name -> shape, for inputs whose dimensions are not fixed in the model.
    ``values``: input name -> array, inputs fixed at load time (folded as constants; an
    ``If`` whose condition depends only on them is inlined).

    The graph's inputs and outputs keep their ONNX names and order; float initializers become
    parameters (``params``: name -> float32 array), but for a tied table's transposed copy, read as a
    Transpose of the table (:func:`transposed_copies`). Element types: float32, int32, int64
    (narrowed to int32) and bool. Raises :class:`~eggfuse.ir.UnsupportedOpsError` listing every
    op type eggfuse cannot run (count and first node of each), and
    :class:`~eggfuse.ir.OnnxError` for an unreadable file, an opset older than 7, an
    unsupported element type, attribute or shape, naming the node and tensor, for ``shapes``
    that are not a mapping of the model's inputs to shapes of their rank, every dimension a positive
    integer (:func:`checked_shapes`), and for ``values`` that do not fit their input: None, not numbers,
    another kind of number than the input's (integers for a float input are taken), an integer the input's type
    does not hold, or another rank or fixed dimension than the input declares.
    """
    proto = _load_proto(model)
    if values is not None and not isinstance(values, Mapping):
        raise OnnxError(f"values must be a mapping of input name -> array; got a {type(values).__name__}")
    graph, params, _ = Importer(proto, checked_shapes(shapes, proto), dict(values or {})).run()
    return graph, params


def import_model(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], values: Mapping[str, Any]
                 ) -> tuple[Graph, dict[str, np.ndarray], list[Value], dict[int, str]]:
    """:func:`load` for :class:`~eggfuse.onnx.Model`: also returns the output Values (their
    ONNX element types; the outputs known at load time are not graph outputs, their
    ``const`` is the result, and the graph has no outputs when all are known) and
    :attr:`Importer.origin` (graph node id -> the ONNX node that made it)."""
    importer = Importer(model, dict(shapes), dict(values), known_outputs=True)
    return (*importer.run(), importer.origin)


def first_out_of_range(indices: np.ndarray, dim: int) -> int | None:
    """The first of ``indices`` outside [-dim, dim) (ONNX's range for an axis of ``dim``), or None."""
    bad = np.asarray(indices)
    bad = bad[(bad >= dim) | (bad < -dim)]
    return int(bad.flat[0]) if bad.size else None


def fed_index_error(node: onnx.NodeProto, idx: Value, bad: int, axis: int, shape: Sequence[int]) -> None:
    """Raise IndexRangeError for a Gather's (GatherElements') index ``bad``, outside axis ``axis`` of data of
    ``shape``, where the indices ``idx`` come from inputs the import was given by value (the model needs them
    at load time): the feed's fault, named by the input, as the session's check names a run-time input. Returns
    where they do not (the caller raises its own error)."""
    if idx.deps:
        dim = int(shape[axis])
        name, fed = sorted(idx.deps)[0], ", ".join(map(repr, sorted(idx.deps)))
        which = f"input {fed}" if len(idx.deps) == 1 else f"inputs {fed}"
        raise IndexRangeError(f"input {name!r}: index {bad} out of range for axis {axis} of {list(shape)} that "
                              f"{node.op_type} node {node.name!r} indexes with it (the indices come from {which}, "
                              f"whose values the model needs at load time; ONNX refuses an index outside [-{dim}, "
                              f"{dim})); give indices from -{dim} to {dim - 1}", input=name, index=bad, rows=dim)


#: Ops whose outputs' elements are their inputs' values, unchanged (views, a Cast of indices, and ops that move
#: elements: the session follows indices through them, ``Graph.index_reads``).
_PASS_VALUES = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Split", "Slice",
                          "Transpose", "Concat", "Expand", "Tile"})


def onnx_index_readers(graph: onnx.GraphProto, name: str, rows: int) -> list[str]:
    """The Gather nodes of ``graph`` that index an axis of ``rows`` with the graph input ``name`` (as their
    indices, directly or through Cast, Reshape, Unsqueeze, Squeeze, Flatten, Identity, or ops that move
    elements: Split, Slice, Transpose, Concat, Expand, Tile), as
    ``'node name' (Gather)``, in the graph's order: those whose indices the session bounds before a run
    (``IndexRangeError``). A Gather whose data's shape the file does not declare is listed whatever its rows."""
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info):
        shape = vi.type.tensor_type.shape
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in shape.dim):
            dims.setdefault(vi.name, [d.dim_value for d in shape.dim])
    reached, found = {name}, []
    for node in graph.node:  # topologically sorted, as ONNX requires
        if not any(x in reached for x in node.input):
            continue
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in reached:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            shape = dims.get(node.input[0])
            if shape is None or -len(shape) <= axis < len(shape) and shape[axis] == rows:
                found.append(f"{node.name or node.output[0]!r} (Gather)")
        elif node.op_type in _PASS_VALUES:
            reached.update(o for o in node.output if o)
    return found


def with_onnx_nodes(error: LoweringError, origin: Mapping[int, str], graph: onnx.GraphProto,
                    shown: int = 6) -> LoweringError:
    """``error`` (raised compiling an imported graph) with the ONNX nodes it is about named at the end of its
    message, e.g. ``[ONNX nodes '/mlp/fc/MatMul' (MatMul), '/mlp/fc/Add' (Add), '/mlp/act/Relu' (Relu)]``:
    the nodes whose import made ``error.sources`` (:attr:`Importer.origin`), in the model's order; of more than
    ``shown``, the first and the last (where a fused op's inputs and its result are) and the count. ``error``
    itself when it names no such node; else a new error of its type with its ``nodes`` and ``sources``."""
    names = list(dict.fromkeys(origin[i] for i in sorted(error.sources) if i in origin))
    if not names:
        return error
    op_type = {n.name or (n.output[0] if n.output else n.op_type): n.op_type for n in graph.node}

    def named(ns: list[str]) -> str:
        return ", ".join(f"{n!r} ({op_type[n]})" if n in op_type else repr(n) for n in ns)

    if len(names) > shown:
        head = shown // 2
        listed = f"{named(names[:head]) + ', ' if head else ''}..., {named(names[head - shown:])}; {len(names)} in all"
    else:
        listed = named(names)
    return type(error)(f"{error} [ONNX node{'s' if len(names) > 1 else ''} {listed}]", nodes=error.nodes,
                       sources=error.sources)
