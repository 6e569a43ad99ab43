"""Indexing with run-time indices, ONNX's semantics (https://onnx.ai/onnx/operators/): Gather,
GatherElements, GatherND, ScatterElements, ScatterND and OneHot.

Indices are i32 tensors (ONNX int64 narrowed). A negative index counts from the end of its
axis (``k + dim``), as ONNX specifies; an index still outside ``[0, dim)`` is an error in ONNX
(onnxruntime raises). A graph input that Gather reads as indices is checked before a run
(``index_bounds``: InputError outside ``[-dim, dim)``); an index computed on the device is
clamped to the axis, in the reference and the kernels alike, so a kernel never reads or writes
outside a buffer. Data tensors may be of any dtype (elements are copied, never converted). The
scatters are written as gathers (WGSL has no float atomics): each output element scans the
updates that may land on it, in the order ONNX's reference applies them, so duplicate indices
and the reductions are deterministic.
"""

from __future__ import annotations

import math

import numpy as np

from ..facts import value_fact
from ..kernel import Buffer, Kernel, elementwise_groups, nested_iterations, windowed_reader
from ..spec import Attr, example, need, no_grad, op, rules
from ..types import DType, TensorType
from .movement import MAX_RANK, row_strides

FAMILY = "indexing"

_NO_GRAD = no_grad("an ONNX import op without a gradient rule (eggfuse trains graphs built from its own ops)")

#: Scatter reductions and the WGSL combining the current value ``acc`` with an update ``v``. max and
#: min compare (as the reference's Python max/min): an update that is NaN is skipped, a NaN already
#: there stays (numpy.maximum, which ONNX's reference uses, would propagate both).
REDUCTIONS = {"none": "v", "add": "acc + v", "mul": "acc * v", "max": "select(acc, v, v > acc)",
              "min": "select(acc, v, v < acc)"}


def normalise(k: np.ndarray, dim: int) -> np.ndarray:
    """ONNX index normalisation: ``k + dim`` for a negative ``k``, then clamped to ``[0, dim)``."""
    k = np.asarray(k, dtype=np.int64)
    return np.clip(np.where(k < 0, k + dim, k), 0, dim - 1)


def normalise_wgsl(k: str, dim: str) -> str:
    """:func:`normalise` in WGSL: the u32 row of i32 index ``k`` into ``dim`` (u32) rows."""
    return f"u32(clamp({k} + select(0, i32({dim}), {k} < 0), 0, i32({dim}) - 1))"


def _indices(t: TensorType, what: str = "indices") -> None:
    need(t.dtype is DType.I32, f"{what} must be i32, got {t}")


