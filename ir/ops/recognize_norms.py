"""Recognition of LayerNorm and RmsNorm over the last axis, in the forms exporters write.

Three steps, each a small set of rules of the ``recognition`` ruleset (``recognize.py`` says
how the e-graph stays small):

1. the normalisation itself, without weight or bias, becomes ``RmsNorm(x)`` or
   ``LayerNorm(x)`` (eps bound from the constant added; a chain without one has eps 0):

   - RMS: ``x * Recip(Sqrt(ReduceMean(x^2) + eps))`` (HF LlamaRMSNorm, T5LayerNorm; the
     dynamo exporter's Reciprocal, the classic exporter's ``Div(1, Sqrt)``, a ``Pow(., -0.5)``
     and ``x / Sqrt(...)`` all reach this form through the canonical rules);
   - LayerNorm: ``d * Recip(Sqrt(ReduceMean(d^2) + eps))`` with ``d = x - ReduceMean(x)``
     (torch.onnx before opset 17, the dynamo exporter of a hand-written LayerNorm);

   with x^2 as ``Pow(x, 2)`` or ``Mul(x, x)`` and the product in either order;
2. the weight and the bias: ``Mul(RmsNorm(x), w) -> RmsNorm(x, w)``,
   ``Mul(LayerNorm(x), w) -> LayerNorm(x, w)``, ``Add(LayerNorm(x, w), b) -> LayerNorm(x, w, b)``
   (either operand order; w and b of shape [N], N the last axis of x);
3. ``FusedMatMul(Reshape(RmsNorm(x, w), s), W) -> FusedRmsNormMatMul(Reshape(x, s), w, W)``
   when s keeps the last axis: an exporter's matmul reads a 2-D view of the normalised
   [B, S, N] tensor, where the RmsNorm+MatMul fusion of ``matmul.py`` does not look.

Not recognised: eps added after the square root (``(x - mean) / (sqrt(var) + eps)``: another
function), statistics over other axes than the last, a weight or bias of another shape than
[N], and the E[x^2] - E[x]^2 form of the variance.
"""

from __future__ import annotations

from ..spec import example, rules
from .matmul_kernel import GEMV_MAX_ROWS
from .recognize import Pattern, recognise

FAMILY = "recognize_norms"


def _squares():
    # d^2 as Pow(d, 2) or Mul(d, d)
    return (lambda b, d: b.Pow(d, b.const(2.0)), lambda b, d: b.Mul(d, d))


def _normalised(centre: bool, square, with_eps: bool, d_first: bool):
    def build(b, x):
        d = b.Sub(x, b.mean_last(x)) if centre else x
        ms = b.mean_last(square(b, d))
        inv = b.Recip(b.Sqrt(b.Add(ms, b.epsilon()) if with_eps else ms))
        return b.Mul(d, inv) if d_first else b.Mul(inv, d)

    return build


def norm_patterns(centred: bool) -> list[tuple[Pattern, bool]]:
    """(variant, has eps) of the RMS (``centred`` False) or LayerNorm normalisation."""
    return [(Pattern(_normalised(centred, sq, with_eps, first)), with_eps) for sq in _squares()
            for with_eps in (True, False) for first in (True, False)]


@rules("recognition")
def _normalisations(e):
    for op, centred in (("RmsNorm", False), ("LayerNorm", True)):
        ctor = getattr(e, op)
        for p, with_eps in norm_patterns(centred):
            # x * Recip(Sqrt(mean(x^2) + eps)) -> RmsNorm(x, eps); (x - mean) * ... -> LayerNorm(x, eps)
            yield recognise(e, f"{op}(x)", p, (lambda c: lambda x, eps: c(x, eps=eps))(ctor) if with_eps else
                            (lambda c: lambda x, eps: c(x, eps=e.f64(0.0)))(ctor))


# --- weight and bias -----------------------------------------------------------------------------


def _affine_example(op: str, part: str, first: bool):
    """Mul(Norm(x), w) (``part`` "w") or Add(LayerNorm(x, w), b) (``part`` "b") over an x of rank 1 to
    3, the parameter first when ``first``."""

    def build(g, dim):
        x = g.input("x", [dim(f"d{i}") for i in range(dim("rank", 1, 3) - 1)] + [dim("n")])
        n = g.node(x).type.shape[-1]
        w = g.parameter("w", [n])
        if part == "w":
            y, p = g.add_node(op, [x], eps=1e-5), w
        else:
            y, p = g.add_node("LayerNorm", [x, w], eps=1e-5), g.parameter("b", [n])
        combine = g.mul if part == "w" else g.add
        g.set_outputs([combine(p, y) if first else combine(y, p)])

    return example(build)


