"""Weights stored [K, N] for the tiled matmul: which products read their weight transposed.

A linear layer's weight comes stored [N, K] (PyTorch's and Hugging Face's layout; the graph's ``MatMulBT``,
or a fused matmul of ``variant='BT'``). The tiled matmul kernel reads B in slices of BK rows of K: stored
[N, K], each quad it loads runs along K and is stored into workgroup memory as four floats of a column
(``store_transposed`` in ``shaders/matmul.wgsl``); stored [K, N], a quad runs along N and is stored whole. So
where the weight is a parameter (or a derived parameter packing parameters, such as the Q/K/V weights
concatenated), :func:`lower` gives the product a derived parameter of its own, the weight transposed once on
the host when a session is created (``DerivedParameter.transpose``), and lowers the product as ``MatMul`` /
``variant=''`` on it; the parameter itself then needs no device buffer (kind 'host'). The values are the same
bit for bit: the kernel adds the same products in the same order, only the loads differ.

Which products (:func:`weights_along_n`): a 'BT' product whose tiled kernel is chosen (not the GEMV of
``matmul_kernel.matmul_tile``, which reads B along K) on a tile of fewer than 128 rows, of a weight that is
an f32 parameter (not state a step updates, not written in place) or a derived parameter of such parameters
packed along axis 0 as f32, where every live reader of that weight is such a product (a weight also read
another way, a tied embedding table say, keeps its layout rather than being stored twice).

Measured on an H100 (``bench/matmul.py --shapes MatMul:M,K,N;M,K,N``, one call, the two layouts of one
product in turn, bench/results/weights_kn_h100/layout_ab.json, us): 1024 x 768 x 3072 on 64x64x16m8x4 147.7
[K, N] against 157.4 [N, K]; 1024 x 768 x 2304 125.5 / 133.6; on 64x128x8 in 4 K ranges 1024 x 3072 x 768
158.7 / 179.4, 1024 x 768 x 768 57.9 / 62.9, 512 x 576 x 1536 50.3 / 53.6; but 4096^3 on 128x128x8 3957 / 3623,
hence the tiles of 128 rows keep [N, K].
"""

from __future__ import annotations

from collections import defaultdict

from ..ir.graph import Graph, Node, NodeId
from ..ir.ops.matmul_kernel import matmul_tile
from ..ir.spec import OPS
from ..ir.types import DType

#: Whether :func:`eggfuse.lowering.lower` transposes the weights :func:`weights_along_n` picks (its
#: ``weights_along_n`` argument, when None).
WEIGHTS_ALONG_N = True


def weight_slot(node: Node) -> int | None:
    """The input slot of B of a matmul product stored [N, K] (``MatMulBT``, or an op of the matmul family,
    one with a ``variant`` attribute, of ``variant='BT'``): its input named ``b``, else ``w``; None for
    any other node."""
    spec = OPS[node.op]
    if node.op != "MatMulBT" and not ("variant" in spec.attr_names and node.attrs.get("variant") == "BT"):
        return None
    for name in ("b", "w"):
        if name in spec.inputs:
            return spec.inputs.index(name)
    return None


def _weight(graph: Graph, node: Node, written: set[NodeId]) -> bool:
    # an f32 parameter that nothing updates, or a derived parameter packing such parameters along axis 0 as f32
    def plain(n: Node) -> bool:
        return (n.op == "Parameter" and n.type.dtype == DType.F32 and not n.attrs.get("state")
                and n.id not in written)

    if plain(node):
        return True
    spec = OPS[node.op]
    return (graph.is_derived_parameter(node) and spec.pack_store == "f32" and node.attrs.get("axis", 0) == 0
            and not node.attrs.get("transposed", False) and all(plain(graph.node(i)) for i in node.inputs))


def _tiled_below_128(node: Node, graph: Graph, slot: int) -> bool:
    # the product takes the tiled kernel on a tile of fewer than 128 rows (as stored [N, K])
    b = graph.node(node.inputs[slot]).type
    if node.type.rank != 2 or b.rank != 2:
        return False
    m, (n, k) = node.type.shape[0], b.shape
    tile = matmul_tile(m, k, n, "BT", layer_norm=node.op == "FusedLayerNormMatMul")
    return not tile.gemv and tile.bm < 128


def weights_along_n(graph: Graph, live: list[Node]) -> dict[NodeId, int]:
    """The products of ``live`` (a schedule of ``graph``) whose weight :func:`lower` stores [K, N]: product
    node id -> the input slot of its weight (see the module's docstring for which)."""
    written = {n.inputs[w] for n in live for w in OPS[n.op].written_inputs}
    readers: dict[NodeId, list[Node]] = defaultdict(list)
    for n in live:
        for i in set(n.inputs):
            readers[i].append(n)
    picked = {}
    for n in live:
        slot = weight_slot(n)
        if slot is not None and _weight(graph, graph.node(n.inputs[slot]), written) and _tiled_below_128(n, graph,
                                                                                                         slot):
            picked[n.id] = slot
    # a weight every reader of which reads it so, and only as B
    return {p: s for p, s in picked.items()
            if all(r.id in picked and [i for i, x in enumerate(r.inputs) if x == graph.node(p).inputs[s]]
                   == [picked[r.id]] for r in readers[graph.node(p).inputs[s]])}
