"""Gradescope's autograder: the zip an instructor uploads, and results.json as Gradescope's
specification describes it (https://gradescope-autograders.readthedocs.io/en/latest/specs/)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import mistake, reference_notebook, run_cli, write

KEY = "03_qkv"
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def assert_spec(results: dict) -> None:
    """Does results.json have the fields and types Gradescope's specification gives?"""
    assert isinstance(results["score"], float)
    assert isinstance(results["execution_time"], int)
    assert isinstance(results["output"], str) and results["output"]
    assert results["visibility"] in VISIBILITY and results["stdout_visibility"] in VISIBILITY
    for t in results["tests"]:
        assert set(t) <= {"score", "max_score", "status", "name", "name_format", "number", "output",
                          "output_format", "tags", "visibility", "extra_data"}
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["score"], float) and isinstance(t["max_score"], float)
        assert t["status"] in ("passed", "failed") and t["visibility"] in VISIBILITY
        assert isinstance(t["output"], str)
    if results["tests"]:
        assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("zip") / "autograder.zip"
    proc = run_cli("gradescope", "--assignment", KEY, "--package", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


def test_the_zip_holds_the_scripts_and_the_course_and_nothing_else(autograder_zip, tmp_path):
    """Are setup.sh and run_autograder at the root, executable and valid bash, beside the grader's files only?"""
    with zipfile.ZipFile(autograder_zip) as z:
        names = z.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        z.extractall(tmp_path)
    for script in ("setup.sh", "run_autograder"):
        assert modes[script] & 0o111, script
        assert subprocess.run(["bash", "-n", str(tmp_path / script)]).returncode == 0
    for needed in ("course/autograder/__main__.py", f"course/autograder/hidden/test_{KEY}.py",
                   f"course/solutions/ch{KEY}.py", f"course/exercises/{KEY}.ipynb",
                   f"course/exercises/source/{KEY}.md", "requirements-gradescope.txt", "README.md"):
        assert needed in names, needed
    tops = {n.split("/")[0] for n in names}
    assert tops == {"setup.sh", "run_autograder", "README.md", "requirements-gradescope.txt", "course"}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith("course/tests/")]
    assert f"--assignment {KEY}" in (tmp_path / "run_autograder").read_text()
    assert "download.pytorch.org/whl/cpu" in (tmp_path / "setup.sh").read_text()


def test_package_needs_an_assignment(tmp_path):
    proc = run_cli("gradescope", "--package", str(tmp_path / "a.zip"))
    assert proc.returncode == 2 and "--assignment" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("files, words", [
    ({}, "no notebook"),
    ({"a.ipynb": "{}", "sub/b.ipynb": "{}"}, "2 notebooks"),
])
def test_a_submission_without_one_notebook_scores_0_with_a_sentence(tmp_path, files, words):
    """Does an empty submission, or one with two notebooks, get 0 and a sentence instead of a crash?"""
    sub = tmp_path / "submission"
    sub.mkdir()
    for name, text in files.items():
        (sub / name).parent.mkdir(parents=True, exist_ok=True)
        (sub / name).write_text(text)
    results = tmp_path / "results" / "results.json"
    proc = run_cli("gradescope", "--assignment", KEY, "--submission", str(sub), "--results", str(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(results.read_text())
    assert_spec(data)
    assert data["score"] == 0.0 and words in data["output"] and data["tests"] == []


def test_a_linked_notebook_is_refused(tmp_path):
    sub = tmp_path / "submission"
    sub.mkdir()
    target = write(reference_notebook(KEY), tmp_path / "elsewhere.ipynb")
    (sub / f"{KEY}.ipynb").symlink_to(target)
    results = tmp_path / "results.json"
    run_cli("gradescope", "--assignment", KEY, "--submission", str(sub), "--results", str(results))
    data = json.loads(results.read_text())
    assert data["score"] == 0.0 and "is a link" in data["output"]


def _sandbox_problem() -> str:
    from autograder.sandbox import make_sandbox
    from autograder.unavailable import SandboxUnavailable

    try:
        make_sandbox()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


@pytest.mark.slow
def test_run_autograder_grades_the_reference_and_a_mistake_as_check_does(autograder_zip, tmp_path):
    """In a fake /autograder tree: does run_autograder give the reference full marks, and a mistake
    the same points per check as `check --json --seed S`?"""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(f"no sandbox here: {problem}")
    tree = tmp_path / "autograder"
    with zipfile.ZipFile(autograder_zip) as z:
        z.extractall(tree / "source")
    run = tree / "source" / "run_autograder"
    run.chmod(run.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, AUTOGRADER_ROOT=str(tree), AUTOGRADER_PYTHON=sys.executable, OMP_NUM_THREADS="1")

    def grade(nb) -> dict:
        sub = tree / "submission"
        if sub.exists():
            for p in sub.iterdir():
                p.unlink()
        write(nb, sub / f"{KEY}.ipynb")
        proc = subprocess.run(["bash", str(run)], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads((tree / "results" / "results.json").read_text())
        assert_spec(data)
        return data

    full = grade(reference_notebook(KEY))
    assert full["score"] == sum(t["max_score"] for t in full["tests"]) > 0
    assert all(t["status"] == "passed" for t in full["tests"])

    # a mistake, graded with a fixed seed: the same points per check as the learner's `check`
    wrong = write(mistake(KEY, ("math.sqrt(d_k)", "d_k"))(), tmp_path / "mistake" / f"{KEY}.ipynb")
    results = tmp_path / "mistake-results.json"
    proc = run_cli("gradescope", "--assignment", KEY, "--submission", str(wrong.parent), "--results", str(results),
                   "--seed", "7")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(results.read_text())
    assert_spec(data)
    checked = json.loads(run_cli("check", str(wrong), "--json", "--seed", "7").stdout)
    assert data["score"] == checked["score"] < full["score"]
    assert [t["score"] for t in data["tests"]] == [float(c["points"]) for c in checked["checks"]]
    failed = [t for t in data["tests"] if t["status"] == "failed"]
    assert failed and all(t["output"] for t in failed)  # a hint for every failed check
