"""nbgrader's whole workflow on our grades, through nbgrader's own code: its exchange commands
(release_assignment, fetch_assignment, submit, collect, release_feedback, fetch_feedback,
export), the API behind formgrader's pages (`NbGraderAPI`), formgrader's manual-grading page
(its exporter and template), and an instructor's manual score across regrades.

One course folder is built and graded once (03_qkv, three learners): alice hands in the
reference through the exchange; bob (one mistake, and hostile markdown and outputs) and carol
(the untouched notebook) are placed in submitted/ by hand, as an LMS download would be.
"""

from __future__ import annotations

import csv
import html
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from chapters.ch03_qkv import NO_SCALE
from conftest import add_cell, learner_notebook, mistake, reference_notebook, run_cli, write

KEY = "03_qkv"
SDPA = "test_scaled_dot_product_attention"
NBGRADER = str(Path(sys.executable).parent / "nbgrader")
HOSTILE_MARKDOWN = "<script>alert('markdown')</script> <img src=x onerror=alert(1)> [x](javascript:alert(2))"

# The tests that use `course` are slow (about a dozen commands of several seconds each); the others are not.
slow = pytest.mark.slow


def nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([NBGRADER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def bob_notebook() -> nbformat.NotebookNode:
    """The mistake NO_SCALE, with markdown, an output and an attachment that must never reach formgrader."""
    nb = mistake(KEY, *NO_SCALE)()
    nb.cells.append(nbformat.v4.new_markdown_cell(HOSTILE_MARKDOWN))
    code = next(c for c in nb.cells if c.cell_type == "code" and "def softmax" in c.source)
    code.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<script>evil_output()</script>"})]
    md = nb.cells[0]
    md["attachments"] = {"a.png": {"image/png": "iVBORw0KGgo="}}
    return nb


def csv_rows(path: Path) -> dict[str, dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def api(course: Path):
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    return NbGraderAPI(CourseDirectory(root=str(course)))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("nbgrader_course")
    course, learner, exchange = base / "course", base / "alice_home", base / "exchange"
    for d in (course, learner, exchange):
        d.mkdir()
    config = (f'c = get_config()\nc.CourseDirectory.course_id = "attention"\n'
              f'c.Exchange.root = {str(exchange)!r}\n')
    (course / "nbgrader_config.py").write_text(config)
    (learner / "nbgrader_config.py").write_text(config)

    released = run_cli("release", KEY, "--out", ".", cwd=course)
    assert released.returncode == 0, released.stderr[-2000:]
    nbgrader("release_assignment", KEY, cwd=course)
    nbgrader("fetch_assignment", KEY, cwd=learner)
    write(reference_notebook(KEY), learner / KEY / f"{KEY}.ipynb")
    nbgrader("submit", KEY, "--student", "alice", cwd=learner)
    nbgrader("collect", KEY, cwd=course)
    write(bob_notebook(), course / "submitted" / "bob" / KEY / f"{KEY}.ipynb")
    write(learner_notebook(KEY), course / "submitted" / "carol" / KEY / f"{KEY}.ipynb")

    graded = run_cli("grade", "--assignment", KEY, "submitted", "--out", ".", "--seed", "1", "--json", cwd=course)
    assert graded.returncode == 0, graded.stderr[-3000:]
    return {"base": base, "dir": course, "learner": learner, "summary": json.loads(graded.stdout),
            "released": released.stdout}


@slow
def test_release_writes_the_source_and_release_notebooks_and_is_idempotent(course, capsys):
    """Does `release` write source/ and release/ from the learner notebook, and the same bytes again?"""
    from autograder.cli import main

    d = course["dir"]
    before = {}
    for folder in ("source", "release"):
        path = d / folder / KEY / f"{KEY}.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        assert [c.source for c in nb.cells] == [c.source for c in learner_notebook(KEY).cells]
        assert nb.cells[4].metadata["nbgrader"]["grade_id"] == "softmax"  # nbgrader's metadata kept
        assert f"{folder}/{KEY}/{KEY}.ipynb" in course["released"]
        before[path] = (path.read_bytes(), path.stat().st_mtime_ns)
    assert main(["release", KEY, "--out", str(d)]) == 0
    assert all((p.read_bytes(), p.stat().st_mtime_ns) == b for p, b in before.items())
    assert main(["release", "99_nothing", "--out", str(course["base"] / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown assignment" in err and "Traceback" not in err


@slow
def test_formgrader_lists_the_assignment_and_every_submission(course):
    """Does formgrader's API list 03_qkv with its points, and every learner's notebook with the CSV's scores?"""
    a = api(course["dir"])
    [assignment] = a.get_assignments()
    assert assignment["name"] == KEY and assignment["max_score"] == 26 and assignment["num_submissions"] == 3
    assert a.get_autograded_students(KEY) == {"alice", "bob", "carol"}
    subs = {s["student"]: s for s in a.get_notebook_submissions(KEY, KEY)}
    rows = csv_rows(course["dir"] / f"{KEY}_grades.csv")
    assert set(subs) == set(rows) == {"alice", "bob", "carol"}
    for student, row in rows.items():
        assert subs[student]["score"] == float(row["score"])
        assert a.get_submission(KEY, student)["score"] == float(row["score"])
        [nb] = a.get_student_notebook_submissions(student, KEY)
        assert nb["score"] == float(row["score"]) and nb["max_score"] == 26
    assert [float(rows[s]["score"]) for s in ("alice", "bob", "carol")] == [26, 11, 0]
    # alice's submission time is the exchange's timestamp.txt, copied beside her autograded notebook
    stamp = (course["dir"] / "submitted" / "alice" / KEY / "timestamp.txt").read_text().strip()
    assert (course["dir"] / "autograded" / "alice" / KEY / "timestamp.txt").read_text().strip() == stamp


def render_as_formgrader(path: Path) -> str:
    """The manual-grading page of one autograded notebook, as formgrader's SubmissionHandler renders it."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    c = Config()
    c.HTMLExporter.template_name = "formgrade"  # as FormgradeExtension.build_extra_config sets it
    c.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"assignment_id": KEY, "notebook_id": KEY, "submission_id": "x", "index": 0, "total": 3,
                 "base_url": "", "student": "bob", "last_name": None, "first_name": None,
                 "notebook_path": "autograded/bob/03_qkv/03_qkv.ipynb"}
    page, _ = HTMLExporter(config=c).from_filename(str(path), resources=resources)
    return page


@slow
def test_the_manual_grading_page_shows_scores_and_nothing_live_of_the_learner(course):
    """Does formgrader's page show a score field per grade cell and the hidden checks, and no learner script?"""
    path = course["dir"] / "autograded" / "bob" / KEY / f"{KEY}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    grade_ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert SDPA in grade_ids and len(grade_ids) == 5
    assert all("attachments" not in c for c in nb.cells)
    page = render_as_formgrader(path)
    for gid in grade_ids:
        assert f'id="{gid}"' in page  # formgrader's score input of that grade cell
    assert "Hidden checks of scaled_dot_product_attention: 0 / 15 points" in page
    assert "not divided by sqrt(d_k)" in page  # the hint of the failed checks
    assert "<script>alert" not in page and "<img src=x" not in page and 'href="javascript:' not in page
    assert "evil_output" not in page
    assert "alert(&#39;markdown&#39;)" in page or "alert('markdown')" in html.unescape(page)  # shown, as text


def set_manual_score(course: Path, student: str, grade_id: str, score: float) -> None:
    """What formgrader's GradeHandler.put does with an instructor's score."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade(grade_id, KEY, KEY, student)
        grade.manual_score = score
        grade.needs_manual_grade = grade.manual_score is None and grade.auto_score is None
        gb.db.commit()


def grade_state(course: Path, student: str):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        g = gb.find_grade(SDPA, KEY, KEY, student)
        nb = gb.find_submission_notebook(KEY, KEY, student)
        return g.manual_score, g.auto_score, g.needs_manual_grade, nb.flagged, nb.score


@slow
def test_a_manual_score_survives_regrades_and_reaches_every_output(course):
    """Is an instructor's score kept by a regrade (flagged only when the automatic score changed), and shown by
    the CSV, `export`'s feedback page, `grade --json` and `nbgrader export`?"""
    d, base = course["dir"], course["base"]
    set_manual_score(d, "bob", SDPA, 10)
    # The same notebook, the same seed: the automatic score is the same, the manual score stands unflagged.
    write(bob_notebook(), base / "same" / "bob.ipynb")
    same = run_cli("grade", "--assignment", KEY, str(base / "same"), "--out", str(d), "--seed", "1", "--force",
                   "--json")
    assert same.returncode == 0, same.stderr[-2000:]
    assert grade_state(d, "bob") == (10, 0, False, False, 21)
    [entry] = json.loads(same.stdout)["submissions"]
    assert entry["score"] == 21 and entry["auto_score"] == 11 and entry["manual"] is True
    # bob fixes his notebook: the automatic score changes under the manual one; kept, and flagged for review.
    write(reference_notebook(KEY), base / "fixed" / "bob.ipynb")
    fixed = run_cli("grade", "--assignment", KEY, str(base / "fixed"), "--out", str(d), "--seed", "1", "--force")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert grade_state(d, "bob") == (10, 15, True, True, 21)
    # the terminal says the final score, the kept manual score and that it needs review (not just "26 / 26")
    assert ("bob: 21 / 26: automatic 26; set by hand: scaled_dot_product_attention 10 (automatic 15); "
            "NEEDS REVIEW") in fixed.stdout
    row = csv_rows(d / f"{KEY}_grades.csv")["bob"]
    got = (float(row["score"]), float(row["auto_score"]), row["manual"], row["needs_review"])
    assert got == (21, 26, "True", "True")
    assert float(row[SDPA]) == 10
    # The instructor makes it 12 in formgrader; `export` (grading nothing) brings it to the CSV and the page.
    set_manual_score(d, "bob", SDPA, 12)
    exported = run_cli("export", "--assignment", KEY, "--out", str(d), "--json")
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert float(csv_rows(d / f"{KEY}_grades.csv")["bob"]["score"]) == 23
    # saving the score in formgrader was the review: `export` takes off the flag that `grade` set for it
    assert grade_state(d, "bob") == (12, 15, False, False, 23)
    assert json.loads(exported.stdout)["final"]["bob"] == ("23 / 26: automatic 26; set by hand: "
                                                          "scaled_dot_product_attention 12 (automatic 15)")
    page = html.unescape((d / "feedback" / "bob" / KEY / f"{KEY}.html").read_text(encoding="utf-8"))
    assert "Score: <b>23 / 26</b>" in page and "set by your instructor: 12 (automatic: 15)" in page
    assert "alice" not in page
    # nbgrader's own export reads the same gradebook
    nbgrader("export", "--to", str(base / "nbgrader_grades.csv"), cwd=d)
    theirs = {r["student_id"]: r for r in csv.DictReader(open(base / "nbgrader_grades.csv", encoding="utf-8"))}
    assert float(theirs["bob"]["score"]) == 23 and float(theirs["alice"]["score"]) == 26


@slow
def test_release_feedback_delivers_our_page_to_the_learner(course):
    """Do nbgrader's release_feedback and fetch_feedback bring alice the feedback page `grade` wrote?"""
    d, learner = course["dir"], course["learner"]
    nbgrader("release_feedback", KEY, cwd=d)
    nbgrader("fetch_feedback", KEY, "--student", "alice", cwd=learner)
    [got] = list((learner / KEY / "feedback").rglob(f"{KEY}.html"))
    ours = (d / "feedback" / "alice" / KEY / f"{KEY}.html").read_text(encoding="utf-8")
    assert got.read_text(encoding="utf-8") == ours and "Score: <b>26 / 26</b>" in ours


FORMGRADER_BUTTONS = """
import json, sys
from nbgrader.apps.api import NbGraderAPI
from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension

fg = FormgradeExtension()
fg.load_config_file()  # the course folder's nbgrader_config.py, as formgrader's every request reads it
api = NbGraderAPI(fg.coursedir, fg.authenticator, parent=fg)
key = sys.argv[1]
print(json.dumps({"autograde": api.autograde(key, "bob"), "generate": api.generate_assignment(key),
                  "feedback": api.generate_feedback(key, "alice")}))
"""


def set_comment(course: Path, student: str, cell: str, text: str) -> None:
    """What formgrader's CommentHandler.put does with the comment typed under an answer."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.find_comment(cell, KEY, KEY, student).manual_comment = text
        gb.db.commit()


@slow
def test_formgrader_buttons_go_through_the_course_and_comments_reach_the_learner(course):
    """Does formgrader's Autograde leave everything as it was (saying what to run), Generate write our release
    notebook, Generate Feedback write our page with the comments typed in formgrader, and do those comments
    reach the learner through release_feedback?"""
    d, learner = course["dir"], course["learner"]
    config = (d / "nbgrader_config.py").read_text()
    assert config.count("autograder.course.nbgrader_buttons") == 1 and "c.Exchange.root" in config
    set_comment(d, "alice", "softmax", "Stable and clear: <b>well done</b>.\nSee the note on masks.")
    set_comment(d, "alice", "masks", "The causal mask could use torch.triu.")
    kept = {p: p.read_bytes() for p in (d / "autograded").rglob("*") if p.is_file()}
    secret = d / "feedback" / "alice" / KEY / "submission_secret.txt"
    secret_text = secret.read_text()
    state = grade_state(d, "bob")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", FORMGRADER_BUTTONS, KEY], cwd=d, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Autograde: refused before anything is touched, with the command to run instead
    assert got["autograde"]["success"] is False
    assert "python -m autograder grade --assignment 03_qkv" in got["autograde"]["error"]
    assert {p: p.read_bytes() for p in (d / "autograded").rglob("*") if p.is_file()} == kept
    assert grade_state(d, "bob") == state
    # Generate: the release notebook is still the learner notebook (the stubs' code and docstrings kept)
    assert got["generate"]["success"] is True, got["generate"]
    released = nbformat.read(str(d / "release" / KEY / f"{KEY}.ipynb"), as_version=4)
    assert [c.source for c in released.cells] == [c.source for c in learner_notebook(KEY).cells]
    # Generate Feedback: our page, from the gradebook, with the comments under their parts; the secret kept
    assert got["feedback"]["success"] is True, got["feedback"]
    assert secret.read_text() == secret_text
    page = (d / "feedback" / "alice" / KEY / f"{KEY}.html").read_text(encoding="utf-8")
    assert "Score: <b>26 / 26</b>" in page and "<b>well done</b>" not in page
    assert "Stable and clear: &lt;b&gt;well done&lt;/b&gt;.\nSee the note on masks." in page
    rows = page.split("<tr class='part'>")
    assert any(r.startswith("<th>softmax</th>") and "Stable and clear" in r for r in rows)
    assert any(r.startswith("<th>padding_mask</th>") and "torch.triu" in r for r in rows)
    # nbgrader's own commands read the same configuration: Autograde refused there too
    cli = subprocess.run([NBGRADER, "autograde", KEY, "--student", "bob", "--force"], cwd=d, env=env,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode != 0 and "python -m autograder grade" in cli.stderr + cli.stdout
    assert {p: p.read_bytes() for p in (d / "autograded").rglob("*") if p.is_file()} == kept
    # the learner fetches the page with the comments
    nbgrader("release_feedback", KEY, cwd=d)
    nbgrader("fetch_feedback", KEY, "--student", "alice", cwd=learner)
    fetched = [p.read_text(encoding="utf-8") for p in (learner / KEY / "feedback").rglob(f"{KEY}.html")]
    assert any("The causal mask could use torch.triu." in f for f in fetched)


@slow
def test_the_final_score_agrees_everywhere_with_names_from_the_roster(course):
    """With a late policy and a roster: do the terminal, the CSV, the LMS files, nbgrader's export, formgrader's
    list and page, and the feedback page give the same final score, and formgrader the roster's names?"""
    import datetime as dt

    d, base = course["dir"], course["base"]
    due = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (d / "roster.csv").write_text("student_id,name\nalice,Ada Lovelace\nbob,\"Builder, Bob\"\ncarol,Carol\n")
    (d / "course.toml").write_text(f'[late]\npolicy = "per_day"\npenalty = 10\n\n[assignments.{KEY}]\n'
                                   f'due = {due}\n\n[lms]\nroster = "roster.csv"\n')
    try:
        exported = run_cli("export", "--assignment", KEY, "--out", str(d))
        assert exported.returncode == 0, exported.stderr[-2000:]
        # alice: 26 less one started day at 10 %; bob: the manual 12 in place of 15, less the same
        expected = {"alice": 23.4, "bob": 20.4, "carol": 0.0}
        assert "alice: 23.4 / 26: automatic 26; late -2.6" in exported.stdout
        assert ("bob: 20.4 / 26: automatic 26; set by hand: scaled_dot_product_attention 12 (automatic 15); "
                "late -2.6") in exported.stdout
        assert {s: float(r["score"]) for s, r in csv_rows(d / f"{KEY}_grades.csv").items()} == expected
        canvas = list(csv.reader(open(d / "exports" / f"{KEY}_canvas.csv", encoding="utf-8")))
        moodle = list(csv.DictReader(open(d / "exports" / f"{KEY}_moodle.csv", encoding="utf-8")))
        assert {r[3]: float(r[5]) for r in canvas[2:]} == expected
        assert {r["Username"]: float(r[KEY]) for r in moodle} == expected
        assert {r[0]: r[3] for r in canvas[2:]}["Ada Lovelace"] == "alice"
        nbgrader("export", "--to", str(base / "late_grades.csv"), cwd=d)
        theirs = {r["student_id"]: r for r in csv.DictReader(open(base / "late_grades.csv", encoding="utf-8"))}
        assert {s: round(float(r["score"]), 4) for s, r in theirs.items()} == expected
        for student, score in expected.items():
            page = (d / "feedback" / student / KEY / f"{KEY}.html").read_text(encoding="utf-8")
            assert f"Score: <b>{score:g} / 26</b>" in page
            view = html.unescape(render_as_formgrader(d / "autograded" / student / KEY / f"{KEY}.ipynb"))
            assert f"Final score {score:g} / 26" in view
        assert "set by hand: scaled_dot_product_attention 12 (automatic 15)" in html.unescape(
            render_as_formgrader(d / "autograded" / "bob" / KEY / f"{KEY}.ipynb"))
        names = {s["id"]: (s["first_name"], s["last_name"]) for s in api(d).get_students()}
        assert names == {"alice": ("Ada", "Lovelace"), "bob": ("Bob", "Builder"), "carol": ("", "Carol")}
    finally:
        (d / "course.toml").unlink()
        assert run_cli("export", "--assignment", KEY, "--out", str(d)).returncode == 0


# --- without grading: the autograded notebook and the gradebook's rules -----------------------------

def fake_result(scores: dict[str, float]):
    """A graded result of 03_qkv with the given part scores (other parts full), one failed check with a hint."""
    from autograder.grading.grader import CheckResult, Result
    from autograder.grading.grader import course_grader

    parts = course_grader(KEY).parts
    result = Result.blank(KEY, "x.ipynb", parts, student="bob", seed=1)
    for part, top in parts.items():
        result.parts[part]["score"] = scores.get(part, top)
    result.score = sum(p["score"] for p in result.parts.values())
    result.checks = [CheckResult("test_x", "scaled_dot_product_attention", "Is it scaled?", 0.0, 1.0, False,
                                 hint="Divide by sqrt(d_k).")]
    return result


def by_gid_of(nb) -> dict:
    """grade_id -> cell of a notebook's nbgrader cells."""
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}


def test_the_autograded_notebook_keeps_only_the_learners_sources():
    """Are locked cells the release's, answers the learner's, added cells kept in place, and nothing else?"""
    from autograder.course.nbgrader_course import autograded_notebook

    release = learner_notebook(KEY)
    nb = reference_notebook(KEY)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") == "test_softmax":
            cell.source = "assert True  # forged"
            meta["points"] = 100
        if meta.get("grade_id") == "softmax":
            meta["points"], meta["grade"] = 50, True  # a solution cell passed off as a grade cell
            cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<script>x()</script>"})]
    add_cell(nb, "def helper():\n    return 1", after_grade_id="softmax")
    nb.cells.append(nbformat.v4.new_raw_cell("<script>raw()</script>", metadata={"format": "text/html"}))
    data = nbformat.writes(nb).encode()

    out = autograded_notebook(release, data, fake_result({"scaled_dot_product_attention": 0}))
    nbformat.validate(out)
    by_gid = {c.metadata["nbgrader"]["grade_id"]: c for c in out.cells if "nbgrader" in c.metadata}
    rel = {c.metadata["nbgrader"]["grade_id"]: c for c in release.cells if "nbgrader" in c.metadata}
    assert set(by_gid) == set(rel)
    for gid, cell in by_gid.items():
        assert cell.metadata == rel[gid].metadata  # no learner metadata, no forged points
        if not rel[gid].metadata["nbgrader"].get("solution"):
            assert cell.source == rel[gid].source  # locked and grade cells: the release's
    assert "np.max" in by_gid["softmax"].source or "max(" in by_gid["softmax"].source  # the learner's answer
    i = next(i for i, c in enumerate(out.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    assert out.cells[i + 1].source.startswith("def helper")
    assert all(c.cell_type != "raw" for c in out.cells) and "raw()" not in nbformat.writes(out)
    shown = [o for c in out.cells if c.cell_type == "code" for o in c.outputs]
    assert len(shown) == 5 and all(o.output_type == "stream" for o in shown)
    sdpa = by_gid[SDPA].outputs[0].text
    assert "0 / 15 points" in sdpa and "[FAILED] Is it scaled? (0 / 1)" in sdpa and "Divide by sqrt(d_k)." in sdpa
    # one hint that several checks give is said under the first, the others point to it by its title: the
    # check's own (ours), whole, as on its line; learner text stays capped
    from autograder.core.limits import DEFAULT
    from autograder.grading.grader import CheckResult
    from autograder.grading.grader import course_grader

    checks = [c for c in course_grader(KEY).checks if c.part == "attention_numpy"]
    assert len(checks) >= 2 and len(checks[0].title) > 80  # long enough to have been cut
    grouped = fake_result({"attention_numpy": 0})
    grouped.checks = [CheckResult(c.name, c.part, c.title, 0.0, c.points, False, hint="Scale by 1/sqrt(d_k).")
                      for c in checks] + [CheckResult("test_y", "attention_numpy", "Y?", 0.0, 1.0, False,
                                                      hint="x" * (DEFAULT.hint_chars + 50))]
    text = by_gid_of(autograded_notebook(release, data, grouped))["test_attention_numpy"].outputs[0].text
    assert text.count("Scale by 1/sqrt(d_k).") == 1
    assert text.count(f'hint: the same as for "{checks[0].title}" above') == len(checks) - 1, text
    assert all(f"] {c.title} (0 / {c.points:g})" in text for c in checks)
    assert "x" * DEFAULT.hint_chars + "… (50 more characters)" in text  # a learner's text: capped
    # bytes that are no notebook: the release notebook, stubs and all
    junk = autograded_notebook(release, b"\x00not json", fake_result({}))
    assert [c.source for c in junk.cells if "nbgrader" in c.metadata] == [c.source for c in rel.values()]


def test_a_manual_score_is_kept_and_flagged_only_when_the_grader_changes_its_mind(tmp_path):
    """Does `record` keep an instructor's score, leave it unflagged over the same automatic score, and flag it
    (needs_review) over a changed one?"""
    from autograder.core.assignments import get_assignment
    from autograder.course import gradebook as gbk

    a = get_assignment(KEY)
    with gbk.open_gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gbk.sync_assignment(gb, a)
        gbk.record(gb, a, "bob", fake_result({"scaled_dot_product_attention": 0}))
        grade = gb.find_grade(SDPA, KEY, KEY, "bob")
        grade.manual_score, grade.needs_manual_grade = 10, False  # formgrader's GradeHandler.put
        gb.db.commit()
        gbk.record(gb, a, "bob", fake_result({"scaled_dot_product_attention": 0}))
        [row] = gbk.rows(gb, a, {})
        assert (row["score"], row["auto_score"], row["manual"], row["needs_review"]) == (21, 11, True, False)
        assert not gb.find_submission_notebook(KEY, KEY, "bob").flagged
        gbk.record(gb, a, "bob", fake_result({}))
        [row] = gbk.rows(gb, a, {})
        assert (row["score"], row["auto_score"], row["manual"], row["needs_review"]) == (21, 26, True, True)
        assert gb.find_submission_notebook(KEY, KEY, "bob").flagged
        assert gbk.part_grades(gb, a, "bob")["scaled_dot_product_attention"] == {
            "score": 10.0, "auto": 15.0, "manual": 10.0, "max_score": 15.0}


def test_a_new_gradebook_is_stamped_with_the_revision_nbgrader_stamps(tmp_path, monkeypatch):
    """Is a gradebook the grader creates (reading nbgrader's migration head in its own process, not by
    running the `alembic` command) stamped with the revision that nbgrader's own `alembic heads` gives,
    so that nbgrader's tools take it as current?"""
    import sqlite3

    from autograder.course import gradebook as gbk
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    expected = gbk._nbgrader_alembic_version()  # nbgrader's function: runs `alembic heads`
    with gbk.open_gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}"):
        pass
    with sqlite3.connect(tmp_path / "gradebook.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(expected,)]


def test_a_regrade_without_the_exchange_files_keeps_the_learners_secret(tmp_path):
    """Does a notebook graded again without its submission_secret.txt (a copy of the notebook alone) keep the
    secret of the learner's earlier grade, under which release_feedback publishes the page that fetch_feedback
    looks for, and a learner graded for the first time get a secret of their own?"""
    from autograder.course.nbgrader_course import write_feedback_companions

    secret = tmp_path / "feedback" / "bob" / KEY / "submission_secret.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("from-the-exchange")
    write_feedback_companions(tmp_path, KEY, "bob", None, 1_700_000_000.0)
    assert secret.read_text() == "from-the-exchange"
    write_feedback_companions(tmp_path, KEY, "carol", None, 1_700_000_000.0)
    write_feedback_companions(tmp_path, KEY, "dave", None, 1_700_000_000.0)
    fresh = [(tmp_path / "feedback" / s / KEY / "submission_secret.txt").read_text() for s in ("carol", "dave")]
    assert all(len(f) == 32 for f in fresh) and fresh[0] != fresh[1]
