"""ONNX models of the movement and indexing ops run by eggfuse.onnx.Model on the device, against
onnxruntime: chains of several ops at odd shapes, every dtype, opset variants, the ops ONNX
defines by a reshape and a transpose (DepthToSpace, SpaceToDepth) and values the import must know fed as inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx_models import I64, F, model, node  # tests/onnx_models.py

from eggfuse.onnx import Model

B = TensorProto.BOOL
RNG = np.random.default_rng(1)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m, feeds, fuse=True):
    got = Model(m, fuse=fuse).run(feeds)
    for g, w in zip(got, _ort(m, feeds), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


def _i64(name, values):
    return (name, np.array(values, dtype=np.int64))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_a_float_chain_of_movement_and_indexing_ops(fuse):
    nodes = [
        node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),                       # [2, 5, 7, 3]
        node("Slice", ["t", "s0", "s1", "s2", "s3"], ["s"]),                      # [2, 2, 7, 3]
        node("Pad", ["s", "pads"], ["p"], mode="reflect"),                        # [2, 2, 9, 6]
        node("Reshape", ["p", "shape"], ["r"]),                                   # [6, 36]
        node("Tile", ["w", "reps"], ["tw"]),                                      # [6, 4]
        node("Concat", ["r", "tw"], ["c"], axis=-1),                              # [6, 40]
        node("Gather", ["c", "idx"], ["g"], axis=1),                              # [6, 2, 3]
        node("ScatterElements", ["g", "si", "su"], ["sc"], axis=2, reduction="add"),
        node("Split", ["sc"], ["a", "b"], axis=0, num_outputs=2),                 # [3, 2, 3] each
        node("Expand", ["b", "eshape"], ["e"]),                                   # [2, 3, 2, 3]
    ]
    inits = [_i64("s0", [-1]), _i64("s1", [0]), _i64("s2", [1]), _i64("s3", [-2]),
             _i64("pads", [0, 0, 1, 2, 0, 0, 1, 1]), _i64("shape", [6, -1]),
             ("w", RNG.standard_normal((3, 2)).astype(np.float32)), _i64("reps", [2, 2]),
             _i64("si", np.array([[[0, 2, -1], [1, 1, 1]]] * 6)),
             ("su", RNG.standard_normal((6, 2, 3)).astype(np.float32)), _i64("eshape", [2, 1, 1, 1])]
    m = model(nodes, [("x", F, [2, 3, 5, 7]), ("idx", I64, [2, 3])], [("a", F, None), ("e", F, None)], inits, opset=18)
    feeds = {"x": RNG.standard_normal((2, 3, 5, 7)).astype(np.float32),
             "idx": np.array([[0, 39, -1], [20, 3, -40]], dtype=np.int64)}
    _check(m, feeds, fuse)


def test_int64_and_bool_chains_keep_their_types():
    nodes = [node("Unsqueeze", ["x", "ax"], ["u"]),                                 # [1, 4, 5]
             node("Expand", ["u", "es"], ["e"]),                                     # [3, 4, 5]
             node("Trilu", ["e", "k"], ["tr"], upper=0),
             node("GatherND", ["tr", "gi"], ["gn"], batch_dims=1),                   # [3, 2, 5]
             node("ScatterND", ["gn", "ni", "nu"], ["sn"], reduction="max"),
             node("Pad", ["m", "mp", "mv"], ["mpad"], mode="constant"),              # bool [4, 6]
             node("Transpose", ["mpad"], ["mt"]),
             node("ReverseSequence", ["mt", "lens"], ["rs"], batch_axis=1, time_axis=0)]
    inits = [_i64("ax", [0]), _i64("es", [3, 1, 1]), _i64("k", 1), _i64("gi", [[[1], [-1]], [[0], [2]], [[3], [3]]]),
             _i64("ni", [[0, 1], [0, 1], [2, 0]]), _i64("nu", RNG.integers(-20, 20, (3, 5))),
             _i64("mp", [1, 0, 0, 3]), ("mv", np.array(True))]
    m = model(nodes, [("x", I64, [4, 5]), ("m", B, [3, 3]), ("lens", I64, [4])],
              [("sn", I64, None), ("rs", B, None)], inits, opset=18)
    _check(m, {"x": RNG.integers(-50, 50, (4, 5)), "m": RNG.integers(0, 2, (3, 3)).astype(bool),
               "lens": np.array([6, 1, 3, 4])})


@pytest.mark.parametrize("op,mode,opset", [("DepthToSpace", "DCR", 13), ("DepthToSpace", "CRD", 17),
                                           ("SpaceToDepth", None, 13), ("SpaceToDepth", "CRD", 28)])
def test_depth_to_space_and_space_to_depth_are_one_permute_between_views(op, mode, opset):
    shape = [2, 8, 3, 5] if op == "DepthToSpace" else [2, 3, 6, 4]
    attrs = {"blocksize": 2, **({"mode": mode} if mode else {})}
    m = model([node(op, ["x"], ["y"], **attrs)], [("x", F, shape)], [("y", F, None)], opset=opset)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    if opset < 28:
        _check(m, feeds)
    else:  # SpaceToDepth's mode is new in opset 28, which onnxruntime does not run yet: onnx's reference
        from onnx.reference import ReferenceEvaluator

        np.testing.assert_array_equal(Model(m).run(feeds)[0], ReferenceEvaluator(m).run(None, feeds)[0])
    spec = Model(m).specialise(feeds)
    assert [n.op for n in spec.graph.live_nodes() if n.op not in ("Input", "Identity")] == ["Permute"]


def test_values_the_import_needs_may_be_fed_as_inputs():
    # Reshape's shape, Slice's starts and OneHot's depth fed at run time: bound at load time, one plan per value
    nodes = [node("Reshape", ["x", "shape"], ["r"]), node("Slice", ["r", "starts", "ends"], ["s"]),
             node("OneHot", ["idx", "depth", "vals"], ["o"], axis=0)]
    m = model(nodes, [("x", F, [4, 6]), ("shape", I64, [2]), ("starts", I64, [1]), ("ends", I64, [1]),
                      ("idx", I64, [3]), ("depth", I64, [])], [("s", F, None), ("o", F, None)],
              [("vals", np.array([0.0, 1.0], dtype=np.float32))], opset=11)
    eg = Model(m)
    for shape, depth in (([3, 8], 4), ([8, 3], 6)):
        feeds = {"x": RNG.standard_normal((4, 6)).astype(np.float32), "shape": np.array(shape), "starts": np.array([1]),
                 "ends": np.array([-1]), "idx": np.array([0, 3, -1]), "depth": np.array(depth)}
        for g, w in zip(eg.run(feeds), _ort(m, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    assert len(eg.plans) == 2
