"""The grader of one assignment: read, audit, load, run the hidden checks, score.

A `Grader` is built once per assignment and batch. It holds what every submission
shares (the part points and cells of the generated notebook, the hidden-test module,
the limits and the sandbox) and no global state, so several can run side by side in
separate processes. `Grader.grade(path)` never raises: whatever happens, it returns a
`Result` whose `status` says what kind of outcome it is:

* ``graded``: the hidden checks ran; the score is the learner's.
* ``error``: the notebook was not graded because of the notebook itself (unreadable,
  malformed, oversized, forged grade cells); `error` says why and the score is 0.
* ``grader_error``: a fault of ours (a hidden check that crashed, an unexpected
  exception): the checks it affected are marked, the traceback goes to the log, and the
  submission needs the instructor's attention. It is never shown as the learner's loss.

Hidden checks are plain functions ``test_*`` in ``autograder/hidden/test_KEY.py``
marked with ``@points(n, part=...)``; they run here, in the trusted process, and reach
the learner's code only through the `Learner` proxy (see `autograder.isolation.remote`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import random
import secrets
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from ..core.assignments import Assignment
from ..core.learner_errors import gpu_hint, split_place
from ..core.limits import DEFAULT, Limits
from ..core.notebook import NotebookError, ParsedNotebook, audit_cells, cap, code_cells, read_notebook, reference_cells
from ..hidden.support import Hint, Points
from ..isolation.device_check import plain_checks_without_symbolic_shapes
from ..isolation.errors import (ArgumentChanged, BoundaryError, CallTimeout, GradingError, LearnerError, MissingName,
                                NotImplementedRemote, WorkerDied)
from ..isolation.remote import Learner
from ..isolation.runner import Submission
from .ahead import Ahead, Ready

log = logging.getLogger("autograder")
plain_checks_without_symbolic_shapes()  # the reference's Transformer layers, as the worker's (see there)

GRADED, ERROR, GRADER_ERROR = "graded", "error", "grader_error"
FIXTURES = ("learner", "reference", "rng", "devices", "seed", "prepared")
GRADER_FAULT_HINT = ("The grader itself failed on this check (not a mistake of yours); "
                     "the instructor has been told and will regrade it.")
VALUE_FAULT_HINT = ("This check could not use what your code returned ({error}){last}. Check the type, shape, "
                    "dtype and device of what your functions return against the exercise's description.")


class GraderConfigError(RuntimeError):
    """The assignment's hidden tests or generated notebook are inconsistent: fix the course, not the learner."""


@dataclass
class CheckResult:
    name: str
    part: str
    title: str
    points: float
    max_points: float
    passed: bool
    hint: str = ""
    grader_error: bool = False
    # what kept the check from running the learner's code at all: the name of a definition that
    # still raises NotImplementedError (`stub`), or of one the notebook does not define (`missing`)
    stub: str = ""
    missing: str = ""


@dataclass
class Result:
    """One submission's grade: everything the reports, gradebook and CSV are made from."""

    assignment: str
    notebook: str
    student: str = ""
    status: str = GRADED  # or ERROR, or GRADER_ERROR (see the module docstring)
    error: str = ""
    score: float = 0.0
    max_score: float = 0.0
    parts: dict = field(default_factory=dict)  # part -> {"score", "max_score"}
    checks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seed: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["score"], d["max_score"] = round(self.score, 4), round(self.max_score, 4)
        return d

    @classmethod
    def blank(cls, assignment: str, notebook, parts: dict, *, student: str = "", status: str = GRADED,
              error: str = "", seed: int | None = None) -> Result:
        """A result without a point yet: every part of `parts` (part -> its points) at 0, out of their
        sum. What a grade starts from, and all there is of a submission that was not graded."""
        return cls(assignment=assignment, notebook=str(notebook), student=student, status=status, error=error,
                   max_score=float(sum(parts.values())), seed=seed,
                   parts={p: {"score": 0.0, "max_score": m} for p, m in parts.items()})

    @classmethod
    def from_dict(cls, d: dict) -> Result:
        """The result whose `to_dict` is `d` (every field is required, a check's too; other keys are ignored)."""
        checks = [CheckResult(**{f.name: c[f.name] for f in fields(CheckResult)}) for c in d["checks"]]
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name != "checks"}, checks=checks)


