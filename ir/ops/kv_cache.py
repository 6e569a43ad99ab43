"""KV-cache ops for autoregressive decoding: RoPE at a run-time position, an in-place cache
write, attention of new query rows over the cache, and the fused forms with RoPE inside.

A cache is a state tensor (``Graph.state``) [max_seq, kv_width] whose row j holds the key
(or value) of position j. Every op here takes the position of its first new row as an
input ``pos`` u32[1], so one compiled plan serves every decoding step (meganeura 0.2.0
``graph.rs``: ``rope_dynamic_offset``, ``CacheWrite``, ``CachedAttention``, generalised
from one new row to n). Inference only: these ops have no gradient rules
(:func:`~..spec.no_grad`), and ``autodiff.grad`` says so when a gradient would flow through one.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..errors import InputError
from ..kernel import Buffer, Include, Kernel, elementwise_groups
from ..spec import OPS, Attr, example, need, need_f32, no_grad, op, rules
from ..types import DType, TensorType
from .attention import (
    ATTENTION_WG,
    attention_io,
    attention_reference,
    check_head_dim,
    check_heads,
    projection_slices,
    rope_uniform_fields,
    store_accessor,
)
from .transformer import SCALING, rope_params, rope_ref, rope_rule

FAMILY = "kv_cache"

INFERENCE = no_grad("it is an inference-only KV-cache op")

#: Invocations per workgroup of CachedAttention: keys scored at once by one (query row,
#: head); at least MAX_ATTENTION_HEAD_DIM / 4, the vec4 columns of the output row. On the
#: H200 (SmolLM2 decode, 9 workgroups per call) 256 took 14.3 us per call at 128 keys and
#: 26.5 us at 1000 against 18.4 and 42.3 us with 128 (subgroup reductions on).
CACHED_ATTENTION_WG = ATTENTION_WG


def _position(t: TensorType, what: str) -> None:
    need(t.dtype is DType.U32 and t.shape == (1,), f"{what} must be u32[1], got {t}")


def _rows_fit(op_name: str, pos: np.ndarray, rows: int, cache_rows: int) -> int:
    """The first new row's position, after checking that ``rows`` rows from it fit the cache."""
    p = int(pos[0])
    if p + rows > cache_rows:
        raise InputError(f"{op_name}: rows {p}..{p + rows - 1} do not fit a cache of {cache_rows} rows (max_seq)")
    return p


_ROPE_DYNAMIC_ATTRS = (Attr("theta", "float"), Attr("head_dim", "int"), Attr("pairing", "str", "half"), SCALING)

#: Where an op's new rows (CacheWrite, CacheWriteRoPE) or query rows (CachedAttention,
#: CachedAttentionRoPE) lie in its input: -1 (the default) for an input of exactly their width,
#: else the first column of their window in a wider, packed input (the decode step's Q/K/V
#: projections computed as one matmul, each reader taking its columns: the rules below).
COL_START = Attr("col_start", "int", -1, doc="-1: the input has the op's width; else the first column of the "
                 "op's rows in a wider input")


def _window(t: TensorType, width: int, start: int, what: str) -> TensorType:
    """The [rows, width] window of ``t`` from column ``start`` (``start`` -1: ``t`` itself, which
    must then be [rows, width]); raises ShapeError (through ``need``) naming ``what`` when it is
    not 2-D or the window does not fit."""
    if start < 0:
        need(start == -1 and t.rank == 2 and t.shape[1] == width, f"{what} must be [rows, {width}], got {t}")
        return t
    need(t.rank == 2 and start + width <= t.shape[1],
         f"{what} must be 2-D with columns {start}..{start + width - 1}, got {t}")
    return TensorType((t.shape[0], width), t.dtype)


def _columns(x: np.ndarray, width: int, start: int) -> np.ndarray:
    """The reference's view of the rows an op reads (see :data:`COL_START`)."""
    return x if start < 0 else x[:, start:start + width]


# --- RoPEDynamic: RoPE whose position offset is an input --------------------------------------


def _rope_dynamic(ts, a):
    x, offset = ts
    _position(offset, "offset")
    return rope_rule([x], {**a, "batch": 1})


def _rope_dynamic_ref(xs, a):
    x, offset = xs
    return rope_ref([x], {**a, "batch": 1, "pos_offset": int(offset[0])})


