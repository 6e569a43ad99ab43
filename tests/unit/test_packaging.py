"""The package list in pyproject.toml covers every folder the package maps (a wheel built from
it must hold every module: an editable install would hide a missing one)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for name, folder in cfg["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]))
    missing = sorted(found - listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"
    assert listed <= found, f"listed packages without a folder: {sorted(listed - found)}"
