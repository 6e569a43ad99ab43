"""The model cache (eggfuse/model_cache.py): a GGUF file's model read back from an entry equals the
model ``CausalLM.load`` reads from the file (config, weights, tokenizer, chat template, special
ids); an entry with flipped bytes, a changed file, another eggfuse version or ``cache=False``
is never trusted; one entry per file; ``cache info|clear`` see the entries. Most checks use a
tiny GGUF written by ``tests/gguf_files.py``; one reads the shipped SmolLM2 both ways."""

from __future__ import annotations

import json
import logging
import mmap
import os

import numpy as np
import pytest
from gguf_files import tiny_gguf  # tests/gguf_files.py (pytest pythonpath)

from eggfuse import cli, model_cache
from eggfuse.ir import InputError
from eggfuse.models.causal_lm import CausalLM
from eggfuse.models.gguf import find_gguf

TEXTS = ("Hello the world", "tell me: 12 + 30 = ?", "<|im_start|>user\nhi<|im_end|>", "ünïcödé 🎉", "")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EGGFUSE_CACHE", str(tmp_path / "cache"))
    return model_cache.ModelCache()


@pytest.fixture
def tiny(tmp_path):
    return tiny_gguf(tmp_path / "tiny.gguf")


def read_only_mapping(a: np.ndarray) -> bool:
    # read-only all the way down to a read-only memory map
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return isinstance(a, memoryview) and a.readonly and isinstance(a.obj, mmap.mmap)


def assert_same_model(got: CausalLM, want: CausalLM) -> None:
    assert got.config == want.config
    assert got.params.keys() == want.params.keys()
    for name, a in want.params.items():
        assert got.params[name].dtype == a.dtype and got.params[name].shape == a.shape, name
        np.testing.assert_array_equal(got.params[name], a, err_msg=name)
    for text in TEXTS:
        for special in (True, False):
            enc = got.tokenizer.encode(text, add_special_tokens=special)
            assert enc.ids == want.tokenizer.encode(text, add_special_tokens=special).ids, text
            assert got.decode(enc.ids) == want.decode(enc.ids)
    assert (got.bos_id, got.eos_ids, got.rope_pairing, got.name, got.kind, got.dtype) == (
        want.bos_id, want.eos_ids, want.rope_pairing, want.name, want.kind, want.dtype)
    assert (got.chat is None) == (want.chat is None)
    if want.chat is not None:
        assert got.chat_prompt("What is 2 + 2?", system="Be brief.") == want.chat_prompt("What is 2 + 2?",
                                                                                          system="Be brief.")


def test_a_second_load_reads_the_entry_back_as_the_file_gives_it(store, tiny):
    want = CausalLM.load(tiny)
    first = model_cache.load_gguf(tiny)
    assert model_cache.cache_status(first) == "miss" and len(store.entries()) == 1
    assert model_cache.write_seconds(first) > 0
    second = model_cache.load_gguf(tiny)
    assert model_cache.cache_status(second) == "hit" and model_cache.write_seconds(second) is None
    assert_same_model(first, want)
    assert_same_model(second, want)
    # read back as read-only views of the mapped weights file: nothing copied, nothing to change
    assert all(read_only_mapping(a) for a in second.params.values())
    adjacent = model_cache.load_gguf(tiny, rope_pairing="adjacent")  # another Q/K layout: another entry
    assert model_cache.cache_status(adjacent) == "miss"
    assert_same_model(adjacent, CausalLM.load(tiny, rope_pairing="adjacent"))


