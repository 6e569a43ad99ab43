"""``bench/matmul.py`` with the GEMV kernel in another form than the lowering's: its load forms
(the f32 vec4 quads behind a branch, ``_QUAD_VEC4``, or without one, ``_QUAD_VEC4_SELECT``; the
quantised blocks behind a branch), its lane sums as the workgroup-memory tree instead of subgroup
shuffles, or products of up to ``--gemv-max-rows`` rows taken by the GEMV instead of the tiled kernel.
Every other argument is passed to ``bench/matmul.py`` (``--shapes``, ``--json``, ``--no-torch``, ...).

    python3 bench/gemv_forms.py --form branch --shapes "4,576,49152;4,384,384" --json branch.json
    python3 bench/gemv_forms.py --gemv-max-rows 8 --shapes "8,576,1536" --json rows8.json

Forms: ``lowered`` (as the lowering chooses: ``matmul_kernel.gemv_select_loads``), ``select`` (the
f32 quads without a branch in every GEMV), ``branch`` (behind one in every GEMV), ``blocks-branch``
(quantised B's blocks behind a branch), ``tree`` (the lane sums in workgroup memory), ``branch-tree``;
``--chunk-a-quads N`` caps the quads of A a chunk of K holds (fewer steps a chunk, more chunks).
The results of bench/results/rerun_h200/gemv_select/ and gemv_rows8/ were measured with these forms.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

FORMS = ("lowered", "select", "branch", "blocks-branch", "tree", "branch-tree")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--form", default="lowered", choices=FORMS)
    ap.add_argument("--gemv-max-rows", type=int, help="the most rows of a product the GEMV takes (default 4)")
    ap.add_argument("--chunk-a-quads", type=int, help="the most quads of A a GEMV's chunk of K holds "
                                                       "(matmul_kernel.GEMV_CHUNK_MAX_A_QUADS; default none)")
    args, rest = ap.parse_known_args()
    import eggfuse.ir.ops.conv as conv
    import eggfuse.ir.ops.matmul as matmul
    import eggfuse.ir.ops.matmul_kernel as mk
    import eggfuse.lowering.wgsl as wgsl

    if args.form == "select":
        mk.gemv_select_loads = lambda rows, k, lanes: True
    if args.form in ("branch", "branch-tree"):
        mk.gemv_select_loads = lambda rows, k, lanes: False
    if args.form == "blocks-branch":
        mk._QUAD_BLOCKS_SELECT = mk._QUAD_BLOCKS
    if args.form in ("tree", "branch-tree"):
        del wgsl.SUBGROUP_FORMS["matmul_gemv_reduce.wgsl"]
    if args.gemv_max_rows is not None:
        if not 1 <= args.gemv_max_rows <= 16:
            raise SystemExit(f"--gemv-max-rows must be 1..16, got {args.gemv_max_rows}")
        for module in (mk, matmul, conv):  # each holds the constant by value
            module.GEMV_MAX_ROWS = args.gemv_max_rows
    if args.chunk_a_quads is not None:
        if args.chunk_a_quads < 2:
            raise SystemExit(f"--chunk-a-quads must be at least 2, got {args.chunk_a_quads}")
        mk.GEMV_CHUNK_MAX_A_QUADS = args.chunk_a_quads
    script = Path(__file__).parent / "matmul.py"
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
