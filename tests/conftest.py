"""Shared fixtures. GPU tests run on any adapter (lavapipe without a GPU) and fail, never
skip, when there is none."""

import pytest


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
