"""The quant family (ir/ops/quant.py) on the GPU: Dequant, QuantMatMul (GEMV and every tiled
path: edge tiles, epilogues), QuantRmsNormMatMul and QuantEmbedding in Q4_0, Q4_1, Q8_0 and F16, and
QuantMatMulLayerNorm, QuantMatMulRmsNorm and QuantRmsNormMatMulSwiGLU (ir/ops/matmul_rows.py).

The blocks (F16: the rows of halves) are written by gguf's quantisers (llama.cpp's reference ones, ``gguf.quants``). The
op table checks each kernel against the numpy reference (``eggfuse.ir.evaluate``, whose
decoder tests/unit/test_quant.py checks against gguf's); the tests below check the kernels
against gguf's own dequantiser and a numpy matmul, with no eggfuse code in the expected value.
"""

from __future__ import annotations

import zlib

import gguf
import numpy as np
import pytest
from op_table import Row, check_row  # tests/op_table.py

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops.matmul_kernel import (
    GEMV_COLS_ALLOWED,
    GEMV_LONG_K,
    GEMV_MAX_CHUNK,
    gemv_bt_lanes,
    gemv_tile,
    matmul_choice,
)
from eggfuse.ir.ops.quant import FORMATS, pack_rows
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
from eggfuse.runtime.device import subgroup_reductions_usable

QTYPE = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
         "q8_0": gguf.GGMLQuantizationType.Q8_0, "f16": gguf.GGMLQuantizationType.F16}


def blocks(fmt: str, rows: int, cols: int, seed: str) -> tuple[np.ndarray, np.ndarray]:
    """(u32 rows of blocks, gguf's dequantised float32 [rows, cols]) of random normal weights."""
    x = np.random.default_rng(zlib.crc32(seed.encode())).standard_normal((rows, cols)).astype(np.float32)
    raw = gguf.quants.quantize(x, QTYPE[fmt])  # F16: float16 [rows, cols], whose bytes are the rows
    return pack_rows(raw.view(np.uint8).reshape(rows, -1)), gguf.quants.dequantize(raw, QTYPE[fmt])


def _q(g: Graph, fmt: str, rows: int, cols: int, name: str = "q") -> int:
    return g.parameter(name, [rows, FORMATS[fmt].row_words(cols)], DType.U32)


def _dequant(fmt: str, rows: int, cols: int) -> Row:
    rid = f"Dequant-{fmt}[{rows},{cols}]"
    return Row("Dequant", rid, lambda g: g.add_node("Dequant", (_q(g, fmt, rows, cols),), format=fmt, cols=cols),
               feeds={"q": blocks(fmt, rows, cols, rid)[0]})


def _qswiglu(fmt: str, m: int, k: int, n: int, epilogue=()) -> Row:
    rid = f"QuantSwiGLUMatMul-{fmt}[{m},{2 * k}]x[{n},{k}]{''.join('+' + s for s in epilogue)}"

    def build(g: Graph) -> int:
        operands = [g.parameter("bias", [n]) if s == "bias" else g.input("res", [m, n])
                    for s in epilogue if s in ("bias", "add")]
        return g.add_node("QuantSwiGLUMatMul", (g.input("x", [m, 2 * k]), _q(g, fmt, n, k), *operands), format=fmt,
                          epilogue=epilogue)

    return Row("QuantSwiGLUMatMul", rid, build, feeds={"q": blocks(fmt, n, k, rid)[0]})


def _qmm(fmt: str, m: int, k: int, n: int, epilogue=(), rms: bool = False) -> Row:
    rid = f"Quant{'RmsNorm' if rms else ''}MatMul-{fmt}[{m},{k}]x[{n},{k}]{''.join('+' + s for s in epilogue)}"

    def build(g: Graph) -> int:
        operands = [g.parameter("bias", [n]) if s == "bias" else g.input("res", [m, n])
                    for s in epilogue if s in ("bias", "add")]
        x = g.input("x", [m, k])
        if rms:
            return g.add_node("QuantRmsNormMatMul", (x, g.parameter("w_norm", [k]), _q(g, fmt, n, k), *operands),
                              eps=1e-5, format=fmt, epilogue=epilogue)
        return g.add_node("QuantMatMul", (x, _q(g, fmt, n, k), *operands), format=fmt, epilogue=epilogue)

    return Row("QuantRmsNormMatMul" if rms else "QuantMatMul", rid, build, feeds={"q": blocks(fmt, n, k, rid)[0]})


def _qemb(fmt: str, tokens: int, rows: int, cols: int, signed: bool = False) -> Row:
    # signed: i32 ids as ONNX Gather reads them, negative ones (from the end) among them
    rid = f"QuantEmbedding-{fmt}[{rows},{cols}]x{tokens}" + ("-i32" if signed else "")
    feeds = {"q": blocks(fmt, rows, cols, rid)[0]}
    if signed:
        feeds["tokens"] = ((np.arange(tokens) * 5) % (2 * rows) - rows).astype(np.int32)  # -rows .. rows - 1
    dtype = DType.I32 if signed else DType.U32
    return Row("QuantEmbedding", rid,
               lambda g: g.add_node("QuantEmbedding", (g.input("tokens", [tokens], dtype), _q(g, fmt, rows, cols)),
                                    format=fmt, cols=cols), feeds=feeds)