def _axis(a, rank: int) -> int:
    axis = a["axis"]
    need(-rank <= axis < rank, f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _vec8(values) -> list[int]:
    values = [int(v) for v in values]
    return values + [0] * (MAX_RANK - len(values))


def _max_rank(rank: int, what: str) -> None:
    need(rank <= MAX_RANK, f"{what} has rank {rank}; the kernel addresses {MAX_RANK} dimensions")


def _wrap_i32(x: np.ndarray) -> np.ndarray:
    # the device's i32 arithmetic wraps; the reference's int64 does not
    return ((x + 2**31) % 2**32) - 2**31


# --- Gather ----------------------------------------------------------------------------------


def _gather(ts, a):
    data, idx = ts
    _indices(idx)
    axis = _axis(a, data.rank)
    return TensorType(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.dtype)


def _gather_ref(xs, a):
    data, idx = xs
    axis = a["axis"] % data.ndim
    return np.take(data, normalise(idx, data.shape[axis]), axis=axis)


def _gather_kernel(node, ins, target) -> Kernel:
    # data larger than the device binds at once (a token table past maxStorageBufferBindingSize) is read through
    # windows of it, each a binding: read_data(e) picks element e's (gather.wgsl's READ, ir/kernel.py
    # windowed_reader)
    data, idx = ins
    axis = node.attrs["axis"] % data.rank
    n = node.type.num_elements
    params = (("n", "u32", n), ("inner", "u32", math.prod(data.shape[axis + 1:])),
              ("count", "u32", idx.num_elements), ("dim", "i32", data.shape[axis]))
    t = data.dtype.wgsl
    read, tables, inputs = windowed_reader("data", t, 0, data.size_bytes, target.limits)
    if len(tables) == 1:
        return Kernel(f"gather_{t}", "gather.wgsl", elementwise_groups(n), params=params, slots={"READ": read})
    return Kernel(f"gather_{t}_windows{len(tables)}", "gather.wgsl", elementwise_groups(n), params=params,
                  slots={"READ": read}, inputs=(*inputs, 1),
                  bindings=(*tables, Buffer("indices", idx.dtype.wgsl), Buffer("out", t, write=True)))


op("Gather", ("data", "indices"), _gather, _gather_ref, attrs=(Attr("axis", "int", 0),), vjp=_NO_GRAD,
   kernel=_gather_kernel, flops=lambda ins, out, a: 0,
   index_bounds=lambda ins, a: {1: ins[0].shape[a["axis"] % ins[0].rank]},
   doc="ONNX Gather (https://onnx.ai/onnx/operators/onnx__Gather.html): numpy.take(data, indices, axis), "
       "negative indices from the end; fed indices outside [-dim, dim) refused (InputError), computed ones "
       "clamped")


# --- GatherElements, ScatterElements ---------------------------------------------------------


def _gather_elements(ts, a):
    data, idx = ts
    _indices(idx)
    _max_rank(data.rank, f"data {data}")
    axis = _axis(a, data.rank)
    need(idx.rank == data.rank and all(i <= d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True))
                                       if k != axis),
         f"indices {idx} must have data's rank and no larger dims than data {data} off axis {axis}")
    return TensorType(idx.shape, data.dtype)


def _gather_elements_ref(xs, a):
    data, idx = xs
    axis = a["axis"] % data.ndim
    part = data[tuple(slice(0, d) if k != axis else slice(None) for k, d in enumerate(idx.shape))]
    return np.take_along_axis(part, normalise(idx, data.shape[axis]), axis=axis)


#: gather_elements.wgsl's INDEX over the uniforms: a loop over the axes, the sizes and strides read per element.
_GATHER_ELEMENTS_LOOP = """\
    var t = i;
    var at = 0u;
    var ix = 0u;
    for (var s = 0u; s < p.rank; s = s + 1u) {
        let d = p.rank - 1u - s;
        let size = p.dims[d / 4u][d % 4u];
        let c = t % size;
        if (d != p.axis) {
            at = at + c * p.dstr[d / 4u][d % 4u];
        }
        ix = ix + c * p.istr[d / 4u][d % 4u];
        t = t / size;
    }"""
#: Whether gather_elements.wgsl's INDEX is unrolled over the axes with their sizes and strides as constants
#: (:func:`_gather_elements_index`: divisions by constants) instead of the loop over the uniforms.
GATHER_ELEMENTS_UNROLLED = True


def _gather_elements_index(dims, dstr, istr, axis: int) -> str:
    # gather_elements.wgsl's INDEX unrolled: the output's coordinates from the last axis, each by a constant
    lines, at, ix = ["    var t = i;"], [], []
    for d in reversed(range(len(dims))):
        if dims[d] == 1:
            continue
        lines.append(f"    let c{d} = t % {dims[d]}u;")
        lines.append(f"    t = t / {dims[d]}u;")
        if d != axis and dstr[d]:
            at.append(f"c{d} * {dstr[d]}u")
        if istr[d]:
            ix.append(f"c{d} * {istr[d]}u")
    lines.append(f"    let at = {' + '.join(at) or '0u'};")
    lines.append(f"    let ix = {' + '.join(ix) or '0u'};")
    return "\n".join(lines)


