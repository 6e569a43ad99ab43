"""The rulesets, built from the rule groups the op families register (``ir.spec.rules``).

:data:`SCHEDULE` lists the optimisation rulesets in the order one pass runs them; the
analysis ruleset (facts the guards read) is saturated between passes. A rule group naming a
ruleset not listed here is refused, naming the group's function and family. Everything is
built once per process, on first use.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from egglog import RewriteOrRule, Ruleset, ruleset

from ..ir import RULES, InputError, RewriteError
from ..ir.sources import named_object
from . import egglog_private
from .dsl import Namespace, RuleRecord
from .sorts import ARG_SORTS

#: The optimisation rulesets, in schedule order.
SCHEDULE = ("algebraic", "recognition", "swiglu", "matmul_epilogue", "conv_epilogue", "norm_fusion", "attention",
            "quant", "elementwise_fusion")
#: The ruleset of analysis rules: facts, saturated before every optimisation pass.
ANALYSIS = "analysis"
#: Rulesets that never run by default (:func:`optional_ruleset`; ``select(optional=...)``, ``eggfuse optimize
#: --with-ruleset NAME``): ``f16`` changes values, rounding weights to float16 (``ir/ops/half.py``), and runs under
#: ``compile(..., precision="f16")``; ``layer_norm_prologue`` (a LayerNorm as the next product's prologue,
#: ``FusedLayerNormMatMul``) saves a dispatch a product but measured slower on an H200: GPT-2 small's c_attn and c_fc
#: 21% slower at 1,024 rows and 48% at 128 than LayerNorm and product apart
#: (``bench/results/layer_norm_prologue_h200.json``); ``gathered_products`` (``GatheredBatchMatMul``: the elements a
#: GatherElements takes of a product, each a dot product of its own, DeBERTa's position terms) saves 12 dispatches
#: of DeBERTa-v3-small but measured 2.2x slower on an H100, 11.24 against 4.99 ms a run
#: (``bench/results/deberta_h100/ab_deberta.json``): its one-element-an-invocation kernel reads each key row apart.
OPTIONAL = ("f16", "layer_norm_prologue", "gathered_products")

#: Rulesets whose rules are built on first use, each with the constructors one of which every rule
#: of it reads in its query (a test checks it): :func:`relevant` builds one only for an e-graph that
#: can hold one of them, so a graph without convolutions skips building ``conv_epilogue``'s 900
#: rules (0.8 s of the 1.4 s that building every ruleset takes on this machine).
LAZY = {"conv_epilogue": frozenset({"Conv", "Conv_2", "FusedConv", "FusedConvBn"})}

#: Ruleset -> its rules as (rule name, egglog rule), for every ruleset eggfuse built (the shipped
#: ones and those of :func:`make_ruleset`): what :func:`select` and the payoff report take apart.
#: Read it through :func:`members`, which builds a :data:`LAZY` ruleset's rules first.
_MEMBERS: dict[int, tuple[str, list[tuple[str, Any]]]] = {}
_PENDING: dict[int, Callable[[], None]] = {}  # a LAZY ruleset not built yet -> what builds its rules
_USER: set[int] = set()  # the rulesets of make_ruleset (and those without_rules made of them)
_SPEC: dict[int, str] = {}  # a ruleset of named_ruleset -> the module:NAME it was named by
_BUILD_LOCK = threading.RLock()
_ablated = itertools.count()


def members(rs: Ruleset) -> tuple[str, list[tuple[str, Any]]]:
    """(name, [(rule name, egglog rule), ...]) of a ruleset eggfuse built (KeyError for another),
    its rules built first if it is a :data:`LAZY` one not built yet (once, under a lock: another
    thread waits for the rules; a build that raises leaves it pending)."""
    if id(rs) in _PENDING:
        with _BUILD_LOCK:
            build = _PENDING.get(id(rs))
            if build is not None:
                build()
                del _PENDING[id(rs)]
    return _MEMBERS[id(rs)]


def fingerprint(rs: Ruleset) -> str:
    """The text of ``rs``'s rules (``egglog_private.ruleset_fingerprint``), a lazy one's built first."""
    if id(rs) in _MEMBERS:
        members(rs)
    return egglog_private.ruleset_fingerprint(rs)


def _register(rs: Ruleset, name: str, rules: Iterable[Any]) -> Ruleset:
    members = []
    for r in rules:
        rs.register(r)
        members.append((egglog_private.rule_name(r), r))
    _MEMBERS[id(rs)] = (name, members)
    weakref.finalize(rs, _MEMBERS.pop, id(rs), None)  # the entry goes with the ruleset (ids are reused)
    return rs


@functools.cache
def _built() -> tuple[dict[str, Ruleset], Namespace]:
    ns = Namespace()
    by_name = {name: ruleset(name=name) for name in (ANALYSIS, *SCHEDULE, *OPTIONAL)}
    groups: dict[str, list[Any]] = {name: [] for name in by_name}
    for group in RULES:
        if group.ruleset not in by_name:
            fn = f"{group.fn.__module__}.{group.fn.__qualname__}"
            raise RewriteError(f"the rule group {fn} (family {group.family or '?'}) registers rules for ruleset "
                               f"{group.ruleset!r}, which is not scheduled; rulesets: {', '.join(by_name)} "
                               "(rewrites/rulesets.py SCHEDULE, OPTIONAL)")
        groups[group.ruleset].append(group)

    def build(name: str) -> None:
        rules = []
        for group in groups[name]:
            ns.ruleset, ns.family = group.ruleset, group.family
            rules.extend(group.fn(ns))
        _register(by_name[name], name, rules)

    for name, rs in by_name.items():
        if name in LAZY:
            _register(rs, name, [])
            _PENDING[id(rs)] = functools.partial(build, name)
        else:
            build(name)
    return by_name, ns


def rulesets() -> dict[str, Ruleset]:
    """Ruleset name -> egglog ruleset, every rule built: the analysis ruleset, then
    :data:`SCHEDULE`, then :data:`OPTIONAL`."""
    by_name = _built()[0]
    for rs in by_name.values():
        members(rs)
    return by_name


def scheduled_rulesets() -> tuple[Ruleset, ...]:
    """The optimisation rulesets in schedule order, a :data:`LAZY` one perhaps not built yet: what
    the rewrite engine runs by default, whose :func:`relevant` builds such a ruleset where it can
    match. Anywhere else (an egglog schedule of one's own), take :func:`optimization_rulesets`."""
    by_name = _built()[0]
    return tuple(by_name[name] for name in SCHEDULE)


def optimization_rulesets() -> tuple[Ruleset, ...]:
    """The optimisation rulesets in schedule order (what :func:`~.engine.optimize` runs by default)."""
    out = scheduled_rulesets()
    for rs in out:
        members(rs)
    return out


def optional_ruleset(name: str) -> Ruleset:
    """The ruleset of :data:`OPTIONAL` called ``name``; RewriteError naming them otherwise."""
    if name not in OPTIONAL:
        raise RewriteError(f"unknown optional ruleset {name!r}; optional rulesets: {', '.join(OPTIONAL)}")
    rs = _built()[0][name]
    members(rs)
    return rs


def analysis_ruleset() -> Ruleset:
    return _built()[0][ANALYSIS]


def rule_records() -> tuple[RuleRecord, ...]:
    """Every shipped rule (name, ruleset, family, soundness example), in the order of
    :func:`rulesets` (the lazy rulesets' rules built)."""
    by_name, ns = _built()
    for rs in by_name.values():
        members(rs)
    order = {name: i for i, name in enumerate(by_name)}
    return tuple(sorted(ns.records, key=lambda r: order[r.ruleset]))


def make_ruleset(name: str, fn: Callable[[Namespace], Iterable[Any]]) -> Ruleset:
    """An egglog ruleset of the rules ``fn(e)`` yields, written as the shipped rule groups are
    (``e`` is a :class:`~.dsl.Namespace`): a rule of your own without editing eggfuse. Pass it to
    ``optimize(..., rulesets=[*optimization_rulesets(), mine])``."""
    if not isinstance(name, str) or not name:
        raise RewriteError(f"make_ruleset: the name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise RewriteError(f"make_ruleset({name!r}): fn must be a function of the namespace e yielding rules, "
                           f"got {fn!r}")
    ns = Namespace()
    ns.ruleset, ns.family = name, "user"
    label = getattr(fn, "__qualname__", repr(fn))
    hint = "it must yield rules made with e.equal(name, lhs, rhs) or e.rule(..., name=...)"
    try:
        made = fn(ns)
        if isinstance(made, RewriteOrRule):  # `return e.equal(...)`: iterating the rule itself said only "not iterable"
            raise RewriteError(f"make_ruleset({name!r}): {label}(e) returned one rule instead of yielding it: write "
                               "`yield e.equal(...)` for each rule (or return a list of them)")
        rules = None if made is None else list(made)
    except RewriteError:
        raise
    except Exception as err:  # the user's function: its error, named
        raise RewriteError(f"make_ruleset({name!r}): {label}(e) raised {type(err).__name__}: {err}") from err
    if rules is None:
        raise RewriteError(f"make_ruleset({name!r}): {label}(e) returned None; {hint}")
    for i, r in enumerate(rules):
        if not isinstance(r, RewriteOrRule):
            raise RewriteError(f"make_ruleset({name!r}): item {i} that {label}(e) yielded is {r!r} "
                               f"({type(r).__name__}), not a rule; {hint}")
    return _user_made(_register(ruleset(name=name), name, rules))


def is_own(rs: Ruleset) -> bool:
    """Whether ``rs`` is a ruleset of one's own, made with :func:`make_ruleset`."""
    return id(rs) in _USER


def _user_made(rs: Ruleset) -> Ruleset:
    _USER.add(id(rs))
    weakref.finalize(rs, _USER.discard, id(rs))
    return rs


def named_ruleset(spec: str) -> Ruleset:
    """The ruleset ``NAME`` of ``module:NAME`` (a module importable from ``sys.path`` or the current folder) or
    ``path/to/file.py:NAME``, a ruleset made with :func:`make_ruleset`: how ``--rulesets`` and :func:`select`
    take a ruleset of one's own by its source, which a sweep's worker process imports again.

    Raises :class:`InputError` naming ``spec`` when the module does not import (its error, its own
    :func:`make_ruleset` call's included), has no such name, or ``NAME`` is not a ruleset made with
    :func:`make_ruleset` (a rule function, an egglog ruleset made otherwise, anything else)."""
    obj = named_object(spec, "ruleset", "ruleset")
    if id(obj) not in _USER:
        where, _, name = spec.rpartition(":")
        how = "make_ruleset(name, rule_function), from eggfuse.rewrites"
        if isinstance(obj, Ruleset):
            fix = ("an egglog ruleset eggfuse did not build (its rules unknown to the report and the checks): "
                   f"make it with {how}")
        elif callable(obj):
            kind = "class" if isinstance(obj, type) else "function"
            fix = (f"a {kind}, not a ruleset: for a rule function, make a ruleset of it in {where} "
                   f"(MINE = make_ruleset(\"mine\", {name})) and give {where}:MINE")
        else:
            fix = f"of type {type(obj).__name__}, not a ruleset: give the name of a ruleset made with {how}"
        raise InputError(f"ruleset {spec!r}: {name} in {where} is {fix}")
    if id(obj) not in _SPEC:
        weakref.finalize(obj, _SPEC.pop, id(obj), None)
    _SPEC[id(obj)] = spec
    return obj


def ruleset_spec(rs: Ruleset) -> str | None:
    """The ``module:NAME`` that :func:`named_ruleset` last found ``rs`` by, else None."""
    return _SPEC.get(id(rs))


def shipped_name(rs: Ruleset) -> str | None:
    """The name of ``rs`` when it is one of the rulesets eggfuse ships (their rules are eggfuse's source,
    which a compile cache key already covers), else None; builds no lazy ruleset's rules."""
    by_name = _built()[0]
    name = _MEMBERS.get(id(rs), (None,))[0]
    return name if name in by_name and by_name[name] is rs else None


def ruleset_name(rs: Ruleset) -> str:
    """The name of ``rs``: as given to :func:`make_ruleset` or :data:`SCHEDULE`, else egglog's."""
    if id(rs) in _MEMBERS:
        return _MEMBERS[id(rs)][0]  # the name needs no rules built
    return egglog_private.ruleset_ident(rs)


def rules_of(rs: Ruleset) -> list[str] | None:
    """The rule names of a ruleset eggfuse built, in registration order; None for another."""
    return [n for n, _ in members(rs)[1]] if id(rs) in _MEMBERS else None


def without_rules(rs: Ruleset, drop: set[str]) -> Ruleset:
    """A ruleset of the rules of ``rs`` (built by eggfuse) except those named in ``drop``:
    ``rs`` itself when it holds none of them. Its egglog name is new (``<name>_ablated_<n>``),
    its :func:`ruleset_name` that of ``rs``."""
    name, rules = members(rs)
    keep = [r for n, r in rules if n not in drop]
    if len(keep) == len(rules):
        return rs
    out = _register(ruleset(name=f"{name}_ablated_{next(_ablated)}"), name, keep)
    return _user_made(out) if id(rs) in _USER else out


def select(names: Sequence[str] | None = None, disable: Sequence[str] = (),
           rulesets: Sequence[Ruleset] | None = None, optional: Sequence[str] = (),
           precision: str = "f32") -> tuple[Ruleset, ...]:
    """The optimisation rulesets to run: of ``rulesets`` (default :func:`optimization_rulesets`)
    those named in ``names`` (None: all; the name ``all`` stands for all of them), then the
    :data:`OPTIONAL` ones named in ``optional`` or ``names``, then rulesets of one's own named in
    ``names`` or ``optional`` as ``module:NAME`` or ``path/to/file.py:NAME`` (:func:`named_ruleset`; in
    ``optional``, as ``--with-ruleset``, run on top of the selection), less the rules named in
    ``disable`` (theirs included).
    The analysis ruleset is not among them: it always runs. ``precision="f16"`` puts the ``f16``
    ruleset first, as ``eggfuse.compile(..., precision="f16")`` runs it, so that ``disable`` can
    name its rules too (``compile`` then adds no second one).

    Raises :class:`RewriteError` naming an unknown ruleset or rule (with the closest known
    name; a rule of an optional ruleset not asked for says so), the analysis ruleset, a rule of a
    ruleset eggfuse did not build, ``f16`` in ``names`` or ``optional`` (``precision="f16"``
    runs that one), a ruleset of one's own whose name is that of another ruleset, or a string where a list of
    names belongs (``disable="rule"``); and
    :class:`InputError` for a ``module:NAME`` that is not a ruleset (:func:`named_ruleset`).
    """
    if precision not in ("f32", "f16"):
        raise RewriteError(f"precision must be 'f32' or 'f16', got {precision!r}")
    for arg, given in (("names", names), ("disable", disable), ("optional", optional)):
        if isinstance(given, str | bytes):  # a bare name would be read letter by letter
            # ruleset names hold no comma (the command line's NAME,NAME form); rule names may
            listed = ([n.strip() for n in given.split(",") if n.strip()] if isinstance(given, str) and arg != "disable"
                      else [given])
            raise RewriteError(f"select's {arg} is a list of names, got the string {given!r}: write {arg}={listed!r}")
    pool = tuple(scheduled_rulesets() if rulesets is None else rulesets)
    for n in optional:
        if n not in OPTIONAL and ":" not in n:
            raise RewriteError(f"unknown optional ruleset {n!r}: optional rulesets: "
                               f"{', '.join(x for x in OPTIONAL if x != 'f16')} (f16: precision='f16')"
                               f"{_closest(n, OPTIONAL)}; a ruleset of your own (make_ruleset): module:NAME or "
                               "path/to/file.py:NAME")
    user: dict[str, Ruleset] = {}  # the rulesets of module:NAME entries of names and optional, by their names
    taken = {ANALYSIS, *SCHEDULE, *OPTIONAL, *map(ruleset_name, pool)}
    if names is not None:
        names = [_user_entry(n, user, taken) if ":" in n else n for n in names]
    added = [_user_entry(n, user, taken) for n in optional if ":" in n]  # run on top of the selection
    optional = [n for n in optional if ":" not in n]
    if "f16" in [*optional, *(names or ())]:
        raise RewriteError("precision='f16' adds the f16 ruleset already: leave it out of the names"
                           if precision == "f16" else
                           "the f16 ruleset rounds weights to float16: compile with precision='f16' "
                           "(eggfuse.pipeline.precision_rulesets), which also reports it")
    if precision == "f16" and not any(ruleset_name(rs) == "f16" for rs in pool):
        pool = (optional_ruleset("f16"), *pool)
    if names is not None and "all" in names:  # all,layer_norm_prologue (f16 comes with the precision alone)
        names = list(dict.fromkeys(x for n in names for x in (
            (r for r in map(ruleset_name, pool) if r != "f16") if n == "all" else (n,))))
    wanted = [*optional, *(n for n in names or () if n in OPTIONAL)]
    have = {ruleset_name(rs) for rs in pool}
    pool += tuple(optional_ruleset(n) for n in dict.fromkeys(wanted) if n not in have)
    pool += tuple(user.values())
    by_name = {ruleset_name(rs): rs for rs in pool}
    if names is not None:
        for n in names:
            if n not in by_name:
                what = "the analysis ruleset always runs and cannot be selected" if n == ANALYSIS else \
                    f"rulesets: all (the scheduled ones), {', '.join(x for x in by_name if x not in OPTIONAL)}; " \
                    f"optional: {', '.join(OPTIONAL)}{_closest(n, ['all', *by_name, *OPTIONAL])}; a ruleset of " \
                    "your own (make_ruleset): module:NAME or " \
                    "path/to/file.py:NAME"
                raise RewriteError(f"unknown ruleset {n!r}: {what}")
        pool = tuple(rs for name, rs in by_name.items() if name in {*names, *optional, *added}
                     or (precision == "f16" and name == "f16"))
    known = {rule: ruleset_name(rs) for rs in pool for rule in rules_of(rs) or ()} if disable else {}
    for rule in disable:
        if rule not in known:
            analysis = rule in (rules_of(analysis_ruleset()) or ())
            home = next((n for n in OPTIONAL if rule in (rules_of(optional_ruleset(n)) or ())), None)
            if home == "f16":
                raise RewriteError(f"rule {rule!r} is of the f16 ruleset, which runs only with precision='f16' "
                                   "(eggfuse optimize/run --precision f16; select(..., precision='f16'))")
            if home is not None:
                raise RewriteError(f"rule {rule!r} is of the optional ruleset {home!r}, which does not run unless "
                                   f"asked for (eggfuse optimize --with-ruleset {home}; select(optional=[{home!r}]))")
            if rule in by_name or rule in OPTIONAL:
                raise RewriteError(f"{rule!r} is a ruleset, not a rule: to leave a ruleset out, name the rulesets to "
                                   "run (eggfuse optimize --rulesets NAME,NAME; select(names=[...])); `eggfuse rules` "
                                   "lists both")
            left_out = next((name for name, rs in by_name.items() if rule in (rules_of(rs) or ())), None)
            if left_out is not None:
                raise RewriteError(f"rule {rule!r} is of the ruleset {left_out!r}, which the selected rulesets "
                                   f"({', '.join(names or ())}) leave out: it does not run anyway")
            raise RewriteError(f"unknown rule {rule!r}" + (": analysis rules always run" if analysis else
                               f" in the selected rulesets ({', '.join(by_name if names is None else names)})"
                               f"{_closest(rule, known)}; `eggfuse rules` lists them"))
    drop = set(disable)
    return tuple(without_rules(rs, drop) if drop and id(rs) in _MEMBERS else rs for rs in pool)


def _user_entry(spec: str, user: dict[str, Ruleset], taken: set[str]) -> str:
    """The name of the ruleset ``spec`` (``module:NAME``) names, added to ``user``: :func:`select`'s
    ``names`` entry of a ruleset of one's own. RewriteError where its name is another ruleset's."""
    rs = named_ruleset(spec)
    name = ruleset_name(rs)
    if name in taken or user.get(name, rs) is not rs:
        if name in user:
            other = f"the ruleset of another entry ({ruleset_spec(user[name])})"
        elif name in (ANALYSIS, *SCHEDULE, *OPTIONAL):
            other = "a shipped ruleset"
        else:
            other = "a ruleset of those to select from"
        raise RewriteError(f"ruleset {spec!r} is named {name!r}, as {other} is: give it a name of its own "
                           "(the first argument of make_ruleset)")
    user[name] = rs
    return name


#: Ruleset id -> (rule name, constructors its query calls, constructors its actions call) per rule,
#: and -> {rule names dropped: the ruleset without them}: what :func:`relevant` computed before.
_CALLS: dict[int, list[tuple[str, frozenset[str], frozenset[str]]]] = {}
_PRUNED: dict[int, dict[frozenset[str], Ruleset]] = {}
_EMPTY: dict[int, Ruleset] = {}  # a LAZY ruleset -> the empty ruleset relevant() gives while it cannot match


def _calls(rs: Ruleset) -> list[tuple[str, frozenset[str], frozenset[str]]]:
    if id(rs) not in _CALLS:
        rows = []
        for name, rule in members(rs)[1]:
            body, head = egglog_private.rule_calls(rule)
            rows.append((name, frozenset(body & ARG_SORTS.keys()), frozenset(head & ARG_SORTS.keys())))
        _CALLS[id(rs)] = rows
        weakref.finalize(rs, _forget, id(rs))
    return _CALLS[id(rs)]


def _forget(key: int) -> None:
    _CALLS.pop(key, None)
    _PRUNED.pop(key, None)


def check_ruleset_objects(rulesets: Any, what: str) -> None:
    """Raise :class:`RewriteError` (its text starting with ``what``, the function given them) unless ``rulesets``
    is a list (or other sequence) of egglog Rulesets: names given where Ruleset objects belong
    (``rulesets=["algebraic"]``) are answered with the function that takes names (:func:`select`)."""
    by_name = ("pass the shipped ones (eggfuse.rewrites.optimization_rulesets()) and your own from make_ruleset; "
               "for rulesets by name use eggfuse.rewrites.select(['algebraic', ...]) (`eggfuse rules` lists them)")
    if isinstance(rulesets, str | bytes) or not isinstance(rulesets, Sequence):
        raise RewriteError(f"{what}: rulesets must be a list of egglog Rulesets, got {type(rulesets).__name__} "
                           f"{rulesets!r:.60}; {by_name}")
    for i, rs in enumerate(rulesets):
        if not isinstance(rs, Ruleset):
            raise RewriteError(f"{what}: rulesets[{i}] is {rs!r:.60} ({type(rs).__name__}), not an egglog Ruleset; "
                               f"{by_name}")


def check_rule_names(rulesets: Sequence[Ruleset]) -> None:
    """Raise :class:`RewriteError` where ``rulesets`` hold one of :func:`make_ruleset` and a rule runs with
    another of its name (of another ruleset given, or of the analysis ruleset): egglog keeps one rule per
    name, so one of the two would silently not run. Rulesets eggfuse did not build (their rule names
    unknown) are not checked; a ruleset given twice is one ruleset. Builds the lazy rulesets given."""
    given = list({id(rs): rs for rs in rulesets}.values())
    if not any(id(rs) in _USER for rs in given):
        return  # the shipped rules share one namespace, which refuses a second rule of a name
    seen: dict[str, tuple[str, Any]] = {}  # rule name -> (its ruleset's name, the egglog rule)
    for rs in (analysis_ruleset(), *given):
        if id(rs) not in _MEMBERS:
            continue
        name, rules = members(rs)
        for rule, made in rules:
            # a rule object of another ruleset (without_rules' copies share the rule objects of the one they thin)
            if rule in seen and seen[rule][1] is not made:
                other = seen[rule][0]
                where = f"another ruleset named {other!r}" if other == name else f"ruleset {other!r}"
                raise RewriteError(f"rule {rule!r} of ruleset {name!r} has the name of a rule of {where}; "
                                   "egglog keeps one rule per name, so one of them would not run: give your rule "
                                   "another name (the first argument of e.equal, name= of e.rule)")
            seen[rule] = (name, made)


def relevant(rulesets: Sequence[Ruleset], present: Iterable[str]) -> tuple[Ruleset, ...]:
    """``rulesets`` less the rules that cannot match an e-graph whose e-nodes are made by the
    constructors ``present`` (names as in ``sorts.ARG_SORTS``), nor by what the remaining rules
    build (a fixpoint over their actions). Rulesets come back in order, each itself when it
    loses no rule; all of them as given when one was not built by eggfuse (its rules are not
    known). The rules of a fusable op that the graph does not hold cost saturation time
    (egglog takes about 0.25 ms per rule per pass) and can never fire.
    """
    if any(id(rs) not in _MEMBERS for rs in rulesets):  # a foreign ruleset: every rule runs, lazy ones built
        for rs in rulesets:
            if id(rs) in _MEMBERS:
                members(rs)
        return tuple(rulesets)
    asleep = {id(rs): LAZY[_MEMBERS[id(rs)][0]] for rs in rulesets if id(rs) in _PENDING}  # LAZY, not built
    rows = [[] if id(rs) in asleep else _calls(rs) for rs in rulesets]
    have = set(present)
    changed = True
    while changed:
        changed = False
        for table in rows:
            for _, body, head in table:
                if body <= have and not head <= have:
                    have |= head
                    changed = True
        for i, rs in enumerate(rulesets):  # a lazy ruleset whose constructors the e-graph can hold: built
            if id(rs) in asleep and asleep[id(rs)] & have:
                del asleep[id(rs)]
                rows[i] = _calls(rs)
                changed = True
    out = []
    for rs, table in zip(rulesets, rows, strict=True):
        if id(rs) in asleep:  # none of its rules can match: an empty ruleset of its name, left unbuilt
            if id(rs) not in _EMPTY:
                _EMPTY[id(rs)] = _register(ruleset(name=f"{_MEMBERS[id(rs)][0]}_ablated_{next(_ablated)}"),
                                           _MEMBERS[id(rs)][0], [])
            out.append(_EMPTY[id(rs)])
            continue
        drop = frozenset(name for name, body, _ in table if not body <= have)
        if not drop:
            out.append(rs)
            continue
        cache = _PRUNED.setdefault(id(rs), {})
        if drop not in cache:
            cache[drop] = without_rules(rs, set(drop))
        out.append(cache[drop])
    return tuple(out)


def _closest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def catalog() -> dict[str, list[str]]:
    """Ruleset name -> rule names, analysis first, then the optimisation rulesets in schedule order,
    then the optional ones."""
    out: dict[str, list[str]] = {name: [] for name in (ANALYSIS, *SCHEDULE, *OPTIONAL)}
    for r in rule_records():
        out[r.ruleset].append(r.name)
    return out


__all__ = ["ANALYSIS", "LAZY", "OPTIONAL", "SCHEDULE", "analysis_ruleset", "catalog", "fingerprint", "make_ruleset",
           "members", "named_ruleset", "optimization_rulesets", "optional_ruleset", "scheduled_rulesets",
           "relevant", "rule_records", "rules_of", "ruleset_name", "ruleset_spec", "rulesets", "select",
           "without_rules"]
