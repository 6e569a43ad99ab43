"""Vision ops on NCHW tensors: Conv2d, MaxPool2d, GlobalAvgPool, Upsample2x and their
gradients (the seed flattens them to 1-D; here they keep their real rank, [N, C, H, W]).

Knowingly slow at scale, as their WGSL headers say: Conv2d / Conv2dGradInput (direct
convolution, no workgroup-memory reuse) and MaxPool2dGrad (each input rescans the windows
that contain it).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Buffer, Kernel, elementwise_groups, nested_iterations
from ..spec import NO_GRAD, Attr, need, need_f32, op
from ..types import TensorType
from .attention import MASK_SENTINEL

FAMILY = "vision"


# --- kernels and gradient rules (the op blocks below refer to them) ----------------------------


def _conv_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    n = node.type.num_elements
    if node.op == "Conv2d":
        x, k, y = ins[0].shape, ins[1].shape, node.type.shape
        body, groups = "conv2d.wgsl", elementwise_groups(n)
    elif node.op == "Conv2dGradInput":
        x, k, y = node.type.shape, ins[1].shape, ins[0].shape
        body, groups = "conv2d_grad_input.wgsl", elementwise_groups(n)
    else:  # one workgroup per weight element
        x, k, y = ins[1].shape, node.type.shape, ins[0].shape
        body, groups = "conv2d_grad_weight.wgsl", n
    values = (n, x[0], x[1], x[2], x[3], k[0], k[2], k[3], y[2], y[3], a["stride"], a["padding_h"], a["padding_w"])
    names = ("n", "batch", "cin", "h", "w", "cout", "kh", "kw", "oh", "ow", "stride", "ph", "pw")
    reads = {"Conv2d": ("x", "kern"), "Conv2dGradInput": ("dy", "kern"), "Conv2dGradWeight": ("dy", "x")}[node.op]
    loops = {"Conv2d": (x[1], k[2], k[3]), "Conv2dGradInput": (k[2], k[3], k[0])}.get(node.op, ())
    return Kernel(body[:-5], body, groups, params=tuple(zip(names, ("u32",) * 13, values, strict=True)),
                  bindings=(*(Buffer(r) for r in reads), Buffer("out", write=True)),
                  loop_iterations=nested_iterations(*loops))


def _max_pool_kernel(node, ins, target) -> Kernel:
    a = node.attrs
    x = ins[-1].shape
    y = node.type.shape if node.op == "MaxPool2d" else ins[0].shape
    n = node.type.num_elements
    values = (n, x[2], x[3], y[2], y[3], a["kernel_h"], a["kernel_w"], a["stride"], a["padding"])
    names = ("n", "h", "w", "oh", "ow", "kh", "kw", "stride", "pad")
    body = "max_pool.wgsl" if node.op == "MaxPool2d" else "max_pool_grad.wgsl"
    kh, kw, s = a["kernel_h"], a["kernel_w"], a["stride"]
    loops = (kh, kw) if node.op == "MaxPool2d" else (-(-kh // s), -(-kw // s))  # the gradient's: windows holding it
    return Kernel(body[:-5], body, elementwise_groups(n), params=tuple(zip(names, ("u32",) * 9, values, strict=True)),
                  loop_iterations=nested_iterations(*loops))


#: Both entry points of global_avg_pool.wgsl and upsample.wgsl read ``x`` (the gradient's dy).
_X_OUT = (Buffer("x"), Buffer("out", write=True))


def _global_avg_pool_kernel(node, ins, target) -> Kernel:
    full = ins[0] if node.op == "GlobalAvgPool" else node.type
    rows = math.prod(full.shape[:2])
    spatial = math.prod(full.shape[2:])
    params = (("rows", "u32", rows), ("spatial", "u32", spatial), ("inv", "f32", 1.0 / spatial),
              ("n", "u32", full.num_elements))
    if node.op == "GlobalAvgPool":
        return Kernel("global_avg_pool", "global_avg_pool.wgsl", rows, params=params, entry_point="pool")
    return Kernel("global_avg_pool_grad", "global_avg_pool.wgsl", elementwise_groups(full.num_elements),
                  params=params, entry_point="grad", bindings=_X_OUT)


def _upsample_kernel(node, ins, target) -> Kernel:
    small = ins[0] if node.op == "Upsample2x" else node.type
    n = node.type.num_elements
    up = node.op == "Upsample2x"
    return Kernel("upsample2x" if up else "upsample2x_grad", "upsample.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("h", "u32", small.shape[2]), ("w", "u32", small.shape[3])),
                  entry_point="up" if up else "grad", bindings=_X_OUT)


def _conv2d_vjp(b, node, dy, want):
    x, w = node.inputs
    geometry = {a: node.attrs[a] for a in ("stride", "padding_h", "padding_w")}
    _, _, in_h, in_w = b.type(x).shape
    _, _, kh, kw = b.type(w).shape
    return [b.emit("Conv2dGradInput", (dy, w), in_h=in_h, in_w=in_w, **geometry) if want[0] else None,
            b.emit("Conv2dGradWeight", (dy, x), kernel_h=kh, kernel_w=kw, **geometry) if want[1] else None]


def _max_pool_vjp(b, node, dy, want):
    return [b.emit("MaxPool2dGrad", (dy, node.inputs[0]),
                   **{a: node.attrs[a] for a in ("kernel_h", "kernel_w", "stride", "padding")})]


def _global_avg_pool_vjp(b, node, dy, want):
    return [b.emit("GlobalAvgPoolGrad", (dy,), shape=b.type(node.inputs[0]).shape)]


def _upsample_vjp(b, node, dy, want):
    return [b.emit("Upsample2xGrad", (dy,))]


# --- Conv2d and its gradients --------------------------------------------------------------



def conv_output_size(h: int, w: int, kh: int, kw: int, s: int, ph: int, pw: int) -> tuple[int, int]:
    """(oH, oW) = ((H + 2 ph - kH) // s + 1, ...) (Dumoulin & Visin 2016, relationship 6)."""
    need(s >= 1 and ph >= 0 and pw >= 0, f"stride must be >= 1 and padding >= 0, got stride {s}, "
                                         f"padding {ph},{pw}")
    need(h + 2 * ph >= kh and w + 2 * pw >= kw,
          f"window {kh}x{kw} is larger than the padded input {h + 2 * ph}x{w + 2 * pw}")
    return (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1


def _conv_geometry(a) -> tuple[int, int, int]:
    # (stride, padding_h, padding_w) of a conv op, or of a pool op with one ``padding``
    if "padding" in a:
        return a["stride"], a["padding"], a["padding"]
    return a["stride"], a["padding_h"], a["padding_w"]


def _nchw(t: TensorType, what: str) -> tuple[int, int, int, int]:
    need_f32(t, what)
    need(t.rank == 4, f"{what} must be [N, C, H, W], got {t}")
    return t.shape


def _conv2d(ts, a):
    n, cin, h, w = _nchw(ts[0], "input")
    cout, cin2, kh, kw = _nchw(ts[1], "kernel")
    need(cin == cin2, f"kernel {ts[1]} has {cin2} input channels, the input {ts[0]} has {cin}")
    return TensorType((n, cout, *conv_output_size(h, w, kh, kw, *_conv_geometry(a))))


def _windows(a, kh: int, kw: int, oh: int, ow: int):
    """(kh, kw, rows, cols): the strided slice of the padded input each kernel tap reads."""
    s = a["stride"]
    for i in range(kh):
        for j in range(kw):
            yield i, j, slice(i, i + s * (oh - 1) + 1, s), slice(j, j + s * (ow - 1) + 1, s)


def _pad_hw(x, ph: int, pw: int, value: float = 0.0):
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _conv2d_ref(xs, a):
    x, w = xs
    n, cout, oh, ow = _conv2d([TensorType(x.shape), TensorType(w.shape)], a).shape
    xp = _pad_hw(x, a["padding_h"], a["padding_w"])
    out = np.zeros((n, cout, oh, ow))
    for i, j, rows, cols in _windows(a, w.shape[2], w.shape[3], oh, ow):
        out += np.einsum("nchw,oc->nohw", xp[:, :, rows, cols], w[:, :, i, j])
    return out


_CONV_ATTRS = (Attr("stride", "int", 1), Attr("padding_h", "int", 0), Attr("padding_w", "int", 0))
op("Conv2d", ("x", "kernel"), _conv2d, _conv2d_ref, attrs=_CONV_ATTRS,
   doc="out[n,o,y,x] = sum_{c,i,j} in[n,c,y s - ph + i, x s - pw + j] k[o,c,i,j] (zero padding; "
       "cross-correlation as torch.nn.Conv2d): input [N,Cin,H,W], kernel [Cout,Cin,kH,kW] -> "
       "[N,Cout,oH,oW], oH = (H + 2 ph - kH) // stride + 1 (Dumoulin & Visin 2016, A guide to "
       "convolution arithmetic; seed: Conv2d)", vjp=_conv2d_vjp, kernel=_conv_kernel)


def _conv2d_grad_input(ts, a):
    n, cout, oh, ow = _nchw(ts[0], "dy")
    cout2, cin, kh, kw = _nchw(ts[1], "kernel")
    need(cout == cout2, f"dy {ts[0]} has {cout} channels, the kernel {ts[1]} {cout2} outputs")
    want = conv_output_size(a["in_h"], a["in_w"], kh, kw, *_conv_geometry(a))
    need(want == (oh, ow), f"an input of {a['in_h']}x{a['in_w']} gives a {want[0]}x{want[1]} output, "
                            f"dy is {oh}x{ow}")
    return TensorType((n, cin, a["in_h"], a["in_w"]))


def _conv2d_grad_input_ref(xs, a):
    dy, w = xs
    n, cin, h, wd = _conv2d_grad_input([TensorType(dy.shape), TensorType(w.shape)], a).shape
    ph, pw = a["padding_h"], a["padding_w"]
    dxp = np.zeros((n, cin, h + 2 * ph, wd + 2 * pw))
    for i, j, rows, cols in _windows(a, w.shape[2], w.shape[3], dy.shape[2], dy.shape[3]):
        dxp[:, :, rows, cols] += np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
    return dxp[:, :, ph:ph + h, pw:pw + wd]


op("Conv2dGradInput", ("dy", "kernel"), _conv2d_grad_input, _conv2d_grad_input_ref,
   attrs=(Attr("in_h", "int"), Attr("in_w", "int"), *_CONV_ATTRS),
   doc="d input of Conv2d: the transposed convolution dx[n,c,y,x] = sum over (o, i, j, oy, ox) "
       "with oy s - ph + i = y, ox s - pw + j = x of dy[n,o,oy,ox] k[o,c,i,j]; inputs [dy, kernel] "
       "-> [N,Cin,in_h,in_w] (in_h, in_w: a strided conv's input size is not implied by dy) "
       "(seed: Conv2dGradInput)", vjp=NO_GRAD, kernel=_conv_kernel)


def _conv2d_grad_weight(ts, a):
    n, cout, oh, ow = _nchw(ts[0], "dy")
    n2, cin, h, w = _nchw(ts[1], "input")
    need(n == n2, f"dy {ts[0]} and input {ts[1]} differ in batch")
    want = conv_output_size(h, w, a["kernel_h"], a["kernel_w"], *_conv_geometry(a))
    need(want == (oh, ow), f"a {a['kernel_h']}x{a['kernel_w']} kernel over {ts[1]} gives "
                            f"{want[0]}x{want[1]}, dy is {oh}x{ow}")
    return TensorType((cout, cin, a["kernel_h"], a["kernel_w"]))


def _conv2d_grad_weight_ref(xs, a):
    dy, x = xs
    dw = np.zeros(_conv2d_grad_weight([TensorType(dy.shape), TensorType(x.shape)], a).shape)
    xp = _pad_hw(x, a["padding_h"], a["padding_w"])
    for i, j, rows, cols in _windows(a, dw.shape[2], dw.shape[3], dy.shape[2], dy.shape[3]):
        dw[:, :, i, j] = np.einsum("nohw,nchw->oc", dy, xp[:, :, rows, cols])
    return dw


op("Conv2dGradWeight", ("dy", "x"), _conv2d_grad_weight, _conv2d_grad_weight_ref,
   attrs=(Attr("kernel_h", "int"), Attr("kernel_w", "int"), *_CONV_ATTRS),
   doc="d kernel of Conv2d: dk[o,c,i,j] = sum_{n,oy,ox} dy[n,o,oy,ox] in[n,c,oy s - ph + i, "
       "ox s - pw + j] (zero padding); inputs [dy, input] -> [Cout,Cin,kernel_h,kernel_w] "
       "(seed: Conv2dGradWeight)", vjp=NO_GRAD, kernel=_conv_kernel)


# --- MaxPool2d and its gradient --------------------------------------------------------------

# stride has no default: torch.nn.MaxPool2d's is the kernel size, one the kernel's two sides cannot give
_POOL_ATTRS = (Attr("kernel_h", "int"), Attr("kernel_w", "int"), Attr("stride", "int"), Attr("padding", "int", 0))


def _max_pool(ts, a):
    n, c, h, w = _nchw(ts[0], "input")
    need(a["kernel_h"] >= 1 and a["kernel_w"] >= 1, f"kernel must be >= 1x1, got {a['kernel_h']}x{a['kernel_w']}")
    return TensorType((n, c, *conv_output_size(h, w, a["kernel_h"], a["kernel_w"], *_conv_geometry(a))))


def _pool_taps(x, a):
    """[kH*kW, N, C, oH, oW]: the value of each window tap, -inf on padding."""
    n, c, oh, ow = _max_pool([TensorType(x.shape)], a).shape
    xp = _pad_hw(x, a["padding"], a["padding"], -np.inf)
    return np.stack([xp[:, :, rows, cols] for _, _, rows, cols in _windows(a, a["kernel_h"], a["kernel_w"], oh, ow)])


def _max_pool_ref(xs, a):
    m = _pool_taps(xs[0], a).max(axis=0)
    return np.where(np.isfinite(m), m, MASK_SENTINEL)


op("MaxPool2d", ("x",), _max_pool, _max_pool_ref, attrs=_POOL_ATTRS,
   doc="out[n,c,y,x] = max of in[n,c,y s - p + i, x s - p + j] over the in-bounds taps i < kH, "
       "j < kW (padding never wins, as torch.nn.MaxPool2d's -inf padding); a window lying wholly "
       "in the padding (p >= kernel) gives the finite MASK_SENTINEL. [N,C,H,W] -> [N,C,oH,oW], "
       "oH = (H + 2p - kH) // stride + 1 (seed: MaxPool2d)", vjp=_max_pool_vjp, kernel=_max_pool_kernel)


def _max_pool_grad(ts, a):
    out = _max_pool(ts[1:], a)
    need_f32(ts[0], "dy")
    need(ts[0] == out, f"dy must be {out}, got {ts[0]}")
    return ts[1]


def _max_pool_grad_ref(xs, a):
    dy, x = xs
    taps = _pool_taps(x, a)
    first = taps.argmax(axis=0)  # the first maximum in (i, j) scan order takes the gradient
    live = np.isfinite(taps.max(axis=0))
    p = a["padding"]
    dxp = np.zeros((x.shape[0], x.shape[1], x.shape[2] + 2 * p, x.shape[3] + 2 * p))
    for t, (_, _, rows, cols) in enumerate(_windows(a, a["kernel_h"], a["kernel_w"], *dy.shape[2:])):
        dxp[:, :, rows, cols] += np.where(live & (first == t), dy, 0.0)
    return dxp[:, :, p:p + x.shape[2], p:p + x.shape[3]]


op("MaxPool2dGrad", ("dy", "x"), _max_pool_grad, _max_pool_grad_ref, attrs=_POOL_ATTRS,
   doc="d input of MaxPool2d: each window's dy goes to its first maximum in row-major tap order "
       "(ties: the earliest tap, as PyTorch), summed over overlapping windows; a window wholly in "
       "the padding passes nothing. Inputs [dy, input]", vjp=NO_GRAD, kernel=_max_pool_kernel)


# --- GlobalAvgPool, Upsample2x and their gradients ---------------------------------------------


def _global_avg_pool(ts, a):
    x = ts[0]
    need_f32(x, "input")
    need(x.rank in (3, 4), f"input must be [N, C, S] or [N, C, H, W], got {x}")
    return TensorType(x.shape[:2])


op("GlobalAvgPool", ("x",), _global_avg_pool, lambda xs, a: xs[0].mean(axis=tuple(range(2, xs[0].ndim))),
   doc="out[n,c] = mean of x[n,c] over its spatial positions; [N,C,H,W] or [N,C,S] -> [N,C] "
       "(Lin et al. 2014, Network in Network; seed: GlobalAvgPool)",
   vjp=_global_avg_pool_vjp, kernel=_global_avg_pool_kernel)


def _global_avg_pool_grad(ts, a):
    dy, shape = ts[0], tuple(a["shape"])
    need_f32(dy, "dy")
    need(len(shape) in (3, 4) and all(d >= 1 for d in shape), f"shape must be [N,C,S] or [N,C,H,W], got {shape}")
    need(dy.shape == shape[:2], f"dy must be {list(shape[:2])} for shape {list(shape)}, got {dy}")
    return TensorType(shape)


def _global_avg_pool_grad_ref(xs, a):
    shape = tuple(a["shape"])
    dy = xs[0].reshape(shape[:2] + (1,) * (len(shape) - 2))
    return np.broadcast_to(dy / math.prod(shape[2:]), shape).copy()


op("GlobalAvgPoolGrad", ("dy",), _global_avg_pool_grad, _global_avg_pool_grad_ref, attrs=(Attr("shape", "ints"),),
   doc="dx[n,c,...] = dy[n,c] / (number of spatial positions); inputs [dy [N,C]] -> ``shape`` "
       "(seed: GlobalAvgPoolGrad)", vjp=NO_GRAD, kernel=_global_avg_pool_kernel)


def _upsample(ts, a):
    n, c, h, w = _nchw(ts[0], "input")
    return TensorType((n, c, 2 * h, 2 * w))


op("Upsample2x", ("x",), _upsample, lambda xs, a: xs[0].repeat(2, axis=2).repeat(2, axis=3),
   doc="nearest-neighbour 2x: out[n,c,y,x] = in[n,c,y//2,x//2], [N,C,H,W] -> [N,C,2H,2W] "
       "(seed: Upsample2x)", vjp=_upsample_vjp, kernel=_upsample_kernel)


def _upsample_grad(ts, a):
    n, c, h, w = _nchw(ts[0], "dy")
    need(h % 2 == 0 and w % 2 == 0, f"dy must be [N, C, 2H, 2W], got {ts[0]}")
    return TensorType((n, c, h // 2, w // 2))


def _upsample_grad_ref(xs, a):
    n, c, h, w = xs[0].shape
    return xs[0].reshape(n, c, h // 2, 2, w // 2, 2).sum(axis=(3, 5))


op("Upsample2xGrad", ("dy",), _upsample_grad, _upsample_grad_ref,
   doc="dx[n,c,y,x] = sum of the 2x2 block dy[n,c,2y:2y+2,2x:2x+2]; [N,C,2H,2W] -> [N,C,H,W] "
       "(seed: Upsample2xGrad)", vjp=NO_GRAD, kernel=_upsample_kernel)


