"""Per-rule and per-ruleset payoff (optimize(payoff=True)), rule selection and ablation.

Expected values are counted by hand on small graphs: a MatMul + BiasAdd + Gelu chain is 3
dispatches unfused and 1 fused; without the Gelu epilogue rule it is 2 (FusedMatMul with its
bias, then Gelu)."""

import pytest

from eggfuse.ir import Graph, RewriteError
from eggfuse.rewrites import make_ruleset, optimize
from eggfuse.rewrites.rulesets import SCHEDULE, rules_of, ruleset_name, select

GELU = "Gelu(FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[Gelu])"
BIAS = "BiasAdd(FusedMatMul(a,b,e), d) -> FusedMatMul(a,b,e+[bias d])"
FUSE = "MatMul(a,b) -> FusedMatMul(a,b,[])"
#: The generated-epilogue rule that gives the same kernel as GELU (ir/ops/epilogue_rules.py): left out
#: where a test measures GELU's own payoff, which it would make 0.
GELU_REGION = "Gelu(FusedMatMul(e)) -> FusedMatMul(e+[ex Gelu])"


def _mlp() -> Graph:
    g = Graph()
    x = g.input("x", [8, 64])
    g.set_outputs([g.gelu(g.bias_add(g.matmul(x, g.parameter("w", [64, 32])), g.parameter("b", [32])))])
    return g


def _rows(rep):
    return {r["name"]: r for r in rep.rules}, {r["name"]: r for r in rep.rulesets}


def test_payoff_of_each_rule_and_ruleset_on_a_fused_chain():
    g = _mlp()
    _, rep = optimize(g, payoff=True, rulesets=select(disable=[GELU_REGION]))
    assert (rep.dispatches_before, rep.dispatches_after) == (3, 1)
    rules, sets = _rows(rep)
    assert set(sets) == set(SCHEDULE)
    for key in ("name", "ruleset", "matches", "extracted_enodes", "saved_cost", "saved_dispatches", "saved_bytes"):
        assert key in rules[GELU]
    # without the Gelu rule: FusedMatMul(+bias) then Gelu, 2 dispatches; one more [8, 32] f32 written and read
    assert rules[GELU]["saved_dispatches"] == 1
    assert rules[GELU]["saved_bytes"] == 2 * 8 * 32 * 4
    assert rules[GELU]["saved_cost"] == (1 << 20) + 2 * 8 * 32 * 4
    # without the bias rule Gelu's input is the BiasAdd, not a FusedMatMul: the matmul, then BiasAdd and
    # Gelu in one generated kernel, 2 dispatches
    assert rules[BIAS]["saved_dispatches"] == 1
    # without MatMul -> FusedMatMul no epilogue folds: the same 2 dispatches
    assert rules[FUSE]["saved_dispatches"] == 1 and sets["matmul_epilogue"]["saved_dispatches"] == 1
    assert sets["elementwise_fusion"]["saved_dispatches"] == 0  # the epilogue does it all here
    # the one extracted FusedMatMul(a, b, [bias, Gelu]) matches the right side of the Gelu rule only
    assert rules[GELU]["extracted_enodes"] == 1 and rules[BIAS]["extracted_enodes"] == 0
    assert sets["matmul_epilogue"]["extracted_enodes"] == 1
    for r in rules.values():
        if r["matches"] == 0:
            assert (r["saved_cost"], r["saved_dispatches"], r["saved_bytes"], r["extracted_enodes"]) == (0, 0, 0, 0)
    assert sets["algebraic"] == {"name": "algebraic", "matches": 0, "extracted_enodes": 0, "saved_cost": 0,
                                 "saved_dispatches": 0, "saved_bytes": 0}
    assert "payoff" in rep.summary() and GELU in rep.summary()


def test_the_ruleset_payoff_equals_optimising_without_it():
    from eggfuse.api import model_graph

    g = model_graph("llama:2")
    _, rep = optimize(g, payoff=True)
    _, sets = _rows(rep)
    for name in SCHEDULE:
        _, without = optimize(g, rulesets=select([n for n in SCHEDULE if n != name]))
        assert sets[name]["saved_dispatches"] == without.dispatches_after - rep.dispatches_after, name
        assert sets[name]["saved_cost"] == without.cost_after - rep.cost_after, name


def test_report_without_payoff_has_no_rules_keys():
    _, rep = optimize(_mlp())
    assert rep.rules is None and "rules" not in rep.to_dict() and "rulesets" not in rep.to_dict()
    assert rep.bytes_before > rep.bytes_after > 0


