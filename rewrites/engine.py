"""The rewrite engine: encode, saturate (analysis, then optimisation, to a fixpoint), extract, rebuild."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from egglog import EGraph, Ruleset

from ..ir import DType, Graph, RewriteError, evaluate
from .algebraic import algebraic_ruleset
from .analysis import shape_analysis_ruleset
from .attention import attention_ruleset
from .cost import CostModel
from .encode import encode
from .extract import extract_greedy, rebuild
from .ilp import extract_ilp
from .matmul_epilogue import matmul_epilogue_ruleset
from .norms import norm_fusion_ruleset
from .sorts import Epi, T, TList, numel, shape
from .swiglu import swiglu_ruleset

#: The optimisation rulesets run by default, in schedule order.
OPTIMIZATION_RULESETS: tuple[Ruleset, ...] = (
    algebraic_ruleset, swiglu_ruleset, matmul_epilogue_ruleset, norm_fusion_ruleset, attention_ruleset)


@dataclass
class Report:
    """What one optimisation did. Times in seconds, sizes in e-classes / e-nodes / graph nodes."""

    rules_fired: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    saturated: bool = False
    stop_reason: str = ""
    eclasses: int = 0
    enodes: int = 0
    enodes_inserted: int = 0
    insert_s: float = 0.0
    saturation_s: float = 0.0
    extraction_s: float = 0.0
    rebuild_s: float = 0.0
    total_s: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    dispatches_before: int = 0
    dispatches_after: int = 0
    cost_before: int = 0
    cost_after: int = 0
    extracted_cost: int = 0
    extractor: str = ""
    greedy_cost: int | None = None
    ilp_cost: int | None = None
    ilp_optimal: bool | None = None
    ilp_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        fired = ", ".join(f"{k} x{v}" for k, v in sorted(self.rules_fired.items(), key=lambda kv: -kv[1]))
        return (
            f"nodes {self.nodes_before} -> {self.nodes_after}, dispatches {self.dispatches_before} -> "
            f"{self.dispatches_after}, cost {self.cost_before:,} -> {self.cost_after:,} byte-equivalents\n"
            f"e-graph: {self.enodes_inserted} e-nodes inserted, {self.enodes} e-nodes / {self.eclasses} "
            f"e-classes after {self.iterations} iterations ({self.stop_reason})\n"
            f"time: insert {self.insert_s:.3f}s, saturate {self.saturation_s:.3f}s, extract "
            f"{self.extraction_s:.3f}s, rebuild {self.rebuild_s:.3f}s, total {self.total_s:.3f}s\n"
            f"rules fired: {fired or 'none'}"
        )


def _enodes(egraph: EGraph) -> int:
    return sum(n for fn, n in egraph.all_function_sizes() if fn not in (shape, numel))


def _eclasses(egraph: EGraph) -> int:
    import json

    data = json.loads(egraph._serialize(split_primitive_outputs=False).to_json())
    sorts = {"T", "Epi", "TList"}
    return sum(1 for c in data["class_data"].values() if c.get("type", "").rsplit("_", 1)[-1] in sorts
               or c.get("type", "").rsplit(".", 1)[-1] in sorts)


def _rule_label(decl) -> str:
    return getattr(decl, "name", None) or str(decl)


def optimize(
    graph: Graph,
    *,
    cost_model: CostModel | None = None,
    rulesets: Sequence[Ruleset] | None = None,
    extractor: str = "auto",
    ilp_max_enodes: int = 4000,
    max_iterations: int = 30,
    max_enodes: int = 200_000,
    time_limit_s: float = 60.0,
    verify: bool = False,
    seed: int = 0,
) -> tuple[Graph, Report]:
    """Optimise ``graph`` with egglog; returns the rebuilt graph and a :class:`Report`.

    The schedule runs the shape analysis to saturation, then one pass of every
    optimisation ruleset, and repeats until nothing changes, ``max_iterations`` is
    reached, the e-graph exceeds ``max_enodes`` or ``time_limit_s`` (seconds) passes
    (the report's ``stop_reason`` says which). Extraction picks, for all outputs at once,
    the DAG of least total cost under ``cost_model`` (default :class:`CostModel`):
    ``extractor="greedy"`` runs egglog's Rust greedy-DAG extractor, ``"ilp"`` the optimal
    integer program of :mod:`.ilp`, ``"auto"`` (default) both when the e-graph has at most
    ``ilp_max_enodes`` e-nodes, keeping the cheaper (the report gives both costs), else the
    greedy one. A greedy result that costs more than the input graph is replaced by the
    input's own term (also in the e-graph), so optimising never makes a graph worse.

    ``verify=True`` evaluates both graphs with the numpy reference on random inputs and
    raises :class:`RewriteError` if any output differs. The input graph is not modified.
    """
    model = cost_model or CostModel()
    rulesets = tuple(OPTIMIZATION_RULESETS if rulesets is None else rulesets)
    rep = Report(nodes_before=len(graph.live_nodes()), dispatches_before=graph.dispatch_count(),
                 cost_before=model.graph_cost(graph))
    t0 = time.perf_counter()
    egraph = EGraph()
    enc = encode(graph, egraph)
    t1 = time.perf_counter()
    rep.insert_s = t1 - t0
    rep.enodes_inserted = _enodes(egraph)

    fired: Counter[str] = Counter()
    analysis = shape_analysis_ruleset.saturate()
    optimisation = rulesets[0]
    for rs in rulesets[1:]:
        optimisation = optimisation + rs
    try:
        rep.stop_reason = f"iteration limit {max_iterations}"
        for _ in range(max_iterations):
            egraph.run(analysis)
            run = egraph.run(optimisation)
            rep.iterations += 1
            for decl, n in run.num_matches_per_rule.items():
                if n:
                    fired[_rule_label(decl)] += n
            if not run.updated:
                rep.saturated, rep.stop_reason = True, "saturated"
                break
            if (size := _enodes(egraph)) > max_enodes:
                rep.stop_reason = f"e-node budget: {size} > {max_enodes}"
                break
            if time.perf_counter() - t1 > time_limit_s:
                rep.stop_reason = f"time budget: {time_limit_s}s"
                break
        egraph.run(shape_analysis_ruleset.saturate())
    except Exception as e:  # egglog reports unsound merges (different shapes) as errors
        raise RewriteError(f"saturation failed: {e}") from e
    t2 = time.perf_counter()
    rep.saturation_s = t2 - t1
    rep.rules_fired = dict(fired)
    rep.enodes = _enodes(egraph)
    rep.eclasses = _eclasses(egraph)

    if extractor not in ("auto", "greedy", "ilp"):
        raise ValueError(f"extractor must be 'auto', 'greedy' or 'ilp', got {extractor!r}")
    t3 = time.perf_counter()
    dag = extract_greedy(enc, model)
    rep.greedy_cost = rep.extracted_cost = dag.cost
    rep.extractor = "greedy"
    if extractor == "ilp" or (extractor == "auto" and rep.enodes <= ilp_max_enodes):
        ilp = extract_ilp(enc, model, time_limit_s=max(1.0, time_limit_s - (time.perf_counter() - t1)))
        rep.ilp_cost, rep.ilp_optimal, rep.ilp_s = ilp.cost, ilp.optimal, ilp.seconds
        if extractor == "ilp" or ilp.cost < rep.extracted_cost:
            dag, rep.extracted_cost, rep.extractor = ilp.dag, ilp.cost, "ilp"
    keep_input = rep.extracted_cost > rep.cost_before
    if keep_input:
        rep.extracted_cost, rep.extractor = rep.cost_before, "input (greedy was worse)"
    t4 = time.perf_counter()
    rep.extraction_s = t4 - t3
    out = graph.pruned() if keep_input else rebuild(dag, enc)
    t5 = time.perf_counter()
    rep.rebuild_s = t5 - t4
    rep.total_s = (t2 - t0) + (t5 - t3)
    rep.nodes_after = len(out.live_nodes())
    rep.dispatches_after = out.dispatch_count()
    rep.cost_after = model.graph_cost(out)
    if verify:
        verify_equivalent(graph, out, seed=seed)
    return out, rep


def random_feeds(graph: Graph, seed: int = 0) -> tuple[dict, dict]:
    """Random inputs and parameters for ``graph``: normal floats, valid embedding indices."""
    rng = np.random.default_rng(seed)
    limits: dict[int, int] = {}
    for n in graph.nodes:  # an index input must be valid for every table it indexes
        if n.op == "Embedding":
            rows = graph.node(n.inputs[1]).type.shape[0]
            limits[n.inputs[0]] = min(limits.get(n.inputs[0], rows), rows)
    inputs = {}
    for n in graph.leaves("Input"):
        if n.type.dtype is DType.U32:
            inputs[n.attrs["name"]] = rng.integers(0, limits.get(n.id, 1), n.type.shape).astype(np.uint32)
        else:
            inputs[n.attrs["name"]] = rng.standard_normal(n.type.shape).astype(np.float32)
    params = {n.attrs["name"]: (rng.standard_normal(n.type.shape) / np.sqrt(n.type.shape[0])).astype(np.float32)
              for n in graph.leaves("Parameter")}
    return inputs, params


def verify_equivalent(before: Graph, after: Graph, seed: int = 0, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    """Raise :class:`RewriteError` unless both graphs give the same outputs on random data.

    Both run on the numpy reference in float64, so any difference beyond rounding
    (``rtol``/``atol``) is a wrong rewrite, not float noise.
    """
    inputs, params = random_feeds(before, seed)
    want = evaluate(before, inputs, params)
    got = evaluate(after, inputs, params)
    if len(want) != len(got):
        raise RewriteError(f"optimised graph has {len(got)} outputs, the original {len(want)}")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.shape != g.shape or not np.allclose(g, w, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(g - w))) if w.shape == g.shape else float("nan")
            raise RewriteError(f"output {i} (node {before.outputs[i]}, {before.node(before.outputs[i]).op}) "
                               f"differs after optimisation: shapes {w.shape} vs {g.shape}, max abs error {err:.3g}")


__all__ = ["OPTIMIZATION_RULESETS", "Report", "T", "Epi", "TList", "optimize", "random_feeds", "verify_equivalent"]
