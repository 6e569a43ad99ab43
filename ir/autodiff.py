"""Reverse-mode automatic differentiation: ``grad(graph, loss)`` builds a training graph.

The training graph holds the forward nodes (same ids) followed by the backward nodes,
all ordinary ops of :data:`~eggfuse.ir.ops.OPS` built with ``add_node``, so the rest of
the pipeline (rewrites, lowering) treats it like any other graph. Its outputs are
``[loss, d loss / d p for p in wrt]``.

Each forward op has one vector-Jacobian rule below (``@vjp("Op")``, one block per op, as
JAX's ``defvjp``): given the node and ``dy`` = d loss / d output, it returns one gradient
per input slot it was asked for. The reverse sweep visits nodes in reverse topological
order, sums the contributions a node received from its users with ``Add`` and only
differentiates the slots that lead to a wanted leaf, so frozen weights and inputs cost
nothing. Identical backward nodes are shared (hash-consing on op, inputs and attributes,
seeded with the forward nodes), which also turns the two products of ``Mul(x, x)`` into one.
The gradients of SliceCols users whose column ranges tile a tensor (a packed QKV
projection) are joined by one Concat; other slices are padded back with PadCols and added.

Fused ops are differentiated through their definition: a ``FusedMatMul`` walks its epilogue
backwards (``bias`` -> SumRows, ``add`` -> pass-through, unary -> ``<Op>Grad``), and the
pre-activation a unary step's gradient reads is recomputed as the same fused op with the
epilogue cut before that step (one extra matmul per fused node with a non-linear epilogue;
differentiating before fusion avoids it). ``FusedRmsNormMatMul`` adds RmsNormGradX/W after the
matmul's input gradient; ``CausalAttentionRoPE`` rebuilds RoPE(q), RoPE(k) and applies
RoPEGrad to dq and dk; ``GroupNormSilu`` rebuilds the GroupNorm output for SiluGrad.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import GraphError
from .graph import Graph, Node, NodeId
from .ops import OPS, ROPE_ATTRS
from .ops_backward import UNARY_DERIVATIVES  # importing it registers the gradient ops
from .types import DType, TensorType

_LEAVES = ("Input", "Parameter", "Constant")
ONE = -1  # d loss / d loss before it is needed as a node: rules may fold it away


@dataclass(frozen=True)
class _Cols:
    """A SliceCols gradient: ``grad`` belongs at columns ``start``.. of the sliced tensor."""

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


Rule = Callable[["_Builder", Node, NodeId, tuple[bool, ...]], Sequence[object]]
VJP: dict[str, Rule] = {}
_TAKES_ONE: set[str] = set()  # rules that accept dy = ONE (the loss seed) and fold it


def vjp(*ops: str, takes_one: bool = False) -> Callable[[Rule], Rule]:
    """Register a vector-Jacobian rule for ``ops``: ``rule(b, node, dy, want) -> grads per slot``."""

    def deco(rule: Rule) -> Rule:
        for op in ops:
            VJP[op] = rule
            if takes_one:
                _TAKES_ONE.add(op)
        return rule

    return deco


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
        full = {**OPS[op].defaults, **attrs}
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
        full = [c for c in contribs if not isinstance(c, _Cols)]
        cols = sorted((c for c in contribs if isinstance(c, _Cols)), key=lambda c: c.start)
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

    ``loss`` must be an f32[1] node of ``graph``. ``wrt`` names Parameters (or f32 Inputs)
    to differentiate, in the order of the outputs; by default every Parameter not in
    ``frozen``, in graph order. A leaf the loss does not depend on gets a zero gradient
    (BroadcastTo of a [1] zero Constant) and is listed in ``zero_grads``. The result's
    ``grad_outputs`` maps each name to its output index. ``graph`` is not modified.

    Raises :class:`GraphError` for a loss that is not an f32[1] node of ``graph``, an unknown,
    repeated or frozen name in ``wrt``, an unknown name in ``frozen``, labels of a
    CrossEntropyLoss that depend on a wanted leaf, or a path to the loss through an op with
    no gradient rule (the ``*Grad`` ops: no second derivatives).
    """
    if not isinstance(loss, int | np.integer) or not 0 <= loss < len(graph.nodes):
        raise GraphError(f"grad: loss {loss!r} is not a node of this graph ({len(graph.nodes)} nodes)")
    loss = int(loss)
    loss_node = graph.node(loss)
    if loss_node.type != TensorType((1,), DType.F32):
        raise GraphError(f"grad: the loss must be an f32[1] node, got {loss_node.describe()}")
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
        if node.op not in VJP:
            raise GraphError(f"grad: no gradient rule for {node.op}, needed at {node.describe()}")
        if dy == ONE and node.op not in _TAKES_ONE:
            dy = b.one()
        want = tuple(i in needs for i in node.inputs)
        for i, gi in zip(node.inputs, VJP[node.op](b, node, dy, want), strict=True):
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


