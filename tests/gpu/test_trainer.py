"""The Trainer on the GPU: fused and unfused steps agree, steps match the numpy reference of
the step graph, the loss is read back only when asked, parameters round-trip through
safetensors; the Session options it relies on (``run(read=...)``, ``read_output``,
repacking derived parameters on ``write_parameter``); a tiny LLaMA-style model learns."""

from __future__ import annotations

import numpy as np
import pytest

from eggfuse.ir import OPS, DType, Graph, InputError, ModelError, evaluate
from eggfuse.ir.optim import SGD, STEP_INPUT, Adam
from eggfuse.models.llama import LlamaConfig, build_llama_graph
from eggfuse.models.mlp import build_mlp_graph, init_mlp_params, one_hot
from eggfuse.pipeline import lower_for
from eggfuse.runtime import Session
from eggfuse.trainer import Trainer

SIZES = (12, 16, 5)
BATCH = 8


def _mlp_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.random((BATCH, SIZES[0]), dtype=np.float32), "labels": one_hot(rng.integers(0, 5, BATCH), 5)}


def _mlp_trainer(optimizer, fuse=True, device=None) -> Trainer:
    g, loss = build_mlp_graph(BATCH, SIZES)
    return Trainer(g, loss, init_mlp_params(SIZES, seed=3), optimizer, fuse=fuse, device=device)


def tiny_llama() -> tuple[Graph, int, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """2 layers, hidden 64, 4 query / 2 KV heads, vocab 64, 16 tokens: graph, loss node, params and
    one fixed batch (a random sequence; labels are the next tokens, one-hot)."""
    seq, vocab = 16, 64
    cfg = LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                      vocab_size=vocab, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False, max_seq=seq)
    g = build_llama_graph(cfg, seq)
    loss = g.add_node("CrossEntropyLoss", (g.outputs[0], g.input("labels", [seq, vocab])))
    rng = np.random.default_rng(0)
    params = {}
    for name, ty in g.parameters.items():
        if name.endswith("norm.weight"):
            params[name] = np.ones(ty.shape, np.float32)
        else:
            scale = 1.0 if name == "token_embd.weight" else 1.0 / np.sqrt(ty.shape[-1])
            params[name] = (scale * rng.standard_normal(ty.shape)).astype(np.float32)
    tokens = rng.integers(0, vocab, seq + 1)
    feeds = {"tokens": tokens[:seq].astype(np.uint32), "labels": one_hot(tokens[1:], vocab)}
    return g, loss, params, feeds


def _assert_same_parameters(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=atol, err_msg=name)


@pytest.mark.parametrize("optimizer", [SGD(0.1, momentum=0.9, weight_decay=0.01), Adam(0.01, weight_decay=0.01)],
                         ids=["sgd-momentum", "adamw"])
def test_fused_and_unfused_mlp_steps_give_the_same_parameters(optimizer, device):
    fused, unfused = _mlp_trainer(optimizer, device=device), _mlp_trainer(optimizer, fuse=False, device=device)
    assert fused.report.dispatches_after < fused.report.dispatches_before
    assert fused.dispatches < unfused.dispatches
    feeds = _mlp_feeds()
    assert fused.step(feeds, read_loss=True) == pytest.approx(unfused.step(feeds, read_loss=True), rel=1e-5)
    start = init_mlp_params(SIZES, seed=3)
    after = fused.parameters()
    _assert_same_parameters(after, unfused.parameters())
    assert all(np.abs(after[n] - start[n]).max() > 1e-4 for n in start)  # every parameter moved


def test_fused_and_unfused_tiny_llama_steps_give_the_same_parameters(device):
    g, loss, params, feeds = tiny_llama()
    fused = Trainer(g, loss, params, Adam(1e-3), device=device)
    unfused = Trainer(g, loss, params, Adam(1e-3), fuse=False, device=device)
    fused.step(feeds)
    unfused.step(feeds)
    _assert_same_parameters(fused.parameters(), unfused.parameters())


