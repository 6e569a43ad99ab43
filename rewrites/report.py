"""What an optimisation did: :class:`Report` and its :class:`Phase` entries.

Plain data without egglog, so that a report stored with a compiled graph (``eggfuse.cache``)
loads without the rewrite engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..ir.ops.fused_epilogue import step_label


def cost_text(value: float) -> str:
    """A cost as reports print it: ``4,195,020`` (a cost model's whole units), ``112,340.3`` (a fraction of
    1,000 or more: one decimal), ``12.35`` (below 1,000: 4 significant digits), ``4.326e+36`` (from 1e15)."""
    value = float(value)  # (a number read back from a CSV file is text)
    if abs(value) >= 1e15:  # beyond float64's whole digits: 4.326e+36, not 37 digits of which 21 are noise
        return f"{value:.4g}"
    if value.is_integer():
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:,.4g}"


@dataclass
class Phase:
    """One phase of an optimisation: wall-clock seconds and the e-graph's size after it."""

    seconds: float
    eclasses: int
    enodes: int


@dataclass
class Report:
    """What one optimisation did. Times in seconds, sizes in e-classes / e-nodes / graph nodes,
    costs in the cost model's unit (byte-equivalents for :class:`CostModel`).

    ``phases`` holds insertion, analysis (the shape analysis, summed over iterations),
    saturation (the optimisation rulesets), extraction and rebuild; ``total_s`` is their
    sum, the wall clock of the whole optimisation. ``rules_fired`` counts matches per rule
    over all iterations (a rule can match a term again after a merge changes its children).

    ``ilp_cost`` and ``greedy_cost`` are the costs of the graphs the ILP and the greedy extractor give (rebuilt
    and priced as ``cost_after`` is; None for one that did not run), ``ilp_objective`` and
    ``greedy_objective`` their extraction problem's objective: it prices a tensor that two generated
    elementwise regions read once, where their kernels read it once each, and prices a region op by op,
    so it can differ from the graph's cost (mostly below it). ``ilp_optimal``: the ILP's objective is optimal
    (HiGHS proved it within the time limit). The cheapest graph is kept (``extractor`` names which), or the
    input graph where each costs more.
    """

    rules_fired: dict[str, int] = field(default_factory=dict)
    phases: dict[str, Phase] = field(default_factory=dict)
    iterations: int = 0
    saturated: bool = False
    stop_reason: str = ""
    eclasses: int = 0
    enodes: int = 0
    insert_s: float = 0.0
    analysis_s: float = 0.0
    saturation_s: float = 0.0
    extraction_s: float = 0.0
    rebuild_s: float = 0.0
    total_s: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    dispatches_before: int = 0
    dispatches_after: int = 0
    cost_before: float = 0
    cost_after: float = 0
    bytes_before: int = 0
    bytes_after: int = 0
    extractor: str = ""
    greedy_cost: float | None = None
    ilp_cost: float | None = None
    greedy_objective: float | None = None
    ilp_objective: float | None = None
    ilp_optimal: bool | None = None
    ilp_s: float | None = None
    #: with ``optimize(..., payoff=True)``: per rule and per ruleset, what it pays
    #: (:class:`~.payoff.Payoff` as dicts: name, ruleset, matches, extracted_enodes, saved_*)
    rules: list[dict] | None = None
    rulesets: list[dict] | None = None
    #: with ``payoff=True``: per op that two or more fired rules build (their right-hand sides' head, through
    #: views), those rules removed together (``name``: ``rules building <op>``, ``rules``: their names, and the
    #: Payoff numbers)
    rule_groups: list[dict] | None = None
    #: with ``verify=True``: the largest |difference| of the outputs on the float64 reference (random inputs;
    #: NaN where no element is finite in both); None otherwise (a cached report keeps None)
    verified_max_diff: float | None = None
    #: the fused and recognised ops of the extracted graph and what each replaced: label (the op,
    #: a fused matmul with its epilogue steps) -> one list per occurrence of the input graph's
    #: node ids it computes in their place (:func:`replaced_nodes`)
    recognised: dict[str, list[list[int]]] = field(default_factory=dict)
    #: node id of the extracted graph -> the input graph's node ids it computes, sorted (:func:`node_origins`;
    #: with the input graph kept, each node's own id): how an error about a node of the optimised graph
    #: (``LoweringError.sources``) names the nodes a user wrote
    origins: dict[int, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Every field; ``rules``, ``rulesets`` and ``rule_groups`` only when computed."""
        out = asdict(self)
        for key in ("rules", "rulesets", "rule_groups"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        """The report :meth:`to_dict` gave. Raises TypeError or ValueError for anything else."""
        if not isinstance(d, dict) or set(d) - {f.name for f in fields(cls)}:
            raise ValueError(f"not a Report's fields: {sorted(d) if isinstance(d, dict) else type(d).__name__}")
        phases = d.get("phases", {})
        if not isinstance(phases, dict):
            raise ValueError("a Report's phases must be a dict")
        origins = d.get("origins", {})
        if not isinstance(origins, dict):
            raise ValueError("a Report's origins must be a dict")
        return cls(**{**d, "phases": {str(k): Phase(**v) for k, v in phases.items()},
                      "origins": {int(k): [int(i) for i in v] for k, v in origins.items()}})

    def recognised_line(self, origin: Mapping[int, str] | None = None) -> str:
        """The recognised ops as text, e.g. ``LayerNorm x13 from 117 nodes``; with ``origin``
        (input graph node id -> the name of the node it came from, e.g. an ONNX node) the
        nodes are counted by their distinct names (``from 117 ONNX nodes``)."""
        parts = []
        for label, cones in sorted(self.recognised.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            if origin is None:
                n, unit = sum(len(c) for c in cones), "nodes"
            else:
                n, unit = len({origin.get(i, f"%{i}") for c in cones for i in c}), "ONNX nodes"
            parts.append(f"{label} x{len(cones)} from {n} {unit}")
        return ", ".join(parts) or "none"

    def summary(self, origin: Mapping[int, str] | None = None) -> str:
        """The report as text; ``origin`` as for :meth:`recognised_line`."""
        fired = "\n".join(f"  {v:5d}  {k}" for k, v in sorted(self.rules_fired.items(), key=lambda kv: (-kv[1], kv[0])))
        phases = "\n".join(f"  {name:<10} {p.seconds:7.3f}s  {p.eclasses:6d} e-classes  {p.enodes:6d} e-nodes"
                           for name, p in self.phases.items())
        gap = ""
        if self.ilp_cost is not None and self.greedy_cost is not None:
            # (the objective prices generated regions its own way: a tensor two regions read once, say)
            objective = (f"; the extraction problem's objective {cost_text(self.ilp_objective)}"
                         if self.ilp_objective is not None and self.ilp_objective != self.ilp_cost else "")
            gap = (f", greedy {cost_text(self.greedy_cost)} vs ILP {cost_text(self.ilp_cost)}"
                   f"{' (optimal' + objective + ')' if self.ilp_optimal else ''}")
        text = (
            f"nodes {self.nodes_before} -> {self.nodes_after}, dispatches {self.dispatches_before} -> "
            f"{self.dispatches_after}, cost {cost_text(self.cost_before)} -> {cost_text(self.cost_after)}\n"
            f"schedule: {self.iterations} iteration{'' if self.iterations == 1 else 's'} ({self.stop_reason}); "
            f"extractor {self.extractor}{gap}\n"
            f"phases (total {self.total_s:.3f}s; a caller's optimize_s also counts loading egglog and declaring "
            f"the rulesets, once a process):\n{phases}\n"
            f"rules fired (matches):\n{fired or '  none'}\n"
            f"recognised and fused ops: {self.recognised_line(origin)}"
        )
        if self.verified_max_diff is not None and not math.isnan(self.verified_max_diff):
            text += (f"\nverified: the optimised graph's outputs on the numpy reference (float64, random inputs) are "
                     f"within {self.verified_max_diff:.3g} of the input graph's")
        elif self.verified_max_diff is not None:
            text += ("\nverified: no output element is finite in both graphs on the numpy reference (random inputs); "
                     "their NaN and infinite elements agree")
        if self.rules is not None:
            from .payoff import payoff_table

            text += "\n" + payoff_table(self)
        return text


def replaced_nodes(graph: Any, dag: Any, class_of: Mapping[int, str]) -> dict[str, list[list[int]]]:
    """What each fused or recognised op of an extracted DAG computes in place of nodes of the
    input ``graph``: :attr:`Report.recognised`.

    ``class_of`` maps an input graph node id to its e-class, ``dag`` is the extracted
    :class:`~.extract.TermDag`. An entry of ``dag`` counts when its e-class holds input nodes
    of other ops (or, for the input of a reshape view, the view's e-class does: an exporter's
    matmul reads a view of a 2-D product). Its nodes are those of its e-class and, through
    their inputs, every input node whose e-class the extracted graph does not compute (a
    node that several ops replaced is listed for the first, in the DAG's order); leaves and
    views are not counted, nor an op that replaced one node.
    """
    from ..ir import OPS

    entries, roots, _, computed = _roots(graph, dag, class_of)
    out: dict[str, list[list[int]]] = {}
    claimed: set[int] = set()
    for j in sorted(roots):
        op, attrs, _ = entries[j]
        spec = OPS[op]
        if spec.view or spec.leaf or all(graph.node(n).op == op for n in roots[j]):
            continue
        cone = _walk(graph, roots[j], class_of, computed)[0]
        if len(cone) >= 2:
            if spec.expr_attr is not None:  # a generated kernel: named by its ops, a one-op region by the op
                ops = [s[0] for s in attrs[spec.expr_attr.name] if s[0] not in ("input", "const")]
                label = ops[0] if len(ops) == 1 else f"{op}({', '.join(ops)})"
            else:
                steps = attrs.get(spec.epilogue_attr.name) if spec.epilogue_attr else None
                label = f"{op}({', '.join(map(step_label, steps))})" if steps else op
            out.setdefault(label, []).append(sorted(n for n in cone if n not in claimed))
            claimed.update(cone)
    return out


def _roots(graph: Any, dag: Any, class_of: Mapping[int, str]) -> tuple[list, dict[int, list[int]],
                                                                      dict[str, list[int]], set[str]]:
    # (the DAG's tensor e-nodes, None for the others; entry -> the input graph's non-leaf nodes of its e-class, a
    # view's counted for the new term it views; e-class -> its input graph nodes; the e-classes the DAG computes)
    from ..ir import OPS
    from .extract import dag_enode
    from .sorts import SIGNATURES

    members: dict[str, list[int]] = {}
    for nid, c in class_of.items():
        members.setdefault(c, []).append(nid)
    # tensor e-nodes only: lists and epilogue chains are structure, Ex terms the inside of a Fused kernel
    entries = [dag_enode(dag, j) if dag.nodes[j][0] in SIGNATURES else None for j in range(len(dag.nodes))]
    roots: dict[int, list[int]] = {}
    for j, entry in enumerate(entries):
        if entry is None:
            continue
        own = [n for n in members.get(dag.eclasses[j], ()) if not OPS[graph.node(n).op].leaf]
        if OPS[entry[0]].view and entry[2] and not members.get(dag.eclasses[entry[2][0]]):
            k = entry[2][0]  # a view of a new term (through views of it: a Reshape of a Select): the term replaced them
            while (entries[k] is not None and OPS[entries[k][0]].view and entries[k][2]
                   and not members.get(dag.eclasses[entries[k][2][0]])):
                k = entries[k][2][0]
            roots.setdefault(k, []).extend(own)
        elif own:
            roots.setdefault(j, []).extend(own)
    return entries, roots, members, set(dag.eclasses)


def _walk(graph: Any, start: list[int], class_of: Mapping[int, str], computed: set[str],
          stop: set[int] | frozenset = frozenset()) -> tuple[list[int], set[int]]:
    # (the nodes of ``start`` and, through their inputs, every input node whose e-class is not computed, leaves,
    # views and ``stop`` left out; every node visited, views included)
    from ..ir import OPS

    cone, seen, stack = [], set(), list(start)
    while stack:
        n = stack.pop()
        node = graph.node(n)
        if n in seen or n in stop or OPS[node.op].leaf:
            continue
        seen.add(n)
        if not OPS[node.op].view:
            cone.append(n)
        stack.extend(i for i in node.inputs if class_of.get(i) not in computed or class_of.get(i) == class_of[n])
    return cone, seen


def _view_aliases(raw: Mapping[str, Any], class_of: Mapping[int, str], computed: set[str]) -> dict[str, str]:
    # e-class of input nodes the DAG does not compute -> the computed e-class it is a view of (an e-node of it is a
    # view op of that class: a residual sum an exporter writes in 3-D, computed in 2-D by a fused product's epilogue)
    from ..ir import OPS
    from .sorts import SIGNATURES

    nodes, data = raw["nodes"], raw["class_data"]
    wanted = set(class_of.values()) - computed
    alias: dict[str, str] = {}
    for node in nodes.values():
        c = node["eclass"]
        sig = SIGNATURES.get(node["op"])
        if c not in wanted or c in alias or sig is None or not OPS[sig.op].view:
            continue
        kids = [nodes[k]["eclass"] for k in node["children"] if data.get(nodes[k]["eclass"], {}).get("type") == "T"]
        if len(kids) == 1 and kids[0] in computed:
            alias[c] = kids[0]
    return alias


def node_origins(graph: Any, dag: Any, class_of: Mapping[int, str], made: Mapping[int, int],
                 out: Any, raw: Mapping[str, Any] | None = None) -> dict[int, list[int]]:
    """:attr:`Report.origins`: for each node of the extracted graph ``out`` (``made``: node id -> the DAG entry it
    was built for, as :func:`~.extract.rebuild` fills it) the input ``graph``'s node ids it computes, sorted.

    A node's ids are those of its e-class and, through their inputs, the input nodes whose e-classes the
    extracted graph does not compute (what a fused or recognised op replaced), each given to one node only: the
    first, in ``out``'s order, whose e-class or inputs reach it (so an input node that no e-class of ``out``
    holds goes to the first op that reads it, not to every later layer). With ``raw`` (egglog's serialisation
    of the saturated e-graph), an input node whose e-class is not computed but holds a view of a computed one (a
    residual sum the exporter writes in 3-D, computed in 2-D by a fused product's epilogue) counts as that
    e-class's. A view of a new term (a ``Select`` of a pair) has the
    input nodes of its own e-class too. A node that computes no input node (a packed product, a new term nothing
    of the input graph equals) has the ids of its first reader that has some: what the nodes reading it compute.
    Leaves and views of the input graph are not listed; leaves of ``out`` have none."""
    from ..ir import OPS

    if raw is not None:
        alias = _view_aliases(raw, class_of, set(dag.eclasses))
        class_of = {n: alias.get(c, c) for n, c in class_of.items()}
    entries, roots, members, computed = _roots(graph, dag, class_of)
    claimed: set[int] = set()
    own: dict[int, list[int]] = {}
    for nid in sorted(made):  # producers first
        j = made[nid]
        if j in own or j not in roots or OPS[entries[j][0]].leaf:
            continue
        own[j], seen = _walk(graph, roots[j], class_of, computed, claimed)
        claimed |= seen
    origins: dict[int, list[int]] = {}
    for nid, j in made.items():
        entry = entries[j]
        if entry is None or OPS[entry[0]].leaf:
            continue
        ids = set(own.get(j, ()))
        if OPS[entry[0]].view:
            ids.update(n for n in members.get(dag.eclasses[j], ()) if not OPS[graph.node(n).op].leaf
                       and not OPS[graph.node(n).op].view)
        if ids:
            origins[nid] = sorted(ids)
    readers: dict[int, list[int]] = {}
    for node in out.nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node.id)
    for node in reversed(out.nodes):  # readers before what they read
        if node.id not in origins and not OPS[node.op].leaf:
            first = next((r for r in sorted(readers.get(node.id, ())) if r in origins), None)
            if first is not None:
                origins[node.id] = _computed_from(graph, node, out, origins, origins[first])
    return origins


#: Families of the products: where a walk forward from a new product's inputs stops (what reads a product's
#: value is not computed by it).
_PRODUCTS = ("matmul", "linalg", "conv", "matmul_rows")
#: Families of elementwise ops: all that an elementwise kernel (``Fused``) can compute.
_ELEMENTWISE = ("arithmetic", "elementwise", "unary", "fused")


def _computed_from(graph: Any, node: Any, out: Any, origins: Mapping[int, list[int]], reader: list[int]) -> list[int]:
    # Of ``reader`` (the ids its reader computes), those that ``node`` of ``out`` computes: reached from what its
    # inputs compute through the input graph (views passed through), a product's readers left out when ``node`` is
    # a product (a packed Q/K/V product: the norm and the three projections, not the attention's mask or softmax)
    # and only elementwise ops for an elementwise kernel; ``reader`` itself where nothing is reached
    from ..ir import OPS

    def source(g: Any, i: int) -> int:  # behind views
        while OPS[g.node(i).op].view and g.node(i).inputs:
            i = g.node(i).inputs[0]
        return i

    given = {i for x in node.inputs for i in origins.get(source(out, x), ())}
    wanted, got = set(reader), set()
    product, region = OPS[node.op].family in _PRODUCTS, OPS[node.op].family == "fused"
    if region:  # a region computes elementwise ops only, of its inputs and of leaves (a mask input, constants)
        wanted = {n for n in wanted if OPS[graph.node(n).op].family in _ELEMENTWISE}

    for n in sorted(wanted):  # the input graph's order: inputs first
        for i in graph.node(n).inputs:
            s = source(graph, i)
            if (s in given or (region and OPS[graph.node(s).op].leaf)
                    or (s in got and not (product and OPS[graph.node(s).op].family in _PRODUCTS))):
                got.add(n)
                break
    return sorted(got) or list(reader)


def input_classes(raw: Mapping[str, Any]) -> dict[int, str]:
    """Input graph node id -> its e-class, from egglog's serialisation (the encoding's ``$n<id>`` lets)."""
    out = {}
    for c, d in raw["class_data"].items():
        for let in (d.get("let") or "").split(", "):
            if let.startswith("$n") and let[2:].isdigit():
                out[int(let[2:])] = c
    return out


__all__ = ["Phase", "Report", "input_classes", "node_origins", "replaced_nodes"]
