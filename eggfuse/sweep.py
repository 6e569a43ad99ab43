"""Compile-time experiments: a grid of graphs x rulesets (or ablations) x cost models x extractors
x scheduler settings, each configuration optimised once (or ``repeats`` times), in parallel.

Runs go to a local process pool (one compile at a time per worker process) or to a Dask
distributed cluster (``scheduler="tcp://HOST:PORT"``): both through :func:`run_sweep`, which
submits :func:`run_one` per configuration and collects rows as they finish. A run that fails
becomes a row whose ``error`` says why; the sweep goes on. :func:`write_results` writes the
tidy table (one row per run) as CSV and JSON, and :func:`plot` the PNGs (matplotlib).

Sources are resolved where the sweep starts (:func:`resolve`), so a run finds the same graph and cost
model in-process, in the local pool or on a Dask worker started in another folder (of the same machine,
or one that sees the same files at the same paths).

Columns of a row (:data:`COLUMNS`): the configuration (``model`` as given, ``source`` the graph source
the run loaded: an absolute path for a file, ``training``, ``seq`` and ``batch`` (empty where they size
nothing: a graph that is not a shipped model; ``batch`` sizes MiniLM alone), ``shapes`` the shapes that
sized this graph's inputs (``NAME=DxD`` joined by ``;``, empty for none: always for a graph that is not an
ONNX file), ``schedule`` the further scheduler settings (``NAME=VALUE`` joined by ``;``), ``rulesets``
the names used, comma-joined, ``disabled`` the ruleset or rule left out, empty for the full set,
``cost_model`` as given, ``cost_source`` as loaded, ``extractor``, ``match_limit``, ``no_decomp``,
``repeat``, ``verify``: whether the run compared its graph's outputs with the input graph's), the graph
(``graph_hash``, ``graph_nodes``), the e-graph (``eclasses``,
``enodes``, ``iterations``, ``stop_reason``), seconds per phase (``insert_s``, ``analysis_s``,
``saturation_s``, ``extraction_s``, ``rebuild_s``, their sum ``total_s``), ``load_s`` (the graph's
construction; 0 when the worker had it cached), ``cpu_s`` (the worker process's CPU seconds for the
``optimize`` call: with ``payoff`` its re-optimisations too, and in a worker's first row building the rulesets
and declaring them to egglog, once a process), results (``dispatches_before``/``after``,
``cost_before``/``after`` in the cost model's unit, ``bytes_before``/``after``, ``kept`` the extractor whose graph
was kept (or ``input (...)``), ``greedy_cost``/``ilp_cost`` the costs of the graphs the extractors that ran gave
and ``ilp_objective`` the ILP's objective: both with ``compare``), ``rules_fired`` (rules that
matched), ``rules_paid`` and ``rulesets_paid`` (with ``payoff``: rules, rulesets whose removal raises the cost;
else empty), ``verified_max_diff`` (with ``verify``: the largest difference of the outputs, else empty),
``worker``
(host:pid), ``eggfuse_version``, ``egglog_version`` and ``error`` (empty when the run succeeded: else the
exception's type and message).

With ``payoff`` a row also holds ``payoff`` (in ``results.json``, not the CSV): what each ruleset, each rule
that matched and each group of rules building one op saves, as ``optimize(payoff=True)`` reports it
(:mod:`eggfuse.rewrites.payoff`), a dict per entry with ``kind`` (``ruleset``, ``rule``, ``rule group``);
:func:`write_payoff` writes them as ``payoff.csv`` (:data:`PAYOFF_COLUMNS`) and :func:`payoff_table` sums
them up per model and configuration.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import json
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from eggfuse.sweep_inputs import applied_shapes, dims_text, distinct_sources, resolve, resolve_cost_model, shape_pairs

COLUMNS = ("model", "source", "training", "seq", "batch", "shapes", "schedule", "rulesets", "disabled", "cost_model",
           "cost_source", "extractor", "match_limit", "no_decomp", "repeat", "verify", "graph_hash", "graph_nodes",
           "eclasses", "enodes", "iterations", "stop_reason", "insert_s", "analysis_s", "saturation_s", "extraction_s",
           "rebuild_s", "total_s", "load_s", "cpu_s", "dispatches_before", "dispatches_after", "cost_before",
           "cost_after", "bytes_before", "bytes_after", "kept", "greedy_cost", "ilp_cost", "ilp_objective",
           "rules_fired", "rules_paid", "rulesets_paid", "verified_max_diff", "worker", "eggfuse_version",
           "egglog_version", "error")
#: Columns of ``payoff.csv`` (:func:`write_payoff`): one row per ruleset, matched rule and rule group of each
#: run with ``payoff``; ``run`` is the run's index in ``results.csv``/``results.json``.
PAYOFF_COLUMNS = ("run", "model", "configuration", "training", "seq", "batch", "shapes", "schedule", "cost_model",
                  "extractor", "repeat", "kind", "name", "ruleset",
                  "matches", "extracted_enodes", "saved_cost", "saved_dispatches", "saved_bytes", "cost_after",
                  "dispatches_after")
RULESET_MODES = ("all", "ablate", "ablate-rules")
#: The files a sweep writes into its folder (:func:`write_results`, :func:`write_payoff`, :func:`plot`).
OUTPUTS = ("results.csv", "results.json", "payoff.csv", "compile_time.png", "phases.png", "dispatches_bytes.png")


@dataclass(frozen=True)
class RunConfig:
    """One run of the grid. ``rulesets``: the optimisation rulesets kept (comma-joined, in
    schedule order); ``disabled``: the ruleset or the rule left out ("" for none); ``source`` and
    ``cost_source``: ``model`` and ``cost_model`` as resolved where the sweep started (:func:`resolve`;
    "" for as given), what the run loads; ``folder``: where the sweep started, the folder a
    module that ``sys.path`` lacks is imported from ("" for the worker's own); the rest as
    ``eggfuse optimize``'s options. A ruleset of one's own is named in ``rulesets`` by its
    ``module:NAME`` (see :func:`grid`). ``verify``: the extracted graph's outputs compared with the input
    graph's (numpy reference, random inputs; ``optimize(verify=True)``): a difference fails the run, so that
    an unsound rule's saving is not taken for a result."""

    model: str
    rulesets: str
    disabled: str = ""
    cost_model: str = "bytes"
    extractor: str = "ilp"
    match_limit: int = 20_000
    no_decomp: bool = True
    seq: int = 16
    batch: int = 2
    training: bool = False
    shapes: tuple = ()  # an ONNX file's input shapes as (name, (dims...)) pairs, sorted
    repeat: int = 0
    payoff: bool = False
    verify: bool = False
    schedule: tuple = ()  # further optimize() keywords as (name, value) pairs: ban_length, max_iterations, ...
    source: str = ""
    cost_source: str = ""
    folder: str = ""


def grid(models: Sequence[str], rulesets: str | Sequence[str] = "all", cost_models: Sequence[str] = ("bytes",),
         extractors: Sequence[str] = ("ilp",), match_limits: Sequence[int] = (20_000,),
         no_decomp: Sequence[bool] = (True,), *, repeats: int = 1, **common) -> list[RunConfig]:
    """Every combination, models outermost. ``models``: a list of graph sources (``minilm``, ``smollm2``,
    ``llama:LAYERS``, ``.onnx`` files, ``module:function``, ``path/to/file.py:function``), each given once.
    ``rulesets``: ``all`` (the shipped rulesets), ``ablate`` (all, then each ruleset left out in turn),
    ``ablate-rules`` (all, then each rule left out in turn), or comma-joined ruleset names to keep; or a
    list of these, each a selection of the grid (``["all", "all,mymodule:MINE"]``: with and without one's own
    rules; a configuration two of them give runs once). ``ablate`` and ``ablate-rules`` take further
    rulesets after a comma (``ablate,myrules:MINE``,
    ``ablate-rules,layer_norm_prologue``): run with the shipped ones, and left out (or taken apart) too.
    ``common``: the other :class:`RunConfig` fields; ``shapes`` a list of ``(NAME, (D, D, ...))`` pairs or
    ``"NAME=DxD"`` strings, each sizing that input of every ``.onnx`` file of ``models`` that has it.

    A ruleset of one's own (made with ``make_ruleset``) goes among the names as ``module:NAME`` or
    ``path/to/file.py:NAME`` (``all,mymodule:MINE``), kept by that text in :attr:`RunConfig.rulesets`
    for each worker to import again.

    Sources are resolved here, against the current folder, so that every worker runs the same graph
    (:func:`resolve`): a config's ``source``, ``cost_source`` and ``folder``. Two models are the same graph
    when their resolved sources are equal: the same file (after symbolic links) and function, or the same
    module name and function where the module is not one ``.py`` file; ``mygraphs:mlp`` and
    ``./mygraphs.py:mlp`` are one where ``mygraphs`` imports from ``./mygraphs.py``.

    Raises :class:`~eggfuse.ir.InputError` for an empty list, a string where a list is due, a model, ruleset
    selection, cost model, extractor, match limit or no_decomp value given twice, an unknown ruleset name, extractor or
    cost model, a cost model ``module:Class`` that does not load
    (:func:`~eggfuse.rewrites.roofline.cost_model_from_spec`), a ruleset of one's own whose module does not
    import, whose NAME is not such a ruleset or whose name is another ruleset's (the RewriteError
    chained), a match limit that is not a positive integer, ``repeats`` below 1, an unknown ``common``
    field, a shape that is not ``NAME=DxD`` (positive integers) or gives a name twice, and a shape naming an
    input of no ``.onnx`` file of ``models``."""
    from eggfuse.ir import InputError
    from eggfuse.rewrites.engine import EXTRACTORS
    from eggfuse.rewrites.roofline import cost_model_from_spec

    for name, values in (("models", models), ("cost models", cost_models), ("extractors", extractors),
                         ("match limits", match_limits), ("no_decomp values", no_decomp)):
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise InputError(f"{name} must be a list, got {type(values).__name__} {values!r}; e.g. [{values!r}]")
    models, cost_models, extractors = list(models), list(cost_models), list(extractors)
    match_limits, no_decomp = list(match_limits), list(no_decomp)
    for name, values in (("models", models), ("cost models", cost_models), ("extractors", extractors),
                         ("match limits", match_limits)):
        if not values:
            raise InputError(f"the sweep needs at least one of {name}")
    for name, values in (("cost model", cost_models), ("extractor", extractors), ("match limit", match_limits),
                         ("no_decomp value", no_decomp)):
        twice = [v for v in dict.fromkeys(values) if values.count(v) > 1]
        if twice:  # its runs would be two rows with the same repeat index
            raise InputError(f"{name} {twice[0]!r} is given twice; give each once (repeats runs a configuration "
                             "more than once)")
    for m in models:
        if not isinstance(m, str) or not m:
            raise InputError(f"a model must be a graph source's name (a non-empty str), got {m!r}")
    for x in extractors:
        if x not in EXTRACTORS:
            raise InputError(f"unknown extractor {x!r}: use {', '.join(EXTRACTORS)}")
    for spec in dict.fromkeys(cost_models):  # here, not in every row
        cost_model_from_spec(spec)
    for limit in match_limits:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InputError(f"a match limit must be an integer of 1 or more, got {limit!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be an integer of 1 or more, got {repeats!r}")
    fields = {f.name for f in dataclasses.fields(RunConfig)} - _GRID_FIELDS
    unknown = sorted(set(common) - fields)
    if unknown:
        raise InputError(f"grid() has no field {', '.join(map(repr, unknown))}: the other fields are "
                         f"{', '.join(sorted(fields))}")
    if isinstance(rulesets, str):
        specs = [rulesets]
    elif isinstance(rulesets, list | tuple) and rulesets and all(isinstance(x, str) for x in rulesets):
        specs = list(rulesets)
    else:
        raise InputError(f"rulesets must be a str or a non-empty list of them ({', '.join(RULESET_MODES)} or "
                         f"comma-joined ruleset names), got {type(rulesets).__name__} {rulesets!r}")
    specs = [",".join(n.strip() for n in x.split(",") if n.strip()) for x in specs]  # "all, mine," is "all,mine"
    twice = [x for x in dict.fromkeys(specs) if specs.count(x) > 1]
    if twice:
        raise InputError(f"rulesets {twice[0]!r} is given twice; give each once")
    # every selection's (rulesets kept, left out) pairs, once each (all and ablate share the full set)
    sets = list(dict.fromkeys(pair for spec in specs for pair in _ruleset_sets(spec)))
    folder = os.getcwd()
    sources = distinct_sources(models, folder)
    applied = applied_shapes(sources, shape_pairs(common.pop("shapes", ())))
    cost_sources = {cost: resolve_cost_model(cost, folder) for cost in cost_models}
    out = []
    for model, source in zip(models, sources, strict=True):
        for kept, disabled in sets:
            for cost in cost_models:
                for extractor in extractors:
                    for limit in match_limits:
                        for nd in no_decomp:
                            for r in range(repeats):
                                out.append(RunConfig(model, kept, disabled, cost, extractor, int(limit), bool(nd),
                                                     repeat=r, shapes=applied[source], source=source,
                                                     cost_source=cost_sources[cost], folder=folder, **common))
    return out


def _ruleset_sets(rulesets: str) -> list[tuple[str, str]]:
    """The (rulesets kept, ruleset or rule left out) pairs of one ``rulesets`` selection of :func:`grid`."""
    from eggfuse.ir import InputError, RewriteError
    from eggfuse.rewrites.rulesets import SCHEDULE, catalog, rules_of, ruleset_name, ruleset_spec, select

    full = ",".join(SCHEDULE)
    mode, _, rest = rulesets.partition(",")
    if rulesets == "all":
        sets = [(full, "")]
    elif mode.strip() in ("ablate", "ablate-rules"):
        # the scheduled rulesets and any named after the mode (optional ones, one's own), then each left out
        extra = [n.strip() for n in rest.split(",") if n.strip()]
        shipped = [n for n in extra if n in SCHEDULE or n == "all"]
        if shipped:
            raise InputError(f"{mode.strip()} runs every shipped ruleset already ({shipped[0]!r} among them); name "
                             "after it only optional rulesets and your own (module:NAME, file.py:NAME)")
        try:
            chosen = select(extra, rulesets=()) if extra else ()
        except RewriteError:
            try:  # the message that lists every ruleset there is
                select(extra)
            except RewriteError as e:
                raise InputError(str(e)) from e
            raise
        names = [*SCHEDULE, *(ruleset_spec(rs) or ruleset_name(rs) for rs in chosen)]
        everything = ",".join(names)
        if mode.strip() == "ablate":
            sets = [(everything, "")] + [(",".join(n for n in names if n != left), left) for left in names]
        else:
            own = [rule for rs in chosen for rule in (rules_of(rs) or ())]
            sets = [(everything, "")] + [(everything, rule) for name in SCHEDULE for rule in catalog()[name]] + [
                (everything, rule) for rule in own]
    else:
        names = [n.strip() for n in rulesets.split(",") if n.strip()]
        if "f16" in names:
            raise InputError("the sweep optimises f32 graphs: the f16 ruleset (weights rounded to float16, "
                             "--precision f16 of eggfuse run and optimize) is not among its rulesets")
        # unknown names raise here, not in every worker; "all" stands for the scheduled rulesets; a ruleset of
        # one's own is kept as its module:NAME, which each worker imports again
        try:
            sets = [(",".join(ruleset_spec(rs) or ruleset_name(rs) for rs in select(names)), "")]
        except RewriteError as e:
            close = difflib.get_close_matches(names[0] if names else "", RULESET_MODES[1:], n=1, cutoff=0.6)
            modes = f"; or, alone first, a mode of the sweep: {', '.join(RULESET_MODES[1:])}" + (
                f" (did you mean {close[0]!r}?)" if close else "")
            raise InputError(f"{e}{modes}") from e
    return sets


#: RunConfig fields grid() sets itself, not taken as ``common``
_GRID_FIELDS = {"model", "rulesets", "disabled", "cost_model", "extractor", "match_limit", "no_decomp", "repeat",
                "source", "cost_source", "folder"}


def _versions() -> tuple[str, str]:
    out = []
    for dist in ("eggfuse", "egglog"):
        try:
            out.append(metadata.version(dist))
        except metadata.PackageNotFoundError:
            out.append("")
    return out[0], out[1]


def run_one(config: RunConfig) -> dict:
    """Optimise one configuration; its row (see the module docstring). Never raises: a
    failure is a row with ``error`` set."""
    try:
        row = _config_row(config)
    except Exception as e:  # noqa: BLE001 - a RunConfig built by hand with fields of the wrong kind
        return _failed(config, e)
    eggfuse_version, egglog_version = _versions()
    row.update(worker=f"{socket.gethostname()}:{os.getpid()}", eggfuse_version=eggfuse_version,
               egglog_version=egglog_version)
    token = None
    try:
        from eggfuse.graphs import describe, graph_hash, load_graph
        from eggfuse.ir.sources import SOURCE_FOLDER
        from eggfuse.rewrites import optimize
        from eggfuse.rewrites.roofline import cost_model_from_spec
        from eggfuse.rewrites.rulesets import select

        token = SOURCE_FOLDER.set(config.folder or None)
        source = config.source or config.model
        kind = describe(source)
        if kind != "onnx":
            row["shapes"] = ""  # shapes size ONNX files' inputs only
        if kind != "model":
            row["seq"] = row["batch"] = ""  # seq and batch size the shipped models only
        elif not str(source).startswith("minilm"):
            row["batch"] = ""  # (and batch MiniLM's alone)
        t = time.perf_counter()
        graph, _ = load_graph(source, seq=config.seq, batch=config.batch, training=config.training,
                              shapes={name: list(dims) for name, dims in config.shapes})
        row["load_s"] = time.perf_counter() - t
        names = config.rulesets.split(",") if config.rulesets else []
        # a rule left out keeps every ruleset; a ruleset left out (shipped, optional or one's own) is not among them
        rule_left_out = config.disabled and not _names_a_ruleset(config.disabled)
        rulesets = select(names, [config.disabled] if rule_left_out else [])
        cost_model = cost_model_from_spec(config.cost_source or config.cost_model)
        cpu = time.process_time()
        _, rep = optimize(graph, rulesets=rulesets, cost_model=cost_model,
                          extractor=config.extractor, match_limit=config.match_limit, no_decomp=config.no_decomp,
                          payoff=config.payoff, verify=config.verify, **dict(config.schedule))
        row["cpu_s"] = time.process_time() - cpu
        row.update(graph_hash=graph_hash(graph), graph_nodes=rep.nodes_before)
        for key in ("eclasses", "enodes", "iterations", "stop_reason", "insert_s", "analysis_s", "saturation_s",
                    "extraction_s", "rebuild_s", "total_s", "dispatches_before", "dispatches_after", "cost_before",
                    "cost_after", "bytes_before", "bytes_after"):
            row[key] = getattr(rep, key)
        row["kept"] = rep.extractor  # the extractor whose graph was kept (or "input (...)")
        for key in ("greedy_cost", "ilp_cost", "ilp_objective"):  # of the extractors that ran ("" for none)
            row[key] = "" if getattr(rep, key) is None else getattr(rep, key)
        row["rules_fired"] = sum(1 for n in rep.rules_fired.values() if n)
        if config.verify:
            row["verified_max_diff"] = rep.verified_max_diff
        if rep.rules is not None:
            row["rules_paid"] = sum(1 for r in rep.rules if r["saved_cost"] > 0)
            row["rulesets_paid"] = sum(1 for r in rep.rulesets if r["saved_cost"] > 0)
            row["payoff"] = ([{"kind": "ruleset", **r, "ruleset": r["name"]} for r in rep.rulesets]
                             + [{"kind": "rule", **r} for r in rep.rules if r["matches"]]
                             + [{"kind": "rule group", **r, "ruleset": "", "rules": list(r["rules"])}
                                for r in rep.rule_groups or ()])
    except Exception as e:  # noqa: BLE001 - a failed run is a row; the sweep goes on
        row["error"] = f"{type(e).__name__}: {e}".strip()
        row["error_trace"] = traceback.format_exc(limit=-3)
    finally:
        if token is not None:
            SOURCE_FOLDER.reset(token)
    return row


def _names_a_ruleset(name: str) -> bool:
    # a shipped or optional ruleset's name, or the module:NAME / file.py:NAME of one's own (a rule's name else)
    from eggfuse.rewrites.rulesets import OPTIONAL, SCHEDULE, select

    if name in SCHEDULE or name in OPTIONAL:
        return True
    try:
        select([name], rulesets=())
    except Exception:  # noqa: BLE001 - not a ruleset: a rule's name (an unknown one fails its row there)
        return False
    return True


def _config_row(config: RunConfig) -> dict:
    """A row's configuration columns: the config's fields, ``source``/``cost_source`` as loaded."""
    row = {c: "" for c in COLUMNS} | asdict(config)
    for key in ("payoff", "folder"):
        row.pop(key)
    row.update(source=config.source or config.model, cost_source=config.cost_source or config.cost_model,
               shapes=_shapes_text(config.shapes), schedule=_schedule_text(config.schedule))
    return row


def _schedule_text(schedule: tuple) -> str:
    # the further optimize() keywords as NAME=VALUE joined by ";" ("" for none)
    return ";".join(f"{name}={value}" for name, value in schedule)


def _shapes_text(shapes: tuple) -> str:
    return ";".join(f"{name}={dims_text(dims)}" for name, dims in shapes)


def _failed(config: RunConfig, e: BaseException) -> dict:
    """The row of a run that failed before :func:`run_one` could answer (a worker died, a config it could
    not read, ...): the config's fields as they are."""
    row = {c: "" for c in COLUMNS}
    for key in row:
        if hasattr(config, key):
            row[key] = getattr(config, key)
    row["source"] = getattr(config, "source", "") or getattr(config, "model", "")
    row["cost_source"] = getattr(config, "cost_source", "") or getattr(config, "cost_model", "")
    row["shapes"] = repr(getattr(config, "shapes", ""))
    row["schedule"] = repr(getattr(config, "schedule", ""))
    try:
        row["shapes"] = _shapes_text(config.shapes)
        row["schedule"] = _schedule_text(config.schedule)
    except Exception:  # noqa: BLE001 - not name/dims pairs: shown as given
        pass
    row["error"] = f"{type(e).__name__}: {e}".strip() or type(e).__name__
    return row


def run_sweep(configs: Sequence[RunConfig], *, workers: int | None = None, scheduler: str | None = None,
              progress: bool = True, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every configuration; rows in the order of ``configs``. A configuration whose sources
    :func:`grid` did not resolve (no ``folder``) is resolved here first, against the current folder.

    Local (default): a process pool of ``workers`` processes (default: the CPU count), started
    with ``spawn``, each running one compile at a time and keeping the graphs it built. ``spawn`` imports
    the calling script again in each worker: a script calls this under ``if __name__ == "__main__":``.
    ``scheduler``: the address of a Dask distributed scheduler (``tcp://HOST:PORT``); its
    workers need eggfuse installed. ``progress`` draws a tqdm bar on stderr; ``on_row`` is
    called with each row as it arrives. Raises :class:`~eggfuse.ir.InputError` for both
    ``workers`` and ``scheduler``, a scheduler that does not answer, a local pool whose workers died before
    any run finished (a script without the ``__main__`` guard), and a call from a worker process importing
    such a script.
    """
    import multiprocessing

    from eggfuse.ir import InputError

    if getattr(multiprocessing.current_process(), "_inheriting", False):  # a spawned worker importing the script
        raise InputError(_UNGUARDED)
    if workers is not None and scheduler is not None:
        raise InputError("give either workers (a local pool) or scheduler (a Dask cluster), not both")
    if workers is not None and workers < 1:
        raise InputError(f"workers must be at least 1, got {workers}")
    folder = os.getcwd()
    configs = [_resolved(c, folder) for c in configs]
    rows: list[dict | None] = [None] * len(configs)
    bar = _bar(len(configs), progress)
    with _executor(workers, scheduler) as (submit, completed):
        futures = {submit(run_one, c): i for i, c in enumerate(configs)}
        for fut in completed(list(futures)):
            i = futures[fut]
            try:
                row = fut.result()
            except Exception as e:  # noqa: BLE001 - the worker itself failed
                row = _failed(configs[i], e)
                if type(e).__name__ == "BrokenProcessPool":  # (concurrent.futures.process)
                    if all(r is None for r in rows):  # no run finished: no rows to keep, and say why
                        raise InputError(f"the sweep's worker processes died before any run finished: {_UNGUARDED}; "
                                         "else a worker was killed (out of memory?)") from e
                    # (a script without the guard finishes no run: not the cause here)
                    row["error"] += " (a worker process died, killed or out of memory, before this run finished)"
            rows[i] = row
            if on_row is not None:
                on_row(row)
            bar.update(1)
            if row["error"]:
                bar.set_postfix_str(f"{sum(1 for r in rows if r and r['error'])} failed", refresh=False)
    bar.close()
    return rows  # type: ignore[return-value]


_UNGUARDED = ("a script that runs a sweep on the local pool needs its code under `if __name__ == \"__main__\":`, "
              "since each worker process imports the script again")


def _resolved(config: RunConfig, folder: str) -> RunConfig:
    """``config`` with its sources resolved here, where :func:`grid` did not (a RunConfig made by hand)."""
    if config.folder or not isinstance(config.model, str) or not isinstance(config.cost_model, str):
        return config
    return dataclasses.replace(config, source=config.source or resolve(config.model, folder),
                               cost_source=config.cost_source or resolve_cost_model(config.cost_model, folder),
                               folder=folder)


class _executor:
    """(submit, as_completed) of a spawn process pool or of a Dask client, as a context manager."""

    def __init__(self, workers: int | None, scheduler: str | None) -> None:
        self.workers, self.scheduler = workers, scheduler

    def __enter__(self):
        if self.scheduler is not None:
            from eggfuse.ir import InputError

            try:
                from distributed import Client, as_completed
            except ImportError as e:
                raise InputError("--scheduler needs Dask distributed: pip install 'eggfuse[sweep]'") from e
            try:
                self.client = Client(self.scheduler, timeout=30)
            except OSError as e:
                raise InputError(f"no Dask scheduler answers at {self.scheduler}: {e}") from e
            except ValueError as e:  # distributed's parse of the address
                raise InputError(f"{self.scheduler!r} is not a Dask scheduler's address ({e}); give "
                                 "tcp://HOST:PORT, as `dask scheduler` prints it") from e
            return (lambda fn, c: self.client.submit(fn, c, pure=False)), as_completed
        import concurrent.futures as cf
        import multiprocessing

        self.pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self.pool.submit, cf.as_completed

    def __exit__(self, *exc) -> None:
        if self.scheduler is not None:
            self.client.close()
        else:
            self.pool.shutdown(cancel_futures=True)


def _bar(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        class _Quiet:
            def update(self, n: int) -> None: ...
            def set_postfix_str(self, *a, **k) -> None: ...
            def close(self) -> None: ...
        return _Quiet()
    return tqdm(total=total, unit="run", desc="sweep", dynamic_ncols=True)


def write_results(rows: Iterable[dict], out: str | Path) -> tuple[Path, Path]:
    """``out/results.csv`` (the :data:`COLUMNS`, one row per run) and ``out/results.json`` (a
    list of the rows, with the error's traceback where a run failed). Returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    csv_path, json_path = out / "results.csv", out / "results.json"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    json_path.write_text(json.dumps(rows, indent=1, default=str))
    return csv_path, json_path


def write_payoff(rows: Sequence[dict], out: str | Path) -> Path | None:
    """``out/payoff.csv``: one row per ruleset, matched rule and rule group of each run that has a payoff
    (:data:`PAYOFF_COLUMNS`; a rule group's ``name`` is ``rules building OP``, its ``ruleset`` empty), with the
    run's index, model and configuration label. Returns its path, or None (no file) where no row has a
    payoff (a sweep without ``payoff``)."""
    entries = []
    for i, row in enumerate(rows):
        for p in row.get("payoff") or ():
            entries.append({"run": i, **{k: row.get(k, "") for k in PAYOFF_COLUMNS[1:]}, "configuration": label(row),
                            **p})
    if not entries:
        return None
    path = Path(out) / "payoff.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=PAYOFF_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(entries)
    return path


def payoff_table(rows: Sequence[dict]) -> str:
    """A text table of what each ruleset saves, per model and configuration (runs with ``payoff`` only; empty
    text where none has one): matches, saved dispatches, saved cost in the cost model's unit, and ``cut``, the
    share of the cost without the ruleset that it removes (saved / (cost after + saved); ``n/a`` where the
    ruleset saves nothing or raises the cost), medians over repeats. Rulesets that matched nothing are left
    out. A saving says nothing of soundness (``verify``)."""
    import statistics

    from eggfuse.rewrites.report import cost_text

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("payoff") and not r["error"]:
            groups.setdefault((r["model"], label(r)), []).append(r)
    if not groups:
        return ""
    mw = max([12, *(len(str(m)) for m, _ in groups)])
    lw = max([34, *(len(lab) for _, lab in groups)])
    nw = max([22, *(len(p["name"]) for rs in groups.values() for r in rs for p in r["payoff"]
                    if p["kind"] == "ruleset")])
    lines = [f"{'model':<{mw}} {'configuration':<{lw}} {'ruleset':<{nw}} {'matches':>8} {'dispatches':>10} "
             f"{'saved cost':>14} {'cut':>8}"]
    for (model, lab), rs in groups.items():
        names = list(dict.fromkeys(p["name"] for r in rs for p in r["payoff"] if p["kind"] == "ruleset"))
        for name in names:
            sets = [next(p for p in r["payoff"] if p["kind"] == "ruleset" and p["name"] == name) for r in rs]
            if not any(p["matches"] for p in sets):
                continue
            saved = statistics.median(p["saved_cost"] for p in sets)
            cuts = [p["saved_cost"] / (float(r["cost_after"]) + p["saved_cost"]) for p, r in zip(sets, rs, strict=True)
                    if p["saved_cost"] > 0]
            share = f"{100 * statistics.median(cuts):7.1f}%" if len(cuts) == len(sets) else f"{'n/a':>8}"
            lines.append(f"{model:<{mw}} {lab:<{lw}} {name:<{nw}} {sets[0]['matches']:>8} "
                         f"{statistics.median(p['saved_dispatches'] for p in sets):>10g} "
                         f"{cost_text(saved):>14} {share}")
    return "\n".join(lines)


def label(row: dict) -> str:
    """A configuration's short label for tables and plots: ruleset choice, cost model, extractor, then what is
    not the default among match limit, decomposition, training, seq, batch, shapes and schedule (so that
    :func:`table` merges only repeats of one configuration)."""
    from eggfuse.rewrites.rulesets import SCHEDULE

    names = row["rulesets"].split(",") if row["rulesets"] else []
    full = names[:len(SCHEDULE)] == list(SCHEDULE)
    disabled = row["disabled"]
    if disabled:
        shipped = [n for n in names if n in SCHEDULE]
        extra = [n for n in names if n not in SCHEDULE]
        # the schedule less what was left out, and the rulesets added to it (ablate,mine: "-algebraic +mine" is
        # not "-algebraic")
        rest = set(SCHEDULE) - set(shipped) - {disabled}
        sets = (f"-{disabled}" if not rest else f"{','.join(shipped) or 'none'} -{disabled}") + (
            f" +{','.join(extra)}" if extra else "")
    else:
        sets = "+".join(["all", *names[len(SCHEDULE):]]) if full else row["rulesets"] or "none"
    # (rows of results.json or of results.csv, whose values are text)
    extra = "" if str(row.get("match_limit", "")) in ("", "20000") else f" ml{row['match_limit']}"
    extra += " decomp" if str(row.get("no_decomp")) == "False" else ""
    # what sizes or schedules the graph where not the default: runs that differ in it are not repeats
    extra += " training" if row.get("training") is True or row.get("training") == "True" else ""
    extra += "" if str(row.get("seq", "")) in ("", "16") else f" seq{row['seq']}"
    extra += "" if str(row.get("batch", "")) in ("", "2") else f" batch{row['batch']}"
    extra += f" {row['shapes']}" if row.get("shapes") else ""
    extra += f" {row['schedule']}" if row.get("schedule") else ""
    return f"{sets} {row['cost_model']} {row['extractor']}{extra}"


def table(rows: Sequence[dict]) -> str:
    """A text table of the runs: configuration, dispatches, cost, total seconds (median over repeats)."""
    import statistics

    from eggfuse.rewrites.report import cost_text

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], label(r)), []).append(r)
    mw = max([12, *(len(str(m)) for m, _ in groups)])  # columns as wide as the longest name
    lw = max([34, *(len(lab) for _, lab in groups)])
    lines = [f"{'model':<{mw}} {'configuration':<{lw}} {'dispatches':>12} {'cost after':>16} {'total_s':>8}  error"]
    for (model, lab), rs in groups.items():
        ok = [r for r in rs if not r["error"]]
        if not ok:
            lines.append(f"{model:<{mw}} {lab:<{lw}} {'':>12} {'':>16} {'':>8}  {rs[0]['error'][:60]}")
            continue
        r = ok[0]
        t = statistics.median(float(x["total_s"]) for x in ok)
        lines.append(f"{model:<{mw}} {lab:<{lw}} {r['dispatches_before']:>5} ->{r['dispatches_after']:>4} "
                     f"{cost_text(r['cost_after']):>16} {t:>8.3f}")
    return "\n".join(lines)


#: The numeric columns :func:`plot` draws.
_PLOTTED = ("enodes", "total_s", "insert_s", "analysis_s", "saturation_s", "extraction_s", "rebuild_s",
            "dispatches_after", "bytes_after")


def read_results(out: str | Path) -> list[dict]:
    """The rows a sweep wrote to ``out/results.json`` (:func:`write_results`), values as they were (numbers as
    numbers, unlike ``results.csv``'s text): for :func:`table`, :func:`payoff_table` and :func:`plot` again.
    Raises :class:`~eggfuse.ir.InputError` where the file is missing or is not a sweep's results."""
    from eggfuse.ir import InputError

    path = Path(out) / "results.json"
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path} does not exist: give the folder a sweep wrote (its --out)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} cannot be read as a sweep's results: {e}") from None
    if not isinstance(rows, list) or any(not isinstance(r, dict) or not {"model", "error"} <= set(r) for r in rows):
        raise InputError(f"{path} is not a sweep's results: a list of rows with the columns of sweep.COLUMNS")
    return rows


