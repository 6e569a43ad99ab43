"""``eggfuse sweep``: a grid of compile-time experiments, locally or on a Dask cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eggfuse.cli_onnx import _shape_arg, shape_map
from eggfuse.cli_options import MATCH_LIMIT, add_engine_options, schedule_kwargs
from eggfuse.ir import InputError


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in _list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _positive_ints(text: str) -> list[int]:
    values = _ints(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers of 1 or more, got {text!r}")
    return values


def cmd_sweep(args: argparse.Namespace) -> None:
    import inspect

    from eggfuse import sweep
    from eggfuse.rewrites.engine import saturate

    # --match-limit and --no-decomp/--decomp (optimize's) beside their grid forms: refused, not one side dropped
    if args.match_limits is not None and args.match_limit is not None:
        raise InputError(f"--match-limit {args.match_limit} and --match-limits {','.join(map(str, args.match_limits))} "
                         "both set the match limit: give one (--match-limits N for one value)")
    if args.no_decomp_values is not None and args.no_decomp is not None:
        flag = "--no-decomp" if args.no_decomp else "--decomp"
        raise InputError(f"{flag} and --no-decomp-values {args.no_decomp_values} both set egglog's no_decomp: give "
                         "one (--no-decomp-values off, on or both)")
    match_limits = args.match_limits or [MATCH_LIMIT if args.match_limit is None else args.match_limit]
    no_decomp = args.no_decomp_values or {None: "on", True: "on", False: "off"}[args.no_decomp]
    schedule = schedule_kwargs(argparse.Namespace(**{**vars(args), "match_limit": match_limits[0], "no_decomp": True}))
    schedule.pop("match_limit")
    schedule.pop("no_decomp")
    # only the options given other values than optimize's own: the rows' schedule, and their labels, name those
    defaults = {k: p.default for k, p in inspect.signature(saturate).parameters.items()}
    schedule = {k: v for k, v in schedule.items() if k not in defaults or defaults[k] != v}
    nd = {"off": [False], "on": [True], "both": [False, True]}[no_decomp]
    if args.repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {args.repeats}")
    configs = sweep.grid(args.models, args.rulesets or ["all"], args.cost_models, args.extractors,
                         match_limits, nd, repeats=args.repeats, seq=args.seq,
                         batch=args.batch, training=args.training, payoff=args.payoff, verify=args.verify,
                         shapes=tuple(sorted((name, tuple(dims)) for name, dims in shape_map(args.shape).items())),
                         schedule=tuple(sorted(schedule.items())))
    out = Path(args.out)
    if out.exists() and not out.is_dir():  # before the runs, not after them
        raise InputError(f"--out {args.out!r} is a file: the sweep writes results.csv and results.json into a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".eggfuse-sweep-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise InputError(f"--out {args.out!r}: cannot write there ({e.strerror or e}); give a folder you can "
                         "write") from None
    rows = sweep.run_sweep(configs, workers=args.workers, scheduler=args.scheduler, progress=not args.no_progress)
    # an earlier sweep's files there, once this one has rows to write: removed, so that none this sweep does not
    # write (payoff.csv without --payoff, the PNGs with --no-plots) is read as its own
    stale = [out / name for name in sweep.OUTPUTS if (out / name).is_file()]
    for path in stale:
        path.unlink()
    if stale:
        print(f"note: replaced an earlier sweep's files in {out}: {', '.join(p.name for p in stale)}", file=sys.stderr)
    csv_path, json_path = sweep.write_results(rows, args.out)
    written = [csv_path, json_path]
    payoff_path = sweep.write_payoff(rows, args.out)
    if payoff_path is not None:
        written.append(payoff_path)
    failed = sum(1 for r in rows if r["error"])
    if not args.no_plots and len(rows) > failed:
        try:
            written += sweep.plot(rows, args.out)
        except ImportError:
            print("matplotlib is not installed: no plots (pip install 'eggfuse[sweep]')", file=sys.stderr)
    if args.json:
        print(json.dumps({"runs": len(rows), "failed": failed, "files": [str(p) for p in written]}))
    else:
        print(sweep.table(rows))
        if args.payoff and (paid := sweep.payoff_table(rows)):
            print("\nsaved by each ruleset (optimised again without it, minus with everything"
                  + ("; outputs verified" if args.verify else "; not whether it is sound: --verify checks that")
                  + "):")
            print(paid)
        print(f"{len(rows)} runs, {failed} failed; written: {', '.join(str(p) for p in written)}")
    if rows and failed == len(rows):  # a script must not take an empty sweep for results
        first = rows[0]["error"].strip().splitlines()[-1] if rows[0]["error"].strip() else "?"
        raise InputError(f"every run of the sweep failed (the first: {first}); the rows and their tracebacks are "
                         f"in {json_path}")


def add_sweep(sub) -> None:
    """Register ``sweep`` on the CLI's subparsers."""
    s = sub.add_parser("sweep", help="optimise a grid of graphs x rulesets x cost models x extractors, in parallel")
    s.add_argument("--models", type=_list, required=True, metavar="M1,M2",
                   help="graphs, each once: minilm, smollm2, llama:LAYERS, .onnx files, module:function, "
                        "file.py:function (paths and modules of the current folder, also on a Dask cluster)")
    s.add_argument("--rulesets", action="append", metavar="all|ablate|ablate-rules|NAME,NAME",
                   help="all (default); ablate: all, then each ruleset left out; ablate-rules: each rule left out "
                        "(both take further rulesets: ablate,mymodule:MINE); or the rulesets to run, optional ones "
                        "and your own (make_ruleset; module:NAME or file.py:NAME) included: "
                        "all,layer_norm_prologue,mymodule:MINE. Repeat it to sweep several selections: "
                        "--rulesets all --rulesets all,mymodule:MINE")
    s.add_argument("--cost-models", type=_list, default=["bytes"], metavar="bytes,roofline",
                   help="cost models (bytes, roofline, roofline:PROFILE, module:Class; default bytes)")
    s.add_argument("--extractors", type=_list, default=["ilp"], metavar="ilp,greedy", help="default ilp")
    s.add_argument("--match-limits", type=_positive_ints, metavar="N,N", help="back-off match limits to sweep")
    s.add_argument("--no-decomp-values", choices=["off", "on", "both"],
                   help="egglog's EGraph(no_decomp=...), whether its queries skip their decomposition into "
                        "sub-queries: on (True, optimize's default), off (False), or both (each point twice)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, help="local worker processes (default: the CPU count)")
    where.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="a Dask distributed scheduler's address")
    s.add_argument("--out", required=True, metavar="DIR",
                   help="writes DIR/results.csv, results.json, payoff.csv and the PNGs (an earlier sweep's there "
                        "replaced)")
    s.add_argument("--seq", type=int, default=16, help="tokens per sequence (default 16)")
    s.add_argument("--batch", type=int, default=2, help="sentences per batch, minilm only (default 2)")
    s.add_argument("--shape", metavar="NAME=DxD...", type=_shape_arg, action="append",
                   help="an ONNX input's shape where a file leaves dimensions symbolic (default 1), for every .onnx "
                        "file of --models that has the input (a name no such file has is refused)")
    s.add_argument("--training", action="store_true", help="the forward + backward graphs")
    s.add_argument("--repeats", type=int, default=1, help="runs of each configuration (default 1)")
    s.add_argument("--payoff", action="store_true",
                   help="also what each ruleset and rule saves in each run (rules_paid, rulesets_paid, DIR/payoff.csv "
                        "and a table; one more optimisation per ruleset and matched rule)")
    s.add_argument("--verify", action="store_true",
                   help="compare each run's extracted graph's outputs with the input graph's (numpy reference, "
                        "random inputs): a difference fails the run (an unsound rule's saving is not a result)")
    s.add_argument("--no-plots", action="store_true", help="CSV and JSON only")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true", help="print one JSON object (runs, failed, files)")
    add_engine_options(s, grid=True)
    s.set_defaults(func=cmd_sweep, match_limit=None, no_decomp=None)  # None: not given (see cmd_sweep)


__all__ = ["add_sweep"]
