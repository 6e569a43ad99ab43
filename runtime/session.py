"""Session: a lowered plan bound to device buffers, run as one recorded compute pass per call."""

from __future__ import annotations

import atexit
import contextlib
import difflib
import functools
import itertools
import numbers
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import wgpu

from ..ir.errors import DeviceError, IndexRangeError, InputError, LoweringError
from ..ir.ops.quant import F16_MAX, f16_rows
from ..ir.reference import check_array, check_mapping
from ..ir.types import DType
from ..lowering import ExecutionPlan, check_limits
from ..lowering.plan import DerivedParameter, written_buffers
from .device import (
    adapter_description,
    device_error,
    device_errors,
    get_device,
    mapped_uploads,
    subgroup_reductions_usable,
)
from .pipelines import get_pipeline, unchecked_modules_allowed

try:  # the wgpu-native backend's C library, for the recording fast paths
    from wgpu.backends.wgpu_native._api import libf as _libf
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _lib
except ImportError:  # another backend: wgpu-py's own calls
    _ffi = _lib = _libf = None
try:  # the recording loop in C (runtime/_record.c), built at install when a C compiler exists
    from . import _record as _c_record
except ImportError:
    _c_record = None

_recorder: _Recorder | None = None  # one thread that records sessions' next runs

#: Inputs up to this size share the session's input buffer (one write per run, after a host
#: copy into its staging array); larger ones are written straight into a buffer of their own.
PACK_MAX_BYTES = 1 << 20
_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
#: With wgpu-native's C API and INPUT_RING > 0, a run's packed inputs travel through a ring of this
#: many mappable buffers (MAP_WRITE | COPY_SRC): the run writes its bytes into the next one, mapped,
#: unmaps it, and its command buffer begins with the copy from it into the input buffer; the buffer is
#: mapped again as soon as the run is submitted, which completes when the device has run it. A run
#: waits for its ring buffer's map, i.e. for the run INPUT_RING runs back to finish (polls that return
#: at once on a discrete GPU, then a blocking poll for that run's submission only). With 0 (the
#: default) every run writes with ``queue.write_buffer``, which puts its copy in a command buffer of
#: wgpu's own submitted before the run's. On the H200 (bench/submit_gaps.py,
#: bench/results/input_ring_h200/gaps_before.json), with every run's pass stamped, back-to-back MiniLM
#: runs without that write took 13 us less wall time a run (the device idling 16.6 us between runs
#: against 23.8); unstamped, Session.run back to back took 1132.6 us a run against 1132.4 for one
#: submission of all the runs' passes (the decode step 981.8 against 973.6), so little may be left to
#: win. Not timed yet (``bench/submit_gaps.py --rings 3 0``): the ring stays off. Set before a Session
#: is made.
INPUT_RING = 0


