"""The FP32 FMA rate a WGSL kernel reaches on this device: the ceiling of the tiled matmul's inner
product (``shaders/matmul.wgsl``) as the WGSL -> SPIR-V -> driver path compiles it.

Each invocation of a workgroup of each of ``--wg``'s sizes (256 and 192) holds 8 vec4 accumulators and does, per
step, 8 rounds of the matmul micro-tile's form, ``c_r = fma(vec4(a_r), b, c_r)`` (32 FMAs a round, the
8x4 micro-tile of ``64x64x16m8x4``), on values held in registers (no memory in the loop); forms:

- ``plain``: no barrier;
- ``barrier``: a ``workgroupBarrier()`` after each step of 8 rounds (the matmul's one barrier a K slice);
- ``barrier_lds``: the barrier, and each round reads its vec4 of a and b from workgroup memory (3 quads
  a round, as the micro-tile reads them);
- ``muladd`` and ``muladd_barrier_lds``: ``plain`` and ``barrier_lds`` with ``c_r = c_r + vec4(a_r) * b`` in place
  of ``fma`` (SPIR-V OpFMul and OpFAdd, which the driver may contract, against GLSL.std.450 Fma);
- ``scalar``: ``plain`` with each vec4 FMA written as four scalar ``fma`` calls;
- ``wide16`` and ``wide16_barrier_lds``: ``plain`` and ``barrier_lds`` with 16 vec4 accumulators fed by four
  quads of a and one of b (a 16x4 micro-tile: 64 FMAs a round, as many as the 8x8 one's; five quads read a round
  where the 8x8 reads four);
- ``f32vars``: ``plain`` with 32 f32 accumulators in variables of their own instead of 8 vec4s.

The grid is ``--per-sm`` workgroups per multiprocessor (``--sms``, 132 on an H200); time by GPU
timestamps around ``--calls`` dispatches, median of ``--samples``. FMA/s is 32 (64 for wide16) * 8 * steps per
invocation over the time; the peak printed beside is ``--sms`` x 128 lanes x ``--clock-ghz`` (the H200's
1.98 GHz boost clock: no clock is read here).

    python3 bench/fma_peak.py --json bench/results/fma_peak_h200/fma_peak.json   # GPU machine

The clock is not read here; ``nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv -lms 250``
beside a run logs it (bench/results/fma_peak_h100/clocks.csv: 1980 MHz, the boost clock, throughout the run of
fma_peak.json there, whose forms all reached 52-64% of the peak it prints).

JSON: rows with ``form``, ``wg``, ``workgroups``, ``steps``, ``us``, ``tfma_per_s``, ``of_peak``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import wgpu

from eggfuse.runtime import get_device
from eggfuse.runtime.device import adapter_description

_SHADER = """
struct P { steps: u32, seed: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
var<workgroup> tiles: array<vec4<f32>, 512>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let s = p.seed + f32(li) * 1e-7;
    var a0 = vec4<f32>(s, s + 1e-7, s + 2e-7, s + 3e-7);
    var a1 = a0 * 0.5;
    var a2 = a0 * 0.75;
    var a3 = a0 * 0.125;
    var b = a0 * 0.25;
    for (var i = li; i < 512u; i = i + WGu) {  // every quad the reads below may take
        tiles[i] = a0 * f32(i + 1u) * 1e-3;
    }
    workgroupBarrier();
DECL
    for (var t = 0u; t < p.steps; t = t + 1u) {
ROUNDS
BARRIER
    }
    let sum = SUM;
    if (dot(sum, vec4<f32>(1.0)) == 12345.678) {  // never: keeps every FMA
        out[gid.x] = sum;
    }
}
"""

_ROUND = """        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);"""

_LDS = """        a0 = tiles[(li / 16u + {r}u * 16u) % 512u]; a1 = tiles[(li / 16u + {r}u * 16u + 8u) % 512u];
        b = tiles[(li % 16u + {r}u * 16u + 256u) % 512u];
"""

_ROUND_MULADD = "\n".join(f"        c{i} = c{i} + vec4<f32>(a{i // 4}.{'xyzw'[i % 4]}) * b;" for i in range(8))

_ROUND_SCALAR = "\n".join(f"        c{i}.{e} = fma(a{i // 4}.{'xyzw'[i % 4]}, b.{e}, c{i}.{e});" for i in range(8)
                           for e in "xyzw")

_ROUND_WIDE = "\n".join(f"        c{i} = fma(vec4<f32>(a{i // 4}.{'xyzw'[i % 4]}), b, c{i});" for i in range(16))

_ROUND_F32 = "\n".join(f"        s{4 * i + k} = fma(a{i // 4}.{'xyzw'[i % 4]}, b.{'xyzw'[k]}, s{4 * i + k});"
                        for i in range(8) for k in range(4))

_LDS_WIDE = _LDS + """        a2 = tiles[(li / 16u + {r}u * 16u + 4u) % 512u];
        a3 = tiles[(li / 16u + {r}u * 16u + 12u) % 512u];
