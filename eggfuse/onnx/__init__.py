"""ONNX import: models from other exporters, run by eggfuse.

- :func:`load` imports an ONNX file (or ``ModelProto``) as an eggfuse :class:`~eggfuse.ir.Graph`
  and its parameters, for fixed input shapes; ``eggfuse.compile`` and ``optimize`` take it
  as any graph.
- :class:`Model` runs a model, importing and compiling one plan per set of input shapes.
- :mod:`eggfuse.onnx.backend` is an ``onnx.backend.base.Backend`` for onnx's test runner.

Requires the ``onnx`` package (the ``onnx`` extra). Converters per ONNX op type live in
:mod:`eggfuse.onnx.ops`, one module per family; ``CONVERTERS`` lists them.
"""

from eggfuse.ir import InputError, OnnxError, UnsupportedOpsError

from . import ops  # noqa: F401  (registers the converters)
from .importer import CONVERTERS, NodeContext, Value, converter, load
from .model import Model, Specialised

__all__ = ["CONVERTERS", "InputError", "Model", "NodeContext", "OnnxError", "Specialised", "UnsupportedOpsError",
           "Value", "converter", "load"]
