"""Converters from ONNX op types to IR nodes, one module per family (each registers its
converters with ``eggfuse.onnx.importer.converter``)."""

from . import core, linalg, resize, vision  # noqa: F401
