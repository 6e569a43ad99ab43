"""IR: op graph, tensor types, the op specs (one block per op, ``ir.ops``) and the numpy
reference semantics."""

from . import ops  # noqa: F401  (registers every op family into OPS, see ir/ops/__init__.py)
from .errors import (
    DamagedFileError,
    DeviceError,
    DeviceLimitError,
    EggfuseError,
    GraphError,
    IndexRangeError,
    InputError,
    LoweringError,
    ModelError,
    OnnxError,
    RewriteError,
    UnsupportedOpsError,
)
from .graph import Graph, Node, NodeId, require_graph
from .reference import evaluate
from .spec import NO_GRAD, OPS, RULES, Attr, OpSpec, ShapeError
from .types import DType, TensorType

__all__ = [
    "NO_GRAD", "OPS", "RULES", "Attr", "DamagedFileError", "DType", "DeviceError", "DeviceLimitError", "EggfuseError",
    "Graph", "GraphError", "IndexRangeError", "InputError", "LoweringError", "ModelError", "Node", "NodeId",
    "OnnxError", "OpSpec", "RewriteError", "ShapeError", "TensorType", "UnsupportedOpsError", "evaluate",
    "require_graph",
]
