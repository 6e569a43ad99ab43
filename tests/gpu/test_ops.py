"""Every op with a kernel, on the GPU, against the numpy reference (ir.evaluate).

One row per (op, shapes): a builder adds the op to a graph whose leaves are random
(inputs and parameters alike), optionally with hand-made feeds for edge cases. A family may
keep its rows in a module of its own, ``tests/gpu/test_ops_<family>.py`` with a ``ROWS`` list
of :class:`op_table.Row` (tests/op_table.py holds the row type and the check).
"""

from __future__ import annotations

import numpy as np
import pytest
from op_table import Row, all_rows, check_row  # tests/op_table.py

from eggfuse.ir import OPS, DType, Graph, evaluate
from eggfuse.ir.ops.matmul_kernel import GEMV_LONG_K, GEMV_MAX_CHUNK, gemv_bt_lanes, gemv_tile
from eggfuse.lowering import lower
from eggfuse.runtime import Session
from eggfuse.runtime.device import subgroup_reductions_usable


def _unary(op: str, shape) -> Row:
    return Row(op, f"{op}{list(shape)}", lambda g: g.add_node(op, (g.input("x", shape),)), scale=3.0)


def _unary_precision(op: str) -> Row:
    # A dense sweep with a tight bound: catches approximation errors (erf, tanh) that the
    # random rows' tolerance would hide. The bound allows a few f32 ulps of the result.
    x = np.linspace(-10.0, 10.0, 4001)
    return Row(op, f"{op}-precision", lambda g: g.add_node(op, (g.input("x", [x.size]),)), {"x": x},
               rtol=3e-7, atol=1e-6)


def _matmul(op: str, m: int, k: int, n: int) -> Row:
    a_shape = [k, m] if op == "MatMulAT" else [m, k]
    b_shape = [n, k] if op == "MatMulBT" else [k, n]
    return Row(op, f"{op}[{m},{k},{n}]",
               lambda g: g.add_node(op, (g.input("a", a_shape), g.parameter("b", b_shape))))


def _fused(variant: str, m: int, k: int, n: int, epilogue: tuple[str, ...], bias_shape=None) -> Row:
    def build(g: Graph) -> int:
        a = g.input("a", [k, m] if variant == "AT" else [m, k])
        b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
        operands = []
        for i, step in enumerate(epilogue):
            if step == "bias":
                operands.append(g.parameter(f"bias{i}", bias_shape or [n]))
            elif step == "add":
                operands.append(g.input(f"res{i}", [m, n]))
        return g.add_node("FusedMatMul", (a, b, *operands), variant=variant, epilogue=epilogue)

    return Row("FusedMatMul", f"FusedMatMul{variant}[{m},{k},{n}]{'+'.join(epilogue)}", build)


def _binary(op: str, x_shape, y_shape) -> Row:
    return Row(op, f"{op}{list(x_shape)}{list(y_shape)}",
               lambda g: g.add_node(op, (g.input("x", x_shape), g.input("y", y_shape))))


def _softmax(shape, feeds=None, tag="") -> Row:
    return Row("Softmax", f"Softmax{list(shape)}{tag}", lambda g: g.softmax(g.input("x", shape)),
               feeds or {}, scale=5.0)


def _norm(op: str, rows: int, n: int, lead=(), inputs: int = 3) -> Row:
    # over x [*lead, rows, n]; ``inputs`` 1: no weight, 2: a weight (no bias), 3: all of the op's
    def build(g: Graph) -> int:
        params = [g.parameter("w", [n]), g.parameter("b", [n])][:inputs - 1]
        return g.add_node(op, [g.input("x", [*lead, rows, n]), *params[:1 if op == "RmsNorm" else 2]], eps=1e-5)

    tag = "" if inputs == 3 else {1: "-noweight", 2: "-nobias"}[inputs]
    return Row(op, f"{op}{[*lead, rows, n]}{tag}".replace(" ", ""), build, scale=3.0)


def _rope(pairing: str, batch: int, offset: int) -> Row:
    return Row("RoPE", f"RoPE-{pairing}-b{batch}-off{offset}", lambda g: g.rope(
        g.input("x", [10, 16]), 10000.0, head_dim=8, pos_offset=offset, pairing=pairing, batch=batch))


def _embedding(ids: list[int], vocab: int, width: int) -> Row:
    def build(g: Graph) -> int:
        return g.embedding(g.input("ids", [len(ids)], DType.U32), g.parameter("table", [vocab, width]))

    return Row("Embedding", f"Embedding[{len(ids)}]x[{vocab},{width}]", build, {"ids": np.array(ids)})


def _embedding_layer_norm(vocabs: tuple[int, ...], t: int, h: int, positions: int = 0, pair: bool = False) -> Row:
    # indices spread over every row of each table, repeats and the last row included; ``pair``: the op that stores
    # the rows' sum too ([2, T, H])
    ids = {f"i{k}": (np.arange(t) * (k + 3)) % v for k, v in enumerate(vocabs)}
    op = "EmbeddingSumLayerNormPair" if pair else "EmbeddingSumLayerNorm"

    def build(g: Graph) -> int:
        pairs = [x for k, v in enumerate(vocabs) for x in (g.input(f"i{k}", [t], DType.U32),
                                                            g.parameter(f"t{k}", [v, h]))]
        pos = [g.parameter("pos", [positions, h])] if positions else []
        return g.add_node(op, (g.parameter("w", [h]), g.parameter("b", [h]), *pairs, *pos), eps=1e-12,
                          positions=positions)

    return Row(op, f"{op}{list(vocabs)}x[{t},{h}]p{positions}", build, ids, scale=3.0)


def _attention(op: str, nh: int, nkv: int, hd: int, batch: int, seq: int, mask=None, masked_rows: str = "",
               packed: bool = False, mask_dtype: str = "f32") -> Row:
    # masked_rows: the attention's attribute, left at its default when empty; packed: CausalAttention of one input;
    # mask_dtype: the key mask's, f32 or i32 (an exported GPT-2's)
    dtype = DType.I32 if mask_dtype == "i32" else DType.F32

    def build(g: Graph) -> int:
        rows = batch * seq
        extra = {"masked_rows": masked_rows} if masked_rows else {}
        if op == "FullAttentionPacked" or packed:  # one [rows, (nh + 2 nkv) * hd] input: q, k, v side by side
            km = (g.input("key_mask", [batch, seq], dtype),) if mask is not None else ()
            return g.add_node(op, (g.input("qkv", [rows, (nh + 2 * nkv) * hd]), *km), num_heads=nh,
                              num_kv_heads=nkv, head_dim=hd, batch=batch, **extra)
        q = g.input("q", [rows, nh * hd])
        k, v = g.input("k", [rows, nkv * hd]), g.input("v", [rows, nkv * hd])
        km = g.input("key_mask", [batch, seq], dtype) if mask is not None else None
        if op == "CausalAttention":
            return g.causal_attention(q, k, v, nh, nkv, hd, batch, key_mask=km, **extra)
        return g.full_attention(q, k, v, nh, nkv, hd, batch, key_mask=km, **extra)

    feeds = {} if mask is None else {"key_mask": np.asarray(mask, dtype=dtype.numpy)}
    tag = ("mask" if mask is not None else "") + (f",{mask_dtype}" if mask_dtype != "f32" else "") + (
        f",{masked_rows}" if masked_rows else "") + ("-packed" if packed else "")
    return Row(op, f"{op}[h{nh}/kv{nkv},hd{hd},b{batch},s{seq}]{tag}", build, feeds, scale=2.0)


def _rms_norm_matmul(variant: str, m: int, k: int, n: int, epilogue: tuple[str, ...]) -> Row:
    def build(g: Graph) -> int:
        x, w_norm = g.input("x", [m, k]), g.parameter("w_norm", [k])
        w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
        operands = []
        for i, step in enumerate(epilogue):
            if step == "bias":
                operands.append(g.parameter(f"bias{i}", [n]))
            elif step == "add":
                operands.append(g.input(f"res{i}", [m, n]))
        return g.add_node("FusedRmsNormMatMul", (x, w_norm, w, *operands), eps=1e-5, variant=variant,
                          epilogue=epilogue)

    return Row("FusedRmsNormMatMul", f"FusedRmsNormMatMul{variant}[{m},{k},{n}]{'+'.join(epilogue)}", build)


def _swiglu_matmul(variant: str, m: int, k: int, n: int, epilogue: tuple[str, ...]) -> Row:
    # x [m, 2k]: the gate and up projections side by side (SwiGLUConcat's input)
    def build(g: Graph) -> int:
        x = g.input("x", [m, 2 * k])
        w = g.parameter("w", [n, k] if variant == "BT" else [k, n])
        operands = [g.parameter(f"bias{i}", [n]) if step == "bias" else g.input(f"res{i}", [m, n])
                    for i, step in enumerate(epilogue) if step in ("bias", "add")]
        return g.add_node("FusedSwiGLUMatMul", (x, w, *operands), variant=variant, epilogue=epilogue)

    return Row("FusedSwiGLUMatMul", f"FusedSwiGLUMatMul{variant}[{m},{k},{n}]{'+'.join(epilogue)}", build)


