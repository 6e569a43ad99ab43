"""TokenPool: a sentence embedding from a sequence's token rows, in one dispatch.

sentence-transformers' ``Pooling`` (mean tokens, or any weighted sum of the tokens: CLS, last
token, weighted mean, mean / sqrt(len) as weights) followed by its ``Normalize`` (L2). The
hand-built BERT graph (``models/minilm.py``) builds the op itself; in an exported encoder the
recognition rules here find it in the exporters' Unsqueeze, Expand, Cast, Mul, ReduceSum, Clip
and Div of the mean, and the ReduceL2, Clip, Expand and Div of ``torch.nn.functional.normalize``:
six dispatches (four of them dependent) in one.
"""

from __future__ import annotations

import numpy as np

from ..kernel import COUNTERS, SCRATCH, Buffer, Kernel, atomic_quad_planes
from ..spec import Attr, example, need, op, rules
from ..types import DType, TensorType

FAMILY = "token_pool"

#: sentence-transformers' clamp of a mean's token count (``torch.clamp(sum_mask, min=1e-9)``).
MIN_COUNT = 1e-9
#: ``torch.nn.functional.normalize``'s default eps: a norm below it divides by it instead.
MIN_NORM = 1e-12
#: Rows a lane loads before it sums them (STEP of shaders/token_pool.wgsl and token_pool_chunks.wgsl): the loads
#: in flight of each lane of a workgroup.
TOKEN_POOL_STEP = 8
#: Whether a sentence's tokens are spread over several workgroups (:func:`token_pool_chunks`).
TOKEN_POOL_CHUNKS = True
#: Steps of TOKEN_POOL_STEP rows each group of a chunk's workgroup takes.
TOKEN_POOL_CHUNK_STEPS = 1
#: Most chunks of a sentence.
TOKEN_POOL_MAX_CHUNKS = 64


def _token_pool_infer(ts, a):
    x, w = ts
    need(x.dtype is DType.F32 and x.rank == 3, f"x must be f32 [B, S, H], got {x}")
    need(w.dtype in (DType.F32, DType.I32), f"weights must be f32 or i32, got {w}")
    need(w.shape == x.shape[:2], f"weights must be [B, S] = {list(x.shape[:2])} for x {x}, got {w}")
    return TensorType((x.shape[0], x.shape[2]), DType.F32)


def token_pool_ref(xs, a):
    """The float64 reference of TokenPool: ``xs`` = (x [B, S, H], w [B, S])."""
    x, w = xs[0].astype(np.float64), xs[1].astype(np.float64)
    pooled = np.einsum("bs,bsh->bh", w, x)  # 0 * inf is NaN here, as in the exporters' Mul
    if a["mean"]:
        pooled = pooled / np.maximum(w.sum(axis=1, keepdims=True), a["min_count"])
    if a["normalize"]:
        pooled = pooled / np.maximum(np.sqrt((pooled * pooled).sum(axis=1, keepdims=True)), a["min_norm"])
    return pooled


