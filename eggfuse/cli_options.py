"""The rewrite engine's options shared by ``eggfuse optimize`` and ``eggfuse sweep``: rule
selection and ablation, cost model, extractor, egglog scheduler settings."""

from __future__ import annotations

import argparse

from eggfuse.ir import InputError


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:  # an empty --rulesets ran no optimisation ruleset at all
        raise argparse.ArgumentTypeError(f"expected comma-separated ruleset names, got {text!r} ('all' for every "
                                         "scheduled one; `eggfuse rules` lists them)")
    return names


#: --match-limit's default (egglog's back-off scheduler's match limit, optimize's own)
MATCH_LIMIT = 20_000


def add_engine_options(p: argparse.ArgumentParser, *, grid: bool = False) -> None:
    """Add the selection and scheduler options to ``p``. With ``grid`` (the sweep) the
    ruleset, cost-model and extractor options are lists, added by the sweep itself."""
    if not grid:
        p.add_argument("--rulesets", metavar="NAME,NAME", type=_names,
                       help="run only these optimisation rulesets (`eggfuse rules` lists them; 'all' stands for the "
                            "scheduled ones, the default); a ruleset of your own (make_ruleset) as module:NAME or "
                            "file.py:NAME: all,mymodule:MINE")
        p.add_argument("--disable-rule", metavar="NAME", action="append", default=[],
                       help="leave out one rule, named as `eggfuse rules` lists it (repeatable)")
        p.add_argument("--with-ruleset", metavar="NAME", action="append", default=[],
                       help="also run an optional ruleset, not run by default (repeatable): layer_norm_prologue "
                            "(a LayerNorm as the next product's prologue: one dispatch fewer a product, measured "
                            "slower on an H200), gathered_products (GatheredBatchMatMul: a gather of a product's "
                            "elements computed alone, measured slower on an H100), or a ruleset of your own "
                            "(make_ruleset) as module:NAME or file.py:NAME, on top of the default ones")
        p.add_argument("--cost-model", metavar="MODEL", default="bytes",
                       help="bytes (default: byte-equivalents), roofline (h200 profile), roofline:PROFILE, or "
                            "module:Class or file.py:Class (a CostModel subclass)")
        p.add_argument("--extractor", choices=["ilp", "greedy", "compare"], default="ilp",
                       help="ilp: optimal (default); greedy; compare: both, reporting the gap")
    s = p.add_argument_group("egglog schedule")
    s.add_argument("--match-limit", type=int, default=MATCH_LIMIT,
                   help="back-off: a rule matching more often in one pass is banned for a while (default 20000)")
    s.add_argument("--ban-length", type=int, default=5, help="back-off: passes a banned rule sits out (default 5)")
    s.add_argument("--max-iterations", type=int, default=50, help="passes at most (default 50)")
    s.add_argument("--max-enodes", type=int, default=200_000, help="stop above this many e-nodes (default 200000)")
    s.add_argument("--time-limit", type=float, default=60.0, help="saturation time budget, seconds (default 60)")
    s.add_argument("--decomp", dest="no_decomp", action="store_false",
                   help="run egglog's queries with its decomposition into sub-queries (EGraph(no_decomp=False)); "
                   "the default is no_decomp=True, faster on every shipped graph")
    s.add_argument("--no-decomp", dest="no_decomp", action="store_true", default=True,
                   help="egglog's EGraph(no_decomp=True) (the default)")


def refuse_f16(names, precision: str = "f32") -> None:
    """InputError where ``names`` (of --rulesets or --with-ruleset) holds f16, which --precision f16 runs."""
    if "f16" in names:
        raise InputError("--precision f16 runs the f16 ruleset already: leave f16 out of the ruleset names"
                         if precision == "f16" else
                         "the f16 ruleset rounds weights to float16: ask for it with --precision f16")


def schedule_kwargs(args: argparse.Namespace) -> dict:
    """The scheduler keywords of ``eggfuse.rewrites.optimize`` from parsed options."""
    for name in ("match_limit", "ban_length", "max_iterations", "max_enodes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.time_limit > 0:  # (NaN too)
        raise InputError(f"--time-limit must be positive, got {args.time_limit}")
    return dict(match_limit=args.match_limit, ban_length=args.ban_length, max_iterations=args.max_iterations,
                max_enodes=args.max_enodes, time_limit_s=args.time_limit, no_decomp=args.no_decomp)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """``eggfuse.rewrites.optimize`` keywords (rulesets, cost model, extractor, schedule) of ``optimize``'s options."""
    from eggfuse.rewrites.roofline import cost_model_from_spec
    from eggfuse.rewrites.rulesets import select

    kw = schedule_kwargs(args)
    refuse_f16([*args.with_ruleset, *(args.rulesets or ())], getattr(args, "precision", "f32"))
    if args.rulesets is not None or args.disable_rule or args.with_ruleset:
        kw["rulesets"] = select(args.rulesets, args.disable_rule, optional=args.with_ruleset,
                                precision=getattr(args, "precision", "f32"))
    return dict(kw, cost_model=cost_model_from_spec(args.cost_model), extractor=args.extractor)


__all__ = ["add_engine_options", "engine_kwargs", "schedule_kwargs"]
