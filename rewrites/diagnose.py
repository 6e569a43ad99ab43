"""Naming the rule behind a failure: egglog reports an illegal merge of shape facts (two encoded
e-classes of different shapes joined) without saying which rule made it, and the soundness
check finds two e-nodes that disagree without knowing which rule put one there.

Both are found again by running the rules one at a time (only on this error path):

- :func:`merge_culprit` replays the schedule in a fresh e-graph with every rule in a ruleset
  of its own (analysis saturated between passes, as in ``engine.saturate``); the first rule
  whose run fails is the one;
- :func:`unsound_culprits` leaves out each rule that fired in turn: the rules without which
  the check passes.

A ruleset eggfuse did not build (a plain egglog ``Ruleset``) cannot be taken apart: it is
run, or left out, as a whole and named as a ruleset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from egglog import EGraph, Ruleset, back_off, ruleset, run

from ..ir import Graph
from .rulesets import _MEMBERS, analysis_ruleset, ruleset_name, without_rules


def _units(rulesets: Sequence[Ruleset]) -> list[tuple[str, Ruleset]]:
    """(label, ruleset) per rule (a ruleset of one) in schedule order; a foreign ruleset whole."""
    out = []
    for rs in rulesets:
        if id(rs) not in _MEMBERS:
            out.append((f"a rule of ruleset {ruleset_name(rs)!r}", rs))
            continue
        name, members = _MEMBERS[id(rs)]
        for rule_name, rule in members:
            one = ruleset(name=f"diagnose_{len(out)}")
            one.register(rule)
            out.append((f"rule {rule_name!r} (ruleset {name})", one))
    return out


def merge_culprit(graph: Graph, rulesets: Sequence[Ruleset], *, match_limit: int = 20_000, ban_length: int = 5,
                  max_iterations: int = 50) -> str | None:
    """The label of the first rule whose run fails when the schedule is replayed one rule at a
    time, or None when the replay does not fail (the failure needs the rules' original order)."""
    from .encode import encode

    egraph = EGraph()
    encode(graph, egraph)
    analysis = analysis_ruleset().saturate()
    units = [(label, run(rs, scheduler=back_off(match_limit=match_limit, ban_length=ban_length)))
             for label, rs in _units(rulesets)]
    for _ in range(max_iterations):
        egraph.run(analysis)
        changed = False
        for label, step in units:
            try:
                changed |= egraph.run(step).updated
                egraph.run(analysis)
            except Exception:  # noqa: BLE001 - egglog's panic on the illegal merge
                return label
        if not changed:
            return None
    return None


def unsound_culprits(rulesets: Sequence[Ruleset], fired: dict[str, int],
                     still_fails: Callable[[Sequence[Ruleset]], bool]) -> list[str]:
    """Labels of the rules (of those that fired) without which ``still_fails(rulesets)`` is False."""
    out = []
    for i, rs in enumerate(rulesets):
        rest = [*rulesets[:i], *rulesets[i + 1:]]
        if id(rs) not in _MEMBERS:
            if not still_fails(rest):
                out.append(f"a rule of ruleset {ruleset_name(rs)!r}")
            continue
        name, members = _MEMBERS[id(rs)]
        for rule_name, _ in members:
            if fired.get(rule_name) and not still_fails([*rulesets[:i], without_rules(rs, {rule_name}),
                                                          *rulesets[i + 1:]]):
                out.append(f"rule {rule_name!r} (ruleset {name})")
    return out


__all__ = ["merge_culprit", "unsound_culprits"]
