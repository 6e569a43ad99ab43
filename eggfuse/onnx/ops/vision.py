"""Conv, ConvTranspose and the pools (MaxPool with its Indices, AveragePool, LpPool and the
global pools), over 1 to 3 spatial axes.

``auto_pad`` (SAME_UPPER, SAME_LOWER, VALID) and ConvTranspose's ``output_shape`` are
resolved here into the explicit begin/end pads of the IR ops (``ir/ops/conv.py``,
``ir/ops/pooling.py``), following the formulas of the ONNX operator pages.
GlobalAveragePool is GlobalAvgPool (a workgroup reduction per channel) and a reshape;
GlobalMaxPool and GlobalLpPool are reductions over the spatial axes (ReduceMax; ReduceL1, ReduceL2, or
(ReduceSum of |x|^p)^(1/p)), whose invocations share each channel's elements.
MaxUnpool is a ScatterElements into zeros, Col2Im a grouped ConvTranspose with a one-hot kernel.
"""

from __future__ import annotations

import math

import numpy as np

from eggfuse.ir import DType
from eggfuse.ir.ops.movement import fill_bits

from ..importer import NodeContext, Value, converter
from .linalg import float_inputs, reshape

_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_CONV = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_POOL = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


def _spatial(ctx: NodeContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    if not 3 <= len(shape) <= 5:
        raise ctx.fail(f"X has shape {list(shape)}; eggfuse runs {ctx.op_type} over 1 to 3 spatial axes ([N, C, ...] "
                       "of rank 3 to 5)")
    return shape[2:]


def _ints(ctx: NodeContext, name: str, r: int, default: int) -> list[int]:
    v = ctx.attr(name)
    if v is None:
        return [default] * r
    if len(v) != r:
        raise ctx.fail(f"attribute {name}={list(v)} does not fit the {r} spatial axes of X {list(ctx.shape(0))}")
    return [int(x) for x in v]


def _pads(ctx: NodeContext, spatial, kernel, strides, dilations) -> list[int]:
    """Explicit [begin..., end...] pads of a Conv or pool node: ``pads``, or those ``auto_pad``
    implies (SAME: out = ceil(in / s), the padding split evenly with the odd one at the end for
    SAME_UPPER, at the beginning for SAME_LOWER; VALID: none)."""
    r = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto not in _AUTO_PAD:
        raise ctx.fail(f"attribute auto_pad={auto!r} is not one of {', '.join(_AUTO_PAD)}")
    if auto == "NOTSET":
        pads = _ints(ctx, "pads", 2 * r, 0)
        if any(p < 0 for p in pads):
            raise ctx.fail(f"attribute pads={pads} must be >= 0")
        return pads
    if auto == "VALID":
        return [0] * (2 * r)
    begin, end = [], []
    for n, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        total = max(0, (math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n)
        small, large = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else large)
        end.append(large if auto == "SAME_UPPER" else small)
    return begin + end


def _kernel_shape(ctx: NodeContext, w_shape) -> list[int]:
    given = ctx.attr("kernel_shape")
    if given is not None and list(given) != list(w_shape[2:]):
        raise ctx.fail(f"attribute kernel_shape={list(given)} differs from the weight's {list(w_shape[2:])}")
    return list(w_shape[2:])


@converter("Conv")
def _conv(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(_CONV)
    float_inputs(ctx, 0, 1, 2)
    spatial = _spatial(ctx)
    r = len(spatial)
    kernel = _kernel_shape(ctx, ctx.shape(1))
    strides, dilations = _ints(ctx, "strides", r, 1), _ints(ctx, "dilations", r, 1)
    pads = _pads(ctx, spatial, kernel, strides, dilations)
    inputs = [ctx.tensor(i) for i in range(3) if ctx.has(i)]
    return ctx.out(ctx.add("Conv", inputs, strides=strides, pads=pads, dilations=dilations,
                           group=int(ctx.attr("group", 1))))


@converter("ConvTranspose")
def _conv_transpose(ctx: NodeContext) -> Value:
    ctx.refuse_attrs((*_CONV, "output_padding", "output_shape"))
    float_inputs(ctx, 0, 1, 2)
    spatial = _spatial(ctx)
    r = len(spatial)
    kernel = _kernel_shape(ctx, ctx.shape(1))
    strides, dilations = _ints(ctx, "strides", r, 1), _ints(ctx, "dilations", r, 1)
    extra = _ints(ctx, "output_padding", r, 0)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto not in _AUTO_PAD:
        raise ctx.fail(f"attribute auto_pad={auto!r} is not one of {', '.join(_AUTO_PAD)}")
    target = ctx.attr("output_shape")
    if target is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s for n, s in zip(spatial, strides, strict=True)]
    if target is not None:
        # ONNX ConvTranspose: total_padding = s (in - 1) + output_padding + ((k - 1) d + 1) - output_shape,
        # split with the odd one at the beginning unless auto_pad is SAME_UPPER
        target = list(target)[-r:]
        begin, end = [], []
        for n, k, s, d, e, o in zip(spatial, kernel, strides, dilations, extra, target, strict=True):
            total = s * (n - 1) + e + (k - 1) * d + 1 - o
            small, large = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else large)
            end.append(large if auto == "SAME_UPPER" else small)
        pads = begin + end
    elif auto == "VALID":
        pads = [0] * (2 * r)
    else:
        pads = _ints(ctx, "pads", 2 * r, 0)
    inputs = [ctx.tensor(i) for i in range(3) if ctx.has(i)]
    return ctx.out(ctx.add("ConvTranspose", inputs, strides=strides, pads=pads, dilations=dilations,
                           group=int(ctx.attr("group", 1)), output_padding=extra))


