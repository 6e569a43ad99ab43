"""Recognition of fused ops in exported chains (ir/ops/recognize.py, recognize_norms.py), on
the numpy reference: the ``value`` facts rules read constants by, which chains become which
op, the shapes and operand orders that must not be recognised, and the e-graph's size."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops.recognize import Pattern, gelu_patterns, gelu_tanh_patterns
from eggfuse.ir.ops.recognize_norms import norm_patterns
from eggfuse.rewrites import make_ruleset, optimize


def _times_one(e):
    x, c = e.vars("x c")
    # Mul(x, c) -> Neg(Neg(x)) when c is the scalar constant 1 (a rule reading the value fact)
    yield e.equal("Mul(x, 1) -> Neg(Neg(x)) (test)", e.Mul(x, c), e.Neg(e.Neg(x)), e.value(c, e.f64(1.0)))


@pytest.mark.parametrize("leaf,fires", [("constant []", True), ("constant [1, 1]", True), ("constant of 2", False),
                                        ("constant 2.0", False), ("parameter", False)])
def test_a_one_element_constant_has_a_scalar_fact(leaf, fires):
    g = Graph()
    x = g.input("x", [3, 2])
    c = {"constant []": lambda: g.constant(np.float32(1.0), shape=()),
         "constant [1, 1]": lambda: g.constant(np.ones((1, 1), np.float32), shape=(1, 1)),
         "constant of 2": lambda: g.constant(np.ones(2, np.float32), shape=(2,)),
         "constant 2.0": lambda: g.constant(np.float32(2.0), shape=()),
         "parameter": lambda: g.parameter("c", [1])}[leaf]()
    g.set_outputs([g.mul(x, c)])
    _, rep = optimize(g, rulesets=[make_ruleset("scalar_for_test", _times_one)])
    assert bool(rep.rules_fired.get("Mul(x, 1) -> Neg(Neg(x)) (test)")) is fires


def test_the_value_fact_holds_of_one_element_f32_constants_only():
    from eggfuse.ir.facts import facts_of

    g = Graph()
    nodes = [g.constant(np.float32(1e-12), shape=()), g.constant(np.int32(3), shape=(1,), dtype=DType.I32),
             g.constant(np.ones(3, np.float32)), g.constant(np.float32(np.inf), shape=())]
    values = [dict((f.name, a) for f, a in facts_of(g.node(n).attrs["value"], g.node(n).type)).get("value")
              for n in nodes]
    assert values == [(float(np.float32(1e-12)),), None, None, (np.inf,)]


# --- every pattern variant, extracted -----------------------------------------------------------

VARIANTS = ([(p, "Gelu") for p in gelu_patterns()] + [(p, "GeluTanh") for p in gelu_tanh_patterns()]
            + [(p, "RmsNorm") for p, _ in norm_patterns(False)] + [(p, "LayerNorm") for p, _ in norm_patterns(True)])


def _dims(**sizes):
    return lambda name, lo=1, hi=7: sizes.get(name, 3)


@pytest.mark.parametrize("pattern,op", VARIANTS, ids=[f"{op}:{p.name()}" for p, op in VARIANTS])
def test_every_variant_becomes_its_op_in_the_extracted_graph(pattern: Pattern, op: str):
    g = Graph()
    pattern.example().build(g, _dims(rank=3, d0=2, d1=5, n=7))
    out, rep = optimize(g, verify=True)
    ops = [n.op for n in out.live_nodes() if n.op not in ("Input", "Constant")]
    assert ops == [op], ops
    assert sum(len(c) for c in rep.recognised[op]) == len(g.live_nodes()) - 1 - sum(
        n.op == "Constant" for n in g.live_nodes())


# --- what must not be recognised -------------------------------------------------------------------


def _c(g, v, shape=()):
    return g.constant(np.float32(v), shape=shape)


def _rms(g, x, axis: int | None = None, eps_shape=(), eps_after_sqrt=False):
    rank = len(g.node(x).type.shape)
    ms = g.add_node("ReduceMean", [g.add_node("Pow", [x, _c(g, 2.0)])], axes=(rank - 1 if axis is None else axis,),
                    keepdims=True)
    if eps_after_sqrt:
        den = g.add(g.add_node("Sqrt", [ms]), _c(g, 1e-6, eps_shape))
    else:
        den = g.add_node("Sqrt", [g.add(ms, _c(g, 1e-6, eps_shape))])
    return g.mul(x, g.add_node("Recip", [den]))


SQRT2 = float(np.sqrt(2.0))


def _gelu(g, x, half=0.5, sqrt2=SQRT2):
    p = g.add(g.add_node("Erf", [g.add_node("Div", [x, _c(g, sqrt2)])]), _c(g, 1.0))
    return g.mul(g.mul(x, p), _c(g, half))


def _ops_of(g) -> list[str]:
    out, _ = optimize(g, verify=True)
    return sorted(n.op for n in out.live_nodes() if n.op not in ("Input", "Parameter", "Constant", "Identity"))


@pytest.mark.parametrize("case", ["first axis", "eps after sqrt", "eps of higher rank"])
def test_a_different_function_is_not_an_rms_norm(case):
    g = Graph()
    x = g.input("x", [5, 7])
    g.set_outputs([_rms(g, x, axis=0 if case == "first axis" else None, eps_after_sqrt=case == "eps after sqrt",
                        eps_shape=(1, 1, 1) if case == "eps of higher rank" else ())])
    assert "RmsNorm" not in _ops_of(g)


@pytest.mark.parametrize("half,sqrt2", [(0.6, SQRT2), (0.5, 1.414), (0.5, 2.0)])
def test_other_constants_are_not_a_gelu(half, sqrt2):
    g = Graph()
    g.set_outputs([_gelu(g, g.input("x", [5, 7]), half, sqrt2)])
    assert "Gelu" not in _ops_of(g)


@pytest.mark.parametrize("w_shape", [[1, 7], [5, 7], [1]])
def test_a_weight_that_is_not_per_column_stays_a_mul(w_shape):
    g = Graph()
    x = g.input("x", [5, 7])
    g.set_outputs([g.mul(_rms(g, x), g.parameter("w", w_shape))])
    assert _ops_of(g) == ["Mul", "RmsNorm"]


def test_a_shared_mean_and_a_normalised_output_stay_computed():
    # the mean is also an output, and so is the LayerNorm before its weight: both stay, the
    # LayerNorm with weight and bias is one op
    g = Graph()
    x = g.input("x", [2, 5, 7])
    mean = g.add_node("ReduceMean", [x], axes=(2,), keepdims=True)
    d = g.add_node("Sub", [x, mean])
    var = g.add_node("ReduceMean", [g.mul(d, d)], axes=(2,), keepdims=True)
    normed = g.add_node("Div", [d, g.add_node("Sqrt", [g.add(var, _c(g, 1e-5))])])
    y = g.add(g.mul(normed, g.parameter("w", [7])), g.parameter("b", [7]))
    g.set_outputs([y, mean, normed])
    out, rep = optimize(g, verify=True)
    by_output = [out.node(o).op for o in out.outputs]
    assert by_output[0] == "LayerNorm" and by_output[1] == "ReduceMean"
    assert out.dispatch_count() <= 3, [n.op for n in out.live_nodes()]


# --- the e-graph stays small ---------------------------------------------------------------------


def _exported_layers(layers: int) -> Graph:
    """A stack of decomposed LayerNorm -> MatMul -> erf-GELU -> MatMul blocks over [1, 9, 16]."""
    g = Graph()
    x = g.input("x", [1, 9, 16])
    for i in range(layers):
        mean = g.add_node("ReduceMean", [x], axes=(2,), keepdims=True)
        d = g.add_node("Sub", [x, mean])
        var = g.add_node("ReduceMean", [g.add_node("Pow", [d, _c(g, 2.0)])], axes=(2,), keepdims=True)
        normed = g.add_node("Div", [d, g.add_node("Sqrt", [g.add(var, _c(g, 1e-12))])])
        h = g.add(g.mul(normed, g.parameter(f"w{i}", [16])), g.parameter(f"b{i}", [16]))
        up = g.reshape(g.matmul(g.reshape(h, [9, 16]), g.parameter(f"u{i}", [16, 24])), [1, 9, 24])
        act = _gelu(g, g.add(g.parameter(f"ub{i}", [24]), up))
        x = g.add(x, g.reshape(g.matmul(g.reshape(act, [9, 24]), g.parameter(f"d{i}", [24, 16])), [1, 9, 16]))
    g.set_outputs([x])
    return g


def test_the_e_graph_grows_linearly_with_the_layers():
    sizes = {}
    for layers in (2, 8):
        out, rep = optimize(_exported_layers(layers), verify=True)
        assert rep.saturated and {"LayerNorm", "FusedMatMul"} <= {n.op for n in out.live_nodes()}
        sizes[layers] = (rep.phases["insert"].enodes, rep.enodes)
    (n2, e2), (n8, e8) = sizes[2], sizes[8]
    # at most five times the input's e-nodes: elementwise_fusion adds a Fused and an Ex e-node per
    # elementwise op and an ExLeaf per tensor they read, recognition a few per chain
    assert e2 <= 5 * n2 and e8 <= 5 * n8, sizes
    assert (e8 - e2) / 6 <= 1.1 * e2 / 2, sizes  # each layer adds what one layer holds: no blow-up


# --- the report: which recognised ops the plan holds, and what they replaced ----------------------


def _onnx_layer_norm_model():
    """torch.onnx's LayerNorm before opset 17 (9 nodes and 2 Constants), then a MatMul + bias."""
    from onnx import helper, numpy_helper
    from onnx_models import F, model, node  # tests/onnx_models.py

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32)))

    nodes = [node("ReduceMean", ["x"], ["mu"], name="ln/mean", axes=[-1]),
             node("Sub", ["x", "mu"], ["d"], name="ln/sub"),
             const("two", 2.0), node("Pow", ["d", "two"], ["sq"], name="ln/pow"),
             node("ReduceMean", ["sq"], ["var"], name="ln/var", axes=[-1]), const("eps", 1e-12),
             node("Add", ["var", "eps"], ["ve"], name="ln/add"), node("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
             node("Div", ["d", "sd"], ["n"], name="ln/div"), node("Mul", ["n", "w"], ["nw"], name="ln/mul"),
             node("Add", ["nw", "b"], ["y"], name="ln/add_1"), node("MatMul", ["y", "W"], ["z"], name="dense/matmul"),
             node("Add", ["bd", "z"], ["out"], name="dense/add")]
    rng = np.random.default_rng(3)
    inits = [(k, rng.standard_normal(s).astype(np.float32)) for k, s in (("w", [13]), ("b", [13]), ("W", [13, 5]),
                                                                          ("bd", [5]))]
    return model(nodes, [("x", F, [1, 7, 13])], [("out", F, None)], inits, opset=14)


def test_the_importer_names_the_onnx_node_of_every_graph_node():
    from eggfuse.onnx.importer import Importer

    imp = Importer(_onnx_layer_norm_model(), {}, {})
    g, _, _ = imp.run()
    by_name: dict[str, list[str]] = {}
    for n in g.live_nodes():
        if n.op not in ("Input", "Parameter", "Constant"):
            by_name.setdefault(imp.origin[n.id], []).append(n.op)
    assert by_name["ln/div"] == ["Div"] and by_name["dense/add"] == ["Add"]
    assert sorted(by_name["dense/matmul"]) == ["Identity", "Identity", "MatMul"]  # the 2-D product and its views


def test_report_counts_the_nodes_each_recognised_op_replaced(tmp_path, capsys):
    import json

    from eggfuse import cli
    from eggfuse.ir.ops.matmul_kernel import GEMV_MAX_ROWS
    from eggfuse.onnx.importer import Importer
    from eggfuse.rewrites.rulesets import select

    imp = Importer(_onnx_layer_norm_model(), {}, {})
    g, _, _ = imp.run()
    # with the optional LayerNorm prologue the norm (7 rows, more than GEMV_MAX_ROWS) is the product's prologue
    _, rep = optimize(g, verify=True, rulesets=select(optional=["layer_norm_prologue"]))
    assert 7 > GEMV_MAX_ROWS and "FusedLayerNormMatMul(bias) x1 from 11 ONNX nodes" in rep.recognised_line(imp.origin)
    _, rep = optimize(g, verify=True)
    (cone,) = rep.recognised["LayerNorm"]
    assert sorted({imp.origin[i] for i in cone}) == sorted(
        ["ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add", "ln/sqrt", "ln/div", "ln/mul", "ln/add_1"])
    assert {imp.origin[i] for i in rep.recognised["FusedMatMul(bias)"][0]} == {"dense/matmul", "dense/add"}
    assert "LayerNorm x1 from 9 ONNX nodes" in rep.recognised_line(imp.origin)
    assert "LayerNorm x1 from 9 nodes" in rep.summary()
    assert type(rep).from_dict(json.loads(json.dumps(rep.to_dict()))).recognised == rep.recognised  # as cached

    path = tmp_path / "ln.onnx"
    path.write_bytes(_onnx_layer_norm_model().SerializeToString())
    assert cli.main(["optimize", str(path)]) == 0
    assert "recognised and fused ops: FusedMatMul(bias) x1 from 2 ONNX nodes, LayerNorm x1 from 9 ONNX nodes" in \
        capsys.readouterr().out
    assert cli.main(["optimize", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recognised"] == {
        "LayerNorm": {"count": 1, "onnx_nodes": 9}, "FusedMatMul(bias)": {"count": 1, "onnx_nodes": 2}}
    assert cli.main(["optimize", str(path), "--json", "--with-ruleset", "layer_norm_prologue"]) == 0
    assert json.loads(capsys.readouterr().out)["recognised"] == {"FusedLayerNormMatMul(bias)": {"count": 1,
                                                                                               "onnx_nodes": 11}}


def test_report_has_no_recognised_ops_for_a_graph_left_as_it_was():
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [3, 4]))])
    _, rep = optimize(g)
    assert rep.recognised == {} and rep.recognised_line() == "none"


