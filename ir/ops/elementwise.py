"""Elementwise ops: the unary table, BiasAdd, SwiGLU and their gradients.

A unary op is one :class:`Unary` row: its numpy function, its derivative, the WGSL of both
and whether a fused matmul may apply it at its store. Each row registers the op and, when it
has a derivative, its gradient op ``<Op>Grad`` (inputs ``dy, x``: the gradient reads the
forward input, so a matmul epilogue needs only its pre-activation values). References compute
in float64; the WGSL helpers named in the rows live in ``shaders/common.wgsl`` and
``shaders/derivatives.wgsl``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import erfc

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import NO_GRAD, example, need, need_f32, op, rules
from ..types import TensorType
from .broadcasting import broadcast_kernel, broadcast_strides  # noqa: F401  (broadcast_strides: BroadcastTo)

FAMILY = "elementwise"


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic


def gelu_erf(x):
    # 0.5 x (1 + erf(x / sqrt 2)) written with erfc, exact in float64 in the negative tail too
    # (1 + erf(x / sqrt 2) rounds to 0 below x = -8.3)
    return 0.5 * x * erfc(-x / math.sqrt(2.0))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def dsilu(x):
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _dgelu_tanh(x):
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def _log(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _recip(x):
    with np.errstate(divide="ignore"):
        return 1.0 / x


def same_f32(ts, a):
    need_f32(ts[0], "input")
    return ts[0]


def like(ts, what: str, index: int) -> TensorType:
    """Shape rule of a gradient op: every f32 input checked, dy (input 0) of input ``index``'s type."""
    for i, t in enumerate(ts):
        if t.dtype.value != "u32":
            need_f32(t, f"input {i}")
    need(ts[0] == ts[index], f"dy {ts[0]} must have the type of {what} {ts[index]}")
    return ts[index]


# --- the unary table ------------------------------------------------------------------------


