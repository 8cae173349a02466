"""`python -m autograder new KEY "Title"`: a chapter started in a copy of the course is whole.

The parts of the course that `new`, `generate` and `grade` read are copied into a temporary
folder, and `new 99_demo --root` writes the chapter there (never here). Then, in that copy:
the generator has written the notebook and the reference module; the master's visible tests
pass on the reference and fail on the untouched notebook; the book page's code runs; and one
unsandboxed `grade` of the chapter's harness batch gives the reference full marks, the
untouched notebook 0, and each placeholder mistake of the table its score, checks and hints.
Also: what `new` refuses (exit 2, one line, nothing written), and where it puts the page in
`_toc.yml`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.authoring.scaffold import chapter_paths, toc_chapters, toc_with_chapter
from autograder.cli import main
from autograder.core.assignments import ROOT
from autograder.core.usage import UsageError

KEY = "99_demo"
TITLE = "A demo chapter"
TOC = "_toc.yml"
COPIED = ("autograder", "solutions", "coursebook", "exercises/source", "tests/conftest.py", "tests/chapters/__init__.py",
          TOC, "_config.yml")  # _config.yml: the repository that the notebooks' set-up cell installs


def _in_copy(course: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` in the copy, with the copy's own packages first on the path."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(course), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of what `new`, `generate` and `grade` read, with the chapter scaffolded by `new --root`."""
    course = tmp_path_factory.mktemp("course")
    for rel in COPIED:
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, course / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (course / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, course / rel)
    (course / "book").mkdir()
    return course


@pytest.fixture(scope="module")
def scaffolded(course):
    toc_before = (course / TOC).read_text(encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "autograder", "new", KEY, TITLE, "--root", str(course)], cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    return course, proc, toc_before


def test_new_writes_the_chapter_and_generates_it_in_the_copy_only(scaffolded):
    course, proc, toc_before = scaffolded
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = chapter_paths(KEY)
    for what, rel in paths.items():
        assert (course / rel).is_file(), what
        assert not (ROOT / rel).exists(), f"{rel} was written into the course itself"
        assert f"wrote {rel}" in proc.stdout
    assert "python -m autograder mutants 99_demo --jobs 2" in proc.stdout
    # the page is the last chapter, and _toc.yml changed by that one line only
    toc = (course / TOC).read_text(encoding="utf-8")
    assert toc_chapters(toc) == toc_chapters(toc_before) + [KEY]
    assert toc.replace(f"      - file: book/{KEY}\n", "", 1) == toc_before
    assert KEY not in (ROOT / TOC).read_text(encoding="utf-8")
    master = (course / paths["master"]).read_text(encoding="utf-8")
    assert master.count("<!-- instructions -->") == 1 and "nbgrader:" not in master and TITLE in master
    assert "### BEGIN SOLUTION" in master and ":grader: tests normalise 2" in master


CHECKS = r'''
import json, sys
from pathlib import Path
import nbformat
from myst_nb.core.read import read_myst_markdown_notebook
sys.path.insert(0, "tests")
from conftest import chapter_batch, learner_notebook, reference_notebook, write

key, subs = sys.argv[1], Path(sys.argv[2])
for student, make in chapter_batch(key).items():
    write(make(), subs / f"{student}.ipynb")

def run(cells):
    ns = {}
    for source in cells:
        exec(compile(source, "cell", "exec"), ns)

run(c.source for c in reference_notebook(key).cells if c.cell_type == "code")  # the visible tests pass
try:
    run(c.source for c in learner_notebook(key).cells if c.cell_type == "code")
    stub = "passed"
except NotImplementedError:
    stub = "NotImplementedError"
page = read_myst_markdown_notebook(Path(f"book/{key}.md").read_text(encoding="utf-8"))
run(c.source for c in page.cells if c.cell_type == "code")  # the book page's code runs
print(json.dumps({"stub": stub}))
'''