def _who(name: str) -> str:
    return f"`{name}`" if name else "your notebook's code"


def hint_for(exc: BaseException) -> str:
    """The learner-facing explanation of a failed check; never the test's own text."""
    if isinstance(exc, Hint):
        return str(exc)
    if isinstance(exc, NotImplementedRemote):
        return f"{_who(exc.name)} is not implemented yet: it still raises NotImplementedError."
    if isinstance(exc, MissingName):
        return f"{_who(exc.name)} is not defined in your notebook (check its name, and that its cell has no error)."
    if isinstance(exc, LearnerError):
        return gpu_hint(_who(exc.name), exc.message) or f"{_who(exc.name)} raised {exc.etype}: {exc.message}"
    if isinstance(exc, CallTimeout):
        if exc.during_load or not exc.name:
            return (f"Loading your notebook's code did not finish within {exc.seconds:.0f} s "
                    "(a long computation or an endless loop at the top level of a cell?).")
        return f"{_who(exc.name)} did not finish within {exc.seconds:.0f} s: is there an endless loop?"
    if isinstance(exc, WorkerDied):
        if exc.during_load or not exc.name:
            return ("Your notebook's code ended the grading process while it was being loaded "
                    "(exit(), os._exit(), or a crash at the top level of a cell).")
        return f"{_who(exc.name)} ended the grading process (exit(), os._exit() or a crash)."
    if isinstance(exc, ArgumentChanged):
        return (f"{_who(exc.name)} changed its argument `{exc.argument}` in place: a function must leave what "
                "its caller passed as it was (the caller may use it again). Work on a copy, or with operations "
                "that return a new value (`x = x / t`, not `x /= t`; `list(xs) + [pad]`, not `xs.append(pad)`).")
    if isinstance(exc, BoundaryError):
        return f"{_who(exc.name)} returned something the grader cannot accept: {exc}"
    return f"{_who(getattr(exc, 'name', ''))} failed: {exc}"


def load_notes(errors: list[dict]) -> list[str]:
    """The notes on errors raised while the notebook's top level was loaded, one per error ("cell 3,
    line 2: ..."); PyTorch's error for a GPU this machine lacks is said once, as advice.

    Each note names a place once: the worker appends to an error the place in the learner's code
    where it was raised, which is most often the statement's own (the note's first words), and is
    then not said again. Raised elsewhere (in a function defined in another cell, or further down
    in the cell, called by this statement), both places are said."""
    notes, gpu_said = [], False
    for e in errors:
        place, error = f"{e['cell']}, line {e['line']}", e["error"]
        text, where = split_place(error)
        if where == place:
            error = text
        gpu = gpu_hint("your code", error, place=False)
        if gpu and gpu_said:
            gpu = "asks for a GPU as well (see above)"
        gpu_said = gpu_said or bool(gpu)
        notes.append(f"{place}: {gpu or error}")
    return notes


def _returned(value) -> str:
    """The last value a learner's call returned, as a hint names it (its type, a tensor's dtype and device)."""
    from ..hidden.support import describe

    try:
        return describe(value)
    except Exception:  # noqa: BLE001 - a name for a hint, nothing depends on it
        return f"a {type(value).__name__[:40]}"


