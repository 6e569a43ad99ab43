"""A check shared by the encoder and decoder folder tests: a malformed config.json value is a ModelError naming
the file, the key, what it must be and the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eggfuse
from eggfuse.ir import ModelError


def check_config_value_refused(folder: Path, key: str, value, expected: str) -> None:
    """Write ``key: value`` into ``folder``'s config.json and assert that loading the folder raises the ModelError
    naming the file, the key, what it must be (``expected``) and the value."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ModelError) as err:
        eggfuse.load_model(folder)
    assert str(err.value) == f"{path}: {key} must be {expected}, got {value!r}; correct it in the file"
