"""Unary math functions and activations of ONNX, as rows of the unary table (:class:`Unary`).

Each row is registered like the rows of ``elementwise.py`` (:func:`register_unary`): the op
named as its ONNX operator (https://onnx.ai/onnx/operators/onnx__<Op>.html, whose formula the
reference follows), ``<Op>Grad`` where a derivative exists, their kernels (``unary.wgsl``,
``elementwise_grad.wgsl``), and for a row without attributes its matmul epilogue fold.
Attributes are typed (float, int, bool) and reach the kernels as uniform fields, so one
pipeline serves every value. The WGSL functions named here are in ``shaders/math.wgsl``
(elementary functions accurate to a few f32 ulp), ``shaders/common.wgsl`` and
``shaders/derivatives.wgsl``. References compute in float64; where the f32 result overflows
(exp, sinh, cosh) they give the infinity f32 gives.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

from ..spec import Attr, need, no_grad
from ..types import DType
from .elementwise import Unary, register_unary, sigmoid

FAMILY = "unary"

#: SELU's constants (Klambauer et al. 2017), as ONNX Selu's attribute defaults give them.
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875
_F32_MAX = float(np.finfo(np.float32).max)


def _f32_overflow(y):
    # +-inf where f32 rounding overflows: the result f32 arithmetic gives
    y = np.asarray(y, dtype=np.float64)
    half_ulp = 2.0 ** (127 - 24)
    return np.where(np.abs(y) >= _F32_MAX + half_ulp, np.copysign(np.inf, y), y)


def _round_f16(x):
    # numpy rounds f32 to binary16 ties to even, +-inf past 65504
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def _round_bf16(x):
    # the upper 16 bits of the f32, rounded ties to even (the bits' carry), NaN kept
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, r).astype(np.float64)


_ROUNDING = no_grad("it rounds to a narrower float type (ONNX Cast), piecewise constant; eggfuse does not "
                    "differentiate through it")


def _zero_grad(b, node, dy, want):
    return [None]


_PIECEWISE_CONSTANT = "piecewise constant: its gradient is zero almost everywhere (as PyTorch's)"


def _f(name: str, default: float) -> Attr:
    return Attr(name, "float", default)


def _celu_check(a):
    need(a["alpha"] != 0.0, "alpha must not be 0 (CELU divides by it)")


def _mish(x):
    return x * np.tanh(np.logaddexp(0.0, x))


def _dmish(x):
    sp = np.logaddexp(0.0, x)
    t = np.tanh(sp)
    return t + x * (1.0 - t * t) * sigmoid(x)


ROWS: tuple[Unary, ...] = (
    # -- math functions ----------------------------------------------------------------------
    Unary("Sqrt", np.sqrt, "select(nan_f32(), sqrt({x}), {x} >= 0.0)", lambda x: 0.5 / np.sqrt(x),
          "0.5 / sqrt({x})", "sqrt(x); NaN below 0, as IEEE 754 (ONNX Sqrt)", "1 / (2 sqrt(x))"),
    Unary("Exp", lambda x: _f32_overflow(np.exp(x)), "exp_acc({x})",
          lambda x: _f32_overflow(np.exp(x)), "exp_acc({x})",
          "exp(x); +inf where f32 overflows, above 88.72 (ONNX Exp)", "exp(x)"),
    Unary("Erf", erf, "erf_acc({x})", lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-x * x),
          "1.1283791670955126 * exp_acc(-({x}) * ({x}))", "the error function 2/sqrt(pi) int_0^x exp(-t^2) dt "
          "(ONNX Erf)", "2/sqrt(pi) exp(-x^2)"),
    Unary("Sin", np.sin, "sin_acc({x})", np.cos, "cos_acc({x})", "sin(x) (ONNX Sin)", "cos(x)"),
    Unary("Cos", np.cos, "cos_acc({x})", lambda x: -np.sin(x), "-sin_acc({x})", "cos(x) (ONNX Cos)", "-sin(x)"),
    Unary("Tan", np.tan, "tan_acc({x})", lambda x: 1.0 / np.cos(x) ** 2, "dtan({x})", "tan(x) (ONNX Tan)",
          "1 / cos(x)^2"),
    Unary("Asin", np.arcsin, "asin_acc({x})", lambda x: 1.0 / np.sqrt((1.0 - x) * (1.0 + x)),
          "1.0 / sqrt((1.0 - {x}) * (1.0 + {x}))", "arcsin(x); NaN outside [-1, 1] (ONNX Asin)",
          "1 / sqrt(1 - x^2)"),
    Unary("Acos", np.arccos, "acos_acc({x})", lambda x: -1.0 / np.sqrt((1.0 - x) * (1.0 + x)),
          "-1.0 / sqrt((1.0 - {x}) * (1.0 + {x}))", "arccos(x); NaN outside [-1, 1] (ONNX Acos)",
          "-1 / sqrt(1 - x^2)"),
    Unary("Atan", np.arctan, "atan_acc({x})", lambda x: 1.0 / (1.0 + x * x), "1.0 / (1.0 + ({x}) * ({x}))",
          "arctan(x) (ONNX Atan)", "1 / (1 + x^2)"),
    Unary("Sinh", lambda x: _f32_overflow(np.sinh(x)), "sinh_acc({x})",
          lambda x: _f32_overflow(np.cosh(x)), "cosh_acc({x})",
          "sinh(x); +-inf where f32 overflows, beyond 89.4 (ONNX Sinh)", "cosh(x)"),
    Unary("Cosh", lambda x: _f32_overflow(np.cosh(x)), "cosh_acc({x})",
          lambda x: _f32_overflow(np.sinh(x)), "sinh_acc({x})",
          "cosh(x); +inf where f32 overflows, beyond 89.4 (ONNX Cosh)", "sinh(x)"),
    Unary("Asinh", np.arcsinh, "asinh_acc({x})", lambda x: 1.0 / np.sqrt(x * x + 1.0),
          "1.0 / sqrt(({x}) * ({x}) + 1.0)", "arcsinh(x) (ONNX Asinh)", "1 / sqrt(x^2 + 1)"),
    Unary("Acosh", np.arccosh, "acosh_acc({x})", lambda x: 1.0 / np.sqrt((x - 1.0) * (x + 1.0)),
          "1.0 / sqrt(({x} - 1.0) * ({x} + 1.0))", "arccosh(x); NaN below 1 (ONNX Acosh)", "1 / sqrt(x^2 - 1)"),
    Unary("Atanh", np.arctanh, "atanh_acc({x})", lambda x: 1.0 / ((1.0 - x) * (1.0 + x)),
          "1.0 / ((1.0 - {x}) * (1.0 + {x}))", "arctanh(x); +-inf at +-1, NaN outside [-1, 1] (ONNX Atanh)",
          "1 / (1 - x^2)"),
    Unary("Floor", np.floor, "floor({x})", None, None, f"floor(x) (ONNX Floor); {_PIECEWISE_CONSTANT}",
          vjp=_zero_grad),
    Unary("Ceil", np.ceil, "ceil({x})", None, None, f"ceil(x) (ONNX Ceil); {_PIECEWISE_CONSTANT}", vjp=_zero_grad),
    Unary("Round", np.round, "round({x})", None, None,
          f"x rounded to the nearest integer, halves to even (ONNX Round; numpy round); {_PIECEWISE_CONSTANT}",
          vjp=_zero_grad),
    Unary("IsNaN", np.isnan, "select(0u, 1u, is_nan({x}))", None, None, "x is NaN; bool (ONNX IsNaN)",
          epilogue=False, out=DType.BOOL, vjp=no_grad("its result is bool")),
    Unary("IsInf", lambda x, detect_negative, detect_positive: (np.isneginf(x) & detect_negative)
          | (np.isposinf(x) & detect_positive),
          "select(0u, 1u, (bitcast<u32>({x}) == BITS_INF && {detect_positive} != 0u) || "
          "(bitcast<u32>({x}) == 0xff800000u && {detect_negative} != 0u))", None, None,
          "x is -inf (if detect_negative) or +inf (if detect_positive); bool (ONNX IsInf)", epilogue=False,
          attrs=(Attr("detect_negative", "bool", True), Attr("detect_positive", "bool", True)), out=DType.BOOL,
          vjp=no_grad("its result is bool")),
    Unary("RoundToFloat16", _round_f16, "round_f16({x})", None, None,
          "x rounded to the nearest IEEE 754 binary16 value, ties to even, +-inf past 65504, in f32: ONNX Cast to "
          "FLOAT16 (numpy astype(float16))", epilogue=False, vjp=_ROUNDING),
    Unary("RoundToBFloat16", _round_bf16, "round_bf16({x})", None, None,
          "x rounded to the nearest bfloat16 value (the upper 16 bits of its f32), ties to even, in f32: ONNX Cast "
          "to BFLOAT16", epilogue=False, vjp=_ROUNDING),
    # -- activations -------------------------------------------------------------------------
    Unary("Softsign", lambda x: x / (1.0 + np.abs(x)), "({x}) / (1.0 + abs({x}))",
          lambda x: 1.0 / (1.0 + np.abs(x)) ** 2, "1.0 / ((1.0 + abs({x})) * (1.0 + abs({x})))",
          "x / (1 + |x|) (ONNX Softsign)", "1 / (1 + |x|)^2"),
    Unary("HardSigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0.0, 1.0),
          "clamp_nan({alpha} * ({x}) + {beta}, 0.0, 1.0)",
          lambda x, alpha, beta: np.where((alpha * x + beta > 0) & (alpha * x + beta < 1), alpha, 0.0),
          "select(0.0, {alpha}, {alpha} * ({x}) + {beta} > 0.0 && {alpha} * ({x}) + {beta} < 1.0)",
          "max(0, min(1, alpha x + beta)) (ONNX HardSigmoid)", "alpha where 0 < alpha x + beta < 1, else 0",
          epilogue=False, attrs=(_f("alpha", 0.2), _f("beta", 0.5))),
    # x + 3 and x + 1.5 are exact near the kinks, where x / 6 + 1/2 would cancel
    Unary("HardSwish", lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0, "({x}) * clamp({x} + 3.0, 0.0, 6.0) / 6.0",
          lambda x: np.where(x < -3.0, 0.0, np.where(x > 3.0, 1.0, (x + 1.5) / 3.0)),
          "select(select(({x} + 1.5) / 3.0, 1.0, {x} > 3.0), 0.0, {x} < -3.0)",
          "x max(0, min(1, x / 6 + 1/2)) (Howard et al. 2019, MobileNetV3; ONNX HardSwish)",
          "0 below -3, 1 above 3, x / 3 + 1/2 between (as PyTorch)"),
    Unary("LeakyRelu", lambda x, alpha: np.where(x >= 0, x, alpha * x), "select({alpha} * ({x}), {x}, {x} >= 0.0)",
          lambda x, alpha: np.where(x > 0, 1.0, alpha), "select({alpha}, 1.0, {x} > 0.0)",
          "x for x >= 0, alpha x below (Maas et al. 2013; ONNX LeakyRelu)", "1 if x > 0 else alpha (as PyTorch)",
          epilogue=False, attrs=(_f("alpha", 0.01),)),
    Unary("Elu", lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
          "select({alpha} * expm1_acc({x}), {x}, {x} > 0.0)",
          lambda x, alpha: np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0.0))),
          "select({alpha} * exp_acc({x}), 1.0, {x} > 0.0)",
          "x for x > 0, alpha (exp(x) - 1) below (Clevert et al. 2016; ONNX Elu)", "1 if x > 0 else alpha exp(x)",
          epilogue=False, attrs=(_f("alpha", 1.0),)),
    Unary("Selu", lambda x, alpha, gamma: gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
          "{gamma} * select({alpha} * expm1_acc({x}), {x}, {x} > 0.0)",
          lambda x, alpha, gamma: gamma * np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0.0))),
          "{gamma} * select({alpha} * exp_acc({x}), 1.0, {x} > 0.0)",
          "gamma x for x > 0, gamma alpha (exp(x) - 1) below (Klambauer et al. 2017; ONNX Selu)",
          "gamma if x > 0 else gamma alpha exp(x)", epilogue=False,
          attrs=(_f("alpha", SELU_ALPHA), _f("gamma", SELU_GAMMA))),
    Unary("Celu", lambda x, alpha: np.maximum(x, 0.0) + np.minimum(alpha * np.expm1(x / alpha), 0.0),
          "select({x}, 0.0, {x} < 0.0) + min({alpha} * expm1_acc({x} / {alpha}), 0.0)",
          lambda x, alpha: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0) / alpha)),
          "select(exp_acc({x} / {alpha}), 1.0, {x} > 0.0)",
          "max(0, x) + min(0, alpha (exp(x / alpha) - 1)) (Barron 2017; ONNX Celu)", "1 if x > 0 else exp(x / alpha)",
          epilogue=False, attrs=(_f("alpha", 1.0),), check=_celu_check),
    Unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0.0), "select(0.0, {x}, {x} > {alpha})",
          lambda x, alpha: (x > alpha).astype(np.float64), "select(0.0, 1.0, {x} > {alpha})",
          "x for x > alpha, else 0 (ONNX ThresholdedRelu)", "1 if x > alpha else 0", epilogue=False,
          attrs=(_f("alpha", 1.0),)),
    Unary("Mish", _mish, "mish({x})", _dmish, "dmish({x})",
          "x tanh(softplus(x)) (Misra 2019; ONNX Mish)",
          "tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x), sp = softplus(x)"),
    Unary("Shrink", lambda x, bias, lambd: np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0.0)),
          "select(select(0.0, {x} + {bias}, {x} < -{lambd}), {x} - {bias}, {x} > {lambd})",
          lambda x, bias, lambd: ((x < -lambd) | (x > lambd)).astype(np.float64),
          "select(0.0, 1.0, {x} < -{lambd} || {x} > {lambd})",
          "x - bias for x > lambd, x + bias for x < -lambd, else 0 (ONNX Shrink)", "1 if |x| > lambd else 0",
          epilogue=False, attrs=(_f("bias", 0.0), _f("lambd", 0.5))),
    Unary("Swish", lambda x, alpha: x * sigmoid(alpha * x), "({x}) * sigmoid({alpha} * ({x}))",
          lambda x, alpha: sigmoid(alpha * x) * (1.0 + alpha * x * sigmoid(-alpha * x)),
          "sigmoid({alpha} * ({x})) * (1.0 + {alpha} * ({x}) * sigmoid(-{alpha} * ({x})))",
          "x sigmoid(alpha x) (Ramachandran et al. 2017; ONNX Swish; alpha = 1 is Silu)",
          "s (1 + alpha x (1 - s)), s = sigmoid(alpha x)", epilogue=False, attrs=(_f("alpha", 1.0),)),
)

for _row in ROWS:
    register_unary(_row, FAMILY)
