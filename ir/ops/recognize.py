"""Recognition: the fused ops found again in the primitive chains exporters write.

An ONNX exporter spells GELU as Div/Erf/Add/Mul/Mul and LayerNorm as ReduceMean/Sub/Pow/
ReduceMean/Add/Sqrt/Div/Mul/Add, each in its own order. The rules of the ``recognition``
ruleset turn such chains back into the one op (``Gelu``, ``GeluTanh``, ``LayerNorm``,
``RmsNorm``; ``recognize_norms.py`` holds the norms) and drops the Cast chains that lose
nothing (bool -> f32 -> bool; a cast to the dtype a value has). They are equalities like every
rule: when an intermediate is also used elsewhere or is a graph output, extraction keeps what
it needs. A Cast to the same dtype and a Cast of a constant never reach the e-graph: the ONNX
importer drops the one and folds the other, as it folds every subgraph of known values at
load time (so no rule here folds constants).

Keeping the e-graph small. No rule here is a blanket commutativity or associativity of Add
and Mul (which took a LLaMA graph of 8 layers past a million e-nodes, ``shared/EGGLOG_NOTES``).
Instead:

- a few canonicalisations move *scalar constants* (one-element Constants, known by their
  ``value`` fact, ``ir/facts.py``) to one place: to the right of a Mul or Add, and out of a product
  (``Mul(Mul(x, c), y) = Mul(Mul(x, y), c)``); ``Div(1, s)`` and ``Pow(a, -0.5)`` become
  ``Recip``, ``Div(x, Sqrt(a))`` a product with ``Recip(Sqrt(a))``. Each adds at most a few
  e-nodes per term holding a scalar constant, and such terms are few (the constants of the
  activations and norms);
- the orders of the *non-constant* operands that exporters write are listed in the rules
  themselves: each rule is one variant of a pattern (:class:`Pattern`), written once and read
  three ways: as the rule's left side, as its name and as its soundness example, so the three
  cannot disagree.

A constant is matched by its value: exactly for 0.5, 1, 2, 3 and -0.5, within a relative
:data:`REL_TOL` for the irrational ones (sqrt 2, 1/sqrt 2, sqrt(2/pi), 0.044715), whose f32
roundings exporters write. An epsilon is bound to the recognised op's attribute.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..spec import example, rules

FAMILY = "recognize"

#: Relative tolerance of a matched irrational constant (f32 rounding is 6e-8; this allows
#: an exporter that rounded through a few operations).
REL_TOL = 1e-6

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715


def _exact(value: float) -> bool:
    return float(value) == float(np.float32(value)) and (value * 64).is_integer()


# --- patterns as data ----------------------------------------------------------------------------

#: A pattern variant: ``fn(b, x)`` builds the term over the input ``x`` with a backend ``b``
#: (:class:`_Egg`, :class:`_Graph` or :class:`_Text`).
Variant = Callable[..., object]


class _Egg:
    """Builds a variant as an egglog pattern over ``x``, collecting the guards its constants,
    epsilon and last-axis reductions need."""

    def __init__(self, e, x) -> None:
        self.e, self.x = e, x
        self.sx = e.var("sx", e.Vec[e.i64])
        self.eps = e.var("eps", e.f64)
        self.guards = [e.eq(e.shape(x)).to(self.sx)]
        self._n = itertools.count()

    def _fresh(self, sort=None):
        n = next(self._n)
        return self.e.var(f"c{n}") if sort is None else self.e.var(f"v{n}", sort)

    def const(self, value: float):
        e, c = self.e, self._fresh()
        if _exact(value):
            self.guards.append(e.value(c, e.f64(float(value))))
        else:
            v = self._fresh(e.f64)
            lo, hi = sorted((value * (1 - REL_TOL), value * (1 + REL_TOL)))
            self.guards += [e.value(c, v), v > e.f64(lo), v < e.f64(hi)]
        return c

    def epsilon(self):
        c = self._fresh()
        self.guards.append(self.e.value(c, self.eps))
        return c

    def mean_last(self, a):
        e = self.e
        ax = self._fresh(e.Vec[e.i64])
        self.guards.append(e.eq(ax).to(e.Vec[e.i64](self.sx.length() - e.i64(1))))
        return e.ReduceMean(a, axes=ax, keepdims=e.Bool(True))

    def __getattr__(self, op: str):
        return getattr(self.e, op)


class _Graph:
    """Builds a variant as IR nodes of ``g`` over the node ``x``: the rule's soundness example."""

    def __init__(self, g, x, eps: float = 1e-5) -> None:
        self.g, self.x, self.eps = g, x, eps
        self.rank = len(g.node(x).type.shape)

    def const(self, value: float):
        return self.g.constant(np.float32(value), shape=())

    def epsilon(self):
        return self.g.constant(np.float32(self.eps), shape=())

    def mean_last(self, a):
        return self.g.add_node("ReduceMean", [a], axes=(self.rank - 1,), keepdims=True)

    def __getattr__(self, op: str):
        return lambda *xs: self.g.add_node(op, xs)


