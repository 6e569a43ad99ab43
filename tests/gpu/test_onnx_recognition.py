"""Recognition in ONNX graphs written as exporters write them (torch.onnx's classic exporter
before opset 17 and its dynamo exporter; tests/onnx_models.py builds them with onnx.helper):
the recognised op is in the plan that runs, and the plan's outputs on the GPU equal
onnxruntime's, at odd sizes, with broadcasts, a shared intermediate and an output that the
fused op would swallow."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx_models import F, model, node  # tests/onnx_models.py

from eggfuse.onnx import Model

_RNG = np.random.default_rng(16)


class Chain:
    """An ONNX graph under construction: nodes, initializers, and scalar constants written as
    Constant nodes (the classic exporter) or as initializers (the dynamo exporter)."""

    def __init__(self, scalars: str = "constant") -> None:
        self.nodes, self.inits, self.scalars, self.n = [], [], scalars, 0

    def _name(self, op: str) -> str:
        self.n += 1
        return f"{op.lower()}_{self.n}"

    def const(self, value: float) -> str:
        name = self._name("c")
        arr = np.array(value, np.float32)
        if self.scalars == "constant":
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr)))
        else:
            self.inits.append((name, arr))
        return name

    def param(self, shape) -> str:
        name = self._name("w")
        self.inits.append((name, (1.0 + 0.3 * _RNG.standard_normal(shape)).astype(np.float32)))
        return name

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        out = self._name(op)
        self.nodes.append(node(op, list(inputs), [out], name=f"/{out}", **attrs))
        return out

    def mean(self, x: str, opset: int) -> str:
        if opset >= 18:  # axes an input from opset 18
            axes = self._name("axes")
            self.inits.append((axes, np.array([-1], np.int64)))
            return self("ReduceMean", x, axes)
        return self("ReduceMean", x, axes=[-1])

    def model(self, inputs, outputs, opset: int):
        return model(self.nodes, [(n, F, s) for n, s in inputs], [(o, F, None) for o in outputs], self.inits,
                     opset=opset)


def _run(m, feeds, *, expect: dict[str, int], rtol=2e-4, atol=2e-5) -> Counter:
    """Run ``m`` through eggfuse.onnx.Model on the GPU and through onnxruntime; the outputs agree
    (relative ``rtol``, absolute ``atol`` of each output's scale: an element that sums cancel to
    near zero keeps the rounding error of the sum's terms) and the plan that ran holds at least
    ``expect[op]`` nodes of each op; returns the plan's op counts."""
    mdl = Model(m, cache=False)
    got = mdl.run(feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max())))
    plan = mdl.specialise(feeds).compiled.graph
    ops = Counter(n.op for n in plan.live_nodes())
    for op, k in expect.items():
        assert ops[op] >= k, (op, dict(ops))
    return ops


# --- LayerNorm ------------------------------------------------------------------------------------


def _layer_norm(c: Chain, x: str, opset: int, width: int = 13, *, eps=1e-12, weight=True, bias=True, weight_first=False,
                recip=False, square="Pow"):
    mean = c.mean(x, opset)
    d = c("Sub", x, mean)
    sq = c("Pow", d, c.const(2.0)) if square == "Pow" else c("Mul", d, d)
    var = c.mean(sq, opset)
    den = c("Sqrt", c("Add", var, c.const(eps)) if eps is not None else var)
    normed = c("Mul", d, c("Reciprocal", den)) if recip else c("Div", d, den)
    y = normed
    if weight:
        w = c.param([width])
        y = c("Mul", w, y) if weight_first else c("Mul", y, w)
    if bias:
        y = c("Add", y, c.param([width]))
    return y, mean, normed


@pytest.mark.parametrize("form", ["classic14", "dynamo", "no-eps", "no-bias", "no-affine", "weight-first",
                                  "reciprocal", "mul-square"])
