"""Op kinds: one block per op with its attributes, shape rule and numpy reference.

The registry :data:`OPS` maps an op name to an :class:`OpDef`. Everything downstream
(egglog encoding, cost model, lowering, tests) reads this table, so adding an op means
adding one block here, one kernel entry in lowering and one test row.

Semantics follow meganeura 0.2.0 ``graph.rs`` (``../shared/seeds``). The reference
functions compute in float64 for F32 tensors; they are the oracle for every test.
Shape rules raise :class:`ShapeError` with a plain message; :class:`~eggfuse.ir.graph.Graph`
wraps it into a :class:`~eggfuse.ir.errors.GraphError` that names the node, op and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import erfc

from .types import DType, TensorType

F32 = DType.F32
U32 = DType.U32

#: Sentinel score for masked attention positions (finite, so no inf arithmetic anywhere).
MASK_SENTINEL = -1.0e30


class ShapeError(ValueError):
    """Raised by a shape rule; the graph builder adds node, op and shapes to it."""


@dataclass(frozen=True)
class OpDef:
    """How one op kind behaves.

    ``infer(types, attrs) -> TensorType`` is the shape rule, ``reference(values, attrs)``
    the numpy semantics. ``unary`` marks elementwise one-input ops that may be folded
    into a matmul epilogue. ``dispatches`` is the number of GPU dispatches the op costs
    when lowered (0 for leaves and views).
    """

    name: str
    min_inputs: int
    max_inputs: int
    infer: Callable[[list[TensorType], dict[str, Any]], TensorType]
    reference: Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]
    attrs: tuple[str, ...] = ()
    unary: bool = False
    dispatches: int = 1
    doc: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    #: Index of an input the op updates in place (a KV cache, a parameter under an
    #: optimiser): the node's value is that input's new value, in the same buffer.
    writes: int | None = None


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    return op


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _f32(t: TensorType, what: str) -> None:
    if t.dtype is not F32:
        raise ShapeError(f"{what} must be f32, got {t}")


# --- leaves ------------------------------------------------------------------------------


def _leaf_ref(values, attrs):  # leaves are fed by the interpreter, never evaluated here
    raise RuntimeError("leaf nodes have no reference function")


for _leaf in ("Input", "Parameter", "Constant"):
    register(OpDef(_leaf, 0, 0, lambda ts, a: a["type"], _leaf_ref, attrs=("name",), dispatches=0))


# --- matmul family -------------------------------------------------------------------------


def _matmul_dims(ts: list[TensorType], variant: str) -> tuple[int, int, int]:
    _need(variant in ("", "AT", "BT"), f"variant must be '', 'AT' or 'BT', got {variant!r}")
    a, b = ts[0], ts[1]
    _f32(a, "A")
    _f32(b, "B")
    _need(a.rank == 2 and b.rank == 2, f"needs 2-D operands, got A {a} and B {b}")
    if variant == "AT":  # C = A^T B, A [K,M], B [K,N]
        (k, m), (k2, n) = a.shape, b.shape
    elif variant == "BT":  # C = A B^T, A [M,K], B [N,K]
        (m, k), (n, k2) = a.shape, b.shape
    else:
        (m, k), (k2, n) = a.shape, b.shape
    _need(k == k2, f"inner dimensions differ: A {a}, B {b} (variant {variant or 'plain'})")
    return m, k, n


def _matmul_ref(a: np.ndarray, b: np.ndarray, variant: str) -> np.ndarray:
    if variant == "AT":
        return a.T @ b
    if variant == "BT":
        return a @ b.T
    return a @ b


for _name, _variant in (("MatMul", ""), ("MatMulAT", "AT"), ("MatMulBT", "BT")):
    register(
        OpDef(
            _name,
            2,
            2,
            (lambda v: lambda ts, a: TensorType(_matmul_dims(ts, v)[0::2]))(_variant),
            (lambda v: lambda xs, a: _matmul_ref(xs[0], xs[1], v))(_variant),
            doc={"": "C[M,N] = A[M,K] @ B[K,N]", "AT": "C[M,N] = A[K,M]^T @ B[K,N]",
                 "BT": "C[M,N] = A[M,K] @ B[N,K]^T"}[_variant],
        )
    )


# --- elementwise -------------------------------------------------------------------------


def _gelu_erf(x):
    # 0.5 x (1 + erf(x / sqrt 2)) written with erfc, exact in float64 in the negative tail too
    # (1 + erf(x / sqrt 2) rounds to 0 below x = -8.3)
    return 0.5 * x * erfc(-x / math.sqrt(2.0))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic


#: Unary elementwise functions by op name; also the epilogue steps a matmul can apply.
UNARY_FNS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Relu": lambda x: np.maximum(x, 0.0),
    "Sigmoid": _sigmoid,
    "Tanh": np.tanh,
    "Neg": np.negative,
    "Gelu": _gelu_erf,  # GELU, erf form (Hendrycks & Gimpel 2016), as BERT uses
    "GeluTanh": _gelu_tanh,  # GELU, tanh approximation (same paper, eq. 2)
    "Silu": lambda x: x * _sigmoid(x),  # SiLU / swish (Elfwing et al. 2018)
}


def _same_f32(ts, a):
    _f32(ts[0], "input")
    return ts[0]


for _name, _fn in UNARY_FNS.items():
    register(OpDef(_name, 1, 1, _same_f32, (lambda f: lambda xs, a: f(xs[0]))(_fn), unary=True))


def _broadcast(ts, a):
    x, y = ts
    _f32(x, "lhs")
    _f32(y, "rhs")
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ShapeError(f"shapes {x} and {y} do not broadcast") from None
    return TensorType(tuple(shape))


register(OpDef("Add", 2, 2, _broadcast, lambda xs, a: xs[0] + xs[1],
               doc="numpy broadcasting add"))
register(OpDef("Mul", 2, 2, _broadcast, lambda xs, a: xs[0] * xs[1],
               doc="numpy broadcasting multiply"))


def _bias_add(ts, a):
    x, b = ts
    _f32(x, "input")
    _f32(b, "bias")
    _need(x.rank == 2, f"input must be 2-D, got {x}")
    n = x.shape[1]
    _need(b.shape in ((n,), (1, n)), f"bias must be [{n}] or [1,{n}], got {b} for input {x}")
    return x


register(OpDef("BiasAdd", 2, 2, _bias_add, lambda xs, a: xs[0] + xs[1].reshape(1, -1),
               doc="out[i,j] = x[i,j] + bias[j]"))


def _swiglu(ts, a):
    g, u = ts
    _f32(g, "gate")
    _need(g == u, f"gate {g} and up {u} must have the same type")
    return g


register(OpDef("SwiGLU", 2, 2, _swiglu, lambda xs, a: UNARY_FNS["Silu"](xs[0]) * xs[1],
               doc="silu(gate) * up (Shazeer 2020, GLU variants)"))


# --- normalisation and softmax -------------------------------------------------------------


def _row_norm(ts, a):
    x = ts[0]
    _f32(x, "input")
    _need(x.rank == 2, f"input must be 2-D, got {x}")
    for t, what in zip(ts[1:], ("weight", "bias"), strict=False):
        _need(t.shape == (x.shape[1],), f"{what} must be [{x.shape[1]}], got {t}")
    return x


def _rms_norm_ref(xs, a):
    x, w = xs
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + a["eps"]) * w


def _layer_norm_ref(xs, a):
    x, w, b = xs
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + a["eps"]) * w + b


register(OpDef("RmsNorm", 2, 2, _row_norm, _rms_norm_ref, attrs=("eps",),
               doc="x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019)"))
register(OpDef("LayerNorm", 3, 3, _row_norm, _layer_norm_ref, attrs=("eps",),
               doc="(x - mean) / sqrt(var + eps) * w + b, biased variance (Ba et al. 2016)"))


def _softmax_ref(xs, a):
    x = xs[0]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


register(OpDef("Softmax", 1, 1, _same_f32, _softmax_ref, doc="softmax over the last axis"))


# --- shape ops and reductions --------------------------------------------------------------


def _transpose(ts, a):
    _f32(ts[0], "input")
    _need(ts[0].rank == 2, f"input must be 2-D, got {ts[0]}")
    return TensorType(ts[0].shape[::-1], ts[0].dtype)


register(OpDef("Transpose", 1, 1, _transpose, lambda xs, a: xs[0].T))


def _identity(ts, a):
    shape = tuple(a["shape"])
    _need(all(d >= 1 for d in shape), f"target shape {shape} has a dimension < 1")
    _need(math.prod(shape) == ts[0].num_elements,
          f"cannot reshape {ts[0]} to {list(shape)}: element counts differ")
    return TensorType(shape, ts[0].dtype)


register(OpDef("Identity", 1, 1, _identity, lambda xs, a: xs[0].reshape(a["shape"]),
               attrs=("shape",), dispatches=0, doc="reshape view, no data movement"))
def _reduce_all(ts, a):
    _f32(ts[0], "input")
    return TensorType((1,))


register(OpDef("SumAll", 1, 1, _reduce_all, lambda xs, a: np.array([xs[0].sum()])))
register(OpDef("MeanAll", 1, 1, _reduce_all, lambda xs, a: np.array([xs[0].mean()])))


# --- transformer -------------------------------------------------------------------------


def _embedding(ts, a):
    idx, table = ts
    _need(idx.dtype is U32 and idx.rank == 1, f"indices must be u32 1-D, got {idx}")
    _need(table.dtype is F32 and table.rank == 2, f"table must be f32 2-D, got {table}")
    return TensorType((idx.shape[0], table.shape[1]))


def _embedding_ref(xs, a):
    idx, table = xs
    bad = idx >= table.shape[0]
    if bad.any():
        from .errors import InputError

        raise InputError(f"Embedding: index {int(idx[bad][0])} out of range for a table "
                         f"of {table.shape[0]} rows")
    return table[idx.astype(np.int64)]


register(OpDef("Embedding", 2, 2, _embedding, _embedding_ref, doc="out[t] = table[indices[t]]"))


def _rope(ts, a):
    x = ts[0]
    hd = a["head_dim"]
    _f32(x, "input")
    _need(x.rank == 2, f"input must be 2-D, got {x}")
    _need(hd > 0 and hd % 2 == 0, f"head_dim must be even and > 0, got {hd}")
    _need(x.shape[1] % hd == 0, f"width {x.shape[1]} is not a multiple of head_dim {hd}")
    _need(a["pairing"] in ("half", "adjacent"), f"pairing must be half or adjacent, got {a['pairing']!r}")
    _need(a["batch"] >= 1 and x.shape[0] % a["batch"] == 0,
          f"{x.shape[0]} rows do not split into batch={a['batch']} sequences")
    return x


def rope_pairs(head_dim: int, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices (first, second) of the rotated pairs inside one head.

    ``half``: (j, j + head_dim/2), the GPT-NeoX / Hugging Face layout. ``adjacent``:
    (2j, 2j+1), the original RoFormer layout that llama.cpp's permuted Q/K weights use.
    Pair j rotates by angle pos * theta^(-2j/head_dim) (Su et al. 2021, eq. 15).
    """
    j = np.arange(head_dim // 2)
    if pairing == "half":
        return j, j + head_dim // 2
    return 2 * j, 2 * j + 1


def _rope_ref(xs, a):
    x = xs[0]
    hd, theta = a["head_dim"], a["theta"]
    seq = x.shape[0] // a["batch"]
    pos = (np.arange(x.shape[0]) % seq + a["pos_offset"])[:, None].astype(np.float64)
    first, second = rope_pairs(hd, a["pairing"])
    inv_freq = theta ** (-2.0 * np.arange(hd // 2) / hd)
    ang = pos * inv_freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    out = x.copy()
    for h in range(x.shape[1] // hd):
        i0, i1 = h * hd + first, h * hd + second
        p, q = x[:, i0], x[:, i1]
        out[:, i0] = p * cos - q * sin
        out[:, i1] = p * sin + q * cos
    return out


register(OpDef("RoPE", 1, 1, _rope, _rope_ref,
               attrs=("theta", "head_dim", "pos_offset", "pairing", "batch"),
               defaults={"pos_offset": 0, "pairing": "half", "batch": 1},
               doc="rotary position embedding (Su et al. 2021); row r has position "
                   "pos_offset + r mod (rows / batch)"))


def _attention(ts, a):
    q, k, v = ts[:3]
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    for t, w, what in ((q, nh * hd, "q"), (k, nkv * hd, "k"), (v, nkv * hd, "v")):
        _f32(t, what)
        _need(t.rank == 2 and t.shape[1] == w, f"{what} must be [rows,{w}], got {t}")
    _need(nkv >= 1 and nh % nkv == 0, f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    _need(k.shape[0] == q.shape[0] and v.shape[0] == q.shape[0],
          f"q {q}, k {k} and v {v} must have the same number of rows")
    _need(batch >= 1 and q.shape[0] % batch == 0, f"{q.shape[0]} rows do not split into {batch} sequences")
    if len(ts) == 4:
        seq = q.shape[0] // batch
        _f32(ts[3], "key_mask")
        _need(ts[3].shape == (batch, seq), f"key_mask must be [{batch},{seq}], got {ts[3]}")
    return TensorType((q.shape[0], nh * hd))


def attention_reference(q, k, v, a, causal: bool, key_mask=None) -> np.ndarray:
    """Scaled dot-product attention per sequence and head, GQA and key masking.

    Query head h reads kv head h // (num_heads / num_kv_heads). Masked scores are set to
    the finite :data:`MASK_SENTINEL` before the max-subtracted softmax, so a fully masked
    row averages all values instead of producing NaN (Vaswani et al. 2017, eq. 1).
    """
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    seq = q.shape[0] // batch
    group = nh // nkv
    out = np.zeros((q.shape[0], nh * hd))
    scale = 1.0 / math.sqrt(hd)
    for b in range(batch):
        rows = slice(b * seq, (b + 1) * seq)
        for h in range(nh):
            kh = h // group
            qh = q[rows, h * hd:(h + 1) * hd]
            kk = k[rows, kh * hd:(kh + 1) * hd]
            vv = v[rows, kh * hd:(kh + 1) * hd]
            s = (qh @ kk.T) * scale
            keep = np.ones_like(s, dtype=bool)
            if causal:
                keep &= np.tril(np.ones((seq, seq), dtype=bool))
            if key_mask is not None:
                keep &= (key_mask[b] > 0)[None, :]
            s = np.where(keep, s, MASK_SENTINEL)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[rows, h * hd:(h + 1) * hd] = p @ vv
    return out


_ATTN_ATTRS = ("num_heads", "num_kv_heads", "head_dim", "batch")
register(OpDef("FullAttention", 3, 4, _attention,
               lambda xs, a: attention_reference(*xs[:3], a, False, xs[3] if len(xs) > 3 else None),
               attrs=_ATTN_ATTRS, defaults={"batch": 1},
               doc="non-causal GQA attention; optional 4th input key_mask [batch, seq], 1 keeps a key"))
register(OpDef("CausalAttention", 3, 3, _attention,
               lambda xs, a: attention_reference(*xs, a, True),
               attrs=_ATTN_ATTRS, defaults={"batch": 1}, doc="causal GQA attention"))


# --- fused ops produced by the rewrite engine ----------------------------------------------

#: Epilogue steps a fused matmul may apply, in order, to each output element.
#: ``bias`` reads operand[j] ([N] or [1,N]); ``add`` reads operand[i,j] ([M,N]).
EPILOGUE_BINARY = ("bias", "add")
EPILOGUE_UNARY = tuple(UNARY_FNS)


def _fused_matmul(ts, a):
    m, _, n = _matmul_dims(ts, a["variant"])
    extra = list(ts[2:])
    for step in a["epilogue"]:
        if step in EPILOGUE_BINARY:
            _need(bool(extra), f"epilogue step {step} has no operand")
            t = extra.pop(0)
            want = ((n,), (1, n)) if step == "bias" else ((m, n),)
            _need(t.shape in want, f"epilogue {step} operand must be {' or '.join(map(str, want))}, got {t}")
        else:
            _need(step in EPILOGUE_UNARY, f"unknown epilogue step {step!r}")
    _need(not extra, f"{len(extra)} epilogue operands left unused")
    return TensorType((m, n))


def apply_epilogue(c: np.ndarray, epilogue, operands) -> np.ndarray:
    """Apply an epilogue chain to a matmul result ``c`` [M,N] (reference semantics)."""
    operands = list(operands)
    for step in epilogue:
        if step == "bias":
            c = c + operands.pop(0).reshape(1, -1)
        elif step == "add":
            c = c + operands.pop(0)
        else:
            c = UNARY_FNS[step](c)
    return c


register(OpDef(
    "FusedMatMul", 2, 16, _fused_matmul,
    lambda xs, a: apply_epilogue(_matmul_ref(xs[0], xs[1], a["variant"]), a["epilogue"], xs[2:]),
    attrs=("variant", "epilogue"),
    doc="C = epilogue(A op B): variant '' | 'AT' | 'BT', epilogue a tuple of steps "
        "(bias, add or a unary op name) applied in order at the store; inputs [A, B, *operands]",
))