def _concat(shapes, axis: int, leaf: str = "input") -> Row:
    # leaf 'input': the concat kernel; 'parameter': a derived parameter packed by the Session.
    def build(g: Graph) -> int:
        make = g.input if leaf == "input" else g.parameter
        return g.concat([make(f"x{i}", shape) for i, shape in enumerate(shapes)], axis=axis)

    tag = "x".join(str(list(s)) for s in shapes) if len(shapes) <= 4 else f"{len(shapes)}x{list(shapes[0])}"
    return Row("Concat", f"Concat{tag}-axis{axis}-{leaf}", build)


def _slice_cols(shape, start: int, size: int) -> Row:
    return Row("SliceCols", f"SliceCols{list(shape)}[{start}:{start + size}]",
               lambda g: g.slice_cols(g.input("x", shape), start, size))


def _attention_rope(nh: int, nkv: int, hd: int, batch: int, seq: int, pairing: str, offset: int,
                    theta: float = 10000.0, packed: bool = False, mask=None, masked_rows: str = "mean") -> Row:
    # packed: one [rows, (nh + 2 nkv) * hd] input holding q, k and v side by side; mask: a key_mask [batch, seq]
    def build(g: Graph) -> int:
        rows = batch * seq
        km = (g.input("key_mask", [batch, seq]),) if mask is not None else ()
        if packed:
            qkv = g.input("qkv", [rows, (nh + 2 * nkv) * hd])
            return g.add_node("CausalAttentionRoPE", (qkv, *km), num_heads=nh, num_kv_heads=nkv, head_dim=hd,
                              theta=theta, pos_offset=offset, pairing=pairing, batch=batch, masked_rows=masked_rows)
        q = g.input("q", [rows, nh * hd])
        k, v = g.input("k", [rows, nkv * hd]), g.input("v", [rows, nkv * hd])
        return g.causal_attention_rope(q, k, v, nh, nkv, hd, theta, pos_offset=offset, pairing=pairing, batch=batch,
                                       key_mask=km[0] if km else None, masked_rows=masked_rows)

    feeds = {} if mask is None else {"key_mask": np.asarray(mask, dtype=np.float32)}
    tag = (f"[h{nh}/kv{nkv},hd{hd},b{batch},s{seq}]-{pairing}-off{offset}" + ("-packed" if packed else "")
           + (f"-mask,{masked_rows}" if mask is not None else ""))
    return Row("CausalAttentionRoPE", f"CausalAttentionRoPE{tag}", build, feeds, scale=2.0)


def _group_norm(op: str, n: int, c: int, size: int, groups: int, shift: float = 0.0) -> Row:
    # ``shift`` moves every x away from 0: a variance computed as E[x^2] - E[x]^2 would fail.
    rng = np.random.default_rng(n * 1000 + c * 10 + size)
    feeds = {"x": shift + 2.0 * rng.standard_normal((n, c, size))} if shift else {}

    def build(g: Graph) -> int:
        x = g.input("x", [n, c, size])
        w, b = g.parameter("w", [c]), g.parameter("b", [c])
        return g.add_node(op, (x, w, b), num_groups=groups, eps=1e-5)

    tag = f"-shift{shift:g}" if shift else ""
    return Row(op, f"{op}[{n},{c},{size}]g{groups}{tag}", build, feeds, scale=3.0)


def _simple(op: str, shape) -> Row:
    return Row(op, f"{op}{list(shape)}", lambda g: g.add_node(op, (g.input("x", shape),)))


def _grad_unary(op: str, shape) -> Row:
    return Row(f"{op}Grad", f"{op}Grad{list(shape)}",
               lambda g: g.add_node(f"{op}Grad", (g.input("dy", shape), g.input("x", shape))), scale=3.0)


def _grad_unary_precision(op: str) -> Row:
    # dy = 1 over a dense sweep of x: the derivative itself, with a bound of a few f32 ulps
    # of the largest derivative (the erf / tanh approximations and exp of the forward kernels).
    x = np.linspace(-10.0, 10.0, 4001)
    return Row(f"{op}Grad", f"{op}Grad-precision",
               lambda g: g.add_node(f"{op}Grad", (g.input("dy", [x.size]), g.input("x", [x.size]))),
               {"dy": np.ones_like(x), "x": x}, rtol=1e-6, atol=1e-6)


def _inputs(op: str, names: str, shapes, attrs=None, feeds=None, tag="", row_id=None, **kw) -> Row:
    # op applied to f32 inputs named by the words of ``names``, one per shape; the row id is
    # the op, the shapes and ``tag`` unless ``row_id`` is given
    def build(g: Graph) -> int:
        return g.add_node(op, [g.input(n, s) for n, s in zip(names.split(), shapes, strict=True)], **(attrs or {}))

    row_id = row_id or f"{op}{''.join(str(list(s)) for s in shapes)}{tag}"
    return Row(op, row_id, build, feeds or {}, **kw)


def _cross_entropy(op: str, rows: int, v: int, soft: bool = False) -> Row:
    # One-hot labels with an all-zero (padding) row; row 0's logits are 1e3, 999, 0, -1e3.
    # ``soft`` gives every row a distribution instead (rows summing to 1, one to 0.5).
    rng = np.random.default_rng(rows * 100 + v)
    logits = 3.0 * rng.standard_normal((rows, v))
    logits[0, :4] = [1e3, 999.0, 0.0, -1e3]
    if soft:
        labels = rng.random((rows, v))
        labels /= labels.sum(axis=1, keepdims=True)
        labels[-1] *= 0.5
    else:
        labels = np.eye(v)[rng.integers(0, v, rows)]
        labels[0] = np.eye(v)[1]
        labels[rows // 2] = 0.0
    return _inputs(op, "logits labels", [[rows, v]] * 2, feeds={"logits": logits, "labels": labels},
                   tag="-soft" if soft else "-onehot")


def _norm_grad(op: str, rows: int, n: int, shift: float = 0.0, lead=()) -> Row:
    # ``shift`` moves every x away from 0: a mean rounded to f32 would shift every xhat.
    xs = [*lead, rows, n]
    names, shapes = ("dy x w", [xs] * 2 + [[n]]) if op.endswith("X") else ("dy x", [xs] * 2)
    feeds = {"x": shift + 2.0 * np.random.default_rng(rows + n).standard_normal(xs)} if shift else {}
    return _inputs(op, names, shapes, {"eps": 1e-5}, feeds, f"-shift{shift:g}" if shift else "", scale=3.0)


def _group_norm_grad(op: str, n: int, c: int, size: int, groups: int, shift: float = 0.0) -> Row:
    rng = np.random.default_rng(n * 1000 + c * 10 + size)
    feeds = {"x": shift + 2.0 * rng.standard_normal((n, c, size))} if shift else {}
    names, shapes = "dy x", [[n, c, size]] * 2
    if op == "GroupNormGradInput":
        names, shapes = "dy x w", [*shapes, [c]]
    tag = f"g{groups}" + (f"-shift{shift:g}" if shift else "")
    return _inputs(op, names, shapes, {"num_groups": groups, "eps": 1e-5}, feeds, tag, scale=3.0)


def _scatter_add(ids: list[int], vocab: int, width: int) -> Row:
    def build(g: Graph) -> int:
        return g.add_node("ScatterAdd", (g.input("ids", [len(ids)], DType.U32), g.input("src", [len(ids), width])),
                          vocab_size=vocab)

    return Row("ScatterAdd", f"ScatterAdd[{len(ids)}x{width}]->{vocab}", build, {"ids": np.array(ids)})


def _rope_grad(pairing: str, batch: int, offset: int) -> Row:
    return _inputs("RoPEGrad", "dy", [[10, 16]], dict(theta=10000.0, head_dim=8, pos_offset=offset,
                                                      pairing=pairing, batch=batch),
                   tag=f"-{pairing}-b{batch}-off{offset}")


def _attention_grad(part: str, causal: bool, nh: int, nkv: int, hd: int, batch: int, seq: int, mask=None) -> Row:
    rows = batch * seq
    names, shapes = "dO q k v", [[rows, nh * hd], [rows, nh * hd], [rows, nkv * hd], [rows, nkv * hd]]
    feeds = {}
    if mask is not None:
        names, shapes = names + " key_mask", [*shapes, [batch, seq]]
        feeds = {"key_mask": np.asarray(mask, dtype=np.float32)}
    attrs = dict(causal=causal, num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch)
    tag = f"[h{nh}/kv{nkv},hd{hd},b{batch},s{seq}]" + ("-causal" if causal else "") + ("-mask" if mask else "")
    op = f"AttentionGrad{part}"
    return _inputs(op, names, shapes, attrs, feeds, row_id=op + tag, scale=2.0)


def _optimizer(op: str, shape) -> Row:
    # One in-place update (tests/gpu/test_inplace.py runs them over several steps); the
    # second moment is fed non-negative, the step count t >= 1, as an optimiser keeps them.
    rng = np.random.default_rng(len(shape) * 10 + shape[-1])
    moments = np.stack([rng.standard_normal(shape), rng.random(shape)])

    def build(g: Graph) -> int:
        x = lambda name: g.input(name, shape)  # noqa: E731
        if op == "SgdUpdate":
            return g.add_node(op, (x("param"), x("step")), lr=0.1, weight_decay=0.01)
        if op == "SgdMomentum":
            return g.add_node(op, (x("velocity"), x("grad"), x("param")), momentum=0.9)
        mv = g.input("moments", [2, *shape])
        if op == "AdamMoments":
            return g.add_node(op, (mv, x("grad")), beta1=0.9, beta2=0.999)
        return g.add_node(op, (x("param"), mv, g.input("t", [1], DType.U32)), lr=0.01, beta1=0.9, beta2=0.999,
                          eps=1e-8, weight_decay=0.01)

    return Row(op, f"{op}{list(shape)}", build, {"moments": moments, "t": np.array([3])})


def _positive(shape, lo: float = -20.0, hi: float = 20.0, seed: int = 0) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).uniform(lo, hi, size=shape))


