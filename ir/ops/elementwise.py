"""Elementwise ops: the unary table, BiasAdd, SwiGLU and their gradients.

A unary op is one :class:`Unary` row: its numpy function, its derivative, the WGSL of both,
its attributes (uniforms of the kernels), whether it also runs on I32 and whether a fused
matmul may apply it at its store. Each row registers the op and, when it has a derivative,
its gradient op ``<Op>Grad`` (inputs ``dy, x``: the gradient reads the forward input, so a
matmul epilogue needs only its pre-activation values). The rows here are the activations the
models use; the math functions and the other ONNX activations are rows of ``unary.py``, which
registers them with :func:`register_unary`. References compute in float64; the WGSL helpers
named in the rows live in ``shaders/common.wgsl``, ``shaders/math.wgsl`` (elementary functions
accurate to a few ulp) and ``shaders/derivatives.wgsl``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import erfc, expit

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import NO_GRAD, Attr, example, need, need_f32, op, rules
from ..types import DType, TensorType
from .broadcasting import broadcast_kernel, broadcast_strides  # noqa: F401  (broadcast_strides: BroadcastTo)

FAMILY = "elementwise"


def sigmoid(x):
    return expit(x)  # the logistic, without overflow and with its relative accuracy in the tail


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

#: The uniform field type of each attribute kind a unary row may have.
_ATTR_WGSL = {"float": "f32", "int": "i32", "bool": "u32"}


def wrap_i32(y):
    """An integer result as the device's int32 gives it (two's complement wrap-around:
    -(-2^31) and |-2^31| are -2^31 in WGSL); float results pass through."""
    y = np.asarray(y)
    if y.dtype.kind != "i":
        return y
    return (y.astype(np.int64) + 2**31) % 2**32 - 2**31


def _neg_vjp(b, node, dy, want):
    return [b.emit("Neg", (dy,))]


@dataclass(frozen=True)
class Unary:
    """One unary elementwise op, as a row of :data:`UNARY`.

    - ``fn(x, **attrs)`` / ``derivative(x, **attrs)``: numpy, float64 (an I32 input comes as
      int64 and ``fn`` returns the device's int32 result, :func:`wrap_i32`).
    - ``wgsl`` / ``wgsl_derivative``: WGSL expressions of ``{x}``; attribute ``a`` is written
      ``{a}`` and becomes the kernel's uniform field ``p.a`` (f32, i32 or u32 for float, int
      and bool attributes). ``derivative`` None: the op has no ``<Op>Grad`` and ``vjp`` is
      its VJP or no-gradient marker; otherwise ``<Op>Grad`` (inputs ``dy, x``, the same
      attributes) computes ``dy * f'(x)``.
    - ``epilogue``: a fused matmul may apply the op at its store (rows without attributes
      and with an f32 result only: the store has no uniforms for them).
    - ``attrs``: the op's typed attributes (:class:`~..spec.Attr`, kinds float, int, bool).
    - ``wgsl_int``: the op on I32 as WGSL (then it takes I32 inputs too).
    - ``out``: the result's dtype when it is not the input's (IsNaN, IsInf: BOOL).
    - ``check(attrs)``: raises ShapeError (through ``need``) for attribute values the op
      does not define.
    """

    name: str
    fn: Callable[..., np.ndarray]
    wgsl: str
    derivative: Callable[..., np.ndarray] | None
    wgsl_derivative: str | None
    doc: str
    derivative_doc: str = ""
    epilogue: bool = True
    attrs: tuple[Attr, ...] = ()
    wgsl_int: str | None = None
    out: DType | None = None
    vjp: Any = None
    check: Callable[[dict], None] | None = None

    def __post_init__(self) -> None:
        if self.epilogue and (self.attrs or self.out is not None):
            raise ValueError(f"unary {self.name}: only a row without attributes and with an f32 result may be "
                             "an epilogue step")
        if (self.derivative is None) != (self.wgsl_derivative is None) or (self.derivative is None) == (
                self.vjp is None):
            raise ValueError(f"unary {self.name}: give a derivative and its WGSL, or a vjp")
        for a in self.attrs:
            if a.kind not in _ATTR_WGSL:
                raise ValueError(f"unary {self.name}: attribute {a.name} of kind {a.kind!r} has no uniform type")

    def expr(self, template: str, x: str) -> str:
        """``template`` (the row's WGSL or its derivative's) applied to ``x``, with the
        attributes read from the kernel's uniform ``p``."""
        return template.format(x=x, **{a.name: f"p.{a.name}" for a in self.attrs})

    def params(self, attrs: dict) -> tuple[tuple[str, str, Any], ...]:
        """The uniform fields of the attributes, as a kernel's ``params``."""
        return tuple((a.name, _ATTR_WGSL[a.kind], int(attrs[a.name]) if a.kind == "bool" else attrs[a.name])
                     for a in self.attrs)

    def call(self, fn: Callable[..., np.ndarray], x: np.ndarray, attrs: dict) -> np.ndarray:
        """``fn`` (the row's function or derivative) at ``x``, float attributes rounded to
        f32 as the kernels' uniforms hold them; without numpy's warnings (NaN and infinities
        are IEEE 754 results here)."""
        kw = {a.name: float(np.float32(attrs[a.name])) if a.kind == "float" else attrs[a.name] for a in self.attrs}
        with np.errstate(all="ignore"):
            return fn(x, **kw)


