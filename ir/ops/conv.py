"""Convolutions with ONNX semantics over 1 to 3 spatial axes: Conv and ConvTranspose (groups,
strides, dilations, explicit begin/end pads, optional bias); the importer resolves ``auto_pad``
and ``output_shape`` into pads. Inference ops: training graphs use Conv2d (``vision.py``),
which has gradients.

Three kernels, chosen per node at lowering:

- a 1x1 convolution of one image and one group is a matmul, W [M, C] @ X [C, H W]: the matmul
  family's tiled kernel, with the bias added per row at its store;
- an implicit GEMM (``conv_gemm.wgsl`` over ``gemm_tiled.wgsl``): per image and group, the
  [M/group, C/group * taps] weight times the input patches, gathered as they are staged in
  workgroup memory, 4096 outputs per workgroup (64 x 64, 32 x 128 or 16 x 256 by M/group); a
  ConvTranspose whose kernel equals its stride is one such GEMM with rows (channel, tap) over
  the input positions; for convolutions with at least :data:`GEMM_MIN_CHANNELS` output
  channels per group (:func:`conv_uses_gemm`);
- a direct loop (``conv_direct.wgsl``), one invocation per output, for fewer (depthwise
  convolutions, where each output reads only its own channel's taps).

Each kernel applies an epilogue at its store (:func:`conv_kernel`): the bias here, the chain of
a fused convolution (FusedConv, FusedConvBn: ``conv_fused.py``) there.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups, nested_iterations
from ..spec import Attr, need, need_f32, no_grad, op
from ..types import TensorType
from .linalg import gemm_params
from .matmul_kernel import GEMV_MAX_ROWS, matmul_kernel_for, workgroup_storage

FAMILY = "conv"

#: Output channels per group from which a convolution runs as an implicit GEMM (a 64-row
#: tile over fewer rows would mostly compute zeros).
GEMM_MIN_CHANNELS = 16
#: Spatial axes the kernels address.
MAX_SPATIAL = 3

_INFERENCE = no_grad("an inference op of the ONNX importer; Conv2d (vision family) has the gradient")


def geometry(a, r: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(strides, dilations, begin pads, end pads) of a conv or pool node over ``r`` spatial
    axes: attributes left empty mean strides and dilations of 1 and no padding."""
    strides = tuple(a["strides"]) or (1,) * r
    dilations = tuple(a.get("dilations", ())) or (1,) * r
    pads = tuple(a["pads"]) or (0,) * (2 * r)
    need(len(strides) == r and len(dilations) == r and len(pads) == 2 * r,
         f"strides {list(strides)}, dilations {list(dilations)} and pads {list(pads)} do not fit {r} spatial axes")
    need(all(s >= 1 for s in strides) and all(d >= 1 for d in dilations),
         f"strides {list(strides)} and dilations {list(dilations)} must be >= 1")
    return strides, dilations, pads[:r], pads[r:]


def _operands(ts, a, transposed: bool) -> tuple[int, int, int, tuple[int, ...]]:
    """(groups, input channels, output channels, kernel shape) of a Conv / ConvTranspose."""
    x, w = ts[0], ts[1]
    need_f32(x, "X")
    need_f32(w, "W")
    need(3 <= x.rank <= 2 + MAX_SPATIAL, f"X must be [N, C, ...] with 1 to {MAX_SPATIAL} spatial axes, got {x}")
    need(w.rank == x.rank, f"W {w} must have the rank of X {x}")
    g, c = a["group"], x.shape[1]
    need(g >= 1 and c % g == 0, f"group {g} does not divide the {c} input channels of X {x}")
    if transposed:
        need(w.shape[0] == c, f"W {w} must be [C, M/group, ...] with C = {c}")
        m = w.shape[1] * g
    else:
        m = w.shape[0]
        need(m % g == 0 and w.shape[1] == c // g,
             f"W {w} must be [M, C/group, ...] with C/group = {c // g} and M a multiple of group {g}")
    if len(ts) > 2:
        need_f32(ts[2], "B")
        need(ts[2].shape == (m,), f"B must be [{m}], got {ts[2]}")
    return g, c, m, w.shape[2:]