def test_decomposed_layer_norm_is_one_layer_norm(form):
    opset = 18 if form in ("dynamo", "no-eps") else 14
    c = Chain("initializer" if opset >= 18 else "constant")
    y, _, _ = _layer_norm(c, "x", opset, eps=None if form == "no-eps" else 1e-12, bias=form not in ("no-bias",
                          "no-affine"), weight=form != "no-affine", weight_first=form in ("weight-first", "dynamo"),
                          recip=form == "reciprocal", square="Mul" if form == "mul-square" else "Pow")
    m = c.model([("x", [2, 5, 13])], [y], opset)
    x = (3.0 + 2.0 * _RNG.standard_normal((2, 5, 13))).astype(np.float32)
    ops = _run(m, {"x": x}, expect={"LayerNorm": 1})
    assert sum(ops.values()) - ops["LayerNorm"] == ops["Input"] + ops["Parameter"], dict(ops)


def test_layer_norm_with_its_mean_and_normalised_value_as_outputs():
    # the mean (a multi-use intermediate) and the normalised value before the weight (which the
    # fused op would swallow) are graph outputs too
    c = Chain()
    y, mean, normed = _layer_norm(c, "x", 14)
    m = c.model([("x", [3, 7, 13])], [y, mean, normed], 14)
    ops = _run(m, {"x": _RNG.standard_normal((3, 7, 13)).astype(np.float32)}, expect={"LayerNorm": 1})
    assert ops["ReduceMean"] >= 1


def test_layer_norm_feeding_a_matmul_and_a_broadcast_residual():
    c = Chain()
    h = c("Add", "x", "r")  # r [13] broadcast over [1, 9, 13]
    y, _, _ = _layer_norm(c, h, 14)
    out = c("Add", c("MatMul", y, c.param([13, 11])), c.param([11]))
    m = c.model([("x", [1, 9, 13]), ("r", [13])], [out], 14)
    _run(m, {"x": _RNG.standard_normal((1, 9, 13)).astype(np.float32),
             "r": _RNG.standard_normal(13).astype(np.float32)}, expect={"LayerNorm": 1, "FusedMatMul": 1})


# --- RMSNorm (LLaMA) -------------------------------------------------------------------------------


def _rms_norm(c: Chain, x: str, width: int, opset: int, form: str):
    ms = c.mean(c("Pow", x, c.const(2.0)) if form != "mul-square" else c("Mul", x, x), opset)
    a = c("Add", ms, c.const(1e-6))
    if form == "classic":  # torch.rsqrt under the classic exporter: Div(1, Sqrt)
        normed = c("Mul", x, c("Div", c.const(1.0), c("Sqrt", a)))
    elif form == "pow":
        normed = c("Mul", c("Pow", a, c.const(-0.5)), x)
    elif form == "div":
        normed = c("Div", x, c("Sqrt", a))
    else:  # the dynamo exporter: Reciprocal(Sqrt)
        normed = c("Mul", x, c("Reciprocal", c("Sqrt", a)))
    return c("Mul", c.param([width]), normed), normed


@pytest.mark.parametrize("form", ["dynamo", "classic", "pow", "div", "mul-square"])
def test_decomposed_rms_norm_is_one_rms_norm(form):
    opset = 18 if form == "dynamo" else 17
    c = Chain("initializer" if form == "dynamo" else "constant")
    y, _ = _rms_norm(c, "x", 29, opset, form)
    m = c.model([("x", [2, 3, 29])], [y], opset)
    ops = _run(m, {"x": _RNG.standard_normal((2, 3, 29)).astype(np.float32)}, expect={"RmsNorm": 1})
    assert sum(ops.values()) == 1 + ops["Input"] + ops["Parameter"], dict(ops)


def test_rms_norm_before_a_projection_fuses_into_the_matmul_and_keeps_its_output():
    # HF LlamaRMSNorm -> q projection, the normalised value before the weight also an output
    c = Chain("initializer")
    y, normed = _rms_norm(c, "x", 29, 18, "dynamo")
    q = c("MatMul", y, c.param([29, 17]))
    m = c.model([("x", [1, 11, 29])], [q, normed], 18)
    _run(m, {"x": _RNG.standard_normal((1, 11, 29)).astype(np.float32)}, expect={"FusedRmsNormMatMul": 1})