def _rope_dynamic_kernel(node, ins, target) -> Kernel:
    params, n = rope_params(node, node.type.shape, batch=1, pos_offset=0.0)
    return Kernel("rope_dynamic", "rope_dynamic.wgsl", elementwise_groups(n), params=params,
                  bindings=(Buffer("x"), Buffer("offset", "u32"), Buffer("out", write=True)))


op("RoPEDynamic", ("x", "offset"), _rope_dynamic, _rope_dynamic_ref, attrs=_ROPE_DYNAMIC_ATTRS, vjp=INFERENCE,
   kernel=_rope_dynamic_kernel, flops=lambda ins, out, a: 3 * out.num_elements,
   doc="RoPE (Su et al. 2021) of x [rows, heads*head_dim] where row r has position offset[0] + r; inputs "
       "[x, offset u32[1]] (seed: rope_dynamic_offset). Pairing as RoPE's (transformer.rope_pairs)")


# --- CacheWrite: new rows into a cache, in place ---------------------------------------------


def _cache_write(ts, a):
    cache, new, pos = ts
    need_f32(cache, "cache")
    need_f32(new, "new rows")
    need(cache.rank == 2, f"cache must be 2-D [max_seq, W], got {cache}")
    new = _window(new, cache.shape[1], a.get("col_start", -1),
                  "new rows (of the cache's width: cache [max_seq, W] and new rows [n, W] the same width)")
    need(new.shape[0] <= cache.shape[0], f"{new.shape[0]} new rows do not fit a cache of {cache.shape[0]} rows")
    _position(pos, "pos")
    return cache


def _cache_write_ref(xs, a):
    cache, new, pos = xs
    new = _columns(new, cache.shape[1], a.get("col_start", -1))
    p = _rows_fit("CacheWrite", pos, new.shape[0], cache.shape[0])
    out = cache.copy()
    out[p:p + new.shape[0]] = new
    return out


def _cache_write_kernel(node, ins, target) -> Kernel:
    rows, width = ins[0].shape
    n = ins[1].shape[0] * width
    return Kernel("cache_write", "cache_write.wgsl", elementwise_groups(n),
                  params=(("n", "u32", n), ("width", "u32", width), ("rows", "u32", rows),
                          ("in_stride", "u32", ins[1].shape[1]), ("col_start", "u32", max(node.attrs["col_start"], 0))),
                  bindings=(Buffer("new_rows"), Buffer("pos", "u32"), Buffer("cache", write=True)))


op("CacheWrite", ("cache", "new_rows", "pos"), _cache_write, _cache_write_ref, attrs=(COL_START,), writes=0,
   vjp=INFERENCE, kernel=_cache_write_kernel, flops=lambda ins, out, a: 0,
   doc="cache[pos + r] <- new[r] for r < n, in place; inputs [cache [max_seq, W] (a state tensor), new [n, W] "
       "(or columns col_start.. of a wider input where col_start >= 0), pos u32[1]]; the value is the whole "
       "updated cache. Raises InputError (reference) when pos + n > max_seq; the kernel then writes only the rows "
       "that fit (seed: CacheWrite)")


# --- CachedAttention: causal GQA attention of new rows over the cache --------------------------

_CACHED_ATTRS = (Attr("num_heads", "int"), Attr("num_kv_heads", "int"), Attr("head_dim", "int"), COL_START)


def _cached_attention(ts, a):
    q, k, v, pos = ts
    q = _window(q, a["num_heads"] * a["head_dim"], a.get("col_start", -1), "q")
    check_heads(q, k, v, a)
    need(k.shape == v.shape, f"k_cache {k} and v_cache {v} must have the same shape")
    need(q.shape[0] <= k.shape[0], f"{q.shape[0]} query rows do not fit a cache of {k.shape[0]} rows")
    _position(pos, "pos")
    return q


def _cached_attention_ref(xs, a):
    # Row i of q sits at position pos + i and sees cache rows 0..pos+i: exactly row pos + i of
    # causal attention over the first pos + n cache rows, whatever the other query rows hold.
    q, k, v, pos = xs
    q = _columns(q, a["num_heads"] * a["head_dim"], a.get("col_start", -1))
    n = q.shape[0]
    p = _rows_fit("CachedAttention", pos, n, k.shape[0])
    q_full = np.zeros((p + n, q.shape[1]))
    q_full[p:] = q
    out = attention_reference(q_full, k[:p + n], v[:p + n], {**a, "batch": 1}, causal=True)
    return out[p:]


