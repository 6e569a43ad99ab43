"""Data movement in N dimensions: Permute (N-d Transpose), Slice, Expand, Pad, Tile, Trilu and
ReverseSequence, with ONNX's semantics (https://onnx.ai/onnx/operators/).

Permute, Slice, Expand, Pad and Tile share one kernel, ``shaders/strided_copy.wgsl``: output
element ``i`` is split into coordinates ``c[d]`` over the output dimensions, and each
coordinate maps to an input coordinate ``j[d]`` (``c`` itself, or ``c - offset`` folded back
into the input's extent by the pad mode) that adds ``j[d] * coef[d]`` to a base offset. An op
is only the arithmetic that produces ``base``, ``dims`` and ``coef`` (:func:`strided_kernel`).
Elements are copied, never converted: every op takes f32, i32, u32 and bool tensors.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from ..errors import LoweringError
from ..kernel import Kernel, elementwise_groups
from ..spec import Attr, example, need, no_grad, op, rules
from ..types import DType, TensorType

FAMILY = "movement"

#: Dimensions the strided-copy kernel addresses (two vec4s per uniform array), after merging.
MAX_RANK = 8

#: The no-gradient marker of the ONNX movement ops: nothing in eggfuse differentiates them yet.
_NO_GRAD = no_grad("an ONNX import op without a gradient rule (eggfuse trains graphs built from its own ops)")

#: Pad modes and the WGSL that folds an input coordinate ``j`` (i32) into ``[0, e)``.
PAD_MODES = ("constant", "reflect", "edge", "wrap")
_FOLD = {
    "edge": "        j = clamp(j, 0, e - 1);",
    "wrap": "        j = ((j % e) + e) % e;",
    # numpy's 'reflect' (the edge is not repeated): a triangle wave of period 2 (e - 1)
    "reflect": ("        if (e == 1) {\n            j = 0;\n        } else {\n            let m = 2 * (e - 1);\n"
                "            j = ((j % m) + m) % m;\n            if (j >= e) {\n                j = m - j;\n"
                "            }\n        }"),
}


def row_strides(shape: tuple[int, ...]) -> list[int]:
    """Element strides of a row-major tensor of ``shape``."""
    st, acc = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        st[d] = acc
        acc *= shape[d]
    return st


def _merge(dims: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    # (size, extent, offset, coef) per output dim; a dim of one element that maps to the input's
    # only coordinate adds nothing, and two neighbours that map c to j one-to-one (extent = size,
    # offset 0) and are contiguous in the input act as one dimension.
    out: list[tuple[int, int, int, int]] = []
    for size, ext, off, coef in dims:
        if size == 1 and ext == 1 and off == 0:
            continue
        if out and off == 0 and size == ext:
            psize, pext, poff, pcoef = out[-1]
            if poff == 0 and psize == pext and pcoef == size * coef:
                out[-1] = (psize * size, psize * size, 0, coef)
                continue
        out.append((size, ext, off, coef))
    return out


def _vec8(values: list[int]) -> list[int]:
    return list(values) + [0] * (MAX_RANK - len(values))


def fill_bits(value: float | int | bool, dtype: DType) -> int:
    """The device bits (u32) of ``value`` stored as ``dtype``: Pad's ``fill``."""
    if dtype is DType.F32:
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if dtype is DType.BOOL:
        return int(bool(value))
    return int(value) & 0xFFFFFFFF


def fill_value(bits: int, dtype: np.dtype):
    """The value of Pad's ``fill`` bits in the reference's ``dtype`` (float64, int64 or bool)."""
    if dtype == np.float64:
        return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])
    if dtype == np.bool_:
        return bool(bits)
    return int(np.array([bits], dtype=np.uint32).view(np.int32)[0]) if dtype == np.int64 else bits


