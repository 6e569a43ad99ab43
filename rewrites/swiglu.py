"""SwiGLU: SiLU recognised, SiLU-gated products, and gate/up projections packed into one matmul.

The packed weight ``Concat(Wg, Wu)`` is a derived parameter: a term in the e-graph that
lowering materialises once at session creation, so one matmul replaces two.
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, ruleset

from .dsl import equal
from .sorts import T, args, shape

swiglu_ruleset = ruleset(name="swiglu")


@swiglu_ruleset.register
def _silu(x: T):
    # Mul(x, Sigmoid(x)) -> Silu(x)
    yield equal("Mul(x, Sigmoid(x)) -> Silu(x)", T.mul(x, T.sigmoid(x)), T.silu(x))
    # Mul(Sigmoid(x), x) -> Silu(x)
    yield equal("Mul(Sigmoid(x), x) -> Silu(x)", T.mul(T.sigmoid(x), x), T.silu(x))


@swiglu_ruleset.register
def _swiglu(g: T, u: T, s: Vec[i64]):
    # Mul(Silu(g), u) -> SwiGLU(g, u)   if shape(g) = shape(u) (a broadcasting Mul stays a Mul)
    yield equal("Mul(Silu(g), u) -> SwiGLU(g, u)", T.mul(T.silu(g), u), T.swiglu(g, u),
                eq(shape(g)).to(s), eq(shape(u)).to(s))
    # Mul(u, Silu(g)) -> SwiGLU(g, u)   the same, operands swapped
    yield equal("Mul(u, Silu(g)) -> SwiGLU(g, u)", T.mul(u, T.silu(g)), T.swiglu(g, u),
                eq(shape(g)).to(s), eq(shape(u)).to(s))


@swiglu_ruleset.register
def _gate_up_concat(h: T, ng: String, nu: String, s: Vec[i64]):
    wg, wu = T.parameter(ng, s), T.parameter(nu, s)
    # SwiGLU(MatMul(h,Wg), MatMul(h,Wu)) -> SwiGLUConcat(MatMul(h, Concat1(Wg,Wu)))   (W [K,N]: columns)
    yield equal("SwiGLU(MatMul(h,Wg), MatMul(h,Wu)) -> SwiGLUConcat(MatMul(h, Concat(Wg,Wu)))",
                T.swiglu(T.matmul(h, wg), T.matmul(h, wu)),
                T.swiglu_concat(T.matmul(h, T.concat(1, args(wg, wu)))))
    # SwiGLU(MatMulBT(h,Wg), MatMulBT(h,Wu)) -> SwiGLUConcat(MatMulBT(h, Concat0(Wg,Wu)))   (W [N,K]: rows)
    yield equal("SwiGLU(MatMulBT(h,Wg), MatMulBT(h,Wu)) -> SwiGLUConcat(MatMulBT(h, Concat(Wg,Wu)))",
                T.swiglu(T.matmul_bt(h, wg), T.matmul_bt(h, wu)),
                T.swiglu_concat(T.matmul_bt(h, T.concat(0, args(wg, wu)))))