def _one_at_a_time(method: Callable) -> Callable:
    """``method`` of a Session under its lock: calls from several threads run one after another (two runs at once
    had one map the staging buffers the other submitted with, and wgpu aborted the process)."""
    @functools.wraps(method)
    def serialised(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return serialised


class Session:
    """A lowered plan on a device, with its parameters uploaded once.

    ``Session(plan, params, device=None)``: the :class:`~eggfuse.lowering.ExecutionPlan`
    (``eggfuse.pipeline.lower_for`` lowers a graph for a device) is checked against the
    device's limits. ``params`` maps every parameter name to an array of its shape
    (any real dtype, converted to f32; the caller's arrays are not modified, and float32
    contiguous ones are uploaded as they are, without a copy). Constants and parameters
    are uploaded here, derived parameters (``plan.derived``) packed from the converted
    parameters (along axis 0 written source after source, else packed with numpy) and
    uploaded, pipelines (cached per process) and bind groups built here, so :meth:`run`
    only writes inputs, records and reads back; the uploads run on a thread of their own
    while the pipelines and bind groups are built. On a device with
    ``mappable-primary-buffers`` (requested on CPU adapters such as lavapipe,
    ``runtime.device.mapped_uploads``) the buffers a session uploads are created mapped and
    written in place: one host copy instead of ``queue.write_buffer``'s copy into a staging
    buffer and the device's copy out of it at the first submit. A state tensor not given starts at zero
    without an upload: WebGPU creates every buffer zero-filled.
    The graph inputs live in one device buffer, each at an offset aligned to
    minStorageBufferOffsetAlignment, so a run uploads them with one write (an input a
    kernel updates in place, or one above :data:`PACK_MAX_BYTES`, keeps a buffer of its
    own); the dispatches' uniform parameters live in one uniform buffer, each at an offset
    aligned to minUniformBufferOffsetAlignment.
    A parameter only derived parameters read (buffer kind 'host') gets no device buffer.

    ``share=other`` makes this session use ``other``'s device buffers for every parameter
    and state tensor of the same name (and derived parameter packing the same sources):
    nothing is uploaded or zero-filled for them, ``params`` may leave them out (values given
    for them are ignored), and an in-place update or :meth:`write_parameter` through either
    session is seen by both. That is how a prefill plan and a decode plan of one model hold
    one copy of the weights and the same KV cache.

    Device memory: the buffers a session creates are destroyed (``GPUBuffer.destroy``) once it and every
    session sharing them (``share=``) have been collected, rather than left to wgpu-native's release of the
    last reference: with wgpu-native 29 a command buffer that is finished but never submitted (the next
    run's, pre-recorded, when a session is dropped) keeps every buffer its bind groups bind alive for good.

    ``finite_inputs=False`` lets float inputs hold NaN and infinities (an ONNX model's feeds
    may: IsNaN, IsInf); by default :meth:`run` refuses them, as a sign of a bug upstream.
    ``finite_parameters=False`` does the same for parameters (here and in :meth:`write_parameter`): an
    ONNX file's initializers may hold them (an additive mask of -inf).

    Raises InputError for a plan that is not an ExecutionPlan, a missing, unknown or
    mis-shaped parameter (or one whose type differs from the shared session's),
    LoweringError when the plan exceeds the device's limits (or needs subgroups the device
    lacks), DeviceError when there is no device. Calls from several threads (:meth:`run`, the parameter and
    output reads and writes) run one at a time, under the session's lock.

    Kernels: a dispatch lowered without naga's runtime checks (``Dispatch.runtime_checks`` False,
    eggfuse's default) gets a module without them on the Vulkan backend only, whose robustBufferAccess
    keeps buffer accesses checked; on any other backend every module keeps WebGPU's checks.

    Recording: the plan is one compute pass in one command buffer. With wgpu-native and the
    compiled loop (``eggfuse.runtime._record``, built at install when a C compiler is
    present) the dispatches are recorded in C with the GIL released; without it through
    cffi calls of wgpu-native (:attr:`recording` names the path). From the second
    :meth:`run` on, the next run's command buffer is recorded by a background thread while
    the device executes the current one (``prerecord=False`` turns this off): the plan and
    its bindings do not change between runs, so a run's host critical path is the input
    writes and one submit. With wgpu-native and :data:`INPUT_RING` > 0 (off by default) the
    packed inputs go through a ring of that many mappable buffers: a run writes its bytes
    into the next one (waiting for its map, i.e. for the run that last used it to finish)
    and its command buffer begins with the copy out of it, so a submission carries no
    command buffer of wgpu's own for the write; otherwise, and for inputs with buffers of
    their own, ``queue.write_buffer``. The
    recorded buffer also holds the copies into the read-back buffers of the outputs the last
    run read (a run that reads others adds a copy buffer of its own).

    Waiting: on a discrete GPU a wait for the device (:meth:`wait`, a read-back) polls without
    blocking for up to ``SPIN_WAIT_S`` seconds, one host core busy, then blocks;
    ``EGGFUSE_SPIN_WAIT=0`` in the environment makes every wait block. A read-back maps, copies
    and unmaps through wgpu-native's C functions where they exist.
    """

    def __init__(self, plan: ExecutionPlan, params: Mapping[str, np.ndarray],
                 device: wgpu.GPUDevice | None = None, *, share: Session | None = None,
                 prerecord: bool = True, finite_inputs: bool = True, finite_parameters: bool = True) -> None:
        self._lock = threading.RLock()
        self._finite_inputs, self._finite_parameters = bool(finite_inputs), bool(finite_parameters)
        if not isinstance(plan, ExecutionPlan):
            raise InputError(f"Session takes an ExecutionPlan, got {type(plan).__name__}: lower a graph first, "
                             "with eggfuse.pipeline.lower_for(graph, device), or compile it with eggfuse.compile")
        check_mapping("parameter", params, plan.parameters)
        if share is not None and device is not None and device is not share.device:
            raise InputError("a Session can share buffers only with a session on the same device")
        self.device = device if device is not None else share.device if share is not None else get_device()
        # the buffers this session creates, destroyed when no session uses them: this one, or one sharing them,
        # which holds them (and those they borrow) through this tuple
        self._owned = _Owned()
        self._holds = (self._owned, *(share._holds if share is not None else ()))
        own = self._owned.add
        limits = dict(self.device.limits)
        check_limits(plan, limits)
        if plan.subgroups and not subgroup_reductions_usable(self.device):
            raise LoweringError("the plan was lowered with subgroup operations, which this device "
                                "does not offer usably: lower it again with subgroups=False")
        self.plan = plan
        # kernels without naga's runtime checks (Dispatch.runtime_checks) only where the backend checks
        # buffer accesses itself: Vulkan's robustBufferAccess
        self._unchecked_ok = unchecked_modules_allowed(self.device)
        self.adapter = adapter_description(self.device)
        # waits that poll without blocking (SPIN_WAIT_S): discrete GPUs only (a CPU adapter's work runs on
        # the host's cores, an integrated GPU shares their power), through wgpu-native's C API
        self._spin = (SPIN_WAIT_S > 0 and os.environ.get("EGGFUSE_SPIN_WAIT", "1") != "0"
                      and _libf is not None and getattr(self.device, "_internal", None) is not None
                      and self.device.adapter.info.get("adapter_type") == "DiscreteGPU")
        borrowed = {} if share is None else _shared_buffers(plan, share)
        needed = _needed_parameters(plan, borrowed)
        given = {n: v for n, v in dict(params).items() if n in needed or n not in plan.parameters}
        # State tensors start at zero unless given (or shared). WebGPU creates every buffer
        # zero-filled, so only one that a derived parameter packs needs a host array of zeros.
        packing = {name for d in plan.derived.values() for name in d.sources}
        zeroed = {name for name in plan.state if name in needed and name not in given and name not in packing}
        for name in plan.state:
            if name in needed and name not in given and name in packing:
                given[name] = np.zeros(plan.buffers[plan.parameters[name]].shape, dtype=np.float32)
        # the arrays as given where they are float32 and contiguous already: uploaded, not copied
        values = _check_leaves("parameter", given, {n: i for n, i in needed.items() if n not in zeroed}, plan,
                               copy=False, finite=self._finite_parameters)
        values = {n: _device_form(a) for n, a in values.items()}

        # The inputs share one device buffer (each at an aligned offset), written with one
        # write per run; an input that a kernel writes in place keeps a buffer of its own (one
        # dispatch may not bind one buffer both read-only and writable), as does a large one.
        written = written_buffers(plan.buffers, plan.dispatches)
        packed_inputs = [i for i in plan.inputs.values()
                         if i not in written and plan.buffers[i].size_bytes <= PACK_MAX_BYTES]
        offsets, size = _aligned_offsets([plan.buffers[i].size_bytes for i in packed_inputs],
                                         int(limits.get("min-storage-buffer-offset-alignment", 256)))
        if size > int(limits.get("max-buffer-size", 268_435_456)):  # too large together: one buffer each
            packed_inputs, offsets, size = [], [], 0
        self._offsets = dict.fromkeys(range(len(plan.buffers)), 0)
        self._offsets.update(zip(packed_inputs, offsets, strict=True))
        # the buffers this session uploads: written through a mapping where the device allows
        uploads = ({plan.parameters[n] for n in values if plan.buffers[plan.parameters[n]].kind != "host"}
                   | set(plan.derived) | set(plan.constants)) - set(borrowed)
        self._mapped_uploads = mapped_uploads(self.device)
        with device_errors("creating the session's buffers"):
            arena = own(self.device.create_buffer(size=size, usage=_STORAGE, label="inputs")) if size else None
            self._input_buffer = arena
            shared = [own(self.device.create_buffer(size=n, usage=_STORAGE, label=f"intermediates {k}"))
                      for k, n in enumerate(plan.storage_sizes)]
            self._buffers: list[wgpu.GPUBuffer | None] = [
                borrowed[b.index] if b.index in borrowed else None if b.kind in ("host", "window")
                else arena if b.index in packed_inputs
                else shared[plan.storage[b.index]] if b.index in plan.storage
                else None if b.index in uploads  # created by _upload, beside the pipelines
                else own(self.device.create_buffer(size=b.size_bytes, usage=_STORAGE, label=b.name))
                for b in plan.buffers]
        # run(): each input's checks and its place in the host copy of the input buffer
        self._input_staging = np.zeros(size, dtype=np.uint8)
        self._input_slots = {name: _InputSlot(name, index, plan.buffers[index].type, plan.index_bounds.get(name),
                                              getattr(plan, "index_readers", {}).get(name),
                                              self._input_staging, self._offsets[index], index in packed_inputs,
                                              bool(finite_inputs), getattr(plan, "index_parts", {}).get(name, ()))
                             for name, index in plan.inputs.items()}
        self._own_slots = [slot for slot in self._input_slots.values() if not slot.packed]
        # the packed inputs the compiled staging (_record.stage) checks, as it takes them, then the others
        # (those with parts of their own bounds: IndexPart)
        self._packed_slots = [slot for slot in self._input_slots.values() if slot.packed and not slot.parts]
        self._checked_slots = [slot for slot in self._input_slots.values() if slot.packed and slot.parts]
        self._stage_slots = None
        if getattr(_c_record, "stage", None) is not None:
            self._stage_slots = tuple((slot.name, self._offsets[slot.index], tuple(map(int, slot.type.shape)),
                                       _STAGE_KIND[slot.type.dtype], -1 if slot.rows is None else slot.rows)
                                      for slot in self._packed_slots)
        # run()'s input write and submit as wgpu-native calls with wgpu-py's error capture
        # only (its wrappers' argument handling costs ~15 us a run): the queue handle, the
        # input buffer's, and the host copy's address
        self._raw: tuple | None = None
        if _libf is not None and getattr(self.device.queue, "_internal", None) is not None:
            self._raw = (self.device.queue._internal, getattr(self._input_buffer, "_internal", None),
                         _ffi.cast("void *", self._input_staging.ctypes.data))
        # the input ring (INPUT_RING): buffers mapped for writing or with a map pending (until the run
        # that last read one has run), and per buffer the request of its map (None: none requested)
        self._ring: list[wgpu.GPUBuffer] = []
        self._ring_requests: list[int | None] = []
        self._ring_submissions: list = []  # per buffer, the submission index of the run that last read it
        if (INPUT_RING > 0 and self._raw is not None and self._raw[1] is not None and self._input_staging.size
                and plan.dispatches):
            with device_errors("creating the session's input ring"):
                usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
                self._ring = [own(self.device.create_buffer(size=self._input_staging.nbytes, label=f"input ring {k}",
                                                            usage=usage))
                              for k in range(INPUT_RING)]
            self._ring_requests = [_map_async(b, _lib.WGPUMapMode_Write, ring=True) for b in self._ring]
            self._ring_submissions = [None] * INPUT_RING
            weakref.finalize(self, _forget_ring_requests, self._ring_requests)
        # The buffers this session uploads are created and written on a thread of their own
        # (wgpu-native's calls and the copies run without the GIL) while this one builds the
        # uniform buffer and the pipelines; the bind groups follow.
        uploading = _Background(self._upload, values, borrowed, uploads)
        try:
            # the sources of derived parameters, kept to repack those when one is written
            # (write_parameter): copies, unless no one can write them (read-only memory); not a parameter whose
            # derived parameters each pack it alone as f32 (a weight transposed for the tiled matmul,
            # lowering.layout), which the written value alone repacks and the device gives back
            self._unkept = _packed_alone(plan)
            self._packed_sources = {name: _kept(values[name]) if name in values else share._packed_sources[name]
                                    for d in plan.derived.values() for name in d.sources if name not in self._unkept}
            # every dispatch's parameters in one uniform buffer, each at an aligned offset: one
            # buffer for wgpu-native to track per run instead of one per dispatch
            offsets, size = _aligned_offsets([len(d.params) for d in plan.dispatches],
                                             int(limits.get("min-uniform-buffer-offset-alignment", 256)))
            self._uniform: wgpu.GPUBuffer | None = None
            if size:
                packed = np.zeros(size, dtype=np.uint8)
                for d, offset in zip(plan.dispatches, offsets, strict=True):
                    packed[offset:offset + len(d.params)] = np.frombuffer(d.params, dtype=np.uint8)
                with device_errors("creating the dispatches' uniform buffer"):
                    self._uniform = own(self.device.create_buffer_with_data(data=packed,
                                                                            usage=wgpu.BufferUsage.UNIFORM))
            pipelines = [self._pipeline(d) for d in plan.dispatches]
        finally:
            uploading.join()  # raises what the upload raised
        for b in plan.buffers:  # a window binds a range of its table's buffer (BufferSpec.window)
            if b.window is not None:
                self._buffers[b.index] = self._buffers[b.window[0]]
                self._offsets[b.index] = self._offsets[b.window[0]] + b.window[1]
        self._uniform_offsets = offsets  # each dispatch's range of the uniform buffer starts here
        self._commands = [self._bind(d, *pipeline, offset)
                          for d, pipeline, offset in zip(plan.dispatches, pipelines, offsets, strict=True)]
        self._prerecord = bool(prerecord)
        self._runs = 0
        self._next: _Pending | None = None  # the next run's command buffer, being recorded
        self._native: tuple | None = None  # (commands [n, 5] uint64, function addresses), on first run
        self._staging: dict[int, wgpu.GPUBuffer] = {}  # read-back buffers, made on an output's first read
        # the buffers whose read-back copies the next run's pre-recorded command buffer holds: the last run's
        self._read_set: tuple[int, ...] = ()

    def _new_buffer(self, b, uploaded: bool) -> wgpu.GPUBuffer:
        # A device buffer of its own; one this session uploads is created mapped where the
        # device allows (mapped_uploads), so the upload is one host copy into it.
        if uploaded and self._mapped_uploads:
            return self._owned.add(self.device.create_buffer(
                size=b.size_bytes, usage=_STORAGE | wgpu.BufferUsage.MAP_WRITE, mapped_at_creation=True, label=b.name))
        return self._owned.add(self.device.create_buffer(size=b.size_bytes, usage=_STORAGE, label=b.name))

    def _upload(self, values: Mapping[str, np.ndarray], borrowed: Mapping[int, wgpu.GPUBuffer],
                uploads: set[int]) -> None:
        # The buffers of ``uploads`` created, and parameters, derived parameters and constants
        # written into them (not into buffers borrowed from a shared session, nor state tensors
        # left zero): into the mapping of a buffer created mapped, else through the queue.
        plan, queue = self.plan, self.device.queue
        with device_errors("creating the session's buffers"):
            for index in sorted(uploads):
                self._buffers[index] = self._new_buffer(plan.buffers[index], True)

        def put(buffer: wgpu.GPUBuffer, offset: int, arr: np.ndarray) -> None:
            if arr.nbytes == 0:
                return
            if buffer.map_state == "mapped":
                buffer.write_mapped(arr, offset)
            else:
                queue.write_buffer(buffer, offset, arr)

        with device_errors("uploading the session's parameters"):
            try:
                for name, arr in values.items():
                    index = plan.parameters[name]
                    if self._buffers[index] is not None and index not in borrowed:
                        put(self._buffers[index], 0, arr)
                for index, d in plan.derived.items():
                    if index not in borrowed:
                        _write_packed(put, self._buffers[index], [values[name] for name in d.sources], d)
                for index, arr in plan.constants.items():
                    put(self._buffers[index], 0, np.ascontiguousarray(arr))
            finally:
                for buffer in {id(b): b for b in self._buffers if b is not None}.values():
                    if buffer.map_state == "mapped":
                        buffer.unmap()

    def _pipeline(self, d) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]:
        # The pipeline of one dispatch and its bind group layout (cached per process).
        return get_pipeline(self.device, d.source, d.entry_point, len(d.bindings), bool(d.params),
                            label=f"{d.kernel}: {d.label}", writable=d.writable, prefetch=len(d.prefetch),
                            checks=d.runtime_checks or not self._unchecked_ok)

    def _bind(self, d, pipeline: wgpu.GPUComputePipeline, bgl: wgpu.GPUBindGroupLayout, uniform_offset: int,
              replaced: Mapping[int, wgpu.GPUBuffer] | None = None
              ) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroup, tuple[int, int, int]]:
        # Pipeline, bind group (with the dispatch's range of the uniform buffer) and grid of one dispatch; a buffer
        # index of ``replaced`` bound to that buffer, from its start, instead of the session's.
        replaced = replaced or {}

        def resource(index: int, size: int) -> dict:
            if index in replaced:
                return {"buffer": replaced[index], "offset": 0, "size": size}
            return {"buffer": self._buffers[index], "offset": self._offsets[index], "size": size}

        with device_errors(f"binding buffers for {d.label}"):
            entries = [{"binding": slot, "resource": resource(index, self.plan.buffers[index].size_bytes)}
                       for slot, index in enumerate(d.bindings)]
            if d.params:
                entries.append({"binding": len(d.bindings),
                                "resource": {"buffer": self._uniform, "offset": uniform_offset,
                                             "size": len(d.params)}})
            # the buffers it prefetches, read as vec4s: whole ones
            entries += [{"binding": len(entries) + j,
                         "resource": resource(index, self.plan.buffers[index].size_bytes // 16 * 16)}
                        for j, index in enumerate(d.prefetch)]
            bind_group = self.device.create_bind_group(layout=bgl, entries=entries, label=d.label)
        return pipeline, bind_group, d.workgroups

    def _rebound(self, replaced: Mapping[int, wgpu.GPUBuffer] | None = None,
                 pipelines: Sequence[wgpu.GPUComputePipeline | None] | None = None) -> list[tuple]:
        # The dispatches' commands (as _commands holds them) made again: a buffer index of ``replaced`` bound to
        # that buffer instead of the session's, a dispatch's pipeline of ``pipelines`` (None: its own) instead of
        # its own. For the benchmarks (bench/prefetch.py, bench/gpu_timing.weight_copies).
        pipelines = pipelines or [None] * len(self.plan.dispatches)
        out = []
        for d, offset, pipeline in zip(self.plan.dispatches, self._uniform_offsets, pipelines, strict=True):
            own, bgl = self._pipeline(d)
            out.append(self._bind(d, pipeline or own, bgl, offset, replaced))
        return out

    @_one_at_a_time
    def read_parameter(self, name: str) -> np.ndarray:
        """The current device contents of parameter or state ``name`` (float32, its shape):
        after in-place updates (optimiser steps, KV-cache writes) not the uploaded value.
        A parameter only derived parameters read (kind 'host') comes from its host copy, or, where each of them
        packs it alone in f32 (a weight transposed for the tiled matmul: ``lowering.layout``), from the device.
        Raises InputError for an unknown name."""
        index = self.plan.parameters.get(name)
        if index is None:
            raise InputError(f"no parameter {name!r} on the device; parameters: {', '.join(self.plan.parameters)}")
        if self._buffers[index] is None and name in self._unkept:  # from the one it is packed into
            packed, d = next((i, d) for i, d in self.plan.derived.items() if d.sources == (name,))
            value = self._read_buffer(packed, self.plan.buffers[packed].type, f"reading parameter {name!r}")
            return np.ascontiguousarray(value.T) if d.transpose else value
        if self._buffers[index] is None:
            return self._packed_sources[name].copy()
        return self._read_buffer(index, self.plan.buffers[index].type, f"reading parameter {name!r}")

    @_one_at_a_time
    def write_parameter(self, name: str, value: np.ndarray) -> None:
        """Replace the device contents of parameter or state ``name`` (checked like the
        session's parameters; the array is not modified), and repack every derived
        parameter packed from it. Raises InputError for an unknown name or a bad array."""
        index = self.plan.parameters.get(name)
        if index is None:
            raise InputError(f"no parameter {name!r} on the device; parameters: {', '.join(self.plan.parameters)}")
        arr = _device_form(np.ascontiguousarray(check_array(f"parameter {name!r}", value,
                                                             self.plan.buffers[index].type,
                                                             finite=self._finite_parameters)))
        for d in self.plan.derived.values():  # refused before anything is written: the session stays as it was
            if name in d.sources and d.store == "f16":
                _check_f16_range(name, arr)
        with device_errors(f"writing parameter {name!r}"):
            if self._buffers[index] is not None:
                self.device.queue.write_buffer(self._buffers[index], 0, arr)
            for packed, d in self.plan.derived.items():
                if name in d.sources:
                    _write_packed(self.device.queue.write_buffer, self._buffers[packed],
                                  [arr if n == name else self._packed_sources[n] for n in d.sources], d)
            if name in self._packed_sources:
                self._packed_sources[name] = arr

    @_one_at_a_time
    def read_output(self, index: int) -> np.ndarray:
        """The current contents of graph output ``index`` (its shape and dtype), as the
        last :meth:`run` left them; waits for the device. Lets a caller that ran with
        ``read=()`` fetch an output later. Raises InputError for an index out of range."""
        if not 0 <= index < len(self.plan.outputs):
            raise InputError(f"output {index} out of range: the graph has {len(self.plan.outputs)} outputs")
        return self._read_buffer(self.plan.outputs[index], self.plan.output_types[index], f"reading output {index}")

    def _read_buffer(self, index: int, ty, what: str) -> np.ndarray:
        with device_errors(what):
            raw = self.device.queue.read_buffer(self._buffers[index], self._offsets[index],
                                                self.plan.buffers[index].size_bytes)
        return _host_array(raw, ty)

    @property
    def recording(self) -> str:
        """How :meth:`run` records the plan: 'C loop' (the compiled loop), 'cffi loop'
        (wgpu-native without the compiled loop) or 'wgpu-py calls' (another backend)."""
        if _lib is None:
            return "wgpu-py calls"
        return "C loop" if _c_record is not None else "cffi loop"

    @_one_at_a_time
    def record_and_submit(self) -> None:
        """Record the plan and submit it, without writing inputs, pre-recording or waiting:
        the host cost of recording alone (benchmarks)."""
        with device_errors("running the plan"):
            self.device.queue.submit(self._record_plan())

    @_one_at_a_time
    def wait(self) -> None:
        """Block until the device has finished the submitted work: on a discrete GPU, polls that return
        at once for up to SPIN_WAIT_S seconds (one host core busy; ``EGGFUSE_SPIN_WAIT=0`` in the
        environment of the process turns it off), then wgpu-native's
        ``wgpuDevicePoll`` with wait (wgpu-py 0.32's ``on_submitted_work_done`` does not work with
        its wgpu-native), or without wgpu-native's C API a 4-byte read-back. On an idle H200 the poll
        took 5.1-5.4 us, the read-back 312-628 us (``bench/runtime_overhead.py``,
        bench/results/runtime_overhead_h200_run4.json)."""
        with device_errors("waiting for the device"):
            if self._spin and _spin_until_idle(self.device):
                return
            if not _poll_until_idle(self.device):
                index = self.plan.outputs[0]
                self.device.queue.read_buffer(self._buffers[index], self._offsets[index], 4)

    def _take_recorded(self, copies: tuple[int, ...], slot: int | None
                       ) -> tuple[list[wgpu.GPUCommandBuffer], object, tuple[int, ...]]:
        # This run's command buffer (and its handles and read-back copies, see _record_for_run): the one
        # recorded in the background (with the last run's copies), or recorded now with ``copies``;
        # either begins with the copy out of the input ring's buffer ``slot`` (None: no ring).
        if self._next is not None:
            pending, self._next = self._next, None
            buffers, handles, copied, recorded_slot = pending.result()
            if recorded_slot == slot:
                return buffers, handles, copied
            # (not expected: both slots come from self._runs, which only a submitted run advances)
            del buffers, handles
        return self._record_for_run(copies, slot)[:3]

    def _record_for_run(self, copies: tuple[int, ...], slot: int | None
                        ) -> tuple[list[wgpu.GPUCommandBuffer], object, tuple[int, ...], int | None]:
        # The plan's command buffer with the copy out of the input ring's buffer ``slot`` before its
        # pass and the copies of the buffers ``copies`` into their read-back buffers after it, the C
        # array of its wgpu-native handle that run() submits (None without wgpu-native), ``copies``
        # and ``slot``.
        buffers = self._record_plan(copies, slot)
        return buffers, None if self._raw is None else _handles(buffers), copies if buffers else (), slot

    def _fill_ring(self, slot: int) -> None:
        # The packed inputs (the host staging copy) into the input ring's buffer ``slot``: wait for its map
        # (the run that last read it done), copy, unmap.
        buffer, request = self._ring[slot], self._ring_requests[slot]
        handle, poll, null = buffer._internal, _libf.wgpuDevicePoll, _ffi.NULL
        if request is None:  # a run failed between this buffer's write and its submission
            request = self._ring_requests[slot] = _map_async(buffer, _lib.WGPUMapMode_Write, ring=True)
        start = time.perf_counter()
        while (status := _ring_status.get(request)) is None:
            waited = time.perf_counter() - start
            if waited > MAP_WAIT_S:
                raise DeviceError(f"writing the inputs: an input buffer's map still pending after {MAP_WAIT_S:g} s; "
                                  "the device may be lost or hung: make a new Session")
            if self._spin and waited < SPIN_WAIT_S:
                poll(self.device._internal, False, null)  # returns at once: the later runs stay queued
            elif (index := self._ring_submissions[slot]) is not None:
                poll(self.device._internal, True, index)  # blocks until that run is done, not the later ones
            else:
                _poll_until_idle(self.device)
        self._ring_requests[slot] = None
        _forget_ring_requests([request])
        if status != _lib.WGPUMapAsyncStatus_Success:
            raise DeviceError(f"writing the inputs: mapping an input buffer failed (wgpu-native status {status}); "
                              "the device may be lost: make a new Session")
        pointer = _libf.wgpuBufferGetMappedRange(handle, 0, buffer.size)
        if pointer == _ffi.NULL:
            raise DeviceError("writing the inputs: wgpu-native gave no mapped range for a mapped input "
                              "buffer: make a new Session")
        _ffi.memmove(pointer, self._raw[2], self._input_staging.nbytes)
        _libf.wgpuBufferUnmap(handle)

    def _record_next(self) -> None:
        # Start recording the next run's command buffer on the background thread.
        global _recorder
        self._runs += 1
        if not self._prerecord or self._runs < 2 or not self._commands:
            return
        if _recorder is None:
            _recorder = _Recorder()
        slot = self._runs % len(self._ring) if self._ring else None
        self._next = _recorder.submit(functools.partial(self._record_for_run, self._read_set, slot))
        if self._next is None:  # the interpreter is shutting down: record in run() from now on
            self._prerecord = False

    def _record_plan(self, copies: tuple[int, ...] = (), slot: int | None = None) -> list[wgpu.GPUCommandBuffer]:
        # The plan in one compute pass of one command buffer ([] for a plan with no dispatches), after the
        # copy of the input ring's buffer ``slot`` (None: none) into the input buffer, then the copies of
        # the buffers ``copies`` (indices into the plan's buffers) into their read-back buffers.
        if not self._commands:
            return []
        encoder = self.device.create_command_encoder()
        if slot is not None:
            encoder.copy_buffer_to_buffer(self._ring[slot], 0, self._input_buffer, 0, self._ring[slot].size)
        compute = encoder.begin_compute_pass()
        handle = getattr(compute, "_internal", None)
        if _lib is not None and handle is not None:
            if self._native is None:
                # handles resolved once; the session keeps the pipelines and bind groups alive
                rows = [(p._internal, b._internal, *grid) for p, b, grid in self._commands]
                if _c_record is not None:
                    fns = ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                           "wgpuComputePassEncoderDispatchWorkgroups")
                    table = np.array([(_addr(p), _addr(b), x, y, z) for p, b, x, y, z in rows], dtype=np.uint64)
                    self._native = (table.reshape(-1, 5), tuple(_addr(_ffi.addressof(_lib, f)) for f in fns))
                else:
                    self._native = (rows, ())
            table, fns = self._native
            if fns:
                _c_record.record(_addr(handle), table, *fns)
            else:
                # wgpu-native's C functions called directly: wgpu-py's wrappers cost ~3x as
                # much per dispatch (argument handling, error capture, a cffi array per call);
                # validation errors still surface at finish()
                set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
                set_bind_group = _lib.wgpuComputePassEncoderSetBindGroup
                dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
                null, last = _ffi.NULL, None
                for pipeline, bind_group, x, y, z in table:
                    if pipeline != last:
                        set_pipeline(handle, pipeline)
                        last = pipeline
                    set_bind_group(handle, 0, bind_group, 0, null)
                    dispatch(handle, x, y, z)
        else:
            for pipeline, bind_group, grid in self._commands:
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(*grid)
        compute.end()
        for index in copies:
            staging = self._staging[index]
            encoder.copy_buffer_to_buffer(self._buffers[index], self._offsets[index], staging, 0, staging.size)
        return [encoder.finish()]

    @_one_at_a_time
    def run(self, inputs: Mapping[str, np.ndarray], read: Sequence[int] | None = None) -> list[np.ndarray]:
        """Run the plan once; returns one new array per graph output (its shape and dtype).

        ``inputs`` maps every input name to an array of its shape (integers for u32
        indices, which must be below the rows of the table they index); the arrays are
        not modified. The plan is one compute pass (recorded while the previous run executed,
        see the class docstring), followed by copies into the read-back buffers. ``read`` lists the output
        indices to copy back (default: all); the result then holds those outputs only, in
        that order. With ``read=()`` the run is submitted without waiting for the device
        (a training step whose outputs are parameters updated in place); a later read
        waits for it. Raises InputError for a missing, unknown or mis-shaped input, an
        index out of range, or an output index in ``read`` out of range; DeviceError for a
        wgpu error, including one met while this run's commands were recorded in the
        background after the previous run.
        """
        plan = self.plan
        if read is None:
            read = range(len(plan.outputs))
        else:
            if isinstance(read, str | bytes) or not isinstance(read, Iterable):
                raise InputError(f"read must be a sequence of output indices, got {read!r}")
            read = list(read)
            if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in read):
                raise InputError(f"read must hold output indices (ints), got {read!r}")
            bad = [i for i in read if not 0 <= i < len(plan.outputs)]
            if bad:
                raise InputError(f"read: output(s) {bad} out of range; the graph has {len(plan.outputs)} outputs")
        slots = self._input_slots
        if not isinstance(inputs, Mapping) or inputs.keys() != slots.keys():
            # raises for a missing or unknown input (an input no output reads is neither: values as the slots take them)
            _check_leaves("input", inputs, plan.inputs, plan, finite=self._finite_inputs)
        if self._stage_slots is not None and type(inputs) is dict:
            # compiled: copies and checks the inputs that are arrays of their type already
            rest = [self._packed_slots[i] for i in _c_record.stage(self._input_staging, inputs, self._stage_slots)]
            rest += self._checked_slots
        else:
            rest = self._packed_slots + self._checked_slots
        for slot in rest:  # into the host copy of the input buffer
            slot.view[...] = slot.check(inputs[slot.name])
        own = [(slot, slot.check(inputs[slot.name])) for slot in self._own_slots]
        try:
            queue, raw = self.device.queue, self._raw
            for slot, arr in own:
                queue.write_buffer(self._buffers[slot.index], 0, np.ascontiguousarray(_device_form(arr)))
            slot = self._runs % len(self._ring) if self._ring else None
            if slot is not None:
                self._fill_ring(slot)
            elif self._input_staging.size:
                if raw is not None:
                    _libf.wgpuQueueWriteBuffer(raw[0], raw[1], 0, raw[2], self._input_staging.nbytes)
                else:
                    queue.write_buffer(self._input_buffer, 0, self._input_staging)
            wanted = {plan.outputs[i]: self._staging_buffer(plan.outputs[i]) for i in read} if read else {}
            buffers, handles, copied = self._take_recorded(tuple(wanted), slot)
            if missing := [index for index in wanted if index not in copied]:
                # the copies the pre-recorded buffer lacks (it holds the last run's; a staging buffer a
                # copy writes and nobody reads costs a copy, nothing else)
                encoder = self.device.create_command_encoder()
                for index in missing:
                    staging = wanted[index]
                    encoder.copy_buffer_to_buffer(self._buffers[index], self._offsets[index], staging, 0,
                                                  staging.size)
                buffers.append(encoder.finish())
                handles = None if raw is None else _handles(buffers)
                del encoder
            self._read_set = tuple(wanted)
            if slot is not None:  # (a ring implies wgpu-native's C API: raw)
                submitted = _libf.wgpuQueueSubmitForIndex(raw[0], len(buffers), handles)
                self._ring_submissions[slot] = _ffi.new("WGPUSubmissionIndex *", submitted)
                # mapped again once the device has run this run's copy out of it
                self._ring_requests[slot] = _map_async(self._ring[slot], _lib.WGPUMapMode_Write, ring=True)
            elif raw is not None:
                _libf.wgpuQueueSubmit(raw[0], len(buffers), handles)
            else:
                queue.submit(buffers)
            # released here, not when run() returns: wgpu-native's release would wait on the
            # next run's recording, which holds the device's command locks
            del buffers
            self._record_next()
            if not wanted:
                return []
            raw = self._read_back(wanted)
        except (wgpu.GPUError, wgpu.GPUPipelineError) as e:
            raise device_error("running the plan", e) from e
        outs, handed = [], set()
        for i in read:  # outputs that share a buffer get arrays of their own: the first takes the bytes read
            index = plan.outputs[i]
            outs.append(_host_array(raw[index], plan.output_types[i], fresh=index not in handed))
            handed.add(index)
        return outs

    def _read_back(self, wanted: dict[int, wgpu.GPUBuffer]) -> dict[int, bytearray | memoryview]:
        # The bytes of the read-back buffers ``wanted`` (buffer index -> staging buffer) once the run's
        # copies into them are done. With wgpu-native's C API: on a discrete GPU (self._spin) a wait that
        # polls without blocking (SPIN_WAIT_S), then _map_read; without it wgpu-py's map_sync, each buffer
        # unmapped also when its read fails. wgpu-py's map path costs a promise and a new cffi callback a
        # buffer and wakes this thread from its poll thread: on the H200 (bench/submit_gaps.py,
        # run_read_1_spinning, bench/results/submit_gaps_h200/gaps_read.json against gaps_spin.json) a MiniLM
        # run read back took 1455.7 us through _map_read against 1542 through wgpu-py's map_async (its
        # READ_NOSYNC mode; GPU time 1172), the decode step 1103.6 against 1336, the prefill (25 MB of
        # logits) 7403 against 9659.
        if _libf is None or getattr(self.device, "_internal", None) is None:
            raw = {}
            for i, staging in wanted.items():
                staging.map_sync(wgpu.MapMode.READ)
                try:
                    raw[i] = staging.read_mapped()
                finally:
                    staging.unmap()
            return raw
        if self._spin:
            _spin_until_idle(self.device)
        return _map_read(self.device, wanted)

    def _staging_buffer(self, index: int) -> wgpu.GPUBuffer:
        # The read-back (MAP_READ) buffer of an output's buffer, made on its first read.
        if index not in self._staging:
            self._staging[index] = self._owned.add(self.device.create_buffer(
                size=self.plan.buffers[index].size_bytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST))
        return self._staging[index]


