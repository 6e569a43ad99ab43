"""eggfuse.onnx.Model, the backend and the CLI on small models (ops of the core converters)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_models import I64, B, F, model, node  # tests/onnx_models.py

from eggfuse.cli import main
from eggfuse.ir import DamagedFileError, IndexRangeError, InputError, OnnxError, UnsupportedOpsError
from eggfuse.onnx import Model, load
from eggfuse.onnx.backend import EggfuseBackend


def _shape_model():
    # y = x (Identity), s = Shape(x): one runtime output, one known at load time
    return model([node("Identity", ["x"], ["y"]), node("Shape", ["x"], ["s"])],
                 [("x", F, ["n", 3])], [("y", F, None), ("s", I64, None)])


def test_a_plan_per_input_shape_and_outputs_in_onnx_order_and_dtypes():
    m = Model(_shape_model())
    x2, x5 = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((5, 3), np.float32)
    y, s = m.run({"x": x2})
    assert np.array_equal(y, x2) and s.dtype == np.int64 and list(s) == [2, 3]
    y, s = m.run([x5])
    assert np.array_equal(y, x5) and list(s) == [5, 3]
    m.run({"x": x2})
    assert len(m.plans) == 2


def test_an_if_on_an_input_is_imported_per_value():
    out = helper.make_tensor_value_info
    then = helper.make_graph([node("Identity", ["x"], ["t"])], "then", [], [out("t", F, None)])
    other = helper.make_graph([node("Dropout", ["x"], ["e"])], "else", [], [out("e", F, None)])
    m = Model(model([node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                    [("x", F, [3]), ("c", B, [])], [("y", F, None)]))
    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert np.array_equal(m.run({"x": x, "c": np.array(True)})[0], x)
    assert np.array_equal(m.run({"x": x, "c": np.array(False)})[0], x)
    assert len(m.plans) == 2 and all(set(p.values) == {"c"} for p in m.plans.values())


def test_feeds_that_do_not_fit_are_refused_clearly():
    m = Model(_shape_model())
    with pytest.raises(InputError, match=r"'xx' is not an input of the model \(did you mean 'x'\?\)"):
        m.run({"xx": np.zeros((2, 3), np.float32)})
    with pytest.raises(OnnxError, match=r"shapes: 'xx' is not an input of the model \(did you mean 'x'\?\)"):
        Model(_shape_model(), shapes={"xx": [2, 3]})
    with pytest.raises(OnnxError, match=r"shapes: input 'x' given \[0, 3\]; .*: its dimension 0 is 0"):
        Model(_shape_model(), shapes={"x": [0, 3]})
    for bad in ([2, 3, 1], [2, 4]):  # another rank, a fixed dimension changed
        with pytest.raises(OnnxError, match=rf"shapes: input 'x' given {re.escape(str(bad))}, but the model declares "
                                            r"\['n', 3\]"):
            Model(_shape_model(), shapes={"x": bad})
    fixed = Model(_shape_model(), shapes={"x": [2, 3]})
    with pytest.raises(InputError, match=r"input 'x': fed an array of shape \[4, 3\], but this Model was made with "
                                         r"shapes=\{'x': \[2, 3\]\}"):
        fixed.run({"x": np.zeros((4, 3), np.float32)})
    # against the declared [n, 3] (onnxruntime refuses these too); the import raised OnnxError
    for bad, what in (((2, 4), "dimension 1 is 4"), ((6,), "rank 1"), ((2, 3, 1), "rank 3")):
        shape = re.escape(str(list(bad)))
        with pytest.raises(InputError, match=rf"input 'x': fed an array of shape {shape} \({what}\), but the model "
                                             r"declares 'x' \(FLOAT \[n, 3\]\)"):
            m.run({"x": np.zeros(bad, np.float32)})
    with pytest.raises(InputError, match=r"got 2 inputs, the model takes 1"):
        m.run([np.zeros((2, 3)), np.zeros(2)])
    with pytest.raises(InputError, match=r"input 'x': the model takes FLOAT, got an array of bool; give it as "
                                         r"float32 \(numpy: arr.astype\('float32'\)\)"):
        m.run({"x": np.zeros((2, 3), bool)})
    # integers and float64 for a float input: taken where float32 holds them, refused where it would change them
    exact = np.array([[-2**24, 3, 2**31], [2**40, -(2**62), 7]], np.int64)  # float32 holds each exactly
    assert m.run({"x": exact})[0].tolist() == [[float(v) for v in row] for row in exact.tolist()]
    halves = np.array([[0.1, 1 / 3, -2.5], [1e-40, 3e38, 0.0]])
    assert np.array_equal(m.run({"x": halves})[0], halves.astype(np.float32))
    with pytest.raises(InputError, match=r"input 'x' \(FLOAT, computed in float32\): 2 integer value\(s\) such as "
                                         r"16777217 have no exact float32"):
        m.run({"x": np.array([[1, 2, 2**24 + 1], [0, 2**62 + 1, 0]], np.int64)})
    with pytest.raises(InputError, match=r"input 'x' takes float32; 1 value\(s\) of the float64 feed, up to 1e\+39, "
                                         r"lie beyond its range"):
        m.run({"x": np.array([[1e39, 0, 0], [0, 0, 0]])})
    with pytest.raises(InputError, match=r"input\(s\) 'x' not given"):
        m.run({})
    # None was "an array of object", a str "expected shape [2, 3], got []", 'X' got no "did you mean"
    with pytest.raises(InputError, match=r"input 'x': got None, not an array"):
        m.run({"x": None})
    with pytest.raises(InputError, match=r"'X' is not an input of the model \(did you mean 'x'\?\)"):
        m.run({"X": np.zeros((2, 3), np.float32)})


def test_a_model_from_bytes_a_cost_model_checked_at_once_and_nodes_out_of_order_named():
    import eggfuse

    proto = _shape_model()
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(Model(proto.SerializeToString()).run({"x": x})[0], Model(proto).run({"x": x})[0])
    with pytest.raises(OnnxError, match="not a serialised ONNX model|not an ONNX model with a graph"):
        Model(b"not a model")
    with pytest.raises(InputError, match=r"cost_model must be a CostModel .*got str 'roofline'.*cost_model_from_spec"):
        Model(proto, cost_model="roofline")  # it failed at the first run, inside the rewrite engine
    swapped = model([helper.make_node("Relu", ["h"], ["y"]), node("Neg", ["x"], ["h"])], [("x", F, [3])],
                    [("y", F, None)])  # the Relu unnamed, as exporters often leave nodes
    with pytest.raises(OnnxError, match=r"Relu node computing 'y': input 'h' is computed by no earlier node \(ONNX "
                                        r"lists nodes in topological order"):
        load(swapped)
    with pytest.raises(InputError, match=r"input 'x': expected numbers, got text \(str 'abc'\); pass an array of "
                                         r"shape \[2, 3\]"):
        eggfuse.compile(*load(proto, shapes={"x": [2, 3]})).run({"x": "abc"})


def test_feeding_an_input_with_an_initializer_says_it_is_a_constant_weight():
    # it was "'w' is not an input of the model; its inputs are: 'x'" though the model lists 'w' as an input
    m = model([node("Add", ["x", "w"], ["y"])], [("x", F, [2, 4]), ("w", F, [4])], [("y", F, None)],
              [("w", np.ones(4, np.float32))])
    with pytest.raises(InputError, match=r"^'w' is an input of the model with a default value \(an initializer\), "
                                         r"which eggfuse treats as a constant weight, so it cannot be fed.*remove "
                                         r"the initializer from the model.*the inputs eggfuse feeds are: 'x'$"):
        Model(m).run({"x": np.ones((2, 4), np.float32), "w": np.zeros(4, np.float32)})


def test_an_initializer_holding_minus_infinity_runs():
    # an additive key mask [0, -inf, 0, 0, 0, -inf, 0] in the file: "parameter 'keymask': contains NaN or
    # infinity ... give finite values", though the user gave nothing and onnxruntime runs the model
    mask = np.array([0, -np.inf, 0, 0, 0, -np.inf, 0], np.float32)
    m = model([node("Add", ["x", "keymask"], ["s"]), node("Softmax", ["s"], ["y"], axis=-1)], [("x", F, [3, 7])],
              [("y", F, None)], [("keymask", mask)])
    x = np.random.default_rng(4).standard_normal((3, 7)).astype(np.float32)
    (got,) = Model(m).run({"x": x})
    e = np.exp((x + mask) - (x + mask).max(axis=-1, keepdims=True))  # numpy: exp(-inf) = 0
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert (got[:, [1, 5]] == 0).all()


def test_a_gather_by_an_initializer_out_of_range_names_the_onnx_node_and_the_initializer():
    # it was a LoweringError naming "node 0 (Constant 'const0', i32[1])" and "Gather (node 2)", neither ONNX name
    m = model([node("Gather", ["x", "idx"], ["y"], name="my_gather", axis=0)], [("x", F, [3, 4])], [("y", F, None)],
              [("idx", np.array([5], np.int64))])
    with pytest.raises(OnnxError, match=r"^Gather node 'my_gather': its indices 'idx', known at load time .*hold 5, "
                                        r"out of range for axis 0 of \[3, 4\]"):
        Model(m).run({"x": np.ones((3, 4), np.float32)})
    symbolic = model([node("Gather", ["x", "idx"], ["y"], name="my_gather", axis=0)], [("x", F, ["n", 4])],
                     [("y", F, None)], [("idx", np.array([-4], np.int64))])
    with pytest.raises(OnnxError, match=r"'my_gather': its indices 'idx'.*hold -4, out of range for axis 0 of "
                                        r"\[3, 4\] \(the data's shape at the shapes of the input\(s\) 'x'\)"):
        Model(symbolic).run({"x": np.ones((3, 4), np.float32)})
    assert Model(symbolic).run({"x": np.arange(16, dtype=np.float32).reshape(4, 4)})[0].tolist() == [[0, 1, 2, 3]]


def test_a_missing_input_is_named_with_the_models_inputs():
    # "input(s) 'sr' not given" before, without what the model takes
    two = model([node("Add", ["x", "sr"], ["y"])], [("x", F, ["n", 3]), ("sr", F, []), ("ids", I64, None)],
                [("y", F, None)])
    with pytest.raises(InputError, match=re.escape("input(s) 'sr', 'ids' not given; the model's inputs are: 'x' "
                                                   "(FLOAT [n, 3]), 'sr' (FLOAT []), 'ids' (INT64 of any shape)")):
        Model(two).run({"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(InputError, match=re.escape("the model's inputs are: 'x' (FLOAT [2, 3]), 'sr' (FLOAT [])")):
        Model(two, shapes={"x": [2, 3]}).run({})


def test_backend_prepares_and_runs_by_position():
    rep = EggfuseBackend.prepare(_static(), "CPU")
    (y, s) = rep.run([np.ones((4, 3), np.float32)])
    assert y.shape == (4, 3) and list(s) == [4, 3]
    assert EggfuseBackend.supports_device("CPU")
    assert len(rep.model.plans) == 1  # the plan prepare made for the model's own shapes serves the run


def _static():
    return model([node("Identity", ["x"], ["y"]), node("Shape", ["x"], ["s"])],
                 [("x", F, [4, 3])], [("y", F, [4, 3]), ("s", I64, [2])])


def test_cli_run_prints_shapes_dispatches_and_timings(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_shape_model(), path)
    x = tmp_path / "x.npy"
    np.save(x, np.ones((7, 3), np.float32))
    assert main(["run", str(path), "--input", f"x={x}", "--json", "--repeats", "2"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["outputs"] == {"y": {"shape": [7, 3], "dtype": "float32"}, "s": {"shape": [2], "dtype": "int64"}}
    assert info["inputs"] == {"x": [7, 3]} and info["onnx_nodes"] == 2
    assert info["memory"]["run"]["weights_bytes"] == info["memory"]["run"]["cache_bytes"] == 0
    assert main(["run", str(path), "--shape", "x=2x3"]) == 0
    text = capsys.readouterr().out
    assert "input  x: [2, 3] (random)" in text and "dispatches per run:" in text
    assert main(["run", str(path), "--shape", "y=2x3"]) == 2
    assert "'y' is not an input of the model" in capsys.readouterr().err
    assert main(["run", str(path), "--shape", "xx=2x3"]) == 2
    assert "'xx' is not an input of the model (did you mean 'x'?)" in capsys.readouterr().err


def test_cli_run_takes_numbers_as_inputs_and_checks_shapes(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_shape_model(), path)
    assert main(["run", str(path), "--input", "x=2.5", "--shape", "x=2x3", "--json", "--repeats", "0",
                 "--save", str(tmp_path / "out.npz")]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == {"x": [2, 3]}
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], np.full((2, 3), 2.5, np.float32))
    assert main(["run", str(path), "--input", "x=1e60"]) == 2  # beyond float32
    assert "input 'x': '1e60' is not a value of its dtype float32" in capsys.readouterr().err
    for bad in ("x=1x-5", "x=1xx3", "x=2x3x", "x=", "x=1x0", "x=axb"):
        with pytest.raises(SystemExit):
            main(["run", str(path), "--shape", bad])
        assert "every dimension a positive integer" in capsys.readouterr().err, bad


def test_cli_run_takes_nan_and_infinities_for_a_float_input(tmp_path, capsys):
    # "'nan' is not a value of its dtype float32" before; Model.run takes them
    path = tmp_path / "m.onnx"
    onnx.save(_shape_model(), path)
    for text in ("nan", "inf", "-inf"):
        out = tmp_path / f"{text}.npz"
        assert main(["run", str(path), "--input", f"x={text}", "--shape", "x=2x3", "--repeats", "0",
                     "--save", str(out)]) == 0, capsys.readouterr().err
        np.testing.assert_array_equal(np.load(out)["y"], np.full((2, 3), float(text), np.float32))


def test_cli_run_sizes_a_random_input_from_another_inputs_file(tmp_path, capsys):
    # x and m share the named dimensions: m, drawn at random, takes x's [3, 4] from its .npy file
    path = tmp_path / "add.onnx"
    onnx.save(model([node("Add", ["x", "m"], ["y"])], [("x", F, ["batch", "seq"]), ("m", F, ["batch", "seq"])],
                    [("y", F, None)]), path)
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--json", "--repeats", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == {"x": [3, 4], "m": [3, 4]}


def test_cli_run_draws_random_indices_within_the_tables_they_index(capsys):
    # bert_tiny's token_type_ids index a table of 2 rows: random ids stay below 2 (the others below 10)
    path = Path(__file__).resolve().parents[1] / "data" / "exported" / "bert_tiny.classic.onnx"
    assert main(["run", str(path), "--json", "--repeats", "0", "--no-cache"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["token_type_ids"] == [1, 1]


def test_scripts_run_takes_paths_relative_to_the_callers_folder(tmp_path):
    # scripts/run sets up in the repository but runs the command where it was called
    onnx.save(_shape_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.ones((5, 3), np.float32))
    script = Path(__file__).resolve().parents[2] / "scripts" / "run"
    done = subprocess.run([str(script), "run", "m.onnx", "--input", "x=x.npy", "--json", "--repeats", "0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["model"] == "m.onnx" and info["inputs"] == {"x": [5, 3]}


def test_cli_run_says_when_the_inputs_it_failed_on_were_drawn_at_random(tmp_path, capsys):
    # a 2x2 MaxPool over [1, 1, h, w]: h = w = 1 (symbolic dimensions' default) is too small for it
    path = tmp_path / "pool.onnx"
    onnx.save(model([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [("x", F, [1, 1, "h", "w"])],
                    [("y", F, None)]), path)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "MaxPool" in err and "hint: inputs drawn at random: x [1, 1, 1, 1]" in err and "--shape NAME=" in err
    assert main(["run", str(path), "--shape", "x=1x1x4x4"]) == 0
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, 1, 1, 1), np.float32))
    assert main(["run", str(path), "--input", f"x={x}"]) == 2  # the user's own values: no hint about random ones
    err = capsys.readouterr().err
    assert "MaxPool" in err and "hint" not in err
    # a damaged file fails on any input: no hint either, with inputs drawn at random
    w = onnx.numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    w.raw_data = w.raw_data[:-8]
    damaged = model([node("MatMul", ["x", "w"], ["y"])], [("x", F, ["b", 4])], [("y", F, None)])
    damaged.graph.initializer.append(w)
    onnx.save(damaged, path)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "the file is damaged" in err and "hint" not in err, err
    # an error about an input the user gave, while another was drawn at random: about that input, so no hint
    gather = model([node("Gather", ["t", "ids"], ["g"]), node("Add", ["g", "m"], ["y"])],
                   [("ids", onnx.TensorProto.INT64, [2]), ("m", F, [2, 3])], [("y", F, None)])
    gather.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "t"))
    onnx.save(gather, path)
    np.save(x, np.array([1, 4], np.int64))
    assert main(["run", str(path), "--input", f"ids={x}"]) == 2
    err = capsys.readouterr().err
    assert "input 'ids': index 4 out of range for the axis of 4 that Gather" in err and "hint" not in err, err


def test_an_index_out_of_range_names_the_onnx_nodes_indexing_with_the_input():
    import pickle

    i64 = onnx.TensorProto.INT64
    m = model([node("Cast", ["ids"], ["ids32"], name="to_int32", to=onnx.TensorProto.INT32),
               node("Unsqueeze", ["ids32", "zero"], ["ids2"], name="unsq"),
               node("Gather", ["table", "ids2"], ["rows"], name="emb/word_embeddings/Gather"),
               node("Gather", ["ids", "zero"], ["first"], name="first_id"),  # reads ids as data, not as indices
               node("LayerNormalization", ["rows", "gamma", "beta"], ["y"], name="emb/LayerNorm", axis=-1)],
              [("ids", i64, [3])], [("y", F, None), ("first", i64, None)])
    m.graph.initializer.extend([onnx.numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(5, 8), "table"),
                                onnx.numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
                                onnx.numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
                                onnx.numpy_helper.from_array(np.array([0], np.int64), "zero")])
    mod = Model(m)
    y, first = mod.run({"ids": np.array([4, 0, -5], np.int64)})
    assert y.shape == (1, 3, 8) and list(first) == [4]
    with pytest.raises(IndexRangeError) as info:
        mod.run({"ids": np.array([1, 5, 0], np.int64)})
    e = info.value
    assert (e.input, e.index, e.rows) == ("ids", 5, 5)
    assert str(e).startswith("input 'ids': index 5 out of range for the axis of 5 that ")
    assert str(e).endswith("[ONNX node indexing with it: 'emb/word_embeddings/Gather' (Gather)]"), str(e)
    again = pickle.loads(pickle.dumps(e))
    assert isinstance(again, InputError) and (again.input, again.index, again.rows, str(again)) == \
        (e.input, e.index, e.rows, str(e))


def test_columns_of_a_split_index_input_are_checked_against_their_own_tables():
    # ids [2, 3] Split into columns, column k indexing a table of its own (a recommender's categorical features):
    # each column's values are checked against its table before the run, as onnxruntime checks each Gather; a
    # value valid for a larger table is not refused in a column that reads it. Values against onnxruntime.
    ort = pytest.importorskip("onnxruntime")
    rows = (5, 7, 3)
    m = model([node("Split", ["ids"], ["a", "b", "c"], name="split", axis=1),
               *[node("Gather", [f"t{k}", col], [f"g{k}"], name=f"emb{k}") for k, col in enumerate("abc")],
               node("Concat", ["g0", "g1", "g2"], ["y"], name="cat", axis=1)],
              [("ids", I64, [2, 3])], [("y", F, None)])
    rng = np.random.default_rng(0)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(rng.standard_normal((r, 4)).astype(np.float32), f"t{k}")
                               for k, r in enumerate(rows))
    peer = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    mod = Model(m, cache=False)
    good = np.array([[4, 6, 2], [-5, -7, -3]], np.int64)
    np.testing.assert_allclose(mod.run({"ids": good})[0], peer.run(None, {"ids": good})[0], rtol=1e-6)
    for col, bad in ((0, 5), (1, -8), (2, 3)):
        ids = good.copy()
        ids[0, col] = bad
        with pytest.raises(Exception, match="out of range|out of data bounds"):
            peer.run(None, {"ids": ids})
        with pytest.raises(IndexRangeError, match=rf"input 'ids': index {bad} out of range for the axis of "
                                                  rf"{rows[col]} that Gather \(node \d+\) of parameter .* \(the 2 of "
                                                  rf"its 6 elements that op reads\) .*\[ONNX node indexing with it: "
                                                  rf"'emb{col}' \(Gather\)\]"):
            mod.run({"ids": ids})



@pytest.mark.parametrize("op, attrs, good, bad, which", [
    ("GatherElements", dict(axis=1), [[0, -1], [2, 1], [0, 0], [-3, 1]], ((0, 1, 3), (3, 0, -4)), "the axis of 3"),
    ("ScatterElements", dict(axis=0), [[3, 0, -4]], ((0, 0, 4), (0, 2, -5)), "the axis of 4"),
    ("GatherND", {}, [[0, 2], [-4, -1]], ((1, 0, 4), (0, 1, 3)), r"the axis of (4|3) that GatherND \(node \d+\) at "
                                                                 r"position (0|1) of its index tuples"),
    ("ScatterND", {}, [[3], [-4]], ((1, 0, 4), (0, 0, -5)), "the axis of 4"),
])
def test_fed_indices_out_of_range_are_refused_by_the_other_gathers_and_scatters(op, attrs, good, bad, which):
    # they were clamped without a word (onnxruntime raises); Gather's check, each element of GatherND's and
    # ScatterND's index tuples against its own axis
    ort = pytest.importorskip("onnxruntime")
    scatter = op.startswith("Scatter")
    good = np.array(good, np.int64)
    upd = np.full(good.shape if op == "ScatterElements" else (good.shape[0], 3), -1.0, np.float32)
    m = model([node(op, ["x", "i", "u"] if scatter else ["x", "i"], ["y"], **attrs)],
              [("x", F, [4, 3]), ("i", I64, list(good.shape))] + ([("u", F, list(upd.shape))] if scatter else []),
              [("y", F, None)])
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "i": good} | ({"u": upd} if scatter else {})
    peer = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    mod = Model(m, cache=False)
    np.testing.assert_array_equal(mod.run(feeds)[0], peer.run(None, feeds)[0])
    for row, col, value in bad:
        i = good.copy()
        i[row, col] = value
        with pytest.raises(Exception, match="(?i)out of|invalid"):
            peer.run(None, feeds | {"i": i})
        with pytest.raises(IndexRangeError, match=rf"input 'i': index {value} out of range for {which}"):
            mod.run(feeds | {"i": i})


def test_indices_of_an_input_the_import_reads_by_value_out_of_range_name_the_input():
    # idx picks a shape for Reshape, so the import needs its value (a plan per value); an index outside the table
    # is the feed's fault: IndexRangeError naming the input, as the session's check of a run-time input does
    m = model([node("Gather", ["opts", "idx"], ["shape"], name="pick"), node("Reshape", ["x", "shape"], ["y"])],
              [("x", F, [6]), ("idx", I64, [])], [("y", F, None)],
              [("opts", np.array([[2, 3], [3, 2], [6, 1]], np.int64))])
    mod = Model(m, cache=False)
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(mod.run({"x": x, "idx": np.array(-2)})[0], x.reshape(3, 2))
    for bad in (3, -4):
        with pytest.raises(IndexRangeError, match=rf"input 'idx': index {bad} out of range for axis 0 of \[3, 2\] "
                                                  r"that Gather node 'pick' indexes with it \(the indices come from "
                                                  r"input 'idx', whose values the model needs at load time.*give "
                                                  r"indices from -3 to 2") as e:
            mod.run({"x": x, "idx": np.array(bad)})
        assert (e.value.input, e.value.index, e.value.rows) == ("idx", bad, 3)


def test_an_index_input_read_by_value_over_run_time_data_and_a_length_past_a_table():
    # n sizes a Range (the import needs its value) and indexes x, data of the run: its Gather is not folded, and
    # an n outside x's rows is the feed's fault (IndexRangeError naming n); positions Range(0, len(s)) into a
    # table of 4 rows, where s is needed by value too: a fifth position is the input's length, not its values,
    # so the error advises a shorter input (OnnxError)
    m = model([node("Range", ["zero", "n", "one"], ["r"]), node("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT),
               node("ReduceSum", ["rf"], ["total"], keepdims=0), node("Gather", ["x", "n"], ["row"], name="pick")],
              [("x", F, [4, 3]), ("n", I64, [])], [("total", F, None), ("row", F, None)],
              [("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64))], opset=13)
    mod = Model(m, cache=False)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(mod.run({"x": x, "n": np.array(-1)})[1], x[3])
    for bad in (4, -5):
        with pytest.raises(IndexRangeError, match=rf"input 'n': index {bad} out of range for axis 0 of \[4, 3\] "
                                                  r"that Gather node 'pick'"):
            mod.run({"x": x, "n": np.array(bad)})
    m = model([node("ReduceMax", ["s"], ["top"], keepdims=0), node("Range", ["zero", "top", "one"], ["r"]),
               node("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT), node("ReduceSum", ["rf"], ["total"], keepdims=0),
               node("Shape", ["s"], ["shape"]), node("Gather", ["shape", "i0"], ["len"], axis=0),
               node("Squeeze", ["len"], ["n"]), node("Range", ["zero", "n", "one"], ["positions"]),
               node("Gather", ["table", "positions"], ["rows"], name="position_rows")],
              [("s", I64, ["S"])], [("total", F, None), ("rows", F, None)],
              [("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)), ("i0", np.array([0], np.int64)),
               ("table", np.arange(12, dtype=np.float32).reshape(4, 3))], opset=13)
    mod = Model(m, cache=False)
    assert mod.run({"s": np.array([1, 2, 3], np.int64)})[1].shape == (3, 3)
    with pytest.raises(OnnxError, match=r"Gather node 'position_rows': index 4 is out of range .* give a shorter "
                                        r"input") as e:
        mod.run({"s": np.zeros(6, np.int64)})
    assert not isinstance(e.value, InputError)


def test_cli_run_draws_indices_below_each_part_of_a_split_index_input(tmp_path, capsys):
    # ids [2, 2] Split into columns indexing tables of 3 and 20 rows: indices drawn at random fit the smaller
    path = tmp_path / "split.onnx"
    onnx.save(model([node("Split", ["ids", "sizes"], ["a", "b"], axis=1), node("Gather", ["t0", "a"], ["y0"]),
                     node("Gather", ["t1", "b"], ["y1"])], [("ids", I64, [2, 2])], [("y0", F, None), ("y1", F, None)],
                    [("t0", np.ones((3, 4), np.float32)), ("t1", np.ones((20, 4), np.float32)),
                     ("sizes", np.array([1, 1], np.int64))], opset=13), path)
    for seed in range(4):
        assert main(["run", str(path), "--no-cache", "--seed", str(seed), "--repeats", "0"]) == 0, \
            capsys.readouterr().err

def test_cli_run_gives_a_named_dimension_of_one_input_to_the_others(tmp_path, capsys):
    # x and m share "batch" and "seq": --shape of x sizes the random m too; a .npy of another size is refused
    path = tmp_path / "add.onnx"
    onnx.save(model([node("Add", ["x", "m"], ["y"])], [("x", F, ["batch", "seq"]), ("m", F, ["batch", "seq"])],
                    [("y", F, None)]), path)
    assert main(["run", str(path), "--shape", "x=2x7", "--json", "--repeats", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == {"x": [2, 7], "m": [2, 7]}
    m = tmp_path / "m.npy"
    np.save(m, np.ones((2, 5), np.float32))
    assert main(["run", str(path), "--shape", "x=2x7", "--input", f"m={m}"]) == 2
    assert "input 'm' (shape [2, 5]): its dimension 'seq' is 5, but 7 in input 'x'" in capsys.readouterr().err


def test_an_empty_feed_binds_its_values_for_that_shape_only():
    # an input fed empty is a load-time value of that import (the ONNX suites' empty tensors: the Add is folded
    # on the host); later feeds with contents run on the GPU as before, rather than every later run being folded
    m = Model(model([node("Add", ["x", "m"], ["y"])], [("x", F, ["n"]), ("m", F, ["n"])], [("y", F, None)]))
    one = np.ones(3, np.float32)
    assert np.array_equal(m.run({"x": one, "m": one})[0], 2 * one)
    (empty,) = m.run({"x": np.zeros(0, np.float32), "m": np.zeros(0, np.float32)})
    assert empty.shape == (0,)
    for k in range(3):
        x = np.full(3, float(k), np.float32)
        assert np.array_equal(m.run({"x": x, "m": one})[0], x + 1)
    assert not m._control and all(p.compiled is not None for p in m.plans.values() if not p.values)
    assert len([p for p in m.plans.values() if not p.values]) == 1


def test_cli_run_reads_an_npz_by_input_name_and_refuses_an_empty_file(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_shape_model(), path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(tmp_path / "feeds.npz", **{"input.x": x})  # as scripts/export_torch_fixtures.py writes them
    assert main(["run", str(path), "--input", f"x={tmp_path / 'feeds.npz'}", "--repeats", "0",
                 "--save", str(tmp_path / "out.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], x)
    np.savez(tmp_path / "other.npz", z=x)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'other.npz'}"]) == 2
    assert "is an .npz without an array 'x' or 'input.x' (it holds z)" in capsys.readouterr().err
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert main(["run", str(tmp_path / "empty.onnx")]) == 2
    assert "is not an ONNX model with a graph: it declares no outputs (0 bytes)" in capsys.readouterr().err


def test_cli_optimize_gives_a_named_dimension_of_one_input_to_the_others(tmp_path, capsys):
    # as eggfuse run does: m, whose shape is not given, takes x's [3, 4] from the names the two share
    path = tmp_path / "add.onnx"
    onnx.save(model([node("Add", ["x", "m"], ["y"])], [("x", F, ["batch", "seq"]), ("m", F, ["batch", "seq"])],
                    [("y", F, None)]), path)
    assert main(["optimize", str(path), "--shape", "x=3x4"]) == 0, capsys.readouterr().err
    assert "dispatches 1 -> 1" in capsys.readouterr().out


def test_an_int64_value_beyond_int32_is_refused_naming_the_narrowing():
    m = Model(model([node("Identity", ["x"], ["y"])], [("x", I64, [3])], [("y", I64, None)]))
    assert list(m.run({"x": np.array([1, -2, 3], np.int64)})[0]) == [1, -2, 3]
    with pytest.raises(InputError, match=r"values must lie in \[-2\^31, 2\^31\) .*\(eggfuse's integers are 32-bit, "
                                         r"an ONNX model's int64 too"):
        m.run({"x": np.array([1, 2, 2**40], np.int64)})


def test_run_with_the_optional_layer_norm_prologue(tmp_path, capsys):
    # eggfuse.onnx.Model(rulesets=...) and `eggfuse run --with-ruleset`: GPT-2's pre-LN norms in the next products,
    # the outputs torch's
    from eggfuse.rewrites.rulesets import select

    path = Path(__file__).resolve().parents[1] / "data" / "exported" / "gpt2_tiny.classic.onnx"
    data = np.load(path.with_name("gpt2_tiny.npz"))
    feeds = {k[6:]: data[k] for k in data.files if k.startswith("input.")}
    m = Model(path, cache=False, rulesets=select(optional=["layer_norm_prologue"]))
    (logits,) = m.run(feeds)
    np.testing.assert_allclose(logits, data["output.logits"], rtol=1e-4, atol=2e-5)
    assert "FusedLayerNormMatMul" in {n.op for n in m.specialise(feeds).compiled.graph.live_nodes()}
    assert main(["run", str(path), "--shape", "input_ids=2x7", "--with-ruleset", "layer_norm_prologue",
                 "--repeats", "0", "--no-cache"]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--with-ruleset", "f16"]) == 2
    assert "ask for it with --precision f16" in capsys.readouterr().err


def test_run_messages_for_files_and_options(tmp_path, capsys):
    path = Path(__file__).resolve().parents[1] / "data" / "exported" / "gpt2_tiny.classic.onnx"
    garbage = tmp_path / "ids.npy"
    garbage.write_bytes(b"abcd")
    assert main(["run", str(path), "--input", f"input_ids={garbage}"]) == 2
    err = capsys.readouterr().err
    assert "is not a .npy or .npz array file" in err and "pickle" not in err, err
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array(["a", None], dtype=object))  # was "not a .npy file" too
    assert main(["run", str(path), "--input", f"input_ids={objects}"]) == 2
    assert "holds an array of Python objects, not numbers" in capsys.readouterr().err
    assert main(["run", str(path), "--no-fuse", "--precision", "f16"]) == 2
    assert "drop --no-fuse" in capsys.readouterr().err
    assert main(["run", str(path), "--repeats", "0", "--no-cache", "--save", str(tmp_path / "out")]) == 0
    assert f"outputs written to {tmp_path / 'out.npz'}" in capsys.readouterr().out
    assert list(np.load(tmp_path / "out.npz").files) == ["logits"]


def test_run_refuses_shapes_that_disagree(tmp_path, capsys):
    path = Path(__file__).resolve().parents[1] / "data" / "exported" / "gpt2_tiny.classic.onnx"
    ids = tmp_path / "ids.npy"
    np.save(ids, np.zeros((2, 7), np.int64))
    assert main(["run", str(path), "--input", f"input_ids={ids}", "--shape", "input_ids=3x7"]) == 2
    err = capsys.readouterr().err
    assert "--shape input_ids=3x7 and --input input_ids" in err and "shape [2, 7]) disagree" in err, err
    assert main(["run", str(path), "--shape", "input_ids=2x7", "--shape", "input_ids=3x7"]) == 2
    assert "--shape gives 'input_ids' twice: 2x7 and 3x7" in capsys.readouterr().err
    assert main(["optimize", str(path), "--shape", "input_ids=2x7", "--shape", "input_ids=3x7"]) == 2
    assert "twice" in capsys.readouterr().err
    # an --input given twice kept the last one
    for command in ("run", "optimize"):
        assert main([command, str(path), "--input", f"input_ids={ids}", "--input", "input_ids=3"]) == 2
        assert f"--input gives 'input_ids' twice: '{ids}' and '3'; give it once" in capsys.readouterr().err


def test_run_keeps_the_random_inputs_hint_for_a_lowering_error_of_their_shapes(tmp_path, capsys):
    # Gather(x [B, S], indices [3], axis 1): at S = 1 (a symbolic dimension's default) index 3 is past the rows; an
    # error that --shape cures, so the hint stays (device limits, which no shape cures, drop it)
    from onnx import numpy_helper

    m = model([node("Gather", ["x", "i"], ["y"], axis=1)], [("x", F, ["b", "s"])], [("y", F, None)])
    m.graph.initializer.append(numpy_helper.from_array(np.array([3], np.int64), "i"))
    path = tmp_path / "gather.onnx"
    onnx.save(m, path)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("Gather node 'Gather_y': its indices 'i', known at load time (an initializer or a constant), hold 3, out "
            "of range for axis 1 of [1, 1]" in err and "hint: inputs drawn at random" in err), err
    assert main(["run", str(path), "--shape", "x=2x5", "--repeats", "0"]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--no-fuse", "--with-ruleset", "layer_norm_prologue"]) == 2
    assert "which --no-fuse leaves out" in capsys.readouterr().err
    assert main(["run", str(path), "--shape", "x=2x5", "--repeats", "0", "--no-fuse"]) == 0
    out = capsys.readouterr().out
    assert "dispatches per run: 1 unfused (--no-fuse)" in out and "fused" not in out.replace("unfused", ""), out


class _Limited:
    # the process's device with some limits lowered: lowering reads them, nothing runs on it
    def __init__(self, device, **limits):
        self._device, self.limits = device, {**dict(device.limits), **limits}

    def __getattr__(self, name):
        return getattr(self._device, name)


def _dense_relu():
    # relu(x @ w + b) of 40 rows: one FusedMatMul when fused, three dispatches when not
    rng = np.random.default_rng(0)
    return model([node("MatMul", ["x", "w"], ["p"], name="fc/MatMul"), node("Add", ["p", "b"], ["q"], name="fc/Add"),
                  node("Relu", ["q"], ["y"], name="act/Relu")], [("x", F, [40, 24])], [("y", F, None)],
                 [("w", rng.standard_normal((24, 40)).astype(np.float32)),
                  ("b", rng.standard_normal(40).astype(np.float32))])


@pytest.mark.parametrize("fuse", [True, False])
def test_a_device_limit_names_the_onnx_nodes_of_the_dispatch(fuse):
    from eggfuse.ir import DeviceLimitError
    from eggfuse.runtime.device import get_device

    # no workgroup grid fits one workgroup a dimension: the first dispatch fails, fused (the product with its bias and
    # Relu, all three ONNX nodes) or not (the MatMul alone)
    device = _Limited(get_device(), **{"max-compute-workgroups-per-dimension": 1})
    m = Model(_dense_relu(), fuse=fuse, device=device, cache=False)
    named = r"\[ONNX nodes 'fc/MatMul' \(MatMul\), 'fc/Add' \(Add\), 'act/Relu' \(Relu\)\]$" if fuse else \
        r"\[ONNX node 'fc/MatMul' \(MatMul\)\]$"
    with pytest.raises(DeviceLimitError, match=r"maxComputeWorkgroupsPerDimension = 1: .*" + named) as info:
        m.run({"x": np.zeros((40, 24), np.float32)})
    assert info.value.nodes and len(info.value.sources) == (3 if fuse else 1)
    # the binding limit below the weight's 3,840 bytes: a DeviceLimitError, named the same way
    device = _Limited(get_device(), **{"max-storage-buffer-binding-size": 1024})
    with pytest.raises(DeviceLimitError, match=named):
        Model(_dense_relu(), fuse=fuse, device=device, cache=False).run({"x": np.zeros((40, 24), np.float32)})


def test_run_leaves_out_a_disabled_rule(tmp_path, capsys):
    # DeBERTa's masked scores: without the rule that takes Where(b, float32 min, .) into the bias the attention reads,
    # the scores, mask, softmax and product stay apart; the outputs agree with torch's either way
    fixture = Path(__file__).resolve().parent.parent / "data" / "exported"
    npz = fixture / "deberta_tiny.npz"
    want = np.load(npz)["output.last_hidden_state"]
    base = ["run", str(fixture / "deberta_tiny.dynamo.onnx"), "--input", f"input_ids={npz}", "--input",
            f"attention_mask={npz}", "--repeats", "0", "--json", "--no-cache", "--save"]
    rules = [f"Softmax(Where(b, c, Add({s}))) -> Softmax(Add(S, Where(b, c, m)))   (S = AttentionScores(q, k), c <= "
             "MASKED_BELOW)" for s in ("S, m", "m, S")]
    rule = rules[0]
    counts = []
    for i, extra in enumerate(([], ["--disable-rule", rules[0], "--disable-rule", rules[1]])):
        assert main([*base, str(tmp_path / f"{i}.npz"), *extra]) == 0
        counts.append(json.loads(capsys.readouterr().out)["dispatches_fused"])
        got = np.load(tmp_path / f"{i}.npz")["last_hidden_state"]
        assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()
    assert counts[0] == 37 < counts[1], counts
    assert main(["run", str(fixture / "deberta_tiny.dynamo.onnx"), "--disable-rule", "no such rule"]) == 2
    assert "unknown rule 'no such rule'" in capsys.readouterr().err
    assert main(["run", str(fixture / "deberta_tiny.dynamo.onnx"), "--no-fuse", "--disable-rule", rule]) == 2
    assert "--disable-rule leaves a rule out of the rewrite engine, which --no-fuse leaves out" in \
        capsys.readouterr().err


def test_a_device_that_is_not_a_wgpu_device_is_refused():
    with pytest.raises(InputError, match=r"device must be a wgpu device .* got str 'cuda'"):
        Model(_dense_relu(), device="cuda").run({"x": np.zeros((40, 24), np.float32)})


def test_a_large_tile_of_known_values_is_read_as_a_broadcast(monkeypatch):
    # DeBERTa's exporters: each layer's position keys, computed from weights (folded at load time), repeated over
    # the batch by a Tile and transposed, multiplied by q's merged heads. Folded, the Tile's copies would be stored
    # (151 MB at DeBERTa-v3-small's 8 x 128 tokens); imported as a Tile, the product reads the keys themselves.
    import onnxruntime as ort

    import eggfuse.onnx.importer as importer
    from eggfuse.rewrites import optimize

    b, h, s, d, p, e = 3, 2, 5, 4, 6, 7
    rng = np.random.default_rng(0)
    inits = [("rel", rng.standard_normal((p, e)).astype(np.float32)),
             ("wk", rng.standard_normal((e, h * d)).astype(np.float32)),
             ("heads", np.array([p, h, d], np.int64)), ("reps", np.array([b, 1, 1], np.int64)),
             ("merged", np.array([b * h, s, d], np.int64))]
    m = model([node("MatMul", ["rel", "wk"], ["pk"]), node("Reshape", ["pk", "heads"], ["pk3"]),
               node("Transpose", ["pk3"], ["pkh"], perm=[1, 0, 2]),  # [H, P, D]
               node("Tile", ["pkh", "reps"], ["tiled"], name="repeat"),  # [B H, P, D]
               node("Transpose", ["tiled"], ["pkt"], perm=[0, 2, 1]),  # [B H, D, P]
               node("Reshape", ["q", "merged"], ["q3"]), node("MatMul", ["q3", "pkt"], ["y"])],
              [("q", F, [b, h, s, d])], [("y", F, None)], inits)
    q = rng.standard_normal((b, h, s, d)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"q": q})[0]
    folded_graph, folded = load(m)
    monkeypatch.setattr(importer, "LAZY_COPY_BYTES", 64)  # the keys' copies take b h p d 4 = 576 bytes
    graph, params = load(m)
    assert "Tile" in {n.op for n in graph.nodes} and "Tile" not in {n.op for n in folded_graph.nodes}
    assert sum(a.nbytes for a in params.values()) == h * p * d * 4  # the keys once, not b times
    assert sum(a.nbytes for a in folded.values()) == b * h * p * d * 4
    opt, rep = optimize(graph)
    assert {"Tile", "Expand"}.isdisjoint(n.op for n in opt.nodes), rep.rules_fired
    assert rep.dispatches_after == optimize(folded_graph)[1].dispatches_after
    np.testing.assert_allclose(Model(m).run({"q": q})[0], want, rtol=1e-5, atol=1e-5)


def test_large_expanded_indices_of_a_gather_elements_are_read_broadcast(monkeypatch):
    # DeBERTa's relative position buckets [1, S, T], expanded over batch and heads for GatherElements: folded they
    # would be stored B H times (805 MB at 32 x 512 tokens); imported as an Expand, the gather reads the table once
    import onnxruntime as ort

    import eggfuse.onnx.importer as importer
    from eggfuse.rewrites import optimize

    n, s, p = 6, 5, 9
    rng = np.random.default_rng(1)
    buckets = rng.integers(-p, p, (1, s, s)).astype(np.int64)
    m = model([node("Expand", ["buckets", "shape"], ["idx"], name="expand"),
               node("GatherElements", ["x", "idx"], ["y"], name="gather", axis=-1),
               node("Expand", ["buckets", "shape"], ["idx2"], name="other_use"),  # also read otherwise: folded
               node("Cast", ["idx2"], ["z"], to=onnx.TensorProto.FLOAT)],
              [("x", F, [n, s, p])], [("y", F, None), ("z", F, None)],
              [("buckets", buckets), ("shape", np.array([n, s, s], np.int64))])
    x = rng.standard_normal((n, s, p)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    folded_graph, _ = load(m)
    monkeypatch.setattr(importer, "LAZY_COPY_BYTES", 64)  # the copies take n s s 4 = 600 bytes
    graph, _ = load(m)
    expands = [nd for nd in graph.nodes if nd.op == "Expand"]
    assert len(expands) == 1 and graph.node(expands[0].inputs[0]).type.shape == (1, s, s)  # the gather's only
    assert "Expand" not in {nd.op for nd in folded_graph.nodes}
    opt, rep = optimize(graph)
    assert "GatherElementsBroadcast" in {nd.op for nd in opt.nodes} and "Expand" not in {nd.op for nd in opt.nodes}
    assert rep.dispatches_after == optimize(folded_graph)[1].dispatches_after
    for got, ref in zip(Model(m).run({"x": x}), want, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_sparse_initializers_are_made_dense():
    # a valid model was refused ("input 'c' is computed by no earlier node"); indices as linear positions and as
    # [NNZ, rank] coordinates, against onnxruntime
    ort = pytest.importorskip("onnxruntime")
    m = model([node("Add", ["x", "c"], ["s"]), node("MatMul", ["s", "w"], ["y"])], [("x", F, [2, 3])],
              [("y", F, None)])
    m.graph.sparse_initializer.extend([
        helper.make_sparse_tensor(onnx.numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "c"),
                                  onnx.numpy_helper.from_array(np.array([1, 4], np.int64)), [2, 3]),
        helper.make_sparse_tensor(onnx.numpy_helper.from_array(np.array([1.5, -2.0, 3.0], np.float32), "w"),
                                  onnx.numpy_helper.from_array(np.array([[0, 1], [2, 0], [2, 3]], np.int64)), [3, 4])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Model(m, cache=False).run({"x": x})[0], want, rtol=1e-6)
    assert len(m.graph.sparse_initializer) == 2  # the model given is not modified
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    bad.graph.sparse_initializer[0].indices.CopyFrom(onnx.numpy_helper.from_array(np.array([1, 9], np.int64)))
    with pytest.raises(OnnxError, match=r"sparse initializer 'c' of dims \[2, 3\]: its indices \[2\] do not place"):
        Model(bad, cache=False)


def test_a_cast_of_a_float16_tensor_reads_its_float16_value():
    # y = x * x declared FLOAT16 is computed in float32; Cast(y, FLOAT) read the float32 value (90000 for
    # x = 300) while the output y gave inf: two outputs of one tensor disagreed
    from onnx import TensorProto

    m = model([node("Mul", ["x", "x"], ["y"]), node("Cast", ["y"], ["z"], to=TensorProto.FLOAT),
               node("Cast", ["y"], ["n"], to=TensorProto.INT64)],
              [("x", TensorProto.FLOAT16, [3])],
              [("y", TensorProto.FLOAT16, [3]), ("z", F, [3]), ("n", I64, [3])])
    x = np.array([3.1, 300.0, -2.7], np.float16)
    y, z, n = Model(m).run({"x": x})
    with np.errstate(over="ignore"):  # 90000 is beyond float16's range: inf
        want = (x.astype(np.float32) * x.astype(np.float32)).astype(np.float16)  # IEEE: the product rounded once
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(z, want.astype(np.float32))  # [9.609375, inf, 7.2890625]
    assert n[0] == 9 and n[2] == 7


def test_a_nodes_error_names_the_sizes_and_values_the_caller_chose():
    # A MaxPool window larger than the image the feed gives, on the If branch a fed flag picks: the error names
    # the node and, since the model leaves the image's size to the caller, the sizes and values it was given
    pool = helper.make_graph([node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3])], "pool", [],
                             [helper.make_tensor_value_info("p", F, None)])
    same = helper.make_graph([node("Identity", ["x"], ["i"])], "same", [],
                             [helper.make_tensor_value_info("i", F, None)])
    m = Model(model([node("If", ["c"], ["y"], then_branch=pool, else_branch=same)],
                    [("x", F, [1, 2, "h", "w"]), ("c", B, [])], [("y", F, None)]))
    x = np.ones((1, 2, 2, 5), np.float32)
    with pytest.raises(OnnxError, match=r"MaxPool node .*window of \[3, 3\].* \(imported for the model's inputs "
                                        r"shaped 'x' \[1, 2, 2, 5\] \(declared \[1, 2, h, w\]\); the input values "
                                        r"'c' = True; where the model does not take these, give the sizes or values "
                                        r"it was made for\)"):
        m.run({"x": x, "c": np.array(True)})
    assert np.array_equal(m.run({"x": x, "c": np.array(False)})[0], x)
    fixed = Model(model([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3])], [("x", F, [1, 2, 2, 5])],
                        [("y", F, None)]))
    with pytest.raises(OnnxError, match=r"window of \[3, 3\]") as e:  # the model fixes the sizes: nothing to add
        fixed.run({"x": x})
    assert "imported for" not in str(e.value)
    # an error that names no shape (an attribute) gets no note; an input without a shape is "of any shape"
    free = model([node("Relu", ["x"], ["y"], bogus=1)], [("x", F, None)], [("y", F, None)])
    with pytest.raises(OnnxError, match=r"bogus") as e:
        Model(free).run({"x": x})
    assert "imported for" not in str(e.value)
    pool = model([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3])], [("x", F, None)], [("y", F, None)])
    with pytest.raises(OnnxError, match=r"window .*\(imported for the model's inputs shaped 'x' \[1, 2, 2, 5\] "
                                        r"\(declared of any shape\); where"):
        Model(pool).run({"x": x})


def test_run_verify_refuses_an_unsound_rule_of_ones_own(tmp_path, capsys, monkeypatch):
    # `eggfuse run --with-ruleset mod:NAME --verify`: Relu(x) -> x changes the numbers; without --verify the run
    # would print them, with it the run stops with the output that differs
    (tmp_path / "unsound_rules.py").write_text(
        "from eggfuse.rewrites import make_ruleset\n\n\n"
        "def drop_relu(e):\n"
        "    x = e.var('x')\n"
        "    yield e.equal('Relu(x) -> x', e.Relu(x), x)\n\n\n"
        "BAD = make_ruleset('drop_relu', drop_relu)\n")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mlp.onnx"
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    onnx.save(model([node("MatMul", ["x", "w"], ["m"]), node("Relu", ["m"], ["y"])], [("x", F, [4, 8])],
                    [("y", F, [4, 16])], [("w", w)]), path)
    args = ["run", str(path), "--repeats", "0", "--no-cache", "--with-ruleset", "unsound_rules:BAD"]
    assert main([*args, "--verify"]) == 2
    err = capsys.readouterr().err
    assert "differs after optimisation" in err and "Relu" in err and "drawn at random" not in err, err
    assert main(args[:4] + ["--verify"]) == 0  # the shipped rules pass
    capsys.readouterr()
    assert main([*args[:4], "--verify", "--no-fuse"]) == 2
    assert "--verify compares the rewrite engine's graph with the unfused one" in capsys.readouterr().err


@pytest.mark.parametrize("made, says", [
    (node("ReduceMean", ["x"], ["y"], "rm", axes=-1),
     "ReduceMean node 'rm': attribute 'axes' is stored as INT, where ReduceMean (opset 17) takes INTS (a list)"),
    (node("Concat", ["x", "x"], ["y"], "cc", axis="1"), "Concat node 'cc': attribute 'axis' is stored as STRING"),
    (node("Softmax", ["x"], ["y"], "sm", axis=1.0), "attribute 'axis' is stored as FLOAT, where Softmax"),
    (node("LeakyRelu", ["x"], ["y"], "lr", alpha="0.1"), "attribute 'alpha' is stored as STRING, where LeakyRelu"),
    (node("ReduceSum", ["x"], ["y"], "rs", axes=[1]),
     "ReduceSum node 'rs': attribute 'axes' is not one of ReduceSum's at opset 17 (its attributes: keepdims, "
     "noop_with_empty_axes)"),
], ids=["int-for-ints", "string-for-int", "float-for-int", "string-for-float", "not-in-schema"])
def test_an_attribute_of_another_type_than_the_schemas_is_refused(made, says):
    # onnxruntime refuses these when it loads the model; an attribute read as the wrong type was a bare TypeError
    # or, worse, taken
    m = model([made], [("x", F, [2, 3])], [("y", F, None)])
    with pytest.raises(OnnxError, match=re.escape(says)):
        Model(m, cache=False).run({"x": np.ones((2, 3), np.float32)})


def test_a_name_that_is_not_utf8_text_is_a_damaged_file(tmp_path):
    # protobuf hands back a string field of bytes that are no UTF-8 as bytes: a damaged file, said so
    m = model([node("Relu", ["x"], ["y"], "relu")], [("x", F, [2])], [("y", F, [2])])
    raw = m.SerializeToString().replace(b"relu", b"r\xffl\xfe")
    path = tmp_path / "damaged.onnx"
    path.write_bytes(raw)
    with pytest.raises(DamagedFileError, match="not UTF-8 text: the file is damaged"):
        load(path)


def test_a_sequence_output_of_an_op_without_a_converter_lists_the_op():
    seq = helper.make_tensor_sequence_value_info("y", F, None)
    g = helper.make_graph([node("SplitToSequence", ["x"], ["y"], "sts")], "g",
                          [helper.make_tensor_value_info("x", F, [4])], [seq])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpsError, match=re.escape(
            "the model uses op types eggfuse cannot run: SplitToSequence x1 (first: 'sts'); and graph output 'y' is "
            "a sequence, not a tensor, made by SplitToSequence node 'sts'")):
        Model(m)


def test_an_attribute_of_a_reserved_name_is_left_alone():
    # ONNX reserves names beginning with "__" (hints); its checker and onnxruntime let them pass, and so does eggfuse
    m = model([node("Relu", ["x"], ["y"], "relu", __hint=1)], [("x", F, [2, 3])], [("y", F, [2, 3])])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(Model(m, cache=False).run({"x": x})[0], np.maximum(x, 0))