def test_a_lossless_cast_chain_is_removed_and_a_lossy_one_kept():
    g = Graph()
    a, b = g.input("a", [4, 5]), g.input("b", [4, 5])
    mask = g.add_node("Less", [a, b])
    there_and_back = g.add_node("Cast", [g.add_node("Cast", [mask], to="f32")], to="bool")
    lossy = g.add_node("Cast", [g.add_node("Cast", [a], to="i32")], to="f32")  # truncates: stays
    g.set_outputs([g.add_node("Where", [there_and_back, a, b]), lossy])
    out, _ = optimize(g, verify=True)
    ops = [s[0] for n in out.live_nodes() for s in (n.attrs["expr"] if n.op == "Fused" else [(n.op,)])]
    assert ops.count("Cast") == 2  # the lossy pair, in a generated kernel or not
    where = out.node(out.outputs[0])  # Where reads the mask itself, the cast pair gone
    assert out.node(where.inputs[0]).op == "Less" or (where.op == "Fused" and "Cast" not in {
        s[0] for s in where.attrs["expr"]})


def test_report_origins_map_each_optimised_node_to_the_nodes_it_computes():
    import json
    import pickle

    from eggfuse.ir import DeviceLimitError
    from eggfuse.onnx.importer import Importer, with_onnx_nodes

    proto = _onnx_layer_norm_model()
    imp = Importer(proto, {}, {})
    g, _, _ = imp.run()
    out, rep = optimize(g, verify=True)
    by_op = {out.node(i).op: {imp.origin[n] for n in ids} for i, ids in rep.origins.items()}
    assert by_op["LayerNorm"] == {"ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add", "ln/sqrt", "ln/div", "ln/mul",
                                  "ln/add_1"}
    assert by_op["FusedMatMul"] == {"dense/matmul", "dense/add"}
    assert all(g.node(n).op not in ("Input", "Parameter", "Constant") for ids in rep.origins.values() for n in ids)
    assert not {i for i in rep.origins if out.node(i).op in ("Input", "Parameter")}
    assert type(rep).from_dict(json.loads(json.dumps(rep.to_dict()))).origins == rep.origins  # as cached (int keys)

    # an error about the product (as pipeline.compile sets its sources) names its two ONNX nodes; pickled whole
    product = next(i for i in rep.origins if out.node(i).op == "FusedMatMul")
    err = DeviceLimitError("too big", nodes=(product,), sources=rep.origins[product])
    named = with_onnx_nodes(err, imp.origin, proto.graph)
    assert type(named) is DeviceLimitError and named.nodes == (product,) and named.sources == err.sources
    assert str(named) == "too big [ONNX nodes 'dense/matmul' (MatMul), 'dense/add' (Add)]"
    back = pickle.loads(pickle.dumps(named))
    assert (type(back), str(back), back.nodes, back.sources) == (DeviceLimitError, str(named), named.nodes,
                                                                 named.sources)
    assert with_onnx_nodes(DeviceLimitError("none"), imp.origin, proto.graph).nodes == ()  # names nothing: as it was
    shown = with_onnx_nodes(DeviceLimitError("many", sources=sorted(imp.origin)), imp.origin, proto.graph, shown=2)
    assert str(shown).endswith("), ..., 'dense/add' (Add); 11 in all]"), str(shown)  # the first and the last

    # no rules: every op of the extracted graph stands for one node of the same op; a view (which the input graph's
    # views are not listed as) for what its reader computes
    kept, rep = optimize(g, rulesets=[])
    computing = [n for n in kept.live_nodes() if n.op not in ("Input", "Parameter", "Constant", "Identity")]
    views = [n for n in kept.live_nodes() if n.op == "Identity"]
    assert len(computing) == 11 and sorted(rep.origins) == sorted(n.id for n in computing + views)
    assert all(len(rep.origins[n.id]) == 1 and g.node(rep.origins[n.id][0]).op == n.op for n in computing)


