"""Plan structure without a GPU: buffers, aliases, dispatches, limits, WGSL templating."""

from __future__ import annotations

import itertools
import math
import re
import struct

import numpy as np
import pytest
from every_op import every_op_graph  # tests/every_op.py

from eggfuse.ir import OPS, DType, Graph, GraphError, LoweringError
from eggfuse.ir.kernel import Buffer
from eggfuse.ir.ops import matmul_kernel as matmul_kernel_module
from eggfuse.ir.ops.attention import ATTENTION_TILE_BYTES, attention_tile_bytes, attention_tiles
from eggfuse.ir.ops.elementwise import broadcast_strides
from eggfuse.ir.ops.matmul_kernel import (
    DEEP_STORAGE,
    GEMV_LONG_K,
    GEMV_MAX_ROWS,
    GEMV_ROW_N,
    GEMV_WIDE_N,
    MATMUL_TILES,
    MATMUL_TILES_96,
    MATMUL_TILES_ALL,
    MATMUL_TILES_DEEP,
    MATMUL_TILES_SMALL,
    MATMUL_TILES_TALL,
    MATMUL_TILES_THREE_QUARTER,
    MATMUL_TILES_WIDE,
    MATMUL_WG,
    THREE_QUARTER_TILE,
    WORKGROUP_STORAGE,
    MatmulTile,
    gemv_bt_cols,
    gemv_bt_rows,
    gemv_select_loads,
    gemv_tile,
    layer_norm_lanes,
    matmul_choice,
    matmul_choice_active,
    matmul_kernel_for,
    matmul_splits,
    matmul_tile,
    matmul_vec4,
    out_vec4,
)
from eggfuse.ir.ops.reductions import reduce_dims
from eggfuse.lowering import DerivedParameter, lower
from eggfuse.lowering.limits import limit_name, split_grid
from eggfuse.lowering.wgsl import binding_header, literal_params, pack_params, render, render_kernel, uniform_form


def matmul_source(variant, epilogue, rms_norm=False, tile=MATMUL_TILES[3], vec4=(False, False)) -> str:
    """The WGSL of a matmul kernel (sizes travel in the uniform; tile and reads as given)."""
    return kernel_source(matmul_kernel_for(variant, epilogue, 64, 64, 64, rms_norm=rms_norm, tile=tile, vec4=vec4,
                                           splits=1))


def kernel_source(k) -> str:
    """The WGSL of a Kernel."""
    return render_kernel(k.body, k.bindings, k.params, k.slots)[0]


def _mlp() -> tuple[Graph, dict[str, int]]:
    g = Graph()
    ids = g.input("ids", [6], DType.U32)
    table = g.parameter("table", [10, 8])
    w = g.parameter("w", [8, 8])
    g.parameter("dead_w", [3, 3])
    x = g.embedding(ids, table)
    h = g.gelu(g.matmul(x, w))
    r = g.reshape(h, [48])
    c = g.constant(np.ones(48, dtype=np.float32))
    out = g.add(r, c)
    g.neg(out)  # dead node
    g.set_outputs([out, r])
    return g, {"x": x, "h": h, "r": r, "out": out}


def test_buffers_kinds_and_identity_alias():
    g, n = _mlp()
    plan = lower(g)
    kinds = [b.kind for b in plan.buffers]
    assert kinds.count("input") == 1 and kinds.count("parameter") == 2 and kinds.count("constant") == 1
    assert set(plan.parameters) == {"table", "w"} and set(plan.unused_parameters) == {"dead_w"} \
        and not plan.unused_inputs
    by_node = {b.node: b.index for b in plan.buffers}
    assert n["r"] not in by_node  # the reshape has no buffer of its own
    assert plan.outputs == [by_node[n["out"]], by_node[n["h"]]]
    assert [t.shape for t in plan.output_types] == [(48,), (48,)]
    assert all(b.size_bytes % 4 == 0 and b.size_bytes >= 4 for b in plan.buffers)
    assert plan.buffers[plan.inputs["ids"]].dtype is DType.U32
    assert plan.index_bounds == {"ids": 10}
    (const_index,) = plan.constants
    assert plan.buffers[const_index].kind == "constant" and plan.constants[const_index].shape == (48,)


def test_one_dispatch_per_live_op_with_bindings_in_order():
    g, n = _mlp()
    plan = lower(g)
    assert len(plan.dispatches) == g.dispatch_count() == 4
    assert [d.op for d in plan.dispatches] == ["Embedding", "MatMul", "Gelu", "Add"]
    by_node = {b.node: b.index for b in plan.buffers}
    add = plan.dispatches[-1]
    (const_index,) = plan.constants
    assert add.inputs == (by_node[n["h"]], const_index)  # the reshape reads h's buffer
    for d in plan.dispatches:
        assert d.output == by_node[d.node] and d.output not in d.inputs
        assert len(d.params) % 16 == 0 and "{{" not in d.source
        assert f"@binding({len(d.bindings)}) var<uniform>" in d.source
        assert d.label.startswith(f"node {d.node} {d.op}(")


def _packed_qkv() -> Graph:
    # QKV weights packed into one derived parameter; wo is packed and also read by a dispatch.
    g = Graph()
    x = g.input("x", [3, 8])
    ws = [g.parameter(name, [4, 8]) for name in ("wq", "wk", "wv", "wo")]
    packed = g.concat(ws, axis=0)
    qkvo = g.matmul_bt(x, packed)
    mixed = g.concat([x, qkvo], axis=1)  # reads an input: a dispatch
    g.set_outputs([mixed, g.matmul_bt(x, ws[3])])
    return g


def test_derived_concat_is_packed_not_dispatched():
    g = _packed_qkv()
    plan = lower(g)
    assert len(plan.dispatches) == g.dispatch_count() == 3
    assert [d.op for d in plan.dispatches] == ["MatMulBT", "Concat", "MatMulBT"]
    (index,) = plan.derived
    assert plan.derived[index] == DerivedParameter(("wq", "wk", "wv", "wo"), 0)
    assert plan.buffers[index].kind == "derived" and plan.buffers[index].shape == (16, 8)
    assert plan.dispatches[0].inputs == (plan.inputs["x"], index)
    kinds = {name: plan.buffers[i].kind for name, i in plan.parameters.items()}
    assert kinds == {"wq": "host", "wk": "host", "wv": "host", "wo": "parameter"}
    bound = {i for d in plan.dispatches for i in d.bindings} | set(plan.outputs)
    assert all(plan.buffers[plan.parameters[n]].index not in bound for n in ("wq", "wk", "wv"))
    assert "derived Concat%5 f32[16,8] (512 B) = Concat(axis=0: wq, wk, wv, wo)" in plan.summary()


def test_derived_concat_that_is_an_output_keeps_its_sources_on_the_device():
    g = Graph()
    a, b = g.parameter("a", [2, 3]), g.parameter("b", [2, 1])
    g.set_outputs([g.concat([a, b], axis=1), a])
    plan = lower(g)
    assert plan.dispatches == [] and g.dispatch_count() == 0
    assert [plan.buffers[plan.parameters[n]].kind for n in ("a", "b")] == ["parameter", "host"]


def test_op_without_kernel_is_named(monkeypatch):
    import dataclasses

    g = Graph()
    g.set_outputs([g.relu(g.input("x", [2]))])
    monkeypatch.setitem(OPS, "Relu", dataclasses.replace(OPS["Relu"], kernel=None))
    with pytest.raises(LoweringError, match=r"op Relu has no kernel \(node 1 Relu\(f32\[2\]\)"):
        lower(g)


def test_limit_names_and_errors():
    assert limit_name("max-storage-buffer-binding-size") == "maxStorageBufferBindingSize"
    assert limit_name("max-compute-workgroups-per-dimension") == "maxComputeWorkgroupsPerDimension"
    g = Graph()
    g.set_outputs([g.sigmoid(g.input("x", [4096]))])
    with pytest.raises(LoweringError, match=r"maxStorageBufferBindingSize = 1024 .*Sigmoid.*f32\[4096\].*run on a "
                                             r"device that binds more"):
        lower(g, {"max-storage-buffer-binding-size": 1024})
    # an f32 weight twice the limit or less: precision='f16' would bind it (GPT-2's 154 MB token table on 128 MiB)
    mm = Graph()
    mm.set_outputs([mm.matmul(mm.input("x", [2, 64]), mm.parameter("w", [64, 32]))])
    with pytest.raises(LoweringError, match=r"buffer 1 \('w', f32\[64,32\]\) of 8192 bytes; if it is a product's "
                                             r"weight whose K is a multiple of 32 .* precision='f16'"):
        lower(mm, {"max-storage-buffer-binding-size": 4096})
    with pytest.raises(LoweringError, match=r"'w', f32\[64,32\]\) of 8192 bytes; run on a device that binds more "
                                             r"\(eggfuse asks for the adapter's limit\)$"):
        lower(mm, {"max-storage-buffer-binding-size": 2048})
    plan = lower(g, {"max-compute-workgroups-per-dimension": 4, "unrelated-limit": 1})
    assert plan.dispatches[0].workgroups == (4, 4, 1)


@pytest.mark.parametrize("groups, limit", [(1, 4), (4, 4), (5, 4), (16, 4), (17, 4), (63, 4), (64, 4),
                                           (65535, 65535), (65536, 65535), (10**6, 1000), (1, 1)])
def test_split_grid_covers_and_respects_the_limit(groups, limit):
    grid = split_grid(groups, limit)
    assert grid is not None and max(grid) <= limit and math.prod(grid) >= groups
    assert math.prod(grid) < groups + grid[0] * grid[1]  # at most one partial z layer
    assert split_grid(limit**3 + 1, limit) is None


