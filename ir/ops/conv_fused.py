"""Convolutions with an epilogue: FusedConv and FusedConvBn, the Conv of ``conv.py`` with a chain
of steps applied to each output at its store, and the rules (``conv_epilogue``) that introduce
them. They are what onnxruntime's FusedConv and its Conv + BatchNormalization folding do, as
equalities in the e-graph: the unfused terms stay in their e-classes and extraction decides.

- ``FusedConv(x, w, *operands)`` = epilogue(Conv(x, w)): the chain is the matmul family's
  (``Epi`` terms, ``rewrites/sorts.py``): ``bias`` (an operand of M values, [M] or [1, M, 1, ...],
  one per output channel), ``add`` (an operand of the output's shape: a residual) and the unary
  ops that may be an epilogue step (Relu, Sigmoid, HardSwish, ...).
- ``FusedConvBn(x, w, scale, bias, mean, var, *operands)`` = epilogue(BatchNormalization(Conv(x,
  w))): inference batch norm with the given statistics, (v - mean[o]) / sqrt(var[o] + epsilon) *
  scale[o] + bias[o] per output channel o, computed as the BatchNormalization kernel computes it
  (``shaders/batch_norm.wgsl``), then the chain.

Both run on the Conv kernels (``conv.conv_kernel``): the direct loop, the implicit GEMM or, for
a 1x1 convolution of one image, the matmul kernel, with the chain as WGSL lines at the store.
A kernel binds at most 8 storage buffers (WebGPU's default maxStorageBuffersPerShaderStage): x,
w and the output leave 5 for operands, so the rules fold a bias only into an empty chain and one
residual add per chain (``epilogue_without_add``): FusedConvBn holds at most 4 + 1 operands,
FusedConv 1 + 1.
"""

from __future__ import annotations

import numpy as np

from ..spec import Attr, example, need, need_f32, op, rules
from ..types import DType, TensorType
from .conv import _ATTRS, _INFERENCE, _conv, _conv_flops, _conv_ref, conv_kernel
from .elementwise import UNARY_BY_NAME
from .fused import wgsl_literal
from .fused_epilogue import apply_expr, check_expr, epilogue_ops, expr_lines, expr_operands, is_expr, step_label
from .matmul_kernel import EPILOGUE_BINARY

FAMILY = "conv"

_BN_INPUTS = ("scale", "bias", "mean", "var")


def _check_chain(out: TensorType, epilogue, operands: list[TensorType]) -> None:
    """ShapeError unless every binary step has an operand of its shape (bias: M values, add: the
    output's shape) and every other step is a unary op that may be an epilogue step."""
    m = out.shape[1]
    extra = list(operands)
    for step in epilogue:
        if is_expr(step):
            k = expr_operands(step)
            need(len(extra) >= k, f"epilogue step {step_label(step)} reads {k} operands, {len(extra)} are left")
            check_expr(step, out, extra[:k])
            del extra[:k]
        elif step in EPILOGUE_BINARY:
            need(bool(extra), f"epilogue step {step} has no operand")
            t = extra.pop(0)
            need_f32(t, f"the {step} operand")
            if step == "bias":
                need(t.shape in ((m,), (1, m, *(1,) * (out.rank - 2))),
                     f"a bias operand must hold one value per output channel, [{m}] or [1, {m}, 1, ...], got {t}")
            else:
                need(t.shape == out.shape, f"an add operand must be of the output's shape {out}, got {t}")
        else:
            need(step in UNARY_BY_NAME and UNARY_BY_NAME[step].epilogue,
                 f"epilogue step {step!r} is neither bias, add nor a unary op that may be an epilogue step "
                 f"(one without attributes: {', '.join(n for n, u in UNARY_BY_NAME.items() if u.epilogue)})")
    need(not extra, f"{len(extra)} epilogue operands left unused")


def _fused_conv(ts, a):
    out = _conv(ts[:2], a)
    _check_chain(out, a["epilogue"], ts[2:])
    return out


def _fused_conv_bn(ts, a):
    out = _conv(ts[:2], a)
    for t, what in zip(ts[2:6], _BN_INPUTS, strict=True):
        need_f32(t, what)
        need(t.shape == (out.shape[1],), f"{what} must be [{out.shape[1]}] (one per output channel), got {t}")
    _check_chain(out, a["epilogue"], ts[6:])
    return out


