"""The model cache: a GGUF file's model as loaded (config, tokenizer, special ids, chat template and
weight arrays) kept on disk, so that a later process skips the GGUF reader and the
dequantisation.

Reading SmolLM2-135M's GGUF takes seconds on this machine: ``gguf.GGUFReader`` builds a
numpy view for each of the 49,152 vocabulary strings and 48,900 merges, and
``gguf.quants.dequantize`` unpacks 135M Q4_1 weights. An entry holds what
:meth:`~eggfuse.models.causal_lm.CausalLM.load` returned: whatever the arrays of
``model.params`` are (float32; with ``weights="q4_1"`` and the other block formats the u32 rows of
blocks, as the file stores them or quantised on loading; with ``"f16"`` pairs of float16 in u32
words), memory-mapped read-only when read back, so that a session uploads them without copying.

An entry is two files in ``<cache folder>/models`` (:func:`eggfuse.cache.cache_dir`):

- ``<key>.model``: a header line (format, key, the SHA-256 and length of the body, the GGUF
  file's path) then the body, JSON: the config's fields, the tokenizer (``tokenizers``'
  own JSON), special ids, the chat template, and per array its name, dtype, shape, offset
  and CRC-32;
- ``<key>.weights``: the arrays' bytes, each at a 64-byte aligned offset.

The key is a SHA-256 of the GGUF file's resolved path, size, modification time and the
SHA-256 of its first 16 MiB (the header: metadata and tensor infos), the Q/K layout
(``rope_pairing``), the weights' storage (``weights``), and the versions of eggfuse (with the
digest of its source files, as the compile cache), gguf, tokenizers and numpy. An entry that does
not check out (a header, checksum, length or CRC that differs; a body this module cannot read back) is ignored with
a warning and rewritten; each array's CRC-32 is checked when the entry is read (about 0.1 s
for 540 MB). Storing an entry removes the other entries of the same file and storage, so an edited
file or a new eggfuse leaves one entry per GGUF file and storage (SmolLM2-135M: 538 MB in f32,
269 MB in f16, 97 MB in Q4_1); entries an older eggfuse wrote in another format go too. Writes go
to temporary files renamed into place, the weights before the ``.model`` file that vouches for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import re
import time
import weakref
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from eggfuse.cache import (
    CorruptEntry,
    Unstorable,
    _plain,
    _value,
    cache_dir,
    framed,
    verified_body,
    versions,
    write_replacing,
)

log = logging.getLogger("eggfuse.cache")

FORMAT = 2  # 2: entries of every weights storage (the body's weights and quant)
#: Bytes of the GGUF file hashed into the key: its header, metadata and tensor infos.
HEAD_BYTES = 16 << 20
_ALIGN = 64
_ENTRY = re.compile(r"^[0-9a-f]{64}\.model$")
_TEMP = re.compile(r"^\.[0-9a-f]{64}\.(model|weights|config)\.\d+\.tmp$")
_CONFIG = re.compile(r"^[0-9a-f]{64}\.config$")
#: The attributes of a CausalLM an entry holds (a model with others is not cached).
_MODEL_FIELDS = {"config", "params", "tokenizer", "bos_id", "eos_ids", "chat", "rope_pairing", "name", "kind", "dtype",
                 "quant", "weights", "_stored"}

_status: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> hit, miss or off
_write_s: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> seconds spent storing it


def load_gguf(path: str | os.PathLike | None = None, *, rope_pairing: str = "half", cache: bool = True,
              weights: str = "f32"):
    """The :class:`~eggfuse.models.causal_lm.CausalLM` of the GGUF file at ``path`` (None: the
    shipped SmolLM2-135M) with its weights stored as ``weights`` says (``CausalLM.load``: ``"f32"``,
    a block format such as ``"q4_1"``, or ``"f16"``), from the model cache when an entry for this
    file and ``weights`` exists, else loaded with ``CausalLM.load`` and stored (``cache=False``:
    loaded, neither read nor stored). :func:`cache_status` tells which. Raises InputError for an
    unknown ``weights``, ModelError as ``CausalLM.load``."""
    from eggfuse.models import gguf
    from eggfuse.models.causal_lm import CausalLM

    gguf.check_weights(weights)
    source = Path(gguf.find_gguf() if path is None else path)
    if not cache:
        return _mark(CausalLM.load(source, rope_pairing=rope_pairing, weights=weights), "off")
    store = ModelCache()
    try:
        key = store.key(source, rope_pairing, weights)
    except (OSError, Unstorable):  # no such file (CausalLM.load says so), or eggfuse's sources unreadable
        return _mark(CausalLM.load(source, rope_pairing=rope_pairing, weights=weights), "off")
    model = store.load(key)
    if model is not None:
        return _mark(model, "hit")
    model = CausalLM.load(source, rope_pairing=rope_pairing, weights=weights)
    t = time.perf_counter()
    store.store(key, model, source)
    with contextlib.suppress(TypeError):
        _write_s[model] = time.perf_counter() - t
    return _mark(model, "miss")


def gguf_config(path: str | os.PathLike | None = None, *, cache: bool = True):
    """The :class:`~eggfuse.models.llama.LlamaConfig` of the GGUF file at ``path`` (None: the
    shipped SmolLM2-135M), as ``LlamaConfig.from_gguf`` reads it, kept in a config entry of the
    model cache (``<key>.config``, keyed as a model entry, with the same checks): the reader parses
    the whole file's metadata, tokenizer included, 2 s for SmolLM2 here, where the entry takes about
    15 ms (most of it hashing the file's head for the key), so building the model's graph
    (``eggfuse optimize smollm2``, each worker of a sweep) skips it. ``cache=False`` reads the
    file and stores nothing. Raises ModelError as ``from_gguf``."""
    from eggfuse.models import gguf
    from eggfuse.models.llama import LlamaConfig

    source = Path(gguf.find_gguf() if path is None else path)
    if not cache:
        return LlamaConfig.from_gguf(source)
    store = ModelCache()
    try:
        key = store.key(source, "config")
    except (OSError, Unstorable):
        return LlamaConfig.from_gguf(source)
    entry = store.folder / f"{key}.config"
    try:
        raw = entry.read_bytes()
    except OSError:
        raw = None
    if raw is not None:
        try:
            body = verified_body(raw, key, "eggfuse_config_cache", FORMAT)
            return LlamaConfig(**{str(k): _value(v) for k, v in body["config"].items()})
        except Exception as e:  # noqa: BLE001 - an entry that does not read back is ignored and rewritten
            log.warning("eggfuse: ignoring config entry %s (%s: %s); it is rewritten", entry, type(e).__name__, e)
    config = LlamaConfig.from_gguf(source)
    body = {"key": key, "config": {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}}
    origin = str(source.expanduser().resolve())
    try:
        write_replacing(entry, store.folder / f".{key}.config.{os.getpid()}.tmp",
                        framed("eggfuse_config_cache", FORMAT, key, json.dumps(body, separators=(",", ":")).encode(),
                               source=origin))
    except OSError as e:
        log.warning("eggfuse: cannot write the model cache in %s (%s); continuing without it", store.folder, e)
        return config
    for other in store.folder.glob("*.config"):  # one config entry per file
        if other != entry and _header(other).get("source") == origin:
            other.unlink(missing_ok=True)
    return config


def cache_status(model) -> str | None:
    """``hit``, ``miss`` or ``off``: how :func:`load_gguf` got ``model``; None for a model it
    did not load (a Hugging Face folder, a model built by the caller)."""
    try:
        return _status.get(model)
    except TypeError:
        return None


def write_seconds(model) -> float | None:
    """Seconds :func:`load_gguf` spent storing ``model``'s entry (a miss), else None."""
    try:
        return _write_s.get(model)
    except TypeError:
        return None


def _mark(model, status: str):
    with contextlib.suppress(TypeError):
        _status[model] = status
    return model


def source_identity(path: Path) -> dict[str, Any]:
    """The GGUF file as the key sees it: resolved path, size in bytes, modification time (ns)
    and the SHA-256 of its first :data:`HEAD_BYTES` bytes. Raises OSError."""
    path = path.expanduser().resolve()
    st = path.stat()
    with path.open("rb") as f:
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_sha256": head}


class ModelCache:
    """The model entries in ``folder`` (default ``cache_dir() / "models"``)."""

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self.folder = Path(folder) if folder is not None else cache_dir() / "models"

    def key(self, source: Path, rope_pairing: str, weights: str = "f32") -> str:
        """The key (64 hex digits) of ``source`` loaded with ``rope_pairing`` and its weights stored as
        ``weights``. Raises OSError."""
        import importlib.metadata as md

        doc = {"format": FORMAT, "source": source_identity(source), "rope_pairing": rope_pairing, "weights": weights,
               "versions": {**versions(), **{d: md.version(d) for d in ("gguf", "tokenizers", "numpy")}}}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def paths(self, key: str) -> tuple[Path, Path]:
        return self.folder / f"{key}.model", self.folder / f"{key}.weights"

    def load(self, key: str):
        """The model of entry ``key``, its arrays read-only views of the memory-mapped weights
        file; None when there is none or it does not check out (logged; then rewritten)."""
        meta, weights = self.paths(key)
        try:
            raw = meta.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("eggfuse: cannot read model-cache entry %s (%s); loading the file instead", meta, e)
            return None
        try:
            return _decode(verified_body(raw, key, "eggfuse_model_cache", FORMAT), weights)
        except Exception as e:  # noqa: BLE001 - any failure to read an entry back means: ignore it
            log.warning("eggfuse: ignoring model-cache entry %s (%s: %s); it is rewritten", meta, type(e).__name__, e)
            return None

    def store(self, key: str, model, source: Path) -> Path | None:
        """Write the entry of ``key`` for ``model`` loaded from ``source``, then remove the other
        entries of that file with weights stored as ``model``'s are (and those of another format); returns
        the ``.model`` path, or None when the model cannot be stored (logged at INFO) or the folder cannot be
        written (a warning)."""
        try:
            body, arrays = _encode(model)
        except Unstorable as e:
            log.info("eggfuse: not caching model %s: %s", source, e)
            return None
        meta, weights = self.paths(key)
        offsets, end = [], 0
        for a in arrays:
            offsets.append(end)
            end += -(-a.nbytes // _ALIGN) * _ALIGN
        for entry, offset in zip(body["arrays"], offsets, strict=True):
            entry["offset"] = offset
        body.update(key=key, weights_bytes=end, created=time.time())
        text = json.dumps(body, separators=(",", ":")).encode()
        origin = str(source.expanduser().resolve())
        temps = [self.folder / f".{key}.{kind}.{os.getpid()}.tmp" for kind in ("weights", "model")]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with temps[0].open("wb") as f:
                for a, offset in zip(arrays, offsets, strict=True):
                    f.seek(offset)
                    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
                f.truncate(end)
            temps[1].write_bytes(framed("eggfuse_model_cache", FORMAT, key, text, source=origin,
                                        weights=model.weights))
            os.replace(temps[0], weights)
            os.replace(temps[1], meta)
        except OSError as e:
            log.warning("eggfuse: cannot write the model cache in %s (%s); continuing without it", self.folder, e)
            for t in temps:
                with contextlib.suppress(OSError):
                    t.unlink(missing_ok=True)
            return None
        for other in self.entries():
            header = _header(other)
            stale = header.get("eggfuse_model_cache") != FORMAT or header.get("weights") == model.weights
            if other != meta and header.get("source") == origin and stale:
                _remove(self, other.name[:-len(".model")])
        return meta

    def entries(self) -> list[Path]:
        """The ``.model`` files, by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if _ENTRY.match(p.name) and p.is_file())

    def configs(self) -> list[Path]:
        """The config entries (``<key>.config``, :func:`gguf_config`), by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if _CONFIG.match(p.name) and p.is_file())

    def info(self) -> dict[str, Any]:
        """``folder`` (str), ``entries`` (count of model entries), ``configs`` (count of config
        entries) and ``bytes`` (every file of them)."""
        entries, configs = self.entries(), self.configs()
        size = 0
        for p in entries:
            for q in self.paths(p.name[:-len(".model")]):
                with contextlib.suppress(OSError):
                    size += q.stat().st_size
        for p in configs:
            with contextlib.suppress(OSError):
                size += p.stat().st_size
        return {"folder": str(self.folder), "entries": len(entries), "configs": len(configs), "bytes": size}

    def clear(self) -> int:
        """Remove every entry, config entries too (and temporary files a killed write left);
        returns the number of model entries removed."""
        removed = 0
        for p in self.entries():
            _remove(self, p.name[:-len(".model")])
            removed += 1
        for p in self.configs():
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
        if self.folder.is_dir():
            for p in self.folder.iterdir():
                if _TEMP.match(p.name) or (p.name.endswith(".weights") and not self.paths(p.stem)[0].exists()):
                    p.unlink(missing_ok=True)
        return removed


def _remove(store: ModelCache, key: str) -> None:
    for p in store.paths(key):  # a reader that mapped the weights keeps its (unlinked) file
        with contextlib.suppress(OSError):
            p.unlink(missing_ok=True)


def _header(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return {}




# --- a model <-> an entry -------------------------------------------------------------------


def _encode(model) -> tuple[dict, list[np.ndarray]]:
    # The body (without offsets) and the arrays of ``model``; Unstorable for what it cannot hold.
    from eggfuse.models.causal_lm import CausalLM

    if type(model) is not CausalLM:
        raise Unstorable(f"a {type(model).__name__}, not a CausalLM")
    have = set(vars(model))
    if have != _MODEL_FIELDS:
        raise Unstorable(f"CausalLM attributes the model cache does not know: {sorted(have ^ _MODEL_FIELDS)}")
    config = {f.name: _plain(getattr(model.config, f.name)) for f in dataclasses.fields(model.config)}
    arrays, table = [], []
    for name, a in model.params.items():
        if not isinstance(a, np.ndarray) or a.dtype.hasobject or not a.dtype.isnative:
            raise Unstorable(f"parameter {name!r} is not a numpy array of plain numbers")
        a = np.ascontiguousarray(a)
        arrays.append(a)
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes,
                      "crc32": zlib.crc32(memoryview(a).cast("B"))})
    chat = model.chat
    return {
        "config": config, "tokenizer": model.tokenizer.to_str(), "bos_id": model.bos_id,
        "eos_ids": list(model.eos_ids), "rope_pairing": model.rope_pairing, "name": model.name,
        "kind": model.kind, "dtype": model.dtype, "arrays": table, "weights": model.weights, "quant": model.quant,
        "chat": None if chat is None else {"source": chat.source, "tokens": chat.tokens, "where": chat.where},
    }, arrays


