"""Graph -> ExecutionPlan: one buffer per value, the dispatches of each op, checked against limits.

The plan is plain data (buffers, dispatches with specialised WGSL, leaf bindings, and which
intermediates share a device allocation: ``storage``); the runtime allocates what it lists
and records its dispatches in order. Lowering follows
meganeura's ``compile.rs`` (``../shared/seeds``): leaves get buffers the runtime fills,
``Identity`` aliases its input's buffer, ``Select`` (a view of one part) is a window of it, a
derived parameter (a Concat of parameters, ``Graph.is_derived_parameter``) gets a buffer the
runtime packs once from the parameters,
and every other op becomes its kernel builder's dispatches: one, except a Concat of more
inputs than one dispatch may bind and a split-K matmul (partial sums into the node's scratch
buffer, then their reduction).
"""

from __future__ import annotations

import dataclasses
import re
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..ir.errors import DeviceLimitError, InputError, LoweringError
from ..ir.graph import Graph, Node, NodeId, require_graph
from ..ir.kernel import COUNTERS, SCRATCH, Buffer, Kernel, Target, Window
from ..ir.spec import OPS
from ..ir.types import DType, TensorType
from . import layout
from .limits import limit_name, resolve_limits, split_grid
from .prefetch import add_prefetch
from .wgsl import literal_params, render_kernel
from .wgsl import subgroups as subgroups_form

_LEAF_KIND = {"Input": "input", "Parameter": "parameter", "Constant": "constant"}


@dataclass(frozen=True)
class BufferSpec:
    """One buffer: ``size_bytes`` (a multiple of 4, at least 4) holding the value of
    ``node`` with ``shape`` and ``dtype``. ``kind`` is 'parameter', 'input', 'constant',
    'intermediate', 'derived' (packed by the runtime from parameters, see
    :class:`DerivedParameter`) or 'host' (a parameter that only derived parameters read:
    the runtime checks it and packs from it, but allocates no device buffer; or a derived parameter that only
    its transposed copy is read as, :mod:`.layout`: neither packed nor allocated) or 'window' (bytes
    ``[offset, offset + size_bytes)`` of buffer ``window = (index, offset)``: a weight (a parameter, a
    constant or a derived parameter) too large for one binding, bound in parts
    (:class:`~eggfuse.ir.kernel.Window`; ``node`` the weight's), or the value of a view of a part of another
    value (``OpSpec.view_offset``: ``Select``; ``node`` the view's, any buffer kind); no buffer of its own,
    ``name`` is the buffer's with the byte range). ``name`` is
    the leaf's name or ``<Op>%<node id>``. A node's scratch buffer (``Kernel.scratch``: an
    intermediate of one op's dispatches, such as a split-K matmul's partial sums) is a flat
    'intermediate' f32 buffer named ``<Op>%<node id>.scratch``, whose ``node`` is that op's. Its counters
    (``Kernel.counters``) are a u32 buffer of kind 'counters' named ``<Op>%<node id>.counters``: zero when a
    session creates it, never shared with another value, left zero by each dispatch that binds it.
    """

    index: int
    size_bytes: int
    dtype: DType
    kind: str
    name: str
    node: NodeId
    shape: tuple[int, ...]
    window: tuple[int, int] | None = None

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)


@dataclass(frozen=True)
class Dispatch:
    """One compute dispatch of ``entry_point`` in ``source`` (specialised WGSL).

    ``bindings`` are buffer indices at @binding(0..): the storage inputs, read-only but for
    the positions in ``writable`` (inputs an op updates in place besides its output,
    ``OpSpec.updates``), then the read_write output (last). When ``params`` (uniform bytes, a
    multiple of 16) is non-empty it binds at @binding(len(bindings)). ``prefetch`` are buffers
    bound read-only after those, which the dispatch only reads into the L2 cache for the
    dispatches after it (:mod:`.prefetch`). ``workgroups`` is the (x, y, z) grid; ``label``
    names the op and its shapes for errors and profiling. ``runtime_checks``: whether the runtime
    compiles ``source`` with naga's runtime checks (``runtime.pipelines.create_module``).
    ``loop_iterations``: the kernel's ``Kernel.loop_iterations`` (0: not given).
    """

    node: NodeId
    op: str
    kernel: str
    source: str
    entry_point: str
    bindings: tuple[int, ...]
    params: bytes
    workgroups: tuple[int, int, int]
    label: str
    writable: tuple[int, ...] = ()
    prefetch: tuple[int, ...] = ()
    runtime_checks: bool = True
    loop_iterations: int = 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return self.bindings[:-1]

    @property
    def output(self) -> int:
        return self.bindings[-1]


@dataclass(frozen=True)
class DerivedParameter:
    """A parameter the runtime computes once, when a session is created:
    ``numpy.concatenate`` of the parameters named ``sources`` (in order) along ``axis``,
    transposed when ``transpose`` (ToF16's ``transposed``: weights [K, N]), stored as ``store``
    says (``OpSpec.pack_store``): ``"f32"`` as is, ``"f16"`` rounded to float16, two halves a u32
    word (``ir.ops.quant.f16_rows``)."""

    sources: tuple[str, ...]
    axis: int
    store: str = "f32"
    transpose: bool = False


@dataclass(frozen=True, eq=False)
class IndexPart:
    """A check of some elements of an index input (``ExecutionPlan.index_parts``): those at the flat
    (row-major) ``positions`` must lie in [0, rows) (u32) or [-rows, rows) (i32, ONNX Gather's), as the op
    ``reader`` (a label for messages) reads them, through ops that move elements (Split, Slice, Select)."""

    rows: int
    positions: np.ndarray
    reader: str

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, IndexPart) and (self.rows, self.reader) == (other.rows, other.reader)
                and np.array_equal(self.positions, other.positions))

    __hash__ = None  # type: ignore[assignment]  # (positions: an array)


