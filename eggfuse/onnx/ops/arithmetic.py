"""Converters of ONNX's broadcasting elementwise ops: arithmetic, comparison, logic, bitwise,
Where, Clip, Cast and CastLike, to the IR ops of ``ir/ops/arithmetic.py`` (one IR op each,
ONNX semantics; the variadic Min, Max, Sum and Mean as chains of the binary op).

Element types: float32 (FLOAT), int32 and int64 (both I32 on the device, the ONNX type kept on
the value) and bool, as the importer takes them. ``Greater`` and ``GreaterOrEqual`` are
``Less`` and ``LessOrEqual`` with the operands swapped (the IR's ``Greater`` is the f32 mask
of the seed). A Cast to another element type is refused, naming it.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from eggfuse.ir import DType

from ..importer import COMPUTED_IN_F32, ELEM_DTYPE, NodeContext, Value, converter, elem_name

_T = TensorProto

#: ONNX op type -> IR op, operands in order
_BINARY = {op: op for op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "And", "Or", "Xor",
                             "BitwiseAnd", "BitwiseOr", "BitwiseXor")}
#: ONNX op type -> IR op, operands swapped
_SWAPPED = {"Greater": "Less", "GreaterOrEqual": "LessOrEqual"}
_BOOL_RESULT = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}
#: ONNX Cast targets eggfuse computes in, and their IR dtype
CAST_TARGETS = {_T.FLOAT: DType.F32, _T.INT32: DType.I32, _T.INT64: DType.I32, _T.BOOL: DType.BOOL}


def _out_elem(ctx: NodeContext, i: int) -> int:
    return _T.BOOL if ctx.op_type in _BOOL_RESULT else ctx.elem(i)


@converter(*_BINARY, *_SWAPPED)
def _binary(ctx: NodeContext) -> Value:
    a, b = ctx.tensor(0), ctx.tensor(1)
    if ctx.op_type in _SWAPPED:
        return ctx.out(ctx.add(_SWAPPED[ctx.op_type], [b, a]), elem=_T.BOOL)
    return ctx.out(ctx.add(_BINARY[ctx.op_type], [a, b]), elem=_out_elem(ctx, 0))


@converter("Mod")
def _mod(ctx: NodeContext) -> Value:
    fmod = ctx.attr("fmod", 0)
    if fmod not in (0, 1):
        raise ctx.fail(f"attribute fmod={fmod} is not 0 or 1")
    return ctx.out(ctx.add("Mod", [ctx.tensor(0), ctx.tensor(1)], fmod=fmod), elem=ctx.elem(0))


@converter("BitShift")
def _bitshift(ctx: NodeContext) -> Value:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"attribute direction={direction!r} must be LEFT or RIGHT")
    return ctx.out(ctx.add("BitShift", [ctx.tensor(0), ctx.tensor(1)], direction=direction), elem=ctx.elem(0))


@converter("Not", "BitwiseNot", "Sign")
def _unary(ctx: NodeContext) -> Value:
    return ctx.out(ctx.add(ctx.op_type, [ctx.tensor(0)]), elem=ctx.elem(0))


@converter("PRelu")
def _prelu(ctx: NodeContext) -> Value:
    return ctx.out(ctx.add("PRelu", [ctx.tensor(0), ctx.tensor(1)]), elem=ctx.elem(0))


@converter("Where")
def _where(ctx: NodeContext) -> Value:
    return ctx.out(ctx.add("Where", [ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)]), elem=ctx.elem(1))


@converter("Min", "Max", "Sum", "Mean")
def _variadic(ctx: NodeContext) -> Value:
    given = [i for i in range(len(ctx.inputs)) if ctx.has(i)]
    if not given:
        raise ctx.fail("needs at least one input")
    if len(given) == 1:
        return ctx.value(given[0])
    op = {"Min": "Min", "Max": "Max", "Sum": "Add", "Mean": "Add"}[ctx.op_type]
    acc = ctx.tensor(given[0])
    for i in given[1:]:
        acc = ctx.add(op, [acc, ctx.tensor(i)])
    if ctx.op_type == "Mean":  # the sum over the count, as onnx's reference divides
        dtype = ctx.graph.node(acc).type.dtype
        acc = ctx.add("Div", [acc, ctx.constant(np.array(len(given), dtype=dtype.numpy), dtype)])
    return ctx.out(acc, elem=ctx.elem(given[0]))


#: Cast targets computed in float32 that round on the device (ir/ops/unary.py)
_ROUND_TO = {_T.FLOAT16: "RoundToFloat16", _T.BFLOAT16: "RoundToBFloat16"}


def _cast(ctx: NodeContext, to: int) -> Value:
    target = CAST_TARGETS.get(_T.FLOAT if to in COMPUTED_IN_F32 else to)
    if target is None:
        raise ctx.fail(f"a cast to element type {elem_name(to)} is not supported: eggfuse computes in float32, int32 "
                       "(int64 is narrowed to it) and bool (float64, float16 and bfloat16 in float32)")
    x = ctx.tensor(0)
    source = ctx.value(0).declared
    if source in _ROUND_TO and source != to:
        # a float16 (bfloat16) tensor, computed in float32: the cast reads its float16 value, as the graph's
        # output of it gives it (y = x * x of 300 is inf as float16, and so is Cast(y, FLOAT))
        x = ctx.add(_ROUND_TO[source], [x])
    if ELEM_DTYPE[ctx.elem(0)] is not target:  # else the same device type (int32 <-> int64, or no change)
        x = ctx.add("Cast", [x], to=target.value)
    if to in _ROUND_TO:  # also from a float16 tensor: computed in float32, its values may lie between float16's
        x = ctx.add(_ROUND_TO[to], [x])
    return ctx.out(x, elem=to)


@converter("Cast")
def _cast_node(ctx: NodeContext) -> Value:
    return _cast(ctx, ctx.attr("to"))


@converter("CastLike")
def _cast_like(ctx: NodeContext) -> Value:
    return _cast(ctx, ctx.value(1).declared or ctx.elem(1))


def _bound(ctx: NodeContext, i: int, dtype: DType, default: float) -> int:
    """Clip's bound ``i`` as a node: ``default`` when absent; a known one as a scalar Constant (an
    integer bound clamped to the int32 range, which keeps the result)."""
    if not ctx.has(i):
        return ctx.constant(np.array(default, dtype=dtype.numpy), dtype)
    v = ctx.value(i)
    if v.const is not None and v.const.size == 1:
        value = np.asarray(v.const).reshape(())
        if dtype is DType.I32:
            value = np.clip(value, -(2**31), 2**31 - 1)
        return ctx.constant(value.astype(dtype.numpy), dtype)
    return ctx.tensor(i)


@converter("Clip")
def _clip(ctx: NodeContext) -> Value:
    elem = ctx.elem(0)
    dtype = ELEM_DTYPE[elem]
    x = ctx.tensor(0)
    if ctx.opset < 11:  # min and max are attributes, by default float's lowest and highest values
        lo = ctx.constant(np.float32(ctx.attr("min", float(np.finfo(np.float32).min))), DType.F32)
        hi = ctx.constant(np.float32(ctx.attr("max", float(np.finfo(np.float32).max))), DType.F32)
    else:
        if not ctx.has(1) and not ctx.has(2):
            return ctx.value(0)
        info = np.iinfo(np.int32) if dtype is DType.I32 else None
        lo = _bound(ctx, 1, dtype, info.min if info else -np.inf)
        hi = _bound(ctx, 2, dtype, info.max if info else np.inf)
    node = ctx.add("Clip", [x, lo, hi])
    if ctx.graph.node(node).type.shape != ctx.shape(0):
        raise ctx.fail(f"min and max must be scalars, got shapes {[list(ctx.shape(i)) for i in (1, 2) if ctx.has(i)]} "
                       f"for input {list(ctx.shape(0))}")
    return ctx.out(node, elem=elem)
