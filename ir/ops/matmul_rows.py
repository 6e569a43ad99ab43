"""Products with a final step over whole rows: a LayerNorm, RmsNorm or SwiGLUConcat of the product, applied in
the second dispatch of a two-stage matmul instead of in a dispatch of its own.

- ``FusedMatMulLayerNorm(a, b, gamma, beta, *operands)`` = LayerNorm(epilogue(op(A) op(B)), gamma,
  beta, eps): the post-LN block of BERT (Devlin et al. 2019; LayerNorm: Ba et al. 2016), whose
  attention output and FFN down projections end in bias, residual add and LayerNorm;
- ``FusedMatMulLayerNormPair(a, b, gamma, beta, *operands)`` = [C, LayerNorm(C, gamma, beta, eps)], [2, M, N],
  for C = epilogue(op(A) op(B)): a pre-LN transformer's residual sum (GPT-2: Radford et al. 2019), which the next
  residual add reads, and its LayerNorm, which the next block reads; each is a ``Select`` view of one part (a
  window of the output's buffer, ``ir/ops/shape.py``);
- ``FusedMatMulRmsNorm(a, b, w, *operands)`` = RmsNorm(epilogue(op(A) op(B)), w, eps) (Zhang &
  Sennrich 2019): a projection ending in a normalisation, such as a linear layer before a model's
  RmsNorm (a sentence embedding's pooling and L2 norm are one ``TokenPool``, ``token_pool.py``);
- ``FusedMatMulSwiGLU(a, b, *operands)`` = SwiGLUConcat(epilogue(op(A) op(B))) and
  ``FusedRmsNormMatMulSwiGLU(x, w_norm, w, *operands)`` = SwiGLUConcat(epilogue(RmsNorm(x, w_norm)
  op W)), [M, N/2]: the packed gate/up projection of a LLaMA MLP (Shazeer 2020) with its gated
  activation.

Lowering (``matmul_kernel.matmul_kernel_for``, ``final``): always two dispatches. The first is the
tiled matmul (or the GEMV kernel) writing the node's scratch buffer: the split-K partial sums, or
with one split the product with its rows scaled. The second is the split-K reduction
(``matmul_split_reduce.wgsl``, the gated form) or a row kernel (``matmul_split_layer_norm.wgsl``),
which applies the epilogue and then the final step. A product split in K takes that second
dispatch anyway, so the final step costs no dispatch: SmolLM2's 128-token prefill drops its 30
SwiGLUConcat dispatches and a MiniLM batch of 8 x 128 its 12 LayerNorms and its final RmsNorm.

Rules (``norm_fusion``, ``swiglu``): ``LayerNorm(FusedMatMul(a, W, e), g, b) -> FusedMatMulLayerNorm`` and
``RmsNorm(FusedMatMul(a, W, e), w) -> FusedMatMulRmsNorm``
where the product has no other stored reader (``stored_uses`` 1) and an epilogue of bias, add and unary steps only
(``epilogue_without_region``: no generated region); ``LayerNorm(p, g, b) -> Select(FusedMatMulLayerNormPair(..), 1)``
and ``p -> Select(.., 0)`` for such a product p of any readers whose [M, N] f32 is a multiple of VIEW_ALIGN bytes
(extraction takes it where the product is stored anyway: GPT-2 small's plan at 8 x 128 tokens 110 -> 87
dispatches, 1.2% faster on an H100, bench/results/layer_norm_pair_h100), and ``SwiGLUConcat(F(...)) ->
F...SwiGLU`` for F FusedMatMul or FusedRmsNormMatMul with such an epilogue, where the gated value has
more than GEMV_MAX_ROWS rows (a decode step's GEMV takes SwiGLU in the down projection's prologue instead, one dispatch
fewer). Each op's cost counts its two dispatches.

Quantised weights (``quant`` ruleset, folded as :mod:`.quant` folds the other products):
QuantMatMulLayerNorm, QuantMatMulRmsNorm and QuantRmsNormMatMulSwiGLU take B as blocks (GGUF Q4_0, Q4_1, Q8_0,
or the f16 rows of ``precision="f16"``), decoded by the first stage's loader. FusedMatMulSwiGLU has no
quantised form (a gate/up product without its RmsNorm is an exporter's graph, whose weights are f32
or f16 as stored), nor does a LayerNorm without a bias or weight, or an RmsNorm without a weight, have a fused
form.
"""

from __future__ import annotations

