"""The namespace rule functions receive: constructors by op name, sorts, analyses, egglog's
rule primitives, and :meth:`Namespace.equal`, the one helper rule authors need.

A rule function (registered with ``eggfuse.ir.spec.rules``, beside the op it concerns) is
called as ``fn(e)`` with a :class:`Namespace` ``e``::

    @rules("norm_fusion")
    def _add_rms_norm(e):
        x, d, w = e.vars("x d w")
        eps = e.var("eps", e.f64)
        yield e.equal("RmsNorm(Add(x,d), w) -> AddRmsNorm(x,d,w)",
                      e.RmsNorm(e.Add(x, d), w, eps=eps), e.AddRmsNorm(x, d, w, eps=eps),
                      e.eq(e.shape(x)).to(e.shape(d)), example=...)

``e.shape(t)``, ``e.is_bool(t)`` and ``e.is_i32(t)``
read the analysis facts; ``e.<fact>(t, *args)`` is the relation of a value fact (``eggfuse.ir.facts``), read as a guard.
``e.<Op>(*tensors, **attrs)`` builds the op's e-node: tensor inputs positionally (packed
into a ``TList`` for an op whose input count varies), attributes by keyword, and for a fused
matmul its chain as ``epilogue=``; ``e.Fused(ex)`` a generated elementwise kernel of the
``Ex`` term ``ex``, built with ``e.ExLeaf(t)`` and ``e.ex(op, *operands, **attrs)``. An
attribute left out is a fresh pattern variable, so it
matches anything on a left-hand side; on a right-hand side every attribute must be given or
bound by the left (:meth:`Namespace.equal` refuses a right side with an unbound variable,
naming the rule and the attribute).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import egglog
from egglog import Bool, String, Vec, f64, i64

from ..ir import OPS, RewriteError
from ..ir.spec import Example
from . import egglog_private
from .sorts import (
    ATTR_SORTS,
    CONSTRUCTORS,
    EX_CONSTRUCTORS,
    EX_SIGNATURES,
    FACTS,
    SIGNATURES,
    Epi,
    Ex,
    T,
    TList,
    constructor_name,
    epilogue_blocks_add,
    epilogue_without_add,
    epilogue_without_region,
    ex_acc,
    ex_leaf,
    is_bool,
    is_i32,
    last_step,
    shape,
    stored_uses,
)


@dataclass(frozen=True)
class RuleRecord:
    """One shipped rule: its ``name`` (``lhs -> rhs``), ruleset, the op family whose module
    holds it, and its soundness :class:`~eggfuse.ir.spec.Example` (None only for analysis rules)."""

    name: str
    ruleset: str
    family: str
    example: Example | None


class Namespace:
    """See the module docstring. ``records`` collects every rule made through it."""

    T, Epi, TList, Ex = T, Epi, TList, Ex
    String, i64, f64, Bool, Vec = String, i64, f64, Bool, Vec
    shape, is_bool, is_i32, epilogue_without_add, last_step = staticmethod(shape), staticmethod(is_bool), \
        staticmethod(is_i32), staticmethod(epilogue_without_add), staticmethod(last_step)
    stored_uses, ExLeaf, ExAcc = staticmethod(stored_uses), staticmethod(ex_leaf), staticmethod(ex_acc)
    epilogue_blocks_add, epilogue_without_region = staticmethod(epilogue_blocks_add), \
        staticmethod(epilogue_without_region)
    eq, ne, union, set_, rewrite = (staticmethod(egglog.eq), staticmethod(egglog.ne), staticmethod(egglog.union),
                                    staticmethod(egglog.set_), staticmethod(egglog.rewrite))

    def __init__(self) -> None:
        self.records: list[RuleRecord] = []
        self._names: set[str] = set()
        self.ruleset = ""
        self.family = ""
        self._fresh = itertools.count()
        self._ops: dict[str, Callable[..., Any]] = {}
        self._left_out: dict[str, tuple[str, str]] = {}  # fresh variable -> (op, attribute) it stands for

    # --- variables ---------------------------------------------------------------------

    def var(self, name: str, sort: Any = T) -> Any:
        """A pattern variable of ``sort`` (default: a tensor)."""
        return egglog.var(name, sort)

    def vars(self, names: str, sort: Any = T) -> list[Any]:
        """Pattern variables, one per space-separated name, as a list even for one name:
        ``a, b = e.vars("a b")``, ``(x,) = e.vars("x")`` (or ``x = e.var("x")``)."""
        return [self.var(n, sort) for n in names.split()]

    def tensors(self, *xs: Any) -> TList:
        """The ``TList`` of ``xs`` (the inputs of a variadic op, in order)."""
        for i, x in enumerate(xs):
            _refuse_sequence(x, f"e.tensors: argument {i + 1}")
        out = TList.nil()
        for x in reversed(xs):
            out = TList.cons(x, out)
        return out

    def attrs_of(self, op: str, **given: Any) -> dict[str, Any]:
        """Every egglog attribute of ``op``: ``given`` values, fresh variables for the rest."""
        return {a.name: given[a.name] if a.name in given else self._fresh_var(op, a.name, ATTR_SORTS[a.kind])
                for a in OPS[op].egg_attrs}

    def _fresh_var(self, op: str, attr: str, sort: Any) -> Any:
        name = f"{op}_{attr}_{next(self._fresh)}"
        self._left_out[name] = (op, attr)
        return self.var(name, sort)

    # --- constructors --------------------------------------------------------------------

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op in FACTS:  # a value fact's relation (ir.facts): e.value(c, v) as a guard binds v
            return FACTS[op]
        if op not in OPS:
            close = difflib.get_close_matches(op, [*OPS, *FACTS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AttributeError(f"no op named {op!r} and no value fact of that name{hint} (rules name ops as "
                                 "eggfuse.ir.OPS does, facts as eggfuse.ir.facts.VALUE_FACTS)")
        if op not in self._ops:
            self._ops[op] = self._wrap(op)
        return self._ops[op]

    def _wrap(self, op: str) -> Callable[..., Any]:
        def build(*tensors: Any, epilogue: Any = None, **attrs: Any) -> Any:
            for i, x in enumerate(tensors):
                _refuse_sequence(x, f"e.{op}: tensor argument {i + 1}")
            _refuse_sequence(epilogue, f"e.{op}: epilogue")
            name = constructor_name(op, len(tensors))  # by arity, for an op with optional inputs
            sig, ctor = SIGNATURES[name], CONSTRUCTORS[name]
            if sig.leaf or sig.expr:
                return ctor(*tensors)
            unknown = set(attrs) - {a.name for a in sig.attrs}
            if unknown:
                raise TypeError(f"{op}: no attribute(s) {sorted(unknown)}; its attributes are "
                                f"{[a.name for a in sig.attrs]}")
            kinds = {a.name: a.kind for a in OPS[op].egg_attrs}
            for key, x in attrs.items():
                if isinstance(x, list | tuple) and kinds.get(key) in ("ints", "floats"):
                    attrs[key] = _vector(op, key, x, kinds[key])  # perm=(1, 0): the Vec egglog holds
                else:
                    _refuse_sequence(x, f"e.{op}: attribute {key}")
            args = list(self.attrs_of(op, **attrs).values())
            if sig.tensors is None:
                args.append(self.tensors(*tensors))
            elif len(tensors) != sig.tensors:
                raise TypeError(f"{op} takes {sig.tensors} tensor arguments, got {len(tensors)}")
            else:
                args.extend(tensors)
            if sig.epilogue:
                args.append(self._fresh_var(op, "epilogue", Epi) if epilogue is None else epilogue)
            return ctor(*args)

        build.__name__ = op
        return build

    def ex(self, op: str, *operands: Any, **attrs: Any) -> Ex:
        """The ``Ex`` e-node of fusable ``op`` (``ir.ops.fused.FUSABLE``) on ``Ex`` operands;
        attributes by keyword, a fresh pattern variable for each one left out."""
        name = f"Ex{op}"
        if name not in EX_SIGNATURES:
            raise AttributeError(f"no Ex constructor for {op!r}: a generated kernel holds the ops of "
                                 "eggfuse.ir.ops.fused.FUSABLE")
        sig = EX_SIGNATURES[name]
        for i, x in enumerate(operands):
            _refuse_sequence(x, f"e.ex({op!r}): operand {i + 1}")
        for key, x in attrs.items():
            _refuse_sequence(x, f"e.ex({op!r}): attribute {key}")
        if len(operands) != sig.arity:
            raise TypeError(f"Ex{op} takes {sig.arity} operands, got {len(operands)}")
        return EX_CONSTRUCTORS[op](*self.attrs_of(op, **attrs).values(), *operands)

    # --- rules ---------------------------------------------------------------------------

    def _record(self, name: str, example: Example | None) -> None:
        if not isinstance(name, str) or not name.strip():  # reports, --disable-rule and payoff name rules by it
            raise RewriteError(f"a rule's name must be a non-empty str (reports and --disable-rule name it; write "
                               f"it as lhs -> rhs), got {name!r}")
        if name in self._names:
            raise ValueError(f"two rules are named {name!r}; rule names must be unique")
        self.records.append(RuleRecord(name, self.ruleset, self.family, example))
        self._names.add(name)

    def equal(self, name: str, lhs: Any, rhs: Any, *guards: Any, example: Example | None = None) -> Any:
        """The rule ``lhs = rhs`` (``rhs`` joins ``lhs``'s e-class) when every guard holds.

        ``name`` is the rule's label in reports and ``eggfuse rules``, written ``lhs -> rhs``;
        it must be unique. ``guards`` are egglog facts over the pattern variables, typically
        analysis reads such as ``e.eq(e.shape(d)).to(s)``. ``example`` is the rule's soundness
        example (``eggfuse.ir.spec.example``). Being an equality, the rule never removes the
        left side: extraction decides which form is computed.

        Raises :class:`RewriteError` naming the rule and the variables when ``rhs`` has a
        variable that neither ``lhs`` nor a guard binds (an attribute the right side leaves
        out is such a variable: give it, or bind it to a variable on the left), and naming the
        rule when ``lhs`` is a bare variable (egglog matches a term, not every e-class), and
        naming the rule and the side when ``lhs``, ``rhs`` or a guard is a list or tuple (such as
        what :meth:`vars` returns) where one term belongs.
        """
        _refuse_sequence(lhs, f"rule {name!r}: the left-hand side")
        _refuse_sequence(rhs, f"rule {name!r}: the right-hand side")
        for i, g in enumerate(guards):
            _refuse_sequence(g, f"rule {name!r}: guard {i + 1}")
        if egglog_private.is_variable(lhs):
            var = egglog_private.variables(lhs).pop()
            raise RewriteError(f"rule {name!r}: its left side is the bare variable {var!r}; a rule matches a term: "
                               "write the op it applies to on the left (e.g. e.Neg(a)), and swap the sides if the "
                               "op is on the right")
        self._check_bound(name, rhs, lhs, *guards)
        self._record(name, example)
        return egglog.rule(lhs, *guards, name=name).then(egglog.union(lhs).with_(rhs))

    def _check_bound(self, name: str, rhs: Any, *binding: Any) -> None:
        unbound = sorted(egglog_private.variables(rhs) - egglog_private.variables(*binding))
        if not unbound:
            return
        what = []
        for v in unbound:
            if v in self._left_out:
                op, attr = self._left_out[v]
                what.append(f"{op}'s attribute {attr}, left out (give {attr}=..., a value or a variable that the "
                            "left-hand side binds)")
            else:
                what.append(f"variable {v!r}")
        raise RewriteError(f"rule {name!r}: the right-hand side uses what neither the left-hand side nor a guard "
                           f"binds: {'; '.join(what)}")

    def rule(self, *facts: Any, name: str, example: Example | None = None) -> Any:
        """egglog's ``rule(*facts).then(...)`` for a rule with several actions (each a union
        of equal terms, or a fact), recorded under ``name`` like :meth:`equal`."""
        self._record(name, example)
        return egglog.rule(*facts, name=name)


def _vector(op: str, key: str, values: list | tuple, kind: str) -> Any:
    """An ints or floats attribute given as a list or tuple (of numbers, or of i64 / f64 terms and variables)
    as the ``Vec`` egglog holds it; RewriteError naming the attribute for an item of another kind."""
    item = "int" if kind == "ints" else "float"
    wrong = RewriteError(f"e.{op}: attribute {key} is a list of {item}s ({kind}); got {list(values)!r}, which "
                         f"egglog cannot take as one: give {item}s or e.{'i64' if kind == 'ints' else 'f64'} terms, "
                         f"e.g. {key}=(1, 0)")
    if any(isinstance(v, bool) for v in values):  # egglog makes Bool terms of them: a Vec of the wrong sort
        raise wrong
    try:
        return egglog.convert(tuple(values), ATTR_SORTS[kind])
    except Exception:  # noqa: BLE001 - egglog's conversion error names neither the op nor the attribute
        raise wrong from None


def _refuse_sequence(value: Any, where: str) -> None:
    """RewriteError where a list or tuple stands for one term: egglog's own error (``Cannot convert
    [x] of type <class 'list'> to T``) names neither the cause nor the fix."""
    if not isinstance(value, list | tuple):
        return
    shown = ", ".join(map(str, value[:4])) + (", ..." if len(value) > 4 else "")
    raise RewriteError(f"{where} is a {type(value).__name__} of {len(value)} ([{shown}]), where one term belongs "
                       "(an e-node or a pattern variable). e.vars(...) returns a list, one variable per name, even "
                       "for one name: write `(x,) = e.vars(\"x\")` or `x = e.var(\"x\")`, not `x = e.vars(\"x\")`; "
                       "several inputs of a variadic op go as separate arguments (e.Concat(a, b), not "
                       "e.Concat([a, b]))")


__all__ = ["Namespace", "RuleRecord"]
