"""The machine code (SASS) NVIDIA's Vulkan driver makes of eggfuse's kernels, read back from the driver's
shader disk cache, with a count of its instructions and of its register bank conflicts.

Why: the tiled matmul's FMAs reach 52-64% of the FP32 peak even with no memory traffic
(``bench/fma_peak.py``), and WGSL gives no view of what the driver compiles. NVIDIA's driver (580 seen)
stores each compiled pipeline in its disk cache (``__GL_SHADER_DISK_CACHE_PATH``) as zstd frames; the
frames holding an ``NVDANVVMNVuc`` blob carry the kernel's instructions, which ``nvdisasm -b SM90`` (CUDA's
toolkit, also inside Triton's wheel) disassembles as a raw instruction binary.

Two steps, so that the disassembly can run where the GPU is not:

- ``compile`` (the GPU machine): each kernel is compiled in a child process whose cache is a fresh
  folder, kept as ``OUT/NAME.cache`` beside ``OUT/NAME.wgsl``, and one child makes the device alone
  (``OUT/_baseline.cache``: wgpu's own pipelines, which every cache holds too). Kernels: ``--fma-forms
  plain,wide16`` (``bench/fma_peak.py``'s kernels, ``--wg`` invocations); ``--matmul M,K,N;...`` (the
  dispatches of one MatMulBT of each shape, as ``lower_for`` lowers it; ``M,K,N@TILE/SPLITS`` on a tile of
  MATMUL_TILES_ALL); ``--graphs DIR --model NAME`` (each distinct kernel of a saved benchmark graph,
  ``bench/models.py --save-graphs DIR``; ``--only SUBSTRING`` keeps some). ``--set MODULE.NAME=VALUE``
  (``bench/plan_ab.py``'s form) sets a lowering constant first. Each kernel is compiled as the runtime
  compiles it (``runtime.pipelines.get_pipeline``, with or without naga's runtime checks as the plan
  says; ``--unchecked``: every kernel of ``--matmul`` and ``--graphs`` without them). The child refuses an
  adapter that is not NVIDIA's.
- ``read`` (anywhere with ``nvdisasm`` and zstd, the ``zstandard`` module or the ``zstd`` command): the
  kernel of each ``NAME.cache`` (the ``NVDANVVMNVuc`` blob not in ``_baseline.cache``; without that
  folder, the largest) to ``NAME.sass``, and ``summary.json``: per kernel its instruction counts, the
  innermost loop holding the most FFMAs (its instructions, FFMAs and opcode counts), and the FFMAs whose
  register-file reads fall in one bank.

The bank model (an assumption, checked against timings): two banks, a register's bank its number mod 2; an
FFMA source marked ``.reuse`` on the FFMA just before, in the same slot, is not read again; an FFMA with two
or three reads in one bank counts as one conflict, costing one issue cycle (three in one bank would cost
two; and a ``.reuse`` set by another instruction is not followed: two simplifications). ``loop_ffma_bound``
= FFMAs / (loop instructions + conflicts). On an H100 it gives ``bench/fma_peak.py``'s ``plain`` loop (270
instructions, 256 FFMAs, 129 conflicts) 64% of the peak, measured 62-64%, and ``wide16`` (522, 512, 137)
78%, measured 77% on an H200; ``barrier_lds`` (390, 256, 123) 50%, measured 52-56%: no upper bound there.

    python3 bench/vulkan_sass.py compile --fma-forms plain,wide16 --matmul "1024,384,1536" --out /tmp/sass
    python3 bench/vulkan_sass.py read --out /tmp/sass --nvdisasm PATH   # here, on what came back
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: seconds a child may take to compile one kernel
CHILD_TIMEOUT_S = 300
#: the folder of the device alone's cache (wgpu's own pipelines), beside the kernels'
BASELINE = "_baseline"
NVUC_MAGIC = b"NVDANVVMNVuc"


def _child(spec_path: str) -> None:
    # compile one kernel as the runtime does; the driver writes its cache when the pipeline is made
    from eggfuse.runtime import get_device
    from eggfuse.runtime.pipelines import get_pipeline

    spec = json.loads(Path(spec_path).read_text())
    device = get_device()
    adapter = " ".join(str(v) for v in device.adapter.info.values())
    if "nvidia" not in adapter.lower():
        raise SystemExit(f"vulkan_sass: the adapter is not NVIDIA's ({adapter}); its shader cache is another format")
    if spec.get("baseline"):  # the device alone: wgpu's own pipelines
        device.queue.submit([])
        return
    if spec.get("layout_auto"):
        module = device.create_shader_module(code=spec["source"])
        device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": spec["entry"]})
    else:
        get_pipeline(device, spec["source"], spec["entry"], spec["num_storage"], spec["has_uniform"],
                     writable=tuple(spec["writable"]), prefetch=spec["prefetch"], checks=spec["checks"])
    device.queue.submit([])


def compile_kernel(name: str, spec: dict, out: Path) -> dict:
    """Compile ``spec`` in a child process with a fresh NVIDIA shader cache, kept as ``out/NAME.cache``."""
    cache = out / f"{name}.cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    if not spec.get("baseline"):
        (out / f"{name}.wgsl").write_text(spec["source"])
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "__GL_SHADER_DISK_CACHE": "1", "__GL_SHADER_DISK_CACHE_PATH": str(cache),
               "__GL_SHADER_DISK_CACHE_SKIP_CLEANUP": "1"}
        try:
            r = subprocess.run([sys.executable, __file__, "child", "--spec", str(spec_path)], env=env,
                               capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"kernel": name, "error": f"compile took over {CHILD_TIMEOUT_S} s"}
    files = [p for p in cache.rglob("*") if p.is_file()]
    if r.returncode:
        return {"kernel": name, "error": f"compile failed: {r.stderr.strip()[-2000:]}"}
    if not files:
        return {"kernel": name, "error": "the driver wrote no cache file (is its shader disk cache off?)"}
    return {"kernel": name, "cache_files": len(files), "cache_bytes": sum(p.stat().st_size for p in files)}


def fma_specs(forms: list[str], wg: int) -> dict[str, dict]:
    import fma_peak

    unknown = [f for f in forms if f not in fma_peak.FORMS]
    if unknown:
        raise SystemExit(f"vulkan_sass: --fma-forms {', '.join(unknown)}: not forms of bench/fma_peak.py "
                         f"({', '.join(fma_peak.FORMS)})")
    return {f"fma_{form}_wg{wg}": {"source": fma_peak.shader(form, wg), "entry": "main", "layout_auto": True}
            for form in forms}


def plan_specs(plan, only: str = "") -> dict[str, dict]:
    """Each distinct kernel source of ``plan`` (whose name holds ``only``), named after its kernel (with the
    source's digest where two sources share a name)."""
    specs, seen = {}, set()
    for d in plan.dispatches:
        if d.source in seen or (only and only not in d.kernel):
            continue
        seen.add(d.source)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", d.kernel)[:120]
        if name in specs:
            name += "_" + hashlib.sha256(d.source.encode()).hexdigest()[:8]
        specs[name] = {"source": d.source, "entry": d.entry_point, "num_storage": len(d.bindings),
                       "has_uniform": bool(d.params), "writable": list(d.writable), "prefetch": len(d.prefetch),
                       "checks": d.runtime_checks}
    return specs


def matmul_specs(shapes: str) -> dict[str, dict]:
    from eggfuse.ir import Graph
    from eggfuse.ir.ops.matmul_kernel import MATMUL_TILES_ALL, matmul_choice
    from eggfuse.pipeline import lower_for

    tiles = {t.name: t for t in MATMUL_TILES_ALL}
    specs = {}
    for item in filter(None, (x.strip() for x in shapes.split(";"))):
        triple, _, choice = item.partition("@")
        tile, _, splits = choice.partition("/")
        try:
            m, k, n = (int(v) for v in triple.split(","))
            splits = int(splits) if splits else None
        except ValueError:
            raise SystemExit(f"vulkan_sass: --matmul item {item!r}: write M,K,N, M,K,N@TILE or M,K,N@TILE/SPLITS "
                             f"(positive integers)") from None
        if min(m, k, n) < 1 or (splits is not None and splits < 1):
            raise SystemExit(f"vulkan_sass: --matmul item {item!r}: sizes and splits must be positive")
        if tile and tile not in tiles:
            raise SystemExit(f"vulkan_sass: {tile!r} is not a tile of MATMUL_TILES_ALL ({', '.join(tiles)})")
        g = Graph()
        a, b = g.input("a", [m, k]), g.parameter("b", [n, k])
        g.set_outputs([g.matmul_bt(a, b)])
        with matmul_choice(tiles[tile] if tile else None, splits):
            plan = lower_for(g)
        specs.update({f"{m}x{k}x{n}_{name}": s for name, s in plan_specs(plan).items()})
    return specs


# -- read: the cache's blobs to SASS ------------------------------------------------------------------------

def _zstd_frames(blob: bytes) -> list[bytes]:
    # each zstd frame of blob, decompressed (the cache files hold several, between headers of the driver's)
    try:
        import zstandard
    except ImportError:
        zstandard = None
    out = []
    if zstandard is not None:  # each frame decoded to its end; a magic inside a decoded frame is skipped
        at = blob.find(ZSTD_MAGIC)
        while at >= 0:
            obj = zstandard.ZstdDecompressor().decompressobj()
            try:
                out.append(obj.decompress(blob[at:]))
                at += len(blob) - at - len(obj.unused_data)
            except zstandard.ZstdError:
                at += 1
            at = blob.find(ZSTD_MAGIC, at)
        return out
    if not shutil.which("zstd"):
        raise SystemExit("vulkan_sass read: needs the zstandard module (pip install zstandard) or the zstd command")
    # the command: each piece from one magic to the next (the driver's bytes after a frame are ignored)
    starts = [m.start() for m in re.finditer(re.escape(ZSTD_MAGIC), blob)]
    for i, start in enumerate(starts):
        piece = blob[start:starts[i + 1] if i + 1 < len(starts) else len(blob)]
        out.append(subprocess.run(["zstd", "-d", "-c", "-q"], input=piece, capture_output=True).stdout)
    return out


def nvuc_code(blob: bytes) -> bytes | None:
    """The instructions of an ``NVDANVVMNVuc`` blob: its first section entry (at byte 0x48: kind 1, size,
    offset from byte 8), whole 16-byte instructions; None for another blob."""
    if not blob.startswith(NVUC_MAGIC) or len(blob) < 0x54:
        return None
    kind, size, offset = struct.unpack_from("<3I", blob, 0x48)
    if kind != 1 or offset + 8 + size > len(blob):
        return None
    code = blob[offset + 8:offset + 8 + size]
    return code[:len(code) // 16 * 16]


def disassemble(code: bytes, nvdisasm: str, arch: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        r = subprocess.run([nvdisasm, "-b", arch, f.name], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"vulkan_sass read: nvdisasm failed: {r.stderr.strip()}")
    return r.stdout


_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*(.*?);")
_REG = re.compile(r"^-?\|?(R\d+|RZ)\|?(\.reuse)?")


def instructions(sass: str) -> list[tuple[int, str, str, str]]:
    """(address, opcode, suffix, operands) of each instruction of ``sass``."""
    return [(int(m.group(1), 16), m.group(2), m.group(3), m.group(4)) for m in _LINE.finditer(sass)]


def bank_conflicts(ins: list[tuple[int, str, str, str]], banks: int = 2) -> int:
    """FFMAs whose register-file reads (sources not reused from the instruction before, in the same slot)
    put two registers in one bank (number mod ``banks``)."""
    conflicts, reused = 0, {}
    for _, op, _, operands in ins:
        if op != "FFMA":
            reused = {}
            continue
        sources = [_REG.match(x.strip()) for x in operands.split(",")[1:4]]
        reads, now = [], {}
        for slot, m in enumerate(sources):
            if m is None or m.group(1) == "RZ":
                continue
            if reused.get(slot) != m.group(1):
                reads.append(int(m.group(1)[1:]) % banks)
            if m.group(2):
                now[slot] = m.group(1)
        reused = now
        conflicts += len(reads) != len(set(reads))
    return conflicts


def hottest_loop(ins: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """The instructions of the innermost loop (a backward branch's range holding no other) with the most FFMAs:
    the K loop of a matmul. Empty where there is no loop."""
    ranges = []
    for at, op, _, operands in ins:
        target = re.search(r"0x([0-9a-f]+)", operands) if op == "BRA" else None
        if target and int(target.group(1), 16) < at:
            ranges.append((int(target.group(1), 16), at))
    inner = [r for r in ranges if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in ranges)]
    bodies = [[x for x in ins if lo <= x[0] <= hi] for lo, hi in inner]
    return max(bodies, key=lambda b: sum(x[1] == "FFMA" for x in b), default=[])


def summarise(sass: str) -> dict:
    ins = instructions(sass)
    kinds = Counter(op + (".128" if op in ("LDS", "STS", "LDG", "STG") and ".128" in sfx else "")
                    for _, op, sfx, _ in ins)
    loop = hottest_loop(ins)
    ffma = sum(x[1] == "FFMA" for x in loop)
    conflicts = bank_conflicts(loop)
    regs = [int(r) for r in re.findall(r"\bR(\d+)\b", sass)]
    return {"instructions": len(ins), "highest_register_named": max(regs, default=-1),
            "counts": dict(kinds.most_common()), "loop_instructions": len(loop), "loop_ffma": ffma,
            "loop_conflicts": conflicts, "loop_ffma_bound": round(ffma / (len(loop) + conflicts), 3) if loop else None,
            "loop_counts": dict(Counter(op for _, op, _, _ in loop).most_common())}


def cache_codes(cache: Path) -> list[bytes]:
    """The instructions of every ``NVDANVVMNVuc`` blob in the cache folder ``cache``."""
    return [c for f in sorted(cache.rglob("*.bin")) for frame in _zstd_frames(f.read_bytes())
            if (c := nvuc_code(frame))]


def kernel_code(codes: list[bytes], baseline: list[bytes] | None) -> bytes | str:
    """The kernel's instructions among a cache's ``codes``: the one blob not in ``baseline`` (wgpu's own
    pipelines), or without a baseline the largest; a message where that is not one blob."""
    if baseline is None:
        return max(codes, key=len) if codes else "no NVDANVVMNVuc blob in the cache (another driver's format?)"
    left = [c for c in codes if c not in baseline]
    if len(left) != 1:
        return (f"{len(left)} blobs besides the {len(baseline)} of {BASELINE}.cache "
                f"(sizes {sorted(len(c) for c in left)}), where the kernel makes one")
    return left[0]


def read(out: Path, nvdisasm: str, arch: str) -> list[dict]:
    caches = sorted(c for c in out.glob("*.cache") if c.name != f"{BASELINE}.cache")
    if not caches:
        raise SystemExit(f"vulkan_sass read: {out} holds no NAME.cache folder (made by compile)")
    base = out / f"{BASELINE}.cache"
    baseline = cache_codes(base) if base.is_dir() else None
    rows = []
    for cache in caches:
        name = cache.name[:-len(".cache")]
        code = kernel_code(cache_codes(cache), baseline)
        if isinstance(code, str):
            rows.append({"kernel": name, "error": code})
            continue
        sass = disassemble(code, nvdisasm, arch)
        (out / f"{name}.sass").write_text(sass)
        rows.append({"kernel": name, **summarise(sass)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("compile", "read", "child"))
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help="the folder of the caches, .wgsl, .sass and summary.json")
    ap.add_argument("--fma-forms", default="", help="compile: bench/fma_peak.py forms, comma-separated")
    ap.add_argument("--wg", type=int, default=256, help="compile: invocations of the fma forms' workgroups")
    ap.add_argument("--matmul", default="", help="compile: M,K,N;M,K,N;... MatMulBT shapes, each optionally "
                    "@TILE or @TILE/SPLITS (a tile of MATMUL_TILES_ALL, as matmul_choice takes it)")
    ap.add_argument("--graphs", type=Path, help="compile: a folder of bench/models.py --save-graphs")
    ap.add_argument("--model", action="append", default=[], help="compile: a model of --graphs (repeatable)")
    ap.add_argument("--only", default="", help="compile: keep the --graphs kernels whose name holds this")
    ap.add_argument("--set", action="append", default=[], help="compile: MODULE.NAME=VALUE before lowering")
    ap.add_argument("--unchecked", action="store_true", help="compile: every --matmul and --graphs kernel without "
                    "naga's runtime checks, also those the plan keeps them for (keeps_runtime_checks)")
    ap.add_argument("--prefix", default="", help="compile: put before each kernel's name (e.g. the --set's)")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm",
                    help="read: the disassembler")
    ap.add_argument("--arch", default="SM90", help="read: nvdisasm's -b architecture (SM90: H100, H200)")
    args = ap.parse_args()
    if args.command == "child":
        _child(args.spec)
        return
    if args.out is None:
        ap.error("--out is required")
    if args.command == "read":
        if not shutil.which(args.nvdisasm):
            raise SystemExit(f"vulkan_sass read: no nvdisasm program at {args.nvdisasm} (give --nvdisasm)")
        if not args.out.is_dir():
            raise SystemExit(f"vulkan_sass read: no folder {args.out}")
        rows = read(args.out, args.nvdisasm, args.arch)
        (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
        print(f"{'kernel':72s} {'hiReg':>5s} {'loop':>5s} {'FFMA':>5s} {'confl':>5s} {'bound':>5s}")
        for r in rows:
            if "error" in r:
                print(f"{r['kernel'][:72]:72s} {r['error']}")
            else:
                print(f"{r['kernel'][:72]:72s} {r['highest_register_named']:5d} {r['loop_instructions']:5d} "
                      f"{r['loop_ffma']:5d} {r['loop_conflicts']:5d} {r['loop_ffma_bound'] or 0:5.2f}")
        return
    if args.set:
        from plan_ab import parse_setting

        for module, name, value in map(parse_setting, args.set):
            setattr(importlib.import_module(module), name, value)
    if args.model and args.graphs is None or args.graphs is not None and not args.model:
        ap.error("--graphs and --model go together")
    if not (args.fma_forms or args.matmul or args.model):
        ap.error("compile: name kernels with --fma-forms, --matmul or --graphs and --model")
    args.out.mkdir(parents=True, exist_ok=True)
    specs = fma_specs([f for f in args.fma_forms.split(",") if f], args.wg)
    specs.update(matmul_specs(args.matmul))
    if args.model:
        import models
        from eggfuse.pipeline import lower_for

        loaded, _ = models.load_graphs(args.graphs)
        for name in args.model:
            specs.update({f"{name}_{k}": s for k, s in plan_specs(lower_for(loaded[name][1]), args.only).items()})
    print(json.dumps(compile_kernel(BASELINE, {"source": "", "baseline": True}, args.out)), flush=True)
    for name, spec in specs.items():
        if args.unchecked and not spec.get("layout_auto"):
            spec = {**spec, "checks": False}
        print(json.dumps(compile_kernel(args.prefix + name, spec, args.out)), flush=True)


if __name__ == "__main__":
    main()
