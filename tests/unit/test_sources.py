"""``module:name`` sources (graphs, cost models, rulesets) as the current folder holds them."""

import sys

import pytest

from eggfuse.ir.errors import InputError
from eggfuse.ir.sources import named_object

MODULE = "eggfuse_test_source_module"


def test_a_module_of_the_current_folder_is_the_one_there_now_not_one_imported_before(tmp_path, monkeypatch):
    # the same module name in two folders: a process that moves from one to the other (a test session, a
    # notebook, a sweep's worker) gets the second folder's file, not the first one cached in sys.modules
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, body in ((first, "def f():\n    return 'first'\n"), (second, "def g():\n    return 'second'\n")):
        folder.mkdir()
        (folder / f"{MODULE}.py").write_text(body)
    monkeypatch.chdir(first)
    assert named_object(f"{MODULE}:f", "graph source", "function")() == "first"
    monkeypatch.chdir(second)
    assert named_object(f"{MODULE}:g", "graph source", "function")() == "second"
    with pytest.raises(InputError, match=f"graph source '{MODULE}:f': {MODULE} has no function 'f'"):
        named_object(f"{MODULE}:f", "graph source", "function")
    sys.modules.pop(MODULE, None)


def test_a_module_imported_from_its_own_file_is_not_loaded_again(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    (tmp_path / f"{MODULE}.py").write_text("import itertools\ncount = itertools.count()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    counter = named_object(f"{MODULE}:count", "cost model", "class")
    assert named_object(f"{MODULE}:count", "cost model", "class") is counter  # the module imported once
    sys.modules.pop(MODULE, None)


def test_a_file_importing_a_module_beside_it_loads_by_path_as_by_name(tmp_path, monkeypatch):
    # a sweep resolves mygraphs:relu to /abs/mygraphs.py:relu for its workers; that file's `import helper` (a module
    # beside it) worked by name (optimize) but failed by path ("No module named ...")
    (tmp_path / "sibling_of_graphs.py").write_text("VALUE = 7\n")
    (tmp_path / "graphs_with_sibling.py").write_text("import sibling_of_graphs\n\n\ndef value():\n"
                                                     "    return sibling_of_graphs.VALUE\n")
    monkeypatch.chdir("/")
    fn = named_object(f"{tmp_path / 'graphs_with_sibling.py'}:value", "graph source", "function")
    assert fn() == 7 and str(tmp_path) not in sys.path
    sys.modules.pop("sibling_of_graphs", None)
