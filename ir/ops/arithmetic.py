"""Broadcasting elementwise ops on every dtype: arithmetic, comparison, logic, bitwise, Where,
Clip and Cast, with the semantics of the ONNX operators of the same names
(https://onnx.ai/onnx/operators/onnx__<Op>.html) and numpy broadcasting.

Each op is one :class:`Pointwise` row: its operands, the operand dtypes it takes and its result
dtype, its numpy reference, the WGSL expression of the operands' elements ``av``, ``bv``, ``cv``
for each signature, and its VJP. Every row runs on the one broadcasting kernel
(``ir/ops/broadcasting.py``, ``shaders/broadcast.wgsl``; helpers in ``shaders/arith.wgsl``).

Dtypes: F32 computes in IEEE float32 (references in float64); I32 arithmetic wraps modulo 2^32
as WGSL's does, and the references wrap their int64 results the same way (:func:`wrap_i32`);
BOOL is numpy bool on the host and a u32 0/1 on the device. ONNX int64 tensors are I32 here
(narrowed at import), so an int64 result outside the int32 range wraps instead.

``Greater`` is the seed's f32 mask (1.0 / 0.0, what meganeura's ``Greater`` computes, used as a
factor); the comparisons with ONNX's bool result are ``Less``, ``LessOrEqual`` and ``Equal``
(ONNX ``Greater(a, b)`` is ``Less(b, a)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel import Kernel
from ..spec import Attr, need, no_grad, op
from ..types import DType, TensorType
from .broadcasting import broadcast_kernel

FAMILY = "arithmetic"

F32, I32, BOOL = DType.F32, DType.I32, DType.BOOL
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def wrap_i32(x) -> np.ndarray:
    """Integers reduced modulo 2^32 into [-2^31, 2^31): the device's int32 result of an exact one."""
    x = np.asarray(x).astype(np.int64)
    return (x - _I32_MIN) % 2**32 + _I32_MIN


def _same(*dtypes: DType, n: int = 2) -> tuple[tuple[DType, ...], ...]:
    return tuple((d,) * n for d in dtypes)


@dataclass(frozen=True)
class Pointwise:
    """One broadcasting elementwise op.

    - ``inputs``: operand names (1 to 3), broadcast against each other as numpy does.
    - ``signatures``: the operand dtype tuples the op takes.
    - ``result``: the result's dtype, or the index of the operand whose dtype it has, or a
      function of the attributes (Cast).
    - ``fn(*operands, **attrs)``: the reference on float64 / int64 / bool arrays; an I32 result
      is wrapped to int32 after it.
    - ``wgsl``: the expression of ``av``, ``bv``, ``cv``: one string, a mapping from a signature
      or the first operand's dtype to one, or a function of (signature, attrs).
    - ``helpers``: the expression calls functions of ``shaders/arith.wgsl``.
    - ``unidirectional``: the result has the first operand's shape (ONNX PRelu's slope).
    - ``check(attrs)``: the attributes' values, checked with ``need``.
    """

    name: str
    inputs: tuple[str, ...]
    signatures: tuple[tuple[DType, ...], ...]
    fn: Callable[..., np.ndarray]
    wgsl: str | Mapping[Any, str] | Callable[[tuple[DType, ...], dict], str]
    doc: str
    result: DType | int | Callable[[dict], DType] = 0
    vjp: Any = None
    attrs: tuple[Attr, ...] = ()
    helpers: bool = False
    unidirectional: bool = False
    check: Callable[[dict], None] | None = None

    def result_dtype(self, sig: tuple[DType, ...], attrs: dict) -> DType:
        if isinstance(self.result, DType):
            return self.result
        if isinstance(self.result, int):
            return sig[self.result]
        return self.result(attrs)

    def expression(self, sig: tuple[DType, ...], attrs: dict) -> str:
        if isinstance(self.wgsl, str):
            return self.wgsl
        if callable(self.wgsl):
            return self.wgsl(sig, attrs)
        return self.wgsl[sig] if sig in self.wgsl else self.wgsl[sig[0]]


def _signature_text(sig) -> str:
    return "(" + ", ".join(d.value for d in sig) + ")"


