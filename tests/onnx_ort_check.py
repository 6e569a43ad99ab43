"""Run an ONNX model through eggfuse and through onnxruntime (the reference) and compare, for
the converter tests of tests/gpu/test_onnx_*.py."""

from __future__ import annotations

import numpy as np
import onnx

from eggfuse.onnx import Model


def ort_outputs(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check_against_ort(proto: onnx.ModelProto, feeds: dict, rtol: float = 1e-4, atol: float = 1e-5,
                      device=None) -> Model:
    """Assert that eggfuse's outputs match onnxruntime's (dtype, shape and values; ``atol``
    scaled by the largest expected magnitude); returns the eggfuse Model (its plans)."""
    want = ort_outputs(proto, feeds)
    model = Model(proto, device=device)
    got = model.run(feeds)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, g.shape, w.dtype, w.shape)
        scale = max(1.0, float(np.abs(w[np.isfinite(w)]).max())) if w.size and np.isfinite(w).any() else 1.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=f"output {k}")
    return model


def plan_ops(model: Model) -> list[str]:
    """The IR ops of the (single) imported plan's graph, in order, leaves left out."""
    (spec,) = model.plans.values()
    return [n.op for n in spec.graph.nodes if n.op not in ("Input", "Parameter", "Constant")]
