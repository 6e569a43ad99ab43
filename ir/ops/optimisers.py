"""Optimiser updates: ops that update a parameter or its optimiser state in place.

Each op's value is the new contents of the input it ``writes``; lowering gives it that
input's buffer, so a training step updates parameters on the device without copies.
SGD with momentum follows PyTorch's ``torch.optim.SGD`` (dampening 0); Adam follows
Kingma & Ba 2015 (Algorithm 1, bias-corrected) with decoupled weight decay as in AdamW
(Loshchilov & Hutter 2019). No gradients: they are the end of a training step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType

FAMILY = "optimisers"

UPDATE = no_grad("it is an optimiser update, the end of a training step")


def _same_as_first(ts, a):
    for t, what in zip(ts, ("param", "grad", "param"), strict=False):
        need_f32(t, what)
    need(all(t.shape == ts[0].shape for t in ts[1:]), f"shapes differ: {', '.join(map(str, ts))}")
    return ts[0]


def _update_kernel(reads: tuple[tuple[str, str], ...], written: str, hyper: tuple[str, ...], update: str,
                   derived: Mapping[str, Callable[[dict], float]] | None = None):
    """Kernel builder of one update: optimizer.wgsl binding ``reads`` (name, element type) then the
    written input, with ``update`` (WGSL of element i) reading the hyperparameters ``hyper`` as p.NAME, and
    ``derived`` ones (name -> a function of the node's attributes, evaluated in float64 on the host: 1 - beta in
    float32 loses 1.3e-5 of 0.001 to the rounding of beta = 0.999) as p.NAME too."""

    def build(node, ins, target) -> Kernel:
        n = ins[1].num_elements if node.op == "AdamMoments" else node.type.num_elements
        params = (("n", "u32", n), *((h, "f32", node.attrs[h]) for h in hyper),
                  *((name, "f32", float(fn(node.attrs))) for name, fn in (derived or {}).items()))
        return Kernel(f"optimizer_{node.op}", "optimizer.wgsl", elementwise_groups(n), params=params,
                      slots={"UPDATE": update},
                      bindings=(*(Buffer(r, t) for r, t in reads), Buffer(written, write=True)))

    return build


op("SgdUpdate", ("param", "step"), _same_as_first,
   lambda xs, a: xs[0] - a["lr"] * (xs[1] + a["weight_decay"] * xs[0]),
   attrs=(Attr("lr", "float"), Attr("weight_decay", "float", 0.0)), writes=0, vjp=UPDATE,
   kernel=_update_kernel((("step", "f32"),), "param", ("lr", "weight_decay"),
                         "    param[i] = param[i] - p.lr * (step[i] + p.weight_decay * param[i]);"),
   flops=lambda ins, out, a: 3 * out.num_elements,
   doc="param <- param - lr * (step + weight_decay * param); inputs [param, step] where step is the gradient "
       "(plain SGD) or the momentum buffer (see SgdMomentum)")
op("SgdMomentum", ("velocity", "grad", "param"), _same_as_first, lambda xs, a: a["momentum"] * xs[0] + xs[1],
   attrs=(Attr("momentum", "float"),), writes=0, vjp=UPDATE,
   kernel=_update_kernel((("grad", "f32"), ("param", "f32")), "velocity", ("momentum",),
                         "    velocity[i] = p.momentum * velocity[i] + grad[i];"),
   flops=lambda ins, out, a: 2 * out.num_elements,
   doc="velocity <- momentum * velocity + grad; inputs [velocity, grad, param] (param only orders the update "
       "after the step that reads it); torch.optim.SGD with dampening 0")


def _moments(ts, a):
    mv, g = ts[0], ts[1]
    need_f32(mv, "moments")
    need_f32(g, "grad")
    need(mv.shape == (2, *g.shape), f"moments must be [2, {', '.join(map(str, g.shape))}], got {mv}")
    return mv


def _moments_ref(xs, a):
    mv, g = xs[0], xs[1]
    return np.stack([a["beta1"] * mv[0] + (1 - a["beta1"]) * g, a["beta2"] * mv[1] + (1 - a["beta2"]) * g * g])


op("AdamMoments", ("moments", "grad"), _moments, _moments_ref, attrs=(Attr("beta1", "float"), Attr("beta2", "float")),
   writes=0, vjp=UPDATE,
   kernel=_update_kernel((("grad", "f32"),), "moments", ("beta1", "beta2"),
                         "    let g = grad[i];\n"
                         "    moments[i] = p.beta1 * moments[i] + p.one_minus_beta1 * g;\n"
                         "    moments[p.n + i] = p.beta2 * moments[p.n + i] + p.one_minus_beta2 * g * g;",
                         {"one_minus_beta1": lambda a: 1.0 - a["beta1"],
                          "one_minus_beta2": lambda a: 1.0 - a["beta2"]}),
   flops=lambda ins, out, a: 6 * ins[1].num_elements,
   doc="moments[0] <- b1 m + (1 - b1) g, moments[1] <- b2 v + (1 - b2) g^2 (Kingma & Ba 2015, Alg. 1)")


#: WGSL of 1 - exp(x) for x <= 0 to float32's precision: its Taylor series to x^5 where x > -0.1 (the
#: truncation below 2e-8 of the value), 1 - exp(x) beyond (exp's rounding below 1e-6 of it)
_ONE_MINUS_EXP = ("select(1.0 - exp({x}), -{x} * (1.0 + {x} * (0.5 + {x} * (0.16666667 + {x} * (0.041666668 + {x} "
                  "* 0.008333334)))), {x} > -0.1)")


def _ln(beta: float) -> float:
    # log(beta) for 1 - beta^t, in float64; beta = 0 (allowed: no averaging) as -100, whose exp is 0 in float32
    return math.log(beta) if beta > 0 else -100.0


def _adam_step(ts, a):
    p, mv, step = ts
    need_f32(p, "param")
    need(mv.shape == (2, *p.shape), f"moments must be [2, {', '.join(map(str, p.shape))}], got {mv}")
    need(step.dtype is DType.U32 and step.shape == (1,), f"step must be u32[1] (t >= 1), got {step}")
    return TensorType(p.shape)


def _adam_step_ref(xs, a):
    p, mv, step = xs
    t = float(step[0])
    m_hat = mv[0] / (1 - a["beta1"] ** t)
    v_hat = mv[1] / (1 - a["beta2"] ** t)
    return p - a["lr"] * (m_hat / (np.sqrt(v_hat) + a["eps"]) + a["weight_decay"] * p)


op("AdamStep", ("param", "moments", "step"), _adam_step, _adam_step_ref,
   attrs=(Attr("lr", "float"), Attr("beta1", "float"), Attr("beta2", "float"), Attr("eps", "float"),
          Attr("weight_decay", "float", 0.0)), writes=0, vjp=UPDATE,
   kernel=_update_kernel((("moments", "f32"), ("step", "u32")), "param",
                         ("lr", "beta1", "beta2", "eps", "weight_decay"),
                         "    let t = f32(step[0]);\n"
                         # 1 - beta^t = -expm1(t ln beta): a series where t ln beta is small (1 - pow(beta, t) in
                         # float32 made the first step 6e-5 too long), 1 - exp above
                         "    let x1 = t * p.ln_beta1;\n"
                         "    let x2 = t * p.ln_beta2;\n"
                         f"    let c1 = {_ONE_MINUS_EXP.format(x='x1')};\n"
                         f"    let c2 = {_ONE_MINUS_EXP.format(x='x2')};\n"
                         "    let m_hat = moments[i] / c1;\n"
                         "    let v_hat = moments[p.n + i] / c2;\n"
                         "    param[i] = param[i] - p.lr * (m_hat / (sqrt(v_hat) + p.eps)\n"
                         "        + p.weight_decay * param[i]);",
                         {"ln_beta1": lambda a: _ln(a["beta1"]), "ln_beta2": lambda a: _ln(a["beta2"])}),
   flops=lambda ins, out, a: 10 * out.num_elements,
   doc="param <- param - lr (m_hat / (sqrt(v_hat) + eps) + wd param), m_hat = m / (1 - b1^t), v_hat = v / "
       "(1 - b2^t); inputs [param, moments, step u32[1]] (AdamW when wd > 0)")