def _chain_ref(v, epilogue, operands):
    """``epilogue`` applied to a convolution's output ``v`` [N, M, ...] (reference semantics)."""
    operands = list(operands)
    per_channel = (1, -1) + (1,) * (v.ndim - 2)
    for step in epilogue:
        if is_expr(step):
            k = expr_operands(step)
            v = apply_expr(step, v, operands[:k])
            del operands[:k]
        elif step == "bias":
            v = v + operands.pop(0).reshape(per_channel)
        elif step == "add":
            v = v + operands.pop(0)
        else:
            v = UNARY_BY_NAME[step].fn(v)
    return v


def _bn_ref(v, scale, bias, mean, var, eps):
    r = (1, -1) + (1,) * (v.ndim - 2)
    return (v - mean.reshape(r)) / np.sqrt(var.reshape(r) + eps) * scale.reshape(r) + bias.reshape(r)


def _chain_wgsl(epilogue, first: int, out: TensorType, operands: list[TensorType]) -> list[str]:
    """The WGSL lines of a chain over ``v`` whose operands (of types ``operands``) bind from
    ``e<first>`` on (``{ch}`` the output channel, ``{at}`` the output index of ``out``:
    :func:`conv.conv_kernel`)."""
    lines, k = [], first
    for step in epilogue:
        if is_expr(step):
            n = expr_operands(step)
            lines += expr_lines(step, len(lines), out.shape, operands[k - first:k - first + n], k)
            k += n
        elif step in EPILOGUE_BINARY:
            lines.append(f"    v = v + e{k}[{{{'ch' if step == 'bias' else 'at'}}}];  // {step}")
            k += 1
        else:
            lines.append(f"    v = {UNARY_BY_NAME[step].wgsl.format(x='v')};")
    return lines


def _fused_conv_kernel(node, ins, target):
    return conv_kernel(node, ins, tuple(_chain_wgsl(node.attrs["epilogue"], 0, node.type, ins[2:])), target)


def _fused_conv_bn_kernel(node, ins, target):
    eps = wgsl_literal(node.attrs["epsilon"], DType.F32)
    bn = f"    v = (v - e2[{{ch}}]) / sqrt(e3[{{ch}}] + {eps}) * e0[{{ch}}] + e1[{{ch}}];  // the batch norm"
    return conv_kernel(node, ins, (bn, *_chain_wgsl(node.attrs["epilogue"], 4, node.type, ins[6:])), target)


def _chain_flops(ins, out, a):
    return _conv_flops(ins, out, a) + out.num_elements * epilogue_ops(a["epilogue"])


op("FusedConv", ("x", "w", "*operands"), _fused_conv,
   lambda xs, a: _chain_ref(_conv_ref(xs[:2], a), a["epilogue"], xs[2:]),
   attrs=(*_ATTRS, Attr("epilogue", "epilogue", ())), vjp=_INFERENCE, kernel=_fused_conv_kernel,
   flops=_chain_flops,
   doc="epilogue(Conv(x, w)): the ONNX Conv of conv.py (X [N, C, ...], W [M, C/group, k...] -> [N, M, ...]) with "
       "a chain of steps applied in order at the store: bias (M values, one per output channel), add (a tensor of "
       "the output's shape) or a unary op name; inputs [x, w, *operands]; onnxruntime's FusedConv generalised")

op("FusedConvBn", ("x", "w", "scale", "bias", "mean", "var", "*operands"), _fused_conv_bn,
   lambda xs, a: _chain_ref(_bn_ref(_conv_ref(xs[:2], a), *xs[2:6], a["epsilon"]), a["epilogue"], xs[6:]),
   attrs=(*_ATTRS, Attr("epsilon", "float", 1e-5, minimum=0.0), Attr("epilogue", "epilogue", ())), vjp=_INFERENCE,
   kernel=_fused_conv_bn_kernel, flops=lambda ins, out, a: _chain_flops(ins, out, a) + 5 * out.num_elements,
   doc="epilogue(BatchNormalization(Conv(x, w))): the convolution, then (v - mean[o]) / sqrt(var[o] + epsilon) * "
       "scale[o] + bias[o] per output channel o (inference batch norm; Ioffe & Szegedy 2015), then the chain as "
       "FusedConv's; inputs [x, w, scale, bias, mean, var, *operands], the four statistics [M]")