class _Text:
    """Writes a variant as text: the rule's name."""

    x = "x"

    def const(self, value: float) -> str:
        return {SQRT2: "sqrt2", 1 / SQRT2: "1/sqrt2", SQRT_2_OVER_PI: "sqrt(2/pi)"}.get(value, f"{value:g}")

    def epsilon(self) -> str:
        return "eps"

    def mean_last(self, a) -> str:
        return f"ReduceMean({a})"

    def __getattr__(self, op: str):
        return lambda *xs: f"{op}({', '.join(xs)})"


@dataclass(frozen=True)
class Pattern:
    """One variant of a recognised chain over an input ``x``: its ``build(b, x)`` and the
    rank of ``x`` in its soundness example."""

    build: Variant
    rank: tuple[int, int] = (1, 3)

    def name(self) -> str:
        return str(self.build(_Text(), "x"))

    def egg(self, e, x) -> tuple[object, _Egg]:
        """The left-hand side over the variable ``x``, and the backend holding its guards and its
        ``eps`` and ``sx`` (shape of x) variables."""
        b = _Egg(e, x)
        return self.build(b, x), b

    def example(self, extra: Callable | None = None, eps: float = 1e-5):
        """The soundness example: the chain over an input of random shape (rank in ``rank``),
        ``extra(g, x, y)`` adding to it (a weight), the result the output."""

        def build(g, dim):
            rank = dim("rank", *self.rank)
            x = g.input("x", [dim(f"d{i}") for i in range(rank - 1)] + [dim("n", 2, 7)])
            y = self.build(_Graph(g, x, eps), x)
            g.set_outputs([extra(g, x, y) if extra else y])

        return example(build)


def recognise(e, name: str, pattern: Pattern, rhs: Callable, ex=None):
    """The rule ``pattern(x) -> rhs(x, eps)``, guarded so that the chain's shape is x's
    (a scalar constant of higher rank than x would broadcast x up)."""
    x = e.var("x")
    lhs, b = pattern.egg(e, x)
    return e.equal(f"{pattern.name()} -> {name}", lhs, rhs(x, b.eps), *b.guards, e.eq(e.shape(lhs)).to(b.sx),
                   example=ex or pattern.example())


# --- canonical places for scalar constants ---------------------------------------------------


def _xy(g, dim):
    return g.input("x", [dim("m"), dim("n")]), g.input("y", [dim("m"), dim("n")])


def _scalar(g, value=0.5, shape=()):
    return g.constant(np.float32(value), shape=shape)


