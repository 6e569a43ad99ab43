"""Every op with a kernel, on the GPU, against the numpy reference (ir.evaluate).

One row per (op, shapes): a builder adds the op to a graph whose leaves are random
(inputs and parameters alike), optionally with hand-made feeds for edge cases.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from eggfuse.ir import OPS, DType, Graph, evaluate
from eggfuse.lowering import KERNELS, lower
from eggfuse.runtime import Session


@dataclass
class Row:
    op: str
    id: str
    build: Callable[[Graph], int]
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    scale: float = 1.0  # spread of the random leaves
    rtol: float = 1e-4
    atol: float | None = None  # default: 1e-5 * max(1, max |reference|)


def _unary(op: str, shape) -> Row:
    return Row(op, f"{op}{list(shape)}", lambda g: g.add_node(op, (g.input("x", shape),)), scale=3.0)


def _unary_precision(op: str) -> Row:
    # A dense sweep with a tight bound: catches approximation errors (erf, tanh) that the
    # random rows' tolerance would hide. The bound allows a few f32 ulps of the result.
    x = np.linspace(-10.0, 10.0, 4001)
    return Row(op, f"{op}-precision", lambda g: g.add_node(op, (g.input("x", [x.size]),)), {"x": x},
               rtol=3e-7, atol=1e-6)


def _matmul(op: str, m: int, k: int, n: int) -> Row:
    a_shape = [k, m] if op == "MatMulAT" else [m, k]
    b_shape = [n, k] if op == "MatMulBT" else [k, n]
    return Row(op, f"{op}[{m},{k},{n}]",
               lambda g: g.add_node(op, (g.input("a", a_shape), g.parameter("b", b_shape))))


def _fused(variant: str, m: int, k: int, n: int, epilogue: tuple[str, ...], bias_shape=None) -> Row:
    def build(g: Graph) -> int:
        a = g.input("a", [k, m] if variant == "AT" else [m, k])
        b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
        operands = []
        for i, step in enumerate(epilogue):
            if step == "bias":
                operands.append(g.parameter(f"bias{i}", bias_shape or [n]))
            elif step == "add":
                operands.append(g.input(f"res{i}", [m, n]))
        return g.add_node("FusedMatMul", (a, b, *operands), variant=variant, epilogue=epilogue)

    return Row("FusedMatMul", f"FusedMatMul{variant}[{m},{k},{n}]{'+'.join(epilogue)}", build)


def _binary(op: str, x_shape, y_shape) -> Row:
    return Row(op, f"{op}{list(x_shape)}{list(y_shape)}",
               lambda g: g.add_node(op, (g.input("x", x_shape), g.input("y", y_shape))))


def _softmax(shape, feeds=None, tag="") -> Row:
    return Row("Softmax", f"Softmax{list(shape)}{tag}", lambda g: g.softmax(g.input("x", shape)),
               feeds or {}, scale=5.0)


def _norm(op: str, rows: int, n: int) -> Row:
    def build(g: Graph) -> int:
        x, w = g.input("x", [rows, n]), g.parameter("w", [n])
        if op == "LayerNorm":
            return g.layer_norm(x, w, g.parameter("b", [n]), eps=1e-5)
        return g.rms_norm(x, w, eps=1e-5)

    return Row(op, f"{op}[{rows},{n}]", build, scale=3.0)


def _rope(pairing: str, batch: int, offset: int) -> Row:
    return Row("RoPE", f"RoPE-{pairing}-b{batch}-off{offset}", lambda g: g.rope(
        g.input("x", [10, 16]), 10000.0, head_dim=8, pos_offset=offset, pairing=pairing, batch=batch))


def _embedding(ids: list[int], vocab: int, width: int) -> Row:
    def build(g: Graph) -> int:
        return g.embedding(g.input("ids", [len(ids)], DType.U32), g.parameter("table", [vocab, width]))

    return Row("Embedding", f"Embedding[{len(ids)}]x[{vocab},{width}]", build, {"ids": np.array(ids)})


def _attention(op: str, nh: int, nkv: int, hd: int, batch: int, seq: int, mask=None) -> Row:
    def build(g: Graph) -> int:
        rows = batch * seq
        q = g.input("q", [rows, nh * hd])
        k, v = g.input("k", [rows, nkv * hd]), g.input("v", [rows, nkv * hd])
        if op == "CausalAttention":
            return g.causal_attention(q, k, v, nh, nkv, hd, batch)
        km = g.input("key_mask", [batch, seq]) if mask is not None else None
        return g.full_attention(q, k, v, nh, nkv, hd, batch, key_mask=km)

    feeds = {} if mask is None else {"key_mask": np.asarray(mask, dtype=np.float32)}
    tag = "mask" if mask is not None else ""
    return Row(op, f"{op}[h{nh}/kv{nkv},hd{hd},b{batch},s{seq}]{tag}", build, feeds, scale=2.0)


def _simple(op: str, shape) -> Row:
    return Row(op, f"{op}{list(shape)}", lambda g: g.add_node(op, (g.input("x", shape),)))


_MASK = [[1, 1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]  # sequence 1 fully masked
_LOGITS = np.array([[1e3, 999.0, 0.0, -1e3], [-1e30] * 4, [-1e30, 2.0, -1e30, 1.0]])

ROWS: list[Row] = [
    *[_unary(op, shape) for op in ("Relu", "Sigmoid", "Tanh", "Neg", "Gelu", "GeluTanh", "Silu")
      for shape in ([1], [7, 13], [65, 33])],
    *[_unary_precision(op) for op in ("Sigmoid", "Tanh", "Gelu", "GeluTanh", "Silu")],
    *[_matmul(op, *mkn) for op in ("MatMul", "MatMulAT", "MatMulBT")
      for mkn in ((1, 1, 1), (7, 13, 5), (65, 33, 70), (3, 100, 129))],
    *[_fused(v, *mkn, epi) for v in ("", "AT", "BT") for mkn in ((7, 13, 5), (65, 33, 70))
      for epi in (("bias", "Gelu"), ("bias", "add", "GeluTanh", "Neg"))],
    _fused("", 9, 17, 66, ("add", "Relu", "bias", "Sigmoid", "Tanh", "Silu"), bias_shape=[1, 66]),
    _fused("BT", 1, 1, 1, ("bias", "add")),
    *[_binary(op, x, y) for op in ("Add", "Mul") for x, y in (
        ([7, 13], [7, 13]), ([7, 13], [1, 13]), ([7, 13], [7, 1]), ([13], [7, 13]), ([1], [5]),
        ([2, 3, 4, 5], [3, 1, 5]), ([2, 3, 4, 5, 6], [6]), ([4, 1, 6], [1, 5, 1]))],
    _binary("BiasAdd", [7, 13], [13]),
    _binary("BiasAdd", [65, 70], [1, 70]),
    _binary("SwiGLU", [7, 13], [7, 13]),
    *[_softmax(shape) for shape in ([1, 1], [7, 13], [3, 300], [2, 3, 5])],
    _softmax([3, 4], {"x": _LOGITS}, tag="-large-and-sentinel-logits"),
    *[_norm(op, rows, n) for op in ("LayerNorm", "RmsNorm") for rows, n in ((1, 1), (7, 13), (3, 300))],
    _embedding([0, 10, 3, 3, 7, 1, 10, 0, 5], 11, 6),
    *[_rope(pairing, batch, offset) for pairing in ("half", "adjacent")
      for batch, offset in ((1, 0), (2, 3), (5, 17))],
    _attention("FullAttention", 4, 2, 8, 2, 5),
    _attention("FullAttention", 2, 2, 16, 1, 70),
    _attention("FullAttention", 4, 2, 8, 3, 7, mask=_MASK),
    _attention("FullAttention", 4, 1, 4, 3, 7, mask=_MASK),
    _attention("CausalAttention", 4, 2, 8, 2, 5),
    _attention("CausalAttention", 2, 1, 32, 1, 70),
    _simple("Transpose", [7, 13]),
    _simple("Transpose", [1, 5]),
    *[_simple(op, shape) for op in ("SumAll", "MeanAll") for shape in ([1], [7, 13], [3000])],
]


def test_every_op_with_a_kernel_has_a_row():
    ops = {op for op in OPS if OPS[op].dispatches}
    assert ops <= set(KERNELS), ops - set(KERNELS)
    assert ops <= {row.op for row in ROWS}, ops - {row.op for row in ROWS}


def _random_leaves(g: Graph, row: Row, rng: np.random.Generator) -> tuple[dict, dict]:
    bounds = lower(g).index_bounds
    inputs, params = {}, {}
    for leaves, out in ((g.inputs, inputs), (g.parameters, params)):
        for name, ty in leaves.items():
            if name in row.feeds:
                out[name] = row.feeds[name]
            elif ty.dtype is DType.U32:
                out[name] = rng.integers(0, bounds[name], size=ty.shape)
            else:
                out[name] = (row.scale * rng.standard_normal(ty.shape)).astype(np.float32)
    return inputs, params


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    g = Graph()
    g.set_outputs([row.build(g)])
    rng = np.random.default_rng(zlib.crc32(row.id.encode()))
    inputs, params = _random_leaves(g, row, rng)
    (got,) = Session(g, params, device=device).run(inputs)
    (want,) = evaluate(g, inputs, params)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    atol = row.atol if row.atol is not None else 1e-5 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=row.rtol, atol=atol)
