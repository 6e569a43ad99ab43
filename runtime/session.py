"""Session: a lowered plan bound to device buffers, run with one command encoder per call."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import wgpu

from ..ir.errors import InputError
from ..ir.graph import Graph
from ..ir.reference import check_array
from ..lowering import ExecutionPlan, check_limits, lower
from .device import adapter_description, device_errors, get_device
from .pipelines import get_pipeline

try:  # the wgpu-native backend's C functions, for the recording fast path
    from wgpu.backends.wgpu_native import _api as _native
except ImportError:  # another backend: wgpu-py's own calls
    _native = None

_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


class Session:
    """A graph (or plan) on a device, with its parameters uploaded once.

    ``Session(graph_or_plan, params, device=None)``: a :class:`~eggfuse.ir.Graph` is
    lowered against the device's limits; an :class:`~eggfuse.lowering.ExecutionPlan` is
    checked against them. ``params`` maps every parameter name to an array of its shape
    (any real dtype, converted to f32; the caller's arrays are not modified). Constants
    and parameters are uploaded here, derived parameters (``plan.derived``) packed with
    numpy from the converted parameters and uploaded, pipelines (cached per process) and
    bind groups built here, so :meth:`run` only writes inputs, records and reads back.
    A parameter only derived parameters read (buffer kind 'host') gets no device buffer.

    Raises InputError for a missing, unknown or mis-shaped parameter, LoweringError when
    the graph exceeds the device's limits, DeviceError when there is no device. Not
    thread-safe: one :meth:`run` at a time.
    """

    def __init__(self, plan_or_graph: ExecutionPlan | Graph, params: Mapping[str, np.ndarray],
                 device: wgpu.GPUDevice | None = None) -> None:
        self.device = device if device is not None else get_device()
        limits = dict(self.device.limits)
        if isinstance(plan_or_graph, Graph):
            plan = lower(plan_or_graph, limits)
        elif isinstance(plan_or_graph, ExecutionPlan):
            plan = plan_or_graph
            check_limits(plan, limits)
        else:
            raise InputError(f"Session needs a Graph or an ExecutionPlan, got {type(plan_or_graph).__name__}")
        self.plan = plan
        self.adapter = adapter_description(self.device)
        given = dict(params)
        for name in plan.state:  # state tensors start at zero unless given
            if name not in given:
                given[name] = np.zeros(plan.buffers[plan.parameters[name]].shape, dtype=np.float32)
        values = _check_leaves("parameter", given, plan.parameters, plan)

        with device_errors("creating the session's buffers"):
            self._buffers: list[wgpu.GPUBuffer | None] = [
                None if b.kind == "host" else self.device.create_buffer(size=b.size_bytes, usage=_STORAGE,
                                                                        label=b.name)
                for b in plan.buffers]
            queue = self.device.queue
            for name, arr in values.items():
                if self._buffers[plan.parameters[name]] is not None:
                    queue.write_buffer(self._buffers[plan.parameters[name]], 0, arr)
            for index, d in plan.derived.items():
                packed = np.concatenate([values[name] for name in d.sources], axis=d.axis)
                queue.write_buffer(self._buffers[index], 0, np.ascontiguousarray(packed))
            for index, arr in plan.constants.items():
                queue.write_buffer(self._buffers[index], 0, np.ascontiguousarray(arr, dtype=np.float32))
        self._uniforms: list[wgpu.GPUBuffer] = []
        self._commands = [self._prepare(d) for d in plan.dispatches]
        self._native_commands: list | None = None
        with device_errors("creating the read-back buffers"):
            self._staging = {
                index: self.device.create_buffer(size=plan.buffers[index].size_bytes,
                                                 usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
                for index in dict.fromkeys(plan.outputs)
            }

    def _prepare(self, d) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroup, tuple[int, int, int]]:
        # Pipeline, bind group (with the dispatch's own uniform buffer) and grid of one dispatch.
        pipeline, bgl = get_pipeline(self.device, d.source, d.entry_point, len(d.bindings), bool(d.params),
                                     label=f"{d.kernel}: {d.label}")
        with device_errors(f"binding buffers for {d.label}"):
            entries = [{"binding": slot, "resource": {"buffer": self._buffers[index], "offset": 0,
                                                      "size": self.plan.buffers[index].size_bytes}}
                       for slot, index in enumerate(d.bindings)]
            if d.params:
                uniform = self.device.create_buffer_with_data(data=d.params, usage=wgpu.BufferUsage.UNIFORM)
                self._uniforms.append(uniform)
                entries.append({"binding": len(d.bindings),
                                "resource": {"buffer": uniform, "offset": 0, "size": len(d.params)}})
            bind_group = self.device.create_bind_group(layout=bgl, entries=entries, label=d.label)
        return pipeline, bind_group, d.workgroups

    def read_parameter(self, name: str) -> np.ndarray:
        """The current device contents of parameter or state ``name`` (float32, its shape):
        after in-place updates (optimiser steps, KV-cache writes) not the uploaded value.
        Raises InputError for an unknown name."""
        index = self.plan.parameters.get(name)
        if index is None or self._buffers[index] is None:
            raise InputError(f"no parameter {name!r} on the device; parameters: {', '.join(self.plan.parameters)}")
        spec = self.plan.buffers[index]
        with device_errors(f"reading parameter {name!r}"):
            raw = self.device.queue.read_buffer(self._buffers[index], 0, spec.size_bytes)
        return np.frombuffer(raw, dtype=spec.dtype.numpy, count=spec.type.num_elements).reshape(spec.shape).copy()

    def write_parameter(self, name: str, value: np.ndarray) -> None:
        """Replace the device contents of parameter or state ``name`` (checked like the
        session's parameters; the array is not modified). Raises InputError."""
        index = self.plan.parameters.get(name)
        if index is None or self._buffers[index] is None:
            raise InputError(f"no parameter {name!r} on the device; parameters: {', '.join(self.plan.parameters)}")
        arr = np.ascontiguousarray(check_array(f"parameter {name!r}", value, self.plan.buffers[index].type))
        with device_errors(f"writing parameter {name!r}"):
            self.device.queue.write_buffer(self._buffers[index], 0, arr)

    def record_and_submit(self) -> None:
        """Record the plan into one compute pass and submit it, without writing inputs or
        waiting: the runtime's host cost alone (benchmarks)."""
        with device_errors("running the plan"):
            encoder = self.device.create_command_encoder()
            self._record(encoder)
            self.device.queue.submit([encoder.finish()])

    def wait(self) -> None:
        """Block until the device has finished the submitted work (a 4-byte read-back: wgpu-py
        0.32's ``on_submitted_work_done`` does not work with its wgpu-native)."""
        with device_errors("waiting for the device"):
            self.device.queue.read_buffer(self._buffers[self.plan.outputs[0]], 0, 4)

    def _record(self, encoder) -> None:
        if not self._commands:
            return
        compute = encoder.begin_compute_pass()
        if _native is not None and hasattr(compute, "_internal"):
            # wgpu-native's C calls with handles resolved at session creation: wgpu-py's
            # wrappers cost ~3x as much per dispatch (argument handling, a cffi array per
            # set_bind_group). The session keeps the pipelines and bind groups alive.
            if self._native_commands is None:
                self._native_commands = [(p._internal, b._internal, *grid) for p, b, grid in self._commands]
            lib, null, cp, last = _native.libf, _native.ffi.NULL, compute._internal, None
            set_pipeline = lib.wgpuComputePassEncoderSetPipeline
            set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
            dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
            for pipeline, bind_group, x, y, z in self._native_commands:
                if pipeline != last:
                    set_pipeline(cp, pipeline)
                    last = pipeline
                set_bind_group(cp, 0, bind_group, 0, null)
                dispatch(cp, x, y, z)
        else:
            for pipeline, bind_group, grid in self._commands:
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(*grid)
        compute.end()

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run the plan once; returns one new array per graph output (its shape and dtype).

        ``inputs`` maps every input name to an array of its shape (integers for u32
        indices, which must be below the rows of the table they index); the arrays are
        not modified. The whole plan is recorded in one compute pass of one command
        encoder, followed by copies into the read-back buffers. Raises InputError for a
        missing, unknown or mis-shaped input or an index out of range.
        """
        plan = self.plan
        values = _check_leaves("input", inputs, plan.inputs, plan)
        for name, rows in plan.index_bounds.items():
            arr = values[name]
            if arr.size and int(arr.max()) >= rows:
                raise InputError(f"input {name!r}: index {int(arr.max())} out of range for a "
                                 f"table of {rows} rows (Embedding / ScatterAdd)")
        device = self.device
        with device_errors("running the plan"):
            for name, arr in values.items():
                device.queue.write_buffer(self._buffers[plan.inputs[name]], 0, arr)
            encoder = device.create_command_encoder()
            self._record(encoder)
            for index, staging in self._staging.items():
                encoder.copy_buffer_to_buffer(self._buffers[index], 0, staging, 0, staging.size)
            device.queue.submit([encoder.finish()])
            raw = {}
            for index, staging in self._staging.items():
                staging.map_sync(wgpu.MapMode.READ)
                raw[index] = staging.read_mapped()
                staging.unmap()
        outs = []
        for index, ty in zip(plan.outputs, plan.output_types, strict=True):
            arr = np.frombuffer(raw[index], dtype=ty.dtype.numpy, count=ty.num_elements)
            outs.append(arr.reshape(ty.shape).copy())
        return outs


def _check_leaves(kind: str, given: Mapping[str, np.ndarray], wanted: Mapping[str, int],
                  plan: ExecutionPlan) -> dict[str, np.ndarray]:
    # Every name present, none unknown, every array of the right shape: the InputError
    # names the leaf and both shapes (check_array), before wgpu sees anything.
    if not isinstance(given, Mapping):
        raise InputError(f"{kind}s must be a mapping of name -> array, got {type(given).__name__}")
    missing = [f"{n!r} ({plan.buffers[i].type})" for n, i in wanted.items() if n not in given]
    if missing:
        raise InputError(f"{kind}(s) not given: {', '.join(missing)}")
    unknown = [n for n in given if n not in wanted and n not in plan.unused_leaves]
    if unknown:
        known = ", ".join(repr(n) for n in wanted) or "none"
        raise InputError(f"unknown {kind}(s) {', '.join(map(repr, unknown))}; "
                         f"the graph's {kind}s are: {known}")
    return {name: np.ascontiguousarray(check_array(f"{kind} {name!r}", given[name], plan.buffers[i].type))
            for name, i in wanted.items()}
