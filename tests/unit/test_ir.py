"""IR: builder shape checks, error messages, and reference semantics on known values."""

import math
import pickle
import re

import numpy as np
import pytest

from eggfuse.ir import DType, EggfuseError, Graph, GraphError, InputError, evaluate


def test_matmul_shape_mismatch_names_op_and_shapes():
    g = Graph()
    a = g.input("a", [3, 5])
    b = g.parameter("b", [4, 2])
    with pytest.raises(GraphError) as e:
        g.matmul(a, b)
    msg = str(e.value)
    assert "MatMul" in msg and "f32[3,5]" in msg and "f32[4,2]" in msg


@pytest.mark.parametrize(
    "build",
    [
        lambda g, x: g.bias_add(x, g.parameter("b", [3])),
        lambda g, x: g.add(x, g.parameter("y", [4, 3])),
        lambda g, x: g.rms_norm(x, g.parameter("w", [5])),
        lambda g, x: g.layer_norm(x, g.parameter("w", [5]), g.parameter("b", [4])),
        lambda g, x: g.rope(x, 10000.0, head_dim=3),
        lambda g, x: g.reshape(x, [3, 3]),
        lambda g, x: g.full_attention(x, x, x, num_heads=2, num_kv_heads=1, head_dim=2),
        lambda g, x: g.swiglu(x, g.parameter("u", [4, 5])),
        lambda g, x: g.embedding(x, g.parameter("t", [10, 4])),
        lambda g, x: g.transpose(g.sum_all(x)),
        lambda g, x: g.gelu(x, approximate="fast"),
    ],
)
def test_builders_reject_bad_shapes(build):
    g = Graph()
    x = g.input("x", [5, 4])
    with pytest.raises(GraphError):
        build(g, x)


@pytest.mark.parametrize(
    ("build", "op", "attr"),
    [
        (lambda g, x: g.rms_norm(x, g.parameter("w", [8]), eps="x"), "RmsNorm", "eps"),
        (lambda g, x: g.rms_norm(x, g.parameter("w", [8]), eps="1e-5"), "RmsNorm", "eps"),
        (lambda g, x: g.layer_norm(x, g.parameter("w", [8]), g.parameter("b", [8]), eps=None), "LayerNorm", "eps"),
        (lambda g, x: g.rope(x, "big", 4), "RoPE", "theta"),
        (lambda g, x: g.rope(x, 100.0, 2.5), "RoPE", "head_dim"),
        (lambda g, x: g.full_attention(x, x, x, 2, 2, 4, batch=None), "FullAttention", "batch"),
        (lambda g, x: g.causal_attention(x, x, x, "2", 2, 4), "CausalAttention", "num_heads"),
        (lambda g, x: g.concat([x, x], axis="0"), "Concat", "axis"),
        (lambda g, x: g.slice_cols(x, "a", 2), "SliceCols", "start"),
        (lambda g, x: g.group_norm(g.input("y", [1, 4, 3]), g.parameter("gw", [4]), g.parameter("gb", [4]), []),
         "GroupNorm", "num_groups"),
        (lambda g, x: g.causal_attention_rope(x, x, x, 2, 2, 4, 100.0, pos_offset="a"), "CausalAttentionRoPE",
         "pos_offset"),
        (lambda g, x: g.add_node("FusedMatMul", (x, g.parameter("m", [8, 8]), g.parameter("b", [8])), variant="",
                                 epilogue="bias"), "FusedMatMul", "epilogue"),
    ],
)
def test_builders_reject_bad_attributes_naming_op_and_attribute(build, op, attr):
    # each value is refused by the attribute's kind (Attr.normalise), never by a bare float() / int()
    g = Graph()
    x = g.input("x", [4, 8])
    with pytest.raises(GraphError, match=f"{op}: attribute {attr} must be"):
        build(g, x)


def test_an_epilogue_given_as_one_string_says_how_to_write_it():
    g = Graph()
    x = g.input("x", [4, 8])
    with pytest.raises(GraphError, match=r"one string; the steps are a sequence of step names, e.g. \('bias',\)"):
        g.add_node("FusedMatMul", (x, g.parameter("m", [8, 8]), g.parameter("b", [8])), variant="", epilogue="bias")