#: attention_cached.wgsl's NEW_KEY hooks for the ops whose keys are all in the cache.
_NO_NEW_KEY = """// every key is in the cache: the hooks do nothing
fn stage_new(li: u32, kv_col: u32) {}
fn rotate_new(li: u32) {}
fn new_score() -> f32 { return 0.0; }
fn new_value(k0: u32, col: u32, key_end: u32) -> vec4<f32> { return vec4<f32>(); }
fn write_new(li: u32, h: u32, kv_col: u32, key_end: u32) {}"""


def _cached_attention_kernel(node, ins, target) -> Kernel | list[Kernel]:
    # One sequence of n query rows; query row qi (position pos + qi) reads keys 0..pos+qi,
    # never past the cache's last row (arrayLength(k_cache) / kv_stride rows).
    # CachedAttentionRoPE rotates each query row in workgroup memory as it is loaded;
    # CachedAttentionRoPEAppend of one new row (q, k and v of one row each) reads that row from
    # its inputs k and v and writes it into the caches (attention_cached_append.wgsl), of
    # several it is the three dispatches it replaces (_append_rows).
    a = node.attrs
    append = node.op == "CachedAttentionRoPEAppend"
    if append and any(t.shape[0] > 1 for t in ins[:3]):
        return _append_rows(node, ins, target)
    rope = append or node.op == "CachedAttentionRoPE"
    nh, nkv, hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    check_head_dim(node, ins[0])
    # where each role's rows lie: (node input, row stride, first column); q, k and v may be windows of one
    # wider input (the packed projection), bound once
    roles = {"q": (0, ins[0].shape[1], max(a["q_start" if append else "col_start"], 0))}
    if append:
        roles |= {"k": (1, ins[1].shape[1], max(a["k_start"], 0)), "v": (2, ins[2].shape[1], max(a["v_start"], 0))}
    bound: dict[int, str] = {}  # node input -> its binding's name
    for role, (slot, _, _) in roles.items():
        bound.setdefault(node.inputs[slot], role)
    vec = hd % 4 == 0 and all(stride % 4 == 0 and start % 4 == 0 for _, stride, start in roles.values())
    caches = ("k_cache", "v_cache")
    io, out, accessors = attention_io((*bound.values(), *caches), hd, vec=vec)
    if append:  # the caches are written too; a role sharing another's input reads through that one's accessor
        io = tuple(replace(b, write=True) if b.name in caches else b for b in io)
        accessors += "".join(
            f"\nfn {role}4(base: u32, c: u32) -> vec4<f32> {{ return {bound[node.inputs[slot]]}4(base, c); }}"
            for role, (slot, _, _) in roles.items() if bound[node.inputs[slot]] != role)
        accessors += "\n" + "\n".join(store_accessor(name, vec) for name in caches)
    total = ins[0].shape[0] * nh
    (_, q_stride, q_start) = roles["q"]
    params = (*(rope_uniform_fields(node) if rope else ()), ("nh", "u32", nh), ("group", "u32", nh // nkv),
              ("total", "u32", total), ("scale", "f32", 1.0 / math.sqrt(hd)), ("q_stride", "u32", q_stride),
              ("q_start", "u32", q_start), ("o_stride", "u32", nh * hd),
              ("kv_stride", "u32", nkv * hd))
    if append:
        params += (("k_start", "u32", roles["k"][2]), ("v_start", "u32", roles["v"][2]))
    rotate = Include("attention_cached_rope.wgsl") if rope else \
        "fn rotate_q(li: u32, position: u32) {}  // CachedAttention: q is used as it is"
    inputs = (*sorted(node.inputs.index(i) for i in bound), *((3, 4, 5) if append else (1, 2, 3)))  # caches, pos
    name = f"cached_attention_hd{hd}" + ("_rope" if rope else "") + ("_append" if append else "")
    return Kernel(name, "attention_cached.wgsl", total, params=params, inputs=inputs,
                  bindings=(*io, Buffer("cache_pos", "u32"), out),
                  slots=dict(HEAD_DIM=hd, WG=CACHED_ATTENTION_WG, IO=accessors, ROTATE_Q=rotate,
                             CACHED_END="min(cache_pos[0], key_end)" if append else "key_end",
                             NEW_KEY=Include("attention_cached_append.wgsl") if append else _NO_NEW_KEY))


def _append_rows(node, ins, target) -> list[Kernel]:
    # CachedAttentionRoPEAppend of several new rows: CacheWriteRoPE's and CacheWrite's kernels writing the
    # caches (bound read_write as the inputs they update; the node's output, last, is not touched), then
    # CachedAttentionRoPE's over the updated caches; _append_parts of the input slots says which
    (k_slots, k_attrs), (v_slots, v_attrs), attn = _append_parts(list(range(6)), node.attrs)
    writes = []
    for op_name, slots, attrs in (("CacheWriteRoPE", k_slots, k_attrs), ("CacheWrite", v_slots, v_attrs)):
        cache, new, pos = slots
        part = replace(node, op=op_name, inputs=tuple(node.inputs[i] for i in slots), attrs=attrs)
        k = OPS[op_name].kernel(part, [ins[i] for i in slots], target)
        *reads, written = k.bindings  # the kernel's written binding: the cache, here an input updated in place
        writes.append(replace(k, inputs=(new, pos, cache), bindings=(*reads, written, Buffer("attention", write=True))))
    slots = (0, 3, 4, 5)  # q, the caches, pos
    attend = replace(node, op="CachedAttentionRoPE", inputs=tuple(node.inputs[i] for i in slots), attrs=attn)
    return [*writes, replace(_cached_attention_kernel(attend, [ins[i] for i in slots], target), inputs=slots)]


def _cached_flops(ins, out, a):
    return 4 * ins[0].shape[0] * ins[1].shape[0] * a["num_heads"] * a["head_dim"]


op("CachedAttention", ("q", "k_cache", "v_cache", "pos"), _cached_attention, _cached_attention_ref,
   attrs=_CACHED_ATTRS, vjp=INFERENCE, kernel=_cached_attention_kernel, flops=_cached_flops,
   doc="causal GQA attention (Vaswani et al. 2017, eq. 1) of the n query rows q [n, H*D] at positions "
       "pos..pos+n-1 over cache rows 0..pos+i (row i); inputs [q, k_cache, v_cache [max_seq, KV*D], pos u32[1]] "
       "(q's columns col_start.. of a wider input where col_start >= 0); output [n, H*D] (seed: "
       "CachedAttention, generalised from n = 1)")


# --- fused forms the attention rules create: the rotation moved into its reader -----------------


def _cache_write_rope(ts, a):
    cache, new, pos = ts
    out = _cache_write(ts, a)
    _rope_dynamic([_window(new, cache.shape[1], a.get("col_start", -1), "new rows"), pos], a)
    return out


def _cache_write_rope_ref(xs, a):
    cache, new, pos = xs
    rotated = _rope_dynamic_ref([_columns(new, cache.shape[1], a.get("col_start", -1)), pos], a)
    return _cache_write_ref([cache, rotated, pos], {**a, "col_start": -1})


def _cache_write_rope_kernel(node, ins, target) -> Kernel:
    rows, width = ins[1].shape[0], ins[0].shape[1]
    params, n = rope_params(node, (rows, width), batch=1, pos_offset=0.0, x_stride=ins[1].shape[1],
                            x_start=max(node.attrs["col_start"], 0))
    return Kernel("cache_write_rope", "cache_write_rope.wgsl", elementwise_groups(n), params=params,
                  bindings=(Buffer("x"), Buffer("pos", "u32"), Buffer("out", write=True)))


op("CacheWriteRoPE", ("cache", "new_rows", "pos"), _cache_write_rope, _cache_write_rope_ref,
   attrs=(*_ROPE_DYNAMIC_ATTRS, COL_START), writes=0, vjp=INFERENCE, kernel=_cache_write_rope_kernel,
   flops=lambda ins, out, a: 3 * ins[1].shape[0] * ins[0].shape[1],
   doc="CacheWrite(cache, RoPEDynamic(new, pos), pos) in one kernel: cache[pos + r] <- new[r] rotated (Su et al. "
       "2021) at position pos + r, in place; inputs [cache [max_seq, W] (a state tensor), new [n, W] (columns "
       "col_start.. of a wider input where col_start >= 0), pos u32[1]]; the value is the whole updated cache. "
       "Raises InputError (reference) when pos + n > max_seq")


def _cached_attention_rope(ts, a):
    out = _cached_attention(ts, a)
    _rope_dynamic([out, ts[3]], a)
    return out


def _cached_attention_rope_ref(xs, a):
    q, k, v, pos = xs
    q = _columns(q, a["num_heads"] * a["head_dim"], a.get("col_start", -1))
    return _cached_attention_ref([_rope_dynamic_ref([q, pos], a), k, v, pos], {**a, "col_start": -1})


op("CachedAttentionRoPE", ("q", "k_cache", "v_cache", "pos"), _cached_attention_rope, _cached_attention_rope_ref,
   attrs=(*_CACHED_ATTRS, Attr("theta", "float"), Attr("pairing", "str", "half"), SCALING), vjp=INFERENCE,
   kernel=_cached_attention_kernel, flops=_cached_flops,
   doc="CachedAttention(RoPEDynamic(q, pos), k_cache, v_cache, pos) in one kernel: the query rows are rotated "
       "(Su et al. 2021) at positions pos..pos+n-1 as they are loaded; inputs [q [n, H*D], k_cache, v_cache "
       "[max_seq, KV*D], pos u32[1]]; output [n, H*D]")


# --- the decode step's cache writes moved into its attention -------------------------------------

_STARTS = tuple(Attr(f"{role}_start", "int", -1, doc=f"-1: {role} has the op's width; else the first column of "
                     f"its rows in a wider input") for role in ("q", "k", "v"))


def _append_parts(xs_or_ts, a):
    # the CacheWriteRoPE and the CacheWrite this op does, as (inputs, attrs) of each (inputs as given: values,
    # types or input slots), then the attributes of its CachedAttentionRoPE
    q, k, v, kc, vc, pos = xs_or_ts
    rope = {n: a[n] for n in ("theta", "head_dim", "pairing", "scaling")}
    return (([kc, k, pos], {**rope, "col_start": a["k_start"]}), ([vc, v, pos], {"col_start": a["v_start"]}),
            {**{n: a[n] for n in ("num_heads", "num_kv_heads", "head_dim", "theta", "pairing", "scaling")},
             "col_start": a["q_start"]})


def _cached_attention_append(ts, a):
    q, k, v, kc, vc, pos = ts
    (kw, ka), (vw, va), attn = _append_parts(ts, a)
    kc = _cache_write_rope(kw, ka)
    vc = _cache_write(vw, va)
    return _cached_attention_rope([q, kc, vc, pos], attn)


def _cached_attention_append_ref(xs, a):
    q, k, v, kc, vc, pos = xs
    (kw, ka), (vw, va), attn = _append_parts(xs, a)
    return _cached_attention_rope_ref([q, _cache_write_rope_ref(kw, ka), _cache_write_ref(vw, va), pos], attn)


op("CachedAttentionRoPEAppend", ("q", "k", "v", "k_cache", "v_cache", "pos"), _cached_attention_append,
   _cached_attention_append_ref, attrs=(*_CACHED_ATTRS[:3], Attr("theta", "float"), Attr("pairing", "str", "half"),
                                        SCALING, *_STARTS),
   updates=(3, 4), vjp=INFERENCE, kernel=_cached_attention_kernel,
   flops=lambda ins, out, a: _cached_flops([ins[0], ins[3]], out, a),
   doc="CachedAttentionRoPE(q, CacheWriteRoPE(k_cache, k, pos), CacheWrite(v_cache, v, pos), pos) in one kernel: "
       "the n new rows of k (rotated, Su et al. 2021, at positions pos..pos+n-1) and of v appended to the caches "
       "in place, and the attention of the query rows (rotated as they are loaded) over cache rows 0..pos+i, the "
       "new ones read from k and v; inputs [q [n, H*D], k [n, KV*D], v [n, KV*D] (each the columns "
       "q_start/k_start/v_start.. of a wider input where that is >= 0), k_cache, v_cache [max_seq, KV*D] (state "
       "tensors, updated), pos u32[1]]; output [n, H*D] (the value of the three ops it replaces). One kernel "
       "when q, k and v have one row each (a decode step), else the three ops' kernels (three dispatches). "
       "Raises ShapeError as those ops do, and InputError (reference) when pos + n > max_seq; the kernels then "
       "read and write only the rows that fit")


def _decode_step(g, dim, *, attention: bool) -> None:
    # One layer's cache update and attention as models/llama.build_llama_cache_graph builds them.
    hd = 2 * dim("half_head", 1, 3)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    n = dim("n", 1, 3)
    rows = n + dim("spare", 0, 3)
    pairing = ("half", "adjacent")[dim("adjacent", 0, 1)]
    pos = g.input("pos", [1], DType.U32)

    def rope(x):
        return g.add_node("RoPEDynamic", (x, pos), theta=100.0, head_dim=hd, pairing=pairing)

    k_cache = g.add_node("CacheWrite", (g.state("k_cache", [rows, nkv * hd]), rope(g.input("k", [n, nkv * hd])), pos))
    if not attention:
        g.set_outputs([k_cache])
        return
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), g.input("v", [n, nkv * hd]), pos))
    g.set_outputs([g.add_node("CachedAttention", (rope(g.input("q", [n, nh * hd])), k_cache, v_cache, pos),
                              num_heads=nh, num_kv_heads=nkv, head_dim=hd)])