def broadcast_index_strides(idx_shape: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Element strides of indices of ``idx_shape`` read at the coordinates of ``shape`` (same rank, each axis 1
    or shape's): their row-major strides, 0 along the axes they are broadcast over."""
    return [0 if i == 1 and o != 1 else s for i, o, s in zip(idx_shape, shape, row_strides(idx_shape), strict=True)]


def _gather_elements_kernel(node, ins, target) -> Kernel:
    # gather_elements.wgsl over the output's dims; the indices' element strides are 0 along the axes they are
    # broadcast over (GatherElementsBroadcast), their row strides otherwise. GatherElementsBroadcast's perm: the
    # output's axes are the gathered value's in that order, so the kernel walks them with the strides permuted
    data, idx = ins
    axis = node.attrs["axis"] % data.rank
    shape = tuple(node.attrs.get("shape") or node.type.shape)  # the gathered value's (before perm)
    perm = tuple(node.attrs.get("perm") or range(data.rank))
    n = node.type.num_elements
    istr = broadcast_index_strides(idx.shape, shape)
    dstr = row_strides(data.shape)
    index = (_gather_elements_index(node.type.shape, [dstr[j] for j in perm], [istr[j] for j in perm],
                                    perm.index(axis)) if GATHER_ELEMENTS_UNROLLED else _GATHER_ELEMENTS_LOOP)
    return Kernel(f"gather_elements_{data.dtype.wgsl}", "gather_elements.wgsl", elementwise_groups(n),
                  slots={"INDEX": index},
                  params=(("n", "u32", n), ("rank", "u32", data.rank), ("axis", "u32", perm.index(axis)),
                          ("dim", "i32", data.shape[axis]), ("dims", "array<vec4<u32>, 2>", _vec8(node.type.shape)),
                          ("dstr", "array<vec4<u32>, 2>", _vec8([dstr[j] for j in perm])),
                          ("istr", "array<vec4<u32>, 2>", _vec8([istr[j] for j in perm]))))


op("GatherElements", ("data", "indices"), _gather_elements, _gather_elements_ref, attrs=(Attr("axis", "int", 0),),
   vjp=_NO_GRAD, kernel=_gather_elements_kernel, flops=lambda ins, out, a: 0,
   index_bounds=lambda ins, a: {1: ins[0].shape[a["axis"] % ins[0].rank]},
   doc="ONNX GatherElements (https://onnx.ai/onnx/operators/onnx__GatherElements.html): "
       "out[c] = data[c with c[axis] = indices[c]] (numpy.take_along_axis), out of indices' shape; fed indices "
       "outside [-dim, dim) refused (InputError), computed ones clamped")


def _gather_elements_broadcast(ts, a):
    data, idx = ts
    shape = tuple(a["shape"])
    need(idx.rank == len(shape) and all(i in (1, s) for i, s in zip(idx.shape, shape, strict=True)),
         f"indices {idx} must broadcast to shape {list(shape)} at its own rank")
    out = _gather_elements((data, TensorType(shape, idx.dtype)), a)
    perm = tuple(a.get("perm") or ())
    if not perm:
        return out
    need(sorted(perm) == list(range(out.rank)), f"perm {list(perm)} is not a permutation of the {out.rank} axes")
    return TensorType(tuple(out.shape[j] for j in perm), out.dtype)


def gather_elements_broadcast_ref(xs, a):
    """GatherElementsBroadcast's reference: numpy.take_along_axis of data by the broadcast indices, transposed."""
    out = _gather_elements_ref((xs[0], np.broadcast_to(xs[1], tuple(a["shape"]))), a)
    return np.transpose(out, a["perm"]) if a.get("perm") else out


op("GatherElementsBroadcast", ("data", "indices"), _gather_elements_broadcast, gather_elements_broadcast_ref,
   attrs=(Attr("axis", "int", 0), Attr("shape", "ints"), Attr("perm", "ints", ())), vjp=_NO_GRAD,
   kernel=_gather_elements_kernel, flops=lambda ins, out, a: 0,
   doc="GatherElements(data, Expand(indices, shape)) without the expanded copy: the indices (of the output's rank, "
       "each axis 1 or the output's) read with stride 0 along the axes they are broadcast over (DeBERTa's relative "
       "position buckets, one [1, S, T] table for every batch and head); with ``perm``, that value transposed "
       "(numpy.transpose), written in that order with no copy (DeBERTa's position-to-content term)")


def _broadcast_indices_example(g, dim):
    # DeBERTa's exporters: the position-term scores [B H, S, P] gathered along P by a bucket table [1, S, S]
    # expanded over B H
    n, s, p = dim("n", 1, 4), dim("s", 1, 5), dim("p", 1, 6)
    idx = g.constant(np.random.default_rng(0).integers(-p, p, (1, s, s)).astype(np.int32), shape=(1, s, s),
                     dtype=DType.I32)
    wide = g.add_node("Expand", (idx,), shape=[n, s, s])
    g.set_outputs([g.add_node("GatherElements", (g.input("x", [n, s, p]), wide), axis=-1)])


def _permuted_gather_example(g, dim):
    # DeBERTa's position-to-content term: gathered along its last axis, then transposed
    n, s, p = dim("n", 1, 4), dim("s", 1, 5), dim("p", 1, 6)
    idx = g.constant(np.random.default_rng(1).integers(-p, p, (1, s, s)).astype(np.int32), shape=(1, s, s),
                     dtype=DType.I32)
    wide = g.add_node("Expand", (idx,), shape=[n, s, s])
    gathered = g.add_node("GatherElements", (g.input("x", [n, s, p]), wide), axis=-1)
    g.set_outputs([g.add_node("Permute", (gathered,), perm=[0, 2, 1])])


@rules("algebraic")
def _gather_elements_of_expanded_indices(e):
    d, i = e.vars("d i")
    s, si, so = e.vars("s si so", e.Vec[e.i64])
    (ax,) = e.vars("ax", e.i64)
    # GatherElements(d, Expand(i, s), axis) -> GatherElementsBroadcast(d, i, axis, shape of the Expand): each output
    # element reads the index the copy held, i at its coordinates with the broadcast axes at 0
    wide = e.Expand(i, shape=s)
    lhs = e.GatherElements(d, wide, axis=ax)
    yield e.rule(lhs, e.eq(e.shape(i)).to(si), e.eq(e.shape(wide)).to(so), e.eq(si.length()).to(so.length()),
                 name="GatherElements(d, Expand(i, s)) -> GatherElementsBroadcast(d, i)   (i of the output's rank)",
                 example=example(_broadcast_indices_example)).then(
        e.union(lhs).with_(e.GatherElementsBroadcast(d, i, axis=ax, shape=so, perm=e.Vec[e.i64].empty())))
    # Permute(GatherElementsBroadcast(d, i), p) -> GatherElementsBroadcast(d, i, perm=p): the gather writes its
    # value in p's order (each output element computes the element it holds), no transposed copy
    (p,) = e.vars("p", e.Vec[e.i64])
    gathered = e.GatherElementsBroadcast(d, i, axis=ax, shape=s, perm=e.Vec[e.i64].empty())
    lhs = e.Permute(gathered, perm=p)
    yield e.rule(lhs, name="Permute(GatherElementsBroadcast(d, i), p) -> GatherElementsBroadcast(d, i, perm=p)",
                 example=example(_permuted_gather_example)).then(
        e.union(lhs).with_(e.GatherElementsBroadcast(d, i, axis=ax, shape=s, perm=p)))


def _scatter_elements(ts, a):
    data, idx, upd = ts
    _indices(idx)
    _max_rank(data.rank, f"data {data}")
    axis = _axis(a, data.rank)
    need(upd.dtype == data.dtype and upd.shape == idx.shape, f"updates {upd} must be of data's dtype and indices' "
                                                             f"shape {list(idx.shape)}")
    need(idx.rank == data.rank and all(i <= d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True))
                                       if k != axis),
         f"indices {idx} must have data's rank and no larger dims than data {data} off axis {axis}")
    need(a["reduction"] in REDUCTIONS, f"reduction {a['reduction']!r} is not one of {', '.join(REDUCTIONS)}")
    need(a["reduction"] == "none" or data.dtype in (DType.F32, DType.I32),
         f"reduction {a['reduction']!r} needs f32 or i32 data, got {data}")
    return data


