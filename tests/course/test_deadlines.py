"""Submission times and late policies: nbgrader's timestamp.txt read as learner bytes, and each
policy's arithmetic against values worked out by hand."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from autograder.course.course_config import AssignmentSettings, LatePolicy
from autograder.course.deadlines import (FROM_FILE_TIME, FROM_TIMESTAMP, assess, duration, late_for, parse_timestamp,
                                         submission_time)

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 20, 12, 0, tzinfo=UTC)
MTIME = dt.datetime(2026, 12, 11, 8, 0, tzinfo=UTC).timestamp()

STAMPS = [
    ("2026-12-01 15:31:15.123456 UTC", dt.datetime(2026, 12, 1, 15, 31, 15, 123456, tzinfo=UTC)),  # nbgrader's default
    ("2026-12-01 15:31:15.123456 CET", dt.datetime(2026, 12, 1, 14, 31, 15, 123456, tzinfo=UTC)),
    ("2026-07-01 15:31:15.000001 CEST", dt.datetime(2026, 7, 1, 13, 31, 15, 1, tzinfo=UTC)),
    ("2026-07-01 15:31:15 Europe/Berlin", dt.datetime(2026, 7, 1, 13, 31, 15, tzinfo=UTC)),
    ("2026-12-01T15:31:15Z", dt.datetime(2026, 12, 1, 15, 31, 15, tzinfo=UTC)),
    ("2026-12-01T15:31:15+05:30", dt.datetime(2026, 12, 1, 10, 1, 15, tzinfo=UTC)),
    ("2026-12-01 15:31:15 -0500", dt.datetime(2026, 12, 1, 20, 31, 15, tzinfo=UTC)),
    ("2026-12-01 15:31:15", dt.datetime(2026, 12, 1, 15, 31, 15, tzinfo=UTC)),  # no zone: UTC, as nbgrader
    ("  2026-12-01 15:31 UTC\n", dt.datetime(2026, 12, 1, 15, 31, tzinfo=UTC)),
]


@pytest.mark.parametrize("text, when", STAMPS, ids=[s[0].strip() for s in STAMPS])
def test_timestamp_forms(text, when):
    """Are the forms nbgrader writes read as the same instant?"""
    assert parse_timestamp(text) == when


def test_what_nbgrader_writes_is_read_as_nbgrader_reads_it():
    """Is nbgrader's own default format (its exchange's timestamp_format) read as nbgrader.utils.parse_utc reads it?"""
    from nbgrader.exchange.abc.exchange import Exchange
    from nbgrader.utils import parse_utc

    written = dt.datetime(2026, 12, 1, 15, 31, 15, 123456, tzinfo=UTC).strftime(Exchange.timestamp_format.default_value)
    assert parse_timestamp(written).replace(tzinfo=None) == parse_utc(written)


def submitted(tmp_path: Path, stamp: bytes | None) -> Path:
    """submitted/alice/03_qkv/03_qkv.ipynb, with `stamp` as its timestamp.txt."""
    folder = tmp_path / "submitted" / "alice" / "03_qkv"
    folder.mkdir(parents=True)
    if stamp is not None:
        (folder / "timestamp.txt").write_bytes(stamp)
    nb = folder / "03_qkv.ipynb"
    nb.write_text("{}")
    return nb


def test_timestamp_txt_beside_the_notebook_is_the_submission_time(tmp_path):
    nb = submitted(tmp_path, b"2026-12-01 15:31:15.123456 UTC")
    notes = []
    when, source = submission_time(nb, MTIME, base=tmp_path / "submitted", notes=notes, now=NOW)
    assert (when, source, notes) == (dt.datetime(2026, 12, 1, 15, 31, 15, 123456, tzinfo=UTC), FROM_TIMESTAMP, [])


def test_one_folder_per_student_reads_the_students_timestamp(tmp_path):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "timestamp.txt").write_text("2026-12-02 10:00:00 UTC")
    (tmp_path / "alice" / "03_qkv.ipynb").write_text("{}")
    (tmp_path / "timestamp.txt").write_text("2026-01-01 00:00:00 UTC")  # beside flat notebooks: nobody's
    (tmp_path / "bob.ipynb").write_text("{}")
    assert submission_time(tmp_path / "alice" / "03_qkv.ipynb", MTIME, base=tmp_path, now=NOW) == (
        dt.datetime(2026, 12, 2, 10, tzinfo=UTC), FROM_TIMESTAMP)
    assert submission_time(tmp_path / "bob.ipynb", MTIME, base=tmp_path, now=NOW) == (
        dt.datetime.fromtimestamp(MTIME, UTC), FROM_FILE_TIME)


REFUSED = [
    (b"yesterday", "'yesterday' is not a date and time"),
    (b"2026-02-30 10:00:00 UTC", "is not a valid date and time"),
    (b"2026-12-01 10:00:00 Mars/Olympus", "names a time zone we do not know (Mars/Olympus)"),
    (b"2099-01-01 00:00:00 UTC", "says 2099-01-01 00:00 UTC, which is in the future"),
    (b"1970-01-01 00:00:00 UTC", "says 1970-01-01 00:00 UTC, which is before 2000"),
    (b"2026-12-01 10:00:00 UTC" + b" " * 300, "is over 200 bytes"),
    (b"\xff\xfe2026", "is not UTF-8 text"),
    (b"2026-12-01 10:00:00 UTC\x1b[2J", "is not a date and time"),
    # at the edges of the calendar: moved to UTC they leave it (OverflowError), which stopped a whole batch
    (b"9999-12-31 23:59:59-05:00", "is not a time this grader can represent"),
    (b"9999-12-31T23:59:59.999999-18:00", "is not a time this grader can represent"),
    (b"0001-01-01 00:00:00+05:00", "is not a time this grader can represent"),
    (b"0001-01-01 00:00 NZDT", "is not a time this grader can represent"),
    (b"9999-12-31 22:00:00 EDT", "is not a time this grader can represent"),
    (b"9999-12-31 23:59:59 Pacific/Kiritimati", "which is in the future"),
    (b"0001-01-01 00:00:00 America/New_York", "which is before 2000"),
]


@pytest.mark.parametrize("stamp, why", REFUSED, ids=[r[1][:30] for r in REFUSED])
def test_a_bad_timestamp_gives_the_file_time_and_a_reason(tmp_path, stamp, why):
    """Is a forged, huge or garbage timestamp.txt refused, the file time used, and the reason noted?"""
    nb = submitted(tmp_path, stamp)
    notes = []
    when, source = submission_time(nb, MTIME, base=tmp_path / "submitted", notes=notes, now=NOW)
    assert (when, source) == (dt.datetime.fromtimestamp(MTIME, UTC), FROM_FILE_TIME)
    assert len(notes) == 1 and why in notes[0] and notes[0].endswith("the file time is the submission time")
    assert "\x1b" not in notes[0]


def test_a_linked_or_special_timestamp_is_never_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("2026-12-01 10:00:00 UTC")
    nb = submitted(tmp_path, None)
    os.symlink(secret, nb.parent / "timestamp.txt")
    notes = []
    assert submission_time(nb, MTIME, base=tmp_path / "submitted", notes=notes, now=NOW)[1] == FROM_FILE_TIME
    assert "symbolic link" in notes[0]
    (nb.parent / "timestamp.txt").unlink()
    os.mkfifo(nb.parent / "timestamp.txt")  # would block a plain open()
    notes = []
    assert submission_time(nb, MTIME, base=tmp_path / "submitted", notes=notes, now=NOW)[1] == FROM_FILE_TIME
    assert "not a regular file (a fifo)" in notes[0]


def test_no_timestamp_is_the_file_time_without_a_note(tmp_path):
    nb = submitted(tmp_path, None)
    notes = []
    assert submission_time(nb, MTIME, base=tmp_path / "submitted", notes=notes, now=NOW) == (
        dt.datetime.fromtimestamp(MTIME, UTC), FROM_FILE_TIME)
    assert notes == []


@pytest.mark.parametrize("mtime", [1e20, -1e20, float("nan"), float("inf")])
def test_a_file_time_out_of_the_calendar_is_now(tmp_path, mtime):
    """A learner's archive can carry any file time: one the calendar cannot hold is replaced by now
    (and a stamp beside it that cannot be read costs nothing more), never an exception."""
    nb = submitted(tmp_path, b"9999-12-31 23:59:59-05:00")
    notes = []
    assert submission_time(nb, mtime, base=tmp_path / "submitted", notes=notes, now=NOW) == (NOW, FROM_FILE_TIME)
    assert "not a time this grader can represent" in notes[0]


# --- the policies -------------------------------------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")
DUE = dt.datetime(2026, 12, 10, 23, 59, tzinfo=BERLIN)  # 22:59 UTC


def settings(policy="per_day", penalty=10.0, grace=0, cutoff=None) -> AssignmentSettings:
    return AssignmentSettings("03_qkv", DUE, LatePolicy(policy, penalty, dt.timedelta(minutes=grace),
                                                          None if cutoff is None else dt.timedelta(days=cutoff)),
                              timezone="Europe/Berlin")


H = dt.timedelta(hours=1)
# (policy, penalty %, grace minutes, cutoff days, late by, score, max) -> (points off, zeroed): worked by hand
POLICIES = [
    ("per_day", 10, 0, None, -H, 20, 26, 0.0, False),                      # early
    ("per_day", 10, 0, None, dt.timedelta(0), 20, 26, 0.0, False),         # on the minute
    ("per_day", 10, 0, None, dt.timedelta(seconds=1), 20, 26, 2.6, False),  # 1 started day: 10 % of 26
    ("per_day", 10, 0, None, 27 * H, 20, 26, 5.2, False),                  # 2 started days: 20 % of 26
    ("per_day", 10, 0, None, 48 * H, 20, 26, 5.2, False),                  # exactly 2 days: still 2
    ("per_day", 10, 5, None, dt.timedelta(minutes=5), 20, 26, 0.0, False),  # within grace
    ("per_day", 10, 5, None, dt.timedelta(minutes=6), 20, 26, 2.6, False),  # past grace: days from the due date
    ("per_day", 40, 0, None, 72 * H, 20, 26, 20.0, True),                  # 120 % capped: never below 0
    ("per_hour", 5, 0, None, 2.5 * H, 10, 20, 3.0, False),                 # 3 started hours x 5 % of 20
    ("per_hour", 5, 0, None, 2.5 * H, 2, 20, 2.0, True),                   # capped at the score
    ("zero", 0, 0, None, dt.timedelta(minutes=1), 26, 26, 26.0, True),
    ("zero", 0, 10, None, dt.timedelta(minutes=10), 26, 26, 0.0, False),
    ("none", 0, 0, None, 100 * H, 26, 26, 0.0, False),
    ("none", 0, 0, 7, 7 * 24 * H + dt.timedelta(seconds=1), 26, 26, 26.0, True),  # past the cutoff
    ("per_day", 10, 0, 7, 7 * 24 * H, 20, 26, 18.2, False),                # at the cutoff: 7 days x 10 % of 26
]


@pytest.mark.parametrize("policy, pct, grace, cutoff, late, score, top, off, zeroed", POLICIES)
def test_policy_arithmetic(policy, pct, grace, cutoff, late, score, top, off, zeroed):
    got = assess(settings(policy, pct, grace, cutoff), DUE + late, FROM_TIMESTAMP, score, top)
    assert got.penalty == pytest.approx(off) and got.zeroed == zeroed
    assert score - got.penalty >= 0
    assert got.seconds_late == (late.total_seconds() if got.late else 0)


def test_the_learners_sentence():
    late = assess(settings(), DUE + dt.timedelta(days=1, hours=3), FROM_TIMESTAMP, 20, 26)
    assert late.explanation == ("Handed in 1 day 3 hours after the due date (2026-12-10 23:59 CET): "
                                "-20 % (10 % per started day).")
    assert assess(settings(), DUE - H, FROM_TIMESTAMP, 20, 26).explanation == \
        "Handed in on time (due 2026-12-10 23:59 CET)."
    assert assess(settings("zero", 0, 5), DUE + dt.timedelta(minutes=3), FROM_TIMESTAMP, 20, 26).explanation == (
        "Handed in 3 minutes after the due date (2026-12-10 23:59 CET), within the grace period of 5 minutes: on time.")
    assert assess(settings("none", 0, 0, 7), DUE + 200 * H, FROM_TIMESTAMP, 20, 26).explanation == (
        "Handed in 8 days 8 hours after the due date (2026-12-10 23:59 CET): no credit (later than 7 days after it).")
    assert assess(AssignmentSettings("03_qkv"), DUE, FROM_TIMESTAMP, 20, 26).explanation == ""


def test_daylight_saving_time_edge():
    """Is a due date at the end of summer time counted in real hours, and shown in the zone's clock?"""
    # 2026-10-25 in Berlin: 03:00 CEST becomes 02:00 CET. Due 01:30 CEST (23:30 UTC on the 24th).
    due = dt.datetime(2026, 10, 25, 1, 30, tzinfo=BERLIN)
    s = AssignmentSettings("03_qkv", due, LatePolicy("per_hour", 10, dt.timedelta(0), None), timezone="Europe/Berlin")
    # handed in at 02:20 CET by the wall clock: 1 h 50 min after the due date in real time (not 50 min)
    handed = dt.datetime(2026, 10, 25, 2, 20, fold=1, tzinfo=BERLIN)
    got = assess(s, handed, FROM_TIMESTAMP, 10, 10)
    assert got.seconds_late == 110 * 60 and got.penalty == pytest.approx(2.0)
    assert "(2026-10-25 01:30 CEST)" in got.explanation and got.explanation.startswith("Handed in 1 hour 50 minutes")


