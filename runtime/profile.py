"""GPU time per dispatch from timestamp queries, and a Chrome / Perfetto trace of it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import wgpu

from ..ir.errors import DeviceError
from .device import device_errors


@dataclass(frozen=True)
class KernelTime:
    """One dispatch of the plan: its kernel, what it computes (op and shapes), GPU time in
    milliseconds (median over the profiled runs)."""

    index: int
    kernel: str
    label: str
    gpu_ms: float


@dataclass
class Profile:
    """Per-dispatch GPU times of one plan, plus the plan's wall time in milliseconds
    (record + submit + wait, median) when run normally, in one compute pass."""

    kernels: list[KernelTime]
    run_ms: float
    adapter: str

    @property
    def gpu_ms(self) -> float:
        return sum(k.gpu_ms for k in self.kernels)

    def table(self, top: int = 20) -> str:
        by_kernel: dict[str, list[float]] = {}
        for k in self.kernels:
            by_kernel.setdefault(k.kernel, []).append(k.gpu_ms)
        rows = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:top]
        total = self.gpu_ms or 1.0
        lines = [f"GPU time per kernel ({len(self.kernels)} dispatches, {self.gpu_ms:.3f} ms summed; "
                 f"plan wall time {self.run_ms:.3f} ms) on {self.adapter}",
                 f"{'kernel':<48}{'calls':>6}{'ms':>10}{'share':>8}"]
        for name, times in rows:
            lines.append(f"{name[:47]:<48}{len(times):>6}{sum(times):>10.3f}{sum(times) / total:>8.1%}")
        return "\n".join(lines)

    def write_chrome_trace(self, path: str | Path) -> None:
        """A Chrome / Perfetto trace (JSON array of complete events, microseconds): one
        event per dispatch, laid end to end in plan order."""
        events, t = [], 0.0
        for k in self.kernels:
            events.append({"name": k.kernel, "cat": "dispatch", "ph": "X", "ts": t * 1e3, "dur": k.gpu_ms * 1e3,
                           "pid": 0, "tid": 0, "args": {"index": k.index, "op": k.label}})
            t += k.gpu_ms
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def profile(session, inputs: Mapping[str, np.ndarray], repeats: int = 5) -> Profile:
    """Time every dispatch of ``session``'s plan on the GPU.

    Each dispatch gets its own compute pass with timestamp writes (so the sum is a little
    above the single-pass run), ``repeats`` times; the median per dispatch is reported.
    Needs the ``timestamp-query`` feature (requested by :func:`~.device.get_device` when
    the adapter has it); raises DeviceError otherwise.
    """
    device = session.device
    if "timestamp-query" not in device.features:
        raise DeviceError(f"the device {session.adapter} has no timestamp-query feature: no GPU timing")
    session.run(inputs)  # warm-up, and the inputs are now on the device
    n = len(session._commands)
    samples = np.zeros((repeats, n))
    with device_errors("profiling the plan"):
        query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        resolve = device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        for r in range(repeats):
            encoder = device.create_command_encoder()
            for i, (pipeline, bind_group, grid) in enumerate(session._commands):
                compute = encoder.begin_compute_pass(timestamp_writes={
                    "query_set": query, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(*grid)
                compute.end()
            encoder.resolve_query_set(query, 0, 2 * n, resolve, 0)
            device.queue.submit([encoder.finish()])
            ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64).reshape(n, 2)
            samples[r] = (ticks[:, 1] - ticks[:, 0]).astype(np.float64) / 1e6  # WebGPU timestamps: ns
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        session.run(inputs)
        runs.append((time.perf_counter() - t) * 1e3)
    med = np.median(samples, axis=0)
    kernels = [KernelTime(i, d.kernel, d.label, float(med[i])) for i, d in enumerate(session.plan.dispatches)]
    return Profile(kernels, float(np.median(runs)), session.adapter)
