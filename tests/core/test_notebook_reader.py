"""The notebook reader: a size-checked `json.load` and the structure the grader uses.

`check` and `grade` read a learner's notebook with `autograder.core.notebook.read_notebook`, not
nbformat (which `check` does not load). It must refuse what nbformat refuses, with words of
its own, and read what nbformat reads.
"""

from __future__ import annotations

import json

import nbformat
import pytest

from autograder.core.assignments import all_assignments, get_assignment
from autograder.core.notebook import NotebookError, read_notebook

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


def _refused_by_python() -> list[tuple[str, str]]:
    """(name, text): valid JSON that Python's json refuses to turn into values (an integer of more than
    4,300 digits), at the places a notebook holds numbers."""
    huge = "9" * 5000

    def at(path: list, value: str) -> str:
        d = _valid()
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = "@@HUGE@@"
        return json.dumps(d).replace('"@@HUGE@@"', value)

    return [("nbformat_minor", at(["nbformat_minor"], huge)),
            ("notebook metadata", at(["metadata", "x"], huge)),
            ("execution count", at(["cells", 1, "execution_count"], huge)),
            ("nbgrader points", at(["cells", 1, "metadata", "nbgrader_points"], "-" + huge)),
            ("in a list", at(["metadata", "y"], "[1, 2, " + huge + "]"))]


@pytest.mark.parametrize("name,text", _refused_by_python(), ids=[c[0] for c in _refused_by_python()])
def test_valid_json_python_refuses_is_the_learners_error_in_every_reader(tmp_path, name, text):
    """Is a notebook that holds an integer of thousands of digits (valid JSON, refused by Python with a
    plain ValueError) the learner's error with one sentence in every command's reader, never a grader
    error: `grade` and `check` (the Grader, as the Gradescope mode too), `similarity`, the autograded
    notebook's frame?"""
    from autograder.core.notebook import parse_notebook
    from autograder.course.nbgrader_course import _learner_cells
    from autograder.course.similarity import NotCompared
    from autograder.course.similarity import parse_notebook as similarity_parse
    from autograder.grading.grader import ERROR
    from autograder.grading.grader import course_grader

    path = tmp_path / "nb.ipynb"
    path.write_text(text, encoding="utf-8")
    for read in (lambda: read_notebook(path), lambda: parse_notebook(text.encode(), "nb.ipynb")):
        with pytest.raises(NotebookError, match="a number of thousands of digits") as info:
            read()
        assert str(info.value).count(". ") == 0 and len(str(info.value)) < 200  # one sentence
    with pytest.raises(NotCompared, match="thousands of digits"):
        similarity_parse(text.encode(), "nb.ipynb")
    assert _learner_cells(text.encode()) == []
    result = course_grader(KEY, sandbox=None).grade(path, student="x", seed=1)
    assert (result.status, result.score) == (ERROR, 0.0) and "thousands of digits" in result.error


def test_any_failure_while_parsing_is_a_notebook_error(monkeypatch):
    """Whatever the parser raises (here: each kind of exception from json.loads), the reader says so as the
    learner's NotebookError, naming the kind; nothing else comes out of it."""
    import autograder.core.notebook as notebook

    raw = get_assignment(KEY).notebook.read_bytes()
    for exc in (ValueError("x"), OverflowError("x"), MemoryError(), KeyError("x"), TypeError("x"),
                IndexError("x"), UnicodeError("x")):
        def boom(*a, exc=exc, **k):
            raise exc
        monkeypatch.setattr(notebook.json, "loads", boom)
        with pytest.raises(NotebookError, match=rf"nb\.ipynb could not be read as (notebook JSON|a notebook) "
                                               rf"\({type(exc).__name__}\)|not UTF-8"):
            notebook.parse_notebook(raw, "nb.ipynb")


def test_the_courses_processes_skip_the_iri_grammars_and_a_kernel_keeps_them():
    """Does a process of the course read and validate notebooks without compiling rfc3987_syntax's
    grammars (about 1.1 CPU s a process), while a process with IPython loaded (a learner's kernel)
    keeps whatever jsonschema finds installed?"""
    import subprocess
    import sys

    probe = ("import sys, nbformat\n"
             "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x = 1')])\n"
             "nbformat.validate(nb)\n"
             "bad = nbformat.v4.new_notebook(); bad.cells.append({'cell_type': 'code'})\n"
             "try:\n    nbformat.validate(bad)\nexcept nbformat.ValidationError:\n    print('invalid refused')\n"
             "print('grammars', sys.modules.get('rfc3987_syntax') is not None)\n")
    ours = subprocess.run([sys.executable, "-c", "import autograder\n" + probe], capture_output=True, text=True)
    assert ours.stdout.split("\n")[:2] == ["invalid refused", "grammars False"], ours.stderr
    from importlib import metadata

    try:
        metadata.distribution("rfc3987-syntax")
    except metadata.PackageNotFoundError:
        return  # not installed here: nothing for a kernel to keep
    kernel = subprocess.run([sys.executable, "-c", "import IPython, autograder\n" + probe], capture_output=True, text=True)
    assert kernel.stdout.split("\n")[:2] == ["invalid refused", "grammars True"], kernel.stderr
