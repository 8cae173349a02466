"""What `check` does, in order, kept from coming undone: it imports nothing that only `grade`
needs, its worker is started before the trusted side imports torch, and an early worker is ended
whenever the notebook is not graded (refused by the audit, or a sandbox that fails its probe).
Timings themselves are measured by benchmarks/check_speed.py, not asserted here; the audit's
checksums and the notebook reader have their own tests (tests/core/test_checksums.py,
tests/core/test_notebook_reader.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import nbformat
import pytest

from autograder.core.assignments import ROOT, get_assignment
from conftest import reference_notebook, write

KEY = "03_qkv"


SPY = textwrap.dedent("""
    import json, sys
    import autograder.isolation.runner as R
    seen = {}
    start = R.Submission.start_early
    def start_early(self):
        seen["torch_when_started"] = "torch" in sys.modules
        start(self)
        seen["started"] = self.proc is not None
    R.Submission.start_early = start_early
    from autograder.cli import main
    code = main(["check", "--json", sys.argv[1]])
    heavy = ("nbgrader", "nbformat", "jsonschema", "sqlalchemy", "dask", "distributed", "autograder.course.gradebook")
    seen["imported"] = sorted(m for m in heavy if m in sys.modules)
    print("SPY" + json.dumps(dict(seen, code=code)), file=sys.stderr)
""")


def test_check_starts_the_worker_first_and_imports_nothing_grade_needs(tmp_path):
    path = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    proc = subprocess.run([sys.executable, "-c", SPY, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    spy = json.loads(next(ln for ln in proc.stderr.splitlines() if ln.startswith("SPY"))[3:])
    assert spy["code"] == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["score"] == result["max_score"] == 26
    assert spy["started"] and spy["torch_when_started"] is False
    assert spy["imported"] == []


def test_an_early_worker_ends_with_a_rejected_notebook(tmp_path):
    """A notebook refused by the audit never has its code loaded, and its early worker is ended."""
    from autograder.grading.grader import ERROR, Grader
    from autograder.isolation.runner import Submission

    nb = reference_notebook(KEY)
    forged = nbformat.v4.new_code_cell("x = 1")
    forged.metadata["nbgrader"] = {"grade": True, "grade_id": "forged", "points": 100, "locked": True,
                                   "solution": False}
    nb.cells.append(forged)
    path = write(nb, tmp_path / "forged.ipynb")
    early = Submission([], notebook=path)
    early.start_early()
    assert early.proc is not None
    result = Grader(get_assignment(KEY)).grade(path, seed=1, submission=early)
    assert result.status == ERROR and "forged" in result.error
    assert early.proc is None and early._loaded == 0


def test_configure_is_refused_after_the_code_is_loaded():
    from autograder.core.limits import DEFAULT
    from autograder.isolation.remote import Learner
    from autograder.isolation.runner import Submission

    with Submission([{"label": "a", "source": "def f():\n    return 2\n"}]) as sub:
        assert Learner(sub).f() == 2
        with pytest.raises(RuntimeError):
            sub.configure([], limits=DEFAULT, seed=0)


def _sandbox_problem() -> str:
    from autograder.isolation.sandbox import SandboxUnavailable, detect

    try:
        detect()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


CHECK_CELL = "from autograder import check; check()"  # what every notebook's instructions tell the learner to add


def test_sandboxed_check_gives_the_same_marks(tmp_path):
    """`check --sandbox` probes the sandbox while its worker starts, then grades as usual; the learner's own
    check cell (the sandbox has no copy of the course's package) costs nothing and says nothing."""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(problem)
    from conftest import add_cell, run_json

    nb = add_cell(reference_notebook(KEY), CHECK_CELL)
    data = run_json("check", "--sandbox", str(write(nb, tmp_path / "ref.ipynb")))
    assert data["score"] == data["max_score"] == 26 and data["sandboxed"] is True
    assert data["notes"] == []


# The course's check as a learner writes it: each cell runs without an error where the package offers
# check() only (a grading worker), and check() does nothing there (the worker skips expressions anyway).
CHECK_CELLS = [CHECK_CELL, "from autograder import check\ncheck('part 3')", "import autograder\nautograder.check()",
               "import autograder as ag\nr = ag.check('part 1', seed=3)", "from autograder import check as c\nr2 = c()",
               "%run -m autograder check\n!python -m autograder check mine.ipynb"]
# Anything else of the package is the learner's code (not the course's check), and its error is said.
OTHER_USES = {"from autograder import grade": "ImportError: cannot import name 'grade' from 'autograder'",
              "import autograder.learner.in_notebook": "ModuleNotFoundError: No module named 'autograder.learner'",
              "r3 = check('part 1', '03_qkv')": "TypeError: "}


def test_the_check_cell_runs_without_an_error_in_a_worker(monkeypatch):
    """In a worker where the course's package cannot be imported (the sandbox), the learner's check cells load
    without an error and bind what they bind in a kernel (check() returning None); any other use of the package
    is an error of the learner's code, reported where it is."""
    import inspect

    import autograder
    from autograder.isolation import worker
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(worker.course_module().check) == params(autograder.check)  # what a call may pass, alike
    for name in [n for n in sys.modules if n == "autograder" or n.startswith("autograder.")]:
        monkeypatch.delitem(sys.modules, name)  # as in the sandbox: the real package is not there
    w = worker.Worker()
    cells = [{"label": f"cell {i}", "source": s} for i, s in enumerate(CHECK_CELLS + list(OTHER_USES), 1)]
    loaded = w.op_load({"cells": cells, "seed": 1})
    assert sys.modules["autograder"] is not autograder  # the worker's own, put back by monkeypatch
    assert loaded["notes"] == [] and loaded["more"] == 0
    assert [e["cell"] for e in loaded["errors"]] == [f"cell {i}" for i in range(len(CHECK_CELLS) + 1, len(cells) + 1)]
    for e, start in zip(loaded["errors"], OTHER_USES.values()):
        assert e["error"].startswith(start), e
    assert w.ns["r"] is None and w.ns["r2"] is None and w.ns["ag"].check is w.ns["check"]


FAILING_PROBE = textwrap.dedent("""
    import os, sys
    import autograder.isolation.runner as R
    import autograder.isolation.sandbox as S
    workers = []
    start = R.Submission.start_early
    def start_early(self):
        start(self)
        workers.append(self)
    R.Submission.start_early = start_early
    def probe(self):
        raise S.SandboxUnavailable("no sandbox today")
    S.Sandbox.probe = probe
    from autograder.cli import main
    code = main(["check", "--sandbox", sys.argv[1]])
    print("SPY", code, [w.proc is None for w in workers], "torch" in sys.modules, file=sys.stderr)
""")


def test_a_failing_sandbox_probe_ends_the_early_worker(tmp_path):
    """A sandbox that fails its probe: exit 2 with the reason, the early worker ended, nothing graded."""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(problem)
    path = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    proc = subprocess.run([sys.executable, "-c", FAILING_PROBE, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert "no sandbox today" in proc.stderr
    assert "SPY 2 [True] False" in proc.stderr, proc.stderr[-2000:]