#: The compiled staging's element kinds (runtime/_record.c): booleans are staged in Python.
_STAGE_KIND = {DType.F32: 0, DType.U32: 1, DType.I32: 2, DType.BOOL: -1}


#: Longest a session's wait on a discrete GPU polls without blocking (a loop of ``wgpuDevicePoll`` calls
#: that return at once, one host core busy) before it blocks in one poll with wait; 0 (or
#: ``EGGFUSE_SPIN_WAIT=0`` in the environment): always block. Set before a Session is made. On the H200
#: (``bench/submit_gaps.py``, 10 back-to-back runs and one wait) blocking, polling, blocking again in one
#: call (bench/results/submit_gaps_h200/gaps_spin_probe.json): MiniLM 1214.7 / 1203.9 / 1222.5 us a run,
#: SmolLM2's decode step 974.9 / 964.3 / 977.0, its prefill 3132.7 / 3103.9 / 3139.1; with this code
#: (gaps_spin.json) 1218.2 blocking against 1195.0 polling, 974.8 against 963.3, 3138.2 against 3130.8.
#: One run and its wait: mixed, 1328.1 against 1275.6 us for MiniLM in one call, 1322.2 against 1337.1
#: in the other. A wait that blocks after polling cost up to about 0.4 ms more than one that polls to the
#: end: on an H100 (bench/results/deberta_lanes_h100/gaps_spin.json, --spin-caps 0.01 0.1, three alternated
#: rounds) 10 back-to-back prefill runs, one 31 ms wait, took 3186.3-3192.5 us a run with a 10 ms cap and
#: 3150.5-3157.0 with 100 ms; MiniLM's (11 ms) and the decode step's (10 ms) were within their rounds' spread
#: (1133.2-1140.3 against 1129.6-1138.6, 1009.7-1013.3 against 1007.0-1014.4). CUDA's default schedule
#: polls without a limit where a process has fewer contexts than cores.
SPIN_WAIT_S = 0.1
#: Map callbacks' results by request (_map_read): written by the callback, on whichever thread polls.
_map_status: dict[int, int] = {}
_map_requests = itertools.count(1)
#: The same for the input rings' maps (Session._fill_ring): the statuses of the requests in _ring_live.
_ring_status: dict[int, int] = {}
_ring_live: set[int] = set()
_on_mapped = None  # the one cffi callback of every map request, made on the first (cffi parses its type)
_on_mapped_lock = threading.Lock()
#: Longest a read-back waits for its maps (_map_read) before it gives up with a DeviceError, seconds.
MAP_WAIT_S = 60.0