def _infer(row: Pointwise):
    def infer(ts: list[TensorType], a: dict) -> TensorType:
        if row.check is not None:
            row.check(a)
        sig = tuple(t.dtype for t in ts)
        need(sig in row.signatures, f"operands {', '.join(map(str, ts))}: dtypes {_signature_text(sig)} are not "
             f"supported; {row.name} takes " + " or ".join(map(_signature_text, row.signatures)))
        try:
            shape = tuple(np.broadcast_shapes(*(t.shape for t in ts)))
        except ValueError:
            need(False, f"shapes {', '.join(map(str, ts))} do not broadcast")
        if row.unidirectional:
            need(shape == ts[0].shape, f"{row.inputs[1]} {ts[1]} must broadcast to {row.inputs[0]} {ts[0]}")
        return TensorType(shape, row.result_dtype(sig, a))

    return infer


def _reference(row: Pointwise):
    def ref(xs: list[np.ndarray], a: dict) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = np.asarray(row.fn(*xs, **{k: a[k] for k in (at.name for at in row.attrs)}))
        dtype = row.result_dtype(tuple(_dtype_of(x) for x in xs), a)
        if dtype is I32:
            return wrap_i32(out)
        if dtype is BOOL:
            return out.astype(np.bool_)
        return out.astype(np.float64)

    return ref


def _dtype_of(x: np.ndarray) -> DType:
    # the reference's representation (ir.reference.as_reference): float64, int64, bool
    return BOOL if x.dtype == np.bool_ else I32 if np.issubdtype(x.dtype, np.integer) else F32


def _kernel(row: Pointwise):
    prefix = {1: "pointwise", 2: "binary", 3: "ternary"}[len(row.inputs)]

    def build(node, ins, target) -> Kernel:
        sig = tuple(t.dtype for t in ins)
        return broadcast_kernel(f"{prefix}_{node.op}", row.expression(sig, node.attrs), node.type.shape,
                                [t.shape for t in ins], [t.dtype.wgsl for t in ins], node.type.dtype.wgsl,
                                helpers="arith.wgsl" if row.helpers else None)

    return build


def _register(row: Pointwise) -> None:
    op(row.name, row.inputs, _infer(row), _reference(row), attrs=row.attrs, doc=row.doc,
       vjp=row.vjp if row.vjp is not None else no_grad(f"{row.name}'s result is not a differentiable f32 value"),
       kernel=_kernel(row), family=FAMILY)


# --- VJPs (f32 operands: autodiff differentiates only f32 leaves, and no rule here returns a
# gradient for an integer or bool operand) ----------------------------------------------------


def _add_vjp(b, node, dy, want):
    return [b.reduce_to(dy, b.type(i).shape) if w else None for i, w in zip(node.inputs, want, strict=True)]


def _sub_vjp(b, node, dy, want):
    x, y = node.inputs
    return [b.reduce_to(dy, b.type(x).shape) if want[0] else None,
            b.reduce_to(b.emit("Neg", (dy,)), b.type(y).shape) if want[1] else None]


def _mul_vjp(b, node, dy, want):
    x, y = node.inputs
    return [b.reduce_to(b.emit("Mul", (dy, y)), b.type(x).shape) if want[0] else None,
            b.reduce_to(b.emit("Mul", (dy, x)), b.type(y).shape) if want[1] else None]


def _div_vjp(b, node, dy, want):
    # d/da a/b = 1/b; d/db a/b = -(a/b)/b: both from dy/b
    x, y = node.inputs
    q = b.emit("Div", (dy, y))
    return [b.reduce_to(q, b.type(x).shape) if want[0] else None,
            b.reduce_to(b.emit("Neg", (b.emit("Mul", (q, node.id)),)), b.type(y).shape) if want[1] else None]


def _masked(b, mask, dy, shape, keep: bool):
    """dy where ``mask`` (``keep``) or where not, else 0, summed back to ``shape``."""
    zero = b.const(np.zeros(1))
    picked = b.emit("Where", (mask, dy, zero) if keep else (mask, zero, dy))
    return b.reduce_to(picked, shape)