@rules("recognition")
def _canonical_constants(e):
    x, y, c, s = e.vars("x y c s")
    (v,) = e.vars("v", e.f64)
    is_scalar = e.value(c, v)
    # Mul(c, x) -> Mul(x, c)   c a scalar constant
    yield e.equal("Mul(c, x) -> Mul(x, c)", e.Mul(c, x), e.Mul(x, c), is_scalar,
                  example=example(lambda g, dim: g.set_outputs([g.mul(_scalar(g), _xy(g, dim)[0])])))
    # Add(c, x) -> Add(x, c)   c a scalar constant
    yield e.equal("Add(c, x) -> Add(x, c)", e.Add(c, x), e.Add(x, c), is_scalar,
                  example=example(lambda g, dim: g.set_outputs([g.add(_scalar(g, 1.0, [1]), _xy(g, dim)[0])])))
    # Mul(Mul(x, c), y) -> Mul(Mul(x, y), c)   c a scalar constant: broadcasting keeps the shape
    yield e.equal("Mul(Mul(x, c), y) -> Mul(Mul(x, y), c)", e.Mul(e.Mul(x, c), y), e.Mul(e.Mul(x, y), c), is_scalar,
                  example=example(lambda g, dim: g.set_outputs([g.mul(
                      g.mul(g.input("x", [dim("n")]), _scalar(g, 0.5, [1, 1])), g.input("y", [dim("m"), dim("n")]))])))
    # Mul(x, Mul(y, c)) -> Mul(Mul(x, y), c)   c a scalar constant
    yield e.equal("Mul(x, Mul(y, c)) -> Mul(Mul(x, y), c)", e.Mul(x, e.Mul(y, c)), e.Mul(e.Mul(x, y), c), is_scalar,
                  example=example(lambda g, dim: g.set_outputs([g.mul(
                      (xy := _xy(g, dim))[0], g.mul(xy[1], _scalar(g, 3.0)))])))
    # Div(1, s) -> Recip(s)   if the quotient has s's shape
    yield e.equal("Div(1, s) -> Recip(s)", e.Div(c, s), e.Recip(s), e.value(c, e.f64(1.0)),
                  e.eq(e.shape(e.Div(c, s))).to(e.shape(s)),
                  example=example(lambda g, dim: g.set_outputs([g.add_node("Div", [
                      _scalar(g, 1.0), g.add_node("Exp", [_xy(g, dim)[0]])])])))
    # Pow(s, -0.5) -> Recip(Sqrt(s))   if the power has s's shape
    yield e.equal("Pow(s, -0.5) -> Recip(Sqrt(s))", e.Pow(s, c), e.Recip(e.Sqrt(s)),
                  e.value(c, e.f64(-0.5)), e.eq(e.shape(e.Pow(s, c))).to(e.shape(s)),
                  example=example(lambda g, dim: g.set_outputs([g.add_node("Pow", [
                      g.add_node("Exp", [_xy(g, dim)[0]]), _scalar(g, -0.5)])])))
    # Div(x, Sqrt(s)) -> Mul(x, Recip(Sqrt(s)))
    yield e.equal("Div(x, Sqrt(s)) -> Mul(x, Recip(Sqrt(s)))", e.Div(x, e.Sqrt(s)), e.Mul(x, e.Recip(e.Sqrt(s))),
                  example=example(lambda g, dim: g.set_outputs([g.add_node("Div", [
                      (xy := _xy(g, dim))[0], g.add_node("Sqrt", [g.add_node("Exp", [xy[1]])])])])))


# --- GELU, erf and tanh forms ----------------------------------------------------------------


def _outer(inner):
    # 0.5 * x * inner, after the canonical moves: Mul(Mul(x, inner), 0.5) or Mul(Mul(inner, x), 0.5)
    return [lambda b, x: b.Mul(b.Mul(x, inner(b, x)), b.const(0.5)),
            lambda b, x: b.Mul(b.Mul(inner(b, x), x), b.const(0.5))]


#: 1 + erf(x / sqrt 2), written with a Div by sqrt 2 or a Mul by 1/sqrt 2
ERF_CORES = (lambda b, x: b.Add(b.Erf(b.Div(x, b.const(SQRT2))), b.const(1.0)),
             lambda b, x: b.Add(b.Erf(b.Mul(x, b.const(1 / SQRT2))), b.const(1.0)))

#: x^3 as exporters write it: Pow(x, 3) (torch.pow), Mul(x, Mul(x, x)) (torch's tanh-GELU
#: symbolic), Mul(Mul(x, x), x) (x * x * x)
CUBES = (lambda b, x: b.Pow(x, b.const(3.0)), lambda b, x: b.Mul(x, b.Mul(x, x)), lambda b, x: b.Mul(b.Mul(x, x), x))


def _tanh_core(cube, x_first: bool):
    def core(b, x):
        cubic = b.Mul(cube(b, x), b.const(GELU_CUBIC))
        inner = b.Add(x, cubic) if x_first else b.Add(cubic, x)
        return b.Add(b.Tanh(b.Mul(inner, b.const(SQRT_2_OVER_PI))), b.const(1.0))

    return core


def gelu_patterns() -> list[Pattern]:
    """Every variant of 0.5 x (1 + erf(x / sqrt 2)) the erf-GELU rules match."""
    return [Pattern(v) for core in ERF_CORES for v in _outer(core)]


def gelu_tanh_patterns() -> list[Pattern]:
    """Every variant of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) the tanh-GELU rules match."""
    return [Pattern(v) for cube in CUBES for first in (True, False) for v in _outer(_tanh_core(cube, first))]


@rules("recognition")
def _gelu(e):
    # 0.5 x (1 + erf(x / sqrt 2)) -> Gelu(x)   (Hendrycks & Gimpel 2016; torch.onnx's gelu, HF's gelu)
    for p in gelu_patterns():
        yield recognise(e, "Gelu(x)", p, lambda x, eps: e.Gelu(x))
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> GeluTanh(x)   (GPT-2's gelu_new, torch's tanh GELU)
    for p in gelu_tanh_patterns():
        yield recognise(e, "GeluTanh(x)", p, lambda x, eps: e.GeluTanh(x))


