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

from attacks.environment import Poison, planted_in
from conftest import mistake, reference_notebook, run_cli, write

KEY = "03_qkv"
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
# The instructor's course.toml the zip is packaged with: held back until the due date, but for the
# part `softmax` (shown at once) and one check never shown; another exercise's due date and a
# roster that the zip must not need.
COURSE_TOML = f"""
[gradescope]
visibility = "after_due_date"

[assignments.{KEY}]
gradescope_checks = {{ softmax = "visible", test_sdpa_half_precision = "hidden" }}

[assignments.04_self_attention]
due = 2026-12-17T23:59:00+01:00
gradescope_visibility = "after_published"

[lms]
roster = "roster.csv"
"""


def expected_visibility(check: dict) -> str:
    """What COURSE_TOML gives the check `check` (a check of `check --json`): its own entry, its part's, the course's."""
    return {"test_sdpa_half_precision": "hidden"}.get(check["name"]) or \
        {"softmax": "visible"}.get(check["part"]) or "after_due_date"


def assert_spec(results: dict) -> None:
    """Does results.json have the fields and types Gradescope's specification gives, with every text
    marked plain text (never rendered as HTML or Markdown)?"""
    assert isinstance(results["score"], float)
    assert isinstance(results["execution_time"], int)
    assert isinstance(results["output"], str) and results["output"]
    assert results["visibility"] in VISIBILITY and results["stdout_visibility"] in VISIBILITY
    assert results["output_format"] == results["test_output_format"] == results["test_name_format"] == "text"
    for t in results["tests"]:
        assert set(t) <= {"score", "max_score", "status", "name", "name_format", "number", "output",
                          "output_format", "tags", "visibility", "extra_data"}
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["score"], float) and isinstance(t["max_score"], float)
        assert t["status"] in ("passed", "failed") and t["visibility"] in VISIBILITY
        assert isinstance(t["output"], str)
        assert t["output_format"] == t["name_format"] == "text"
    if results["tests"]:
        assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("zip")
    (folder / "course.toml").write_text(COURSE_TOML, encoding="utf-8")
    (folder / "roster.csv").write_text("student_id,name\nalice,Alice\n", encoding="utf-8")
    path = folder / "autograder.zip"
    proc = run_cli("gradescope", "--assignment", KEY, "--package", str(path), "--config", str(folder / "course.toml"))
    assert proc.returncode == 0, proc.stderr
    assert "after_due_date (softmax: visible, test_sdpa_half_precision: hidden)" in proc.stdout
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
    assert "--config" in (tmp_path / "run_autograder").read_text()
    assert "download.pytorch.org/whl/cpu" in (tmp_path / "setup.sh").read_text()


def test_the_zip_holds_one_exercise_and_its_gradescope_settings(autograder_zip, tmp_path):
    """Does the zip hold KEY's hidden tests, reference, notebook and master, and no other exercise's (nor the
    hidden tests' authoring guide), with a course.toml that carries KEY's Gradescope settings only?"""
    from autograder.core.assignments import all_assignments
    from autograder.course.course_config import parse_config

    with zipfile.ZipFile(autograder_zip) as z:
        names = z.namelist()
        toml = z.read("course/course.toml").decode()
    others = [a.key for a in all_assignments() if a.key != KEY]
    assert len(others) >= 8
    assert not [n for n in names if any(k in n for k in others)], "another exercise's file is in the zip"
    assert sorted(n for n in names if n.startswith("course/autograder/hidden/")) == [
        "course/autograder/hidden/__init__.py", "course/autograder/hidden/support.py",
        f"course/autograder/hidden/test_{KEY}.py"]
    assert sorted(n for n in names if n.startswith(("course/solutions/", "course/exercises/"))) == [
        f"course/exercises/{KEY}.ipynb", f"course/exercises/source/{KEY}.md", "course/solutions/__init__.py",
        f"course/solutions/ch{KEY}.py"]
    # the settings read back as the instructor's file gave them, with nothing of the roster or exercise 04
    assert "roster" not in toml and "04_" not in toml
    (tmp_path / "course.toml").write_text(toml)
    settings = parse_config(toml, tmp_path / "course.toml", [KEY]).assignment(KEY)
    assert settings.gradescope_visibility == "after_due_date"
    assert settings.gradescope_checks == {"softmax": "visible", "test_sdpa_half_precision": "hidden"}


def test_a_bad_visibility_is_refused_in_one_line(tmp_path):
    """Is a visibility Gradescope does not know refused with one line naming the file and the setting (exit 2),
    both when packaging (no zip) and inside Gradescope (results.json says the autograder is misconfigured)?"""
    bad = tmp_path / "course.toml"
    bad.write_text(f'[assignments.{KEY}]\ngradescope_checks = {{ softmax = "after_deadline" }}\n')
    zip_path = tmp_path / "a.zip"
    proc = run_cli("gradescope", "--assignment", KEY, "--package", str(zip_path), "--config", str(bad))
    sentence = (f"{bad}: assignments.{KEY}.gradescope_checks.softmax must be one of 'visible', 'after_due_date', "
                "'after_published', 'hidden', not 'after_deadline'")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(sentence), proc.stderr
    assert "Traceback" not in proc.stderr and not zip_path.exists()
    results = tmp_path / "results.json"
    proc = run_cli("gradescope", "--assignment", KEY, "--config", str(bad), "--submission", str(tmp_path),
                   "--results", str(results))
    data = json.loads(results.read_text())
    assert proc.returncode == 2 and data["score"] == 0.0 and "misconfigured" in data["output"]
    assert sentence in data["output"] and data["tests"] == []