def plot(rows: Sequence[dict], out: str | Path) -> list[Path]:
    """PNGs under ``out``: ``compile_time.png`` (total seconds against e-nodes, per model and
    extractor), ``phases.png`` (median seconds per phase, per model and extractor) and
    ``dispatches_bytes.png`` (dispatches and bytes after optimisation per configuration,
    per model). Failed runs are left out; the folder is made if need be. ``rows`` as :func:`run_sweep`,
    :func:`read_results` or ``csv.DictReader`` over ``results.csv`` give them. Raises ImportError without
    matplotlib."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the rows of run_sweep or read_results; those of results.csv hold text: the plotted columns as numbers
    ok = [{**r, **{k: float(r[k]) for k in _PLOTTED}} for r in rows if not r["error"]]
    paths = []
    models = list(dict.fromkeys(r["model"] for r in ok))
    extractors = list(dict.fromkeys(r["extractor"] for r in ok))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for x in extractors:
        rs = [r for r in ok if r["extractor"] == x]
        ax.scatter([r["enodes"] for r in rs], [r["total_s"] for r in rs], label=x, alpha=0.7)
    for m in models:
        rs = [r for r in ok if r["model"] == m]
        ax.annotate(m, (max(r["enodes"] for r in rs), max(r["total_s"] for r in rs)), fontsize=8)
    ax.set_xlabel("e-nodes after saturation")
    ax.set_ylabel("optimisation time, s (total_s)")
    ax.set_title("compile time against e-graph size")
    ax.legend(title="extractor")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "compile_time.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    phases = ("insert_s", "analysis_s", "saturation_s", "extraction_s", "rebuild_s")
    keys = [(m, x) for m in models for x in extractors if any(r["model"] == m and r["extractor"] == x for r in ok)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys)), 4.5))
    bottom = [0.0] * len(keys)
    for ph in phases:
        vals = [statistics.median(float(r[ph]) for r in ok if (r["model"], r["extractor"]) == k) for k in keys]
        ax.bar(range(len(keys)), vals, bottom=bottom, label=ph[:-2])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(keys)), [f"{m}\n{x}" for m, x in keys], fontsize=8)
    ax.set_ylabel("seconds (median over configurations)")
    ax.set_title("where the optimisation time goes")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "phases.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    labels = list(dict.fromkeys(label(r) for r in ok))
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 0.45 * len(labels)), 7), sharex=True)
    width = 0.8 / max(1, len(models))
    for k, m in enumerate(models):
        by = {label(r): r for r in ok if r["model"] == m}
        xs = [i + k * width for i, lab in enumerate(labels) if lab in by]
        axes[0].bar(xs, [by[lab]["dispatches_after"] for lab in labels if lab in by], width, label=m)
        axes[1].bar(xs, [by[lab]["bytes_after"] / 1e6 for lab in labels if lab in by], width, label=m)
    axes[0].set_ylabel("dispatches after")
    axes[1].set_ylabel("MB read + written after")
    axes[0].set_title("dispatches and bytes per configuration")
    axes[0].legend()
    axes[1].set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(labels))], labels, rotation=60,
                       ha="right", fontsize=7)
    fig.tight_layout()
    paths.append(out / "dispatches_bytes.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


__all__ = ["COLUMNS", "OUTPUTS", "PAYOFF_COLUMNS", "RULESET_MODES", "RunConfig", "grid", "label", "payoff_table",
           "plot", "read_results", "resolve", "resolve_cost_model", "run_one", "run_sweep", "table", "write_payoff",
           "write_results"]