@rules("attention")
def _rope_into_cache(e):
    c, k, q, kc, vc, p = e.vars("c k q kc vc p")
    (theta,) = e.vars("theta", e.f64)
    (hd,) = e.vars("hd", e.i64)
    pairing, scaling = e.vars("pairing scaling", e.String)
    rope = dict(theta=theta, head_dim=hd, pairing=pairing, scaling=scaling)
    # CacheWrite(c, RoPEDynamic(k, p), p) -> CacheWriteRoPE(c, k, p)
    whole = e.i64(-1)  # not a column window (COL_START)
    yield e.equal("CacheWrite(c, RoPEDynamic(k, p), p) -> CacheWriteRoPE(c, k, p)",
                  e.CacheWrite(c, e.RoPEDynamic(k, p, **rope), p, col_start=whole),
                  e.CacheWriteRoPE(c, k, p, **rope, col_start=whole),
                  example=example(lambda g, dim: _decode_step(g, dim, attention=False)))
    # CachedAttention(RoPEDynamic(q, p), kc, vc, p) -> CachedAttentionRoPE(q, kc, vc, p)   if the head sizes agree
    nh, nkv = e.vars("nh nkv", e.i64)
    yield e.equal("CachedAttention(RoPEDynamic(q, p), kc, vc, p) -> CachedAttentionRoPE(q, kc, vc, p)",
                  e.CachedAttention(e.RoPEDynamic(q, p, **rope), kc, vc, p, num_heads=nh, num_kv_heads=nkv,
                                    head_dim=hd, col_start=whole),
                  e.CachedAttentionRoPE(q, kc, vc, p, num_heads=nh, num_kv_heads=nkv, head_dim=hd, theta=theta,
                                        pairing=pairing, scaling=scaling, col_start=whole),
                  example=example(lambda g, dim: _decode_step(g, dim, attention=True)))


