"""Every use of egglog-python internals, in one module (egglog is pinned ``>=14,<15``).

Everything else in ``rewrites/`` uses egglog-python's public API: ``@function(egg_fn=...)``
constructors, rulesets, schedules, ``EGraph.run``. Three things have no public form, and each
is kept here for a measured reason (and :func:`variables`, for a clear error message):

- :func:`run_program`: the encoded graph is inserted as one egglog program (text) in one call.
  On SmolLM2's 30-layer graph (726 nodes) that took 31 ms; building every node as an
  egglog-python expression and ``let``-binding it took 190 ms (42 against 262 us a node).
- :func:`declare`: the constructors a program names must be declared in the e-graph first;
  egglog-python declares a function only when an expression first uses it.
- :func:`serialize`: the e-graph (e-nodes with their e-class and children) for the ILP and
  greedy extractors and the soundness check: 7 ms for that graph's 1,752 e-nodes, where the
  public ``function_values`` took 3.5 s for the 211 rows of one constructor (MatMulBT).
- :func:`variables`: the pattern variables of a rule's sides and guards, so that a right
  side naming a variable that nothing binds is refused when the rule is made, naming the
  rule, not at saturation as egglog's ``Unbound symbol``.
- :func:`ruleset_fingerprint`: the text of a ruleset's rules, for the compile cache's key
  (``eggfuse.cache``): egglog-python prints a ruleset as its name only.
- :func:`rule_calls`: the functions a rule's query and actions call, so that the engine runs
  only the rules that can match an e-graph (``rulesets.relevant``): an egglog rule costs about
  0.25 ms per pass even where it matches nothing, and the elementwise_fusion ruleset has one
  per fusable op.

``tests/unit/test_egglog_private.py`` exercises each of them, and pins the details of the
serialisation that ``problem.py``, ``engine.py`` and ``soundness.py`` read (``primitive-`` and
``primitive-Vec`` node ids, ``class_data``'s ``type`` and ``let`` keys, the display names
``Epi.none`` ... ``TList.cons`` of ``sorts.ARG_SORTS``), so an egglog release that changes one
fails there, naming it, before anything else breaks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from egglog import EGraph

from ..ir import RewriteError


def _internal(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except AttributeError as e:
        raise RewriteError(f"this egglog-python release no longer has {what} ({e}); eggfuse supports egglog "
                           ">=14,<15: install a version in that range") from e


def declare(egraph: EGraph, functions: Iterable[Any]) -> None:
    """Declare ``functions`` (egglog-python constructors or functions) in ``egraph``."""
    for fn in functions:
        _internal("EGraph._callable_to_egg", lambda fn=fn: egraph._callable_to_egg(fn))


def run_program(egraph: EGraph, program: str) -> None:
    """Run egglog ``program`` (text) in ``egraph``; kept in the replayable transcript when the
    e-graph records one (``EGraph(save_egglog_string=True)``)."""
    state = _internal("EGraph._state", lambda: egraph._state)
    if state.egglog_file_state is None:
        state.egraph.parse_and_run_program(program)
    else:  # recording a transcript for --dump-egglog: through egglog-python, which saves it
        state.run_program(*state.egraph.parse_program(program))


def serialize(egraph: EGraph) -> dict:
    """egglog's serialisation of ``egraph``: ``nodes`` (op, children, e-class) and ``class_data``."""
    raw = _internal("EGraph._serialize", lambda: egraph._serialize(split_primitive_outputs=False))
    return json.loads(raw.to_json())


def variables(*terms: Any) -> set[str]:
    """The names of the pattern variables (``egglog.var``) in egglog-python expressions and facts."""
    from egglog.declarations import UnboundVarDecl

    def decl(t: Any) -> Any:
        if hasattr(t, "__egg_typed_expr__"):  # an expression
            return t.__egg_typed_expr__
        return getattr(t, "fact", t)  # a fact (eq(a).to(b)), or a declaration already

    roots = _internal("RuntimeExpr.__egg_typed_expr__ / Fact.fact", lambda: [decl(t) for t in terms])
    return {d.name for d in _walk(roots) if type(d) is UnboundVarDecl}


def is_variable(term: Any) -> bool:
    """Whether ``term`` (an egglog-python expression) is a bare pattern variable (``egglog.var``)."""
    from egglog.declarations import UnboundVarDecl

    if not hasattr(term, "__egg_typed_expr__"):
        return False
    return _internal("RuntimeExpr.__egg_typed_expr__.expr",
                     lambda: type(term.__egg_typed_expr__.expr) is UnboundVarDecl)


