"""Pooling with ONNX semantics over 1 to 3 spatial axes: MaxPool (and MaxPoolIndices, its
second output), AveragePool and LpPool, with strides, dilations, explicit begin/end pads and
ceil_mode (the importer resolves ``auto_pad`` into pads and maps the global pools onto these
or onto GlobalAvgPool). Inference ops: training graphs use MaxPool2d (``vision.py``).

One kernel (``pool.wgsl``), one invocation per output, scanning its window; a tap outside the
input never counts (padding is -inf for the max, 0 for the sums).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups, nested_iterations
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType
from .conv import MAX_SPATIAL, geometry

FAMILY = "pooling"

_INFERENCE = no_grad("an inference op of the ONNX importer; MaxPool2d (vision family) has the gradient")


def pool_output(n: int, k: int, s: int, d: int, begin: int, end: int, ceil: bool) -> int:
    """Output length of a pooling axis: (n + begin + end - d (k - 1) - 1) / s + 1, floored, or
    ceiled when ``ceil`` but never so that the last window starts past the input and the
    begin padding (ONNX MaxPool / AveragePool; PyTorch's MaxPool1d has the same rule)."""
    span = n + begin + end - d * (k - 1) - 1
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= n + begin else out


def _pool(ts, a):
    x = ts[0]
    need_f32(x, "X")
    need(3 <= x.rank <= 2 + MAX_SPATIAL, f"X must be [N, C, ...] with 1 to {MAX_SPATIAL} spatial axes, got {x}")
    r = x.rank - 2
    k = tuple(a["kernel_shape"])
    need(len(k) == r and all(v >= 1 for v in k), f"kernel_shape {list(k)} must be {r} sizes >= 1 for {x}")
    strides, dilations, begin, end = geometry(a, r)
    need(all(p >= 0 for p in begin + end), f"pads must be >= 0, got {list(a['pads'])}")
    out = [pool_output(*v, a["ceil_mode"]) for v in zip(x.shape[2:], k, strides, dilations, begin, end, strict=True)]
    need(all(o >= 1 for o in out), f"a window of {list(k)} (dilations {list(dilations)}) is larger than the padded "
                                   f"input {x}")
    return TensorType((*x.shape[:2], *out), DType.I32 if "storage_order" in a else DType.F32)


def _windows(x, a):
    """Per kernel tap: the tapped values [N, C, *out] (clamped inside), whether the tap lies in
    the input, and whether it lies in the input or its padding (count_include_pad), as masks
    broadcastable to [*out]; and the tap's flat input index per position ([*out], row-major or,
    with storage_order 1, column-major over the spatial axes)."""
    shape = _pool([TensorType(x.shape)], a).shape
    r = x.ndim - 2
    strides, dilations, begin, end = geometry(a, r)
    order = range(r) if a.get("storage_order", 0) == 0 else range(r - 1, -1, -1)
    for tap in np.ndindex(*a["kernel_shape"]):
        idx, real, counted = [], [], []
        for ax in range(r):
            pos = np.arange(shape[2 + ax]) * strides[ax] + tap[ax] * dilations[ax] - begin[ax]
            view = [1] * r
            view[ax] = -1
            idx.append(np.clip(pos, 0, x.shape[2 + ax] - 1))
            real.append(((pos >= 0) & (pos < x.shape[2 + ax])).reshape(view))
            counted.append((pos < x.shape[2 + ax] + end[ax]).reshape(view))
        flat = 0
        for ax in order:
            flat = flat * x.shape[2 + ax] + idx[ax].reshape([-1 if i == ax else 1 for i in range(r)])
        yield (x[(slice(None), slice(None), *np.ix_(*idx))], functools.reduce(np.logical_and, real),
               functools.reduce(np.logical_and, counted), flat)


def _max_pool_ref(xs, a, indices: bool = False):
    x = xs[0]
    best, at = None, None
    for vals, real, _, flat in _windows(x, a):
        v = np.where(real, vals, -np.inf)
        if best is None:
            best, at = v, np.where(real, flat, -1) + np.zeros(v.shape, dtype=np.int64)
        else:
            better = v > best
            best, at = np.where(better, v, best), np.where(better, flat, at)
    if not indices:
        return best
    planes = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *(1,) * (x.ndim - 2))
    return np.where(at >= 0, at + planes * math.prod(x.shape[2:]), -1)


def _average_pool_ref(xs, a):
    total = count = 0.0
    for vals, real, counted, _ in _windows(xs[0], a):
        total = total + np.where(real, vals, 0.0)
        count = count + (counted if a["count_include_pad"] else real)
    return total / np.maximum(count, 1)


def _lp_pool_ref(xs, a):
    total = 0.0
    for vals, real, _, _ in _windows(xs[0], a):
        total = total + np.where(real, np.abs(vals) ** a["p"], 0.0)
    return total ** (1.0 / a["p"])


