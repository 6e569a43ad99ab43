"""Every shipped rule, by ruleset: what ``eggfuse rules`` lists."""

from __future__ import annotations

from egglog import Ruleset

from .analysis import shape_analysis_ruleset
from .engine import OPTIMIZATION_RULESETS


def rule_names(ruleset: Ruleset) -> list[str]:
    """The names of the rules registered in ``ruleset`` (``lhs -> rhs`` for optimisation rules)."""
    decls = ruleset.__egg_decls__
    rules = decls._rulesets[ruleset.__egg_ident__].rules
    return [getattr(r, "name", None) or f"(unnamed {type(r).__name__})" for r in rules]


def catalog() -> dict[str, list[str]]:
    """Ruleset name -> rule names, analysis first, then the optimisation rulesets in schedule order."""
    return {rs.__egg_ident__.name: rule_names(rs) for rs in (shape_analysis_ruleset, *OPTIMIZATION_RULESETS)}
