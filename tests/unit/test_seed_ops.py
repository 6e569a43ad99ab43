"""Every op kind of the seed (``pub enum Op`` in ../shared/seeds/000_4484ac52b02c59b6.txt,
meganeura's graph.rs) has an entry in ir.seed_ops.SEED_OP_MAP, and every op it maps to has a
reference, a kernel when it dispatches, and a row in the GPU op table (tests/gpu/test_ops.py,
whose row graphs are built here without a GPU).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from op_rows import gpu_row_ops  # tests/op_rows.py (pytest pythonpath)

from eggfuse.ir import OPS
from eggfuse.ir.seed_ops import SEED_OP_MAP

REPO = Path(__file__).resolve().parents[2]
SEED_GRAPH = REPO / ".." / "shared" / "seeds" / "000_4484ac52b02c59b6.txt"
LEAVES = ("Input", "Parameter", "Constant")


def seed_variants(text: str) -> list[str]:
    """Variant names of ``pub enum Op { ... }``: the identifiers indented by exactly 4 spaces."""
    start = text.index("pub enum Op {")
    body = text[start:text.index("\n}\n", start)]
    return re.findall(r"^ {4}([A-Z][A-Za-z0-9]*)\b", body, re.MULTILINE)


ROW_OPS = gpu_row_ops()


def test_seed_variants_parse():
    text = "pub enum Op {\n    // Leaf\n    Parameter {\n        name: String,\n    },\n    MatMul,\n}\n\nstruct X;\n"
    assert seed_variants(text) == ["Parameter", "MatMul"]


def test_every_seed_variant_is_mapped():
    if not SEED_GRAPH.is_file():
        pytest.skip(f"seed graph.rs not found at {SEED_GRAPH} (CI checks it out next to the repo)")
    variants = seed_variants(SEED_GRAPH.read_text(encoding="utf-8"))
    assert len(variants) > 70 and len(set(variants)) == len(variants)
    unmapped, stale = set(variants) - set(SEED_OP_MAP), set(SEED_OP_MAP) - set(variants)
    assert not unmapped, f"seed ops with no SEED_OP_MAP entry: {sorted(unmapped)}"
    assert not stale, f"SEED_OP_MAP entries that are not seed ops: {sorted(stale)}"


@pytest.mark.parametrize("seed_op", sorted(SEED_OP_MAP))
def test_mapped_ops_have_a_reference_a_kernel_and_a_row(seed_op):
    target = SEED_OP_MAP[seed_op]
    if isinstance(target, str):
        assert len(target) > 40, f"{seed_op}: the reason it is not an op must say why"
        return
    assert target and all(isinstance(op, str) for op in target)
    problems: dict[str, str] = {}
    for op in target:
        if op not in OPS:
            problems[op] = "is not an op"
            continue
        opdef = OPS[op]
        if op not in LEAVES and not callable(opdef.reference):
            problems[op] = "has no reference"  # leaves are fed, not computed
        elif op not in LEAVES and opdef.dispatches and opdef.kernel is None:
            problems[op] = "dispatches but has no kernel"
        elif op not in ROW_OPS:
            problems[op] = "is built by no row of tests/gpu/test_ops.py"
    assert not problems, f"{seed_op}: {problems}"
