"""Random graphs for the differential fuzz test (tests/gpu/test_fuzz_graphs.py).

:func:`random_graph` builds a graph with the ``eggfuse.Graph`` builder out of the patterns
the rewrite rules match, at odd sizes: matmuls (plain, AT, BT) with bias, row-broadcast and
residual adds in either operand order and chains of every unary op of the table that may be
an epilogue step (Log and Recip of |x| + 1); x * sigmoid(x) both ways; SiLU-
gated products and gate/up projection pairs; RmsNorm before a matmul; LayerNorm, Softmax;
Concat of 1 to 16 computed tensors and of parameters; reshape chains; Neg(Neg), Relu(Relu),
Transpose(Transpose); broadcasting Add and Mul; causal attention with RoPE on q and k from
three projections of one input; a decoding step (RoPEDynamic, CacheWrite, CachedAttention);
GroupNorm then SiLU; Embedding; SumAll and MeanAll. Operands are drawn from every tensor built so far, so intermediates
have several readers; outputs are random nodes (now and then a leaf); some graphs carry an
input and a parameter that no output reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from eggfuse.ir import DType, Graph
from eggfuse.ir.ops import elementwise

#: Sizes, most of them not multiples of any tile.
DIMS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 31, 33, 65)
#: Epilogue ops a float32 chain cannot be compared on against the float64 reference: the
#: discontinuous ones (a last-bit difference between two summation orders moves Floor, Ceil or
#: Round by a whole unit), Tan (poles), those defined on [-1, 1] only (Asin, Acos, Atanh) and
#: those that overflow within a few links of a chain (Exp, Sinh, Cosh). Their epilogue forms
#: are checked by GPU rows of their own (tests/gpu/test_ops_unary.py).
UNFUZZABLE = frozenset({"Floor", "Ceil", "Round", "Tan", "Asin", "Acos", "Atanh", "Exp", "Sinh", "Cosh"})
#: Every other unary op of the table (ir/ops/elementwise.py) that a matmul may apply at its store.
UNARY = tuple(u.name for u in elementwise.UNARY if u.epilogue and u.name not in UNFUZZABLE)
with np.errstate(all="ignore"):
    #: Those not finite on all of -1, 0, 1 (Log, Recip): they are applied to |x| + 1.
    POSITIVE_ONLY = frozenset(u.name for u in elementwise.UNARY if u.name in UNARY
                              and not np.isfinite(u.fn(np.array([-1.0, 0.0, 1.0]))).all())


@dataclass
class RandomGraph:
    """A graph with its feeds: ``inputs`` and ``params`` (state tensors included) as float32
    / uint32 arrays for every leaf, dead ones too; ``patterns`` names what was built."""

    graph: Graph
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    patterns: list[str] = field(default_factory=list)


class _Builder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.r = RandomGraph(Graph())
        self.g = self.r.graph
        self.pool: list[int] = []  # 2-D f32 tensors any later op may read
        self.made: list[int] = []  # every computed node, for the outputs
        self.sinks: list[int] = []  # results no later op reads: always outputs
        self.names = 0

    # --- leaves and helpers ------------------------------------------------------------

    def dim(self) -> int:
        return int(self.rng.choice(DIMS))

    def name(self, kind: str) -> str:
        self.names += 1
        return f"{kind}{self.names}"

    def input(self, shape) -> int:
        name = self.name("x")
        self.r.inputs[name] = self.rng.standard_normal(shape).astype(np.float32)
        return self.g.input(name, shape)

    def param(self, shape, scale: float | None = None) -> int:
        name = self.name("p")
        scale = 1.0 / np.sqrt(shape[0]) if scale is None else scale
        self.r.params[name] = (scale * self.rng.standard_normal(shape)).astype(np.float32)
        return self.g.parameter(name, shape)

    def shape(self, x: int) -> tuple[int, ...]:
        return self.g.node(x).type.shape

    def pick(self) -> int:
        return self.pool[int(self.rng.integers(len(self.pool)))]

    def keep(self, x: int, pattern: str) -> int:
        self.pool.append(x)
        self.made.append(x)
        self.r.patterns.append(pattern)
        return x

    def unary_op(self, op: str, x: int) -> int:
        # op(x), or for an op of a restricted domain op(|x| + 1): a [1, N] addend of ones, which
        # a matmul folds into its store as a bias, so the op stays in the epilogue chain
        if op in POSITIVE_ONLY:
            ones = self.g.constant(np.ones((1, self.shape(x)[1]), dtype=np.float32))
            x = self.g.add(self.g.add_node("Abs", (x,)), ones)
        return self.g.add_node(op, (x,))

    def same_shape(self, x: int) -> int:
        # another tensor of x's shape: one from the pool, or a new input or parameter
        shape = self.shape(x)
        others = [p for p in self.pool if p != x and self.shape(p) == shape]
        if others and self.rng.random() < 0.6:
            return others[int(self.rng.integers(len(others)))]
        return self.input(shape) if self.rng.random() < 0.5 else self.param(shape, 1.0)

    # --- patterns ----------------------------------------------------------------------

    def linear(self) -> None:
        # MatMul / MatMulAT / MatMulBT, then bias, row-broadcast or residual adds in either
        # order and activations, each with some probability
        x = self.pick()
        m, k = self.shape(x)
        n = self.dim()
        variant = self.rng.choice(["", "AT", "BT"])
        if variant == "AT":  # x is [K, M]
            k, m = m, k
            b = self.param([k, n]) if self.rng.random() < 0.8 else self.input([k, n])
            y = self.g.matmul_at(x, b)
        elif variant == "BT":
            y = self.g.matmul_bt(x, self.param([n, k]))
        else:
            w = [p for p in self.pool if self.shape(p) == (k, n)]
            y = self.g.matmul(x, w[0] if w and self.rng.random() < 0.3 else self.param([k, n]))
        steps = [f"MatMul{variant}"]
        for _ in range(int(self.rng.integers(0, 4))):
            kind = self.rng.choice(["bias", "bias2d", "row", "residual", "unary"])
            if kind == "bias":
                y = self.g.bias_add(y, self.param([n], 1.0))
            elif kind == "bias2d":
                y = self.g.bias_add(y, self.param([1, n], 1.0))
            elif kind == "row":  # Add of a [1, N] addend: a bias when M > 1
                d = self.param([1, n], 1.0)
                y = self.g.add(y, d) if self.rng.random() < 0.5 else self.g.add(d, y)
            elif kind == "residual":
                d = self.same_shape(y)
                y = self.g.add(y, d) if self.rng.random() < 0.5 else self.g.add(d, y)
            else:
                kind = str(self.rng.choice(UNARY))
                y = self.unary_op(kind, y)
            steps.append(kind)
            if self.rng.random() < 0.2:  # an intermediate of the chain read elsewhere too
                self.keep(y, "+".join(steps))
        self.keep(y, "+".join(steps))

    def unary(self) -> None:
        x = self.pick()
        op = str(self.rng.choice(UNARY))
        y = self.unary_op(op, x)
        if op in ("Neg", "Relu") and self.rng.random() < 0.5:  # Neg(Neg(x)), Relu(Relu(x))
            y = self.g.add_node(op, (y,))
            op += "x2"
        self.keep(y, op)

    def silu_pattern(self) -> None:
        x = self.pick()
        s = self.g.sigmoid(x)
        self.keep(self.g.mul(x, s) if self.rng.random() < 0.5 else self.g.mul(s, x), "x*sigmoid(x)")
        if self.rng.random() < 0.3:
            self.pool.append(s)

    def swiglu(self) -> None:
        h = self.pick()
        m, k = self.shape(h)
        n = self.dim()
        if self.rng.random() < 0.5:  # gate and up projections of one input: SwiGLUConcat
            bt = self.rng.random() < 0.5
            wg, wu = (self.param([n, k]), self.param([n, k])) if bt else (self.param([k, n]), self.param([k, n]))
            mm = self.g.matmul_bt if bt else self.g.matmul
            gate, up = mm(h, wg), mm(h, wu)
            pattern = "SwiGLU(h@Wg, h@Wu)"
        else:
            gate, up = h, self.same_shape(h)
            pattern = "Silu(g)*u"
        kind = self.rng.choice(["swiglu", "mul", "mul_swapped"])
        if kind == "swiglu":
            y = self.g.swiglu(gate, up)
        else:
            silu = self.g.silu(gate) if self.rng.random() < 0.5 else self.g.mul(gate, self.g.sigmoid(gate))
            y = self.g.mul(silu, up) if kind == "mul" else self.g.mul(up, silu)
        self.keep(y, f"{pattern} {kind}")

    def rms_norm_matmul(self) -> None:
        x = self.pick()
        m, k = self.shape(x)
        n = self.dim()
        h = self.g.rms_norm(x, self.param([k], 1.0), eps=float(self.rng.choice([1e-5, 1e-6])))
        if self.rng.random() < 0.5:
            y = self.g.matmul_bt(h, self.param([n, k]))
        else:
            y = self.g.matmul(h, self.param([k, n]))
        if self.rng.random() < 0.5:
            y = self.g.bias_add(y, self.param([n], 1.0))
        if self.rng.random() < 0.3:
            self.pool.append(h)  # the normalised rows read by another op as well
        self.keep(y, "RmsNorm+MatMul")

    def norm_or_softmax(self) -> None:
        x = self.pick()
        k = self.shape(x)[1]
        if self.rng.random() < 0.5:
            self.keep(self.g.layer_norm(x, self.param([k], 1.0), self.param([k], 1.0)), "LayerNorm")
        else:
            self.keep(self.g.softmax(x), "Softmax")

    def concat(self) -> None:
        x = self.pick()
        axis = int(self.rng.integers(2))
        count = int(self.rng.choice([1, 2, 3, 4, 7, 11, 16]))
        fixed = self.shape(x)[1 - axis]
        fits = [p for p in self.pool if self.shape(p)[1 - axis] == fixed]
        parts = [fits[int(self.rng.integers(len(fits)))] for _ in range(count - 1)]
        if self.rng.random() < 0.3:  # a Neg of a part: several readers of one tensor
            parts = [self.g.neg(p) if self.rng.random() < 0.3 else p for p in parts]
        self.keep(self.g.concat([x, *parts], axis=axis), f"Concat{count}-axis{axis}")

    def packed_weight(self) -> None:
        # x @ Concat(W1, .., Wn): a derived parameter (packed at load)
        x = self.pick()
        m, k = self.shape(x)
        count = int(self.rng.choice([1, 2, 3, 5, 8]))
        w = self.g.concat([self.param([k, self.dim()]) for _ in range(count)], axis=1)
        self.keep(self.g.matmul(x, w), f"x@Concat{count}(params)")

    def reshape(self) -> None:
        x = self.pick()
        m, k = self.shape(x)
        flat = self.g.reshape(x, [m * k])
        kind = self.rng.choice(["back", "swap", "same"])
        if kind == "same":
            y = self.g.reshape(x, [m, k])  # Reshape(x, shape(x))
        elif kind == "swap":
            y = self.g.reshape(flat, [k, m])
        else:
            y = self.g.reshape(self.g.reshape(flat, [k * m, 1]), [m, k])
        self.keep(y, f"reshape-{kind}")

    def transpose(self) -> None:
        x = self.pick()
        y = self.g.transpose(x)
        twice = self.rng.random() < 0.5
        self.keep(self.g.transpose(y) if twice else y, "Transpose" + ("x2" if twice else ""))

    def broadcast(self) -> None:
        x = self.pick()
        m, k = self.shape(x)
        shape = [[k], [1, k], [m, 1], [1, 1]][int(self.rng.integers(4))]
        d = self.param(shape, 1.0) if self.rng.random() < 0.5 else self.input(shape)
        op = self.g.add if self.rng.random() < 0.5 else self.g.mul
        self.keep(op(x, d) if self.rng.random() < 0.5 else op(d, x), f"broadcast{shape}")

    def embedding(self) -> None:
        # rows of a table at u32 indices (indices below the table's rows)
        vocab, rows = self.dim(), self.dim()
        name = self.name("ids")
        self.r.inputs[name] = self.rng.integers(0, vocab, rows).astype(np.uint32)
        table = self.param([vocab, self.dim()], 1.0)
        self.keep(self.g.embedding(self.g.input(name, [rows], DType.U32), table), "Embedding")

    def reduce(self) -> None:
        x = self.pick()
        self.sinks.append(self.g.sum_all(x) if self.rng.random() < 0.5 else self.g.mean_all(x))
        self.r.patterns.append("SumAll/MeanAll")

    def attention(self) -> None:
        # q, k, v = h Wq^T, h Wk^T, h Wv^T; CausalAttention(RoPE(q), RoPE(k), v)
        hd = int(self.rng.choice([2, 4, 6, 8]))
        nkv = int(self.rng.choice([1, 2]))
        nh = nkv * int(self.rng.choice([1, 2, 3]))
        batch = int(self.rng.choice([1, 2]))
        seq = int(self.rng.choice([1, 3, 5, 9]))
        rows, width = batch * seq, self.dim()
        hs = [p for p in self.pool if self.shape(p)[0] == rows]
        h = hs[int(self.rng.integers(len(hs)))] if hs and self.rng.random() < 0.5 else self.input([rows, width])
        width = self.shape(h)[1]
        q = self.g.matmul_bt(h, self.param([nh * hd, width]))
        k = self.g.matmul_bt(h, self.param([nkv * hd, width]))
        v = self.g.matmul_bt(h, self.param([nkv * hd, width]))
        rope = {"theta": float(self.rng.choice([100.0, 10000.0])), "head_dim": hd,
                "pairing": str(self.rng.choice(["half", "adjacent"])), "batch": batch}
        q, k = self.g.rope(q, **rope), self.g.rope(k, **rope)
        y = self.g.causal_attention(q, k, v, nh, nkv, hd, batch=batch)
        self.keep(y, "CausalAttention(RoPE q, RoPE k)")

    def decode(self) -> None:
        # one decoding step of n rows at position pos over a KV cache (state tensors)
        hd = int(self.rng.choice([2, 4, 8]))
        nkv = int(self.rng.choice([1, 2]))
        nh = nkv * int(self.rng.choice([1, 2]))
        n, max_seq = int(self.rng.choice([1, 2, 3])), int(self.rng.choice([5, 9]))
        name = self.name("pos")
        self.r.inputs[name] = np.array([self.rng.integers(0, max_seq - n + 1)], dtype=np.uint32)
        pos = self.g.input(name, [1], DType.U32)
        x = self.input([n, self.dim()])
        width = self.shape(x)[1]
        q = self.g.matmul_bt(x, self.param([nh * hd, width]))
        k = self.g.matmul_bt(x, self.param([nkv * hd, width]))
        v = self.g.matmul_bt(x, self.param([nkv * hd, width]))
        caches = []
        for _ in range(2):
            cname = self.name("cache")
            self.r.params[cname] = self.rng.standard_normal((max_seq, nkv * hd)).astype(np.float32)
            caches.append(self.g.state(cname, [max_seq, nkv * hd]))
        rope = {"theta": 10000.0, "head_dim": hd, "pairing": str(self.rng.choice(["half", "adjacent"]))}
        kc = self.g.add_node("CacheWrite", (caches[0], self.g.add_node("RoPEDynamic", (k, pos), **rope), pos))
        vc = self.g.add_node("CacheWrite", (caches[1], v, pos))
        q = self.g.add_node("RoPEDynamic", (q, pos), **rope)
        y = self.g.add_node("CachedAttention", (q, kc, vc, pos), num_heads=nh, num_kv_heads=nkv, head_dim=hd)
        self.sinks.append(y)  # an output, but no operand: the caches' old contents stay out of the pool
        self.r.patterns.append("decode step")

    def group_norm(self) -> None:
        groups = int(self.rng.choice([1, 2, 3]))
        c = groups * int(self.rng.choice([1, 2, 3]))
        x = self.input([int(self.rng.choice([1, 2])), c, self.dim()])
        y = self.g.group_norm(x, self.param([c], 1.0), self.param([c], 1.0), groups)
        self.sinks.append(self.g.silu(y) if self.rng.random() < 0.7 else y)
        self.r.patterns.append("GroupNorm+Silu")


_PATTERNS: tuple[tuple[Callable[[_Builder], None], float], ...] = (
    (_Builder.linear, 5), (_Builder.unary, 2), (_Builder.silu_pattern, 1), (_Builder.swiglu, 1.5),
    (_Builder.rms_norm_matmul, 1.5), (_Builder.norm_or_softmax, 1), (_Builder.concat, 1),
    (_Builder.packed_weight, 0.7), (_Builder.reshape, 0.7), (_Builder.transpose, 0.7),
    (_Builder.broadcast, 1), (_Builder.attention, 0.5), (_Builder.decode, 0.3), (_Builder.group_norm, 0.3),
    (_Builder.embedding, 0.3), (_Builder.reduce, 0.3),
)


def random_graph(seed: int) -> RandomGraph:
    """The random graph of ``seed`` (the same graph for the same seed), with its feeds."""
    rng = np.random.default_rng(seed)
    b = _Builder(rng)
    for _ in range(int(rng.integers(1, 3))):
        b.pool.append(b.input([b.dim(), b.dim()]))
    fns, weights = zip(*_PATTERNS, strict=True)
    p = np.array(weights) / sum(weights)
    for _ in range(int(rng.integers(2, 13))):
        fns[int(rng.choice(len(fns), p=p))](b)
    if rng.random() < 0.5:  # leaves no output reads
        b.param([b.dim(), b.dim()])
        b.input([b.dim()])
    outs = [*b.sinks, *b.made[-1:]]
    if b.made:
        outs += [b.made[int(i)] for i in rng.integers(len(b.made), size=int(rng.integers(0, 4)))]
    if rng.random() < 0.1:  # a leaf as an output
        leaves = [n.id for n in b.g.nodes if n.op in ("Input", "Parameter") and n.type.dtype is DType.F32
                  and not n.attrs.get("state")]
        outs.append(leaves[int(rng.integers(len(leaves)))])
    b.g.set_outputs(outs)
    return b.r
