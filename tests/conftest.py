"""Shared fixtures. GPU tests run on any adapter (lavapipe without a GPU) and fail, never
skip, when there is none."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def compile_cache_folder(tmp_path_factory):
    """The compile cache of the test session: an empty folder of its own (``EGGFUSE_CACHE``),
    so that no test reads or writes the user's cache, nor depends on what an earlier run left
    in one. Tests that need a cache of their own set ``EGGFUSE_CACHE`` with monkeypatch."""
    folder = tmp_path_factory.mktemp("compile-cache")
    before = os.environ.get("EGGFUSE_CACHE")
    os.environ["EGGFUSE_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("EGGFUSE_CACHE", None)
    else:
        os.environ["EGGFUSE_CACHE"] = before


@pytest.fixture(scope="session")
def device():
    """The process-wide wgpu device (eggfuse.runtime.get_device)."""
    from eggfuse.runtime import get_device

    return get_device()


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory):
    """``hf_folder(name, kind, model_type, **options)``: a model folder of tests/hf_folders.py
    (kind "decoder" or "encoder"), written once per session under ``name``."""
    import hf_folders

    root = tmp_path_factory.mktemp("hf")
    made = {}

    def make(name: str, kind: str, model_type: str, **options):
        if name not in made:
            build = hf_folders.decoder_folder if kind == "decoder" else hf_folders.encoder_folder
            made[name] = build(root / name, model_type, **options)
        return made[name]

    return make
