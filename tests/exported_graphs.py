"""ONNX graphs of attention as torch.onnx.export writes it (both exporters, transformers' sdpa and
eager paths), built with onnx.helper at odd sizes, for the recognition tests
(tests/unit/test_exported_recognition.py, tests/gpu/test_exported_recognition_gpu.py).

:func:`attention_model` returns a ModelProto of one attention block: q/k/v projections of an
input x [B, S, E], the head split (Reshape + Transpose), optionally rotate-half RoPE with
folded cos/sin tables, GQA's repeat_kv (Unsqueeze / Expand / Reshape), the scaled product with
the exporter's k^T and scale, a mask, the softmax (with SDPA's NaN guard or not), the product
with v, the head merge and the output projection; :func:`feeds` gives its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


#: The masks of :class:`Attn` that read a bool input [B, 1, 1, S].
PADDING = ("padding", "padding_causal", "padding_causal_min", "padding_true", "padding_min", "padding_true_min",
           "padding_ten_thousand")


@dataclass(frozen=True)
class Attn:
    """One attention block's form. ``kt``: how k^T is written: ``dynamo`` (Reshape [B H, S, D],
    Transpose [0,2,1], Reshape back), ``classic`` (Transpose [0,1,3,2]) or ``bert`` (Transpose
    [0,2,3,1] of the [B,S,H,D] view). ``scale``: ``split`` (d^-1/4 on q and on k^T), ``mul``
    (the product times d^-1/2) or ``div`` (the product over d^1/2). ``mask``: none, ``causal``
    (a folded -inf causal initializer [1,1,S,S]), ``causal_min`` (float32's min, [S,S]),
    ``padding`` (Where(bool input [B,1,1,S], 0, -inf)), ``padding_causal`` (And of a causal bool
    initializer and the padding input, then Where(., 0, -inf); ``padding_causal_min`` with float32's
    min for -inf: the dynamo exporter's decoder mask), ``padding_true`` (the same with an
    all-true initializer [1,1,S,1]: the classic exporter's encoder mask), ``padding_min`` and
    ``padding_true_min`` (``padding`` and ``padding_true`` with float32's min for -inf: the dynamo
    exporter's encoder mask is the second), ``padding_ten_thousand`` (``padding`` with -10000: older
    transformers), ``bias`` (a float input
    [1,H,S,S] added). ``guard``: SDPA's Where(IsNaN(p), 0, p). ``probs_output`` and
    ``scores_output``: the probabilities / the raw scaled scores also graph outputs;
    ``proj_bias``: the projections add a bias (BERT)."""

    batch: int = 2
    seq: int = 5
    heads: int = 3
    kv_heads: int = 3
    head_dim: int = 6
    hidden: int = 7
    kt: str = "dynamo"
    scale: str = "split"
    mask: str = ""
    guard: bool = True
    rope: bool = False
    theta: float = 10000.0
    probs_output: bool = False
    scores_output: bool = False
    proj_bias: bool = False


def rope_tables(seq: int, theta: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' LlamaRotaryEmbedding cos / sin [1, 1, seq, d], computed in float32 as torch does."""
    inv = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)).astype(np.float32)
    ang = np.arange(seq, dtype=np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=1)
    return np.cos(emb)[None, None].astype(np.float32), np.sin(emb)[None, None].astype(np.float32)


