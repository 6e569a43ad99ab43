"""A small graph of the ops the hand-built models use, shared by the lowering and constant-parameter tests."""

from __future__ import annotations

from eggfuse.ir import DType, Graph


def every_op_graph() -> Graph:
    """The ops the hand-built models use (attention, RoPE, norms, products, concat, embedding, ...) on small
    shapes: tests/unit/test_lowering.py renders their kernels, tests/gpu/test_constant_params.py runs them."""
    g = Graph()
    x = g.input("x", [4, 8])
    w = g.parameter("w", [8, 8])
    q = g.rope(x, 10000.0, head_dim=4, pairing="adjacent")
    att = g.full_attention(q, x, x, 2, 2, 4, key_mask=g.input("m", [1, 4]))
    outs = [att, g.causal_attention(x, x, x, 2, 2, 4),
            g.layer_norm(x, g.parameter("lw", [8]), g.parameter("lb", [8])),
            g.rms_norm(x, g.parameter("rw", [8])), g.softmax(x), g.transpose(x), g.mean_all(x), g.sum_all(x),
            g.swiglu(x, x), g.mul(x, x), g.matmul_at(x, x), g.matmul_bt(x, w),
            g.embedding(g.input("ids", [3], DType.U32), w),
            g.add_node("FusedRmsNormMatMul", (x, g.parameter("nw", [8]), w), eps=1e-5, variant="BT",
                       epilogue=("Silu",)),
            g.concat([x, w], axis=0), g.concat([w, g.parameter("w2", [8, 8])], axis=1), g.slice_cols(x, 2, 3),
            g.swiglu_concat(x), g.causal_attention_rope(x, x, x, 2, 2, 4, 10000.0, pairing="adjacent"),
            g.group_norm(g.reshape(x, [2, 4, 4]), g.parameter("gw", [4]), g.parameter("gb", [4]), 2),
            g.add_node("GroupNormSilu", (g.reshape(x, [1, 8, 4]), g.parameter("sw", [8]), g.parameter("sb", [8])),
                       num_groups=4, eps=1e-5)]
    g.set_outputs(outs)
    return g