def _select_vjp(take_first: str):
    # Min / Max: the gradient goes to the operand selected, the first one on ties (as Where(a <= b, a, b))
    def vjp(b, node, dy, want):
        x, y = node.inputs
        first = b.emit("LessOrEqual", (x, y) if take_first == "min" else (y, x))
        return [_masked(b, first, dy, b.type(x).shape, True) if want[0] else None,
                _masked(b, first, dy, b.type(y).shape, False) if want[1] else None]

    return vjp


def _where_vjp(b, node, dy, want):
    c, x, y = node.inputs
    return [None, _masked(b, c, dy, b.type(x).shape, True) if want[1] else None,
            _masked(b, c, dy, b.type(y).shape, False) if want[2] else None]


def _pow_vjp(b, node, dy, want):
    # d/dx x^y = y x^(y-1); d/dy x^y = x^y log x, taken as 0 at x = 0 (as PyTorch), NaN for x < 0
    x, y = node.inputs
    yf = y if b.type(y).dtype is F32 else b.emit("Cast", (y,), to="f32")
    dx = dy_ = None
    if want[0]:
        one = b.const(np.ones(1))
        dx = b.emit("Mul", (b.emit("Mul", (dy, yf)), b.emit("Pow", (x, b.emit("Sub", (yf, one))))))
        dx = b.reduce_to(dx, b.type(x).shape)
    if want[1]:
        zero = b.const(np.zeros(1))
        at_zero = b.emit("Equal", (x, zero))
        dy_ = b.emit("Where", (at_zero, zero, b.emit("Mul", (b.emit("Mul", (dy, node.id)), b.emit("Log", (x,))))))
        dy_ = b.reduce_to(dy_, b.type(y).shape)
    return [dx, dy_]


def _mod_vjp(b, node, dy, want):
    # a mod b = a - b q with q = (a - out) / b piecewise constant: d/da = 1, d/db = -q
    x, y = node.inputs
    dq = None
    if want[1]:
        q = b.emit("Div", (b.emit("Sub", (x, node.id)), y))
        dq = b.reduce_to(b.emit("Neg", (b.emit("Mul", (dy, q)),)), b.type(y).shape)
    return [b.reduce_to(dy, b.type(x).shape) if want[0] else None, dq]


def _prelu_vjp(b, node, dy, want):
    # x > 0: (dy, 0); else (dy slope, dy x)
    x, slope = node.inputs
    pos = b.emit("Less", (b.const(np.zeros(1)), x))
    dx = b.emit("Where", (pos, dy, b.emit("Mul", (dy, slope)))) if want[0] else None
    ds = _masked(b, pos, b.emit("Mul", (dy, x)), b.type(slope).shape, False) if want[1] else None
    return [dx, ds]


def _clip_vjp(b, node, dy, want):
    # min(max(x, lo), hi): dy goes to hi where max(x, lo) > hi, else to x where x >= lo, else to lo
    x, lo, hi = node.inputs
    inside = b.emit("LessOrEqual", (b.emit("Max", (x, lo)), hi))
    above_lo = b.emit("LessOrEqual", (lo, x))
    return [_masked(b, b.emit("And", (inside, above_lo)), dy, b.type(x).shape, True) if want[0] else None,
            _masked(b, b.emit("And", (inside, b.emit("Not", (above_lo,)))), dy, b.type(lo).shape, True)
            if want[1] else None,
            _masked(b, inside, dy, b.type(hi).shape, False) if want[2] else None]


def _zero_vjp(b, node, dy, want):
    return [None] * len(node.inputs)


def _cast_vjp(b, node, dy, want):
    # the identity from f32 to f32; a cast to or from an integer or bool is piecewise constant
    same = b.type(node.inputs[0]).dtype is F32 and node.type.dtype is F32
    return [dy if same else None]


# --- references with the device's integer semantics --------------------------------------------


