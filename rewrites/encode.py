"""Graph -> e-graph: one ``let`` (one e-node) per live graph node, shapes set as facts.

The graph is written as one egglog program (text) and run in one call: building each
node as an egglog-python expression costs about 0.8 ms a node, the text about 5 us. The
constructors' egglog names come from egglog-python itself, so the program refers to the
same functions the rulesets use, and the saved transcript (``--dump-egglog``) replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from egglog import EGraph
from egglog.declarations import LetRefDecl, TypedExprDecl
from egglog.runtime import RuntimeExpr

from ..ir import Graph, Node
from .sorts import (
    CONSTRUCTORS,
    GENERIC_CONSTRUCTORS,
    VARIADIC_CONSTRUCTOR,
    Args,
    Epi,
    T,
    TList,
    rope_fits_attention,
    shape,
)

LEAF_CONSTRUCTORS = {"Input": T.input, "Parameter": T.parameter, "Constant": T.constant}
_ATTENTION_ATTRS = ("num_heads", "num_kv_heads", "head_dim", "batch")
_ROPE_ATTRS = ("theta", "head_dim", "pos_offset", "pairing", "batch")
_CACHED_ATTENTION_ATTRS = ("num_heads", "num_kv_heads", "head_dim")
_ROPE_DYNAMIC_ATTRS = ("theta", "head_dim", "pairing")


class Call(NamedTuple):
    """A constructor applied to arguments: ``Call``, ``Ref``, ``Shape``, str or int."""

    fn: Any
    args: tuple


class Ref(NamedTuple):
    """The e-node of an earlier graph node (its ``let`` name)."""

    node: int


class ListRef(NamedTuple):
    """The ``Args`` list of a variadic graph node's e-node (its own ``let``)."""

    node: int


class Shape(NamedTuple):
    dims: tuple[int, ...]


@dataclass
class Encoding:
    """The e-graph of one graph; ``root`` is the let-bound list of outputs.

    ``attrs`` maps each attribute key (a string literal in the e-graph) back to the
    attribute dict; ``leaves`` maps (op, name) to the original leaf node; ``lists`` maps a
    variadic node (``T.concat``, ``T.opn``) to its inputs, its ``Args`` list bound as
    ``$args<node id>``.
    """

    egraph: EGraph
    root: TList | None = None
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    leaves: dict[tuple[str, str], Node] = field(default_factory=dict)
    lists: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def key(self, op: str, attrs: dict[str, Any]) -> str:
        """The canonical key of ``op``'s attributes (equal attributes give equal keys)."""
        clean = {k: v for k, v in attrs.items() if k not in ("type", "value", "name")}
        key = f"{op}:" + ",".join(f"{k}={v!r}" for k, v in sorted(clean.items()))
        self.attrs.setdefault(key, clean)
        return key


def epilogue_term(steps, operands) -> Call:
    """The ``Epi`` chain of an epilogue tuple; binary steps take operands in order."""
    epi = Call(Epi.none, ())
    operands = list(operands)
    for step in steps:
        if step == "bias":
            epi = Call(Epi.bias, (epi, operands.pop(0)))
        elif step == "add":
            epi = Call(Epi.add, (epi, operands.pop(0)))
        else:
            epi = Call(Epi.act, (epi, step))
    return epi


def args_term(xs) -> Call:
    """The ``Args`` list of the terms ``xs``, in order."""
    out = Call(Args.nil, ())
    for x in reversed(list(xs)):
        out = Call(Args.cons, (x, out))
    return out


def node_term(node: Node, args: list[Ref], enc: Encoding, derived: bool = False) -> Call:
    """The e-node for one graph node whose inputs are the e-nodes ``args``.

    ``derived`` marks a Concat of parameters (see ``Graph.is_derived_parameter``)."""
    op, a = node.op, node.attrs
    if op in LEAF_CONSTRUCTORS:
        enc.leaves[(op, a["name"])] = node
        return Call(LEAF_CONSTRUCTORS[op], (a["name"], Shape(node.type.shape)))
    if op == "Identity":
        return Call(T.reshape, (args[0], Shape(node.type.shape)))
    if op == "FusedMatMul":
        return Call(T.fused_matmul, (a["variant"], args[0], args[1], epilogue_term(a["epilogue"], args[2:])))
    if op == "FusedRmsNormMatMul":
        return Call(T.fused_rms_norm_matmul, (enc.key("RmsNorm", {"eps": a["eps"]}), a["variant"], *args[:3],
                                              epilogue_term(a["epilogue"], args[3:])))
    if op == "Concat" and derived:  # a derived parameter: packed at load
        return Call(T.concat, (a["axis"], args_term(args)))
    if op == "SliceCols":
        return Call(T.slice_cols, (args[0], a["start"], a["size"]))
    if op == "CausalAttentionRoPE":
        ctor = T.causal_attention_rope if len(args) == 3 else T.causal_attention_rope_packed
        return Call(ctor, (enc.key("CausalAttention", {k: a[k] for k in _ATTENTION_ATTRS}),
                           enc.key("RoPE", {k: a[k] for k in _ROPE_ATTRS}), *args))
    if op == "CachedAttentionRoPE":
        return Call(T.cached_attention_rope, (enc.key("CachedAttention", {k: a[k] for k in _CACHED_ATTENTION_ATTRS}),
                                              enc.key("RoPEDynamic", {k: a[k] for k in _ROPE_DYNAMIC_ATTRS}), *args))
    if op == "FullAttention" and len(args) == 4:
        return Call(T.full_attention_masked, (enc.key(op, a), *args))
    if op in CONSTRUCTORS:
        ctor, has_attrs = CONSTRUCTORS[op]
        return Call(ctor, (enc.key(op, a), *args) if has_attrs else tuple(args))
    if len(args) not in GENERIC_CONSTRUCTORS:
        return Call(VARIADIC_CONSTRUCTOR, (op, enc.key(op, a), args_term(args)))
    return Call(GENERIC_CONSTRUCTORS[len(args)], (op, enc.key(op, a), *args))


