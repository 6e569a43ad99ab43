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

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from ..ir import RewriteError
from .extract import TermDag
from .problem import Problem


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
    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(coeffs: dict[int, float], lower: float, upper: float) -> None:
        r = len(lo)
        for j, v in coeffs.items():
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    constraint({j: 1.0 for j in problem.class_nodes[problem.root]}, 1, 1)
    for members in problem.class_nodes:
        if len(members) > 1:
            constraint({j: 1.0 for j in members}, -np.inf, 1)
    class_graph = nx.DiGraph()
    for j, kids in enumerate(problem.node_children):
        c = int(problem.node_class[j])
        for k in kids:
            coeffs = {m: -1.0 for m in problem.class_nodes[k]}
            coeffs[j] = coeffs.get(j, 0.0) + 1.0
            constraint(coeffs, -np.inf, 0)
            class_graph.add_edge(c, k, node=j)

    # order variables only where the class graph has cycles
    cyclic = [s for s in nx.strongly_connected_components(class_graph)
              if len(s) > 1 or any(class_graph.has_edge(c, c) for c in s)]
    order = {c: n_nodes + i for i, c in enumerate(c for s in cyclic for c in s)}
    big = len(order) + 1
    for u, v, d in class_graph.edges(data=True):
        if u in order and v in order:
            if u == v:  # a self-loop e-node can never be chosen
                constraint({d["node"]: 1.0}, 0, 0)
            else:  # x_n -> t_u >= t_v + 1
                constraint({order[u]: 1.0, order[v]: -1.0, d["node"]: -float(big)}, 1 - big, np.inf)

    nvar = n_nodes + len(order)
    a = coo_array((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
    integrality = np.r_[np.ones(n_nodes), np.zeros(len(order))]
    bounds = Bounds(np.zeros(nvar), np.r_[np.ones(n_nodes), np.full(len(order), float(big))])
    res = milp(np.r_[problem.cost, np.zeros(len(order))], constraints=LinearConstraint(a, lo, hi),
               integrality=integrality, bounds=bounds, options={"time_limit": time_limit_s})
    if res.x is None:
        raise RewriteError(f"ILP extraction found no solution ({res.message})")
    choice = {int(problem.node_class[j]): int(j) for j in np.flatnonzero(res.x[:n_nodes] > 0.5)}
    dag = problem.term(choice)
    return IlpResult(dag, dag.cost, res.status == 0, time.perf_counter() - t0, nvar)
