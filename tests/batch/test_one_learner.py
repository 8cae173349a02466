"""One learner's bytes cost at most that learner's grade: a fault injected into each per-submission step
of a grading run, for one learner each, leaves every other learner's grade, CSV row, feedback page,
gradebook entry and LMS row as they would be without it.

The run is `grade`'s own (`GradingRun`), in this process, with the checks replaced by a stand-in that
gives full marks (what is tested is the run around them, not the checks), so the whole batch takes a
few seconds. Each faulty learner gets a row of their own, flagged or marked, and the run ends with its
CSV, pages and exports written.
"""

from __future__ import annotations

import csv
import json

import pytest

from autograder.core.assignments import get_assignment

# In-process, but with a gradebook, nbformat and nbgrader to load: left out of `make test-fast`.
pytestmark = pytest.mark.slow

KEY = "03_qkv"
HONEST = ("alice", "bob")
# learner -> the step of the run that fails for that learner alone
FAULTS = {
    "f_scan": "scanning the learner's folder",
    "f_read": "reading the notebook's bytes",
    "f_time": "reading the submission time",
    "f_grade": "grading (the coordinator's call)",
    "f_outcome": "reading the grading job's outcome back",
    "f_gradebook": "recording the result in the gradebook",
    "f_autograded": "writing the autograded notebook",
    "f_companions": "writing the feedback page's companions",
    "f_page": "building the feedback page (in the run and in the export)",
    "f_fbfile": "writing the feedback page",
    "f_resultfile": "writing the result file",
    "f_row": "building the learner's gradebook row for the CSV",
    "f_csv": "writing the learner's CSV row",
    "f_lms": "writing the learner's LMS rows",
}


class Fault(RuntimeError):
    """The injected failure."""


class _Roster(dict):
    """The course's roster (course.toml [lms]), whose entry of one learner cannot be read."""

    def get(self, sid, default=None):
        if sid == "f_lms":
            raise Fault(FAULTS[sid])
        return super().get(sid, default)


