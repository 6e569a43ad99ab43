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

Two exact reductions make the program small and its LP relaxation tight (SmolLM2's prefill:
a 1.6 % gap left after 20 s without them, proven optimal in under 1 s with them):

- **Free views collapsed.** e-classes that are free views of each other (a strongly connected
  set of zero-cost one-child e-nodes, such as ``Identity`` between the [1,S,H] and [S,H] forms
  of one tensor) are one value: the program has one class for them, whose candidates are
  their members' other e-nodes, and the chosen one's class is reached from the others through
  the views afterwards (:func:`collapse_views`). Without this, the relaxation runs a third of
  each of three views' computations around the cycle and pays a third.
- **Mandatory classes.** A class that every choice computes (:func:`mandatory`: needed by
  every e-node of a class that is itself needed, a greatest fixpoint) has exactly one chosen
  e-node, an equality the relaxation otherwise misses: alternatives that reach one input by
  different paths split its demand, a factor at every layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

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


def collapse_views(problem: Problem) -> tuple[Problem, Callable[[dict[int, int]], dict[int, int]]]:
    """``problem`` with the e-classes that are free views of each other merged, and the map of a
    choice for it (merged class -> e-node) back to a choice for ``problem``.

    A view edge is an e-node of cost 0 with one child class; a strongly connected set of classes
    under those edges is one merged class. Its candidates are its members' e-nodes other than
    the views among them; an e-node reading its own merged class is dropped (computing a value
    from a view of itself is a cycle). The map back gives the chosen e-node's class that e-node
    and every other member the view leading towards it. Exact: views cost nothing, and of the
    members' computations in any acyclic choice, one whose inputs need no other member exists.
    """
    views = [j for m in problem.class_nodes for j in m
             if problem.cost[j] == 0 and len(problem.node_children[j]) == 1]
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(problem.class_nodes)))
    graph.add_edges_from((int(problem.node_class[j]), problem.node_children[j][0]) for j in views)
    parts = [sorted(s) for s in nx.strongly_connected_components(graph)]
    if all(len(s) == 1 for s in parts):
        return problem, dict
    part = np.empty(len(problem.class_nodes), dtype=np.int64)
    for i, s in enumerate(parts):
        part[s] = i
    class_nodes: list[list[int]] = [[] for _ in parts]
    children: list[list[int]] = [[] for _ in problem.node_ids]
    for members in problem.class_nodes:
        for j in members:
            c = int(part[problem.node_class[j]])
            kids = sorted({int(part[k]) for k in problem.node_children[j]})
            if c not in kids:
                children[j] = kids
                class_nodes[c].append(j)
    toward: dict[int, list[tuple[int, int]]] = {}  # class -> (member with a view of it, that view)
    for j in views:
        u, w = int(problem.node_class[j]), problem.node_children[j][0]
        if part[u] == part[w] and u != w:
            toward.setdefault(w, []).append((u, j))
    merged = replace(problem, classes=[problem.classes[s[0]] for s in parts], class_nodes=class_nodes,
                     node_class=part[problem.node_class], node_children=children, root=int(part[problem.root]))

    def expand(choice: dict[int, int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for j in choice.values():
            home = int(problem.node_class[j])
            out[home] = j
            frontier = [home]
            while frontier:  # breadth first from the computed member, against the view edges
                reached = []
                for w in frontier:
                    for u, v in toward.get(w, ()):
                        if u not in out:
                            out[u] = v
                            reached.append(u)
                frontier = reached
        return out

    return merged, expand


def mandatory(problem: Problem) -> list[int]:
    """The classes every choice computes: the root, and what every e-node of a mandatory class
    needs, directly or below (the greatest fixpoint of need(c) = the intersection over c's
    e-nodes of their children and what those need; sound by induction over an acyclic choice's
    depth). Bit sets as Python integers; classes visited children first, so few passes settle it."""
    def kids(c: int) -> Iterator[int]:
        return iter(sorted({k for j in problem.class_nodes[c] for k in problem.node_children[j]}))

    order: list[int] = []
    seen = {problem.root}
    stack = [(problem.root, kids(problem.root))]
    while stack:  # depth-first postorder from the root
        c, todo = stack[-1]
        k = next(todo, None)
        if k is None:
            order.append(c)
            stack.pop()
        elif k not in seen:
            seen.add(k)
            stack.append((k, kids(k)))
    everything = (1 << len(problem.class_nodes)) - 1
    need = dict.fromkeys(order, everything)
    changed = True
    while changed:
        changed = False
        for c in order:
            acc = everything
            for j in problem.class_nodes[c]:
                got = 0
                for k in problem.node_children[j]:
                    got |= (1 << k) | need[k]
                acc &= got
            acc &= ~(1 << c)
            if acc != need[c]:
                need[c], changed = acc, True
    bits = need[problem.root] | (1 << problem.root)
    return [c for c in order if bits >> c & 1]


@dataclass
class IlpResult:
    dag: TermDag
    cost: float
    optimal: bool
    seconds: float
    variables: int


def extract_ilp(problem: Problem, time_limit_s: float = 60.0) -> IlpResult:
    """The least-cost DAG for the outputs, proven optimal unless the time limit ran out
    (``time_limit_s``, seconds; ``IlpResult.optimal`` says which). The program is built on
    the problem with free views collapsed and mandatory classes fixed (module docstring);
    ``IlpResult.variables`` counts its variables.

    Raises :class:`RewriteError` if the solver finds no feasible choice in time.
    """
    t0 = time.perf_counter()
    choice, optimal, variables = ilp_choice(problem, time_limit_s)
    dag = problem.term(choice)
    return IlpResult(dag, dag.cost, optimal, time.perf_counter() - t0, variables)


def ilp_choice(problem: Problem, time_limit_s: float = 60.0, *,
               reductions: bool = True) -> tuple[dict[int, int], bool, int]:
    """The integer program's choice for ``problem`` (class index -> e-node index, classes the
    outputs reach among them), whether it is proven optimal, and the program's variable count.
    ``reductions=False`` leaves out the two reductions of the module docstring (the same
    optimum, slower: for comparing formulations). Raises :class:`RewriteError` as
    :func:`extract_ilp`."""
    problem, expand = collapse_views(problem) if reductions else (problem, dict)
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

    # a mandatory class (the root's among them) has one chosen e-node; every other class at most one
    must = set(mandatory(problem)) if reductions else {problem.root}
    rowed = [i for i, m in enumerate(problem.class_nodes) if len(m) > 1 or i in must]
    multi = [problem.class_nodes[i] for i in rowed]
    r = np.repeat(np.arange(len(multi)), [len(m) for m in multi])
    block(r, np.concatenate(multi), np.ones(len(r)), [1.0 if i in must else -np.inf for i in rowed],
          np.ones(len(multi)))
    # a chosen e-node's child classes have a chosen e-node, aggregated per class: for class u and a
    # child class k, sum_{j in u with child k} x_j - sum_{m in k} x_m <= 0 (valid as u has at most one
    # chosen e-node; stronger than a row per e-node where several e-nodes of u read k), where the
    # second sum leaves out the e-nodes m of k that have u as a child (choosing both would be a
    # cycle: a valid cut that keeps the LP relaxation from supporting two classes by each other)
    kids_of = [set(kids) for kids in problem.node_children]
    realise: dict[tuple[int, int], list[int]] = {}  # (class, child class) -> the e-nodes realising it
    for members in problem.class_nodes:
        for j in members:
            for k in problem.node_children[j]:
                realise.setdefault((int(problem.node_class[j]), k), []).append(j)
    c: list[int] = []
    v: list[float] = []
    r_list: list[int] = []
    for e_i, ((u, k), readers) in enumerate(realise.items()):
        support = [m for m in problem.class_nodes[k] if u not in kids_of[m]]
        c.extend(readers)
        c.extend(support)
        v.extend([1.0] * len(readers))
        v.extend([-1.0] * len(support))
        r_list.extend([e_i] * (len(readers) + len(support)))
    block(np.array(r_list, dtype=np.int64), np.array(c, dtype=np.int64), v, np.full(len(realise), -np.inf),
          np.zeros(len(realise)))

    # no cyclic choice: on each strongly connected part of the class graph, either one constraint per
    # simple cycle (the e-nodes realising its edges are not all chosen: tight, so the LP relaxation
    # cannot run a cycle of free views fractionally), or, where a part has too many cycles, an order
    # t per class with x_j -> t_u >= t_v + 1 (big-M)
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
               integrality=integrality, bounds=bounds,
               # optimal means optimal: HiGHS's default relative gap (1e-4) stops at a solution within 0.01% of the
               # bound, which under a cost model with a large constant part (1000 + FLOPs a kernel) left whole
               # dispatches unfused while reporting the result optimal
               options={"time_limit": time_limit_s, "mip_rel_gap": 0.0})
    if res.x is None:
        raise RewriteError(f"ILP extraction found no solution ({res.message})")
    choice = {int(problem.node_class[j]): int(j) for j in np.flatnonzero(res.x[:n_nodes] > 0.5)}
    return expand(choice), res.status == 0, nvar
