"""Data movement: Reshape, Flatten, Squeeze, Unsqueeze (views), Transpose, DepthToSpace,
SpaceToDepth, Concat, Split, Slice, Expand, Tile, Pad, Trilu, ReverseSequence; EyeLike,
ConstantOfShape and Range (known at load time). Shapes, axes, pads and repeats must be known
at load time (``ctx.const``); the element types are kept (f32, int32/int64 and bool alike)."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from eggfuse.ir import DType
from eggfuse.ir.ops.movement import PAD_MODES, fill_bits, slice_ranges

from ..importer import ELEM_DTYPE, NodeContext, Value, converter, elem_numpy


def ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def axis_of(ctx: NodeContext, axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` (negative from the end); raises ctx.fail when out of range."""
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for an input of rank {rank}")
    return axis % rank


def same(ctx: NodeContext, node: int) -> Value:
    """The Value of IR ``node``, of input 0's ONNX element type."""
    return ctx.out(node, elem=ctx.elem(0))


def view(ctx: NodeContext, shape) -> Value:
    """Input 0 reshaped to ``shape`` (a view, no dispatch; input 0 itself for its own shape)."""
    shape = tuple(int(d) for d in shape)
    if shape == ctx.shape(0):
        return ctx.value(0)
    return same(ctx, ctx.add("Identity", [ctx.tensor(0)], shape=shape))


def axes_arg(ctx: NodeContext, index: int, since: int) -> list[int] | None:
    """Axes given as attribute ``axes`` before opset ``since`` and as input ``index`` from it on."""
    if ctx.opset < since:
        a = ctx.attr("axes")
        return None if a is None else ints(a)
    return ints(ctx.const(index, "axes")) if ctx.has(index) else None


# --- views -----------------------------------------------------------------------------------


@converter("Reshape")
def _reshape(ctx: NodeContext) -> Value:
    x = ctx.shape(0)
    target = ints(ctx.const(1, "shape"))
    allowzero = ctx.attr("allowzero", 0)
    out = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(x):
                raise ctx.fail(f"shape {target}: a 0 at position {i} copies a dimension the input {list(x)} lacks")
            d = x[i]
        out.append(d)
    if 0 in out:
        raise ctx.fail(f"shape {target} (allowzero) makes an empty tensor, which eggfuse does not support")
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ctx.fail(f"shape {target} is not a valid Reshape shape (at most one -1, no other negatives)")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if math.prod(x) % known:
            raise ctx.fail(f"cannot reshape {list(x)} to {target}: {math.prod(x)} elements are not a multiple of "
                           f"{known}")
        out[out.index(-1)] = math.prod(x) // known
    if math.prod(out) != math.prod(x):
        raise ctx.fail(f"cannot reshape {list(x)} ({math.prod(x)} elements) to {out}")
    return view(ctx, out)


@converter("Flatten")
def _flatten(ctx: NodeContext) -> Value:
    x = ctx.shape(0)
    axis = ctx.attr("axis", 1)
    if not -len(x) <= axis <= len(x):
        raise ctx.fail(f"axis {axis} is out of range for an input of rank {len(x)}")
    axis += len(x) if axis < 0 else 0
    return view(ctx, [math.prod(x[:axis]), math.prod(x[axis:])])


