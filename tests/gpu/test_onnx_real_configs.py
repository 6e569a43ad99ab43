"""Every Conv, ConvTranspose, pooling and Resize node configuration of the third-party ONNX files
the project targets (rapidocr-onnxruntime's PP-OCRv4 det / rec and PP-OCR mobile cls,
livekit-plugins-silero's silero_vad.onnx, If branches included) converts and matches
onnxruntime.

Each distinct configuration (op type, attributes, weight shape, bias or not, Resize's constant
inputs) becomes a one-node model with the file's own weights and a random input whose spatial
size fits the window; the end-to-end runs of the files are tests of their own.
``PYTHONPATH=tests .venv/bin/python tests/gpu/test_onnx_real_configs.py`` prints the configurations.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_ort_check import check_against_ort  # tests/onnx_ort_check.py

OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "Resize")
DISTRIBUTIONS = {"rapidocr-onnxruntime": ("ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx",
                                          "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
                 "livekit-plugins-silero": ("silero_vad.onnx",)}


def model_files() -> dict[str, Path]:
    """File name -> path of each target file that is installed."""
    out = {}
    for dist, names in DISTRIBUTIONS.items():
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            path = Path(f.locate()).resolve()
            if path.name in names and path.exists():
                out.setdefault(path.name, path)
    return out


def _walk(graph: onnx.GraphProto):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk(a.g)


def configurations(path: Path) -> list[dict]:
    """The distinct configurations of OPS in the file at ``path``: op, opset, attributes, the
    weight and bias (arrays) and Resize's constant inputs."""
    m = onnx.load(str(path))
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    known = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for n in _walk(m.graph):
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            known[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    seen, out = set(), []
    for n in _walk(m.graph):
        if n.op_type not in OPS:
            continue
        consts = [known.get(i) if i else None for i in n.input[1:]]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        key = (n.op_type, repr(sorted(attrs.items())), tuple(None if c is None else (c.shape, c.tobytes()[:64])
                                                            for c in consts[1:]),
               None if not consts or consts[0] is None else consts[0].shape, len(n.output))
        if key in seen:
            continue
        seen.add(key)
        out.append(dict(file=path.name, op=n.op_type, opset=opset, attrs=attrs, inputs=list(n.input), consts=consts,
                        outputs=len(n.output)))
    return out


def _input_shape(cfg: dict) -> list[int]:
    """A small input for the configuration: channels from the weight, each spatial axis long
    enough for the (dilated) window."""
    a, consts = cfg["attrs"], cfg["consts"]
    if cfg["op"] in ("Conv", "ConvTranspose"):
        w = consts[0]
        channels = w.shape[1] * a.get("group", 1) if cfg["op"] == "Conv" else w.shape[0]
        kernel = list(w.shape[2:])
    else:
        channels, kernel = 3, list(a.get("kernel_shape", [1, 1]))
    dil = a.get("dilations", [1] * len(kernel))
    return [1, channels, *[max(11, (k - 1) * d + 1 + 5) for k, d in zip(kernel, dil, strict=True)]]


def one_node_model(cfg: dict) -> tuple[onnx.ModelProto, dict]:
    names, inits = ["x"], []
    for i, (name, c) in enumerate(zip(cfg["inputs"][1:], cfg["consts"], strict=True)):
        if not name:
            names.append("")
            continue
        if c is None:
            raise ValueError(f"{cfg['file']}: input {i + 1} of a {cfg['op']} node is not a constant")
        names.append(f"c{i}")
        inits.append(numpy_helper.from_array(c, f"c{i}"))
    shape = _input_shape(cfg)
    outputs = ["y", "i"][:cfg["outputs"]]
    node = helper.make_node(cfg["op"], names, outputs, **cfg["attrs"])
    graph = helper.make_graph([node], "config", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT if o == "y" else
                                                             onnx.TensorProto.INT64, None) for o in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg["opset"])])
    return m, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def _describe(cfg: dict) -> str:
    attrs = ",".join(f"{k}={v.decode() if isinstance(v, bytes) else v}" for k, v in sorted(cfg["attrs"].items()))
    w = cfg["consts"][0] if cfg["consts"] and cfg["op"] != "Resize" else None
    extra = f" w{list(w.shape)}{'+b' if len(cfg['consts']) > 1 else ''}" if w is not None else ""
    if cfg["op"] == "Resize":
        extra = " " + " ".join(f"{n}={c.tolist()}" for n, c in zip(("roi", "scales", "sizes"), cfg["consts"],
                                                                    strict=False) if c is not None)
    return f"{cfg['file']}: {cfg['op']}({attrs}){extra}"


FILES = model_files()
CONFIGS = [cfg for path in FILES.values() for cfg in configurations(path)]


def test_the_target_files_are_installed():
    # scripts/setup.sh installs both distributions; without them the table below is empty
    missing = {name for names in DISTRIBUTIONS.values() for name in names} - set(FILES)
    if missing:
        pytest.skip(f"not installed (scripts/setup.sh installs them): {', '.join(sorted(missing))}")
    ops = {cfg["op"] for cfg in CONFIGS}
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize"} <= ops, ops


@pytest.mark.parametrize("cfg", CONFIGS, ids=[_describe(c) for c in CONFIGS])
def test_configuration_converts_and_matches_onnxruntime(cfg, device):
    m, feeds = one_node_model(cfg)
    check_against_ort(m, feeds, rtol=1e-4, atol=1e-5, device=device)


if __name__ == "__main__":
    for cfg in CONFIGS:
        print(_describe(cfg))
