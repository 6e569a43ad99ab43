"""The rules that move elementwise regions into the store of a matmul or a convolution: the
generated epilogue step ``Epi.ex`` (``fused_epilogue.py``), in the rulesets ``matmul_epilogue``
(FusedMatMul, and through the rules that derive them from it FusedRmsNormMatMul, QuantMatMul
and QuantRmsNormMatMul) and ``conv_epilogue`` (FusedConv, FusedConvBn).

For ``F`` one of FusedMatMul, FusedConv and FusedConvBn over chain ``e``, every op of
``FUSABLE`` whose value is f32 when the operand ``F`` is f32 (every one but the comparisons,
Cast, and the broadcasts, which would enlarge the output), and ``s`` the shape of both:

- ``Op(.., F(e), ..) -> F(e + [Op(.., ExAcc(s), ExLeaf(x), ..)])`` where ``e`` does not end
  with a region: the op joins the store, its other operands read there with broadcasting;
- ``Op(.., F(e + [x]), ..) -> F(e + [Op(.., x, ExLeaf(x'), ..)])``: the op joins the region
  the chain ends with (so every region over one product has the same chain ``e`` below it,
  which the next rule needs, and a chain of ops is one step, not one per op);
- ``Op(F(e + [x1]), F(e + [x2])) -> F(e + [Op(x1, x2)])`` for a binary op: two regions over
  the same product (a diamond, ``v * Sigmoid(v)``) become one;
- ``Op(F(e), F(e + [x])) -> F(e + [Op(ExAcc(s), x)])`` and its mirror: a region and the
  product itself.

Each fires only where the value ``F(e)`` (the e-class matched) is read from memory by nobody
(``stored_uses`` 0: its consumers are elementwise ops and it is no graph output), as the
``Fused`` regions grow (``fused.py``): a value stored anyway would only be computed twice, and
a residual stream (an Add of every layer's product) would chain every layer into one term.
Each is an equality: extraction prices the kernel with the region against the product and a
``Fused`` kernel, and picks.
"""

from __future__ import annotations

from ..errors import GraphError
from ..spec import OPS, ShapeError, example, rules
from ..types import DType, TensorType
from .conv_fused import _conv_example, _conv_terms
from .fused import FUSABLE, _operand
from .matmul import _mm, _out

FAMILY = "epilogue_regions"


#: Ops that never join a product's store. SwiGLU's other operand is, in every model here, the up
#: projection of the gate's own input: with SwiGLU at the gate's store, gate and up are two matmuls
#: where the swiglu ruleset packs them into one (SwiGLUConcat), which the byte model prices a little
#: higher (it writes the packed product) but which runs faster: on the H200 (bench/models.py, one
#: session) SmolLM2 prefill took 6.05 ms with SwiGLU at the gate's store against 5.62 packed, and
#: decode 1.58 against 1.48 ms. SwiGLU's two gradients both read the gradient of its output, the
#: down projection's backward product: a region of either at that product's store computes it
#: twice. Extraction never took one (``llama:30`` and ``llama:64 --training`` give the same plans,
#: costs and bytes without them), and their e-nodes cost the ILP 0.3 of ``llama:64``'s 0.7 s.
NEVER_JOIN = ("Cast", "Expand", "BroadcastTo", "SwiGLU", "SwiGLUGradGate", "SwiGLUGradUp")

#: Ops that the chain's own ``add`` step folds where the addend has the product's shape and the chain
#: has no add yet (``matmul.py``, ``conv_fused.py``). A region starts with one only where that step
#: cannot: a broadcast addend, or a chain that has an add or a region already (the analysis fact
#: ``epilogue_blocks_add``, the complement of ``epilogue_without_add``). Both forms would be one
#: value computed one way; on a training step (``llama:64 --training``) the copies took HiGHS from
#: 0.7 to 3.2 s for the same plan.
ADD_STEP = ("Add",)


