"""Algebraic identities: involutions, idempotent activations, reshape chains."""

from __future__ import annotations

from egglog import Vec, eq, i64, ruleset

from .dsl import equal
from .sorts import T, shape

algebraic_ruleset = ruleset(name="algebraic")


@algebraic_ruleset.register
def _involutions(x: T):
    # Neg(Neg(x)) -> x
    yield equal("Neg(Neg(x)) -> x", T.neg(T.neg(x)), x)
    # Transpose(Transpose(x)) -> x
    yield equal("Transpose(Transpose(x)) -> x", T.transpose(T.transpose(x)), x)
    # Relu(Relu(x)) -> Relu(x)
    yield equal("Relu(Relu(x)) -> Relu(x)", T.relu(T.relu(x)), T.relu(x))


@algebraic_ruleset.register
def _reshape_chains(x: T, s: Vec[i64], s2: Vec[i64]):
    # Reshape(Reshape(x, s2), s) -> Reshape(x, s)
    yield equal("Reshape(Reshape(x, s2), s) -> Reshape(x, s)", T.reshape(T.reshape(x, s2), s), T.reshape(x, s))
    # Reshape(x, s) -> x   if shape(x) = s
    yield equal("Reshape(x, shape(x)) -> x", T.reshape(x, s), x, eq(shape(x)).to(s))