def _map_async(buffer: wgpu.GPUBuffer, mode: int, ring: bool = False, request: int | None = None) -> int:
    # Request a map of all of ``buffer`` (mode: wgpu-native's WGPUMapMode_Read or _Write) through wgpu-native's
    # C function, with the one callback every request shares; returns the request's number (``request``, or
    # the next of _map_requests), under which the callback (on whichever thread polls the device) writes the
    # map's status into _map_status, or with ``ring`` (a buffer of a session's input ring) into _ring_status
    # while the request is in _ring_live.
    global _on_mapped
    with _on_mapped_lock:
        if _on_mapped is None:
            @_ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
            def _on_mapped(status, message, userdata1, userdata2):
                request = int(_ffi.cast("uintptr_t", userdata1))
                if userdata2 == _ffi.NULL:
                    _map_status[request] = int(status)
                elif request in _ring_live:
                    _ring_status[request] = int(status)
    request = next(_map_requests) if request is None else request
    info = _ffi.new("WGPUBufferMapCallbackInfo *")
    info.mode = _lib.WGPUCallbackMode_AllowProcessEvents
    info.callback = _on_mapped
    info.userdata1 = _ffi.cast("void *", request)
    if ring:
        _ring_live.add(request)
        info.userdata2 = _ffi.cast("void *", 1)
    _libf.wgpuBufferMapAsync(buffer._internal, mode, 0, buffer.size, info[0])
    return request


