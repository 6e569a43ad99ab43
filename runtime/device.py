"""The wgpu device: one per process, requested with the adapter's own limits."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import wgpu

from ..ir.errors import DeviceError
from .bindings import warm_types

log = logging.getLogger("eggfuse.runtime")

#: Limits requested at the adapter's maximum (instead of the WebGPU defaults), so that
#: weights of real models fit in single bindings and fused kernels may bind more buffers.
REQUESTED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
)

#: Optional features asked for when the adapter has them: GPU timestamps for profiling
#: (Session.profile), subgroup operations for reductions.
REQUESTED_FEATURES = ("timestamp-query", "subgroup")

#: wgpu-native's feature that lets a storage buffer be mapped for writing (MAP_WRITE with any
#: usage). Asked for on a CPU adapter (lavapipe), where every buffer is host memory anyway: a
#: session writes its parameters into their buffers' mappings, one host copy, instead of
#: queue.write_buffer's copy into a staging buffer and the device's copy out of it.
MAPPABLE = "mappable-primary-buffers"

_device: wgpu.GPUDevice | None = None
_lock = threading.Lock()


def get_device() -> wgpu.GPUDevice:
    """The process-wide wgpu device (created on first call, then cached).

    Asks for a high-performance adapter and requests its maxima for
    :data:`REQUESTED_LIMITS`; logs the adapter at INFO. Raises DeviceError when no
    adapter or device is available.
    """
    global _device
    with _lock:
        if _device is not None:
            return _device
        # Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid" on every start without one
        os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
        warm_types()  # the C types of wgpu-py's calls, parsed in one pass (runtime/bindings.py)
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as e:  # noqa: BLE001 - wgpu-native reports a missing driver in many ways
            raise DeviceError(_NO_ADAPTER + f" (wgpu said: {e})") from None
        if adapter is None:
            raise DeviceError(_NO_ADAPTER)
        required = {key: adapter.limits[key] for key in REQUESTED_LIMITS if key in adapter.limits}
        features = [f for f in REQUESTED_FEATURES if f in adapter.features]
        if adapter.info.get("adapter_type") == "CPU" and MAPPABLE in adapter.features:
            features.append(MAPPABLE)  # uploads written straight into buffers (mapped_uploads)
        try:
            _device = adapter.request_device_sync(required_limits=required, required_features=features)
        except Exception as e:  # noqa: BLE001
            raise DeviceError(f"the adapter {_describe(adapter.info)} refused a device with limits "
                              f"{required}: {e}") from None
        log.info("wgpu adapter: %s", _describe(adapter.info))
        return _device


_NO_ADAPTER = ("no wgpu adapter found: install a Vulkan driver; without a GPU, Mesa's CPU driver "
               "lavapipe works (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)")


def _describe(info) -> str:
    name = info.get("device") or info.get("vendor") or "unknown adapter"
    return f"{name} / {info.get('backend_type', '?')} / {info.get('adapter_type', '?')}"


def mapped_uploads(device: wgpu.GPUDevice) -> bool:
    """Whether sessions on ``device`` write uploads into buffers created mapped (the device has
    :data:`MAPPABLE`, requested on CPU adapters only; ``EGGFUSE_MAPPED_UPLOADS=0`` turns it off)."""
    return MAPPABLE in device.features and os.environ.get("EGGFUSE_MAPPED_UPLOADS", "1") != "0"


def adapter_description(device: wgpu.GPUDevice) -> str:
    """The device's adapter as 'name / backend / type', e.g.
    'llvmpipe (LLVM 15.0.6, 256 bits) / Vulkan / CPU'."""
    return _describe(device.adapter.info)


@contextmanager
def device_errors(what: str) -> Iterator[None]:
    """Re-raise any wgpu error inside the block as DeviceError prefixed by ``what``.

    A safety net: inputs are validated before wgpu sees them, so reaching it is a bug in
    a kernel or in the lowering, or a lost device.
    """
    try:
        yield
    except (wgpu.GPUError, wgpu.GPUPipelineError) as e:
        raise device_error(what, e) from e


def device_error(what: str, error: Exception) -> DeviceError:
    """The DeviceError that :func:`device_errors` raises for wgpu ``error`` met while ``what``
    (for a hot path that catches wgpu's errors itself)."""
    return DeviceError(f"{what}: {type(error).__name__}: {error}")


#: Probe of the subgroup layout that shaders/subgroup_reduce.wgsl assumes: each invocation
#: of four 256-invocation workgroups writes 1 when its subgroup size n (subgroupAdd(1u)) is a
#: power of two >= 4, its subgroup holds invocations li - li % n .. + n - 1 (subgroupMin
#: and subgroupMax of the local index) and its subgroup_invocation_id is li % n.
_SUBGROUP_PROBE = """
@group(0) @binding(0) var<storage, read_write> ok: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) sid: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let n = subgroupAdd(1u);
    let lo = subgroupMin(li);
    let hi = subgroupMax(li);
    let first = li - li % n;
    let good = n >= 4u && (n & (n - 1u)) == 0u && lo == first && hi == first + n - 1u && sid == li % n;
    ok[wid.x * 256u + li] = select(0u, 1u, good);
}
"""
_subgroups_usable: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> probe result


def subgroup_reductions_usable(device: wgpu.GPUDevice) -> bool:
    """Whether lowering may give ``device`` reductions with subgroup operations
    (lowering.lower(..., subgroups=True)): the device has the 'subgroup' feature and a probe
    kernel, run once per device, finds the full, contiguous power-of-two subgroups that
    shaders/subgroup_reduce.wgsl assumes in 256-invocation workgroups. Setting the
    environment variable EGGFUSE_SUBGROUPS=0 turns them off. Never raises: a device where
    the probe fails to compile or run gets False.
    """
    if os.environ.get("EGGFUSE_SUBGROUPS", "1") == "0" or "subgroup" not in device.features:
        return False
    key = device
    if key not in _subgroups_usable:
        try:
            module = device.create_shader_module(code=_SUBGROUP_PROBE)
            pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
            out = device.create_buffer(size=4096, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
            group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                             entries=[{"binding": 0, "resource": {"buffer": out}}])
            encoder = device.create_command_encoder()
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(4)
            compute.end()
            device.queue.submit([encoder.finish()])
            _subgroups_usable[key] = bool(np.frombuffer(device.queue.read_buffer(out), np.uint32).all())
        except Exception as e:  # noqa: BLE001 - any failure means: do not use them
            log.info("subgroup probe failed (%s); reductions use workgroup memory", e)
            _subgroups_usable[key] = False
    return _subgroups_usable[key]
