"""The reduce-over-axes family (ir/ops/reduce_axes.py) on the GPU against the numpy reference:
every reduce op over axis sets that merge to 1..4 kept and reduced dimensions, both kernel
entry points (short and long reductions, an innermost kept axis with many outputs), rank 0
and rank 6, i32 (wrapping) and bool inputs, NaN and infinities made on the device (Log of 0
and of negatives, Recip of 0: fed values must be finite), ArgMax/ArgMin with ties."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph, LoweringError
from eggfuse.ir.ops.reduce_axes import REDUCTIONS
from eggfuse.lowering import lower
from eggfuse.runtime.device import subgroup_reductions_usable

_F, _I, _B = DType.F32, DType.I32, DType.BOOL


def _reduce(op: str, shape, axes, keepdims: bool = True, dtype: DType = _F, feeds=None, pre: str | None = None,
            tag: str = "", **kw) -> Row:
    # op over ``axes`` of input x (``pre``: a unary op applied first, to make NaN / infinities on the device)
    def build(g: Graph) -> int:
        x = g.input("x", shape, dtype)
        if pre:
            x = g.add_node(pre, (x,))
        extra = {"epsilon": 1e-3} if op == "InvStdDev" else {}
        return g.add_node(op, (x,), axes=axes, keepdims=keepdims, **extra)

    rid = f"{op}{list(shape)}{dtype.value}axes{list(axes)}{'' if keepdims else '-nokeep'}{tag}"
    return Row(op, rid, build, feeds or {}, **kw)


# (shape, axes, keepdims): merged kept/reduced runs from 0 to 4 each, long and short reductions
_CASES = [
    ([1], (0,), True), ([7, 13], (1,), True), ([7, 13], (0,), False), ([7, 13], (0, 1), False),
    ([2, 3, 4, 5], (1, 3), True), ([2, 3, 4, 5], (0, 2), False), ([2, 3, 4, 5], (), True), ((), (), False),
    ([2, 3, 4, 5, 6], (0, 2, 4), False), ([2, 1, 3, 1, 4, 5], (1, 2, 5), True),
    ([3, 2, 2, 2, 2, 2, 2, 3], (1, 3, 5, 7), True),  # 4 kept and 4 reduced after merging
    ([3, 1000], (1,), True), ([1000, 70], (0,), False), ([2000, 3], (1,), True), ([300, 2048], (0,), False),
    ([5000], (0,), False), ([4, 70, 5], (0, 2), True),
]
_INT_CASES = [([7, 13], (1,), True), ([2, 3, 4, 5], (0, 2), False), ([3, 300], (1,), True), ([9], (0,), False)]

_LOWEST = float(np.finfo(np.float32).min)  # an exporter's additive mask value

ROWS: list[Row] = [
    *[_reduce(r.name, s, a, k, scale=0.5 if r.name == "ReduceProd" else 1.0) for r in REDUCTIONS
      for s, a, k in _CASES if r.name not in ("ReduceLogSum",)],
    # log of a sum of positive terms (the random rows' sums may be negative: NaN rows below)
    *[_reduce("ReduceLogSum", s, a, k, pre="Abs") for s, a, k in _CASES],
    *[_reduce(r.name, s, a, k, _I) for r in REDUCTIONS if r.int_ok for s, a, k in _INT_CASES],
    *[_reduce(op, s, a, k, _B) for op in ("ReduceMax", "ReduceMin") for s, a, k in _INT_CASES],
    # large logits: log-sum-exp subtracts the maximum
    _reduce("ReduceLogSumExp", [2, 4], (1,), feeds={"x": np.array([[1e3, 999.0, 0.0, -1e3], [88.0, 89.0, 90.0, 0.0]])},
            tag="-large"),
    # float32's lowest value (an exporter's additive mask): the running maximum starts at or below it (4 elements
    # a thread, and 300: a workgroup per output)
    *[_reduce("ReduceLogSumExp", [2, n], (1,), feeds={"x": np.array([[_LOWEST] * n, [_LOWEST, 2.0] + [0.0] * (n - 2)])},
              tag="-float32-lowest") for n in (4, 300)],
    # NaN and infinities made on the device: Log(0) = -inf, Log(-1) = NaN, Recip(0) = inf
    _reduce("ReduceMax", [3, 4], (1,), feeds={"x": np.array([[1.0, -1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0],
                                                             [0.0, 1.0, 0.5, 0.0]])}, pre="Log", tag="-nan-inf",
            finite=False),
    _reduce("ReduceMin", [3, 4], (1,), feeds={"x": np.array([[1.0, 2.0, -3.0, 3.0], [0.0, 1.0, 2.0, 3.0],
                                                             [5.0, 1.0, 0.5, 2.0]])}, pre="Log", tag="-nan-inf",
            finite=False),
    *[_reduce("ReduceLogSumExp", [3, n], (1,), feeds={"x": np.array([[0.0] * n, [0.0] + [1.0] * (n - 1),
                                                                      [0.0] * (n - 1) + [2.0]])},
              pre="Log", tag="-neg-inf", finite=False) for n in (4, 300)],
    *[_reduce("ReduceLogSumExp", [2, n], (1,), feeds={"x": np.array([[0.0] + [1.0] * (n - 1), [1.0] * n])},
              pre="Recip", tag="-pos-inf", finite=False) for n in (4, 300)],
    _reduce("ReduceLogSum", [3, 3], (1,), feeds={"x": np.array([[1.0, -1.0, 0.0], [-1.0, -2.0, 0.5], [1.0, 2.0, 3.0]])},
            tag="-zero-negative", finite=False),
    _reduce("ReduceMax", [2, 300], (1,), feeds={"x": np.concatenate([np.ones((1, 300)), np.arange(300)[None]])},
            pre="Log", tag="-long-nan-inf", finite=False),
    # InvStdDev of rows far from zero: the variance around the mean, not E[x^2] - E[x]^2
    _reduce("InvStdDev", [5, 300], (1,), feeds={"x": 1000.0 + np.random.default_rng(3).standard_normal((5, 300))},
            tag="-shift1000"),
]


def _arg(op: str, shape, axis: int, keepdims: bool = True, last: bool = False, dtype: DType = _F, feeds=None,
         pre: str | None = None, tag: str = "") -> Row:
    def build(g: Graph) -> int:
        x = g.input("x", shape, dtype)
        if pre:
            x = g.add_node(pre, (x,))
        return g.add_node(op, (x,), axis=axis, keepdims=keepdims, select_last_index=last)

    rid = f"{op}{list(shape)}{dtype.value}axis{axis}{'' if keepdims else '-nokeep'}{'-last' if last else ''}{tag}"
    return Row(op, rid, build, feeds or {})


_TIES = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 0.0, -5.0, 4.0]])
_NANS = np.array([[1.0, -1.0, 5.0, -2.0, 0.0], [0.0, 3.0, 0.0, 2.0, 2.0], [3.0, 3.0, 1.0, 2.0, 2.0]])

ROWS += [
    *[_arg(op, s, ax, k, last) for op in ("ArgMax", "ArgMin") for last in (False, True) for s, ax, k in (
        ([7, 13], 1, True), ([7, 13], 0, False), ([1], 0, True), ([2, 3, 4, 5, 6], 2, False), ([3, 300], 1, True),
        ([300, 5], 0, True))],
    # i32 in [-9, 9]: many ties
    *[_arg(op, s, ax, k, last, _I) for op in ("ArgMax", "ArgMin") for last in (False, True)
      for s, ax, k in (([7, 13], 1, False), ([2, 100, 3], 1, True))],
    *[_arg(op, [3, 5], ax, True, last, feeds={"x": _TIES}, tag="-ties") for op in ("ArgMax", "ArgMin")
      for last in (False, True) for ax in (0, 1)],
    # Log(-x) = NaN: a NaN wins (numpy argmax / argmin), the first or the last of several
    *[_arg(op, [3, 5], 1, True, last, feeds={"x": _NANS}, pre="Log", tag="-nan") for op in ("ArgMax", "ArgMin")
      for last in (False, True)],
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
    # the rows above reach both kernel forms of each kernel
    kernels = set()
    for row in ROWS:
        g = Graph()
        g.set_outputs([row.build(g)])
        kernels |= {d.kernel.removesuffix("+sg") for d in lower(g).dispatches}
    for prefix in ("ReduceSum_f32", "ReduceLogSumExp_f32", "InvStdDev_f32", "ReduceMax_i32", "argmax_f32"):
        assert {f"{prefix}_per_group", f"{prefix}_per_element"} <= kernels, prefix


def test_more_than_four_alternating_runs_is_a_lowering_error():
    g = Graph()
    x = g.input("x", [2, 3] * 5)
    g.set_outputs([g.add_node("ReduceSum", (x,), axes=(1, 3, 5, 7, 9))])
    with pytest.raises(LoweringError, match=r"alternates 10 kept and reduced dimensions.*4 of each"):
        lower(g)