def test_select_keeps_rulesets_and_drops_a_rule():
    g = _mlp()
    _, rep = optimize(g, rulesets=select(["matmul_epilogue"], [GELU, GELU_REGION]))
    assert rep.dispatches_after == 2 and GELU not in rep.rules_fired
    kept = select(["attention", "algebraic"])
    assert [ruleset_name(r) for r in kept] == ["algebraic", "attention"]  # schedule order
    (epi,) = select(["matmul_epilogue"], [GELU])
    assert GELU not in rules_of(epi) and len(rules_of(epi)) == len(rules_of(select(["matmul_epilogue"])[0])) - 1


LN_PROLOGUE = "FusedMatMul(LayerNorm(x,g,b), W, e) -> FusedLayerNormMatMul(x, g, b, W, e)"
F16_MATMUL = "MatMulBT(a, P) -> MatMulBT(a, Dequant(ToF16(P)))"


@pytest.mark.parametrize("names, disable, match", [
    (["matmul_epilog"], [], "unknown ruleset 'matmul_epilog'.*did you mean 'matmul_epilogue'"),
    (["analysis"], [], "analysis ruleset always runs"),
    (None, ["Gelu(FusedMatMul(a,b,e))->FusedMatMul(a,b,e+[Gelu])"], "unknown rule .*did you mean"),
    (["algebraic"], [GELU], "rule .* is of the ruleset 'matmul_epilogue', which the selected rulesets \\(algebraic\\) "
                            "leave out: it does not run anyway"),
    (None, ["matmul_epilogue"], "'matmul_epilogue' is a ruleset, not a rule: to leave a ruleset out, name the "
                                "rulesets to run"),
    (["algebraic"], ["Gelu -> nothing"], "unknown rule .* in the selected rulesets \\(algebraic\\)"),
    (None, [LN_PROLOGUE], "is of the optional ruleset 'layer_norm_prologue', which does not run unless asked for "
                          "\\(eggfuse optimize --with-ruleset layer_norm_prologue"),
    (["recognition", "f16"], [], "f16 ruleset rounds weights to float16: compile with precision='f16'"),
    (None, [F16_MATMUL], "rule .* is of the f16 ruleset, which runs only with precision='f16'"),
])
def test_select_names_what_it_does_not_know(names, disable, match):
    with pytest.raises(RewriteError, match=match):
        select(names, disable)


def test_select_adds_optional_rulesets_to_those_named():
    default = [ruleset_name(r) for r in select()]
    assert "layer_norm_prologue" not in default and "f16" not in default
    assert [ruleset_name(r) for r in select(optional=["layer_norm_prologue"])] == [*default, "layer_norm_prologue"]
    assert [ruleset_name(r) for r in select(["all", "layer_norm_prologue"])] == [*default, "layer_norm_prologue"]
    assert [ruleset_name(r) for r in select(["all"])] == default
    # named with --rulesets, or asked for beside it: either way it runs, after the scheduled ones, once
    for names, optional in ((["norm_fusion", "layer_norm_prologue"], []), (["norm_fusion"], ["layer_norm_prologue"]),
                            (["layer_norm_prologue", "norm_fusion"], ["layer_norm_prologue"])):
        assert [ruleset_name(r) for r in select(names, optional=optional)] == ["norm_fusion", "layer_norm_prologue"]
    (ln,) = select(["layer_norm_prologue"], [LN_PROLOGUE])
    assert ruleset_name(ln) == "layer_norm_prologue" and LN_PROLOGUE not in rules_of(ln) and len(rules_of(ln)) == 3
    with pytest.raises(RewriteError, match="unknown optional ruleset 'f32'"):
        select(optional=["f32"])
    with pytest.raises(RewriteError, match="f16 ruleset"):
        select(optional=["f16"])


def test_a_rule_of_the_f16_ruleset_is_left_out_with_precision_f16():
    from eggfuse.pipeline import precision_rulesets

    g = _mlp()  # x @ w, w [64, 32]: its K a multiple of 32
    rounded = lambda rs: sum(n.op == "ToF16" for n in optimize(g, rulesets=rs)[0].nodes)  # noqa: E731
    every = precision_rulesets("f16")
    assert rounded(every) > 0
    kept = select(None, [F16_MATMUL], precision="f16")
    (f16,) = [r for r in kept if ruleset_name(r) == "f16"]
    assert kept[0] is f16 and F16_MATMUL not in rules_of(f16) and len(rules_of(f16)) == len(rules_of(every[0])) - 1
    assert precision_rulesets("f16", kept) is kept  # compile adds no second f16 ruleset
    assert [ruleset_name(r) for r in select(["algebraic"], precision="f16")] == ["f16", "algebraic"]
    assert "f16" not in [ruleset_name(r) for r in select(["algebraic"])]
    without = select(None, [F16_MATMUL, "MatMul(a, P) -> MatMulBT(a, Dequant(ToF16(P, transposed)))"],
                     precision="f16")
    assert rounded(without) == 0 < rounded(every)
    with pytest.raises(RewriteError, match="precision must be 'f32' or 'f16', got 'f8'"):
        select(precision="f8")
    # all, with the precision's f16 first; f16 named beside the precision; f16's rulesets compiled at f32
    default = [ruleset_name(r) for r in select()]
    assert [ruleset_name(r) for r in select(["all"], precision="f16")] == ["f16", *default]
    assert [ruleset_name(r) for r in select(["all", "layer_norm_prologue"], precision="f16")] == \
        ["f16", *default, "layer_norm_prologue"]
    with pytest.raises(RewriteError, match="precision='f16' adds the f16 ruleset already: leave it out of the names"):
        select(["f16", "algebraic"], precision="f16")
    from eggfuse.ir import InputError

    with pytest.raises(InputError, match="the rulesets hold the f16 ruleset, which rounds weights to float16: "
                                         "compile with precision='f16'"):
        precision_rulesets("f32", kept)
    assert precision_rulesets("f32", select(["algebraic"]))  # without it, as given


