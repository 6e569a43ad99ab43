"""Activation recognition: spelled-out activations rewritten to their named ops."""

from __future__ import annotations

from egglog import Vec, eq, i64, ruleset

from .dsl import equal
from .sorts import T, shape

activation_ruleset = ruleset(name="activation")


@activation_ruleset.register
def _silu(x: T):
    # Mul(x, Sigmoid(x)) -> Silu(x)
    yield equal("Mul(x, Sigmoid(x)) -> Silu(x)", T.mul(x, T.sigmoid(x)), T.silu(x))
    # Mul(Sigmoid(x), x) -> Silu(x)
    yield equal("Mul(Sigmoid(x), x) -> Silu(x)", T.mul(T.sigmoid(x), x), T.silu(x))


@activation_ruleset.register
def _swiglu(g: T, u: T, s: Vec[i64]):
    # Mul(Silu(g), u) -> SwiGLU(g, u)   if shape(g) = shape(u) (a broadcasting Mul stays a Mul)
    yield equal("Mul(Silu(g), u) -> SwiGLU(g, u)", T.mul(T.silu(g), u), T.swiglu(g, u),
                eq(shape(g)).to(s), eq(shape(u)).to(s))
    # Mul(u, Silu(g)) -> SwiGLU(g, u)   the same, operands swapped
    yield equal("Mul(u, Silu(g)) -> SwiGLU(g, u)", T.mul(u, T.silu(g)), T.swiglu(g, u),
                eq(shape(g)).to(s), eq(shape(u)).to(s))
