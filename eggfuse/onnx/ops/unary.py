"""Unary math and activation ops: one IR op of the unary table each (``ir/ops/elementwise.py``,
``ir/ops/unary.py``), named as in ONNX except Reciprocal (IR ``Recip``), Gelu with
``approximate="tanh"`` (``GeluTanh``) and Swish with alpha 1 (``Silu``, which the rewrite
rules know). Attributes keep ONNX's defaults (https://onnx.ai/onnx/operators/); an attribute
ONNX does not define for the op is refused.

Abs, Neg and Relu also take int32 and int64 tensors (run in int32, the result keeping the
input's element type); the others take float tensors.
"""

from __future__ import annotations

from onnx import TensorProto

from ..importer import NodeContext, Value, converter, elem_name

#: ONNX op type -> IR op, for the ops without attributes.
PLAIN = {name: name for name in (
    "Sqrt", "Exp", "Log", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
    "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "IsNaN", "Softplus", "Softsign", "HardSwish",
    "Mish")} | {"Reciprocal": "Recip"}

#: ONNX op type -> its float attributes and their defaults (the IR op of the same name takes them).
WITH_ATTRS = {
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "LeakyRelu": {"alpha": 0.01},
    "Elu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "Celu": {"alpha": 1.0},
    "ThresholdedRelu": {"alpha": 1.0},
    "Shrink": {"bias": 0.0, "lambd": 0.5},
}

#: Those that also run on integers (ONNX allows more; these are the element types eggfuse runs).
INTEGER = {"Abs", "Neg", "Relu"}
_FLOAT = {TensorProto.FLOAT}
_INT = {TensorProto.INT32, TensorProto.INT64}


def _unary(ctx: NodeContext, op: str, **attrs) -> Value:
    elem = ctx.elem(0)
    allowed = _FLOAT | _INT if ctx.op_type in INTEGER else _FLOAT
    if elem not in allowed:
        kinds = "float32, int32 and int64" if ctx.op_type in INTEGER else "float32"
        raise ctx.fail(f"input {ctx.value(0).name!r} has element type {elem_name(elem)}; eggfuse runs "
                       f"{ctx.op_type} on {kinds} tensors")
    nid = ctx.add(op, [ctx.tensor(0)], **attrs)
    return ctx.out(nid, None if op in ("IsNaN", "IsInf") else elem)


@converter(*PLAIN)
def _plain(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(())
    return _unary(ctx, PLAIN[ctx.op_type])


@converter(*WITH_ATTRS)
def _with_attrs(ctx: NodeContext) -> Value:
    defaults = WITH_ATTRS[ctx.op_type]
    ctx.refuse_attrs(tuple(defaults))
    attrs = {k: float(ctx.attr(k, v)) for k, v in defaults.items()}
    if ctx.op_type == "Celu" and attrs["alpha"] == 0.0:
        raise ctx.fail("alpha = 0 is not defined (CELU divides by alpha)")
    return _unary(ctx, ctx.op_type, **attrs)


@converter("IsInf")
def _is_inf(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("detect_negative", "detect_positive"))
    return _unary(ctx, "IsInf", detect_negative=bool(ctx.attr("detect_negative", 1)),
                  detect_positive=bool(ctx.attr("detect_positive", 1)))


@converter("Gelu")
def _gelu(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("approximate",))
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.fail(f"approximate={approximate!r} is not defined; ONNX Gelu takes 'none' or 'tanh'")
    return _unary(ctx, "Gelu" if approximate == "none" else "GeluTanh")


@converter("Swish")
def _swish(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("alpha",))
    alpha = float(ctx.attr("alpha", 1.0))
    return _unary(ctx, "Silu") if alpha == 1.0 else _unary(ctx, "Swish", alpha=alpha)