def _reduce(out: np.ndarray, at: tuple, v, reduction: str) -> None:
    if reduction == "none":
        out[at] = v
    elif reduction == "add":
        out[at] += v
    elif reduction == "mul":
        out[at] *= v
    elif reduction == "max":
        out[at] = v if v > out[at] else out[at]
    else:
        out[at] = v if v < out[at] else out[at]
    if out.dtype == np.int64:
        out[at] = _wrap_i32(out[at])


def _scatter_elements_ref(xs, a):
    data, idx, upd = xs
    axis = a["axis"] % data.ndim
    out = data.copy()
    k = normalise(idx, data.shape[axis])
    for pos in np.ndindex(*idx.shape):  # row-major, as ONNX's reference applies the updates
        at = list(pos)
        at[axis] = k[pos]
        _reduce(out, tuple(at), upd[pos], a["reduction"])
    return out


def _scatter_elements_kernel(node, ins, target) -> Kernel:
    data, idx, _ = ins
    axis = node.attrs["axis"] % data.rank
    n = node.type.num_elements
    reduction = node.attrs["reduction"]
    return Kernel(f"scatter_elements_{reduction}_{data.dtype.wgsl}", "scatter_elements.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("rank", "u32", data.rank), ("axis", "u32", axis),
                          ("along", "u32", idx.shape[axis]), ("ddims", "array<vec4<u32>, 2>", _vec8(data.shape)),
                          ("udims", "array<vec4<u32>, 2>", _vec8(idx.shape)),
                          ("ustr", "array<vec4<u32>, 2>", _vec8(row_strides(idx.shape)))),
                  slots={"REDUCE": REDUCTIONS[reduction]}, loop_iterations=data.rank + idx.shape[axis])


