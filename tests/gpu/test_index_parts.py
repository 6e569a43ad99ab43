"""Index inputs read in parts (lowering/plan.py ``_index_checks``, ``ExecutionPlan.index_parts``): an input
split by Slice, SliceCols, Select or Concat before its parts index tables of different sizes has each part
checked against its own table before a run, as onnxruntime checks each Gather, and the parts a table does not
read are not held to its bound. Values against the numpy reference (``eggfuse.ir.evaluate``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eggfuse import cache
from eggfuse.ir import DType, Graph, IndexRangeError, LoweringError, evaluate
from eggfuse.lowering import lower
from eggfuse.runtime import Session


def _tables(rows, rng) -> dict:
    return {f"t{i}": rng.standard_normal((r, 4)).astype(np.float32) for i, r in enumerate(rows)}


def _split_gathers(rows=(5, 7, 3)) -> Graph:
    # ids [2, 3] i32: column k (a Slice of it) indexes table k along axis 0
    g = Graph()
    ids = g.input("ids", [2, 3], DType.I32)
    outs = []
    for k, r in enumerate(rows):
        col = g.add_node("Slice", (ids,), starts=[k], ends=[k + 1], axes=[1], steps=[1])
        outs.append(g.add_node("Gather", (g.parameter(f"t{k}", [r, 4]), col), axis=0))
    g.set_outputs(outs)
    return g


def test_each_slice_of_an_index_input_is_checked_against_its_own_table(device):
    rng = np.random.default_rng(0)
    g = _split_gathers()
    params = _tables((5, 7, 3), rng)
    plan = lower(g, dict(device.limits))
    assert "ids" not in plan.index_bounds
    assert [(p.rows, p.positions.tolist()) for p in plan.index_parts["ids"]] == [(5, [0, 3]), (7, [1, 4]), (3, [2, 5])]
    session = Session(plan, params, device=device)
    good = np.array([[4, 6, 2], [-5, -7, -3]], np.int32)  # each column at its table's ends, from both sides
    for got, want in zip(session.run({"ids": good}), evaluate(g, {"ids": good}, params), strict=True):
        np.testing.assert_array_equal(got, want)
    for col, bad, rows in ((0, 5, 5), (1, 7, 7), (2, 3, 3), (1, -8, 7), (2, -4, 3)):
        ids = good.copy()
        ids[1, col] = bad
        with pytest.raises(IndexRangeError, match=rf"input 'ids': index {bad} out of range for the axis of {rows} "
                                                  rf"that Gather \(node \d+\) of parameter 't{col}' f32\[{rows},4\] "
                                                  r"indexes with it \(the 2 of its 6 elements that op reads\)") as e:
            session.run({"ids": ids})
        assert (e.value.input, e.value.index, e.value.rows) == ("ids", bad, rows)
    # the same plan from the compile cache's JSON checks the same parts
    back = cache.decode_plan(json.loads(json.dumps(cache.encode_plan(plan))), g)
    assert back.index_parts == plan.index_parts and back == plan
    ids = good.copy()
    ids[0, 2] = 3
    with pytest.raises(IndexRangeError, match=r"index 3 out of range for the axis of 3"):
        Session(back, params, device=device).run({"ids": ids})


def test_parts_of_select_read_by_tables_of_different_sizes_run(device):
    # part 0 of idx indexes 4 rows, part 1 100 rows: 50 in part 1 is valid, in part 0 it is not
    rng = np.random.default_rng(1)
    g = Graph()
    idx = g.input("idx", [2, 64], DType.U32)
    g.set_outputs([g.embedding(g.add_node("Select", (idx,), index=i), g.parameter(f"t{i}", [r, 4]))
                   for i, r in enumerate((4, 100))])
    params = _tables((4, 100), rng)
    plan = lower(g, dict(device.limits))
    assert [(p.rows, p.positions.tolist()) for p in plan.index_parts["idx"]] == [
        (4, list(range(64))), (100, list(range(64, 128)))]
    feeds = {"idx": np.stack([rng.integers(0, 4, 64), rng.integers(0, 100, 64)]).astype(np.uint32)}
    feeds["idx"][1, 7] = 50
    session = Session(plan, params, device=device)
    for got, want in zip(session.run(feeds), evaluate(g, feeds, params), strict=True):
        np.testing.assert_array_equal(got, want)
    feeds["idx"][0, 9] = 50
    with pytest.raises(IndexRangeError, match=r"input 'idx': index 50 out of range for the 4 rows that Embedding "
                                              r"\(node \d+\) of parameter 't0' f32\[4,4\] indexes with it \(the 64 of "
                                              r"its 128 elements that op reads\); give indices below 4"):
        session.run(feeds)


def test_a_whole_read_and_a_part_read_of_one_input(device):
    # ids indexes t0 (9 rows) whole, and its transposed column 1 (through Permute, then a Slice) t1 (3 rows);
    # a part whose table is no smaller than the whole read's needs no check of its own (t2, 12 rows); a second
    # input, read whole only, is still checked by the compiled staging
    rng = np.random.default_rng(2)
    g = Graph()
    ids = g.input("ids", [3, 2], DType.I32)
    other = g.input("other", [4], DType.I32)
    cols = g.add_node("Permute", (ids,), perm=[1, 0])
    outs = [g.add_node("Gather", (g.parameter("t0", [9, 4]), ids), axis=0),
            g.add_node("Gather", (g.parameter("t1", [3, 4]), g.add_node("Slice", (cols,), starts=[1], ends=[2],
                                                                          axes=[0], steps=[1])), axis=0),
            g.add_node("Gather", (g.parameter("t2", [12, 4]), g.add_node("Slice", (cols,), starts=[0], ends=[1],
                                                                           axes=[0], steps=[1])), axis=0),
            g.add_node("Gather", (g.parameter("t3", [6, 4]), other), axis=0)]
    g.set_outputs(outs)
    params = _tables((9, 3, 12, 6), rng)
    plan = lower(g, dict(device.limits))
    assert plan.index_bounds == {"ids": 9, "other": 6}
    assert [(p.rows, p.positions.tolist()) for p in plan.index_parts["ids"]] == [(3, [1, 3, 5])]
    feeds = {"ids": np.array([[8, 2], [-9, -3], [0, 1]], np.int32), "other": np.array([5, -6, 0, 1], np.int32)}
    session = Session(plan, params, device=device)
    for got, want in zip(session.run(feeds), evaluate(g, feeds, params), strict=True):
        np.testing.assert_array_equal(got, want)
    for name, where, bad, rows in (("ids", (0, 1), 3, 3), ("ids", (2, 0), 9, 9), ("other", (2,), 6, 6)):
        bad_feeds = {k: v.copy() for k, v in feeds.items()}
        bad_feeds[name][where] = bad
        with pytest.raises(IndexRangeError, match=rf"input '{name}': index {bad} out of range for the axis of {rows}"):
            session.run(bad_feeds)


def test_concat_of_an_input_and_constant_indices():
    # Concat([ids, constant])[0:3] indexes a table of 5 rows: ids is read whole through the Concat and the Slice;
    # the constant is checked when the graph is lowered, where the Slice reads it (its element 0) only
    for const, ok in (([4, 9], True), ([5, 1], False), ([-6, 1], False)):
        g = Graph()
        ids = g.input("ids", [2], DType.I32)
        both = g.add_node("Concat", (ids, g.constant(const, dtype=DType.I32)), axis=0)
        part = g.add_node("Slice", (both,), starts=[0], ends=[3], axes=[0], steps=[1])
        g.set_outputs([g.add_node("Gather", (g.parameter("t", [5, 4]), part), axis=0)])
        if ok:
            plan = lower(g)
            assert plan.index_bounds == {"ids": 5} and not plan.index_parts
        else:
            with pytest.raises(LoweringError, match=rf"Constant .*: constant indices reach {const[0]}, (which|below -5,"
                                                    r" the most) Gather \(node \d+\) of parameter 't' f32\[5,4\] "
                                                    r"reading them (bounds at 5 rows|counts from the end)"):
                lower(g)
