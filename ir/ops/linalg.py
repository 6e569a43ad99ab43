"""Batched linear algebra with numpy semantics: BatchMatMul (numpy.matmul, optionally with
transposed operands) and Einsum (numpy.einsum), the targets of ONNX MatMul and Einsum where
the 2-D MatMul family (``matmul.py``) does not apply.

BatchMatMul runs the tiled kernel shared with the implicit-GEMM convolutions
(``shaders/gemm_tiled.wgsl``); Einsum runs one invocation per output element, summing over
the contracted letters (fine for small contractions: ONNX Einsum of a batched-matmul form
goes to BatchMatMul or MatMul in the importer).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, example, need, need_f32, no_grad, op, rules
from ..types import DType, TensorType
from .indexing import broadcast_index_strides, gather_elements_broadcast_ref
from .movement import row_strides

FAMILY = "linalg"

#: Tiles (rows, columns, K slice) of shaders/gemm_tiled.wgsl, 4096 outputs per workgroup of 256
#: invocations; the two staged slices take 4 * slice * (rows + columns) bytes of workgroup memory,
#: within the WebGPU default maxComputeWorkgroupStorageSize (matmul_kernel.WORKGROUP_STORAGE).
GEMM_TILES = ((64, 64, 16), (32, 128, 16), (16, 256, 8))
#: Batch dimensions BatchMatMul's kernel addresses after merging (uniform vec4s).
MAX_BATCH_DIMS = 4
#: Letters (after expanding "...") and operands the Einsum kernel takes.
MAX_EINSUM_LETTERS = 12
MAX_EINSUM_OPERANDS = 3

_INFERENCE = no_grad("an inference op of the ONNX importer; training graphs use MatMul, MatMulAT and MatMulBT")


# --- BatchMatMul -------------------------------------------------------------------------------


def _matrices(ts, a) -> tuple[tuple[int, ...], tuple[int, ...], int, int, int]:
    """(batch of A, batch of B, M, K, N) of a BatchMatMul; a 1-D A is [1,K], a 1-D B [K,1]."""
    x, y = ts
    need_f32(x, "A")
    need_f32(y, "B")
    need(x.rank >= 1 and y.rank >= 1, f"needs operands of rank >= 1, got A {x} and B {y}")
    need(not (a["trans_a"] and x.rank == 1) and not (a["trans_b"] and y.rank == 1),
         "a 1-D operand cannot be transposed")
    xs = (1, *x.shape) if x.rank == 1 else x.shape
    ys = (*y.shape, 1) if y.rank == 1 else y.shape
    m, k = xs[-1:-3:-1] if a["trans_a"] else xs[-2:]
    k2, n = ys[-1:-3:-1] if a["trans_b"] else ys[-2:]
    need(k == k2, f"inner dimensions differ: A {x}, B {y} (trans_a {a['trans_a']}, trans_b {a['trans_b']})")
    return xs[:-2], ys[:-2], m, k, n


def batch_layout(out: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The batch dimensions of a broadcast product as (size, stride of A, stride of B), in
    matrices (stride 0 where an operand broadcasts), adjacent dimensions merged where both
    strides allow, at least one: :func:`strided_batch_layout` of row-major operands."""
    return strided_batch_layout(out, tuple(a), tuple(row_strides(a)), tuple(b), tuple(row_strides(b)))


def gemm_tile(m: int) -> tuple[int, int, int]:
    """The tile (BM, BN, K slice) of gemm_tiled.wgsl for a problem of ``m`` rows: the narrowest
    that covers them (a 64-row tile over 16 rows would compute 75% zeros), else 64 x 64."""
    return next((t for t in reversed(GEMM_TILES) if m <= t[0]), GEMM_TILES[0])


#: gemm_tiled.wgsl's STORE: each result through out_row, out_col and finish (any layout, any N).
GEMM_STORE = """\
    var cols: array<u32, 4>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        cols[j] = out_col(min(n0 + tx * 4u + j, p.n - 1u));
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let m = m0 + ty * 4u + i;
        if (m >= p.m) {
            break;
        }
        let row = out_row(m);
        for (var j = 0u; j < 4u; j = j + 1u) {
            if (n0 + tx * 4u + j < p.n) {
                out[row + cols[j]] = finish(m, row + cols[j], acc[i][j]);
            }
        }
    }"""
#: gemm_tiled.wgsl's STORE for a row-major C whose N is a multiple of 4 (out bound as vec4): a row's 4 results
#: as one 16-byte store, wholly inside or outside the matrix; neighbouring invocations write neighbouring quads.
GEMM_STORE_QUADS = """\
    let n = n0 + tx * 4u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let m = m0 + ty * 4u + i;
        if (m >= p.m) {
            break;
        }
        if (n < p.n) {
            out[(out_row(m) + n) / 4u] = acc[i];
        }
    }"""
#: Whether BatchMatMul's kernels of N % 4 == 0 store quads (GEMM_STORE_QUADS).
BATCH_STORE_QUADS = True


def gemm_params(m: int, k: int, n: int, z: int) -> tuple[tuple[tuple[str, str, int], ...], dict[str, int], int]:
    """(uniform fields, slots, workgroups) of gemm_tiled.wgsl for z problems of [m, k] x [k, n]."""
    bm, bn, slice_k = gemm_tile(m)
    tiles_m, tiles_n = math.ceil(m / bm), math.ceil(n / bn)
    tiles = tiles_m * tiles_n * z
    params = (("m", "u32", m), ("k", "u32", k), ("n", "u32", n), ("tiles_m", "u32", tiles_m),
              ("tiles_n", "u32", tiles_n), ("tiles", "u32", tiles))
    return params, {"BM": bm, "BN": bn, "SLICE": slice_k, "STORE": GEMM_STORE}, tiles