import numpy as np

from ..spec import OPS, VIEW_ALIGN, Attr, example, need, need_f32, no_grad, op, rules
from ..types import TensorType
from .elementwise import _swiglu_concat_ref
from .fused_epilogue import epilogue_ops, is_expr
from .matmul import _fused_matmul, _fused_rms_norm_matmul, _out, matmul_dims
from .matmul_kernel import GEMV_MAX_ROWS, matmul_kernel_for, max_scratch_bytes, workgroup_storage
from .norms import _layer_norm_ref, rms_norm_ref
from .quant import _FORMAT, _NO_GRAD, _quant_matmul, _quant_param, _quant_rms_norm_matmul

FAMILY = "matmul_rows"

_VARIANT, _EPILOGUE = Attr("variant", "str", ""), Attr("epilogue", "epilogue", ())
_EPS = Attr("eps", "float", 1e-5, minimum=0.0)  # a norm's epsilon: 0 or more
_EPS_REQUIRED = Attr("eps", "float", minimum=0.0)


def _through(b, inner: int, outer: int, dy: int, want_inner: tuple, want_extra: tuple) -> tuple[list, list]:
    # Gradients of an op that is outer(inner, *extra): the gradients of inner's inputs and of
    # outer's other inputs, through the registered rules of both (their forward nodes emitted for it)
    outer_node, inner_node = b.g.node(outer), b.g.node(inner)
    d = OPS[outer_node.op].vjp(b, outer_node, dy, (any(want_inner), *want_extra))
    if not any(want_inner):
        return [None] * len(want_inner), list(d[1:])
    return list(OPS[inner_node.op].vjp(b, inner_node, d[0], want_inner)), list(d[1:])


def _kernel(node, ins, target):
    # every op of this module: f32 B, or (a ``format`` attribute) B as blocks of its quantised form
    a = node.attrs
    rms = node.op.endswith("RmsNormMatMulSwiGLU")
    final = ("layer_norm" if node.op.endswith("LayerNorm") else "layer_norm_pair" if node.op.endswith("LayerNormPair")
             else "rms_norm" if node.op.endswith("RmsNorm") else "swiglu")
    quant = a.get("format")
    variant = "BT" if quant else a["variant"]
    m, out_n = node.type.shape[-2:]
    k = ins[0].shape[0] if variant == "AT" else ins[0].shape[1]
    b = 2 if rms else 1  # B's input
    first = b + 1 + {"layer_norm": 2, "layer_norm_pair": 2, "rms_norm": 1, "swiglu": 0}[final]  # the first operand
    return matmul_kernel_for(variant, tuple(a["epilogue"]), m, k, 2 * out_n if final == "swiglu" else out_n,
                             rms_norm=rms, eps=float(a["eps"]) if rms else 0.0, quant=quant,
                             row_words=ins[b].shape[1] if quant else 0, operand_types=tuple(ins[first:]),
                             max_scratch_bytes=max_scratch_bytes(target),
                             workgroup_storage=workgroup_storage(target), final=final,
                             norm_eps=float(a["eps"]) if final != "swiglu" else 0.0)


# --- FusedMatMulLayerNorm: LayerNorm(epilogue(A op B), gamma, beta) -----------------------------


def _plain(epilogue) -> None:
    # The final step follows the whole chain, so no region may be split off it to be applied by the
    # graph's ops after the node (rewrites/extract.py does that where its operands overflow the
    # bindings), and a region's value has the product's shape, which the gated ops' output is not.
    need(not any(is_expr(s) for s in epilogue), "a product with a final step takes no generated region in its "
                                                 "epilogue (only bias, add and unary steps)")


def _normed(product):
    # The shape rule of a product (inputs A, B, gamma, beta, *operands) with a final LayerNorm:
    # ``product``'s rule on A, B and the operands, gamma and beta f32 [N]
    def infer(ts, a):
        _plain(a["epilogue"])
        out = product([ts[0], ts[1], *ts[4:]], a)
        n = out.shape[1]
        for t, what in ((ts[2], "gamma"), (ts[3], "beta")):
            need_f32(t, what)
            need(t.shape == (n,), f"{what} must be [{n}] (the product's columns), got {t}")
        return out

    return infer


def _normed_ref(product: str):
    # The reference of ``product`` (inputs A, B, *operands) followed by LayerNorm(., gamma, beta)
    def reference(xs, a):
        return _layer_norm_ref([OPS[product].reference([xs[0], xs[1], *xs[4:]], a), xs[2], xs[3]], a)

    return reference


