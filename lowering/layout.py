"""Weight layouts for the tiled matmul: which products read their weight transposed.

A linear layer's weight comes stored [N, K] (PyTorch's and Hugging Face's layout: the graph's ``MatMulBT``, or
a fused matmul of ``variant='BT'``) or [K, N] (an ONNX exporter's ``MatMul`` initializers: ``MatMul``,
``variant=''``). The tiled matmul kernel reads B in slices of BK rows of K: stored [N, K], each quad it loads
runs along K and is stored into workgroup memory as four floats of a column (``store_transposed`` in
``shaders/matmul.wgsl``); stored [K, N], a quad runs along N and is stored whole. Which is faster depends on
the tile: [K, N] on the tiles of fewer than 128 rows, [N, K] on those of 128 or more (measured below). So where a
product's weight is a parameter (or a derived parameter packing parameters along N, such as the Q/K/V weights
concatenated) in the other layout, :func:`~eggfuse.lowering.lower` gives the product a derived parameter of
its own, the weight transposed once on the host when a session is created (``DerivedParameter.transpose``),
and lowers the product with the other variant on it; the parameter itself then needs no device buffer (kind
'host'), so the plan's weight bytes are unchanged. The values are the same bit for bit: the kernel adds the
same products in the same order, only the loads differ.

Which products (:func:`transposed_weights`): a 'BT' or '' product whose tiled kernel is chosen
(``matmul_kernel.chosen_tile``, a ``matmul_choice`` block's tile or ``matmul_tile``'s; not the GEMV, which reads B
as stored), stored [N, K] on a tile of fewer than 128 rows or
[K, N] on one of 128 or more (``matmul_kernel.WIDE_HEAD_TILE``'s 256 timed only on [N, K]), of a weight that
is an f32 parameter (not state a step updates, not written in place)
or a derived parameter of such parameters packed along N as f32, where every live reader of that weight is
such a product and the weight is no graph output (a weight also read another way, a tied embedding table
say, keeps its layout rather than being stored twice), and where the rows of the other layout are a multiple
of 4 long (so that they load as quads, as measured).

Measured on an H100 (``bench/matmul.py --shapes MatMul:M,K,N;M,K,N``, one call, the two layouts of one
product in turn, bench/results/weights_kn_h100/layout_ab.json, us [K, N] / [N, K]): 1024 x 768 x 3072 on
64x64x16m8x4 147.7 / 157.4; 1024 x 768 x 2304 125.5 / 133.6; on 64x128x8 in 4 K ranges 1024 x 3072 x 768
158.7 / 179.4, 1024 x 768 x 768 57.9 / 62.9, 512 x 576 x 1536 50.3 / 53.6; 4096^3 on 128x128x8 3957 / 3623.
Whole plans alternated with TRANSPOSE_WEIGHTS=False (``bench/plan_ab.py``, three rounds, us GPU): MiniLM
1028.7-1041.4 against 1075.0-1083.4 (``ab_minilm_layout.json``), SmolLM2's 128-token prefill 2728.1-2733.2
against 2862.4-2863.0 (``ab_prefill_layout.json``).
"""

from __future__ import annotations

from collections import defaultdict

from ..ir.graph import Graph, Node, NodeId
from ..ir.ops.matmul_kernel import chosen_tile
from ..ir.spec import OPS
from ..ir.types import DType

#: Whether :func:`eggfuse.lowering.lower` transposes the weights :func:`transposed_weights` picks (its
#: ``transpose_weights`` argument, when None).
TRANSPOSE_WEIGHTS = True


def weight_slot(node: Node) -> tuple[int, str] | None:
    """The input slot of B of a matmul product and how B is stored: 'BT' ([N, K]: ``MatMulBT``, or an op of the
    matmul family, one with a ``variant`` attribute, of ``variant='BT'``) or '' ([K, N]: ``MatMul``, or
    ``variant=''``); B is the input named ``b``, else ``w``. None for any other node ('AT' products too)."""
    spec = OPS[node.op]
    stored = ("BT" if node.op == "MatMulBT" else "" if node.op == "MatMul"
              else node.attrs.get("variant") if "variant" in spec.attr_names else None)
    if stored not in ("BT", ""):
        return None
    for name in ("b", "w"):
        if name in spec.inputs:
            return spec.inputs.index(name), stored
    return None


def _weight(graph: Graph, node: Node, written: set[NodeId], n_axis: int) -> bool:
    # an f32 parameter that nothing updates, or a derived parameter packing such parameters along N (``n_axis``
    # of the stored weight) as f32
    def plain(n: Node) -> bool:
        return (n.op == "Parameter" and n.type.dtype == DType.F32 and not n.attrs.get("state")
                and n.id not in written)

    if plain(node):
        return True
    spec = OPS[node.op]
    return (graph.is_derived_parameter(node) and spec.pack_store == "f32" and node.attrs.get("axis", 0) == n_axis
            and not node.attrs.get("transposed", False) and all(plain(graph.node(i)) for i in node.inputs))


def _flipped(node: Node, graph: Graph, slot: int, stored: str) -> bool:
    # the product takes the tiled kernel, on a tile that reads B faster the other way than ``stored``
    b = graph.node(node.inputs[slot]).type
    if node.type.rank != 2 or b.rank != 2:
        return False
    m = node.type.shape[0]
    n, k = b.shape if stored == "BT" else b.shape[::-1]
    if (n if stored == "BT" else k) % 4:  # the other layout's rows would not load as quads (measured: as quads)
        return False
    # the tile it takes (an open matmul_choice block's, as lowering gives it)
    # (a prologue changes the pick between WIDE_HEAD_TILE and 128x128, both of 128 rows or more, and between
    # NARROW_HEAD_TILE and 32x64x16m4x8, both of 32: not asked)
    tile = chosen_tile(m, k, n, stored, layer_norm=node.op == "FusedLayerNormMatMul")
    return not tile.gemv and (tile.bm < 128 if stored == "BT" else tile.bm >= 128)


def transposed_weights(graph: Graph, live: list[Node]) -> dict[NodeId, tuple[int, str]]:
    """The products of ``live`` (a schedule of ``graph``) whose weight :func:`~eggfuse.lowering.lower` reads
    transposed: product node id -> (the input slot of its weight, the variant it is lowered with: '' for a
    weight stored [N, K] read as [K, N], 'BT' for one stored [K, N] read as [N, K]); see the module's docstring
    for which."""
    written = {n.inputs[w] for n in live for w in OPS[n.op].written_inputs}
    readers: dict[NodeId, list[Node]] = defaultdict(list)
    for n in live:
        for i in set(n.inputs):
            readers[i].append(n)
    outputs = set(graph.outputs)  # a weight that is an output keeps its buffer as stored
    picked: dict[NodeId, tuple[int, str]] = {}
    for n in live:
        found = weight_slot(n)
        if found is None:
            continue
        slot, stored = found
        if _weight(graph, graph.node(n.inputs[slot]), written, 0 if stored == "BT" else 1) and _flipped(
                n, graph, slot, stored):
            picked[n.id] = (slot, "" if stored == "BT" else "BT")
    # a weight every reader of which reads it so, only as B, and in the same direction
    return {p: c for p, c in picked.items() if graph.node(p).inputs[c[0]] not in outputs
            and all(r.id in picked and picked[r.id][1] == c[1]
                   and [i for i, x in enumerate(r.inputs) if x == graph.node(p).inputs[c[0]]] == [picked[r.id][0]]
                   for r in readers[graph.node(p).inputs[c[0]]])}
