"""Runtime: the wgpu device, cached pipelines and Session.run."""

from .device import adapter_description, get_device
from .session import Session

__all__ = ["Session", "adapter_description", "get_device"]
