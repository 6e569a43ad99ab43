"""Locating the files of an installed model package without importing it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eggfuse.ir import ModelError


def package_dir(package: str, setup_hint: str) -> Path:
    """The folder of the installed package ``package`` (an import name).

    Found with ``importlib.util.find_spec`` and never imported: the model packages'
    ``__init__`` pull in llama-cpp-python or sentence-transformers. Raises
    :class:`ModelError` ending in ``setup_hint`` when the package is not installed.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"package {package!r} is not installed; {setup_hint}")
    return Path(list(spec.submodule_search_locations)[0])
