"""``bench/matmul.py`` with the GEMV kernel in another form than the lowering's: its load forms
(the f32 vec4 quads behind a branch, ``_QUAD_VEC4``, or without one, ``_QUAD_VEC4_SELECT``; the
quantised blocks behind a branch), its lane sums as the workgroup-memory tree instead of subgroup
shuffles, fewer steps of K a chunk, or products of up to ``--gemv-max-rows`` rows taken by the GEMV
instead of the tiled kernel. Every other argument is passed to ``bench/matmul.py`` (``--shapes``,
``--json``, ``--no-torch``, ...).

    python3 bench/gemv_forms.py --form branch --shapes "4,576,49152;4,384,384" --json branch.json
    python3 bench/gemv_forms.py --gemv-max-rows 8 --shapes "8,576,1536" --json rows8.json
    python3 bench/gemv_forms.py --gemv-max-rows 8 --plan minilm --graphs bench/graphs --json rows_ab.json

Forms: ``lowered`` (as the lowering chooses: ``matmul_kernel.gemv_select_loads``), ``select`` (the
f32 quads without a branch in every GEMV), ``branch`` (behind one in every GEMV), ``blocks-branch``
(quantised B's blocks behind a branch), ``tree`` (the lane sums in workgroup memory), ``branch-tree``;
``--chunk-a-quads N`` caps the quads of A a chunk of K holds (fewer steps a chunk, more chunks).

``--plan MODEL`` times a model's plan (``bench/models.py --save-graphs`` folder ``--graphs``) as
lowered and with the options above, alternated for ``--rounds`` (``models.time_alternately``: wall and
GPU time per run, 10 back-to-back runs a sample, 20 samples), instead of running bench/matmul.py;
JSON rows ``model``, ``variant`` (``lowered`` or ``changed``), ``round``, ``wall_us``, ``gpu_us``,
``dispatches``, ``max_abs_diff`` (against the lowered plan's output), ``adapter``.
The results of bench/results/rerun_h200/gemv_select/, gemv_chunk/, gemv_cols/ and gemv_rows8/ were
measured with these options (gemv_rows8/rows_ab.json by an earlier form of ``--plan``, its rows keyed
``gemv_max_rows`` 4 and 8 instead of ``variant``).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

FORMS = ("lowered", "select", "branch", "blocks-branch", "tree", "branch-tree")


def apply(args: argparse.Namespace) -> None:
    """Patch the lowering's modules as ``args`` asks."""
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
        for module in (mk, matmul, conv):  # each holds the constant by value
            module.GEMV_MAX_ROWS = args.gemv_max_rows
    if args.chunk_a_quads is not None:
        mk.GEMV_CHUNK_MAX_A_QUADS = args.chunk_a_quads


def plan_ab(args: argparse.Namespace, json_path: Path) -> None:
    """The model's plan as lowered and as ``args`` changes it, alternated; rows written to ``json_path``."""
    sys.path.insert(0, str(Path(__file__).parent))
    import models
    from eggfuse.pipeline import lower_for

    fused, params, feeds, meta = models.saved_model(args.graphs, args.plan, 10)
    plans = {"lowered": lower_for(fused)}
    apply(args)
    plans["changed"] = lower_for(fused)
    rows = [{"model": args.plan, **row} for row in models.time_alternately(plans, params, feeds, 10, 20, args.rounds)]
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {json_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--form", default="lowered", choices=FORMS)
    ap.add_argument("--gemv-max-rows", type=int, help="the most rows of a product the GEMV takes (default 4)")
    ap.add_argument("--chunk-a-quads", type=int, help="the most quads of A a GEMV's chunk of K holds "
                                                       "(matmul_kernel.GEMV_CHUNK_MAX_A_QUADS; default none)")
    ap.add_argument("--plan", help="time this model's plan (bench/models.py MODELS) instead of bench/matmul.py")
    ap.add_argument("--graphs", type=Path, help="with --plan: a folder of bench/models.py --save-graphs")
    ap.add_argument("--rounds", type=int, default=3, help="with --plan: rounds of the two plans alternated")
    args, rest = ap.parse_known_args()
    if args.gemv_max_rows is not None and not 1 <= args.gemv_max_rows <= 16:
        raise SystemExit(f"--gemv-max-rows must be 1..16, got {args.gemv_max_rows}")
    if args.chunk_a_quads is not None and args.chunk_a_quads < 2:
        raise SystemExit(f"--chunk-a-quads must be at least 2, got {args.chunk_a_quads}")
    if args.plan is not None:
        if args.graphs is None or rest[:1] != ["--json"] or len(rest) != 2 or args.rounds < 1:
            raise SystemExit("--plan MODEL needs --graphs DIR and --json FILE (and nothing else), --rounds >= 1")
        plan_ab(args, Path(rest[1]))
        return
    apply(args)
    script = Path(__file__).parent / "matmul.py"
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
