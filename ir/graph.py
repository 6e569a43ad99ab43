"""The op graph: nodes in topological order, builder methods that check shapes."""

from __future__ import annotations

import copy
import difflib
import math
import operator
import os
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import GraphError, InputError
from .spec import OPS, REQUIRED, BelowMinimum, ShapeError
from .types import DType, TensorType

NodeId = int


class NodeRef(int):
    """A node id as a :class:`Graph`'s builder returns it: an int that also remembers (weakly) the
    graph that made it, so that passing it to another graph raises GraphError instead of wiring
    that graph's node of the same number (unless that node is the same, as in a copy of the graph).
    Graphs store plain ints; a NodeRef pickles and deep-copies as one."""

    def __new__(cls, value: int, graph: Graph) -> NodeRef:
        ref = super().__new__(cls, value)
        ref._graph = weakref.ref(graph)
        return ref

    def __reduce__(self):
        return int, (int(self),)

    def __deepcopy__(self, memo) -> int:
        return int(self)


def _dimension(d: Any) -> int:
    # a dimension of a shape as an int: an int, a numpy integer or a 0-d integer array; TypeError for anything else,
    # a bool, a float or a str too (int() would truncate 2.5 to 2 and take True as 1)
    if isinstance(d, bool | np.bool_):
        raise TypeError(f"{d!r} is a bool")
    return operator.index(d)


def _foreign(graph: Graph, ids: Sequence[Any]) -> Any:
    # the first of ``ids`` made by another live graph whose node of that number is not ``graph``'s (a
    # graph copied node for node, as step_graph copies one, shares its nodes: their ids are the same
    # nodes), or None
    for i in ids:
        owner = getattr(i, "_graph", None)
        other = owner() if owner is not None else None
        if other is not None and other is not graph:
            k = int(i)
            if not (k < len(graph.nodes) and k < len(other.nodes) and other.nodes[k] is graph.nodes[k]):
                return i
    return None


#: What a node id may be (bools are refused apart).
_ID_TYPES = (int, np.integer)

