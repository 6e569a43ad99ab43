"""Graph -> e-graph: one ``let`` (one e-node) per live graph node, shapes set as facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph, Vec, i64, set_

from ..ir import Graph, Node, RewriteError
from .sorts import CONSTRUCTORS, Epi, T, TList, shape

LEAF_CONSTRUCTORS = {"Input": T.input, "Parameter": T.parameter, "Constant": T.constant}


def shape_vec(dims) -> Vec[i64]:
    return Vec(*(i64(int(d)) for d in dims))


def attrs_key(node: Node) -> str:
    """Canonical text of a node's attributes: equal attributes give equal keys."""
    items = sorted((k, v) for k, v in node.attrs.items() if k not in ("type", "value", "name"))
    return f"{node.op}:" + ",".join(f"{k}={v!r}" for k, v in items)


@dataclass
class Encoding:
    """The e-graph of one graph: ``refs[node id]`` is the node's let-bound term, ``root`` the outputs."""

    egraph: EGraph
    root: TList
    refs: dict[int, T]
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    leaves: dict[tuple[str, str], Node] = field(default_factory=dict)


def epilogue_term(steps, operands) -> Epi:
    """The ``Epi`` chain of an epilogue tuple; binary steps take operands in order."""
    epi = Epi.none()
    operands = list(operands)
    for step in steps:
        if step == "bias":
            epi = Epi.bias(epi, operands.pop(0))
        elif step == "add":
            epi = Epi.add(epi, operands.pop(0))
        else:
            epi = Epi.act(epi, step)
    return epi


def node_term(node: Node, args: list[T], enc: Encoding) -> T:
    """The e-node for one graph node whose inputs are already the terms ``args``."""
    op = node.op
    if op in LEAF_CONSTRUCTORS:
        enc.leaves[(op, node.attrs["name"])] = node
        return LEAF_CONSTRUCTORS[op](node.attrs["name"], shape_vec(node.type.shape))
    if op == "Identity":
        return T.reshape(args[0], shape_vec(node.type.shape))
    if op == "FusedMatMul":
        return T.fused_matmul(node.attrs["variant"], args[0], args[1],
                              epilogue_term(node.attrs["epilogue"], args[2:]))
    key = None
    if op in CONSTRUCTORS and CONSTRUCTORS[op][1]:
        key = attrs_key(node)
        enc.attrs[key] = {k: v for k, v in node.attrs.items() if k not in ("type", "value")}
    if op == "FullAttention" and len(args) == 4:
        return T.full_attention_masked(key, *args)
    if op not in CONSTRUCTORS:
        raise RewriteError(f"{node.describe()}: op {op} has no egglog constructor (rewrites/sorts.py)")
    ctor, has_attrs = CONSTRUCTORS[op]
    return ctor(key, *args) if has_attrs else ctor(*args)


def encode(graph: Graph, egraph: EGraph) -> Encoding:
    """Insert the live part of ``graph`` node by node (``egraph.let`` per node).

    Each node's IR shape is registered as a ``shape`` fact; a rewrite that would merge
    e-classes of different shapes then fails loudly instead of producing a wrong graph.
    """
    enc = Encoding(egraph, TList.nil(), {})
    facts = []
    for node in graph.live_nodes():
        term = node_term(node, [enc.refs[i] for i in node.inputs], enc)
        ref = egraph.let(f"n{node.id}", term)
        enc.refs[node.id] = ref
        facts.append(set_(shape(ref)).to(shape_vec(node.type.shape)))
    egraph.register(*facts)
    root = TList.nil()
    for out in reversed(graph.outputs):
        root = TList.cons(enc.refs[out], root)
    enc.root = egraph.let("outputs", root)
    return enc
