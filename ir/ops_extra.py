"""The rest of the seed's op set: elementwise Abs, Log, Recip, Greater; LogSoftmax; BceLoss;
sliding-window and cross attention; the NCHW vision ops (Conv2d, MaxPool2d, GlobalAvgPool,
Upsample2x); and the gradient op of each differentiable one.

Same conventions as :mod:`ops` and :mod:`ops_backward`: one block per op with its shape rule
(raising :class:`ShapeError` with the shapes) and a float64 numpy reference written from
the formula cited in its ``doc``. Gradient ops take ``dy`` first and return the gradient of
one forward input; they join :data:`ops_backward.GRAD_OPS` (their own rule: none). Vision
tensors keep their real rank, [N, C, H, W], where the seed flattens them to 1-D. Abs, Log and
Recip are not matmul epilogue steps: ``ops.EPILOGUE_UNARY`` is fixed when ops.py loads.
:mod:`seed_ops` maps every seed op kind to the ops that implement it.
"""

from __future__ import annotations

import math

import numpy as np

from .ops import MASK_SENTINEL, OpDef, _broadcast, _f32, _need, _same_f32, register
from .ops_backward import GRAD_OPS, _like, _log_softmax
from .types import TensorType

#: Every op this module registers, forward and gradient, in registration order.
EXTRA_OPS: list[str] = []
#: The gradient ops among them (also added to ops_backward.GRAD_OPS).
EXTRA_GRAD_OPS: set[str] = set()


def _add(op: OpDef, grad: bool = False) -> None:
    register(op)
    EXTRA_OPS.append(op.name)
    if grad:
        EXTRA_GRAD_OPS.add(op.name)
        GRAD_OPS.add(op.name)


# --- Abs, Log, Recip and their gradients --------------------------------------------------

_add(OpDef("Abs", 1, 1, _same_f32, lambda xs, a: np.abs(xs[0]), doc="|x| (seed: Abs)"))


def _log_ref(xs, a):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(xs[0])


def _recip_ref(xs, a):
    with np.errstate(divide="ignore"):
        return 1.0 / xs[0]


_add(OpDef("Log", 1, 1, _same_f32, _log_ref,
           doc="natural log; as numpy (IEEE 754 log): -inf at 0, NaN below 0 (seed: Log)"))
_add(OpDef("Recip", 1, 1, _same_f32, _recip_ref, doc="1 / x; +-inf at +-0 as numpy (seed: Recip)"))

_add(OpDef("AbsGrad", 2, 2, lambda ts, a: _like(ts, "x", 1), lambda xs, a: xs[0] * np.sign(xs[1]),
           doc="dx = dy * sign(x), 0 at x = 0 (numpy sign, as PyTorch's abs backward); inputs [dy, x]"), grad=True)
_add(OpDef("LogGrad", 2, 2, lambda ts, a: _like(ts, "x", 1), lambda xs, a: xs[0] / xs[1],
           doc="dx = dy / x; inputs [dy, x]"), grad=True)
_add(OpDef("RecipGrad", 2, 2, lambda ts, a: _like(ts, "x", 1), lambda xs, a: -(xs[0] / xs[1]) / xs[1],
           doc="dx = -dy / x^2; inputs [dy, x]"), grad=True)


# --- Greater ------------------------------------------------------------------------------

_add(OpDef("Greater", 2, 2, _broadcast, lambda xs, a: (xs[0] > xs[1]).astype(np.float64),
           doc="1.0 where a > b else 0.0, numpy broadcasting (a NaN compares false); piecewise "
               "constant, so its gradient is zero (seed: Greater, same shapes only)"))


# --- LogSoftmax and its gradient -----------------------------------------------------------

_add(OpDef("LogSoftmax", 1, 1, _same_f32, lambda xs, a: _log_softmax(xs[0]),
           doc="x - max - log(sum exp(x - max)) over the last axis, max-subtracted so it is exact "
               "for large logits (Goodfellow et al. 2016, Deep Learning, sec. 4.1; seed: LogSoftmax)"))
