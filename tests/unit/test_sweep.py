"""eggfuse sweep: the grid, a local process pool, a Dask LocalCluster through --scheduler (the
same code path), failures as rows, the CSV / JSON / PNG files."""

import csv
import dataclasses
import json
import os
import socket

import pytest
from user_rules import FACTOR, rules_module  # tests/: a rule of one's own, as a module's text

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


def test_a_payoff_row_gives_what_each_ruleset_saves_as_the_ablation_rows_measure_it(tmp_path, capsys):
    # the payoff of a ruleset is the ablation sweep's row without it minus the full row, per cost model
    for cost in ("bytes", "roofline"):
        ablate = [sweep.run_one(c) for c in sweep.grid(["llama:1"], "ablate", [cost])]
        full, without = ablate[0], {r["disabled"]: r for r in ablate[1:]}
        (paid,) = [sweep.run_one(c) for c in sweep.grid(["llama:1"], "all", [cost], payoff=True)]
        sets = {p["name"]: p for p in paid["payoff"] if p["kind"] == "ruleset"}
        assert list(sets) == list(SCHEDULE)
        for name in SCHEDULE:
            assert sets[name]["saved_dispatches"] == without[name]["dispatches_after"] - full["dispatches_after"]
            assert sets[name]["saved_cost"] == pytest.approx(without[name]["cost_after"] - full["cost_after"])
        assert paid["rulesets_paid"] == sum(1 for n in SCHEDULE if without[n]["cost_after"] > full["cost_after"]) >= 3
        rules = [p for p in paid["payoff"] if p["kind"] == "rule"]
        assert rules and all(p["matches"] for p in rules) and paid["rules_paid"] == sum(
            1 for p in rules if p["saved_cost"] > 0)
    path = sweep.write_payoff([full, paid], tmp_path)
    with path.open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(paid["payoff"]) and {w["run"] for w in written} == {"1"}  # the run's index
    assert {w["name"]: int(w["saved_dispatches"]) for w in written if w["kind"] == "ruleset"} == {
        n: p["saved_dispatches"] for n, p in sets.items()}
    assert sweep.write_payoff([full], tmp_path / "none") is None
    text = sweep.payoff_table([paid])
    assert "matmul_epilogue" in text and "algebraic" not in text  # a ruleset that matched nothing is left out
    # cut: the share of the cost without the ruleset that it removes, n/a where it saves nothing
    for line in text.splitlines()[1:]:
        name, cut = line.split()[-5], line.split()[-1]
        if sets[name]["saved_cost"] > 0:
            assert cut == f"{100 * sets[name]['saved_cost'] / (paid['cost_after'] + sets[name]['saved_cost']):.1f}%"
        else:
            assert cut == "n/a"
    assert sweep.payoff_table([full]) == ""


def test_runs_that_differ_in_training_seq_or_schedule_are_not_merged_as_repeats(tmp_path):
    # table() and payoff_table() took a training run for a repeat of the forward one (label() left it out)
    configs = [*sweep.grid(["llama:1"], payoff=True), *sweep.grid(["llama:1"], training=True, payoff=True),
               *sweep.grid(["llama:1"], seq=8), *sweep.grid(["llama:1"], schedule=(("ban_length", 2),))]
    rows = [sweep.run_one(c) for c in configs]
    assert [r["error"] for r in rows] == [""] * 4
    assert len({sweep.label(r) for r in rows}) == 4
    assert [r["schedule"] for r in rows] == ["", "", "", "ban_length=2"] and rows[2]["seq"] == 8
    lines = sweep.table(rows).splitlines()[1:]
    assert [int(line.split("->")[1].split()[0]) for line in lines] == [r["dispatches_after"] for r in rows]
    assert rows[1]["dispatches_after"] != rows[0]["dispatches_after"]  # the training graph's own
    paid = sweep.payoff_table(rows).splitlines()[1:]
    assert any("training" in line for line in paid) and any("training" not in line for line in paid)
    with sweep.write_payoff(rows, tmp_path).open() as f:
        written = list(csv.DictReader(f))
    assert {w["training"] for w in written} == {"False", "True"}