def _rope_attention_facts(enc: Encoding) -> list[Call]:
    """``rope_fits_attention`` for every RoPE / CausalAttention attribute pair that agree on
    head size and sequence layout, and every RoPEDynamic / CachedAttention pair that agree on
    head size (one sequence each), so the fusion rules can require it."""
    facts = []
    for rope, attention, same in (("RoPE:", "CausalAttention:", ("head_dim", "batch")),
                                  ("RoPEDynamic:", "CachedAttention:", ("head_dim",))):
        ropes = [k for k in enc.attrs if k.startswith(rope)]
        attns = [k for k in enc.attrs if k.startswith(attention)]
        facts += [Call(rope_fits_attention, (rk, ak)) for rk in ropes for ak in attns
                  if all(enc.attrs[rk][f] == enc.attrs[ak][f] for f in same)]
    return facts


class _Renderer:
    """egglog text for :class:`Call` trees, with the constructors' egglog names."""

    def __init__(self, egraph: EGraph) -> None:
        self.egraph = egraph
        self.names: dict[Any, str] = {}

    def name(self, fn) -> str:
        if (n := self.names.get(fn)) is None:
            n = self.names[fn] = self.egraph._callable_to_egg(fn)[1]
        return n

    def __call__(self, x) -> str:
        if isinstance(x, Call):
            return f"({' '.join([self.name(x.fn), *map(self, x.args)])})"
        if isinstance(x, Ref):
            return f"$n{x.node}"
        if isinstance(x, ListRef):
            return f"$args{x.node}"
        if isinstance(x, Shape):
            return f"(vec-of {' '.join(str(int(d)) for d in x.dims)})"
        if isinstance(x, str):
            return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return str(int(x))


def encode(graph: Graph, egraph: EGraph) -> Encoding:
    """Insert the live part of ``graph``: a ``let`` per node and its IR shape as a ``shape`` fact.

    A rewrite that would merge e-classes of different shapes then fails loudly instead
    of producing a wrong graph.
    """
    enc = Encoding(egraph)
    render = _Renderer(egraph)
    shape_fn = render.name(shape)
    lines = []
    for node in graph.live_nodes():
        term = node_term(node, [Ref(i) for i in node.inputs], enc, graph.is_derived_parameter(node))
        if term.fn in (T.concat, VARIADIC_CONSTRUCTOR):  # the list gets a name (for extract_greedy)
            lines.append(f"(let $args{node.id} {render(term.args[-1])})")
            term = Call(term.fn, (*term.args[:-1], ListRef(node.id)))
            enc.lists[node.id] = node.inputs
        lines.append(f"(let $n{node.id} {render(term)})")
        lines.append(f"(set ({shape_fn} $n{node.id}) {render(Shape(node.type.shape))})")
    lines.extend(render(f) for f in _rope_attention_facts(enc))
    # the output list, one let per cell (a training graph has hundreds of outputs)
    lines.append(f"(let $out{len(graph.outputs)} {render(Call(TList.nil, ()))})")
    for i in range(len(graph.outputs) - 1, -1, -1):
        cell = f"({render.name(TList.cons)} $n{graph.outputs[i]} $out{i + 1})"
        lines.append(f"(let {'$outputs' if i == 0 else f'$out{i}'} {cell})")
    program = "\n".join(lines)
    state = egraph._state
    if state.egglog_file_state is None:
        state.egraph.parse_and_run_program(program)
    else:  # recording a transcript for --dump-egglog: go through egglog-python, which saves it
        state.run_program(*state.egraph.parse_program(program))
    tlist = TList.nil().__egg_typed_expr__.tp
    enc.root = RuntimeExpr.__from_values__(egraph.__egg_decls__, TypedExprDecl(tlist, LetRefDecl("outputs")))
    return enc
