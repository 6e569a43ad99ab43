"""The optimiser ops of ``ai.onnx.preview.training``: Adagrad, Momentum (standard and Nesterov)
and Adam, one update of N tensors, as elementwise IR ops. Their formulas are the operator
pages' (https://onnx.ai/onnx/operators/onnx_aionnxpreviewtraining_Adagrad.html, ..._Momentum,
..._Adam), in the order onnx's reference evaluates them. The iteration count T must be known at
load time (the formulas branch on it; eggfuse.onnx.Model binds a fed T per value); the learning
rate R may be fed."""

from __future__ import annotations

import numpy as np

from ..importer import NodeContext, Value, converter

_DOMAIN = "ai.onnx.preview.training"


def _tensors(ctx: NodeContext, groups: int) -> tuple[int, int, list[list[int]]]:
    """(R, T, [X..., G..., ...]): the N tensors of each of ``groups`` groups after R and T."""
    n, rest = divmod(len(ctx.inputs) - 2, groups)
    if n < 1 or rest:
        raise ctx.fail(f"takes R, T and {groups} groups of N tensors; got {len(ctx.inputs)} inputs")
    t = int(np.asarray(ctx.const(1, "T")).reshape(-1)[0])
    return ctx.tensor(0), t, [[ctx.tensor(2 + g * n + i) for i in range(n)] for g in range(groups)]


def _k(ctx: NodeContext, value: float) -> int:
    return ctx.constant(np.float32(value))


def _regularised(ctx: NodeContext, x: int, g: int, norm: float) -> int:
    # norm_coefficient * x + g
    return ctx.add("Add", [ctx.add("Mul", [_k(ctx, norm), x]), g])


@converter(f"{_DOMAIN}.Adagrad")
def _adagrad(ctx: NodeContext) -> list[Value]:
    ctx.refuse_attrs(("decay_factor", "epsilon", "norm_coefficient"))
    r, t, (xs, gs, hs) = _tensors(ctx, 3)
    decay, eps, norm = (float(ctx.attr(a, d)) for a, d in (("decay_factor", 0.0), ("epsilon", 1e-6),
                                                            ("norm_coefficient", 0.0)))
    rate = ctx.add("Div", [r, _k(ctx, 1.0 + t * decay)])
    x_new, h_new = [], []
    for x, g, h in zip(xs, gs, hs, strict=True):
        gr = _regularised(ctx, x, g, norm)
        h2 = ctx.add("Add", [h, ctx.add("Mul", [gr, gr])])
        scale = ctx.add("Add", [ctx.add("Sqrt", [h2]), _k(ctx, eps)])
        x_new.append(ctx.out(ctx.add("Sub", [x, ctx.add("Div", [ctx.add("Mul", [rate, gr]), scale])])))
        h_new.append(ctx.out(h2))
    return x_new + h_new


@converter(f"{_DOMAIN}.Momentum")
def _momentum(ctx: NodeContext) -> list[Value]:
    ctx.refuse_attrs(("alpha", "beta", "mode", "norm_coefficient"))
    r, t, (xs, gs, vs) = _tensors(ctx, 3)
    if any(ctx.attr(a) is None for a in ("alpha", "beta", "mode", "norm_coefficient")):
        raise ctx.fail("attributes alpha, beta, mode and norm_coefficient are required")
    alpha, beta, norm = float(ctx.attr("alpha")), float(ctx.attr("beta")), float(ctx.attr("norm_coefficient"))
    mode = ctx.attr("mode")
    if mode not in ("standard", "nesterov"):
        raise ctx.fail(f"attribute mode={mode!r} is not 'standard' or 'nesterov'")
    beta = beta if t > 0 else 1.0  # the gradient's coefficient is 1 at the first iteration
    x_new, v_new = [], []
    for x, g, v in zip(xs, gs, vs, strict=True):
        gr = _regularised(ctx, x, g, norm)
        v2 = ctx.add("Add", [ctx.add("Mul", [_k(ctx, alpha), v]), ctx.add("Mul", [_k(ctx, beta), gr])])
        step = v2 if mode == "standard" else ctx.add("Add", [gr, ctx.add("Mul", [_k(ctx, alpha), v2])])
        x_new.append(ctx.out(ctx.add("Sub", [x, ctx.add("Mul", [r, step])])))
        v_new.append(ctx.out(v2))
    return x_new + v_new


@converter(f"{_DOMAIN}.Adam")
def _adam(ctx: NodeContext) -> list[Value]:
    ctx.refuse_attrs(("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"))
    r, t, (xs, gs, vs, hs) = _tensors(ctx, 4)
    alpha, beta, eps, norm, post = (float(ctx.attr(a, d)) for a, d in (
        ("alpha", 0.9), ("beta", 0.999), ("epsilon", 1e-6), ("norm_coefficient", 0.0),
        ("norm_coefficient_post", 0.0)))
    # bias correction of the moments from the second iteration on
    rate = ctx.add("Mul", [r, _k(ctx, np.sqrt(1.0 - beta**t) / (1.0 - alpha**t))]) if t > 0 else r
    x_new, v_new, h_new = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs, strict=True):
        gr = _regularised(ctx, x, g, norm)
        v2 = ctx.add("Add", [ctx.add("Mul", [_k(ctx, alpha), v]), ctx.add("Mul", [_k(ctx, 1.0 - alpha), gr])])
        h2 = ctx.add("Add", [ctx.add("Mul", [_k(ctx, beta), h]),
                             ctx.add("Mul", [_k(ctx, 1.0 - beta), ctx.add("Mul", [gr, gr])])])
        scale = ctx.add("Add", [ctx.add("Sqrt", [h2]), _k(ctx, eps)])
        x2 = ctx.add("Sub", [x, ctx.add("Mul", [rate, ctx.add("Div", [v2, scale])])])
        x_new.append(ctx.out(ctx.add("Mul", [_k(ctx, 1.0 - post), x2]) if post else x2))
        v_new.append(ctx.out(v2))
        h_new.append(ctx.out(h2))
    return x_new + v_new + h_new
