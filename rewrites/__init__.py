"""Rewrites: graphs encoded into egglog, fusion rulesets, cost model and DAG extraction."""

from .cost import CostModel, KernelInfo
from .engine import OPTIMIZATION_RULESETS, Report, optimize, random_feeds, verify_equivalent

__all__ = ["OPTIMIZATION_RULESETS", "CostModel", "KernelInfo", "Report", "optimize", "random_feeds",
           "verify_equivalent"]
