"""eggfuse optimize's selection, payoff report, graph sources and pictures."""

import contextlib
import json
import shutil

import numpy as np
import pytest
from user_rules import FACTOR, rules_module  # tests/: a rule of one's own, as a module's text

from eggfuse import cli

GELU = "Gelu(FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[Gelu])"
#: The generated-epilogue rule that gives the same kernel (ir/ops/epilogue_rules.py), left out where GELU's
#: own payoff is measured.
GELU_REGION = "Gelu(FusedMatMul(e)) -> FusedMatMul(e+[ex Gelu])"
GRAPH_PY = '''
from eggfuse.ir import Graph

def mlp():
    g = Graph()
    x = g.input("x", [8, 64])
    g.set_outputs([g.gelu(g.bias_add(g.matmul(x, g.parameter("w", [64, 32])), g.parameter("b", [32])))])
    return g

def not_a_graph():
    return 3

def needs_arg(n):
    return mlp()
'''


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "mygraphs.py"
    path.write_text(GRAPH_PY)
    return path


def _json(capsys, args):
    assert cli.main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_report_json_has_rules_and_rulesets(capsys, graph_file):
    out = _json(capsys, ["optimize", f"{graph_file}:mlp", "--report", "--json", "--disable-rule", GELU_REGION])
    assert (out["dispatches_before"], out["dispatches_after"]) == (3, 1)
    rule = next(r for r in out["rules"] if r["name"] == GELU)
    assert rule == {"name": GELU, "ruleset": "matmul_epilogue", "matches": 1, "extracted_enodes": 1,
                    "saved_cost": (1 << 20) + 2 * 8 * 32 * 4, "saved_dispatches": 1, "saved_bytes": 2 * 8 * 32 * 4}
    assert {r["name"] for r in out["rulesets"]} == {"algebraic", "recognition", "swiglu", "matmul_epilogue",
                                                    "conv_epilogue", "norm_fusion", "attention", "quant",
                                                    "elementwise_fusion"}
    assert "rules" not in _json(capsys, ["optimize", f"{graph_file}:mlp", "--json"])


def test_rulesets_and_disable_rule(capsys, graph_file):
    out = _json(capsys, ["optimize", f"{graph_file}:mlp", "--disable-rule", GELU, "--disable-rule", GELU_REGION,
                         "--json"])
    assert out["dispatches_after"] == 2 and GELU not in out["rules_fired"]
    out = _json(capsys, ["optimize", f"{graph_file}:mlp", "--rulesets", "algebraic,swiglu", "--json"])
    assert out["dispatches_after"] == 3 and out["rules_fired"] == {}
    assert cli.main(["optimize", f"{graph_file}:mlp", "--disable-rule", "Gelu -> fused"]) == 2
    assert "unknown rule 'Gelu -> fused'" in capsys.readouterr().err


def test_disable_rule_takes_a_rule_of_the_f16_ruleset_with_precision_f16(capsys, graph_file):
    rounding = "MatMul(a, P) -> MatMulBT(a, Dequant(ToF16(P, transposed)))"  # mlp's w [64, 32]
    assert rounding in _json(capsys, ["optimize", f"{graph_file}:mlp", "--precision", "f16", "--json"])["rules_fired"]
    out = _json(capsys, ["optimize", f"{graph_file}:mlp", "--precision", "f16", "--disable-rule", rounding, "--json"])
    assert rounding not in out["rules_fired"] and out["dispatches_after"] == 1
    assert cli.main(["optimize", f"{graph_file}:mlp", "--disable-rule", rounding]) == 2
    assert "is of the f16 ruleset, which runs only with precision='f16'" in capsys.readouterr().err


def test_cost_model_extractor_and_schedule_options(capsys):
    out = _json(capsys, ["optimize", "llama:1", "--cost-model", "roofline:lavapipe", "--extractor", "greedy",
                         "--match-limit", "50", "--ban-length", "2", "--no-decomp", "--json"])
    assert out["cost_model"] == "roofline:lavapipe" and out["dispatches_after"] < out["dispatches_before"]
    with_decomp = _json(capsys, ["optimize", "llama:1", "--decomp", "--json"])  # egglog's query decomposition on
    assert with_decomp["dispatches_after"] == _json(capsys, ["optimize", "llama:1", "--json"])["dispatches_after"]
    out = _json(capsys, ["optimize", "llama:1", "--max-iterations", "1", "--json"])
    assert out["stop_reason"] == "iteration limit 1"
    assert cli.main(["optimize", "llama:1", "--cost-model", "nosuch:Model"]) == 2
    assert "cannot import 'nosuch'" in capsys.readouterr().err


