"""GPU rows of the unary math functions and activations (ir/ops/unary.py) and of the unary
table's integer forms, special values and precision (ir/ops/elementwise.py).

Random rows at rank 0, 2 and 6 (x drawn where the op is defined), with default and other
attribute values; rows of NaN and infinities checked against numpy (IEEE 754); dense
precision sweeps of each op and its gradient with bounds of a few f32 ulp: the errors
measured on lavapipe, with a margin, are in the comments of :data:`PRECISION` and
:data:`GRAD_PRECISION`. A FusedMatMul row applies new rows as epilogue steps.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import OPS, DType, Graph
from eggfuse.ir.ops.elementwise import UNARY
from eggfuse.ir.ops.unary import ROWS as FAMILY_ROWS


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(np.float64)


#: Where an op's random rows draw x (uniformly); the others draw 3 N(0, 1).
DOMAIN = {"Sqrt": (0.01, 10.0), "Asin": (-0.999, 0.999), "Acos": (-0.999, 0.999), "Acosh": (1.001, 10.0),
          "Atanh": (-0.999, 0.999), "Log": (0.01, 10.0)}
#: Attribute values other than the defaults: a second row of the op (and of its gradient).
OTHER_ATTRS = {"HardSigmoid": {"alpha": 0.7, "beta": -0.1}, "LeakyRelu": {"alpha": 0.3}, "Elu": {"alpha": 0.5},
               "Selu": {"alpha": 2.0, "gamma": 0.5}, "Celu": {"alpha": 2.5}, "ThresholdedRelu": {"alpha": -0.5},
               "Shrink": {"bias": 1.5, "lambd": 1.0}, "Swish": {"alpha": -1.7},
               "IsInf": {"detect_negative": False, "detect_positive": True}}
SHAPES = ((), (7, 13), (2, 3, 1, 4, 5, 3))


def _draw(op: str, shape, seed: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    if op in DOMAIN:
        return f32(rng.uniform(*DOMAIN[op], size=shape))
    return f32(3.0 * rng.standard_normal(shape))


def _tag(attrs: dict) -> str:
    return "".join(f"-{k}={v}" for k, v in attrs.items())


def unary_row(op: str, shape, attrs=None, x=None, tag: str = "", dtype=DType.F32, **kw) -> Row:
    """``op`` on an input of ``shape`` (fed ``x``, or drawn per :data:`DOMAIN`)."""
    attrs = attrs or {}
    row_id = f"{op}{list(shape)}{_tag(attrs)}{tag}"
    if x is None and dtype is DType.F32:
        x = _draw(op, shape, row_id)
    feeds = {} if x is None else {"x": x}
    return Row(op, row_id, lambda g: g.add_node(op, (g.input("x", list(shape), dtype),), **attrs), feeds, **kw)


def grad_row(op: str, shape, attrs=None, x=None, tag: str = "", **kw) -> Row:
    attrs = attrs or {}
    row_id = f"{op}Grad{list(shape)}{_tag(attrs)}{tag}"
    dy = f32(np.ones(shape)) if x is not None else _draw("", shape, row_id + "dy")
    x = _draw(op, shape, row_id) if x is None else x
    return Row(f"{op}Grad", row_id, lambda g: g.add_node(
        f"{op}Grad", (g.input("dy", list(shape)), g.input("x", list(shape))), **attrs), {"dy": dy, "x": x}, **kw)


def _lin(lo: float, hi: float, n: int = 8001) -> np.ndarray:
    return f32(np.linspace(lo, hi, n))


def _sym(lo_exp: float, hi_exp: float, n: int = 8001) -> np.ndarray:
    # +-10^lo_exp .. +-10^hi_exp, logarithmically spaced, and 0
    pos = np.logspace(lo_exp, hi_exp, n // 2)
    return f32(np.concatenate([-pos[::-1], [0.0], pos]))


def _pos(lo_exp: float, hi_exp: float, n: int = 8001) -> np.ndarray:
    return f32(np.logspace(lo_exp, hi_exp, n))


def _huge() -> np.ndarray:
    # every f32 exponent up to 2^127 with random significands (Payne-Hanek's range), both signs
    rng = np.random.default_rng(7)
    return f32(rng.choice([-1.0, 1.0], 4000) * 2.0 ** rng.uniform(9.0, 127.9, 4000))


def _ties(grid: np.ndarray) -> np.ndarray:
    # the values of a narrower float ``grid`` (sorted, finite, as f32), the midpoints between
    # neighbours (ties: to even) and the f32 values just beside each midpoint
    g = np.unique(grid.astype(np.float32))
    mid = ((g[:-1].astype(np.float64) + g[1:]) / 2).astype(np.float32)  # exact: one bit more than the grid
    return f32(np.concatenate([g, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
                               np.float32([65519.996, 65520.0, -65520.0, 1e30, 3.4e38, 6e-8, 2.9e-8, 3e-8])]))


#: every finite binary16 value, and as many bfloat16 values spread over the f32 exponents
_F16_GRID = np.arange(2**16, dtype=np.uint16).view(np.float16)
_F16_GRID = _F16_GRID[np.isfinite(_F16_GRID)]
_BF16_GRID = (np.arange(0, 2**16, 3, dtype=np.uint32) << 16).view(np.float32)
_BF16_GRID = _BF16_GRID[np.isfinite(_BF16_GRID) & (np.abs(_BF16_GRID) < 3e38) & (np.abs(_BF16_GRID) > 1e-37)]

#: op -> (sweep, rtol, atol). Max errors measured on lavapipe (ulp of the result), which the
#: bounds allow with a margin: Sqrt 0.5, Exp 1.2, Erf 2.2, Sin 1.9 (2.3 over every exponent),
#: Cos 1.8 (2.4), Tan 2.3 (3.3), Asin 2.2, Acos 1.2, Atan 1.8, Sinh 1.4, Cosh 1.4, Asinh 2.6,
#: Acosh 1.9, Atanh 1.3, Softsign 1.4, Elu 2.0, Selu 2.7, Celu 2.0, Mish 3.6, HardSwish 1.9,
#: Swish 31 (WGSL exp in sigmoid, 3 + 2|x| ulp; 2e-6 relative at x = -30), Tanh 1.1,
#: Log 1.3, Softplus 29 (the same exp); HardSigmoid cancels near its lower kink in f32
#: (alpha x + beta), 4.4e-8 absolute; the piecewise-linear and rounding ops are exact.
PRECISION = {
    "Sqrt": (_pos(-30, 30), 1e-7, 0.0),
    "Exp": (_lin(-87.0, 88.7), 2e-7, 0.0),
    "Erf": (_lin(-6.0, 6.0), 4e-7, 0.0),
    "Sin": (np.concatenate([_lin(-100.0, 100.0), _huge()]), 4e-7, 0.0),
    "Cos": (np.concatenate([_lin(-100.0, 100.0), _huge()]), 4e-7, 0.0),
    "Tan": (np.concatenate([_lin(-100.0, 100.0), _huge()]), 5e-7, 0.0),
    "Asin": (_lin(-1.0, 1.0), 4e-7, 0.0),
    "Acos": (_lin(-1.0, 1.0), 2e-7, 0.0),
    "Atan": (_sym(-30, 30), 3e-7, 0.0),
    "Sinh": (np.concatenate([_lin(-89.0, 89.0), _sym(-30, 0)]), 2e-7, 0.0),
    "Cosh": (_lin(-89.0, 89.0), 2e-7, 0.0),
    "Asinh": (_sym(-30, 30), 4e-7, 0.0),
    "Acosh": (np.concatenate([f32(1.0 + _pos(-6, 0)), _pos(0, 30)]), 3e-7, 0.0),
    "Atanh": (np.concatenate([_lin(-1.0, 1.0)[1:-1], _sym(-30, -0.01)]), 2e-7, 0.0),
    "Floor": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Ceil": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Round": (np.concatenate([_lin(-10.0, 10.0), np.arange(-8.5, 9.0)]), 0.0, 0.0),
    "Softsign": (_sym(-30, 30), 2e-7, 0.0),
    "HardSigmoid": (_lin(-10.0, 10.0), 1e-7, 1e-7),
    "HardSwish": (_lin(-10.0, 10.0), 3e-7, 0.0),
    "LeakyRelu": (_lin(-10.0, 10.0), 1e-7, 0.0),
    "Elu": (_lin(-20.0, 10.0), 3e-7, 0.0),
    "Selu": (_lin(-20.0, 10.0), 4e-7, 0.0),
    "Celu": (_lin(-20.0, 10.0), 3e-7, 0.0),
    "ThresholdedRelu": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Mish": (_lin(-30.0, 30.0), 5e-7, 0.0),
    "Shrink": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Swish": (_lin(-30.0, 30.0), 4e-6, 0.0),
    "Tanh": (np.concatenate([_lin(-10.0, 10.0), _sym(-30, 1)]), 2e-7, 0.0),
    "Log": (np.concatenate([_pos(-37, 38), _lin(0.5, 2.0)]), 2e-7, 0.0),
    "Softplus": (_lin(-30.0, 30.0), 4e-6, 0.0),
    "RoundToFloat16": (_ties(_F16_GRID), 0.0, 0.0),
    "RoundToBFloat16": (_ties(_BF16_GRID), 0.0, 0.0),
}

#: op -> (sweep, rtol, atol) of ``<op>Grad`` with dy = 1. Measured (ulp): SqrtGrad 1.4,
#: ExpGrad 1.2, ErfGrad 61 (x^2 rounds in f32 before exp: 3.6e-6 relative at |x| = 8.4),
#: SinGrad 1.8, CosGrad 1.9, TanGrad 4.9, AsinGrad / AcosGrad 2.0, AtanGrad, AsinhGrad,
#: SoftsignGrad 1.4, AcoshGrad 2, AtanhGrad 1.9, SinhGrad / CoshGrad 1.4, EluGrad / CeluGrad
#: 1.2, SeluGrad 2.5; MishGrad and SwishGrad cancel in f32 near their zeros (x = -1.19,
#: -1.28): 1.4e-7 and 1.9e-7 absolute; HardSwishGrad 1.0; the piecewise ones are exact.
GRAD_PRECISION = {
    "Sqrt": (_pos(-30, 30), 2e-7, 0.0),
    "Exp": (_lin(-87.0, 88.7), 2e-7, 0.0),
    "Erf": (_lin(-9.0, 9.0), 6e-6, 0.0),
    "Sin": (_lin(-100.0, 100.0), 3e-7, 0.0),
    "Cos": (_lin(-100.0, 100.0), 3e-7, 0.0),
    "Tan": (_lin(-10.0, 10.0), 8e-7, 0.0),
    "Asin": (_lin(-1.0, 1.0)[1:-1], 3e-7, 0.0),
    "Acos": (_lin(-1.0, 1.0)[1:-1], 3e-7, 0.0),
    "Atan": (_sym(-10, 10), 3e-7, 0.0),
    "Sinh": (_lin(-89.0, 89.0), 2e-7, 0.0),
    "Cosh": (_lin(-89.0, 89.0), 2e-7, 0.0),
    "Asinh": (_sym(-10, 10), 3e-7, 0.0),
    "Acosh": (np.concatenate([f32(1.0 + _pos(-6, 0)), _pos(0.3, 10)]), 3e-7, 0.0),
    "Atanh": (_lin(-1.0, 1.0)[1:-1], 3e-7, 0.0),
    "Softsign": (_sym(-10, 10), 2e-7, 0.0),
    "HardSigmoid": (_lin(-10.0, 10.0), 0.0, 0.0),
    "HardSwish": (_lin(-10.0, 10.0), 2e-7, 0.0),
    "LeakyRelu": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Elu": (_lin(-20.0, 10.0), 2e-7, 0.0),
    "Selu": (_lin(-20.0, 10.0), 4e-7, 0.0),
    "Celu": (_lin(-20.0, 10.0), 2e-7, 0.0),
    "ThresholdedRelu": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Mish": (_lin(-30.0, 30.0), 5e-7, 3e-7),
    "Shrink": (_lin(-10.0, 10.0), 0.0, 0.0),
    "Swish": (_lin(-30.0, 30.0), 4e-6, 3e-7),
}

#: Special values: the result numpy (IEEE 754) gives, for every row of the unary table. Relu,
#: HardSigmoid and Celu take NaN to whatever the adapter's max / min / clamp give (WGSL leaves
#: it open; lavapipe returns the other operand), so their rows leave NaN out.
SPECIALS = f32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 100.0, -100.0, 1e-30, 1e30, -1e30])
NAN_BY_MAX_MIN = {"Relu", "HardSigmoid", "Celu"}

_INT32 = np.array([-2**31, -2**31 + 1, -7, -1, 0, 1, 5, 2**31 - 1], dtype=np.int32)
_NAN_INF = np.where(np.arange(91) % 3 == 0, np.nan, np.where(np.arange(91) % 3 == 1, np.inf, -np.inf))


def test_the_cast_roundings_reference_is_numpy_and_ml_dtypes():
    # the references the rows above check the kernels against: numpy's float16 and ml_dtypes'
    # bfloat16 conversions (round to nearest, ties to even)
    ml_dtypes = pytest.importorskip("ml_dtypes")  # onnx's dependency
    from eggfuse.ir.ops.unary import _round_bf16, _round_f16

    x = np.concatenate([_ties(_F16_GRID), _ties(_BF16_GRID), SPECIALS])
    want16 = x.astype(np.float32).astype(np.float16).astype(np.float64)
    want_bf = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(_round_f16(x), want16)
    np.testing.assert_array_equal(_round_bf16(x), want_bf)
    assert np.isinf(_round_f16(np.float64(65520.0))) and _round_f16(np.float64(65519.99)) == 65504.0


def _specials(op: str) -> Row:
    x = SPECIALS[1:] if op in NAN_BY_MAX_MIN else SPECIALS
    return unary_row(op, [x.size], x=x, tag="-specials", rtol=1e-6, atol=1e-30, finite=False)


def _nan_inf_mix(op: str, attrs=None) -> Row:
    # IsNaN / IsInf on a mix of finite values, NaN and both infinities
    x = f32(np.random.default_rng(3).standard_normal(300))
    x[::7] = _NAN_INF[: x[::7].size]
    return unary_row(op, [300], attrs, x=x, tag="-nan-inf", finite=False)


def _fused_epilogue(m: int, k: int, n: int, epilogue: tuple[str, ...]) -> Row:
    # the matmul kernel's store applying new rows of the table (math.wgsl in a matmul shader)
    def build(g: Graph) -> int:
        a, b = g.input("a", [m, k]), g.parameter("b", [k, n])
        ops = [g.parameter(f"e{i}", [n]) if s == "bias" else g.input(f"e{i}", [m, n])
               for i, s in enumerate(epilogue) if s in ("bias", "add")]
        return g.add_node("FusedMatMul", (a, b, *ops), variant="", epilogue=epilogue)

    return Row("FusedMatMul", f"FusedMatMul[{m},{k},{n}]{'+'.join(epilogue)}", build, rtol=1e-4)


_NAMES = [u.name for u in FAMILY_ROWS]
_GRADS = [u.name for u in FAMILY_ROWS if f"{u.name}Grad" in OPS]

ROWS: list[Row] = [
    *[unary_row(op, shape) for op in _NAMES for shape in SHAPES],
    *[unary_row(op, (7, 13), attrs) for op, attrs in OTHER_ATTRS.items()],
    *[grad_row(op, shape) for op in _GRADS for shape in ((7, 13), (65, 33))],
    *[grad_row(op, (7, 13), attrs) for op, attrs in OTHER_ATTRS.items() if op in _GRADS],
    *[unary_row(op, [x.size], x=x, tag="-precision", rtol=rtol, atol=atol, finite=False)
      for op, (x, rtol, atol) in PRECISION.items()],
    *[grad_row(op, [x.size], x=x, tag="-precision", rtol=rtol, atol=atol) for op, (x, rtol, atol) in
      GRAD_PRECISION.items()],
    *[_specials(u.name) for u in UNARY if u.out is None],
    _nan_inf_mix("IsNaN"),
    _nan_inf_mix("IsInf"),
    *[_nan_inf_mix("IsInf", {"detect_negative": neg, "detect_positive": not neg}) for neg in (False, True)],
    # the integer forms: random values in [-9, 9], then the int32 extremes (wrapping as WGSL does)
    *[unary_row(op, shape, dtype=DType.I32) for op in ("Abs", "Neg", "Relu") for shape in SHAPES],
    *[unary_row(op, [_INT32.size], x=_INT32, tag="-extremes", dtype=DType.I32) for op in ("Abs", "Neg", "Relu")],
    _fused_epilogue(7, 13, 5, ("bias", "Erf", "Sin", "Mish")),
    _fused_epilogue(9, 17, 66, ("add", "Softsign", "HardSwish", "Atan", "Exp", "Log", "Round")),
    _fused_epilogue(2, 8, 33, ("bias", "Tanh", "Asinh", "Cos", "Sqrt")),  # M <= 4: the GEMV kernel
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


@pytest.mark.parametrize("constant", [False, True])
def test_attribute_values_are_uniforms_one_pipeline_for_all(constant, device):
    # LeakyRelu with two alphas lowers to the same WGSL where the value is a uniform field (constant_params=False,
    # the default on a CPU adapter), to a source per alpha where parameters are WGSL constants (on a GPU)
    from eggfuse.pipeline import lower_for

    dispatches = []
    for alpha in (0.01, 0.5):
        g = Graph()
        g.set_outputs([g.add_node("LeakyRelu", (g.input("x", [5]),), alpha=alpha)])
        (d,) = lower_for(g, device, constant_params=constant).dispatches
        dispatches.append(d)
    assert (dispatches[0].source == dispatches[1].source) != constant and "p.alpha" in dispatches[0].source
    assert dispatches[0].params != dispatches[1].params
    assert ("const p = Params(5u, 0.5f);" in dispatches[1].source) == constant
