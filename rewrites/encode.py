"""Graph -> e-graph: one ``let`` (one e-node) per live graph node, shapes and use counts set as facts.

The graph is written as one egglog program (text) and run in one call (see
:mod:`.egglog_private` for why). The constructors' egglog names are the op names
(:mod:`.sorts`), so the program reads as the graph does and the saved transcript
(``--dump-egglog``) replays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph

from ..ir import OPS, DType, Graph, Node, TensorType
from ..ir.facts import facts_of
from ..ir.ops.fused import stored_uses
from ..ir.ops.fused_epilogue import expr_operands, is_expr
from . import egglog_private
from .sorts import (
    ANALYSES,
    CONSTRUCTORS,
    EX_CONSTRUCTORS,
    SIGNATURES,
    Epi,
    TList,
    constructor_name,
    ex_acc,
    ex_const,
    ex_leaf,
)


@dataclass
class Encoding:
    """The e-graph of one graph. ``leaves`` maps (op, name) to the original leaf node;
    ``types`` maps the let name of every encoded node (``$n<id>``) to its IR type; ``written``
    names the parameters an op updates in place; ``root`` is the let name of the output list;
    ``enodes`` maps each let name to its constructor and its inputs' let names; ``constructors``
    names every constructor the program uses (``sorts.ARG_SORTS`` names)."""

    egraph: EGraph
    leaves: dict[tuple[str, str], Node] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    written: frozenset[str] = frozenset()
    root: str = "$outputs"
    enodes: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    constructors: frozenset[str] = frozenset()  # the names of the constructors the encoded program uses
    raw: dict | None = None  # egglog's serialisation once saturated (rewrites.engine.saturate)


def literal(value: Any, kind: str) -> str:
    """egglog text of an attribute value of ``kind`` (see ``ir.spec.ATTR_KINDS``)."""
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return repr(float(value))
    if kind == "str":
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if kind == "bool":
        return "true" if value else "false"
    if kind == "ints":
        return "(vec-of" + "".join(f" {int(v)}" for v in value) + ")"
    if kind == "floats":
        return "(vec-of" + "".join(f" {float(v)!r}" for v in value) + ")"
    if kind == "json":
        return literal(json.dumps(value), "str")
    raise ValueError(f"attribute kind {kind} has no egglog literal")


def tensor_list(items: list[str]) -> str:
    out = "(Nil)"
    for x in reversed(items):
        out = f"(Cons {x} {out})"
    return out


def epilogue_chain(steps, operands: list[str], shape=()) -> str:
    """The ``Epi`` text of an epilogue tuple of an output of ``shape``; binary steps and
    generated regions (``ir/ops/fused_epilogue.py``) take operands in order."""
    epi = "(EpiNone)"
    operands = list(operands)
    for step in steps:
        if is_expr(step):
            k = expr_operands(step)
            leaves = [f"(ExAcc {literal(tuple(shape), 'ints')})", *(f"(ExLeaf {r})" for r in operands[:k])]
            epi = f"(EpiEx {epi} {expr_text(step[1], leaves, wrap=False)})"
            del operands[:k]
        elif step == "bias":
            epi = f"(EpiBias {epi} {operands.pop(0)})"
        elif step == "add":
            epi = f"(EpiAdd {epi} {operands.pop(0)})"
        else:
            epi = f"(EpiAct {epi} {literal(step, 'str')})"
    return epi


def expr_text(steps, refs: list[str], wrap: bool = True) -> str:
    """The ``Ex`` text of a generated kernel's steps (``ir/ops/fused.py``) over the inputs ``refs``
    (tensors read through ``ExLeaf``; with ``wrap`` False, ``Ex`` texts)."""
    texts: list[str] = []
    for name, attrs, args in steps:
        if name == "input":
            texts.append(f"(ExLeaf {refs[args[0]]})" if wrap else refs[args[0]])
        elif name == "const":
            a = dict(attrs)
            texts.append(f"(ExConst {literal(a['dtype'], 'str')} {literal(json.dumps(a['value']), 'str')} "
                         f"{literal(a['shape'], 'ints')})")
        else:
            given = {a.name: a.default for a in OPS[name].attrs} | dict(attrs)
            lits = [literal(given[a.name], a.kind) for a in OPS[name].egg_attrs]
            texts.append(f"(Ex{name} {' '.join([*lits, *(texts[k] for k in args)])})")
    return texts[-1]


def node_text(node: Node, refs: list[str]) -> str:
    """The e-node of one graph node whose inputs are the e-nodes ``refs`` (egglog text)."""
    sig = SIGNATURES[constructor_name(node.op, len(refs))]
    if sig.leaf:
        return f"({node.op} {literal(node.attrs['name'], 'str')} {literal(node.type.shape, 'ints')})"
    if sig.expr:
        return f"({sig.name} {expr_text(node.attrs[OPS[node.op].expr_attr.name], refs)})"
    args = [literal(node.attrs[a.name], a.kind) for a in sig.attrs]
    if sig.epilogue:
        args += refs[:sig.tensors]
        args.append(epilogue_chain(node.attrs[OPS[node.op].epilogue_attr.name], refs[sig.tensors:], node.type.shape))
    elif sig.tensors is None:
        args.append(tensor_list(refs))
    else:
        args += refs
    return f"({sig.name} {' '.join(args)})"


def encode(graph: Graph, egraph: EGraph) -> Encoding:
    """Insert the live part of ``graph``: a ``let`` per node, its IR shape as a ``shape`` fact,
    the number of its consumers that read it from memory as a ``stored_uses`` fact
    (``ir.ops.fused.stored_uses``), a bool node's ``is_bool`` fact, an i32 node's ``is_i32``, and for each Constant the
    value facts that hold of it (``ir.facts``: a one-element one's ``value``, a causal mask, ...).

    A rewrite that would merge e-classes of different shapes then fails loudly instead
    of producing a wrong graph.
    """
    enc = Encoding(egraph)
    live = graph.live_nodes()
    used = {constructor_name(n.op, len(n.inputs)) for n in live}
    regions = [n.attrs[OPS[n.op].expr_attr.name] for n in live if OPS[n.op].expr_attr is not None]
    regions += [s[1] for n in live if OPS[n.op].epilogue_attr is not None
                for s in n.attrs[OPS[n.op].epilogue_attr.name] if is_expr(s)]
    ex_ops = sorted({s[0] for steps in regions for s in steps} - {"input", "const"})
    egglog_private.declare(egraph, [*(CONSTRUCTORS[c] for c in sorted(used)), Epi.none, Epi.bias, Epi.add, Epi.act,
                                    Epi.ex, TList.nil, TList.cons, ex_leaf, ex_const, ex_acc,
                                    *(EX_CONSTRUCTORS[o] for o in ex_ops), *ANALYSES])
    stored = stored_uses(graph, live)
    lines = []
    written = set()
    for node in live:
        if node.op in ("Input", "Parameter", "Constant"):
            enc.leaves[(node.op, node.attrs["name"])] = node
        for w in OPS[node.op].written_inputs:
            if graph.node(node.inputs[w]).op == "Parameter":
                written.add(graph.node(node.inputs[w]).attrs["name"])
        name = f"$n{node.id}"
        enc.types[name] = node.type
        refs = [f"$n{i}" for i in node.inputs]
        enc.enodes[name] = (constructor_name(node.op, len(refs)), tuple(refs))
        lines.append(f"(let {name} {node_text(node, refs)})")
        lines.append(f"(set (shape {name}) {literal(node.type.shape, 'ints')})")
        if node.type.dtype is DType.BOOL:
            lines.append(f"(is_bool {name})")
        elif node.type.dtype is DType.I32:
            lines.append(f"(is_i32 {name})")
        lines.append(f"(set (stored_uses {name}) {stored.get(node.id, 0)})")
        if node.op == "Constant":
            for fact, args in facts_of(node.attrs["value"], node.type):
                lines.append(f"({fact.name} {name}" + "".join(f" {literal(a, k)}" for a, k in zip(args, fact.args,
                                                                                              strict=True)) + ")")
    # the output list, one let per cell (a training graph has hundreds of outputs)
    lines.append(f"(let $out{len(graph.outputs)} (Nil))")
    for i in range(len(graph.outputs) - 1, -1, -1):
        lines.append(f"(let {'$outputs' if i == 0 else f'$out{i}'} (Cons $n{graph.outputs[i]} $out{i + 1}))")
    enc.written = frozenset(written)
    enc.constructors = frozenset({*used, *(f"Ex{o}" for o in ex_ops), "ExLeaf", "ExConst", "ExAcc", "Epi.none",
                                  "Epi.bias", "Epi.add", "Epi.act", "Epi.ex", "TList.nil", "TList.cons"})
    egglog_private.run_program(egraph, "\n".join(lines))
    return enc


__all__ = ["Encoding", "encode", "epilogue_chain", "expr_text", "literal", "node_text", "tensor_list"]
