"""A subset of onnx's backend node cases, driven by onnx's own test runner through
eggfuse.onnx.backend: every op type with a passing case in the full run (tests/onnx/
node_suite.md) contributes up to two (tests/onnx/ci_cases.txt, written by
``python -m eggfuse.onnx.suite --ci-list tests/onnx/ci_cases.txt``). The expected outputs are
onnx's, computed by its reference implementations."""

from pathlib import Path

import onnx.backend.test

from eggfuse.onnx.backend import EggfuseBackend

CASES = (Path(__file__).parent / "ci_cases.txt").read_text().split()

backend_test = onnx.backend.test.BackendTest(EggfuseBackend, __name__)
for _name in CASES:
    backend_test.include(f"^{_name}_cpu$")
# the runner makes a test of every case and skips the ones not included: keep only ours
_wanted = {f"{name}_cpu" for name in CASES}
_classes = backend_test.test_cases  # a property that builds new classes on each access
for _cls in _classes.values():
    for _attr in [a for a in vars(_cls) if a.startswith("test_") and a not in _wanted]:
        delattr(_cls, _attr)
globals().update({k: c for k, c in _classes.items() if any(a.startswith("test_") for a in vars(c))})


def test_the_subset_is_not_empty_and_every_case_exists():
    from eggfuse.onnx.suite import load_cases

    known = {c.name for c in load_cases("node")}
    assert CASES and set(CASES) <= known, sorted(set(CASES) - known)
