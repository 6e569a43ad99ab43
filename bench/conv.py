"""Convolution time on PP-OCRv4 det's shapes: eggfuse's Conv / ConvTranspose kernels against
onnxruntime's CPU execution provider, one node at a time.

The Conv and ConvTranspose nodes of rapidocr-onnxruntime's ``ch_PP-OCRv4_det_infer.onnx`` with
their shapes at an input of ``--size`` (onnx shape inference; default 640 x 640), grouped into
distinct configurations. Each configuration is one graph holding the node (random weights of
its shape, bias included): ours are GPU timestamps around ``--calls`` back-to-back runs of its
plan (``gpu_timing.gpu_per_call``), the peer onnxruntime's wall time for the same one-node
model (``--calls`` runs, after a warm-up). On a machine without a GPU both run on the same CPU
(ours through lavapipe).

Columns (JSON fields, one row per configuration): ``op``, ``x``, ``w``, ``group``,
``strides``, ``count`` (nodes of the model with it), ``kernel`` (our kernel), ``ours_ms`` /
``peer_ms`` (median per call over ``--repeats`` samples), ``ratio`` = ours / peer,
``ours_gflops`` (2 MACs per weight tap per output). The summary line weights each row by its
count: the model's convolutions, run one after another.

    .venv/bin/python bench/conv.py --size 320 --json bench/results/conv_lavapipe.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from eggfuse.ir import Graph
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session, get_device

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

MODEL = "ch_PP-OCRv4_det_infer.onnx"


def det_model() -> Path:
    for f in importlib.metadata.files("rapidocr-onnxruntime") or []:
        if f.name == MODEL:
            return Path(f.locate())
    raise SystemExit(f"{MODEL} not found: install rapidocr-onnxruntime (scripts/setup.sh does)")


def configurations(size: int) -> list[dict]:
    """The det model's Conv / ConvTranspose nodes at a [1, 3, size, size] input, grouped."""
    m = onnx.load(str(det_model()))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims, [1, 3, size, size], strict=True):
        d.ClearField("dim_param")
        d.dim_value = v
    m = shape_inference.infer_shapes(m)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.value_info}
    shapes[m.graph.input[0].name] = [1, 3, size, size]
    weights = {t.name: list(t.dims) for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant":
            weights[n.output[0]] = list(n.attribute[0].t.dims)
    rows: dict[tuple, dict] = {}
    for n in m.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        key = (n.op_type, tuple(shapes[n.input[0]]), tuple(weights[n.input[1]]), len(n.input) > 2,
               tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())))
        rows.setdefault(key, dict(op=n.op_type, x=shapes[n.input[0]], w=weights[n.input[1]], bias=len(n.input) > 2,
                                  attrs=attrs, count=0))["count"] += 1
    return list(rows.values())


def one_node(cfg: dict) -> tuple[onnx.ModelProto, dict, dict]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal(cfg["w"]).astype(np.float32) * 0.1
    out_channels = cfg["w"][1] * cfg["attrs"].get("group", 1) if cfg["op"] == "ConvTranspose" else cfg["w"][0]
    inits = [numpy_helper.from_array(w, "w")]
    if cfg["bias"]:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b"))
    node = helper.make_node(cfg["op"], ["x", "w"] + (["b"] if cfg["bias"] else []), ["y"], **cfg["attrs"])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, cfg["x"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return proto, {"x": rng.standard_normal(cfg["x"]).astype(np.float32)}, {"w": w}


def time_ours(proto: onnx.ModelProto, feeds: dict, device, calls: int, repeats: int) -> tuple[float, str, Graph]:
    from eggfuse.onnx import load

    graph, params = load(proto)
    session = Session(lower_for(graph, device), params, device=device)
    session.run(feeds)
    kernel = session.plan.dispatches[0].kernel
    samples = gpu_timing.gpu_per_call(session, calls, repeats)
    if samples is None:
        samples = gpu_timing.wall_per_call(session, [feeds] * calls, repeats)
    return gpu_timing.median_p90(samples)[0], kernel, graph


def time_peer(proto: onnx.ModelProto, feeds: dict, calls: int, repeats: int) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            session.run(None, feeds)
        out.append((time.perf_counter() - t) / calls)
    return gpu_timing.median_p90(out)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=640, help="input height and width (a multiple of 32)")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    device = get_device()
    rows = []
    for cfg in configurations(args.size):
        proto, feeds, _ = one_node(cfg)
        ours, kernel, graph = time_ours(proto, feeds, device, args.calls, args.repeats)
        peer = time_peer(proto, feeds, args.calls, args.repeats)
        out = graph.node(graph.outputs[0]).type.shape
        taps = math.prod(cfg["w"][1:]) if cfg["op"] == "Conv" else cfg["w"][1] * math.prod(cfg["w"][2:])
        flops = 2 * math.prod(out if cfg["op"] == "Conv" else cfg["x"]) * taps
        row = dict(op=cfg["op"], x=cfg["x"], w=cfg["w"], group=cfg["attrs"].get("group", 1),
                   strides=cfg["attrs"].get("strides"), count=cfg["count"], kernel=kernel, ours_ms=ours * 1e3,
                   peer_ms=peer * 1e3, ratio=ours / peer, ours_gflops=flops / ours / 1e9)
        rows.append(row)
        print(f"{row['op']:<14}{str(row['x']):<20}{str(row['w']):<18}g{row['group']:<4}x{row['count']:<3}"
              f"{row['kernel'][:34]:<35}{row['ours_ms']:9.2f} ms{row['peer_ms']:9.2f} ms  {row['ratio']:5.2f}"
              f"{row['ours_gflops']:7.2f} GFLOP/s", flush=True)
    ours = sum(r["ours_ms"] * r["count"] for r in rows)
    peer = sum(r["peer_ms"] * r["count"] for r in rows)
    adapter = device.adapter_info["device"]
    print(f"all {sum(r['count'] for r in rows)} convolutions at {args.size}x{args.size} on {adapter}: ours "
          f"{ours:.1f} ms, onnxruntime CPU {peer:.1f} ms, ratio {ours / peer:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"size": args.size, "adapter": adapter, "rows": rows,
                                         "ours_ms": ours, "peer_ms": peer}, indent=1))


if __name__ == "__main__":
    main()
