"""Autodiff: gradients evaluated with ir.evaluate against central finite differences.

One row per differentiable op (JAX ``op_record`` style): the row builds the op on
parameter leaves; the loss is sum(out * R) for a fixed random R (or the op itself when it
is a loss). Leaf values are float32-representable, so ``ir.evaluate`` (which rounds
leaves to f32) and the float64 finite-difference oracle below see the same point.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from eggfuse.ir import OPS, DType, Graph, GraphError, evaluate
from eggfuse.ir.autodiff import grad
from eggfuse.ir.ops.elementwise import UNARY

EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-7


def eval64(g: Graph, values: dict[str, np.ndarray], out: int) -> np.ndarray:
    """Float64 interpreter without evaluate's f32 rounding of leaves: the finite-difference oracle."""
    live, stack = set(), [out]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(g.node(n).inputs)
    vals = {}
    for n in g.nodes:
        if n.id not in live:
            continue
        if n.op in ("Input", "Parameter"):
            vals[n.id] = values[n.attrs["name"]]
        elif n.op == "Constant":
            vals[n.id] = n.attrs["value"].astype(np.float64)
        else:
            vals[n.id] = np.asarray(OPS[n.op].reference([vals[i] for i in n.inputs], n.attrs)).reshape(n.type.shape)
    return vals[out]


def finite_difference(g: Graph, loss: int, values: dict, name: str, entries=None) -> tuple[list, np.ndarray]:
    """Central differences of the loss in parameter ``name`` at ``entries`` (default: all)."""
    base = values[name]
    entries = list(np.ndindex(base.shape)) if entries is None else entries
    fd = []
    for idx in entries:
        plus, minus = base.copy(), base.copy()
        plus[idx] += EPS
        minus[idx] -= EPS
        hi = eval64(g, {**values, name: plus}, loss)[0]
        lo = eval64(g, {**values, name: minus}, loss)[0]
        fd.append((hi - lo) / (2 * EPS))
    return entries, np.array(fd)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def away_from_zero(rng, shape):
    return f32(rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.2, 1.0, size=shape))


def near_one(rng, shape):
    return f32(1.0 + 0.2 * rng.standard_normal(shape))


@dataclass
class Row:
    id: str
    build: Callable[[Graph], int]
    feeds: dict[str, np.ndarray] = field(default_factory=dict)  # Inputs (indices, masks, labels)
    init: dict[str, Callable] = field(default_factory=dict)  # special parameter draws


def leaf_values(g: Graph, row: Row, rng) -> dict[str, np.ndarray]:
    values = {}
    for n in g.nodes:
        if n.op not in ("Input", "Parameter"):
            continue
        name, shape = n.attrs["name"], n.type.shape
        if name in row.feeds:
            values[name] = row.feeds[name]
        elif name in row.init:
            values[name] = row.init[name](rng, shape)
        else:
            values[name] = f32(0.7 * rng.standard_normal(shape))
    return values


def split(g: Graph, values: dict) -> tuple[dict, dict]:
    inputs = {k: v for k, v in values.items() if k in g.inputs}
    return inputs, {k: v for k, v in values.items() if k in g.parameters}


def check_gradients(g: Graph, loss: int, values: dict, entries_per_param: int | None = None, seed: int = 0, **kw):
    tg = grad(g, loss, **kw)
    inputs, params = split(g, values)
    outs = evaluate(tg, inputs, params)
    np.testing.assert_allclose(outs[0], eval64(g, values, loss), rtol=1e-12)
    rng = np.random.default_rng(seed)
    for name, index in tg.grad_outputs.items():
        ad = outs[index]
        assert ad.shape == values[name].shape, name
        entries = None
        if entries_per_param is not None:
            flat = rng.choice(ad.size, size=min(entries_per_param, ad.size), replace=False)
            entries = [np.unravel_index(i, ad.shape) for i in flat]
        entries, fd = finite_difference(g, loss, values, name, entries)
        got = np.array([ad[i] for i in entries])
        np.testing.assert_allclose(got, fd, rtol=RTOL, atol=ATOL, err_msg=f"d loss / d {name}")
    return tg, outs


# --- the op table ------------------------------------------------------------------------


def P(g: Graph, name: str, shape) -> int:
    return g.parameter(name, shape)


def _fused(variant: str, epilogue: tuple[str, ...], m=3, k=4, n=5, bias_shape=None) -> Row:
    def build(g):
        a = P(g, "a", [k, m] if variant == "AT" else [m, k])
        b = P(g, "b", [n, k] if variant == "BT" else [k, n])
        ops = []
        for i, step in enumerate(epilogue):
            if step in ("bias", "add"):
                ops.append(P(g, f"op{i}", (bias_shape or [n]) if step == "bias" else [m, n]))
        return g.add_node("FusedMatMul", (a, b, *ops), variant=variant, epilogue=epilogue)

    return Row(f"FusedMatMul{variant}-{'+'.join(epilogue) or 'none'}", build)


def _fused_rms(variant: str, epilogue: tuple[str, ...], m=3, k=6, n=5) -> Row:
    def build(g):
        x, wn = P(g, "x", [m, k]), P(g, "wn", [k])
        w = P(g, "w", [n, k] if variant == "BT" else [k, n])
        ops = [P(g, f"op{i}", [n] if s == "bias" else [m, n]) for i, s in enumerate(epilogue) if s in ("bias", "add")]
        return g.add_node("FusedRmsNormMatMul", (x, wn, w, *ops), eps=1e-5, variant=variant, epilogue=epilogue)

    return Row(f"FusedRmsNormMatMul{variant}-{'+'.join(epilogue) or 'none'}", build, init={"wn": near_one})