def _pool_attrs(ctx: NodeContext, *extra: str) -> dict:
    ctx.refuse_attrs((*_POOL, *extra))
    float_inputs(ctx, 0)
    spatial = _spatial(ctx)
    r = len(spatial)
    kernel = ctx.attr("kernel_shape")
    if kernel is None or len(kernel) != r:
        raise ctx.fail(f"attribute kernel_shape={kernel} must give {r} sizes for X {list(ctx.shape(0))}")
    kernel = [int(k) for k in kernel]
    strides, dilations = _ints(ctx, "strides", r, 1), _ints(ctx, "dilations", r, 1)
    return dict(kernel_shape=kernel, strides=strides, dilations=dilations,
                pads=_pads(ctx, spatial, kernel, strides, dilations), ceil_mode=bool(ctx.attr("ceil_mode", 0)))


@converter("MaxPool")
def _max_pool(ctx: NodeContext) -> list[Value]:
    attrs = _pool_attrs(ctx, "storage_order")
    x = ctx.tensor(0)
    outs = [ctx.out(ctx.add("MaxPool", [x], **attrs))]
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        order = int(ctx.attr("storage_order", 0))
        if order not in (0, 1):
            raise ctx.fail(f"attribute storage_order={order} is not 0 (row-major) or 1 (column-major)")
        outs.append(ctx.out(ctx.add("MaxPoolIndices", [x], storage_order=order, **attrs)))
    return outs


@converter("AveragePool")
def _average_pool(ctx: NodeContext) -> Value:
    attrs = _pool_attrs(ctx, "count_include_pad")
    return ctx.out(ctx.add("AveragePool", [ctx.tensor(0)], count_include_pad=bool(ctx.attr("count_include_pad", 0)),
                           **attrs))


@converter("LpPool")
def _lp_pool(ctx: NodeContext) -> Value:
    attrs = _pool_attrs(ctx, "p")
    return ctx.out(ctx.add("LpPool", [ctx.tensor(0)], p=int(ctx.attr("p", 2)), **attrs))


def _global(ctx: NodeContext) -> tuple[int, list[int], list[int]]:
    """(X's node viewed as [N, C, S] when it has more than 3 spatial axes, its window, the output shape)."""
    ctx.refuse_attrs(("p",) if ctx.op_type == "GlobalLpPool" else ())
    float_inputs(ctx, 0)
    shape = ctx.shape(0)
    if len(shape) < 3:
        raise ctx.fail(f"X must be [N, C, ...] with spatial axes, got {list(shape)}")
    out = [*shape[:2], *(1,) * (len(shape) - 2)]
    x = ctx.tensor(0)
    if len(shape) > 5:
        x = reshape(ctx, x, [*shape[:2], math.prod(shape[2:])])
    return x, list(ctx.graph.node(x).type.shape[2:]), out


@converter("GlobalAveragePool")
def _global_average_pool(ctx: NodeContext) -> Value:
    x, _, out = _global(ctx)
    if len(ctx.shape(0)) > 4:
        x = reshape(ctx, x, [*out[:2], math.prod(ctx.shape(0)[2:])])
    return ctx.out(reshape(ctx, ctx.add("GlobalAvgPool", [x]), out))


@converter("GlobalMaxPool")
def _global_max_pool(ctx: NodeContext) -> Value:
    # a reduction over the spatial axes, whose invocations share a channel's elements (a window of all of
    # them, one invocation a channel, would loop over the whole map)
    x, window, out = _global(ctx)
    axes = tuple(range(2, 2 + len(window)))
    return ctx.out(reshape(ctx, ctx.add("ReduceMax", [x], axes=axes, keepdims=True), out))


@converter("GlobalLpPool")
def _global_lp_pool(ctx: NodeContext) -> Value:
    # (sum |x|^p)^(1/p) over the spatial axes (https://onnx.ai/onnx/operators/onnx__GlobalLpPool.html), as reductions
    x, window, out = _global(ctx)
    axes = tuple(range(2, 2 + len(window)))
    p = int(ctx.attr("p", 2))
    if p < 1:
        raise ctx.fail(f"p = {p}: the norm's order must be 1 or more")
    if p in (1, 2):
        y = ctx.add(f"ReduceL{p}", [x], axes=axes, keepdims=True)
    else:
        powered = ctx.add("Pow", [ctx.add("Abs", [x]), ctx.constant(float(p))])
        y = ctx.add("Pow", [ctx.add("ReduceSum", [powered], axes=axes, keepdims=True), ctx.constant(1.0 / p)])
    return ctx.out(reshape(ctx, y, out))


