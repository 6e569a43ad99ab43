"""Ops that need no kernel of their own: Identity, Dropout (inference, or training with ratio
0), OptionalHasElement and OptionalGetElement of tensors, Shape and Size (known from the static
shapes)."""

from __future__ import annotations

import numpy as np

from ..importer import NodeContext, Value, converter


@converter("Identity")
def _identity(ctx: NodeContext) -> Value:
    return ctx.value(0)


@converter("Dropout")
def _dropout(ctx: NodeContext) -> list[Value]:
    # inference: the input unchanged and an all-true mask (ONNX Dropout, training_mode false); in
    # training mode with ratio 0 the same (nothing dropped, scale 1 / (1 - 0))
    if ctx.has(2) and bool(np.asarray(ctx.const(2, "training_mode")).reshape(-1)[0]):
        ratio = float(np.asarray(ctx.const(1, "ratio")).reshape(-1)[0]) if ctx.has(1) else 0.5
        if ratio != 0.0:
            raise ctx.fail(f"training_mode = true with ratio {ratio:g} drops random elements, which eggfuse does not "
                           "do (it runs inference: dropout is the identity); export the model in eval mode")
    v = ctx.value(0)
    return [v, ctx.known(np.ones(v.shape, dtype=bool))]


@converter("OptionalHasElement")
def _optional_has_element(ctx: NodeContext) -> Value:
    # a tensor given is an optional holding it; no input (or an empty name) is one holding none
    return ctx.known(np.array(ctx.has(0)))


@converter("OptionalGetElement")
def _optional_get_element(ctx: NodeContext) -> Value:
    return ctx.value(0)  # a tensor (the importer refuses optional- and sequence-typed values)


@converter("Shape")
def _shape(ctx: NodeContext) -> Value:
    shape = np.array(ctx.shape(0), dtype=np.int64)
    rank = len(shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    return ctx.known(shape[slice(start, end)])


@converter("Size")
def _size(ctx: NodeContext) -> Value:
    return ctx.known(np.array(int(np.prod(ctx.shape(0))), dtype=np.int64))
