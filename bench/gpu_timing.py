"""Timing of our side for the benchmarks: N back-to-back runs of a session's plan, by wall clock
and by GPU timestamps, and the median / p90 over samples.

Both benchmarks time a peer over the same N back-to-back calls (``bench/models.py``: wall
clock around N calls with one sync at the end, as here; ``bench/matmul.py``: CUDA-graph
replay of N calls, CUDA events). Times are seconds per call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import wgpu


def median_p90(values: Sequence[float]) -> tuple[float, float]:
    """Median and 90th percentile (numpy's linear interpolation) of ``values``."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.median(arr)), float(np.percentile(arr, 90))


#: Seconds of back-to-back runs before any sample (both sides). On the H200 the SM clock falls from
#: 1980 to 345 MHz within about a second of idling (creating a session or compiling a peer leaves
#: the GPU idle for seconds), and comes back some tens of milliseconds after work resumes: decode
#: steps right after two idle seconds took 3.9-4.5 ms against 1.18 ms at full clock
#: (bench/results/clock_ramp_h200/). A fixed count of warm-up runs left some samples in the ramp.
WARMUP_S = 0.5


def wall_per_call(session, feeds: Sequence[dict], samples: int, warmup: int = 3,
                  warmup_s: float = WARMUP_S) -> list[float]:
    """Seconds per run, one value per sample: wall clock around ``len(feeds)`` back-to-back
    ``session.run(feeds[i], read=())`` calls (inputs written, the pre-recorded plan submitted,
    nothing read back) and one wait for the device at the end, divided by the number of calls.
    At least ``warmup`` runs and ``warmup_s`` seconds of runs come first (the second run on is
    pre-recorded in the background; the GPU's clock ramps up: WARMUP_S)."""
    start, i = time.perf_counter(), 0
    while i < warmup or time.perf_counter() - start < warmup_s:
        session.run(feeds[i % len(feeds)], read=())
        if i % len(feeds) == len(feeds) - 1:
            session.wait()
        i += 1
    session.wait()
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        for feed in feeds:
            session.run(feed, read=())
        session.wait()
        out.append((time.perf_counter() - t) / len(feeds))
    return out


def cuda_graph_per_call(torch, step, calls: int, samples: int) -> list[float]:
    """Seconds per ``step()`` on the GPU, one value per sample: ``step`` warmed up three times on a
    side stream (as the torch docs ask before a capture), then ``calls`` of it captured in one
    ``torch.cuda.CUDAGraph``, replayed once, and each sample's replay timed by CUDA events (the
    peer's side of ``bench/matmul.py`` and ``bench/attention.py``: no Python launch overhead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            step()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e-3 / calls)
    return out


def has_timestamps(device) -> bool:
    return "timestamp-query" in device.features


#: Bytes of weights :func:`weight_copies` spreads a plan's reads over by default (``--cold``): four times the
#: 50 MiB L2 cache of an H100 or H200, so that no weight read is still in the L2 cache from its last use.
COLD_BYTES = 4 * 50 * 2**20
#: The most copies :func:`weight_copies` makes: enough for COLD_BYTES of the smallest B of ``bench/matmul.py``'s
#: shapes (475 copies of 576 x 192's 432 KiB). With 64, a first call (bench/results/cold_h100/VARIANTS.md) left the
#: B of 0.8 MiB and less within the L2 cache.
COLD_MAX_COPIES = 1024


def _weights(plan) -> set[int]:
    # the buffer indices the dispatches bind that hold weights no dispatch writes: parameters and parameters packed
    # for the kernels (not state such as a KV cache or an optimiser's moments, nor a weight read through a window)
    bound = {i for d in plan.dispatches for i in d.bindings}
    written = {d.bindings[slot] for d in plan.dispatches for slot in d.writable}
    return ((set(plan.parameters.values()) | set(plan.derived)) & bound) - written


def weight_bytes(session) -> int:
    """Bytes of the buffers the session's dispatches bind that hold weights none of them writes: parameters, and
    parameters packed for the kernels (``plan.parameters``, ``plan.derived``)."""
    return sum(session.plan.buffers[i].size_bytes for i in _weights(session.plan))


def copies_for(session, cold_bytes: int = COLD_BYTES) -> int:
    """How many copies of the session's weights (:func:`weight_copies`) hold ``cold_bytes`` or more: at least 2
    where there are weights, at most COLD_MAX_COPIES; 1 for a plan without weights."""
    size = weight_bytes(session)
    return 1 if size == 0 else max(2, min(COLD_MAX_COPIES, -(-cold_bytes // size)))


def cold_calls(calls: int, copies: int) -> int:
    """The back-to-back calls of a sample that reads ``copies`` copies of the weights in turn: ``calls`` rounded
    down to a multiple of ``copies``, at least ``copies``, so that each sample (on either side: a captured graph
    replays one sequence) ends where the next begins and every copy is read ``copies`` calls after its last use."""
    return max(copies, calls // copies * copies)


def weight_copies(session, copies: int) -> list[list[tuple]]:
    """The session's dispatches (``Session._commands``: pipeline, bind group, grid) ``copies`` times: the first
    the session's own, each other binding copies (made on the device) of the buffers that :func:`weight_bytes`
    counts and the session's own inputs, outputs, scratch and uniform. Runs recorded from the lists in turn read
    their weights from a different place each time, from memory rather than the L2 cache once the copies
    together outgrow it, and still write the same outputs, so they run one after another as the session's own
    runs do (each waits for the last to write). ``bench/matmul.py --cold`` times products so, in a number of calls
    that is a multiple of ``copies`` (:func:`cold_calls`)."""
    from eggfuse.runtime.session import _STORAGE

    plan, device = session.plan, session.device
    held = _weights(plan)
    out = [list(session._commands)]
    for _ in range(copies - 1):
        encoder = device.create_command_encoder()
        copied = {}
        for i in held:
            size = plan.buffers[i].size_bytes
            copied[i] = device.create_buffer(size=size, usage=_STORAGE, label=f"{plan.buffers[i].name} copy")
            encoder.copy_buffer_to_buffer(session._buffers[i], session._offsets[i], copied[i], 0, size)
        device.queue.submit([encoder.finish()])
        out.append(session._rebound(copied))
    return out


def stamped_copies(session, query, resolve, passes: int, per_pass: int, commands: list[list[tuple]] | None = None):
    """A finished command buffer of ``passes`` compute passes, each ``per_pass`` copies of the session's
    plan (0: empty passes), the first pass's beginning stamped into ``query`` entry 0 and the last's end into
    entry 1, both resolved into ``resolve`` (16 bytes). ``commands`` (:func:`weight_copies`): the copies of the
    plan to record in turn instead of the session's own."""
    commands = commands or [session._commands]
    encoder = session.device.create_command_encoder()
    copy = 0
    for p in range(passes):
        stamps = {"query_set": query}
        if p == 0:
            stamps["beginning_of_pass_write_index"] = 0
        if p == passes - 1:
            stamps["end_of_pass_write_index"] = 1
        compute = encoder.begin_compute_pass(timestamp_writes=stamps if len(stamps) > 1 else None)
        for _ in range(per_pass):
            # Session._commands: each dispatch's pipeline, bind group and grid (as runtime.profile uses it)
            for pipeline, bind_group, grid in commands[copy % len(commands)]:
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(*grid)
            copy += 1
        compute.end()
    encoder.resolve_query_set(query, 0, 2, resolve, 0)
    return encoder.finish()


def gpu_per_call(session, calls: int, samples: int, one_pass: bool = False,
                 commands: list[list[tuple]] | None = None) -> list[float] | None:
    """Seconds per plan run on the GPU, one value per sample, from timestamp queries around
    ``calls`` back-to-back copies of the plan in one command buffer: one compute pass per copy
    (as ``Session.run`` records a run), or with ``one_pass`` every dispatch of every copy in one
    compute pass. The first pass writes the beginning timestamp, the last the end one. Runs on
    the inputs the session last wrote; ``commands`` (:func:`weight_copies`): on those copies of its
    weights in turn. None when the device has no ``timestamp-query``."""
    device = session.device
    if not has_timestamps(device) or not session._commands:
        return None
    query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolve = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    passes = 1 if one_pass else calls
    per_pass = calls if one_pass else 1
    out = []
    for _ in range(samples):
        device.queue.submit([stamped_copies(session, query, resolve, passes, per_pass, commands)])
        ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64)
        out.append(float(ticks[1] - ticks[0]) * 1e-9 / calls)  # WebGPU timestamps are nanoseconds
    return out