#: Every row, in registration order (:func:`register_unary` appends the rows of other modules).
UNARY: list[Unary] = [
    # select, not max: WGSL's max need not return a NaN operand, and np.maximum (the reference) does
    Unary("Relu", lambda x: np.maximum(x, 0), "select({x}, 0.0, {x} < 0.0)",
          lambda x: (x > 0).astype(np.float64), "select(0.0, 1.0, {x} > 0.0)",
          "max(x, 0) (ONNX Relu, f32 and int)", "1 if x > 0 else 0 (0 at x = 0, as PyTorch)",
          wgsl_int="max({x}, 0)"),
    Unary("Sigmoid", sigmoid, "sigmoid({x})", lambda x: sigmoid(x) * sigmoid(-x), "dsigmoid({x})",
          "1 / (1 + exp(-x)) (ONNX Sigmoid)", "s(1 - s), s = sigmoid(x)"),
    # tanh_acc (shaders/math.wgsl) keeps its relative accuracy near 0, where WGSL's tanh need
    # not (lavapipe's loses every digit below 1e-7)
    Unary("Tanh", np.tanh, "tanh_acc({x})", lambda x: 1.0 - np.tanh(x) ** 2, "dtanh({x})",
          "tanh(x) (ONNX Tanh)", "1 - tanh(x)^2"),
    Unary("Neg", lambda x: wrap_i32(np.negative(x)), "-({x})", None, None,
          "-x (ONNX Neg, f32 and int: -(-2^31) wraps to -2^31); its gradient is Neg(dy)", wgsl_int="-({x})",
          vjp=_neg_vjp),
    Unary("Gelu", gelu_erf, "gelu_erf({x})",
          lambda x: 0.5 * erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
          "dgelu_erf({x})", "GELU, erf form: x Phi(x) (Hendrycks & Gimpel 2016), as BERT uses",
          "Phi(x) + x phi(x), Phi/phi the normal cdf/pdf (Hendrycks & Gimpel 2016)"),
    Unary("GeluTanh", gelu_tanh, "gelu_tanh({x})", _dgelu_tanh, "dgelu_tanh({x})",
          "GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. 2), as GPT-2 uses",
          "0.5(1 + t) + 0.5 x (1 - t^2) c (1 + 3*0.044715 x^2), t = tanh(c (x + 0.044715 x^3)), c = sqrt(2/pi)"),
    Unary("Silu", lambda x: x * sigmoid(x), "silu({x})", dsilu, "dsilu({x})",
          "SiLU / swish x sigmoid(x) (Elfwing et al. 2018)", "s (1 + x (1 - s)), s = sigmoid(x) (seed: SiluGrad)"),
    Unary("Abs", lambda x: wrap_i32(np.abs(x)), "abs({x})", np.sign, "sign({x})",
          "|x| (seed: Abs; ONNX Abs, f32 and int: |-2^31| wraps to -2^31)",
          "sign(x), 0 at x = 0 (numpy sign, as PyTorch's abs backward)", wgsl_int="abs({x})"),
    # log_acc (shaders/math.wgsl) keeps its relative accuracy near 1, where WGSL's log need
    # not (lavapipe's loses 2e-3 there), and gives IEEE 754's -inf at 0 and NaN below 0.
    Unary("Log", _log, "log_acc({x})", lambda x: 1.0 / x, "1.0 / ({x})",
          "natural log; as numpy (IEEE 754 log): -inf at 0, NaN below 0 (seed: Log; ONNX Log)", "1 / x"),
    # max(x, 0) + log1p(exp(-|x|)): exp never overflows, and the tail is exact for large |x|
    Unary("Softplus", lambda x: np.logaddexp(0.0, x), "softplus({x})", sigmoid, "sigmoid({x})",
          "log(1 + exp(x)) (Dugas et al. 2001; ONNX Softplus)", "sigmoid(x)"),
    # a plain IEEE division: +-inf at +-0 on every adapter we know, though WGSL does not promise it
    Unary("Recip", _recip, "1.0 / ({x})", lambda x: -1.0 / (x * x), "-1.0 / (({x}) * ({x}))",
          "1 / x; +-inf at +-0 as numpy (seed: Recip; ONNX Reciprocal)", "-1 / x^2"),
]
UNARY_BY_NAME = {u.name: u for u in UNARY}


