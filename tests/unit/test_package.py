"""The top-level package as a user meets it: what ``dir(eggfuse)`` offers and what loads on first use."""

from __future__ import annotations

import subprocess
import sys


def test_dir_lists_the_names_that_load_on_first_use_and_each_one_loads():
    # in a fresh interpreter: the rewrite engine, the trainer and the onnx subpackage are not imported by
    # `import eggfuse`, yet dir() offers them (tab completion) and attribute access loads them
    code = ("import sys, eggfuse\n"
            "names = ('optimize', 'CostModel', 'Trainer', 'onnx')\n"
            "before = 'eggfuse.onnx' in sys.modules\n"
            "print(before, all(n in dir(eggfuse) for n in names), all(getattr(eggfuse, n) for n in names),\n"
            "      eggfuse.onnx.load.__module__, set(eggfuse.__all__) <= set(dir(eggfuse)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "eggfuse.onnx.importer", "True"], out.stdout
