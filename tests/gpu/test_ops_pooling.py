"""MaxPool, MaxPoolIndices, AveragePool, LpPool (ir/ops/pooling.py) and Resample
(ir/ops/resample.py) on the GPU against the numpy reference: 1 to 3 spatial axes, strides,
dilations, asymmetric pads, ceil_mode, count_include_pad, ties, windows wholly in the padding,
both storage orders; Resample with identity axes between resized ones, several taps, rows
outside the input (extrapolation), rank 1 and rank 6."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph


def _pool(op: str, x, tag: str = "", feeds=None, finite: bool = True, **attrs) -> Row:
    def build(g: Graph) -> int:
        return g.add_node(op, (g.input("x", x),), **attrs)

    desc = ",".join(f"{k}{list(v) if isinstance(v, list) else v}" for k, v in attrs.items())
    # atol from the values: a -inf output would make the default (from max |reference|) infinite
    return Row(op, f"{op}{x}-{desc}{tag}", build, feeds or {}, scale=2.0, atol=1e-5, finite=finite)


def _resample(x, shape, taps, extrapolation: float = 0.0, outside=(), tag: str = "") -> Row:
    rng = np.random.default_rng(len(x) * 10 + sum(shape))
    index, weight = [], []
    for n, o, t in zip(x, shape, taps, strict=True):
        if t:
            idx = rng.integers(0, n, size=(o, t))
            for row in outside:
                if row < o:
                    idx[row, 0] = -1
            index.append(idx.reshape(-1))
            weight.append(rng.random(o * t) - 0.25)

    def build(g: Graph) -> int:
        idx = g.constant(np.concatenate(index).astype(np.int32), dtype=DType.I32)
        return g.add_node("Resample", (g.input("x", x), idx, g.constant(np.concatenate(weight))), shape=shape,
                          taps=taps, extrapolation_value=extrapolation)

    return Row("Resample", f"Resample{x}->{shape}-taps{taps}{tag}", build)


_TIES = {"x": np.zeros((1, 2, 6, 5))}

ROWS = [
    _pool("MaxPool", [2, 3, 9, 10], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    _pool("MaxPool", [2, 3, 9, 10], kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 0, 1], dilations=[2, 1],
          ceil_mode=True),
    _pool("MaxPool", [1, 2, 7, 8, 9], kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0]),
    _pool("MaxPool", [1, 2, 300], kernel_shape=[300]),
    _pool("MaxPool", [1, 1, 3, 3], tag="-window-in-padding", finite=False, kernel_shape=[1, 1], pads=[1, 1, 1, 1]),
    *[_pool("MaxPoolIndices", x, storage_order=order, **attrs) for order in (0, 1) for x, attrs in (
        ([2, 3, 9, 10], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ([1, 2, 5, 6, 7], dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2], ceil_mode=True)),
        ([2, 2, 17], dict(kernel_shape=[4], strides=[3], ceil_mode=True)))],
    _pool("MaxPoolIndices", [1, 2, 6, 5], tag="-ties", feeds=_TIES, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    _pool("MaxPoolIndices", [1, 1, 3, 3], tag="-window-in-padding", kernel_shape=[1, 1], pads=[1, 1, 1, 1]),
    _pool("AveragePool", [2, 3, 9, 10], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    _pool("AveragePool", [2, 3, 9, 10], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
          count_include_pad=True, ceil_mode=True),
    _pool("AveragePool", [1, 3, 9, 10], kernel_shape=[3, 2], strides=[2, 2], pads=[2, 0, 1, 1],
          count_include_pad=True, dilations=[2, 2]),
    _pool("AveragePool", [1, 3, 12, 8], kernel_shape=[3, 2], strides=[3, 2]),
    _pool("AveragePool", [1, 2, 4, 5, 6], kernel_shape=[2, 2, 2], pads=[1, 0, 1, 0, 1, 1], count_include_pad=True),
    _pool("LpPool", [1, 3, 9, 10], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=3),
    _pool("LpPool", [2, 3, 9, 10], kernel_shape=[2, 2]),
    _pool("LpPool", [1, 3, 9], kernel_shape=[2], p=1),
    _resample([2, 3, 5, 7], [2, 3, 9, 4], [0, 0, 2, 3]),
    _resample([3, 4], [3, 11], [0, 4], extrapolation=2.5, outside=(0, 5, 10)),
    _resample([2, 5, 3], [4, 5, 6], [1, 0, 2]),
    _resample([7], [15], [2]),
    _resample([2, 1, 3, 1, 2, 4], [2, 1, 5, 1, 2, 3], [0, 0, 2, 0, 0, 1]),
    _resample([1, 1, 4, 4], [1, 1, 3, 3], [0, 0, 4, 4], extrapolation=-1.0, outside=(2,), tag="-cubic-sized"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)
