"""Optimal DAG extraction as an integer program over e-node choices (scipy's HiGHS MILP).

Variables: ``x_n`` in {0,1} per e-node (chosen or not), plus an order ``t_c`` per e-class
on cycles of the e-graph. Minimise ``sum cost_n x_n`` (each chosen e-node once, so a
shared sub-term is paid once) subject to: the output list's class has one chosen node;
a class has at most one chosen node; a chosen node's child classes have a chosen node;
no cyclic choice: on a strongly connected part of the class graph, the e-nodes realising a
simple cycle's edges are not all chosen, or (a part with many cycles) a chosen node's class is
ordered after its children's classes. The formulation follows the ILP extractor of
egg / extraction-gym (Yang et al., "Equality Saturation for Tensor Graph
Superoptimization", MLSys 2021).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from ..ir import RewriteError
from .extract import TermDag
from .problem import Problem

#: Simple cycles of one strongly connected part of the class graph that get a constraint each;
#: a part with more is ordered instead (big-M).
MAX_CYCLES_PER_PART = 64


def _simple_cycles(graph: nx.DiGraph, limit: int) -> list[list[int]] | None:
    """The simple cycles of ``graph`` (self-loops included), or None when there are more than ``limit``."""
    out = []
    for cycle in nx.simple_cycles(graph):
        out.append(cycle)
        if len(out) > limit:
            return None
    return out


@dataclass
class IlpResult:
    dag: TermDag
    cost: int
    optimal: bool
    seconds: float
    variables: int


def extract_ilp(problem: Problem, time_limit_s: float = 60.0) -> IlpResult:
    """The least-cost DAG for the outputs, proven optimal unless the time limit ran out.

    Raises :class:`RewriteError` if the solver finds no feasible choice in time.
    """
    t0 = time.perf_counter()
    n_nodes = len(problem.node_ids)
    rows: list[np.ndarray] = []  # constraint matrix in triplets, built a block at a time
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    n_rows = 0

    def block(r, c, v, lower, upper) -> None:
        nonlocal n_rows
        rows.append(np.asarray(r) + n_rows)
        cols.append(np.asarray(c))
        vals.append(np.asarray(v, dtype=float))
        lo.append(np.asarray(lower, dtype=float))
        hi.append(np.asarray(upper, dtype=float))
        n_rows += len(lower)

    # the root class has one chosen e-node; every other class at most one
    multi = [m for i, m in enumerate(problem.class_nodes) if len(m) > 1 or i == problem.root]
    r = np.repeat(np.arange(len(multi)), [len(m) for m in multi])
    is_root = np.array([i == problem.root for i, m in enumerate(problem.class_nodes)
                        if len(m) > 1 or i == problem.root])
    block(r, np.concatenate(multi), np.ones(len(r)), np.where(is_root, 1.0, -np.inf), np.ones(len(multi)))
    # a chosen e-node's child classes have a chosen e-node: x_j - sum_{m in k} x_m <= 0, where the sum
    # leaves out the e-nodes m of k that have j's class as a child (choosing both would be a cycle:
    # a valid cut that keeps the LP relaxation from supporting two classes by each other, as views
    # of each other, for free)
    edges = [(j, k) for j, kids in enumerate(problem.node_children) for k in kids]
    kids_of = [set(kids) for kids in problem.node_children]
    c: list[int] = []
    v: list[float] = []
    r_list: list[int] = []
    for e_i, (j, k) in enumerate(edges):
        u = int(problem.node_class[j])
        support = [m for m in problem.class_nodes[k] if u not in kids_of[m]]
        c.append(j)
        c.extend(support)
        v.append(1.0)
        v.extend([-1.0] * len(support))
        r_list.extend([e_i] * (len(support) + 1))
    block(np.array(r_list, dtype=np.int64), np.array(c, dtype=np.int64), v, np.full(len(edges), -np.inf),
          np.zeros(len(edges)))

    # no cyclic choice: on each strongly connected part of the class graph, either one constraint per
    # simple cycle (the e-nodes realising its edges are not all chosen: tight, so the LP relaxation
    # cannot run a cycle of free views fractionally), or, where a part has too many cycles, an order
    # t per class with x_j -> t_u >= t_v + 1 (big-M)
    realise: dict[tuple[int, int], list[int]] = {}
    for j, k in edges:
        realise.setdefault((int(problem.node_class[j]), k), []).append(j)
    class_graph = nx.DiGraph(list(realise))
    cyclic = [s for s in nx.strongly_connected_components(class_graph)
              if len(s) > 1 or class_graph.has_edge(next(iter(s)), next(iter(s)))]
    order: dict[int, int] = {}
    limits: list[float] = []
    for part in cyclic:
        # a class of the part that is computed leads, through chosen e-nodes inside the part, to one
        # computed by an e-node with no child in the part: sum_{m in X} x_m <= sum of those e-nodes
        exits = [m for y in part for m in problem.class_nodes[y] if not kids_of[m] & part]
        for y in part:
            inside = problem.class_nodes[y]
            block(np.zeros(len(inside) + len(exits), dtype=np.int64), [*inside, *exits],
                  [*([1.0] * len(inside)), *([-1.0] * len(exits))], [-np.inf], [0.0])
        cycles = _simple_cycles(class_graph.subgraph(part), MAX_CYCLES_PER_PART)
        if cycles is not None:
            for cycle in cycles:
                steps = list(zip(cycle, cycle[1:] + cycle[:1], strict=True))
                nodes = [j for step in steps for j in realise[step]]
                block(np.zeros(len(nodes), dtype=np.int64), nodes, np.ones(len(nodes)), [-np.inf], [len(steps) - 1])
            continue
        for c in part:
            order[c] = n_nodes + len(order)
            limits.append(len(part) + 1.0)
        big = len(part) + 1
        for (u, v_), nodes in realise.items():
            if u in part and v_ in part:
                for j in nodes:
                    if u == v_:  # a self-loop e-node can never be chosen
                        block([0], [j], [1.0], [0.0], [0.0])
                    else:
                        block([0, 0, 0], [order[u], order[v_], j], [1.0, -1.0, -float(big)], [1 - big], [np.inf])
    limits = np.array(limits, dtype=float)

    nvar = n_nodes + len(order)
    a = coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_rows, nvar)).tocsr()
    lo, hi = np.concatenate(lo), np.concatenate(hi)
    integrality = np.r_[np.ones(n_nodes), np.zeros(len(order))]
    usable = np.zeros(n_nodes)  # e-nodes pruned as dominated (problem.class_nodes) stay at 0
    usable[np.concatenate([np.asarray(m, dtype=np.int64) for m in problem.class_nodes])] = 1.0
    bounds = Bounds(np.zeros(nvar), np.r_[usable, limits])
    res = milp(np.r_[problem.cost, np.zeros(len(order))], constraints=LinearConstraint(a, lo, hi),
               integrality=integrality, bounds=bounds, options={"time_limit": time_limit_s})
    if res.x is None:
        raise RewriteError(f"ILP extraction found no solution ({res.message})")
    choice = {int(problem.node_class[j]): int(j) for j in np.flatnonzero(res.x[:n_nodes] > 0.5)}
    dag = problem.term(choice)
    return IlpResult(dag, dag.cost, res.status == 0, time.perf_counter() - t0, nvar)