def _probabilities(shape, soft: bool, edges: bool = False, seed: int = 0):
    # pred in (0, 1) and labels 0/1 (or soft); ``edges`` puts exact 0s and 1s in pred, where
    # the clamped logs take over (-100) and the clamped gradient is 0
    rng = np.random.default_rng(seed)
    pred = 1.0 / (1.0 + np.exp(-3.0 * rng.standard_normal(shape)))
    labels = rng.random(shape) if soft else (rng.random(shape) < 0.5).astype(np.float64)
    if edges:
        pred.flat[:4] = [0.0, 0.0, 1.0, 1.0]
        labels.flat[:4] = [0.0, 1.0, 0.0, 1.0]
    return {"pred": pred, "labels": labels}


def _bce(op: str, shape, soft=False, edges=False) -> Row:
    tag = ("-soft" if soft else "-hard") + ("-edges" if edges else "")
    return _inputs(op, "pred labels", [shape] * 2, feeds=_probabilities(shape, soft, edges, seed=len(shape)), tag=tag)


def _windowed(op: str, part: str, nh: int, nkv: int, hd: int, batch: int, q_seq: int, kv_seq: int,
              window: int = 0, mask=None) -> Row:
    # SlidingWindowAttention (window > 0, q_seq = kv_seq) or CrossAttention, or a gradient
    # of one (part Q, K or V): dO, q, k, v (and key_mask [batch, kv_seq]) are inputs
    names = "q k v"
    shapes = [[batch * q_seq, nh * hd], [batch * kv_seq, nkv * hd], [batch * kv_seq, nkv * hd]]
    if part:
        names, shapes = "dO " + names, [shapes[0], *shapes]
    feeds = {}
    if mask is not None:
        names, shapes = names + " key_mask", [*shapes, [batch, kv_seq]]
        feeds = {"key_mask": np.asarray(mask, dtype=np.float32)}
    attrs = dict(num_heads=nh, num_kv_heads=nkv, head_dim=hd, batch=batch)
    if window:
        attrs["window_size"] = window
    name = op + (f"Grad{part}" if part else "")
    tag = f"[h{nh}/kv{nkv},hd{hd},b{batch},s{q_seq}x{kv_seq}" + (f",w{window}]" if window else "]")
    return _inputs(name, names, shapes, attrs, feeds, row_id=name + tag + ("-mask" if mask else ""), scale=2.0)


