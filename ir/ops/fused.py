"""Generated elementwise kernels: a connected region of broadcasting elementwise ops as one op,
``Fused``, lowered to one WGSL kernel.

Which ops a region may hold is the table :data:`FUSABLE`, derived from the tables that define
the ops (no op is listed twice): every row of ``POINTWISE`` (``arithmetic.py``: Add ... Where,
Cast), every unary row and its ``<Op>Grad`` (``elementwise.py``, ``unary.py``), BiasAdd,
SwiGLU and SwiGLU's two gradients, and the broadcasts Expand and BroadcastTo (the identity
inside a region, whose inputs are read with their broadcast strides to its output). Each
entry gives the WGSL of the op applied to variables, made from the same expressions the
single-op kernels use, so a fused kernel computes each op exactly as its own kernel does.

A ``Fused`` node's ``expr`` attribute is its region as a tuple of steps in dependency order,
each ``(op, attrs, args)``; the last step is the value:

- ``("input", (), (i,))``: the node's input ``i`` (each input has exactly one such step);
- ``("const", (("dtype", d), ("shape", s), ("value", v)), ())``: a scalar baked in, a WGSL
  literal (a one-element Constant folded when the graph is rebuilt);
- ``(op, ((name, value), ...), (k, ...))``: ``op`` of :data:`FUSABLE` applied to the values
  of the earlier steps ``k`` (its attributes by name; defaults fill the ones left out).

Semantics: each step is its op with numpy broadcasting, so the region's value is the unfused
ops' value, and every input is read with its numpy broadcast strides to the output's shape
(broadcasting composes). The kernel (``shaders/fused.wgsl``) runs one invocation per output
element: the inputs' loads, then one ``let`` per step.

In the e-graph a region is an ``Ex`` term (``rewrites/sorts.py``) under ``Fused(Ex)``; the
rules here introduce it (``elementwise_fusion``) and extraction decides which regions pay:
- ``Op(a, b) -> Fused(ExOp(ExLeaf(a), ExLeaf(b)))`` for every op of :data:`FUSABLE`;
- ``ExLeaf(t) = e`` when ``t = Fused(e)`` and no consumer of ``t`` in the input graph reads it
  from memory (the analysis fact ``stored_uses(t) = 0``, :func:`stored_uses`): a consumer's
  region may then compute ``t`` inline instead of reading it, so regions grow by union, and a
  value two ops of one region read (a diamond) is computed once in it. A value that a matmul,
  a norm or a reduction also reads, or a graph output, stays a region boundary: it is stored
  anyway. Two regions that both read an inline value compute it twice, and the model charges
  its reads once (it charges a shared e-class once); :func:`stored_uses` keeps such values
  from nesting, so what is computed twice stays one level deep.

Where a region reads more tensors than a dispatch may bind (:data:`MAX_INPUTS`, WebGPU's
default ``maxStorageBuffersPerShaderStage`` less the output), :func:`add_fused` materialises
parts of it as regions of their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..reference import as_reference
from ..spec import OPS, Attr, example, need, no_grad, op, rules
from ..types import DType, TensorType
from . import unary as _unary_rows  # noqa: F401  (registers the unary rows of unary.py into UNARY)
from .arithmetic import POINTWISE, Pointwise
from .broadcasting import broadcast_loads
from .elementwise import UNARY, Unary

FAMILY = "fused"

#: Most inputs a generated kernel reads: WebGPU's default maxStorageBuffersPerShaderStage (8)
#: less the output's binding.
MAX_INPUTS = 7

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL


@dataclass(frozen=True)
class Fusable:
    """One op a region may hold: ``arity`` operands; ``wgsl(sig, attrs, args)`` the WGSL
    expression of the op on the variables ``args`` of dtypes ``sig`` (attributes complete).
    ``example_dtypes``/``example_attrs``/``same_shape``: what its rule's soundness example feeds."""

    op: str
    arity: int
    wgsl: Callable[[tuple[DType, ...], dict, Sequence[str]], str]
    example_dtypes: tuple[DType, ...] = ()
    example_attrs: dict = field(default_factory=dict)
    same_shape: bool = False