def _decode(body: dict, weights: Path):
    # The model of a verified body, its arrays views of ``weights``; CorruptEntry when the
    # weights file is not the one the body describes.
    from tokenizers import Tokenizer

    from eggfuse.models.causal_lm import CausalLM
    from eggfuse.models.llama import LlamaConfig
    from eggfuse.models.text import ChatTemplate

    data = _map(weights, int(body["weights_bytes"]))
    params = {}
    for entry in body["arrays"]:
        dtype, offset, nbytes = np.dtype(entry["dtype"]), int(entry["offset"]), int(entry["nbytes"])
        shape = tuple(int(d) for d in entry["shape"])
        if offset % _ALIGN or offset + nbytes > len(data) or nbytes != dtype.itemsize * int(np.prod(shape)):
            raise CorruptEntry(f"array {entry['name']!r} does not fit the weights file")
        if zlib.crc32(data[offset:offset + nbytes]) != entry["crc32"]:
            raise CorruptEntry(f"array {entry['name']!r}: CRC-32 mismatch")
        params[str(entry["name"])] = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize,
                                                   offset=offset).reshape(shape)
    config = LlamaConfig(**{str(k): _value(v) for k, v in body["config"].items()})
    chat = body["chat"]
    if chat is not None:
        chat = ChatTemplate(chat["source"], chat["tokens"], chat["where"])
    return CausalLM(config, params, Tokenizer.from_str(body["tokenizer"]), bos_id=body["bos_id"],
                    eos_ids=body["eos_ids"], chat=chat, rope_pairing=body["rope_pairing"], name=body["name"],
                    kind=body["kind"], dtype=body["dtype"], quant=body["quant"], weights=body["weights"])


def _map(path: Path, size: int) -> memoryview:
    # The weights file, mapped read-only (and read in at once where the OS offers MAP_POPULATE).
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size != size:
            raise CorruptEntry(f"the weights file has {os.fstat(f.fileno()).st_size} bytes, not {size}")
        if size == 0:
            return memoryview(b"")
        flags = getattr(mmap, "MAP_SHARED", 0) | getattr(mmap, "MAP_POPULATE", 0)
        try:
            m = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
        except (AttributeError, TypeError, ValueError):  # no flags/prot on this OS
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    return memoryview(m)


__all__ = ["ModelCache", "cache_status", "load_gguf", "source_identity", "write_seconds"]
