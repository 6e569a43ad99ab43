"""Extracted terms as DAGs, and the rebuild of a Graph from one.

Both extractors (:mod:`.greedy` and :mod:`.ilp`) produce a :class:`TermDag`: e-nodes as
(constructor, arguments) with children by index, so a shared sub-term is one entry and
becomes one graph node. Constructors are named by their op (:mod:`.sorts`), so rebuilding
maps each entry back to ``add_node(op, inputs, **attrs)`` with nothing listed per op.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..ir import OPS, Graph, RewriteError, TensorType
from ..ir.ops.fused import MAX_INPUTS, add_fused, ops_of
from ..ir.ops.fused_epilogue import EXPR, compose, expr_operands, fold_constants, is_expr, split
from ..ir.ops.matmul_kernel import EPILOGUE_BINARY
from .encode import Encoding
from .sorts import ARG_SORTS, EX_SIGNATURES, SIGNATURES


@dataclass
class TermDag:
    """An extracted term as a DAG: ``nodes[i] = (constructor name, args)``; an argument is a
    child index (``int`` in a tensor, epilogue or list position) or a literal (str, int,
    float, bool, or a tuple for a Vec). ``root`` is the index of the output list.
    ``eclasses[i]`` is the e-class entry ``i`` was chosen for and ``types[i]`` that e-class's
    IR type (None for an epilogue or list entry); both empty for a DAG built by hand.
    ``cost``: the extraction's cost of the DAG, in the cost model's units (not rounded)."""

    nodes: list[tuple[str, tuple]]
    root: int
    cost: float
    eclasses: list[str] = field(default_factory=list)
    types: list[TensorType | None] = field(default_factory=list)


def _list(dag: TermDag, i: int) -> list[int]:
    out = []
    while (node := dag.nodes[i])[0] == "TList.cons":
        out.append(node[1][0])
        i = node[1][1]
    return out


def _epilogue(dag: TermDag, i: int) -> tuple[list, list[int]]:
    """Steps (innermost first) and operand indices of an ``Epi`` chain; a generated region
    (``Epi.ex``) is the step ``("expr", steps)`` (``ir/ops/fused_epilogue.py``), its leaves
    its operands."""
    steps, operands = [], []
    while (node := dag.nodes[i])[0] != "Epi.none":
        name, args = node
        if name == "Epi.act":
            steps.append(args[1])
        elif name == "Epi.ex":
            region, leaves = _expr(dag, args[1], acc=True)
            steps.append((EXPR, region))
            operands.extend(reversed(leaves))
        else:
            steps.append("bias" if name == "Epi.bias" else "add")
            operands.append(args[1])
        i = args[0]
    return steps[::-1], operands[::-1]


def _expr(dag: TermDag, root: int, acc: bool = False) -> tuple[tuple, list[int]]:
    """The steps (``ir/ops/fused.py``) of the ``Ex`` sub-DAG at entry ``root``, and the tensor
    entries its leaves read, in the order of their input steps (with ``acc``, an epilogue
    region: ``ExAcc`` is input 0 and the leaves are inputs 1, 2, ...)."""
    steps: list[tuple] = []
    leaves: list[int] = []
    index: dict[int, int] = {}  # Ex entry -> its step
    stack = [(root, False)]
    while stack:
        j, ready = stack.pop()
        if j in index:
            continue
        name, args = dag.nodes[j]
        sig = EX_SIGNATURES.get(name)
        kids = list(args[len(sig.attrs):]) if sig is not None else []
        if not ready and kids:
            stack.append((j, True))
            stack.extend((k, False) for k in reversed(kids) if k not in index)
            continue
        if name == "ExLeaf":
            steps.append(("input", (), (len(leaves) + acc,)))
            leaves.append(args[0])
        elif name == "ExAcc" and acc:
            steps.append(("input", (), (0,)))
        elif name == "ExConst":
            steps.append(("const", (("dtype", args[0]), ("shape", tuple(args[2])), ("value", json.loads(args[1]))), ()))
        elif sig is not None:
            attrs = tuple((a.name, v) for a, v in zip(sig.attrs, args, strict=False))
            steps.append((sig.op, attrs, tuple(index[k] for k in kids)))
        else:
            raise RewriteError(f"extracted Ex term has an unknown constructor {name}")
        index[j] = len(steps) - 1
    return tuple(steps), leaves


def dag_enode(dag: TermDag, j: int) -> tuple[str, dict, list[int]]:
    """(op, attributes, tensor input indices in input order) of DAG entry ``j``."""
    name, args = dag.nodes[j]
    sig = SIGNATURES.get(name)
    if sig is None:
        raise RewriteError(f"extracted term has an unknown constructor {name}")
    if sig.leaf:
        return sig.op, {"name": args[0]}, []
    if sig.expr:
        steps, leaves = _expr(dag, args[0])
        return sig.op, {OPS[sig.op].expr_attr.name: steps}, leaves
    attrs, inputs = {}, []
    attr_iter = iter(sig.attrs)
    for sort, arg in zip(ARG_SORTS[name], args, strict=True):
        if sort == "T":
            inputs.append(arg)
        elif sort == "TList":
            inputs.extend(_list(dag, arg))
        elif sort == "Epi":
            steps, operands = _epilogue(dag, arg)
            attrs[OPS[sig.op].epilogue_attr.name] = tuple(steps)
            inputs.extend(operands)
        else:
            attrs[next(attr_iter).name] = arg
    return sig.op, attrs, inputs


def outputs(dag: TermDag) -> list[int]:
    """The DAG entries of the graph outputs, in order."""
    return _list(dag, dag.root)


def build_node(g: Graph, op: str, attrs: dict, inputs: list[int], enc: Encoding) -> int:
    """Add one extracted e-node to ``g`` (a leaf is rebuilt from the original leaf node; a
    generated kernel through :func:`~eggfuse.ir.ops.fused.add_fused`)."""
    if (expr := OPS[op].expr_attr) is not None:
        return add_fused(g, attrs[expr.name], inputs)
    if (epi := OPS[op].epilogue_attr) is not None and any(is_expr(s) for s in attrs[epi.name]):
        return _with_regions(g, op, attrs, inputs, epi.name)
    if OPS[op].leaf:
        orig = enc.leaves[(op, attrs["name"])]
        if op == "Constant":
            return g.constant(orig.attrs["value"], shape=orig.type.shape, dtype=orig.type.dtype)
        if op == "Input":
            return g.input(orig.attrs["name"], orig.type.shape, orig.type.dtype)
        if orig.attrs.get("state"):
            return g.state(orig.attrs["name"], orig.type.shape)
        return g.parameter(orig.attrs["name"], orig.type.shape, orig.type.dtype)
    return g.add_node(op, inputs, **attrs)


def _with_regions(g: Graph, op: str, attrs: dict, inputs: list[int], name: str) -> int:
    """Add a fused matmul or convolution whose chain holds generated regions: one-element
    Constant operands become literals, a region of no op (the accumulator itself) is dropped,
    and where the operands would exceed the kernel's bindings (:data:`MAX_INPUTS` with the
    output's) the chain is cut before the step that overflows and the rest applied by the ops
    of the graph (a ``Fused`` node for each region) to the node's output."""
    fixed = len(inputs) - sum(expr_operands(s) if is_expr(s) else s in EPILOGUE_BINARY for s in attrs[name])
    head, operands = list(inputs[:fixed]), list(inputs[fixed:])
    steps, used, tail = [], [], None
    for k, step in enumerate(attrs[name]):
        n = expr_operands(step) if is_expr(step) else int(step in EPILOGUE_BINARY)
        mine, operands = operands[:n], operands[n:]
        if is_expr(step):
            region, mine = fold_constants(g, step[1], mine)
            if not ops_of(region):
                continue
            step = (EXPR, region)
        if fixed + len(used) + len(mine) > MAX_INPUTS:
            tail = [(step, mine), *_rest(attrs[name][k + 1:], operands)]
            cut = split(step, MAX_INPUTS - fixed - len(used)) if is_expr(step) else None
            if cut is None:
                break
            step, reads, rest, rest_reads = cut  # the part that fits stays at the store
            tail[0] = (rest, [mine[i - 1] for i in rest_reads])
            mine = [mine[i - 1] for i in reads]
            if steps and is_expr(steps[-1]):
                step = compose(steps[-1], expr_operands(steps[-1]), step)
                steps.pop()
            steps.append(step)
            used += mine
            break
        if is_expr(step) and steps and is_expr(steps[-1]):  # consecutive regions: one
            step = compose(steps[-1], expr_operands(steps[-1]), step)
            steps.pop()
        steps.append(step)
        used += mine
    out = g.add_node(op, [*head, *used], **(attrs | {name: tuple(steps)}))
    for step, mine in tail or ():
        if is_expr(step):
            out = add_fused(g, step[1], [out, *mine])
        elif step in EPILOGUE_BINARY:  # bias [N] or [1,N] and add [M,N]: numpy broadcasting of the output
            out = g.add_node("Add", (out, *mine))
        else:
            out = g.add_node(step, (out,))
    return out


