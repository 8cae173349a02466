"""The generator: learner notebooks and reference modules made from each master."""

from __future__ import annotations

import ast
import re
import shutil
import sys
import subprocess
from types import SimpleNamespace

import nbformat
import pytest
from nbgrader.utils import compute_checksum, is_grade, is_locked, is_solution

from autograder.authoring import generate as gen
from autograder.authoring.generate import MasterError, read_master
from autograder.core.assignments import KEY_RE, ROOT, all_assignments
from autograder.grading.grader import Grader, GraderConfigError

ASSIGNMENTS = all_assignments()
KEYS = [a.key for a in ASSIGNMENTS]


def _solution_lines(master):
    """Every non-trivial line inside a master's solution regions."""
    lines = []
    for cell in master.cells:
        inside = False
        for ln in cell.source.splitlines():
            if "### BEGIN SOLUTION" in ln:
                inside = True
            elif "### END SOLUTION" in ln:
                inside = False
            elif inside and len(ln.strip()) > 12 and not ln.strip().startswith("#"):
                lines.append(ln.strip())
    return lines


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_learner_notebook_has_no_solution_text(assignment):
    """Does no line of a solution region survive into the learner notebook?"""
    text = assignment.notebook.read_text(encoding="utf-8")
    solution = _solution_lines(read_master(assignment))
    assert solution, "the master has no solution regions"
    leaked = [ln for ln in solution if ln in text]
    assert not leaked, f"solution lines in the learner notebook: {leaked[:3]}"
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    nb = nbformat.reads(text, as_version=4)
    stubs = [c for c in nb.cells if is_solution(c) and c.cell_type == "code"]
    assert stubs and all("raise NotImplementedError()" in c.source for c in stubs)


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_learner_notebook_has_no_hidden_test(assignment):
    """Is no hidden test, by name or by hint text, in the learner notebook?"""
    text = assignment.notebook.read_text(encoding="utf-8")
    tree = ast.parse(assignment.hidden_tests.read_text(encoding="utf-8"))
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert names
    assert not [n for n in names if n in text]
    hints = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and len(n.value) > 40]
    assert hints
    assert not [h for h in hints if h in text]
    assert "BEGIN HIDDEN TESTS" not in text


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_graded_and_solution_cells_are_locked_and_checksummed(assignment):
    """Are test cells locked, and does every nbgrader cell carry nbgrader's own checksum?"""
    nb = nbformat.read(str(assignment.notebook), as_version=4)
    graded = [c for c in nb.cells if is_grade(c)]
    assert graded
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta:
            continue
        if is_grade(cell):
            assert is_locked(cell) and cell.metadata.get("editable") is False
        assert meta.get("checksum") == compute_checksum(cell)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_hidden_points_add_up_to_the_notebook_points(assignment):
    """Do the hidden checks of each part carry exactly the points the notebook announces (the grader starts)?"""
    grader = Grader(assignment)
    totals: dict[str, float] = {}
    for check in grader.checks:
        totals[check.part] = totals.get(check.part, 0) + check.points
    assert totals == grader.parts == {gid[len("test_"):]: pts for gid, pts in
                                      gen.grade_cells(read_master(assignment)).items()}


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_every_check_title_is_its_whole_question(assignment):
    """Is each hidden check's title, as the report, `--json` and the feedback page show it, the whole question
    of its docstring's first paragraph (ending with its question mark), never its first line cut mid-sentence?"""
    for check in Grader(assignment).checks:
        assert check.title.endswith("?") and "\n" not in check.title and "  " not in check.title, (
            check.name, check.title)


def test_grader_refuses_hidden_points_that_do_not_add_up(monkeypatch):
    """Does a hidden check with the wrong points stop the grader before it grades anyone?"""
    import autograder.hidden.test_03_qkv as hidden

    check = next(getattr(hidden, n) for n in dir(hidden) if n.startswith("test_"))
    monkeypatch.setattr(check, "points", type(check.points)(check.points.n + 1, check.points.part))
    with pytest.raises(GraderConfigError, match="do not add up"):
        Grader(next(a for a in ASSIGNMENTS if a.key == "03_qkv"))


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_reference_module_matches_master(assignment):
    """Is each solution function of the master importable from the reference module?"""
    import importlib

    module = importlib.import_module(assignment.solutions_module)
    text = assignment.solutions.read_text(encoding="utf-8")
    assert text.startswith("# AUTOGENERATED! DO NOT EDIT!")
    for name in re.findall(r"^def (\w+)", "\n".join(c.source for c in read_master(assignment).cells
                                                   if is_solution(c)), flags=re.M):
        assert callable(getattr(module, name))


FRONT_MATTER = "---\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n# Demo\n"


def _demo(tmp_path, body, key="99_demo"):
    """A stand-in assignment whose master is FRONT_MATTER + body."""
    master = tmp_path / f"{key}.md"
    master.write_text(FRONT_MATTER + body, encoding="utf-8")
    return SimpleNamespace(key=key, master=master)


