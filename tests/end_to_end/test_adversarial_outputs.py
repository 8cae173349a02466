"""What a learner can put into the instructor's outputs: every attack of tests/attacks/outputs.py,
graded in the one adversarial batch (the session fixture `batch` in conftest.py).

Floods stay within the documented sizes (`autograder/core/limits.py`: notes, note_chars, hint_chars,
error_chars, rejected_shown, flags, result_bytes); no control character reaches the terminal, the
log or the JSON; no CSV cell starts a formula; no learner markup reaches a feedback page unescaped.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from attacks import KEY
from attacks.outputs import BAD_BYTES, BAD_NAMES, FLOODED, SPAM_FILES
from autograder.core.limits import DEFAULT
from autograder.core.text import FORMULA_START, safe

BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unsafe_chars(text: str) -> list[str]:
    """Characters a terminal obeys instead of showing: C0 but newline and tab, DEL, C1, bidi controls."""
    return sorted({c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c in BIDI})


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _page(batch, name) -> str:
    return (batch["out"] / "feedback" / name / KEY / f"{KEY}.html").read_text(encoding="utf-8")


def _result_file(batch, name) -> Path:
    return batch["out"] / "results" / KEY / f"{name}.json"


# --- floods: bounded sizes ----------------------------------------------------------------------

@pytest.mark.parametrize("name", FLOODED)
def test_floods_stay_within_the_documented_sizes(batch, name):
    r = batch["by"][name]
    assert r["status"] == "graded", r["error"]
    assert len(_page(batch, name).encode()) < DEFAULT.result_bytes
    assert _result_file(batch, name).stat().st_size < DEFAULT.result_bytes
    assert len(json.dumps(r)) < DEFAULT.result_bytes
    assert len(r["notes"]) <= DEFAULT.notes + 1
    assert all(len(n) <= DEFAULT.note_chars + 40 for n in r["notes"])
    assert all(len(c["hint"]) <= DEFAULT.hint_chars + 40 for c in r["checks"])


def test_fifty_thousand_load_errors_are_summarised(batch):
    r = batch["by"]["flood_load_errors"]
    assert r["score"] == r["max_score"]  # a correct notebook keeps its grade
    assert "more" in r["notes"][-1] and len(r["notes"]) == DEFAULT.notes + 1
    assert len(batch["by"]["flood_syntax_cells"]["notes"]) == DEFAULT.notes + 1


def test_a_message_of_megabytes_is_cut(batch):
    r = batch["by"]["huge_message"]
    failed = [c for c in r["checks"] if not c["passed"]]
    assert failed and all("raised ValueError" in c["hint"] for c in failed if c["part"] == "softmax")
    assert all(len(c["hint"]) < 1000 for c in failed)
    assert any("more characters" in c["hint"] or len(c["hint"]) <= DEFAULT.hint_chars for c in failed)


def test_the_whole_json_output_is_bounded(batch):
    data = batch["data"]
    text = json.dumps(data, indent=2)
    bound = len(data["submissions"]) * DEFAULT.result_bytes + DEFAULT.rejected_shown * 8 * 1024
    assert len(text) < bound
    assert len(data["rejected"]) <= DEFAULT.rejected_shown
    # and in practice: tens of KB per submission, floods included
    assert max(len(json.dumps(r)) for r in data["submissions"]) < 64 * 1024


# --- terminal, log, JSON: no control characters ---------------------------------------------------

def test_no_control_character_reaches_the_terminal(batch):
    err = batch["stderr"]
    assert unsafe_chars(err) == []
    assert "\\x1b" in err  # the escapes are shown, not obeyed (the forged grade ids' reason)
    assert not any(line.startswith("mallory: 23 / 23") for line in err.splitlines())
    # one line per learner, per rejected entry (listed ones), and a few of the grader's own
    assert len(err.splitlines()) < len(batch["by"]) + DEFAULT.rejected_shown + 20


def test_no_control_character_in_the_json_or_the_log(batch):
    bad = [s[:80] for s in _strings(batch["data"]) if unsafe_chars(s)]
    assert bad == []
    for f in (batch["out"] / "results" / KEY).glob("*.json"):
        assert not [s for s in _strings(json.loads(f.read_text(encoding="utf-8"))) if unsafe_chars(s)], f.name
    log = Path(batch["data"]["log"]).read_text(encoding="utf-8")
    assert unsafe_chars(log) == []


def test_escapes_in_a_grade_id_are_shown_as_text(batch):
    r = batch["by"]["escape_grade_ids"]
    assert r["status"] == "error" and "forged" in r["error"]
    assert "\\x1b[1A\\x1b[2K\\x0dmallory: 23 / 23\\x0a" in r["error"] and "\\x1b]52;c;" in r["error"]
    assert "\\x9b31m\\x7f\\u202e" in r["error"]
    line = next(ln for ln in batch["stderr"].splitlines() if ln.startswith("escape_grade_ids: "))
    assert "(ERROR: forged" in line and len(line) < DEFAULT.progress_chars + 200


def test_escapes_in_notes_and_hints_are_shown_as_text(batch):
    r = batch["by"]["escape_in_notes"]
    assert r["status"] == "graded" and r["score"] < r["max_score"]
    notes, hints = " ".join(r["notes"]), " ".join(c["hint"] for c in r["checks"])
    assert "\\x1b]0;graded" in notes and "\\x1b]52;c;" in hints
    assert not unsafe_chars(notes + hints)


@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
def test_a_hostile_file_name_is_rejected_and_shown_escaped(batch, kind):
    shown = safe(str(batch["subs"] / BAD_NAMES[kind]), DEFAULT.path_chars)
    assert "\\x" in shown or "\\u" in shown
    entry = next((r for r in batch["data"]["rejected"] if r["path"] == shown), None)
    assert entry is not None and "not a student id" in entry["reason"]
    assert f"rejected: {shown}" in batch["stderr"]


def test_a_file_name_that_is_not_utf8_is_rejected_and_shown_as_bytes(batch):
    assert any(r["path"].endswith("latin1-\\xff\\xfe.ipynb") for r in batch["data"]["rejected"])
    assert "latin1-\\xff\\xfe.ipynb" in batch["stderr"]
    assert BAD_BYTES.startswith(b"latin1-")


def test_thousands_of_rejected_entries_are_counted_not_listed(batch):
    r = batch["by"]["spammer"]
    assert r["status"] == "graded" and r["score"] == r["max_score"]
    assert len(r["flags"]) == DEFAULT.flags + 1 and f"{SPAM_FILES - DEFAULT.flags:,} more" in r["flags"][-1]
    assert len([e for e in batch["data"]["rejected"] if e["student"] == "spammer"]) <= DEFAULT.flags
    assert batch["data"]["rejected_total"] >= SPAM_FILES
    assert "more entries" in batch["stderr"] or batch["data"]["rejected_total"] <= DEFAULT.rejected_shown


# --- CSV and HTML ----------------------------------------------------------------------------------

def test_no_csv_cell_starts_a_formula(batch):
    rows = list(csv.reader(batch["csv"]))
    header = rows[0]
    numeric = [i for i, h in enumerate(header) if h in ("score", "max_score") or h.startswith("test_")]
    for row in rows[1:]:
        assert len(row) == len(header)
        for i, cell in enumerate(row):
            assert not cell.startswith(FORMULA_START), (row[0], header[i], cell[:80])
            assert not unsafe_chars(cell)
        for i in numeric:
            float(row[i])  # numbers stay numbers
    formula = next(r for r in rows if r[0] == "csv_formula")
    reason = formula[header.index("reason")]
    assert formula[header.index("status")] == "error" and "HYPERLINK" in reason and "forged" in reason


def test_no_learner_markup_reaches_a_feedback_page(batch):
    for page_path in (batch["out"] / "feedback").rglob("*.html"):
        page = page_path.read_text(encoding="utf-8")
        for tag in ("<script", "<img", "<iframe", "<a href"):
            assert tag not in page, (page_path.parent.name, tag)
        assert not unsafe_chars(page.replace("\n", ""))
    page = _page(batch, "html_injection")
    assert "&lt;script&gt;alert(&#x27;xss&#x27;)&lt;/script&gt;" in page  # shown as text
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    r = batch["by"]["html_injection"]
    assert r["status"] == "graded" and r["score"] < r["max_score"]