def _joins(name: str) -> list[int]:
    """The operand positions at which an f32 product may sit in a region step of op ``name``
    that keeps f32 (an op whose value is not f32 there, or which broadcasts, never joins; nor do
    the ops of :data:`NEVER_JOIN`)."""
    f = FUSABLE[name]
    if name in NEVER_JOIN:
        return []
    out = []
    for p in range(f.arity):
        if f.example_dtypes[p] is not DType.F32:
            continue
        ins = [TensorType((3, 5), d) for d in f.example_dtypes]
        try:
            got = OPS[name].infer(ins, {a.name: a.default for a in OPS[name].attrs} | f.example_attrs)
        except ShapeError:  # an op whose example operands do not type: no rule
            continue
        if got.dtype is DType.F32:
            out.append(p)
    return out


#: Op name -> the operand positions of its rules.
JOINS = {name: p for name in FUSABLE if (p := _joins(name))}


def _operands(g, name: str, at: int, y: int, shape, broadcast_ok: bool = True) -> list[int]:
    """The operands of an example of ``name`` with the product ``y`` [m, n, ...] at ``at``: the
    others of the product's shape, or broadcast ([1, n] / [m, 1] like, per op)."""
    f = FUSABLE[name]
    if not broadcast_ok:  # an op whose operands broadcast one way only (PRelu's slope)
        return [y if i == at else _operand(g, d, f"x{i}_full", shape) for i, d in enumerate(f.example_dtypes)]
    m, n = shape[-2], shape[-1]
    lead = list(shape[:-2])
    broadcast = [[*([1] * len(lead)), 1, n], [*lead, m, 1], [1]]
    out, k = [], 0
    for i, d in enumerate(f.example_dtypes):
        if i == at:
            out.append(y)
            continue
        s = list(shape) if f.same_shape or d is not DType.F32 else broadcast[k % 3]
        k += 1
        out.append(_operand(g, d, f"x{i}", s))
    return out


def _mm_example(name: str, at: int, pair: str = ""):
    def build(g, dim):
        y, m, n = _mm(g, dim, "BT")
        _out(g, _apply(g, name, at, y, [m, n], pair))

    return example(build)


def _apply(g, name: str, at: int, y: int, shape, pair: str) -> int:
    attrs = FUSABLE[name].example_attrs
    if pair == "chain":  # the product through a region already: Tanh(y) at ``at``
        return _apply(g, name, at, g.add_node("Tanh", (y,)), shape, "")
    if pair == "add":  # the product through its add step already: y + d at ``at``, a same-shape operand
        y = g.add(y, g.input("d", list(shape)))
        others = [_operand(g, d, f"x{i}_full", shape) for i, d in enumerate(FUSABLE[name].example_dtypes)]
        return g.add_node(name, [y if i == at else o for i, o in enumerate(others)], **attrs)
    if pair == "":
        try:
            return g.add_node(name, _operands(g, name, at, y, shape), **attrs)
        except GraphError:
            return g.add_node(name, _operands(g, name, at, y, shape, False), **attrs)
    x1 = g.add_node("Sigmoid", (y,))
    x2 = g.add_node("Tanh", (y,)) if pair == "both" else y
    args = (x1, x2) if at == 0 else (x2, x1)
    return g.add_node(name, args, **attrs)


def _conv_ex(name: str, at: int, bn: bool, pair: str = ""):
    return _conv_example(bias=not bn, bn=bn, then=lambda g, y, shape: _apply(g, name, at, y, shape, pair))


