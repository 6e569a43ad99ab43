"""Reductions, arg-reductions, scans and TopK: ReduceSum, ReduceMean, ReduceMax, ReduceMin,
ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare (axes as an
attribute, or from opset 13 / 18 as an input known at load time; keepdims,
noop_with_empty_axes), ArgMax, ArgMin (axis, keepdims, select_last_index), CumSum, CumProd
(exclusive, reverse, the axis input) and TopK (k as an attribute or input, axis, largest,
sorted). Each maps onto the IR op of the same semantics (``ir/ops/reduce_axes.py``,
``ir/ops/scans.py``); TopK onto two, one per output."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import TensorProto

from eggfuse.ir.ops.reduce_axes import REDUCTION_BY_NAME

from ..importer import NodeContext, Value, converter, elem_name

_T = TensorProto
_INTS = (_T.INT32, _T.INT64)
_ONNX_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def axis_of(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in [-rank, rank) as a non-negative axis; raises ctx.fail otherwise."""
    if not -rank <= axis < rank:
        raise ctx.fail(f"{what} {axis} is out of range for an input of rank {rank} (shape {list(ctx.shape(0))})")
    return axis % rank


def axes_of(ctx: NodeContext, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """``axes`` resolved (negative ones counted from the end), sorted; ctx.fail on a repeat."""
    out = [axis_of(ctx, int(a), rank, "axis") for a in axes]
    if len(set(out)) != len(out):
        raise ctx.fail(f"axes {list(axes)} name an axis twice")
    return tuple(sorted(out))


def need_elem(ctx: NodeContext, allowed: Sequence[int], what: str = "its input") -> int:
    """The element type of input 0; ctx.fail naming the types allowed when it is another."""
    elem = ctx.elem(0)
    if elem not in allowed:
        names = ", ".join(elem_name(e) for e in allowed)
        raise ctx.fail(f"{what} {ctx.node.input[0]!r} is {elem_name(elem)}; eggfuse runs this op on {names}")
    return elem


@converter(*_ONNX_REDUCTIONS)
def _reduce(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axes", "keepdims", "noop_with_empty_axes"))
    r = REDUCTION_BY_NAME[ctx.op_type]
    allowed = [_T.FLOAT] + (list(_INTS) if r.int_ok else []) + ([_T.BOOL] if r.bool_ok else [])
    elem = need_elem(ctx, allowed)
    rank = len(ctx.shape(0))
    if ctx.has(1):
        axes = [int(a) for a in np.asarray(ctx.const(1, "axes")).reshape(-1)]
    else:
        axes = list(ctx.attr("axes", ()))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return _over_no_axes(ctx, elem)
        axes = list(range(rank))
    nid = ctx.add(ctx.op_type, [ctx.tensor(0)], axes=axes_of(ctx, axes, rank), keepdims=bool(ctx.attr("keepdims", 1)))
    return ctx.out(nid, elem=elem)


def _over_no_axes(ctx: NodeContext, elem: int) -> Value:
    # noop_with_empty_axes with no axes: the reduction over none, each element on its own, as onnx's reference
    # computes it (np.sum over axis=()): the input for most, but squared, |x|, sqrt(x * x) or log(x) for these
    x = ctx.tensor(0)
    if ctx.op_type == "ReduceSumSquare":
        return ctx.out(ctx.add("Mul", [x, x]), elem=elem)
    if ctx.op_type == "ReduceL1":
        return ctx.out(ctx.add("Abs", [x]), elem=elem)
    if ctx.op_type == "ReduceL2":
        return ctx.out(ctx.add("Sqrt", [ctx.add("Mul", [x, x])]), elem=elem)
    if ctx.op_type == "ReduceLogSum":
        return ctx.out(ctx.add("Log", [x]), elem=elem)
    return ctx.value(0)


@converter("ArgMax", "ArgMin")
def _arg(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axis", "keepdims", "select_last_index"))
    need_elem(ctx, (_T.FLOAT, *_INTS))
    axis = axis_of(ctx, int(ctx.attr("axis", 0)), len(ctx.shape(0)))
    nid = ctx.add(ctx.op_type, [ctx.tensor(0)], axis=axis, keepdims=bool(ctx.attr("keepdims", 1)),
                  select_last_index=bool(ctx.attr("select_last_index", 0)))
    return ctx.out(nid, elem=_T.INT64)


@converter("CumSum", "CumProd")
def _scan(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("exclusive", "reverse"))
    elem = need_elem(ctx, (_T.FLOAT, *_INTS))
    axis = np.asarray(ctx.const(1, "axis")).reshape(-1)
    if axis.size != 1:
        raise ctx.fail(f"axis must hold one value, got {axis.tolist()}")
    nid = ctx.add(ctx.op_type, [ctx.tensor(0)], axis=axis_of(ctx, int(axis[0]), len(ctx.shape(0))),
                  exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))
    return ctx.out(nid, elem=elem)


@converter("TopK")
def _top_k(ctx: NodeContext) -> list[Value | None]:
    ctx.refuse_attrs(("axis", "k", "largest", "sorted"))
    elem = need_elem(ctx, (_T.FLOAT, *_INTS))
    shape = ctx.shape(0)
    axis = axis_of(ctx, int(ctx.attr("axis", -1)), len(shape))
    if ctx.has(1):
        k = np.asarray(ctx.const(1, "K")).reshape(-1)
        if k.size != 1:
            raise ctx.fail(f"K must hold one value, got {k.tolist()}")
        k = int(k[0])
    else:
        k = int(ctx.attr("k", 0))
    if not 1 <= k <= shape[axis]:
        raise ctx.fail(f"k = {k} must lie in 1..{shape[axis]} (axis {axis} of the input, shape {list(shape)}); "
                       "eggfuse has no zero-size tensors")
    # sorted = 0 leaves the order to the runtime: the sorted order is one of the orders allowed
    attrs = dict(k=k, axis=axis, largest=bool(ctx.attr("largest", 1)))
    outs = list(ctx.node.output) + [""] * 2
    x = ctx.tensor(0)
    values = ctx.out(ctx.add("TopKValues", [x], **attrs), elem=elem) if outs[0] else None
    indices = ctx.out(ctx.add("TopKIndices", [x], **attrs), elem=_T.INT64) if outs[1] else None
    return [values, indices]