def _walk(root: Any) -> Iterator[Any]:
    """Every declaration below ``root`` (egglog-python's dataclasses, in tuples and lists), each
    object once; type references and identifiers are not entered (they hold no variables and no
    calls: a call's callable is yielded itself)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        d = stack.pop()
        if isinstance(d, tuple | list):
            stack.extend(d)
            continue
        yield d
        cls = type(d)
        fields = _FIELDS.get(cls)
        if fields is None:
            # type and callable references hold no variables and no calls; a lambda's does (its body)
            opaque = (cls.__name__.endswith("Ref") and cls.__name__ != "UnnamedFunctionRef") or cls.__name__ == "Ident"
            fields = _FIELDS[cls] = (tuple(f.name for f in dataclasses.fields(cls))
                                     if dataclasses.is_dataclass(cls) and not opaque else ())
        if fields and id(d) not in seen:
            seen.add(id(d))
            stack.extend(getattr(d, f) for f in fields)


_FIELDS: dict[type, tuple[str, ...]] = {}  # a declaration class -> its dataclass fields' names (() for others)


def ruleset_fingerprint(rs: Any) -> str:
    """The rules of egglog ruleset ``rs`` as text (their declarations, deferred rules included):
    equal for rulesets of the same rules, in the same order; no addresses or ids in it."""
    def text() -> str:
        rs._update_egg_decls()
        return repr(rs.__egg_ruleset__)

    return _internal("Ruleset.__egg_ruleset__", text)


def rule_name(rule: Any) -> str:
    """The ``name=`` of an egglog rule (``egglog.rule(..., name=...)``)."""
    return _internal("RewriteOrRule.decl.name", lambda: rule.decl.name)


def rule_unions(rule: Any, names: bool = False) -> list[tuple[Any, Any]]:
    """The ``union(lhs).with_(rhs)`` actions of an egglog rule as (lhs, rhs) patterns:
    ``(constructor, (child patterns...))`` for a call (constructors by their names in egglog's
    serialisation: ``FusedMatMul``, ``Epi.act``), ``("lit", value)`` for a literal, and for a
    variable None, or with ``names`` ``("var", name)``; anything else is None (matches anything)."""
    from egglog.declarations import (
        CallDecl,
        ClassMethodRef,
        FunctionRef,
        LitDecl,
        TypedExprDecl,
        UnboundVarDecl,
        UnionDecl,
    )

    def pattern(d: Any) -> Any:
        if isinstance(d, TypedExprDecl):
            d = d.expr
        if isinstance(d, LitDecl):
            return ("lit", d.value)
        if isinstance(d, UnboundVarDecl):
            return ("var", d.name) if names else None
        if isinstance(d, CallDecl):
            ref = d.callable
            if isinstance(ref, FunctionRef):
                name = ref.ident.name
            elif isinstance(ref, ClassMethodRef):
                name = f"{ref.ident.name}.{ref.method_name}"
            else:
                return None
            return (name, tuple(pattern(a) for a in d.args))
        return None

    head = _internal("RewriteOrRule.decl.head", lambda: rule.decl.head)
    return [(pattern(a.lhs), pattern(a.rhs)) for a in head if isinstance(a, UnionDecl)]


def rule_calls(rule: Any) -> tuple[set[str], set[str]]:
    """The names of the functions the query (body) and the actions (head) of an egglog rule
    call, as :func:`rule_unions` names constructors (``FusedMatMul``, ``Epi.act``)."""
    from egglog.declarations import CallDecl, ClassMethodRef, FunctionRef

    def calls(root: Any) -> set[str]:
        names: set[str] = set()
        for d in _walk(root):
            if isinstance(d, CallDecl):
                ref = d.callable
                if isinstance(ref, FunctionRef):
                    names.add(ref.ident.name)
                elif isinstance(ref, ClassMethodRef):
                    names.add(f"{ref.ident.name}.{ref.method_name}")
        return names

    decl = _internal("RewriteOrRule.decl", lambda: rule.decl)
    return calls(decl.body), calls(decl.head)


def rule_rhs(rule: Any) -> list[Any]:
    """The right-hand sides of an egglog rule's unions as patterns (see :func:`rule_unions`)."""
    return [rhs for _, rhs in rule_unions(rule)]


def ruleset_ident(rs: Any) -> str:
    """egglog's name of a ruleset (``ruleset(name=...)``, or one egglog-python made up)."""
    return _internal("Ruleset.__egg_ident__", lambda: rs.__egg_ident__.name)


__all__ = ["declare", "rule_calls", "rule_name", "rule_rhs", "rule_unions", "ruleset_fingerprint", "ruleset_ident",
           "run_program", "serialize", "variables"]
