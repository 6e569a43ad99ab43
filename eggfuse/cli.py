"""Command line: ``eggfuse embed "sentence" ...`` and friends."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

from eggfuse.cli_cache import add_cache, add_no_cache, add_precision, cache_line
from eggfuse.cli_generate import add_generate, dispatches_line, memory_line, precision_line
from eggfuse.cli_onnx import _input_arg, _shape_arg, add_run, load_time_values, shape_map
from eggfuse.cli_options import _names, add_engine_options
from eggfuse.cli_sweep import add_sweep
from eggfuse.cli_train import add_train_digits
from eggfuse.ir import EggfuseError, InputError


def _print_matrix(sentences: list[str], sim) -> None:
    labels = [s if len(s) <= 40 else s[:37] + "..." for s in sentences]
    width = max(len(s) for s in labels)
    print("cosine similarity:")
    print(" " * (width + 2) + " ".join(f"{i:>6d}" for i in range(len(labels))))
    for i, label in enumerate(labels):
        print(f"{i:>2d} {label:<{width}} " + " ".join(f"{v:6.3f}" for v in sim[i]))


def cmd_embed(args: argparse.Namespace) -> None:
    from eggfuse.api import embed

    result = embed(args.sentences, fuse=not args.no_fuse, profile=args.profile is not None, model=args.model,
                   cache=not args.no_cache, precision=args.precision)
    if result.profile is not None:
        result.profile.write_chrome_trace(args.profile)
    if args.json:
        print(json.dumps(result.to_dict()))
        return
    _print_matrix(result.sentences, result.similarity())
    if result.truncated:
        cut = ", ".join(str(i) for i in result.truncated)
        print(f"note: sentence{'s' if len(result.truncated) > 1 else ''} {cut} cut to the model's {result.max_length} "
              "tokens (max_seq_length; the rest is left out, as sentence-transformers does)")
    p = result.pooling
    print(f"model: {result.model}")
    print(f"pooling: {p['mode']}{', L2-normalised' if p['normalize'] else ', not normalised'} ({p['source']})")
    print(f"adapter: {result.adapter}")
    print(dispatches_line(result.dispatches_unfused, result.dispatches_fused, result.plan_dispatches,
                          fuse=not args.no_fuse))
    print(precision_line(result.precision, result.f16_weights))
    print(memory_line(result.memory))
    if result.report is not None:
        print(result.report.summary())
    print("timings: " + ", ".join(f"{k} {v:.3f}s" for k, v in result.timings.items()))
    print(cache_line(result.cache, result.cache_loaded))
    if result.profile is not None:
        print(result.profile.table())
        print(f"Chrome/Perfetto trace written to {args.profile}")


def cmd_optimize(args: argparse.Namespace) -> None:
    from eggfuse.cli_options import engine_kwargs
    from eggfuse.graphs import describe, load_graph
    from eggfuse.rewrites import optimize
    from eggfuse.rewrites.rulesets import is_own

    kind = describe(args.model)
    if kind != "model" and (args.seq is not None or args.batch is not None):
        raise InputError("--seq and --batch size the shipped models; " + (
            "an ONNX file's inputs take --shape NAME=DxD (its symbolic dimensions are 1 otherwise)" if kind == "onnx"
            else f"the function {args.model!r} builds its graph at its own shapes"))
    if args.input and kind != "onnx":
        raise InputError(f"--input fixes an ONNX file's inputs at load time; {args.model!r} is not an .onnx file")
    if args.shape and kind != "onnx":
        raise InputError(f"--shape sizes an ONNX file's inputs; {args.model!r} is " + (
            "a shipped model, sized by --seq and --batch" if kind == "model" else "a function, its graph's own shapes"))
    if args.dot and os.path.abspath(args.dot[0]) == os.path.abspath(args.dot[1]):
        raise InputError(f"--dot BEFORE AFTER: both are {args.dot[0]!r}, so the second picture would replace the "
                         "first; give two file names")
    if args.dot_depth < 0:
        raise InputError(f"--dot-depth is the levels of e-classes drawn below the one asked for: 0 or more, got "
                         f"{args.dot_depth}")
    seq = (16 if args.seq is None else args.seq) if kind == "model" else None
    batch = 2 if args.batch is None else args.batch
    values = load_time_values(args.model, args.input, shape_map(args.shape)) if args.input else None
    graph, source = load_graph(args.model, seq=16 if seq is None else seq, batch=batch, training=args.training,
                               shapes=shape_map(args.shape), values=values)
    onnx_nodes, origin = source.get("onnx_nodes"), source.get("origin")
    kw = engine_kwargs(args)
    if args.precision == "f16":  # the f16 ruleset first, as compile(..., precision="f16") runs it
        from eggfuse.pipeline import precision_rulesets

        if args.verify:
            raise InputError("--verify compares with the f32 graph, whose weights --precision f16 rounds: "
                             "leave out one of them")
        kw["rulesets"] = precision_rulesets("f16", kw.get("rulesets"))
    opt, report = optimize(graph, verify=args.verify, dump_egglog=args.dump_egglog, payoff=args.report, **kw)
    notes = _write_dots(args, graph, opt, kw)
    if args.json:
        out = report.to_dict()
        out.update(model=args.model, training=args.training, seq=seq, cost_model=args.cost_model)
        if onnx_nodes is not None:
            out.update(onnx_nodes=onnx_nodes, input_shapes=source["input_shapes"],
                       inputs_with_dimensions_1=source["defaulted"])
        out["recognised"] = recognised_counts(report.recognised, origin)
        print(json.dumps(out))
        for note in notes:
            print(note, file=sys.stderr)
        return
    if onnx_nodes is not None:
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in source["input_shapes"].items())
        defaulted = source["defaulted"]
        note = (f"; {', '.join(defaulted)}: symbolic dimensions 1, give --shape NAME=DxD" if defaulted else "")
        print(f"{args.model}: {onnx_nodes} ONNX nodes -> {len(graph.live_nodes())} graph nodes (inputs {shapes}"
              f"{note})")
    else:
        what = "forward + backward" if args.training else "forward"
        sized = f", seq {seq}" if seq is not None else ""
        print(f"{args.model} ({what}{sized}): {len(graph.live_nodes())} nodes")
    print(report.summary(origin))
    if args.report and not args.verify and any(map(is_own, kw.get("rulesets") or ())):
        verify = "" if args.precision == "f16" else "--verify compares the outputs, "
        print(f"note: what a rule saves says nothing of whether it is sound: {verify}`eggfuse check-sound` "
              "evaluates every e-class", file=sys.stderr)
    if args.dump_egglog:
        print(f"egglog program written to {args.dump_egglog}")
    for note in notes:
        print(note)


def recognised_counts(recognised: dict[str, list[list[int]]], origin: dict[int, str] | None) -> dict[str, dict]:
    """``Report.recognised`` for the JSON output: per op, its ``count`` and the ``nodes`` it
    replaced (graph nodes, or with ``origin`` the distinct ONNX nodes, as ``onnx_nodes``)."""
    out = {}
    for label, cones in recognised.items():
        ids = [i for c in cones for i in c]
        out[label] = {"count": len(cones)} | ({"nodes": len(ids)} if origin is None else
                                              {"onnx_nodes": len({origin.get(i, f"%{i}") for i in ids})})
    return out


def _write_dots(args: argparse.Namespace, graph, opt, kw: dict) -> list[str]:
    """--dot and --dot-eclass: the pictures asked for; a line per file written."""
    from eggfuse import dot

    notes = []
    if args.dot:
        before, after = args.dot
        notes.append(dot.write(dot.graph_dot(graph, f"{args.model}: before"), before))
        notes.append(dot.write(dot.graph_dot(opt, f"{args.model}: after"), after))
    if args.dot_eclass:
        from eggfuse.rewrites.engine import Report, saturate

        node, path = args.dot_eclass
        if not node.lstrip("%").isdigit():
            raise InputError(f"--dot-eclass takes a graph node id (as `%12` or `12` in the graph), got {node!r}")
        schedule = {k: v for k, v in kw.items() if k not in ("cost_model", "extractor")}
        enc = saturate(graph, Report(), **schedule)
        notes.append(dot.write(dot.eclass_dot(enc.raw, f"$n{node.lstrip('%')}", args.dot_depth), path))
    return notes


def cmd_check_sound(args: argparse.Namespace) -> None:
    from eggfuse.graphs import describe, load_graph
    from eggfuse.ir import RewriteError
    from eggfuse.rewrites.rulesets import is_own, rules_of, ruleset_name, select
    from eggfuse.rewrites.soundness import check_sound

    kind = describe(args.model)
    if args.shape and kind != "onnx":
        raise InputError(f"--shape sizes an ONNX file's inputs; {args.model!r} is not an .onnx file")
    if args.seq is not None and kind != "model":
        raise InputError(f"--seq sizes the shipped models; the graph {args.model!r} has its own shapes")
    if args.seed < 0:
        raise InputError(f"--seed must be 0 or more, got {args.seed}")
    graph, _ = load_graph(args.model, seq=16 if args.seq is None else args.seq, training=args.training,
                          shapes=shape_map(args.shape))
    rulesets = select(args.rulesets, args.disable_rule, optional=args.with_ruleset)
    try:
        rep = check_sound(graph, rulesets=rulesets, seed=args.seed)  # a RewriteError names the unsound rule
    except RewriteError as e:
        if args.json:  # the verdict on stdout too, for a script; the error line and exit status 2 as always
            print(json.dumps({"model": args.model, "sound": False, "seed": args.seed, "error": str(e)}))
        raise
    fired = {k: v for k, v in rep.rules_fired.items() if v}
    # the rules of one's own rulesets that never matched: sound here only because they were not tested
    untested = [(rule, ruleset_name(rs)) for rs in rulesets if is_own(rs) for rule in (rules_of(rs) or ())
                if not fired.get(rule)]
    if args.json:
        print(json.dumps({"model": args.model, "sound": True, "eclasses_checked": rep.eclasses_checked,
                          "enodes_checked": rep.enodes_checked, "seed": args.seed, "rules_fired": fired,
                          "rules_not_fired": [rule for rule, _ in untested]}))
        return
    print(f"{args.model}: sound: every e-class consistent ({rep.eclasses_checked} e-classes, {rep.enodes_checked} "
          f"e-nodes evaluated with the numpy reference on random inputs, seed {args.seed}); {len(fired)} rules "
          "fired:")
    for name, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d}  {name}")
    for rule, rs in untested:
        print(f"warning: rule {rule!r} (ruleset {rs}) never matched this graph: not tested; give a graph it "
              "matches", file=sys.stderr)


def cmd_rules(args: argparse.Namespace) -> None:
    from eggfuse.rewrites import catalog
    from eggfuse.rewrites.rulesets import OPTIONAL, named_ruleset, rules_of, ruleset_name

    rules = catalog()
    for spec in args.with_ruleset:  # rulesets of one's own: listed after the shipped ones, by their source
        if spec in OPTIONAL:  # a shipped optional ruleset, as optimize takes it: listed already
            continue
        rs = named_ruleset(spec)
        rules[f"{ruleset_name(rs)} ({spec})"] = list(rules_of(rs) or ())
    if args.json:
        print(json.dumps(rules))
        return
    for ruleset, names in rules.items():
        how = "--precision f16" if ruleset == "f16" else f"--with-ruleset {ruleset}"
        optional = f"; optional, not run by default: {how}" if ruleset in OPTIONAL else ""
        print(f"{ruleset} ({len(names)} rules{optional})")
        for name in names:
            print(f"  {name}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eggfuse", description="egglog-fused neural-network graphs on wgpu")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="sentence embeddings (all-MiniLM-L6-v2 by default) and their cosine similarities")
    e.add_argument("sentences", nargs="*", help="sentences to embed")
    e.add_argument("--model", metavar="PATH", default=None,
                   help="a Hugging Face or sentence-transformers folder (bert, roberta, xlm-roberta); "
                        "default: the shipped all-MiniLM-L6-v2")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--no-fuse", action="store_true", help="run the unoptimised graph")
    add_no_cache(e)
    add_precision(e)
    e.add_argument("--profile", metavar="TRACE.json", nargs="?", const="eggfuse-trace.json",
                   help="print GPU time per kernel and write a Chrome/Perfetto trace (default eggfuse-trace.json)")
    e.set_defaults(func=cmd_embed)

    o = sub.add_parser("optimize", help="run the rewrite engine on a model's graph and print its report")
    o.add_argument("model", help="minilm, smollm2, llama:LAYERS (SmolLM2 shapes, synthetic), an .onnx file, or "
                                 "module:function (or file.py:function) returning an eggfuse Graph")
    o.add_argument("--shape", metavar="NAME=DxD...", type=_shape_arg, action="append",
                   help="an ONNX input's shape where the model leaves dimensions symbolic (default 1)")
    o.add_argument("--input", metavar="NAME=FILE.npy", type=_input_arg, action="append",
                   help="an ONNX input fixed at load time (repeatable; folded as a constant, an If on it inlined): a "
                        ".npy file (or an .npz holding an array NAME or input.NAME) or a number filling its shape "
                        "(e.g. sr=16000)")
    o.add_argument("--training", action="store_true", help="the forward + backward (training) graph")
    o.add_argument("--seq", type=int, help="tokens per sequence of a shipped model (default 16; an ONNX file's "
                                           "inputs take --shape)")
    o.add_argument("--batch", type=int, help="sentences per batch, minilm only (default 2)")
    add_engine_options(o)
    add_precision(o)
    o.add_argument("--report", action="store_true",
                   help="per rule and ruleset: matches, extracted e-nodes and what it saves (re-optimises without "
                        "each rule that fired; JSON keys rules and rulesets)")
    o.add_argument("--verify", action="store_true", help="check the result on the numpy reference")
    o.add_argument("--dump-egglog", metavar="FILE", help="write the egglog program for replay")
    o.add_argument("--dot", nargs=2, metavar=("BEFORE.svg", "AFTER.svg"),
                   help="draw the graph before and after (Graphviz; without it the DOT text is written)")
    o.add_argument("--dot-eclass", nargs=2, metavar=("NODE", "FILE.svg"),
                   help="draw the e-class of graph node NODE in the saturated e-graph, and the e-classes below it")
    o.add_argument("--dot-depth", type=int, default=2, help="levels of e-classes below, for --dot-eclass (default 2)")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.set_defaults(func=cmd_optimize)

    c = sub.add_parser("check-sound", help="saturate a graph and evaluate every e-node of every e-class with the "
                                           "numpy reference: is each rule that fired sound on it?")
    c.add_argument("model", help="as for optimize: a shipped model, an .onnx file, module:function or "
                                 "file.py:function")
    c.add_argument("--rulesets", metavar="NAME,NAME", type=_names,
                   help="the rulesets to saturate with (default all; yours as module:NAME or file.py:NAME)")
    c.add_argument("--with-ruleset", metavar="NAME", action="append", default=[],
                   help="also an optional ruleset or one of your own (module:NAME, file.py:NAME), repeatable")
    c.add_argument("--disable-rule", metavar="NAME", action="append", default=[], help="leave out one rule")
    c.add_argument("--shape", metavar="NAME=DxD...", type=_shape_arg, action="append",
                   help="an ONNX input's shape where the model leaves dimensions symbolic (default 1)")
    c.add_argument("--seq", type=int, help="tokens per sequence of a shipped model (default 16)")
    c.add_argument("--training", action="store_true", help="the forward + backward graph")
    c.add_argument("--seed", type=int, default=0, help="the random inputs' seed (default 0)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_check_sound)

    r = sub.add_parser("rules", help="list every rewrite rule by ruleset")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--with-ruleset", metavar="MODULE:NAME", action="append", default=[],
                   help="also list a ruleset of your own (make_ruleset; module:NAME or file.py:NAME), repeatable")
    r.set_defaults(func=cmd_rules)
    add_cache(sub)
    add_train_digits(sub)
    add_generate(sub)
    add_run(sub)
    add_sweep(sub)
    p.set_defaults(subcommands=sub.choices)  # main: an unknown option is reported by its subcommand
    return p


def _parse(argv: list[str] | None) -> argparse.Namespace:
    # argparse reports a subcommand's unknown option with the top-level usage; report it with the
    # subcommand's usage instead, and the closest option the subcommand has
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        command = args.subcommands[args.command]
        options = [o for action in command._actions for o in action.option_strings]
        hints = []
        for word in extra:
            close = difflib.get_close_matches(word.split("=")[0], options, n=1) if word.startswith("-") else []
            if close:
                hints.append(f"{word}: did you mean {close[0]}?")
        command.error(f"unrecognized arguments: {' '.join(extra)}" + "".join(f"; {h}" for h in hints))
    del args.subcommands
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except EggfuseError as e:
        print(f"eggfuse: error: {e}", file=sys.stderr)
        for note in getattr(e, "__notes__", ()):  # what the command adds (e.g. run: the inputs were random)
            print(f"eggfuse: {note}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`eggfuse rules | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file the command writes (--save, --profile, --dot, --dump-egglog) or reads
        if not e.filename:  # not about a path the user gave: a real failure, with its traceback
            raise
        print(f"eggfuse: error: {e.strerror or e}: {e.filename!r} (a file to write needs a folder that exists and "
              "that you can write)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