def test_module_function_graph_sources(capsys, graph_file, monkeypatch):
    monkeypatch.chdir(graph_file.parent)  # a module of the current folder, as `python -m` finds one
    assert _json(capsys, ["optimize", "mygraphs:mlp", "--json"])["nodes_before"] == 6
    for spec, msg in ((f"{graph_file}:not_a_graph", "returned int, not an eggfuse Graph"),
                      (f"{graph_file}:missing", "has no function 'missing'"),
                      (f"{graph_file}:needs_arg", "eggfuse calls needs_arg() with no arguments, but needs_arg(n) "
                                                  "requires some (missing a required argument: 'n'); give its "
                                                  "parameters defaults"),
                      ("no_such_mod_xyz:fn", "cannot import 'no_such_mod_xyz'")):
        assert cli.main(["optimize", spec]) == 2
        assert msg in capsys.readouterr().err


def test_shipped_model_graphs_are_built_once_per_process():
    from eggfuse.graphs import load_graph

    a, _ = load_graph("llama:3")
    b, _ = load_graph("llama:3")
    assert a is b and load_graph("llama:3", training=True)[0] is not a


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dot_pictures_as_svg(tmp_path, capsys, graph_file):
    before, after, ecl = tmp_path / "b.svg", tmp_path / "a.svg", tmp_path / "e.svg"
    assert cli.main(["optimize", f"{graph_file}:mlp", "--dot", str(before), str(after),
                     "--dot-eclass", "5", str(ecl)]) == 0
    assert f"SVG written to {ecl}" in capsys.readouterr().out
    assert "MatMul" in before.read_text() and "FusedMatMul" in after.read_text() and "MatMul" not in \
        after.read_text().replace("FusedMatMul", "")
    text = ecl.read_text()
    assert "Gelu" in text and "FusedMatMul" in text  # node 5 (the Gelu) shares its e-class with the fused matmul


def test_dot_without_graphviz_writes_the_dot_text(tmp_path, capsys, graph_file, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    before, after = tmp_path / "b.svg", tmp_path / "a.svg"
    assert cli.main(["optimize", f"{graph_file}:mlp", "--dot", str(before), str(after)]) == 0
    assert "Graphviz's dot is not installed: wrote the DOT text to" in capsys.readouterr().out
    assert not before.exists() and (tmp_path / "b.dot").read_text().startswith("digraph")
    assert "FusedMatMul" in (tmp_path / "a.dot").read_text()
    assert cli.main(["optimize", f"{graph_file}:mlp", "--dot-eclass", "99", str(tmp_path / "e.dot")]) == 2
    assert "no e-class holds graph node 99" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["optimize", "llama:1", "--rulesets", ""], "expected comma-separated ruleset names, got ''"),
    (["optimize", "llama:1", "--dot", "a.svg", "a.svg"], "both are 'a.svg', so the second picture would replace"),
    (["optimize", "llama:1", "--dot-eclass", "3", "e.svg", "--dot-depth", "-1"], "--dot-depth is the levels"),
    (["sweep", "--models", "llama:1", "--match-limits", "0,-1"], "expected comma-separated integers of 1 or more"),
])
def test_option_values_that_would_do_nothing_or_overwrite_are_refused(args, message, capsys, tmp_path, monkeypatch):
    # they ran with no ruleset, drew one picture over the other, or failed in every sweep row
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if args[-1] == "0,-1" or args[-1] == "" else contextlib.nullcontext():
        assert cli.main(args) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "user_rules_for_cli_test.py"
    path.write_text(rules_module("factor_for_cli_test"))
    return path


