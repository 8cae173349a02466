"""Exercise 02_attention graded end to end: the hidden tests give the reference full marks, the
untouched notebook nothing, and each typical mistake exactly the checks it should lose,
with a hint that names it."""

from __future__ import annotations

import csv

import pytest
from nbgrader.api import Gradebook

from conftest import learner_notebook, mistake, run_json, write

KEY = "02_attention"
MAX = 22
PARTS = {"dot_scores": 2, "general_score": 2, "additive_score": 3, "attention_context": 4,
         "attn_decoder": 5, "predict_position": 2, "local_attention_weights": 4}
DECODER_FORWARD = {"test_attn_decoder_matches_reference", "test_attn_decoder_mask",
                   "test_attn_decoder_gradients", "test_attn_decoder_dtypes_and_devices"}


def _mistake(*pairs):
    """The reference with each (old, new) text edit applied."""
    return mistake(KEY, *pairs)


# student -> (notebook, score, failed checks, {check: words its hint must contain})
BATCH = {
    "ref": (_mistake(), MAX, set(), {}),
    "stub": (lambda: learner_notebook(KEY), 0, None, {}),
    "no_scale": (
        _mistake(("return dot_score(query, keys) / math.sqrt(query.size(-1))", "return dot_score(query, keys)")),
        21, {"test_scaled_dot_score_matches_reference"},
        {"test_scaled_dot_score_matches_reference": "not divided by sqrt(d)"}),
    "general_w_transposed": (
        _mistake(("projected = query @ W  #", "projected = query @ W.T  #")),
        16, {"test_general_score_matches_reference", "test_general_score_gradients"} | DECODER_FORWARD,
        {"test_general_score_matches_reference": "W is used transposed",
         "test_attn_decoder_matches_reference": "your general_score is wrong"}),
    "mask_filled_with_zero": (
        _mistake(('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores.masked_fill(~mask, 0.0)")),
        16, {"test_attention_context_weights_sum_to_one", "test_attention_context_mask",
             "test_attention_context_padding_does_not_leak", "test_attn_decoder_mask",
             "test_attn_decoder_padding_does_not_leak", "test_attn_decoder_gradients"},
        {"test_attention_context_mask": "set to 0 instead of -inf",
         "test_attention_context_padding_does_not_leak": "Padding leaks",
         "test_attn_decoder_mask": "your attention_context is wrong"}),
    "decoder_w_a_of_hidden": (
        _mistake(("scores = general_score(hidden, enc_outputs, self.W_a.weight)",
                  "scores = dot_score(self.W_a(hidden), enc_outputs)")),
        18, DECODER_FORWARD,
        {"test_attn_decoder_matches_reference": "W_a transposed",
         "test_attn_decoder_dtypes_and_devices": "W_a transposed"}),
    "sigma_is_d": (
        _mistake(("sigma = D / 2", "sigma = D")),
        19, {"test_local_attention_matches_reference", "test_local_attention_mask",
             "test_local_attention_gradients"},
        {"test_local_attention_matches_reference": "sigma = D: it must be sigma = D / 2",
         "test_local_attention_mask": "sigma = D: it must be sigma = D / 2"}),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading run (sandboxed, as the instructor runs it) over a folder of submissions."""
    base = tmp_path_factory.mktemp("grading02")
    for student, (make, *_) in BATCH.items():
        write(make(), base / "submitted" / f"{student}.ipynb")
    summary = run_json("grade", "--assignment", KEY, str(base / "submitted"), "--out", str(base / "out"))
    return summary, {s["student"]: s for s in summary["submissions"]}


def _failed(sub):
    return {c["name"] for c in sub["checks"] if not c["passed"]}


def test_scores_and_failed_checks(graded):
    """Does each submission get exactly its expected score, losing exactly the expected checks?"""
    _, by = graded
    assert set(by) == set(BATCH)
    for student, (_, score, failed, _) in BATCH.items():
        sub = by[student]
        assert sub["status"] == "graded" and sub["max_score"] == MAX, (student, sub.get("error"))
        assert sub["score"] == score, (student, _failed(sub))
        if failed is not None:
            assert _failed(sub) == failed, student


def test_reference_scores_full_marks_in_every_part(graded):
    """Does the reference pass every hidden check, with each part's points as the notebook announces?"""
    ref = graded[1]["ref"]
    assert len(ref["checks"]) == 22 and all(c["passed"] for c in ref["checks"])
    assert ref["parts"] == {p: {"score": float(n), "max_score": float(n)} for p, n in PARTS.items()}


def test_untouched_notebook_scores_zero_saying_not_implemented(graded):
    """Does the untouched notebook score 0, every check saying what is not implemented yet?"""
    stub = graded[1]["stub"]
    assert stub["score"] == 0 and len(stub["checks"]) == len(graded[1]["ref"]["checks"])
    assert all("not implemented yet" in c["hint"] for c in stub["checks"])


def test_hints_name_the_mistake(graded):
    """Does each typical mistake get the hint that names it, and never one that leaks test internals?"""
    _, by = graded
    for student, (_, _, _, hints) in BATCH.items():
        got = {c["name"]: c["hint"] for c in by[student]["checks"] if not c["passed"]}
        for check, words in hints.items():
            assert words in got[check], (student, check, got[check])
        for hint in got.values():
            assert "tensor(" not in hint and "test_" not in hint and "_variants" not in hint


def test_gradebook_and_csv_hold_the_scores(graded):
    """Does the gradebook hold each learner's score and part scores, and the CSV the same rows?"""
    summary, by = graded
    with Gradebook(summary["gradebook"]) as gb:
        subs = gb.assignment_submissions(KEY)
        assert sorted(s.student.id for s in subs) == sorted(BATCH)
        for s in subs:
            student = s.student.id
            nb = gb.find_submission_notebook(KEY, KEY, student)
            assert nb.score == by[student]["score"] and nb.max_score == MAX
            for part in PARTS:
                grade = gb.find_grade(f"test_{part}", KEY, KEY, student)
                assert grade.score == by[student]["parts"][part]["score"], (student, part)
    with open(summary["csv"], newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: float(r["score"]) for s, r in rows.items()} == {s: float(v[1]) for s, v in BATCH.items()}
    assert all(r["max_score"] == "22.0" and r["status"] == "graded" for r in rows.values())
