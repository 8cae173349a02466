"""A whole term as one scenario, on real parts: two assignments (03_qkv and
06_transformer), four learners who are local users, one instructor, one JupyterHub.

The hub (configurable-http-proxy, LocalProcessSpawner, a shared password; tests/end_to_end/term/)
is started once. In Chromium, each learner logs in, fetches both assignments in nbgrader's
Assignments panel, works and submits there: alice types her masks of 03 into the notebook and
runs check() in a cell; dave does the same in 06; bob submits 03 with a mistake, fixes it in
JupyterLab and submits again; carol hands in 03 after its due date. Answers that no browser step
would tell anything about are written into the learner's fetched notebook as that learner.
The instructor collects, grades with `python -m autograder grade`, opens formgrader through the
hub, scores one answer by hand and comments on it, regrades that learner, exports, and releases
the feedback, which every learner fetches in the panel and reads in JupyterLab.

The module fixture runs the term once and keeps what each step showed; the tests read it. Every
score must agree across the grades CSV, the Canvas and Moodle files, `nbgrader export`, formgrader's
submissions pages and every feedback page; the comment and the score the instructor set in formgrader
reach the learner's page, and the roster's names formgrader and the LMS files.

Cost: about 140 s on two idle cores (2m22s for `pytest tests/end_to_end/test_term.py`), of which
the five servers' start is 30 s and the two grading runs 35 s; the fixture prints each step's time.
A failed run leaves a screenshot of every page in /tmp/attention-term-failure/.

Needs root (users are made with useradd and removed at the end), jupyterhub, npm's
configurable-http-proxy, Chromium and bubblewrap; skipped without them.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from chapters.ch03_qkv import NO_SCALE
from chapters.ch06_transformer import MISTAKES as MISTAKES_06
from conftest import learner_notebook, mistake, reference_notebook, run_cli, wait_until
from term.machine import COURSE_ID, Term, find_chromium, give, nbgrader_config, what_is_missing, write_as

MISSING = what_is_missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

QKV, TRANSFORMER = "03_qkv", "06_transformer"
KEYS = (QKV, TRANSFORMER)
ALICE, BOB, CAROL, DAVE = "termalice", "termbob", "termcarol", "termdave"
LEARNERS = [ALICE, BOB, CAROL, DAVE]
INSTRUCTOR = "terminstr"
NAMES = {ALICE: "Ada Lovelace", BOB: "Bob Bemer", CAROL: "Carol Shaw", DAVE: "Dave Cutler"}
NBGRADER = str(Path(sys.executable).parent / "nbgrader")
CHECK_CELL = "from autograder import check; check()"
SDPA = "scaled_dot_product_attention"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
MANUAL_SCORE = 12  # dave's scaled_dot_product_attention, scored by hand: the grader gives it 0 / 15
COMMENT = "Divide the scores by sqrt(d_k) before the softmax: see section 3.2."
UNBIASED = MISTAKES_06["unbiased_variance"]

# Each learner's score before a late penalty (what formgrader shows: nbgrader keeps the penalty apart),
# and FINAL, after it (the CSV, the LMS files, nbgrader's export, the feedback pages). Both out of 26.
EXPECTED = {
    QKV: {ALICE: 26.0, BOB: 26.0, CAROL: 26.0, DAVE: 11.0 + MANUAL_SCORE},
    TRANSFORMER: {ALICE: 26.0, BOB: float(UNBIASED.score), CAROL: 0.0, DAVE: 26.0},
}
LATE = {(QKV, CAROL): 0.1}  # late.per_day = 10 % of the maximum score per started day
FINAL = {key: {s: round(v - LATE.get((key, s), 0) * 26, 2) for s, v in scores.items()}
         for key, scores in EXPECTED.items()}


# --- the notebooks each learner hands in -------------------------------------------------------

def answer(key: str, grade_id: str) -> str:
    """The reference's source of one answer cell, as a learner would write it (no solution markers)."""
    source = next(c.source for c in reference_notebook(key).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)


