"""bench/shader_ab.py's lowering with an older revision of a shader: slots added since, empty where unused, are
left out for the older text; a slot the older text lacks and the lowering fills is still an error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import shader_ab  # noqa: E402

from eggfuse.ir import Graph, LoweringError  # noqa: E402
from eggfuse.ir.ops import matmul_kernel  # noqa: E402
from eggfuse.lowering import lower, wgsl  # noqa: E402


def _split_product() -> Graph:
    g = Graph()  # a product in 8 K ranges (matmul_splits)
    g.set_outputs([g.matmul_bt(g.input("a", (64, 576)), g.parameter("b", (192, 576)))])
    return g


def test_an_older_template_without_the_last_split_slot_still_renders(monkeypatch):
    older = wgsl.shader_text("matmul.wgsl").replace("{{LAST_SPLIT}}\n", "")
    assert "{{LAST_SPLIT}}" not in older
    render, shader_text = wgsl.render, wgsl.shader_text
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT", False)  # the slot is empty: the two-dispatch form
    with shader_ab.shader_replaced("matmul.wgsl", older):
        plan = lower(_split_product())
    assert [d.kernel.split("_")[-1] for d in plan.dispatches] == ["split8", "reduce"]
    assert "atomicAdd" not in plan.dispatches[0].source
    # filled (the bound on the partial sums lifted): the older text cannot take it
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT", True)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT_MAX_SUMS", 1 << 30)
    with shader_ab.shader_replaced("matmul.wgsl", older), pytest.raises(LoweringError, match="LAST_SPLIT"):
        lower(_split_product())
    assert (wgsl.render, wgsl.shader_text) == (render, shader_text)  # restored
