"""Every chapter's exercise graded end to end, driven by its table in tests/chapters/.

One sandboxed `grade` run per chapter over the reference, the untouched notebook and the
table's typical mistakes; each test then asserts, for every chapter, what a learner and an
instructor would see: scores, the checks lost and their hints, the gradebook, the CSV and
the feedback page.
"""

from __future__ import annotations

import csv
import html

import pytest
from nbgrader.api import Gradebook

from autograder.core.assignments import get_assignment
from autograder.grading.grader import Grader
from chapters import tables

TABLES = tables()
KEYS = list(TABLES)


def _failed(sub):
    return {c["name"] for c in sub["checks"] if not c["passed"]}


def _hints(sub):
    return {c["name"]: c["hint"] for c in sub["checks"] if not c["passed"]}


@pytest.fixture(params=KEYS)
def chapter(request, graded_chapter):
    key = request.param
    grader = Grader(get_assignment(key))
    return key, TABLES[key], grader, *graded_chapter(key)


def test_every_chapter_has_a_table():
    """Does every published exercise have a harness table with at least four typical mistakes?"""
    from autograder.core.assignments import all_assignments

    assert sorted(a.key for a in all_assignments()) == KEYS
    for key, table in TABLES.items():
        assert len([m for m in table.MISTAKES.values() if m.edits]) >= 4, key


def test_every_submission_is_graded_with_its_score(chapter):
    """Does every notebook of the batch get a grade (no grader error), the score its table says?"""
    key, table, grader, _, _, summary, by = chapter
    expected = {"ref": grader.max_score, "stub": 0.0} | {n: float(m.score) for n, m in table.MISTAKES.items()}
    assert set(by) == set(expected)
    assert {s: (by[s]["status"], by[s]["score"]) for s in by} == {s: ("graded", v) for s, v in expected.items()}
    assert all(by[s]["max_score"] == grader.max_score and isinstance(by[s]["seed"], int) for s in by)


def test_reference_passes_every_check_in_every_part(chapter):
    """Does the reference pass every hidden check, each part at the points the notebook announces?"""
    key, table, grader, _, _, summary, by = chapter
    ref = by["ref"]
    assert len(ref["checks"]) == len(grader.checks) and all(c["passed"] for c in ref["checks"])
    assert ref["parts"] == {p: {"score": n, "max_score": n} for p, n in grader.parts.items()}


def test_untouched_notebook_scores_zero_saying_not_implemented(chapter):
    """Does the untouched notebook score 0, each check saying what is not implemented yet?"""
    key, table, grader, _, _, summary, by = chapter
    stub = by["stub"]
    assert stub["score"] == 0 and len(stub["checks"]) == len(grader.checks)
    assert all("not implemented yet" in c["hint"] for c in stub["checks"]), _hints(stub)


def test_typical_mistakes_lose_exactly_their_checks_with_their_hints(chapter):
    """Does each typical mistake fail exactly the checks that see it, each with the hint that names it?"""
    key, table, grader, _, _, summary, by = chapter
    for name, m in table.MISTAKES.items():
        sub = by[name]
        if m.failed is not None:
            assert _failed(sub) == set(m.failed), (key, name, _failed(sub) ^ set(m.failed))
        hints = _hints(sub)
        for check, words in m.hints.items():
            assert words in hints.get(check, ""), (key, name, check, hints.get(check))
        if m.one_hint:
            assert len(set(hints.values())) == 1, (key, name, hints)
        for hint in hints.values():
            assert "tensor(" not in hint and "test_" not in hint and "Traceback" not in hint, (key, name, hint)


def test_gradebook_and_csv_hold_every_row(chapter):
    """Do the gradebook and the CSV hold one row per learner, with the total and every part's score?"""
    key, table, grader, _, _, summary, by = chapter
    with Gradebook(summary["gradebook"]) as gb:
        subs = gb.assignment_submissions(key)
        assert sorted(s.student.id for s in subs) == sorted(by)
        for s in subs:
            student = s.student.id
            nb = gb.find_submission_notebook(key, key, student)
            assert nb.score == by[student]["score"] and nb.max_score == grader.max_score
            for part in grader.parts:
                grade = gb.find_grade(f"test_{part}", key, key, student)
                assert grade.score == by[student]["parts"][part]["score"], (student, part)
    with open(summary["csv"], newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: float(r["score"]) for s, r in rows.items()} == {s: by[s]["score"] for s in by}
    assert all(r["status"] == "graded" and float(r["max_score"]) == grader.max_score for r in rows.values())


def test_feedback_shows_hints_never_hidden_tests(chapter):
    """Does each learner's feedback page show the score and hints, but no hidden test code or expected values?"""
    key, table, grader, _, out, summary, by = chapter
    hidden = get_assignment(key).hidden_tests.read_text()
    code = [ln.strip() for ln in hidden.splitlines()
            if ln.strip().startswith(("expected =", "q, k, v =", "mask =", "hyps =")) and len(ln.strip()) > 12]
    for student, sub in by.items():
        page = html.unescape((out / "feedback" / student / key / f"{key}.html").read_text())
        assert f"{sub['score']:g} / {grader.max_score:g}" in page and str(sub["seed"]) in page
        assert "def test_" not in page and "reference." not in page and "tensor(" not in page
        assert not [ln for ln in code if ln in page]
        for hint in _hints(sub).values():
            assert hint in page
