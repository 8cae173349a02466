"""The grader's command line as an instructor and a learner use it: re-runs, bad input,
exit codes, grader faults, seeds and logs. Scores per chapter are in test_chapters.py."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import learner_notebook, mistake, reference_notebook, run_cli, run_json, write
from chapters.ch03_qkv import NO_SCALE

KEY = "03_qkv"


def own_copy(out: Path, tmp_path: Path) -> Path:
    """A copy of the chapter harness's output folder, for a test that grades into it again: the
    harness's own stays as its run wrote it, for every other test that reads it, in any order."""
    import shutil

    return Path(shutil.copytree(out, tmp_path / "out", symlinks=True))


def test_regrading_is_idempotent_and_force_regrades(graded_chapter, tmp_path):
    """Does a second run skip what is graded, and --force regrade without duplicating rows?"""
    base, harness_out, summary, by = graded_chapter(KEY)
    out = own_copy(harness_out, tmp_path)
    again = run_json("grade", "--assignment", KEY, str(base / "submitted"), "--out", str(out))
    assert all(s["skipped"] for s in again["submissions"])
    assert {s["student"]: s["score"] for s in again["submissions"]} == {s: by[s]["score"] for s in by}
    forced = run_json("grade", "--assignment", KEY, str(base / "submitted" / "no_scale.ipynb"),
                      "--out", str(out), "--force")
    assert [(s["student"], s["skipped"], s["score"]) for s in forced["submissions"]] == [("no_scale", False, 11.0)]
    from nbgrader.api import Gradebook

    with Gradebook(summary["gradebook"].replace(str(harness_out), str(out))) as gb:  # the copy's (a sqlite: URL)
        assert len(gb.assignment_submissions(KEY)) == len(by)


def test_a_run_writes_a_log_and_progress_goes_to_stderr(graded_chapter, tmp_path):
    """Does `grade` keep stdout for its result, print progress on stderr, and log every submission?"""
    base, harness_out, summary, by = graded_chapter(KEY)
    out = own_copy(harness_out, tmp_path)
    proc = run_cli("grade", "--assignment", KEY, str(base / "submitted" / "ref.ipynb"), "--out", str(out), "--force")
    assert proc.returncode == 0, proc.stderr
    assert "ref: 26 / 26" in proc.stderr and "ref: 23" not in proc.stdout
    log = Path(summary["log"]).read_text()  # the harness's run, which graded every submission
    assert all(f"{s} (" in log for s in by) and "status graded" in log
    new = {p.name for p in (out / "logs").iterdir()} - {p.name for p in (harness_out / "logs").iterdir()}
    assert len(new) == 1 and "ref (" in (out / "logs" / new.pop()).read_text()  # the forced run's own log


def test_seed_replays_a_grade_exactly(tmp_path, graded_chapter):
    """Does --seed with the seed a grade recorded give the same checks, points and hints again?"""
    _, _, _, by = graded_chapter(KEY)
    first = by["no_scale"]
    path = write(mistake(KEY, *NO_SCALE)(), tmp_path / "no_scale.ipynb")
    replay = run_json("check", str(path), "--seed", str(first["seed"]))
    strip = [(c["name"], c["points"], c["hint"]) for c in first["checks"]]
    assert replay["seed"] == first["seed"] and [(c["name"], c["points"], c["hint"]) for c in replay["checks"]] == strip
    other = run_json("check", str(path), "--seed", str(first["seed"] + 1))
    assert other["seed"] == first["seed"] + 1 and other["score"] == first["score"]


