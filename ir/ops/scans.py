"""Scans and selections along one axis, with ONNX's semantics: CumSum, CumProd, and TopK's
two outputs as two ops, TopKValues and TopKIndices (an IR op has one output).

Each views its input as [outer, n, inner] around the axis (:func:`.reduce_axes.line_params`).
i32 arithmetic wraps, and the references wrap likewise.
"""

from __future__ import annotations

import numpy as np

from ..kernel import Kernel, elementwise_groups
from ..spec import Attr, need, op
from ..types import DType, TensorType
from .reduce_axes import INFERENCE, line_params, wrap_i32

FAMILY = "scans"

#: Lines at least this long are scanned by a workgroup each (kernel entry ``per_group``).
SCAN_GROUP_MIN_LEN = 128


def _numeric_axis(ts, a) -> TensorType:
    x = ts[0]
    need(x.dtype in (DType.F32, DType.I32), f"input must be f32 or i32, got {x}")
    need(0 <= a["axis"] < x.rank, f"axis {a['axis']} out of range for {x}")
    return x


# --- CumSum, CumProd -----------------------------------------------------------------------------


def _scan_ref(fn, identity):
    def ref(xs, a):
        x, axis = xs[0], a["axis"]
        if a["reverse"]:
            x = np.flip(x, axis=axis)
        y = fn(x, axis=axis)
        if a["exclusive"]:
            first = np.full_like(np.take(y, [0], axis=axis), identity)
            y = np.concatenate([first, np.take(y, range(x.shape[axis] - 1), axis=axis)], axis=axis)
        if a["reverse"]:
            y = np.flip(y, axis=axis)
        return wrap_i32(y) if x.dtype.kind in "iu" else y

    return ref


def _scan_kernel(node, ins, target) -> Kernel:
    x, axis = ins[0], node.attrs["axis"]
    params, lines = line_params(x.shape, axis)
    per_group = x.shape[axis] >= SCAN_GROUP_MIN_LEN
    t = x.dtype.wgsl
    prod = node.op == "CumProd"
    entry = "per_group" if per_group else "per_element"
    return Kernel(f"{node.op.lower()}_{t}_{entry}", "scan.wgsl", lines if per_group else elementwise_groups(lines),
                  params=params, entry_point=entry,
                  slots={"T": t, "COMBINE": "a * b" if prod else "a + b", "IDENTITY": f"{t}({int(prod)})",
                         "EXCLUSIVE": "true" if node.attrs["exclusive"] else "false",
                         "REVERSE": "true" if node.attrs["reverse"] else "false"})


_SCAN_ATTRS = (Attr("axis", "int"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False))
op("CumSum", ("x",), _numeric_axis, _scan_ref(np.cumsum, 0), attrs=_SCAN_ATTRS, vjp=INFERENCE, kernel=_scan_kernel,
   doc="running sum along axis, inclusive or (exclusive) of the elements before, from the end when reverse; "
       "ONNX CumSum (https://onnx.ai/onnx/operators/onnx__CumSum.html)")
op("CumProd", ("x",), _numeric_axis, _scan_ref(np.cumprod, 1), attrs=_SCAN_ATTRS, vjp=INFERENCE, kernel=_scan_kernel,
   doc="running product along axis, inclusive or (exclusive) of the elements before, from the end when reverse; "
       "ONNX CumProd (https://onnx.ai/onnx/operators/onnx__CumProd.html)")


# --- TopK ----------------------------------------------------------------------------------------


def _top_k_infer(indices: bool):
    def infer(ts, a):
        x = _numeric_axis(ts, a)
        k = a["k"]
        need(1 <= k <= x.shape[a["axis"]], f"k = {k} must lie in 1..{x.shape[a['axis']]} (the axis of {x})")
        shape = list(x.shape)
        shape[a["axis"]] = k
        return TensorType(tuple(shape), DType.I32 if indices else x.dtype)

    return infer


def top_k_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices along ``axis`` that sort ``x`` best first, equal values by their index (the
    reference implementation of ONNX TopK: numpy lexsort, NaN as the largest)."""
    ind = np.indices(x.shape)[axis]
    order = np.lexsort((-ind if largest else ind, x), axis=axis)
    return np.flip(order, axis=axis) if largest else order


def _top_k_ref(indices: bool):
    def ref(xs, a):
        x, axis = xs[0], a["axis"]
        order = np.take(top_k_order(x, axis, a["largest"]), range(a["k"]), axis=axis)
        return order if indices else np.take_along_axis(x, order, axis=axis)

    return ref


def _top_k_kernel(node, ins, target) -> Kernel:
    x, axis = ins[0], node.attrs["axis"]
    params, lines = line_params(x.shape, axis)
    t = x.dtype.wgsl
    store = "i32(i)" if node.op == "TopKIndices" else "v"
    return Kernel(f"{node.op.lower()}_{t}", "top_k.wgsl", elementwise_groups(lines * x.shape[axis]),
                  params=(*params, ("k", "u32", node.attrs["k"])),
                  slots={"T": t, "NAN": "is_nan(v)" if t == "f32" else "false", "STORE": store,
                         "LARGEST": "true" if node.attrs["largest"] else "false"})


_TOP_K_ATTRS = (Attr("k", "int"), Attr("axis", "int"), Attr("largest", "bool", True))
_TOP_K_DOC = ("the k {} along axis, largest first (or smallest first), equal values in index order; a NaN counts "
              "as larger than every number. ONNX TopK's {} output, sorted "
              "(https://onnx.ai/onnx/operators/onnx__TopK.html); the kernel is O(n^2) per line")
op("TopKValues", ("x",), _top_k_infer(False), _top_k_ref(False), attrs=_TOP_K_ATTRS, vjp=INFERENCE,
   kernel=_top_k_kernel, flops=lambda ins, out, a: ins[0].num_elements * ins[0].shape[a["axis"]],
   doc=_TOP_K_DOC.format("values", "Values"))
op("TopKIndices", ("x",), _top_k_infer(True), _top_k_ref(True), attrs=_TOP_K_ATTRS, vjp=INFERENCE,
   kernel=_top_k_kernel, flops=lambda ins, out, a: ins[0].num_elements * ins[0].shape[a["axis"]],
   doc=_TOP_K_DOC.format("indices (i32)", "Indices"))
