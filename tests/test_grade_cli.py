"""The grader end to end, through its command line, as an instructor and a learner use it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from conftest import add_cell, edit, learner_notebook, reference_notebook, run_cli, run_json, write

KEY = "03_qkv"
SDPA_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)"
ALL_SDPA = {
    "test_sdpa_matches_reference_3d", "test_sdpa_heads_and_dtypes", "test_sdpa_matches_pytorch",
    "test_sdpa_rows_sum_to_one", "test_sdpa_masked_weights_are_zero", "test_sdpa_fully_masked_row",
    "test_sdpa_large_scores_stay_finite", "test_sdpa_causal_does_not_look_ahead",
    "test_sdpa_gradients_match", "test_sdpa_dropout",
}


def _no_scale():
    return edit(reference_notebook(KEY), SDPA_SCORES, "scores = q @ k.transpose(-2, -1)")


def _wrong_axis():
    return edit(reference_notebook(KEY), "torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)")


def _inverted_mask():
    nb = edit(reference_notebook(KEY), "scores.masked_fill(~mask,", "scores.masked_fill(mask,")
    return edit(nb, "weights.masked_fill(~mask, 0.0)", "weights.masked_fill(mask, 0.0)")


def _allclose_cheat():
    # The no-scaling mistake, plus every comparison the learner can reach patched to say "equal".
    nb = _no_scale()
    return add_cell(nb, "import numpy, torch\n"
                        "numpy.allclose = lambda *a, **k: True\n"
                        "torch.allclose = lambda *a, **k: True\n"
                        "torch.equal = lambda *a, **k: True\n"
                        "torch.testing.assert_close = lambda *a, **k: None\n", after_grade_id="setup")


def _os_exit():
    return add_cell(learner_notebook(KEY), "import os\nstatus = os._exit(0)\n")


def _helper_in_added_cell():
    nb = edit(reference_notebook(KEY), SDPA_SCORES, "scores = my_scores(q, k)  # a helper of my own")
    return add_cell(nb, "def my_scores(q, k):\n    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n",
                    after_grade_id="setup")


BATCH = {
    "ref": (reference_notebook, 23),
    "stub": (lambda: learner_notebook(KEY), 0),
    "no_scale": (_no_scale, 16),
    "wrong_axis": (_wrong_axis, 12),
    "inverted_mask": (_inverted_mask, 16),
    "allclose_cheat": (_allclose_cheat, 16),
    "os_exit": (_os_exit, 0),
    "helper": (_helper_in_added_cell, 23),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading run over a folder of eight learners' notebooks."""
    base = tmp_path_factory.mktemp("grading")
    subs = base / "submitted"
    for student, (make, _) in BATCH.items():
        nb = make() if make is not reference_notebook else reference_notebook(KEY)
        write(nb, subs / f"{student}.ipynb")
    out = base / "out"
    summary = run_json("grade", "--assignment", KEY, str(subs), "--out", str(out))
    by_student = {s["student"]: s for s in summary["submissions"]}
    return base, out, summary, by_student


def _failed(sub):
    return {c["name"] for c in sub["checks"] if not c["passed"]}


def _hints(sub):
    return {c["name"]: c["hint"] for c in sub["checks"] if not c["passed"]}


def test_every_submission_gets_its_expected_score(graded):
    """Does each notebook in the batch score what its answers deserve?"""
    _, _, summary, by = graded
    assert set(by) == set(BATCH)
    assert {s: by[s]["score"] for s in BATCH} == {s: float(pts) for s, (_, pts) in BATCH.items()}
    assert all(by[s]["max_score"] == 23 for s in BATCH)
    assert all(by[s]["status"] == "graded" for s in BATCH)


def test_reference_scores_full_marks(graded):
    """Does the reference solution pass every hidden check?"""
    ref = graded[3]["ref"]
    assert ref["checks"] and all(c["passed"] for c in ref["checks"])
    assert ref["parts"]["scaled_dot_product_attention"] == {"score": 12.0, "max_score": 12.0}


def test_untouched_stub_scores_zero_with_not_implemented_hints(graded):
    """Does the untouched notebook score 0, each check saying what is not implemented?"""
    stub = graded[3]["stub"]
    assert stub["score"] == 0 and len(stub["checks"]) == len(graded[3]["ref"]["checks"])
    assert all("not implemented yet" in c["hint"] for c in stub["checks"])


def test_missing_scale_is_named(graded):
    """Does a submission without the 1/sqrt(d_k) lose exactly the checks that see it, with that hint?"""
    sub = graded[3]["no_scale"]
    assert _failed(sub) == {"test_sdpa_matches_reference_3d", "test_sdpa_heads_and_dtypes",
                            "test_sdpa_matches_pytorch", "test_sdpa_masked_weights_are_zero",
                            "test_sdpa_gradients_match", "test_sdpa_dropout"}
    assert "not divided by sqrt(d_k)" in _hints(sub)["test_sdpa_matches_reference_3d"]
    assert "not divided by sqrt(d_k)" in _hints(sub)["test_sdpa_heads_and_dtypes"]


def test_wrong_softmax_axis_is_named(graded):
    """Does a softmax over the queries instead of the keys get the wrong-axis hint?"""
    sub = graded[3]["wrong_axis"]
    assert _failed(sub) == ALL_SDPA - {"test_sdpa_causal_does_not_look_ahead"}
    assert "wrong axis" in _hints(sub)["test_sdpa_matches_reference_3d"]
    assert "dim=-1" in _hints(sub)["test_sdpa_rows_sum_to_one"]


