"""Converters for Compress, MaxUnpool, Col2Im, BatchNormalization in training mode, Dropout in
training mode with ratio 0, OptionalHasElement / OptionalGetElement of tensors, and the preview
domains (FlexAttention through its function body; Adagrad, Momentum and Adam): against
onnxruntime where it runs the op, else onnx's reference evaluator (an implementation
independent of eggfuse)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx_models import I64, B, F, model, node  # tests/onnx_models.py
from onnx_ort_check import check_against_ort, plan_ops  # tests/onnx_ort_check.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model

RNG = np.random.default_rng(21)
TRAINING = "ai.onnx.preview.training"


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check_against_reference(m, feeds, device, rtol=1e-5, atol=1e-6):
    want = ReferenceEvaluator(m).run(None, feeds)
    eg = Model(m, device=device)
    got = eg.run(feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return eg


@pytest.mark.parametrize("axis,cond", [(0, [0, 1, 1]), (1, [True, False]), (None, [0, 1, 0, 0, 1, 1])])
def test_compress_gathers_the_selected_indices(axis, cond, device):
    attrs = {} if axis is None else {"axis": axis}
    m = model([node("Compress", ["x", "c"], ["y"], **attrs)], [("x", F, [3, 2]), ("c", B, [len(cond)])],
              [("y", F, None)], opset=13)
    eg = check_against_ort(m, {"x": _f(3, 2), "c": np.array(cond, bool)}, device=device)
    assert "Gather" in plan_ops(eg)
    with pytest.raises(OnnxError, match=r"the condition selects nothing"):
        Model(m).run({"x": _f(3, 2), "c": np.zeros(len(cond), bool)})


@pytest.mark.parametrize("out_shape", [None, [1, 2, 5, 5]])
def test_max_unpool_puts_the_pooled_values_back(out_shape, device):
    x = _f(1, 2, 4, 4)
    pooled, idx = ReferenceEvaluator(model([node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])],
                                           [("x", F, [1, 2, 4, 4])], [("p", F, None), ("i", I64, None)])).run(
        None, {"x": x})
    inputs = ["p", "i"] + (["s"] if out_shape else [])
    inits = [("s", np.array(out_shape, np.int64))] if out_shape else []
    m = model([node("MaxUnpool", inputs, ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [("p", F, [1, 2, 2, 2]), ("i", I64, [1, 2, 2, 2])], [("y", F, None)], inits, opset=11)
    if out_shape is None:
        check_against_ort(m, {"p": pooled, "i": idx}, device=device)
    else:  # the indices address the unpooled [4, 4], zeros appended: onnx's reference and its backend test
        # (test_maxunpool_export_with_output_shape); onnxruntime reads them in the [5, 5] output instead
        check_against_reference(m, {"p": pooled, "i": idx}, device)


@pytest.mark.parametrize("image,block,attrs", [([5, 5], [2, 2], {}), ([5, 6], [2, 3], {"strides": [2, 1]}),
                                               ([6, 6], [3, 3], {"pads": [1, 1, 1, 1], "dilations": [2, 1]}),
                                               ([3, 4, 5], [2, 2, 2], {})])
def test_col2im_sums_the_blocks_into_the_image(image, block, attrs, device):
    strides = attrs.get("strides", [1] * len(image))
    pads = attrs.get("pads", [0] * 2 * len(image))
    dil = attrs.get("dilations", [1] * len(image))
    blocks = [(n + pads[i] + pads[i + len(image)] - dil[i] * (k - 1) - 1) // strides[i] + 1
              for i, (n, k) in enumerate(zip(image, block, strict=True))]
    shape = [2, 3 * int(np.prod(block)), int(np.prod(blocks))]
    m = model([node("Col2Im", ["x", "img", "blk"], ["y"], **attrs)], [("x", F, shape)], [("y", F, None)],
              [("img", np.array(image, np.int64)), ("blk", np.array(block, np.int64))], opset=18)
    eg = check_against_ort(m, {"x": _f(*shape)}, device=device)
    assert plan_ops(eg).count("ConvTranspose") == 1


def test_batch_norm_in_training_mode_uses_the_batchs_statistics(device):
    m = model([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                    momentum=0.8, epsilon=1e-3)],
              [("x", F, [4, 3, 5, 2])], [("y", F, None), ("rm", F, None), ("rv", F, None)],
              [("s", _f(3)), ("b", _f(3)), ("m", _f(3)), ("v", np.abs(_f(3)))], opset=15)
    check_against_reference(m, {"x": _f(4, 3, 5, 2)}, device)


def test_dropout_in_training_mode_runs_with_ratio_0_and_refuses_random_drops(device):
    m = model([node("Dropout", ["x", "r", "t"], ["y", "mask"], name="d")],
              [("x", F, [3, 4]), ("r", F, []), ("t", B, [])], [("y", F, None), ("mask", B, None)], opset=13)
    x = _f(3, 4)
    y, mask = Model(m, device=device).run({"x": x, "r": np.float32(0.0), "t": np.array(True)})
    assert np.array_equal(y, x) and mask.all() and mask.shape == (3, 4)
    with pytest.raises(OnnxError, match=r"Dropout node 'd': training_mode = true with ratio 0.5 drops random"):
        Model(m).run({"x": x, "r": np.float32(0.5), "t": np.array(True)})


def test_optional_of_a_tensor_has_it_and_no_input_has_none(device):
    m = model([node("OptionalHasElement", ["x"], ["h"]), node("OptionalHasElement", [""], ["n"]),
               node("OptionalGetElement", ["x"], ["g"]), node("Relu", ["g"], ["y"])],
              [("x", F, [4])], [("h", B, None), ("n", B, None), ("y", F, None)], opset=18)
    x = _f(4)
    h, n, y = Model(m, device=device).run({"x": x})
    assert h.dtype == bool and bool(h) and not bool(n)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_flex_attention_of_the_preview_domain_expands_into_its_function(device):
    m = model([helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview")],
              [("q", F, [1, 2, 3, 4]), ("k", F, [1, 2, 5, 4]), ("v", F, [1, 2, 5, 4])], [("y", F, None)], opset=26)
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview", 1))
    eg = check_against_reference(m, {"q": _f(1, 2, 3, 4), "k": _f(1, 2, 5, 4), "v": _f(1, 2, 5, 4)}, device)
    assert "Softmax" in " ".join(plan_ops(eg))


def _training(op, n_groups, **attrs):
    names = ["r", "t"] + [f"{g}{i}" for g in "xgvh"[:n_groups] for i in range(2)]
    outs = [f"o_{g}{i}" for g in "xvh"[:n_groups - 1] for i in range(2)]
    m = model([helper.make_node(op, names, outs, domain=TRAINING, **attrs)],
              [("r", F, []), ("t", I64, [])] + [(nm, F, [3]) for nm in names[2:]], [(o, F, None) for o in outs])
    m.opset_import.append(helper.make_opsetid(TRAINING, 1))
    return m, names


@pytest.mark.parametrize("op,groups,attrs", [
    ("Adagrad", 3, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}),
    ("Momentum", 3, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}),
    ("Momentum", 3, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.0}),
    ("Adam", 4, {"alpha": 0.8, "beta": 0.9, "epsilon": 1e-4, "norm_coefficient": 0.01, "norm_coefficient_post": 0.1}),
])
@pytest.mark.parametrize("t", [0, 3])
def test_the_preview_training_optimisers_update_every_tensor(op, groups, attrs, t, device):
    m, names = _training(op, groups, **attrs)
    feeds = {nm: (np.abs(_f(3)) if nm[0] in "vh" else _f(3)) for nm in names[2:]}
    feeds.update(r=np.float32(0.1), t=np.array(t, np.int64))
    check_against_reference(m, feeds, device)
