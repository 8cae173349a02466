"""Nothing lost: a grading run killed mid-batch resumes with no lost and no duplicated grade;
re-grading is idempotent; --force regrades."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.core.assignments import ROOT
from conftest import learner_notebook, reference_notebook, run_cli, write

KEY = "03_qkv"
PROGRESS = re.compile(r"^(\S+): [\d.]+ / [\d.]+")


def _rows(db: Path) -> list[tuple]:
    con = sqlite3.connect(str(db))
    try:
        return con.execute(
            "SELECT a.student_id, COUNT(DISTINCT a.id), SUM(COALESCE(g.auto_score, 0)) FROM submitted_assignment a "
            "JOIN submitted_notebook n ON n.assignment_id = a.id JOIN grade g ON g.notebook_id = n.id "
            "GROUP BY a.student_id ORDER BY a.student_id").fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module", params=[1, 2], ids=["1job", "2jobs"])
def killed_and_resumed(request, tmp_path_factory):
    """A batch killed after two grades, resumed, and run again: the same with one job or two at once."""
    jobs = ["--jobs", str(request.param)]
    base = tmp_path_factory.mktemp("reliability")
    subs, out = base / "subs", base / "out"
    expected = {}
    for i in range(4):
        name = f"s{i}"
        write(reference_notebook(KEY) if i % 2 == 0 else learner_notebook(KEY), subs / f"{name}.ipynb")
        expected[name] = 26.0 if i % 2 == 0 else 0.0
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--assignment", KEY, "--out", str(out), *jobs]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    graded_before_kill = []
    for line in proc.stderr:
        m = PROGRESS.match(line)
        if m:
            graded_before_kill.append(m.group(1))
            if len(graded_before_kill) == 2:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait(timeout=60)
    time.sleep(0.5)
    rows_after_kill = _rows(out / "gradebook.db")
    resumed = run_cli("grade", str(subs), "--assignment", KEY, "--out", str(out), *jobs)
    again = run_cli("grade", str(subs), "--assignment", KEY, "--out", str(out), *jobs)
    return {"base": base, "subs": subs, "out": out, "expected": expected, "jobs": jobs, "killed_rc": proc.returncode,
            "before": graded_before_kill, "rows_after_kill": rows_after_kill, "resumed": resumed, "again": again}


def test_the_run_was_killed_mid_batch(killed_and_resumed):
    k = killed_and_resumed
    assert k["killed_rc"] == -signal.SIGKILL
    assert len(k["before"]) == 2
    assert 2 <= len(k["rows_after_kill"]) < 4


def test_resumed_run_has_every_grade_once(killed_and_resumed):
    k = killed_and_resumed
    assert k["resumed"].returncode == 0, k["resumed"].stderr
    rows = _rows(k["out"] / "gradebook.db")
    assert [r[0] for r in rows] == sorted(k["expected"])
    assert all(r[1] == 1 for r in rows)  # one submission per learner, never two
    assert {r[0]: r[2] for r in rows} == k["expected"]
    # those graded before the kill were not graded again
    for name in k["before"]:
        assert f"{name}: already graded" in k["resumed"].stderr


def test_csv_matches_a_clean_run(killed_and_resumed):
    k = killed_and_resumed
    lines = (k["out"] / f"{KEY}_grades.csv").read_text().splitlines()
    assert len(lines) == 5
    scores = {ln.split(",")[0]: float(ln.split(",")[2]) for ln in lines[1:]}
    assert scores == k["expected"]


def test_regrading_is_idempotent(killed_and_resumed):
    k = killed_and_resumed
    assert k["again"].returncode == 0
    assert k["again"].stderr.count("already graded") == 4
    assert len(_rows(k["out"] / "gradebook.db")) == 4


def test_force_regrades(killed_and_resumed):
    k = killed_and_resumed
    nb = k["subs"] / "s0.ipynb"
    proc = run_cli("grade", str(nb), "--assignment", KEY, "--out", str(k["out"]), "--force")
    assert proc.returncode == 0, proc.stderr
    assert "s0: 26 / 26" in proc.stderr and "already graded" not in proc.stderr
    rows = _rows(k["out"] / "gradebook.db")
    assert len(rows) == 4 and all(r[1] == 1 for r in rows)


def test_changed_submission_is_regraded_and_lost_gradebook_rows_are_restored(killed_and_resumed):
    k = killed_and_resumed
    write(reference_notebook(KEY), k["subs"] / "s1.ipynb")  # s1 resubmits a correct notebook
    other_db = k["base"] / "fresh.db"
    proc = run_cli("grade", str(k["subs"]), "--assignment", KEY, "--out", str(k["out"]),
                   "--gradebook", f"sqlite:///{other_db}", "--json", *k["jobs"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # a gradebook without these rows is filled again, not skipped because results exist
    assert not any(r["skipped"] for r in data["submissions"])
    assert {r[0]: r[2] for r in _rows(other_db)} == dict(k["expected"], s1=26.0)