# --- rules: matmul family --------------------------------------------------------------


def _matmul_grads(b: _Builder, variant: str, get_a: Callable[[], NodeId], w: NodeId, dc: NodeId,
                  want_a: bool, want_b: bool) -> list:
    """dA, dB of C = A op B (op by ``variant``), each itself a MatMul/AT/BT."""
    if variant == "":  # C = A B: dA = dC B^T, dB = A^T dC
        da = b.emit("MatMulBT", (dc, w)) if want_a else None
        db = b.emit("MatMulAT", (get_a(), dc)) if want_b else None
    elif variant == "AT":  # C = A^T B: dA = B dC^T, dB = A dC
        da = b.emit("MatMulBT", (w, dc)) if want_a else None
        db = b.emit("MatMul", (get_a(), dc)) if want_b else None
    elif variant == "BT":  # C = A B^T: dA = dC B, dB = dC^T A
        da = b.emit("MatMul", (dc, w)) if want_a else None
        db = b.emit("MatMulAT", (dc, get_a())) if want_b else None
    else:  # the shape rule lets an unknown variant through as a plain matmul; refuse to guess
        raise GraphError(f"grad: unknown matmul variant {variant!r}")
    return [da, db]


@vjp("MatMul", "MatMulAT", "MatMulBT")
def _matmul_vjp(b, node, dy, want):
    variant = {"MatMul": "", "MatMulAT": "AT", "MatMulBT": "BT"}[node.op]
    return _matmul_grads(b, variant, lambda: node.inputs[0], node.inputs[1], dy, *want)


def _epilogue_vjp(b: _Builder, node: Node, n_fixed: int, get_a: Callable[[], NodeId], w: NodeId,
                  dy: NodeId, want: tuple[bool, ...]) -> list:
    """Gradients [dA, dW, *d operands] of epilogue(A op W); ``node`` holds ``n_fixed`` leading inputs."""
    epilogue, variant = tuple(node.attrs["epilogue"]), node.attrs["variant"]
    operands = list(node.inputs[n_fixed:])
    slot = []  # operand index of each binary step, None for unary ones
    for step in epilogue:
        slot.append(sum(s is not None for s in slot) if step in ("bias", "add") else None)
    stop = 0  # the earliest step the backward walk must reach
    if not (want[0] or want[1]):
        stop = min((i for i, k in enumerate(slot) if k is not None and want[2 + k]), default=len(epilogue))
    pre = _pre_activations(b, node, n_fixed, slot, [i for i in range(stop, len(epilogue))
                                                    if epilogue[i] in UNARY_DERIVATIVES])
    dz, d_ops = dy, [None] * len(operands)
    for i in range(len(epilogue) - 1, stop - 1, -1):
        step, k = epilogue[i], slot[i]
        if k is not None:
            if want[2 + k]:
                d_ops[k] = dz if step == "add" else _bias_grad(b, dz, operands[k])
        elif step == "Neg":
            dz = b.emit("Neg", (dz,))
        else:
            dz = b.emit(f"{step}Grad", (dz, pre[i]))
    return [*_matmul_grads(b, variant, get_a, w, dz, want[0], want[1]), *d_ops]