def _gated_ref(product: str):
    # The reference of ``product`` followed by SwiGLUConcat
    return lambda xs, a: _swiglu_concat_ref([OPS[product].reference(xs, a)], {})


def _mm_layer_norm_vjp(b, node, dy, want):
    x, w, gamma, beta, *ops = node.inputs
    a = node.attrs
    prod = b.emit("FusedMatMul", (x, w, *ops), variant=a["variant"], epilogue=a["epilogue"])
    norm = b.emit("LayerNorm", (prod, gamma, beta), eps=a["eps"])
    inner, (d_gamma, d_beta) = _through(b, prod, norm, dy, (want[0], want[1], *want[4:]), (want[2], want[3]))
    return [inner[0], inner[1], d_gamma, d_beta, *inner[2:]]


def _mm_layer_norm_flops(ins, out, a):
    m, k, n = matmul_dims(ins[:2], a["variant"])
    return 2 * m * k * n + out.num_elements * (epilogue_ops(a["epilogue"]) + 7)


op("FusedMatMulLayerNorm", ("a", "b", "gamma", "beta", "*operands"), _normed(_fused_matmul), _normed_ref("FusedMatMul"),
   attrs=(_EPS, _VARIANT, _EPILOGUE), vjp=_mm_layer_norm_vjp, kernel=_kernel, dispatches=2,
   flops=_mm_layer_norm_flops,
   doc="LayerNorm(epilogue(A op B), gamma, beta, eps) over each row of the [M,N] product (Ba et al. 2016); "
       "inputs [A, B, gamma [N], beta [N], *epilogue operands]; two dispatches: the product, then its epilogue "
       "and the norm")


# --- FusedMatMulLayerNormPair: the product and its LayerNorm, [2, M, N] ------------------------------


def _pair(ts, a):
    out = _normed(_fused_matmul)(ts, a)
    return TensorType((2, *out.shape), out.dtype)


def _pair_ref(xs, a):
    product = OPS["FusedMatMul"].reference([xs[0], xs[1], *xs[4:]], a)
    return np.stack([product, _layer_norm_ref([product, xs[2], xs[3]], a)])


op("FusedMatMulLayerNormPair", ("a", "b", "gamma", "beta", "*operands"), _pair, _pair_ref,
   attrs=(_EPS, _VARIANT, _EPILOGUE), kernel=_kernel, dispatches=2,
   vjp=no_grad("the optimiser makes it of a product and its LayerNorm: differentiate the graph before "
                                     "optimising it"), flops=_mm_layer_norm_flops,
   doc="[C, LayerNorm(C, gamma, beta, eps)] for C = epilogue(A op B) [M,N] (Ba et al. 2016), output [2, M, N]: a "
       "pre-LN transformer's residual sum, which the next residual add reads, and its LayerNorm, which the next "
       "block reads (GPT-2: Radford et al. 2019), each read through a Select view; inputs [A, B, gamma [N], beta "
       "[N], *epilogue operands]; two dispatches: the product, then its epilogue, the norm and both stores")


# --- FusedMatMulRmsNorm: RmsNorm(epilogue(A op B), w) ---------------------------------------------


def _rms_normed(product):
    # The shape rule of a product (inputs A, B, w, *operands) with a final RmsNorm: ``product``'s rule on
    # A, B and the operands, w f32 [N]
    def infer(ts, a):
        _plain(a["epilogue"])
        out = product([ts[0], ts[1], *ts[3:]], a)
        n = out.shape[1]
        need_f32(ts[2], "w")
        need(ts[2].shape == (n,), f"w must be [{n}] (the product's columns), got {ts[2]}")
        return out

    return infer


def _rms_normed_ref(product: str):
    # The reference of ``product`` (inputs A, B, *operands) followed by RmsNorm(., w)
    def reference(xs, a):
        return rms_norm_ref([OPS[product].reference([xs[0], xs[1], *xs[3:]], a), xs[2]], a)

    return reference


def _mm_rms_norm_vjp(b, node, dy, want):
    x, w, w_norm, *ops = node.inputs
    a = node.attrs
    prod = b.emit("FusedMatMul", (x, w, *ops), variant=a["variant"], epilogue=a["epilogue"])
    norm = b.emit("RmsNorm", (prod, w_norm), eps=a["eps"])
    inner, (d_w_norm,) = _through(b, prod, norm, dy, (want[0], want[1], *want[3:]), (want[2],))
    return [inner[0], inner[1], d_w_norm, *inner[2:]]