def _fused_ln(variant: str, epilogue: tuple[str, ...], m=3, k=6, n=5) -> Row:
    def build(g):
        x, gamma, beta = P(g, "x", [m, k]), P(g, "gamma", [k]), P(g, "beta", [k])
        w = P(g, "w", [n, k] if variant == "BT" else [k, n])
        ops = [P(g, f"op{i}", [n] if s == "bias" else [m, n]) for i, s in enumerate(epilogue) if s in ("bias", "add")]
        return g.add_node("FusedLayerNormMatMul", (x, gamma, beta, w, *ops), eps=1e-5, variant=variant,
                          epilogue=epilogue)

    return Row(f"FusedLayerNormMatMul{variant}-{'+'.join(epilogue) or 'none'}", build, init={"gamma": near_one})


def _fused_swiglu(variant: str, epilogue: tuple[str, ...], m=3, k=6, n=5) -> Row:
    def build(g):
        x, w = P(g, "x", [m, 2 * k]), P(g, "w", [n, k] if variant == "BT" else [k, n])
        ops = [P(g, f"op{i}", [n] if s == "bias" else [m, n]) for i, s in enumerate(epilogue) if s in ("bias", "add")]
        return g.add_node("FusedSwiGLUMatMul", (x, w, *ops), variant=variant, epilogue=epilogue)

    return Row(f"FusedSwiGLUMatMul{variant}-{'+'.join(epilogue) or 'none'}", build)


def _mm_rows(op: str, variant: str, epilogue: tuple[str, ...], m=3, k=6, n=4) -> Row:
    # the products with a final row step (ir/ops/matmul_rows.py): n columns of output, 2n of product for SwiGLU
    def build(g):
        full = n if op in ("FusedMatMulLayerNorm", "FusedMatMulRmsNorm") else 2 * n
        rms = op == "FusedRmsNormMatMulSwiGLU"
        x = P(g, "x", [k, m] if variant == "AT" else [m, k])
        w = P(g, "w", [full, k] if variant == "BT" else [k, full])
        head = (x, P(g, "wn", [k]), w) if rms else (x, w)
        if op == "FusedMatMulLayerNorm":
            head += (P(g, "gamma", [n]), P(g, "beta", [n]))
        if op == "FusedMatMulRmsNorm":
            head += (P(g, "gamma", [n]),)
        ops = [P(g, f"op{i}", [full] if s == "bias" else [m, full]) for i, s in enumerate(epilogue)
               if s in ("bias", "add")]
        attrs = {"eps": 1e-5} if op != "FusedMatMulSwiGLU" else {}
        return g.add_node(op, (*head, *ops), variant=variant, epilogue=epilogue, **attrs)

    return Row(f"{op}{variant}-{'+'.join(epilogue) or 'none'}", build,
               init={"wn": near_one} if op == "FusedRmsNormMatMulSwiGLU" else {})


def _binary(op: str, xs, ys) -> Row:
    return Row(f"{op}{xs}{ys}", lambda g: g.add_node(op, (P(g, "x", xs), P(g, "y", ys))))


def inside_unit(rng, shape):
    return f32(rng.uniform(-0.9, 0.9, size=shape))


def above_one(rng, shape):
    return f32(rng.uniform(1.1, 3.0, size=shape))


def away_from_kinks(rng, shape):
    # the kinks and jumps of the piecewise activations at their default attributes: 0, +-0.5
    # (Shrink), 1 (ThresholdedRelu), -2.5 (HardSigmoid), +-3 (HardSwish)
    centres = rng.choice([-2.2, -1.3, -0.7, -0.2, 0.2, 0.7, 1.3, 2.2], size=shape)
    return f32(centres + rng.uniform(-0.1, 0.1, size=shape))


#: Inputs of the unary ops whose derivative is not smooth everywhere: away from the kink or pole;
#: of those defined on part of the line: inside it.
_UNARY_INIT = {"Relu": away_from_zero, "Abs": away_from_zero, "Recip": away_from_zero,
               "Sqrt": lambda rng, shape: f32(rng.uniform(0.2, 3.0, size=shape)), "Asin": inside_unit,
               "Acos": inside_unit, "Atanh": inside_unit, "Acosh": above_one,
               **dict.fromkeys(("LeakyRelu", "Selu", "ThresholdedRelu", "Shrink", "HardSigmoid", "HardSwish", "Floor",
                                "Ceil", "Round"), away_from_kinks)}


def _unary(op: str) -> Row:
    init = {"x": _UNARY_INIT[op]} if op in _UNARY_INIT else {}
    return Row(op, lambda g: g.add_node(op, (P(g, "x", [3, 5]),)), init=init)


def _attention(op: str, nh=4, nkv=2, hd=4, batch=2, seq=3, mask=None, packed=False, **extra) -> Row:
    # packed: one [rows, (nh + 2 nkv) hd] input holding q, k, v side by side (FullAttentionPacked, and
    # CausalAttention and CausalAttentionRoPE of one input)
    rows = batch * seq

    def build(g):
        if packed:
            ins = (P(g, "qkv", [rows, (nh + 2 * nkv) * hd]),)
        else:
            ins = P(g, "q", [rows, nh * hd]), P(g, "k", [rows, nkv * hd]), P(g, "v", [rows, nkv * hd])
        ins = ins if mask is None else (*ins, g.input("mask", [batch, seq]))
        return g.add_node(op, ins, num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch, **extra)

    feeds = {} if mask is None else {"mask": f32(mask)}
    tag = ("-mask" if mask is not None else "") + ("-packed" if packed else "") + (
        f"-{extra['masked_rows']}" if "masked_rows" in extra else "")
    return Row(f"{op}-h{nh}kv{nkv}b{batch}{tag}", build, feeds)


def _one_hot(rows: int, v: int, zero_row: int | None = None, seed: int = 7) -> np.ndarray:
    labels = np.eye(v)[np.random.default_rng(seed).integers(0, v, rows)]
    if zero_row is not None:
        labels[zero_row] = 0.0  # a padding row: adds nothing to the loss
    return labels