def _conv(ts, a):
    _, _, m, k = _operands(ts, a, False)
    x = ts[0]
    strides, dilations, begin, end = geometry(a, x.rank - 2)
    need(all(p >= 0 for p in begin + end), f"pads must be >= 0, got {list(a['pads'])}")
    out = []
    for n, kk, s, d, b, e in zip(x.shape[2:], k, strides, dilations, begin, end, strict=True):
        o = (n + b + e - d * (kk - 1) - 1) // s + 1
        need(o >= 1, f"a kernel of {list(k)} (dilations {list(dilations)}) is larger than the padded input {x}")
        out.append(o)
    return TensorType((x.shape[0], m, *out))


def _conv_ref(xs, a):
    x, w = xs[0], xs[1]
    n, m, *osz = _conv([TensorType(v.shape) for v in xs], a).shape
    g = a["group"]
    strides, dilations, begin, end = geometry(a, x.ndim - 2)
    xp = np.pad(x, [(0, 0), (0, 0), *zip(begin, end, strict=True)])
    cg, mg = x.shape[1] // g, m // g
    out = np.zeros((n, g, mg, *osz))
    for tap in np.ndindex(*w.shape[2:]):
        rows = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                     for t, d, s, o in zip(tap, dilations, strides, osz, strict=True))
        patch = xp[(slice(None), slice(None), *rows)].reshape(n, g, cg, *osz)
        out += np.einsum("ngc...,gmc->ngm...", patch, w[(..., *tap)].reshape(g, mg, cg))
    out = out.reshape(n, m, *osz)
    if len(xs) > 2:
        out += xs[2].reshape(1, m, *(1,) * len(osz))
    return out


def _conv_transpose(ts, a):
    _, _, m, k = _operands(ts, a, True)
    x = ts[0]
    r = x.rank - 2
    strides, dilations, begin, end = geometry(a, r)
    extra = tuple(a["output_padding"]) or (0,) * r
    need(len(extra) == r, f"output_padding {list(extra)} does not fit {r} spatial axes")
    out = []
    for n, kk, s, d, b, e, op_ in zip(x.shape[2:], k, strides, dilations, begin, end, extra, strict=True):
        o = s * (n - 1) + op_ + d * (kk - 1) + 1 - b - e
        need(o >= 1, f"pads {list(a['pads'])} leave no output of X {x} and W {list(k)}")
        out.append(o)
    return TensorType((x.shape[0], m, *out))


def _conv_transpose_ref(xs, a):
    x, w = xs[0], xs[1]
    n, m, *osz = _conv_transpose([TensorType(v.shape) for v in xs], a).shape
    g = a["group"]
    strides, dilations, begin, _ = geometry(a, x.ndim - 2)
    cg, mg, isz = x.shape[1] // g, m // g, x.shape[2:]
    xg = x.reshape(n, g, cg, *isz)
    out = np.zeros((n, m, *osz))
    for tap in np.ndindex(*w.shape[2:]):
        # input position i reaches output i s + t d - begin: scatter the tap's products there
        contrib = np.einsum("ngc...,gcm->ngm...", xg, w[(..., *tap)].reshape(g, cg, mg)).reshape(n, m, *isz)
        keep, at = [], []
        for i_n, o_n, s, t, d, b in zip(isz, osz, strides, tap, dilations, begin, strict=True):
            pos = np.arange(i_n) * s + t * d - b
            inside = (pos >= 0) & (pos < o_n)
            keep.append(np.flatnonzero(inside))
            at.append(pos[inside])
        if all(len(k) for k in keep):
            out[(slice(None), slice(None), *np.ix_(*at))] += contrib[(slice(None), slice(None), *np.ix_(*keep))]
    if len(xs) > 2:
        out += xs[2].reshape(1, m, *(1,) * len(osz))
    return out


def conv_uses_gemm(node) -> bool:
    """Whether a Conv / ConvTranspose node runs as the implicit GEMM (else the direct loop)."""
    g = node.attrs["group"]
    return node.type.shape[1] // g >= GEMM_MIN_CHANNELS