def wgsl_literal(value: Any, dtype: DType) -> str:
    """An exact WGSL literal of ``value`` as ``dtype`` holds it on the device (an f32 rounded
    first; BOOL as u32 0/1; NaN and infinities through their bits)."""
    if dtype is F32:
        v = np.float32(value)
        if not np.isfinite(v):
            return f"bitcast<f32>({int(v.view(np.uint32)):#010x}u)"
        text = repr(float(v))  # the f32 value exactly, as a double: the literal is exact
        return f"({text}f)" if text.startswith("-") else f"{text}f"
    if dtype is I32:
        v = int(value)
        return "bitcast<i32>(0x80000000u)" if v == -(2**31) else (f"({v}i)" if v < 0 else f"{v}i")
    return f"{int(bool(value)) if dtype is BOOL else int(value)}u"


_ATTR_DTYPE = {"float": F32, "int": I32, "bool": BOOL}
_OPERAND = re.compile(r"\b([abc])v\b")


def _pointwise(row: Pointwise) -> Fusable:
    def wgsl(sig, attrs, args):
        return _OPERAND.sub(lambda m: args["abc".index(m.group(1))], row.expression(sig, attrs))

    extra = {"to": "i32"} if row.name == "Cast" else {}
    return Fusable(row.name, len(row.inputs), wgsl, row.signatures[0], extra)


def _unary_literals(u: Unary, attrs: dict) -> dict[str, str]:
    return {a.name: wgsl_literal(attrs[a.name], _ATTR_DTYPE[a.kind]) for a in u.attrs}


def _unary(u: Unary) -> Fusable:
    def wgsl(sig, attrs, args):
        template = u.wgsl_int if sig[0] is I32 else u.wgsl
        return template.format(x=args[0], **_unary_literals(u, attrs))

    return Fusable(u.name, 1, wgsl, (F32,))


def _unary_grad(u: Unary) -> Fusable:
    def wgsl(sig, attrs, args):  # dy * f'(x), as elementwise_grad.wgsl computes it
        return f"{args[0]} * ({u.wgsl_derivative.format(x=args[1], **_unary_literals(u, attrs))})"

    return Fusable(f"{u.name}Grad", 2, wgsl, (F32, F32), same_shape=True)


def _fixed(name: str, arity: int, text: str, same_shape: bool = True) -> Fusable:
    return Fusable(name, arity, lambda sig, attrs, args: text.format(*args), (F32,) * arity, same_shape=same_shape)


def _table() -> dict[str, Fusable]:
    rows = [_pointwise(r) for r in POINTWISE]
    for u in UNARY:
        rows.append(_unary(u))
        if u.derivative is not None:
            rows.append(_unary_grad(u))
    # broadcasts: a region reads every input with its broadcast strides to the output, and numpy
    # broadcasting composes, so Expand and BroadcastTo are the identity inside one
    rows += [Fusable("Expand", 1, lambda sig, attrs, args: args[0], (F32,), {"shape": (2, 1, 1)}),
             Fusable("BroadcastTo", 1, lambda sig, attrs, args: args[0], (F32,), {"shape": "2,m,n"})]
    rows += [_fixed("BiasAdd", 2, "{0} + {1}", same_shape=False),  # bias [N]: numpy broadcasting to [M,N]
             _fixed("SwiGLU", 2, "silu({0}) * {1}"),
             _fixed("SwiGLUGradGate", 3, "{0} * {2} * dsilu({1})"),  # inputs dy, gate, up
             _fixed("SwiGLUGradUp", 2, "{0} * silu({1})")]  # inputs dy, gate
    return {r.op: r for r in rows}


#: Op name -> :class:`Fusable`, for every op a generated kernel may hold.
FUSABLE: dict[str, Fusable] = _table()


# --- the expression ------------------------------------------------------------------------


def full_attrs(name: str, given) -> dict:
    """The attributes of step op ``name``: ``given`` ((name, value) pairs) over the defaults."""
    return {a.name: a.default for a in OPS[name].attrs} | dict(given)


def _const_type(attrs) -> TensorType:
    a = dict(attrs)
    return TensorType(tuple(a["shape"]), DType(a["dtype"]))