def _two_slices(g, starts_sizes):
    x = P(g, "x", [3, 7])
    parts = [g.slice_cols(x, s, n) for s, n in starts_sizes]
    return g.concat([g.tanh(parts[0]), *[g.sigmoid(p) for p in parts[1:]]], axis=1)


def _mse(g):
    pred, target = P(g, "pred", [3, 4]), g.input("target", [3, 4])
    diff = g.add(pred, g.neg(target))
    return g.mean_all(g.mul(diff, diff))


ROWS = [
    Row("MatMul", lambda g: g.matmul(P(g, "a", [3, 4]), P(g, "b", [4, 5]))),
    Row("MatMulAT", lambda g: g.matmul_at(P(g, "a", [4, 3]), P(g, "b", [4, 5]))),
    Row("MatMulBT", lambda g: g.matmul_bt(P(g, "a", [3, 4]), P(g, "b", [5, 4]))),
    _fused("", ("bias", "Gelu", "add")),
    _fused("AT", ("add", "Tanh", "bias", "Silu"), bias_shape=[1, 5]),
    _fused("BT", ("Sigmoid", "Neg", "GeluTanh")),
    _fused("BT", ("bias", "Relu")),
    _fused("", ("bias", "add")),
    _fused("", ()),
    _fused_rms("", ("bias", "Silu")),
    _fused_rms("BT", ("add",)),
    _fused_rms("BT", ()),
    _fused_ln("", ("bias", "Gelu")),
    _fused_ln("BT", ("add",)),
    _fused_swiglu("BT", ("add",)),
    _fused_swiglu("", ("bias", "Tanh")),
    _mm_rows("FusedMatMulLayerNorm", "BT", ("bias", "add")),
    _mm_rows("FusedMatMulLayerNorm", "AT", ("Tanh",)),
    _mm_rows("FusedMatMulRmsNorm", "", ("bias", "add")),
    _mm_rows("FusedMatMulRmsNorm", "AT", ("Tanh",)),
    _mm_rows("FusedMatMulSwiGLU", "", ("bias",)),
    _mm_rows("FusedMatMulSwiGLU", "BT", ()),
    _mm_rows("FusedRmsNormMatMulSwiGLU", "BT", ("add",)),
    _binary("Add", [3, 5], [3, 5]),
    _binary("Add", [3, 5], [5]),
    _binary("Add", [3, 1], [1, 5]),
    _binary("Add", [2, 3, 5], [3, 1]),
    _binary("Add", [1], [3, 4]),
    _binary("Mul", [3, 5], [3, 5]),
    _binary("Mul", [3, 5], [1, 5]),
    _binary("Mul", [2, 3, 5], [5]),
    Row("Mul-square", lambda g: (lambda x: g.mul(x, x))(P(g, "x", [3, 5]))),
    Row("BiasAdd[N]", lambda g: g.bias_add(P(g, "x", [3, 5]), P(g, "b", [5]))),
    Row("BiasAdd[1,N]", lambda g: g.bias_add(P(g, "x", [3, 5]), P(g, "b", [1, 5]))),
    # every differentiable row of the unary table (Log: below)
    *[_unary(u.name) for u in UNARY if u.name != "Log" and OPS[u.name].differentiable],
    Row("SwiGLU", lambda g: g.swiglu(P(g, "gate", [3, 5]), P(g, "up", [3, 5]))),
    Row("SwiGLUConcat", lambda g: g.swiglu_concat(P(g, "x", [3, 10]))),
    Row("Softmax", lambda g: g.softmax(P(g, "x", [3, 5]))),
    Row("LayerNorm", lambda g: g.layer_norm(P(g, "x", [3, 5]), P(g, "w", [5]), P(g, "b", [5])), init={"w": near_one}),
    Row("RmsNorm", lambda g: g.rms_norm(P(g, "x", [3, 5]), P(g, "w", [5])), init={"w": near_one}),
    Row("LayerNorm-3d", lambda g: g.layer_norm(P(g, "x", [2, 3, 5]), P(g, "w", [5]), P(g, "b", [5])),
        init={"w": near_one}),
    Row("LayerNorm-noweight", lambda g: g.add_node("LayerNorm", [P(g, "x", [3, 5])])),
    Row("LayerNorm-nobias", lambda g: g.add_node("LayerNorm", [P(g, "x", [2, 3, 5]), P(g, "w", [5])]),
        init={"w": near_one}),
    Row("RmsNorm-3d", lambda g: g.rms_norm(P(g, "x", [2, 3, 5]), P(g, "w", [5])), init={"w": near_one}),
    Row("RmsNorm-noweight", lambda g: g.add_node("RmsNorm", [P(g, "x", [2, 3, 5])])),
    Row("Embedding", lambda g: g.embedding(g.input("ids", [7], DType.U32), P(g, "table", [5, 3])),
        feeds={"ids": np.array([0, 3, 3, 1, 0, 3, 1], dtype=np.uint32)}),
    # two tables, and three whose indices repeat rows (their gradients add)
    Row("EmbeddingSumLayerNorm-2", lambda g: g.add_node("EmbeddingSumLayerNorm", (
        P(g, "w", [4]), P(g, "b", [4]), g.input("i0", [5], DType.U32), P(g, "t0", [6, 4]),
        g.input("i1", [5], DType.U32), P(g, "t1", [3, 4])), eps=1e-5),
        feeds={"i0": np.array([0, 5, 2, 2, 1], dtype=np.uint32), "i1": np.array([2, 0, 1, 0, 0], dtype=np.uint32)},
        init={"w": near_one}),
    Row("EmbeddingSumLayerNorm-3", lambda g: g.add_node("EmbeddingSumLayerNorm", (
        P(g, "w", [4]), P(g, "b", [4]), *(x for i, v in enumerate((6, 3, 2)) for x in (
            g.input(f"i{i}", [5], DType.U32), P(g, f"t{i}", [v, 4])))), eps=1e-5),
        feeds={"i0": np.array([0, 5, 2, 2, 1], dtype=np.uint32), "i1": np.array([2, 0, 1, 0, 0], dtype=np.uint32),
               "i2": np.array([1, 1, 0, 1, 0], dtype=np.uint32)}, init={"w": near_one}),
    # positions: two sequences of 3 rows, the positions table's gradient summed over them; i32 indices (ONNX
    # Gather's, -1 and -5 counted from the end) of a constant table, which has no gradient
    Row("EmbeddingSumLayerNorm-positions", lambda g: g.add_node("EmbeddingSumLayerNorm", (
        P(g, "w", [4]), P(g, "b", [4]), g.input("i0", [6], DType.U32), P(g, "t0", [5, 4]),
        g.input("i1", [6], DType.U32), P(g, "t1", [2, 4]), P(g, "pos", [3, 4])), eps=1e-5, positions=3),
        feeds={"i0": np.array([0, 4, 2, 2, 1, 0], dtype=np.uint32),
               "i1": np.array([1, 0, 1, 0, 0, 1], dtype=np.uint32)}, init={"w": near_one}),
    Row("EmbeddingSumLayerNorm-i32-positions", lambda g: g.add_node("EmbeddingSumLayerNorm", (
        P(g, "w", [4]), P(g, "b", [4]), g.input("i0", [6], DType.I32),
        g.constant(np.arange(20, dtype=np.float32).reshape(5, 4) / 7.0), P(g, "pos", [2, 4])), eps=1e-5, positions=2),
        feeds={"i0": np.array([0, -1, 4, 2, -5, 3], dtype=np.int32)}, init={"w": near_one}),
    Row("RoPE-half", lambda g: g.rope(P(g, "x", [6, 8]), 100.0, head_dim=4, pos_offset=3, batch=2)),
    Row("RoPE-adjacent", lambda g: g.rope(P(g, "x", [5, 6]), 10000.0, head_dim=6, pairing="adjacent")),
    _attention("FullAttention"),
    _attention("FullAttention", nh=2, nkv=1, mask=[[1, 1, 0], [1, 0, 1]]),
    _attention("FullAttentionPacked", packed=True),
    _attention("FullAttentionPacked", nh=2, nkv=1, mask=[[1, 1, 0], [1, 0, 1]], packed=True),
    # the second sequence keeps no key: its rows are the mean of v (a gradient to v) or zeros (none)
    _attention("FullAttention", nh=2, nkv=1, mask=[[1, 0, 1], [0, 0, 0]], masked_rows="mean"),
    _attention("FullAttention", nh=2, nkv=1, mask=[[1, 0, 1], [0, 0, 0]], masked_rows="zero"),
    _attention("FullAttentionPacked", nh=2, nkv=1, mask=[[0, 0, 0], [1, 1, 0]], packed=True, masked_rows="zero"),
    _attention("CausalAttention"),
    _attention("CausalAttention", nh=3, nkv=3, batch=1, seq=5),
    _attention("CausalAttention", packed=True),
    _attention("CausalAttentionRoPE", theta=100.0, pos_offset=1),
    _attention("CausalAttentionRoPE", nh=2, nkv=1, batch=1, seq=4, theta=10000.0, pairing="adjacent"),
    _attention("CausalAttentionRoPE", theta=100.0, pos_offset=1, packed=True),
    _attention("CausalAttentionRoPE", nh=2, nkv=1, batch=1, seq=4, theta=10000.0, pairing="adjacent", packed=True),
    Row("Transpose", lambda g: g.transpose(P(g, "x", [3, 5]))),
    Row("Identity", lambda g: g.reshape(P(g, "x", [3, 4]), [2, 6])),
    Row("Select", lambda g: g.add_node("Select", (P(g, "x", [3, 2, 32]),), index=1)),
    Row("SumAll", lambda g: g.sum_all(P(g, "x", [3, 5]))),
    Row("MeanAll", lambda g: g.mean_all(P(g, "x", [3, 5]))),
    Row("Concat-axis0", lambda g: g.concat([P(g, "a", [2, 3]), P(g, "b", [4, 3])], axis=0)),
    Row("Concat-axis1", lambda g: g.concat([P(g, "a", [3, 2]), P(g, "b", [3, 4]), P(g, "c", [3, 1])], axis=1)),
    Row("Concat-3d", lambda g: g.concat([P(g, "a", [2, 3, 2]), P(g, "b", [2, 1, 2])], axis=1)),
    Row("SliceCols", lambda g: g.slice_cols(P(g, "x", [3, 7]), 2, 3)),
    Row("SliceCols-tiling", lambda g: _two_slices(g, [(0, 3), (3, 4)])),
    Row("SliceCols-overlap", lambda g: _two_slices(g, [(0, 4), (2, 5)])),
    Row("GroupNorm", lambda g: g.group_norm(P(g, "x", [2, 6, 5]), P(g, "w", [6]), P(g, "b", [6]), num_groups=3),
        init={"w": near_one}),
    Row("GroupNormSilu", lambda g: g.add_node("GroupNormSilu", (P(g, "x", [2, 4, 3]), P(g, "w", [4]), P(g, "b", [4])),
                                              num_groups=2, eps=1e-5), init={"w": near_one}),
    Row("CrossEntropyLoss", lambda g: g.add_node("CrossEntropyLoss", (P(g, "logits", [4, 5]), g.input("y", [4, 5]))),
        feeds={"y": _one_hot(4, 5, zero_row=2)}),
    Row("MseLoss", _mse),
]


