"""attention_lanes.wgsl (ir/ops/attention.py ``lane_tiles``, ``_lanes_kernel``) at ten work splits (the defaults,
one lane, 16 lanes in four merge steps, two and four rows a lane, tiles of one key a lane, more keys a tile
than any row has), every one forced on every row, against the numpy reference (``eggfuse.ir.evaluate``):
FullAttention with and without a key mask (one sequence fully masked), with GQA and a mask together,
FullAttentionPacked, both with masked_rows "zero" (the fully masked sequence's rows zeros), CausalAttention
with GQA, and CausalAttentionRoPE (both pairings, packed or not, positions past 0), which two the kernel takes
though the lowering keeps them on attention.wgsl (LANES_OPS), both also with a left-padded key mask
(masked_rows "zero" and "mean": the rows keeping no key of their own zeros, or the mean of all the sequence's
v rows); sequences shorter than a tile, past a tile and past a row block of the default split; head_dim not a
multiple of 4 (element-wise reads) and 64 (which the lowering takes past LANES_MAX_HEAD_DIM only for many
workgroups, ``takes_lanes``). Then attention.wgsl on the same rows, and the lowering's choice."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from op_table import check_row  # tests/op_table.py
from test_ops import _attention, _attention_rope  # tests/gpu/test_ops.py's row builders

from eggfuse.ir import Graph
from eggfuse.ir.errors import LoweringError
from eggfuse.ir.ops import attention
from eggfuse.ir.ops.attention import LaneTiles, lane_tile_bytes
from eggfuse.lowering import lower

_MASK_37 = [[float(j % 4 != 1) for j in range(37)], [0.0] * 37]
_LEFT_37 = [[float(j >= 5 and j % 4 != 1) for j in range(37)], [0.0] * 37]  # 5 rows left padded, then holes

ROWS = [
    _attention("FullAttention", 4, 2, 8, 2, 37),
    _attention("FullAttention", 2, 2, 32, 2, 37, mask=_MASK_37),
    _attention("FullAttentionPacked", 3, 3, 32, 2, 37, mask=_MASK_37),
    _attention("FullAttentionPacked", 2, 1, 6, 1, 11),
    _attention("CausalAttention", 6, 2, 64, 1, 41),
    _attention("CausalAttention", 2, 1, 6, 2, 9),
    _attention_rope(9, 3, 64, 1, 41, "half", 0, packed=True),
    _attention_rope(4, 2, 8, 2, 37, "adjacent", 3),
    _attention_rope(2, 1, 6, 2, 21, "half", 1000),  # hd 6: element-wise reads, an odd number of pairs
    _attention("FullAttention", 4, 1, 32, 2, 37, mask=_MASK_37),  # GQA and a key mask
    _attention("CausalAttention", 8, 2, 32, 2, 150),  # more rows than a block of the default split
    _attention_rope(8, 2, 32, 1, 150, "half", 0, packed=True),
    # masked_rows "zero": the fully masked sequence's rows are zeros (an exported encoder's bool mask)
    _attention("FullAttention", 4, 2, 32, 2, 37, mask=_MASK_37, masked_rows="zero"),
    _attention("FullAttentionPacked", 3, 3, 6, 2, 37, mask=_MASK_37, masked_rows="zero"),
    _attention("FullAttention", 2, 1, 64, 2, 37, mask=_MASK_37, masked_rows="zero"),
    # causal rows and a key mask: a row keeping no key of its own gives zeros or the mean of all the sequence's v
    _attention("CausalAttention", 4, 2, 32, 2, 37, mask=_LEFT_37, masked_rows="zero"),
    _attention("CausalAttention", 2, 1, 6, 2, 37, mask=_LEFT_37),
    _attention_rope(4, 2, 8, 2, 37, "half", 0, packed=True, mask=_LEFT_37),
    _attention("CausalAttention", 4, 4, 8, 2, 37, mask=_LEFT_37, masked_rows="zero", packed=True),
    # the forms the lowering takes the kernel for past head_dim 32 (takes_lanes): GPT-2's (packed, causal, an i32
    # key mask, rows keeping no key zeros) and BERT's (a key mask, such rows the mean of v)
    _attention("CausalAttention", 2, 2, 64, 2, 37, mask=_LEFT_37, masked_rows="zero", packed=True, mask_dtype="i32"),
    _attention("FullAttention", 2, 2, 64, 2, 37, mask=_MASK_37),
]

#: R rows of L lanes, BK keys a tile, P rows a lane: one lane a row, 4 lanes of 32 rows, 8 lanes with 64-key tiles
#: (more keys than any row here), the default split (64 rows of 2 lanes, 16 keys), the default with RoPE on a
#: 16 KiB device, 4-key tiles of 8 rows (tiles of one key a lane), 16 lanes (four merge steps), two rows a lane
#: at 4 lanes and at the default's 2, and four rows a lane on one lane
TILES = [LaneTiles(16, 1, 16), LaneTiles(32, 4, 32), LaneTiles(16, 8, 64), LaneTiles(64, 2, 16), LaneTiles(32, 2, 16),
         LaneTiles(8, 4, 4), LaneTiles(16, 16, 32), LaneTiles(32, 4, 32, 2), LaneTiles(64, 2, 16, 2),
         LaneTiles(16, 1, 16, 4)]

CASES = [(tiles, row) for tiles in TILES for row in ROWS]


@pytest.mark.parametrize("tiles, row", CASES, ids=[f"{t.rows}x{t.lanes}k{t.bk}p{t.per_lane}-{r.id}" for t, r in CASES])
def test_every_split_matches_the_reference(tiles, row, device):
    hd = int(row.id.split(",hd")[1].split(",")[0])
    forced = mock.patch.multiple(attention, lane_tiles=lambda hd, storage=0, rope=False: tiles,
                                 takes_lanes=lambda op, hd, tiles, workgroups: tiles is not None)
    with forced:
        if lane_tile_bytes(hd, tiles, "RoPE" in row.op) > device.limits["max-compute-workgroup-storage-size"]:
            # more than the device offers (lavapipe's 32 KiB at head_dim 64): the lowering says so
            with pytest.raises(LoweringError, match="bytes of workgroup memory; this device offers"):
                check_row(row, device, subgroups=None)
            return
        session = check_row(row, device, subgroups=None)
    (kernel,) = [d.kernel for d in session.plan.dispatches]
    split = f"{tiles.rows}x{tiles.lanes}k{tiles.bk}" + (f"p{tiles.per_lane}" if tiles.per_lane > 1 else "")
    tags = "(_causal)?(_mask)?(_i32)?(_zero|_mean)?(_rope)?(_packed)?"
    assert re.fullmatch(rf"attention_lanes_hd{hd}_{split}{tags}", kernel), kernel


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_attention_wgsl_on_the_same_rows(row, device):
    with mock.patch.object(attention, "LANES_MAX_HEAD_DIM", 0):
        session = check_row(row, device, subgroups=None)
    (kernel,) = [d.kernel for d in session.plan.dispatches]
    assert kernel.startswith("attention_hd"), kernel


def test_default_split_up_to_the_head_dim_limit_is_one_the_kernel_takes_and_fits_the_memory():
    for storage in (16384, 32768, 49152):
        for rope in (False, True):
            for hd in range(1, attention.LANES_WIDE_MAX_HEAD_DIM + 1):
                tiles = attention.lane_tiles(hd, storage, rope)
                assert tiles is not None and attention.lane_split_ok(tiles), (hd, storage, rope, tiles)
                assert lane_tile_bytes(hd, tiles, rope) <= storage, (hd, storage, rope, tiles)
            assert attention.lane_tiles(attention.LANES_WIDE_MAX_HEAD_DIM + 1, storage, rope) is None
    assert attention.lane_tiles(64, 16384) == LaneTiles(32, 2, 8)  # too few rows for takes_lanes past head_dim 32
    assert attention.lane_tiles(64, 32768) == LaneTiles(64, 2, 16)
    assert attention.lane_tiles(32, 2048) is None  # no split fits: attention.wgsl
    assert attention.lane_tiles(32, 16384) == LaneTiles(64, 2, 16)  # MiniLM, on any device
    assert attention.lane_tiles(32, 16384, rope=True) == LaneTiles(32, 2, 16)  # + 8 KiB of Q block at 64 rows
    assert attention.lane_tiles(32, 49152, rope=True) == LaneTiles(64, 2, 16)
    with mock.patch.object(attention, "LANES_PER_ROW", 3):  # a split the kernel cannot take: attention.wgsl
        assert attention.lane_tiles(32, 49152) is None
    with mock.patch.object(attention, "LANES_PER_ROW", 8):  # 64 rows of 8 lanes are 512 invocations: fewer rows
        assert attention.lane_tiles(32, 49152) == LaneTiles(32, 8, 16)


@pytest.mark.parametrize("op", ["FullAttention", "FullAttentionPacked", "CausalAttention", "CausalAttentionRoPE"])
@pytest.mark.parametrize("hd", [32, 64])
def test_the_lowering_takes_lanes_for_the_measured_ops_up_to_the_head_dim_limit(op, hd):
    if op == "CausalAttentionRoPE":
        row = _attention_rope(2, 1, hd, 1, 9, "half", 0)
    else:
        row = _attention(op, 2, 1, hd, 1, 9)
    g = Graph()
    g.set_outputs([row.build(g)])
    (d,) = lower(g).dispatches  # 2 workgroups: past LANES_MAX_HEAD_DIM too few for attention_lanes.wgsl
    lanes = op in attention.LANES_OPS and hd <= attention.LANES_MAX_HEAD_DIM
    assert d.kernel.startswith("attention_lanes_" if lanes else "attention_hd"), d.kernel


def test_at_head_dim_32_causal_attention_stays_on_attention_wgsl_with_many_workgroups():
    # measured faster there at head_dim 32 (LANES_OPS); the rule past head_dim 32 does not reach below it
    g = Graph()
    g.set_outputs([_attention("CausalAttention", 8, 2, 32, 8, 128).build(g)])
    (d,) = lower(g, {"max-compute-workgroup-storage-size": 49152}).dispatches  # 8 x 8 x 2 = 128 blocks of 64 rows
    assert d.kernel.startswith("attention_hd32"), d.kernel
    assert not attention.takes_lanes("CausalAttention", 32, LaneTiles(64, 2, 16), 10**6)
    assert attention.takes_lanes("CausalAttention", 33, LaneTiles(64, 2, 16), 96)
    assert not attention.takes_lanes("CausalAttention", 65, LaneTiles(64, 2, 16), 96)


@pytest.mark.parametrize("op", ["FullAttention", "FullAttentionPacked", "CausalAttention", "CausalAttentionRoPE"])
@pytest.mark.parametrize("heads, storage", [(12, 49152), (11, 49152), (12, 16384)])
def test_past_head_dim_32_the_lowering_takes_lanes_for_many_workgroups_at_the_full_split(op, heads, storage):
    # head_dim 64, 8 sequences of 64 rows: 8 x heads workgroups of 64 rows; 12 heads give LANES_WIDE_MIN_WORKGROUPS
    # (96), 11 fewer; on a device of 16 KiB of workgroup memory lane_tiles gives 32-row blocks (not measured)
    assert attention.LANES_WIDE_MIN_WORKGROUPS == 96 and attention.LANES_ROWS == 64
    if op == "CausalAttentionRoPE":
        row = _attention_rope(heads, heads, 64, 8, 64, "half", 0)
    else:
        row = _attention(op, heads, heads, 64, 8, 64)
    g = Graph()
    g.set_outputs([row.build(g)])
    (d,) = lower(g, {"max-compute-workgroup-storage-size": storage}).dispatches
    lanes = op in attention.LANES_WIDE_OPS and heads == 12 and storage == 49152
    assert d.kernel.startswith("attention_lanes_hd64_64x2k16" if lanes else "attention_hd64"), d.kernel
    assert d.workgroups[0] * d.workgroups[1] * d.workgroups[2] >= 8 * heads
