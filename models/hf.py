"""Model files: recognising a Hugging Face model folder or a GGUF file, and reading a folder's
config and safetensors weights.

A Hugging Face folder is recognised by its ``config.json`` and that file's ``model_type``;
a sentence-transformers folder whose ``modules.json`` puts the transformer in a subfolder
(``0_Transformer``) is followed there. Weights are ``model.safetensors``, or the shards that
``model.safetensors.index.json`` lists (``model-00001-of-00002.safetensors`` ...), read with
the ``safetensors`` library (bfloat16 through ``ml_dtypes``). Both generations of config
files are read: ``torch_dtype`` (transformers 4) or ``dtype`` (transformers 5), and for
decoders ``rope_theta`` + ``rope_scaling`` or ``rope_parameters`` (see :mod:`.hf_llama`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from eggfuse.ir import InputError, ModelError

from .config_fields import json_kind, read_json, read_json_object

#: model_type values of the decoders (:mod:`.hf_llama`) and encoders (:mod:`.minilm`) that load.
DECODER_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta")
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = ("float32", "float16", "bfloat16")


def load_model(path: Any, *, weights: str = "f32"):
    """The model at ``path``: a :class:`.causal_lm.CausalLM` for a ``.gguf`` file or a folder of
    a decoder (``model_type`` in :data:`DECODER_TYPES`), a :class:`.minilm.SentenceEncoder` for
    a folder of an encoder (:data:`ENCODER_TYPES`). ``path`` may also name the folder's
    ``config.json``. ``weights`` is a decoder's weight storage (:data:`.gguf.WEIGHTS`): ``f32``,
    a block format (a GGUF file's Q4_0/Q4_1/Q8_0 tensors kept as stored, other 2-D weights
    quantised to it) or ``f16`` (every 2-D weight rounded to float16; see
    :meth:`.causal_lm.CausalLM.with_weights`).

    Raises :class:`InputError` for a ``path`` that is not a str or path object, an unknown ``weights``, or
    one other than ``f32`` for an encoder; :class:`ModelError` naming the path and the file or setting at fault: no such
    path, no ``config.json``, an unsupported ``model_type`` or setting, missing weights or
    tensors.
    """
    from .gguf import check_weights

    check_weights(weights)
    if not isinstance(path, str | os.PathLike):
        raise InputError(f"load_model takes a path (str or pathlib.Path) to a Hugging Face model folder or a .gguf "
                         f"file, got {path!r} ({type(path).__name__})")
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        from .causal_lm import CausalLM

        return CausalLM.load(p, weights=weights)
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not p.exists():
        raise ModelError(f"{p}: no such file or folder (give a Hugging Face model folder or a .gguf file)")
    if not p.is_dir():
        raise ModelError(f"{p}: not a model: give a Hugging Face model folder (with config.json) or a .gguf file")
    folder = transformer_folder(p)
    raw = read_config(folder)
    model_type = raw.get("model_type")
    if model_type in DECODER_TYPES:
        from .hf_llama import load_causal_lm

        return load_causal_lm(folder, raw).with_weights(weights)
    if model_type in ENCODER_TYPES:
        if weights != "f32":
            raise InputError(f"{folder}: weights={weights!r} applies to decoders; encoders run in f32")
        from .minilm import SentenceEncoder

        return SentenceEncoder.load(p)
    raise ModelError(f"{folder / 'config.json'}: model_type {model_type!r} is not supported; supported: "
                     f"{', '.join(DECODER_TYPES)} (decoders), {', '.join(ENCODER_TYPES)} (encoders)")


def read_modules(root: Path) -> list[dict] | None:
    """The modules a sentence-transformers ``modules.json`` of ``root`` lists (None without the
    file): an array of objects whose ``type`` and ``path`` are strings. Raises
    :class:`ModelError` naming the file and the entry otherwise."""
    path = root / "modules.json"
    if not path.is_file():
        return None
    modules = read_json(path)
    if not isinstance(modules, list):
        raise ModelError(f"{path}: must hold a JSON array of module objects ({{\"type\": ..., \"path\": ...}}), "
                         f"got a JSON {json_kind(modules)}; correct or replace the file")
    for i, module in enumerate(modules):
        if not isinstance(module, dict):
            raise ModelError(f"{path}: entry {i} must be a module object ({{\"type\": ..., \"path\": ...}}), "
                             f"got {module!r}; correct it in the file")
        for key in ("type", "path"):
            if not isinstance(module.get(key, ""), str):
                raise ModelError(f"{path}: entry {i}: {key} must be a string, got {module[key]!r}; correct it in "
                                 "the file")
    return modules


def transformer_folder(root: Path) -> Path:
    """The folder holding the transformer's config.json: ``root``, or the path of the
    ``Transformer`` module that a sentence-transformers ``modules.json`` names (ModelError
    for a malformed one, see :func:`read_modules`)."""
    for module in read_modules(root) or []:
        if module.get("type", "").endswith(".Transformer"):
            return root / module.get("path", "")
    return root


def read_config(folder: Path) -> dict:
    """``config.json`` of a model folder as a dict; ModelError when it is missing or malformed."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder}: not a Hugging Face model folder: no config.json (and not a .gguf file)")
    raw = read_json_object(path)
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "?") if isinstance(raw["quantization_config"],
                                                                                  dict) else "?"
        raise ModelError(f"{path}: quantized checkpoints (quantization_config, {method!r}) are not supported; "
                         "use the unquantized model")
    return raw