def _table(course: Path):
    spec = importlib.util.spec_from_file_location(f"_scaffolded_ch{KEY}", course / chapter_paths(KEY)["table"])
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


@pytest.mark.slow
def test_the_new_chapter_grades_as_its_table_says(scaffolded, tmp_path):
    """In the copy: visible tests pass on the reference and fail on the stub, the page's code runs, and
    `grade` gives the reference full marks, the stub 0 and each mistake its table's verdict."""
    course, proc, _ = scaffolded
    assert proc.returncode == 0, proc.stderr[-3000:]
    checked = _in_copy(course, "-c", CHECKS, KEY, str(tmp_path / "subs"))
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.splitlines()[-1]) == {"stub": "NotImplementedError"}
    graded = _in_copy(course, "-m", "autograder", "grade", "--no-sandbox", "--assignment", KEY, "--jobs", "1",
                      str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--json")
    assert graded.returncode == 0, graded.stderr[-3000:]
    by = {s["student"]: s for s in json.loads(graded.stdout)["submissions"]}
    table = _table(course)
    assert set(by) == {"ref", "stub", *table.MISTAKES} and len(table.MISTAKES) >= 4
    assert all(s["status"] == "graded" and s["max_score"] == 2 for s in by.values())
    assert by["ref"]["score"] == 2 and all(c["passed"] for c in by["ref"]["checks"])
    assert by["stub"]["score"] == 0 and all("not implemented yet" in c["hint"] for c in by["stub"]["checks"])
    for name, m in table.MISTAKES.items():
        failed = {c["name"]: c["hint"] for c in by[name]["checks"] if not c["passed"]}
        assert by[name]["score"] == m.score and set(failed) == set(m.failed), (name, failed)
        assert all(words in failed[check] for check, words in m.hints.items()), (name, failed)


@pytest.mark.parametrize("key, title, words", [
    ("03_qkv", TITLE, "chapter 03_qkv already exists: its master, exercises/source/03_qkv.md, is there"),
    ("03_other", TITLE, "chapter number 03 is taken by 03_qkv"),
    ("8_demo", TITLE, "'8_demo' is not a chapter key"),
    ("08_Demo", TITLE, "'08_Demo' is not a chapter key"),
    ("08_demo", "", "cannot be a title"),
    ("08_demo", "Two\nlines", "cannot be a title"),
    ("08_demo", 'A "quoted" title', "cannot be a title"),
])
def test_new_refuses_a_bad_or_taken_key_or_title_and_writes_nothing(course, capsys, key, title, words):
    before = {p: p.read_bytes() for p in course.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert main(["new", key, title, "--root", str(course)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    after = {p: p.read_bytes() for p in course.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert after == before


def test_new_refuses_a_folder_that_is_not_the_course(tmp_path, capsys):
    assert main(["new", "08_demo", TITLE, "--root", str(tmp_path)]) == 2
    assert "is not a copy of the course" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


TOC_TEXT = """\
# a comment kept
format: jb-book
root: book/intro
parts:
  - caption: Chapters
    chapters:
      - file: book/01_a
      - file: book/05_b
  - caption: Reference
    chapters:
      - file: book/notation
"""


@pytest.mark.parametrize("key, chapters", [
    ("00_first", ["00_first", "01_a", "05_b"]),
    ("03_middle", ["01_a", "03_middle", "05_b"]),
    ("09_last", ["01_a", "05_b", "09_last"]),
])
def test_the_page_joins_the_chapters_in_key_order(key, chapters):
    text = toc_with_chapter(TOC_TEXT, key)
    assert toc_chapters(text) == chapters
    assert text.replace(f"      - file: book/{key}\n", "", 1) == TOC_TEXT


def test_a_table_of_contents_without_chapters_is_refused():
    with pytest.raises(UsageError, match="no part captioned Chapters"):
        toc_with_chapter(TOC_TEXT.replace("Chapters", "Lessons"), "03_x")