@rules("recognition")
def _affine(e):
    x, w, b = e.vars("x w b")
    (eps,) = e.vars("eps", e.f64)
    sx, sw = e.vars("sx sw", e.Vec[e.i64])
    per_column = (e.eq(e.shape(x)).to(sx), e.eq(e.shape(w)).to(sw), e.eq(sw).to(e.Vec[e.i64](sx[sx.length() - 1])))
    for op, full in (("RmsNorm", e.RmsNorm(x, w, eps=eps)), ("LayerNorm", e.LayerNorm(x, w, eps=eps))):
        normed = getattr(e, op)(x, eps=eps)
        short = "LayerNorm(x, w)" if op == "LayerNorm" else "RmsNorm(x, w)"
        # Mul(Norm(x), w) -> Norm(x, w)   if w is [N], N the last axis of x
        yield e.equal(f"Mul({op}(x), w) -> {short}", e.Mul(normed, w), full, *per_column,
                      example=_affine_example(op, "w", False))
        # Mul(w, Norm(x)) -> Norm(x, w)   the same, operands swapped
        yield e.equal(f"Mul(w, {op}(x)) -> {short}", e.Mul(w, normed), full, *per_column,
                      example=_affine_example(op, "w", True))
    ln = e.LayerNorm(x, w, eps=eps)
    biased = (e.eq(e.shape(x)).to(sx), e.eq(e.shape(b)).to(sw), e.eq(sw).to(e.Vec[e.i64](sx[sx.length() - 1])))
    # Add(LayerNorm(x, w), b) -> LayerNorm(x, w, b)   if b is [N]
    yield e.equal("Add(LayerNorm(x, w), b) -> LayerNorm(x, w, b)", e.Add(ln, b), e.LayerNorm(x, w, b, eps=eps),
                  *biased, example=_affine_example("LayerNorm", "b", False))
    # Add(b, LayerNorm(x, w)) -> LayerNorm(x, w, b)   the same, operands swapped
    yield e.equal("Add(b, LayerNorm(x, w)) -> LayerNorm(x, w, b)", e.Add(b, ln), e.LayerNorm(x, w, b, eps=eps),
                  *biased, example=_affine_example("LayerNorm", "b", True))


# --- RmsNorm and LayerNorm under a reshape, before a matmul ----------------------------------------


def _viewed_norm(norm: str, variant: str):
    def build(g, dim):
        m, n, k = dim("m"), dim("n"), dim("k")
        x = g.input("x", [dim("b"), m, n])
        if norm == "RmsNorm":
            normed = g.rms_norm(x, g.parameter("w", [n]), eps=1e-6)
        else:
            normed = g.layer_norm(x, g.parameter("g", [n]), g.parameter("beta", [n]), eps=1e-5)
        mm = g.matmul_bt if variant == "BT" else g.matmul
        weight = g.parameter("W", [k, n] if variant == "BT" else [n, k])
        g.set_outputs([mm(g.reshape(normed, [dim("b") * m, n]), weight)])

    return example(build)


def _norm_matmul_through_reshape(e, norm):
    x, w, beta, wp = e.vars("x w beta wp")
    (ep,) = e.vars("e", e.Epi)
    (eps,) = e.vars("eps", e.f64)
    s, sx = e.vars("s sx", e.Vec[e.i64])
    view = e.Identity(x, shape=s)
    # FusedMatMul(Reshape(RmsNorm(x, w), s), W, e) -> FusedRmsNormMatMul(Reshape(x, s), w, W, e) and
    # FusedMatMul(Reshape(LayerNorm(x, g, b), s), W, e) -> FusedLayerNormMatMul(Reshape(x, s), g, b, W, e)   if s keeps
    # x's last axis: an exporter's projection reads a 2-D view of the normalised [B, S, N] tensor (the LayerNorm
    # prologue on more than GEMV_MAX_ROWS rows, as its plain rule: ir/ops/matmul.py). (The norm itself is not moved
    # under the view: that alternative tripled the ILP extraction's time.)
    normed, args, weights, fused, guards = {
        "RmsNorm": (e.RmsNorm(x, w, eps=eps), "(x, w)", "w", lambda v: e.FusedRmsNormMatMul(
            view, w, wp, eps=eps, variant=v, epilogue=ep), ()),
        "LayerNorm": (e.LayerNorm(x, w, beta, eps=eps), "(x, g, b)", "g, b", lambda v: e.FusedLayerNormMatMul(
            view, w, beta, wp, eps=eps, variant=v, epilogue=ep), (s[0] > e.i64(GEMV_MAX_ROWS),))}[norm]
    for v in ("", "BT"):
        lhs = e.FusedMatMul(e.Identity(normed, shape=s), wp, variant=v, epilogue=ep)
        yield e.rule(lhs, e.eq(e.shape(x)).to(sx), e.eq(s[s.length() - 1]).to(sx[sx.length() - 1]), *guards,
                     name=f"FusedMatMul{v}(Reshape({norm}{args}, s), W, e) -> Fused{norm}MatMul{v}(Reshape(x, s), "
                          f"{weights}, W, e)", example=_viewed_norm(norm, v)).then(
            e.union(lhs).with_(fused(v)), e.set_(e.shape(view)).to(s))


@rules("recognition")
def _rms_norm_matmul_through_reshape(e):
    yield from _norm_matmul_through_reshape(e, "RmsNorm")


@rules("layer_norm_prologue")
def _layer_norm_matmul_through_reshape(e):
    # optional (rewrites/rulesets.py OPTIONAL): the prologue measured slower than the norm and the product apart
    yield from _norm_matmul_through_reshape(e, "LayerNorm")

__all__ = ["FAMILY", "norm_patterns"]
