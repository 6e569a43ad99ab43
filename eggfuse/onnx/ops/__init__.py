"""Converters from ONNX op types to IR nodes, one module per family (each registers its
converters with ``eggfuse.onnx.importer.converter``)."""

from . import arithmetic, attention, core, indexing, movement, norms, recurrent, reductions, unary  # noqa: F401
