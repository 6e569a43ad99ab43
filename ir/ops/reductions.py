"""Reductions and broadcasts: SumAll, MeanAll, and the adjoints of broadcasting (SumRows,
ReduceTo, BroadcastTo) that autodiff emits.

Kernels that are knowingly slow at scale say so in their WGSL header: SumAll/MeanAll run in
one workgroup (no float atomics in WGSL).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import LoweringError
from ..kernel import Kernel, elementwise_groups
from ..spec import NO_GRAD, Attr, need, need_f32, op
from ..types import TensorType
from .elementwise import broadcast_strides

FAMILY = "reductions"

#: Output elements below which ReduceTo uses a workgroup per output element (when each sums
#: at least ``GROUP_REDUCE_MIN_LEN`` values): too few invocations otherwise.
GROUP_REDUCE_MAX_OUT = 4096
GROUP_REDUCE_MIN_LEN = 256


def _reduce_all(ts, a):
    need_f32(ts[0], "input")
    return TensorType((1,))


def _reduce_all_kernel(node, ins, target) -> Kernel:
    n = ins[0].num_elements
    scale = 1.0 if node.op == "SumAll" else 1.0 / n
    return Kernel("reduce_all", "reduce_all.wgsl", 1, params=(("n", "u32", n), ("scale", "f32", scale)))


def _sum_all_vjp(b, node, dy, want):
    return [b.broadcast(dy, b.type(node.inputs[0]).shape)]


def _mean_all_vjp(b, node, dy, want):
    x = b.type(node.inputs[0])
    return [b.broadcast(b.scale(dy, 1.0 / x.num_elements), x.shape)]


def _all_flops(ins, out, a):
    return ins[0].num_elements


op("SumAll", ("x",), _reduce_all, lambda xs, a: np.array([xs[0].sum()]), doc="out[0] = sum of every element",
   vjp=_sum_all_vjp, kernel=_reduce_all_kernel, flops=_all_flops)
op("MeanAll", ("x",), _reduce_all, lambda xs, a: np.array([xs[0].mean()]), doc="out[0] = mean of every element",
   vjp=_mean_all_vjp, vjp_takes_one=True, kernel=_reduce_all_kernel, flops=_all_flops)


# --- adjoints of broadcasting ------------------------------------------------------------------


def broadcasts_to(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(small, big)) == tuple(big)
    except ValueError:
        return False


def reduce_dims(x: tuple[int, ...], target: tuple[int, ...]) -> tuple[list[int], list[bool]]:
    """x's shape merged into runs of kept or reduced dimensions, for a sum to ``target``.

    Size-1 dimensions of x are dropped and neighbours of the same kind merged (x is
    contiguous, so any run of them is one strided dimension). Returns sizes and a
    reduced flag per merged dimension, outermost first, padded to 4 with kept 1s; raises
    LoweringError when more than 4 remain (alternating kept and reduced axes).
    """
    target = (1,) * (len(x) - len(target)) + tuple(target)
    dims: list[int] = []
    reduced: list[bool] = []
    for d, t in zip(x, target, strict=True):
        if d == 1:
            continue
        red = t == 1
        if dims and reduced[-1] == red:
            dims[-1] *= d
        else:
            dims.append(d)
            reduced.append(red)
    if len(dims) > 4:
        raise LoweringError(f"sum of {list(x)} to {list(target)} alternates {len(dims)} kept and reduced "
                            "dimensions; the reduce_to kernel handles 4")
    pad = 4 - len(dims)
    return [1] * pad + dims, [False] * pad + reduced


def _reduce_to_kernel(node, ins, target) -> Kernel:
    dims, reduced = reduce_dims(ins[0].shape, node.type.shape)
    strides = [math.prod(dims[d + 1:]) for d in range(4)]
    out_dims = [1 if r else d for d, r in zip(dims, reduced, strict=True)]
    red_dims = [d if r else 1 for d, r in zip(dims, reduced, strict=True)]
    n, red_len = math.prod(out_dims), math.prod(red_dims)
    params = (("out_dims", "vec4<u32>", out_dims), ("red_dims", "vec4<u32>", red_dims), ("st", "vec4<u32>", strides),
              ("n", "u32", n), ("red_len", "u32", red_len))
    if n <= GROUP_REDUCE_MAX_OUT and red_len >= GROUP_REDUCE_MIN_LEN:
        return Kernel("reduce_to_per_group", "reduce_to.wgsl", n, params=params, entry_point="per_group")
    return Kernel("reduce_to_per_element", "reduce_to.wgsl", elementwise_groups(n), params=params,
                  entry_point="per_element")


def _sum_rows(ts, a):
    need_f32(ts[0], "input")
    need(ts[0].rank == 2, f"input must be 2-D, got {ts[0]}")
    return TensorType((ts[0].shape[1],))


op("SumRows", ("x",), _sum_rows, lambda xs, a: xs[0].sum(axis=0), vjp=NO_GRAD, kernel=_reduce_to_kernel,
   flops=_all_flops, doc="out[j] = sum_i x[i,j], [M,N] -> [N]: the bias gradient (seed: SumRows)")


def _reduce_to(ts, a):
    shape = tuple(a["shape"])
    need_f32(ts[0], "input")
    need(all(d >= 1 for d in shape), f"target shape {list(shape)} has a dimension < 1")
    need(broadcasts_to(shape, ts[0].shape), f"{list(shape)} does not broadcast to {ts[0]}")
    return TensorType(shape)


def _reduce_to_ref(xs, a):
    x, shape = xs[0], tuple(a["shape"])
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


op("ReduceTo", ("x",), _reduce_to, _reduce_to_ref, attrs=(Attr("shape", "ints"),), vjp=NO_GRAD,
   kernel=_reduce_to_kernel, flops=_all_flops,
   doc="sum x over the axes numpy broadcasting added or stretched to reach x's shape from ``shape``: the "
       "adjoint of broadcasting (gradient of a broadcast Add/Mul operand)")


def _broadcast_to(ts, a):
    shape = tuple(a["shape"])
    need_f32(ts[0], "input")
    need(all(d >= 1 for d in shape), f"target shape {list(shape)} has a dimension < 1")
    need(broadcasts_to(ts[0].shape, shape), f"{ts[0]} does not broadcast to {list(shape)}")
    return TensorType(shape)


def _broadcast_to_kernel(node, ins, target) -> Kernel:
    dims, sx, _ = broadcast_strides(node.type.shape, ins[0].shape, ins[0].shape)
    n = node.type.num_elements
    return Kernel("broadcast_to", "broadcast_to.wgsl", elementwise_groups(n),
                  params=(("dims", "vec4<u32>", dims), ("sx", "vec4<u32>", sx), ("n", "u32", n)))


op("BroadcastTo", ("x",), _broadcast_to, lambda xs, a: np.broadcast_to(xs[0], tuple(a["shape"])).copy(),
   attrs=(Attr("shape", "ints"),), vjp=NO_GRAD, kernel=_broadcast_to_kernel, flops=lambda ins, out, a: 0,
   doc="numpy broadcast_to(x, shape): the adjoint of ReduceTo (gradient of SumAll, MeanAll)")