# --- the decode step's Q/K/V projections as one matmul ------------------------------------------


def _packed_step(g, dim, *, rope: bool) -> None:
    # q, k and v as column windows of one [n, H*D + 2*KV*D] tensor (a packed projection's output)
    hd = 4 * dim("quarter_head", 1, 2)  # a multiple of 4: the query window's vec4 loads
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    n = dim("n", 1, 3)
    rows = n + dim("spare", 0, 3)
    pos = g.input("pos", [1], DType.U32)
    packed = g.input("packed", [n, (nh + 2 * nkv) * hd])
    q, k, v = (g.add_node("SliceCols", (packed,), start=start, size=size)
               for start, size in ((0, nh * hd), (nh * hd, nkv * hd), ((nh + nkv) * hd, nkv * hd)))
    rope_attrs = dict(theta=100.0, head_dim=hd)
    write_k = ("CacheWriteRoPE", rope_attrs) if rope else ("CacheWrite", {})
    k_cache = g.add_node(write_k[0], (g.state("k_cache", [rows, nkv * hd]), k, pos), **write_k[1])
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), v, pos))
    attend = ("CachedAttentionRoPE", rope_attrs) if rope else ("CachedAttention", {"head_dim": hd})
    g.set_outputs([g.add_node(attend[0], (q, k_cache, v_cache, pos), num_heads=nh, num_kv_heads=nkv,
                              **({"head_dim": hd} | attend[1]))])