def _forget_ring_requests(requests: Sequence[int | None]) -> None:
    # The input ring's map requests ``requests`` settled or abandoned (a session dropped): their statuses
    # forgotten, and a callback still to come for them writes none.
    for request in requests:
        _ring_live.discard(request)
        _ring_status.pop(request, None)


def _map_read(device: wgpu.GPUDevice, buffers: dict[int, wgpu.GPUBuffer]) -> dict[int, bytearray]:
    # The bytes of each MAP_READ buffer of ``buffers`` (key -> buffer), through wgpu-native's C functions:
    # every map requested at once, then blocking polls (each waits for the device to finish the work that
    # writes them) until their callbacks ran, then each range copied out and the buffer unmapped. The
    # buffers are written by copies, not through a mapping, so wgpu-py's extra submission before a read map
    # (its fix of wgpu-native issue 305) is not needed. Raises DeviceError for a map that failed or stayed
    # pending; every map requested is undone (a pending one aborted) before it returns or raises, so
    # wgpu-py's buffer objects, unmapped to wgpu-py throughout, are unmapped in wgpu-native too.
    requests = []
    try:
        for key, buffer in buffers.items():
            requests.append((key, buffer, request := next(_map_requests)))  # first: a map left behind is undone
            _map_async(buffer, _lib.WGPUMapMode_Read, request=request)
        deadline = time.perf_counter() + MAP_WAIT_S
        while (pending := sum(request not in _map_status for _, _, request in requests)) > 0:
            if time.perf_counter() > deadline:
                raise DeviceError(f"reading the outputs back: {pending} read-back map(s) still pending after "
                                  f"{MAP_WAIT_S:g} s; the device may be lost or hung: make a new Session")
            _poll_until_idle(device)  # waits for the submitted work; the map callbacks run in it
        out = {}
        for key, buffer, request in requests:
            if _map_status[request] != _lib.WGPUMapAsyncStatus_Success:
                raise DeviceError(f"reading the outputs back: mapping a read-back buffer failed (wgpu-native "
                                  f"status {_map_status[request]}); the device may be lost: make a new Session")
            pointer = _libf.wgpuBufferGetConstMappedRange(buffer._internal, 0, buffer.size)
            if pointer == _ffi.NULL:
                raise DeviceError("reading the outputs back: wgpu-native gave no mapped range for a mapped "
                                  "read-back buffer: make a new Session")
            out[key] = bytearray(_ffi.buffer(pointer, buffer.size))  # the one copy: _host_array keeps it
        return out
    finally:
        for _, buffer, request in requests:
            # mapped: unmapped; still pending: aborted (its callback then runs with an aborted status)
            if _map_status.get(request, _lib.WGPUMapAsyncStatus_Success) == _lib.WGPUMapAsyncStatus_Success:
                with contextlib.suppress(Exception):
                    _libf.wgpuBufferUnmap(buffer._internal)
        with contextlib.suppress(Exception):
            _libf.wgpuDevicePoll(device._internal, False, _ffi.NULL)  # the aborted maps' callbacks
        for _, _, request in requests:
            _map_status.pop(request, None)


