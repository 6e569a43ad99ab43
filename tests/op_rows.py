"""The ops each row of the GPU op table (tests/gpu/test_ops.py) builds, read without a GPU:
for the conformance and seed-op tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from eggfuse.ir import Graph

REPO = Path(__file__).resolve().parents[1]


def gpu_row_ops() -> set[str]:
    """Every op some row's graph holds (leaves and views included)."""
    spec = importlib.util.spec_from_file_location("_gpu_op_rows", REPO / "tests" / "gpu" / "test_ops.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    ops = set()
    for row in module.ROWS:
        g = Graph()
        row.build(g)
        ops |= {n.op for n in g.nodes}
    return ops