def test_report_origins_give_each_input_node_to_one_layer_and_none_to_leaves():
    # 4 blocks of h = h + Relu(h @ w) on [2, 3, 8] (the product on a [6, 8] view, as exporters write it): the
    # residual sums are computed in another form (2-D, by the products' epilogues), so a walk through what the
    # extracted graph does not compute would reach every earlier layer; each layer's nodes go to one node
    g = Graph()
    h = g.input("x", [2, 3, 8])
    layer_of: dict[int, int] = {}
    for layer in range(4):
        first = len(g.nodes)
        p = g.reshape(g.matmul(g.reshape(h, [6, 8]), g.parameter(f"w{layer}", [8, 8])), [2, 3, 8])
        h = g.add(h, g.relu(p))
        layer_of.update(dict.fromkeys(range(first, len(g.nodes)), layer))
    g.set_outputs([h])
    out, rep = optimize(g, verify=True)
    for nid, ids in rep.origins.items():
        layers = {layer_of[i] for i in ids}
        assert max(layers) - min(layers) <= 1, (out.node(nid).op, ids)  # its own layer (and the sum it reads)
    assert sum(len(v) for k, v in rep.origins.items() if out.node(k).op != "Identity") <= 2 * len(layer_of)

    # Neg(Neg(x)) is x: the Input computes no op of the input graph
    g = Graph()
    x = g.input("x", [3, 4])
    g.set_outputs([g.relu(g.neg(g.neg(x)))])
    out, rep = optimize(g)
    assert all(out.node(i).op not in ("Input", "Parameter") for i in rep.origins), rep.origins


