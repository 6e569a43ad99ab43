"""Compute pipelines with explicit bind group layouts, cached per process.

The layout follows the dispatch convention of :class:`~eggfuse.lowering.Dispatch`:
read-only storage at bindings 0..n-2 (read_write at the dispatch's ``writable`` positions),
the read_write output at n-1, the uniform (if any) at n, then the buffers the dispatch
prefetches, read-only (``Dispatch.prefetch``). An explicit layout keeps every
binding, where ``layout="auto"`` would drop bindings the shader does not use and bind group
creation would then fail.
"""

from __future__ import annotations

import hashlib

import wgpu

from .device import device_errors

_modules: dict[tuple[int, str], wgpu.GPUShaderModule] = {}
_pipelines: dict[tuple, tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout, wgpu.GPUDevice]] = {}


def layout_entries(num_storage: int, has_uniform: bool, writable: tuple[int, ...] = (),
                   prefetch: int = 0) -> list[dict]:
    """Bind group layout entries for ``num_storage`` storage buffers (the last and those at
    ``writable`` read_write), the uniform, then ``prefetch`` read-only storage buffers."""
    entries = []
    for i in range(num_storage):
        write = i == num_storage - 1 or i in writable
        kind = wgpu.BufferBindingType.storage if write else wgpu.BufferBindingType.read_only_storage
        entries.append({"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
    if has_uniform:
        entries.append({"binding": num_storage, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.uniform}})
    first = len(entries)
    entries += [{"binding": first + j, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": wgpu.BufferBindingType.read_only_storage}} for j in range(prefetch)]
    return entries


def get_pipeline(
    device: wgpu.GPUDevice, source: str, entry_point: str, num_storage: int, has_uniform: bool,
    label: str = "", writable: tuple[int, ...] = (), prefetch: int = 0,
) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]:
    """The pipeline of ``entry_point`` in WGSL ``source`` and its bind group layout
    (``writable``: the storage bindings besides the last that are read_write; ``prefetch``: the
    read-only storage bindings after the uniform).

    Cached by (device, source hash, entry point, binding signature). Raises DeviceError
    if the shader does not compile (a kernel bug), naming ``label``.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()
    key = (id(device), digest, entry_point, num_storage, has_uniform, tuple(writable), prefetch)
    hit = _pipelines.get(key)
    if hit is not None:
        return hit[0], hit[1]
    with device_errors(f"compiling kernel for {label or entry_point}"):
        module = _modules.get((id(device), digest))
        if module is None:
            module = device.create_shader_module(code=source, label=label)
            _modules[(id(device), digest)] = module
        bgl = device.create_bind_group_layout(entries=layout_entries(num_storage, has_uniform, writable, prefetch))
        layout = device.create_pipeline_layout(bind_group_layouts=[bgl])
        stage = {"module": module, "entry_point": entry_point}
        pipeline = device.create_compute_pipeline(layout=layout, compute=stage, label=label)
    _pipelines[key] = (pipeline, bgl, device)  # holding the device keeps id(device) unique
    return pipeline, bgl
