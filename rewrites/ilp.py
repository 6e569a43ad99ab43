"""Optimal DAG extraction as an integer program over e-node choices (scipy's HiGHS MILP).

Variables: ``x_n`` in {0,1} per e-node (chosen or not), plus an order ``t_c`` per e-class
on cycles of the e-graph. Minimise ``sum cost_n x_n`` (each chosen e-node once, so a
shared sub-term is paid once) subject to: the output list's class has one chosen node;
a class has at most one chosen node; a chosen node's child classes have a chosen node;
on strongly connected parts, a chosen node's class is ordered after its children's
classes (no cyclic choice). The formulation follows the ILP extractor of
egg / extraction-gym (Yang et al., "Equality Saturation for Tensor Graph
Superoptimization", MLSys 2021).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from ..ir import RewriteError
from .cost import FREE_CONSTRUCTORS, GENERIC_NAMES, CostModel, enode_cost
from .encode import Encoding
from .extract import TermDag
from .sorts import Epi, T, TList

_SORTS = {"T": T, "Epi": Epi, "TList": TList}


@dataclass
class IlpResult:
    dag: TermDag
    cost: int
    optimal: bool
    seconds: float
    variables: int


def _sort_of(class_type: str) -> str | None:
    tail = class_type.rsplit(".", 1)[-1]
    return tail if tail in _SORTS else None


def extract_ilp(enc: Encoding, model: CostModel, time_limit_s: float = 60.0) -> IlpResult:
    """The least-cost DAG for the outputs, proven optimal unless the time limit ran out.

    Raises :class:`RewriteError` if the solver finds no feasible choice in time.
    """
    t0 = time.perf_counter()
    data = json.loads(enc.egraph._serialize(split_primitive_outputs=False).to_json())
    nodes, class_data = data["nodes"], data["class_data"]
    cls = {nid: n["eclass"] for nid, n in nodes.items()}
    sort = {c: _sort_of(d.get("type", "")) for c, d in class_data.items()}
    value = {n["eclass"]: n["op"] for nid, n in nodes.items() if nid.startswith("primitive-") and not n["children"]}
    numel = {cls[n["children"][0]]: int(value[n["eclass"]]) for n in nodes.values() if n["op"] == "numel"}
    root = next(c for c, d in class_data.items() if d.get("let") == "$outputs")

    members: dict[str, list[str]] = {}
    for nid, n in nodes.items():
        if sort.get(n["eclass"]) and n["op"].split(".", 1)[0] in _SORTS:
            members.setdefault(n["eclass"], []).append(nid)

    # classes reachable from the root through candidate e-nodes
    reach, stack = {root}, [root]
    while stack:
        for nid in members.get(stack.pop(), []):
            for ch in nodes[nid]["children"]:
                c = cls[ch]
                if sort.get(c) and c not in reach:
                    reach.add(c)
                    stack.append(c)
    cand = [nid for c in reach for nid in members.get(c, [])]
    index = {nid: i for i, nid in enumerate(cand)}

    def nbytes(c: str) -> int:
        if c not in numel:
            raise RewriteError(f"the shape analysis gave no size for e-class {c}")
        return numel[c] * 4

    cost = np.zeros(len(cand))
    for i, nid in enumerate(cand):
        n = nodes[nid]
        kids = [nbytes(cls[ch]) for ch in n["children"] if sort.get(cls[ch]) == "T"]
        free = n["op"] in FREE_CONSTRUCTORS
        out = nbytes(n["eclass"]) if sort[n["eclass"]] == "T" and not free else 0
        op = json.loads(value[cls[n["children"][0]]]) if n["op"] in GENERIC_NAMES else None
        cost[i] = 0 if free else enode_cost(model, n["op"], kids, out, op)

    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(coeffs: dict[int, float], lower: float, upper: float) -> None:
        r = len(lo)
        for j, v in coeffs.items():
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    constraint({index[n]: 1.0 for n in members[root]}, 1, 1)
    for c in reach:
        if len(members.get(c, [])) > 1:
            constraint({index[n]: 1.0 for n in members[c]}, -np.inf, 1)
    class_graph = nx.DiGraph()
    for nid in cand:
        i = index[nid]
        for c in {cls[ch] for ch in nodes[nid]["children"] if sort.get(cls[ch])}:
            coeffs = {index[m]: -1.0 for m in members.get(c, [])}
            coeffs[i] = coeffs.get(i, 0.0) + 1.0
            constraint(coeffs, -np.inf, 0)
            class_graph.add_edge(nodes[nid]["eclass"], c, node=i)

    # order variables only where the class graph has cycles
    cyclic = [s for s in nx.strongly_connected_components(class_graph)
              if len(s) > 1 or any(class_graph.has_edge(c, c) for c in s)]
    order = {c: len(cand) + k for k, c in enumerate(c for s in cyclic for c in s)}
    big = len(order) + 1
    for u, v, d in class_graph.edges(data=True):
        if u in order and v in order:
            if u == v:  # a self-loop e-node can never be chosen
                constraint({d["node"]: 1.0}, 0, 0)
            else:  # x_n -> t_u >= t_v + 1
                constraint({order[u]: 1.0, order[v]: -1.0, d["node"]: -float(big)}, 1 - big, np.inf)

    nvar = len(cand) + len(order)
    a = coo_array((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
    integrality = np.r_[np.ones(len(cand)), np.zeros(len(order))]
    bounds = Bounds(np.zeros(nvar), np.r_[np.ones(len(cand)), np.full(len(order), float(big))])
    res = milp(np.r_[cost, np.zeros(len(order))], constraints=LinearConstraint(a, lo, hi),
               integrality=integrality, bounds=bounds, options={"time_limit": time_limit_s})
    if res.x is None:
        raise RewriteError(f"ILP extraction found no solution ({res.message})")
    chosen = {nodes[cand[i]]["eclass"]: cand[i] for i in np.flatnonzero(res.x[:len(cand)] > 0.5)}
    dag = _build_term(root, chosen, nodes, cls, sort, value, int(round(res.fun)))
    return IlpResult(dag, dag.cost, res.status == 0, time.perf_counter() - t0, nvar)


def _build_term(root: str, chosen: dict, nodes: dict, cls: dict, sort: dict, value: dict, cost: int) -> TermDag:
    """The chosen e-nodes reachable from the root as a :class:`TermDag` (children first)."""
    index: dict[str, int] = {}
    out: list[tuple[str, tuple]] = []
    stack = [(root, False)]
    while stack:
        c, ready = stack.pop()
        if c in index:
            continue
        node = nodes[chosen[c]]
        kids = [cls[ch] for ch in node["children"] if sort.get(cls[ch])]
        if not ready:
            stack.append((c, True))
            stack.extend((k, False) for k in kids if k not in index)
            continue
        args = []
        for ch in node["children"]:
            cc = cls[ch]
            if sort.get(cc):
                args.append(index[cc])
            elif nodes[ch]["op"] == "Vec":
                args.append(tuple(int(nodes[g]["op"]) for g in nodes[ch]["children"]))
            else:
                args.append(json.loads(value[cc]) if value[cc].startswith('"') else int(value[cc]))
        index[c] = len(out)
        out.append((node["op"], tuple(args)))
    return TermDag(out, index[root], cost)
