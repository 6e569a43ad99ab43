"""MatMul, Gemm and Einsum.

MatMul by a 2-D right operand (a weight, usually) becomes the 2-D MatMul on a [batch * M, K]
view of the left one, so the matmul family's fusion rules (bias, residual and activation
epilogues) and fast kernels apply; other shapes become BatchMatMul (numpy.matmul semantics).
Gemm is MatMul / MatMulAT / MatMulBT with alpha folded into a known B (else a Mul) and C as a
BiasAdd or Add (fused into the matmul by the rewrite engine). Einsum of a batched-matmul form (letters shared by
both operands and the output as batch axes, a contracted group, the output's remaining
letters in order) becomes MatMul or BatchMatMul on views; any other equation of one to three
operands runs the generic Einsum kernel.

A known weight (B of MatMul or Gemm) larger than one storage binding may hold on every WebGPU
device (maxStorageBufferBindingSize's default, 128 MiB, which is also lavapipe's limit) is
split along N into blocks that fit, each its own parameter named ``NAME[lo:hi]`` (rows) or
``NAME[:, lo:hi]`` (columns): one matmul per block (with its part of a known bias), and a
Concat of their outputs (VGG's 4096 x 25088 fully connected layer: four blocks).
"""

from __future__ import annotations

import math

from onnx import TensorProto

from eggfuse.ir.ops.linalg import MAX_EINSUM_LETTERS, MAX_EINSUM_OPERANDS, parse_einsum
from eggfuse.lowering.limits import DEFAULT_LIMITS

from ..importer import NodeContext, Value, converter, elem_name

#: Bytes of the largest weight one matmul binds (WebGPU's guaranteed maxStorageBufferBindingSize).
WEIGHT_BINDING_BYTES = DEFAULT_LIMITS["max-storage-buffer-binding-size"]


def float_inputs(ctx: NodeContext, *indices: int) -> None:
    """Refuse a non-float input among ``indices`` (the matmul and conv kernels compute in float32)."""
    for i in indices:
        if ctx.has(i) and ctx.elem(i) != TensorProto.FLOAT:
            raise ctx.fail(f"input {i} ({ctx.value(i).name!r}) has element type {elem_name(ctx.elem(i))}; eggfuse "
                           f"runs {ctx.op_type} in float32 only (cast the model to float32)")


def reshape(ctx: NodeContext, nid: int, shape) -> int:
    """``nid`` viewed with ``shape`` (no node when it already has it)."""
    shape = [int(d) for d in shape]
    if list(ctx.graph.node(nid).type.shape) == shape:
        return nid
    return ctx.add("Identity", [nid], shape=shape)


