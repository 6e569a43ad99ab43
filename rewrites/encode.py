"""Graph -> e-graph: one ``let`` (one e-node) per live graph node, shapes set as facts.

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

from ..ir import OPS, Graph, Node, TensorType
from ..ir.facts import facts_of
from . import egglog_private
from .sorts import ANALYSES, CONSTRUCTORS, SIGNATURES, Epi, TList, constructor_name


@dataclass
class Encoding:
    """The e-graph of one graph. ``leaves`` maps (op, name) to the original leaf node;
    ``types`` maps the let name of every encoded node (``$n<id>``) to its IR type; ``written``
    names the parameters an op updates in place; ``root`` is the let name of the output list;
    ``enodes`` maps each let name to its constructor and its inputs' let names."""

    egraph: EGraph
    leaves: dict[tuple[str, str], Node] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    written: frozenset[str] = frozenset()
    root: str = "$outputs"
    enodes: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
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


def epilogue_chain(steps, operands: list[str]) -> str:
    """The ``Epi`` text of an epilogue tuple; binary steps take operands in order."""
    epi = "(EpiNone)"
    operands = list(operands)
    for step in steps:
        if step == "bias":
            epi = f"(EpiBias {epi} {operands.pop(0)})"
        elif step == "add":
            epi = f"(EpiAdd {epi} {operands.pop(0)})"
        else:
            epi = f"(EpiAct {epi} {literal(step, 'str')})"
    return epi


def node_text(node: Node, refs: list[str]) -> str:
    """The e-node of one graph node whose inputs are the e-nodes ``refs`` (egglog text)."""
    sig = SIGNATURES[constructor_name(node.op, len(refs))]
    if sig.leaf:
        return f"({node.op} {literal(node.attrs['name'], 'str')} {literal(node.type.shape, 'ints')})"
    args = [literal(node.attrs[a.name], a.kind) for a in sig.attrs]
    if sig.epilogue:
        args += refs[:sig.tensors]
        args.append(epilogue_chain(node.attrs[OPS[node.op].epilogue_attr.name], refs[sig.tensors:]))
    elif sig.tensors is None:
        args.append(tensor_list(refs))
    else:
        args += refs
    return f"({sig.name} {' '.join(args)})"


def encode(graph: Graph, egraph: EGraph) -> Encoding:
    """Insert the live part of ``graph``: a ``let`` per node and its IR shape as a ``shape`` fact,
    and for each Constant the value facts that hold of it (``ir.facts``).

    A rewrite that would merge e-classes of different shapes then fails loudly instead
    of producing a wrong graph.
    """
    enc = Encoding(egraph)
    live = graph.live_nodes()
    used = {constructor_name(n.op, len(n.inputs)) for n in live}
    egglog_private.declare(egraph, [*(CONSTRUCTORS[c] for c in sorted(used)), Epi.none, Epi.bias, Epi.add, Epi.act,
                                    TList.nil, TList.cons, *ANALYSES])
    lines = []
    written = set()
    for node in live:
        if node.op in ("Input", "Parameter", "Constant"):
            enc.leaves[(node.op, node.attrs["name"])] = node
        if (w := OPS[node.op].writes) is not None and graph.node(node.inputs[w]).op == "Parameter":
            written.add(graph.node(node.inputs[w]).attrs["name"])
        name = f"$n{node.id}"
        enc.types[name] = node.type
        refs = [f"$n{i}" for i in node.inputs]
        enc.enodes[name] = (constructor_name(node.op, len(refs)), tuple(refs))
        lines.append(f"(let {name} {node_text(node, refs)})")
        lines.append(f"(set (shape {name}) {literal(node.type.shape, 'ints')})")
        if node.op == "Constant":
            for fact, args in facts_of(node.attrs["value"], node.type):
                lines.append(f"({fact.name} {name}" + "".join(f" {literal(a, k)}" for a, k in zip(args, fact.args,
                                                                                              strict=True)) + ")")
    # the output list, one let per cell (a training graph has hundreds of outputs)
    lines.append(f"(let $out{len(graph.outputs)} (Nil))")
    for i in range(len(graph.outputs) - 1, -1, -1):
        lines.append(f"(let {'$outputs' if i == 0 else f'$out{i}'} (Cons $n{graph.outputs[i]} $out{i + 1}))")
    enc.written = frozenset(written)
    egglog_private.run_program(egraph, "\n".join(lines))
    return enc


__all__ = ["Encoding", "encode", "epilogue_chain", "literal", "node_text", "tensor_list"]