def strided_kernel(node, dims: list[tuple[int, int, int, int]], base: int = 0, mode: str = "plain",
                   fill: int = 0) -> Kernel:
    """strided_copy.wgsl for ``node``: ``dims`` holds, per output dimension, (size, input extent,
    offset, coef); output coordinate ``c`` reads input coordinate ``j = c - offset`` (folded into
    ``[0, extent)`` by ``mode``: plain (no folding: j is in range), constant (``fill``, the
    device bits of the pad value, outside it), edge, reflect or wrap) at ``base + j * coef``.
    Raises LoweringError when more than :data:`MAX_RANK` dimensions remain after merging."""
    merged = _merge(dims)
    if len(merged) > MAX_RANK:
        raise LoweringError(f"{node.describe()}: the strided copy addresses {MAX_RANK} dimensions; this one needs "
                            f"{len(merged)} after merging contiguous ones")
    n = node.type.num_elements
    params = [("n", "u32", n), ("rank", "u32", len(merged)), ("base", "i32", base),
              ("dims", "array<vec4<u32>, 2>", _vec8([m[0] for m in merged])),
              ("coef", "array<vec4<i32>, 2>", _vec8([m[3] for m in merged]))]
    fold = ""
    if mode != "plain":
        params += [("ext", "array<vec4<i32>, 2>", _vec8([m[1] for m in merged])),
                   ("off", "array<vec4<i32>, 2>", _vec8([m[2] for m in merged]))]
        head = "        j = j - p.off[d / 4u][d % 4u];\n        let e = p.ext[d / 4u][d % 4u];\n"
        if mode == "constant":
            params.append(("fill", "u32", fill))
            store = f"out[i] = bitcast<{node.type.dtype.wgsl}>(p.fill);"
            fold = head + f"        if (j < 0 || j >= e) {{\n            {store}\n            return;\n        }}"
        else:
            fold = head + _FOLD[mode]
    return Kernel(f"strided_{mode}_{node.type.dtype.wgsl}", "strided_copy.wgsl", elementwise_groups(n),
                  params=tuple(params), slots={"FOLD": fold})


def _same_dtype_out(x: TensorType, shape) -> TensorType:
    shape = tuple(int(d) for d in shape)
    need(all(d >= 1 for d in shape), f"the output shape {list(shape)} has a zero dimension (empty tensors are not "
                                     "supported)")
    return TensorType(shape, x.dtype)


# --- Permute ---------------------------------------------------------------------------------