def test_sweep_command_payoff_writes_payoff_csv_and_prints_what_each_ruleset_saves(tmp_path, capsys):
    assert cli.main(["sweep", "--models", "llama:1", "--payoff", "--workers", "1", "--out", str(tmp_path),
                     "--no-progress", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "saved by each ruleset" in out and "matmul_epilogue" in out
    assert "payoff.csv" in out and (tmp_path / "payoff.csv").is_file()
    assert "rulesets_paid" in (tmp_path / "results.csv").read_text().splitlines()[0]
    # the table of rows read back from results.csv (text) is that of the run's rows (a TypeError before)
    with (tmp_path / "results.csv").open() as f:
        from_csv = list(csv.DictReader(f))
    assert sweep.table(from_csv) == sweep.table(json.loads((tmp_path / "results.json").read_text()))


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


def test_sweep_runs_a_ruleset_of_ones_own_in_its_worker_processes(tmp_path):
    # --rulesets all,module:NAME was "unknown ruleset"; the row keeps its source text for the workers to import
    path = tmp_path / "rules_for_sweep_test.py"
    path.write_text(rules_module("factor_for_sweep_test"))
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


def test_ablate_takes_rulesets_of_ones_own_and_leaves_each_out(tmp_path):
    # --rulesets ablate,myrules:MINE was "unknown ruleset 'ablate'": one's own rules could not be ablated
    path = tmp_path / "rules_for_ablation_test.py"
    path.write_text(rules_module("factor_for_ablation_test"))
    mine, graph = f"{path}:MINE", f"{path}:two_products"
    configs = sweep.grid([graph], f"ablate,{mine}")
    assert [c.disabled for c in configs] == ["", *SCHEDULE, mine]
    assert configs[0].rulesets == ",".join([*SCHEDULE, mine]) and mine not in configs[-1].rulesets.split(",")
    full, without = sweep.run_one(configs[0]), sweep.run_one(configs[-1])
    assert (full["error"], without["error"]) == ("", "")
    assert without["rules_fired"] == full["rules_fired"] - 1  # its one rule, left out
    assert sweep.label(without).startswith(f"-{mine} ")
    rules = sweep.grid([graph], f"ablate-rules,{mine}")
    assert rules[-1].disabled == FACTOR and rules[-1].rulesets == configs[0].rulesets
    assert sweep.run_one(rules[-1])["rules_fired"] == without["rules_fired"]
    # "-algebraic" of ablate and of ablate,MINE were one label: table() took them for repeats of one configuration
    plain = sweep.grid([graph], "ablate")[1]
    assert sweep.label(dataclasses.asdict(plain)) == "-algebraic bytes ilp"
    assert sweep.label(dataclasses.asdict(configs[1])) == f"-algebraic +{mine} bytes ilp"
    # seq and batch size the shipped models only: a function's row leaves them empty, as shapes
    assert (full["seq"], full["batch"], full["shapes"]) == ("", "", "")
    with pytest.raises(InputError, match="nosuch"):
        sweep.grid([graph], "ablate,nosuch")
    with pytest.raises(InputError, match=r"ablate runs every shipped ruleset already \('algebraic' among them\)"):
        sweep.grid([graph], "ablate,algebraic")
    # compare rows say which graph was kept and what each extractor's graph cost (they said neither)
    row = sweep.run_one(sweep.RunConfig("llama:1", ",".join(SCHEDULE), extractor="compare"))
    assert row["kept"] in ("ilp", "greedy") and row["cost_after"] == min(row["greedy_cost"], row["ilp_cost"])
    assert row["ilp_objective"] != ""


def test_sweep_on_a_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed", reason="Dask distributed (the sweep extra) not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        args = ["sweep", "--models", "llama:1", "--cost-models", "bytes,roofline", "--scheduler", lc.scheduler_address,
                "--out", str(tmp_path), "--no-progress", "--json"]
        assert cli.main(args) == 0
        rows = _check_files(tmp_path, 2)
    assert {r["cost_model"] for r in rows} == {"bytes", "roofline"}
    assert len({r["graph_hash"] for r in rows}) == 1


def test_sweep_refuses_a_setting_given_both_alone_and_as_a_grid(tmp_path, capsys):
    # --match-limit beside --match-limits, --no-decomp beside --no-decomp-values: one side was silently dropped
    base = ["sweep", "--models", "llama:1", "--workers", "1", "--out", str(tmp_path), "--no-progress", "--no-plots"]
    for extra, says in ((["--match-limits", "10", "--match-limit", "5"], "--match-limit 5 and --match-limits 10 both "
                         "set the match limit: give one"),
                        (["--no-decomp-values", "off", "--no-decomp"], "--no-decomp and --no-decomp-values off both "
                         "set egglog's no_decomp: give one")):
        assert cli.main([*base, *extra]) == 2
        assert says in capsys.readouterr().err
    assert cli.main([*base, "--decomp", "--match-limit", "7"]) == 0  # alone, each is taken
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["match_limit"], r["no_decomp"]) for r in rows] == [("7", "False")]


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
    out = tmp_path / "bad"  # a name no file of the sweep has: refused before any run
    assert cli.main(["sweep", "--models", gpt2, "--workers", "1", "--out", str(out), "--no-progress", "--no-plots",
                     "--shape", "ids=2x7"]) == 2
    assert not (out / "results.json").exists()


