"""Generated elementwise kernels (ir/ops/fused.py): the table of fusable ops, the Fused op's
expression checks, how regions are rebuilt (one op, literals, too many inputs), which regions
extraction picks (chains, a value read twice, values a non-elementwise op or the caller also
reads, broadcasts, mixed dtypes, the matmul epilogue), re-optimising a fused graph, the compile
cache's round trip and the e-graph's size. Values against the numpy reference of the unfused
graph (``eggfuse.ir.evaluate``); no GPU (tests/gpu/test_fused_regions.py runs them)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from eggfuse.ir import OPS, DType, Graph, GraphError, evaluate
from eggfuse.ir.ops.arithmetic import POINTWISE
from eggfuse.ir.ops.elementwise import UNARY
from eggfuse.ir.ops.fused import FUSABLE, MAX_INPUTS, add_fused, ops_of, wgsl_literal
from eggfuse.lowering import lower
from eggfuse.rewrites import optimize, random_feeds
from eggfuse.rewrites.rulesets import SCHEDULE, select

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL


def kernels(g: Graph) -> list[str]:
    return [d.kernel for d in lower(g).dispatches]


def same_values(before: Graph, after: Graph, seed: int = 0) -> None:
    inputs, params = random_feeds(before, seed)
    for w, g in zip(evaluate(before, inputs, params), evaluate(after, inputs, params), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, equal_nan=True)


def fuse(g: Graph):
    out, rep = optimize(g, verify=True)
    same_values(g, out)
    return out, rep


# --- the table -------------------------------------------------------------------------------


def test_every_elementwise_table_row_is_fusable():
    want = {r.name for r in POINTWISE} | {u.name for u in UNARY} | {f"{u.name}Grad" for u in UNARY if u.derivative}
    assert want | {"BiasAdd", "SwiGLU", "SwiGLUGradGate", "SwiGLUGradUp", "Expand", "BroadcastTo"} == set(FUSABLE)
    for name, f in FUSABLE.items():
        assert OPS[name].min_inputs == f.arity == len(f.example_dtypes), name


@pytest.mark.parametrize("value", [0.5, 1.0, -2.0, 0.1, 1e-5, -1e-30, 3.4028234663852886e38, 1e-45, 0.0, -0.0])
def test_f32_literals_are_exact(value):
    text = wgsl_literal(value, F32)
    parsed = float(text.strip("()").removesuffix("f"))
    assert np.float32(parsed) == np.float32(value) and np.signbit(parsed) == np.signbit(value)
    assert float(np.float32(parsed)) == parsed  # the decimal is the f32 value itself, not a neighbour


def test_special_and_integer_literals():
    assert wgsl_literal(float("inf"), F32) == "bitcast<f32>(0x7f800000u)"
    assert wgsl_literal(float("nan"), F32).startswith("bitcast<f32>(0x7fc")
    assert (wgsl_literal(-(2**31), I32), wgsl_literal(-3, I32), wgsl_literal(7, I32)) == \
        ("bitcast<i32>(0x80000000u)", "(-3i)", "7i")
    assert (wgsl_literal(True, BOOL), wgsl_literal(False, BOOL)) == ("1u", "0u")


# --- the op --------------------------------------------------------------------------------


def _inp(i):
    return ("input", (), (i,))


@pytest.mark.parametrize(("steps", "message"), [
    ((), "non-empty tuple"),
    ((_inp(0),), "last step must be an op"),
    ((_inp(0), ("Add", (), (0, 1))), "takes 2 earlier steps"),
    ((_inp(0), ("MatMul", (), (0, 0))), "not an elementwise op"),
    ((_inp(0), _inp(0), ("Add", (), (0, 1))), "read twice"),
    ((_inp(0), ("Neg", (), (0,))), "inputs are not read"),
    ((_inp(0), _inp(1), ("Add", (), (0, 1))), "do not broadcast"),
])
def test_a_malformed_region_is_refused_naming_the_step(steps, message):
    g = Graph()
    a, b = g.input("a", [3, 4]), g.input("b", [5, 4])
    ins = (a,) if "inputs are not read" not in message else (a, b)
    if message == "do not broadcast":
        ins = (a, b)
    with pytest.raises(GraphError, match=message):
        g.add_node("Fused", ins, expr=steps)


def test_a_region_of_one_op_is_that_op():
    g = Graph()
    x, y = g.input("x", [3, 4]), g.input("y", [4])
    node = g.node(add_fused(g, (_inp(0), _inp(1), ("Max", (), (0, 1))), [x, y]))
    assert (node.op, node.inputs) == ("Max", (x, y))
    node = g.node(add_fused(g, (_inp(0), ("Cast", (("to", "i32"),), (0,))), [x]))
    assert (node.op, node.attrs["to"], node.type.dtype) == ("Cast", "i32", I32)


def test_one_element_constants_become_literals():
    g = Graph()
    x, half, two = g.input("x", [3, 4]), g.constant(0.5), g.constant(np.full((1, 1), 2.0), shape=[1, 1])
    wide = g.constant(np.arange(4.0))  # four elements: still an input
    steps = (_inp(0), _inp(1), ("Mul", (), (0, 1)), _inp(2), ("Pow", (), (2, 3)), _inp(3), ("Add", (), (4, 5)))
    nid = add_fused(g, steps, [x, half, two, wide])
    node = g.node(nid)
    assert node.op == "Fused" and node.inputs == (x, wide) and node.type.shape == (3, 4)
    assert [s[0] for s in node.attrs["expr"]].count("const") == 2
    ref = Graph()
    rx = ref.input("x", [3, 4])
    r = ref.add(ref.add_node("Pow", (ref.mul(rx, ref.constant(0.5)), ref.constant(np.full((1, 1), 2.0), shape=[1, 1]))),
                ref.constant(np.arange(4.0)))
    ref.set_outputs([r])
    g.set_outputs([nid])
    same_values(ref, g)


def test_a_region_reading_more_than_a_dispatch_binds_is_split():
    g = Graph()
    xs = [g.input(f"x{i}", [2, 3]) for i in range(11)]
    steps = [_inp(i) for i in range(11)]
    acc = 0
    for i in range(1, 11):  # ((x0 * x1) + x2) * x3 ...: a chain reading 11 tensors
        steps.append(("Mul" if i % 2 else "Add", (), (acc, i)))
        acc = len(steps) - 1
    nid = add_fused(g, tuple(steps), xs)
    g.set_outputs([nid])
    fused = [n for n in g.live_nodes() if n.op == "Fused"]
    assert len(fused) == 2 and all(len(n.inputs) <= MAX_INPUTS for n in fused)
    ref = Graph()
    rs = [ref.input(f"x{i}", [2, 3]) for i in range(11)]
    v = rs[0]
    for i in range(1, 11):
        v = ref.mul(v, rs[i]) if i % 2 else ref.add(v, rs[i])
    ref.set_outputs([v])
    same_values(ref, g)


# --- extraction ---------------------------------------------------------------------------------


def test_a_chain_is_one_kernel_named_by_its_ops():
    g = Graph()
    x, b = g.input("x", [5, 7]), g.input("b", [1, 7])
    g.set_outputs([g.mul(g.add_node("Erf", (g.add(x, b),)), g.constant(0.5))])
    out, rep = fuse(g)
    assert (rep.dispatches_before, rep.dispatches_after) == (3, 1)
    assert kernels(out) == ["fused:Add,Erf,Mul"]


def test_a_value_two_ops_of_a_region_read_is_computed_once_in_it():
    # a GELU-shaped chain after a matmul (1.5, not sqrt 2, so the recognition rules leave it a chain):
    # h feeds Div and the first Mul; s = h / 1.5 feeds nothing else
    g = Graph()
    h = g.matmul(g.input("x", [4, 6]), g.parameter("w", [6, 5]))
    e = g.add_node("Erf", (g.add_node("Div", (h, g.constant(1.5))),))
    g.set_outputs([g.mul(g.mul(h, g.add(e, g.constant(1.0))), g.constant(0.5))])
    out, rep = fuse(g)
    # the region runs at the matmul's store (ir/ops/fused_epilogue.py), reading the product once
    assert (rep.dispatches_before, rep.dispatches_after) == (6, 1)
    (mm,) = [n for n in out.live_nodes() if n.op == "FusedMatMul"]
    ((kind, steps),) = mm.attrs["epilogue"]
    assert sorted(ops_of(steps)) == ["Add", "Div", "Erf", "Mul", "Mul"] and len(mm.inputs) == 2
    assert [s for s in steps if s[0] == "input"] == [("input", (), (0,))]


def test_an_intermediate_the_caller_reads_is_stored_once_and_read():
    g = Graph()
    x, y = g.input("x", [3, 8]), g.input("y", [3, 8])
    t = g.add_node("Sub", (x, y))
    g.set_outputs([g.neg(g.add_node("Exp", (t,))), t])
    out, rep = fuse(g)
    assert (rep.dispatches_before, rep.dispatches_after) == (3, 2)
    assert Counter(kernels(out)) == Counter({"binary_Sub": 1, "fused:Exp,Neg": 1})


def test_an_intermediate_a_norm_also_reads_is_a_region_boundary():
    # a residual stream: h is read by RmsNorm and by the next residual add, so it is stored, and the
    # next region reads it rather than computing it again
    g = Graph()
    x, a, b = g.input("x", [4, 8]), g.input("a", [4, 8]), g.input("b", [4, 8])
    h = g.add(x, a)
    n = g.rms_norm(h, g.parameter("w", [8]))
    g.set_outputs([g.relu(g.add(h, g.mul(n, b)))])
    out, rep = fuse(g)
    (region,) = [n_ for n_ in out.live_nodes() if n_.op == "Fused"]
    assert ops_of(region.attrs["expr"]) == ["Mul", "Add", "Relu"]
    assert [out.node(i).op for i in region.inputs] == ["Add", "RmsNorm", "Input"]  # h, stored by its Add
    assert rep.dispatches_after == 3


def test_a_value_only_elementwise_ops_read_may_be_computed_in_each_region():
    g = Graph()
    x, y = g.input("x", [3, 8]), g.input("y", [3, 8])
    t = g.add(x, y)  # read by two regions and nothing else: each computes it
    g.set_outputs([g.neg(t), g.add_node("Exp", (t,))])
    out, rep = fuse(g)
    assert (rep.dispatches_before, rep.dispatches_after) == (3, 2)
    assert sorted(kernels(out)) == ["fused:Add,Exp", "fused:Add,Neg"]


@pytest.mark.parametrize("shapes", [([6, 1], [1, 9]), ([1, 9], [6, 9]), ([], [6, 9]), ([2, 1, 3, 1], [1, 4, 1, 5])])
def test_broadcasting_regions(shapes):
    g = Graph()
    a, b = g.input("a", shapes[0]), g.input("b", shapes[1])
    g.set_outputs([g.add_node("Tanh", (g.mul(g.add_node("Sub", (a, b)), b),))])
    out, rep = fuse(g)
    assert rep.dispatches_after == 1 and out.node(out.outputs[0]).type == g.node(g.outputs[0]).type


def test_a_comparison_feeding_where_is_one_kernel():
    g = Graph()
    x, y = g.input("x", [5, 6]), g.input("y", [1, 6])
    mask = g.add_node("Less", (x, y))
    w = g.add_node("Where", (mask, g.add_node("Cast", (g.add_node("Cast", (x,), to="i32"),), to="f32"), y))
    g.set_outputs([g.add_node("Cast", (g.add_node("Not", (mask,)),), to="f32"), w])
    out, rep = fuse(g)
    assert rep.dispatches_after == 2  # mask is read by two regions: each computes it


def test_the_matmul_epilogue_still_takes_what_it_can():
    g = Graph()
    y = g.gelu(g.bias_add(g.matmul(g.input("x", [4, 6]), g.parameter("w", [6, 5])), g.parameter("b", [5])))
    g.set_outputs([y])
    out, rep = fuse(g)
    assert rep.dispatches_after == 1 and [n.op for n in out.live_nodes() if OPS[n.op].dispatches] == ["FusedMatMul"]


def test_a_recognised_op_wins_a_tie_with_its_region():
    g = Graph()
    gate, up = g.input("g", [3, 4]), g.input("u", [3, 4])
    g.set_outputs([g.mul(g.silu(gate), up)])
    out, _ = fuse(g)
    assert [n.op for n in out.live_nodes() if OPS[n.op].dispatches] == ["SwiGLU"]


def test_a_fused_graph_optimises_again_to_itself():
    g = Graph()
    x, b = g.input("x", [5, 7]), g.input("b", [7])
    g.set_outputs([g.add_node("Where", (g.add_node("Less", (x, g.constant(0.0))), g.neg(g.add(x, b)),
                                        g.constant(2.0)))])
    once, rep1 = fuse(g)
    twice, rep2 = fuse(once)
    assert rep1.dispatches_after == rep2.dispatches_after == 1
    assert [n.attrs["expr"] for n in twice.live_nodes() if n.op == "Fused"] == \
        [n.attrs["expr"] for n in once.live_nodes() if n.op == "Fused"]
    same_values(g, twice)


def test_a_fused_graph_round_trips_through_the_compile_cache():
    from eggfuse.cache import decode_graph, encode_graph

    g = Graph()
    x = g.input("x", [5, 7])
    g.set_outputs([g.add_node("Erf", (g.mul(x, g.constant(0.25)),))])
    out, _ = fuse(g)
    back = decode_graph(encode_graph(out))
    assert [(n.op, n.attrs.get("expr")) for n in back.live_nodes()] == \
        [(n.op, n.attrs.get("expr")) for n in out.live_nodes()]


def test_the_egraph_grows_linearly_with_the_regions():
    # a chain of 60 elementwise ops: a Fused and an Ex e-node per op, an ExLeaf per tensor read
    g = Graph()
    v, y = g.input("x", [4, 4]), g.input("y", [4, 4])
    for i in range(60):
        v = g.add(v, y) if i % 3 == 0 else g.neg(v) if i % 3 == 1 else g.add_node("Exp", (v,))
    g.set_outputs([v])
    out, rep = optimize(g)
    assert rep.saturated and rep.enodes <= 4 * 62 and rep.eclasses <= 3 * 62
    # and it splits into kernels of at most MAX_INPUTS inputs, here one (x and y are the only tensors)
    assert rep.dispatches_after == 1


def _decomposed_rms_residuals(layers: int) -> Graph:
    # h = h + a_i; n = h * (1 / sqrt(mean(h^2) + eps)) * w: h is read by Pow, Mul and the next Add only
    g = Graph()
    h = g.input("x", [4, 8])
    for i in range(layers):
        h = g.add(h, g.input(f"a{i}", [4, 8]))
        ms = g.add_node("ReduceMean", (g.add_node("Pow", (h, g.constant(2.0))),), axes=(1,))
        inv = g.add_node("Recip", (g.add_node("Sqrt", (g.add(ms, g.constant(1e-6)),)),))
        h = g.add(h, g.mul(g.mul(h, inv), g.parameter(f"w{i}", [8])))
    g.set_outputs([h])
    return g


def test_values_computed_twice_do_not_nest():
    from eggfuse.ir.ops.fused import stored_uses

    g = _decomposed_rms_residuals(4)
    stored = stored_uses(g)
    stream = [n.id for n in g.live_nodes() if n.op == "Add" and g.node(n.inputs[0]).op in ("Input", "Add")
              and g.node(n.inputs[1]).op == "Input"]
    # every residual value is read by three elementwise ops; the first may be computed in each, the
    # next must then be read (computing it would compute the first), and so on alternately
    assert [stored.get(i, 0) for i in stream[:3]] == [0, 3, 0]
    # so the work computed twice stays linear in the layers: with every such value inline, 8 layers'
    # regions held 268 ops (of 64), split into 32 kernels
    g = _decomposed_rms_residuals(8)
    # without the recognition ruleset, which would make each decomposed RMSNorm one RmsNorm
    out, rep = optimize(g, rulesets=select([n for n in SCHEDULE if n != "recognition"]), verify=True)
    same_values(g, out)
    ops = sum(len(ops_of(n.attrs["expr"])) if n.op == "Fused" else n.op in FUSABLE for n in out.live_nodes())
    assert ops <= 1.5 * sum(n.op in FUSABLE for n in g.live_nodes()) and rep.dispatches_after == 21


def test_an_expand_between_elementwise_ops_is_inside_the_region():
    # a mask built from a [1, N] row, expanded to [B, M, N] (as exporters spell it), picks between two inputs
    g = Graph()
    x, y, row = g.input("x", [2, 3, 5]), g.input("y", [2, 3, 5]), g.input("row", [1, 5])
    mask = g.add_node("Expand", (g.add_node("Less", (row, g.constant(0.0))),), shape=(2, 3, 5))
    g.set_outputs([g.add_node("Where", (mask, x, g.neg(y)))])
    out, rep = fuse(g)
    assert (rep.dispatches_before, rep.dispatches_after) == (4, 1)
    assert kernels(out) == ["fused:Less,Expand,Neg,Where"]