def _permute(ts, a):
    x, perm = ts[0], tuple(a["perm"])
    need(sorted(perm) == list(range(x.rank)), f"perm {list(perm)} is not a permutation of the {x.rank} axes of {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _permute_kernel(node, ins, target) -> Kernel:
    x, perm = ins[0], node.attrs["perm"]
    st = row_strides(x.shape)
    return strided_kernel(node, [(x.shape[p], x.shape[p], 0, st[p]) for p in perm])


op("Permute", ("x",), _permute, lambda xs, a: np.transpose(xs[0], a["perm"]), attrs=(Attr("perm", "ints"),),
   vjp=_NO_GRAD, kernel=_permute_kernel, flops=lambda ins, out, a: 0, moves=True,
   doc="out = numpy.transpose(x, perm), any rank and dtype: ONNX Transpose "
       "(https://onnx.ai/onnx/operators/onnx__Transpose.html); the 2-D f32 transpose of the seed is Transpose")


# --- Slice -----------------------------------------------------------------------------------


def slice_ranges(shape: tuple[int, ...], a) -> list[range]:
    """The input positions each axis keeps: ONNX Slice's starts/ends (negative: from the end;
    clamped to the axis, [0, dim] for a positive step and [-1, dim - 1] for a negative one, as
    Python's ``slice.indices``), ``axes`` (default all, negative from the end) and ``steps``
    (default 1). Raises ShapeError for a bad axis or a zero step."""
    rank = len(shape)
    axes = list(a["axes"]) or list(range(len(a["starts"])))
    steps = list(a["steps"]) or [1] * len(axes)
    need(len(a["starts"]) == len(a["ends"]) == len(axes) == len(steps),
         f"starts {list(a['starts'])}, ends {list(a['ends'])}, axes {axes} and steps {steps} differ in length")
    out = [range(d) for d in shape]
    seen = set()
    for start, end, axis, step in zip(a["starts"], a["ends"], axes, steps, strict=True):
        need(-rank <= axis < rank, f"axis {axis} out of range for rank {rank}")
        axis %= rank
        need(axis not in seen, f"axis {axis} is sliced twice")
        need(step != 0, "a step is 0")
        seen.add(axis)
        out[axis] = range(*slice(start, end, step).indices(shape[axis]))
    return out


def _slice(ts, a):
    ranges = slice_ranges(ts[0].shape, a)
    return _same_dtype_out(ts[0], [len(r) for r in ranges])


def _slice_ref(xs, a):
    ranges = slice_ranges(xs[0].shape, a)
    return xs[0][tuple(slice(r.start, r.stop if r.stop >= 0 else None, r.step) for r in ranges)]


def _slice_kernel(node, ins, target) -> Kernel:
    st = row_strides(ins[0].shape)
    ranges = slice_ranges(ins[0].shape, node.attrs)
    base = sum(r.start * s for r, s in zip(ranges, st, strict=True))
    return strided_kernel(node, [(len(r), len(r), 0, r.step * s) for r, s in zip(ranges, st, strict=True)], base)


op("Slice", ("x",), _slice, _slice_ref,
   attrs=(Attr("starts", "ints"), Attr("ends", "ints"), Attr("axes", "ints", ()), Attr("steps", "ints", ())),
   vjp=_NO_GRAD, kernel=_slice_kernel, flops=lambda ins, out, a: 0, moves=True,
   doc="ONNX Slice (https://onnx.ai/onnx/operators/onnx__Slice.html): x[start:end:step] on each listed axis, "
       "negative starts/ends counted from the end and clamped to the axis, negative steps backwards")


# --- Expand ----------------------------------------------------------------------------------


def _expand(ts, a):
    x, shape = ts[0], tuple(a["shape"])
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        need(False, f"{x} does not broadcast with shape {list(shape)}")
    return _same_dtype_out(x, out)


def _expand_kernel(node, ins, target) -> Kernel:
    x, out = ins[0], node.type.shape
    lead = len(out) - x.rank
    shape = (1,) * lead + x.shape
    st = [0] * lead + row_strides(x.shape)
    return strided_kernel(node, [(o, o, 0, 0 if s == 1 else c) for o, s, c in zip(out, shape, st, strict=True)])


op("Expand", ("x",), _expand,
   lambda xs, a: np.broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, a["shape"])).copy(),
   attrs=(Attr("shape", "ints"),), vjp=_NO_GRAD, kernel=_expand_kernel, flops=lambda ins, out, a: 0, moves=True,
   doc="ONNX Expand (https://onnx.ai/onnx/operators/onnx__Expand.html): x broadcast with ``shape`` in both "
       "directions, numpy.broadcast_to(x, numpy.broadcast_shapes(x.shape, shape))")


# --- Pad, Tile -------------------------------------------------------------------------------


def _pad(ts, a):
    x, pads = ts[0], tuple(a["pads"])
    need(len(pads) == 2 * x.rank, f"pads {list(pads)} must hold {2 * x.rank} values (begins, then ends) for {x}")
    need(all(p >= 0 for p in pads), f"pads {list(pads)} must be >= 0 (crop with Slice)")
    need(a["mode"] in PAD_MODES, f"mode {a['mode']!r} is not one of {', '.join(PAD_MODES)}")
    return _same_dtype_out(x, [d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape)])


def _pad_ref(xs, a):
    x, pads, mode = xs[0], a["pads"], a["mode"]
    width = [(pads[i], pads[i + x.ndim]) for i in range(x.ndim)]
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=fill_value(a["fill"], x.dtype))
    return np.pad(x, width, mode=mode)


def _pad_kernel(node, ins, target) -> Kernel:
    x, pads, mode = ins[0], node.attrs["pads"], node.attrs["mode"]
    st = row_strides(x.shape)
    dims = [(o, e, pads[d], st[d]) for d, (o, e) in enumerate(zip(node.type.shape, x.shape, strict=True))]
    return strided_kernel(node, dims, mode=mode, fill=node.attrs["fill"])