# --- HardSwish -------------------------------------------------------------------------------


def _relu6_of_shifted(b, x):
    return b.Clip(b.Add(x, b.const(3.0)), b.const(0.0), b.const(6.0))


def hard_swish_patterns() -> list[Pattern]:
    """Every variant of x clip(x + 3, 0, 6) / 6 the HardSwish rules match: divided by 6 after or
    before the product, or multiplied by 1/6 (paddle2onnx's hard_swish, torch.onnx's before opset 14)."""
    return [Pattern(lambda b, x: b.Div(b.Mul(x, _relu6_of_shifted(b, x)), b.const(6.0))),
            Pattern(lambda b, x: b.Div(b.Mul(_relu6_of_shifted(b, x), x), b.const(6.0))),
            Pattern(lambda b, x: b.Mul(x, b.Div(_relu6_of_shifted(b, x), b.const(6.0)))),
            Pattern(lambda b, x: b.Mul(b.Mul(x, _relu6_of_shifted(b, x)), b.const(1 / 6)))]


@rules("recognition")
def _hard_swish(e):
    # x clip(x + 3, 0, 6) / 6 -> HardSwish(x)   (Howard et al. 2019, MobileNetV3), so that it can be
    # a convolution's or a matmul's epilogue step
    for p in hard_swish_patterns():
        yield recognise(e, "HardSwish(x)", p, lambda x, eps: e.HardSwish(x))


# --- SwiGLU under a reshape ------------------------------------------------------------------


def _viewed_swiglu(g, dim):
    m, n = dim("m"), dim("n")
    h = g.input("h", [m, dim("k")])
    gate, up = (g.reshape(g.matmul(h, g.parameter(w, [dim("k"), n])), [1, m, n]) for w in ("wg", "wu"))
    g.set_outputs([g.swiglu(gate, up)])


@rules("recognition")
def _swiglu_through_reshape(e):
    a, b = e.vars("a b")
    s, sa = e.vars("s sa", e.Vec[e.i64])
    lhs, inner = e.SwiGLU(e.Identity(a, shape=s), e.Identity(b, shape=s)), e.SwiGLU(a, b)
    # SwiGLU(Reshape(a, s), Reshape(b, s)) -> Reshape(SwiGLU(a, b), s)   if shape(a) = shape(b): an exporter's
    # gate and up projections are views of 2-D matmuls, which the gate/up packing rule reads
    yield e.rule(lhs, e.eq(e.shape(a)).to(sa), e.eq(e.shape(b)).to(sa),
                 name="SwiGLU(Reshape(a,s), Reshape(b,s)) -> Reshape(SwiGLU(a,b), s)",
                 example=example(_viewed_swiglu)).then(
        e.union(lhs).with_(e.Identity(inner, shape=s)), e.set_(e.shape(inner)).to(sa))


# --- Cast chains -------------------------------------------------------------------------------------


def _cast_chain(mid: str, twice: bool = False):
    def build(g, dim):
        a, b = _xy(g, dim)
        if twice:  # Cast(Cast(a, i32), i32)
            g.set_outputs([g.add_node("Cast", [g.add_node("Cast", [a], to=mid)], to=mid)])
        else:  # a < b, bool -> mid -> bool
            g.set_outputs([g.add_node("Cast", [g.add_node("Cast", [g.add_node("Less", [a, b])], to=mid)], to="bool")])

    return example(build)


@rules("recognition")
def _cast_chains(e):
    (x,) = e.vars("x")
    (t,) = e.vars("t", e.String)
    # Cast(Cast(x, t), t) -> Cast(x, t)   (a cast to the dtype a value has is the identity)
    yield e.equal("Cast(Cast(x, t), t) -> Cast(x, t)", e.Cast(e.Cast(x, to=t), to=t), e.Cast(x, to=t),
                  example=_cast_chain("i32", twice=True))
    for mid in ("f32", "i32"):
        # Cast(Cast(x, mid), bool) -> x   if x is bool: bool -> f32 / i32 -> bool loses nothing
        yield e.equal(f"Cast(Cast(x, {mid}), bool) -> x   (x bool)", e.Cast(e.Cast(x, to=e.String(mid)),
                      to=e.String("bool")), x, e.is_bool(x), example=_cast_chain(mid))


__all__ = ["CUBES", "ERF_CORES", "FAMILY", "Pattern", "REL_TOL", "gelu_patterns", "gelu_tanh_patterns",
           "hard_swish_patterns", "recognise"]
