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

import itertools
from collections.abc import Callable, Iterator, Sequence

from egglog import EGraph, Ruleset, back_off, ruleset, run

from ..ir import Graph
from . import egglog_private
from .problem import Decoder, literal
from .rulesets import _MEMBERS, analysis_ruleset, members, ruleset_name, without_rules
from .sorts import ARG_SORTS, CHILD_SORTS

_fresh = itertools.count()


def _units(rulesets: Sequence[Ruleset]) -> list[tuple[str, Ruleset, object]]:
    """(label, ruleset, rule) per rule (a ruleset of one) in schedule order; a foreign ruleset
    whole (rule None)."""
    out = []
    for rs in rulesets:
        if id(rs) not in _MEMBERS:
            out.append((f"a rule of ruleset {ruleset_name(rs)!r}", rs, None))
            continue
        name, rules = members(rs)
        for rule_name, rule in rules:
            one = ruleset(name=f"diagnose_{next(_fresh)}")
            one.register(rule)
            out.append((f"rule {rule_name!r} (ruleset {name})", one, rule))
    return out


def merge_culprit(graph: Graph, rulesets: Sequence[Ruleset], *, match_limit: int = 20_000, ban_length: int = 5,
                  max_iterations: int = 50) -> tuple[str, str] | None:
    """(label, what it merged) of the first rule whose run fails when the schedule is replayed
    one rule at a time, or None when the replay does not fail (the failure needs the rules'
    original order). What it merged names the two e-classes and their shapes, found by
    matching the rule's sides in the e-graph just before that run ("" if not found)."""
    units = _units(rulesets)
    failed = _replay(graph, units, match_limit, ban_length, max_iterations)
    if failed is None:
        return None
    label, rule = units[failed[1]][0], units[failed[1]][2]
    egraph = _replay(graph, units, match_limit, ban_length, max_iterations, stop=failed)
    return label, "" if rule is None else _merged(egglog_private.serialize(egraph), rule)


def _replay(graph: Graph, units: list, match_limit: int, ban_length: int, max_iterations: int,
            stop: tuple[int, int] | None = None):
    """Run ``units`` one at a time: the (iteration, unit) whose run fails, None if none does;
    with ``stop``, the e-graph just before that run."""
    from .encode import encode

    egraph = EGraph(no_decomp=True)  # as saturate runs by default
    encode(graph, egraph)
    analysis = analysis_ruleset().saturate()
    steps = [run(rs, scheduler=back_off(match_limit=match_limit, ban_length=ban_length)) for _, rs, _ in units]
    for it in range(max_iterations):
        egraph.run(analysis)
        changed = False
        for k, step in enumerate(steps):
            if stop == (it, k):
                return egraph
            try:
                changed |= egraph.run(step).updated
                egraph.run(analysis)
            except Exception:  # noqa: BLE001 - egglog's panic on the illegal merge
                return it, k
        if not changed:
            return None
    return None


def _merged(raw: dict, rule) -> str:
    """Where ``rule`` would join two e-classes of different shape facts in ``raw``: a sentence, or ""."""
    dec = Decoder(raw)
    vectors = {n["eclass"]: n for nid, n in raw["nodes"].items() if nid.startswith("primitive-Vec")}
    shapes = {}
    for n in raw["nodes"].values():
        if n["op"] == "shape" and (v := vectors.get(n["eclass"])) is not None:
            shapes[dec.cls[n["children"][0]]] = [int(raw["nodes"][g]["op"]) for g in v["children"]]
    for lhs, rhs in egglog_private.rule_unions(rule, names=True):
        if lhs is None or lhs[0] in ("var", "lit"):
            continue
        for c in shapes:
            for env in itertools.islice(_bind(dec, lhs, c, {}), 1000):
                if rhs is not None and rhs[0] == "var":
                    other = env.get(rhs[1])
                else:
                    other = next((k for k in shapes if next(_bind(dec, rhs, k, env), None) is not None), None)
                if other in shapes and shapes[other] != shapes[c]:
                    return (f"its left side {lhs[0]}, e-class {c} of shape {shapes[c]}, and its right side, e-class "
                            f"{other} of shape {shapes[other]}")
    return ""


def _bind(dec: Decoder, p, eclass: str, env: dict) -> Iterator[dict]:
    """Every binding of the variables of pattern ``p`` (``egglog_private.rule_unions(names=True)``)
    that extends ``env`` and matches an e-node of ``eclass``."""
    if p is None:
        yield env
    elif p[0] == "var":
        if p[1] not in env:
            yield env | {p[1]: eclass}
        elif env[p[1]] == eclass:
            yield env
    elif p[0] != "lit":
        name, kids = p
        for nid in dec.members.get(eclass, ()):
            node = dec.nodes[nid]
            if node["op"] == name and len(node["children"]) == len(kids):
                yield from _bind_args(dec, list(zip(ARG_SORTS[name], node["children"], kids, strict=True)), env)


def _bind_args(dec: Decoder, args: list, env: dict) -> Iterator[dict]:
    if not args:
        yield env
        return
    (sort, child, kid), rest = args[0], args[1:]
    if sort in CHILD_SORTS:
        for e in _bind(dec, kid, dec.cls[child], env):
            yield from _bind_args(dec, rest, e)
        return
    value = ("lit", literal(dec.nodes, child, sort))
    if kid is None or kid == value:
        yield from _bind_args(dec, rest, env)
    elif kid[0] == "var" and env.get(kid[1], value) == value:
        yield from _bind_args(dec, rest, env | {kid[1]: value})


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
        name, rules = members(rs)
        for rule_name, _ in rules:
            if fired.get(rule_name) and not still_fails([*rulesets[:i], without_rules(rs, {rule_name}),
                                                          *rulesets[i + 1:]]):
                out.append(f"rule {rule_name!r} (ruleset {name})")
    return out


__all__ = ["merge_culprit", "unsound_culprits"]
