"""Shared fixtures. GPU tests run on any adapter (lavapipe without a GPU) and fail, never
skip, when there is none."""

import pytest


@pytest.fixture(scope="session")
def device():
    """The process-wide wgpu device (eggfuse.runtime.get_device)."""
    from eggfuse.runtime import get_device

    return get_device()
