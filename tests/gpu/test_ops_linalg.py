"""BatchMatMul, PermutedBatchMatMul, GatheredBatchMatMul and Einsum (ir/ops/linalg.py) on the GPU against the
numpy reference: numpy matmul's 1-D operands and broadcast batches, transposed operands, each tile of the shared
GEMM kernel with edge tiles; permuted operands and column windows; gathered products; einsum transposes,
diagonals, traces, sums, ellipses, three operands."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph


def _bmm(a, b, trans_a: bool = False, trans_b: bool = False) -> Row:
    def build(g: Graph) -> int:
        return g.add_node("BatchMatMul", (g.input("a", a), g.parameter("b", b)), trans_a=trans_a, trans_b=trans_b)

    return Row("BatchMatMul", f"BatchMatMul{a}{b}{'-ta' if trans_a else ''}{'-tb' if trans_b else ''}", build)


def _permuted(a, perm, b, trans_b: bool = False, view=(), start: int = 0) -> Row:
    def build(g: Graph) -> int:
        return g.add_node("PermutedBatchMatMul", (g.input("a", a), g.parameter("b", b)), perm=perm, trans_b=trans_b,
                          view=view, start=start)

    window = f"-view{list(view)}@{start}" if view else ""
    return Row("PermutedBatchMatMul", f"PermutedBatchMatMul{a}{window}{perm}{b}{'-tb' if trans_b else ''}", build)


def _gathered(a, perm, b, idx, shape, n: int, trans_b: bool = False, view=(), start: int = 0, out_perm=()) -> Row:
    # n: the product's columns, which the indices (drawn in [-n, n), ONNX's negative ones from the end) pick
    def build(g: Graph) -> int:
        values = np.random.default_rng(sum(idx)).integers(-n, n, idx).astype(np.int32)
        return g.add_node("GatheredBatchMatMul", (g.input("a", a), g.parameter("b", b),
                                                  g.constant(values, shape=idx, dtype=DType.I32)),
                          perm=perm, trans_b=trans_b, view=view, start=start, shape=shape, out_perm=out_perm)

    window = f"-view{list(view)}@{start}" if view else ""
    return Row("GatheredBatchMatMul", f"GatheredBatchMatMul{a}{window}{perm}{b}{idx}->{shape}{list(out_perm)}", build)


def _einsum(equation: str, *shapes) -> Row:
    def build(g: Graph) -> int:
        return g.add_node("Einsum", [g.input(f"x{i}", s) for i, s in enumerate(shapes)], equation=equation)

    return Row("Einsum", f"Einsum[{equation}]{''.join(str(s) for s in shapes)}", build)


ROWS = [
    _bmm([3, 5], [5, 4]),
    _bmm([2, 70, 33], [2, 33, 65]),  # 64x64 tiles with edges in M, N and K
    _bmm([4, 10, 300], [300, 21]),  # 16x256 tile, a broadcast B
    _bmm([3, 30, 17], [3, 17, 130]),  # 32x128
    _bmm([3, 1, 3, 4], [1, 2, 4, 2]),  # both operands broadcast
    _bmm([2, 3, 2, 4, 5], [3, 2, 5, 3]),  # rank 5, the batch merged into two groups
    _bmm([4], [2, 4, 1]),
    _bmm([2, 3, 4], [4]),
    _bmm([7], [7]),  # rank 0
    _bmm([2, 7, 5], [9, 7], trans_a=True, trans_b=True),
    _bmm([5, 3], [2, 5, 6], trans_a=True),
    _bmm([2, 6, 5], [2, 4, 5], trans_b=True),
    # B stored [N, K] on each tile: 64x64 with edges in N and K, 32x128 with B broadcast, 16x256 (slices of 8)
    _bmm([3, 70, 37], [3, 133, 37], trans_b=True),
    _bmm([2, 20, 19], [150, 19], trans_b=True),
    _bmm([2, 10, 21], [2, 300, 21], trans_b=True),
    _bmm([2, 150, 37], [37, 70]),  # three row blocks, the last partial
    _bmm([3, 131, 20], [3, 67, 20], trans_b=True),
    # N % 4 == 0: results stored as quads (GEMM_STORE_QUADS) on 64x64 and 32x128 tiles, edges in M and N
    _bmm([2, 70, 37], [37, 68]),
    _bmm([2, 20, 9], [2, 132, 9], trans_b=True),
    # A read through a permutation: DeBERTa's head split times position keys (B broadcast over the batch),
    # 64x64 tiles with edges; K strided (the last axis moved); M and K swapped; rank 3; B batched in full
    _permuted([2, 70, 3, 33], [0, 2, 1, 3], [1, 3, 65, 33], trans_b=True),
    _permuted([2, 130, 3, 16], [0, 2, 1, 3], [1, 3, 70, 16], trans_b=True),
    _permuted([2, 70, 3, 16], [0, 2, 1, 3], [1, 3, 132, 16], trans_b=True),  # quads, DeBERTa's form
    _permuted([2, 5, 3, 4], [0, 2, 1, 3], [2, 3, 4, 6]),
    _permuted([3, 4, 2, 5], [2, 0, 3, 1], [4, 5]),
    _permuted([6, 3, 4], [1, 0, 2], [3, 7, 4], trans_b=True),
    _permuted([5, 7], [1, 0], [5, 3]),
    _permuted([2, 3, 30, 17], [1, 0, 2, 3], [17, 130]),  # 32x128, the batch axes swapped
    # a column window of a packed product [B S, 3 H D] seen as heads: q's columns and k's (DeBERTa's position
    # terms reading the packed Q/K/V product); a window of a 2-D A seen as [rows, H, D], the heads leading
    _permuted([14, 96], [0, 2, 1, 3], [1, 4, 16, 8], trans_b=True, view=(2, 7, 4, 8), start=32),
    _permuted([14, 96], [0, 2, 1, 3], [2, 4, 8, 5], view=(2, 7, 4, 8)),
    _permuted([12, 40], [1, 0, 2], [5, 6, 3], view=(12, 5, 6), start=7),
    # the gathered elements of such products: DeBERTa's position terms, q's window of a packed product times
    # position keys [1, H, P, D]^T gathered by a bucket table [1, S, S] over B H, as is and transposed; odd sizes,
    # indices in full (no broadcast), a product of plain A
    _gathered([14, 96], [0, 2, 1, 3], [1, 4, 16, 8], [1, 7, 7], [8, 7, 7], 16, trans_b=True, view=(2, 7, 4, 8),
              start=32),
    _gathered([14, 96], [0, 2, 1, 3], [1, 4, 16, 8], [1, 7, 7], [8, 7, 7], 16, trans_b=True, view=(2, 7, 4, 8),
              out_perm=(0, 2, 1)),
    _gathered([3, 5, 2, 9], [0, 2, 1, 3], [3, 2, 9, 11], [6, 5, 4], [6, 5, 4], 11),
    _gathered([2, 3, 5, 4], [0, 1, 2, 3], [1, 3, 13, 4], [1, 5, 6], [6, 5, 6], 13, trans_b=True, out_perm=(2, 0, 1)),
    # fewer matrices and rows gathered than the product has (as GatherElements allows)
    _gathered([2, 3, 5, 4], [0, 1, 2, 3], [1, 3, 13, 4], [1, 2, 6], [4, 2, 6], 13, trans_b=True),
    _einsum("ij->ji", [3, 4]),
    _einsum("abc->cab", [2, 3, 4]),
    _einsum("bii->bi", [3, 5, 5]),
    _einsum("ii", [6, 6]),  # implicit output: the trace
    _einsum("ij->i", [3, 40]),
    _einsum("i,i", [5], [5]),
    _einsum("i,j->ij", [3], [4]),
    _einsum("bij,bjk->bik", [5, 2, 3], [5, 3, 4]),
    _einsum("...ij,...jk->...ik", [2, 1, 3, 4], [5, 4, 2]),
    _einsum("ij,jk,kl->il", [2, 3], [3, 4], [4, 5]),
    _einsum("aB,Bc", [3, 4], [4, 2]),
    _einsum("->", []),
    _einsum("bhqd,bhkd->bhqk", [2, 3, 5, 8], [2, 3, 7, 8]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


@pytest.mark.parametrize("a, attrs, b, message", [
    ([2, 3, 4], dict(perm=[0, 2]), [4, 5], r"perm \[0, 2\] is not a permutation of A's 3 axes"),
    ([14, 96], dict(perm=[0, 2, 1, 3], view=(3, 5, 4, 8)), [8, 2],
     r"view \[3, 5, 4, 8\] does not split A's 14 rows from its columns"),
    ([14, 96], dict(perm=[0, 2, 1, 3], view=(2, 7, 4, 8), start=70), [8, 2],
     r"view \[2, 7, 4, 8\] from column 70 takes columns \[70, 102\) of A f32\[14,96\], which has 96"),
    ([2, 14, 96], dict(perm=[0, 2, 1, 3], view=(2, 7, 4, 8)), [8, 2], r"with view \[2, 7, 4, 8\], A must be 2-D"),
    ([2, 5, 3, 4], dict(perm=[0, 2, 1, 3]), [5, 2], r"inner dimensions differ"),
])
def test_permuted_batch_matmul_refuses_what_it_cannot_read(a, attrs, b, message):
    from eggfuse.ir import GraphError

    g = Graph()
    with pytest.raises(GraphError, match=r"PermutedBatchMatMul \(new node 2\): " + message):
        g.add_node("PermutedBatchMatMul", (g.input("a", a), g.input("b", b)), **attrs)


def test_a_product_of_a_permuted_a_and_a_1d_b_keeps_its_form():
    # BatchMatMul drops a 1-D B's axis from its product; PermutedBatchMatMul does not take a 1-D B, so the rule
    # reading the Permute in place leaves this product alone (it used to fail the optimisation)
    from eggfuse.ir import evaluate
    from eggfuse.rewrites import optimize

    g = Graph()
    x = g.input("x", [2, 5, 3, 4])
    g.set_outputs([g.add_node("BatchMatMul", (g.add_node("Permute", (x,), perm=[0, 2, 1, 3]), g.input("b", [4])))])
    opt, _ = optimize(g)
    assert "PermutedBatchMatMul" not in {n.op for n in opt.live_nodes()}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 3, 4)).astype(np.float32),
             "b": np.arange(4, dtype=np.float32)}
    np.testing.assert_allclose(evaluate(opt, feeds, {})[0], evaluate(g, feeds, {})[0], rtol=1e-6)


@pytest.mark.parametrize("idx, shape, message", [
    ((1, 7, 7), [9, 6, 7], r"shape \[9, 6, 7\] is not \[at most batch 8, at most rows 7, T\] of the product "
                          r"\[2, 4, 7, 16\]"),
    ((2, 7, 7), [8, 7, 7], r"indices i32\[2,7,7\] must be i32 of rank 3 broadcasting to shape \[8, 7, 7\]"),
])
def test_gathered_batch_matmul_refuses_shapes_that_do_not_fit(idx, shape, message):
    from eggfuse.ir import GraphError

    g = Graph()
    ids = g.input("ids", list(idx), DType.I32)
    with pytest.raises(GraphError, match=r"GatheredBatchMatMul \(new node 3\): " + message):
        g.add_node("GatheredBatchMatMul", (g.input("a", [14, 96]), g.input("b", [1, 4, 16, 8]), ids),
                   perm=[0, 2, 1, 3], trans_b=True, view=(2, 7, 4, 8), shape=shape)
