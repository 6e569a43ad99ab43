"""ONNX LSTM, GRU and RNN through eggfuse.onnx.Model on the GPU, against onnxruntime (layout 1,
which onnxruntime does not run, against onnx's reference evaluator): every direction, biases,
initial states, peepholes, sequence lengths fed at run time, clip, input_forget,
linear_before_reset, activations with their alphas and betas; a chain where one layer's final
state starts another; silero VAD's four LSTM nodes with their real weights; the refusals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import F, model, node  # tests/onnx_models.py

from eggfuse.ir import OnnxError
from eggfuse.onnx import Model

I32 = TensorProto.INT32
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _oracle(m, feeds, reference: bool):
    if reference:
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(m).run(None, feeds)
    m.ir_version = 10
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m, feeds, reference: bool = False, rtol=2e-4, atol=2e-5):
    got = Model(m).run(feeds)
    want = _oracle(m, feeds, reference)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _layer(cell: str, seq: int, batch: int, inp: int, hidden: int, *, direction="forward", bias=True, h0=False,
           peepholes=False, lens=None, layout=0, outputs=("Y", "Y_h", "Y_c"), seed=0, **attrs):
    """A one-node model of ``cell`` and its feeds: X, initial states and lengths fed, weights as initializers."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[cell] * hidden

    def rand(*shape, scale=0.5):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    x_shape = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    state = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    inits = [("W", rand(dirs, gh, inp)), ("R", rand(dirs, gh, hidden))]
    inputs, feeds = [("X", F, x_shape)], {"X": rand(*x_shape, scale=1.0)}
    names = ["X", "W", "R", "B" if bias else ""]
    if bias:
        inits.append(("B", rand(dirs, 2 * gh)))
    names.append("lens" if lens is not None else "")
    if lens is not None:
        inputs.append(("lens", I32, [batch]))
        feeds["lens"] = np.array(lens, dtype=np.int32)
    for name, wanted in (("h0", h0), ("c0", h0 and cell == "LSTM")):
        if name == "h0" or cell == "LSTM":
            names.append(name if wanted else "")
        if wanted:
            inputs.append((name, F, state))
            feeds[name] = rand(*state, scale=1.0)
    if cell == "LSTM":
        names.append("P" if peepholes else "")
        if peepholes:
            inits.append(("P", rand(dirs, 3 * hidden)))
    while not names[-1]:
        names.pop()
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[:3 if cell == "LSTM" else 2]]
    while not outs[-1]:
        outs.pop()
    n = node(cell, names, outs, name="rnn", hidden_size=hidden, direction=direction, layout=layout, **attrs)
    return model([n], inputs, [(o, F, None) for o in outs if o], inits, opset=22), feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_every_cell_and_direction_with_initial_states_and_fed_lengths(cell, direction):
    m, feeds = _layer(cell, 5, 3, 4, 6, direction=direction, h0=True, peepholes=True, lens=[5, 2, 4],
                      seed=len(direction))
    _check(m, feeds)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_defaults_without_bias_or_states_and_only_y_h(cell):
    m, feeds = _layer(cell, 3, 2, 5, 7, bias=False, outputs=("Y_h",))
    _check(m, feeds)


def test_lstm_clip_input_forget_and_custom_activations():
    m, feeds = _layer("LSTM", 4, 2, 3, 5, direction="bidirectional", h0=True, peepholes=True, clip=0.6, input_forget=1,
                      activations=["HardSigmoid", "LeakyRelu", "Softsign", "sigmoid", "Elu", "ScaledTanh"],
                      activation_alpha=[0.25, 0.1, 0.9, 0.7], activation_beta=[0.45, 1.1])
    _check(m, feeds)


def test_gru_linear_before_reset_and_rnn_activations():
    m, feeds = _layer("GRU", 4, 3, 3, 6, linear_before_reset=1, h0=True, clip=2.0, lens=[4, 1, 3],
                      activations=["Sigmoid", "Softplus"])
    _check(m, feeds)
    m, feeds = _layer("RNN", 4, 2, 3, 6, direction="bidirectional", activations=["Relu", "Affine"],
                      activation_alpha=[0.5], activation_beta=[0.2])
    _check(m, feeds)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_batch_major_layout_against_the_onnx_reference(cell):
    m, feeds = _layer(cell, 4, 3, 2, 5, direction="bidirectional", h0=True, layout=1)
    _check(m, feeds, reference=True)


