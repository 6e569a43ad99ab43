"""Cost model: bytes moved per kernel plus a fixed per-dispatch cost, from shapes.

Unit: byte-equivalents. A kernel costs ``bytes_read + bytes_written`` (each input and
the output read or written once, 4 bytes an element) plus ``dispatch_bytes`` per
dispatch, the launch overhead expressed as the bytes the device could move in that time
(default 1 MiB: about 6 us of host time per dispatch, as measured on an H200, at ~170 GB/s
of effective small-kernel bandwidth). Views (reshape) and leaves cost nothing; a leaf's
bytes are charged to the kernels that read it. A fused matmul's epilogue operands are
charged to their epilogue step, so the whole fused kernel costs the same as one kernel
reading all its inputs.

The extractor sums marginal costs over the extracted DAG, counting a shared sub-term once.
Pass your own model by subclassing :class:`CostModel` and overriding :meth:`kernel_cost`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import OPS, Graph
from .sorts import CONSTRUCTORS, GENERIC_CONSTRUCTORS, VARIADIC_CONSTRUCTOR


@dataclass(frozen=True)
class KernelInfo:
    """What one kernel (or one epilogue step of a fused matmul) moves.

    ``op`` is the IR op name, or ``epilogue:bias`` / ``epilogue:add`` for the operand read
    of an epilogue step (``dispatches`` 0 then). Byte counts are in bytes.
    """

    op: str
    dispatches: int
    bytes_read: int
    bytes_written: int


class CostModel:
    """Default cost: ``dispatches * dispatch_bytes + bytes_read + bytes_written``."""

    def __init__(self, dispatch_bytes: int = 1 << 20) -> None:
        self.dispatch_bytes = int(dispatch_bytes)

    def kernel_cost(self, k: KernelInfo) -> int:
        return k.dispatches * self.dispatch_bytes + k.bytes_read + k.bytes_written

    def graph_cost(self, graph: Graph) -> int:
        """Cost of the live part of ``graph`` under this model (the extractor's objective)."""
        total = 0
        for node in graph.live_nodes():
            if (n := graph.dispatches(node)) == 0:
                continue
            reads = sum(graph.node(i).type.size_bytes for i in node.inputs)
            total += self.kernel_cost(KernelInfo(node.op, n, reads, node.type.size_bytes))
        return total


#: Constructors that are no kernel: leaves, views, epilogue structure, the output list and
#: argument lists (a variadic e-node is charged for the tensors in its list). ``concat``
#: only ever packs parameters (a derived parameter, packed at load).
FREE_CONSTRUCTORS = {"T.input", "T.parameter", "T.constant", "T.reshape", "T.concat", "Epi.none",
                     "Epi.act", "TList.nil", "TList.cons", "Args.nil", "Args.cons"}
GENERIC_NAMES = {str(c) for c in (*GENERIC_CONSTRUCTORS.values(), VARIADIC_CONSTRUCTOR)}
_EPI_OPERAND = {"Epi.bias": "epilogue:bias", "Epi.add": "epilogue:add"}
#: Constructor name ("T.matmul") -> IR op name ("MatMul").
OP_OF_CONSTRUCTOR = {str(ctor): op for op, (ctor, _) in CONSTRUCTORS.items()} | {
    "T.fused_matmul": "FusedMatMul", "T.full_attention_masked": "FullAttention",
    "T.fused_rms_norm_matmul": "FusedRmsNormMatMul", "T.slice_cols": "SliceCols",
    "T.causal_attention_rope": "CausalAttentionRoPE", "T.causal_attention_rope_packed": "CausalAttentionRoPE",
    "T.cached_attention_rope": "CachedAttentionRoPE"}


def enode_cost(model: CostModel, ctor: str, tensor_child_bytes: list[int], out_bytes: int,
               op: str | None = None) -> int:
    """Marginal cost of one e-node: its constructor name, the bytes of its tensor (``T``)
    children in order (for ``T.opn``, of the tensors in its ``Args`` list), and the bytes of
    its own e-class. Shared by every extractor.
    ``op`` names the IR op of a generic constructor (``T.op2("Softmax", ...)``)."""
    if ctor in FREE_CONSTRUCTORS:
        return 0
    if ctor in _EPI_OPERAND:
        return model.kernel_cost(KernelInfo(_EPI_OPERAND[ctor], 0, tensor_child_bytes[0], 0))
    op = op or OP_OF_CONSTRUCTOR[ctor]
    return model.kernel_cost(KernelInfo(op, OPS[op].dispatches, sum(tensor_child_bytes), out_bytes))