_MODE = {"MaxPool": 0, "AveragePool": 1, "LpPool": 2, "MaxPoolIndices": 3}
_STORE = {"MaxPool": "out[e] = select(bitcast<f32>(0xff800000u), best, found);  // -inf: no tap inside",
          "MaxPoolIndices": "out[e] = select(-1, i32(base + at), found);",
          "AveragePool": "out[e] = total / f32(max(count, 1u));",
          "LpPool": "out[e] = select(pow(total, 1.0 / p.p), 0.0, total == 0.0);"}


def _pad3(values, fill: int) -> list[int]:
    return [fill] * (MAX_SPATIAL - len(values)) + list(values)


def _pool_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    x = ins[0]
    r = x.rank - 2
    strides, dilations, begin, end = geometry(a, r)
    total = node.type.num_elements
    params = (("ins", "vec4<u32>", [*_pad3(x.shape[2:], 1), 0]),
              ("outs", "vec4<u32>", [*_pad3(node.type.shape[2:], 1), 0]),
              ("ker", "vec4<u32>", [*_pad3(a["kernel_shape"], 1), 0]), ("stride", "vec4<u32>", [*_pad3(strides, 1), 0]),
              ("dil", "vec4<u32>", [*_pad3(dilations, 1), 0]), ("pad", "vec4<i32>", [*_pad3(begin, 0), 0]),
              ("pad_end", "vec4<i32>", [*_pad3(end, 0), 0]), ("total", "u32", total),
              ("include_pad", "u32", int(a.get("count_include_pad", False))), ("p", "f32", float(a.get("p", 1))),
              ("col_major", "u32", int(a.get("storage_order", 0) == 1)))
    elem = node.type.dtype.wgsl
    return Kernel(f"pool_{node.op}", "pool.wgsl", elementwise_groups(total), params=params,
                  slots={"MODE": _MODE[node.op], "STORE": _STORE[node.op]},
                  bindings=(Buffer("x"), Buffer("out", elem, write=True)),
                  loop_iterations=nested_iterations(*_pad3(a["kernel_shape"], 1)))


def _pool_flops(ins, out, a):
    return out.num_elements * math.prod(a["kernel_shape"])


_ATTRS = (Attr("kernel_shape", "ints"), Attr("strides", "ints", ()), Attr("pads", "ints", ()),
          Attr("dilations", "ints", ()), Attr("ceil_mode", "bool", False))
_SHAPE = ("[N, C, ...] -> [N, C, ...] over 1 to 3 spatial axes, out = (in + pad_begin + pad_end - d (k - 1) - 1) / s "
          "+ 1, floored, or ceiled with ceil_mode unless the last window would start past the input and the begin "
          "padding; the window of output y covers input positions y s + t d - pad_begin, t < k")

op("MaxPool", ("x",), _pool, _max_pool_ref, attrs=_ATTRS, vjp=_INFERENCE, kernel=_pool_kernel, flops=_pool_flops,
   doc=f"ONNX MaxPool (https://onnx.ai/onnx/operators/onnx__MaxPool.html): the largest input of each window, taps "
       f"outside the input ignored (-inf for a window with none); {_SHAPE}")

op("MaxPoolIndices", ("x",), _pool, lambda xs, a: _max_pool_ref(xs, a, indices=True),
   attrs=(*_ATTRS, Attr("storage_order", "int", 0)), vjp=_INFERENCE, kernel=_pool_kernel, flops=_pool_flops,
   doc=f"the Indices output of ONNX MaxPool (https://onnx.ai/onnx/operators/onnx__MaxPool.html): the flat index "
       f"into X of each window's first maximum in row-major tap order, over the spatial axes row-major "
       f"(storage_order 0) or column-major (1), plus (n C + c) times the spatial size; -1 for a window with no "
       f"tap in the input; i32; {_SHAPE}")

op("AveragePool", ("x",), _pool, _average_pool_ref, attrs=(*_ATTRS, Attr("count_include_pad", "bool", False)),
   vjp=_INFERENCE, kernel=_pool_kernel, flops=_pool_flops,
   doc=f"ONNX AveragePool (https://onnx.ai/onnx/operators/onnx__AveragePool.html): the sum of each window's taps in "
       f"the input over their count, or with count_include_pad over the count of taps in the input or its explicit "
       f"padding (positions past the end padding, which ceil_mode may reach, never count); {_SHAPE}")

op("LpPool", ("x",), _pool, _lp_pool_ref, attrs=(*_ATTRS, Attr("p", "int", 2)),
   vjp=_INFERENCE, kernel=_pool_kernel, flops=_pool_flops,
   doc=f"ONNX LpPool (https://onnx.ai/onnx/operators/onnx__LpPool.html): (sum of |x|^p over each window's taps in "
       f"the input)^(1/p); {_SHAPE}")
