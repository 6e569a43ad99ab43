"""The worked examples the README points to still apply to the tree they document."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "examples").glob("*.patch"))


def test_the_examples_folder_holds_the_readmes_patches():
    readme = (ROOT / "README.md").read_text()
    assert PATCHES, "examples/*.patch: none found"
    for patch in PATCHES:
        assert f"examples/{patch.name}" in readme, f"README.md does not mention examples/{patch.name}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_each_example_patch_applies_to_the_tree(patch):
    git = shutil.which("git")
    assert git, "git is needed to check that the example patches apply (git apply --check)"
    proc = subprocess.run([git, "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, (f"{patch.name} no longer applies to the tree: refresh it from a branch with the "
                                  f"example (git format-patch -1 --stdout > examples/{patch.name}):\n{proc.stderr}")
