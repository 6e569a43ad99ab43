"""Device limits the lowering respects, by their WebGPU names, and the workgroup-grid split.

Limits are given as a dict keyed like wgpu-py's ``device.limits`` (``"max-buffer-size"``);
error messages use the WebGPU spec's camelCase names (``maxBufferSize``) verbatim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: WebGPU spec default limits (https://www.w3.org/TR/webgpu/#limits), the values every
#: adapter guarantees. Only the limits a plan can exceed or use are listed; every kernel stays
#: within the default of invocations per workgroup (256), and within the workgroup storage
#: given here (attention.wgsl's key tiles grow with it, attention_lanes.wgsl's rows and keys per tile up to its
#: defaults; every other kernel stays within 16 KiB).
DEFAULT_LIMITS: dict[str, int] = {
    "max-compute-workgroup-storage-size": 16_384,
    "max-storage-buffers-per-shader-stage": 8,
    "max-storage-buffer-binding-size": 134_217_728,
    "max-compute-workgroups-per-dimension": 65_535,
    "max-buffer-size": 268_435_456,
    "max-uniform-buffer-binding-size": 65_536,
    "min-storage-buffer-offset-alignment": 256,
}


def limit_name(key: str) -> str:
    """The spec name of a wgpu-py limit key: ``max-buffer-size`` -> ``maxBufferSize``."""
    head, *rest = key.split("-")
    return head + "".join(part.capitalize() for part in rest)


def resolve_limits(limits: Mapping[str, int] | None) -> dict[str, int]:
    """The limits a plan is lowered against: ``DEFAULT_LIMITS`` overridden by ``limits``.

    Keys outside ``DEFAULT_LIMITS`` (a full ``device.limits``) are ignored.
    """
    out = dict(DEFAULT_LIMITS)
    for key in DEFAULT_LIMITS:
        if limits is not None and limits.get(key) is not None:
            out[key] = int(limits[key])
    return out


def split_grid(groups: int, max_per_dim: int) -> tuple[int, int, int] | None:
    """A grid (x, y, z) with x*y*z >= ``groups`` and every side <= ``max_per_dim``.

    Kernels read their linear workgroup index back as x + nx * (y + ny * z) and return
    early past ``groups``. Returns None when even a 3-D grid does not fit.
    """
    if groups <= max_per_dim:
        return (max(groups, 1), 1, 1)
    if groups <= max_per_dim**2:
        y = math.ceil(groups / max_per_dim)
        return (math.ceil(groups / y), y, 1)
    if groups <= max_per_dim**3:
        z = math.ceil(groups / max_per_dim**2)
        rest = math.ceil(groups / z)
        y = math.ceil(rest / max_per_dim)
        return (math.ceil(rest / y), y, z)
    return None
