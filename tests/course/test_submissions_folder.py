"""The rule of the submissions folder (`autograder.course.submissions`): which notebook is whose, what is
rejected and why, and that reading a claimed notebook never follows a link, never blocks on a
FIFO and never reads past the cap. Fast: nothing is graded."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from autograder.core.limits import DEFAULT
from autograder.course.submissions import find_submissions, read_claim

KEY = "03_qkv"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def unsafe_chars(text: str) -> list[str]:
    """Characters a terminal obeys instead of showing (newline and tab allowed), and bidi controls."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c in BIDI]


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


def test_a_course_folder_with_several_assignments(tmp_path):
    """Does a course folder holding two assignments per learner (nbgrader's submitted/STUDENT/KEY/, or
    STUDENT/KEY.ipynb) grade each assignment without flagging anyone for the other, while anything
    else in a learner's folder still flags that learner?"""
    d = tmp_path / "submitted"
    for rel in ("ana/03_qkv/03_qkv.ipynb", "ana/03_qkv/timestamp.txt", "ana/06_transformer/06_transformer.ipynb",
                "ana/06_transformer/timestamp.txt", "ben/03_qkv.ipynb", "ben/06_transformer.ipynb",
                "cy/06_transformer/06_transformer.ipynb", "dee/03_qkv/03_qkv.ipynb", "dee/notes/06_transformer.ipynb",
                "eve/03_qkv/03_qkv.ipynb", "eve/03_qkv/06_transformer.ipynb"):
        _touch(d / rel)
    for key, graded in (("03_qkv", {"ana", "ben", "dee", "eve"}), ("06_transformer", {"ana", "ben", "cy"})):
        scan = find_submissions([str(d)], key)
        found = {f.student: f for f in scan.found}
        assert {s for s, f in found.items() if f.claim and not f.problem} == graded, key
        assert {s for s, f in found.items() if f.flags} == {"dee", "eve"} - ({"eve"} if key != "03_qkv" else set()), key
        assert [r.path for r in scan.rejected if r.student in ("ana", "ben", "cy")] == [], key
    # a misplaced notebook is no other assignment: `notes/` flags dee under either key, and under 03
    # a notebook of 06 inside 03's own folder flags eve (it is not where either assignment's would be)
    assert any("notes" in flag for flag in {f.student: f for f in find_submissions([str(d)], "06_transformer").found}["dee"].flags)


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
    _touch(d / "grading" / "feedback" / "alice" / KEY / f"{KEY}.html")
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