def weight_blocks(v: Value, axis: int, limit: int | None = None) -> list[tuple[int, int]] | None:
    """The [lo, hi) ranges along ``axis`` splitting the known 2-D float32 ``v`` into blocks of at
    most ``limit`` bytes each (default :data:`WEIGHT_BINDING_BYTES`; as even as possible), or
    None when ``v`` is not known or fits."""
    limit = WEIGHT_BINDING_BYTES if limit is None else limit
    if v.const is None or len(v.shape) != 2 or 4 * math.prod(v.shape) <= limit:
        return None
    n, line = v.shape[axis], 4 * v.shape[1 - axis]
    per = max(1, limit // line)  # a single line over the limit still gets its own block (lowering refuses it)
    parts = -(-n // per)
    size = -(-n // parts)
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def weight_block(ctx: NodeContext, v: Value, axis: int, lo: int, hi: int) -> int:
    """The IR leaf of the known ``v[lo:hi]`` (``axis`` 0, ``v`` 1-D or 2-D) or ``v[:, lo:hi]``
    (``axis`` 1): a parameter when ``v`` is one, named after it."""
    part = v.const[lo:hi] if axis == 0 else v.const[:, lo:hi]
    name = f"{v.name or 'weight'}[{lo}:{hi}]" if axis == 0 else f"{v.name or 'weight'}[:, {lo}:{hi}]"
    return ctx.importer.materialise(Value(name, v.elem, tuple(part.shape), const=part, param=v.param), ctx)


@converter("MatMul")
def _matmul(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(())
    float_inputs(ctx, 0, 1)
    sa, sb = ctx.shape(0), ctx.shape(1)
    if not sa or not sb:
        raise ctx.fail(f"MatMul needs operands of rank >= 1, got {list(sa)} and {list(sb)}")
    a = ctx.tensor(0)
    if len(sb) == 2:  # a weight, usually: the 2-D MatMul on [batch * M, K]
        out = [*sa[:-1], sb[1]]
    elif len(sb) == 1 and len(sa) >= 2:  # a column [K, 1]
        out = list(sa[:-1])
    else:
        return ctx.out(ctx.add("BatchMatMul", [a, ctx.tensor(1)]))
    if sb[0] != sa[-1]:
        raise ctx.fail(f"inner dimensions differ: A {list(sa)}, B {list(sb)}")
    a2 = reshape(ctx, a, [math.prod(sa[:-1]), sa[-1]])
    blocks = weight_blocks(ctx.value(1), 1) if len(sb) == 2 else None
    if blocks:
        y = ctx.add("Concat", [ctx.add("MatMul", [a2, weight_block(ctx, ctx.value(1), 1, lo, hi)])
                               for lo, hi in blocks], axis=1)
    else:
        y = ctx.add("MatMul", [a2, ctx.tensor(1) if len(sb) == 2 else reshape(ctx, ctx.tensor(1), [sb[0], 1])])
    return ctx.out(reshape(ctx, y, out))


@converter("Gemm")
def _gemm(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("alpha", "beta", "transA", "transB"))
    float_inputs(ctx, 0, 1, 2)
    sa, sb = ctx.shape(0), ctx.shape(1)
    if len(sa) != 2 or len(sb) != 2:
        raise ctx.fail(f"Gemm takes 2-D A and B, got {list(sa)} and {list(sb)}")
    ta, tb = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    a = ctx.tensor(0)
    bv = ctx.value(1)
    if alpha != 1.0 and bv.const is not None and not bv.param:  # a known B is scaled at load time
        bv, alpha = Value(bv.name, bv.elem, bv.shape, const=alpha * bv.const.astype("float64")), 1.0
    # (an initializer stays a parameter, its product scaled by alpha: a scaled copy would be a constant of the
    # graph, in the compile cache's entry and never stored as float16)
    name = {(False, False): "MatMul", (True, False): "MatMulAT", (False, True): "MatMulBT", (True, True): "MatMulBT"}
    if ta and tb:  # A^T B^T = (A^T) B^T
        a = ctx.add("Transpose", [a])
    blocks = weight_blocks(bv, 0 if tb else 1)
    if blocks:
        return ctx.out(_gemm_blocks(ctx, a, bv, name[(ta, tb)], tb, blocks, alpha, beta))
    y = ctx.add(name[(ta, tb)], [a, ctx.importer.materialise(bv, ctx)])
    if alpha != 1.0:
        y = ctx.add("Mul", [y, ctx.constant(alpha)])
    if not ctx.has(2) or beta == 0.0:
        return ctx.out(y)
    m, n = ctx.graph.node(y).type.shape
    c_value = ctx.value(2)
    # a known C folded at load time: a bias row ([N], [1, N]; small) even from an initializer, so that it
    # stays the matmul's bias epilogue; a larger initializer stays a parameter, scaled after
    if beta != 1.0 and c_value.const is not None and (not c_value.param or tuple(c_value.shape) in ((n,), (1, n))):
        c = ctx.constant(beta * c_value.const.astype("float64"))
    else:
        c = ctx.tensor(2)
        if beta != 1.0:
            c = ctx.add("Mul", [c, ctx.constant(beta)])
    sc = tuple(ctx.graph.node(c).type.shape)
    if sc in ((n,), (1, n)) and n > 1:
        return ctx.out(ctx.add("BiasAdd", [y, reshape(ctx, c, [n])]))
    return ctx.out(ctx.add("Add", [y, c]))


def _gemm_blocks(ctx: NodeContext, a: int, bv: Value, op: str, tb: bool, blocks: list[tuple[int, int]],
                 alpha: float, beta: float) -> int:
    """Gemm with its known B split into ``blocks`` along N: one matmul per block, a known bias
    of shape [N] or [1, N] split with it (fused into each matmul), any other C added after."""
    c = ctx.value(2) if ctx.has(2) and beta != 0.0 else None
    n = bv.shape[0 if tb else 1]
    bias = None
    if c is not None and c.const is not None and tuple(c.shape) in ((n,), (1, n)) and n > 1:
        values = c.const.reshape(n) if beta == 1.0 else beta * c.const.astype("float64").reshape(n)
        bias = Value(c.name, c.elem, (n,), const=values, param=c.param and beta == 1.0)
    ys = []
    for lo, hi in blocks:
        y = ctx.add(op, [a, weight_block(ctx, bv, 0 if tb else 1, lo, hi)])
        if alpha != 1.0:  # alpha scales the product only, before the bias (it scaled the bias too)
            y = ctx.add("Mul", [y, ctx.constant(alpha)])
        if bias is not None:
            y = ctx.add("BiasAdd", [y, weight_block(ctx, bias, 0, lo, hi)])
        ys.append(y)
    y = ctx.add("Concat", ys, axis=1)
    if c is None or bias is not None:
        return y
    cn = ctx.tensor(2)
    if beta != 1.0:
        cn = ctx.add("Mul", [cn, ctx.constant(beta)])
    return ctx.add("Add", [y, cn])


def _batched_matmul_form(letters: list[str], out: str):
    """(batch, m, k, n, trans_a, trans_b) when operand letters ``letters`` = [A, B] and the
    output ``out`` spell a batched matmul: out = batch + m + n, A = batch + (m + k or k + m),
    B = batch + (k + n or n + k), no letter repeated or summed within one operand; else None."""
    la, lb = letters
    if len(set(la)) != len(la) or len(set(lb)) != len(lb):
        return None
    batch = "".join(c for c in out if c in la and c in lb)
    m = "".join(c for c in out if c in la and c not in lb)
    n = "".join(c for c in out if c in lb and c not in la)
    k = "".join(c for c in la if c in lb and c not in out)
    if out != batch + m + n or set(la) != set(batch + m + k) or set(lb) != set(batch + k + n):
        return None
    if la not in (batch + m + k, batch + k + m) or lb not in (batch + k + n, batch + n + k):
        return None
    return batch, m, k, n, la != batch + m + k, lb != batch + k + n


@converter("Einsum")
def _einsum(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("equation",))
    n_in = len(ctx.inputs)
    float_inputs(ctx, *range(n_in))
    equation = ctx.attr("equation")
    if equation is None:
        raise ctx.fail("the equation attribute is required")
    if n_in > MAX_EINSUM_OPERANDS:
        raise ctx.fail(f"equation {equation!r} has {n_in} operands; eggfuse runs Einsum of 1 to "
                       f"{MAX_EINSUM_OPERANDS} (split it into pairwise Einsums)")
    shapes = [ctx.shape(i) for i in range(n_in)]
    try:
        letters, out, sizes = parse_einsum(equation, shapes)
    except ValueError as e:
        raise ctx.fail(f"{e}; input shapes {[list(s) for s in shapes]}") from None
    xs = [ctx.tensor(i) for i in range(n_in)]
    if n_in == 2:
        for order in ((0, 1), (1, 0)):
            form = _batched_matmul_form([letters[order[0]], letters[order[1]]], out)
            shared = all(shapes[0][letters[0].index(c)] == shapes[1][letters[1].index(c)]
                         for c in (form[0] if form else ""))
            if form and shared:
                return ctx.out(_einsum_matmul(ctx, [xs[i] for i in order], form, sizes, out))
    if n_in == 1 and len(shapes[0]) == 2 and letters[0] == out[::-1] and len(set(out)) == 2:
        return ctx.out(ctx.add("Transpose", xs))
    if n_in == 1 and letters[0] == out:
        return ctx.value(0)
    if len(sizes) > MAX_EINSUM_LETTERS:
        raise ctx.fail(f"equation {equation!r} uses {len(sizes)} letters (with '...' axes); eggfuse's Einsum takes "
                       f"at most {MAX_EINSUM_LETTERS}")
    return ctx.out(ctx.add("Einsum", xs, equation=equation))


def _einsum_matmul(ctx: NodeContext, xs: list[int], form, sizes: dict[str, int], out: str) -> int:
    batch, m, k, n, ta, tb = form
    size = lambda letters: math.prod(sizes[c] for c in letters)  # noqa: E731
    nb, nm, nk, nn = size(batch), size(m), size(k), size(n)
    if not out:  # an inner product: BatchMatMul of two vectors gives the rank-0 result
        return ctx.add("BatchMatMul", [reshape(ctx, xs[0], [nk]), reshape(ctx, xs[1], [nk])])
    a = reshape(ctx, xs[0], [*([nb] if batch else []), *((nk, nm) if ta else (nm, nk))])
    b = reshape(ctx, xs[1], [*([nb] if batch else []), *((nn, nk) if tb else (nk, nn))])
    if not batch and not (ta and tb):
        y = ctx.add({(False, False): "MatMul", (True, False): "MatMulAT", (False, True): "MatMulBT"}[(ta, tb)], [a, b])
    else:
        y = ctx.add("BatchMatMul", [a, b], trans_a=ta, trans_b=tb)
    return reshape(ctx, y, [sizes[c] for c in out])
