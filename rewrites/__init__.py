"""Rewrites: graphs encoded into egglog, the rulesets the op families declare, cost model and
DAG extraction."""

from .cost import CostModel, KernelInfo
from .engine import EXTRACTORS, Report, optimize, random_feeds, verify_equivalent
from .rulesets import SCHEDULE, catalog, make_ruleset, optimization_rulesets

__all__ = ["EXTRACTORS", "SCHEDULE", "CostModel", "KernelInfo", "Report", "catalog", "make_ruleset",
           "optimization_rulesets", "optimize", "random_feeds", "verify_equivalent"]
