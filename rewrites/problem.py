"""The extraction problem read from a saturated e-graph: e-classes, candidate e-nodes, costs.

egglog serialises the e-graph (e-nodes with their e-class and children); this module
keeps the e-nodes of the tensor, epilogue and output-list sorts reachable from the
outputs, prices each with :func:`~.cost.enode_cost` (sizes from the ``numel``
analysis) and turns a choice of one e-node per e-class into a :class:`~.extract.TermDag`.
Both the greedy and the ILP extractor solve this problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..ir import RewriteError
from .cost import FREE_CONSTRUCTORS, GENERIC_NAMES, CostModel, enode_cost
from .encode import Encoding
from .extract import ARG_SORTS, ARGS_POSITION, TermDag

#: The sorts whose e-nodes extraction chooses among (the rest are literals and analyses).
SORTS = ("T", "Epi", "TList", "Args")


def serialized(enc: Encoding) -> dict:
    """egglog's serialisation of the e-graph: ``nodes`` (op, children, e-class) and ``class_data``."""
    return json.loads(enc.egraph._serialize(split_primitive_outputs=False).to_json())


def decode(raw: dict) -> tuple[dict, dict, dict]:
    """(e-class of each node id, candidate e-nodes of each e-class, literal of each primitive e-class)."""
    nodes = raw["nodes"]
    cls = {nid: n["eclass"] for nid, n in nodes.items()}
    value = {n["eclass"]: n["op"] for nid, n in nodes.items() if nid.startswith("primitive-") and not n["children"]}
    members: dict[str, list[str]] = {}
    for nid, n in nodes.items():
        if "." in n["op"] and n["op"].split(".", 1)[0] in SORTS:
            members.setdefault(n["eclass"], []).append(nid)
    return cls, members, value


def literal(nodes: dict, node_id: str):
    """The Python value of a literal argument: str, int, or a shape (tuple of ints) for a Vec."""
    node = nodes[node_id]
    if node["op"] == "Vec":
        return tuple(int(nodes[g]["op"]) for g in node["children"])
    op = node["op"]
    return json.loads(op) if op.startswith('"') else int(op)


@dataclass
class Problem:
    """``classes[i]`` an e-class id; e-node j is in class ``node_class[j]``, costs
    ``cost[j]`` and needs the classes ``node_children[j]`` (distinct, sorted;
    ``node_args[j]`` lists them in argument order); ``root`` is the outputs' class."""

    classes: list[str]
    class_nodes: list[list[int]]
    node_ids: list[str]
    node_class: np.ndarray
    node_children: list[list[int]]
    node_args: list[list[int]]
    cost: np.ndarray
    root: int
    raw: dict

    def term(self, choice: dict[int, int]) -> TermDag:
        """The :class:`TermDag` of ``choice`` (class index -> chosen e-node index) from the root;
        its cost is the sum of the chosen e-nodes' costs, each e-class reached counted once."""
        nodes = self.raw["nodes"]
        cost = 0.0
        index: dict[int, int] = {}
        out: list[tuple[str, tuple]] = []
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
                if sort in SORTS:
                    args.append(index[next(kids)])
                else:
                    args.append(literal(nodes, ch))
            index[c] = len(out)
            out.append((node["op"], tuple(args)))
            cost += self.cost[j]
        return TermDag(out, index[self.root], int(round(cost)))


def build_problem(enc: Encoding, model: CostModel) -> Problem:
    """Read the e-graph of ``enc`` and price every candidate e-node under ``model``.

    Raises :class:`RewriteError` when an e-class the outputs need has no size.
    """
    raw = serialized(enc)
    nodes, class_data = raw["nodes"], raw["class_data"]
    cls, members, value = decode(raw)
    numel = {cls[n["children"][0]]: int(value[n["eclass"]]) for n in nodes.values() if n["op"] == "numel"}
    root_class = next(c for c, d in class_data.items() if d.get("let") == "$outputs")

    def sorted_kids(nid: str) -> list[str]:
        n = nodes[nid]
        return [cls[ch] for ch, s in zip(n["children"], ARG_SORTS[n["op"]], strict=True) if s in SORTS]

    reach, stack = {root_class}, [root_class]
    while stack:
        for nid in members.get(stack.pop(), []):
            for c in sorted_kids(nid):
                if c not in reach:
                    reach.add(c)
                    stack.append(c)
    classes = sorted(reach)
    cindex = {c: i for i, c in enumerate(classes)}
    node_ids = [nid for c in classes for nid in members.get(c, [])]

    def nbytes(c: str) -> int:
        if c not in numel:
            raise RewriteError(f"the shape analysis gave no size for e-class {c}")
        return numel[c] * 4

    def listed(c: str) -> list[str]:
        # the tensor e-classes of an Args list (its e-classes are never merged: one e-node each)
        out = []
        while (n := nodes[members[c][0]])["op"] == "Args.cons":
            out.append(cls[n["children"][0]])
            c = cls[n["children"][1]]
        return out

    cost = np.zeros(len(node_ids))
    children, ordered = [], []
    for j, nid in enumerate(node_ids):
        n = nodes[nid]
        kids = sorted_kids(nid)
        ordered.append([cindex[c] for c in kids])
        children.append(sorted(set(ordered[-1])))
        if n["op"] in FREE_CONSTRUCTORS:
            continue
        sorts = ARG_SORTS[n["op"]]
        if n["op"] in ARGS_POSITION:
            tensor_kids = [nbytes(c) for c in listed(cls[n["children"][ARGS_POSITION[n["op"]]]])]
        else:
            tensor_kids = [nbytes(cls[ch]) for ch, s in zip(n["children"], sorts, strict=True) if s == "T"]
        out = nbytes(n["eclass"]) if n["op"].startswith("T.") else 0
        op = json.loads(value[cls[n["children"][0]]]) if n["op"] in GENERIC_NAMES else None
        cost[j] = enode_cost(model, n["op"], tensor_kids, out, op)
    class_nodes = [[] for _ in classes]
    node_class = np.array([cindex[cls[nid]] for nid in node_ids], dtype=np.int64)
    for j, c in enumerate(node_class):
        class_nodes[c].append(j)
    for c, ms in enumerate(class_nodes):
        if len(ms) > 1:
            class_nodes[c] = _undominated(ms, cost, children)
    return Problem(classes, class_nodes, node_ids, node_class, children, ordered, cost, cindex[root_class], raw)


def _undominated(members: list[int], cost: np.ndarray, children: list[list[int]]) -> list[int]:
    """The e-nodes of one e-class that no other e-node of it dominates.

    e-node a is dominated by b when a costs at least as much and needs every e-class b
    needs (and more, or the same with a later index): any choice using a is no cheaper
    with b instead, so no extractor needs a. ``MatMul(a, b)`` dominates
    ``FusedMatMul(a, b, [])``, for one.
    """
    keep = []
    for a in members:
        need_a = set(children[a])
        dominated = False
        for b in members:
            if b == a or cost[b] > cost[a] or not need_a >= set(children[b]):
                continue
            if cost[b] < cost[a] or len(children[b]) < len(need_a) or b < a:
                dominated = True
                break
        if not dominated:
            keep.append(a)
    return keep