def test_bad_leaves_and_ids():
    g = Graph()
    with pytest.raises(GraphError):
        g.input("x", [0, 3])
    x = g.input("x", [2, 3])
    with pytest.raises(GraphError, match="already used"):
        g.parameter("x", [3])
    with pytest.raises(GraphError, match="not a node"):
        g.relu(7)
    with pytest.raises(GraphError, match="unknown op"):
        g.add_node("Frobnicate", (x,))
    with pytest.raises(GraphError, match=r"unknown op 'relu' \(did you mean 'Relu'.*\), or call the builder method "
                                         r"g\.relu\(\.\.\.\); .* keys of eggfuse\.ir\.OPS$"):
        g.add_node("relu", (x,))
    with pytest.raises(GraphError):
        g.set_outputs([])
    with pytest.raises(GraphError, match="outputs must be node ids"):
        g.set_outputs(["x"])
    with pytest.raises(GraphError, match="inputs must be node ids"):
        g.concat(5)
    g.input("y", [2, 3])  # node 1: a float 1.0 was rounded down to it, g.mul(x, 1.0) computing x * y
    for bad, hint in ((1.0, r"got 1.0 \(float\); for the number 1.0 add a constant, g.constant\(1.0\)"),
                      (np.float32(1), r"got np.float32\(1.0\) \(float32\); for the number"),
                      (True, r"got True \(bool\)")):
        with pytest.raises(GraphError, match=rf"Mul: inputs must be node ids .*{hint}"):
            g.mul(x, bad)
    assert g.node(g.mul(x, np.int64(1))).inputs == (0, 1)  # numpy's integers are node ids
    with pytest.raises(GraphError, match="outputs must be node ids"):
        g.set_outputs(5)


@pytest.mark.parametrize("dim", [2.5, 2.0, True, np.float32(2.0), np.float64(3.0), np.bool_(True), "3"])
def test_a_dimension_that_is_not_an_integer_is_refused_naming_the_leaf(dim):
    # int() would truncate it into a tensor of another shape: [2.5, 3] -> f32[2,3], [True, 3] -> f32[1,3]
    builds = ((lambda g: g.input("f", [dim, 3]), "Input 'f'", 0),
              (lambda g: g.parameter("w", [3, dim]), "Parameter 'w'", 1),
              (lambda g: g.state("kv", [dim]), "Parameter 'kv'", 0),
              (lambda g: g.constant(np.zeros(6), [dim, 3]), "Constant", 0),
              (lambda g: g.reshape(g.input("x", [2, 3]), [3, dim]), "Reshape", 1))
    for build, label, k in builds:
        g = Graph()
        with pytest.raises(GraphError, match=rf"^{label}: dimension {k} of shape \[.*\] is {re.escape(repr(dim))} "
                                             rf"\({type(dim).__name__}\), not an integer; give every dimension "
                                             r"as an int$"):
            build(g)
        assert len(g) == (label == "Reshape")  # no node made (reshape's input only)


def test_numpy_integer_dimensions_are_taken():
    g = Graph()
    x = g.input("x", [np.int64(2), np.int32(3)])
    w = g.parameter("w", np.array([3, 4]))
    r = g.reshape(g.matmul(x, w), (np.uint8(4), np.array(2)))  # a 0-d integer array is an index too
    assert [g.node(n).type.shape for n in (x, w, r)] == [(2, 3), (3, 4), (4, 2)]
    assert all(type(d) is int for n in (x, w, r) for d in g.node(n).type.shape)


def test_a_reshape_error_names_reshape_not_its_identity_node():
    g = Graph()
    x = g.input("x", [4, 6])
    with pytest.raises(GraphError, match=r"^Reshape \(new node 1\): cannot reshape f32\[4,6\] to \[5, 5\]: element "
                                         r"counts differ \[inputs: node 0 f32\[4,6\]\]$"):
        g.reshape(x, [5, 5])
    with pytest.raises(GraphError, match=r"^Reshape: every dimension must be >= 1"):
        g.reshape(x, [0, 24])
    with pytest.raises(GraphError, match=r"^Reshape: input id 9 is not a node of this graph"):
        g.reshape(9, [24])
    assert g.node(g.reshape(x, [24])).op == "Identity"  # the IR keeps its view op


