"""Hostile submissions, graded in one sandboxed batch with honest ones: cheats, escapes and exhaustion.

The notebooks are built in tests/attacks/cheats_and_escapes.py (from the learner notebook: stubs, 0
points honestly; or from the reference: full marks honestly; plus an attack); one `grade`
run grades every attack module's submissions together (the session fixture `batch` in
conftest.py). Each test asserts a concrete outcome: the score in the JSON and the
gradebook, the reason, the feedback text, file hashes, leftover processes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attacks import KEY, TIMEOUT
from attacks.cheats_and_escapes import CANARY_TEXT, FULL, HIDDEN_TEXT, MARKER, OTHER_TEXT, SOLUTION_TEXT, sha
from autograder.core.assignments import get_assignment

def _feedback(batch, name) -> str:
    return (batch["out"] / "feedback" / name / KEY / f"{KEY}.html").read_text(encoding="utf-8")


def _gb_score(batch, name) -> float:
    (score,) = batch["con"].execute(
        "SELECT SUM(COALESCE(g.manual_score, g.auto_score, 0)) FROM grade g "
        "JOIN submitted_notebook n ON g.notebook_id = n.id JOIN submitted_assignment a ON n.assignment_id = a.id "
        "WHERE a.student_id = ?", (name,)).fetchone()
    return score


def _expect(batch, name, score, status="graded"):
    r = batch["by"][name]
    assert r["status"] == status, (name, r.get("error"), r.get("checks"))
    assert r["score"] == score, (name, [(c["name"], c["hint"]) for c in r["checks"] if not c["passed"]], r["notes"])
    assert _gb_score(batch, name) == score
    assert r["max_score"] == FULL
    return r


def _hints(r) -> str:
    return " ".join(c["hint"] for c in r["checks"])


# --- every submission has its outcome; nothing leaks, nothing is left behind -----------------

def test_every_submission_has_a_gradebook_row_or_a_reason(batch):
    from autograder.core.text import student_id_problem

    names = set(batch["by"])
    students = {r[0] for r in batch["con"].execute("SELECT id FROM student")}
    assert students == names
    assert len(batch["csv"]) == len(names) + 1
    for r in batch["by"].values():
        assert r["status"] == "graded" or r["error"]
    for p in batch["subs"].glob("*.ipynb"):  # a valid id has its row (maybe an error); others are rejected
        assert (p.stem in names) == (not student_id_problem(p.stem, KEY)), p.name


def test_no_process_is_left_behind(batch):
    assert batch["leftover"] == []


def test_protected_files_are_untouched(batch):
    after = {str(p): sha(p) for p in batch["protected"]}
    assert after == batch["before"]
    subs = batch["subs"]
    assert {str(p.relative_to(subs)): sha(p) for p in subs.rglob("*")
            if p.is_file() and not p.is_symlink()} == batch["before_subs"]
    assert not list(Path("/tmp").glob(f"PWNED-{MARKER}*"))


def test_gradebook_is_intact_and_never_written_by_learners(batch):
    assert b"PWNED" not in batch["gradebook"].read_bytes()
    assert batch["con"].execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_no_secret_reaches_any_feedback_or_result(batch):
    texts = [p.read_text(encoding="utf-8") for p in (batch["out"] / "feedback").rglob("*.html")]
    texts += [p.read_text(encoding="utf-8") for p in (batch["out"] / "results").rglob("*.json")]
    texts.append(batch["stderr"])
    for secret in (HIDDEN_TEXT, SOLUTION_TEXT, OTHER_TEXT, CANARY_TEXT, "def _variants(", "SQLite format 3",
                   "root:"):
        assert not any(secret in t for t in texts), secret


# --- honest submissions ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["honest_reference", "honest_warnings", "honest_einsum_float64",
                                  "honest_helper_cell", "honest_jupyterlab", "honest_notebook7",
                                  "honest_vscode", "honest_colab", "zz_other"])
def test_honest_correct_answers_get_full_marks(batch, name):
    _expect(batch, name, FULL)


def test_honest_stub_gets_nothing(batch):
    _expect(batch, "honest_stub", 0.0)


def test_batch_neighbours_grade_as_when_graded_alone(batch, tmp_path):
    """The honest notebooks' scores in the hostile batch equal a grading of each alone."""
    from autograder.grading.grader import Grader
    from autograder.isolation.sandbox import detect

    grader = Grader(get_assignment(KEY), sandbox=detect())
    for name in ("honest_reference", "honest_stub"):
        alone = grader.grade(batch["subs"] / f"{name}.ipynb")
        r = batch["by"][name]
        assert alone.score == r["score"]
        assert [c.passed for c in alone.checks] == [c["passed"] for c in r["checks"]]


# --- hostile submissions --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["patch_comparisons", "patch_builtins", "tensor_subclass", "lying_eq"])
def test_lying_comparisons_earn_nothing(batch, name):
    _expect(batch, name, 0.0)


def test_ipython_hooks_and_import_spies_see_no_hidden_test(batch):
    r = _expect(batch, "ipython_hooks", 0.0)
    hints = _hints(r)
    assert "SEEN" in hints and "hidden" not in hints.replace("SEEN", "") and "test_03" not in hints


def test_forged_grade_cell_is_rejected(batch):
    r = _expect(batch, "forged_grade_cell", 0.0, status="error")
    assert "forged" in r["error"] and "test_bonus" in r["error"]
    assert "forged" in _feedback(batch, "forged_grade_cell")
    row = next(ln for ln in batch["csv"] if ln.startswith("forged_grade_cell,"))
    assert ",error," in row


