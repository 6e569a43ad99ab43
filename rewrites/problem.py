"""The extraction problem read from a saturated e-graph: e-classes, candidate e-nodes, costs.

egglog serialises the e-graph (e-nodes with their e-class and children); this module keeps
the e-nodes of the tensor, epilogue and list sorts reachable from the outputs, gives every
tensor e-class its type (from the ``shape`` facts set at encoding; for an e-class a rule
created, from the IR's shape rule applied to an e-node of it: the IR stays the only
authority on shapes), checks every other reachable e-node against its e-class's type (a
rule's right side has no shape fact, so egglog lets an unsound rule join terms of different
shapes), prices each e-node under the cost model and turns a choice of one
e-node per e-class into a :class:`~.extract.TermDag`. Both the greedy and the ILP extractor
solve this problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..ir import OPS, RewriteError, TensorType
from ..ir.spec import ShapeError, json_value
from . import egglog_private
from .cost import CostModel, epilogue_operand_info, kernel_info
from .encode import Encoding
from .extract import TermDag
from .sorts import ARG_SORTS, CHILD_SORTS, SIGNATURES


def decode(raw: dict) -> tuple[dict, dict, dict]:
    """(e-class of each node id, candidate e-nodes of each e-class, literal op of each primitive e-class)."""
    nodes = raw["nodes"]
    cls = {nid: n["eclass"] for nid, n in nodes.items()}
    value = {n["eclass"]: n["op"] for nid, n in nodes.items() if nid.startswith("primitive-") and not n["children"]}
    members: dict[str, list[str]] = {}
    for nid, n in nodes.items():
        if n["op"] in ARG_SORTS and not nid.startswith("primitive-"):
            members.setdefault(n["eclass"], []).append(nid)
    return cls, members, value


def literal(nodes: dict, node_id: str, kind: str):
    """The Python value of a literal argument of attribute ``kind`` (``ir.spec.ATTR_KINDS``)."""
    node = nodes[node_id]
    op = node["op"]
    if kind == "ints":
        return tuple(int(nodes[g]["op"]) for g in node["children"])
    if kind == "floats":
        return tuple(float(nodes[g]["op"]) for g in node["children"])
    if kind == "int":
        return int(op)
    if kind == "float":
        return float(op)
    if kind == "bool":
        return op == "true"
    if kind == "json":
        return json_value(json.loads(json.loads(op)))
    return json.loads(op)


@dataclass
class ENode:
    """One decoded e-node: ``op``, its attributes, its tensor inputs as e-classes in input order
    (variadic lists and epilogue operands flattened), and for a fused matmul its epilogue steps."""

    op: str
    attrs: dict
    inputs: list[str]


class Decoder:
    """Reads e-nodes of egglog's serialisation as IR ops (shared by extraction and the soundness check)."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw
        self.nodes = raw["nodes"]
        self.cls, self.members, self.value = decode(raw)

    def args(self, nid: str) -> list[tuple[str, str]]:
        """(sort, child node id) of each argument of e-node ``nid``."""
        n = self.nodes[nid]
        return list(zip(ARG_SORTS[n["op"]], n["children"], strict=True))

    def first(self, eclass: str) -> str:
        return self.members[eclass][0]

    def tensor_list(self, eclass: str) -> list[str]:
        """The tensor e-classes of a ``TList`` e-class, in order."""
        out = []
        while True:
            n = self.nodes[self.first(eclass)]
            if n["op"] == "TList.nil":
                return out
            out.append(self.cls[n["children"][0]])
            eclass = self.cls[n["children"][1]]

    def epilogue(self, eclass: str) -> tuple[list[str], list[str]]:
        """Steps (innermost first) and operand e-classes of an ``Epi`` e-class."""
        steps, operands = [], []
        while (n := self.nodes[self.first(eclass)])["op"] != "Epi.none":
            inner, arg = n["children"]
            if n["op"] == "Epi.act":
                steps.append(json.loads(self.nodes[arg]["op"]))
            else:
                steps.append("bias" if n["op"] == "Epi.bias" else "add")
                operands.append(self.cls[arg])
            eclass = self.cls[inner]
        return steps[::-1], operands[::-1]

    def enode(self, nid: str) -> ENode:
        """e-node ``nid`` of a tensor e-class as an IR op application."""
        n = self.nodes[nid]
        sig = SIGNATURES[n["op"]]
        op = sig.op
        if sig.leaf:
            return ENode(op, {"name": literal(self.nodes, n["children"][0], "str")}, [])
        attrs, inputs = {}, []
        for (sort, child), attr in zip(self.args(nid), (*sig.attrs, *([None] * len(n["children"]))), strict=False):
            if sort == "T":
                inputs.append(self.cls[child])
            elif sort == "TList":
                inputs.extend(self.tensor_list(self.cls[child]))
            elif sort == "Epi":
                steps, operands = self.epilogue(self.cls[child])
                attrs[OPS[op].epilogue_attr.name] = tuple(steps)
                inputs.extend(operands)
            else:
                attrs[attr.name] = literal(self.nodes, child, sort)
        return ENode(op, attrs, inputs)


