"""A learner's `check` never shows more points than `grade` gives.

Each chapter's harness table (tests/chapters/) is graded three ways with one seed: as `grade`
grades it (sandboxed, with a memory cgroup: the warm start, which grades the same as a fresh
worker, see tests/isolation/test_warm_start.py), as plain `check` does (unsandboxed, the worker
process's own memory measured) and as `check --sandbox` does on a machine without a memory
cgroup (`AUTOGRADER_CGROUP_PARENT=none`, a typical laptop). Every check's points under `check`
must be at most its points under `grade`, and here, on one machine, equal. Every notebook ends
with the check cell the instructions tell learners to add, which never earns a note in any of
the three.

A learner's check runs a fresh worker per notebook (3 to 5 s each), so by default each table
is sampled: every chapter's reference (full marks, all three ways), and for 07, whose memory
check is what differed, also the answer that builds the whole score matrix (measured in all
three ways, it loses the same 3 points). `AUTOGRADER_CHECK_ALL_ROWS=1` grades every row of
every table (about 15 minutes on 2 cores).
"""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch

from autograder.core.assignments import get_assignment
from autograder.grading.grader import Grader
from autograder.hidden import test_07_efficient_attention as T07
from autograder.hidden.support import Hint
from autograder.isolation import remote, runner
from autograder.isolation.cgroups import CGROUP_ENV
from autograder.isolation.sandbox import SandboxUnavailable, detect
from chapters import tables
from conftest import add_cell, chapter_batch, run_cli, write

CHECK_CELL = "from autograder import check; check()"
SEED = 31337
ALL_ROWS = os.environ.get("AUTOGRADER_CHECK_ALL_ROWS") == "1"
K07 = "07_efficient_attention"
ROWS_07 = ("ref", "tiled_builds_full_matrix")


def _rows(key: str) -> list[str]:
    batch = list(chapter_batch(key))
    if ALL_ROWS:
        return batch
    return list(ROWS_07) if key == K07 else ["ref"]


CASES = [(key, row) for key in tables() for row in _rows(key)]


@pytest.fixture(scope="module")
def sandboxes():
    try:
        with_cgroup = detect()
        mp = pytest.MonkeyPatch()
        mp.setenv(CGROUP_ENV, "none")
        try:
            without = detect()
        finally:
            mp.undo()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    if with_cgroup.cgroups is None:
        pytest.skip(f"no memory cgroup here ({with_cgroup.cgroup_problem}): `grade` would measure per process too")
    assert without.cgroups is None
    return with_cgroup, without


_GRADERS: dict = {}


@pytest.fixture(scope="module")
def graders(sandboxes):
    with_cgroup, without = sandboxes

    def get(key):
        if key not in _GRADERS:
            a = get_assignment(key)
            _GRADERS[key] = {"grade": Grader(a, sandbox=with_cgroup, warm=True),
                             "check": Grader(a, sandbox=None), "check --sandbox": Grader(a, sandbox=without)}
        return _GRADERS[key]
    yield get
    for gs in _GRADERS.values():
        gs["grade"].close()
    _GRADERS.clear()


def _points(result) -> dict:
    assert result.status == "graded", result.error
    return {c.name: c.points for c in result.checks}


def _no_note_on_the_check_cell(result, row: str) -> None:
    """No note on the learner's own check cell, for any row; none at all for the reference."""
    assert not [n for n in result.notes if "autograder" in n], result.notes
    if row == "ref":
        assert result.notes == [], result.notes


@pytest.mark.parametrize("key,row", CASES, ids=[f"{k}-{r}" for k, r in CASES])
def test_check_never_shows_more_than_grade(graders, sandboxes, key, row, tmp_path):
    """Every row ends with the cell that the notebook's instructions tell the learner to add,
    `from autograder import check; check()`: graded alike three ways, and never a note (the
    sandbox has no copy of the course's package, which the worker offers as check() alone)."""
    path = write(add_cell(chapter_batch(key)[row](), CHECK_CELL), tmp_path / f"{row}.ipynb")
    gs = graders(key)
    result = gs["grade"].grade(path, seed=SEED)
    graded = _points(result)
    _no_note_on_the_check_cell(result, row)
    for mode, sandbox in (("check", None), ("check --sandbox", sandboxes[1])):
        # as `check` runs it: the worker started first, as a learner's self-check
        sub = runner.Submission([], sandbox=sandbox, notebook=path, self_check=True)
        sub.start_early()
        result = gs[mode].grade(path, seed=SEED, submission=sub)
        checked = _points(result)
        _no_note_on_the_check_cell(result, row)
        more = {n: (p, graded[n]) for n, p in checked.items() if p > graded[n]}
        assert not more, (mode, more)
        assert checked == graded, (mode, {n: (p, graded[n]) for n, p in checked.items() if p != graded[n]})


def test_check_sandbox_without_a_cgroup_measures_the_naive_answer(sandboxes, tmp_path, monkeypatch):
    """`check --sandbox` on a machine without a memory cgroup: the naive 07 answer loses the memory
    points there, as in `grade` (it was shown 22/22 when such a check paid what it could not measure)."""
    path = write(chapter_batch(K07)["tiled_builds_full_matrix"](), tmp_path / "naive.ipynb")
    monkeypatch.setenv(CGROUP_ENV, "none")
    proc = run_cli("check", "--sandbox", "--json", "--seed", str(SEED), str(path))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["sandboxed"] is True
    memory = next(c for c in result["checks"] if c["name"] == "test_tiled_attention_memory")
    assert memory["points"] == 0 and not memory["passed"], memory
    assert "builds (nearly) the whole Lq x Lk" in memory["hint"] and "MiB" in memory["hint"]


class _Unmeasured:
    """A learner whose worker's memory cannot be read on this machine (no cgroup, no /proc)."""

    def __init__(self, reference, self_check):
        self.reference, self.self_check = reference, self_check

    def memory_peak(self, name, q, k, v, **kwargs):
        return remote.MemoryUse(self.reference.tiled_attention(q, k, v, **kwargs), None, None, None, self.self_check)

    meanwhile = remote.Learner.meanwhile  # (needs only a `_sub` to hold the work: self)

    @property
    def _sub(self):
        return self


@pytest.mark.parametrize("self_check", [True, False], ids=["check", "grade"])
def test_an_unmeasured_memory_check_pays_only_when_grading(self_check):
    """Where memory cannot be measured, `check` shows no memory points (it cannot know whether grading will
    measure them); `grade` pays them (UNMEASURED_MEMORY_PAYS), so `check` never shows more."""
    reference = importlib.import_module(get_assignment(K07).solutions_module)
    learner = _Unmeasured(reference, self_check)
    if not self_check:
        assert T07.UNMEASURED_MEMORY_PAYS
        T07.test_tiled_attention_memory(learner, reference, torch.Generator().manual_seed(SEED))
        return
    with pytest.raises(Hint, match="cannot be measured on this machine"):
        T07.test_tiled_attention_memory(learner, reference, torch.Generator().manual_seed(SEED))