def _pointwise_matmul(node, ins, epilogue: tuple[str, ...], operands: int, target) -> Kernel | None:
    """The matmul family's tiled kernel for a 1x1 Conv of one image and one group (stride 1, no
    padding): out [M, H W] = W [M, C] @ X [C, H W], ``epilogue`` (WGSL lines of :func:`conv_kernel`
    over ``v``, the channel ``{ch}`` and the output index ``{at}``) applied at the store (the
    matmul's epilogue slot refilled, its ``operands`` bound as e0, e1, ...); None for any other
    convolution."""
    x, w = ins[0], ins[1]
    a = node.attrs
    m, c, spatial = w.shape[0], x.shape[1], math.prod(x.shape[2:])
    if (node.op == "ConvTranspose" or x.shape[0] != 1 or a["group"] != 1 or math.prod(w.shape[2:]) != 1
            or any(a["pads"]) or set(a["strides"]) - {1} or m <= GEMV_MAX_ROWS):
        return None
    k = matmul_kernel_for("", ("bias",) * operands, m, c, spatial, splits=1,  # binds e0 .. e{operands - 1}
                          workgroup_storage=workgroup_storage(target))
    slots = dict(k.slots)
    if operands:
        slots["EPILOGUE"] = "\n".join(line.format(ch="i", at="i * p.n + j") for line in epilogue)
    suffix = "".join(f"+{s}" for s in epilogue_names(node, len(ins)))
    bindings = (*k.bindings[:2], *(Buffer(f"e{i}", t.dtype.wgsl) for i, t in enumerate(ins[2:])), k.bindings[-1])
    return dataclasses.replace(k, name="conv_1x1_" + k.name.split("+")[0] + suffix, slots=slots, bindings=bindings,
                               inputs=(1, 0, *range(2, len(ins))))


def epilogue_names(node, n_inputs: int) -> tuple[str, ...]:
    """The kernel-name suffix of a conv node's store: its epilogue steps (FusedConvBn's batch
    norm first), or ``bias`` for a Conv with bias."""
    if node.op in ("Conv", "ConvTranspose"):
        return ("bias",) if n_inputs > 2 else ()
    from .fused_epilogue import step_label

    return (*(("bn",) if node.op == "FusedConvBn" else ()), *map(step_label, node.attrs["epilogue"]))


def _pad3(values, fill: int) -> list[int]:
    return [fill] * (MAX_SPATIAL - len(values)) + list(values)


def _conv_kernel(node, ins, target) -> Kernel:
    if len(ins) > 2:  # the bias, per output channel
        return conv_kernel(node, ins, ("    v = v + e0[{ch}];  // the bias",), target)
    return conv_kernel(node, ins, (), target)