@dataclass
class Problem:
    """``classes[i]`` an e-class id; e-node j is in class ``node_class[j]``, costs
    ``cost[j]`` and needs the classes ``node_children[j]`` (distinct, sorted;
    ``node_args[j]`` lists them in argument order); ``root`` is the outputs' class;
    ``types`` the IR type of each tensor e-class."""

    classes: list[str]
    class_nodes: list[list[int]]
    node_ids: list[str]
    node_class: np.ndarray
    node_children: list[list[int]]
    node_args: list[list[int]]
    cost: np.ndarray
    root: int
    raw: dict
    types: dict[str, TensorType]

    def term(self, choice: dict[int, int]) -> TermDag:
        """The :class:`TermDag` of ``choice`` (class index -> chosen e-node index) from the root;
        its cost is the sum of the chosen e-nodes' costs, each e-class reached counted once."""
        nodes = self.raw["nodes"]
        cost = 0.0
        index: dict[int, int] = {}
        out: list[tuple[str, tuple]] = []
        eclasses: list[str] = []
        stack = [(self.root, False)]
        while stack:
            c, ready = stack.pop()
            if c in index:
                continue
            j = choice[c]
            if not ready:
                stack.append((c, True))
                stack.extend((k, False) for k in self.node_children[j] if k not in index)
                continue
            node = nodes[self.node_ids[j]]
            args = []
            kids = iter(self.node_args[j])
            for ch, sort in zip(node["children"], ARG_SORTS[node["op"]], strict=True):
                args.append(index[next(kids)] if sort in CHILD_SORTS else literal(nodes, ch, sort))
            index[c] = len(out)
            out.append((node["op"], tuple(args)))
            eclasses.append(self.classes[c])
            cost += self.cost[j]
        return TermDag(out, index[self.root], int(round(cost)), eclasses, [self.types.get(e) for e in eclasses])


def _types(dec: Decoder, enc: Encoding, reach: set[str]) -> dict[str, TensorType]:
    """The IR type of every reachable tensor e-class: the encoding's type of a let-bound node,
    else (an e-class a rule created) the shape rule of one of its e-nodes applied to its
    inputs' types, which gives the dtype too; an e-class's ``shape`` fact (f32) is used where
    no shape rule can be applied yet."""
    types: dict[str, TensorType] = {}
    for c, d in dec.raw["class_data"].items():
        if d.get("let") in enc.types:
            types[c] = enc.types[d["let"]]
    vectors = {n["eclass"]: n for nid, n in dec.nodes.items() if nid.startswith("primitive-Vec")}
    facts: dict[str, TensorType] = {}
    for n in dec.nodes.values():
        if n["op"] == "shape" and (c := dec.cls[n["children"][0]]) not in types:
            facts[c] = TensorType(tuple(int(dec.nodes[g]["op"]) for g in vectors[n["eclass"]]["children"]))
    pending = [c for c in reach if c not in types and dec.raw["class_data"][c].get("type") == "T"]
    while pending:
        progress = False
        for c in list(pending):
            for nid in dec.members.get(c, []):
                e = dec.enode(nid)
                spec = OPS[e.op]
                if spec.leaf or not all(i in types for i in e.inputs):
                    continue
                full = {a.name: a.default for a in spec.attrs} | e.attrs
                try:
                    types[c] = spec.infer([types[i] for i in e.inputs], full)
                except ShapeError as err:
                    raise RewriteError(f"a rule built {e.op} of inputs {[str(types[i]) for i in e.inputs]} that its "
                                       f"shape rule rejects: {err}") from None
                pending.remove(c)
                progress = True
                break
        if not progress:
            known = [c for c in pending if c in facts]
            if not known:
                raise RewriteError(f"the rewrite engine found no type for e-class {pending[0]} "
                                   f"({', '.join(dec.nodes[m]['op'] for m in dec.members.get(pending[0], []))})")
            for c in known:
                types[c] = facts[c]
                pending.remove(c)
    for c, t in facts.items():
        types.setdefault(c, t)
    return types


