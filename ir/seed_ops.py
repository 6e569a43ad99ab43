"""Every op kind of the seed (meganeura 0.2.0 ``graph.rs``, ``pub enum Op``) and what stands for
it here.

:data:`SEED_OP_MAP` maps each seed variant to the names of the ops of :data:`~.ops.OPS` that
implement it (a tuple), or to a reason string for the variants that are not ops for us.
:data:`SEED_NOTES` says how a mapping differs from the seed where it is not one-to-one.
"""

from __future__ import annotations

SEED_OP_MAP: dict[str, tuple[str, ...] | str] = {
    # leaves
    "Parameter": ("Parameter",),
    "Input": ("Input",),
    "Constant": ("Constant",),
    # matmul family and elementwise
    "MatMul": ("MatMul",),
    "MatMulAT": ("MatMulAT",),
    "MatMulBT": ("MatMulBT",),
    "Add": ("Add",),
    "Mul": ("Mul",),
    "Relu": ("Relu",),
    "Sigmoid": ("Sigmoid",),
    "Tanh": ("Tanh",),
    "Neg": ("Neg",),
    "Abs": ("Abs",),
    "Log": ("Log",),
    "Recip": ("Recip",),
    # reductions, losses, comparison, shape
    "SumAll": ("SumAll",),
    "MeanAll": ("MeanAll",),
    "SumRows": ("SumRows",),
    "Softmax": ("Softmax",),
    "CrossEntropyLoss": ("CrossEntropyLoss",),
    "BceLoss": ("BceLoss",),
    "Greater": ("Greater",),
    "Transpose": ("Transpose",),
    "BiasAdd": ("BiasAdd",),
    "FusedMatMulAdd": ("FusedMatMul",),
    "FusedMatMulATAdd": ("FusedMatMul",),
    "FusedMatMulBTAdd": ("FusedMatMul",),
    "Nop": "not an op: the seed turns nodes a fusion consumed into Nop and skips them when it "
           "compiles; our rewrites extract a new graph, and Graph.live_nodes / Graph.pruned drop "
           "every node no output depends on, so a dead node needs no kind of its own",
    "Identity": ("Identity",),
    "LogSoftmax": ("LogSoftmax",),
    "ScatterAdd": ("ScatterAdd",),
    # transformer
    "Silu": ("Silu",),
    "SwiGLU": ("SwiGLU",),
    "SwiGLUConcat": ("SwiGLUConcat",),
    "SwiGLUConcatGrad": ("SwiGLUConcatGrad",),
    "SwiGLUGradGate": ("SwiGLUGradGate",),
    "SwiGLUGradUp": ("SwiGLUGradUp",),
    "SiluGrad": ("SiluGrad",),
    "RmsNorm": ("RmsNorm",),
    "Embedding": ("Embedding",),
    "RoPE": ("RoPE", "RoPEDynamic"),
    "RoPEGrad": ("RoPEGrad",),
    "CausalAttention": ("CausalAttention",),
    "CausalAttentionRoPE": ("CausalAttentionRoPE",),
    # vision / VLA
    "Gelu": ("Gelu",),
    "LayerNorm": ("LayerNorm",),
    "FullAttention": ("FullAttention",),
    "CrossAttention": ("CrossAttention",),
    "MultiHeadAttn": ("FullAttention", "CrossAttention"),
    "MultiHeadAttnGradQ": ("AttentionGradQ", "CrossAttentionGradQ", "SlidingWindowAttentionGradQ"),
    "MultiHeadAttnGradK": ("AttentionGradK", "CrossAttentionGradK", "SlidingWindowAttentionGradK"),
    "MultiHeadAttnGradV": ("AttentionGradV", "CrossAttentionGradV", "SlidingWindowAttentionGradV"),
    "FusedRmsNormMatMul": ("FusedRmsNormMatMul",),
    "RmsNormGradW": ("RmsNormGradW",),
    "RmsNormGradX": ("RmsNormGradX",),
    "LayerNormGradWB": ("LayerNormGradW", "SumRows"),
    "LayerNormGradX": ("LayerNormGradX",),
    # conv, pooling, group norm, concat / split, upsample
    "Conv2d": ("Conv2d",),
    "Conv2dGradInput": ("Conv2dGradInput",),
    "Conv2dGradWeight": ("Conv2dGradWeight",),
    "MaxPool2d": ("MaxPool2d",),
    "GlobalAvgPool": ("GlobalAvgPool",),
    "GlobalAvgPoolGrad": ("GlobalAvgPoolGrad",),
    "GroupNorm": ("GroupNorm",),
    "GroupNormSilu": ("GroupNormSilu",),
    "GroupNormGradInput": ("GroupNormGradInput",),
    "GroupNormGradWeightBias": ("GroupNormGradWeight", "ReduceTo"),
    "Concat": ("Concat",),
    "SplitA": ("Identity", "SliceCols"),
    "SplitB": ("Identity", "SliceCols"),
    "Upsample2x": ("Upsample2x",),
    "Upsample2xGrad": ("Upsample2xGrad",),
    # KV cache
    "SlidingWindowAttention": ("SlidingWindowAttention",),
    "CacheWrite": ("CacheWrite",),
    "CachedAttention": ("CachedAttention",),
}

