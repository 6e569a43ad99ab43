"""Conv and ConvTranspose (ir/ops/conv.py) on the GPU against the numpy reference: every kernel
path (the 1x1 matmul, the implicit GEMM with each tile, the direct loop), 1 to 3 spatial axes,
groups, dilations, strides, asymmetric and (ConvTranspose) negative pads, with and without
bias; and every kernel of the matmul / conv / pooling / resample families on a split grid."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.ir.ops.conv import conv_uses_gemm
from eggfuse.lowering import lower
from eggfuse.runtime import Session


def _conv(op: str, x, w, bias: bool = True, tag: str = "", **attrs) -> Row:
    g_ = attrs.get("group", 1)
    m = w[1] * g_ if op == "ConvTranspose" else w[0]

    def build(g: Graph) -> int:
        ins = [g.input("x", x), g.parameter("w", w)] + ([g.parameter("b", [m])] if bias else [])
        return g.add_node(op, ins, **attrs)

    desc = ",".join(f"{k}{list(v) if isinstance(v, list) else v}" for k, v in attrs.items())
    return Row(op, f"{op}{x}{w}{'+b' if bias else ''}-{desc}{tag}", build)


ROWS = [
    # the 1x1 matmul path (one image, one group): K and M not multiples of 4, and of 4
    _conv("Conv", [1, 13, 7, 9], [21, 13, 1, 1]),
    _conv("Conv", [1, 16, 8, 8], [20, 16, 1, 1], bias=False),
    _conv("Conv", [1, 16, 8, 8], [20, 16, 1, 1]),  # 64 output columns: the output stored as vec4, through the bias
    # implicit GEMM: 1x1 of two images (pointwise gather), tiles 16x256, 32x128, 64x64 with edges
    _conv("Conv", [2, 16, 5, 5], [20, 16, 1, 1]),
    _conv("Conv", [1, 3, 20, 30], [16, 3, 3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    _conv("Conv", [2, 8, 9, 7], [34, 4, 3, 2], bias=False, strides=[1, 2], pads=[0, 1, 2, 1], dilations=[2, 1],
          group=2),
    _conv("Conv", [1, 5, 6, 7], [70, 5, 3, 3], pads=[1, 1, 1, 1]),
    _conv("Conv", [1, 5, 6, 7], [130, 5, 3, 3], pads=[1, 1, 1, 1], tag="-130"),  # three row blocks
    _conv("Conv", [2, 4, 50], [20, 4, 5], strides=[3], pads=[2, 1]),
    _conv("Conv", [1, 2, 5, 6, 7], [17, 2, 2, 3, 2], strides=[1, 2, 1], pads=[1, 0, 1, 0, 1, 1], dilations=[2, 1, 1]),
    # the direct loop: depthwise (with a channel multiplier), a few output channels, 1-D and 3-D
    _conv("Conv", [1, 6, 9, 11], [6, 1, 3, 3], strides=[2, 1], pads=[1, 1, 1, 1], group=6),
    _conv("Conv", [2, 6, 9, 11], [12, 1, 5, 5], bias=False, pads=[4, 2, 4, 2], dilations=[2, 1], group=6),
    _conv("Conv", [1, 3, 9, 10], [8, 3, 3, 3], strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2]),
    _conv("Conv", [2, 3, 17], [5, 3, 4], strides=[3], pads=[2, 1]),
    _conv("Conv", [1, 2, 4, 5, 6], [3, 2, 3, 3, 3], pads=[1, 1, 1, 1, 1, 1]),
    _conv("Conv", [1, 1, 1, 1], [1, 1, 1, 1]),
    # ConvTranspose: direct and GEMM, groups, dilations, output_padding, negative pads, 1-D and 3-D
    _conv("ConvTranspose", [1, 4, 5, 6], [4, 3, 2, 2], strides=[2, 2]),
    _conv("ConvTranspose", [2, 4, 5, 6], [4, 5, 3, 3], strides=[2, 3], pads=[1, 0, 1, 2], output_padding=[1, 1],
          dilations=[1, 2], group=2),
    _conv("ConvTranspose", [1, 24, 7, 8], [24, 24, 2, 2], bias=False, strides=[2, 2]),  # kernel = stride: unpool
    _conv("ConvTranspose", [2, 32, 3, 5], [32, 17, 2, 3], strides=[2, 3], group=2),
    _conv("ConvTranspose", [1, 20, 9], [20, 16, 4], strides=[4]),
    _conv("ConvTranspose", [1, 20, 9], [20, 16, 4], strides=[4], output_padding=[1], tag="-not-unpool"),
    _conv("ConvTranspose", [1, 3, 7], [3, 18, 3], strides=[2], pads=[0, 1]),
    _conv("ConvTranspose", [1, 6, 5, 4], [6, 20, 3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=2),
    _conv("ConvTranspose", [1, 2, 4, 4], [2, 3, 3, 3], strides=[2, 2], pads=[-1, 0, -1, 1]),
    _conv("ConvTranspose", [1, 2, 3, 4, 3], [2, 2, 2, 2, 2], strides=[2, 1, 2]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def test_the_rows_reach_every_conv_kernel():
    kernels = set()
    for row in ROWS:
        g = Graph()
        g.set_outputs([row.build(g)])
        kernels |= {d.kernel.replace("+bias", "") for d in lower(g).dispatches}
    for want in ("conv_1x1_matmul", "conv_direct", "conv_gemm16x256", "conv_gemm32x128", "conv_gemm64x64",
                 "conv_gemm32x128_1x1", "conv_transpose_direct", "conv_transpose_gemm"):
        assert any(k.startswith(want) for k in kernels), (want, kernels)
    assert any(k.startswith("conv_transpose_gemm") and k.endswith("_unpool") for k in kernels), kernels


def test_gemm_choice_follows_channels_per_group():
    g = Graph()
    x = g.input("x", [1, 32, 8, 8])
    depthwise = g.node(g.add_node("Conv", (x, g.parameter("w1", [32, 1, 3, 3])), group=32))
    grouped = g.node(g.add_node("Conv", (x, g.parameter("w2", [32, 16, 3, 3])), group=2))
    assert not conv_uses_gemm(depthwise) and conv_uses_gemm(grouped)


def test_kernels_on_a_split_grid(device):
    # every kernel of these families reads its linear workgroup index back from a 2-D or 3-D grid
    # (lowering/limits.py split_grid) and returns past the last one; with at most 4 workgroups
    # per dimension each needs more than one dimension here
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.input("x", [2, 16, 20, 24])
    outs = [
        g.add_node("Conv", (x, g.parameter("w1", [20, 16, 3, 3])), pads=[1, 1, 1, 1]),  # GEMM
        g.add_node("Conv", (x, g.parameter("w2", [16, 1, 3, 3])), group=16),  # direct
        g.add_node("ConvTranspose", (x, g.parameter("w3", [16, 18, 2, 2])), strides=[2, 2]),
        g.add_node("BatchMatMul", (x, g.input("y", [2, 16, 24, 40]))),
        g.add_node("Einsum", (x,), equation="nchw->nwhc"),
        g.add_node("MaxPool", (x,), kernel_shape=[2, 2]),
        g.add_node("AveragePool", (x,), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    index = rng.integers(0, 20, size=2 * 10).astype(np.int32)
    outs.append(g.add_node("Resample", (x, g.constant(index, dtype=DType.I32), g.constant(rng.random(20))),
                           shape=[2, 16, 10, 24], taps=[0, 0, 2, 0]))
    g.set_outputs(outs)
    plan = lower(g, {"max-compute-workgroups-per-dimension": 4})
    grids = [(d.kernel, d.workgroups) for d in plan.dispatches]
    assert len(grids) == len(outs) and all(grid[1] > 1 for _, grid in grids), grids
    params = {f"w{i}": rng.standard_normal(s) for i, s in ((1, [20, 16, 3, 3]), (2, [16, 1, 3, 3]),
                                                           (3, [16, 18, 2, 2]))}
    feeds = {"x": rng.standard_normal((2, 16, 20, 24)), "y": rng.standard_normal((2, 16, 24, 40))}
    for got, want in zip(Session(plan, params, device=device).run(feeds), evaluate(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