def _rest(steps, operands: list[int]) -> list[tuple]:
    out = []
    for step in steps:
        n = expr_operands(step) if is_expr(step) else int(step in EPILOGUE_BINARY)
        out.append((step, operands[:n]))
        operands = operands[n:]
    return out


def rebuild(dag: TermDag, enc: Encoding, made: dict[int, int] | None = None) -> Graph:
    """A new Graph computing the extracted DAG, one node per DAG entry reached from the outputs
    (``made``, when given, receives node id -> the DAG entry it was built for, for every node an
    entry's builder made).

    Every node goes through the IR builder, so its shape rule is checked again, and its type
    (shape and dtype) is compared with its e-class's type (``dag.types``). Raises
    :class:`RewriteError` naming the op, the e-class and both types when they differ: a rule
    that joined terms of different types (an unsound rule) would otherwise change the graph's
    outputs.
    """
    g = Graph()
    built: dict[int, int] = {}
    outs = outputs(dag)
    for start in outs:
        stack = [(start, False)]
        while stack:
            j, ready = stack.pop()
            if j in built:
                continue
            op, attrs, kids = dag_enode(dag, j)
            if not ready:
                stack.append((j, True))
                stack.extend((k, False) for k in kids if k not in built)
                continue
            before = len(g.nodes)
            built[j] = build_node(g, op, attrs, [built[k] for k in kids], enc)
            if made is not None:
                made.update(dict.fromkeys(range(before, len(g.nodes)), j))
                made.setdefault(built[j], j)
            if j < len(dag.types) and (want := dag.types[j]) is not None and (got := g.node(built[j]).type) != want:
                raise RewriteError(f"a rule made e-class {dag.eclasses[j]} of type {want} hold {op}, of type {got}: "
                                   "a rule whose two sides have different shapes or dtypes is unsound (check the "
                                   "rules of the rulesets passed to optimize)")
    g.set_outputs([built[o] for o in outs])
    return g


__all__ = ["TermDag", "build_node", "dag_enode", "outputs", "rebuild"]
