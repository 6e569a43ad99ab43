"""Kernel-by-kernel GPU time of each model on both sides: our plan by timestamp queries, the peer
(``torch.compile(mode="reduce-overhead")``, fp32 with TF32 off, or ``--peer-dtype bf16``) by
``torch.profiler``, on the graphs and HF models of ``bench/models.py``.

Ours: ``eggfuse.runtime.profile.profile`` (every dispatch in its own timestamped compute pass,
median over ``--repeats`` runs; a Chrome / Perfetto trace per model into ``--traces``). The
peer: ``--calls`` calls (CUDA-graph replays) under ``torch.profiler.profile`` with CUDA
activity, after the warm-up of ``bench/models.py``; each kernel's device time summed over the
calls and divided by them. Kernel names are grouped as the profilers give them (ours: the
pipeline name; theirs: the CUDA kernel's name). The sums of the two sides are not the run
times: ours puts each dispatch in a pass of its own, and the peer's sum leaves out the gaps
between kernels.

    .venv/bin/python bench/models.py --save-graphs bench/graphs         # here
    python3 bench/profile_models.py --graphs bench/graphs --json bench/results/profile_h200.json

JSON: one object per model: ``model``, ``ours`` and ``peer``, each a list of ``{"kernel", "calls",
"us"}`` (per model call, largest first) with ``ours_sum_us`` / ``peer_sum_us``, and the peer's
mode and dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch_peers  # noqa: E402

import models as mb  # noqa: E402


def ours(kind: str, graph, params: dict, inputs: dict, meta: dict, repeats: int, trace: Path | None) -> dict:
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session
    from eggfuse.runtime.profile import profile

    s = Session(lower_for(graph), {k: v for k, v in params.items() if k in graph.parameters})
    prof = profile(s, mb.our_feeds(kind, inputs, meta["seq"], 1)[0], repeats=repeats)
    if trace is not None:
        prof.write_chrome_trace(trace)
    by: dict[str, list[float]] = {}
    for k in prof.kernels:
        by.setdefault(k.kernel, []).append(k.gpu_ms * 1e3)
    rows = sorted(({"kernel": name, "calls": len(v), "us": sum(v)} for name, v in by.items()), key=lambda r: -r["us"])
    return {"rows": rows, "sum_us": prof.gpu_ms * 1e3, "dispatches": len(prof.kernels), "adapter": prof.adapter}


def peer(torch, kind: str, model, mode: str, dtype: str, inputs: dict, calls: int) -> dict:
    p = torch_peers.peer(torch, kind, model, mode, dtype, inputs, "cuda", mb.DECODE_MAX_SEQ)
    torch_peers.time_peer(torch, p, calls, 2, True)  # compile, record, warm up
    rows = torch_peers.peer_kernel_times(torch, p, calls)
    torch._dynamo.reset()
    return {"rows": rows, "sum_us": sum(r["us"] for r in rows), "peer": p.name, "mode": mode, "dtype": dtype}


def show(title: str, side: dict, top: int) -> None:
    print(f"  {title}: {side['sum_us']:.1f} us summed")
    for r in side["rows"][:top]:
        print(f"    {r['kernel'][:70]:<72}{r['calls']:>7.1f}{r['us']:>10.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=Path, required=True, help="folder of bench/models.py --save-graphs")
    ap.add_argument("--models", default=",".join(mb.MODELS))
    ap.add_argument("--peer-mode", default="reduce-overhead", choices=torch_peers.MODES)
    ap.add_argument("--peer-dtype", default="fp32", choices=torch_peers.DTYPES)
    ap.add_argument("--calls", type=int, default=10, help="peer calls profiled")
    ap.add_argument("--repeats", type=int, default=5, help="our profiled runs (median per dispatch)")
    ap.add_argument("--top", type=int, default=15, help="rows printed per side")
    ap.add_argument("--traces", type=Path, help="folder for our Chrome traces (<model>.json)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "profile.json")
    args = ap.parse_args()
    args.calls = max(args.calls, 1)
    args.seq = args.batch = args.layers = args.weights = None  # the shapes the saved graphs have
    args.quick = False
    models, meta = mb.select_graphs(args)
    torch, transformers = torch_peers.load_torch()
    if torch is None or not torch.cuda.is_available():
        raise SystemExit(f"the peer's profile needs torch with CUDA ({transformers})")
    hf, params = mb.hf_models(models, meta["layers"], torch, transformers, "cuda", meta["weights"])
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
    out = []
    for kind, (_, fused) in models.items():
        inputs = mb.model_inputs(kind, meta["seq"], meta["batch"], padded=False)
        mine = ours(kind, fused, params[kind], inputs, meta, args.repeats,
                    args.traces / f"{kind}.json" if args.traces else None)
        theirs = peer(torch, kind, hf[kind], args.peer_mode, args.peer_dtype, inputs, args.calls)
        print(f"{kind} ({meta}): ours {mine['dispatches']} dispatches on {mine['adapter']}; peer {theirs['peer']} "
              f"{args.peer_mode} {args.peer_dtype}")
        show("ours", mine, args.top)
        show("peer", theirs, args.top)
        out.append({"model": kind, **{k: v for k, v in meta.items()}, "ours": mine["rows"],
                    "ours_sum_us": mine["sum_us"], "ours_dispatches": mine["dispatches"], "adapter": mine["adapter"],
                    "peer": theirs["rows"], "peer_sum_us": theirs["sum_us"], "peer_name": theirs["peer"],
                    "peer_mode": args.peer_mode, "peer_dtype": args.peer_dtype, "torch": torch.__version__})
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
