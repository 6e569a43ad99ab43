"""Rules of one's own (``make_ruleset``) that are wrong: each is refused with a RewriteError that
names what is wrong, never a silently different graph or a bare egglog error."""

from __future__ import annotations

import re

import pytest

from eggfuse.ir import DType, Graph, RewriteError
from eggfuse.rewrites import CostModel, make_ruleset, optimization_rulesets, optimize
from eggfuse.rewrites.engine import Report, saturate
from eggfuse.rewrites.extract import rebuild
from eggfuse.rewrites.ilp import extract_ilp
from eggfuse.rewrites.problem import build_problem


def _add_to_slice(e):
    a, b = e.vars("a b")
    # unsound: f32[M,N] -> f32[M,3]
    yield e.equal("Add(a,b) -> SliceCols(a,0,3)", e.Add(a, b), e.SliceCols(a, start=e.i64(0), size=e.i64(3)))


def _embedding_to_indices(e):
    ids, table = e.vars("ids table")
    # unsound: f32[T,1] -> u32[T,1], the same shape of another dtype
    yield e.equal("Embedding(ids,t) -> Identity(ids)", e.Embedding(ids, table),
                  e.Identity(ids, shape=e.Vec[e.i64](e.i64(4), e.i64(1))))


def _softmax_of_add() -> Graph:
    # (a Softmax, not an elementwise op: Relu(Add) would be one generated kernel, cheaper than the slice)
    g = Graph()
    g.set_outputs([g.softmax(g.add(g.input("x", [4, 6]), g.input("y", [4, 6])))])
    return g


def _embedding() -> Graph:
    g = Graph()
    g.set_outputs([g.embedding(g.input("ids", [4], DType.U32), g.parameter("table", [5, 1]))])
    return g


CASES = [
    (_add_to_slice, _softmax_of_add, ["SliceCols", "f32[4,3]", "f32[4,6]"]),
    (_embedding_to_indices, _embedding, ["Identity", "u32[4,1]", "f32[4,1]"]),
]


@pytest.mark.parametrize(("fn", "graph", "named"), CASES, ids=["shape", "dtype"])
def test_a_rule_whose_sides_differ_in_type_is_refused_by_extraction(fn, graph, named):
    mine = make_ruleset("mine", fn)
    with pytest.raises(RewriteError, match="unsound") as err:
        optimize(graph(), rulesets=[*optimization_rulesets(), mine])
    for word in named:
        assert word in str(err.value)


@pytest.mark.parametrize(("fn", "graph", "named"), CASES, ids=["shape", "dtype"])
def test_rebuild_compares_every_node_with_its_eclass_type(fn, graph, named):
    # without the extraction-time check, the extracted unsound e-node is caught when rebuilt
    enc = saturate(graph(), Report(), rulesets=[*optimization_rulesets(), make_ruleset("mine", fn)])
    problem = build_problem(enc, CostModel(), enc.raw, check_types=False)
    dag = extract_ilp(problem).dag
    assert any(dag.nodes[j][0] == named[0] for j in range(len(dag.nodes)))  # the unsound e-node is extracted
    with pytest.raises(RewriteError, match="e-class T-") as err:
        rebuild(dag, enc)
    for word in named:
        assert word in str(err.value)


def test_a_sound_rule_of_ones_own_still_optimises():
    def relu_of_relu(e):
        (x,) = e.vars("x")
        yield e.equal("Relu(Relu(x)) -> Relu(x) (mine)", e.Relu(e.Relu(x)), e.Relu(x))

    g = Graph()
    g.set_outputs([g.relu(g.relu(g.input("x", [4, 6])))])
    out, rep = optimize(g, rulesets=[make_ruleset("mine", relu_of_relu)], verify=True)
    assert [n.op for n in out.live_nodes()] == ["Input", "Relu"]
    assert rep.rules_fired.get("Relu(Relu(x)) -> Relu(x) (mine)")


def test_a_right_side_that_leaves_out_an_attribute_is_refused_naming_rule_and_attribute():
    def rule(e):
        x, w = e.vars("x w")
        yield e.equal("RmsNorm(Relu(x), w) -> RmsNorm(x, w)", e.RmsNorm(e.Relu(x), w), e.RmsNorm(x, w))

    # before: accepted here, then saturation failed with egglog's "Unbound symbol _RmsNorm_eps_1"
    with pytest.raises(RewriteError, match=r"rule 'RmsNorm\(Relu\(x\), w\) -> RmsNorm\(x, w\)'.*"
                                           r"RmsNorm's attribute eps, left out \(give eps="):
        make_ruleset("mine", rule)


def test_a_right_side_variable_that_nothing_binds_is_refused():
    def rule(e):
        x, y = e.vars("x y")
        yield e.equal("Relu(x) -> Neg(y)", e.Relu(x), e.Neg(y))

    with pytest.raises(RewriteError, match=r"rule 'Relu\(x\) -> Neg\(y\)'.*variable 'y'"):
        make_ruleset("mine", rule)


def test_variables_bound_by_a_guard_or_given_attributes_are_accepted():
    def rule(e):
        x, d = e.vars("x d")
        (s,) = e.vars("s", e.Vec[e.i64])
        (eps,) = e.vars("eps", e.f64)
        # s is bound by the guard only, eps by the left-hand side; SliceCols' attributes given
        yield e.equal("RmsNorm(x + d) -> RmsNorm(x + SliceCols(d))", e.RmsNorm(e.Add(x, d), x, eps=eps),
                      e.RmsNorm(e.Add(x, e.SliceCols(d, start=e.i64(0), size=s[1])), x, eps=eps),
                      e.eq(e.shape(d)).to(s))

    make_ruleset("mine", rule)


def _rules_for_a_ruleset_nobody_schedules(e):
    (x,) = e.vars("x")
    yield e.equal("Neg(Neg(x)) -> x (unscheduled)", e.Neg(e.Neg(x)), x)


def test_a_rule_group_of_an_unscheduled_ruleset_is_named_by_its_function(monkeypatch):
    from eggfuse.ir.spec import RuleGroup
    from eggfuse.rewrites import rulesets

    fn = _rules_for_a_ruleset_nobody_schedules
    monkeypatch.setattr(rulesets, "RULES", [RuleGroup("fusion_typo", fn, "elementwise")])
    with pytest.raises(RewriteError, match=re.escape(f"rule group {fn.__module__}.{fn.__qualname__} (family "
                                                     "elementwise)") + ".*'fusion_typo', which is not scheduled"):
        rulesets._built.__wrapped__()  # the build, without its cache of the shipped rules
