"""The grades as files that Canvas and Moodle import: OUT/exports/KEY_canvas.csv and KEY_moodle.csv.

Both are written from the final table of a grading run (`gradebook.rows`: one dict per
submission, its `score` the final one, manual scores and the late penalty applied).

* Canvas (Grades, Import; https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807):
  the columns Student, ID, SIS User ID, SIS Login ID and Section, then one column per
  assignment, headed "Name (ID)" for an assignment Canvas already has (a header without an id
  creates a new assignment of that name); the second row is "Points Possible" with the
  assignment's maximum. Canvas matches a row to a student by ID, SIS User ID or SIS Login ID:
  our student ids go into the column `[lms] canvas_id_column` of course.toml names (default
  "SIS Login ID"), the roster fills the others.
* Moodle (Grades, Import, CSV file; https://docs.moodle.org/en/Grade_import): a header row,
  one row per learner, UTF-8 and commas; on import the instructor maps the identifier column
  ("Map from") to the user field our ids are ("Map to": `[lms] moodle_id_field`, username,
  email or idnumber) and the grade column to a grade item.

Only graded submissions are written. A submission that was not graded (its notebook was
refused, or the grader failed) has no row: importing the file then changes nothing for that
learner, and the instructor settles it from KEY_grades.csv, where it is flagged.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from ..core.logs import log
from ..core.text import csv_cell
from ..core.usage import UsageError

CANVAS_ID_COLUMNS = ("ID", "SIS User ID", "SIS Login ID")
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_ID_HEADERS = {"username": "Username", "email": "Email address", "idnumber": "ID number"}
# roster columns that may hold each Canvas column (course.toml's roster is student_id,name[,...])
ROSTER_KEYS = {"Student": ("name", "Student"), "ID": ("canvas_id", "ID"), "SIS User ID": ("sis_user_id", "SIS User ID"),
               "SIS Login ID": ("sis_login_id", "SIS Login ID"), "Section": ("section", "Section")}


def _lms(config):
    """(canvas id column, moodle id field, roster) from a course configuration, or the defaults."""
    lms = getattr(config, "lms", None)
    return (getattr(lms, "canvas_id_column", None) or "SIS Login ID",
            getattr(lms, "moodle_id_field", None) or "username",
            dict(getattr(lms, "roster", None) or {}))


def _settings(config, key: str):
    """(canvas column header, moodle item header) for assignment `key`: course.toml's, else the key."""
    settings = None
    if config is not None and hasattr(config, "assignment"):
        settings = config.assignment(key)
    return (getattr(settings, "canvas_column", None) or key, getattr(settings, "moodle_item", None) or key)


def _num(x) -> str:
    """A score as both LMSs read it: a plain decimal number with a point, at most 4 decimals."""
    text = f"{float(x):.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def graded(table: list[dict], key: str) -> list[dict]:
    """The rows of `key` that hold a grade (status "graded"), by student id."""
    return sorted((r for r in table if r.get("assignment", key) == key and r.get("status") == "graded"),
                  key=lambda r: str(r["student_id"]))


def _write(path: Path, rows: list[list]) -> Path:
    """Write the CSV atomically (a reader never sees half a file), every text cell spreadsheet-safe."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        for row in rows:
            w.writerow([csv_cell(c, 300) for c in row])
    os.replace(tmp, path)
    return path


def canvas_rows(table: list[dict], key: str, config=None) -> list[list]:
    id_column, _, roster = _lms(config)
    if id_column not in CANVAS_ID_COLUMNS:
        raise UsageError(f"course.toml: [lms] canvas_id_column must be one of {', '.join(CANVAS_ID_COLUMNS)}, not {id_column!r}")
    column, _ = _settings(config, key)
    rows = graded(table, key)
    max_score = max((float(r["max_score"]) for r in rows), default=0.0)
    out: list[list] = [[*CANVAS_COLUMNS, column], ["Points Possible", "", "", "", "", _num(max_score)]]
    for r in rows:
        try:
            sid = str(r["student_id"])
            info = roster.get(sid) or {}
            cells = {}
            for name in CANVAS_COLUMNS:
                cells[name] = next((str(info[k]) for k in ROSTER_KEYS[name] if info.get(k) not in (None, "")), "")
            cells[id_column] = sid
            cells["Student"] = cells["Student"] or sid
            out.append([*(cells[name] for name in CANVAS_COLUMNS), _num(r["score"])])
        except Exception:  # noqa: BLE001 - one row never costs the others theirs; the CSV lists it
            log.error("a Canvas row could not be written", exc_info=True)
    return out


def moodle_rows(table: list[dict], key: str, config=None) -> list[list]:
    _, id_field, roster = _lms(config)
    if id_field not in MOODLE_ID_HEADERS:
        raise UsageError(f"course.toml: [lms] moodle_id_field must be one of {', '.join(MOODLE_ID_HEADERS)}, not {id_field!r}")
    _, item = _settings(config, key)
    out: list[list] = [[MOODLE_ID_HEADERS[id_field], "Full name", item]]
    for r in graded(table, key):
        try:
            sid = str(r["student_id"])
            name = str((roster.get(sid) or {}).get("name") or "")
            out.append([sid, name, _num(r["score"])])
        except Exception:  # noqa: BLE001 - as in canvas_rows
            log.error("a Moodle row could not be written", exc_info=True)
    return out


def write_lms(table: list[dict], key: str, config, out: str | Path) -> list[Path]:
    """Write OUT/exports/KEY_canvas.csv and OUT/exports/KEY_moodle.csv from the final table;
    returns their paths. `config` is a `course_config.CourseConfig` or None (the defaults:
    column headers named by the key, ids in Canvas's SIS Login ID and Moodle's username)."""
    folder = Path(out) / "exports"
    return [_write(folder / f"{key}_canvas.csv", canvas_rows(table, key, config)),
            _write(folder / f"{key}_moodle.csv", moodle_rows(table, key, config))]


def not_exported(table: list[dict], key: str) -> list[str]:
    """The student ids of `key` whose submission has no grade to export (not graded)."""
    return sorted(str(r["student_id"]) for r in table if r.get("assignment", key) == key and r.get("status") != "graded")


__all__ = ["write_lms", "canvas_rows", "moodle_rows", "graded", "not_exported", "CANVAS_COLUMNS", "MOODLE_ID_HEADERS"]