@converter("Squeeze")
def _squeeze(ctx: NodeContext) -> Value:
    x = ctx.shape(0)
    axes = axes_arg(ctx, 1, 13)
    if axes is None:
        axes = [i for i, d in enumerate(x) if d == 1]
    axes = {axis_of(ctx, a, len(x)) for a in axes}
    for a in axes:
        if x[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of shape {list(x)}: its size is {x[a]}, not 1")
    return view(ctx, [d for i, d in enumerate(x) if i not in axes])


@converter("Unsqueeze")
def _unsqueeze(ctx: NodeContext) -> Value:
    x = list(ctx.shape(0))
    axes = axes_arg(ctx, 1, 13)
    if axes is None:
        raise ctx.fail("axes are required")
    rank = len(x) + len(axes)
    axes = sorted(axis_of(ctx, a, rank) for a in axes)
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {axes} repeat an axis")
    for a in axes:
        x.insert(a, 1)
    return view(ctx, x)


# --- strided copies --------------------------------------------------------------------------


@converter("Transpose")
def _transpose(ctx: NodeContext) -> Value:
    rank = len(ctx.shape(0))
    perm = ints(ctx.attr("perm", list(reversed(range(rank)))))
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of the {rank} axes of the input")
    if perm == list(range(rank)):
        return ctx.value(0)
    if perm == [1, 0] and ctx.elem(0) == TensorProto.FLOAT:  # the seed's 2-D Transpose (its rules apply)
        return same(ctx, ctx.add("Transpose", [ctx.tensor(0)]))
    return same(ctx, ctx.add("Permute", [ctx.tensor(0)], perm=perm))


def _space_depth(ctx: NodeContext, inner: list[int], perm: list[int], shape: list[int]) -> Value:
    # a reshape view, one Permute, a reshape view: ONNX's own definition of these ops
    x = ctx.add("Identity", [ctx.tensor(0)], shape=inner)
    return same(ctx, ctx.add("Identity", [ctx.add("Permute", [x], perm=perm)], shape=shape))


def _blocks(ctx: NodeContext) -> tuple[int, int, int, int, int, str]:
    shape = ctx.shape(0)
    if len(shape) != 4:
        raise ctx.fail(f"the input must be 4-D [N, C, H, W], got shape {list(shape)}")
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(f"attribute mode={mode!r} is not supported (DCR and CRD are)")
    b = ctx.attr("blocksize")
    if b is None or b < 1:
        raise ctx.fail(f"attribute blocksize must be >= 1, got {b}")
    return (*shape, b, mode)


@converter("DepthToSpace")
def _depth_to_space(ctx: NodeContext) -> Value:
    n, c, h, w, b, mode = _blocks(ctx)
    if c % (b * b):
        raise ctx.fail(f"{c} channels are not a multiple of blocksize^2 = {b * b}")
    out = [n, c // (b * b), h * b, w * b]
    if mode == "DCR":
        return _space_depth(ctx, [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2], out)
    return _space_depth(ctx, [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3], out)


@converter("SpaceToDepth")
def _space_to_depth(ctx: NodeContext) -> Value:
    n, c, h, w, b, mode = _blocks(ctx)
    if h % b or w % b:
        raise ctx.fail(f"H = {h} and W = {w} must be multiples of blocksize {b}")
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    return _space_depth(ctx, [n, c, h // b, b, w // b, b], perm, [n, c * b * b, h // b, w // b])


@converter("Concat")
def _concat(ctx: NodeContext) -> Value:
    given = [i for i in range(len(ctx.inputs)) if ctx.has(i)]
    if ctx.attr("axis") is None:
        raise ctx.fail("attribute axis is required")
    axis = axis_of(ctx, ctx.attr("axis"), len(ctx.shape(given[0])))
    # empty parts (of a Split, known at load time) add nothing
    given = [i for i in given if math.prod(ctx.shape(i))] or given[:1]
    if len(given) == 1:
        return ctx.value(given[0])
    elems = {ctx.elem(i) for i in given}
    if len(elems) > 1:
        raise ctx.fail(f"inputs of different element types {sorted(elems)} cannot be concatenated")
    return ctx.out(ctx.add("Concat", [ctx.tensor(i) for i in given], axis=axis), elem=ctx.elem(given[0]))


def slice_node(ctx: NodeContext, starts, ends, axes, steps) -> Value:
    """Slice of input 0 (input 0 itself when the slice keeps everything)."""
    shape = ctx.shape(0)
    starts, ends, axes, steps = ints(starts), ints(ends), ints(axes), ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if not all(-len(shape) <= a < len(shape) for a in axes):
        raise ctx.fail(f"axes {axes} out of range for an input of rank {len(shape)}")
    # starts and ends past either end of an axis act as its end +- 1 (ONNX clamps them): kept small
    dims = [shape[a] for a in axes]
    ctx.importer.note_clamped(ctx.where(), shape, ends, axes, steps)
    attrs = {"starts": [min(max(v, -d - 1), d) for v, d in zip(starts, dims, strict=True)],
             "ends": [min(max(v, -d - 1), d) for v, d in zip(ends, dims, strict=True)], "axes": axes, "steps": steps}
    try:
        ranges = slice_ranges(shape, attrs)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    if all(r == range(d) for r, d in zip(ranges, shape, strict=True)):
        return ctx.value(0)
    empty = next((k for k, r in enumerate(ranges) if not len(r)), None)
    if empty is not None:  # this Slice's own axis, not an earlier one's clamp (NodeContext.add's hint)
        k = next(k for k, a in enumerate(axes) if a % len(shape) == empty)
        d, v = shape[empty], starts[k]
        cut = f" (ONNX clamps start {v} to {d})" if steps[k] > 0 and d < v < 2**31 - 1 else ""
        raise ctx.fail(f"along axis {empty} of {list(shape)} start {v}, end {ends[k]} and step {steps[k]} select no "
                       f"elements{cut}; eggfuse cannot store an empty tensor (every dimension must be >= 1)")
    return same(ctx, ctx.add("Slice", [ctx.tensor(0)], **attrs))


@converter("Slice")
def _slice(ctx: NodeContext) -> Value:
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        if starts is None or ends is None:
            raise ctx.fail("attributes starts and ends are required")
        axes = ctx.attr("axes", range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = ints(ctx.const(1, "starts")), ints(ctx.const(2, "ends"))
        axes = ints(ctx.const(3, "axes")) if ctx.has(3) else list(range(len(starts)))
        steps = ints(ctx.const(4, "steps")) if ctx.has(4) else [1] * len(starts)
    return slice_node(ctx, starts, ends, axes, steps)


@converter("Split")
def _split(ctx: NodeContext) -> list[Value]:
    shape = ctx.shape(0)
    axis = axis_of(ctx, ctx.attr("axis", 0), len(shape))
    n = len(ctx.node.output)
    dim = shape[axis]
    if ctx.opset < 13 and ctx.attr("split") is not None:
        sizes = ints(ctx.attr("split"))
    elif ctx.opset >= 13 and ctx.has(1):
        sizes = ints(ctx.const(1, "split"))
    elif ctx.attr("num_outputs") is not None:  # opset 18: the last part may be smaller
        parts = ctx.attr("num_outputs")
        size = -(-dim // parts)
        sizes = [size] * (parts - 1) + [dim - size * (parts - 1)]
    else:
        if dim % n:
            raise ctx.fail(f"axis {axis} of size {dim} does not split into {n} equal parts")
        sizes = [dim // n] * n
    if len(sizes) != n or sum(sizes) != dim or min(sizes) < 0:
        raise ctx.fail(f"split sizes {sizes} do not divide axis {axis} of size {dim} into {n} outputs")
    outs, start = [], 0
    for size in sizes:
        if size == 0:  # an empty part (a RotaryEmbedding's unrotated rest of nothing): known, never computed
            empty = list(shape)
            empty[axis] = 0
            outs.append(ctx.known(np.zeros(empty, dtype=elem_numpy(ctx.elem(0))), ctx.elem(0)))
        else:
            outs.append(slice_node(ctx, [start], [start + size], [axis], [1]))
        start += size
    return outs


@converter("Expand")
def _expand(ctx: NodeContext) -> Value:
    shape = ints(ctx.const(1, "shape"))
    try:
        out = np.broadcast_shapes(ctx.shape(0), tuple(shape))
    except ValueError:
        raise ctx.fail(f"the input {list(ctx.shape(0))} does not broadcast with shape {shape}") from None
    if out == ctx.shape(0):
        return ctx.value(0)
    return same(ctx, ctx.add("Expand", [ctx.tensor(0)], shape=shape))


@converter("Tile")
def _tile(ctx: NodeContext) -> Value:
    repeats = ints(ctx.const(1, "repeats"))
    if all(r == 1 for r in repeats) and len(repeats) == len(ctx.shape(0)):
        return ctx.value(0)
    return same(ctx, ctx.add("Tile", [ctx.tensor(0)], repeats=repeats))


@converter("Pad")
def _pad(ctx: NodeContext) -> Value:
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr("mode", "constant")
    if mode not in PAD_MODES:
        raise ctx.fail(f"attribute mode={mode!r} is not supported ({', '.join(PAD_MODES)} are)")
    if ctx.opset < 11:
        pads, value = ints(ctx.attr("pads", [0] * 2 * rank)), ctx.attr("value", 0.0)
        axes = list(range(rank))
    else:
        pads = ints(ctx.const(1, "pads"))
        value = np.asarray(ctx.const(2, "constant_value")).reshape(-1)[0] if ctx.has(2) else 0
        axes = [axis_of(ctx, a, rank) for a in ints(ctx.const(3, "axes"))] if ctx.has(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} must hold 2 values per padded axis ({len(axes)} axes)")
    full = [0] * (2 * rank)
    for k, a in enumerate(axes):
        full[a], full[a + rank] = pads[k], pads[k + len(axes)]
    if any(p < 0 for p in full):  # negative pads crop: a Slice first, then the rest padded
        cropped = slice_node(ctx, [max(-full[a], 0) for a in range(rank)],
                             [shape[a] - max(-full[a + rank], 0) for a in range(rank)], range(rank), [1] * rank)
        full = [max(p, 0) for p in full]
        if not any(full):
            return cropped
        x = ctx.importer.materialise(cropped, ctx)
    elif not any(full):
        return ctx.value(0)
    else:
        x = ctx.tensor(0)
    dtype = ELEM_DTYPE.get(ctx.elem(0), DType.F32)
    return same(ctx, ctx.add("Pad", [x], pads=full, mode=mode, fill=fill_bits(value, dtype)))


@converter("Trilu")
def _trilu(ctx: NodeContext) -> Value:
    k = int(np.asarray(ctx.const(1, "k")).reshape(-1)[0]) if ctx.has(1) else 0
    return same(ctx, ctx.add("Trilu", [ctx.tensor(0)], upper=bool(ctx.attr("upper", 1)), k=k))


@converter("ReverseSequence")
def _reverse_sequence(ctx: NodeContext) -> Value:
    return same(ctx, ctx.add("ReverseSequence", [ctx.tensor(0), ctx.tensor(1)],
                             batch_axis=ctx.attr("batch_axis", 1), time_axis=ctx.attr("time_axis", 0)))


# --- known at load time ----------------------------------------------------------------------


@converter("EyeLike")
def _eye_like(ctx: NodeContext) -> Value:
    # only the input's shape matters, and shapes are static: the output is known
    shape = ctx.shape(0)
    if len(shape) != 2:
        raise ctx.fail(f"the input must be 2-D, got shape {list(shape)}")
    elem = ctx.attr("dtype", ctx.elem(0))
    return ctx.known(np.eye(shape[0], shape[1], k=ctx.attr("k", 0), dtype=elem_numpy(elem)), elem)


@converter("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext) -> Value:
    shape = ints(ctx.const(0, "shape"))
    value = ctx.attr("value")
    value = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    return ctx.known(np.full(shape, value[0], dtype=value.dtype),
                     helper.np_dtype_to_tensor_dtype(value.dtype))


@converter("Range")
def _range(ctx: NodeContext) -> Value:
    start, limit, delta = (np.asarray(ctx.const(i, name)) for i, name in enumerate(("start", "limit", "delta")))
    return ctx.known(np.arange(start, limit, delta).astype(start.dtype), ctx.elem(0))