@dataclass(frozen=True)
class Unary:
    """One unary elementwise op. ``fn`` / ``derivative`` are numpy (float64) functions;
    ``wgsl`` / ``wgsl_derivative`` WGSL expressions of ``{x}``; ``derivative`` None means the
    op has no ``<Op>Grad`` (its VJP is ``vjp``); ``epilogue``: a fused matmul may apply it."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]
    wgsl: str
    derivative: Callable[[np.ndarray], np.ndarray] | None
    wgsl_derivative: str | None
    doc: str
    derivative_doc: str = ""
    epilogue: bool = True


UNARY: tuple[Unary, ...] = (
    Unary("Relu", lambda x: np.maximum(x, 0.0), "max({x}, 0.0)",
          lambda x: (x > 0).astype(np.float64), "select(0.0, 1.0, {x} > 0.0)",
          "max(x, 0)", "1 if x > 0 else 0 (0 at x = 0, as PyTorch)"),
    Unary("Sigmoid", sigmoid, "sigmoid({x})", lambda x: sigmoid(x) * (1.0 - sigmoid(x)), "dsigmoid({x})",
          "1 / (1 + exp(-x))", "s(1 - s), s = sigmoid(x)"),
    Unary("Tanh", np.tanh, "tanh_clamped({x})", lambda x: 1.0 - np.tanh(x) ** 2, "dtanh({x})",
          "tanh(x)", "1 - tanh(x)^2"),
    Unary("Neg", np.negative, "-({x})", None, None, "-x (its gradient is Neg(dy))"),
    Unary("Gelu", gelu_erf, "gelu_erf({x})",
          lambda x: 0.5 * erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
          "dgelu_erf({x})", "GELU, erf form: x Phi(x) (Hendrycks & Gimpel 2016), as BERT uses",
          "Phi(x) + x phi(x), Phi/phi the normal cdf/pdf (Hendrycks & Gimpel 2016)"),
    Unary("GeluTanh", gelu_tanh, "gelu_tanh({x})", _dgelu_tanh, "dgelu_tanh({x})",
          "GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. 2), as GPT-2 uses",
          "0.5(1 + t) + 0.5 x (1 - t^2) c (1 + 3*0.044715 x^2), t = tanh(c (x + 0.044715 x^3)), c = sqrt(2/pi)"),
    Unary("Silu", lambda x: x * sigmoid(x), "silu({x})", dsilu, "dsilu({x})",
          "SiLU / swish x sigmoid(x) (Elfwing et al. 2018)", "s (1 + x (1 - s)), s = sigmoid(x) (seed: SiluGrad)"),
    Unary("Abs", np.abs, "abs({x})", np.sign, "sign({x})", "|x| (seed: Abs)",
          "sign(x), 0 at x = 0 (numpy sign, as PyTorch's abs backward)"),
    # WGSL leaves log(x <= 0) indeterminate, so the kernel selects the IEEE results itself, -inf
    # at 0 and a quiet NaN below, built with bitcast (WGSL has no infinity or NaN literals).
    Unary("Log", _log, "select(bitcast<f32>(select(0x7fc00000u, 0xff800000u, {x} == 0.0)), log({x}), {x} > 0.0)",
          lambda x: 1.0 / x, "1.0 / ({x})",
          "natural log; as numpy (IEEE 754 log): -inf at 0, NaN below 0 (seed: Log)", "1 / x"),
    # max(x, 0) + log1p(exp(-|x|)): exp never overflows, and the tail is exact for large |x|
    Unary("Softplus", lambda x: np.logaddexp(0.0, x), "softplus({x})", sigmoid, "sigmoid({x})",
          "log(1 + exp(x)) (Dugas et al. 2001; ONNX Softplus)", "sigmoid(x)"),
    # a plain IEEE division: +-inf at +-0 on every adapter we know, though WGSL does not promise it
    Unary("Recip", _recip, "1.0 / ({x})", lambda x: -1.0 / (x * x), "-1.0 / (({x}) * ({x}))",
          "1 / x; +-inf at +-0 as numpy (seed: Recip)", "-1 / x^2"),
)
UNARY_BY_NAME = {u.name: u for u in UNARY}


def _unary_kernel(node, ins, target) -> Kernel:
    n = node.type.num_elements
    return Kernel(f"unary_{node.op}", "unary.wgsl", elementwise_groups(n), params=(("n", "u32", n),),
                  slots={"EXPR": UNARY_BY_NAME[node.op].wgsl.format(x="v")})


def _unary_vjp(b, node, dy, want):
    return [b.emit(f"{node.op}Grad", (dy, node.inputs[0]))]


def _neg_vjp(b, node, dy, want):
    return [b.emit("Neg", (dy,))]


def elementwise_grad_kernel(node, ins, target, expr: str) -> Kernel:
    """elementwise_grad.wgsl computing ``expr`` of g = dy[i], v = x[i] (and up[i]) per element."""
    n = node.type.num_elements
    names = ("dy", "x", "up")[:len(ins)]
    return Kernel(f"grad_{node.op}", "elementwise_grad.wgsl", elementwise_groups(n), params=(("n", "u32", n),),
                  slots={"EXPR": expr}, bindings=(*(Buffer(m) for m in names), Buffer("out", write=True)))


def _grad_kernel(node, ins, target) -> Kernel:
    row = UNARY_BY_NAME[node.op.removesuffix("Grad")]
    return elementwise_grad_kernel(node, ins, target, f"g * ({row.wgsl_derivative.format(x='v')})")


for _u in UNARY:
    op(_u.name, ("x",), same_f32, (lambda f: lambda xs, a: f(xs[0]))(_u.fn), doc=_u.doc,
       vjp=_unary_vjp if _u.derivative else _neg_vjp, kernel=_unary_kernel, epilogue_step=_u.epilogue)
    if _u.derivative is not None:
        op(f"{_u.name}Grad", ("dy", "x"), lambda ts, a: like(ts, "x", 1),
           (lambda f: lambda xs, a: xs[0] * f(xs[1]))(_u.derivative),
           doc=f"dx = dy * {_u.name}'(x), {_u.name}'(x) = {_u.derivative_doc}; inputs [dy, x]",
           vjp=NO_GRAD, kernel=_grad_kernel)


def _xy(g, dim):
    return g.input("x", [dim("m"), dim("n")]), g.input("y", [dim("m"), dim("n")])


@rules("algebraic")
def _involutions(e):
    (x,) = e.vars("x")
    # Neg(Neg(x)) -> x
    yield e.equal("Neg(Neg(x)) -> x", e.Neg(e.Neg(x)), x,
                  example=example(lambda g, dim: g.set_outputs([g.neg(g.neg(_xy(g, dim)[0]))])))
    # Relu(Relu(x)) -> Relu(x)
    yield e.equal("Relu(Relu(x)) -> Relu(x)", e.Relu(e.Relu(x)), e.Relu(x),
                  example=example(lambda g, dim: g.set_outputs([g.relu(g.relu(_xy(g, dim)[0]))])))


@rules("swiglu")
def _silu(e):
    (x,) = e.vars("x")
    # Mul(x, Sigmoid(x)) -> Silu(x)
    yield e.equal("Mul(x, Sigmoid(x)) -> Silu(x)", e.Mul(x, e.Sigmoid(x)), e.Silu(x),
                  example=example(lambda g, dim: g.set_outputs([g.mul(x := _xy(g, dim)[0], g.sigmoid(x))])))
    # Mul(Sigmoid(x), x) -> Silu(x)
    yield e.equal("Mul(Sigmoid(x), x) -> Silu(x)", e.Mul(e.Sigmoid(x), x), e.Silu(x),
                  example=example(lambda g, dim: g.set_outputs([g.mul(g.sigmoid(x := _xy(g, dim)[0]), x)])))


# --- BiasAdd: the matmul epilogue's bias, on the broadcasting kernel ----------------------------
# (Add, Mul, Greater and the other broadcasting ops are the table of ir/ops/arithmetic.py)


def binary_kernel(expr: str) -> Callable:
    """The kernel builder of an f32 binary op on the broadcasting kernel (``ir/ops/broadcasting.py``):
    ``expr`` of ``av``, ``bv``; BiasAdd's bias is broadcast as ``[1, N]``."""

    def build(node, ins, target) -> Kernel:
        b_shape = ins[1].shape if node.op != "BiasAdd" else (1, ins[1].shape[-1])
        return broadcast_kernel(f"binary_{node.op}", expr, node.type.shape, [ins[0].shape, b_shape],
                                [t.dtype.wgsl for t in ins], node.type.dtype.wgsl)

    return build