def _spin_until_idle(device: wgpu.GPUDevice) -> bool:
    # Poll without blocking until the device has run every submitted command buffer; False when
    # SPIN_WAIT_S passed first. wgpuDevicePoll returns a Rust bool, all submissions done: the low
    # byte of the C return value (the rest is not set).
    internal, deadline = device._internal, time.perf_counter() + SPIN_WAIT_S
    poll, null = _libf.wgpuDevicePoll, _ffi.NULL
    while not poll(internal, False, null) & 0xFF:
        if time.perf_counter() > deadline:
            return False
    return True


def _poll_until_idle(device: wgpu.GPUDevice) -> bool:
    # Block until the device has run every submitted command buffer (wgpuDevicePoll with wait, on
    # this thread); False without wgpu-native's C API. Not for waiting on a map: with wgpu-py's
    # poll thread polling too, a read-back that waited this way took about 10 ms on the H200.
    internal = getattr(device, "_internal", None)
    if _libf is None or internal is None:
        return False
    _libf.wgpuDevicePoll(internal, True, _ffi.NULL)
    return True


def _host_array(raw, ty, fresh: bool = False) -> np.ndarray:
    # A new host array of type ``ty`` from the device bytes ``raw`` (bool from its u32 0/1): over ``raw``
    # itself where the caller hands it over (``fresh``: a bytearray no other array uses), else a copy.
    arr = np.frombuffer(raw, dtype=ty.dtype.device_numpy, count=ty.num_elements).reshape(ty.shape)
    if arr.dtype != ty.dtype.numpy:
        return arr.astype(ty.dtype.numpy)
    return arr if fresh and isinstance(raw, bytearray) else arr.copy()


