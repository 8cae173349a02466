"""Shared fixtures: submissions made from the reference, and the command line; and which tests
are slow (`make test-fast` runs the others: ``pytest -m "not slow"``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.assignments import ROOT, get_assignment
from autograder.generate import read_master


def reference_notebook(key: str) -> nbformat.NotebookNode:
    """The master as a learner's notebook with every answer filled in (the solutions)."""
    nb = read_master(get_assignment(key))
    nb.metadata["course"] = {"assignment": key}  # as in the learner notebook it stands for
    return nb


def learner_notebook(key: str) -> nbformat.NotebookNode:
    """The untouched learner notebook, as a learner downloads it."""
    return nbformat.read(str(get_assignment(key).notebook), as_version=4)


def edit(nb: nbformat.NotebookNode, old: str, new: str) -> nbformat.NotebookNode:
    """Replace `old` by `new` in the notebook's code; the text must occur."""
    hits = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and old in cell.source:
            cell.source = cell.source.replace(old, new)
            hits += 1
    assert hits, f"{old!r} not found in the notebook: the fixture is out of date"
    return nb


def mistake(key: str, *pairs: tuple[str, str]):
    """A maker of the reference notebook of `key` with each (old, new) text edit applied."""
    def make() -> nbformat.NotebookNode:
        nb = reference_notebook(key)
        for old, new in pairs:
            edit(nb, old, new)
        return nb
    return make


def add_cell(nb: nbformat.NotebookNode, source: str, after_grade_id: str | None = None) -> nbformat.NotebookNode:
    """Add a code cell the learner wrote (no nbgrader metadata), after a given cell or at the end."""
    cell = nbformat.v4.new_code_cell(source)
    index = len(nb.cells)
    if after_grade_id:
        index = next(i for i, c in enumerate(nb.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == after_grade_id) + 1
    nb.cells.insert(index, cell)
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m autograder ARGS`, as a user runs it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args[:1] == ("grade",) and os.environ.get("AUTOGRADER_WARM") == "1":
        args = (*args, "--warm")  # the adversarial suite and the chapter harness, graded warm
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_json(*args: str, **kw) -> dict:
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture
def root() -> Path:
    return ROOT


# --- the fast target: what `pytest -m "not slow"` leaves out ----------------------------------
# A test is slow when it uses one of these fixtures (each an end-to-end run of minutes, shared by
# the tests that read it), when its whole file is slow, or when it says so itself
# (`@pytest.mark.slow`: end-to-end grading through the command line, notebooks executed, mutants
# or seeds graded).

SLOW_FIXTURES = {
    "batch": "the adversarial suite: every attack graded in one sandboxed batch",
    "graded_chapter": "one sandboxed grading run per chapter over its harness batch",
    "site": "the built book (built first when missing)",
    "browser": "a Chromium driving the built book",
}
SLOW_FILES = {
    "test_browser.py": "the built book in a browser",
    "test_check_matches_grade.py": "every chapter's harness graded by `grade`, `check` and `check --sandbox`",
    "test_cohort.py": "batches graded on local Dask clusters",
    "test_adversarial_cluster.py": "Dask clusters attacked by a second local user",
    "test_reliability.py": "a grading run killed mid-batch and resumed",
}


def pytest_collection_modifyitems(config, items):
    """Mark slow every test of a file in SLOW_FILES and every test that uses a fixture of SLOW_FIXTURES."""
    for item in items:
        if item.path.name in SLOW_FILES or SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# --- the chapter harness: one sandboxed grading run per chapter, shared by every test ------

def chapter_batch(key: str) -> dict:
    """student -> notebook maker for a chapter's harness run: reference, stub and its table's mistakes."""
    from chapters import tables

    table = tables()[key]
    batch = {"ref": lambda: reference_notebook(key), "stub": lambda: learner_notebook(key)}
    for name, m in table.MISTAKES.items():
        batch[name] = m.make or mistake(key, *m.edits)
    return batch


_GRADED: dict = {}


@pytest.fixture(scope="session")
def graded_chapter(tmp_path_factory):
    """A function KEY -> (out folder, JSON summary, {student: submission}) from one `grade` run per
    chapter over its harness batch, as an instructor runs it (sandboxed), cached for the session."""
    def get(key: str):
        if key not in _GRADED:
            base = tmp_path_factory.mktemp(f"grading{key}")
            for student, make in chapter_batch(key).items():
                write(make(), base / "submitted" / f"{student}.ipynb")
            out = base / "out"
            summary = run_json("grade", "--assignment", key, str(base / "submitted"), "--out", str(out))
            _GRADED[key] = (base, out, summary, {s["student"]: s for s in summary["submissions"]})
        return _GRADED[key]
    return get


# --- the adversarial suite: every attack module's submissions in one sandboxed batch -------

@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """One `grade` run over every attack of tests/attacks/, with what the tests need to judge it."""
    import hashlib
    import sqlite3

    from attacks import KEY, TIMEOUT, Context, modules
    from attacks.cheats_and_escapes import procs_left

    base = tmp_path_factory.mktemp("adversarial")
    ctx = Context(base=base, subs=base / "subs", out=base / "out")
    ctx.subs.mkdir()
    for module in modules():
        module.build(ctx)
    for name, nb in ctx.nbs.items():
        path = ctx.subs / f"{name}.ipynb"
        if isinstance(nb, dict):
            path.write_text(json.dumps(nb, separators=(",", ":")), encoding="utf-8")
        else:
            write(nb, path)

    def sha(p):
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    before = {str(p): sha(p) for p in ctx.protected}
    before_subs = {str(p.relative_to(ctx.subs)): sha(p) for p in ctx.subs.rglob("*")
                   if p.is_file() and not p.is_symlink()}
    proc = run_cli("grade", str(ctx.subs), "--assignment", KEY, "--out", str(ctx.out), "--timeout", TIMEOUT, "--json")
    for clean in ctx.cleanups:
        clean()
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    con = sqlite3.connect(str(ctx.gradebook))
    yield {
        "ctx": ctx, "data": data, "by": {r["student"]: r for r in data["submissions"]}, "out": ctx.out,
        "subs": ctx.subs, "gradebook": ctx.gradebook, "listener": ctx.extra.get("listener"), "before": before,
        "before_subs": before_subs, "protected": ctx.protected, "con": con,
        "csv": (ctx.out / f"{KEY}_grades.csv").read_text().splitlines(), "stderr": proc.stderr,
        "leftover": procs_left(),
    }
    con.close()
