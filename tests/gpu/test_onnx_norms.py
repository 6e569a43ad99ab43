"""ONNX softmaxes and normalisations (eggfuse/onnx/ops/norms.py) through eggfuse.onnx.Model on
the GPU, against onnxruntime: Softmax / LogSoftmax / Hardmax before opset 13 (flattened at
axis) and after (one axis), LayerNormalization with its three outputs, RMSNormalization,
BatchNormalization (opsets 7, 9, 15), InstanceNormalization, GroupNormalization (opsets 18
and 21), LpNormalization, MeanVarianceNormalization, LRN; which IR ops they become (the
last-axis ops the rewrite rules know); the converters' refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import I64, F, model, node  # tests/onnx_models.py
from onnx_vs_ort import check, feed  # tests/onnx_vs_ort.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import load


def _ops(m) -> list[str]:
    g, _ = load(m)
    return [n.op for n in g.live_nodes() if n.op not in ("Input", "Parameter", "Constant", "Identity")]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmaxes_on_every_axis_and_opset(op, opset):
    for axis in (None, 0, 1, 2, -1, -3):
        attrs = {} if axis is None else {"axis": axis}
        m = model([node(op, ["x"], ["y"], **attrs)], [("x", F, [3, 4, 5])], [("y", F, None)], opset=opset)
        x = 3.0 * feed(F, [3, 4, 5])
        if op == "Hardmax":
            x[0, 1] = 2.0  # a tie along the last axis
        check(m, {"x": x})


def test_softmax_maps_to_the_last_axis_op_where_it_can():
    def one(opset, axis, shape=(3, 4, 5)):
        return _ops(model([node("Softmax", ["x"], ["y"], axis=axis)], [("x", F, list(shape))], [("y", F, None)],
                          opset=opset))

    assert one(13, -1) == ["Softmax"] and one(13, 1) == ["SoftmaxAxis"]
    assert one(11, 1) == ["Softmax"]  # opset 11 flattens [3, 4, 5] at 1 to [3, 20]: the last-axis op
    assert _ops(model([node("Hardmax", ["x"], ["y"], axis=1)], [("x", F, [3, 4, 5])], [("y", F, None)],
                      opset=11)) == ["Hardmax"]


def test_large_logits():
    x = np.array([[1e3, 999.0, 0.0, -1e3], [-80.0, -1e4, 88.0, 89.0]], dtype=np.float32)
    for op in ("Softmax", "LogSoftmax"):
        check(model([node(op, ["x"], ["y"], axis=0)], [("x", F, [2, 4])], [("y", F, None)], opset=13), {"x": x})


@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization_with_mean_and_inv_std_dev(bias):
    shape = [2, 3, 4, 5]
    for axis in (-1, 1, 0, 2):
        norm = shape[axis:]
        inits = [("w", feed(F, norm)), *([("b", feed(F, norm))] if bias else [])]
        m = model([node("LayerNormalization", ["x", "w", *(["b"] if bias else [])], ["y", "mean", "inv"], axis=axis,
                        epsilon=1e-3)], [("x", F, shape)], [("y", F, None), ("mean", F, None), ("inv", F, None)],
                  inits, opset=17)
        check(m, {"x": 10.0 + feed(F, shape)})  # far from zero: the variance is taken around the mean
        if axis == -1:
            assert _ops(m) == ["LayerNorm", "ReduceMean", "InvStdDev"]


def test_layer_normalization_scale_broadcast_over_the_normalised_axes():
    # Scale [1, 5] and B [5] against the normalised shape [4, 5]: BroadcastTo then the [n] view
    m = model([node("LayerNormalization", ["x", "w", "b"], ["y"], axis=2)], [("x", F, [2, 3, 4, 5])],
              [("y", F, None)], [("w", feed(F, [1, 5])), ("b", feed(F, [5]))], opset=17)
    from onnx.reference import ReferenceEvaluator  # onnxruntime wants Scale of the normalised shape

    (want,) = ReferenceEvaluator(m).run(None, {"x": (x := feed(F, [2, 3, 4, 5]))})
    check(m, {"x": x}, reference="onnx")
    assert np.isfinite(want).all()


def test_rms_normalization():
    shape = [2, 3, 4, 5]
    for axis in (-1, 1, 0):
        m = model([node("RMSNormalization", ["x", "w"], ["y"], axis=axis, epsilon=1e-4)], [("x", F, shape)],
                  [("y", F, None)], [("w", feed(F, shape[axis:]))], opset=23)
        check(m, {"x": feed(F, shape)})
        if axis == -1:
            assert _ops(m) == ["RmsNorm"]


@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batch_normalization(opset):
    for shape in ([4, 3], [2, 3, 5], [2, 3, 4, 5]):
        c = shape[1]
        stats = [("s", feed(F, [c])), ("b", feed(F, [c])), ("m", feed(F, [c])),
                 ("v", (np.abs(feed(F, [c])) + 0.5).astype(np.float32))]
        m = model([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)], [("x", F, shape)],
                  [("y", F, None)], stats, opset=opset)
        check(m, {"x": feed(F, shape)})


def test_batch_normalization_per_activation_before_opset_9():
    # opset 7, spatial = 0: statistics of shape [C, H, W], one per activation; onnxruntime has no
    # kernel for it, so the expected values are the formula's in numpy
    shape = [2, 3, 4, 5]
    s, b, mu = feed(F, shape[1:]), feed(F, shape[1:]), feed(F, shape[1:])
    var = (np.abs(feed(F, shape[1:])) + 0.5).astype(np.float32)
    m = model([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0)], [("x", F, shape)],
              [("y", F, None)], [("s", s), ("b", b), ("m", mu), ("v", var)], opset=7)
    from eggfuse.onnx import Model

    x = feed(F, shape)
    (got,) = Model(m).run({"x": x})
    np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5) * s + b, rtol=1e-5, atol=1e-5)


def test_instance_and_group_normalization():
    shape = [2, 6, 4, 5]
    m = model([node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], [("x", F, shape)],
              [("y", F, None)], [("s", feed(F, [6])), ("b", feed(F, [6]))], opset=17)
    check(m, {"x": feed(F, shape)})
    assert _ops(m) == ["GroupNorm"]
    for opset, per in ((18, 3), (21, 6)):  # opset 18: a scale per group; 21: per channel
        m = model([node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-3)], [("x", F, shape)],
                  [("y", F, None)], [("s", feed(F, [per])), ("b", feed(F, [per]))], opset=opset)
        check(m, {"x": feed(F, shape)}, reference="onnx" if opset == 18 else "ort")


def test_lp_mvn_and_lrn():
    shape = [2, 6, 4, 5]
    for axis, p in ((-1, 2), (1, 1), (0, 2)):
        check(model([node("LpNormalization", ["x"], ["y"], axis=axis, p=p)], [("x", F, shape)], [("y", F, None)],
                    opset=13), {"x": feed(F, shape)})
    for axes in (None, [1], [0, 1, 2, 3], [-1, -2]):
        attrs = {} if axes is None else {"axes": axes}
        check(model([node("MeanVarianceNormalization", ["x"], ["y"], **attrs)], [("x", F, shape)], [("y", F, None)],
                    opset=13), {"x": feed(F, shape)})
    for size, attrs in ((3, {}), (5, {"alpha": 0.01, "beta": 0.5, "bias": 2.0}), (1, {})):
        check(model([node("LRN", ["x"], ["y"], size=size, **attrs)], [("x", F, shape)], [("y", F, None)], opset=13),
              {"x": feed(F, shape)})


def test_lrn_of_an_even_size():
    # onnxruntime takes odd sizes only: the window of onnx's test generator (backend/test/case/node/lrn.py),
    # floor((size - 1) / 2) channels before and ceil((size - 1) / 2) after
    from eggfuse.onnx import Model

    x = feed(F, [2, 6, 3, 3])
    (got,) = Model(model([node("LRN", ["x"], ["y"], size=4, alpha=0.01)], [("x", F, [2, 6, 3, 3])], [("y", F, None)],
                         opset=13)).run({"x": x})
    sq = np.stack([(x[:, max(0, c - 1):min(6, c + 3)] ** 2).sum(axis=1) for c in range(6)], axis=1)
    np.testing.assert_allclose(got, x / (1.0 + 0.01 / 4 * sq) ** 0.75, rtol=1e-5, atol=1e-6)


def test_a_chain_of_norms():
    # LayerNormalization -> Softmax on axis 1 -> LRN -> MeanVarianceNormalization -> LogSoftmax (last axis)
    shape = [2, 6, 4, 5]
    nodes = [node("LayerNormalization", ["x", "w", "b"], ["ln"], axis=-1),
             node("Softmax", ["ln"], ["sm"], axis=1),
             node("LRN", ["sm"], ["lrn"], size=3),
             node("MeanVarianceNormalization", ["lrn"], ["mvn"]),
             node("LogSoftmax", ["mvn"], ["y"])]
    m = model(nodes, [("x", F, shape)], [("y", F, None)], [("w", feed(F, [5])), ("b", feed(F, [5]))], opset=17)
    check(m, {"x": feed(F, shape)})


# --- refusals ----------------------------------------------------------------------------------------


_X = [("x", F, [2, 6, 4, 5])]


@pytest.mark.parametrize(("nodes", "inits", "opset", "message"), [
    ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn", training_mode=1)],
     [(k, np.ones(6 if k != "s" else 5, np.float32)) for k in "sbmv"], 15,
     r"BatchNormalization node 'bn': scale 's' has shape \[5\]; it must be \[6\], one per channel"),
    ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn")],
     [(k, np.ones(6, np.float32)) for k in "sbmv"], 9, r"node 'bn': the outputs after Y .* training mode only"),
    ([node("LayerNormalization", ["x", "w"], ["y"], name="ln", stash_type=11)], [("w", np.ones(5, np.float32))], 17,
     r"LayerNormalization node 'ln': stash_type = 11 is not supported"),
    ([node("LayerNormalization", ["x", "w"], ["y"], name="ln")], [("w", np.ones(4, np.float32))], 17,
     r"node 'ln': Scale 'w' has shape \[4\], which does not broadcast to the normalised axes \[5\]"),
    ([node("LpNormalization", ["x"], ["y"], name="lp", p=3)], [], 13, r"LpNormalization node 'lp': p = 3"),
    ([node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=4)],
     [("s", np.ones(4, np.float32)), ("b", np.ones(4, np.float32))], 18,
     r"GroupNormalization node 'gn': num_groups = 4 must divide the 6 channels"),
    ([node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=3)],
     [("s", np.ones(3, np.float32)), ("b", np.ones(3, np.float32))], 21,
     r"node 'gn': scale 's' has shape \[3\]; opset 21 takes \[6\] \(one per channel\)"),
    ([node("InstanceNormalization", ["x", "s", "b"], ["y"], name="in")],
     [("s", np.ones(3, np.float32)), ("b", np.ones(6, np.float32))], 17, r"node 'in': scale 's' has shape \[3\]"),
    ([node("Softmax", ["x"], ["y"], name="sm", axis=4)], [], 13, r"Softmax node 'sm': axis 4 is out of range"),
    ([node("MeanVarianceNormalization", ["x"], ["y"], name="mvn", axes=[0, 5])], [], 13,
     r"node 'mvn': axis 5 is out of range"),
])
def test_refusals_name_the_node(nodes, inits, opset, message):
    with pytest.raises(OnnxError, match=message):
        load(model(nodes, _X, [("y", F, None)], inits, opset=opset))


def test_int64_input_of_a_float_op_is_refused():
    m = model([node("Softmax", ["x"], ["y"], name="sm")], [("x", I64, [2, 3])], [("y", F, None)], opset=13)
    with pytest.raises(OnnxError, match=r"Softmax node 'sm': its input 'x' is INT64; eggfuse runs this op on FLOAT"):
        load(m)
