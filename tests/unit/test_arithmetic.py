"""The broadcasting ops of ir/ops/arithmetic.py without a GPU: shape and dtype rules, the numpy
references against onnx's reference implementation of the same operators
(onnx.reference.ReferenceEvaluator, an independent oracle) on every dtype, the int32 semantics
the references model (wrapping, truncation, shifts), and the merging of broadcast dimensions
that the kernel relies on (against numpy's broadcasting)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from eggfuse.ir import DType, Graph, GraphError, LoweringError, evaluate
from eggfuse.ir.ops.arithmetic import POINTWISE
from eggfuse.ir.ops.broadcasting import MAX_RANK, broadcast_kernel, merge_broadcast
from eggfuse.lowering import lower

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL
_ONNX = {F32: TensorProto.FLOAT, I32: TensorProto.INT32, BOOL: TensorProto.BOOL}


def _leaves(g: Graph, dtypes, shapes) -> list[int]:
    return [g.input(f"in{i}", s, d) for i, (d, s) in enumerate(zip(dtypes, shapes, strict=True))]


# --- shape and dtype rules -------------------------------------------------------------------------

GOOD = [
    ("Add", (I32, I32), [[2, 1, 3], [4, 1]], {}, (2, 4, 3), I32),
    ("Sub", (F32, F32), [[], [5]], {}, (5,), F32),
    ("Pow", (I32, F32), [[3], []], {}, (3,), I32),
    ("Pow", (F32, I32), [[3], [3]], {}, (3,), F32),
    ("Mod", (F32, F32), [[2, 3], [3]], {"fmod": 1}, (2, 3), F32),
    ("Less", (I32, I32), [[4, 1], [5]], {}, (4, 5), BOOL),
    ("Equal", (BOOL, BOOL), [[2], [2]], {}, (2,), BOOL),
    ("And", (BOOL, BOOL), [[1, 3], [2, 1]], {}, (2, 3), BOOL),
    ("BitShift", (I32, I32), [[6], [1]], {"direction": "RIGHT"}, (6,), I32),
    ("Where", (BOOL, F32, F32), [[3, 1], [1, 4], []], {}, (3, 4), F32),
    ("Where", (BOOL, BOOL, BOOL), [[2], [2], [2]], {}, (2,), BOOL),
    ("Clip", (I32, I32, I32), [[2, 3], [], []], {}, (2, 3), I32),
    ("PRelu", (F32, F32), [[2, 3, 4], [3, 1]], {}, (2, 3, 4), F32),
    ("Cast", (F32,), [[2, 3]], {"to": "bool"}, (2, 3), BOOL),
    ("Cast", (BOOL,), [[]], {"to": "i32"}, (), I32),
    ("Greater", (F32, F32), [[3, 5], [5]], {}, (3, 5), F32),
    ("Add", (F32, F32), [[2, 1, 2, 1, 2, 1, 2, 1, 2], [3, 1, 3, 1, 3, 1, 3, 1]], {}, (2, 3, 2, 3, 2, 3, 2, 3, 2), F32),
]

BAD = [
    ("Add", (BOOL, BOOL), [[3], [3]], {},
     r"dtypes \(bool, bool\) are not supported; Add takes \(f32, f32\) or \(i32, i32\)"),
    ("Add", (F32, I32), [[3], [3]], {}, r"dtypes \(f32, i32\) are not supported"),
    ("Mul", (F32, F32), [[3, 5], [4]], {}, r"shapes f32\[3,5\], f32\[4\] do not broadcast"),
    ("Less", (BOOL, BOOL), [[2], [2]], {}, r"Less takes \(f32, f32\) or \(i32, i32\)"),
    ("Not", (I32,), [[2]], {}, r"Not takes \(bool\)"),
    ("BitwiseAnd", (F32, F32), [[2], [2]], {}, r"BitwiseAnd takes \(i32, i32\)"),
    ("Where", (F32, F32, F32), [[2], [2], [2]], {}, r"Where takes \(bool, f32, f32\)"),
    ("Where", (BOOL, F32, F32), [[3], [2], [2]], {}, r"do not broadcast"),
    ("PRelu", (F32, F32), [[5], [3, 5]], {}, r"slope f32\[3,5\] must broadcast to x f32\[5\]"),
    ("Mod", (I32, I32), [[2], [2]], {"fmod": 2}, r"fmod = 2 must be 0 or 1"),
    ("BitShift", (I32, I32), [[2], [2]], {"direction": "UP"}, r"direction = 'UP' must be LEFT or RIGHT"),
    ("Cast", (F32,), [[2]], {"to": "u32"}, r"to = 'u32': Cast converts to f32, i32 or bool"),
    ("Greater", (I32, I32), [[2], [2]], {}, r"Greater takes \(f32, f32\)"),
]


@pytest.mark.parametrize("op,dtypes,shapes,attrs,shape,dtype", GOOD, ids=[f"{r[0]}{r[2]}" for r in GOOD])
def test_shape_rule_accepts(op, dtypes, shapes, attrs, shape, dtype):
    g = Graph()
    t = g.node(g.add_node(op, _leaves(g, dtypes, shapes), **attrs)).type
    assert t.shape == shape and t.dtype is dtype


@pytest.mark.parametrize("op,dtypes,shapes,attrs,match", BAD, ids=[f"{r[0]}-{r[4][:20]}" for r in BAD])
def test_shape_rule_rejects(op, dtypes, shapes, attrs, match):
    g = Graph()
    with pytest.raises(GraphError, match=match) as e:
        g.add_node(op, _leaves(g, dtypes, shapes), **attrs)
    assert op in str(e.value)


# --- references against onnx's reference implementation -------------------------------------------

#: rows not checked against the ONNX operator of their name: Greater is the seed's f32 mask (below),
#: Cast's rows are by target dtype (the end of _cases)
_OTHER = {"Greater", "Cast"}


def _random(dtype: DType, shape, rng, positive: bool = False) -> np.ndarray:
    if dtype is F32:
        x = rng.standard_normal(shape).astype(np.float32) * 3
        return np.abs(x) + 0.5 if positive else x
    if dtype is I32:
        x = rng.integers(-50, 51, shape).astype(np.int32)
        return np.where(x == 0, 7, np.abs(x)).astype(np.int32) if positive else x
    return rng.random(shape) < 0.5


def _onnx_run(op: str, arrays, attrs, out_elem: int, opset: int = 28):
    names = [f"x{i}" for i in range(len(arrays))]
    n = helper.make_node(op, names, ["y"], **attrs)
    ins = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for nm, a in zip(names, arrays, strict=True)]
    g = helper.make_graph([n], "t", ins, [helper.make_tensor_value_info("y", out_elem, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(m).run(None, dict(zip(names, arrays, strict=True)))[0]


def _cases():
    for row in POINTWISE:
        if row.name in _OTHER:
            continue
        for sig in row.signatures:
            variants = [{}]
            if row.name == "Mod":
                variants = [{"fmod": 1}, {"fmod": 0}]
            if row.name == "BitShift":
                variants = [{"direction": "LEFT"}, {"direction": "RIGHT"}]
            for attrs in variants:
                yield pytest.param(row.name, sig, attrs, id=f"{row.name}{[d.value for d in sig]}{attrs or ''}")
    for src in (F32, I32, BOOL):
        for to in (F32, I32, BOOL):
            yield pytest.param("Cast", (src,), {"to": to.value}, id=f"Cast-{src.value}-to-{to.value}")


@pytest.mark.parametrize("op,sig,attrs", list(_cases()))
def test_reference_matches_onnx_reference(op, sig, attrs):
    rng = np.random.default_rng(zlib.crc32(f"{op}{sig}{attrs}".encode()))
    shapes = [[2, 3, 4], [3, 1], [4]][:len(sig)] if op != "PRelu" else [[2, 3, 4], [3, 1]]
    # operand values ONNX defines: no division by zero, no 0^-n, no NaN (a negative base, a non-integer
    # exponent) cast to an integer
    positive = {"Div": (1,), "Mod": (1,), "Pow": (1,) if sig != (I32, F32) else (0, 1)}.get(op, ())
    arrays = [_random(d, s, rng, positive=i in positive) for i, (d, s) in enumerate(zip(sig, shapes, strict=True))]
    if op == "Pow":
        arrays[1] = (arrays[1] % 4).astype(arrays[1].dtype)  # no int overflow
    if op == "BitShift":
        arrays[1] = rng.integers(0, 31, arrays[1].shape).astype(np.int32)
    g = Graph()
    node = g.add_node(op, _leaves(g, sig, [a.shape for a in arrays]), **attrs)
    g.set_outputs([node])
    (got,) = evaluate(g, {f"in{i}": a for i, a in enumerate(arrays)}, {})
    out = g.node(node).type.dtype
    onnx_attrs = {"to": _ONNX[DType(attrs["to"])]} if op == "Cast" else attrs
    want = _onnx_run(op, arrays, onnx_attrs, _ONNX[out])
    assert got.shape == want.shape
    if out is F32:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_greater_is_the_f32_mask_and_onnx_greater_is_less_swapped():
    a, b = np.array([1.0, 2.0, 3.0, -1.0]), np.array([2.0, 2.0, 1.0, -2.0])
    g = Graph()
    x, y = g.input("x", [4]), g.input("y", [4])
    g.set_outputs([g.add_node("Greater", (x, y)), g.add_node("Less", (y, x))])
    mask, less = evaluate(g, {"x": a, "y": b}, {})
    onnx_greater = _onnx_run("Greater", [a.astype(np.float32), b.astype(np.float32)], {}, TensorProto.BOOL)
    np.testing.assert_array_equal(mask, onnx_greater.astype(np.float64))
    np.testing.assert_array_equal(less, onnx_greater)


# --- int32 semantics of the references ----------------------------------------------------------------

def _eval(op: str, dtypes, values, **attrs) -> np.ndarray:
    arrays = [np.asarray(v, dtype=d.numpy) for d, v in zip(dtypes, values, strict=True)]
    g = Graph()
    g.set_outputs([g.add_node(op, _leaves(g, dtypes, [a.shape for a in arrays]), **attrs)])
    return evaluate(g, {f"in{i}": a for i, a in enumerate(arrays)}, {}, check_finite=False)[0]


def test_int32_results_wrap_as_the_device_computes_them():
    top = 2**31 - 1
    assert list(_eval("Add", (I32, I32), ([top, -top - 1], [1, -1]))) == [-(2**31), top]
    assert list(_eval("Mul", (I32, I32), ([65536, 3], [65536, top]))) == [0, top - 2]
    assert list(_eval("Div", (I32, I32), ([-7, 7, -(2**31), 5], [2, -2, -1, 0]))) == [-3, -3, -(2**31), 5]
    assert list(_eval("Mod", (I32, I32), ([-7, 7, 5], [2, -2, 0]), fmod=0)) == [1, -1, 0]
    assert list(_eval("Mod", (I32, I32), ([-7, 7, 5], [2, -2, 0]), fmod=1)) == [-1, 1, 0]
    assert list(_eval("Pow", (I32, I32), ([2, 3, -1, 2], [31, 21, -3, -1]))) == [-(2**31), 3**21 - 2 * 2**32, -1, 0]
    assert list(_eval("Pow", (I32, F32), ([3, 10, 2], [6.0, 0.5, 40.0]))) == [729, 3, 0]
    assert list(_eval("BitShift", (I32, I32), ([1, -8, 5], [31, 1, 32]), direction="LEFT")) == [-(2**31), -16, 0]
    assert list(_eval("BitShift", (I32, I32), ([-8, -8, 8], [1, 40, -1]), direction="RIGHT")) == [-4, -1, 0]
    assert list(_eval("Cast", (F32,), ([2.9, -2.9, 3e9, -3e9, float("nan")],), to="i32")) == \
        [2, -2, 2147483520, -(2**31), 0]


def test_float_special_values_follow_numpy():
    nan, inf = float("nan"), float("inf")
    np.testing.assert_array_equal(_eval("Min", (F32, F32), ([nan, 1.0], [0.0, nan])), [nan, nan])
    np.testing.assert_array_equal(_eval("Pow", (F32, F32), ([-8.0, -2.0, 0.0, nan], [1 / 3, 3.0, -1.0, 0.0])),
                                  [nan, -8.0, inf, 1.0])
    np.testing.assert_array_equal(_eval("Mod", (F32, F32), ([-3.0, 3.0, 5.0], [inf, inf, 0.0]), fmod=0),
                                  [inf, 3.0, nan])
    np.testing.assert_array_equal(_eval("Clip", (F32, F32, F32), ([nan, 5.0, 0.0], [0.0, 0.0, 2.0], [1.0, 1.0, 1.0])),
                                  [nan, 1.0, 1.0])  # min > max gives max (ONNX Clip)
    np.testing.assert_array_equal(_eval("Cast", (F32,), ([nan, 0.0, -0.0, 2.0],), to="bool"),
                                  [True, False, False, True])


# --- merging broadcast dimensions ------------------------------------------------------------------

MERGES = [
    ((7, 13), [(7, 13), (7, 13)], [91]),
    ((7, 13), [(7, 13), (13,)], [7, 13]),
    ((), [(), ()], []),
    ((5,), [(), (5,)], [5]),
    ((2, 3, 4, 5), [(2, 3, 4, 5), (3, 1, 5), ()], [2, 3, 4, 5]),
    ((2, 3, 4, 5), [(2, 3, 4, 5), (1, 1, 4, 5), (2, 3, 1, 1)], [6, 20]),
    ((2, 5, 3, 6, 4, 7), [(2, 1, 3, 1, 4, 1), (5, 1, 6, 1, 7)], [2, 5, 3, 6, 4, 7]),
    ((3, 4, 5), [(3, 4, 5), (1, 1, 1), (3, 4, 5)], [60]),
    ((2, 3, 2, 3, 2, 3, 2, 3), [(2, 1, 2, 1, 2, 1, 2, 1), (3, 1, 3, 1, 3, 1, 3)], [2, 3, 2, 3, 2, 3, 2, 3]),
]


@pytest.mark.parametrize("out,shapes,dims", MERGES, ids=[str(m[1]) for m in MERGES])
def test_merged_strides_address_numpy_broadcasting(out, shapes, dims):
    got_dims, strides = merge_broadcast(out, shapes)
    assert got_dims == dims
    arrays = [np.arange(math.prod(s)).reshape(s) for s in shapes]
    want = np.broadcast_arrays(*arrays, np.empty(out))[:-1]
    coords = np.stack(np.unravel_index(np.arange(math.prod(out)), dims), axis=1) if dims else np.zeros((1, 0), int)
    for st, w in zip(strides, want, strict=True):
        assert (coords @ np.array(st, dtype=int) == w.ravel()).all()


def test_the_kernel_reads_operands_laid_out_as_the_output_at_its_index():
    k = broadcast_kernel("binary_Add", "av + bv", (7, 13), [(7, 13), (7, 13)], ["f32", "f32"], "f32")
    assert k.slots["LOADS"] == "    let av = a[i];\n    let bv = b[i];" and [p[0] for p in k.params] == ["n"]
    k = broadcast_kernel("binary_Add", "av + bv", (7, 13), [(7, 13), ()], ["f32", "f32"], "f32")
    assert "b[0]" in k.slots["LOADS"]
    k = broadcast_kernel("ternary_Where", "select(cv, bv, av != 0u)", (2, 5, 3, 6, 4, 7),
                         [(2, 1, 3, 1, 4, 1), (5, 1, 6, 1, 7), ()], ["u32", "f32", "f32"], "f32")
    assert {p[0] for p in k.params} == {"dims", "dims_hi", "inner", "sa", "sa_hi", "sb", "sb_hi", "n"}


def test_a_broadcast_past_the_kernel_rank_is_refused_naming_the_op():
    shape_a, shape_b = [2, 1] * 5, [3, 1] * 4 + [3]
    g = Graph()
    g.set_outputs([g.add_node("Add", (g.input("a", shape_a), g.input("b", shape_b)))])
    assert len(merge_broadcast(g.node(2).type.shape, [shape_a, shape_b])[0]) == 10 > MAX_RANK
    with pytest.raises(LoweringError, match=r"binary_Add: broadcast of .* keeps 10 dimensions after merging; the "
                                            r"broadcasting kernel handles 8"):
        lower(g)