def test_optimize_runs_a_ruleset_of_ones_own_named_module_colon_name(capsys, rules_file, monkeypatch):
    # --rulesets took only shipped names: "unknown ruleset 'user_rules_for_cli_test:MINE'"
    graph = f"{rules_file}:two_products"
    assert _json(capsys, ["optimize", graph, "--rulesets", "algebraic", "--json"])["dispatches_after"] == 4
    out = _json(capsys, ["optimize", graph, "--rulesets", f"{rules_file}:MINE", "--report", "--json"])
    assert out["dispatches_after"] == 3
    assert [r for r in out["rules"] if r["matches"]] == [
        {"name": FACTOR, "ruleset": "factor_for_cli_test", "matches": 1, "extracted_enodes": 2,
         "saved_cost": out["cost_before"] - out["cost_after"], "saved_dispatches": 1,
         "saved_bytes": out["bytes_before"] - out["bytes_after"]}]
    monkeypatch.chdir(rules_file.parent)  # a module of the current folder, as `python -m` finds one
    assert cli.main(["optimize", graph, "--rulesets", "all,user_rules_for_cli_test:MINE", "--report"]) == 0
    captured = capsys.readouterr()
    assert f"{FACTOR} [factor_for_cli_test]" in captured.out and "  factor_for_cli_test\n" in captured.out
    # a saving of one's own rule is not its soundness: the report says where to check that
    assert "note: what a rule saves says nothing of whether it is sound: --verify" in captured.err
    assert cli.main(["optimize", graph, "--rulesets", "all,user_rules_for_cli_test:MINE", "--report",
                     "--verify"]) == 0
    assert "note: what a rule saves" not in capsys.readouterr().err
    for spec, msg in (("user_rules_for_cli_test:factor_matmul", "factor_matmul in user_rules_for_cli_test is a "
                                                               "function, not a ruleset: for a rule function, make a "
                                                               "ruleset of it"),
                      ("user_rules_for_cli_test:NUMBER", "NUMBER in user_rules_for_cli_test is of type int, not a "
                                                         "ruleset"),
                      ("user_rules_for_cli_test:NOPE", "user_rules_for_cli_test has no ruleset 'NOPE'"),
                      ("user_rules_for_cli_test:SHADOW", "ruleset 'user_rules_for_cli_test:SHADOW' is named "
                                                         "'algebraic', as a shipped ruleset is")):
        assert cli.main(["optimize", graph, "--rulesets", f"all,{spec}"]) == 2
        assert msg in capsys.readouterr().err
    assert cli.main(["optimize", graph, "--rulesets", "all,factor_for_cli_test"]) == 2
    assert "a ruleset of your own (make_ruleset): module:NAME or path/to/file.py:NAME" in capsys.readouterr().err


def test_with_ruleset_runs_a_ruleset_of_ones_own_on_top_of_the_default_ones(capsys, rules_file):
    # --with-ruleset took only the optional shipped rulesets ("unknown optional ruleset")
    graph = f"{rules_file}:two_products"
    default = _json(capsys, ["optimize", graph, "--json"])
    out = _json(capsys, ["optimize", graph, "--with-ruleset", f"{rules_file}:MINE", "--report", "--json"])
    mine = [r for r in out["rules"] if r["ruleset"] == "factor_for_cli_test"]
    assert [(r["name"], r["matches"]) for r in mine] == [(FACTOR, 1)]
    assert {r["ruleset"] for r in out["rules"] if r["matches"]} - {"factor_for_cli_test"}  # the default ones ran
    assert out["dispatches_after"] <= default["dispatches_after"]
    assert cli.main(["optimize", graph, "--with-ruleset", f"{rules_file}:NOPE"]) == 2
    assert "has no ruleset 'NOPE'" in capsys.readouterr().err
    assert cli.main(["optimize", graph, "--with-ruleset", "layer_norm_prologu"]) == 2
    assert "unknown optional ruleset 'layer_norm_prologu'" in capsys.readouterr().err
    # eggfuse rules lists it too, after the shipped rulesets (it listed the shipped ones only)
    listed = _json(capsys, ["rules", "--with-ruleset", f"{rules_file}:MINE", "--json"])
    assert listed[f"factor_for_cli_test ({rules_file}:MINE)"] == [FACTOR] and "algebraic" in listed
    assert cli.main(["rules", "--with-ruleset", f"{rules_file}:NOPE"]) == 2


