"""Seed robustness of the hidden tests (`python -m autograder seeds`): a fixed sample of table
rows and mutants keeps its verdict under several seeds, and the command's logic reports a
check planted to depend on the seed.

The full run is `python -m autograder seeds KEY --jobs 2` (minutes per exercise, 20 seeds);
here one exercise grades a few rows and mutants under four seeds, in process. Killed while it
grades with ``--jobs 2``, the command leaves none of its processes running.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder.core.assignments import ROOT, get_assignment
from autograder.grading.grader import Grader, check_seed
from autograder.quality import seeds as sd

KEY = "03_qkv"
SEEDS = [1, 2, 3, 4]
ROWS = ["ref", "no_scale", "fill_minus_1e9", "inverted_mask"]
MUTANTS = 2


@pytest.fixture(scope="module")
def grader():
    return Grader(get_assignment(KEY))  # unsandboxed: the notebooks are the reference, changed by us


@pytest.mark.slow
def test_sampled_rows_and_mutants_keep_their_verdict_under_every_seed(grader):
    """Do a few rows of the mistake table and a few mutants get the same verdict (and the rows their
    table's score, checks and hints) under each of several seeds?"""
    rep = sd.run(KEY, seeds=SEEDS, row_names=ROWS, mutant_sample=MUTANTS, grader=grader)
    assert (rep["rows"], rep["mutants"]) == (len(ROWS), MUTANTS)
    assert rep["stable"] and not rep["table_disagreements"] and not rep["worker_history"], sd.format_report(rep)
    assert rep["killed_every_seed"] == MUTANTS
    assert "verdicts stable across seeds" in sd.format_report(rep)


def _planted(check, seeds):
    """`check`, passing whenever the submission's seed is one of `seeds` (a check whose inputs hide the
    mistake under some seeds)."""
    lucky = {check_seed(s, check.name) for s in seeds}

    def planted(learner, reference, rng, devices, seed, prepared):
        if seed in lucky:
            return
        check.fn(**{p: v for p, v in dict(learner=learner, reference=reference, rng=rng, devices=devices,
                                                seed=seed, prepared=prepared).items() if p in check.params})
    return dataclasses.replace(check, fn=planted,
                               params=("learner", "reference", "rng", "devices", "seed", "prepared"))


@pytest.mark.slow
def test_a_planted_seed_dependent_check_is_reported(grader, tmp_path):
    """With the checks that see a row's mistake and a mutant's made to pass under seeds 2 and 4, does the
    command report both as varying, name those seeds and the checks that flip, and have fresh grades
    confirm it?"""
    mutant = sd.mutant_items(KEY, MUTANTS)[0]
    failed = set()
    for item in sd.table_rows(KEY, ["no_scale"]) + [mutant]:
        failed |= set(sd.grade_fresh(grader, item, [1], tmp_path)[1]["failed"])
    assert failed
    lucky = [2, 4]
    planted = Grader(get_assignment(KEY))
    planted.checks = [_planted(c, lucky) if c.name in failed else c for c in planted.checks]
    rep = sd.run(KEY, seeds=SEEDS, row_names=["no_scale"], mutant_ids=[mutant.name], grader=planted)
    assert not rep["stable"] and set(rep["unstable"]) == {"no_scale", mutant.name}
    by = {r["name"]: r for r in rep["results"]}
    assert by["no_scale"]["differing_seeds"] in ([1, 3], lucky) and by["no_scale"]["confirmed"]
    assert by[mutant.name]["per_seed"] == {"1": "killed", "2": "survived", "3": "killed", "4": "survived"}
    flips = by["no_scale"]["flipping_checks"]
    assert flips and all(f == {"fails": [1, 3], "passes": lucky} for f in flips.values())
    text = sd.format_report(rep)
    assert "vary with the seed" in text and "survived at seeds 2, 4" in text and "fails at seeds 1, 3" in text
    assert rep["table_disagreements"] == ["no_scale"]  # the row loses less than its table says under 2 and 4


def test_seed_ranges_and_cli_usage(capsys):
    """Are seeds shown as ranges, and does the command refuse an unknown exercise or row?"""
    from autograder.cli import main

    assert sd.seed_ranges([5, 1, 2, 3, 7, 8]) == "1-3, 5, 7-8"
    assert main(["seeds", "99_nothing"]) == 2
    assert main(["seeds", KEY, "--rows", "no_such_row", "--seeds", "1", "--quiet"]) == 2
    assert "no such row" in capsys.readouterr().err


# --- the command's processes end with it ----------------------------------------------------------------

RUN = ["seeds", "01_seq2seq", "--mutants-only", "--sample", "6", "--jobs", "2", "--seeds", "3"]


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process, or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], fields[19]


