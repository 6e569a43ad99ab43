"""Indexing with run-time indices: Gather, GatherElements, GatherND, ScatterElements (and the
deprecated Scatter), ScatterND, OneHot; Compress, whose condition must be known at load time
(its output's shape depends on it), as a Gather of the selected indices. Negative indices
count from the end of their axis; out-of-range ones are clamped (ONNX leaves them undefined):
see ``eggfuse.ir.ops.indexing``."""

from __future__ import annotations

import numpy as np

from eggfuse.ir import DType, Graph, GraphError, OnnxError, TensorType
from eggfuse.ir.facts import baked
from eggfuse.ir.spec import OPS, ShapeError

from ..importer import ELEM_DTYPE, NodeContext, Value, converter, fed_index_error, first_out_of_range
from .movement import axis_of, same

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(ctx: NodeContext) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"attribute reduction={reduction!r} is not supported ({', '.join(_REDUCTIONS)} are)")
    return reduction


#: Most elements of the Constant that :func:`_uniform` makes where the data holds fewer (a small
#: table gathered into a large output stays a gather).
UNIFORM_MAX_ELEMENTS = 1 << 16


def _uniform(ctx: NodeContext, op: str, **attrs) -> Value | None:
    """Gather-like ``op``'s output as a Constant (uploaded once, no dispatch) where its data (input 0)
    is known at load time and holds one value in every element (the same bits: -0.0 is not 0.0),
    whatever the run-time indices pick (out-of-range ones are clamped): RoBERTa's token types, a
    ``GatherElements`` of a registered zero buffer by position ids. The output's shape is the IR
    op's (its checks apply; an invalid node is left to the gather, which raises). The value stays a
    run-time one for the import (not known), so that the Gather of the token-type table by it is not
    folded into a [B, S, H] array and the embedding rules still see it. None otherwise: data
    computed at run time, a float initializer the import keeps as a parameter (whose values may be
    replaced; one a value fact bakes is a Constant anyway), NaN or
    mixed data, an empty output, or an output of more than max(UNIFORM_MAX_ELEMENTS, data's
    elements) elements."""
    data = ctx.value(0)
    dtype = ELEM_DTYPE.get(data.elem)
    if data.const is None or dtype is None or data.const.size == 0:
        return None
    if data.param and dtype is DType.F32 and not baked(data.const, TensorType(tuple(data.shape), dtype)):
        return None  # the importer's parameter (Importer.materialise)
    spec = OPS[op]
    try:
        shape = spec.infer([TensorType(tuple(data.shape), dtype), TensorType(tuple(ctx.shape(1)), DType.I32)],
                           Graph._attributes(spec, attrs)).shape
    except (ShapeError, GraphError):
        return None
    size = int(np.prod(shape))
    if size == 0 or size > max(UNIFORM_MAX_ELEMENTS, data.const.size):
        return None
    flat = np.ascontiguousarray(data.const).reshape(-1)
    bits = flat.view(f"u{flat.itemsize}")
    if not (bits == bits[0]).all() or (flat.dtype.kind == "f" and np.isnan(flat[0])):
        return None
    full = Value(data.name, ctx.elem(0), shape, const=np.full(shape, flat[0], dtype=flat.dtype))
    return same(ctx, ctx.importer.materialise(full, ctx))