def test_steps_match_the_reference_of_the_step_graph(device):
    # Three Adam steps on the device against ir.evaluate of the step graph, state carried over.
    trainer = _mlp_trainer(Adam(0.05, betas=(0.8, 0.9)), device=device)
    sg = trainer.step_graph
    state_updates = {}  # state name -> the node computing its new value
    for n in sg.nodes:
        w = OPS[n.op].writes
        if w is not None and sg.node(n.inputs[w]).attrs.get("state"):
            state_updates[sg.node(n.inputs[w]).attrs["name"]] = n.id
    values = {k: v.astype(np.float64) for k, v in init_mlp_params(SIZES, seed=3).items()}
    values |= {name: np.zeros(shape) for name, shape in sg.state_shapes.items()}
    for t in range(1, 4):
        feeds = _mlp_feeds(t)
        loss = trainer.step(feeds, read_loss=True)
        names = [*sg.updates, *state_updates]
        nodes = [sg.outputs[sg.updates[n]] for n in sg.updates] + list(state_updates.values())
        want = evaluate(sg, {**feeds, STEP_INPUT: [t]}, values, outputs=[sg.outputs[0], *nodes])
        assert loss == pytest.approx(float(want[0][0]), rel=1e-5)
        values = dict(zip(names, want[1:], strict=True))
    got = trainer.parameters()
    for name in sg.updates:
        np.testing.assert_allclose(got[name], values[name], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(trainer.session.read_parameter("w1.adam"), values["w1.adam"], rtol=1e-4, atol=1e-7)


def test_loss_is_read_back_only_when_asked(device):
    trainer = _mlp_trainer(SGD(0.1), device=device)
    feeds = _mlp_feeds()
    with pytest.raises(InputError, match="no step"):
        trainer.loss()
    assert trainer.step(feeds) is None and trainer.step(feeds) is None
    assert trainer.session._staging == {}  # no read-back buffer was ever made
    last = trainer.loss()
    assert trainer.steps == 2 and trainer.session._staging == {}
    again = _mlp_trainer(SGD(0.1), device=device)
    again.step(feeds)
    assert again.step(feeds, read_loss=True) == pytest.approx(last, rel=1e-6)
    assert list(again.session._staging) == [again.session.plan.outputs[0]]  # the loss's buffer only
    with pytest.raises(InputError, match="fed by the Trainer"):
        _mlp_trainer(Adam(0.1), device=device).step({**feeds, STEP_INPUT: [1]})
    missing = dict(feeds)
    name = sorted(missing)[0]
    del missing[name]  # the message listed the step count among the inputs to give
    with pytest.raises(InputError, match=rf"Trainer.step: missing input\(s\) '{name}'; give .* \(the Trainer feeds "
                                         rf"'{STEP_INPUT}' itself\)") as info:
        _mlp_trainer(Adam(0.1), device=device).step(missing)
    assert str(info.value).count(STEP_INPUT) == 1
    ids = np.random.default_rng(0).integers(0, 5, BATCH)  # class ids where one-hot rows belong: the fix named
    with pytest.raises(InputError, match=r"input 'labels': expected f32\[8,5\] rows, got int64\[8\], class ids it "
                                         r"seems: give one-hot rows, eggfuse\.models\.mlp\.one_hot\(labels, 5\)"):
        _mlp_trainer(SGD(0.1), device=device).step({**feeds, "labels": ids})


def test_save_and_load_round_trip(tmp_path, device):
    trainer = _mlp_trainer(Adam(0.01), device=device)
    feeds = _mlp_feeds()
    for _ in range(3):
        trainer.step(feeds)
    path = tmp_path / "mlp.safetensors"
    trainer.save(path)
    saved = trainer.parameters()
    fresh = _mlp_trainer(Adam(0.01), device=device)
    fresh.load(path)
    _assert_same_parameters(fresh.parameters(), saved, atol=0)
    from safetensors.numpy import load_file, save_file

    assert load_file(str(path)).keys() == saved.keys()
    with pytest.raises(ModelError, match="nope.safetensors"):
        fresh.load(tmp_path / "nope.safetensors")
    bad = dict(saved, w1=np.zeros((3, 3), np.float32))
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ModelError, match=r"bad.safetensors: parameter 'w1': expected shape \[12, 16\]"):
        fresh.load(tmp_path / "bad.safetensors")
    save_file({"w1": saved["w1"], "extra": saved["b1"]}, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ModelError, match="missing: 'b1'.*not in the graph: 'extra'"):
        fresh.load(tmp_path / "partial.safetensors")
    _assert_same_parameters(fresh.parameters(), saved, atol=0)  # failed loads wrote nothing
    with pytest.raises(ModelError, match="cannot write"):
        trainer.save(tmp_path / "no" / "dir" / "x.safetensors")
    # a diverged run's weights: load() refuses them, so save() writes nothing (it wrote a file load refused)
    diverged = _mlp_trainer(SGD(1e30), device=device)
    for _ in range(3):
        diverged.step(feeds)
    with pytest.raises(ModelError, match=r"not saving to .*hold NaN or infinity after 3 steps \(training diverged"):
        diverged.save(tmp_path / "nan.safetensors")
    assert not (tmp_path / "nan.safetensors").exists()


