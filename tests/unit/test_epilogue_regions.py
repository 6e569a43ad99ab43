"""Generated epilogue regions (ir/ops/fused_epilogue.py) and the rules that build them
(ir/ops/epilogue_rules.py), without a device: the op's reference against numpy, the errors of
malformed regions, what the rules make of small graphs (checked against the numpy reference of
the unfused graph), a graph that already holds regions optimised again, and the split of a
region that reads more tensors than a kernel binds."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import Graph, GraphError, evaluate
from eggfuse.ir.ops.fused_epilogue import expr_lines, is_expr, split, step_label
from eggfuse.ir.types import TensorType
from eggfuse.rewrites import optimize, random_feeds

#: tanh(acc) * r + 0.5, r an operand read with broadcasting.
REGION = ("expr", (("input", (), (0,)), ("Tanh", (), (0,)), ("input", (), (1,)), ("Mul", (), (1, 2)),
                   ("const", (("dtype", "f32"), ("shape", (1,)), ("value", 0.5)), ()), ("Add", (), (3, 4))))


def _same(opt: Graph, g: Graph, seed: int = 0) -> None:
    feeds, params = random_feeds(g, seed)
    for a, b in zip(evaluate(opt, feeds, params), evaluate(g, feeds, params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _regions(g: Graph) -> list:
    return [s for n in g.live_nodes() for s in n.attrs.get("epilogue", ()) if is_expr(s)]


@pytest.mark.parametrize("r_shape", [[1, 5], [3, 1], [3, 5], [5], [1]])
def test_reference_is_the_numpy_formula(r_shape):
    g = Graph()
    a, b, d, r = g.input("a", [3, 4]), g.parameter("b", [4, 5]), g.parameter("d", [5]), g.input("r", r_shape)
    g.set_outputs([g.add_node("FusedMatMul", (a, b, d, r), variant="", epilogue=("bias", REGION, "Relu"))])
    feeds, params = random_feeds(g, 1)
    got = evaluate(g, feeds, params)[0]
    want = np.maximum(np.tanh(feeds["a"] @ params["b"] + params["d"]) * feeds["r"] + 0.5, 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert step_label(REGION) == "expr(Tanh,Mul,Add)"


def test_conv_reference_is_the_numpy_formula():
    g = Graph()
    x, w, r = g.input("x", [1, 2, 3, 3]), g.parameter("w", [4, 2, 1, 1]), g.parameter("r", [1, 4, 1, 1])
    g.set_outputs([g.add_node("FusedConv", (x, w, r), epilogue=(REGION,))])
    feeds, params = random_feeds(g, 2)
    conv = np.einsum("nchw,oc->nohw", feeds["x"], params["w"][:, :, 0, 0])
    np.testing.assert_allclose(evaluate(g, feeds, params)[0], np.tanh(conv) * params["r"] + 0.5, rtol=1e-6, atol=1e-6)


def test_malformed_regions_are_refused_naming_the_node():
    g = Graph()
    a, b = g.input("a", [3, 4]), g.parameter("b", [4, 5])
    with pytest.raises(GraphError, match="FusedMatMul.*reads 1 operands, 0 are left"):
        g.add_node("FusedMatMul", (a, b), variant="", epilogue=(REGION,))
    big = g.input("big", [2, 3, 5])  # the region would enlarge the output
    with pytest.raises(GraphError, match=r"must give f32\[3,5\]"):
        g.add_node("FusedMatMul", (a, b, big), variant="", epilogue=(REGION,))
    cmp = ("expr", (("input", (), (0,)), ("input", (), (1,)), ("Less", (), (0, 1))))  # a bool value
    with pytest.raises(GraphError, match="must give f32"):
        g.add_node("FusedMatMul", (a, b, g.input("c", [3, 5])), variant="", epilogue=(cmp,))
    with pytest.raises(GraphError, match="not a sequence of step names"):
        g.add_node("FusedMatMul", (a, b), variant="", epilogue=(("bias", "Relu"),))


def test_operands_are_read_at_their_broadcast_index():
    out = (2, 3, 4)
    lines = expr_lines(("expr", (("input", (), (0,)), ("input", (), (1,)), ("Add", (), (0, 1)))), 0, out,
                       [TensorType((3, 1))], 2)
    text = "\n".join(lines).format(at="at")
    assert "e2[(((at) / 4u) % 3u)]" in text and "v = r0_2;" in text
    scalar = expr_lines(("expr", (("input", (), (0,)), ("input", (), (1,)), ("Mul", (), (0, 1)))), 1, out,
                        [TensorType((1,))], 0)
    assert "e0[0u]" in "\n".join(scalar).format(at="at")


@pytest.mark.parametrize("variant", ["", "AT", "BT"])
def test_a_region_after_a_matmul_joins_its_store(variant):
    m, k, n = 7, 5, 9
    g = Graph()
    a = g.input("a", [k, m] if variant == "AT" else [m, k])
    b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
    y = g.add_node({"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}[variant], (a, b))
    s = g.constant(np.float32(1.5), [1])
    col = g.parameter("col", [m, 1])
    g.set_outputs([g.add(g.mul(g.tanh(g.mul(y, s)), col), g.sigmoid(y))])  # a diamond over y
    opt, _ = optimize(g)
    assert opt.dispatch_count() == 1 and len(_regions(opt)) == 1, opt.summary()
    assert "Constant" not in [n.op for n in opt.live_nodes()]  # the scale is a literal
    _same(opt, g)


@pytest.mark.parametrize("chain", ["add bias add", "region bias add", "add relu add"])
def test_a_same_shape_addend_after_the_chains_add_or_region_joins_the_store(chain):
    # the chain's own add step takes one addend, and none after a region: a later same-shape Add
    # starts a region instead (epilogue_rules.ADD_STEP), wherever the earlier add or region sits
    m, k, n = 6, 5, 7
    g = Graph()
    y = g.matmul_bt(g.input("x", [m, k]), g.parameter("w", [n, k]))
    first, middle, _ = chain.split()
    y = g.add(y, g.input("r", [m, n])) if first == "add" else g.mul(g.tanh(y), g.parameter("col", [m, 1]))
    y = g.bias_add(y, g.parameter("d", [n])) if middle == "bias" else g.relu(y)
    g.set_outputs([g.add(y, g.input("r2", [m, n]))])
    opt, _ = optimize(g)
    assert opt.dispatch_count() == 1, opt.summary()
    _same(opt, g)


def test_a_region_value_that_is_a_graph_output_is_stored():
    g = Graph()
    y = g.matmul(g.input("x", [6, 4]), g.parameter("w", [4, 3]))
    t = g.mul(g.tanh(y), g.input("r", [6, 3]))
    g.set_outputs([g.add(t, g.parameter("c", [1, 3])), t])
    opt, _ = optimize(g)
    outs = [opt.node(o) for o in opt.outputs]
    assert outs[1].op == "FusedMatMul" and _regions(opt), opt.summary()  # t: the product with its region
    _same(opt, g)


def test_a_product_other_kernels_read_keeps_its_own_store():
    g = Graph()
    y = g.matmul(g.input("x", [6, 4]), g.parameter("w", [4, 3]))
    g.set_outputs([g.tanh(g.mul(y, g.input("r", [6, 3]))), g.softmax(y)])  # softmax reads y from memory
    opt, _ = optimize(g)
    assert not _regions(opt), opt.summary()
    _same(opt, g)


def test_a_graph_with_regions_optimises_again():
    g = Graph()
    a, b, r = g.input("a", [3, 4]), g.parameter("b", [4, 5]), g.input("r", [1, 5])
    y = g.add_node("FusedMatMul", (a, b, r), variant="", epilogue=(REGION,))
    g.set_outputs([g.neg(y)])
    opt, _ = optimize(g)
    assert opt.dispatch_count() == 1, opt.summary()
    _same(opt, g)


def test_a_region_reading_more_than_a_kernel_binds_is_split():
    g = Graph()
    h = g.matmul(g.input("x", [5, 3]), g.parameter("w", [3, 4]))
    for i in range(8):  # eight distinct operands: the matmul binds x, w, out and at most 5 of them
        h = g.mul(h, g.input(f"r{i}", [5, 4]))
    g.set_outputs([h])
    opt, _ = optimize(g)
    # the part of the region that fits stays at the store, the rest is a Fused kernel on its output
    assert all(len(n.inputs) <= 7 for n in opt.live_nodes()), opt.summary()
    assert opt.dispatch_count() == 2 and _regions(opt), opt.summary()
    _same(opt, g)


def test_pp_lcnet_scale_hardswish_shift_folds_into_the_convolution():
    g = Graph()
    y = g.add_node("Conv", (g.input("x", [1, 3, 9, 7]), g.parameter("w", [8, 3, 3, 3]), g.parameter("b", [8])),
                   pads=[1, 1, 1, 1])
    c = [g.constant(np.float32(v), [1]) for v in (0.8, 0.1, 1.2, -0.3)]
    y = g.add(g.mul(g.add_node("HardSwish", (g.add(g.mul(y, c[0]), c[1]),)), c[2]), c[3])
    g.set_outputs([y])
    opt, _ = optimize(g)
    assert [n.op for n in opt.live_nodes() if opt.dispatches(n)] == ["FusedConv"], opt.summary()
    _same(opt, g)


def test_split_keeps_what_the_rest_reads_of_the_accumulator_whole():
    chain = ("expr", (("input", (), (0,)), ("input", (), (1,)), ("Mul", (), (0, 1)), ("input", (), (2,)),
                      ("Mul", (), (2, 3)), ("input", (), (3,)), ("Add", (), (4, 5))))
    head, head_reads, tail, tail_reads = split(chain, 2)
    assert head_reads == [1, 2] and tail_reads == [3]
    assert [s[0] for s in head[1]] == ["input", "input", "Mul", "input", "Mul"]
    assert tail[1] == (("input", (), (0,)), ("input", (), (1,)), ("Add", (), (0, 1)))
    # acc * r1 + acc: every part reading the accumulator is read again by the rest
    again = ("expr", (("input", (), (0,)), ("input", (), (1,)), ("Mul", (), (0, 1)), ("Add", (), (2, 0))))
    assert split(again, 1) is None