@pytest.mark.slow
def test_malformed_notebook_is_reported_not_fatal(tmp_path):
    """Does a truncated notebook get a clear error of its own while the rest of the batch is graded?"""
    subs = tmp_path / "submitted"
    write(reference_notebook(KEY), subs / "good.ipynb")
    text = (subs / "good.ipynb").read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    proc = run_cli("grade", "--assignment", KEY, str(subs), "--out", str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr  # a learner's broken file needs no instructor attention
    result = json.loads(proc.stdout)
    by = {s["student"]: s for s in result["submissions"]}
    assert by["good"]["score"] == 26
    assert by["truncated"]["status"] == "error" and "not valid notebook JSON" in by["truncated"]["error"]
    rows = list(csv.DictReader(open(result["csv"])))
    assert {r["student_id"]: r["status"] for r in rows} == {"good": "graded", "truncated": "error"}


BROKEN_HIDDEN_TEST = r'''
import functools, sys
import autograder.hidden.test_03_qkv as m
from autograder.cli import main
real = m.test_sdpa_rows_sum_to_one
@functools.wraps(real)  # the same fixtures, points and title
def broken(*args, **kwargs):
    real(*args, **kwargs)
    return [][1]  # a bug in our own test code, after the learner's code passed
m.test_sdpa_rows_sum_to_one = broken
raise SystemExit(main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_a_crashing_hidden_test_is_a_grader_error_not_a_lost_point(tmp_path):
    """Does a bug in a hidden test give status grader_error, a logged traceback and exit 3, never a lost point?"""
    import subprocess

    write(reference_notebook(KEY), tmp_path / "subs" / "alice.ipynb")
    proc = subprocess.run([sys.executable, "-c", BROKEN_HIDDEN_TEST, "grade", "--assignment", KEY,
                           str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 3, proc.stderr[-2000:]
    sub = json.loads(proc.stdout)["submissions"][0]
    assert sub["status"] == "grader_error" and "test_sdpa_rows_sum_to_one" in sub["error"]
    bad = [c for c in sub["checks"] if c["grader_error"]]
    assert [c["name"] for c in bad] == ["test_sdpa_rows_sum_to_one"] and "not a mistake of yours" in bad[0]["hint"]
    assert all(c["passed"] for c in sub["checks"] if not c["grader_error"])
    log = Path(json.loads(proc.stdout)["log"]).read_text()
    assert "IndexError" in log and "Traceback" in log and "test_sdpa_rows_sum_to_one" in log
    rows = list(csv.DictReader(open(tmp_path / "out" / f"{KEY}_grades.csv")))
    assert rows[0]["status"] == "grader_error"
    page = (tmp_path / "out" / "feedback" / "alice" / KEY / f"{KEY}.html").read_text()
    assert "fault in the grader" in page and "IndexError" not in page
    # Fixed, the rerun regrades it (a grader error is never kept as a finished grade).
    again = run_json("grade", "--assignment", KEY, str(tmp_path / "subs"), "--out", str(tmp_path / "out"))
    assert again["submissions"][0]["skipped"] is False and again["submissions"][0]["score"] == 26


def test_learner_self_check(tmp_path):
    """Does `check` print points per part, the total and hints, and say it ran unsandboxed?"""
    path = write(mistake(KEY, ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"))(),
                 tmp_path / "mine.ipynb")
    proc = run_cli("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "without a sandbox" in proc.stdout
    assert "scaled_dot_product_attention  0 / 15" in proc.stdout
    assert "total" in proc.stdout and "11 / 26" in proc.stdout
    assert re.search(r"hint \(the \d+ checks above\): The softmax runs over the wrong axis", proc.stdout)
    data = run_json("check", str(write(reference_notebook(KEY), tmp_path / "ref.ipynb")))
    assert data["score"] == data["max_score"] == 26 and data["sandboxed"] is False


def test_errors_name_the_real_problem(tmp_path):
    """Does a typo'd path say 'no such file' (not 'unknown assignment'), with exit 2?"""
    proc = run_cli("check", str(tmp_path / "03_qkv (1).ipynb"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and "unknown assignment" not in proc.stderr
    proc = run_cli("grade", "--assignment", KEY, str(tmp_path / "nothing-here"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr
    stray = write(learner_notebook(KEY), tmp_path / "mine.ipynb")
    stray.write_text(stray.read_text().replace('"assignment": "03_qkv"', '"assignment": "nope"'))
    proc = run_cli("check", str(stray))
    assert proc.returncode == 2 and "unknown assignment 'nope'" in proc.stderr
