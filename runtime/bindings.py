"""wgpu-py's C types parsed in one pass, so that a process does not pay pycparser once per type.

wgpu-py's wgpu-native backend names C types as strings (``ffi.new("WGPUBindGroupEntry[]",
n)``), and cffi parses each string with pycparser on its first use in a process
(``cffi.FFI._typeof``). Each parse re-reads a declaration of every typedef of wgpu-native's
header (about 440), so each of the ~60 types eggfuse's calls use costs 5-15 ms on this
machine's lavapipe set-up: 0.5 s per process, spread over getting the device, the subgroup
probe and binding the first session. :func:`warm_types` parses all of :data:`TYPES` in one
pycparser call (about 15 ms) and stores the results where cffi looks first
(``ffi._parsed_types``), exactly as ``FFI._typeof_locked`` does for one type.

It uses cffi internals (``FFI._parser``, ``_parsed_types``, ``_get_cached_btype``,
``_lock``), so it only ever speeds things up: a type it leaves out, or any failure (another
cffi, another backend), leaves cffi to parse as before. ``tests/gpu/test_bindings.py`` checks
that the parsed types equal cffi's own and that :data:`TYPES` covers what eggfuse uses.
"""

from __future__ import annotations

import logging

log = logging.getLogger("eggfuse.runtime")

#: The type strings wgpu-py 0.32's wgpu-native backend parses for what eggfuse does (getting a
#: device, compiling, binding and running sessions, reading back, timestamp queries), spelt
#: exactly as wgpu-py spells them (cffi caches by the string).
TYPES = (
    "void(WGPULogLevel, WGPUStringView, void *)",
    "WGPUStringView *",
    "WGPURequestAdapterOptions *",
    "void(WGPURequestAdapterStatus, WGPUAdapter, WGPUStringView, void *, void *)",
    "WGPURequestAdapterCallbackInfo *",
    "WGPUInstanceDescriptor *",
    "WGPUAdapterInfo *",
    "WGPUChainedStruct *",
    "WGPUChainedStruct * ",
    "WGPUNativeLimits *",
    "WGPULimits *",
    "char []",
    "WGPUQueueDescriptor *",
    "WGPUDeviceExtras *",
    "void(WGPUDevice const *, WGPUDeviceLostReason, WGPUStringView, void *, void *)",
    "WGPUDeviceLostCallbackInfo *",
    "void(WGPUDevice const *, WGPUErrorType, WGPUStringView, void *, void *)",
    "WGPUUncapturedErrorCallbackInfo *",
    "WGPUFeatureName[]",
    "WGPUDeviceDescriptor *",
    "void(WGPURequestDeviceStatus, WGPUDevice, WGPUStringView, void *, void *)",
    "WGPURequestDeviceCallbackInfo *",
    "WGPUShaderSourceWGSL *",
    "WGPUShaderModuleDescriptor *",
    "WGPUComputeState *",
    "WGPUComputePipelineDescriptor *",
    "WGPUBufferDescriptor *",
    "WGPUBindGroupEntry *",
    "WGPUBindGroupEntry[]",
    "WGPUBindGroupDescriptor *",
    "WGPUBufferBindingLayout *",
    "WGPUBindGroupLayoutEntry *",
    "WGPUBindGroupLayoutEntry[]",
    "WGPUBindGroupLayoutDescriptor *",
    "WGPUBindGroupLayout[]",
    "WGPUPipelineLayoutDescriptor *",
    "WGPUCommandEncoderDescriptor *",
    "WGPUComputePassDescriptor *",
    "WGPUPassTimestampWrites *",
    "WGPUQuerySetDescriptor *",
    "uint32_t []",
    "WGPUCommandBufferDescriptor *",
    "WGPUCommandBuffer[]",
    "void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
    "WGPUBufferMapCallbackInfo *",
    "intptr_t",
    "uintptr_t",
    "void *",
    "uint8_t []",
    "uint8_t *",
)

def warm_types(types=TYPES) -> int:
    """Parse ``types`` (cffi type strings) for wgpu-native's ``ffi`` in one pycparser pass;
    returns how many it added to cffi's cache (0 when all were there, when cffi's internals
    differ, or without the wgpu-native backend). Never raises."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi
    except Exception:  # noqa: BLE001 - another backend: nothing to warm
        return 0
    try:
        return _parse_all(ffi, types)
    except Exception as e:  # noqa: BLE001 - cffi's internals changed: it parses on first use, as without this
        log.debug("cffi types not pre-parsed (%s: %s)", type(e).__name__, e)
        return 0


def _parse_all(ffi, types) -> int:
    # FFI._typeof_locked for many types, with one Parser._parse (its preamble of typedefs is
    # the cost) instead of one each. Types naming no declared typedef are left to cffi.
    parser, cache = ffi._parser, ffi._parsed_types
    declared = {name[8:] for name in parser._declarations if name.startswith("typedef ")}
    todo = [t for t in dict.fromkeys(types) if t not in cache and _known(t, declared)]
    if not todo:
        return 0
    with ffi._lock:
        ast = parser._parse("\n".join(f"void __eggfuse_t{i}(\n{t}\n);" for i, t in enumerate(todo)))[0]
        parsed = []
        for t, decl in zip(todo, ast.ext[-len(todo):], strict=True):
            if decl.name != f"__eggfuse_t{len(parsed)}":
                raise ValueError(f"unexpected declaration {decl.name!r} for {t!r}")
            tp = parser._get_type_and_quals(decl.type.args.params[0].type)[0]
            raw_function = tp.is_raw_function
            if raw_function:
                tp = tp.as_function_pointer()
            parsed.append((t, (ffi._get_cached_btype(tp), raw_function)))
        for t, value in parsed:
            cache.setdefault(t, value)
    return len(parsed)


_BUILTIN = {"void", "char", "const", "int", "unsigned", "signed", "long", "short", "float", "double",
            "intptr_t", "uintptr_t", "uint8_t", "uint32_t", "uint64_t", "int32_t", "int64_t", "size_t"}


def _known(t: str, declared: set[str]) -> bool:
    # Every identifier in the type string is a C builtin or a typedef the header declares.
    words = t.replace("(", " ").replace(")", " ").replace(",", " ").replace("*", " ").replace("[]", " ").split()
    return all(w in _BUILTIN or w in declared for w in words)
