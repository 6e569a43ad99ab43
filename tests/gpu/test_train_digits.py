"""``eggfuse train-digits``: the default run reaches 95% test accuracy; the command line's
JSON, text and error output; the saved parameters."""

from __future__ import annotations

import json

from eggfuse import cli
from eggfuse.cli_train import BATCH, STEPS, train_digits


def test_default_run_reaches_95_percent_test_accuracy(device):
    run = train_digits(device=device)
    assert run.steps == STEPS and run.batch == BATCH and run.fuse
    assert run.test_accuracy >= 0.95, run
    assert run.final_loss < run.first_loss / 10
    assert run.fused_matmuls and run.dispatches_per_step > 0 and run.seconds_per_step > 0


def test_json_run_unfused_and_saved(capsys, tmp_path):
    from safetensors.numpy import load_file

    path = tmp_path / "digits.safetensors"
    assert cli.main(["train-digits", "--json", "--steps", "20", "--batch", "32", "--optimizer", "sgd", "--no-fuse",
                     "--save", str(path)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    for key in ("test_accuracy", "steps", "seconds_per_step", "final_loss", "dispatches_per_step"):
        assert key in out
    assert out["steps"] == 20 and out["batch"] == 32 and out["optimizer"] == "sgd" and out["fuse"] is False
    assert out["fused_matmuls"] == {} and 0.0 <= out["test_accuracy"] <= 1.0
    assert captured.err == ""  # no progress bar with --json
    saved = load_file(str(path))
    assert {k: v.shape for k, v in saved.items()} == {"w1": (64, 64), "b1": (64,), "w2": (64, 10), "b2": (10,)}


def test_text_output_and_progress_bar(capsys):
    assert cli.main(["train-digits", "--steps", "12", "--hidden", "16"]) == 0
    captured = capsys.readouterr()
    assert "test accuracy:" in captured.out and "time per step:" in captured.out
    assert "loss=" in captured.err  # tqdm on stderr, showing the loss


def test_bad_options_are_one_error_line(capsys):
    assert cli.main(["train-digits", "--batch", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "eggfuse: error: batch must lie in [1, 1437] (the training set), got 0"]
    assert cli.main(["train-digits", "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["eggfuse: error: steps must be >= 1, got 0"]
    assert cli.main(["train-digits", "--lr", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["eggfuse: error: Adam lr must lie in (0.0, inf), got -1.0"]
