"""Matmul epilogue fusion: adds, biases and activations folded into the matmul's store.

The fused forms are the seed's FusedMatMulAdd / FusedMatMulATAdd / FusedMatMulBTAdd,
generalised to a chain (``Epi``) of bias, add and unary steps. Every rule is an equality:
the unfused term stays in its e-class, and extraction decides which one pays.
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, ne, ruleset

from .dsl import equal
from .sorts import UNARY_CONSTRUCTORS, Epi, T, epilogue_without_add, last_step, shape

matmul_epilogue_ruleset = ruleset(name="matmul_epilogue")


@matmul_epilogue_ruleset.register
def _matmul_as_fused(a: T, b: T):
    # MatMul(a,b) -> FusedMatMul("",a,b,[])   (an empty epilogue, so the rules below chain)
    yield equal("MatMul(a,b) -> FusedMatMul(a,b,[])", T.matmul(a, b), T.fused_matmul("", a, b, Epi.none()))
    # MatMulAT(a,b) -> FusedMatMul("AT",a,b,[])
    yield equal("MatMulAT(a,b) -> FusedMatMulAT(a,b,[])", T.matmul_at(a, b),
                T.fused_matmul("AT", a, b, Epi.none()))
    # MatMulBT(a,b) -> FusedMatMul("BT",a,b,[])
    yield equal("MatMulBT(a,b) -> FusedMatMulBT(a,b,[])", T.matmul_bt(a, b),
                T.fused_matmul("BT", a, b, Epi.none()))


@matmul_epilogue_ruleset.register
def _fold_add(mm: T, d: T, a: T, b: T, v: String, e: Epi, s: Vec[i64], sd: Vec[i64]):
    fused = T.fused_matmul(v, a, b, e)
    # BiasAdd(FusedMatMul(v,a,b,e), d) -> FusedMatMul(v,a,b,e+[bias d])
    yield equal("BiasAdd(FusedMatMul(a,b,e), d) -> FusedMatMul(a,b,e+[bias d])",
                T.bias_add(fused, d), T.fused_matmul(v, a, b, Epi.bias(e, d)))
    # Add(FusedMatMul(v,a,b,e), d) -> FusedMatMul(v,a,b,e+[add d])   if shape(d) = shape(mm), e has no add
    # Add(d, FusedMatMul(v,a,b,e)) -> the same   (an addend that would enlarge the output never matches;
    # one residual add per epilogue keeps a residual stream from chaining every layer into one term)
    for label, add in (("Add(FusedMatMul(a,b,e), d)", T.add(mm, d)), ("Add(d, FusedMatMul(a,b,e))", T.add(d, mm))):
        yield equal(f"{label} -> FusedMatMul(a,b,e+[add d])", add, T.fused_matmul(v, a, b, Epi.add(e, d)),
                    eq(mm).to(fused), eq(shape(mm)).to(s), eq(shape(d)).to(s), epilogue_without_add(e))
    # Add(FusedMatMul(v,a,b,e), d[1,N]) -> FusedMatMul(v,a,b,e+[bias d])   if shape(mm) = [M,N], M > 1
    # (with M = 1 the addend is a residual of the same shape: the add rule above covers it, once)
    for label, add in (("Add(FusedMatMul(a,b,e), d[1,N])", T.add(mm, d)),
                       ("Add(d[1,N], FusedMatMul(a,b,e))", T.add(d, mm))):
        yield equal(f"{label} -> FusedMatMul(a,b,e+[bias d])", add, T.fused_matmul(v, a, b, Epi.bias(e, d)),
                    eq(mm).to(fused), eq(shape(mm)).to(s), eq(shape(d)).to(sd), eq(sd).to(Vec(i64(1), s[1])),
                    s[0] > i64(1))


@matmul_epilogue_ruleset.register
def _fold_unary(a: T, b: T, v: String, e: Epi, last: String):
    # U(FusedMatMul(v,a,b,e)) -> FusedMatMul(v,a,b,e+[U])   for U in Relu, Sigmoid, Tanh, Neg, Gelu, GeluTanh, Silu,
    # unless e already ends with U: with Relu(Relu(x)) = Relu(x) or Neg(Neg(x)) = x in the e-graph a
    # class contains U of itself, and folding U again would grow the chain forever
    for op, ctor in UNARY_CONSTRUCTORS.items():
        yield equal(f"{op}(FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[{op}])", ctor(T.fused_matmul(v, a, b, e)),
                    T.fused_matmul(v, a, b, Epi.act(e, op)), eq(last_step(e)).to(last), ne(last).to(String(op)))
