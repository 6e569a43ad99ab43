"""egglog sorts for tensor graphs: one constructor per IR op.

``T`` is a tensor term; each classmethod is the e-node of one op from
:data:`eggfuse.ir.OPS` (the table :data:`CONSTRUCTORS` ties them together). Ops with
attributes take a leading ``attrs`` string: a canonical key into the attribute table of
the encoding, so rules can bind and pass it on without decoding it. ``Epi`` is a matmul
epilogue chain (innermost step first), ``TList`` the list of graph outputs (one root, so
shared nodes are extracted once), ``Args`` the inputs of a variadic e-node (a cons list of
tensors, built with :func:`args`).

The analysis functions ``shape`` (a ``Vec[i64]``) and ``numel`` (its product) hold facts
about e-classes; rules read them in their queries, the cost model reads ``numel``.
``rope_fits_attention(rope_attrs, attention_attrs)`` holds when a RoPE's positions match an
attention's sequences, or a RoPEDynamic's head size a CachedAttention's (set at encoding,
where the attributes are known). Ops that no rule
matches use the generic ``op1``..``op6`` constructors, and ``opn`` over an ``Args`` list
for more inputs: adding such an op needs no egglog change, whatever its arity.
"""

from __future__ import annotations

from egglog import Expr, String, StringLike, Unit, Vec, function, i64, i64Like


class T(Expr):
    # leaves: a unique name and the shape
    @classmethod
    def input(cls, name: StringLike, shape: Vec[i64]) -> T: ...
    @classmethod
    def parameter(cls, name: StringLike, shape: Vec[i64]) -> T: ...
    @classmethod
    def constant(cls, name: StringLike, shape: Vec[i64]) -> T: ...

    # matmul family
    @classmethod
    def matmul(cls, a: T, b: T) -> T: ...
    @classmethod
    def matmul_at(cls, a: T, b: T) -> T: ...
    @classmethod
    def matmul_bt(cls, a: T, b: T) -> T: ...
    @classmethod
    def fused_matmul(cls, variant: StringLike, a: T, b: T, epi: Epi) -> T: ...

    # elementwise
    @classmethod
    def add(cls, a: T, b: T) -> T: ...
    @classmethod
    def mul(cls, a: T, b: T) -> T: ...
    @classmethod
    def bias_add(cls, x: T, bias: T) -> T: ...
    @classmethod
    def relu(cls, x: T) -> T: ...
    @classmethod
    def sigmoid(cls, x: T) -> T: ...
    @classmethod
    def tanh(cls, x: T) -> T: ...
    @classmethod
    def neg(cls, x: T) -> T: ...
    @classmethod
    def gelu(cls, x: T) -> T: ...
    @classmethod
    def gelu_tanh(cls, x: T) -> T: ...
    @classmethod
    def silu(cls, x: T) -> T: ...
    @classmethod
    def swiglu(cls, gate: T, up: T) -> T: ...

    # normalisation, softmax
    @classmethod
    def softmax(cls, x: T) -> T: ...
    @classmethod
    def rms_norm(cls, attrs: StringLike, x: T, w: T) -> T: ...
    @classmethod
    def layer_norm(cls, attrs: StringLike, x: T, w: T, b: T) -> T: ...

    # transformer
    @classmethod
    def embedding(cls, indices: T, table: T) -> T: ...
    @classmethod
    def rope(cls, attrs: StringLike, x: T) -> T: ...
    @classmethod
    def full_attention(cls, attrs: StringLike, q: T, k: T, v: T) -> T: ...
    @classmethod
    def full_attention_masked(cls, attrs: StringLike, q: T, k: T, v: T, key_mask: T) -> T: ...
    @classmethod
    def causal_attention(cls, attrs: StringLike, q: T, k: T, v: T) -> T: ...

    # fused and packed forms the rules create
    @classmethod
    def fused_rms_norm_matmul(cls, attrs: StringLike, variant: StringLike, x: T, w_norm: T, w: T, epi: Epi) -> T: ...
    @classmethod
    def concat(cls, axis: i64Like, xs: Args) -> T: ...  # of parameters only: a derived parameter
    @classmethod
    def slice_cols(cls, x: T, start: i64Like, size: i64Like) -> T: ...
    @classmethod
    def swiglu_concat(cls, x: T) -> T: ...
    @classmethod
    def causal_attention_rope(cls, attrs: StringLike, rope_attrs: StringLike, q: T, k: T, v: T) -> T: ...
    @classmethod
    def causal_attention_rope_packed(cls, attrs: StringLike, rope_attrs: StringLike, qkv: T) -> T: ...
    @classmethod
    def cached_attention_rope(cls, attrs: StringLike, rope_attrs: StringLike, q: T, k_cache: T, v_cache: T,
                              pos: T) -> T: ...
    @classmethod
    def group_norm(cls, attrs: StringLike, x: T, w: T, b: T) -> T: ...
    @classmethod
    def group_norm_silu(cls, attrs: StringLike, x: T, w: T, b: T) -> T: ...

    # any other op, by arity: no rule matches these, they only carry the graph through
    @classmethod
    def op1(cls, op: StringLike, attrs: StringLike, a: T) -> T: ...
    @classmethod
    def op2(cls, op: StringLike, attrs: StringLike, a: T, b: T) -> T: ...
    @classmethod
    def op3(cls, op: StringLike, attrs: StringLike, a: T, b: T, c: T) -> T: ...
    @classmethod
    def op4(cls, op: StringLike, attrs: StringLike, a: T, b: T, c: T, d: T) -> T: ...
    @classmethod
    def op5(cls, op: StringLike, attrs: StringLike, a: T, b: T, c: T, d: T, e: T) -> T: ...
    @classmethod
    def op6(cls, op: StringLike, attrs: StringLike, a: T, b: T, c: T, d: T, e: T, f: T) -> T: ...
    @classmethod
    def opn(cls, op: StringLike, attrs: StringLike, xs: Args) -> T: ...  # any other arity

    # shape ops, reductions
    @classmethod
    def transpose(cls, x: T) -> T: ...
    @classmethod
    def reshape(cls, x: T, shape: Vec[i64]) -> T: ...
    @classmethod
    def sum_all(cls, x: T) -> T: ...
    @classmethod
    def mean_all(cls, x: T) -> T: ...


