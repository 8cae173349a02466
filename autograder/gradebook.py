"""Scores into an nbgrader gradebook, and the CSV export made from it.

The gradebook mirrors what `nbgrader generate_assignment` would have stored for the
learner notebook (its grade, solution and source cells), so instructors keep nbgrader's
own tools: `nbgrader export`, formgrader. Each part of an exercise is one grade cell,
``test_<part>``, whose auto score is the sum of the points of that part's hidden checks.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import warnings
from pathlib import Path

import nbformat
from nbgrader import utils as nbgrader_utils
from nbgrader.api import Gradebook, MissingEntry

from .assignments import Assignment
from .limits import DEFAULT, Limits
from .text import csv_cell, safe


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


def record(gb: Gradebook, assignment: Assignment, student: str, result, timestamp: float | None = None,
           flagged: bool = False) -> None:
    """Write one result's part scores into the gradebook (creating or updating its rows).

    The submission is flagged when it was not graded, or when `flagged` (its folder held
    entries that were not graded: the instructor must look)."""
    key = assignment.key
    gb.update_or_create_student(student)
    # nbgrader's own add_submission trips SQLAlchemy 2's autoflush warnings; they are noise.
    warnings.filterwarnings("ignore", message=".*not in session.*")
    kwargs = {}
    if timestamp is not None:
        kwargs["timestamp"] = dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    gb.update_or_create_submission(key, student, **kwargs)
    nb = gb.find_submission_notebook(key, key, student)
    for part, scores in result.parts.items():
        try:
            grade = gb.find_grade(f"test_{part}", key, key, student)
        except MissingEntry:
            continue
        grade.auto_score = float(scores["score"])
        grade.needs_manual_grade = False
    # A submission that could not be graded is flagged for the instructor, never silently 0.
    nb.flagged = result.status != "graded" or bool(flagged)
    gb.db.commit()


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


def rows(gb: Gradebook, assignment: Assignment, statuses: dict[str, dict], limits: Limits = DEFAULT) -> list[dict]:
    """One row per submission in the gradebook, with the status recorded when it was graded
    (and the reasons it was flagged, in `reason`)."""
    key = assignment.key
    out = []
    grade_cells = [c.name for c in gb.find_notebook(key, key).grade_cells]
    for sub in sorted(gb.find_assignment(key).submissions, key=lambda s: s.student.id):
        nb = gb.find_submission_notebook(key, key, sub.student.id)
        info = statuses.get(sub.student.id, {})
        row = {
            "student_id": sub.student.id,
            "assignment": key,
            "score": round(float(nb.score), 4),
            "max_score": round(float(nb.max_score), 4),
            "status": safe(info.get("status", "graded"), 40),
            "reason": _reason(info, limits),
        }
        for name in sorted(grade_cells):
            row[name] = round(float(gb.find_grade(name, key, key, sub.student.id).score), 4)
        out.append(row)
    return out


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
            w.writerow([csv_cell(row.get(name, ""), limits.error_chars) for name in fields])
    os.replace(tmp, path)
