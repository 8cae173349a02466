"""The course configuration, course.toml: the documented example loads, and every mistake is one
sentence naming the file, the setting and the problem (exit 2, nothing graded)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from conftest import run_cli
from autograder.core.usage import UsageError
from autograder.course.course_config import ConfigError, LatePolicy, load_config


def docs_example() -> str:
    """The ```toml block of book/instructors/grading.md's section "Due dates and late work"."""
    page = (Path(__file__).resolve().parents[2] / "book" / "instructors" / "grading.md").read_text(encoding="utf-8")
    section = page.split("## Due dates and late work", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section shows the whole schema as one toml block"
    return blocks[0]


def test_the_documented_example_loads(tmp_path):
    """Does the example on the instructors' page load, with the values it says?"""
    path = tmp_path / "course.toml"
    path.write_text(docs_example(), encoding="utf-8")
    config = load_config(path)
    assert config.path == path and config.timezone == "Europe/Berlin"
    assert config.late == LatePolicy("per_day", 10.0, dt.timedelta(minutes=5), dt.timedelta(days=7))
    qkv = config.assignment("03_qkv")
    assert qkv.due == dt.datetime(2026, 12, 10, 23, 59, tzinfo=ZoneInfo("Europe/Berlin"))
    assert qkv.due.utcoffset() == dt.timedelta(hours=1)
    assert qkv.late.policy == "zero" and qkv.canvas_column.startswith("Exercise 3") and qkv.moodle_item == "Exercise 3"
    sa = config.assignment("04_self_attention")
    assert sa.late == config.late and sa.due == dt.datetime(2026, 12, 17, 22, 59, tzinfo=dt.timezone.utc)
    # an exercise the file does not name: no due date, the default policy
    assert config.assignment("05_multi_head").due is None
    lms = config.lms
    assert (lms.canvas_id_column, lms.moodle_id_field, lms.roster) == ("SIS Login ID", "username", {})
    # Gradescope: the course's default, an exercise's own, a part and a check of their own
    assert config.gradescope_visibility == "after_due_date" and sa.gradescope_visibility == "after_due_date"
    assert qkv.gradescope_visibility == "after_published" and config.assignment("05_multi_head").gradescope_visibility \
        == "after_due_date"
    assert qkv.gradescope_checks == {"softmax": "visible", "test_sdpa_dropout": "hidden"}
    assert qkv.check_visibility("test_softmax_axis", "softmax") == "visible"
    assert qkv.check_visibility("test_sdpa_dropout", "scaled_dot_product_attention") == "hidden"
    assert qkv.check_visibility("test_sdpa_half_precision", "scaled_dot_product_attention") == "after_published"
    assert sa.check_visibility("test_anything", "any_part") == "after_due_date"


def test_no_file_means_no_due_dates(tmp_path):
    """Without --config and without OUT/course.toml: no due dates, and a note to say so."""
    config = load_config(None, tmp_path)
    assert config.path is None and config.assignment("03_qkv").due is None and "no due dates" in config.note
    (tmp_path / "course.toml").write_text('[course]\ntimezone = "Asia/Tokyo"\n')
    assert load_config(None, tmp_path).timezone == "Asia/Tokyo" and load_config(None, tmp_path).note == ""


def test_a_roster_is_read_relative_to_the_file(tmp_path):
    (tmp_path / "roster.csv").write_text("student_id,name,email\nalice,Alice Liddell,a@x.org\nbob,Bob,\n")
    (tmp_path / "course.toml").write_text('[lms]\nroster = "roster.csv"\n')
    roster = load_config(tmp_path / "course.toml").lms.roster
    assert roster == {"alice": {"student_id": "alice", "name": "Alice Liddell", "email": "a@x.org"},
                      "bob": {"student_id": "bob", "name": "Bob", "email": ""}}


BAD = [
    ("x = [", "is not valid TOML: "),
    ("[corse]\ntimezone = 'UTC'", "corse is not a setting we know (did you mean 'course'?)"),
    ("[late]\npolcy = 'zero'", "late.polcy is not a setting we know (did you mean 'policy'?)"),
    ("[late]\npolicy = 'weekly'",
     "late.policy must be one of 'none', 'zero', 'per_hour', 'per_day', not 'weekly'"),
    ("[late]\npolicy = 'per_day'",
     "late policy 'per_day' needs a penalty (percent of the maximum score per started day)"),
    ("[late]\npolicy = 'per_day'\npenalty = 120", "late.penalty must be between 0 and 100, not 120"),
    ("[late]\npolicy = 'per_hour'\npenalty = -1", "late.penalty must be between 0 and 100, not -1"),
    ("[late]\npolicy = 'per_hour'\npenalty = '10'", "late.penalty must be a number, not a string"),
    ("[late]\npolicy = 'zero'\npenalty = 10", "late.penalty goes with policy 'per_hour' or 'per_day', not 'zero'"),
    ("[late]\npolicy = 'zero'\ngrace_minutes = -5", "late.grace_minutes must be 0 or more, not -5"),
    ("[late]\npolicy = 'zero'\ngrace_minutes = 60\ncutoff_days = 0.01",
     "late.cutoff_days must be longer than the grace period"),
    ("[course]\ntimezone = 'Europe/Berln'",
     "course.timezone 'Europe/Berln' is not an IANA time zone name (did you mean 'Europe/Berlin'?)"),
    ("[course]\ntimezone = 'CEST'", "course.timezone 'CEST' is not an IANA time zone name"),
    ("[course]\ntimezone = 1", "course.timezone must be a string, not an integer"),
    ("[assignments.03_qvk]\ndue = 2026-12-10T23:59:00",
     "assignments.03_qvk '03_qvk' is not an exercise of the course (did you mean '03_qkv'?)"),
    ("[assignments.03_qkv]\ndue = '2026-12-10 23:59'",
     "assignments.03_qkv.due must be a TOML date and time without quotes, e.g. due = 2026-12-10T23:59:00"),
    ("[assignments.03_qkv]\ndue = 2026-12-10",
     "assignments.03_qkv.due is a date without a time: write the time too, e.g. 2026-12-10T23:59:00"),
    ("[assignments.03_qkv]\ndeu = 2026-12-10T23:59:00",
     "assignments.03_qkv.deu is not a setting we know (did you mean 'due'?)"),
    ("[assignments.03_qkv]\nlate = { penalty = 10 }",
     "assignments.03_qkv.late needs a policy (none, zero, per_hour, per_day)"),
    ("[course]\ntimezone = 'Europe/Berlin'\n[assignments.03_qkv]\ndue = 2026-03-29T02:30:00",
     "assignments.03_qkv.due 2026-03-29T02:30:00 does not exist in Europe/Berlin (the clocks skip it when "
     "daylight saving time starts): give another time, or an offset"),
    ("assignments = 3", "assignments must be a table of exercises ([assignments.03_qkv]), not an integer"),
    ("[lms]\ncanvas_id_column = 'Login'",
     "lms.canvas_id_column must be one of 'ID', 'SIS User ID', 'SIS Login ID', not 'Login'"),
    ("[lms]\nmoodle_id_field = 'mail'",
     "lms.moodle_id_field must be one of 'username', 'email', 'idnumber', not 'mail'"),
    ("[lms]\nroster = 'missing.csv'", "lms.roster cannot read {dir}/missing.csv (No such file or directory)"),
    ("[gradescope]\nvisibility = 'after_deadline'", "gradescope.visibility must be one of 'visible', 'after_due_date', "
     "'after_published', 'hidden', not 'after_deadline'"),
    ("[gradescope]\nvisibilty = 'hidden'",
     "gradescope.visibilty is not a setting we know (did you mean 'visibility'?)"),
    ("gradescope = 'hidden'", "gradescope must be a table (visibility), not a string"),
    ("[assignments.03_qkv]\ngradescope_visibility = true",
     "assignments.03_qkv.gradescope_visibility must be one of 'visible', 'after_due_date', 'after_published', "
     "'hidden', not a boolean"),
    ("[assignments.03_qkv]\ngradescope_checks = { softmx = 'visible' }",
     "assignments.03_qkv.gradescope_checks.softmx is not a part or check of 03_qkv (did you mean 'softmax'?)"),
    ("[assignments.03_qkv]\ngradescope_checks = { nothing_like_it = 'visible' }",
     "assignments.03_qkv.gradescope_checks.nothing_like_it is not a part or check of 03_qkv (its parts: softmax, "
     "attention_numpy, scaled_dot_product_attention, padding_mask, causal_mask"),
    ("[assignments.03_qkv]\ngradescope_checks = { test_softmax_axis = 'later' }",
     "assignments.03_qkv.gradescope_checks.test_softmax_axis must be one of 'visible', 'after_due_date', "
     "'after_published', 'hidden', not 'later'"),
    ("[assignments.03_qkv]\ngradescope_checks = ['softmax']",
     "assignments.03_qkv.gradescope_checks must be a table of parts or checks and their visibility, e.g. "
     "{{ softmax = \"visible\" }}, not an array"),
]


@pytest.mark.parametrize("text, sentence", BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_file_is_one_sentence(tmp_path, text, sentence):
    """Is each mistake a ConfigError (a UsageError: exit 2) naming the file, the setting and the problem?"""
    path = tmp_path / "course.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert isinstance(info.value, UsageError)
    message = str(info.value)
    expected = f"{path}: {sentence.format(dir=tmp_path)}"
    assert message.startswith(expected) and "\n" not in message


ROSTERS = [
    ("name\nAlice\n", "needs a header row with a student_id column (student_id,name,...)"),
    ("student_id,name\n../etc,Eve\n", "line 2: ../etc is not a student id"),
    ("student_id,name\nalice,A\nAlice,B\n", "line 3: student Alice is listed twice"),
    ("student_id,name\nalice,A,extra\n", "line 2 has more cells than the header"),
]


@pytest.mark.parametrize("text, problem", ROSTERS, ids=[r[1][:30] for r in ROSTERS])
def test_a_bad_roster_is_one_sentence(tmp_path, text, problem):
    (tmp_path / "r.csv").write_text(text, encoding="utf-8")
    (tmp_path / "course.toml").write_text('[lms]\nroster = "r.csv"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "course.toml")
    assert str(info.value).startswith(f"{tmp_path / 'course.toml'}: lms.roster {tmp_path / 'r.csv'}")
    assert str(info.value).endswith(problem) or problem in str(info.value)


def test_huge_or_binary_roster_is_refused(tmp_path):
    (tmp_path / "r.csv").write_bytes(b"student_id\n" + b"\xff" * 10)
    (tmp_path / "course.toml").write_text('[lms]\nroster = "r.csv"\n')
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(tmp_path / "course.toml")
    with open(tmp_path / "r.csv", "wb") as f:
        f.truncate(9 << 20)
    with pytest.raises(ConfigError, match="is over 8 MiB"):
        load_config(tmp_path / "course.toml")


def test_grade_with_a_bad_config_grades_nothing(tmp_path):
    """Does `grade --config` with a broken file exit 2 with its one line, before any gradebook is made?"""
    subs = tmp_path / "submitted"
    subs.mkdir()
    (subs / "alice.ipynb").write_text("{}")
    bad = tmp_path / "course.toml"
    bad.write_text("[late]\npolicy = 'weekly'\n")
    out = tmp_path / "out"
    proc = run_cli("grade", "--assignment", "03_qkv", str(subs), "--out", str(out), "--config", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"{bad}: late.policy must be one of 'none', 'zero', 'per_hour', 'per_day', not 'weekly'")
    assert "Traceback" not in proc.stderr and not (out / "gradebook.db").exists()