def attention_model(a: Attn, seed: int = 0):
    """The ModelProto of attention block ``a`` (weights random, fixed by ``seed``)."""
    rng = np.random.default_rng(seed)
    b, s, h, kv, d, e = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, a.hidden
    group = h // kv
    nodes, inits, inputs = [], [], [("x", F, [b, s, e])]
    outputs = [("y", F, [b, s, e])]

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind, ins, **attrs):
        out = f"{kind.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    def ints(name, values):
        return init(name, np.asarray(values, dtype=np.int64))

    def head_split(x, heads, name):
        w = init(f"w{name}", (rng.standard_normal((e, heads * d)) / np.sqrt(e)).astype(np.float32))
        y = op("MatMul", [x, w])
        if a.proj_bias:
            y = op("Add", [init(f"b{name}", rng.standard_normal(heads * d).astype(np.float32)), y])
        view = op("Reshape", [y, ints(f"{name}_shape", [b, s, heads, d])])
        return view, op("Transpose", [view], perm=[0, 2, 1, 3])

    def rope(x, name):
        half = d // 2
        lo = op("Slice", [x, ints(f"{name}_z", [0]), ints(f"{name}_h", [half]), ints(f"{name}_ax", [3]),
                          ints(f"{name}_st", [1])])
        hi = op("Slice", [x, ints(f"{name}_h2", [half]), ints(f"{name}_end", [2**62]), ints(f"{name}_ax2", [-1]),
                          ints(f"{name}_st2", [1])])
        rot = op("Concat", [op("Neg", [hi]), lo], axis=-1)
        return op("Add", [op("Mul", [x, "cos"]), op("Mul", [rot, "sin"])])

    def repeat(x, name):
        if group == 1:
            return x
        x5 = op("Unsqueeze", [x, ints(f"{name}_axes", [2])])
        x5 = op("Expand", [x5, ints(f"{name}_exp", [b, kv, group, s, d])])
        return op("Reshape", [x5, ints(f"{name}_rep", [b, h, s, d])])

    if a.rope:
        cos, sin = rope_tables(s, a.theta, d)
        init("cos", cos)
        init("sin", sin)
    _, q = head_split("x", h, "q")
    k_view, k = head_split("x", kv, "k")
    _, v = head_split("x", kv, "v")
    if a.rope:
        q, k = rope(q, "rq"), rope(k, "rk")
    k, v = repeat(k, "k"), repeat(v, "v")
    if a.kt == "dynamo":
        k3 = op("Reshape", [k, ints("k3", [b * h, s, d])])
        kt = op("Reshape", [op("Transpose", [k3], perm=[0, 2, 1]), ints("k4", [b, h, d, s])])
    elif a.kt == "classic":
        kt = op("Transpose", [k], perm=[0, 1, 3, 2])
    else:  # bert: from the [B, S, H, D] view straight to [B, H, D, S]
        kt = op("Transpose", [k_view], perm=[0, 2, 3, 1])
    if a.scale == "split":
        c = init("c", np.float32(d ** -0.25))
        scores = op("MatMul", [op("Mul", [q, c]), op("Mul", [kt, c])])
    elif a.scale == "mul":
        scores = op("Mul", [op("MatMul", [q, kt]), init("c", np.float32(d ** -0.5))])
    else:
        scores = op("Div", [op("MatMul", [q, kt]), init("c", np.float32(d ** 0.5))])
    if a.scores_output:
        nodes.append(helper.make_node("Identity", [scores], ["scores"], name="scores_out"))
        outputs.append(("scores", F, [b, h, s, s]))
    tril = np.tril(np.ones((s, s), dtype=bool))
    zero, ninf = init("zero", np.float32(0.0)), init("ninf", np.float32(-np.inf))
    if a.mask == "causal":
        scores = op("Add", [scores, init("causal", np.where(tril, 0.0, -np.inf).astype(np.float32)[None, None])])
    elif a.mask == "causal_min":
        scores = op("Add", [scores, init("causal", np.where(tril, 0.0, np.finfo(np.float32).min).astype(np.float32))])
    elif a.mask in PADDING:
        inputs.append(("mask", B, [b, 1, 1, s]))
        if a.mask in ("padding", "padding_min", "padding_ten_thousand"):
            m = "mask"
        else:
            c = tril[None, None] if a.mask.startswith("padding_causal") else np.ones((1, 1, s, 1), dtype=bool)
            m = op("And", [init("tril", c), "mask"])
        masked = (init("fmin", np.float32(np.finfo(np.float32).min)) if a.mask.endswith("_min") else
                  init("ten_thousand", np.float32(-10000.0)) if a.mask == "padding_ten_thousand" else ninf)
        scores = op("Add", [scores, op("Where", [m, zero, masked])])
    elif a.mask == "bias":
        inputs.append(("bias", F, [1, h, s, s]))
        scores = op("Add", [scores, "bias"])
    p = op("Softmax", [scores], axis=-1)
    if a.guard:
        p = op("Where", [op("IsNaN", [p]), zero, p])
    if a.probs_output:
        nodes.append(helper.make_node("Identity", [p], ["probs"], name="probs_out"))
        outputs.append(("probs", F, [b, h, s, s]))
    o = op("Reshape", [op("Transpose", [op("MatMul", [p, v])], perm=[0, 2, 1, 3]), ints("merge", [b, s, h * d])])
    wo = init("wo", (rng.standard_normal((h * d, e)) / np.sqrt(h * d)).astype(np.float32))
    nodes.append(helper.make_node("MatMul", [o, wo], ["y"], name="o_proj"))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, t, sh) for n, t, sh in inputs],
                              [helper.make_tensor_value_info(n, t, sh) for n, t, sh in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(a: Attn, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs of :func:`attention_model`: x, and the mask (row 1 of the batch padded after 2 keys,
    for a batch of 3 or more row 2 fully masked, for 4 or more row 3 padded before 2 keys: its
    first two query rows keep no key of a causal row's) or the additive bias it takes."""
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal((a.batch, a.seq, a.hidden)).astype(np.float32)}
    if a.mask in PADDING:
        m = np.ones((a.batch, 1, 1, a.seq), dtype=bool)
        if a.batch > 1:
            m[1, ..., 2:] = False
        if a.batch > 2:
            m[2] = False
        if a.batch > 3:
            m[3, ..., :2] = False
        out["mask"] = m
    elif a.mask == "bias":
        out["bias"] = rng.standard_normal((1, a.heads, a.seq, a.seq)).astype(np.float32)
    return out


# --- the exported fixtures' expected outputs ------------------------------------------------------

#: Fixture files (tests/data/exported/) whose ONNX graph differs from torch at some batch rows, and those rows:
#: distilbert_tiny's third sequence keeps no key; the dynamo exporter's graph adds float32's min to its scores,
#: whose softmax averages v (onnxruntime agrees, 3.1 away from torch at the output), while torch's own SDPA
#: gives that row zeros (the classic exporter's -inf mask and NaN guard give zeros too). gpt2_tiny's second sequence
#: is left padded: its first two rows keep no key of their own, and the dynamo exporter's graph averages v over all
#: the sequence's keys there (0.25 away from torch at the logits; the classic exporter's graph agrees with torch).
GRAPH_NOT_TORCH = {"distilbert_tiny.dynamo.onnx": (2,), "gpt2_tiny.dynamo.onnx": (1,)}


def expected_outputs(path, data) -> dict[str, np.ndarray]:
    """The outputs a fixture's ONNX graph must give on the inputs of its ``data`` (``NAME.npz``): torch's, but
    at the rows :data:`GRAPH_NOT_TORCH` names onnxruntime's (its CPU provider, on the same file)."""
    want = {k.removeprefix("output."): data[k] for k in data.files if k.startswith("output.")}
    rows = GRAPH_NOT_TORCH.get(path.name)
    if rows:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: data["input." + i.name] for i in session.get_inputs()}
        for o, got in zip(session.get_outputs(), session.run(None, feeds), strict=True):
            want[o.name] = want[o.name].copy()
            want[o.name][list(rows)] = got[list(rows)]
    return want