def _pre_activations(b: _Builder, node: Node, n_fixed: int, slot: list, steps: list[int]) -> dict[int, NodeId]:
    """Input of each epilogue step in ``steps``: the fused op cut before the first, then unfused ops."""
    if not steps:
        return {}
    epilogue, first = tuple(node.attrs["epilogue"]), steps[0]
    n_ops = sum(k is not None for k in slot[:first])
    head = node.inputs[:n_fixed]
    if node.op == "FusedMatMul" and first == 0:
        cur = b.emit({"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}[node.attrs["variant"]], head)
    else:
        cur = b.emit(node.op, (*head, *node.inputs[n_fixed:n_fixed + n_ops]),
                     **{**node.attrs, "epilogue": epilogue[:first]})
    values = {first: cur}
    for i in range(first, steps[-1]):
        step = epilogue[i]
        if step == "bias":
            cur = b.emit("BiasAdd", (cur, node.inputs[n_fixed + slot[i]]))
        elif step == "add":
            cur = b.emit("Add", (cur, node.inputs[n_fixed + slot[i]]))
        else:
            cur = b.emit(step, (cur,))
        values[i + 1] = cur
    return values


@vjp("FusedMatMul")
def _fused_matmul_vjp(b, node, dy, want):
    return _epilogue_vjp(b, node, 2, lambda: node.inputs[0], node.inputs[1], dy, want)


@vjp("FusedRmsNormMatMul")
def _fused_rms_norm_matmul_vjp(b, node, dy, want):
    x, wn, w = node.inputs[:3]
    normed = lambda: b.emit("RmsNorm", (x, wn), eps=node.attrs["eps"])  # noqa: E731
    dn, dw, *d_ops = _epilogue_vjp(b, node, 3, normed, w, dy, (want[0] or want[1], *want[2:]))
    dx = b.emit("RmsNormGradX", (dn, x, wn), eps=node.attrs["eps"]) if want[0] else None
    dwn = b.emit("RmsNormGradW", (dn, x), eps=node.attrs["eps"]) if want[1] else None
    return [dx, dwn, dw, *d_ops]


# --- rules: elementwise ------------------------------------------------------------------


def _bias_grad(b: _Builder, dy: NodeId, bias: NodeId) -> NodeId:
    return b.reshape(b.emit("SumRows", (dy,)), b.type(bias).shape)


@vjp("Add")
def _add_vjp(b, node, dy, want):
    return [b.reduce_to(dy, b.type(i).shape) if w else None for i, w in zip(node.inputs, want, strict=True)]


@vjp("Mul")
def _mul_vjp(b, node, dy, want):
    x, y = node.inputs
    return [b.reduce_to(b.emit("Mul", (dy, y)), b.type(x).shape) if want[0] else None,
            b.reduce_to(b.emit("Mul", (dy, x)), b.type(y).shape) if want[1] else None]


@vjp("BiasAdd")
def _bias_add_vjp(b, node, dy, want):
    return [dy, _bias_grad(b, dy, node.inputs[1]) if want[1] else None]


@vjp(*UNARY_DERIVATIVES)
def _unary_vjp(b, node, dy, want):
    return [b.emit(f"{node.op}Grad", (dy, node.inputs[0]))]


@vjp("Neg")
def _neg_vjp(b, node, dy, want):
    return [b.emit("Neg", (dy,))]


@vjp("SwiGLU")
def _swiglu_vjp(b, node, dy, want):
    gate, up = node.inputs
    return [b.emit("SwiGLUGradGate", (dy, gate, up)) if want[0] else None,
            b.emit("SwiGLUGradUp", (dy, gate)) if want[1] else None]


@vjp("SwiGLUConcat")
def _swiglu_concat_vjp(b, node, dy, want):
    return [b.emit("SwiGLUConcatGrad", (dy, node.inputs[0]))]


@vjp("Softmax")
def _softmax_vjp(b, node, dy, want):
    return [b.emit("SoftmaxGrad", (dy, node.id))]


# --- rules: normalisation ----------------------------------------------------------------


@vjp("LayerNorm")
def _layer_norm_vjp(b, node, dy, want):
    x, w, _ = node.inputs
    eps = node.attrs["eps"]
    return [b.emit("LayerNormGradX", (dy, x, w), eps=eps) if want[0] else None,
            b.emit("LayerNormGradW", (dy, x), eps=eps) if want[1] else None,
            b.emit("SumRows", (dy,)) if want[2] else None]


@vjp("RmsNorm")
def _rms_norm_vjp(b, node, dy, want):
    x, w = node.inputs
    eps = node.attrs["eps"]
    return [b.emit("RmsNormGradX", (dy, x, w), eps=eps) if want[0] else None,
            b.emit("RmsNormGradW", (dy, x), eps=eps) if want[1] else None]


@vjp("GroupNorm")
def _group_norm_vjp(b, node, dy, want):
    x, w, _ = node.inputs
    attrs = {"num_groups": node.attrs["num_groups"], "eps": node.attrs["eps"]}
    c = b.type(x).shape[1]
    return [b.emit("GroupNormGradInput", (dy, x, w), **attrs) if want[0] else None,
            b.emit("GroupNormGradWeight", (dy, x), **attrs) if want[1] else None,
            b.reshape(b.emit("ReduceTo", (dy,), shape=(c, 1)), (c,)) if want[2] else None]


@vjp("GroupNormSilu")
def _group_norm_silu_vjp(b, node, dy, want):
    z = b.emit("GroupNorm", node.inputs, num_groups=node.attrs["num_groups"], eps=node.attrs["eps"])
    return _group_norm_vjp(b, b.g.node(z), b.emit("SiluGrad", (dy, z)), want)


# --- rules: transformer ------------------------------------------------------------------


@vjp("Embedding")
def _embedding_vjp(b, node, dy, want):
    idx, table = node.inputs
    return [None, b.emit("ScatterAdd", (idx, dy), vocab_size=b.type(table).shape[0])]


_ROPE_ATTRS = ROPE_ATTRS
_ATTN_ATTRS = ("num_heads", "num_kv_heads", "head_dim", "batch")


@vjp("RoPE")
def _rope_vjp(b, node, dy, want):
    return [b.emit("RoPEGrad", (dy,), **{k: node.attrs[k] for k in _ROPE_ATTRS})]


def _attention_grads(b: _Builder, dy, q, k, v, mask, causal: bool, attrs: dict, want) -> list:
    ins = (dy, q, k, v) if mask is None else (dy, q, k, v, mask)
    return [b.emit(f"AttentionGrad{part}", ins, causal=causal, **attrs) if w else None
            for part, w in zip("QKV", want, strict=False)]


@vjp("FullAttention", "CausalAttention")
def _attention_vjp(b, node, dy, want):
    q, k, v, *mask = node.inputs
    attrs = {a: node.attrs[a] for a in _ATTN_ATTRS}
    grads = _attention_grads(b, dy, q, k, v, mask[0] if mask else None, node.op == "CausalAttention", attrs, want)
    return grads + [None] * len(mask)  # key_mask is piecewise constant: no gradient


@vjp("CausalAttentionRoPE")
def _attention_rope_vjp(b, node, dy, want):
    q, k, v = node.inputs
    rope = {a: node.attrs[a] for a in _ROPE_ATTRS}
    qr, kr = b.emit("RoPE", (q,), **rope), b.emit("RoPE", (k,), **rope)
    dq, dk, dv = _attention_grads(b, dy, qr, kr, v, None, True, {a: node.attrs[a] for a in _ATTN_ATTRS}, want)
    return [None if dq is None else b.emit("RoPEGrad", (dq,), **rope),
            None if dk is None else b.emit("RoPEGrad", (dk,), **rope), dv]


# --- rules: shape ops, reductions, losses ----------------------------------------------------


@vjp("Transpose")
def _transpose_vjp(b, node, dy, want):
    return [b.emit("Transpose", (dy,))]


@vjp("Identity")
def _identity_vjp(b, node, dy, want):
    return [b.reshape(dy, b.type(node.inputs[0]).shape)]


@vjp("SumAll")
def _sum_all_vjp(b, node, dy, want):
    return [b.broadcast(dy, b.type(node.inputs[0]).shape)]


@vjp("MeanAll", takes_one=True)
def _mean_all_vjp(b, node, dy, want):
    x = b.type(node.inputs[0])
    return [b.broadcast(b.scale(dy, 1.0 / x.num_elements), x.shape)]


@vjp("Concat")
def _concat_vjp(b, node, dy, want):
    # Along any axis, a row-major concatenation is a column concatenation of the
    # [outer, axis * inner] views, so each part is a SliceCols between two reshapes.
    axis, shape = node.attrs["axis"], b.type(node.id).shape
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    grads, start = [], 0
    for i, w in zip(node.inputs, want, strict=True):
        part = b.type(i).shape
        if w and part == shape:
            grads.append(dy)
        elif w:
            flat = b.reshape(dy, (outer, shape[axis] * inner))
            piece = b.emit("SliceCols", (flat,), start=start * inner, size=part[axis] * inner)
            grads.append(b.reshape(piece, part))
        else:
            grads.append(None)
        start += part[axis]
    return grads


@vjp("SliceCols")
def _slice_cols_vjp(b, node, dy, want):
    return [_Cols(node.attrs["start"], dy)]


@vjp("CrossEntropyLoss", takes_one=True)
def _cross_entropy_vjp(b, node, dy, want):
    logits, labels = node.inputs
    if want[1]:
        raise GraphError(f"grad: the labels of {node.describe()} depend on a differentiated leaf; "
                         "CrossEntropyLoss has no gradient with respect to its labels")
    d = b.emit("CrossEntropyLossGrad", (logits, labels))
    return [d if dy == ONE else b.emit("Mul", (d, dy)), None]


# =============================================================================================
# --- rules: the ops of ir/ops_extra.py -------------------------------------------------------
# Abs, Log and Recip read their forward input, LogSoftmax its output; Greater is piecewise
# constant (no gradient); BceLoss, like CrossEntropyLoss, has none for its labels; the
# attention gradients recompute the probabilities (the IR keeps no logsumexp side buffer).
# =============================================================================================


@vjp("Abs", "Log", "Recip")
def _extra_unary_vjp(b, node, dy, want):
    return [b.emit(f"{node.op}Grad", (dy, node.inputs[0]))]


@vjp("Greater")
def _greater_vjp(b, node, dy, want):
    return [None, None]


@vjp("LogSoftmax")
def _log_softmax_vjp(b, node, dy, want):
    return [b.emit("LogSoftmaxGrad", (dy, node.id))]


@vjp("BceLoss", takes_one=True)
def _bce_loss_vjp(b, node, dy, want):
    pred, labels = node.inputs
    if want[1]:
        raise GraphError(f"grad: the labels of {node.describe()} depend on a differentiated leaf; "
                         "BceLoss has no gradient with respect to its labels")
    d = b.emit("BceLossGrad", (pred, labels))
    return [d if dy == ONE else b.emit("Mul", (d, dy)), None]


@vjp("SlidingWindowAttention", "CrossAttention")
def _windowed_attention_vjp(b, node, dy, want):
    q, k, v, *mask = node.inputs
    attrs = {a: node.attrs[a] for a in OPS[node.op].attrs}
    grads = [b.emit(f"{node.op}Grad{part}", (dy, *node.inputs), **attrs) if w else None
             for part, w in zip("QKV", want, strict=False)]
    return grads + [None] * len(mask)  # key_mask is piecewise constant: no gradient


@vjp("Conv2d")
def _conv2d_vjp(b, node, dy, want):
    x, w = node.inputs
    geometry = {a: node.attrs[a] for a in ("stride", "padding_h", "padding_w")}
    _, _, in_h, in_w = b.type(x).shape
    _, _, kh, kw = b.type(w).shape
    return [b.emit("Conv2dGradInput", (dy, w), in_h=in_h, in_w=in_w, **geometry) if want[0] else None,
            b.emit("Conv2dGradWeight", (dy, x), kernel_h=kh, kernel_w=kw, **geometry) if want[1] else None]


@vjp("MaxPool2d")
def _max_pool_vjp(b, node, dy, want):
    return [b.emit("MaxPool2dGrad", (dy, node.inputs[0]), **{a: node.attrs[a] for a in OPS[node.op].attrs})]


@vjp("GlobalAvgPool")
def _global_avg_pool_vjp(b, node, dy, want):
    return [b.emit("GlobalAvgPoolGrad", (dy,), shape=b.type(node.inputs[0]).shape)]


@vjp("Upsample2x")
def _upsample_vjp(b, node, dy, want):
    return [b.emit("Upsample2xGrad", (dy,))]