def _bias_add(ts, a):
    x, b = ts
    need_f32(x, "input")
    need_f32(b, "bias")
    need(x.rank == 2, f"input must be 2-D, got {x}")
    n = x.shape[1]
    need(b.shape in ((n,), (1, n)), f"bias must be [{n}] or [1,{n}], got {b} for input {x}")
    return x


def bias_grad(b, dy, bias):
    """d bias of a [M,N] + [N] (or [1,N]) broadcast: SumRows(dy) in the bias's shape."""
    return b.reshape(b.emit("SumRows", (dy,)), b.type(bias).shape)


op("BiasAdd", ("x", "bias"), _bias_add, lambda xs, a: xs[0] + xs[1].reshape(1, -1),
   doc="out[i,j] = x[i,j] + bias[j]", vjp=lambda b, node, dy, want: [dy, bias_grad(b, dy, node.inputs[1])
                                                                    if want[1] else None],
   kernel=binary_kernel("av + bv"))


# --- SwiGLU and its packed form ----------------------------------------------------------------


def _swiglu(ts, a):
    g, u = ts
    need_f32(g, "gate")
    need(g == u, f"gate {g} and up {u} must have the same type")
    return g


def _swiglu_vjp(b, node, dy, want):
    gate, up = node.inputs
    return [b.emit("SwiGLUGradGate", (dy, gate, up)) if want[0] else None,
            b.emit("SwiGLUGradUp", (dy, gate)) if want[1] else None]


op("SwiGLU", ("gate", "up"), _swiglu, lambda xs, a: xs[0] * sigmoid(xs[0]) * xs[1],
   doc="silu(gate) * up (Shazeer 2020, GLU variants)", vjp=_swiglu_vjp, kernel=binary_kernel("silu(av) * bv"))


def _swiglu_grad_gate(ts, a):
    like(ts, "up", 2)
    return like(ts, "gate", 1)


op("SwiGLUGradGate", ("dy", "gate", "up"), _swiglu_grad_gate, lambda xs, a: xs[0] * xs[2] * dsilu(xs[1]),
   doc="d gate = dy * up * silu'(gate); inputs [dy, gate, up] (seed: SwiGLUGradGate)", vjp=NO_GRAD,
   kernel=lambda node, ins, target: elementwise_grad_kernel(node, ins, target, "g * up[i] * dsilu(v)"))
op("SwiGLUGradUp", ("dy", "gate"), lambda ts, a: like(ts, "gate", 1), lambda xs, a: xs[0] * xs[1] * sigmoid(xs[1]),
   doc="d up = dy * silu(gate); inputs [dy, gate] (seed: SwiGLUGradUp)", vjp=NO_GRAD,
   kernel=lambda node, ins, target: elementwise_grad_kernel(node, ins, target, "g * silu(v)"))


@rules("swiglu")
def _swiglu_rules(e):
    g, u = e.vars("g u")
    ex = example(lambda gr, dim: gr.set_outputs([gr.mul(gr.silu((xy := _xy(gr, dim))[0]), xy[1])]))
    # Mul(Silu(g), u) -> SwiGLU(g, u)   if shape(g) = shape(u) (a broadcasting Mul stays a Mul)
    yield e.equal("Mul(Silu(g), u) -> SwiGLU(g, u)", e.Mul(e.Silu(g), u), e.SwiGLU(g, u),
                  e.eq(e.shape(g)).to(e.shape(u)), example=ex)
    # Mul(u, Silu(g)) -> SwiGLU(g, u)   the same, operands swapped
    yield e.equal("Mul(u, Silu(g)) -> SwiGLU(g, u)", e.Mul(u, e.Silu(g)), e.SwiGLU(g, u),
                  e.eq(e.shape(g)).to(e.shape(u)),
                  example=example(lambda gr, dim: gr.set_outputs([gr.mul((xy := _xy(gr, dim))[1], gr.silu(xy[0]))])))


