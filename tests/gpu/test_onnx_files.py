"""Other people's ONNX files, run by eggfuse.onnx.Model against onnxruntime (CPU), on
realistic inputs (tests/onnx_files.py): PP-OCRv4 text detection, recognition and the
orientation classifier (paddle2onnx exports) on a line of handwritten digits, and silero VAD
(a PyTorch export with If branches and LSTMs) on a speech-like signal, chunk by chunk with its
state carried. Each output must match within 1e-3 of its scale (max |onnxruntime output|)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_files import ort_optimised, ppocr, ppocr_input, silero, silero_chunks, speech  # tests/onnx_files.py

from eggfuse.onnx import Model

PPOCR = [("det", 64, 256), ("rec", 48, 320), ("cls", 48, 192)]


def _close(got: np.ndarray, want: np.ndarray, what: str) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= 1e-3 * max(scale, 1e-6), f"{what}: max |diff| {err:.3g} against scale {scale:.3g}"
    return err / max(scale, 1e-30)


@pytest.mark.parametrize(("kind", "height", "width"), PPOCR, ids=[k for k, _, _ in PPOCR])
def test_ppocr_matches_onnxruntime(kind, height, width, tmp_path):
    path = ppocr(kind)
    x = ppocr_input(kind, height, width)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert float(want.std()) > 0.01  # the input makes the model say something
    model = Model(path)
    (got,) = model.run({"x": x})
    _close(got, want, f"PP-OCR {kind}")
    spec = next(iter(model.plans.values()))
    # Constant nodes fold and reshapes are views: fewer dispatches than nodes; fusing never adds one
    nodes = len(onnx.load(str(path)).graph.node)
    assert spec.compiled.dispatches_fused <= spec.compiled.dispatches_unfused < nodes
    # fewer kernels than onnxruntime runs: the nodes of its optimised graph (FusedConv, Conv + BN
    # folded, ...), with and without its NCHWc layout transform (bench/ppocr_nodes.py)
    for level in ("ORT_ENABLE_ALL", "ORT_ENABLE_EXTENDED"):
        ort_nodes = len(ort_optimised(path, x.shape, tmp_path / f"{level}.onnx", level).graph.node)
        assert spec.compiled.dispatches_fused < ort_nodes, (level, spec.compiled.dispatches_fused, ort_nodes)


def test_silero_vad_matches_onnxruntime_chunk_by_chunk():
    path = silero()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = Model(path)
    sr = np.array(16000, dtype=np.int64)
    state_ort = state_ours = np.zeros((2, 1, 128), np.float32)
    probs = []
    for x in silero_chunks(speech(512 * 8))[:8]:
        p_ort, state_ort = sess.run(None, {"input": x, "state": state_ort, "sr": sr})
        p_ours, state_ours = model.run({"input": x, "state": state_ours, "sr": sr})
        _close(p_ours, p_ort, "speech probability")
        _close(state_ours, state_ort, "LSTM state")
        probs.append(float(p_ort.ravel()[0]))
    assert max(probs) > 0.5  # the signal is taken for speech
    assert len(model.plans) == 1  # one plan: sr bound at load time, the same shapes every chunk