def test_optimize_fixes_an_onnx_input_at_load_time_with_input(tmp_path, capsys):
    # an If on an input: optimize's hint named load(..., values=), a Python argument, and no option took it
    import onnx
    from onnx import TensorProto, helper

    from eggfuse.graphs import load_graph

    out = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [out("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [out("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [out("y", TensorProto.FLOAT, None)])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert cli.main(["optimize", str(path)]) == 2
    assert "eggfuse optimize: --input NAME=FILE.npy or NAME=NUMBER" in capsys.readouterr().err
    for value in ("1", "0"):
        report = _json(capsys, ["optimize", str(path), "--input", f"c={value}", "--json"])
        assert report["input_shapes"] == {"x": [3]}  # c is no input of the graph: a constant
    np.save(tmp_path / "c.npy", np.array(False))
    from_file = _json(capsys, ["optimize", str(path), "--input", f"c={tmp_path / 'c.npy'}", "--json"])
    assert from_file["dispatches_after"] == 1
    for value, op in ((np.array(True), "Relu"), (np.array(False), "Neg")):  # the branch of that value
        graph, _ = load_graph(str(path), values={"c": value})
        assert [n.op for n in graph.live_nodes() if n.op != "Input"] == [op]
    assert cli.main(["optimize", "llama:1", "--input", "c=1"]) == 2
    assert "--input fixes an ONNX file's inputs at load time" in capsys.readouterr().err


def test_check_sound_names_an_unsound_rule_of_ones_own_from_the_command_line(capsys, rules_file, tmp_path):
    # soundness needed Python (check_sound, or assert_rule_sound and hypothesis); no command ran it
    graph = f"{rules_file}:two_products"
    out = _json(capsys, ["check-sound", graph, "--with-ruleset", f"{rules_file}:MINE", "--json"])
    assert out["sound"] and out["rules_fired"][FACTOR] == 1 and out["enodes_checked"] > out["eclasses_checked"]
    wrong = tmp_path / "wrong_rules_for_cli_test.py"
    wrong.write_text("from eggfuse.rewrites import make_ruleset\n\n\n"
                     "def swap(e):\n"
                     "    a, b = e.vars('a b')\n"
                     "    yield e.equal('MatMul(a,b) -> MatMul(b,a) (wrong)', e.MatMul(a, b), e.MatMul(b, a))\n\n\n"
                     "SWAP = make_ruleset('swap_for_cli_test', swap)\n\n\n"
                     "def square():\n"
                     "    from eggfuse.ir import Graph\n"
                     "    g = Graph()\n"
                     "    g.set_outputs([g.matmul(g.input('x', [4, 4]), g.parameter('w', [4, 4]))])\n"
                     "    return g\n")
    assert cli.main(["check-sound", f"{wrong}:square", "--with-ruleset", f"{wrong}:SWAP", "--json"]) == 2
    out = capsys.readouterr()
    assert "unsound rule 'MatMul(a,b) -> MatMul(b,a) (wrong)' (ruleset swap_for_cli_test)" in out.err
    verdict = json.loads(out.out)  # a script gets the verdict on stdout too
    assert verdict["sound"] is False and "swap_for_cli_test" in verdict["error"]
    # a rule that never matched the graph was "sound" without a word: it was not tested
    assert cli.main(["check-sound", "llama:1", "--with-ruleset", f"{rules_file}:MINE"]) == 0
    assert f"warning: rule {FACTOR!r} (ruleset factor_for_cli_test) never matched this graph" in capsys.readouterr().err
    # a rule named as a shipped one: egglog runs one of the two, and the other was called sound unchecked
    shadow = tmp_path / "shadow_rules_for_cli_test.py"
    shadow.write_text("from eggfuse.rewrites import make_ruleset\n\n\n"
                      "def wrong(e):\n"
                      "    (a,) = e.vars('a')\n"
                      "    yield e.equal('Relu(Relu(x)) -> Relu(x)', e.Sigmoid(a), e.Tanh(a))\n\n\n"
                      "SHADOW = make_ruleset('shadow_for_cli_test', wrong)\n")
    assert cli.main(["check-sound", "llama:1", "--with-ruleset", f"{shadow}:SHADOW"]) == 2
    assert "has the name of a rule of ruleset 'algebraic'" in capsys.readouterr().err
    for args, message in ((["--seed", "-1"], "--seed must be 0 or more"),
                          (["--seq", "32"], "--seq sizes the shipped models")):
        assert cli.main(["check-sound", graph, *args]) == 2
        assert message in capsys.readouterr().err
