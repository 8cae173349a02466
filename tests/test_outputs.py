"""Fast checks (no grading) of what learners can put into the instructor's outputs: the escaping
per medium (terminal and log, HTML, CSV, JSON), the caps, and the student id and folder rule."""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from autograder.commands import SafeFormatter, find_submissions, read_claim
from autograder.feedback import bounded, feedback_html, format_text
from autograder.gradebook import write_csv
from autograder.grader import CheckResult, Result
from autograder.limits import DEFAULT
from autograder.text import csv_cell, safe, student_id_problem, visible

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


# --- the folder rule --------------------------------------------------------------------------

def _touch(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "subs"
    for rel in ("alice.ipynb", "a_b.ipynb", "a b.ipynb", "..ipynb", "...ipynb", "03_qkv.ipynb", "Casey.ipynb",
                "casey.ipynb", "README.txt", ".DS_Store", "bob/03_qkv/03_qkv.ipynb", "bob/03_qkv/timestamp.txt",
                "bob/03_qkv/.ipynb_checkpoints/03_qkv-checkpoint.ipynb", "bob/03_qkv/scratch.ipynb",
                "carol/03_qkv.ipynb", "twice/03_qkv.ipynb", "twice/03_qkv/03_qkv.ipynb", "mallory.ipynb",
                "mallory/03_qkv/.hidden/alice/03_qkv/03_qkv.ipynb", "mallory/.x/carol.ipynb", ".hidden/bob.ipynb",
                "deep/03_qkv/a/b/c/03_qkv.ipynb", ".ipynb_checkpoints/alice-checkpoint.ipynb",
                "evil\x1b]0;t\x07.ipynb", "03_qkv/03_qkv.ipynb"):
        _touch(d / rel)
    os.symlink("/dev/zero", d / "zero.ipynb")
    os.symlink(d / "alice.ipynb", d / "copycat.ipynb")
    os.symlink(tmp_path, d / "linkdir")
    os.mkfifo(d / "fifo.ipynb")
    (d / "dave").mkdir()
    os.symlink(d / "alice.ipynb", d / "dave" / "03_qkv.ipynb")
    os.symlink(d / "bob", d / "erin")  # a student "folder" that is a link to another's
    return d


def test_the_folder_rule(folder):
    scan = find_submissions([str(folder)], KEY)
    found = {f.student: f for f in scan.found}
    graded = {s for s, f in found.items() if not f.problem}
    assert graded == {"alice", "a_b", "bob", "carol", "mallory"}
    assert found["bob"].claim.parts == ("bob", KEY, f"{KEY}.ipynb")
    assert found["carol"].claim.parts == ("carol", f"{KEY}.ipynb")
    # the hidden forgery flags its owner and claims nobody
    assert any(".hidden" in f for f in found["mallory"].flags) and any(".x" in f for f in found["mallory"].flags)
    assert any("scratch.ipynb" in f for f in found["bob"].flags)
    # links, FIFOs: that student's error, never opened, never another's notebook
    for name, words in (("zero", "symbolic link"), ("copycat", "symbolic link"), ("fifo", "FIFO"),
                        ("dave", "symbolic link")):
        assert words in found[name].problem and found[name].claim is not None, name
    # two notebooks for one id, or ids differing in case: neither graded, both files named
    assert "twice/03_qkv.ipynb" in found["twice"].problem and "twice/03_qkv/03_qkv.ipynb" in found["twice"].problem
    assert found["twice"].claim is None
    assert found["Casey"].claim is None and found["casey"].claim is None and "case" in found["casey"].problem
    # a folder with no notebook at the layout's place
    assert found["deep"].claim is None and "no notebook" in found["deep"].problem
    assert any("below the layout" in f for f in found["deep"].flags)
    rejected = {r.path.rsplit("/", 1)[-1]: r for r in scan.rejected}
    for name in ("a b.ipynb", "..ipynb", "...ipynb", "03_qkv.ipynb", ".hidden", "linkdir", "erin", "03_qkv",
                 "evil\\x1b]0;t\\x07.ipynb"):
        assert name in rejected, (name, sorted(rejected))
    assert scan.rejected_total == len(scan.rejected)
    assert not any(unsafe_chars(r.path + r.reason) for r in scan.rejected)
    # Jupyter's checkpoints, README.txt, .DS_Store, timestamp.txt: silently passed over
    assert not any("checkpoint" in r.path or "README" in r.path or "DS_Store" in r.path or "timestamp" in r.path
                   for r in scan.rejected)


def test_rejected_entries_are_counted_beyond_the_cap(tmp_path):
    d = tmp_path / "subs"
    _touch(d / "zoe.ipynb")
    for i in range(DEFAULT.rejected_shown + 30):
        _touch(d / "zoe" / f".spam{i}.ipynb")
    others = DEFAULT.rejected_shown - DEFAULT.flags
    for i in range(others):
        _touch(d / f"bad name {i}.ipynb")
    scan = find_submissions([str(d)], KEY)
    # one learner's folder fills at most `flags` places of the list: it cannot hide the others
    assert len([r for r in scan.rejected if r.student == "zoe"]) == DEFAULT.flags
    assert len(scan.rejected) == DEFAULT.rejected_shown and scan.rejected_total == DEFAULT.rejected_shown + 30 + others
    _touch(d / "one more.ipynb")
    scan = find_submissions([str(d)], KEY)
    assert len(scan.rejected) == DEFAULT.rejected_shown and scan.rejected_total == DEFAULT.rejected_shown + 31 + others
    (zoe,) = scan.found
    assert len(zoe.flags) == DEFAULT.flags + 1 and zoe.flags[-1].startswith("… 75 more")


def test_files_given_directly(tmp_path):
    d = tmp_path / "submitted"
    nb = _touch(d / "alice" / KEY / f"{KEY}.ipynb")
    flat = _touch(tmp_path / "bob.ipynb")
    os.symlink(flat, tmp_path / "link.ipynb")
    bad = _touch(tmp_path / "a b.ipynb")
    scan = find_submissions([str(nb), str(flat), str(tmp_path / "link.ipynb"), str(bad), str(d)], KEY)
    found = {f.student: f for f in scan.found}
    assert set(found) == {"alice", "bob", "link"}
    assert not found["alice"].problem  # the same file reached twice is one submission
    assert "symbolic link" in found["link"].problem
    assert [r.path for r in scan.rejected] == [str(bad)]


def test_the_out_folder_inside_the_submissions_is_skipped(tmp_path):
    d = tmp_path / "subs"
    _touch(d / "alice.ipynb")
    _touch(d / "grading" / "feedback" / "alice" / f"{KEY}.html")
    scan = find_submissions([str(d)], KEY, out=d / "grading")
    assert [f.student for f in scan.found] == ["alice"] and scan.rejected == []


def test_reading_never_follows_a_link_or_blocks_on_a_fifo(folder, tmp_path):
    scan = find_submissions([str(folder)], KEY)
    found = {f.student: f for f in scan.found}
    done = {}

    def read_all():
        for name in ("zero", "fifo", "dave", "copycat"):
            done[name] = read_claim(found[name].claim, DEFAULT.notebook_bytes)

    t = threading.Thread(target=read_all, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO or /dev/zero blocked"
    assert all(r.data is None and r.problem for r in done.values())
    assert "FIFO" in done["fifo"].problem and "symbolic link" in done["zero"].problem
    ok = read_claim(found["alice"].claim, DEFAULT.notebook_bytes)
    assert ok.data == b"{}" and len(ok.digest) == 64
    # a folder swapped for a link after the scan is not followed either
    bob = found["bob"].claim
    os.rename(folder / "bob", tmp_path / "bob_moved")
    os.symlink(tmp_path / "bob_moved", folder / "bob")
    assert "symbolic link" in read_claim(bob, DEFAULT.notebook_bytes).problem
    big = _touch(folder / "big.ipynb", "x" * 2000)
    r = read_claim(find_submissions([str(big)], KEY).found[0].claim, 1000)
    assert r.data is None and "MiB" in r.problem and r.digest


def test_flag_lists_keep_their_own_count():
    from autograder.feedback import bounded_flags

    flags = [f"entry {i}" for i in range(DEFAULT.flags)] + ["… 2,995 more entries of its folder not graded"]
    assert bounded_flags(flags) == flags
    many = bounded_flags([HOSTILE] * 100)
    assert len(many) == DEFAULT.flags + 1 and many[-1] == "… 95 more reasons" and not unsafe_chars("".join(many))