op("ScatterElements", ("data", "indices", "updates"), _scatter_elements, _scatter_elements_ref,
   attrs=(Attr("axis", "int", 0), Attr("reduction", "str", "none")), vjp=_NO_GRAD, kernel=_scatter_elements_kernel,
   flops=lambda ins, out, a: out.num_elements * ins[1].shape[a["axis"] % ins[1].rank],
   index_bounds=lambda ins, a: {1: ins[0].shape[a["axis"] % ins[0].rank]},
   doc="ONNX ScatterElements (https://onnx.ai/onnx/operators/onnx__ScatterElements.html): a copy of data with "
       "out[c with c[axis] = indices[c]] = updates[c], or combined with it by reduction add/mul/max/min, in "
       "row-major order of the updates (duplicates apply in that order). Each output element scans the "
       "updates.shape[axis] updates that may land on it. Fed indices outside [-dim, dim) refused (InputError), "
       "computed ones clamped")


# --- GatherND, ScatterND ---------------------------------------------------------------------


def _gather_nd(ts, a):
    data, idx = ts
    _indices(idx)
    b = a["batch_dims"]
    need(0 <= b < min(data.rank, idx.rank), f"batch_dims {b} must be below the ranks of data {data} and indices {idx}")
    need(data.shape[:b] == idx.shape[:b], f"the first {b} dims of data {data} and indices {idx} differ")
    k = idx.shape[-1]
    need(1 <= k <= data.rank - b, f"indices' last dim {k} must be in 1..{data.rank - b} for data {data}")
    _max_rank(k, f"indices {idx}' last dim")
    shape = idx.shape[:-1] + data.shape[b + k:]
    return TensorType(shape if shape else (), data.dtype)


