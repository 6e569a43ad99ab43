"""The op families: one module per family, one spec block per op (:class:`~..spec.OpSpec`).

:data:`FAMILIES` lists the modules, the basic ones first (leaves, elementwise, ...). Importing
this package registers every op into :data:`~..spec.OPS` and every rule group into
:data:`~..spec.RULES`, family by family in the order the modules are first imported. That
order follows the modules' imports of each other (attention imports transformer's RoPE, so
transformer's ops come first), not :data:`FAMILIES`. Nothing else lists ops: encoding, cost,
lowering and autodiff read the specs.
"""

from __future__ import annotations

from ..spec import OPS, RULES
from . import (  # a module imports the families it builds on itself
    arithmetic,
    attention,
    attention_exported,
    attention_general,
    attention_layout,
    axis_norms,
    conv,
    conv_fused,
    elementwise,
    epilogue_rules,
    fused,
    half,
    indexing,
    kv_cache,
    leaves,
    linalg,
    losses,
    matmul,
    matmul_rows,
    movement,
    norms,
    optimisers,
    pooling,
    quant,
    recognize,
    recognize_norms,
    recurrent,
    reduce_axes,
    reductions,
    resample,
    rope_exported,
    scans,
    shape,
    token_pool,
    transformer,
    unary,
    vision,
)

#: The family modules, the basic ones first (not the order of OPS: see the module docstring).
FAMILIES = (leaves, elementwise, unary, arithmetic, reductions, shape, movement, indexing, matmul, norms, transformer,
            attention, attention_general, attention_exported, attention_layout, recurrent, kv_cache, vision, losses,
            optimisers, reduce_axes, scans, axis_norms, linalg, conv, conv_fused, pooling, resample, rope_exported,
            recognize, recognize_norms, token_pool, quant, half, fused, epilogue_rules, matmul_rows)

__all__ = ["FAMILIES", "OPS", "RULES"]
