"""The compile cache without a GPU (eggfuse/cache.py): keys, the entry format, corruption, the
folder, and ``eggfuse cache info|list|clear``. Lowered plans here use the WebGPU default limits; the
hits and misses of real compiles are in tests/gpu/test_compile_cache_gpu.py."""

from __future__ import annotations

import dataclasses
import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from eggfuse import cache, cli
from eggfuse.api import model_graph
from eggfuse.ir import DType, Graph, InputError
from eggfuse.lowering import lower
from eggfuse.models import llama
from eggfuse.rewrites import CostModel, make_ruleset, optimization_rulesets, optimize
from eggfuse.rewrites.report import Report

DEVICE = {"adapter": {"device": "test adapter", "backend_type": "Vulkan"},
          "limits": {"max-storage-buffers-per-shader-stage": 8, "max-buffer-size": 1 << 28}}


def small_graph(*, approximate: str = "erf", name: str = "x", rows: int = 8, const: float = 2.0) -> Graph:
    g = Graph()
    x = g.input(name, [rows, 16])
    w = g.parameter("w", [16, 4])
    b = g.parameter("b", [4])
    c = g.constant(np.full(4, const, np.float32))
    y = g.gelu(g.bias_add(g.matmul(x, w), b), approximate=approximate)
    g.set_outputs([g.add(y, c)])
    return g


def key(graph: Graph, **kw) -> str:
    args = {"fuse": True, "optimizer": {"cost_model": None}, "device": DEVICE, "subgroups": False} | kw
    return cache.entry_key(graph, **args)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "cache"))
    return cache.CompileCache()


# --- keys -------------------------------------------------------------------------------------


def test_the_same_graph_built_twice_has_one_key():
    assert key(small_graph()) == key(small_graph())
    assert len(key(small_graph())) == 64


@pytest.mark.parametrize("change", [dict(approximate="tanh"), dict(name="tokens"), dict(rows=9), dict(const=3.0)],
                         ids=["attribute", "leaf name", "shape", "constant value"])
def test_a_graph_change_changes_the_key(change):
    assert key(small_graph(**change)) != key(small_graph())


def test_outputs_and_fusing_are_in_the_key():
    g = small_graph()
    other = small_graph()
    other.set_outputs([other.outputs[0], 0])
    assert key(other) != key(g)
    assert key(g, fuse=False) != key(g)


def test_runtime_checks_and_constant_params_are_in_the_key():
    # plans differ in their kernels' sources (lower(..., runtime_checks, constant_params))
    g = small_graph()
    keys = {key(g, runtime_checks=r, constant_params=c) for r in (False, True) for c in (False, True)}
    assert len(keys) == 4


def test_rule_set_cost_model_device_and_subgroups_change_the_key():
    g = small_graph()
    base = key(g)

    def neg_neg(e):
        (x,) = e.vars("x")
        # Neg(Neg(x)) -> x
        yield e.equal("Neg(Neg(x)) -> x", e.Neg(e.Neg(x)), x)

    def relu_relu(e):
        (x,) = e.vars("x")
        # Relu(Relu(x)) -> Relu(x)
        yield e.equal("Relu(Relu(x)) -> Relu(x)", e.Relu(e.Relu(x)), e.Relu(x))

    mine = [*optimization_rulesets(), make_ruleset("mine", neg_neg)]
    assert key(g, optimizer={"cost_model": None, "rulesets": mine}) != base
    # the same rules give the same key, other rules another one
    again = [*optimization_rulesets(), make_ruleset("mine", neg_neg)]
    other = [*optimization_rulesets(), make_ruleset("mine", relu_relu)]
    keys = [key(g, optimizer={"cost_model": None, "rulesets": r}) for r in (mine, again, other)]
    assert keys[0] == keys[1] != keys[2]
    assert key(g, optimizer={"cost_model": None, "rulesets": optimization_rulesets()[:-1]}) != \
        key(g, optimizer={"cost_model": None, "rulesets": optimization_rulesets()})

    class Mine(CostModel):
        def kernel_cost(self, k):
            return 1

    costs = {key(g, optimizer={"cost_model": m}) for m in (CostModel(), CostModel(1 << 10), Mine())}
    assert len(costs) == 3 and base not in costs
    assert key(g, device={**DEVICE, "adapter": {"device": "another adapter"}}) != base
    assert key(g, device={**DEVICE, "limits": {**DEVICE["limits"], "max-buffer-size": 1 << 20}}) != base
    assert key(g, subgroups=True) != base