def _check_fed_indices(ctx: NodeContext, axis: int) -> None:
    # indices known at load time, over data computed at run time (the Gather is not folded): a value outside the
    # axis is the feed's fault (IndexRangeError) where they come from an input given by value, else the model's
    # (an initializer or a Constant): OnnxError naming the node and the indices, before any kernel clamps them
    idx = ctx.inputs[1]
    if idx is None or idx.const is None or not np.asarray(idx.const).size:
        return
    shape = ctx.shape(0)
    if (bad := first_out_of_range(np.asarray(idx.const).astype(np.int64), shape[axis])) is None:
        return
    fed_index_error(ctx.node, idx, bad, axis, shape)
    dim, node = int(shape[axis]), ctx.node
    source = node.input[1]
    data = ctx.inputs[0]
    sized = (f" (the data's shape at the shapes of the input(s) {', '.join(map(repr, sorted(data.deps)))})"
             if data is not None and data.deps else "")
    raise OnnxError(f"{node.op_type} node {node.name!r}: its indices {source!r}, known at load time (an initializer "
                    f"or a constant), hold {bad}, out of range for axis {axis} of {list(shape)}{sized}; ONNX refuses "
                    f"an index outside [-{dim}, {dim})")


@converter("Gather")
def _gather(ctx: NodeContext) -> Value:
    axis = axis_of(ctx, ctx.attr("axis", 0), len(ctx.shape(0)))
    _check_fed_indices(ctx, axis)
    known = _uniform(ctx, "Gather", axis=axis)
    return known or same(ctx, ctx.add("Gather", [ctx.tensor(0), ctx.tensor(1)], axis=axis))


@converter("GatherElements")
def _gather_elements(ctx: NodeContext) -> Value:
    axis = axis_of(ctx, ctx.attr("axis", 0), len(ctx.shape(0)))
    _check_fed_indices(ctx, axis)
    known = _uniform(ctx, "GatherElements", axis=axis)
    return known or same(ctx, ctx.add("GatherElements", [ctx.tensor(0), ctx.tensor(1)], axis=axis))


@converter("GatherND")
def _gather_nd(ctx: NodeContext) -> Value:
    batch_dims = ctx.attr("batch_dims", 0)
    known = _uniform(ctx, "GatherND", batch_dims=batch_dims)
    return known or same(ctx, ctx.add("GatherND", [ctx.tensor(0), ctx.tensor(1)], batch_dims=batch_dims))


@converter("ScatterElements", "Scatter")
def _scatter_elements(ctx: NodeContext) -> Value:
    axis = axis_of(ctx, ctx.attr("axis", 0), len(ctx.shape(0)))
    return same(ctx, ctx.add("ScatterElements", [ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)], axis=axis,
                             reduction=_reduction(ctx)))


@converter("ScatterND")
def _scatter_nd(ctx: NodeContext) -> Value:
    return same(ctx, ctx.add("ScatterND", [ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)], reduction=_reduction(ctx)))


@converter("OneHot")
def _one_hot(ctx: NodeContext) -> Value:
    depth = np.asarray(ctx.const(1, "depth")).reshape(-1)
    if depth.size != 1 or depth[0] < 1:
        raise ctx.fail(f"depth must be one value >= 1, got {depth.tolist()}")
    return ctx.out(ctx.add("OneHot", [ctx.tensor(0), ctx.tensor(2)], depth=int(depth[0]), axis=ctx.attr("axis", -1)),
                   elem=ctx.elem(2))


@converter("Compress")
def _compress(ctx: NodeContext) -> Value:
    cond = np.asarray(ctx.const(1, "condition")).reshape(-1).astype(bool)
    x, axis = ctx.tensor(0), ctx.attr("axis")
    if axis is None:  # the flattened input
        x, axis = ctx.add("Identity", [x], shape=[int(np.prod(ctx.shape(0)))]), 0
        length = int(np.prod(ctx.shape(0)))
    else:
        axis = axis_of(ctx, axis, len(ctx.shape(0)))
        length = ctx.shape(0)[axis]
    if cond.size > length:
        raise ctx.fail(f"condition has {cond.size} values, more than the {length} along axis {axis}")
    picked = np.nonzero(cond)[0]
    if not picked.size:
        raise ctx.fail("the condition selects nothing: the output would be empty, which eggfuse cannot store")
    index = ctx.constant(picked.astype(np.int32), DType.I32)
    return same(ctx, ctx.add("Gather", [x, index], axis=axis))
