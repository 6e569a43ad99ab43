"""Ops of training graphs: the losses, the gradient ops and the adjoints of broadcasting.

Same conventions as :mod:`ops`: one block per op with its shape rule and a float64 numpy
reference. Every reference is written from the derivative's closed form (sources in each
``doc``); ``tests/unit/test_autodiff.py`` checks them against central finite differences.
:mod:`autodiff` is the only producer of the ``*Grad`` ops; names follow meganeura's
``graph.rs`` where it has the op (``SiluGrad``, ``SwiGLUGradGate``, ``RmsNormGradX``,
``ScatterAdd``, ``SumRows``, ``RoPEGrad``, ``CrossEntropyLoss`` ...).

Conventions shared by the gradient ops:

- ``dy`` (first input) is the gradient of the loss with respect to the forward output; the
  result is the gradient with respect to one forward input, of that input's type.
- Elementwise grads read the forward *input* x, never the output, so a fused matmul
  epilogue needs only its pre-activation values (the activation is recomputed in the
  grad kernel, which is memory-bound anyway). SoftmaxGrad reads the forward output y.
- Where the seed packs two gradients into one buffer (``LayerNormGradWB``,
  ``GroupNormGradWeightBias``, ``[2*cols]``), we emit one op per gradient: the IR has no
  1-D slice, a frozen weight or bias then costs nothing, and the bias gradient is a plain
  reduction (``SumRows`` / ``ReduceTo``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc

from .ops import (
    F32,
    U32,
    OpDef,
    _attention,
    _f32,
    _need,
    _rope,
    _sigmoid,
    _softmax_ref,
    register,
    rope_pairs,
)
from .types import TensorType

#: Ops registered here that compute gradients (they have no gradient rule themselves).
GRAD_OPS: set[str] = set()


def _register_grad(op: OpDef) -> None:
    register(op)
    GRAD_OPS.add(op.name)


def _like(ts, what: str, index: int) -> TensorType:
    """Check that input 0 (dy) has the type of input ``index`` and return that type."""
    for i, t in enumerate(ts):
        if t.dtype is not U32:
            _f32(t, f"input {i}")
    _need(ts[0] == ts[index], f"dy {ts[0]} must have the type of {what} {ts[index]}")
    return ts[index]


# --- CrossEntropyLoss and its gradient ------------------------------------------------------


def _cross_entropy(ts, a):
    logits, labels = ts
    _f32(logits, "logits")
    _need(logits.rank == 2, f"logits must be [M, V], got {logits}")
    _need(labels == logits, f"labels {labels} must have the type of logits {logits} (one-hot f32)")
    return TensorType((1,))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


register(OpDef(
    "CrossEntropyLoss", 2, 2, _cross_entropy,
    lambda xs, a: np.array([-(xs[1] * _log_softmax(xs[0])).sum() / xs[0].shape[0]]),
    doc="loss[1] = -(1/M) sum_i sum_j labels[i,j] * log_softmax(logits)[i,j]; logits and labels "
        "[M, V] (labels one-hot or a distribution per row; an all-zero row adds nothing). "
        "log_softmax is max-subtracted (seed: CrossEntropyLoss)",
))


def _cross_entropy_grad_ref(xs, a):
    logits, labels = xs
    p = _softmax_ref([logits], a)
    return (p * labels.sum(axis=-1, keepdims=True) - labels) / logits.shape[0]


def _cross_entropy_grad(ts, a):
    _cross_entropy(ts, a)
    return ts[0]


_register_grad(OpDef(
    "CrossEntropyLossGrad", 2, 2, _cross_entropy_grad, _cross_entropy_grad_ref,
    doc="d loss / d logits [M,V] = (softmax(logits) * rowsum(labels) - labels) / M; equals "
        "(softmax - labels) / M for one-hot rows and is 0 on an all-zero label row. Inputs "
        "[logits, labels]; a loss seed other than 1 is applied by a Mul after it",
))


# --- adjoints of broadcasting and slicing ---------------------------------------------------


def _sum_rows(ts, a):
    _f32(ts[0], "input")
    _need(ts[0].rank == 2, f"input must be 2-D, got {ts[0]}")
    return TensorType((ts[0].shape[1],))


_register_grad(OpDef("SumRows", 1, 1, _sum_rows, lambda xs, a: xs[0].sum(axis=0),
                     doc="out[j] = sum_i x[i,j], [M,N] -> [N]: the bias gradient (seed: SumRows)"))


def _broadcasts_to(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(small, big)) == tuple(big)
    except ValueError:
        return False


def _reduce_to(ts, a):
    shape = tuple(a["shape"])
    _f32(ts[0], "input")
    _need(all(d >= 1 for d in shape), f"target shape {list(shape)} has a dimension < 1")
    _need(_broadcasts_to(shape, ts[0].shape), f"{list(shape)} does not broadcast to {ts[0]}")
    return TensorType(shape)


def _reduce_to_ref(xs, a):
    x, shape = xs[0], tuple(a["shape"])
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


_register_grad(OpDef("ReduceTo", 1, 1, _reduce_to, _reduce_to_ref, attrs=("shape",),
                     doc="sum x over the axes numpy broadcasting added or stretched to reach x's shape "
                         "from ``shape``: the adjoint of broadcasting (gradient of a broadcast Add/Mul "
                         "operand)"))


def _broadcast_to(ts, a):
    shape = tuple(a["shape"])
    _f32(ts[0], "input")
    _need(all(d >= 1 for d in shape), f"target shape {list(shape)} has a dimension < 1")
    _need(_broadcasts_to(ts[0].shape, shape), f"{ts[0]} does not broadcast to {list(shape)}")
    return TensorType(shape)


_register_grad(OpDef("BroadcastTo", 1, 1, _broadcast_to,
                     lambda xs, a: np.broadcast_to(xs[0], tuple(a["shape"])).copy(), attrs=("shape",),
                     doc="numpy broadcast_to(x, shape): the adjoint of ReduceTo (gradient of SumAll, MeanAll)"))


def _pad_cols(ts, a):
    x, start, width = ts[0], a["start"], a["width"]
    _f32(x, "input")
    _need(x.rank == 2, f"input must be 2-D, got {x}")
    _need(start >= 0 and start + x.shape[1] <= width,
          f"columns [{start}, {start + x.shape[1]}) do not fit a width of {width}")
    return TensorType((x.shape[0], width))


def _pad_cols_ref(xs, a):
    x, start = xs[0], a["start"]
    out = np.zeros((x.shape[0], a["width"]))
    out[:, start:start + x.shape[1]] = x
    return out


_register_grad(OpDef("PadCols", 1, 1, _pad_cols, _pad_cols_ref, attrs=("start", "width"),
                     doc="out[i, start + j] = x[i, j], zero elsewhere, [M,n] -> [M,width]: the adjoint "
                         "of SliceCols"))


# --- elementwise gradients: (dy, x) -> dy * f'(x) ------------------------------------------


def _dsilu(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _dgelu_tanh(x):
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


#: f'(x) of each unary op with a gradient op ``<name>Grad``; Neg's gradient is Neg(dy).
UNARY_DERIVATIVES = {
    "Relu": (lambda x: (x > 0).astype(np.float64), "1 if x > 0 else 0 (0 at x = 0, as PyTorch)"),
    "Sigmoid": (lambda x: _sigmoid(x) * (1.0 - _sigmoid(x)), "s(1 - s), s = sigmoid(x)"),
    "Tanh": (lambda x: 1.0 - np.tanh(x) ** 2, "1 - tanh(x)^2"),
    "Gelu": (lambda x: 0.5 * erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
             "Phi(x) + x phi(x), Phi/phi the normal cdf/pdf (Hendrycks & Gimpel 2016)"),
    "GeluTanh": (_dgelu_tanh, "0.5(1 + t) + 0.5 x (1 - t^2) c (1 + 3*0.044715 x^2), "
                              "t = tanh(c (x + 0.044715 x^3)), c = sqrt(2/pi)"),
    "Silu": (_dsilu, "s (1 + x (1 - s)), s = sigmoid(x) (seed: SiluGrad)"),
}

for _name, (_fn, _formula) in UNARY_DERIVATIVES.items():
    _register_grad(OpDef(f"{_name}Grad", 2, 2, lambda ts, a: _like(ts, "x", 1),
                         (lambda f: lambda xs, a: xs[0] * f(xs[1]))(_fn),
                         doc=f"dx = dy * {_name}'(x), {_name}'(x) = {_formula}; inputs [dy, x]"))


# --- SwiGLU, SwiGLUConcat -----------------------------------------------------------------


def _swiglu_grad_gate(ts, a):
    _like(ts, "up", 2)
    return _like(ts, "gate", 1)


_register_grad(OpDef("SwiGLUGradGate", 3, 3, _swiglu_grad_gate,
                     lambda xs, a: xs[0] * xs[2] * _dsilu(xs[1]),
                     doc="d gate = dy * up * silu'(gate); inputs [dy, gate, up] (seed: SwiGLUGradGate)"))
_register_grad(OpDef("SwiGLUGradUp", 2, 2, lambda ts, a: _like(ts, "gate", 1),
                     lambda xs, a: xs[0] * xs[1] * _sigmoid(xs[1]),
                     doc="d up = dy * silu(gate); inputs [dy, gate] (seed: SwiGLUGradUp)"))


def _swiglu_concat_grad(ts, a):
    dy, x = ts
    _f32(dy, "dy")
    _f32(x, "input")
    _need(x.rank == 2 and dy.shape == (x.shape[0], x.shape[1] // 2) and x.shape[1] % 2 == 0,
          f"needs dy [M,N] and input [M,2N], got dy {dy} and input {x}")
    return x


def _swiglu_concat_grad_ref(xs, a):
    dy, x = xs
    n = dy.shape[1]
    gate, up = x[:, :n], x[:, n:]
    return np.concatenate([dy * up * _dsilu(gate), dy * gate * _sigmoid(gate)], axis=1)


_register_grad(OpDef("SwiGLUConcatGrad", 2, 2, _swiglu_concat_grad, _swiglu_concat_grad_ref,
                     doc="[dy * up * silu'(gate), dy * silu(gate)] with gate = x[:, :N], up = x[:, N:]; "
                         "inputs [dy [M,N], x [M,2N]] -> [M,2N] (seed: SwiGLUConcatGrad)"))


# --- Softmax ---------------------------------------------------------------------------


def _softmax_grad_ref(xs, a):
    dy, y = xs
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


_register_grad(OpDef("SoftmaxGrad", 2, 2, lambda ts, a: _like(ts, "y", 1), _softmax_grad_ref,
                     doc="dx = y * (dy - sum_j dy[.,j] y[.,j]) over the last axis; inputs [dy, y] with y "
                         "the Softmax output (Jacobian y_i (delta_ij - y_j))"))


# --- LayerNorm, RmsNorm ------------------------------------------------------------------


def _norm_grad_x(ts, a):
    _like(ts, "x", 1)
    x, w = ts[1], ts[2]
    _need(x.rank == 2 and w.shape == (x.shape[1],), f"needs x [M,N] and weight [N], got x {x}, weight {w}")
    return x


def _norm_grad_w(ts, a):
    x = _like(ts, "x", 1)
    _need(x.rank == 2, f"x must be 2-D, got {x}")
    return TensorType((x.shape[1],))


def _layer_norm_parts(x, eps):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mu) * rstd, rstd


def _layer_norm_grad_x_ref(xs, a):
    dy, x, w = xs
    xhat, rstd = _layer_norm_parts(x, a["eps"])
    g = dy * w
    return rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))


_register_grad(OpDef("LayerNormGradX", 3, 3, _norm_grad_x, _layer_norm_grad_x_ref, attrs=("eps",),
                     doc="dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w, xhat = (x - mean) rstd, "
                         "rstd = 1/sqrt(var + eps), means over the row; inputs [dy, x, w] (seed: "
                         "LayerNormGradX)"))
_register_grad(OpDef("LayerNormGradW", 2, 2, _norm_grad_w,
                     lambda xs, a: (xs[0] * _layer_norm_parts(xs[1], a["eps"])[0]).sum(axis=0), attrs=("eps",),
                     doc="dw[j] = sum_i dy[i,j] xhat[i,j]; inputs [dy, x] -> [N]. The seed's LayerNormGradWB "
                         "split in two: the bias gradient is SumRows(dy)"))


def _rms_rstd(x, eps):
    return 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _rms_norm_grad_x_ref(xs, a):
    dy, x, w = xs
    r = _rms_rstd(x, a["eps"])
    g = dy * w
    return r * (g - x * r * r * (g * x).mean(axis=-1, keepdims=True))


_register_grad(OpDef("RmsNormGradX", 3, 3, _norm_grad_x, _rms_norm_grad_x_ref, attrs=("eps",),
                     doc="dx[i,j] = r_i (dy[i,j] w[j] - x[i,j] s_i), s_i = r_i^2 mean_j(dy w x)[i], "
                         "r_i = 1/sqrt(mean_j x[i,j]^2 + eps); inputs [dy, x, w] (seed: RmsNormGradX)"))
_register_grad(OpDef("RmsNormGradW", 2, 2, _norm_grad_w,
                     lambda xs, a: (xs[0] * xs[1] * _rms_rstd(xs[1], a["eps"])).sum(axis=0), attrs=("eps",),
                     doc="dw[j] = sum_i dy[i,j] x[i,j] r_i; inputs [dy, x] -> [N] (seed: RmsNormGradW, "
                         "which also takes w only for its shape)"))


# --- GroupNorm ---------------------------------------------------------------------------


def _group_norm_grad(ts, a):
    x = _like(ts, "x", 1)
    _need(x.rank == 3, f"x must be [N, C, S], got {x}")
    c, g = x.shape[1], a["num_groups"]
    _need(g >= 1 and c % g == 0, f"{c} channels do not split into {g} groups")
    if len(ts) == 3:
        _need(ts[2].shape == (c,), f"weight must be [{c}], got {ts[2]}")
        return x
    return TensorType((c,))


def _group_norm_xhat(x, a):
    g = x.reshape(x.shape[0], a["num_groups"], -1)
    mu = g.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((g - mu) ** 2).mean(-1, keepdims=True) + a["eps"])
    return (g - mu) * rstd, rstd


def _group_norm_grad_input_ref(xs, a):
    dy, x, w = xs
    xhat, rstd = _group_norm_xhat(x, a)
    g = (dy * w[None, :, None]).reshape(xhat.shape)
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx.reshape(x.shape)


_register_grad(OpDef("GroupNormGradInput", 3, 3, _group_norm_grad, _group_norm_grad_input_ref,
                     attrs=("num_groups", "eps"),
                     doc="LayerNormGradX per (sample, group) over its C/G channels x S positions, with "
                         "g = dy * w[c]; inputs [dy, x, w], x [N, C, S] (seed: GroupNormGradInput)"))
_register_grad(OpDef("GroupNormGradWeight", 2, 2, _group_norm_grad,
                     lambda xs, a: (xs[0] * _group_norm_xhat(xs[1], a)[0].reshape(xs[1].shape)).sum(axis=(0, 2)),
                     attrs=("num_groups", "eps"),
                     doc="dw[c] = sum_{n,s} dy[n,c,s] xhat[n,c,s]; inputs [dy, x] -> [C]. The seed's "
                         "GroupNormGradWeightBias split in two: the bias gradient is ReduceTo(dy, [C,1])"))


# --- Embedding -------------------------------------------------------------------------


def _scatter_add(ts, a):
    idx, src = ts
    _need(idx.dtype is U32 and idx.rank == 1, f"indices must be u32 1-D, got {idx}")
    _need(src.dtype is F32 and src.rank == 2 and src.shape[0] == idx.shape[0],
          f"src must be f32 [{idx.shape[0]}, H], got {src}")
    _need(a["vocab_size"] >= 1, f"vocab_size must be >= 1, got {a['vocab_size']}")
    return TensorType((a["vocab_size"], src.shape[1]))


def _scatter_add_ref(xs, a):
    idx, src = xs
    bad = idx >= a["vocab_size"]
    if bad.any():
        from .errors import InputError

        raise InputError(f"ScatterAdd: index {int(idx[bad][0])} out of range for {a['vocab_size']} rows")
    out = np.zeros((a["vocab_size"], src.shape[1]))
    np.add.at(out, idx.astype(np.int64), src)
    return out


_register_grad(OpDef("ScatterAdd", 2, 2, _scatter_add, _scatter_add_ref, attrs=("vocab_size",),
                     doc="out[v] = sum over t with indices[t] = v of src[t]; inputs [indices u32 [T], "
                         "src [T,H]] -> [vocab_size, H]: the Embedding table gradient (seed: ScatterAdd)"))


# --- RoPE ------------------------------------------------------------------------------


def _rope_grad_ref(xs, a):
    dy = xs[0]
    hd = a["head_dim"]
    seq = dy.shape[0] // a["batch"]
    pos = (np.arange(dy.shape[0]) % seq + a["pos_offset"])[:, None].astype(np.float64)
    ang = pos * (a["theta"] ** (-2.0 * np.arange(hd // 2) / hd))[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    first, second = rope_pairs(hd, a["pairing"])
    out = dy.copy()
    for h in range(dy.shape[1] // hd):
        i0, i1 = h * hd + first, h * hd + second
        dp, dq = dy[:, i0], dy[:, i1]
        out[:, i0] = dp * cos + dq * sin
        out[:, i1] = -dp * sin + dq * cos
    return out


_register_grad(OpDef("RoPEGrad", 1, 1, _rope, _rope_grad_ref,
                     attrs=("theta", "head_dim", "pos_offset", "pairing", "batch"),
                     defaults={"pos_offset": 0, "pairing": "half", "batch": 1},
                     doc="dx = R(pos)^T dy: each pair rotated by -angle, the inverse of RoPE with the same "
                         "attributes (the rotation is orthogonal); inputs [dy] (seed: RoPEGrad)"))


# --- attention -------------------------------------------------------------------------


def attention_grads(do, q, k, v, a, causal: bool, key_mask=None):
    """(dq, dk, dv) of :func:`ops.attention_reference`, probabilities recomputed.

    Per sequence and head, with P = softmax(mask(scale q k^T)): dV = P^T dO,
    dS = P * (dO V^T - rowsum(P * dO V^T)) zeroed at masked scores (they are constants),
    dQ = scale dS K, dK = scale dS^T Q. A kv head's dK and dV sum over the query heads of
    its GQA group (FlashAttention-2 backward, Dao 2023, Algorithm 2, without tiling).
    """
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    seq = q.shape[0] // batch
    group = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(batch):
        rows = slice(b * seq, (b + 1) * seq)
        for h in range(nh):
            qc, kc = slice(h * hd, (h + 1) * hd), slice((h // group) * hd, (h // group + 1) * hd)
            qh, kh, vh, doh = q[rows, qc], k[rows, kc], v[rows, kc], do[rows, qc]
            keep = np.ones((seq, seq), dtype=bool)
            if causal:
                keep &= np.tril(keep)
            if key_mask is not None:
                keep &= (key_mask[b] > 0)[None, :]
            s = np.where(keep, (qh @ kh.T) * scale, -1.0e30)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            dp = doh @ vh.T
            ds = np.where(keep, p * (dp - (p * dp).sum(axis=-1, keepdims=True)), 0.0)
            dv[rows, kc] += p.T @ doh
            dq[rows, qc] = scale * ds @ kh
            dk[rows, kc] += scale * ds.T @ qh
    return dq, dk, dv


def _attention_grad(index: int):
    def infer(ts, a):
        _need(isinstance(a["causal"], bool), f"causal must be a bool, got {a['causal']!r}")
        _need(not (a["causal"] and len(ts) == 5), "a key_mask is only taken with causal=False")
        out = _attention(ts[1:], a)
        _f32(ts[0], "dO")
        _need(ts[0] == out, f"dO must be {out}, got {ts[0]}")
        return ts[1 + index]

    def reference(xs, a):
        mask = xs[4] if len(xs) == 5 else None
        return attention_grads(xs[0], xs[1], xs[2], xs[3], a, a["causal"], mask)[index]

    return infer, reference


for _i, _part in enumerate("QKV"):
    _infer, _ref = _attention_grad(_i)
    _register_grad(OpDef(
        f"AttentionGrad{_part}", 4, 5, _infer, _ref,
        attrs=("causal", "num_heads", "num_kv_heads", "head_dim", "batch"), defaults={"batch": 1},
        doc=f"d{_part.lower()} of FullAttention (causal=False, optional key_mask) or CausalAttention; "
            f"inputs [dO, q, k, v(, key_mask)], see attention_grads (seed: MultiHeadAttnGrad{_part})",
    ))


__all__ = ["GRAD_OPS", "UNARY_DERIVATIVES", "attention_grads"]
