"""The egglog-python internals eggfuse uses (rewrites/egglog_private.py), exercised one by one,
so that an egglog release which changes one of them fails here, naming it, rather than deep
inside an optimisation. The supported range is the pin in pyproject.toml (egglog >=14,<15)."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from egglog import EGraph

from eggfuse.ir import OPS, Graph, RewriteError
from eggfuse.rewrites import egglog_private
from eggfuse.rewrites.sorts import CONSTRUCTORS, shape


def test_installed_egglog_is_in_the_supported_range():
    major = int(metadata.version("egglog").split(".")[0])
    assert major == 14, f"egglog {metadata.version('egglog')} is installed; rewrites/egglog_private.py supports 14.x"


def test_declare_then_run_a_program_by_op_names():
    eg = EGraph()
    egglog_private.declare(eg, [CONSTRUCTORS["Input"], CONSTRUCTORS["Relu"], shape])
    egglog_private.run_program(eg, '(let $x (Input "x" (vec-of 2 3)))\n(let $y (Relu $x))\n'
                                   "(set (shape $y) (vec-of 2 3))")
    raw = egglog_private.serialize(eg)
    ops = sorted(n["op"] for n in raw["nodes"].values() if not n["op"].startswith(('"', "Vec")) and n["children"])
    assert "Relu" in ops and "Input" in ops
    assert any(d.get("let") == "$y" for d in raw["class_data"].values())


def test_a_recorded_program_replays():
    from egglog import bindings

    eg = EGraph(save_egglog_string=True)
    egglog_private.declare(eg, [CONSTRUCTORS["Input"], CONSTRUCTORS["Neg"]])
    egglog_private.run_program(eg, '(let $x (Input "x" (vec-of 4)))\n(let $y (Neg (Neg $x)))')
    text = eg.as_egglog_string
    assert "(let $y (Neg (Neg $x)))" in text
    bindings.EGraph().parse_and_run_program(text)


def test_serialisation_of_an_encoded_graph_names_every_e_class():
    from eggfuse.rewrites.encode import encode

    g = Graph()
    x = g.input("x", [3, 4])
    g.set_outputs([g.neg(x)])
    eg = EGraph()
    encode(g, eg)
    raw = egglog_private.serialize(eg)
    assert {"nodes", "class_data"} <= set(raw)
    assert {n["eclass"] for n in raw["nodes"].values()} <= set(raw["class_data"])


def _tiny_serialised_graph() -> tuple[Graph, object, dict]:
    # one node of each argument kind the decoder reads: i64, f64, String, Bool and json attributes,
    # Vec[i64] leaf shapes, a TList (Concat and the outputs) and an Epi chain (bias, act)
    from eggfuse.rewrites.encode import encode

    g = Graph()
    x, w, b = g.input("x", [2, 4]), g.parameter("w", [4, 4]), g.parameter("b", [4])
    y = g.add_node("FusedMatMul", (x, w, b), variant="", epilogue=("bias", "Gelu"))
    z = g.rms_norm(y, b, eps=1e-6)
    c = g.concat([z, x], axis=1)
    r = g.rope(x, 100.0, 2, scaling=("linear", 2.0))
    dq = g.add_node("AttentionGradQ", (x, x, x, x), causal=True, num_heads=1, num_kv_heads=1, head_dim=4)
    g.set_outputs([c, r, dq])
    eg = EGraph()
    enc = encode(g, eg)
    return g, enc, egglog_private.serialize(eg)


def test_the_serialisation_format_the_decoder_reads():
    # rewrites/problem.py, engine.py and soundness.py read these details of egglog's JSON; a
    # release that changes one fails here, naming it
    from eggfuse.rewrites.sorts import ARG_SORTS

    g, enc, raw = _tiny_serialised_graph()
    nodes, data = raw["nodes"], raw["class_data"]
    for nid, n in nodes.items():
        assert {"op", "children", "eclass"} <= set(n), f"e-node {nid} lacks op/children/eclass: {n}"
        assert n["eclass"] in data, f"e-node {nid}'s e-class {n['eclass']} is not in class_data"
    # e-class data: the sort under "type", the let name of a let-bound e-class under "let"
    lets = {d["let"]: d["type"] for d in data.values() if "let" in d}
    assert all("type" in d for d in data.values()), "class_data entries lack 'type' (the e-class's sort)"
    assert {f"$n{n.id}" for n in g.live_nodes()} <= set(lets) and lets["$outputs"] == "TList", \
        f"class_data 'let' keys do not name the encoded lets: {sorted(lets)}"
    sorts = {d["type"] for d in data.values()}
    assert sorts >= {"T", "Epi", "TList", "i64", "f64", "String", "bool", "Vec[i64]"}, f"class_data sorts: {sorts}"
    # literals: ids "primitive-<sort>-..." without children, their value as text in "op"
    prims = {nid: n for nid, n in nodes.items() if nid.startswith("primitive-")}
    assert all(not n["children"] for nid, n in prims.items() if not nid.startswith("primitive-Vec")), \
        "a primitive- e-node that is not a Vec has children"
    ops = {data[n["eclass"]]["type"]: set() for n in prims.values()}
    for n in prims.values():
        ops[data[n["eclass"]]["type"]].add(n["op"])
    assert {"1", "2", "4"} <= ops["i64"] and {float(o) for o in ops["f64"]} == {1e-6, 100.0}, \
        f"i64 / f64 literals are not their decimal text: {ops}"
    assert '"half"' in ops["String"] and ops["bool"] == {"true"}, \
        f"String literals are not JSON-quoted or Bool ones not true/false: {ops}"
    assert json.loads(json.loads(next(o for o in ops["String"] if "linear" in o))) == ["linear", 2.0], \
        "a json attribute is not a String of its JSON text"
    # vectors: ids "primitive-Vec...", op "Vec", the elements as children in order
    vecs = [n for nid, n in nodes.items() if nid.startswith("primitive-Vec")]
    assert vecs and all(n["op"] == "Vec" for n in vecs), "Vec e-nodes are not 'primitive-Vec...' ids of op 'Vec'"
    assert any([nodes[c]["op"] for c in n["children"]] == ["2", "4"] for n in vecs), "Vec children out of order"
    # the shape facts: e-nodes of op "shape", the tensor as child, the Vec's e-class as e-class
    shape_rows = [n for n in nodes.values() if n["op"] == "shape"]
    assert len(shape_rows) == len(g.live_nodes()), "shape facts are not e-nodes of op 'shape'"
    assert all(data[n["eclass"]]["type"] == "Vec[i64]" and data[nodes[n["children"][0]]["eclass"]]["type"] == "T"
               for n in shape_rows), "a shape e-node is not (tensor child, Vec[i64] e-class)"
    # constructors by their display names: op constructors by op name, Epi/TList by Python name
    structural = {n["op"] for n in nodes.values() if data[n["eclass"]]["type"] in ("Epi", "TList")}
    assert structural == {"Epi.none", "Epi.bias", "Epi.act", "TList.nil", "TList.cons"}, \
        f"Epi/TList e-nodes are displayed as {sorted(structural)}, not as sorts.ARG_SORTS names them"
    tensor_ops = {n["op"] for n in nodes.values() if data[n["eclass"]]["type"] == "T"}
    assert tensor_ops == {"Input", "Parameter", "FusedMatMul", "RmsNorm", "Concat", "RoPE", "AttentionGradQ_4"}, \
        f"op e-nodes are displayed as {sorted(tensor_ops)}, not by their constructor names"
    for nid, n in nodes.items():  # children in argument order, one per argument sort
        if n["op"] in ARG_SORTS:
            assert len(n["children"]) == len(ARG_SORTS[n["op"]]), f"{nid}: children {n['children']}"


def test_the_decoder_reads_back_every_encoded_node():
    from eggfuse.rewrites.problem import Decoder

    g, enc, raw = _tiny_serialised_graph()
    dec = Decoder(raw)
    by_let = {d["let"]: c for c, d in raw["class_data"].items() if "let" in d}
    for node in g.live_nodes():
        (nid,) = dec.members[by_let[f"$n{node.id}"]]
        e = dec.enode(nid)
        assert e.op == node.op
        assert e.inputs == [by_let[f"$n{i}"] for i in node.inputs], node.describe()
        if not OPS[node.op].leaf:
            assert e.attrs == {a.name: node.attrs[a.name] for a in OPS[node.op].egg_attrs + (
                (OPS[node.op].epilogue_attr,) if OPS[node.op].epilogue_attr else ())}, node.describe()
    assert dec.tensor_list(by_let["$outputs"]) == [by_let[f"$n{o}"] for o in g.outputs]


def test_variables_of_expressions_and_facts():
    from eggfuse.rewrites.dsl import Namespace

    e = Namespace()
    x, d = e.vars("x d")
    (eps,) = e.vars("eps", e.f64)
    assert egglog_private.variables(e.RmsNorm(e.Add(x, d), x, eps=eps)) == {"x", "d", "eps"}
    assert egglog_private.variables(e.eq(e.shape(x)).to(e.shape(d)), e.Neg(x)) == {"x", "d"}
    assert egglog_private.variables(e.Relu(e.Input(e.String("a"), e.Vec[e.i64](e.i64(1))))) == set()


def test_a_missing_internal_is_named():
    class Broken:  # an e-graph without the internals, as a changed egglog-python would give
        pass

    with pytest.raises(RewriteError, match=r"no longer has EGraph._serialize .*egglog >=14,<15"):
        egglog_private.serialize(Broken())


def test_a_ruleset_fingerprint_is_its_rules_text():
    from eggfuse.rewrites import make_ruleset
    from eggfuse.rewrites.rulesets import optimization_rulesets

    def neg_neg(e):
        (x,) = e.vars("x")
        yield e.equal("Neg(Neg(x)) -> x", e.Neg(e.Neg(x)), x)

    def relu_relu(e):
        (x,) = e.vars("x")
        yield e.equal("Relu(Relu(x)) -> Relu(x)", e.Relu(e.Relu(x)), e.Relu(x))

    a, b, c = (egglog_private.ruleset_fingerprint(make_ruleset("r", fn)) for fn in (neg_neg, neg_neg, relu_relu))
    assert a == b != c
    assert "Neg(Neg(x)) -> x" in a and "0x" not in a  # the rule, and no addresses
    shipped = [egglog_private.ruleset_fingerprint(r) for r in optimization_rulesets()]
    assert len(set(shipped)) == len(shipped) and all(shipped)


def test_the_calls_of_a_rules_query_and_actions():
    from eggfuse.rewrites import make_ruleset
    from eggfuse.rewrites.rulesets import _MEMBERS, rulesets

    def fold(e):
        mm, d, a, b = e.vars("mm d a b")
        (ep,) = e.vars("e", e.Epi)
        yield e.equal("Add(mm, d) -> FusedMatMul(a, b, e + [add d])", e.Add(mm, d),
                      e.FusedMatMul(a, b, variant=e.String(""), epilogue=e.Epi.add(ep, d)),
                      e.eq(mm).to(e.FusedMatMul(a, b, variant=e.String(""), epilogue=ep)),
                      e.eq(e.shape(mm)).to(e.shape(d)))

    (rule,) = (r for _, r in _MEMBERS[id(make_ruleset("calls_for_test", fold))][1])
    body, head = egglog_private.rule_calls(rule)
    assert {"Add", "FusedMatMul", "shape"} <= body and "Epi.add" not in body
    assert {"FusedMatMul", "Epi.add"} <= head
    # the generated kernels' rule of one op
    (add,) = [r for n, r in _MEMBERS[id(rulesets()["elementwise_fusion"])][1] if n.startswith("Add(")]
    body, head = egglog_private.rule_calls(add)
    assert body == {"Add"} and {"Fused", "ExAdd", "ExLeaf"} <= head