# --- GELU ------------------------------------------------------------------------------------------


def _gelu(c: Chain, x: str, form: str) -> str:
    if form == "classic":  # torch.onnx's gelu symbolic
        p = c("Add", c("Erf", c("Div", x, c.const(math.sqrt(2.0)))), c.const(1.0))
        return c("Mul", c("Mul", x, p), c.const(0.5))
    if form == "python":  # x * 0.5 * (1 + erf(x / sqrt 2)), HF's old gelu
        p = c("Add", c.const(1.0), c("Erf", c("Div", x, c.const(math.sqrt(2.0)))))
        return c("Mul", c("Mul", x, c.const(0.5)), p)
    if form == "mul-rsqrt2":  # 0.5 * x * (1 + erf(x * 0.7071))
        p = c("Add", c("Erf", c("Mul", x, c.const(1 / math.sqrt(2.0)))), c.const(1.0))
        return c("Mul", c("Mul", c.const(0.5), x), p)
    if form == "tanh-classic":  # torch's tanh GELU under the classic exporter
        cube = c("Mul", x, c("Mul", x, x))
        inner = c("Mul", c.const(math.sqrt(2 / math.pi)), c("Add", x, c("Mul", c.const(0.044715), cube)))
        return c("Mul", c.const(0.5), c("Mul", x, c("Add", c.const(1.0), c("Tanh", inner))))
    # tanh-new: HF's NewGELUActivation (gelu_new)
    cubic = c("Mul", c("Pow", x, c.const(3.0)), c.const(0.044715))
    inner = c("Mul", c("Add", x, cubic), c.const(math.sqrt(2 / math.pi)))
    return c("Mul", c("Mul", x, c.const(0.5)), c("Add", c("Tanh", inner), c.const(1.0)))


@pytest.mark.parametrize("form", ["classic", "python", "mul-rsqrt2", "tanh-classic", "tanh-new"])
def test_decomposed_gelu_is_one_gelu(form):
    c = Chain("initializer" if form == "tanh-new" else "constant")
    y = _gelu(c, "x", form)
    m = c.model([("x", [3, 5, 7])], [y], 17)
    op = "GeluTanh" if form.startswith("tanh") else "Gelu"
    x = (3.0 * _RNG.standard_normal((3, 5, 7))).astype(np.float32)
    ops = _run(m, {"x": x}, expect={op: 1})
    assert sum(ops.values()) == 1 + ops["Input"], dict(ops)


@pytest.mark.parametrize("form", ["classic", "tanh-new"])
def test_gelu_after_a_matmul_is_its_epilogue(form):
    # BERT's intermediate dense + GELU: MatMul on [1, 9, 13], bias first, the activation folded into the store
    c = Chain()
    h = c("Add", c.param([19]), c("MatMul", "x", c.param([13, 19])))
    m = c.model([("x", [1, 9, 13])], [_gelu(c, h, form)], 17)
    ops = _run(m, {"x": _RNG.standard_normal((1, 9, 13)).astype(np.float32)}, expect={"FusedMatMul": 1})
    assert ops["FusedMatMul"] == 1 and sum(ops.values()) == 1 + ops["Input"] + ops["Parameter"] + ops["Identity"]


# --- SiLU and SwiGLU (LLaMA's MLP) -----------------------------------------------------------------


def test_llama_mlp_becomes_one_packed_gate_up_matmul_and_swiglu():
    c = Chain("initializer")
    gate = c("MatMul", "x", c.param([29, 37]))
    up = c("MatMul", "x", c.param([29, 37]))
    act = c("Mul", gate, c("Sigmoid", gate))
    down = c("MatMul", c("Mul", act, up), c.param([37, 29]))
    m = c.model([("x", [1, 7, 29])], [down], 18)
    # 7 rows: the gate/up product applies the gate in its second dispatch (ir/ops/matmul_rows.py)
    ops = _run(m, {"x": _RNG.standard_normal((1, 7, 29)).astype(np.float32)}, expect={"FusedMatMulSwiGLU": 1})
    assert ops["Sigmoid"] == 0 and ops["Mul"] == 0, dict(ops)