def step_types(steps, ins: Sequence[TensorType]) -> list[TensorType]:
    """The type of every step of ``steps`` on inputs of types ``ins``; ShapeError (through
    ``need``) for a malformed expression or a step its op's shape rule rejects."""
    need(isinstance(steps, tuple) and len(steps) > 0, "expr must be a non-empty tuple of steps")
    types: list[TensorType] = []
    seen: set[int] = set()
    for k, step in enumerate(steps):
        need(isinstance(step, tuple) and len(step) == 3, f"step {k} must be (op, attrs, args), got {step!r}")
        name, attrs, args = step
        need(all(isinstance(a, int) for a in args), f"step {k}: args must be step or input indices, got {args!r}")
        if name == "input":
            need(len(args) == 1 and 0 <= args[0] < len(ins) and args[0] not in seen,
                 f"step {k}: input {args} is not one of the {len(ins)} inputs, or is read twice")
            seen.add(args[0])
            types.append(ins[args[0]])
        elif name == "const":
            types.append(_const_type(attrs))
        else:
            need(name in FUSABLE, f"step {k}: {name!r} is not an elementwise op a generated kernel may hold")
            need(len(args) == FUSABLE[name].arity and all(0 <= a < k for a in args),
                 f"step {k}: {name} takes {FUSABLE[name].arity} earlier steps, got {args}")
            types.append(OPS[name].infer([types[a] for a in args], full_attrs(name, attrs)))
    need(len(seen) == len(ins), f"{len(ins) - len(seen)} inputs are not read by the expression")
    need(steps[-1][0] not in ("input", "const"), "the last step must be an op")
    return types


def ops_of(steps) -> list[str]:
    """The ops of a region's steps, in order (its kernel's name lists them)."""
    return [s[0] for s in steps if s[0] not in ("input", "const")]


def _infer(ts, a):
    return step_types(a["expr"], ts)[-1]


_KIND_DTYPE = {"f": F32, "i": I32, "u": DType.U32, "b": BOOL}


def _reference(xs, a):
    steps = a["expr"]
    values: list[np.ndarray] = []
    types = step_types(steps, [TensorType(x.shape, _KIND_DTYPE[x.dtype.kind]) for x in xs])
    for (name, attrs, args), ty in zip(steps, types, strict=True):
        if name == "input":
            values.append(xs[args[0]])
        elif name == "const":
            value = dict(attrs)["value"]
            values.append(as_reference(np.full(ty.shape, np.float32(value) if ty.dtype is F32 else value), ty))
        else:
            out = OPS[name].reference([values[k] for k in args], full_attrs(name, attrs))
            values.append(as_reference(np.asarray(out).reshape(ty.shape), ty))
    return values[-1]


def _flops(ins, out, a):
    return out.num_elements * len(ops_of(a["expr"]))


def fused_kernel(node, ins, target) -> Kernel:
    """The generated kernel of a ``Fused`` node: ``shaders/fused.wgsl`` with its loads and steps."""
    steps = node.attrs["expr"]
    types = step_types(steps, ins)
    reads = [(k, args[0]) for k, (name, _, args) in enumerate(steps) if name == "input"]
    name = "fused:" + ",".join(ops_of(steps))
    params, lines = broadcast_loads(name, node.type.shape, [ins[i].shape for _, i in reads],
                                    [(f"x{i}", f"t{k}") for k, i in reads])
    for k, (op_name, attrs, args) in enumerate(steps):
        wgsl_type = types[k].dtype.wgsl
        if op_name == "const":
            lines.append(f"    let t{k}: {wgsl_type} = {wgsl_literal(dict(attrs)['value'], types[k].dtype)};")
        elif op_name != "input":
            sig = tuple(types[a].dtype for a in args)
            expr = FUSABLE[op_name].wgsl(sig, full_attrs(op_name, attrs), [f"t{a}" for a in args])
            lines.append(f"    let t{k}: {wgsl_type} = {expr};")
    n = node.type.num_elements
    bindings = (*(Buffer(f"x{i}", t.dtype.wgsl) for i, t in enumerate(ins)),
                Buffer("out", node.type.dtype.wgsl, write=True))
    return Kernel(name, "fused.wgsl", elementwise_groups(n), params=(*params, ("n", "u32", n)),
                  slots={"LOADS": "\n".join(lines), "RESULT": f"t{len(steps) - 1}"}, bindings=bindings)


op("Fused", ("*x",), _infer, _reference, attrs=(Attr("expr", "expr", doc="the region's steps (module docstring)"),),
   doc="a region of broadcasting elementwise ops computed by one generated kernel: the value of the last "
       "step of ``expr`` (each step its op's reference with numpy broadcasting); inputs: the tensors the "
       "region reads",
   vjp=no_grad("it is made by the rewrite engine from ops that autodiff differentiated already; differentiate "
               "the graph before optimising it"),
   kernel=fused_kernel, flops=_flops)


