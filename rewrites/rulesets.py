"""The rulesets, built from the rule groups the op families register (``ir.spec.rules``).

:data:`SCHEDULE` lists the optimisation rulesets in the order one pass runs them; the
analysis ruleset (facts the guards read) is saturated between passes. A rule group naming a
ruleset not listed here is refused, naming the group's function and family. Everything is
built once per process, on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from egglog import Ruleset, ruleset

from ..ir import RULES, RewriteError
from .dsl import Namespace, RuleRecord

#: The optimisation rulesets, in schedule order.
SCHEDULE = ("algebraic", "swiglu", "matmul_epilogue", "norm_fusion", "attention")
#: The ruleset of analysis rules: facts, saturated before every optimisation pass.
ANALYSIS = "analysis"


@functools.cache
def _built() -> tuple[dict[str, Ruleset], tuple[RuleRecord, ...]]:
    ns = Namespace()
    by_name = {name: ruleset(name=name) for name in (ANALYSIS, *SCHEDULE)}
    for group in RULES:
        if group.ruleset not in by_name:
            fn = f"{group.fn.__module__}.{group.fn.__qualname__}"
            raise RewriteError(f"the rule group {fn} (family {group.family or '?'}) registers rules for ruleset "
                               f"{group.ruleset!r}, which is not scheduled; rulesets: {', '.join(by_name)} "
                               "(rewrites/rulesets.py SCHEDULE)")
        ns.ruleset, ns.family = group.ruleset, group.family
        for r in group.fn(ns):
            by_name[group.ruleset].register(r)
    return by_name, tuple(ns.records)


def rulesets() -> dict[str, Ruleset]:
    """Ruleset name -> egglog ruleset: the analysis ruleset, then :data:`SCHEDULE`."""
    return _built()[0]


def optimization_rulesets() -> tuple[Ruleset, ...]:
    """The optimisation rulesets in schedule order (what :func:`~.engine.optimize` runs by default)."""
    by_name = rulesets()
    return tuple(by_name[name] for name in SCHEDULE)


def analysis_ruleset() -> Ruleset:
    return rulesets()[ANALYSIS]


def rule_records() -> tuple[RuleRecord, ...]:
    """Every shipped rule (name, ruleset, family, soundness example), in registration order."""
    return _built()[1]


def make_ruleset(name: str, fn: Callable[[Namespace], Iterable[Any]]) -> Ruleset:
    """An egglog ruleset of the rules ``fn(e)`` yields, written as the shipped rule groups are
    (``e`` is a :class:`~.dsl.Namespace`): a rule of your own without editing eggfuse. Pass it to
    ``optimize(..., rulesets=[*optimization_rulesets(), mine])``."""
    ns = Namespace()
    ns.ruleset, ns.family = name, "user"
    rs = ruleset(name=name)
    for r in fn(ns):
        rs.register(r)
    return rs


def catalog() -> dict[str, list[str]]:
    """Ruleset name -> rule names, analysis first, then the optimisation rulesets in schedule order."""
    out: dict[str, list[str]] = {name: [] for name in (ANALYSIS, *SCHEDULE)}
    for r in rule_records():
        out[r.ruleset].append(r.name)
    return out


__all__ = ["ANALYSIS", "SCHEDULE", "analysis_ruleset", "catalog", "make_ruleset", "optimization_rulesets",
           "rule_records", "rulesets"]
