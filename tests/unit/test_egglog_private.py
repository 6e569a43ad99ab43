"""The egglog-python internals eggfuse uses (rewrites/egglog_private.py), exercised one by one,
so that an egglog release which changes one of them fails here, naming it, rather than deep
inside an optimisation. The supported range is the pin in pyproject.toml (egglog >=14,<15)."""

from __future__ import annotations

from importlib import metadata

import pytest
from egglog import EGraph

from eggfuse.ir import Graph, RewriteError
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
