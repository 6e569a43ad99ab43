"""The command line, without a GPU: optimize and rules."""

import json

import pytest

from eggfuse import cli
from eggfuse.rewrites import catalog


def test_optimize_json(capsys):
    assert cli.main(["optimize", "llama:2", "--training", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("total_s", "saturation_s", "extraction_s", "eclasses", "enodes", "nodes_before", "nodes_after",
                "dispatches_before", "dispatches_after", "rules_fired"):
        assert key in out
    assert out["dispatches_after"] < out["dispatches_before"]
    assert out["training"] is True


def test_optimize_text_and_dump(capsys, tmp_path):
    path = tmp_path / "g.egg"
    assert cli.main(["optimize", "minilm", "--seq", "7", "--dump-egglog", str(path)]) == 0
    text = capsys.readouterr().out
    assert "dispatches 115 ->" in text and "saturation" in text
    assert path.read_text().startswith("(")


def test_optimize_bad_model_is_one_error_line(capsys):
    assert cli.main(["optimize", "resnet"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "eggfuse: error: unknown model 'resnet': give minilm, smollm2, llama:LAYERS, an .onnx file, or "
        "module:function (or file.py:function) returning an eggfuse Graph"]


def test_an_unknown_option_is_reported_by_its_subcommand_with_the_closest_one(capsys):
    # argparse alone names the top-level usage; the subcommand's usage and its nearest option help more
    cases = ((["generate", "Hi", "--max-tokens", "4"], "usage: eggfuse generate",
              "unrecognized arguments: --max-tokens 4; --max-tokens: did you mean --max-new-tokens?"),
             (["embed", "--jsn", "a"], "usage: eggfuse embed",
              "unrecognized arguments: --jsn; --jsn: did you mean --json?"),
             (["rules", "--zzz"], "usage: eggfuse rules", "unrecognized arguments: --zzz\n"))
    for argv, usage, message in cases:
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and usage in err and message in err, err


def test_rules_lists_every_rule(capsys):
    assert cli.main(["rules", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == catalog()
    assert cli.main(["rules"]) == 0
    text = capsys.readouterr().out
    assert "matmul_epilogue" in text and "Neg(Neg(x)) -> x" in text


def test_a_closed_pipe_ends_output_quietly(tmp_path):
    import subprocess
    import sys

    # `eggfuse rules | true`: the reader is gone before anything is written; no traceback
    proc = subprocess.run(f"{sys.executable} -m eggfuse.cli rules | true", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_optimize_an_onnx_file_says_which_shapes_and_refuses_options_it_would_ignore(capsys):
    from pathlib import Path

    gpt2 = str(Path(__file__).resolve().parent.parent / "data" / "exported" / "gpt2_tiny.classic.onnx")
    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "(inputs input_ids 2x7, attention_mask 2x7)" in out and "dispatches 80 -> 16" in out, out
    assert "verified: the optimised graph's outputs on the numpy reference (float64, random inputs) are within" in out
    # the optional LayerNorm prologue: its pre-attention, pre-MLP and final LayerNorms in the next products
    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--with-ruleset", "layer_norm_prologue"]) == 0
    out = capsys.readouterr().out
    assert "dispatches 80 -> 12" in out and "FusedLayerNormMatMul" in out, out
    from eggfuse.rewrites.rulesets import SCHEDULE

    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--rulesets", ",".join(SCHEDULE),
                     "--with-ruleset", "layer_norm_prologue"]) == 0  # beside --rulesets, too
    assert "FusedLayerNormMatMul" in capsys.readouterr().out
    for argv, message in ((["--with-ruleset", "layer_norm_prolog"], "unknown optional ruleset 'layer_norm_prolog': "
                                                                    "optional rulesets: layer_norm_prologue, "
                                                                    "gathered_products (f16: "
                                                                    "precision='f16') (did you mean "
                                                                    "'layer_norm_prologue'?)"),
                          (["--with-ruleset", "f16"], "ask for it with --precision f16"),
                          (["--rulesets", "recognition,f16"], "ask for it with --precision f16"),
                          (["--precision", "f16", "--with-ruleset", "f16"],  # was told to do what it did
                           "--precision f16 runs the f16 ruleset already: leave f16 out of the ruleset names"),
                          (["--rulesets", "recogniton"], "optional: f16, layer_norm_prologue, gathered_products "
                                                         "(did you mean 'recognition'?)")):
        assert cli.main(["optimize", gpt2, *argv]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["optimize", gpt2]) == 0  # symbolic dimensions 1, and the header says so
    out = capsys.readouterr().out
    assert "input_ids 1x1, attention_mask 1x1; input_ids, attention_mask: symbolic dimensions 1, give --shape" in out
    assert cli.main(["optimize", gpt2, "--seq", "0"]) == 2 and "--seq and --batch" in capsys.readouterr().err
    assert cli.main(["optimize", "minilm", "--seq", "0"]) == 2  # 0 is no default
    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shapes"] == {"input_ids": [2, 7], "attention_mask": [2, 7]}
    for argv, message in ((["--shape", "input_idz=2x7"], "'input_idz' is not an input of the model (did you mean "
                                                         "'input_ids'?)"),
                          (["--seq", "7"], "--seq and --batch size the shipped models")):
        assert cli.main(["optimize", gpt2, *argv]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["optimize", "minilm", "--shape", "x=2"]) == 2
    assert "--shape sizes an ONNX file's inputs" in capsys.readouterr().err


def test_a_path_that_cannot_be_written_is_one_error_line(tmp_path, capsys):
    missing = tmp_path / "no such folder"
    assert cli.main(["optimize", "llama:1", "--dump-egglog", str(missing / "x.egg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eggfuse: error: No such file or directory: {str(missing / 'x.egg')!r} (a file to write "
                          "needs a folder that exists") and "Traceback" not in err, err
    # the sweep's --out a file: refused before any run (the results would be lost after them)
    (tmp_path / "o.txt").write_text("")
    assert cli.main(["sweep", "--models", "llama:1", "--out", str(tmp_path / "o.txt"), "--no-progress"]) == 2
    assert "is a file: the sweep writes results.csv and results.json into a folder" in capsys.readouterr().err
    assert cli.main(["sweep", "--models", "llama:1", "--out", str(tmp_path / "o.txt" / "sub"), "--no-progress"]) == 2
    assert "cannot write there" in capsys.readouterr().err


def test_rulesets_all_and_optional_ones(capsys):
    from pathlib import Path

    from eggfuse.rewrites.rulesets import SCHEDULE
    from eggfuse.sweep import grid, label

    gpt2 = str(Path(__file__).resolve().parent.parent / "data" / "exported" / "gpt2_tiny.classic.onnx")
    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--rulesets", "all,layer_norm_prologue"]) == 0
    assert "dispatches 80 -> 12" in capsys.readouterr().out
    assert cli.main(["optimize", gpt2, "--shape", "input_ids=2x7", "--rulesets", "all"]) == 0
    assert "dispatches 80 -> 16" in capsys.readouterr().out
    assert cli.main(["optimize", gpt2, "--rulesets", "recogniton"]) == 2
    err = capsys.readouterr().err
    assert err.count("layer_norm_prologue") == 1, err  # listed once, as optional
    (c,) = grid([gpt2], "all,layer_norm_prologue")
    row = {"rulesets": c.rulesets, "disabled": "", "cost_model": "bytes", "extractor": "ilp", "match_limit": 20_000}
    assert c.rulesets == ",".join([*SCHEDULE, "layer_norm_prologue"])
    assert label(row) == "all+layer_norm_prologue bytes ilp"
    assert label({**row, "rulesets": ",".join(SCHEDULE)}) == "all bytes ilp"
    five = ",".join(SCHEDULE[:5])
    assert label({**row, "rulesets": five}) == f"{five} bytes ilp"  # not "all"
