"""Does a rule pay? Per rule and per ruleset: matches, e-nodes in the extracted graph, savings.

``optimize(graph, payoff=True)`` fills ``Report.rules`` and ``Report.rulesets`` with one
:class:`Payoff` (as a dict) each:

- ``matches``: how often the rule matched during saturation (``Report.rules_fired``), summed
  over its rules for a ruleset;
- ``extracted_enodes``: e-nodes of the extracted graph that the rule's right-hand side built:
  extracted e-nodes that match the pattern of its right-hand side (constructors and literals;
  a variable matches anything), counting each constructor of the pattern, and that are not an
  e-node of the input graph (same constructor, e-class and input e-classes). A rule that never
  matched gets 0; so does a rule whose right side is a bare variable (``Neg(Neg(x)) -> x``:
  it merges e-classes and builds nothing). Two rules with the same right side (``BiasAdd`` and
  a broadcast ``Add`` both giving ``FusedMatMul(a,b,e+[bias d])``) are both credited when both
  matched. For a ruleset, the distinct e-nodes credited to any of its rules;
- ``saved_cost``, ``saved_dispatches``, ``saved_bytes``: the result of saturating and extracting
  again without that rule (or ruleset), under the same cost model, extractor and schedule,
  minus the result with everything: cost in the cost model's unit (an int where its costs are whole,
  else a float, see :func:`saved_cost`), dispatches per run, bytes
  read + written by the kernels. Positive means the rule pays. A rule that never matched
  saves 0 without a second run (removing it changes nothing: egglog's schedule is
  deterministic). A rule can save nothing alone and much with others, when another rule
  reaches the same form (``Add(x, d)`` in either operand order): the ruleset's row shows that,
  and ``Report.rule_groups`` for rules of any rulesets that build the same op: one row per op that
  the right-hand sides of two or more fired rules have at their head (GPT-2's LayerNorm prologue under
  the optional ``layer_norm_prologue`` ruleset, one rule on rows and one through an exporter's reshape:
  0 saved dispatches each, 5 together), those rules removed together (``name`` ``rules building <op>``,
  ``rules`` their names; a rule whose right side is a view of an op, ``Reshape(CausalAttention(..))``,
  builds that op).

The shape facts are not a ruleset and the analysis ruleset is never ablated: both always run.
Only rulesets eggfuse built (the shipped ones, :func:`~.rulesets.make_ruleset`'s) are taken
apart rule by rule; another egglog ruleset gets its ruleset row only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from . import egglog_private
from .extract import TermDag, dag_enode
from .problem import Decoder, literal
from .report import cost_text
from .rulesets import _MEMBERS, members, rules_of, ruleset_name, without_rules
from .sorts import ARG_SORTS, CHILD_SORTS, SIGNATURES

#: constructor name -> the IR op it builds (one per arity of an op with optional inputs)
OP_OF = {name: sig.op for name, sig in SIGNATURES.items() if not sig.leaf}
#: ops that only view another: a rule building one around another op builds that op
VIEWS = frozenset({"Identity", "Permute", "Select"})

if TYPE_CHECKING:
    from egglog import Ruleset

    from .encode import Encoding
    from .engine import Report


@dataclass
class Payoff:
    """What one rule (or ruleset: ``ruleset`` then equals ``name``) pays; see the module docstring."""

    name: str
    ruleset: str
    matches: int = 0
    extracted_enodes: int = 0
    saved_cost: float = 0
    saved_dispatches: int = 0
    saved_bytes: int = 0


def attach(rep: Report, dag: TermDag | None, enc: Encoding, rulesets: Sequence[Ruleset],
           again: Callable[[Sequence[Ruleset]], Report]) -> None:
    """Fill ``rep.rules`` and ``rep.rulesets``. ``dag`` is the extracted DAG (None when the
    input graph was kept: nothing extracted came from a rule); ``again(rulesets)`` optimises
    the same graph with other rulesets and returns its report."""
    credited = _credited(dag, enc, rulesets, rep.rules_fired) if dag is not None else {}
    rules: list[Payoff] = []
    sets: list[Payoff] = []
    for i, rs in enumerate(rulesets):
        name = ruleset_name(rs)
        names = rules_of(rs)
        row = Payoff(name, name)
        if names is not None:
            for rule in names:
                r = Payoff(rule, name, rep.rules_fired.get(rule, 0), len(credited.get(rule, ())))
                if r.matches:
                    _saved(r, rep, again([*rulesets[:i], without_rules(rs, {rule}), *rulesets[i + 1:]]))
                rules.append(r)
                row.matches += r.matches
            row.extracted_enodes = len(set().union(*(credited.get(rule, set()) for rule in names)))
        else:
            row.matches = -1  # unknown: egglog reports matches by rule, and this ruleset's rules are not known
        if row.matches:
            _saved(row, rep, again([*rulesets[:i], *rulesets[i + 1:]]))
        row.matches = max(row.matches, 0)
        sets.append(row)
    rep.rules = [asdict(r) for r in rules]
    rep.rulesets = [{k: v for k, v in asdict(r).items() if k != "ruleset"} for r in sets]
    groups = []
    for op, names in sorted(_builders(rulesets, rep.rules_fired).items()):
        if len(names) < 2:
            continue
        row = Payoff(f"rules building {op}", "", sum(rep.rules_fired[n] for n in names),
                     len(set().union(*(credited.get(n, set()) for n in names))))
        _saved(row, rep, again([without_rules(rs, set(names)) if rules_of(rs) is not None else rs for rs in rulesets]))
        groups.append({**{k: v for k, v in asdict(row).items() if k != "ruleset"}, "rules": names})
    rep.rule_groups = groups


def _builders(rulesets: Sequence[Ruleset], fired: dict[str, int]) -> dict[str, list[str]]:
    # op -> the fired rules (of rulesets eggfuse built) whose right-hand sides build it: the head call, or
    # under views (Identity, Permute, Select) the first call that is not one
    out: dict[str, list[str]] = {}
    for rs in rulesets:
        for rule_name, rule in (members(rs)[1] if id(rs) in _MEMBERS else []):
            if not fired.get(rule_name):
                continue
            heads = {_built_op(p) for p in egglog_private.rule_rhs(rule)} - {None}
            for op in sorted(heads):
                out.setdefault(op, []).append(rule_name)
    return out


def _built_op(pattern: Any) -> str | None:
    # the op a right-hand side pattern builds, looking through views to what they view
    if not (isinstance(pattern, tuple) and pattern and pattern[0] in OP_OF):
        return None
    op = OP_OF[pattern[0]]
    if op in VIEWS:
        for child in pattern[1]:
            inner = _built_op(child)
            if inner is not None:
                return inner
    return op


def saved_cost(without: float, with_all: float) -> float | int:
    """``without - with_all``, in the cost model's unit: an int where both costs are whole (the shipped
    models'), else a float (a model in seconds or other small units: truncating to an int would make every
    saving 0); a difference within float rounding of the sum (1e-12 of the larger cost) is 0."""
    diff = without - with_all
    if abs(diff) <= 1e-12 * max(abs(without), abs(with_all)):
        return 0
    return int(diff) if float(diff).is_integer() else float(diff)


def _saved(row: Payoff, rep: Report, without: Report) -> None:
    row.saved_cost = saved_cost(without.cost_after, rep.cost_after)
    row.saved_dispatches = int(without.dispatches_after - rep.dispatches_after)
    row.saved_bytes = int(without.bytes_after - rep.bytes_after)


def _credited(dag: TermDag, enc: Encoding, rulesets: Sequence[Ruleset], fired: dict[str, int]) -> dict[str, set[int]]:
    """Rule name -> the DAG entries (tensor e-nodes) its right-hand side built; see the module docstring."""
    original = _input_enodes(enc)
    new = set()
    for j, (name, _) in enumerate(dag.nodes):
        if name in SIGNATURES and not SIGNATURES[name].leaf and _key(dag, j) not in original:
            new.add(j)
    dec = Decoder(enc.raw)
    memo: dict[tuple, bool] = {}
    out: dict[str, set[int]] = {}
    for rs in rulesets:
        for rule_name, rule in (members(rs)[1] if id(rs) in _MEMBERS else []):
            if not fired.get(rule_name):
                continue
            got: set[int] = set()
            for pattern in egglog_private.rule_rhs(rule):
                if pattern is None or pattern[0] == "lit":
                    continue
                for j in range(len(dag.nodes)):
                    built: set[int] = set()
                    if _match(dag, dec, memo, pattern, j, built):
                        got |= built & new
            if got:
                out[rule_name] = got
    return out


def _match(dag: TermDag, dec: Decoder, memo: dict, pattern: Any, j: int, built: set[int]) -> bool:
    """Whether DAG entry ``j`` matches call ``pattern``: its own constructor and literals, and for
    each sub-pattern either its extracted child (whose entries go to ``built`` too) or, when
    extraction chose another e-node there, some e-node of the child's e-class."""
    name, kids = pattern
    node, args = dag.nodes[j]
    if node != name or len(args) != len(kids):
        return False
    sub: set[int] = set()
    for sort, arg, kid in zip(ARG_SORTS[node], args, kids, strict=True):
        if kid is None:
            continue
        if kid[0] == "lit":
            if sort in CHILD_SORTS or arg != kid[1]:
                return False
        elif sort not in CHILD_SORTS:
            return False
        elif not _match(dag, dec, memo, kid, arg, sub) and not _in_class(dec, memo, kid, dag.eclasses[arg]):
            return False
    built |= sub
    built.add(j)
    return True


