"""TokenPool (ir/ops/token_pool.py) on the GPU against the numpy reference: rows of quads and of
single columns, fewer and more units than a workgroup's 256 lanes (one row group, several, and
chunks of units), sequences shorter and longer than a step of eight rows per group and than 256
(the count's loop), f32 weights and i32 masks, a wholly masked sequence (the count's clamp and the
norm's), an infinity under a zero weight (NaN, as the reference's sum gives) and a NaN token under
normalize (a NaN embedding, not one scaled by 1 / min_norm)."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session


def _mask(b: int, s: int) -> np.ndarray:
    # sequence i keeps its first s - i tokens (none once i >= s)
    keep = np.arange(s)[None, :] < (s - np.arange(b))[:, None]
    return keep.astype(np.int32)


def _row(shape, mean: bool, normalize: bool, weights: str = "f32", feeds=None, tag: str = "", **kw) -> Row:
    b, s, _ = shape

    def build(g: Graph) -> int:
        w = g.input("w", [b, s], DType.I32 if weights == "i32" else DType.F32)
        return g.add_node("TokenPool", (g.input("x", list(shape)), w), mean=mean, normalize=normalize)

    given = dict(feeds or {})
    if weights == "i32":
        given.setdefault("w", _mask(b, s))
    rid = f"TokenPool{list(shape)}{weights}{'-mean' if mean else ''}{'-normalize' if normalize else ''}{tag}"
    return Row("TokenPool", rid, build, given, **kw)


# the steps of eight rows a group: none (every shape of the first line), several and a tail (the second line)
_SHAPES = [(1, 1, 1), (2, 7, 32), (3, 5, 9), (2, 13, 384), (1, 6, 1028), (2, 3, 300), (3, 130, 8), (2, 300, 4),
           (2, 40, 384), (1, 19, 1028), (2, 130, 384), (2, 21, 5)]


def _zero_sequence() -> dict:
    w = _mask(3, 5)
    w[2] = 0  # keeps no token: a mean of 0 / 1e-9 and a norm of 0 / 1e-12, both 0
    return {"w": w}


def _nan_in_x() -> dict:
    # a NaN token of the first sequence: its mean and its norm are NaN, so its whole embedding is (numpy's maximum
    # and the unfused Clip keep a NaN); the second sequence stays finite
    x = np.random.default_rng(6).standard_normal((2, 4, 8)).astype(np.float32)
    x[0, 1, 2] = np.nan
    return {"x": x, "w": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)}


def _inf_under_zero() -> dict:
    x = np.random.default_rng(5).standard_normal((2, 4, 8)).astype(np.float32)
    x[1, 3, 2] = np.inf
    return {"x": x, "w": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)}


ROWS: list[Row] = [
    *[_row(shape, mean, normalize, weights) for shape in _SHAPES for mean in (False, True)
      for normalize in (False, True) for weights in ("f32", "i32") if weights == "i32" or not mean],
    _row((3, 5, 12), True, True, "i32", _zero_sequence(), "-zero-sequence"),
    _row((3, 5, 7), True, True, "i32", {"w": _zero_sequence()["w"]}, "-zero-sequence"),
    _row((2, 4, 8), True, False, "i32", _inf_under_zero(), "-inf-under-zero", finite=False),
    *[_row((2, 4, 8), mean, True, "i32", _nan_in_x(), "-nan-in-x", finite=False) for mean in (False, True)],
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


def test_wholly_masked_sequence_pools_to_zeros(device):
    # sentence-transformers' clamps, worked by hand: a sequence without a kept token has the mean 0 / 1e-9 and the
    # norm max(0, 1e-12), so its embedding is zeros, not NaN; the other, tokens [1, 2] and [3, 4] kept, has the mean
    # [2, 3] and the embedding [2, 3] / sqrt(13)
    g = Graph()
    g.set_outputs([g.add_node("TokenPool", (g.input("x", [2, 3, 2]), g.input("m", [2, 3], DType.I32)), mean=True,
                              normalize=True)])
    x = np.array([[[1, 2], [3, 4], [100, 100]], [[5, 6], [7, 8], [9, 10]]], np.float32)
    (got,) = Session(lower_for(g, device), {}, device=device).run({"x": x, "m": np.array([[1, 1, 0], [0, 0, 0]],
                                                                                           np.int32)})
    np.testing.assert_allclose(got, [[2 / 13 ** 0.5, 3 / 13 ** 0.5], [0, 0]], rtol=1e-6)


# (shape, chunks): sentences cut into chunks of workgroups (token_pool_chunks), up to TOKEN_POOL_MAX_CHUNKS; rows of
# quads and of single columns, of more than 256 units (two passes over the units), the last chunk short
_CHUNKED = [((2, 130, 384), 9), ((8, 128, 384), 8), ((1, 19, 1028), 3), ((3, 70, 30), 2), ((2, 20, 1030), 3),
            ((1, 530, 1028), 34)]


def _pool_graph(shape) -> Graph:
    b, s, _ = shape
    g = Graph()
    g.set_outputs([g.add_node("TokenPool", (g.input("x", list(shape)), g.input("m", [b, s], DType.I32)), mean=True,
                              normalize=True)])
    return g


@pytest.mark.parametrize("subgroups", [True, False])
@pytest.mark.parametrize("shape,chunks", _CHUNKED, ids=[str(list(s)) for s, _ in _CHUNKED])
def test_chunked_sentences_match_the_reference_run_after_run(shape, chunks, subgroups, device):
    # the last workgroup of each sentence adds the chunks' sums, and zeroes the sentence's counter for the next
    # run: three runs of one session on other inputs each match the reference, and leave the counters (a buffer of
    # the node's, one a sentence) zero (one left non-zero would let a workgroup pool its sentence before the other
    # chunks' sums were stored); the count's and the norm's sums in subgroups and as trees (reduce.wgsl)
    from eggfuse.ir.ops.token_pool import token_pool_ref
    from eggfuse.runtime.device import subgroup_reductions_usable

    if subgroups and not subgroup_reductions_usable(device):
        pytest.skip("the device has no usable subgroups")
    b, s, h = shape
    plan = lower_for(_pool_graph(shape), device, subgroups=subgroups)
    assert [d.kernel for d in plan.dispatches] == [f"token_pool_{'vec4' if h % 4 == 0 else 'f32'}_chunks{chunks}"
                                                   + ("+sg" if subgroups else "")]
    (counters,) = [buf for buf in plan.buffers if buf.kind == "counters"]
    assert counters.shape == (b,)
    session = Session(plan, {}, device=device)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        m = (rng.random((b, s)) < 0.6).astype(np.int32)
        (got,) = session.run({"x": x, "m": m})
        want = token_pool_ref((x, m), {"mean": True, "normalize": True, "min_count": 1e-9, "min_norm": 1e-12})
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
        np.testing.assert_array_equal(session._read_buffer(counters.index, counters.type, "the counters"), 0)


def test_chunked_sentences_keep_the_clamps_and_the_nans(device):
    # [3, 40, 384]: 3 chunks of 16 tokens a sentence. Sentence 0 keeps no token (its mean 0 / 1e-9 and its norm
    # max(0, 1e-12): zeros), sentence 1 has a NaN in its last chunk (a NaN embedding), sentence 2 an infinity under
    # a zero weight in its second chunk (0 * inf: NaN, as the reference's sum gives)
    b, s, h = 3, 40, 384
    x = np.random.default_rng(7).standard_normal((b, s, h)).astype(np.float32)
    m = np.ones((b, s), np.int32)
    m[0] = 0
    x[1, 37, 5] = np.nan
    x[2, 20, 3], m[2, 20] = np.inf, 0
    plan = lower_for(_pool_graph((b, s, h)), device)
    assert plan.dispatches[0].kernel.startswith("token_pool_vec4_chunks3")
    (got,) = Session(plan, {}, device=device, finite_inputs=False).run({"x": x, "m": m})
    np.testing.assert_array_equal(got[0], 0)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()


def test_one_workgroup_a_sentence_where_barriers_do_not_reach_other_workgroups(monkeypatch):
    # on Metal (device_barriers False) and with TOKEN_POOL_CHUNKS off a sentence keeps one workgroup
    from eggfuse.ir.ops import token_pool
    from eggfuse.lowering import lower

    g = Graph()
    g.set_outputs([g.add_node("TokenPool", (g.input("x", [2, 130, 384]), g.input("w", [2, 130])))])
    assert lower(g).dispatches[0].kernel == "token_pool_vec4_chunks9"
    assert lower(g, device_barriers=False).dispatches[0].kernel == "token_pool_vec4"
    monkeypatch.setattr(token_pool, "TOKEN_POOL_CHUNKS", False)
    assert lower(g).dispatches[0].kernel == "token_pool_vec4"


@pytest.mark.parametrize("s,groups,want", [(128, 2, (8, 16)), (16, 2, (1, 16)), (17, 2, (2, 16)), (512, 1, (64, 8)),
                                           (513, 1, (33, 16)), (530, 1, (34, 16)), (300, 256, (1, 300)),
                                           (5000, 2, (63, 80))])
def test_token_pool_chunks(s, groups, want):
    # a chunk holds TOKEN_POOL_STEP rows a group (8), a sentence at most TOKEN_POOL_MAX_CHUNKS (64) chunks, longer
    # sentences chunks of a multiple of the 8 rows
    from eggfuse.ir.ops.token_pool import token_pool_chunks

    assert token_pool_chunks(s, groups) == want
    assert token_pool_chunks(s, groups, device_barriers=False) == (1, s)
