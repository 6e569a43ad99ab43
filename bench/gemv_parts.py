"""Where a one-row GEMV's time goes: one matmul of SmolLM2's decode step (the LM head
1 x 576 x 49152 on Q8_0 blocks, the Q/K/V, gate/up and output projections on Q4_1 or in f32),
timed with parts of its generated WGSL changed, and at each GEMV column count.

A part is changed by replacing a stretch of the kernel's source (``_edits``): bounds that compute
wrong numbers (``no_b``: no loads of B; ``no_x``: no loads of op(A); ``no_b_no_x``: neither), and
alternative forms that compute the same ones (``branch_b``: a branch around each quad's loads of B,
the form before the select; ``branch_a`` (f32) or ``select_a`` (quantised B): op(A)'s loads in the
form the kernel does not take; ``scalar_w_norm``: the RmsNorm weights' components read one by one).
An edit whose stretch is not in the source stops the run, so that a later change of the kernel
cannot make a variant silently the base.
``--columns`` times the base at every GEMV column count (``matmul_choice(gemv_cols=...)``) and,
at 32 lanes a column or fewer, with the lane sums forced to the tree in workgroup memory.

Timing is bench/matmul.py's (GPU timestamps around N back-to-back dispatches in one pass, after a
warm-up); each row has the largest difference of the variant's output from the base's.

    python3 bench/gemv_parts.py --json parts.json               # GPU machine
    python3 bench/gemv_parts.py --columns --json columns.json

The JSON files of bench/results/gemv_prologue_h200/ came from earlier revisions of this script,
run once each: ``lmhead_before.json`` on the kernel before the vec4 RmsNorm weights and the
branch-free loads of B (variants no_b_bounds: no branch around B's loads; aligned_q_word: Q8_0
words read as if aligned, wrong numbers; no_w_norm: the RmsNorm weights not applied, wrong numbers;
no_x, no_b, no_b_no_x; cols4..64); ``lmhead_after.json`` after them ("new" is the base; branch_b,
select_a, scalar_w_norm as here; cols8, cols32); ``cols.json`` before the subgroup form existed,
"tree" the lane sums in workgroup memory and "shuffle" the butterfly edited in (rows "tree" and
"sums" here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402
import matmul as mm  # noqa: E402
import shader_ab  # noqa: E402

import eggfuse.ir.ops.matmul_kernel as mk  # noqa: E402
from eggfuse.ir import DType, Graph  # noqa: E402
from eggfuse.ir.ops.matmul_kernel import GEMV_COLS_ALLOWED, matmul_choice  # noqa: E402
from eggfuse.lowering import wgsl  # noqa: E402
from eggfuse.pipeline import lower_for  # noqa: E402
from eggfuse.runtime import Session, get_device  # noqa: E402

#: (B's storage, (M, K, N), RmsNorm prologue): the LM head, then Q/K/V, gate/up, output projection
CASES = [("q8_0", (1, 576, 49152), True), ("q4_1", (1, 576, 960), True), ("q4_1", (1, 576, 3072), True),
         ("q4_1", (1, 576, 576), False), ("f32", (1, 576, 49152), True), ("f32", (1, 576, 960), True),
         ("f32", (1, 576, 3072), True), ("f32", (1, 576, 576), False)]
_CONST_A = "fn quad_a(r: u32, c: u32) -> vec4<f32> {\n    return vec4<f32>(f32(c));\n}"
_CONST_B = "fn quad_b(r: u32, c: u32) -> vec4<f32> {\n    return vec4<f32>(f32(c), f32(r), 1.0, 2.0);\n}"


def _edits(fmt: str) -> dict[str, list[tuple[str, str]]]:
    """Variant name -> (old, new) replacements of the kernel source, for B stored as ``fmt``: whole
    quad functions, in the forms ir/ops/matmul_kernel.py generates (its templates)."""
    a_branch, a_select = (t.format(x="a", rows="p.m", cols="p.k") for t in (mk._QUAD_VEC4, mk._QUAD_VEC4_SELECT))
    if fmt == "f32":
        b_branch, b_select = (t.format(x="b", rows="p.n", cols="p.k") for t in (mk._QUAD_VEC4, mk._QUAD_VEC4_SELECT))
    else:
        b_branch, b_select = (t.format(fmt=fmt) for t in (mk._QUAD_BLOCKS, mk._QUAD_BLOCKS_SELECT))
    a_now, a_other = (a_select, a_branch) if fmt == "f32" else (a_branch, a_select)  # as the GEMV has A
    no_b, no_x = [(b_select, _CONST_B)], [(a_now, _CONST_A)]
    return {"no_b": no_b, "no_x": no_x, "no_b_no_x": no_b + no_x,
            "branch_a" if fmt == "f32" else "select_a": [(a_now, a_other)],
            "branch_b": [(b_select, b_branch)],
            # the weights' four components read one by one (the compiler may merge them)
            "scalar_w_norm": [("return w_norm[min(k, p.k - 4u) / 4u];",
                               "let q = min(k, p.k - 4u) / 4u;\n    return vec4<f32>(w_norm[q].x, w_norm[q].y, "
                               "w_norm[q].z, w_norm[q].w);")]}


def build(fmt: str, m: int, k: int, n: int, rms: bool) -> tuple[Graph, dict, dict]:
    """The graph of one GEMV (FusedMatMul / FusedRmsNormMatMul 'BT', or their Quant twins on ``fmt``
    blocks), its parameters (B: bench/matmul.py's ``weight_values``) and feeds (random)."""
    g, rng = Graph(), np.random.default_rng(1)
    ins, params = [g.input("a", [m, k])], {"b": mm.weight_values("MatMulBT", k, n, fmt)[0]}
    if rms:
        ins.append(g.parameter("w_norm", [k]))
        params["w_norm"] = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    if fmt == "f32":
        ins.append(g.parameter("b", [n, k]))
        op, attrs = "FusedRmsNormMatMul" if rms else "FusedMatMul", {"variant": "BT", "epilogue": ()}
    else:
        ins.append(g.parameter("b", list(params["b"].shape), DType.U32))
        op, attrs = "QuantRmsNormMatMul" if rms else "QuantMatMul", {"format": fmt, "epilogue": ()}
    if rms:
        attrs["eps"] = 1e-5
    g.set_outputs([g.add_node(op, tuple(ins), **attrs)])
    return g, params, {"a": rng.standard_normal((m, k), dtype=np.float32)}


def session(device, graph, params, feeds, edits=()) -> tuple[Session, np.ndarray]:
    """A session of ``graph`` with ``edits`` applied to every dispatch's source, and its output."""
    plan = lower_for(graph, device)
    if edits:
        dispatches = []
        for d in plan.dispatches:
            source = d.source
            for old, new in edits:
                if old not in source:
                    raise SystemExit(f"{d.kernel}: the edit's text is not in the source:\n{old}")
                source = source.replace(old, new)
            dispatches.append(dataclasses.replace(d, source=source))
        plan = dataclasses.replace(plan, dispatches=tuple(dispatches))
    s = Session(plan, params, device=device)
    return s, np.asarray(s.run(feeds)[0])


def tree_sums():
    """Lowering inside gives the GEMV's lane sums as the tree in workgroup memory even where the
    device has subgroups (matmul_gemv_reduce.wgsl's text for its subgroup form)."""
    return shader_ab.shader_replaced("matmul_gemv_reduce_subgroup.wgsl", wgsl.shader_text("matmul_gemv_reduce.wgsl"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--columns", action="store_true", help="every GEMV column count instead of the edits")
    ap.add_argument("--budget", type=float, default=0.2, help="GPU seconds of calls per row (sizes N)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    device, rows = get_device(), []

    def timed(name: str, s: Session, out: np.ndarray, ref: np.ndarray, **extra) -> None:
        calls = mm.calls_for(s, args.budget, args.repeats)
        mm.warm_up(s, args.budget, calls)
        us, p90 = gpu_timing.median_p90(mm.time_ours(s, calls, args.repeats))
        rows.append(dict(name=name, us=us * 1e6, p90_us=p90 * 1e6, calls=calls,
                         max_abs_diff=float(np.max(np.abs(out - ref))), kernel=s.plan.dispatches[0].kernel,
                         adapter=s.adapter, **extra))
        r = rows[-1]
        print(f"{r['fmt']:5} {str(r['shape']):18} {name:14} cols={r['cols']!s:9} {r['us']:8.2f} us "
              f"(p90 {r['p90_us']:.2f}) max diff {r['max_abs_diff']:.3g}", flush=True)
        args.json.write_text(json.dumps(rows, indent=1))

    args.json.parent.mkdir(parents=True, exist_ok=True)
    warm, _ = session(device, *build("f32", 1, 4096, 4096, False))
    mm.warm_up(warm, 2.0, 50)
    del warm
    for fmt, shape, rms in CASES:
        graph, params, feeds = build(fmt, *shape, rms)
        base, ref = session(device, graph, params, feeds)
        meta = dict(fmt=fmt, shape=shape, rms=rms)
        if not args.columns:
            timed("base", base, ref, ref, cols="heuristic", **meta)
            for name, edits in _edits(fmt).items():
                if name == "scalar_w_norm" and not rms:
                    continue
                timed(name, *session(device, graph, params, feeds, edits), ref, cols="heuristic", **meta)
            continue
        for cols in GEMV_COLS_ALLOWED:
            if cols == 1 and shape[1] <= 1024 or cols == 64 and shape[2] > 8192:
                continue
            with matmul_choice(gemv_cols=cols):
                timed("sums", *session(device, graph, params, feeds), ref, cols=cols, **meta)
                if cols >= 8:  # 32 lanes or fewer: the subgroup form's butterfly where subgroups are 32 wide
                    with tree_sums():
                        timed("tree", *session(device, graph, params, feeds), ref, cols=cols, **meta)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
