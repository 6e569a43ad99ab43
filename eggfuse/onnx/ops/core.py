"""Ops that need no kernel of their own: Identity, Dropout (inference), Shape and Size (known
from the static shapes)."""

from __future__ import annotations

import numpy as np

from ..importer import NodeContext, Value, converter


@converter("Identity")
def _identity(ctx: NodeContext) -> Value:
    return ctx.value(0)


@converter("Dropout")
def _dropout(ctx: NodeContext) -> list[Value]:
    # inference: the input unchanged and an all-true mask (ONNX Dropout, training_mode false)
    if ctx.has(2) and ctx.value(2).const is not None and bool(np.asarray(ctx.const(2)).reshape(-1)[0]):
        raise ctx.fail("training_mode = true is not supported (eggfuse runs inference: dropout is the identity)")
    if ctx.has(2) and ctx.value(2).const is None:
        raise ctx.fail("training_mode must be known at load time")
    v = ctx.value(0)
    return [v, ctx.known(np.ones(v.shape, dtype=bool))]


@converter("Shape")
def _shape(ctx: NodeContext) -> Value:
    shape = np.array(ctx.shape(0), dtype=np.int64)
    rank = len(shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    return ctx.known(shape[slice(start, end)])


@converter("Size")
def _size(ctx: NodeContext) -> Value:
    return ctx.known(np.array(int(np.prod(ctx.shape(0))), dtype=np.int64))