def test_a_chain_one_layers_final_state_starts_the_next():
    rng = np.random.default_rng(3)
    seq, batch, inp, h = 4, 2, 3, 5
    w = {k: (0.5 * rng.standard_normal(s)).astype(np.float32) for k, s in
         (("W1", (1, 4 * h, inp)), ("R1", (1, 4 * h, h)), ("W2", (1, 3 * h, inp)), ("R2", (1, 3 * h, h)))}
    nodes = [node("LSTM", ["X", "W1", "R1"], ["", "h1", "c1"], hidden_size=h),
             node("GRU", ["X", "W2", "R2", "", "", "h1"], ["Y", "h2"], hidden_size=h, direction="reverse")]
    m = model(nodes, [("X", F, [seq, batch, inp])], [("Y", F, None), ("h2", F, None), ("c1", F, None)],
              list(w.items()), opset=22)
    _check(m, {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32)})


def _silero_lstms() -> list[tuple[onnx.NodeProto, dict[str, np.ndarray]]]:
    """silero VAD's LSTM nodes (inside its If branches) with the values of their constant inputs."""
    from onnx.reference import ReferenceEvaluator

    spec = importlib.util.find_spec("livekit.plugins.silero")
    path = Path(spec.origin).parent / "resources" / "silero_vad.onnx"
    proto = onnx.load(path)
    opset = proto.opset_import[0].version
    found = []

    def walk(graph, known):
        known = dict(known) | {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for n in graph.node:
            if n.op_type == "LSTM":
                found.append((n, {i: known[i] for i in n.input if i in known}))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, known)
            ins = [i for i in n.input if i]
            if n.op_type in ("If", "LSTM") or not all(i in known for i in ins) or (not ins and n.op_type != "Constant"):
                continue
            vis = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(known[i].dtype), known[i].shape)
                   for i in ins]
            g = helper.make_graph([n], "fold", vis, [helper.make_value_info(o, onnx.TypeProto()) for o in n.output])
            res = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])).run(
                None, {i: known[i] for i in ins})
            known.update(zip(n.output, res, strict=True))

    walk(proto.graph, {})
    return found


def test_silero_vad_lstm_nodes_convert_and_match_onnxruntime():
    lstms = _silero_lstms()
    assert len(lstms) == 4
    rng = np.random.default_rng(4)
    for n, known in lstms:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs == {"hidden_size": 128}
        x_name, h_name, c_name = n.input[0], n.input[5], n.input[6]
        assert x_name not in known and h_name not in known and c_name not in known and n.input[4] == ""
        for seq, batch in ((1, 1), (3, 2)):
            inputs = [("X", F, [seq, batch, 128]), ("h", F, [1, batch, 128]), ("c", F, [1, batch, 128])]
            inits = [(f"w{k}", known[n.input[k]]) for k in (1, 2, 3)]
            lstm = node("LSTM", ["X", "w1", "w2", "w3", "", "h", "c"], ["Y", "Y_h", "Y_c"], hidden_size=128)
            m = model([lstm], inputs, [("Y", F, None), ("Y_h", F, None), ("Y_c", F, None)], inits, opset=16)
            feeds = {"X": rng.standard_normal((seq, batch, 128)).astype(np.float32),
                     "h": (0.5 * rng.standard_normal((1, batch, 128))).astype(np.float32),
                     "c": (0.5 * rng.standard_normal((1, batch, 128))).astype(np.float32)}
            _check(m, feeds, rtol=1e-4, atol=1e-5)


def test_refusals_name_the_node():
    m, _ = _layer("RNN", 2, 1, 2, 3, activations=["Swish"])
    with pytest.raises(OnnxError, match=r"RNN node 'rnn': activation 'Swish' is not one of Relu, Tanh"):
        Model(m).specialise()
    m, _ = _layer("RNN", 2, 1, 2, 3, activations=["ThresholdedRelu"])
    with pytest.raises(OnnxError, match=r"activation ThresholdedRelu needs its alpha in activation_alpha"):
        Model(m).specialise()
    m, _ = _layer("GRU", 2, 1, 2, 3, activations=["Sigmoid", "Tanh", "Tanh"])
    with pytest.raises(OnnxError, match=r"GRU takes 2 per direction"):
        Model(m).specialise()
    m, _ = _layer("LSTM", 2, 1, 2, 3)
    next(a for a in m.graph.node[0].attribute if a.name == "hidden_size").i = 4
    with pytest.raises(OnnxError, match=r"LSTM node 'rnn': attribute hidden_size=4 but R \[1, 12, 3\] has 3"):
        Model(m).specialise()
    m, _ = _layer("LSTM", 2, 1, 2, 3, direction="bidirectional")
    next(a for a in m.graph.node[0].attribute if a.name == "direction").s = b"forward"
    with pytest.raises(OnnxError, match=r"do not fit LSTM"):
        Model(m).specialise()