# a graph source and a cost model as a user's folder holds them; WORKER_GRAPHS, of the same names, as another holds
CLIENT_GRAPHS = """
from eggfuse import Graph


def mlp():
    g = Graph()
    x = g.input("x", [8, 64])
    h = g.gelu(g.matmul(x, g.parameter("w1", [64, 32])))
    g.set_outputs([g.matmul(h, g.parameter("w2", [32, 16]))])
    return g


def attn():
    g = Graph()
    x = g.input("x", [8, 16])
    s = g.matmul(x, g.transpose(g.matmul(x, g.parameter("wk", [16, 16]))))
    g.set_outputs([g.matmul(g.softmax(s), x)])
    return g
"""
WORKER_GRAPHS = """
from eggfuse import Graph


def mlp():
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [4, 4]))])
    return g
"""
CLIENT_COST = """
from eggfuse.rewrites import CostModel


class Cost(CostModel):
    def kernel_cost(self, k):
        return 7 * k.dispatches + k.bytes_read
"""
WORKER_COST = CLIENT_COST.replace("7 * k.dispatches + k.bytes_read", "1")


def _onnx_file(path):
    """A MatMul + Relu ONNX file whose input x is [batch, 32], batch symbolic."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((32, 8), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """(the folder a sweep runs from, another holding other files of the same names); the current folder the
    first."""
    client, other = tmp_path / "client", tmp_path / "other"
    client.mkdir()
    other.mkdir()
    (client / "mygraphs.py").write_text(CLIENT_GRAPHS)
    (client / "mycost.py").write_text(CLIENT_COST)
    (other / "mygraphs.py").write_text(WORKER_GRAPHS)
    (other / "mycost.py").write_text(WORKER_COST)
    _onnx_file(client / "mm.onnx")
    monkeypatch.chdir(client)
    return client, other


def _by_file(path, name):
    """``name`` of the Python file at ``path``, imported here, apart from eggfuse's own loading."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"sweep_test_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_sweep_on_dask_workers_started_in_another_folder(folders, monkeypatch, tmp_path):
    # relative sources name the files of the folder the sweep runs from, not those of the workers' folder
    from eggfuse.graphs import graph_hash
    from eggfuse.rewrites import optimize

    distributed = pytest.importorskip("distributed", reason="Dask distributed (the sweep extra) not installed")
    client, other = folders
    monkeypatch.chdir(other)  # the workers' current folder
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        monkeypatch.chdir(client)
        out = tmp_path / "out"
        assert cli.main(["sweep", "--models", "mygraphs:mlp,mygraphs.py:attn,mm.onnx", "--cost-models", "mycost:Cost",
                         "--shape", "x=4x32", "--scheduler", lc.scheduler_address, "--out", str(out), "--no-progress",
                         "--no-plots", "--json"]) == 0
    rows = {r["model"]: r for r in json.loads((out / "results.json").read_text())}
    assert all(not r["error"] for r in rows.values()), rows
    cost = _by_file(client / "mycost.py", "Cost")()
    for model, fn in (("mygraphs:mlp", "mlp"), ("mygraphs.py:attn", "attn")):
        graph = _by_file(client / "mygraphs.py", fn)()
        _, rep = optimize(graph, cost_model=cost)
        assert (rows[model]["graph_hash"], rows[model]["cost_after"]) == (graph_hash(graph), rep.cost_after), model
        assert rows[model]["source"] == f"{client / 'mygraphs.py'}:{fn}" and rows[model]["shapes"] == ""
        row = rows[model]
        assert (row["cost_model"], row["cost_source"]) == ("mycost:Cost", f"{client / 'mycost.py'}:Cost")
    onnx_row = rows["mm.onnx"]
    assert onnx_row["source"] == str(client / "mm.onnx") and onnx_row["shapes"] == "x=4x32"
    assert onnx_row["graph_nodes"] and onnx_row["dispatches_before"] >= 1


