"""The Canvas and Moodle grade files: do they parse back as each LMS documents its import?"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autograder.core.usage import UsageError
from autograder.course.lms import CANVAS_COLUMNS, write_lms

KEY = "03_qkv"


@dataclass(frozen=True)
class Lms:
    canvas_id_column: str = "SIS Login ID"
    moodle_id_field: str = "username"
    roster: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    canvas_column: str | None = None
    moodle_item: str | None = None


@dataclass(frozen=True)
class Config:
    """A stand-in for course_config.CourseConfig: the attributes write_lms reads."""
    lms: Lms = Lms()
    settings: Settings = Settings()

    def assignment(self, key):
        return self.settings


def row(student, score, status="graded", max_score=26.0):
    return {"student_id": student, "assignment": KEY, "score": score, "max_score": max_score, "status": status,
            "reason": ""}


TABLE = [row("bob", 20.5), row("alice", 26.0), row("carol", 0.0, status="error"),
         row("dave", 0.0, status="grader_error")]


def read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_file_has_canvas_columns_points_possible_and_graded_rows_only(tmp_path):
    """Are the header, the Points Possible row and the ids where Canvas's import reads them?"""
    canvas, moodle = write_lms(TABLE, KEY, None, tmp_path)
    assert canvas == tmp_path / "exports" / f"{KEY}_canvas.csv" and moodle.name == f"{KEY}_moodle.csv"
    rows = read(canvas)
    assert rows[0] == [*CANVAS_COLUMNS, KEY]
    assert rows[1] == ["Points Possible", "", "", "", "", "26"]
    by_login = {r[3]: r for r in rows[2:]}
    assert set(by_login) == {"alice", "bob"}  # the ungraded carol and dave are left out: nothing overwritten
    assert by_login["bob"][-1] == "20.5" and by_login["alice"][-1] == "26"
    assert by_login["bob"][0] == "bob"  # no roster: the id stands for the name


def test_canvas_column_id_column_and_roster_from_the_configuration(tmp_path):
    config = Config(lms=Lms(canvas_id_column="SIS User ID", roster={
        "bob": {"name": "=HYPERLINK(\"http://x\")", "section": "A", "ID": "991"}}),
        settings=Settings(canvas_column="Exercise 3 (123456)"))
    rows = read(write_lms(TABLE, KEY, config, tmp_path)[0])
    assert rows[0][-1] == "Exercise 3 (123456)"
    bob = next(r for r in rows[2:] if r[2] == "bob")
    assert bob[0] == "'=HYPERLINK(\"http://x\")"  # formula injection neutralised
    assert bob[1] == "991" and bob[4] == "A" and bob[3] == ""


def test_moodle_file_has_the_identifier_column_and_the_grade_item(tmp_path):
    config = Config(lms=Lms(moodle_id_field="email", roster={"alice": {"name": "Alice Liddell"}}),
                    settings=Settings(moodle_item="Exercise 3"))
    rows = read(write_lms(TABLE, KEY, config, tmp_path)[1])
    assert rows[0] == ["Email address", "Full name", "Exercise 3"]
    assert rows[1:] == [["alice", "Alice Liddell", "26"], ["bob", "", "20.5"]]


def test_a_bad_id_column_is_one_sentence(tmp_path):
    with pytest.raises(UsageError, match="canvas_id_column"):
        write_lms(TABLE, KEY, Config(lms=Lms(canvas_id_column="Name")), tmp_path)


def test_an_empty_table_still_writes_importable_headers(tmp_path):
    canvas, moodle = write_lms([], KEY, None, tmp_path)
    assert read(canvas)[1][0] == "Points Possible" and read(moodle) == [["Username", "Full name", KEY]]
