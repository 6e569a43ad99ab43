"""FusedLayerNormMatMul (ir/ops/matmul.py): a pre-LN transformer's LayerNorm as the next product's
prologue, on the GPU against the numpy reference (``eggfuse.ir.evaluate``): the tiled kernel (each
row's mean and variance taken before the K loop, matmul_prologue_layer_norm.wgsl) on every tile
family, whole and split in K, odd sizes (K not a multiple of 4, rows and columns past a tile),
rows of a large mean (the shifted sums must not cancel the variance); the GEMV's LayerNorm kernel
into scratch then the product. Then the rules (the optional ``layer_norm_prologue`` ruleset: not run
by default) on graphs of primitive ops: a pre-LN block whose normalised rows two products read, a
norm that is also a graph output, and a [B, S, H] norm read through a reshape (an exporter's
projection); by default the norm stays its own dispatch."""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, check_row, run_optimised  # tests/op_table.py

from eggfuse.ir import Graph
from eggfuse.ir.ops import matmul_kernel
from eggfuse.ir.ops.matmul_kernel import (
    GEMV_MAX_ROWS,
    MATMUL_TILES,
    MATMUL_TILES_SMALL,
    MATMUL_TILES_THREE_QUARTER,
    MATMUL_TILES_WIDE,
    matmul_choice,
)


def _row(variant: str, m: int, k: int, n: int, epilogue=("bias",), offset: float = 0.0) -> Row:
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    x = (rng.standard_normal((m, k)) * 2.0 + offset).astype(np.float32)

    def build(g: Graph) -> int:
        a = g.input("x", [m, k])
        w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
        ops = [g.parameter("bias", [n]) if s == "bias" else g.input("res", [m, n]) for s in epilogue
               if s in ("bias", "add")]
        return g.add_node("FusedLayerNormMatMul", (a, g.parameter("gamma", [k]), g.parameter("beta", [k]), w, *ops),
                          eps=1e-5, variant=variant, epilogue=epilogue)

    return Row("FusedLayerNormMatMul", f"FusedLayerNormMatMul{variant}[{m},{k},{n}]{'+'.join(epilogue)}"
               f"{f'@{offset:g}' if offset else ''}", build, feeds={"x": x})


