"""WGSL sources: loading from the ``eggfuse.shaders`` package data, includes, templating,
and packing of uniform parameters."""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources

from ..ir.errors import LoweringError

_INCLUDE = re.compile(r'^//#include "([\w.]+)"\s*$', re.MULTILINE)
_SLOT = re.compile(r"\{\{(\w+)\}\}")

#: Includes that have a form with subgroup operations, used while :func:`subgroups` is on.
#: On the H200 the cached-attention form took CachedAttentionRoPE from 32.7 to 14.3 us per
#: call at 128 keys and from 63.4 to 26.5 us at 1000 (SmolLM2 decode), and the row
#: reductions were unchanged; a subgroup form of the GEMV's lane sums
#: (matmul_gemv_reduce.wgsl) was 15% slower there, so it has none.
SUBGROUP_FORMS = {
    "reduce.wgsl": "reduce_subgroup.wgsl",
    "attention_cached_chunk.wgsl": "attention_cached_chunk_subgroup.wgsl",
}


class SubgroupUse:
    """What :func:`subgroups` yields: ``used`` turns true once :func:`render` includes a
    subgroup form in its block."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.used = False


_use_subgroups: ContextVar[SubgroupUse | None] = ContextVar("eggfuse_wgsl_subgroups", default=None)


@contextmanager
def subgroups(enabled: bool) -> Iterator[SubgroupUse]:
    """Within the block, :func:`render` includes the subgroup form of each include in
    :data:`SUBGROUP_FORMS` when ``enabled`` (the device must have usable subgroups:
    runtime.device.subgroup_reductions_usable). Yields a :class:`SubgroupUse` that says
    whether any was included."""
    use = SubgroupUse(bool(enabled))
    token = _use_subgroups.set(use)
    try:
        yield use
    finally:
        _use_subgroups.reset(token)


@functools.cache
def shader_text(name: str) -> str:
    """The raw text of ``shaders/<name>``; raises LoweringError when there is no such file."""
    try:
        return resources.files("eggfuse.shaders").joinpath(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoweringError(f"WGSL file {name!r} is missing from eggfuse.shaders") from None


def _expand(name: str, seen: set[str]) -> str:
    # Each file is pulled in once, so helpers included by two includes are not duplicated.
    def sub(match: re.Match) -> str:
        inc = match.group(1)
        use = _use_subgroups.get()
        if use is not None and use.enabled and inc in SUBGROUP_FORMS:
            inc = SUBGROUP_FORMS[inc]
            use.used = True
        if inc in seen:
            return f"// (already included: {inc})"
        seen.add(inc)
        return f"// ---- begin {inc} ----\n{_expand(inc, seen)}// ---- end {inc} ----"

    return _INCLUDE.sub(sub, shader_text(name))


def render(name: str, **slots: object) -> str:
    """WGSL of ``shaders/<name>`` with includes expanded (their subgroup forms within
    :func:`subgroups`) and ``{{SLOT}}`` markers filled.

    Raises LoweringError if the file has a slot that ``slots`` does not fill, or if a slot
    given is not in the file (a typo would otherwise go unnoticed).
    """
    text = _expand(name, {name})
    wanted = set(_SLOT.findall(text))
    missing = wanted - set(slots)
    unused = set(slots) - wanted
    if missing or unused:
        raise LoweringError(f"template {name}: unfilled slots {sorted(missing)}, "
                            f"unknown slots {sorted(unused)}")
    return _SLOT.sub(lambda m: str(slots[m.group(1)]), text)


def uniform_bytes(*values: int | float) -> bytes:
    """Pack uniform fields in order: Python floats as f32, ints as u32; padded to 16 bytes.

    The order must match the kernel's ``Params`` struct; a struct whose vec4 or array
    members come first (16-byte aligned) packs with no gaps. Raises LoweringError for an
    int outside u32.
    """
    out = bytearray()
    for v in values:
        if isinstance(v, float):
            out += struct.pack("<f", v)
        else:
            if not 0 <= int(v) < 2**32:
                raise LoweringError(f"uniform value {v} does not fit in u32")
            out += struct.pack("<I", int(v))
    out += bytes(-len(out) % 16)
    return bytes(out)
