"""Small ONNX models built with onnx.helper, for the import tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def model(nodes, inputs, outputs, initializers=(), opset: int = 17):
    """A ModelProto of ``nodes``; ``inputs``/``outputs`` are (name, elem, shape) triples
    (shape None: unknown), ``initializers`` (name, array) pairs."""
    g = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node(op, inputs, outputs, name="", **attrs):
    return helper.make_node(op, inputs, outputs, name=name or f"{op}_{outputs[0]}", **attrs)