SEED_NOTES: dict[str, str] = {
    "FusedMatMulAdd": "FusedMatMul(variant='', epilogue=('add',)); any chain of bias, add and unary steps",
    "FusedMatMulATAdd": "FusedMatMul(variant='AT', epilogue=('add',))",
    "FusedMatMulBTAdd": "FusedMatMul(variant='BT', epilogue=('add',))",
    "Greater": "broadcasts like Add (the seed needs equal shapes)",
    "RoPE": "RoPE takes the static pos_offset; the seed's two-input form (offset read from a u32 "
            "buffer at run time, for decoding) is RoPEDynamic",
    "MultiHeadAttn": "is_cross=false is FullAttention, is_cross=true CrossAttention. The seed also "
                     "writes the softmax logsumexp to a side buffer for the backward; a node has one "
                     "output here, so the gradient ops recompute it",
    "MultiHeadAttnGradQ": "by the forward op: FullAttention -> AttentionGradQ(causal=False), "
                          "CausalAttention -> AttentionGradQ(causal=True), CrossAttention -> "
                          "CrossAttentionGradQ, SlidingWindowAttention -> SlidingWindowAttentionGradQ; "
                          "inputs [dO, q, k, v] as the seed's, with no fwd_node (O and the logsumexp "
                          "are recomputed)",
    "MultiHeadAttnGradK": "as MultiHeadAttnGradQ, with the K ops",
    "MultiHeadAttnGradV": "as MultiHeadAttnGradQ, with the V ops",
    "LayerNormGradWB": "split in two: LayerNormGradW, and SumRows(dy) for the bias (no [2*cols] packing)",
    "GroupNormGradWeightBias": "split in two: GroupNormGradWeight, and ReduceTo(dy, [C, 1]) for the bias",
    "Conv2d": "tensors keep their rank: input [N,Cin,H,W], kernel [Cout,Cin,kH,kW] -> [N,Cout,oH,oW]; "
              "attributes stride, padding_h, padding_w (the sizes come from the shapes)",
    "Conv2dGradInput": "attributes in_h, in_w, stride, padding_h, padding_w; -> [N,Cin,in_h,in_w]",
    "Conv2dGradWeight": "attributes kernel_h, kernel_w, stride, padding_h, padding_w",
    "MaxPool2d": "[N,C,H,W] -> [N,C,oH,oW]; its gradient is MaxPool2dGrad (the seed has none)",
    "GlobalAvgPool": "[N,C,H,W] (or [N,C,S]) -> [N,C]",
    "GlobalAvgPoolGrad": "[N,C] -> the attribute shape",
    "GroupNorm": "x [N, C, S] (S = H*W) instead of the seed's flat [N*C*S]",
    "SplitA": "x [N, Ca+Cb, H, W] viewed as [N, (Ca+Cb)*H*W] (Identity), columns [0, Ca*H*W) "
              "(SliceCols), viewed as [N, Ca, H, W]: what Concat's gradient emits",
    "SplitB": "as SplitA with columns [Ca*H*W, (Ca+Cb)*H*W)",
    "Upsample2x": "[N,C,H,W] -> [N,C,2H,2W] instead of the seed's flat sizes",
    "SlidingWindowAttention": "row i sees keys i - window_size < j <= i; optional key_mask; differentiable",
    "CrossAttention": "optional key_mask [batch, kv_seq]; differentiable (CrossAttentionGradQ/K/V)",
}