def test_reshape_infers_one_dimension_of_minus_one():
    g = Graph()
    x = g.input("x", [2, 3, 4])
    shapes = {(-1, 4): (6, 4), (2, -1): (2, 12), (-1,): (24,), (np.int64(-1), 3, 2): (4, 3, 2), (1, -1, 1): (1, 24, 1)}
    for given, want in shapes.items():
        assert g.node(g.reshape(x, given)).type.shape == want, given
    with pytest.raises(GraphError, match=r"^Reshape: at most one dimension may be -1 \(inferred from the element "
                                         r"count\), got \[-1, -1\]$"):
        g.reshape(x, [-1, -1])
    with pytest.raises(GraphError, match=r"^Reshape: cannot infer the -1 of \[5, -1\]: node 0 f32\[2,3,4\] has 24 "
                                         r"elements, not a multiple of the other dimensions' product 5$"):
        g.reshape(x, [5, -1])
    for bad in ([-1, 0], [-2, 12], [-1, 2.0]):  # the usual checks name the other dimension
        with pytest.raises(GraphError, match=r"^Reshape: (every dimension must be >= 1|dimension 1 of shape)"):
            g.reshape(x, bad)
    with pytest.raises(GraphError, match=r"^Reshape: input id 9 is not a node of this graph"):
        g.reshape(9, [-1])
    other = Graph()
    with pytest.raises(GraphError, match=r"^Reshape: input 0 is a node of another Graph"):
        g.reshape(other.input("y", [4]), [-1])


def test_a_node_of_another_graph_is_refused():
    # ids are ints, so another graph's node 0 would be this graph's node 0: the builders refuse it
    g1, g2 = Graph(), Graph()
    a, b = g1.input("a", [3, 3]), g2.input("b", [3, 3])
    assert a == b == 0
    with pytest.raises(GraphError, match="Gelu: input 0 is a node of another Graph"):
        g2.gelu(a)
    with pytest.raises(GraphError, match="output 0 is a node of another Graph"):
        g2.set_outputs([a])
    y = g2.gelu(b)
    g2.set_outputs(iter([y]))
    assert g2.outputs == [1] and type(g2.outputs[0]) is int and g2.node(y).inputs == (0,)
    assert type(pickle.loads(pickle.dumps(y))) is int and g2.add(y, 0) == 2  # plain ints are still taken


def test_constant_copies_caller_array():
    g = Graph()
    data = np.arange(6, dtype=np.float32)
    c = g.constant(data, [2, 3])
    data[0] = 100.0
    assert g.node(c).attrs["value"][0, 0] == 0.0


def test_broadcast_add_shapes():
    g = Graph()
    x = g.input("x", [4, 3])
    r = g.input("r", [4, 1])
    c = g.input("c", [3])
    assert g.node(g.add(x, r)).type.shape == (4, 3)
    assert g.node(g.add(c, x)).type.shape == (4, 3)


