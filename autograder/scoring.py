"""Run an exercise's hidden tests against one submission and collect points and hints.

This is the trusted process: the hidden tests run here under pytest and reach the
learner's code only through the `Learner` proxy (see `autograder.runner`).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import secrets
import time
from dataclasses import asdict, dataclass, field

import pytest
import torch

from .assignments import Assignment
from .hidden.support import Hint
from .notebook import NotebookError, code_to_run, read_notebook
from .runner import (
    BoundaryError,
    CallTimeout,
    GradingError,
    Learner,
    LearnerError,
    MissingName,
    NotImplementedRemote,
    Submission,
    WorkerDied,
)


@dataclass
class CheckResult:
    name: str
    part: str
    title: str
    points: float
    max_points: float
    passed: bool
    hint: str = ""


@dataclass
class Result:
    """One submission's grade: everything the reports, gradebook and CSV are made from."""

    assignment: str
    notebook: str
    student: str = ""
    status: str = "graded"  # or "error": no grade could be given; `error` says why
    error: str = ""
    score: float = 0.0
    max_score: float = 0.0
    parts: dict = field(default_factory=dict)  # part -> {"score", "max_score"}
    checks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["score"], d["max_score"] = round(self.score, 4), round(self.max_score, 4)
        return d


def _who(name: str) -> str:
    return f"`{name}`" if name else "your notebook's code"


def hint_for(exc: BaseException | None) -> str:
    """The learner-facing explanation of a failed check; never the test's own text."""
    if isinstance(exc, Hint):
        return str(exc)
    if isinstance(exc, NotImplementedRemote):
        return f"{_who(exc.name)} is not implemented yet: it still raises NotImplementedError."
    if isinstance(exc, MissingName):
        return f"{_who(exc.name)} is not defined in your notebook (check its name, and that its cell has no error)."
    if isinstance(exc, LearnerError):
        return f"{_who(exc.name)} raised {exc.etype}: {exc.message}"
    if isinstance(exc, CallTimeout):
        if getattr(exc, "during_load", False) or not exc.name:
            return (f"Loading your notebook's code did not finish within {exc.seconds:.0f} s "
                    "(a long computation or an endless loop at the top level of a cell?).")
        return f"{_who(exc.name)} did not finish within {exc.seconds:.0f} s: is there an endless loop?"
    if isinstance(exc, WorkerDied):
        if getattr(exc, "during_load", False) or not exc.name:
            return ("Your notebook's code ended the grading process while it was being loaded "
                    "(exit(), os._exit(), or a crash at the top level of a cell).")
        return f"{_who(exc.name)} ended the grading process (exit(), os._exit() or a crash)."
    if isinstance(exc, BoundaryError):
        return f"{_who(exc.name)} returned something the grader cannot accept: {exc}"
    if isinstance(exc, GradingError):
        return f"{_who(exc.name)} failed: {exc}"
    return ("This check did not pass: the result could not be used as the exercise asks "
            "(check the return type, shapes and dtypes against the instructions).")


class _Collector:
    """A pytest plugin: the fixtures hidden tests use, and a record of each test's outcome."""

    def __init__(self, learner: Learner, reference, seed: int):
        self._learner = learner
        self._reference = reference
        self._seed = seed
        self.checks: list[CheckResult] = []
        self.problems: list[str] = []

    @pytest.fixture
    def learner(self):
        return self._learner

    @pytest.fixture
    def reference(self):
        return self._reference

    @pytest.fixture
    def devices(self):
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    @pytest.fixture
    def rng(self, request):
        g = torch.Generator()
        g.manual_seed(self._seed + hash(request.node.name) % 10_000)
        return g

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        if rep.when == "call" or (rep.when == "setup" and not rep.passed):
            marker = item.get_closest_marker("points")
            if marker is None or not marker.args or "part" not in marker.kwargs:
                self.problems.append(f"hidden test {item.name} has no @points(n, part=...)")
                return
            pts = float(marker.args[0])
            exc = call.excinfo.value if call.excinfo is not None else None
            doc = (getattr(item.function, "__doc__", None) or item.name).strip().splitlines()[0]
            self.checks.append(CheckResult(
                name=item.name, part=marker.kwargs["part"], title=doc,
                points=pts if rep.passed else 0.0, max_points=pts, passed=rep.passed,
                hint="" if rep.passed else hint_for(exc),
            ))


def run_hidden_tests(assignment: Assignment, sub: Submission) -> tuple[list[CheckResult], list[str]]:
    """Run the hidden tests of `assignment` against the worker `sub`; returns checks and problems."""
    reference = importlib.import_module(assignment.solutions_module)
    plugin = _Collector(Learner(sub), reference, secrets.randbelow(2**31))
    args = [
        str(assignment.hidden_tests), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
        "-c", os.devnull, "--rootdir", str(assignment.hidden_tests.parent),
        "-o", "markers=points", "--tb=no", "-W", "ignore::pytest.PytestAssertRewriteWarning",
    ]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = pytest.main(args, plugins=[plugin])
    if code not in (0, 1) and not plugin.checks:
        plugin.problems.append(f"the hidden tests could not run (pytest exit {int(code)}):\n{buf.getvalue()[-2000:]}")
    return plugin.checks, plugin.problems


def part_points(assignment: Assignment) -> dict[str, float]:
    """part -> points, from the master's visible-test cells (`test_<part>`)."""
    from .generate import grade_cells, read_master

    return {gid[len("test_"):]: pts for gid, pts in grade_cells(read_master(assignment)).items()
            if gid.startswith("test_")}


def grade_notebook(assignment: Assignment, path, *, total_timeout: float = 120.0,
                   call_timeout: float = 20.0, sandbox=None) -> Result:
    """Grade one notebook file. Never raises for a bad submission: the Result says what went wrong."""
    start = time.monotonic()
    parts = part_points(assignment)
    result = Result(assignment=assignment.key, notebook=str(path),
                    max_score=float(sum(parts.values())),
                    parts={p: {"score": 0.0, "max_score": m} for p, m in parts.items()})
    try:
        nb = read_notebook(path)
    except NotebookError as exc:
        result.status, result.error = "error", str(exc)
        result.seconds = time.monotonic() - start
        return result
    if nb.assignment and nb.assignment != assignment.key:
        result.notes.append(f"this notebook was generated for {nb.assignment}, graded as {assignment.key}")
    code = code_to_run(nb)
    result.notes += code.notes
    with Submission(code, total_timeout=total_timeout, call_timeout=call_timeout,
                    sandbox=sandbox, notebook=path) as sub:
        checks, problems = run_hidden_tests(assignment, sub)
        result.notes += [f"{e['cell']}, line {e['line']}: {e['error']}" for e in sub.load_errors]
    if problems:
        # A fault of the grader, not of the learner: report it, never hide it in a score.
        result.status, result.error = "error", "; ".join(problems)
    result.checks = checks
    for c in checks:
        if c.part not in result.parts:
            result.status, result.error = "error", f"hidden test {c.name} names unknown part {c.part!r}"
            continue
        result.parts[c.part]["score"] += c.points
    result.score = float(sum(p["score"] for p in result.parts.values()))
    result.seconds = time.monotonic() - start
    return result