def test_late_for_reads_a_saved_result():
    """Does `export` get the same lateness from a result file as `grade` did, under a moved due date too?"""
    from autograder.course.course_config import CourseConfig

    config = CourseConfig(assignments={"03_qkv": settings()})
    saved = {"score": 20, "max_score": 26, "submitted_at": "2026-12-11T23:00:00Z", "submitted_from": "timestamp.txt"}
    got = late_for(config, "03_qkv", saved)
    assert got.penalty == pytest.approx(5.2) and got.source == FROM_TIMESTAMP
    assert late_for(config, "03_qkv", saved, score=1.0).penalty == pytest.approx(1.0)  # a manual score of 1
    moved = CourseConfig(assignments={"03_qkv": AssignmentSettings("03_qkv", DUE + 48 * H, settings().late)})
    assert late_for(moved, "03_qkv", saved).penalty == 0
    assert late_for(config, "03_qkv", {"score": 20, "max_score": 26}).penalty == 0  # no time known


@pytest.mark.parametrize("seconds, text", [(30, "less than a minute"), (60, "1 minute"),
                                           (3 * 3600 + 120, "3 hours 2 minutes"), (86400, "1 day"),
                                           (2 * 86400 + 59, "2 days"), (86400 + 61, "1 day")])
def test_duration(seconds, text):
    assert duration(seconds) == text


