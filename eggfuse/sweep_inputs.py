"""What :func:`eggfuse.sweep.grid` is given, made ready for runs anywhere: graph and cost-model sources
resolved in the folder the sweep starts from (a Dask worker's own folder is another), each graph named once,
and ``--shape`` values checked and matched to the inputs of each graph they size."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def resolve(model: str, folder: str | None = None) -> str:
    """The graph source ``model`` names, as every worker finds it: a shipped model as given, an ``.onnx`` file's
    absolute path (taken from ``folder``, default the current one), ``module:function`` and
    ``file.py:function`` as :func:`~eggfuse.ir.sources.resolved_source`. Raises nothing: a source that is
    not found is left as given, and its runs fail with the reason."""
    from eggfuse.graphs import describe
    from eggfuse.ir.sources import resolved_source

    folder = folder or os.getcwd()
    kind = describe(model)
    if kind == "onnx":
        return str((Path(folder) / Path(model).expanduser()).resolve())
    if kind == "function":
        return resolved_source(model, folder)
    return model


def resolve_cost_model(spec: str, folder: str | None = None) -> str:
    """A cost model's name with a ``module:Class`` / ``file.py:Class`` resolved as :func:`resolve` does
    graph sources; the named ones (``bytes``, ``roofline:PROFILE``, ...) as given."""
    from eggfuse.ir.sources import resolved_source

    if not isinstance(spec, str) or ":" not in spec or spec.startswith("roofline:"):
        return spec
    return resolved_source(spec, folder)


def distinct_sources(models: list[str], folder: str) -> list[str]:
    """Each model's resolved source; InputError naming a graph given twice."""
    from eggfuse.ir import InputError

    seen: dict[str, str] = {}
    out = []
    for model in models:
        source = resolve(model, folder)
        if source in seen:
            same = (f"{seen[source]!r} and {model!r} both name {source}" if seen[source] != model
                    else f"{model!r} is given twice")
            raise InputError(f"models: {same}; give each graph once, and repeats (--repeats) to run each "
                             "configuration more than once")
        seen[source] = model
        out.append(source)
    return out


def shape_pairs(shapes) -> tuple:
    """``shapes`` as sorted ``(name, (dims...))`` pairs; InputError for anything else."""
    from eggfuse.cli_onnx import _shape_arg
    from eggfuse.ir import InputError

    form = "a list of (NAME, (D, D, ...)) pairs or 'NAME=DxD' strings, e.g. [('x', (8, 32))] or ['x=8x32']"
    if isinstance(shapes, str | bytes | Mapping) or not isinstance(shapes, Iterable):
        raise InputError(f"shapes must be {form}; got {type(shapes).__name__} {shapes!r}")
    out: dict[str, tuple[int, ...]] = {}
    for item in shapes:
        if isinstance(item, str):
            try:
                name, dims = _shape_arg(item)
            except Exception as e:  # noqa: BLE001 - argparse's error, as the CLI gives it
                raise InputError(f"shapes: {e}") from None
        elif (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str) and item[0]
              and isinstance(item[1], Sequence) and not isinstance(item[1], str) and item[1]
              and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in item[1])):
            name, dims = item
        else:
            raise InputError(f"shapes must be {form}, every dimension a positive integer; got {item!r}")
        dims = tuple(int(d) for d in dims)
        if name in out and out[name] != dims:
            raise InputError(f"shapes give {name!r} twice: {dims_text(out[name])} and {dims_text(dims)}; "
                             "give it once")
        out[name] = dims
    return tuple(sorted(out.items()))


def dims_text(dims) -> str:
    return "x".join(map(str, dims))


def applied_shapes(sources: list[str], shapes: tuple) -> dict[str, tuple]:
    """Per resolved source, the shapes that size its inputs: for an ``.onnx`` file those naming one of its
    inputs (all of them where the file cannot be read here: its runs then fail with the reason), for other
    sources none. InputError for a shape that sizes no graph of the sweep."""
    from eggfuse.graphs import describe
    from eggfuse.ir import InputError

    out: dict[str, tuple] = {}
    inputs: dict[str, list[str]] = {}
    unread = False
    for source in sources:
        if describe(source) != "onnx":
            out[source] = ()
            continue
        names = _onnx_inputs(source) if shapes else []
        if names is None:
            unread, out[source] = True, shapes
            continue
        inputs[source] = names
        out[source] = tuple((n, d) for n, d in shapes if n in names)
    if unread:
        return out
    for name, dims in shapes:
        if not any(name in names for names in inputs.values()):
            if not inputs:
                raise InputError(f"shape {name}={dims_text(dims)} sizes no graph of the sweep: shapes size the "
                                 "inputs of .onnx files, and none of the models is one; leave it out")
            listed = "; ".join(f"{Path(s).name}: {', '.join(map(repr, n)) or 'none'}" for s, n in inputs.items())
            raise InputError(f"shape {name}={dims_text(dims)}: {name!r} is an input of no .onnx file of the sweep "
                             f"(their inputs: {listed}); name one of those")
    return out


def _onnx_inputs(path: str) -> list[str] | None:
    """The inputs an ONNX file's caller feeds (initializers left out), or None where it cannot be read here."""
    try:
        import onnx

        from eggfuse.onnx.importer import graph_inputs

        return [vi.name for vi in graph_inputs(onnx.load(path, load_external_data=False))]
    except Exception:  # noqa: BLE001 - missing, unreadable, no onnx package: the runs say why
        return None


__all__ = ["applied_shapes", "dims_text", "distinct_sources", "resolve", "resolve_cost_model", "shape_pairs"]
