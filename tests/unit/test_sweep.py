"""eggfuse sweep: the grid, a local process pool, a Dask LocalCluster through --scheduler (the
same code path), failures as rows, the CSV / JSON / PNG files."""

import csv
import json
import os
import socket

import pytest

from eggfuse import cli, sweep
from eggfuse.ir import InputError
from eggfuse.rewrites.rulesets import SCHEDULE

NEEDED = ("model", "rulesets", "disabled", "cost_model", "extractor", "eclasses", "enodes", "total_s",
          "dispatches_before", "dispatches_after", "cost_after", "error")


def test_grid_ablates_each_ruleset_in_turn():
    configs = sweep.grid(["llama:1"], "ablate", ["bytes", "roofline"], ["ilp", "greedy"])
    assert len(configs) == (1 + len(SCHEDULE)) * 2 * 2
    assert {c.disabled for c in configs} == {"", *SCHEDULE}
    for c in configs:
        assert c.rulesets.split(",") == [n for n in SCHEDULE if n != c.disabled]
    rules = sweep.grid(["llama:1"], "ablate-rules")
    assert rules[0].disabled == "" and len(rules) > len(SCHEDULE) and all(c.rulesets == ",".join(SCHEDULE)
                                                                         for c in rules)
    with pytest.raises(InputError, match="unknown extractor"):
        sweep.grid(["llama:1"], extractors=["best"])


def test_grid_keeps_an_optional_ruleset_it_is_given():
    (c,) = sweep.grid(["llama:1"], "recognition,norm_fusion,layer_norm_prologue")
    assert c.rulesets == "recognition,norm_fusion,layer_norm_prologue"
    with pytest.raises(InputError, match="the f16 ruleset .* is not among its rulesets"):
        sweep.grid(["llama:1"], "recognition,f16")


@pytest.mark.parametrize("kwargs, message", [
    (dict(cost_models=["bytes", "bites"]), "unknown cost model 'bites': use bytes, roofline"),
    (dict(cost_models=["roofline:h100x"]), "unknown device profile 'h100x'"),
    (dict(cost_models=["nosuch:Model"]), "cost model 'nosuch:Model': cannot import 'nosuch'"),
    (dict(rulesets="recognition,matmul_epilog"), "unknown ruleset 'matmul_epilog'.*did you mean 'matmul_epilogue'"),
])
def test_grid_refuses_an_unknown_cost_model_or_ruleset_before_any_run(kwargs, message, tmp_path, capsys):
    # a cost model typo failed in every row at run time; a ruleset typo raised RewriteError, not the InputError
    # the docstring names
    with pytest.raises(InputError, match=message):
        sweep.grid(["llama:1"], **kwargs)
    flags = {"cost_models": "--cost-models", "rulesets": "--rulesets"}
    args = ["sweep", "--models", "llama:1", "--out", str(tmp_path / "out"), "--no-progress"]
    for key, value in kwargs.items():
        args += [flags[key], value if isinstance(value, str) else ",".join(value)]
    assert cli.main(args) == 2
    assert capsys.readouterr().err.startswith("eggfuse: error: ")
    assert not (tmp_path / "out").exists()


def test_run_one_gives_a_row_and_a_failure_is_a_row():
    from eggfuse.api import model_graph
    from eggfuse.rewrites import optimize

    row = sweep.run_one(sweep.RunConfig("llama:1", ",".join(SCHEDULE)))
    assert row["error"] == "" and set(NEEDED) <= set(row)
    _, rep = optimize(model_graph("llama:1"))
    assert (row["dispatches_before"], row["dispatches_after"], row["cost_after"]) == (
        rep.dispatches_before, rep.dispatches_after, rep.cost_after)
    assert row["egglog_version"].startswith("14.")
    paid = sweep.run_one(sweep.RunConfig("llama:1", ",".join(SCHEDULE), payoff=True))
    # MatMulBT -> FusedMatMulBT, the Add epilogue, the RmsNorm prologue, SwiGLU's and attention's packing pay
    assert paid["error"] == "" and paid["rules_paid"] >= 4 and row["rules_paid"] == ""
    bad = sweep.run_one(sweep.RunConfig("resnet", ",".join(SCHEDULE)))
    assert bad["error"].startswith("InputError: unknown model 'resnet'")


