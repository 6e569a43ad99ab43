"""Greedy DAG extraction, vectorised: each e-class keeps the cost of the sub-DAG below its
best e-node as a vector over e-classes, so a sub-term shared by two children is paid once.

This is the "faster greedy DAG" extractor of extraction-gym (egraphs-good/extraction-gym):
an e-node's cost is its own cost plus the union of its children's chosen sub-DAGs. The
union of two sub-DAGs is an elementwise maximum of their vectors (an e-class's entry is
the own cost of the e-node chosen for it, the same wherever it appears), and the total is
the vector's sum. Per e-node evaluation that is O(e-classes) in numpy; egglog's Rust
greedy-DAG extractor with a Python cost adds Python numbers per set element and took
6 s on a 30-layer training e-graph that this one extracts in about 0.1 s.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..ir import RewriteError
from .problem import Problem

#: The entry of a free e-node (cost 0): non-zero, so a sub-DAG still shows it contains the e-class.
_PRESENT = 1e-3


def extract_greedy_dag(problem: Problem) -> dict[int, int]:
    """One e-node per e-class reachable from the root (class index -> e-node index).

    Raises :class:`RewriteError` if the root has no acyclic term.
    """
    n_classes = len(problem.classes)
    parents: list[list[int]] = [[] for _ in range(n_classes)]
    for j, kids in enumerate(problem.node_children):
        for c in kids:
            parents[c].append(j)
    best = np.full(n_classes, np.inf)
    choice: dict[int, int] = {}
    vectors: dict[int, np.ndarray] = {}
    queue = deque(j for j, kids in enumerate(problem.node_children) if not kids)
    queued = set(queue)
    while queue:
        j = queue.popleft()
        queued.discard(j)
        c = int(problem.node_class[j])
        kids = problem.node_children[j]
        if any(k not in vectors for k in kids):
            continue
        if kids:
            vec = vectors[kids[0]].copy()
            for k in kids[1:]:
                np.maximum(vec, vectors[k], out=vec)
            if vec[c] > 0:
                continue  # the e-class is inside its own sub-DAG: a cycle through this e-node
        else:
            vec = np.zeros(n_classes, dtype=np.float32)
        vec[c] = max(problem.cost[j], _PRESENT)
        total = float(vec.sum(dtype=np.float64))
        if not np.isfinite(best[c]) or total < best[c] * (1 - 1e-6):
            best[c], choice[c], vectors[c] = total, j, vec
            for p in parents[c]:
                if p not in queued:
                    queue.append(p)
                    queued.add(p)
    if problem.root not in choice:
        raise RewriteError("greedy extraction found no acyclic term for the outputs")
    return choice
