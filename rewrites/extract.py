"""Extraction (egglog's Rust greedy-DAG extractor) and rebuild of a Graph from the term."""

from __future__ import annotations

from egglog import get_callable_args, get_callable_fn, get_literal_value

from ..ir import Graph, RewriteError
from .cost import CostModel, dag_cost_model
from .encode import LEAF_CONSTRUCTORS, Encoding
from .sorts import CONSTRUCTORS, Epi, T, TList

_OP_OF = {ctor: (op, has_attrs) for op, (ctor, has_attrs) in CONSTRUCTORS.items()}
_LEAF_OP_OF = {ctor: op for op, ctor in LEAF_CONSTRUCTORS.items()}
_PLAIN_MATMUL = {"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}
# RuntimeFunction objects are created anew on each attribute access: compare by hash/eq.
_EPI_STEP = {Epi.bias: "bias", Epi.add: "add"}
_EPI_NONE, _EPI_ACT = {Epi.none}, {Epi.act}
_FUSED, _RESHAPE, _MASKED = {T.fused_matmul}, {T.reshape}, {T.full_attention_masked}


def extract(enc: Encoding, model: CostModel) -> tuple[TList, int]:
    """The cheapest term for all outputs at once and its DAG cost (shared sub-terms once)."""
    term, cost = enc.egraph.extract(enc.root, include_cost=True, extractor="greedy-dag",
                                    cost_model=dag_cost_model(enc.egraph, model))
    return term, cost


def _epilogue(epi) -> tuple[list[str], list[T]]:
    """Steps (innermost first) and operand terms of an ``Epi`` chain."""
    steps, operands = [], []
    while (fn := get_callable_fn(epi)) not in _EPI_NONE:
        args = get_callable_args(epi)
        if fn in _EPI_ACT:
            steps.append(get_literal_value(args[1]))
        else:
            steps.append(_EPI_STEP[fn])
            operands.append(args[1])
        epi = args[0]
    return steps[::-1], operands[::-1]


def _children(e) -> list[T]:
    fn, args = get_callable_fn(e), get_callable_args(e)
    if fn in _FUSED:
        return [args[1], args[2], *_epilogue(args[3])[1]]
    return [a for a in args if isinstance(a, T)]


def _vec(v) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def rebuild(term: TList, enc: Encoding) -> Graph:
    """A new Graph computing the extracted term, one node per distinct sub-term.

    Walks the term iteratively in post-order with a memo on the interned expression, so
    a sub-term shared in the DAG becomes one shared node. Every node goes through the
    IR builder, so its shape rule is checked again.
    """
    g = Graph()
    memo: dict = {}

    def key(e):
        return e.__egg_typed_expr__

    outs = []
    cur = term
    while (ht := get_callable_args(cur, TList.cons)) is not None:
        outs.append(ht[0])
        cur = ht[1]
    stack = [(o, False) for o in reversed(outs)]
    while stack:
        e, ready = stack.pop()
        if key(e) in memo:
            continue
        kids = _children(e)
        if not ready:
            stack.append((e, True))
            stack.extend((k, False) for k in kids if key(k) not in memo)
            continue
        memo[key(e)] = _build_node(g, e, [memo[key(k)] for k in kids], enc)
    g.set_outputs([memo[key(o)] for o in outs])
    return g


def _build_node(g: Graph, e, inputs: list[int], enc: Encoding) -> int:
    fn, args = get_callable_fn(e), get_callable_args(e)
    if fn in _LEAF_OP_OF:
        op = _LEAF_OP_OF[fn]
        orig = enc.leaves[(op, get_literal_value(args[0]))]
        if op == "Constant":
            return g.constant(orig.attrs["value"])
        if op == "Input":
            return g.input(orig.attrs["name"], orig.type.shape, orig.type.dtype)
        return g.parameter(orig.attrs["name"], orig.type.shape)
    if fn in _RESHAPE:
        return g.reshape(inputs[0], _vec(args[1]))
    if fn in _FUSED:
        variant = get_literal_value(args[0])
        steps, _ = _epilogue(args[3])
        if not steps:
            return g.add_node(_PLAIN_MATMUL[variant], inputs)
        return g.add_node("FusedMatMul", inputs, variant=variant, epilogue=tuple(steps))
    if fn in _MASKED:
        return g.add_node("FullAttention", inputs, **enc.attrs[get_literal_value(args[0])])
    if fn not in _OP_OF:
        raise RewriteError(f"extracted term has an unknown constructor {fn}")
    op, has_attrs = _OP_OF[fn]
    attrs = enc.attrs[get_literal_value(args[0])] if has_attrs else {}
    return g.add_node(op, inputs, **attrs)