def test_a_version_change_changes_the_key(monkeypatch):
    base = key(small_graph())
    real = cache.versions()
    assert {"eggfuse", "egglog", "wgpu", "wgpu-native"} <= real.keys()
    assert real["eggfuse"].endswith(cache.source_digest()[:16])
    for name in real:
        monkeypatch.setattr(cache, "versions", lambda name=name: {**real, name: real[name] + ".1"})
        assert key(small_graph()) != base, name


def test_device_identity_holds_the_adapter_and_the_limits_lowering_reads():
    device = SimpleNamespace(adapter=SimpleNamespace(info={"vendor": "v", "device": "d"}),
                             limits={"max-buffer-size": 1 << 20, "max-texture-dimension-2d": 8192})
    ident = cache.device_identity(device)
    assert ident["adapter"] == {"device": "d", "vendor": "v"}
    assert ident["limits"]["max-buffer-size"] == 1 << 20
    assert "max-texture-dimension-2d" not in ident["limits"]  # lowering does not read it
    assert "max-storage-buffers-per-shader-stage" in ident["limits"]  # the WebGPU default, which lowering uses


def test_shipped_rulesets_are_keyed_by_name_and_a_users_by_their_rules():
    # precision f16 passes the shipped rulesets explicitly: keying them must not build a lazy one's rules (seconds
    # for conv_epilogue on a cache hit), in a new process where none is built yet
    import subprocess
    import sys

    code = """
from eggfuse import cache
from eggfuse.rewrites import make_ruleset
from eggfuse.rewrites.rulesets import _PENDING, optional_ruleset, scheduled_rulesets
shipped = [*scheduled_rulesets(), optional_ruleset("f16")]
pending = set(_PENDING)
key = cache.optimizer_identity({"rulesets": shipped})["rulesets"]
assert pending and set(_PENDING) == pending, "a lazy ruleset was built"
assert len(key) == len(shipped) and all(k.startswith("shipped:") for k in key), key
mine = make_ruleset("mine", lambda e: [e.equal("Neg(Neg(x)) -> x", e.Neg(e.Neg(e.var("x"))), e.var("x"))])
(digest,) = cache.optimizer_identity({"rulesets": [mine]})["rulesets"]
assert len(digest) == 64 and not digest.startswith("shipped"), digest
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_what_cannot_be_keyed_is_refused():
    with pytest.raises(cache.Unstorable):
        cache.optimizer_identity({"cost_model": None, "something": object()})


# --- the entry format -------------------------------------------------------------------------


def graphs():
    cfg = llama.LlamaConfig.smollm2_135m()
    decode = llama.build_llama_cache_graph(cfg, 1, 16, layers=1)
    training = model_graph("llama:1", seq=4, training=True)
    fused, _ = optimize(model_graph("llama:2", seq=4))
    split = Graph()  # a split-K product in one dispatch: a scratch buffer and counters (matmul_kernel.last_split)
    split.set_outputs([split.matmul_bt(split.input("a", (32, 576)), split.parameter("b", (192, 576)))])
    return {"small": small_graph(), "decode (state, u32 inputs)": decode, "training": training, "fused": fused,
            "split": split}


@pytest.mark.parametrize("name", ["small", "decode (state, u32 inputs)", "training", "fused", "split"])
def test_graphs_and_plans_round_trip_exactly(name):
    g = graphs()[name]
    back = cache.decode_graph(json.loads(json.dumps(cache.encode_graph(g))))
    assert back.outputs == g.outputs and len(back.nodes) == len(g.nodes)
    for a, b in zip(g.nodes, back.nodes, strict=True):
        assert (a.op, a.inputs, a.type) == (b.op, b.inputs, b.type)
        assert a.attrs.keys() == b.attrs.keys()
        for k in a.attrs:
            if isinstance(a.attrs[k], np.ndarray):
                np.testing.assert_array_equal(a.attrs[k], b.attrs[k])
                assert a.attrs[k].dtype == b.attrs[k].dtype
            else:
                assert a.attrs[k] == b.attrs[k] and type(a.attrs[k]) is type(b.attrs[k]), k
    assert back.parameters == g.parameters and back.inputs == g.inputs
    plan = lower(g)
    assert name != "split" or [b.kind for b in plan.buffers].count("counters") == 1
    again = cache.decode_plan(json.loads(json.dumps(cache.encode_plan(plan))), back)
    for f in dataclasses.fields(plan):
        want, got = getattr(plan, f.name), getattr(again, f.name)
        if f.name == "constants":
            assert want.keys() == got.keys()
            for i in want:
                np.testing.assert_array_equal(want[i], got[i])
                assert want[i].dtype == got[i].dtype
        else:
            assert got == want, f.name


def test_report_round_trips():
    _, report = optimize(small_graph())
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    with pytest.raises(ValueError):
        Report.from_dict({"not_a_field": 1})


def test_a_stored_entry_loads_back(store):
    g = small_graph()
    fused, report = optimize(g)
    plan = lower(fused)
    k = key(g)
    assert store.load(k) is None  # nothing stored yet
    path = store.store(k, fused, report, plan)
    assert path == store.folder / f"{k}.json" and path.is_file()
    loaded = store.load(k)
    assert loaded.plan == dataclasses.replace(plan, constants=loaded.plan.constants)
    assert loaded.graph.summary() == fused.summary() and loaded.report == report
    assert loaded.optimize_s >= 0 and loaded.lower_s >= 0
    unfused = lower(g)
    store.store(key(g, fuse=False), None, None, unfused)
    back = store.load(key(g, fuse=False), runs=g)
    assert back.graph is None and back.report is None and back.plan.buffers == unfused.buffers


def test_the_folder_keeps_the_most_recently_used_entries_under_its_size_limit(store, monkeypatch):
    # an entry a shape, without end: 1,034 entries and 579 MB in a user's folder
    import os
    import time

    g = small_graph()
    fused, report = optimize(g)
    plan = lower(fused)
    paths = []
    for k in range(6):
        paths.append(store.store(f"{k:064x}", fused, report, plan))
        os.utime(paths[-1], (time.time() - 100 + k, time.time() - 100 + k))  # stored in that order
    size = paths[0].stat().st_size
    os.utime(paths[0])  # entry 0 used last (as a load marks it)
    assert store.trim(max_bytes=int(3.5 * size)) == 3  # down to 90% of 3.5 entries: 3 kept
    assert [p.exists() for p in paths] == [True, False, False, False, True, True]
    assert store.trim(max_bytes=10 * size) == 0
    monkeypatch.setenv(cache.MAX_ENV, str(2.5 * size / 2**20))  # the limit a store keeps
    limited = cache.CompileCache()
    limited.store(f"{6:064x}", fused, report, plan)
    assert len(limited.entries()) == 2 and paths[0].exists()
    monkeypatch.setenv(cache.MAX_ENV, str(0.5 * size / 2**20))  # less than one entry: the one stored stays
    assert cache.CompileCache().store(f"{7:064x}", fused, report, plan).exists()
    monkeypatch.setenv(cache.MAX_ENV, "lots")  # refused before any compile work, which makes the cache first
    with pytest.raises(InputError, match=r"\$EGGFUSE_CACHE_MAX_MB .* a positive number, got 'lots'"):
        cache.CompileCache()


def entry(store) -> tuple[str, bytes]:
    g = small_graph()
    fused, report = optimize(g)
    k = key(g)
    return k, store.store(k, fused, report, lower(fused)).read_bytes()


def test_flipped_bytes_anywhere_are_never_trusted(store, caplog):
    k, good = entry(store)
    path = store.path(k)
    for pos in (3, len(good) // 3, len(good) // 2, len(good) - 2):
        bad = bytearray(good)
        bad[pos] ^= 0x20
        path.write_bytes(bytes(bad))
        with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
            assert store.load(k) is None, pos
        assert "ignoring compile-cache entry" in caplog.text
        caplog.clear()
    path.write_bytes(good[: len(good) // 2])  # truncated
    assert store.load(k) is None
    path.write_bytes(b"")
    assert store.load(k) is None
    path.write_bytes(good)
    assert store.load(k) is not None


def test_an_entry_under_another_key_or_with_a_consistent_checksum_but_wrong_plan_is_refused(store):
    k, good = entry(store)
    other = "0" * 64
    store.path(other).write_bytes(good)  # a copied file: its header names another key
    assert store.load(other) is None
    # a body rewritten with a fresh checksum: the plan's first buffer claims another shape
    header, body = good.split(b"\n", 1)
    doc = json.loads(body)
    doc["plan"]["buffers"][0][6] = [3, 3]
    body = json.dumps(doc).encode()
    head = json.loads(header) | {"sha256": cache.hashlib.sha256(body).hexdigest(), "bytes": len(body)}
    store.path(k).write_bytes(json.dumps(head).encode() + b"\n" + body)
    assert store.load(k) is None
    # and a graph whose stored type disagrees with its shape rule
    doc = json.loads(good.split(b"\n", 1)[1])
    doc["graph"]["nodes"][-1][3] = {"type": [[8, 5], "f32"]}
    body = json.dumps(doc).encode()
    head = json.loads(header) | {"sha256": cache.hashlib.sha256(body).hexdigest(), "bytes": len(body)}
    store.path(k).write_bytes(json.dumps(head).encode() + b"\n" + body)
    assert store.load(k) is None


def test_an_entry_holds_no_pickle_and_no_code():
    g = small_graph()
    doc = cache.encode_graph(g)
    text = json.dumps(doc)
    assert "pickle" not in text and json.loads(text) == doc
    with pytest.raises(cache.CorruptEntry):
        cache._value({"array": "|O", "shape": [1], "data": ""})  # object arrays are refused


def test_an_unwritable_folder_only_costs_the_cache(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EGGFUSE_CACHE", str(blocker / "cache"))
    store = cache.CompileCache()
    g = small_graph()
    with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
        assert store.store(key(g, fuse=False), None, None, lower(g)) is None
    assert "cannot write the compile cache" in caplog.text
    # "[Errno 17] File exists" named neither the file nor what to do
    assert f"{blocker} is a file, not a folder; point $EGGFUSE_CACHE at a folder" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
        assert store.load(key(g, fuse=False), runs=g) is None
    assert caplog.text == ""  # the store's warning says it, once a compile


# --- the folder and the CLI -------------------------------------------------------------------


def test_the_folder_is_eggfuse_cache_or_the_user_cache_folder(tmp_path, monkeypatch):
    import platformdirs

    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "here"))
    assert cache.cache_dir() == tmp_path / "here" and cache.CompileCache().folder == tmp_path / "here"
    monkeypatch.delenv("EGGFUSE_CACHE")
    assert cache.cache_dir() == cache.Path(platformdirs.user_cache_dir("eggfuse", appauthor=False))


def test_the_test_session_never_uses_the_user_cache_folder(compile_cache_folder):
    import platformdirs

    assert cache.cache_dir() == compile_cache_folder != cache.Path(platformdirs.user_cache_dir("eggfuse"))


def test_info_and_clear(store, capsys, monkeypatch):
    assert store.info() == {"folder": str(store.folder), "entries": 0, "bytes": 0}
    g = small_graph()
    for rows in (8, 9):
        h = small_graph(rows=rows)
        store.store(key(h, fuse=False), None, None, lower(h))
    (store.folder / "notes.txt").write_text("someone else's file")
    (store.folder / f".{'a' * 64}.123.tmp").write_text("left by a killed write")
    info = store.info()
    assert info["entries"] == 2 and info["bytes"] == sum(p.stat().st_size for p in store.entries())
    assert cli.main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**info, "model_entries": 0, "model_configs": 0, "model_bytes": 0}
    assert cli.main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert f"folder: {store.folder}" in text and "entries: 2" in text and f"({info['bytes']} bytes)" in text
    monkeypatch.setenv(cache.MAX_ENV, "0")  # a bad limit refuses compiles, not the cache command that lists and clears
    assert cli.main(["cache", "list"]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 2 entries from {store.folder}"
    assert store.info()["entries"] == 0
    assert sorted(p.name for p in store.folder.iterdir()) == ["notes.txt"]
    assert cli.main(["cache", "clear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"folder": str(store.folder), "removed": 0, "removed_models": 0}
    assert store.load(key(g, fuse=False), runs=g) is None


def test_list_shows_each_entry_most_recently_used_first_and_why_one_is_unreadable(store, capsys):
    import os

    assert cli.main(["cache", "list"]) == 0
    assert capsys.readouterr().out.strip() == f"no compile-cache entries in {store.folder}"
    g = small_graph(rows=9)
    fused, report = optimize(g)
    fused_plan = lower(fused)
    store.store(key(g), fused, report, fused_plan)
    h = small_graph(rows=5, name="tokens")
    store.store(key(h, fuse=False), None, None, lower(h))
    bad = store.path("b" * 64)
    bad.write_bytes(b'{"eggfuse_cache": 1}\nnot json')
    for age, k in ((300, key(g)), (200, "b" * 64), (100, key(h, fuse=False))):  # oldest use first
        os.utime(store.path(k), (1_700_000_000 - age, 1_700_000_000 - age))
    before = {p.name: (p.stat().st_mtime, p.read_bytes()) for p in store.entries()}
    assert cli.main(["cache", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["folder"] == str(store.folder)
    rows = doc["entries"]
    assert [r["key"] for r in rows] == [key(h, fuse=False), "b" * 64, key(g)]
    unfused, unreadable, cached = rows
    assert unfused["fused"] is False and unfused["inputs"] == {"tokens": [5, 16]}
    assert unfused["dispatches"] == len(lower(h).dispatches) and unfused["parameters"] == 2
    assert cached["fused"] is True and cached["inputs"] == {"x": [9, 16]}
    assert cached["dispatches"] == len(fused_plan.dispatches) < unfused["dispatches"]
    assert cached["outputs"] == 1 and cached["eggfuse"] == cache.versions()["eggfuse"]
    assert cached["bytes"] == store.path(key(g)).stat().st_size and cached["created"] > 1_700_000_000
    assert set(unreadable) == {"key", "bytes", "used", "error"} and unreadable["error"].startswith("CorruptEntry")
    assert cli.main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"3 compile-cache entries in {store.folder}")
    assert lines[2].startswith(key(h, fuse=False)[:16]) and "unfused" in lines[2] and "tokens[5, 16]" in lines[2]
    assert lines[3].startswith("b" * 16) and "unreadable (" in lines[3]
    assert lines[4].startswith(key(g)[:16]) and " fused " in lines[4] and "x[9, 16]" in lines[4]
    assert {p.name: (p.stat().st_mtime, p.read_bytes()) for p in store.entries()} == before  # nothing touched


def test_cache_info_of_a_folder_not_made_yet(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "never"))
    assert cli.main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert not (tmp_path / "never").exists()


def test_bool_and_u32_leaves_survive():
    g = Graph()
    x = g.input("x", [4], DType.U32)
    t = g.constant(np.array([True, False, True, True]), dtype=DType.BOOL)
    g.set_outputs([x, t])
    back = cache.decode_graph(json.loads(json.dumps(cache.encode_graph(g))))
    assert back.node(x).type == g.node(x).type
    np.testing.assert_array_equal(back.node(t).attrs["value"], g.node(t).attrs["value"])
    assert back.node(t).attrs["value"].dtype == g.node(t).attrs["value"].dtype