def test_inverted_mask_is_named(graded):
    """Does a mask read as True = blocked get the inverted-mask hint?"""
    sub = graded[3]["inverted_mask"]
    assert _failed(sub) == {"test_sdpa_matches_pytorch", "test_sdpa_masked_weights_are_zero",
                            "test_sdpa_fully_masked_row", "test_sdpa_large_scores_stay_finite",
                            "test_sdpa_causal_does_not_look_ahead", "test_sdpa_gradients_match"}
    assert "inverted" in _hints(sub)["test_sdpa_masked_weights_are_zero"]


def test_patching_comparisons_gains_nothing(graded):
    """Does patching numpy/torch comparisons in the notebook earn no point over the same honest mistake?"""
    by = graded[3]
    assert by["allclose_cheat"]["score"] == by["no_scale"]["score"]
    assert _failed(by["allclose_cheat"]) == _failed(by["no_scale"])


def test_os_exit_scores_zero_and_the_batch_goes_on(graded):
    """Does a notebook that kills its process score 0 while the others are graded?"""
    sub = graded[3]["os_exit"]
    assert sub["score"] == 0 and sub["status"] == "graded"
    assert all("ended the grading process" in c["hint"] for c in sub["checks"])
    assert graded[3]["helper"]["score"] == 23  # graded after it, alphabetically


def test_helper_in_an_added_cell_works(graded):
    """Does a helper function defined in a cell the learner added count?"""
    assert graded[3]["helper"]["score"] == 23


def test_gradebook_holds_the_scores(graded):
    """Does the nbgrader gradebook hold one row per learner, with the scores and part scores?"""
    _, out, summary, by = graded
    with Gradebook(summary["gradebook"]) as gb:
        subs = gb.assignment_submissions(KEY)
        assert sorted(s.student.id for s in subs) == sorted(BATCH)
        for s in subs:
            nb = gb.find_submission_notebook(KEY, KEY, s.student.id)
            assert nb.score == by[s.student.id]["score"]
            assert nb.max_score == 23
            grade = gb.find_grade("test_scaled_dot_product_attention", KEY, KEY, s.student.id)
            assert grade.score == by[s.student.id]["parts"]["scaled_dot_product_attention"]["score"]


def test_csv_matches_the_gradebook(graded):
    """Does the CSV export list exactly the gradebook's rows and scores?"""
    _, out, summary, _ = graded
    with open(summary["csv"], newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    with Gradebook(summary["gradebook"]) as gb:
        expected = {s.student.id: gb.find_submission_notebook(KEY, KEY, s.student.id).score
                    for s in gb.assignment_submissions(KEY)}
    assert {s: float(r["score"]) for s, r in rows.items()} == expected
    assert all(r["max_score"] == "23.0" and r["status"] == "graded" for r in rows.values())


def test_feedback_shows_hints_never_hidden_tests(graded, root):
    """Does each learner get a feedback page with hints but no hidden test code or expected values?"""
    _, out, _, by = graded
    hidden = (root / "autograder" / "hidden" / f"test_{KEY}.py").read_text()
    for student in BATCH:
        page = (out / "feedback" / student / f"{KEY}.html").read_text()
        assert f"{by[student]['score']:g} / 23" in page
        assert "def test_" not in page and "_variants" not in page and "reference." not in page
        assert "tensor(" not in page and "array(" not in page
        for line in hidden.splitlines():
            if line.strip().startswith(("q, k, v =", "expected =", "mask =")):
                assert line.strip() not in page
    assert "not divided by sqrt(d_k)" in (out / "feedback" / "no_scale" / f"{KEY}.html").read_text()


def test_regrading_is_idempotent_and_force_regrades(graded):
    """Does a second run skip what is graded, and --force regrade without duplicating rows?"""
    base, out, summary, by = graded
    again = run_json("grade", "--assignment", KEY, str(base / "submitted"), "--out", str(out))
    assert all(s["skipped"] for s in again["submissions"])
    assert {s["student"]: s["score"] for s in again["submissions"]} == {s: by[s]["score"] for s in by}
    forced = run_json("grade", "--assignment", KEY, str(base / "submitted" / "no_scale.ipynb"),
                      "--out", str(out), "--force")
    assert [(s["student"], s["skipped"], s["score"]) for s in forced["submissions"]] == [("no_scale", False, 16.0)]
    with Gradebook(summary["gradebook"]) as gb:
        assert len(gb.assignment_submissions(KEY)) == len(BATCH)


def test_malformed_notebook_is_reported_not_fatal(tmp_path):
    """Does a truncated notebook get a clear error of its own while the rest of the batch is graded?"""
    subs = tmp_path / "submitted"
    write(reference_notebook(KEY), subs / "good.ipynb")
    text = (subs / "good.ipynb").read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    result = run_json("grade", "--assignment", KEY, str(subs), "--out", str(tmp_path / "out"))
    by = {s["student"]: s for s in result["submissions"]}
    assert by["good"]["score"] == 23
    assert by["truncated"]["status"] == "error" and "not valid notebook JSON" in by["truncated"]["error"]
    rows = list(csv.DictReader(open(result["csv"])))
    assert {r["student_id"]: r["status"] for r in rows} == {"good": "graded", "truncated": "error"}


def test_learner_self_check(tmp_path):
    """Does `check` print points per part, the total and hints, and say it ran unsandboxed?"""
    path = write(_wrong_axis(), tmp_path / "mine.ipynb")
    proc = run_cli("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "without a sandbox" in proc.stdout
    assert "scaled_dot_product_attention  1 / 12" in proc.stdout
    assert "total" in proc.stdout and "12 / 23" in proc.stdout
    assert "hint: The softmax runs over the wrong axis" in proc.stdout
    data = run_json("check", str(write(reference_notebook(KEY), tmp_path / "ref.ipynb")))
    assert data["score"] == data["max_score"] == 23 and data["sandboxed"] is False
