"""CumSum, CumProd, PaddedPositionIds, TopKValues and TopKIndices (ir/ops/scans.py) on the GPU
against the numpy reference: every axis position, exclusive and reverse, lines short (an
invocation per line) and long (a workgroup per line, several chunks of 256), i32 (wrapping), pad
ids of either sign, ties in TopK (the lower index first) and a NaN made on the device (Log of a
negative)."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph

_F, _I = DType.F32, DType.I32


def _scan(op: str, shape, axis: int, exclusive: bool = False, reverse: bool = False, dtype: DType = _F,
          **kw) -> Row:
    def build(g: Graph) -> int:
        return g.add_node(op, (g.input("x", shape, dtype),), axis=axis, exclusive=exclusive, reverse=reverse)

    tag = ("-excl" if exclusive else "") + ("-rev" if reverse else "")
    return Row(op, f"{op}{list(shape)}{dtype.value}axis{axis}{tag}", build, **kw)


def _top_k(op: str, shape, k: int, axis: int, largest: bool = True, dtype: DType = _F, feeds=None,
           pre: str | None = None, tag: str = "") -> Row:
    def build(g: Graph) -> int:
        x = g.input("x", shape, dtype)
        if pre:
            x = g.add_node(pre, (x,))
        return g.add_node(op, (x,), k=k, axis=axis, largest=largest)

    rid = f"{op}{list(shape)}{dtype.value}k{k}axis{axis}{'' if largest else '-smallest'}{tag}"
    return Row(op, rid, build, feeds or {}, finite=pre is None)


def _positions(shape, axis: int, pad: int) -> Row:
    # token ids from pad - 2 to pad + 2 (one in five padding), the first and the last two along the axis padding
    ids = np.random.default_rng(sum(shape) + axis).integers(pad - 2, pad + 3, shape).astype(np.int32)
    for at in (0, -1, -2):
        ids[(slice(None),) * axis + (at,)] = pad

    def build(g: Graph) -> int:
        return g.add_node("PaddedPositionIds", (g.input("ids", shape, _I),), axis=axis, pad=pad)

    return Row("PaddedPositionIds", f"PaddedPositionIds{list(shape)}axis{axis}pad{pad}", build, {"ids": ids})


_SCAN_CASES = [([1], 0), ([7], 0), ([7, 13], 0), ([7, 13], 1), ([2, 3, 4, 5], 2), ([3, 700], 1), ([600, 3], 0),
               ([2, 300, 2], 1)]
_TIES = np.array([[1.0, 3.0, 3.0, 0.0, 3.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 0.0, -5.0, 4.0, 4.0]])

ROWS: list[Row] = [
    *[_scan("CumSum", s, ax, ex, rev) for s, ax in _SCAN_CASES for ex in (False, True) for rev in (False, True)],
    # products of values near 1, so long lines stay in range
    *[_scan("CumProd", s, ax, ex, rev, scale=0.05) for s, ax in _SCAN_CASES for ex in (False, True)
      for rev in (False, True)],
    *[_scan(op, s, ax, ex, rev, _I) for op in ("CumSum", "CumProd") for s, ax in (([7, 13], 1), ([300, 2], 0))
      for ex, rev in ((False, False), (True, True))],
    *[_positions(s, ax, pad) for s, ax in (([2, 7], 1), ([7, 5], 0), ([3, 300], 1), ([2, 3, 4], 1), ([2, 300, 2], 1))
      for pad in (1, -1)],
    *[_top_k(op, s, k, ax, largest) for op in ("TopKValues", "TopKIndices") for largest in (True, False)
      for s, k, ax in (([7, 13], 3, 1), ([7, 13], 7, 0), ([1], 1, 0), ([2, 3, 40, 2], 40, 2), ([3, 300], 5, 1))],
    *[_top_k(op, s, k, ax, largest, _I) for op in ("TopKValues", "TopKIndices") for largest in (True, False)
      for s, k, ax in (([7, 13], 13, 1), ([50, 2], 10, 0))],
    *[_top_k(op, [3, 6], k, 1, largest, feeds={"x": _TIES}, tag="-ties") for op in ("TopKValues", "TopKIndices")
      for largest in (True, False) for k in (3, 6)],
    *[_top_k(op, [3, 6], 4, 1, largest, feeds={"x": -_TIES}, pre="Log", tag="-nan")
      for op in ("TopKValues", "TopKIndices") for largest in (True, False)],
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def test_padded_position_ids_count_from_pad_as_transformers_does(device):
    # transformers' create_position_ids_from_input_ids (RoBERTa, padding_idx 1), worked by hand: kept ids count
    # from 2, a padding id keeps 1
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session

    g = Graph()
    g.set_outputs([g.add_node("PaddedPositionIds", (g.input("ids", [2, 7], _I),), axis=1, pad=1)])
    ids = np.array([[0, 5, 1, 7, 1, 1, 9], [1, 1, 4, 4, 4, 1, 2]], dtype=np.int32)
    (got,) = Session(lower_for(g, device), {}, device=device).run({"ids": ids})
    np.testing.assert_array_equal(got, [[2, 3, 1, 4, 1, 1, 5], [1, 1, 2, 3, 4, 1, 5]])