def _in_class(dec: Decoder, memo: dict, pattern: Any, eclass: str) -> bool:
    """Whether some e-node of ``eclass`` in the saturated e-graph matches call ``pattern``."""
    key = (id(pattern), eclass)
    if key not in memo:
        memo[key] = False  # a cycle through this e-class does not match
        name, kids = pattern
        for nid in dec.members.get(eclass, ()):
            n = dec.nodes[nid]
            if n["op"] != name or len(n["children"]) != len(kids):
                continue
            if all(kid is None or (literal(dec.nodes, ch, sort) == kid[1] if kid[0] == "lit" else
                                   sort in CHILD_SORTS and _in_class(dec, memo, kid, dec.cls[ch]))
                   for sort, ch, kid in zip(ARG_SORTS[name], n["children"], kids, strict=True)):
                memo[key] = True
                break
    return memo[key]


def _key(dag: TermDag, j: int) -> tuple:
    op, _, inputs = dag_enode(dag, j)
    return dag.nodes[j][0], dag.eclasses[j], tuple(dag.eclasses[k] for k in inputs)


def _input_enodes(enc: Encoding) -> set[tuple]:
    """(constructor, e-class, input e-classes) of every e-node of the input graph."""
    cls = {}
    for c, d in enc.raw["class_data"].items():
        for let in (d.get("let") or "").split(", "):
            if let:
                cls[let] = c
    out = set()
    for let, (constructor, refs) in enc.enodes.items():
        c, ins = cls.get(let), tuple(cls.get(r) for r in refs)
        if c is not None and None not in ins:
            out.add((constructor, c, ins))
    return out


def payoff_table(rep: Report) -> str:
    """The report's payoff rows as text: rulesets, then the rules that matched."""
    head = f"  {'matches':>7} {'e-nodes':>7} {'saved cost':>14} {'dispatches':>10} {'bytes':>14}  "

    def line(r: dict, name: str) -> str:
        return (f"  {r['matches']:7d} {r['extracted_enodes']:7d} {cost_text(r['saved_cost']):>14} "
                f"{r['saved_dispatches']:10d} {r['saved_bytes']:14,}  {name}")

    lines = ["payoff (saved: optimised again without it, minus with everything):", head + "ruleset"]
    lines += [line(r, r["name"]) for r in rep.rulesets or ()]
    lines.append(head + "rule (that matched)")
    lines += [line(r, f"{r['name']} [{r['ruleset']}]") for r in rep.rules or () if r["matches"]]
    if rep.rule_groups:
        lines.append(head + "rules building one op, removed together")
        lines += [line(r, f"{r['name']} ({len(r['rules'])} rules)") for r in rep.rule_groups]
    return "\n".join(lines)


__all__ = ["Payoff", "attach", "payoff_table", "saved_cost"]
