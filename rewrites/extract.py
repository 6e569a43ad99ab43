"""Extraction with egglog's Rust greedy-DAG extractor, and rebuild of a Graph from a term DAG.

Both extractors (this one and :mod:`.ilp`) produce a :class:`TermDag`: e-nodes as
(constructor, arguments) with children by index, so a shared sub-term is one entry and
becomes one graph node. The greedy extractor drives egglog's raw bindings: the cost
callback receives backend values (no Python expression is built per e-node) and the
result comes back as egglog's own term DAG, with sharing and without recursion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egglog import EGraph, bindings
from egglog.egraph import resolve_callable

from ..ir import Graph, RewriteError
from .cost import FREE_CONSTRUCTORS, GENERIC_NAMES, CostModel, enode_cost
from .encode import LEAF_CONSTRUCTORS, Encoding
from .sorts import CONSTRUCTORS, VARIADIC_CONSTRUCTOR, Args, Epi, T, TList, numel

_SORTS = {"T": T, "Epi": Epi, "TList": TList, "Args": Args}
#: Variadic constructors -> the position of their ``Args`` list.
ARGS_POSITION = {"T.concat": 1, str(VARIADIC_CONSTRUCTOR): 2}


@dataclass(frozen=True)
class Constructor:
    """One egglog constructor: Python name (``T.matmul``), egglog name, argument sorts."""

    name: str
    egg_name: str
    arg_sorts: tuple[str, ...]


def _arg_sorts() -> dict[str, tuple[str, ...]]:
    """Argument sort names of every constructor of ``T``, ``Epi``, ``TList`` and ``Args``, by Python name."""
    out = {}
    for sort_name, sort in _SORTS.items():
        for method in (n for n in vars(sort) if not n.startswith("_")):
            ref, decls = resolve_callable(getattr(sort, method))
            sig = decls.get_callable_decl(ref).signature
            out[f"{sort_name}.{method}"] = tuple(t.ident.name for t in sig.arg_types)
    return out


ARG_SORTS = _arg_sorts()


def constructors(egraph: EGraph) -> dict[str, Constructor]:
    """Every constructor, by its egglog name in ``egraph``."""
    table: dict[str, Constructor] = {}
    for name, sorts in ARG_SORTS.items():
        sort_name, method = name.split(".")
        c = Constructor(name, egraph._callable_to_egg(getattr(_SORTS[sort_name], method))[1], sorts)
        table[c.egg_name] = c
    return table


@dataclass
class TermDag:
    """An extracted term as a DAG: ``nodes[i] = (constructor name, args)``; an argument is a
    child index (``int`` in a tensor/epilogue/list position) or a literal (str, int,
    tuple of ints for a shape). ``root`` is the index of the output list."""

    nodes: list[tuple[str, tuple]]
    root: int
    cost: int


def _is_child(sort: str) -> bool:
    return sort in _SORTS


def extract_greedy(enc: Encoding, model: CostModel) -> TermDag:
    """egglog's Rust greedy-DAG extraction with :func:`~.cost.enode_cost` as the marginal cost."""
    eg = enc.egraph
    raw = eg._egraph
    table = constructors(eg)
    numel_name = eg._callable_to_egg(numel)[1]
    nbytes_memo: dict = {}

    def nbytes(v) -> int:
        n = nbytes_memo.get(v)
        if n is None:
            size = raw.lookup_function(numel_name, [v])
            if size is None:
                raise RewriteError("the shape analysis gave no size for an e-class the extractor reached")
            n = nbytes_memo[v] = raw.value_to_i64(size) * 4
        return n

    span = bindings.PanicSpan()
    # the bytes of the tensors of every Args list, by its value: the cost callback cannot
    # look inside a list (it may see a variadic e-node before the list's e-nodes). Every
    # list is the graph's; the rules create variadic e-nodes only as Concat of parameters (free).
    listed = {raw.eval_expr(bindings.Var(span, f"$args{node}"))[1]: [
        nbytes(raw.eval_expr(bindings.Var(span, f"$n{i}"))[1]) for i in inputs] for node, inputs in enc.lists.items()}

    def node_cost(name: str, args: list) -> int:
        c = table.get(name)
        if c is None or c.name in FREE_CONSTRUCTORS:
            return 0
        kids = [nbytes(a) for a, s in zip(args, c.arg_sorts, strict=True) if s == "T"]
        if c.name in ARGS_POSITION:
            kids = listed[args[ARGS_POSITION[c.name]]]
        out = nbytes(raw.lookup_function(name, args)) if c.name.startswith("T.") else 0
        op = raw.value_to_string(args[0]) if c.name in GENERIC_NAMES else None
        return enode_cost(model, c.name, kids, out, op)

    cost_model = bindings.DagCostModel(0, node_cost, lambda sort, v: 0, lambda sort, v: 0)
    root = raw.eval_expr(bindings.Var(span, "$outputs"))
    dag, results = bindings.extract_best_with_dag_cost_model(raw, [root], cost_model, extractor="greedy-dag")
    if not results or results[0] is None:
        raise RewriteError("greedy-DAG extraction found no term for the outputs")
    cost, root_id = results[0]
    return _from_egglog_termdag(dag, root_id, table, cost)


def _from_egglog_termdag(dag, root_id: int, table: dict[str, Constructor], cost: int) -> TermDag:
    """Our :class:`TermDag` from egglog's (children first, iteratively)."""
    index: dict[int, int] = {}
    nodes: list[tuple[str, tuple]] = []
    stack = [(root_id, False)]
    while stack:
        tid, ready = stack.pop()
        if tid in index:
            continue
        term = dag.get(tid)
        c = table[term.name]
        kids = [a for a, s in zip(term.args, c.arg_sorts, strict=True) if _is_child(s)]
        if not ready:
            stack.append((tid, True))
            stack.extend((k, False) for k in kids if k not in index)
            continue
        args = tuple(index[a] if _is_child(s) else _literal(dag, a) for a, s in zip(term.args, c.arg_sorts,
                                                                                    strict=True))
        index[tid] = len(nodes)
        nodes.append((c.name, args))
    return TermDag(nodes, index[root_id], int(cost))