# --- building regions in a graph -------------------------------------------------------------


def add_fused(g, steps, inputs: Sequence[int]) -> int:
    """Add the region ``steps`` over graph nodes ``inputs`` to graph ``g``; returns its node id.

    A region of one op over inputs is that op's node (its own kernel, as before fusion); a
    one-element Constant input becomes a literal of the kernel; a region reading more than
    :data:`MAX_INPUTS` tensors has parts materialised as regions of their own until it fits.
    Raises :class:`~eggfuse.ir.GraphError` (through ``Graph.add_node``) for a malformed region.
    """
    steps = tuple(steps)
    inputs = list(inputs)
    if len(ops_of(steps)) == 1 and all(s[0] == "input" for s in steps[:-1]):
        name, attrs, args = steps[-1]
        return g.add_node(name, [inputs[steps[a][2][0]] for a in args], **dict(attrs))
    steps, inputs = _fold_constants(g, steps, inputs)
    while len(inputs) > MAX_INPUTS:
        steps, inputs = _split(g, steps, inputs)
    return g.add_node("Fused", inputs, expr=steps)


def _fold_constants(g, steps, inputs):
    keep, out = [], []
    for name, attrs, args in steps:
        node = g.node(inputs[args[0]]) if name == "input" else None
        if node is not None and node.op == "Constant" and node.type.num_elements == 1:
            value = np.asarray(node.attrs["value"]).reshape(-1)[0].item()
            out.append(("const", (("dtype", node.type.dtype.value), ("shape", node.type.shape), ("value", value)), ()))
        elif node is not None:
            out.append(("input", (), (len(keep),)))
            keep.append(inputs[args[0]])
        else:
            out.append((name, attrs, args))
    return tuple(out), keep


def _reached(steps, root: int) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack.extend(steps[k][2] if steps[k][0] not in ("input", "const") else ())
    return seen


def _split(g, steps, inputs):
    """Materialise one part of a region that reads too many tensors: the op step whose cut
    leaves the region reading the fewest (of those reading at most MAX_INPUTS themselves)."""
    last = len(steps) - 1
    best = None
    for k in range(last):
        if steps[k][0] in ("input", "const"):
            continue
        part = _reached(steps, k)
        part_inputs = {steps[j][2][0] for j in part if steps[j][0] == "input"}
        if not part_inputs or len(part_inputs) > MAX_INPUTS:
            continue
        cut = [("input", (), (-1,)) if j == k else s for j, s in enumerate(steps)]
        rest = {steps[j][2][0] for j in _reached(cut, last) if cut[j][0] == "input" and j != k}
        key = (len(rest) + 1, -len(part_inputs), -k)
        if best is None or key < best[0]:
            best = (key, k, part)
    _, k, part = best
    sub = sorted(part)
    index = {j: n for n, j in enumerate(sub)}
    sub_steps = tuple((s[0], s[1], tuple(index[a] for a in s[2])) if s[0] not in ("input", "const") else s
                      for s in (steps[j] for j in sub))
    used = sorted({s[2][0] for s in sub_steps if s[0] == "input"})
    renumber = {i: n for n, i in enumerate(used)}
    sub_steps = tuple(("input", (), (renumber[s[2][0]],)) if s[0] == "input" else s for s in sub_steps)
    node = add_fused(g, sub_steps, [inputs[i] for i in used])
    # the region with step k read from the new node: then drop what nothing reaches
    cut = list(steps)
    cut[k] = ("input", (), (len(inputs),))
    alive = sorted(_reached(cut, last))
    index = {j: n for n, j in enumerate(alive)}
    out, new_inputs = [], []
    for j in alive:
        name, attrs, args = cut[j]
        if name == "input":
            out.append(("input", (), (len(new_inputs),)))
            new_inputs.append(node if args[0] == len(inputs) else inputs[args[0]])
        else:
            out.append((name, attrs, tuple(index[a] for a in args)))
    return tuple(out), new_inputs


# --- which values a region may compute inline ------------------------------------------------


