"""Lowering entries of the KV-cache ops (ir/ops_cache.py).

RoPEDynamic and CacheWriteRoPE share RoPE's rotation (rope_rotate.wgsl) and uniform
(kernels.rope_uniform); CachedAttention and CachedAttentionRoPE spread each query row's keys
over a workgroup (attention_cached.wgsl) and read through the attention kernels' accessors
(kernels.attention_io); CacheWrite and CacheWriteRoPE bind the cache last, read_write, as
in-place ops do.
"""

from __future__ import annotations

import math

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import (
    _ATTENTION_ROPE_PARAMS,
    MAX_ATTENTION_HEAD_DIM,
    KernelCall,
    _elementwise_groups,
    _inv_freq,
    attention_io,
    kernel,
    rope_uniform,
)
from .wgsl import render, shader_text, uniform_bytes

#: Invocations per workgroup of CachedAttention: keys scored at once by one (query row,
#: head); at least MAX_ATTENTION_HEAD_DIM / 4, the vec4 columns of the output row. On the
#: H200 (SmolLM2 decode, 9 workgroups per call) 256 took 14.3 us per call at 128 keys and
#: 26.5 us at 1000 against 18.4 and 42.3 us with 128 (subgroup reductions on).
CACHED_ATTENTION_WG = 256


@kernel("RoPEDynamic")
def _rope_dynamic(node: Node, ins: list[TensorType]) -> KernelCall:
    params, n = rope_uniform(node, batch=1, pos_offset=0.0)
    return KernelCall("rope_dynamic", render("rope_dynamic.wgsl"), params, _elementwise_groups(n))


@kernel("CacheWrite")
def _cache_write(node: Node, ins: list[TensorType]) -> KernelCall:
    rows, width = ins[0].shape
    n = ins[1].num_elements
    return KernelCall("cache_write", render("cache_write.wgsl"), uniform_bytes(n, width, rows),
                      _elementwise_groups(n))


@kernel("CacheWriteRoPE")
def _cache_write_rope(node: Node, ins: list[TensorType]) -> KernelCall:
    params, n = rope_uniform(node, batch=1, pos_offset=0.0, shape=ins[1].shape)
    return KernelCall("cache_write_rope", render("cache_write_rope.wgsl"), params, _elementwise_groups(n))


@kernel("CachedAttention", "CachedAttentionRoPE")
def _cached_attention(node: Node, ins: list[TensorType]) -> KernelCall:
    # One sequence of n query rows; query row qi (position pos + qi) reads keys 0..pos+qi,
    # never past the cache's last row (arrayLength(k_cache) / kv_stride rows).
    # CachedAttentionRoPE rotates each query row in workgroup memory as it is loaded.
    a = node.attrs
    rope = node.op == "CachedAttentionRoPE"
    nh, nkv, hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    src = render("attention_cached.wgsl", HEAD_DIM=hd, WG=CACHED_ATTENTION_WG,
                 IO=attention_io(("q", "k_cache", "v_cache"), hd, 4),
                 ROPE_PARAMS=_ATTENTION_ROPE_PARAMS if rope else "",
                 ROTATE_Q=shader_text("attention_cached_rope.wgsl") if rope
                 else "fn rotate_q(li: u32, position: u32) {}  // CachedAttention: q is used as it is")
    total = ins[0].shape[0] * nh
    rope_params = []
    if rope:
        rope_params = [*_inv_freq(a, MAX_ATTENTION_HEAD_DIM // 2), int(a["pairing"] == "adjacent")]
    params = uniform_bytes(*rope_params, nh, nh // nkv, total, float(1.0 / math.sqrt(hd)), nh * hd, nkv * hd)
    return KernelCall(f"cached_attention_hd{hd}" + ("_rope" if rope else ""), src, params, total)
