"""Rule soundness by evaluation: every e-node of an e-class must compute the same tensor.

After saturation each e-class holds terms that the rules claim are equal. This check
evaluates every e-node with the numpy reference (the IR's semantics, through the same
rebuild that extraction uses) on random inputs and compares it with its e-class's value.
It checks each rule that fired, whatever extraction would pick, so a rule that never
pays under the cost model is still tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from egglog import Ruleset

from ..ir import OPS, DType, Graph, GraphError, RewriteError, TensorType, evaluate
from ..ir.reference import as_reference
from ..ir.spec import ShapeError
from .diagnose import unsound_culprits
from .engine import Report, random_feeds, saturate
from .problem import Decoder
from .rulesets import (
    _MEMBERS,
    _USER,
    _closest,
    analysis_ruleset,
    check_rule_names,
    optimization_rulesets,
    rules_of,
    ruleset_name,
    without_rules,
)
from .rulesets import rulesets as shipped_rulesets
from .sorts import ARG_SORTS, SIGNATURES


@dataclass
class SoundnessReport:
    rules_fired: dict[str, int]
    eclasses_checked: int
    enodes_checked: int


#: check_sound's default tolerances, relative and absolute, between two e-nodes' float64 values.
RTOL, ATOL = 1e-5, 1e-6


def check_sound(graph: Graph, *, rulesets: Sequence[Ruleset] | None = None, seed: int = 0,
                rtol: float = RTOL, atol: float = ATOL) -> SoundnessReport:
    """Saturate ``graph`` with ``rulesets`` (default: all) and check every e-class numerically.

    Inputs and parameters are random (see :func:`~.engine.random_feeds`); values are the
    reference's (float64 for f32 tensors; NaN where the reference gives NaN, e.g. a log of a
    negative number, must appear in both). Raises :class:`RewriteError` naming the rule (the
    rule that fired without which the check passes, :mod:`.diagnose`), the e-class and the
    two disagreeing e-nodes if any e-node computes something else than its e-class.
    """
    rulesets = tuple(optimization_rulesets() if rulesets is None else rulesets)
    check_rule_names(rulesets)  # two rules of one name: egglog runs one of them, and the other went unchecked
    rep, failure = _check(graph, rulesets, seed, rtol, atol)
    if failure is None:
        return rep
    fails = lambda rs: _check(graph, rs, seed, rtol, atol)[1] is not None  # noqa: E731
    who = unsound_culprits(rulesets, rep.rules_fired, fails) or _alone_culprits(rulesets, rep.rules_fired, fails)
    named = (f"unsound {' and '.join(who)}: " if who else
             "unsound rules (no single rule left out makes it consistent; rules that fired: "
             f"{', '.join(sorted(rep.rules_fired))}): ")
    raise RewriteError(named + failure)


def _alone_culprits(rulesets: Sequence[Ruleset], fired: dict[str, int], fails) -> list[str]:
    """Where no one rule left out makes the check pass (two unsound rules): each fired rule of a ruleset of
    one's own run alone beside the other rulesets (the shipped ones, tested rule by rule): the rules with which
    it fails (one saturation and check per such rule, on this error path only)."""
    out = []
    for i, rs in enumerate(rulesets):
        if id(rs) not in _USER or id(rs) not in _MEMBERS:
            continue
        others = [r for j, r in enumerate(rulesets) if j != i and id(r) not in _USER]
        names = rules_of(rs) or ()
        for rule in names:
            if fired.get(rule) and fails([*others, without_rules(rs, set(names) - {rule})]):
                out.append(f"rule {rule!r} (ruleset {ruleset_name(rs)})")
    return out


def _check(graph: Graph, rulesets: Sequence[Ruleset], seed: int, rtol: float,
           atol: float) -> tuple[SoundnessReport, str | None]:
    """The soundness check itself: its report, and the first inconsistency found (None if none)."""
    rep = Report()
    enc = saturate(graph, rep, rulesets=rulesets)
    inputs, params = random_feeds(graph, seed)
    dec = Decoder(enc.raw)
    tensor = {c for c, d in enc.raw["class_data"].items() if d.get("type") in ("T", "Ex")}
    values: dict[str, np.ndarray] = {}
    checked = 0
    pending = {c: list(ms) for c, ms in dec.members.items() if c in tensor}
    progress = True
    while progress:
        progress = False
        for c in list(pending):
            for nid in list(pending[c]):
                try:
                    result = _evaluate_enode(dec, nid, values, enc, inputs, params)
                except (ShapeError, GraphError) as e:  # a rule put an e-node on inputs its op cannot take
                    return SoundnessReport(rep.rules_fired, len(values), checked), (
                        f"e-class {c}: e-node {dec.nodes[nid]['op']} cannot be computed on the values of its "
                        f"inputs ({e}): a rule whose two sides have different shapes or dtypes is unsound")
                if result is None:
                    continue
                pending[c].remove(nid)
                progress = True
                checked += 1
                if c not in values:
                    values[c] = result
                elif result.shape != values[c].shape or not np.allclose(result, values[c], rtol=rtol, atol=atol,
                                                                        equal_nan=True):
                    other = next(m for m in dec.members[c] if m not in pending[c] and m != nid)
                    how = _difference(result, values[c])
                    return SoundnessReport(rep.rules_fired, len(values), checked), (
                        f"e-class {c}: e-node {dec.nodes[nid]['op']} and e-node {dec.nodes[other]['op']} differ "
                        f"({how})")
            if not pending[c]:
                del pending[c]
    return SoundnessReport(rep.rules_fired, len(values), checked), None


def _difference(a: np.ndarray, b: np.ndarray) -> str:
    """How two values of one e-class differ, for the message: their shapes, where NaN stands in one and a
    number in the other (a NaN has no error to measure), else the largest absolute error."""
    if a.shape != b.shape:
        return f"their shapes differ: {list(a.shape)} vs {list(b.shape)}"
    with np.errstate(all="ignore"):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        nan = np.isnan(a64) != np.isnan(b64)
        if nan.any():
            return (f"NaN in one and a number in the other at {int(nan.sum())} of {nan.size} elements, the first at "
                    f"index {[int(i) for i in np.unravel_index(int(np.argmax(nan)), nan.shape)]}")
        return f"max abs error {float(np.nanmax(np.abs(a64 - b64))):.6g}"


#: The IR dtype of a reference value by its numpy kind (``ir.reference.as_reference``).
_KIND_DTYPE = {"f": DType.F32, "i": DType.I32, "u": DType.U32, "b": DType.BOOL}


def _evaluate_enode(dec: Decoder, nid: str, values: dict, enc, inputs, params):
    """The e-node's value, or None while one of its tensor inputs has no value yet. The op's
    reference runs on its inputs' values as they are (float64, int64, uint32, bool), so two
    e-nodes of one e-class differ only by float64 rounding, whatever the op's conditioning. An
    ``Ex`` e-node's value is its region's value (its op's reference with numpy broadcasting), a
    ``Fused`` e-node's that of its ``Ex`` e-class."""
    if dec.nodes[nid]["op"] in ARG_SORTS and dec.raw["class_data"][dec.cls[nid]].get("type") == "Ex":
        return _evaluate_ex(dec, nid, values)
    e = dec.enode(nid)
    if e.ex is not None:
        return values.get(e.ex)
    if (epi := OPS[e.op].epilogue_attr) is not None and not all(isinstance(s, str) for s in e.attrs[epi.name]):
        e = _with_concrete_regions(dec, nid, e, epi.name, values)
        if e is None:
            return None
    if e.op in ("Input", "Parameter", "Constant"):
        return evaluate(_single_leaf(enc.leaves[(e.op, e.attrs["name"])]), inputs, params)[0]
    if not all(i in values for i in e.inputs):
        return None
    spec = OPS[e.op]
    args = [values[c] for c in e.inputs]
    attrs = Graph._attributes(spec, dict(e.attrs))
    ty = spec.infer([TensorType(a.shape, _KIND_DTYPE[a.dtype.kind]) for a in args], attrs)
    with np.errstate(all="ignore"):
        return as_reference(np.asarray(spec.reference(args, attrs)).reshape(ty.shape), ty)


def _with_concrete_regions(dec: Decoder, nid: str, e, name: str, values: dict):
    """E-node ``e`` (a fused matmul or convolution whose chain holds generated regions, each a
    ``("ex", e-class)`` step) with each region written out as an ``("expr", steps)`` step of one
    term of its ``Ex`` e-class (``ir/ops/fused_epilogue.py``) and its leaves among the inputs in
    chain order; None while a leaf has no value. A region's ``Ex`` e-classes have no value of
    their own (they read the accumulator, ``ExAcc``): they are checked through the e-nodes that
    hold them."""
    fixed = SIGNATURES[dec.nodes[nid]["op"]].tensors
    chain, epi = [], dec.cls[dec.nodes[nid]["children"][-1]]
    while (n := dec.nodes[dec.first(epi)])["op"] != "Epi.none":
        chain.append(n)
        epi = dec.cls[n["children"][0]]
    plain = iter(e.inputs[fixed:])
    steps, inputs = [], list(e.inputs[:fixed])
    for n, step in zip(reversed(chain), e.attrs[name], strict=True):
        if n["op"] == "Epi.ex":
            region, leaves = [], []
            if _concrete(dec, dec.cls[n["children"][1]], region, leaves, values, {}, set()) is None:
                return None
            steps.append(("expr", tuple(region)))
            inputs += leaves
        else:
            steps.append(step)
            if n["op"] in ("Epi.bias", "Epi.add"):
                inputs.append(next(plain))
    return type(e)(e.op, e.attrs | {name: tuple(steps)}, inputs)


def _concrete(dec: Decoder, c: str, steps: list, leaves: list, values: dict, done: dict, busy: set) -> int | None:
    """Append one term of ``Ex`` e-class ``c`` to ``steps`` (``ExAcc`` as input 0, the tensors
    its ``ExLeaf`` e-nodes read to ``leaves``, inputs 1, 2, ...); its step index, or None."""
    if c in done:
        return done[c]
    busy.add(c)
    for nid in dec.members.get(c, []):
        x = dec.ex_node(nid)
        if x.op == "acc":
            steps.append(("input", (), (0,)))
        elif x.op == "leaf":
            if x.args[0] not in values:
                continue
            leaves.append(x.args[0])
            steps.append(("input", (), (len(leaves),)))
        elif x.op == "const":
            steps.append(("const", tuple(sorted(x.attrs.items())), ()))
        else:
            args = [None if a in busy else _concrete(dec, a, steps, leaves, values, done, busy) for a in x.args]
            if any(a is None for a in args):
                continue
            steps.append((x.op, tuple(x.attrs.items()), tuple(args)))
        busy.discard(c)
        done[c] = len(steps) - 1
        return done[c]
    busy.discard(c)
    return None


def _evaluate_ex(dec: Decoder, nid: str, values: dict):
    x = dec.ex_node(nid)
    if x.op == "acc":
        return None
    if x.op == "const":
        ty = TensorType(tuple(x.attrs["shape"]), DType(x.attrs["dtype"]))
        value = x.attrs["value"]
        return as_reference(np.full(ty.shape, np.float32(value) if ty.dtype is DType.F32 else value), ty)
    if not all(a in values for a in x.args):
        return None
    if x.op == "leaf":
        return values[x.args[0]]
    spec = OPS[x.op]
    args = [values[c] for c in x.args]
    attrs = Graph._attributes(spec, dict(x.attrs))
    ty = spec.infer([TensorType(a.shape, _KIND_DTYPE[a.dtype.kind]) for a in args], attrs)
    with np.errstate(all="ignore"):
        return as_reference(np.asarray(spec.reference(args, attrs)).reshape(ty.shape), ty)


def _single_leaf(leaf) -> Graph:
    g = Graph()
    if leaf.op == "Constant":
        g.set_outputs([g.constant(leaf.attrs["value"], shape=leaf.type.shape, dtype=leaf.type.dtype)])
    elif leaf.op == "Input":
        g.set_outputs([g.input(leaf.attrs["name"], leaf.type.shape, leaf.type.dtype)])
    else:
        g.set_outputs([g.parameter(leaf.attrs["name"], leaf.type.shape, leaf.type.dtype)])
    return g


def _check_rule_known(rule: str, rulesets: Sequence[Ruleset]) -> None:
    """RewriteError where none of ``rulesets`` nor the analysis ruleset has a rule named ``rule``: it
    could never fire, and the property test would run every example first. Rulesets eggfuse did not
    build (their rule names unknown) leave the name unchecked."""
    known: dict[str, str] = {}
    for rs in (analysis_ruleset(), *rulesets):
        names = rules_of(rs)
        if names is None:
            return
        known.update((n, ruleset_name(rs)) for n in names)
    if rule in known:
        return
    searched = list(dict.fromkeys(ruleset_name(rs) for rs in rulesets))
    where = ", ".join(searched) or "none"
    shipped_rulesets()  # every shipped ruleset's rules built, so that _MEMBERS lists them
    homes = list(dict.fromkeys(name for name, rules in list(_MEMBERS.values()) if any(n == rule for n, _ in rules)))
    if homes:
        which = (f"the ruleset {homes[0]!r}, which rulesets= does not hold" if len(homes) == 1 else
                 f"the rulesets {', '.join(map(repr, homes))}, which rulesets= does not hold")
        raise RewriteError(f"rule {rule!r} is of {which} (rulesets searched: {where}, and the analysis ruleset): "
                           f"pass {'that ruleset' if len(homes) == 1 else 'the one you mean'} too")
    raise RewriteError(f"unknown rule {rule!r} in the rulesets searched ({where}, and the analysis ruleset)"
                       f"{_closest(rule, known)}; `eggfuse rules` lists the shipped ones")


def assert_rule_sound(rule: str, build, *, rulesets: Sequence[Ruleset] | None = None, max_examples: int = 10,
                      max_dim: int = 7, tol: float | None = None) -> None:
    """Property test of one rule: on graphs from ``build`` with random sizes, the rule fires
    and every e-class stays consistent (:func:`check_sound`).

    ``build(g, dim)`` adds nodes and outputs to the empty graph ``g``; ``dim(name)`` returns
    a size in 1..``max_dim`` drawn by hypothesis, the same for the same name within one
    example (``dim(name, lo, hi)`` to choose the range). Needs the ``hypothesis`` package
    (the ``dev`` extra). ``tol`` (relative and absolute) replaces :func:`check_sound`'s
    tolerances for a rule that changes values within a bound (``Example.tol``). Raises
    ``AssertionError`` if the rule never fires,
    :class:`RewriteError` (shrunk to a small example) if an e-class is inconsistent, and, before any
    example runs, :class:`RewriteError` naming the rulesets searched when no ruleset of ``rulesets``
    (nor the analysis ruleset) has a rule named ``rule`` (with the closest name, or the ruleset
    that has it and was not passed).
    """
    chosen = tuple(optimization_rulesets() if rulesets is None else rulesets)
    _check_rule_known(rule, chosen)
    check_rule_names(chosen)
    tolerances = (RTOL, ATOL) if tol is None else (tol, tol)
    from hypothesis import given, settings
    from hypothesis import strategies as st

    fired = []

    # one failure, the smallest (several distinct ones came as hypothesis's ExceptionGroup)
    @settings(max_examples=max_examples, deadline=None, database=None, report_multiple_bugs=False)
    @given(st.data())
    def run(data) -> None:
        dims: dict[str, int] = {}

        def dim(name: str, lo: int = 1, hi: int = max_dim) -> int:
            if name not in dims:
                dims[name] = data.draw(st.integers(lo, hi), label=name)
            return dims[name]

        g = Graph()
        build(g, dim)
        # the check alone while hypothesis shrinks; the culprits are named once, on the smallest failing graph
        report, failure = _check(g, chosen, 0, *tolerances)
        if failure is not None:
            raise _Inconsistent(g)
        fired.append(report.rules_fired.get(rule, 0))

    try:
        run()
    except _Inconsistent as e:
        check_sound(e.graph, rulesets=chosen, rtol=tolerances[0], atol=tolerances[1])  # raises, naming the rule
        raise RewriteError(f"rule {rule!r}: an e-class of a graph from build was inconsistent once, and not when "
                           "checked again: the rules or build are not deterministic") from None
    assert any(fired), f"rule {rule!r} never fired on {len(fired)} graphs"


class _Inconsistent(Exception):
    """A graph of :func:`assert_rule_sound`'s property on which :func:`_check` found an inconsistent e-class."""

    def __init__(self, graph: Graph) -> None:
        super().__init__("an e-class is inconsistent")
        self.graph = graph