def build_problem(enc: Encoding, model: CostModel, raw: dict | None = None, *, check_types: bool = True) -> Problem:
    """Read the e-graph of ``enc`` and price every candidate e-node under ``model``.

    ``check_types``: apply the shape rule of every reachable e-node to its inputs' types and
    compare the result (shape and dtype) with its e-class's type, so that an unsound rule (one
    whose sides differ in shape or dtype) is named even when extraction would not pick its
    e-node. Raises :class:`RewriteError` when an e-class the outputs need has no type, and
    for an e-node whose type differs from its e-class's or whose inputs its shape rule rejects.
    """
    raw = egglog_private.serialize(enc.egraph) if raw is None else raw
    dec = Decoder(raw)
    nodes, class_data = raw["nodes"], raw["class_data"]
    root_class = next(c for c, d in class_data.items() if d.get("let") == enc.root)

    def sorted_kids(nid: str) -> list[str]:
        return [dec.cls[ch] for sort, ch in dec.args(nid) if sort in CHILD_SORTS]

    reach, stack = {root_class}, [root_class]
    while stack:
        for nid in dec.members.get(stack.pop(), []):
            for c in sorted_kids(nid):
                if c not in reach:
                    reach.add(c)
                    stack.append(c)
    types = _types(dec, enc, reach)
    classes = sorted(reach)
    cindex = {c: i for i, c in enumerate(classes)}
    node_ids = [nid for c in classes for nid in dec.members.get(c, [])]
    free_params = {c for c in reach for nid in dec.members.get(c, [])
                      if nodes[nid]["op"] == "Parameter" and dec.enode(nid).attrs["name"] not in enc.written}

    cost = np.zeros(len(node_ids))
    children, ordered = [], []
    inferred = {} if check_types else None
    for j, nid in enumerate(node_ids):
        kids = sorted_kids(nid)
        ordered.append([cindex[c] for c in kids])
        children.append(sorted(set(ordered[-1])))
        cost[j] = _enode_cost(dec, nid, types, model, free_params, inferred)
    class_nodes = [[] for _ in classes]
    node_class = np.array([cindex[dec.cls[nid]] for nid in node_ids], dtype=np.int64)
    for j, c in enumerate(node_class):
        class_nodes[c].append(j)
    needs = _necessary(class_nodes, children)
    for c, members in enumerate(class_nodes):
        if len(members) > 1:
            class_nodes[c] = _undominated(members, cost, children, needs)
    return Problem(classes, class_nodes, node_ids, node_class, children, ordered, cost, cindex[root_class], raw, types)


def _check_type(dec: Decoder, nid: str, e: ENode, full: dict, types: dict[str, TensorType],
                inferred: dict[tuple, TensorType]) -> None:
    """Raise :class:`RewriteError` unless e-node ``nid``'s shape rule, applied to its inputs'
    types, gives its e-class's type. ``inferred`` memoises the shape rules' results (the
    layers of a model repeat the same ops on the same types)."""
    c = dec.cls[nid]
    ins = [types[i] for i in e.inputs]
    key = (e.op, *ins, *e.attrs.items())
    got = inferred.get(key)
    if got is None:
        try:
            got = inferred[key] = OPS[e.op].infer(ins, full)
        except ShapeError as err:
            raise RewriteError(f"a rule put {e.op} of inputs {[str(t) for t in ins]} into e-class {c} ({types[c]}), "
                               f"but its shape rule rejects those inputs: {err}") from None
    if got != types[c]:
        raise RewriteError(f"a rule put {e.op} of type {got} (inputs {[str(t) for t in ins]}) into e-class {c} of "
                           f"type {types[c]}: a rule whose two sides have different shapes or dtypes is unsound "
                           "(check the rules of the rulesets passed to optimize)")


