"""Where the tiled matmul kernel's time goes: one product timed as lowered and with parts of each K step
removed from its WGSL, so that the difference bounds what those parts cost. The numbers such a kernel
computes are wrong; only its time is of use.

Variants (applied to the rendered source of ``shaders/matmul.wgsl``'s kernel):

- ``base``: as lowered;
- ``lds``: every K element of a step reads the quads of A and B in workgroup memory that its first
  element reads (the compiler keeps one read of each): a step reads one element's quads instead of
  BK / KSPLIT elements', with the same FMAs;
- ``noload``: no global loads of the next slice (the stale registers are stored);
- ``lds+noload``: both.

Timing is ``bench/matmul.py``'s (GPU timestamps around back-to-back calls, median of samples after a
warm-up), rounds alternated.

    python3 bench/matmul_ablation.py --json bench/results/three_quarter_h200/ablate.json   # GPU machine

JSON: rows with ``shape`` ([M, K, N], MatMulBT), ``tile``, ``variant``, ``round``, ``us``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402
import matmul as mb  # noqa: E402

from eggfuse.ir.ops.matmul_kernel import MATMUL_TILES_ALL, matmul_choice  # noqa: E402
from eggfuse.lowering import plan as lowering_plan  # noqa: E402
from eggfuse.runtime import get_device  # noqa: E402
from eggfuse.runtime.device import adapter_description  # noqa: E402

VARIANTS = ("base", "lds", "noload", "lds+noload")
CASES = (((1024, 384, 1536), "64x64x16m8x4"), ((1024, 384, 1152), "64x48x16m8x4w192"),
         ((1024, 384, 1536), "128x64x8m8x8w128"), ((1024, 384, 1536), "64x64x16m8x8"))


def ablate(src: str, variant: str) -> str:
    """``src`` (a rendered WGSL module) with ``variant``'s parts removed if it is the tiled matmul kernel."""
    if "var<workgroup> tiles" not in src or "fn load_a" not in src or variant == "base":
        return src
    edits = []
    if "lds" in variant:  # offsets of one K element's quads: the element's own modulo the slice's row (BM/4, BN/4)
        bm4 = int(re.search(r"const BM: u32 = (\d+)u;", src).group(1)) // 4
        bn4 = int(re.search(r"const BN: u32 = (\d+)u;", src).group(1)) // 4
        edits += [(r"tiles\[a_at \+ (\d+)u\]", lambda m: f"tiles[a_at + {int(m.group(1)) % bm4}u]"),
                  (r"tiles\[b_at \+ (\d+)u\]", lambda m: f"tiles[b_at + {int(m.group(1)) % bn4}u]")]
    if "noload" in variant:
        edits.append((r"\n\s*next_\w+ = load_\w\(li \+ \d+u, \w+, k_next\);", ""))
    for pattern, replacement in edits:
        src, count = re.subn(pattern, replacement, src)
        if not count:  # the kernel's generated code changed: the variant would time the base kernel
            raise SystemExit(f"variant {variant!r}: {pattern!r} matches nothing in the tiled kernel")
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one small product (lavapipe)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    real = lowering_plan.render_kernel
    variant = {"v": "base"}

    def render(body, bindings, params, slots):
        src, extra = real(body, bindings, params, slots)
        return ablate(src, variant["v"]), extra

    lowering_plan.render_kernel = render
    device = get_device()
    tiles = {t.name: t for t in MATMUL_TILES_ALL}
    cases = (((128, 64, 128), "64x48x16m8x4w192"),) if args.quick else CASES
    rows = []
    for shape, tile in cases:
        for rnd in range(args.rounds):
            for v in VARIANTS:
                variant["v"] = v
                with matmul_choice(tile=tiles[tile], splits=1):
                    session = mb.matmul_session("MatMulBT", *shape, device)
                calls = mb.calls_for(session, 0.05, 5)
                mb.warm_up(session, mb.SWEEP_WARMUP_S, calls)
                us = gpu_timing.median_p90(mb.time_ours(session, calls, 5))[0] * 1e6
                del session
                rows.append({"shape": list(shape), "tile": tile, "variant": v, "round": rnd, "us": us,
                             "adapter": adapter_description(device)})
                print(f"{shape} {tile:<20} {v:<11} round {rnd}: {us:8.2f} us", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