def _div(a, b):
    if a.dtype == np.float64:
        return a / b
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, a, np.sign(a) * np.sign(safe) * (np.abs(a) // np.abs(safe)))  # toward zero


def _mod(a, b, fmod):
    if a.dtype == np.float64:
        return np.fmod(a, b) if fmod else np.mod(a, b)
    safe = np.where(b == 0, 1, b)
    r = np.fmod(a, safe) if fmod else np.mod(a, safe)
    return np.where(b == 0, 0, r)


def _ipow(x, n):
    """x^n with wrapping 32-bit products; the truncated 1 / x^-n for n < 0 (pow_i32 in arith.wgsl)."""
    x, n = np.broadcast_arrays(wrap_i32(x), np.asarray(n, dtype=np.int64))
    r, base, e = np.ones(x.shape, np.int64), x.copy(), np.where(n < 0, 0, n)
    while e.any():
        r = np.where(e & 1, wrap_i32(r * base), r)
        base, e = wrap_i32(base * base), e >> 1
    neg = np.where(x == 1, 1, np.where(x == -1, np.where(n & 1, -1, 1), 0))
    return np.where(n < 0, neg, r)


def _f32_to_i32(v):
    """Truncation toward zero saturating at the int32 range (the largest f32 below 2^31 is
    2147483520), NaN -> 0: f32_to_i32 in arith.wgsl."""
    v = np.asarray(v, dtype=np.float64)
    return np.where(np.isnan(v), 0, np.trunc(np.clip(np.nan_to_num(v), -2.0**31, 2147483520.0))).astype(np.int64)


def _pow(x, y):
    if x.dtype == np.float64:
        return np.power(x, y.astype(np.float64))
    if y.dtype != np.float64:
        return _ipow(x, y)
    integral = (np.floor(y) == y) & (np.abs(y) < 2.0**31)
    return np.where(integral, _ipow(x, np.where(integral, y, 0).astype(np.int64)),
                    _f32_to_i32(np.power(x.astype(np.float64), y)))


def _shift(a, b, direction):
    ok = (b >= 0) & (b < 32)
    bb = np.where(ok, b, 0)
    if direction == "LEFT":
        return np.where(ok, wrap_i32(np.left_shift(a, bb)), 0)
    return np.where(ok, np.right_shift(a, bb), np.where(a < 0, -1, 0))


def _cast(x, to):
    target = DType(to)
    if target is BOOL:
        return x != 0  # NaN -> True, as numpy's astype(bool)
    if target is I32:
        return _f32_to_i32(x) if x.dtype == np.float64 else x.astype(np.int64)
    return x.astype(np.float64)


# --- WGSL of the attribute-dependent rows ------------------------------------------------------


def _mod_wgsl(sig, a) -> str:
    kind = "fmod" if a["fmod"] else "mod"
    return f"{kind}_{sig[0].value}(av, bv)"


def _pow_wgsl(sig, a) -> str:
    return {(F32, F32): "pow_f32(av, bv)", (F32, I32): "pow_f32(av, f32(bv))", (I32, I32): "pow_i32(av, bv)",
            (I32, F32): "pow_i32_f32(av, bv)"}[sig]


_CASTS = {(F32, I32): "f32_to_i32(av)", (F32, BOOL): "select(0u, 1u, (bitcast<u32>(av) & 0x7fffffffu) != 0u)",
          (I32, F32): "f32(av)", (I32, BOOL): "select(0u, 1u, av != 0)", (BOOL, F32): "f32(av)",
          (BOOL, I32): "i32(av)"}


def _cast_wgsl(sig, a) -> str:
    return _CASTS.get((sig[0], DType(a["to"])), "av")


def _check_cast(a: dict) -> None:
    need(a["to"] in ("f32", "i32", "bool"), f"to = {a['to']!r}: Cast converts to f32, i32 or bool")


def _check_mod(a: dict) -> None:
    need(a["fmod"] in (0, 1), f"fmod = {a['fmod']} must be 0 or 1")


def _check_shift(a: dict) -> None:
    need(a["direction"] in ("LEFT", "RIGHT"), f"direction = {a['direction']!r} must be LEFT or RIGHT")


def _cmp(symbol: str) -> str:
    return f"select(0u, 1u, av {symbol} bv)"


_NUM2 = _same(F32, I32)
_ALL2 = _same(F32, I32, BOOL)
_AB = ("a", "b")
_SPEC = "https://onnx.ai/onnx/operators/onnx__{}.html"


def _onnx(name: str) -> str:
    return f"(ONNX {name}, {_SPEC.format(name)})"


POINTWISE: tuple[Pointwise, ...] = (
    # arithmetic
    Pointwise("Add", _AB, _NUM2, np.add, "av + bv", f"a + b, numpy broadcasting; i32 wraps {_onnx('Add')}",
              vjp=_add_vjp),
    Pointwise("Sub", _AB, _NUM2, np.subtract, "av - bv", f"a - b; i32 wraps {_onnx('Sub')}", vjp=_sub_vjp),
    Pointwise("Mul", _AB, _NUM2, np.multiply, "av * bv", f"a * b, numpy broadcasting; i32 wraps {_onnx('Mul')}",
              vjp=_mul_vjp),
    Pointwise("Div", _AB, _NUM2, _div, {F32: "av / bv", I32: "div_i32(av, bv)"},
              "a / b; IEEE for f32 (+-inf, NaN at 0); i32 truncates toward zero as C and onnx's reference "
              f"(a / 0 = a, WGSL's value; ONNX leaves it undefined) {_onnx('Div')}", vjp=_div_vjp, helpers=True),
    Pointwise("Pow", ("x", "y"), _same(F32, I32) + ((F32, I32), (I32, F32)), _pow, _pow_wgsl,
              "x^y with the dtype of x: C pow / numpy power for f32 (NaN for x < 0 and a non-integer y); an "
              "i32 base with an integral exponent exactly (wrapping; 1 / x^n truncated for n < 0), with "
              f"another f32 exponent truncated and saturated {_onnx('Pow')}", vjp=_pow_vjp, helpers=True),
    Pointwise("Mod", _AB, _NUM2, _mod, _mod_wgsl,
              "remainder: fmod = 1, the dividend's sign (C fmod); fmod = 0, the divisor's (Python %, numpy mod). "
              "i32: 0 for b = 0; f32: exact (a long division of the significands), NaN for b = 0 or an infinite a "
              f"{_onnx('Mod')}", attrs=(Attr("fmod", "int", 0),), vjp=_mod_vjp, helpers=True, check=_check_mod),
    Pointwise("Min", _AB, _NUM2, np.minimum, {F32: "min_f32(av, bv)", I32: "min(av, bv)"},
              f"numpy minimum: NaN if either is NaN; the variadic ONNX Min is a chain {_onnx('Min')}",
              vjp=_select_vjp("min"), helpers=True),
    Pointwise("Max", _AB, _NUM2, np.maximum, {F32: "max_f32(av, bv)", I32: "max(av, bv)"},
              f"numpy maximum: NaN if either is NaN; the variadic ONNX Max is a chain {_onnx('Max')}",
              vjp=_select_vjp("max"), helpers=True),
    Pointwise("PRelu", ("x", "slope"), _NUM2, lambda x, s: np.where(x > 0, x, x * s),
              {F32: "select(av * bv, av, av > 0.0)", I32: "select(av * bv, av, av > 0)"},
              "x if x > 0 else slope * x, slope broadcast to x's shape (He et al. 2015; onnx's reference "
              f"np.where(x > 0, x, x * slope)) {_onnx('PRelu')}", vjp=_prelu_vjp, unidirectional=True),
    Pointwise("Clip", ("x", "min", "max"), _same(F32, I32, n=3),
              lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
              {F32: "min_f32(max_f32(av, bv), cv)", I32: "min(max(av, bv), cv)"},
              "min(max(x, min), max): max where min > max, NaN propagated (numpy clip; the bounds of ONNX Clip "
              f"are inputs from opset 11, absent ones are -inf / +inf) {_onnx('Clip')}",
              vjp=_clip_vjp, helpers=True),
    Pointwise("Sign", ("x",), ((F32,), (I32,)), np.sign,
              {F32: "sign_f32(av)", I32: "select(select(0, 1, av > 0), -1, av < 0)"},
              f"-1, 0 or 1 (numpy sign); NaN stays NaN {_onnx('Sign')}", vjp=_zero_vjp, helpers=True),
    # comparisons: bool results, false where a NaN is compared
    Pointwise("Equal", _AB, _ALL2, np.equal, _cmp("=="), f"a == b {_onnx('Equal')}", result=BOOL),
    Pointwise("Less", _AB, _NUM2, np.less, _cmp("<"), f"a < b; ONNX Greater(a, b) is Less(b, a) {_onnx('Less')}",
              result=BOOL),
    Pointwise("LessOrEqual", _AB, _NUM2, np.less_equal, _cmp("<="),
              f"a <= b; ONNX GreaterOrEqual(a, b) is LessOrEqual(b, a) {_onnx('LessOrEqual')}", result=BOOL),
    Pointwise("Greater", _AB, _same(F32), lambda a, b: (a > b).astype(np.float64), "select(0.0, 1.0, av > bv)",
              "1.0 where a > b else 0.0, numpy broadcasting (a NaN compares false): the seed's f32 mask (seed: "
              "Greater, same shapes only); piecewise constant, so its gradient is zero. The ONNX Greater, with "
              "a bool result, is Less(b, a)", vjp=_zero_vjp),
    # logic on bools, bitwise on i32
    Pointwise("And", _AB, _same(BOOL), np.logical_and, "av & bv", f"a and b {_onnx('And')}"),
    Pointwise("Or", _AB, _same(BOOL), np.logical_or, "av | bv", f"a or b {_onnx('Or')}"),
    Pointwise("Xor", _AB, _same(BOOL), np.logical_xor, "av ^ bv", f"a xor b {_onnx('Xor')}"),
    Pointwise("Not", ("x",), ((BOOL,),), np.logical_not, "1u - av", f"not x {_onnx('Not')}"),
    Pointwise("BitwiseAnd", _AB, _same(I32), np.bitwise_and, "av & bv", f"a & b {_onnx('BitwiseAnd')}"),
    Pointwise("BitwiseOr", _AB, _same(I32), np.bitwise_or, "av | bv", f"a | b {_onnx('BitwiseOr')}"),
    Pointwise("BitwiseXor", _AB, _same(I32), np.bitwise_xor, "av ^ bv", f"a ^ b {_onnx('BitwiseXor')}"),
    Pointwise("BitwiseNot", ("x",), ((I32,),), np.invert, "~av", f"~x {_onnx('BitwiseNot')}"),
    Pointwise("BitShift", _AB, _same(I32), _shift, lambda sig, a: f"sh{'l' if a['direction'] == 'LEFT' else 'r'}_i32"
              "(av, bv)", "a << b or a >> b (arithmetic) on i32; an amount < 0 or >= 32 gives 0 (-1 for a "
              f"negative a shifted RIGHT), as onnx's reference for signed types {_onnx('BitShift')}",
              attrs=(Attr("direction", "str", "LEFT", "LEFT or RIGHT"),), helpers=True, check=_check_shift),
    # selection and conversion
    Pointwise("Where", ("cond", "x", "y"), ((BOOL, F32, F32), (BOOL, I32, I32), (BOOL, BOOL, BOOL)),
              lambda c, x, y: np.where(c, x, y), "select(cv, bv, av != 0u)",
              f"x where cond else y, numpy broadcasting of all three {_onnx('Where')}", result=1, vjp=_where_vjp),
    Pointwise("Cast", ("x",), ((F32,), (I32,), (BOOL,)), _cast, _cast_wgsl,
              "x converted to the dtype ``to``: f32 -> i32 truncates toward zero and saturates (NaN -> 0; "
              "ONNX leaves both undefined), i32 -> f32 rounds to nearest, to bool is x != 0 (NaN -> true), "
              f"bool -> 0 / 1 {_onnx('Cast')}", result=lambda a: DType(a["to"]),
              attrs=(Attr("to", "str", doc="f32, i32 or bool"),), vjp=_cast_vjp, helpers=True,
              check=_check_cast),
)
POINTWISE_BY_NAME = {r.name: r for r in POINTWISE}

for _row in POINTWISE:
    _register(_row)