@pytest.fixture(scope="module")
def faulty_batch(tmp_path_factory):
    import autograder.batch.cohort as cohort
    import autograder.course.deadlines as deadlines
    import autograder.course.export as export
    import autograder.grading.feedback as feedback
    import autograder.course.gradebook as gbk
    import autograder.batch.grading_run as grading_run
    import autograder.course.lms as lms
    import autograder.course.nbgrader_course as nbc
    import autograder.course.submissions as submissions
    from autograder.grading.grader import GRADED, Grader, Result

    mp = pytest.MonkeyPatch()
    base = tmp_path_factory.mktemp("one_learner")
    subs, out = base / "submitted", base / "out"
    stub = get_assignment(KEY).notebook.read_bytes()
    for student in (*HONEST, *FAULTS):
        folder = subs / student / KEY
        folder.mkdir(parents=True)
        (folder / f"{KEY}.ipynb").write_bytes(stub)
        (folder / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    (subs / "bob" / KEY / "timestamp.txt").unlink()  # bob's time is his file time
    # alice's exchange wrote its zone's name, which nbgrader's own reader drops (it reads 11:00 UTC)
    (subs / "alice" / KEY / "timestamp.txt").write_text("2026-12-01 11:00:00.000000 CEST")

    def full_marks(self, path, *, student="", seed=None, label=None, **kw):
        if student == "f_grade":
            raise Fault(FAULTS[student])
        result = Result.blank(KEY, label or path, self.parts, student=student, status=GRADED, seed=seed)
        for part in result.parts.values():
            part["score"] = part["max_score"]
        result.score = result.max_score
        return result

    def when(student, module, name, who_of):
        """Make `module.name` fail when `who_of(its arguments)` is `student`."""
        real = getattr(module, name)

        def faulty(*args, **kwargs):
            if who_of(*args, **kwargs) == student:
                raise Fault(FAULTS[student])
            return real(*args, **kwargs)
        mp.setattr(module, name, faulty)

    mp.setattr(Grader, "grade", full_marks)
    when("f_scan", submissions._Scanner, "student_folder", lambda self, base, student, fd: student)
    when("f_read", grading_run, "read_claim", lambda claim, limit: claim.student)
    when("f_time", deadlines, "submission_time", lambda path, *a, **k: path.parent.parent.name)
    when("f_outcome", cohort, "result_of", lambda outcome, task, grader: task["student"])
    when("f_gradebook", gbk, "record", lambda gb, a, student, *x, **k: student)
    when("f_autograded", nbc, "write_autograded", lambda out, a, student, *x, **k: student)
    when("f_companions", nbc, "write_feedback_companions", lambda out, key, student, *x, **k: student)
    when("f_page", feedback, "feedback_html", lambda result, *a, **k: result.student)
    when("f_fbfile", export, "write_feedback", lambda out, key, student, page: student)
    when("f_resultfile", grading_run, "write_json_atomic", lambda path, data: path.stem)
    when("f_row", gbk, "_row", lambda gb, key, student, *a: student)
    when("f_csv", gbk, "csv_cell", lambda value, limit: value)
    real_lms = lms._lms
    mp.setattr(lms, "_lms", lambda config: (*real_lms(config)[:2], _Roster(real_lms(config)[2])))
    try:
        run = grading_run.GradingRun(KEY, [str(subs)], out, sandbox=False, jobs=1, seed=7,
                                     progress=grading_run.quiet)
        summary = run.run()
    finally:
        mp.undo()
    return {"summary": summary, "out": out, "run": run}


def _csv(out):
    with open(out / f"{KEY}_grades.csv", encoding="utf-8") as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def test_every_other_learner_is_graded_recorded_and_exported(faulty_batch):
    """Do alice and bob, graded beside fourteen learners each of whose runs fails at one step, keep full
    marks in the summary, the CSV, the gradebook, their feedback pages, their result files and the LMS
    exports, as if nobody else had been there?"""
    from nbgrader.api import Gradebook

    out, summary = faulty_batch["out"], faulty_batch["summary"]
    reports = {r["student"]: r for r in summary["submissions"] if isinstance(r, dict) and "student" in r}
    rows = _csv(out)
    full = float(reports["alice"]["max_score"])
    assert full > 0
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        for student in HONEST:
            assert (reports[student]["status"], reports[student]["score"]) == ("graded", full), student
            assert not reports[student]["flags"], student
            assert (rows[student]["status"], float(rows[student]["score"])) == ("graded", full), student
            assert rows[student]["reason"] == ""
            assert gb.find_submission_notebook(KEY, KEY, student).score == full
            page = (out / "feedback" / student / KEY / f"{KEY}.html").read_text(encoding="utf-8")
            assert f"{full:g} / {full:g}" in page
            saved = json.loads((out / "results" / KEY / f"{student}.json").read_text(encoding="utf-8"))
            assert saved["score"] == full and saved["sha256"]
            assert (out / "autograded" / student / KEY / f"{KEY}.ipynb").is_file()
    assert rows["alice"]["submitted_from"] == "timestamp.txt" and rows["bob"]["submitted_from"] == "file time"
    # alice's time as the grader reads it in the CSV and beside her outputs; nbgrader's own reading of her
    # file in the gradebook, where formgrader compares it with the file to count her as autograded
    assert rows["alice"]["submitted_at"] == "2026-12-01T09:00:00Z"
    for folder in ("autograded", "feedback"):
        copied = (out / folder / "alice" / KEY / "timestamp.txt").read_text(encoding="utf-8").strip()
        assert copied == "2026-12-01 09:00:00.000000 UTC", folder
    from nbgrader.utils import parse_utc

    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        assert gb.find_submission(KEY, "alice").timestamp == parse_utc("2026-12-01 11:00:00.000000 CEST")
    for lms in ("canvas", "moodle"):
        text = (out / "exports" / f"{KEY}_{lms}.csv").read_text(encoding="utf-8")
        assert all(f"{s}," in text or f",{s}" in text for s in HONEST), lms


@pytest.mark.parametrize("student", sorted(FAULTS))
def test_a_fault_costs_at_most_that_learners_grade_and_is_shown(faulty_batch, student):
    """Does the learner whose step failed still get a row of their own in the CSV, marked for the
    instructor (not graded with the reason, or flagged), without a traceback on the way?"""
    rows = _csv(faulty_batch["out"])
    assert student in rows, f"{FAULTS[student]}: no CSV row"
    row = rows[student]
    full = float(rows["alice"]["max_score"])
    said = {  # learner -> (status, score, words of the reason) in the CSV
        "f_scan": ("error", 0.0, "could not be scanned (Fault)"),
        "f_read": ("error", 0.0, "could not be read (Fault)"),
        "f_time": ("graded", full, "timestamp.txt could not be read (Fault)"),  # only the time is lost
        "f_grade": ("grader_error", 0.0, "the grading job failed (Fault"),     # the checks: ours, regraded
        "f_outcome": ("error", 0.0, "its grading result could not be read (Fault)"),
        "f_gradebook": ("error", 0.0, "flagged: the gradebook could not take this learner's result"),
        "f_autograded": ("graded", full, "could not be recorded in full (Fault"),
        "f_companions": ("graded", full, "could not be recorded in full (Fault"),
        "f_page": ("graded", full, "could not be recorded in full (Fault"),
        "f_fbfile": ("graded", full, "could not be recorded in full (Fault"),
        "f_resultfile": ("graded", full, ""),  # the file that carries the flags is what failed
        "f_row": ("error", full, "flagged: this row could not be built (Fault"),
        "f_csv": ("error", None, "flagged: this row could not be written"),  # the LMS exports still have it
        "f_lms": ("graded", full, ""),  # only the LMS export lost that row: the CSV has it
    }[student]
    assert row["status"] == said[0], (FAULTS[student], row)
    if said[1] is not None:
        assert float(row["score"]) == said[1], (FAULTS[student], row)
    assert said[2] in row["reason"], (FAULTS[student], row)
    if student in ("f_lms", "f_row", "f_gradebook", "f_grade", "f_read", "f_scan", "f_outcome"):
        text = (faulty_batch["out"] / "exports" / f"{KEY}_canvas.csv").read_text(encoding="utf-8")
        assert student not in text  # an LMS export holds graded rows only
    if said[0] == "graded" and student != "f_fbfile":
        page = (faulty_batch["out"] / "feedback" / student / KEY / f"{KEY}.html").read_text(encoding="utf-8")
        assert f"{full:g} / {full:g}" in page, student
