"""Lowering: Graph -> ExecutionPlan (buffers, dispatches with specialised WGSL)."""

from . import (
    kernels_backward,  # noqa: F401  (registers the training ops' kernels)
    kernels_cache,  # noqa: F401  (registers the KV-cache ops' kernels)
    kernels_extra,  # noqa: F401  (registers the kernels of ir/ops_extra.py)
    kernels_matmul,  # noqa: F401  (registers the matmul family's kernels)
    kernels_train,  # noqa: F401, I001  (registers the optimiser updates)
)
from .kernels import KERNELS, UNARY_WGSL
from .limits import DEFAULT_LIMITS, limit_name
from .plan import BufferSpec, DerivedParameter, Dispatch, ExecutionPlan, check_limits, lower

__all__ = [
    "DEFAULT_LIMITS", "KERNELS", "UNARY_WGSL", "BufferSpec", "DerivedParameter", "Dispatch", "ExecutionPlan",
    "check_limits", "limit_name", "lower",
]