def test_payoff_of_a_ruleset_of_ones_own():
    def double_neg(e):
        (x,) = e.vars("x")
        # Neg(Neg(x)) -> x, under another name
        yield e.equal("mine: Neg(Neg(x)) -> x", e.Neg(e.Neg(x)), x)

    g = Graph()
    g.set_outputs([g.relu(g.neg(g.neg(g.input("x", [4, 4]))))])
    mine = make_ruleset("mine", double_neg)
    _, rep = optimize(g, rulesets=[mine], payoff=True)
    rules, sets = _rows(rep)
    assert rep.dispatches_after == 1
    assert rules["mine: Neg(Neg(x)) -> x"]["saved_dispatches"] == 2
    assert rules["mine: Neg(Neg(x)) -> x"]["extracted_enodes"] == 0  # a bare variable builds nothing
    # the two Negs of [4, 4] f32 each read and write 64 bytes
    assert sets["mine"]["matches"] == rules["mine: Neg(Neg(x)) -> x"]["matches"] >= 1
    assert {k: v for k, v in sets["mine"].items() if k != "matches"} == {
        "name": "mine", "extracted_enodes": 0, "saved_cost": 2 * ((1 << 20) + 128), "saved_dispatches": 2,
        "saved_bytes": 2 * 128}


def test_a_rule_that_builds_a_view_of_an_op_builds_that_op():
    from eggfuse.rewrites.payoff import _built_op

    lit = ("lit", 1)
    assert _built_op(("Identity", (("CausalAttention", (None, None, None, lit)), lit))) == "CausalAttention"
    assert _built_op(("Permute", (("Identity", (("GeneralAttention", (None, lit)), lit)), lit))) == "GeneralAttention"
    assert _built_op(("Identity", (None, lit))) == "Identity" and _built_op(None) is None and _built_op(lit) is None


def test_rules_that_build_one_op_pay_as_a_group():
    # a residual add on either side of a biased product (after a LayerNorm): every op that two or more fired rules
    # build gets a row, and its savings are those of optimising again without all of those rules
    g = Graph()
    x = g.input("x", [8, 16])
    h = g.layer_norm(x, g.parameter("g", [16]), g.parameter("b", [16]))
    y = g.add(g.bias_add(g.matmul(h, g.parameter("w", [16, 16])), g.parameter("c", [16])), x)
    g.set_outputs([g.add(x, g.matmul(y, g.parameter("w2", [16, 16])))])
    _, rep = optimize(g, payoff=True)
    groups = {r["name"]: r for r in rep.rule_groups}
    assert "rules building FusedMatMul" in groups, sorted(groups)
    for row in groups.values():
        names = row["rules"]
        assert len(names) >= 2 and row["matches"] == sum(rep.rules_fired[n] for n in names)
        _, without = optimize(g, rulesets=select(disable=names))
        assert row["saved_dispatches"] == without.dispatches_after - rep.dispatches_after, row
        assert row["saved_bytes"] == without.bytes_after - rep.bytes_after, row
    from eggfuse.rewrites.payoff import payoff_table

    assert "rules building FusedMatMul" in payoff_table(rep) and rep.to_dict()["rule_groups"] == rep.rule_groups


def test_verify_says_what_it_compared():
    import math

    g = Graph()
    x = g.input("x", [3, 4])
    g.set_outputs([g.relu(g.add(x, x))])
    _, rep = optimize(g, verify=True)
    assert rep.verified_max_diff < 1e-12 and "verified: the optimised graph's outputs" in rep.summary()
    g = Graph()
    x = g.input("x", [3, 4])
    d = g.add_node("Sub", (x, x))
    g.set_outputs([g.add_node("Div", (d, d))])  # NaN everywhere: nothing finite to compare
    _, rep = optimize(g, verify=True)
    assert math.isnan(rep.verified_max_diff) and "no output element is finite in both graphs" in rep.summary()
    _, rep = optimize(g)
    assert rep.verified_max_diff is None and "verified" not in rep.summary()
