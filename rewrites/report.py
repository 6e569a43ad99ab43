"""What an optimisation did: :class:`Report` and its :class:`Phase` entries.

Plain data without egglog, so that a report stored with a compiled graph (``eggfuse.cache``)
loads without the rewrite engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Phase:
    """One phase of an optimisation: wall-clock seconds and the e-graph's size after it."""

    seconds: float
    eclasses: int
    enodes: int


@dataclass
class Report:
    """What one optimisation did. Times in seconds, sizes in e-classes / e-nodes / graph nodes,
    costs in the cost model's unit (byte-equivalents for :class:`CostModel`).

    ``phases`` holds insertion, analysis (the shape analysis, summed over iterations),
    saturation (the optimisation rulesets), extraction and rebuild; ``total_s`` is their
    sum, the wall clock of the whole optimisation. ``rules_fired`` counts matches per rule
    over all iterations (a rule can match a term again after a merge changes its children).
    """

    rules_fired: dict[str, int] = field(default_factory=dict)
    phases: dict[str, Phase] = field(default_factory=dict)
    iterations: int = 0
    saturated: bool = False
    stop_reason: str = ""
    eclasses: int = 0
    enodes: int = 0
    insert_s: float = 0.0
    analysis_s: float = 0.0
    saturation_s: float = 0.0
    extraction_s: float = 0.0
    rebuild_s: float = 0.0
    total_s: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    dispatches_before: int = 0
    dispatches_after: int = 0
    cost_before: int = 0
    cost_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    extractor: str = ""
    greedy_cost: int | None = None
    ilp_cost: int | None = None
    ilp_optimal: bool | None = None
    ilp_s: float | None = None
    #: with ``optimize(..., payoff=True)``: per rule and per ruleset, what it pays
    #: (:class:`~.payoff.Payoff` as dicts: name, ruleset, matches, extracted_enodes, saved_*)
    rules: list[dict] | None = None
    rulesets: list[dict] | None = None

    def to_dict(self) -> dict:
        """Every field; ``rules`` and ``rulesets`` only when computed."""
        out = asdict(self)
        for key in ("rules", "rulesets"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        """The report :meth:`to_dict` gave. Raises TypeError or ValueError for anything else."""
        if not isinstance(d, dict) or set(d) - {f.name for f in fields(cls)}:
            raise ValueError(f"not a Report's fields: {sorted(d) if isinstance(d, dict) else type(d).__name__}")
        phases = d.get("phases", {})
        if not isinstance(phases, dict):
            raise ValueError("a Report's phases must be a dict")
        return cls(**{**d, "phases": {str(k): Phase(**v) for k, v in phases.items()}})

    def summary(self) -> str:
        fired = "\n".join(f"  {v:5d}  {k}" for k, v in sorted(self.rules_fired.items(), key=lambda kv: -kv[1]))
        phases = "\n".join(f"  {name:<10} {p.seconds:7.3f}s  {p.eclasses:6d} e-classes  {p.enodes:6d} e-nodes"
                           for name, p in self.phases.items())
        gap = ""
        if self.ilp_cost is not None and self.greedy_cost:
            gap = (f", greedy {self.greedy_cost:,} vs ILP {self.ilp_cost:,}"
                   f"{' (optimal)' if self.ilp_optimal else ''}")
        text = (
            f"nodes {self.nodes_before} -> {self.nodes_after}, dispatches {self.dispatches_before} -> "
            f"{self.dispatches_after}, cost {self.cost_before:,} -> {self.cost_after:,}\n"
            f"schedule: {self.iterations} iterations ({self.stop_reason}); extractor {self.extractor}{gap}\n"
            f"phases (total {self.total_s:.3f}s):\n{phases}\n"
            f"rules fired (matches):\n{fired or '  none'}"
        )
        if self.rules is not None:
            from .payoff import payoff_table

            text += "\n" + payoff_table(self)
        return text


__all__ = ["Phase", "Report"]
