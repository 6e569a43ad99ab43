"""The broadcasting ops of ir/ops/arithmetic.py on the GPU against the numpy reference: every
op on every dtype it takes, equal shapes, broadcasts (rank 0, odd sizes, up to 8 dimensions
after merging), integer edge values (wrapping, division by zero, shift amounts out of range)
and IEEE special values (NaN, infinities, signed zeros) fed as constants, since the runtime
refuses non-finite inputs. Rows of Add, Mul and Greater on f32 are in tests/gpu/test_ops.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL
NAN, INF = float("nan"), float("inf")
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

# (x shape, y shape): equal, broadcast from the left and right, rank 0, odd sizes, and
# shapes keeping 5, 6 and 8 dimensions after merging
PAIRS = [([7, 13], [7, 13]), ([7, 13], [13]), ([65, 1], [1, 33]), ([], [5]), ([3, 1, 5], []),
         ([2, 1, 3, 1, 4], [5, 1, 6, 1]), ([2, 1, 3, 1, 4, 1], [1, 5, 1, 6, 1, 7]),
         ([2, 1, 2, 1, 2, 1, 2, 1], [1, 3, 1, 3, 1, 3, 1, 3])]


def _op(op: str, dtypes, shapes, attrs=None, tag: str = "", feeds=None, **kw) -> Row:
    names = "xyz"

    def build(g: Graph) -> int:
        ins = [g.input(n, s, d) for n, s, d in zip(names, shapes, dtypes, strict=False)]
        return g.add_node(op, ins, **(attrs or {}))

    sig = ",".join(f"{d.value}{list(s)}" for d, s in zip(dtypes, shapes, strict=True))
    extra = "".join(f"-{k}={v}" for k, v in (attrs or {}).items())
    return Row(op, f"{op}({sig}){extra}{tag}", build, feeds or {}, **kw)


def _consts(op: str, values, dtype: DType = F32, attrs=None, tag: str = "") -> Row:
    """``op`` on constants holding ``values`` (one array per operand, broadcast): special values the
    runtime would refuse as inputs."""
    def build(g: Graph) -> int:
        ins = [g.constant(np.asarray(v), shape=np.shape(v), dtype=dtype) for v in values]
        return g.add_node(op, ins, **(attrs or {}))

    return Row(op, f"{op}-{tag}", build, finite=False)


def _feeds(op: str, dtypes, values, attrs=None, tag: str = "", **kw) -> Row:
    arrays = [np.asarray(v) for v in values]
    feeds = {n: a.astype(d.numpy) for n, a, d in zip("xyz", arrays, dtypes, strict=False)}
    return _op(op, dtypes, [a.shape for a in arrays], attrs, tag, feeds, **kw)


ROWS: list[Row] = []

# arithmetic on f32 and i32, every broadcast pair (Add and Mul on i32 only: their f32 rows are in test_ops.py)
for _op_name, _dtypes in (("Add", (I32,)), ("Mul", (I32,)), ("Sub", (F32, I32)), ("Div", (F32, I32)),
                          ("Min", (F32, I32)), ("Max", (F32, I32))):
    for _d in _dtypes:
        ROWS += [_op(_op_name, (_d, _d), p) for p in PAIRS]
ROWS += [_op("Add", (F32, F32), p) for p in PAIRS[3:]]  # rank 0 and the shapes past 4 dimensions
ROWS += [_op("Mod", (d, d), p, {"fmod": f}) for d in (F32, I32) for f in (0, 1) for p in PAIRS[:4] + PAIRS[6:7]]
ROWS += [_op("Pow", sig, p, finite=sig[0] is not F32)  # f32: NaN for a negative base and a non-integer exponent
         for sig in ((F32, F32), (F32, I32), (I32, I32), (I32, F32)) for p in PAIRS[:3]]
_PRELU = ([[7, 13], [7, 13]], [[3, 4, 5], [5]], [[2, 3, 5], [3, 1]], [[5], []], [[2, 1, 3, 1, 4, 1], [1, 1, 4, 1]])
ROWS += [_op("PRelu", (d, d), p) for d in (F32, I32) for p in _PRELU]
# comparisons and logic
ROWS += [_op(op, (d, d), p) for op in ("Equal", "Less", "LessOrEqual") for d in (F32, I32)
         for p in PAIRS[:4] + PAIRS[6:7]]
ROWS += [_op("Equal", (BOOL, BOOL), p) for p in PAIRS[:3]]
ROWS += [_op(op, (BOOL, BOOL), p) for op in ("And", "Or", "Xor") for p in PAIRS[:5] + PAIRS[7:]]
ROWS += [_op("Not", (BOOL,), [s]) for s in ([7, 13], [], [2, 3, 4, 5, 6])]
ROWS += [_op(op, (I32, I32), p) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor") for p in PAIRS[:4] + PAIRS[6:7]]
ROWS += [_op("BitwiseNot", (I32,), [s]) for s in ([7, 13], [])]
ROWS += [_op("BitShift", (I32, I32), p, {"direction": d}) for d in ("LEFT", "RIGHT") for p in PAIRS[:3]]
ROWS += [_op("Sign", (d,), [s]) for d in (F32, I32) for s in ([7, 13], [])]
# Where and Clip (three operands)
ROWS += [_op("Where", (BOOL, d, d), shapes) for d in (F32, I32, BOOL) for shapes in (
    [[7, 13], [7, 13], [7, 13]], [[13], [7, 13], []], [[7, 1], [1, 13], [7, 13]], [[], [5], [5]],
    [[2, 1, 3, 1, 4, 1], [1, 5, 1, 6, 1, 1], [1, 1, 1, 1, 1, 7]])]
ROWS += [_op("Clip", (d, d, d), shapes) for d in (F32, I32) for shapes in (
    [[7, 13], [], []], [[65, 33], [33], [65, 1]], [[], [], []], [[2, 1, 3, 1, 4, 1], [1, 5, 1, 6, 1, 7], []])]
# Cast between every pair of dtypes (and to its own)
ROWS += [_op("Cast", (d,), [s], {"to": t.value}, scale=40.0) for d in (F32, I32, BOOL) for t in (F32, I32, BOOL)
         for s in ([7, 13], [])]

# --- integer edge values ---------------------------------------------------------------------------

_EDGE = np.array([I32_MIN, I32_MIN + 1, -7, -1, 0, 1, 7, I32_MAX - 1, I32_MAX])
_EX, _EY = np.meshgrid(_EDGE, _EDGE)  # every pair
ROWS += [_feeds(op, (I32, I32), (_EX, _EY), tag="-edges", **({"attrs": {"fmod": f}} if op == "Mod" else {}))
         for op, f in (("Add", 0), ("Sub", 0), ("Mul", 0), ("Div", 0), ("Mod", 0), ("Mod", 1), ("Min", 0),
                       ("Max", 0), ("Less", 0), ("Equal", 0), ("BitwiseXor", 0))]
ROWS += [_feeds("Div", (I32, I32), ([-3, 3, -3, 3, -7, 7, 5, 0], [2, 2, -2, -2, 3, -3, 0, 0]), tag="-truncates")]
ROWS += [_feeds("Mod", (I32, I32), ([-4, 7, 5, 4, -7, 8, -9, 9], [2, -3, 8, -2, 3, 5, 4, -4]), {"fmod": f},
                tag="-signs") for f in (0, 1)]
_SH_A = np.array([1, -8, I32_MAX, I32_MIN, 5, -5, 1073741824, -1])
_SH_B = np.array([31, 1, 1, 1, -1, 32, 1, 64])
ROWS += [_feeds("BitShift", (I32, I32), (_SH_A, _SH_B), {"direction": d}, tag="-amounts") for d in ("LEFT", "RIGHT")]
ROWS += [_feeds("Pow", (I32, I32), ([2, 2, -3, 3, 1, -1, -1, 5, 0, 0, 7], [10, 31, 3, 20, -5, -5, -4, -1, 0, 3, 0]),
                tag="-wraps-and-negative-exponents"),
         _feeds("Pow", (I32, F32), ([1, 2, 3, -2, 4, 9, 10], [4.0, 5.0, 6.0, 3.0, 0.5, -0.5, 1.5]), tag="-mixed"),
         _feeds("Pow", (F32, I32), ([1.5, -2.0, 0.5, -0.5, 3.0], [3, 3, -2, -3, 0]), tag="-mixed")]

# --- IEEE special values ---------------------------------------------------------------------------

# (no value whose products or quotients overflow f32 but not the float64 reference)
_S = np.array([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3e8, -1e-9])
_SX, _SY = np.meshgrid(_S, _S)  # every pair
ROWS += [_consts(op, (_SX, _SY), attrs=attrs, tag=f"specials{'' if not attrs else '-fmod' + str(attrs['fmod'])}")
         for op, attrs in (("Add", None), ("Sub", None), ("Mul", None), ("Div", None), ("Min", None), ("Max", None),
                           ("Pow", None), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1}), ("PRelu", None), ("Equal", None),
                           ("Less", None), ("LessOrEqual", None), ("Greater", None))]
ROWS += [_consts("Sign", (_S,), tag="specials"), _consts("Clip", (_S, [-1.0], [2.0]), tag="specials"),
         _consts("Clip", ([0.5, 1.5, -3.0], [NAN, 1.0, 2.0], [1.0, NAN, -1.0]), tag="nan-bounds-and-min>max"),
         *[_consts("Cast", (np.concatenate([_S, [2.9, -2.9, 2147483520.0, 3e9, -3e9]]),), attrs={"to": t},
                   tag=f"specials-to-{t}") for t in ("i32", "bool")]]
# the ONNX suite's Mod edge cases (onnx/backend/test/case/node/mod.py, fmod = 0)
ROWS.append(_consts("Mod", ([0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, INF, -INF, 1.0, 1.0, NAN, 1.0],
                            [-2.0, 2.0, 2.0, -2.0, INF, INF, -INF, -INF, 2.0, 2.0, 0.0, -0.0, 2.0, NAN]),
                    attrs={"fmod": 0}, tag="onnx-edge-cases"))

# --- precision sweeps ----------------------------------------------------------------------------

_rng = np.random.default_rng(7)
_PX = np.exp(_rng.uniform(np.log(1e-3), np.log(1e3), 4000))
_PY = _rng.uniform(-6.0, 6.0, 4000)
_MA = _rng.uniform(-1000.0, 1000.0, 4000)
_MB = np.where(_rng.random(4000) < 0.5, -1.0, 1.0) * np.exp(_rng.uniform(np.log(0.01), np.log(100.0), 4000))
_PN = _rng.integers(-12, 13, 4000).astype(np.float64)
ROWS += [_feeds("Pow", (F32, F32), (_PX, _PY), tag="-precision", rtol=4e-6, atol=0.0),  # exp2(y log2 x)
         _feeds("Pow", (F32, F32), (np.exp(_rng.uniform(-4.0, 4.0, 4000)) * np.sign(_MB), _PN),
                tag="-integer-exponents", rtol=1e-6, atol=0.0),  # square and multiply
         _feeds("Div", (F32, F32), (_MA, _MB), tag="-precision", rtol=3e-7, atol=0.0),
         *[_feeds("Mod", (F32, F32), (_MA, _MB), {"fmod": f}, tag="-precision", rtol=1e-6, atol=1e-5)
           for f in (0, 1)]]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)