def _cell(options, source="x = 1"):
    return "\n```{code-cell} ipython3\n" + options + source + "\n```\n"


def test_grader_options_expand_to_the_long_nbgrader_metadata(tmp_path):
    """Does each `:grader:` form give exactly the nbgrader metadata its long YAML block gives?"""
    short = (_cell(":grader: locked setup\n:tags: [export]\n")
             + _cell(":grader: solution softmax\n", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
             + _cell(":grader: tests softmax 3\n", "assert f() == 1")
             + _cell(":grader: tests half 1.5\n"))
    long = (_cell("---\nnbgrader:\n  grade: false\n  grade_id: setup\n  locked: true\n  schema_version: 3\n"
                  "  solution: false\ntags: [export]\n---\n")
            + _cell("---\nnbgrader:\n  grade: false\n  grade_id: softmax\n  locked: false\n  schema_version: 3\n"
                    "  solution: true\n---\n", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
            + _cell("---\nnbgrader:\n  grade: true\n  grade_id: test_softmax\n  locked: true\n  points: 3\n"
                    "  schema_version: 3\n  solution: false\n---\n", "assert f() == 1")
            + _cell("---\nnbgrader:\n  grade: true\n  grade_id: test_half\n  locked: true\n  points: 1.5\n"
                    "  schema_version: 3\n  solution: false\n---\n"))
    (tmp_path / "short").mkdir()
    (tmp_path / "long").mkdir()
    nb_short = read_master(_demo(tmp_path / "short", short))
    nb_long = read_master(_demo(tmp_path / "long", long))
    code = [c for c in nb_short.cells if c.cell_type == "code" and c.id != gen.SETUP_CELL_ID]
    assert [dict(c.metadata) for c in code] == [
        {"nbgrader": {"grade": False, "grade_id": "setup", "locked": True, "schema_version": 3,
                      "solution": False}, "tags": ["export"]},
        {"nbgrader": {"grade": False, "grade_id": "softmax", "locked": False, "schema_version": 3,
                      "solution": True}},
        {"nbgrader": {"grade": True, "grade_id": "test_softmax", "locked": True, "points": 3,
                      "schema_version": 3, "solution": False}},
        {"nbgrader": {"grade": True, "grade_id": "test_half", "locked": True, "points": 1.5,
                      "schema_version": 3, "solution": False}},
    ]
    assert type(code[2].metadata["nbgrader"]["points"]) is int
    assert nbformat.writes(nb_short) == nbformat.writes(nb_long)
    assert [c.source for c in code] == [c.source for c in nb_long.cells
                                        if c.cell_type == "code" and c.id != gen.SETUP_CELL_ID]


@pytest.mark.parametrize("value", [
    "tests encoder", "tests encoder three", "tests encoder 0", "tests encoder -1", "solution",
    "locked a b", "graded encoder", "solution bad!id", "true", "", "[solution, encoder]",
])
def test_malformed_grader_option_is_rejected_naming_master_and_cell(tmp_path, value):
    """Is a malformed `:grader:` value refused with a message naming the master, the cell and the forms?"""
    assignment = _demo(tmp_path, _cell(":grader: locked setup\n") + _cell(f":grader: {value}\n", "def broken():"))
    with pytest.raises(MasterError) as err:
        read_master(assignment)
    msg = str(err.value)
    assert str(assignment.master) in msg and "cell 2" in msg and "def broken():" in msg
    assert "malformed" in msg and "tests PART POINTS" in msg and "solution ID" in msg


def test_instructions_are_included_with_the_chapter_key(tmp_path, monkeypatch):
    """Does a `<!-- instructions -->` line become the shared instructions, `{key}` set, and nothing else?"""
    shared = tmp_path / "_instructions.md"
    shared.write_text("* Shared line.\n* Check `exercises/{key}.ipynb`\n", encoding="utf-8")
    monkeypatch.setattr(gen, "INSTRUCTIONS", shared)
    body = "\nIntro.\n\n<!-- instructions -->\n\nConventions.\n\nNot `<!-- instructions -->` here.\n" + _cell("")
    nb = read_master(_demo(tmp_path, body, key="42_demo"))
    assert nb.cells[0].source == ("# Demo\n\nIntro.\n\n* Shared line.\n* Check `exercises/42_demo.ipynb`\n\n"
                                  "Conventions.\n\nNot `<!-- instructions -->` here.")
    shared.unlink()
    with pytest.raises(MasterError, match="_instructions.md is missing"):
        read_master(_demo(tmp_path, body, key="42_demo"))


def test_an_earlier_answer_is_included_from_its_master(tmp_path):
    """Does `# from exercise KEY: NAME` become exercise KEY's reference definition, word for word?"""
    import inspect

    import solutions.ch03_qkv as ch03

    body = _cell(":grader: locked setup\n:tags: [export]\n",
                 "import math\n\n# from exercise 03_qkv: scaled_dot_product_attention\nx = 1")
    code = read_master(_demo(tmp_path, body)).cells[2].source  # after the course's set-up cell
    expected = inspect.getsource(ch03.scaled_dot_product_attention).rstrip("\n")
    assert code == ("import math\n\n# Exercise 03_qkv's reference `scaled_dot_product_attention`, included from "
                    "exercises/source/03_qkv.md.\n" + expected + "\nx = 1")
    assert "### BEGIN SOLUTION" not in code


@pytest.mark.parametrize("key", ["04_self_attention", "05_multi_head"])
def test_later_exercises_give_exercise_03s_attention_unchanged(key):
    """Do the reference modules that reuse exercise 03's attention hold exactly its reference code?"""
    import importlib
    import inspect

    import solutions.ch03_qkv as ch03

    mod = importlib.import_module(f"solutions.ch{key}")
    assert inspect.getsource(mod.scaled_dot_product_attention) == inspect.getsource(ch03.scaled_dot_product_attention)


@pytest.mark.parametrize("line, words", [
    ("# from exercise 98_nothing: f", "unknown assignment '98_nothing'"),
    ("# from exercise 03_qkv: no_such_name", "defines no function or class 'no_such_name'"),
    ("# from exercise 99_demo: f", "exercises include each other (99_demo -> 99_demo)"),
])
def test_a_bad_include_is_refused_naming_the_master(tmp_path, monkeypatch, line, words):
    """Is an include of an unknown exercise or name, or of itself, refused with the master's name?"""
    import autograder.core.assignments as assignments

    demo = _demo(tmp_path, _cell(":grader: locked setup\n", "def f():\n    return 1\n" + line))
    real = assignments.get_assignment
    monkeypatch.setattr(assignments, "get_assignment", lambda key: demo if key == demo.key else real(key))
    with pytest.raises(MasterError) as err:
        read_master(demo)
    assert str(demo.master) in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_learner_notebook_carries_the_shared_instructions(assignment):
    """Does each master include the shared instructions once, and its learner notebook show them for its own key?"""
    master = assignment.master.read_text(encoding="utf-8")
    assert master.count("<!-- instructions -->") == 1
    assert "nbgrader:" not in master, "use the short :grader: options"
    shared = (gen.INSTRUCTIONS.read_text(encoding="utf-8").replace("{key}", assignment.key)
              .replace("{archive}", gen.archive_url()))
    assert f"exercises/{assignment.key}.ipynb" in shared
    intro = nbformat.read(str(assignment.notebook), as_version=4).cells[0].source
    assert shared in intro and "<!-- instructions -->" not in intro and "{key}" not in intro
    assert gen.INSTRUCTIONS.stem not in KEYS and all(KEY_RE.match(k) for k in KEYS)


def test_committed_generated_files_are_current():
    """Does `generate --check` pass on the committed files?"""
    proc = subprocess.run([sys.executable, "-m", "autograder", "generate", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_drift_check_fails_on_a_stale_file(tmp_path):
    """Does `generate --check` exit non-zero, naming the file, when a generated file is stale?"""
    for folder in ("autograder", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy2(ROOT / "_config.yml", tmp_path)  # the set-up cell's repository
    key = KEYS[0]
    master = tmp_path / "exercises" / "source" / f"{key}.md"
    master.write_text(master.read_text(encoding="utf-8").replace(
        "# Exercise", "# Exercise (edited)", 1), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "autograder", "generate", "--check"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"exercises/{key}.ipynb is stale" in proc.stdout
    # ...and regenerating brings it back in line.
    subprocess.run([sys.executable, "-m", "autograder", "generate"], cwd=tmp_path, check=True,
                   capture_output=True)
    proc = subprocess.run([sys.executable, "-m", "autograder", "generate", "--check"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _execute(nb):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False).execute()


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_visible_tests_pass_on_the_reference_and_fail_on_the_stub(assignment):
    """Do the notebook's own test cells pass with the solutions filled in, and fail untouched?"""
    from nbclient.exceptions import CellExecutionError

    _execute(read_master(assignment))  # raises if any visible test fails on the reference
    learner = nbformat.read(str(assignment.notebook), as_version=4)
    with pytest.raises(CellExecutionError, match="NotImplementedError"):
        _execute(learner)


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_every_visible_assert_says_what_it_expected(assignment):
    """Does every assert of the notebook's own test cells carry a message, so that a failing visible test says
    in one line what it expected instead of a bare AssertionError?"""
    bare = []
    for cell in read_master(assignment).cells:
        if cell.cell_type != "code" or not is_grade(cell) or is_solution(cell):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Assert) and node.msg is None:
                bare.append(f"{cell.metadata['nbgrader']['grade_id']}, line {node.lineno}")
    assert not bare, f"asserts without a message in {assignment.key}: {bare}"
