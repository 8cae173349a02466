"""Fast checks (no grading) of what learners can put into the instructor's outputs: the escaping
per medium (terminal and log, HTML, CSV, JSON), the caps, and the student id rule. The rule of the
submissions folder is tested in test_submissions_folder.py."""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import re

import pytest

from autograder.core.limits import DEFAULT
from autograder.core.logs import SafeFormatter
from autograder.core.text import csv_cell, safe, student_id_problem, visible
from autograder.course.gradebook import write_csv
from autograder.grading.feedback import bounded, feedback_html, format_text
from autograder.grading.grader import CheckResult, Result

KEY = "03_qkv"
ESC = "\x1b"
HOSTILE = (f"{ESC}[1A{ESC}[2K\rmallory: 23 / 23\n{ESC}]0;title\x07{ESC}]52;c;Y3VybAo=\x07"
           "\x9b31m\x7f\u202egnp.exe\u2066\u2069\u200f\u2028\x00<script>alert(1)</script>")
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def unsafe_chars(text: str) -> list[str]:
    """Characters a terminal obeys instead of showing (newline and tab allowed), and bidi controls."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c in BIDI]


# --- escaping ---------------------------------------------------------------------------------

def test_visible_escapes_every_control_bidi_and_separator_character():
    out = visible(HOSTILE)
    assert not unsafe_chars(out) and "\n" not in out and "\r" not in out
    for shown in ("\\x1b[1A", "\\x0d", "\\x0a", "\\x07", "\\x9b", "\\x7f", "\\u202e", "\\u2066", "\\u2028", "\\x00"):
        assert shown in out, shown
    assert visible("plain text: a/b, é, 日本, 🙂") == "plain text: a/b, é, 日本, 🙂"
    assert visible("two\nlines\tand\x1b", keep="\n") == "two\nlines\\x09and\\x1b"
    assert visible("bad\udcff\udcfe") == "bad\\xff\\xfe"  # a file name that is not UTF-8


def test_safe_caps_length_and_counts_the_rest():
    assert safe("short", 10) == "short"
    out = safe("A" * 5_000_000, 300)
    assert out.startswith("A" * 300) and "4,999,700 more characters" in out and len(out) < 340
    out = safe(ESC * 1000, 100)  # escapes count toward the cap
    assert len(out) < 140 and "more characters" in out and not unsafe_chars(out)


def test_csv_cells_never_start_a_formula_and_numbers_stay_numbers():
    for text in ("=HYPERLINK(\"http://x\")", "+1", "-2+3+cmd|' /C calc'!A0", "@SUM(1)", "\t=1", "\r=1", "＝1"):
        cell = csv_cell(text)
        assert cell.startswith("'") or cell.startswith("\\x"), cell
    assert csv_cell(-3.5) == -3.5 and csv_cell(23.0) == 23.0 and csv_cell(0) == 0
    assert csv_cell("alice") == "alice" and csv_cell("forged: =1") == "forged: =1"
    assert csv_cell("a\nb") == "a\\x0ab"


def test_csv_file_is_one_line_per_row_without_formulas(tmp_path):
    row = {"student_id": "alice", "assignment": KEY, "score": 0.0, "max_score": 23.0, "status": "error",
           "reason": "=HYPERLINK(\"http://evil\")\n" + HOSTILE + "x" * 10_000, "test_softmax": 0.0}
    path = tmp_path / "g.csv"
    write_csv(path, [row, dict(row, student_id="bob", reason="-1+1", score=16.0)])
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 3 and not unsafe_chars(text.replace("\r\n", "\n"))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["reason"][0] for r in rows] == ["'", "'"]
    assert float(rows[1]["score"]) == 16.0 and len(rows[0]["reason"]) < DEFAULT.error_chars + 50


def _hostile_result(**kw) -> Result:
    checks = [CheckResult(name=f"test_{i}", part="softmax", title="Does it work?", points=0.0, max_points=1.0,
                          passed=False, hint=f"`softmax` raised ValueError: {HOSTILE}" + "🙂\"" * 1_000_000)
              for i in range(30)]
    return Result(assignment=KEY, notebook="/subs/x" + HOSTILE * 100, student="alice", status="graded",
                  error=HOSTILE * 10_000, max_score=23.0, parts={"softmax": {"score": 0.0, "max_score": 23.0}},
                  checks=checks, notes=[HOSTILE * 100] * 50_000, seed=1, **kw)


def test_a_hostile_result_is_bounded_everywhere():
    result = _hostile_result()
    safe_result = bounded(result)
    as_json = json.dumps(safe_result.to_dict(), indent=2)
    page = feedback_html(result, flags=[HOSTILE * 1000] * 100)
    assert len(as_json.encode()) < DEFAULT.result_bytes and len(page.encode()) < DEFAULT.result_bytes
    assert len(safe_result.notes) == DEFAULT.notes + 1 and safe_result.notes[-1].startswith("… 49,980 more")
    assert not unsafe_chars(as_json) and not unsafe_chars(page.replace("\n", ""))
    assert "<script>" not in page and "&lt;script&gt;" in page
    text = format_text(result)
    assert not unsafe_chars(text) and len(text) < 100_000
    # an honest result is unchanged
    honest = Result(assignment=KEY, notebook="subs/alice.ipynb", student="alice", notes=["cell 7, line 2: NameError"],
                    checks=[CheckResult("test_a", "softmax", "Title?", 0.0, 1.0, False, "A hint: use dim=-1.")])
    assert bounded(honest) == honest


def test_feedback_escapes_markup_in_every_field():
    r = Result(assignment=KEY, notebook="x", student="alice", status="error", error="<img src=x onerror=alert(1)>",
               notes=['<a href="javascript:alert(1)">'], seed=None,
               checks=[CheckResult("t", "p", "<b>title</b>", 0.0, 1.0, False, "<script>x</script>")],
               parts={"p": {"score": 0.0, "max_score": 1.0}})
    page = feedback_html(r, flags=["<iframe src=//evil>"])
    for tag in ("<img", "<script>x", "<a href", "<iframe", "<b>title"):
        assert tag not in page, tag
    assert "seeded with" not in page  # not graded: no seed
    assert html.escape("<iframe src=//evil>") in page


def test_a_hint_many_checks_give_is_said_once_under_them():
    """One mistake that fails several checks of a part (a missing 1/sqrt(d_k) fails all 13 of attention's)
    is said once: in the report under the checks it covers, on the feedback page and in formgrader's notebook
    under the first, the others pointing to it; another hint of the part keeps its own line."""
    from autograder.course.nbgrader_course import _checks_text

    same, other = "The scores are not divided by sqrt(d_k).", "The mask is inverted."
    checks = [CheckResult(f"test_{i}", "sdpa", f"Question {i}?", 0.0, 1.0, False, h)
              for i, h in enumerate([same, same, other, same])]
    checks.insert(1, CheckResult("test_ok", "sdpa", "Passed one?", 1.0, 1.0, True, ""))
    r = Result(assignment=KEY, notebook="x.ipynb", student="alice", status="graded", seed=3, checks=checks,
               parts={"sdpa": {"score": 1.0, "max_score": 5.0}})
    text = format_text(r)
    assert text.count(same) == 1 and text.count(other) == 1
    lines = text.splitlines()
    at = lines.index(f"        hint (the 3 checks above): {same}")
    assert [ln.strip() for ln in lines[at - 3:at]] == [f"x Question {i}? (0 / 1)" for i in (0, 1, 3)]
    assert lines[at + 2] == f"        hint: {other}" and lines[at + 1].strip() == "x Question 2? (0 / 1)"
    page = html.unescape(feedback_html(r))
    assert page.count(same) == 1 and page.count(other) == 1 and page.count("The same hint as “Question 0?”") == 2
    notebook_text = _checks_text("sdpa", r, DEFAULT)
    assert notebook_text.count(same) == 1 and notebook_text.count('the same as for "Question 0?" above') == 2


def test_log_records_have_no_control_characters_and_cannot_fake_a_record():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SafeFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_outputs")
    logger.addHandler(handler)
    try:
        logger.warning("rejected: %s", "a\nINFO mallory: 23 / 23" + HOSTILE)
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert not unsafe_chars(text)
    assert all(line.startswith(("WARNING", "    ")) for line in text.splitlines())


# --- student ids ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["alice", "a_b", "Bob.Smith", "s1234567", "alice@uni.example", "x-y", "A" * 100,
                                  "03_qkv_alice"])
def test_student_ids_that_are_accepted(name):
    assert student_id_problem(name, KEY) == ""


@pytest.mark.parametrize("name", ["", ".", "..", "...", "a..b", ".hidden", "-rf", "=cmd", "@x", "_x", "a b", "a/b",
                                  "a\\b", "alice\n", "al\x1bice", "ali\u202ece", "élise", "A" * 101, "03_qkv",
                                  "03_QKV", "a\x00b"])
def test_student_ids_that_are_refused(name):
    problem = student_id_problem(name, KEY)
    assert problem and not unsafe_chars(problem)


def test_flag_lists_keep_their_own_count():
    from autograder.grading.feedback import bounded_flags

    flags = [f"entry {i}" for i in range(DEFAULT.flags)] + ["… 2,995 more entries of its folder not graded"]
    assert bounded_flags(flags) == flags
    many = bounded_flags([HOSTILE] * 100)
    assert len(many) == DEFAULT.flags + 1 and many[-1] == "… 95 more reasons" and not unsafe_chars("".join(many))


@pytest.mark.parametrize("text", ["~~~", "a ~~~~~ b\n~~~~~~~~\n", "~" * 100_000, "no fence at all", ""])
def test_learner_markdown_is_fenced_past_its_longest_run_of_tildes(text):
    """Is a learner's markdown cell shown as literal text inside a fence one tilde longer than any run of
    tildes in it (found in one pass), so the text can never close the fence early?"""
    from autograder.course.nbgrader_course import inert_markdown

    shown = inert_markdown(text)
    fence = shown.rsplit("\n", 1)[1]
    runs = [len(run) for run in re.findall("~+", text)]
    assert set(fence) == {"~"} and len(fence) == max(3, max(runs, default=0) + 1)
    assert shown.endswith(f"\n{fence}\n{text}\n{fence}")