@dataclass(frozen=True)
class Node:
    """One op application. ``inputs`` are ids of earlier nodes; ``attrs`` are the op's attributes."""

    id: NodeId
    op: str
    inputs: tuple[NodeId, ...]
    attrs: dict[str, Any] = field(hash=False, compare=False)
    type: TensorType = TensorType((1,))

    @property
    def name(self) -> str | None:
        return self.attrs.get("name")

    def describe(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"node {self.id} ({self.op}{label}, {self.type})"


class Graph:
    """A DAG of ops in topological order (every input id is smaller than its node's id).

    Build it with the methods below; each returns the new node's id (a :class:`NodeRef`, an int
    that another graph refuses with GraphError). Leaves are
    ``input`` (fed per run), ``parameter`` (weights, uploaded once) and ``constant``.
    Every builder checks shapes and dtypes and raises :class:`GraphError` naming the op
    and the offending shapes. Outputs are declared with :meth:`set_outputs`.
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.outputs: list[NodeId] = []
        self._leaf_names: dict[str, NodeId] = {}

    # --- core -----------------------------------------------------------------------

    def add_node(self, op: str, inputs: Sequence[NodeId] = (), **attrs: Any) -> NodeId:
        """Append a node of kind ``op`` after checking its inputs with the op's shape rule.

        Attributes are normalised to their declared kinds (``OpSpec.attrs``; defaults fill
        the ones left out). Raises :class:`GraphError` for an unknown op, a wrong number of
        inputs, an input id that does not exist, a missing, unknown or ill-typed attribute,
        or shapes the op rejects.
        """
        return self._add_node(op, inputs, attrs)

    def _add_node(self, op: str, inputs: Sequence[NodeId], attrs: dict[str, Any], call: str | None = None) -> NodeId:
        # add_node's work; ``call`` names the op in the messages where the builder the user called makes a node of
        # another op (reshape: an Identity)
        spec = OPS.get(op)
        if spec is None:
            raise GraphError(_unknown_op(op))
        what = call or op
        try:
            given = list(inputs)
        except TypeError:
            raise GraphError(f"{what}: inputs must be node ids (ints), got {inputs!r}") from None
        for i in given:  # a float was rounded down to a node id (g.mul(x, 1.0) multiplied by node 1)
            if isinstance(i, bool) or not isinstance(i, _ID_TYPES):
                hint = (f"; for the number {i!r} add a constant, g.constant({i!r})"
                        if isinstance(i, float | np.floating) else "")
                raise GraphError(f"{what}: inputs must be node ids (ints, as the graph's methods return them), got "
                                 f"{i!r} ({type(i).__name__}){hint}")
        inputs = tuple(int(i) for i in given)
        if (other := _foreign(self, given)) is not None:
            raise GraphError(f"{what}: input {int(other)} is a node of another Graph; build each graph from its "
                             f"own nodes (the ids its methods return)")
        limit = spec.input_limit
        if len(inputs) < spec.min_inputs or (limit is not None and len(inputs) > limit):
            takes = f"{spec.min_inputs}.." + ("" if limit is None else str(limit))
            raise GraphError(f"{what}: takes {takes} inputs ({', '.join(spec.inputs) or 'none'}), got {len(inputs)}")
        for i in inputs:
            if not 0 <= i < len(self.nodes):
                raise GraphError(f"{what}: input id {i} is not a node of this graph ({len(self.nodes)} nodes)")
        full = self._attributes(spec, attrs)
        types = [self.nodes[i].type for i in inputs]
        try:
            ty = spec.infer(types, full)
        except ShapeError as e:
            shapes = ", ".join(f"node {i} {t}" for i, t in zip(inputs, types, strict=True))
            raise GraphError(f"{what} (new node {len(self.nodes)}): {e} [inputs: {shapes}]") from None
        node = Node(len(self.nodes), op, inputs, full, ty)
        self.nodes.append(node)
        return NodeRef(node.id, self)

    @staticmethod
    def _attributes(spec, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(attrs) - set(spec.attr_names))
        if unknown:
            known = ", ".join(spec.attr_names) or "none"
            raise GraphError(f"{spec.name}: unknown attribute(s) {', '.join(unknown)}; its attributes are: {known}")
        full = {}
        for a in spec.attrs:
            if a.name not in attrs:
                if a.default is REQUIRED:
                    raise GraphError(f"{spec.name}: missing attribute {a.name} ({a.kind})")
                full[a.name] = a.default
                continue
            try:
                full[a.name] = a.normalise(attrs[a.name])
            except BelowMinimum as e:
                raise GraphError(f"{spec.name}: attribute {e}") from None
            except (TypeError, ValueError) as e:
                raise GraphError(f"{spec.name}: attribute {a.name} must be {a.kind}, got {attrs[a.name]!r} ({e})") \
                    from None
        return full

    def node(self, nid: NodeId) -> Node:
        """The node of id ``nid`` (an int its builder returned). Raises :class:`GraphError` for an id that is
        not one of this graph's nodes (a negative one included)."""
        if isinstance(nid, bool) or not isinstance(nid, _ID_TYPES) or not 0 <= nid < len(self.nodes):
            raise GraphError(f"node id {nid!r} is not a node of this graph ({len(self.nodes)} nodes, ids 0.."
                             f"{len(self.nodes) - 1}; use the ids the graph's methods return)")
        return self.nodes[nid]

    def set_outputs(self, outputs: Iterable[NodeId]) -> None:
        """Declare the graph's outputs: node ids (ints, as the graph's methods return them), at least one.
        Raises :class:`GraphError` otherwise."""
        try:
            outputs = list(outputs)
        except TypeError:
            raise GraphError(f"outputs must be node ids (ints) in a list, got {outputs!r}") from None
        for o in outputs:
            if isinstance(o, bool) or not isinstance(o, _ID_TYPES):
                raise GraphError(f"outputs must be node ids (ints, as the graph's methods return them), got {o!r} "
                                 f"({type(o).__name__})")
        outs = [int(o) for o in outputs]
        if (other := _foreign(self, outputs)) is not None:
            raise GraphError(f"output {int(other)} is a node of another Graph; declare this graph's own nodes")
        for o in outs:
            if not 0 <= o < len(self.nodes):
                raise GraphError(f"output id {o} is not a node of this graph ({len(self.nodes)} nodes)")
        if not outs:
            raise GraphError("a graph needs at least one output")
        self.outputs = outs

    def __len__(self) -> int:
        return len(self.nodes)

    def copy(self) -> Graph:
        """A graph of the same class, nodes and outputs that later changes to either (new nodes, other outputs)
        leave the other as it was. The nodes themselves, which no method changes, and the arrays of their
        attributes (a Constant's value) are shared, so a copy costs a list of references, not the constants."""
        new = type(self).__new__(type(self))
        for attr, value in vars(self).items():
            setattr(new, attr, copy.copy(value))
        return new

    def check_outputs(self) -> None:
        """Raise :class:`GraphError` unless :meth:`set_outputs` has declared outputs (what
        evaluating, optimising and lowering need)."""
        if not self.outputs:
            raise GraphError(f"the graph has no outputs ({len(self.nodes)} nodes); "
                             "call graph.set_outputs([...]) with the nodes to compute first")

    def leaves(self, op: str) -> list[Node]:
        return [n for n in self.nodes if n.op == op]

    @property
    def parameters(self) -> dict[str, TensorType]:
        return {n.attrs["name"]: n.type for n in self.leaves("Parameter")}

    @property
    def inputs(self) -> dict[str, TensorType]:
        return {n.attrs["name"]: n.type for n in self.leaves("Input")}

    def live_nodes(self) -> list[Node]:
        """Nodes the outputs depend on, in topological order."""
        live = set()
        stack = list(self.outputs)
        while stack:
            n = stack.pop()
            if n not in live:
                live.add(n)
                stack.extend(self.nodes[n].inputs)
        return [n for n in self.nodes if n.id in live]

    def pruned(self) -> Graph:
        """A copy holding only the live nodes, renumbered in the same order."""
        out = Graph()
        new: dict[NodeId, NodeId] = {}
        for n in self.live_nodes():
            node = Node(len(out.nodes), n.op, tuple(new[i] for i in n.inputs), dict(n.attrs), n.type)
            out.nodes.append(node)
            new[n.id] = node.id
        out.outputs = [new[o] for o in self.outputs]
        out._leaf_names = {n.attrs["name"]: n.id for n in out.nodes if n.op in ("Input", "Parameter")}
        return out

    def is_derived_parameter(self, node: Node) -> bool:
        """A node of an op that packs parameters (``OpSpec.packs_parameters``: Concat) whose
        inputs are all parameters: packed once when a session is created, never dispatched.

        Not when an op of the graph updates one of those parameters in place (a training
        step): the packed copy would keep the first values, so the Concat is dispatched."""
        if not OPS[node.op].packs_parameters or not all(self.nodes[i].op == "Parameter" for i in node.inputs):
            return False
        return not any(n.inputs[w] in node.inputs for n in self.nodes for w in OPS[n.op].written_inputs)

    def index_bounds(self) -> dict[NodeId, int]:
        """Leaf id -> the bound of its index values (u32: [0, bound), i32: [-bound, bound)): the
        smallest bound of the ops that read it as indices (``OpSpec.index_bounds``), through
        reshape views."""
        return {leaf: rows for leaf, (rows, _, _) in self._index_readers().items()}

    def index_readers(self) -> dict[NodeId, str]:
        """Leaf id -> the op that sets its :meth:`index_bounds`, for messages: ``"Gather (node 7) of parameter
        'wte' f32[50257,768]"`` (the table it indexes: the parameter of that many rows nearest the indices)."""
        return {leaf: self.reader_label(node, slot, rows) for leaf, (rows, node, slot) in self._index_readers().items()}

    def _index_readers(self) -> dict[NodeId, tuple[int, Node, int]]:
        # leaf id -> (its bound, the node setting it, the input slot the node reads it at)
        out: dict[NodeId, tuple[int, Node, int]] = {}
        for leaf, reads in self.index_reads().items():
            for rows, node, slot, _, component in reads:
                if component is None and (leaf not in out or rows < out[leaf][0]):
                    out[leaf] = (rows, node, slot)
        return out

    def index_reads(self) -> dict[NodeId, list[tuple[int, Node, int, bool, int | None]]]:
        """Node id -> every read of its values as indices: (the bound, the reading node, the input slot, whether
        the read may take only part of the node's elements, and for a bound of the elements at one position
        along the read input's last axis, that position), followed back through ops that move elements
        (views and ``OpSpec.moves``: Slice, Concat, Transpose, ...) to the nodes the elements come from (a
        leaf, or a node that computes them); its :meth:`index_bounds` is the smallest bound of a whole read.
        Where the read is of a part, :meth:`index_positions` tells which elements."""
        out: dict[NodeId, list[tuple[int, Node, int, bool, int | None]]] = {}
        for node in self.nodes:
            hook = OPS[node.op].index_bounds
            if hook is None:
                continue
            for slot, rows in hook([self.nodes[i].type for i in node.inputs], node.attrs).items():
                if isinstance(rows, tuple) and len(set(rows)) == 1:
                    rows = rows[0]
                for src, part in self._moved_from(node.inputs[slot]):
                    if isinstance(rows, tuple):  # one bound a position of the last axis (GatherND's tuples)
                        out.setdefault(src, []).extend((r, node, slot, True, j) for j, r in enumerate(rows))
                    else:
                        out.setdefault(src, []).append((rows, node, slot, part, None))
        return out

    def _moved_from(self, nid: NodeId) -> list[tuple[NodeId, bool]]:
        # (source, whether only part of it may be read): the nodes whose elements node nid's are copies of
        out: dict[NodeId, bool] = {}
        todo, seen = [(nid, False)], set()
        while todo:
            i, part = todo.pop()
            if (i, part) in seen:
                continue
            seen.add((i, part))
            spec = OPS[self.nodes[i].op]
            if spec.view or spec.moves:
                part = part or not (spec.view and spec.view_offset is None)  # anything but a reshape
                todo.extend((j, part) for j in self.nodes[i].inputs)
            else:
                out[i] = out.get(i, False) or part
        return list(out.items())

    def index_positions(self, source: NodeId, node: Node, slot: int, component: int | None = None) -> np.ndarray:
        """The flat (row-major) positions of ``source``'s elements that ``node`` reads as indices at input
        ``slot`` (sorted, unique int64), where :meth:`index_reads` lists that read (``component``: only those at
        that position along the input's last axis): the moving ops between them (their references) run on the
        element numbers 0..n-1 of ``source``, every other node as -1."""
        memo: dict[NodeId, np.ndarray] = {}

        def numbers(i: NodeId) -> np.ndarray:
            if i not in memo:
                n = self.nodes[i]
                spec = OPS[n.op]
                if i == source:
                    memo[i] = np.arange(n.type.num_elements, dtype=np.int64).reshape(n.type.shape)
                elif spec.view or spec.moves:
                    memo[i] = np.asarray(spec.reference([numbers(j) for j in n.inputs], n.attrs))
                else:
                    memo[i] = np.full(n.type.shape, -1, dtype=np.int64)
            return memo[i]

        got = numbers(node.inputs[slot])
        if component is not None:
            got = got[..., component]
        return np.unique(got[got >= 0])

    def reader_label(self, node: Node, slot: int, rows: int) -> str:
        """``node`` (reading indices at input ``slot``, bounded by ``rows``) for messages, with the table it indexes:
        the parameter of rank 2 or more with that many rows (along Gather's axis) nearest to the indices among its
        inputs (they sit next to their table: ids0, table0, ...; Gather's data before its indices)."""
        axis = node.attrs.get("axis", 0) if node.op == "Gather" else 0
        tables = sorted((abs(k - slot - 0.5), k) for k, i in enumerate(node.inputs)
                        if k != slot and self.nodes[i].op == "Parameter" and self.nodes[i].type.rank >= 2
                        and self.nodes[i].type.shape[axis % self.nodes[i].type.rank] == rows)
        near = self.nodes[node.inputs[tables[0][1]]] if tables else None
        return f"{node.op} (node {node.id})" + (f" of parameter {near.name!r} {near.type}" if near is not None else "")

    def dispatches(self, node: Node) -> int:
        """GPU dispatches ``node`` needs when lowered."""
        return 0 if self.is_derived_parameter(node) else OPS[node.op].dispatches

    def dispatch_count(self) -> int:
        """GPU dispatches the live part of the graph needs (leaves, views and derived parameters need none)."""
        return sum(self.dispatches(n) for n in self.live_nodes())

    def summary(self) -> str:
        lines = []
        for n in self.nodes:
            attrs = {k: v for k, v in n.attrs.items() if k not in ("type", "value")}
            lines.append(f"%{n.id} = {n.op}({', '.join(f'%{i}' for i in n.inputs)}) {attrs} : {n.type}")
        lines.append(f"outputs: {', '.join(f'%{o}' for o in self.outputs)}")
        return "\n".join(lines)

    # --- leaves ---------------------------------------------------------------------

    def _check_name(self, op: str, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"{op}: name must be a non-empty string, got {name!r}")
        if name in self._leaf_names:
            raise GraphError(f"{op} {name!r}: name already used by {self.nodes[self._leaf_names[name]].describe()}")

    @staticmethod
    def _shape(op: str, shape: Sequence[int], name: str | None = None) -> tuple[int, ...]:
        # the shape every builder that takes one checks: ints (numpy's too), never floats or bools, which int()
        # would truncate (2.5 -> 2, True -> 1)
        what = op if name is None else f"{op} {name!r}"
        try:
            given = list(shape)
        except TypeError:
            raise GraphError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
        dims = []
        for k, d in enumerate(given):
            try:
                dims.append(_dimension(d))
            except TypeError:
                raise GraphError(f"{what}: dimension {k} of shape {given!r} is {d!r} ({type(d).__name__}), not an "
                                 f"integer; give every dimension as an int") from None
        dims = tuple(dims)
        if any(d < 1 for d in dims):
            raise GraphError(f"{what}: every dimension must be >= 1 (an empty tensor cannot be stored), got "
                             f"{list(dims)}")
        return dims

    @staticmethod
    def _dtype(op: str, name: str, dtype: Any) -> DType:
        # a DType, its value ("f32") or the numpy dtype it is stored as (np.float32); another string was kept as the
        # dtype and failed in a later builder with an AttributeError
        if isinstance(dtype, DType):
            return dtype
        if isinstance(dtype, str) and dtype in {d.value for d in DType}:
            return DType(dtype)
        try:
            as_numpy = np.dtype(dtype)
        except TypeError:
            as_numpy = None
        for d in DType:
            if as_numpy is not None and as_numpy == d.numpy:
                return d
        kinds = ", ".join(f"DType.{d.name}" for d in DType)
        values = ", ".join(repr(d.value) for d in DType)
        raise GraphError(f"{op} {name!r}: dtype {dtype!r} is not one eggfuse computes in: give a DType ({kinds}), "
                         f"its value ({values}) or the numpy dtype it is stored as (np.float32, np.uint32, np.int32, "
                         "np.bool_)")

    def input(self, name: str, shape: Sequence[int], dtype: DType = DType.F32) -> NodeId:
        """A tensor fed at every run, of ``shape`` (``()`` for a scalar) and ``dtype`` (a :class:`DType`, its value
        such as ``"i32"``, or the numpy dtype it is stored as). Raises :class:`GraphError` for a bad name, shape or
        dtype."""
        self._check_name("Input", name)
        dtype = self._dtype("Input", name, dtype)
        nid = self.add_node("Input", (), name=name, type=TensorType(self._shape("Input", shape, name), dtype))
        self._leaf_names[name] = int(nid)
        return nid

    def state(self, name: str, shape: Sequence[int]) -> NodeId:
        """A named f32 tensor that lives on the device across runs (a KV cache, optimiser
        moments). It is a Parameter that in-place ops may update; a session fills it with
        zeros unless given a value."""
        self._check_name("Parameter", name)
        nid = self.add_node("Parameter", (), name=name, state=True,
                            type=TensorType(self._shape("Parameter", shape, name)))
        self._leaf_names[name] = int(nid)
        return nid

    def parameter(self, name: str, shape: Sequence[int], dtype: DType = DType.F32) -> NodeId:
        """A named weight of ``dtype`` (f32; u32 for packed data such as quantised blocks, see
        ``ir/ops/quant.py``; given as for :meth:`input`), uploaded once per session."""
        self._check_name("Parameter", name)
        dtype = self._dtype("Parameter", name, dtype)
        nid = self.add_node("Parameter", (), name=name, type=TensorType(self._shape("Parameter", shape, name), dtype))
        self._leaf_names[name] = int(nid)
        return nid

    def constant(self, value: Any, shape: Sequence[int] | None = None, dtype: DType = DType.F32) -> NodeId:
        """A constant baked into the graph, of ``dtype`` (a :class:`DType`, its value such as ``"i32"``, or the
        numpy dtype it is stored as, as :meth:`input` takes it; copied: the caller's array is not
        kept). A 0-d value becomes shape ``[1]`` unless ``shape=()`` asks for a scalar. Infinities and NaN given
        as such are kept (a -inf mask). Raises :class:`GraphError` when the values do not fill ``shape`` or do
        not fit ``dtype``: a finite value beyond float32's range, an integer float32 does not hold exactly (beyond
        2^24), an integer beyond an integer dtype's range."""
        from .reference import check_array

        dtype = self._dtype("Constant", "value", dtype)  # "f32" or np.int32, as input() takes them
        arr = np.array(value, copy=True)
        if shape is not None:
            shape = self._shape("Constant", shape)
            if arr.size != int(np.prod(shape)):
                raise GraphError(f"Constant: {arr.size} values do not fill shape {list(shape)}")
            arr = arr.reshape(shape)
        elif arr.ndim == 0:
            arr = arr.reshape(1)
        ty = TensorType(self._shape("Constant", arr.shape), dtype)
        if dtype is DType.F32 and arr.dtype == np.bool_:
            arr = arr.astype(np.float32)
        try:
            out = check_array("Constant", arr, ty, finite=False, exact=True)
        except InputError as e:
            raise GraphError(str(e)) from None
        if dtype is DType.F32 and arr.dtype.kind == "f":  # (every integer type fits float32's range)
            with np.errstate(invalid="ignore"):
                overflow = np.isfinite(arr) & ~np.isfinite(out)  # a finite value float32 holds as infinity
            if overflow.any():
                at = [int(i) for i in np.argwhere(overflow)[0]]
                raise GraphError(f"Constant: {float(arr[tuple(at)]):g} at {at} is beyond float32's range "
                                 f"(|x| < 3.4e38) for {ty}; give a value in range, or float('inf') where infinity "
                                 "is meant")
        arr = out
        arr.setflags(write=False)
        return self.add_node("Constant", (), name=f"const{len(self.nodes)}", value=arr, type=ty)

    # --- builders: one line each, the shape rules live in ops.py ------------------------

    def matmul(self, a: NodeId, b: NodeId) -> NodeId:
        """C[M,N] = A[M,K] @ B[K,N]."""
        return self.add_node("MatMul", (a, b))

    def matmul_at(self, a: NodeId, b: NodeId) -> NodeId:
        """C[M,N] = A[K,M]^T @ B[K,N]."""
        return self.add_node("MatMulAT", (a, b))

    def matmul_bt(self, a: NodeId, b: NodeId) -> NodeId:
        """C[M,N] = A[M,K] @ B[N,K]^T (a linear layer with a [out,in] weight)."""
        return self.add_node("MatMulBT", (a, b))

    def add(self, a: NodeId, b: NodeId) -> NodeId:
        """Elementwise a + b with numpy broadcasting (shapes aligned from the last axis). ``a``, ``b``: node ids
        (ints: a number is a node too, ``g.constant(1.0)``; ``g.add(x, 1)`` adds node 1). Raises
        :class:`GraphError` for shapes that do not broadcast, and for a float where an id belongs."""
        return self.add_node("Add", (a, b))

    def mul(self, a: NodeId, b: NodeId) -> NodeId:
        """Elementwise a * b with numpy broadcasting; ``a``, ``b`` and errors as :meth:`add`."""
        return self.add_node("Mul", (a, b))

    def bias_add(self, x: NodeId, bias: NodeId) -> NodeId:
        """x[M,N] + bias[N] (or [1,N]) broadcast over rows."""
        return self.add_node("BiasAdd", (x, bias))

    def relu(self, x: NodeId) -> NodeId:
        """max(x, 0) elementwise, the shape and dtype of ``x`` (f32 or i32; ONNX Relu)."""
        return self.add_node("Relu", (x,))

    def sigmoid(self, x: NodeId) -> NodeId:
        """1 / (1 + exp(-x)) elementwise, f32, the shape of ``x`` (ONNX Sigmoid)."""
        return self.add_node("Sigmoid", (x,))

    def tanh(self, x: NodeId) -> NodeId:
        """tanh(x) elementwise, f32, the shape of ``x`` (ONNX Tanh)."""
        return self.add_node("Tanh", (x,))

    def neg(self, x: NodeId) -> NodeId:
        """-x elementwise, the shape and dtype of ``x`` (f32 or i32, where -(-2^31) wraps; ONNX Neg)."""
        return self.add_node("Neg", (x,))

    def gelu(self, x: NodeId, approximate: str = "erf") -> NodeId:
        """GELU, erf form (``approximate='erf'``, BERT) or tanh form (``'tanh'``, GPT-2)."""
        if approximate not in ("erf", "tanh"):
            raise GraphError(f"Gelu: approximate must be 'erf' or 'tanh', got {approximate!r}")
        return self.add_node("Gelu" if approximate == "erf" else "GeluTanh", (x,))

    def silu(self, x: NodeId) -> NodeId:
        """x * sigmoid(x) elementwise (SiLU / swish; Elfwing et al. 2018), f32, the shape of ``x``."""
        return self.add_node("Silu", (x,))

    def swiglu(self, gate: NodeId, up: NodeId) -> NodeId:
        """silu(gate) * up."""
        return self.add_node("SwiGLU", (gate, up))

    def softmax(self, x: NodeId) -> NodeId:
        """exp(x - max) / sum(exp(x - max)) over the last axis of ``x`` (f32; the max subtracted per row), the
        shape of ``x``."""
        return self.add_node("Softmax", (x,))

    def rms_norm(self, x: NodeId, weight: NodeId, eps: float = 1e-5) -> NodeId:
        """x[..., N] / sqrt(mean(x^2, last axis) + eps) * weight[N]."""
        return self.add_node("RmsNorm", (x, weight), eps=eps)

    def layer_norm(self, x: NodeId, weight: NodeId, bias: NodeId, eps: float = 1e-5) -> NodeId:
        """(x - mean) / sqrt(var + eps) * weight + bias, over the last axis of x[..., N]."""
        return self.add_node("LayerNorm", (x, weight, bias), eps=eps)

    def embedding(self, indices: NodeId, table: NodeId) -> NodeId:
        """out[T, H] = table[V, H][indices[T]]: ``indices`` a u32 input or node (an input is fed any integer
        array, numpy or a list, checked at each run to lie in 0..V-1: :class:`~eggfuse.ir.IndexRangeError`
        otherwise), ``table`` f32 [V, H]."""
        return self.add_node("Embedding", (indices, table))

    def rope(self, x: NodeId, theta: float, head_dim: int, pos_offset: int = 0,
             pairing: str = "half", batch: int = 1, scaling: tuple | None = None) -> NodeId:
        """Rotary position embedding of x[rows, heads*head_dim]; see :func:`ops.rope_pairs` and,
        for ``scaling``, :func:`ops.rope_inv_freq`."""
        return self.add_node("RoPE", (x,), theta=theta, head_dim=head_dim, pos_offset=pos_offset,
                             pairing=pairing, batch=batch, scaling=scaling)

    def full_attention(self, q: NodeId, k: NodeId, v: NodeId, num_heads: int, num_kv_heads: int,
                       head_dim: int, batch: int = 1, key_mask: NodeId | None = None,
                       masked_rows: str = "mean") -> NodeId:
        """Non-causal GQA attention over ``batch`` sequences stacked by rows.

        q [B*S, H*D], k/v [B*S, KV*D] -> [B*S, H*D]; ``key_mask`` [B, S]: f32 (> 0 keeps a key), i32
        (non-zero keeps it) or bool (true keeps it); a query row whose mask keeps no key gives the mean
        of v (``masked_rows`` ``"mean"``) or zeros (``"zero"``, ONNX Attention's rule).
        """
        ins = (q, k, v) if key_mask is None else (q, k, v, key_mask)
        return self.add_node("FullAttention", ins, num_heads=num_heads, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, batch=batch, masked_rows=masked_rows)

    def causal_attention(self, q: NodeId, k: NodeId, v: NodeId, num_heads: int, num_kv_heads: int,
                         head_dim: int, batch: int = 1, key_mask: NodeId | None = None,
                         masked_rows: str = "mean") -> NodeId:
        """Causal GQA attention; shapes as :meth:`full_attention`. A query row whose ``key_mask``
        keeps none of the keys up to its own gives the mean of v over all the sequence's keys
        (``"mean"``) or zeros (``"zero"``). With a key_mask it has no gradient."""
        ins = (q, k, v) if key_mask is None else (q, k, v, key_mask)
        return self.add_node("CausalAttention", ins, num_heads=num_heads, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, batch=batch, masked_rows=masked_rows)

    def concat(self, xs: Sequence[NodeId], axis: int = 0) -> NodeId:
        """Concatenation along ``axis``; of parameters only, a derived parameter (no dispatch)."""
        return self.add_node("Concat", xs, axis=axis)

    def slice_cols(self, x: NodeId, start: int, size: int) -> NodeId:
        """Columns [start, start+size) of a 2-D tensor."""
        return self.add_node("SliceCols", (x,), start=start, size=size)

    def swiglu_concat(self, x: NodeId) -> NodeId:
        """silu(x[:, :N]) * x[:, N:] for x [M, 2N]."""
        return self.add_node("SwiGLUConcat", (x,))

    def group_norm(self, x: NodeId, weight: NodeId, bias: NodeId, num_groups: int, eps: float = 1e-5) -> NodeId:
        """GroupNorm of x [N, C, S] with per-channel weight and bias [C]."""
        return self.add_node("GroupNorm", (x, weight, bias), num_groups=num_groups, eps=eps)

    def causal_attention_rope(self, q: NodeId, k: NodeId, v: NodeId, num_heads: int, num_kv_heads: int,
                              head_dim: int, theta: float, pos_offset: int = 0, pairing: str = "half",
                              batch: int = 1, scaling: tuple | None = None, key_mask: NodeId | None = None,
                              masked_rows: str = "mean") -> NodeId:
        """CausalAttention(RoPE(q), RoPE(k), v, key_mask, masked_rows) in one kernel."""
        ins = (q, k, v) if key_mask is None else (q, k, v, key_mask)
        return self.add_node("CausalAttentionRoPE", ins, num_heads=num_heads, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, theta=theta, pos_offset=pos_offset, pairing=pairing, batch=batch,
                             scaling=scaling, masked_rows=masked_rows)

    def transpose(self, x: NodeId) -> NodeId:
        """out[j, i] = x[i, j] of a 2-D ``x`` [M, N] -> [N, M] (other ranks: ``add_node("Permute", [x], perm=[...])``,
        ONNX Transpose). Raises :class:`GraphError` for another rank."""
        return self.add_node("Transpose", (x,))

    def reshape(self, x: NodeId, shape: Sequence[int]) -> NodeId:
        """A view of x with another shape and the same element count (no dispatch). One dimension may be -1,
        inferred from x's element count as numpy's ``reshape`` infers it. GraphError for a dimension that is not
        an integer, more than one -1, or another element count."""
        # an Identity node (a view); the messages name the call, Reshape
        return self._add_node("Identity", (x,), {"shape": self._shape("Reshape", self._inferred(x, shape))},
                              call="Reshape")

    def _inferred(self, x: NodeId, shape: Sequence[int]) -> Sequence[int]:
        # ``shape`` with its one -1 replaced by what x's element count leaves for it; as given where it has no -1 or
        # a dimension that is no integer (the checks that follow name those)
        try:
            given = [_dimension(d) for d in shape]
        except TypeError:
            return shape
        at = [k for k, d in enumerate(given) if d == -1]
        if not at:
            return shape
        if len(at) > 1:
            raise GraphError(f"Reshape: at most one dimension may be -1 (inferred from the element count), got "
                             f"{given!r}")
        try:
            node = self.nodes[int(x)] if _foreign(self, [x]) is None and 0 <= int(x) < len(self.nodes) else None
        except (TypeError, ValueError):
            node = None
        if node is None:  # a placeholder: _add_node refuses x, naming it
            return [1 if k == at[0] else d for k, d in enumerate(given)]
        rest = [d for k, d in enumerate(given) if k != at[0]]
        if any(d < 1 for d in rest):
            return shape
        count, known = node.type.num_elements, math.prod(rest)
        if count % known:
            raise GraphError(f"Reshape: cannot infer the -1 of {given!r}: node {int(x)} {node.type} has {count} "
                             f"elements, not a multiple of the other dimensions' product {known}")
        return [*given[:at[0]], count // known, *given[at[0] + 1:]]

    def sum_all(self, x: NodeId) -> NodeId:
        """The sum of every element of ``x`` (f32), as shape [1]."""
        return self.add_node("SumAll", (x,))

    def mean_all(self, x: NodeId) -> NodeId:
        """The mean of every element of ``x`` (f32), as shape [1] (a loss: ``mean_all(mul(d, d))``)."""
        return self.add_node("MeanAll", (x,))



def require_graph(what: str, graph: Any) -> None:
    """Raise :class:`~eggfuse.ir.InputError` unless ``graph`` is a :class:`Graph`: ``what`` names the function
    (``eggfuse.compile``), the message says what was given and how to get a Graph from it (an ONNX file or
    model, :func:`eggfuse.onnx.load`'s ``(graph, params)`` pair, an ExecutionPlan)."""
    if isinstance(graph, Graph):
        return
    kind = type(graph).__name__
    if isinstance(graph, tuple) and graph and isinstance(graph[0], Graph):
        hint = ("eggfuse.onnx.load gives a (graph, params) pair: unpack it, graph, params = eggfuse.onnx.load(path), "
                "and pass the graph (and the params where they are asked for)")
    elif kind == "ModelProto" or str(graph).endswith(".onnx"):
        hint = ("for an ONNX file or ModelProto use graph, params = eggfuse.onnx.load(model), or "
                "eggfuse.onnx.Model(model) to compile and run it in one step")
    elif isinstance(graph, str | os.PathLike):
        hint = ("a shipped model's graph by name is eggfuse.api.model_graph('minilm' | 'smollm2' | 'llama:LAYERS'); "
                "a Hugging Face folder or .gguf file runs through eggfuse.load_model; an ONNX file through "
                "eggfuse.onnx.load")
    elif kind == "Model" and type(graph).__module__.startswith("eggfuse.onnx"):
        hint = "an eggfuse.onnx.Model compiles itself: call its run(feeds)"
    elif kind == "ExecutionPlan":
        hint = "an ExecutionPlan is already lowered: run it with eggfuse.runtime.Session(plan, params)"
    else:
        hint = "build one with eggfuse.Graph() and its methods (g.input, g.parameter, g.matmul, ..., g.set_outputs)"
    raise InputError(f"{what} takes an eggfuse Graph, got {kind} {graph!r:.60}; {hint}")


def _unknown_op(op) -> str:
    # add_node's message for an op name OPS lacks: the closest names (case ignored), and where to find them all
    text = f"unknown op {op!r}"
    if isinstance(op, str):
        lower = {k.lower(): k for k in sorted(OPS)}
        close = difflib.get_close_matches(op.lower(), list(lower), n=3, cutoff=0.6)
        if close:
            text += f" (did you mean {' or '.join(repr(lower[c]) for c in close)}?)"
        method = re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()
        if hasattr(Graph, method) and not method.startswith("_"):
            text += f", or call the builder method g.{method}(...)"
    return text + f"; op names are ONNX-style CamelCase: the {len(OPS)} known ones are the keys of eggfuse.ir.OPS"
