"""Exercise 01_seq2seq's hidden tests grade correctly: one grading run, through the command line,
over the reference, the untouched notebook and typical mistakes made by editing the reference."""

from __future__ import annotations

import csv

import pytest
from nbgrader.api import Gradebook

from conftest import learner_notebook, mistake, reference_notebook, run_json, write

KEY = "01_seq2seq"
MAX = 20
ENCODER = {"test_encoder_matches_reference", "test_encoder_final_is_last_state", "test_encoder_gradients"}


def _mistake(*pairs):
    """The reference with each (old, new) text edit applied."""
    return mistake(KEY, *pairs)


BATCH = {
    # name: (notebook, score, failed checks, (check, words its hint must contain) or None)
    "ref": (lambda: reference_notebook(KEY), MAX, set(), None),
    "stub": (lambda: learner_notebook(KEY), 0, None, None),
    # Teacher forcing feeds the token it should predict.
    "tf_current": (_mistake(("y_prev = tgt[:, t - 1] if teacher", "y_prev = tgt[:, t] if teacher")), 18,
                   {"test_seq2seq_teacher_forcing_matches_reference", "test_seq2seq_mixed_ratio_decides_per_step"},
                   ("test_seq2seq_teacher_forcing_matches_reference", "CURRENT target token tgt[:, t]")),
    # Greedy decoding keeps writing argmax tokens after a row's eos.
    "greedy_no_pad": (_mistake(("y = logits.argmax(dim=-1).masked_fill(finished, pad)  # (B,)",
                                "y = logits.argmax(dim=-1)  # (B,)")), 17,
                      {"test_greedy_matches_reference", "test_greedy_pads_after_eos",
                       "test_greedy_honours_sos_eos_pad"},
                      ("test_greedy_pads_after_eos", "must hold `pad`")),
    # Beam search ranks by summed raw logits instead of log-probabilities.
    "beam_logits": (_mistake(("total = scores.unsqueeze(1) + F.log_softmax(logits, dim=-1)",
                              "total = scores.unsqueeze(1) + logits")), 16,
                    {"test_beam_matches_exhaustive_search", "test_beam_scores_are_log_probabilities",
                     "test_beam_matches_reference"},
                    ("test_beam_scores_are_log_probabilities", "raw logits")),
    # The context is the state after the first source token; the later parts, graded with the
    # learner's own modules, lose nothing for it.
    "enc_first": (_mistake(("return outputs, h_n[-1]  # (B, T, H), (B, H)", "return outputs, outputs[:, 0]")), 17,
                  ENCODER, ("test_encoder_matches_reference", "after the FIRST source token")),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading run over a folder of learners' notebooks."""
    base = tmp_path_factory.mktemp("grading01")
    for student, (make, *_) in BATCH.items():
        write(make(), base / "submitted" / f"{student}.ipynb")
    out = base / "out"
    summary = run_json("grade", "--assignment", KEY, str(base / "submitted"), "--out", str(out))
    return out, summary, {s["student"]: s for s in summary["submissions"]}


def _failed(sub):
    return {c["name"] for c in sub["checks"] if not c["passed"]}


def test_every_submission_gets_its_expected_score(graded):
    """Does each notebook score what its answers deserve, all graded, out of 20?"""
    _, _, by = graded
    assert set(by) == set(BATCH)
    assert {s: by[s]["score"] for s in BATCH} == {s: float(v[1]) for s, v in BATCH.items()}
    assert all(by[s]["status"] == "graded" and by[s]["max_score"] == MAX for s in BATCH)


def test_reference_passes_every_check(graded):
    """Does the reference pass all 19 hidden checks, each part at full marks?"""
    ref = graded[2]["ref"]
    assert len(ref["checks"]) == 19 and all(c["passed"] for c in ref["checks"])
    assert {p: s["score"] for p, s in ref["parts"].items()} == {
        "encoder": 3, "decoder": 3, "seq2seq_forward": 4, "greedy_decode": 4, "beam_search": 6}


def test_untouched_notebook_scores_zero_saying_not_implemented(graded):
    """Does the untouched notebook score 0, each check naming what is not implemented yet?"""
    stub = graded[2]["stub"]
    assert stub["score"] == 0 and len(stub["checks"]) == 19
    assert all("not implemented yet" in c["hint"] for c in stub["checks"])
    hints = {c["name"]: c["hint"] for c in stub["checks"]}
    assert hints["test_seq2seq_free_running"].startswith("`seq2seq_forward` is not implemented yet")
    assert hints["test_beam_matches_reference"].startswith("`beam_search` is not implemented yet")


@pytest.mark.parametrize("student", [s for s, v in BATCH.items() if v[3] is not None])
def test_typical_mistake_loses_exactly_its_checks_with_its_hint(graded, student):
    """Does each typical mistake fail exactly the checks that see it, with the hint that names it?"""
    sub = graded[2][student]
    _, _, failed, (check, words) = BATCH[student]
    assert _failed(sub) == failed
    hints = {c["name"]: c["hint"] for c in sub["checks"] if not c["passed"]}
    assert words in hints[check]
    assert len(set(hints.values())) == 1, hints  # one mistake, one explanation


def test_gradebook_and_csv_hold_every_row(graded):
    """Do the gradebook and the CSV hold one row per learner, with the total and part scores?"""
    _, summary, by = graded
    with Gradebook(summary["gradebook"]) as gb:
        subs = gb.assignment_submissions(KEY)
        assert sorted(s.student.id for s in subs) == sorted(BATCH)
        for s in subs:
            assert gb.find_submission_notebook(KEY, KEY, s.student.id).score == by[s.student.id]["score"]
            for part in ("encoder", "beam_search"):
                grade = gb.find_grade(f"test_{part}", KEY, KEY, s.student.id)
                assert grade.score == by[s.student.id]["parts"][part]["score"]
    with open(summary["csv"], newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: float(r["score"]) for s, r in rows.items()} == {s: float(v[1]) for s, v in BATCH.items()}
    assert all(r["max_score"] == f"{MAX:.1f}" and r["status"] == "graded" for r in rows.values())


def test_feedback_names_the_mistake_and_hides_the_tests(graded, root):
    """Does the feedback page show the hint, but no hidden test code or expected values?"""
    out, _, _ = graded
    page = (out / "feedback" / "beam_logits" / f"{KEY}.html").read_text()
    assert "raw logits" in page and f"16 / {MAX}" in page
    hidden = (root / "autograder" / "hidden" / f"test_{KEY}.py").read_text()
    assert "def test_" not in page and "_beam_compete" not in page and "tensor(" not in page
    code = [ln.strip() for ln in hidden.splitlines() if ln.strip().startswith(("expected =", "hyps ="))]
    assert code and not [ln for ln in code if ln in page]