def test_report_origins_of_an_exported_decoder_name_each_layers_own_onnx_nodes():
    # LLaMA's residual sums are 3-D Adds in the export and 2-D sums in the products' epilogues: each o_proj and
    # down_proj product is named by its MatMul and its residual Add (an e-class holding a view of the product's),
    # not by the layers before it nor left to its reader
    import re
    from pathlib import Path

    from eggfuse.onnx.importer import _load_proto, import_model

    path = Path(__file__).resolve().parent.parent / "data" / "exported" / "llama_tiny.classic.onnx"
    data = np.load(path.with_name("llama_tiny.npz"))
    shapes = {k.removeprefix("input."): list(v.shape) for k, v in data.items() if k.startswith("input.")}
    g, _, _, origin = import_model(_load_proto(path), shapes, {})
    out, rep = optimize(g)
    sums = [sorted(origin[i] for i in rep.origins[n.id]) for n in out.live_nodes()
            if n.op == "FusedMatMul" and "add" in n.attrs["epilogue"]]
    assert len(sums) == 4, sums
    for names in sums:  # e.g. '.../layers.0/Add' and '.../layers.0/self_attn/o_proj/MatMul'
        layers = {re.search(r"layers\.(\d+)/", x).group(1) for x in names}
        assert len(names) == 2 and len(layers) == 1, names
        assert re.search(r"/Add(_1)?$", names[0]) and names[1].endswith("_proj/MatMul"), names
    # the packed Q/K/V product (a new term, no input node's e-class) computes the norm and the three projections
    # its reader, the attention, would list with its mask and rotations
    packed = [sorted(origin[i] for i in rep.origins[n.id]) for n in out.live_nodes() if n.op == "FusedRmsNormMatMul"
              and any(out.node(r).op == "CausalAttentionRoPE" for r in range(n.id + 1, len(out.nodes))
                      if n.id in out.node(r).inputs)]
    assert len(packed) == 2, packed
    for names in packed:
        assert sum(x.endswith(("q_proj/MatMul", "k_proj/MatMul", "v_proj/MatMul")) for x in names) == 3, names
        assert all("input_layernorm/" in x or x.endswith("_proj/MatMul") for x in names), names
