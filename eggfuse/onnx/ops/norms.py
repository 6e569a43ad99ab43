"""Softmaxes and normalisations: Softmax, LogSoftmax, Hardmax (any axis; before opset 13 the
input is flattened to 2-D at ``axis``), LayerNormalization (its Mean and InvStdDev outputs
too), RMSNormalization, BatchNormalization (inference, and training mode from the batch's statistics),
InstanceNormalization,
GroupNormalization (opset 18's per-group and opset 21's per-channel scale), LpNormalization,
MeanVarianceNormalization and LRN.

Where an ONNX op maps onto an op the rewrite rules know, it becomes that op on a reshape
view: the last-axis Softmax / LogSoftmax, LayerNorm and RmsNorm over the [rows, n] view of
the normalised trailing axes, GroupNorm over [N, C, spatial] (InstanceNormalization is
GroupNorm with a group per channel). The rest become the ops of ``ir/ops/axis_norms.py``.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from ..importer import NodeContext, Value, converter
from .reductions import axes_of, axis_of, need_elem

_T = TensorProto


def _view(ctx: NodeContext, nid: int, shape) -> int:
    """``nid`` reshaped to ``shape`` (no node when it has that shape already)."""
    shape = tuple(int(d) for d in shape)
    if ctx.graph.node(nid).type.shape == shape:
        return nid
    return ctx.add("Identity", [nid], shape=shape)


def _rank_at_least(ctx: NodeContext, rank: int, layout: str) -> tuple[int, ...]:
    shape = ctx.shape(0)
    if len(shape) < rank:
        raise ctx.fail(f"input {ctx.node.input[0]!r} has shape {list(shape)}; this op takes {layout}")
    return shape


def _stash_type(ctx: NodeContext) -> None:
    if ctx.attr("stash_type", 1) != _T.FLOAT:
        raise ctx.fail(f"stash_type = {ctx.attr('stash_type')} is not supported: eggfuse computes the statistics in "
                       "float32 (stash_type 1)")


# --- Softmax, LogSoftmax, Hardmax ---------------------------------------------------------------


@converter("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axis",))
    need_elem(ctx, (_T.FLOAT,))
    shape = _rank_at_least(ctx, 1, "a tensor of rank 1 or more")
    rank = len(shape)
    axis = axis_of(ctx, int(ctx.attr("axis", -1 if ctx.opset >= 13 else 1)), rank)
    x = ctx.tensor(0)
    if ctx.opset < 13:
        # opsets 1-12: the input flattened to [prod(shape[:axis]), prod(shape[axis:])], normalised per row
        rows = math.prod(shape[:axis])
        flat = _view(ctx, x, (rows, math.prod(shape) // rows))
        y = ctx.add(ctx.op_type, [flat], axis=1) if ctx.op_type == "Hardmax" else ctx.add(ctx.op_type, [flat])
        return ctx.out(_view(ctx, y, shape))
    if ctx.op_type == "Hardmax":
        return ctx.out(ctx.add("Hardmax", [x], axis=axis))
    if axis == rank - 1:
        return ctx.out(ctx.add(ctx.op_type, [x]))
    return ctx.out(ctx.add(f"{ctx.op_type}Axis", [x], axis=axis))


# --- LayerNormalization, RMSNormalization ---------------------------------------------------------


def _per_element(ctx: NodeContext, i: int, norm_shape: tuple[int, ...], what: str) -> int:
    """Input ``i`` (broadcast against the normalised shape) as an [n] tensor, n = prod(norm_shape)."""
    s = tuple(ctx.shape(i))
    n = math.prod(norm_shape)
    extra = len(s) - len(norm_shape)
    if extra > 0 and all(d == 1 for d in s[:extra]):
        s = s[extra:]
    try:
        fits = tuple(np.broadcast_shapes(s, norm_shape)) == norm_shape
    except ValueError:
        fits = False
    if not fits:
        raise ctx.fail(f"{what} {ctx.node.input[i]!r} has shape {list(ctx.shape(i))}, which does not broadcast to the "
                       f"normalised axes {list(norm_shape)}; eggfuse takes a {what} over those axes only")
    t = ctx.tensor(i)
    if math.prod(s) != n:
        t = ctx.add("BroadcastTo", [_view(ctx, t, s) if s else t], shape=norm_shape)
    return _view(ctx, t, (n,))


def _trailing(ctx: NodeContext) -> tuple[tuple[int, ...], int, int, int]:
    """(shape, axis, rows, n) of a norm over the axes from ``axis`` on."""
    shape = _rank_at_least(ctx, 1, "a tensor of rank 1 or more")
    axis = axis_of(ctx, int(ctx.attr("axis", -1)), len(shape))
    n = math.prod(shape[axis:])
    return shape, axis, math.prod(shape) // n, n


@converter("LayerNormalization")
def _layer_norm(ctx: NodeContext) -> list[Value | None]:
    ctx.refuse_attrs(("axis", "epsilon", "stash_type"))
    _stash_type(ctx)
    need_elem(ctx, (_T.FLOAT,))
    shape, axis, rows, n = _trailing(ctx)
    eps = float(ctx.attr("epsilon", 1e-5))
    norm_shape = tuple(shape[axis:])
    w = _per_element(ctx, 1, norm_shape, "Scale")
    b = _per_element(ctx, 2, norm_shape, "B") if ctx.has(2) else ctx.constant(np.zeros(n, dtype=np.float32))
    x = ctx.tensor(0)
    y = _view(ctx, ctx.add("LayerNorm", [_view(ctx, x, (rows, n)), w, b], eps=eps), shape)
    outs = list(ctx.node.output) + [""] * 3
    axes = tuple(range(axis, len(shape)))
    mean = ctx.out(ctx.add("ReduceMean", [x], axes=axes, keepdims=True)) if outs[1] else None
    inv = ctx.out(ctx.add("InvStdDev", [x], axes=axes, keepdims=True, epsilon=eps)) if outs[2] else None
    return [ctx.out(y), mean, inv]


@converter("RMSNormalization")
def _rms_norm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axis", "epsilon", "stash_type"))
    _stash_type(ctx)
    need_elem(ctx, (_T.FLOAT,))
    shape, axis, rows, n = _trailing(ctx)
    w = _per_element(ctx, 1, tuple(shape[axis:]), "scale")
    y = ctx.add("RmsNorm", [_view(ctx, ctx.tensor(0), (rows, n)), w], eps=float(ctx.attr("epsilon", 1e-5)))
    return ctx.out(_view(ctx, y, shape))


# --- BatchNormalization, InstanceNormalization, GroupNormalization -------------------------------------


@converter("BatchNormalization")
def _batch_norm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("epsilon", "momentum", "spatial", "training_mode"))
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx)
    if any(ctx.node.output[1:]):
        raise ctx.fail("the outputs after Y (running and saved mean and variance) exist in training mode only, "
                       "which eggfuse does not run; export the model in eval mode")
    need_elem(ctx, (_T.FLOAT,))
    shape = _rank_at_least(ctx, 2, "[N, C, ...]")
    x = ctx.tensor(0)
    stats = [ctx.tensor(i) for i in range(1, 5)]
    if ctx.opset < 9 and ctx.attr("spatial", 1) == 0:
        # per-activation statistics of shape [C, D1, ...]: one "channel" per element of a sample
        per = math.prod(shape[1:])
        x = _view(ctx, x, (shape[0], per))
        stats = [_view(ctx, s, (per,)) for s in stats]
    y = ctx.add("BatchNormalization", [x, *stats], epsilon=float(ctx.attr("epsilon", 1e-5)))
    return ctx.out(_view(ctx, y, shape))


def _batch_norm_training(ctx: NodeContext) -> list[Value]:
    # training_mode = 1 (opset 14+): Y normalised by the batch's statistics (mean and population
    # variance over every axis but C), and the running statistics updated with momentum:
    # running = input * momentum + batch * (1 - momentum), as onnx's reference computes them
    need_elem(ctx, (_T.FLOAT,))
    shape = _rank_at_least(ctx, 2, "[N, C, ...]")
    c, rank = shape[1], len(shape)
    per_channel = (1, c) + (1,) * (rank - 2)
    axes = (0, *range(2, rank))
    x = ctx.tensor(0)
    mean = ctx.add("ReduceMean", [x], axes=axes, keepdims=True)
    d = ctx.add("Sub", [x, mean])
    var = ctx.add("ReduceMean", [ctx.add("Mul", [d, d])], axes=axes, keepdims=True)
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    scale, bias = (_view(ctx, _channel_vector(ctx, i, c, what), per_channel) for i, what in ((1, "scale"), (2, "B")))
    std = ctx.add("Sqrt", [ctx.add("Add", [var, ctx.constant(np.float32(eps))])])
    y = ctx.add("Add", [ctx.add("Mul", [scale, ctx.add("Div", [d, std])]), bias])
    outs = [ctx.out(y)]
    for i, batch in ((3, mean), (4, var)):
        running = _channel_vector(ctx, i, c, "input_mean" if i == 3 else "input_var")
        outs.append(ctx.out(ctx.add("Add", [ctx.add("Mul", [running, ctx.constant(np.float32(momentum))]),
                                            ctx.add("Mul", [_view(ctx, batch, (c,)),
                                                            ctx.constant(np.float32(1.0 - momentum))])])))
    return outs


def _spatial_view(ctx: NodeContext) -> tuple[tuple[int, ...], int]:
    """(shape, [N, C, spatial] view of input 0)."""
    shape = _rank_at_least(ctx, 2, "[N, C, ...]")
    return shape, _view(ctx, ctx.tensor(0), (shape[0], shape[1], math.prod(shape[2:])))


def _channel_vector(ctx: NodeContext, i: int, c: int, what: str) -> int:
    if tuple(ctx.shape(i)) != (c,):
        raise ctx.fail(f"{what} {ctx.node.input[i]!r} has shape {list(ctx.shape(i))}; it must be [{c}], one per "
                       "channel")
    return ctx.tensor(i)


@converter("InstanceNormalization")
def _instance_norm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("epsilon",))
    need_elem(ctx, (_T.FLOAT,))
    shape, x = _spatial_view(ctx)
    c = shape[1]
    w, b = (_channel_vector(ctx, i, c, what) for i, what in ((1, "scale"), (2, "B")))
    y = ctx.add("GroupNorm", [x, w, b], num_groups=c, eps=float(ctx.attr("epsilon", 1e-5)))
    return ctx.out(_view(ctx, y, shape))


@converter("GroupNormalization")
def _group_norm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("num_groups", "epsilon", "stash_type"))
    _stash_type(ctx)
    need_elem(ctx, (_T.FLOAT,))
    shape, x = _spatial_view(ctx)
    c, groups = shape[1], ctx.attr("num_groups")
    if groups is None or groups < 1 or c % groups:
        raise ctx.fail(f"num_groups = {groups} must divide the {c} channels of the input (shape {list(shape)})")
    params = []
    for i, what in ((1, "scale"), (2, "bias")):
        s = tuple(ctx.shape(i))
        if s == (c,) and (ctx.opset >= 21 or c == groups):
            params.append(ctx.tensor(i))
        elif s == (groups,) and ctx.opset < 21:
            # opset 18: one value per group, repeated over the group's channels
            t = ctx.add("BroadcastTo", [_view(ctx, ctx.tensor(i), (groups, 1))], shape=(groups, c // groups))
            params.append(_view(ctx, t, (c,)))
        else:
            want = c if ctx.opset >= 21 else groups
            raise ctx.fail(f"{what} {ctx.node.input[i]!r} has shape {list(s)}; opset {ctx.opset} takes [{want}] "
                           f"(one per {'channel' if ctx.opset >= 21 else 'group'})")
    y = ctx.add("GroupNorm", [x, *params], num_groups=groups, eps=float(ctx.attr("epsilon", 1e-5)))
    return ctx.out(_view(ctx, y, shape))


# --- LpNormalization, MeanVarianceNormalization, LRN ------------------------------------------------


@converter("LpNormalization")
def _lp_norm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axis", "p"))
    need_elem(ctx, (_T.FLOAT,))
    shape = _rank_at_least(ctx, 1, "a tensor of rank 1 or more")
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.fail(f"p = {p} is not supported (ONNX LpNormalization takes p = 1 or 2)")
    axis = axis_of(ctx, int(ctx.attr("axis", -1)), len(shape))
    return ctx.out(ctx.add("LpNormalization", [ctx.tensor(0)], axis=axis, p=p))


@converter("MeanVarianceNormalization")
def _mvn(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("axes",))
    need_elem(ctx, (_T.FLOAT,))
    axes = axes_of(ctx, ctx.attr("axes", (0, 2, 3)), len(ctx.shape(0)))
    return ctx.out(ctx.add("MeanVarianceNormalization", [ctx.tensor(0)], axes=axes))


@converter("LRN")
def _lrn(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("alpha", "beta", "bias", "size"))
    need_elem(ctx, (_T.FLOAT,))
    _rank_at_least(ctx, 2, "[N, C, ...]")
    size = ctx.attr("size")
    if size is None or size < 1:
        raise ctx.fail(f"size = {size} must be a positive number of channels")
    return ctx.out(ctx.add("LRN", [ctx.tensor(0)], size=size, alpha=float(ctx.attr("alpha", 1e-4)),
                           beta=float(ctx.attr("beta", 0.75)), bias=float(ctx.attr("bias", 1.0))))