# --- end to end: `grade --config` on nbgrader's submitted/ layout ----------------------------

COURSE = """
[course]
timezone = "Europe/Berlin"

[late]
policy = "per_day"
penalty = 10

[assignments.03_qkv]
due = 2025-12-10T23:59:00
"""


@pytest.mark.slow
def test_grade_applies_the_late_policy_everywhere(tmp_path):
    """Does one late learner of two lose 20 % in our CSV, in nbgrader's own export and on the feedback page,
    with the times from timestamp.txt?"""
    import csv
    import json
    import subprocess
    import sys

    from conftest import reference_notebook, run_cli, write

    course = tmp_path / "course"
    for student, stamp in (("alice", "2025-12-10 21:00:00.000000 UTC"),    # 22:00 CET: on time
                           ("bob", "2025-12-12 02:00:00.000000 UTC")):     # 1 day 3 hours 1 minute late
        nb = write(reference_notebook("03_qkv"), course / "submitted" / student / "03_qkv" / "03_qkv.ipynb")
        (nb.parent / "timestamp.txt").write_text(stamp)
    (course / "course.toml").write_text(COURSE)
    proc = run_cli("grade", "--assignment", "03_qkv", str(course / "submitted"), "--out", str(course), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = {s["student"]: s for s in json.loads(proc.stdout)["submissions"]}
    assert "bob: 26 / 26" in proc.stderr and "late: 1 day 3 hours, -5.2 points" in proc.stderr
    assert "file times" not in proc.stderr and "no course configuration" not in proc.stderr

    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "03_qkv_grades.csv", encoding="utf-8"))}
    assert {s: (float(r["score"]), float(r["late_penalty"]), r["submitted_from"]) for s, r in rows.items()} == {
        "alice": (26.0, 0.0, "timestamp.txt"), "bob": (20.8, 5.2, "timestamp.txt")}
    assert rows["bob"]["submitted_at"] == "2025-12-12T02:00:00Z" and int(rows["bob"]["seconds_late"]) == 97260
    assert summary["bob"]["submitted_at"] == "2025-12-12T02:00:00Z"  # the result file and --json

    # nbgrader's own export reads the due date, the timestamps and the penalty from the gradebook
    exported = tmp_path / "nbgrader.csv"
    nbg = subprocess.run([sys.executable, "-m", "nbgrader", "export", f"--CsvExportPlugin.to={exported}",
                          f"--CourseDirectory.db_url=sqlite:///{course / 'gradebook.db'}"],
                         cwd=course, capture_output=True, text=True, timeout=300)
    assert nbg.returncode == 0, nbg.stderr[-2000:]
    theirs = {r["student_id"]: r for r in csv.DictReader(open(exported, encoding="utf-8"))}
    assert {s: (float(r["raw_score"]), float(r["late_submission_penalty"]), float(r["score"]))
            for s, r in theirs.items()} == {"alice": (26.0, 0.0, 26.0), "bob": (26.0, 5.2, 20.8)}
    assert theirs["bob"]["duedate"].startswith("2025-12-10 22:59:00")
    assert theirs["bob"]["timestamp"].startswith("2025-12-12 02:00:00")

    page = (course / "feedback" / "bob" / "03_qkv" / "03_qkv.html").read_text(encoding="utf-8")
    assert ("Handed in 1 day 3 hours after the due date (2025-12-10 23:59 CET): -20 % (10 % per started day). "
            "(5.2 points off)") in page and "Score: <b>20.8 / 26</b>" in page
    alice = (course / "feedback" / "alice" / "03_qkv" / "03_qkv.html").read_text(encoding="utf-8")
    assert "Handed in on time (due 2025-12-10 23:59 CET)." in alice and "Score: <b>26 / 26</b>" in alice

    # an extension for everyone: move the due date, `export` again, grade nothing
    (course / "course.toml").write_text(COURSE.replace("2025-12-10T23:59:00", "2025-12-13T23:59:00"))
    proc = run_cli("export", "--assignment", "03_qkv", "--out", str(course))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "03_qkv_grades.csv", encoding="utf-8"))}
    assert (float(rows["bob"]["score"]), float(rows["bob"]["late_penalty"])) == (26.0, 0.0)