def _batch_matmul(ts, a):
    ba, bb, m, _, n = _matrices(ts, a)
    try:
        batch = np.broadcast_shapes(ba, bb)
    except ValueError:
        need(False, f"batch dimensions {list(ba)} and {list(bb)} do not broadcast")
    need(len(batch_layout(batch, ba, bb)) <= MAX_BATCH_DIMS,
         f"batch dimensions {list(ba)} and {list(bb)} broadcast in more than {MAX_BATCH_DIMS} separate groups")
    return TensorType((*batch, *((m,) if ts[0].rank > 1 else ()), *((n,) if ts[1].rank > 1 else ())))


def _batch_matmul_ref(xs, a):
    x, y = xs
    if a["trans_a"]:
        x = np.swapaxes(x, -1, -2)
    if a["trans_b"]:
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def batch_operand_params(dims: list[tuple[int, int, int]], sa: tuple[int, int, int], k: int, n: int,
                         trans_b: bool) -> tuple[tuple[str, str, list[int]], ...]:
    """The uniform fields naming a batched product's operands (batch_matmul.wgsl, gathered_matmul.wgsl):
    ``dims`` its batch dimensions (size, element stride of A, of B; :func:`strided_batch_layout`, at most
    MAX_BATCH_DIMS), ``sa`` A's element strides of a row and a column and its element offset, B [K, N] row-major
    or, with ``trans_b``, [N, K]."""
    dims = [(1, 0, 0)] * (MAX_BATCH_DIMS - len(dims)) + list(dims)
    sbk, sbn = (1, k) if trans_b else (n, 1)
    return (("batch", "vec4<u32>", [d[0] for d in dims]), ("a_batch", "vec4<u32>", [d[1] for d in dims]),
            ("b_batch", "vec4<u32>", [d[2] for d in dims]), ("sa", "vec4<u32>", [*sa, 0]),
            ("sb", "vec4<u32>", [sbk, sbn, 0, 0]))


def _batch_gemm_kernel(dims, sa, m: int, k: int, n: int, z: int, trans_b: bool) -> Kernel:
    # batch_matmul.wgsl over z problems of [m, k] x [k, n] (BatchMatMul, PermutedBatchMatMul)
    gemm, slots, tiles = gemm_params(m, k, n, z)
    quads = BATCH_STORE_QUADS and n % 4 == 0
    if quads:
        slots["STORE"] = GEMM_STORE_QUADS
    return Kernel(f"batch_matmul_{slots['BM']}x{slots['BN']}" + ("_q" if quads else ""), "batch_matmul.wgsl", tiles,
                  params=(*gemm, *batch_operand_params(dims, sa, k, n, trans_b)), slots=slots,
                  bindings=(Buffer("a"), Buffer("b"), Buffer("out", "vec4<f32>" if quads else "f32", write=True)))


def _batch_matmul_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    ba, bb, m, k, n = _matrices(ins, a)
    batch = np.broadcast_shapes(ba, bb)
    dims = [(size, sa * m * k, sb * k * n) for size, sa, sb in batch_layout(batch, ba, bb)]  # in elements
    # A stored [M,K] (element (m, k) at m K + k) or, transposed, [K,M]
    sa = (1, m, 0) if a["trans_a"] else (k, 1, 0)
    return _batch_gemm_kernel(dims, sa, m, k, n, math.prod(batch), a["trans_b"])


def _batch_matmul_flops(ins, out, a):
    ba, bb, m, k, n = _matrices(ins, a)
    return 2 * math.prod(np.broadcast_shapes(ba, bb)) * m * k * n


op("BatchMatMul", ("a", "b"), _batch_matmul, _batch_matmul_ref,
   attrs=(Attr("trans_a", "bool", False), Attr("trans_b", "bool", False)),
   doc="numpy.matmul(A', B') with A' = A, or A with its last two axes swapped when trans_a (B' likewise): "
       "[..., M, K] @ [..., K, N] -> [..., M, N] with numpy-broadcast batch axes; a 1-D A is a row "
       "[1, K] and a 1-D B a column [K, 1], their axis dropped from the result "
       "(https://numpy.org/doc/stable/reference/generated/numpy.matmul.html; ONNX MatMul, "
       "https://onnx.ai/onnx/operators/onnx__MatMul.html)",
   vjp=_INFERENCE, kernel=_batch_matmul_kernel, flops=_batch_matmul_flops)


# --- PermutedBatchMatMul: A read through a permutation of its axes ---------------------------------