def test_a_source_missing_where_the_run_goes_fails_naming_its_path(folders, monkeypatch):
    client, other = folders
    configs = sweep.grid(["mygraphs:mlp", "mm.onnx"])
    (client / "mygraphs.py").unlink()
    (client / "mm.onnx").unlink()
    monkeypatch.chdir(other)  # a worker whose own folder holds a mygraphs.py
    graph_row, onnx_row = (sweep.run_one(c) for c in configs)
    assert f"no file {client / 'mygraphs.py'}" in graph_row["error"] and graph_row["model"] == "mygraphs:mlp"
    assert str(client / "mm.onnx") in onnx_row["error"] and onnx_row["model"] == "mm.onnx"


def test_grid_refuses_arguments_of_the_wrong_form():
    for call, message in (
            (lambda: sweep.grid("llama:1"), r"models must be a list, got str 'llama:1'"),
            (lambda: sweep.grid(["llama:1"], extractors="ilp"), "extractors must be a list"),
            (lambda: sweep.grid(["llama:1"], repeats=0), "repeats must be an integer of 1 or more"),
            (lambda: sweep.grid(["llama:1"], match_limits=[0]), "a match limit must be an integer of 1 or more"),
            (lambda: sweep.grid(["llama:1"], sead=3), "grid.. has no field 'sead'"),
            (lambda: sweep.grid(["llama:1"], shapes="x=8x32"), "shapes must be a list of .* got str 'x=8x32'"),
            (lambda: sweep.grid(["llama:1"], shapes={"x": (8, 32)}), "shapes must be a list"),
            (lambda: sweep.grid(["llama:1"], shapes=[("x", "8x32")]), r"got \('x', '8x32'\)"),
            (lambda: sweep.grid(["llama:1"], shapes=[("x", (8, 0))]), "every dimension a positive integer"),
            (lambda: sweep.grid(["llama:1"], shapes=["x=8xk"]), "expected NAME=DxDx"),
            (lambda: sweep.grid(["llama:1"], shapes=["x=8x32", ("x", (8, 16))]), "shapes give 'x' twice")):
        with pytest.raises(InputError, match=message):
            call()


def test_grid_takes_shapes_as_pairs_or_text_and_gives_each_graph_those_of_its_inputs(folders):
    as_text = sweep.grid(["mm.onnx", "mygraphs:attn"], shapes=["x=4x32"])
    as_pairs = sweep.grid(["mm.onnx", "mygraphs:attn"], shapes=[("x", [4, 32])])
    assert [c.shapes for c in as_text] == [c.shapes for c in as_pairs] == [(("x", (4, 32)),), ()]
    # a graph that is not an ONNX file is not sized by a shape, whatever its config says
    row = sweep.run_one(sweep.RunConfig("mygraphs:attn", ",".join(SCHEDULE), shapes=(("x", (8, 32)),)))
    assert row["error"] == "" and row["shapes"] == ""
    with pytest.raises(InputError, match=r"'y' is an input of no .onnx file of the sweep \(their inputs: mm.onnx: 'x'"):
        sweep.grid(["mm.onnx", "mygraphs:attn"], shapes=["y=3x3"])
    with pytest.raises(InputError, match="none of the models is one"):
        sweep.grid(["mygraphs:mlp"], shapes=["x=8x64"])


def test_run_one_and_the_pool_never_raise_on_a_config_made_by_hand():
    bad = sweep.RunConfig("llama:1", ",".join(SCHEDULE), shapes=("x=8x32",))
    assert sweep.run_one(bad)["error"].startswith("ValueError")
    rows = sweep.run_sweep([bad, sweep.RunConfig("llama:1", ",".join(SCHEDULE))], workers=1, progress=False)
    assert rows[0]["error"] and rows[1]["error"] == "", rows