def _unary_type(u: Unary):
    def infer(ts, a):
        t = ts[0]
        if u.wgsl_int is not None:
            need(t.dtype in (DType.F32, DType.I32), f"input must be f32 or i32, got {t}")
        else:
            need_f32(t, "input")
        if u.check is not None:
            u.check(a)
        return TensorType(t.shape, u.out or t.dtype)

    return infer


def _unary_kernel(node, ins, target) -> Kernel:
    n = node.type.num_elements
    u = UNARY_BY_NAME[node.op]
    on_int = ins[0].dtype is DType.I32
    return Kernel(f"unary_{node.op}" + ("_i32" if on_int else ""), "unary.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), *u.params(node.attrs)),
                  slots={"EXPR": u.expr(u.wgsl_int if on_int else u.wgsl, "v")})


def _unary_vjp(b, node, dy, want):
    return [b.emit(f"{node.op}Grad", (dy, node.inputs[0]), **node.attrs)]


def elementwise_grad_kernel(node, ins, target, expr: str, params=()) -> Kernel:
    """elementwise_grad.wgsl computing ``expr`` of g = dy[i], v = x[i] (and up[i]) per element;
    ``params``: uniform fields beyond ``n``."""
    n = node.type.num_elements
    names = ("dy", "x", "up")[:len(ins)]
    return Kernel(f"grad_{node.op}", "elementwise_grad.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), *params),
                  slots={"EXPR": expr}, bindings=(*(Buffer(m) for m in names), Buffer("out", write=True)))


def _grad_kernel(node, ins, target) -> Kernel:
    u = UNARY_BY_NAME[node.op.removesuffix("Grad")]
    return elementwise_grad_kernel(node, ins, target, f"g * ({u.expr(u.wgsl_derivative, 'v')})",
                                   u.params(node.attrs))


def register_unary(u: Unary, family: str = FAMILY) -> None:
    """Register row ``u``: the op ``u.name`` and, when it has a derivative, ``<name>Grad``
    (their shape rules, references, VJPs and kernels), in ``family``."""
    if u.name not in UNARY_BY_NAME:
        UNARY.append(u)
        UNARY_BY_NAME[u.name] = u
    op(u.name, ("x",), _unary_type(u), lambda xs, a: u.call(u.fn, xs[0], a), attrs=u.attrs, doc=u.doc,
       vjp=_unary_vjp if u.derivative else u.vjp, kernel=_unary_kernel, epilogue_step=u.epilogue, family=family)
    if u.derivative is not None:
        def infer(ts, a):
            if u.check is not None:
                u.check(a)
            return like(ts, "x", 1)

        op(f"{u.name}Grad", ("dy", "x"), infer, lambda xs, a: xs[0] * u.call(u.derivative, xs[1], a),
           attrs=u.attrs, doc=f"dx = dy * {u.name}'(x), {u.name}'(x) = {u.derivative_doc}; inputs [dy, x]",
           vjp=NO_GRAD, kernel=_grad_kernel, family=family)


for _u in tuple(UNARY):
    register_unary(_u)


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
