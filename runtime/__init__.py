"""Runtime: the wgpu device, cached pipelines, Session.run and the Trainer."""

from .device import adapter_description, get_device
from .session import Session
from .trainer import Trainer

__all__ = ["Session", "Trainer", "adapter_description", "get_device"]
