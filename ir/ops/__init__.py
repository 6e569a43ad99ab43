"""The op families: one module per family, one spec block per op (:class:`~..spec.OpSpec`).

:data:`FAMILIES` lists the modules in registration order; importing this package registers
every op into :data:`~..spec.OPS` and every rule group into :data:`~..spec.RULES`. Nothing
else lists ops: encoding, cost, lowering and autodiff read the specs.
"""

from __future__ import annotations

from ..spec import OPS, RULES
from . import (  # noqa: I001  (registration order: a family may build on the ones before it)
    attention,
    conv,
    elementwise,
    kv_cache,
    leaves,
    linalg,
    losses,
    matmul,
    norms,
    optimisers,
    pooling,
    reductions,
    resample,
    shape,
    transformer,
    vision,
)

#: The family modules, in registration order.
FAMILIES = (leaves, elementwise, reductions, shape, matmul, norms, transformer, attention, kv_cache, vision, losses,
            optimisers, linalg, conv, pooling, resample)

__all__ = ["FAMILIES", "OPS", "RULES"]
