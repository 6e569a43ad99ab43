"""The matmul family: MatMul, MatMulAT, MatMulBT, and the fused forms the rewrite engine
introduces, FusedMatMul (an epilogue chain folded into the store), FusedRmsNormMatMul
(RmsNorm as the matmul's prologue) and FusedSwiGLUMatMul (SwiGLUConcat computed as A is loaded),
with the rules that introduce them.

The fused forms are the seed's FusedMatMulAdd / FusedMatMulATAdd / FusedMatMulBTAdd and
FusedRmsNormMatMul, generalised to a chain of bias, add and unary steps (the ``epilogue``
attribute; in the e-graph an ``Epi`` term). Every rule is an equality: the unfused term stays
in its e-class, and extraction decides which one pays. All six ops share one kernel builder
(:mod:`.matmul_kernel`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import GraphError
from ..spec import Attr, example, need, need_f32, op, rules
from ..types import TensorType
from .elementwise import UNARY_BY_NAME, bias_grad
from .fused_epilogue import apply_expr, check_expr, epilogue_ops, expr_operands, is_expr, no_expr_grad, step_label
from .matmul_kernel import EPILOGUE_BINARY, GEMV_MAX_ROWS, matmul_kernel

FAMILY = "matmul"

_VARIANT_OF = {"MatMul": "", "MatMulAT": "AT", "MatMulBT": "BT"}
_OP_OF = {v: k for k, v in _VARIANT_OF.items()}


def matmul_dims(ts: list[TensorType], variant: str) -> tuple[int, int, int]:
    """(M, K, N) of ``op(A) @ op(B)`` for ``variant``; ShapeError when the operands do not fit."""
    need(variant in ("", "AT", "BT"), f"variant must be '', 'AT' or 'BT', got {variant!r}")
    a, b = ts[0], ts[1]
    need_f32(a, "A")
    need_f32(b, "B")
    if a.rank != 2 or b.rank != 2:  # messages built only when raised: this runs for every matmul priced
        need(False, f"needs 2-D operands, got A {a} and B {b}: reshape a batch of rows to [B*S, K] first, or "
                    "use BatchMatMul (g.add_node('BatchMatMul', ...)) for a product per batch")
    if variant == "AT":  # C = A^T B, A [K,M], B [K,N]
        (k, m), (k2, n) = a.shape, b.shape
    elif variant == "BT":  # C = A B^T, A [M,K], B [N,K]
        (m, k), (n, k2) = a.shape, b.shape
    else:
        (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        need(False, f"inner dimensions differ: A {a}, B {b} (variant {variant or 'plain'})")
    return m, k, n


def matmul_ref(a, b, variant: str):
    if variant == "AT":
        return a.T @ b
    if variant == "BT":
        return a @ b.T
    return a @ b


def _flops(variant_of: Callable[[dict], str], first: int = 0):
    def flops(ins, out, attrs):
        m, k, n = matmul_dims(ins[first:first + 2], variant_of(attrs))
        return 2 * m * k * n + out.num_elements * epilogue_ops(attrs.get("epilogue", ()))

    return flops


def matmul_grads(b, variant: str, get_a: Callable[[], int], w: int, dc: int, want_a: bool, want_b: bool) -> list:
    """dA, dB of C = A op B (op by ``variant``), each itself a MatMul/AT/BT."""
    if variant == "":  # C = A B: dA = dC B^T, dB = A^T dC
        da = b.emit("MatMulBT", (dc, w)) if want_a else None
        db = b.emit("MatMulAT", (get_a(), dc)) if want_b else None
    elif variant == "AT":  # C = A^T B: dA = B dC^T, dB = A dC
        da = b.emit("MatMulBT", (w, dc)) if want_a else None
        db = b.emit("MatMul", (get_a(), dc)) if want_b else None
    elif variant == "BT":  # C = A B^T: dA = dC B, dB = dC^T A
        da = b.emit("MatMul", (dc, w)) if want_a else None
        db = b.emit("MatMulAT", (dc, get_a())) if want_b else None
    else:  # the shape rule lets no other variant through; refuse to guess
        raise GraphError(f"grad: unknown matmul variant {variant!r}")
    return [da, db]


for _name, _variant in _VARIANT_OF.items():
    op(_name, ("a", "b"), (lambda v: lambda ts, a: TensorType(matmul_dims(ts, v)[0::2]))(_variant),
       (lambda v: lambda xs, a: matmul_ref(xs[0], xs[1], v))(_variant),
       doc={"": "C[M,N] = A[M,K] @ B[K,N]", "AT": "C[M,N] = A[K,M]^T @ B[K,N]",
            "BT": "C[M,N] = A[M,K] @ B[N,K]^T"}[_variant],
       vjp=(lambda v: lambda b, node, dy, want: matmul_grads(b, v, lambda: node.inputs[0], node.inputs[1], dy,
                                                             *want))(_variant),
       kernel=matmul_kernel, flops=_flops((lambda v: lambda a: v)(_variant)))


# --- FusedMatMul: C = epilogue(A op B) ------------------------------------------------------


def check_epilogue(m: int, n: int, epilogue, operands: list[TensorType]) -> None:
    """ShapeError unless every binary step of ``epilogue`` has an operand of its shape, every
    generated region (``fused_epilogue.py``) its operands and the output's type, and every other
    step is a unary op that may be an epilogue step."""
    extra = list(operands)
    for step in epilogue:
        if is_expr(step):
            k = expr_operands(step)
            need(len(extra) >= k, f"epilogue step {step_label(step)} reads {k} operands, {len(extra)} are left")
            check_expr(step, TensorType((m, n)), extra[:k])
            del extra[:k]
        elif step in EPILOGUE_BINARY:
            need(bool(extra), f"epilogue step {step} has no operand")
            t = extra.pop(0)
            want = ((n,), (1, n)) if step == "bias" else ((m, n),)
            need(t.shape in want, f"epilogue {step} operand must be {' or '.join(map(str, want))}, got {t}")
        else:
            need(step in UNARY_BY_NAME and UNARY_BY_NAME[step].epilogue, f"unknown epilogue step {step!r}")
    need(not extra, f"{len(extra)} epilogue operands left unused")


def _fused_matmul(ts, a):
    m, _, n = matmul_dims(ts, a["variant"])
    check_epilogue(m, n, a["epilogue"], ts[2:])
    return TensorType((m, n))


def apply_epilogue(c, epilogue, operands):
    """Apply an epilogue chain to a matmul result ``c`` [M,N] (reference semantics)."""
    operands = list(operands)
    for step in epilogue:
        if is_expr(step):
            k = expr_operands(step)
            c = apply_expr(step, c, operands[:k])
            del operands[:k]
        elif step == "bias":
            c = c + operands.pop(0).reshape(1, -1)
        elif step == "add":
            c = c + operands.pop(0)
        else:
            c = UNARY_BY_NAME[step].fn(c)
    return c


def _epilogue_vjp(b, node, n_fixed: int, get_a: Callable[[], int], w: int, dy: int, want: tuple[bool, ...]) -> list:
    """Gradients [dA, dW, *d operands] of epilogue(A op W); ``node`` holds ``n_fixed`` leading inputs.

    The chain is walked backwards (``bias`` -> SumRows, ``add`` -> pass-through, unary ->
    ``<Op>Grad``); the pre-activation a unary step's gradient reads is recomputed as the same
    fused op with the epilogue cut before that step."""
    epilogue, variant = tuple(node.attrs["epilogue"]), node.attrs["variant"]
    no_expr_grad(epilogue, node.op)
    operands = list(node.inputs[n_fixed:])
    slot = []  # operand index of each binary step, None for unary ones
    for step in epilogue:
        slot.append(sum(s is not None for s in slot) if step in EPILOGUE_BINARY else None)
    stop = 0  # the earliest step the backward walk must reach
    if not (want[0] or want[1]):
        stop = min((i for i, k in enumerate(slot) if k is not None and want[2 + k]), default=len(epilogue))
    pre = _pre_activations(b, node, n_fixed, slot, [i for i in range(stop, len(epilogue))
                                                    if epilogue[i] not in EPILOGUE_BINARY and epilogue[i] != "Neg"])
    dz, d_ops = dy, [None] * len(operands)
    for i in range(len(epilogue) - 1, stop - 1, -1):
        step, k = epilogue[i], slot[i]
        if k is not None:
            if want[2 + k]:
                d_ops[k] = dz if step == "add" else bias_grad(b, dz, operands[k])
        elif step == "Neg":
            dz = b.emit("Neg", (dz,))
        else:
            dz = b.emit(f"{step}Grad", (dz, pre[i]))
    return [*matmul_grads(b, variant, get_a, w, dz, want[0], want[1]), *d_ops]


def _pre_activations(b, node, n_fixed: int, slot: list, steps: list[int]) -> dict[int, int]:
    """Input of each epilogue step in ``steps``: the fused op cut before the first, then unfused ops."""
    if not steps:
        return {}
    epilogue, first = tuple(node.attrs["epilogue"]), steps[0]
    n_ops = sum(k is not None for k in slot[:first])
    head = node.inputs[:n_fixed]
    if node.op == "FusedMatMul" and first == 0:
        cur = b.emit(_OP_OF[node.attrs["variant"]], head)
    else:
        cur = b.emit(node.op, (*head, *node.inputs[n_fixed:n_fixed + n_ops]),
                     **{**node.attrs, "epilogue": epilogue[:first]})
    values = {first: cur}
    for i in range(first, steps[-1]):
        step = epilogue[i]
        if step == "bias":
            cur = b.emit("BiasAdd", (cur, node.inputs[n_fixed + slot[i]]))
        elif step == "add":
            cur = b.emit("Add", (cur, node.inputs[n_fixed + slot[i]]))
        else:
            cur = b.emit(step, (cur,))
        values[i + 1] = cur
    return values


op("FusedMatMul", ("a", "b", "*operands"), _fused_matmul,
   lambda xs, a: apply_epilogue(matmul_ref(xs[0], xs[1], a["variant"]), a["epilogue"], xs[2:]),
   attrs=(Attr("variant", "str"), Attr("epilogue", "epilogue")),
   doc="C = epilogue(A op B): variant '' | 'AT' | 'BT', epilogue a tuple of steps (bias, add or a unary op "
       "name) applied in order at the store; inputs [A, B, *operands]",
   vjp=lambda b, node, dy, want: _epilogue_vjp(b, node, 2, lambda: node.inputs[0], node.inputs[1], dy, want),
   kernel=matmul_kernel, flops=_flops(lambda a: a["variant"]))


def _mm(g, dim, variant: str):
    m, k, n = dim("m"), dim("k"), dim("n")
    a = g.input("a", [k, m] if variant == "AT" else [m, k])
    b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
    return g.add_node(_OP_OF[variant], (a, b)), m, n


def _out(g, *ids):
    g.set_outputs(list(ids))


@rules("analysis")
def _epilogue_facts(e):
    ep, inner = e.vars("e inner", e.Epi)
    (d,) = e.vars("d")
    (step,) = e.vars("step", e.String)
    Epi = e.Epi
    # epilogue_without_add(e): the chain e has no residual-add step (so at most one is folded)
    yield e.rule(e.eq(ep).to(Epi.none()), name="epilogue_without_add([])").then(e.epilogue_without_add(ep))
    yield e.rule(e.eq(ep).to(Epi.bias(inner, d)), e.epilogue_without_add(inner),
                 name="epilogue_without_add(e+[bias d])").then(e.epilogue_without_add(ep))
    yield e.rule(e.eq(ep).to(Epi.act(inner, step)), e.epilogue_without_add(inner),
                 name="epilogue_without_add(e+[U])").then(e.epilogue_without_add(ep))
    # epilogue_blocks_add(e): e has an add step, or a generated region, somewhere (where
    # epilogue_without_add does not hold: the chain's add step cannot take another addend)
    (x,) = e.vars("x", e.Ex)
    yield e.rule(e.eq(ep).to(Epi.add(inner, d)), name="epilogue_blocks_add(e+[add d])").then(
        e.epilogue_blocks_add(ep))
    yield e.rule(e.eq(ep).to(Epi.ex(inner, x)), name="epilogue_blocks_add(e+[ex x])").then(e.epilogue_blocks_add(ep))
    yield e.rule(e.eq(ep).to(Epi.bias(inner, d)), e.epilogue_blocks_add(inner),
                 name="epilogue_blocks_add(e+[bias d])").then(e.epilogue_blocks_add(ep))
    yield e.rule(e.eq(ep).to(Epi.act(inner, step)), e.epilogue_blocks_add(inner),
                 name="epilogue_blocks_add(e+[U])").then(e.epilogue_blocks_add(ep))
    # epilogue_without_region(e): e has only bias, add and unary steps (no generated region)
    yield e.rule(e.eq(ep).to(Epi.none()), name="epilogue_without_region([])").then(e.epilogue_without_region(ep))
    for kind, make in (("bias d", lambda: Epi.bias(inner, d)), ("add d", lambda: Epi.add(inner, d)),
                       ("U", lambda: Epi.act(inner, step))):
        yield e.rule(e.eq(ep).to(make()), e.epilogue_without_region(inner),
                     name=f"epilogue_without_region(e+[{kind}])").then(e.epilogue_without_region(ep))
    # last_step(e): the name of e's last step ("" for an empty epilogue)
    yield e.rule(e.eq(ep).to(Epi.none()), name="last_step([])").then(e.set_(e.last_step(ep)).to(e.String("")))
    yield e.rule(e.eq(ep).to(Epi.bias(inner, d)), name="last_step(e+[bias d])").then(
        e.set_(e.last_step(ep)).to(e.String("bias")))
    yield e.rule(e.eq(ep).to(Epi.add(inner, d)), name="last_step(e+[add d])").then(
        e.set_(e.last_step(ep)).to(e.String("add")))
    yield e.rule(e.eq(ep).to(Epi.act(inner, step)), name="last_step(e+[U])").then(e.set_(e.last_step(ep)).to(step))
    yield e.rule(e.eq(ep).to(Epi.ex(inner, x)), name="last_step(e+[ex x])").then(
        e.set_(e.last_step(ep)).to(e.String("ex")))


@rules("matmul_epilogue")
def _matmul_as_fused(e):
    a, b = e.vars("a b")
    # MatMul(a,b) -> FusedMatMul("",a,b,[])   (an empty epilogue, so the rules below chain)
    # MatMulAT(a,b) -> FusedMatMul("AT",a,b,[]);  MatMulBT(a,b) -> FusedMatMul("BT",a,b,[])
    for name, variant in _VARIANT_OF.items():
        fused = "FusedMatMul" + variant
        yield e.equal(f"{name}(a,b) -> {fused}(a,b,[])", getattr(e, name)(a, b),
                      e.FusedMatMul(a, b, variant=variant, epilogue=e.Epi.none()),
                      example=example((lambda v: lambda g, dim: _out(g, _mm(g, dim, v)[0]))(variant)))


@rules("matmul_epilogue")
def _fold_add(e):
    mm, d, a, b = e.vars("mm d a b")
    (v,) = e.vars("v", e.String)
    (ep,) = e.vars("e", e.Epi)
    s, sd = e.vars("s sd", e.Vec[e.i64])
    fused = e.FusedMatMul(a, b, variant=v, epilogue=ep)
    # BiasAdd(FusedMatMul(v,a,b,e), d) -> FusedMatMul(v,a,b,e+[bias d])
    yield e.equal("BiasAdd(FusedMatMul(a,b,e), d) -> FusedMatMul(a,b,e+[bias d])",
                  e.BiasAdd(fused, d), e.FusedMatMul(a, b, variant=v, epilogue=e.Epi.bias(ep, d)),
                  example=example(lambda g, dim: _out(g, g.bias_add((m := _mm(g, dim, "BT"))[0],
                                                                    g.parameter("d", [m[2]])))))
    # Add(FusedMatMul(v,a,b,e), d) -> FusedMatMul(v,a,b,e+[add d])   if shape(d) = shape(mm), e has no add
    # Add(d, FusedMatMul(v,a,b,e)) -> the same   (an addend that would enlarge the output never matches;
    # one residual add per epilogue keeps a residual stream from chaining every layer into one term)
    examples = {"Add(FusedMatMul(a,b,e), d)": lambda g, dim: _out(g, g.add((m := _mm(g, dim, "AT"))[0],
                                                                          g.input("d", [m[1], m[2]]))),
                "Add(d, FusedMatMul(a,b,e))": lambda g, dim: _out(g, g.add(g.input("d", [dim("m"), dim("n")]),
                                                                          _mm(g, dim, "")[0]))}
    for label, add in (("Add(FusedMatMul(a,b,e), d)", e.Add(mm, d)), ("Add(d, FusedMatMul(a,b,e))", e.Add(d, mm))):
        yield e.equal(f"{label} -> FusedMatMul(a,b,e+[add d])", add,
                      e.FusedMatMul(a, b, variant=v, epilogue=e.Epi.add(ep, d)),
                      e.eq(mm).to(fused), e.eq(e.shape(mm)).to(s), e.eq(e.shape(d)).to(s), e.epilogue_without_add(ep),
                      example=example(examples[label]))
    # Add(FusedMatMul(v,a,b,e), d[1,N]) -> FusedMatMul(v,a,b,e+[bias d])   if shape(mm) = [M,N], M > 1
    # (with M = 1 the addend is a residual of the same shape: the add rule above covers it, once)
    examples = {"Add(FusedMatMul(a,b,e), d[1,N])": lambda g, dim: _out(g, g.add((m := _mm(g, dim, ""))[0],
                                                                               g.parameter("d", [1, m[2]]))),
                "Add(d[1,N], FusedMatMul(a,b,e))": lambda g, dim: _out(g, g.add(g.parameter("d", [1, dim("n")]),
                                                                               _mm(g, dim, "BT")[0]))}
    for label, add in (("Add(FusedMatMul(a,b,e), d[1,N])", e.Add(mm, d)),
                       ("Add(d[1,N], FusedMatMul(a,b,e))", e.Add(d, mm))):
        yield e.equal(f"{label} -> FusedMatMul(a,b,e+[bias d])", add,
                      e.FusedMatMul(a, b, variant=v, epilogue=e.Epi.bias(ep, d)),
                      e.eq(mm).to(fused), e.eq(e.shape(mm)).to(s), e.eq(e.shape(d)).to(sd),
                      e.eq(sd).to(e.Vec(e.i64(1), s[1])), s[0] > e.i64(1), example=example(examples[label]))


def _unary_example(name: str):
    method = {"GeluTanh": lambda g, x: g.gelu(x, "tanh")}.get(name, lambda g, x: g.add_node(name, (x,)))
    variant = "" if name == "GeluTanh" else "BT"
    return example(lambda g, dim: _out(g, method(g, _mm(g, dim, variant)[0])))


@rules("matmul_epilogue")
def _fold_unary(e):
    from ..spec import OPS

    a, b = e.vars("a b")
    v, last = e.vars("v last", e.String)
    (ep,) = e.vars("e", e.Epi)
    # U(FusedMatMul(v,a,b,e)) -> FusedMatMul(v,a,b,e+[U])   for every unary op that may be an epilogue
    # step, unless e already ends with U: with Relu(Relu(x)) = Relu(x) or Neg(Neg(x)) = x in the
    # e-graph a class contains U of itself, and folding U again would grow the chain forever; nor
    # when e ends with a generated region, which U joins instead (epilogue_rules.py): one form, not two
    for name in (n for n, spec in OPS.items() if spec.epilogue_step):
        yield e.equal(f"{name}(FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[{name}])",
                      getattr(e, name)(e.FusedMatMul(a, b, variant=v, epilogue=ep)),
                      e.FusedMatMul(a, b, variant=v, epilogue=e.Epi.act(ep, name)),
                      e.eq(e.last_step(ep)).to(last), e.ne(last).to(e.String(name)), e.ne(last).to(e.String("ex")),
                      example=_unary_example(name))


# --- FusedRmsNormMatMul: C = epilogue(RmsNorm(x, w_norm) op W) ------------------------------


def _fused_rms_norm_matmul(ts, a):
    x, w_norm = ts[0], ts[1]
    need_f32(x, "x")
    need_f32(w_norm, "w_norm")
    need(a["variant"] in ("", "BT"), f"variant must be '' or 'BT' (x is not transposed), got {a['variant']!r}")
    need(x.rank == 2, f"x must be [M, K], got {x}")
    need(w_norm.shape == (x.shape[1],), f"w_norm must be [{x.shape[1]}] for x {x}, got {w_norm}")
    return _fused_matmul([x, *ts[2:]], a)


def _fused_rms_norm_matmul_ref(xs, a):
    from .norms import rms_norm_ref

    normed = rms_norm_ref(xs[:2], a)
    return apply_epilogue(matmul_ref(normed, xs[2], a["variant"]), a["epilogue"], xs[3:])


def _fused_rms_norm_matmul_vjp(b, node, dy, want):
    x, wn, w = node.inputs[:3]
    eps = node.attrs["eps"]
    normed = lambda: b.emit("RmsNorm", (x, wn), eps=eps)  # noqa: E731
    dn, dw, *d_ops = _epilogue_vjp(b, node, 3, normed, w, dy, (want[0] or want[1], *want[2:]))
    dx = b.emit("RmsNormGradX", (dn, x, wn), eps=eps) if want[0] else None
    dwn = b.emit("RmsNormGradW", (dn, x), eps=eps) if want[1] else None
    return [dx, dwn, dw, *d_ops]


def _rms_flops(ins, out, attrs):
    m, k, n = matmul_dims([ins[0], ins[2]], attrs["variant"])
    return 2 * m * k * n + 3 * m * k + out.num_elements * epilogue_ops(attrs["epilogue"])


op("FusedRmsNormMatMul", ("x", "w_norm", "w", "*operands"), _fused_rms_norm_matmul, _fused_rms_norm_matmul_ref,
   attrs=(Attr("eps", "float", minimum=0.0), Attr("variant", "str", ""), Attr("epilogue", "epilogue", ())),
   doc="C = epilogue(RmsNorm(x, w_norm, eps) op W); inputs [x, w_norm, W, *epilogue operands]; the seed's "
       "FusedRmsNormMatMul with a matmul variant and an epilogue chain",
   vjp=_fused_rms_norm_matmul_vjp, kernel=matmul_kernel, flops=_rms_flops)


def _rms_mm_example(variant: str):
    def build(g, dim):
        x = g.rms_norm(g.input("x", [dim("m"), dim("k")]), g.parameter("w", [dim("k")]))
        if variant == "BT":
            _out(g, g.relu(g.matmul_bt(x, g.parameter("W", [dim("n"), dim("k")]))))
        else:
            _out(g, g.matmul(x, g.parameter("W", [dim("k"), dim("n")])))

    return example(build)


@rules("norm_fusion")
def _rms_norm_matmul(e):
    x, w, wp = e.vars("x w wp")
    (ep,) = e.vars("e", e.Epi)
    (eps,) = e.vars("eps", e.f64)
    # FusedMatMul(RmsNorm(x, w), W, e) -> FusedRmsNormMatMul(x, w, W, e)   (W [K,N], or [N,K] for BT)
    for v in ("", "BT"):
        yield e.equal(f"FusedMatMul{v}(RmsNorm(x,w), W, e) -> FusedRmsNormMatMul{v}(x, w, W, e)",
                      e.FusedMatMul(e.RmsNorm(x, w, eps=eps), wp, variant=v, epilogue=ep),
                      e.FusedRmsNormMatMul(x, w, wp, eps=eps, variant=v, epilogue=ep), example=_rms_mm_example(v))


# --- FusedLayerNormMatMul: C = epilogue(LayerNorm(x, gamma, beta) op W) ------------------------


def _fused_layer_norm_matmul(ts, a):
    x, gamma, beta = ts[:3]
    for t, what in ((x, "x"), (gamma, "gamma"), (beta, "beta")):
        need_f32(t, what)
    need(a["variant"] in ("", "BT"), f"variant must be '' or 'BT' (x is not transposed), got {a['variant']!r}")
    need(x.rank == 2, f"x must be [M, K], got {x}")
    need(gamma.shape == beta.shape == (x.shape[1],), f"gamma and beta must be [{x.shape[1]}] for x {x}, got {gamma} "
         f"and {beta}")
    return _fused_matmul([x, *ts[3:]], a)


def _fused_layer_norm_matmul_ref(xs, a):
    from .norms import _layer_norm_ref

    return apply_epilogue(matmul_ref(_layer_norm_ref(xs[:3], a), xs[3], a["variant"]), a["epilogue"], xs[4:])


def _fused_layer_norm_matmul_vjp(b, node, dy, want):
    x, gamma, beta, w = node.inputs[:4]
    eps = node.attrs["eps"]
    normed = lambda: b.emit("LayerNorm", (x, gamma, beta), eps=eps)  # noqa: E731
    dn, dw, *d_ops = _epilogue_vjp(b, node, 4, normed, w, dy, (any(want[:3]), *want[3:]))
    dx = b.emit("LayerNormGradX", (dn, x, gamma), eps=eps) if want[0] else None
    dg = b.emit("LayerNormGradW", (dn, x), eps=eps) if want[1] else None
    return [dx, dg, bias_grad(b, dn, beta) if want[2] else None, dw, *d_ops]


def _layer_norm_flops(ins, out, attrs):
    m, k, n = matmul_dims([ins[0], ins[3]], attrs["variant"])
    return 2 * m * k * n + 7 * m * k + out.num_elements * epilogue_ops(attrs["epilogue"])


op("FusedLayerNormMatMul", ("x", "gamma", "beta", "w", "*operands"), _fused_layer_norm_matmul,
   _fused_layer_norm_matmul_ref,
   attrs=(Attr("eps", "float", minimum=0.0), Attr("variant", "str", ""), Attr("epilogue", "epilogue", ())),
   doc="C = epilogue(LayerNorm(x, gamma, beta, eps) op W) (Ba et al. 2016: biased variance); inputs [x [M, K], "
       "gamma [K], beta [K], W [K, N] or [N, K] for 'BT', *epilogue operands]: a pre-LN transformer's norm as the "
       "next product's prologue (the tiled kernel normalises each row of A as it is loaded, from the row's mean "
       "and variance taken in a first pass over the row; products of at most GEMV_MAX_ROWS rows take the LayerNorm "
       "kernel into a scratch buffer, then the GEMV)",
   vjp=_fused_layer_norm_matmul_vjp, kernel=matmul_kernel, flops=_layer_norm_flops)


def _ln_mm_example(variant: str):
    def build(g, dim):
        k = dim("k")  # more rows than GEMV_MAX_ROWS, where the rule applies
        x = g.layer_norm(g.input("x", [dim("m", GEMV_MAX_ROWS + 1), k]), g.parameter("g", [k]), g.parameter("b", [k]))
        if variant == "BT":
            _out(g, g.relu(g.matmul_bt(x, g.parameter("W", [dim("n"), k]))))
        else:
            _out(g, g.matmul(x, g.parameter("W", [k, dim("n")])))

    return example(build)


@rules("layer_norm_prologue")
def _layer_norm_matmul(e):
    x, gamma, beta, wp = e.vars("x gamma beta wp")
    (ep,) = e.vars("e", e.Epi)
    (eps,) = e.vars("eps", e.f64)
    (s,) = e.vars("s", e.Vec[e.i64])
    # FusedMatMul(LayerNorm(x, g, b), W, e) -> FusedLayerNormMatMul(x, g, b, W, e)   (W [K,N], or [N,K] for BT)
    # if x has more than GEMV_MAX_ROWS rows: on fewer, the GEMV's form runs the LayerNorm kernel into scratch
    # before the product, no fewer dispatches than the norm's own, and once for each product that reads it.
    # An optional ruleset (rewrites/rulesets.py OPTIONAL): on an H200 the tiled kernel's first pass over its rows made
    # GPT-2 small's c_attn and c_fc 21% slower at 1024 rows and 48% at 128 than LayerNorm and product apart
    # (bench/results/layer_norm_prologue_h200.json).
    for v in ("", "BT"):
        yield e.equal(f"FusedMatMul{v}(LayerNorm(x,g,b), W, e) -> FusedLayerNormMatMul{v}(x, g, b, W, e)",
                      e.FusedMatMul(e.LayerNorm(x, gamma, beta, eps=eps), wp, variant=v, epilogue=ep),
                      e.FusedLayerNormMatMul(x, gamma, beta, wp, eps=eps, variant=v, epilogue=ep),
                      e.eq(e.shape(x)).to(s), s[0] > e.i64(GEMV_MAX_ROWS), example=_ln_mm_example(v))


# --- FusedSwiGLUMatMul: C = epilogue(SwiGLUConcat(x) op W) -----------------------------------


def _fused_swiglu_matmul(ts, a):
    x = ts[0]
    need_f32(x, "x")
    need(a["variant"] in ("", "BT"), f"variant must be '' or 'BT' (x is not transposed), got {a['variant']!r}")
    need(x.rank == 2 and x.shape[1] % 2 == 0, f"x must be [M, 2K] (gate and up side by side), got {x}")
    return _fused_matmul([TensorType((x.shape[0], x.shape[1] // 2), x.dtype), *ts[1:]], a)


def _fused_swiglu_matmul_ref(xs, a):
    from .elementwise import _swiglu_concat_ref

    return apply_epilogue(matmul_ref(_swiglu_concat_ref(xs[:1], {}), xs[1], a["variant"]), a["epilogue"], xs[2:])


def _fused_swiglu_matmul_vjp(b, node, dy, want):
    x, w = node.inputs[:2]
    gated = lambda: b.emit("SwiGLUConcat", (x,))  # noqa: E731
    da, dw, *d_ops = _epilogue_vjp(b, node, 2, gated, w, dy, want)
    return [None if da is None else b.emit("SwiGLUConcatGrad", (da, x)), dw, *d_ops]


def _swiglu_flops(ins, out, attrs):
    x = ins[0]
    half = TensorType((x.shape[0], x.shape[1] // 2), x.dtype)
    m, k, n = matmul_dims([half, ins[1]], attrs["variant"])
    return 2 * m * k * n + 5 * m * k + out.num_elements * epilogue_ops(attrs["epilogue"])


op("FusedSwiGLUMatMul", ("x", "w", "*operands"), _fused_swiglu_matmul, _fused_swiglu_matmul_ref,
   attrs=(Attr("variant", "str", ""), Attr("epilogue", "epilogue", ())),
   doc="C = epilogue(SwiGLUConcat(x) op W), x [M, 2K] the gate and up projections side by side; inputs "
       "[x, W, *epilogue operands]: the gated activation computed as the kernel loads its A operand (the "
       "SwiGLU of the down projection, Shazeer 2020), never stored",
   vjp=_fused_swiglu_matmul_vjp, kernel=matmul_kernel, flops=_swiglu_flops)


def _swiglu_mm_example(variant: str):
    def build(g, dim):
        x = g.swiglu_concat(g.input("x", [dim("m", 1, SWIGLU_PROLOGUE_MAX_ROWS), 2 * dim("k")]))
        if variant == "BT":
            _out(g, g.add(g.matmul_bt(x, g.parameter("W", [dim("n"), dim("k")])), g.input("r", [dim("m"), dim("n")])))
        else:
            _out(g, g.relu(g.matmul(x, g.parameter("W", [dim("k"), dim("n")]))))

    return example(build)


#: Rows of the gated activation up to which the down projection takes SwiGLU as it loads: the GEMV
#: kernel's (decode). Both kernels compute silu(gate) * up again wherever they load an element of A
#: (the tiled kernel once per tile of output columns, GEMV once per output column or quad of them),
#: which costs nothing where the time is reading W and dispatch latency (decode) and shows where it is
#: arithmetic: on an H200 (bench/models.py, a run of this change without the cap, not kept) SmolLM2's
#: 128-token prefill took 5.16 ms that way against 4.88 with SwiGLUConcat stored, while its decode
#: step went from 1.46 to 1.40-1.41 ms (242 -> 212 dispatches; bench/results/models_h200.json as of commit 5f91607).
SWIGLU_PROLOGUE_MAX_ROWS = GEMV_MAX_ROWS


@rules("swiglu")
def _swiglu_matmul(e):
    x, wp = e.vars("x wp")
    (ep,) = e.vars("e", e.Epi)
    (s,) = e.vars("s", e.Vec[e.i64])
    (gated,) = e.vars("gated")
    # FusedMatMul(SwiGLUConcat(x), W, e) -> FusedSwiGLUMatMul(x, W, e)   (W [K,N], or [N,K] for BT)
    #   if the product has at most SWIGLU_PROLOGUE_MAX_ROWS rows (its shape: x, a packed projection a rule
    #   built, may have no shape fact) and the product is the gated value's only reader from memory
    #   (stored_uses 1; a training step's weight gradient or a graph output reads it too, so it is stored
    #   anyway and the fused op would only read both halves instead of it)
    for v in ("", "BT"):
        lhs = e.FusedMatMul(gated, wp, variant=v, epilogue=ep)
        yield e.equal(f"FusedMatMul{v}(SwiGLUConcat(x), W, e) -> FusedSwiGLUMatMul{v}(x, W, e)", lhs,
                      e.FusedSwiGLUMatMul(x, wp, variant=v, epilogue=ep), e.eq(gated).to(e.SwiGLUConcat(x)),
                      e.eq(e.stored_uses(gated)).to(e.i64(1)), e.eq(e.shape(lhs)).to(s),
                      s[0] <= e.i64(SWIGLU_PROLOGUE_MAX_ROWS), example=_swiglu_mm_example(v))


# --- Transpose folded into the matmul's operand order -----------------------------------------


def _transposed_operand_example(op_name: str, side: str):
    def build(g, dim):
        m, k, n = dim("m"), dim("k"), dim("n")
        shapes = {"MatMul": ([m, k], [k, n]), "MatMulBT": ([m, k], [n, k]), "MatMulAT": ([k, m], [k, n])}[op_name]
        if side == "a":
            a, b = g.transpose(g.input("a", shapes[0][::-1])), g.parameter("b", shapes[1])
        else:
            a, b = g.input("a", shapes[0]), g.transpose(g.parameter("b", shapes[1][::-1]))
        _out(g, g.add_node(op_name, (a, b)))

    return example(build)


@rules("algebraic")
def _transpose_into_matmul(e):
    a, b = e.vars("a b")
    # MatMul(a, Transpose(b)) -> MatMulBT(a, b);  MatMul(Transpose(a), b) -> MatMulAT(a, b)
    # MatMulBT(a, Transpose(b)) -> MatMul(a, b);  MatMulAT(Transpose(a), b) -> MatMul(a, b)
    for name, lhs, rhs, side in (("MatMul(a, Transpose(b)) -> MatMulBT(a, b)", e.MatMul(a, e.Transpose(b)),
                                  e.MatMulBT(a, b), ("MatMul", "b")),
                                 ("MatMul(Transpose(a), b) -> MatMulAT(a, b)", e.MatMul(e.Transpose(a), b),
                                  e.MatMulAT(a, b), ("MatMul", "a")),
                                 ("MatMulBT(a, Transpose(b)) -> MatMul(a, b)", e.MatMulBT(a, e.Transpose(b)),
                                  e.MatMul(a, b), ("MatMulBT", "b")),
                                 ("MatMulAT(Transpose(a), b) -> MatMul(a, b)", e.MatMulAT(e.Transpose(a), b),
                                  e.MatMul(a, b), ("MatMulAT", "a"))):
        yield e.equal(name, lhs, rhs, example=_transposed_operand_example(*side))
