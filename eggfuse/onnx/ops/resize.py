"""Resize (opsets 10 to 19) and Upsample (opsets 7 to 9) as Resample tables.

For each resized axis the table gives, per output coordinate, the input taps and their
weights: the coordinate transformation (half_pixel, half_pixel_symmetric, pytorch_half_pixel,
align_corners, asymmetric, tf_crop_and_resize), then the filter of the mode (nearest with its
rounding, linear, cubic with cubic_coeff_a and exclude_outside, antialiased linear / cubic when
downsampling), edge-clamped, in float64, as the ONNX operator page defines it
(https://onnx.ai/onnx/operators/onnx__Resize.html; the separable form of onnx's reference
implementation). Resize-10 and Upsample have asymmetric coordinates and, for nearest, floor
when upsampling and ceil when downsampling, as onnxruntime runs them. A 2x nearest upsampling
of the last two axes of a 4-D tensor that picks pixel floor(o / 2) is the Upsample2x kernel
instead.
"""

from __future__ import annotations

import math

import numpy as np

from eggfuse.ir import DType

from ..importer import NodeContext, Value, converter
from .linalg import float_inputs

_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_MODES = ("nearest", "linear", "cubic")


def source_coordinates(mode: str, out: int, n: int, scale: float, roi: tuple[float, float]) -> tuple[np.ndarray, ...]:
    """(input coordinate of each output position, whether it lies outside the input) of one
    axis of ``n`` inputs resized to ``out`` with ``scale``, by coordinate_transformation_mode."""
    y = np.arange(out, dtype=np.float64)
    length = scale * n
    outside = np.zeros(out, dtype=bool)
    if mode == "align_corners":
        x = np.zeros(out) if length == 1 else y * (n - 1) / (length - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(out, (hi - lo) * (n - 1) / 2) if length == 1 else y * (hi - lo) * (n - 1) / (length - 1)
        x = x + lo * (n - 1)
        outside = (x < 0) | (x > n - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric: the centre of the input maps to the centre of the output
        offset = n / 2 * (1 - out / length)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def _filter(mode: str, ratio: float, scale: float, nearest: str, a: float, antialias: bool) -> np.ndarray:
    """The weights of the taps left of and right of a coordinate at ``ratio`` in (0, 1]."""
    if mode == "nearest":
        if ratio == 1.0:
            return np.array([0.0, 1.0])
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
                 "ceil": True}[nearest]
        return np.array([0.0, 1.0]) if right else np.array([1.0, 0.0])
    s = min(scale, 1.0) if antialias else 1.0
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * s
        w = np.clip(1 - np.abs(args), 0, 1)
        return w / w.sum()
    start = int(np.floor(-2 / s) + 1)
    x = np.abs(np.array([s * (i - ratio) for i in range(start, 2 - start)]))
    w = np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,  # Keys (1981) cubic convolution
                 np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
    return w / w.sum()


def axis_table(n: int, out: int, scale: float, roi: tuple[float, float], a: dict) -> tuple[np.ndarray, np.ndarray]:
    """(input index, weight) tables [out, taps] of one axis; a row outside the input
    (tf_crop_and_resize) has index -1 in its first tap."""
    x, outside = source_coordinates(a["coordinates"], out, n, scale, roi)
    nearest = a["nearest"]
    if nearest == "simple":  # Resize-10 and Upsample, as onnxruntime reads them: ceil when downsampling
        nearest = "ceil" if scale < 1 else "floor"
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)  # in (0, 1]: an integer coordinate takes its left neighbour's tap
    rows = [_filter(a["mode"], float(r), scale, nearest, a["cubic_a"], a["antialias"]) for r in ratio]
    taps = len(rows[0])
    w = np.stack(rows)
    # the taps nearest x, ties to the smaller index (onnx's reference, _get_neighbor_idxes)
    half = math.ceil(taps / 2)
    xp = x + half
    p = np.floor(xp)
    frac = xp - p
    if taps % 2 == 0:
        first = p + np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        first = p + np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    index = (first - half)[:, None].astype(np.int64) + np.arange(taps)[None, :]
    if a["exclude_outside"]:
        w = np.where((index < 0) | (index >= n), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, n - 1)
    if a["mode"] == "nearest":  # one tap: the one of weight 1
        pick = np.argmax(w, axis=1)
        index, w = index[np.arange(out), pick][:, None], np.ones((out, 1))
    index[outside, 0] = -1
    return index, w