@pytest.mark.parametrize("where", ["model header", "model body", "weights start", "weights end", "truncated"])
def test_flipped_bytes_give_a_miss_and_a_rewritten_entry(store, tiny, where, caplog):
    want = CausalLM.load(tiny)
    model_cache.load_gguf(tiny)
    (meta,) = store.entries()
    weights = meta.with_suffix(".weights")
    path = meta if where.startswith("model") else weights
    raw = bytearray(path.read_bytes())
    if where == "truncated":
        raw = raw[:-64]
    else:
        i = {"model header": 20, "model body": len(raw) // 2, "weights start": 3, "weights end": len(raw) - 70}[where]
        raw[i] ^= 0x10
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
        again = model_cache.load_gguf(tiny)
    assert model_cache.cache_status(again) == "miss"
    assert "ignoring model-cache entry" in caplog.text
    assert_same_model(again, want)
    assert model_cache.cache_status(model_cache.load_gguf(tiny)) == "hit"  # rewritten


def test_a_changed_file_or_eggfuse_is_a_miss_and_replaces_the_entry(store, tiny, monkeypatch):
    model_cache.load_gguf(tiny)
    (before,) = store.entries()
    os.utime(tiny, ns=(1_000_000_000, 1_000_000_000))  # the same bytes, another modification time
    assert model_cache.cache_status(model_cache.load_gguf(tiny)) == "miss"
    (after,) = store.entries()  # one entry per file: the stale one is gone, weights included
    assert after != before and not before.with_suffix(".weights").exists()
    tiny_gguf(tiny, seed=1)  # other weights, other header bytes
    changed = model_cache.load_gguf(tiny)
    assert model_cache.cache_status(changed) == "miss"
    assert_same_model(changed, CausalLM.load(tiny))
    assert len(store.entries()) == 1
    monkeypatch.setattr(model_cache, "versions", lambda: {"eggfuse": "another"})
    assert model_cache.cache_status(model_cache.load_gguf(tiny)) == "miss"


def test_cache_false_reads_and_writes_nothing(store, tiny):
    model = model_cache.load_gguf(tiny, cache=False)
    assert model_cache.cache_status(model) == "off" and not store.folder.exists()
    assert model_cache.cache_status(CausalLM.load(tiny)) is None


def test_a_model_with_attributes_the_cache_does_not_know_is_not_stored(store, tiny, caplog):
    model = CausalLM.load(tiny)
    model.extra = "something new"
    with caplog.at_level(logging.INFO, logger="eggfuse.cache"):
        assert store.store("0" * 64, model, tiny) is None
    assert "attributes the model cache does not know: ['extra']" in caplog.text
    assert store.entries() == []


def test_an_unwritable_folder_only_costs_the_cache(tmp_path, tiny, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EGGFUSE_CACHE", str(blocker))
    with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
        model = model_cache.load_gguf(tiny)
    assert model_cache.cache_status(model) == "miss" and "cannot write the model cache" in caplog.text
    assert_same_model(model, CausalLM.load(tiny))


def test_cache_info_and_clear_count_model_entries(store, tiny, tmp_path, capsys):
    model_cache.load_gguf(tiny)
    model_cache.load_gguf(tiny_gguf(tmp_path / "other.gguf", seed=2))
    info = store.info()
    assert info["entries"] == 2
    assert info["bytes"] == sum(p.stat().st_size for p in store.folder.iterdir())
    (store.folder / f".{'a' * 64}.weights.77.tmp").write_text("left by a killed write")
    assert cli.main(["cache", "info", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model_entries"], out["model_bytes"]) == (2, info["bytes"])
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"2 model entries from {store.folder}")
    assert list(store.folder.iterdir()) == []


def test_the_shipped_model_reads_back_as_the_file_gives_it(store):
    want = CausalLM.load()
    assert model_cache.cache_status(model_cache.load_gguf()) == "miss"
    got = model_cache.load_gguf()
    assert model_cache.cache_status(got) == "hit"
    assert_same_model(got, want)
    assert got.name == str(find_gguf())


@pytest.fixture
def reads(monkeypatch):
    """Counts the GGUF metadata reads (LlamaConfig.from_gguf) the config entries save."""
    from eggfuse.models.llama import LlamaConfig

    calls = []
    real = LlamaConfig.from_gguf.__func__
    monkeypatch.setattr(LlamaConfig, "from_gguf", classmethod(lambda cls, src: calls.append(src) or real(cls, src)))
    return calls


def test_a_config_entry_gives_the_files_config_and_skips_the_reader(store, tiny, reads):
    from eggfuse.models.llama import LlamaConfig

    want = LlamaConfig.from_gguf(tiny)
    assert model_cache.gguf_config(tiny) == want and len(reads) == 2 and len(store.configs()) == 1
    assert model_cache.gguf_config(tiny) == want and len(reads) == 2  # read back, not from the file
    assert model_cache.gguf_config(tiny, cache=False) == want and len(reads) == 3
    assert store.info()["configs"] == 1 and store.clear() == 0 and store.configs() == []


@pytest.mark.parametrize("where", ["header", "body", "truncated"])
def test_a_flipped_config_entry_is_read_from_the_file_and_rewritten(store, tiny, reads, where, caplog):
    want = model_cache.gguf_config(tiny)
    (entry,) = store.configs()
    raw = bytearray(entry.read_bytes())
    if where == "truncated":
        raw = raw[:-5]
    else:
        raw[{"header": 15, "body": len(raw) - 40}[where]] ^= 0x10
    entry.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="eggfuse.cache"):
        assert model_cache.gguf_config(tiny) == want
    assert len(reads) == 2 and "ignoring config entry" in caplog.text
    assert model_cache.gguf_config(tiny) == want and len(reads) == 2  # rewritten


def test_a_changed_file_gets_a_new_config_entry(store, tmp_path, reads):
    first = model_cache.gguf_config(tiny_gguf(tmp_path / "m.gguf"))
    os.utime(tmp_path / "m.gguf", ns=(1, 1))
    assert model_cache.gguf_config(tmp_path / "m.gguf") == first and len(reads) == 2
    assert len(store.configs()) == 1  # the old entry of that file removed


@pytest.mark.parametrize("weights", ["q4_1", "q8_0", "f16"])
def test_each_weight_storage_has_its_own_entry(store, tmp_path, weights):
    # blocks (u32 rows, f16 pairs of halves) read back as CausalLM.load(weights=...) gives them, beside the f32
    # entry of the same file: storing one storage's entry leaves the other's in place
    path = tiny_gguf(tmp_path / "tiny32.gguf", hidden=32, ffn=64)  # K a multiple of the 32-element blocks
    want = CausalLM.load(path, weights=weights)
    assert model_cache.cache_status(model_cache.load_gguf(path)) == "miss"  # f32
    first = model_cache.load_gguf(path, weights=weights)
    second = model_cache.load_gguf(path, weights=weights)
    assert (model_cache.cache_status(first), model_cache.cache_status(second)) == ("miss", "hit")
    assert len(store.entries()) == 2 and model_cache.cache_status(model_cache.load_gguf(path)) == "hit"
    for got in (first, second):
        assert_same_model(got, want)
        assert (got.weights, got.quant) == (weights, want.quant)
    assert set(want.quant.values()) == {weights}  # f16 too: pairs of halves in u32 words
    with pytest.raises(InputError, match="q3_k"):
        model_cache.load_gguf(path, weights="q3_k")


def test_a_storage_replaces_its_own_stale_entry_and_an_older_format_only(store, tmp_path):
    path = tiny_gguf(tmp_path / "tiny32.gguf", hidden=32, ffn=64)
    model_cache.load_gguf(path, weights="q4_1")
    model_cache.load_gguf(path)  # f32 after q4_1: both kept
    assert len(store.entries()) == 2
    (q4,) = [p for p in store.entries() if json.loads(p.read_bytes().split(b"\n")[0])["weights"] == "q4_1"]
    # an entry an older eggfuse wrote (another format) for the same file goes when any entry is stored
    old = store.folder / f"{'b' * 64}.model"
    old.write_bytes(q4.read_bytes().replace(b'"eggfuse_model_cache": 2', b'"eggfuse_model_cache": 1', 1))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # the file edited: new keys
    assert model_cache.cache_status(model_cache.load_gguf(path, weights="q4_1")) == "miss"
    kinds = sorted(json.loads(p.read_bytes().split(b"\n")[0])["weights"] for p in store.entries())
    # the old q4_1 entry and the other format's went; the stale f32 entry stays until f32 is stored
    assert kinds == ["f32", "q4_1"] and not q4.exists() and not old.exists()