def with_stub(nb: nbformat.NotebookNode, key: str, grade_id: str) -> nbformat.NotebookNode:
    """`nb` with one answer cell back to the released stub: the answer the learner types in JupyterLab."""
    stub = next(c.source for c in learner_notebook(key).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = stub
    return nb


def nbgrader(*args: str, cwd: Path) -> str:
    proc = subprocess.run([NBGRADER, *args], cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}: {proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def course_cli(*args: str, cwd: Path) -> str:
    proc = run_cli(*args, cwd=cwd)
    assert proc.returncode == 0, f"python -m autograder {' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


def csv_rows(path: Path, key: str = "student_id") -> dict[str, dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r[key]: r for r in csv.DictReader(f)}


# --- the term ------------------------------------------------------------------------------------

def shoot(labs: dict) -> Path:
    """A screenshot of every page of every user, for a failed run (the temporary folder goes)."""
    shots = Path(tempfile.gettempdir()) / "attention-term-failure"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir()
    for name, lab in labs.items():
        for i, page in enumerate(lab.context.pages):
            try:
                page.screenshot(path=str(shots / f"{name}-{i}.png"), timeout=10_000)
            except Exception:  # noqa: BLE001 - a page that cannot be shot is no reason to hide the failure
                pass
    return shots


@pytest.fixture(scope="module")
def term():
    from playwright.sync_api import sync_playwright

    from term.lab import Lab

    started = time.monotonic()
    seen: dict = {"check": {}, "panel": {}, "feedback": {}, "formgrader": {}, "steps": []}

    def step(name: str) -> None:
        seen["steps"].append((name, round(time.monotonic() - started, 1)))

    machine = Term(LEARNERS, INSTRUCTOR)
    try:
        machine.make_users()
        course = machine.course
        course.mkdir()
        (course / "nbgrader_config.py").write_text(nbgrader_config(machine.exchange), encoding="utf-8")
        (course / "roster.csv").write_text("student_id,name\n" + "".join(f"{s},{n}\n" for s, n in NAMES.items()),
                                           encoding="utf-8")
        # The instructor: the course folder from the generated notebooks, then nbgrader's release.
        course_cli("release", *KEYS, "--out", str(course), cwd=course)
        for key in KEYS:
            nbgrader("release_assignment", key, cwd=course)
        give(course, machine.users[INSTRUCTOR])
        machine.configure_instructor()
        hub = machine.start_hub()
        step("users, course, release, hub")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=find_chromium(), args=[
                "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-quic"])
            labs = {name: Lab(browser, hub, name) for name in [*LEARNERS, INSTRUCTOR]}
            try:
                run_the_term(machine, labs, seen, step)
            except BaseException:
                print(f"\nthe browser's pages at the failure: {shoot(labs)}", file=sys.stderr)
                raise
            finally:
                browser.close()
        seen["wall_s"] = round(time.monotonic() - started, 1)
        spawns = re.findall(r"User (\w+) took ([\d.]+) seconds to start", hub.log_tail(10**7))
        print("\nthe term's steps (s since the start):", seen["steps"], "total", seen["wall_s"],
              "\nthe hub's spawns (s):", spawns)
        yield {"machine": machine, "course": course, "seen": seen}
    except BaseException:
        if machine.hub is not None:
            print(machine.hub.log_tail(), file=sys.stderr)
        raise
    finally:
        machine.close()


def run_the_term(machine: Term, labs: dict, seen: dict, step) -> None:
    from term.lab import Formgrader

    course, instructor = machine.course, machine.users[INSTRUCTOR]
    # Everyone logs in at once (the hub starts five servers): the learners to JupyterLab, the instructor
    # straight to formgrader (the hub's next=); then each page is awaited.
    for name, lab in labs.items():
        lab.start_login("formgrader" if name == INSTRUCTOR else "lab")
    for lab in labs.values():
        lab.finish_login()
    step("five logins")

    def home_notebook(learner: str, key: str) -> Path:
        return machine.home(learner) / key / f"{key}.ipynb"

    def put(learner: str, key: str, nb: nbformat.NotebookNode) -> None:
        write_as(machine.users[learner], home_notebook(learner, key), nbformat.writes(nb))

    for learner in LEARNERS:
        labs[learner].assignments()
        for key in KEYS:
            labs[learner].fetch(key)
    seen["fetched"] = {s: {k: home_notebook(s, k).is_file() for k in KEYS} for s in LEARNERS}
    step("fetched in the panel")

    # alice: her answers to 03 but the masks, which she types in JupyterLab; check(); submit.
    def type_check_submit(learner: str, key: str, first_line: str) -> None:
        """The learner's answers but the masks, which they type in JupyterLab; check() in a cell; Submit."""
        lab = labs[learner]
        put(learner, key, with_stub(reference_notebook(key), key, "masks"))
        lab.open_from_panel(key)
        lab.replace_cell(first_line, answer(key, "masks"))
        lab.add_cell_at_end(CHECK_CELL)
        lab.run_all()
        seen["check"][key] = lab.output_of(CHECK_CELL)
        lab.save()
        lab.assignments()
        lab.submit(key)

    a = labs[ALICE]
    type_check_submit(ALICE, QKV, "def padding_mask")
    put(ALICE, TRANSFORMER, reference_notebook(TRANSFORMER))
    a.submit(TRANSFORMER)
    step("alice: typed, checked, submitted")

    # bob: 03 with a mistake, submitted; fixed in JupyterLab, submitted again. 06 with a mistake.
    b = labs[BOB]
    put(BOB, QKV, mistake(QKV, *NO_SCALE)())
    b.submit(QKV)
    b.open_from_panel(QKV)
    b.replace_cell(f"def {SDPA}", answer(QKV, SDPA))
    b.save()
    b.assignments()
    b.submit(QKV)
    put(BOB, TRANSFORMER, mistake(TRANSFORMER, *UNBIASED.edits)())
    b.submit(TRANSFORMER)
    step("bob: submitted, fixed, submitted again")

    # dave: 03 with the mistake the instructor will score by hand; 06 typed and checked.
    d = labs[DAVE]
    put(DAVE, QKV, mistake(QKV, *NO_SCALE)())
    d.submit(QKV)
    type_check_submit(DAVE, TRANSFORMER, "def make_src_mask")
    step("dave: submitted, typed, checked, submitted")

    # carol: 06 untouched, on time; then 03's due date passes, and she hands 03 in.
    c = labs[CAROL]
    c.submit(TRANSFORMER)
    # Due now (to the second: the grader keeps submission times to the second), and carol a second later.
    due = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    (course / "course.toml").write_text(
        '[late]\npolicy = "per_day"\npenalty = 10\n\n'
        f"[assignments.{QKV}]\ndue = {due.isoformat()}\n\n"
        '[lms]\nroster = "roster.csv"\n', encoding="utf-8")
    seen["due"] = due
    assert wait_until(lambda: dt.datetime.now(dt.timezone.utc) > due + dt.timedelta(seconds=1.1), 10)
    put(CAROL, QKV, reference_notebook(QKV))
    c.submit(QKV)
    for learner in LEARNERS:
        seen["panel"][learner] = {key: labs[learner].submissions(key) for key in KEYS}
    seen["inbound"] = sorted(p.name for p in (machine.exchange / COURSE_ID / "inbound").iterdir())
    step("carol: late")

    # The instructor: collect, grade, then formgrader through the hub.
    for key in KEYS:
        nbgrader("collect", key, cwd=course)
        seen[f"graded {key}"] = course_cli("grade", "--assignment", key, "submitted", "--out", ".",
                                           "--seed", "1", cwd=course)
    step("collected, graded")
    give(course, instructor)  # the grading ran as root; formgrader writes the gradebook as the instructor
    fg = Formgrader(labs[INSTRUCTOR])
    seen["formgrader_manual_page"] = fg.grade_by_hand(
        QKV, re.compile(rf"^\s*({DAVE}|Cutler, Dave)\s*$"), f"test_{SDPA}", MANUAL_SCORE, SDPA, COMMENT)
    step("formgrader: a score and a comment")

    # The grader runs again on dave's notebook (as after a fixed hidden check): the score stands.
    # His whole submitted folder: its submission_secret.txt goes with the feedback page to release_feedback.
    seen["submitted files"] = sorted(p.name for p in (course / "submitted" / DAVE / QKV).iterdir())
    shutil.copytree(course / "submitted" / DAVE / QKV, course / "regrade" / DAVE / QKV)
    seen["regraded"] = json.loads(course_cli("grade", "--assignment", QKV, "regrade", "--out", ".", "--force",
                                             "--seed", "1", "--json", cwd=course))
    # export rewrites the CSV, the pages and the LMS files from the gradebook (06's are grade's own)
    course_cli("export", "--assignment", QKV, "--out", ".", cwd=course)
    nbgrader("export", "--to", str(course / "nbgrader_grades.csv"), cwd=course)
    step("regraded, exported")
    give(course, instructor)
    for key in KEYS:
        seen["formgrader"][key] = fg.submissions_table(key)
    for key in KEYS:
        nbgrader("release_feedback", key, cwd=course)
    step("formgrader's tables, feedback released")

    # Every learner fetches the feedback in the panel and opens each page in JupyterLab.
    for learner in LEARNERS:
        lab = labs[learner]
        seen["feedback"][learner] = {}
        for key in KEYS:
            lab.fetch_feedback(key)
            seen["feedback"][learner][key] = lab.view_feedback(key)
    step("feedback read")


# --- the learners' side ----------------------------------------------------------------------

def test_learners_fetch_work_check_and_submit_in_jupyterlab(term):
    """Did the panel fetch both assignments into every learner's home, did check() in a cell report the
    full score of the notebook typed in JupyterLab, and did every Submit reach the exchange (bob twice)?"""
    seen = term["seen"]
    assert all(all(keys.values()) for keys in seen["fetched"].values()), seen["fetched"]
    for key in KEYS:
        assert re.search(r"total\s+26 / 26", seen["check"][key]), seen["check"][key]
    panel = seen["panel"]
    assert [len(panel[s][QKV]) for s in LEARNERS] == [1, 2, 1, 1], panel
    assert [len(panel[s][TRANSFORMER]) for s in LEARNERS] == [1, 1, 1, 1], panel
    inbound = seen["inbound"]
    assert len(inbound) == 9 and sum(n.startswith(f"{BOB}+{QKV}+") for n in inbound) == 2, inbound


def test_collect_takes_the_resubmission_and_the_typed_answers(term):
    """Is bob's collected 03 his second submission (fixed in JupyterLab), graded in full, and are the
    answers alice and dave typed in JupyterLab the ones graded?"""
    course = term["course"]
    bob = nbformat.read(str(course / "submitted" / BOB / QKV / f"{QKV}.ipynb"), as_version=4)
    assert "/ math.sqrt(d_k)" in "".join(c.source for c in bob.cells)
    for learner, key, typed in ((ALICE, QKV, "def causal_mask"), (DAVE, TRANSFORMER, "def make_tgt_mask")):
        nb = nbformat.read(str(course / "submitted" / learner / key / f"{key}.ipynb"), as_version=4)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "masks")
        assert typed in cell.source and "NotImplementedError" not in cell.source
        assert any(CHECK_CELL in c.source for c in nb.cells)  # the cell they added, saved and submitted
    rows = csv_rows(course / f"{QKV}_grades.csv")
    assert float(rows[BOB]["score"]) == 26 and float(rows[ALICE]["score"]) == 26