def resample(ctx: NodeContext, x: int, shape: tuple[int, ...], out: list[int], scales: list[float],
             roi: list[tuple[float, float]], attrs: dict, extrapolation: float) -> Value:
    """The Resample node (or Upsample2x) resizing ``x`` of ``shape`` to ``out``."""
    tables, taps = [], []
    for ax, (n, o, s) in enumerate(zip(shape, out, scales, strict=True)):
        identity = n == o and math.isclose(s, 1.0) and (attrs["coordinates"] != "tf_crop_and_resize"
                                                        or roi[ax] == (0.0, 1.0))
        if identity:
            taps.append(0)
            continue
        index, w = axis_table(n, o, s, roi[ax], attrs)
        tables.append((index, w))
        taps.append(index.shape[1])
    if len(shape) == 4 and taps[:2] == [0, 0] and out[2:] == [2 * shape[2], 2 * shape[3]] and all(
            t[0].shape[1] == 1 and np.array_equal(t[0][:, 0], np.arange(len(t[0])) // 2) for t in tables):
        return ctx.out(ctx.add("Upsample2x", [x]))
    index = np.concatenate([t[0].reshape(-1) for t in tables]) if tables else np.zeros(1, np.int64)
    weight = np.concatenate([t[1].reshape(-1) for t in tables]) if tables else np.zeros(1)
    return ctx.out(ctx.add("Resample", [x, ctx.constant(index.astype(np.int32), DType.I32), ctx.constant(weight)],
                           shape=out, taps=taps, extrapolation_value=extrapolation))


def _known(ctx: NodeContext, i: int, what: str) -> np.ndarray | None:
    """Input ``i``'s value when given and not empty (Resize leaves roi, scales or sizes empty), else None."""
    if not ctx.has(i):
        return None
    v = np.asarray(ctx.const(i, what))
    return v if v.size else None


@converter("Resize")
def _resize(ctx: NodeContext) -> Value:
    ctx.refuse_attrs(("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                      "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"))
    float_inputs(ctx, 0)
    shape = ctx.shape(0)
    r = len(shape)
    if r == 0:
        raise ctx.fail("X is a scalar: there is nothing to resize")
    mode = ctx.attr("mode", "nearest")
    if mode not in _MODES:
        raise ctx.fail(f"attribute mode={mode!r} is not one of {', '.join(_MODES)}")
    if ctx.opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
        roi_in, scales_in, sizes_in = None, _known(ctx, 1, "scales"), None
        coordinates = "asymmetric"
        nearest = "simple"
    else:
        roi_in, scales_in, sizes_in = _known(ctx, 1, "roi"), _known(ctx, 2, "scales"), _known(ctx, 3, "sizes")
        coordinates = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest = ctx.attr("nearest_mode", "round_prefer_floor")
        if nearest not in _NEAREST:
            raise ctx.fail(f"attribute nearest_mode={nearest!r} is not one of {', '.join(_NEAREST)}")
    if coordinates not in _COORDINATES:
        raise ctx.fail(f"attribute coordinate_transformation_mode={coordinates!r} is not one of "
                       f"{', '.join(_COORDINATES)}")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.fail("attribute antialias=1 is defined for the linear and cubic modes only")
    axes = [int(a) % r if -r <= int(a) < r else None for a in ctx.attr("axes", range(r))]
    if None in axes or len(set(axes)) != len(axes):
        raise ctx.fail(f"attribute axes={list(ctx.attr('axes'))} must be distinct axes of X {list(shape)}")
    if (scales_in is None) == (sizes_in is None):
        raise ctx.fail("exactly one of scales and sizes must be given (and not empty)")
    given = scales_in if scales_in is not None else sizes_in
    if given.shape != (len(axes),):
        raise ctx.fail(f"{'scales' if scales_in is not None else 'sizes'} {given.tolist()} must have one entry per "
                       f"resized axis ({len(axes)})")
    scales, out = [1.0] * r, list(shape)
    if scales_in is not None:
        for ax, s in zip(axes, scales_in.astype(np.float64), strict=True):
            if not s > 0:
                raise ctx.fail(f"scales {scales_in.tolist()} must be > 0")
            scales[ax], out[ax] = float(s), int(s * shape[ax])
    else:
        for ax, n in zip(axes, sizes_in, strict=True):
            scales[ax], out[ax] = int(n) / shape[ax], int(n)
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ctx.fail(f"attribute keep_aspect_ratio_policy={policy!r} is not stretch, not_larger or not_smaller")
        if policy != "stretch":
            s = (min if policy == "not_larger" else max)(scales[ax] for ax in axes)
            for ax in axes:
                scales[ax], out[ax] = s, int(s * shape[ax] + 0.5)  # round half up
    if any(o < 1 for o in out):
        raise ctx.fail(f"the output shape {out} has an empty axis (eggfuse needs every dimension >= 1)")
    roi = [(0.0, 1.0)] * r
    if coordinates == "tf_crop_and_resize":
        if roi_in is None or roi_in.shape != (2 * len(axes),):
            raise ctx.fail(f"tf_crop_and_resize needs roi with {2 * len(axes)} entries (starts, then ends)")
        for i, ax in enumerate(axes):
            roi[ax] = (float(roi_in[i]), float(roi_in[len(axes) + i]))
    attrs = dict(mode=mode, coordinates=coordinates, nearest=nearest, cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
                 exclude_outside=bool(ctx.attr("exclude_outside", 0)), antialias=antialias)
    return resample(ctx, ctx.tensor(0), shape, out, scales, roi, attrs, float(ctx.attr("extrapolation_value", 0.0)))


@converter("Upsample")
def _upsample(ctx: NodeContext) -> Value:
    # Upsample-7 takes scales as an attribute, 9 as an input; out = floor(in * scale), asymmetric coordinates
    ctx.refuse_attrs(("mode", "scales"))
    float_inputs(ctx, 0)
    shape = ctx.shape(0)
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ctx.fail(f"attribute mode={mode!r} is not nearest or linear")
    scales = ctx.attr("scales") if ctx.opset < 9 else np.asarray(ctx.const(1, "scales")).tolist()
    if scales is None or len(scales) != len(shape) or not all(s >= 1 for s in scales):
        raise ctx.fail(f"scales {scales} must give one factor >= 1 per axis of X {list(shape)}")
    out = [int(s * n) for s, n in zip(scales, shape, strict=True)]
    attrs = dict(mode="nearest" if mode == "nearest" else "linear", coordinates="asymmetric", nearest="simple",
                 cubic_a=-0.75, exclude_outside=False, antialias=False)
    return resample(ctx, ctx.tensor(0), shape, out, [float(s) for s in scales], [(0.0, 1.0)] * len(shape), attrs,
                    0.0)
