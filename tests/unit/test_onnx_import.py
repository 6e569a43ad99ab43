"""eggfuse.onnx.load: inputs, initializers, folding, refusals (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_models import I64, F, model, node  # tests/onnx_models.py

from eggfuse.ir import DamagedFileError, DType, Graph, OnnxError, UnsupportedOpsError, evaluate
from eggfuse.onnx import Model, load


def test_inputs_and_initializers_keep_their_names_and_shape_arithmetic_folds():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model([node("Shape", ["x"], ["s"]), node("Identity", ["w"], ["y"]), node("Identity", ["s"], ["z"])],
              [("x", F, [4, 5])], [("y", F, None), ("z", I64, None)], [("w", w)])
    g, params = load(m)
    assert g.inputs == {"x": g.node(0).type} and g.node(0).type.shape == (4, 5)
    assert list(params) == ["w"] and np.array_equal(params["w"], w)
    outs = [g.node(o) for o in g.outputs]
    assert outs[0].op == "Parameter" and outs[1].op == "Constant" and outs[1].type.dtype is DType.I32
    got = evaluate(g, {"x": np.zeros((4, 5))}, params)
    assert np.array_equal(got[0], w) and list(got[1]) == [4, 5]


def test_a_scalar_initializer_is_a_scalar_constant_and_a_weight_a_parameter():
    # a one-element float initializer is baked (the rewrite rules read its value: ir.facts "value")
    s, w = np.array(2.5, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model([node("Identity", ["s"], ["y"]), node("Identity", ["w"], ["z"])], [("x", F, [2])],
              [("y", F, None), ("z", F, None)], [("s", s), ("w", w)])
    g, params = load(m)
    scalar, weight = (g.node(o) for o in g.outputs)
    assert scalar.op == "Constant" and scalar.type.shape == () and weight.op == "Parameter" and list(params) == ["w"]
    assert evaluate(g, {"x": np.zeros(2)}, params)[0] == 2.5


def test_symbolic_dimension_needs_a_shape_and_a_misspelt_name_gets_the_closest():
    m = model([node("Identity", ["x"], ["y"])], [("x", F, ["batch", 3])], [("y", F, None)])
    with pytest.raises(OnnxError, match=r"input 'x' has dimensions \['batch', 3\].*shapes=\{'x'"):
        load(m)
    g, _ = load(m, shapes={"x": [2, 3]})
    assert g.node(0).type.shape == (2, 3)
    with pytest.raises(OnnxError, match=r"'xx' is not an input of the model \(did you mean 'x'\?\)"):
        load(m, shapes={"xx": [2, 3]})
    with pytest.raises(OnnxError, match=r"input 'x' given \[2, 4\], but the model declares \['batch', 3\]"):
        load(m, shapes={"x": [2, 4]})


@pytest.mark.parametrize("given, says", [
    ("2x4", r"given '2x4'; a shape is a sequence of dimensions, every one a positive integer"),
    ([2.5, 4], r"given \[2.5, 4\]; .* positive integer .*: its dimension 0 is a float, 2.5"),
    ([True, 4], r"given \[True, 4\]; .* positive integer .*: its dimension 0 is a bool, True"),
    ([-1, 4], r"given \[-1, 4\]; .* positive integer .*: its dimension 0 is -1$"),
    ([2, 0], r"given \[2, 0\]; .*: its dimension 1 is 0; an empty input can only be known at load time"),
    ([2], r"given \[2\], but the model declares \['n', 4\]"),
    ([2, 4, 1], r"given \[2, 4, 1\], but the model declares \['n', 4\]"),
    (3, r"given 3; a shape is a sequence of dimensions"),
])
def test_shapes_must_be_positive_integers_of_the_inputs_rank(given, says):
    # "2x4" was int()'s ValueError, [2.5, 4] silently (2, 4), [-1, 4] "an empty tensor cannot be fed"
    m = model([node("Relu", ["x"], ["y"])], [("x", F, ["n", 4])], [("y", F, None)])
    for make in (lambda s: load(m, shapes=s), lambda s: Model(m, shapes=s)):
        with pytest.raises(OnnxError, match=r"^shapes: input 'x' " + says):
            make({"x": given})
    with pytest.raises(OnnxError, match=r"^shapes must be a mapping of input name -> shape.* got a list"):
        load(m, shapes=[("x", [2, 4])])
    with pytest.raises(OnnxError, match=r"^shapes: 'z' is not an input of the model; its inputs are: 'x'"):
        load(m, shapes={"z": [2, 4]})
    for fine in ([np.int64(2), 4], np.array([2, 4]), (2, 4)):  # numpy integers are integers
        assert load(m, shapes={"x": fine})[0].node(0).type.shape == (2, 4)
        assert Model(m, shapes={"x": fine}).shapes == {"x": (2, 4)}


def test_an_input_with_an_initializer_is_named_as_a_constant_weight():
    # it was "'w' is not an input of the model" though the model lists it as one
    m = model([node("Add", ["x", "w"], ["y"])], [("x", F, [2, 4]), ("w", F, [4])], [("y", F, None)],
              [("w", np.ones(4, np.float32))])
    says = (r"'w' is an input of the model with a default value \(an initializer\), which eggfuse treats as a "
            r"constant weight, so it cannot be fed.*remove the initializer from the model")
    with pytest.raises(OnnxError, match=r"^shapes: " + says):
        load(m, shapes={"w": [4]})
    with pytest.raises(OnnxError, match=r"^" + says):
        load(m, values={"w": np.zeros(4, np.float32)})
    with pytest.raises(OnnxError, match=r"^shapes: " + says):
        Model(m, shapes={"w": [4]})


@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
def test_constant_indices_out_of_range_name_the_node_and_the_indices_at_load_time(op):
    # it was a LoweringError at compile time naming "node 0 (Constant 'const0', i32[1])" and neither
    idx = np.array([5], np.int64) if op == "Gather" else np.array([[5, 0, 0, 0]], np.int64)
    m = model([node(op, ["x", "idx"], ["y"], name="my_gather", axis=0)], [("x", F, [3, 4])], [("y", F, None)],
              [("idx", idx)])
    with pytest.raises(OnnxError, match=rf"^{op} node 'my_gather': its indices 'idx', known at load time .*hold 5, "
                                        r"out of range for axis 0 of \[3, 4\].*\[-3, 3\)"):
        load(m)


def test_a_named_dimension_has_one_size_across_the_inputs():
    # ONNX: a dim_param names one size in a graph; an input fed another (a mask shorter than the ids) is refused
    m = model([node("Add", ["x", "m"], ["y"])], [("x", F, ["batch", "seq"]), ("m", F, ["batch", "seq"])],
              [("y", F, None)])
    g, _ = load(m, shapes={"x": [2, 7], "m": [2, 7]})
    assert g.node(g.outputs[0]).type.shape == (2, 7)
    with pytest.raises(OnnxError, match=r"input 'm' \(shape \[2, 5\]\): its dimension 'seq' is 5, but 7 in input 'x'"):
        load(m, shapes={"x": [2, 7], "m": [2, 5]})
    # one input's shape sizes the other's named dimensions
    g, _ = load(m, shapes={"x": [3, 4]})
    assert g.node(g.outputs[0]).type.shape == (3, 4) and g.inputs["m"].shape == (3, 4)
    # not names of one size: paddle2onnx's '?' placeholder, and a name one input gives two sizes
    m = model([node("Identity", ["x"], ["y"]), node("Identity", ["z"], ["w"])],
              [("x", F, ["?", 3, "?"]), ("z", F, ["n", "n"])], [("y", F, None), ("w", F, None)])
    g, _ = load(m, shapes={"x": [1, 3, 48], "z": [2, 5]})
    assert [g.node(o).type.shape for o in g.outputs] == [(1, 3, 48), (2, 5)]


def test_a_shape_error_names_an_earlier_slice_that_onnx_clamped():
    # exporters slice a [1, P] buffer of position ids to the input's length; a longer input is
    # clamped to P by ONNX and fails only at the Add that meets the rows: the error says why
    table, pos = np.ones((4, 2), np.float32), np.arange(4, dtype=np.int64)[None]
    zero, one = np.array([0], np.int64), np.array([1], np.int64)
    for folded in (True, False):  # the Slice of a constant is folded at load time; of an input, imported
        nodes = [node("Shape", ["ids"], ["s"]), node("Gather", ["s", "one_"], ["n"]),
                 node("Slice", ["pos", "zero", "n", "one_"], ["p"]), node("Gather", ["table", "p"], ["pe"]),
                 node("Gather", ["table", "ids"], ["te"]), node("Add", ["te", "pe"], ["y"], name="add")]
        inputs = [("ids", I64, [1, "seq"])] + ([] if folded else [("pos", I64, [1, 4])])
        inits = [("table", table), ("zero", zero), ("one_", one)] + ([("pos", pos)] if folded else [])
        m = model(nodes, inputs, [("y", F, None)], inits)
        shapes = {"ids": [1, 3]} | ({} if folded else {"pos": [1, 4]})
        load(m, shapes=shapes)  # within the table: no note
        with pytest.raises(OnnxError, match=r"Add node 'add': .*do not broadcast.*\(earlier, Slice node .* asked for "
                                            r"rows up to 6 along axis 1 of \[1, 4\], and ONNX clamps that to 4: the "
                                            r"model takes at most 4 there"):
            load(m, shapes=shapes | {"ids": [1, 6]})
    # an error of another kind (an attribute) after a clamping Slice does not blame the Slice
    m = model([node("Slice", ["x", "zero", "eight"], ["y"], name="truncate"), node("Concat", ["y", "y"], ["z"])],
              [("x", F, [1, 6])], [("z", F, None)], [("zero", zero), ("eight", np.array([8], np.int64))])
    with pytest.raises(OnnxError, match="attribute axis is required") as e:
        load(m)
    assert "truncate" not in str(e.value)


def test_a_folded_gather_past_its_table_says_the_input_is_too_long():
    # GPT-2's exports gather the position table by arange(seq) folded at load time: a longer input indexes past it
    table = np.ones((4, 2), np.float32)
    nodes = [node("Shape", ["ids"], ["s"]), node("Gather", ["s", "one_"], ["n"]),
             node("Range", ["zero", "n", "one_"], ["r"]), node("Gather", ["table", "r"], ["pe"], name="positions")]
    m = model(nodes, [("ids", I64, [1, "seq"])], [("pe", F, None)],
              [("table", table), ("zero", np.array(0, np.int64)), ("one_", np.array(1, np.int64))])
    load(m, shapes={"ids": [1, 4]})
    with pytest.raises(OnnxError, match=r"Gather node 'positions': index 4 is out of range for axis 0 of \[4, 2\] "
                                        r".* the model takes at most 4 there .* give a shorter input"):
        load(m, shapes={"ids": [1, 5]})


def test_every_unsupported_op_is_listed_at_once_with_counts_and_first_nodes():
    m = model([node("FancyOp", ["x"], ["a"], name="f1", domain="com.example"), node("Identity", ["a"], ["b"]),
               node("NoSuchOp", ["b"], ["c"], name="n1"), node("NoSuchOp", ["c"], ["d"], name="n2")],
              [("x", F, [2])], [("d", F, None)])
    with pytest.raises(UnsupportedOpsError) as e:
        load(m)
    assert e.value.ops == {"com.example.FancyOp": (1, "f1"), "NoSuchOp": (2, "n1")}
    assert "NoSuchOp x2 (first: 'n1')" in str(e.value) and "com.example.FancyOp x1 (first: 'f1')" in str(e.value)


def test_an_unsupported_op_inside_an_expanded_function_blocks_what_follows():
    from onnx import helper

    fn = helper.make_function("local", "Wrap", ["a"], ["y"], [helper.make_node("NoSuchOp", ["a"], ["y"])],
                              [helper.make_opsetid("", 17)])
    m = model([helper.make_node("Wrap", ["x"], ["w"], domain="local"), node("Mul", ["w", "x"], ["z"])],
              [("x", F, [2])], [("z", F, None)])
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.functions.append(fn)
    with pytest.raises(UnsupportedOpsError) as e:
        load(m)
    assert set(e.value.ops) == {"NoSuchOp"}


def test_int64_values_outside_int32_are_refused_naming_the_tensor():
    big = np.array([2**40], dtype=np.int64)
    m = model([node("Identity", ["k"], ["y"])], [("x", F, [1])], [("y", I64, None)], [("k", big)])  # Identity: k itself
    with pytest.raises(OnnxError, match=r"tensor 'k' \(INT64\) holds 1099511627776\.\.1099511627776, outside"):
        load(m)


def test_unsupported_element_types_and_opsets_are_refused():
    m = model([node("Identity", ["x"], ["y"])], [("x", 2, [2])], [("y", 2, None)])  # UINT8
    with pytest.raises(OnnxError, match=r"input 'x' has element type UINT8"):
        load(m)
    double = model([node("Identity", ["x"], ["y"])], [("x", 11, [2])], [("y", 11, None)])  # computed in float32
    g, _ = load(double)
    assert g.node(g.outputs[0]).type.dtype.name == "F32"
    old = model([node("Identity", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], opset=6)
    before = old.SerializeToString()
    g, _ = load(old)  # upgraded to opset 7 by onnx's version converter, on a copy
    assert g.node(g.outputs[0]).op == "Input" and old.SerializeToString() == before
    # a model the converter cannot upgrade (an Add given one input)
    bad = model([node("Add", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], opset=6)
    with pytest.raises(OnnxError, match=r"opset is 6; eggfuse imports opset 7 and later, and onnx's version converter"):
        load(bad)
    with pytest.raises(OnnxError, match=r"no ONNX file at"):
        load("/no/such/model.onnx")


def test_onnx_index_readers_are_the_gathers_of_its_rows_through_views_casts_and_moves():
    from eggfuse.onnx.importer import onnx_index_readers

    i64 = onnx.TensorProto.INT64
    m = model([node("Cast", ["ids"], ["ids32"], name="", to=onnx.TensorProto.INT32),
               node("Unsqueeze", ["ids32", "zero"], ["u"], name="unsq"),
               node("Gather", ["table", "u"], ["a"], name="emb"),  # 5 rows: listed
               node("Gather", ["big", "ids"], ["b"], name="other_table"),  # 100 rows: another axis's bound
               node("Gather", ["ids", "zero"], ["c"], name="data_read"),  # ids as data
               node("Expand", ["ids", "shape"], ["e"], name="copies"),  # copies ids' elements: followed
               node("Gather", ["table", "e"], ["d"], name="through_expand"),
               node("GatherElements", ["t2", "ids2"], ["f"], name="ge")],  # clamps, is not bounded
              [("ids", i64, [3]), ("ids2", i64, [3])], [("a", F, None)],
              [("table", np.ones((5, 2), np.float32)), ("big", np.ones((100, 2), np.float32)),
               ("t2", np.ones(3, np.float32)), ("zero", np.array([0], np.int64)), ("shape", np.array([3], np.int64))])
    m.graph.node[0].name = ""  # named by its output in messages
    assert onnx_index_readers(m.graph, "ids", 5) == ["'emb' (Gather)", "'through_expand' (Gather)"]
    assert onnx_index_readers(m.graph, "ids", 100) == ["'other_table' (Gather)"]
    assert onnx_index_readers(m.graph, "ids2", 3) == []


def test_lazy_copies_are_those_read_as_broadcasts_of_run_time_products_and_gathers():
    from eggfuse.onnx.importer import lazy_copies

    m = model([node("Tile", ["w", "reps"], ["t_mm"]), node("Transpose", ["t_mm"], ["tt"], perm=[0, 2, 1]),
               node("MatMul", ["x", "tt"], ["y1"]),  # through a Transpose into a run-time product's B: lazy
               node("Tile", ["w", "reps"], ["t_known"]), node("MatMul", ["w2", "t_known"], ["y2"]),  # A known
               node("Tile", ["w", "reps"], ["t_add"]), node("Add", ["t_add", "x"], ["y3"]),  # not a product
               node("Tile", ["w", "reps"], ["t_out"]), node("MatMul", ["x", "t_out"], ["y4"]),  # a graph output
               node("Expand", ["idx", "shape"], ["e_rt"]), node("GatherElements", ["x", "e_rt"], ["y5"]),
               node("Expand", ["idx", "shape"], ["e_known"]), node("GatherElements", ["w", "e_known"], ["y6"]),
               node("Shape", ["x"], ["sx"]), node("Expand", ["idx", "sx"], ["e_shape"]),
               node("GatherElements", ["sx_data", "e_shape"], ["y7"])],  # data known: x's shape only
              [("x", F, [6, 4, 5]), ("sx_data", F, [6, 4, 5])],
              [("y1", F, None), ("t_out", F, None), ("y5", F, None), ("y6", F, None)],
              [("w", np.ones((2, 4, 5), np.float32)), ("w2", np.ones((6, 4, 4), np.float32)),
               ("reps", np.array([3, 1, 1], np.int64)), ("idx", np.zeros((1, 4, 5), np.int64)),
               ("shape", np.array([6, 4, 5], np.int64))])
    assert lazy_copies(m.graph, {"x", "sx_data"}) == {"t_mm", "e_rt", "e_shape"}
    assert lazy_copies(m.graph, {"x"}) == {"t_mm", "e_rt"}  # sx_data given at load time (Model's values)


def test_a_gather_elements_of_known_values_folds_as_onnx_defines_it():
    # indices smaller than the data off the axis, and more than 64 along it (onnx's reference evaluator refuses both)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 70)).astype(np.float32)
    idx = rng.integers(-70, 70, (2, 80)).astype(np.int64)
    m = model([node("GatherElements", ["data", "idx"], ["g"], axis=1), node("Add", ["g", "x"], ["y"])],
              [("x", F, [2, 80])], [("y", F, None)], [("data", data), ("idx", idx)])
    g, params = load(m)
    folded = next(a for a in params.values() if a.shape == (2, 80))
    np.testing.assert_array_equal(folded, np.take_along_axis(data[:2], np.where(idx < 0, idx + 70, idx), axis=1))
    bad = model([node("GatherElements", ["data", "idx"], ["g"], name="ge", axis=1), node("Add", ["g", "x"], ["y"])],
                [("x", F, [2, 80])], [("y", F, None)], [("data", data), ("idx", np.full((2, 80), 70, np.int64))])
    with pytest.raises(OnnxError, match=r"GatherElements node 'ge': index 70 is out of range for axis 1 of \[3, 70\]"):
        load(bad)


def test_a_file_cut_short_of_its_opset_import_is_refused(tmp_path):
    # protobuf writes opset_import after the graph: a file missing its last bytes can lose it alone and still parse
    whole = model([node("Relu", ["x"], ["y"], name="act")], [("x", F, [2])], [("y", F, None)]).SerializeToString()
    def parses_without_opsets(data: bytes) -> bool:
        try:
            return not onnx.load_from_string(data).opset_import
        except Exception:  # noqa: BLE001 - protobuf's DecodeError for a cut inside a field
            return False

    cut = next(whole[:-k] for k in range(1, 16) if parses_without_opsets(whole[:-k]))
    path = tmp_path / "cut.onnx"
    path.write_bytes(cut)
    assert onnx.load(str(path)).graph.output  # the cut file parses
    with pytest.raises(OnnxError, match=r"cut.onnx' imports no opset of ONNX's default domain \(its opset_import "
                                        r"lists nothing\), yet its node 'act' is a Relu of that domain"):
        load(path)
    with pytest.raises(OnnxError, match=r"the model imports no opset"):
        load(onnx.load(str(path)))
    custom = onnx.load_from_string(whole)  # nodes of another domain only need no default opset
    custom.graph.node[0].domain = "com.example"
    del custom.opset_import[:]
    custom.opset_import.add(domain="com.example", version=1)
    with pytest.raises(UnsupportedOpsError):
        load(custom)
    # a default-domain node inside an If's branch, or inside a local function, needs the opset too
    branch = onnx.helper.make_graph([node("Relu", ["x"], ["r"], name="inner_act")], "then", [],
                                    [onnx.helper.make_tensor_value_info("r", F, None)])
    nested = model([node("If", ["c"], ["y"], name="choose", then_branch=branch, else_branch=branch)],
                   [("c", onnx.TensorProto.BOOL, []), ("x", F, [2])], [("y", F, None)])
    nested.graph.node[0].domain = "com.example"
    del nested.opset_import[:]
    with pytest.raises(OnnxError, match=r"imports no opset.* its node 'inner_act' is a Relu"):
        load(nested)
    # (a function's body takes the function's own default-domain opset where it imports one)
    for own in (False, True):
        fn = onnx.helper.make_function("local", "act_fn", ["a"], ["b"], [node("Relu", ["a"], ["b"], name="fn_act")],
                                       [onnx.helper.make_opsetid("", 17)] if own else [])
        calls = model([node("act_fn", ["x"], ["y"], name="call")], [("x", F, [2])], [("y", F, None)])
        calls.graph.node[0].domain = "local"
        calls.functions.append(fn)
        del calls.opset_import[:]
        calls.opset_import.add(domain="local", version=1)
        if own:
            assert load(calls) is not None
        else:
            with pytest.raises(OnnxError, match=r"imports no opset.* its node 'fn_act' is a Relu"):
                load(calls)


def test_a_known_if_is_inlined_and_an_input_dependent_one_refused():
    from onnx import helper

    out = helper.make_tensor_value_info
    then = helper.make_graph([node("Identity", ["x"], ["t"])], "then", [], [out("t", F, None)])
    other = helper.make_graph([node("Shape", ["x"], ["e"])], "else", [], [out("e", I64, None)])
    m = model([node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [("x", F, [3]), ("c", 9, [])], [("y", F, None)])
    g, _ = load(m, values={"c": np.array(True)})
    assert g.node(g.outputs[0]).op == "Input"
    with pytest.raises(OnnxError, match=r"If node .*condition 'c' depends on the graph's inputs"):
        load(m)


def test_values_given_at_load_time_are_checked_against_their_inputs():
    # they were cast to the input's type without a look (16000.5 for an int64 input ran as 16000, '1' as 1), and
    # None, a dict or [] raised a bare TypeError or IndexError
    m = model([node("Cast", ["n"], ["nf"], to=F), node("Add", ["x", "nf"], ["y"])],
              [("x", F, [3]), ("n", I64, [])], [("y", F, None)])
    g, _ = load(m, values={"n": 4})
    np.testing.assert_array_equal(evaluate(g, {"x": np.ones(3, np.float32)}, {})[0], [5.0, 5.0, 5.0])
    for bad, says in ((None, "got None"), ({}, "got dict {} .*array of object"), ("4", "got str '4'"),
                      (4.5, "got an array of float64; give it as int64"), (True, "got an array of bool"),
                      ([4, 5], r"got shape \[2\]"), (2**70, "got int 1180591620717411303424")):
        with pytest.raises(OnnxError, match=rf"values: input 'n' \(INT64 \[\]\): ({says})"):
            load(m, values={"n": bad})


def test_the_passed_model_is_not_modified():
    m = model([node("Shape", ["x"], ["s"])], [("x", F, [2, 3])], [("s", I64, None)])
    before = m.SerializeToString()
    load(m)
    assert m.SerializeToString() == before


def test_indices_computed_past_a_table_are_refused_at_those_shapes():
    # RoBERTa's position ids count the tokens that are not padding (CumSum) from padding_idx + 1: at 39 tokens they
    # can reach 40, past its 40 positions; ONNX refuses such an index and the kernels would clamp it
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "data" / "exported" / "roberta_tiny.dynamo.onnx"
    load(path, shapes={"input_ids": [1, 38], "attention_mask": [1, 38]})
    with pytest.raises(OnnxError, match=r"\(Add\): the indices it computes from the inputs reach 1\.\.40 at these "
                                        r"input shapes, past the 40 rows an op reads with them .* give shorter ones"):
        load(path, shapes={"input_ids": [2, 39], "attention_mask": [2, 39]})


def test_value_ranges_bound_what_the_shapes_bound_and_no_more():
    from eggfuse.ir.ranges import value_ranges

    g = Graph()
    ids = g.input("ids", [2, 5], DType.I32)
    kept = g.add_node("Cast", (g.add_node("Cast", (ids,), to="bool"),), to="i32")  # ids != 0
    counts = g.add_node("CumSum", (kept,), axis=1)
    shifted = g.add_node("Sub", (g.mul(counts, kept), g.constant(np.array(2, np.int32), shape=(), dtype=DType.I32)))
    chosen = g.add_node("Where", (g.input("c", [2, 5], DType.BOOL), shifted, ids))
    ranges = value_ranges(g)
    assert ranges[kept] == (0, 1) and ranges[counts] == (0, 5) and ranges[shifted] == (-2, 3)
    assert ids not in ranges and chosen not in ranges  # an input's values are not known, nor a choice of them


def test_an_empty_batch_names_the_empty_inputs():
    # an empty input is folded at load time; an exporter's Flatten of it then fails in numpy: the error says which
    # input was empty and what to do
    from eggfuse.onnx import Model

    m = model([node("Flatten", ["x"], ["y"], name="flat", axis=1), node("Relu", ["y"], ["z"])],
              [("x", F, ["batch", 3, 2])], [("z", F, None)])
    assert Model(m).run({"x": np.ones((2, 3, 2), np.float32)})[0].shape == (2, 6)
    with pytest.raises(OnnxError, match=r"Flatten node 'flat'.*The input\(s\) 'x' \[0, 3, 2\] have a dimension of "
                                        r"size 0 \(an empty batch or sequence\), the likely cause.*leave empty "):
        Model(m).run({"x": np.ones((0, 3, 2), np.float32)})


@pytest.mark.parametrize("op, data, attrs, folds", [
    ("GatherElements", np.zeros((2, 9), np.int64), {"axis": 1}, True),  # RoBERTa's token types: a zero buffer
    ("Gather", np.full((9, 3), 2.5, np.float32), {"axis": -2}, True),  # from a Constant node: no parameter
    ("GatherND", np.full((2, 9, 3), -1, np.int64), {"batch_dims": 1}, True),
    ("GatherElements", np.arange(18, dtype=np.int64).reshape(2, 9), {"axis": 1}, False),  # not uniform
    ("Gather", np.array([[0.0], [-0.0], [0.0]], np.float32), {"axis": 0}, False),  # -0.0 is not 0.0: 1 / y differs
    ("Gather", np.full((9, 3), 0.25, np.float32), {"axis": 0}, False),  # a float initializer: a parameter, kept
])
def test_a_gather_of_one_repeated_value_is_a_constant_of_the_output_shape(op, data, attrs, folds):
    import onnxruntime

    ids = np.array([[2, 0, 1, 1], [2, 2, 0, 1]], np.int64)
    index = "ids3" if op == "GatherND" else "ids"
    nodes = [node("Unsqueeze", ["ids", "minus1"], ["ids3"]), node(op, ["data", index], ["y"], **attrs)]
    initializers = [("minus1", np.array([-1], np.int64))]
    if data.dtype == np.float32 and folds:  # a known float that is no initializer
        nodes.insert(0, helper.make_node("Constant", [], ["data"], value=numpy_helper.from_array(data)))
    else:
        initializers.append(("data", data))
    m = model(nodes, [("ids", I64, [2, 4])], [("y", onnx_elem(data), None)], initializers)
    g, params = load(m)
    got = evaluate(g, {"ids": ids}, params)[0]
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"ids": ids})
    assert got.shape == want[0].shape and np.array_equal(got, want[0])
    gathers = [n for n in g.live_nodes() if n.op.startswith("Gather")]
    assert (not gathers and g.node(g.outputs[0]).op == "Constant") if folds else len(gathers) == 1
    assert ("data" in params) == (data.dtype == np.float32 and not folds and data.size == 27)


def test_a_uniform_gather_keeps_the_gathers_checks_and_a_small_tables_size():
    zeros = np.zeros((2, 9), np.int64)
    bad = model([node("GatherElements", ["data", "ids"], ["y"], axis=1)], [("ids", I64, [4])], [("y", I64, None)],
                [("data", zeros)])  # indices of another rank than the data's
    with pytest.raises(OnnxError, match="GatherElements"):
        load(bad)
    big = model([node("Gather", ["data", "ids"], ["y"])], [("ids", I64, [300, 300])], [("y", I64, None)],
                [("data", zeros)])  # a [2, 9] table gathered into [300, 300, 9]: a gather, not a 3 MB constant
    g, _ = load(big)
    assert [n.op for n in g.live_nodes() if n.op == "Gather"] == ["Gather"]


def onnx_elem(a: np.ndarray) -> int:
    return {np.dtype(np.int64): I64, np.dtype(np.float32): F}[a.dtype]


def test_a_damaged_tensor_is_an_onnx_error_naming_it():
    # an initializer's raw bytes 8 short of its [4, 2] floats, and a Constant node's value likewise
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    w.raw_data = w.raw_data[:-8]
    m = model([node("MatMul", ["x", "w"], ["y"])], [("x", F, [1, 4])], [("y", F, None)])
    m.graph.initializer.append(w)
    with pytest.raises(DamagedFileError, match=r"initializer 'w': its stored data does not match its declared type "
                                               r"FLOAT and shape \[4, 2\] .* the file is damaged"):
        load(m)
    c = numpy_helper.from_array(np.ones(3, np.float32))
    c.raw_data = c.raw_data[:-2]
    m = model([helper.make_node("Constant", [], ["c"], name="k", value=c), node("Add", ["x", "c"], ["y"])],
              [("x", F, [3])], [("y", F, None)])
    with pytest.raises(OnnxError, match=r"Constant node 'k' \(output 'c'\): its stored data does not match"):
        load(m)
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    w.data_type = 99  # no element type of ONNX's
    m = model([node("MatMul", ["x", "w"], ["y"])], [("x", F, [1, 4])], [("y", F, None)])
    m.graph.initializer.append(w)
    with pytest.raises(OnnxError, match="initializer 'w': its stored data does not match"):
        load(m)


def _tied(head_bt: np.ndarray, other_reader: bool = False) -> tuple:
    # an exporter's tied table: Gather(w, ids) for the embedding and MatMul(h, wt) for the LM head, wt = w^T stored
    # again (torch.onnx); ``other_reader``: wt is read by an Add of an input too
    w = np.arange(24, dtype=np.float32).reshape(6, 4) / 7
    nodes = [node("Gather", ["w", "ids"], ["h"]), node("MatMul", ["h", "wt"], ["y"])]
    inputs, outputs = [("ids", I64, [3])], [("y", F, None)]
    if other_reader:
        nodes.append(node("Add", ["wt", "x"], ["z"]))
        inputs.append(("x", F, [4, 6]))
        outputs.append(("z", F, None))
    return model(nodes, inputs, outputs, [("w", w), ("wt", head_bt)]), w


def test_a_tied_table_stored_twice_is_read_once_as_its_transpose():
    m, w = _tied(np.ascontiguousarray(np.arange(24, dtype=np.float32).reshape(6, 4).T / 7))
    g, params = load(m)
    assert list(params) == ["w"]  # wt is Transpose(w): one table
    assert [n.op for n in g.live_nodes()].count("Transpose") == 1
    ids = np.array([0, 5, 2], np.int64)
    (got,) = evaluate(g, {"ids": ids}, params)
    np.testing.assert_allclose(got, w[ids].astype(np.float64) @ w.T.astype(np.float64), rtol=1e-6)
    from eggfuse.rewrites import optimize

    opt, _ = optimize(g)
    assert "Transpose" not in [n.op for n in opt.live_nodes()]  # folded: the product reads w's rows (MatMulBT)


@pytest.mark.parametrize("case", ["one element differs", "read by another op too"])
def test_a_near_copy_or_a_copy_read_elsewhere_stays_a_parameter(case):
    wt = np.ascontiguousarray(np.arange(24, dtype=np.float32).reshape(6, 4).T / 7)
    if case == "one element differs":
        wt[3, 5] = np.nextafter(wt[3, 5], np.float32(np.inf))
    g, params = load(_tied(wt, other_reader=case == "read by another op too")[0])
    assert sorted(params) == ["w", "wt"] and "Transpose" not in [n.op for n in g.live_nodes()]


@pytest.mark.parametrize("tied", [True, False])
def test_a_weight_transposed_in_the_graph_for_a_matmul_is_not_copied_where_it_is_read_elsewhere(tied):
    # the dynamo exporter's tied head: Transpose(w) read by the head's MatMul, w also the embedding's table: a
    # Transpose of the one parameter (folded into the product by the rewrite). A weight only that Transpose reads
    # is folded at load time as before: one parameter either way
    w = np.arange(24, dtype=np.float32).reshape(6, 4) / 7
    nodes = [node("Transpose", ["w"], ["wt"], perm=[1, 0]), node("MatMul", ["x", "wt"], ["y"])]
    outputs = [("y", F, None)]
    if tied:
        nodes.append(node("Gather", ["w", "ids"], ["h"]))
        outputs.append(("h", F, None))
    g, params = load(model(nodes, [("x", F, [3, 4]), ("ids", I64, [3])], outputs, [("w", w)]))
    assert len(params) == 1 and next(iter(params.values())).shape == ((6, 4) if tied else (4, 6))
    assert ("Transpose" in [n.op for n in g.live_nodes()]) == tied
    x, ids = np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, 0, 5], np.int64)
    got = evaluate(g, {"x": x, "ids": ids}, params)
    np.testing.assert_allclose(got[0], x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-6)


def test_two_matmul_weights_that_merely_hold_transposed_values_stay_two_parameters():
    # identity initialisations: w2 = w1^T, both read only by MatMuls; tying them would make one parameter of
    # two (training would sum their gradients), so only a copy of a table another op reads is tied
    eye = np.eye(4, dtype=np.float32)
    m = model([node("MatMul", ["x", "w1"], ["h"]), node("MatMul", ["h", "w2"], ["y"])], [("x", F, [3, 4])],
              [("y", F, None)], [("w1", eye), ("w2", eye.copy())])
    g, params = load(m)
    assert sorted(params) == ["w1", "w2"] and "Transpose" not in [n.op for n in g.live_nodes()]


def test_external_data_comes_from_beside_the_file_and_a_proto_without_it_is_refused(tmp_path, monkeypatch):
    # a ModelProto loaded with load_external_data=False raised onnx's raw ValidationError, and onnx reads the
    # named file from the current folder: another model's file of that name there would have been read
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    m = model([node("MatMul", ["x", "W"], ["y"])], [("x", F, [2, 16])], [("y", F, None)], [("W", w)])
    (tmp_path / "m").mkdir()
    onnx.save(m, str(tmp_path / "m" / "mm.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="mm.data", size_threshold=0)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    graph, params = load(tmp_path / "m" / "mm.onnx")
    np.testing.assert_array_equal(params["W"], w)
    np.testing.assert_allclose(evaluate(graph, {"x": x}, params)[0], x @ w, rtol=1e-5)
    proto = onnx.load(str(tmp_path / "m" / "mm.onnx"), load_external_data=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.data").write_bytes(np.zeros(16 * 8, np.float32).tobytes())  # another file of that name
    with pytest.raises(OnnxError, match=r"initializer 'W': its data is in an external file \('mm.data'\) that was "
                                        r"not loaded: give the path of the .onnx file"):
        load(proto)


def test_a_gemm_with_alpha_and_beta_keeps_its_initializers_as_parameters():
    # alpha * B was folded at load time into a constant of the graph: W left params, the compile cache held
    # the weight, and --precision f16 never stored it as float16. A bias row C scaled by beta is folded still
    # (small, and so the product's bias epilogue); a C of the output's shape stays a parameter
    from eggfuse.rewrites import optimize

    rng = np.random.default_rng(6)
    w, c, x = (rng.standard_normal(s).astype(np.float32) for s in ((8, 13), (8,), (2, 13)))
    full = rng.standard_normal((2, 8)).astype(np.float32)
    for alpha, beta, bias in ((0.5, 2.0, c), (1.0, 1.0, c), (0.5, 2.0, full)):
        m = model([node("Gemm", ["x", "W", "C"], ["y"], transB=1, alpha=alpha, beta=beta)], [("x", F, [2, 13])],
                  [("y", F, None)], [("W", w), ("C", bias)])
        graph, params = load(m)
        assert sorted(params) == (["W"] if beta != 1.0 and bias.ndim == 1 else ["C", "W"])
        np.testing.assert_array_equal(params["W"], w)  # as in the file, not scaled
        (got,) = evaluate(graph, {"x": x}, params)
        np.testing.assert_allclose(got, alpha * (x @ w.T) + beta * bias, rtol=1e-5, atol=1e-6)
        assert not any(n.op == "Constant" and n.type.num_elements > 8 for n in graph.nodes)
        assert optimize(graph)[1].dispatches_after == 1  # the scaling and C fused into the product's store


def test_an_input_of_a_type_eggfuse_does_not_run_is_listed_with_the_op_types_it_cannot_run():
    # a STRING input stopped the import at once: the unsupported op types were never listed, and
    # eggfuse.onnx.Model.run blamed the strings fed for not being STRING
    from onnx import TensorProto

    m = model([node("StringNormalizer", ["s"], ["t"], name="sn"), node("Det", ["m"], ["d"], name="det1"),
               node("Relu", ["x"], ["y"])],
              [("x", F, [3]), ("s", TensorProto.STRING, [2]), ("m", F, [2, 3, 3])],
              [("y", F, None), ("t", TensorProto.STRING, None), ("d", F, None)])
    want = (r"op types eggfuse cannot run: Det x1 \(first: 'det1'\); StringNormalizer x1 \(first: 'sn'\); and "
            r"inputs of element types it does not run: 's' \(STRING\)")
    with pytest.raises(UnsupportedOpsError, match=want):
        load(m)
    with pytest.raises(UnsupportedOpsError, match=want):
        Model(m).run({"x": np.ones(3, np.float32), "s": np.array(["a", "b"]), "m": np.zeros((2, 3, 3), np.float32)})
    alone = model([node("Relu", ["x"], ["y"])], [("x", F, [3]), ("s", TensorProto.STRING, [2])], [("y", F, None)])
    with pytest.raises(OnnxError, match=r"input 's' has element type STRING, which eggfuse does not run"):
        load(alone)


def test_an_opset_newer_than_onnx_knows_is_refused_when_the_model_loads():
    m = model([node("Relu", ["x"], ["y"])], [("x", F, [3])], [("y", F, None)], opset=99)
    with pytest.raises(OnnxError, match=r"the model's opset is 99, newer than this onnx package knows"):
        Model(m)  # before any input is drawn or fed


def test_flipped_bytes_give_project_errors_only():
    # a damaged file: 400 copies of a hand-written LayerNorm model with one or two random bytes changed each load,
    # or fail with an eggfuse error (OnnxError, DamagedFileError, UnsupportedOpsError), never a bare Python error
    # (names of bytes that are no UTF-8 reached a str join and onnx's get_schema as bytes; an attribute of no type
    # reached a converter)
    from onnx import TensorProto, numpy_helper

    from eggfuse.ir import EggfuseError

    make = onnx.helper.make_node
    nodes = [make("ReduceMean", ["x"], ["m"], axes=[-1], name="rm1"), make("Sub", ["x", "m"], ["d"], name="sub"),
             make("Mul", ["d", "d"], ["d2"], name="sq"), make("ReduceMean", ["d2"], ["v"], axes=[-1], name="rm2"),
             make("Add", ["v", "eps"], ["ve"], name="add"), make("Sqrt", ["ve"], ["s"], name="sqrt"),
             make("Div", ["d", "s"], ["y"], name="div")]
    g = onnx.helper.make_graph(nodes, "ln", [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                               [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                               [numpy_helper.from_array(np.array(1e-5, np.float32), "eps")])
    raw = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    rng = np.random.default_rng(1)
    outcomes = set()
    for _ in range(400):
        b = bytearray(raw)
        for _ in range(rng.integers(1, 3)):
            b[rng.integers(0, len(b))] = rng.integers(0, 256)
        try:
            load(bytes(b))
            outcomes.add("loaded")
        except EggfuseError as e:
            outcomes.add(type(e).__name__)
    assert {"loaded", "OnnxError", "DamagedFileError"} <= outcomes, outcomes