def reference_code(assignment: Assignment) -> list[dict] | None:
    """The code cells of the master with its answers (the reference solution as a notebook), for
    replaying a crashed check. Where the master cannot be read (an installed course has no myst_nb or
    nbgrader, and no _config.yml), the generated reference module, which holds the same definitions,
    as one cell; None where neither can be read."""
    try:
        from ..authoring.generate import read_master

        cells = [{"index": i + 1, "type": c.cell_type, "source": c.source, "metadata": dict(c.metadata)}
                 for i, c in enumerate(read_master(assignment).cells)]
    except Exception:  # noqa: BLE001 - the reference module serves as well
        try:
            cells = [{"index": 1, "type": "code", "source": assignment.solutions.read_text(encoding="utf-8"),
                      "metadata": {}}]
        except OSError:  # no reference, no replay: the crash stays the grader's
            log.warning("cannot read the master or the reference module of %s: crashed checks cannot be replayed",
                        assignment.key, exc_info=True)
            return None
    return code_cells(ParsedNotebook(path=assignment.master, cells=cells, metadata={}, assignment=assignment.key))


def check_seed(seed: int, name: str) -> int:
    """The seed of one check: fixed by the submission's seed and the check's name, in any process."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


@dataclass(frozen=True)
class HiddenCheck:
    name: str
    part: str
    points: float
    title: str
    fn: object
    params: tuple
    prepare: object = None  # `support.prepared`: setup(reference) -> work(rng), done ahead (`autograder.grading.ahead`)


def load_hidden_checks(assignment: Assignment):
    """The hidden-test module and its checks, in file order; GraderConfigError if one is malformed."""
    module = importlib.import_module(f"autograder.hidden.test_{assignment.key}")
    checks = []
    for name, fn in vars(module).items():
        if not (name.startswith("test_") and inspect.isfunction(fn)):
            continue
        pts = getattr(fn, "points", None)
        if not isinstance(pts, Points):
            raise GraderConfigError(f"hidden test {name} of {assignment.key} has no @points(n, part=...)")
        params = tuple(inspect.signature(fn).parameters)
        unknown = [p for p in params if p not in FIXTURES]
        if unknown:
            raise GraderConfigError(f"hidden test {name} asks for unknown fixture(s) {unknown}; "
                                    f"known: {', '.join(FIXTURES)}")
        prepare = getattr(fn, "prepare", None)
        if ("prepared" in params) != (prepare is not None):
            raise GraderConfigError(f"hidden test {name} of {assignment.key}: a check marked @prepared takes the "
                                    "fixture `prepared`, and only such a check does")
        # The title is the docstring's first paragraph, whole: a question cut at its first line
        # ("... and fill") reads as a different question in the report and on the feedback page.
        title = " ".join(inspect.cleandoc(fn.__doc__ or name).split("\n\n")[0].split())
        checks.append(HiddenCheck(name, pts.part, float(pts.n), title, fn, params, prepare))
    return module, checks


def part_points(cells: dict[str, dict]) -> dict[str, float]:
    """part -> points, from the generated notebook's visible-test cells (`test_<part>`)."""
    out = {}
    for gid, cell in cells.items():
        nbg = cell["metadata"].get("nbgrader") or {}
        if nbg.get("grade") and gid.startswith("test_"):
            out[gid[len("test_"):]] = float(nbg.get("points", 0))
    return out