def test_duplicated_grade_cell_is_rejected(batch):
    r = _expect(batch, "duplicated_grade_cell", 0.0, status="error")
    assert "test_softmax" in r["error"] and "repeats" in r["error"]


def test_edited_locked_cell_is_reported_and_changes_nothing(batch):
    r = _expect(batch, "edited_locked_cell", 0.0)
    assert any("test_softmax" in n and "edited" in n for n in r["notes"])
    assert "was edited" in _feedback(batch, "edited_locked_cell")


def test_deleted_grade_cells_are_reported(batch):
    r = _expect(batch, "deleted_grade_cells", 0.0)
    assert any("missing" in n for n in r["notes"])


def test_exit_at_load_earns_nothing(batch):
    r = _expect(batch, "os_exit_at_load", 0.0)
    assert "ended the grading process" in _hints(r)


def test_sys_exit_in_one_function_costs_only_that_part(batch):
    # attention_numpy calls the learner's softmax, so it fails too (as it would honestly)
    r = _expect(batch, "sys_exit_in_function", FULL - 3 - 4)
    assert all(c["passed"] for c in r["checks"] if c["part"] not in ("softmax", "attention_numpy"))
    assert "SystemExit" in _hints(r)


def test_segfault_costs_only_that_part(batch):
    r = _expect(batch, "segfault", FULL - 2)
    assert "ended the grading process" in _hints(r)


def test_endless_loop_at_load_is_cut(batch):
    r = _expect(batch, "endless_loop_at_load", 0.0)
    assert "did not finish" in _hints(r)


def test_sigint_ignoring_loop_is_killed(batch):
    r = _expect(batch, "sigint_ignored_loop", FULL - 2)
    assert "did not finish" in _hints(r)


def test_memory_hog_is_capped(batch):
    r = _expect(batch, "memory_hog", FULL)
    assert any("MemoryError" in n for n in r["notes"])


def test_fork_bomb_is_capped(batch):
    _expect(batch, "fork_bomb", FULL)


def test_disk_fill_is_capped(batch):
    _expect(batch, "disk_fill", FULL)
    assert not Path("/tmp/fill.bin").exists()


def test_huge_output_is_capped(batch):
    _expect(batch, "huge_output", FULL)
    assert (batch["out"] / "results" / KEY / "huge_output.json").stat().st_size < 100_000


def test_network_is_unreachable(batch):
    r = _expect(batch, "network", 0.0)
    hints = _hints(r)
    # loopback is the sandbox's own (refused); the outside world is unreachable; a worker forked
    # from a warm template may not open an Internet socket at all (its network namespace is the
    # template's, which the next learner shares)
    assert ("NET ConnectionRefusedError:111 OSError:101 OSError:101" in hints
            or "NET PermissionError:1 PermissionError:1 PermissionError:1" in hints) and "connected" not in hints
    assert batch["listener"].received == []


@pytest.mark.parametrize("name", ["read_hidden_and_solutions", "read_gradebook_and_others"])
def test_secrets_are_not_readable(batch, name):
    r = _expect(batch, name, 0.0)
    hints = _hints(r)
    assert "READ" in hints
    assert "FileNotFoundError" in hints or "PermissionError" in hints
    for secret in (HIDDEN_TEXT, SOLUTION_TEXT, OTHER_TEXT, CANARY_TEXT, "SQLite", "root:"):
        assert secret not in hints and secret not in _feedback(batch, name)


def test_writing_the_gradebook_and_files_fails(batch):
    r = _expect(batch, "write_gradebook_and_files", 0.0)
    hints = _hints(r)
    assert "WRITE" in hints and "wrote" not in hints and "removed" not in hints


def test_killing_everything_reaches_nothing_outside(batch):
    _expect(batch, "kill_everything", FULL)


def test_daemon_escape_is_ended(batch):
    _expect(batch, "escape_as_daemon", FULL)


def test_oversized_reply_is_refused(batch):
    r = _expect(batch, "oversized_reply", 0.0)
    assert "cannot accept" in _hints(r) or "too large" in _hints(r) or "MemoryError" in _hints(r)


@pytest.mark.parametrize("name,words", [("malformed_json", "not valid notebook JSON"),
                                        ("truncated", "not valid notebook JSON"),
                                        ("oversized", "MiB")])
def test_broken_notebooks_get_a_clear_error(batch, name, words):
    r = _expect(batch, name, 0.0, status="error")
    assert words in r["error"]
    row = next(ln for ln in batch["csv"] if ln.startswith(f"{name},"))
    assert ",error," in row


# --- notebooks built to be slow to process ---------------------------------------------------

@pytest.mark.parametrize("name", ["slow_parse_deep_nesting", "slow_parse_long_expression",
                                  "slow_parse_many_statements"])
def test_a_notebook_slow_to_parse_costs_only_its_own_time(batch, name):
    """Is a notebook under the size limit whose code is costly to parse handled in the sandbox, within its
    own time limit, without taking the trusted grader's time or memory (its other cells still count)?"""
    r = batch["by"][name]
    assert os.path.getsize(batch["subs"] / f"{name}.ipynb") < 20 * 2**20
    assert r["status"] == "graded" and r["seconds"] <= float(TIMEOUT) + 10, (r["status"], r["seconds"])
    assert any("could not be parsed" in n or "nested parentheses" in n for n in r["notes"]), r["notes"]
    assert r["score"] == FULL  # the cell that could not be parsed is skipped; the answers count


def test_a_json_container_bomb_is_refused_before_parsing(batch):
    """Is a notebook of millions of tiny JSON lists refused at once, not parsed into gigabytes?"""
    r = _expect(batch, "json_container_bomb", 0.0, status="error")
    assert "lists and objects" in r["error"] and r["seconds"] < 2