def strided_batch_layout(out: tuple[int, ...], a: tuple[int, ...], sa: tuple[int, ...], b: tuple[int, ...],
                         sb: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """:func:`batch_layout` of operands whose batch axes ``a`` / ``b`` have element strides ``sa`` / ``sb``:
    (size, element stride of A, of B) of each batch dimension, adjacent ones merged where both strides allow,
    at least one."""
    pad_a, pad_b = len(out) - len(a), len(out) - len(b)
    a, sa = (1,) * pad_a + tuple(a), (0,) * pad_a + tuple(sa)
    b, sb = (1,) * pad_b + tuple(b), (0,) * pad_b + tuple(sb)
    dims: list[tuple[int, int, int]] = []
    for d in range(len(out) - 1, -1, -1):
        if out[d] == 1:
            continue
        da, db = (sa[d] if a[d] != 1 else 0), (sb[d] if b[d] != 1 else 0)
        if dims and dims[0][1] * dims[0][0] == da and dims[0][2] * dims[0][0] == db:
            size, ia, ib = dims[0]
            dims[0] = (size * out[d], ia, ib)
        else:
            dims.insert(0, (out[d], da, db))
    return dims or [(1, 0, 0)]


def _a_view(x: TensorType, a) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    # (the shape A is read as, its element strides in A's storage, the element offset): A as it is, or with
    # ``view``, columns [start, start + size) of a 2-D A [R, C] seen as ``view`` (leading axes the R rows, the
    # rest the size columns)
    view = tuple(a.get("view") or ())
    if not view:
        return x.shape, tuple(row_strides(x.shape)), 0
    need(x.rank == 2, f"with view {list(view)}, A must be 2-D (rows, columns), got {x}")
    rows, cols = x.shape
    split = next((j for j in range(len(view) + 1) if math.prod(view[:j]) == rows), None)
    need(split is not None and min(view) >= 1, f"view {list(view)} does not split A's {rows} rows from its columns")
    size, start = math.prod(view[split:]), a.get("start", 0)
    need(0 <= start and start + size <= cols, f"view {list(view)} from column {start} takes columns "
                                              f"[{start}, {start + size}) of A {x}, which has {cols}")
    strides = row_strides(view)
    strides[:split] = [math.prod(view[i + 1:split]) * cols for i in range(split)]
    return view, tuple(strides), start


def _permuted_a(ts, a) -> tuple[TensorType, tuple[int, ...], int]:
    # (A' = transpose(A seen as its view, perm) as a type, the element strides of A' in A's storage, the offset)
    x = ts[0]
    shape, strides, offset = _a_view(x, a)
    perm = tuple(a["perm"])
    need(len(shape) >= 2 and sorted(perm) == list(range(len(shape))),
         f"perm {list(perm)} is not a permutation of A's {len(shape)} axes (A {x}, rank >= 2)")
    return TensorType(tuple(shape[i] for i in perm), x.dtype), tuple(strides[i] for i in perm), offset


def _permuted_layout(ts, a):
    seen, strides, offset = _permuted_a(ts, a)
    ba, bb, m, k, n = _matrices([seen, ts[1]], {**a, "trans_a": False})
    try:
        batch = np.broadcast_shapes(ba, bb)
    except ValueError:
        need(False, f"batch dimensions {list(ba)} and {list(bb)} do not broadcast")
    sb = [s * k * n for s in row_strides(bb)]
    dims = strided_batch_layout(batch, ba, strides[:-2], bb, tuple(sb))
    need(len(dims) <= MAX_BATCH_DIMS,
         f"batch dimensions {list(ba)} (permuted) and {list(bb)} take more than {MAX_BATCH_DIMS} separate groups")
    return seen, strides, offset, batch, dims, m, k, n


def _permuted_batch_matmul(ts, a):
    need(ts[0].rank >= 2 and ts[1].rank >= 2, f"needs A and B of rank >= 2, got A {ts[0]} and B {ts[1]}")
    _, _, _, batch, _, m, _, n = _permuted_layout(ts, a)
    return TensorType((*batch, m, n))


def _permuted_batch_matmul_ref(xs, a):
    x = xs[0]
    if a.get("view"):
        size = math.prod(a["view"]) // x.shape[0]
        x = x[:, a["start"]:a["start"] + size].reshape(a["view"])
    return _batch_matmul_ref([np.transpose(x, a["perm"]), xs[1]], {"trans_a": False, "trans_b": a["trans_b"]})


def _permuted_batch_matmul_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    _, strides, offset, batch, dims, m, k, n = _permuted_layout(ins, a)
    return _batch_gemm_kernel(dims, (strides[-2], strides[-1], offset), m, k, n, math.prod(batch), a["trans_b"])


op("PermutedBatchMatMul", ("a", "b"), _permuted_batch_matmul, _permuted_batch_matmul_ref,
   attrs=(Attr("perm", "ints"), Attr("trans_b", "bool", False), Attr("view", "ints", ()), Attr("start", "int", 0)),
   doc="numpy.matmul(numpy.transpose(A', perm), B') with A' = A, or with ``view`` columns [start, start + size) "
       "of a 2-D A [R, C] reshaped to ``view`` (its leading axes the R rows, the rest the size columns: one part "
       "of a packed product), and B' = B, or B with its last two axes swapped when trans_b: BatchMatMul of a "
       "permuted A read in place, its element (.., m, k) at A's strides permuted (an exporter's head split "
       "[B, S, H, D] -> [B, H, S, D] before a product, no copy); A' and B of rank >= 2",
   vjp=_INFERENCE, kernel=_permuted_batch_matmul_kernel,
   flops=lambda ins, out, a: _batch_matmul_flops([_permuted_a(ins, a)[0], ins[1]], out, {**a, "trans_a": False}),
   read_bytes=lambda ins, a: _permuted_a(ins, a)[0].size_bytes + ins[1].size_bytes)


# --- GatheredBatchMatMul: the elements a GatherElements takes of a product, computed alone ----------


def _gathered_parts(ts, a):
    # (the product's batch dims layout, strides, offset, M, K, N, G's shape [Z, M, T], the output type)
    x, y, idx = ts
    need(x.rank >= 2 and y.rank >= 2, f"needs A and B of rank >= 2, got A {x} and B {y}")
    _, strides, offset, batch, dims, m, k, n = _permuted_layout([x, y], a)
    shape = tuple(a["shape"])
    # (as GatherElements, the gathered value may take fewer matrices and rows than the product has)
    need(len(shape) == 3 and 1 <= shape[0] <= math.prod(batch) and 1 <= shape[1] <= m,
         f"shape {list(shape)} is not [at most batch {math.prod(batch)}, at most rows {m}, T] of the product "
         f"[{', '.join(map(str, (*batch, m, n)))}]")
    need(idx.dtype is DType.I32 and idx.rank == 3 and all(i in (1, s) for i, s in zip(idx.shape, shape, strict=True)),
         f"indices {idx} must be i32 of rank 3 broadcasting to shape {list(shape)}")
    perm = tuple(a.get("out_perm") or (0, 1, 2))
    need(sorted(perm) == [0, 1, 2], f"out_perm {list(perm)} is not a permutation of 3 axes")
    return strides, offset, dims, m, k, n, shape, TensorType(tuple(shape[j] for j in perm))


def _gathered_batch_matmul_ref(xs, a):
    prod = _permuted_batch_matmul_ref(xs[:2], a)
    prod = prod.reshape(-1, *prod.shape[-2:])
    return gather_elements_broadcast_ref([prod, xs[2]], {"axis": 2, "shape": a["shape"],
                                                          "perm": a.get("out_perm") or ()})


def _gathered_batch_matmul_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    strides, offset, dims, _, k, n, shape, out = _gathered_parts(ins, a)
    istr = broadcast_index_strides(ins[2].shape, shape)
    perm = list(a.get("out_perm") or (0, 1, 2))
    params = (("total", "u32", out.num_elements), ("n", "u32", n), ("k", "u32", k),
              ("odims", "vec4<u32>", [*out.shape, 0]), ("perm", "vec4<u32>", [*perm, 0]),
              ("istr", "vec4<u32>", [*istr, 0]),
              *batch_operand_params(dims, (strides[-2], strides[-1], offset), k, n, a["trans_b"]))
    return Kernel("gathered_matmul", "gathered_matmul.wgsl", elementwise_groups(out.num_elements), params=params)


op("GatheredBatchMatMul", ("a", "b", "indices"), lambda ts, a: _gathered_parts(ts, a)[-1],
   _gathered_batch_matmul_ref,
   attrs=(Attr("perm", "ints"), Attr("trans_b", "bool", False), Attr("view", "ints", ()), Attr("start", "int", 0),
          Attr("shape", "ints"), Attr("out_perm", "ints", ())),
   doc="GatherElementsBroadcast(Reshape(PermutedBatchMatMul(a, b; perm, trans_b, view, start), [Z, M, N]), "
       "indices, axis 2, shape [Z, M, T], perm out_perm): the product's elements that the gather takes along its "
       "last axis, each computed alone as a K-long dot product, without the [Z, M, N] product (DeBERTa's "
       "relative-position terms: q's heads times the position keys of each pair's bucket); indices i32 of rank 3, "
       "each axis 1 or shape's, ONNX's negative indices from the end, clamped",
   vjp=_INFERENCE, kernel=_gathered_batch_matmul_kernel,
   flops=lambda ins, out, a: 2 * out.num_elements * _gathered_parts(ins, a)[4],
   read_bytes=lambda ins, a: _permuted_a(ins, a)[0].size_bytes + ins[1].size_bytes + ins[2].size_bytes)


def _gathered_example(perm):
    def build(g, dim):
        # DeBERTa's position terms: q heads [B, S, H, D] times position keys [1, H, P, D]^T, viewed [B H, S, P],
        # gathered along P by a bucket table [1, S, S] (values from -P to P-1), maybe transposed after
        b, s, h, d, p = dim("b", 1, 3), dim("s", 1, 4), dim("h", 1, 3), dim("d", 1, 4), dim("p", 1, 5)
        heads = g.add_node("Permute", (g.input("q", [b, s, h, d]),), perm=[0, 2, 1, 3])
        prod = g.add_node("BatchMatMul", (heads, g.input("k", [1, h, p, d])), trans_b=True)
        idx = g.constant(np.random.default_rng(2).integers(-p, p, (1, s, s)).astype(np.int32), shape=(1, s, s),
                         dtype=DType.I32)
        wide = g.add_node("Expand", (idx,), shape=[b * h, s, s])
        gathered = g.add_node("GatherElements", (g.reshape(prod, [b * h, s, p]), wide), axis=2)
        g.set_outputs([g.add_node("Permute", (gathered,), perm=perm) if perm else gathered])

    return build


@rules("gathered_products")  # optional: measured slower (rewrites.rulesets.OPTIONAL)
def _gathered_product(e):
    x, b, i = e.vars("x b i")
    p, v, s3, sp, so, op = e.vars("p v s3 sp so op", e.Vec[e.i64])
    (t,) = e.vars("t", e.Bool)
    (st,) = e.vars("st", e.i64)
    # GatherElementsBroadcast(Reshape(PermutedBatchMatMul(x, b), [B H, M, N]), i, axis 2) -> GatheredBatchMatMul(x,
    # b, i): the gathered elements of the product computed alone (the rank-4 product's batch axes merged)
    prod = e.PermutedBatchMatMul(x, b, perm=p, trans_b=t, view=v, start=st)
    lhs = e.GatherElementsBroadcast(e.Identity(prod, shape=s3), i, axis=e.i64(2), shape=so, perm=op)
    yield e.rule(lhs, e.eq(e.shape(prod)).to(sp), e.eq(sp.length()).to(e.i64(4)), e.eq(s3.length()).to(e.i64(3)),
                 e.eq(s3[0]).to(sp[0] * sp[1]), e.eq(s3[1]).to(sp[2]), e.eq(s3[2]).to(sp[3]),
                 name="GatherElementsBroadcast(Reshape(PermutedBatchMatMul(x, b)), i) -> GatheredBatchMatMul(x, b, i)",
                 example=example(_gathered_example([0, 2, 1]))).then(
        e.union(lhs).with_(e.GatheredBatchMatMul(x, b, i, perm=p, trans_b=t, view=v, start=st, shape=so, out_perm=op)))


def _permuted_a_example(rank: int):
    def build(g, dim):
        # q [B, S, H, D] split into heads by a Permute, times keys [1, H, P, D] transposed: DeBERTa's position
        # term (rank 3: one sequence, [S, H, D] -> [H, S, D])
        b, s, h, d, p = dim("b", 1, 3), dim("s", 1, 4), dim("h", 1, 3), dim("d", 1, 4), dim("p", 1, 4)
        q = g.input("q", [b, s, h, d] if rank == 4 else [s, h, d])
        heads = g.add_node("Permute", (q,), perm=[0, 2, 1, 3] if rank == 4 else [1, 0, 2])
        g.set_outputs([g.add_node("BatchMatMul", (heads, g.input("k", [1, h, p, d][4 - rank:])), trans_b=True)])

    return build


def _window_example(g, dim):
    # q, the first columns of a packed product P [B S, 3 H D], seen as heads [B, S, H, D] and permuted
    b, s, h, d, p = dim("b", 1, 3), dim("s", 1, 4), dim("h", 1, 3), dim("d", 1, 4), dim("p", 1, 4)
    packed = g.input("P", [b * s, 3 * h * d])
    q = g.reshape(g.add_node("SliceCols", (packed,), start=h * d, size=h * d), [b, s, h, d])
    g.set_outputs([g.add_node("PermutedBatchMatMul", (q, g.input("k", [1, h, p, d])), perm=[0, 2, 1, 3],
                              trans_b=True)])


@rules("algebraic")
def _permute_read_in_place(e):
    x, b, w = e.vars("x b w")
    p, s, sw, sb = e.vars("p s sw sb", e.Vec[e.i64])
    (t,) = e.vars("t", e.Bool)
    st, size = e.vars("st size", e.i64)
    plain = dict(view=e.Vec[e.i64].empty(), start=e.i64(0))
    # BatchMatMul(Permute(x, p), b) -> PermutedBatchMatMul(x, b, perm=p)   if p keeps the last axis (K) last, so
    # that A's rows are read as stored; rank 3 and 4, B of rank 2 or more (a 1-D B's axis is dropped from the
    # product, which PermutedBatchMatMul does not do)
    for r in (3, 4):
        lhs = e.BatchMatMul(e.Permute(x, perm=p), b, trans_a=e.Bool(False), trans_b=t)
        yield e.rule(lhs, e.eq(p.length()).to(e.i64(r)), e.eq(p[e.i64(r - 1)]).to(e.i64(r - 1)),
                     e.eq(e.shape(b)).to(sb), sb.length() >= e.i64(2),
                     name=f"BatchMatMul(Permute(x, p), b) -> PermutedBatchMatMul(x, b, perm=p) (rank {r}, p keeps "
                          "the last axis)", example=example(_permuted_a_example(r))).then(
            e.union(lhs).with_(e.PermutedBatchMatMul(x, b, perm=p, trans_b=t, **plain)))
    # PermutedBatchMatMul(Reshape(SliceCols(w, st, size), s), b, p) -> PermutedBatchMatMul(w, b, p; view s from
    # column st)   s = [B, S, H, D] with B S the rows of w [R, C] and H D = size: one part of a packed product
    # (Q/K/V) read where it lies, with no copy of the part
    lhs = e.PermutedBatchMatMul(e.Identity(e.SliceCols(w, start=st, size=size), shape=s), b, perm=p, trans_b=t,
                                **plain)
    yield e.rule(lhs, e.eq(e.shape(w)).to(sw), e.eq(sw.length()).to(e.i64(2)), e.eq(s.length()).to(e.i64(4)),
                 e.eq(s[0] * s[1]).to(sw[0]), e.eq(s[2] * s[3]).to(size),
                 name="PermutedBatchMatMul(Reshape(SliceCols(w, st, n), s), b) -> "
                      "PermutedBatchMatMul(w, b, view s from column st)",
                 example=example(_window_example)).then(
        e.union(lhs).with_(e.PermutedBatchMatMul(w, b, perm=p, trans_b=t, view=s, start=st)))


def _expanded_operand_example(side: int, trans: bool):
    def build(g, dim):
        # a [N, R, M, K] times b [1, R, K, P] expanded over N first (or a expanded, b full): the product of the
        # broadcast reads the small operand itself
        n, r, m, k, p = dim("n", 1, 3), dim("r", 1, 3), dim("m", 1, 4), dim("k", 1, 4), dim("p", 1, 4)
        full = g.input("full", [n, r, m, k] if side == 1 else [n, r, k, p])
        small_shape = ([1, r, p, k] if trans else [1, r, k, p]) if side == 1 else [1, r, m, k]
        wide = g.add_node("Expand", (g.input("small", small_shape),),
                          shape=[n, *small_shape[1:]])
        a, b = (full, wide) if side == 1 else (wide, full)
        g.set_outputs([g.add_node("BatchMatMul", (a, b), trans_b=trans and side == 1)])

    return build


@rules("algebraic")
def _expanded_operands(e):
    a, y = e.vars("a y")
    sa, sy, s = e.vars("sa sy s", e.Vec[e.i64])
    ta, tb = e.vars("ta tb", e.Bool)
    four = e.i64(4)
    # BatchMatMul(a, Expand(y, s)) -> BatchMatMul(a, y) (and the same with a expanded): numpy's matmul broadcasts
    # the batch axes itself, so where the other operand already has the expanded batch axes [N, R] and the
    # expansion leaves y's matrix axes as they are, the two products are the same
    for side in (1, 0):
        wide = e.Expand(y, shape=s)
        ops = (a, wide) if side == 1 else (wide, a)
        lhs = e.BatchMatMul(*ops, trans_a=ta, trans_b=tb)
        rhs = e.BatchMatMul(*((a, y) if side == 1 else (y, a)), trans_a=ta, trans_b=tb)
        yield e.rule(lhs, e.eq(e.shape(a)).to(sa), e.eq(e.shape(y)).to(sy), e.eq(sa.length()).to(four),
                     e.eq(sy.length()).to(four), e.eq(s.length()).to(four), e.eq(s[0]).to(sa[0]),
                     e.eq(s[1]).to(sa[1]), e.eq(s[2]).to(sy[2]), e.eq(s[3]).to(sy[3]),
                     name=f"BatchMatMul({'a, Expand(y)' if side == 1 else 'Expand(y), a'}) -> "
                          f"BatchMatMul({'a, y' if side == 1 else 'y, a'}) (y broadcast over a's batch axes)",
                     example=example(_expanded_operand_example(side, side == 1))).then(
            e.union(lhs).with_(rhs))


# --- the epilogue of a matmul seen through a reshape -----------------------------------------
# ONNX MatMul of a [..., M, K] activation by a [K, N] weight is imported as the 2-D MatMul of a
# [rows, K] view, viewed back as [..., N]; the bias, residual and activation that follow act on
# that view. These rules move them under the view, where the matmul_epilogue rules fold them
# into the matmul's store.


def _viewed_matmul(g, dim):
    """A [b, m, k] input times a [k, n] weight through [b m, k] and back: (node, b, m, n)."""
    b, m, k, n = dim("b"), dim("m"), dim("k"), dim("n")
    x = g.reshape(g.input("x", [b, m, k]), [b * m, k])
    return g.reshape(g.matmul(x, g.parameter("w", [k, n])), [b, m, n]), b, m, n


def _out(g, node):
    g.set_outputs([node])


_THROUGH_RESHAPE = {
    "bias": lambda g, dim: _out(g, g.add((v := _viewed_matmul(g, dim))[0], g.parameter("d", [v[3]]))),
    "bias_first": lambda g, dim: _out(g, g.add(g.parameter("d", [dim("n")]), _viewed_matmul(g, dim)[0])),
    "add": lambda g, dim: _out(g, g.add((v := _viewed_matmul(g, dim))[0], g.input("r", list(v[1:])))),
    "add_first": lambda g, dim: _out(g, g.add(g.input("r", [dim("b"), dim("m"), dim("n")]),
                                             _viewed_matmul(g, dim)[0])),
}


@rules("matmul_epilogue")
def _epilogue_through_reshape(e):
    from ..spec import OPS

    a, b, d, mm = e.vars("a b d mm")
    (v,) = e.vars("v", e.String)
    (ep,) = e.vars("e", e.Epi)
    s, sm, sd = e.vars("s sm sd", e.Vec[e.i64])
    fused = e.FusedMatMul(a, b, variant=v, epilogue=ep)
    view = e.Identity(mm, shape=s)
    is_mm = (e.eq(mm).to(fused), e.eq(e.shape(mm)).to(sm))
    # each rule gives the new term under the view its shape fact (a class a rule creates has none,
    # and the epilogue rules read it)

    def moved(name, lhs, inner, *guards, ex, views=()):
        return e.rule(lhs, *is_mm, *guards, name=name, example=example(ex)).then(
            e.union(lhs).with_(e.Identity(inner, shape=s)), *(e.set_(e.shape(t)).to(sm) for t in (inner, *views)))

    # Add(Reshape(mm, s), d[N]) -> Reshape(BiasAdd(mm, d), s)   if mm is a FusedMatMul [R,N] and s = [..., N]
    for label, add, ex in (("Add(Reshape(mm,s), d[N])", e.Add(view, d), "bias"),
                           ("Add(d[N], Reshape(mm,s))", e.Add(d, view), "bias_first")):
        yield moved(f"{label} -> Reshape(BiasAdd(mm,d), s)", add, e.BiasAdd(mm, d), e.eq(e.shape(d)).to(sd),
                    e.eq(sd).to(e.Vec(sm[1])), e.eq(s[s.length() - e.i64(1)]).to(sm[1]), ex=_THROUGH_RESHAPE[ex])
    # Add(Reshape(mm, s), d) -> Reshape(Add(mm, Reshape(d, shape(mm))), s)   if shape(d) = s, mm a FusedMatMul
    for label, add, ex in (("Add(Reshape(mm,s), d)", e.Add(view, d), "add"),
                           ("Add(d, Reshape(mm,s))", e.Add(d, view), "add_first")):
        flat = e.Identity(d, shape=sm)
        yield moved(f"{label} -> Reshape(Add(mm, Reshape(d, shape(mm))), s)", add, e.Add(mm, flat),
                    e.eq(e.shape(d)).to(s), ex=_THROUGH_RESHAPE[ex], views=(flat,))
    # U(Reshape(mm, s)) -> Reshape(U(mm), s)   for every unary op that may be an epilogue step, mm a FusedMatMul
    for name in (name for name, spec in OPS.items() if spec.epilogue_step):
        yield moved(f"{name}(Reshape(mm,s)) -> Reshape({name}(mm), s)", getattr(e, name)(view), getattr(e, name)(mm),
                    ex=(lambda u: lambda g, dim: _out(g, g.add_node(u, (_viewed_matmul(g, dim)[0],))))(name))


# --- a Permute of the last two axes folded into BatchMatMul's transpose flags --------------------

#: Operand ranks the rule is written for (one rule per rank: the new perm is built element-wise).
_TRANSPOSE_RANKS = (3, 4)


def _bmm_of_permute(side: str, rank: int, flag: bool):
    def build(g, dim):
        lead = [dim(f"b{i}", 1, 3) for i in range(rank - 2)]
        m, k, n = dim("m"), dim("k"), dim("n")
        perm = [1, 0, *range(2, rank - 2), rank - 1, rank - 2] if rank > 3 else [0, 2, 1]
        # the permuted operand holds, after the Permute, [.., K, N] (b) or [.., M, K] (a) (flag: transposed)
        want = (lead + ([n, k] if flag else [k, n])) if side == "b" else (lead + ([k, m] if flag else [m, k]))
        src = [0] * rank
        for i, p in enumerate(perm):
            src[p] = want[i]
        x = g.add_node("Permute", (g.input("x", src),), perm=perm)
        other = g.input("y", lead + [m, k]) if side == "b" else g.input("y", lead + [k, n])
        args = (other, x) if side == "b" else (x, other)
        g.set_outputs([g.add_node("BatchMatMul", args, **{f"trans_{side}": flag})])

    return build


@rules("algebraic")
def _permute_into_batch_matmul(e):
    a, b, x = e.vars("a b x")
    p, sp = e.vars("p sp", e.Vec[e.i64])
    (t,) = e.vars("t", e.Bool)
    for r in _TRANSPOSE_RANKS:
        swapped = e.Vec(*(p[e.i64(i)] for i in range(r - 2)), p[e.i64(r - 1)], p[e.i64(r - 2)])
        shape = e.Vec(*(sp[e.i64(i)] for i in range(r - 2)), sp[e.i64(r - 1)], sp[e.i64(r - 2)])
        for side in ("a", "b"):
            for flag in (False, True):
                permuted, moved = e.Permute(x, perm=p), e.Permute(x, perm=swapped)
                flags = {f"trans_{side}": e.Bool(flag), f"trans_{'b' if side == 'a' else 'a'}": t}
                new = {f"trans_{side}": e.Bool(not flag), f"trans_{'b' if side == 'a' else 'a'}": t}
                lhs = e.BatchMatMul(a, permuted, **flags) if side == "b" else e.BatchMatMul(permuted, b, **flags)
                rhs = e.BatchMatMul(a, moved, **new) if side == "b" else e.BatchMatMul(moved, b, **new)
                label = (f"BatchMatMul(a, Permute(x, p), trans_b={flag}) -> BatchMatMul(a, Permute(x, p with the last "
                         f"two swapped), trans_b={not flag}) (rank {r})") if side == "b" else (
                    f"BatchMatMul(Permute(x, p), b, trans_a={flag}) -> BatchMatMul(Permute(x, p with the last two "
                    f"swapped), b, trans_a={not flag}) (rank {r})")
                # the moved Permute gets its shape fact (the rules that cancel it and read it need one)
                yield e.rule(lhs, e.eq(p.length()).to(e.i64(r)), e.eq(e.shape(permuted)).to(sp), name=label,
                             example=example(_bmm_of_permute(side, r, flag))).then(
                    e.union(lhs).with_(rhs), e.set_(e.shape(moved)).to(shape))


# --- Einsum --------------------------------------------------------------------------------------


def parse_einsum(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str, dict[str, int]]:
    """(the letters of each operand, the output's letters, the size of each letter) of an
    einsum ``equation`` over operands of ``shapes``. "..." becomes digit letters
    (right-aligned across operands, numpy-broadcast); without "->" the output is the
    ellipsis, then the letters used once, in alphabetical order (numpy.einsum's implicit
    mode; ONNX Einsum). Raises ShapeError for an equation that does not fit the shapes."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    need(len(terms) == len(shapes), f"equation {equation!r} has {len(terms)} operands, got {len(shapes)} inputs")
    for t in [*terms, rhs]:
        body = t.replace("...", "")
        need(body.isalpha() or body == "", f"equation {equation!r}: {t!r} is not letters and at most one '...'")
        need(t.count("...") <= 1, f"equation {equation!r}: {t!r} has more than one '...'")
    ell = 0
    for t, s in zip(terms, shapes, strict=True):
        named = len(t.replace("...", ""))
        need(len(s) == named if "..." not in t else len(s) >= named,
             f"equation {equation!r}: term {t!r} does not fit an operand of rank {len(s)}")
        ell = max(ell, len(s) - named)
    need(ell <= 10, f"equation {equation!r}: '...' stands for more than 10 axes")
    ell_letters = "".join(str(d) for d in range(ell))
    letters, sizes = [], {}
    for t, s in zip(terms, shapes, strict=True):
        if "..." in t:
            pre, post = t.split("...")
            n_ell = len(s) - len(pre) - len(post)
            t = pre + ell_letters[ell - n_ell:] + post
        letters.append(t)
        for ch, d in zip(t, s, strict=True):
            if ch.isdigit():  # broadcast like numpy's ellipsis
                need(sizes.get(ch, 1) in (1, d) or d == 1, f"equation {equation!r}: '...' axes {s} do not broadcast")
                sizes[ch] = max(sizes.get(ch, 1), d)
            else:
                need(sizes.get(ch, d) == d, f"equation {equation!r}: letter {ch!r} has sizes {sizes.get(ch)} and {d}")
                sizes[ch] = d
    if arrow:
        out = rhs.replace("...", ell_letters) if "..." in rhs else rhs
        need(not ell or "..." in rhs or all(ch not in ell_letters for ch in out),
             f"equation {equation!r}: the output drops the '...' axes")
    else:
        used = "".join(letters)
        out = ell_letters + "".join(sorted(ch for ch in set(used) if not ch.isdigit() and used.count(ch) == 1))
    need(len(set(out)) == len(out), f"equation {equation!r}: the output repeats a letter")
    need(all(ch in sizes for ch in out), f"equation {equation!r}: an output letter is in no operand")
    return letters, out, sizes


def _einsum(ts, a):
    need(1 <= len(ts) <= MAX_EINSUM_OPERANDS, f"takes 1 to {MAX_EINSUM_OPERANDS} operands, got {len(ts)}")
    for i, t in enumerate(ts):
        need_f32(t, f"operand {i}")
    _, out, sizes = parse_einsum(a["equation"], [t.shape for t in ts])
    need(len(sizes) <= MAX_EINSUM_LETTERS, f"equation {a['equation']!r} has {len(sizes)} letters (with '...' axes); "
                                           f"at most {MAX_EINSUM_LETTERS} are supported")
    return TensorType(tuple(sizes[ch] for ch in out))


def _einsum_ref(xs, a):
    letters, out, _ = parse_einsum(a["equation"], [x.shape for x in xs])
    # numpy takes the digit-free spelling: map every letter to one of its own
    names = {ch: chr(ord("A") + i) if i < 26 else chr(ord("a") + i - 26)
             for i, ch in enumerate(dict.fromkeys("".join(letters) + out))}
    spelt = ",".join("".join(names[c] for c in t) for t in letters) + "->" + "".join(names[c] for c in out)
    return np.einsum(spelt, *xs)


def _einsum_kernel(node, ins, target) -> Kernel:
    letters, out, sizes = parse_einsum(node.attrs["equation"], [t.shape for t in ins])
    order = list(out) + [ch for ch in sizes if ch not in out]  # output letters, then the summed ones
    strides = []
    for t, ty in zip(letters, ins, strict=True):
        per = dict.fromkeys(order, 0)
        step = 1
        for ch, d in zip(reversed(t), reversed(ty.shape), strict=True):
            if d != 1 or sizes[ch] == 1:
                per[ch] += step  # a repeated letter walks the diagonal
            step *= d
        strides.append([per[ch] for ch in order])
    pad = 4 * (MAX_EINSUM_LETTERS // 4)
    while len(strides) < MAX_EINSUM_OPERANDS:
        strides.append([0] * len(order))
    n = node.type.num_elements
    summed = math.prod(sizes[ch] for ch in order[len(out):])
    params = (("n", "u32", n), ("n_out", "u32", len(out)), ("letters", "u32", len(order)), ("summed", "u32", summed),
              ("size", f"array<vec4<u32>, {pad // 4}>", [sizes[ch] for ch in order] + [1] * (pad - len(order))),
              *((f"s{i}", f"array<vec4<u32>, {pad // 4}>", s + [0] * (pad - len(s))) for i, s in enumerate(strides)))
    product = " * ".join(f"x{i}[off[{i}]]" for i in range(len(ins)))
    return Kernel(f"einsum{len(ins)}", "einsum.wgsl", elementwise_groups(n), params=params,
                  slots={"PRODUCT": product},
                  bindings=(*(Buffer(f"x{i}") for i in range(len(ins))), Buffer("out", write=True)))


def _einsum_flops(ins, out, a):
    _, _, sizes = parse_einsum(a["equation"], [t.shape for t in ins])
    return len(ins) * math.prod(sizes.values())


op("Einsum", ("x", "*xs"), _einsum, _einsum_ref, attrs=(Attr("equation", "str"),), max_inputs=MAX_EINSUM_OPERANDS,
   doc="numpy.einsum(equation, *operands) of 1 to 3 f32 operands: the output letters index the result, every "
       "other letter is summed over, a letter repeated in one operand takes its diagonal, '...' broadcasts "
       "(https://onnx.ai/onnx/operators/onnx__Einsum.html, "
       "https://numpy.org/doc/stable/reference/generated/numpy.einsum.html)",
   vjp=_INFERENCE, kernel=_einsum_kernel, flops=_einsum_flops)
