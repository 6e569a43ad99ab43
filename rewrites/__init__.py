"""Rewrites: graphs encoded into egglog, the rulesets the op families declare, cost model and
DAG extraction.

The cost models (``cost``, ``roofline``) need only the IR; everything else loads egglog, on
first use of a name below, so that pricing a plan works on a machine without egglog
(``bench/cost_model.py`` on the GPU machine)."""

from .cost import CostModel, KernelInfo
from .roofline import DeviceProfile, RooflineCostModel

_LAZY = {
    "EXTRACTORS": "engine", "Report": "engine", "optimize": "engine", "random_feeds": "engine",
    "verify_equivalent": "engine",
    "SCHEDULE": "rulesets", "catalog": "rulesets", "make_ruleset": "rulesets", "optimization_rulesets": "rulesets",
    "select": "rulesets",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EXTRACTORS", "SCHEDULE", "CostModel", "DeviceProfile", "KernelInfo", "Report", "RooflineCostModel",
           "catalog", "make_ruleset", "optimization_rulesets", "optimize", "random_feeds", "select",
           "verify_equivalent"]
