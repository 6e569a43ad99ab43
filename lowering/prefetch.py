"""L2 prefetch in narrow dispatches: idle multiprocessors pull the next dispatches' weights into cache.

An attention dispatch of a small batch has few workgroups (SmolLM2's decode step: 9, one per query
head; its 128-token prefill: 72) on a GPU of a hundred or more multiprocessors, while the products
after it read their weights from device memory. The H200 measurements behind this pass
(``bench/prefetch.py``, ``bench/results/prefetch_h200/``, GPU time): with every layer's weights made
the first layer's, so that they come from the L2 cache, the plans ran 6.5% (decode, f32), 8.5%
(decode, Q4_1 blocks) and 2.2% (prefill) faster; with this pass they run 2.4%, 2.7% and 1.6% faster
than without it.

The pass, run by :func:`~.plan.lower` after the dispatches are built: a dispatch is *narrow* when
its kernel has the hook (the line ``PREFETCH_HOOK`` in its WGSL, in the workgroup branch that
returns at once because its linear workgroup index is at or past ``p.total``) and it launches
fewer than :data:`NARROW_WORKGROUPS` workgroups. Its *window* is the dispatches after it up to the
next narrow one. The weights read in the window (parameters, packed parameters and constants
that no dispatch writes and that are not state, each of at least :data:`MIN_BYTES`) are taken in
order of first use while they fit :data:`MAX_BYTES` together and the device's storage bindings
per shader stage. The dispatch then launches :data:`PREFETCH_WORKGROUPS` more workgroups, which
read those buffers once, a vec4 of u32 per invocation and step, and binds them read-only after its
uniform (``Dispatch.prefetch``). Their loads are kept by a store into the output that runs only
when the number of prefetching workgroups is zero, which cannot be while one runs: the results
are those of the dispatch without the pass, bit for bit.

WebGPU does not say how large the device's L2 cache is or how many multiprocessors it has; the
constants are the H200's (50 MB of L2, 132 multiprocessors). ``lower(..., prefetch=False)`` leaves
the pass out, and ``eggfuse.pipeline.lower_for`` leaves it out on a CPU adapter (lavapipe), where
there is no L2 cache to warm and the reads only cost time (decode of a 4-layer SmolLM2 slice took
18% longer with them there).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from .limits import split_grid

#: The line a kernel puts in its branch for workgroups at or past ``p.total`` (``wg``: the linear
#: workgroup index, ``li``: the local invocation index, ``nwg``: the grid, ``WG``: the workgroup
#: size; ``store_out(base, c, v)`` writes a vec4 of the output) to take prefetching workgroups
#: there; shaders/attention.wgsl, attention_lanes.wgsl and attention_cached.wgsl have it.
PREFETCH_HOOK = "        // PREFETCH_HOOK (lowering/prefetch.py)"
#: A dispatch of fewer workgroups than this is narrow (an H100/H200 has 132 multiprocessors).
NARROW_WORKGROUPS = 128
#: Workgroups (of the kernel's size, 256 or fewer invocations) a narrow dispatch gets to prefetch with;
#: 132, 264 and 528 extra workgroups measured within 1% of each other on the H200.
PREFETCH_WORKGROUPS = 128
#: Most bytes one narrow dispatch prefetches: under a third of an H100/H200's 50 MB L2, and more
#: than a SmolLM2-135M layer's f32 weights (14.1 MB).
MAX_BYTES = 16 << 20
#: Smaller buffers (norm weights, biases) are not worth a binding.
MIN_BYTES = 64 << 10

_FUNCTION = """
{decls}