@rules("attention")
def _column_windows(e):
    c, x, kc, vc, p = e.vars("c x kc vc p")
    s, w = e.vars("s w", e.i64)
    whole = e.i64(-1)  # the op reads an input of its own width (COL_START)
    window = e.SliceCols(x, start=s, size=w)
    # CacheWrite(c, SliceCols(x, s, w), p) -> CacheWrite(c, x, p, col_start=s)   (and CacheWriteRoPE)
    yield e.equal("CacheWrite(c, SliceCols(x, s, w), p) -> CacheWrite(c, x, p, col_start=s)",
                  e.CacheWrite(c, window, p, col_start=whole), e.CacheWrite(c, x, p, col_start=s),
                  example=example(lambda g, dim: _packed_step(g, dim, rope=False)))
    rope = e.attrs_of("CacheWriteRoPE", col_start=whole)
    yield e.equal("CacheWriteRoPE(c, SliceCols(x, s, w), p) -> CacheWriteRoPE(c, x, p, col_start=s)",
                  e.CacheWriteRoPE(c, window, p, **rope), e.CacheWriteRoPE(c, x, p, **(rope | {"col_start": s})),
                  example=example(lambda g, dim: _packed_step(g, dim, rope=True)))
    # CachedAttention(SliceCols(x, s, w), kc, vc, p) -> CachedAttention(x, kc, vc, p, col_start=s)   (and the
    # RoPE form)
    for name, rope_form in (("CachedAttention", False), ("CachedAttentionRoPE", True)):
        attrs = e.attrs_of(name, col_start=whole)
        yield e.equal(f"{name}(SliceCols(x, s, w), kc, vc, p) -> {name}(x, kc, vc, p, col_start=s)",
                      getattr(e, name)(window, kc, vc, p, **attrs),
                      getattr(e, name)(x, kc, vc, p, **(attrs | {"col_start": s})),
                      example=example(lambda g, dim, r=rope_form: _packed_step(g, dim, rope=r)))