def _result(statuses: dict, status: str = "graded"):
    """A `grader.Result` of KEY whose checks are (name, part, points, passed) as `statuses` says."""
    from autograder.grading.grader import CheckResult, Result

    checks = [CheckResult(name=n, part=p, title=f"title of {n}", points=pts if ok else 0.0, max_points=pts, passed=ok,
                          hint="" if ok else f"hint of {n}") for n, (p, pts, ok) in statuses.items()]
    return Result(assignment=KEY, notebook="n.ipynb", status=status, error="" if status == "graded" else "broken",
                  score=sum(c.points for c in checks), max_score=sum(c.max_points for c in checks), checks=checks)


def test_each_check_gets_its_own_visibility_and_the_score_waits_with_them():
    """A check's entry beats its part's, which beats the exercise's, which beats the course's; the top level
    is the exercise's; while a check worth points waits for the due date, the text above the tests leaves the
    score out (Gradescope hides the total then); a notebook that could not be graded is told so at once."""
    from autograder.core.limits import DEFAULT
    from autograder.course.course_config import AssignmentSettings
    from autograder.course.gradescope import results_of

    checks = {"test_a": ("softmax", 1.0, True), "test_b": ("softmax", 2.0, False), "test_c": ("masks", 1.0, False)}
    settings = AssignmentSettings(KEY, gradescope_visibility="after_published",
                                  gradescope_checks={"softmax": "visible", "test_b": "after_due_date"})
    data = results_of(_result(checks), DEFAULT, {}, 0.0, settings)
    assert_spec(data)
    assert data["visibility"] == "after_published"
    assert [t["visibility"] for t in data["tests"]] == ["visible", "after_due_date", "after_published"]
    assert data["score"] == 1.0 and "1 /" not in data["output"] and "/ 4" not in data["output"]
    assert data["output"].startswith(f"{KEY}: your score, and 2 of the 3 checks, are shown after the due date or "
                                     "once your instructor publishes the grades.")
    # checks shown at once or never: the score is said (Gradescope shows the total then too)
    shown = AssignmentSettings(KEY, gradescope_visibility="hidden", gradescope_checks={"test_a": "visible"})
    data = results_of(_result(checks), DEFAULT, {}, 0.0, shown)
    assert data["visibility"] == "hidden" and data["output"].startswith(f"{KEY}: 1 / 4 points.")
    # not graded: the sentence saying why is shown at once, whatever the setting
    data = results_of(_result(checks, status="error"), DEFAULT, {}, 0.0, settings)
    assert data["visibility"] == "visible" and "Your notebook was not graded: broken" in data["output"]
    # no settings: everything visible, as Gradescope's default
    data = results_of(_result(checks), DEFAULT, {}, 0.0)
    assert {data["visibility"], *(t["visibility"] for t in data["tests"])} == {"visible"}


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
    from autograder.isolation.sandbox import make_sandbox
    from autograder.isolation.unavailable import SandboxUnavailable

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
    # Gradescope's harness starts run_autograder with a planted environment (tests/attacks/environment.py),
    # from a working folder with a sitecustomize.py; the Python that run_autograder starts records the
    # arguments and environment it was given, then becomes the course's Python.
    poison = Poison(tmp_path / "planted")
    started = tmp_path / "started"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {started}.argv\ncat /proc/$$/environ > {started}.env\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = dict(os.environ, AUTOGRADER_ROOT=str(tree), AUTOGRADER_PYTHON=str(python), OMP_NUM_THREADS="1",
               **poison.env)

    def grade(nb) -> dict:
        sub = tree / "submission"
        if sub.exists():
            for p in sub.iterdir():
                p.unlink()
        write(nb, sub / f"{KEY}.ipynb")
        proc = subprocess.run(["bash", str(run)], env=env, cwd=poison.cwd, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads((tree / "results" / "results.json").read_text())
        assert_spec(data)
        return data, proc

    full, proc = grade(reference_notebook(KEY))
    assert full["score"] == sum(t["max_score"] for t in full["tests"]) > 0
    assert all(t["status"] == "passed" for t in full["tests"])
    # the zip's course.toml reached results.json: the top level and every test (COURSE_TOML)
    assert full["visibility"] == "after_due_date" and "shown after the due date" in full["output"]
    assert {t["visibility"] for t in full["tests"]} == {"visible", "hidden", "after_due_date"}
    # Nothing planted reached the grader or the processes it started: only run_autograder's own shell
    # was given the missing library (the loader says so once), the grader ran `python -I`.
    given = dict(x.split("=", 1) for x in Path(f"{started}.env").read_text().split("\0") if "=" in x)
    assert not planted_in(given) and given["AUTOGRADER_ROOT"] == str(tree) and given["OMP_NUM_THREADS"] == "1"
    assert Path(f"{started}.argv").read_text().split("\n")[0] == "-I"
    assert poison.ran() == [] and proc.stderr.count(str(poison.library)) == 1, proc.stderr[-3000:]

    # a mistake, graded by the unpacked zip's own course (as run_autograder starts it, with a fixed seed):
    # the same points per check as the learner's `check`, each test with its visibility
    from autograder.course.gradescope import LAUNCH

    course = tree / "source" / "course"
    wrong = write(mistake(KEY, ("math.sqrt(d_k)", "d_k"))(), tmp_path / "mistake" / f"{KEY}.ipynb")
    results = tmp_path / "mistake-results.json"
    proc = subprocess.run([sys.executable, "-I", "-c", LAUNCH, str(course), "gradescope", "--assignment", KEY,
                           "--config", str(course / "course.toml"), "--submission", str(wrong.parent), "--results",
                           str(results), "--seed", "7"], cwd=course, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(results.read_text())
    assert_spec(data)
    checked = json.loads(run_cli("check", str(wrong), "--json", "--seed", "7").stdout)
    assert data["score"] == checked["score"] < full["score"]
    assert [t["score"] for t in data["tests"]] == [float(c["points"]) for c in checked["checks"]]
    assert [t["visibility"] for t in data["tests"]] == [expected_visibility(c) for c in checked["checks"]]
    assert data["visibility"] == "after_due_date" and f"{checked['score']:g} /" not in data["output"]
    failed = [t for t in data["tests"] if t["status"] == "failed"]
    assert failed and all(t["output"] for t in failed)  # a hint for every failed check


# --- without bubblewrap: the worker's own uid ----------------------------------------------------

LEAVE = r'''
import json, os, sys, time
r, w = os.pipe()
if os.fork() == 0:  # a daemon: a double fork into a session of its own, its output let go
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.write(w, b"%d" % os.getpid())
        time.sleep(300)
    os._exit(0)
os.close(w)
daemon = int(os.read(r, 64))
print(json.dumps({"uid": os.getuid(), "daemon": daemon, "isolated": sys.flags.isolated,
                  "oom": open("/proc/self/oom_score_adj").read().strip(),
                  "daemon_oom": open(f"/proc/{daemon}/oom_score_adj").read().strip(),
                  "environ": sorted(os.environ)}))
'''
TEST_UIDS = range(61370, 61378)  # below every sandbox range (tests/conftest.py): no other grader's uids


def _uid_isolation():
    """Gradescope's fallback without bubblewrap, with a Python that an unprivileged uid can run (the
    course's environment may sit under /root, closed to other users), drawing uids from TEST_UIDS."""
    from autograder.core.limits import DEFAULT
    from autograder.course.gradescope import UidIsolation
    from autograder.isolation.uids import UidPool
    from autograder.isolation.unavailable import SandboxUnavailable

    if os.geteuid() != 0:
        pytest.skip("a worker uid of its own needs root")
    why = "no Python"
    for python in (sys.executable, "/usr/bin/python3"):
        if not os.path.exists(python):
            continue
        try:
            iso = UidIsolation(DEFAULT, python=python)
            iso.uids = UidPool(TEST_UIDS)
            iso.probe()
            return iso
        except SandboxUnavailable as exc:
            why = str(exc)
    pytest.skip(f"no Python a worker uid can run here: {why}")


def test_without_bubblewrap_nothing_of_the_workers_uid_outlives_it(tmp_path, monkeypatch):
    """Gradescope without bubblewrap: a worker whose code leaves a double-forked daemon behind (in a
    session of its own) is the OOM killer's first choice, daemon included; once the worker has ended and
    its sandbox is released, no process of its uid is alive. It starts with `-I` and the worker's own
    environment, whatever the grader's was (tests/attacks/environment.py)."""
    from autograder.isolation.processes import kill_group, uid_processes
    from autograder.isolation.runner import Submission

    poison = Poison(tmp_path / "planted").apply(monkeypatch)
    iso = _uid_isolation()
    script = tmp_path / "leave.py"
    script.write_text(LEAVE)
    w = iso.wrap([], files=[script], env=Submission.base_env())
    try:
        proc = subprocess.Popen(w.argv, env=w.env, cwd=w.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        seen = json.loads(out)
        kill_group(proc)  # as a worker is ended: its process group
        assert seen["daemon"] in uid_processes(seen["uid"])  # the daemon outlived the worker...
    finally:
        w.release()
    assert uid_processes(seen["uid"]) == []  # ...but not its sandbox
    assert seen["uid"] in TEST_UIDS and seen["oom"] == seen["daemon_oom"] == "1000"
    assert seen["isolated"] == 1 and not planted_in(dict.fromkeys(seen["environ"]))
    assert poison.ran() == [] and not poison.loaded(err)
