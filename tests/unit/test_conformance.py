"""The op registry is complete: every op of ``eggfuse.ir.OPS`` has every piece its spec block
must give, and every shipped rule its soundness example. Each check names the op (or rule)
and the piece missing, so a new op that forgets one fails here first.

What each op needs (``ir/spec.py``, the family modules of ``ir/ops/``): a doc naming the
formula's source, a float64 reference (leaves excepted), a kernel builder when it dispatches,
a VJP or a no-gradient marker, an egglog constructor (generated from its spec) and a row in
the GPU op table (``tests/gpu/test_ops.py``) when it has a kernel.
"""

from __future__ import annotations

import inspect

import pytest
from op_rows import gpu_row_ops  # tests/op_rows.py (pytest pythonpath)

from eggfuse.ir import OPS, Graph
from eggfuse.ir.ops import FAMILIES
from eggfuse.ir.spec import _NoGrad
from eggfuse.rewrites.rulesets import ANALYSIS, OPTIONAL, SCHEDULE, rule_records
from eggfuse.rewrites.sorts import CONSTRUCTORS, SIGNATURES

ROW_OPS = gpu_row_ops()


def _problems(name: str) -> list[str]:
    spec = OPS[name]
    out = []
    if not spec.doc:
        out.append("no doc (say what it computes and the formula's source)")
    if not spec.family or spec.family not in {m.FAMILY for m in FAMILIES}:
        out.append(f"family {spec.family!r} is not a module of eggfuse.ir.ops")
    if spec.leaf:
        return out
    if not callable(spec.reference):
        out.append("no numpy reference")
    if spec.dispatches and spec.kernel is None:
        out.append("dispatches but has no kernel builder")
    if not (callable(spec.vjp) or isinstance(spec.vjp, _NoGrad)):
        out.append("neither a VJP nor a no-gradient marker (ir.spec.no_grad)")
    if name not in {sig.op for sig in SIGNATURES.values()}:
        out.append("no egglog constructor")
    if spec.kernel is not None and name not in ROW_OPS:
        out.append("has a kernel but no row in the GPU op table (tests/gpu/test_ops.py ROWS)")
    return out


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_spec_is_complete(name):
    problems = _problems(name)
    assert not problems, f"op {name} ({OPS[name].family} family): " + "; ".join(problems)


def test_every_row_of_the_unary_table_has_its_gpu_rows():
    # the check above took an op of ir/ops/elementwise.py's UNARY as covered by the special-values row that
    # tests/gpu/test_ops_unary.py makes of every unary op: its random rows (UNARY_ROWS of tests/gpu/test_ops.py,
    # or rows of its own) were never required
    from op_table import all_rows

    from eggfuse.ir.ops.elementwise import UNARY

    covered = {row.op for row in all_rows() if not row.id.endswith("-specials")}
    missing = sorted(u.name for u in UNARY if u.name not in covered)
    assert not missing, (f"unary op(s) {missing} of ir/ops/elementwise.py's UNARY have no GPU rows but the special "
                         "values': add \"Op\": (precision sweep, has a gradient op) to UNARY_ROWS in "
                         "tests/gpu/test_ops.py")


def test_every_vjp_takes_the_builder_node_dy_and_want():
    for name, spec in OPS.items():
        if callable(spec.vjp):
            params = inspect.signature(spec.vjp).parameters
            assert len(params) == 4, f"op {name}: its VJP takes {list(params)}, not (b, node, dy, want)"


def test_every_shipped_rule_has_a_soundness_example_and_a_scheduled_ruleset():
    for r in rule_records():
        assert r.ruleset in (ANALYSIS, *SCHEDULE, *OPTIONAL), f"rule {r.name!r} ({r.family}): ruleset {r.ruleset!r}"
        # only an optional ruleset may change values (within its examples' tolerance)
        assert r.example is None or r.example.tol is None or r.ruleset in OPTIONAL, r.name
        if r.ruleset != ANALYSIS:
            assert r.example is not None, f"rule {r.name!r} ({r.family} family) has no soundness example"


def test_the_constructor_of_each_op_is_named_by_the_op():
    from egglog import EGraph

    from eggfuse.rewrites import egglog_private
    from eggfuse.rewrites.encode import encode

    for name, ctor in CONSTRUCTORS.items():
        op = SIGNATURES[name].op
        assert str(ctor) == name and name.removeprefix(op) in ("", *(f"_{n}" for n in range(9))), \
            f"op {op}: its egglog constructor is named {ctor}"
    # and the e-graph calls its e-nodes so: an encoded graph's e-nodes carry the op names
    g = Graph()
    x = g.input("x", [4, 6])
    g.set_outputs([g.concat([g.rms_norm(x, g.parameter("w", [6])), g.relu(x)], axis=0)])
    eg = EGraph()
    encode(g, eg)
    ops = {n["op"] for n in egglog_private.serialize(eg)["nodes"].values()}
    assert {"Input", "Parameter", "RmsNorm", "Relu", "Concat"} <= ops, ops