def stored_uses(graph, live=None) -> dict[int, int]:
    """Node id -> how many of its consumers read it from memory (0: a region may compute it
    inline; absent: 0), for the ``stored_uses`` fact of the e-graph.

    A value is read from memory by each consumer outside :data:`FUSABLE` (a matmul, a norm, a
    reduction) and by the caller when it is a graph output. A value that only elementwise ops
    read, two or more of them, may be computed inline in each of their regions, but not when
    computing it would itself compute another such value inline: then all its consumers read it
    (nodes in topological order, the first such value on each path inline). This bounds the
    work computed twice: a decomposed RmsNorm's residual stream, which its Pow, its Mul and the
    next residual Add read, would otherwise be computed from its start in every layer.
    """
    live = graph.live_nodes() if live is None else live
    stored: dict[int, int] = {}
    consumers: dict[int, int] = {}
    for node in live:
        for i in set(node.inputs):
            consumers[i] = consumers.get(i, 0) + 1
            if node.op not in FUSABLE:
                stored[i] = stored.get(i, 0) + 1
    for o in graph.outputs:
        stored[o] = stored.get(o, 0) + 1
    shares: dict[int, bool] = {}  # an inline value: does computing it compute a shared value inline?
    for node in live:
        if node.op not in FUSABLE or stored.get(node.id, 0):
            continue
        below = any(shares.get(i, False) for i in node.inputs)
        if consumers.get(node.id, 0) > 1:
            if below:
                stored[node.id] = consumers[node.id]
                continue
            below = True
        shares[node.id] = below
    return stored


# --- the rules ---------------------------------------------------------------------------------


def _operand(g, dtype: DType, name: str, shape) -> int:
    x = g.input(name, shape)
    if dtype is I32:
        return g.add_node("Cast", (x,), to="i32")
    if dtype is BOOL:
        return g.add_node("Less", (x, g.input(f"{name}_rhs", shape)))
    return x


def _op_example(f: Fusable):
    def build(g, dim):
        m, n = dim("m"), dim("n")
        if f.op == "BiasAdd":
            shapes = [[m, n], [n]]
        elif f.same_shape:
            shapes = [[m, n]] * f.arity
        else:
            shapes = [[m, n], [1, n], [m, 1]][:f.arity]
        xs = [_operand(g, d, f"x{i}", s) for i, (d, s) in enumerate(zip(f.example_dtypes, shapes, strict=True))]
        attrs = {k: (2, m, n) if v == "2,m,n" else v for k, v in f.example_attrs.items()}
        g.set_outputs([g.add_node(f.op, xs, **attrs)])

    return example(build)


def _chain_example(g, dim):
    x, y = g.input("x", [dim("m"), dim("n")]), g.input("y", [1, dim("n")])
    g.set_outputs([g.neg(g.add(x, y))])


@rules("elementwise_fusion")
def _elementwise_regions(e):
    (t,) = e.vars("t")
    (ex,) = e.vars("ex", e.Ex)
    # ExLeaf(t) = e   if t = Fused(e) and stored_uses(t) = 0: a consumer's region may compute t inline
    yield e.rule(e.eq(t).to(e.Fused(ex)), e.eq(e.stored_uses(t)).to(e.i64(0)), name="ExLeaf(Fused(e)) -> e",
                 example=example(_chain_example)).then(e.union(e.ExLeaf(t)).with_(ex))
    # Op(a, ...) -> Fused(ExOp(ExLeaf(a), ...))   for every op of FUSABLE: a region of one op
    for f in FUSABLE.values():
        xs = e.vars(" ".join("abc"[:f.arity]))
        attrs = e.attrs_of(f.op)
        names = ",".join("abc"[:f.arity])
        yield e.equal(f"{f.op}({names}) -> Fused(Ex{f.op}(ExLeaf {names}))", getattr(e, f.op)(*xs, **attrs),
                      e.Fused(e.ex(f.op, *(e.ExLeaf(x) for x in xs), **attrs)), example=_op_example(f))


def _view_example(f: Fusable):
    def build(g, dim):
        m, n = dim("m", 1, 3), dim("n", 1, 3)
        xs = [_operand(g, d, f"x{i}", [m, n]) for i, d in enumerate(f.example_dtypes)]
        attrs = {k: (2, m, n) if v == "2,m,n" else v for k, v in f.example_attrs.items()}
        view = g.reshape(g.add_node(f.op, xs, **attrs), [m * n])  # another rank: never the identity
        g.set_outputs([g.add_node("Cast", (view,), to="f32")])  # an elementwise reader: the view lies in a region

    return example(build)