op("Pad", ("x",), _pad, _pad_ref,
   attrs=(Attr("pads", "ints"), Attr("mode", "str", "constant"),
          Attr("fill", "int", 0, "the pad value's device bits (u32) in x's dtype: fill_bits(value, dtype)")),
   vjp=_NO_GRAD, kernel=_pad_kernel, flops=lambda ins, out, a: 0,
   doc="ONNX Pad (https://onnx.ai/onnx/operators/onnx__Pad.html) with pads >= 0, [begin_0.., end_0..]: "
       "numpy.pad with mode constant (the value whose device bits are ``fill``: infinities allowed), reflect, "
       "edge or wrap")


def _tile(ts, a):
    x, reps = ts[0], tuple(a["repeats"])
    need(len(reps) == x.rank and all(r >= 1 for r in reps), f"repeats {list(reps)} must be {x.rank} values >= 1")
    return _same_dtype_out(x, [d * r for d, r in zip(x.shape, reps, strict=True)])


def _tile_kernel(node, ins, target) -> Kernel:
    x = ins[0]
    st = row_strides(x.shape)
    dims = [(o, e, 0, s) for o, e, s in zip(node.type.shape, x.shape, st, strict=True)]
    return strided_kernel(node, dims, mode="wrap")


op("Tile", ("x",), _tile, lambda xs, a: np.tile(xs[0], a["repeats"]), attrs=(Attr("repeats", "ints"),),
   vjp=_NO_GRAD, kernel=_tile_kernel, flops=lambda ins, out, a: 0, moves=True,
   doc="ONNX Tile (https://onnx.ai/onnx/operators/onnx__Tile.html): numpy.tile(x, repeats), one repeat per axis")


def _leading_tile_example(rank: int):
    def build(g, dim):
        # x repeated along its first axis only (DeBERTa's position keys repeated over the batch), read by a product
        x = g.input("x", [dim(f"d{i}", 1, 3) for i in range(rank)])
        g.set_outputs([g.add_node("Tile", (x,), repeats=[dim("n", 1, 3), *[1] * (rank - 1)])])

    return build


@rules("algebraic")
def _leading_tile(e):
    (x,) = e.vars("x")
    reps, sx = e.vars("reps sx", e.Vec[e.i64])
    one = e.i64(1)
    for r in (2, 3, 4):
        # Tile(x, [N, 1, ..., 1]) -> Reshape(Expand(Reshape(x, [1, *sx]), [N, *sx]), [N sx0, sx1, ...]):
        # np.tile along the first axis stacks N copies of x, as the broadcast of x [1, ...] to N copies
        # does; the products read that broadcast without the copies (linalg.py's BatchMatMul of an Expand)
        lead = e.Identity(x, shape=e.Vec(one, *(sx[e.i64(i)] for i in range(r))))
        wide = e.Expand(lead, shape=e.Vec(reps[e.i64(0)], *(sx[e.i64(i)] for i in range(r))))
        flat = e.Vec(reps[e.i64(0)] * sx[e.i64(0)], *(sx[e.i64(i)] for i in range(1, r)))
        lhs = e.Tile(x, repeats=reps)
        yield e.rule(lhs, e.eq(e.shape(x)).to(sx), e.eq(sx.length()).to(e.i64(r)), e.eq(reps.length()).to(e.i64(r)),
                     *(e.eq(reps[e.i64(i)]).to(one) for i in range(1, r)),
                     name=f"Tile(x, [N, 1, ...]) -> Reshape(Expand(Reshape(x, [1, ...]), [N, ...])) (rank {r})",
                     example=example(_leading_tile_example(r))).then(
            e.union(lhs).with_(e.Identity(wide, shape=flat)),
            e.set_(e.shape(lead)).to(e.Vec(one, *(sx[e.i64(i)] for i in range(r)))),
            e.set_(e.shape(wide)).to(e.Vec(reps[e.i64(0)], *(sx[e.i64(i)] for i in range(r)))))


# --- Trilu, ReverseSequence ------------------------------------------------------------------


def _trilu(ts, a):
    need(ts[0].rank >= 2, f"input must have rank >= 2, got {ts[0]}")
    return ts[0]


def _trilu_ref(xs, a):
    x = xs[0]
    keep = (np.triu if a["upper"] else np.tril)(np.ones(x.shape[-2:], dtype=bool), a["k"])
    return np.where(keep, x, np.zeros((), dtype=x.dtype))


