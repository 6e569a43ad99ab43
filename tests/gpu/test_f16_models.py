"""f16 weights on the GPU (lavapipe too): ``compile(..., precision="f16")`` on
small graphs against the numpy reference of the f32 graph on weights rounded to float16, and the
accuracy guards on the real models against fp32 (MiniLM's fp32 plan, SmolLM2's fp32 reference):

- all-MiniLM-L6-v2 in f16: embeddings of varied sentences within cosine 0.9999 of the fp32 plan's;
- SmolLM2-135M in f16 (``precision="f16"`` and ``weights="f16"``): the same greedy tokens as the
  fp32 reference (transformers in float32, ``tests/smollm2_reference.py``; eggfuse's fp32 plan gives
  the same tokens). CI runs 8 tokens on 3 prompts (the full model on lavapipe takes about a second
  a token on this 2-core machine); ``bench/quant_accuracy.py --weights f16`` runs 24 tokens on 5
  prompts against the fp32 plan (bench/results/f16_accuracy_lavapipe.json);
- SmolLM2's weights_bytes in f16 about half of f32's.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from smollm2_reference import reference_for

import eggfuse
from eggfuse import cli
from eggfuse.generate import Generator
from eggfuse.ir import Graph, InputError, evaluate
from eggfuse.models.llama import LlamaConfig, build_llama_graph
from eggfuse.rewrites import random_feeds

gen_mod = importlib.import_module("eggfuse.generate")

TINY = LlamaConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96,
                   vocab_size=40, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True, max_seq=32)
SENTENCES = [
    "A man is eating food.",
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "Hi",
    "¿Dónde está la biblioteca? 图书馆在哪里？",
    "def add(a, b): return a + b  # 42, 3.14159, -7e-3",
]
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")
CI_TOKENS = 8  # 24 in bench/quant_accuracy.py --weights f16 (see the module docstring)


def test_tiny_llama_in_f16_is_the_f32_graph_on_rounded_weights(device):
    graph = build_llama_graph(TINY, 6)
    params = random_feeds(graph, 5)[1]
    tokens = np.array([3, 1, 4, 1, 5, 9], dtype=np.uint32)
    rounded = {n: a.astype(np.float16).astype(np.float32) if a.ndim == 2 else a for n, a in params.items()}
    want = evaluate(graph, {"tokens": tokens}, rounded)[0]
    compiled = eggfuse.compile(graph, params, device=device, precision="f16", cache=False)
    (got,) = compiled.run({"tokens": tokens})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert compiled.f16_weights == sorted(n for n, a in params.items() if a.ndim == 2)
    assert all(p.kind == "host" for p in compiled.plan.buffers if p.name in compiled.f16_weights)


def test_the_f16_plan_goes_through_the_compile_cache(device, tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "cache"))
    graph = build_llama_graph(TINY, 4)
    params = random_feeds(graph, 6)[1]
    tokens = {"tokens": np.array([1, 2, 3, 4], dtype=np.uint32)}
    first = eggfuse.compile(graph, params, device=device, precision="f16")
    again = eggfuse.compile(graph, params, device=device, precision="f16")
    plain = eggfuse.compile(graph, params, device=device)  # another key: the rulesets differ
    assert (first.cache, again.cache, plain.cache) == ("miss", "hit", "miss")
    assert again.plan.derived == first.plan.derived and again.f16_weights == first.f16_weights
    np.testing.assert_array_equal(again.run(tokens)[0], first.run(tokens)[0])
    assert not plain.f16_weights


def test_writing_a_parameter_stored_f16_repacks_it(device):
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [2, 32]), g.parameter("W", [4, 32]))])
    rng = np.random.default_rng(8)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((2, 32), (4, 32), (4, 32)))
    compiled = eggfuse.compile(g, {"W": w1}, device=device, precision="f16", cache=False)
    assert compiled.f16_weights == ["W"]
    compiled.session.write_parameter("W", w2)
    (got,) = compiled.run({"x": x})
    np.testing.assert_allclose(got, x @ w2.astype(np.float16).astype(np.float32).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(compiled.session.read_parameter("W"), w2)  # the host copy, unrounded


def test_a_refused_write_of_a_packed_f16_parameter_leaves_the_session_as_it_was(device):
    # q/k/v packed into one f16 buffer: a wk beyond float16's range was refused, but read_parameter gave it
    # back afterwards and every later write of wq/wv was refused for wk's sake
    g = Graph()
    x = g.input("x", [4, 32])
    q, k, v = (g.matmul_bt(x, g.parameter(n, [32, 32])) for n in ("wq", "wk", "wv"))
    g.set_outputs([g.full_attention(q, k, v, 2, 2, 16)])
    rng = np.random.default_rng(9)
    w = {n: 0.2 * rng.standard_normal((32, 32)).astype(np.float32) for n in ("wq", "wk", "wv")}
    compiled = eggfuse.compile(g, w, device=device, precision="f16", cache=False)
    assert any(set(d.sources) == set(w) and d.store == "f16" for d in compiled.plan.derived.values())
    bad = w["wk"].copy()
    bad[0, 0] = 1e6
    with pytest.raises(InputError, match=r"parameter 'wk' \[32, 32\] holds 1e\+06, beyond float16's largest"):
        compiled.session.write_parameter("wk", bad)
    np.testing.assert_array_equal(compiled.session.read_parameter("wk"), w["wk"])
    new_q = 0.2 * rng.standard_normal((32, 32)).astype(np.float32)
    compiled.session.write_parameter("wq", new_q)
    np.testing.assert_array_equal(compiled.session.read_parameter("wq"), new_q)
    xv = rng.standard_normal((4, 32)).astype(np.float32)
    rounded = {n: a.astype(np.float16).astype(np.float32) for n, a in {**w, "wq": new_q}.items()}
    (want,) = eggfuse.evaluate(g, {"x": xv}, rounded)  # the numpy reference, on the written weights
    np.testing.assert_allclose(compiled.run({"x": xv})[0], want, rtol=1e-4, atol=1e-5)


def test_precision_errors(device):
    g = Graph()
    g.set_outputs([g.matmul_bt(g.input("x", [2, 32]), g.parameter("W", [4, 32]))])
    w = {"W": np.ones((4, 32), np.float32)}
    with pytest.raises(InputError, match="precision must be one of f32, f16, got 'f8'"):
        eggfuse.compile(g, w, device=device, precision="f8")
    with pytest.raises(InputError, match="precision='f16' is chosen by the rewrite engine .* needs fuse=True"):
        eggfuse.compile(g, w, device=device, precision="f16", fuse=False)
    with pytest.raises(InputError, match=r"parameter 'W' \[4, 32\] holds 1e\+06, beyond float16's largest value "
                                         r"65504: compile it with precision='f32'"):
        eggfuse.compile(g, {"W": np.full((4, 32), 1e6, np.float32)}, device=device, precision="f16", cache=False)
    with pytest.raises(InputError, match="precision must be one of"):
        eggfuse.generate("hi", precision="half")


def test_run_cli_precision_f16_on_an_onnx_gemm(tmp_path, capsys):
    # Gemm with transB: its initializer W [N, K] is the B of a MatMulBT, stored f16; y against numpy on W
    # rounded to float16 (the bias stays f32)
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w, b, x = (rng.standard_normal(s).astype(np.float32) for s in ((8, 64), (8,), (3, 64)))
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "gemm.onnx")
    np.save(tmp_path / "x.npy", x)
    args = ["run", str(tmp_path / "gemm.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--precision", "f16",
            "--repeats", "0", "--no-cache", "--save", str(tmp_path / "y.npz")]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "f16" and out["f16_weights"] == ["W"]
    want = x.astype(np.float64) @ w.astype(np.float16).astype(np.float64).T + b
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], want, rtol=1e-5, atol=1e-5)
    assert cli.main(args) == 0
    assert "precision: f16 (1 parameters stored as float16)" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["llama_tiny.dynamo.onnx", "bert_tiny.classic.onnx"])
def test_an_exported_model_in_f16_is_its_graph_on_rounded_weights(name, device):
    # exporters store a linear layer's weight [K, N] (MatMul): in f16 each is stored as the rows of its transpose
    # (ToF16 transposed), packed Q/K/V and gate/up included, and its Gathers' tables as halves read through the i32
    # ids; the expected output is the numpy reference of the imported (unoptimised) graph on those weights rounded
    # to float16
    from pathlib import Path

    from eggfuse.onnx import Model, load

    path = Path(__file__).resolve().parent.parent / "data" / "exported" / name
    data = np.load(path.with_name(name.split(".")[0] + ".npz"))
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input.")}
    graph, params = load(path, shapes={k: v.shape for k, v in inputs.items()})
    # the weights of MatMul [K, N] and of MatMulBT [N, K] (a Gemm's transB: BERT's pooler), K a multiple of 32, and
    # the tables [V, H] a Gather reads, H a multiple of 32
    kn = {graph.node(n.inputs[1]).attrs["name"] for n in graph.live_nodes()
          if n.op in ("MatMul", "MatMulBT") and graph.node(n.inputs[1]).op == "Parameter"
          and graph.node(n.inputs[1]).type.shape[0 if n.op == "MatMul" else 1] % 32 == 0}
    kn |= {graph.node(n.inputs[0]).attrs["name"] for n in graph.live_nodes()
           if n.op == "Gather" and n.attrs["axis"] == 0 and graph.node(n.inputs[0]).op == "Parameter"
           and graph.node(n.inputs[0]).type.shape[1] % 32 == 0}
    rounded = {n: a.astype(np.float16).astype(np.float32) if n in kn else a for n, a in params.items()}
    want = evaluate(graph, {k: v.astype(np.int32) for k, v in inputs.items()}, rounded)
    model = Model(path, device=device, cache=False, precision="f16")
    got = model.run(inputs)
    (spec,) = model.plans.values()
    assert kn and spec.compiled.f16_weights == sorted(kn)
    for g_, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-4 * np.abs(w_).max())
    f32 = Model(path, device=device, cache=False)
    f32.run(inputs)
    (f32_spec,) = f32.plans.values()
    w16, w32 = (s.compiled.plan.memory()["weights_bytes"] for s in (spec, f32_spec))
    assert w16 < 0.75 * w32, (w16, w32)


# --- MiniLM -------------------------------------------------------------------------------------


def test_minilm_f16_embeddings_within_cosine_of_the_fp32_plan():
    f32, f16 = eggfuse.embed(SENTENCES), eggfuse.embed(SENTENCES, precision="f16")
    a, b = f32.embeddings.astype(np.float64), f16.embeddings.astype(np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"MiniLM f16 vs f32 cosine per sentence: {np.round(cos, 7).tolist()}")
    assert cos.min() >= 0.9999
    assert f16.precision == "f16" and f16.dispatches_fused == f32.dispatches_fused
    w16, w32 = f16.memory["embed"]["weights_bytes"], f32.memory["embed"]["weights_bytes"]
    print(f"MiniLM weights_bytes: f16 {w16}, f32 {w32} ({w16 / w32:.3f})")
    assert 0.5 < w16 / w32 < 0.52  # the norms' weights and the biases stay f32
    # the linear layers (6 a layer) and the three embedding tables
    assert len(f16.f16_weights) == 6 * 6 + 3 and not f32.f16_weights


def test_embed_cli_precision(capsys):
    assert cli.main(["embed", "Hi", "Hello there", "--precision", "f16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "f16" and len(out["f16_weights"]) == 39
    assert cli.main(["embed", "Hi", "Hello there", "--precision", "f16"]) == 0
    assert "precision: f16 (39 parameters stored as float16)" in capsys.readouterr().out


# --- SmolLM2 ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    return gen_mod._model("f32")


@pytest.fixture(scope="module")
def gens(smollm2):
    return {"f32": Generator(smollm2, max_seq=64), "f16": Generator(smollm2, max_seq=64, precision="f16")}


def test_smollm2_f16_plan_stores_half_the_weights(gens):
    d16, d32 = gens["f16"].decode.plan, gens["f32"].decode.plan
    assert len(d16.dispatches) == len(d32.dispatches) == 30 * 5 + 2  # tests/unit/test_ops_cache.py counts them
    assert not any("dequant" in d.kernel or "to_f16" in d.kernel for d in d16.dispatches)
    # 4 matmuls a layer (Q/K/V and gate/up packed), the LM head (the tied table) and the embedding lookup
    assert sum("_f16" in d.kernel for d in d16.dispatches) == 30 * 4 + 2 and "quant_embedding_f16" in \
        d16.dispatches[0].kernel
    m16, m32 = d16.memory(), d32.memory()
    print(f"SmolLM2 decode plan memory: f16 {m16}, f32 {m32} ({m16['weights_bytes'] / m32['weights_bytes']:.4f})")
    assert 0.5 <= m16["weights_bytes"] / m32["weights_bytes"] < 0.501  # 61 norm weights stay f32
    assert m16["cache_bytes"] == m32["cache_bytes"]


def test_smollm2_f16_greedy_tokens_equal_the_fp32_reference(smollm2, gens):
    for prompt in PROMPTS:
        ref = reference_for(prompt)
        assert smollm2.encode(prompt).tolist() == ref["input_ids"]
        got = gens["f16"].generate(prompt, CI_TOKENS, stop_at_eos=False).generated_ids
        print(f"{prompt!r}: {smollm2.decode(got)!r}")
        assert got == ref["generated_ids"][:CI_TOKENS], prompt


def test_weights_f16_is_the_precision_f16_plan_on_weights_rounded_at_loading(smollm2, gens):
    # generate --weights f16: the GGUF's blocks dequantised then rounded to f16 on loading; the plan
    # has nothing left to round, and computes what precision="f16" computes on the f32 model
    half = gen_mod._model("f16")
    assert half.weight_formats() == {"f32": 61, "f16": 211}  # the tied embedding is one table
    g = Generator(half, max_seq=64)
    ids = smollm2.encode(PROMPTS[0])
    np.testing.assert_array_equal(g.prefill(ids), gens["f16"].prefill(ids))
    assert g.decode.plan.memory()["weights_bytes"] == gens["f16"].decode.plan.memory()["weights_bytes"]


def test_generate_cli_weights_and_precision_f16(capsys):
    args = ["generate", "The capital of France is", "--max-new-tokens", "2", "--max-seq", "32", "--layers", "2"]
    assert cli.main([*args, "--weights", "f16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights"] == "f16" and out["weight_formats"] == {"f32": 5, "f16": 15}  # 2 layers' plans
    assert cli.main([*args, "--precision", "f16", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["precision"] == "f16" and same["generated_ids"] == out["generated_ids"]
    # loaded as f32, held as f16 where the rewrite engine rounded them: the matrices and the embedding
    assert same["weights"] == "f32" and same["weight_formats"] == out["weight_formats"]
    assert same["memory"]["decode"]["weights_bytes"] == out["memory"]["decode"]["weights_bytes"]
    assert cli.main([*args, "--precision", "f16"]) == 0
    assert "precision: f16 (the rewrite engine stores" in capsys.readouterr().out
