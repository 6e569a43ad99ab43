"""The compile cache on the device: a second compile of a graph loads the optimised graph and the
plan (and computes what the numpy reference computes), a changed key is a miss, a corrupt entry
is ignored and rewritten, ``cache=False`` / ``--no-cache`` skip it, and the JSON of ``embed``,
``generate`` and ``train-digits`` says what happened. Each test has a cache folder of its own."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

import eggfuse
from eggfuse import cache, cli
from eggfuse.ir import InputError, evaluate
from eggfuse.pipeline import compile

gen_mod = importlib.import_module("eggfuse.generate")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "cache"))
    return cache.CompileCache()


def graph_and_values(seed: int = 0, rows: int = 5):
    g = eggfuse.Graph()
    x = g.input("x", [rows, 24])
    w = g.parameter("w", [24, 12])
    b = g.parameter("b", [12])
    ln_w = g.parameter("ln_w", [12])
    ln_b = g.parameter("ln_b", [12])
    h = g.gelu(g.bias_add(g.matmul(x, w), b))
    g.set_outputs([g.layer_norm(h, ln_w, ln_b), h])
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((24, 12)), "b": rng.standard_normal(12), "ln_w": rng.standard_normal(12),
              "ln_b": rng.standard_normal(12)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    return g, params, {"x": rng.standard_normal((rows, 24)).astype(np.float32)}


def check_against_reference(compiled, g, params, feeds):
    want = evaluate(g, feeds, params)
    got = compiled.run(feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_second_compile_loads_graph_and_plan(store):
    g, params, feeds = graph_and_values()
    first = compile(g, params)
    assert (first.cache, first.cache_loaded) == ("miss", ())
    assert len(store.entries()) == 1 and "cache_write_s" in first.timings
    second = compile(g, params)
    assert (second.cache, second.cache_loaded) == ("hit", ("optimize", "lower"))
    assert {"device_s", "optimize_s", "lower_s", "bind_s", "compile_s"} <= second.timings.keys()
    assert second.report == first.report and second.plan == first.plan
    assert second.graph.summary() == first.graph.summary() and second.dispatches_fused == first.dispatches_fused
    check_against_reference(second, g, params, feeds)
    # parameter values are not in the key: other weights hit the same entry and are the ones used
    _, other, _ = graph_and_values(seed=1)
    third = compile(g, other)
    assert third.cache == "hit"
    check_against_reference(third, g, other, feeds)
    assert len(store.entries()) == 1


def test_graph_subgroups_and_fusing_changes_are_misses(store):
    g, params, feeds = graph_and_values()
    assert compile(g, params).cache == "miss"
    h, hp, hf = graph_and_values(rows=6)
    assert compile(h, hp).cache == "miss"
    # lavapipe has usable subgroups, so the default plan uses them and subgroups=False is another key
    assert compile(g, params, subgroups=False).cache == "miss"
    unfused = compile(g, params, fuse=False)
    assert unfused.cache == "miss" and unfused.report is None
    again = compile(g, params, fuse=False)
    assert (again.cache, again.cache_loaded, again.report) == ("hit", ("lower",), None)
    assert "optimize_s" not in again.timings
    check_against_reference(again, g, params, feeds)
    assert len(store.entries()) == 4
    assert compile(g, params, cost_model=eggfuse.CostModel(dispatch_bytes=1 << 10)).cache == "miss"


def test_a_version_or_device_change_is_a_miss(store, monkeypatch):
    g, params, _ = graph_and_values()
    compile(g, params)
    versions = cache.versions
    real = versions()
    monkeypatch.setattr(cache, "versions", lambda: {**real, "wgpu-native": "0.0.0"})
    assert compile(g, params).cache == "miss"
    identity = cache.device_identity

    def smaller_limit(device):
        out = identity(device)
        out["limits"]["max-storage-buffers-per-shader-stage"] -= 1
        return out

    monkeypatch.setattr(cache, "device_identity", smaller_limit)
    assert compile(g, params).cache == "miss"
    monkeypatch.setattr(cache, "device_identity", identity)
    monkeypatch.setattr(cache, "versions", versions)
    assert compile(g, params).cache == "hit"


def test_flipped_bytes_give_a_miss_the_right_result_and_a_rewritten_entry(store):
    g, params, feeds = graph_and_values()
    compile(g, params)
    (path,) = store.entries()
    good = path.read_bytes()
    for pos in (10, len(good) // 2, len(good) - 5):
        bad = bytearray(good)
        bad[pos] ^= 0x01
        path.write_bytes(bytes(bad))
        compiled = compile(g, params)
        assert compiled.cache == "miss"
        check_against_reference(compiled, g, params, feeds)
        assert path.read_bytes() != bytes(bad)  # rewritten ...
        assert compile(g, params).cache == "hit"  # ... and good again


def test_cache_false_reads_and_writes_nothing(store):
    g, params, feeds = graph_and_values()
    off = compile(g, params, cache=False)
    assert (off.cache, off.cache_loaded) == ("off", ())
    assert store.entries() == []
    compile(g, params)
    assert compile(g, params, cache=False).cache == "off"
    with pytest.raises(InputError, match="cache must be True or False"):
        compile(g, params, cache="yes")


def test_verify_checks_a_loaded_graph_too(store):
    g, params, feeds = graph_and_values()
    compile(g, params)
    compiled = compile(g, params, verify=True)
    assert compiled.cache == "hit"
    check_against_reference(compiled, g, params, feeds)
    # the report says this call's verification, not that of the call that stored the entry
    assert compiled.report.verified_max_diff is not None and "verified" in compiled.report.summary()
    again = compile(g, params)
    assert again.cache == "hit" and again.report.verified_max_diff is None and "verified" not in again.report.summary()


def test_embed_json_says_hit_or_miss_and_keeps_its_timings(store, capsys):
    argv = ["embed", "--json", "A man is eating food.", "A man is eating pasta."]
    outs = []
    for _ in range(2):
        assert cli.main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert [o["cache"] for o in outs] == ["miss", "hit"]
    assert outs[0]["cache_loaded"] == [] and outs[1]["cache_loaded"] == ["optimize", "lower"]
    for o in outs:
        assert {"optimize_s", "compile_s", "lower_s", "bind_s", "device_s"} <= o["timings"].keys()
    assert outs[1]["report"] == outs[0]["report"]
    np.testing.assert_array_equal(outs[0]["embeddings"], outs[1]["embeddings"])
    assert cli.main([*argv, "--no-cache"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["cache"] == "off" and len(store.entries()) == 1
    assert cli.main(argv[:1] + argv[2:]) == 0
    assert f"compile cache: hit (optimize, lower loaded from {store.folder})" in capsys.readouterr().out


def test_generate_json_time_to_first_token_and_cache(store, capsys):
    argv = ["generate", "The capital of France is", "--max-new-tokens", "3", "--max-seq", "32", "--layers", "1",
            "--json"]
    outs = []
    for _ in range(2):
        gen_mod._generator.cache_clear()  # a new process would load and compile again: so does this call
        gen_mod._shipped.cache_clear()
        assert cli.main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert [(o["cache"], o["cache_plans"], o["cache_model"]) for o in outs] == [
        ("miss", {"decode": "miss", "prefill": "miss"}, "miss"), ("hit", {"decode": "hit", "prefill": "hit"}, "hit")]
    assert outs[0]["generated_ids"] == outs[1]["generated_ids"]
    assert 0 < outs[0]["timings"]["model_cache_write_s"] < outs[0]["timings"]["load_s"]
    assert "model_cache_write_s" not in outs[1]["timings"]
    for o in outs:
        t = o["timings"]
        assert 0 < o["time_to_first_token_s"]
        assert o["time_to_first_token_s"] >= t["prefill_s"] + t["decode_compile_s"] + t["prefill_compile_s"]
    gen_mod._generator.cache_clear()
    assert cli.main(["generate", "Hi", "--max-new-tokens", "2", "--max-seq", "32", "--layers", "1", "--json",
                     "--no-cache"]) == 0
    off = json.loads(capsys.readouterr().out)
    # a one-token prompt runs on the decode plan: there is no prefill plan
    assert len(off["prompt_ids"]) == 1 and (off["cache"], off["cache_plans"]) == ("off", {"decode": "off"})
    assert off["cache_model"] == "off"
    assert cli.main(argv[:-1]) == 0
    assert "time to first token: " in capsys.readouterr().out
    gen_mod._generator.cache_clear()


def test_train_digits_no_cache(store):
    from eggfuse.cli_train import train_digits

    runs = [train_digits(steps=2, cache=c) for c in (True, True, False)]
    assert [r.cache for r in runs] == ["miss", "hit", "off"]
    assert runs[0].final_loss == runs[1].final_loss
    assert cli.main(["train-digits", "--steps", "2", "--json", "--no-cache"]) == 0
