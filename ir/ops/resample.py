"""Resample: separable interpolation through per-axis tables, the kernel behind ONNX Resize
and Upsample.

Every mode of ONNX Resize (nearest with its rounding modes, linear, cubic, antialiased
downsampling, every coordinate transformation, tf_crop_and_resize's extrapolation) is a
separable filter: output position o along a resized axis reads a fixed set of taps, input
indices with weights. The importer computes those tables once per import, in float64, from
the attributes and the static shapes (``eggfuse.onnx.ops.resize``); Resample applies them, so
the WGSL kernel is the same for every mode.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType

FAMILY = "resample"

#: Axes the kernel addresses once runs of untouched axes are merged (two uniform vec4s).
MAX_AXES = 8


def table_rows(shape: tuple[int, ...], taps: tuple[int, ...]) -> int:
    """Entries of the index and weight tables: sum over resized axes of out * taps."""
    return sum(o * t for o, t in zip(shape, taps, strict=True) if t)


def _resample(ts, a):
    x, index, weight = ts
    need_f32(x, "x")
    shape, taps = tuple(a["shape"]), tuple(a["taps"])
    need(len(shape) == x.rank and len(taps) == x.rank, f"shape {list(shape)} and taps {list(taps)} must give one "
                                                       f"entry per axis of {x}")
    need(all(d >= 1 for d in shape) and all(t >= 0 for t in taps), f"shape {list(shape)} must be >= 1 and taps "
                                                                   f"{list(taps)} >= 0")
    for ax, (d, o, t) in enumerate(zip(x.shape, shape, taps, strict=True)):
        need(t or d == o, f"axis {ax} has no taps (untouched) but resizes {d} to {o}")
    rows = table_rows(shape, taps)
    need(index.dtype is DType.I32 and index.shape == (max(rows, 1),),
         f"index must be i32[{max(rows, 1)}] for shape {list(shape)} and taps {list(taps)}, got {index}")
    need(weight.dtype is DType.F32 and weight.shape == (max(rows, 1),),
         f"weight must be f32[{max(rows, 1)}], got {weight}")
    need(len(_merged(x.shape, shape, taps)) <= MAX_AXES, f"{x} -> {list(shape)} alternates resized and untouched axes "
                                                         f"more than {MAX_AXES} times")
    return TensorType(shape)


def _tables(a, index, weight):
    """(axis, index rows [out, taps], weight rows, outside [out]) of each resized axis."""
    at = 0
    for ax, (o, t) in enumerate(zip(a["shape"], a["taps"], strict=True)):
        if t:
            idx = index[at:at + o * t].reshape(o, t)
            yield ax, idx, weight[at:at + o * t].reshape(o, t), idx[:, 0] < 0
            at += o * t


def _resample_ref(xs, a):
    x, index, weight = xs
    out = x
    outside = np.zeros(tuple(a["shape"]), dtype=bool)
    for ax, idx, w, off in _tables(a, index, weight):
        gathered = np.take(out, np.clip(idx, 0, x.shape[ax] - 1), axis=ax)  # [..., out, taps, ...]
        view = [1] * gathered.ndim
        view[ax], view[ax + 1] = w.shape
        out = (gathered * w.reshape(view)).sum(axis=ax + 1)
        mask = [1] * x.ndim
        mask[ax] = -1
        outside |= off.reshape(mask)
    return np.where(outside, a["extrapolation_value"], out)


def _merged(in_shape, out_shape, taps) -> list[tuple[int, int, int]]:
    """(in, out, taps) per axis, runs of untouched axes (taps 0) merged into one."""
    dims: list[tuple[int, int, int]] = []
    for d, o, t in zip(in_shape, out_shape, taps, strict=True):
        if d == 1 and o == 1 and t == 0:
            continue
        if dims and t == 0 and dims[-1][2] == 0:
            dims[-1] = (dims[-1][0] * d, dims[-1][1] * o, 0)
        else:
            dims.append((d, o, t))
    return dims or [(1, 1, 0)]


def _resample_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    dims = _merged(ins[0].shape, a["shape"], a["taps"])
    rows, at = [], 0
    for _, o, t in dims:
        rows.append(at)
        at += o * t
    combos = math.prod(t for _, _, t in dims if t)
    pad = MAX_AXES - len(dims)
    total = node.type.num_elements
    params = (("ins", "array<vec4<u32>, 2>", [d for d, _, _ in dims] + [1] * pad),
              ("outs", "array<vec4<u32>, 2>", [o for _, o, _ in dims] + [1] * pad),
              ("taps", "array<vec4<u32>, 2>", [t for _, _, t in dims] + [0] * pad),
              ("row0", "array<vec4<u32>, 2>", rows + [0] * pad), ("rank", "u32", len(dims)),
              ("total", "u32", total), ("combos", "u32", combos), ("extrapolation", "f32", a["extrapolation_value"]))
    return Kernel("resample", "resample.wgsl", elementwise_groups(total), params=params,
                  bindings=(Buffer("x"), Buffer("index", "i32"), Buffer("weight"), Buffer("out", write=True)))


def _resample_flops(ins, out, a):
    return 2 * out.num_elements * math.prod(t for t in a["taps"] if t)


op("Resample", ("x", "index", "weight"), _resample, _resample_ref,
   attrs=(Attr("shape", "ints"), Attr("taps", "ints"), Attr("extrapolation_value", "float", 0.0)),
   doc="out[o] = sum over taps t_a of each resized axis a of prod_a weight_a[o_a, t_a] x[index_a[o_a, t_a]] "
       "(untouched axes, taps 0, keep o_a); axis a's rows, [shape[a], taps[a]], follow those of the resized axes "
       "before it in the i32 index and f32 weight tables; an output whose row on some axis starts with index -1 "
       "lies outside the input and is extrapolation_value. Separable interpolation as in ONNX Resize "
       "(https://onnx.ai/onnx/operators/onnx__Resize.html; Keys 1981 for cubic convolution)",
   vjp=no_grad("an inference op of the ONNX importer; Upsample2x (vision family) has the gradient"),
   kernel=_resample_kernel, flops=_resample_flops)
