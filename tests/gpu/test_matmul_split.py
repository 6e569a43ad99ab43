"""Every tile of the tiled matmul kernel (the 16 KiB ones, the deep ones, which load several quads per
invocation and slice, the wide micro-tiles, whose K groups add their sums in rounds, the workgroups of
128 and 64 invocations, and the tiles with a side of 48 on 192 and 96), whole and
split-K across workgroups (ir/ops/matmul_kernel.py: ``matmul_choice``, ``matmul_splits``;
shaders/matmul.wgsl and matmul_split_reduce.wgsl), against the numpy
reference (``eggfuse.ir.evaluate``): the three variants, an epilogue read in the reduction, the RmsNorm
prologue (whose sums of squares the splits add), Q4_1 blocks and the SwiGLU prologue. Shapes leave an edge
tile in M and N, K ranges of whole slices with a short last one, and K not a multiple of 4 (scalar reads)
beside K a multiple of 4 (vec4 reads). Then the heuristic's split on a product of few tiles, a split plan
through the compile cache, and the errors of ``matmul_choice``."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import check_row  # tests/op_table.py
from test_ops import _fused, _matmul, _rms_norm_matmul  # tests/gpu/test_ops.py's row builders
from test_ops_layer_norm_matmul import _row as _ln_row
from test_ops_matmul_rows import _swiglu as _swiglu_final
from test_ops_quant import _qmm, _qswiglu

from eggfuse.ir import Graph, evaluate
from eggfuse.ir.errors import LoweringError
from eggfuse.ir.ops import matmul_kernel
from eggfuse.ir.ops.matmul_kernel import (
    DEEP_STORAGE,
    MATMUL_TILES_ALL,
    MATMUL_TILES_DEEP,
    THREE_QUARTER_TILE,
    WIDE_HEAD_TILE,
    MatmulTile,
    covers,
    matmul_choice,
    matmul_splits,
    matmul_tile,
)
from eggfuse.lowering import lower
from eggfuse.pipeline import compile as compile_graph
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import random_feeds
from eggfuse.runtime import Session


@pytest.fixture(autouse=True)
def _weights_as_stored(monkeypatch):
    # the products read B as the rows store it, the tiled kernel's three variants (the weights the lowering
    # transposes for the tiled kernel, lowering/layout.py, are tests/gpu/test_weights_layout.py's); every tile's
    # split takes the one dispatch (matmul_kernel.last_split, whose bound on the partial sums is
    # test_the_last_split_is_bounded_by_its_partial_sums)
    from eggfuse.lowering import layout

    monkeypatch.setattr(layout, "TRANSPOSE_WEIGHTS", False)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT_MAX_SUMS", 1 << 30)


def _rows(tile):
    m, n = tile.bm + 3, tile.bn + 5
    k = 3 * tile.bk * 3 + 5  # 10 slices, in 3 splits of 4, 4 and 2 (the last slice short); odd: scalar reads
    k4 = 2 * tile.bk * 3 + 4  # a multiple of 4: vec4 reads
    return [
        _matmul("MatMul", m, k, n),
        _matmul("MatMulAT", m, k4, n),
        _matmul("MatMulBT", m, k4, n),
        _fused("BT", m, k, n, ("bias", "add", "Gelu")),
        _rms_norm_matmul("", m, k4, n, ("add",)),
    ]


CASES = [(tile, splits, row) for tile in MATMUL_TILES_ALL for row in _rows(tile)
         for splits in (1, 3)]


def _run_with(tile, splits, row, device):
    # the row's session with the product on ``tile`` in ``splits`` K ranges, checked against the reference
    if tile.storage > device.limits["max-compute-workgroup-storage-size"]:
        pytest.skip(f"{tile.name} needs {tile.storage} bytes of workgroup memory; the device offers less")
    with matmul_choice(tile=tile, splits=splits):
        return check_row(row, device, subgroups=None)


@pytest.mark.parametrize("tile, splits, row", CASES, ids=[f"{t.name}-split{s}-{r.id}" for t, s, r in CASES])
def test_every_tile_whole_and_split_matches_the_reference(tile, splits, row, device):
    session = _run_with(tile, splits, row, device)
    kernels = [d.kernel for d in session.plan.dispatches]
    assert f"_{tile.name}_" in kernels[0], kernels  # the tiled kernel (the reduction has no tile)
    if splits > 1 and row.op == "FusedRmsNormMatMul":  # its row sums: the reduction's (matmul_kernel.last_split)
        assert len(kernels) == 2 and kernels[0].endswith(f"_split{splits}") and "reduce" in kernels[1], kernels
    elif splits > 1:  # the last K range of each tile to finish adds the partial sums
        assert len(kernels) == 1 and f"_split{splits}_last" in kernels[0], kernels
        m, n = session.plan.output_types[0].shape
        (counters,) = [b for b in session.plan.buffers if b.kind == "counters"]
        assert counters.shape == (-(-m // tile.bm) * -(-n // tile.bn),)
    if splits > 1:
        scratch = [b for b in session.plan.buffers if b.name.endswith(".scratch")]
        m, n = session.plan.output_types[0].shape
        rows = m if row.op == "FusedRmsNormMatMul" else 0
        assert len(scratch) == 1 and scratch[0].shape == (splits * (m * n + rows),)
    else:
        assert len(kernels) == 1, kernels


def _vec4_rows(tile):
    # N a multiple of 4 (the output bound as vec4 where matmul_kernel.out_vec4 says so), with an edge tile
    # in M and in N; the epilogue reads a bias and a residual at each quad's four columns
    m, n, k = tile.bm + 3, tile.bn + 4, 2 * tile.bk * 3 + 4
    return [_fused("BT", m, k, n, ("bias", "add", "Gelu")), _matmul("MatMulAT", m, k, n),
            _rms_norm_matmul("BT", m, k, n, ("bias",))]


VEC4_CASES = [(tile, splits, row) for tile in MATMUL_TILES_ALL
              for row in _vec4_rows(tile) for splits in (1, 3)]


@pytest.mark.parametrize("tile, splits, row", VEC4_CASES, ids=[f"{t.name}-split{s}-{r.id}" for t, s, r in VEC4_CASES])
def test_every_tile_stores_quads_where_n_is_a_multiple_of_4(tile, splits, row, device):
    first = _run_with(tile, splits, row, device).plan.dispatches[0]
    # matmul_kernel.out_vec4: not on 128-row tiles, nor for the partial sums of wide tiles or with RmsNorm's row sums
    vec4 = tile.bm != 128 and (splits == 1 or (tile.micro is None and row.op != "FusedRmsNormMatMul"))
    assert ("var<storage, read_write> out: array<vec4<f32>>;" in first.source) == vec4, first.kernel
    assert ("out[(i * p.n + j) / 4u] = vec4<f32>(epilogue(" in first.source) == vec4, first.kernel


def _covered_rows(tile):
    # shapes the tiles cover exactly (matmul_kernel.covers): 2 x 3 tiles, 6 slices of K (3 splits of 2 each)
    m, n, k = 2 * tile.bm, 3 * tile.bn, 6 * tile.bk
    return [_matmul("MatMul", m, k, n), _matmul("MatMulAT", m, k, n), _matmul("MatMulBT", m, k, n),
            _fused("BT", m, k, n, ("bias", "add", "Gelu")), _rms_norm_matmul("", m, k, n, ("add",))]


COVERED_CASES = [(tile, splits, row) for tile in MATMUL_TILES_ALL for row in _covered_rows(tile) for splits in (1, 3)]


@pytest.mark.parametrize("tile, splits, row", COVERED_CASES,
                         ids=[f"{t.name}-split{s}-{r.id}" for t, s, r in COVERED_CASES])
def test_tiles_that_cover_the_matrices_load_and_store_without_checks(tile, splits, row, device, monkeypatch):
    monkeypatch.setattr(matmul_kernel, "MATMUL_INSIDE", "all")
    first = _run_with(tile, splits, row, device).plan.dispatches[0]
    assert covers(tile, *_shape(row), splits)
    assert "tiles cover the matrix exactly, so no quad is outside" in first.source, first.kernel
    assert "if (i >= p.m" not in first.source, first.kernel


_STAGED_TILES = ("128x128x8", "64x64x16", "32x64x16", "32x32x32", "64x64x16m8x4w128", "64x48x16m8x4w192",
                 "32x64x32m4x8", "256x128x8m16x8", "64x128x8", "64x64x32")


def _staged_rows(tile):
    m, n = tile.bm + 3, tile.bn + 5
    return [  # K slices: 8 (ranges of 3, 3, 2 in 3 splits), 7 (3, 3, 1), 1 with a short K, 2
        (_matmul("MatMul", m, 7 * tile.bk + 5, n), (1, 3)),
        (_fused("AT", m, 7 * tile.bk - 4, n, ("bias", "add")), (1, 3)),
        (_rms_norm_matmul("BT", m, 6 * tile.bk + 4, n, ("bias",)), (1, 3)),
        (_ln_row("BT", m, 2 * tile.bk, n), (1,)),
        (_matmul("MatMulBT", m, tile.bk // 2 + 1, n), (1,)),
    ]


STAGED_CASES = [(tile, splits, row) for tile in MATMUL_TILES_ALL if tile.name in _STAGED_TILES
                for row, counts in _staged_rows(tile) for splits in counts]
assert len({t.name for t, _, _ in STAGED_CASES}) == len(_STAGED_TILES), "a tile of _STAGED_TILES is not a tile"


@pytest.mark.parametrize("tile, splits, row", STAGED_CASES,
                         ids=[f"{t.name}-split{s}-{r.id}" for t, s, r in STAGED_CASES])
def test_three_pipeline_stages_match_the_reference(tile, splits, row, device, monkeypatch):
    # PIPELINE_STAGES = 3: two sets of registers loaded two slices ahead, two slices an iteration; ranges of
    # an odd and an even number of slices, one slice, and the prologues, whose row statistics are taken as
    # the quads are loaded (each slice once)
    monkeypatch.setattr(matmul_kernel, "PIPELINE_STAGES", 3)
    session = _run_with(tile, splits, row, device)
    assert "later_a0" in session.plan.dispatches[0].source


def test_pipeline_stages_other_than_2_or_3_are_a_lowering_error(monkeypatch):
    monkeypatch.setattr(matmul_kernel, "PIPELINE_STAGES", 4)
    with pytest.raises(LoweringError, match="PIPELINE_STAGES is 4.*set it to 2 or 3"):
        matmul_kernel.matmul_kernel_for("BT", (), 64, 64, 64, tile=MATMUL_TILES_ALL[0])


def _shape(row):
    m, k, n = (int(v) for v in row.id.split("[")[1].split("]")[0].split(","))
    return m, k, n


@pytest.mark.parametrize("shape, splits, inside", [((64, 32, 64), 3, False),  # 2 slices in 3 ranges: one empty
                                                   ((64, 48, 64), 3, True),
                                                   ((65, 48, 64), 1, False), ((64, 48, 68), 1, False),
                                                   ((64, 40, 64), 1, False)])
def test_a_range_past_k_or_an_edge_tile_keeps_the_checks(shape, splits, inside, device, monkeypatch):
    # a K range that starts at or past K would load its first slice outside A and B; edge tiles in M, N or K
    monkeypatch.setattr(matmul_kernel, "MATMUL_INSIDE", "all")
    tile = next(t for t in MATMUL_TILES_ALL if t.name == "64x64x16")
    m, k, n = shape
    row = _fused("BT", m, k, n, ("bias",))
    assert covers(tile, m, k, n, splits) == inside
    first = _run_with(tile, splits, row, device).plan.dispatches[0]
    assert ("tiles cover the matrix exactly" in first.source) == inside


def test_by_default_only_rms_norm_products_leave_out_the_checks(device, monkeypatch):
    # matmul_kernel.inside_form: measured faster with the RmsNorm prologue only; never the LayerNorm prologue
    tile = next(t for t in MATMUL_TILES_ALL if t.name == "64x64x16")
    m, k, n = 128, 96, 192
    for setting, row, inside in [("rms_norm", _rms_norm_matmul("BT", m, k, n, ("bias",)), True),
                                 ("rms_norm", _fused("BT", m, k, n, ("bias",)), False),
                                 ("none", _rms_norm_matmul("BT", m, k, n, ("bias",)), False),
                                 ("all", _ln_row("BT", m, k, n), False)]:
        monkeypatch.setattr(matmul_kernel, "MATMUL_INSIDE", setting)
        first = _run_with(tile, 1, row, device).plan.dispatches[0]
        assert ("tiles cover the matrix exactly" in first.source) == inside, (setting, row.id)


def test_an_unknown_inside_setting_is_a_lowering_error(monkeypatch):
    monkeypatch.setattr(matmul_kernel, "MATMUL_INSIDE", "yes")
    with pytest.raises(LoweringError, match="MATMUL_INSIDE is 'yes': set 'rms_norm', 'all' or 'none'"):
        matmul_kernel.matmul_kernel_for("BT", (), 64, 64, 64)


def test_the_lm_heads_128_row_tiles_and_the_widest_gemv_read_their_shape_from_the_uniform():
    # matmul_kernel.constant_shape: measured no faster at N = 49152, and 1.23x slower at 64 x 576 x 49152
    wide = matmul_kernel.matmul_kernel_for("BT", (), 64, 576, 49152, splits=1)
    narrow = matmul_kernel.matmul_kernel_for("BT", (), 64, 576, 1536, splits=1)
    assert not wide.constant_params and narrow.constant_params
    g = Graph()  # and lowering keeps the uniform for it
    g.set_outputs([g.matmul_bt(g.input("x", [64, 576]), g.parameter("w", [49152, 576]))])
    source = lower(g, constant_params=True).dispatches[0].source
    assert "var<uniform> p: Params;" in source and "const p = Params(" not in source
    tile = next(t for t in MATMUL_TILES_ALL if t.name == "64x64x16")
    assert matmul_kernel.constant_shape(tile, matmul_kernel.CONSTANT_SHAPES_MAX_N - 1)
    assert not matmul_kernel.constant_shape(tile, matmul_kernel.CONSTANT_SHAPES_MAX_N)
    # nor the tiles of 128 rows: 4096^3 'BT' measured 1.07x slower with constants
    assert not any(matmul_kernel.constant_shape(t, 1536) for t in MATMUL_TILES_ALL if t.bm == 128)
    # nor the GEMV of 4 rows and 16 columns a workgroup (1.50x and 3.36x slower), but its other forms
    gemv = {(m, c): matmul_kernel.matmul_kernel_for("BT", (), m, 576, 1536, tile=MatmulTile(m, c, 0, gemv=True))
            for m, c in ((4, 16), (4, 8), (1, 16))}
    assert [gemv[key].constant_params for key in ((4, 16), (4, 8), (1, 16))] == [False, True, True]


@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("tile", [t for t in MATMUL_TILES_ALL if t.name in ("64x64x16m8x4", "64x48x16m8x4w192",
                                                                            "32x64x16")], ids=lambda t: t.name)
def test_shapes_as_constants_or_uniforms_compute_the_product(tile, constant, device):
    # lower(constant_params=...): the tiled kernel's shape as a WGSL constant (lower_for's default on a GPU) or read
    # from the uniform (its default on a CPU adapter such as this one)
    for row in [_fused("BT", 2 * tile.bm, 6 * tile.bk, 3 * tile.bn, ("bias", "Gelu")),
                _rms_norm_matmul("", tile.bm + 3, 3 * tile.bk + 4, tile.bn + 4, ("add",))]:
        g = Graph()
        g.set_outputs([row.build(g)])
        inputs, params = random_feeds(g, seed=3)
        for splits in (1, 3):
            with matmul_choice(tile=tile, splits=splits):
                plan = lower_for(g, device, constant_params=constant)
            first = plan.dispatches[0].source
            assert ("const p = Params(" in first) == constant
            assert ("var<uniform> p_bound: Params;" in first) == constant
            assert ("var<uniform> p: Params;" in first) != constant
            (got,) = Session(plan, params, device=device).run(inputs)
            (want,) = evaluate(g, inputs, params)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("row", [_qmm("q4_1", 37, 160, 45, ("bias", "add")), _qmm("q4_0", 19, 96, 21, (), rms=True),
                                 _qswiglu("q4_1", 37, 64, 20, ("bias", "Relu"))], ids=lambda r: r.id)
def test_quantised_and_gated_products_split(row, device):
    with matmul_choice(splits=3):
        session = check_row(row, device, subgroups=None)
    first = session.plan.dispatches[0].kernel
    assert first.endswith("_split3") if row.op == "QuantRmsNormMatMul" else "_split3_last" in first, first


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("row", [_qmm("q4_1", 67, 160, 101, ("bias", "add")), _qmm("q4_0", 49, 96, 50, (), rms=True),
                                 _qswiglu("q4_1", 65, 64, 49, ("bias", "Relu"))], ids=lambda r: r.id)
def test_quantised_and_gated_products_on_the_three_quarter_tile(row, splits, device):
    # matmul_tile gives THREE_QUARTER_TILE whatever the prologue or B's format: quantised B, the RmsNorm and
    # SwiGLU prologues on it, edge tiles in M and N
    with matmul_choice(tile=THREE_QUARTER_TILE, splits=splits):
        session = check_row(row, device, subgroups=None)
    assert f"_{THREE_QUARTER_TILE.name}_" in session.plan.dispatches[0].kernel


@pytest.mark.parametrize("row", [_qmm("q4_1", 259, 64, 133, ("bias", "add")), _qmm("q4_0", 257, 96, 130, (), rms=True),
                                 _qswiglu("q4_1", 258, 64, 131, ("bias", "Relu")),
                                 _ln_row("BT", 261, 44, 135, ("bias", "add"), offset=3.0)], ids=lambda r: r.id)
def test_quantised_gated_and_layer_norm_products_on_the_wide_head_tile(row, device):
    # WIDE_HEAD_TILE (256 rows, 16x8 an invocation), forced: matmul_tile gives it to none of these, but a matmul_choice
    # block may: quantised B, the RmsNorm, SwiGLU and LayerNorm prologues on it (256 rows: a row an invocation), edge
    # tiles in M and N
    with matmul_choice(tile=WIDE_HEAD_TILE):
        session = check_row(row, device, subgroups=None)
    assert f"_{WIDE_HEAD_TILE.name}_" in session.plan.dispatches[0].kernel


def test_a_wide_product_takes_the_wide_head_tile_and_matches_the_reference(device):
    # [1000, 36] x [8196, 36]^T with a bias: N of 8192 or more and a multiple of 4, 1000 rows (520 tiles of 128x128
    # reach MIN_WORKGROUPS; 260 of 256x128), so the heuristic's own pick, an edge tile in M and in N, in one K range
    # (lavapipe's 32 KiB hold it)
    from eggfuse.ir.ops.matmul_kernel import matmul_tile

    assert matmul_tile(1000, 36, 8196, "BT") == WIDE_HEAD_TILE
    session = check_row(_fused("BT", 1000, 36, 8196, ("bias",)), device, subgroups=None)
    assert [d.kernel.split("_v")[0] for d in session.plan.dispatches] == [f"matmul_BT_{WIDE_HEAD_TILE.name}"]


def test_a_wide_product_of_few_rows_takes_deep_slices_and_matches_the_reference(device):
    # [17, 579] x [18444, 579]^T with a bias and GELU: 289 tiles of 32x64 in one K range, so the heuristic's
    # NARROW_HEAD_TILE (slices of 32: 19, the last 3 long), an edge tile in M and in N; and with the RmsNorm
    # prologue the 32x64x16m4x8 it stands in for
    from eggfuse.ir.ops.matmul_kernel import NARROW_HEAD_TILE, matmul_tile

    assert matmul_tile(17, 579, 18444, "BT") == NARROW_HEAD_TILE
    session = check_row(_fused("BT", 17, 579, 18444, ("bias", "Gelu")), device, subgroups=None)
    assert [d.kernel.split("_v")[0] for d in session.plan.dispatches] == [f"matmul_BT_{NARROW_HEAD_TILE.name}"]
    session = check_row(_rms_norm_matmul("BT", 17, 579, 18444, ("add",)), device, subgroups=None)
    assert [d.kernel.split("_v")[0] for d in session.plan.dispatches] == ["rms_norm_matmul_BT_32x64x16m4x8"]


def test_the_heuristic_splits_a_product_of_few_tiles(device):
    # [40, 600] x [600, 40]: one 32x32 tile and min(8, 600 // 72) = 8 ranges of K asked, 7 of whole slices; the
    # splits' partial sums and the bias and residual of the epilogue meet in the reduction
    tile = matmul_tile(40, 600, 40, "BT")
    assert tile.name == "32x32x32" and matmul_splits(tile, 40, 600, 40) == 7
    g = Graph()
    x, w = g.input("x", [40, 600]), g.parameter("w", [40, 600])
    y = g.add(g.add(g.matmul_bt(x, w), g.parameter("bias", [40])), g.input("r", [40, 40]))
    g.set_outputs([y, g.matmul_bt(x, w)])  # the product is also an output: stored whole
    inputs, params = random_feeds(g, seed=3)
    compiled = compile_graph(g, params, device=device, cache=False)
    kernels = [d.kernel for d in compiled.plan.dispatches]
    assert sum("_split7_last" in k for k in kernels) >= 1 and not any("_reduce" in k for k in kernels), kernels
    for got, want in zip(compiled.run(inputs), evaluate(g, inputs, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("bounded", [True, False], ids=["as-lowered", "one-dispatch"])
@pytest.mark.parametrize("shape", [(64, 576, 192), (128, 576, 576)])
def test_k_576_takes_eight_ranges_the_last_one_slice(shape, bounded, device, monkeypatch):
    # SPLIT_MIN_K (72): K = 576 in 36 slices of 16 splits into 8 ranges of 5 slices, the last range one slice, on
    # 32x64 tiles. As lowered (the module's fixture undone: weights transposed, the last split bounded by its partial
    # sums) the 8 x 2048 sums a tile take two dispatches; with the bound lifted, one
    if bounded:
        monkeypatch.undo()
    m, k, n = shape
    tile = matmul_tile(m, k, n, "BT")
    assert (tile.name, matmul_splits(tile, m, k, n)) == ("32x64x16", 8)
    session = check_row(_fused("BT", m, k, n, ("bias", "add", "Gelu")), device, subgroups=None)
    kernels = [d.kernel for d in session.plan.dispatches]
    if bounded:
        assert len(kernels) == 2 and "_split8" in kernels[0] and "_last" not in kernels[0], kernels
        assert "reduce" in kernels[1], kernels
    else:
        assert len(kernels) == 1 and "_split8_last" in kernels[0], kernels


def test_the_last_split_leaves_its_counters_zero_run_after_run(device):
    # matmul_kernel.last_split: each tile's counter must be zero again after every dispatch, or the next run
    # would finish a tile before all of its K ranges are in. Three runs of other inputs, each against the
    # reference, through products of two tiles (the second's edge in N) sharing an input and one feeding the
    # other, the first also an output; then a second session of the same plan.
    g = Graph()
    x, r = g.input("x", [37, 600]), g.input("r", [37, 70])
    first = g.matmul_bt(x, g.parameter("w1", [70, 600]))
    second = g.add(g.matmul_bt(g.concat([first, x], axis=1), g.parameter("w2", [70, 670])), r)
    g.set_outputs([second, first])
    with matmul_choice(tile=next(t for t in MATMUL_TILES_ALL if t.name == "32x64x16"), splits=4):
        plan = lower_for(g, device)
    assert sum("_split4_last" in d.kernel for d in plan.dispatches) == 2, [d.kernel for d in plan.dispatches]
    params = random_feeds(g, seed=7)[1]
    counters = [b for b in plan.buffers if b.kind == "counters"]
    assert len(counters) == 2
    for session in (Session(plan, params, device=device), Session(plan, params, device=device)):
        for seed in range(3):
            inputs = random_feeds(g, seed=10 + seed)[0]
            for got, want in zip(session.run(inputs), evaluate(g, inputs, params), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
            for b in counters:  # (with a counter left at SPLITS, every K range would finish its tile)
                np.testing.assert_array_equal(session._read_buffer(b.index, b.type, "the counters"), 0)


@pytest.mark.parametrize("shape", [(37, 600, 70), (64, 576, 192), (33, 1544, 385)])
def test_the_last_split_adds_as_the_reduction_does(shape, device, monkeypatch):
    # the same sums in the same order as matmul_split_reduce.wgsl's: the same floats, bit for bit (both checked
    # against the numpy reference first)
    m, k, n = shape
    row = _fused("BT", m, k, n, ("bias", "Gelu"))
    with matmul_choice(splits=5):
        one = check_row(row, device, subgroups=None)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT", False)
    with matmul_choice(splits=5):
        two = check_row(row, device, subgroups=None)
    assert (len(one.plan.dispatches), len(two.plan.dispatches)) == (1, 2)
    inputs = random_feeds(_graph(row), seed=1)[0]  # the rows' parameters are the same (seeded by the row's id)
    np.testing.assert_array_equal(one.run(inputs)[0], two.run(inputs)[0])


@pytest.mark.parametrize("row, quads", [
    (_fused("BT", 37, 600, 72, ("bias", "Gelu")), True),
    (_matmul("MatMul", 5, 96, 36), True),
    (_fused("", 33, 100, 70, ("add",)), False),  # N not a multiple of 4: floats
    (_rms_norm_matmul("BT", 36, 96, 40, ("add",)), True),  # the row sums' 3 * 36 floats: whole quads
    (_rms_norm_matmul("", 37, 96, 44, ()), False),  # 3 * 37: floats
    (_swiglu_final(False, "BT", 21, 64, 20), True),  # gated: quads of the [M, N / 2] output
    (_swiglu_final(True, "", 40, 96, 24, ("add",)), True),
    (_swiglu_final(True, "BT", 37, 96, 48), False),
    (_swiglu_final(False, "", 40, 100, 33, ("bias", "add")), False),  # an output 33 wide
], ids=lambda r: r.id if hasattr(r, "id") else f"quads{r}")
def test_the_reduction_in_quads_adds_as_in_floats(row, quads, device, monkeypatch):
    # matmul_split_reduce.wgsl with QUADS (a quad of an output row an invocation) against one float an invocation:
    # the same sums in the same order, so the same floats bit for bit (both checked against the numpy reference)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT", False)
    outputs = []
    for on in (True, False):
        monkeypatch.setattr(matmul_kernel, "SPLIT_REDUCE_QUADS", on)
        with matmul_choice(splits=3):
            session = check_row(row, device, subgroups=None)
        (reduce,) = [d for d in session.plan.dispatches if "_split3_reduce" in d.kernel]
        assert ("const QUADS: bool = true;" in reduce.source) == (on and quads), reduce.kernel
        outputs.append(session.run(random_feeds(_graph(row), seed=1)[0])[0])
    np.testing.assert_array_equal(outputs[0], outputs[1])


def _graph(row) -> Graph:
    g = Graph()
    g.set_outputs([row.build(g)])
    return g


def test_a_split_plan_round_trips_through_the_compile_cache(device, tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path))
    g = Graph()
    x, w = g.input("x", [40, 600]), g.parameter("w", [48, 600])
    g.set_outputs([g.relu(g.matmul_bt(x, w))])
    inputs, params = random_feeds(g, seed=4)
    first = compile_graph(g, params, device=device)
    second = compile_graph(g, params, device=device)
    assert (first.cache, second.cache, second.cache_loaded) == ("miss", "hit", ("optimize", "lower"))
    assert second.plan == first.plan
    assert any(b.name.endswith(".scratch") for b in second.plan.buffers)
    np.testing.assert_allclose(second.run(inputs)[0], evaluate(g, inputs, params)[0], rtol=1e-4, atol=1e-4)


def test_scratch_buffers_share_storage_with_other_intermediates():
    g = Graph()
    h = g.input("x", [40, 600])
    for i in range(3):  # three split products in a row: each scratch is free once its product ran
        h = g.tanh(g.matmul_bt(h, g.parameter(f"w{i}", [600, 600])))
    g.set_outputs([h])
    plan = lower(g)
    scratch = [b.index for b in plan.buffers if b.name.endswith(".scratch")]
    assert len(scratch) == 3 and len({plan.storage[i] for i in scratch}) < 3, plan.summary()


def test_matmul_choice_rejects_what_is_not_a_tile_or_a_count():
    with pytest.raises(LoweringError, match="MATMUL_TILES"):
        with matmul_choice(tile="32x32"):
            pass
    with pytest.raises(LoweringError, match="positive"):
        with matmul_choice(splits=0):
            pass


def test_the_heuristic_splits_less_where_the_scratch_would_exceed_the_buffer_limits():
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [512, 1536]), g.parameter("w", [576, 1536]))])
    # a long K: 64x128 tiles (LONG_K_SPLIT_TILE) in 8 ranges of K, 8 x 512 x 576 floats of partial sums, 9 MiB
    tiled = "matmul_BT_64x128x8_v44"
    assert [d.kernel for d in lower(g).dispatches] == [f"{tiled}_split8_last"]
    small = {"max-buffer-size": 4 << 20, "max-storage-buffer-binding-size": 4 << 20}  # w alone is 3.4 MiB
    # 4 ranges take 4.5 MiB, 3 take 3.4
    assert [d.kernel for d in lower(g, small).dispatches] == [f"{tiled}_split3_last"]
    with matmul_choice(splits=5), pytest.raises(LoweringError, match="maxBufferSize"):  # a forced count is kept
        lower(g, small)


def test_compile_skips_the_cache_inside_matmul_choice(device, tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path))
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [40, 600]), g.parameter("w", [48, 600]))])
    params = random_feeds(g, seed=5)[1]
    assert compile_graph(g, params, device=device).cache == "miss"
    with matmul_choice(splits=2):
        forced = compile_graph(g, params, device=device)
    assert forced.cache == "off" and forced.plan.dispatches[0].kernel.endswith("_split2_last")
    assert compile_graph(g, params, device=device).cache == "hit"
    assert forced.plan_dispatches == 1 and forced.dispatches_fused == 1  # the split in one (last_split)


def test_deep_tiles_need_the_workgroup_memory_they_take():
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [40, 600]), g.parameter("w", [48, 600]))])
    assert "_32x32x32_" in lower(g, {"max-compute-workgroup-storage-size": DEEP_STORAGE}).dispatches[0].kernel
    with matmul_choice(tile=MATMUL_TILES_DEEP[-1]):
        assert "_32x32x64_" in lower(g, {"max-compute-workgroup-storage-size": DEEP_STORAGE}).dispatches[0].kernel
        with pytest.raises(LoweringError, match=r"32x32x64 .* needs 32768 bytes of workgroup memory; this device "
                                                r"offers 16384 \(maxComputeWorkgroupStorageSize\): give "
                                                r"matmul_choice a smaller tile"):
            lower(g)
    # a device below WebGPU's guaranteed 16384 bytes: no tile of the heuristic's fits
    with pytest.raises(LoweringError, match=r"offers 8192 \(maxComputeWorkgroupStorageSize\), less than the 16384 "
                                            r"every WebGPU device offers: run on a device that meets WebGPU's limits"):
        lower(g, {"max-compute-workgroup-storage-size": 8192})


def test_the_last_split_is_bounded_by_its_partial_sums(monkeypatch):
    # one dispatch where the last workgroup of a tile adds at most LAST_SPLIT_MAX_SUMS partial sums (K ranges x
    # the tile's outputs), else the reduction's dispatch; the same values either way (bit for bit)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT_MAX_SUMS", 8192)
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [40, 600]), g.parameter("w", [48, 600]))])
    for tile, splits, one in ((MatmulTile(32, 32, 32), 8, True), (MatmulTile(32, 64, 16), 4, True),
                              (MatmulTile(32, 64, 16), 5, False), (MatmulTile(64, 64, 16), 3, False)):
        assert (tile.bm * tile.bn * splits <= 8192) == one
        with matmul_choice(tile=tile, splits=splits):
            kernels = [d.kernel for d in lower(g).dispatches]
        assert kernels == ([f"matmul_BT_{tile.name}_v44_split{splits}_last"] if one else
                           [f"matmul_BT_{tile.name}_v44_split{splits}", f"matmul_split{splits}_reduce"]), kernels


@pytest.mark.parametrize("block", [3, 5, 16])
@pytest.mark.parametrize("row", [_fused("BT", 7, 577, 130, ("bias", "Gelu")),
                                 _rms_norm_matmul("BT", 13, 96, 37, ("add",)), _qmm("q4_1", 7, 64, 9, rms=True)],
                         ids=lambda r: r.id)
def test_the_gemv_in_row_blocks_of_any_size(block, row, device, monkeypatch):
    # the 'BT' GEMV of 5 to 16 rows in blocks of GEMV_ROW_BLOCK rows (4 by default; matmul_kernel.gemv_tile): a block
    # of an odd count pairs its last row with itself and stores it once, the last block reaches past M; 16: one block
    monkeypatch.setattr(matmul_kernel, "GEMV_ROW_BLOCK", block)
    session = check_row(row, device, subgroups=None)
    assert ("_blocks" in session.plan.dispatches[0].kernel) == (block < 7)


FORM_TILES = [MatmulTile(128, 128, 8), MatmulTile(64, 128, 8), MatmulTile(32, 64, 16, micro=(4, 8)),
              MatmulTile(64, 64, 16, micro=(8, 4), wg=128)]
FORM_CASES = [(form, tile, splits) for form in ("rows_hge", "cols_jgh", "cols_ghj", "scalar_hjeg")
              for tile in FORM_TILES for splits in (1, 3)]


@pytest.mark.parametrize("form, tile, splits", FORM_CASES, ids=[f"{f}-{t.name}-split{s}" for f, t, s in FORM_CASES])
def test_every_micro_tile_form_matches_the_reference(form, tile, splits, device, monkeypatch):
    # matmul_kernel.MICRO_TILE_FORM on every tile: the accumulators in rows, columns or single floats, their FMAs
    # in another nesting (and declared in reverse), with an edge tile, a short last slice, a GELU epilogue and
    # an RmsNorm prologue
    monkeypatch.setattr(matmul_kernel, "MICRO_TILE_FORM", form)
    monkeypatch.setattr(matmul_kernel, "MICRO_TILE_FORM_TILES", "all")
    monkeypatch.setattr(matmul_kernel, "MICRO_TILE_DECL_REVERSED", form == "cols_ghj")
    m, n, k = tile.bm + 3, tile.bn + 4, 2 * tile.bk * 3 + 4
    sign = {"rows_hge": "c0_0 = fma(vec4<f32>(a0_0.x), b0_0, c0_0);\n        "
                        "c1_0 = fma(vec4<f32>(a0_0.y), b0_0, c1_0);",
            "cols_jgh": "var d0_0 = vec4<f32>();", "cols_ghj": "var d0_0 = vec4<f32>();",
            "scalar_hjeg": "var s0_0 = 0.0;"}
    for row in (_fused("BT", m, k, n, ("bias", "Gelu")), _rms_norm_matmul("", m, k + 1, n, ("add",))):
        source = _run_with(tile, splits, row, device).plan.dispatches[0].source
        assert sign[form] in source  # the form asked for, not the rule's


def test_the_micro_tile_forms_rule_and_a_bad_setting(monkeypatch):
    # 128x128x8 in columns with the quad of rows outermost, 64x128x8 in columns in one K range only, the others
    # in rows (matmul_kernel.micro_tile_form's measurements)
    form = matmul_kernel.micro_tile_form
    assert form(MatmulTile(128, 128, 8)) == "cols_ghj" and form(MatmulTile(128, 128, 8), 4) == "cols_ghj"
    assert form(MatmulTile(64, 128, 8)) == "cols_jhg" and form(MatmulTile(64, 128, 8), 2) == "rows_geh"
    assert {form(t) for t in MATMUL_TILES_ALL if t not in (MatmulTile(128, 128, 8), MatmulTile(64, 128, 8))} == {
        "rows_geh"}
    monkeypatch.setattr(matmul_kernel, "MICRO_TILE_FORM", "cols")
    assert form(MatmulTile(128, 128, 8)) == "cols_hjg" and form(MatmulTile(64, 64, 16)) == "rows_geh"
    for bad in ("cols_geh", "rows_gg", "diagonal"):
        monkeypatch.setattr(matmul_kernel, "MICRO_TILE_FORM", bad)
        with pytest.raises(LoweringError, match=rf"MICRO_TILE_FORM is '{bad}'.*the form must be None or rows_"):
            form(MatmulTile(64, 64, 16))