def test_the_late_submission_is_late_by_its_exchange_timestamp(term):
    """Is carol's 03, handed in after the due date, late by nbgrader's timestamp.txt and 10 % down,
    and the others on time?"""
    rows = csv_rows(term["course"] / f"{QKV}_grades.csv")
    carol = rows[CAROL]
    assert carol["submitted_from"] == "timestamp.txt" and int(carol["seconds_late"]) > 0
    assert float(carol["late_penalty"]) == pytest.approx(2.6) and float(carol["score"]) == pytest.approx(23.4)
    for learner in (ALICE, BOB, DAVE):
        assert int(rows[learner]["seconds_late"]) == 0 and float(rows[learner]["late_penalty"]) == 0
        assert rows[learner]["submitted_from"] == "timestamp.txt"


def test_the_score_set_in_formgrader_survives_the_regrade(term):
    """Did formgrader save the instructor's score and comment in the gradebook, and does the CSV keep the
    score, unflagged, after dave's notebook was graded again (same notebook, same automatic score)?"""
    from nbgrader.api import Gradebook

    course, seen = term["course"], term["seen"]
    [entry] = seen["regraded"]["submissions"]  # the regrade: dave's notebook alone, graded again
    assert (entry["student"], entry["status"], entry["auto_score"], entry["score"], entry["manual"]) == \
        (DAVE, "graded", 11, 11 + MANUAL_SCORE, True), entry
    page = seen["formgrader_manual_page"]  # formgrader's manual-grading page of dave's 03, as it was typed in
    assert f"Hidden checks of {SDPA}: 0 / 15 points" in page and "not divided by sqrt(d_k)" in page
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade(f"test_{SDPA}", QKV, QKV, DAVE)
        assert (grade.manual_score, grade.auto_score) == (MANUAL_SCORE, 0)
        comment = gb.find_comment(SDPA, QKV, QKV, DAVE)
        assert comment.manual_comment == COMMENT
    row = csv_rows(course / f"{QKV}_grades.csv")[DAVE]
    assert (row["manual"], row["needs_review"], float(row[f"test_{SDPA}"])) == ("True", "False", MANUAL_SCORE)
    assert float(row["auto_score"]) == 11


