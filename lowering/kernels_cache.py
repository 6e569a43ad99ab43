"""Lowering entries of the KV-cache ops (ir/ops_cache.py).

RoPEDynamic shares RoPE's rotation (rope_rotate.wgsl) and uniform (kernels.rope_uniform);
CachedAttention spreads each query row's keys over a workgroup (attention_cached.wgsl) and
reads through the attention kernels' accessors (kernels.attention_io); CacheWrite binds the cache last,
read_write, as in-place ops do.
"""

from __future__ import annotations

import math

from ..ir.errors import LoweringError
from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import (
    MAX_ATTENTION_HEAD_DIM,
    KernelCall,
    _elementwise_groups,
    attention_io,
    kernel,
    rope_uniform,
)
from .wgsl import render, uniform_bytes

#: Invocations per workgroup of CachedAttention: keys scored at once by one (query row,
#: head); at least MAX_ATTENTION_HEAD_DIM / 4, the vec4 columns of the output row.
CACHED_ATTENTION_WG = 128


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


@kernel("CachedAttention")
def _cached_attention(node: Node, ins: list[TensorType]) -> KernelCall:
    # One sequence of n query rows; query row qi (position pos + qi) reads keys 0..pos+qi,
    # never past the cache's last row (arrayLength(k_cache) / kv_stride rows).
    a = node.attrs
    nh, nkv, hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    if hd > MAX_ATTENTION_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, q {ins[0]}): head_dim {hd} is above the "
                            f"kernel's maximum of {MAX_ATTENTION_HEAD_DIM}")
    src = render("attention_cached.wgsl", HEAD_DIM=hd, WG=CACHED_ATTENTION_WG,
                 IO=attention_io(("q", "k_cache", "v_cache"), hd, 4))
    total = ins[0].shape[0] * nh
    params = uniform_bytes(nh, nh // nkv, total, float(1.0 / math.sqrt(hd)), nh * hd, nkv * hd)
    return KernelCall(f"cached_attention_hd{hd}", src, params, total)