# --- the rest of the seed's ops (vision, losses, windowed attention, Abs/Log/Recip) ---------------


def positive(rng, shape):
    return f32(rng.uniform(0.5, 2.0, size=shape))


def probabilities(rng, shape):
    return f32(rng.uniform(0.05, 0.95, size=shape))


def _windowed(op: str, nh=4, nkv=2, hd=4, batch=2, q_seq=4, kv_seq=4, mask=None, **extra) -> Row:
    def build(g):
        q = P(g, "q", [batch * q_seq, nh * hd])
        k, v = P(g, "k", [batch * kv_seq, nkv * hd]), P(g, "v", [batch * kv_seq, nkv * hd])
        ins = (q, k, v) if mask is None else (q, k, v, g.input("mask", [batch, kv_seq]))
        return g.add_node(op, ins, num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch, **extra)

    feeds = {} if mask is None else {"mask": f32(mask)}
    return Row(f"{op}-h{nh}kv{nkv}b{batch}-{q_seq}x{kv_seq}{'-mask' if mask is not None else ''}", build, feeds)


def _conv2d(x, w, stride, ph, pw) -> Row:
    return Row(f"Conv2d{x}{w}-s{stride}-p{ph},{pw}",
               lambda g: g.add_node("Conv2d", (P(g, "x", x), P(g, "w", w)), stride=stride, padding_h=ph, padding_w=pw))