ROWS = [
    _row("BT", 1, 40, 37),  # GEMV: the LayerNorm kernel into scratch, then the product
    _row("", 3, 33, 20, ("Relu",)),  # GEMV, K odd, B stored [K, N]
    _row("BT", 37, 384, 45),  # tiled, split in K by the heuristic
    _row("", 70, 33, 300, ("bias", "Gelu")),  # K odd: scalar loads of A
    _row("BT", 130, 64, 129, ("bias", "add")),  # rows and columns past a tile
    _row("", 9, 19, 7, ()),
    _row("BT", 40, 96, 50, ("bias",), offset=300.0),  # a large mean: sums shifted by each row's first element
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_op_matches_reference(row, device):
    session = check_row(row, device, subgroups=None)
    kernels = [d.kernel for d in session.plan.dispatches]
    gemv = "[1," in row.id or "[3," in row.id
    assert (kernels[0].split("+")[0] == "layer_norm" and "gemv" in kernels[1]) if gemv else kernels[0].startswith(
        "layer_norm_matmul"), kernels


TILES = (*MATMUL_TILES, *MATMUL_TILES_WIDE, *MATMUL_TILES_SMALL, *MATMUL_TILES_THREE_QUARTER)


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("splits", [1, 3])
def test_every_tile_whole_and_split(tile, splits, device, monkeypatch):
    from eggfuse.lowering import layout

    monkeypatch.setattr(layout, "TRANSPOSE_WEIGHTS", False)  # B [N, K] as stored (transposed: test_weights_layout)
    monkeypatch.setattr(matmul_kernel, "LAST_SPLIT_MAX_SUMS", 1 << 30)  # every tile's split in one dispatch
    row = _row("BT", 67, 150, 70, ("bias",))
    with matmul_choice(tile=tile, splits=splits):
        session = check_row(row, device, subgroups=None)
    kernels = [d.kernel for d in session.plan.dispatches]
    assert kernels[0].startswith(f"layer_norm_matmul_BT_{tile.name}") and len(kernels) == 1  # split: last_split
    assert ("_split3_last" in kernels[0]) == (splits > 1), kernels


def _prologue():
    """The default rulesets and the optional ``layer_norm_prologue``."""
    from eggfuse.rewrites.rulesets import select

    return select(optional=["layer_norm_prologue"])


def _pre_ln_block(m: int, k: int, n: int, *, norm_out: bool = False, batch: int = 0) -> tuple[Graph, dict, dict]:
    # h = LayerNorm(x); q = h W1 + b1; u = Gelu(h W2 + b2): the normalised rows read by two products (and with
    # norm_out a graph output too); with batch, x is [batch, m / batch, k] and the products read a 2-D view
    g = Graph()
    x = g.input("x", [batch, m // batch, k] if batch else [m, k])
    h = g.layer_norm(x, g.parameter("gamma", [k]), g.parameter("beta", [k]), eps=1e-5)
    rows = g.reshape(h, [m, k]) if batch else h
    q = g.bias_add(g.matmul(rows, g.parameter("w1", [k, n])), g.parameter("b1", [n]))
    u = g.gelu(g.bias_add(g.matmul_bt(rows, g.parameter("w2", [n + 3, k])), g.parameter("b2", [n + 3])))
    g.set_outputs([q, u, h] if norm_out else [q, u])
    rng = np.random.default_rng(m * 100 + k + n)
    feeds = {"x": (rng.standard_normal(g.node(x).type.shape) * 3 + 1).astype(np.float32)}
    params = {name: rng.standard_normal(ty.shape).astype(np.float32) / (np.sqrt(k) if name[0] == "w" else 1)
              for name, ty in g.parameters.items()}
    return g, feeds, params


@pytest.mark.parametrize("m, k, n", [(37, 64, 45), (5, 19, 7), (130, 33, 66), (3, 19, 7)])
def test_rule_on_a_pre_ln_block_whose_norm_two_products_read(m, k, n, device):
    g, feeds, params = _pre_ln_block(m, k, n)
    opt, _ = run_optimised(g, device, feeds, params, _prologue())
    ops = [n.op for n in opt.live_nodes()]
    if m <= GEMV_MAX_ROWS:  # the GEMV's form would run the norm once for each product: the norm stays
        assert "FusedLayerNormMatMul" not in ops and ops.count("LayerNorm") == 1, ops
    else:
        assert ops.count("FusedLayerNormMatMul") == 2 and "LayerNorm" not in ops, ops


def test_rule_keeps_a_norm_that_is_a_graph_output(device):
    g, feeds, params = _pre_ln_block(37, 64, 45, norm_out=True)
    opt, _ = run_optimised(g, device, feeds, params, _prologue())
    assert "LayerNorm" in [n.op for n in opt.live_nodes()]  # stored anyway; the products may read it or fuse


def test_rule_through_an_exporters_reshape(device):
    g, feeds, params = _pre_ln_block(14, 32, 20, batch=2)
    opt, _ = run_optimised(g, device, feeds, params, _prologue())
    ops = [n.op for n in opt.live_nodes()]
    assert ops.count("FusedLayerNormMatMul") == 2 and "LayerNorm" not in ops, ops


@pytest.mark.parametrize("batch", [1, 2])
def test_by_default_the_norm_stays_its_own_dispatch(batch, device):
    # the prologue measured slower on an H200 (rewrites/rulesets.py OPTIONAL): the default rulesets keep the norm
    g, feeds, params = _pre_ln_block(14, 32, 20, batch=batch)
    opt, _ = run_optimised(g, device, feeds, params)
    ops = [n.op for n in opt.live_nodes()]
    assert "FusedLayerNormMatMul" not in ops and ops.count("LayerNorm") == 1, ops


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "layer_norm.wgsl"])
@pytest.mark.parametrize("k, mean", [(256, 100.0), (768, 1000.0)])
def test_layer_norm_kernels_keep_a_large_means_low_bits(k, mean, lanes, device, monkeypatch):
    # rows of mean 100 or 1000 and spread 0.01: the standalone LayerNorm kernels (the lanes form, ROW_NORM_LANES,
    # and layer_norm.wgsl, the GEMV form's first dispatch) and the prologue work on x - x[row, 0] (or the first
    # pass's mean) and its mean, never rounding the row's mean to one float; summed directly, layer_norm.wgsl was
    # 2.5e-3 and 2.2e-2 off the float64 normalisation, with the mean rounded 3.8e-4 and 3.0e-3 (onnxruntime 3.8e-4
    # and 2.8e-3); now 3.7e-7 and 5.8e-7
    from eggfuse.ir.ops import norms
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session

    monkeypatch.setattr(norms, "ROW_NORM_LANES", lanes)

    rng = np.random.default_rng(k)
    x = (mean + 0.01 * rng.standard_normal((40, k))).astype(np.float32)
    g = Graph()
    g.set_outputs([g.layer_norm(g.input("x", [40, k]), g.parameter("w", [k]), g.parameter("b", [k]), eps=1e-5)])
    plan = lower_for(g, device)
    assert plan.dispatches[0].kernel.removesuffix("+sg") == ("layer_norm_lanes" if lanes else "layer_norm")
    got = Session(plan, {"w": np.ones(k, np.float32), "b": np.zeros(k, np.float32)}, device=device).run({"x": x})[0]
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    err = float(np.abs(got - want).max())
    assert err < 1e-5, err
    fused = check_row(_row("", 40, k, 9, (), offset=mean), device, subgroups=None)
    assert fused.plan.dispatches[0].kernel.startswith("layer_norm_matmul")


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "layer_norm.wgsl"])
def test_layer_norm_of_rows_summing_past_f32s_range_stays_finite(lanes, device, monkeypatch):
    # rows of 768 values of 1e36 (their sum, 7.7e38, is past float32's 3.4e38): the lanes form divides each lane's
    # part by n before the row's sum, layer_norm.wgsl sums x - x[row, 0]; a constant row normalises to the bias
    from eggfuse.ir.ops import norms
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session

    monkeypatch.setattr(norms, "ROW_NORM_LANES", lanes)
    k = 768
    x = np.repeat(np.array([[1e36], [-1e36], [3e35], [1.0]], np.float32), k, axis=1)
    g = Graph()
    g.set_outputs([g.layer_norm(g.input("x", [4, k]), g.parameter("w", [k]), g.parameter("b", [k]), eps=1e-5)])
    b = np.linspace(-1, 1, k, dtype=np.float32)
    (got,) = Session(lower_for(g, device), {"w": np.ones(k, np.float32), "b": b}, device=device).run({"x": x})
    np.testing.assert_array_equal(got, np.broadcast_to(b, (4, k)))
