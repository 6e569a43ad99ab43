"""``eggfuse cache info|list|clear`` (the compile cache, :mod:`eggfuse.cache`, and the model cache in
its ``models`` folder, :mod:`eggfuse.model_cache`), and the ``--no-cache`` option of the
commands that compile."""

from __future__ import annotations

import argparse
import json


def cache_line(status: str, loaded) -> str:
    """The text output's line on the compile cache, for ``status`` hit, miss or off."""
    from eggfuse.cache import cache_dir

    if status == "hit":
        return f"compile cache: hit ({', '.join(loaded)} loaded from {cache_dir()})"
    if status == "miss":
        return f"compile cache: miss (stored in {cache_dir()})"
    return f"compile cache: {status}"


def add_no_cache(parser: argparse.ArgumentParser) -> None:
    """Register ``--no-cache`` on a command that compiles."""
    parser.add_argument("--no-cache", action="store_true",
                        help="neither load nor store compiled graphs (nor GGUF models) in the cache "
                             "(see: eggfuse cache info)")


def add_precision(parser: argparse.ArgumentParser) -> None:
    """Register ``--precision f32|f16`` on a command that compiles (``eggfuse.compile``'s ``precision``)."""
    parser.add_argument("--precision", choices=("f32", "f16"), default="f32",
                        help="f16: the rewrite engine stores the matmul weights ([N,K], and an ONNX export's [K,N]) "
                             "and embedding tables as float16, decoded in the kernels, which compute in f32 "
                             "(default f32)")


def cmd_cache(args: argparse.Namespace) -> None:
    from eggfuse.cache import CompileCache
    from eggfuse.model_cache import ModelCache

    store, models = CompileCache(check_limit=False), ModelCache()  # a bad $EGGFUSE_CACHE_MAX_MB may be cleared past
    if args.action == "clear":
        removed, removed_models = store.clear(), models.clear()
        if args.json:
            print(json.dumps({"folder": str(store.folder), "removed": removed, "removed_models": removed_models}))
        else:
            print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {store.folder}"
                  + (f", {removed_models} model entr{'y' if removed_models == 1 else 'ies'} from {models.folder}"
                     if removed_models else ""))
        return
    if args.action == "list":
        _list(store, args.json)
        return
    info, model_info = store.info(), models.info()
    if args.json:
        print(json.dumps({**info, "model_entries": model_info["entries"], "model_configs": model_info["configs"],
                          "model_bytes": model_info["bytes"]}))
        return
    from eggfuse.cache import not_a_folder

    problem = not_a_folder(store.folder)
    print(f"folder: {info['folder']}" + (f" (unusable: {problem})" if problem else ""))
    print(f"entries: {info['entries']}")
    print(f"total size: {info['bytes'] / 1e6:.2f} MB ({info['bytes']} bytes)")
    print(f"model entries: {model_info['entries']} (and {model_info['configs']} config entries) "
          f"in {model_info['folder']}, "
          f"{model_info['bytes'] / 1e6:.2f} MB ({model_info['bytes']} bytes)")


def _list(store, as_json: bool) -> None:
    """``eggfuse cache list``: the compile cache's entries, the most recently used first."""
    import time

    rows = store.describe()
    if as_json:
        print(json.dumps({"folder": str(store.folder), "entries": rows}))
        return
    if not rows:
        print(f"no compile-cache entries in {store.folder}")
        return
    print(f"{len(rows)} compile-cache entr{'y' if len(rows) == 1 else 'ies'} in {store.folder}, the most recently used "
          "first (an entry is its key's file, <key>.json):")
    print(f"{'key':<16}  {'MB':>7}  {'last used':<19}  {'kind':<7}  {'dispatches':>10}  inputs")
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["used"]))
        if "error" in r:
            print(f"{r['key'][:16]:<16}  {r['bytes'] / 1e6:>7.2f}  {used:<19}  unreadable ({r['error']}; the next "
                  "compile with its key rewrites it)")
            continue
        inputs = ", ".join(f"{n}{list(s) if s is not None else ''}" for n, s in r["inputs"].items()) or "-"
        print(f"{r['key'][:16]:<16}  {r['bytes'] / 1e6:>7.2f}  {used:<19}  {'fused' if r['fused'] else 'unfused':<7}"
              f"  {r['dispatches']:>10}  {inputs}")


def add_cache(sub) -> None:
    """Register ``cache`` on the CLI's subparsers."""
    c = sub.add_parser("cache", help="the compile and model cache: its folder, entries and size (info), its "
                                     "compiled entries one by one (list), or remove them (clear)")
    c.add_argument("action", choices=["info", "list", "clear"],
                   help="info: the folder ($EGGFUSE_CACHE or the user cache folder), entries, total size, and "
                        "the model entries (GGUF models as loaded) in its models folder; list: each compiled "
                        "entry (key, size, last use, fused or not, dispatches, the graph's inputs), the most "
                        "recently used first; clear: remove them all")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_cache)
