"""A grading run: one exercise's submissions graded into a folder of outputs.

`GradingRun` is what ``python -m autograder grade`` does, as an object that the command
(`commands.grade_command`, left with turning arguments into a run and a run into an exit
code) and the mutation tool (`mutants.grade_batch`) call alike. A run

1. checks what it was given (a --scheduler that authenticates nobody, paths that are not
   there, the exercise's key) and scans the submissions (`submissions.find_submissions`);
2. makes the sandbox (learner code runs in bubblewrap unless told not to) and the `Grader`;
3. skips each submission graded before and unchanged since (the same bytes and flags, and
   its row still in the gradebook), unless forced;
4. grades the others in this process, on a local Dask cluster or on a scheduler's
   (`autograder.batch.cohort`), each from exactly the bytes that were hashed for it;
5. records each result as it arrives: its gradebook row (an instructor's manual score is
   kept), its autograded notebook OUT/autograded/STUDENT/KEY/KEY.ipynb (what formgrader
   shows), its feedback page OUT/feedback/STUDENT/KEY/KEY.html, its result file
   OUT/results/KEY/STUDENT.json (written last: a run killed before that line regrades the
   learner next time), a progress line, and the run's log OUT/logs/grade-KEY-TIME-PID.log;
6. ends as `export` does (`export.write_outputs`: the CSV OUT/KEY_grades.csv, every feedback
   page with the gradebook's final scores, the LMS exports) and returns the summary that
   ``grade --json`` prints.

What a run cannot do is a `UsageError`, raised before anything is graded (or, for a cluster
that cannot start, before the first submission is handed out). A grader error is the status
of the submission it struck (`faults`), never the learner's loss.

Everything a learner controls (file and folder names, messages, grade ids) is capped and
made visible (`autograder.core.text`) before it reaches the terminal, the log or a file.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from ..core.limits import DEFAULT, Limits
from ..core.logs import RunLog, log
from ..core.text import safe, visible
from ..core.usage import UsageError, known_assignment
from ..course.export import final_lines
from ..course.submissions import Found, find_submissions, read_claim

# The columns of `gradebook.rows` that a submission's entry in the summary takes from the gradebook.
FINAL_COLUMNS = ("score", "manual", "needs_review", "late_penalty", "submitted_at", "submitted_from",
                 "seconds_late")
NO_SANDBOX_WARNING = ("WARNING: --no-sandbox: learner code runs on this machine as you, with access to your "
                      "files, the solutions, the hidden tests and the gradebook. Grade this way only "
                      "notebooks you trust.")


def to_stderr(line: str) -> None:
    """One progress line on stderr. Learner text in it is already `safe`; this pass makes sure
    no control character at all reaches the terminal (newlines of our own messages kept)."""
    print(visible(line, keep="\n"), file=sys.stderr, flush=True)


def quiet(line: str) -> None:
    """No progress lines (a caller that reports on its own)."""


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def saved_result(path: Path, digest: str, flags: list) -> dict | None:
    """The saved result of an unchanged, finished submission with the same flags, or None (then
    it is graded again)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (isinstance(saved, dict) and digest and saved.get("sha256") == digest
            and saved.get("status") in ("graded", "error") and saved.get("flags", []) == flags
            and isinstance(saved.get("score"), (int, float)) and isinstance(saved.get("max_score"), (int, float))):
        return saved
    return None


def progress_line(student: str, result, limits: Limits, flags: list) -> str:
    line = f"{student}: {result.score:g} / {result.max_score:g}"
    if result.status != "graded":
        line += f" ({result.status.upper()}: {safe(result.error, limits.progress_chars)})"
    if result.seed is not None:
        line += f" [{result.seconds:.1f} s, seed {result.seed}]"
    if flags:
        line += f" FLAGGED: {safe('; '.join(flags), limits.progress_chars)}"
    return line


