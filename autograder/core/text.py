"""Learner text made safe for each place the grader writes it, and capped.

Learners control exception messages, grade ids, cell sources and file names; all of them
can reach the instructor's terminal, the log, the feedback pages, the results and the CSV.

* `visible` replaces every character a terminal or a text viewer would obey instead of
  show: C0 controls (newline and tab included), DEL, C1 controls, the bidi overrides,
  embeddings, isolates and marks (which reorder text), the line and paragraph separators,
  and lone surrogates (bytes of a file name that are not UTF-8) by a visible escape such
  as ``\\x1b`` or ``\\u202e``. `visible(s, keep="\\n")` keeps newlines (multi-line log records).
* `clip` cuts a text to a number of characters, saying how many were dropped.
* `safe` is both: what one field of learner text becomes in every output.
* `csv_cell` neutralises spreadsheet formulas; HTML is escaped with `html.escape` after `safe`.
"""

from __future__ import annotations

import re

ELLIPSIS = "…"

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
# A cell starting with one of these is a formula in Excel, LibreOffice or Google Sheets
# (the full-width forms too, in some locales).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def _escape(ch: str) -> str:
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): show the byte
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def visible(text, keep: str = "") -> str:
    """`text` with every control, bidi and separator character replaced by a visible escape."""
    text = text if isinstance(text, str) else str(text)
    if keep:
        return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m.group()), text)
    return _UNSAFE.sub(lambda m: _escape(m.group()), text)


def clip(text: str, limit: int) -> str:
    """At most `limit` characters of `text`, then "… (N more characters)" if any were dropped."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"{ELLIPSIS} ({len(text) - limit:,} more characters)"


def safe(text, limit: int) -> str:
    """One field of learner text for any output: visible escapes, at most `limit` characters
    (escapes included), then "… (N more characters)". Only what is kept is looked at, so the
    cost is bounded by `limit` whatever the length of `text`."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit and not _UNSAFE.search(text):
        return text
    out, used = [], 0
    for i, ch in enumerate(text):
        piece = _escape(ch) if _UNSAFE.match(ch) else ch
        if used + len(piece) > limit:
            return "".join(out) + f"{ELLIPSIS} ({len(text) - i:,} more characters)"
        out.append(piece)
        used += len(piece)
    return "".join(out)


def safe_list(items, count: int, chars: int, what: str = "more", dropped: int = 0) -> list[str]:
    """At most `count` items, each `safe`, and a last item counting the rest ("… N more"),
    `dropped` items already left out before included."""
    items = list(items) if not isinstance(items, list) else items
    out = [safe(s, chars) for s in items[:count]]
    more = max(len(items) - count, 0) + dropped
    if more:
        out.append(f"{ELLIPSIS} {more:,} {what}")
    return out


def csv_cell(value, limit: int | None = None):
    """A CSV cell a spreadsheet shows as text: numbers unchanged; text `safe`, and prefixed with
    an apostrophe when it would start a formula (=, +, -, @, tab, CR, LF, full-width forms)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = visible(value) if limit is None else safe(value, limit)
    if text.startswith(FORMULA_START):
        text = "'" + text
    return text


# --- student ids ------------------------------------------------------------------------

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}")
STUDENT_ID_RULE = ("1 to 100 characters: ASCII letters, digits, '_', '.', '@' and '-', starting "
                   "with a letter or digit, without '..'")


def student_id_problem(name: str, key: str | None = None) -> str:
    """Why `name` is not a student id (empty if it is one). Names are never rewritten into ids:
    `a b` and `a_b` would collide."""
    if not STUDENT_ID.fullmatch(name):
        return f"{safe(name, 120)} is not a student id ({STUDENT_ID_RULE})"
    if ".." in name:
        return f"{name} is not a student id (it contains '..')"
    if key is not None and name.lower() == key.lower():
        return (f"{name} is the exercise's name, not a student's: give the folder that holds one "
                "folder (or notebook) per student")
    return ""


__all__ = ["visible", "clip", "safe", "safe_list", "csv_cell", "student_id_problem", "STUDENT_ID",
           "STUDENT_ID_RULE", "FORMULA_START", "json_for_stdout"]


def json_for_stdout(data) -> str:
    """JSON for stdout: ASCII only (json escapes C0, C1 and bidi characters), DEL escaped too."""
    import json

    return json.dumps(data, indent=2).replace("\x7f", "\\u007f")
