"""The ops each row of the GPU op tables (tests/gpu/test_ops*.py) builds, read without a GPU:
for the conformance and seed-op tests."""

from __future__ import annotations

from op_table import all_rows  # tests/op_table.py

from eggfuse.ir import Graph


def gpu_row_ops() -> set[str]:
    """Every op some row's graph holds (leaves and views included)."""
    ops = set()
    for row in all_rows():
        g = Graph()
        row.build(g)
        ops |= {n.op for n in g.nodes}
    return ops
