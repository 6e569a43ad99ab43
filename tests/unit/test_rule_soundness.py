"""Every shipped rewrite rule is sound: it fires on random shapes and every e-class of the
saturated e-graph evaluates to one value (numpy reference)."""

import pytest

from eggfuse.ir import DType
from eggfuse.rewrites.catalog import catalog
from eggfuse.rewrites.soundness import assert_rule_sound

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Neg": "neg", "Gelu": "gelu", "Silu": "silu"}


def _mm(g, dim, variant):
    m, k, n = dim("m"), dim("k"), dim("n")
    a = g.input("a", [k, m] if variant == "AT" else [m, k])
    b = g.parameter("b", [n, k] if variant == "BT" else [k, n])
    return g.add_node({"": "MatMul", "AT": "MatMulAT", "BT": "MatMulBT"}[variant], (a, b)), m, n


def _out(g, *ids):
    g.set_outputs(list(ids))


def _llama_attention(g, dim, *, rope=True):
    hd = 2 * dim("half_head", 1, 3)
    nkv = dim("kv", 1, 2)
    nh = nkv * dim("group", 1, 2)
    seq, width = dim("seq", 1, 5), dim("width", 2, 6)
    h = g.input("h", [seq, width])
    q = g.matmul_bt(h, g.parameter("wq", [nh * hd, width]))
    k = g.matmul_bt(h, g.parameter("wk", [nkv * hd, width]))
    v = g.matmul_bt(h, g.parameter("wv", [nkv * hd, width]))
    if rope:
        q, k = g.rope(q, 100.0, hd), g.rope(k, 100.0, hd)
        return g.causal_attention(q, k, v, nh, nkv, hd)
    return g.causal_attention_rope(q, k, v, nh, nkv, hd, 100.0)


def _decode_step(g, dim, *, attention):
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
        return k_cache
    v_cache = g.add_node("CacheWrite", (g.state("v_cache", [rows, nkv * hd]), g.input("v", [n, nkv * hd]), pos))
    return g.add_node("CachedAttention", (rope(g.input("q", [n, nh * hd])), k_cache, v_cache, pos),
                      num_heads=nh, num_kv_heads=nkv, head_dim=hd)


def _swiglu_mm(g, dim, bt):
    m, k, n = dim("m"), dim("k"), dim("n")
    h = g.input("h", [m, k])
    shape = [n, k] if bt else [k, n]
    mm = g.matmul_bt if bt else g.matmul
    _out(g, g.swiglu(mm(h, g.parameter("wg", shape)), mm(h, g.parameter("wu", shape))))


def _x_y(g, dim):
    return g.input("x", [dim("m"), dim("n")]), g.input("y", [dim("m"), dim("n")])


