"""Grading a cohort at once: `--jobs 2` and a Dask cluster that loses a worker mid-batch give the
gradebook of a sequential run; sandbox uids never collide across grading processes; GPU workers
are asked for only where a cluster has them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from autograder.batch.cohort import task_resources
from autograder.core.assignments import ROOT
from autograder.isolation.sandbox import SandboxUnavailable
from autograder.isolation.uids import uid_slot
from chapters.ch03_qkv import NO_SCALE
from conftest import learner_notebook, mistake, reference_notebook, run_cli, write

KEY = "03_qkv"
SEED = "5"  # one seed for every run: the same checks, so sequential and parallel grades must agree


def _gradebook(db) -> list[tuple]:
    """(student, grade cell, auto score, flagged) for every grade: what an instructor exports."""
    con = sqlite3.connect(str(db))
    try:
        return con.execute(
            "SELECT a.student_id, b.name, g.auto_score, n.flagged FROM submitted_assignment a "
            "JOIN submitted_notebook n ON n.assignment_id = a.id JOIN grade g ON g.notebook_id = n.id "
            "JOIN base_cell b ON b.id = g.cell_id ORDER BY a.student_id, b.name").fetchall()
    finally:
        con.close()


def _checks(summary: dict) -> dict:
    return {s["student"]: (s["status"], s["score"], [(c["name"], c["points"], c["hint"]) for c in s["checks"]])
            for s in summary["submissions"]}


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    """Six submissions (two correct, one correct but slow to load, the stub, a typical mistake, a truncated
    file) graded one by one. The slow one gives the Dask test a task that is surely still running a second
    after it started, now that a submission takes about a second to grade."""
    base = tmp_path_factory.mktemp("cohort")
    subs = base / "subs"
    for name in ("ref_a", "ref_b"):
        write(reference_notebook(KEY), subs / f"{name}.ipynb")
    slow = reference_notebook(KEY)
    slow.cells.append(nbformat.v4.new_code_cell("_pause = __import__('time').sleep(4)  # run at load: an assignment"))
    write(slow, subs / "slow.ipynb")
    write(learner_notebook(KEY), subs / "stub.ipynb")
    write(mistake(KEY, *NO_SCALE)(), subs / "no_scale.ipynb")
    text = (subs / "ref_a.ipynb").read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    proc = run_cli("grade", str(subs), "--assignment", KEY, "--out", str(base / "seq"), "--seed", SEED, "--jobs", "1",
                   "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert {s["student"]: s["score"] for s in summary["submissions"]} == {
        "ref_a": 26, "ref_b": 26, "slow": 26, "stub": 0, "no_scale": 11, "truncated": 0}
    return base, subs, summary, _gradebook(base / "seq" / "gradebook.db")


def test_two_jobs_give_the_sequential_gradebook(sequential):
    """Does `grade --jobs 2` give the same gradebook, CSV, checks and hints as one job, with progress?"""
    base, subs, seq, seq_rows = sequential
    out = base / "jobs2"
    proc = run_cli("grade", str(subs), "--assignment", KEY, "--out", str(out), "--seed", SEED, "--jobs", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert "with 2 jobs" in proc.stderr
    assert "(6/6 done, 1 failed, ETA 0 s)" in proc.stderr  # the last learner's line: the truncated file failed
    assert _gradebook(out / "gradebook.db") == seq_rows
    assert _checks(summary) == _checks(seq)
    assert (out / f"{KEY}_grades.csv").read_text() == (base / "seq" / f"{KEY}_grades.csv").read_text()
    assert [s["student"] for s in summary["submissions"]] == [s["student"] for s in seq["submissions"]]


def test_a_dask_worker_killed_mid_batch_costs_nothing(sequential):
    """Does a batch on a Dask cluster whose worker is killed while grading end with every learner
    graded once, exactly as in a sequential run?"""
    from distributed import Client, LocalCluster

    base, subs, seq, seq_rows = sequential
    out = base / "dask"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=0) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(subs), "--assignment", KEY,
                                 "--out", str(out), "--seed", SEED, "--json", "--scheduler", cluster.scheduler_address,
                                 "--insecure-scheduler"],  # the test's cluster is plain tcp://
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        killed = None
        deadline = time.monotonic() + 300
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            busy = {w: [k for k in keys if str(k).startswith("grade-")] for w, keys in client.processing().items()}
            busy = {w: keys for w, keys in busy.items() if keys and w in pids}
            if busy and any("with Dask scheduler" in ln for ln in lines):
                time.sleep(1.0)  # well inside the task: its sandboxed worker is running the learner's code
                now = client.processing()
                for worker, keys in sorted(busy.items()):
                    if keys[0] in now.get(worker, ()):  # still at it (the slow submission surely is)
                        os.kill(pids[worker], signal.SIGKILL)
                        killed = keys[0]
                        break
            time.sleep(0.2)
        stdout = proc.stdout.read()  # stderr stays the reader's alone
        proc.wait(timeout=600)
        reader.join(timeout=10)
    assert killed is not None, "no worker was busy grading to be killed: " + "".join(lines)[-2000:]
    assert proc.returncode == 0, "".join(lines)[-3000:]
    summary = json.loads(stdout)
    assert _gradebook(out / "gradebook.db") == seq_rows  # each learner once, with the sequential scores
    assert _checks(summary) == _checks(seq)
    assert sum(ln.startswith(("ref_a:", "ref_b:", "slow:", "stub:", "no_scale:", "truncated:")) for ln in lines) == 6
    # An unauthenticated scheduler, asked for explicitly: used, with a warning that says what it exposes.
    assert any(ln.startswith("warning: --insecure-scheduler: the Dask scheduler tcp://") for ln in lines)


@pytest.mark.parametrize("uses_cuda, workers, wanted", [
    (True, {"tcp://a": {"resources": {}}, "tcp://b": {"resources": {}}}, None),   # no GPU anywhere: CPU checks
    (True, {"tcp://a": {"resources": {}}, "tcp://b": {"resources": {"GPU": 1}}}, {"GPU": 1}),  # all to GPU workers
    (False, {"tcp://a": {"resources": {"GPU": 2}}}, None),                          # no CUDA check: any worker
    (True, {}, None),
])
def test_gpu_workers_are_asked_for_only_where_the_cluster_has_them(uses_cuda, workers, wanted):
    """Do the tasks of an exercise with CUDA checks ask for a GPU exactly when some worker has one?"""
    assert task_resources(uses_cuda, workers) == wanted


HOLD_SLOT = "import sys; from autograder.isolation.uids import uid_slot; print(*uid_slot(1024, folder=sys.argv[1]), flush=True); sys.stdin.read()"


def test_grading_processes_get_disjoint_sandbox_uids(tmp_path):
    """Do grading processes on one machine hold disjoint shares of the sandbox uids, freed when one ends?"""
    folder = str(tmp_path / "slots")

    def hold():
        p = subprocess.Popen([sys.executable, "-c", HOLD_SLOT, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        return p, tuple(map(int, p.stdout.readline().split()))

    held = [hold() for _ in range(3)]
    shares = [set(range(off, off + n)) for _, (off, n) in held]
    assert all(len(s) == 1024 // 64 for s in shares)
    assert not (shares[0] & shares[1] or shares[0] & shares[2] or shares[1] & shares[2])
    first, (offset, _) = held[0]
    first.kill()  # a SIGKILLed grader frees its slot
    first.wait()
    again, got = hold()
    assert got[0] == offset
    for p, _ in [*held[1:], (again, None)]:
        p.stdin.close()
        p.wait(timeout=30)
    os.chmod(folder, 0o755)  # a folder others can write to could hold every slot: refused
    with pytest.raises(SandboxUnavailable):
        uid_slot(1024, folder=folder)