def token_pool_chunks(s: int, groups: int, device_barriers: bool = True) -> tuple[int, int]:
    """(chunks, rows) of TokenPool's kernel for sentences of ``s`` tokens whose workgroups hold ``groups`` row
    groups: each sentence's tokens cut into ``chunks`` workgroups of ``rows`` tokens
    (shaders/token_pool_chunks.wgsl, whose last workgroup of a sentence adds the chunks' sums), or (1, s), a
    workgroup a sentence (shaders/token_pool.wgsl). A chunk holds TOKEN_POOL_CHUNK_STEPS steps of
    TOKEN_POOL_STEP rows a group, so each lane's loads are in flight at once, or (a sentence is at most
    TOKEN_POOL_MAX_CHUNKS chunks, whose sums its last workgroup adds) the fewest multiple of those steps; one
    workgroup a sentence where TOKEN_POOL_CHUNKS is off, the sentence fits one chunk, or the device's
    ``storageBarrier`` does not order one workgroup's atomics before another's (``device_barriers``,
    ``Target.device_barriers``: Metal). The batch does not change the choice (only a batch of 8 was timed).

    On an H100 (``bench/plan_ab.py``, MiniLM's plan: 8 sentences of 128 tokens, rows of 96 quads, so 2 groups
    and 8 chunks of 16 rows, 64 workgroups against 8; five alternated rounds,
    bench/results/token_pool_chunks_h100/ab_token_pool.json) the plan took 1029.6-1034.8 us GPU per run against
    1036.2-1041.6 with a workgroup a sentence (wall 1061.2-1066.7 against 1067.7-1070.5); each dispatch in a
    pass of its own (profile_minilm.json), the kernel took 9.4 us against 13.7 in the previous profile
    (weights_kn_h100/profile_h100.json)."""
    step = groups * TOKEN_POOL_STEP * TOKEN_POOL_CHUNK_STEPS
    if not (TOKEN_POOL_CHUNKS and device_barriers) or s <= step:
        return 1, s
    rows = -(-s // TOKEN_POOL_MAX_CHUNKS // step) * step if s > step * TOKEN_POOL_MAX_CHUNKS else step
    return -(-s // rows), rows


def _token_pool_kernel(node, ins, target) -> Kernel:
    x, w = ins
    batch, s, h = x.shape
    quads = h % 4 == 0
    cols = h // 4 if quads else h
    unit_lanes = min(cols, 256)
    groups = 256 // unit_lanes
    vec = "vec4<f32>" if quads else "f32"
    a = node.attrs
    chunks, rows = token_pool_chunks(s, groups, target.device_barriers)
    params = (("batch", "u32", batch), ("s", "u32", s), ("cols", "u32", cols), ("unit_lanes", "u32", unit_lanes),
              ("groups", "u32", groups), ("min_count", "f32", a["min_count"]), ("min_norm", "f32", a["min_norm"]))
    slots = {"VEC": vec, "SQUARES": "dot(v, v)" if quads else "v * v", "STEP": TOKEN_POOL_STEP,
             "MEAN": "true" if a["mean"] else "false", "NORMALIZE": "true" if a["normalize"] else "false"}
    x_b, w_b, out = Buffer("x", vec), Buffer("w", w.dtype.wgsl), Buffer("out", vec, write=True)
    form = "vec4" if quads else "f32"
    if chunks == 1:
        return Kernel(f"token_pool_{form}", "token_pool.wgsl", batch, params=params, slots=slots,
                      bindings=(x_b, w_b, out))
    return Kernel(f"token_pool_{form}_chunks{chunks}", "token_pool_chunks.wgsl", batch * chunks,
                  params=(*params, ("chunk_rows", "u32", rows)),
                  slots={**slots, "CHUNKS": chunks, "SUMS": _SUMS_VEC4 if quads else _SUMS_F32},
                  bindings=(x_b, w_b, Buffer("sums", "atomic<u32>", write=True),
                            Buffer("count", "atomic<u32>", write=True), out),
                  inputs=(0, 1, SCRATCH, COUNTERS), scratch=batch * chunks * h, counters=batch)


#: token_pool_chunks.wgsl's SUMS for rows of quads: a quad's floats in four planes of [batch, CHUNKS, cols].
_SUMS_VEC4 = atomic_quad_planes("sums", "p.batch * CHUNKS * p.cols", "put_sum", "get_sum")

#: The same for rows of single columns.
_SUMS_F32 = """fn put_sum(at: u32, v: f32) {
    atomicStore(&sums[at], bitcast<u32>(v));
}

fn get_sum(at: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&sums[at]));
}"""


def _token_pool_vjp(b, node, dy, want):
    # p = sum_t w_t x_t / c (c = max(sum_t w_t, min_count) with mean, else 1); y = p / d, d = max(|p|, min_norm).
    # dp = (dy - [|p| > min_norm] y (y . dy)) / d; dx_t = w_t dp / c; dw_t = (x_t . dp - [mean, sum w > min_count]
    # p . dp) / c
    x, w = node.inputs
    a = node.attrs
    batch, s, h = b.type(x).shape
    dp = b.real(dy)
    if a["normalize"]:
        p = b.emit("TokenPool", (x, w), mean=a["mean"], min_count=a["min_count"])
        m = b.const(np.array(a["min_norm"]))
        norm = b.emit("ReduceL2", (p,), axes=(1,), keepdims=True)
        along = b.emit("ReduceSum", (b.emit("Mul", (node.id, dp)),), axes=(1,), keepdims=True)
        drop = b.emit("Mul", (b.emit("Mul", (node.id, along)), b.emit("Greater", (norm, m))))
        dp = b.emit("Div", (b.emit("Sub", (dp, drop)), b.emit("Max", (norm, m))))
    wf = w if b.type(w).dtype is DType.F32 else b.emit("Cast", (w,), to="f32")
    count = b.emit("ReduceSum", (wf,), axes=(1,), keepdims=True)  # [B, 1]
    c = b.emit("Max", (count, b.const(np.array(a["min_count"])))) if a["mean"] else None
    scale = b.emit("Div", (wf, c)) if c is not None else wf
    dx = b.emit("Mul", (b.reshape(scale, [batch, s, 1]), b.reshape(dp, [batch, 1, h]))) if want[0] else None
    dw = None
    if len(want) > 1 and want[1]:
        along_x = b.emit("ReduceSum", (b.emit("Mul", (x, b.reshape(dp, [batch, 1, h]))),), axes=(2,), keepdims=False)
        if c is not None:
            p = b.emit("TokenPool", (x, w), mean=True, min_count=a["min_count"])
            along_p = b.emit("ReduceSum", (b.emit("Mul", (p, dp)),), axes=(1,), keepdims=True)
            clamped = b.emit("Greater", (count, b.const(np.array(a["min_count"]))))
            along_x = b.emit("Div", (b.emit("Sub", (along_x, b.emit("Mul", (along_p, clamped)))), c))
        dw = along_x
    return [dx, dw]


op("TokenPool", ("x", "w"), _token_pool_infer, token_pool_ref,
   attrs=(Attr("mean", "bool", False, doc="divide by max(sum of the weights, min_count)"),
          Attr("min_count", "float", MIN_COUNT),
          Attr("normalize", "bool", False, doc="divide by max(L2 norm, min_norm)"),
          Attr("min_norm", "float", MIN_NORM)),
   vjp=_token_pool_vjp, kernel=_token_pool_kernel, flops=lambda ins, out, a: 2 * ins[0].num_elements,
   doc="x f32 [B, S, H], w f32 or i32 [B, S] -> f32 [B, H]: p_b = sum_t w[b, t] x[b, t] / c_b with c_b = "
       "max(sum_t w[b, t], min_count) when mean, else 1; then p_b / max(|p_b|_2, min_norm) when normalize. "
       "sentence-transformers' Pooling (mean: sum(x * mask, 1) / clamp(sum(mask, 1), min=1e-9), "
       "sentence_transformers/models/Pooling.py) and Normalize (torch.nn.functional.normalize(p=2, dim=1), "
       "eps 1e-12)")


# --- recognition ---------------------------------------------------------------------------------


def _masked(g, dim, mask: str):
    # x [B, S, H] and the [B, S, H] mask an exporter multiplies it by: Cast(Expand(Unsqueeze(m, -1)), f32) of an
    # i32 mask of zeros and ones ("i32"), or Expand(Unsqueeze(m, -1)) of an f32 one ("f32")
    b, s, h = dim("b", 1, 3), dim("s", 1, 6), dim("h", 1, 9)
    x = g.input("x", [b, s, h])
    ones = g.add_node("Greater", (g.input("m", [b, s]), g.constant(np.float32(0.0), shape=())))
    m = g.add_node("Cast", (ones,), to="i32") if mask == "i32" else ones
    full = g.add_node("Expand", (g.reshape(m, [b, s, 1]),), shape=[b, s, h])
    return x, g.add_node("Cast", (full,), to="f32") if mask == "i32" else full


def _clip_min(g, x, low: float):
    return g.add_node("Clip", (x, g.constant(np.float32(low), shape=()), g.constant(np.float32(np.inf), shape=())))


def _mean_example(mask: str, x_first: bool):
    def build(g, dim):
        x, m = _masked(g, dim, mask)
        total = g.add_node("ReduceSum", (g.add_node("Mul", (x, m) if x_first else (m, x)),), axes=[1], keepdims=False)
        count = g.add_node("ReduceSum", (m,), axes=[1], keepdims=False)
        g.set_outputs([g.add_node("Div", (total, _clip_min(g, count, 0.5)))])

    return example(build)


def _normalize_example(expand: bool):
    def build(g, dim):
        b, s, h = dim("b", 1, 3), dim("s", 1, 6), dim("h", 1, 9)
        p = g.add_node("TokenPool", (g.input("x", [b, s, h]), g.input("w", [b, s])))
        norm = _clip_min(g, g.add_node("ReduceL2", (p,), axes=[1], keepdims=True), 0.25)
        g.set_outputs([g.add_node("Div", (p, g.add_node("Expand", (norm,), shape=g.node(p).type.shape)
                                          if expand else norm))])

    return example(build)


@rules("recognition")
def _token_pool(e):
    x, m, lo, hi, n = e.vars("x m lo hi n")
    sx, s3, se = e.vars("sx s3 se", e.Vec[e.i64])
    v = e.var("v", e.f64)
    one, no = e.Vec(e.i64(1)), e.Bool(False)
    inf = e.value(hi, e.f64(np.inf))
    # Div(ReduceSum(x * M, [1]), Clip(ReduceSum(M, [1]), lo)) -> TokenPool(x, Reshape(m, [B, S]); mean, min_count lo)
    # for M = Cast(Expand(Reshape(m, [B, S, 1]), [B, S, H]), f32) of an i32 mask m (its cast left to the kernel's
    # read) or Expand(Reshape(m, [B, S, 1]), [B, S, H]) of an f32 one; x [B, S, H], either operand order
    for mask in ("i32", "f32"):
        full = e.Expand(e.Identity(m, shape=s3), shape=se)
        masked = e.Cast(full, to=e.String("f32")) if mask == "i32" else full
        for x_first in (True, False):
            total = e.ReduceSum(e.Mul(x, masked) if x_first else e.Mul(masked, x), axes=one, keepdims=no)
            lhs = e.Div(total, e.Clip(e.ReduceSum(masked, axes=one, keepdims=no), lo, hi))
            w = e.Identity(m, shape=e.Vec(sx[0], sx[1]))
            # (the Div's shape [B, H] too: a Clip bound of a higher rank, one element, would broadcast the result)
            guards = (e.eq(e.shape(x)).to(sx), e.eq(sx.length()).to(e.i64(3)), e.eq(se).to(sx),
                      e.eq(e.shape(lhs)).to(e.Vec(sx[0], sx[2])),
                      e.eq(s3).to(e.Vec(sx[0], sx[1], e.i64(1))), e.value(lo, v), inf,
                      *((e.is_i32(m),) if mask == "i32" else ()))
            pooled = "x * M" if x_first else "M * x"
            yield e.rule(lhs, *guards, name=f"Div(ReduceSum({pooled}, [1]), Clip(ReduceSum(M, [1]), lo)) -> "
                                            f"TokenPool(x, m; mean)   ({mask} mask m)",
                         example=_mean_example(mask, x_first)).then(
                e.union(lhs).with_(e.TokenPool(x, w, mean=e.Bool(True), min_count=v, normalize=no,
                                               min_norm=e.f64(MIN_NORM))),
                e.set_(e.shape(w)).to(e.Vec(sx[0], sx[1])))
    # Div(p, Expand(Clip(ReduceL2(p, [1], keepdims), lo), shape(p))) -> TokenPool(..; normalize, min_norm lo) for p a
    # TokenPool that does not normalise (torch.nn.functional.normalize(p, dim=1)); also without the Expand
    w, mc, mn = e.var("w"), e.var("mc", e.f64), e.var("mn", e.f64)
    mb = e.var("mb", e.Bool)
    p = e.TokenPool(x, w, mean=mb, min_count=mc, normalize=no, min_norm=mn)
    norm = e.Clip(e.ReduceL2(p, axes=one, keepdims=e.Bool(True)), lo, hi)
    for expand in (True, False):
        lhs = e.Div(p, e.Expand(norm, shape=se) if expand else norm)
        guards = (e.value(lo, v), inf, e.eq(e.shape(lhs)).to(e.shape(p)),
                  *((e.eq(se).to(e.shape(p)),) if expand else ()))
        yield e.equal(f"Div(p, {'Expand(' if expand else ''}Clip(ReduceL2(p, [1]), lo){')' if expand else ''}) -> "
                      "TokenPool(..; normalize, min_norm lo)", lhs,
                      e.TokenPool(x, w, mean=mb, min_count=mc, normalize=e.Bool(True), min_norm=v), *guards,
                      example=_normalize_example(expand))