def test_grid_refuses_a_graph_given_twice(folders, capsys):
    client, _ = folders
    (client / "sub").mkdir()
    (client / "sub" / "mygraphs.py").write_text(CLIENT_GRAPHS)
    for models, message in ((["mygraphs:mlp", "./mygraphs.py:mlp"], "'mygraphs:mlp' and './mygraphs.py:mlp' both name "
                             f"{client / 'mygraphs.py'}:mlp"),
                            (["mygraphs:mlp", str(client / "mygraphs.py") + ":mlp"], "both name"),
                            (["mm.onnx", "sub/../mm.onnx"], f"both name {client / 'mm.onnx'}"),
                            (["llama:1", "llama:1"], "'llama:1' is given twice")):
        with pytest.raises(InputError, match=message):
            sweep.grid(models)
    for kwargs, message in (({"cost_models": ["bytes", "roofline", "bytes"]}, "cost model 'bytes' is given twice"),
                            ({"extractors": ["ilp", "ilp"]}, "extractor 'ilp' is given twice"),
                            ({"match_limits": [50, 50]}, "match limit 50 is given twice")):
        with pytest.raises(InputError, match=message):  # two rows of the same configuration and repeat index
            sweep.grid(["llama:1"], **kwargs)
    # another file, another function: not the same graph
    assert len(sweep.grid(["mygraphs:mlp", "sub/mygraphs.py:mlp", "mygraphs:attn"], repeats=2)) == 6
    assert cli.main(["sweep", "--models", "mygraphs:mlp,mygraphs:mlp", "--out", str(client / "out"),
                     "--no-progress"]) == 2
    assert "'mygraphs:mlp' is given twice; give each graph once" in capsys.readouterr().err


def test_sweep_command_refuses_a_shape_that_sizes_no_graph(folders, capsys):
    client, _ = folders
    assert cli.main(["sweep", "--models", "mygraphs:mlp", "--shape", "y=3x3", "--out", str(client / "out"),
                     "--no-progress"]) == 2
    assert "shape y=3x3 sizes no graph of the sweep" in capsys.readouterr().err


def test_a_script_without_a_main_guard_is_told_why_its_workers_died(tmp_path):
    # every row was a bare BrokenProcessPool: spawn imports the script again in each worker, which runs the
    # sweep again at import, and the pool breaks
    import subprocess
    import sys

    script = tmp_path / "unguarded_sweep.py"
    script.write_text("from eggfuse.sweep import grid, run_sweep\n"
                      "rows = run_sweep(grid(['llama:1']), workers=1, progress=False)\n"
                      "print('ROWS:', rows)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode != 0 and "ROWS:" not in out.stdout  # no rows that hold only the pool's failure
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("eggfuse.ir.errors.InputError: the sweep's worker processes died before any run finished")
    assert 'needs its code under `if __name__ == "__main__":`' in last
    # each worker, importing the script, is told the same (not multiprocessing's bootstrapping RuntimeError)
    assert out.stderr.count("InputError: a script that runs a sweep on the local pool needs its code under") >= 1


def test_verify_fails_the_runs_of_an_unsound_rule_that_pays(tmp_path, capsys, monkeypatch):
    # the payoff of an unsound rule read as a saving: --verify compares each run's outputs with the input graph's
    path = tmp_path / "rules_for_verify_test.py"
    unsound = rules_module("factor_for_verify_test").replace("e.MatMul(a, e.Add(b, c))", "e.MatMul(a, e.Mul(b, c))")
    path.write_text(unsound
                    + "\n\ndef tall():  # x read once instead of twice: the unsound rule's graph costs less\n"
                      "    g = Graph()\n    x = g.input('x', [512, 64])\n"
                      "    w1, w2 = g.parameter('w1', [64, 16]), g.parameter('w2', [64, 16])\n"
                      "    g.set_outputs([g.relu(g.add(g.matmul(x, w1), g.matmul(x, w2)))])\n    return g\n")
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "--models", f"{path}:tall", "--rulesets", "all", "--rulesets", f"all,{path}:MINE",
            "--workers", "1", "--out", "out", "--no-progress", "--no-plots", "--payoff"]
    assert cli.main(args) == 0
    plain = sweep.read_results(tmp_path / "out")
    assert [r["error"] for r in plain] == ["", ""] and plain[1]["rules_paid"] >= 1  # two selections, it "pays"
    assert "not whether it is sound: --verify checks that" in capsys.readouterr().out
    assert cli.main([*args, "--verify"]) == 0
    checked = sweep.read_results(tmp_path / "out")
    assert [r["verify"] for r in checked] == [True, True]
    assert checked[0]["error"] == "" and checked[0]["verified_max_diff"] < 1e-5
    assert checked[1]["error"].startswith("RewriteError: ") and "differ" in checked[1]["error"]


