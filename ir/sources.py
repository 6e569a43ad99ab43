"""Objects named on a command line as ``module:name`` or ``path/to/file.py:name``: a graph source
(``eggfuse optimize module:function``) or a cost model (``--cost-model module:Class``)."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import EggfuseError, InputError

#: The name under which a module given as ``path/to/file.py`` is imported (then its stem).
SOURCE_MODULE_PREFIX = "_eggfuse_source_"

#: The folder a relative ``file.py`` path is taken from, and a ``module`` that ``sys.path`` lacks is imported
#: from; None: the current folder. A sweep's run sets it to the folder the sweep was started from, so that a
#: worker started elsewhere (a Dask worker) finds what the command's folder holds, not what its own does.
SOURCE_FOLDER: ContextVar[str | None] = ContextVar("eggfuse_source_folder", default=None)


def _folder() -> str:
    return SOURCE_FOLDER.get() or os.getcwd()


def _load_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{SOURCE_MODULE_PREFIX}{path.stem}", path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    # its own imports of modules beside it, as a script's (python file.py puts its folder first on sys.path): as
    # when the same module is imported by name from there
    with _first_on_path(str(path.parent)):
        spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _first_on_path(folder: str) -> Iterator[None]:
    # ``folder`` first on sys.path for the imports inside, where it is not on it already
    if folder in sys.path:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _one_file_module(where: str, folder: str) -> Path | None:
    """The ``.py`` file that a fresh import of the top-level module ``where`` finds (on ``sys.path``, else in
    ``folder``), whatever ``sys.modules`` holds; None where it is not one such file (a package, a builtin, a
    dotted name, none found)."""
    if "." in where or not where.isidentifier() or where in sys.builtin_module_names:
        return None
    try:
        found = (importlib.machinery.PathFinder.find_spec(where)
                 or importlib.machinery.PathFinder.find_spec(where, [folder]))
    except (ImportError, ValueError):
        return None
    if (found is None or not found.has_location or found.submodule_search_locations is not None
            or not str(found.origin or "").endswith(".py")):
        return None
    return Path(found.origin).resolve()


def _module(where: str) -> ModuleType:
    if where.endswith(".py"):
        return _load_file((Path(_folder()) / Path(where).expanduser()).resolve())
    folder = _folder()
    imported = sys.modules.get(where)
    if imported is not None and getattr(imported, "__file__", None):
        # a module of this name imported before from another folder (the command's folder changed, or a
        # sweep's SOURCE_FOLDER differs): the file a fresh import finds now, not the one imported then
        path = _one_file_module(where, folder)
        if path is not None and Path(imported.__file__).resolve() != path:
            return _load_file(path)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        # a module of the folder the command runs from, as `python -m` finds it (the console script's own
        # folder comes first on sys.path instead); only where the module is not found elsewhere
        if e.name != where.split(".")[0] or folder in sys.path:
            raise
    with _first_on_path(folder):
        return importlib.import_module(where)


def resolved_source(spec: str, folder: str | None = None) -> str:
    """``spec`` (``module:name`` or ``path/to/file.py:name``) named so that it means the same object from any
    folder: a ``file.py`` path made absolute (taken from ``folder``, default the current one; symbolic links
    followed), and a top-level ``module`` that is one ``.py`` file (found on ``sys.path``, else in ``folder``,
    as :func:`named_object` looks, searched afresh: not a module of that name imported before) as that
    file's absolute path. A package's module, a module that is not a
    ``.py`` file, and one not found are left as given (imported by name, from ``folder`` where ``sys.path``
    lacks them, see :data:`SOURCE_FOLDER`). Imports nothing; raises nothing."""
    folder = folder or os.getcwd()
    where, sep, name = spec.rpartition(":")
    if not sep or not where:
        return spec
    if where.endswith(".py"):
        return f"{(Path(folder) / Path(where).expanduser()).resolve()}:{name}"
    path = _one_file_module(where, folder)
    return spec if path is None else f"{path}:{name}"


def named_object(spec: str, what: str, kind: str) -> Any:
    """The object ``name`` of ``module:name`` (a module importable from ``sys.path`` or the current folder)
    or of ``path/to/file.py:name``. Raises :class:`InputError` naming ``what`` (e.g. ``"graph source"``) and
    ``spec`` when the module does not import (with its error) or has no such name (a ``kind``, e.g.
    ``"function"``)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise InputError(f"{what} {spec!r}: give module:name or path/to/file.py:name")
    try:
        module = _module(where)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import
        raise InputError(f"{what} {spec!r}: cannot import {where!r}: {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        public = [n for n in vars(module) if not n.startswith("_")]
        close = difflib.get_close_matches(name, public, n=1, cutoff=0.6)
        raise InputError(f"{what} {spec!r}: {where} has no {kind} {name!r}"
                         + (f" (did you mean {close[0]!r}?)" if close else ""))
    return getattr(module, name)


def call_without_arguments(fn: Callable[[], Any], spec: str, what: str) -> Any:
    """``fn()``. Raises :class:`InputError` naming ``what`` and ``spec`` instead of Python's TypeError where
    ``fn`` (a function or a class) has parameters without defaults, and where ``fn()`` raises (the exception
    chained; an eggfuse error, such as a builder's GraphError, passes through as it is)."""
    name = getattr(fn, "__name__", repr(fn))
    kind = "class" if inspect.isclass(fn) else "function"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # none to read (a builtin): called as it is
        signature = None
    try:
        if signature is not None:
            signature.bind()
    except TypeError as e:  # a parameter without a default
        raise InputError(f"{what} {spec!r}: eggfuse calls {name}() with no arguments, but {name}{signature} "
                         f"requires some ({e}); give its parameters defaults, or name a {kind} that takes "
                         "none") from None
    try:
        return fn()
    except EggfuseError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the user's function raises
        raise InputError(f"{what} {spec!r}: {name}() raised {type(e).__name__}: {e}") from e


__all__ = ["SOURCE_FOLDER", "SOURCE_MODULE_PREFIX", "call_without_arguments", "named_object", "resolved_source"]
