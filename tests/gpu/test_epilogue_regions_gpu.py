"""Generated epilogue regions (ir/ops/fused_epilogue.py, the rules of ir/ops/epilogue_rules.py) on
the GPU against the numpy reference of the unfused graph: elementwise regions after a matmul
(tiled, GEMV, 'AT'/'BT', the RmsNorm prologue, quantised B) and after a convolution (the 1x1
matmul path, the implicit GEMM, the direct loop, with batch norm), at odd sizes, with broadcast
operands, one-element constants, shared inputs, a diamond over the product, and a region
output or intermediate that is also a graph output (it must still be stored)."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import run_optimised  # tests/op_table.py

from eggfuse.ir import Graph
from eggfuse.ir.ops.fused_epilogue import is_expr
from eggfuse.ir.ops.quant import _quant_param
from eggfuse.rewrites.engine import random_feeds


def _regions(opt: Graph, op: str) -> list:
    return [s for n in opt.live_nodes() if n.op == op for s in n.attrs["epilogue"] if is_expr(s)]


def _feeds(g: Graph, seed: int = 0) -> tuple[dict, dict]:
    return random_feeds(g, seed)


def _scale_act_shift(g: Graph, y: int, shape) -> int:
    """PP-LCNetV3's ``s2 * HardSwish(s1 * y + b1) + b2`` with one-element constants, then
    ``* r`` for an operand r broadcast along the rows and ``+ c`` along the columns."""
    c = [g.constant(np.float32(v), [1]) for v in (0.75, -0.25, 1.5, 0.125)]
    y = g.add(g.mul(c[0], y), c[1])
    y = g.add(g.mul(c[2], g.add_node("HardSwish", (y,))), c[3])
    y = g.mul(y, g.parameter("r", [*([1] * (len(shape) - 1)), shape[-1]]))
    return g.add(y, g.parameter("c", [*shape[:-1], 1]))


@pytest.mark.parametrize("m,k,n,variant", [(37, 29, 19, ""), (3, 33, 21, "BT"), (13, 9, 70, "AT"), (1, 16, 11, "")])
def test_matmul_region(m, k, n, variant, device):
    g = Graph()
    a = g.input("a", [k, m] if variant == "AT" else [m, k])
    b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
    y = g.add_node({"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}[variant], (a, b))
    g.set_outputs([_scale_act_shift(g, y, [m, n])])
    opt, _ = run_optimised(g, device, *_feeds(g))
    assert opt.dispatch_count() == 1, opt.summary()
    assert _regions(opt, "FusedMatMul"), opt.summary()


def test_matmul_diamond_and_output(device):
    """``y * Tanh(y)`` over one product (a diamond), a shared input read by two regions, and
    the region's intermediate ``t`` also a graph output: t is stored, the product is not."""
    g = Graph()
    x = g.input("x", [23, 15])
    y1 = g.matmul(x, g.parameter("w1", [15, 17]))
    y2 = g.matmul(x, g.parameter("w2", [15, 17]))
    s = g.input("s", [23, 1])
    t = g.mul(y1, g.tanh(y1))
    u = g.add(g.mul(y2, s), g.tanh(y2))
    g.set_outputs([g.add(g.mul(t, s), g.neg(u)), t])
    opt, _ = run_optimised(g, device, *_feeds(g, 1))
    mms = [n for n in opt.live_nodes() if n.op == "FusedMatMul"]
    assert opt.dispatch_count() == 2 and all(any(map(is_expr, n.attrs["epilogue"])) for n in mms), opt.summary()


def test_rms_norm_matmul_region(device):
    g = Graph()
    x = g.input("x", [9, 20])
    h = g.rms_norm(x, g.parameter("wn", [20]))
    y = g.matmul_bt(h, g.parameter("w", [13, 20]))
    g.set_outputs([g.mul(g.silu(y), g.input("u", [9, 13]))])
    opt, _ = run_optimised(g, device, *_feeds(g, 2))
    assert _regions(opt, "FusedRmsNormMatMul"), opt.summary()


def test_quantised_matmul_region(device):
    g = Graph()
    x = g.input("x", [2, 64])
    y = g.matmul_bt(x, _quant_param(g, "q", 24, 64))
    g.set_outputs([g.add(g.mul(y, g.constant(np.float32(0.5), [1])), g.sigmoid(y))])
    feeds, params = random_feeds(g, 3)
    opt, _ = run_optimised(g, device, feeds, params)
    assert _regions(opt, "QuantMatMul"), opt.summary()


@pytest.mark.parametrize("x,w,attrs,bn", [
    ([1, 13, 7, 9], [21, 13, 1, 1], {}, False),  # the 1x1 matmul path
    ([2, 3, 11, 9], [17, 3, 3, 3], {"pads": [1, 1, 1, 1], "strides": [2, 1]}, True),  # implicit GEMM
    ([1, 6, 9, 11], [6, 1, 3, 3], {"pads": [1, 1, 1, 1], "group": 6}, True),  # the direct loop, depthwise
])
def test_conv_region(x, w, attrs, bn, device):
    g = Graph()
    y = g.add_node("Conv", (g.input("x", x), g.parameter("w", w)), **attrs)
    m = w[0]
    if bn:
        y = g.add_node("BatchNormalization", (y, *(g.parameter(p, [m]) for p in ("s", "t", "mu")),
                                              g.constant(np.linspace(0.5, 2.0, m).astype(np.float32), [m])))
    shape = list(g.node(y).type.shape)
    g.set_outputs([_scale_act_shift(g, y, shape)])
    opt, _ = run_optimised(g, device, *_feeds(g, 4))
    # FusedConvBn binds x, w and 4 statistics: of the region's 2 operands one fits beside the output,
    # and the rest of the chain runs as a Fused kernel on the convolution's output
    assert opt.dispatch_count() == (2 if bn else 1), opt.summary()
    assert _regions(opt, "FusedConvBn" if bn else "FusedConv"), opt.summary()