def _number(text: str) -> float:
    return float(text.strip())


def test_every_score_agrees_everywhere(term):
    """Are the final scores the same in the grades CSV, the Canvas and Moodle files, nbgrader's own
    export, formgrader's submissions pages (before a late penalty, which nbgrader keeps apart) and
    every feedback page the learners read in JupyterLab?"""
    course, seen = term["course"], term["seen"]
    theirs = {(r["assignment"], r["student_id"]): r
              for r in csv.DictReader(open(course / "nbgrader_grades.csv", encoding="utf-8"))}
    for key in KEYS:
        rows = csv_rows(course / f"{key}_grades.csv")
        assert {s: _number(rows[s]["score"]) for s in LEARNERS} == pytest.approx(FINAL[key])
        with open(course / "exports" / f"{key}_canvas.csv", newline="", encoding="utf-8") as f:
            canvas = list(csv.DictReader(f))
        assert canvas[0]["Student"] == "Points Possible" and _number(canvas[0][key]) == 26
        canvas_scores = {r["SIS Login ID"]: _number(r[key]) for r in canvas[1:]}
        assert canvas_scores == pytest.approx(FINAL[key])
        moodle = csv_rows(course / "exports" / f"{key}_moodle.csv", "Username")
        assert {s: _number(r[key]) for s, r in moodle.items()} == pytest.approx(FINAL[key])
        assert {s: _number(theirs[(key, s)]["score"]) for s in LEARNERS} == pytest.approx(FINAL[key])
        table = seen["formgrader"][key]
        assert set(table) == set(LEARNERS), table
        for s in LEARNERS:
            assert table[s]["score"] == f"{EXPECTED[key][s]:g} / 26", (key, s, table[s])
            assert table[s]["status"] == "graded", (key, s, table[s])
        for s in LEARNERS:
            page = seen["feedback"][s][key]
            assert f"Learner: {s}." in page and f"Score: {FINAL[key][s]:g} / 26" in page, (key, s, page[:600])
            assert all(f"Learner: {o}." not in page for o in LEARNERS if o != s)
    assert "after the due date" in seen["feedback"][CAROL][QKV]


# --- what the instructor adds by hand -------------------------------------------------------------

def test_the_comment_the_hand_set_score_and_the_roster_reach_everyone(term):
    """Do the comment and the score the instructor set in formgrader reach dave's feedback page, and the
    roster's names formgrader's lists and the Canvas and Moodle files?"""
    seen, course = term["seen"], term["course"]
    page = seen["feedback"][DAVE][QKV]
    assert COMMENT in page
    assert f"set by your instructor: {MANUAL_SCORE} (automatic: 0)" in page
    for key in KEYS:
        table = seen["formgrader"][key]
        assert {s: table[s]["name"] for s in LEARNERS} == {s: ", ".join(reversed(NAMES[s].rsplit(" ", 1)))
                                                           for s in LEARNERS}
        with open(course / "exports" / f"{key}_canvas.csv", newline="", encoding="utf-8") as f:
            assert {r["SIS Login ID"]: r["Student"] for r in list(csv.DictReader(f))[1:]} == NAMES
        moodle = csv_rows(course / "exports" / f"{key}_moodle.csv", "Username")
        assert {s: r["Full name"] for s, r in moodle.items()} == NAMES
