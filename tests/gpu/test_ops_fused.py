"""GPU rows of the generated elementwise kernels (``Fused``, ir/ops/fused.py) against the numpy
reference: every op a region may hold as one step of a generated kernel, on the dtypes its
table row takes, with numpy broadcasting; and regions of several steps: chains, a value read
twice, broadcasts of [1,N], [M,1], a scalar and rank 4 and 6 with size-1 axes, a comparison
feeding Where, casts, literals of every dtype, and seven inputs (the most one kernel binds).
The reference of a Fused node evaluates each step with its op's own reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops.fused import FUSABLE

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL

#: Where an op's operands are drawn (uniformly), for ops defined on part of the line only.
DOMAIN = {"Sqrt": (0.05, 9.0), "Log": (0.05, 9.0), "Asin": (-0.95, 0.95), "Acos": (-0.95, 0.95),
          "Acosh": (1.05, 9.0), "Atanh": (-0.95, 0.95), "Pow": (0.2, 3.0), "Recip": (0.5, 3.0), "Div": (0.5, 3.0)}


def _inp(i: int):
    return ("input", (), (i,))


def _const(dtype: DType, value, shape=()):
    return ("const", (("dtype", dtype.value), ("shape", tuple(shape)), ("value", value)), ())


def _region(name: str, shapes, dtypes, steps, feeds=None, **kw) -> Row:
    def build(g: Graph) -> int:
        ins = [g.input(f"x{i}", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))]
        return g.add_node("Fused", ins, expr=tuple(steps))

    return Row("Fused", name, build, feeds or {}, **kw)


def _op_row(op: str) -> Row:
    f = FUSABLE[op]
    if op == "BiasAdd":
        shapes = [[5, 7], [7]]
    elif f.same_shape:
        shapes = [[5, 7]] * f.arity
    else:
        shapes = [[5, 7], [1, 7], [5, 1]][:f.arity]
    base = op.removesuffix("Grad")
    feeds = {}
    if base in DOMAIN:
        lo, hi = DOMAIN[base]
        rng = np.random.default_rng(len(op))
        slot = f.arity - 1 if op.endswith("Grad") else 0  # a gradient's x is its last input
        for i in range(f.arity):
            if f.example_dtypes[i] is F32 and (i == slot or base in ("Div", "Pow")):
                feeds[f"x{i}"] = rng.uniform(lo, hi, shapes[i]).astype(np.float32)
    attrs = {k: (2, 5, 7) if v == "2,m,n" else v for k, v in f.example_attrs.items()}
    steps = [_inp(i) for i in range(f.arity)] + [(op, tuple(attrs.items()), tuple(range(f.arity)))]
    return _region(f"Fused[{op}]", shapes, f.example_dtypes, steps, feeds)


ROWS: list[Row] = [_op_row(op) for op in FUSABLE]

# an Expand inside a region: x [5,1] expanded to [3,5,4], then x read again broadcast to it
ROWS.append(_region("Fused-expand", [[5, 1], [4]], [F32, F32],
                    [_inp(0), ("Expand", (("shape", (3, 1, 4)),), (0,)), _inp(1), ("Mul", (), (1, 2)),
                     ("Sub", (), (3, 0))]))
# a chain over a broadcast bias: Erf(x + b) * x, x read twice (a diamond)
ROWS.append(_region("Fused-chain-diamond", [[9, 13], [1, 13]], [F32, F32],
                    [_inp(0), _inp(1), ("Add", (), (0, 1)), ("Erf", (), (2,)), ("Mul", (), (3, 0)),
                     ("Neg", (), (4,))]))
# [M,1] and [1,N] to [M,N], and a rank-0 input
ROWS.append(_region("Fused-outer-and-scalar", [[17, 1], [1, 3], []], [F32, F32, F32],
                    [_inp(0), _inp(1), _inp(2), ("Sub", (), (0, 1)), ("Mul", (), (3, 2)), ("Tanh", (), (4,))]))
# rank 4 with size-1 axes, and a rank-6 broadcast (the kernel's upper four dimensions)
ROWS.append(_region("Fused-rank4", [[2, 1, 3, 5], [1, 4, 1, 5], [2, 4, 3, 1]], [F32, F32, F32],
                    [_inp(0), _inp(1), ("Max", (), (0, 1)), _inp(2), ("Add", (), (2, 3)), ("Sigmoid", (), (4,))]))
ROWS.append(_region("Fused-rank6", [[2, 1, 3, 1, 4, 1], [1, 5, 1, 2, 1, 3]], [F32, F32],
                    [_inp(0), _inp(1), ("Mul", (), (0, 1)), ("Abs", (), (2,)), ("Sqrt", (), (3,))]))
# a comparison feeding Where (bool in u32), a cast to i32 and back, i32 arithmetic
ROWS.append(_region("Fused-mixed-dtypes", [[6, 11], [6, 11], [1, 11]], [F32, F32, I32],
                    [_inp(0), _inp(1), ("Less", (), (0, 1)), ("Where", (), (2, 0, 1)),
                     ("Cast", (("to", "i32"),), (3,)), _inp(2), ("Mul", (), (4, 5)), ("Cast", (("to", "f32"),), (6,)),
                     ("Not", (), (2,)), ("Cast", (("to", "f32"),), (8,)), ("Add", (), (7, 9))], scale=4.0))
# a bool input, a bool result
ROWS.append(_region("Fused-bool", [[4, 9], [4, 9]], [BOOL, F32],
                    [_inp(0), _inp(1), _const(F32, 0.0), ("Less", (), (2, 1)), ("And", (), (0, 3)),
                     ("Not", (), (4,))]))
# literals of each dtype, among them ones no decimal of 8 digits gives exactly, and -2^31
ROWS.append(_region("Fused-literals", [[3, 7], [3, 7]], [F32, I32],
                    [_inp(0), _const(F32, 0.7071067811865476), ("Mul", (), (0, 1)), _const(F32, -1e-30, (1,)),
                     ("Add", (), (2, 3)), _inp(1), _const(I32, -(2**31)), ("Max", (), (5, 6)), _const(I32, -7),
                     ("Add", (), (7, 8)), ("Cast", (("to", "f32"),), (9,)), ("Add", (), (4, 10)),
                     _const(BOOL, True), ("Cast", (("to", "f32"),), (12,)), ("Add", (), (11, 13))]))
# unary attributes as literals
ROWS.append(_region("Fused-attributes", [[5, 8]], [F32],
                    [_inp(0), ("LeakyRelu", (("alpha", 0.3),), (0,)), ("HardSigmoid", (("alpha", 0.7), ("beta", -0.1)),
                                                                        (1,)),
                     ("IsInf", (("detect_negative", False), ("detect_positive", True)), (2,)),
                     ("Cast", (("to", "f32"),), (3,)), ("Add", (), (2, 4))]))
# seven inputs, a sum of their products
ROWS.append(_region("Fused-seven-inputs", [[4, 6]] * 6 + [[6]], [F32] * 7,
                    [*(_inp(i) for i in range(7)), ("Mul", (), (0, 1)), ("Mul", (), (2, 3)), ("Mul", (), (4, 5)),
                     ("Add", (), (7, 8)), ("Add", (), (10, 9)), ("Add", (), (11, 6))]))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_fused_row(row, device):
    check_row(row, device, subgroups=None)