@pytest.mark.parametrize("out, a, b, dims, sa, sb", [
    ((7, 13), (7, 13), (7, 13), [1, 1, 1, 91], [0, 0, 0, 1], [0, 0, 0, 1]),
    ((7, 13), (7, 13), (1, 13), [1, 1, 7, 13], [0, 0, 13, 1], [0, 0, 0, 1]),
    ((7, 13), (7, 13), (7, 1), [1, 1, 7, 13], [0, 0, 13, 1], [0, 0, 1, 0]),
    ((7, 13), (13,), (7, 13), [1, 1, 7, 13], [0, 0, 0, 1], [0, 0, 13, 1]),
    ((2, 3, 4, 5, 6), (2, 3, 4, 5, 6), (6,), [1, 1, 120, 6], [0, 0, 6, 1], [0, 0, 0, 1]),
    ((1, 1), (1, 1), (1,), [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]),
])
def test_broadcast_strides(out, a, b, dims, sa, sb):
    assert broadcast_strides(out, a, b) == (dims, sa, sb)
    # the strides address exactly numpy's broadcast
    x, y = np.arange(math.prod(a)).reshape(a), np.arange(math.prod(b)).reshape(b)
    want = np.broadcast_arrays(x, y)
    coords = np.stack(np.unravel_index(np.arange(math.prod(out)), dims), axis=1)
    assert (coords @ np.array(sa) == want[0].ravel()).all()
    assert (coords @ np.array(sb) == want[1].ravel()).all()


def test_broadcast_beyond_rank_4_is_refused():
    with pytest.raises(LoweringError, match="4"):
        broadcast_strides((2, 5, 3, 6, 4), (2, 1, 3, 1, 4), (1, 5, 1, 6, 1))


@pytest.mark.parametrize("x, target, dims, reduced", [
    ((7, 13), (13,), [1, 1, 7, 13], [False, False, True, False]),
    ((7, 13), (7, 1), [1, 1, 7, 13], [False, False, False, True]),
    ((2, 3, 4, 5), (3, 1, 5), [2, 3, 4, 5], [True, False, True, False]),
    ((2, 3, 4, 5), (1,), [1, 1, 1, 120], [False, False, False, True]),
    ((2, 6, 50), (6, 1), [1, 2, 6, 50], [False, True, False, True]),
    ((4, 1, 6), (1, 1, 6), [1, 1, 4, 6], [False, False, True, False]),
    ((3, 4), (3, 4), [1, 1, 1, 12], [False, False, False, False]),
])
def test_reduce_dims_address_the_reduce_to_reference(x, target, dims, reduced):
    assert reduce_dims(x, target) == (dims, reduced)
    # reduce_to.wgsl's indexing, in numpy, against the op's reference
    strides = [math.prod(dims[d + 1:]) for d in range(4)]
    out_dims = [1 if r else d for d, r in zip(dims, reduced, strict=True)]
    red_dims = [d if r else 1 for d, r in zip(dims, reduced, strict=True)]
    offsets = [np.stack(np.unravel_index(np.arange(math.prod(ds)), ds), axis=1) @ np.array(strides)
               for ds in (out_dims, red_dims)]
    values = np.random.default_rng(0).standard_normal(math.prod(x))
    got = values[offsets[0][:, None] + offsets[1][None, :]].sum(axis=1)
    want = OPS["ReduceTo"].reference([values.reshape(x)], {"shape": target})
    np.testing.assert_allclose(got, want.ravel())


def test_reduce_to_beyond_4_alternating_dims_is_refused():
    with pytest.raises(LoweringError, match="reduce_to kernel handles 4"):
        reduce_dims((2, 3, 4, 5, 6), (3, 1, 5, 1))


def test_scatter_add_indices_are_bounded_by_the_vocabulary():
    g = Graph()
    ids = g.input("ids", [5], DType.U32)
    g.set_outputs([g.add_node("ScatterAdd", (ids, g.input("src", [5, 3])), vocab_size=7)])
    assert lower(g).index_bounds == {"ids": 7}


def test_matmul_template_epilogue_and_variants():
    src = matmul_source("BT", ("bias", "Relu", "add", "Gelu"))
    assert "@binding(2) var<storage, read> e0" in src and "@binding(3) var<storage, read> e1" in src
    assert "@binding(4) var<storage, read_write> out" in src and "@binding(5) var<uniform> p" in src
    body = re.search(r"fn epilogue.*?return v;", src, re.S).group(0)
    steps = re.findall(r"^ +v = (.*?);", body, re.M)
    assert steps == ["v + e0[j]", "select(v, 0.0, v < 0.0)", "v + e1[i * p.n + j]", "gelu_erf(v)"]
    # scalar reads by default: quads of the stored rows, A [M,K] and B [N,K] along K
    assert "a[r * p.k + cc]" in src and "b[r * p.k + cc]" in src and "const B_ALONG_K: bool = true;" in src
    at = matmul_source("AT", ())
    assert "a[r * p.m + cc]" in at and "const A_ALONG_K: bool = false;" in at  # A stored [K,M]
    assert src.count("fn gelu_erf") == 1  # helpers included once, not copied
    assert "var<storage, read> w_norm" not in src and "fn stage_a" in src


def test_matmul_template_vec4_reads_and_tiles():
    src = matmul_source("", (), tile=MATMUL_TILES[0], vec4=(True, False))
    assert "var<storage, read> a: array<vec4<f32>>;" in src and "var<storage, read> b: array<f32>;" in src
    assert "return a[(r * p.k + c) / 4u];" in src and "b[r * p.n + cc]" in src
    assert "const BM: u32 = 128u;" in src and "const BK: u32 = 8u;" in src
    # 8x8 outputs as vec4, a column's quads of rows (matmul_kernel.micro_tile_form: cols_ghj on 128x128x8)
    assert len(re.findall(r"^ +var d\d_\d = vec4<f32>\(\);", src, re.M)) == 16
    assert "d0_0 = fma(a0_0, vec4<f32>(b0_0.x), d0_0);\n        d1_0 = fma(a0_0, vec4<f32>(b0_0.y), d1_0);" in src
    assert src.count("= fma(") == 8 * 16  # the K slice unrolled: 8 steps of 16 vec4 FMAs
    assert "if (kg" not in src  # one K group: no split-K reduction, every invocation stores its micro-tile
    small = matmul_source("", (), tile=MATMUL_TILES[-1])
    assert small.count("= fma(") == 8 * 4  # 4 K groups of 8 steps
    # a reduce-scatter: group g adds and stores accumulator g of its 4 (rows 0..3), the others park theirs
    for g in range(4):
        assert f"if (kg != {g}u) {{ tiles[(kg + {3 - g}u) % 4u * 256u + {64 * g}u + t] = c{g}_0; }}" in small
        assert f"if (kg == {g}u) {{ store4(row0, col0, {g}u + ty * 4u, 0u + tx * 4u, c{g}_0); }}" in small
    gemv = matmul_source("AT", ("bias",), tile=matmul_tile(1, 4, 9, "AT"))
    assert "a[cc * p.m + r]" in gemv and "const ROWS: u32 = 1u;" in gemv  # op(A) rows through [K,M]
    assert "{{" not in gemv and "fn stage_x" in gemv