def available_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Grader:
    """Grades submissions of one assignment; build once per batch, then call `grade` per notebook."""

    def __init__(self, assignment: Assignment, *, limits: Limits | None = None, overrides: dict | None = None,
                 sandbox=None, python: str = sys.executable, warm: bool = False):
        """`limits` are the defaults, the assignment's `LIMITS` apply on top, then `overrides` (an instructor's).

        `warm`: fork each submission's worker from one pre-imported template (autograder/isolation/warm.py)
        instead of starting Python and torch again; needs the sandbox and a memory cgroup, else
        `warm_problem` says why and workers start fresh."""
        self.assignment = assignment
        self.module, self.checks = load_hidden_checks(assignment)
        self.limits = (limits or DEFAULT).for_assignment(getattr(self.module, "LIMITS", None)).replace(
            **(overrides or {}))
        self.sandbox = sandbox
        self.python = python
        self.reference = importlib.import_module(assignment.solutions_module)
        generated = read_notebook(assignment.notebook, self.limits)
        self.ref_cells = reference_cells(generated)
        self.ref_course = generated.metadata.get("course") if isinstance(generated.metadata.get("course"), dict) else {}
        self.parts = part_points(self.ref_cells)
        self.max_score = float(sum(self.parts.values()))
        totals = {p: 0.0 for p in self.parts}
        for c in self.checks:
            if c.part not in totals:
                raise GraderConfigError(f"hidden test {c.name} names unknown part {c.part!r} "
                                        f"(parts: {', '.join(self.parts)})")
            totals[c.part] += c.points
        wrong = {p: (t, self.parts[p]) for p, t in totals.items() if abs(t - self.parts[p]) > 1e-9}
        if wrong:
            raise GraderConfigError("hidden test points do not add up to the notebook's: " + ", ".join(
                f"{p}: {t:g} hidden vs {n:g} visible" for p, (t, n) in wrong.items()))
        self._reference_code: list[dict] | None = None  # read at the first crashed check (see _replay)
        self.template, self.warm_problem = None, "not asked for"
        if warm:
            from ..isolation.warm import Template, TemplateUnavailable

            try:
                self.template, self.warm_problem = Template(sandbox, self.limits, Submission.base_env()), ""
            except TemplateUnavailable as exc:
                self.warm_problem = str(exc)
                log.warning("no warm start: %s", exc)

    def close(self) -> None:
        """End the warm start's template, if there is one (it also ends when this process does)."""
        if self.template is not None:
            self.template.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def new_result(self, path, student: str, seed: int, parts=None) -> Result:
        """A blank result of every part, or of the parts named in `parts` only (then only their
        checks run: see `_check_all`)."""
        chosen = self.parts if parts is None else {p: m for p, m in self.parts.items() if p in set(parts)}
        return Result.blank(self.assignment.key, path, chosen, student=student, seed=seed)

    def grade(self, path: str | Path, *, student: str = "", seed: int | None = None, label: str = "",
              submission: Submission | None = None, parts=None, cells: list[dict] | None = None) -> Result:
        """Grade one notebook file. Never raises; see the module docstring for the statuses.

        `label` names the notebook in the result and the log when `path` is a private copy of it.
        `submission`: a `Submission` for `path` whose worker was started early (`start_early`), with
        this grader's sandbox; it is given this notebook's cells, limits and seed and is closed here.
        `parts`: grade only these parts (ids as in `self.parts`); each check keeps the points it has in
        a full grade, its seed depending only on `seed` and its name (`check_seed`).
        `cells`: grade these code cells (``{"label", "source"}``, as `code_cells` gives them) instead of
        reading `path`, which then only names the result: a kernel's history (autograder.learner.in_notebook)."""
        start = time.monotonic()
        seed = secrets.randbelow(2**31) if seed is None else int(seed)
        result = self.new_result(label or path, student, seed, parts)
        try:
            self._grade(Path(path), result, submission, cells)
        except Exception as exc:  # noqa: BLE001 - a fault of ours must not lose the submission
            log.error("grader error while grading %s (%s), seed %d", result.notebook, student or "-", seed,
                      exc_info=True)
            result.status = GRADER_ERROR
            result.error = (f"internal grader error ({type(exc).__name__}); the traceback is in the grading "
                            "log. This is not the learner's fault: fix and regrade")
        result.score = float(sum(p["score"] for p in result.parts.values()))
        result.seconds = time.monotonic() - start
        return result

    def _grade(self, path: Path, result: Result, early: Submission | None = None,
               cells: list[dict] | None = None) -> None:
        sub = early
        notebook = path if cells is None else None  # shown read-only in the sandbox; a history has no file
        try:
            if cells is None:
                try:
                    nb = read_notebook(path, self.limits)
                    # a learner's check grades a notebook of an older release, which `grade` refuses
                    audit = audit_cells(nb, self.ref_cells, self.limits, key=self.assignment.key,
                                        self_check=early is not None and early.self_check,
                                        ref_course=self.ref_course)
                except NotebookError as exc:
                    result.status, result.error = ERROR, str(exc)
                    return
                except Exception as exc:  # noqa: BLE001 - the learner's bytes: their error, never a grader error
                    log.warning("could not audit the cells of %s", result.notebook, exc_info=True)
                    result.status = ERROR
                    result.error = (f"{path.name[:120]} could not be read as a notebook of this exercise "
                                    f"({type(exc).__name__}); not graded")
                    return
                result.notes += audit.notes
                if audit.rejected:
                    result.status, result.error = ERROR, audit.rejected
                    return
                if nb.assignment and nb.assignment != self.assignment.key:
                    result.notes.append(f"this notebook was generated for {nb.assignment[:60]!r}, "
                                        f"graded as {self.assignment.key}")
                cells = code_cells(nb)
            if sub is None:
                sub = Submission(cells, limits=self.limits, seed=result.seed, sandbox=self.sandbox,
                                 python=self.python, notebook=notebook, template=self.template)
            else:
                sub.configure(cells, limits=self.limits, seed=result.seed)
            self.run_checks(sub, result)
            result.notes += load_notes(sub.load_errors)
            result.notes += sub.load_notes
        finally:
            if sub is not None:
                sub.close()
        result.notes = cap(result.notes, self.limits, dropped=sub.load_dropped)

    def call_check(self, check: HiddenCheck, sub: Submission, s: int, ready: Ready | None = None) -> None:
        """Run one check against `sub` under the check's seed `s` (in both processes). A check marked
        @prepared gets its work's value, from `ready` (done ahead, `autograder.grading.ahead`) or done here."""
        if check.prepare is not None and ready is None:
            ready = Ready(check, self.reference, s)  # its work done here, by `value`
        prepared = ready.value() if ready is not None else None
        torch.manual_seed(s)
        np.random.seed(s % 2**32)
        random.seed(s)
        fixtures = {"learner": Learner(sub), "reference": self.reference, "seed": s, "prepared": prepared,
                    "rng": ready.rng if ready is not None else torch.Generator().manual_seed(s),
                    "devices": available_devices()}
        sub.reseed(s)
        check.fn(**{p: fixtures[p] for p in check.params})

    def _replay(self, check: HiddenCheck, s: int, replay: dict, sub: Submission) -> bool | None:
        """Run a check that crashed on a learner's submission again, with the same seed, against the
        reference solution in a worker of its own: True when it passes there, False when it fails or
        crashes there too, None when no replay can be made. The check's code, inputs and seeds are the
        same in both runs; only what the worker returns differs. When the crash was the learner's, the
        replay's time is charged to the learner's submission (else it is ours, as the crash is)."""
        start, verdict = time.monotonic(), None
        try:
            verdict = self._replay_on_reference(check, s, replay)
            return verdict
        finally:
            if verdict:
                sub.deadline -= time.monotonic() - start

    def _replay_on_reference(self, check: HiddenCheck, s: int, replay: dict) -> bool | None:
        if "sub" not in replay:
            if self._reference_code is None:
                self._reference_code = reference_code(self.assignment) or []
            # a fresh worker, never the warm template's: a template serves one live worker at a
            # time, and the learner's is still running
            replay["sub"] = (Submission(self._reference_code, limits=self.limits, seed=s, sandbox=self.sandbox,
                                        python=self.python)
                             if self._reference_code else None)
        ref = replay["sub"]
        if ref is None:
            return None
        try:
            ref.ensure_started()
            self.call_check(check, ref, s)
            return True
        except Exception:  # noqa: BLE001 - failing or crashing on the reference: the check's own fault
            log.error("hidden check %s fails on the reference too, seed %d:\n%s", check.name, s,
                      traceback.format_exc())
            return False

    def run_checks(self, sub: Submission, result: Result) -> None:
        faults = []
        replay: dict = {}  # the reference's worker, started at the first crash, for this submission
        sub.changed = set()  # each function's arguments watched again, once per part (`errors.ArgumentChanged`)
        try:
            self._check_all(sub, result, faults, replay)
        finally:
            if replay.get("sub") is not None:
                replay["sub"].close()
        if faults:
            result.status = GRADER_ERROR
            result.error = (f"{len(faults)} hidden check(s) crashed in the grader ({', '.join(faults)}); "
                            "their points are not counted yet: the traceback is in the grading log. "
                            "This is not the learner's fault: fix and regrade")

    def _check_all(self, sub: Submission, result: Result, faults: list, replay: dict) -> None:
        todo = [check for check in self.checks if check.part in result.parts]  # (`grade(parts=...)`: some)
        ahead = [(check, check_seed(result.seed, check.name)) for check in todo if check.prepare is not None]
        with Ahead(self.reference, ahead) as work:
            for check in todo:
                self._check_one(sub, result, faults, replay, check, work.get(check.name))

    def _check_one(self, sub: Submission, result: Result, faults: list, replay: dict, check: HiddenCheck,
                   ready: Ready | None) -> None:
        s = check_seed(result.seed, check.name)
        passed, hint, fault, stub, missing = False, "", False, "", ""
        sub.last_returned = None
        sub.part = check.part
        try:
            self.call_check(check, sub, s, ready)
            passed = True
        except (Hint, GradingError) as exc:
            hint = hint_for(exc)
            if isinstance(exc, NotImplementedRemote):
                stub = exc.name
            elif isinstance(exc, MissingName):
                missing = exc.name
        except Exception as exc:  # noqa: BLE001 - ours, unless it comes from what the learner returned
            crash = traceback.format_exc()
            last = sub.last_returned
            if last is not None and self._replay(check, s, replay, sub):
                # Same check, same inputs, same seeds: it passes on the reference's values and
                # crashes on the learner's, so it crashed on what the learner returned.
                hint = VALUE_FAULT_HINT.format(
                    error=type(exc).__name__,
                    last=f"; the last value it received, from `{last[0][:100]}`, was {_returned(last[1])}")
                log.warning("hidden check %s failed on the values %s (%s) returned, seed %d; it passes on the "
                            "reference's, so this counts as the learner's mistake:\n%s", check.name,
                            result.notebook, result.student or "-", result.seed, crash)
            else:
                fault = True
                hint = GRADER_FAULT_HINT
                faults.append(check.name)
                log.error("hidden check %s crashed on %s (%s), seed %d:\n%s", check.name, result.notebook,
                          result.student or "-", result.seed, crash)
        result.checks.append(CheckResult(name=check.name, part=check.part, title=check.title,
                                         points=check.points if passed else 0.0, max_points=check.points,
                                         passed=passed, hint=hint, grader_error=fault, stub=stub,
                                         missing=missing))
        if passed:
            result.parts[check.part]["score"] += check.points


def course_grader(key: str, **kw):
    """A `Grader` for `key` (keywords as `Grader`'s), or a UsageError when the key is unknown or the
    course's files for it are inconsistent."""
    from ..core.usage import UsageError, known_assignment

    assignment = known_assignment(key)
    try:
        return Grader(assignment, **kw)
    except GraderConfigError as exc:
        raise UsageError(f"the course's files for {key} are inconsistent: {exc}") from None


__all__ = ["Grader", "GraderConfigError", "Result", "CheckResult", "GRADED", "ERROR", "GRADER_ERROR",
           "hint_for", "check_seed", "course_grader"]