#: Ops of :data:`FUSABLE` a reshape view does not move through: those whose attributes name a shape (a
#: broadcast's target), and BiasAdd, whose bias is 1-D (never of the op's shape).
_SHAPED = ("Expand", "BroadcastTo", "BiasAdd")


def _view_scalar_example(f: Fusable, first: bool):
    def build(g, dim):
        m, n = dim("m", 1, 3), dim("n", 1, 3)
        x = _operand(g, f.example_dtypes[1 if first else 0], "x", [m, n])
        c = _operand(g, f.example_dtypes[0 if first else 1], "c", [])
        attrs = {k: (2, m, n) if v == "2,m,n" else v for k, v in f.example_attrs.items()}
        view = g.reshape(g.add_node(f.op, (c, x) if first else (x, c), **attrs), [m * n])
        g.set_outputs([g.add_node("Cast", (view,), to="f32")])  # an elementwise reader: the view lies in a region

    return example(build)


@rules("elementwise_fusion")
def _views_through_regions(e):
    (s,) = e.vars("s", e.Vec[e.i64])
    # Identity(Op(a, ...), s) -> Op(Identity(a, s), ...)   if every operand has Op's shape and only elementwise
    # ops read the view (stored_uses 0: it lies inside a region): a reshape view of an elementwise op's value is
    # the op of the operands' views (each element depends on the operands' element of the same row-major index),
    # so the region reaches through the view to what computed the operands. A view that a matmul or a norm
    # reads is left alone: it costs nothing as it is, and the alternative would only slow extraction down.
    for f in FUSABLE.values():
        if f.op in _SHAPED:
            continue
        xs = e.vars(" ".join(f"v{i}" for i in range(f.arity)))
        attrs = e.attrs_of(f.op)
        value = getattr(e, f.op)(*xs, **attrs)
        names = ",".join("abc"[:f.arity])
        view = e.Identity(value, shape=s)
        views = [e.Identity(x, shape=s) for x in xs]
        # the operands' views are read by the new op alone: a region may compute them inline too (their
        # stored_uses gain 0, so a view some other reader stores keeps its count)
        yield e.rule(view, e.eq(e.stored_uses(view)).to(e.i64(0)), *(e.eq(e.shape(x)).to(e.shape(value)) for x in xs),
                     name=f"Identity({f.op}({names}), s) -> {f.op}(Identity({names}, s))   (operands of its shape)",
                     example=_view_example(f)).then(
            e.union(view).with_(getattr(e, f.op)(*views, **attrs)),
            *(e.set_(e.stored_uses(v)).to(e.i64(0)) for v in views))
    # Identity(Op(a, c), s) -> Op(Identity(a, s), c)   (and Op(c, a)) for a binary op whose other operand c is a
    # scalar (rank 0, broadcast to every element), under the same condition: the view of a scaled value is the
    # scaled view (DeBERTa's position terms, each divided by the scale before their [B, H, S, T] view)
    (sc,) = e.vars("sc", e.Vec[e.i64])
    x, c = e.vars("x c")
    for f in FUSABLE.values():
        if f.op in _SHAPED or f.arity != 2 or f.same_shape:  # (gradients take operands of one shape)
            continue
        attrs = e.attrs_of(f.op)
        for first in (False, True) if f.op != "PRelu" else (False,):  # PRelu's slope broadcasts to x, not x to it
            value = getattr(e, f.op)(c, x, **attrs) if first else getattr(e, f.op)(x, c, **attrs)
            view = e.Identity(value, shape=s)
            moved = e.Identity(x, shape=s)
            new = getattr(e, f.op)(c, moved, **attrs) if first else getattr(e, f.op)(moved, c, **attrs)
            label = "c, a" if first else "a, c"
            yield e.rule(view, e.eq(e.stored_uses(view)).to(e.i64(0)), e.eq(e.shape(x)).to(e.shape(value)),
                         e.eq(e.shape(c)).to(sc), e.eq(sc.length()).to(e.i64(0)),
                         name=f"Identity({f.op}({label}), s) -> {f.op}({label.replace('a', 'Identity(a, s)')})   "
                              "(c a scalar)",
                         example=_view_scalar_example(f, first)).then(
                e.union(view).with_(new), e.set_(e.stored_uses(moved)).to(e.i64(0)))


__all__ = ["FUSABLE", "MAX_INPUTS", "Fusable", "add_fused", "full_attrs", "fused_kernel", "ops_of", "step_types",
           "wgsl_literal"]
