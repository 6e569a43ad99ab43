"""Data movement: the reshape view (any rank, 0 included), the Select view of one part along the
first axis, the 2-D Transpose of the seed,
Concat (packed weights among its uses), SliceCols and its adjoint PadCols. Elements are
copied, never converted, so Concat and SliceCols take u32, i32 and bool tensors as well as
f32. The N-d movement ops of ONNX are in ``movement.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import NO_GRAD, VIEW_ALIGN, Attr, example, need, need_axes, need_f32, op, rules
from ..types import TensorType

FAMILY = "shape"


def _elem(t: TensorType) -> str:
    return t.dtype.wgsl  # bool is stored as u32


# --- Identity: a reshape view --------------------------------------------------------------


def _identity(ts, a):
    shape = tuple(a["shape"])
    need(all(d >= 1 for d in shape), f"target shape {list(shape)} has a dimension < 1")
    need(math.prod(shape) == ts[0].num_elements,
         f"cannot reshape {ts[0]} to {list(shape)}: element counts differ")
    return TensorType(shape, ts[0].dtype)


op("Identity", ("x",), _identity, lambda xs, a: xs[0].reshape(a["shape"]), attrs=(Attr("shape", "ints"),),
   dispatches=0, view=True, doc="reshape view (row-major, numpy.reshape): the same bytes, no data movement",
   vjp=lambda b, node, dy, want: [b.reshape(dy, b.type(node.inputs[0]).shape)], flops=lambda ins, out, a: 0)


# --- Select: a view of one part along the first axis ---------------------------------------------


def _select(ts, a):
    x, index = ts[0], a["index"]
    need(x.rank >= 2, f"input must have at least 2 dimensions (parts along the first), got {x}")
    need(0 <= index < x.shape[0], f"index {index} is outside the input's {x.shape[0]} parts ({x})")
    part = TensorType(x.shape[1:], x.dtype)
    need(part.size_bytes % VIEW_ALIGN == 0,
         f"a part of {x} is {part.size_bytes} bytes, not a multiple of {VIEW_ALIGN} (the offset alignment every "
         "WebGPU device binds): Select views only parts that align; take other parts with Slice")
    return part


def _select_vjp(b, node, dy, want):
    # dx: dy in part index, zeros in the others (Pad of dy as one part along the first axis)
    x = b.type(node.inputs[0])
    index, rest = node.attrs["index"], (0,) * (x.rank - 1)
    part = b.reshape(b.real(dy), (1, *x.shape[1:]))
    return [b.emit("Pad", (part,), pads=(index, *rest, x.shape[0] - 1 - index, *rest), mode="constant", fill=0)]


op("Select", ("x",), _select, lambda xs, a: xs[0][a["index"]], attrs=(Attr("index", "int"),),
   dispatches=0, view=True, vjp=_select_vjp, flops=lambda ins, out, a: 0,
   view_offset=lambda ins, a: a["index"] * TensorType(ins[0].shape[1:], ins[0].dtype).size_bytes,
   doc="out = x[index] (torch.select(x, 0, index)): a view of part index of x along its first axis, the same "
       "bytes from offset index * part bytes (each part a multiple of 256 bytes), no data movement; the two "
       "values of FusedMatMulLayerNormPair are its parts 0 and 1")


@rules("algebraic")
def _reshape_chains(e):
    (x,) = e.vars("x")
    s, s2 = e.vars("s s2", e.Vec[e.i64])
    # Reshape(Reshape(x, s2), s) -> Reshape(x, s)
    yield e.equal("Reshape(Reshape(x, s2), s) -> Reshape(x, s)", e.Identity(e.Identity(x, shape=s2), shape=s),
                  e.Identity(x, shape=s),
                  example=example(lambda g, dim: g.set_outputs([g.reshape(g.reshape(
                      g.input("x", [dim("m"), dim("n")]), [dim("m") * dim("n")]), [dim("n"), dim("m")])])))
    # Reshape(x, s) -> x   if shape(x) = s
    yield e.equal("Reshape(x, shape(x)) -> x", e.Identity(x, shape=s), x, e.eq(e.shape(x)).to(s),
                  example=example(lambda g, dim: g.set_outputs([g.reshape(x := g.input("x", [dim("m"), dim("n")]),
                                                                          g.node(x).type.shape)])))


# --- Transpose ---------------------------------------------------------------------------------


def _transpose(ts, a):
    need_f32(ts[0], "input")
    need(ts[0].rank == 2, f"input must be 2-D, got {ts[0]}")
    return TensorType(ts[0].shape[::-1], ts[0].dtype)


def _transpose_kernel(node, ins, target) -> Kernel:
    rows, cols = ins[0].shape
    n = rows * cols
    return Kernel("transpose", "transpose.wgsl", elementwise_groups(n),
                  params=(("rows", "u32", rows), ("cols", "u32", cols), ("n", "u32", n)))


op("Transpose", ("x",), _transpose, lambda xs, a: xs[0].T, doc="out[j, i] = x[i, j] of a 2-D x",
   vjp=lambda b, node, dy, want: [b.emit("Transpose", (dy,))], kernel=_transpose_kernel, moves=True)


@rules("algebraic")
def _transpose_involution(e):
    (x,) = e.vars("x")
    # Transpose(Transpose(x)) -> x
    yield e.equal("Transpose(Transpose(x)) -> x", e.Transpose(e.Transpose(x)), x,
                  example=example(lambda g, dim: g.set_outputs([g.transpose(g.transpose(
                      g.input("x", [dim("m"), dim("n")])))])))


# --- Concat ------------------------------------------------------------------------------------

#: Inputs one Concat dispatch binds at most (concat.wgsl holds 16 offsets and the end); a Concat
#: of more inputs, or of more than the device's maxStorageBuffersPerShaderStage allows, is split
#: into several dispatches, each writing its inputs' part of the output.
CONCAT_INPUTS_PER_DISPATCH = 16


def _concat(ts, a):
    axis = a["axis"]
    first = ts[0]
    need_axes([axis], first)
    for t in ts[1:]:
        need(t.dtype == first.dtype and t.rank == first.rank
             and all(d == e for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis),
             f"cannot concatenate {t} with {first} along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return TensorType(tuple(shape), first.dtype)


def _concat_kernel(node, ins, target) -> list[Kernel]:
    # Concat of computed tensors (a Concat of parameters is a derived parameter: no dispatch).
    axis, shape = node.attrs["axis"], node.type.shape
    # at least one input a dispatch: a limit below one input and the output fails check_limits, named
    per = max(1, min(CONCAT_INPUTS_PER_DISPATCH, target.limits["max-storage-buffers-per-shader-stage"] - 1))
    inner = math.prod(shape[axis + 1:])
    outer = math.prod(shape[:axis])
    starts = [0]
    for t in ins:
        starts.append(starts[-1] + t.shape[axis])
    dtype = node.type.dtype.wgsl
    kernels = []
    for first in range(0, len(ins), per):
        part = list(range(first, min(first + per, len(ins))))
        off = [starts[i] for i in part] + [starts[part[-1] + 1]]
        chunk_width = off[-1] - off[0]
        n = outer * chunk_width * inner
        last = len(part) - 1
        select = [f"    if (c < off({t + 1}u)) {{ return x{t}[at({t}u, o, c, r)]; }}" for t in range(last)]
        select.append(f"    return x{last}[at({last}u, o, c, r)];")
        params = (("off", "array<vec4<u32>, 5>", off + [0] * (20 - len(off))), ("n", "u32", n),
                  ("width", "u32", shape[axis]), ("chunk_start", "u32", off[0]), ("chunk_width", "u32", chunk_width),
                  ("inner", "u32", inner))
        bindings = (*(Buffer(f"x{t}", _elem(ins[i])) for t, i in enumerate(part)), Buffer("out", dtype, write=True))
        kernels.append(Kernel(f"concat{len(part)}_{dtype}", "concat.wgsl", elementwise_groups(n), params=params,
                              slots={"T": dtype, "SELECT": "\n".join(select)}, bindings=bindings,
                              inputs=tuple(part)))
    return kernels


def _concat_vjp(b, node, dy, want):
    # Along any axis, a row-major concatenation is a column concatenation of the
    # [outer, axis * inner] views, so each part is a SliceCols between two reshapes.
    axis, shape = node.attrs["axis"], b.type(node.id).shape
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    grads, start = [], 0
    for i, w in zip(node.inputs, want, strict=True):
        part = b.type(i).shape
        if w and part == shape:
            grads.append(dy)
        elif w:
            flat = b.reshape(dy, (outer, shape[axis] * inner))
            piece = b.emit("SliceCols", (flat,), start=start * inner, size=part[axis] * inner)
            grads.append(b.reshape(piece, part))
        else:
            grads.append(None)
        start += part[axis]
    return grads


op("Concat", ("x", "*xs"), _concat, lambda xs, a: np.concatenate(xs, axis=a["axis"]),
   attrs=(Attr("axis", "int"),), packs_parameters=True, vjp=_concat_vjp, kernel=_concat_kernel,
   flops=lambda ins, out, a: 0, moves=True,
   doc="concatenation along ``axis`` (numpy.concatenate) of any number of tensors of one dtype; of "
       "parameters only, a derived parameter that a session packs once when it is created (no dispatch)")


# --- SliceCols, PadCols ------------------------------------------------------------------------


def _slice_cols(ts, a):
    x = ts[0]
    start, size = a["start"], a["size"]
    need(x.rank == 2, f"input must be 2-D, got {x}")
    need(start >= 0 and size >= 1 and start + size <= x.shape[1],
         f"columns [{start}, {start + size}) out of range for {x}")
    return TensorType((x.shape[0], size), x.dtype)


def _slice_cols_kernel(node, ins, target) -> Kernel:
    rows, size = node.type.shape
    n = rows * size
    dtype = node.type.dtype.wgsl
    return Kernel(f"slice_cols_{dtype}", "slice_cols.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("size", "u32", size), ("cols", "u32", ins[0].shape[1]),
                          ("start", "u32", node.attrs["start"])),
                  bindings=(Buffer("x", dtype), Buffer("out", dtype, write=True)))


def _slice_cols_vjp(b, node, dy, want):
    from ..autodiff import Cols

    return [Cols(node.attrs["start"], dy)]


op("SliceCols", ("x",), _slice_cols, lambda xs, a: xs[0][:, a["start"]:a["start"] + a["size"]],
   attrs=(Attr("start", "int"), Attr("size", "int")), vjp=_slice_cols_vjp, kernel=_slice_cols_kernel,
   flops=lambda ins, out, a: 0, moves=True, doc="out[i, j] = x[i, start + j] for j < size")


def _pad_cols(ts, a):
    x, start, width = ts[0], a["start"], a["width"]
    need_f32(x, "input")
    need(x.rank == 2, f"input must be 2-D, got {x}")
    need(start >= 0 and start + x.shape[1] <= width,
         f"columns [{start}, {start + x.shape[1]}) do not fit a width of {width}")
    return TensorType((x.shape[0], width))


def _pad_cols_ref(xs, a):
    x, start = xs[0], a["start"]
    out = np.zeros((x.shape[0], a["width"]))
    out[:, start:start + x.shape[1]] = x
    return out


def _pad_cols_kernel(node, ins, target) -> Kernel:
    rows, width = node.type.shape
    n = rows * width
    return Kernel("pad_cols", "pad_cols.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("width", "u32", width), ("cols", "u32", ins[0].shape[1]),
                          ("start", "u32", node.attrs["start"])))


op("PadCols", ("x",), _pad_cols, _pad_cols_ref, attrs=(Attr("start", "int"), Attr("width", "int")),
   vjp=NO_GRAD, kernel=_pad_cols_kernel, flops=lambda ins, out, a: 0,
   doc="out[i, start + j] = x[i, j], zero elsewhere, [M,n] -> [M,width]: the adjoint of SliceCols")
