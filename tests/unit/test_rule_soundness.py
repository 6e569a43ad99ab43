"""Every shipped rewrite rule is sound: on its soundness example (written beside the rule, in
the op family module that holds it) with random shapes it fires, and every e-class of the
saturated e-graph evaluates to one value (numpy reference)."""

import re

import pytest

from eggfuse.ir import DType, Graph, RewriteError
from eggfuse.rewrites import make_ruleset
from eggfuse.rewrites.rulesets import ANALYSIS, OPTIONAL, optimization_rulesets, optional_ruleset, rule_records
from eggfuse.rewrites.soundness import assert_rule_sound, check_sound

RULES = {r.name: r for r in rule_records() if r.ruleset != ANALYSIS}


def test_every_shipped_rule_has_a_soundness_example():
    missing = sorted(f"{r.name} ({r.family} family)" for r in RULES.values() if r.example is None)
    assert not missing, f"rules without a soundness example (pass example= to e.equal): {missing}"


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_is_sound(rule):
    ex = RULES[rule].example
    assert ex is not None, f"rule {rule!r} ({RULES[rule].family} family) has no soundness example (pass example=)"
    # the elementwise_fusion rules are one per row of a table (ir/ops/fused.py), all of one form: two
    # random graphs each
    examples = 2 if RULES[rule].ruleset == "elementwise_fusion" else 6
    # an optional ruleset's rules (f16: weights rounded) run beside the shipped ones, as compile runs them
    rulesets = [optional_ruleset(RULES[rule].ruleset), *optimization_rulesets()] \
        if RULES[rule].ruleset in OPTIONAL else None
    assert_rule_sound(rule, ex.build, max_examples=examples, max_dim=ex.max_dim, rulesets=rulesets, tol=ex.tol)


def test_soundness_check_catches_an_unsound_rule():
    def bad(e):
        (x,) = e.vars("x")
        yield e.equal("Relu(x) -> Neg(x) (wrong)", e.Relu(x), e.Neg(x))

    g = Graph()
    g.set_outputs([g.relu(g.input("x", [3, 4]))])
    with pytest.raises(RewriteError, match=r"unsound rule 'Relu\(x\) -> Neg\(x\) \(wrong\)' \(ruleset "
                                           r"unsound_for_test\): e-class"):
        check_sound(g, rulesets=[make_ruleset("unsound_for_test", bad)])


def test_embedding_indices_stay_valid_in_soundness_feeds():
    g = Graph()
    idx = g.input("i", [5], DType.U32)
    g.set_outputs([g.neg(g.neg(g.embedding(idx, g.parameter("t", [3, 4]))))])
    assert check_sound(g).eclasses_checked >= 3


def test_a_rule_that_merges_shapes_is_named_with_both_shapes():
    from eggfuse.rewrites import optimize

    def bad(e):
        (x,) = e.vars("x")
        yield e.equal("Relu(x) -> Relu(x)", e.Relu(x), e.Relu(x))
        yield e.equal("Transpose(x) -> x (wrong)", e.Transpose(x), x)

    g = Graph()
    g.set_outputs([g.relu(g.transpose(g.input("x", [3, 4])))])
    with pytest.raises(RewriteError, match=r"saturation failed: rule 'Transpose\(x\) -> x \(wrong\)' \(ruleset "
                                           r"merges_for_test\) joined two e-classes of the input graph whose shapes "
                                           r"differ: its left side Transpose, e-class \S+ of shape \[4, 3\], and its "
                                           r"right side, e-class \S+ of shape \[3, 4\]"):
        optimize(g, rulesets=[make_ruleset("merges_for_test", bad)])

    def bad_call(e):
        (x,) = e.vars("x")
        yield e.equal("Relu(x) -> Transpose(x) (wrong)", e.Relu(x), e.Transpose(x))

    g = Graph()
    x = g.input("x", [3, 4])
    g.set_outputs([g.relu(x), g.transpose(x)])  # the right side exists already: a merge of two shape facts
    with pytest.raises(RewriteError, match=r"rule 'Relu\(x\) -> Transpose\(x\) \(wrong\)' .* its left side Relu, "
                                           r"e-class \S+ of shape \[3, 4\], and its right side, e-class \S+ of "
                                           r"shape \[4, 3\]"):
        optimize(g, rulesets=[make_ruleset("merges_call_for_test", bad_call)])