def packed_decode_rule(e, weights, packed_weight, *, name: str, example_fn):
    """The rule packing one decode step's Q, K and V projections ``h @ W^T`` into one matmul of
    the weights' row concatenation, anchored on the step's CachedAttentionRoPE (so it matches
    once per layer): each projection joins the SliceCols of the packed product, whose readers
    then take their columns (:func:`_column_windows`). ``weights``: the (pattern, rows) of Wq, Wk
    and Wv; ``packed_weight``: their concatenation along rows. Parameters here; ``quant.py``
    passes weights kept as blocks."""
    h, ck, cv, p = e.vars("h ck cv p")
    (wq, rows_q), (wk, rows_k), (wv, rows_v) = weights
    q, k, v = (e.MatMulBT(h, w) for w in (wq, wk, wv))
    whole = e.i64(-1)
    k_cache = e.CacheWriteRoPE(ck, k, p, **e.attrs_of("CacheWriteRoPE", col_start=whole))
    v_cache = e.CacheWrite(cv, v, p, col_start=whole)
    attn = e.CachedAttentionRoPE(q, k_cache, v_cache, p, **e.attrs_of("CachedAttentionRoPE", col_start=whole))
    packed = e.MatMulBT(h, packed_weight)
    return e.rule(attn, name=name, example=example(example_fn)).then(
        *projection_slices(e, packed, ((q, rows_q), (k, rows_k), (v, rows_v))))


def decode_step(g, dim, project) -> None:
    """One decode layer's attention as the rules above leave it (CacheWriteRoPE, CacheWrite,
    CachedAttentionRoPE) on projections ``project(g, h, name, rows, cols)`` of an input h."""
    hd = 4 * dim("quarter_head", 1, 2)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    n, width = dim("n", 1, 2), 32
    rows = n + dim("spare", 0, 3)
    pos = g.input("pos", [1], DType.U32)
    h = g.input("h", [n, width])
    q, k, v = (project(g, h, f"w{t}", heads * hd, width) for t, heads in (("q", nh), ("k", nkv), ("v", nkv)))
    rope = dict(theta=100.0, head_dim=hd)
    k_cache = g.add_node("CacheWriteRoPE", (g.state("k_cache", [rows, nkv * hd]), k, pos), **rope)
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), v, pos))
    g.set_outputs([g.add_node("CachedAttentionRoPE", (q, k_cache, v_cache, pos), num_heads=nh, num_kv_heads=nkv,
                              **rope)])


