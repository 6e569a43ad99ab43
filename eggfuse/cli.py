"""Command line: ``eggfuse embed "sentence" ...`` and friends."""

from __future__ import annotations

import argparse
import json
import sys

from eggfuse.ir import EggfuseError


def _print_matrix(sentences: list[str], sim) -> None:
    labels = [s if len(s) <= 40 else s[:37] + "..." for s in sentences]
    width = max(len(s) for s in labels)
    print("cosine similarity:")
    print(" " * (width + 2) + " ".join(f"{i:>6d}" for i in range(len(labels))))
    for i, label in enumerate(labels):
        print(f"{i:>2d} {label:<{width}} " + " ".join(f"{v:6.3f}" for v in sim[i]))


def cmd_embed(args: argparse.Namespace) -> None:
    from eggfuse.api import embed

    result = embed(args.sentences, fuse=not args.no_fuse)
    if args.json:
        print(json.dumps(result.to_dict()))
        return
    _print_matrix(result.sentences, result.similarity())
    print(f"adapter: {result.adapter}")
    print(f"dispatches per run: {result.dispatches_unfused} unfused -> {result.dispatches_fused} fused")
    if result.report is not None:
        print(result.report.summary())
    print("timings: " + ", ".join(f"{k} {v:.3f}s" for k, v in result.timings.items()))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eggfuse", description="egglog-fused neural-network graphs on wgpu")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="sentence embeddings with all-MiniLM-L6-v2 and their cosine similarities")
    e.add_argument("sentences", nargs="*", help="sentences to embed")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--no-fuse", action="store_true", help="run the unoptimised graph")
    e.set_defaults(func=cmd_embed)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except EggfuseError as e:
        print(f"eggfuse: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
