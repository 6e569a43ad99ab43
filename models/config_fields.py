"""Reading a model folder's JSON files with their values checked.

Every Hugging Face and sentence-transformers file a folder holds (``config.json``,
``generation_config.json``, ``tokenizer_config.json``, ``modules.json``, ...) is read here, so
that a malformed one is refused with a :class:`ModelError` naming the file, the key, the value
and what was expected, rather than failing in Python (a list where an object belongs) or read
as something else (an id of 4.7 truncated to 4, -1 layers taken as none). Types follow JSON: an
integer is a JSON integer (not a float, not a bool), a number an integer or a float.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from eggfuse.ir import ModelError

_MISSING = object()


def read_json(path: Path, what: str = "") -> Any:
    """The JSON document at ``path``; ModelError naming the file if it is unreadable or malformed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"{path}: cannot read {what or path.name} ({e.strerror or e})") from None
    except ValueError as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None


def json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type (object, array, string, number, boolean, null)."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def read_json_object(path: Path) -> dict:
    """The JSON object (a dict) at ``path``; ModelError naming the file when it holds anything else."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ModelError(f"{path}: must hold a JSON object ({{\"key\": value, ...}}), got a JSON {json_kind(data)}; "
                         "correct or replace the file")
    return data


def is_int(value: Any) -> bool:
    """Whether a decoded JSON value is an integer (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether a decoded JSON value is a finite integer or float (a bool is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ConfigFields:
    """Typed reads of the keys of one JSON object ``raw`` of the file ``where``.

    A key that is absent or null takes ``default``; without one it is missing, and the
    message says it is what ``needed_by`` needs. ``prefix`` names a nested object in messages
    (``rope_scaling.``). Each getter raises :class:`ModelError` naming file, key and value.
    """

    def __init__(self, raw: dict, where: str | Path, needed_by: str = "the model", prefix: str = "") -> None:
        self.raw, self.where, self.needed_by, self.prefix = raw, str(where), needed_by, prefix

    def fail(self, key: str, value: Any, expected: str) -> ModelError:
        """The error for ``key``'s ``value``, which should have been ``expected``."""
        return ModelError(f"{self.where}: {self.prefix}{key} must be {expected}, got {value!r}; correct it in the file")

    def _value(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        if value is None and default is _MISSING:
            raise ModelError(f"{self.where}: lacks {self.prefix + key!r}, which {self.needed_by} needs")
        return value

    def integer(self, key: str, *, minimum: int = 1, default: Any = _MISSING) -> Any:
        """``key`` as an integer >= ``minimum`` (``default`` when absent or null)."""
        value = self._value(key, default)
        if value is None:
            return default
        if not is_int(value) or value < minimum:
            raise self.fail(key, value, f"an integer >= {minimum}")
        return value

    def number(self, key: str, *, positive: bool = True, default: Any = _MISSING) -> Any:
        """``key`` as a finite float, > 0 when ``positive`` (``default`` when absent or null)."""
        value = self._value(key, default)
        if value is None:
            return default
        if not is_number(value) or (positive and value <= 0):
            raise self.fail(key, value, "a positive finite number" if positive else "a finite number")
        return float(value)

    def flag(self, key: str, *, default: Any = False) -> Any:
        """``key`` as a bool: JSON true or false (``default`` when absent or null)."""
        value = self._value(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    def token_ids(self, key: str, vocab_size: int | None = None) -> list[int]:
        """``key`` as token ids, as configs store them: an integer, a list of integers, or null
        (none). With ``vocab_size``, each must lie in [0, vocab_size)."""
        value = self.raw.get(key)
        if value is None:
            return []
        ids = value if isinstance(value, list) else [value]
        span = "an integer >= 0" if vocab_size is None else f"an integer in [0, vocab_size {vocab_size})"
        if not all(is_int(i) and i >= 0 and (vocab_size is None or i < vocab_size) for i in ids):
            raise self.fail(key, value, f"a token id ({span}) or a list of them")
        return list(ids)
