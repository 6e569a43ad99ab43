"""Integer value ranges of a graph's i32, u32 and bool tensors (interval arithmetic), for the
check of indices the graph computes itself.

An index an op reads from a graph input is checked by the runtime before each run, and a
constant one at lowering; an index computed on the device cannot be (the kernels clamp it, as
reading past a buffer is no answer either). Exporters compute some: RoBERTa's position ids
count the tokens that are not padding (``CumSum``), so a sequence longer than the position table
allows indexes past it, which ONNX refuses. :func:`index_overruns` bounds such indices from the
shapes alone and lists the readers they may overrun, so that the caller refuses the shapes
instead of returning rows of clamped indices.

The ranges are conservative: a node's values lie in [lo, hi] whatever the inputs' values, or the
node has no range (an unknown value: an input, a float cast to an integer, an op not listed
here). Bool tensors lie in [0, 1]; sums, differences and products follow interval arithmetic
(Moore, *Interval Analysis*, 1966); a ``CumSum`` of L terms in [lo, hi] lies in
[min(lo, L lo), max(hi, L hi)] (0 included when exclusive); ops that move or select elements
keep their data's range.
"""

from __future__ import annotations

from .graph import Graph, Node, NodeId
from .spec import OPS
from .types import DType

Range = tuple[int, int]

#: Ops whose values are elements of their first input (moved, selected or repeated).
_SELECTS = frozenset({"Identity", "Expand", "Permute", "Transpose", "Slice", "Tile", "Gather", "GatherElements",
                      "GatherElementsBroadcast",
                      "GatherND", "SliceCols"})


def _span(values: list[int]) -> Range:
    return min(values), max(values)


def _range_of(node: Node, ins: list[Range | None], graph: Graph) -> Range | None:
    if node.type.dtype is DType.BOOL:
        return 0, 1
    if node.type.dtype not in (DType.I32, DType.U32):
        return None
    op = node.op
    if op == "Constant":
        value = node.attrs["value"]
        return (int(value.min()), int(value.max())) if value.size else None
    if op == "Cast":  # from bool or an integer: the same values (a float's are not known)
        return ins[0] if graph.node(node.inputs[0]).type.dtype in (DType.BOOL, DType.I32, DType.U32) else None
    if op in _SELECTS:  # the data's range, whatever selects from it
        return ins[0] if ins else None
    if any(r is None for r in ins) or not ins:
        return None
    if op == "Concat":
        return min(r[0] for r in ins), max(r[1] for r in ins)
    if op == "Where":  # the condition's range does not matter
        return min(ins[1][0], ins[2][0]), max(ins[1][1], ins[2][1])
    if op == "Add":
        return ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]
    if op == "Sub":
        return ins[0][0] - ins[1][1], ins[0][1] - ins[1][0]
    if op == "Mul":
        return _span([a * b for a in ins[0] for b in ins[1]])
    if op == "Neg":
        return -ins[0][1], -ins[0][0]
    if op == "Abs":
        lo, hi = ins[0]
        return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op == "Max":
        return max(ins[0][0], ins[1][0]), max(ins[0][1], ins[1][1])
    if op == "Min":
        return min(ins[0][0], ins[1][0]), min(ins[0][1], ins[1][1])
    if op == "Clip" and len(ins) == 3:  # min(max(x, low), high), each bound a range of its own
        (lo, hi), low, high = ins
        return min(max(lo, low[0]), high[0]), min(max(hi, low[1]), high[1])
    if op == "CumSum":
        lo, hi = ins[0]
        terms = graph.node(node.inputs[0]).type.shape[node.attrs["axis"] % node.type.rank]
        low, high = min(lo, terms * lo), max(hi, terms * hi)
        return (min(low, 0), max(high, 0)) if node.attrs["exclusive"] else (low, high)
    return None


def value_ranges(graph: Graph) -> dict[NodeId, Range]:
    """Node id -> [lo, hi] holding every value of the node, for the i32, u32 and bool nodes
    whose values the shapes bound (see the module docstring); nodes left out have none."""
    ranges: dict[NodeId, Range] = {}
    for node in graph.nodes:  # in order: inputs come first
        r = _range_of(node, [ranges.get(i) for i in node.inputs], graph)
        if r is not None:
            ranges[node.id] = r
    return ranges


def index_overruns(graph: Graph) -> list[tuple[Node, int, Range]]:
    """(node, rows, range) for every live node the graph computes (not an input or a constant, which
    the runtime and the lowering check) that an op reads as indices (:meth:`Graph.index_bounds`)
    and whose range reaches outside the bound: [0, rows) for u32 indices, [-rows, rows) for i32
    ones (ONNX Gather's, negative from the end)."""
    ranges = value_ranges(graph)
    live = {n.id for n in graph.live_nodes()}
    out = []
    for nid, rows in graph.index_bounds().items():
        node = graph.node(nid)
        if nid not in live or OPS[node.op].leaf or nid not in ranges:
            continue
        lo, hi = ranges[nid]
        if hi >= rows or lo < (-rows if node.type.dtype is DType.I32 else 0):
            out.append((node, rows, (lo, hi)))
    return out


__all__ = ["index_overruns", "value_ranges"]