@rules("attention")
def _packed_qkv_decode(e):
    nq, nk, nv = e.vars("nq nk nv", e.String)
    sq, sk, sv = e.vars("sq sk sv", e.Vec[e.i64])  # one per weight, as attention.py's _packed_qkv says why
    wq, wk, wv = e.Parameter(nq, sq), e.Parameter(nk, sk), e.Parameter(nv, sv)
    # CachedAttentionRoPE(h@Wq^T, CacheWriteRoPE(h@Wk^T), CacheWrite(h@Wv^T)): h@Wq^T = SliceCols(P, 0, q),
    # h@Wk^T = SliceCols(P, q, k), h@Wv^T = SliceCols(P, q+k, v),  P = h@Concat(Wq,Wk,Wv)^T
    yield packed_decode_rule(e, ((wq, sq[0]), (wk, sk[0]), (wv, sv[0])), e.Concat(wq, wk, wv, axis=0),
                             name="decode: h@Wq^T, h@Wk^T, h@Wv^T -> SliceCols of h@Concat(Wq,Wk,Wv)^T",
                             example_fn=lambda g, dim: decode_step(g, dim, _projection))


def _projection(g, h, name: str, rows: int, cols: int) -> int:
    return g.matmul_bt(h, g.parameter(name, [rows, cols]))


def _append_step(g, dim) -> None:
    # the decode step's cache writes and attention as the rules above leave them: q, k and v as column
    # windows of one packed projection, or (packed 0) three inputs of their own
    hd = 2 * dim("half_head", 1, 3)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    n = 1  # one new row: the rule's guard
    rows = n + dim("spare", 0, 3)
    pairing = ("half", "adjacent")[dim("adjacent", 0, 1)]
    pos = g.input("pos", [1], DType.U32)
    widths = (nh * hd, nkv * hd, nkv * hd)
    if dim("packed", 0, 1):
        packed = g.input("packed", [n, sum(widths)])
        (q, k, v), starts = (packed,) * 3, (0, widths[0], widths[0] + widths[1])
    else:
        (q, k, v), starts = (g.input(t, [n, w]) for t, w in zip("qkv", widths, strict=True)), (-1, -1, -1)
    rope = dict(theta=100.0, head_dim=hd, pairing=pairing)
    k_cache = g.add_node("CacheWriteRoPE", (g.state("k_cache", [rows, nkv * hd]), k, pos), **rope,
                         col_start=starts[1])
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), v, pos), col_start=starts[2])
    g.set_outputs([g.add_node("CachedAttentionRoPE", (q, k_cache, v_cache, pos), num_heads=nh, num_kv_heads=nkv,
                              **rope, col_start=starts[0])])


@rules("attention")
def _append_into_attention(e):
    q, k, v, kc, vc, p = e.vars("q k v kc vc p")
    qs, ks, vs = e.vars("qs ks vs", e.i64)
    rope = e.attrs_of("CacheWriteRoPE", col_start=ks)
    heads = {n: rope[n] for n in ("theta", "head_dim", "pairing", "scaling")}
    nh, nkv = e.vars("nh nkv", e.i64)
    (sq,) = e.vars("sq", e.Vec[e.i64])
    # CachedAttentionRoPE(q, CacheWriteRoPE(kc, k, p), CacheWrite(vc, v, p), p) -> CachedAttentionRoPEAppend(q, k, v,
    # kc, vc, p)   (the rotation's attributes the same in the write and the attention; one new row, a decode
    # step: the kernel takes new keys one at a time, where the cache's keys go WG at a time)
    lhs = e.CachedAttentionRoPE(q, e.CacheWriteRoPE(kc, k, p, **rope), e.CacheWrite(vc, v, p, col_start=vs), p,
                                num_heads=nh, num_kv_heads=nkv, **heads, col_start=qs)
    yield e.equal("CachedAttentionRoPE(q, CacheWriteRoPE(kc, k, p), CacheWrite(vc, v, p), p) -> "
                  "CachedAttentionRoPEAppend(q, k, v, kc, vc, p)   (one new row)", lhs,
                  e.CachedAttentionRoPEAppend(q, k, v, kc, vc, p, num_heads=nh, num_kv_heads=nkv, **heads,
                                              q_start=qs, k_start=ks, v_start=vs),
                  e.eq(e.shape(lhs)).to(sq), e.eq(sq[0]).to(e.i64(1)),  # its output's rows: the new rows
                  example=example(_append_step))