def conv_kernel(node, ins, epilogue: tuple[str, ...], target) -> Kernel:
    """The kernel of a Conv / ConvTranspose node or of a fused convolution (``conv_fused.py``):
    inputs ``[x, w, *operands]``, the operands bound as e0, e1, ...; ``epilogue`` the WGSL lines
    applied to each output value ``v`` at the store, with ``{ch}`` for its output channel and
    ``{at}`` for its index into the output (so an operand of the output's shape reads
    ``e<k>[{at}]``); ``target`` the lowering target (its workgroup memory bounds a 1x1 Conv's tile)."""
    operands = len(ins) - 2
    if (mm := _pointwise_matmul(node, ins, epilogue, operands, target)) is not None:
        return mm
    transposed = node.op == "ConvTranspose"
    x, w = ins[0], ins[1]
    g = node.attrs["group"]
    strides, dilations, begin, _ = geometry(node.attrs, x.rank - 2)
    n, m, *osz = node.type.shape
    c, taps = x.shape[1], math.prod(w.shape[2:])
    spatial = math.prod(osz)
    params = [("ins", "vec4<u32>", [*_pad3(x.shape[2:], 1), c]), ("outs", "vec4<u32>", [*_pad3(osz, 1), m]),
              ("ker", "vec4<u32>", [*_pad3(w.shape[2:], 1), taps]), ("stride", "vec4<u32>", [*_pad3(strides, 1), 0]),
              ("dil", "vec4<u32>", [*_pad3(dilations, 1), 0]), ("pad", "vec4<i32>", [*_pad3(begin, 0), 0]),
              ("chan", "vec4<u32>", [c // g, m // g, g, n])]
    slots = {"TRANSPOSED": "true" if transposed else "false",
             "EPILOGUE": "\n".join(line.format(ch="o", at="at") for line in epilogue),
             **dict(zip(("KD", "KH", "KW"), _pad3(w.shape[2:], 1), strict=True))}
    bindings = (Buffer("x"), Buffer("w"), *(Buffer(f"e{i}", t.dtype.wgsl) for i, t in enumerate(ins[2:])),
                Buffer("out", write=True))
    name = ("conv_transpose" if transposed else "conv") + "".join(f"+{s}" for s in epilogue_names(node, len(ins)))
    if conv_uses_gemm(node):
        a = node.attrs
        pointwise = not transposed and taps == 1 and set(strides) == {1} and not any(a["pads"])
        unpool = (transposed and tuple(w.shape[2:]) == tuple(strides) and set(dilations) == {1}
                  and not any(a["pads"]) and not any(a["output_padding"]))
        if unpool:  # rows (output channel, tap), columns the input positions
            gemm, tile, tiles = gemm_params(m // g * taps, c // g, x.num_elements // (n * c), n * g)
        else:
            gemm, tile, tiles = gemm_params(m // g, c // g * taps, spatial, n * g)
        slots.update(tile, POINTWISE="true" if pointwise else "false", UNPOOL="true" if unpool else "false")
        name += f"_gemm{tile['BM']}x{tile['BN']}" + ("_1x1" if pointwise else "_unpool" if unpool else "")
        return Kernel(name, "conv_gemm.wgsl", tiles, params=(*params, *gemm), slots=slots, bindings=bindings)
    total = node.type.num_elements
    params.append(("total", "u32", total))
    slots["CG"] = c // g
    # the tap loops step by the stride in a transposed convolution without dilation (conv_common.wgsl tap_step)
    steps = [s if transposed and d == 1 else 1 for s, d in zip(_pad3(strides, 1), _pad3(dilations, 1), strict=True)]
    taps_walked = [-(-k // step) for k, step in zip(_pad3(w.shape[2:], 1), steps, strict=True)]
    return Kernel(name + "_direct", "conv_direct.wgsl", elementwise_groups(total), params=tuple(params), slots=slots,
                  bindings=bindings, loop_iterations=nested_iterations(*taps_walked, c // g))


def _conv_flops(ins, out, a):
    w = ins[1]
    c = ins[0].shape[1]
    return 2 * out.num_elements * c // a["group"] * math.prod(w.shape[2:])


def _conv_transpose_flops(ins, out, a):
    x, w = ins[0], ins[1]
    return 2 * x.num_elements * out.shape[1] // a["group"] * math.prod(w.shape[2:])


_ATTRS = (Attr("strides", "ints", ()), Attr("pads", "ints", ()), Attr("dilations", "ints", ()),
          Attr("group", "int", 1))

op("Conv", ("x", "w", "bias?"), _conv, _conv_ref, attrs=_ATTRS,
   doc="ONNX Conv (https://onnx.ai/onnx/operators/onnx__Conv.html), cross-correlation over 1 to 3 spatial axes: "
       "out[n, o, y] = B[o] + sum_{c, t} X[n, g C/G + c, y s + t d - pad_begin] W[o, c, t] over the input channels "
       "c < C/G of output channel o's group g and the kernel taps t, zero padding; X [N, C, ...], W [M, C/G, k...], "
       "B [M] -> [N, M, ...] with out = (in + pad_begin + pad_end - d (k - 1) - 1) // s + 1 (Dumoulin & Visin "
       "2016, A guide to convolution arithmetic). Empty strides / dilations / pads mean 1, 1, 0",
   vjp=_INFERENCE, kernel=_conv_kernel, flops=_conv_flops)

op("ConvTranspose", ("x", "w", "bias?"), _conv_transpose, _conv_transpose_ref,
   attrs=(*_ATTRS, Attr("output_padding", "ints", ())),
   doc="ONNX ConvTranspose (https://onnx.ai/onnx/operators/onnx__ConvTranspose.html), the adjoint of Conv: "
       "input position i of channel c adds X[n, c, i] W[c, o', t] to out[n, g M/G + o', i s + t d - pad_begin] "
       "(g the group of c, o' < M/G), plus B; X [N, C, ...], W [C, M/G, k...] -> [N, M, ...] with out = s (in - 1) "
       "+ output_padding + d (k - 1) + 1 - pad_begin - pad_end (Dumoulin & Visin 2016, section 4). Pads may be "
       "negative (an output_shape larger than the natural one)",
   vjp=_INFERENCE, kernel=_conv_kernel, flops=_conv_transpose_flops)
