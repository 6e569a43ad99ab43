"""Cost model: bytes moved per kernel plus a fixed per-dispatch cost, from shapes.

Unit: byte-equivalents. A kernel costs ``bytes_read + bytes_written`` (each input and the
output read or written once; an op that reads part of an input says how much, ``OpSpec.read_bytes``) plus
``dispatch_bytes`` per dispatch, the launch overhead
expressed as the bytes the device could move in that time (default 1 MiB: about 6 us of host
time per dispatch, as measured on an H200, at ~170 GB/s of effective small-kernel
bandwidth). Views (reshape), leaves and derived parameters cost nothing; a leaf's bytes are
charged to the kernels that read it. A fused matmul's epilogue operands are charged to their
epilogue step, so the whole fused kernel costs the same as one kernel reading all its inputs.
A generated elementwise kernel (``Fused``) is priced in parts: its dispatch and output bytes
on the ``Fused`` e-node, each tensor it reads on that tensor's ``ExLeaf`` e-node
(:func:`fused_read_info`), its ops' FLOPs on their ``Ex`` e-nodes (no bytes: nothing inside a
region is stored). As the extractor counts an e-class once, a tensor that two regions read is
charged once; a tensor read by a region and by another kernel is charged to both.

The extractor sums marginal costs over the extracted DAG, counting a shared sub-term once.
Pass your own model by subclassing :class:`CostModel` and overriding :meth:`kernel_cost`; it
receives a :class:`KernelInfo` with the op, its input and output types, attributes and FLOPs.
A cost may be any finite number >= 0, fractional or not, in any unit: extraction keeps costs as
floats and scales them by a power of two where they are all small (or very large), so that
multiplying every cost by a constant does not change the extracted graph, up to ties
(:func:`~.problem.cost_scale`); reported costs are in the model's own units.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Any

from ..ir import OPS, EggfuseError, Graph, RewriteError, TensorType
from ..ir.sources import SOURCE_MODULE_PREFIX


@dataclass(frozen=True)
class KernelInfo:
    """What one kernel (or one epilogue step of a fused matmul) does.

    ``op`` is the IR op name, or ``epilogue:bias`` / ``epilogue:add`` for the operand read of
    an epilogue step (``dispatches`` 0 then). Byte counts are in bytes, ``flops`` in
    floating-point operations (``OpSpec.flops``); ``inputs`` and ``output`` are the tensor
    types read and written, ``attrs`` the op's attributes.
    """

    op: str
    dispatches: int
    bytes_read: int
    bytes_written: int
    flops: int = 0
    inputs: tuple[TensorType, ...] = ()
    output: TensorType | None = None
    attrs: dict[str, Any] = field(default_factory=dict, compare=False)


class CostModel:
    """Default cost: ``dispatches * dispatch_bytes + bytes_read + bytes_written``.

    A subclass overrides :meth:`kernel_cost`, which returns a finite number >= 0 in any unit
    (bytes, seconds, nanoseconds; fractions are kept, nothing is rounded). Only the ratios of
    costs matter: extraction multiplies them by a power of two that brings the smallest positive
    cost to at least 1 and the largest to at most 2**40 where they fall outside that range, so
    that its tie-breaking units (one each, e.g. in favour of a specialised op over a fallback of
    equal cost) stay small beside them; a model scaled by a constant extracts the same graph
    (up to ties). Reports give costs in the model's units. Where ``kernel_cost`` raises or returns
    anything else, optimising raises :class:`RewriteError` naming the model, the op and the
    exception or value.
    """

    def __init__(self, dispatch_bytes: int = 1 << 20) -> None:
        self.dispatch_bytes = int(dispatch_bytes)

    def kernel_cost(self, k: KernelInfo) -> float:
        return k.dispatches * self.dispatch_bytes + k.bytes_read + k.bytes_written

    def graph_cost(self, graph: Graph) -> int:
        """Cost of the live part of ``graph`` under this model (the extractor's objective)."""
        total = 0
        for node in graph.live_nodes():
            if (n := graph.dispatches(node)) == 0:
                continue
            ins = tuple(graph.node(i).type for i in node.inputs)
            total += checked_cost(self, kernel_info(node.op, node.attrs, ins, node.type, n))
        return total


def model_name(model: CostModel) -> str:
    """``module:Class`` of ``model``'s class (``path/to/file.py:Class`` for a class loaded from a file
    by :func:`~eggfuse.ir.sources.named_object`), as errors name a cost model."""
    cls = type(model)
    module = sys.modules.get(cls.__module__)
    where = getattr(module, "__file__", None) if cls.__module__.startswith(SOURCE_MODULE_PREFIX) else None
    return f"{where or cls.__module__}:{cls.__qualname__}"


def checked_cost(model: CostModel, k: KernelInfo) -> float:
    """``model.kernel_cost(k)`` as a float. Raises :class:`RewriteError` naming the model (``module:Class``),
    the op and its types, where ``kernel_cost`` raises (the exception chained; an eggfuse error passes
    through as it is) or returns no finite number >= 0 (a NaN would stall the greedy extractor, an infinity
    or a negative cost break the ILP's objective)."""
    try:
        cost = model.kernel_cost(k)
    except EggfuseError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the model's own code raises
        raise RewriteError(f"cost model {model_name(model)}: kernel_cost of {k.op} (inputs "
                           f"{[str(t) for t in k.inputs]}, output {k.output}) raised {type(e).__name__}: {e}; fix "
                           "its kernel_cost") from e
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real) or not math.isfinite(cost) or cost < 0:
        raise RewriteError(f"cost model {model_name(model)}: kernel_cost of {k.op} (inputs "
                           f"{[str(t) for t in k.inputs]}, output {k.output}) returned {cost!r}; a cost must be a "
                           "finite number >= 0 (in any unit): fix its kernel_cost")
    return float(cost)


def kernel_info(op: str, attrs: dict[str, Any], ins: tuple[TensorType, ...], out: TensorType,
                dispatches: int | None = None) -> KernelInfo:
    """The :class:`KernelInfo` of one node of ``op`` reading ``ins`` and writing ``out``."""
    spec = OPS[op]
    n = spec.dispatches if dispatches is None else dispatches
    read = spec.read_bytes(list(ins), attrs) if spec.read_bytes is not None else sum(t.size_bytes for t in ins)
    return KernelInfo(op, n, read, out.size_bytes, spec.count_flops(ins, out, attrs), ins, out, attrs)


def fused_read_info(tensor: TensorType) -> KernelInfo:
    """The :class:`KernelInfo` of a generated elementwise kernel's read of ``tensor`` (an ``ExLeaf``
    e-node: charged once per e-class, so a tensor a region reads twice is charged once)."""
    return KernelInfo("fused:read", 0, tensor.size_bytes, 0, 0, (tensor,), None)


def epilogue_operand_info(step: str, operand: TensorType) -> KernelInfo:
    """The :class:`KernelInfo` of the operand read of a fused matmul's ``bias`` or ``add`` step."""
    return KernelInfo(f"epilogue:{step}", 0, operand.size_bytes, 0, 0, (operand,), None)


__all__ = ["CostModel", "KernelInfo", "epilogue_operand_info", "fused_read_info", "kernel_info"]