def test_a_folder_of_an_earlier_sweep_keeps_none_of_its_files(tmp_path, capsys):
    # payoff.csv and the PNGs of an earlier sweep stayed beside the new results.csv, read as its own
    out = tmp_path / "out"
    assert cli.main(["sweep", "--models", "llama:1", "--payoff", "--workers", "1", "--out", str(out),
                     "--no-progress"]) == 0
    assert {p.name for p in out.iterdir()} == set(sweep.OUTPUTS)
    capsys.readouterr()
    assert cli.main(["sweep", "--models", "llama:1", "--workers", "1", "--out", str(out), "--no-progress",
                     "--no-plots"]) == 0
    assert {p.name for p in out.iterdir()} == {"results.csv", "results.json"}
    assert "note: replaced an earlier sweep's files in" in capsys.readouterr().err


def test_results_read_back_plot_again(tmp_path):
    rows = [sweep.run_one(c) for c in sweep.grid(["llama:1"], "all", ["bytes", "roofline"])]
    sweep.write_results(rows, tmp_path)
    again = sweep.read_results(tmp_path)
    assert again == json.loads(json.dumps(rows, default=str)) and sweep.table(again) == sweep.table(rows)
    with (tmp_path / "results.csv").open() as f:
        text_rows = list(csv.DictReader(f))
    for source, folder in ((again, tmp_path / "new" / "a"), (text_rows, tmp_path / "new" / "b")):
        paths = sweep.plot(source, folder)  # a folder not there yet; the CSV's text rows (a TypeError before)
        assert [p.read_bytes()[:4] for p in paths] == [b"\x89PNG"] * 3
    with pytest.raises(InputError, match=r"results\.json does not exist: give the folder a sweep wrote"):
        sweep.read_results(tmp_path / "new")


def test_ruleset_selections_misnamed_or_given_twice_are_refused(tmp_path, capsys):
    with pytest.raises(InputError, match=r"unknown ruleset 'al': rulesets: all \(the scheduled ones\).*"
                                         r"did you mean 'all'\?"):
        sweep.grid(["llama:1"], "al")
    with pytest.raises(InputError, match=r"or, alone first, a mode of the sweep: ablate, ablate-rules "
                                         r"\(did you mean 'ablate'\?\)"):
        sweep.grid(["llama:1"], "ablat")
    for twice in (["all", "all"], ["all", " all, "]):
        with pytest.raises(InputError, match="rulesets 'all' is given twice"):
            sweep.grid(["llama:1"], twice)
    for wrong in (None, 3, {"all": 1}, [], ["all", None]):  # a TypeError, or a dict's keys taken
        with pytest.raises(InputError, match="rulesets must be a str or a non-empty list of them"):
            sweep.grid(["llama:1"], wrong)
    # all and ablate share the full configuration: it runs once
    assert len(sweep.grid(["llama:1"], ["all", "ablate"])) == len(sweep.grid(["llama:1"], "ablate"))
    path = tmp_path / "rules_for_typo_test.py"
    path.write_text(rules_module("factor_for_typo_test"))
    with pytest.raises(InputError, match=r"has no ruleset 'MIEN' \(did you mean 'MINE'\?\)"):
        sweep.grid(["llama:1"], f"all,{path}:MIEN")


def test_a_worker_killed_after_a_run_finished_keeps_the_rows(tmp_path, monkeypatch):
    # the pool breaks when a worker dies: with a run finished, its row is kept and the others say a worker died;
    # with none finished, the sweep stops with why (the missing __main__ guard, or a killed worker)
    (tmp_path / "dies_for_sweep_test.py").write_text("import os\n\n\ndef graph():\n    os._exit(3)\n")
    monkeypatch.chdir(tmp_path)
    configs = [*sweep.grid(["llama:1"]), *sweep.grid(["dies_for_sweep_test:graph"])]
    rows = sweep.run_sweep(configs, workers=1, progress=False)
    assert rows[0]["error"] == "" and "BrokenProcessPool" in rows[1]["error"]
    assert "a worker process died, killed or out of memory, before this run finished" in rows[1]["error"]
    assert "__main__" not in rows[1]["error"]
    with pytest.raises(InputError, match="the sweep's worker processes died before any run finished"):
        sweep.run_sweep(configs[1:], workers=1, progress=False)
