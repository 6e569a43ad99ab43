"""Token embedding and rotary position embedding: Embedding and its gradient ScatterAdd,
RoPE and RoPEGrad. The RoPE helpers (:func:`rope_pairs`, :func:`rope_ref`,
:func:`rope_params`) are shared with the attention and KV-cache families, whose fused
kernels apply the same rotation.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError, LoweringError
from ..kernel import Buffer, Kernel, elementwise_groups
from ..spec import NO_GRAD, Attr, need, need_f32, no_grad, op
from ..types import DType, TensorType

FAMILY = "transformer"

#: Largest head_dim the RoPE uniform holds frequencies for (64 vec4 = 256 pairs).
MAX_ROPE_HEAD_DIM = 512


# --- Embedding, ScatterAdd ---------------------------------------------------------------------


def _embedding(ts, a):
    idx, table = ts
    need(idx.dtype is DType.U32 and idx.rank == 1, f"indices must be u32 1-D, got {idx}")
    need(table.dtype is DType.F32 and table.rank == 2, f"table must be f32 2-D, got {table}")
    return TensorType((idx.shape[0], table.shape[1]))


def _embedding_ref(xs, a):
    idx, table = xs
    bad = idx >= table.shape[0]
    if bad.any():
        raise InputError(f"Embedding: index {int(idx[bad][0])} out of range for a table of {table.shape[0]} rows")
    return table[idx.astype(np.int64)]


def _embedding_kernel(node, ins, target) -> Kernel:
    vocab, h = ins[1].shape
    n = node.type.num_elements
    return Kernel("embedding", "embedding.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("h", "u32", h), ("vocab", "u32", vocab)))


def _embedding_vjp(b, node, dy, want):
    idx, table = node.inputs
    return [None, b.emit("ScatterAdd", (idx, dy), vocab_size=b.type(table).shape[0])]


op("Embedding", ("indices", "table"), _embedding, _embedding_ref, doc="out[t] = table[indices[t]]",
   vjp=_embedding_vjp, kernel=_embedding_kernel, flops=lambda ins, out, a: 0,
   index_bounds=lambda ins, a: {0: ins[1].shape[0]})


def _scatter_add(ts, a):
    idx, src = ts
    need(idx.dtype is DType.U32 and idx.rank == 1, f"indices must be u32 1-D, got {idx}")
    need(src.dtype is DType.F32 and src.rank == 2 and src.shape[0] == idx.shape[0],
         f"src must be f32 [{idx.shape[0]}, H], got {src}")
    need(a["vocab_size"] >= 1, f"vocab_size must be >= 1, got {a['vocab_size']}")
    return TensorType((a["vocab_size"], src.shape[1]))


def _scatter_add_ref(xs, a):
    idx, src = xs
    bad = idx >= a["vocab_size"]
    if bad.any():
        raise InputError(f"ScatterAdd: index {int(idx[bad][0])} out of range for {a['vocab_size']} rows")
    out = np.zeros((a["vocab_size"], src.shape[1]))
    np.add.at(out, idx.astype(np.int64), src)
    return out


def _scatter_add_kernel(node, ins, target) -> Kernel:
    t, h = ins[1].shape
    n = node.type.num_elements
    return Kernel("scatter_add", "scatter_add.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("h", "u32", h), ("t", "u32", t)))


op("ScatterAdd", ("indices", "src"), _scatter_add, _scatter_add_ref, attrs=(Attr("vocab_size", "int"),), vjp=NO_GRAD,
   kernel=_scatter_add_kernel, flops=lambda ins, out, a: ins[1].num_elements,
   index_bounds=lambda ins, a: {0: a["vocab_size"]},
   doc="out[v] = sum over t with indices[t] = v of src[t]; inputs [indices u32 [T], src [T,H]] -> "
       "[vocab_size, H]: the Embedding table gradient (seed: ScatterAdd)")


# --- RoPE ------------------------------------------------------------------------------------

#: RoPE frequency scalings (the ``scaling`` attribute of the RoPE ops), with their parameters:
#: Hugging Face ``modeling_rope_utils`` rope types ``linear`` and ``llama3``.
ROPE_SCALINGS = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}

#: The ``scaling`` attribute every RoPE-family op takes: None, or (kind, *parameters).
SCALING = Attr("scaling", "json", None, "None or (kind, *parameters), kind in ROPE_SCALINGS")
ROPE_ATTRS = (Attr("theta", "float"), Attr("head_dim", "int"), Attr("pos_offset", "int", 0),
              Attr("pairing", "str", "half"), Attr("batch", "int", 1), SCALING)
ROPE_ATTR_NAMES = tuple(a.name for a in ROPE_ATTRS)


def check_rope_scaling(scaling) -> None:
    """ShapeError unless ``scaling`` is None or a valid (kind, *parameters)."""
    if scaling is None:
        return
    need(isinstance(scaling, tuple) and len(scaling) > 0 and scaling[0] in ROPE_SCALINGS,
         f"scaling must be None or a tuple (kind, *parameters) with kind in {sorted(ROPE_SCALINGS)}, got {scaling!r}")
    names = ROPE_SCALINGS[scaling[0]]
    need(len(scaling) == 1 + len(names) and all(isinstance(v, int | float) and v > 0 for v in scaling[1:]),
         f"scaling {scaling[0]!r} takes {len(names)} positive numbers ({', '.join(names)}), got {scaling[1:]!r}")
    if scaling[0] == "llama3":
        need(scaling[3] > scaling[2], f"llama3 scaling needs high_freq_factor > low_freq_factor, got {scaling!r}")


def rope_inv_freq(theta: float, head_dim: int, scaling: tuple | None = None) -> np.ndarray:
    """RoPE's frequencies, float64 [head_dim/2]: theta^(-2j/head_dim) (Su et al. 2021, eq. 15),
    rescaled by ``scaling`` as Hugging Face ``transformers.modeling_rope_utils`` does.

    ``None``: unscaled. ``("linear", factor)``: every frequency divided by factor
    (``_compute_linear_scaling_rope_parameters``, position interpolation). ``("llama3", factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings)``
    (``_compute_llama3_parameters``, Llama 3.1): with wavelength 2 pi / f and L the original
    context, f is kept where the wavelength is below L / high_freq_factor, divided by factor
    above L / low_freq_factor, and in between interpolated as (1 - s) f / factor + s f with
    s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
    """
    freqs = theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    if scaling is None:
        return freqs
    kind, factor, *rest = scaling
    if kind == "linear":
        return freqs / factor
    low, high, context = rest
    wavelen = 2 * math.pi / freqs
    smooth = (context / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * freqs / factor + smooth * freqs
    return np.where(wavelen < context / high, freqs, np.where(wavelen > context / low, freqs / factor, interpolated))


def rope_rule(ts, a):
    """Shape rule of RoPE on x [rows, heads * head_dim] with ``batch`` sequences stacked by rows."""
    x = ts[0]
    hd = a["head_dim"]
    need_f32(x, "input")
    need(x.rank == 2, f"input must be 2-D, got {x}")
    need(hd > 0 and hd % 2 == 0, f"head_dim must be even and > 0, got {hd}")
    need(x.shape[1] % hd == 0, f"width {x.shape[1]} is not a multiple of head_dim {hd}")
    need(a["pairing"] in ("half", "adjacent"), f"pairing must be half or adjacent, got {a['pairing']!r}")
    batch = a.get("batch", 1)
    need(batch >= 1 and x.shape[0] % batch == 0, f"{x.shape[0]} rows do not split into batch={batch} sequences")
    check_rope_scaling(a.get("scaling"))
    return x


def rope_pairs(head_dim: int, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices (first, second) of the rotated pairs inside one head.

    ``half``: (j, j + head_dim/2), the GPT-NeoX / Hugging Face layout. ``adjacent``:
    (2j, 2j+1), the original RoFormer layout that llama.cpp's permuted Q/K weights use.
    Pair j rotates by angle pos * inv_freq[j] (:func:`rope_inv_freq`).
    """
    j = np.arange(head_dim // 2)
    if pairing == "half":
        return j, j + head_dim // 2
    return 2 * j, 2 * j + 1


def _rotate(x, a, sign: float):
    hd, theta = a["head_dim"], a["theta"]
    seq = x.shape[0] // a.get("batch", 1)
    pos = (np.arange(x.shape[0]) % seq + a.get("pos_offset", 0))[:, None].astype(np.float64)
    first, second = rope_pairs(hd, a["pairing"])
    ang = pos * rope_inv_freq(theta, hd, a.get("scaling"))[None, :]
    cos, sin = np.cos(ang), sign * np.sin(ang)
    out = x.copy()
    for h in range(x.shape[1] // hd):
        i0, i1 = h * hd + first, h * hd + second
        p, q = x[:, i0], x[:, i1]
        out[:, i0] = p * cos - q * sin
        out[:, i1] = p * sin + q * cos
    return out


def rope_ref(xs, a):
    """RoPE of xs[0]: row r at position pos_offset + r mod (rows / batch)."""
    return _rotate(xs[0], a, 1.0)


def inv_freq(attrs: dict, slots: int) -> list[float]:
    """The RoPE frequencies of a node's attributes (:func:`rope_inv_freq`: theta, head_dim,
    scaling), computed in float64, padded to ``slots`` floats for a uniform."""
    freqs = [float(f) for f in rope_inv_freq(attrs["theta"], attrs["head_dim"], attrs.get("scaling"))]
    return freqs + [0.0] * (slots - len(freqs))


def rope_params(node, shape: tuple[int, int], batch: int, pos_offset: float, sign: float = 1.0, *,
                x_stride: int | None = None, x_start: int = 0) -> tuple[tuple, int]:
    """The uniform fields of rope_rotate.wgsl for rotating ``shape`` [rows, width] of ``batch``
    sequences (the frequencies multiplied by ``sign``), and the number of pairs to rotate.
    ``x_stride``/``x_start``: where the rows of the input lie (elements; default ``width`` and
    0, an input of that shape; a wider packed input's column window otherwise).

    Raises LoweringError for a head_dim above MAX_ROPE_HEAD_DIM.
    """
    rows, width = shape
    a = node.attrs
    hd = a["head_dim"]
    if hd > MAX_ROPE_HEAD_DIM:
        raise LoweringError(f"{node.op} (node {node.id}, {node.type}): head_dim {hd} is above the kernel's "
                            f"maximum of {MAX_ROPE_HEAD_DIM}")
    n = rows * width // 2
    freqs = [sign * f for f in inv_freq(a, MAX_ROPE_HEAD_DIM // 2)]
    return (("inv_freq", f"array<vec4<f32>, {MAX_ROPE_HEAD_DIM // 8}>", freqs), ("n", "u32", n),
            ("half_width", "u32", width // 2), ("half_hd", "u32", hd // 2), ("seq", "u32", rows // batch),
            ("pos_offset", "f32", pos_offset), ("adjacent", "u32", int(a["pairing"] == "adjacent")),
            ("x_stride", "u32", width if x_stride is None else x_stride), ("x_start", "u32", x_start)), n


def _rope_kernel(node, ins, target) -> Kernel:
    # RoPEGrad rotates every pair by the opposite angle, R(pos)^T = R(-pos): the same kernel
    # with the frequencies negated.
    sign = -1.0 if node.op == "RoPEGrad" else 1.0
    params, n = rope_params(node, node.type.shape, node.attrs["batch"], float(node.attrs["pos_offset"]), sign)
    return Kernel("rope", "rope.wgsl", elementwise_groups(n), params=params,
                  bindings=(Buffer("x"), Buffer("out", write=True)))  # RoPEGrad's dy is read as x


def _rope_vjp(b, node, dy, want):
    return [b.emit("RoPEGrad", (dy,), **{k: node.attrs[k] for k in ROPE_ATTR_NAMES})]


op("RoPE", ("x",), rope_rule, rope_ref, attrs=ROPE_ATTRS, vjp=_rope_vjp, kernel=_rope_kernel,
   flops=lambda ins, out, a: 3 * out.num_elements,
   doc="rotary position embedding (Su et al. 2021); row r has position pos_offset + r mod (rows / batch); "
       "frequencies as transformer.rope_inv_freq (scaling: None, linear or llama3, as transformers)")
op("RoPEGrad", ("dy",), rope_rule, lambda xs, a: _rotate(xs[0], a, -1.0), attrs=ROPE_ATTRS, vjp=NO_GRAD,
   kernel=_rope_kernel, flops=lambda ins, out, a: 3 * out.num_elements,
   doc="dx = R(pos)^T dy: each pair rotated by -angle, the inverse of RoPE with the same attributes (the "
       "rotation is orthogonal); inputs [dy] (seed: RoPEGrad)")


# --- RotaryEmbedding (ONNX) -------------------------------------------------------------------


def _rotary_dims(ts, a) -> tuple[int, int, int, int, int]:
    """(batch, heads, seq, head size, rotated size) of RotaryEmbedding's x; ShapeError otherwise."""
    x, cos, sin = ts[:3]
    need_f32(x, "x")
    need(x.rank in (3, 4), f"x must be 4-D [B, H, S, D] or 3-D [B, S, H*D], got {x}")
    if x.rank == 4:
        b, nh, s, hd = x.shape
    else:
        nh = a["num_heads"]
        need(nh >= 1 and x.shape[2] % nh == 0, f"x {x} is 3-D: num_heads must be >= 1 and divide {x.shape[2]}, "
             f"got {nh}")
        b, s, hd = x.shape[0], x.shape[1], x.shape[2] // nh
    rot = a["rotary_embedding_dim"] or hd
    need(rot % 2 == 0 and 2 <= rot <= hd, f"rotary_embedding_dim {rot} must be even and in [2, {hd}]")
    for t, what in ((cos, "cos_cache"), (sin, "sin_cache")):
        need_f32(t, what)
        if len(ts) == 4:
            need(t.rank == 2 and t.shape[1] == rot // 2, f"{what} must be [positions, {rot // 2}], got {t}")
        else:
            need(t.rank == 3 and t.shape[0] in (1, b) and t.shape[1:] == (s, rot // 2),
                 f"{what} must be [{b}, {s}, {rot // 2}] without position_ids, got {t}")
    need(cos.shape == sin.shape, f"cos_cache {cos} and sin_cache {sin} differ")
    if len(ts) == 4:
        ids = ts[3]
        need(ids.dtype is DType.I32 and ids.rank == 2 and ids.shape[0] in (1, b) and ids.shape[1] == s,
             f"position_ids must be i32 [{b}, {s}], got {ids}")
    return b, nh, s, hd, rot


def rotary_embedding_ref(xs, a):
    """ONNX RotaryEmbedding (https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html, the
    spec's numpy algorithm), float64; position ids outside the cache are an InputError."""
    x, cos, sin = xs[:3]
    b, nh, s, hd, rot = _rotary_dims([TensorType(t.shape, DType.I32 if i == 3 else DType.F32)
                                      for i, t in enumerate(xs)], a)
    xb = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(b, s, nh, hd)  # [B, S, H, D]
    if len(xs) == 4:
        ids = np.broadcast_to(xs[3], (b, s))
        if ids.min() < 0 or ids.max() >= cos.shape[0]:
            raise InputError(f"RotaryEmbedding: position ids {int(ids.min())}..{int(ids.max())} are outside the "
                             f"{cos.shape[0]} rows of the cos / sin caches")
        cos, sin = cos[ids], sin[ids]
    cos = np.broadcast_to(cos, (b, s, rot // 2))[:, :, None, :]
    sin = np.broadcast_to(sin, (b, s, rot // 2))[:, :, None, :]
    rotated = xb[..., :rot]
    if a["interleaved"]:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:
        x1, x2 = rotated[..., :rot // 2], rotated[..., rot // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = xb.copy()
    if a["interleaved"]:
        out[..., 0:rot:2], out[..., 1:rot:2] = real, imag
    else:
        out[..., :rot // 2], out[..., rot // 2:rot] = real, imag
    return out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)


def _rotary_kernel(node, ins, target) -> Kernel:
    b, nh, s, hd, rot = _rotary_dims(ins, node.attrs)
    n = node.type.num_elements
    if len(ins) == 4:
        position = "u32(clamp(position_ids[b * p.ids_b + s], 0, i32(p.cache_rows) - 1))"
        ids_b = 0 if ins[3].shape[0] == 1 else s
        cache_b = 0
    else:
        position = "b * p.cache_b + s"
        ids_b, cache_b = 0, 0 if ins[1].shape[0] == 1 else s
    return Kernel("rotary_embedding", "rotary_embedding.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("hd", "u32", hd), ("rot", "u32", rot), ("seq", "u32", s),
                          ("nh", "u32", nh), ("bhsd", "u32", int(ins[0].rank == 4)),
                          ("interleaved", "u32", int(node.attrs["interleaved"])), ("ids_b", "u32", ids_b),
                          ("cache_b", "u32", cache_b), ("cache_rows", "u32", ins[1].shape[0])),
                  slots={"POSITION": position})


op("RotaryEmbedding", ("x", "cos_cache", "sin_cache", "position_ids?"),
   lambda ts, a: (_rotary_dims(ts, a), ts[0])[1], rotary_embedding_ref,
   attrs=(Attr("interleaved", "bool", False), Attr("rotary_embedding_dim", "int", 0), Attr("num_heads", "int", 0)),
   vjp=no_grad("an inference op of the ONNX import (training graphs use RoPE)"), kernel=_rotary_kernel,
   flops=lambda ins, out, a: 3 * out.num_elements,
   index_bounds=lambda ins, a: {3: ins[1].shape[0]} if len(ins) == 4 else {},
   doc="ONNX RotaryEmbedding (Su et al. 2021, with cos / sin caches; "
       "https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html): x [B, H, S, D] or [B, S, H*D] (num_heads), "
       "the first rotary_embedding_dim (0: all) elements of each head rotated in pairs (i, i + rot/2), or (2i, 2i+1) "
       "when interleaved; caches [positions, rot/2] read at position_ids [B, S], or [B, S, rot/2] without them")