def _quant(fmt: str, layer_norm: bool, m: int, k: int, n: int, epilogue=("bias",)) -> Row:
    # QuantMatMulLayerNorm [M, n], or QuantRmsNormMatMulSwiGLU [M, n] of a product [M, 2n]
    op = "QuantMatMulLayerNorm" if layer_norm else "QuantRmsNormMatMulSwiGLU"
    full = n if layer_norm else 2 * n
    rid = f"{op}-{fmt}[{m},{k}]x[{full},{k}]{''.join('+' + s for s in epilogue)}"

    def build(g: Graph) -> int:
        x = g.input("x", [m, k])
        ops = [g.parameter("bias", [full]) if s == "bias" else g.input("res", [m, full])
               for s in epilogue if s in ("bias", "add")]
        if layer_norm:
            return g.add_node(op, (x, _q(g, fmt, full, k), g.parameter("gamma", [n]), g.parameter("beta", [n]), *ops),
                              eps=1e-6, format=fmt, epilogue=epilogue)
        return g.add_node(op, (x, g.parameter("w_norm", [k]), _q(g, fmt, full, k), *ops), eps=1e-5, format=fmt,
                          epilogue=epilogue)

    return Row(op, rid, build, feeds={"q": blocks(fmt, full, k, rid)[0]})


def _quant_rms(fmt: str, m: int, k: int, n: int, epilogue=("bias",)) -> Row:
    # QuantMatMulRmsNorm [M, n]
    rid = f"QuantMatMulRmsNorm-{fmt}[{m},{k}]x[{n},{k}]{''.join('+' + s for s in epilogue)}"

    def build(g: Graph) -> int:
        ops = [g.parameter("bias", [n]) if s == "bias" else g.input("res", [m, n]) for s in epilogue
               if s in ("bias", "add")]
        return g.add_node("QuantMatMulRmsNorm", (g.input("x", [m, k]), _q(g, fmt, n, k), g.parameter("w", [n]), *ops),
                          eps=1e-6, format=fmt, epilogue=epilogue)

    return Row("QuantMatMulRmsNorm", rid, build, feeds={"q": blocks(fmt, n, k, rid)[0]})


def _chunk_k(m: int, n: int) -> int:
    """K of one chunk of the 'BT' GEMV of ``m`` rows and ``n`` columns at a K past the short-K column
    splits (matmul_kernel.gemv_bt_cols): GEMV_MAX_CHUNK steps of two quads per lane."""
    return GEMV_MAX_CHUNK * 8 * gemv_bt_lanes(m, 1 << 16, n)


