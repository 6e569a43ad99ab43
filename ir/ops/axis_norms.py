"""Softmaxes and normalisations over any axes, with ONNX's semantics: SoftmaxAxis,
LogSoftmaxAxis, Hardmax, LpNormalization, MeanVarianceNormalization, BatchNormalization
(inference) and LRN.

The last-axis Softmax, LogSoftmax, LayerNorm, RmsNorm and GroupNorm of ``norms.py`` keep
their place (and their rules and gradients): the ONNX converters use them wherever an ONNX
op maps onto them, and these ops for the rest. SoftmaxAxis, LogSoftmaxAxis, LpNormalization
and MeanVarianceNormalization share one kernel over a stride table (``axis_norm.wgsl``),
Hardmax the ArgMax kernel (``arg_reduce.wgsl``).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Kernel, elementwise_groups
from ..spec import Attr, need, need_axes, need_f32, op
from .reduce_axes import INFERENCE, arg_kernel, check_axes, layout_params

FAMILY = "axis_norms"


def _axis_f32(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need_axes([a["axis"]], x)
    return x


def _axis_norm_kernel(node, ins, target, axes: tuple[int, ...], centre: int, term: str, out: str) -> Kernel:
    params, offsets, n, per_group = layout_params(ins[0].shape, axes)
    entry = "per_group" if per_group else "per_element"
    return Kernel(f"{node.op.lower()}_{entry}", "axis_norm.wgsl", n if per_group else elementwise_groups(n),
                  params=params, entry_point=entry, slots={"CENTRE": str(centre), "TERM": term, "OUT": out, **offsets})


# --- SoftmaxAxis, LogSoftmaxAxis, Hardmax ----------------------------------------------------------


def _softmax_axis_ref(xs, a):
    x = np.moveaxis(xs[0], a["axis"], -1)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.moveaxis(e / e.sum(axis=-1, keepdims=True), -1, a["axis"])


def _log_softmax_last(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _softmax_axis_kernel(node, ins, target) -> Kernel:
    out = "exp(v - c) / s" if node.op == "SoftmaxAxis" else "(v - c) - log(s)"
    return _axis_norm_kernel(node, ins, target, (node.attrs["axis"],), 1, "exp(v - c)", out)


_AXIS = (Attr("axis", "int", doc="non-negative"),)
op("SoftmaxAxis", ("x",), _axis_f32, _softmax_axis_ref, attrs=_AXIS, vjp=INFERENCE, kernel=_softmax_axis_kernel,
   flops=lambda ins, out, a: 4 * out.num_elements,
   doc="softmax along one axis, max-subtracted: exp(x - max) / sum exp(x - max); ONNX Softmax from opset 13 "
       "(https://onnx.ai/onnx/operators/onnx__Softmax.html). The last axis is the Softmax op")
op("LogSoftmaxAxis", ("x",), _axis_f32,
   lambda xs, a: np.moveaxis(_log_softmax_last(np.moveaxis(xs[0], a["axis"], -1)), -1, a["axis"]), attrs=_AXIS,
   vjp=INFERENCE, kernel=_softmax_axis_kernel, flops=lambda ins, out, a: 4 * out.num_elements,
   doc="x - max - log(sum exp(x - max)) along one axis; ONNX LogSoftmax from opset 13 "
       "(https://onnx.ai/onnx/operators/onnx__LogSoftmax.html). The last axis is the LogSoftmax op")


def _hardmax_ref(xs, a):
    x, axis = xs[0], a["axis"]
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1.0, axis=axis)
    return out


def _hardmax_kernel(node, ins, target) -> Kernel:
    store = "for (var j = li; j < p.n; j = j + step) { out[base + j * p.inner] = select(0.0, 1.0, j == idx); }"
    return arg_kernel(node, ins[0], node.attrs["axis"], "bv > av", False, store)


op("Hardmax", ("x",), _axis_f32, _hardmax_ref, attrs=_AXIS, vjp=INFERENCE, kernel=_hardmax_kernel,
   doc="1.0 at the first largest element along axis (a NaN before any number, numpy argmax), 0.0 elsewhere; "
       "ONNX Hardmax from opset 13 (https://onnx.ai/onnx/operators/onnx__Hardmax.html)")


# --- LpNormalization, MeanVarianceNormalization ---------------------------------------------------


def _lp_infer(ts, a):
    need(a["p"] in (1, 2), f"p must be 1 or 2, got {a['p']}")
    return _axis_f32(ts, a)


def _lp_ref(xs, a):
    x = xs[0]
    norm = np.sum(np.abs(x) if a["p"] == 1 else x * x, axis=a["axis"], keepdims=True)
    norm = norm if a["p"] == 1 else np.sqrt(norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norm == 0, 0.0, x / norm)


def _lp_kernel(node, ins, target) -> Kernel:
    term, out = (("abs(v)", "select(v / s, 0.0, s == 0.0)") if node.attrs["p"] == 1
                 else ("v * v", "select(v / sqrt(s), 0.0, s == 0.0)"))
    return _axis_norm_kernel(node, ins, target, (node.attrs["axis"],), 0, term, out)


op("LpNormalization", ("x",), _lp_infer, _lp_ref, attrs=(*_AXIS, Attr("p", "int", 2)), vjp=INFERENCE,
   kernel=_lp_kernel, flops=lambda ins, out, a: 3 * out.num_elements,
   doc="x / ||x||_p along axis, p 1 or 2, no epsilon; a zero line gives zeros, as onnx's backend cases and "
       "onnxruntime do; ONNX LpNormalization "
       "(https://onnx.ai/onnx/operators/onnx__LpNormalization.html)")

#: ONNX MeanVarianceNormalization's epsilon, added to the standard deviation.
MVN_EPS = 1e-9


def _mvn_infer(ts, a):
    need_f32(ts[0], "input")
    check_axes(ts[0], a["axes"])
    return ts[0]


def _mvn_ref(xs, a):
    x, axes = xs[0], tuple(a["axes"])
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / (np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True)) + MVN_EPS)


op("MeanVarianceNormalization", ("x",), _mvn_infer, _mvn_ref,
   attrs=(Attr("axes", "ints", doc="non-negative, sorted, distinct"),), vjp=INFERENCE,
   kernel=lambda node, ins, target: _axis_norm_kernel(node, ins, target, node.attrs["axes"], 2, "(v - c) * (v - c)",
                                                      f"(v - c) / (sqrt(s / f32(p.red_len)) + {MVN_EPS})"),
   flops=lambda ins, out, a: 6 * out.num_elements,
   doc="(x - mean) / (std + 1e-9) over the axes, std the biased standard deviation (computed around the mean; "
       "ONNX's function body writes it as sqrt(E[x^2] - E[x]^2)); ONNX MeanVarianceNormalization "
       "(https://onnx.ai/onnx/operators/onnx__MeanVarianceNormalization.html)")


# --- BatchNormalization (inference), LRN -----------------------------------------------------------


def _batch_norm_infer(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank >= 2, f"input must be [N, C, ...], got {x}")
    for t, what in zip(ts[1:], ("scale", "bias", "input_mean", "input_var"), strict=True):
        need_f32(t, what)
        need(t.shape == (x.shape[1],), f"{what} must be [{x.shape[1]}] (one per channel of {x}), got {t}")
    return x


def _batch_norm_ref(xs, a):
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    r = lambda v: v.reshape(shape)  # noqa: E731
    return (x - r(mean)) / np.sqrt(r(var) + a["epsilon"]) * r(scale) + r(bias)


def _batch_norm_kernel(node, ins, target) -> Kernel:
    shape = node.type.shape
    n = node.type.num_elements
    return Kernel("batch_norm", "batch_norm.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("channels", "u32", shape[1]), ("inner", "u32", math.prod(shape[2:])),
                          ("eps", "f32", node.attrs["epsilon"])))


op("BatchNormalization", ("x", "scale", "bias", "input_mean", "input_var"), _batch_norm_infer, _batch_norm_ref,
   attrs=(Attr("epsilon", "float", 1e-5, minimum=0.0),), vjp=INFERENCE, kernel=_batch_norm_kernel,
   flops=lambda ins, out, a: 5 * out.num_elements,
   doc="(x - mean[c]) / sqrt(var[c] + epsilon) * scale[c] + bias[c] per channel c = axis 1, with the given running "
       "statistics (inference mode; Ioffe & Szegedy 2015); ONNX BatchNormalization "
       "(https://onnx.ai/onnx/operators/onnx__BatchNormalization.html)")


def _lrn_infer(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank >= 2, f"input must be [N, C, ...], got {x}")
    need(a["size"] >= 1, f"size must be >= 1, got {a['size']}")
    return x


def _lrn_ref(xs, a):
    x = xs[0]
    n, c = x.shape[:2]
    v = x.reshape(n, c, -1)
    lo, hi = (a["size"] - 1) // 2, math.ceil((a["size"] - 1) / 2)
    q = np.stack([(v[:, max(0, k - lo):min(c, k + hi + 1)] ** 2).sum(axis=1) for k in range(c)], axis=1)
    return (v / (a["bias"] + a["alpha"] / a["size"] * q) ** a["beta"]).reshape(x.shape)


def _lrn_kernel(node, ins, target) -> Kernel:
    shape, a = node.type.shape, node.attrs
    n = node.type.num_elements
    size = a["size"]
    return Kernel("lrn", "lrn.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("channels", "u32", shape[1]), ("spatial", "u32", math.prod(shape[2:])),
                          ("lo", "u32", (size - 1) // 2), ("hi", "u32", math.ceil((size - 1) / 2)),
                          ("size", "u32", size), ("alpha", "f32", a["alpha"]), ("beta", "f32", a["beta"]),
                          ("bias", "f32", a["bias"])))


op("LRN", ("x",), _lrn_infer, _lrn_ref,
   attrs=(Attr("size", "int"), Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75), Attr("bias", "float", 1.0)),
   vjp=INFERENCE, kernel=_lrn_kernel, flops=lambda ins, out, a: (2 * a["size"] + 4) * out.num_elements,
   doc="x / (bias + alpha / size * sum of x^2 over the size channels around c)^beta, x [N, C, ...] (Krizhevsky "
       "et al. 2012); ONNX LRN (https://onnx.ai/onnx/operators/onnx__LRN.html)")