def _swiglu_concat(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank == 2 and x.shape[1] % 2 == 0, f"input must be [M, 2N], got {x}")
    return TensorType((x.shape[0], x.shape[1] // 2))


def _swiglu_concat_ref(xs, a):
    n = xs[0].shape[1] // 2
    return xs[0][:, :n] * sigmoid(xs[0][:, :n]) * xs[0][:, n:]


def _swiglu_concat_kernel(node, ins, target) -> Kernel:
    n = node.type.num_elements
    return Kernel("swiglu_concat", "swiglu_concat.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("half", "u32", node.type.shape[1])))


op("SwiGLUConcat", ("x",), _swiglu_concat, _swiglu_concat_ref,
   doc="gate = x[:, :N], up = x[:, N:], out = silu(gate) * up (seed: SwiGLUConcat)",
   vjp=lambda b, node, dy, want: [b.emit("SwiGLUConcatGrad", (dy, node.inputs[0]))], kernel=_swiglu_concat_kernel)


def _swiglu_concat_grad(ts, a):
    dy, x = ts
    need_f32(dy, "dy")
    need_f32(x, "input")
    need(x.rank == 2 and dy.shape == (x.shape[0], x.shape[1] // 2) and x.shape[1] % 2 == 0,
         f"needs dy [M,N] and input [M,2N], got dy {dy} and input {x}")
    return x


def _swiglu_concat_grad_ref(xs, a):
    dy, x = xs
    n = dy.shape[1]
    gate, up = x[:, :n], x[:, n:]
    return np.concatenate([dy * up * dsilu(gate), dy * gate * sigmoid(gate)], axis=1)


def _swiglu_concat_grad_kernel(node, ins, target) -> Kernel:
    n = node.type.num_elements
    return Kernel("swiglu_concat_grad", "swiglu_concat_grad.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("half", "u32", ins[0].shape[1])))


op("SwiGLUConcatGrad", ("dy", "x"), _swiglu_concat_grad, _swiglu_concat_grad_ref,
   doc="[dy * up * silu'(gate), dy * silu(gate)] with gate = x[:, :N], up = x[:, N:]; inputs [dy [M,N], "
       "x [M,2N]] -> [M,2N] (seed: SwiGLUConcatGrad)", vjp=NO_GRAD, kernel=_swiglu_concat_grad_kernel)


def _swiglu_mm(g, dim, bt: bool) -> None:
    m, k, n = dim("m"), dim("k"), dim("n")
    h = g.input("h", [m, k])
    shape = [n, k] if bt else [k, n]
    mm = g.matmul_bt if bt else g.matmul
    g.set_outputs([g.swiglu(mm(h, g.parameter("wg", shape)), mm(h, g.parameter("wu", shape)))])


@rules("swiglu")
def _gate_up_concat(e):
    (h,) = e.vars("h")
    ng, nu = e.vars("ng nu", e.String)
    sg, su = e.vars("sg su", e.Vec[e.i64])  # SwiGLU's shape rule makes them equal (see attention.py _packed_qkv)
    wg, wu = e.Parameter(ng, sg), e.Parameter(nu, su)
    # SwiGLU(MatMul(h,Wg), MatMul(h,Wu)) -> SwiGLUConcat(MatMul(h, Concat1(Wg,Wu)))   (W [K,N]: columns)
    yield e.equal("SwiGLU(MatMul(h,Wg), MatMul(h,Wu)) -> SwiGLUConcat(MatMul(h, Concat(Wg,Wu)))",
                  e.SwiGLU(e.MatMul(h, wg), e.MatMul(h, wu)),
                  e.SwiGLUConcat(e.MatMul(h, e.Concat(wg, wu, axis=1))),
                  example=example(lambda g, dim: _swiglu_mm(g, dim, False)))
    # SwiGLU(MatMulBT(h,Wg), MatMulBT(h,Wu)) -> SwiGLUConcat(MatMulBT(h, Concat0(Wg,Wu)))   (W [N,K]: rows)
    yield e.equal("SwiGLU(MatMulBT(h,Wg), MatMulBT(h,Wu)) -> SwiGLUConcat(MatMulBT(h, Concat(Wg,Wu)))",
                  e.SwiGLU(e.MatMulBT(h, wg), e.MatMulBT(h, wu)),
                  e.SwiGLUConcat(e.MatMulBT(h, e.Concat(wg, wu, axis=0))),
                  example=example(lambda g, dim: _swiglu_mm(g, dim, True)))
