"""Lowering entries of the KV-cache ops (ir/ops_cache.py).

RoPEDynamic shares RoPE's rotation (rope_rotate.wgsl) and uniform layout; CachedAttention
is the attention template (attention.wgsl) with the cache's row count and the run-time
position in its key loop; CacheWrite binds the cache last, read_write, as in-place ops do.
"""

from __future__ import annotations

import math

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import (
    ATTENTION_ROWS,
    MAX_ATTENTION_HEAD_DIM,
    MAX_ROPE_HEAD_DIM,
    KernelCall,
    _elementwise_groups,
    _inv_freq,
    kernel,
)
from .wgsl import render, shader_text, uniform_bytes


@kernel("RoPEDynamic")
def _rope_dynamic(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, width = node.type.shape
    a = node.attrs
    hd = a["head_dim"]
    if hd > MAX_ROPE_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, {node.type}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ROPE_HEAD_DIM}")
    n = rows * width // 2
    params = uniform_bytes(*_inv_freq(a["theta"], hd, MAX_ROPE_HEAD_DIM // 2), n, width // 2, hd // 2, rows, 0.0,
                           int(a["pairing"] == "adjacent"))
    return KernelCall("rope_dynamic", render("rope_dynamic.wgsl"), params, _elementwise_groups(n))


@kernel("CacheWrite")
def _cache_write(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, width = ins[0].shape
    n = ins[1].num_elements
    return KernelCall("cache_write", render("cache_write.wgsl"), uniform_bytes(n, width, rows),
                      _elementwise_groups(n))


@kernel("CachedAttention")
def _cached_attention(node: Node, ins: list[TensorType]) -> KernelCall:
    # One sequence of n query rows; query row qi (position pos + qi) reads keys 0..pos+qi,
    # never past the cache's last row (arrayLength(k_cache) / kv_stride rows).
    a = node.attrs
    nh, nkv, hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    names = ("q", "k_cache", "v_cache")
    inputs = [f"@group(0) @binding({i}) var<storage, read> {n}: array<f32>;" for i, n in enumerate(names)]
    inputs.append("@group(0) @binding(3) var<storage, read> cache_pos: array<u32>;")
    src = render(
        "attention.wgsl",
        HEAD_DIM=hd,
        ROPE_PARAMS="",
        INPUTS="\n".join(inputs),
        V="v_cache",
        QK=shader_text("attention_qk.wgsl").replace("{{Q}}", "q").replace("{{K}}", "k_cache"),
        MASK_BINDING="",
        MASK="",
        KEY_END="min(cache_pos[0] + qi + 1u, arrayLength(&k_cache) / p.kv_stride)",
        OUT=4,
        UNIFORM=5,
    )
    seq = ins[0].shape[0]
    q_blocks = math.ceil(seq / ATTENTION_ROWS)
    total = nh * q_blocks
    params = uniform_bytes(seq, nh, nkv, nh // nkv, q_blocks, total, float(1.0 / math.sqrt(hd)),
                           nh * hd, nkv * hd, 0, 0)
    return KernelCall(f"cached_attention_hd{hd}", src, params, total)
