"""The matmul family's kernel: MatMul, MatMulAT, MatMulBT, FusedMatMul, FusedRmsNormMatMul and FusedSwiGLUMatMul
on two WGSL kernels chosen per problem size (the ops' blocks are in :mod:`.matmul`).

- ``matmul.wgsl``, tiled: a workgroup of 256 invocations (fewer for the last two tables below) computes a BM x BN
  tile of C
  (:data:`MATMUL_TILES`: 128x128 with an 8x8 register micro-tile per invocation, down to
  32x32 with 4x4 micro-tiles and K split over 4 groups of invocations; :data:`MATMUL_TILES_WIDE`:
  the same sides with 8x4, 4x8 or 8x8 micro-tiles and more K groups; :data:`MATMUL_TILES_SMALL`:
  workgroups of 128 or 64 invocations, one K group each; :data:`MATMUL_TILES_THREE_QUARTER`: a side of 48,
  192 or 96 invocations), walking K in
  slices staged, double-buffered, in workgroup memory (A transposed, so the inner product
  reads vec4 of A and of B); the inner product is unrolled here, in Python.
  A product of few tiles splits K across workgroups as well (:func:`matmul_splits`): the
  tiled kernel then writes each K range's partial sums into the node's scratch buffer, and the
  workgroup that finishes a tile's last K range adds them and applies the epilogue (:func:`last_split`;
  after the RmsNorm prologue, with a final step, or where one kernel would bind too many buffers, a second
  dispatch, ``matmul_split_reduce.wgsl`` or the final stage, does).
- ``matmul_gemv.wgsl``, for M <= 4 (decode), and 'BT' products of up to 16 rows
  (:func:`gemv_bt_rows`): a workgroup computes a block of output
  columns for every row (or, past 4 rows, for a block of GEMV_ROW_BLOCK rows); its invocations split K and reduce
  in workgroup memory.

Both read their operands a quad (4 consecutive elements of a stored row) at a time: as
one ``vec4`` load when the stored row length is a multiple of 4, as four bounds-checked
scalar loads otherwise. The specialisation (template) is on variant, epilogue, prologue,
tile and vec4-ness, and for the 'BT' GEMV on the chunk (how many steps of K a lane loads at
once, up to GEMV_MAX_CHUNK: one to eight pipelines per form); sizes travel in the uniform, so
one pipeline serves every shape that picks the same specialisation. The tile heuristic is
:func:`matmul_tile`, the split-K count :func:`matmul_splits`; :func:`matmul_choice` overrides both
for tuning sweeps.

On an NVIDIA H200 through Vulkan (bench/matmul.py, bench/results/matmul_h200.json) the
4096^3 fp32 product runs at 35 TFLOP/s, 0.67x cuBLAS with TF32 off (the former 64x64
kernel: 3.2 TFLOP/s), and the M = 1 GEMV of SmolLM2's LM head at 3.8 TB/s (0.91x cuBLAS's time).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import DeviceLimitError, LoweringError
from ..kernel import COUNTERS, SCRATCH, Buffer, Include, Kernel, atomic_quad_planes, elementwise_groups

#: Epilogue steps that read an operand: ``bias`` reads operand[j] ([N] or [1,N]), ``add``
#: operand[i,j] ([M,N]).
EPILOGUE_BINARY = ("bias", "add")

#: Invocations per workgroup of both matmul kernels (the WebGPU default limit
#: maxComputeInvocationsPerWorkgroup), but for the tiles of MATMUL_TILES_SMALL and MATMUL_TILES_THREE_QUARTER
#: (``MatmulTile.wg``).
MATMUL_WG = 256
#: Largest M that takes the GEMV kernel in every variant (its accumulators are per row, in registers), and
#: the row count the rewrite rules that depend on the kernel (the LayerNorm and SwiGLU prologues) assume;
#: 'BT' products of up to GEMV_BT_MAX_ROWS may take it too (:func:`gemv_bt_rows`). At 8 and 16 rows it was
#: slower than the tiled kernel at every LLM shape of ``bench/matmul.py`` on the H200, with any column
#: count (bench/results/gemv_rows_h200/, ``--set ...GEMV_MAX_ROWS=8|16``): 8 x 576 x 1536 13.7 us against
#: 9.8, 8 x 576 x 49152 262.6 against 83.5, 16 x 576 x 576 14.4-26.1 against 6.8; MiniLM's 8-row pooling
#: product as a GEMV made its plan 1228-1230 us GPU against 1218-1222. That was the loop over the rows' lane
#: sums, whose run-time index into the accumulators cost most from 4 rows (GEMV_UNROLL_MIN_ROWS); unrolled,
#: the GEMV beat the tiled kernel at 8 rows (bench/results/gemv_rows_h100/, :func:`gemv_bt_rows`).
GEMV_MAX_ROWS = 4
#: Most rows of a 'BT' product (B stored [N,K], the LLM layout) that the GEMV kernel may take beyond
#: GEMV_MAX_ROWS (:func:`gemv_bt_rows`); the rewrite rules that depend on which kernel a product gets (the
#: LayerNorm and SwiGLU prologues) keep GEMV_MAX_ROWS.
GEMV_BT_MAX_ROWS = 16
#: Workgroups a tiled product should give, counting split-K (:func:`matmul_tile`,
#: :func:`matmul_splits`): about three per multiprocessor of an H100/H200 (132 of them), so
#: that each has another workgroup to run while one waits for its loads.
TARGET_WORKGROUPS = 384
#: Bytes of workgroup memory every WebGPU device offers (maxComputeWorkgroupStorageSize).
WORKGROUP_STORAGE = 16384


@dataclass(frozen=True)
class MatmulTile:
    """The work of one workgroup: ``bm`` x ``bn`` outputs, K staged ``bk`` at a time.

    Tiled kernel (``gemv`` False): the ``wg`` invocations (256 but for MATMUL_TILES_SMALL and
    MATMUL_TILES_THREE_QUARTER) form ``ksplit`` groups of
    (bm/tm) x (bn/tn), each invocation owning a tm x tn micro-tile (tm, tn = 8 for a side
    of 128, else 4); group g computes K slice elements [g, g+1) * bk/ksplit, and the
    groups' sums are added at the end (split-K inside the workgroup, for small tiles).
    bk * (bm + bn) * 2 buffers * 4 bytes (``storage``) fits WORKGROUP_STORAGE (MATMUL_TILES) or
    DEEP_STORAGE (MATMUL_TILES_DEEP); each invocation loads ``loads`` quads of A and of B per
    slice. GEMV (``gemv`` True): bm is M (1..4), bn the output columns per workgroup, bk unused (0).
    ``micro`` (tm, tn) sets the micro-tile (4, 8 or 16 each, MATMUL_TILES_TALL's 16) instead of 8 for a side
    of 128 and 4 otherwise (MATMUL_TILES_WIDE).
    """

    bm: int
    bn: int
    bk: int
    gemv: bool = False
    micro: tuple[int, int] | None = None
    wg: int = MATMUL_WG

    @property
    def tm(self) -> int:
        return self.micro[0] if self.micro else 8 if self.bm == 128 else 4

    @property
    def tn(self) -> int:
        return self.micro[1] if self.micro else 8 if self.bn == 128 else 4

    @property
    def ksplit(self) -> int:
        return self.wg * self.tm * self.tn // (self.bm * self.bn)

    @property
    def loads(self) -> tuple[int, int]:
        """Quads of A and of B each of the ``wg`` invocations loads per K slice (tiled kernel)."""
        return math.ceil(self.bm * self.bk / 4 / self.wg), math.ceil(self.bn * self.bk / 4 / self.wg)

    @property
    def storage(self) -> int:
        """Bytes of workgroup memory the tiled kernel takes: two slices of A and of B."""
        return 0 if self.gemv else 2 * 4 * self.bk * (self.bm + self.bn)

    @property
    def name(self) -> str:
        if self.gemv:
            return f"gemv{self.bm}x{self.bn}"
        return (f"{self.bm}x{self.bn}x{self.bk}" + (f"m{self.tm}x{self.tn}" if self.micro else "")
                + (f"w{self.wg}" if self.wg != MATMUL_WG else ""))


#: Every tile shape of the tiled kernel, from the most reuse per loaded element to the
#: most workgroups per output: 128x128 (8x8 per invocation), 128x64 / 64x128 (8x4),
#: 64x64 (4x4), 64x32 / 32x64 (4x4, K split in 2), 32x32 (4x4, K split in 4).
MATMUL_TILES = (MatmulTile(128, 128, 8), MatmulTile(128, 64, 8), MatmulTile(64, 128, 8), MatmulTile(64, 64, 16),
                MatmulTile(64, 32, 16), MatmulTile(32, 64, 16), MatmulTile(32, 32, 32))
_TILE_BY_SIDES = {(t.bm, t.bn): t for t in MATMUL_TILES}

#: Workgroup memory the deep tiles take at most (MATMUL_TILES_DEEP); lavapipe offers 32 KiB, the
#: H200's Vulkan driver 48 KiB.
DEEP_STORAGE = 32768
#: The tiles of MATMUL_TILES with K slices twice as deep (the deepest power of two whose slices
#: fit DEEP_STORAGE): half the slices, so half the barriers and rounds of global loads over a K
#: range, each invocation loading up to two quads of each operand per slice (``loads``). Only through
#: :func:`matmul_choice`, on devices with the workgroup memory (``bench/matmul.py --sweep`` times
#: them): on the H200, with a heuristic that took the deep tile of the sides it picks, whole plans
#: were slower than with MATMUL_TILES, MiniLM 8 x 128 2.06 ms against 1.64 and SmolLM2's prefill
#: 4.76 against 3.95 (bench/results/matmul_deep_h200/, ``bench/models.py`` in back-to-back runs),
#: so :func:`matmul_tile` never takes them.
MATMUL_TILES_DEEP = tuple(MatmulTile(t.bm, t.bn, t.bk * 2 ** int(math.log2(DEEP_STORAGE // t.storage)))
                          for t in MATMUL_TILES)
#: Tiles of MATMUL_TILES' sides with wider micro-tiles, so K groups inside the workgroup: an
#: invocation's 4x4 micro-tile reads two vec4 of workgroup memory per 16 FMAs, its 8x8 one four
#: per 64, halving the workgroup-memory traffic per FMA at the cost of the groups' final sum
#: (in rounds through the slices' memory: :func:`_group_sums`). 64x64x16m8x8: 4 groups of 64
#: invocations, each 4 elements of every K slice. Only through :func:`matmul_choice` unless
#: :func:`matmul_tile` takes them.
MATMUL_TILES_WIDE = (MatmulTile(64, 64, 16, micro=(8, 8)), MatmulTile(64, 64, 16, micro=(8, 4)),
                     MatmulTile(64, 64, 16, micro=(4, 8)), MatmulTile(64, 32, 16, micro=(8, 4)),
                     MatmulTile(32, 64, 16, micro=(4, 8)), MatmulTile(128, 64, 8, micro=(8, 8)),
                     MatmulTile(64, 128, 8, micro=(8, 8)), MatmulTile(32, 32, 32, micro=(4, 8)))
#: Tiles of fewer invocations (``wg`` 128 or 64), each computing its micro-tile over the whole K slice
#: (one K group, no final sum): the layouts of cuBLAS's fp32 SIMT kernels on an H200 (64x64 tiles of 128
#: threads, 8x4 outputs each; 128x64 of 128 threads, 8x8 each), which hold half the accumulator registers of
#: the wide tiles of the same sides (whose K groups each hold a copy), so more tiles fit an SM. 128x64x16m8x8w128
#: takes 24 KiB of workgroup memory (more than WORKGROUP_STORAGE). Only through :func:`matmul_choice`: on an
#: H200 (``bench/matmul.py --sweep`` at 13 MiniLM, SmolLM2 and 4096^3 shapes beside the tiles the heuristic
#: takes, 1, 2 and 4 splits, bench/results/long_k_h200/sweep_small_wg.json) 64x64x16m8x4w128 was the fastest
#: configuration at one shape, 512 x 1536 x 576 (5 splits, 42.8 us against 45.6 for the best 256-invocation
#: tile), and beat the heuristic's pick (but not the fastest) at 1024 x 1536 x 384 (50.4 against 54.1) and
#: 512 x 576 x 1536 (42.1 against 44.3); at 1024 x 384 x 1536 it took 46.7 against 42.7 on 64x64x16m8x4, and
#: 128x64x8m8x8w128, cuBLAS's layout there, did not reach the ten fastest. MiniLM's plan with its down
#: projection on it (4 splits) took 1190.7 us GPU and with its three 64x64 products on it 1241.4, against
#: 1202.5 on the picks before and 1165.8 with LONG_K_SPLIT_TILE (long_k_h200/down_minilm.json). A tile's
#: rows must not outnumber its invocations (the RmsNorm prologue's row sums take one invocation a row).
MATMUL_TILES_SMALL = (MatmulTile(64, 64, 16, micro=(8, 4), wg=128), MatmulTile(64, 64, 16, micro=(4, 8), wg=128),
                      MatmulTile(128, 64, 8, micro=(8, 8), wg=128), MatmulTile(64, 128, 8, micro=(8, 8), wg=128),
                      MatmulTile(128, 64, 16, micro=(8, 8), wg=128), MatmulTile(64, 64, 16, micro=(8, 8), wg=64),
                      MatmulTile(64, 32, 16, micro=(8, 4), wg=64), MatmulTile(32, 64, 16, micro=(4, 8), wg=64))
#: Tiles with a side of 48 (192 or 96 invocations): three quarters of a 64x64 tile's work, so that a product
#: whose 64x64 tiles leave a partial round of the workgroups resident on the multiprocessors (1024 x 384 x 1152
#: gives 288: 24 of an H200's 132 multiprocessors run three, the rest two) spreads evenly instead. The first is
#: THREE_QUARTER_TILE, which :func:`matmul_tile` takes; on an H200 (``bench/matmul.py --sweep``,
#: bench/results/three_quarter_h200/sweep_tq.json, 14 MiniLM, SmolLM2 and table shapes of M = 128 to 1024) the
#: others were the fastest configuration at two shapes, 64x48x16w192 in 8 ranges at 256 x 1536 x 576 (27.0 us
#: against 29.8 for the heuristic's pick) and 48x64x16w192 in 4 at 512 x 576 x 576 (21.3 against 22.3).
MATMUL_TILES_THREE_QUARTER = (MatmulTile(64, 48, 16, micro=(8, 4), wg=192),
                              MatmulTile(48, 64, 16, micro=(8, 4), wg=192),
                              MatmulTile(64, 48, 16, wg=192), MatmulTile(48, 64, 16, wg=192),
                              MatmulTile(64, 48, 16, micro=(8, 4), wg=96), MatmulTile(48, 64, 16, micro=(8, 4), wg=96))
#: Tiles sized so that a product's workgroups fill whole waves of the multiprocessors where the tables above
#: leave a partial one: a side of 96 (128x96 with 8x8 per invocation in 192 invocations, three quarters of a
#: 128x128 tile's work: SmolLM2's 128-row LM head, 128 x 576 x 49152, gives 384 tiles of 128x128, 1.45 rounds of
#: an H100's 264 resident workgroups, and 512 of 128x96, 1.94), and 32-row tiles 128 wide or 32 deep for the
#: 32-row LM head. Only through :func:`matmul_choice`: on an H100 (``bench/matmul.py --sweep``, 2026-12-07,
#: bench/results/tiles_96_h100/sweep_heads.json, sweep_split.json) none was the fastest configuration but at
#: 32 x 576 x 49152, where 32x64x32m4x8 took 85.4 us against 87.9 on the pick (32x64x16m4x8; cuBLAS 65.9, so
#: neither reaches 0.8x its speed); 128 x 576 x 49152 took 282.0 us on 128x96x8m8x8w192 (the wave count
#: predicted about 209) and 229.3 on 64x96x16m8x4w192, against 225.0 on 64x64x16m8x4 and 247.5 on the pick
#: (64x128x8); SmolLM2's prefill plan with its LM head on 128x96x8m8x8w192 took 2892.9 us GPU against 2831.4
#: (``bench/plan_variants.py``, three alternated rounds, ab_prefill_head.json); the 64x96 tiles took 1.12-2.3x
#: the pick's time at the five split products of N = 384 to 1536 swept (2 to 8 ranges).
MATMUL_TILES_96 = (MatmulTile(128, 96, 8, micro=(8, 8), wg=192), MatmulTile(64, 96, 16, micro=(8, 4), wg=192),
                   MatmulTile(64, 96, 16, micro=(4, 8), wg=192), MatmulTile(32, 128, 16, micro=(4, 8)),
                   MatmulTile(32, 128, 16, micro=(4, 8), wg=128), MatmulTile(32, 64, 32, micro=(4, 8)))
#: Tiles whose invocations each hold 128 accumulators: 256x128 in 256 invocations of 16x8 (WIDE_HEAD_TILE, which
#: :func:`matmul_tile` takes for wide products), twice the 8x8 micro-tile's FMAs per value read from workgroup
#: memory. Timed beside it on an H100 and dropped (``bench/matmul.py --sweep``, 2026-12-07,
#: bench/results/tiles_tall_h100/sweep_tall.json; us at 4096^3 / 512 x 576 x 49152 / 256 x 576 x 49152, against
#: 3644.0 / 821.3 / 421.8 on 128x128x8 and 4300.8 / 786.4 / 394.9 on 256x128x8m16x8): 128x128 in 128 invocations
#: of 16x8 (cuBLAS's fp32 layout on Hopper) 6610.8 / 1054.5 / 528.6, of 8x16 6645.7 / 1076.2 / 541.6, in slices of
#: 16 8094.5 / 2008.1 / 1029.1, and 128x256x8m8x16 6588.8 / 1098.8 / 555.3. The tiles of more than 128 rows keep
#: the kernel's other forms of tiles under 128 rows (no runtime checks, quads stored whole): with those of the
#: 128-row tiles (:func:`keeps_runtime_checks`, :func:`out_vec4`) 256x128x8m16x8 took 512.6 / 1013.8 us at 256 /
#: 512 x 576 x 49152 (sweep_tall3.json).
MATMUL_TILES_TALL = (MatmulTile(256, 128, 8, micro=(16, 8)),)
#: Every tile :func:`matmul_choice` takes.
MATMUL_TILES_ALL = (MATMUL_TILES + MATMUL_TILES_DEEP + MATMUL_TILES_WIDE + MATMUL_TILES_SMALL
                    + MATMUL_TILES_THREE_QUARTER + MATMUL_TILES_96 + MATMUL_TILES_TALL)
# Not among them, measured slower on the H200 (commit af174f5 had them; bench/results/tile_order_h200/):
# the wide micro-tiles on slices of 32 elements of K (64x64x32m8x4, 64x32x32m8x4, 32x64x32m4x8; half the
# barriers, two quads of each operand loaded a slice). 1024 x 384 x 1536 took 67.5 us on 64x64x32m8x4
# against 42.7 on 64x64x16m8x4 (sweep_deep_wide.json), and MiniLM's plan with them 1648-1650 us GPU
# against 1211-1223 (ab_minilm.json); SmolLM2's prefill was unchanged (3064-3072 against 3066-3128).


#: Widest N of a 'BT' GEMV of M >= 2 rows below which its columns per workgroup follow K (:func:`gemv_bt_cols`).
GEMV_WIDE_N = 8192
#: Longest K of a 'BT' GEMV of 2 to 4 rows that takes 8 columns per workgroup (32 lanes a column) below
#: GEMV_WIDE_N but where :func:`gemv_bt_cols` says otherwise: one step of 64 lanes covers 512 elements of K.
GEMV_SHORT_K = 512
#: Longest K of a one-row 'BT' GEMV (N <= GEMV_WIDE_N) that takes 4 or 8 columns per workgroup; a longer one
#: takes 1 column of 256 lanes, whose one step covers 2048 elements of K (:func:`gemv_bt_cols`).
GEMV_LONG_K = 1024
#: Narrowest N of a one-row 'BT' GEMV on quantised blocks with K <= GEMV_LONG_K (and N <= GEMV_WIDE_N) that takes
#: 8 columns per workgroup (32 lanes a column, one subgroup on the H200) instead of 4; f32 B takes 8 at every
#: such N (:func:`gemv_bt_cols`).
GEMV_ROW_N = 1536
#: Column counts the 'BT' GEMV can take: the lanes of a column (256 / columns) halve in its tree, and
#: quantised B takes blocks of 4 lanes.
GEMV_COLS_ALLOWED = (1, 2, 4, 8, 16, 32, 64)


def gemv_bt_cols(m: int, k: int, n: int, quantised: bool = False) -> int:
    """Output columns per workgroup of the 'BT' GEMV (B stored [N,K]) of an [m,k] x [k,n] product
    (m <= GEMV_MAX_ROWS, or :func:`gemv_bt_rows`); each column takes 256 / columns invocations,
    matmul_gemv.wgsl's lanes (a power of two, as its lanes' tree halves them, and at least 4, as quantised B
    takes blocks of 4 lanes).

    - m = 1: 16 where N > GEMV_WIDE_N (the LM head), else 1 where K > GEMV_LONG_K (each of N
      workgroups walks K with all its lanes, in one step up to K = 2048), else 8 where
      N >= GEMV_ROW_N or B is f32 (not ``quantised``), else 4.
    - m >= 2 and N > GEMV_WIDE_N: 8 at m = 2, 16 at m = 3 and 4 (the workgroups are many anyway,
      and a lane's accumulators and loads of op(A) grow with m);
    - m = 3 or 4, N >= 1536 and K <= 576: 8;
    - m > 4 (:func:`gemv_bt_rows`; in blocks of GEMV_ROW_BLOCK rows where N <= GEMV_WIDE_N, which take the count
      of their rows, :func:`gemv_tile`): 16 where N > GEMV_WIDE_N, or m > 8, N >= 1536 and K <= 576; else 8
      (8 x 576 x 1536 5.98 / 5.89 us with 8 / 16 columns, 8 x 384 x 1536 5.04 / 5.49, 16 x 576 x 1536
      10.94 / 8.37, 16 x 384 x 384 5.86 / 6.43, 8 x 576 x 49152 86.2 / 61.1: ``ab_rows.json``);
    - else 8 where K <= GEMV_SHORT_K (64 lanes would leave a quarter or more of each lane's step
      outside K), otherwise 4.

    Measured on the H200: at m = 1, SmolLM2's decode step took 1.320 / 1.297 / 1.380 ms (f32) with
    8 / 4 / 2 columns (bench/ablation.py). Its LM head alone, 1 x 576 x 49152, took 39.8 / 30.8 /
    33.4 us with 4 / 8 / 16 columns (bench/results/gemv_h200/m1_cols*.json); the whole decode step
    with the LM head's 4 / 8 / 16 columns and 4 elsewhere, 1.180 / 1.172 / 1.165 ms in f32 and
    1.247 / 1.246 / 1.224 ms on Q4_1 blocks (its LM head on Q8_0 blocks), means of two runs each in one
    call (bench/results/gemv_h200/lm_head_cols_plans/). At m = 2 and 4 (bench/matmul.py --max-m 4,
    bench/results/gemv_h200/cols*.json, one call; cols4_one_row_per_sum.json is the lane sum of
    one row at a time), microseconds with 4 / 8 / 16 columns:
    2 x 576 x 49152 55.1 / 38.9 / 39.4; 4 x 576 x 49152 232 / 175 / 144; 2 x 384 x 1536
    4.72 / 3.84 / 4.97; 4 x 384 x 1536 10.1 / 8.4 / 7.6; 2 x 576 x 1536 4.17 / 5.35 / 6.46;
    4 x 576 x 1536 11.6 / 10.3 / 9.98; 4 x 1536 x 576 9.80 / 13.6 / 13.5. At m = 3 (bench/gemv_forms.py
    --gemv-cols, bench/results/rerun_h200/gemv_cols/ against gemv_chunk/*_lowered.json, one call, with
    the loads of gemv_select_loads), us with 4 / 8 / 16 / 32 columns: 3 x 384 x 1536 6.97 / 3.80 / 4.57 /
    5.62 (Q4_1 blocks 7.07 / 4.45 / 4.64 / 5.87), 3 x 576 x 1536 5.51 / 4.79 / 5.61 / 9.26 (5.77 / 5.07 /
    6.88 / 12.25), 3 x 576 x 3072 8.89 / 5.27 / 6.06 / 9.56 (9.18 / 5.54 / 7.17 / 12.33), 3 x 576 x 49152
    85.3 / 38.3 / 35.7 / 60.8 (76.1 / 41.9 / 35.8 / 54.1).
    One shape of SmolLM2's decode step at a time, the others as the rule has them
    (bench/plan_variants.py, two rounds alternated in one call, means; wall / GPU us per step,
    bench/results/gemv_h200/decode_cols_by_shape.json): the down projection 1 x 1536 x 576 (with
    its SwiGLU prologue; at 4 columns 144 workgroups, each lane walking 3 steps of K) with
    8 / 4 / 2 / 1 columns took 1149 / 1078 / 1053 / 1027 and 1090 / 1011 / 989 / 970 on Q4_1
    blocks, 1123 / 1064 / 1048 / 1041 and 1072 / 1013 / 997 / 994 in f32. At K = 576 no other
    count beat 4 columns by more than the rounds' spread (up to 22 us): the Q/K/V product
    (N = 960) with 2 / 8 columns 1022 / 1057 (Q4_1) and 1037 / 1062 (f32), the output projection
    (N = 576) 1030 / 1046 and 1044 / 1040, the gate/up product (N = 3072) with 2 / 8 / 16 columns
    1080 / 1028 / 1064 and 1097 / 1038 / 1071; the LM head with 8 / 32 columns instead of 16,
    1053 / 1057 and 1047 / 1054. Those were measured with a branch around each quad's loads of B
    and the RmsNorm weights read one float at a time; with neither (and the lane sums of 32 lanes or
    fewer a subgroup's shuffles, matmul_gemv_reduce_subgroup.wgsl), in three rounds alternated in
    one call (bench/results/gemv_prologue_h200/decode_cols_butterfly.json, wall / GPU us per step,
    means): 8 columns for the gate/up product took the Q4_1 step from 1024.5 / 959.0 to
    985.7 / 923.0 and the f32 one from 1070.8 / 1020.1 to 1040.4 / 985.3; 8 for the output
    projection as well, 978.7 / 916.6 and 1026.4 / 975.7; 8 for the Q/K/V product (N = 960) instead,
    1053.6 / 987.1 and 1094.1 / 1035.8; 16 for the gate/up product, 1030.5 / 964.3 and
    1074.2 / 1019.0. So 8 columns from N = GEMV_ROW_N; the output projection's 7-14 us are left, as
    a rule taking them would also take N = 960's loss of 23-29 us (the two differ in the RmsNorm prologue,
    the Q/K/V product's, and 72 against 120 workgroups; which one decides was not measured).
    On an H100 since (the f32 lane sums unrolled from 4 rows, GEMV_UNROLL_MIN_ROWS; ``bench/plan_ab.py --profile``,
    three rounds, bench/results/gemv_rows_h100/ab_m1_decode.json), 8 columns at every N of K <= GEMV_LONG_K took
    the f32 decode step from 907.1-908.6 to 896.2-900.1 us GPU (the Q/K/V product, N = 960, 199.7 against 195.6
    us for 30 calls, the output projection 187.9 against 176.7), and the Q4_1 step from 743.0-749.4 to 747.6-751.6
    (ab_m1_decode_q4_1.json): so 8 for f32 B, GEMV_ROW_N for blocks. Single products (``bench/matmul_ab.py``,
    ab_cols.json, us with 4 / 8 / 16 columns): 4 x 576 x 1536 5.02 / 4.62 / 5.14, 4 x 384 x 1536 5.88 / 4.82 /
    5.48, 4 x 576 x 3072 12.93 / 5.77 / 6.09 (16 was the rule at 4 rows), 4 x 576 x 960 4.67 / 4.36 / 4.90;
    ab_cols1.json: 1 x 576 x 192 3.03 / 2.73 / 3.02, 1 x 576 x 576 3.25 / 2.84 / 4.00.
    On an H100 (bench/plan_variants.py, three alternated rounds, bench/results/split_ranges_h100/decode_down_cols.json)
    the f32 decode step with its down projection on 1 / 4 / 8 columns took 896.8-899.9 / 927.8-933.9 / 977.3-983.6 us
    GPU, though the product alone, without the prologue and re-reading its weight from the L2 cache, took 4.05 / 3.78
    / 3.56 us (bench/results/token_pool_chunks_h100/gemv_cols/): the plan's one column stays. The L2 cache decides:
    alternated in one process (``bench/matmul_ab.py``, three rounds, bench/results/cold_h100/ab_cols_*.json), 1 x 1536
    x 576 took 4.04-4.05 / 3.58-3.98 / 3.76-4.11 / 3.48-3.73 us on 1 / 2 / 4 / 8 columns with B re-read from the L2
    cache, as ``bench/matmul.py`` times it, and 4.70-4.93 / 4.48-4.75 / 4.88-5.11 / 5.17-5.36 with B read from memory
    (``--cold``), as a model's weights are (1 x 1536 x 384: 4.10-4.38 / 3.89-4.26 / 4.01-4.25 / 3.82-4.07 and
    4.83-5.31 / 4.97-5.17 / 5.52-5.77 / 5.84-6.09). 2 columns, a little faster from memory at N = 576, took the
    H200's f32 decode step 1048 against 1041 us (above).
    At m = 1 neither K between 577 and 1535 (GEMV_LONG_K splits it)
    nor any N but 576 at K above 1024 was measured. On lavapipe (2 cores; the f32 step, two rounds
    of 3 samples of 2 runs, bench/results/gemv_lavapipe/decode_down_cols.json) the one column took
    4.13 / 4.57 s per step against 4.08 / 4.46 with 4 (GPU timestamps 4.58 / 4.67 against 4.34 / 4.33):
    1-7% slower there; the rule follows the GPU.
    """
    if m == 1:
        return 16 if n > GEMV_WIDE_N else 1 if k > GEMV_LONG_K else 8 if n >= GEMV_ROW_N or not quantised else 4
    if m > 4:
        return 16 if n > GEMV_WIDE_N or (m > 8 and n >= 1536 and k <= 576) else 8
    if n > GEMV_WIDE_N:
        return 8 if m == 2 else 16
    if m >= 3 and n >= 1536 and k <= 576:
        return 8
    return 8 if k <= GEMV_SHORT_K else 4


def gemv_bt_lanes(m: int, k: int, n: int, quantised: bool = False) -> int:
    """Lanes (invocations) per column of the 'BT' GEMV of an [m,k] x [k,n] product: 256 /
    :func:`gemv_bt_cols`; the other GEMV layout has 32."""
    return MATMUL_WG // gemv_bt_cols(m, k, n, quantised)


#: Most rows of a 'BT' product that takes the GEMV kernel whatever its K, N and B (:func:`gemv_bt_rows`).
GEMV_BT_ALWAYS_ROWS = 8
#: Widest N of a 'BT' product of more than GEMV_BT_ALWAYS_ROWS rows that the GEMV kernel takes (:func:`gemv_bt_rows`).
GEMV_MANY_ROWS_N = 1536
#: Longest K of such a product. In 4-row blocks (GEMV_ROW_BLOCK) on an H100 (``bench/matmul_ab.py``,
#: bench/results/gemv_row_blocks_h100/ab_long_k_rows.json, us, GEMV against the tiled kernel) K = 1536 and 2048
#: were faster at 16 x 1536 x 384 (6.12 / 7.45), 12 x 1536 x 576 (6.98 / 9.53) and 16 x 2048 x 384 (6.83 / 8.51),
#: slower at 16 x 1536 x 576 (10.42 / 9.69), 16 x 1536 x 1536 (16.23 / 11.72) and 16 x 2048 x 1536 (17.30 / 14.04),
#: and SmolLM2's 16-token prefill took 1618.9-1621.2 us GPU with K up to 2048 against 1606.6-1606.8
#: (ab_prefill16_k2048.json); with K up to 4096 and N up to 8192 at once, 1744.7-1746.4 against 1602.9-1603.7
#: (ab_prefill16_more.json).
GEMV_MANY_ROWS_K = 1024


def gemv_bt_rows(m: int, k: int, n: int, quantised: bool = False) -> bool:
    """Whether a 'BT' product of ``m`` rows, GEMV_MAX_ROWS < m <= GEMV_BT_MAX_ROWS, takes the GEMV kernel
    (one dispatch reading each weight once) instead of the tiled one: up to GEMV_BT_ALWAYS_ROWS (8) rows always;
    more, up to GEMV_BT_MAX_ROWS, where B is f32 (not ``quantised``), N <= GEMV_MANY_ROWS_N and
    K <= GEMV_MANY_ROWS_K.

    Measured on an H100 before the GEMV took its rows in blocks (GEMV_ROW_BLOCK, which made it faster still at
    N <= GEMV_WIDE_N; the bounds were measured with blocks too: GEMV_MANY_ROWS_K), with ``bench/matmul_ab.py``
    (the two kernels alternated in one process, rounds 1 and 2 of three, bench/results/gemv_rows_h100/ab_rows.json,
    us, GEMV against tiled): at 8 rows it was faster
    at all eight LLM shapes, 8 x 576 x 192 5.16 against 6.76, 8 x 576 x 576 5.27 / 6.93, 8 x 576 x 1536
    5.98 / 9.83, 8 x 1536 x 576 6.97 / 11.36, 8 x 384 x 384 4.37 / 6.86, 8 x 384 x 1536 5.04 / 8.29,
    8 x 1536 x 384 6.89 / 8.83, 8 x 576 x 49152 61.1 / 86.8 (the tiled kernel's 32-row tiles in split-K
    ranges, two dispatches, against one); at 16 rows at the five of K <= 576 and N <= 1536 (16 x 576 x 1536
    8.29 against 9.85, 16 x 384 x 384 5.86 / 6.79) and at 16 x 1536 x 576 (9.24 / 11.27, not taken), slower
    at 16 x 1536 x 384 (9.65 / 8.73) and 16 x 576 x 49152 (141.1 / 91.0); 12 x 576 x 1536 7.11 against 9.71.
    On Q4_1 blocks (``--weights q4_1``, two rounds, ab_q4_1.json): at 8 rows faster at five shapes (8 x 576 x
    1536 6.45 against 9.90, 8 x 1536 x 576 7.39 / 11.59, 8 x 576 x 3072 10.58 / 11.79), even at 8 x 576 x
    49152 (78.6); at 16 rows slower at three of four (16 x 576 x 3072 17.15 against 11.89, 16 x 576 x 576
    7.61 / 7.16), 16 x 576 x 1536 9.66 against 9.86. SmolLM2's prefill of 8 tokens (``bench/plan_ab.py``,
    three rounds, GPU us a run): 1541-1544 against 1697-1699 in f32 (ab_prefill8.json), 1518-1531 against
    1604-1606 on Q4_1 blocks (ab_prefill8_q4_1.json). The columns per workgroup were then :func:`gemv_bt_cols`'s
    of all the rows (8 or 16: 4 and 32 were slower at every shape); in blocks they are those of the block's rows
    (4 where K > GEMV_SHORT_K, but 8 at N >= 1536 and K <= 576), and a block's rows x columns below 64 read the
    sizes as WGSL constants (:func:`constant_shape`)."""
    if m <= GEMV_MAX_ROWS or m > GEMV_BT_MAX_ROWS:
        return False
    return m <= GEMV_BT_ALWAYS_ROWS or (not quantised and n <= GEMV_MANY_ROWS_N and k <= GEMV_MANY_ROWS_K)


#: Rows of the blocks a 'BT' GEMV of more than GEMV_MAX_ROWS rows (:func:`gemv_bt_rows`) and N <= GEMV_WIDE_N splits its
#: rows into, a workgroup for each block of rows and of columns (:func:`gemv_tile`; the row blocks of a block of columns
#: are neighbours, so that they read its weights together); 0: one block of all rows. A workgroup of fewer rows holds
#: fewer accumulators and loads of op(A) a lane, and the product gets more workgroups (16 x 384 x 384: 192 against 48).
#: Measured on an H100 (``bench/matmul_ab.py``, three alternated rounds, medians of rounds 1 and 2,
#: bench/results/gemv_row_blocks_h100/ab_row_blocks.json, us, blocks of 4 / 8 / all rows): 4 faster than all rows at all
#: 14 products of 5 to 16 rows and N <= 1536, and than 8 at all but 16 x 576 x 576 (6.03 / 5.94): 16 x 384 x 384 3.59 /
#: 4.66 / 6.19, 8 x 384 x 1536 4.02 / 5.16 / 5.13, 8 x 1536 x 384 5.69 / 7.10 / 7.10, 12 x 576 x 1536 5.72 / 9.45 /
#: 7.31, 16 x 576 x 1536 8.27 / 9.78 / 8.49 (the least), 5 x 576 x 1536 4.86 / 5.09 / 4.99; slower at 8 x 576 x 49152,
#: 68.2 against 62.2 (so not past GEMV_WIDE_N). SmolLM2's prefill (``bench/plan_ab.py``, three rounds, GPU us a run) of
#: 8 tokens 1362.7-1362.8 with blocks of 4 against 1600.7-1601.7 (ab_prefill8.json), of 16 tokens 1604.8-1605.1 against
#: 2022.4-2027.3 (blocks of 8 1601.9-1606.8, ab_prefill16.json); on Q4_1 blocks, 8 tokens, 1460.2-1462.5 against
#: 1584.2-1584.8 (ab_prefill8_q4_1.json), though single Q4_1 products were faster with 4-row blocks at 8 x 576 x 1536
#: (6.19 against 6.56) and 8 x 1536 x 576 (6.71 / 7.50) and slower at 5 x 576 x 960 (6.25 / 5.15), 8 x 576 x 576 (6.55 /
#: 5.48) and 8 x 576 x 3072 (11.17 / 10.86; ab_q4_1.json): the plan, whose products carry the RmsNorm and SwiGLU
#: prologues, decides.
GEMV_ROW_BLOCK = 4


def gemv_tile(m: int, k: int, n: int, variant: str, quantised: bool = False) -> MatmulTile:
    """The GEMV work split of an [m,k] x [k,n] product (``m`` <= GEMV_MAX_ROWS, or a 'BT' product of
    :func:`gemv_bt_rows`; ``quantised``: B as blocks): with 'BT' (B stored
    [N,K]) :func:`gemv_bt_cols` columns per workgroup, for all rows or, past GEMV_MAX_ROWS, for blocks of
    GEMV_ROW_BLOCK rows where that is set; otherwise 32 columns (8 quads), 32 invocations each, for all rows.
    The tile's ``bm`` is the rows a workgroup computes."""
    rows = m
    if variant == "BT" and GEMV_ROW_BLOCK and m > max(GEMV_MAX_ROWS, GEMV_ROW_BLOCK) and n <= GEMV_WIDE_N:
        rows = GEMV_ROW_BLOCK
    return MatmulTile(rows, gemv_bt_cols(rows, k, n, quantised) if variant == "BT" else 32, 0, gemv=True)


def matmul_tile(m: int, k: int, n: int, variant: str = "", layer_norm: bool = False,
                quantised: bool = False, prologue: bool = False) -> MatmulTile:
    """The work split of an [M,K] x [K,N] product, chosen at lowering time (a tile of MATMUL_TILES or
    MATMUL_TILES_WIDE, THREE_QUARTER_TILE or WIDE_HEAD_TILE). ``variant``, ``layer_norm`` and ``quantised`` change
    the choice between GEMV_MAX_ROWS and GEMV_BT_MAX_ROWS rows, where 'BT' products may take the GEMV kernel
    (:func:`gemv_bt_rows`), and ``quantised`` a 'BT' GEMV's columns (:func:`gemv_bt_cols`); ``layer_norm``,
    ``quantised`` and ``prologue`` (an RmsNorm or SwiGLU prologue) keep a wide product off WIDE_HEAD_TILE;
    otherwise products with a prologue or quantised B take the tile of their shape (measured as f32 'BT'
    products).

    M <= GEMV_MAX_ROWS, or a 'BT' product that :func:`gemv_bt_rows` gives the GEMV (B as blocks where
    ``quantised``) and that has no LayerNorm prologue (``layer_norm``; the GEMV's form of it is two
    dispatches): the GEMV kernel
    (:func:`gemv_tile`). Otherwise the tiled kernel:
    walking 128x128, 64x64 and 64x32 (the longer side along the larger of M and N), the first
    tile whose workgroups reach MIN_WORKGROUPS: a 128-sided tile by its tiles alone (split-K
    ranges of it measured up to 1.8x slower), the others times the split-K count they would take
    (:func:`matmul_splits` before rounding to ranges of whole slices). Where none does, the
    tile of the most workgroups walked, 32x32 included where M or N is below 64. A side of
    128 is only used where that dimension reaches 128, and of 64 where it reaches 64 (a
    128-row tile over 16 rows would compute 87% zeros). Larger tiles reuse each loaded element
    more (8x8 per invocation against 4x4); smaller ones and split-K spread a small problem over
    more multiprocessors. Last, a 64x64, 64x32 or 32x64 tile whose workgroups each walk at
    least WIDE_MIN_K elements of K takes its wide micro-tile (MATMUL_TILES_WIDE: 8x4, 8x4, 4x8),
    whose K groups' final sum is then paid back. Where M is 128 and 128x128 reaches MIN_WORKGROUPS
    by its tiles (a product as wide as an LM head), ONE_ROW_BLOCK_TILE (64x128) instead; where 64x64 would
    split a long K into LONG_K_MIN_SPLITS (2) or more ranges of WIDE_MIN_K or more, LONG_K_SPLIT_TILE (64x128, more
    ranges); where a widened 64x64 in one K range falls short of TARGET_WORKGROUPS, THREE_QUARTER_TILE (64x48) if
    its workgroups come nearer without passing it; where 128x128 reaches it with M of 256 or more, N of
    WIDE_HEAD_MIN_N (8192) or more in quads, f32 B and no prologue, WIDE_HEAD_TILE (256x128, 16x8 an invocation);
    where 32x64x16m4x8 reaches it in one K range with 16 to 32 rows, K of 576 or more, N a multiple of 4, f32 B and no
    prologue (an LM head), NARROW_HEAD_TILE (32x64 in slices of 32).
    MATMUL_TILES_DEEP is never chosen (measured slower: see there).

    The workgroups of a product run in row-major tile order. Bands of 4, 8 or 16 row blocks walked
    column by column (so that the workgroups running together share B's columns in the L2 cache;
    commit af174f5, bench/results/tile_order_h200/) were slower on the H200 but at 4096^3 with B
    stored [K,N]: that one took 3934-3966 us against 3980, `MatMulBT` 3994-4015 against 3626, the LM
    heads at M = 256 / 512 457 / 893 against 416 / 814, MiniLM's plan 1366-1377 against 1211-1223 us GPU.
    A probe of 1024 x 384 x N on 64x64x16m8x4 (one column of tiles more at a time, residency.json) shows
    the time of a product as steps of the workgroups per multiprocessor: 22.1 us at 128 workgroups,
    31.1 at 160-256, 42.4-42.7 at 272-384, 59.9-60.4 at 416-512 (the H200 has 132).

    Measured on an H200 (``bench/matmul.py --sweep`` with warm-up, bench/results/wide_h200/ and
    bench/results/runtime_checks_h200/sweep_model_shapes.json: every tile of MATMUL_TILES and 1 to
    8 splits at the 13 SmolLM2 and MiniLM shapes of M = 16 to 1024, and at 12 of them, all but
    128 x 576 x 49152, every tile of MATMUL_TILES_WIDE too, at 1, 2 and 4 splits (M = 1024) or 1 to 8):
    the picks (128x128x8 then for 128 x 576 x 49152, since ONE_ROW_BLOCK_TILE; before LONG_K_SPLIT_TILE and
    THREE_QUARTER_TILE, which changed two of them) sum to 652.6 us against
    619.0 for the fastest configuration of each shape, the
    worst taking 1.14x its fastest (128 x 576 x 960); the former rule (a target of 384
    workgroups for every tile, 128 elements of K per split, no wide micro-tiles) summed to
    691.1 us, its worst 1.39x (16 x 576 x 576). Over the 56 products of M = 8 to 512 of
    ``bench/matmul.py``'s table (bench/results/wide_h200/matmul_vs_cublas.json against
    runtime_checks_h200/), the rule changed the pick of 45, and their time by a geometric mean of
    0.88x (0.83x over the 21 that now take 32x32 tiles at M = 8 to 32; 512 x 1536 x 576 0.80x);
    10 got slower, by 1.04x or less but two: 128 x 576 x 1536 (64x64 tiles in 6 ranges of 96, 8 since SPLIT_MIN_K is 72,
    21.2 against 18.7 us) and 256 x 1536 x 576 (1.09x).
    """
    if m <= GEMV_MAX_ROWS or (variant == "BT" and not layer_norm and gemv_bt_rows(m, k, n, quantised)):
        return gemv_tile(m, k, n, variant, quantised)

    def fits(side: int, dim: int) -> bool:
        return side == 32 or dim >= side

    walked: list[tuple[int, MatmulTile]] = []
    sides_walk = [(128, 128), (64, 64), (64, 32)] + ([(32, 32)] if min(m, n) < 64 else [])
    for long, short in sides_walk:
        sides = (long, short) if m >= n else (short, long)
        if NARROW_ROWS_ON_TIES and sides == (64, 32) and fits(64, n) and _tiles(
                _TILE_BY_SIDES[(32, 64)], m, n) == _tiles(_TILE_BY_SIDES[(64, 32)], m, n):
            sides = (32, 64)
        if not (fits(sides[0], m) and fits(sides[1], n)):
            sides = (sides[1], sides[0])
            if not (fits(sides[0], m) and fits(sides[1], n)):
                continue
        tile = _TILE_BY_SIDES[sides]
        workgroups = _tiles(tile, m, n) * (1 if long == 128 else _split_count(tile, m, k, n))
        if workgroups >= MIN_WORKGROUPS and long != 32:
            if sides == (128, 128) and m <= 128:  # one row of tiles: halve its rows (ONE_ROW_BLOCK_TILE)
                return ONE_ROW_BLOCK_TILE
            if sides == (128, 128) and _wide_head(m, n, variant, layer_norm or quantised or prologue):
                return WIDE_HEAD_TILE
            if _long_k_split(tile, m, k, n):
                return LONG_K_SPLIT_TILE
            if _three_quarter(tile, m, k, n):
                return THREE_QUARTER_TILE
            widened = _widened(tile, m, k, n)
            if _narrow_head(widened, m, k, n, layer_norm or quantised or prologue):
                return NARROW_HEAD_TILE
            return widened
        walked.append((workgroups, tile))
    return _widened(max(walked, key=lambda w: w[0])[1], m, k, n)


#: Whether :func:`matmul_tile` takes 32x64 over 64x32 where both cut the product into as many tiles (and so
#: into as many split-K ranges): on an H100 32x64 (or its wide 4x8 form) took 0.82-1.00x the time of 64x32 at
#: all 16 products timed (``bench/matmul_ab.py``, three alternated rounds, bench/results/narrow_rows_h100/
#: ab_narrow.json; medians, 472.1 against 525.3 us summed): 1472 x 768 x 768 78.1 against 94.9, 1920 x 576 x 576
#: 59.7 / 72.2, 1024 x 1536 x 128 21.6 / 25.1, 512 x 576 x 192 11.0 / 11.4, 704 x 1536 x 192 27.0 / 27.0.
NARROW_ROWS_ON_TIES = True


#: The tile :func:`matmul_tile` takes instead of 128x128 where M is 128 (one row of 128-row tiles: a product
#: as wide as an LM head). SmolLM2's LM head, 128 x 576 x 49152, took 252.3 us on it against 277.2 on
#: 128x128x8 on an H200 (``bench/matmul.py --sweep``, every tile, bench/results/rerun_h200/sweep_lm_head.json);
#: at M = 256 and 512 128x128x8 was fastest (417.2 us against 490.8, 815.7 against 960.4 on 64x128x8). The
#: rule takes every product of M = 128 whose 128x128 tiles reach MIN_WORKGROUPS (N > 36736); only K = 576,
#: N = 49152 was measured. Since, on an H100 the plain product took 224.1 us on 64x64x16m8x4 against 245.7 on
#: 64x128x8 (bench/results/narrow_rows_h100/sweep_heads.json), but SmolLM2's prefill plan on an H200, whose LM
#: head has the RmsNorm prologue, 2727.3-2829.3 us GPU with it on 64x64x16m8x4 against 2689.0-2691.2 on 64x128x8
#: (``bench/plan_variants.py``, three alternated rounds, bench/results/narrow_rows_h200/head_prefill.json): kept.
ONE_ROW_BLOCK_TILE = _TILE_BY_SIDES[(64, 128)]

#: The tile :func:`matmul_tile` takes instead of 128x128 for a wide product (an LM head, a vocabulary projection)
#: within the shapes it was measured faster on (:func:`_wide_head`): B read [N, K], M of 256 to WIDE_HEAD_MAX_M padded
#: to no more rows than on 128x128, N of at least WIDE_HEAD_MIN_N and a multiple of 4 (its quads stored whole), at
#: least WIDE_HEAD_MIN_WORKGROUPS tiles, f32 B, no prologue (MATMUL_TILES_TALL's 256x128x8m16x8, 256 invocations of
#: 16x8, in one K range: :func:`matmul_splits`). It needs 24 KiB of workgroup memory; on a device that offers less
#: (WebGPU's default is 16 KiB) :func:`matmul_kernel_for` takes 128x128x8 (:func:`fitted_tile`).
#: On an H100 (``bench/matmul.py --sweep``, 2026-12-07, bench/results/tiles_tall_h100/sweep_tall4.json; the tile
#: reading its sizes from the uniform, as the tiles of 128 rows do, :func:`constant_shape`) it took 0.932-0.987x
#: 128x128x8's time at all eight such products timed: 256 / 512 / 1024 x 576 x 49152 395.7 / 787.2 / 1562.4 us
#: against 423.4 / 818.3 / 1607.9, 256 x 1024 x 32000 459.1 / 492.8, 512 x 2048 x 32000 1806.4 / 1846.2,
#: 1024 x 2048 x 8192 907.8 / 924.8, 1024 x 4096 x 8192 1798.9 / 1822.1, 512 x 4096 x 16384 1797.6 / 1831.6.
#: Left out: N = 50257 (its stores one float at a time, :func:`out_vec4`), 1024 x 768 x 50257 2592.8 against
#: 2114.3; and N below 8192, where it was faster at three products (2048 / 4096 x 1024 x 4096 0.943x / 0.948x,
#: 2048 x 4096 x 4096 0.986x) and slower at three: 4096 x 576 x 1536 1.20x, 2048 x 768 x 3072 1.24x and 4096^3
#: 1.73x (6272.0 against 3635.8 us; 4300.8 against 3644.0 in another call, sweep_tall.json, with its sizes as
#: constants, which made it slower at the others: sweep_tall2.json). Only for products with f32 B and no prologue:
#: SmolLM2's prefill of 512 tokens, whose LM head (512 x 576 x 49152) has the RmsNorm prologue, took 9228.0-9231.6
#: us GPU with it on this tile against 9139.4-9141.9 on 128x128x8 (``bench/plan_variants.py``, three alternated
#: rounds, ab_prefill512_head.json); quantised B and the LayerNorm and SwiGLU prologues were not timed on it.
WIDE_HEAD_TILE = MATMUL_TILES_TALL[0]
WIDE_HEAD_MIN_N = 8192
#: The most rows and the fewest workgroups of the products WIDE_HEAD_TILE was measured faster on (1024 rows;
#: 256 x 1024 x 32000's 250 tiles); 4096^3, beyond both, was 1.73x slower on it.
WIDE_HEAD_MAX_M = 1024
WIDE_HEAD_MIN_WORKGROUPS = 250


def fitted_tile(tile: MatmulTile, workgroup_storage: int) -> MatmulTile:
    """The tile a product :func:`matmul_tile` gives ``tile`` runs on, on a device of ``workgroup_storage`` bytes of
    workgroup memory: ``tile``, but where that offers less than its 24 KiB 128x128x8 for WIDE_HEAD_TILE and
    32x64x16m4x8 for NARROW_HEAD_TILE."""
    if tile.storage <= workgroup_storage:
        return tile
    return {WIDE_HEAD_TILE: _TILE_BY_SIDES[(128, 128)], NARROW_HEAD_TILE: _WIDE_BY_SIDES[(32, 64)]}.get(tile, tile)


def _wide_head(m: int, n: int, variant: str, unmeasured: bool) -> bool:
    # WIDE_HEAD_TILE for a product whose pick is 128x128, within what it was measured faster on (see WIDE_HEAD_TILE):
    # B read [N, K] ('BT'; a weight stored [K, N] is read so by then, lowering/layout.py), 256 to WIDE_HEAD_MAX_M rows
    # padded to no more rows than 128x128's (M % 256 0 or above 128), N of at least WIDE_HEAD_MIN_N in quads, at
    # least WIDE_HEAD_MIN_WORKGROUPS tiles, and (``unmeasured`` False) f32 B and no prologue (the RmsNorm one slower)
    return (not unmeasured and variant == "BT" and WIDE_HEAD_TILE.bm <= m <= WIDE_HEAD_MAX_M
            and 2 * math.ceil(m / WIDE_HEAD_TILE.bm) == math.ceil(m / (WIDE_HEAD_TILE.bm // 2))
            and n >= WIDE_HEAD_MIN_N and n % 4 == 0 and _tiles(WIDE_HEAD_TILE, m, n) >= WIDE_HEAD_MIN_WORKGROUPS)

#: The tile :func:`matmul_tile` takes instead of 32x64x16m4x8 (the widened 32x64) for a wide product of few rows
#: (:func:`_narrow_head`): 32x64x32m4x8, the same tile in K slices of 32, half the slices and barriers of a K range,
#: timed as the products of a weight stored [N, K] run on it, reading the weight's copy stored [K, N]. It
#: needs 24 KiB of workgroup memory; on a device that offers less :func:`matmul_kernel_for` takes 32x64x16m4x8
#: (:func:`fitted_tile`). On an H100 (``bench/matmul_ab.py``, three alternated rounds, 2026-12-07,
#: bench/results/cold_h100/ab_heads.json, ab_k32.json), in us against 32x64x16m4x8: 16 / 24 / 32 x 576 x 49152 73.0-73.1
#: / 76.5-76.6 / 80.9-81.3 against 80.0-80.1 / 83.0-83.3 / 84.5-86.5, 32 x 1024 x 32000 98.35-98.75 against 139.1-139.5,
#: 32 x 2048 x 32000 191.3-191.5 against 273.6-273.9 (its first round aside, at a low clock: 643 against 1031 us).
#: Only for f32 B and no prologue: SmolLM2's prefill of 16 tokens, whose LM head (16 x 576 x 49152) has the RmsNorm
#: prologue, took 1623.0-1623.8 us GPU with it on this tile against 1604.0-1606.8 on 32x64x16m4x8
#: (``bench/plan_variants.py``, three alternated rounds, pv_k32_seq16.json); quantised B was not timed on it.
#: In ``bench/matmul.py``'s table, a later call (matmul_h100.json), it gained less: 16 / 32 x 576 x 49152 took 76.2 /
#: 85.1 us against cuBLAS's 65.4 / 66.2, 1.165x / 1.285x its time (1.236x / 1.335x on 32x64x16m4x8 in the first
#: call's table, matmul_hot.json: 80.1 / 87.5 us).
NARROW_HEAD_TILE = MATMUL_TILES_96[5]


#: The rows (16 to 32) and the shortest K (576) of the products NARROW_HEAD_TILE was measured faster on; K up to 2048
#: was measured, the gain growing with it.
NARROW_HEAD_MIN_M = 16
NARROW_HEAD_MAX_M = 32
NARROW_HEAD_MIN_K = 576


def _narrow_head(tile: MatmulTile, m: int, k: int, n: int, unmeasured: bool) -> bool:
    # NARROW_HEAD_TILE for a product of NARROW_HEAD_MIN_M to NARROW_HEAD_MAX_M rows, K of NARROW_HEAD_MIN_K or more and
    # N a multiple of 4, whose pick is the widened 32x64 (32x64x16m4x8) in one K range, as measured faster (see
    # NARROW_HEAD_TILE), with (``unmeasured`` False) f32 B and no prologue. Only B read [K, N] was timed (a weight
    # stored [N, K] is read so by then where N is a multiple of 4, lowering/layout.py); the rule takes every variant
    # alike, so that a weight read transposed and one read as stored take one tile and give the same sums, bit for bit
    # (a B that is no weight, read [N, K], takes it unmeasured)
    return (not unmeasured and NARROW_HEAD_MIN_M <= m <= NARROW_HEAD_MAX_M and k >= NARROW_HEAD_MIN_K and n % 4 == 0
            and tile == _WIDE_BY_SIDES[(32, 64)] and matmul_splits(tile, m, k, n) == 1)


#: The tile :func:`matmul_tile` takes instead of 64x64 for a long K over few tiles (:func:`_long_k_split`): 64x128
#: (4x8 per invocation, slices of 8), in about twice the K ranges. On an H200 (``bench/matmul.py --sweep``,
#: bench/results/long_k_h200/sweep_small_wg.json) MiniLM's down projection, 1024 x 1536 x 384, took 47.5 us on it
#: in 8 ranges against 54.1 on 64x64x16m8x4 in 4 (the heuristic's pick before), and 512 x 1536 x 576
#: 47.0 against 48.8 (64x64x16m8x4 in 5; the fastest there, 42.8, was 64x64x16m8x4w128 in 5); MiniLM's whole plan
#: 1165.8 against 1202.5 us GPU (long_k_h200/down_minilm.json, three alternated rounds).
LONG_K_SPLIT_TILE = _TILE_BY_SIDES[(64, 128)]
#: The fewest K ranges of 64x64 tiles for which :func:`_long_k_split` takes LONG_K_SPLIT_TILE: 2 (4 before). On an
#: H200 (bench/results/exported_gpt2_h200/) the products of 2 ranges it then takes, 64x128 in 4, were 9-15% faster
#: than 64x64 in 2: GPT-2 small's 1024 x 3072 x 768 168.5 us against 185.3 (the fastest tile there, 162.3, was
#: 64x128x8m8x8w128), 1024 x 768 x 768 48.1 against 54.9, 512 x 576 x 1536 38.2 against 44.1 (sweep_long2.json);
#: GPT-2 small's exported plan 6571-6577 us GPU against 6896-6935 (ab_long_k_gpt2.json, three alternated rounds).
#: MiniLM's and SmolLM2's plans at the benchmark shapes are the same at 2 and 4; other sizes were not timed.
LONG_K_MIN_SPLITS = 2


def _long_k_split(tile: MatmulTile, m: int, k: int, n: int) -> bool:
    # a 64x64 tile whose product splits K into LONG_K_MIN_SPLITS or more ranges of WIDE_MIN_K or more (few tiles, a
    # long K), where N holds a 128-wide tile and LONG_K_SPLIT_TILE's workgroups in its split count still reach
    # MIN_WORKGROUPS: LONG_K_SPLIT_TILE instead
    if (tile.bm, tile.bn) != (64, 64) or n < 128:
        return False
    splits = matmul_splits(tile, m, k, n)
    if splits < LONG_K_MIN_SPLITS or _k_chunk(tile, k, splits) < WIDE_MIN_K:
        return False
    long = LONG_K_SPLIT_TILE
    return _tiles(long, m, n) * matmul_splits(long, m, k, n) >= MIN_WORKGROUPS


#: The tile :func:`matmul_tile` takes instead of 64x64x16m8x4 for a product in one K range whose 64x64 tiles fall
#: short of TARGET_WORKGROUPS (:func:`_three_quarter`): 64x48 (8x4 per invocation, 192 invocations in two K groups),
#: three quarters of the work a workgroup. A product's time goes in steps of workgroups per multiprocessor (three
#: resident on an H200: see :func:`matmul_tile`), so 288 workgroups on 132 multiprocessors run as long as 384. On an
#: H200 (``bench/matmul.py --sweep``, bench/results/three_quarter_h200/sweep_tq.json) MiniLM's Q/K/V product,
#: 1024 x 384 x 1152, took 39.5 us on it (384 workgroups) against 42.5 on 64x64x16m8x4 (288), and MiniLM's plan
#: 1139.5 against 1166.3 us GPU (qkv_minilm.json, three alternated rounds). The product took 42.7 us on 48x64 with
#: 8x4, 44.0 on 64x48 with 4x4 and 54.3 on 64x48 on 96 invocations, and MiniLM's plan with them 1157.1, 1172.7 and
#: 1231.4 us. For each (K, N) the rule takes the 64 values of M at which 64x64 gives 288 workgroups: of the models'
#: and ``bench/matmul.py``'s (K, N), M = 321-384 for 576 x 3072, 705-768 for 576 x 1536 and 384 x 1536, 961-1024 for
#: 384 x 1152, 1985-2048 for 576 x 576 and 1536 x 576, 3009-3072 for 384 x 384 and 1536 x 384, 6081-6144 for
#: 576 x 192 (no M of the table). At one M of six of those families and at 1024 x 576 x 1152 (sweep_rule.json) it
#: took 0.92-0.93x the time of 64x64x16m8x4: 384 x 576 x 3072 57.2 us against 62.2, 2048 x 576 x 576 57.3 / 62.1,
#: 2048 x 1536 x 576 145.4 / 157.1, 768 x 384 x 1536 39.3 / 42.7, 3072 x 384 x 384 39.4 / 42.6, 3072 x 1536 x 384
#: 145.4 / 157.6, 1024 x 576 x 1152 57.2 / 62.0; and (sweep_rule_more.json) 768 x 576 x 1536 57.2 / 62.1, 6144 x 576 x
#: 192 57.3 / 62.2. With B as Q4_1 blocks (sweep_rule_q4_1.json) 0.90-0.91x: 768 x 576 x 1536 61.1 / 67.3, 6144 x 576
#: x 192 60.7 / 67.6, 384 x 576 x 3072 61.1 / 67.7, 1024 x 384 x 1152 41.8 / 46.1. Products with a prologue on the
#: tile were not timed.
THREE_QUARTER_TILE = MATMUL_TILES_THREE_QUARTER[0]


def _three_quarter(tile: MatmulTile, m: int, k: int, n: int) -> bool:
    # a 64x64 tile in one K range, widened (each workgroup walks WIDE_MIN_K or more), where THREE_QUARTER_TILE's
    # workgroups stay within TARGET_WORKGROUPS: THREE_QUARTER_TILE instead (its tiles outnumber 64x64's wherever a
    # 64x64 tile fits, N >= 64)
    if (tile.bm, tile.bn) != (64, 64) or matmul_splits(tile, m, k, n) != 1 or _widened(tile, m, k, n) == tile:
        return False
    return _tiles(THREE_QUARTER_TILE, m, n) <= TARGET_WORKGROUPS


#: A tiled product is spread enough when its workgroups (counting split-K) reach this many:
#: three quarters of TARGET_WORKGROUPS (:func:`matmul_tile`).
MIN_WORKGROUPS = 288
#: Elements of K a workgroup walks from which a 64x64, 64x32 or 32x64 tile takes its wide micro-tile.
WIDE_MIN_K = 256
#: The wide micro-tile :func:`matmul_tile` takes for each of those sides (8 along the longer side).
_WIDE_BY_SIDES = {(64, 64): MATMUL_TILES_WIDE[1], (64, 32): MATMUL_TILES_WIDE[3], (32, 64): MATMUL_TILES_WIDE[4]}


def _widened(tile: MatmulTile, m: int, k: int, n: int) -> MatmulTile:
    # the tile's wide micro-tile (MATMUL_TILES_WIDE) where each workgroup walks WIDE_MIN_K or more of K
    wide = _WIDE_BY_SIDES.get((tile.bm, tile.bn))
    return wide if wide is not None and _k_chunk(tile, k, matmul_splits(tile, m, k, n)) >= WIDE_MIN_K else tile


def _k_chunk(tile: MatmulTile, k: int, splits: int) -> int:
    # the elements of K each of ``splits`` workgroups of a tile's column walks: whole slices, the last range shorter
    return math.ceil(math.ceil(k / tile.bk) / splits) * tile.bk if splits > 1 else k


def keeps_runtime_checks(tile: MatmulTile) -> bool:
    """Whether the tiled kernel of ``tile`` keeps naga's runtime checks in a plan lowered without them
    (``Kernel.runtime_checks``, ``lower(..., runtime_checks=False)``): the tiles of 128 rows, whose
    invocations hold 8 rows of accumulators. On an H200 (``bench/runtime_checks.py --all-unchecked``,
    bench/results/runtime_checks_h200/f32.json) those ran slower without the checks: 4096^3 on 128x128
    tiles 4279 us against 3625 with them, SmolLM2's LM head 128 x 576 x 49152 320 against 277 us (4096^3
    on 128x64 tiles, in a one-off script of the same call's kind: 4926 against 4584 us); the
    products on other tiles ran 2-15% faster without (128 x 1536 x 576 on split 32x64 tiles with the
    reduction 19.9 against 23.4 us, 1024 x 384 x 1536 on 64x64 tiles 52.5 against 53.5). The GEMV is
    not tiled. The rule is by rows, not by micro-tile: of MATMUL_TILES_WIDE, 128x64 with 8x8 keeps
    the checks and the 64-row tiles with 8-row micro-tiles do not, which was not measured both ways
    (the sweep of bench/results/wide_h200/ ran them as lowered). Why (bench/vulkan_sass.py, on an H100,
    bench/results/vulkan_sass_h100/sass_checks.json): without the checks the driver's register choice for
    4096^3's 128x128 loop puts 352 of its 512 FFMAs' two register reads in one bank, against 139 with
    them; that loop is issue-bound, and the conflicts outweigh the 36 index clamps the checks add.
    KEEP_CHECKS_ROWS names the rows (``bench/matmul_ab.py --variant``: an empty tuple keeps none)."""
    return not tile.gemv and tile.bm in KEEP_CHECKS_ROWS


#: The tile rows for which :func:`keeps_runtime_checks` keeps naga's runtime checks.
KEEP_CHECKS_ROWS = (128,)


#: Split-K across workgroups (:func:`matmul_splits`): each split walks at least this many
#: elements of K (72: K = 576, SmolLM2's, splits in up to 8 ranges of 5 slices of 16, the last one slice) ...
#: On an H100 (``bench/matmul_ab.py``, three alternated rounds, bench/results/split_ranges_h100/ab_split_min_k.json)
#: 72 against 96 took every product of K = 576 whose split count it changes, 6 to 8 ranges at M = 64 to 512 (5 to 8
#: at 256 x 576 x 576, there on 64x64 tiles instead of 32x64), 0.92-0.99x the time (128 x 576 x 1536 15.63 against
#: 16.95 us, 512 x 576 x 192 11.54 / 12.30), and at K = 384 (4 to 5 ranges) 0.96-1.02x (256 x 384 x 384 9.13 /
#: 9.52, 64 x 384 x 384 7.81 / 7.67; there 5 ranges of 32x64 tiles exceed LAST_SPLIT_MAX_SUMS, so two dispatches
#: instead of one); summed over the 13 products it changes, 128.0 against 134.4 us. 64 (6 ranges at K = 384) took the
#: 17 products either value changes 0.93-1.14x (128 x 384 x 1536 13.55 / 11.91 us, 64x64 tiles instead of 32x64),
#: 170.1 us in all against 172.5 (72: 166.2). SmolLM2's 128-token prefill (its output projections 6 to 8 ranges;
#: ab_prefill_split_min_k.json) took 2724.7-2727.5 us GPU against 2732.3-2735.0 in rounds 2 and 3 of three.
#: Against cuBLAS (matmul_h100.json, the next call): 64 x 576 x 1536 1.181x its time (1.265x before,
#: weights_kn_h100/matmul_final_h100.json), 128 x 576 x 1536 1.248x (1.353x), 512 x 576 x 192 1.266x (1.358x).
SPLIT_MIN_K = 72
#: ... and a product has at most this many splits.
SPLIT_MAX = 8


def _tiles(tile: MatmulTile, m: int, n: int) -> int:
    return math.ceil(m / tile.bm) * math.ceil(n / tile.bn)


def _split_count(tile: MatmulTile, m: int, k: int, n: int) -> int:
    # the splits that bring the tile's workgroups nearest TARGET_WORKGROUPS, within SPLIT_MAX
    # and SPLIT_MIN_K elements of K per split
    return max(1, min(SPLIT_MAX, k // SPLIT_MIN_K, round(TARGET_WORKGROUPS / _tiles(tile, m, n))))


def matmul_splits(tile: MatmulTile, m: int, k: int, n: int) -> int:
    """Into how many K ranges the tiled product's workgroups split K (1: no split).

    A workgroup walks its K slices one after another, each waiting for its loads, so a product
    of few tiles (SmolLM2's prefill at M = 128 with 32x32 tiles: 72 workgroups on an H200's
    132 multiprocessors, the 1536-long down projection 48 slices each) is bound by that
    latency: split into S ranges, S times as many workgroups walk 1/S of the slices each, and
    the workgroup that finishes each tile's last range adds the S partial sums and applies the
    epilogue (:func:`last_split`; with the RmsNorm prologue, a final step or too many bindings for one kernel a
    second dispatch, matmul_split_reduce.wgsl or the final stage, adds them and applies the row scale and the
    epilogue). S brings the workgroups nearest TARGET_WORKGROUPS, up to
    SPLIT_MAX and at least SPLIT_MIN_K elements of K per range (the last range may be shorter),
    then the fewest ranges of whole slices that gives. 1 for the GEMV kernel and the tiles of more than 128
    rows (WIDE_HEAD_TILE)."""
    if tile.gemv or tile.bm > 128:  # (WIDE_HEAD_TILE: measured in one range)
        return 1
    return _whole_ranges(math.ceil(k / tile.bk), _split_count(tile, m, k, n))


def _scratch_elements(splits: int, m: int, n: int, rms_norm: bool) -> int:
    # a split product's scratch: its splits' partial sums [S, M, N], then (RmsNorm) their sums of x^2 [S, M]
    return splits * m * (n + (1 if rms_norm else 0))


def _whole_ranges(slices: int, want: int) -> int:
    # the fewest ranges of whole slices that split `slices` as finely as `want` ranges would
    return math.ceil(slices / math.ceil(slices / max(1, min(want, slices))))


#: The open matmul_choice blocks, innermost last: (tile, splits, gemv_cols, shapes or None for all).
_CHOICE: ContextVar[tuple[tuple[MatmulTile | None, int | None, int | None, frozenset | None], ...]] = ContextVar(
    "eggfuse_matmul_choice", default=())


@contextmanager
def matmul_choice(tile: MatmulTile | None = None, splits: int | None = None,
                  gemv_cols: int | None = None,
                  shapes: Collection[tuple[int, int, int]] | None = None) -> Iterator[None]:
    """Within the block, every tiled product (M > GEMV_MAX_ROWS but the GEMVs of :func:`gemv_bt_rows`) lowered
    takes ``tile`` (one of
    MATMUL_TILES_ALL) and ``splits`` instead of :func:`matmul_tile`
    and :func:`matmul_splits`'s choice, and every 'BT' GEMV ``gemv_cols`` output columns per workgroup
    instead of :func:`gemv_bt_cols`'s (None: the heuristic's); for tuning sweeps (``bench/matmul.py
    --sweep``, ``--gemv-cols``, ``bench/plan_variants.py``). With ``shapes`` (M, K, N triples of
    [M,K] x [K,N] products) only the products of those shapes take it. Blocks nest: a product
    takes the innermost block that covers its shape, so blocks for different shapes combine.
    Lowering checks the plan against the device's limits as always, and ``eggfuse.compile`` skips the
    compile cache inside the block (its key does not hold the choice). Raises LoweringError for
    a tile not in those tables (and, when lowering, one that needs more workgroup memory than the
    device offers), a split count below 1, a column count that is not a power of two
    from 1 to 64 (the lanes of a column, 256 / columns, must be a power of two and at least 4), or
    a shape that is not three positive ints."""
    if tile is not None and tile not in MATMUL_TILES_ALL:
        raise LoweringError(f"matmul_choice: {tile} is not one of MATMUL_TILES, MATMUL_TILES_DEEP, "
                            f"MATMUL_TILES_WIDE, MATMUL_TILES_SMALL, MATMUL_TILES_THREE_QUARTER, MATMUL_TILES_96 or "
                            "MATMUL_TILES_TALL")
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise LoweringError(f"matmul_choice: splits must be a positive int, got {splits!r}")
    if gemv_cols is not None and gemv_cols not in GEMV_COLS_ALLOWED:
        raise LoweringError(f"matmul_choice: gemv_cols must be one of {GEMV_COLS_ALLOWED}, got {gemv_cols!r}")
    if shapes is not None:
        shapes = frozenset(_shape_triple(s) for s in shapes)
    token = _CHOICE.set((*_CHOICE.get(), (tile, splits, gemv_cols, shapes)))
    try:
        yield
    finally:
        _CHOICE.reset(token)


def _shape_triple(shape: object) -> tuple[int, int, int]:
    # an (M, K, N) of matmul_choice's shapes as a tuple of ints; LoweringError for anything else
    try:
        if len(shape) == 3 and not any(isinstance(v, bool) for v in shape):
            triple = tuple(operator.index(v) for v in shape)
            if min(triple) > 0:
                return triple
    except TypeError:
        pass
    raise LoweringError(f"matmul_choice: shapes must be a collection of (M, K, N) triples of positive ints, "
                        f"got the element {shape!r} (for one shape write shapes=[(M, K, N)])")


def matmul_choice_active() -> bool:
    """Whether a :func:`matmul_choice` block is open (in this context)."""
    return bool(_CHOICE.get())


def _choice_for(m: int, k: int, n: int) -> tuple[MatmulTile | None, int | None, int | None]:
    # the innermost open matmul_choice block that covers the shape: its tile, splits and GEMV columns
    for tile, splits, cols, shapes in reversed(_CHOICE.get()):
        if shapes is None or (m, k, n) in shapes:
            return tile, splits, cols
    return None, None, None


def _forced_choice(m: int, k: int, n: int, variant: str, layer_norm: bool, quantised: bool,
                   prologue: bool = False) -> tuple[MatmulTile | None, int | None, MatmulTile]:
    # (matmul_choice's tile, its split count, matmul_tile's pick) for a product: a forced tile applies to the tiled
    # kernel (a product of more than GEMV_MAX_ROWS rows), forced GEMV columns to a 'BT' GEMV
    forced_tile, forced_splits, forced_cols = _choice_for(m, k, n)
    heuristic = matmul_tile(m, k, n, variant, layer_norm, quantised, prologue)
    if heuristic.gemv and (m <= GEMV_MAX_ROWS or forced_tile is None):
        forced_tile, forced_splits = None, None  # matmul_choice's tiles are the tiled kernel's
        if forced_cols is not None and variant == "BT":
            forced_tile = MatmulTile(heuristic.bm, forced_cols, 0, gemv=True)
    return forced_tile, forced_splits, heuristic


def chosen_tile(m: int, k: int, n: int, variant: str = "", layer_norm: bool = False,
                quantised: bool = False) -> MatmulTile:
    """The tile :func:`matmul_kernel_for` takes for an [M,K] x [K,N] product when its caller gives none: an open
    :func:`matmul_choice` block's for the product's shape, else :func:`matmul_tile`'s."""
    forced_tile, _, heuristic = _forced_choice(m, k, n, variant, layer_norm, quantised)
    return forced_tile or heuristic


def matmul_vec4(variant: str, m: int, k: int, n: int, gemv: bool = False) -> tuple[bool, bool]:
    """Whether A and B are read as vec4: the stored row the kernel reads quads along is a
    multiple of 4 long. The tiled kernel reads A along K, or along M for 'AT'; B along N,
    or along K for 'BT'. The GEMV kernel reads op(A) along K, a strided column for 'AT'
    (scalar)."""
    if variant == "AT":
        vec_a = not gemv and m % 4 == 0
    else:
        vec_a = k % 4 == 0
    vec_b = k % 4 == 0 if variant == "BT" else n % 4 == 0
    return vec_a, vec_b


#: The tiled kernel's form of _QUAD_VEC4 where every quad it loads lies inside the matrix (:func:`covers`).
_QUAD_VEC4_INSIDE = """fn quad_{x}(r: u32, c: u32) -> vec4<f32> {{
    // elements (r, c..c+3) of {x} stored row-major [{rows}, {cols}]; {cols} % 4 == 0 == c % 4; the
    // tiles cover the matrix exactly, so no quad is outside
    return {x}[(r * {cols} + c) / 4u];
}}"""

_QUAD_VEC4 = """fn quad_{x}(r: u32, c: u32) -> vec4<f32> {{
    // elements (r, c..c+3) of {x} stored row-major [{rows}, {cols}]; {cols} % 4 == 0 == c % 4
    if (r < {rows} && c < {cols}) {{
        return {x}[(r * {cols} + c) / 4u];
    }}
    return vec4<f32>();
}}"""

#: The GEMV's form of _QUAD_VEC4: outside, a quad inside is loaded and dropped by ``select``, so no
#: branch stands around the load and a lane's loads are in flight together. On the H200 it took
#: SmolLM2's f32 decode step from 976.6 to 939.7 us of GPU time, while the tiled kernels' loads in
#: this form made MiniLM 8 x 128 and the 128-token prefill 5% slower (1269 -> 1331 and 3194 -> 3344
#: us; means of three rounds alternated in one call, bench/results/gemv_prologue_h200/select_ab.json).
#: With quantised B, A keeps the branch: in this form A took the Q8_0 LM head from 29.9 to 31.4 us
#: alone (gemv_parts.py's select_a, lmhead_after.json), and the GEMVs of the Q4_1 step within 0.04 us.
_QUAD_VEC4_SELECT = """fn quad_{x}(r: u32, c: u32) -> vec4<f32> {{
    // elements (r, c..c+3) of {x} stored row-major [{rows}, {cols}]; {cols} % 4 == 0 == c % 4; zero
    // outside, where a quad inside is loaded and dropped
    let inside = {x}[(min(r, {rows} - 1u) * {cols} + min(c, {cols} - 4u)) / 4u];
    return select(vec4<f32>(), inside, r < {rows} && c < {cols});
}}"""

_QUAD_SCALAR = """fn quad_{x}(r: u32, c: u32) -> vec4<f32> {{
    // elements (r, c..c+3) of a [{rows}, {cols}] view of {x}, zero outside
    var v = vec4<f32>();
    if (r < {rows}) {{
        for (var e = 0u; e < 4u; e = e + 1u) {{
            let cc = c + e;
            if (cc < {cols}) {{
                v[e] = {x}[{index}];
            }}
        }}
    }}
    return v;
}}"""


_QUAD_BLOCKS = """fn quad_b(r: u32, c: u32) -> vec4<f32> {{
    // weights (r, c..c+3) of B [N,K] stored as N rows of {fmt} blocks in q (quant_decode.wgsl), zero
    // outside; K % 32 == 0, so a quad inside K lies in one block
    if (r < p.n && c < p.k) {{
        return dequant_quad_{fmt}(r, c);
    }}
    return vec4<f32>();
}}"""

#: The GEMV's form of _QUAD_BLOCKS (see _QUAD_VEC4_SELECT): the branch took 4 of the 39 us of
#: SmolLM2's Q8_0 LM head on the H200 (bench/results/gemv_prologue_h200/lmhead_before.json).
_QUAD_BLOCKS_SELECT = """fn quad_b(r: u32, c: u32) -> vec4<f32> {{
    // weights (r, c..c+3) of B [N,K] stored as N rows of {fmt} blocks in q (quant_decode.wgsl), zero
    // outside, where a quad inside is decoded and dropped; K % 32 == 0, so a quad inside K lies in
    // one block
    let inside = dequant_quad_{fmt}(min(r, p.n - 1u), min(c, p.k - 4u));
    return select(vec4<f32>(), inside, r < p.n && c < p.k);
}}"""


def _quad(x: str, rows: str, cols: str, index: str, vec4: bool, select: bool = False, inside: bool = False) -> str:
    # quad_<x>(r, c): 4 consecutive elements of a row of a [rows, cols] matrix; ``index``
    # addresses element (r, cc) in the scalar form (a transposed view for GEMV 'AT'); ``select``:
    # the vec4 form without a branch (_QUAD_VEC4_SELECT); ``inside``: the vec4 form without a check
    # (_QUAD_VEC4_INSIDE).
    if vec4:
        form = _QUAD_VEC4_INSIDE if inside else _QUAD_VEC4_SELECT if select else _QUAD_VEC4
        return form.format(x=x, rows=rows, cols=cols)
    return _QUAD_SCALAR.format(x=x, rows=rows, cols=cols, index=index)


_QUAD_SWIGLU = """fn quad_a(r: u32, c: u32) -> vec4<f32> {{
    // silu(x[r, c..c+3]) * x[r, K + c..K + c+3] of x [M, 2K], the gate and up projections side by side
    // (SwiGLUConcat, swiglu_concat.wgsl), zero outside [M, K]
    var v = vec4<f32>();
    if (r < p.m) {{
{body}
    }}
    return v;
}}"""

_SWIGLU_VEC4 = """        if (c < p.k) {{
            let g = a[(r * 2u * p.k + c) / 4u];
            let u = a[(r * 2u * p.k + p.k + c) / 4u];
            v = vec4<f32>(silu(g.x), silu(g.y), silu(g.z), silu(g.w)) * u;
        }}"""

_SWIGLU_SCALAR = """        for (var e = 0u; e < 4u; e = e + 1u) {{
            let cc = c + e;
            if (cc < p.k) {{
                v[e] = silu(a[r * 2u * p.k + cc]) * a[r * 2u * p.k + p.k + cc];
            }}
        }}"""


def _w_norm_quad(vec4: bool) -> str:
    # matmul_gemv.wgsl's W_NORM: weights k..k+3 of the RmsNorm prologue's w_norm (k % 4 == 0); past
    # K, x is 0 and the weights do not matter, so the index is clamped rather than checked
    if vec4:
        return "fn w_norm_quad(k: u32) -> vec4<f32> {\n    return w_norm[min(k, p.k - 4u) / 4u];\n}"
    return ("fn w_norm_quad(k: u32) -> vec4<f32> {\n    let last = p.k - 1u;\n"
            "    return vec4<f32>(w_norm[min(k, last)], w_norm[min(k + 1u, last)], w_norm[min(k + 2u, last)], "
            "w_norm[min(k + 3u, last)]);\n}")


def _norm_quads(vec4: bool) -> str:
    # matmul.wgsl's NORM_QUADS for the LayerNorm prologue: gamma_quad(k) and beta_quad(k), weights k..k+3
    # (k % 4 == 0); past K the staged element is zeroed, so the index is clamped rather than checked
    if vec4:
        return "\n".join(f"fn {w}_quad(k: u32) -> vec4<f32> {{\n    return {w}[min(k, p.k - 4u) / 4u];\n}}"
                         for w in ("gamma", "beta"))
    return "\n".join(f"fn {w}_quad(k: u32) -> vec4<f32> {{\n    let last = p.k - 1u;\n    return vec4<f32>({w}[min(k, "
                     f"last)], {w}[min(k + 1u, last)], {w}[min(k + 2u, last)], {w}[min(k + 3u, last)]);\n}}"
                     for w in ("gamma", "beta"))


def _operand_quads(variant: str, vec_a: bool, vec_b: bool, gemv: bool, quant: str | None = None,
                   swiglu: bool = False, select: bool | None = None, inside: bool = False) -> str:
    # A: tiled reads quads of its stored rows ([M,K], or [K,M] for 'AT'); GEMV reads rows of
    # op(A) ([M,K]), through a transposed view for 'AT'; with ``swiglu`` (not 'AT') the quads of
    # SwiGLUConcat(A), A [M, 2K]. B: quads of its stored rows, [K,N] or [N,K] for 'BT'; with
    # ``quant`` ('BT' only) decoded from the blocks of binding q. ``select`` (default: ``gemv``):
    # f32 vec4 quads in the form without a branch (see gemv_select_loads). ``inside`` (the tiled kernel
    # where :func:`covers`): f32 vec4 quads without a check.
    select = gemv if select is None else select
    if swiglu:
        qa = _QUAD_SWIGLU.format(body=(_SWIGLU_VEC4 if vec_a else _SWIGLU_SCALAR).format())
    elif variant == "AT" and gemv:
        qa = _quad("a", "p.m", "p.k", "cc * p.m + r", False)
    elif variant == "AT":
        qa = _quad("a", "p.k", "p.m", "r * p.m + cc", vec_a, inside=inside)
    else:
        qa = _quad("a", "p.m", "p.k", "r * p.k + cc", vec_a, select and quant is None, inside)
    if quant is not None:
        qb = (_QUAD_BLOCKS_SELECT if gemv else _QUAD_BLOCKS).format(fmt=quant)
    elif variant == "BT":
        qb = _quad("b", "p.n", "p.k", "r * p.k + cc", vec_b, select, inside)
    else:
        qb = _quad("b", "p.k", "p.n", "r * p.n + cc", vec_b, select, inside)
    return qa + "\n\n" + qb


def _micro_tile(tile: MatmulTile, splits: int = 1) -> tuple[str, str, str, str]:
    # The unrolled micro-tile of invocation (tx, ty) in K group kg (matmul.wgsl): the
    # accumulator declarations, the inner product over its bk / ksplit elements of a K
    # slice, the store, and the split-K reduction. Rows g*4*TY + ty*4 + e, columns
    # h*4*TX + tx*4 + (0..3), as vec4 c{row}_{h} (in the form micro_tile_form says: the cols form
    # holds them as vec4 d{column}_{g} and gathers the c{row}_{h} after the K loop). Unrolled here
    # because the NVIDIA driver does not unroll the loop itself: on an H200 the unrolled 128x128 tile ran 34 TFLOP/s
    # at 4096^3 against 29 for the loop, 31 for 2 steps per iteration. WGSL's fma, not c + a * b
    # (OpFMul and OpFAdd): on an H100 GPT-2 small's exported plan took 6,846-6,856 us GPU written
    # so against 6,541-6,564, MiniLM's 1,108-1,110 against 1,094-1,103
    # (bench/results/attention_hd64_h100/ab_gpt2_lanes_muladd.json, ab_muladd_minilm.json).
    ty_count, tx_count = tile.bm // tile.tm, tile.bn // tile.tn
    row_groups, col_groups = tile.tm // 4, tile.tn // 4
    accs = [(4 * g + e, h) for g in range(row_groups) for e in range(4) for h in range(col_groups)]
    form = micro_tile_form(tile, splits)
    kind, _, loops = form.partition("_")  # loops: the FMAs' nesting, outermost first (micro_tile_form)
    if kind == "rows":
        decl = [f"    var c{r}_{h} = vec4<f32>();" for r, h in accs]
    elif kind == "scalar":
        decl = [f"    var s{r}_{c} = 0.0;" for r in range(tile.tm) for c in range(tile.tn)]
    else:  # d{column}_{g}: rows 4g .. 4g + 3 of one column
        decl = [f"    var d{c}_{g} = vec4<f32>();" for g in range(row_groups) for c in range(tile.tn)]
    if MICRO_TILE_DECL_REVERSED:
        decl.reverse()
    ranges = {"g": range(row_groups), "e": range(4), "h": range(col_groups), "j": range(4)}
    nest = [dict(zip(loops, idx, strict=True)) for idx in itertools.product(*(ranges[x] for x in loops))]
    body = []
    steps = tile.bk // tile.ksplit
    for step in range(steps):
        body.append(f"        // K slice element kg * {steps} + {step}")
        for g in range(row_groups):
            body.append(f"        let a{g}_{step} = tiles[a_at + {step * tile.bm // 4 + g * ty_count}u];")
        for h in range(col_groups):
            body.append(f"        let b{h}_{step} = tiles[b_at + {step * tile.bn // 4 + h * tx_count}u];")
        for i in nest:
            g, h = i["g"], i["h"]
            if kind == "rows":
                r = 4 * g + i["e"]
                body.append(f"        c{r}_{h} = fma(vec4<f32>(a{g}_{step}.{'xyzw'[i['e']]}), b{h}_{step}, c{r}_{h});")
            elif kind == "cols":
                c = 4 * h + i["j"]
                body.append(f"        d{c}_{g} = fma(a{g}_{step}, vec4<f32>(b{h}_{step}.{'xyzw'[i['j']]}), d{c}_{g});")
            else:
                r, c = 4 * g + i["e"], 4 * h + i["j"]
                body.append(f"        s{r}_{c} = fma(a{g}_{step}.{'xyzw'[i['e']]}, b{h}_{step}.{'xyzw'[i['j']]}, "
                            f"s{r}_{c});")
    if kind == "rows":
        as_rows = []
    elif kind == "scalar":  # the row quads the reduction and the stores take
        as_rows = [f"    var c{r}_{h} = vec4<f32>(" + ", ".join(f"s{r}_{4 * h + j}" for j in range(4)) + ");"
                   for r, h in accs]
    else:
        as_rows = [f"    var c{r}_{h} = vec4<f32>(" + ", ".join(
            f"d{4 * h + j}_{r // 4}.{'xyzw'[r % 4]}" for j in range(4)) + ");" for r, h in accs]
    store = []
    for j, (r, h) in enumerate(accs):
        line = (f"store4(row0, col0, {(r // 4) * 4 * ty_count + r % 4}u + ty * 4u, {h * 4 * tx_count}u + tx * 4u, "
                f"c{r}_{h});")
        store.append(f"    {line}" if tile.ksplit == 1 else f"    if (kg == {j % tile.ksplit}u) {{ {line} }}")
    return "\n".join(decl), "\n".join(body), "\n".join(store), "\n".join(as_rows + _group_sums(tile, accs))


#: How the tiled kernel's micro-tile holds its accumulators (:func:`micro_tile_form`): "rows_<loops>", a vec4 per
#: row and quad of columns, updated by fma(vec4(a), b, c); "cols_<loops>", a vec4 per column and quad of rows,
#: updated by fma(a, vec4(b), d); "scalar_<loops>", one f32 each. <loops> orders the nested loops over a K element's
#: FMAs, outermost first: g the quad of rows (the vec4 a read), e the row in it, h the quad of columns (the vec4 b
#: read), j the column in it ("rows" takes g, e and h, "cols" g, h and j, "scalar" all four). Each output's sum
#: takes its terms in the same order in every form; the forms differ in the registers the driver's compiler
#: gives them. None: :func:`micro_tile_form`'s rule; a form: that form on the tiles MICRO_TILE_FORM_TILES names
#: (for measurement: ``bench/matmul_ab.py --variant``). Short names: "rows" is rows_geh, "cols" cols_hjg.
MICRO_TILE_FORM: str | None = None
_FORM_NAMES = {"rows": "rows_geh", "cols": "cols_hjg", "scalar": "scalar_gehj"}

#: The tiles a set MICRO_TILE_FORM applies to (the others take :func:`micro_tile_form`'s rule): "square", 8x8
#: micro-tiles of 128x128 tiles; "tn8", micro-tiles 8 columns and at most 8 rows; "all".
MICRO_TILE_FORM_TILES = "square"

#: Declare the accumulators in the reverse of their order (for measurement: the registers the driver gives them).
MICRO_TILE_DECL_REVERSED = False


def micro_tile_form(tile: MatmulTile, splits: int = 1) -> str:
    """The accumulator form of ``tile``'s micro-tile in a product of ``splits`` K ranges (MICRO_TILE_FORM's forms,
    in full): "cols_ghj" for the 128x128x8 tile (8x8 micro-tiles in 256 invocations), "cols_jhg" for the 64x128x8
    tile (4x8) in one K range, "rows_geh" for the others. LoweringError for a bad MICRO_TILE_FORM.

    Measured on an H100 (``bench/matmul_ab.py``, three alternated rounds a call, two calls;
    bench/results/micro_tile_cols_h100/ab_forms.json and ab_orders.json), time against rows_geh by medians: on
    128x128x8 with g outermost (cols_ghj, cols_gjh) or h then g (cols_hgj) 4096^3 0.98 (cols_ghj 3550.5-3563.5 us
    against 3621.0-3635.9), 4096 x 576 x 1536 0.96, 2048 x 768 x 3072 0.97; with j before g 0.99 at 4096^3 but 1.27
    at the other two. On 64x128x8 the LM head of 128 rows (128 x 576 x 49152) 0.92-0.93 in every order of the cols
    form, but in 4 and 8 K ranges (512 x 576 x 1536, 512 x 1536 x 576) 1.004-1.014, hence one range only. Slower
    elsewhere: the 32-row LM head on 32x64x16m4x8 1.03-1.06, the 512-row one on 256x128x8m16x8 1.20. The rows
    form's other orders: 0.987-1.034."""
    where = MICRO_TILE_FORM_TILES
    if MICRO_TILE_FORM is not None:
        form = _FORM_NAMES.get(MICRO_TILE_FORM, MICRO_TILE_FORM)
        kind, _, loops = form.partition("_")
        letters = {"rows": "geh", "cols": "ghj", "scalar": "gehj"}.get(kind)
        if letters is None or sorted(loops) != sorted(letters) or where not in ("square", "tn8", "all"):
            raise LoweringError(f"MICRO_TILE_FORM is {MICRO_TILE_FORM!r} and MICRO_TILE_FORM_TILES {where!r}: the "
                                "form must be None or rows_, cols_ or scalar_ followed by an order of the letters geh, "
                                f"ghj or gehj (or one of {', '.join(_FORM_NAMES)}), the tiles 'square', 'tn8' or "
                                "'all'")
        if {"square": tile.bm == tile.bn == 128 and tile.tm == tile.tn == 8,
                "tn8": tile.tn == 8 and tile.tm <= 8, "all": True}[where]:
            return form
    if tile == _TILE_BY_SIDES[(128, 128)]:
        return "cols_ghj"
    if tile == _TILE_BY_SIDES[(64, 128)] and splits == 1:
        return "cols_jhg"
    return "rows_geh"


def _group_sums(tile: MatmulTile, accs: list[tuple[int, int]]) -> list[str]:
    # matmul.wgsl's REDUCE_SPLIT, a reduce-scatter: accumulator j of the micro-tile belongs to K group
    # j % ksplit, which adds the other groups' copies of it and stores it (_micro_tile's STORE), so
    # every group takes its share of the sums, the epilogue and the stores (group 0 alone did them
    # before: on the H200 MiniLM's 6 products of 64x64x16m8x4 with bias and GELU took 303.9 us
    # against 315.9, bench/results/layer_norm_h200/lanes32_profile_minilm.json against rerun_h200/profile.json,
    # and the whole plan 1251 against 1262-1279 us, lanes32_reduce_scatter_minilm.json, variant lanes256).
    # The other groups park their copies in the (now free) slice memory, group g at rank
    # (g + ksplit - 1 - owner) % ksplit (0 .. ksplit - 2), in rounds of as many accumulators as that
    # memory holds for every group (one round for MATMUL_TILES, several for the wide micro-tiles).
    if tile.ksplit == 1:
        return []
    ks = tile.ksplit
    per_group = (tile.bm // tile.tm) * (tile.bn // tile.tn)
    slots = tile.storage // 16  # vec4 in the slices' memory
    per_round = slots // ((ks - 1) * per_group)
    if per_round < 1:
        raise LoweringError(f"the matmul tile {tile.name}: its {ks - 1} K groups' accumulators do not fit "
                            f"its slices' memory for the final sum")
    lines = []
    for first in range(0, len(accs), per_round):
        chunk = list(enumerate(accs[first:first + per_round], start=first))
        stride = per_group * len(chunk)
        for slot, (j, (r, h)) in enumerate(chunk):
            owner = j % ks
            lines.append(f"    if (kg != {owner}u) {{ tiles[(kg + {ks - 1 - owner}u) % {ks}u * {stride}u + "
                         f"{slot * per_group}u + t] = c{r}_{h}; }}")
        lines.append("    workgroupBarrier();")
        for slot, (j, (r, h)) in enumerate(chunk):
            lines += [f"    if (kg == {j % ks}u) {{",
                      f"        for (var g = 0u; g < {ks - 1}u; g = g + 1u) {{",
                      f"            c{r}_{h} = c{r}_{h} + tiles[g * {stride}u + {slot * per_group}u + t];",
                      "        }", "    }"]
        lines.append("    workgroupBarrier();")
    return lines


#: Whether the tiled kernel may bind its output as vec4<f32> (:func:`out_vec4`); False: every product
#: stores one float at a time (``bench/plan_ab.py --variant NAME:eggfuse.ir.ops.matmul_kernel.MATMUL_OUT_VEC4=False``).
MATMUL_OUT_VEC4 = True


def out_vec4(tile: MatmulTile, n: int, splits: int, rms_norm: bool) -> bool:
    """Whether the tiled kernel of a product of N = ``n`` in ``splits`` K ranges binds its output as
    vec4<f32>, storing each quad of its micro-tile in one write (matmul.wgsl's STORE4: _STORE4_VEC4, else
    _STORE4_SCALAR): where N % 4 == 0, except on the tiles of 128 rows, for the split-K partial sums of a
    wide micro-tile (MATMUL_TILES_WIDE) and for those of a product with the RmsNorm prologue (its row sums
    are single floats).

    Measured on the H200 (``bench/plan_ab.py --profile``, bench/results/out_vec4_h200/; GPU time per run,
    medians of three alternated rounds): MiniLM 8 x 128 1215 / 1215 / 1226 us against 1248 with every
    store scalar and 1248 with the wide tile's partial sums in vec4 too; its down projection's partials
    (1024 x 1536 x 384, 64x64x16m8x4 in 4 splits) took 319.6 us (6 calls) stored by floats against 346.2 as
    vec4, while its output projection's (64x64x16, 4 splits) took 110.8 against 127.9 and the whole
    products of 64x64x16m8x4 290.3 / 284.0 against 299.5 / 287.3. SmolLM2's prefill (no wide tile in
    split-K) 3081-3084 us against 3157-3159 with every store scalar: the partials of 32x64x16 in 6 and 8
    splits 347.7 and 595.4 us against 406.1 and 638.4. Single products (``bench/matmul.py --set``, two runs
    of each form alternated in one call, out_vec4_h200/matmul_{vec4,scalar}_run{1,2}.json), us as vec4 /
    by floats: on 128x128 tiles 256 x 576 x 49152 468.2 / 416.3, 512 x 576 x 49152 922.3 / 814.3 and 4096^3
    4368 / 3629 (the tiles of 128 rows, whose invocations hold 8 rows of accumulators, as for
    keeps_runtime_checks); on others 128 x 576 x 49152 (64x128x8) 241.8 / 252.5, 1024 x 384 x 1536
    (64x64x16m8x4) 42.6 / 45.9, 256 x 576 x 1536 (64x64x16, 4 splits) 24.4 / 27.6."""
    return MATMUL_OUT_VEC4 and n % 4 == 0 and tile.bm != 128 and not (splits > 1 and (rms_norm or tile.micro))


_STORE4_SCALAR = """fn put_row_sum(at: u32, v: f32) {
    out[at] = v;
}

fn store4(row0: u32, col0: u32, r: u32, c: u32, v: vec4<f32>) {
    let i = row0 + r;
    let j = col0 + c;
    if (i >= p.m) {
        return;
    }
    if (SPLITS > 1u) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            if (j + e < p.n) {
                put_part1(part_base + i * p.n + j + e, v[e]);
            }
        }
        return;
    }
    let s = v * row_scale(r);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (j + e < p.n) {
            out[i * p.n + j + e] = epilogue(i, j + e, s[e]);
        }
    }
}"""
_STORE4_VEC4 = """fn put_row_sum(at: u32, v: f32) {  // unused: no split RmsNorm row sums with a vec4 out
    out[at / 4u][at % 4u] = v;
}

fn store4(row0: u32, col0: u32, r: u32, c: u32, v: vec4<f32>) {
    let i = row0 + r;
    let j = col0 + c;
    if (i >= p.m || j >= p.n) {  // N % 4 == 0: columns j..j+3 are all inside or all outside
        return;
    }
    if (SPLITS > 1u) {
        put_part4(part_base + i * p.n + j, v);
        return;
    }
    let s = v * row_scale(r);
    out[(i * p.n + j) / 4u] = vec4<f32>(epilogue(i, j, s.x), epilogue(i, j + 1u, s.y), epilogue(i, j + 2u, s.z),
                                        epilogue(i, j + 3u, s.w));
}"""

#: Whether a split-K product without a final step or the RmsNorm prologue may run in one dispatch, its
#: last K range to finish a tile adding the partial sums (:func:`last_split`).
LAST_SPLIT = True
#: The most partial sums (K ranges x the tile's outputs) the last workgroup of a tile adds in one dispatch
#: (:func:`last_split`): 32 KiB of them.
LAST_SPLIT_MAX_SUMS = 8192


def last_split(splits: int, rms_norm: bool, bindings: int = 0, storage_buffers: int = 0,
               device_barriers: bool = True, tile_outputs: int = 0) -> bool:
    """Whether the tiled kernel of a product in ``splits`` K ranges (no final step) adds its partial sums
    itself (matmul.wgsl's LAST_SPLIT: the workgroup that finishes each tile's last K range, known by the
    tile's counter), instead of a second dispatch of matmul_split_reduce.wgsl: where :data:`LAST_SPLIT`,
    ``splits`` > 1, not ``rms_norm`` (whose row sums come from the row block's first tile only) and the kernel's
    ``bindings`` (its operands, the partial sums, the counters and C) within the device's ``storage_buffers``
    (maxStorageBuffersPerShaderStage; 0: no limit), which the two dispatches need fewer of, where the device's
    ``storageBarrier`` has device scope (``device_barriers``, ``Target.device_barriers``: not on Metal). The
    sums are added in the same order as the reduction's, so C is the same bit for bit; the product takes
    one dispatch instead of two. Products with a final step (:mod:`.matmul_rows`) keep the final stage
    adding the partial sums: MiniLM's plan, whose output and down projections (64x64x16 in 4 K ranges,
    64x128x8 in 8) have a LayerNorm stage, took 1116-1131 us GPU with their last K ranges adding the sums into
    the first split's place for the stage, against 1077-1079 (bench/results/last_split_h100/tried/
    ab_minilm_final_step.json: the products 442.1 against 390.1 us for 12 calls, the stages 94.7 against 106.7):
    a tile's last workgroup reads 8 x 64 x 128 floats there, which the stage spreads over the GPU.

    The counter: after its stores each workgroup passes ``storageBarrier`` (naga: an OpControlBarrier with
    device-scope acquire-release semantics), one invocation adds 1 to the tile's u32 (``atomicAdd``), the
    workgroup that reads ``splits - 1`` passes a second ``storageBarrier``, resets the u32 to 0 and reads
    every split's sums back; no workgroup waits for another. The counters are a buffer of the node's
    (``Kernel.counters``, kind 'counters': zero when created, never shared, zero after every dispatch). The
    partial sums are stored and read as u32 atomics (the STORE4 forms' put_part4 and put_part1 defined so:
    ``_PART_ATOMICS_PLANES``, a quad's four floats in four planes, where out is bound as vec4, else
    ``_PART_ATOMICS``): naga's SPIR-V uses the GLSL450 memory model and declares storage buffers without the
    Coherent decoration, under which only atomics are sure to carry a store from one workgroup to another
    across those barriers. WGSL's own barriers have workgroup scope, so the pattern rests on naga's device
    scope (SPIR-V; DX12's DeviceMemoryBarrierWithGroupSync); on Metal naga's storageBarrier is a threadgroup
    barrier on device memory, so there (``Target.device_barriers`` False, ``eggfuse.pipeline.lower_for``) the
    products keep two dispatches.

    The last workgroup adds ``splits`` x ``tile_outputs`` (the tile's BM x BN) partial sums on its own, so
    the one dispatch is taken where those are at most LAST_SPLIT_MAX_SUMS (8192, 32 KiB). Measured on an H100
    (``bench/matmul_ab.py``, both forms alternated in one process, weights stored [K, N]:
    bench/results/weights_kn_h100/ab_products_forms.json, 'tree' against 'two'), over the 37 split products of
    bench/matmul.py's SmolLM2 and MiniLM shapes: one dispatch everywhere 0.987x the time of two (geometric
    mean; faster at every M <= 32, 32 x 384 x 384 6.02 against 6.87 us, 16 x 1536 x 384 7.45 against 8.18;
    slower at 512 x 1536 x 576 on 64x128 tiles in 8 ranges, 46.7 against 43.2, and 128 x 576 x 1536 on 64x64
    in 6, 18.2 against 16.7); with the bound, 16 of them in one dispatch (12 since SPLIT_MIN_K is 72; 32x32
    tiles in up to 8 ranges, 32x64 in up to 4), 0.979x, one slower (128 x 384 x 1536, 11.92 against 11.82).
    SmolLM2's 128-token prefill, whose split products (32x64 in 6 and 8 ranges) the bound leaves in two
    dispatches, took 2748-2751 us GPU
    in one dispatch against 2728-2733 in two (``ab_prefill_layout.json``, 'tree' against 'two', rounds 1-2 of
    three). Before the planes and the loads before the sums (``bench/results/last_split_h100/atomic/``), the
    atomic form took 1.12x the time of two over the 37 and the prefill 3018-3020 us against 2866-2871. The
    form with plain f32 partial sums, which the memory model does not cover (bench/results/last_split_h100/
    ab_products.json), took 0.954x. The forms before (``tried/``, VARIANTS.md): the count through a workgroup
    variable of its own, the tile's index kept through the K loop, ran the 64x64x16 tiles, whose slices take
    16 KiB, 1.2-1.4x slower (256 x 576 x 1536 32.0 against 24.0 us; the two not separated); the last workgroup
    adding the others' sums to its registers in its micro-tile's order, 1.09x the time over the 37."""
    return (LAST_SPLIT and device_barriers and splits > 1 and not rms_norm
            and splits * tile_outputs <= LAST_SPLIT_MAX_SUMS and not (storage_buffers and bindings > storage_buffers))


_LAST_SPLIT = """    storageBarrier();  // this workgroup's partial sums, before its arrival is counted
    let counter = row0 / BM * p.tiles_n + col0 / BN;  // the tile's (from values the stores keep anyway)
    if (li == 0u) {  // the count passes through the slices' memory, free now (see last_split)
        tiles[0].x = f32(atomicAdd(&count[counter], 1u));  // exact: below SPLITS
    }
    if (u32(workgroupUniformLoad(&tiles[0]).x) + 1u < SPLITS) {
        return;  // another K range of the tile is still to finish, and adds the sums
    }
    storageBarrier();  // the other K ranges' partial sums, stored (atomically) before their arrivals
    if (li == 0u) {
        atomicStore(&count[counter], 0u);  // zero again for the next dispatch
    }
    for (var q = li; q < BM * BN4; q = q + WG) {  // the tile's quads, a row's side by side
        finish4(row0, col0, q / BN4, q % BN4 * 4u);
    }"""


#: STORE4's stores of a split's partial sums (put_part4: a quad at element ``at`` of the [SPLITS, M, N] sums,
#: put_part1: one float) into the binding out, for matmul_split_reduce.wgsl: _PART_OUT_VEC4 where out is
#: bound as vec4<f32>, else _PART_OUT_SCALAR.
_PART_OUT_VEC4 = """

fn put_part4(at: u32, v: vec4<f32>) {
    out[at / 4u] = v;
}"""
_PART_OUT_SCALAR = """

fn put_part1(at: u32, v: f32) {
    out[at] = v;
}"""

#: The same for LAST_SPLIT, into the binding part as u32 atomics (``part: array<atomic<u32>>``), and part4, the
#: load of a quad: naga's SPIR-V declares storage buffers without the Coherent decoration under the GLSL450
#: memory model, where only atomics are sure to be seen by another workgroup after the barriers. The binding is
#: the kernel's own, so its layout is free: with out bound as vec4 (_PART_ATOMICS_PLANES) element e of the quad
#: at element ``at`` goes to plane e of four [SPLITS, M, N / 4], so that the neighbouring quads of a subgroup's
#: invocations make one coalesced access a plane (an atomic access is a single u32); by floats (_PART_ATOMICS)
#: element ``at`` of [SPLITS, M, N]. (A quad's floats side by side, read back in a loop of load-and-add, took
#: 1.12x the time of two dispatches: see :func:`last_split`.)
_PART_ATOMICS = """

fn put_part1(at: u32, v: f32) {
    atomicStore(&part[at], bitcast<u32>(v));
}"""
_PART_ATOMICS_PLANES = "\n\n" + atomic_quad_planes("part", "SPLITS * p.m * p.n / 4u", "put_part4", "part4",
                                                   unit="at / 4u")  # at: the quad's element, a multiple of 4

_FINISH4_VEC4 = """

fn finish4(row0: u32, col0: u32, r: u32, c: u32) {
    let i = row0 + r;
    let j = col0 + c;
    if (i >= p.m || j >= p.n) {  // N % 4 == 0: columns j..j+3 are all inside or all outside
        return;
    }
    let at = i * p.n + j;
{SUMS}
    out[at / 4u] = vec4<f32>(epilogue(i, j, s.x), epilogue(i, j + 1u, s.y), epilogue(i, j + 2u, s.z),
                             epilogue(i, j + 3u, s.w));
}"""


def _finish4_vec4(splits: int) -> str:
    # finish4 for out bound as vec4: every split's quad loaded, then added in order from zero, as
    # matmul_split_reduce.wgsl adds them (so C is the same bit for bit)
    loads = "\n".join(f"    let s{t} = part4({t}u * p.m * p.n + at);" for t in range(splits))
    total = "vec4<f32>()"
    for t in range(splits):
        total = f"({total} + s{t})"
    return _FINISH4_VEC4.replace("{SUMS}", f"{loads}\n    let s = {total};")


_FINISH4_SCALAR = """

fn finish4(row0: u32, col0: u32, r: u32, c: u32) {
    let i = row0 + r;
    let j = col0 + c;
    if (i >= p.m) {
        return;
    }
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (j + e < p.n) {
            let at = i * p.n + j + e;
            var s = 0.0;
            for (var t = 0u; t < SPLITS; t = t + 1u) {
                s = s + bitcast<f32>(atomicLoad(&part[t * p.m * p.n + at]));
            }
            out[at] = epilogue(i, j + e, s);
        }
    }
}"""
_FINISH4_COLUMN_CHECK = "        if (j + e < p.n) {\n"
_FINISH4_COLUMN_INSIDE = "        {\n"

#: _STORE4_VEC4 and _STORE4_SCALAR where the tiles cover the output exactly (:func:`covers`): no check.
_STORE4_CHECK = """    if (i >= p.m || j >= p.n) {  // N % 4 == 0: columns j..j+3 are all inside or all outside
        return;
    }
"""
_STORE4_ROW_CHECK = """    if (i >= p.m) {
        return;
    }
"""
_STORE4_VEC4_INSIDE = _STORE4_VEC4.replace(_STORE4_CHECK, "")
_STORE4_SCALAR_INSIDE = re.sub(r"if \(j \+ e < p\.n\) \{\n\s+(.*;)\n\s+\}", r"\1",
                               _STORE4_SCALAR.replace(_STORE4_ROW_CHECK, ""))

#: Which tiled products leave out their bounds checks where :func:`covers` (see :func:`inside_form`):
#: "rms_norm" (those with the RmsNorm prologue), "all" or "none" (for timing them:
#: ``bench/plan_ab.py --variant NAME:eggfuse.ir.ops.matmul_kernel.MATMUL_INSIDE='all'``).
MATMUL_INSIDE = "rms_norm"


#: Whether the tiled kernel may read its shape as WGSL constants (see :func:`constant_shape`).
MATMUL_CONSTANT_SHAPES = True
#: ... for products of N below this (see :func:`constant_shape`).
CONSTANT_SHAPES_MAX_N = 8192


def constant_shape(tile: MatmulTile, n: int) -> bool:
    """Whether the tiled kernel of a product of N = ``n`` on ``tile`` may read its parameters (M, K, N, the
    tile counts, the K range, eps) as WGSL constants rather than from its uniform (``Kernel.constant_params``,
    which ``lower(..., constant_params=True)`` honours): a pipeline per shape, whose index arithmetic the
    driver folds. Where :data:`MATMUL_CONSTANT_SHAPES`, N is below :data:`CONSTANT_SHAPES_MAX_N` and the tile
    has fewer than 128 rows (WIDE_HEAD_TILE's 256: see there; for those of 128 as for keeps_runtime_checks:
    4096^3 'BT' on 128x128x8 took 3886 us with constants,
    ``matmul_bt_4096.json``, against 3608 and 3623 without, ``mm_checked.json`` and ``final_bt_4096_uniform.json``,
    each in a call of its own). The GEMV kernel (a ``tile.gemv`` tile) may where its workgroup's rows times
    columns is below 64: with constants its 4-row, 16-column form took 4 x 576 x 1536 in 8.05 us and 4 x 576 x
    49152 in 155.4 (``bench/results/constants_h100/matmul_final.json``) against 5.36 and 46.3 from the uniform
    in a call before (``inside_h100/matmul_h100.json``), while its other forms took 0.85-1.02x their time
    (``gemv1x16`` for SmolLM2's LM head 0.988x).

    Measured on an H100 (bench/results/inside_h100/; GPU us): MiniLM's plan 1081-1090 against 1096-1100 read
    from the uniform (``ab3_minilm.json``, three alternated rounds), SmolLM2's 128-token prefill 2900-2998
    against 2959-2963 (``ab3_smollm2_prefill.json``); the 81 single products of ``bench/matmul.py`` (its 80 LLM
    shapes and 4096^3; ``mm_tree.json`` against ``mm_before.json``, plain products: only the constants differ)
    0.977x the time (geometric mean; 0.970x over the 71 not 49152 wide; 256 x 384 x 384 0.845x; MiniLM's 1024 x
    384 x 1536, not in that list, 48.7 against 48.3 us unchecked, ``mm_const.json``, ``mm_inside.json``), except
    the 49152-wide LM heads, none faster: 1.005x on 32x64x16m4x8, 0.999x on 64x128x8, 1.026x and 1.036x on
    128x128x8, and 1.233x at 64 x 576 x 49152 (64x64x16m8x4; 125.1 against 154.4 us), where the driver gave the
    kernel 88 registers against 77 (``sass_const.json``, bench/vulkan_sass.py): two workgroups a multiprocessor
    instead of three."""
    if tile.gemv:
        return MATMUL_CONSTANT_SHAPES and tile.bm * tile.bn < 64
    return MATMUL_CONSTANT_SHAPES and n < CONSTANT_SHAPES_MAX_N and tile.bm < 128


def covers(tile: MatmulTile, m: int, k: int, n: int, splits: int) -> bool:
    """Whether the tiled kernel's workgroups for an [M,K] x [K,N] product on ``tile`` in ``splits`` K
    ranges load and store only inside the matrices: M and N multiples of the tile's sides, K a multiple
    of its slice depth, and every K range non-empty (the first slice of each is loaded before the loop
    checks its length). Then its quads and stores need no bounds checks (_QUAD_VEC4_INSIDE,
    _STORE4_VEC4_INSIDE, _STORE4_SCALAR_INSIDE)."""
    if tile.gemv or m % tile.bm or n % tile.bn or k % tile.bk:
        return False
    return (splits - 1) * _k_chunk(tile, k, splits) < k


def inside_form(tile: MatmulTile, m: int, k: int, n: int, splits: int, prologue: str, f32_quads: bool) -> bool:
    """Whether the tiled kernel of an [M,K] x [K,N] product in ``splits`` K ranges loads its quads and stores
    its results without bounds checks (_QUAD_VEC4_INSIDE, _STORE4_VEC4_INSIDE, _STORE4_SCALAR_INSIDE): where
    its tiles cover the matrices (:func:`covers`), A and B are read as f32 vec4 quads (``f32_quads``: not
    quantised blocks, not the SwiGLU prologue's), and the product has the RmsNorm prologue (``prologue``
    "rms_norm"; :data:`MATMUL_INSIDE` "rms_norm"; "all": with no prologue, "none", too; never the LayerNorm
    prologue, "layer_norm", whose products were not measured without the checks).

    Measured on an H100 (``bench/plan_ab.py --profile``, bench/results/inside_h100/prof_*.json, GPU us for
    the calls of a plan, with checks / without): SmolLM2's 128-token prefill, whose products carry the RmsNorm
    prologue, took 906.5 / 820.4 for its Q/K/V and gate/up products (64x64x16 in 4 K ranges) and 490.8 / 415.6
    for the 32x64x16 ones in 6, the plan 3122-3124 us against 2970-3054 (unchecked on every covered product);
    without a prologue the form was slower or even: MiniLM's up projection with bias and GELU (64x64x16m8x4)
    294.0 / 319.0, its down projection's partial sums (64x128x8 in 8) 286.4 / 300.2, the plan 1097-1100 against
    1138-1148 us (``ab_minilm.json``); single products
    (``bench/matmul.py``, ``mm_checked.json`` / ``mm_inside.json``) 1024 x 384 x 1536 42.3 / 48.3 us, 128 x 576
    x 49152 243.8 / 259.8, 4096^3 on 128x128 3608 / 4083, the others within 2%. Where it helps or hurts
    follows the driver's register choices (bench/vulkan_sass.py), not the instructions left out."""
    if MATMUL_INSIDE not in ("rms_norm", "all", "none"):
        raise LoweringError(f"MATMUL_INSIDE is {MATMUL_INSIDE!r}: set 'rms_norm', 'all' or 'none'")
    wanted = (prologue == "rms_norm" if MATMUL_INSIDE == "rms_norm" else
              MATMUL_INSIDE == "all" and prologue != "layer_norm")
    return wanted and f32_quads and covers(tile, m, k, n, splits)


#: K slices whose quads the tiled kernel's invocations hold in flight (matmul.wgsl's K loop, :func:`_k_loop`):
#: 2 loads the next slice's quads while the workgroup computes on the current one and stores them after it;
#: 3 keeps two sets of registers, loading each slice's quads two slices ahead (the loop unrolled to two slices
#: an iteration, so that each set's loads have two inner products to land in; cuBLAS's FFMA kernels keep three
#: stages). None: :func:`pipeline_stages`'s rule; 2 or 3: every tile (for measurement, ``bench/matmul_ab.py
#: --variant``). The sums are the same bit for bit.
PIPELINE_STAGES: int | None = None
#: The tiles :func:`pipeline_stages` gives 3 stages where THREE_STAGES_RULE holds.
THREE_STAGE_TILES = ("64x64x16", "64x128x8")
THREE_STAGES_RULE = False


def pipeline_stages(tile: MatmulTile) -> int:
    """K slices in flight in the tiled kernel on ``tile`` (:data:`PIPELINE_STAGES`, :func:`_k_loop`).

    On an H100 (``bench/matmul_ab.py``, two alternated rounds, bench/results/stages_h100/ab_s3*.json, us, 3
    stages against 2), 3 stages on every tile took six of the seven products on the 64x64x16 and 64x128x8 tiles
    0.5-2.7% less time (128 x 576 x 49152 on 64x128x8 219.9 against 226.0, 512 x 576 x 576 20.39-20.55 against
    20.74-20.94, 512 x 1536 x 384 27.57-27.62 against 27.85-27.88, 256 x 1536 x 576 27.22-27.33 against
    27.52-27.63), 512 x 1536 x 576 on 64x128x8 as long (43.36-43.41 against 43.29-43.40), and the others
    more: 1024 x 384 x 1536 on 64x64x16m8x4 47.5-48.4 against 39.4-41.6, 4096^3 on 128x128x8 3870-3871
    against 3549-3550, 32 x 576 x 49152 on 32x64x32m4x8 85.9-86.0 against 81.9-82.0 (512 x 576 x 49152 on
    256x128x8m16x8 unsteady: 1812.5 / 1352.6 against 2925.7 / 1128.4); MiniLM's plan
    1163.2-1168.7 against 1028.7-1034.8 us GPU, SmolLM2's prefill 2879.7-2891.4 against 2825.0-2833.3
    (ab_s3_minilm.json, ab_s3_prefill.json).
    THREE_STAGES_RULE (3 stages on those two tiles only), three alternated rounds in a later call: their six
    products 0.1-2.5% less time (ab_r3.json; 128 x 576 x 49152 220.8-220.9 against 225.9-226.5), but MiniLM's plan
    1033.2-1035.2 against 1028.1-1029.8 us GPU, the 128-token prefill 2867.4-2868.8 against 2826.7-2828.0 and
    the 512-token one 9125.6-9166.4 against 9101.2-9150.5 (ab_r3_*.json); in ``bench/matmul.py``'s table with it
    (matmul_r3.json) 70 of 80 shapes reached 0.8x cuBLAS, as without it. So the rule stays off."""
    if PIPELINE_STAGES is not None:
        return PIPELINE_STAGES
    return 3 if THREE_STAGES_RULE and tile.name in THREE_STAGE_TILES else 2


def _k_loop(tile: MatmulTile, body: str) -> str:
    """matmul.wgsl's K_LOOP: the loads of the first slice(s), then the K loop around the micro-tile's
    inner product ``body`` (:func:`_micro_tile`), in :func:`pipeline_stages` stages.
    Invocation li loads quads li, li + wg, ... of each slice (tile.loads of A and of B), held in next_a0,
    next_b0, ... (and with 3 stages later_a0, later_b0, ...) while the workgroup computes on the other
    buffer. Loading them after the inner product instead, right before their stores (fewer registers held
    through it; commit e97c55f's MATMUL_LOADS_EARLY=False) was slower on the H200
    (bench/results/loads_late_h200/): MiniLM's plan 1272-1277 us GPU against 1202-1213, the prefill
    3264-3266 against 3074-3134, 1024 x 384 x 1536 47.8 against 42.6 us, 4096^3 'BT' 4262 against 3625
    (4096^3 with B [K, N] 3954 against 3985-3986, the one shape it helped)."""
    stages = pipeline_stages(tile)
    if stages not in (2, 3):
        raise LoweringError(f"PIPELINE_STAGES is {stages!r}: the tiled matmul kernel keeps 2 or 3 K slices in "
                            "flight; set it to 2 or 3")
    a_loads, b_loads = tile.loads
    quads = [("a", r, "row0") for r in range(a_loads)] + [("b", r, "col0") for r in range(b_loads)]
    wg = tile.wg

    def load(held: str, k: str, pad: str) -> list[str]:
        return [f"{pad}{held}_{x}{r} = load_{x}(li + {wg * r}u, {at}, {k});" for x, r, at in quads]

    def store(held: str, buf: str, pad: str) -> list[str]:
        return [f"{pad}store_{x}(li + {wg * r}u, {buf}, {held}_{x}{r});" for x, r, _ in quads]

    def inner(buf: str, pad: str) -> list[str]:
        return [f"{pad}let a_at = {buf} * A_SIZE + kg * (BK / KSPLIT) * BM4 + ty;",
                f"{pad}let b_at = B_START + {buf} * B_SIZE + kg * (BK / KSPLIT) * BN4 + tx;",
                *(pad[8:] + line for line in body.split("\n"))]

    steps = "    let steps = select(0u, (k_end - k0 + BK - 1u) / BK, k_end > k0);"
    first = [f"    var next_{x}{r} = load_{x}(li + {wg * r}u, {at}, k0);" for x, r, at in quads]
    first += store("next", "0u", "    ")
    if stages == 2:
        lines = [*first, "    workgroupBarrier();", steps,
                 "    for (var s = 0u; s < steps; s = s + 1u) {",
                 "        let buf = s % 2u;",
                 "        let more = s + 1u < steps;",
                 "        if (more) {  // the next slice's quads, in flight during the inner product",
                 "            let k_next = k0 + (s + 1u) * BK;",
                 *load("next", "k_next", "            "),
                 "        }",
                 *inner("buf", "        "),
                 "        if (more) {",
                 *store("next", "1u - buf", "            "),
                 "        }",
                 "        workgroupBarrier();",
                 "    }"]
        return "\n".join(lines)
    # 3 stages: slice s in buffer s % 2; next_* hold the even slices' quads, later_* the odd ones'
    lines = [*first, steps,
             *(f"    var later_{x}{r} = vec4<f32>();" for x, r, _ in quads),
             "    if (steps > 1u) {  // slice 1's quads, in flight during slice 0's inner product",
             *load("later", "k0 + BK", "        "),
             "    }",
             "    workgroupBarrier();",
             "    for (var s = 0u; s < steps; s = s + 2u) {",
             "        if (s + 2u < steps) {  // slice s + 2's quads, in flight during two inner products",
             "            let k_next = k0 + (s + 2u) * BK;",
             *load("next", "k_next", "            "),
             "        }",
             "        {",
             *inner("0u", "            "),
             "        }",
             "        if (s + 1u < steps) {",
             *store("later", "1u", "            "),
             "        }",
             "        workgroupBarrier();",
             "        if (s + 1u < steps) {",
             "            if (s + 3u < steps) {",
             "                let k_next = k0 + (s + 3u) * BK;",
             *load("later", "k_next", "                "),
             "            }",
             *inner("1u", "            "),
             "            if (s + 2u < steps) {",
             *store("next", "0u", "                "),
             "            }",
             "            workgroupBarrier();",
             "        }",
             "    }"]
    return "\n".join(lines)


#: Most steps of K (two quads per lane) whose loads of B a GEMV lane issues together (matmul_gemv.wgsl's
#: chunks): 16 quads, 64 registers of f32 weights per invocation.
GEMV_MAX_CHUNK = 8


#: Most quads of op(A) a 'BT' GEMV's lane loads per chunk (rows x 2 x steps) with its f32 quads in the
#: form without a branch (:func:`gemv_select_loads`).
GEMV_SELECT_MAX_A_QUADS = 16


#: Most quads of op(A) a 'BT' GEMV's chunk may hold (rows x 2 x steps; at least one step a chunk), or None:
#: a chunk of GEMV_MAX_CHUNK steps whatever the rows (:func:`_gemv_steps`). None, as measured on an H200
#: (``bench/gemv_forms.py --chunk-a-quads``, bench/results/rerun_h200/gemv_chunk/): 16 and 24 made
#: 4 x 576 x 49152 161.3 and 42.3 us against 38.3 (f32), 144.5 and 146.2 against 126.4 (Q4_1 blocks); the f32
#: chunks of 16 quads also took the form without a branch there (gemv_select_loads), those of 24 kept it.
GEMV_CHUNK_MAX_A_QUADS: int | None = None


def _gemv_steps(rows: int, k: int, lanes: int) -> int:
    # steps of a 'BT' GEMV's chunk of K: a step is 8 * lanes elements of K, a chunk at most GEMV_MAX_CHUNK steps
    # and, with GEMV_CHUNK_MAX_A_QUADS, at most that many quads of op(A)
    most = GEMV_MAX_CHUNK if GEMV_CHUNK_MAX_A_QUADS is None else GEMV_CHUNK_MAX_A_QUADS // (2 * rows)
    return max(1, min(GEMV_MAX_CHUNK, most, math.ceil(k / (8 * lanes))))


def gemv_select_loads(rows: int, k: int, lanes: int) -> bool:
    """Whether a 'BT' GEMV of ``rows`` rows, K = ``k`` and ``lanes`` lanes a column loads its f32 vec4
    quads of A and B in the form without a branch (``_QUAD_VEC4_SELECT``), every load of a chunk then
    in flight at once: where a lane's chunk holds at most GEMV_SELECT_MAX_A_QUADS quads of op(A)
    (rows x 2 x steps), else behind the branch (``_QUAD_VEC4``). Measured on an H200 (``bench/matmul.py
    --shapes``, the M = 2 and 4 products of its table, both forms in one call,
    bench/results/rerun_h200/gemv_select/, select_subgroup_current.json against _branch.json, every
    GEMV in one form or the other):
    without the branch, 4 x 576 x 49152 on 16 columns (40 quads of A a chunk) took 142.8 us against
    38.3 with it, 4 x 576 x 1536 (40) 8.2 against 5.2 and 4 x 384 x 1536 (24) 6.3 against 4.4; the
    other two products of 24 quads (4 rows, K = 1536, 4 columns) were within 1%, the branch ahead.
    Of the 13 products of 16 quads or fewer, the form without a branch was ahead at 8, by up to 25%
    (4 x 384 x 384: 4.2 against 5.6 us), behind at 2 x 576 x 49152 by 21% (37.0 against 30.7 us; p90
    40.4 and 46.6 us) and at four others by 3.1% or less, two of them one-row products (1 x 576 x 49152
    29.8 against 29.5 us, 1 x 576 x 1536 3.29 against 3.20). One-row GEMVs keep the form without a
    branch (at most 16 quads), which took SmolLM2's whole f32 decode step from 976.6 to 939.7 us
    (_QUAD_VEC4_SELECT); the decode step's hold at most 10."""
    return rows * 2 * _gemv_steps(rows, k, lanes) <= GEMV_SELECT_MAX_A_QUADS


def _gemv_chunk(rows: int, k: int, along_k: bool, k2: str, lanes: int) -> dict[str, str | int]:
    """matmul_gemv.wgsl's chunk slots for ``rows`` rows and K = ``k`` (B stored [N,K] when
    ``along_k``, else none used; ``k2`` the slot K2; a step is 8 * ``lanes`` of K): CHUNK, the
    steps of a chunk, is K's steps up to GEMV_MAX_CHUNK (and GEMV_CHUNK_MAX_A_QUADS: :func:`_gemv_steps`);
    LOAD_B declares and loads the chunk's quads of B (w0, w1, ...: quads k0 and k0 + K2 of each step),
    RELOAD_B loads the next chunk's, FMA_B adds their products with the staged quads of op(A) into each
    row's accumulator, and the quads' row_stat into its statistic."""
    if not along_k:
        return dict(CHUNK=1, LOAD_B="", RELOAD_B="", FMA_B="", SUMS_BT="")
    chunk = _gemv_steps(rows, k, lanes)
    at = [f"k0 + {8 * lanes * s}u" + extra for s in range(chunk) for extra in ("", f" + {k2}")]
    load = [f"        var w{j} = quad_b(col, {a});" for j, a in enumerate(at)]
    reload = [f"                w{j} = quad_b(col, {a});" for j, a in enumerate(at)]
    fma = []
    for j, a in enumerate(at):
        for i in range(rows):
            fma += [f"            let x{j}_{i} = quad_a(row0 + {i}u, {a});",
                    f"            stat[{i}] = stat[{i}] + row_stat(x{j}_{i});",
                    f"            acc[{i}] = fma(stage_x(x{j}_{i}, {a}), w{j}, acc[{i}]);"]
    return dict(CHUNK=chunk, LOAD_B="\n".join(load), RELOAD_B="\n".join(reload), FMA_B="\n".join(fma),
                SUMS_BT=_gemv_sums(rows))


#: Fewest rows of a 'BT' GEMV whose lane sums and stores name each row's accumulator by a constant index
#: (one ``store_rows`` call per pair of rows, unrolled here) instead of a loop over the rows, whose run-time
#: index into the accumulators ``acc`` costs where the driver keeps them in memory. Measured on an H100
#: (``bench/matmul_ab.py``, both forms alternated in one process, rounds 1 and 2 of three,
#: bench/results/gemv_rows_h100/ab_sums.json, us, unrolled against the loop): at 4 rows 4 x 1536 x 576
#: 5.22-5.39 against 10.06-10.19, 4 x 1536 x 384 5.01 / 8.63-8.69, 4 x 576 x 576 5.04-5.28 / 7.27-7.62,
#: 4 x 384 x 384 3.49 / 3.94-3.99, the other four 1.5-12% faster; at 2 and 3 rows the loop was faster by
#: 4-7% (2 x 1536 x 576 3.96-4.01 against 4.22-4.26, 3 x 576 x 1536 4.51-4.56 / 4.78-4.86); SmolLM2's
#: decode step (one row) 909.8-911.2 us GPU against 910.6-914.6 (ab_decode.json).
GEMV_UNROLL_MIN_ROWS = 4


def _gemv_sums(rows: int) -> str:
    # matmul_gemv.wgsl's SUMS_BT: store_rows for rows (i, i + 1) of the block, the last row paired with itself
    # (and stored once) when the block's rows are odd
    if rows < GEMV_UNROLL_MIN_ROWS:
        return ("        for (var i = 0u; i < ROWS; i = i + 2u) {\n"
                "            let i2 = min(i + 1u, ROWS - 1u);\n"
                "            store_rows(li, lane, col, row0 + i, acc[i], stat[i], acc[i2], stat[i2], i2 > i);\n"
                "        }")
    pairs = [(i, min(i + 1, rows - 1)) for i in range(0, rows, 2)]
    return "\n".join(f"        store_rows(li, lane, col, row0 + {i}u, acc[{i}], stat[{i}], acc[{j}], stat[{j}], "
                     f"{'true' if j > i else 'false'});" for i, j in pairs)


def matmul_kernel_for(variant: str, epilogue: tuple[str, ...], m: int, k: int, n: int, *, rms_norm: bool = False,
                      layer_norm: bool = False, eps: float = 0.0, tile: MatmulTile | None = None,
                      vec4: tuple[bool, bool] | None = None, quant: str | None = None, row_words: int = 0,
                      operand_types: tuple = (), swiglu: bool = False,
                      splits: int | None = None, max_scratch_bytes: int = 0, final: str | None = None,
                      norm_eps: float = 0.0, workgroup_storage: int = WORKGROUP_STORAGE,
                      storage_buffers: int = 0, device_barriers: bool = True) -> Kernel | list[Kernel]:
    """The :class:`Kernel` of an [M,K] x [K,N] product for ``variant`` ('' | 'AT' | 'BT') and an
    epilogue chain, with a tile (:func:`matmul_tile` unless given; a GEMV tile selects
    matmul_gemv.wgsl) and vec4 reads of A and B (:func:`matmul_vec4` unless given; True only
    where that stored row length is a multiple of 4); ``workgroup_storage`` is the device's
    maxComputeWorkgroupStorageSize (a given or forced tile that needs more raises LoweringError).

    A binds first, then (``rms_norm``: FusedRmsNormMatMul, A not transposed) the RmsNorm weight
    w_norm, then B, then the epilogue operands in chain order; 'bias' reads operand[j], 'add'
    reads operand[i * N + j]; unary steps are the WGSL of the unary table
    (:mod:`.elementwise`). With ``rms_norm`` A is staged as x * w_norm and each row is scaled by
    its inverse rms before the epilogue. With ``layer_norm`` (FusedLayerNormMatMul, A not transposed)
    gamma and beta bind where w_norm would, and the tiled kernel stages (x - mean) * rstd * gamma + beta,
    each row's mean and rstd taken over K before the K loop (matmul_prologue_layer_norm.wgsl); a GEMV
    tile (M <= GEMV_MAX_ROWS) instead gives two kernels, layer_norm.wgsl into the node's scratch
    buffer [M, K] and the GEMV reading it. With ``swiglu`` (FusedSwiGLUMatMul, A not transposed) A
    binds [M, 2K], and each quad of op(A) is SwiGLUConcat's silu(gate) * up, computed as it is
    loaded (``k`` is K, half of A's row). With ``quant`` (a block format of ``ir/ops/quant.py``;
    variant 'BT' only) B binds as ``q``, u32 rows of ``row_words`` words of blocks along K, decoded
    by the loader (shaders/quant_decode.wgsl) wherever the f32 kernel reads a quad of B. A
    generated region step (``fused_epilogue.py``) reads its operands, whose TensorTypes
    ``operand_types`` lists (every epilogue operand's, in chain order), with numpy broadcasting
    to [M,N]. ``splits`` (None: :func:`matmul_splits`) above 1 gives one kernel over K ranges whose
    partial sums go to the node's scratch buffer (bound read_write after the epilogue operands, then the
    node's counters, :func:`last_split`), or with ``rms_norm`` two kernels, the tiled
    kernel over K ranges writing the node's scratch buffer and matmul_split_reduce.wgsl (which
    binds the scratch, then the epilogue operands, taken to follow A, w_norm and B among the
    node's inputs); the heuristic's count is lowered until the scratch buffer fits
    ``max_scratch_bytes`` (when positive: the device's buffer limits); ``storage_buffers`` (when positive:
    maxStorageBuffersPerShaderStage) keeps two kernels where the one would bind more, and ``device_barriers=False``
    (``Target.device_barriers``) everywhere. ``final`` (the products of
    :mod:`.matmul_rows`) always gives two kernels, the first writing the scratch buffer (the
    splits' partial sums, or with one split or the GEMV kernel the product with its rows scaled
    and no epilogue), the second the epilogue and then the final step: 'swiglu' (output [M, N/2],
    SwiGLUConcat of C), 'layer_norm' (each row of C normalised with ``norm_eps``, then scaled
    and shifted by gamma and beta, which the node holds right after A and B, before the epilogue
    operands: matmul_split_layer_norm.wgsl), 'layer_norm_pair' (the same, its output [2, M, N] holding C's rows
    and then the normalised rows) or 'rms_norm' (each row of C divided by sqrt(mean(C^2) +
    ``norm_eps``), then scaled by the weight the node holds right after A and B: the same shader).
    Raises LoweringError for an unknown step or final
    step, a transposed A with ``rms_norm`` or ``layer_norm`` (or both), a GEMV ``layer_norm`` with a final
    step, ``quant`` with another variant than 'BT', or a
    two-stage product whose scratch buffer does not fit ``max_scratch_bytes``.
    """
    from .elementwise import UNARY_BY_NAME
    from .fused_epilogue import expr_lines, expr_operands, is_expr, step_label

    if (rms_norm or layer_norm) and variant == "AT":
        raise LoweringError("the RmsNorm and LayerNorm prologues normalise rows of A, which variant 'AT' transposes")
    if rms_norm and layer_norm:
        raise LoweringError("a product takes one prologue: RmsNorm or LayerNorm, not both")
    if swiglu and (variant == "AT" or rms_norm or layer_norm):
        raise LoweringError("the SwiGLU prologue reads rows of A [M, 2K] as they are stored: not with variant 'AT' "
                            "or a norm prologue")
    if quant is not None and variant != "BT":
        raise LoweringError(f"quantised B ({quant}) is decoded along K, which only variant 'BT' stores rows of")
    forced_tile, forced_splits, heuristic = _forced_choice(m, k, n, variant, layer_norm, quant is not None,
                                                           rms_norm or swiglu)
    heuristic = fitted_tile(heuristic, workgroup_storage)
    given = tile or forced_tile  # a caller's or matmul_choice's tile
    tile = given or heuristic
    if tile.storage > workgroup_storage:
        below = (": give matmul_choice a smaller tile" if given else
                 f", less than the {WORKGROUP_STORAGE} every WebGPU device offers: run on a device that meets "
                 "WebGPU's limits" if workgroup_storage < WORKGROUP_STORAGE else
                 ": run on a device that offers more, or at shapes whose products take smaller tiles")
        raise DeviceLimitError(f"the matmul tile {tile.name} of [{m},{k}] x [{k},{n}] needs {tile.storage} bytes of "
                               f"workgroup memory; this device offers {workgroup_storage} "
                               f"(maxComputeWorkgroupStorageSize){below}")
    if tile.gemv and variant == "BT" and tile.bn not in GEMV_COLS_ALLOWED:
        lanes = f"{MATMUL_WG // tile.bn} lanes a column" if tile.bn > 0 else "no lanes"
        raise LoweringError(f"a 'BT' GEMV tile of {tile.bn} columns leaves {lanes}; the kernel needs a power of two of "
                            f"at least 4 (columns one of {GEMV_COLS_ALLOWED})")
    if tile.gemv and layer_norm:
        return _layer_norm_then_gemv(variant, epilogue, m, k, n, eps, tile, vec4, quant, row_words, operand_types,
                                     final)
    if tile.gemv:
        splits = 1
    elif not (splits or forced_splits):
        splits = matmul_splits(tile, m, k, n)
        while splits > 1 and max_scratch_bytes and 4 * _scratch_elements(splits, m, n, rms_norm) > max_scratch_bytes:
            splits = _whole_ranges(math.ceil(k / tile.bk), splits - 1)
    else:
        splits = splits or forced_splits
    vec_a, vec_b = vec4 or matmul_vec4(variant, m, k, n, tile.gemv)
    vec_b = vec_b and quant is None
    operands, lines = [], []
    for step in epilogue:
        if is_expr(step):  # a generated region (fused_epilogue.py) over the output index i * N + j
            types = list(operand_types[len(operands):len(operands) + expr_operands(step)])
            if len(types) != expr_operands(step):
                raise LoweringError(f"FusedMatMul: epilogue step {step_label(step)} needs the types of its operands")
            lines += [line.format(at="i * p.n + j") for line in expr_lines(step, len(lines), (m, n), types,
                                                                              len(operands))]
            operands += [Buffer(f"e{len(operands) + i}", t.dtype.wgsl) for i, t in enumerate(types)]
        elif step in EPILOGUE_BINARY:
            e = len(operands)
            operands.append(Buffer(f"e{e}"))
            index = "j" if step == "bias" else "i * p.n + j"
            lines.append(f"    v = v + e{e}[{index}];  // {step}")
        elif step in UNARY_BY_NAME and UNARY_BY_NAME[step].epilogue:
            lines.append(f"    v = {UNARY_BY_NAME[step].wgsl.format(x='v')};")
        else:
            raise LoweringError(f"FusedMatMul: epilogue step {step!r} has no WGSL lowering")
    b = Buffer("q", "u32") if quant is not None else Buffer("b", "vec4<f32>" if vec_b else "f32")
    # the GEMV reads w_norm's quads as one vec4 where K % 4 == 0 (matmul_gemv_prologue_rms_norm.wgsl)
    w_norm = Buffer("w_norm", "vec4<f32>" if tile.gemv and vec_a else "f32")
    ln = tuple(Buffer(w, "vec4<f32>" if vec_a else "f32") for w in ("gamma", "beta")) if layer_norm else ()
    bindings = (Buffer("a", "vec4<f32>" if vec_a else "f32"), *((w_norm,) if rms_norm else ()), *ln,
                b, *operands, Buffer("out", write=True))
    tiles_n = math.ceil(n / tile.bn)
    tiles = math.ceil(m / tile.bm) * tiles_n
    k_chunk = _k_chunk(tile, k, splits)
    params = (("m", "u32", m), ("k", "u32", k), ("n", "u32", n), ("tiles_n", "u32", tiles_n), ("tiles", "u32", tiles),
              ("eps", "f32", eps), ("k_chunk", "u32", k_chunk),
              *((("row_words", "u32", row_words),) if quant is not None else ()))
    name = ("rms_norm_" if rms_norm else "") + ("layer_norm_" if layer_norm else "") + ("swiglu_" if swiglu else "")
    name += "matmul"
    name += (f"_{variant}" if variant else "") + f"_{tile.name}"
    name += f"_blocks{math.ceil(m / tile.bm)}" if tile.gemv and m > tile.bm else ""
    name += f"_{quant}" if quant is not None else ""
    name += "_v" + ("4" if vec_a else "1") + ("4" if vec_b else "1")
    name += "".join(f"+{step_label(s)}" for s in epilogue)
    lanes = (MATMUL_WG // tile.bn if variant == "BT" else 32) if tile.gemv else 0  # the GEMV's lanes a column
    select = tile.gemv and (variant != "BT" or gemv_select_loads(tile.bm, k, lanes))
    prologue = "rms_norm" if rms_norm else "layer_norm" if layer_norm else "none"
    inside = inside_form(tile, m, k, n, splits, prologue, vec_a and vec_b and quant is None and not swiglu)
    slots = dict(QUADS=_operand_quads(variant, vec_a, vec_b, tile.gemv, quant, swiglu, select, inside),
                 EPILOGUE="\n".join(lines),
                 B_ALONG_K="true" if variant == "BT" else "false",
                 DECODE=Include("quant_decode.wgsl") if quant is not None else "")
    fixed = 2 + (1 if rms_norm else 0) + len(ln)  # A, (w_norm | gamma, beta,) B: a two-stage product's first stage
    if tile.gemv:
        k2 = "16u" if quant else "4u * LANES"
        gemv_slots = dict(ROWS=tile.bm, ROW_BLOCKS=math.ceil(m / tile.bm), COLS=tile.bn, LANES=lanes,
                          W_NORM=_w_norm_quad(vec_a) if rms_norm else "",
                          PROLOGUE=Include(f"matmul_gemv_prologue_{prologue}.wgsl"),
                          LANE_K="lane / 4u * 32u + lane % 4u * 4u" if quant else "lane * 4u", K2=k2,
                          **_gemv_chunk(tile.bm, k, variant == "BT", k2, lanes), **slots)
        if final is None:
            return Kernel(name, "matmul_gemv.wgsl", tiles, params=params, bindings=bindings, slots=gemv_slots,
                          constant_params=constant_shape(tile, n))
        # the product, rows scaled, into the scratch buffer; the final stage applies the epilogue
        first = Kernel(name.split("+")[0], "matmul_gemv.wgsl", tiles, params=params,
                       bindings=(*bindings[:fixed], Buffer("out", write=True)), inputs=tuple(range(fixed)),
                       slots={**gemv_slots, "EPILOGUE": ""}, scratch=m * n, constant_params=constant_shape(tile, n))
        return [first, _final_stage(final, 1, False, m, k, n, eps, norm_eps, epilogue, operands, lines, fixed)]
    if layer_norm and (tile.wg < tile.bm or tile.bm * (tile.wg // tile.bm + 1) > tile.storage // 16):
        raise LoweringError(f"the LayerNorm prologue takes a row's mean and variance with one or more invocations "
                            f"a row, kept in the slices' memory, which the tile {tile.name} has too few of: choose "
                            "another tile of MATMUL_TILES")
    decl, body, store, reduce = _micro_tile(tile, splits)
    tiled = dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, TM=tile.tm, TN=tile.tn, WG=tile.wg, SPLITS=splits,
                 A_ALONG_K="false" if variant == "AT" else "true", ACCUMULATORS=decl,
                 STORE=store, REDUCE_SPLIT=reduce, PROLOGUE=Include(f"matmul_prologue_{prologue}.wgsl"),
                 NORM_QUADS=_norm_quads(vec_a) if layer_norm else "", LAST_SPLIT="", K_LOOP=_k_loop(tile, body))
    checks = keeps_runtime_checks(tile)
    vec_out = out_vec4(tile, n, splits, rms_norm)
    tiled["STORE4"] = ((_STORE4_VEC4_INSIDE if inside else _STORE4_VEC4) if vec_out else
                       _STORE4_SCALAR_INSIDE if inside else _STORE4_SCALAR)
    last = final is None and last_split(splits, rms_norm, fixed + len(operands) + 3, storage_buffers, device_barriers,
                                        tile.bm * tile.bn)
    tiled["STORE4"] += ((_PART_ATOMICS_PLANES if vec_out else _PART_ATOMICS) if last
                        else _PART_OUT_VEC4 if vec_out else _PART_OUT_SCALAR)
    out = Buffer("out", "vec4<f32>" if vec_out else "f32", write=True)
    if splits == 1 and final is None:
        return Kernel(name, "matmul.wgsl", tiles, params=params, bindings=(*bindings[:-1], out),
                      slots={**slots, **tiled}, runtime_checks=checks,
                      constant_params=constant_shape(tile, n))
    if last:
        # split-K in one dispatch: the partial sums into the scratch buffer, the last K range of each tile to
        # finish adds them and stores C
        finish4 = _finish4_vec4(splits) if vec_out else _FINISH4_SCALAR
        if inside:
            finish4 = finish4.replace(_STORE4_CHECK, "").replace(_STORE4_ROW_CHECK, "").replace(
                _FINISH4_COLUMN_CHECK, _FINISH4_COLUMN_INSIDE)
        tiled.update(STORE4=tiled["STORE4"] + finish4, LAST_SPLIT=_LAST_SPLIT)
        return Kernel(name.replace("+", f"_split{splits}_last+", 1) if "+" in name else f"{name}_split{splits}_last",
                      "matmul.wgsl", tiles * splits, params=params,
                      bindings=(*bindings[:-1], Buffer("part", "atomic<u32>", write=True),
                                Buffer("count", "atomic<u32>", write=True), out),
                      inputs=(*range(fixed + len(operands)), SCRATCH, COUNTERS), slots={**slots, **tiled},
                      scratch=splits * m * n, counters=tiles, runtime_checks=checks,
                      constant_params=constant_shape(tile, n))
    # split-K: partial sums (and sums of x^2) into the scratch buffer, then one reduction; or with
    # a final step and one split, the product (rows scaled, no epilogue) there
    scratch = _scratch_elements(splits, m, n, rms_norm) if splits > 1 else m * n
    if final is not None and max_scratch_bytes and 4 * scratch > max_scratch_bytes:
        raise LoweringError(f"the product [{m},{k}] x [{k},{n}] with a final {final} step needs a scratch buffer of "
                            f"{4 * scratch} bytes; this device binds at most {max_scratch_bytes}: optimise the graph "
                            f"without the ruleset that fused the {final} step")
    partial_name = name.split("+")[0] + (f"_split{splits}" if splits > 1 else "")
    partial = Kernel(partial_name, "matmul.wgsl", tiles * splits, params=params,
                     bindings=(*bindings[:fixed], out), inputs=tuple(range(fixed)),
                     slots={**slots, **tiled, "EPILOGUE": ""}, scratch=scratch, runtime_checks=checks,
                     constant_params=constant_shape(tile, n))
    return [partial, _final_stage(final, splits, rms_norm and splits > 1, m, k, n, eps, norm_eps, epilogue, operands,
                                  lines, fixed)]


def _layer_norm_then_gemv(variant: str, epilogue: tuple, m: int, k: int, n: int, eps: float, tile: MatmulTile,
                          vec4, quant, row_words: int, operand_types: tuple, final: str | None) -> list[Kernel]:
    # FusedLayerNormMatMul on a GEMV tile: layer_norm.wgsl (a workgroup a row) writes the normalised
    # rows into the node's scratch buffer [M, K], then the GEMV reads them as A (inputs: x, gamma, beta,
    # B, then the epilogue operands)
    if final is not None:
        raise LoweringError(f"a LayerNorm prologue on a GEMV tile ({m} rows) takes no final {final} step")
    from .norms import row_norm_kernel

    norm = dataclasses.replace(row_norm_kernel("LayerNorm", m, k, eps, True, True), inputs=(0, 1, 2), scratch=m * k,
                               bindings=(Buffer("x"), Buffer("w"), Buffer("bias"), Buffer("out", write=True)))
    gemv = matmul_kernel_for(variant, epilogue, m, k, n, tile=tile, vec4=vec4, quant=quant, row_words=row_words,
                             operand_types=operand_types)
    return [norm, dataclasses.replace(gemv, inputs=(SCRATCH, *range(3, 4 + len(gemv.bindings) - 3)))]


#: Most columns of a row one invocation of matmul_split_layer_norm.wgsl keeps in registers.
LAYER_NORM_HELD = 16
#: Fewest invocations (lanes) that take a row of single columns in matmul_split_layer_norm.wgsl
#: (:func:`layer_norm_lanes`).
LAYER_NORM_MIN_LANES = 128
#: Fewest lanes that take a row of quads (rows of a multiple of 4 columns, read and written as vec4).
LAYER_NORM_QUAD_MIN_LANES = 128
#: Whether rows of a multiple of 4 columns are cut into quads (False: single columns, as other rows).
LAYER_NORM_QUADS = True
#: Invocations of a workgroup of matmul_split_layer_norm.wgsl (WG / lanes rows a workgroup; :func:`layer_norm_stage`'s
#: slot WG, :func:`layer_norm_groups`).
LAYER_NORM_WG = MATMUL_WG


def layer_norm_lanes(n: int) -> tuple[int, int, int]:
    """(lanes, values, width) of the LayerNorm final stage (matmul_split_layer_norm.wgsl) for rows of
    ``n``: a row is cut into units of ``width`` columns, 4 (quads, bound as vec4) where ``n`` is a
    multiple of 4 and LAYER_NORM_QUADS, else 1; ``lanes`` (neighbouring invocations, LAYER_NORM_WG / lanes
    rows a workgroup) take a row, the fewest power of two from LAYER_NORM_QUAD_MIN_LANES (quads) or
    LAYER_NORM_MIN_LANES up to LAYER_NORM_WG whose lanes each hold at most LAYER_NORM_HELD columns; ``values``
    is the units a lane keeps in registers, ceil(n / width / lanes), or 0 (each pass computes them again)
    where its columns are above LAYER_NORM_HELD even at LAYER_NORM_WG lanes. Raises LoweringError where
    LAYER_NORM_WG is not a power of two from 1 to 256, or the minimum not one from 1 to LAYER_NORM_WG. Rows of 32
    lanes or fewer lie in one subgroup on the
    H200 (32 lanes), whose butterfly (row_lanes_subgroup.wgsl) then adds them in registers; longer rows
    add subgroup parts through workgroup memory.

    Quads on the H200 (``bench/plan_ab.py``, MiniLM's plan, whose 13 stages have rows of 384; three
    alternated rounds, GPU us per run; bench/results/layer_norm_quads_h200/ab_ln.json): 1092.6-1095.8 with
    quads at 128 lanes (one quad a lane, 96 of the 128 busy), 1100.4-1103.3 at 64, 1105.6-1110.5 at 32 (three
    quads a lane, the row's sums in one subgroup), 1107.1-1107.5 with single columns at 128 lanes, and
    1105.5-1111.3 for the plan of the commit before quads (that shader, single columns at 128 lanes). In the
    profile of the same call the 12 LayerNorm stages took 104.6 us at 128 lanes with quads against 115.8.
    Earlier measurements, single columns:

    On the H200 (``bench/ablation.py``, MiniLM's 12 LayerNorm stages, N = 384) a stage took
    10.1 us with one workgroup of 256 lanes a row and its values held
    (bench/results/layer_norm_h200/ablation_minilm_registers.json) against 11.3 us computing them
    in each of the three passes (bench/results/ablation_h200_prefill_minilm.json, an earlier run),
    and 12.6 us with 64 lanes a row and the row sums as trees in workgroup memory
    (ablation_minilm_64_lanes_a_row.json, not kept). With the row sums of row_lanes.wgsl (``bench/plan_ab.py``,
    whole MiniLM plans alternated, GPU us per run in three rounds, layer_norm_h200/lanes_minilm.json):
    32 / 64 / 128 / 256 lanes 1338-1341 / 1297-1299 / 1276-1280 / 1284-1290; 32 lanes, where a row's sums
    stay in one subgroup's registers, leave 128 workgroups of 12 columns a lane, and the 12 stages took
    171.2 us (lanes32_profile_minilm.json) against 113.7 in one workgroup a row. In the per-kernel profile
    of the final plans (out_vec4_h200/minilm.json) the 12 stages took 111.5 us at 128 lanes, 121.6 at 256.

    Workgroups of fewer invocations (LAYER_NORM_WG), on an H100 (``bench/plan_ab.py``, MiniLM's plan, three
    alternated rounds, bench/results/token_pool_chunks_h100/ab_minilm_variants.json, GPU us per run): 128 lanes
    in 256 (the defaults) 1030.0-1034.8, 32 lanes in 64 1036.0-1036.7, 32 in 32 (a row a workgroup, its sums in
    one subgroup) 1032.0-1034.5, 64 in 64 1037.1-1037.5."""
    quads = LAYER_NORM_QUADS and n % 4 == 0
    width = 4 if quads else 1
    lanes = LAYER_NORM_QUAD_MIN_LANES if quads else LAYER_NORM_MIN_LANES
    name = "LAYER_NORM_QUAD_MIN_LANES" if quads else "LAYER_NORM_MIN_LANES"
    wg = LAYER_NORM_WG
    if not (isinstance(wg, int) and 1 <= wg <= 256 and wg & (wg - 1) == 0):
        raise LoweringError(f"LAYER_NORM_WG must be a power of two from 1 to 256, got {wg!r}")
    if not (isinstance(lanes, int) and 1 <= lanes <= wg and lanes & (lanes - 1) == 0):
        raise LoweringError(f"{name} must be a power of two from 1 to {wg} (the lanes of a row "
                            f"in a workgroup of LAYER_NORM_WG = {wg}), got {lanes!r}")
    units = n // width
    while lanes < wg and math.ceil(units / lanes) * width > LAYER_NORM_HELD:
        lanes *= 2
    values = math.ceil(units / lanes)
    return lanes, values if values * width <= LAYER_NORM_HELD else 0, width


def layer_norm_stage(n: int, centred: bool, pair: bool = False) -> tuple[int, dict, tuple, Buffer]:
    """The layout of matmul_split_layer_norm.wgsl for rows of ``n`` (:func:`layer_norm_lanes`):
    (lanes, slots, the weights' bindings, the output's binding); the caller adds the VALUE slot
    (:func:`layer_norm_value`), SPLITS and EPILOGUE. ``centred``: LayerNorm (gamma and beta) or
    RmsNorm (gamma). ``pair``: the output [2, M, N] holds the rows' values, then the normalised rows
    (FusedMatMulLayerNormPair)."""
    lanes, values, width = layer_norm_lanes(n)
    elem = "vec4<f32>" if width == 4 else "f32"
    shift = " + beta[u]" if centred else ""
    x = "" if width == 4 else ".x"
    at = f"i * (p.n / {width}u) + u"
    normed = f"p.m * (p.n / {width}u) + {at}" if pair else at
    store = (f"fn put(i: u32, u: u32, y: vec4<f32>) {{\n    out[{normed}] = y{x} * gamma[u]{shift};\n}}\n\n"
             f"fn put_value(i: u32, u: u32, v: vec4<f32>) {{\n" + (f"    out[{at}] = v{x};\n" if pair else "") + "}")
    slots = dict(VALUES=values, LANES=lanes, WG=LAYER_NORM_WG, WIDTH=width, CENTRED="true" if centred else "false",
                 STORE=store, PAIR="true" if pair else "false",
                 KEEP="vec4<f32>(1.0)" if width == 4 else "vec4<f32>(1.0, 0.0, 0.0, 0.0)")
    weights = (Buffer("gamma", elem), Buffer("beta", elem)) if centred else (Buffer("gamma", elem),)
    return lanes, slots, weights, Buffer("out", elem, write=True)


def layer_norm_groups(rows: int, lanes: int) -> int:
    """Workgroups of matmul_split_layer_norm.wgsl over ``rows`` rows of ``lanes`` lanes (:func:`layer_norm_stage`):
    LAYER_NORM_WG / lanes rows a workgroup."""
    return math.ceil(rows * lanes / LAYER_NORM_WG)


def layer_norm_value(width: int, value: str) -> str:
    """matmul_split_layer_norm.wgsl's VALUE from ``value``, a WGSL function value(i, j) -> f32 giving
    C[i, j]: it and value4(i, j), the unit of ``width`` columns from j."""
    if width == 4:
        unit = "vec4<f32>(value(i, j), value(i, j + 1u), value(i, j + 2u), value(i, j + 3u))"
    else:
        unit = "vec4<f32>(value(i, j), 0.0, 0.0, 0.0)"
    return f"{value}\n\nfn value4(i: u32, j: u32) -> vec4<f32> {{\n    return {unit};\n}}"


#: matmul_split_layer_norm.wgsl's VALUE for a product's LayerNorm stage with single columns: the splits'
#: partial sums of element (i, j) added, then the product's epilogue.
_PARTIAL_SUMS = """fn value(i: u32, j: u32) -> f32 {
    let at = i * p.n + j;
    var v = 0.0;
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part[s * p.m * p.n + at];
    }
    return epilogue(i, j, v);
}"""

#: The same for quads (part bound as vec4): the splits' quads added, then the epilogue of each element.
_PARTIAL_SUMS_QUADS = """fn value4(i: u32, j: u32) -> vec4<f32> {
    let at = (i * p.n + j) / 4u;
    let stride = p.m * p.n / 4u;
    var v = vec4<f32>();
    for (var s = 0u; s < SPLITS; s = s + 1u) {
        v = v + part[s * stride + at];
    }
    return vec4<f32>(epilogue(i, j, v.x), epilogue(i, j + 1u, v.y), epilogue(i, j + 2u, v.z),
                     epilogue(i, j + 3u, v.w));
}"""


def _final_stage(final: str | None, splits: int, row_sums: bool, m: int, k: int, n: int, eps: float, norm_eps: float,
                 epilogue: tuple, operands: list, lines: list[str], fixed: int) -> Kernel:
    # The second dispatch of a two-stage product, reading the first's scratch buffer: the splits'
    # sums, the row scale (row_sums) and the epilogue, then the final step: None (C itself),
    # 'swiglu' (SwiGLUConcat of C), 'layer_norm' (each row of C normalised; gamma and beta are
    # the node's inputs fixed and fixed + 1, the epilogue operands follow them), 'layer_norm_pair' (C's
    # rows, then the normalised rows: an output [2, M, N]) or 'rms_norm' (each
    # row of C divided by its root mean square; its weight is the node's input fixed, the epilogue
    # operands follow it).
    from .fused_epilogue import step_label

    chain = "".join(f"+{step_label(s)}" for s in epilogue)
    if final in ("layer_norm", "layer_norm_pair", "rms_norm") and row_sums:
        raise LoweringError(f"a {final} final step takes no RmsNorm prologue: its reduction does not scale rows")
    if final in ("layer_norm", "layer_norm_pair", "rms_norm"):
        lanes, slots, weights, out = layer_norm_stage(n, final != "rms_norm", pair=final == "layer_norm_pair")
        value = _PARTIAL_SUMS_QUADS if slots["WIDTH"] == 4 else layer_norm_value(1, _PARTIAL_SUMS)
        slots.update(SPLITS=splits, EPILOGUE="\n".join(lines), VALUE=value)
        first = fixed + len(weights)  # the first epilogue operand among the node's inputs
        return Kernel(f"matmul_split{splits}_{final}{chain}", "matmul_split_layer_norm.wgsl",
                      layer_norm_groups(m, lanes),
                      params=(("m", "u32", m), ("n", "u32", n), ("eps", "f32", norm_eps)),
                      bindings=(Buffer("part", out.elem), *weights, *operands, out),
                      inputs=(SCRATCH, *range(fixed, first), *range(first, first + len(operands))), slots=slots)
    if final not in (None, "swiglu"):
        raise LoweringError(f"unknown final step {final!r} of a matmul: 'swiglu', 'layer_norm', 'layer_norm_pair', "
                            "'rms_norm' or None")
    gated = final == "swiglu"
    width = n // 2 if gated else n
    quads = reduce_quads(m, n, width, splits, row_sums)
    name = f"matmul_split{splits}_reduce" + ("_rms_norm" if row_sums else "") + ("_swiglu" if gated else "") + chain
    elem = "vec4<f32>" if quads else "f32"
    return Kernel(name, "matmul_split_reduce.wgsl", elementwise_groups(m * width // (4 if quads else 1)),
                  params=(("m", "u32", m), ("n", "u32", n), ("k", "u32", k), ("eps", "f32", eps)),
                  bindings=(Buffer("part", elem), *operands, Buffer("out", elem, write=True)),
                  inputs=(SCRATCH, *range(fixed, fixed + len(operands))),
                  slots=dict(SPLITS=splits, ROW_SUMS="true" if row_sums else "false",
                             GATED="true" if gated else "false", QUADS="true" if quads else "false",
                             ACCESS=_REDUCE_QUADS if quads else _REDUCE_FLOATS, EPILOGUE="\n".join(lines)))


#: Whether matmul_split_reduce.wgsl adds a quad of output columns an invocation (part and out bound as
#: vec4<f32>) rather than one float: :func:`reduce_quads`; the sums are the same bit for bit. Off: on an H100 the
#: reduction took 2.5-3.7 us either way (within 0.2 us; near a dispatch's fixed cost) and the prefill and MiniLM
#: plans were unchanged (bench/results/quads_h100/).
SPLIT_REDUCE_QUADS = False


def reduce_quads(m: int, n: int, width: int, splits: int, row_sums: bool) -> bool:
    """Whether the second dispatch of a split product of ``m`` x ``n`` (an output ``width`` wide: ``n`` / 2
    after SwiGLU) reads and writes quads: :data:`SPLIT_REDUCE_QUADS`, ``n`` and ``width`` multiples of 4 (each
    quad within a row) and, after the RmsNorm prologue, the row sums' ``splits * m`` floats too (the scratch
    buffer then holds whole vec4s)."""
    return SPLIT_REDUCE_QUADS and n % 4 == 0 and width % 4 == 0 and (not row_sums or splits * m % 4 == 0)


#: matmul_split_reduce.wgsl's ACCESS with part and out bound as f32 / as vec4<f32> (QUADS).
_REDUCE_FLOATS = """fn part1(e: u32) -> f32 {
    return part[e];
}

fn part4(e: u32) -> vec4<f32> {  // unused: QUADS is false
    return vec4<f32>(part[e], part[e + 1u], part[e + 2u], part[e + 3u]);
}

fn put1(at: u32, v: f32) {
    out[at] = v;
}

fn put4(at: u32, v: vec4<f32>) {  // unused: QUADS is false
    out[at] = v.x;
}"""

_REDUCE_QUADS = """fn part1(e: u32) -> f32 {
    return part[e / 4u][e % 4u];
}

fn part4(e: u32) -> vec4<f32> {
    return part[e / 4u];
}

fn put1(at: u32, v: f32) {  // unused: QUADS is true
    out[at / 4u][at % 4u] = v;
}

fn put4(at: u32, v: vec4<f32>) {
    out[at / 4u] = v;
}"""


_PLAIN_VARIANT = {"MatMul": "", "MatMulAT": "AT", "MatMulBT": "BT"}


def workgroup_storage(target) -> int:
    """Bytes of workgroup memory a kernel may take on ``target`` (maxComputeWorkgroupStorageSize)."""
    return int(target.limits.get("max-compute-workgroup-storage-size", WORKGROUP_STORAGE))


def max_storage_buffers(target) -> int:
    """The storage buffers ``target`` lets one kernel bind (maxStorageBuffersPerShaderStage)."""
    return int(target.limits.get("max-storage-buffers-per-shader-stage", 8))


def max_scratch_bytes(target) -> int:
    """The largest scratch buffer ``target``'s limits allow one dispatch to bind."""
    return min(int(target.limits["max-storage-buffer-binding-size"]), int(target.limits["max-buffer-size"]))


def matmul_kernel(node, ins, target) -> Kernel | list[Kernel]:
    """The kernel builder of every op of the matmul family."""
    rms_norm = node.op == "FusedRmsNormMatMul"
    layer_norm = node.op == "FusedLayerNormMatMul"
    swiglu = node.op == "FusedSwiGLUMatMul"
    variant = node.attrs["variant"] if node.op.startswith("Fused") else _PLAIN_VARIANT[node.op]
    m, n = node.type.shape
    k = ins[0].shape[0] if variant == "AT" else ins[0].shape[1]
    if swiglu:
        k //= 2  # A holds gate and up side by side
    fixed = 3 if rms_norm else 4 if layer_norm else 2
    return matmul_kernel_for(variant, tuple(node.attrs.get("epilogue", ())), m, k, n, rms_norm=rms_norm,
                             layer_norm=layer_norm, eps=float(node.attrs["eps"]) if rms_norm or layer_norm else 0.0,
                             operand_types=tuple(ins[fixed:]),
                             swiglu=swiglu, max_scratch_bytes=max_scratch_bytes(target),
                             storage_buffers=max_storage_buffers(target), device_barriers=target.device_barriers,
                             workgroup_storage=workgroup_storage(target))