def _trilu_kernel(node, ins, target) -> Kernel:
    rows, cols = ins[0].shape[-2:]
    n = node.type.num_elements
    return Kernel(f"trilu_{node.type.dtype.wgsl}", "trilu.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("rows", "u32", rows), ("cols", "u32", cols), ("k", "i32", node.attrs["k"])),
                  slots={"T": node.type.dtype.wgsl, "KEEP": "c - r >= p.k" if node.attrs["upper"] else "c - r <= p.k"})


op("Trilu", ("x",), _trilu, _trilu_ref, attrs=(Attr("upper", "bool", True), Attr("k", "int", 0)),
   vjp=_NO_GRAD, kernel=_trilu_kernel, flops=lambda ins, out, a: 0,
   doc="ONNX Trilu (https://onnx.ai/onnx/operators/onnx__Trilu.html): numpy.triu(x, k) (upper) or "
       "numpy.tril(x, k) on the last two axes, the rest zero (false for bool)")


def _reverse_sequence(ts, a):
    x, lens = ts
    b, t = a["batch_axis"], a["time_axis"]
    need(x.rank >= 2 and {b, t} == {0, 1}, f"batch_axis {b} and time_axis {t} must be 0 and 1 of a rank >= 2 input, "
                                          f"got {x}")
    need(lens.dtype is DType.I32 and lens.shape == (x.shape[b],),
         f"sequence_lens must be i32 [{x.shape[b]}], got {lens}")
    return x


def _reverse_sequence_ref(xs, a):
    x, lens = xs
    b, t = a["batch_axis"], a["time_axis"]
    out = np.moveaxis(x, (b, t), (0, 1)).copy()
    steps = x.shape[t]
    for i, n in enumerate(np.clip(lens, 0, steps)):
        out[i, :n] = out[i, :n][::-1]
    return np.moveaxis(out, (0, 1), (b, t))


def _reverse_sequence_kernel(node, ins, target) -> Kernel:
    x = ins[0]
    n = node.type.num_elements
    return Kernel(f"reverse_sequence_{x.dtype.wgsl}", "reverse_sequence.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("batch", "u32", x.shape[node.attrs["batch_axis"]]),
                          ("steps", "u32", x.shape[node.attrs["time_axis"]]), ("inner", "u32", math.prod(x.shape[2:])),
                          ("time_first", "u32", int(node.attrs["time_axis"] == 0))))


op("ReverseSequence", ("x", "sequence_lens"), _reverse_sequence, _reverse_sequence_ref,
   attrs=(Attr("batch_axis", "int", 1), Attr("time_axis", "int", 0)), vjp=_NO_GRAD,
   kernel=_reverse_sequence_kernel, flops=lambda ins, out, a: 0,
   doc="ONNX ReverseSequence (https://onnx.ai/onnx/operators/onnx__ReverseSequence.html): the first "
       "sequence_lens[b] steps of batch b reversed, the rest copied; a length outside [0, steps] is clamped to it "
       "(ONNX leaves it undefined)")


# --- rules: Permute chains, no-op Permutes ------------------------------------------------------
# Exporters split and merge attention heads with Reshape/Transpose pairs; these rules cancel and
# reorder such chains so the recognition rules of ``attention_exported.py`` see one form. The
# Vec index arithmetic is egglog's (vec-get).

#: Ranks the Permute rules are written for (one rule per rank: egglog has no loops over a Vec).
_PERMUTE_RANKS = (2, 3, 4, 5, 6)


def _two_permutes(rank: int, first, second):
    """Example: Permute(Permute(x, first), second) of a rank-``rank`` input."""
    def build(g, dim):
        x = g.input("x", [dim(f"d{i}", 1, 4) for i in range(rank)])
        g.set_outputs([g.add_node("Permute", (g.add_node("Permute", (x,), perm=first),), perm=second)])

    return build


