"""Facts about the values of constants, for the rewrite rules that must read a value.

An e-graph holds terms, not tensors: a rule sees ``Constant(name, shape)`` and nothing of what
the constant holds. Some recognitions need exactly that (the scale of an attention's scores,
the ``-inf`` of a mask, whether a mask is causal, the frequencies of a RoPE table), so each
such property is a :class:`ValueFact`: a function of a constant's array that returns the
fact's arguments when it holds and None otherwise, registered with :func:`value_fact` beside
the rules that read it. Encoding evaluates every fact on every ``Constant`` leaf and writes the
ones that hold as egglog relations, ``(name t arg...)`` (``rewrites.sorts`` declares one per
fact, ``rewrites.encode`` writes them); a rule reads one as a guard, ``e.value(c, v)``, which
binds ``v``. A fact is about the constant only: a term a rule creates never has one (an
analysis rule may derive one, as ``finite`` is derived through ``Where``).

The ONNX importer keeps an initializer that a fact with ``bake`` describes as a ``Constant``
(its value in the graph) instead of a ``Parameter`` (a name whose value comes at compile time),
so that the facts of folded tables and scalars reach the e-graph (``eggfuse.onnx.importer``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .types import DType, TensorType

#: egglog attribute kinds a fact's arguments may have (as ``ir.spec.ATTR_KINDS``).
FACT_ARG_KINDS = ("int", "float", "str")


@dataclass(frozen=True)
class ValueFact:
    """One fact: ``name`` (its egglog relation), ``args`` (the kinds of its arguments after the
    tensor), ``find(value, type) -> tuple | None`` (the arguments when the fact holds of a
    constant's array, float64 / int64 / bool as the reference holds it), ``doc``, and ``bake``
    (the ONNX importer keeps an initializer it holds of as a Constant)."""

    name: str
    args: tuple[str, ...]
    find: Callable[[np.ndarray, TensorType], tuple | None]
    doc: str
    bake: bool = True


#: Every fact, by name, in registration order.
VALUE_FACTS: dict[str, ValueFact] = {}


def value_fact(name: str, args: tuple[str, ...] = (), *, doc: str, bake: bool = True):
    """Decorator: register ``fn(value, type) -> tuple | None`` as the :class:`ValueFact` ``name``."""
    for kind in args:
        if kind not in FACT_ARG_KINDS:
            raise ValueError(f"value fact {name}: argument kind {kind!r} is not one of {FACT_ARG_KINDS}")

    def deco(fn):
        if name in VALUE_FACTS:
            raise ValueError(f"two value facts are named {name!r}")
        VALUE_FACTS[name] = ValueFact(name, tuple(args), fn, doc, bake)
        return fn

    return deco


def facts_of(value: np.ndarray, ty: TensorType) -> list[tuple[ValueFact, tuple]]:
    """The facts that hold of a constant of type ``ty`` holding ``value``, with their arguments."""
    arr = np.asarray(value)
    out = []
    for fact in VALUE_FACTS.values():
        args = fact.find(arr, ty)
        if args is not None:
            out.append((fact, tuple(args)))
    return out


def baked(value: np.ndarray, ty: TensorType) -> bool:
    """Whether a fact with ``bake`` holds of ``value``: the importer then keeps it as a Constant."""
    arr = np.asarray(value)
    return any(f.bake and f.find(arr, ty) is not None for f in VALUE_FACTS.values())


def uniform_leading(value: np.ndarray, rank: int) -> np.ndarray | None:
    """The trailing ``rank`` axes of ``value`` when every leading index holds the same slice
    (a table broadcast or repeated over batch and heads), else None."""
    if value.ndim < rank:
        return None
    flat = value.reshape((-1, *value.shape[value.ndim - rank:]))
    first = flat[0]
    if flat.shape[0] > 1 and not (flat == first).all():
        return None
    return first


# --- the facts every family may read ------------------------------------------------------


@value_fact("value", ("float",), doc="value(t, v): t is an f32 constant of one element (any shape), v; v may be "
                                     "infinite, never NaN")
def _one_value(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.F32 or value.size != 1:
        return None
    v = float(value.reshape(-1)[0])
    return None if math.isnan(v) else (v,)


@value_fact("int_value", ("int",), doc="int_value(t, v): t is an i32 constant of one element (any shape), v (the "
                                         "padding id an exporter compares token ids with)")
def _one_int(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.I32 or value.size != 1:
        return None
    return (int(value.reshape(-1)[0]),)


@value_fact("finite", doc="finite(t): every element of the f32 constant t is finite (analysis rules derive it "
                          "through Where and views too)", bake=False)
def _finite(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.F32 or not np.isfinite(value).all():
        return None
    return ()


@value_fact("all_true", doc="all_true(t): t is a bool constant whose every element is true (a mask part that masks "
                             "nothing: the classic exporter's folded query index >= 0 of an encoder's mask)")
def _all_true(value: np.ndarray, ty: TensorType):
    if ty.dtype is not DType.BOOL or not value.astype(bool).all():
        return None
    return ()


__all__ = ["FACT_ARG_KINDS", "VALUE_FACTS", "ValueFact", "baked", "facts_of", "uniform_leading", "value_fact"]