def _drop_transpose(e):
    a, b = e.vars("a b")
    yield e.equal("MatMul(Transpose(a),b) -> MatMul(a,b) (wrong)", e.MatMul(e.Transpose(a), b), e.MatMul(a, b))


def test_a_rule_that_builds_an_op_on_inputs_it_cannot_take_is_named_everywhere():
    # the right side MatMul(a, b) of shapes [6, 4] and [6, 5]: check_sound raised the shape rule's raw
    # ShapeError, assert_rule_sound hypothesis's ExceptionGroup, optimize a RewriteError naming no rule
    from eggfuse.rewrites import optimize

    rulesets = [*optimization_rulesets(), make_ruleset("drop_transpose_for_test", _drop_transpose)]
    named = r"unsound rule 'MatMul\(Transpose\(a\),b\) -> MatMul\(a,b\) \(wrong\)' \(ruleset drop_transpose_for_test\)"

    def build(g, dim):
        a, b = g.input("a", [dim("k"), dim("m")]), g.input("b", [dim("k"), dim("n", 2, 7)])
        g.set_outputs([g.matmul(g.transpose(a), b)])

    g = Graph()
    build(g, lambda name, lo=1, hi=7: {"k": 6, "m": 4, "n": 5}[name])
    with pytest.raises(RewriteError, match=named + r": e-class \S+: e-node MatMul cannot be computed"):
        check_sound(g, rulesets=rulesets)
    with pytest.raises(RewriteError, match=named + r": a rule put MatMul of inputs \['f32\[6,4\]', 'f32\[6,5\]'\]"):
        optimize(g, rulesets=rulesets)
    with pytest.raises(RewriteError, match=named):
        assert_rule_sound("MatMul(Transpose(a),b) -> MatMul(a,b) (wrong)", build, rulesets=rulesets, max_examples=8)


def _bt_as_mm(e):
    a, b = e.vars("a b")
    yield e.equal("MatMulBT(a,b) -> MatMul(a,b) (wrong)", e.MatMulBT(a, b), e.MatMul(a, b))


def test_a_rule_whose_wrong_type_shows_in_an_op_another_rule_builds_is_named():
    # QKV packing built a Concat of the wrongly typed weights: "a rule built Concat of inputs [...]" named no rule
    from eggfuse.api import model_graph
    from eggfuse.rewrites import optimize

    rulesets = [*optimization_rulesets(), make_ruleset("bt_as_mm_for_test", _bt_as_mm)]
    with pytest.raises(RewriteError, match=r"unsound rule 'MatMulBT\(a,b\) -> MatMul\(a,b\) \(wrong\)' \(ruleset "
                                           r"bt_as_mm_for_test\): a rule built "):
        optimize(model_graph("llama:1"), rulesets=rulesets)


def _sigmoid_is_tanh(e):
    (a,) = e.vars("a")
    yield e.equal("Sigmoid(a) -> Tanh(a) (wrong)", e.Sigmoid(a), e.Tanh(a))


def _relu_is_neg(e):
    (a,) = e.vars("a")
    yield e.equal("Relu(a) -> Neg(a) (wrong)", e.Relu(a), e.Neg(a))


def test_two_unsound_rules_of_ones_own_are_both_named():
    # no single rule left out made the check pass: "unsound rules (no single rule left out makes it consistent;
    # rules that fired: ...)" with nine names; each rule of one's own is now tried alone beside the shipped ones
    g = Graph()
    g.set_outputs([g.sigmoid(g.relu(g.relu(g.input("x", [3, 4]))))])
    rulesets = [*optimization_rulesets(), make_ruleset("sig_tanh_for_test", _sigmoid_is_tanh),
                make_ruleset("relu_neg_for_test", _relu_is_neg)]
    with pytest.raises(RewriteError, match=r"unsound rule 'Sigmoid\(a\) -> Tanh\(a\) \(wrong\)' \(ruleset "
                                           r"sig_tanh_for_test\) and rule 'Relu\(a\) -> Neg\(a\) \(wrong\)' "
                                           r"\(ruleset relu_neg_for_test\): e-class"):
        check_sound(g, rulesets=rulesets)


