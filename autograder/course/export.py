"""The `export` command, and the outputs every `grade` run ends with.

`write_outputs` rebuilds, from the gradebook and the result files OUT/results/KEY/*.json,
everything learners and the LMS read: the CSV OUT/KEY_grades.csv, each feedback page
OUT/feedback/STUDENT/KEY/KEY.html (nbgrader's release_feedback layout), and the Canvas and
Moodle imports (`autograder.course.lms`, where it is installed). `grade` ends with it and `export`
is nothing else, so the two never differ: a manual score set in formgrader reaches the
CSV, the pages and the exports at the next `export`, without grading anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.limits import DEFAULT, Limits
from ..core.logs import log
from ..core.text import STUDENT_ID, json_for_stdout, safe, visible
from ..core.usage import UsageError, known_assignment


def feedback_path(out: Path, key: str, student: str) -> Path:
    """Where nbgrader's release_feedback looks for a learner's page: OUT/feedback/STUDENT/KEY/KEY.html."""
    return out / "feedback" / student / key / f"{key}.html"


def write_feedback(out: Path, key: str, student: str, page: str) -> Path:
    path = feedback_path(out, key, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    old = out / "feedback" / student / f"{key}.html"  # where pages were written before
    if old.is_file() and not old.is_symlink():
        old.unlink()
    return path


def saved_results(out: Path, key: str) -> dict[str, dict]:
    """student -> the result file `grade` wrote (OUT/results/KEY/STUDENT.json), for files that parse."""
    found = {}
    for f in sorted((out / "results" / key).glob("*.json")):
        if not STUDENT_ID.fullmatch(f.stem) or f.is_symlink():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found[f.stem] = data
    return found


def _load_config(config_path, out: Path):
    """The course configuration (`course_config.load_config`), or None where that module is not there."""
    try:
        from .course_config import load_config
    except ImportError:
        return None
    return load_config(config_path, out)


def write_outputs(gb, assignment, out: Path, limits: Limits = DEFAULT, config=None) -> dict:
    """The CSV, every feedback page and the LMS exports of `assignment`, from the gradebook `gb` and
    the result files in `out`; {"csv", "feedback": [paths], "exports": [paths], "rows": table}."""
    from ..grading.feedback import feedback_html
    from ..grading.grader import Result
    from . import gradebook as gbk
    from .nbgrader_course import summary_cell, write_summary

    key = assignment.key
    saved = saved_results(out, key)
    table = gbk.rows(gb, assignment, saved, limits, config=config)
    listed = {row["student_id"] for row in table}
    for student, data in sorted(saved.items()):
        # a learner whose row the gradebook could not take when they were graded: listed all the same
        if student not in listed and data.get(gbk.NOT_IN_GRADEBOOK) is True:
            table.append(gbk.unrecorded_row(key, student, table[0] if table else None, limits))
    csv_path = out / f"{key}_grades.csv"
    gbk.write_csv(csv_path, table, limits)
    for student, data in saved.items():
        if data.get(gbk.REVIEW_FLAG) is False:  # `rows` took the review flag off: said in the result file
            _write_json(out / "results" / key / f"{student}.json", data)
    pages, accounts = [], {}
    for row in table:
        student = row["student_id"]
        data = saved.get(student)
        if data is None:
            continue
        try:
            result = Result.from_dict(data)
        except (KeyError, TypeError, ValueError):
            continue
        # Each page on its own: one learner's result that breaks its page leaves the page as it was
        # (written when that learner was graded) and every other page is written.
        try:
            flags = data.get("flags") if isinstance(data.get("flags"), list) else []
            late = None
            if config is not None:  # the late policy of today's configuration, on the final score
                from .deadlines import late_for

                late = late_for(config, key, data, score=row["score"] + row.get("late_penalty", 0.0))
            grades = gbk.part_grades(gb, assignment, student)
            page = feedback_html(result, flags, limits, grades=grades, late=late,
                                 comments=gbk.part_comments(gb, assignment, student))
            pages.append(str(write_feedback(out, key, student, page)))
            accounts[student] = gbk.account(row, grades)
            # formgrader's view of the same: a summary cell first in the autograded notebook
            write_summary(out, key, student, summary_cell(gbk.account_items(row, grades),
                                                          late.explanation if late is not None else ""))
        except Exception:  # noqa: BLE001
            log.error("the feedback page of %s could not be written", safe(student, 80), exc_info=True)
            try:
                gb.db.rollback()
            except Exception:  # noqa: BLE001
                pass
    exports = []
    try:
        from .lms import write_lms
    except (ImportError, AttributeError):
        write_lms = None
    if write_lms is not None:
        written = write_lms(table, key, config, out)
        exports = [str(p) for p in (written or [])]
    return {"csv": str(csv_path), "feedback": pages, "exports": exports, "rows": table, "accounts": accounts}


def _write_json(path: Path, data: dict) -> None:
    if path.is_symlink() or not path.is_file():
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def final_lines(table: list[dict], accounts: dict[str, str]) -> list[str]:
    """The terminal's lines on final scores: one per learner whose final score is not simply the
    automatic one (a manual score, a late penalty, a review needed, not graded), as the CSV has it."""
    lines = [f"  {row['student_id']}: {accounts.get(row['student_id']) or row.get('score')}" for row in table
             if row.get("manual") or float(row.get("late_penalty") or 0) or row.get("needs_review")
             or row.get("status") != "graded"]
    if not lines:
        return [f"final scores: the automatic ones for all {len(table)} (no manual score, late penalty or review)"]
    rest = len(table) - len(lines)
    return ([f"final scores (as in the CSV) where they are not the automatic score alone; the other {rest}: "
             "their automatic score"] + lines)


def export_command(args) -> int:
    """`export --assignment KEY --out DIR`: the outputs of `write_outputs`, grading nothing."""
    assignment = known_assignment(args.assignment)
    out = Path(args.out)
    url = args.gradebook or f"sqlite:///{(out / 'gradebook.db').resolve()}"
    if not args.gradebook and not (out / "gradebook.db").is_file():
        raise UsageError(f"{safe(out, 300)} has no gradebook.db: run `grade --out {safe(out, 300)}` first "
                         "(or give --gradebook URL)")
    config = _load_config(getattr(args, "config", None), out)
    from nbgrader.api import MissingEntry

    from . import gradebook as gbk
    with gbk.open_gradebook(url) as gb:
        try:
            gb.find_notebook(assignment.key, assignment.key)
        except MissingEntry:
            raise UsageError(f"the gradebook {safe(url, 300)} holds no grades of {assignment.key}") from None
        done = write_outputs(gb, assignment, out, DEFAULT, config)
    summary = {"assignment": assignment.key, "gradebook": url, "csv": done["csv"], "feedback": done["feedback"],
               "exports": done["exports"], "final": done["accounts"]}
    if args.json:
        print(json_for_stdout(summary))
    else:
        print(visible(f"csv: {done['csv']}\nfeedback: {len(done['feedback'])} page(s) in {out / 'feedback'}"
                      + "".join(f"\nexport: {p}" for p in done["exports"]), keep="\n"))
        for line in final_lines(done["rows"], done["accounts"]):
            print(visible(line))
    return 0


__all__ = ["feedback_path", "write_feedback", "saved_results", "write_outputs", "final_lines", "export_command"]
