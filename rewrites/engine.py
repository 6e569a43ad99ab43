"""The rewrite engine: encode, saturate (analysis, then optimisation, to a fixpoint), extract, rebuild."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
from egglog import EGraph, Ruleset, back_off, run, seq

from ..ir import OPS, DType, Graph, RewriteError, evaluate, require_graph
from . import egglog_private
from .cost import CostModel
from .encode import Encoding, encode
from .extract import rebuild
from .greedy import extract_greedy_dag
from .ilp import extract_ilp
from .problem import build_problem
from .report import Phase, Report, input_classes, node_origins, replaced_nodes
from .rulesets import analysis_ruleset, check_rule_names, check_ruleset_objects, relevant, scheduled_rulesets
from .sorts import ANALYSES, Epi, T, TList, shape

EXTRACTORS = ("ilp", "greedy", "compare")
_BYTES = CostModel(dispatch_bytes=0)  # bytes read + written per kernel: the report's bytes_before / bytes_after
_ANALYSIS_NAMES = {str(fn) for fn in ANALYSES}


def _enodes(egraph: EGraph) -> int:
    return sum(n for fn, n in egraph.all_function_sizes() if str(fn) not in _ANALYSIS_NAMES)


def _eclasses(egraph: EGraph, raw: dict | None = None) -> int:
    """E-classes of the tensor, epilogue, list and ``Ex`` sorts. From egglog's serialisation ``raw``
    when given (an e-class a rule created has no ``shape`` row); without it, before any rule
    ran, every tensor e-class is one encoded node with its ``shape`` row and every epilogue
    and list e-node its own e-class."""
    if raw is not None:
        return sum(1 for d in raw["class_data"].values() if d.get("type") in ("T", "Epi", "TList", "Ex"))
    return egraph.function_size(shape) + sum(
        n for fn, n in egraph.all_function_sizes() if str(fn).startswith(("Epi.", "TList.")))


def _phase(egraph: EGraph, seconds: float, raw: dict | None = None) -> Phase:
    return Phase(seconds, _eclasses(egraph, raw), _enodes(egraph))


def saturate(graph: Graph, rep: Report, *, rulesets: Sequence[Ruleset] | None = None, match_limit: int = 20_000,
             ban_length: int = 5, max_iterations: int = 50, max_enodes: int = 200_000, time_limit_s: float = 60.0,
             no_decomp: bool = True, record: bool = False) -> Encoding:
    """Insert ``graph`` into a new e-graph and run the schedule; fills the insert, analysis
    and saturation phases of ``rep``. See :func:`optimize` for the schedule and budgets.

    Raises :class:`RewriteError` when egglog rejects a merge (two encoded e-classes with
    different shape facts: an unsound rule), naming the rule (found by replaying the schedule
    one rule at a time, :mod:`.diagnose`). A term a rule created has no shape fact; the
    extraction problem checks those (``problem.build_problem``).
    """
    graph.check_outputs()
    rulesets = tuple(scheduled_rulesets() if rulesets is None else rulesets)
    t0 = time.perf_counter()
    egraph = EGraph(save_egglog_string=record, no_decomp=no_decomp)
    enc = encode(graph, egraph)
    rep.insert_s = time.perf_counter() - t0
    rep.phases["insert"] = _phase(egraph, rep.insert_s)

    fired: Counter[str] = Counter()
    analysis = analysis_ruleset().saturate()
    scheduler = back_off(match_limit=match_limit, ban_length=ban_length).persistent()
    # only the rules that can match this graph, or what the others build from it (rulesets.relevant)
    optimisation = seq(*(run(rs, scheduler=scheduler) for rs in relevant(rulesets, enc.constructors)))
    start = time.perf_counter()
    try:
        rep.stop_reason = f"iteration limit {max_iterations}"
        for _ in range(max_iterations):
            t = time.perf_counter()
            egraph.run(analysis)
            rep.analysis_s += time.perf_counter() - t
            if rep.iterations == 0:
                rep.phases["analysis"] = _phase(egraph, rep.analysis_s)
            t = time.perf_counter()
            step = egraph.run(optimisation)
            rep.saturation_s += time.perf_counter() - t
            rep.iterations += 1
            for decl, n in step.num_matches_per_rule.items():
                if n:
                    fired[getattr(decl, "name", None) or str(decl)] += n
            if not step.updated and step.can_stop:
                rep.saturated, rep.stop_reason = True, "saturated"
                break
            if (size := _enodes(egraph)) > max_enodes:
                rep.stop_reason = f"e-node budget: {size} > {max_enodes}"
                break
            if time.perf_counter() - start > time_limit_s:
                rep.stop_reason = f"time budget: {time_limit_s}s"
                break
        t = time.perf_counter()
        egraph.run(analysis)
        rep.analysis_s += time.perf_counter() - t
    except Exception as e:  # egglog reports unsound merges (different shapes) as errors
        if "Illegal merge" not in str(e):
            raise RewriteError(f"saturation failed: {e}") from e
        from .diagnose import merge_culprit

        found = merge_culprit(graph, rulesets, match_limit=match_limit, ban_length=ban_length,
                              max_iterations=max_iterations)
        who, what = found or ("a rule", "")
        raise RewriteError(f"saturation failed: {who} joined two e-classes of the input graph whose shapes differ"
                           f"{': ' + what if what else ''} (egglog: {e}); a rule whose two sides have different "
                           "shapes is unsound" + ("" if found else "; run the rulesets one by one "
                                                  "(optimize(rulesets=[...])) to find it")) from e
    rep.phases["analysis"].seconds = rep.analysis_s
    enc.raw = egglog_private.serialize(egraph)  # the final e-graph, read once by extraction too
    rep.phases["saturation"] = _phase(egraph, rep.saturation_s, enc.raw)
    rep.rules_fired = dict(fired)
    rep.enodes, rep.eclasses = rep.phases["saturation"].enodes, rep.phases["saturation"].eclasses
    return enc


def _check_options(cost_model, rulesets, dump_egglog, **limits) -> None:
    # optimize's arguments, before any work: RewriteError naming the argument and what it takes
    if cost_model is not None and not isinstance(cost_model, CostModel):
        what = f"the class {cost_model.__name__}" if isinstance(cost_model, type) else repr(cost_model)
        hint = ("; for a name as the command line takes it, eggfuse.rewrites.roofline.cost_model_from_spec("
                f"{cost_model!r}) makes one" if isinstance(cost_model, str) else "")
        raise RewriteError(f"optimize: cost_model must be a CostModel instance (eggfuse.rewrites.cost.CostModel or "
                           f"a subclass, e.g. CostModel()), got {what}{hint}")
    if rulesets is not None:
        check_ruleset_objects(rulesets, "optimize")
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise RewriteError(f"optimize: {name} must be a positive number, got {value!r}")
    if dump_egglog is not None and os.path.isdir(dump_egglog):
        raise RewriteError(f"optimize: dump_egglog is a file path for the egglog program; {dump_egglog!r} is a "
                           "directory: give a file name in it")


def optimize(
    graph: Graph,
    *,
    cost_model: CostModel | None = None,
    rulesets: Sequence[Ruleset] | None = None,
    extractor: str = "ilp",
    ilp_time_limit_s: float = 20.0,
    match_limit: int = 20_000,
    ban_length: int = 5,
    max_iterations: int = 50,
    max_enodes: int = 200_000,
    time_limit_s: float = 60.0,
    no_decomp: bool = True,
    verify: bool = False,
    seed: int = 0,
    dump_egglog: str | None = None,
    payoff: bool = False,
) -> tuple[Graph, Report]:
    """Optimise ``graph`` with egglog; returns the rebuilt graph and a :class:`Report`.

    Schedule: the shape analysis runs to saturation, then one pass of every optimisation
    ruleset under egglog's back-off scheduler (a rule matching more than ``match_limit``
    times in a pass is banned for ``ban_length`` passes, both limits growing with each ban,
    so a rule that blows up cannot swamp the e-graph); repeated until a pass changes nothing
    and no rule is banned. It stops early,
    saying so in ``stop_reason``, at ``max_iterations`` passes, above ``max_enodes``
    e-nodes or after ``time_limit_s`` seconds. ``no_decomp`` (default True) is egglog's
    ``EGraph(no_decomp=True)``: queries run without its decomposition into sub-queries. Measured
    on this project's graphs it is never slower and often much faster: the epilogue regions' diamond
    rule, whose two ``FusedMatMul`` atoms share only the chain, took 1.3 s of ``llama:64
    --training``'s 1.5 s of saturation with the decomposition and 0.01 s without.

    Extraction picks, for all outputs at once, the DAG of least total cost under
    ``cost_model`` (default :class:`CostModel`). ``extractor="ilp"`` (default) solves the
    integer program of :mod:`.ilp` (optimal; if ``ilp_time_limit_s`` runs out first, the
    better of its best solution and the greedy one); ``"greedy"`` runs the vectorised
    greedy-DAG extractor of :mod:`.greedy` alone; ``"compare"`` runs both and reports
    both costs (the greedy gap). A greedy result that costs more than the input graph is
    replaced by the input itself (also a term of the e-graph), so optimising never makes a
    graph worse. The rebuilt graph holds every Input and Parameter of ``graph``, those no
    output depends on as leaves nothing reads, so it accepts the same feeds and parameters.

    ``verify=True`` evaluates both graphs with the numpy reference on random inputs and
    raises :class:`RewriteError` if any output differs. ``payoff=True`` fills the report's
    ``rules`` and ``rulesets``: for each, its matches, the e-nodes of the extracted graph its
    right-hand side built, and what it saves, by saturating and extracting again without it
    (:mod:`.payoff`: one more optimisation per rule that fired and per ruleset).
    ``dump_egglog`` is a file path
    that receives the egglog program (graph, rules, schedule) for replay. The input
    graph is not modified. Raises :class:`InputError` for a ``graph`` that is not a Graph (a path or ModelProto:
    ``eggfuse.onnx.load``), :class:`GraphError` for a graph without outputs, :class:`RewriteError` for
    an unknown ``extractor``, a ``cost_model`` that is not a :class:`CostModel` instance, a ``rulesets`` item
    that is not an egglog ``Ruleset``, a rule of a ruleset of one's own named as another rule that runs with it
    (egglog keeps one rule per name), a limit that
    is not a positive number, a ``dump_egglog`` path that is a directory, a ``kernel_cost`` that is not a
    finite number >= 0 (naming the op), and for a rule
    that joins terms of different shapes or dtypes (an e-node whose shape rule gives another
    type than its e-class's, named with both types).
    """
    if extractor not in EXTRACTORS:
        raise RewriteError(f"optimize: extractor must be one of {', '.join(EXTRACTORS)}, got {extractor!r}")
    _check_options(cost_model, rulesets, dump_egglog, match_limit=match_limit, ban_length=ban_length,
                   max_iterations=max_iterations, max_enodes=max_enodes, time_limit_s=time_limit_s,
                   ilp_time_limit_s=ilp_time_limit_s)
    require_graph("optimize", graph)
    if rulesets is not None:
        check_rule_names(rulesets)
    graph.check_outputs()
    with _gc_paused():
        return _optimize(graph, cost_model, rulesets, extractor, ilp_time_limit_s, verify, seed, dump_egglog, payoff,
                         dict(match_limit=match_limit, ban_length=ban_length, max_iterations=max_iterations,
                              max_enodes=max_enodes, time_limit_s=time_limit_s, no_decomp=no_decomp))


@contextlib.contextmanager
def _gc_paused():
    # Python's cyclic garbage collector off while optimising: building the extraction problem makes
    # hundreds of thousands of small objects, whose collection passes took 0.08 s of llama:30
    # --training's 0.58 s (freed by reference counting all the same; the collector runs again after)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _optimize(graph: Graph, cost_model, rulesets, extractor: str, ilp_time_limit_s: float, verify: bool, seed: int,
              dump_egglog: str | None, payoff: bool, schedule: dict) -> tuple[Graph, Report]:
    model = cost_model or CostModel()
    rulesets = tuple(scheduled_rulesets() if rulesets is None else rulesets)
    rep = Report(nodes_before=len(graph.live_nodes()), dispatches_before=graph.dispatch_count(),
                 cost_before=model.graph_cost(graph), bytes_before=_BYTES.graph_cost(graph))
    enc = saturate(graph, rep, rulesets=rulesets, record=dump_egglog is not None, **schedule)
    egraph = enc.egraph

    t = time.perf_counter()
    try:
        problem = build_problem(enc, model, enc.raw)
    except RewriteError as e:
        if not str(e).startswith(("a rule put", "a rule built")):  # an e-node of another type, or of none
            raise
        raise RewriteError(_with_culprits(str(e), graph, rulesets, rep.rules_fired, schedule)) from None
    candidates = []  # (extractor, its DAG): the graph of each is priced below as the graph it rebuilds
    if extractor in ("ilp", "compare"):
        try:
            ilp = extract_ilp(problem, time_limit_s=ilp_time_limit_s)
        except RewriteError:  # no solution within the time limit: the greedy one below
            rep.ilp_optimal = False
        else:
            rep.ilp_objective, rep.ilp_optimal, rep.ilp_s = ilp.cost, ilp.optimal, ilp.seconds
            candidates.append(("ilp", ilp.dag))
    if extractor in ("greedy", "compare") or not rep.ilp_optimal:
        greedy = problem.term(extract_greedy_dag(problem))
        rep.greedy_objective = greedy.cost
        candidates.append(("greedy", greedy))
    rep.extraction_s = time.perf_counter() - t
    rep.phases["extraction"] = Phase(rep.extraction_s, rep.eclasses, rep.enodes)
    # The extraction problem prices a tensor that two generated regions read (their shared ExLeaf e-node) once,
    # where the kernels read it once each: its objective can sit below the cost of the graph it gives. Each
    # candidate is therefore rebuilt and priced as a graph; the cheapest is kept, and the input graph where
    # every candidate costs more than it.
    t = time.perf_counter()
    built = []
    for name, candidate in candidates:
        made: dict[int, int] = {}
        rebuilt = _with_leaves_of(graph, rebuild(candidate, enc, made))
        cost = model.graph_cost(rebuilt)
        setattr(rep, f"{name}_cost", cost)
        built.append((cost, name, candidate, made, rebuilt))
    cost, rep.extractor, dag, made, out = min(built, key=lambda b: b[0])  # ties: the first (the ILP's)
    keep_input = cost > rep.cost_before
    class_of = input_classes(enc.raw)
    if keep_input:
        rep.extractor = f"input ({rep.extractor} result cost more)"
        out, dag = _with_leaves_of(graph, graph.pruned()), None
    rep.recognised = {} if keep_input else replaced_nodes(graph, dag, class_of)
    rep.rebuild_s = time.perf_counter() - t
    rep.origins = ({new: [n.id] for new, n in enumerate(graph.live_nodes()) if not OPS[n.op].leaf} if keep_input
                   else node_origins(graph, dag, class_of, made, out, enc.raw))
    rep.phases["rebuild"] = Phase(rep.rebuild_s, rep.eclasses, rep.enodes)
    rep.total_s = rep.insert_s + rep.analysis_s + rep.saturation_s + rep.extraction_s + rep.rebuild_s
    rep.nodes_after = len(out.live_nodes())
    rep.dispatches_after = out.dispatch_count()
    rep.cost_after = rep.cost_before if keep_input else cost
    rep.bytes_after = _BYTES.graph_cost(out)
    if dump_egglog is not None:
        with open(dump_egglog, "w") as f:
            f.write(egraph.as_egglog_string)
    if verify:
        rep.verified_max_diff = verify_equivalent(graph, out, seed=seed)
    if payoff:
        from .payoff import attach

        def again(without: Sequence[Ruleset]) -> Report:
            return optimize(graph, cost_model=model, rulesets=without, extractor=extractor,
                            ilp_time_limit_s=ilp_time_limit_s, **schedule)[1]

        attach(rep, dag, enc, rulesets, again)
    return out, rep


def _with_culprits(message: str, graph: Graph, rulesets: Sequence[Ruleset], fired: dict[str, int],
                   schedule: dict) -> str:
    # ``message`` (a rule put an e-node of another type into an e-class) led by the rules that fired without
    # which saturation gives no such e-node (diagnose.unsound_culprits: one saturation per rule that fired,
    # on this error path only)
    from .diagnose import unsound_culprits

    def still_fails(rs: Sequence[Ruleset]) -> bool:
        enc = saturate(graph, Report(), rulesets=rs, **schedule)
        try:
            build_problem(enc, CostModel(), enc.raw)
        except RewriteError:
            return True
        return False

    who = unsound_culprits(rulesets, fired, still_fails)
    return (f"unsound {' and '.join(who)}: " if who else "") + message


def _with_leaves_of(graph: Graph, out: Graph) -> Graph:
    # ``out`` with each Input and Parameter of ``graph`` that it lacks added as a leaf that
    # nothing reads: a session accepts (and ignores) values for those, as for ``graph``.
    have = {n.attrs["name"] for n in out.nodes if n.op in ("Input", "Parameter")}
    for n in graph.nodes:
        name = n.attrs.get("name")
        if n.op not in ("Input", "Parameter") or name in have:
            continue
        if n.op == "Input":
            out.input(name, n.type.shape, n.type.dtype)
        elif n.attrs.get("state"):
            out.state(name, n.type.shape)
        else:
            out.parameter(name, n.type.shape, n.type.dtype)
    return out


def random_feeds(graph: Graph, seed: int = 0) -> tuple[dict, dict]:
    """Random inputs and parameters for ``graph``: normal floats, valid indices (u32 and i32
    inputs: below the rows of every table they index, 0 where none), random bools, and u32
    parameters (packed data) of random words whose 16-bit halves are finite float16 values."""
    rng = np.random.default_rng(seed)
    limits = graph.index_bounds()  # an index input must be valid for every table it indexes
    inputs = {}
    for n in graph.leaves("Input"):
        if n.type.dtype in (DType.U32, DType.I32):  # indices below the tables they index (ONNX ids are i32)
            inputs[n.attrs["name"]] = rng.integers(0, limits.get(n.id, 1), n.type.shape).astype(n.type.dtype.numpy)
        elif n.type.dtype is DType.BOOL:
            inputs[n.attrs["name"]] = rng.integers(0, 2, n.type.shape).astype(bool)
        else:
            inputs[n.attrs["name"]] = rng.standard_normal(n.type.shape).astype(np.float32)
    params = {}
    for n in graph.leaves("Parameter"):
        if n.type.dtype is DType.U32:  # packed data (quantised blocks): each 16-bit half a finite f16, |x| < 2
            words = rng.integers(0, 1 << 32, n.type.shape, dtype=np.uint64) & 0xBFFFBFFF
            params[n.attrs["name"]] = words.astype(np.uint32)
        else:
            scale = np.sqrt(n.type.shape[0] if n.type.shape else 1)  # a rank-0 parameter: N(0, 1)
            params[n.attrs["name"]] = (rng.standard_normal(n.type.shape) / scale).astype(np.float32)
    return inputs, params


def verify_equivalent(before: Graph, after: Graph, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-7) -> float:
    """Raise :class:`RewriteError` unless both graphs give the same outputs on random data; returns
    the largest |difference| of the output elements finite in both (NaN where there is none: only
    the positions of NaN and infinities were compared).

    Both run on the numpy reference in float64, so any difference beyond ``rtol``/``atol`` is
    a wrong rewrite, not float noise. The tolerances are those of f32 constants: a recognition
    rule (``ir/ops/recognize.py``) matches an exporter's f32 rounding of sqrt 2 or sqrt(2/pi)
    and puts the exact op in its place, which changes the float64 result by about 1e-8. A NaN
    must be a NaN in both (a random parameter under a Sqrt gives one in either graph).
    """
    inputs, params = random_feeds(before, seed)
    with np.errstate(all="ignore"):  # random values may overflow or give NaN in both graphs alike
        want = evaluate(before, inputs, params)
        got = evaluate(after, inputs, params)
    if len(want) != len(got):
        raise RewriteError(f"optimised graph has {len(got)} outputs, the original {len(want)}")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.shape != g.shape or not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            err = float(np.max(np.abs(g - w))) if w.shape == g.shape else float("nan")
            raise RewriteError(f"output {i} (node {before.outputs[i]}, {before.node(before.outputs[i]).op}) "
                               f"differs after optimisation: shapes {w.shape} vs {g.shape}, max abs error {err:.3g}")
    diffs = [np.abs(np.asarray(g, np.float64) - w)[np.isfinite(w) & np.isfinite(g)] for w, g in zip(want, got,
                                                                                                   strict=True)]
    return max((float(d.max()) for d in diffs if d.size), default=float("nan"))


__all__ = ["EXTRACTORS", "Report", "T", "Epi", "TList", "optimize", "random_feeds", "verify_equivalent"]