def _gather_nd_ref(xs, a):
    data, idx = xs
    b, k = a["batch_dims"], idx.shape[-1]
    batch = math.prod(data.shape[:b])
    d = data.reshape((batch,) + data.shape[b:])
    ix = idx.reshape((batch, -1, k))
    out = np.empty((batch, ix.shape[1]) + data.shape[b + k:], dtype=data.dtype)
    for i in range(batch):
        for m in range(ix.shape[1]):
            out[i, m] = d[i][tuple(normalise(ix[i, m, j], data.shape[b + j]) for j in range(k))]
    return out.reshape(idx.shape[:-1] + data.shape[b + k:])


def _gather_nd_kernel(node, ins, target) -> Kernel:
    data, idx = ins
    b, k = node.attrs["batch_dims"], idx.shape[-1]
    n = node.type.num_elements
    st = row_strides(data.shape)
    return Kernel(f"gather_nd_{data.dtype.wgsl}", "gather_nd.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("inner", "u32", math.prod(data.shape[b + k:])),
                          ("rows", "u32", math.prod(idx.shape[b:-1])), ("k", "u32", k),
                          ("batch_stride", "u32", math.prod(data.shape[b:])),
                          ("idims", "array<vec4<u32>, 2>", _vec8(data.shape[b:b + k])),
                          ("istr", "array<vec4<u32>, 2>", _vec8(st[b:b + k]))))


op("GatherND", ("data", "indices"), _gather_nd, _gather_nd_ref, attrs=(Attr("batch_dims", "int", 0),), vjp=_NO_GRAD,
   kernel=_gather_nd_kernel, flops=lambda ins, out, a: 0,
   index_bounds=lambda ins, a: {1: tuple(ins[0].shape[a["batch_dims"]:a["batch_dims"] + ins[1].shape[-1]])},
   doc="ONNX GatherND (https://onnx.ai/onnx/operators/onnx__GatherND.html): out[B.., M..] = data[B.., "
       "indices[B.., M.., :]] with the first batch_dims dims shared, of shape indices.shape[:-1] + "
       "data.shape[batch_dims + k:]; a fed index tuple's element j outside [-dim, dim) of data's axis "
       "batch_dims + j refused (InputError), computed ones clamped")


# --- gathers of every element in order: views ----------------------------------------------------
# Exporters index a runtime tensor with folded constants that select every element in order:
# the classic exporter's attention_mask[:, None, None, :] as Gather(x [B*S, 1], arange(B*S) as
# [B, 1, 1, S]), the dynamo exporter's as GatherND(x [B, S], the [B, 1, 1, S, 2] grid of (b, s)
# pairs). Such a gather is a Reshape of x: no kernel, and the rules downstream see x itself.


@value_fact("iota", ("int",), doc="iota(c, n): c is an i32 constant holding 0, 1, ..., n - 1 in row-major order "
                                   "(any shape)")
