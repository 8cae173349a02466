"""What `check` does, in order, kept from coming undone: it imports nothing that only `grade`
needs, its worker is started before the trusted side imports torch, and an early worker is ended
whenever the notebook is not graded (refused by the audit, or a sandbox that fails its probe).
Timings themselves are measured by benchmarks/check_speed.py, not asserted here; the audit's
checksums and the notebook reader have their own tests (tests/test_checksums.py,
tests/test_notebook_reader.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import nbformat
import pytest

from autograder.assignments import ROOT, get_assignment
from conftest import reference_notebook, write

KEY = "03_qkv"


SPY = textwrap.dedent("""
    import json, sys
    import autograder.runner as R
    seen = {}
    start = R.Submission.start_early
    def start_early(self):
        seen["torch_when_started"] = "torch" in sys.modules
        start(self)
        seen["started"] = self.proc is not None
    R.Submission.start_early = start_early
    from autograder.cli import main
    code = main(["check", "--json", sys.argv[1]])
    heavy = ("nbgrader", "nbformat", "jsonschema", "sqlalchemy", "dask", "distributed", "autograder.gradebook")
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
    from autograder.grader import ERROR, Grader
    from autograder.runner import Submission

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
    from autograder.limits import DEFAULT
    from autograder.runner import Learner, Submission

    with Submission([{"label": "a", "source": "def f():\n    return 2\n"}]) as sub:
        assert Learner(sub).f() == 2
        with pytest.raises(RuntimeError):
            sub.configure([], limits=DEFAULT, seed=0)


def _sandbox_problem() -> str:
    from autograder.sandbox import SandboxUnavailable, detect

    try:
        detect()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def test_sandboxed_check_gives_the_same_marks(tmp_path):
    """`check --sandbox` probes the sandbox while its worker starts, then grades as usual."""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(problem)
    from conftest import run_json

    data = run_json("check", "--sandbox", str(write(reference_notebook(KEY), tmp_path / "ref.ipynb")))
    assert data["score"] == data["max_score"] == 26 and data["sandboxed"] is True


FAILING_PROBE = textwrap.dedent("""
    import os, sys
    import autograder.runner as R
    import autograder.sandbox as S
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