class GradingRun:
    """The submissions in `submissions` (notebooks, or folders read by the folder rule) of exercise
    `key`, graded into the folder `out`; `run()` does it and returns the summary.

    `gradebook`: an nbgrader database URL (default sqlite:///OUT/gradebook.db); `force`: regrade
    what is already graded; `timeout`: seconds per submission (default: the exercise's limit);
    `seed`: the checks' seed for every submission (default: a fresh one each); `sandbox`: False
    runs learner code unisolated (trusted notebooks only); `jobs`: submissions graded at once
    (default: the CPUs, at most one job per `cohort.MIN_PER_JOB` to grade); `scheduler` (and
    `insecure_scheduler` for a tcp:// one): grade on that Dask cluster; `warm`: start workers
    from a pre-imported template; `config`: the course configuration (a `course_config.CourseConfig`,
    a course.toml path, or None: OUT/course.toml when there is one), whose due date and late policy
    every result is assessed under (`deadlines`); `progress`: where progress lines go (stderr, or `quiet`)."""

    def __init__(self, key: str, submissions, out: str | Path = "grading", *, gradebook: str | None = None,
                 force: bool = False, timeout: float | None = None, seed: int | None = None, sandbox: bool = True,
                 jobs: int | None = None, scheduler: str | None = None, insecure_scheduler: bool = False,
                 warm: bool = False, config=None, progress=to_stderr):
        self.key = key
        # The course configuration (`course_config`): a CourseConfig, a course.toml path, or None for
        # OUT/course.toml when there is one; loaded by run() before anything is graded.
        self.config_given = config
        self.config = None
        self._times: dict = {}  # student -> (submitted, source), `deadlines.submission_time`
        self.submissions = [str(p) for p in submissions]
        self.out = Path(out)
        self.gradebook_url = gradebook
        self.force, self.timeout, self.seed = force, timeout, seed
        self.use_sandbox, self.jobs, self.warm = sandbox, jobs, bool(warm)
        self.scheduler, self.insecure_scheduler = scheduler or None, insecure_scheduler
        self.progress = progress or quiet
        # made by run()
        self.assignment = None
        self.scan = None
        self.sandbox = None
        self.grader = None
        self.limits = DEFAULT
        self.overrides: dict | None = None
        self.forbidden: list[str] = []
        self.gb = None
        self.reports: list = []
        self.log_path: Path | None = None
        self.summary: dict | None = None
        self.final_lines: list[str] = []
        self._release = None  # the release notebook, the frame of every autograded one
        self._graded_bytes: dict[int, bytes] = {}

    @property
    def results_dir(self) -> Path:
        return self.out / "results" / self.assignment.key

    @property
    def faults(self) -> list[dict]:
        """The submissions that hit a grader error (a fault of ours: the instructor regrades them)."""
        return [r for r in self.reports if r.get("status") == "grader_error"]

    # --- the run ----------------------------------------------------------------------------
    def run(self) -> dict:
        """Grade, record and write everything (once per run); the summary (`grade --json`). UsageError if
        it cannot."""
        self._check_scheduler()
        self._check_given()
        self._load_config()
        self._scan()
        if self.config.note:  # said once something is to be graded (a usage error stays one line)
            self.progress(self.config.note)
        self._prepare()
        self.out.mkdir(parents=True, exist_ok=True)
        run_log = RunLog(self.out, self.assignment.key)
        self.log_path = run_log.open()
        try:
            self._log_start()
            url = self.gradebook_url or f"sqlite:///{(self.out / 'gradebook.db').resolve()}"
            done = self._grade_into(url)
        finally:
            run_log.close()
        # The summary's entries show the gradebook's final scores (an instructor's manual ones), as the
        # CSV does; the result files keep the grader's.
        final, accounts = {row["student_id"]: row for row in done["rows"]}, done.get("accounts", {})
        for report in self.reports:
            row = final.get(report.get("student")) if isinstance(report, dict) else None
            if row is not None:
                report.update({k: row[k] for k in FINAL_COLUMNS if k in row}, auto_score=row.get("auto_score"),
                              final=accounts.get(row["student_id"]))
        self.final_lines = final_lines(done["rows"], accounts)
        self.summary = {"assignment": self.assignment.key, "gradebook": url, "csv": done["csv"],
                        "exports": done["exports"],
                        "log": str(self.log_path), "submissions": self.reports,
                        "rejected": [r.to_dict() for r in self.scan.rejected],
                        "rejected_total": self.scan.rejected_total}
        return self.summary

    def _check_scheduler(self) -> None:
        if self.insecure_scheduler and not self.scheduler:
            raise UsageError("--insecure-scheduler goes with --scheduler ADDRESS")
        if self.scheduler:
            # First of all: a cluster that authenticates nobody is refused unless asked for.
            from .dask_cluster import SchedulerRefused, scheduler_security

            try:
                _, warning = scheduler_security(self.scheduler, self.insecure_scheduler)
            except SchedulerRefused as exc:
                raise UsageError(str(exc)) from None
            if warning:
                self.progress(warning)

    def _check_given(self) -> None:
        missing = [p for p in self.submissions if not os.path.lexists(p)]
        if missing:
            raise UsageError("no such file or folder: " + ", ".join(safe(p, DEFAULT.path_chars) for p in missing))
        self.assignment = known_assignment(self.key)

    def _load_config(self) -> None:
        """The course configuration: a file that breaks a rule is a UsageError, and nothing is graded."""
        from ..course.course_config import CourseConfig, load_config

        given = self.config_given
        self.config = given if isinstance(given, CourseConfig) else load_config(given, self.out)

    def _scan(self) -> None:
        scan = self.scan = find_submissions(self.submissions, self.assignment.key, DEFAULT, out=self.out)
        for r in scan.rejected:
            self.progress(f"rejected: {r.path} {r.reason}" + (f" (in {r.student}'s folder)" if r.student else ""))
        if scan.rejected_total > len(scan.rejected):
            self.progress(f"rejected: … {scan.rejected_total - len(scan.rejected):,} more entries (only the first "
                          f"{DEFAULT.rejected_shown} are listed, here and in the log)")
        if not scan.found:
            given = " ".join(safe(p, DEFAULT.path_chars) for p in self.submissions)
            raise UsageError(f"no notebooks to grade found in {given}"
                             + (f" ({scan.rejected_total} rejected entries, listed above)"
                                if scan.rejected_total else ""))

    def _prepare(self) -> None:
        """The sandbox (on a cluster each worker builds and checks its own: `_start`) and the grader."""
        self.forbidden = [os.path.abspath(p) for p in (self.out, *self.submissions)]
        if not self.use_sandbox:
            self.progress(NO_SANDBOX_WARNING)
        elif not self.scheduler:
            from ..isolation.sandbox import SandboxUnavailable, make_sandbox

            try:
                self.sandbox = make_sandbox(forbidden=self.forbidden)
            except SandboxUnavailable as exc:
                raise UsageError(f"refusing to grade: {exc}") from None
            self.progress(self.sandbox.describe())
        self.overrides = {"submission_seconds": self.timeout} if self.timeout else None
        from ..grading.grader import course_grader  # imports torch: not before it is needed
        self.grader = course_grader(self.assignment.key, sandbox=self.sandbox, overrides=self.overrides)
        self.limits = self.grader.limits

    def _log_start(self) -> None:
        scan = self.scan
        log.info("grading %d submission(s) of %s into %s", len(scan.found), self.assignment.key,
                 safe(self.out, self.limits.path_chars))
        for r in scan.rejected:
            log.warning("rejected: %s %s%s", r.path, r.reason, f" (in {r.student}'s folder)" if r.student else "")
        if scan.rejected_total > len(scan.rejected):
            log.warning("rejected: … %d more entries not listed", scan.rejected_total - len(scan.rejected))

    def _grade_into(self, url: str) -> dict:
        """Record every submission in the gradebook at `url`, then write what `export` writes
        (`export.write_outputs`: the CSV, the feedback pages, the LMS exports)."""
        from ..course import gradebook as gbk
        from ..course.export import write_outputs

        with gbk.open_gradebook(url) as gb:
            self.gb = gb
            try:
                gbk.sync_assignment(gb, self.assignment)
                todo = self._to_grade()
                if todo:
                    self._grade(todo)
                return write_outputs(gb, self.assignment, self.out, self.limits, getattr(self, "config", None))
            finally:
                self.gb = None

    # --- each submission --------------------------------------------------------------------
    def _to_grade(self) -> list[tuple[int, Found]]:
        """(index, Found) of the submissions to grade, in scan order; the others are recorded (not
        graded: why) or reported (already graded, unchanged) here."""
        from ..course import gradebook as gbk
        from ..grading.feedback import bounded_flags

        limits, todo = self.limits, []
        for found in self.scan.found:
            i = len(self.reports)
            self.reports.append(None)
            try:
                if self._scanned(i, found):
                    todo.append((i, found))
            except Exception as exc:  # noqa: BLE001 - one learner's bytes cost at most their grade
                self.reports[i] = self._learner_fault(found, "read", exc)
        from ..course.deadlines import FROM_FILE_TIME

        file_times = sum(1 for _, source in self._times.values() if source == FROM_FILE_TIME)
        if file_times:
            self.progress(f"submission times are file times (no timestamp.txt, or one refused) for {file_times} "
                          f"of {len(self._times)} submission(s)")
        return todo

    def _scanned(self, i: int, found: Found) -> bool:
        """Whether `found` is to be graded; if not, its report (not graded: why; or already graded,
        unchanged) is recorded here."""
        from ..course import gradebook as gbk
        from ..grading.feedback import bounded_flags

        limits, student, claim = self.limits, found.student, found.claim
        shown_path = safe(str(claim.path), limits.path_chars) if claim else ""
        if found.problem:
            self.reports[i] = self._not_graded(found, found.problem, shown_path)
            return False
        read = read_claim(claim, limits.notebook_bytes)
        if read.data is None:
            self.reports[i] = self._not_graded(found, f"{shown_path} {read.problem}", shown_path, read.digest)
            return False
        self._submission_time(found, read.mtime)
        flags = bounded_flags(found.flags, limits)
        try:
            saved = None if self.force else saved_result(self.results_dir / f"{student}.json", read.digest, flags)
        except Exception:  # noqa: BLE001 - a result file that cannot be used: grade again
            saved = None
        # Skipped only if the gradebook also has the row (it may be a new or restored one).
        if saved is not None and gbk.has_submission(self.gb, self.assignment, student):
            saved["skipped"] = True
            self.reports[i] = saved
            flagged = f" FLAGGED: {safe('; '.join(flags), limits.progress_chars)}" if flags else ""
            self.progress(f"{student}: already graded ({saved['score']:g} / {saved['max_score']:g}); "
                          f"--force regrades{flagged}")
            return False
        return True

    def _submission_time(self, found: Found, mtime: float | None) -> None:
        """When `found` was handed in (nbgrader's timestamp.txt, else its file time); why a timestamp.txt
        was refused becomes one of its flags (the instructor looks; it is no error). Whatever goes
        wrong here costs nothing but the time: the file time is used, and the instructor told."""
        from ..course.deadlines import FROM_FILE_TIME, TIMESTAMP_FILE, file_time, submission_time

        notes: list[str] = []
        try:
            self._times[found.student] = submission_time(found.claim.path, mtime, base=found.claim.base,
                                                         notes=notes)
        except Exception as exc:  # noqa: BLE001 - a learner's file
            log.warning("%s: the submission time could not be read", found.student, exc_info=True)
            self._times[found.student] = (file_time(mtime), FROM_FILE_TIME)
            notes.append(f"{TIMESTAMP_FILE} could not be read ({type(exc).__name__}): the file time is the "
                         "submission time")
        found.flags.extend(n for n in notes if n not in found.flags)

    def _learner_fault(self, found: Found, step: str, exc: BaseException) -> dict:
        """The report of a submission whose step `step` ("read", ...) raised: not graded, flagged, with one
        sentence; the traceback goes to the run's log. Nobody else's submission is touched."""
        log.warning("%s: the submission could not be %s", found.student, step, exc_info=(type(exc), exc,
                                                                                          exc.__traceback__))
        shown = safe(str(found.claim.path), self.limits.path_chars) if found.claim else found.student
        reason = f"{shown} could not be {step} ({type(exc).__name__}); not graded"
        if reason not in found.flags:
            found.flags.append(reason)
        return self._not_graded(found, reason, shown if found.claim else "")

    def _not_graded(self, found: Found, reason: str, path: str, digest: str = "") -> dict:
        """A flagged `error` row for a submission that is not graded at all (ambiguous, a link, ...)."""
        from ..grading.grader import ERROR, Result

        result = Result.blank(self.assignment.key, path, self.grader.parts, student=found.student, status=ERROR,
                              error=reason)
        return self._record(found, result, digest)

    def _record(self, found: Found, result, digest: str, timestamp: float | None = None, tail: str = "",
                data: bytes | None = None) -> dict:
        """One result into the gradebook, the autograded notebook, the feedback page, the result file,
        the progress line and the log. `data`: the bytes that were graded (None: not graded).

        Never raises: where a step fails (a learner's bytes that break a page, a file that cannot be
        written), `_record_what_can` records that learner's result flagged, as much of it as can be, and
        the run goes on with the next learner."""
        try:
            return self._record_all(found, result, digest, timestamp, tail, data)
        except Exception as exc:  # noqa: BLE001 - one learner's record never stops the batch
            log.error("%s: the result could not be recorded in full", found.student, exc_info=True)
            return self._record_what_can(found, result, exc)

    def _record_what_can(self, found: Found, result, exc: BaseException) -> dict:
        """What `_record` does where it failed, each step on its own: the gradebook row (the result, else a
        not-graded one), a plain feedback page, the result file without its digest (so the next run grades
        this learner again), the progress line. The row is flagged with the reason."""
        from html import escape

        from ..course import gradebook as gbk
        from ..course.export import write_feedback
        from ..grading.feedback import bounded, bounded_flags, feedback_html
        from ..grading.grader import ERROR, Result

        limits, student, key = self.limits, found.student, self.assignment.key
        reason = (f"its result could not be recorded in full ({type(exc).__name__}; details in the run's log): "
                  "look at this submission; the next run grades it again")
        flags = bounded_flags([*found.flags, reason], limits)
        try:
            result = bounded(result, limits)
        except Exception:  # noqa: BLE001
            result = Result.blank(key, "", self.grader.parts, student=student, status=ERROR, error=reason)

        def attempt(what, fn):
            try:
                return fn()
            except Exception:  # noqa: BLE001
                log.error("%s: %s failed", student, what, exc_info=True)
                try:
                    self.gb.db.rollback()
                except Exception:  # noqa: BLE001
                    pass
                return None

        in_gradebook = attempt("the gradebook row", lambda: gbk.record(self.gb, self.assignment, student, result,
                                                                       timestamp=None, flagged=True) or True)
        if in_gradebook is None:
            result = Result.blank(key, result.notebook if isinstance(result.notebook, str) else "",
                                  self.grader.parts, student=student, status=ERROR, error=reason)
            in_gradebook = attempt("the gradebook row (not graded)", lambda: gbk.record(
                self.gb, self.assignment, student, result, timestamp=None, flagged=True) or True)
        submitted, source = self._times.get(student, (None, ""))
        page = attempt("the feedback page", lambda: feedback_html(result, flags, limits))
        if page is None:
            page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Feedback</title></head><body>"
                    f"<p>Score: {escape(f'{result.score:g} / {result.max_score:g}')}. Your result could not be shown "
                    "in full; your instructor has been told and will look at your submission.</p></body></html>")
        fb = attempt("the feedback file", lambda: write_feedback(self.out, key, student, page))

        def as_dict():
            from ..course.deadlines import iso_utc

            return dict(result.to_dict(), sha256="", feedback=str(fb or ""), skipped=False, flags=flags,
                        submitted_at=iso_utc(submitted) if submitted is not None else "", submitted_from=source,
                        **({} if in_gradebook else {gbk.NOT_IN_GRADEBOOK: True}))

        data = attempt("the result", as_dict) or {"student": student, "status": ERROR, "error": reason,
                                                    "score": 0.0, "max_score": 0.0, "flags": flags, "sha256": "",
                                                    **({} if in_gradebook else {gbk.NOT_IN_GRADEBOOK: True})}
        attempt("the result file", lambda: write_json_atomic(self.results_dir / f"{student}.json", data))
        attempt("the progress line", lambda: self.progress(progress_line(student, result, limits, flags)))
        return data

    def _record_all(self, found: Found, result, digest: str, timestamp: float | None, tail: str,
                    data: bytes | None) -> dict:
        from ..course import gradebook as gbk
        from ..course.export import write_feedback
        from ..course.nbgrader_course import (learners_timestamp, nbgrader_time, release_notebook, timestamp_bytes,
                                              write_autograded, write_feedback_companions)
        from ..grading.feedback import bounded, bounded_flags, feedback_html
        from ..grading.grader import ERROR

        limits = self.limits
        flags = bounded_flags(found.flags, limits)
        result = bounded(result, limits)
        from ..course.deadlines import assess, duration, iso_utc

        submitted, source = self._times.get(found.student, (None, ""))
        late = assess(self.config.assignment(self.assignment.key), submitted, source, result.score, result.max_score)
        if late.late:
            tail = (f" late: {duration(late.seconds_late)}"
                    + (f", -{round(late.penalty, 4):g} points" if late.penalty else "") + tail)
        stamp = timestamp_bytes(found.claim)
        # The gradebook holds nbgrader's own reading of the learner's timestamp.txt (formgrader counts a
        # submission as autograded only when the two agree); the copies beside the outputs, `stamp`.
        theirs = nbgrader_time(learners_timestamp(found.claim))
        gbk.record(self.gb, self.assignment, found.student, result, timestamp=theirs, flagged=bool(flags))
        if self._release is None:
            self._release = release_notebook(self.assignment)
        write_autograded(self.out, self.assignment, found.student, data, result, stamp, limits, self._release)
        write_feedback_companions(self.out, self.assignment.key, found.student, found.claim, timestamp)
        grades = gbk.part_grades(self.gb, self.assignment, found.student)
        fb = write_feedback(self.out, self.assignment.key, found.student,
                            feedback_html(result, flags, limits, grades=grades, late=late,
                                          comments=gbk.part_comments(self.gb, self.assignment, found.student)))
        data = dict(result.to_dict(), sha256=digest, feedback=str(fb), skipped=False, flags=flags,
                    submitted_at=iso_utc(submitted), submitted_from=source)
        data[gbk.REVIEW_FLAG] = (result.status == "graded" and not flags
                                 and gbk.needs_review(self.gb, self.assignment, found.student))
        # Written last: a run killed before this line regrades this learner next time.
        write_json_atomic(self.results_dir / f"{found.student}.json", data)
        self.progress(progress_line(found.student, result, limits, flags) + tail)
        log.info("%s (%s): %s, status %s, seed %s, %.1f s%s", found.student, result.notebook,
                 f"{result.score:g}/{result.max_score:g}", result.status, result.seed, result.seconds,
                 f", flagged: {'; '.join(flags)}" if flags else "")
        if result.status == ERROR and result.seed is None:
            log.warning("%s: not graded: %s", found.student, result.error)
        return data

    # --- grading the batch ------------------------------------------------------------------
    def _grade(self, todo: list[tuple[int, Found]]) -> None:
        """Grade `todo` in this process, on a local Dask cluster (jobs > 1) or on the scheduler's,
        recording each result as it arrives.

        Each notebook is read again here and its task carries exactly the bytes that were hashed for
        it (what is graded and recorded is what was read, whatever the folder holds meanwhile)."""
        from . import cohort
        total = len(self.scan.found)
        progress = cohort.Progress(total, done=total - len(todo))
        progress.to_grade = len(todo)
        by_tag = {}
        cfg = self._sandbox_config()
        limits, key = self.limits, self.assignment.key

        def tasks():
            for i, found in todo:
                claim = found.claim
                try:
                    shown = safe(str(claim.path), limits.path_chars)
                    read = read_claim(claim, limits.notebook_bytes)
                except Exception as exc:  # noqa: BLE001 - one learner's bytes cost at most their grade
                    progress.dropped()
                    self.reports[i] = self._learner_fault(found, "read", exc)
                    continue
                if read.data is None:
                    progress.dropped()
                    self.reports[i] = self._not_graded(found, f"{shown} {read.problem}", shown, read.digest)
                    continue
                seed = self.seed if self.seed is not None else secrets.randbelow(2**31)
                by_tag[i] = (found, read.digest, read.mtime)
                self._graded_bytes[i] = read.data
                yield cohort.make_task(i, key=key, student=found.student, label=str(claim.path),
                                       name=claim.parts[-1], data=read.data, seed=seed, overrides=self.overrides,
                                       sandbox=cfg, warm=self.warm)

        runner = self._start(len(todo), cfg)
        self.progress(f"grading {len(todo)} submission(s) with {runner.name}"
                      + (" on GPU workers" if getattr(runner, "resources", None) else ""))
        log.info("grading %d submission(s) with %s", len(todo), runner.name)
        progress.restart()
        try:
            for task, outcome in runner.run(tasks()):
                found, digest, mtime = by_tag.pop(task["tag"])
                try:
                    cohort.replay_log(outcome)
                    result = cohort.result_of(outcome, task, self.grader)
                except Exception as exc:  # noqa: BLE001 - a reply that cannot be read costs only this learner
                    result = self._unreadable_outcome(found, task, exc)
                self.reports[task["tag"]] = self._record(found, result, digest, mtime,
                                                         progress.add(result.status, graded=True),
                                                         data=self._graded_bytes.pop(task["tag"], None))
        finally:
            runner.close()

    def _unreadable_outcome(self, found: Found, task: dict, exc: BaseException):
        """The result of a task whose outcome could not be read back: not graded, flagged."""
        from ..grading.grader import ERROR, Result

        log.error("%s: the outcome of grading could not be read", found.student, exc_info=(type(exc), exc,
                                                                                            exc.__traceback__))
        reason = f"its grading result could not be read ({type(exc).__name__}); not graded"
        found.flags.append(reason)
        return Result.blank(self.assignment.key, task.get("label", ""), self.grader.parts, student=found.student,
                            status=ERROR, error=reason, seed=task.get("seed"))

    def _sandbox_config(self) -> dict:
        """How a task's grader sandboxes learner code: {"use", "forbidden", "cgroup"} (`cohort.make_task`)."""
        sandbox = self.sandbox
        cgroup = ("auto" if self.scheduler
                  else (sandbox.cgroups.parent if sandbox is not None and sandbox.cgroups else None))
        return {"use": self.use_sandbox, "forbidden": self.forbidden, "cgroup": cgroup}

    def _start(self, count: int, cfg: dict):
        """Where `count` submissions are graded: this process, or a Dask cluster whose every worker
        has built and checked its sandbox (UsageError if it cannot start or a worker cannot)."""
        from . import cohort
        # Unasked, a local cluster is started only when each job gets a few submissions: its few seconds
        # to start and stop would cost more than they save on a handful.
        asked = self.jobs
        jobs = max(1, min(asked, count) if asked else min(cohort.default_jobs(), count // cohort.MIN_PER_JOB))
        key, scheduler = self.assignment.key, self.scheduler
        if not (scheduler or jobs > 1):
            # A warm start only where this process grades: its template is of no use to a cluster's run.
            return cohort.Serial(cohort.new_grader(key, sandbox=self.sandbox, overrides=self.overrides, warm=True)
                                 if self.warm else self.grader)
        try:
            runner = cohort.OnDask(jobs=jobs, address=scheduler, insecure=self.insecure_scheduler)
        except Exception as exc:  # noqa: BLE001 - no cluster: say why, grade nothing
            where = f"reach the Dask scheduler at {safe(scheduler, 200)}" if scheduler else f"start {jobs} local jobs"
            raise UsageError(f"cannot {where}: {type(exc).__name__}: {exc}") from None
        if runner.warning:  # an unauthenticated scheduler, asked for: on record in the run's log
            log.warning("%s", runner.warning)
        try:
            probe = cohort.make_task(-1, key=key, student="", label="", name="", data=b"", seed=0,
                                     overrides=self.overrides, sandbox=cfg, warm=self.warm)
            ready = runner.prepare(probe)
            failed = {w: r for w, r in ready.items() if isinstance(r, BaseException)}
            if not ready:
                raise UsageError(f"refusing to grade: the Dask scheduler {safe(scheduler, 200)} has no workers")
            if failed:
                raise UsageError("refusing to grade: " + "; ".join(
                    f"worker {safe(w, 200)}: {type(r).__name__}: {r}" for w, r in sorted(failed.items())[:5]))
            if scheduler:
                for desc in sorted(set(ready.values())):
                    n = sum(1 for d in ready.values() if d == desc)
                    self.progress(f"{n} worker(s): {desc}")
            runner.resources = cohort.task_resources(cohort.uses_cuda(self.grader), runner.workers())
        except BaseException:
            runner.close()
            raise
        return runner


__all__ = ["GradingRun", "NO_SANDBOX_WARNING", "to_stderr", "quiet", "progress_line", "saved_result",
           "write_json_atomic"]