ROWS = [
    *(_dequant(fmt, 5, cols) for fmt in FORMATS for cols in (32, 96)),  # 96: 3 blocks, rows padded for q4_0/q8_0
    *(_qmm(fmt, m, 96, 13) for fmt in FORMATS for m in (1, 4)),  # GEMV, 13 columns: an edge workgroup
    _qmm("q4_1", 1, _chunk_k(1, 9) + 32, 9),  # GEMV over two chunks of K (the second one block), 1 column a workgroup
    _qmm("q8_0", 3, 2 * _chunk_k(3, 5) + 32, 5, rms=True),  # three chunks, the RmsNorm prologue
    _qmm("q4_1", 3, 96, 8195, rms=True),  # 16 columns a workgroup (matmul_kernel.gemv_bt_cols), an edge one
    _qmm("q8_0", 1, 96, 8195, rms=True),  # the LM head's form: one row, 16 columns a workgroup
    # one row past GEMV_LONG_K: 1 column of 256 lanes (64 blocks a step; 35 blocks, rows padded for q4_0/q8_0)
    *(_qmm(fmt, 1, GEMV_LONG_K + 96, 7, rms=fmt == "q4_1") for fmt in FORMATS),
    *(_qmm(fmt, m, k, n) for fmt in FORMATS for m, k, n in ((9, 64, 9), (70, 160, 33))),  # tiled, edge tiles
    *(_qmm(fmt, 6, 64, 9, rms=fmt == "q8_0") for fmt in FORMATS),  # 6 rows: the GEMV (<= 8), in two blocks of 4 rows
    _qmm("q4_1", 130, 64, 130),  # 128-row tiles
    _qmm("q4_1", 3, 64, 24, ("bias", "Silu", "add")),
    _qmm("q8_0", 37, 96, 20, ("add", "Relu")),
    *(_qmm(fmt, m, 96, 21, ("bias",), rms=True) for fmt in ("q4_1", "q4_0") for m in (2, 19)),
    _qmm("q8_0", 1, 32, 8, rms=True),
    *(_qswiglu(fmt, 1, 96, 13, ("add",)) for fmt in FORMATS),  # GEMV (decode), with the residual add
    _qswiglu("q4_1", 1, GEMV_LONG_K + 512, 6, ("add",)),  # the down projection's form: 1 column a workgroup
    _qswiglu("q4_1", 37, 64, 20, ("bias", "Relu")),  # tiled
    *(_qemb(fmt, 7, 11, 64) for fmt in FORMATS),
    *(_qemb(fmt, 9, 11, 64, signed=True) for fmt in ("f16", "q8_0")),
    # the products with a final row step (ir/ops/matmul_rows.py): GEMV and tiled first stages
    _quant("q4_1", True, 2, 64, 37),
    _quant("q8_0", True, 40, 96, 45, ("bias", "add")),
    _quant("f16", True, 19, 64, 20, ()),
    _quant_rms("q4_1", 2, 64, 37),  # GEMV first stage
    _quant_rms("q8_0", 40, 96, 45, ("bias", "add")),
    _quant_rms("f16", 19, 64, 20, ()),
    _quant("q4_1", False, 3, 96, 20),
    _quant("q4_1", False, 6, 96, 20),  # a GEMV first stage of 6 rows, then the SwiGLU step
    _quant("q4_0", False, 37, 64, 24, ("bias", "add")),
    _quant("f16", False, 70, 128, 33),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("m", [1, 3, 7, 9, 40])
def test_quant_matmul_matches_gguf_dequantised_weights(fmt, m, device):
    # A @ W^T with W given as blocks, against gguf's dequantiser and numpy (float64): the
    # GEMV (m <= 8 for blocks: gemv_bt_rows) and the tiled kernel (9 rows on); K = 96 is three
    # blocks, so Q4_0/Q8_0 rows are padded
    k, n = 96, 37
    q, w = blocks(fmt, n, k, f"gguf-{fmt}-{m}")
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    g = Graph()
    g.set_outputs([g.add_node("QuantMatMul", (g.input("a", [m, k]), _q(g, fmt, n, k)), format=fmt, epilogue=())])
    (got,) = Session(lower_for(g, device), {"q": q}, device=device).run({"a": a})
    want = a.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("subgroups", [False, None], ids=["tree", "device"])
@pytest.mark.parametrize("cols", GEMV_COLS_ALLOWED)
@pytest.mark.parametrize("fmt,m", [("q4_1", 1), ("q8_0", 3), ("f32", 2), ("q4_0", 7)])
def test_gemv_every_column_count_matches_gguf(fmt, m, cols, subgroups, device):
    # RmsNorm(x) @ W^T as the 'BT' GEMV with each column count forced: the lane sums of 256 / cols
    # lanes (a butterfly of subgroup shuffles where the device has subgroups at least that wide,
    # matmul_gemv_reduce_subgroup.wgsl, else the tree), the RmsNorm weights read as vec4, the quads
    # of B (and for f32 B of x) loaded without branches; K = 96 leaves lanes past K, N = 37 an edge
    # workgroup. Expected: gguf's dequantiser (f32: the weights as drawn) and numpy (float64).
    k, n, eps = 96, 37, 1e-5
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_norm = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    g = Graph()
    inputs = (g.input("x", [m, k]), g.parameter("w_norm", [k]))
    if fmt == "f32":
        q = w = rng.standard_normal((n, k)).astype(np.float32)
        g.set_outputs([g.add_node("FusedRmsNormMatMul", (*inputs, g.parameter("q", [n, k])), eps=eps, variant="BT",
                                  epilogue=())])
    else:
        q, w = blocks(fmt, n, k, f"cols-{fmt}-{m}")
        g.set_outputs([g.add_node("QuantRmsNormMatMul", (*inputs, _q(g, fmt, n, k)), eps=eps, format=fmt,
                                  epilogue=())])
    with matmul_choice(gemv_cols=cols):
        plan = lower_for(g, device, subgroups=subgroups)
    rows = gemv_tile(m, k, n, "BT", fmt != "f32").bm  # 7 rows: two blocks of GEMV_ROW_BLOCK (4)
    assert f"gemv{rows}x{cols}_" in plan.dispatches[0].kernel and rows == min(m, 4)
    uses_subgroups = subgroups is None and subgroup_reductions_usable(device)
    assert ("subgroupShuffleXor" in plan.dispatches[0].source) == uses_subgroups
    (got,) = Session(plan, {"q": q, "w_norm": w_norm}, device=device).run({"x": x})
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w_norm
    want = normed @ w.astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_quant_embedding_and_dequant_match_gguf(fmt, device):
    rows, cols = 9, 96
    q, w = blocks(fmt, rows, cols, f"rows-{fmt}")
    tokens = np.array([8, 0, 3, 3], dtype=np.uint32)
    g = Graph()
    table = _q(g, fmt, rows, cols)
    g.set_outputs([g.add_node("QuantEmbedding", (g.input("tokens", [4], DType.U32), table), format=fmt, cols=cols),
                   g.add_node("Dequant", (table,), format=fmt, cols=cols)])
    rows_got, full = Session(lower_for(g, device), {"q": q}, device=device).run({"tokens": tokens})
    # d * q (+ m) in float32, as gguf computes it; a GPU may fuse it into one fma (an ulp apart)
    tol = dict(rtol=1e-6, atol=1e-7 * np.abs(w).max())
    np.testing.assert_allclose(full, w, **tol)
    np.testing.assert_allclose(rows_got, w[tokens], **tol)
