"""Softmaxes and normalisations over any axes (ir/ops/axis_norms.py) on the GPU against the
numpy reference: every axis of ranks 1 to 5, both kernel entry points (short and long
groups, an innermost kept axis with many groups), large logits, ties and NaN for Hardmax,
BatchNormalization on ranks 2 to 5, LRN with even and odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import Graph
from eggfuse.lowering import lower
from eggfuse.runtime.device import subgroup_reductions_usable


def _axis(op: str, shape, axis: int, feeds=None, tag: str = "", pre: str | None = None, **attrs) -> Row:
    def build(g: Graph) -> int:
        x = g.input("x", shape)
        if pre:
            x = g.add_node(pre, (x,))
        return g.add_node(op, (x,), axis=axis, **attrs)

    extra = "".join(f"-{k}{v}" for k, v in attrs.items())
    return Row(op, f"{op}{list(shape)}axis{axis}{extra}{tag}", build, feeds or {}, scale=3.0, finite=pre is None)


def _mvn(shape, axes) -> Row:
    return Row("MeanVarianceNormalization", f"MeanVarianceNormalization{list(shape)}axes{list(axes)}",
               lambda g: g.add_node("MeanVarianceNormalization", (g.input("x", shape),), axes=axes), scale=3.0)


def _batch_norm(shape, eps: float = 1e-5) -> Row:
    c = shape[1]
    feeds = {"var": np.random.default_rng(c).random(c) + 0.1}

    def build(g: Graph) -> int:
        stats = [g.parameter(name, [c]) for name in ("scale", "bias", "mean", "var")]
        return g.add_node("BatchNormalization", (g.input("x", shape), *stats), epsilon=eps)

    return Row("BatchNormalization", f"BatchNormalization{list(shape)}", build, feeds, scale=2.0)


def _lrn(shape, size: int, **attrs) -> Row:
    return Row("LRN", f"LRN{list(shape)}size{size}",
               lambda g: g.add_node("LRN", (g.input("x", shape),), size=size, **attrs), scale=2.0)


_AXIS_CASES = [([1], 0), ([7], 0), ([7, 13], 0), ([7, 13], 1), ([2, 3, 4], 1), ([2, 3, 4, 5, 6], 2),
               ([2, 3, 4, 5, 6], 0), ([3, 300, 2], 1), ([2000, 3], 0), ([5, 2048], 0)]
_LOGITS = np.array([[1e3, 999.0, 0.0, -1e3], [-1e30, -1e30, -1e30, -1e30], [-1e30, 2.0, -1e30, 1.0]])
#: Rows of float32's lowest value (an exporter's additive mask): a running maximum must start at or below it
_LOWEST = np.array([[np.finfo(np.float32).min] * 4, [np.finfo(np.float32).min, 2.0, np.finfo(np.float32).min, 1.0]])
_TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 0.0, 4.0]])

ROWS: list[Row] = [
    *[_axis(op, s, ax) for op in ("SoftmaxAxis", "LogSoftmaxAxis", "Hardmax") for s, ax in _AXIS_CASES],
    *[_axis(op, s, ax, p=p) for p in (1, 2) for s, ax in _AXIS_CASES for op in ("LpNormalization",)],
    *[_axis(op, [3, 4], ax, {"x": _LOGITS}, "-large-logits") for op in ("SoftmaxAxis", "LogSoftmaxAxis")
      for ax in (0, 1)],
    *[_axis(op, [2, 4], ax, {"x": _LOWEST}, "-float32-lowest") for op in ("SoftmaxAxis", "LogSoftmaxAxis")
      for ax in (0, 1)],
    *[_axis("Hardmax", [3, 4], ax, {"x": _TIES}, "-ties") for ax in (0, 1)],
    _axis("Hardmax", [3, 4], 1, {"x": -_TIES}, "-nan", pre="Log"),
    *[_mvn(s, ax) for s, ax in (([3, 3, 3, 1], (0, 2, 3)), ([2, 3, 4, 5], (0, 2, 3)), ([7, 13], (1,)),
                                ([2, 70, 3, 2], (0, 2, 3)), ([4, 5, 6], (0, 1, 2)), ([3, 300], (1,)))],
    *[_batch_norm(s) for s in ([4, 3], [2, 3, 5], [2, 3, 5, 7], [1, 4, 2, 3, 2])],
    *[_lrn(s, size) for s, size in (([2, 5, 3, 3], 3), ([2, 5, 3, 3], 4), ([1, 7, 4], 5), ([3, 2], 1))],
    _lrn([2, 6, 3, 3], 3, alpha=0.0002, beta=0.5, bias=2.0),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def _uses_subgroups(row: Row) -> bool:
    g = Graph()
    g.set_outputs([row.build(g)])
    return lower(g, subgroups=True).subgroups


SUBGROUP_ROWS = [row for row in ROWS if _uses_subgroups(row)]


@pytest.mark.parametrize("row", SUBGROUP_ROWS, ids=[r.id for r in SUBGROUP_ROWS])
@pytest.mark.parametrize("subgroups", [False, True], ids=["workgroup-memory", "subgroups"])
def test_reductions_in_both_forms_match_reference(row: Row, subgroups: bool, device):
    # the per_group kernels reduce with reduce.wgsl, which has a subgroup form
    if subgroups and not subgroup_reductions_usable(device):
        pytest.skip("the device has no usable subgroup operations")
    session = check_row(row, device, subgroups=subgroups)
    assert session.plan.subgroups == subgroups


def test_entry_points_cover_both_forms():
    kernels = set()
    for row in ROWS:
        g = Graph()
        g.set_outputs([row.build(g)])
        kernels |= {d.kernel.removesuffix("+sg") for d in lower(g).dispatches}
    for prefix in ("softmaxaxis", "lpnormalization", "meanvariancenormalization", "hardmax_f32"):
        assert {f"{prefix}_per_group", f"{prefix}_per_element"} <= kernels, prefix