class _InputSlot:
    """One graph input of a session: its checks, and where :meth:`Session.run` puts it."""

    __slots__ = ("name", "index", "type", "rows", "reader", "packed", "view", "finite", "parts")

    def __init__(self, name: str, index: int, ty, rows: int | None, reader: str | None, staging: np.ndarray,
                 offset: int, packed: bool, finite: bool = True, parts=()) -> None:
        self.name, self.index, self.type, self.rows, self.packed = name, index, ty, rows, packed
        self.parts = tuple(parts)  # IndexPart: elements that an op reads through Slice / Split / Select
        self.reader = reader or "the op reading it"  # (plans from before ExecutionPlan.index_readers: none)
        self.finite = finite
        # its bytes in the host copy of the session's input buffer, as an array of its type
        self.view = (staging[offset:offset + ty.size_bytes].view(ty.dtype.device_numpy).reshape(ty.shape)
                     if packed else None)

    def check(self, value) -> np.ndarray:
        # The value as an array of the input's type (not a copy when it is one already), or
        # InputError: wrong shape or dtype, NaN / infinity (check_array, unless allowed), an integer
        # that float32 does not hold exactly (an f32 input), an index out of range. (The compiled
        # staging hands non-finite values to this check.)
        try:
            arr = check_array(f"input {self.name!r}", value, self.type, copy=False, finite=self.finite, exact=True)
        except InputError:
            self._check_unsigned_range(value)  # an index below 0 (or from 2^32): named as one out of range
            raise
        if self.rows is not None and arr.size:
            self._check_range(arr, self.rows, self.reader, "")
        for part in self.parts:
            self._check_range(arr.reshape(-1)[part.positions], part.rows, part.reader,
                              f" (the {len(part.positions)} of its {arr.size} elements that op reads)")
        return arr

    def _check_unsigned_range(self, value) -> None:
        # IndexRangeError naming the op and its rows where ``value``, refused for u32 indices, holds one below 0
        # (or from 2^32); nothing otherwise (the caller's error stands)
        if self.rows is None or self.type.dtype is not DType.U32:
            return
        try:
            arr = np.asarray(value)
        except Exception:  # noqa: BLE001 - whatever it is, check_array's error says so
            return
        if arr.size == 0 or arr.dtype.kind not in "iu":
            return
        low, top = int(arr.min()), int(arr.max())
        bad = low if low < 0 else top
        if low < 0 or top >= self.rows:
            raise IndexRangeError(f"input {self.name!r}: index {bad} out of range for the {self.rows} rows that "
                                  f"{self.reader} indexes with it; give indices from 0 to {self.rows - 1}",
                                  input=self.name, index=bad, rows=self.rows) from None

    def _check_range(self, arr: np.ndarray, rows: int, reader: str, which: str) -> None:
        top = int(arr.max())
        low = int(arr.min()) if arr.dtype.kind == "i" else 0  # (a second pass only for signed indices)
        if arr.dtype.kind == "i" and (top >= rows or low < -rows):  # ONNX Gather's: from the end
            bad = top if top >= rows else low
            raise IndexRangeError(f"input {self.name!r}: index {bad} out of range for the axis of {rows} that "
                                  f"{reader} indexes with it{which} (ONNX makes an index outside [-{rows}, {rows}) "
                                  f"an error); give indices from -{rows} to {rows - 1}",
                                  input=self.name, index=bad, rows=rows)
        if arr.dtype.kind == "u" and top >= rows:
            raise IndexRangeError(f"input {self.name!r}: index {top} out of range for the {rows} rows that {reader} "
                                  f"indexes with it{which}; give indices below {rows}", input=self.name, index=top,
                                  rows=rows)


class _Owned:
    """The device buffers one session created: destroyed (``GPUBuffer.destroy``) when this object is collected,
    i.e. when that session and every session sharing its buffers (each holds it: ``Session._holds``) are.

    wgpu-native frees a buffer when its last reference goes, but a command buffer that was finished and never
    submitted (a session's pre-recorded next run, left behind when the session is dropped) keeps the bind groups it
    binds, and through them their buffers, alive for good (wgpu-native 29): a dropped SmolLM2 decode session kept
    its weights, 120 MB on lavapipe, each time. Destroying the buffers frees their memory whatever still refers to
    them (once the device has run the work submitted with them)."""

    __slots__ = ("buffers", "__weakref__")

    def __init__(self) -> None:
        self.buffers: list[wgpu.GPUBuffer] = []
        # not at exit: the process's memory goes with it
        weakref.finalize(self, _destroy_buffers, self.buffers).atexit = False

    def add(self, buffer: wgpu.GPUBuffer) -> wgpu.GPUBuffer:
        self.buffers.append(buffer)
        return buffer


def _destroy_buffers(buffers: list[wgpu.GPUBuffer]) -> None:
    # (the finalizer of _Owned: on whichever thread collected it)
    for buffer in buffers:
        with contextlib.suppress(Exception):
            buffer.destroy()
    buffers.clear()


class _Background:
    # ``fn(*args)`` on a thread of its own; join() waits for it and raises what it raised.

    def __init__(self, fn: Callable, *args) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(fn, args), name="eggfuse-upload", daemon=True)
        self._thread.start()

    def _work(self, fn: Callable, args: tuple) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the thread that joins
            self._error = e

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class _Pending:
    # A command buffer being recorded on the recording thread: result() blocks until it is.
    __slots__ = ("_done", "value", "error")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()  # released by the recording thread when the job is done
        self.value: tuple | None = None
        self.error: BaseException | None = None

    def result(self) -> tuple:
        self._done.acquire()
        if self.error is not None:
            raise self.error
        return self.value


class _Recorder:
    # The thread that records sessions' next runs: jobs handed over through a SimpleQueue
    # and finished jobs signalled through a lock (a quarter of the host time that
    # concurrent.futures takes per hand-over). It stops (finishing queued jobs) at exit.

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="eggfuse-record", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(self, job: Callable[[], tuple]) -> _Pending | None:
        # The job's pending result, or None once the recorder has stopped.
        if self._closed:
            return None
        pending = _Pending()
        self._jobs.put((job, pending))
        return pending

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, pending = item
            try:
                pending.value = job()
            except BaseException as e:  # noqa: BLE001 - handed to the thread that takes the result
                pending.error = e
            finally:
                pending._done.release()
            del item, job, pending  # while waiting, hold no session alive

    def close(self) -> None:
        self._closed = True
        self._jobs.put(None)
        self._thread.join()


