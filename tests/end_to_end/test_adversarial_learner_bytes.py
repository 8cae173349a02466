"""One learner's bytes cost at most that learner's grade (tests/attacks/learner_bytes.py, in the batch):
timestamps at the edge of the calendar and notebooks whose valid JSON Python refuses are each that
learner's flagged row with one sentence; the batch around them is graded and exported (the batch
fixture asserts `grade` exits 0, and test_adversarial.py that every other learner has their outcome)."""

from __future__ import annotations

import pytest

from attacks import KEY
from attacks.learner_bytes import NOTEBOOKS, STAMPED


def _row(batch, name) -> str:
    return next(ln for ln in batch["csv"] if ln.startswith(f"{name},"))


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_a_notebook_python_cannot_read_is_the_learners_error(batch, name):
    """Is valid notebook JSON that Python refuses to read (an integer of thousands of digits, a lone
    surrogate) that learner's error with one sentence, never a grader error?"""
    r = batch["by"][name]
    assert r["status"] == "error" and r["score"] == 0.0, (r["status"], r.get("error"))
    assert NOTEBOOKS[name][1] in r["error"] and len(r["error"]) < 300, r["error"]
    assert ",error," in _row(batch, name)
    assert (batch["out"] / "feedback" / name / KEY / f"{KEY}.html").is_file()


@pytest.mark.parametrize("name", sorted(STAMPED))
def test_a_timestamp_at_the_edge_of_the_calendar_is_refused_with_a_flag(batch, name):
    """Is a timestamp.txt whose time leaves the calendar when moved to UTC refused, the file time used
    and the refusal flagged, without stopping the scan of the batch?"""
    r = batch["by"][name]
    assert r["submitted_from"] == "file time", r
    assert any("timestamp.txt" in f and STAMPED[name][1] in f for f in r["flags"]), r["flags"]
    assert "flagged:" in _row(batch, name)
    # what nbgrader's own tools read beside the feedback page is a time they can read: the file time
    from nbgrader.utils import parse_utc

    from autograder.course.deadlines import parse_timestamp

    stamp = (batch["out"] / "feedback" / name / KEY / "timestamp.txt").read_text(encoding="utf-8")
    assert STAMPED[name][0] not in stamp and parse_timestamp(stamp) == parse_utc(stamp).replace(
        tzinfo=parse_timestamp(stamp).tzinfo), stamp
    assert not (batch["out"] / "autograded" / name / KEY / "timestamp.txt").exists()


def test_no_learner_byte_made_a_grader_error(batch):
    """Of the whole batch, is any submission a grader error (a fault of ours, regraded on every run)?"""
    assert [n for n, r in batch["by"].items() if r["status"] == "grader_error"] == []