@dataclass
class ExecutionPlan:
    """What the runtime allocates and records for one graph.

    ``inputs`` / ``parameters`` map leaf names to buffer indices; ``constants`` maps buffer
    indices to the f32 arrays uploaded once; ``outputs`` are the buffers read back, in the
    graph's output order, with ``output_types`` (several outputs may share a buffer).
    ``unused_inputs`` / ``unused_parameters`` map the Input / Parameter leaves no output depends on to
    their types (a value given for one, under its own kind, is checked as a used leaf's is, then ignored);
    ``index_bounds`` maps an index input to the
    rows of the smallest table that reads all of it as indices (Embedding, Gather) or writes
    (ScatterAdd): u32 values must lie in [0, rows), i32 ones (ONNX Gather's) in [-rows, rows);
    ``index_readers`` names, for the messages, the op setting that bound; ``index_parts`` lists, for an
    index input that ops read in parts (through Slice, Split, Select, Concat, ...), the elements each
    part's reader bounds more tightly (:class:`IndexPart`). ``derived`` maps the buffer index
    of each derived parameter to how it is packed. ``limits`` are the device limits the plan
    was checked against; ``subgroups`` is true when a kernel uses subgroup operations (the
    device must then have usable subgroups). ``storage`` maps the buffer index of each
    intermediate that shares its device allocation to that allocation's index in
    ``storage_sizes`` (bytes); intermediates not listed get an allocation of their own.
    """

    buffers: list[BufferSpec]
    dispatches: list[Dispatch]
    inputs: dict[str, int]
    parameters: dict[str, int]
    constants: dict[int, np.ndarray]
    outputs: list[int]
    output_types: list[TensorType]
    unused_inputs: dict[str, TensorType] = field(default_factory=dict)
    unused_parameters: dict[str, TensorType] = field(default_factory=dict)
    index_bounds: dict[str, int] = field(default_factory=dict)
    index_readers: dict[str, str] = field(default_factory=dict)
    index_parts: dict[str, list[IndexPart]] = field(default_factory=dict)
    derived: dict[int, DerivedParameter] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    state: frozenset[str] = frozenset()
    subgroups: bool = False
    storage: dict[int, int] = field(default_factory=dict)
    storage_sizes: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        # a line, not every dispatch's WGSL (summary() lists buffers and dispatches)
        types = ", ".join(str(t) for t in self.output_types)
        return (f"ExecutionPlan({len(self.dispatches)} dispatches, {len(self.buffers)} buffers, inputs "
                f"{sorted(self.inputs)}, {len(self.parameters)} parameters, outputs [{types}], memory {self.memory()})")

    def memory(self) -> dict[str, int]:
        """Device memory of the buffers this plan binds, in bytes (each rounded to 4 bytes):

        - ``weights_bytes``: parameters and derived (packed) parameters uploaded once, and
          constants; a parameter only packed from ('host') has no device buffer and counts 0;
        - ``cache_bytes``: state tensors (KV caches, optimiser moments), kept across runs;
        - ``intermediate_bytes``: the intermediates' allocations after sharing
          (``storage_sizes``, and those of their own), the graph inputs' buffers and the counters.

        A session that shares another's buffers (``Session(..., share=)``) binds those without
        allocating them: the prefill plan of generation reports the decode plan's weights and
        cache, which exist once on the device."""
        weights = cache = inter = 0
        for b in self.buffers:
            if b.kind in ("parameter", "derived", "constant"):
                if b.kind == "parameter" and b.name in self.state:
                    cache += b.size_bytes
                else:
                    weights += b.size_bytes
            elif b.kind in ("input", "counters") or (b.kind == "intermediate" and b.index not in self.storage):
                inter += b.size_bytes
        return {"weights_bytes": weights, "cache_bytes": cache, "intermediate_bytes": inter + sum(self.storage_sizes)}

    def summary(self) -> str:
        """One line per buffer and per dispatch, for debugging."""
        lines = [f"buf{b.index}: {b.kind} {b.name} {b.type} ({b.size_bytes} B)"
                 + (f" = bytes of buf{b.window[0]} from {b.window[1]}" if b.window else "") for b in self.buffers]
        for index, d in self.derived.items():
            lines[index] += (f" = Concat(axis={d.axis}: {', '.join(d.sources)})" + ("^T" if d.transpose else "")
                             + (f" as {d.store}" if d.store != "f32" else ""))
        for d in self.dispatches:
            binds = ", ".join(f"buf{i}" for i in d.bindings)
            ahead = f" prefetch [{', '.join(f'buf{i}' for i in d.prefetch)}]" if d.prefetch else ""
            unchecked = "" if d.runtime_checks else " unchecked"
            lines.append(f"{d.kernel} [{binds}]{ahead} wg={d.workgroups}{unchecked}  # {d.label}")
        lines.append("outputs: " + ", ".join(f"buf{o}" for o in self.outputs))
        if self.storage:
            lines.append(f"storage: {len(self.storage)} intermediates in {len(self.storage_sizes)} allocations "
                         f"of {sum(self.storage_sizes)} B")
        return "\n".join(lines)


def _label(node: Node, ins: list[TensorType]) -> str:
    return f"node {node.id} {node.op}({', '.join(str(t) for t in ins)}) -> {node.type}"