"""

FORMS = ("plain", "barrier", "barrier_lds", "muladd", "muladd_barrier_lds", "scalar", "wide16", "wide16_barrier_lds",
         "f32vars")
#: FMAs a round of each form (the others: 32)
ROUND_FMAS = {"wide16": 64, "wide16_barrier_lds": 64}


def shader(form: str, wg: int) -> str:
    body = {"scalar": _ROUND_SCALAR, "f32vars": _ROUND_F32}.get(
        form, _ROUND_WIDE if form.startswith("wide16") else _ROUND_MULADD if form.startswith("muladd") else _ROUND)
    lds = (_LDS_WIDE if form.startswith("wide16") else _LDS) if form.endswith("barrier_lds") else ""
    rounds = "\n".join(lds.format(r=r) + body for r in range(8))
    if form == "f32vars":  # 32 f32 accumulators
        decl = "\n".join(f"    var s{i} = 0.0;" for i in range(32))
        total = "vec4<f32>(" + " + ".join(f"s{i}" for i in range(32)) + ")"
    else:
        n = 16 if form.startswith("wide16") else 8
        decl = "\n".join(f"    var c{i} = vec4<f32>();" for i in range(n))
        total = " + ".join(f"c{i}" for i in range(n))
    return (_SHADER.replace("WGu", f"{wg}u").replace("WG", str(wg)).replace("ROUNDS", rounds).replace("DECL", decl)
            .replace("SUM", total).replace("BARRIER", "        workgroupBarrier();" if "barrier" in form else ""))


def time_form(device, form: str, wg: int, workgroups: int, steps: int, calls: int, samples: int) -> float:
    """Median seconds per dispatch of ``form`` on ``workgroups`` workgroups of ``wg``, ``steps`` steps each."""
    module = device.create_shader_module(code=shader(form, wg))
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    uniform = device.create_buffer_with_data(data=np.uint32(steps).tobytes() + np.float32(1.0001).tobytes(),
                                             usage=wgpu.BufferUsage.UNIFORM)  # P { steps: u32, seed: f32 }
    out = device.create_buffer(size=16 * wg * workgroups, usage=wgpu.BufferUsage.STORAGE)
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": uniform}}, {"binding": 1, "resource": {"buffer": out}}])
    query = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolve = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    times = []
    for sample in range(samples + 1):  # the first warms up
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass(timestamp_writes={"query_set": query, "beginning_of_pass_write_index": 0,
                                                               "end_of_pass_write_index": 1})
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        for _ in range(calls):
            compute.dispatch_workgroups(workgroups)
        compute.end()
        encoder.resolve_query_set(query, 0, 2, resolve, 0)
        device.queue.submit([encoder.finish()])
        ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64)
        if sample:
            times.append(int(ticks[1] - ticks[0]) * 1e-9 / calls)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors (an H200's 132)")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="the clock of the printed peak")
    ap.add_argument("--per-sm", default="1,2,3,4", help="workgroups per multiprocessor, comma-separated")
    ap.add_argument("--wg", default="256,192", help="invocations per workgroup, comma-separated")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--forms", default=",".join(FORMS), help="which of " + ", ".join(FORMS))
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    forms = args.forms.split(",")
    if unknown := sorted(set(forms) - set(FORMS)):
        ap.error(f"unknown forms {', '.join(unknown)}: take from {', '.join(FORMS)}")
    device = get_device()
    if "timestamp-query" not in device.features:
        raise SystemExit("this device has no timestamp-query: nothing to time with")
    peak = args.sms * 128 * args.clock_ghz * 1e9
    rows = []
    for wg in (int(w) for w in args.wg.split(",")):
        for per_sm in (int(n) for n in args.per_sm.split(",")):
            for form in forms:
                groups = args.sms * per_sm
                s = time_form(device, form, wg, groups, args.steps, args.calls, args.samples)
                fma = ROUND_FMAS.get(form, 32) * 8 * args.steps * wg * groups / s
                rows.append({"form": form, "wg": wg, "workgroups": groups, "steps": args.steps, "us": s * 1e6,
                             "tfma_per_s": fma * 1e-12, "of_peak": fma / peak,
                             "adapter": adapter_description(device)})
                print(f"{form:<12} wg {wg:>3} x {groups:>4}: {s * 1e6:9.1f} us  {fma * 1e-12:6.2f} TFMA/s "
                      f"({fma / peak:.0%} of {peak * 1e-12:.1f})", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