@converter("MaxUnpool")
def _max_unpool(ctx: NodeContext) -> Value:
    # the values of X at the flat positions I (as MaxPool's Indices give them) of a zero tensor:
    # ScatterElements on its flattened form (https://onnx.ai/onnx/operators/onnx__MaxUnpool.html)
    ctx.refuse_attrs(("kernel_shape", "pads", "strides"))
    float_inputs(ctx, 0)
    spatial = _spatial(ctx)
    r = len(spatial)
    kernel = ctx.attr("kernel_shape")
    if kernel is None or len(kernel) != r:
        raise ctx.fail(f"attribute kernel_shape={kernel} must give {r} sizes for X {list(ctx.shape(0))}")
    strides, pads = _ints(ctx, "strides", r, 1), _ints(ctx, "pads", 2 * r, 0)
    if tuple(ctx.shape(1)) != tuple(ctx.shape(0)):
        raise ctx.fail(f"I has shape {list(ctx.shape(1))}; it must have X's, {list(ctx.shape(0))}")
    # I indexes the inferred shape; a larger output_shape holds it at its start, zeros after (as onnx's reference)
    inferred = [*ctx.shape(0)[:2], *((n - 1) * s - pads[i] - pads[i + r] + k
                                      for i, (n, s, k) in enumerate(zip(spatial, strides, kernel, strict=True)))]
    out = [int(d) for d in np.asarray(ctx.const(2, "output_shape")).reshape(-1)] if ctx.has(2) else inferred
    if len(out) != len(inferred) or any(o < i for o, i in zip(out, inferred, strict=True)):
        raise ctx.fail(f"output_shape {out} must have X's rank and hold the unpooled shape {inferred}")
    n = math.prod(ctx.shape(0))
    zeros = ctx.constant(np.zeros(math.prod(inferred), np.float32))
    flat = ctx.add("ScatterElements", [zeros, ctx.add("Identity", [ctx.tensor(1)], shape=[n]),
                                       ctx.add("Identity", [ctx.tensor(0)], shape=[n])], axis=0, reduction="none")
    y = ctx.add("Identity", [flat], shape=inferred)
    if out != inferred:
        y = ctx.add("Pad", [y], pads=[0] * len(out) + [o - i for o, i in zip(out, inferred, strict=True)],
                    mode="constant", fill=fill_bits(0.0, DType.F32))
    return ctx.out(y)


@converter("Col2Im")
def _col2im(ctx: NodeContext) -> Value:
    # the blocks of [N, C * prod(block), L] summed into [N, C, *image]: a ConvTranspose of the
    # [N, C * prod(block), *blocks] view, one group per channel, whose kernel puts block entry j at
    # its position (https://onnx.ai/onnx/operators/onnx__Col2Im.html)
    ctx.refuse_attrs(("dilations", "pads", "strides"))
    float_inputs(ctx, 0)
    image = [int(d) for d in np.asarray(ctx.const(1, "image_shape")).reshape(-1)]
    block = [int(d) for d in np.asarray(ctx.const(2, "block_shape")).reshape(-1)]
    r, shape = len(image), ctx.shape(0)
    k = math.prod(block)
    if len(block) != r or len(shape) != 3 or shape[1] % k:
        raise ctx.fail(f"input {list(shape)}, image_shape {image} and block_shape {block} do not fit: the input must "
                       "be [N, C * prod(block_shape), L]")
    strides, dilations, pads = _ints(ctx, "strides", r, 1), _ints(ctx, "dilations", r, 1), _ints(ctx, "pads", 2 * r, 0)
    blocks, extra = [], []
    for i in range(r):
        span = image[i] + pads[i] + pads[i + r] - dilations[i] * (block[i] - 1) - 1
        blocks.append(span // strides[i] + 1)
        extra.append(span % strides[i])
    if math.prod(blocks) != shape[2]:
        raise ctx.fail(f"L = {shape[2]} blocks, but image_shape {image}, block_shape {block}, strides, pads and "
                       f"dilations make {math.prod(blocks)}")
    c = shape[1] // k
    w = np.zeros((c * k, 1, *block), np.float32)
    for j in range(k):
        w[j::k, 0][(slice(None), *np.unravel_index(j, block))] = 1.0
    x = ctx.add("Identity", [ctx.tensor(0)], shape=[shape[0], shape[1], *blocks])
    y = ctx.add("ConvTranspose", [x, ctx.constant(w)], strides=strides, pads=pads, dilations=dilations, group=c,
                output_padding=extra)
    return ctx.out(y)