def test_trainer_refuses_missing_or_unknown_parameters(device):
    g, loss = build_mlp_graph(BATCH, SIZES)
    params = init_mlp_params(SIZES)
    del params["b2"]
    with pytest.raises(InputError, match=r"not given: 'b2' \(f32\[5\]\)"):
        Trainer(g, loss, params, SGD(0.1), fuse=False, device=device)
    with pytest.raises(InputError, match="unknown: 'zz'"):
        Trainer(g, loss, {**init_mlp_params(SIZES), "zz": np.ones(1)}, SGD(0.1), fuse=False, device=device)


def test_trainer_refuses_arguments_of_the_wrong_kind_by_name(device):
    # Python's AttributeError ('str' object has no attribute 'uses_step'), numpy's "truth value of an array is
    # ambiguous", and frozen="w1" read letter by letter ("frozen names ['1', 'w'] are not parameters")
    g, loss = build_mlp_graph(BATCH, SIZES)
    params = init_mlp_params(SIZES)
    for args, message in (((g, loss, params, "adam"), r"optimizer must be eggfuse\.SGD\(lr, \.\.\.\) or "
                                                      r"eggfuse\.Adam\(lr, \.\.\.\), got str"),
                          ((g, loss, params, None), "optimizer must be .* got NoneType"),
                          ((None, 0, {}, SGD(0.1)), "Trainer takes an eggfuse Graph first, got NoneType"),
                          ((g, loss, list(params.values()), SGD(0.1)), "params must map each parameter's name")):
        with pytest.raises(InputError, match=message):
            Trainer(*args, fuse=False, device=device)
    with pytest.raises(InputError, match=r"frozen is a list of parameter names, got the str 'w1'; write "
                                         r"frozen=\['w1'\]"):
        Trainer(g, loss, params, SGD(0.1), frozen="w1", fuse=False, device=device)
    with pytest.raises(InputError, match=r"Adam betas must be a pair \(beta1, beta2\), got 0\.9"):
        Adam(1e-3, betas=0.9)


def test_frozen_and_unreached_parameters_stay_as_given(tmp_path, device):
    g = Graph()
    x = g.input("x", [4, 3])
    w, scale = g.parameter("w", [3, 2]), g.parameter("scale", [1])
    g.parameter("unused", [5])  # the loss does not reach it: zero gradient, no device buffer
    y = g.mul(g.matmul(x, w), scale)
    loss = g.mean_all(g.mul(y, y))
    params = {"w": np.ones((3, 2)), "scale": np.array([2.0]), "unused": np.arange(5.0)}
    trainer = Trainer(g, loss, params, SGD(0.1, momentum=0.5), frozen=["scale"], device=device)
    assert list(trainer.step_graph.updates) == ["w"] and trainer.step_graph.frozen == ("scale", "unused")
    trainer.step({"x": np.ones((4, 3))})
    got = trainer.parameters()
    np.testing.assert_array_equal(got["scale"], [2.0])
    np.testing.assert_array_equal(got["unused"], np.arange(5.0))
    assert np.all(got["w"] < 1.0)
    trainer.save(tmp_path / "p.safetensors")
    trainer.load(tmp_path / "p.safetensors")
    np.testing.assert_array_equal(trainer.parameters()["unused"], np.arange(5.0))


