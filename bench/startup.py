"""Cold and warm start of the quick-start commands, as a user runs them: each command twice in a
row in new processes, the first after ``eggfuse cache clear`` (the compile cache and the model
cache, in a folder of the bench's own: ``--cache``, default a new temporary folder), the second
finding what the first stored.

    .venv/bin/python bench/startup.py --repeats 3 --out bench/results/startup_lavapipe.json

For ``embed`` the figure is optimise + compile (``timings.optimize_s + timings.compile_s`` of
``--json``), for ``generate`` the time to first token (``time_to_first_token_s``); the ratio is
second / first per pair, and the summary gives each pair's ratio and their median. Each pair
also records both processes' wall time, their other timings, the load average before it
(other work on a shared machine slows both runs, not always alike) and the cache statuses.
Mesa's own shader cache is left as it is (warm after the first run on a machine), in both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EGGFUSE = [sys.executable, "-m", "eggfuse.cli"]
EMBED = ["embed", "The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.", "--json"]
GENERATE = ["generate", "The capital of France is", "--max-new-tokens", "8", "--json"]


def run(args: list[str], env: dict) -> tuple[dict, float]:
    t = time.perf_counter()
    done = subprocess.run([*EGGFUSE, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"eggfuse {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout), wall


def figure(kind: str, out: dict) -> float:
    if kind == "embed":
        return out["timings"]["optimize_s"] + out["timings"]["compile_s"]
    return out["time_to_first_token_s"]


def pair(kind: str, env: dict) -> dict:
    subprocess.run([*EGGFUSE, "cache", "clear"], check=True, capture_output=True, env=env, cwd=ROOT)
    load = os.getloadavg()[0]
    runs = []
    for _ in range(2):
        out, wall = run(EMBED if kind == "embed" else GENERATE, env)
        runs.append({"figure_s": figure(kind, out), "wall_s": wall, "cache": out["cache"],
                     "cache_model": out.get("cache_model"), "timings": out["timings"]})
    return {"load_average_before": load, "ratio": runs[1]["figure_s"] / runs[0]["figure_s"], "first": runs[0],
            "second": runs[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=["embed", "generate"], default=None)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    p.add_argument("--cache", type=Path, default=None, help="the cache folder to use (and clear)")
    args = p.parse_args()
    folder = args.cache or Path(tempfile.mkdtemp(prefix="eggfuse-startup-"))
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp"), "EGGFUSE_CACHE": str(folder)}
    results = {}
    for kind in ("embed", "generate"):
        if args.only not in (None, kind):
            continue
        pairs = []
        for i in range(args.repeats):
            pairs.append(pair(kind, env))
            a, b = pairs[-1]["first"], pairs[-1]["second"]
            print(f"{kind} {i + 1}: {a['figure_s']:.3f} s ({a['cache']}) -> {b['figure_s']:.3f} s ({b['cache']}), "
                  f"ratio {pairs[-1]['ratio']:.2f}, load {pairs[-1]['load_average_before']:.1f}", flush=True)
        ratios = [q["ratio"] for q in pairs]
        results[kind] = {"figure": "optimize_s + compile_s" if kind == "embed" else "time_to_first_token_s",
                         "ratios": ratios, "median_ratio": statistics.median(ratios), "pairs": pairs}
        print(f"{kind}: median ratio {statistics.median(ratios):.2f} over {len(ratios)} pairs")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.cache is None:  # the temporary folder holds a model entry (538 MB for SmolLM2)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
