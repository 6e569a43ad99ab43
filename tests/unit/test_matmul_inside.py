"""``matmul_kernel.covers``, the condition under which the tiled kernel loads and stores without bounds checks
(``inside_form``), against a model of ``shaders/matmul.wgsl``'s index arithmetic: every quad each workgroup
loads (the first slice of its K range before the loop, then the next slice each step) and every element it
stores lies inside A, B and C. On lavapipe an out-of-bounds read returns zeros or a value inside the buffer
(robust buffer access), which is what the checked form computes, so the GPU tests could not see one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eggfuse.ir.ops import matmul_kernel as mk

TILED = [t for t in mk.MATMUL_TILES_ALL if not t.gemv]


def _outside(tile, m: int, k: int, n: int, splits: int, variant: str) -> list[str]:
    # what the kernel's workgroups would load or store outside the matrices (matmul.wgsl: load_a, load_b, store4)
    bm, bn, bk = tile.bm, tile.bn, tile.bk
    kq, bm4, bn4 = bk // 4, bm // 4, bn // 4
    a_quads, b_quads = np.arange(bm * bk // 4), np.arange(bn * bk // 4)
    tiles_n = math.ceil(n / bn)
    tiles = math.ceil(m / bm) * tiles_n
    k_chunk = mk._k_chunk(tile, k, splits)
    found = []
    for w in range(tiles * splits):
        tile_index, split = w % tiles, w // tiles
        k0 = split * k_chunk
        k_end = min(k, k0 + k_chunk)
        steps = (k_end - k0 + bk - 1) // bk if k_end > k0 else 0
        row0, col0 = tile_index // tiles_n * bm, tile_index % tiles_n * bn
        for ks in [k0] + [k0 + s * bk for s in range(1, steps)]:  # slice 0, then each next (K_LOOP)
            if variant == "AT":  # A stored [K, M]: quad li at (ks + li / BM4, row0 + li % BM4 * 4)
                r, c, rows, cols = ks + a_quads // bm4, row0 + a_quads % bm4 * 4, k, m
            else:  # A [M, K] along K
                r, c, rows, cols = row0 + a_quads // kq, ks + a_quads % kq * 4, m, k
            if np.any((r >= rows) | (c + 3 >= cols)):
                found.append(f"A at workgroup {w}, slice {ks}")
            if variant == "BT":  # B stored [N, K]
                r, c, rows, cols = col0 + b_quads // kq, ks + b_quads % kq * 4, n, k
            else:  # B [K, N]
                r, c, rows, cols = ks + b_quads // bn4, col0 + b_quads % bn4 * 4, k, n
            if np.any((r >= rows) | (c + 3 >= cols)):
                found.append(f"B at workgroup {w}, slice {ks}")
        if row0 + bm > m or col0 + bn > n:  # store4: rows row0 + (0..BM), columns col0 + (0..BN)
            found.append(f"C at workgroup {w}")
    return found


def _covered_shapes(tile):
    # whole tiles in M and N; K ranges even, uneven (7 slices in 3 ranges: 3, 3, 1), one slice each, one range
    m, n = 2 * tile.bm, 3 * tile.bn
    return [(m, 7 * tile.bk, n, s) for s in (1, 2, 3, 4, 7)] + [(m, tile.bk, n, 1), (tile.bm, 24 * tile.bk, tile.bn, 8)]


@pytest.mark.parametrize("tile", TILED, ids=lambda t: t.name)
def test_covered_products_load_and_store_inside_the_matrices(tile):
    for m, k, n, splits in _covered_shapes(tile):
        assert mk.covers(tile, m, k, n, splits), (m, k, n, splits)
        for variant in ("", "AT", "BT"):
            assert _outside(tile, m, k, n, splits, variant) == [], (tile.name, m, k, n, splits, variant)


@pytest.mark.parametrize("tile", TILED, ids=lambda t: t.name)
def test_what_covers_refuses_would_load_or_store_outside(tile):
    # the model finds the accesses the checks guard: an edge tile in M, N or K, and a K range past K (7 slices
    # in 5 ranges of 2: the fifth starts at 8 slices)
    m, n, k = 2 * tile.bm, 3 * tile.bn, 7 * tile.bk
    for shape in [(m + 4, k, n, 1), (m, k, n + 4, 1), (m, k + 4, n, 1), (m, k, n, 5)]:
        assert not mk.covers(tile, *shape)
        assert _outside(tile, *shape, "BT"), (tile.name, shape)


def test_the_inside_stores_are_the_checked_ones_without_their_checks():
    # _STORE4_*_INSIDE are derived from the checked forms: the same stores, no row or column check left
    for inside, checked in ((mk._STORE4_SCALAR_INSIDE, mk._STORE4_SCALAR), (mk._STORE4_VEC4_INSIDE, mk._STORE4_VEC4)):
        assert "p.m" in checked and "p.m" not in inside
        assert "j + e < p.n" not in inside and "j >= p.n" not in inside
        stores = [[line.strip() for line in form.splitlines() if line.strip().startswith("out[")]
                  for form in (inside, checked)]
        assert stores[0] == stores[1] and len(stores[0]) >= 2
