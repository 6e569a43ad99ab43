"""What an op's kernel builder returns: a description of one dispatch, rendered by lowering.

A builder (``OpSpec.kernel``) is called as ``kernel(node, ins, target)`` with the node, its
input types and the :class:`Target` (the device's limits), and returns a :class:`Kernel` (or
a list of them, run in order, for an op that needs several dispatches). The kernel's WGSL
file under ``shaders/`` holds only its body: lowering generates the storage bindings (from
``bindings``, by default the node's inputs in order, then the output) and the uniform
``struct Params`` with its binding (from ``params``), so no binding or struct is written twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Invocations per workgroup of the elementwise kernels (one element each).
ELEMENTWISE_WG = 256

#: In :attr:`Kernel.inputs`: the node's scratch buffer, which an earlier dispatch of the node
#: wrote (:attr:`Kernel.scratch`), instead of one of its inputs.
SCRATCH = -1

#: In :attr:`Kernel.inputs`: the node's counters (:attr:`Kernel.counters`), u32s that are zero before and
#: after each of its dispatches, bound read_write as ``array<atomic<u32>>``.
COUNTERS = -2

@dataclass(frozen=True)
class Window:
    """In :attr:`Kernel.inputs`: bytes ``[offset, offset + size)`` of the node's input ``input``, bound as a
    binding of their own (a table larger than the device binds at once, read through several windows:
    ``maxStorageBufferBindingSize``). ``offset`` must be a multiple of the device's
    ``minStorageBufferOffsetAlignment``; the input must be a weight, uploaded once: a parameter, a constant or one
    packed from parameters (lowering raises DeviceLimitError for another). Windows are bound read-only; dispatches
    that ask for the same bytes of one input share one window buffer."""

    input: int
    offset: int
    size: int


def windows(total: int, elem: int, limits: Mapping[str, int]) -> list[tuple[int, int]]:
    """``(offset, size)`` in bytes of the fewest windows that cover ``total`` bytes of ``elem``-byte elements
    within the device's binding limit (``max-storage-buffer-binding-size``): every window but the last as large
    as a multiple of both ``elem`` and ``min-storage-buffer-offset-alignment`` allows; one window when
    ``total`` fits. Raises LoweringError where the limit holds not even one aligned step."""
    limit = int(limits["max-storage-buffer-binding-size"])
    if total <= limit:
        return [(0, total)]
    step = math.lcm(elem, int(limits["min-storage-buffer-offset-alignment"]))
    part = limit // step * step
    if part == 0:
        from .errors import DeviceLimitError

        raise DeviceLimitError(f"no window of a table of {total} bytes fits: maxStorageBufferBindingSize = {limit} "
                               f"bytes is less than the windows' step of {step} bytes ({elem}-byte elements at "
                               f"minStorageBufferOffsetAlignment = {limits['min-storage-buffer-offset-alignment']}); "
                               f"lower for the device's own limits")
    return [(off, min(part, total - off)) for off in range(0, total, part)]


def windowed_reader(name: str, elem: str, index: int, size_bytes: int,
                    limits: Mapping[str, int]) -> tuple[str, tuple[Buffer, ...], tuple[int | Window, ...]]:
    """How a kernel reads input ``index`` (``size_bytes`` of 4-byte ``elem`` elements) as one binding or, past the
    binding limit, through :func:`windows` of it: the WGSL function ``read_<name>(e: u32) -> elem`` (element ``e``
    of the input), the storage bindings (``name``, or ``name0``, ``name1``, ...) and their :attr:`Kernel.inputs`
    entries (``index``, or one :class:`Window` each)."""
    parts = windows(max(4, size_bytes), 4, limits)
    if len(parts) == 1:
        return (f"fn read_{name}(e: u32) -> {elem} {{\n    return {name}[e];\n}}", (Buffer(name, elem),), (index,))
    per = parts[0][1] // 4  # elements of every window but the last
    lines = [f"fn read_{name}(e: u32) -> {elem} {{", f"    let at = e % {per}u;", f"    switch (e / {per}u) {{"]
    lines += [f"        case {w}u: {{ return {name}{w}[at]; }}" for w in range(len(parts) - 1)]
    lines += [f"        default: {{ return {name}{len(parts) - 1}[at]; }}", "    }", "}"]
    return ("\n".join(lines), tuple(Buffer(f"{name}{w}", elem) for w in range(len(parts))),
            tuple(Window(index, off, size) for off, size in parts))


#: WGSL types a uniform field may have: scalars, vec4s and arrays of vec4 (uniform arrays
#: need a 16-byte element stride).
PARAM_TYPES = ("u32", "i32", "f32", "vec4<u32>", "vec4<i32>", "vec4<f32>")


@dataclass(frozen=True)
class Buffer:
    """One storage binding: the WGSL variable ``name`` of type ``array<elem>``, read-only
    unless ``write`` (then ``read_write``)."""

    name: str
    elem: str = "f32"
    write: bool = False


@dataclass(frozen=True)
class Include:
    """A slot value: the text of ``shaders/<file>`` (which includes nothing itself), for a
    kernel whose variants fill hook functions from a file of their own."""

    file: str


@dataclass(frozen=True)
class Kernel:
    """One dispatch of ``entry_point`` in ``shaders/<body>`` over ``groups`` workgroups.

    - ``name``: the pipeline's name in plans, profiles and traces.
    - ``params``: the uniform ``Params`` fields in order, as ``(name, wgsl type, value)``;
      types are :data:`PARAM_TYPES` or ``array<vec4<f32|u32|i32>, N>`` (value: 4N numbers).
    - ``slots``: ``{{SLOT}}`` markers of the body filled with these strings (or with the text
      of a file, :class:`Include`).
    - ``bindings``: the storage bindings in binding order (None: one per bound input, named
      as the op's inputs, typed ``f32``/``u32`` by the input's dtype, then the output ``out``,
      or for an in-place op the written input, ``read_write``). An input's binding is
      ``read_write`` (``write=True``) only for an input the op updates (``OpSpec.updates``).
    - ``inputs``: which of the node's inputs this dispatch binds, in order (None: all but
      the one an in-place op writes); an op split into several dispatches binds a part of
      its inputs in each, each writing its part of the same output buffer or (an op with
      ``OpSpec.updates``) of the inputs it updates; :data:`SCRATCH` names the node's
      scratch buffer, a :class:`Window` a byte range of an input (a binding each).
    - ``scratch``: when positive, this dispatch writes the node's scratch buffer of that many
      f32 elements instead of its output (an intermediate of the op alone, such as the partial
      sums of a split-K matmul); a later dispatch of the node reads it (:data:`SCRATCH` in its
      ``inputs``). Every dispatch of a node that gives it gives the same size. A dispatch that also
      names :data:`SCRATCH` in its ``inputs``, bound ``write=True``, writes its output and both writes
      and reads the scratch buffer (a split-K matmul whose last K range to finish a tile adds the
      others' partial sums: :mod:`.ops.matmul_kernel`).
    - ``counters``: when positive, the node's counter buffer holds that many u32s (:data:`COUNTERS` in
      ``inputs``): zero when the session creates it and kept by it across runs, never shared with another
      value; each dispatch that binds it must leave it zero again.
    - ``runtime_checks``: compile this kernel with naga's runtime checks even in a plan lowered
      without them (``lower(..., runtime_checks=False)``), for a kernel measured faster with them
      (the tiled matmul's 128-row tiles: :mod:`.ops.matmul_kernel`).
    - ``loop_iterations``: the most loop iterations one invocation runs, all its loops together
      (:func:`nested_iterations`), where its loops do not stride through its data (a direct
      convolution's taps and channels, a pooling window, TopK's pass over a line): what
      ``lowering.plan.check_cpu_loops`` checks against lavapipe's limit; 0 where the elements of its
      largest binding over its invocations bound them.
    - ``constant_params``: whether the kernel may read ``params`` as a WGSL module constant rather than
      from the uniform (which stays bound), its pipeline then serving these values only; lowering does so
      where ``lower(..., constant_params=True)`` and every field is a u32, i32 or finite f32. False for a
      kernel measured slower so (the tiled matmul's products of N >= 8192, the LM heads, and its 128-row
      tiles, the GEMV of 4 rows and 16 columns a workgroup: :mod:`.ops.matmul_kernel` ``constant_shape``).
    """

    name: str
    body: str
    groups: int
    params: tuple[tuple[str, str, Any], ...] = ()
    slots: Mapping[str, object] = field(default_factory=dict)
    bindings: tuple[Buffer, ...] | None = None
    inputs: tuple[int | Window, ...] | None = None
    entry_point: str = "main"
    scratch: int = 0
    counters: int = 0
    runtime_checks: bool = False
    constant_params: bool = True
    loop_iterations: int = 0


@dataclass(frozen=True)
class Target:
    """What a kernel builder may know about the device: its limits (wgpu-py keys, WebGPU
    defaults filled in), whether reductions may use subgroup operations, and ``device_barriers``: whether
    ``storageBarrier`` orders a workgroup's atomics before and after another workgroup's (naga gives it device
    scope in SPIR-V, HLSL and GLSL, but a threadgroup barrier in MSL: False on Metal), which a kernel whose
    workgroups pass values to one another needs (the split-K matmul in one dispatch, ``ops.matmul_kernel``)."""

    limits: Mapping[str, int]
    subgroups: bool = False
    device_barriers: bool = True


def atomic_quad_planes(binding: str, plane: str, put: str, get: str, unit: str = "at") -> str:
    """WGSL functions ``put(at: u32, v: vec4<f32>)`` and ``get(at: u32) -> vec4<f32>`` storing and loading the quad
    of unit ``unit`` (an expression of ``at``) as u32 atomics of ``binding`` (``array<atomic<u32>>``), float e of
    it in plane e (``plane``: an expression, the units a plane holds), so that neighbouring invocations' quads are
    neighbouring u32s of each plane. For values one workgroup passes to another within a dispatch (naga declares
    storage buffers without the Coherent decoration: only atomics are sure to be seen across its device-scope
    ``storageBarrier``): the split-K matmul's partial sums (``ops.matmul_kernel.last_split``), TokenPool's chunk
    sums (``ops.token_pool``)."""
    return f"""fn {put}(at: u32, v: vec4<f32>) {{
    let plane = {plane};
    let q = {unit};
    atomicStore(&{binding}[q], bitcast<u32>(v.x));
    atomicStore(&{binding}[plane + q], bitcast<u32>(v.y));
    atomicStore(&{binding}[2u * plane + q], bitcast<u32>(v.z));
    atomicStore(&{binding}[3u * plane + q], bitcast<u32>(v.w));
}}

fn {get}(at: u32) -> vec4<f32> {{
    let plane = {plane};
    let q = {unit};
    return vec4<f32>(bitcast<f32>(atomicLoad(&{binding}[q])), bitcast<f32>(atomicLoad(&{binding}[plane + q])),
                     bitcast<f32>(atomicLoad(&{binding}[2u * plane + q])),
                     bitcast<f32>(atomicLoad(&{binding}[3u * plane + q])));
}}"""


#: Loop iterations of one workgroup reduction of shaders/reduce.wgsl as llvmpipe counts them (its 8 halving steps
#: and their barriers), for :attr:`Kernel.loop_iterations`: fitted to where cross_entropy.wgsl's loss went wrong
#: on lavapipe, between 480 and 490 rows of 10 classes (4 reductions and 3 loop steps a row: 65,535 / 485 = 135).
REDUCTION_ITERATIONS = 33


def nested_iterations(*counts: int) -> int:
    """Iterations of loops nested in the order given (outermost first) of ``counts`` steps each, all
    loops together: ``cin + cin * kh + cin * kh * kw`` for (cin, kh, kw) (:attr:`Kernel.loop_iterations`)."""
    total, runs = 0, 1
    for c in counts:
        runs *= c
        total += runs
    return total


def elementwise_groups(n: int) -> int:
    """Workgroups of an elementwise kernel over ``n`` elements (:data:`ELEMENTWISE_WG` each)."""
    return max(1, math.ceil(n / ELEMENTWISE_WG))


def u32s(prefix: str, values) -> tuple[tuple[str, str, Any], ...]:
    """Uniform fields ``prefix0..`` as u32, one per value (a small helper for shape vectors)."""
    return tuple((f"{prefix}{i}", "u32", int(v)) for i, v in enumerate(values))


__all__ = ["COUNTERS", "ELEMENTWISE_WG", "PARAM_TYPES", "REDUCTION_ITERATIONS", "Buffer", "Include", "Kernel",
           "Target", "Window", "elementwise_groups", "nested_iterations", "u32s", "windowed_reader", "windows"]