def _factor_matmul(e):
    a, b, c = e.vars("a b c")
    yield e.equal("Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Add(b,c))",
                  e.Add(e.MatMul(a, b), e.MatMul(a, c)), e.MatMul(a, e.Add(b, c)))


def test_assert_rule_sound_refuses_a_rule_name_no_ruleset_has_before_running():
    # a name one space off, or a rule whose ruleset was not passed, ran every example and then said
    # "rule ... never fired on 10 graphs"
    built = []

    def build(g, dim):
        built.append(1)
        x = g.input("x", [dim("m"), dim("k")])
        w1, w2 = g.parameter("w1", [dim("k"), dim("n")]), g.parameter("w2", [dim("k"), dim("n")])
        g.set_outputs([g.add(g.matmul(x, w1), g.matmul(x, w2))])

    mine = make_ruleset("factor_for_test", _factor_matmul)
    rulesets = [*optimization_rulesets(), mine]
    rule = "Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Add(b,c))"
    off = rule.replace("a, Add", "a,Add")  # one space off
    with pytest.raises(RewriteError, match=re.escape(f"unknown rule {off!r} in the rulesets searched (algebraic, ")
                       + r".*factor_for_test, and the analysis ruleset\) " + re.escape(f"(did you mean {rule!r}?)")):
        assert_rule_sound(off, build, rulesets=rulesets)
    # other tests of the process may hold a ruleset with a rule of that name too: each is named
    with pytest.raises(RewriteError, match=re.escape(f"rule {rule!r} is of the ruleset") + r".*'factor_for_test'.*"
                       + re.escape("which rulesets= does not hold (rulesets searched: algebraic, ")
                       + r".*elementwise_fusion, and the analysis ruleset\)"):
        assert_rule_sound(rule, build)
    layer_norm_rule = next(r.name for r in RULES.values() if r.ruleset == "layer_norm_prologue")
    with pytest.raises(RewriteError, match="is of the ruleset 'layer_norm_prologue', which rulesets= does not hold"):
        assert_rule_sound(layer_norm_rule, build)
    assert not built  # refused before any example ran
    assert_rule_sound(rule, build, rulesets=rulesets, max_examples=2)
    assert built


def _factor_matmul_wrong(e):
    a, b, c = e.vars("a b c")
    yield e.equal("Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Mul(b,c)) (wrong)",
                  e.Add(e.MatMul(a, b), e.MatMul(a, c)), e.MatMul(a, e.Mul(b, c)),
                  e.eq(e.shape(b)).to(e.shape(c)))


def test_assert_rule_sound_names_an_unsound_rule_of_ones_own():
    # the property shrinks on the check alone and names the culprit once, on the smallest failing graph (with the
    # culprit search inside every shrinking step, a 3-node graph took about 3 minutes to fail)
    def build(g, dim):
        x = g.input("x", [dim("m"), dim("k")])
        w1, w2 = g.parameter("w1", [dim("k"), dim("n")]), g.parameter("w2", [dim("k"), dim("n")])
        g.set_outputs([g.add(g.matmul(x, w1), g.matmul(x, w2))])

    rule = "Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Mul(b,c)) (wrong)"
    mine = make_ruleset("factor_wrong_for_test", _factor_matmul_wrong)
    with pytest.raises(RewriteError, match=re.escape(f"unsound rule {rule!r} (ruleset factor_wrong_for_test): "
                                                     "e-class") + r".*max abs error"):
        assert_rule_sound(rule, build, rulesets=[*optimization_rulesets(), mine], max_examples=4)


def test_a_value_that_is_nan_on_one_side_only_is_named_as_such():
    # Exp(Log(x)) is NaN where x < 0: the message says so, where the largest error over the numbers hid it
    def exp_log(e):
        (x,) = e.vars("x")
        yield e.equal("Exp(Log(x)) -> x (wrong for x < 0)", e.Exp(e.Log(x)), x)

    g = Graph()
    g.set_outputs([g.add_node("Exp", [g.add_node("Log", [g.input("x", [4, 8])])])])
    with pytest.raises(RewriteError, match=r"differ \(NaN in one and a number in the other at \d+ of 32 elements, "
                                           r"the first at index \[\d, \d\]\)"):
        check_sound(g, rulesets=[make_ruleset("exp_log_for_test", exp_log)])