def _mm_rms_norm_flops(ins, out, a):
    m, k, n = matmul_dims(ins[:2], a["variant"])
    return 2 * m * k * n + out.num_elements * (epilogue_ops(a["epilogue"]) + 4)


op("FusedMatMulRmsNorm", ("a", "b", "w", "*operands"), _rms_normed(_fused_matmul), _rms_normed_ref("FusedMatMul"),
   attrs=(_EPS, _VARIANT, _EPILOGUE), vjp=_mm_rms_norm_vjp, kernel=_kernel, dispatches=2,
   flops=_mm_rms_norm_flops,
   doc="RmsNorm(epilogue(A op B), w, eps) = C / sqrt(mean(C^2) + eps) * w over each row of the [M,N] product C "
       "(Zhang & Sennrich 2019): a projection ending in a normalisation; inputs [A, B, w [N], *epilogue "
       "operands]; two dispatches: the product, then its epilogue and the norm")


# --- FusedMatMulSwiGLU, FusedRmsNormMatMulSwiGLU: SwiGLUConcat of the product ---------------------


def _gated(out: TensorType, epilogue) -> TensorType:
    _plain(epilogue)
    need(out.shape[1] % 2 == 0, f"the product must have an even number of columns (gate and up side by side), "
                                f"got {out}")
    return TensorType((out.shape[0], out.shape[1] // 2), out.dtype)


def _gated_flops(fixed: int):
    def flops(ins, out, a):
        m, k, n = matmul_dims([ins[0], ins[fixed - 1]], a["variant"])
        return 2 * m * k * n + m * n * epilogue_ops(a["epilogue"]) + 5 * out.num_elements + (3 * m * k if fixed == 3
                                                                                             else 0)

    return flops


def _gated_vjp(b, node, dy, want):
    # through the product (FusedMatMul or FusedRmsNormMatMul: the op's name less "SwiGLU", its
    # inputs and attributes) and SwiGLUConcat
    prod = b.emit(node.op.removesuffix("SwiGLU"), node.inputs, **node.attrs)
    inner, _ = _through(b, prod, b.emit("SwiGLUConcat", (prod,)), dy, tuple(want), ())
    return inner


op("FusedMatMulSwiGLU", ("a", "b", "*operands"), lambda ts, a: _gated(_fused_matmul(ts, a), a["epilogue"]),
   _gated_ref("FusedMatMul"), attrs=(_VARIANT, _EPILOGUE), vjp=_gated_vjp, kernel=_kernel, dispatches=2,
   flops=_gated_flops(2),
   doc="SwiGLUConcat(epilogue(A op B)): silu(C[:, :N/2]) * C[:, N/2:] of the [M,N] product C, gate and up "
       "projections side by side (Shazeer 2020); inputs [A, B, *epilogue operands]; output [M, N/2]; two "
       "dispatches: the product, then its epilogue and the gate")
op("FusedRmsNormMatMulSwiGLU", ("x", "w_norm", "w", "*operands"),
   lambda ts, a: _gated(_fused_rms_norm_matmul(ts, a), a["epilogue"]),
   _gated_ref("FusedRmsNormMatMul"), attrs=(_EPS_REQUIRED, _VARIANT, _EPILOGUE), vjp=_gated_vjp,
   kernel=_kernel, dispatches=2, flops=_gated_flops(3),
   doc="SwiGLUConcat(epilogue(RmsNorm(x, w_norm, eps) op W)) (Zhang & Sennrich 2019; Shazeer 2020): the "
       "packed gate/up projection of a LLaMA MLP with its gate; inputs [x, w_norm, W, *epilogue operands]; "
       "output [M, N/2]; two dispatches")


# --- rules ------------------------------------------------------------------------------------


def _plain_product(g, variant: str, x: int, m: int, k: int, n: int) -> int:
    # the MatMul, MatMulAT or MatMulBT of x ([M,K], or [K,M] for 'AT') and a parameter w of the variant's layout
    w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
    return g.add_node({"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}[variant], (x, w))


def _ln_example(variant: str):
    def build(g, dim):
        m, k, n = dim("m"), dim("k"), dim("n")
        prod = _plain_product(g, variant, g.input("a", [k, m] if variant == "AT" else [m, k]), m, k, n)
        h = g.add(g.bias_add(prod, g.parameter("bias", [n])), g.input("residual", [m, n]))
        _out(g, g.layer_norm(h, g.parameter("gamma", [n]), g.parameter("beta", [n]), eps=1e-6))

    return example(build)


def _pair_example(variant: str):
    def build(g, dim):
        # the residual sum h = A op W + bias + residual is a graph output and LayerNorm(h) another: h's buffer is
        # read twice; parts of 8 x 8k f32 (a multiple of 256 bytes)
        m, k, n = 8 * dim("mb", 1, 2), dim("k"), 8 * dim("nb", 1, 2)
        prod = _plain_product(g, variant, g.input("a", [k, m] if variant == "AT" else [m, k]), m, k, n)
        h = g.add(g.bias_add(prod, g.parameter("bias", [n])), g.input("residual", [m, n]))
        g.set_outputs([g.layer_norm(h, g.parameter("gamma", [n]), g.parameter("beta", [n]), eps=1e-6), h])

    return example(build, max_dim=9)


def _rms_example(variant: str):
    def build(g, dim):
        m, k, n = dim("m"), dim("k"), dim("n")
        prod = _plain_product(g, variant, g.input("a", [k, m] if variant == "AT" else [m, k]), m, k, n)
        _out(g, g.rms_norm(g.bias_add(prod, g.parameter("bias", [n])), g.parameter("w_norm", [n]), eps=1e-6))

    return example(build)


@rules("norm_fusion")
def _final_norm_rules(e):
    x, w, prod, gamma, beta = e.vars("x w prod gamma beta")
    (ep,) = e.vars("e", e.Epi)
    (eps,) = e.vars("eps", e.f64)
    (s,) = e.vars("s", e.Vec[e.i64])
    # LayerNorm(FusedMatMul(x, W, e), gamma, beta) -> FusedMatMulLayerNorm(x, W, gamma, beta, e) and
    # RmsNorm(FusedMatMul(x, W, e), w) -> FusedMatMulRmsNorm(x, W, w, e), if the product has no other stored
    #   reader (a value stored anyway would be computed twice). An elementwise reader of the product is no
    #   stored reader: extraction may then compute the product twice (here and in that reader's own product), for
    #   the dispatches it saves. RmsNorm's extraction against feeding the next product's prologue
    #   (FusedRmsNormMatMul) is priced.
    for v in ("", "AT", "BT"):
        guards = (e.eq(prod).to(e.FusedMatMul(x, w, variant=v, epilogue=ep)), e.eq(e.stored_uses(prod)).to(e.i64(1)),
                  e.epilogue_without_region(ep))
        yield e.equal(f"LayerNorm(FusedMatMul{v}(x, W, e), g, b) -> FusedMatMulLayerNorm{v}(x, W, g, b, e)",
                      e.LayerNorm(prod, gamma, beta, eps=eps),
                      e.FusedMatMulLayerNorm(x, w, gamma, beta, eps=eps, variant=v, epilogue=ep), *guards,
                      example=_ln_example(v))
        yield e.equal(f"RmsNorm(FusedMatMul{v}(x, W, e), w) -> FusedMatMulRmsNorm{v}(x, W, w, e)",
                      e.RmsNorm(prod, gamma, eps=eps),
                      e.FusedMatMulRmsNorm(x, w, gamma, eps=eps, variant=v, epilogue=ep), *guards,
                      example=_rms_example(v))
        # LayerNorm(p, g, b) with p = FusedMatMul(x, W, e) -> Select(P, 1), and p -> Select(P, 0), for P =
        #   FusedMatMulLayerNormPair(x, W, g, b, e): a pre-LN transformer's residual sum, which the next residual
        #   add reads too, stored with its LayerNorm by the product's second dispatch instead of normalised by a
        #   dispatch of its own. Where the product has one stored reader FusedMatMulLayerNorm costs less (it
        #   stores half as much); extraction prices both. Each part must be a multiple of VIEW_ALIGN bytes.
        ln = e.LayerNorm(prod, gamma, beta, eps=eps)
        pair = e.FusedMatMulLayerNormPair(x, w, gamma, beta, eps=eps, variant=v, epilogue=ep)
        yield e.rule(ln, e.eq(prod).to(e.FusedMatMul(x, w, variant=v, epilogue=ep)), e.epilogue_without_region(ep),
                     e.eq(e.shape(prod)).to(s), e.eq((s[0] * s[1] * e.i64(4)) % e.i64(VIEW_ALIGN)).to(e.i64(0)),
                     name=f"LayerNorm(FusedMatMul{v}(x, W, e), g, b) -> Select(FusedMatMulLayerNormPair{v}(x, W, g, b, "
                          "e), 1)", example=_pair_example(v)).then(
            e.union(ln).with_(e.Select(pair, index=1)), e.union(prod).with_(e.Select(pair, index=0)))


def _swiglu_example(rms: bool, variant: str):
    def build(g, dim):
        m, k, n = dim("m", GEMV_MAX_ROWS + 1), dim("k"), dim("n")
        x = g.input("x", [k, m] if variant == "AT" else [m, k])
        if rms:
            x = g.rms_norm(x, g.parameter("w_norm", [k]))
        prod = _plain_product(g, variant, x, m, k, 2 * n)
        _out(g, g.swiglu_concat(g.bias_add(prod, g.parameter("bias", [2 * n]))))

    return example(build)


@rules("swiglu")
def _gated_rules(e):
    x, wn, w, prod = e.vars("x wn w prod")
    (ep,) = e.vars("e", e.Epi)
    (eps,) = e.vars("eps", e.f64)
    (s,) = e.vars("s", e.Vec[e.i64])
    # SwiGLUConcat(F(..., e)) -> F...SwiGLU(..., e) for F FusedMatMul (any variant) or
    # FusedRmsNormMatMul ('' or 'BT'), where the gated value has more than GEMV_MAX_ROWS rows (its
    # shape: the product, which the gate/up packing rule builds, has no shape or stored_uses fact).
    # A product stored anyway (another reader) would be computed twice: extraction prices both.
    for v in ("", "AT", "BT"):
        forms = [("FusedMatMul", e.FusedMatMul(x, w, variant=v, epilogue=ep),
                  e.FusedMatMulSwiGLU(x, w, variant=v, epilogue=ep))]
        if v != "AT":
            forms.append(("FusedRmsNormMatMul", e.FusedRmsNormMatMul(x, wn, w, eps=eps, variant=v, epilogue=ep),
                          e.FusedRmsNormMatMulSwiGLU(x, wn, w, eps=eps, variant=v, epilogue=ep)))
        for name, product, gated in forms:
            lhs = e.SwiGLUConcat(prod)
            yield e.equal(f"SwiGLUConcat({name}{v}(.., e)) -> {name}SwiGLU{v}(.., e)", lhs, gated,
                          e.eq(prod).to(product), e.eq(e.shape(lhs)).to(s), s[0] > e.i64(GEMV_MAX_ROWS),
                          e.epilogue_without_region(ep),
                          example=_swiglu_example(name == "FusedRmsNormMatMul", v))


# --- the quantised-weight forms (ir/ops/quant.py): B as blocks, decoded by the first stage's loader ----


op("QuantMatMulLayerNorm", ("a", "q", "gamma", "beta", "*operands"), _normed(_quant_matmul), _normed_ref("QuantMatMul"),
   attrs=(_EPS, _FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_kernel, dispatches=2,
   flops=lambda ins, out, a: 2 * out.num_elements * ins[0].shape[1] + out.num_elements * (
       epilogue_ops(a["epilogue"]) + 7),
   doc="LayerNorm(epilogue(A @ Dequant(q)^T), gamma, beta, eps): FusedMatMulLayerNorm 'BT' with B as "
       "blocks (q u32 [N, row_words]); inputs [A, q, gamma [N], beta [N], *epilogue operands]; two dispatches")


op("QuantMatMulRmsNorm", ("a", "q", "w", "*operands"), _rms_normed(_quant_matmul), _rms_normed_ref("QuantMatMul"),
   attrs=(_EPS, _FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_kernel, dispatches=2,
   flops=lambda ins, out, a: 2 * out.num_elements * ins[0].shape[1] + out.num_elements * (
       epilogue_ops(a["epilogue"]) + 4),
   doc="RmsNorm(epilogue(A @ Dequant(q)^T), w, eps): FusedMatMulRmsNorm 'BT' with B as blocks (q u32 [N, "
       "row_words]); inputs [A, q, w [N], *epilogue operands]; two dispatches")


op("QuantRmsNormMatMulSwiGLU", ("x", "w_norm", "q", "*operands"),
   lambda ts, a: _gated(_quant_rms_norm_matmul(ts, a), a["epilogue"]), _gated_ref("QuantRmsNormMatMul"),
   attrs=(_EPS_REQUIRED, _FORMAT, _EPILOGUE), vjp=_NO_GRAD, kernel=_kernel, dispatches=2,
   flops=lambda ins, out, a: 2 * ins[0].shape[0] * ins[0].shape[1] * ins[2].shape[0] + 3 * ins[0].num_elements
   + 2 * out.num_elements * epilogue_ops(a["epilogue"]) + 5 * out.num_elements,
   doc="SwiGLUConcat(epilogue(RmsNorm(x, w_norm, eps) @ Dequant(q)^T)): FusedRmsNormMatMulSwiGLU 'BT' with B "
       "as blocks; inputs [x, w_norm, q, *epilogue operands]; output [M, N/2]; two dispatches")


def _qln_example(g, dim) -> None:
    m, k, n = dim("m"), 32 * dim("kb", 1, 2), dim("n")
    prod = g.matmul_bt(g.input("x", [m, k]), _quant_param(g, "W", n, k, "q8_0"))
    h = g.add(g.bias_add(prod, g.parameter("bias", [n])), g.input("r", [m, n]))
    g.set_outputs([g.layer_norm(h, g.parameter("gamma", [n]), g.parameter("beta", [n]))])


def _qrms_example(g, dim) -> None:
    m, k, n = dim("m"), 32 * dim("kb", 1, 2), dim("n")
    prod = g.matmul_bt(g.input("x", [m, k]), _quant_param(g, "W", n, k, "q4_1"))
    g.set_outputs([g.rms_norm(g.bias_add(prod, g.parameter("bias", [n])), g.parameter("w", [n]))])


def _qswiglu_rows_example(g, dim) -> None:
    m, k, n = dim("m", GEMV_MAX_ROWS + 1), 32 * dim("kb", 1, 2), dim("n")
    h = g.rms_norm(g.input("x", [m, k]), g.parameter("w", [k]))
    g.set_outputs([g.swiglu(g.matmul_bt(h, _quant_param(g, "Wg", n, k)), g.matmul_bt(h, _quant_param(g, "Wu", n, k)))])


@rules("quant")
def _quant_rows_rules(e):
    x, w, q, gamma, beta = e.vars("x w q gamma beta")
    (f,) = e.vars("f", e.String)
    (c,) = e.vars("c", e.i64)
    (eps,) = e.vars("eps", e.f64)
    (ep,) = e.vars("e", e.Epi)
    dq = e.Dequant(q, format=f, cols=c)
    # FusedMatMulLayerNorm(x, Dequant(q), g, b, 'BT', e) -> QuantMatMulLayerNorm(x, q, g, b, e)
    yield e.equal("FusedMatMulLayerNormBT(x, Dequant(q), g, b, e) -> QuantMatMulLayerNorm(x, q, g, b, e)",
                  e.FusedMatMulLayerNorm(x, dq, gamma, beta, eps=eps, variant=e.String("BT"), epilogue=ep),
                  e.QuantMatMulLayerNorm(x, q, gamma, beta, eps=eps, format=f, epilogue=ep),
                  example=example(_qln_example))
    # FusedMatMulRmsNorm(x, Dequant(q), w, 'BT', e) -> QuantMatMulRmsNorm(x, q, w, e)
    yield e.equal("FusedMatMulRmsNormBT(x, Dequant(q), w, e) -> QuantMatMulRmsNorm(x, q, w, e)",
                  e.FusedMatMulRmsNorm(x, dq, w, eps=eps, variant=e.String("BT"), epilogue=ep),
                  e.QuantMatMulRmsNorm(x, q, w, eps=eps, format=f, epilogue=ep),
                  example=example(_qrms_example))
    # FusedRmsNormMatMulSwiGLU(x, w, Dequant(q), 'BT', e) -> QuantRmsNormMatMulSwiGLU(x, w, q, e)
    yield e.equal("FusedRmsNormMatMulSwiGLUBT(x, w, Dequant(q), e) -> QuantRmsNormMatMulSwiGLU(x, w, q, e)",
                  e.FusedRmsNormMatMulSwiGLU(x, w, dq, eps=eps, variant=e.String("BT"), epilogue=ep),
                  e.QuantRmsNormMatMulSwiGLU(x, w, q, eps=eps, format=f, epilogue=ep),
                  example=example(_qswiglu_rows_example))
