"""Run a small ONNX model through eggfuse.onnx.Model and through a reference (onnxruntime,
or onnx's reference evaluator where onnxruntime lacks a kernel) and compare the outputs:
for the converter tests of tests/gpu/test_onnx_*.py."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator
from onnx_models import I64, B, F  # tests/onnx_models.py

from eggfuse.onnx import Model

I32 = TensorProto.INT32
_NP = {F: np.float32, I64: np.int64, I32: np.int32, B: np.bool_}
_RNG = np.random.default_rng(11)


def feed(elem: int, shape) -> np.ndarray:
    if elem == F:
        return _RNG.standard_normal(shape).astype(np.float32)
    if elem == B:
        return _RNG.integers(0, 2, size=shape).astype(bool)
    return _RNG.integers(-4, 5, size=shape).astype(_NP[elem])


def check(m, feeds: dict, reference: str = "ort", rtol: float = 1e-4, atol: float = 1e-5) -> list:
    """Run ``m`` through eggfuse and the reference; outputs agree in dtype, shape and value."""
    got = Model(m).run(feeds)
    if reference == "ort":
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
    else:
        want = ReferenceEvaluator(m).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got
