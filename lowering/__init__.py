"""Lowering: Graph -> ExecutionPlan (buffers, dispatches with the WGSL of each op's kernel
builder, ``OpSpec.kernel``)."""

from .limits import DEFAULT_LIMITS, limit_name
from .plan import BufferSpec, DerivedParameter, Dispatch, ExecutionPlan, check_limits, lower

__all__ = ["DEFAULT_LIMITS", "BufferSpec", "DerivedParameter", "Dispatch", "ExecutionPlan", "check_limits",
           "limit_name", "lower"]
