"""``eggfuse run MODEL.onnx``: run an ONNX model on the GPU and print what it did; and the
ONNX half of ``eggfuse optimize MODEL.onnx``.

Inputs come from ``--input NAME=FILE.npy`` (or an .npz holding an array NAME or ``input.NAME``, as
``scripts/export_torch_fixtures.py`` writes them), or ``--input NAME=NUMBER`` (every element that value,
e.g. a sample rate); inputs not given get random values (floats N(0, 1), integers in [0, 10),
booleans), of the model's shapes, with ``--shape NAME=2x3x224x224`` for dimensions the model leaves
symbolic (default 1). Random values need not be valid for a model: a window larger than a
1-sized dimension, a rate or an index it checks; give such inputs with ``--shape`` and ``--input``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from eggfuse.cli_cache import add_no_cache, add_precision
from eggfuse.ir import DamagedFileError, DeviceLimitError, EggfuseError, InputError, RewriteError, UnsupportedOpsError


def _shape_arg(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    parts = dims.lower().replace(",", "x").split("x")
    if not sep or not name or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=DxDx... with every dimension a positive integer "
                                         f"(e.g. x=1x3x64x256), got {text!r}")
    return name, [int(p) for p in parts]


def shape_map(pairs: list[tuple[str, list[int]]] | None) -> dict[str, list[int]]:
    """``--shape`` values as a dict; InputError for a name given twice with different shapes."""
    out: dict[str, list[int]] = {}
    for name, dims in pairs or []:
        if name in out and out[name] != dims:
            raise InputError(f"--shape gives {name!r} twice: {'x'.join(map(str, out[name]))} and "
                             f"{'x'.join(map(str, dims))}; give it once")
        out[name] = dims
    return out


def input_map(pairs: list[tuple[str, str]] | None) -> dict[str, str]:
    """``--input`` values as a dict; InputError for a name given twice with different values."""
    out: dict[str, str] = {}
    for name, source in pairs or []:
        if name in out and out[name] != source:
            raise InputError(f"--input gives {name!r} twice: {out[name]!r} and {source!r}; give it once")
        out[name] = source
    return out


def _number(text: str) -> float | None:
    # the value of --input NAME=NUMBER, or None where the text names a file or is not a number
    if Path(text).exists():
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy or NAME=NUMBER, got {text!r}")
    return name, path


def load_time_values(path: str, given: list[tuple[str, str]] | None, shapes: dict[str, list[int]]
                     ) -> dict[str, np.ndarray]:
    """``eggfuse optimize``'s ``--input NAME=FILE.npy|NUMBER`` pairs as arrays (read as :func:`feeds_for` reads
    them; a number fills the input's shape, its symbolic dimensions from ``shapes`` or 1), for
    ``load(..., values=)``: inputs fixed at load time. Raises InputError as :func:`feeds_for`."""
    if not given:
        return {}
    from eggfuse.onnx import Model

    names = input_map(given)
    return {n: a for n, a in feeds_for(Model(path), names, shapes).items() if n in names}


def feeds_for(model, given: dict[str, str], shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """The feeds of ``model`` (an :class:`eggfuse.onnx.Model`): arrays loaded from ``given``
    (name -> .npy path, or a number: the input's shape filled with it in its dtype), random values
    of the model's shapes for the others (symbolic dimensions from ``shapes``, a named one from the
    shape given for another input that has it, or of another input's .npy array, else 1). Raises
    InputError for an unknown name, a bad file, or a number the input's dtype cannot hold."""
    from eggfuse.onnx.importer import elem_numpy, overridable_inputs, unknown_input

    for name in [*given, *shapes]:
        if name not in model.input_names:
            raise unknown_input(name, model.input_names, InputError, defaults=overridable_inputs(model.proto))
    rng = np.random.default_rng(seed)
    loaded = {}  # the .npy arrays, read first: their shapes size the named dimensions of the other inputs
    for name, source in given.items():
        if _number(source) is None:
            try:
                arr = np.load(source, allow_pickle=False)
            except OSError as e:
                raise InputError(f"input {name!r}: cannot read {source!r} ({e.strerror or e})") from None
            except ValueError as e:  # numpy's message for bytes that are no .npy guesses a pickle: not what to tell
                if "Object arrays cannot be loaded" in str(e):  # a .npy of Python objects (strings, None, ...)
                    raise InputError(f"input {name!r}: {source!r} holds an array of Python objects, not numbers "
                                     "(eggfuse reads numeric .npy files only, never pickles): save a numeric "
                                     "array, arr.astype('float32')") from None
                raise InputError(f"input {name!r}: {source!r} is not a .npy or .npz array file (numpy.save / "
                                 "numpy.savez write them)") from None
            if isinstance(arr, np.lib.npyio.NpzFile):  # an .npz: the array named as the input, or input.NAME
                with arr:
                    key = next((k for k in (name, f"input.{name}") if k in arr.files), None)
                    if key is None:
                        raise InputError(f"input {name!r}: {source!r} is an .npz without an array {name!r} or "
                                         f"'input.{name}' (it holds {', '.join(arr.files) or 'none'}); give a .npy "
                                         "file or an .npz with such an array")
                    arr = arr[key]
            loaded[name] = arr
            if name in shapes and list(shapes[name]) != list(arr.shape):
                raise InputError(f"--shape {name}={'x'.join(map(str, shapes[name]))} and --input {name} "
                                 f"({source!r}, shape {list(arr.shape)}) disagree: give one of them")
    sized = input_shapes(model.inputs, {**{n: list(a.shape) for n, a in loaded.items()}, **shapes})
    feeds = {}
    for vi in model.inputs:
        shape = sized[vi.name]
        dtype = elem_numpy(vi.type.tensor_type.elem_type)
        value = _number(given[vi.name]) if vi.name in given else None
        if value is not None:
            if dtype.kind in "iu":
                fits = value.is_integer() and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max
            elif dtype.kind == "b":
                fits = value in (0.0, 1.0)
            else:  # nan and inf are values of every float dtype (Model.run takes them); a finite one must fit
                with np.errstate(over="ignore"):
                    fits = not np.isfinite(value) or bool(np.isfinite(dtype.type(value)))
            if not fits:
                raise InputError(f"input {vi.name!r}: {given[vi.name]!r} is not a value of its dtype {dtype.name}; "
                                 f"give one it holds, or the array in a .npy file")
            feeds[vi.name] = np.full(shape, value).astype(dtype)
            continue
        if vi.name in loaded:
            feeds[vi.name] = loaded[vi.name]
            continue
        if dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[vi.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def cmd_run(args: argparse.Namespace) -> None:
    from eggfuse.onnx import Model

    if args.repeats < 0:
        raise InputError(f"repeats must be >= 0, got {args.repeats}")
    if args.model.suffix.lower() == ".py" or (":" in args.model.name and not args.model.exists()):
        raise InputError(f"eggfuse run takes an .onnx file, not {str(args.model)!r}: a graph built in Python "
                         "(module:function or file.py:function) runs from Python with eggfuse.compile(graph, "
                         "params).run(inputs), and eggfuse optimize shows what the rewrites make of it")
    if args.no_fuse and args.precision == "f16":
        raise InputError("--precision f16 stores weights through the rewrite engine: drop --no-fuse, or run f32")
    if args.no_fuse and (args.with_ruleset or args.disable_rule):
        what = "--with-ruleset adds rules to" if args.with_ruleset else "--disable-rule leaves a rule out of"
        raise InputError(f"{what} the rewrite engine, which --no-fuse leaves out: give one")
    t = time.perf_counter()
    rulesets = None
    if args.with_ruleset or args.disable_rule:
        from eggfuse.cli_options import refuse_f16
        from eggfuse.rewrites.rulesets import select

        refuse_f16(args.with_ruleset, args.precision)
        rulesets = select(None, args.disable_rule, optional=args.with_ruleset, precision=args.precision)
    if args.verify and args.no_fuse:
        raise InputError("--verify compares the rewrite engine's graph with the unfused one, which --no-fuse runs "
                         "alone: give one")
    if args.verify and args.precision == "f16":
        raise InputError("--verify compares with the f32 graph and would refuse the f16 weights' rounding: use it "
                         "with --precision f32")
    model = Model(args.model, fuse=not args.no_fuse, cache=not args.no_cache, precision=args.precision,
                  rulesets=rulesets, verify=args.verify)
    given = input_map(args.input)
    feeds = feeds_for(model, given, shape_map(args.shape), args.seed)
    try:
        spec = model.specialise(feeds)
        if spec.compiled is not None:  # random indices within the tables they index (the plan's index_bounds, and
            # of an input read in parts the smallest part's table: index_parts)
            rng = np.random.default_rng(args.seed)
            plan = spec.compiled.plan
            bounds = dict(plan.index_bounds)
            for name, parts in getattr(plan, "index_parts", {}).items():
                bounds[name] = min([bounds.get(name, parts[0].rows), *(p.rows for p in parts)])
            for name, rows in bounds.items():
                if name not in given and name in feeds and rows < 10:
                    feeds[name] = rng.integers(0, rows, np.shape(feeds[name])).astype(feeds[name].dtype)
        first = time.perf_counter() - t
        outs = model.run(feeds)
    except EggfuseError as e:
        drawn = [f"{n} {list(np.shape(a))}" for n, a in feeds.items() if n not in given]
        # an error about an input the user gave, naming none drawn at random, is about that input alone
        about_given = (any(f"input {n!r}" in str(e) for n in given)
                       and not any(f"input {n!r}" in str(e) for n in feeds if n not in given))
        if drawn and not about_given and not isinstance(e, DamagedFileError | UnsupportedOpsError | DeviceLimitError
                                                        | RewriteError):  # --verify: its own random inputs
            # the model may only fail on values it was never meant to get (a damaged file, an op eggfuse lacks or a
            # device limit fails on any)
            e.add_note(f"hint: inputs drawn at random: {', '.join(drawn)} (symbolic dimensions 1 unless --shape "
                       f"gives them, for the input or another with the same named dimension; integers in [0, 10), "
                       f"or below the rows of a table they index); "
                       f"give the model's real shapes with --shape NAME=DxD... "
                       f"and real values with --input NAME=FILE.npy")
        raise
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        model.run(feeds)
        runs.append(time.perf_counter() - t)
    compiled = spec.compiled
    info = {
        "model": str(args.model), "adapter": compiled.adapter if compiled else None,
        "onnx_nodes": len(model.proto.graph.node),
        "inputs": {n: list(np.shape(a)) for n, a in feeds.items()},
        "outputs": {n: {"shape": list(o.shape), "dtype": str(o.dtype)} for n, o in zip(model.output_names, outs,
                                                                                        strict=True)},
        "dispatches_unfused": compiled.dispatches_unfused if compiled else 0,
        "dispatches_fused": compiled.dispatches_fused if compiled else 0,
        "plan_dispatches": compiled.plan_dispatches if compiled else 0,
        "cache": compiled.cache if compiled else "off",
        "memory": {"run": compiled.plan.memory()} if compiled else {},
        "precision": args.precision, "f16_weights": compiled.f16_weights if compiled else [],
        "timings_s": {**{k: round(v, 4) for k, v in spec.timings.items()}, "first_run_s": round(first, 4),
                      "run_median_ms": round(1e3 * float(np.median(runs)), 3) if runs else None},
    }
    if args.save:
        target = str(args.save) if str(args.save).endswith(".npz") else f"{args.save}.npz"  # what numpy.savez writes
        np.savez(target, **dict(zip(model.output_names, outs, strict=True)))
        info["saved"] = target
    if args.profile and compiled is not None:
        from eggfuse.runtime.profile import profile

        runtime = {n: a for n, a in feeds.items() if n not in spec.values}
        prof = profile(compiled.session, runtime)
        prof.write_chrome_trace(args.profile)
        info["profile"] = str(args.profile)
    if args.json:
        print(json.dumps(info))
        return
    print(f"model: {info['model']} ({info['onnx_nodes']} ONNX nodes)")
    print(f"adapter: {info['adapter']}")
    given = input_map(args.input)
    for name, shape in info["inputs"].items():
        src = "random" if name not in given else "file" if _number(given[name]) is None else f"= {given[name]}"
        print(f"input  {name}: {shape} ({src})")
    for name, o in info["outputs"].items():
        print(f"output {name}: {o['shape']} {o['dtype']}")
    from eggfuse.cli_generate import dispatches_line, memory_line, precision_line

    print(dispatches_line(info["dispatches_unfused"], info["dispatches_fused"], info["plan_dispatches"],
                          fuse=not args.no_fuse))
    print("timings: " + ", ".join(f"{k} {v}" for k, v in info["timings_s"].items()))
    print(f"compile cache: {info['cache']}")
    if info["memory"]:
        print(precision_line(args.precision, info["f16_weights"]))
        print(memory_line(info["memory"]))
    if args.profile and compiled is not None:
        print(prof.table())
        print(f"Chrome/Perfetto trace written to {args.profile}")
    if args.save:
        print(f"outputs written to {info['saved']}")


def input_shapes(inputs, given: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each input's shape: as ``given``, else the model's, a symbolic dimension taking the size a given
    shape gives its name (a dim_param shared across inputs: batch, seq), else 1."""
    from eggfuse.onnx.importer import _dims

    named = _named_sizes(inputs, given)
    return {vi.name: list(given[vi.name]) if vi.name in given else
            [d if isinstance(d, int) and d > 0 else named.get(d, 1) for d in _dims(vi)] for vi in inputs}


def defaulted_inputs(inputs, given: dict[str, list[int]]) -> list[str]:
    """The inputs :func:`input_shapes` gives a dimension of 1 that nothing sized: not given, with a
    symbolic dimension no given shape names."""
    from eggfuse.onnx.importer import _dims

    named = _named_sizes(inputs, given)
    return [vi.name for vi in inputs if vi.name not in given and any(
        not (isinstance(d, int) and d > 0) and d not in named for d in _dims(vi))]


def _named_sizes(inputs, given: dict[str, list[int]]) -> dict[str, int]:
    # a symbolic dimension's name -> the size a given shape gives it
    from eggfuse.onnx.importer import _dims

    named: dict[str, int] = {}
    for vi in inputs:
        if vi.name in given:
            named.update((d, s) for d, s in zip(_dims(vi), given[vi.name], strict=False) if isinstance(d, str))
    return named


def onnx_graph(path: str, shapes: dict[str, list[int]], values: dict[str, np.ndarray] | None = None):
    """The graph of the ONNX model at ``path`` for ``eggfuse optimize`` (symbolic dimensions
    from ``shapes``; a named one an input's given shape sizes, as ``eggfuse run`` does; else 1;
    ``values``: inputs fixed at load time, as ``load(..., values=)``), its ONNX node count, the ONNX node
    each graph node came from (node id -> name), and the inputs with a symbolic dimension nothing sized
    (taken as 1). Raises InputError for a name of ``shapes`` that is not an input."""
    from eggfuse.onnx import load  # noqa: F401  (registers the converters)
    from eggfuse.onnx.importer import Importer, _load_proto, graph_inputs, overridable_inputs, unknown_input

    proto = _load_proto(path)
    inputs = graph_inputs(proto)
    names = [vi.name for vi in inputs]
    for name in shapes:
        if name not in names:
            raise unknown_input(name, names, InputError, defaults=overridable_inputs(proto))
    sizes = {**{n: list(np.shape(a)) for n, a in (values or {}).items()}, **shapes}
    importer = Importer(proto, input_shapes(inputs, sizes), dict(values or {}))
    graph, _, _ = importer.run()
    return graph, len(proto.graph.node), importer.origin, defaulted_inputs(inputs, sizes)


def add_run(sub) -> None:
    """Register ``run`` on the CLI's subparsers."""
    r = sub.add_parser("run", help="run an ONNX model; print its outputs' shapes, dispatches and timings")
    r.add_argument("model", type=Path, help="an .onnx file")
    r.add_argument("--input", metavar="NAME=FILE.npy", type=_input_arg, action="append",
                   help="an input's value (repeatable): a .npy file (or an .npz holding an array NAME or "
                        "input.NAME), or a number filling the input's shape (e.g. sr=16000); inputs not given get "
                        "random values")
    r.add_argument("--shape", metavar="NAME=DxD...", type=_shape_arg, action="append",
                   help="a random input's shape where the model leaves dimensions symbolic (default 1)")
    r.add_argument("--repeats", type=int, default=10, help="timed runs after the first (default 10)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    r.add_argument("--save", metavar="OUT.npz", help="write the outputs, by name")
    r.add_argument("--no-fuse", action="store_true", help="run the graph without the rewrite engine")
    r.add_argument("--with-ruleset", metavar="NAME", action="append", default=[],
                   help="also run an optional ruleset (repeatable): layer_norm_prologue (a LayerNorm as the next "
                        "product's prologue: one dispatch fewer a product, measured slower on an H200), "
                        "gathered_products (GatheredBatchMatMul: a gather of a product's elements computed alone, "
                        "measured slower on an H100), or a ruleset of your own (make_ruleset) as module:NAME or "
                        "file.py:NAME, on top of the default ones")
    r.add_argument("--disable-rule", metavar="NAME", action="append", default=[],
                   help="leave out one rule, named as `eggfuse rules` lists it (repeatable): the plan without it, "
                        "to time what the rule pays")
    r.add_argument("--verify", action="store_true",
                   help="before running, evaluate the optimised graph and the unfused one with the numpy reference on "
                        "random inputs and refuse a difference (RewriteError naming the output): a rule of your own "
                        "that is unsound is caught here (eggfuse check-sound names the rule)")
    add_no_cache(r)
    add_precision(r)
    r.add_argument("--profile", metavar="TRACE.json", nargs="?", const="eggfuse-trace.json",
                   help="print GPU time per kernel and write a Chrome/Perfetto trace")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
