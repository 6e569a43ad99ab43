"""The stages import one way: ir <- rewrites <- lowering <- runtime <- facade (eggfuse/), and
neither lowering nor runtime imports the rewrite engine: a compiled graph lowers and runs
without egglog (the GPU machine of the benchmarks has none); the facade's pipeline
(``eggfuse/pipeline.py``) is what calls it.

Every import of every module of a stage is read (``ast``, no execution) and checked against
the order; a late import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ORDER = ("ir", "rewrites", "lowering", "runtime", "eggfuse")


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "eggfuse" and len(parts) > 1 and parts[1] in ORDER:
        return parts[1]
    if parts[0] == "eggfuse":
        return "eggfuse"
    return None


def _imports(path: Path, stage: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ["eggfuse", stage, *path.relative_to(REPO / stage).parts[:-1]] if stage != "eggfuse" else ["eggfuse"]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                out.append((node.lineno, ".".join([*base, *(node.module.split(".") if node.module else [])])))
            else:
                out.append((node.lineno, node.module or ""))
    return out


@pytest.mark.parametrize("stage", ORDER[:-1])
def test_a_stage_imports_only_the_stages_before_it(stage):
    allowed = set(ORDER[:ORDER.index(stage) + 1]) - ({"rewrites"} if stage in ("lowering", "runtime") else set())
    bad = []
    for path in sorted((REPO / stage).rglob("*.py")):
        for line, module in _imports(path, stage):
            other = _stage_of(module)
            if other is not None and other not in allowed:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not bad, f"{stage}/ may import only {sorted(allowed)}: " + "; ".join(bad)
