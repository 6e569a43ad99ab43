"""The broadcasting elementwise kernel: one WGSL body (``shaders/broadcast.wgsl``) for every op
that combines one to three operands element by element with numpy broadcasting.

A builder gives the WGSL expression of the operands' elements (``av``, ``bv``, ``cv``, typed
by the operands' dtypes) and lowering binds the operands as ``a``, ``b``, ``c`` and the output
as ``out``, each with its dtype's WGSL element type (BOOL as ``u32`` 0/1). The output's
dimensions are merged as far as the operands allow (:func:`merge_broadcast`): an operand laid
out as the output is read at the output's index, a broadcast scalar at 0, and any other
operand through per-dimension element strides over at most :data:`MAX_RANK` merged
dimensions (two ``vec4`` uniforms each past four). No op is registered here: the families
using the kernel (``arithmetic``, ``elementwise``) do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import LoweringError
from ..kernel import Buffer, Include, Kernel, elementwise_groups

#: Most dimensions a broadcast may keep after merging (numpy broadcasting in ONNX models
#: uses up to 6).
MAX_RANK = 8

_NAMES = "abc"


def merge_broadcast(out: Sequence[int], shapes: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The dimensions of ``out`` after merging, and each operand's element strides over them.

    Each operand's shape is aligned to ``out`` from the right (numpy broadcasting,
    https://numpy.org/doc/stable/user/basics.broadcasting.html); its stride is 0 along a
    dimension it broadcasts. Size-1 output dimensions are dropped, and a dimension is merged
    into the one before it when every operand is contiguous across the two (so an
    elementwise op on equal shapes has one dimension, and a scalar output none).
    """
    rank = len(out)

    def strides(shape: Sequence[int]) -> list[int]:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        st, acc = [0] * rank, 1
        for d in reversed(range(rank)):
            st[d] = 0 if shape[d] == 1 else acc
            acc *= shape[d]
        return st

    full = [strides(s) for s in shapes]
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in shapes]
    for d in range(rank):
        if out[d] == 1:
            continue
        if dims and all(m[-1] == st[d] * out[d] for m, st in zip(merged, full, strict=True)):
            dims[-1] *= out[d]
            for m, st in zip(merged, full, strict=True):
                m[-1] = st[d]
        else:
            dims.append(out[d])
            for m, st in zip(merged, full, strict=True):
                m.append(st[d])
    return dims, merged


def broadcast_strides(out: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
                      ) -> tuple[list[int], list[int], list[int]]:
    """:func:`merge_broadcast` of two operands as three rank-4 vectors (dims padded with leading
    1s, strides with 0s), for the rank-4 kernels (BroadcastTo). Raises LoweringError when more
    than 4 dimensions remain."""
    dims, (sa, sb) = merge_broadcast(out, [a, b])
    if len(dims) > 4:
        raise LoweringError(f"broadcast of {list(a)} and {list(b)} to {list(out)} needs {len(dims)} "
                            "dimensions after merging; this kernel handles 4")
    pad = 4 - len(dims)
    return [1] * pad + dims, [0] * pad + sa, [0] * pad + sb


def _pad(values: list[int], rank: int, fill: int) -> list[int]:
    return [fill] * (rank - len(values)) + values


def broadcast_loads(what: str, out_shape: Sequence[int], shapes: Sequence[Sequence[int]],
                    operands: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str, object]], list[str]]:
    """The uniform fields and WGSL lines that read each operand's element for output element ``i``.

    ``operands`` names, per operand of shape ``shapes[k]``, its storage binding and the variable
    that receives its element (``("a", "av")``). An operand laid out as the output is read at
    ``i``, one element at 0, any other through per-dimension element strides (uniforms ``s<binding>``)
    over the merged dimensions of ``out_shape`` (:func:`merge_broadcast`; ``dims``, and past four
    ``dims_hi`` and ``inner``), with ``coords4`` of ``shaders/coords.wgsl``. Raises LoweringError
    naming ``what`` when more than :data:`MAX_RANK` dimensions remain after merging.
    """
    dims, strides = merge_broadcast(out_shape, shapes)
    rank = len(dims)
    if rank > MAX_RANK:
        shown = " and ".join(str(list(s)) for s in shapes)
        raise LoweringError(f"{what}: broadcast of {shown} to {list(out_shape)} keeps {rank} dimensions after "
                            f"merging; the broadcasting kernel handles {MAX_RANK}")
    contiguous = [math.prod(dims[d + 1:]) for d in range(rank)]
    params: list[tuple[str, str, object]] = []
    lines: list[str] = []
    need_coords = False
    for (buf, var), st in zip(operands, strides, strict=True):
        if st == contiguous:  # laid out as the output (equal shapes): the output's index
            lines.append(f"    let {var} = {buf}[i];")
        elif not any(st):  # one element read by all
            lines.append(f"    let {var} = {buf}[0];")
        else:
            need_coords = True
            if rank <= 4:
                params.append((f"s{buf}", "vec4<u32>", _pad(st, 4, 0)))
                lines.append(f"    let {var} = {buf}[dot(lo, p.s{buf})];")
            else:
                full = _pad(st, 8, 0)
                params += [(f"s{buf}", "vec4<u32>", full[4:]), (f"s{buf}_hi", "vec4<u32>", full[:4])]
                lines.append(f"    let {var} = {buf}[dot(lo, p.s{buf}) + dot(hi, p.s{buf}_hi)];")
    head: list[str] = []
    if need_coords and rank <= 4:
        params.insert(0, ("dims", "vec4<u32>", _pad(dims, 4, 1)))
        head.append("    let lo = coords4(i, p.dims);")
    elif need_coords:
        full = _pad(dims, 8, 1)
        params[:0] = [("dims", "vec4<u32>", full[4:]), ("dims_hi", "vec4<u32>", full[:4]),
                      ("inner", "u32", math.prod(full[4:]))]
        head += ["    let lo = coords4(i % p.inner, p.dims);", "    let hi = coords4(i / p.inner, p.dims_hi);"]
    return params, head + lines


def broadcast_kernel(name: str, expr: str, out_shape: Sequence[int], shapes: Sequence[Sequence[int]],
                     elems: Sequence[str], out_elem: str, helpers: str | None = None) -> Kernel:
    """The dispatch of ``broadcast.wgsl``: ``out[i] = expr`` over ``out_shape``.

    ``shapes``/``elems``: the operands' shapes (as broadcast; one to three) and WGSL element
    types; ``out_elem`` the output's. ``helpers``: a WGSL file of functions the expression
    calls (included after ``common.wgsl``). Raises LoweringError when the broadcast keeps more
    than :data:`MAX_RANK` dimensions after merging.
    """
    if not 1 <= len(shapes) <= len(_NAMES):
        raise LoweringError(f"{name}: the broadcasting kernel takes 1 to 3 operands, got {len(shapes)}")
    letters = _NAMES[:len(shapes)]
    params, lines = broadcast_loads(name, out_shape, shapes, [(x, f"{x}v") for x in letters])
    n = math.prod(out_shape)
    params.append(("n", "u32", n))
    bindings = (*(Buffer(letter, e) for letter, e in zip(letters, elems, strict=True)),
                Buffer("out", out_elem, write=True))
    return Kernel(name, "broadcast.wgsl", elementwise_groups(n), params=tuple(params),
                  slots={"LOADS": "\n".join(lines), "EXPR": expr,
                         "HELPERS": Include(helpers) if helpers else ""},
                  bindings=bindings)


__all__ = ["MAX_RANK", "broadcast_kernel", "broadcast_loads", "broadcast_strides", "merge_broadcast"]