def _check_files(out, expect_rows, failed_models=()):
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == expect_rows
    assert set(NEEDED) <= set(rows[0])
    for r in rows:
        assert bool(r["error"]) == (r["model"] in failed_models), r
    assert len(json.loads((out / "results.json").read_text())) == expect_rows
    for png in ("compile_time.png", "phases.png", "dispatches_bytes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return rows


def test_sweep_command_on_a_local_pool(tmp_path, capsys):
    args = ["sweep", "--models", "llama:1,nope:fn", "--rulesets", "ablate", "--extractors", "ilp,greedy",
            "--workers", "2", "--out", str(tmp_path), "--no-progress"]
    assert cli.main(args) == 0
    rows = _check_files(tmp_path, 2 * (1 + len(SCHEDULE)) * 2, failed_models=("nope:fn",))
    full = [r for r in rows if r["model"] == "llama:1" and r["disabled"] == ""]
    left_out = {r["disabled"]: r for r in rows if r["model"] == "llama:1" and r["extractor"] == "ilp"}
    # leaving out matmul_epilogue costs dispatches; llama has nothing for the algebraic rules
    assert int(left_out["matmul_epilogue"]["dispatches_after"]) > int(full[0]["dispatches_after"])
    assert left_out["algebraic"]["dispatches_after"] == full[0]["dispatches_after"]
    assert "cannot import 'nope'" in next(r for r in rows if r["model"] == "nope:fn")["error"]
    assert "runs, " in capsys.readouterr().out


RULES_PY = """
from eggfuse.ir import Graph
from eggfuse.rewrites import make_ruleset


def factor_matmul(e):
    a, b, c = e.vars("a b c")
    yield e.equal("Add(MatMul(a,b), MatMul(a,c)) -> MatMul(a, Add(b,c))",
                  e.Add(e.MatMul(a, b), e.MatMul(a, c)), e.MatMul(a, e.Add(b, c)))


MINE = make_ruleset("factor_for_sweep_test", factor_matmul)


def two_products():  # MatMul, MatMul, Add, Relu: 4 dispatches; with the rule Add(w1, w2), MatMul, Relu: 3
    g = Graph()
    x = g.input("x", [8, 32])
    w1, w2 = g.parameter("w1", [32, 16]), g.parameter("w2", [32, 16])
    g.set_outputs([g.relu(g.add(g.matmul(x, w1), g.matmul(x, w2)))])
    return g
"""


def test_sweep_runs_a_ruleset_of_ones_own_in_its_worker_processes(tmp_path):
    # --rulesets all,module:NAME was "unknown ruleset"; the row keeps its source text for the workers to import
    path = tmp_path / "rules_for_sweep_test.py"
    path.write_text(RULES_PY)
    mine, graph = f"{path}:MINE", f"{path}:two_products"
    (kept,) = sweep.grid([graph], f"all,{mine}")
    assert kept.rulesets == ",".join([*SCHEDULE, mine])
    configs = [*sweep.grid([graph], "algebraic"), *sweep.grid([graph], mine, payoff=True)]
    rows = sweep.run_sweep(configs, workers=2, progress=False)
    assert [r["error"] for r in rows] == ["", ""]
    assert (rows[0]["dispatches_after"], rows[1]["dispatches_after"]) == (4, 3)
    assert (rows[1]["rulesets"], rows[1]["rules_fired"], rows[1]["rules_paid"]) == (mine, 1, 1)
    assert rows[1]["worker"] != f"{socket.gethostname()}:{os.getpid()}"  # a worker process imported it again
    assert sweep.label(rows[1]).startswith(f"{mine} bytes ilp")
    with pytest.raises(InputError, match="factor_matmul in .*rules_for_sweep_test.py is a function, not a ruleset"):
        sweep.grid([graph], f"all,{path}:factor_matmul")


def test_sweep_on_a_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed", reason="Dask distributed (the sweep extra) not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        args = ["sweep", "--models", "llama:1", "--cost-models", "bytes,roofline", "--scheduler", lc.scheduler_address,
                "--out", str(tmp_path), "--no-progress", "--json"]
        assert cli.main(args) == 0
        rows = _check_files(tmp_path, 2)
    assert {r["cost_model"] for r in rows} == {"bytes", "roofline"}
    assert len({r["graph_hash"] for r in rows}) == 1


def test_sweep_refuses_an_unknown_scheduler(tmp_path, capsys):
    assert cli.main(["sweep", "--models", "llama:1", "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path),
                     "--no-progress"]) == 2
    assert "no Dask scheduler answers at tcp://127.0.0.1:9" in capsys.readouterr().err
    for address in ("notaurl", "localhost:8786x"):  # distributed's ValueError, raw before
        assert cli.main(["sweep", "--models", "llama:1", "--scheduler", address, "--out", str(tmp_path),
                         "--no-progress"]) == 2
        assert f"{address!r} is not a Dask scheduler's address" in capsys.readouterr().err


def test_sweep_sizes_onnx_files_with_shape(tmp_path):
    # GPT-2's export at 2 x 7 tokens against its 1 x 1 default (its graph 14 times the rows), and a name the file
    # lacks: an error in that row, the sweep goes on
    from pathlib import Path

    gpt2 = str(Path(__file__).resolve().parent.parent / "data" / "exported" / "gpt2_tiny.dynamo.onnx")
    moved = {}
    for shape in (["--shape", "input_ids=2x7"], []):
        out = tmp_path / (shape[1].split("=")[1] if shape else "default")
        assert cli.main(["sweep", "--models", gpt2, "--workers", "1", "--out", str(out), "--no-progress",
                         "--no-plots", *shape]) == 0
        (row,) = json.loads((out / "results.json").read_text())
        # at 1 x 1 a [1, 32] residual sum is 128 bytes, no part of a pair (VIEW_ALIGN): two dispatches more
        assert row["dispatches_after"] == (16 if shape else 18) and row["shapes"] == (shape[1] if shape else ""), row
        moved[bool(shape)] = row["bytes_after"]
    assert moved[True] > moved[False], moved
    # with the optional LayerNorm prologue among the rulesets: four products take their norms (the first norm is
    # stored with the embeddings' sum, EmbeddingSumLayerNormPair)
    out = tmp_path / "prologue"
    assert cli.main(["sweep", "--models", gpt2, "--workers", "1", "--out", str(out), "--no-progress", "--no-plots",
                     "--shape", "input_ids=2x7", "--rulesets", ",".join([*SCHEDULE, "layer_norm_prologue"])]) == 0
    (row,) = json.loads((out / "results.json").read_text())
    assert row["dispatches_after"] == 12 and row["rulesets"].endswith(",layer_norm_prologue"), row
    out = tmp_path / "bad"
    assert cli.main(["sweep", "--models", gpt2, "--workers", "1", "--out", str(out), "--no-progress", "--no-plots",
                     "--shape", "ids=2x7"]) == 2  # every run failed: not an exit status of success
    (row,) = json.loads((out / "results.json").read_text())
    assert "'ids' is not an input of the model" in row["error"]
