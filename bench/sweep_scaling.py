"""The same sweep on a Dask LocalCluster of 1 worker and of 2 workers, in one run: wall time of
each, their ratio, and the summed per-run CPU seconds (``cpu_s``, the worker processes' own CPU
time for each optimisation), which contention from other work on the machine inflates less.

    .venv/bin/python bench/sweep_scaling.py --models minilm,smollm2 --out bench/results/sweep

Writes ``OUT/scaling.json`` (both wall times, the ratio, CPU sums, the load average before and
after each half) and the 2-worker sweep's ``results.csv``/``results.json`` and PNGs under OUT.
Each half starts its cluster first and warms every worker with one tiny optimisation (imports,
the rulesets), so the timed part is the sweep itself, graph construction included (each worker
builds each model's graph once); ``--warm-graphs`` builds them in the warm-up instead. Before
either half, this process builds each graph once, so that both halves find the GGUF config entry
of the model cache (``model_cache.gguf_config``) written: neither pays the 2 s first read of
SmolLM2's GGUF metadata, which only a first-ever run on a machine does.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from eggfuse import sweep


def _warm(models: tuple[str, ...] = ()) -> int:
    from eggfuse.graphs import load_graph
    from eggfuse.ir import Graph
    from eggfuse.rewrites import optimize

    g = Graph()
    g.set_outputs([g.relu(g.input("x", [2, 2]))])
    optimize(g)
    for m in models:  # --warm-graphs: each worker builds (and keeps) the graphs before the timed part
        load_graph(m)
    return os.getpid()


def timed(configs, workers: int, models: tuple[str, ...] = ()) -> tuple[float, list[dict], dict]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with Client(lc) as client:
            client.run(_warm, models)
        load = {"before": os.getloadavg()}
        t = time.perf_counter()
        rows = sweep.run_sweep(configs, scheduler=lc.scheduler_address, progress=False)
        wall = time.perf_counter() - t
        load["after"] = os.getloadavg()
    return wall, rows, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--rulesets", default="ablate")
    ap.add_argument("--cost-models", default="bytes,roofline")
    ap.add_argument("--extractors", default="ilp,greedy")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warm-graphs", action="store_true",
                    help="build the graphs in every worker before timing (leaves graph construction out)")
    args = ap.parse_args()
    configs = sweep.grid(args.models.split(","), args.rulesets, args.cost_models.split(","),
                         args.extractors.split(","))
    from eggfuse.graphs import load_graph

    for m in args.models.split(","):  # the disk caches both halves read (the GGUF config entry) written
        load_graph(m)
    result = {"runs": len(configs), "cpus": os.cpu_count(), "warm_graphs": args.warm_graphs,
              "config_cache": "warm"}
    rows = {}
    for workers in (1, 2):
        warm = tuple(args.models.split(",")) if args.warm_graphs else ()
        wall, rows[workers], load = timed(configs, workers, warm)
        failed = [r for r in rows[workers] if r["error"]]
        result[f"workers_{workers}"] = {"wall_s": wall, "cpu_s_sum": sum(float(r["cpu_s"] or 0) for r in rows[workers]),
                                        "total_s_sum": sum(float(r["total_s"] or 0) for r in rows[workers]),
                                        "failed": len(failed), "loadavg": load}
        print(f"{workers} worker(s): {wall:.1f} s wall, {len(failed)} failed, load {load}", flush=True)
    w1, w2 = result["workers_1"], result["workers_2"]
    result["wall_ratio_2_over_1"] = w2["wall_s"] / w1["wall_s"]
    result["cpu_sum_ratio_2_over_1"] = w2["cpu_s_sum"] / w1["cpu_s_sum"]
    sweep.write_results(rows[2], args.out)
    sweep.plot(rows[2], args.out)
    (args.out / "scaling.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(sweep.table(rows[2]))


if __name__ == "__main__":
    main()
