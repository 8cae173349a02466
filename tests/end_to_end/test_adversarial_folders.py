"""The submissions folder is hostile too: every attack of tests/attacks/folders.py, graded in the
one adversarial batch (the session fixture `batch` in conftest.py), has its outcome: graded as
itself, or not graded with a reason (a flagged `error` row), or rejected with a reason; never
attributed to another learner; nothing written outside the output folder; a rerun agrees."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest

from attacks import KEY, TIMEOUT
from attacks.folders import FLAGGED, GRADED_AS_ITSELF, NOT_GRADED, REJECTED
from autograder.core.limits import DEFAULT
from autograder.core.text import STUDENT_ID, safe
from conftest import run_cli


def _flagged(batch, student) -> bool:
    (flag,) = batch["con"].execute(
        "SELECT n.flagged FROM submitted_notebook n JOIN submitted_assignment a ON n.assignment_id = a.id "
        "WHERE a.student_id = ?", (student,)).fetchone()
    return bool(flag)


def _csv(batch) -> dict:
    return {r["student_id"]: r for r in csv.DictReader(batch["csv"])}


def _rejected(batch) -> dict:
    return {r["path"]: r for r in batch["data"]["rejected"]}


def _at_layout_place(subs: Path, notebook: str, student: str) -> bool:
    return Path(notebook) in (subs / f"{student}.ipynb", subs / student / f"{KEY}.ipynb",
                              subs / student / KEY / f"{KEY}.ipynb")


# --- nobody's grade is set by another's files --------------------------------------------------

def test_hidden_and_nested_copies_change_no_one_elses_grade(batch):
    by = batch["by"]
    low, control, full = by["victim_low"], by["victim_low_control"], by["victim_full"]
    assert low["status"] == control["status"] == "graded"
    assert low["score"] == control["score"] < low["max_score"]  # mallory's hidden copy claimed full marks
    assert full["status"] == "graded" and full["score"] == full["max_score"]  # and a blank
    assert by["zz_other"]["score"] == by["zz_other"]["max_score"]  # trudy's .git copy
    for name in ("victim_low", "victim_full", "zz_other"):
        assert Path(by[name]["notebook"]) == batch["subs"] / f"{name}.ipynb" and not by[name]["flags"]
        assert not _flagged(batch, name)


def test_every_graded_notebook_is_a_regular_file_at_its_own_place(batch):
    subs = batch["subs"]
    for student, r in batch["by"].items():
        assert STUDENT_ID.fullmatch(student) and ".." not in student, student
        if r["status"] == "graded":
            assert _at_layout_place(subs, r["notebook"], student), (student, r["notebook"])
            assert Path(r["notebook"]).is_file() and not Path(r["notebook"]).is_symlink()


@pytest.mark.parametrize("name", sorted(GRADED_AS_ITSELF))
def test_graded_as_itself(batch, name):
    r = batch["by"][name]
    assert r["status"] == "graded", r["error"]
    assert _at_layout_place(batch["subs"], r["notebook"], name)
    expected = {"stub": 0.0, "reference": r["max_score"]}.get(GRADED_AS_ITSELF[name])
    if expected is not None:
        assert r["score"] == expected, (name, r["notes"])


@pytest.mark.parametrize("name,words", sorted(FLAGGED.items()))
def test_a_learner_whose_folder_holds_rejected_entries_is_flagged(batch, name, words):
    r = batch["by"][name]
    assert r["flags"] and words in " ".join(r["flags"]), r["flags"]
    assert _flagged(batch, name)
    row = _csv(batch)[name]
    assert "flagged" in row["reason"] and words in row["reason"]
    assert re.search(rf"^{name}: [\d.]+ / [\d.]+ .* FLAGGED: its folder holds", batch["stderr"], re.M)
    page = (batch["out"] / "feedback" / name / KEY / f"{KEY}.html").read_text(encoding="utf-8")
    assert "Your instructor will look at this submission" in page


def test_the_forgers_own_notebooks_are_graded(batch):
    by, subs = batch["by"], batch["subs"]
    assert Path(by["mallory"]["notebook"]) == subs / "mallory.ipynb" and by["mallory"]["score"] == 0
    assert Path(by["trudy"]["notebook"]) == subs / "trudy" / KEY / f"{KEY}.ipynb" and by["trudy"]["score"] == 0


# --- refused: links, special files, two notebooks for one id, no notebook ----------------------

@pytest.mark.parametrize("name,words", sorted(NOT_GRADED.items()))
def test_not_graded_with_a_reason_and_a_flagged_error_row(batch, name, words):
    r = batch["by"][name]
    assert r["status"] == "error" and words in r["error"], r["error"]
    assert r["score"] == 0 and r["seed"] is None and r["checks"] == []  # never opened, nothing run
    assert _flagged(batch, name)
    row = _csv(batch)[name]
    assert row["status"] == "error" and words in row["reason"] and float(row["score"]) == 0
    page = (batch["out"] / "feedback" / name / KEY / f"{KEY}.html").read_text(encoding="utf-8")
    assert "Not graded" in page
    assert re.search(rf"^{name}: 0 / [\d.]+ \(ERROR: ", batch["stderr"], re.M)


def test_two_notebooks_for_one_id_name_both_files(batch):
    subs = str(batch["subs"])
    twice = batch["by"]["twice"]["error"]
    assert f"{subs}/twice/{KEY}.ipynb" in twice and f"{subs}/twice/{KEY}/{KEY}.ipynb" in twice
    dup = batch["by"]["dup"]["error"]
    assert f"{subs}/dup.ipynb" in dup and f"{subs}/dup/{KEY}/{KEY}.ipynb" in dup
    for name in ("Casey", "casey"):
        assert f"{subs}/Casey.ipynb" in batch["by"][name]["error"] and f"{subs}/casey.ipynb" in batch["by"][name]["error"]


def test_special_files_are_untouched_and_did_not_hang_the_run(batch):
    subs = batch["subs"]
    assert (subs / "fifo_notebook.ipynb").is_fifo() and (subs / "fifo_in_folder" / KEY / f"{KEY}.ipynb").is_fifo()
    assert os.readlink(subs / "symlink_zero.ipynb") == "/dev/zero"
    assert "fifo_notebook" in batch["by"] and "fifo_in_folder" in batch["by"]


# --- rejected entries: listed with the reason, owned by nobody ------------------------------------

@pytest.mark.parametrize("rel,words", sorted(REJECTED.items()))
def test_rejected_entries_are_listed_with_a_reason(batch, rel, words):
    shown = safe(str(batch["subs"] / rel), DEFAULT.path_chars)
    entry = _rejected(batch).get(shown)
    assert entry is not None, (shown, sorted(_rejected(batch)))
    assert words in entry["reason"], entry
    owner = rel.split("/")[0] if "/" in rel else None
    assert entry["student"] == owner
    assert f"rejected: {shown} {entry['reason']}" in batch["stderr"]
    log = Path(batch["data"]["log"]).read_text(encoding="utf-8")
    assert f"rejected: {shown} {entry['reason']}" in log


def test_no_rejected_entry_becomes_a_student(batch):
    by = batch["by"]
    for bad in (".", "..", "space name", "space_name_", "-rf", "=cmd()", "tab\tname", "tab_name", KEY, "_", "__",
                "linked_dir", "loop", "hidden_top", "_hidden_top", "a"):
        assert bad not in by, bad
    assert not any(s.startswith(("_", ".")) for s in by)
    # Jupyter's checkpoints are skipped without a word
    assert not any(".ipynb_checkpoints" in r["path"] for r in batch["data"]["rejected"])
    assert batch["data"]["rejected_total"] >= len(REJECTED)


# --- nothing is written outside --out -----------------------------------------------------------

OUT_FILES = [re.compile(p) for p in (
    r"gradebook\.db(-journal)?", rf"{KEY}_grades\.csv", rf"logs/grade-{KEY}-[\d-]+\.log",
    rf"feedback/(?P<id>[^/]+)/{KEY}/({KEY}\.html|timestamp\.txt|submission_secret\.txt)",
    rf"results/{KEY}/(?P<id>[^/]+)\.json",
    rf"autograded/(?P<id>[^/]+)/{KEY}/({KEY}\.ipynb|timestamp\.txt)", rf"exports/{KEY}_(canvas|moodle)\.csv")]


def test_the_output_folder_holds_only_its_files(batch):
    out = batch["out"]
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            assert not os.path.islink(os.path.join(dirpath, name))
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), out)
            m = next((p.fullmatch(rel) for p in OUT_FILES if p.fullmatch(rel)), None)
            assert m is not None, rel
            if "id" in m.groupdict():
                sid = m.group("id")
                assert STUDENT_ID.fullmatch(sid) and ".." not in sid and sid in batch["by"], rel


def test_nothing_outside_the_output_folder_changed(batch):
    """Nothing under the batch's folder but OUT was created or modified after the notebooks were written."""
    base, out, subs = batch["ctx"].base, batch["out"], batch["subs"]
    written = max(os.lstat(subs / rel).st_mtime_ns for rel in batch["before_subs"])
    late = []
    for dirpath, dirnames, filenames in os.walk(base):
        if Path(dirpath) == out or out in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if Path(path) != out and os.lstat(path).st_mtime_ns > written + 500_000_000:
                late.append(path)
    assert late == []
    assert all(Path(p).read_bytes() for p in batch["protected"])  # and round one checks their hashes


# --- a rerun: the same refusals, nobody graded from a refused file ----------------------------------

@pytest.fixture(scope="module")
def rerun(batch):
    ctx = batch["ctx"]
    proc = run_cli("grade", str(ctx.subs), "--assignment", KEY, "--out", str(ctx.out), "--timeout", TIMEOUT, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_rerun_keeps_refusing_and_keeps_the_grades(batch, rerun):
    again = {r["student"]: r for r in rerun["submissions"]}
    assert set(again) == set(batch["by"])
    for name in NOT_GRADED:
        assert again[name]["status"] == "error" and again[name]["error"] == batch["by"][name]["error"]
        assert again[name]["score"] == 0 and _flagged(batch, name)
    for name, r in batch["by"].items():
        if r["status"] == "graded":
            assert again[name]["score"] == r["score"] and again[name]["flags"] == r["flags"], name
            assert again[name]["skipped"], name  # unchanged, same flags: not graded again
    assert rerun["rejected"] == batch["data"]["rejected"] and rerun["rejected_total"] == batch["data"]["rejected_total"]