class Epi(Expr):
    """A matmul epilogue: steps applied in order to each output element at the store."""

    @classmethod
    def none(cls) -> Epi: ...
    @classmethod
    def bias(cls, e: Epi, bias: T) -> Epi: ...
    @classmethod
    def add(cls, e: Epi, addend: T) -> Epi: ...
    @classmethod
    def act(cls, e: Epi, op: StringLike) -> Epi: ...


class Args(Expr):
    """The inputs of a variadic e-node, in order (``T.concat``, ``T.opn``)."""

    @classmethod
    def nil(cls) -> Args: ...
    @classmethod
    def cons(cls, head: T, tail: Args) -> Args: ...


def args(*xs: T) -> Args:
    """The ``Args`` list of ``xs``, in order."""
    out = Args.nil()
    for x in reversed(xs):
        out = Args.cons(x, out)
    return out


class TList(Expr):
    @classmethod
    def nil(cls) -> TList: ...
    @classmethod
    def cons(cls, head: T, tail: TList) -> TList: ...


@function
def shape(t: T) -> Vec[i64]: ...


@function
def numel(t: T) -> i64: ...


@function
def epilogue_without_add(e: Epi) -> Unit: ...


@function
def last_step(e: Epi) -> String: ...


@function
def rope_fits_attention(rope_attrs: StringLike, attention_attrs: StringLike) -> Unit: ...


#: IR op name -> (constructor, takes an attrs key). Leaves, Identity, FullAttention with a
#: mask, the fused matmuls, Concat of parameters, SliceCols, CausalAttentionRoPE and
#: CachedAttentionRoPE are encoded specially (see encode.py); ops missing here use a
#: generic constructor by arity.
CONSTRUCTORS = {
    "MatMul": (T.matmul, False),
    "MatMulAT": (T.matmul_at, False),
    "MatMulBT": (T.matmul_bt, False),
    "Add": (T.add, False),
    "Mul": (T.mul, False),
    "BiasAdd": (T.bias_add, False),
    "Relu": (T.relu, False),
    "Sigmoid": (T.sigmoid, False),
    "Tanh": (T.tanh, False),
    "Neg": (T.neg, False),
    "Gelu": (T.gelu, False),
    "GeluTanh": (T.gelu_tanh, False),
    "Silu": (T.silu, False),
    "SwiGLU": (T.swiglu, False),
    "Softmax": (T.softmax, False),
    "RmsNorm": (T.rms_norm, True),
    "LayerNorm": (T.layer_norm, True),
    "Embedding": (T.embedding, False),
    "RoPE": (T.rope, True),
    "FullAttention": (T.full_attention, True),
    "CausalAttention": (T.causal_attention, True),
    "Transpose": (T.transpose, False),
    "SumAll": (T.sum_all, False),
    "MeanAll": (T.mean_all, False),
    "SwiGLUConcat": (T.swiglu_concat, False),
    "GroupNorm": (T.group_norm, True),
    "GroupNormSilu": (T.group_norm_silu, True),
}

#: Generic constructors by arity, for ops without a constructor of their own; other
#: arities take :data:`VARIADIC_CONSTRUCTOR` over an ``Args`` list.
GENERIC_CONSTRUCTORS = {1: T.op1, 2: T.op2, 3: T.op3, 4: T.op4, 5: T.op5, 6: T.op6}
VARIADIC_CONSTRUCTOR = T.opn

#: The unary elementwise ops a matmul epilogue can apply, by IR op name.
UNARY_CONSTRUCTORS = {op: CONSTRUCTORS[op][0] for op in
                      ("Relu", "Sigmoid", "Tanh", "Neg", "Gelu", "GeluTanh", "Silu")}
