"""The movement and indexing converters (eggfuse/onnx/ops/movement.py, indexing.py): each model
imported and evaluated by the numpy reference (eggfuse.ir.evaluate) against onnxruntime, across
the opset variants of attributes and inputs; the IR ops they choose; and their refusals. No GPU
needed (tests/gpu/test_onnx_movement.py runs the models on the device)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx_models import I64, F, model, node  # tests/onnx_models.py

from eggfuse.ir import OnnxError, evaluate
from eggfuse.onnx import load
from eggfuse.onnx.importer import NeedsValuesError

B, I32 = TensorProto.BOOL, TensorProto.INT32
RNG = np.random.default_rng(0)
_NP = {F: np.float32, I64: np.int64, I32: np.int32, B: np.bool_}


def _data(elem, shape):
    if elem == F:
        return RNG.standard_normal(shape).astype(np.float32)
    if elem == B:
        return RNG.integers(0, 2, shape).astype(bool)
    return RNG.integers(-9, 10, shape).astype(_NP[elem])


def _check(m, feeds, ops=None):
    """Our import's reference result equals onnxruntime's, dtype and all; ``ops``: IR ops expected."""
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g, params = load(m)
    got = evaluate(g, {k: v for k, v in feeds.items() if k in g.inputs}, params)
    for gv, wv in zip(got, want, strict=True):
        assert gv.shape == wv.shape
        np.testing.assert_allclose(gv.astype(np.float64), wv.astype(np.float64), rtol=1e-6, atol=1e-6)
    if ops is not None:
        assert {n.op for n in g.live_nodes()} - {"Input", "Parameter", "Constant"} == set(ops)
    return g


def _unary(op, shape, elem=F, opset=17, inits=(), extra=(), out_elem=None, **attrs):
    """A model of one node ``op`` on input x (``extra`` names more inputs, given as ``inits``)."""
    return model([node(op, ["x", *extra], ["y"], **attrs)], [("x", elem, shape)], [("y", out_elem or elem, None)],
                 inits, opset=opset)


# --- views ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,target,allowzero", [
    ([2, 3, 4], [0, -1], 0), ([2, 3, 4], [4, 0, 2], 0), ([2, 3, 4], [24], 0), ([2, 3, 4], [2, 3, 4], 1),
    ([1], [], 0), ([6], [-1, 1, 2], 0)])
def test_reshape_copies_zeros_infers_minus_one_and_is_a_view(shape, target, allowzero):
    m = _unary("Reshape", shape, I64, extra=["s"], inits=[("s", np.array(target, dtype=np.int64))],
               allowzero=allowzero)
    _check(m, {"x": _data(I64, shape)}, ops=set() if target == shape else {"Identity"})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    _check(_unary("Flatten", [2, 3, 4], axis=axis), {"x": _data(F, [2, 3, 4])})


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_and_unsqueeze_take_axes_as_attribute_before_opset_13_and_as_input_from_it(opset):
    axes = np.array([-1, 0], dtype=np.int64)
    as_attr = {"axes": [-1, 0]} if opset < 13 else {}
    extra, inits = ([], []) if opset < 13 else (["a"], [("a", axes)])
    sq = model([node("Squeeze", ["x", *extra], ["y"], **as_attr)], [("x", F, [1, 3, 1])], [("y", F, None)], inits,
               opset=opset)
    _check(sq, {"x": _data(F, [1, 3, 1])})
    un = model([node("Unsqueeze", ["x", *extra], ["y"], **as_attr)], [("x", B, [3, 2])], [("y", B, None)], inits,
               opset=opset)
    _check(un, {"x": _data(B, [3, 2])})
    everything = model([node("Squeeze", ["x"], ["y"])], [("x", F, [1, 1])], [("y", F, None)], opset=opset)
    g = _check(everything, {"x": _data(F, [1, 1])})
    assert g.node(g.outputs[0]).type.shape == ()


# --- strided copies ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,elem,perm,ops", [
    ([3, 5], F, None, {"Transpose"}), ([3, 5], I64, [1, 0], {"Permute"}), ([2, 3, 4, 5, 6], B, [4, 0, 3, 1, 2],
                                                                        {"Permute"}),
    ([2, 3], F, [0, 1], set())])
def test_transpose_keeps_the_seed_op_for_2d_f32_and_permutes_otherwise(shape, elem, perm, ops):
    attrs = {} if perm is None else {"perm": perm}
    _check(_unary("Transpose", shape, elem, **attrs), {"x": _data(elem, shape)}, ops=ops)


@pytest.mark.parametrize("elem", [F, I64, B])
def test_concat_any_axis_and_dtype_with_an_initializer_part(elem):
    w = _data(elem, [2, 1, 4])
    m = model([node("Concat", ["x", "w", "x"], ["y"], axis=-2)], [("x", elem, [2, 3, 4])], [("y", elem, None)],
              [("w", w)])
    _check(m, {"x": _data(elem, [2, 3, 4])}, ops={"Concat"})


@pytest.mark.parametrize("opset,how", [(11, "attr"), (13, "input"), (18, "num_outputs"), (13, "equal")])
def test_split_by_attribute_input_num_outputs_or_equal_parts(opset, how):
    outs = ["a", "b", "c"]
    attrs, extra, inits = {"axis": 1}, [], []
    if how == "attr":
        attrs["split"] = [1, 3, 3]
    elif how == "input":
        extra, inits = ["s"], [("s", np.array([2, 4, 1], dtype=np.int64))]
    elif how == "num_outputs":
        attrs["num_outputs"] = 3  # 7 = 3 + 3 + 1
    shape = [2, 7 if how != "equal" else 6, 3]
    m = model([node("Split", ["x", *extra], outs, **attrs)], [("x", F, shape)], [(o, F, None) for o in outs], inits,
              opset=opset)
    _check(m, {"x": _data(F, shape)}, ops={"Slice"})


def test_an_empty_split_part_is_known_and_a_concat_skips_it():
    # RotaryEmbedding's function splits off the unrotated rest, which is empty at full rotary_dim
    m = model([node("Split", ["x", "s"], ["a", "b"], axis=1), node("Concat", ["b", "a", "b"], ["y"], axis=1)],
              [("x", F, [2, 5])], [("y", F, None)], [("s", np.array([5, 0]))], opset=13)
    _check(m, {"x": _data(F, [2, 5])}, ops=set())


def test_slice_before_opset_10_takes_attributes():
    m = _unary("Slice", [5, 6, 7], opset=9, starts=[1, -4], ends=[4, 1000], axes=[0, 2])
    _check(m, {"x": _data(F, [5, 6, 7])}, ops={"Slice"})


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([-1, 0], [-2**63, 2**63 - 1], [1, 0], [-1, 2]), ([10], [-10], [-1], [-3]), ([0, 0, 0], [2, 2, 2], None, None),
    ([-100], [100], [0], [1])])
def test_slice_negative_indices_and_steps_clamp_as_onnx(starts, ends, axes, steps):
    inits = [("s", np.array(starts)), ("e", np.array(ends))]
    extra = ["s", "e"]
    if axes is not None:
        inits.append(("a", np.array(axes)))
        extra.append("a")
    if steps is not None:
        inits.append(("t", np.array(steps)))
        extra.append("t")
    m = _unary("Slice", [4, 5, 6], I32, extra=extra, inits=inits)
    g = _check(m, {"x": _data(I32, [4, 5, 6])})
    assert all(abs(v) <= 7 for n in g.nodes if n.op == "Slice" for v in n.attrs["starts"] + n.attrs["ends"])


def test_expand_tile_trilu_reverse_sequence():
    x = {"x": _data(F, [3, 1, 4])}
    _check(_unary("Expand", [3, 1, 4], extra=["s"], inits=[("s", np.array([2, 1, 5, 1]))]), x, ops={"Expand"})
    _check(_unary("Tile", [3, 1, 4], extra=["r"], inits=[("r", np.array([2, 3, 1]))]), x, ops={"Tile"})
    for upper in (0, 1):
        _check(_unary("Trilu", [3, 1, 4], extra=["k"], inits=[("k", np.array(-1))], upper=upper), x, ops={"Trilu"})
    m = model([node("ReverseSequence", ["x", "n"], ["y"], batch_axis=0, time_axis=1)],
              [("x", I64, [3, 5, 2]), ("n", I64, [3])], [("y", I64, None)])
    _check(m, {"x": _data(I64, [3, 5, 2]), "n": np.array([5, 1, 3])}, ops={"ReverseSequence"})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_across_opsets_axes_and_negative_pads(mode):
    x = {"x": _data(F, [4, 5])}
    value = {"value": 1.5} if mode == "constant" else {}
    old = _unary("Pad", [4, 5], opset=10, mode=mode, pads=[1, 2, 2, 1], **value)
    _check(old, x, ops={"Pad"})
    inits = [("p", np.array([2, 0, 1, 3])), ("v", np.array(-2.0, dtype=np.float32))]
    _check(_unary("Pad", [4, 5], extra=["p", "v"], inits=inits, mode=mode), x, ops={"Pad"})
    axes = [("p", np.array([1, 3])), ("v", np.array(7.0, dtype=np.float32)), ("a", np.array([-1]))]
    _check(_unary("Pad", [4, 5], opset=18, extra=["p", "v", "a"], inits=axes, mode=mode), x, ops={"Pad"})
    crop = [("p", np.array([-1, 2, 1, -2]))]  # crop one row in front, two columns at the end
    _check(_unary("Pad", [4, 5], extra=["p"], inits=crop, mode=mode), x, ops={"Slice", "Pad"})


def test_pad_of_int_and_bool_tensors_and_minus_infinity():
    for elem, value in ((I64, np.array(-7, dtype=np.int64)), (B, np.array(True))):
        m = _unary("Pad", [2, 3], elem, extra=["p", "v"], inits=[("p", np.array([0, 1, 2, 0])), ("v", value)])
        _check(m, {"x": _data(elem, [2, 3])})
    m = _unary("Pad", [2, 3], extra=["p", "v"], inits=[("p", np.array([1, 1, 1, 1])),
                                                       ("v", np.array(-np.inf, dtype=np.float32))])
    g, params = load(m)
    (got,) = evaluate(g, {"x": np.ones((2, 3), np.float32)}, params, check_finite=False)
    assert got[0, 0] == -np.inf and got[1, 1] == 1.0


# --- indexing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis,elem,ind", [(0, F, [[0, -1], [2, 1]]), (1, I64, [-3, 2]), (-1, B, 3)])
def test_gather_negative_indices_and_any_axis(axis, elem, ind):
    ind = np.array(ind, dtype=np.int64)
    m = model([node("Gather", ["x", "i"], ["y"], axis=axis)], [("x", elem, [3, 4, 5]), ("i", I64, list(ind.shape))],
              [("y", elem, None)])
    _check(m, {"x": _data(elem, [3, 4, 5]), "i": ind}, ops={"Gather"})


def test_gather_of_an_initializer_table_with_int32_indices():
    table = _data(F, [10, 4])
    m = model([node("Gather", ["w", "i"], ["y"])], [("i", I32, [2, 3])], [("y", F, None)], [("w", table)])
    _check(m, {"i": np.array([[0, 9, -1], [3, 3, -10]], dtype=np.int32)})


def test_gather_elements_and_gather_nd_batch_dims():
    m = model([node("GatherElements", ["x", "i"], ["y"], axis=1)], [("x", F, [3, 4]), ("i", I64, [2, 5])],
              [("y", F, None)])
    _check(m, {"x": _data(F, [3, 4]), "i": RNG.integers(-4, 4, (2, 5))}, ops={"GatherElements"})
    m = model([node("GatherND", ["x", "i"], ["y"], batch_dims=1)], [("x", I64, [2, 3, 4]), ("i", I64, [2, 2, 1])],
              [("y", I64, None)])
    _check(m, {"x": _data(I64, [2, 3, 4]), "i": np.array([[[2], [-1]], [[0], [1]]])}, ops={"GatherND"})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_and_scatter_nd_reductions(reduction):
    dup = reduction != "none"
    m = model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)],
              [("x", F, [3, 4]), ("i", I64, [2, 3]), ("u", F, [2, 3])], [("y", F, None)], opset=18)
    ind = np.array([[0, -1, 0 if dup else 2], [1, 2, 3]])
    _check(m, {"x": _data(F, [3, 4]), "i": ind, "u": _data(F, [2, 3])}, ops={"ScatterElements"})
    m = model([node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
              [("x", I64, [4, 3]), ("i", I64, [3, 1]), ("u", I64, [3, 3])], [("y", I64, None)], opset=18)
    ind = np.array([[1], [3], [1 if dup else 0]])
    _check(m, {"x": _data(I64, [4, 3]), "i": ind, "u": _data(I64, [3, 3])}, ops={"ScatterND"})


def test_deprecated_scatter_is_scatter_elements():
    m = model([node("Scatter", ["x", "i", "u"], ["y"], axis=0)],
              [("x", F, [3, 3]), ("i", I64, [1, 3]), ("u", F, [1, 3])], [("y", F, None)], opset=10)
    _check(m, {"x": _data(F, [3, 3]), "i": np.array([[2, 0, 1]]), "u": _data(F, [1, 3])}, ops={"ScatterElements"})


@pytest.mark.parametrize("axis,elem", [(-1, F), (0, I64), (1, F)])
def test_one_hot_with_negative_and_out_of_range_indices(axis, elem):
    # onnxruntime's kernels: int64 indices and depth with float values, or float everything
    depth = np.array(5, dtype=np.int64) if elem == I64 else np.array(5.0, dtype=np.float32)
    m = model([node("OneHot", ["i", "d", "v"], ["y"], axis=axis)], [("i", elem, [2, 3])], [("y", F, None)],
              [("d", depth), ("v", np.array([2, 7], dtype=np.float32))], opset=11)
    ind = np.array([[0, -1, 4], [7, -5, 2]]).astype(_NP[elem])
    _check(m, {"i": ind}, ops={"OneHot"})


# --- known at load time --------------------------------------------------------------------------


def test_eye_like_of_a_fed_input_is_known_at_load_time():
    m = _unary("EyeLike", [3, 5], I64, out_elem=F, k=1, dtype=F)
    g = _check(m, {"x": _data(I64, [3, 5])}, ops=set())
    assert g.node(g.outputs[0]).op == "Constant"


def test_constant_of_shape_and_range_of_fed_values_are_bound_at_load_time():
    m = model([node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.array([3]), "v"))],
              [("s", I64, [2])], [("y", I64, None)])
    with pytest.raises(NeedsValuesError, match=r"input 0 \('shape'\) must be known at load time.*'s'"):
        load(m)
    g, _ = load(m, values={"s": np.array([2, 3])})
    assert np.array_equal(evaluate(g, {}, {})[0], np.full((2, 3), 3))
    m = model([node("Range", ["a", "b", "c"], ["y"])], [("a", F, []), ("b", F, []), ("c", F, [])], [("y", F, None)])
    with pytest.raises(NeedsValuesError):
        load(m)


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("build,match", [
    (lambda: _unary("Reshape", [2, 3], extra=["s"], inits=[("s", np.array([4, -1]))]),
     r"Reshape node 'Reshape_y': cannot reshape \[2, 3\] to \[4, -1\]"),
    (lambda: _unary("Reshape", [2, 3], extra=["s"], inits=[("s", np.array([0, 3, 0]))], allowzero=1),
     r"makes an empty tensor"),
    (lambda: _unary("Squeeze", [2, 3], opset=11, axes=[1]), r"cannot squeeze axis 1 of shape \[2, 3\]"),
    (lambda: _unary("Pad", [2, 3], extra=["p"], inits=[("p", np.array([0, 1, 0, 1]))], mode="mirror"),
     r"attribute mode='mirror' is not supported"),
    (lambda: model([node("Split", ["x"], ["a", "b"], axis=1, split=[2, 2])], [("x", F, [2, 5])],
                   [("a", F, None), ("b", F, None)], opset=11),
     r"split sizes \[2, 2\] do not divide axis 1 of size 5 into 2 outputs"),
    (lambda: model([node("Split", ["x"], ["a", "b"], axis=1)], [("x", F, [2, 5])], [("a", F, None), ("b", F, None)]),
     r"axis 1 of size 5 does not split into 2 equal parts"),
    (lambda: _unary("Gather", [2, 3], extra=["i"], inits=[("i", np.array([0]))], axis=2),
     r"axis 2 is out of range for an input of rank 2"),
    (lambda: model([node("ScatterND", ["x", "i", "u"], ["y"], reduction="xor")],
                   [("x", F, [3]), ("i", I64, [1, 1]), ("u", F, [1])], [("y", F, None)], opset=18),
     r"attribute reduction='xor' is not supported"),
    (lambda: _unary("Slice", [3, 4], extra=["s", "e"], inits=[("s", np.array([3])), ("e", np.array([1]))]),
     r"Slice node 'Slice_y': along axis 0 of \[3, 4\] start 3, end 1 and step 1 select no elements"),
    # the empty axis named, not the harmless clamp of another axis's end (which advised a shorter input)
    (lambda: _unary("Slice", [2, 3, 4], extra=["s", "e", "a"], inits=[("s", np.array([1, -1])), ("e", np.array(
        [100, 0])), ("a", np.array([1, 2]))]), r"along axis 2 of \[2, 3, 4\] start -1, end 0 and step 1 select no "
                                               r"elements; eggfuse cannot store an empty tensor \(every dimension"),
])
def test_refusals_name_the_node_and_say_why(build, match):
    with pytest.raises(OnnxError, match=match):
        load(build())


def test_an_unsupported_op_inside_an_expanded_function_is_listed_not_blamed_on_the_next_converter():
    from onnx import helper

    from eggfuse.ir import UnsupportedOpsError

    body = helper.make_function("local", "Wrap", ["a"], ["b"], [node("FancyOp", ["a"], ["b"], domain="com.example")],
                                [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m = model([node("Wrap", ["x"], ["w"], domain="local"), node("Transpose", ["w"], ["y"], perm=[1, 0, 2])],
              [("x", F, [2, 3, 4])], [("y", F, None)])
    m.functions.append(body)
    m.opset_import.extend([helper.make_opsetid("local", 1), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpsError) as e:
        load(m)
    assert list(e.value.ops) == ["com.example.FancyOp"]
