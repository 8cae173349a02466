"""Scores into an nbgrader gradebook, and the CSV export made from it.

The gradebook mirrors what `nbgrader generate_assignment` would have stored for the
learner notebook (its grade, solution and source cells), so instructors keep nbgrader's
own tools: `nbgrader export`, formgrader. Each part of an exercise is one grade cell,
``test_<part>``, whose auto score is the sum of the points of that part's hidden checks.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import os
import warnings
from pathlib import Path

import nbformat
from nbgrader import api as nbgrader_api
from nbgrader import utils as nbgrader_utils
from nbgrader.api import Gradebook, MissingEntry

from ..core.assignments import Assignment
from ..core.limits import DEFAULT, Limits
from ..core.logs import log
from ..core.text import csv_cell, safe


@functools.lru_cache(maxsize=1)
def alembic_head() -> str:
    """The revision nbgrader stamps on a new gradebook: the head of its migration scripts.

    nbgrader's own `get_alembic_version` runs the `alembic heads` command for it, a process
    that loads alembic and SQLAlchemy again: about 2.5 CPU seconds for every new gradebook.
    This reads the same scripts in this process, once. Where they have more than one head
    (nbgrader's command would then take the first line it prints), it falls back to nbgrader's
    own function."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    from nbgrader.dbutil import ALEMBIC_DIR

    config = Config()
    config.set_main_option("script_location", ALEMBIC_DIR)
    try:
        head = ScriptDirectory.from_config(config).get_current_head()
    except CommandError:
        head = None
    return head if head else _nbgrader_alembic_version()


_nbgrader_alembic_version = nbgrader_api.get_alembic_version


def open_gradebook(url: str) -> Gradebook:
    """nbgrader's gradebook at the database `url` (created when new), as a context manager.

    A new database is stamped with nbgrader's migration head as nbgrader would stamp it, read
    by `alembic_head` in this process instead of by the `alembic` command. Where the fallback
    runs that command, the environment's bin folder is put on PATH first, so that a command
    run as `.venv/bin/python -m autograder ...` (the environment not activated) finds it."""
    import sys

    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    nbgrader_api.get_alembic_version = alembic_head  # what Gradebook() calls for a new database
    return Gradebook(url)


def sync_assignment(gb: Gradebook, assignment: Assignment) -> list[str]:
    """Create or update the assignment's structure in the gradebook; returns grade cell ids."""
    key = assignment.key
    nb = nbformat.read(str(assignment.notebook), as_version=4)
    gb.update_or_create_assignment(key)
    gb.update_or_create_notebook(key, key)
    grade_ids = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta or "grade_id" not in meta:
            continue
        gid = meta["grade_id"]
        if nbgrader_utils.is_grade(cell):
            gb.update_or_create_grade_cell(gid, key, key, max_score=float(meta.get("points", 0)),
                                           cell_type=cell.cell_type)
            grade_ids.append(gid)
        if nbgrader_utils.is_solution(cell):
            gb.update_or_create_solution_cell(gid, key, key)
        gb.update_or_create_source_cell(gid, key, key, cell_type=cell.cell_type,
                                        locked=bool(meta.get("locked")), source=cell.source,
                                        checksum=meta.get("checksum"))
    return grade_ids


def record(gb: Gradebook, assignment: Assignment, student: str, result,
           timestamp: float | dt.datetime | None = None, flagged: bool = False) -> None:
    """Write one result's part scores into the gradebook (creating or updating its rows).

    `timestamp`: the submission time nbgrader records (its timestamp.txt; None without one). An
    instructor's manual score (formgrader) is kept; when the automatic score it was given over
    changes, the grade needs a manual grade again and the submission is flagged (`needs_review`).

    The submission is flagged when it was not graded, or when `flagged` (its folder held
    entries that were not graded: the instructor must look)."""
    key = assignment.key
    gb.update_or_create_student(student)
    # nbgrader's own add_submission trips SQLAlchemy 2's autoflush warnings; they are noise.
    warnings.filterwarnings("ignore", message=".*not in session.*")
    if isinstance(timestamp, (int, float)):
        timestamp = dt.datetime.fromtimestamp(timestamp, dt.timezone.utc)
    # Always set (None included): formgrader counts a submission as autograded only when this time is
    # the one in submitted/STUDENT/KEY/timestamp.txt, or None where that file is absent.
    gb.update_or_create_submission(key, student, timestamp=timestamp)
    nb = gb.find_submission_notebook(key, key, student)
    for part, scores in result.parts.items():
        try:
            grade = gb.find_grade(f"test_{part}", key, key, student)
        except MissingEntry:
            continue
        new = float(scores["score"])
        if grade.manual_score is None:
            grade.needs_manual_grade = False
        elif grade.auto_score is None or abs(float(grade.auto_score) - new) > 1e-9:
            # The instructor's score stays, but it was given over another automatic score: review it.
            grade.needs_manual_grade = True
        # else: the manual score stands over the same automatic score, as the instructor left it
        grade.auto_score = new
    # A submission that could not be graded is flagged for the instructor, never silently 0; so is
    # one whose manual score now sits over a changed automatic score.
    nb.flagged = result.status != "graded" or bool(flagged) or needs_review(gb, assignment, student)
    gb.db.commit()


# In a result file: `record` flagged the submission because a manual score needs review (nothing else).
REVIEW_FLAG = "flagged_for_review"


def _grades(gb: Gradebook, key: str, student: str) -> list:
    return [g for g in gb.find_submission_notebook(key, key, student).grades]


def needs_review(gb: Gradebook, assignment: Assignment, student: str) -> bool:
    """Whether an instructor's manual score sits over an automatic score that changed since it was given."""
    return any(g.manual_score is not None and g.needs_manual_grade for g in _grades(gb, assignment.key, student))


def part_grades(gb: Gradebook, assignment: Assignment, student: str) -> dict[str, dict]:
    """part -> {"score" (final), "auto", "manual" (None or the instructor's), "max_score"} of a submission."""
    out = {}
    for g in _grades(gb, assignment.key, student):
        if not g.name.startswith("test_"):
            continue
        out[g.name[len("test_"):]] = {
            "score": float(g.score), "auto": float(g.auto_score or 0.0),
            "manual": None if g.manual_score is None else float(g.manual_score), "max_score": float(g.max_score)}
    return out


COMMENT_CHARS = 5_000  # one comment of the instructor's, as a feedback page shows it


@functools.lru_cache(maxsize=32)
def _answer_parts(path: str, mtime_ns: int) -> dict[str, tuple[str, ...]]:
    nb = nbformat.read(path, as_version=4)
    parts: dict[str, tuple[str, ...]] = {}
    answer = None
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader") or {}
        gid = meta.get("grade_id")
        if not isinstance(gid, str):
            continue
        if meta.get("solution") or meta.get("task"):
            answer = gid
            parts[answer] = ()
        elif meta.get("grade") and answer is not None and gid.startswith("test_"):
            parts[answer] += (gid[len("test_"):],)
    return parts


def answer_parts(assignment: Assignment) -> dict[str, tuple[str, ...]]:
    """answer cell (a solution cell's grade id) -> the parts whose grade cells follow it, up to the next
    answer cell: which part a formgrader comment on that answer belongs to (``masks`` -> padding_mask,
    causal_mask)."""
    path = Path(assignment.notebook)
    return _answer_parts(str(path), path.stat().st_mtime_ns)


def comment_text(text) -> str:
    """An instructor's comment as shown: at most COMMENT_CHARS, control characters gone (lines kept)."""
    if not isinstance(text, str):
        return ""
    text = "".join(ch if ch in "\n\t" or ch.isprintable() else " " for ch in text[: COMMENT_CHARS + 1])
    text = text.strip()
    return text if len(text) <= COMMENT_CHARS else text[:COMMENT_CHARS] + " …"


def part_comments(gb: Gradebook, assignment: Assignment, student: str) -> dict[str, list[str]]:
    """The comments an instructor typed in formgrader (the box under each answer), by the part they
    belong to (`answer_parts`: a comment on an answer covering several parts goes with its first part);
    a comment on a cell that covers no part goes under "". Empty comments are left out."""
    parts = answer_parts(assignment)
    out: dict[str, list[str]] = {}
    comments = gb.find_submission_notebook(assignment.key, assignment.key, student).comments
    for c in sorted(comments, key=lambda c: list(parts).index(c.name) if c.name in parts else len(parts)):
        text = comment_text(c.manual_comment)
        if text:
            covered = parts.get(c.name) or ("",)
            out.setdefault(covered[0], []).append(text)
    return out


def sync_names(gb: Gradebook, config) -> int:
    """The roster's names (course.toml's ``[lms] roster``) on nbgrader's students, so formgrader lists
    "Lovelace, Ada" instead of "None, None": the columns first_name and last_name where the roster has
    them, else its name split as "Last, First" or at its last space ("Ada Lovelace"); its email column
    too. Only students the gradebook holds; returns how many changed."""
    roster = getattr(getattr(config, "lms", None), "roster", None) or {}
    if not roster:
        return 0
    changed = 0
    for student in gb.students:
        row = roster.get(student.id)
        if row is None:
            continue
        first, last = (row.get("first_name") or "").strip(), (row.get("last_name") or "").strip()
        if not (first or last):
            name = " ".join((row.get("name") or row.get("Student") or "").split())
            if "," in name:
                last, _, first = (x.strip() for x in name.partition(","))
            elif " " in name:
                first, _, last = name.rpartition(" ")
            else:
                last = name
        email = (row.get("email") or "").strip() or None
        # a one-word name is a last name; an empty first name (not None) keeps formgrader from writing "None"
        new = (first[:128] if (first or last) else None, last[:128] or None, email[:128] if email else student.email)
        if (student.first_name, student.last_name, student.email) != new:
            student.first_name, student.last_name, student.email = new
            changed += 1
    if changed:
        gb.db.commit()
    return changed


def account(row: dict, grades: dict | None = None) -> str:
    """How a row's final score is made, in one line (the terminal's; formgrader's summary cell lists
    the same items): ``21.4 / 26: automatic 15; set by hand: scaled_dot_product_attention 12
    (automatic 2); late -2.6; NEEDS REVIEW ...``. `grades`: `part_grades` of the learner (names the
    parts scored by hand)."""
    return "; ".join(account_items(row, grades))


def account_items(row: dict, grades: dict | None = None) -> list[str]:
    """The items of `account`."""
    def num(x) -> str:
        return f"{round(float(x), 4):g}"

    said = [f"{num(row.get('score', 0))} / {num(row.get('max_score', 0))}: automatic {num(row.get('auto_score', 0))}"]
    manual = [f"{part} {num(g['manual'])} (automatic {num(g['auto'])})"
              for part, g in (grades or {}).items() if g.get("manual") is not None]
    if manual:
        said.append("set by hand: " + ", ".join(manual))
    elif row.get("manual"):
        said.append("manual scores kept")
    if float(row.get("late_penalty") or 0):
        said.append(f"late -{num(row['late_penalty'])}")
    if row.get("needs_review"):
        said.append("NEEDS REVIEW: a manual score was given over another automatic score (save it again in "
                    "formgrader, then run export)")
    if row.get("status") not in (None, "graded"):
        said.append(f"status {row['status']}")
    return said


def has_submission(gb: Gradebook, assignment: Assignment, student: str) -> bool:
    """Whether the gradebook already holds this learner's submission of the assignment."""
    try:
        gb.find_submission_notebook(assignment.key, assignment.key, student)
    except MissingEntry:
        return False
    return True


def _reason(info: dict, limits: Limits) -> str:
    reason = info.get("error") if isinstance(info.get("error"), str) else ""
    flags = info.get("flags") if isinstance(info.get("flags"), list) else []
    if flags:
        reason = (reason + " | " if reason else "") + "flagged: " + "; ".join(map(str, flags))
    return safe(reason, limits.error_chars)


def rows(gb: Gradebook, assignment: Assignment, statuses: dict[str, dict], limits: Limits = DEFAULT,
         config=None) -> list[dict]:
    """One row per submission in the gradebook, with the status recorded when it was graded
    (and the reasons it was flagged, in `reason`).

    `config` (`course_config.CourseConfig`, None: no due date) brings the late policy: `score` is
    then the final score less the late penalty (never below 0), and the gradebook gets the
    assignment's due date and each notebook's `late_submission_penalty`, so that nbgrader's own
    `export` agrees with ours; and the roster's names reach nbgrader's students (`sync_names`).

    A submission that `record` flagged only for review (its result file says REVIEW_FLAG) loses the
    flag once nothing needs review any more; its entry in `statuses` then says REVIEW_FLAG False,
    which the caller writes back."""
    key = assignment.key
    out = []
    settings = config.assignment(key) if config is not None else None
    due = settings.due if settings is not None else None
    gb_assignment = gb.find_assignment(key)
    naive_due = due.astimezone(dt.timezone.utc).replace(tzinfo=None) if due is not None else None
    if gb_assignment.duedate != naive_due:
        gb_assignment.duedate = naive_due
    grade_cells = [c.name for c in gb.find_notebook(key, key).grade_cells]
    if config is not None:
        try:
            sync_names(gb, config)
        except Exception:  # noqa: BLE001 - the names are for formgrader's lists; the scores go on
            log.error("the roster's names could not be given to the gradebook's students", exc_info=True)
            gb.db.rollback()
    for sub in sorted(gb.find_assignment(key).submissions, key=lambda s: s.student.id):
        # Each row on its own: whatever one learner's saved result holds costs at most that row.
        try:
            out.append(_row(gb, key, sub.student.id, statuses.get(sub.student.id, {}), grade_cells, limits, config))
        except Exception as exc:  # noqa: BLE001
            log.error("the gradebook row of %s could not be built", safe(sub.student.id, 80), exc_info=True)
            try:
                gb.db.rollback()
            except Exception:  # noqa: BLE001
                pass
            out.append(_bare_row(gb, key, sub.student.id, grade_cells, exc))
    gb.db.commit()
    return out


def _error_row(key: str, student: str, reason: str) -> dict:
    """A CSV row with the status "error" and `reason` (flagged for the instructor), no score yet."""
    return {"student_id": student, "assignment": key, "score": 0.0, "max_score": 0.0, "auto_score": 0.0,
            "manual": False, "needs_review": False, "status": "error", "reason": reason,
            "late_penalty": 0.0, "submitted_at": "", "submitted_from": "", "seconds_late": 0}


def _bare_row(gb: Gradebook, key: str, student: str, grade_cells: list, exc: BaseException) -> dict:
    """The row of a learner whose full row could not be built: the gradebook's scores where they can be
    read, the status "error" and the reason (flagged for the instructor)."""
    row = _error_row(key, student, f"flagged: this row could not be built ({type(exc).__name__}; details in the "
                                   "log): look at this submission")
    try:
        nb = gb.find_submission_notebook(key, key, student)
        row.update(score=round(float(nb.score), 4), max_score=round(float(nb.max_score), 4))
    except Exception:  # noqa: BLE001
        pass
    for name in sorted(grade_cells):
        try:
            row[name] = round(float(gb.find_grade(name, key, key, student).score), 4)
        except Exception:  # noqa: BLE001
            row[name] = 0.0
    return row


def _row(gb: Gradebook, key: str, student: str, info: dict, grade_cells: list, limits: Limits, config) -> dict:
    from .deadlines import iso_utc, late_for

    nb = gb.find_submission_notebook(key, key, student)
    info = info if isinstance(info, dict) else {}
    grades = nb.grades
    row = {
        "student_id": student,
        "assignment": key,
        "score": round(float(nb.score), 4),
        "max_score": round(float(nb.max_score), 4),
        "auto_score": round(sum(float(g.auto_score or 0.0) for g in grades), 4),
        "manual": any(g.manual_score is not None for g in grades),
        "needs_review": any(g.manual_score is not None and g.needs_manual_grade for g in grades),
        "status": safe(info.get("status", "graded"), 40),
        "reason": _reason(info, limits),
    }
    if (nb.flagged and info.get(REVIEW_FLAG) is True and not row["needs_review"] and row["status"] == "graded"
            and not info.get("flags")):
        # flagged by `record` for review only, and reviewed since (the score saved again in formgrader):
        # the flag goes; the caller clears REVIEW_FLAG in the result file, so a flag set by hand stays
        nb.flagged = False
        info[REVIEW_FLAG] = False
    late = late_for(config, key, info, score=float(nb.score)) if config is not None else None
    penalty = round(late.penalty, 4) if late is not None else 0.0
    if (nb.late_submission_penalty or 0.0) != penalty:
        nb.late_submission_penalty = penalty
    row.update({
        "score": round(max(0.0, float(nb.score) - penalty), 4),
        "late_penalty": penalty,
        "submitted_at": iso_utc(late.submitted) if late is not None else safe(info.get("submitted_at", ""), 40),
        "submitted_from": safe(info.get("submitted_from", ""), 20),
        "seconds_late": round(late.seconds_late) if late is not None else 0,
    })
    for name in sorted(grade_cells):
        row[name] = round(float(gb.find_grade(name, key, key, student).score), 4)
    return row


def write_csv(path: Path, table: list[dict], limits: Limits = DEFAULT) -> None:
    """Write the rows atomically: a reader never sees half a file.

    Every text cell is made safe for a spreadsheet (`text.csv_cell`): no control characters
    (so one row is one line), at most `limits.error_chars` characters, and a cell that would
    start a formula (=, +, -, @, tab, CR) gets a leading apostrophe. Numbers stay numbers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    fields = list(table[0].keys()) if table else ["student_id", "assignment", "score", "max_score", "status", "reason"]
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([csv_cell(name, 200) for name in fields])
        for row in table:
            try:
                cells = [csv_cell(row.get(name, ""), limits.error_chars) for name in fields]
            except Exception:  # noqa: BLE001 - one row's values never cost the file
                log.error("a row of %s could not be written", path.name, exc_info=True)
                cells = _bare_cells(row, fields, limits)
            w.writerow(cells)
    os.replace(tmp, path)


def _bare_cells(row: dict, fields: list, limits: Limits) -> list:
    """The CSV cells of a row some value of which could not be written: its student id (escaped, or
    "?"), the status "error" and the reason, nothing else."""
    try:
        sid = safe(row.get("student_id", ""), 80)
        sid = ("'" + sid) if sid[:1] in ("=", "+", "-", "@") else sid
    except Exception:  # noqa: BLE001
        sid = "?"
    said = {"student_id": sid, "status": "error",
            "reason": "flagged: this row could not be written (details in the log); look at this submission"}
    return [said.get(name, "") for name in fields]


# In a result file: the gradebook could not take this learner's row (`export.write_outputs` still lists them).
NOT_IN_GRADEBOOK = "not_in_gradebook"


def unrecorded_row(key: str, student: str, like: dict | None, limits: Limits = DEFAULT) -> dict:
    """The CSV row of a learner whose result the gradebook could not take (`grading_run`'s fallback, which
    marks its result file with NOT_IN_GRADEBOOK): no score, the status "error", flagged; with the columns
    of `like` (another row) where there is one."""
    row = _error_row(key, student, safe("flagged: the gradebook could not take this learner's result (details in "
                                        "the run's log); look at this submission: the next run grades it again",
                                        limits.error_chars))
    for name in (like or {}):
        row.setdefault(name, 0.0)
    return row
