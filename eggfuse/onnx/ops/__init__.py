"""Converters from ONNX op types to IR nodes, one module per family (each registers its
converters with ``eggfuse.onnx.importer.converter``)."""

from . import attention, core, recurrent  # noqa: F401
