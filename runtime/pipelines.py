"""Compute pipelines with explicit bind group layouts, cached per process (the least recently used
beyond :data:`CACHE_SIZE` dropped).

The layout follows the dispatch convention of :class:`~eggfuse.lowering.Dispatch`:
read-only storage at bindings 0..n-2 (read_write at the dispatch's ``writable`` positions),
the read_write output at n-1, the uniform (if any) at n, then the buffers the dispatch
prefetches, read-only (``Dispatch.prefetch``). An explicit layout keeps every
binding, where ``layout="auto"`` would drop bindings the shader does not use and bind group
creation would then fail.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict

import wgpu

from ..lowering.wgsl import uniform_form
from .device import device_errors

try:  # wgpu-native's own entry point for modules without runtime checks (wgpu-py 0.32 exposes it through cffi)
    from wgpu.backends.wgpu_native._api import GPUShaderModule, ffi, lib, libf, new_struct_p, to_c_string_view

    _TRUSTED = hasattr(lib, "wgpuDeviceCreateShaderModuleTrusted")
except ImportError:
    _TRUSTED = False

log = logging.getLogger("eggfuse.runtime")
_warned = False

#: Most pipelines, and most shader modules, the process-wide caches keep: past it the least recently used
#: entry is dropped. A session holds the pipelines it uses, so dropping one from the cache ends nothing
#: that runs; a later session of the same kernel compiles it again. Without a bound, a process that
#: compiles many graphs (sweeps over shapes, rule sets or cost models) would keep every pipeline, and
#: every device it made, alive until it exits.
CACHE_SIZE = 2048

_modules: OrderedDict[tuple[int, str, bool], wgpu.GPUShaderModule] = OrderedDict()
_pipelines: OrderedDict[tuple, tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout, wgpu.GPUDevice]] = OrderedDict()
_lock = threading.Lock()  # sessions may be created on several threads


def _cached(cache: OrderedDict, key):
    # the entry of ``key`` (None if absent), made the most recently used
    with _lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
        return hit


def _keep(cache: OrderedDict, key, value) -> None:
    # store ``value`` as the most recently used entry, dropping the least recently used past CACHE_SIZE
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > max(CACHE_SIZE, 1):
            cache.popitem(last=False)


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


def create_module(device: wgpu.GPUDevice, source: str, label: str = "", checks: bool = True) -> wgpu.GPUShaderModule:
    """The shader module of WGSL ``source``. With ``checks`` (the WebGPU default) naga clamps every
    dynamic index into workgroup and function arrays, bounds every loop with a counter of its own and
    checks buffer accesses the backend does not check itself; without them the module is made by
    wgpu-native's ``wgpuDeviceCreateShaderModuleTrusted`` with no runtime checks
    (``WGPUShaderRuntimeChecks_None``): buffer accesses stay checked only where the backend checks them
    (Vulkan's robustBufferAccess), so the kernel's own indices must be in bounds and its loops finite,
    as eggfuse's kernels are by construction (each bounds its loops by the uniform's sizes and checks
    every global index, but where the tiled matmul's tiles cover its matrices: ``matmul_kernel.inside_form``).
    Where wgpu-py does not expose that entry point the module keeps the checks, and
    a warning says so once. Raises a wgpu GPUError (DeviceError through the caller's ``device_errors``)
    for WGSL that does not compile, as ``create_shader_module`` does."""
    global _warned
    if not checks and not _TRUSTED and not _warned:
        _warned = True
        log.warning("this wgpu-py does not expose wgpuDeviceCreateShaderModuleTrusted: kernels keep naga's runtime "
                    "checks (results are the same; plans run slower)")
    if checks or not _TRUSTED:
        return device.create_shader_module(code=source, label=label)
    wgsl = new_struct_p("WGPUShaderSourceWGSL *", code=to_c_string_view(source))
    wgsl[0].chain.next = ffi.NULL
    wgsl[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    descriptor = new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", wgsl),
                              label=to_c_string_view(label))
    handle = libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor, lib.WGPUShaderRuntimeChecks_None)
    if handle == ffi.NULL:  # libf raised already for invalid WGSL; a null handle otherwise
        raise wgpu.GPUValidationError(f"shader module creation failed for {label}")
    return GPUShaderModule(label, handle, device)


def unchecked_modules_allowed(device: wgpu.GPUDevice) -> bool:
    """Whether the runtime gives a dispatch lowered without runtime checks a module without them
    (:func:`create_module`): on the Vulkan backend only, whose robustBufferAccess keeps buffer
    accesses checked."""
    return device.adapter.info.get("backend_type") == "Vulkan"


def get_pipeline(
    device: wgpu.GPUDevice, source: str, entry_point: str, num_storage: int, has_uniform: bool,
    label: str = "", writable: tuple[int, ...] = (), prefetch: int = 0, checks: bool = True,
) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]:
    """The pipeline of ``entry_point`` in WGSL ``source`` and its bind group layout
    (``writable``: the storage bindings besides the last that are read_write; ``prefetch``: the
    read-only storage bindings after the uniform; ``checks``: naga's runtime checks, :func:`create_module`).

    Cached by (device, source hash, entry point, binding signature), at most CACHE_SIZE of them (the least
    recently used dropped first). Raises DeviceError
    if the shader does not compile (a kernel bug), naming ``label``.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()
    key = (id(device), digest, entry_point, num_storage, has_uniform, tuple(writable), prefetch, checks)
    hit = _cached(_pipelines, key)
    if hit is not None:
        return hit[0], hit[1]
    with device_errors(f"compiling kernel for {label or entry_point}"):
        bgl = device.create_bind_group_layout(entries=layout_entries(num_storage, has_uniform, writable, prefetch))
        layout = device.create_pipeline_layout(bind_group_layouts=[bgl])
        try:
            pipeline = _compiled(device, source, digest, entry_point, label, checks, layout)
        except (wgpu.GPUError, wgpu.GPUPipelineError):
            # a kernel rendered with its parameters as a WGSL constant whose constant expressions do not evaluate
            # (lowering.wgsl.uniform_form: a division by a size of 0, say) is compiled reading them from the uniform
            fallback = uniform_form(source)
            if fallback is None:
                raise
            log.info("%s: its parameters as constants do not compile; it reads them from the uniform", label)
            pipeline = _compiled(device, fallback, hashlib.sha256(fallback.encode()).hexdigest(), entry_point, label,
                                 checks, layout)
    _keep(_pipelines, key, (pipeline, bgl, device))  # holding the device keeps id(device) unique
    return pipeline, bgl


def _compiled(device: wgpu.GPUDevice, source: str, digest: str, entry_point: str, label: str, checks: bool,
              layout) -> wgpu.GPUComputePipeline:
    # the pipeline of ``source`` (its module cached per process by digest)
    module = _cached(_modules, (id(device), digest, checks))
    if module is None:
        module = create_module(device, source, label, checks)
        _keep(_modules, (id(device), digest, checks), module)
    return device.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": entry_point},
                                          label=label)
