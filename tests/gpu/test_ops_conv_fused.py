"""FusedConv and FusedConvBn (ir/ops/conv_fused.py) on the GPU against the numpy reference: each
Conv kernel path (the 1x1 matmul, the implicit GEMM, the direct loop: depthwise, strides,
padding, dilation, groups, odd channel counts) with each epilogue step; and graphs that the
conv_epilogue rules fuse, run and compared with the unfused graph's reference: a chain whose
intermediate is also a graph output (it must still be stored), a convolution two consumers
share, a residual add, one input read by two fused convolutions."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row, run_optimised  # tests/op_table.py

from eggfuse.ir import Graph


def _fused(x, w, epilogue=(), bn: bool = False, bias_shape=None, tag: str = "", **attrs) -> Row:
    """A FusedConv (FusedConvBn with ``bn``) row: its operands random leaves, the variance positive."""
    m = w[0]
    feeds = {"var": np.linspace(0.25, 3.0, m).astype(np.float32)} if bn else {}

    def build(g: Graph) -> int:
        ins = [g.input("x", x), g.parameter("w", w)]
        if bn:
            ins += [g.parameter(n, [m]) for n in ("scale", "shift", "mean", "var")]
        y_shape = None
        for i, step in enumerate(epilogue):
            if step == "bias":
                ins.append(g.parameter(f"b{i}", bias_shape or [m]))
            elif step == "add":
                if y_shape is None:  # the output's shape, from the unfused convolution
                    probe = Graph()
                    y_shape = list(probe.node(probe.add_node("Conv", (probe.input("x", x), probe.parameter("w", w)),
                                                             **attrs)).type.shape)
                ins.append(g.input(f"r{i}", y_shape))
        extra = {"epsilon": 1e-3} if bn else {}
        return g.add_node("FusedConvBn" if bn else "FusedConv", ins, epilogue=tuple(epilogue), **attrs, **extra)

    op = "FusedConvBn" if bn else "FusedConv"
    desc = ",".join(f"{k}{list(v) if isinstance(v, list) else v}" for k, v in attrs.items())
    return Row(op, f"{op}{x}{w}{'+'.join(epilogue)}-{desc}{tag}", build, feeds)


ROWS = [
    # the 1x1 matmul path: odd K and M, bias, residual, activations; with batch norm
    _fused([1, 13, 7, 9], [21, 13, 1, 1], ("bias", "Relu", "add")),
    _fused([1, 13, 7, 9], [21, 13, 1, 1], ("add", "HardSwish"), bn=True),
    # implicit GEMM: strided and padded, groups with dilation, 1-D, odd channel counts
    _fused([1, 3, 20, 30], [17, 3, 3, 3], ("bias", "Sigmoid"), bias_shape=[1, 17, 1, 1], strides=[2, 2],
           pads=[1, 1, 1, 1]),
    _fused([2, 8, 9, 7], [34, 4, 3, 2], ("Relu", "add", "Tanh"), bn=True, strides=[1, 2], pads=[0, 1, 2, 1],
           dilations=[2, 1], group=2),
    _fused([2, 4, 50], [19, 4, 5], ("bias", "add"), strides=[3], pads=[2, 1]),
    _fused([2, 16, 5, 5], [20, 16, 1, 1], ("HardSwish",), bn=True),
    # the direct loop: depthwise with a channel multiplier, few output channels, padding and dilation
    _fused([1, 6, 9, 11], [6, 1, 3, 3], ("Relu",), bn=True, strides=[2, 1], pads=[1, 1, 1, 1], group=6),
    _fused([2, 5, 9, 11], [15, 1, 5, 5], ("bias", "add", "HardSwish"), pads=[4, 2, 4, 2], dilations=[2, 1],
           group=5),
    _fused([1, 3, 9, 10], [7, 3, 3, 3], (), bn=True, strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def _stats(rng, g: Graph, params: dict, m: int, tag: str) -> list[int]:
    ids = []
    for name, value in (("scale", rng.standard_normal(m)), ("shift", rng.standard_normal(m)),
                        ("mean", rng.standard_normal(m)), ("var", rng.uniform(0.25, 3.0, m))):
        params[f"{tag}{name}"] = value.astype(np.float32)
        ids.append(g.parameter(f"{tag}{name}", [m]))
    return ids


def _ops(g: Graph) -> list[str]:
    return sorted(n.op for n in g.live_nodes() if g.dispatches(n))


def test_conv_batch_norm_relu_residual_becomes_one_kernel(device):
    rng = np.random.default_rng(0)
    g, params = Graph(), {"w": rng.standard_normal((5, 5, 3, 3)).astype(np.float32)}
    x = g.input("x", [1, 5, 7, 9])
    y = g.add_node("Conv", (x, g.parameter("w", [5, 5, 3, 3])), pads=[1, 1, 1, 1])
    y = g.add_node("BatchNormalization", (y, *_stats(rng, g, params, 5, "")), epsilon=1e-5)
    g.set_outputs([g.relu(g.add(g.relu(y), x))])
    opt, _ = run_optimised(g, device, {"x": rng.standard_normal((1, 5, 7, 9)).astype(np.float32)}, params)
    (node,) = [n for n in opt.live_nodes() if opt.dispatches(n)]
    assert node.op == "FusedConvBn" and node.attrs["epilogue"] == ("Relu", "add", "Relu")


def test_an_intermediate_that_is_a_graph_output_is_stored(device):
    # relu(BN(conv)) is an output and also feeds the residual: the chain may not swallow it
    rng = np.random.default_rng(1)
    g, params = Graph(), {"w": rng.standard_normal((7, 3, 3, 3)).astype(np.float32)}
    x = g.input("x", [1, 3, 11, 13])
    y = g.add_node("Conv", (x, g.parameter("w", [7, 3, 3, 3])), strides=[2, 2], pads=[1, 1, 1, 1])
    mid = g.relu(g.add_node("BatchNormalization", (y, *_stats(rng, g, params, 7, "")), epsilon=1e-5))
    r = g.input("r", [1, 7, 6, 7])
    g.set_outputs([g.sigmoid(g.add(mid, r)), mid])
    feeds = {"x": rng.standard_normal((1, 3, 11, 13)).astype(np.float32),
             "r": rng.standard_normal((1, 7, 6, 7)).astype(np.float32)}
    opt, (out, mid_got) = run_optimised(g, device, feeds, params)
    assert opt.node(opt.outputs[1]).op == "FusedConvBn"  # BN and Relu folded, the value stored
    assert len(_ops(opt)) == 2  # the conv once, then the add and sigmoid


def test_a_shared_convolution_and_a_shared_input(device):
    # x feeds two convolutions; the first's output feeds a Relu and the second convolution's residual
    rng = np.random.default_rng(2)
    params = {"w1": rng.standard_normal((9, 9, 1, 1)).astype(np.float32),
              "b1": rng.standard_normal(9).astype(np.float32),
              "w2": rng.standard_normal((9, 1, 3, 3)).astype(np.float32)}
    g = Graph()
    x = g.input("x", [1, 9, 5, 7])
    c1 = g.add_node("Conv", (x, g.parameter("w1", [9, 9, 1, 1]), g.parameter("b1", [9])))
    c2 = g.add_node("Conv", (x, g.parameter("w2", [9, 1, 3, 3])), pads=[1, 1, 1, 1], group=9)
    g.set_outputs([g.relu(c1), g.add(c2, c1)])
    opt, _ = run_optimised(g, device, {"x": rng.standard_normal((1, 9, 5, 7)).astype(np.float32)}, params)
    # 4 kernels unfused; 3 fused: the residual folds into the depthwise convolution, and the
    # shared one is stored once for it (folding the Relu too would compute it twice)
    assert len(_ops(opt)) == 3 and "FusedConv" in _ops(opt)
