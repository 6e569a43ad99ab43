"""FusedConv / FusedConvBn (ir/ops/conv_fused.py) without a GPU: their shape rules' errors, and
what the conv_epilogue rules make of small graphs, checked against the numpy reference
(``optimize(..., verify=True)``)."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import Graph, GraphError
from eggfuse.rewrites import optimize


def _conv(g: Graph, c: int = 5, m: int = 7, bias: bool = False) -> int:
    x = g.input("x", [1, c, 9, 11])
    ins = (x, g.parameter("w", [m, c, 3, 3]), *((g.parameter("b", [m]),) if bias else ()))
    return g.add_node("Conv", ins, strides=[2, 1], pads=[1, 1, 1, 1])


def _bn(g: Graph, y: int, m: int = 7, tag: str = "") -> int:
    var = g.constant(np.linspace(0.5, 2.0, m), [m])
    stats = [g.parameter(f"{tag}{n}", [m]) for n in ("scale", "shift", "mean")]
    return g.add_node("BatchNormalization", (y, *stats, var), epsilon=1e-5)


def _kernels(g: Graph) -> list:
    return [n for n in g.live_nodes() if g.dispatches(n)]


@pytest.mark.parametrize(("op", "extra", "epilogue", "match"), [
    ("FusedConv", [[5]], ("bias",), r"bias operand must hold one value per output channel, \[6\] or \[1, 6, 1, "),
    ("FusedConv", [[1, 6, 5, 4]], ("add",), r"add operand must be of the output's shape f32\[1,6,3,3\]"),
    ("FusedConv", [], ("HardSigmoid",), r"'HardSigmoid' is neither bias, add nor a unary op .*Relu"),
    ("FusedConv", [[6]], (), r"1 epilogue operands left unused"),
    ("FusedConvBn", [[6], [6], [6], [4]], (), r"var must be \[6\] \(one per output channel\), got f32\[4\]"),
])
def test_bad_operands_are_refused_naming_them(op, extra, epilogue, match):
    g = Graph()
    x, w = g.input("x", [1, 4, 5, 5]), g.parameter("w", [6, 4, 3, 3])
    operands = [g.parameter(f"p{i}", shape) for i, shape in enumerate(extra)]
    with pytest.raises(GraphError, match=match):
        g.add_node(op, (x, w, *operands), epilogue=epilogue, strides=[2, 2], pads=[1, 1, 1, 1])


def test_conv_batch_norm_hard_swish_is_one_kernel():
    g = Graph()
    y = _bn(g, _conv(g))
    h = g.add_node("Div", (g.mul(y, g.add_node("Clip", (g.add(y, g.constant(3.0, shape=())),
                                                          g.constant(0.0, shape=()), g.constant(6.0, shape=())))),
                           g.constant(6.0, shape=())))
    g.set_outputs([h])
    opt, rep = optimize(g, verify=True)
    (k,) = _kernels(opt)
    assert (k.op, k.attrs["epilogue"]) == ("FusedConvBn", ("HardSwish",))
    assert (rep.dispatches_before, rep.dispatches_after) == (6, 1)


def test_a_bias_before_the_batch_norm_keeps_the_batch_norm_apart():
    # FusedConvBn applies the batch norm to the bare convolution: a Conv bias cannot go first
    g = Graph()
    g.set_outputs([g.relu(_bn(g, _conv(g, bias=True)))])
    opt, _ = optimize(g, verify=True)
    ops = [k.op for k in _kernels(opt)]
    assert "BatchNormalization" in ops and "FusedConvBn" not in ops and len(ops) == 3


def test_an_output_in_the_middle_of_the_chain_is_stored():
    g = Graph()
    y = _bn(g, _conv(g))
    g.set_outputs([g.sigmoid(g.relu(y)), y])
    opt, _ = optimize(g, verify=True)
    ks = _kernels(opt)
    assert len(ks) == 2 and opt.node(opt.outputs[1]).op == "FusedConvBn"
    assert opt.node(opt.outputs[1]).attrs["epilogue"] == ()


def test_one_residual_per_chain_bounds_the_bindings():
    # two residual adds: one joins the chain (x, w, 4 statistics, 1 residual, out: 8 bindings)
    g = Graph()
    y = _bn(g, _conv(g))
    r1, r2 = g.input("r1", [1, 7, 5, 11]), g.input("r2", [1, 7, 5, 11])
    g.set_outputs([g.add(g.add(y, r1), r2)])
    opt, _ = optimize(g, verify=True)
    ks = _kernels(opt)
    assert len(ks) == 2
    fused = next(k for k in ks if k.op == "FusedConvBn")
    assert fused.attrs["epilogue"].count("add") == 1 and len(fused.inputs) == 7


def test_a_channel_bias_add_becomes_the_chains_bias():
    # paddle2onnx writes a Conv's bias as an Add of a [1, M, 1, 1] constant
    g = Graph()
    y = g.add(_conv(g), g.parameter("d", [1, 7, 1, 1]))
    g.set_outputs([g.relu(y)])
    opt, _ = optimize(g, verify=True)
    (k,) = _kernels(opt)
    assert (k.op, k.attrs["epilogue"]) == ("FusedConv", ("bias", "Relu"))
