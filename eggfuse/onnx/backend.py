"""An ``onnx.backend.base.Backend``: onnx's backend test runner drives eggfuse through it.

::

    import onnx.backend.test
    from eggfuse.onnx.backend import EggfuseBackend
    tests = onnx.backend.test.BackendTest(EggfuseBackend, __name__)
    tests.include(r"test_relu_.*_cpu")
    globals().update(tests.test_cases)

``prepare`` imports the model when its input shapes are fixed, so a model eggfuse cannot run
fails there with the reason (:class:`~eggfuse.ir.UnsupportedOpsError`,
:class:`~eggfuse.ir.OnnxError`); otherwise it imports per feed shapes at ``run``. Every
device string runs on eggfuse's wgpu device; ``supports_device`` accepts "CPU" (the runner's
CPU variants) only, as eggfuse's results do not depend on the runner's device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .importer import NeedsValuesError
from .model import Model


class EggfuseRep(BackendRep):
    """A prepared model: :meth:`run` takes inputs in order (or by name) and returns a tuple."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray] | np.ndarray, **kwargs: Any) -> tuple:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        return tuple(self.model.run(inputs))


class EggfuseBackend(Backend):
    """eggfuse as an ONNX backend (``prepare``, ``run_model``, ``supports_device``).

    ``prepare(model, device, fuse=True)``: ``fuse=False`` runs the unoptimised graph.
    """

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> EggfuseRep:
        super().prepare(model, device, **kwargs)
        m = Model(model, fuse=kwargs.get("fuse", True))
        if m.static:
            try:
                m.specialise()
            except NeedsValuesError:  # it needs an input's value: imported per value at run
                pass
        return EggfuseRep(m)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = EggfuseBackend.prepare
run_model = EggfuseBackend.run_model
supports_device = EggfuseBackend.supports_device
