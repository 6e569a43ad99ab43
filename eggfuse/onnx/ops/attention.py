"""Attention, RotaryEmbedding and SwiGLU.

``Attention`` (opsets 23-25) maps onto the fused attention kernels where the layout and the
options fit them: 3-D Q/K/V (the [batch * seq, heads * head_dim] rows those kernels read, a
reshape away), no past key/value, no mask, no nonpad_kv_seqlen, no softcap, no window, the
default scale, one head size for Q/K and V and as many queries as keys go to
``FullAttention`` (``is_causal`` 0) or ``CausalAttention`` (1). Everything else goes to
``GeneralAttention``; ``qk_matmul_output`` is ``AttentionScores``; the present key and value
are ``Concat`` of the past and the new ones (``SplitHeads`` first for 3-D inputs).
``softmax_precision`` is accepted for every float type: the softmax is computed in float32.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from eggfuse.ir.ops.attention import MAX_ATTENTION_HEAD_DIM

from ..importer import NodeContext, Value, converter

_ATTENTION_ATTRS = ("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                    "softmax_precision", "left_window_size", "right_window_size")
_FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _split(ctx: NodeContext, i: int, heads: int | None, what: str) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head size) of Attention input ``i``."""
    shape = ctx.shape(i)
    if len(shape) == 4:
        if heads is not None and heads != shape[1]:
            raise ctx.fail(f"{what} {list(shape)} has {shape[1]} heads, but the node's attribute says {heads}")
        return shape
    if heads is None or heads < 1:
        raise ctx.fail(f"{what} is 3-D {list(shape)}: q_num_heads and kv_num_heads must be given")
    if shape[2] % heads:
        raise ctx.fail(f"{what} {list(shape)}: width {shape[2]} is not a multiple of {heads} heads")
    return shape[0], heads, shape[1], shape[2] // heads


@converter("Attention")
def _attention(ctx: NodeContext) -> list[Value | None]:
    ctx.refuse_attrs(_ATTENTION_ATTRS)
    ranks = {len(ctx.shape(i)) for i in range(3)}
    if len(ranks) != 1 or not ranks <= {3, 4}:
        raise ctx.fail(f"Q, K and V must all be 3-D or all 4-D, got {[list(ctx.shape(i)) for i in range(3)]}")
    rank = ranks.pop()
    qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    b, nh, sq, d = _split(ctx, 0, qh, "Q")
    _, nkv, skv, dk = _split(ctx, 1, kvh, "K")
    _, _, _, dv = _split(ctx, 2, kvh, "V")
    if dk != d or nh % nkv:
        raise ctx.fail(f"Q has {nh} heads of {d}, K {nkv} heads of {dk}: the head sizes must match and the query "
                       "heads be a multiple of the kv heads")
    mode = ctx.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise ctx.fail(f"attribute qk_matmul_output_mode={mode} is not 0, 1, 2 or 3")
    precision = ctx.attr("softmax_precision")
    if precision is not None and precision not in _FLOATS:
        raise ctx.fail(f"attribute softmax_precision={precision} is not a float type")
    softcap = float(ctx.attr("softcap", 0.0))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = bool(ctx.attr("is_causal", 0))
    if ctx.has(4) != ctx.has(5):
        raise ctx.fail("past_key and past_value must be given together")
    past, lens = ctx.has(4), ctx.has(6)
    if past and lens:
        raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    want = [bool(name) for name in ctx.node.output] + [False] * 4

    q, k, v = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    offset = 0
    present = [None, None]
    if past or want[1] or want[2]:
        new = [k if rank == 4 else ctx.add("SplitHeads", [k], num_heads=nkv),
               v if rank == 4 else ctx.add("SplitHeads", [v], num_heads=nkv)]
        for slot, (i, x) in enumerate(((4, new[0]), (5, new[1]))):
            if past:
                pshape, nshape = ctx.shape(i), ctx.graph.node(x).type.shape
                if len(pshape) != 4 or pshape[:2] + pshape[3:] != nshape[:2] + nshape[3:]:
                    raise ctx.fail(f"{'past_key' if i == 4 else 'past_value'} {list(pshape)} does not fit "
                                   f"{'K' if i == 4 else 'V'} {list(nshape)} (as [batch, kv heads, past, head size])")
                x = ctx.add("Concat", [ctx.tensor(i), x], axis=2)
            present[slot] = x
        if past:
            offset = ctx.shape(4)[2]
            k, v = present
            skv += offset
    mask = None
    if ctx.has(3):
        if ctx.elem(3) not in (TensorProto.FLOAT, TensorProto.BOOL):
            ctx.tensor(3)  # an element type eggfuse does not run is refused here, by name
            raise ctx.fail("attn_mask must be bool or float")
        mask = ctx.tensor(3)
    kv_lens = None
    if lens:
        kv_lens = ctx.tensor(6)
        if mask is None:
            mask = ctx.constant(np.zeros(skv, dtype=np.float32))
    extra = [x for x in (mask, kv_lens) if x is not None]
    attrs = dict(scale=scale, num_heads=nh, kv_num_heads=nkv, softcap=softcap, causal=causal, offset=offset,
                 left_window=left, right_window=right)
    fused = (not past and not extra and softcap == 0 and left == -1 and right == -1 and d == dv and sq == skv
             and d <= MAX_ATTENTION_HEAD_DIM and np.float32(scale) == np.float32(1.0 / math.sqrt(d))
             and (rank == 3 or nh == nkv == 1))
    if fused:
        rows = [ctx.add("Identity", [x], shape=[b * sq, heads * d]) for x, heads in ((q, nh), (k, nkv), (v, nkv))]
        y = ctx.add("CausalAttention" if causal else "FullAttention", rows, num_heads=nh, num_kv_heads=nkv,
                    head_dim=d, batch=b)
        y = ctx.add("Identity", [y], shape=list(ctx.shape(0)))
    else:
        y = ctx.add("GeneralAttention", [q, k, v, *extra], **attrs)
    scores = ctx.add("AttentionScores", [q, k, *extra], mode=mode, **attrs) if want[3] else None
    return [ctx.out(y), *(ctx.out(x) if x is not None and w else None for x, w in zip(present, want[1:3], strict=True)),
            ctx.out(scores) if scores is not None else None]


