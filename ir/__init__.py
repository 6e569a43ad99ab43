"""IR: op graph, tensor types, op registry and the numpy reference semantics."""

from . import ops_backward  # noqa: F401, I001  (registers the loss and gradient ops into OPS)
from . import ops_fused  # noqa: F401  (registers the fused and vision ops into OPS)
from . import ops_extra  # noqa: F401, I001  (registers the rest of the seed's ops into OPS)
from . import ops_train  # noqa: F401, I001  (registers the optimiser updates into OPS)
from . import ops_cache  # noqa: F401, I001  (registers the KV-cache ops into OPS)
from .errors import (
    DeviceError,
    EggfuseError,
    GraphError,
    InputError,
    LoweringError,
    ModelError,
    RewriteError,
)
from .graph import Graph, Node, NodeId
from .ops import OPS, OpDef
from .reference import evaluate
from .types import DType, TensorType

__all__ = [
    "OPS", "DType", "DeviceError", "EggfuseError", "Graph", "GraphError", "InputError",
    "LoweringError", "ModelError", "Node", "NodeId", "OpDef", "RewriteError", "TensorType", "evaluate",
]