def config_dtype(raw: dict, where: str) -> str:
    """The stored weights' type a config names: ``dtype`` (transformers 5) or ``torch_dtype``
    (transformers 4); ``float32`` when neither is set. ModelError for another type."""
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ModelError(f"{where}: dtype {dtype!r} is not supported (only {', '.join(DTYPES)})")
    return dtype


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: the shards of ``model.safetensors.index.json`` if
    present, else ``model.safetensors``. Raises ModelError naming what is missing."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = _weight_map(index)
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{folder}: missing weight shard(s) {', '.join(missing)} listed in {INDEX_FILE}")
        return files
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
        hint = (f"; the folder has {', '.join(others)} only: save it as safetensors (transformers: "
                "model.save_pretrained(dir, safe_serialization=True))") if others else ""
        raise ModelError(f"{folder}: missing {WEIGHTS_FILE} (or {INDEX_FILE} with its shards){hint}")
    return [path]


def _weight_map(index: Path) -> dict[str, str]:
    # model.safetensors.index.json's tensor name -> shard file name
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelError(f"{index}: no weight_map (tensor name -> shard file)")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise ModelError(f"{index}: weight_map[{name!r}] must be a shard's file name, got {shard!r}; correct it "
                             "in the file")
    return weight_map


class Weights(dict):
    """:func:`load_safetensors`'s tensors by name; ``skipped`` maps each tensor left out for not being floats to
    its dtype's name and file, for the message of a weight found missing."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[str, tuple[str, Path]] = {}
        self.files: dict[str, Path] = {}  # each tensor's file

    def check_finite(self, name: str) -> None:
        """Raise :class:`ModelError` naming the file and tensor ``name`` where it holds a NaN or an infinity."""
        arr = self[name]
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if bad:
            raise ModelError(f"{self.files.get(name, 'the weights')}: tensor {name!r} holds NaN or infinity ({bad} of "
                             f"{arr.size} elements): the weights are damaged; export or download them again")

    def not_float(self, name: str) -> str:
        """Why ``name`` is missing where the file holds it in another dtype ("" where it holds none)."""
        if name not in self.skipped:
            return ""
        dtype, path = self.skipped[name]
        return (f"{path}: tensor {name!r} is stored as {dtype}; eggfuse reads weights stored as floats (f32, f16 "
                "or bf16): save it as one")


def load_safetensors(folder: Path, *, prefixes: tuple[str, ...] = (), hint: str = "") -> Weights:
    """Every floating-point tensor of a folder's safetensors files, as float32 arrays by name.

    A name starting with one of ``prefixes`` loses it (``bert.``, ``roberta.``: checkpoints
    saved from a model with a task head carry the base model's prefix). Integer buffers
    (``position_ids``) are left out, named in the result's ``skipped`` (:class:`Weights`). ``hint`` ends the
    message of a file that cannot be read.
    Raises :class:`ModelError` naming the file (missing, unreadable, a Git LFS pointer
    instead of the weights), or a tensor that the index assigns to a shard lacking it.
    """
    from safetensors.numpy import load_file

    try:
        import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy, which safetensors then reads
    except ImportError:
        pass
    weights = Weights()
    seen: set[str] = set()
    for path in weight_files(folder):
        try:
            raw = load_file(str(path))
        except TypeError as e:  # bfloat16 without ml_dtypes: "data type 'bfloat16' not understood"
            raise ModelError(f"{path}: cannot read its tensors ({e}); install ml_dtypes") from None
        except Exception as e:  # noqa: BLE001 - safetensors raises its own untyped errors
            with open(path, "rb") as f:
                lfs = f.read(64).startswith(b"version https://git-lfs")
            why = " (it is a Git LFS pointer, not the weights: fetch them with git lfs pull)" if lfs else ""
            raise ModelError(f"{path}: cannot read safetensors ({e}){why}{hint}") from None
        seen.update(raw)
        for name, arr in raw.items():
            if np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16":
                weights[_strip(name, prefixes)] = np.ascontiguousarray(arr, dtype=np.float32)
                weights.files[_strip(name, prefixes)] = path
            else:
                weights.skipped[_strip(name, prefixes)] = (arr.dtype.name, path)
    if (folder / INDEX_FILE).is_file():
        for name, shard in _weight_map(folder / INDEX_FILE).items():
            if name not in seen:
                raise ModelError(f"{folder / shard}: lacks tensor {name!r}, which {INDEX_FILE} places there")
    return weights


def _strip(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