// Workgroup g of the `groups` prefetching ones: every invocation reads vec4s of each buffer a stride
// of groups * WG apart, four at a time so that they are in flight together; the xor of them all
// keeps the loads, being stored only when groups is 0, which cannot be while g < groups.
fn prefetch_l2(g: u32, groups: u32, li: u32) {{
    let stride = groups * WG;
    var acc = vec4<u32>();
{loops}
    if (groups == 0u) {{
        store_out(0u, 0u, bitcast<vec4<f32>>(acc));
    }}
}}
"""

_LOOP = """    for (var i = g * WG + li; i < arrayLength(&{name}); i = i + 4u * stride) {{
        let last = arrayLength(&{name}) - 1u;
        acc = acc ^ {name}[i] ^ {name}[min(i + stride, last)] ^ {name}[min(i + 2u * stride, last)]
            ^ {name}[min(i + 3u * stride, last)];
    }}
"""


def is_narrow(d) -> bool:
    """Whether dispatch ``d`` has the hook and launches fewer than NARROW_WORKGROUPS workgroups."""
    return PREFETCH_HOOK in d.source and math.prod(d.workgroups) < NARROW_WORKGROUPS


def weights_ahead(buffers: Sequence, dispatches: Sequence, written: set[int], state: frozenset[str],
                  room: int) -> tuple[int, ...]:
    """The buffers of read-only weights (see the module docstring) that ``dispatches`` bind as
    inputs, in order of first use, at most ``room`` of them and MAX_BYTES together (one that
    would pass MAX_BYTES is left out and later ones still taken)."""
    out: list[int] = []
    total = 0
    for d in dispatches:
        for i in d.inputs:
            b = buffers[i]
            if (i in out or i in written or b.kind not in ("parameter", "derived", "constant")
                    or b.name in state or b.size_bytes < MIN_BYTES or total + b.size_bytes > MAX_BYTES):
                continue
            if len(out) == room:
                return tuple(out)
            out.append(i)
            total += b.size_bytes
    return tuple(out)


def with_prefetch(d, prefetch: tuple[int, ...], grid: tuple[int, int, int]):
    """Dispatch ``d`` (narrow) on ``grid`` (its workgroups and PREFETCH_WORKGROUPS more), the extra
    ones reading ``prefetch`` (buffer indices, bound read-only after its uniform)."""
    first = len(d.bindings) + (1 if d.params else 0)
    names = [f"prefetch{j}" for j in range(len(prefetch))]
    decls = "\n".join(f"@group(0) @binding({first + j}) var<storage, read> {name}: array<vec4<u32>>;"
                      for j, name in enumerate(names))
    function = _FUNCTION.format(decls=decls, loops="".join(_LOOP.format(name=name) for name in names))
    call = "        prefetch_l2(wg - p.total, nwg.x * nwg.y * nwg.z - p.total, li);"
    source = d.source.replace(PREFETCH_HOOK, call) + function
    base, sg = (d.kernel[:-3], "+sg") if d.kernel.endswith("+sg") else (d.kernel, "")  # "+sg" stays last
    return dataclasses.replace(d, source=source, workgroups=grid, prefetch=prefetch, kernel=base + "+prefetch" + sg)


def add_prefetch(buffers: Sequence, dispatches: list, state: frozenset[str], limits: Mapping[str, int],
                 written: set[int]) -> list:
    """``dispatches`` with every narrow one prefetching the weights of its window (module docstring); ``written``:
    the buffers they write (``plan.written_buffers``), never prefetched."""
    narrow = [k for k, d in enumerate(dispatches) if is_narrow(d)]
    out = list(dispatches)
    for n, k in enumerate(narrow):
        d = dispatches[k]
        window = dispatches[k + 1:narrow[n + 1] if n + 1 < len(narrow) else len(dispatches)]
        room = limits["max-storage-buffers-per-shader-stage"] - len(d.bindings)
        prefetch = weights_ahead(buffers, window, written, state, room)
        grid = split_grid(math.prod(d.workgroups) + PREFETCH_WORKGROUPS, limits["max-compute-workgroups-per-dimension"])
        if prefetch and grid is not None:
            out[k] = with_prefetch(d, prefetch, grid)
    return out