_add(OpDef("LogSoftmaxGrad", 2, 2, lambda ts, a: _like(ts, "y", 1),
           lambda xs, a: xs[0] - np.exp(xs[1]) * xs[0].sum(axis=-1, keepdims=True),
           doc="dx = dy - exp(y) * sum_j dy[., j] over the last axis, y the LogSoftmax output "
               "(Jacobian delta_ij - softmax_j); inputs [dy, y]"), grad=True)


# --- BceLoss and its gradient ----------------------------------------------------------------

#: Lower clamp of each log in BceLoss, as torch.nn.BCELoss (keeps the loss finite at p = 0, 1).
BCE_LOG_MIN = -100.0


def _bce(ts, a):
    pred, labels = ts
    _f32(pred, "pred")
    _need(labels == pred, f"labels {labels} must have the type of pred {pred}")
    return TensorType((1,))


def _clamped_log(u):
    with np.errstate(divide="ignore", invalid="ignore"):
        lu = np.log(u)
    return np.maximum(lu, BCE_LOG_MIN), lu > BCE_LOG_MIN


def _bce_ref(xs, a):
    p, t = xs
    lp, _ = _clamped_log(p)
    lq, _ = _clamped_log(1.0 - p)
    return np.array([-(t * lp + (1.0 - t) * lq).sum() / p.size])


def _bce_grad_ref(xs, a):
    p, t = xs
    _, in_p = _clamped_log(p)
    _, in_q = _clamped_log(1.0 - p)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(in_p, t / p, 0.0) - np.where(in_q, (1.0 - t) / (1.0 - p), 0.0)
    return -d / p.size


_add(OpDef("BceLoss", 2, 2, _bce, _bce_ref,
           doc="loss[1] = -(1/n) sum t log(p) + (1 - t) log(1 - p) over all n elements, each log "
               "clamped below at -100 as torch.nn.BCELoss (so p = 0 or 1 gives a finite loss); pred p "
               "in [0, 1], labels t of pred's type (0/1 or soft). Outside [0, 1] the reference is NaN "
               "(seed: BceLoss; the clamp from the torch.nn.BCELoss documentation)"))


def _bce_grad(ts, a):
    _bce(ts, a)
    return ts[0]


_add(OpDef("BceLossGrad", 2, 2, _bce_grad, _bce_grad_ref,
           doc="d loss / d p = -(1/n) (t/p [log p > -100] - (1-t)/(1-p) [log(1-p) > -100]): the "
               "derivative of the clamped loss, 0 where a log is clamped (at p = 0 or 1). Inputs "
               "[pred, labels]; a loss seed other than 1 is applied by a Mul after it"), grad=True)


# --- SlidingWindowAttention, CrossAttention and their gradients -------------------------------