def test_reference_values():
    g = Graph()
    x = g.input("x", [2, 4])
    w = g.parameter("w", [4])
    outs = [g.softmax(x), g.rms_norm(x, w, eps=0.0), g.gelu(x), g.gelu(x, "tanh"), g.silu(x)]
    g.set_outputs(outs)
    xv = np.array([[1000.0, 999.0, 998.0, 0.0], [1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
    sm, rms, gelu, gelu_t, silu = evaluate(g, {"x": xv}, {"w": np.ones(4)})
    e = np.exp([0.0, -1.0, -2.0])
    np.testing.assert_allclose(sm[0, :3], e / e.sum(), rtol=1e-12)
    assert np.isfinite(sm).all()
    row = xv[1].astype(np.float64)
    np.testing.assert_allclose(rms[1], row / math.sqrt((row**2).mean()), rtol=1e-12)
    # GELU(1) = 0.8413447460685429 (erf form); tanh form 0.8411919906082768
    assert gelu[1, 0] == pytest.approx(0.8413447460685429, abs=1e-12)
    assert gelu_t[1, 0] == pytest.approx(0.8411919906082768, abs=1e-12)
    assert silu[1, 1] == pytest.approx(-2.0 / (1.0 + math.exp(2.0)), abs=1e-12)


def test_attention_gqa_matches_repeated_kv():
    rng = np.random.default_rng(0)
    seq, hd = 5, 4
    g = Graph()
    q = g.input("q", [seq, 4 * hd])
    k = g.input("k", [seq, 2 * hd])
    v = g.input("v", [seq, 2 * hd])
    g.set_outputs([g.causal_attention(q, k, v, 4, 2, hd)])
    qv, kv, vv = (rng.standard_normal((seq, n * hd)).astype(np.float32).astype(np.float64) for n in (4, 2, 2))
    (out,) = evaluate(g, {"q": qv, "k": kv, "v": vv}, {})
    for h in range(4):  # query heads 0,1 read kv head 0; heads 2,3 read kv head 1
        kh = h // 2
        s = qv[:, h * hd:(h + 1) * hd] @ kv[:, kh * hd:(kh + 1) * hd].T / math.sqrt(hd)
        s[np.triu_indices(seq, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(out[:, h * hd:(h + 1) * hd], p @ vv[:, kh * hd:(kh + 1) * hd], rtol=1e-10)


def test_rope_pairings_rotate_the_stated_pairs():
    g = Graph()
    x = g.input("x", [3, 4])
    g.set_outputs([g.rope(x, 100.0, 4, pos_offset=2), g.rope(x, 100.0, 4, pairing="adjacent")])
    xv = np.tile(np.array([1.0, 2.0, 3.0, 4.0]), (3, 1))
    half, adj = evaluate(g, {"x": xv}, {})
    pos = 2 + 1  # row 1 with pos_offset 2
    a = pos * 100.0 ** (-0.5)  # pair j=1 of head_dim 4: theta^(-2/4)
    # half pairing: pair 1 is (1, 3)
    np.testing.assert_allclose(half[1, [1, 3]], [2 * math.cos(a) - 4 * math.sin(a),
                                                 2 * math.sin(a) + 4 * math.cos(a)], rtol=1e-12)
    # adjacent pairing, row 1, pos 1: pair 0 is (0, 1) with angle 1
    np.testing.assert_allclose(adj[1, [0, 1]], [math.cos(1) - 2 * math.sin(1),
                                                math.sin(1) + 2 * math.cos(1)], rtol=1e-12)


def test_evaluate_input_errors_and_no_mutation():
    g = Graph()
    x = g.input("x", [2, 2])
    i = g.input("i", [2], DType.U32)
    t = g.parameter("t", [3, 2])
    g.set_outputs([g.add(x, g.embedding(i, t))])
    xv = np.ones((2, 2))
    before = xv.copy()
    with pytest.raises(InputError, match="'x'"):
        evaluate(g, {"i": [0, 1]}, {"t": np.zeros((3, 2))})
    with pytest.raises(InputError, match=r"\[2, 2\]"):
        evaluate(g, {"x": np.ones((3, 2)), "i": [0, 1]}, {"t": np.zeros((3, 2))})
    with pytest.raises(InputError, match="out of range"):
        evaluate(g, {"x": xv, "i": [0, 5]}, {"t": np.zeros((3, 2))})
    with pytest.raises(InputError, match="indices"):
        evaluate(g, {"x": xv, "i": [0.5, 1.0]}, {"t": np.zeros((3, 2))})
    evaluate(g, {"x": xv, "i": [0, 2]}, {"t": np.zeros((3, 2))})
    np.testing.assert_array_equal(xv, before)


def _embedding_ln(g: Graph, pairs, positions: int = 0, pos_rows: int = 3, fmt: str = "f32"):
    # EmbeddingSumLayerNorm of (indices dtype, table rows) pairs over 6 rows of h, with a positions table
    h = 4 if fmt == "f32" else 32  # f16: rows of whole blocks of 32 halves
    ins = [g.parameter("w", [h]), g.parameter("b", [h])]
    for i, (dtype, rows) in enumerate(pairs):
        table = g.parameter(f"t{i}", [rows, h] if fmt == "f32" else [rows, h // 2],
                            DType.F32 if fmt == "f32" else DType.U32)
        ins += [g.input(f"i{i}", [6], dtype), table]
    if positions:
        ins.append(g.parameter("pos", [pos_rows, h]))
    return g.add_node("EmbeddingSumLayerNorm", ins, eps=1e-5, positions=positions, format=fmt)


def test_embedding_sum_layer_norm_refuses_what_its_kernel_cannot_take():
    u32, i32 = DType.U32, DType.I32
    g = Graph()
    assert g.node(_embedding_ln(g, [(i32, 5), (u32, 2)], positions=3)).type.shape == (6, 4)
    # f16 tables read through i32 ids (an export's, stored f16), positions f32
    g16 = Graph()
    assert g16.node(_embedding_ln(g16, [(i32, 5), (u32, 2)], positions=3, fmt="f16")).type.shape == (6, 32)
    for pairs, kw, message in (
            ([(u32, 5), (u32, 2), (u32, 2)], dict(positions=3), "with positions > 0 one or two pairs"),
            ([(u32, 5), (u32, 2)], dict(positions=4, pos_rows=4), "6 rows are not sequences of 4 positions"),
            ([(u32, 5), (u32, 2)], dict(positions=3, pos_rows=2), r"positions table must be f32 \[3, 4\]")):
        with pytest.raises(GraphError, match=f"EmbeddingSumLayerNorm.*{message}"):
            _embedding_ln(Graph(), pairs, **kw)


def test_leaf_dtypes_as_dtypes_values_or_numpy_dtypes():
    # a string dtype was kept as is and failed in the next builder with an AttributeError
    g = Graph()
    assert [g.node(g.input(n, [2], d)).type.dtype for n, d in (("a", "i32"), ("b", np.float32), ("c", np.bool_),
                                                                 ("d", DType.U32))] == [DType.I32, DType.F32,
                                                                                       DType.BOOL, DType.U32]
    for bad in ("u64", np.float64, "x"):
        with pytest.raises(GraphError, match=r"Input 'e': dtype .* is not one eggfuse computes in: give a DType"):
            g.input("e", [2], bad)
    with pytest.raises(GraphError, match=r"Parameter 'p': dtype 'f16' is not one"):
        g.parameter("p", [2], "f16")


@pytest.mark.parametrize("op, inputs, attr", [
    ("RmsNorm", ("x", "w"), "eps"), ("LayerNorm", ("x", "w", "w"), "eps"),
    ("BatchNormalization", ("x4", "w", "w", "w", "var"), "epsilon")])
def test_a_negative_norm_epsilon_is_refused(op, inputs, attr):
    # a negative epsilon ran and gave NaN rows (sqrt of a negative variance + eps); NaN was refused already
    g = Graph()
    leaves = {"x": g.input("x", [3, 8]), "x4": g.input("x4", [2, 8, 3, 3]), "w": g.parameter("w", [8]),
              "var": g.parameter("var", [8])}
    with pytest.raises(GraphError, match=f"{op}: attribute {attr} must be at least 0, got -0.001"):
        g.add_node(op, [leaves[n] for n in inputs], **{attr: -1e-3})
    g.add_node(op, [leaves[n] for n in inputs], **{attr: 0.0})  # 0 is the formula's own edge: allowed


def test_an_onnx_layer_normalization_with_a_negative_epsilon_is_refused_naming_the_node(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from eggfuse.onnx import load

    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=-1.0, name="ln0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.ones(8, np.float32), "s"), numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(EggfuseError, match="LayerNormalization node 'ln0': LayerNorm: attribute eps must be at least "):
        load(path)



def test_a_constants_dtype_is_taken_as_input_takes_it_and_a_scalar_softmax_is_refused():
    # g.constant(..., dtype="f32") kept the str as its dtype and the next builder failed with an AttributeError;
    # Softmax of a scalar built, then lowering failed with an IndexError
    g = Graph()
    x = g.input("x", [3], dtype="f32")
    for dtype, want in (("f32", DType.F32), (np.int32, DType.I32), ("u32", DType.U32)):
        assert g.node(g.constant(np.ones(3, np.int64 if want is not DType.F32 else np.float32),
                                 dtype=dtype)).type.dtype is want
    g.set_outputs([g.add(x, g.constant(np.ones(3), dtype="f32"))])
    np.testing.assert_array_equal(evaluate(g, {"x": np.zeros(3, np.float32)}, {})[0], np.ones(3))
    with pytest.raises(GraphError, match="dtype 'float' is not one eggfuse computes in"):
        g.constant(1.0, dtype="float")
    for op in ("Softmax", "LogSoftmax"):
        with pytest.raises(GraphError, match=rf"{op} \(new node \d+\): input must have rank >= 1"):
            g.add_node(op, [g.constant(1.0, shape=())])


def test_a_constant_float32_cannot_hold_is_refused_and_infinities_given_as_such_are_kept():
    g = Graph()
    for value, says in ((1e300, "1e+300 at [0] is beyond float32's range"),
                        ([1.0, -1e39], "-1e+39 at [1] is beyond float32's range"),
                        (2**25 + 1, "no exact float32")):
        with pytest.raises(GraphError, match=re.escape(says)):
            g.constant(value)
    assert len(g) == 0  # nothing added by the refused ones
    kept = g.node(g.constant([float("-inf"), 3e38, 2**24])).attrs["value"]
    np.testing.assert_array_equal(kept, np.array([-np.inf, 3e38, 2**24], np.float32))
    big = np.array([7e38], np.float64)
    with pytest.raises(GraphError):
        g.constant(big)
    assert big[0] == 7e38  # the caller's array untouched


@pytest.mark.parametrize("nid", [99, -1, 1.0, True, "0"])
def test_node_and_set_outputs_refuse_what_is_not_a_node_id(nid):
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [2]))])
    with pytest.raises(GraphError, match=f"node id {re.escape(repr(nid))} is not a node of this graph"):
        g.node(nid)
    int_id = isinstance(nid, int) and not isinstance(nid, bool)
    with pytest.raises(GraphError, match=f"output id {nid} is not a node" if int_id else r"must be node ids \(ints"):
        g.set_outputs([nid])
    assert g.outputs == [1]  # unchanged


@pytest.mark.parametrize("given, says", [
    ("model.onnx", "eggfuse.onnx.load"), ("minilm", "eggfuse.api.model_graph('minilm'"),
    (("graph", "params"), "a Graph"), (None, "eggfuse.Graph()")])
def test_functions_that_take_a_graph_say_what_they_got_and_how_to_get_one(given, says):
    from eggfuse.lowering import lower

    g = Graph()
    g.set_outputs([g.relu(g.input("x", [2]))])
    if given == ("graph", "params"):
        given = (g, {})
        says = "unpack it"
    for call in (lambda: evaluate(given, {}, {}), lambda: lower(given)):
        with pytest.raises(InputError, match=re.escape(says)):
            call()


def test_a_negative_axis_is_answered_with_the_axis_to_write_and_a_3d_matmul_with_its_forms():
    g = Graph()
    x = g.input("x", [2, 8, 32])
    for build in (lambda: g.add_node("ReduceMean", [x], axes=[-1], keepdims=True), lambda: g.concat([x, x], axis=-1),
                  lambda: g.add_node("CumSum", [x], axis=-1)):
        with pytest.raises(GraphError, match=re.escape("this op counts axes from 0 (0..2 here): write axis + rank "
                                                       "for a negative one (-1 is 2)")):
            build()
    # no hint where the axis is not negative
    with pytest.raises(GraphError, match=r"axes \[5\] out of range for f32\[2,8,32\] \[inputs"):
        g.add_node("ReduceMean", [x], axes=[5], keepdims=True)
    with pytest.raises(GraphError, match=re.escape("reshape a batch of rows to [B*S, K] first, or use BatchMatMul")):
        g.matmul(x, g.parameter("w", [32, 4]))


def test_evaluate_takes_no_params_for_a_graph_without_parameters():
    g = Graph()
    g.set_outputs([g.relu(g.input("x", [3]))])
    (y,) = evaluate(g, {"x": np.array([-1.0, 0.5, 2.0])})
    np.testing.assert_array_equal(y, [0.0, 0.5, 2.0])
    h = Graph()
    h.set_outputs([h.add(h.input("x", [3]), h.parameter("w", [3]))])
    with pytest.raises(InputError, match=r"Parameter 'w' \(f32\[3\]\) was not given"):
        evaluate(h, {"x": np.zeros(3)})


def test_a_copy_of_a_graph_changes_apart_from_it():
    g = Graph()
    x = g.input("x", [2, 3])
    c = g.constant(np.arange(6.0).reshape(2, 3))
    y = g.add(x, c)
    g.set_outputs([y])
    h = g.copy()
    assert type(h) is Graph and len(h) == len(g) and h.outputs == g.outputs
    assert h.nodes[c].attrs["value"] is g.nodes[c].attrs["value"]  # the constant is shared, not copied
    z = h.neg(y)  # the original's ids work in the copy, whose nodes are the same
    h.set_outputs([z])
    assert len(g) == 3 and g.outputs == [y] and h.outputs == [z]
    w = g.relu(y)
    assert len(h) == 4 and h.nodes[w].op == "Neg" and g.nodes[w].op == "Relu"
    feeds = {"x": np.ones((2, 3), np.float32)}
    np.testing.assert_array_equal(evaluate(h, feeds, {})[0], -(1.0 + np.arange(6.0).reshape(2, 3)))
    assert "x" in h.inputs and g.inputs == h.inputs