@converter("RotaryEmbedding")
def _rotary_embedding(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("interleaved", "rotary_embedding_dim", "num_heads"))
    ins = [ctx.tensor(i) for i in range(3)]
    if ctx.has(3):
        if ctx.elem(3) not in (TensorProto.INT64, TensorProto.INT32):
            raise ctx.fail("position_ids must be int64")
        ins.append(ctx.tensor(3))
    x = ctx.shape(0)
    heads = ctx.attr("num_heads", 0)
    if len(x) == 3 and not heads:
        raise ctx.fail(f"input {list(x)} is 3-D: the num_heads attribute must be given")
    return ctx.out(ctx.add("RotaryEmbedding", ins, interleaved=bool(ctx.attr("interleaved", 0)),
                           rotary_embedding_dim=ctx.attr("rotary_embedding_dim", 0), num_heads=heads))


@converter("SwiGLU")
def _swiglu(ctx: NodeContext) -> Value:
    # Y = A sigmoid(alpha A) B (https://onnx.ai/onnx/operators/onnx__SwiGLU.html): the fused SwiGLU
    # kernel for alpha 1, else Mul(Mul(A, Sigmoid(Mul(A, alpha))), B)
    ctx.refuse_attrs(("alpha",))
    if ctx.shape(0) != ctx.shape(1):
        raise ctx.fail(f"A {list(ctx.shape(0))} and B {list(ctx.shape(1))} must have the same shape (SwiGLU does "
                       "not broadcast)")
    a, b = ctx.tensor(0), ctx.tensor(1)
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 1.0:
        return ctx.out(ctx.add("SwiGLU", [a, b]))
    gate = ctx.add("Sigmoid", [ctx.add("Mul", [a, ctx.constant(np.float32(alpha))])])
    return ctx.out(ctx.add("Mul", [ctx.add("Mul", [a, gate]), b]))