def _enode_cost(dec: Decoder, nid: str, types: dict[str, TensorType], model: CostModel, free_params: set[str],
                inferred: dict[tuple, TensorType] | None) -> float:
    name = dec.nodes[nid]["op"]
    if name in ("Epi.bias", "Epi.add"):
        operand = dec.cls[dec.nodes[nid]["children"][1]]
        return model.kernel_cost(epilogue_operand_info(name[4:], types[operand]))
    if name not in SIGNATURES:
        return 0.0  # list cells, Epi.none, Epi.act: structure
    sig = SIGNATURES[name]
    op = sig.op
    spec = OPS[op]
    if spec.leaf or (spec.dispatches == 0 and inferred is None):
        return 0.0  # a leaf has no inputs to check
    e = dec.enode(nid)
    full = {a.name: a.default for a in spec.attrs} | e.attrs
    if inferred is not None:
        _check_type(dec, nid, e, full, types, inferred)
    if spec.dispatches == 0:
        return 0.0
    if spec.packs_parameters and all(i in free_params for i in e.inputs):
        return 0.0  # a derived parameter, packed once when a session is created
    # epilogue operands are charged to their Epi steps: the op reads its fixed inputs
    reads = e.inputs[:sig.tensors] if sig.epilogue else e.inputs
    ins = tuple(types[i] for i in reads)
    return float(model.kernel_cost(kernel_info(op, full, ins, types[dec.cls[nid]])))


#: How many levels below an e-node's children :func:`_necessary` follows what they need.
NEED_DEPTH = 3


def _necessary(class_nodes: list[list[int]], children: list[list[int]]) -> list[frozenset[int]]:
    """For each e-class, the classes that any choice of it computes: those every e-node of it has as
    a child, and what those need in turn, :data:`NEED_DEPTH` levels down."""
    direct = [frozenset.intersection(*(frozenset(children[m]) for m in ms)) if ms else frozenset()
              for ms in class_nodes]
    needs = direct
    for _ in range(NEED_DEPTH - 1):
        needs = [d.union(*(direct[k] for k in d)) for d in needs]
    return needs


def _undominated(members: list[int], cost: np.ndarray, children: list[list[int]],
                 needs: list[frozenset[int]] | None = None) -> list[int]:
    """The e-nodes of one e-class that no other e-node of it dominates.

    e-node a is dominated by b when a costs at least as much and every e-class b needs is one a
    needs, directly or as what a child of a needs whichever e-node computes it (``needs``, from
    :func:`_necessary`): then b is at least as good in every extraction, and choosing b where a
    was makes no cycle (what b needs lies below a). ``MatMul(a, b)`` dominates ``FusedMatMul(a, b,
    [])``, for one, and ``AttentionScores(q, k, s c c)`` dominates ``AttentionScores(Mul(q, c),
    Mul(k, c), s)``. Of e-nodes that dominate each other, the first is kept.
    """
    covered = {}
    for a in members:
        have = set(children[a])
        if needs is not None:
            for k in children[a]:
                have |= needs[k]
        covered[a] = have
    keep = []
    for a in members:
        need_a = covered[a]
        dominated = False
        for b in members:
            if b == a or cost[b] > cost[a] or not need_a >= set(children[b]):
                continue
            mutual = cost[b] == cost[a] and covered[b] >= set(children[a])
            if not mutual or b < a:
                dominated = True
                break
        if not dominated:
            keep.append(a)
    return keep


__all__ = ["Decoder", "ENode", "Problem", "build_problem", "decode", "literal"]