def _conv(op: str, n: int, cin: int, hw, cout: int, k, stride: int, pad) -> Row:
    # Conv2d, or one of its gradients on the dy a Conv2d of these shapes produces
    attrs = dict(stride=stride, padding_h=pad[0], padding_w=pad[1])
    oh, ow = ((hw[0] + 2 * pad[0] - k[0]) // stride + 1, (hw[1] + 2 * pad[1] - k[1]) // stride + 1)
    x, w, dy = [n, cin, *hw], [cout, cin, *k], [n, cout, oh, ow]
    if op == "Conv2d":
        names, shapes = "x w", [x, w]
    elif op == "Conv2dGradInput":
        names, shapes = "dy w", [dy, w]
        attrs.update(in_h=hw[0], in_w=hw[1])
    else:
        names, shapes = "dy x", [dy, x]
        attrs.update(kernel_h=k[0], kernel_w=k[1])
    tag = f"-k{k[0]}x{k[1]}-s{stride}-p{pad[0]},{pad[1]}"
    return _inputs(op, names, shapes, attrs, tag=tag)


def _pool(op: str, shape, k, stride: int, pad: int, constant: bool = False) -> Row:
    attrs = dict(kernel_h=k[0], kernel_w=k[1], stride=stride, padding=pad)
    n, c, h, w = shape
    dy = [n, c, (h + 2 * pad - k[0]) // stride + 1, (w + 2 * pad - k[1]) // stride + 1]
    names, shapes = ("x", [shape]) if op == "MaxPool2d" else ("dy x", [dy, shape])
    feeds = {"x": np.zeros(shape)} if constant else {}  # every tap ties: the first one wins
    tag = f"-k{k[0]}x{k[1]}-s{stride}-p{pad}" + ("-ties" if constant else "")
    # atol from the values, not from max |reference|: a MASK_SENTINEL output would make it 1e25
    return _inputs(op, names, shapes, attrs, feeds, tag=tag, scale=2.0, atol=1e-5)


def _split(which: str, n: int, ca: int, cb: int, hw) -> Row:
    # The seed's SplitA / SplitB: channels [0, ca) or [ca, ca + cb) of [N, ca + cb, H, W], as
    # SliceCols between two Identity views (ir.seed_ops)
    size = hw[0] * hw[1]

    def build(g: Graph) -> int:
        flat = g.reshape(g.input("x", [n, ca + cb, *hw]), [n, (ca + cb) * size])
        start, width = (0, ca) if which == "A" else (ca, cb)
        return g.reshape(g.slice_cols(flat, start * size, width * size), [n, width, *hw])

    return Row("SliceCols", f"Split{which}[{n},{ca}+{cb},{hw[0]},{hw[1]}]", build)


def _greater_constant() -> Row:
    return Row("Greater", "Greater[7,13]>Constant[1]",
               lambda g: g.add_node("Greater", (g.input("x", [7, 13]), g.constant([0.25]))))


# --- the rows. Every row builder is defined above, so a new row may go in any ROWS block below
# (test_row_builders_are_defined_before_the_first_row keeps it so).

_MASK = [[1, 1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]  # sequence 1 fully masked
_LEFT_MASK = [[0, 0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0, 1]]  # and sequence 0 left padded
_LOGITS = np.array([[1e3, 999.0, 0.0, -1e3], [-1e30] * 4, [-1e30, 2.0, -1e30, 1.0]])
#: Rows of float32's lowest value (an exporter's additive mask): one wholly (uniform, as the reference), one in part
_LOWEST = np.array([[np.finfo(np.float32).min] * 4, [np.finfo(np.float32).min, 2.0, np.finfo(np.float32).min, 1.0]])

#: One row per unary op of the table in ir/ops/elementwise.py (Log has rows of its own below, for
#: its domain): whether dense precision sweeps of the op and of its gradient run, and whether it
#: has a gradient op. Each gives random rows at three shapes of the op (and of ``<Op>Grad``).
UNARY_ROWS: dict[str, tuple[bool, bool]] = {
    "Relu": (False, True), "Sigmoid": (True, True), "Tanh": (True, True), "Neg": (False, False),
    "Gelu": (True, True), "GeluTanh": (True, True), "Silu": (True, True), "Abs": (False, True),
    "Recip": (False, True), "Softplus": (True, True),
}
_SHAPES = ([1], [7, 13], [65, 33])


def _chunk_k(m: int, n: int) -> int:
    """K of one chunk of the 'BT' GEMV of ``m`` rows and ``n`` columns at a K past the short-K column
    splits (matmul_kernel.gemv_bt_cols, of the rows of a workgroup's block: gemv_tile; matmul_gemv.wgsl):
    GEMV_MAX_CHUNK steps of two quads per lane."""
    return GEMV_MAX_CHUNK * 8 * gemv_bt_lanes(gemv_tile(m, 1 << 16, n, "BT").bm, 1 << 16, n)



def _append_row(nh, nkv, hd, rows, n, pos, pairing, packed, scaling=None, tag=""):
    # CachedAttentionRoPEAppend: q, k and v inputs of their own or windows of one packed input (in the order
    # k, q, v with a spare column first, so no start is 0); the caches are inputs here, updated in place
    widths = (nh * hd, nkv * hd, nkv * hd)

    def build(g):
        pos_in = g.input("pos", [1], DType.U32)
        if packed:
            x = g.input("qkv", [n, sum(widths) + 1])
            qkv, starts = (x, x, x), (1 + widths[1], 1, 1 + widths[1] + widths[0])
        else:
            qkv, starts = tuple(g.input(t, [n, w]) for t, w in zip("qkv", widths, strict=True)), (-1, -1, -1)
        caches = (g.input("k_cache", [rows, nkv * hd]), g.input("v_cache", [rows, nkv * hd]))
        return g.add_node("CachedAttentionRoPEAppend", (*qkv, *caches, pos_in), num_heads=nh, num_kv_heads=nkv,
                          head_dim=hd, theta=10000.0, pairing=pairing, scaling=scaling,
                          **dict(zip(("q_start", "k_start", "v_start"), starts, strict=True)))
    return Row("CachedAttentionRoPEAppend",
               f"CachedAttentionRoPEAppend-{pairing}{'-packed' if packed else ''}[h{nh}/kv{nkv},hd{hd}]q{n}@{pos}/"
               f"{rows}{tag}", build, {"pos": np.array([pos])}, scale=2.0)


ROWS: list[Row] = [
    *[_unary(op, shape) for op in UNARY_ROWS for shape in _SHAPES],
    *[_unary_precision(op) for op, (sweep, _) in UNARY_ROWS.items() if sweep],
    *[_matmul(op, *mkn) for op in ("MatMul", "MatMulAT", "MatMulBT")
      for mkn in ((1, 1, 1), (7, 13, 5), (65, 33, 70), (3, 100, 129))],
    *[_fused(v, *mkn, epi) for v in ("", "AT", "BT") for mkn in ((7, 13, 5), (65, 33, 70))
      for epi in (("bias", "Gelu"), ("bias", "add", "GeluTanh", "Neg"))],
    _fused("", 9, 17, 66, ("add", "Relu", "bias", "Sigmoid", "Tanh", "Silu"), bias_shape=[1, 66]),
    _fused("BT", 1, 1, 1, ("bias", "add")),
    *[_binary(op, x, y) for op in ("Add", "Mul") for x, y in (
        ([7, 13], [7, 13]), ([7, 13], [1, 13]), ([7, 13], [7, 1]), ([13], [7, 13]), ([1], [5]),
        ([2, 3, 4, 5], [3, 1, 5]), ([2, 3, 4, 5, 6], [6]), ([4, 1, 6], [1, 5, 1]))],
    _binary("BiasAdd", [7, 13], [13]),
    _binary("BiasAdd", [65, 70], [1, 70]),
    _binary("SwiGLU", [7, 13], [7, 13]),
    *[_softmax(shape) for shape in ([1, 1], [7, 13], [3, 300], [2, 3, 5])],
    _softmax([3, 4], {"x": _LOGITS}, tag="-large-and-sentinel-logits"),
    _softmax([2, 4], {"x": _LOWEST}, tag="-float32-lowest"),
    *[_norm(op, rows, n) for op in ("LayerNorm", "RmsNorm") for rows, n in ((1, 1), (7, 13), (3, 300))],
    *[_norm(op, 7, 13, lead) for op in ("LayerNorm", "RmsNorm") for lead in ((2,), (1, 3))],
    _norm("LayerNorm", 1, 5, ()), _norm("RmsNorm", 3, 300, (), inputs=1), _norm("LayerNorm", 3, 300, (2,), inputs=1),
    _norm("LayerNorm", 7, 13, (2,), inputs=2),
    # the lanes form (ir/ops/norms.py ROW_NORM_LANES): quads held in registers, single columns (771), and rows too
    # long to hold (8200: each pass reads them again)
    *[_norm(op, rows, n) for op in ("LayerNorm", "RmsNorm") for rows, n in ((5, 768), (3, 771), (2, 8200))],
    _embedding([0, 10, 3, 3, 7, 1, 10, 0, 5], 11, 6),
    _embedding_layer_norm((11, 5), 9, 6),  # a row narrower than a subgroup
    _embedding_layer_norm((30, 7, 2), 13, 300),  # rows longer than the workgroup's 256 lanes
    _embedding_layer_norm((5, 3), 3, 4100),  # too long to hold in registers (gathered again in each pass)
    _embedding_layer_norm((11,), 8, 32, positions=4, pair=True),  # GPT-2's form: token rows and positions
    _embedding_layer_norm((11, 5), 9, 6, pair=True),  # single columns
    _embedding_layer_norm((5, 3), 3, 4100, pair=True),  # gathered again in each pass, the sum stored from the last
    *[_rope(pairing, batch, offset) for pairing in ("half", "adjacent")
      for batch, offset in ((1, 0), (2, 3), (5, 17))],
    _attention("FullAttention", 4, 2, 8, 2, 5),
    _attention("FullAttention", 2, 2, 16, 1, 70),
    _attention("FullAttention", 4, 2, 8, 3, 7, mask=_MASK),
    _attention("FullAttention", 4, 1, 4, 3, 7, mask=_MASK),
    _attention("FullAttentionPacked", 4, 2, 8, 2, 5),
    _attention("FullAttentionPacked", 4, 1, 4, 3, 7, mask=_MASK),
    _attention("FullAttentionPacked", 12, 12, 32, 2, 33, mask=[[1.0] * 33, [float(j < 20) for j in range(33)]]),
    _attention("CausalAttention", 4, 2, 8, 2, 5),
    _attention("CausalAttention", 2, 1, 32, 1, 70),
    # a key mask with causal rows (an exported decoder's padding): rows keeping no key of their own (sequence 0's
    # first two, left padded; sequence 1's all) give the mean of v over all the sequence's keys, or zeros
    *[_attention("CausalAttention", 4, 2, 8, 3, 7, mask=_LEFT_MASK, masked_rows=rows) for rows in ("mean", "zero")],
    _attention("CausalAttention", 4, 2, 8, 2, 5, packed=True),  # GPT-2's fused c_attn product read as it is
    _attention("CausalAttention", 4, 4, 8, 3, 7, mask=_LEFT_MASK, packed=True),
    _attention("CausalAttention", 4, 2, 6, 3, 7, mask=_LEFT_MASK, packed=True),  # hd 6: element-wise reads, v_off
    _attention_rope(4, 2, 8, 3, 7, "half", 0, packed=True, mask=_LEFT_MASK),
    _attention_rope(4, 1, 6, 3, 7, "adjacent", 2, mask=_LEFT_MASK, masked_rows="zero"),
    *[_rms_norm_matmul(v, *mkn, epi) for v in ("", "BT") for mkn, epi in (
        ((1, 1, 1), ()), ((7, 13, 5), ("bias", "Gelu")), ((70, 33, 130), ("bias", "add", "GeluTanh", "Neg")),
        ((65, 100, 3), ("add", "Silu", "bias", "Relu")))],
    *[_swiglu_matmul(v, *mkn, epi) for v in ("", "BT") for mkn, epi in (
        ((1, 1, 1), ()), ((3, 13, 5), ("add",)), ((4, 576, 70), ("bias", "Relu")), ((70, 33, 130), ("add", "Tanh")))],
    _concat([[7, 13], [7, 5], [7, 1]], axis=1),
    _concat([[3], [1], [9]], axis=0),
    _concat([[2, 3, 4], [2, 1, 4], [2, 5, 4]], axis=1),
    _concat([[2, 3, 4, 5], [2, 3, 4, 2]], axis=3),
    _concat([[1, 3, 4, 5], [2, 3, 4, 5]], axis=0),
    _concat([[65, 33]], axis=0),
    _concat([[3, 2 + i % 3] for i in range(16)], axis=1),
    _concat([[13, 7], [5, 7], [1, 7]], axis=0, leaf="parameter"),
    _concat([[7, 13], [7, 5]], axis=1, leaf="parameter"),
    _slice_cols([7, 13], 0, 13),
    _slice_cols([7, 13], 5, 3),
    _slice_cols([65, 300], 123, 129),
    *[_simple("SwiGLUConcat", shape) for shape in ([1, 2], [7, 26], [65, 300])],
    _attention_rope(4, 2, 8, 2, 5, "half", 0),
    _attention_rope(4, 2, 8, 2, 5, "half", 0, packed=True),
    _attention_rope(3, 1, 16, 1, 67, "adjacent", 2, packed=True),
    _attention_rope(4, 2, 8, 2, 5, "adjacent", 3),
    _attention_rope(2, 1, 32, 1, 70, "half", 17, theta=500000.0),
    _attention_rope(6, 2, 16, 3, 7, "adjacent", 1000),
    _attention_rope(4, 2, 8, 2, 5, "half", 1_000_000),  # f32 angles of such positions are off by ~0.3
    *[_group_norm(op, *shape) for op in ("GroupNorm", "GroupNormSilu")
      for shape in ((2, 6, 5, 3), (2, 12, 100, 3), (1, 4, 1, 4))],
    _group_norm("GroupNorm", 2, 8, 70, 2, shift=1000.0),
    _simple("Transpose", [7, 13]),
    _simple("Transpose", [1, 5]),
    *[_simple(op, shape) for op in ("SumAll", "MeanAll") for shape in ([1], [7, 13], [3000])],
]


# --- training ops (gradients, losses, adjoints) ---------------------------------------------------------


_REPEATS = [0, 10, 3, 3, 7, 1, 10, 0, 5, 3]
_MANY = [(7 * t) % 13 % 7 for t in range(300)]  # 300 indices (two chunks of 256), every row repeated

ROWS += [
    *[_grad_unary(op, shape) for op, (_, grad) in UNARY_ROWS.items() if grad for shape in _SHAPES],
    *[_grad_unary_precision(op) for op, (sweep, grad) in UNARY_ROWS.items() if sweep and grad],
    *[_inputs("SwiGLUGradGate", "dy gate up", [shape] * 3, scale=3.0) for shape in ([7, 13], [65, 33])],
    *[_inputs("SwiGLUGradUp", "dy gate", [shape] * 2, scale=3.0) for shape in ([7, 13], [65, 33])],
    *[_inputs("SwiGLUConcatGrad", "dy x", [[m, n], [m, 2 * n]], scale=3.0) for m, n in ((1, 1), (7, 13), (65, 150))],
    *[_inputs("SoftmaxGrad", "dy y", [shape] * 2) for shape in ([1, 1], [7, 13], [3, 300], [2, 3, 5])],
    *[_cross_entropy(op, rows, v, soft) for op in ("CrossEntropyLoss", "CrossEntropyLossGrad")
      for rows, v, soft in ((8, 5, False), (3, 300, False), (70, 11, False), (5, 7, True))],
    # the loss over 490 rows of 10 (by invocation) and 30 of 6000 (by workgroup): 490 rows walked by the whole
    # workgroup passed llvmpipe's 65,535 loop iterations and gave 2.70 for 2.75, silently
    *[_cross_entropy("CrossEntropyLoss", rows, v) for rows, v in ((490, 10), (30, 6000))],
    *[_inputs("SumRows", "x", [shape]) for shape in ([1, 1], [7, 13], [1000, 3], [5, 5000])],
    *[_inputs("ReduceTo", "x", [x], {"shape": t}, tag=f"->{t}") for x, t in (
        ([7, 13], [1, 13]), ([7, 13], [7, 1]), ([2, 3, 4, 5], [3, 1, 5]), ([2, 3, 4, 5], [1]), ([3000], [1]),
        ([2, 6, 50], [6, 1]), ([4, 1, 6], [1, 1, 6]), ([300, 9], [9]))],
    *[_inputs("BroadcastTo", "x", [x], {"shape": t}, tag=f"->{t}") for x, t in (
        ([1], [7, 13]), ([13], [7, 13]), ([7, 1], [7, 13]), ([3, 1, 5], [2, 3, 4, 5]), ([1], [1]))],
    *[_inputs("PadCols", "x", [[m, n]], {"start": start, "width": width}, tag=f"->{start}+{width}")
      for m, n, start, width in ((7, 5, 3, 13), (7, 13, 0, 13), (65, 129, 123, 300), (1, 1, 0, 2))],
    *[_norm_grad(op, rows, n) for op in ("LayerNormGradX", "LayerNormGradW", "RmsNormGradX", "RmsNormGradW")
      for rows, n in ((1, 1), (7, 13), (3, 300), (70, 5))],
    *[_norm_grad(op, 70, 300, shift=1000.0) for op in ("LayerNormGradX", "LayerNormGradW")],
    *[_norm_grad(op, 7, 13, lead=(2,)) for op in ("LayerNormGradX", "LayerNormGradW", "RmsNormGradX", "RmsNormGradW")],
    *[_group_norm_grad(op, *shape) for op in ("GroupNormGradInput", "GroupNormGradWeight")
      for shape in ((2, 6, 5, 3), (2, 12, 100, 3), (1, 4, 1, 4))],
    *[_group_norm_grad(op, 2, 8, 70, 2, shift=1000.0) for op in ("GroupNormGradInput", "GroupNormGradWeight")],
    _scatter_add(_REPEATS, 11, 6),
    _scatter_add(_MANY, 7, 5),
    _scatter_add([2, 0, 2], 3, 300),
    *[_rope_grad(pairing, batch, offset) for pairing in ("half", "adjacent")
      for batch, offset in ((1, 0), (2, 3), (5, 17))],
    *[_attention_grad(part, *args) for part in "QKV" for args in (
        (False, 4, 2, 8, 2, 5),
        (False, 4, 2, 8, 3, 7, _MASK),
        (False, 4, 1, 4, 3, 7, _MASK),
        (True, 4, 2, 8, 2, 5),
        (True, 2, 1, 16, 1, 70),
        (False, 2, 2, 8, 1, 70))],
]


# KV-cache ops (ir/ops/kv_cache.py): the position is fed; the cache is an input the op updates in place.
ROWS += [
    *[Row("RoPEDynamic", f"RoPEDynamic-{pairing}-off{off}", lambda g, pairing=pairing: g.add_node(
        "RoPEDynamic", (g.input("x", [10, 16]), g.input("offset", [1], DType.U32)), theta=10000.0, head_dim=8,
        pairing=pairing), {"offset": np.array([off])}) for pairing in ("half", "adjacent") for off in (0, 5, 1000)],
    *[Row("CacheWrite", f"CacheWrite[{rows},{w}]<-[{n},{w}]@{pos}", lambda g, rows=rows, w=w, n=n: g.add_node(
        "CacheWrite", (g.input("cache", [rows, w]), g.input("new", [n, w]), g.input("pos", [1], DType.U32))),
        {"pos": np.array([pos])}) for rows, w, n, pos in ((1, 1, 1, 0), (7, 5, 1, 6), (7, 5, 3, 2), (70, 13, 40, 17))],
    *[Row("CachedAttention", f"CachedAttention[h{nh}/kv{nkv},hd{hd}]q{n}@{pos}/{rows}",
          lambda g, nh=nh, nkv=nkv, hd=hd, rows=rows, n=n: g.add_node("CachedAttention", (
              g.input("q", [n, nh * hd]), g.input("k_cache", [rows, nkv * hd]), g.input("v_cache", [rows, nkv * hd]),
              g.input("pos", [1], DType.U32)), num_heads=nh, num_kv_heads=nkv, head_dim=hd),
          {"pos": np.array([pos])}, scale=2.0)
      for nh, nkv, hd, rows, n, pos in ((4, 2, 8, 10, 1, 0), (4, 2, 8, 10, 1, 9), (4, 2, 8, 10, 5, 3),
                                        (2, 1, 16, 80, 70, 10), (9, 3, 64, 40, 1, 20))],
]


# --- matmul kernels (ir/ops/matmul_kernel.py): tiles, vec4 and scalar reads -------------------------------
# The tile each shape takes is pinned in tests/unit/test_lowering.py (test_matmul_tile_heuristic); the
# comments name the tiles these rows were written for, before the split-K heuristic, which now picks
# 64x64, 64x32 or 32x64 for most of them. Every tile, whole and split, is run through matmul_choice in
# tests/gpu/test_matmul_split.py. Small K keeps the large tiles cheap on lavapipe; an odd K, M (for AT)
# or N selects the scalar reads of that operand.

ROWS += [
    _fused("", 2048, 8, 2048, ("bias",)),                          # 128x128, vec4 A and B
    _fused("BT", 2048, 7, 2048, ("add",)),                         # 128x128, scalar A and B
    _fused("AT", 2048, 8, 1024, ("bias", "Relu")),                 # 128x64, AT
    _rms_norm_matmul("BT", 1024, 9, 2048, ("bias",)),              # 64x128, RmsNorm prologue, scalar
    _rms_norm_matmul("BT", 128, 40, 36868, ()),                    # 64x128 for one row of 128x128 tiles (LM head)
    _fused("BT", 1024, 12, 1024, ("bias", "Silu")),                # 64x64
    _matmul("MatMul", 1024, 8, 510),                               # 32x64 (tied with 64x32), scalar B
    _rms_norm_matmul("", 510, 16, 1024, ("add",)),                 # 32x64 (K split in 2), RmsNorm prologue
    _matmul("MatMulAT", 510, 8, 1024),                             # 32x64, AT with scalar A
    *[_matmul(op, *mkn) for op in ("MatMul", "MatMulAT", "MatMulBT")  # 32x32 (K split in 4), edge tiles
      for mkn in ((130, 70, 257), (257, 129, 65), (3, 5, 7))],       # (3, 5, 7): GEMV
    *[_fused(v, 130, 70, 257, ("bias", "add", "GeluTanh")) for v in ("", "AT", "BT")],
    *[_rms_norm_matmul(v, 257, 129, 65, ("bias", "Silu")) for v in ("", "BT")],
    # GEMV (M <= 4): K split over the lanes of a column, 2 quads per step; K = 577 leaves a partial quad and step
    *[_fused(v, 1, k, n, epi) for v in ("", "AT", "BT") for k, n, epi in (
        (576, 1536, ("bias",)), (1536, 576, ()), (577, 130, ("add", "Gelu")))],
    _fused("BT", 4, 577, 130, ("add", "Gelu")),
    _fused("", 4, 576, 1537, ("bias",)),
    *[_rms_norm_matmul(v, m, k, n, epi) for v in ("", "BT") for m, k, n, epi in (
        (1, 1536, 576, ("bias", "add")), (3, 577, 70, ()))],
    # 'BT' GEMV chunks of GEMV_MAX_CHUNK steps of 8 quads a lane (_chunk_k of K): K = _chunk_k + 4 takes a
    # second chunk of one partial quad, 2 * _chunk_k + 4 a third; only their first lane's loads are inside K
    # (one row: K past GEMV_LONG_K, so 1 column of 256 lanes a workgroup, the RmsNorm row (1, 1536, 576) too);
    # 3 rows: the lane sum of the last of an odd count holds it twice, and stores it once
    _fused("BT", 1, _chunk_k(1, 9) + 4, 9, ("bias",)),
    _rms_norm_matmul("BT", 2, 2 * _chunk_k(2, 11) + 4, 11, ("add",)),
    _rms_norm_matmul("BT", 3, _chunk_k(3, 6) + 4, 6, ("bias",)),
    # the column splits of gemv_bt_cols at M >= 2: 8 columns (K <= GEMV_SHORT_K; N > GEMV_WIDE_N at M = 2;
    # M = 3 and 4, N >= 1536, K <= 576), 16 (N > GEMV_WIDE_N at M = 3 and 4), the wide ones over two chunks of K
    _fused("BT", 2, 100, 37, ("bias", "add")),
    _fused("BT", 2, _chunk_k(2, 8195) + 4, 8195, ("bias",)),
    _rms_norm_matmul("BT", 4, _chunk_k(4, 8195) + 4, 8195, ()),
    _rms_norm_matmul("BT", 3, 576, 1537, ("add",)),
    _rms_norm_matmul("BT", 4, 576, 1537, ("add",)),
    # one row of a wide product (the LM head): 16 columns a workgroup, an edge one, over two chunks of K
    _rms_norm_matmul("BT", 1, _chunk_k(1, 8195) + 4, 8195, ()),
    # one row past GEMV_LONG_K: 1 column of 256 lanes a workgroup, K not a multiple of 4 (scalar A) or of a
    # step (the decode step's down projection, with its SwiGLU prologue and residual add, at an odd size)
    _fused("BT", 1, GEMV_LONG_K + 3, 7, ("bias", "add")),
    _swiglu_matmul("BT", 1, GEMV_LONG_K + 100, 5, ("add",)),
    # 'BT' GEMVs of 5 to 16 rows (gemv_bt_rows; above 8 rows at N <= 1536 and K <= GEMV_LONG_K): in blocks of
    # GEMV_ROW_BLOCK (4) rows up to GEMV_WIDE_N, the last block partly past M (5, 7, 9 and 13 rows), else one block
    # (8 x 96 x 8195) of 16 columns a workgroup; from 4 rows each pair of rows' lane sum is unrolled
    # (GEMV_UNROLL_MIN_ROWS), an odd last row paired with itself; K past a chunk, not a multiple of 4 (scalar A),
    # past GEMV_LONG_K
    _fused("BT", 4, 1537, 130, ("bias",)),
    _fused("BT", 5, 577, 130, ("add", "Gelu")),
    _rms_norm_matmul("BT", 7, _chunk_k(7, 11) + 4, 11, ("bias",)),
    _fused("BT", 8, 96, 8195, ("bias",)),
    _rms_norm_matmul("BT", 9, 576, 1536, ("add",)),
    _fused("BT", 13, 1023, 37, ("bias", "add")),
    _swiglu_matmul("BT", 16, 100, 33, ("add",)),
    _matmul("MatMulBT", 16, GEMV_LONG_K + 1, 40),  # the tiled kernel: K past GEMV_LONG_K at 16 rows
    _fused("", 8, 96, 40, ("bias",)),  # B stored [K, N]: the tiled kernel above GEMV_MAX_ROWS
]


# --- attention tiling (ir/ops/attention.py attention_tiles, attention_cached.wgsl): BQ = 256 / ceil(hd / 4)
# query rows per workgroup (at most 64), BK keys per tile as the device's workgroup memory allows (16 KiB:
# 32 / 16 / 8 / 4 for hd 8 / 64 / 128 / 256; lavapipe's 32 KiB: more for a kernel of few workgroups); seq
# below, at and past a tile and a row block; hd not a multiple of 4 (element-wise reads). CachedAttention:
# 256 keys per chunk, pos + n below, at and past it, several query rows, the vec4 column
# split of hd 4..256.
_MASK_130 = [[float(j % 3 != 0) for j in range(130)], [0.0] * 130]
_LEFT_130 = [[float(j >= 70 and j % 3 != 0) for j in range(130)], [0.0] * 130]  # 70 rows left padded

ROWS += [
    _attention("FullAttention", 2, 1, 64, 1, 1),
    _attention("CausalAttention", 2, 1, 64, 1, 1),
    _attention("CausalAttention", 3, 3, 32, 2, 130),
    _attention("FullAttention", 2, 1, 128, 1, 33),
    _attention("CausalAttention", 2, 2, 256, 1, 19),
    _attention("CausalAttention", 16, 4, 256, 1, 67),  # 272 workgroups: 16 KiB, 4-key tiles, the last of 3 keys
    _attention("FullAttention", 2, 1, 5, 2, 9, mask=[[1, 0, 1, 1, 0, 1, 1, 1, 0], [0] * 9]),
    _attention("FullAttention", 4, 4, 32, 2, 130, mask=_MASK_130),
    _attention("CausalAttention", 16, 4, 8, 8, 130),   # 384 workgroups of 64 rows
    _attention("CausalAttention", 8, 2, 8, 4, 130),    # 96 workgroups of 64 rows
    _attention("CausalAttention", 3, 3, 32, 2, 130, mask=_LEFT_130),  # rows keeping no key past a row block
    _attention_rope(9, 3, 64, 2, 130, "half", 0, packed=True, mask=_LEFT_130, masked_rows="zero"),
    _attention_rope(9, 3, 64, 1, 130, "half", 0, packed=True),
    _attention_rope(2, 1, 128, 1, 17, "adjacent", 5),
    _attention_rope(2, 1, 6, 2, 21, "half", 3),       # hd 6: element-wise reads, odd pair count
    _attention_rope(2, 2, 6, 1, 9, "adjacent", 0, packed=True),
    *[Row("CachedAttention", f"CachedAttention[h{nh}/kv{nkv},hd{hd}]q{n}@{pos}/{rows}",
          lambda g, nh=nh, nkv=nkv, hd=hd, rows=rows, n=n: g.add_node("CachedAttention", (
              g.input("q", [n, nh * hd]), g.input("k_cache", [rows, nkv * hd]), g.input("v_cache", [rows, nkv * hd]),
              g.input("pos", [1], DType.U32)), num_heads=nh, num_kv_heads=nkv, head_dim=hd),
          {"pos": np.array([pos])}, scale=2.0)
      for nh, nkv, hd, rows, n, pos in ((9, 3, 64, 300, 1, 127), (9, 3, 64, 300, 1, 128), (9, 3, 64, 300, 3, 200),
                                        (9, 3, 64, 600, 1, 255), (9, 3, 64, 600, 1, 256), (9, 3, 64, 600, 2, 511),
                                        (4, 2, 32, 260, 2, 126), (2, 1, 128, 140, 4, 133), (2, 2, 256, 70, 1, 50),
                                        (3, 1, 6, 150, 2, 130), (2, 1, 4, 5, 5, 0))],
]


# Fused KV-cache ops (rewrites/attention.py): the rotation of RoPEDynamic moved into the cache
# write and into the cached attention; both pairings, positions past 0, head_dim not a multiple of 4.
ROWS += [
    *[Row("CacheWriteRoPE", f"CacheWriteRoPE-{pairing}[{rows},{w}]<-[{n},{w}]@{pos}/hd{hd}",
          lambda g, rows=rows, w=w, n=n, hd=hd, pairing=pairing: g.add_node(
              "CacheWriteRoPE", (g.input("cache", [rows, w]), g.input("new", [n, w]), g.input("pos", [1], DType.U32)),
              theta=10000.0, head_dim=hd, pairing=pairing), {"pos": np.array([pos])})
      for pairing in ("half", "adjacent")
      for rows, w, n, hd, pos in ((2, 2, 1, 2, 0), (7, 16, 1, 8, 6), (7, 16, 3, 8, 2), (70, 24, 40, 6, 17))],
    *[Row("CachedAttentionRoPE", f"CachedAttentionRoPE-{pairing}[h{nh}/kv{nkv},hd{hd}]q{n}@{pos}/{rows}",
          lambda g, nh=nh, nkv=nkv, hd=hd, rows=rows, n=n, pairing=pairing: g.add_node("CachedAttentionRoPE", (
              g.input("q", [n, nh * hd]), g.input("k_cache", [rows, nkv * hd]), g.input("v_cache", [rows, nkv * hd]),
              g.input("pos", [1], DType.U32)), num_heads=nh, num_kv_heads=nkv, head_dim=hd, theta=10000.0,
              pairing=pairing),
          {"pos": np.array([pos])}, scale=2.0)
      for pairing in ("half", "adjacent")
      for nh, nkv, hd, rows, n, pos in ((4, 2, 8, 10, 1, 0), (4, 2, 8, 10, 1, 9), (4, 2, 6, 10, 5, 3),
                                        (2, 1, 16, 200, 70, 120), (9, 3, 64, 40, 1, 20))],
]




# The cache writes moved into the cached attention: one new row (decoding) and several, at the first
# position and past it, over a cache of more than one chunk of keys, packed and not, head_dim not a
# multiple of 4 (element-wise reads and writes).
ROWS += [_append_row(*case, pairing, packed)
         for pairing in ("half", "adjacent") for packed in (False, True)
         for case in ((4, 2, 8, 10, 1, 0), (4, 2, 8, 10, 1, 9), (9, 3, 64, 300, 1, 270), (4, 2, 6, 10, 3, 4),
                      (2, 1, 16, 40, 5, 30))]


# RoPE frequency scaling (ir/ops/transformer.py rope_inv_freq, checked against transformers' formulas in
# tests/unit/test_rope_scaling.py): every RoPE-family kernel with linear and llama3 scaling. With
# head_dim 32, theta 10000 and an original context of 64, llama3's pairs fall in all three bands.
_SCALINGS = {"linear": ("linear", 4.0), "llama3": ("llama3", 8.0, 1.0, 4.0, 64.0)}
ROWS += [
    *[Row("RoPE", f"RoPE-scaled-{kind}", lambda g, sc=sc: g.rope(g.input("x", [20, 64]), 10000.0, 32, pos_offset=3,
                                                                 batch=2, scaling=sc))
      for kind, sc in _SCALINGS.items()],
    *[_inputs("RoPEGrad", "dy", [[20, 64]], dict(theta=10000.0, head_dim=32, pos_offset=5, pairing="half", batch=1,
                                                 scaling=sc), tag=f"-scaled-{kind}") for kind, sc in _SCALINGS.items()],
    *[Row("RoPEDynamic", f"RoPEDynamic-scaled-{kind}", lambda g, sc=sc: g.add_node(
        "RoPEDynamic", (g.input("x", [10, 64]), g.input("offset", [1], DType.U32)), theta=10000.0, head_dim=32,
        scaling=sc), {"offset": np.array([70])}) for kind, sc in _SCALINGS.items()],
    *[Row("CausalAttentionRoPE", f"CausalAttentionRoPE-scaled-{kind}", lambda g, sc=sc: g.causal_attention_rope(
        g.input("q", [30, 128]), g.input("k", [30, 64]), g.input("v", [30, 64]), 4, 2, 32, 10000.0, pos_offset=2,
        scaling=sc), scale=2.0) for kind, sc in _SCALINGS.items()],
    *[Row("CacheWriteRoPE", f"CacheWriteRoPE-scaled-{kind}", lambda g, sc=sc: g.add_node(
        "CacheWriteRoPE", (g.input("cache", [80, 64]), g.input("new", [3, 64]), g.input("pos", [1], DType.U32)),
        theta=10000.0, head_dim=32, scaling=sc), {"pos": np.array([70])}) for kind, sc in _SCALINGS.items()],
    *[Row("CachedAttentionRoPE", f"CachedAttentionRoPE-scaled-{kind}", lambda g, sc=sc: g.add_node(
        "CachedAttentionRoPE", (g.input("q", [2, 128]), g.input("k_cache", [80, 64]), g.input("v_cache", [80, 64]),
                                g.input("pos", [1], DType.U32)), num_heads=4, num_kv_heads=2, head_dim=32,
        theta=10000.0, scaling=sc), {"pos": np.array([70])}, scale=2.0) for kind, sc in _SCALINGS.items()],
    *[_append_row(4, 2, 32, 80, 2, 70, "half", True, scaling=sc, tag=f"-scaled-{kind}")
      for kind, sc in _SCALINGS.items()],
]


ROWS += [_optimizer(op, shape) for op in ("SgdUpdate", "SgdMomentum", "AdamMoments", "AdamStep")
         for shape in ([1], [7, 13], [300, 5])]


# --- the rest of the seed's ops (ir/ops_extra.py) ------------------------------------------------


_NONPOSITIVE = np.array([-3.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 1.0, 2.0, 3e38])


#: (nh, nkv, hd, batch, q_seq, kv_seq, window, mask): GQA, more than 64 query or key rows
#: (two workgroup blocks), a window of 1, one wider than the sequence, and key masks where
#: rows 0-2 of sequence 0 have their whole window (3) masked and sequence 1 is fully masked.
_SWA_MASK = [[0, 0, 0, 1, 1, 0, 1], [0] * 7, [1, 0, 1, 1, 0, 1, 1]]
_SWA_CASES = [
    (4, 2, 8, 2, 5, 5, 3, None),
    (2, 1, 16, 1, 70, 70, 20, None),
    (4, 2, 8, 2, 7, 7, 1, None),
    (2, 2, 8, 1, 9, 9, 100, None),
    (4, 2, 8, 3, 7, 7, 3, _SWA_MASK),
]
_CROSS_MASK = [[1, 0, 1, 1, 0, 0, 1], [0] * 7, [0, 0, 0, 0, 0, 0, 1]]
_CROSS_CASES = [
    (4, 2, 8, 2, 5, 9, 0, None),
    (2, 1, 16, 1, 70, 3, 0, None),
    (2, 2, 8, 1, 3, 70, 0, None),
    (4, 1, 4, 3, 4, 7, 0, _CROSS_MASK),
]


#: (n, cin, (h, w), cout, (kh, kw), stride, (ph, pw)): same-padding 3x3, a strided non-square
#: kernel, a stride that does not divide (h + 2p - k) (floored), padding wider than the kernel
#: (zero border outputs), a 1x1 conv of 2430 outputs, and 1x1x1x1.
_CONV_CASES = [
    (2, 3, (7, 9), 5, (3, 3), 1, (1, 1)),
    (2, 3, (9, 8), 4, (3, 2), 2, (0, 1)),
    (1, 2, (10, 7), 3, (2, 4), 3, (2, 0)),
    (1, 2, (5, 6), 2, (1, 3), 1, (2, 1)),
    (1, 20, (9, 9), 30, (1, 1), 1, (0, 0)),
    (1, 1, (1, 1), 1, (1, 1), 1, (0, 0)),
]


#: (shape, (kh, kw), stride, padding): 2x2/2 with a floored edge, overlapping 3x3/1 with
#: padding, a non-square strided window, windows lying wholly in the padding (padding >= kernel:
#: a fully masked window edge, MASK_SENTINEL), and 1600 outputs.
_POOL_CASES = [
    ([2, 3, 7, 9], (2, 2), 2, 0),
    ([2, 3, 7, 9], (3, 3), 1, 1),
    ([1, 2, 8, 7], (3, 2), 2, 1),
    ([1, 2, 5, 6], (1, 1), 2, 1),
    ([1, 2, 7, 7], (2, 2), 3, 2),
    ([1, 4, 80, 40], (2, 2), 2, 0),
]


ROWS += [
    *[_inputs("Log", "x", [shape], feeds={"x": _positive(shape)}, tag="-positive") for shape in ([1], [65, 33])],
    Row("Log", "Log-nonpositive", lambda g: g.add_node("Log", (g.input("x", [_NONPOSITIVE.size]),)),
        {"x": _NONPOSITIVE}, finite=False),
    Row("Log", "Log-precision", lambda g: g.add_node("Log", (g.input("x", [4001]),)),
        {"x": np.logspace(-30, 30, 4001)}, rtol=5e-7, atol=1e-6),  # WGSL log: 3 ulp, 2^-21 in [0.5, 2]
    *[_grad_unary("Log", shape) for shape in _SHAPES],
    *[_binary("Greater", x, y) for x, y in (([7, 13], [7, 13]), ([7, 13], [1, 13]), ([65, 33], [33]))],
    _inputs("Greater", "x y", [[5], [5]], feeds={"x": np.array([1.0, 2.0, 3.0, -1.0, 0.0]),
                                                  "y": np.array([1.0, 1.0, 4.0, -1.0, -0.0])}, tag="-ties"),
    _greater_constant(),
    *[_inputs("LogSoftmax", "x", [shape], scale=5.0) for shape in ([1, 1], [7, 13], [3, 300], [2, 3, 5])],
    _inputs("LogSoftmax", "x", [[3, 4]], feeds={"x": _LOGITS}, tag="-large-and-sentinel-logits", atol=1e-5),
    _inputs("LogSoftmax", "x", [[2, 4]], feeds={"x": _LOWEST}, tag="-float32-lowest", atol=1e-5),
    *[_inputs("LogSoftmaxGrad", "dy y", [shape] * 2) for shape in ([1, 1], [7, 13], [3, 300])],
    *[_bce(op, shape, soft, edges) for op in ("BceLoss", "BceLossGrad") for shape, soft, edges in (
        ([1], False, False), ([7, 13], False, True), ([3000], True, True), ([5, 7], True, False))],
    *[_windowed("SlidingWindowAttention", part, *case) for part in ("", "Q", "K", "V") for case in _SWA_CASES],
    *[_windowed("CrossAttention", part, *case) for part in ("", "Q", "K", "V") for case in _CROSS_CASES],
    *[_conv(op, *case) for op in ("Conv2d", "Conv2dGradInput", "Conv2dGradWeight") for case in _CONV_CASES],
    *[_pool(op, *case) for op in ("MaxPool2d", "MaxPool2dGrad") for case in _POOL_CASES],
    *[_pool(op, [1, 2, 6, 5], (3, 3), 1, 1, constant=True) for op in ("MaxPool2d", "MaxPool2dGrad")],
    *[_inputs("GlobalAvgPool", "x", [shape]) for shape in ([2, 3, 5, 7], [1, 2, 300], [3, 70, 1, 1])],
    *[_inputs("GlobalAvgPoolGrad", "dy", [shape[:2]], {"shape": shape}, tag=f"->{shape}")
      for shape in ([2, 3, 5, 7], [1, 2, 300], [3, 70, 1, 1])],
    *[_inputs("Upsample2x", "x", [shape]) for shape in ([2, 3, 5, 7], [1, 1, 1, 1], [1, 2, 20, 20])],
    *[_inputs("Upsample2xGrad", "dy", [shape]) for shape in ([2, 3, 10, 14], [1, 1, 2, 2], [1, 2, 40, 40])],
    _split("A", 2, 2, 3, (3, 4)),
    _split("B", 2, 2, 3, (3, 4)),
]


def test_row_builders_are_defined_before_the_first_row():
    # a builder defined after the first ROWS statement raises NameError at collection for a row
    # added above it
    import ast
    from pathlib import Path

    body = ast.parse(Path(__file__).read_text()).body
    rows = [st.lineno for st in body if isinstance(st, ast.Assign | ast.AnnAssign | ast.AugAssign)
            and getattr(getattr(st, "target", None) or st.targets[0], "id", None) == "ROWS"]
    late = [st.name for st in body if isinstance(st, ast.FunctionDef) and rows[0] < st.lineno < rows[-1]]
    assert not late, f"define the row builders {late} above the first ROWS statement (line {rows[0]})"


def test_every_op_with_dispatches_has_a_kernel_and_every_kernel_a_row():
    # rows may live in any tests/gpu/test_ops*.py module (a family's own table)
    dispatched = {op for op, spec in OPS.items() if spec.dispatches}
    with_kernel = {op for op, spec in OPS.items() if spec.kernel is not None}
    assert dispatched <= with_kernel, dispatched - with_kernel
    rows = {row.op for row in all_rows()}
    assert with_kernel <= rows, with_kernel - rows


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    # the device's default lowering: reductions in subgroup form where it has usable subgroups
    check_row(row, device, subgroups=None)


def _subgroup_rows() -> list[Row]:
    out = []
    for row in ROWS:
        g = Graph()
        g.set_outputs([row.build(g)])
        limits = {"max-storage-buffers-per-shader-stage": 64}  # rows like a 47-input Concat
        if lower(g, limits, subgroups=True).subgroups:
            out.append(row)
    return out


SUBGROUP_ROWS = _subgroup_rows()


@pytest.mark.parametrize("row", SUBGROUP_ROWS, ids=[r.id for r in SUBGROUP_ROWS])
@pytest.mark.parametrize("subgroups", [False, True], ids=["workgroup-memory", "subgroups"])
def test_reductions_in_both_forms_match_reference(row: Row, subgroups: bool, device):
    # rows whose kernels have a subgroup form, lowered explicitly in each form
    if subgroups and not subgroup_reductions_usable(device):
        pytest.skip("the device has no usable subgroup operations")
    session = check_row(row, device, subgroups=subgroups)
    assert session.plan.subgroups == subgroups
    assert all(d.kernel.endswith("+sg") == subgroups for d in session.plan.dispatches if d.op == row.op)


def test_extra_kernels_on_a_split_grid(device):
    # The vision, windowed-attention and softmax kernels read their linear workgroup index back from a 2-D or 3-D
    # grid (lowering/limits.py split_grid): with at most 4 workgroups per dimension, most of
    # these need more than one dimension, and every workgroup must still land on its work.
    g = Graph()
    x = g.input("x", [2, 3, 16, 20])
    conv = g.add_node("Conv2d", (x, g.parameter("w", [2, 3, 3, 3])), stride=1, padding_h=1, padding_w=1)
    pool = g.add_node("MaxPool2d", (conv,), kernel_h=2, kernel_w=2, stride=1, padding=0)
    dw = g.add_node("Conv2dGradWeight", (conv, x), kernel_h=3, kernel_w=3, stride=1, padding_h=1, padding_w=1)
    up = g.add_node("Upsample2x", (pool,))
    gap = g.add_node("GlobalAvgPool", (up,))
    q, kv = g.input("q", [2 * 70, 16]), g.input("kv", [2 * 70, 8])
    swa = g.add_node("SlidingWindowAttention", (q, kv, kv), num_heads=2, num_kv_heads=1, head_dim=8, window_size=9,
                     batch=2)
    dk = g.add_node("CrossAttentionGradK", (swa, q, kv, kv), num_heads=2, num_kv_heads=1, head_dim=8, batch=2)
    lsm = g.add_node("LogSoftmax", (g.reshape(conv, [32, 40]),))
    g.set_outputs([conv, pool, dw, up, gap, swa, dk, lsm])
    plan = lower(g, {"max-compute-workgroups-per-dimension": 4})
    split = {d.op for d in plan.dispatches if d.workgroups[1] > 1}
    assert split >= {"Conv2d", "MaxPool2d", "Conv2dGradWeight", "Upsample2x", "SlidingWindowAttention",
                     "LogSoftmax"}, [(d.op, d.workgroups) for d in plan.dispatches]
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((2, 3, 3, 3))}
    feeds = {"x": rng.standard_normal((2, 3, 16, 20)), "q": rng.standard_normal((140, 16)),
             "kv": rng.standard_normal((140, 8))}
    for got, want in zip(Session(plan, params, device=device).run(feeds), evaluate(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


_SMALL_WORKGROUP_NORMS = [_norm("LayerNorm", 5, 768), _norm("RmsNorm", 3, 771), _norm("LayerNorm", 2, 8200),
                          _embedding_layer_norm((30, 7, 2), 13, 300), _embedding_layer_norm((11, 5), 37, 384)]


@pytest.mark.parametrize("row", _SMALL_WORKGROUP_NORMS, ids=[r.id for r in _SMALL_WORKGROUP_NORMS])
def test_row_norms_in_workgroups_of_64(row, monkeypatch, device):
    # matmul_split_layer_norm.wgsl's workgroup size is a slot (matmul_kernel.LAYER_NORM_WG): the row kernels of
    # LayerNorm and RmsNorm and EmbeddingSumLayerNorm's in workgroups of 64 invocations, rows of 32 lanes or more,
    # each dispatch's grid counted in them
    import eggfuse.ir.ops.matmul_kernel as mk

    monkeypatch.setattr(mk, "LAYER_NORM_WG", 64)
    monkeypatch.setattr(mk, "LAYER_NORM_MIN_LANES", 32)
    monkeypatch.setattr(mk, "LAYER_NORM_QUAD_MIN_LANES", 32)
    session = check_row(row, device, subgroups=None)
    (norm,) = [d for d in session.plan.dispatches if "@workgroup_size(64)" in d.source]
    lanes = int(norm.source.split("const LANES: u32 = ")[1].split("u")[0])
    rows = int(np.prod(session.plan.buffers[session.plan.outputs[0]].shape[:-1]))
    assert lanes >= 32 and norm.workgroups[0] == -(-rows * lanes // 64), norm
