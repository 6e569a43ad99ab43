"""wgpu-py's C types parsed in one pass (runtime/bindings.py): the same cffi types as cffi's own
parse, and every type a session's life uses among them. Each check runs in a fresh interpreter,
where cffi has parsed nothing yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SAME_AS_CFFI = r"""
import json
from wgpu.backends.wgpu_native._ffi import ffi
from eggfuse.runtime.bindings import TYPES, warm_types
before = sum(t in ffi._parsed_types for t in TYPES)  # wgpu-py's import parses its logging callback's
added = warm_types()
warmed = {t: ffi._parsed_types[t] for t in TYPES}
for t in TYPES:
    del ffi._parsed_types[t]
with ffi._lock:  # cffi's own parse of each, as ffi.typeof does it
    differ = [t for t in TYPES if ffi._typeof_locked(t) != warmed[t]]
print(json.dumps({"added": added, "before": before, "types": len(TYPES), "differ": differ}))
"""

A_SESSION = r"""
import json
import numpy as np
import cffi.cparser
from eggfuse.runtime.bindings import warm_types
warm_types()
parsed = []
own = cffi.cparser.Parser.parse_type
cffi.cparser.Parser.parse_type = lambda self, t: (parsed.append(t), own(self, t))[1]
import eggfuse
from eggfuse.ir import Graph
from eggfuse.runtime.profile import profile
g = Graph()
x = g.input("x", (4, 8))
w = g.parameter("w", (8, 8))
g.set_outputs([g.relu(g.matmul(x, w))])
c = eggfuse.compile(g, {"w": np.eye(8, dtype=np.float32)}, fuse=False, cache=False)
out = c.run({"x": np.ones((4, 8), np.float32)})
c.session.write_parameter("w", np.ones((8, 8), np.float32))
c.session.read_parameter("w")
profile(c.session, {"x": np.ones((4, 8), np.float32)})
used = list(parsed)
from wgpu.backends.wgpu_native._ffi import ffi
ffi.typeof("WGPURenderPassDescriptor *")  # not in the list: the recorder sees it
print(json.dumps({"parsed": used, "recorder_works": parsed[len(used):] == ["WGPURenderPassDescriptor *"],
                  "out": float(out[0].sum())}))
"""


def _run(code: str) -> dict:
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_types_parsed_in_one_pass_are_cffis_own():
    got = _run(SAME_AS_CFFI)
    assert got["added"] == got["types"] - got["before"] > 40  # the others were parsed by warm_types
    assert got["differ"] == []


def test_a_session_s_life_parses_no_type_outside_the_list():
    got = _run(A_SESSION)
    assert got["out"] == 32.0  # relu(ones @ eye): the session ran
    assert got["recorder_works"]
    assert got["parsed"] == [], f"add these to runtime.bindings.TYPES: {got['parsed']}"


def test_unknown_or_unparsable_types_are_left_to_cffi():
    from wgpu.backends.wgpu_native._ffi import ffi

    from eggfuse.runtime.bindings import warm_types

    assert warm_types(("NotAWgpuType *", "WGPUBufferDescriptor [*")) == 0  # names no typedef: skipped
    # a parse error anywhere: nothing added (cffi parses each on first use), nothing raised
    assert warm_types(("void (", "WGPURenderPassDescriptor *")) == 0
    assert "WGPURenderPassDescriptor *" not in ffi._parsed_types
    assert ffi.typeof("WGPURenderPassDescriptor *") is not None