def test_tiny_llama_loss_halves_in_100_adam_steps(device):
    g, loss, params, feeds = tiny_llama()
    trainer = Trainer(g, loss, params, Adam(1e-3), device=device)
    first = trainer.step(feeds, read_loss=True)
    for _ in range(98):
        trainer.step(feeds)
    last = trainer.step(feeds, read_loss=True)
    assert trainer.steps == 100
    assert np.log(64) - 0.5 < first < np.log(64) + 0.5  # about uniform over the vocabulary at the start
    assert last < first / 2, (first, last)


# --- Session options the Trainer relies on ----------------------------------------------------


def test_session_reads_back_only_the_outputs_asked_for(device):
    g = Graph()
    x = g.input("x", [3])
    g.set_outputs([g.relu(x), g.neg(x), g.tanh(x)])
    s = Session(lower_for(g, device), {}, device=device)
    xs = np.array([-1.0, 0.5, 2.0], np.float32)
    neg, relu = s.run({"x": xs}, read=(1, 0))
    np.testing.assert_array_equal(neg, -xs)
    np.testing.assert_array_equal(relu, np.maximum(xs, 0))
    assert s.run({"x": xs}, read=()) == []
    np.testing.assert_allclose(s.read_output(2), np.tanh(xs), rtol=1e-6)
    with pytest.raises(InputError, match="out of range"):
        s.run({"x": xs}, read=(3,))
    with pytest.raises(InputError, match="out of range"):
        s.read_output(-1)


def test_writing_a_packed_parameter_repacks_it(device):
    g = Graph()
    a, b = g.parameter("a", [2, 3]), g.parameter("b", [1, 3])
    g.set_outputs([g.matmul_bt(g.input("x", [1, 3]), g.concat([a, b], axis=0))])
    s = Session(lower_for(g, device), {"a": np.ones((2, 3)), "b": np.ones((1, 3))}, device=device)
    assert s.plan.derived and s.plan.buffers[s.plan.parameters["a"]].kind == "host"
    s.write_parameter("b", np.full((1, 3), 2.0))
    s.write_parameter("a", np.zeros((2, 3)))
    (y,) = s.run({"x": np.ones((1, 3))})
    np.testing.assert_array_equal(y, [[0.0, 0.0, 6.0]])
    np.testing.assert_array_equal(s.read_parameter("a"), np.zeros((2, 3)))


def test_adam_step_input_is_u32(device):
    trainer = _mlp_trainer(Adam(0.01), device=device)
    assert trainer.step_graph.inputs[STEP_INPUT].dtype is DType.U32


def test_adams_first_steps_are_lr_long_to_float32s_precision(device):
    # 1 - pow(beta2, t) and 1 - beta2 in float32 (beta2 = 0.999 is 0.99900001287 there) made the first step
    # 1.0000596 lr long; the corrections now come from float64 on the host and a series on the device
    g = Graph()
    x, w = g.input("x", [6]), g.parameter("w", [6])
    loss = g.sum_all(g.mul(w, x))
    g.set_outputs([loss])
    xs = np.array([1.0, -2.0, 1e-3, 3.0, -0.5, 100.0], np.float32)
    for betas in ((0.9, 0.999), (0.0, 0.99)):
        trainer = Trainer(g, loss, {"w": np.zeros(6, np.float32)}, Adam(1.0, betas=betas, eps=1e-8), fuse=False,
                          device=device)
        for t in (1, 2):
            trainer.step({"x": xs})
            # the gradient is x every step: m_hat = x, v_hat = x^2 exactly, so each step moves w by -sign(x)
            want = -t * xs.astype(np.float64) / (np.abs(xs) + 1e-8)
            np.testing.assert_allclose(trainer.parameters()["w"], want, rtol=2e-6, err_msg=f"betas {betas}, step {t}")
