"""GeneralAttention, AttentionScores, SplitHeads and RotaryEmbedding on the GPU against the
numpy reference (tests/op_table.py): both layouts, GQA, head sizes of V apart from Q/K and not
multiples of 4, every mask kind (additive with -inf, boolean, broadcast, shorter than the
keys), fully masked rows, causal offsets, windows, kv lengths, softcap, several key tiles.
GeneralAttention's rows run on both of its kernels: attention_lanes.wgsl where the lowering takes it
(general_lanes_tiles) and attention_general.wgsl (GENERAL_LANES_MAX_HEAD_DIM 0); LANES_ROWS are the forms
the lanes kernel takes, with masks of -inf, of the lowest f32 (transformers' masked_fill) and of +inf,
fully masked rows, more query rows than a workgroup's and more keys than a tile's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops import attention_general


def _qkv(g: Graph, rank: int, b: int, nh: int, nkv: int, sq: int, skv: int, d: int, dv: int):
    if rank == 4:
        shapes = ([b, nh, sq, d], [b, nkv, skv, d], [b, nkv, skv, dv])
    else:
        shapes = ([b, sq, nh * d], [b, skv, nkv * d], [b, skv, nkv * dv])
    return [g.input(name, shape) for name, shape in zip("qkv", shapes, strict=True)]


def _neg_inf_mask(shape, seed: int, fully_masked_row: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(shape).astype(np.float32)
    m[rng.random(shape) < 0.3] = -np.inf
    if fully_masked_row is not None:
        m[..., fully_masked_row, :] = -np.inf
    return m


def _plus_inf_mask() -> np.ndarray:
    m = _neg_inf_mask([3, 5], 7)
    m[1, 2] = np.inf
    return m


def _general(tag: str, rank: int, b: int, nh: int, nkv: int, sq: int, skv: int, d: int, dv: int, *,
             mask=None, lens: bool = False, feeds=None, mode: int | None = None, finite: bool = True, **attrs) -> Row:
    attrs.setdefault("scale", 1.0 / math.sqrt(d))

    def build(g: Graph) -> int:
        q, k, v = _qkv(g, rank, b, nh, nkv, sq, skv, d, dv)
        extra = []
        if isinstance(mask, np.ndarray):
            extra.append(g.constant(mask, shape=mask.shape, dtype=DType.BOOL if mask.dtype == bool else DType.F32))
        elif mask is not None:  # (shape, dtype): a fed mask
            extra.append(g.input("mask", mask[0], mask[1]))
        if lens:
            if not extra:
                extra.append(g.constant(np.zeros(skv, np.float32)))
            extra.append(g.input("kv_lens", [b], DType.I32))
        heads = dict(num_heads=nh, kv_num_heads=nkv)
        if mode is None:
            return g.add_node("GeneralAttention", (q, k, v, *extra), **heads, **attrs)
        return g.add_node("AttentionScores", (q, k, *extra), mode=mode, **heads, **attrs)

    op = "GeneralAttention" if mode is None else "AttentionScores"
    return Row(op, f"{op}-{tag}", build, feeds or {}, finite=finite)


def _packed(tag: str, b: int, nh: int, nkv: int, s: int, d: int, *, mask=None, **attrs) -> Row:
    # one [B, S, (H + 2 KV) D] tensor as q, k and v (the packed attribute); mask: (shape, dtype) of a fed mask
    def build(g: Graph) -> int:
        x = g.input("x", [b, s, (nh + 2 * nkv) * d])
        extra = [g.input("mask", mask[0], mask[1])] if mask else []
        return g.add_node("GeneralAttention", (x, x, x, *extra), scale=1.0 / math.sqrt(d), num_heads=nh,
                          kv_num_heads=nkv, packed=True, **attrs)

    return Row("GeneralAttention", f"GeneralAttention-packed-{tag}", build, finite=attrs.get("masked_rows") != "nan")


ROWS: list[Row] = [
    _packed("gqa-hd8", 2, 4, 2, 5, 8),
    _packed("hd6-mask-4d", 2, 3, 1, 7, 6, mask=([2, 3, 7, 7], DType.F32)),
    _packed("hd32-bool-nan-rows", 3, 2, 2, 9, 32, mask=([3, 1, 1, 9], DType.BOOL), masked_rows="nan"),
    _packed("hd8-causal", 1, 2, 2, 70, 8, causal=True),
    _general("4d-gqa", 4, 2, 4, 2, 5, 7, 8, 8),
    _general("3d-causal-offset-softcap-odd", 3, 2, 3, 1, 9, 13, 6, 10, causal=True, offset=4, softcap=2.0),
    _general("4d-causal-square-64", 4, 1, 2, 2, 70, 70, 64, 64, causal=True),
    _general("3d-tiles-hd32", 3, 2, 4, 2, 67, 131, 32, 32, scale=0.05),
    _general("4d-float-mask-short", 4, 2, 3, 3, 6, 9, 8, 12, mask=_neg_inf_mask([2, 1, 6, 7], 1, 2)),
    _general("4d-float-mask-rank1", 4, 1, 2, 1, 5, 6, 4, 4, mask=_neg_inf_mask([6], 2), causal=True),
    _general("3d-float-mask-heads", 3, 2, 4, 2, 5, 8, 8, 8, mask=_neg_inf_mask([4, 5, 8], 3), softcap=0.5),
    _general("4d-bool-mask-fed", 4, 2, 2, 1, 7, 5, 8, 8, mask=([7, 5], DType.BOOL),
             feeds={"mask": np.array([[1, 0, 1, 1, 0]] * 3 + [[0] * 5] + [[1, 1, 0, 0, 1]] * 3, dtype=bool)}),
    _general("4d-bool-mask-4d", 4, 2, 3, 3, 4, 6, 8, 8, mask=([2, 3, 4, 6], DType.BOOL)),
    _general("4d-lens-causal", 4, 3, 4, 2, 2, 7, 8, 8, lens=True, causal=True,
             feeds={"kv_lens": np.array([7, 1, 4], dtype=np.int32)}),
    _general("4d-lens-mask-window", 4, 2, 2, 2, 4, 8, 8, 8, lens=True, causal=True, left_window=2,
             mask=_neg_inf_mask([1, 8], 4), feeds={"kv_lens": np.array([8, 3], dtype=np.int32)}),
    _general("4d-window-both", 4, 1, 1, 1, 9, 9, 3, 3, left_window=1, right_window=2),
    _general("4d-window-offset", 4, 2, 2, 1, 4, 10, 8, 5, left_window=3, causal=True, offset=6),
    _general("4d-wide-v", 4, 1, 2, 2, 3, 5, 8, 1030),
    _general("4d-head-256", 4, 1, 1, 1, 3, 70, 256, 256, scale=0.1),
    _general("mode0", 4, 2, 4, 2, 5, 7, 8, 8, mode=0, softcap=1.0),
    _general("mode1-3d", 3, 2, 3, 1, 4, 6, 5, 5, mode=1, softcap=1.0),
    _general("mode2", 4, 2, 2, 2, 4, 6, 8, 8, mode=2, mask=_neg_inf_mask([4, 6], 5), causal=True, finite=False),
    _general("mode3", 4, 2, 2, 2, 4, 300, 8, 8, mode=3, mask=_neg_inf_mask([2, 1, 4, 290], 6, 1), softcap=3.0),
    _general("mode3-lens", 4, 2, 2, 1, 3, 5, 8, 8, mode=3, lens=True, causal=True,
             feeds={"kv_lens": np.array([5, 1], dtype=np.int32)}),
    # masked_rows nan: a row without an allowed key is NaN (an unguarded softmax's), the others as with zero
    _general("4d-float-mask-nan-rows", 4, 2, 3, 3, 6, 9, 8, 12, mask=_neg_inf_mask([2, 1, 6, 7], 1, 2),
             masked_rows="nan", finite=False),
    _general("3d-lens-nan-rows", 3, 2, 2, 1, 3, 5, 8, 8, lens=True, causal=True, masked_rows="nan", finite=False,
             feeds={"kv_lens": np.array([5, 1], dtype=np.int32)}),
    _general("mode3-nan-rows", 4, 2, 2, 2, 4, 300, 8, 8, mode=3, mask=_neg_inf_mask([2, 1, 4, 290], 6, 1),
             masked_rows="nan", finite=False),
    # a +inf mask entry: its row's softmax is NaN, which both forms read as a row without a key (zeros, or NaN)
    *[_general(f"mode3-plus-inf-{rows}", 4, 1, 1, 1, 3, 5, 4, 4, mode=3, mask=_plus_inf_mask(), masked_rows=rows,
               finite=False) for rows in ("zero", "nan")],
    Row("SplitHeads", "SplitHeads[2,5,12]h3", lambda g: g.add_node("SplitHeads", (g.input("x", [2, 5, 12]),),
                                                                   num_heads=3)),
]


def _rotary(tag: str, x_shape, cache_shape, *, ids=None, **attrs) -> Row:
    def build(g: Graph) -> int:
        ins = [g.input("x", x_shape), g.input("cos", cache_shape), g.input("sin", cache_shape)]
        if ids is not None:
            ins.append(g.input("ids", list(ids.shape), DType.I32))
        return g.add_node("RotaryEmbedding", ins, **attrs)

    return Row("RotaryEmbedding", f"RotaryEmbedding-{tag}", build, {} if ids is None else {"ids": ids})


_IDS = np.array([[0, 7, 3, 11, 2], [5, 5, 1, 0, 12]], dtype=np.int32)
ROWS += [
    _rotary("4d-ids", [2, 3, 5, 8], [13, 4], ids=_IDS),
    _rotary("3d-ids-interleaved", [2, 5, 24], [13, 4], ids=_IDS, num_heads=3, interleaved=True),
    _rotary("4d-rot-dim", [2, 3, 5, 10], [13, 3], ids=_IDS, rotary_embedding_dim=6),
    _rotary("4d-rot-dim-interleaved", [2, 3, 5, 10], [13, 2], ids=_IDS, rotary_embedding_dim=4, interleaved=True),
    _rotary("3d-no-ids", [2, 5, 12], [2, 5, 3], num_heads=2),
    _rotary("4d-no-ids-batch1", [3, 2, 5, 6], [1, 5, 3]),
    _rotary("3d-ids-batch1", [2, 5, 6], [13, 3], ids=_IDS[:1], num_heads=1),
]


def _lowest_mask(shape, seed: int) -> np.ndarray:
    # transformers' masked_fill(mask, finfo.min): row 1 all lowest (the reference averages v there), a third of
    # the others' keys lowest
    m = _neg_inf_mask(shape, seed)
    lowest = np.finfo(np.float32).min
    m[np.isneginf(m)] = lowest
    m[..., 1, :] = lowest
    return m


def _nan_mask() -> np.ndarray:
    m = _neg_inf_mask([3, 6], 5)
    m[1, 2] = np.nan
    return m


def _huge_mask() -> np.ndarray:
    # values past f32 max / log2(e): row 0's key 1 dominates, row 2 keeps its key 3 of -2.5e38 among keys of -3e38
    m = np.zeros([3, 6], np.float32)
    m[0, 1] = 3e38
    m[2, :] = -3e38
    m[2, 3] = -2.5e38
    return m


_NAN_K = np.random.default_rng(12).standard_normal([1, 2, 6, 4]).astype(np.float32)
_NAN_K[0, 0, 2, 1] = np.nan  # head 0's rows all see it

LANES_ROWS: list[Row] = [
    _general("lanes-4d-float-mask-short-gqa", 4, 2, 4, 2, 70, 37, 16, 16, mask=_neg_inf_mask([2, 1, 70, 33], 8, 3)),
    _general("lanes-4d-float-mask-nan-rows", 4, 1, 2, 2, 9, 21, 8, 8, mask=_neg_inf_mask([1, 2, 9, 21], 9, 4),
             masked_rows="nan", finite=False),
    _general("lanes-3d-lowest-mask", 3, 2, 2, 1, 6, 19, 12, 12, mask=_lowest_mask([2, 2, 6, 19], 10)),
    _general("lanes-3d-plus-inf", 3, 1, 1, 1, 3, 5, 4, 4, mask=_plus_inf_mask(), finite=False),
    _general("lanes-3d-hd6-heads-mask", 3, 2, 3, 3, 5, 8, 6, 6, mask=_neg_inf_mask([3, 5, 8], 11)),
    _general("lanes-4d-hd64-bool", 4, 1, 2, 1, 65, 20, 64, 64, mask=([1, 1, 65, 20], DType.BOOL)),
    _packed("lanes-hd64-bias-4d", 2, 2, 2, 20, 64, mask=([2, 2, 20, 20], DType.F32)),
    # a NaN score (from the mask, or from k) empties its row: zeros, or NaN with masked_rows nan
    *[_general(f"lanes-nan-mask-{rows}", 4, 1, 1, 1, 3, 6, 4, 4, mask=_nan_mask(), masked_rows=rows, finite=False)
      for rows in ("zero", "nan")],
    _general("lanes-nan-key", 4, 1, 2, 2, 3, 6, 4, 4, feeds={"k": _NAN_K}, finite=False),
    _general("lanes-huge-mask", 4, 1, 1, 1, 3, 6, 4, 4, mask=_huge_mask()),
]


_CASES = [pytest.param(r, True, id=r.id) for r in ROWS + LANES_ROWS] + [
    pytest.param(r, False, id=f"{r.id}-general-kernel") for r in ROWS + LANES_ROWS if r.op == "GeneralAttention"]


@pytest.mark.parametrize(("row", "lanes"), _CASES)
def test_op_matches_reference(row: Row, lanes: bool, device, monkeypatch):
    if not lanes:  # GeneralAttention on attention_general.wgsl whatever its form
        monkeypatch.setattr(attention_general, "GENERAL_LANES_MAX_HEAD_DIM", 0)
    check_row(row, device, subgroups=None)


_EXP2_ROWS = [r for r in LANES_ROWS if "huge" not in r.id]  # (exp2 of mask values past 2.4e38 overflows)


@pytest.mark.parametrize("row", _EXP2_ROWS, ids=[r.id for r in _EXP2_ROWS])
def test_lanes_rows_with_exp2_weights(row: Row, device, monkeypatch):
    # GENERAL_LANES_EXP2: the other lanes ops' exp2 of log2(e)-scaled scores, kept for timing against exp
    monkeypatch.setattr(attention_general, "GENERAL_LANES_EXP2", True)
    check_row(row, device, subgroups=None)


@pytest.mark.parametrize("row", LANES_ROWS, ids=[r.id for r in LANES_ROWS])
def test_lanes_rows_take_the_lanes_kernel(row: Row, device):
    session = check_row(row, device, subgroups=None)
    assert [d.kernel.split("_hd")[0] for d in session.plan.dispatches] == ["attention_lanes_general"]