BUILDERS = {
    "Neg(Neg(x)) -> x": lambda g, dim: _out(g, g.neg(g.neg(_x_y(g, dim)[0]))),
    "Transpose(Transpose(x)) -> x": lambda g, dim: _out(g, g.transpose(g.transpose(_x_y(g, dim)[0]))),
    "Relu(Relu(x)) -> Relu(x)": lambda g, dim: _out(g, g.relu(g.relu(_x_y(g, dim)[0]))),
    "Reshape(Reshape(x, s2), s) -> Reshape(x, s)":
        lambda g, dim: _out(g, g.reshape(g.reshape(_x_y(g, dim)[0], [dim("m") * dim("n")]),
                                         [dim("n"), dim("m")])),
    "Reshape(x, shape(x)) -> x": lambda g, dim: _out(g, g.reshape(x := _x_y(g, dim)[0], g.node(x).type.shape)),
    "Mul(x, Sigmoid(x)) -> Silu(x)": lambda g, dim: _out(g, g.mul(x := _x_y(g, dim)[0], g.sigmoid(x))),
    "Mul(Sigmoid(x), x) -> Silu(x)": lambda g, dim: _out(g, g.mul(g.sigmoid(x := _x_y(g, dim)[0]), x)),
    "Mul(Silu(g), u) -> SwiGLU(g, u)": lambda g, dim: _out(g, g.mul(g.silu((xy := _x_y(g, dim))[0]), xy[1])),
    "Mul(u, Silu(g)) -> SwiGLU(g, u)": lambda g, dim: _out(g, g.mul((xy := _x_y(g, dim))[1], g.silu(xy[0]))),
    "SwiGLU(MatMul(h,Wg), MatMul(h,Wu)) -> SwiGLUConcat(MatMul(h, Concat(Wg,Wu)))":
        lambda g, dim: _swiglu_mm(g, dim, False),
    "SwiGLU(MatMulBT(h,Wg), MatMulBT(h,Wu)) -> SwiGLUConcat(MatMulBT(h, Concat(Wg,Wu)))":
        lambda g, dim: _swiglu_mm(g, dim, True),
    "BiasAdd(FusedMatMul(a,b,e), d) -> FusedMatMul(a,b,e+[bias d])":
        lambda g, dim: _out(g, g.bias_add((mm := _mm(g, dim, "BT"))[0], g.parameter("d", [mm[2]]))),
    "Add(FusedMatMul(a,b,e), d) -> FusedMatMul(a,b,e+[add d])":
        lambda g, dim: _out(g, g.add((mm := _mm(g, dim, "AT"))[0], g.input("d", [mm[1], mm[2]]))),
    "Add(d, FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[add d])":
        lambda g, dim: _out(g, g.add(g.input("d", [dim("m"), dim("n")]), _mm(g, dim, "")[0])),
    "Add(FusedMatMul(a,b,e), d[1,N]) -> FusedMatMul(a,b,e+[bias d])":
        lambda g, dim: _out(g, g.add((mm := _mm(g, dim, ""))[0], g.parameter("d", [1, mm[2]]))),
    "Add(d[1,N], FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[bias d])":
        lambda g, dim: _out(g, g.add(g.parameter("d", [1, dim("n")]), _mm(g, dim, "BT")[0])),
    "FusedMatMul(RmsNorm(x,w), W, e) -> FusedRmsNormMatMul(x, w, W, e)":
        lambda g, dim: _out(g, g.matmul(g.rms_norm(g.input("x", [dim("m"), dim("k")]), g.parameter("w", [dim("k")])),
                                        g.parameter("W", [dim("k"), dim("n")]))),
    "FusedMatMulBT(RmsNorm(x,w), W, e) -> FusedRmsNormMatMulBT(x, w, W, e)":
        lambda g, dim: _out(g, g.relu(g.matmul_bt(g.rms_norm(g.input("x", [dim("m"), dim("k")]),
                                                             g.parameter("w", [dim("k")])),
                                                  g.parameter("W", [dim("n"), dim("k")])))),
    "Silu(GroupNorm(x,w,b)) -> GroupNormSilu(x,w,b)":
        lambda g, dim: _out(g, g.silu(g.group_norm(g.input("x", [dim("n"), dim("g") * dim("cpg"), dim("s")]),
                                                   g.parameter("w", [dim("g") * dim("cpg")]),
                                                   g.parameter("b", [dim("g") * dim("cpg")]), num_groups=dim("g")))),
    "CausalAttention(RoPE(q), RoPE(k), v) -> CausalAttentionRoPE(q, k, v)":
        lambda g, dim: _out(g, _llama_attention(g, dim)),
    "CausalAttentionRoPE(h@Wq^T, h@Wk^T, h@Wv^T) -> CausalAttentionRoPE(h@Concat(Wq,Wk,Wv)^T)":
        lambda g, dim: _out(g, _llama_attention(g, dim, rope=False)),
    "CacheWrite(c, RoPEDynamic(k, p), p) -> CacheWriteRoPE(c, k, p)":
        lambda g, dim: _out(g, _decode_step(g, dim, attention=False)),
    "CachedAttention(RoPEDynamic(q, p), kc, vc, p) -> CachedAttentionRoPE(q, kc, vc, p)":
        lambda g, dim: _out(g, _decode_step(g, dim, attention=True)),
}
for _v, _label in (("", "MatMul(a,b) -> FusedMatMul(a,b,[])"), ("AT", "MatMulAT(a,b) -> FusedMatMulAT(a,b,[])"),
                   ("BT", "MatMulBT(a,b) -> FusedMatMulBT(a,b,[])")):
    BUILDERS[_label] = (lambda v: lambda g, dim: _out(g, _mm(g, dim, v)[0]))(_v)
for _op, _method in {**UNARY, "GeluTanh": "gelu"}.items():
    BUILDERS[f"{_op}(FusedMatMul(a,b,e)) -> FusedMatMul(a,b,e+[{_op}])"] = (
        lambda op, m: lambda g, dim: _out(g, g.gelu(_mm(g, dim, "")[0], "tanh") if op == "GeluTanh"
                                          else getattr(g, m)(_mm(g, dim, "BT")[0])))(_op, _method)

OPTIMIZATION_RULES = [name for rs, names in catalog().items() if rs != "shape_analysis" for name in names]


def test_every_shipped_rule_has_a_soundness_example():
    assert sorted(OPTIMIZATION_RULES) == sorted(BUILDERS)


@pytest.mark.parametrize("rule", sorted(BUILDERS))
def test_rule_is_sound(rule):
    assert_rule_sound(rule, BUILDERS[rule], max_examples=6)


def test_soundness_check_catches_an_unsound_rule():
    from egglog import ruleset

    from eggfuse.ir import Graph, RewriteError
    from eggfuse.rewrites.dsl import equal
    from eggfuse.rewrites.sorts import T
    from eggfuse.rewrites.soundness import check_sound

    bad = ruleset(name="unsound_for_test")

    @bad.register
    def _bad(x: T):
        yield equal("Relu(x) -> Neg(x) (wrong)", T.relu(x), T.neg(x))

    g = Graph()
    g.set_outputs([g.relu(g.input("x", [3, 4]))])
    with pytest.raises(RewriteError, match="unsound e-class"):
        check_sound(g, rulesets=[bad])


def test_embedding_indices_stay_valid_in_soundness_feeds():
    from eggfuse.ir import Graph
    from eggfuse.rewrites.soundness import check_sound

    g = Graph()
    idx = g.input("i", [5], DType.U32)
    g.set_outputs([g.neg(g.neg(g.embedding(idx, g.parameter("t", [3, 4]))))])
    assert check_sound(g).eclasses_checked >= 3
