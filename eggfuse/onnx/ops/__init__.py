"""Converters from ONNX op types to IR nodes, one module per family (each registers its
converters with ``eggfuse.onnx.importer.converter``)."""

from . import (  # noqa: F401
    arithmetic,
    attention,
    core,
    indexing,
    linalg,
    movement,
    norms,
    recurrent,
    reductions,
    resize,
    training,
    unary,
    vision,
)
