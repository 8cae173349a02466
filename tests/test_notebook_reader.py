"""The notebook reader: a size-checked `json.load` and the structure the grader uses.

`check` and `grade` read a learner's notebook with `autograder.notebook.read_notebook`, not
nbformat (which `check` does not load). It must refuse what nbformat refuses, with words of
its own, and read what nbformat reads.
"""

from __future__ import annotations

import json

import nbformat
import pytest

from autograder.assignments import all_assignments, get_assignment
from autograder.notebook import NotebookError, read_notebook

KEY = "03_qkv"


def _valid() -> dict:
    return json.loads(get_assignment(KEY).notebook.read_text(encoding="utf-8"))


def _broken():
    """(name, notebook JSON text, words of our error): each is also refused by nbformat's validation."""
    def nb(**change):
        d = _valid()
        d.update(change)
        return d

    def cell0(**change):
        d = _valid()
        d["cells"][0].update(change)
        return d

    return [
        ("not json", "{\"cells\": [", "not valid notebook JSON"),
        ("a list", json.dumps([1, 2]), "no list of cells"),
        ("cells not a list", json.dumps(nb(cells={"a": 1})), "no list of cells"),
        ("format 3", json.dumps(nb(nbformat=3)), "only format 4"),
        ("format missing", json.dumps({k: v for k, v in _valid().items() if k != "nbformat"}), "only format 4"),
        ("cell not an object", json.dumps(nb(cells=[1])), "cell 1 is malformed"),
        ("unknown cell type", json.dumps(cell0(cell_type="python")), "cell 1 is malformed"),
        ("source a number", json.dumps(cell0(source=3)), "malformed source"),
        ("source a list of numbers", json.dumps(cell0(source=[1, 2])), "malformed source"),
    ]


@pytest.mark.parametrize("name,text,words", _broken(), ids=[b[0] for b in _broken()])
def test_reader_refuses_what_nbformat_refuses(tmp_path, name, text, words):
    path = tmp_path / "nb.ipynb"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(NotebookError, match=words):
        read_notebook(path)
    with pytest.raises(Exception):  # nbformat refuses it too (a read error or a validation error)
        nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def test_reader_reads_what_nbformat_reads():
    for a in all_assignments():
        ours = read_notebook(a.notebook)
        theirs = nbformat.read(str(a.notebook), as_version=4)
        assert [c["source"] for c in ours.cells] == [c.source for c in theirs.cells]
        assert [c["type"] for c in ours.cells] == [c.cell_type for c in theirs.cells]
        assert ours.assignment == a.key
