"""Optimiser updates: ops that update a parameter or its optimiser state in place.

Each op's value is the new contents of the input it ``writes``; lowering gives it that
input's buffer, so a training step updates parameters on the device without copies.
SGD with momentum follows PyTorch's ``torch.optim.SGD`` (dampening 0); Adam follows
Kingma & Ba 2015 (Algorithm 1, bias-corrected) with decoupled weight decay as in AdamW
(Loshchilov & Hutter 2019).
"""

from __future__ import annotations

import numpy as np

from .ops import OpDef, _f32, _need, register
from .types import DType, TensorType


def _same_as_first(ts, a):
    for t, what in zip(ts, ("param", "grad", "param"), strict=False):
        _f32(t, what)
    _need(all(t.shape == ts[0].shape for t in ts[1:]), f"shapes differ: {', '.join(map(str, ts))}")
    return ts[0]


register(OpDef(
    "SgdUpdate", 2, 2, _same_as_first,
    lambda xs, a: xs[0] - a["lr"] * (xs[1] + a["weight_decay"] * xs[0]),
    attrs=("lr", "weight_decay"), defaults={"weight_decay": 0.0}, writes=0,
    doc="param <- param - lr * (step + weight_decay * param); inputs [param, step] where step is the "
        "gradient (plain SGD) or the momentum buffer (see SgdMomentum)",
))
register(OpDef(
    "SgdMomentum", 3, 3, _same_as_first,
    lambda xs, a: a["momentum"] * xs[0] + xs[1],
    attrs=("momentum",), writes=0,
    doc="velocity <- momentum * velocity + grad; inputs [velocity, grad, param] (param only orders "
        "the update after the step that reads it); torch.optim.SGD with dampening 0",
))


def _moments(ts, a):
    mv, g = ts[0], ts[1]
    _f32(mv, "moments")
    _f32(g, "grad")
    _need(mv.shape == (2, *g.shape), f"moments must be [2, {', '.join(map(str, g.shape))}], got {mv}")
    return mv


def _moments_ref(xs, a):
    mv, g = xs[0], xs[1]
    return np.stack([a["beta1"] * mv[0] + (1 - a["beta1"]) * g, a["beta2"] * mv[1] + (1 - a["beta2"]) * g * g])


register(OpDef(
    "AdamMoments", 2, 2, _moments, _moments_ref, attrs=("beta1", "beta2"), writes=0,
    doc="moments[0] <- b1 m + (1 - b1) g, moments[1] <- b2 v + (1 - b2) g^2 (Kingma & Ba 2015, Alg. 1)",
))


def _adam_step(ts, a):
    p, mv, step = ts
    _f32(p, "param")
    _need(mv.shape == (2, *p.shape), f"moments must be [2, {', '.join(map(str, p.shape))}], got {mv}")
    _need(step.dtype is DType.U32 and step.shape == (1,), f"step must be u32[1] (t >= 1), got {step}")
    return TensorType(p.shape)


def _adam_step_ref(xs, a):
    p, mv, step = xs
    t = float(step[0])
    m_hat = mv[0] / (1 - a["beta1"] ** t)
    v_hat = mv[1] / (1 - a["beta2"] ** t)
    return p - a["lr"] * (m_hat / (np.sqrt(v_hat) + a["eps"]) + a["weight_decay"] * p)


register(OpDef(
    "AdamStep", 3, 3, _adam_step, _adam_step_ref, attrs=("lr", "beta1", "beta2", "eps", "weight_decay"),
    defaults={"weight_decay": 0.0}, writes=0,
    doc="param <- param - lr (m_hat / (sqrt(v_hat) + eps) + wd param), m_hat = m / (1 - b1^t), "
        "v_hat = v / (1 - b2^t); inputs [param, moments, step u32[1]] (AdamW when wd > 0)",
))
