"""The matmul, conv, pooling and resample ops of the ONNX importer (ir/ops/linalg.py, conv.py,
pooling.py, resample.py): shape rules (good and bad rows), and the numpy references, through
the converters, against onnx's own reference evaluator (an independent implementation; no GPU
needed). Their kernels are checked in tests/gpu/test_ops_{conv,linalg,pooling}.py, the
converters against onnxruntime in tests/gpu/test_onnx_{linalg,vision}.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_models import F, model, node  # tests/onnx_models.py
from shape_rules import shape_rule_tests  # tests/shape_rules.py

from eggfuse.ir import DType, Graph, GraphError, evaluate
from eggfuse.onnx import load

POOL = dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])

GOOD = [
    ("Conv", [[2, 6, 9, 8], [4, 3, 3, 3]], dict(group=2, pads=[1, 1, 1, 1], strides=[2, 1]), (2, 4, 5, 8)),
    ("Conv", [[1, 3, 20], [5, 3, 4], [5]], dict(dilations=[3]), (1, 5, 11)),
    ("ConvTranspose", [[1, 4, 5, 6], [4, 3, 2, 2]], dict(strides=[2, 2], output_padding=[1, 0]), (1, 3, 11, 12)),
    ("ConvTranspose", [[1, 4, 5], [4, 2, 3], [4]], dict(group=2, pads=[-1, 0]), (1, 4, 8)),
    ("BatchMatMul", [[2, 1, 3, 4], [5, 4, 6]], {}, (2, 5, 3, 6)),
    ("BatchMatMul", [[4], [4]], {}, ()),
    ("BatchMatMul", [[2, 4, 3], [5, 4]], dict(trans_a=True, trans_b=True), (2, 3, 5)),
    ("Einsum", [[3, 4], [4, 5]], dict(equation="ij,jk"), (3, 5)),
    ("Einsum", [[2, 1, 3, 4]], dict(equation="...ij->...ji"), (2, 1, 4, 3)),
    ("MaxPool", [[1, 2, 7, 6]], POOL, (1, 2, 4, 3)),
    ("MaxPool", [[1, 2, 8]], dict(kernel_shape=[3], strides=[2], ceil_mode=True), (1, 2, 4)),
    ("AveragePool", [[1, 2, 7, 6]], {**POOL, "count_include_pad": True}, (1, 2, 4, 3)),
    ("LpPool", [[1, 2, 4, 5, 6]], dict(kernel_shape=[2, 2, 2], p=3), (1, 2, 3, 4, 5)),
]
BAD = [
    ("Conv", [[2, 6, 9, 8], [4, 2, 3, 3]], dict(group=2), "must be \\[M, C/group"),
    ("Conv", [[2, 5, 9, 8], [4, 5, 3, 3]], dict(group=2), "group 2 does not divide"),
    ("Conv", [[2, 6, 2, 2], [4, 6, 3, 3]], {}, "larger than the padded input"),
    ("Conv", [[2, 6, 9, 8], [4, 6, 3, 3]], dict(pads=[1, 1]), "do not fit 2 spatial axes"),
    ("Conv", [[2, 6, 9, 8], [4, 6, 3, 3], [5]], {}, "B must be \\[4\\]"),
    ("Conv", [[1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1]], {}, "1 to 3 spatial axes"),
    ("ConvTranspose", [[1, 4, 5, 6], [3, 3, 2, 2]], {}, "must be \\[C, M/group"),
    ("ConvTranspose", [[1, 4, 2, 2], [4, 3, 1, 1]], dict(pads=[1, 1, 1, 1]), "leave no output"),
    ("BatchMatMul", [[2, 3, 4], [3, 5, 6]], {}, "inner dimensions differ"),
    ("BatchMatMul", [[2, 3, 4], [3, 4, 6]], {}, "do not broadcast"),
    ("Einsum", [[3, 4], [5, 6]], dict(equation="ij,jk"), "letter 'j' has sizes 4 and 5"),
    ("Einsum", [[3, 4]], dict(equation="ij,jk"), "2 operands, got 1"),
    ("MaxPool", [[1, 2, 7, 6]], dict(kernel_shape=[3]), "kernel_shape \\[3\\] must be 2 sizes"),
    ("AveragePool", [[1, 2, 2, 2]], dict(kernel_shape=[3, 3]), "larger than the padded input"),
    ("LpPool", [[1, 2, 7, 6]], dict(kernel_shape=[2, 2], pads=[-1, 0, 0, 0]), "pads must be >= 0"),
]

test_shape_rule_accepts, test_shape_rule_rejects = shape_rule_tests(GOOD, BAD)


def test_max_pool_indices_are_i32_and_resample_checks_its_tables():
    g = Graph()
    x = g.input("x", [1, 2, 7, 6])
    assert g.node(g.add_node("MaxPoolIndices", (x,), **POOL)).type.dtype is DType.I32
    index = g.constant(np.zeros(8, np.int32), dtype=DType.I32)
    g.add_node("Resample", (x, index, g.constant(np.ones(8))), shape=[1, 2, 4, 6], taps=[0, 0, 2, 0])
    with pytest.raises(GraphError, match=r"Resample .*index must be i32\[12\]"):
        g.add_node("Resample", (x, index, g.constant(np.ones(8))), shape=[1, 2, 4, 6], taps=[0, 0, 3, 0])
    with pytest.raises(GraphError, match=r"Resample .*axis 3 has no taps \(untouched\) but resizes 6 to 5"):
        g.add_node("Resample", (x, index, g.constant(np.ones(8))), shape=[1, 2, 4, 5], taps=[0, 0, 2, 0])


RNG = np.random.default_rng(2)

# (op, x shape, attributes, initializers, opset): one-node models whose reference values onnx computes
CASES = [
    ("Conv", [1, 4, 9, 10], dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2),
     [("w", [6, 2, 3, 3]), ("b", [6])], 17),
    ("Conv", [2, 3, 17], dict(auto_pad="SAME_LOWER", strides=[2]), [("w", [5, 3, 4])], 17),
    ("Conv", [1, 2, 5, 6, 4], dict(pads=[1, 0, 1, 0, 1, 1]), [("w", [3, 2, 2, 3, 2])], 17),
    # (groups: onnx's reference slices the weight of a grouped ConvTranspose wrongly; onnxruntime checks them)
    ("ConvTranspose", [1, 4, 5, 6], dict(strides=[2, 3], pads=[1, 0, 1, 2], output_padding=[1, 1]),
     [("w", [4, 3, 3, 3]), ("b", [3])], 17),
    ("ConvTranspose", [1, 3, 5, 5], dict(strides=[2, 2], output_shape=[12, 11]), [("w", [3, 2, 3, 3])], 17),
    ("ConvTranspose", [1, 2, 7], dict(strides=[3], dilations=[2]), [("w", [2, 3, 3])], 17),
    ("MaxPool", [1, 3, 9, 10], dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 0, 1], ceil_mode=1), [], 12),
    ("MaxPool", [1, 2, 6, 7, 5], dict(kernel_shape=[2, 3, 2], dilations=[2, 1, 1]), [], 12),
    ("AveragePool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                        count_include_pad=1), [], 19),
    ("AveragePool", [1, 3, 11], dict(kernel_shape=[4], strides=[3], auto_pad="SAME_UPPER"), [], 19),
    ("LpPool", [1, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=3), [], 18),
    ("GlobalMaxPool", [2, 3, 4, 5], {}, [], 17),
    ("GlobalAveragePool", [1, 3, 4, 5, 2], {}, [], 17),
    ("Gemm", [4, 3], dict(transA=1, transB=1, alpha=0.5, beta=2.0), [("b", [5, 4]), ("c", [1, 5])], 13),
    ("MatMul", [2, 3, 4], {}, [("b", [2, 4, 5])], 13),
    ("Einsum", [3, 5, 5], dict(equation="bii->b"), [], 12),
]


@pytest.mark.parametrize("op,x,attrs,inits,opset", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_reference_matches_onnx_reference_evaluator(op, x, attrs, inits, opset):
    arrays = [(n, RNG.standard_normal(s).astype(np.float32)) for n, s in inits]
    m = model([node(op, ["x", *[n for n, _ in inits]], ["y"], **attrs)], [("x", F, x)], [("y", F, None)], arrays,
              opset=opset)
    feed = RNG.standard_normal(x).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": feed})
    g, params = load(m)
    (got,) = evaluate(g, {"x": feed}, params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,inits", [
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [("scales", [1, 1, 0.6, 1.7])]),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), [("sizes", [1, 2, 7, 3])]),
    (dict(mode="nearest", nearest_mode="round_prefer_ceil", coordinate_transformation_mode="half_pixel_symmetric"),
     [("scales", [1, 1, 1.4, 2.6])]),
    (dict(mode="linear", antialias=1), [("scales", [1, 1, 0.4, 0.7])]),
    (dict(mode="cubic", antialias=1, axes=[3, 2]), [("sizes", [2, 3])]),
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=5.0),
     [("roi", [0, 0, -0.2, 0.1, 1, 1, 0.7, 1.3]), ("sizes", [1, 2, 4, 5])]),
    (dict(mode="nearest", keep_aspect_ratio_policy="not_smaller", axes=[2, 3]), [("sizes", [4, 9])]),
])
def test_resize_tables_match_onnx_reference_evaluator(attrs, inits):
    given = dict(inits)
    names = ["x", "roi" if "roi" in given else "", "scales" if "scales" in given else "",
             "sizes" if "sizes" in given else ""]
    arrays = [(n, np.array(given[n], np.int64 if n == "sizes" else np.float32)) for n in names[1:] if n]
    m = model([node("Resize", names, ["y"], **attrs)], [("x", F, [1, 2, 5, 6])], [("y", F, None)], arrays, opset=19)
    feed = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": feed})
    g, params = load(m)
    (got,) = evaluate(g, {"x": feed}, params)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_tiles_fit_the_default_workgroup_storage():
    # shaders/gemm_tiled.wgsl stages a K slice of A and of B (vec4s) per tile; every WebGPU
    # device offers 16384 bytes (maxComputeWorkgroupStorageSize), the limit the tiles keep to
    from eggfuse.ir.ops.linalg import GEMM_TILES
    from eggfuse.ir.ops.matmul_kernel import WORKGROUP_STORAGE

    for bm, bn, slice_k in GEMM_TILES:
        assert bm * bn == 256 * 16 and 256 % (bn // 4) == 0 and slice_k % 4 == 0, (bm, bn, slice_k)
        assert 4 * slice_k * (bm + bn) <= WORKGROUP_STORAGE, (bm, bn, slice_k)
