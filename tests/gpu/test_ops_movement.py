"""The movement and indexing ops (ir/ops/movement.py, ir/ops/indexing.py) and the dtypes the
shape family's Concat copies, on the GPU against the numpy reference: every dtype, rank 0 to 8,
odd sizes, negative and out-of-range indices, duplicate scatter indices, every pad mode and
scatter reduction."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph, InputError, evaluate
from eggfuse.ir.ops.movement import fill_bits
from eggfuse.lowering import lower
from eggfuse.runtime import Session

F, I32, B = DType.F32, DType.I32, DType.BOOL
_NAMES = {F: "f32", I32: "i32", B: "bool"}


def _row(op: str, tag: str, inputs: list[tuple[str, list[int], DType]], feeds=None, finite: bool = True,
         **attrs) -> Row:
    def build(g: Graph) -> int:
        return g.add_node(op, [g.input(name, shape, dtype) for name, shape, dtype in inputs], **attrs)

    kinds = "/".join(f"{_NAMES[d]}{s}" for _, s, d in inputs)
    return Row(op, f"{op}{tag}-{kinds}", build, {k: np.asarray(v) for k, v in (feeds or {}).items()},
               finite=finite)


def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


ROWS = [
    # Permute: rank 0 to 8 (a dim of 1 dropped, neighbours merged), every dtype, a large 2-D one
    *[_row("Permute", f"{list(p)}", [("x", s, d)], perm=p) for s, p, d in (
        ([], (), F), ([7], (0,), F), ([7, 13], (1, 0), I32), ([2, 3, 4], (2, 0, 1), F), ([2, 3, 4], (0, 2, 1), B),
        ([2, 3, 4, 5, 6], (4, 2, 0, 3, 1), I32), ([3, 1, 5, 2], (3, 2, 1, 0), F), ([300, 257], (1, 0), F),
        ([2, 1, 3, 2, 2, 3, 2, 2, 3], (8, 7, 6, 5, 4, 3, 2, 1, 0), F), ([4, 5, 6, 7], (0, 1, 3, 2), F))],
    # Slice: steps, negative starts/ends/steps, clamping, every dtype
    *[_row("Slice", f"{st}:{en}:{sp}@{ax}", [("x", s, d)], starts=st, ends=en, axes=ax, steps=sp)
      for s, st, en, ax, sp, d in (
          ([20, 10, 5], [0, 1], [3, 10], [0, 1], [1, 2], F),
          ([7, 13], [-1], [-100], [1], [-3], F),
          ([7, 13], [-1, -1], [-2**31, -2**31], [0, 1], [-1, -1], I32),
          ([3, 4, 5, 6, 7], [1, -5, 0], [3, 100, 7], [0, -1, 2], [1, 2, 3], B),
          ([10], [2**31 - 1], [-2**31], [0], [-4], F),
          ([5, 6], [1], [1000], [], [], F),
          ([1], [0], [1], [0], [1], I32))],
    # Expand: both directions of broadcasting, rank 0, every dtype
    *[_row("Expand", f"->{t}", [("x", s, d)], shape=t) for s, t, d in (
        ([3, 1], [2, 1, 6], F), ([1], [7, 13], I32), ([4, 1, 5], [3, 4, 2, 5], B), ([], [5], F), ([5], [1], F),
        ([2, 1, 3, 1, 2, 1], [1, 2, 2, 3, 3, 2, 2], F), ([65, 1], [65, 300], F))],
    # Pad: every mode, pads past the dimension (repeated reflection / wrap), only some axes padded
    *[_row("Pad", f"-{mode}{pads}", [("x", s, d)], pads=pads, mode=mode, fill=fill_bits(v, d))
      for mode in ("constant", "reflect", "edge", "wrap") for s, pads, d, v in (
          ([3, 4], [1, 2, 2, 3], F, 1.5), ([5], [7, 9], I32, -3), ([2, 3, 4], [0, 1, 0, 2, 0, 1], B, 1),
          ([1, 3], [2, 0, 3, 5], F, 0.0), ([2, 1, 3, 2, 3], [1, 0, 0, 1, 2, 0, 1, 0, 2, 1], F, 2.0))],
    _row("Pad", "-constant-inf", [("x", [3, 4], F)], finite=False, pads=[1, 1, 1, 1], mode="constant",
         fill=fill_bits(-np.inf, F)),
    # Tile
    *[_row("Tile", f"x{r}", [("x", s, d)], repeats=r) for s, r, d in (
        ([2, 3], [3, 2], F), ([1, 4, 1], [2, 1, 3], I32), ([3], [4], B), ([2, 1, 3, 2, 1], [1, 3, 2, 1, 2], F),
        ([65, 7], [1, 40], F))],
    # Trilu
    *[_row("Trilu", f"-{'upper' if up else 'lower'}{k:+d}", [("x", s, d)], upper=up, k=k)
      for up in (True, False) for s, k, d in (([5, 7], 0, F), ([7, 5], -2, I32), ([2, 3, 4, 6], 3, B),
                                              ([3, 4], -9, F), ([3, 4], 9, F))],
    # ReverseSequence: lengths 0, 1, full and past the end (clamped)
    _row("ReverseSequence", "-time0", [("x", [4, 5, 3], F), ("sequence_lens", [5], I32)],
         {"sequence_lens": _ints([4, 0, 1, 9, 3])}, batch_axis=1, time_axis=0),
    _row("ReverseSequence", "-time1", [("x", [3, 6, 2, 2], I32), ("sequence_lens", [3], I32)],
         {"sequence_lens": _ints([6, 2, -1])}, batch_axis=0, time_axis=1),
    _row("ReverseSequence", "-bool", [("x", [2, 7], B), ("sequence_lens", [2], I32)],
         {"sequence_lens": _ints([7, 5])}, batch_axis=0, time_axis=1),
    # Gather: any axis, scalar and 2-D indices, negative indices (out-of-range ones fed are refused, computed ones
    # clamped: the tests below)
    *[_row("Gather", f"@{ax}", [("data", s, d), ("indices", si, I32)], {"indices": _ints(iv)}, axis=ax)
      for s, si, iv, ax, d in (
          ([5, 4], [3], [0, -1, 4], 0, F), ([5, 4], [2, 3], [[3, -4, 0], [1, 1, -1]], 1, I32),
          ([3, 4, 5], [], 2, 2, F), ([3, 4, 5], [4], [-3, 3, -4, 2], -2, B), ([300, 70], [257], np.arange(257) % 300,
                                                                              0, F))],
    # GatherElements: indices smaller than data off the axis, negative indices
    *[_row("GatherElements", f"@{ax}", [("data", s, d), ("indices", si, I32)], {"indices": _ints(iv)}, axis=ax)
      for s, si, iv, ax, d in (
          ([2, 2], [2, 2], [[0, 0], [1, 0]], 1, F), ([3, 3], [2, 3], [[1, 2, 0], [2, 0, 0]], 0, I32),
          ([3, 4, 2], [3, 2, 1], [[[-1], [0]], [[2], [-4]], [[3], [1]]], 1, B))],
    _row("GatherElements", "-random", [("data", [4, 5, 6], F), ("indices", [4, 7, 3], I32)], axis=1),
    # GatherElementsBroadcast: indices broadcast over the leading axes, or a middle one; along the last axis, the first
    *[_row("GatherElementsBroadcast", f"-{name}", [("data", s, d), ("indices", si, I32)], axis=ax, shape=out)
      for name, s, si, out, ax, d in (
          ("lead", [6, 5, 7], [1, 5, 3], [6, 5, 3], -1, F), ("middle", [3, 4, 5], [3, 1, 5], [3, 4, 5], 2, I32),
          ("axis0", [4, 3, 2], [2, 1, 2], [2, 3, 2], 0, B),
          ("odd", [5, 3, 17, 9], [1, 1, 13, 4], [5, 3, 13, 4], 3, F))],
    # ... written transposed (perm): DeBERTa's position-to-content term, the gathered axis moved, rank 4 reversed
    *[_row("GatherElementsBroadcast", f"-{name}", [("data", s, d), ("indices", si, I32)], axis=ax, shape=out,
           perm=perm)
      for name, s, si, out, ax, perm, d in (
          ("p2c", [6, 5, 7], [1, 5, 5], [6, 5, 5], -1, [0, 2, 1], F),
          ("moved-axis", [3, 4, 5], [3, 1, 5], [3, 4, 5], 2, [2, 0, 1], I32),
          ("reversed", [5, 3, 17, 9], [1, 1, 13, 4], [5, 3, 13, 4], 3, [3, 2, 1, 0], F))],
    # GatherND: batch_dims 0 and 1, full index tuples (scalar gathers), negative indices
    *[_row("GatherND", f"-b{b}", [("data", s, d), ("indices", si, I32)], {"indices": _ints(iv)}, batch_dims=b)
      for s, si, iv, b, d in (
          ([2, 2], [2, 2], [[0, 0], [1, 1]], 0, I32), ([2, 2], [2, 1], [[1], [0]], 0, F),
          ([2, 2, 2], [2, 1, 2], [[[0, 1]], [[1, 0]]], 0, F), ([2, 2, 2], [2, 1], [[1], [0]], 1, F),
          ([3, 4, 5, 6], [3, 2, 2], [[[1, -1], [0, 4]], [[3, 2], [-4, 0]], [[2, 2], [1, 1]]], 1, B),
          ([4], [2, 1], [[-1], [2]], 0, F))],
    # ScatterElements: every reduction, duplicate indices, i32 data
    *[_row("ScatterElements", f"-{red}@{ax}", [("data", s, d), ("indices", si, I32), ("updates", si, d)],
           {"indices": _ints(iv)}, axis=ax, reduction=red)
      for red in ("none", "add", "mul", "max", "min") for s, si, iv, ax, d in (
          ([3, 3], [2, 3], [[1, 0, 2], [0, 2, 1]], 0, F), ([1, 5], [1, 4], [[1, 1, -2, 1]], 1, F),
          ([4, 3, 2], [2, 3, 2], [[[3, 0], [1, 1], [0, 3]], [[3, 3], [-1, 2], [0, 0]]], 0, I32))],
    _row("ScatterElements", "-none-bool", [("data", [3, 4], B), ("indices", [3, 2], I32), ("updates", [3, 2], B)],
         {"indices": _ints([[0, 3], [1, 2], [3, 3]])}, axis=1),
    # ScatterND: slices and single elements, duplicate rows under the reductions
    *[_row("ScatterND", f"-{red}", [("data", s, d), ("indices", si, I32), ("updates", su, d)],
           {"indices": _ints(iv)}, reduction=red)
      for red in ("none", "add", "mul", "max", "min") for s, si, su, iv, d in (
          ([4, 3, 2], [2, 1], [2, 3, 2], [[3], [1]] if red == "none" else [[0], [0]], F),
          ([8], [4, 1], [4], [[4], [3], [1], [-1]] if red == "none" else [[4], [3], [4], [-4]], I32),
          ([3, 4, 5], [2, 2, 2], [2, 2, 5], [[[0, 1], [2, 3]], [[1, 0], [2, 3]]] if red == "none"
           else [[[0, 1], [2, 3]], [[0, 1], [2, -1]]], F))],
    _row("ScatterND", "-none-bool", [("data", [3, 4], B), ("indices", [2, 2], I32), ("updates", [2], B)],
         {"indices": _ints([[0, 3], [2, 1]])}),
    # OneHot: i32 and f32 indices (truncated), negative and out-of-range indices, values of each dtype
    *[_row("OneHot", f"@{ax}", [("indices", si, di), ("values", [2], dv)], {"indices": iv}, depth=depth, axis=ax)
      for si, di, iv, depth, ax, dv in (
          ([3], I32, _ints([0, 7, 8]), 12, -1, I32), ([2, 2], F, np.array([[1.0, 9.7], [-2.5, 4.0]]), 10, 1, F),
          ([3], I32, _ints([5, -6, -1]), 5, 0, F), ([2, 3], I32, _ints([[0, 1, 2], [-1, -2, -3]]), 3, -2, B),
          ([], I32, _ints(2), 4, 0, F))],
    # Concat of the dtypes the shape family's f32 rows leave out
    Row("Concat", "Concat-i32-axis2", lambda g: g.concat(
        [g.input("a", [2, 3, 4], I32), g.input("b", [2, 3, 1], I32), g.input("c", [2, 3, 5], I32)], axis=2)),
    Row("Concat", "Concat-bool-axis0", lambda g: g.concat([g.input("a", [2, 5], B), g.input("b", [3, 5], B)], axis=0)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def _computed_gather(device):
    # Gather of bool data [3, 4, 5] along axis -2 by indices computed on the device (fed + 5)
    g = Graph()
    five = g.constant(np.array(5, dtype=np.int32), shape=(), dtype=I32)
    g.set_outputs([g.add_node("Gather", (g.input("data", [3, 4, 5], B), g.add(g.input("idx", [4], I32), five)),
                             axis=-2)])
    return g, Session(lower(g, dict(device.limits)), {}, device=device)


def test_gather_clamps_indices_computed_out_of_range(device):
    g, session = _computed_gather(device)
    feeds = {"data": np.random.default_rng(3).integers(0, 2, (3, 4, 5)).astype(bool),
             "idx": _ints([-8, 2, -14, -3])}  # + 5: -3 (from the end), 7 and -9 (clamped to 3 and 0), 2
    (got,) = session.run(feeds)
    (want,) = evaluate(g, feeds, {})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, feeds["data"][:, [1, 3, 0, 2], :])


@pytest.mark.parametrize("bad", [4, -5])
def test_gather_refuses_fed_indices_outside_the_axis(device, bad):
    # ONNX makes a Gather index outside [-4, 4) an error (onnxruntime raises): the session refuses it by name
    g = Graph()
    g.set_outputs([g.add_node("Gather", (g.input("data", [3, 4, 5], F), g.input("idx", [2], I32)), axis=1)])
    session = Session(lower(g, dict(device.limits)), {}, device=device)
    data = np.zeros((3, 4, 5), np.float32)
    session.run({"data": data, "idx": _ints([-4, 3])})
    with pytest.raises(InputError, match=rf"input 'idx': index {bad} out of range for the axis of 4 that Gather "
                                         rf"\(node \d+\) indexes with it"):
        session.run({"data": data, "idx": _ints([0, bad])})
