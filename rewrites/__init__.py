"""Rewrites: graphs encoded into egglog, the rulesets the op families declare, cost model and
DAG extraction.

The names below load on first use (PEP 562), so that a module which needs only plain data of
this stage (``report``: :class:`Report`; the cost models ``cost`` and ``roofline``) does not
import egglog: a compiled graph loaded from the compile cache runs without the rewrite engine
being imported, and pricing a plan works on a machine without egglog (``bench/cost_model.py``
on the GPU machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "CostModel": "cost", "KernelInfo": "cost", "DeviceProfile": "roofline", "RooflineCostModel": "roofline",
    "Report": "report",
    "EXTRACTORS": "engine", "optimize": "engine", "random_feeds": "engine", "verify_equivalent": "engine",
    "SCHEDULE": "rulesets", "catalog": "rulesets", "make_ruleset": "rulesets", "optimization_rulesets": "rulesets",
    "select": "rulesets",
}

if TYPE_CHECKING:
    from .cost import CostModel, KernelInfo
    from .engine import EXTRACTORS, optimize, random_feeds, verify_equivalent
    from .report import Report
    from .roofline import DeviceProfile, RooflineCostModel
    from .rulesets import SCHEDULE, catalog, make_ruleset, optimization_rulesets, select


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["EXTRACTORS", "SCHEDULE", "CostModel", "DeviceProfile", "KernelInfo", "Report", "RooflineCostModel",
           "catalog", "make_ruleset", "optimization_rulesets", "optimize", "random_feeds", "select",
           "verify_equivalent"]