def _region_rules(e, label: str, term, examples):
    """The three rules for the fused op ``term(ep)`` (named ``label``); ``examples(name, at,
    pair)`` gives each one's soundness example."""
    (y, y2) = e.vars("ey ey2")
    (ep,) = e.vars("e", e.Epi)
    x1, x2 = e.vars("x1 x2", e.Ex)
    (s,) = e.vars("s", e.Vec[e.i64])
    (last,) = e.vars("last", e.String)
    zero = e.i64(0)
    for name, positions in JOINS.items():
        f = FUSABLE[name]
        attrs = e.attrs_of(name)
        others = e.vars(" ".join(f"o{i}" for i in range(f.arity)))
        for p in positions:
            args = [y if i == p else o for i, o in enumerate(others)]
            lhs = getattr(e, name)(*args, **attrs)
            leaves = [e.ExAcc(s) if i == p else e.ExLeaf(o) for i, o in enumerate(others)]
            shown = ", ".join(f"{label}(e)" if i == p else f"x{i}" for i in range(f.arity))
            start = (term(e.Epi.ex(ep, e.ex(name, *leaves, **attrs))), e.eq(y).to(term(ep)),
                     e.eq(e.stored_uses(y)).to(zero), e.eq(e.shape(y)).to(s), e.eq(e.shape(lhs)).to(s),
                     e.eq(e.last_step(ep)).to(last))
            if name in ADD_STEP:  # the add step covers a same-shape addend, once per chain
                other = e.shape(others[1 - p])
                yield e.equal(f"{name}({shown}) -> {label}(e+[ex {name}]) (broadcast x{1 - p})", lhs, *start,
                              e.ne(last).to(e.String("ex")), e.ne(other).to(s), example=examples(name, p, ""))
                shown = shown.replace(f"{label}(e)", f"{label}(e+[add d..])")
                yield e.equal(f"{name}({shown}) -> {label}(e+[add d.., ex {name}])", lhs, *start,
                              e.ne(last).to(e.String("ex")), e.epilogue_blocks_add(ep),
                              example=examples(name, p, "add"))
            else:
                yield e.equal(f"{name}({shown}) -> {label}(e+[ex {name}])", lhs, *start,
                              e.ne(last).to(e.String("ex")), example=examples(name, p, ""))
            leaves = [x1 if i == p else e.ExLeaf(o) for i, o in enumerate(others)]
            shown = ", ".join(f"{label}(e+[x])" if i == p else f"x{i}" for i in range(f.arity))
            yield e.equal(f"{name}({shown}) -> {label}(e+[ex {name}(x)])", lhs,
                          term(e.Epi.ex(ep, e.ex(name, *leaves, **attrs))),
                          e.eq(y).to(term(e.Epi.ex(ep, x1))), e.eq(e.stored_uses(y)).to(zero),
                          e.eq(e.shape(y)).to(s), e.eq(e.shape(lhs)).to(s), example=examples(name, p, "chain"))
        if f.arity != 2 or positions != [0, 1]:
            continue
        both = getattr(e, name)(y, y2, **attrs)
        yield e.equal(f"{name}({label}(e+[x1]), {label}(e+[x2])) -> {label}(e+[ex {name}(x1, x2)])", both,
                      term(e.Epi.ex(ep, e.ex(name, x1, x2, **attrs))),
                      e.eq(y).to(term(e.Epi.ex(ep, x1))), e.eq(y2).to(term(e.Epi.ex(ep, x2))),
                      e.eq(e.stored_uses(y)).to(zero), e.eq(e.stored_uses(y2)).to(zero),
                      e.eq(e.shape(y)).to(s), e.eq(e.shape(both)).to(s), example=examples(name, 0, "both"))
        for p in (0, 1):
            args = (y, y2) if p == 0 else (y2, y)
            lhs = getattr(e, name)(*args, **attrs)
            ops = (e.ExAcc(s), x2) if p == 0 else (x2, e.ExAcc(s))
            shown = f"{label}(e), {label}(e+[x])" if p == 0 else f"{label}(e+[x]), {label}(e)"
            yield e.equal(f"{name}({shown}) -> {label}(e+[ex {name}])", lhs,
                          term(e.Epi.ex(ep, e.ex(name, *ops, **attrs))),
                          e.eq(y).to(term(ep)), e.eq(y2).to(term(e.Epi.ex(ep, x2))),
                          e.eq(e.stored_uses(y)).to(zero), e.eq(e.stored_uses(y2)).to(zero),
                          e.eq(e.shape(y)).to(s), e.eq(e.shape(lhs)).to(s), example=examples(name, 1 - p, "one"))


@rules("matmul_epilogue")
def _matmul_regions(e):
    a, b = e.vars("a b")
    (v,) = e.vars("v", e.String)
    yield from _region_rules(e, "FusedMatMul", lambda ep: e.FusedMatMul(a, b, variant=v, epilogue=ep),
                             lambda name, p, pair: _mm_example(name, p, pair))


@rules("conv_epilogue")
def _conv_regions(e):
    _, _, _, fused = _conv_terms(e)
    for label, term in fused.items():
        bn = label == "FusedConvBn"
        yield from _region_rules(e, label, term, lambda name, p, pair, bn=bn: _conv_ex(name, p, bn, pair))