def _windowed_attention(ts, a, cross: bool):
    q, k, v = ts[:3]
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    for t, w, what in ((q, nh * hd, "q"), (k, nkv * hd, "k"), (v, nkv * hd, "v")):
        _f32(t, what)
        _need(t.rank == 2 and t.shape[1] == w, f"{what} must be [rows,{w}], got {t}")
    _need(nkv >= 1 and nh % nkv == 0, f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    _need(v.shape[0] == k.shape[0], f"k {k} and v {v} must have the same number of rows")
    _need(cross or k.shape[0] == q.shape[0], f"q {q} and k {k} must have the same number of rows")
    _need(batch >= 1 and q.shape[0] % batch == 0 and k.shape[0] % batch == 0,
          f"q {q} and k {k} rows do not split into {batch} sequences")
    if not cross:
        w = a["window_size"]
        _need(isinstance(w, int) and w >= 1, f"window_size must be an int >= 1, got {w!r}")
    if len(ts) == 4:
        kv_seq = k.shape[0] // batch
        _f32(ts[3], "key_mask")
        _need(ts[3].shape == (batch, kv_seq), f"key_mask must be [{batch},{kv_seq}], got {ts[3]}")
    return TensorType((q.shape[0], nh * hd))


def attention_band(q_seq: int, kv_seq: int, window: int) -> np.ndarray:
    """[q_seq, kv_seq] bool: the keys query row i may see. window 0: all (CrossAttention);
    else the ``window`` rows up to and including i (i - window < j <= i, Mistral / Beltagy
    et al. 2020), as the seed's ``my_kv_start = my_kv_len - min(my_kv_len, window_size)``."""
    i, j = np.arange(q_seq)[:, None], np.arange(kv_seq)[None, :]
    if window == 0:
        return np.ones((q_seq, kv_seq), dtype=bool)
    return (j <= i) & (j > i - window)


def _scores(qh, kh, band, kept, scale):
    # Softmax of one (sequence, head): key-masked scores become MASK_SENTINEL, keys outside the
    # band get weight 0, so a row whose keys are all masked averages the values in its band.
    s = np.where(kept[None, :], (qh @ kh.T) * scale, MASK_SENTINEL)
    m = np.where(band, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.exp(np.where(band, s - m, -np.inf))
    return e / e.sum(axis=-1, keepdims=True)


def windowed_attention(q, k, v, a, window: int, key_mask=None, do=None):
    """Attention of each query row over its band (:func:`attention_band`), GQA and key masking.

    Rows hold ``batch`` sequences: q [B*Sq, H*D], k/v [B*Skv, KV*D]; query head h reads kv head
    h // (H / KV). Without ``do``: the output (Vaswani et al. 2017, eq. 1). With ``do`` (dO):
    (dq, dk, dv) by the FlashAttention-2 backward (Dao 2023, Algorithm 2, untiled): dV = P^T dO,
    dS = P * (dO V^T - rowsum(P * dO V^T)) zeroed at masked keys, dQ = scale dS K, dK = scale dS^T Q.
    """
    nh, nkv, hd, batch = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["batch"]
    sq, skv = q.shape[0] // batch, k.shape[0] // batch
    group, scale = nh // nkv, 1.0 / math.sqrt(hd)
    band = attention_band(sq, skv, window)
    out = np.zeros((q.shape[0], nh * hd))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(batch):
        qr, kr = slice(b * sq, (b + 1) * sq), slice(b * skv, (b + 1) * skv)
        kept = np.ones(skv, dtype=bool) if key_mask is None else key_mask[b] > 0
        for h in range(nh):
            qc, kc = slice(h * hd, (h + 1) * hd), slice((h // group) * hd, (h // group + 1) * hd)
            qh, kh, vh = q[qr, qc], k[kr, kc], v[kr, kc]
            p = _scores(qh, kh, band, kept, scale)
            if do is None:
                out[qr, qc] = p @ vh
                continue
            doh = do[qr, qc]
            dp = doh @ vh.T
            ds = np.where(kept[None, :], p * (dp - (p * dp).sum(axis=-1, keepdims=True)), 0.0)
            dv[kr, kc] += p.T @ doh
            dq[qr, qc] = scale * ds @ kh
            dk[kr, kc] += scale * ds.T @ qh
    return out if do is None else (dq, dk, dv)


_SWA_ATTRS = ("num_heads", "num_kv_heads", "head_dim", "window_size", "batch")
_CROSS_ATTRS = ("num_heads", "num_kv_heads", "head_dim", "batch")
_ATTENTION_KINDS = {
    # op: (cross, attrs, window of the attrs, doc)
    "SlidingWindowAttention": (False, _SWA_ATTRS, lambda a: a["window_size"],
                               "causal GQA attention where row i sees keys i - window_size < j <= i; "
                               "q, k, v [B*S, .]; optional key_mask [B, S] (1 keeps a key): a row whose "
                               "window is fully masked averages the values in its window (Beltagy et al. "
                               "2020, Longformer; Jiang et al. 2023, Mistral 7B; seed: SlidingWindowAttention)"),
    "CrossAttention": (True, _CROSS_ATTRS, lambda a: 0,
                       "non-causal GQA attention of q [B*Sq, H*D] over k, v [B*Skv, KV*D] of another "
                       "sequence; optional key_mask [B, Skv]: a fully masked row averages all values "
                       "(encoder-decoder attention, Vaswani et al. 2017; seed: CrossAttention, and "
                       "MultiHeadAttn with is_cross)"),
}


def _attention_ops(name, cross, attrs, window, doc):
    def ref(xs, a):
        return windowed_attention(*xs[:3], a, window(a), xs[3] if len(xs) > 3 else None)

    _add(OpDef(name, 3, 4, lambda ts, a: _windowed_attention(ts, a, cross), ref, attrs=attrs,
               defaults={"batch": 1}, doc=doc))
    for index, part in enumerate("QKV"):
        def infer(ts, a, index=index):
            out = _windowed_attention(ts[1:], a, cross)
            _f32(ts[0], "dO")
            _need(ts[0] == out, f"dO must be {out}, got {ts[0]}")
            return ts[1 + index]

        def grad_ref(xs, a, index=index):
            mask = xs[4] if len(xs) == 5 else None
            return windowed_attention(*xs[1:4], a, window(a), mask, do=xs[0])[index]

        _add(OpDef(f"{name}Grad{part}", 4, 5, infer, grad_ref, attrs=attrs, defaults={"batch": 1},
                   doc=f"d{part.lower()} of {name}; inputs [dO, q, k, v(, key_mask)], probabilities "
                       f"recomputed (see windowed_attention; seed: MultiHeadAttnGrad{part}, without "
                       "its saved LSE)"), grad=True)


for _name, _kind in _ATTENTION_KINDS.items():
    _attention_ops(_name, *_kind)


# --- Conv2d and its gradients --------------------------------------------------------------

_CONV_DEFAULTS = {"stride": 1, "padding_h": 0, "padding_w": 0}


def conv_output_size(h: int, w: int, kh: int, kw: int, s: int, ph: int, pw: int) -> tuple[int, int]:
    """(oH, oW) = ((H + 2 ph - kH) // s + 1, ...) (Dumoulin & Visin 2016, relationship 6)."""
    _need(s >= 1 and ph >= 0 and pw >= 0, f"stride must be >= 1 and padding >= 0, got stride {s}, "
                                          f"padding {ph},{pw}")
    _need(h + 2 * ph >= kh and w + 2 * pw >= kw,
          f"window {kh}x{kw} is larger than the padded input {h + 2 * ph}x{w + 2 * pw}")
    return (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1


def _conv_geometry(a) -> tuple[int, int, int]:
    # (stride, padding_h, padding_w) of a conv op, or of a pool op with one ``padding``
    if "padding" in a:
        return a["stride"], a["padding"], a["padding"]
    return a["stride"], a["padding_h"], a["padding_w"]


def _nchw(t: TensorType, what: str) -> tuple[int, int, int, int]:
    _f32(t, what)
    _need(t.rank == 4, f"{what} must be [N, C, H, W], got {t}")
    return t.shape


def _conv2d(ts, a):
    n, cin, h, w = _nchw(ts[0], "input")
    cout, cin2, kh, kw = _nchw(ts[1], "kernel")
    _need(cin == cin2, f"kernel {ts[1]} has {cin2} input channels, the input {ts[0]} has {cin}")
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


_CONV_ATTRS = ("stride", "padding_h", "padding_w")
_add(OpDef("Conv2d", 2, 2, _conv2d, _conv2d_ref, attrs=_CONV_ATTRS, defaults=_CONV_DEFAULTS,
           doc="out[n,o,y,x] = sum_{c,i,j} in[n,c,y s - ph + i, x s - pw + j] k[o,c,i,j] (zero padding; "
               "cross-correlation as torch.nn.Conv2d): input [N,Cin,H,W], kernel [Cout,Cin,kH,kW] -> "
               "[N,Cout,oH,oW], oH = (H + 2 ph - kH) // stride + 1 (Dumoulin & Visin 2016, A guide to "
               "convolution arithmetic; seed: Conv2d)"))


def _conv2d_grad_input(ts, a):
    n, cout, oh, ow = _nchw(ts[0], "dy")
    cout2, cin, kh, kw = _nchw(ts[1], "kernel")
    _need(cout == cout2, f"dy {ts[0]} has {cout} channels, the kernel {ts[1]} {cout2} outputs")
    want = conv_output_size(a["in_h"], a["in_w"], kh, kw, *_conv_geometry(a))
    _need(want == (oh, ow), f"an input of {a['in_h']}x{a['in_w']} gives a {want[0]}x{want[1]} output, "
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


_add(OpDef("Conv2dGradInput", 2, 2, _conv2d_grad_input, _conv2d_grad_input_ref,
           attrs=("in_h", "in_w", *_CONV_ATTRS), defaults=_CONV_DEFAULTS,
           doc="d input of Conv2d: the transposed convolution dx[n,c,y,x] = sum over (o, i, j, oy, ox) "
               "with oy s - ph + i = y, ox s - pw + j = x of dy[n,o,oy,ox] k[o,c,i,j]; inputs [dy, kernel] "
               "-> [N,Cin,in_h,in_w] (in_h, in_w: a strided conv's input size is not implied by dy) "
               "(seed: Conv2dGradInput)"), grad=True)


def _conv2d_grad_weight(ts, a):
    n, cout, oh, ow = _nchw(ts[0], "dy")
    n2, cin, h, w = _nchw(ts[1], "input")
    _need(n == n2, f"dy {ts[0]} and input {ts[1]} differ in batch")
    want = conv_output_size(h, w, a["kernel_h"], a["kernel_w"], *_conv_geometry(a))
    _need(want == (oh, ow), f"a {a['kernel_h']}x{a['kernel_w']} kernel over {ts[1]} gives "
                            f"{want[0]}x{want[1]}, dy is {oh}x{ow}")
    return TensorType((cout, cin, a["kernel_h"], a["kernel_w"]))


def _conv2d_grad_weight_ref(xs, a):
    dy, x = xs
    dw = np.zeros(_conv2d_grad_weight([TensorType(dy.shape), TensorType(x.shape)], a).shape)
    xp = _pad_hw(x, a["padding_h"], a["padding_w"])
    for i, j, rows, cols in _windows(a, dw.shape[2], dw.shape[3], dy.shape[2], dy.shape[3]):
        dw[:, :, i, j] = np.einsum("nohw,nchw->oc", dy, xp[:, :, rows, cols])
    return dw


_add(OpDef("Conv2dGradWeight", 2, 2, _conv2d_grad_weight, _conv2d_grad_weight_ref,
           attrs=("kernel_h", "kernel_w", *_CONV_ATTRS), defaults=_CONV_DEFAULTS,
           doc="d kernel of Conv2d: dk[o,c,i,j] = sum_{n,oy,ox} dy[n,o,oy,ox] in[n,c,oy s - ph + i, "
               "ox s - pw + j] (zero padding); inputs [dy, input] -> [Cout,Cin,kernel_h,kernel_w] "
               "(seed: Conv2dGradWeight)"), grad=True)


# --- MaxPool2d and its gradient --------------------------------------------------------------

_POOL_ATTRS = ("kernel_h", "kernel_w", "stride", "padding")


def _max_pool(ts, a):
    n, c, h, w = _nchw(ts[0], "input")
    _need(a["kernel_h"] >= 1 and a["kernel_w"] >= 1, f"kernel must be >= 1x1, got {a['kernel_h']}x{a['kernel_w']}")
    return TensorType((n, c, *conv_output_size(h, w, a["kernel_h"], a["kernel_w"], *_conv_geometry(a))))


def _pool_taps(x, a):
    """[kH*kW, N, C, oH, oW]: the value of each window tap, -inf on padding."""
    n, c, oh, ow = _max_pool([TensorType(x.shape)], a).shape
    xp = _pad_hw(x, a["padding"], a["padding"], -np.inf)
    return np.stack([xp[:, :, rows, cols] for _, _, rows, cols in _windows(a, a["kernel_h"], a["kernel_w"], oh, ow)])


def _max_pool_ref(xs, a):
    m = _pool_taps(xs[0], a).max(axis=0)
    return np.where(np.isfinite(m), m, MASK_SENTINEL)


_add(OpDef("MaxPool2d", 1, 1, _max_pool, _max_pool_ref, attrs=_POOL_ATTRS, defaults={"padding": 0},
           doc="out[n,c,y,x] = max of in[n,c,y s - p + i, x s - p + j] over the in-bounds taps i < kH, "
               "j < kW (padding never wins, as torch.nn.MaxPool2d's -inf padding); a window lying wholly "
               "in the padding (p >= kernel) gives the finite MASK_SENTINEL. [N,C,H,W] -> [N,C,oH,oW], "
               "oH = (H + 2p - kH) // stride + 1 (seed: MaxPool2d)"))


def _max_pool_grad(ts, a):
    out = _max_pool(ts[1:], a)
    _f32(ts[0], "dy")
    _need(ts[0] == out, f"dy must be {out}, got {ts[0]}")
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


_add(OpDef("MaxPool2dGrad", 2, 2, _max_pool_grad, _max_pool_grad_ref, attrs=_POOL_ATTRS, defaults={"padding": 0},
           doc="d input of MaxPool2d: each window's dy goes to its first maximum in row-major tap order "
               "(ties: the earliest tap, as PyTorch), summed over overlapping windows; a window wholly in "
               "the padding passes nothing. Inputs [dy, input]"), grad=True)


# --- GlobalAvgPool, Upsample2x and their gradients ---------------------------------------------


def _global_avg_pool(ts, a):
    x = ts[0]
    _f32(x, "input")
    _need(x.rank in (3, 4), f"input must be [N, C, S] or [N, C, H, W], got {x}")
    return TensorType(x.shape[:2])


_add(OpDef("GlobalAvgPool", 1, 1, _global_avg_pool, lambda xs, a: xs[0].mean(axis=tuple(range(2, xs[0].ndim))),
           doc="out[n,c] = mean of x[n,c] over its spatial positions; [N,C,H,W] or [N,C,S] -> [N,C] "
               "(Lin et al. 2014, Network in Network; seed: GlobalAvgPool)"))


def _global_avg_pool_grad(ts, a):
    dy, shape = ts[0], tuple(a["shape"])
    _f32(dy, "dy")
    _need(len(shape) in (3, 4) and all(d >= 1 for d in shape), f"shape must be [N,C,S] or [N,C,H,W], got {shape}")
    _need(dy.shape == shape[:2], f"dy must be {list(shape[:2])} for shape {list(shape)}, got {dy}")
    return TensorType(shape)


def _global_avg_pool_grad_ref(xs, a):
    shape = tuple(a["shape"])
    dy = xs[0].reshape(shape[:2] + (1,) * (len(shape) - 2))
    return np.broadcast_to(dy / math.prod(shape[2:]), shape).copy()


_add(OpDef("GlobalAvgPoolGrad", 1, 1, _global_avg_pool_grad, _global_avg_pool_grad_ref, attrs=("shape",),
           doc="dx[n,c,...] = dy[n,c] / (number of spatial positions); inputs [dy [N,C]] -> ``shape`` "
               "(seed: GlobalAvgPoolGrad)"), grad=True)


def _upsample(ts, a):
    n, c, h, w = _nchw(ts[0], "input")
    return TensorType((n, c, 2 * h, 2 * w))


_add(OpDef("Upsample2x", 1, 1, _upsample, lambda xs, a: xs[0].repeat(2, axis=2).repeat(2, axis=3),
           doc="nearest-neighbour 2x: out[n,c,y,x] = in[n,c,y//2,x//2], [N,C,H,W] -> [N,C,2H,2W] "
               "(seed: Upsample2x)"))


def _upsample_grad(ts, a):
    n, c, h, w = _nchw(ts[0], "dy")
    _need(h % 2 == 0 and w % 2 == 0, f"dy must be [N, C, 2H, 2W], got {ts[0]}")
    return TensorType((n, c, h // 2, w // 2))


def _upsample_grad_ref(xs, a):
    n, c, h, w = xs[0].shape
    return xs[0].reshape(n, c, h // 2, 2, w // 2, 2).sum(axis=(3, 5))


_add(OpDef("Upsample2xGrad", 1, 1, _upsample_grad, _upsample_grad_ref,
           doc="dx[n,c,y,x] = sum of the 2x2 block dy[n,c,2y:2y+2,2x:2x+2]; [N,C,2H,2W] -> [N,C,H,W] "
               "(seed: Upsample2xGrad)"), grad=True)


__all__ = ["BCE_LOG_MIN", "EXTRA_GRAD_OPS", "EXTRA_OPS", "attention_band", "conv_output_size", "windowed_attention"]