# --- the rules ------------------------------------------------------------------------------


def _conv_example(bias: bool = False, bn: bool = False, then=None):
    """A soundness example: a 3x3 convolution (odd sizes drawn, stride 2 along H, padding 1,
    dilation 2 along W, 1 or 2 groups) of x, with bias or batch norm, then ``then(g, conv, out
    shape)`` building the graph's output."""

    def build(g, dim):
        grp = dim("groups", 1, 2)
        n, c, m, h, wd = dim("n", 1, 2), grp * dim("c", 1, 3), grp * dim("m", 1, 3), dim("h"), dim("w", 3)
        x = g.input("x", [n, c, h, wd])
        w = g.parameter("w", [m, c // grp, 3, 3])
        ins = (x, w, g.parameter("b", [m])) if bias else (x, w)
        y = g.add_node("Conv", ins, strides=[2, 1], pads=[1, 1, 1, 1], dilations=[1, 2], group=grp)
        if bn:  # a positive variance: the statistics as a trained network holds them
            var = g.constant(np.linspace(0.5, 2.0, m), [m])
            y = g.add_node("BatchNormalization", (y, g.parameter("s", [m]), g.parameter("t", [m]),
                                                  g.parameter("mu", [m]), var), epsilon=1e-3)
        g.set_outputs([then(g, y, list(g.node(y).type.shape)) if then else y])

    return example(build)


def _conv_terms(e):
    """Pattern variables and the FusedConv / FusedConvBn terms over them (chain ``ep``)."""
    x, w, s, b, mu, var = e.vars("conv_x conv_w bn_scale bn_bias bn_mean bn_var")
    st, pd, dl = e.vars("conv_strides conv_pads conv_dilations", e.Vec[e.i64])
    (grp,) = e.vars("conv_group", e.i64)
    (eps,) = e.vars("bn_eps", e.f64)
    at = dict(strides=st, pads=pd, dilations=dl, group=grp)
    return x, w, at, {"FusedConv": lambda ep: e.FusedConv(x, w, **at, epilogue=ep),
                      "FusedConvBn": lambda ep: e.FusedConvBn(x, w, s, b, mu, var, **at, epsilon=eps, epilogue=ep)}


@rules("conv_epilogue")
def _conv_as_fused(e):
    x, w, at, fused = _conv_terms(e)
    (b,) = e.vars("bias")
    Epi = e.Epi
    # Conv(x,w) -> FusedConv(x,w,[])   (an empty chain, so the rules below chain)
    yield e.equal("Conv(x,w) -> FusedConv(x,w,[])", e.Conv(x, w, **at), fused["FusedConv"](Epi.none()),
                  example=_conv_example())
    # Conv(x,w,b) -> FusedConv(x,w,[bias b])
    yield e.equal("Conv(x,w,b) -> FusedConv(x,w,[bias b])", e.Conv(x, w, b, **at),
                  fused["FusedConv"](Epi.bias(Epi.none(), b)), example=_conv_example(bias=True))


@rules("conv_epilogue")
def _fold_batch_norm(e):
    x, w, at, fused = _conv_terms(e)
    s, b, mu, var = e.vars("bn_scale bn_bias bn_mean bn_var")
    (eps,) = e.vars("bn_eps", e.f64)
    # BatchNormalization(FusedConv(x,w,[]), s,b,mu,var) -> FusedConvBn(x,w,s,b,mu,var,[])
    # (a bias would come before the batch norm, which FusedConvBn does not hold)
    yield e.equal("BatchNormalization(FusedConv(x,w,[]),s,b,mu,var) -> FusedConvBn(x,w,s,b,mu,var,[])",
                  e.BatchNormalization(fused["FusedConv"](e.Epi.none()), s, b, mu, var, epsilon=eps),
                  e.FusedConvBn(x, w, s, b, mu, var, **at, epsilon=eps, epilogue=e.Epi.none()),
                  example=_conv_example(bn=True))


def _channel_bias(g, y, shape):
    return g.add(y, g.parameter("d", [1, shape[1], 1, 1]))


@rules("conv_epilogue")
def _fold_bias(e):
    x, w, at, fused = _conv_terms(e)
    y, d = e.vars("y d")
    (s,) = e.vars("s", e.Vec[e.i64])
    one = e.i64(1)
    # Add(FusedConv(x,w,[]), d[1,M,1,1]) -> FusedConv(x,w,[bias d]);  Add(d[1,M,1,1], FusedConv(x,w,[])) -> the same
    # (paddle2onnx writes a Conv's bias as such an Add; only into an empty chain: one bias, the bindings bounded)
    examples = {"Add(FusedConv(x,w,[]), d[1,M,1,1])": _conv_example(then=_channel_bias),
                "Add(d[1,M,1,1], FusedConv(x,w,[]))": _conv_example(
                    then=lambda g, y, shape: g.add(g.parameter("d", [1, shape[1], 1, 1]), y))}
    for label, add in (("Add(FusedConv(x,w,[]), d[1,M,1,1])", e.Add(y, d)),
                       ("Add(d[1,M,1,1], FusedConv(x,w,[]))", e.Add(d, y))):
        yield e.equal(f"{label} -> FusedConv(x,w,[bias d])", add, fused["FusedConv"](e.Epi.bias(e.Epi.none(), d)),
                      e.eq(y).to(fused["FusedConv"](e.Epi.none())), e.eq(e.shape(y)).to(s),
                      e.eq(s.length()).to(e.i64(4)), e.eq(e.shape(d)).to(e.Vec(one, s[1], one, one)),
                      example=examples[label])


@rules("conv_epilogue")
def _fold_add(e):
    x, w, at, fused = _conv_terms(e)
    y, d = e.vars("y d")
    (ep,) = e.vars("e", e.Epi)
    (s,) = e.vars("s", e.Vec[e.i64])
    # Add(F(x,w,e), d) -> F(x,w,e+[add d]);  Add(d, F(x,w,e)) -> the same   for F = FusedConv, FusedConvBn,
    # if shape(d) = shape(F(...)) and e has no add yet (one residual per chain)
    for op_name, term in fused.items():
        bn = op_name == "FusedConvBn"
        for label, add, then in ((f"Add({op_name}(x,w,e), d)", e.Add(y, d),
                                  lambda g, y, shape: g.add(y, g.input("d", shape))),
                                 (f"Add(d, {op_name}(x,w,e))", e.Add(d, y),
                                  lambda g, y, shape: g.add(g.input("d", shape), y))):
            yield e.equal(f"{label} -> {op_name}(x,w,e+[add d])", add, term(e.Epi.add(ep, d)),
                          e.eq(y).to(term(ep)), e.eq(e.shape(y)).to(s), e.eq(e.shape(d)).to(s),
                          e.epilogue_without_add(ep), example=_conv_example(bias=not bn, bn=bn, then=then))


@rules("conv_epilogue")
def _fold_unary(e):
    from ..spec import OPS

    x, w, at, fused = _conv_terms(e)
    (ep,) = e.vars("e", e.Epi)
    (last,) = e.vars("last", e.String)
    # U(F(x,w,e)) -> F(x,w,e+[U])   for F = FusedConv, FusedConvBn and every unary op that may be an
    # epilogue step, unless e ends with U already (Relu(Relu(x)) = Relu(x) would grow the chain forever) or
    # with a generated region, which U joins instead (epilogue_rules.py)
    for name in (n for n, spec in OPS.items() if spec.epilogue_step):
        for op_name, term in fused.items():
            bn = op_name == "FusedConvBn"
            yield e.equal(f"{name}({op_name}(x,w,e)) -> {op_name}(x,w,e+[{name}])", getattr(e, name)(term(ep)),
                          term(e.Epi.act(ep, name)), e.eq(e.last_step(ep)).to(last), e.ne(last).to(e.String(name)),
                          e.ne(last).to(e.String("ex")),
                          example=_conv_example(bias=not bn, bn=bn,
                                                then=(lambda u: lambda g, y, shape: g.add_node(u, (y,)))(name)))