def _literal(dag, tid: int) -> Any:
    term = dag.get(tid)
    if isinstance(term, bindings.TermLit):
        v = term.value
        return v.value if hasattr(v, "value") else v
    if isinstance(term, bindings.TermApp):  # vec-of: a shape
        return tuple(_literal(dag, a) for a in term.args)
    raise RewriteError(f"unexpected literal term {term!r}")


# --- rebuild -----------------------------------------------------------------------------

_OP_OF = {str(ctor): (op, has_attrs) for op, (ctor, has_attrs) in CONSTRUCTORS.items()}
_LEAF_OP_OF = {str(ctor): op for op, ctor in LEAF_CONSTRUCTORS.items()}
_PLAIN_MATMUL = {"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}


def _epilogue(dag: TermDag, i: int) -> tuple[list[str], list[int]]:
    """Steps (innermost first) and operand indices of an ``Epi`` chain."""
    steps, operands = [], []
    while (node := dag.nodes[i])[0] != "Epi.none":
        name, args = node
        if name == "Epi.act":
            steps.append(args[1])
        else:
            steps.append("bias" if name == "Epi.bias" else "add")
            operands.append(args[1])
        i = args[0]
    return steps[::-1], operands[::-1]


def rebuild(dag: TermDag, enc: Encoding) -> Graph:
    """A new Graph computing the extracted DAG, one node per DAG entry reached from the outputs.

    Every node goes through the IR builder, so its shape rule is checked again.
    """
    g = Graph()
    built: dict[int, int] = {}
    outs = []
    i = dag.root
    while dag.nodes[i][0] == "TList.cons":
        outs.append(dag.nodes[i][1][0])
        i = dag.nodes[i][1][1]
    for start in outs:
        stack = [(start, False)]
        while stack:
            j, ready = stack.pop()
            if j in built:
                continue
            kids = _children(dag, j)
            if not ready:
                stack.append((j, True))
                stack.extend((k, False) for k in kids if k not in built)
                continue
            built[j] = _build_node(g, dag, j, [built[k] for k in kids], enc)
    g.set_outputs([built[o] for o in outs])
    return g


def _listed(dag: TermDag, i: int) -> list[int]:
    """The entries of an ``Args`` list, in order."""
    out = []
    while (node := dag.nodes[i])[0] == "Args.cons":
        out.append(node[1][0])
        i = node[1][1]
    return out


def _children(dag: TermDag, j: int) -> list[int]:
    name, args = dag.nodes[j]
    if name in ARGS_POSITION:
        return _listed(dag, args[ARGS_POSITION[name]])
    if name == "T.fused_matmul":
        return [args[1], args[2], *_epilogue(dag, args[3])[1]]
    if name == "T.fused_rms_norm_matmul":
        return [args[2], args[3], args[4], *_epilogue(dag, args[5])[1]]
    return [a for a, s in zip(args, ARG_SORTS[name], strict=True) if s == "T"]


def _build_node(g: Graph, dag: TermDag, j: int, inputs: list[int], enc: Encoding) -> int:
    name, args = dag.nodes[j]
    if name in _LEAF_OP_OF:
        op = _LEAF_OP_OF[name]
        orig = enc.leaves[(op, args[0])]
        if op == "Constant":
            return g.constant(orig.attrs["value"])
        if op == "Input":
            return g.input(orig.attrs["name"], orig.type.shape, orig.type.dtype)
        if orig.attrs.get("state"):
            return g.state(orig.attrs["name"], orig.type.shape)
        return g.parameter(orig.attrs["name"], orig.type.shape)
    if name == "T.reshape":
        return g.reshape(inputs[0], args[1])
    if name == "T.fused_matmul":
        steps, _ = _epilogue(dag, args[3])
        if not steps:
            return g.add_node(_PLAIN_MATMUL[args[0]], inputs)
        return g.add_node("FusedMatMul", inputs, variant=args[0], epilogue=tuple(steps))
    if name == "T.fused_rms_norm_matmul":
        steps, _ = _epilogue(dag, args[5])
        return g.add_node("FusedRmsNormMatMul", inputs, **enc.attrs[args[0]], variant=args[1],
                          epilogue=tuple(steps))
    if name == "T.concat":
        return g.add_node("Concat", inputs, axis=int(args[0]))
    if name == "T.slice_cols":
        return g.add_node("SliceCols", inputs, start=int(args[1]), size=int(args[2]))
    if name in ("T.causal_attention_rope", "T.causal_attention_rope_packed"):
        return g.add_node("CausalAttentionRoPE", inputs, **{**enc.attrs[args[0]], **enc.attrs[args[1]]})
    if name == "T.cached_attention_rope":
        return g.add_node("CachedAttentionRoPE", inputs, **{**enc.attrs[args[0]], **enc.attrs[args[1]]})
    if name == "T.full_attention_masked":
        return g.add_node("FullAttention", inputs, **enc.attrs[args[0]])
    if name in GENERIC_NAMES:
        return g.add_node(args[0], inputs, **enc.attrs[args[1]])
    if name not in _OP_OF:
        raise RewriteError(f"extracted term has an unknown constructor {name}")
    op, has_attrs = _OP_OF[name]
    return g.add_node(op, inputs, **(enc.attrs[args[0]] if has_attrs else {}))
