"""The movement and indexing ops without a GPU: shape rules and their refusals, the strided
copy's dimension merging and rank limit, the pad value's bits, and the references' documented
choices (clamped indices, scatter order)."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import DType, Graph, GraphError, LoweringError, evaluate
from eggfuse.ir.kernel import Target
from eggfuse.ir.ops.movement import fill_bits, fill_value
from eggfuse.ir.spec import OPS
from eggfuse.lowering.limits import DEFAULT_LIMITS

F, I32, B = DType.F32, DType.I32, DType.BOOL


def _node(op, inputs, **attrs):
    g = Graph()
    ids = [g.input(f"in{i}", s, d) for i, (s, d) in enumerate(inputs)]
    return g, g.node(g.add_node(op, ids, **attrs))


def _kernel(op, inputs, **attrs):
    g, node = _node(op, inputs, **attrs)
    k = OPS[op].kernel(node, [g.node(i).type for i in node.inputs], Target(DEFAULT_LIMITS))
    return dict((name, value) for name, _, value in k.params), k


GOOD = [
    ("Permute", [([2, 3, 4], B)], {"perm": (2, 0, 1)}, (4, 2, 3), B),
    ("Permute", [([], F)], {"perm": ()}, (), F),
    ("Slice", [([7, 13], I32)], {"starts": (-1,), "ends": (-100,), "axes": (1,), "steps": (-3,)}, (7, 5), I32),
    ("Slice", [([5, 6], F)], {"starts": (1, 0), "ends": (2**40, 3)}, (4, 3), F),
    ("Expand", [([3, 1], B)], {"shape": (2, 1, 6)}, (2, 3, 6), B),
    ("Pad", [([2, 3], F)], {"pads": (1, 0, 2, 3), "mode": "wrap"}, (5, 6), F),
    ("Tile", [([2, 3], I32)], {"repeats": (3, 1)}, (6, 3), I32),
    ("Trilu", [([4, 5, 6], B)], {"upper": False, "k": -1}, (4, 5, 6), B),
    ("ReverseSequence", [([5, 3, 2], F), ([3], I32)], {}, (5, 3, 2), F),
    ("Gather", [([5, 4], B), ([2, 3], I32)], {"axis": 1}, (5, 2, 3), B),
    ("Gather", [([5], F), ([], I32)], {}, (), F),
    ("GatherElements", [([3, 4], I32), ([2, 7], I32)], {"axis": 1}, (2, 7), I32),
    ("GatherND", [([2, 3, 4], F), ([2, 5, 1], I32)], {"batch_dims": 1}, (2, 5, 4), F),
    ("GatherND", [([2, 3], F), ([2], I32)], {}, (), F),
    ("ScatterElements", [([3, 4], F), ([2, 4], I32), ([2, 4], F)], {"reduction": "mul"}, (3, 4), F),
    ("ScatterND", [([4, 5], I32), ([3, 1], I32), ([3, 5], I32)], {"reduction": "max"}, (4, 5), I32),
    ("OneHot", [([2, 3], F), ([2], B)], {"depth": 4, "axis": 1}, (2, 4, 3), B),
]


@pytest.mark.parametrize("op,inputs,attrs,shape,dtype", GOOD, ids=[f"{r[0]}-{i}" for i, r in enumerate(GOOD)])
def test_shape_rules_give_the_onnx_shape_and_keep_the_dtype(op, inputs, attrs, shape, dtype):
    _, node = _node(op, inputs, **attrs)
    assert node.type.shape == shape and node.type.dtype is dtype


BAD = [
    ("Permute", [([2, 3], F)], {"perm": (0, 0)}, r"perm \[0, 0\] is not a permutation"),
    ("Slice", [([2, 3], F)], {"starts": (2,), "ends": (1,)}, r"zero dimension"),
    ("Slice", [([2, 3], F)], {"starts": (0,), "ends": (1,), "steps": (0,)}, r"a step is 0"),
    ("Slice", [([2, 3], F)], {"starts": (0, 0), "ends": (1, 1), "axes": (1, -1)}, r"axis 1 is sliced twice"),
    ("Expand", [([3, 2], F)], {"shape": (4, 1)}, r"does not broadcast with shape \[4, 1\]"),
    ("Pad", [([2, 3], F)], {"pads": (1, 0, -1, 0)}, r"must be >= 0"),
    ("Pad", [([2, 3], F)], {"pads": (1, 0)}, r"must hold 4 values"),
    ("Pad", [([2, 3], F)], {"pads": (0, 0, 0, 0), "mode": "mirror"}, r"mode 'mirror' is not one of"),
    ("Tile", [([2, 3], F)], {"repeats": (2,)}, r"repeats \[2\] must be 2 values >= 1"),
    ("Trilu", [([3], F)], {}, r"rank >= 2"),
    ("ReverseSequence", [([5, 3], F), ([5], I32)], {}, r"sequence_lens must be i32 \[3\]"),
    ("Gather", [([5, 4], F), ([2], F)], {}, r"indices must be i32"),
    ("Gather", [([5, 4], F), ([2], I32)], {"axis": 2}, r"axis 2 out of range for rank 2"),
    ("GatherElements", [([3, 4], F), ([4, 2], I32)], {"axis": 1}, r"no larger dims than data"),
    ("GatherND", [([2, 3], F), ([2, 3], I32)], {}, r"last dim 3 must be in 1..2"),
    ("GatherND", [([2, 3], F), ([3, 1], I32)], {"batch_dims": 1}, r"first 1 dims .* differ"),
    ("ScatterElements", [([3, 4], F), ([2, 4], I32), ([2, 3], F)], {}, r"updates f32\[2,3\] must be"),
    ("ScatterElements", [([3, 4], B), ([2, 4], I32), ([2, 4], B)], {"reduction": "add"}, r"needs f32 or i32"),
    ("ScatterND", [([4, 5], F), ([3, 1], I32), ([3, 4], F)], {}, r"must be of data's dtype and shape \[3, 5\]"),
    ("ScatterND", [([4], F), ([1, 1], I32), ([1], F)], {"reduction": "xor"}, r"reduction 'xor' is not one of"),
    ("OneHot", [([3], I32), ([3], F)], {"depth": 4}, r"values must hold \[off, on\]"),
    ("GatherElements", [([1] * 9, F), ([1] * 9, I32)], {}, r"rank 9; the kernel addresses 8"),
]


@pytest.mark.parametrize("op,inputs,attrs,match", BAD, ids=[f"{r[0]}-{i}" for i, r in enumerate(BAD)])
def test_shape_rules_refuse_naming_the_op(op, inputs, attrs, match):
    with pytest.raises(GraphError, match=match) as e:
        _node(op, inputs, **attrs)
    assert op in str(e.value)


def test_the_strided_copy_merges_contiguous_and_drops_unit_dimensions():
    p, _ = _kernel("Permute", [([2, 1, 3, 4], F)], perm=(0, 1, 3, 2))  # [2, 4, 3] after dropping the 1
    assert p["rank"] == 3 and p["dims"][:3] == [2, 4, 3] and p["coef"][:3] == [12, 1, 4]
    p, _ = _kernel("Slice", [([4, 5], F)], starts=(-1, -1), ends=(-9, -9), steps=(-1, -1))  # one reversed run
    assert p["rank"] == 1 and p["dims"][0] == 20 and p["coef"][0] == -1 and p["base"] == 19
    p, _ = _kernel("Expand", [([3, 1], F)], shape=(2, 1, 1, 6))  # [2, 3, 6]: x's strides 0, 1, 0
    assert p["rank"] == 3 and p["coef"][:3] == [0, 1, 0]
    p, k = _kernel("Tile", [([2, 3, 4], I32)], repeats=(1, 1, 2))  # the untiled [2, 3] merge into 6
    assert p["rank"] == 2 and p["dims"][:2] == [6, 8] and p["ext"][:2] == [6, 4] and "wrap" in k.name


def test_the_strided_copy_refuses_more_than_eight_dimensions_by_name():
    with pytest.raises(LoweringError, match=r"node 1 \(Permute, f32\[3,3,2,3,2,3,2,3,2\]\): the strided copy "
                                            r"addresses 8 dimensions; this one needs 9"):
        _kernel("Permute", [([2, 3] * 4 + [3], F)], perm=tuple(reversed(range(9))))


@pytest.mark.parametrize("value,dtype", [(1.5, F), (-np.inf, F), (np.nan, F), (-7, I32), (2**31 - 1, I32),
                                         (True, B), (0, B)])
def test_pad_fill_bits_round_trip(value, dtype):
    ref = {F: np.float64, I32: np.int64, B: np.bool_}[dtype]
    back = fill_value(fill_bits(value, dtype), np.dtype(ref))
    assert back == value or (np.isnan(value) and np.isnan(back))


def test_indices_from_the_end_and_out_of_range_are_clamped_in_the_reference():
    g = Graph()
    data, idx = g.input("d", [4]), g.input("i", [5], I32)
    g.set_outputs([g.add_node("Gather", (data, idx))])
    (got,) = evaluate(g, {"d": np.array([10.0, 11, 12, 13]), "i": np.array([-1, -4, 7, -9, 2])}, {})
    assert got.tolist() == [13, 10, 13, 10, 12]


def test_scatters_apply_duplicates_in_onnx_order():
    g = Graph()
    data, idx, upd = g.input("d", [3]), g.input("i", [4, 1], I32), g.input("u", [4])
    g.set_outputs([g.add_node("ScatterND", (data, idx, upd)),
                   g.add_node("ScatterElements", (data, g.reshape(idx, [4]), upd), reduction="add")])
    feeds = {"d": np.array([1.0, 2, 3]), "i": np.array([[0], [2], [0], [-3]]), "u": np.array([5.0, 6, 7, 8])}
    nd, el = evaluate(g, feeds, {})
    assert nd.tolist() == [8, 2, 6] and el.tolist() == [21, 2, 9]