def test_matmul_tile_heuristic():
    # (M, K, N): tile, splits. The walk 128x128 -> 64x64 -> 64x32 stops at the first tile whose
    # workgroups reach 288: a 128-sided tile's tiles alone, the others' times their splits
    # (nearest 384 / tiles, at most 8, at least 72 elements of K each); else the walked tile of the
    # most workgroups, 32x32 among them where M or N is below 64. Then 64x64, 64x32 and 32x64 take
    # their wide micro-tiles where a workgroup walks 256 or more elements of K. A 128x128 pick of one row
    # of tiles (M = 128) takes 64x128 rows (ONE_ROW_BLOCK_TILE: the LM head, measured faster on the H200), a wide
    # 'BT' one 256x128 (WIDE_HEAD_TILE, measured faster on an H100: below),
    # and a 64x64 pick in 2 or more ranges of 256 or more elements of K 64x128 (LONG_K_SPLIT_TILE). A 64x32
    # pick whose 32x64 counterpart cuts as many tiles takes 32x64 (NARROW_ROWS_ON_TIES). A widened
    # 64x64 pick in one range below 384 workgroups takes 64x48 (THREE_QUARTER_TILE) where those stay within 384.
    cases = {
        (4096, 4096, 4096): ("128x128x8", 1),     # 1024 tiles
        (2048, 8, 2048): ("64x64x16", 1),         # 128x128: 256 tiles; 64x64: 1024, K too short to widen
        (1024, 384, 1536): ("64x64x16m8x4", 1),   # 128x128: 96 tiles (not split); 64x64: 384, K 384
        (1024, 384, 1152): ("64x48x16m8x4w192", 1),  # 64x64: 288; 64x48: 384 (THREE_QUARTER_TILE)
        (1024, 384, 1104): ("64x48x16m8x4w192", 1),  # 64x48: 16 x 23 = 368, an edge tile
        (384, 576, 3072): ("64x48x16m8x4w192", 1),   # 64x64: 6 x 48 = 288
        (1024, 384, 1200): ("64x64x16m8x4", 1),   # 64x64: 304; 64x48: 400, past 384
        (1088, 384, 1152): ("64x64x16m8x4", 1),   # 64x64: 306; 64x48: 408
        (1024, 200, 1152): ("64x64x16", 1),       # K too short to widen: stays 64x64
        (1000, 384, 1152): ("64x48x16m8x4w192", 1),  # an edge tile in M: 16 rows of tiles either way
        (960, 384, 1152): ("32x64x16m4x8", 1),    # 64x64: 270 workgroups, below 288: not picked
        (320, 576, 3072): ("64x128x8", 3),        # 64x64: 240 x 2, 288 of K each: a long K (not timed at this M)
        (1024, 384, 384): ("64x64x16", 4),        # 64x64: 96 x 4 = 384, each split 96 of K
        (64, 384, 384): ("32x64x16", 5),          # 32x64: 12 x 5 (at most 384 // 72), ranges of 5, 5, 5, 5, 4 slices
        (512, 1536, 576): ("64x128x8", 8),        # 64x64: 72 x 5, each split 320 of K: a long K (LONG_K_SPLIT_TILE)
        (1024, 1536, 384): ("64x128x8", 8),       # 64x64: 96 x 4, 384 of K each; 64x128: 48 x 8
        (2048, 1536, 384): ("64x128x8", 4),       # 64x64: 192 x 2, 768 of K each (LONG_K_MIN_SPLITS 2); 64x128: 96 x 4
        (1024, 3072, 768): ("64x128x8", 4),       # GPT-2 small's MLP down projection: 64x64: 192 x 2
        (1024, 768, 768): ("64x128x8", 4),        # its attention output projection: 64x64: 192 x 2, 384 of K each
        (256, 1536, 576): ("64x64x16", 8),        # 64x64: 36 x 8, each split 192 of K: too short for it
        (2048, 1536, 100): ("64x64x16m8x4", 6),   # 64x64: 64 x 6, 256 of K each, but N below 128
        (448, 1536, 576): ("64x64x16m8x4", 6),    # 64x128: 35 x 8 = 280 workgroups, below 288
        (768, 1536, 576): ("64x128x8", 6),        # 64x64: 108 x 4, 384 of K each; 64x128: 60 x 6
        (128, 576, 576): ("32x64x16", 8),         # 32x64 (N >= M): 36 x 8 = 288 (at most 8 ranges of 72 or more)
        (128, 1536, 576): ("32x64x16", 8),        # 36 x 8
        (128, 576, 49152): ("64x128x8", 1),       # 128x128: 384 tiles in one row; 64x128: 768
        (255, 576, 49152): ("128x128x8", 1),      # 768 tiles in two rows (256 rows 'BT': WIDE_HEAD_TILE, below)
        (129, 576, 49152): ("128x128x8", 1),
        (128, 40, 36868): ("64x128x8", 1),        # tests/gpu/test_ops.py's row: 289 tiles of 128x128
        (16, 576, 49152): ("32x64x32m4x8", 1),    # no side of 64 along 16 rows: 768 tiles of 32x64, deep (below)
        (16, 576, 576): ("32x32x32", 6),          # 32x64: 9 x 6 = 54; 32x32: 18 x 6 = 108
        (512, 576, 192): ("32x64x16", 8),         # 64x32 and 32x64 both 48 tiles: 32x64 (NARROW_ROWS_ON_TIES)
        (1920, 576, 576): ("32x64x16m4x8", 1),    # 540 tiles either way, K 576: the wide 4x8
        (512, 576, 160): ("64x32x16", 8),         # 64x32: 40 tiles, 32x64: 48 (an edge tile): no tie
        (130, 70, 257): ("32x64x16", 1),          # K below SPLIT_MIN_K (72): no split
        (40, 600, 40): ("32x32x32", 7),           # M and N below 64
        (5, 7, 9): ("32x32x32", 1),
    }
    for (m, k, n), (name, splits) in cases.items():
        tile = matmul_tile(m, k, n)
        assert (tile.name, matmul_splits(tile, m, k, n)) == (name, splits), (m, k, n)
        assert matmul_tile(m, k, n, "AT") == tile  # the variant does not choose, but between 5 and 16 rows
        assert matmul_tile(m, k, n, "BT") == (gemv_tile(m, k, n, "BT") if gemv_bt_rows(m, k, n) else tile)
    # B read [N, K], M of 256 to 1024 padded to no more rows than on 128x128, N of 8192 or more in quads, 250 or more
    # 256x128 tiles, f32 B and no prologue: WIDE_HEAD_TILE, in one K range (measured faster on an H100)
    wide = {(256, 576, 49152): True, (1000, 576, 49152): True, (1024, 2048, 8192): True, (512, 4096, 16384): True,
            (255, 576, 49152): False,   # 767 rows: 128x128 (three rows of tiles)
            (300, 576, 49152): False,   # 512 rows computed on 256x128 against 384 on 128x128
            (2048, 576, 49152): False,  # beyond WIDE_HEAD_MAX_M
            (256, 576, 18432): False,   # 144 tiles of 256x128, below WIDE_HEAD_MIN_WORKGROUPS
            (4096, 576, 1536): False,   # N below WIDE_HEAD_MIN_N (measured slower on 256x128)
            (1024, 768, 50257): False}  # N not a multiple of 4 (measured slower)
    for (m, k, n), takes in wide.items():
        tile = matmul_tile(m, k, n, "BT")
        assert (tile.name, matmul_splits(tile, m, k, n)) == (("256x128x8m16x8", 1) if takes else ("128x128x8", 1)), (
            m, k, n)
        assert matmul_tile(m, k, n, "").name == matmul_tile(m, k, n, "AT").name == "128x128x8"  # B read [K, N]
    # 16 to 32 rows, K of 576 or more, N a multiple of 4, f32 B, no prologue, a widened 32x64 pick (32x64x16m4x8) in
    # one K range: NARROW_HEAD_TILE
    narrow = {(16, 576, 49152): True, (32, 576, 49152): True, (32, 2048, 32000): True, (17, 579, 18444): True,
              (15, 576, 49152): False,  # fewer rows than measured
              (32, 575, 49152): False,  # a shorter K than measured
              (32, 576, 49154): False,  # N not a multiple of 4 (a weight then read as stored, [N, K]: not measured)
              (32, 2048, 8192): False,  # 32x64x16m4x8 in 3 K ranges
              (32, 200, 49152): False,  # K too short to widen: 32x64x16
              (32, 576, 1536): False,   # 32x32x32 in 6 ranges
              (33, 576, 49152): False,  # past NARROW_HEAD_MAX_M (32x64x16m4x8 on two rows of tiles: not measured)
              (1920, 576, 576): False,  # 32x64x16m4x8 in one range, 1920 rows
              (64, 576, 49152): False}  # 64x64x16m8x4
    for (m, k, n), takes in narrow.items():
        tile = matmul_tile(m, k, n)
        assert (tile.name == "32x64x32m4x8" and matmul_splits(tile, m, k, n) == 1) == takes, (m, k, n, tile.name)
        if takes:
            assert matmul_tile(m, k, n, "BT") == matmul_tile(m, k, n, "AT") == tile  # B read either way: one tile
            for flags in (dict(prologue=True), dict(layer_norm=True), dict(quantised=True)):
                assert matmul_tile(m, k, n, "BT", **flags).name == "32x64x16m4x8", (m, k, n, flags)
    # K = 600 in 32-element slices: 19 slices and 8 splits asked, so ranges of 3 slices: 7 of them
    assert matmul_splits(MATMUL_TILES[-1], 40, 600, 40) == 7
    # K = 1056: 33 slices and 8 splits asked, so ranges of 5 slices: 7 of them
    assert matmul_splits(MATMUL_TILES[-1], 40, 1056, 40) == 7
    # 'BT' products of 5 to 16 rows take the GEMV (gemv_bt_rows): up to 8 rows always, up to 16 where B is
    # f32, N <= 1536 and K <= GEMV_LONG_K; never with the LayerNorm prologue (two dispatches there)
    taken = {(m, k, n, q): gemv_bt_rows(m, k, n, q) for m, k, n, q in itertools.product(
        (4, 5, 8, 9, 16, 17), (576, GEMV_LONG_K, GEMV_LONG_K + 1), (1536, 1537, GEMV_WIDE_N + 1), (False, True))}
    assert taken == {(m, k, n, q): 4 < m <= 8 or (8 < m <= 16 and not q and k <= GEMV_LONG_K and n <= 1536)
                     for m, k, n, q in taken}
    assert (matmul_kernel_for("BT", (), 8, 64, 40, quant="q4_1", row_words=12).name
            == "matmul_BT_gemv4x8_blocks2_q4_1_v41")
    assert matmul_kernel_for("BT", (), 9, 64, 40, quant="q4_1", row_words=12).name == "matmul_BT_32x32x32_q4_1_v41"
    assert matmul_tile(8, 576, 1536, "BT").gemv and not matmul_tile(8, 576, 1536, "").gemv
    assert not matmul_tile(8, 576, 1536, "BT", layer_norm=True).gemv
    fused_norm = matmul_kernel_for("BT", (), 8, 576, 1536, layer_norm=True, eps=1e-5)
    assert fused_norm.name.startswith("layer_norm_matmul_BT_32") and fused_norm.name.endswith("_last")
    # in blocks of GEMV_ROW_BLOCK (4) rows up to N = GEMV_WIDE_N, a workgroup for each block of rows and of columns,
    # the columns those of the block's rows; past it one block of all rows
    blocks = {(16, 576, 1536): ("gemv4x8_blocks4", 4 * 1536 // 8), (13, 1023, 37): ("gemv4x4_blocks4", 4 * 10),
              (5, 576, GEMV_WIDE_N): ("gemv4x8_blocks2", 2 * GEMV_WIDE_N // 8),
              (8, 576, GEMV_WIDE_N + 4): ("gemv8x16", (GEMV_WIDE_N + 4 + 15) // 16)}
    for (m, k, n), (name, groups) in blocks.items():
        kernel = matmul_kernel_for("BT", (), m, k, n)
        assert (kernel.name, kernel.groups) == (f"matmul_BT_{name}_v{44 if k % 4 == 0 else 11}", groups), (m, k, n)
        rows = gemv_tile(m, k, n, "BT").bm
        assert kernel.slots["ROWS"] == rows and kernel.slots["ROW_BLOCKS"] == -(-m // rows)
    assert matmul_tile(4, 576, 1536, "BT").bm == matmul_tile(4, 576, 40, "").bm == 4  # one block up to 4 rows
    with matmul_choice(MATMUL_TILES[-1]):  # a tuning sweep's tile is the tiled kernel's, as for more rows
        assert matmul_kernel_for("BT", (), 8, 576, 1536).name.startswith("matmul_BT_32x32x32")
    for m in range(1, GEMV_MAX_ROWS + 1):
        assert matmul_tile(m, 576, 1536, "BT").name == f"gemv{m}x{gemv_bt_cols(m, 576, 1536)}"
        assert matmul_tile(m, 576, 1536, "").name == f"gemv{m}x32"
        assert matmul_splits(matmul_tile(m, 576, 1536), m, 576, 1536) == 1


def test_gemv_columns_follow_m_k_and_n():
    # the H200 measurements of gemv_bt_cols's docstring, one shape each
    assert [gemv_bt_cols(1, k, n) for k, n in ((576, 49152), (384, 384), (1536, 576))] == [16, 8, 1]
    # one row: 1 column of 256 lanes past GEMV_LONG_K (not for the LM head's width)
    assert [gemv_bt_cols(1, k, 576, True) for k in (GEMV_LONG_K, GEMV_LONG_K + 1, 8192)] == [4, 1, 1]
    # one row, K <= GEMV_LONG_K: 8 columns (32 lanes); on blocks from N = GEMV_ROW_N, the gate/up product's 3072
    assert [gemv_bt_cols(1, 576, n) for n in (960, GEMV_ROW_N - 1, GEMV_ROW_N, 3072, 8192)] == [8, 8, 8, 8, 8]
    assert [gemv_bt_cols(1, 576, n, True) for n in (960, GEMV_ROW_N - 1, GEMV_ROW_N, 3072, 8192)] == [4, 4, 8, 8, 8]
    assert gemv_bt_cols(1, 1536, 49152) == 16
    assert [gemv_bt_cols(m, 576, 49152) for m in (2, 3, 4)] == [8, 16, 16]  # the LM head
    assert [gemv_bt_cols(m, 384, 384) for m in (2, 4)] == [8, 8]  # MiniLM's K: one step of 64 lanes too long
    assert [gemv_bt_cols(m, 384, 1536) for m in (2, 3, 4)] == [8, 8, 8]
    assert [gemv_bt_cols(m, 576, 1536) for m in (2, 3, 4)] == [4, 8, 8]
    assert [gemv_bt_cols(3, 576, n) for n in (1535, 3072, 8192, 8193)] == [4, 8, 8, 16]  # 3 rows: 16 past GEMV_WIDE_N
    assert [gemv_bt_cols(m, 1536, 576) for m in (2, 4)] == [4, 4]
    # 5 to 16 rows (gemv_bt_rows): 16 columns past GEMV_WIDE_N, or above 8 rows at N >= 1536 and K <= 576
    assert [gemv_bt_cols(m, 576, 49152) for m in (5, 8)] == [16, 16]
    assert [gemv_bt_cols(m, 576, 1536) for m in (5, 8, 9, 16)] == [8, 8, 16, 16]
    assert [gemv_bt_cols(m, k, n) for m, k, n in ((16, 576, 576), (16, 1024, 1536), (12, 384, 1535))] == [8, 8, 8]
    kernel = matmul_kernel_for("BT", (), 4, 576, 49152)
    assert kernel.name == "matmul_BT_gemv4x16_v44" and kernel.groups == 49152 // 16
    assert kernel.slots["LANES"] == MATMUL_WG // 16
    with matmul_choice(gemv_cols=16):  # bench/matmul.py --gemv-cols: 'BT' GEMVs only
        forced = matmul_kernel_for("BT", (), 2, 576, 1536)
        assert forced.name == "matmul_BT_gemv2x16_v44" and forced.slots["LANES"] == 16
        assert matmul_kernel_for("", (), 2, 576, 1536).name == "matmul_gemv2x32_v44"
    for bad in (3, 128, 0):
        with pytest.raises(LoweringError, match="gemv_cols must be one of"):
            with matmul_choice(gemv_cols=bad):
                pass
    with pytest.raises(LoweringError, match="leaves 2 lanes a column"):
        matmul_kernel_for("BT", (), 1, 576, 1536, tile=MatmulTile(1, 128, 0, gemv=True))
    with pytest.raises(LoweringError, match="0 columns leaves no lanes"):
        matmul_kernel_for("BT", (), 1, 576, 1536, tile=MatmulTile(1, 0, 0, gemv=True))


def test_gemv_loads_without_branches_and_tiled_loads_behind_them():
    # the load forms the H200 measurements chose (matmul_kernel._QUAD_VEC4_SELECT): the GEMV's f32
    # quads of A and B and its quantised quads of B are loaded at a clamped position and dropped by
    # select, with the RmsNorm weights as one vec4 where K % 4 == 0; the tiled kernel keeps its branches
    gemv = kernel_source(matmul_kernel_for("BT", (), 1, 576, 960, rms_norm=True, eps=1e-5))
    assert gemv.count("return select(vec4<f32>(), inside") == 2 and "array<vec4<f32>>;" in _binding(gemv, "w_norm")
    quant = kernel_source(matmul_kernel_for("BT", (), 1, 576, 960, rms_norm=True, eps=1e-5, quant="q4_1",
                                            row_words=90))
    assert quant.count("return select(vec4<f32>(), inside") == 1  # B's; A keeps its branch with blocks
    odd = kernel_source(matmul_kernel_for("BT", (), 1, 577, 9, rms_norm=True, eps=1e-5))
    assert "array<f32>;" in _binding(odd, "w_norm")  # K % 4 != 0: scalar weights
    tiled = kernel_source(matmul_kernel_for("BT", (), 128, 576, 960, rms_norm=True, eps=1e-5, splits=1))
    assert "select(vec4<f32>(), inside" not in tiled and "array<f32>;" in _binding(tiled, "w_norm")


@pytest.mark.parametrize("m, k, n, select", [(4, 576, 49152, False), (4, 576, 1536, False), (4, 384, 1536, True),
                                             (4, 1536, 576, False), (4, 384, 384, True), (4, 576, 576, True),
                                             (2, 576, 49152, True), (1, 576, 49152, True), (3, 576, 1536, False),
                                             (3, 1536, 576, False), (2, 1536, 576, True)])
def test_gemv_select_loads_follow_the_quads_a_chunk_holds(m, k, n, select):
    # gemv_select_loads: the f32 quads of A and B without a branch only where a lane's chunk holds at most
    # 16 quads of A (rows x 2 x steps: 40 for 4 x 576 x 49152 on 16 columns, which took 3.7x the time
    # without the branch on the H200; 18 for 3 x 1536 x 576, 12 for 2 x 1536 x 576); the quantised
    # GEMV's blocks keep the form without a branch
    lanes = MATMUL_WG // gemv_bt_cols(m, k, n)
    assert gemv_select_loads(m, k, lanes) == select
    source = kernel_source(matmul_kernel_for("BT", ("bias",), m, k, n))
    assert source.count("return select(vec4<f32>(), inside") == (2 if select else 0)
    assert source.count("if (r < p.") == (0 if select else 2)
    quant = kernel_source(matmul_kernel_for("BT", (), m, k, n, quant="q4_1", row_words=k // 32 * 5))
    assert quant.count("return select(vec4<f32>(), inside") == 1


def test_gemv_chunk_cap_shortens_chunks(monkeypatch):
    # GEMV_CHUNK_MAX_A_QUADS (an experiment's knob, None by default): 4 rows on 16 columns at K = 576 take
    # one chunk of 5 steps (40 quads of A, behind the branch); capped at 8 quads, chunks of 1 step (8 quads,
    # so without the branch), the kernel looping over 5 of them
    import eggfuse.ir.ops.matmul_kernel as mk

    def kernel():
        return matmul_kernel_for("BT", (), 4, 576, 49152)

    assert kernel().slots["CHUNK"] == 5 and "return select(vec4<f32>(), inside" not in kernel_source(kernel())
    monkeypatch.setattr(mk, "GEMV_CHUNK_MAX_A_QUADS", 8)
    assert kernel().slots["CHUNK"] == 1 and kernel_source(kernel()).count("return select(vec4<f32>(), inside") == 2
    monkeypatch.setattr(mk, "GEMV_CHUNK_MAX_A_QUADS", 2)  # fewer than one step's quads: still one step
    assert kernel().slots["CHUNK"] == 1


def _split_product(m: int, k: int, n: int, rms_norm: bool = False) -> Graph:
    g = Graph()
    a, b = g.input("a", (m, k)), g.parameter("b", (n, k))
    g.set_outputs([g.add_node("FusedRmsNormMatMul", (a, g.parameter("w", (k,)), b), eps=1e-6, variant="BT",
                              epilogue=()) if rms_norm else g.matmul_bt(a, b)])
    return g


def test_a_split_product_adds_its_partial_sums_in_its_one_dispatch(monkeypatch):
    # matmul_kernel.last_split: the workgroup finishing a tile's last K range adds the partial sums (scratch,
    # bound read_write) and stores C (the node's buffer); the tile counters are a buffer of their own, of kind
    # 'counters', which the storage sharing leaves out (zero between dispatches, kept across runs)
    import eggfuse.ir.ops.matmul_kernel as mk
    from eggfuse.lowering import layout

    monkeypatch.setattr(layout, "TRANSPOSE_WEIGHTS", False)  # B as stored ([N, K]; transposed: test_weights_layout)
    monkeypatch.setattr(mk, "LAST_SPLIT_MAX_SUMS", 1 << 30)  # 32x64 tiles in 8 K ranges: 16384 sums a tile
    g = _split_product(64, 576, 192)
    tile = matmul_tile(64, 576, 192, "BT")
    splits = matmul_splits(tile, 64, 576, 192)
    assert splits > 1
    plan = lower(g)
    (d,) = plan.dispatches
    assert d.kernel == f"matmul_BT_{tile.name}_v44_split{splits}_last"
    kinds = [plan.buffers[i].kind for i in d.bindings]
    assert kinds == ["input", "parameter", "intermediate", "counters", "intermediate"]
    scratch, counters = (plan.buffers[i] for i in d.bindings[2:4])
    assert scratch.name.endswith(".scratch") and scratch.size_bytes == 4 * splits * 64 * 192
    tiles = math.ceil(64 / tile.bm) * math.ceil(192 / tile.bn)
    assert (counters.dtype, counters.shape, counters.size_bytes) == (DType.U32, (tiles,), 4 * tiles)
    assert counters.index not in plan.storage and d.writable == (2, 3)
    assert "atomic<u32>" in _binding(d.source, "count") and "atomic<u32>" in _binding(d.source, "part")
    # every partial sum stored and read back as an atomic (naga declares storage buffers without Coherent): a
    # quad's four floats in four planes, every split's quad loaded before the sums, added in the reduction's order
    stored = "atomicStore(&part[at], bitcast<u32>(v));"  # put_part1, by floats
    planes = "atomicStore(&part[3u * plane + q], bitcast<u32>(v.w));"
    assert "put_part4(part_base" in d.source and planes in d.source and "out[at / 4u] = v;" not in d.source
    assert stored not in d.source  # no float-by-float form beside the planes
    assert "atomicLoad(&part[2u * plane + q])" in d.source
    loads = [f"let s{t} = part4({t}u * p.m * p.n + at);" for t in range(splits)]
    added = "let s = " + "(" * splits + "vec4<f32>()" + "".join(f" + s{t})" for t in range(splits)) + ";"
    assert all(x in d.source for x in loads) and added in d.source
    assert d.source.index(loads[-1]) < d.source.index(added)
    odd = lower(_split_product(64, 576, 193)).dispatches[0].source  # N % 4 != 0: the scalar stores
    plain1 = "fn put_part1(at: u32, v: f32) {\n    out[at] = v;"
    assert "put_part1(part_base" in odd and stored in odd and plain1 not in odd and "atomicLoad(&part[" in odd
    # the two-dispatch form stores the same calls into out
    two = lower(_split_product(64, 576, 192), device_barriers=False).dispatches[0].source
    assert "put_part4(part_base" in two and "out[at / 4u] = v;" in two and "atomicStore" not in two
    others = sum(plan.storage_sizes) + sum(b.size_bytes for b in plan.buffers if b.kind == "input" or (
        b.kind == "intermediate" and b.index not in plan.storage))  # (C, a graph output, keeps its own)
    assert plan.memory()["intermediate_bytes"] == others + 4 * tiles  # the counters count as intermediates
    # at WebGPU's default of 8 storage buffers a kernel, a LayerNorm prologue and three epilogue operands leave
    # no room for the partial sums, the counters and C beside them: two dispatches, as before
    ln = Graph()
    x, ops = ln.input("x", (64, 576)), [ln.input(f"r{i}", (64, 192)) for i in range(3)]
    ins = (x, ln.parameter("g", (576,)), ln.parameter("be", (576,)), ln.parameter("w", (192, 576)), *ops)
    ln.set_outputs([ln.add_node("FusedLayerNormMatMul", ins, eps=1e-5, variant="BT", epilogue=("add",) * 3)])
    assert [len(d.bindings) for d in lower(ln).dispatches] == [5, 5]  # 4 + scratch; scratch + 3 + C
    assert [len(d.bindings) for d in lower(ln, {"max-storage-buffers-per-shader-stage": 10}).dispatches] == [10]
    monkeypatch.setattr(mk, "LAST_SPLIT", False)
    assert [d.kernel for d in lower(g).dispatches] == [f"matmul_BT_{tile.name}_v44_split{splits}",
                                                       f"matmul_split{splits}_reduce"]
    monkeypatch.setattr(mk, "LAST_SPLIT", True)
    # on Metal naga's storageBarrier is a threadgroup barrier (Target.device_barriers): two dispatches there
    assert len(lower(g, device_barriers=False).dispatches) == 2
    from types import SimpleNamespace

    from eggfuse.pipeline import device_barriers_for

    on = {b: device_barriers_for(SimpleNamespace(adapter=SimpleNamespace(info={"backend_type": b})))
          for b in ("Vulkan", "D3D12", "OpenGL", "Metal")}
    assert on == {"Vulkan": True, "D3D12": True, "OpenGL": True, "Metal": False}
    # the RmsNorm prologue's row sums come from a row block's first tile: two dispatches there
    rms = lower(_split_product(64, 576, 192, rms_norm=True))
    assert len(rms.dispatches) == 2 and "counters" not in [b.kind for b in rms.buffers]


def _binding(source: str, name: str) -> str:
    return next(line for line in source.splitlines() if f" {name}: " in line and "@binding" in line)


def test_matmul_choice_for_some_shapes_nests():
    # bench/plan_variants.py: a choice for some shapes only; the innermost block covering a shape wins
    heuristic = matmul_kernel_for("BT", (), 1, 576, 960).name
    with matmul_choice(gemv_cols=8, shapes=[(1, 1536, 576)]):
        assert matmul_kernel_for("BT", (), 1, 1536, 576).name == "matmul_BT_gemv1x8_v44"
        assert matmul_kernel_for("BT", (), 1, 576, 960).name == heuristic
        with matmul_choice(gemv_cols=2, shapes=[(1, 576, 960)]):
            assert matmul_kernel_for("BT", (), 1, 576, 960).name == "matmul_BT_gemv1x2_v44"
            assert matmul_kernel_for("BT", (), 1, 1536, 576).name == "matmul_BT_gemv1x8_v44"  # the outer block's
            with matmul_choice(tile=MATMUL_TILES[0], splits=2, shapes=[(256, 384, 256)]):
                # 128x128 tiles in 2 K ranges: 32768 partial sums a tile, so the reduction's dispatch too
                assert [k.name for k in matmul_kernel_for("", (), 256, 384, 256)] == [
                    f"matmul_{MATMUL_TILES[0].name}_v44_split2", "matmul_split2_reduce"]
                assert matmul_kernel_for("BT", (), 1, 576, 960).name == "matmul_BT_gemv1x2_v44"
        with matmul_choice(shapes=[(1, 1536, 576)]):  # a block of no choice: the heuristic's for its shapes
            assert matmul_kernel_for("BT", (), 1, 1536, 576).name == f"matmul_BT_gemv1x{gemv_bt_cols(1, 1536, 576)}_v44"
    assert not matmul_choice_active()
    with matmul_choice(gemv_cols=2, shapes=[np.array([1, 576, 960])]):  # numpy ints are ints
        assert matmul_kernel_for("BT", (), 1, 576, 960).name == "matmul_BT_gemv1x2_v44"
    for bad in ([(1, 2)], [(0, 4, 4)], [(1.0, 4, 4)], [(True, 4, 4)], (1, 1536, 576)):
        with pytest.raises(LoweringError, match="shapes must be"):
            with matmul_choice(gemv_cols=4, shapes=bad):
                pass


def test_matmul_tiles_fit_their_workgroup_memory():
    for t in MATMUL_TILES + MATMUL_TILES_DEEP + MATMUL_TILES_WIDE:
        deep = t in MATMUL_TILES_DEEP
        assert t.ksplit * (t.bm // t.tm) * (t.bn // t.tn) == MATMUL_WG and t.bk % (4 * t.ksplit) == 0
        slices = 2 * t.bk * (t.bm + t.bn)  # floats in workgroup memory
        assert 4 * slices == t.storage <= (DEEP_STORAGE if deep else WORKGROUP_STORAGE)
        square_first = (2, 2) if t.bm == t.bn else (2, 1) if t.bm > t.bn else (1, 2)
        assert t.loads == (square_first if deep else (1, 1)), t
        for side in (t.bm, t.bn):  # every load is of whole quads: no invocation's load is partial
            assert side * t.bk // 4 % MATMUL_WG == 0 or side * t.bk // 4 < MATMUL_WG, t
        group = MATMUL_WG // t.ksplit  # invocations of a K group
        parked = (t.ksplit - 1) * group  # vec4 of one accumulator of every group but the first
        assert parked <= slices // 4, t  # each round parks one accumulator or more
        if t not in MATMUL_TILES_WIDE:
            assert parked * t.tm * t.tn // 4 <= slices // 4, t  # all in one round
        assert t.bm * t.bk // 4 + 2 * t.bm <= slices  # RmsNorm partial sums, row sums and row scales
    for t in MATMUL_TILES_SMALL:  # one K group of wg invocations, whole warps, a row each for the RmsNorm sums
        assert t.ksplit == 1 and (t.bm // t.tm) * (t.bn // t.tn) == t.wg and t.wg % 32 == 0 and t.bm <= t.wg, t
        assert t.loads == (math.ceil(t.bm * t.bk / 4 / t.wg), math.ceil(t.bn * t.bk / 4 / t.wg)), t
        assert t.storage == 8 * t.bk * (t.bm + t.bn) <= DEEP_STORAGE and t.name.endswith(f"w{t.wg}"), t
    for t in MATMUL_TILES_THREE_QUARTER:  # a side of 48: whole warps, K groups dividing the slice, 16 KiB
        assert t.ksplit * (t.bm // t.tm) * (t.bn // t.tn) == t.wg and t.wg % 32 == 0 and t.bm <= t.wg, t
        assert 48 in (t.bm, t.bn) and t.bk % (4 * t.ksplit) == 0 and t.storage <= WORKGROUP_STORAGE, t
        slices = 2 * t.bk * (t.bm + t.bn)
        assert (t.ksplit - 1) * (t.wg // t.ksplit) <= slices // 4 and t.bm * t.bk // 4 + 2 * t.bm <= slices, t
    assert THREE_QUARTER_TILE == MATMUL_TILES_THREE_QUARTER[0] and THREE_QUARTER_TILE.name == "64x48x16m8x4w192"
    for t in MATMUL_TILES_96 + MATMUL_TILES_TALL:  # whole warps, K groups dividing the slice, a row each for RmsNorm
        assert t.ksplit * (t.bm // t.tm) * (t.bn // t.tn) == t.wg and t.wg % 32 == 0 and t.bm <= t.wg, t
        assert t.bk % (4 * t.ksplit) == 0 and t.storage <= DEEP_STORAGE, t
        slices = 2 * t.bk * (t.bm + t.bn)
        assert (t.ksplit - 1) * (t.wg // t.ksplit) <= slices // 4 and t.bm * t.bk // 4 + 2 * t.bm <= slices, t
    assert len({t.name for t in MATMUL_TILES_ALL}) == len(MATMUL_TILES_ALL)  # names pick tiles in sweeps


@pytest.mark.parametrize("storage, tile", [(32768, "256x128x8m16x8"), (24576, "256x128x8m16x8"),
                                           (16384, "128x128x8")])
def test_a_wide_product_takes_the_256_row_tile_where_the_device_offers_its_workgroup_memory(storage, tile):
    # WIDE_HEAD_TILE needs 24 KiB; WebGPU's default limit is 16 KiB, where the 128x128 tile it stands in for runs
    g = Graph()
    x, w = g.input("x", [1024, 64]), g.parameter("w", [8192, 64])  # 512 tiles of 128x128
    g.set_outputs([g.matmul_bt(x, w)])
    plan = lower(g, {"max-compute-workgroup-storage-size": storage})
    (d,) = plan.dispatches
    assert f"_{tile}_" in d.kernel + "_" and matmul_kernel_module.WIDE_HEAD_TILE.storage == 24576, d.kernel


@pytest.mark.parametrize("storage, tile", [(32768, "32x64x32m4x8"), (24576, "32x64x32m4x8"),
                                           (16384, "32x64x16m4x8")])
def test_a_wide_product_of_few_rows_takes_deep_slices_where_the_device_offers_their_workgroup_memory(storage, tile):
    # NARROW_HEAD_TILE needs 24 KiB; at WebGPU's default 16 KiB the 32x64x16m4x8 it stands in for runs
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [32, 576]), g.parameter("w", [49152, 576]))])
    (d,) = lower(g, {"max-compute-workgroup-storage-size": storage}).dispatches
    assert f"_{tile}_" in d.kernel + "_" and matmul_kernel_module.NARROW_HEAD_TILE.storage == 24576, d.kernel


def test_a_wide_product_with_a_prologue_or_quantised_b_keeps_the_128_row_tile():
    # WIDE_HEAD_TILE was measured faster on plain f32 products only (with the RmsNorm prologue slower)
    for flags in (dict(prologue=True), dict(layer_norm=True), dict(quantised=True)):
        assert matmul_tile(256, 576, 49152, "BT", **flags).name == "128x128x8", flags
    g = Graph()
    x, w = g.input("x", [1024, 64]), g.parameter("w", [8192, 64])
    g.set_outputs([g.add_node("FusedRmsNormMatMul", (x, g.parameter("g", [64]), w), eps=1e-6, variant="BT",
                              epilogue=())])
    kernels = [d.kernel for d in lower(g, {"max-compute-workgroup-storage-size": 32768}).dispatches]
    assert len(kernels) == 1 and "_128x128x8_" in kernels[0], kernels


def test_a_wide_products_weight_stored_k_by_n_is_read_as_n_by_k_on_the_256_row_tile():
    # lowering/layout.py: a [K, N] weight of a product on a tile of 128 rows or more is read from a copy stored
    # [N, K], the form WIDE_HEAD_TILE was measured in
    g = Graph()
    g.set_outputs([g.matmul(g.input("x", [1024, 64]), g.parameter("w", [64, 8192]))])
    plan = lower(g, {"max-compute-workgroup-storage-size": 32768})
    (d,) = plan.dispatches
    assert d.kernel.startswith("matmul_BT_256x128x8m16x8_"), d.kernel
    assert [b.shape for b in plan.buffers if b.name == "w.T"] == [(8192, 64)]


def test_the_tiled_kernel_stores_quads_where_n_is_a_multiple_of_4():
    wide, plain, big = MATMUL_TILES_WIDE[1], MATMUL_TILES[3], MATMUL_TILES[0]  # 64x64x16m8x4, 64x64x16, 128x128x8
    assert out_vec4(plain, 384, 1, False) and out_vec4(plain, 384, 4, False) and out_vec4(wide, 384, 1, False)
    assert not out_vec4(plain, 383, 1, False)  # N % 4 != 0
    assert not out_vec4(big, 4096, 1, False)  # 128-row tiles
    assert not out_vec4(wide, 384, 4, False) and out_vec4(plain, 384, 1, True) and not out_vec4(plain, 384, 2, True)
    src = matmul_source("BT", ("bias",), tile=plain, vec4=(True, True))
    assert "var<storage, read_write> out: array<vec4<f32>>;" in src and "out[(i * p.n + j) / 4u] = vec4<f32>(" in src


def test_layer_norm_min_lanes_must_be_a_power_of_two_up_to_256(monkeypatch):
    for name, n in (("LAYER_NORM_MIN_LANES", 383), ("LAYER_NORM_QUAD_MIN_LANES", 384)):
        for bad in (0, 3, 512):
            monkeypatch.setattr(matmul_kernel_module, name, bad)
            with pytest.raises(LoweringError, match=f"{name} must be a power of two"):
                layer_norm_lanes(n)


def test_layer_norm_final_stage_holds_up_to_16_columns_an_invocation():
    # (lanes, units held a lane, columns a unit): quads where N % 4 == 0, single columns otherwise; from 128 lanes
    cases = {1: (128, 1, 1), 384: (128, 1, 4), 2048: (128, 4, 4), 2049: (256, 9, 1), 4096: (256, 4, 4),
             4097: (256, 0, 1), 4100: (256, 0, 4), 383: (128, 3, 1)}
    assert {n: layer_norm_lanes(n) for n in cases} == cases


def test_layer_norm_quads_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(matmul_kernel_module, "LAYER_NORM_QUADS", False)
    assert layer_norm_lanes(384) == (128, 3, 1) and layer_norm_lanes(2048) == (128, 16, 1)


def test_matmul_vec4_follows_the_stored_row_length():
    assert matmul_vec4("", 5, 8, 12) == (True, True)
    assert matmul_vec4("", 8, 5, 12) == (False, True)
    assert matmul_vec4("", 8, 8, 13) == (True, False)
    assert matmul_vec4("AT", 6, 8, 12) == (False, True)  # A [K,M]: rows of M
    assert matmul_vec4("AT", 8, 8, 12, gemv=True) == (False, True)  # GEMV reads op(A) strided
    assert matmul_vec4("BT", 5, 8, 13) == (True, True)  # B [N,K]: rows of K
    assert matmul_vec4("BT", 5, 9, 12) == (False, False)


def test_matmul_dispatch_follows_the_tile():
    g = Graph()
    x = g.input("x", [1, 576])
    g.set_outputs([g.matmul_bt(x, g.parameter("w", [1536, 576])),
                   g.matmul(g.input("y", [1024, 9]), g.parameter("v", [9, 510]))])
    gemv, tiled = lower(g).dispatches
    cols = gemv_bt_cols(1, 576, 1536)
    assert gemv.kernel == f"matmul_BT_gemv1x{cols}_v44" and gemv.workgroups == (1536 // cols, 1, 1)
    assert tiled.kernel == "matmul_32x64x16_v11" and tiled.workgroups == (32 * 8, 1, 1)  # 64x32's 16 x 16 tied


def test_matmul_template_rms_norm_prologue():
    src = matmul_source("BT", ("bias", "add"), rms_norm=True)
    assert "@binding(1) var<storage, read> w_norm" in src and "@binding(2) var<storage, read> b" in src
    assert "@binding(3) var<storage, read> e0" in src and "@binding(4) var<storage, read> e1" in src
    assert "@binding(5) var<storage, read_write> out" in src and "@binding(6) var<uniform> p" in src
    assert src.count("fn stage_a") == 1 and "ss[r] = ss[r] + dot(v, v)" in src
    gemv = matmul_source("BT", (), rms_norm=True, tile=matmul_tile(2, 576, 576, "BT"))
    assert gemv.count("fn stage_x") == 1 and "const ROW_STAT: bool = true" in gemv
    assert "@binding(2) var<storage, read> b" in gemv
    with pytest.raises(LoweringError, match="'AT'"):
        matmul_source("AT", (), rms_norm=True)


def test_render_rejects_unfilled_and_unknown_slots():
    with pytest.raises(LoweringError, match="unfilled"):
        render("unary.wgsl")
    with pytest.raises(LoweringError, match="unknown"):
        render("unary.wgsl", EXPR="v", TYPO=1)


def test_uniform_params_pack_by_wgsl_layout():
    struct_text, data = pack_params((("n", "u32", 3), ("eps", "f32", 2.5), ("k", "u32", 7)))
    assert len(data) == 16 and struct.unpack("<IfI", data[:12]) == (3, 2.5, 7)
    assert struct_text.splitlines() == ["struct Params {", "    n: u32,", "    eps: f32,", "    k: u32,", "}"]
    # a vec4 field is 16-byte aligned: the u32 before it is padded
    _, data = pack_params((("n", "u32", 1), ("d", "vec4<u32>", (2, 3, 4, 5)), ("f", "array<vec4<f32>, 2>", [0.5] * 8)))
    assert len(data) == 64 and struct.unpack("<I12x4I8f", data) == (1, 2, 3, 4, 5, *[0.5] * 8)
    with pytest.raises(LoweringError, match="does not fit in u32"):
        pack_params((("n", "u32", -1),))
    with pytest.raises(LoweringError, match="takes 4 values"):
        pack_params((("d", "vec4<u32>", (1, 2)),))
    with pytest.raises(LoweringError, match="uniform field type"):
        pack_params((("a", "array<f32, 4>", [0.0] * 4),))


def test_params_as_constants_keep_the_uniform_bound_and_each_value_exact():
    params = (("m", "u32", 1024), ("d", "i32", -3), ("eps", "f32", 1e-5))
    head, data = binding_header((Buffer("a"), Buffer("out", write=True)), params, constant=True)
    assert data == pack_params(params)[1]  # the uniform the runtime binds is unchanged
    assert "@group(0) @binding(2) var<uniform> p_bound: Params;" in head
    const = next(line for line in head.splitlines() if line.startswith("const p = Params("))
    m, d, eps = const[len("const p = Params("):-2].split(", ")
    assert (m, d) == ("1024u", "-3i") and eps.endswith("f")
    assert np.float32(float(eps[:-1])) == np.float32(1e-5)  # the literal is the f32's own value
    with pytest.raises(LoweringError, match="uniform field eps: inf has no WGSL literal"):
        binding_header((), (("eps", "f32", float("inf")),), constant=True)
    with pytest.raises(LoweringError, match="uniform field d: type 'vec4<u32>' has no constant form"):
        binding_header((), (("d", "vec4<u32>", (1, 2, 3, 4)),), constant=True)
    with pytest.raises(LoweringError, match="does not fit in u32"):
        binding_header((), (("n", "u32", -1),), constant=True)
    # i32's least value has no literal of its own (2147483648 is past i32): a constant expression instead
    least, _ = binding_header((), (("d", "i32", -(2**31)),), constant=True)
    assert "const p = Params((-2147483647i - 1i));" in least
    # lowering asks literal_params which kernels may take the form: the fields binding_header accepts
    assert literal_params(params) and literal_params((("d", "i32", -(2**31)),)) and literal_params(())
    assert not literal_params((("eps", "f32", float("inf")),)) and not literal_params((("d", "vec4<u32>", (1,) * 4),))
    # the runtime's fallback form is the uniform header, byte for byte
    uniform, _ = binding_header((Buffer("a"), Buffer("out", write=True)), params)
    assert uniform_form(head) == uniform and uniform_form(uniform) is None


def test_every_kernel_renders():
    # A graph using every op; lowering renders every template with all slots filled.
    g = every_op_graph()
    plan = lower(g)
    assert len(plan.dispatches) == g.dispatch_count() and len(plan.derived) == 1  # Concat(w, w2)
    assert all("{{" not in d.source for d in plan.dispatches)


def test_u32_inputs_only_where_a_kernel_reads_them():
    g = Graph()
    with pytest.raises(GraphError, match=r"SumAll.*u32\[4\]"):
        g.sum_all(g.input("ids", [4], DType.U32))


def test_rope_batch_must_split_the_rows():
    g = Graph()
    with pytest.raises(GraphError, match="10 rows do not split into batch=3"):
        g.rope(g.input("x", [10, 8]), 10000.0, head_dim=8, batch=3)


def test_attention_tiles():
    # hd -> (invocations, query rows per workgroup, keys per tile): one vec4 of the output block per
    # invocation, and every tile in the workgroup memory budget (attention.wgsl)
    assert attention_tiles(64) == (256, 16, 16)  # SmolLM2
    assert attention_tiles(32) == (256, 32, 16)  # MiniLM
    assert attention_tiles(8) == (256, 64, 32)
    assert attention_tiles(256) == (256, 4, 4)
    assert attention_tiles(64, 49_152) == (256, 16, 64)  # an H200's 48 KiB: 4x the keys per tile
    assert attention_tiles(32, 49_152) == (256, 32, 64)
    assert attention_tiles(64, 49_152, lambda rows: 9 * 128 // rows) == (256, 16, 64)  # SmolLM2's 128-row prefill
    # MiniLM 8x128: 384 workgroups, enough to fill the GPU
    assert attention_tiles(32, 49_152, lambda rows: 8 * 12 * 128 // rows) == (256, 32, 16)
    for storage in (ATTENTION_TILE_BYTES, 32_768, 49_152):
        for hd in range(1, 257):
            wg, bq, bk = attention_tiles(hd, storage)
            hd4 = math.ceil(hd / 4)
            assert 1 <= bq <= 64 and bq * hd4 <= wg and 4 <= bk <= 64  # attention.wgsl sums 4 keys at a time
            # Q block, K tile (rows padded by a vec4), V tile; weights, lanes' partials, row statistics
            need = 16 * (bq * hd4 + bk * (hd4 + 1) + bk * hd4) + 4 * (bq * bk + bq * (wg // bq) + 3 * bq)
            assert need == attention_tile_bytes(hd, bq, bk, wg) <= storage
            assert bk == 64 or attention_tile_bytes(hd, bq, 2 * bk, wg) > storage  # the largest that fits
    with pytest.raises(LoweringError, match=r"head_dim 256 needs 13488 bytes .* offers 8192"):
        attention_tiles(256, 8192)


def test_attention_refuses_tiles_its_kernel_cannot_take(monkeypatch):
    from eggfuse.ir.ops import attention

    g = Graph()
    q = g.input("q", [20, 64])
    g.set_outputs([g.causal_attention(q, q, q, num_heads=1, num_kv_heads=1, head_dim=64, batch=1)])
    monkeypatch.setattr(attention, "attention_tiles", lambda hd, storage=0, workgroups_at=None:
                        attention.AttentionTiles(256, 16, 2))  # a forced tile, as bench/attention.py forces them
    monkeypatch.setattr(attention, "LANES_MAX_HEAD_DIM", 0)  # attention.wgsl, not attention_lanes.wgsl
    with pytest.raises(LoweringError, match="tiles of a multiple of 4 keys, got 2"):
        lower(g)
    monkeypatch.undo()
    # the last: 16 * (2 * 128 * 17 + 32 * 2 * 16) + 4 * (128 + 2 * 128) bytes (K, V, merge; flags, statistics);
    # the others: 3 lanes, 4 lanes not dividing 6 keys, 32 rows not a multiple of 3 a lane, 512 invocations
    monkeypatch.setattr(attention, "takes_lanes", lambda op, hd, tiles, workgroups: True)  # as bench/attention.py
    bad_split = (r"CausalAttention \(node \d+, q f32\[20, ?64\], 1 heads of 64\): "
                 r"attention_lanes.wgsl cannot take the split")
    for tiles, message in ((attention.LaneTiles(32, 3, 12), bad_split), (attention.LaneTiles(32, 4, 6), bad_split),
                           (attention.LaneTiles(32, 4, 32, 3), bad_split), (attention.LaneTiles(64, 8, 32), bad_split),
                           (attention.LaneTiles(32, 4, 128), "needs 87552 bytes of workgroup memory; this device "
                                                             "offers 16384")):
        monkeypatch.setattr(attention, "lane_tiles", lambda hd, storage=0, rope=False, t=tiles: t)
        with pytest.raises(LoweringError, match=message):
            lower(g)
        assert not attention.lane_split_ok(tiles) or tiles.bk == 128


def _storage_invariants(plan) -> None:
    # Checked from the dispatch list, independently of share_storage_of's walk: every
    # shared intermediate fits its allocation, no dispatch binds one allocation twice, and
    # the lifetimes (first .. last binding dispatch) of buffers sharing one do not overlap.
    span: dict[int, list[int]] = {}
    for i, d in enumerate(plan.dispatches):
        allocs = [plan.storage[b] for b in set(d.bindings) if b in plan.storage]
        assert len(allocs) == len(set(allocs)), f"{d.label} binds one allocation twice"
        for b in d.bindings:
            span.setdefault(b, [i, i])[1] = i
    assert not set(plan.storage) & set(plan.outputs)
    by_alloc: dict[int, list[int]] = {}
    for b, a in plan.storage.items():
        assert plan.buffers[b].kind == "intermediate"
        assert plan.buffers[b].size_bytes <= plan.storage_sizes[a]
        by_alloc.setdefault(a, []).append(b)
    for members in by_alloc.values():
        spans = sorted(span[b] for b in members)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end < start, f"overlapping lifetimes in one allocation: {spans}"


def test_intermediates_with_disjoint_lifetimes_share_allocations():
    g = Graph()
    x = g.input("x", [3, 7])
    w = g.parameter("w", [7, 7])
    h = g.tanh(g.matmul(x, w))
    keep = g.gelu(h)  # read again at the end: alive across the chain
    for _ in range(5):
        h = g.neg(g.add(h, g.mul(h, h)))  # multi-use intermediates
    wide = g.matmul(g.reshape(h, [7, 3]), g.input("y", [3, 11]))  # a larger one after small ones
    g.set_outputs([g.add(g.sum_all(wide), g.sum_all(g.matmul(keep, w))), h])
    plan = lower(g)
    _storage_invariants(plan)
    inter = [b for b in plan.buffers if b.kind == "intermediate"]
    assert len(plan.storage) == len(inter) - 2  # all but the two outputs
    assert len(plan.storage_sizes) <= 5 < len(plan.storage)
    assert sum(plan.storage_sizes) < sum(plan.buffers[b].size_bytes for b in plan.storage)
    assert max(plan.storage_sizes) >= 7 * 11 * 4  # an allocation grew (or was made) for the wide one
    none = lower(g, share_storage=False)
    assert none.storage == {} and none.storage_sizes == []
    assert [d.bindings for d in none.dispatches] == [d.bindings for d in plan.dispatches]


def test_a_dispatch_that_could_overlap_its_predecessor_gets_a_new_allocation():
    g = Graph()
    x = g.input("x", [1, 8])
    h = g.tanh(g.add(g.tanh(x), g.neg(x)))  # the tanh and neg die here: free allocations when K is dispatched
    q = g.matmul(h, g.parameter("wq", [8, 8]))
    k = g.matmul(h, g.parameter("wk", [8, 8]))  # reads h, not q: may run alongside q
    v = g.matmul(h, g.parameter("wv", [8, 8]))
    g.set_outputs([g.add(g.add(q, k), v)])
    plan = lower(g)
    _storage_invariants(plan)
    by_node = {b.node: b.index for b in plan.buffers}
    first_use: dict[int, int] = {}
    for i, d in enumerate(plan.dispatches):
        for b in d.bindings:
            if b in plan.storage:
                first_use.setdefault(plan.storage[b], i)
    order = [d.node for d in plan.dispatches]
    free_before_k = {plan.storage[b] for b in plan.storage
                     if max(i for i, d in enumerate(plan.dispatches) if b in d.bindings) < order.index(k)}
    assert free_before_k  # reuse was possible, and is not taken
    for node in (k, v):  # allocations no earlier dispatch used
        assert first_use[plan.storage[by_node[node]]] == order.index(node)
    # q reads its predecessor's output (h): it reuses an allocation an earlier dispatch used
    assert first_use[plan.storage[by_node[q]]] < order.index(q)


def test_storage_sharing_of_model_and_training_graphs():
    from eggfuse.ir.optim import Adam, step_graph
    from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
    from eggfuse.models.mlp import build_mlp_graph
    from eggfuse.rewrites import optimize

    cfg = LlamaConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                      vocab_size=40, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=16)
    mlp, loss = build_mlp_graph(4, (6, 8, 3))
    graphs = [build_llama_graph(cfg, 5), build_llama_cache_graph(cfg, 3, 16), step_graph(mlp, loss, Adam())]
    for graph in graphs:
        for g in (graph, optimize(graph, extractor="greedy")[0]):
            plan = lower(g)
            _storage_invariants(plan)
            assert len(plan.storage_sizes) < len(plan.storage)


def _wide_concat(n: int = 16, axis: int = 1) -> Graph:
    g = Graph()
    xs = [g.input(f"x{i}", [3, 1 + i % 3] if axis == 1 else [1 + i % 3, 3]) for i in range(n)]
    g.set_outputs([g.concat(xs, axis=axis)])
    return g


@pytest.mark.parametrize("limit, parts", [(32, 1), (17, 1), (16, 2), (8, 3), (4, 6), (2, 16)])
def test_a_concat_binding_too_many_storage_buffers_is_split(limit, parts):
    # maxStorageBuffersPerShaderStage counts the inputs and the output: 16 inputs need 17
    g = _wide_concat()
    plan = lower(g, {"max-storage-buffers-per-shader-stage": limit})
    assert len(plan.dispatches) == parts
    assert all(len(d.bindings) <= limit and d.output == plan.outputs[0] for d in plan.dispatches)
    bound = [i for d in plan.dispatches for i in d.inputs]
    assert bound == [plan.inputs[f"x{i}"] for i in range(16)]  # every input once, in order
    if parts > 1:
        last = min(2 * (limit - 1), 16) - 1
        assert plan.dispatches[1].label.endswith(f"-> f32[3,31] part 2/{parts}: inputs {limit - 1}..{last}")


def test_a_limit_below_one_input_and_the_output_is_refused_with_its_name():
    with pytest.raises(LoweringError, match=r"maxStorageBuffersPerShaderStage = 1 exceeded: kernel concat1_f32 "
                                            r"binds 2"):
        lower(_wide_concat(3), {"max-storage-buffers-per-shader-stage": 1})


def test_a_fused_op_binding_too_many_storage_buffers_says_what_to_do():
    # the residual sum and its LayerNorm stored by one product (a rewrite's op): its LayerNorm stage binds six
    g = Graph()
    x, r = g.input("x", [64, 32]), g.input("r", [64, 64])
    pair = g.add_node("FusedMatMulLayerNormPair", (x, g.parameter("w", [32, 64]), g.parameter("g", [64]),
                                                   g.parameter("b", [64]), g.parameter("bias", [64]), r),
                      eps=1e-5, epilogue=("bias", "add"))
    g.set_outputs([g.add_node("Select", (pair,), index=i) for i in (0, 1)])
    with pytest.raises(LoweringError, match=r"maxStorageBuffersPerShaderStage = 4 exceeded: kernel \S+ binds 6 "
                                            r"storage buffers for node \d+ FusedMatMulLayerNormPair.*; run on a "
                                            r"device that binds more storage buffers per stage .*compile without "
                                            r"that rule \(`eggfuse rules` lists them; --disable-rule NAME"):
        lower(g, {"max-storage-buffers-per-shader-stage": 4})


def test_no_kernel_body_defines_a_helper_twice_through_its_includes():
    # Two helper files that define the same function and reach one kernel through its
    # includes fail only when a pipeline is built; this names the kernel and the function
    # without a GPU, in both include forms (with and without subgroups).
    import re
    from importlib import resources

    from eggfuse.lowering import wgsl

    fn = re.compile(r"^fn (\w+)\s*\(", re.MULTILINE)
    bad = []
    for path in resources.files("eggfuse.shaders").iterdir():
        if not path.name.endswith(".wgsl") or "@compute" not in path.read_text():
            continue
        for sub in (False, True):
            with wgsl.subgroups(sub):
                text = wgsl._expand(path.name, {path.name})
            names = fn.findall(text)
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                bad.append(f"{path.name} (subgroups={sub}): {dup}")
    assert not bad, bad


def test_index_readers_name_the_table_each_index_input_reads():
    # BERT's embeddings with as many positions as hidden columns (BERT-small: 512 and 512): each index input is
    # told the table it indexes, not every parameter with a dimension of that size
    g = Graph()
    ids = [g.input(n, [16], DType.U32) for n in ("ids", "pos", "tt")]
    tables = [g.parameter(n, [v, 512]) for n, v in (("word", 1000), ("posemb", 512), ("type", 2))]
    g.set_outputs([g.add_node("EmbeddingSumLayerNorm", (g.parameter("gamma", [512]), g.parameter("beta", [512]),
                                                        ids[0], tables[0], ids[1], tables[1], ids[2], tables[2]))])
    readers = lower(g).index_readers
    assert {k: v.split(" of ")[1] for k, v in readers.items()} == {
        "ids": "parameter 'word' f32[1000,512]", "pos": "parameter 'posemb' f32[512,512]",
        "tt": "parameter 'type' f32[2,512]"}
    gather = Graph()  # Gather along axis 1 of a [3, 40] parameter: its 40 columns
    gather.set_outputs([gather.add_node("Gather", (gather.parameter("t", [3, 40]), gather.input("i", [2], DType.I32)),
                                        axis=1)])
    assert lower(gather).index_readers == {"i": "Gather (node 2) of parameter 't' f32[3,40]"}


@pytest.mark.parametrize("rows, v, kernel", [(490, 10, "cross_entropy_rows"), (30, 6000, "cross_entropy"),
                                             (300, 12000, "cross_entropy_rows"), (3, 300, "cross_entropy")])
def test_cross_entropy_takes_the_kernel_of_fewer_loop_iterations_and_declares_them(rows, v, kernel):
    # by workgroup, 300 rows of 12000 run 68,100 iterations an invocation (lavapipe gave 9.54 for 9.97 there, the
    # right value at 280 rows: 63,560); by invocation 48,035. A kernel declares its count, so that
    # check_cpu_loops refuses the shapes that neither kernel fits on lavapipe
    from eggfuse.ir.ops.losses import cross_entropy_iterations

    g = Graph()
    z, y = g.input("z", [rows, v]), g.input("y", [rows, v])
    g.set_outputs([g.add_node("CrossEntropyLoss", (z, y))])
    (d,) = [d for d in lower(g).dispatches if d.op == "CrossEntropyLoss"]
    assert d.kernel.split("+")[0] == kernel
    assert d.loop_iterations == min(cross_entropy_iterations(rows, v))
