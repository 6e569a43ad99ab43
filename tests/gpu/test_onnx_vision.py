"""The Conv, ConvTranspose, pooling, Resize and Upsample converters (eggfuse/onnx/ops/vision.py,
resize.py) against onnxruntime: auto_pad, output_shape, groups, dilations, 1 to 3 spatial
axes, MaxPool's Indices, the global pools, every Resize mode over the opset variants, and a
small network chaining them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import F, model, node  # tests/onnx_models.py
from onnx_ort_check import check_against_ort, plan_ops  # tests/onnx_ort_check.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import load

RNG = np.random.default_rng(5)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _one(op: str, x_shape, attrs: dict, inits=(), opset: int = 17, outputs=("y",), extra_inputs=()):
    names = ["x", *[n for n, _ in inits]]
    m = model([node(op, names, list(outputs), **attrs)], [("x", F, x_shape), *extra_inputs],
              [(o, F if o == "y" else TensorProto.INT64, None) for o in outputs], inits, opset=opset)
    return m


@pytest.mark.parametrize("x,w,bias,attrs", [
    ([1, 3, 9, 10], [8, 3, 3, 3], True, dict(strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2])),
    ([2, 6, 7, 9], [6, 1, 3, 3], True, dict(pads=[1, 1, 1, 1], group=6)),
    ([1, 8, 7, 9], [32, 4, 3, 2], False, dict(auto_pad="SAME_UPPER", group=2, strides=[2, 3])),
    ([1, 8, 7, 9], [32, 8, 2, 4], True, dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    ([1, 4, 7, 9], [5, 4, 3, 3], True, dict(auto_pad="VALID", strides=[2, 2])),
    ([1, 16, 12, 12], [24, 16, 1, 1], True, dict(kernel_shape=[1, 1])),
    ([1, 1, 576], [258, 1, 256], False, dict(strides=[128], pads=[0, 0])),  # silero's STFT-like 1-D conv
    ([2, 3, 17], [5, 3, 3], True, dict(strides=[2], pads=[1, 1])),
    ([1, 2, 5, 6, 7], [17, 2, 2, 3, 2], True, dict(strides=[1, 2, 1], pads=[1, 0, 1, 0, 1, 1], dilations=[2, 1, 1])),
])
def test_conv(x, w, bias, attrs, device):
    inits = [("w", _f(*w))] + ([("b", _f(w[0]))] if bias else [])
    check_against_ort(_one("Conv", x, attrs, inits), {"x": _f(*x)}, device=device)


@pytest.mark.parametrize("x,w,bias,attrs", [
    ([1, 24, 8, 8], [24, 24, 2, 2], True, dict(strides=[2, 2])),  # PP-OCR det's upsampling
    ([1, 24, 8, 8], [24, 1, 2, 2], True, dict(strides=[2, 2])),
    ([2, 4, 5, 6], [4, 5, 3, 3], True, dict(strides=[2, 3], pads=[1, 0, 1, 2], output_padding=[1, 1],
                                             dilations=[1, 2], group=2)),
    ([1, 3, 5, 5], [3, 2, 3, 3], False, dict(strides=[3, 2], output_shape=[16, 11])),
    ([1, 3, 5, 5], [3, 2, 3, 3], True, dict(strides=[2, 2], output_shape=[10, 10], output_padding=[1, 1])),
    ([1, 3, 5, 4], [3, 2, 3, 3], True, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ([1, 3, 5, 4], [3, 2, 3, 3], True, dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ([1, 3, 7], [3, 18, 3], True, dict(strides=[2], pads=[0, 1])),
    ([1, 2, 3, 4, 3], [2, 2, 2, 2, 2], True, dict(strides=[2, 1, 2])),
])
def test_conv_transpose(x, w, bias, attrs, device):
    out_channels = w[1] * attrs.get("group", 1)
    inits = [("w", _f(*w))] + ([("b", _f(out_channels))] if bias else [])
    check_against_ort(_one("ConvTranspose", x, attrs, inits), {"x": _f(*x)}, device=device)


@pytest.mark.parametrize("op,x,attrs", [
    ("MaxPool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", [2, 3, 9, 10], dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1, dilations=[2, 1])),
    ("MaxPool", [1, 2, 7, 8, 9], dict(kernel_shape=[2, 3, 2], auto_pad="SAME_UPPER", strides=[2, 1, 2])),
    ("MaxPool", [1, 2, 17], dict(kernel_shape=[4], strides=[3], auto_pad="SAME_LOWER")),
    ("MaxPool", [1, 4, 8, 6], dict(kernel_shape=[2, 2], strides=[2, 2])),  # PP-OCR cls
    ("AveragePool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1,
                                        ceil_mode=1)),
    ("AveragePool", [1, 8, 3, 40], dict(kernel_shape=[3, 2], strides=[3, 2], pads=[0, 0, 0, 0])),  # PP-OCR rec
    ("AveragePool", [1, 2, 6, 7, 8], dict(kernel_shape=[2, 3, 2], auto_pad="VALID")),
    ("LpPool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=3)),
    ("LpPool", [1, 3, 9, 10], dict(kernel_shape=[2, 2])),
])
def test_pools(op, x, attrs, device):
    check_against_ort(_one(op, x, attrs, opset=19 if op != "LpPool" else 18), {"x": _f(*x)}, device=device)


@pytest.mark.parametrize("x,attrs", [
    ([1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ([2, 2, 9, 10], dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1, storage_order=1)),
    ([1, 2, 5, 6, 7], dict(kernel_shape=[2, 2, 3], strides=[2, 2, 2])),
])
def test_max_pool_indices(x, attrs, device):
    check_against_ort(_one("MaxPool", x, attrs, outputs=("y", "i"), opset=12), {"x": _f(*x)}, device=device)


@pytest.mark.parametrize("op,x", [("GlobalAveragePool", [2, 3, 5, 7]), ("GlobalAveragePool", [1, 4, 30]),
                                  ("GlobalAveragePool", [1, 2, 3, 4, 5]), ("GlobalMaxPool", [2, 3, 5, 7]),
                                  ("GlobalMaxPool", [1, 2, 3, 4, 5]), ("GlobalLpPool", [1, 3, 4, 6])])
def test_global_pools(op, x, device):
    eg = check_against_ort(_one(op, x, {}), {"x": _f(*x)}, device=device)
    assert plan_ops(eg)[0] == {"GlobalAveragePool": "GlobalAvgPool", "GlobalMaxPool": "ReduceMax",
                               "GlobalLpPool": "ReduceL2"}[op] or plan_ops(eg)[0] == "Identity"


@pytest.mark.parametrize("p", [1, 3])
def test_global_lp_pool_of_other_orders(p, device):
    check_against_ort(_one("GlobalLpPool", [2, 3, 4, 5], {"p": p}), {"x": _f(2, 3, 4, 5)}, device=device)


def test_global_lp_pool_of_order_zero_is_refused():
    from eggfuse.ir import OnnxError
    from eggfuse.onnx import load

    with pytest.raises(OnnxError, match="p = 0: the norm's order must be 1 or more"):
        load(_one("GlobalLpPool", [2, 3, 4, 5], {"p": 0}))


def test_global_max_pool_over_a_map_longer_than_lavapipes_loops(device):
    # 70,000 elements a channel: a window of the whole map, one invocation a channel, looped past
    # llvmpipe's 65,535 iterations; as a reduction the invocations share them
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 10_000)).astype(np.float32)
    check_against_ort(_one("GlobalMaxPool", [1, 2, 7, 10_000], {}), {"x": x}, device=device)


def _resize(x, opset: int, scales=None, sizes=None, roi=None, **attrs):
    inits = []
    names = ["x"]
    if opset >= 11:  # roi: optional from opset 13, an empty one before
        names.append("roi" if roi is not None or opset < 13 else "")
        if roi is not None or opset < 13:
            inits.append(("roi", np.array(roi if roi is not None else [], np.float32)))
    if scales is not None:
        names.append("scales")
        inits.append(("scales", np.array(scales, np.float32)))
    elif opset >= 11:
        names.append("")
    if sizes is not None:
        names.append("sizes")
        inits.append(("sizes", np.array(sizes, np.int64)))
    if opset == 11 and scales is None:  # scales is not optional in opset 11: an empty one
        names[2] = "scales"
        inits.append(("scales", np.zeros(0, np.float32)))
    m = model([node("Resize", names, ["y"], **attrs)], [("x", F, x)], [("y", F, None)], inits, opset=opset)
    return m


@pytest.mark.parametrize("opset,x,kw", [
    (10, [1, 2, 3, 4], dict(scales=[1, 1, 2, 3], mode="nearest")),
    (10, [1, 2, 4, 6], dict(scales=[1, 1, 2, 1.5], mode="linear")),
    (10, [1, 1, 5, 7], dict(scales=[1, 1, 0.6, 0.45], mode="nearest")),  # downsampling: ceil
    (11, [1, 2, 3, 4], dict(scales=[1, 1, 2, 2], mode="nearest", coordinate_transformation_mode="asymmetric",
                             nearest_mode="floor")),  # PP-OCR det: Upsample2x
    (11, [1, 2, 5, 4], dict(sizes=[1, 2, 8, 9], mode="linear", coordinate_transformation_mode="align_corners")),
    (11, [1, 1, 6, 6], dict(scales=[1, 1, 0.5, 0.7], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)),
    (11, [1, 1, 6, 6], dict(sizes=[1, 1, 4, 5], roi=[0, 0, 0.2, 0.1, 1, 1, 0.9, 0.8], mode="linear",
                             coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0)),
    (13, [2, 3, 5, 4], dict(scales=[1, 1, 1.7, 2.3], mode="nearest", nearest_mode="round_prefer_ceil")),
    (13, [1, 2, 5, 7], dict(sizes=[1, 2, 3, 4], mode="linear", coordinate_transformation_mode="pytorch_half_pixel")),
    (13, [3, 7], dict(scales=[1, 2.5], mode="cubic")),
    (13, [2, 3, 4, 5, 6], dict(scales=[1, 1, 2, 0.5, 1.5], mode="linear")),
    (18, [1, 2, 8, 8], dict(scales=[0.5, 0.35], axes=[2, 3], mode="linear", antialias=1)),
    (18, [1, 2, 8, 8], dict(sizes=[3, 5], axes=[3, 2], mode="cubic", antialias=1)),
    (18, [1, 2, 4, 6], dict(sizes=[7, 7], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy="not_larger")),
    (18, [1, 2, 4, 6], dict(sizes=[7, 7], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy="not_smaller")),
    (19, [1, 2, 4, 5], dict(scales=[1, 1, 1.5, 0.6], mode="linear",
                             coordinate_transformation_mode="half_pixel_symmetric")),
])
def test_resize(opset, x, kw, device):
    check_against_ort(_resize(x, opset, **kw), {"x": _f(*x)}, device=device)


def test_a_2x_nearest_resize_is_upsample2x_and_others_are_resample(device):
    det = check_against_ort(_resize([1, 2, 3, 4], 12, scales=[1, 1, 2, 2], mode="nearest", nearest_mode="floor",
                                    coordinate_transformation_mode="asymmetric"), {"x": _f(1, 2, 3, 4)}, device=device)
    assert plan_ops(det) == ["Upsample2x"]
    other = check_against_ort(_resize([1, 2, 3, 4], 12, scales=[1, 1, 2, 2], mode="linear"), {"x": _f(1, 2, 3, 4)},
                              device=device)
    assert plan_ops(other) == ["Resample"]


@pytest.mark.parametrize("opset,mode", [(7, "nearest"), (7, "linear"), (9, "nearest"), (9, "linear")])
def test_upsample(opset, mode, device):
    scales = [1.0, 1.0, 2.0, 3.0]
    if opset < 9:
        m = model([node("Upsample", ["x"], ["y"], mode=mode, scales=scales)], [("x", F, [1, 2, 3, 4])],
                  [("y", F, None)], opset=opset)
    else:
        m = model([node("Upsample", ["x", "s"], ["y"], mode=mode)], [("x", F, [1, 2, 3, 4])], [("y", F, None)],
                  [("s", np.array(scales, np.float32))], opset=opset)
    check_against_ort(m, {"x": _f(1, 2, 3, 4)}, device=device)


def test_a_small_network_of_these_ops(device):
    # conv (GEMM), depthwise conv, max pool, 2x resize, transposed conv, average pool, global pool
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Conv", ["c1", "w2"], ["c2"], pads=[2, 2, 2, 2], group=16),
             node("MaxPool", ["c2"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Resize", ["p1", "", "s"], ["r1"], mode="nearest", coordinate_transformation_mode="asymmetric",
                  nearest_mode="floor"),
             node("ConvTranspose", ["r1", "w3", "b3"], ["t1"], strides=[2, 2]),
             node("AveragePool", ["t1"], ["a1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             node("GlobalAveragePool", ["a1"], ["y"])]
    inits = [("w1", _f(16, 3, 3, 3)), ("b1", _f(16)), ("w2", _f(16, 1, 5, 5)),
             ("s", np.array([1, 1, 2, 2], np.float32)), ("w3", _f(16, 24, 2, 2)), ("b3", _f(24))]
    m = model(nodes, [("x", F, [1, 3, 32, 40])], [("y", F, None)], inits, opset=13)
    m.graph.output.extend([helper.make_tensor_value_info("t1", F, None)])
    check_against_ort(m, {"x": _f(1, 3, 32, 40)}, device=device)


def test_refusals_name_the_node_and_the_attribute():
    bad = model([node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[2, 2])], [("x", F, [1, 3, 8, 8])],
                [("y", F, None)], [("w", _f(4, 3, 3, 3))])
    with pytest.raises(OnnxError, match=r"Conv node 'c': attribute kernel_shape=\[2, 2\] differs from the weight's"):
        load(bad)
    big = model([node("Conv", ["x", "w"], ["y"], name="c4")], [("x", F, [1, 1, 3, 3, 3, 3])], [("y", F, None)],
                [("w", _f(1, 1, 1, 1, 1, 1))])
    with pytest.raises(OnnxError, match=r"Conv node 'c4': .* over 1 to 3 spatial axes"):
        load(big)
    pool = model([node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2], auto_pad="SAME")], [("x", F, [1, 1, 8, 8])],
                 [("y", F, None)])
    with pytest.raises(OnnxError, match=r"MaxPool node 'p': attribute kernel_shape=\(2,\) must give 2 sizes"):
        load(pool)
    near = _resize([1, 1, 4, 4], 18, scales=[1, 1, 0.5, 0.5], mode="nearest", antialias=1)
    with pytest.raises(OnnxError, match=r"Resize node .*antialias=1 is defined for the linear and cubic modes"):
        load(near)
    both = _resize([1, 1, 4, 4], 13, scales=[1, 1, 2, 2], sizes=[1, 1, 8, 8], mode="nearest")
    with pytest.raises(OnnxError, match=r"exactly one of scales and sizes"):
        load(both)