def _iota(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.I32 or value.size == 0:
        return None
    return (int(value.size),) if np.array_equal(value.reshape(-1), np.arange(value.size)) else None


@value_fact("index_grid", ("int", "int"),
            doc="index_grid(c, n0, n1): c is an i32 constant [..., 2] whose pairs, in row-major order, are every "
                "(i, j) with i < n0 and j < n1, in row-major order (GatherND's indices of a whole [n0, n1] tensor)")
def _index_grid(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.I32 or ty.rank < 2 or ty.shape[-1] != 2 or value.size == 0:
        return None
    pairs = value.reshape(-1, 2).astype(np.int64)
    n0, n1 = int(pairs[:, 0].max()) + 1, int(pairs[:, 1].max()) + 1
    if n0 < 1 or n1 < 1 or pairs.shape[0] != n0 * n1:  # (no grid built for a constant of a few large indices)
        return None
    k = np.arange(n0 * n1)
    return (n0, n1) if np.array_equal(pairs[:, 0], k // n1) and np.array_equal(pairs[:, 1], k % n1) else None


def _whole_gather_example(nd: bool, axis: int = 1):
    def build(g, dim):
        a, n, m = dim("a", 1, 3), dim("n", 1, 4), dim("m", 1, 3)
        if nd:  # GatherND(x [a, n, m], grid of (i, j)) as [1, a, 1, n, 2]
            grid = np.stack(np.meshgrid(np.arange(a), np.arange(n), indexing="ij"), axis=-1).reshape(1, a, 1, n, 2)
            c = g.constant(grid.astype(np.int32), shape=list(grid.shape), dtype=DType.I32)
            g.set_outputs([g.add_node("GatherND", (g.input("x", [a, n, m]), c))])
        else:  # Gather(x [a, n, m], arange(n) as [n, 1], axis 1 or -2)
            c = g.constant(np.arange(n, dtype=np.int32).reshape(n, 1), shape=[n, 1], dtype=DType.I32)
            g.set_outputs([g.add_node("Gather", (g.input("x", [a, n, m]), c), axis=axis)])

    return example(build)


@rules("algebraic")
def _whole_gathers(e):
    x, c = e.vars("x c")
    sx, so = e.vars("sx so", e.Vec[e.i64])
    ax, n, n0, n1 = e.vars("ax n n0 n1", e.i64)
    # Gather(x, c, axis) -> Reshape(x, shape)   if iota(c, n) and x has n elements along the axis (a negative
    # one counted from the end)
    lhs = e.Gather(x, c, axis=ax)
    for label, sign, at, axis in (("axis", ax >= e.i64(0), ax, 1), ("negative axis", ax < e.i64(0),
                                                                    sx.length() + ax, -2)):
        yield e.equal(f"Gather(x, iota, {label}) -> Reshape(x)", lhs, e.Identity(x, shape=so), e.iota(c, n),
                      e.eq(e.shape(x)).to(sx), sign, e.eq(sx[at]).to(n), e.eq(e.shape(lhs)).to(so),
                      example=_whole_gather_example(False, axis))
    # GatherND(x, c, batch_dims 0) -> Reshape(x, shape)   if index_grid(c, n0, n1) and x is [n0, n1, ...]
    lhs = e.GatherND(x, c, batch_dims=e.i64(0))
    yield e.equal("GatherND(x, grid) -> Reshape(x)", lhs, e.Identity(x, shape=so), e.index_grid(c, n0, n1),
                  e.eq(e.shape(x)).to(sx), e.eq(sx[0]).to(n0), e.eq(sx[1]).to(n1), e.eq(e.shape(lhs)).to(so),
                  example=_whole_gather_example(True))


def _scatter_nd(ts, a):
    data, idx, upd = ts
    _indices(idx)
    k = idx.shape[-1]
    need(1 <= k <= data.rank, f"indices' last dim {k} must be in 1..{data.rank} for data {data}")
    _max_rank(k, f"indices {idx}' last dim")
    want = idx.shape[:-1] + data.shape[k:]
    need(upd.dtype == data.dtype and upd.shape == want,
         f"updates {upd} must be of data's dtype and shape {list(want)}")
    need(a["reduction"] in REDUCTIONS, f"reduction {a['reduction']!r} is not one of {', '.join(REDUCTIONS)}")
    need(a["reduction"] == "none" or data.dtype in (DType.F32, DType.I32),
         f"reduction {a['reduction']!r} needs f32 or i32 data, got {data}")
    return data


def _scatter_nd_ref(xs, a):
    data, idx, upd = xs
    k = idx.shape[-1]
    out = data.copy()
    rows = idx.reshape(-1, k)
    u = upd.reshape((rows.shape[0],) + data.shape[k:])
    for r in range(rows.shape[0]):  # in row order, as ONNX's reference applies them
        at = tuple(int(normalise(rows[r, j], data.shape[j])) for j in range(k))
        for inner in np.ndindex(*data.shape[k:]):
            _reduce(out, at + inner, u[(r,) + inner], a["reduction"])
    return out


def _scatter_nd_kernel(node, ins, target) -> Kernel:
    data, idx, _ = ins
    k = idx.shape[-1]
    n = node.type.num_elements
    reduction = node.attrs["reduction"]
    return Kernel(f"scatter_nd_{reduction}_{data.dtype.wgsl}", "scatter_nd.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("inner", "u32", math.prod(data.shape[k:])),
                          ("rows", "u32", math.prod(idx.shape[:-1])), ("k", "u32", k),
                          ("idims", "array<vec4<u32>, 2>", _vec8(data.shape[:k])),
                          ("istr", "array<vec4<u32>, 2>", _vec8(row_strides(data.shape)[:k]))),
                  slots={"REDUCE": REDUCTIONS[reduction]},
                  loop_iterations=nested_iterations(math.prod(idx.shape[:-1]), k))


op("ScatterND", ("data", "indices", "updates"), _scatter_nd, _scatter_nd_ref,
   attrs=(Attr("reduction", "str", "none"),), vjp=_NO_GRAD, kernel=_scatter_nd_kernel,
   flops=lambda ins, out, a: out.num_elements * math.prod(ins[1].shape[:-1]) * ins[1].shape[-1],
   index_bounds=lambda ins, a: {1: tuple(ins[0].shape[:ins[1].shape[-1]])},
   doc="ONNX ScatterND (https://onnx.ai/onnx/operators/onnx__ScatterND.html): a copy of data with the slices "
       "data[indices[r]] = updates[r] (or combined by reduction add/mul/max/min) in row order r. Each output "
       "element scans every index row: cost elements x rows x k, fine for the few rows of a cache update or a "
       "masked write, slow for a scatter of many rows. A fed index tuple's element j outside [-dim, dim) of "
       "data's axis j refused (InputError), computed ones clamped")


# --- OneHot ----------------------------------------------------------------------------------


def _one_hot(ts, a):
    idx, values = ts
    need(idx.dtype in (DType.I32, DType.F32), f"indices must be i32 or f32, got {idx}")
    need(values.num_elements == 2 and values.rank <= 1, f"values must hold [off, on], got {values}")
    need(a["depth"] >= 1, f"depth must be >= 1, got {a['depth']}")
    axis = a["axis"]
    need(-idx.rank - 1 <= axis <= idx.rank, f"axis {axis} out of range for indices {idx}")
    axis %= idx.rank + 1
    return TensorType(idx.shape[:axis] + (a["depth"],) + idx.shape[axis:], values.dtype)


def _one_hot_ref(xs, a):
    idx, values = xs
    depth = a["depth"]
    axis = a["axis"] % (idx.ndim + 1)
    k = np.trunc(idx).astype(np.int64)  # ONNX casts non-integer indices to int64
    k = np.where((k < 0) & (k >= -depth), k + depth, k)  # out of [-depth, depth): no hot entry
    hot = np.expand_dims(k, axis) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - axis))
    return np.where(hot, values.reshape(-1)[1], values.reshape(-1)[0])


def _one_hot_kernel(node, ins, target) -> Kernel:
    idx = ins[0]
    axis = node.attrs["axis"] % (idx.rank + 1)
    n = node.type.num_elements
    index = "indices[at]" if idx.dtype is DType.I32 else "i32(trunc(indices[at]))"
    return Kernel(f"one_hot_{idx.dtype.wgsl}_{node.type.dtype.wgsl}", "one_hot.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("depth", "i32", node.attrs["depth"]),
                          ("inner", "u32", math.prod(idx.shape[axis:]))), slots={"INDEX": index})


op("OneHot", ("indices", "values"), _one_hot, _one_hot_ref, attrs=(Attr("depth", "int"), Attr("axis", "int", -1)),
   vjp=_NO_GRAD, kernel=_one_hot_kernel, flops=lambda ins, out, a: 0,
   doc="ONNX OneHot (https://onnx.ai/onnx/operators/onnx__OneHot.html): values[1] where the (truncated) index, "
       "negative ones from the end, equals the position along the new axis of size depth, values[0] elsewhere "
       "(an index outside [-depth, depth) has no hot entry)")