def _aligned_offsets(sizes: Sequence[int], align: int) -> tuple[list[int], int]:
    # Offsets of items of ``sizes`` bytes laid out one after another in one buffer, each at a
    # multiple of ``align``, and the buffer's size (an empty item takes no space).
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // align) * align
    return offsets, end


def _handles(buffers: Sequence[wgpu.GPUCommandBuffer]):
    # A C array of the wgpu-native handles of command buffers, for wgpuQueueSubmit.
    return _ffi.new("WGPUCommandBuffer[]", [b._internal for b in buffers])


def _addr(handle) -> int:
    # The address of a cffi pointer (a wgpu-native handle or function), as an int.
    return int(_ffi.cast("uintptr_t", handle))


def _shared_buffers(plan: ExecutionPlan, share: Session) -> dict[int, wgpu.GPUBuffer]:
    # The device buffers of ``share`` that ``plan`` reuses, by buffer index: parameters and
    # state by name, derived parameters by what they pack.
    out = {}
    for name, index in plan.parameters.items():
        other = share.plan.parameters.get(name)
        if other is None:
            continue
        mine, theirs = plan.buffers[index].type, share.plan.buffers[other].type
        if mine != theirs:
            raise InputError(f"parameter {name!r} is {mine} in this plan but {theirs} in the shared session")
        if plan.buffers[index].kind != "host" and share._buffers[other] is not None:
            out[index] = share._buffers[other]
        elif plan.buffers[index].kind != "host" and any(
                d.transpose and d.store == "f32" and d.sources == (name,) for d in share.plan.derived.values()):
            # the shared session reads this weight only through a transposed copy (lowering.layout); a weight it
            # packs otherwise (with others, or rounded) this session uploads itself, as before
            raise InputError(f"parameter {name!r}: the shared session holds it only transposed (a copy its tiled "
                             "products read), this plan as stored, so the two would not share it; lower the shared "
                             "session's plan with transpose_weights=False (eggfuse.compile(..., "
                             "transpose_weights=False)), or create this session first and compile the other with "
                             "eggfuse.compile(..., share=), which keeps weights as stored")
    packed = {d: index for index, d in share.plan.derived.items()}
    for index, d in plan.derived.items():
        if (other := packed.get(d)) is not None:
            out[index] = share._buffers[other]
        elif d.transpose and d.store == "f32" and any(n in share.plan.parameters for n in d.sources):
            raise InputError(f"parameter(s) {', '.join(map(repr, d.sources))}: this plan reads them transposed (a "
                             "copy of its own, lowering.layout), the shared session as stored, so the two would not "
                             "share them; lower this plan with transpose_weights=False (eggfuse.compile(..., share=) "
                             "does)")
    return out


def _needed_parameters(plan: ExecutionPlan, borrowed: Mapping[int, wgpu.GPUBuffer]) -> dict[str, int]:
    # Parameters whose values must be given: those with a buffer of their own, and the
    # sources of derived parameters this session packs itself.
    packing = {name for index, d in plan.derived.items() if index not in borrowed for name in d.sources}
    return {name: index for name, index in plan.parameters.items()
            if name in packing or (index not in borrowed and plan.buffers[index].kind != "host")}


def _check_f16_range(name: str, a: np.ndarray) -> None:
    # InputError where parameter ``name`` holds a finite value beyond float16's range (stored as float16)
    peak = float(np.max(np.abs(a), initial=0.0, where=np.isfinite(a)))
    if peak > F16_MAX:
        raise InputError(f"parameter {name!r} {list(a.shape)} holds {peak:g}, beyond float16's largest "
                         f"value {F16_MAX:g}: compile it with precision='f32'")


def _write_packed(put: Callable, buffer: wgpu.GPUBuffer, sources: Sequence[np.ndarray], d: DerivedParameter) -> None:
    # A derived parameter: ``sources`` concatenated along ``d.axis`` into ``buffer`` with
    # put(buffer, offset, array). Along axis 0 of contiguous arrays that is their bytes one
    # after another, written without a packed copy where each starts at a multiple of 8 bytes
    # (what a mapped write needs; the queue's writes need 4). ``d.store`` "f16": rounded to
    # float16 first (InputError naming a source beyond its range); ``d.transpose``: transposed then.
    axis = d.axis
    if d.store == "f16":
        for name, a in zip(d.sources, sources, strict=True):
            _check_f16_range(name, a)
        whole = np.concatenate(sources, axis=axis)
        put(buffer, 0, f16_rows(whole.T if d.transpose else whole))
        return
    if d.transpose:
        put(buffer, 0, np.ascontiguousarray(np.concatenate(sources, axis=axis).T))
        return
    starts = np.cumsum([0, *(a.nbytes for a in sources[:-1])])
    if axis == 0 and all(a.flags.c_contiguous for a in sources) and not (starts % 8).any():
        offset = 0
        for a in sources:
            put(buffer, offset, a)
            offset += a.nbytes
    else:
        put(buffer, 0, np.ascontiguousarray(np.concatenate(sources, axis=axis)))


def _packed_alone(plan: ExecutionPlan) -> frozenset[str]:
    # Parameters whose derived parameters each pack that parameter alone, as f32 (transposed or not), so that
    # the written value alone repacks them and their contents give it back
    derived = list(plan.derived.values())
    names = {n for d in derived for n in d.sources}
    return frozenset(n for n in names if all(d.sources == (n,) and d.store == "f32" for d in derived if n in d.sources))


def _kept(arr: np.ndarray) -> np.ndarray:
    # ``arr`` itself when no one can write its memory (a read-only array, all the way down to a
    # read-only buffer: a memory map opened for reading, bytes), else a copy of it.
    base = arr
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return arr.copy()
        base = base.base
    try:
        return arr if base is not None and memoryview(base).readonly else arr.copy()
    except TypeError:  # a base without the buffer protocol
        return arr.copy()


def _device_form(arr: np.ndarray) -> np.ndarray:
    # a parameter's array in the bytes its buffer holds: booleans as u32 0 or 1 (DType.BOOL), others as they are
    return arr.astype(np.uint32) if arr.dtype == np.bool_ else arr


def _check_leaves(kind: str, given: Mapping[str, np.ndarray], wanted: Mapping[str, int],
                  plan: ExecutionPlan, copy: bool = True, finite: bool = True) -> dict[str, np.ndarray]:
    # Every name present, none unknown, every array of the right shape: the InputError
    # names the leaf and both shapes (check_array), before wgpu sees anything. ``copy=False``
    # returns the given arrays themselves where they are contiguous and of the leaf's dtype.
    check_mapping(kind, given, wanted)
    missing = [f"{n!r} ({plan.buffers[i].type})" for n, i in wanted.items() if n not in given]
    unused = plan.unused_inputs if kind == "input" else plan.unused_parameters
    unknown = [n for n in given if n not in wanted and n not in unused]
    if missing or unknown:
        parts = [f"{kind}(s) not given: {', '.join(missing)}"] if missing else []
        if unknown:
            known = [*wanted, *sorted(unused)]
            parts.append(f"unknown {kind}(s) " + ", ".join(_with_closest(n, known) for n in unknown))
        names = ", ".join(repr(n) for n in wanted) or "none"
        raise InputError(f"{'; '.join(parts)}; the graph's {kind}s are: {names}")
    for name in given:  # a leaf no output reads: checked as the others are (a sign of a mistake), then ignored
        if name not in wanted:
            check_array(f"{kind} {name!r} (which no output reads)", given[name], unused[name], copy=False,
                        finite=finite)
    return {name: np.ascontiguousarray(check_array(f"{kind} {name!r}", given[name], plan.buffers[i].type,
                                                   copy=copy, finite=finite))
            for name, i in wanted.items()}


def _with_closest(name, known: Sequence[str]) -> str:
    # 'X' (did you mean 'x'?): the known name most similar to a misspelt one, ignoring case.
    text = repr(name)
    if not isinstance(name, str):
        return text
    lower = {k.lower(): k for k in reversed(known)}
    close = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.6)
    return f"{text} (did you mean {lower[close[0]]!r}?)" if close else text
