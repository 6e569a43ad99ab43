"""WGSL sources: loading from the ``eggfuse.shaders`` package data, includes, templating,
the generated binding header of a kernel, and packing of its uniform parameters."""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources

from ..ir.errors import LoweringError
from ..ir.kernel import PARAM_TYPES, Buffer, Include

_INCLUDE = re.compile(r'^//#include "([\w.]+)"\s*$', re.MULTILINE)
_SLOT = re.compile(r"\{\{(\w+)\}\}")

#: Includes that have a form with subgroup operations, used while :func:`subgroups` is on.
#: On the H200 the cached-attention form took CachedAttentionRoPE from 32.7 to 14.3 us per
#: call at 128 keys and from 63.4 to 26.5 us at 1000 (SmolLM2 decode), and the row
#: reductions were unchanged. The GEMV's lane sums (matmul_gemv_reduce.wgsl) as subgroup shuffles
#: where a column's lanes fit in one subgroup: SmolLM2's decode step 5 us faster in GPU time,
#: 907.8 / 974.6 against 912.6 / 979.6 us on Q4_1 blocks / in f32, means of three rounds
#: (bench/results/gemv_prologue_h200/butterfly_ab_rule.json); an earlier subgroup form, of an
#: earlier session, was 15% slower there.
SUBGROUP_FORMS = {
    "reduce.wgsl": "reduce_subgroup.wgsl",
    "attention_cached_chunk.wgsl": "attention_cached_chunk_subgroup.wgsl",
    "matmul_gemv_reduce.wgsl": "matmul_gemv_reduce_subgroup.wgsl",
    "row_lanes.wgsl": "row_lanes_subgroup.wgsl",
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


_ARRAY_PARAM = re.compile(r"^array<(vec4<(?:f32|u32|i32)>), (\d+)>$")


def _param_layout(wgsl_type: str) -> tuple[int, int, int]:
    """(alignment, size in bytes, scalar count) of a uniform field type (WGSL's layout rules:
    https://www.w3.org/TR/WGSL/#alignment-and-size)."""
    if wgsl_type in ("u32", "i32", "f32"):
        return 4, 4, 1
    if wgsl_type in PARAM_TYPES:  # vec4
        return 16, 16, 4
    m = _ARRAY_PARAM.match(wgsl_type)
    if m:
        return 16, 16 * int(m.group(2)), 4 * int(m.group(2))
    raise LoweringError(f"uniform field type {wgsl_type!r} is not one of {', '.join(PARAM_TYPES)} "
                        "or array<vec4<f32|u32|i32>, N>")


def _scalar_bytes(wgsl_type: str, value) -> bytes:
    base = re.search(r"[fiu]32", wgsl_type).group(0)
    if base == "f32":
        return struct.pack("<f", float(value))
    v = int(value)
    if base == "u32":
        if not 0 <= v < 2**32:
            raise LoweringError(f"uniform value {value} does not fit in u32")
        return struct.pack("<I", v)
    if not -(2**31) <= v < 2**31:
        raise LoweringError(f"uniform value {value} does not fit in i32")
    return struct.pack("<i", v)


def pack_params(params) -> tuple[str, bytes]:
    """The WGSL ``struct Params`` declaring ``params`` ((name, type, value) in order) and the
    bytes of one instance, laid out by WGSL's uniform rules and padded to 16 bytes.

    Raises LoweringError for an unsupported type, a value of the wrong length or one that
    does not fit its type.
    """
    lines, out = [], bytearray()
    for name, wgsl_type, value in params:
        align, size, count = _param_layout(wgsl_type)
        out += bytes(-len(out) % align)
        values = [value] if count == 1 else list(value)
        if len(values) != count:
            raise LoweringError(f"uniform field {name}: {wgsl_type} takes {count} values, got {len(values)}")
        for v in values:
            out += _scalar_bytes(wgsl_type, v)
        lines.append(f"    {name}: {wgsl_type},")
    out += bytes(-len(out) % 16)
    return "struct Params {\n" + "\n".join(lines) + "\n}", bytes(out)


def _literal(name: str, wgsl_type: str, value) -> str:
    # a WGSL literal of a uniform field's value, the float as the double of its f32 (exact)
    if wgsl_type == "f32":
        f = struct.unpack("<f", _scalar_bytes("f32", value))[0]
        if not math.isfinite(f):
            raise LoweringError(f"uniform field {name}: {value!r} has no WGSL literal; pass it in the uniform")
        return f"{f!r}f"
    if wgsl_type in ("u32", "i32"):
        _scalar_bytes(wgsl_type, value)  # range check
        if wgsl_type == "i32" and int(value) == -(2**31):
            return "(-2147483647i - 1i)"  # -2147483648i is not a WGSL literal (its magnitude is past i32)
        return f"{int(value)}{wgsl_type[0]}"
    raise LoweringError(f"uniform field {name}: type {wgsl_type!r} has no constant form here (only u32, i32 and f32); "
                        "pass it in the uniform")


def literal_params(params) -> bool:
    """Whether every field of ``params`` ((name, type, value)) has a WGSL literal, so that
    :func:`binding_header` can make them a module constant: u32, i32 and finite f32 values."""
    try:
        for name, wgsl_type, value in params:
            _literal(name, wgsl_type, value)
    except LoweringError:
        return False
    return True


def binding_header(bindings: tuple[Buffer, ...], params, constant: bool = False) -> tuple[str, bytes]:
    """The generated head of a kernel: one ``@binding`` per storage buffer in order, then the
    ``Params`` struct and its uniform binding (when ``params`` is not empty); and the uniform's
    bytes. ``constant``: ``p`` is instead a module constant holding the values (scalar fields only),
    the uniform kept bound as ``p_bound`` (the runtime binds it as for any kernel), so the driver's
    compiler folds the shapes into the code."""
    lines = ["// ---- bindings (generated by lowering from the kernel's signature) ----"]
    for i, b in enumerate(bindings):
        access = "read_write" if b.write else "read"
        lines.append(f"@group(0) @binding({i}) var<storage, {access}> {b.name}: array<{b.elem}>;")
    data = b""
    if params:
        struct_text, data = pack_params(params)
        if constant:
            values = ", ".join(_literal(n, t, v) for n, t, v in params)
            lines += [struct_text, f"@group(0) @binding({len(bindings)}) var<uniform> p_bound: Params;",
                      f"const p = Params({values});"]
        else:
            lines += [struct_text, f"@group(0) @binding({len(bindings)}) var<uniform> p: Params;"]
    return "\n".join(lines) + "\n", data


_CONSTANT_HEADER = re.compile(
    r"^(@group\(0\) @binding\(\d+\) var<uniform> )p_bound(: Params;)\nconst p = Params\(.*\);$", re.MULTILINE)


def uniform_form(source: str) -> str | None:
    """The kernel ``source`` with its parameters read from the uniform again, for one rendered with them as a
    module constant (:func:`binding_header` ``constant=True``); None for a source without such a header. The
    runtime compiles it where the constant form does not compile: WGSL evaluates constant expressions when the
    shader is created, so an expression the uniform form computes at run time (a division by a size of 0, a
    float that overflows, a constant index past a fixed-size array, even in code that never runs) is an error
    there."""
    form, count = _CONSTANT_HEADER.subn(r"\1p\2", source, count=1)
    return form if count else None


def render_kernel(body: str, bindings: tuple[Buffer, ...], params, slots, constant: bool = False) -> tuple[str, bytes]:
    """The WGSL of a kernel (generated header, then ``shaders/<body>`` with includes expanded and
    slots filled) and its uniform bytes; ``constant``: the parameters as a module constant
    (:func:`binding_header`)."""
    head, data = binding_header(bindings, params, constant)
    filled = {k: shader_text(v.file) if isinstance(v, Include) else v for k, v in slots.items()}
    return head + render(body, **filled), data