def _bce_scaled(g):
    bce = g.add_node("BceLoss", (g.sigmoid(P(g, "z", [3, 4])), g.input("t", [3, 4])))
    return g.mul(bce, P(g, "s", [1]))


ROWS += [
    Row("Log", lambda g: g.add_node("Log", (P(g, "x", [3, 5]),)), init={"x": positive}),
    Row("Greater-as-mask", lambda g: (lambda x: g.mul(x, g.add_node("Greater", (x, P(g, "y", [5])))))(
        P(g, "x", [3, 5]))),
    Row("LogSoftmax", lambda g: g.add_node("LogSoftmax", (P(g, "x", [3, 5]),))),
    Row("BceLoss", lambda g: g.add_node("BceLoss", (P(g, "p", [3, 5]), g.input("t", [3, 5]))),
        feeds={"t": f32(np.random.default_rng(4).random((3, 5)))}, init={"p": probabilities}),
    Row("BceLoss-of-sigmoid-scaled", _bce_scaled, feeds={"t": (np.arange(12).reshape(3, 4) % 2).astype(np.float64)}),
    _windowed("SlidingWindowAttention", window_size=2),
    _windowed("SlidingWindowAttention", nh=2, nkv=1, batch=1, q_seq=5, kv_seq=5, window_size=3,
              mask=[[0, 0, 1, 0, 1]]),  # rows 0 and 1 see only masked keys
    _windowed("CrossAttention", q_seq=3, kv_seq=5),
    _windowed("CrossAttention", nh=2, nkv=1, q_seq=4, kv_seq=3, mask=[[1, 0, 1], [0, 0, 0]]),
    _conv2d([2, 2, 5, 6], [3, 2, 3, 2], 2, 1, 0),
    _conv2d([1, 3, 4, 4], [2, 3, 3, 3], 1, 1, 1),
    Row("MaxPool2d", lambda g: g.add_node("MaxPool2d", (P(g, "x", [2, 2, 5, 5]),), kernel_h=3, kernel_w=2, stride=2,
                                          padding=1)),
    Row("GlobalAvgPool", lambda g: g.add_node("GlobalAvgPool", (P(g, "x", [2, 3, 2, 3]),))),
    Row("Upsample2x", lambda g: g.add_node("Upsample2x", (P(g, "x", [1, 2, 2, 3]),))),
]


def _where_mask(g):
    # a leaky ReLU written as ONNX graphs do: Where(Less(x, 0), 0.1 x, x); the mask takes no gradient
    x = P(g, "x", [3, 5])
    return g.add_node("Where", (g.add_node("Less", (x, g.constant(0.0, shape=()))), g.mul(x, g.constant(0.1)), x))


def _cast_twice(g):
    # x * trunc(x): Cast to i32 and back is piecewise constant, the identity cast passes dy
    x = P(g, "x", [3, 5])
    trunc = g.add_node("Cast", (g.add_node("Cast", (x,), to="i32"),), to="f32")
    return g.mul(g.add_node("Cast", (x,), to="f32"), trunc)