@rules("algebraic")
def _permute_chains(e):
    (x,) = e.vars("x")
    p, q = e.vars("p q", e.Vec[e.i64])
    for r in _PERMUTE_RANKS:
        # Permute(Permute(x, p), q) -> Permute(x, [p[q[0]], ..., p[q[r-1]]])   (rank r)
        composed = e.Vec(*(p[q[e.i64(i)]] for i in range(r)))
        rotate, reverse, swap = [(i + 1) % r for i in range(r)], list(range(r))[::-1], [1, 0, *range(2, r)]
        yield e.equal(f"Permute(Permute(x, p), q) -> Permute(x, p∘q) (rank {r})",
                      e.Permute(e.Permute(x, perm=p), perm=q), e.Permute(x, perm=composed),
                      e.eq(q.length()).to(e.i64(r)), example=example(_two_permutes(r, rotate, reverse)))
        # Permute(x, [0, 1, ..., r-1]) -> x
        iota = e.Vec(*(e.i64(i) for i in range(r)))
        yield e.equal(f"Permute(x, identity) -> x (rank {r})", e.Permute(x, perm=iota), x,
                      example=example(_two_permutes(r, swap, swap)))


def _split_merge_example(g, dim):
    # [a, b, s, d] -> [a*b, s, d] -> Permute [0,2,1] -> [a, b, d, s] (the dynamo exporter's k^T)
    a, b, s, d = dim("a", 1, 3), dim("b", 1, 3), dim("s"), dim("d")
    x = g.reshape(g.input("x", [a, b, s, d]), [a * b, s, d])
    g.set_outputs([g.reshape(g.add_node("Permute", (x,), perm=[0, 2, 1]), [a, b, d, s])])


@rules("algebraic")
def _permute_through_reshapes(e):
    (y,) = e.vars("y")
    s1, s2 = e.vars("s1 s2", e.Vec[e.i64])
    swap = e.Vec(e.i64(0), e.i64(2), e.i64(1))
    inner = e.Identity(y, shape=e.Vec(s2[0], s2[1], s1[1], s1[2]))
    lhs = e.Identity(e.Permute(e.Identity(y, shape=s1), perm=swap), shape=s2)
    rhs = e.Permute(inner, perm=e.Vec(e.i64(0), e.i64(1), e.i64(3), e.i64(2)))
    # Reshape(Permute(Reshape(y, [N,S,D]), [0,2,1]), [A,B,D,S]) -> Permute(Reshape(y, [A,B,S,D]), [0,1,3,2])
    # if A B = N (the leading axis split back as it was merged); the new reshape gets its shape fact
    yield e.rule(lhs, e.eq(s1.length()).to(e.i64(3)), e.eq(s2.length()).to(e.i64(4)),
                 e.eq(s2[0] * s2[1]).to(s1[0]), e.eq(s2[2]).to(s1[2]), e.eq(s2[3]).to(s1[1]),
                 name="Reshape(Permute(Reshape(y, [N,S,D]), [0,2,1]), [A,B,D,S]) -> "
                      "Permute(Reshape(y, [A,B,S,D]), [0,1,3,2])",
                 example=example(_split_merge_example)).then(
        e.union(lhs).with_(rhs), e.set_(e.shape(inner)).to(e.Vec(s2[0], s2[1], s1[1], s1[2])))


def _negative_axis_slice(g, dim):
    x = g.input("x", [dim("a"), dim("b"), dim("c", 2, 6)])
    g.set_outputs([g.add_node("Slice", (x,), starts=[1], ends=[dim("c", 2, 6)], axes=[-1], steps=[1])])


@rules("algebraic")
def _slice_axis_from_the_front(e):
    (x,) = e.vars("x")
    st, en, ax, sp, sx = e.vars("st en ax sp sx", e.Vec[e.i64])
    # Slice(x, axes=[a]) -> Slice(x, axes=[a + rank(x)])   for a < 0 (one form of each slice for the rules that read it)
    lhs = e.Slice(x, starts=st, ends=en, axes=ax, steps=sp)
    yield e.equal("Slice(x, axes=[a < 0]) -> Slice(x, axes=[a + rank])", lhs,
                  e.Slice(x, starts=st, ends=en, axes=e.Vec(ax[e.i64(0)] + sx.length()), steps=sp),
                  e.eq(ax.length()).to(e.i64(1)), ax[e.i64(0)] < e.i64(0), e.eq(e.shape(x)).to(sx),
                  example=example(_negative_axis_slice))
