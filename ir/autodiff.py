"""Reverse-mode automatic differentiation: ``grad(graph, loss)`` builds a training graph.

The training graph holds the forward nodes (same ids) followed by the backward nodes,
all ordinary ops of :data:`~eggfuse.ir.ops.OPS` built with ``add_node``, so the rest of
the pipeline (rewrites, lowering) treats it like any other graph. Its outputs are
``[loss, d loss / d p for p in wrt]``.

Each forward op has one vector-Jacobian rule in its spec block (``OpSpec.vjp``, in the
family modules of :mod:`eggfuse.ir.ops`, as JAX's ``defvjp``): given the builder, the node
and ``dy`` = d loss / d output, it returns one gradient per input slot it was asked for.
The reverse sweep visits nodes in reverse topological order, sums the contributions a node
received from its users with ``Add`` and only differentiates the slots that lead to a
wanted leaf, so frozen weights and inputs cost nothing. Identical backward nodes are shared
(hash-consing on op, inputs and attributes, seeded with the forward nodes), which also
turns the two products of ``Mul(x, x)`` into one.
The gradients of SliceCols users whose column ranges tile a tensor (a packed QKV
projection) are joined by one Concat; other slices are padded back with PadCols and added.

Fused ops are differentiated through their definition (their rules say how: a
``FusedMatMul`` walks its epilogue backwards and recomputes the pre-activation a unary
step's gradient reads; ``CausalAttentionRoPE`` rebuilds RoPE(q), RoPE(k) and applies RoPEGrad,
and of one packed q/k/v input slices it and joins the three gradients with Concat, as
``FullAttentionPacked`` does).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import GraphError
from .graph import Graph, Node, NodeId
from .spec import OPS
from .types import DType, TensorType

_LEAVES = ("Input", "Parameter", "Constant")
ONE = -1  # d loss / d loss before it is needed as a node: rules may fold it away


@dataclass(frozen=True)
class Cols:
    """A SliceCols gradient: ``grad`` belongs at columns ``start``.. of the sliced tensor
    (the VJP of SliceCols returns one; :meth:`_Builder.total` joins or pads them)."""

    start: int
    grad: NodeId


class TrainingGraph(Graph):
    """A graph whose outputs are ``[loss, *gradients]``.

    ``grad_outputs`` maps each differentiated leaf name to its output index (1, 2, ... in
    ``wrt`` order); ``zero_grads`` names the leaves the loss does not depend on, whose
    gradient output is zero (a [1] zero Constant broadcast to the leaf's shape).
    """

    loss_output = 0

    def __init__(self) -> None:
        super().__init__()
        self.grad_outputs: dict[str, int] = {}
        self.zero_grads: tuple[str, ...] = ()


def _freeze(v):
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    hash(v)
    return v


class _Builder:
    """Appends backward nodes to the training graph; shares identical ones."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.memo: dict[tuple, NodeId] = {}
        self.consts: dict[tuple, NodeId] = {}
        for n in g.nodes:
            key = self._key(n.op, n.inputs, n.attrs)
            if n.op not in _LEAVES and key is not None:
                self.memo.setdefault(key, n.id)

    @staticmethod
    def _key(op: str, inputs: Sequence[NodeId], attrs: dict) -> tuple | None:
        full = Graph._attributes(OPS[op], attrs)  # normalised, defaults filled: equal nodes, equal keys
        try:
            return op, tuple(inputs), tuple(sorted((k, _freeze(v)) for k, v in full.items()))
        except TypeError:  # an unhashable attribute: such a node is not shared
            return None

    def emit(self, op: str, inputs: Sequence[NodeId], **attrs) -> NodeId:
        key = self._key(op, inputs, attrs)
        if key is None:
            return self.g.add_node(op, inputs, **attrs)
        if key not in self.memo:
            self.memo[key] = self.g.add_node(op, inputs, **attrs)
        return self.memo[key]

    def type(self, nid: NodeId) -> TensorType:
        return self.g.node(nid).type

    def const(self, value: np.ndarray) -> NodeId:
        arr = np.asarray(value, dtype=np.float32)
        key = (arr.shape, arr.tobytes())
        if key not in self.consts:
            self.consts[key] = self.g.constant(arr)
        return self.consts[key]

    def one(self) -> NodeId:
        return self.const(np.ones(1))

    def real(self, dy: NodeId) -> NodeId:
        return self.one() if dy == ONE else dy

    def scale(self, dy: NodeId, s: float) -> NodeId:
        """dy * s, folded into a Constant when dy is one."""
        if dy == ONE:
            return self.const(np.array([s]))
        node = self.g.node(dy)
        if node.op == "Constant":
            return self.const(node.attrs["value"] * s)
        return self.emit("Mul", (dy, self.const(np.array([s]))))

    def reshape(self, x: NodeId, shape: Sequence[int]) -> NodeId:
        shape = tuple(shape)
        return x if self.type(x).shape == shape else self.emit("Identity", (x,), shape=shape)

    def broadcast(self, x: NodeId, shape: Sequence[int]) -> NodeId:
        shape = tuple(shape)
        return x if self.type(x).shape == shape else self.emit("BroadcastTo", (x,), shape=shape)

    def reduce_to(self, dy: NodeId, shape: Sequence[int]) -> NodeId:
        """Sum a gradient back to an operand's (broadcast) shape: SumRows for [M,N] -> [N]."""
        shape, have = tuple(shape), self.type(dy).shape
        if have == shape:
            return dy
        if len(have) == 2 and shape == (have[1],):
            return self.emit("SumRows", (dy,))
        return self.emit("ReduceTo", (dy,), shape=shape)

    def total(self, nid: NodeId, contribs: list) -> NodeId:
        """Sum of the gradient contributions ``nid`` received (Add chain)."""
        full = [c for c in contribs if not isinstance(c, Cols)]
        cols = sorted((c for c in contribs if isinstance(c, Cols)), key=lambda c: c.start)
        if cols:
            width = self.type(nid).shape[1]
            ends = [c.start + self.type(c.grad).shape[1] for c in cols]
            tiles = cols[0].start == 0 and ends[-1] == width and all(
                e == c.start for e, c in zip(ends, cols[1:], strict=False))
            if tiles:
                pieces = [c.grad for c in cols]
                full.append(pieces[0] if len(pieces) == 1 else self.emit("Concat", pieces, axis=1))
            else:
                full.extend(self.emit("PadCols", (c.grad,), start=c.start, width=width) for c in cols)
        acc = full[0]
        for c in full[1:]:
            acc = self.emit("Add", (acc, c))
        return acc


def grad(graph: Graph, loss: NodeId, wrt: Sequence[str] | None = None,
         frozen: Iterable[str] = ()) -> TrainingGraph:
    """A new training graph with outputs ``[loss, d loss / d leaf for leaf in wrt]``.

    ``loss`` must be an f32[1] node of ``graph``, or an f32[] one (differentiated as its [1] reshape).
    ``wrt`` names Parameters (or f32 Inputs)
    to differentiate, in the order of the outputs; by default every Parameter not in
    ``frozen``, in graph order. A leaf the loss does not depend on gets a zero gradient
    (BroadcastTo of a [1] zero Constant) and is listed in ``zero_grads``. The result's
    ``grad_outputs`` maps each name to its output index. ``graph`` is not modified.

    Raises :class:`GraphError` for a loss that is not an f32[1] or f32[] node of ``graph``, an unknown,
    repeated or frozen name in ``wrt``, an unknown name in ``frozen``, labels of a
    CrossEntropyLoss that depend on a wanted leaf, or a path to the loss through an op with
    no gradient rule (the ``*Grad`` ops: no second derivatives).
    """
    if not isinstance(loss, int | np.integer) or not 0 <= loss < len(graph.nodes):
        raise GraphError(f"grad: loss {loss!r} is not a node of this graph ({len(graph.nodes)} nodes)")
    loss = int(loss)
    loss_node = graph.node(loss)
    if loss_node.type == TensorType((), DType.F32):  # a scalar loss: as its [1] reshape (a copy; graph untouched)
        graph = graph.copy()
        loss = int(graph.reshape(loss, [1]))
        loss_node = graph.node(loss)
    if loss_node.type != TensorType((1,), DType.F32):
        raise GraphError(f"grad: the loss must be an f32[1] or f32[] node, got {loss_node.describe()}")
    leaves = {n.attrs["name"]: n for n in graph.nodes if n.op in ("Input", "Parameter")}
    params = [n.attrs["name"] for n in graph.leaves("Parameter")]
    frozen = set(frozen)
    unknown = sorted(frozen - set(params))
    if unknown:
        raise GraphError(f"grad: frozen names {unknown} are not parameters; parameters: {params}")
    if wrt is None:
        wrt = [p for p in params if p not in frozen]
    wrt = list(wrt)
    for name in wrt:
        node = leaves.get(name)
        if node is None or node.type.dtype is not DType.F32:
            raise GraphError(f"grad: {name!r} is not an f32 Parameter or Input; parameters: {params}")
        if name in frozen:
            raise GraphError(f"grad: {name!r} is both in wrt and frozen")
    if len(set(wrt)) != len(wrt):
        raise GraphError(f"grad: wrt names a leaf twice: {wrt}")

    g = TrainingGraph()
    for attr, value in vars(graph).items():  # the builder's bookkeeping (leaf names ...), copied
        setattr(g, attr, copy.copy(value))
    g.nodes = [Node(n.id, n.op, n.inputs, dict(n.attrs), n.type) for n in graph.nodes]
    wanted = {leaves[name].id for name in wrt}
    needs: set[NodeId] = set()  # nodes that depend on a wanted leaf
    for n in g.nodes:
        if n.id in wanted or any(i in needs for i in n.inputs):
            needs.add(n.id)

    b = _Builder(g)
    grads: dict[NodeId, list] = {loss: [ONE]} if loss in needs else {}
    for nid in range(loss, -1, -1):
        node = g.node(nid)
        if nid not in grads or node.op in _LEAVES:
            continue
        contribs = grads.pop(nid)
        dy = ONE if contribs == [ONE] else b.total(nid, contribs)
        spec = OPS[node.op]
        if not spec.differentiable:
            why = f" ({spec.vjp.reason})" if spec.vjp is not None else ""
            raise GraphError(f"grad: {node.op} has no gradient rule{why}, needed at {node.describe()}")
        if dy == ONE and not spec.vjp_takes_one:
            dy = b.one()
        want = tuple(i in needs for i in node.inputs)
        for i, gi in zip(node.inputs, spec.vjp(b, node, dy, want), strict=True):
            if gi is not None and i in needs:
                grads.setdefault(i, []).append(gi)

    outs, zero = [loss], []
    for name in wrt:
        leaf = leaves[name]
        if leaf.id in grads:
            outs.append(b.real(b.total(leaf.id, grads[leaf.id])))
        else:
            outs.append(b.broadcast(b.const(np.zeros(1)), leaf.type.shape))
            zero.append(name)
        g.grad_outputs[name] = len(outs) - 1
    g.zero_grads = tuple(zero)
    g.set_outputs(outs)
    return g