def lower(graph: Graph, limits: Mapping[str, int] | None = None, *, subgroups: bool = False,
          share_storage: bool = True, prefetch: bool = True, runtime_checks: bool = False,
          constant_params: bool = True, device_barriers: bool = True,
          transpose_weights: bool | None = None) -> ExecutionPlan:
    """Lower the live part of ``graph`` to an :class:`ExecutionPlan`.

    ``limits`` is a dict keyed like wgpu's ``device.limits``; missing keys take the WebGPU
    defaults (:data:`~.limits.DEFAULT_LIMITS`). A dispatch with more workgroups than
    maxComputeWorkgroupsPerDimension is laid out on a 2-D (or 3-D) grid. ``subgroups=True``
    gives reductions in subgroup form (:data:`~.wgsl.SUBGROUP_FORMS`; kernel names end in
    ``+sg``): only for a device where runtime.device.subgroup_reductions_usable is true.
    ``share_storage=True`` lets intermediates whose lifetimes do not overlap share a device
    allocation (:func:`share_storage_of`); False gives each its own. ``prefetch=True`` lets an
    attention dispatch of few workgroups read the weights of the dispatches after it into the
    L2 cache with workgroups of its own (:mod:`.prefetch`); the results are the same either way.
    ``runtime_checks=False`` (the default) has the runtime compile every kernel without naga's runtime
    checks (``Dispatch.runtime_checks``; a kernel may keep them, ``Kernel.runtime_checks``): no clamping
    of workgroup and function array indices, no loop-bounding counters; the runtime honours it on the
    Vulkan backend only, whose robustBufferAccess keeps buffer accesses checked. eggfuse's kernels
    bound their loops by the uniform's sizes and check every global index themselves (but the tiled matmul
    where its tiles cover the matrices exactly, ``matmul_kernel.inside_form``), so results
    are those of the checked kernels up to the driver's instruction choice (on an H200: bit for bit
    for SmolLM2, within 4e-8 for MiniLM), and plans run 7-13% faster (``bench/runtime_checks.py``);
    ``runtime_checks=True`` keeps WebGPU's checks everywhere (an index out of bounds is then clamped:
    for debugging a kernel). ``constant_params=True`` has each kernel read its uniform parameters (sizes,
    strides, eps) as a WGSL module constant where they are u32, i32 or finite f32 and the kernel does not decline
    (``Kernel.constant_params``; the tiled matmul declines where measured slower, ``matmul_kernel.constant_shape``):
    the driver's compiler folds them, and kernels of other sizes no longer share a pipeline. On an H100, with the
    tiled matmul's constants in both, the other kernels' made the SmolLM2 decode step 7.6% faster, the 128-token
    prefill 1.7% and MiniLM 0.6% (bench/results/constants_h100/everywhere_*.json); the matmul's own, the prefill
    2.0% and MiniLM 1.2% (bench/results/inside_h100/ab3_*.json). False keeps them in the uniform. On lavapipe a
    1024 x 384 x 1536 product with GELU ran its first time in 0.42-0.45 s with constants (the compilation)
    against 0.24-0.27 with a pipeline of another shape, and then in 0.13-0.16: constants pay there only for a
    plan run many times, so ``eggfuse.pipeline.lower_for`` leaves them off on a CPU adapter.

    ``device_barriers=True`` lets a kernel's workgroups pass values to one another through storage atomics
    ordered by ``storageBarrier`` (``ir.kernel.Target.device_barriers``: the split-K matmul in one dispatch,
    ``matmul_kernel.last_split``); False (for Metal, where naga's ``storageBarrier`` is a threadgroup barrier:
    ``eggfuse.pipeline.lower_for``) keeps such products in two dispatches.

    ``transpose_weights=True`` (None: :data:`.layout.TRANSPOSE_WEIGHTS`) gives the tiled products that
    :func:`.layout.transposed_weights` picks (a weight stored [N, K] on a tile of fewer than 128 rows, or [K, N] on
    one of 128 or more) a derived parameter of their own, the weight transposed (packed once by the session), and lowers
    them with the other variant on it (same values, bit for bit; faster loads: see :mod:`.layout`); a weight
    that no dispatch then reads as stored gets no device buffer. False keeps every weight as stored
    (``eggfuse.compile`` with ``share``: the other session's buffers are the weights as stored).

    Raises InputError for a ``graph`` that is not a Graph, a ``runtime_checks``, ``constant_params`` or
    ``transpose_weights`` that is not a bool (or None for the latter), GraphError when the
    graph has no outputs, LoweringError when an op has no kernel or the plan
    exceeds a limit (the message names the limit as the WebGPU spec spells it, the node,
    the op and the shapes). Live ops with no dispatch (``Graph.dispatches``) get none; every
    other node gets its kernel builder's dispatches, one for every op but a Concat of more
    inputs than one dispatch may bind, a split-K matmul that keeps its reduction (two) and a CachedAttentionRoPEAppend
    of several new rows (three), so
    ``len(plan.dispatches) >= graph.dispatch_count()``.
    """
    if not isinstance(runtime_checks, bool):
        raise InputError(f"runtime_checks must be True or False, got {runtime_checks!r}")
    if not isinstance(constant_params, bool):
        raise InputError(f"constant_params must be True or False, got {constant_params!r}")
    if transpose_weights is not None and not isinstance(transpose_weights, bool):
        raise InputError(f"transpose_weights must be True, False or None, got {transpose_weights!r}")
    if transpose_weights is None:
        transpose_weights = layout.TRANSPOSE_WEIGHTS
    require_graph("lower", graph)
    graph.check_outputs()
    lim = resolve_limits(limits)
    live = schedule(graph)
    buffers: list[BufferSpec] = []
    node_buffer: dict[NodeId, int] = {}
    inputs: dict[str, int] = {}
    parameters: dict[str, int] = {}
    constants: dict[int, np.ndarray] = {}
    derived: dict[int, DerivedParameter] = {}
    for node in live:
        if OPS[node.op].view:  # a reshape view: same bytes, same buffer; a view of a part: a window of it
            node_buffer[node.id] = _view_buffer(graph, node, buffers, node_buffer)
            continue
        if (w := OPS[node.op].writes) is not None:  # updated in place: the written input's buffer
            node_buffer[node.id] = node_buffer[node.inputs[w]]
            continue
        kind = _LEAF_KIND.get(node.op, "derived" if graph.is_derived_parameter(node) else "intermediate")
        name = node.attrs["name"] if node.op in ("Input", "Parameter") else f"{node.op}%{node.id}"
        index = len(buffers)
        size = max(4, -(-node.type.size_bytes // 4) * 4)
        buffers.append(BufferSpec(index, size, node.type.dtype, kind, name, node.id, node.type.shape))
        node_buffer[node.id] = index
        if kind == "input":
            inputs[name] = index
        elif kind == "parameter":
            parameters[name] = index
        elif kind == "constant":
            constants[index] = np.ascontiguousarray(node.attrs["value"], dtype=node.type.dtype.device_numpy)
        elif kind == "derived":
            sources = tuple(graph.node(i).attrs["name"] for i in node.inputs)
            transpose = bool(node.attrs.get("transposed", False))
            derived[index] = DerivedParameter(sources, 1 if transpose else int(node.attrs.get("axis", 0)),
                                              OPS[node.op].pack_store, transpose)

    # weights the tiled matmul reads the other way (lowering.layout): a derived parameter each, the weight
    # transposed
    along = layout.transposed_weights(graph, live) if transpose_weights else {}
    transposed: dict[NodeId, int] = {}
    for product, (slot, _) in along.items():
        weight = graph.node(product).inputs[slot]
        if weight in transposed:
            continue
        stored = buffers[node_buffer[weight]]
        d = derived.get(stored.index)
        transposed[weight] = index = len(buffers)
        buffers.append(BufferSpec(index, stored.size_bytes, DType.F32, "derived", f"{stored.name}.T", weight,
                                  stored.shape[::-1]))
        derived[index] = DerivedParameter(d.sources if d else (stored.name,), d.axis if d else 0, "f32", True)

    target = Target(lim, subgroups, device_barriers)
    dispatches: list[Dispatch] = []
    for node in live:
        if graph.dispatches(node) == 0:  # leaves, views and derived parameters
            continue
        ins = [graph.node(i).type for i in node.inputs]
        reads = node_buffer
        if node.id in along:  # the product on the transposed weight, with the other variant
            slot, variant = along[node.id]
            weight = node.inputs[slot]
            if node.op in ("MatMul", "MatMulBT"):
                node = dataclasses.replace(node, op="MatMulBT" if variant == "BT" else "MatMul")
            else:
                node = dataclasses.replace(node, attrs={**node.attrs, "variant": variant})
            ins[slot] = TensorType(ins[slot].shape[::-1], ins[slot].dtype)
            reads = ChainMap({weight: transposed[weight]}, node_buffer)
        try:
            dispatches.extend(_node_dispatches(graph, node, ins, target, reads, buffers, runtime_checks,
                                               constant_params))
        except LoweringError as e:
            if e.nodes:
                raise
            # a kernel builder's error (a tile's storage, a grid): named with the node it was building
            own = graph.node(node.id)  # the graph's node (a product on a transposed weight is built as another)
            named = str(e) if re.search(rf"\bnode {node.id}\b", str(e)) else \
                f"{e} ({_label(own, [graph.node(i).type for i in own.inputs])})"
            raise type(e)(named, nodes=(node.id,)) from None
    _check_exclusive_writes(dispatches, buffers)

    # A parameter that only derived parameters read needs no device buffer of its own, nor a derived parameter
    # that only its transposed copy replaced.
    on_device = {i for d in dispatches for i in d.bindings} | {node_buffer[o] for o in graph.outputs}
    on_device |= {_whole(buffers, i) for i in on_device}
    for index in [i for i in derived if i not in on_device and buffers[i].node in transposed]:
        del derived[index]
        buffers[index] = dataclasses.replace(buffers[index], kind="host")
    packed_from = {name for d in derived.values() for name in d.sources}
    for name, index in parameters.items():
        if index not in on_device and name in packed_from:
            buffers[index] = dataclasses.replace(buffers[index], kind="host")

    state = frozenset(n.attrs["name"] for n in live if n.op == "Parameter" and n.attrs.get("state"))
    if prefetch:
        dispatches = add_prefetch(buffers, dispatches, state, lim, written_buffers(buffers, dispatches))
    outputs = {_whole(buffers, node_buffer[o]) for o in graph.outputs}  # an output window keeps its buffer whole
    storage, storage_sizes = share_storage_of(buffers, dispatches, outputs) if share_storage else ({}, [])
    live_ids = {n.id for n in live}
    unused = {op: {n.attrs["name"]: n.type for n in graph.nodes if n.op == op and n.id not in live_ids}
              for op in ("Input", "Parameter")}
    index_bounds, index_readers, index_parts = _index_checks(graph, live)
    plan = ExecutionPlan(
        buffers=buffers,
        dispatches=dispatches,
        inputs=inputs,
        parameters=parameters,
        constants=constants,
        outputs=[node_buffer[o] for o in graph.outputs],
        output_types=[graph.node(o).type for o in graph.outputs],
        unused_inputs=unused["Input"], unused_parameters=unused["Parameter"],
        index_bounds=index_bounds, index_readers=index_readers, index_parts=index_parts,
        derived=derived,
        limits=lim,
        state=state,
        subgroups=any(d.kernel.endswith("+sg") for d in dispatches),
        storage=storage,
        storage_sizes=storage_sizes,
    )
    check_limits(plan, lim)
    return plan


def _node_dispatches(graph: Graph, node: Node, ins: list[TensorType], target: Target,
                     node_buffer: dict[NodeId, int], buffers: list[BufferSpec],
                     runtime_checks: bool, constant_params: bool) -> list[Dispatch]:
    """The dispatches of one node: its op's kernel builder (``OpSpec.kernel``) rendered to WGSL.

    A kernel binds the node's inputs it names (``Kernel.inputs``; by default all but the one an
    in-place op writes) read-only, but for those it declares ``Buffer(write=True)``, which must
    be inputs the op updates (``OpSpec.updates``; else LoweringError) or the node's scratch buffer
    or counters (SCRATCH, COUNTERS), then the output read_write: the node's buffer, which for an
    in-place op is the written input's, or for a kernel with ``scratch`` (and no SCRATCH among its
    inputs) the node's scratch buffer, an intermediate appended to ``buffers`` (named
    ``<Op>%<node id>.scratch``) that the node's later dispatches read where their ``inputs`` say
    SCRATCH. A kernel with ``counters`` gets the node's counter buffer (kind 'counters', named
    ``<Op>%<node id>.counters``) where its ``inputs`` say COUNTERS."""
    # the node as the graph has it names the buffers and dispatches (a product of a weight stored [K, N] is
    # built as another op or variant: lowering.layout)
    own = graph.node(node.id)
    label = _label(own, [graph.node(i).type for i in own.inputs])
    spec = OPS[node.op]
    if spec.kernel is None:
        raise LoweringError(f"op {node.op} has no kernel ({label})", nodes=(node.id,))
    w = spec.writes
    with subgroups_form(target.subgroups) as use:
        built = spec.kernel(node, ins, target)
        kernels = [built] if isinstance(built, Kernel) else list(built)
        rendered = []
        for k in kernels:
            reads = tuple(k.inputs) if k.inputs is not None else tuple(i for i in range(len(ins)) if i != w)
            bindings = k.bindings if k.bindings is not None else _default_bindings(spec, node, ins, reads)
            if len(bindings) != len(reads) + 1:
                raise LoweringError(f"kernel {k.name} of {node.op} declares {len(bindings)} bindings for "
                                    f"{len(reads)} inputs and the output ({label})", nodes=(node.id,))
            stray = [b.name for b, i in zip(bindings[:-1], reads, strict=True)
                     if b.write and i not in spec.updates and i not in (SCRATCH, COUNTERS)]
            if stray:
                raise LoweringError(f"kernel {k.name} of {node.op} binds {stray} read_write, inputs the op does "
                                    f"not declare in OpSpec.updates ({label})", nodes=(node.id,))
            writable = tuple(i for i, b in enumerate(bindings[:-1]) if b.write)
            constant = constant_params and k.constant_params and literal_params(k.params)
            text, data = render_kernel(k.body, bindings, k.params, k.slots, constant)
            rendered.append((k, reads, writable, text, data))
    max_dim = target.limits["max-compute-workgroups-per-dimension"]
    scratch = _own_buffer(own, label, rendered, buffers, "scratch", "scratch buffer", SCRATCH, DType.F32,
                          "intermediate")
    counters = _own_buffer(own, label, rendered, buffers, "counters", "counters", COUNTERS, DType.U32, "counters")
    out = []
    for part, (k, reads, writable, source, params) in enumerate(rendered):
        part_label = label
        to_scratch = k.scratch > 0 and SCRATCH not in reads  # its output is the node's scratch buffer
        if len(rendered) > 1:  # one of several dispatches of the node: which inputs it binds
            windows = [i.input for i in reads if isinstance(i, Window)]
            named = list(dict.fromkeys(f"{i.input} ({windows.count(i.input)} windows)" if isinstance(i, Window)
                                       else "scratch" if i == SCRATCH else "counters" if i == COUNTERS else str(i)
                                       for i in reads))
            span = ", ".join(named) if SCRATCH in reads or COUNTERS in reads or windows else f"{named[0]}..{named[-1]}"
            part_label += f" part {part + 1}/{len(rendered)}" + (f": inputs {span}" if reads else "")
            part_label += " -> scratch" if to_scratch else ""
        grid = split_grid(k.groups, max_dim)
        if grid is None:
            raise DeviceLimitError(f"{limit_name('max-compute-workgroups-per-dimension')} = {max_dim}: "
                                   f"{k.groups} workgroups do not fit a 3-D grid for {part_label}", nodes=(node.id,))
        bound = tuple(_window_buffer(node, i, k, buffers, node_buffer, target.limits, part_label)
                      if isinstance(i, Window)
                      else scratch if i == SCRATCH else counters if i == COUNTERS else node_buffer[node.inputs[i]]
                      for i in reads)
        bound += (scratch if to_scratch else node_buffer[node.id],)
        out.append(Dispatch(node.id, own.op, k.name + ("+sg" if use.used else ""), source, k.entry_point, bound,
                            params, grid, part_label, writable, runtime_checks=runtime_checks or k.runtime_checks,
                            loop_iterations=k.loop_iterations))
    return out


def _own_buffer(node: Node, label: str, rendered: list, buffers: list[BufferSpec], what: str,
                called: str, marker: int, dtype: DType, kind: str) -> int | None:
    # the node's scratch buffer or counters (Kernel.scratch, Kernel.counters: ``what``), appended to ``buffers``
    # where a kernel asks for it; every kernel that does gives the same size, and one that binds it (``marker``
    # in its inputs) needs a kernel that sizes it
    sizes = {getattr(k, what) for k, *_ in rendered if getattr(k, what) > 0}
    if len(sizes) > 1 or (not sizes and any(marker in reads for _, reads, *_ in rendered)):
        raise LoweringError(f"the kernels of {node.op} disagree on its {called} (sizes {sorted(sizes)}; "
                            f"{label})", nodes=(node.id,))
    if not sizes:
        return None
    elements = sizes.pop()
    buffers.append(BufferSpec(len(buffers), 4 * elements, dtype, kind, f"{node.op}%{node.id}.{what}", node.id,
                              (elements,)))
    return len(buffers) - 1


def _whole(buffers: list[BufferSpec], b: int) -> int:
    # the buffer a window (BufferSpec.window) is part of; any other buffer itself
    return buffers[b].window[0] if buffers[b].window else b


def written_buffers(buffers: list[BufferSpec], dispatches: list[Dispatch]) -> set[int]:
    """The buffers ``dispatches`` write (outputs, inputs updated in place), with the whole buffer of each window
    written (a part of a value, a Select view, is written with it)."""
    written = {d.output for d in dispatches} | {d.bindings[i] for d in dispatches for i in d.writable}
    return written | {_whole(buffers, i) for i in written}


def _add_window(buffers: list[BufferSpec], base: int, offset: int, size: int, dtype: DType, node: NodeId,
                shape: tuple[int, ...]) -> int:
    # the window buffer of bytes [offset, offset + size) of buffer ``base`` (itself no window), made once
    for b in buffers:
        if b.window == (base, offset) and b.size_bytes == size and b.shape == shape and b.node == node:
            return b.index
    index = len(buffers)
    buffers.append(BufferSpec(index, size, dtype, "window", f"{buffers[base].name}[{offset}:{offset + size}]", node,
                              shape, (base, offset)))
    return index


def _check_exclusive_writes(dispatches: list[Dispatch], buffers: list[BufferSpec]) -> None:
    # A dispatch may not bind a buffer it writes (its output, an input it updates in place) a second time, as an
    # input or through a view of it (Identity, a Select window): WebGPU refuses a storage buffer used read-write
    # and read-only in one dispatch, and the kernel would read what it is overwriting.
    for d in dispatches:
        written = {len(d.bindings) - 1, *d.writable}
        for i in written:
            whole = _whole(buffers, d.bindings[i])
            others = [j for j, b in enumerate(d.bindings) if j != i and _whole(buffers, b) == whole]
            if others:
                b = buffers[whole]
                raise LoweringError(f"{d.label} writes {b.kind} {b.name!r} ({b.type}) and reads it again in the same "
                                    f"dispatch (bindings {i} and {', '.join(map(str, others))}): an op cannot read "
                                    "the buffer it updates in place, through another view of it or a part of it; "
                                    "keep the value it reads in a tensor of its own (another parameter or input)",
                                    nodes=(d.node,))


def _window_buffer(node: Node, w: Window, k: Kernel, buffers: list[BufferSpec], node_buffer: dict[NodeId, int],
                   limits: Mapping[str, int], label: str) -> int:
    """The buffer of window ``w`` of ``node``'s input (one of ``buffers``, appended the first time it is asked
    for): a parameter's or a constant's bytes [w.offset, w.offset + w.size), of the weight's buffer from the
    input's own offset where the input is a part of it (a Select view). Raises DeviceLimitError for another input
    (an intermediate's or an input's), LoweringError for a window that is not aligned or not inside the input."""
    base = buffers[node_buffer[node.inputs[w.input]]]
    shift, room = 0, base.size_bytes
    if base.window is not None:  # a part of a buffer: a window of that buffer from the part's offset
        base, shift = buffers[base.window[0]], base.window[1]
    if base.kind not in ("parameter", "constant", "derived"):
        what = ("give it as a parameter (a weight uploaded once, such as an ONNX initializer), "
                if base.kind == "input" else "")
        raise DeviceLimitError(
            f"{limit_name('max-storage-buffer-binding-size')} = {limits['max-storage-buffer-binding-size']} "
            f"exceeded: kernel {k.name} reads input {w.input} of {label}, {base.kind} {base.name!r} ({base.type}, "
            f"{base.size_bytes} bytes), in windows of at most that size, and only a weight (a parameter, a constant "
            f"or one packed from parameters) can be read so; {what}run on a device that binds more (eggfuse asks "
            f"for the adapter's limit), or at smaller shapes", nodes=(node.id,))
    align = int(limits["min-storage-buffer-offset-alignment"])
    elem = base.dtype.size_bytes
    if ((shift + w.offset) % align or w.size <= 0 or w.size % elem or w.offset % elem
            or w.offset + w.size > room):
        raise LoweringError(f"kernel {k.name} of {label} asks for bytes {w.offset}..{w.offset + w.size} of input "
                            f"{w.input} ({room} bytes{f' from byte {shift} of {base.name!r}' if shift else ''}): a "
                            f"window must lie inside it, start at a multiple of "
                            f"{limit_name('min-storage-buffer-offset-alignment')} = {align} and hold whole elements",
                            nodes=(node.id,))
    return _add_window(buffers, base.index, shift + w.offset, w.size, base.dtype, base.node, (w.size // elem,))


def _view_buffer(graph: Graph, node: Node, buffers: list[BufferSpec], node_buffer: dict[NodeId, int]) -> int:
    # The buffer of a view node: its input's, or (OpSpec.view_offset, a part of it: Select) a window of the buffer
    # that holds the input's bytes, from the view's offset on (a window of a window is one of the first's buffer)
    spec, base = OPS[node.op], node_buffer[node.inputs[0]]
    offset = spec.view_offset([graph.node(node.inputs[0]).type], node.attrs) if spec.view_offset else 0
    if not offset and node.type.size_bytes == buffers[base].size_bytes:
        return base
    if buffers[base].window is not None:
        base, offset = buffers[base].window[0], buffers[base].window[1] + offset
    return _add_window(buffers, base, offset, max(4, node.type.size_bytes), node.type.dtype, node.id, node.type.shape)


def _default_bindings(spec, node: Node, ins: list[TensorType], reads: tuple[int, ...]) -> tuple[Buffer, ...]:
    out_name = spec.input_name(spec.writes) if spec.writes is not None else "out"
    return (*(Buffer(spec.input_name(i), ins[i].dtype.wgsl, write=i in spec.updates) for i in reads),
            Buffer(out_name, node.type.dtype.wgsl, write=True))


def share_storage_of(buffers: list[BufferSpec], dispatches: list[Dispatch],
                     outputs: set[int]) -> tuple[dict[int, int], list[int]]:
    """Device allocations for the intermediates: ``(storage, sizes)`` as in
    :class:`ExecutionPlan` (buffer index -> allocation index, allocation sizes in bytes).

    An intermediate lives from the first dispatch that binds it (its producer) to the last
    one that binds it (its last reader, or an in-place update of it), in plan order. Walking
    the dispatches in order, an intermediate's first binding takes the smallest free
    allocation that holds it (else the largest free one, grown to fit, else a new one), and
    a dispatch frees the allocations of the intermediates it binds for the last time after
    it has taken its own output's: a dispatch never reads and writes one allocation, and a
    later writer of an allocation comes after every reader of its earlier contents (wgpu
    orders the two with a barrier). Graph outputs are read after the run and keep their own
    buffers. Greedy best-fit in the spirit of the offset planners of TFLite's
    ``ArenaPlanner`` and XLA's buffer assignment, here over whole buffers.

    A dispatch that does not read what the dispatch before it wrote may run alongside it on
    the GPU (the Q, K and V projections of one decode step); a reused allocation would make
    it wait for that dispatch (the barrier before a write to a buffer read earlier), so such
    a dispatch's output gets a new allocation, which later dispatches may reuse.

    A window (``BufferSpec.window``) stands for its buffer: binding a part of an intermediate
    (a ``Select`` view) keeps the whole intermediate alive, and ``outputs`` must list the buffers
    of output windows.
    """
    def whole(b: int) -> int:
        return _whole(buffers, b)

    last: dict[int, int] = {}
    for i, d in enumerate(dispatches):
        for b in d.bindings:
            last[whole(b)] = i
    storage: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []
    for i, d in enumerate(dispatches):
        for b in map(whole, d.bindings):
            if b in storage or b in outputs or buffers[b].kind != "intermediate":
                continue
            need = buffers[b].size_bytes
            # reuse only where the dispatch waits for its predecessor anyway
            pool = free if i > 0 and whole(dispatches[i - 1].output) in map(whole, d.inputs) else []
            fits = [a for a in pool if sizes[a] >= need]
            if fits:
                slot = min(fits, key=lambda a: sizes[a])
                free.remove(slot)
            elif pool:
                slot = max(pool, key=lambda a: sizes[a])
                free.remove(slot)
                sizes[slot] = need
            else:
                slot = len(sizes)
                sizes.append(need)
            storage[b] = slot
        for b in dict.fromkeys(map(whole, d.bindings)):
            if last[b] == i and b in storage:
                free.append(storage[b])
    return storage, sizes


def schedule(graph: Graph) -> list[Node]:
    """The live nodes in an order that respects data dependencies and in-place updates.

    An op that updates an input in place (``OpSpec.writes``, or as a side effect
    ``OpSpec.updates``) overwrites that input's buffer, so every other reader of the old
    contents (the input itself, a reshape view of it, an earlier version) must run before it.
    Reading old contents only after the update, or returning them as an output, raises
    LoweringError naming the nodes. Without in-place ops the graph's own topological order
    is kept.
    """
    live = graph.live_nodes()
    if not any(OPS[n.op].written_inputs for n in live):
        return live
    by_id = {n.id: n for n in live}
    storage: dict[NodeId, NodeId] = {}  # value -> the node that owns its buffer
    version: dict[NodeId, int] = {}     # how many in-place updates the buffer had when the value was made
    readers: dict[NodeId, list[NodeId]] = {n.id: [] for n in live}
    dag = nx.DiGraph()
    dag.add_nodes_from(by_id)
    for n in live:  # graph order is topological
        for i in n.inputs:
            dag.add_edge(i, n.id)
            readers[i].append(n.id)
        w = OPS[n.op].writes
        if OPS[n.op].view:
            storage[n.id], version[n.id] = storage[n.inputs[0]], version[n.inputs[0]]
        elif w is not None:
            storage[n.id], version[n.id] = storage[n.inputs[w]], version[n.inputs[w]] + 1
        else:
            storage[n.id], version[n.id] = n.id, 0
    latest: dict[NodeId, int] = {}
    values_in: dict[NodeId, list[NodeId]] = {}
    for v, s in storage.items():
        latest[s] = max(latest.get(s, 0), version[v])
        values_in.setdefault(s, []).append(v)
    for n in live:  # a side-effect update (OpSpec.updates) makes contents no value of the graph holds
        for u in OPS[n.op].updates:
            s = storage[n.inputs[u]]
            latest[s] = max(latest[s], version[n.inputs[u]] + 1)

    def updates_same(r: NodeId, s: NodeId, old: int) -> bool:
        # r also updates contents `old` of buffer s as a side effect: it reads none of what it writes
        # (OpSpec.updates), so the two need no order
        node = by_id[r]
        return any(storage[node.inputs[u]] == s and version[node.inputs[u]] == old for u in OPS[node.op].updates)

    for n in live:
        for w in OPS[n.op].written_inputs:
            s, old = storage[n.inputs[w]], version[n.inputs[w]]
            side = w in OPS[n.op].updates
            for v in values_in[s]:
                if version[v] <= old:  # the old contents: their other readers run first
                    dag.add_edges_from((r, n.id) for r in readers[v]
                                       if r != n.id and not (storage[r] == s and version[r] > old)
                                       and not (side and updates_same(r, s, old)))
    for o in graph.outputs:
        if version[o] < latest[storage[o]]:
            raise LoweringError(f"output node {o} ({by_id[o].op}) is a value whose buffer a later in-place "
                                f"update overwrites; output the updated node instead", nodes=(o,))
    try:
        return [by_id[i] for i in nx.lexicographical_topological_sort(dag)]
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        raise LoweringError("a node reads a buffer's old contents only after an in-place update of it "
                            f"(dependency cycle {' -> '.join(str(u) for u, _ in cycle)})",
                            nodes=[u for u, _ in cycle]) from None


def _index_checks(graph: Graph, live: list[Node]) -> tuple[dict[str, int], dict[str, str], dict[str, list[IndexPart]]]:
    # The runtime rejects out-of-range indices in an input, as the reference and onnxruntime do: bounds (name ->
    # rows) for the inputs read whole, with the op setting each bound, and the parts of inputs that ops read
    # through Slice, Split or Select (each part its own bound). A constant index table is checked here once.
    # (Indices the device computes are not checked: clamped, ir/ops/indexing.py.)
    live_ids = {n.id for n in live}
    bounds: dict[str, int] = {}
    readers: dict[str, str] = {}
    parts: dict[str, list[IndexPart]] = {}
    for nid, reads in graph.index_reads().items():
        src = graph.node(nid)
        if nid not in live_ids or src.op not in ("Input", "Constant"):
            continue
        whole: list[tuple[int, Node, int]] = []
        some: list[IndexPart] = []
        for rows, node, slot, part, component in reads:
            pos = graph.index_positions(nid, node, slot, component) if part else None
            if pos is None or len(pos) == src.type.num_elements:
                whole.append((rows, node, slot))
            elif len(pos):
                label = graph.reader_label(node, slot, rows)
                if component is not None:
                    label += f" at position {component} of its index tuples"
                some.append(IndexPart(rows, pos, label))
        top = min(whole, key=lambda r: r[0]) if whole else None
        some = [p for p in some if top is None or p.rows < top[0]]  # (a whole read's check covers the rest)
        if src.op == "Input":
            if top is not None:
                bounds[src.attrs["name"]] = top[0]
                readers[src.attrs["name"]] = graph.reader_label(top[1], top[2], top[0])
            if some:
                parts[src.attrs["name"]] = some
            continue
        value = np.asarray(src.attrs["value"]).reshape(-1)
        checks = ([(top[0], value, graph.reader_label(top[1], top[2], top[0]))] if top is not None else []) + [
            (p.rows, value[p.positions], p.reader) for p in some]
        for rows, vals, reader in checks:
            if np.any(vals >= rows):
                raise LoweringError(f"{src.describe()}: constant indices reach {int(np.max(vals))}, which {reader} "
                                    f"reading them bounds at {rows} rows", nodes=(nid,))
            if np.any(vals < -rows):  # i32 (ONNX Gather's): from the end
                raise LoweringError(f"{src.describe()}: constant indices reach {int(np.min(vals))}, below -{rows}, "
                                    f"the most {reader} reading them counts from the end", nodes=(nid,))
    return bounds, readers, parts


#: Loop iterations one invocation of a shader may run on Mesa's llvmpipe (lavapipe), all loops together: gallivm's
#: ``LP_MAX_TGSI_LOOP_ITERATIONS``. Past it the loops stop early and the dispatch's results are silently wrong.
LLVMPIPE_LOOP_ITERATIONS = 65_535
#: The passes over its data a kernel may make (a softmax's max, sum and write): :func:`check_cpu_loops` refuses a
#: dispatch with more than ``LLVMPIPE_LOOP_ITERATIONS // CPU_LOOP_PASSES`` elements of one binding per invocation.
CPU_LOOP_PASSES = 4

_WORKGROUP_SIZE = re.compile(r"@workgroup_size\(([^)]*)\)\s*fn\s+(\w+)")


def workgroup_size(source: str, entry_point: str) -> int | None:
    """Invocations per workgroup of ``entry_point`` in WGSL ``source`` (its ``@workgroup_size``, literals or
    ``const`` names of ``source``); None when it cannot be read."""
    for args, name in _WORKGROUP_SIZE.findall(source):
        if name != entry_point:
            continue
        size = 1
        for arg in (a.strip() for a in args.split(",") if a.strip()):
            if not (m := re.fullmatch(r"(\d+)[ui]?", arg)):
                m = re.search(rf"const\s+{re.escape(arg)}\s*(?::\s*\w+)?\s*=\s*(\d+)[ui]?\s*;", source)
            if not m:
                return None
            size *= int(m.group(1))
        return size
    return None


def check_cpu_loops(plan: ExecutionPlan) -> None:
    """Raise DeviceLimitError for a dispatch that lavapipe (Mesa's llvmpipe, a CPU adapter) would cut short.

    llvmpipe stops an invocation's loops after :data:`LLVMPIPE_LOOP_ITERATIONS` iterations in all, with no error,
    and a kernel's invocations stride through their data (a row's reduction on one workgroup of 256 invocations:
    a softmax over 5.6 million elements already needs more). A dispatch whose largest binding holds more than
    ``LLVMPIPE_LOOP_ITERATIONS // CPU_LOOP_PASSES`` 4-byte elements per invocation it launches is refused, naming
    its node (the error's ``nodes``) and what to do: a GPU adapter, or smaller shapes. So is one whose kernel runs
    more than :data:`LLVMPIPE_LOOP_ITERATIONS` iterations an invocation by its own count (``Kernel.loop_iterations``:
    a direct convolution of 300 input channels and a 15x15 kernel gave 65,061 of its 67,500 terms). Dispatches
    whose workgroup size cannot be read from their WGSL are not checked by their bindings, nor those of ops that
    read a table's rows by index (``OpSpec.index_bounds``: an invocation reads the rows its indices name, not the
    table)."""
    per = LLVMPIPE_LOOP_ITERATIONS // CPU_LOOP_PASSES
    for d in plan.dispatches:
        if d.loop_iterations > LLVMPIPE_LOOP_ITERATIONS:
            raise DeviceLimitError(
                f"lavapipe (Mesa's llvmpipe) ends a shader invocation's loops after {LLVMPIPE_LOOP_ITERATIONS} "
                f"iterations without an error: {d.label} (kernel {d.kernel}) runs {d.loop_iterations} an invocation "
                "and would give wrong values; run it on a GPU adapter, or at smaller shapes (fewer input channels, "
                "a smaller window or a shorter axis)", nodes=(d.node,))
        size = workgroup_size(d.source, d.entry_point)
        if size is None or OPS[d.op].index_bounds is not None:
            continue
        invocations = size * d.workgroups[0] * d.workgroups[1] * d.workgroups[2]
        largest = max((plan.buffers[i] for i in d.bindings), key=lambda b: b.size_bytes, default=None)
        if largest is None or largest.size_bytes // 4 <= per * invocations:
            continue
        raise DeviceLimitError(
            f"lavapipe (Mesa's llvmpipe) ends a shader invocation's loops after {LLVMPIPE_LOOP_ITERATIONS} iterations "
            f"without an error: {d.label} (kernel {d.kernel}) runs {invocations} invocations over buffer "
            f"{largest.index} ({largest.name!r}, {largest.type}), more than {per} elements each, and would give wrong "
            "values; run it on a GPU adapter, or at smaller shapes (a shorter axis to reduce)", nodes=(d.node,))


def check_limits(plan: ExecutionPlan, limits: Mapping[str, int] | None = None) -> None:
    """Raise LoweringError if ``plan`` exceeds ``limits`` (wgpu ``device.limits`` keys).

    Raises DeviceLimitError (a LoweringError). Checks buffer sizes (maxBufferSize), storage bindings per dispatch
    (maxStorageBuffersPerShaderStage), each binding's size (maxStorageBufferBindingSize),
    uniform size (maxUniformBufferBindingSize), the workgroup grid
    (maxComputeWorkgroupsPerDimension) and the offsets of windows (minStorageBufferOffsetAlignment).
    Messages name the limit, node, op and shapes.
    """
    lim = resolve_limits(limits)

    def fail(key: str, what: str, node: NodeId) -> None:
        raise DeviceLimitError(f"{limit_name(key)} = {lim[key]} exceeded: {what}", nodes=(node,))

    for b in plan.buffers:
        if b.window and b.window[1] % lim["min-storage-buffer-offset-alignment"]:
            key = "min-storage-buffer-offset-alignment"
            raise DeviceLimitError(f"{limit_name(key)} = {lim[key]}: buffer {b.index} ({b.name!r}) is a window of "
                                   f"buffer {b.window[0]} from byte {b.window[1]}, not a multiple of it (the plan was "
                                   f"lowered for another device: lower it for this one)", nodes=(b.node,))
        if b.kind != "host" and b.size_bytes > lim["max-buffer-size"]:
            fail("max-buffer-size", f"buffer {b.index} ({b.kind} {b.name!r}, node {b.node}, {b.type}) "
                                    f"is {b.size_bytes} bytes", b.node)
    for d in plan.dispatches:
        if len(d.bindings) + len(d.prefetch) > lim["max-storage-buffers-per-shader-stage"]:
            # a table read through windows (BufferSpec.window): which, in how many, of what size
            parts: dict[int, list[int]] = {}
            for i in d.bindings:
                if plan.buffers[i].window:
                    parts.setdefault(plan.buffers[i].window[0], []).append(plan.buffers[i].size_bytes)
            why = "".join(f"; {plan.buffers[t].name!r} ({plan.buffers[t].type}, {plan.buffers[t].size_bytes} bytes) "
                          f"is read through {len(sizes)} windows of up to {max(sizes)} bytes (the binding limit)"
                          for t, sizes in sorted(parts.items()))
            hint = ("; run on a device that binds larger buffers or more storage buffers per stage (eggfuse asks "
                    "for the adapter's limits)") if parts else (
                "; run on a device that binds more storage buffers per stage (eggfuse asks for the adapter's "
                "limits), or, where a rewrite made this op, compile without that rule (`eggfuse rules` lists them; "
                "--disable-rule NAME, or rulesets=select(disable=[NAME]))")
            fail("max-storage-buffers-per-shader-stage", f"kernel {d.kernel} binds {len(d.bindings) + len(d.prefetch)} "
                                                         f"storage buffers for {d.label}{why}{hint}", d.node)
        ahead = len(d.bindings) + (1 if d.params else 0)  # the prefetched buffers bind after the uniform
        slots = [*range(len(d.bindings)), *range(ahead, ahead + len(d.prefetch))]
        for slot, index in zip(slots, d.bindings + d.prefetch, strict=True):
            b = plan.buffers[index]
            if b.size_bytes > lim["max-storage-buffer-binding-size"]:
                weight = b.kind in ("parameter", "derived")
                half = weight and b.dtype is DType.F32 and b.size_bytes // 2 <= lim["max-storage-buffer-binding-size"]
                hint = ("; if it is a product's weight whose K is a multiple of 32 or a table of rows a multiple "
                        "of 32 long (an embedding), precision='f16' (eggfuse run, embed or generate --precision f16) "
                        "stores it as float16, in half the bytes; else run on a device that binds more (eggfuse "
                        "asks for the adapter's limit)") if half else \
                    ("; run on a device that binds more (eggfuse asks for the adapter's limit)" if weight else
                     "; run on a device that binds more (eggfuse asks for the adapter's limit), or at smaller shapes")
                fail("max-storage-buffer-binding-size",
                     f"binding {slot} of {d.label} is buffer {b.index} ({b.name!r}, {b.type}) "
                     f"of {b.size_bytes} bytes{hint}", d.node)
        if len(d.params) > lim["max-uniform-buffer-binding-size"]:
            fail("max-uniform-buffer-binding-size", f"{len(d.params)}-byte uniform for {d.label}", d.node)
        if max(d.workgroups) > lim["max-compute-workgroups-per-dimension"]:
            fail("max-compute-workgroups-per-dimension", f"grid {d.workgroups} for {d.label}", d.node)