# the broadcasting ops of ir/ops/arithmetic.py
ROWS += [
    _binary("Sub", [3, 5], [5]),
    _binary("Sub", [1], [3, 4]),
    *[Row(f"Div{xs}{ys}", lambda g, xs=xs, ys=ys: g.add_node("Div", (P(g, "x", xs), P(g, "y", ys))),
          init={"y": away_from_zero}) for xs, ys in (([3, 5], [3, 5]), ([2, 3, 5], [5]))],
    _binary("Min", [3, 5], [5]),
    _binary("Max", [3, 5], [3, 1]),
    Row("Where", lambda g: g.add_node("Where", (g.input("c", [3, 5], DType.BOOL), P(g, "x", [3, 5]), P(g, "y", [5]))),
        feeds={"c": np.random.default_rng(3).random((3, 5)) < 0.5}),
    Row("Where-leaky-relu", _where_mask, init={"x": away_from_zero}),
    Row("Cast", _cast_twice, init={"x": lambda rng, shape: f32(rng.uniform(-3.9, 3.9, shape) // 0.5 * 0.5 + 0.25)}),
    Row("Sign-as-factor", lambda g: (lambda x: g.mul(x, g.add_node("Sign", (x,))))(P(g, "x", [3, 5])),
        init={"x": away_from_zero}),
    Row("Pow", lambda g: g.add_node("Pow", (P(g, "x", [3, 5]), P(g, "y", [5]))), init={"x": near_one}),
    Row("Pow-square", lambda g: g.add_node("Pow", (P(g, "x", [3, 5]), g.constant(2.0, shape=())))),
    Row("Pow-i32-exponent", lambda g: g.add_node("Pow", (P(g, "x", [3, 5]), g.constant([3, -1, 2, 0, 1],
                                                                                        dtype=DType.I32))),
        init={"x": away_from_zero}),
    *[Row(f"Mod-fmod{f}", lambda g, f=f: g.add_node("Mod", (P(g, "x", [3, 5]), P(g, "y", [5])), fmod=f),
          init={"y": lambda rng, shape: f32(rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 0.6, shape))})
      for f in (0, 1)],
    Row("PRelu", lambda g: g.add_node("PRelu", (P(g, "x", [3, 5]), P(g, "slope", [5]))), init={"x": away_from_zero}),
    Row("Clip", lambda g: g.add_node("Clip", (P(g, "x", [3, 5]), P(g, "lo", [5]), P(g, "hi", []))),
        init={"lo": lambda rng, shape: f32(rng.uniform(-0.6, -0.2, shape)), "hi": lambda rng, shape: f32(0.4)}),
    Row("Clip-min-above-max", lambda g: g.add_node("Clip", (P(g, "x", [3, 5]), P(g, "lo", [1]), P(g, "hi", [5]))),
        init={"lo": lambda rng, shape: f32([0.1]), "hi": lambda rng, shape: f32(rng.uniform(-0.5, 0.5, shape))}),
]

def _token_pool(mean: bool, normalize: bool, mask: bool = False) -> Row:
    # TokenPool's x and weights (positive: a mean's count above its clamp), or x under an i32 0/1 mask (an Input)
    def build(g):
        w = g.input("m", [2, 4], DType.I32) if mask else P(g, "w", [2, 4])
        return g.add_node("TokenPool", (P(g, "x", [2, 4, 3]), w), mean=mean, normalize=normalize)

    tag = ("-mean" if mean else "") + ("-normalize" if normalize else "") + ("-i32-mask" if mask else "")
    return Row(f"TokenPool{tag}", build, feeds={"m": np.array([[1, 1, 0, 1], [0, 1, 1, 1]], np.int32)},
               init={"w": lambda rng, shape: f32(rng.uniform(0.2, 1.0, shape))})


ROWS += [_token_pool(mean, normalize) for mean in (False, True) for normalize in (False, True)]
ROWS += [_token_pool(True, True, mask=True)]


def _loss(g: Graph, out: int, rng) -> int:
    """The row's output if it is a loss, else sum(out * R) with a fixed random R."""
    if g.node(out).type.shape == (1,):
        return out
    r = g.constant(rng.standard_normal(g.node(out).type.shape))
    return g.sum_all(g.mul(out, r))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gradients_match_finite_differences(row: Row):
    rng = np.random.default_rng(zlib.crc32(row.id.encode()))
    g = Graph()
    loss = _loss(g, row.build(g), rng)
    check_gradients(g, loss, leaf_values(g, row, rng))



def test_a_table_read_through_i32_indices_has_no_gradient():
    g = Graph()
    y = g.add_node("EmbeddingSumLayerNorm", (P(g, "w", [4]), P(g, "b", [4]), g.input("i0", [6], DType.I32),
                                             P(g, "t0", [5, 4]), P(g, "pos", [3, 4])), eps=1e-5, positions=3)
    with pytest.raises(GraphError, match="a table read through i32 indices .* has no gradient"):
        grad(g, g.sum_all(y))


@pytest.mark.parametrize("op", ["CausalAttention", "CausalAttentionRoPE"])
def test_a_causal_attention_with_a_key_mask_has_no_gradient(op):
    # the AttentionGrad kernels take a key mask only without causal rows (an exported decoder's padding is inference)
    g = Graph()
    q, k, v = (P(g, n, [6, 8]) for n in "qkv")
    mask = g.input("key_mask", [2, 3])
    if op == "CausalAttention":
        y = g.causal_attention(q, k, v, 2, 2, 4, batch=2, key_mask=mask)
    else:
        y = g.causal_attention_rope(q, k, v, 2, 2, 4, 100.0, batch=2, key_mask=mask)
    with pytest.raises(GraphError, match=rf"{op} \(q f32\[6,8\], key_mask node {mask} f32\[2,3\]\): a causal "
                                         "attention with a key_mask has no gradient .* differentiate the graph "
                                         "without the key_mask"):
        grad(g, g.sum_all(y))


def test_loss_seed_other_than_one():
    # CrossEntropyLoss and MeanAll fold the unit seed; scaled, they must multiply by it.
    rng = np.random.default_rng(1)
    g = Graph()
    ce = g.add_node("CrossEntropyLoss", (P(g, "logits", [4, 5]), g.input("y", [4, 5])))
    loss = g.add(g.mul(ce, g.constant(0.5)), g.mul(g.mean_all(g.tanh(P(g, "x", [2, 3]))), P(g, "s", [1])))
    check_gradients(g, loss, leaf_values(g, Row("", lambda g: 0, feeds={"y": _one_hot(4, 5)}), rng))


def test_every_forward_op_has_a_rule_and_a_row():
    # every op with a gradient rule has a row here (gradient ops, optimiser updates and the KV-cache
    # ops carry a no-gradient marker instead: tests/unit/test_conformance.py)
    forward = {op for op, spec in OPS.items() if spec.differentiable}
    covered = set()
    for row in ROWS:
        g = Graph()
        row.build(g)
        covered |= {n.op for n in g.nodes}
    assert forward <= covered, (f"op(s) {sorted(forward - covered)} have a gradient rule but no finite-difference "
                                "row: add one to ROWS in tests/unit/test_autodiff.py")


# --- structure of the training graph ---------------------------------------------------------


def _ops(tg, start: int) -> list[str]:
    return [n.op for n in tg.nodes[start:]]


def test_input_graph_is_not_modified_and_outputs_are_ordered():
    g = Graph()
    x = g.input("x", [3, 4])
    w1, w2 = P(g, "w1", [4, 5]), P(g, "w2", [5, 2])
    out = g.matmul(g.tanh(g.matmul(x, w1)), w2)
    loss = g.mean_all(out)
    g.set_outputs([out])
    before = g.summary()
    tg = grad(g, loss, wrt=["w2", "x", "w1"])
    assert g.summary() == before
    assert tg.grad_outputs == {"w2": 1, "x": 2, "w1": 3}
    assert tg.outputs[0] == loss and len(tg.outputs) == 4
    assert [n.op for n in tg.nodes[: len(g)]] == [n.op for n in g.nodes]
    with pytest.raises(GraphError, match="already used"):  # the leaf names came along
        tg.parameter("w1", [2])
    rng = np.random.default_rng(0)
    values = {"x": f32(rng.standard_normal((3, 4))), "w1": f32(rng.standard_normal((4, 5))),
              "w2": f32(rng.standard_normal((5, 2)))}
    check_gradients(g, loss, values, wrt=["w2", "x", "w1"])


def test_multi_use_gradients_are_summed():
    g = Graph()
    w = P(g, "w", [4, 4])
    x = g.input("x", [3, 4])
    h = g.matmul(x, w)
    loss = g.add(g.sum_all(g.matmul(g.tanh(h), w)), g.sum_all(g.sigmoid(w)))  # w used three times
    rng = np.random.default_rng(2)
    values = {"w": f32(0.5 * rng.standard_normal((4, 4))), "x": f32(rng.standard_normal((3, 4)))}
    tg, _ = check_gradients(g, loss, values)
    dw = tg.node(tg.outputs[1])
    assert dw.op == "Add" and tg.node(dw.inputs[0]).op == "Add"  # three contributions, two Adds


def test_frozen_parameters_get_no_output_and_no_backward_work():
    g = Graph()
    x = g.input("x", [3, 4])
    w, frozen = P(g, "w", [5, 4]), P(g, "emb", [4, 4])
    h = g.matmul(x, frozen)
    loss = g.mean_all(g.silu(g.matmul_bt(h, w)))
    tg = grad(g, loss, frozen=["emb"])
    assert tg.grad_outputs == {"w": 1} and len(tg.outputs) == 2
    # d w = MatMulAT(dC, h); nothing propagates into h (no MatMulBT, no gradient for emb)
    assert sorted(_ops(tg, len(g))) == sorted(["Constant", "BroadcastTo", "SiluGrad", "MatMulAT"])
    rng = np.random.default_rng(3)
    values = {"x": f32(rng.standard_normal((3, 4))), "w": f32(rng.standard_normal((5, 4))),
              "emb": f32(rng.standard_normal((4, 4)))}
    check_gradients(g, loss, values, frozen=["emb"])


def test_unused_parameter_gets_a_zero_gradient():
    g = Graph()
    a = P(g, "a", [2, 3])
    P(g, "unused", [3])
    loss = g.sum_all(g.tanh(a))
    tg = grad(g, loss)
    assert tg.zero_grads == ("unused",)
    out = evaluate(tg, {}, {"a": np.ones((2, 3)), "unused": np.ones(3)})
    np.testing.assert_array_equal(out[tg.grad_outputs["unused"]], np.zeros(3))
    assert tg.node(tg.outputs[2]).op == "BroadcastTo"  # not a full-size constant


def test_fused_epilogue_wanting_only_bias_builds_only_a_reduction():
    g = Graph()
    a, w = g.input("a", [3, 4]), g.input("w", [4, 5])
    bias, res = P(g, "bias", [5]), g.input("res", [3, 5])
    out = g.add_node("FusedMatMul", (a, w, bias, res), variant="", epilogue=("bias", "add"))
    tg = grad(g, g.sum_all(out))
    assert _ops(tg, len(g)) == ["Constant", "BroadcastTo", "SumRows"]


def test_mean_all_loss_folds_the_seed():
    g = Graph()
    loss = g.mean_all(P(g, "x", [3, 4]))
    tg = grad(g, loss)
    assert _ops(tg, len(g)) == ["Constant", "BroadcastTo"]  # no Mul by the unit seed
    assert tg.node(tg.nodes[len(g)].id).attrs["value"][0] == np.float32(1 / 12)


def test_bad_loss_and_names_raise_graph_error():
    g = Graph()
    x = P(g, "x", [3, 4])
    y = g.tanh(x)
    with pytest.raises(GraphError, match=r"f32\[1\].*Tanh"):
        grad(g, y)
    with pytest.raises(GraphError, match="not a node"):
        grad(g, 99)
    loss = g.sum_all(y)
    with pytest.raises(GraphError, match="'nope'"):
        grad(g, loss, wrt=["nope"])
    with pytest.raises(GraphError, match="not parameters"):
        grad(g, loss, frozen=["nope"])
    with pytest.raises(GraphError, match="both"):
        grad(g, loss, wrt=["x"], frozen=["x"])


def test_labels_depending_on_a_parameter_raise():
    g = Graph()
    logits, soft = P(g, "logits", [2, 3]), P(g, "soft", [2, 3])
    loss = g.add_node("CrossEntropyLoss", (logits, g.softmax(soft)))
    with pytest.raises(GraphError, match="labels"):
        grad(g, loss)
    assert grad(g, loss, frozen=["soft"]).grad_outputs == {"logits": 1}


def test_gradient_ops_have_no_rule():
    g = Graph()
    x = P(g, "x", [2, 3])
    loss = g.sum_all(g.add_node("TanhGrad", (x, x)))
    with pytest.raises(GraphError, match="TanhGrad has no gradient rule"):
        grad(g, loss)


# --- a 2-layer LLaMA-style model -------------------------------------------------------------

SEQ, BATCH, HID, NH, NKV, HD, FFN, VOCAB, THETA = 5, 2, 16, 4, 2, 4, 12, 11, 100.0


def llama(fused: bool, layers: int = 2) -> tuple[Graph, int]:
    """Embedding -> layers x (RmsNorm, GQA causal attention with RoPE, SwiGLU MLP) -> CE loss.

    ``fused`` builds what the rewrite engine produces: packed QKV / gate-up weights,
    FusedRmsNormMatMul, CausalAttentionRoPE and residual adds in matmul epilogues.
    """
    g = Graph()
    rows = SEQ * BATCH
    x = g.embedding(g.input("tokens", [rows], DType.U32), P(g, "embed", [VOCAB, HID]))
    labels = g.input("labels", [rows, VOCAB])
    for layer in range(layers):
        p = f"l{layer}."
        wn1, wn2 = P(g, p + "attn_norm", [HID]), P(g, p + "mlp_norm", [HID])
        wq, wk, wv = P(g, p + "wq", [NH * HD, HID]), P(g, p + "wk", [NKV * HD, HID]), P(g, p + "wv", [NKV * HD, HID])
        wo = P(g, p + "wo", [HID, NH * HD])
        wg, wu, wd = P(g, p + "gate", [FFN, HID]), P(g, p + "up", [FFN, HID]), P(g, p + "down", [HID, FFN])
        heads = dict(num_heads=NH, num_kv_heads=NKV, head_dim=HD, batch=BATCH)
        if fused:
            qkv = g.add_node("FusedRmsNormMatMul", (x, wn1, g.concat([wq, wk, wv], axis=0)), eps=1e-5, variant="BT")
            q, k = g.slice_cols(qkv, 0, NH * HD), g.slice_cols(qkv, NH * HD, NKV * HD)
            v = g.slice_cols(qkv, (NH + NKV) * HD, NKV * HD)
            att = g.causal_attention_rope(q, k, v, theta=THETA, **heads)
            x = g.add_node("FusedMatMul", (att, wo, x), variant="BT", epilogue=("add",))
            gu = g.add_node("FusedRmsNormMatMul", (x, wn2, g.concat([wg, wu], axis=0)), eps=1e-5, variant="BT")
            x = g.add_node("FusedMatMul", (g.swiglu_concat(gu), wd, x), variant="BT", epilogue=("add",))
        else:
            h = g.rms_norm(x, wn1)
            q = g.rope(g.matmul_bt(h, wq), THETA, HD, batch=BATCH)
            k = g.rope(g.matmul_bt(h, wk), THETA, HD, batch=BATCH)
            att = g.causal_attention(q, k, g.matmul_bt(h, wv), **heads)
            x = g.add(x, g.matmul_bt(att, wo))
            h = g.rms_norm(x, wn2)
            x = g.add(x, g.matmul_bt(g.swiglu(g.matmul_bt(h, wg), g.matmul_bt(h, wu)), wd))
    logits = g.matmul_bt(g.rms_norm(x, P(g, "final_norm", [HID])), P(g, "lm_head", [VOCAB, HID]))
    return g, g.add_node("CrossEntropyLoss", (logits, labels))


def llama_values(g: Graph, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {"tokens": rng.integers(0, VOCAB, SEQ * BATCH).astype(np.uint32),
              "labels": _one_hot(SEQ * BATCH, VOCAB, zero_row=3, seed=seed)}
    for name, ty in g.parameters.items():
        scale = 1.0 if name == "embed" else 1.0 / np.sqrt(ty.shape[-1])
        values[name] = near_one(rng, ty.shape) if name.endswith("norm") else f32(scale * rng.standard_normal(ty.shape))
    return values


def test_llama_block_gradients_match_finite_differences():
    g, loss = llama(fused=False)
    check_gradients(g, loss, llama_values(g), entries_per_param=6)


def test_fused_llama_block_matches_unfused_gradients():
    g, loss = llama(fused=False)
    gf, loss_f = llama(fused=True)
    values = llama_values(g)
    tg, tgf = grad(g, loss), grad(gf, loss_f)
    assert tg.grad_outputs.keys() == tgf.grad_outputs.keys()
    out, out_f = (evaluate(t, *split(g, values)) for t in (tg, tgf))
    for name, i in tg.grad_outputs.items():
        np.testing.assert_allclose(out_f[tgf.grad_outputs[name]], out[i], rtol=1e-9, atol=1e-12, err_msg=name)
    check_gradients(gf, loss_f, values, entries_per_param=4, seed=1)
    ops = {n.op for n in tgf.nodes[len(gf):]}
    assert {"Concat", "AttentionGradQ", "RoPEGrad", "SwiGLUConcatGrad", "RmsNormGradX"} <= ops
    assert "PadCols" not in ops  # q, k, v slices tile the packed output: their grads are concatenated


def test_training_graph_takes_a_first_output_of_one_element_as_the_loss_and_names_clashes():
    # `eggfuse optimize FILE.py:fn --training` added a CrossEntropyLoss on any first output: a graph ending in
    # its own loss failed on a node the user never wrote, an input named labels on a name clash
    from eggfuse.api import training_graph
    from eggfuse.ir import InputError

    g = Graph()
    x, w = g.input("x", [5, 7]), g.parameter("w", [7, 3])
    g.set_outputs([g.mean_all(g.relu(g.matmul(x, w)))])
    t = training_graph(g)
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    loss, dw = evaluate(t, {"x": xv}, {"w": wv})
    h = xv @ wv
    np.testing.assert_allclose(loss.reshape(()), np.maximum(h, 0).mean(), rtol=1e-6)
    np.testing.assert_allclose(dw, xv.T @ ((h > 0) / h.size), rtol=1e-5, atol=1e-7)
    clash = Graph()
    clash.set_outputs([clash.matmul(clash.input("labels", [5, 7]), clash.parameter("w", [7, 7]))])
    with pytest.raises(InputError, match="training adds an input 'labels' .* the graph has one of that name"):
        training_graph(clash)
    one = Graph()  # a batch-1 regressor's prediction [1, 1], asked for mse: its target stays
    one.set_outputs([one.matmul(one.input("x", [1, 4]), one.parameter("w", [4, 1]))])
    assert sorted(training_graph(one, loss="mse").inputs) == ["target", "x"]
    cube = Graph()
    cube.set_outputs([cube.relu(cube.input("x", [2, 3, 4]))])
    with pytest.raises(InputError, match=r"takes the first output as logits \[M, V\], but it is f32\[2,3,4\]"):
        training_graph(cube)