def _descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process below `pid` (children, their children, ...)."""
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            for child in children:
                st = _stat(child)
                if st is not None and child not in out:
                    out[child] = st[1]
                    todo.append(child)
    return out


def _marked(marker: bytes) -> dict[int, str]:
    """pid -> start time of every process whose environment holds `marker`."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            st = _stat(int(entry.name))
            if marker in environ.split(b"\0") and st is not None:
                out[int(entry.name)] = st[1]
    return out


def _still_running(procs: dict[int, str]) -> dict[int, str]:
    """Those of `procs` (pid -> start time) that still run (zombies and reused pids left out), with
    their command lines."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[0] != "Z" and st[1] == start:
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_pool_ends_when_the_command_is_killed(sig, tmp_path):
    """With `seeds --jobs 2` killed (SIGKILL or SIGTERM, to its own pid only) while it grades, does no
    process it started (the pool's, the workers they started) keep running?"""
    marker = f"SEEDS_TEST_RUN={tmp_path}".encode()  # this run's processes only: nobody else's
    env = {**os.environ, "SEEDS_TEST_RUN": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "autograder", *RUN, "--out", str(tmp_path)], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    started = set()
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:  # until its first progress line (a graded mutant) or 90 s
            try:
                if lines.get(timeout=0.2).startswith(b"["):
                    break
            except queue.Empty:
                pass
            assert proc.poll() is None, "the run ended before it was killed"
        started = {**_descendants(proc.pid), **_marked(marker)}
        assert len(started) >= 2, "no pool started"  # the pool's processes (and the resource tracker)
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=30) == -sig  # a SIGTERM still ends the command as it did
        # A pool process still starting (importing the course) when the parent dies ends when it reaches
        # its initializer, which finds its parent gone: on a loaded machine that can take tens of seconds.
        end = time.monotonic() + 60
        while True:
            left = _still_running({**started, **_marked(marker)})
            if not left or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert not left, f"still running after the command was killed: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _still_running({**started, **_marked(marker)}):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


ORPHAN = """
import os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from autograder.isolation.processes import die_with_parent
die_with_parent(os.getppid(), grace=0.5, cleanup=lambda: open(sys.argv[2], "w").close())
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the orderly end never comes: as if it had been lost
grandchild = subprocess.Popen(["sleep", "300"], start_new_session=True)
print(os.getpid(), grandchild.pid, flush=True)
time.sleep(300)
"""

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], stdout=sys.stdout)
child.wait()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc (Linux)")
def test_an_orphan_whose_sigterm_is_lost_still_ends_with_what_it_started(tmp_path):
    """A process of the pool whose SIGTERM is lost (handled, or ignored) when its parent dies is ended
    by its watchdog, after its cleanup, with the process group it started."""
    done = tmp_path / "cleaned"
    procs: dict[int, str] = {}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, ORPHAN, str(ROOT), str(done)],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, "the orphan did not start"
        procs = {pid: _stat(pid)[1] for pid in pids}
        assert len(_still_running(procs)) == 2
        time.sleep(1)  # longer than the grace: only the parent's death may start it
        assert len(_still_running(procs)) == 2 and not done.exists()
        parent.kill()
        parent.wait()
        end = time.monotonic() + 20
        while _still_running(procs) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _still_running(procs), "the orphan or its process group outlived the parent"
        assert done.exists(), "the watchdog ended the orphan without its cleanup"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _still_running(procs):
            os.kill(pid, signal.SIGKILL)