def test_what_nbgrader_reads_beside_the_feedback_is_the_time_the_grader_used(tmp_path):
    """Is the timestamp.txt copied for nbgrader's tools (formgrader, release_feedback) one that names the
    time `grade` used: the learner's own where nbgrader reads it alike, the same time in nbgrader's format
    where nbgrader would read it otherwise (it drops a zone name such as CEST), none where it was refused?"""
    from nbgrader.utils import parse_utc

    from autograder.course.nbgrader_course import timestamp_bytes
    from autograder.course.submissions import Claim

    for stamp, kept in ((b"2026-12-01 10:00:00.000000 UTC", True), (b"2026-12-01 10:00:00 CEST", False),
                        (b"2026-12-01 10:00:00 Europe/Berlin", True), (b"9999-12-31 23:59:59-05:00", None),
                        (b"2099-01-01 00:00:00 UTC", None)):
        nb = submitted(tmp_path / stamp.hex(), stamp)
        claim = Claim("alice", nb.parents[2], ("alice", "03_qkv", "03_qkv.ipynb"), "file")
        copied = timestamp_bytes(claim)
        if kept is None:
            assert copied is None, stamp
            continue
        assert (copied == stamp) is kept, (stamp, copied)
        used, _ = submission_time(nb, MTIME, base=nb.parents[2], now=NOW + dt.timedelta(days=3650))
        assert parse_utc(copied.decode()) == used.replace(tzinfo=None), (stamp, copied)
