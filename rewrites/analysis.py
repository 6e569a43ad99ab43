"""Shape analysis: facts about e-classes, saturated before any optimisation rule runs.

Every node inserted from a graph gets its shape from the IR (the IR's shape rules are the
authority); the rules here derive the shape of terms that optimisation rules create, and
``numel`` (element count, what the cost model reads) from every shape.
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, rule, ruleset, set_

from .sorts import UNARY_CONSTRUCTORS, Epi, T, args, epilogue_without_add, last_step, numel, shape

shape_analysis_ruleset = ruleset(name="shape_analysis")


@shape_analysis_ruleset.register
def _leaf_shapes(t: T, name: String, s: Vec[i64], x: T):
    # input/parameter/constant(name, s) : s
    for leaf in (T.input, T.parameter, T.constant):
        yield rule(eq(t).to(leaf(name, s)), name=f"shape({leaf}(n, s)) = s").then(set_(shape(t)).to(s))
    # reshape(x, s) : s
    yield rule(eq(t).to(T.reshape(x, s)), name="shape(Reshape(x, s)) = s").then(set_(shape(t)).to(s))


@shape_analysis_ruleset.register
def _matmul_shapes(t: T, a: T, b: T, v: String, e: Epi, sa: Vec[i64], sb: Vec[i64]):
    # matmul(a[M,K], b[K,N]) : [M,N]; matmul_at(a[K,M], b[K,N]) : [M,N]; matmul_bt(a[M,K], b[N,K]) : [M,N]
    rules = (
        (T.matmul(a, b), lambda: Vec(sa[0], sb[1])),
        (T.matmul_at(a, b), lambda: Vec(sa[1], sb[1])),
        (T.matmul_bt(a, b), lambda: Vec(sa[0], sb[0])),
        (T.fused_matmul("", a, b, e), lambda: Vec(sa[0], sb[1])),
        (T.fused_matmul("AT", a, b, e), lambda: Vec(sa[1], sb[1])),
        (T.fused_matmul("BT", a, b, e), lambda: Vec(sa[0], sb[0])),
    )
    for (term, out), label in zip(rules, ("MatMul", "MatMulAT", "MatMulBT", "FusedMatMul", "FusedMatMulAT",
                                          "FusedMatMulBT"), strict=True):
        yield rule(eq(t).to(term), eq(shape(a)).to(sa), eq(shape(b)).to(sb), name=f"shape({label}(a, b))").then(
            set_(shape(t)).to(out()))


@shape_analysis_ruleset.register
def _elementwise_shapes(t: T, a: T, b: T, sa: Vec[i64]):
    # u(a) : shape(a) for unary elementwise u; swiglu(a, b) : shape(a)
    for ctor in (*UNARY_CONSTRUCTORS.values(), T.softmax):
        yield rule(eq(t).to(ctor(a)), eq(shape(a)).to(sa), name=f"shape({ctor}(a)) = shape(a)").then(
            set_(shape(t)).to(sa))
    yield rule(eq(t).to(T.swiglu(a, b)), eq(shape(a)).to(sa), name="shape(SwiGLU(a, b)) = shape(a)").then(
        set_(shape(t)).to(sa))
    # add(a, b), mul(a, b) with equal shapes : shape(a) (broadcasts are set from the IR)
    for ctor in (T.add, T.mul):
        yield rule(eq(t).to(ctor(a, b)), eq(shape(a)).to(sa), eq(shape(b)).to(sa),
                   name=f"shape({ctor}(a, b)) = shape(a) if shape(b) = shape(a)").then(set_(shape(t)).to(sa))


@shape_analysis_ruleset.register
def _packing_shapes(t: T, a: T, b: T, c: T, sa: Vec[i64], sb: Vec[i64], sc: Vec[i64], start: i64, size: i64):
    # The packed weights the rules create (2-D); a Concat from the graph has its IR shape.
    # concat(0, [a, b]) : [rows(a)+rows(b), cols(a)]; concat(1, [a, b]) : [rows(a), cols(a)+cols(b)]
    yield rule(eq(t).to(T.concat(0, args(a, b))), eq(shape(a)).to(sa), eq(shape(b)).to(sb),
               name="shape(Concat0(a, b))").then(
        set_(shape(t)).to(Vec(sa[0] + sb[0], sa[1])))
    yield rule(eq(t).to(T.concat(1, args(a, b))), eq(shape(a)).to(sa), eq(shape(b)).to(sb),
               name="shape(Concat1(a, b))").then(
        set_(shape(t)).to(Vec(sa[0], sa[1] + sb[1])))
    # concat(0, [a, b, c]) : [rows(a)+rows(b)+rows(c), cols(a)]
    yield rule(eq(t).to(T.concat(0, args(a, b, c))), eq(shape(a)).to(sa), eq(shape(b)).to(sb),
               eq(shape(c)).to(sc), name="shape(Concat0(a, b, c))").then(
        set_(shape(t)).to(Vec(sa[0] + sb[0] + sc[0], sa[1])))
    # slice_cols(a, start, size) : [rows(a), size]
    yield rule(eq(t).to(T.slice_cols(a, start, size)), eq(shape(a)).to(sa),
               name="shape(SliceCols(a, start, size))").then(
        set_(shape(t)).to(Vec(sa[0], size)))
    # swiglu_concat(a) : [rows(a), cols(a)/2]
    yield rule(eq(t).to(T.swiglu_concat(a)), eq(shape(a)).to(sa), name="shape(SwiGLUConcat(a))").then(
        set_(shape(t)).to(Vec(sa[0], sa[1] / 2)))


@shape_analysis_ruleset.register
def _epilogue_facts(e: Epi, inner: Epi, d: T, op: String):
    # epilogue_without_add(e): the chain e has no residual-add step (so at most one is folded)
    yield rule(eq(e).to(Epi.none()), name="epilogue_without_add([])").then(epilogue_without_add(e))
    yield rule(eq(e).to(Epi.bias(inner, d)), epilogue_without_add(inner),
               name="epilogue_without_add(e+[bias d])").then(epilogue_without_add(e))
    yield rule(eq(e).to(Epi.act(inner, op)), epilogue_without_add(inner),
               name="epilogue_without_add(e+[U])").then(epilogue_without_add(e))
    # last_step(e): the name of e's last step ("" for an empty epilogue)
    yield rule(eq(e).to(Epi.none()), name="last_step([])").then(set_(last_step(e)).to(String("")))
    yield rule(eq(e).to(Epi.bias(inner, d)), name="last_step(e+[bias d])").then(set_(last_step(e)).to(String("bias")))
    yield rule(eq(e).to(Epi.add(inner, d)), name="last_step(e+[add d])").then(set_(last_step(e)).to(String("add")))
    yield rule(eq(e).to(Epi.act(inner, op)), name="last_step(e+[U])").then(set_(last_step(e)).to(op))


@shape_analysis_ruleset.register
def _numel(t: T, s: Vec[i64]):
    # numel(t) = product of shape(t), ranks 1..4
    yield rule(eq(shape(t)).to(s), eq(s.length()).to(i64(1)), name="numel, rank 1").then(set_(numel(t)).to(s[0]))
    yield rule(eq(shape(t)).to(s), eq(s.length()).to(i64(2)), name="numel, rank 2").then(
        set_(numel(t)).to(s[0] * s[1]))
    yield rule(eq(shape(t)).to(s), eq(s.length()).to(i64(3)), name="numel, rank 3").then(
        set_(numel(t)).to(s[0] * s[1] * s[2]))
    yield rule(eq(shape(t)).to(s), eq(s.length()).to(i64(4)), name="numel, rank 4").then(
        set_(numel(t)).to(s[0] * s[1] * s[2] * s[3]))
