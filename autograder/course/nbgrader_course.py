"""An nbgrader course folder: the source and release notebooks, and each learner's autograded one.

nbgrader's tools read fixed places below the course folder (`grade --out DIR`):
``source/KEY/KEY.ipynb`` (formgrader lists an assignment only when it has one),
``release/KEY/KEY.ipynb`` (what ``nbgrader release_assignment`` hands out), and
``autograded/STUDENT/KEY/KEY.ipynb`` (the notebook formgrader's manual-grading page shows).

The autograded notebook is built as nbgrader's OverwriteCells would build it, but from
nothing the learner can make live: locked and grade cells come from the release notebook,
a solution cell keeps only the learner's source (under the release cell's metadata), and
cells the learner added keep only their source, markdown shown as literal text. No learner
output, attachment, metadata or raw cell survives, and every source is capped. Each grade
cell gets one plain-text output: the hidden checks of its part, passed or not, with their
points and hints, so the instructor grading by hand sees why the grader gave what it gave;
and the notebook opens with a summary cell (`summary_cell`, rewritten by every `export`): the
final score as the CSV and the feedback page give it, and what made it.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import nbformat

from ..core.assignments import Assignment
from ..core.limits import DEFAULT, Limits
from ..core.regular_file import read_regular
from ..core.text import safe

SOURCE_CHARS = 100_000        # one cell's source, as shown to the instructor
LEARNER_CELLS = 500           # cells of the learner's notebook looked at
TIMESTAMP_BYTES = 200         # nbgrader's timestamp.txt is one line of about 26 characters


def release_notebook(assignment: Assignment) -> nbformat.NotebookNode:
    """The learner notebook as released: the generated exercises/KEY.ipynb, nbgrader metadata included."""
    return nbformat.read(str(assignment.notebook), as_version=4)


def write_release(out: Path, assignment: Assignment) -> list[Path]:
    """OUT/source/KEY/KEY.ipynb and OUT/release/KEY/KEY.ipynb (rewritten only when they differ)."""
    text = nbformat.writes(release_notebook(assignment))
    written = []
    for folder in ("source", "release"):
        path = out / folder / assignment.key / f"{assignment.key}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            same = path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            _write_atomic(path, text)
        written.append(path)
    return written


def release_into(out: Path, assignments, url: str) -> list[str]:
    """Each assignment's source and release notebooks into the course folder `out`, and its cells
    into the gradebook at `url`; the lines that say what was written."""
    from . import gradebook as gbk

    said = []
    with gbk.open_gradebook(url) as gb:
        for a in assignments:
            said += [f"wrote {path}" for path in write_release(out, a)]
            gbk.sync_assignment(gb, a)
    return said


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _source(value) -> str:
    if isinstance(value, list):
        value = "".join(v for v in value[:100_000] if isinstance(v, str))
    if not isinstance(value, str):
        return ""
    return value if len(value) <= SOURCE_CHARS else value[:SOURCE_CHARS] + "\n# … (cut: the cell is longer)\n"


def _learner_cells(data: bytes | None) -> list[dict]:
    """The learner's cells as {"type", "source", "grade_id"}; [] when the bytes are no notebook (read by
    the grader's one reader, `notebook.parse_notebook`: what it refuses is not shown here either)."""
    from ..core.notebook import NotebookError, parse_notebook

    if not data:
        return []
    try:
        nb = parse_notebook(data, "submission.ipynb")
    except NotebookError:
        return []
    out = []
    for cell in nb.cells[:LEARNER_CELLS]:
        nbg = cell["metadata"].get("nbgrader")
        gid = nbg.get("grade_id") if isinstance(nbg, dict) else None
        out.append({"type": cell["type"], "source": _source(cell["source"]),
                    "grade_id": gid if isinstance(gid, str) else None})
    return out


def inert_markdown(text: str) -> str:
    """Learner markdown as a fenced block of literal text: no HTML, link, image or math is rendered."""
    # one tilde more than the longest run of them in the text (found in one pass: a cell of 100,000 tildes
    # once cost seconds here, growing the fence a tilde at a time)
    longest = max((len(run) for run in re.findall(r"~+", text)), default=0)
    fence = "~" * max(3, longest + 1)
    return f"*Markdown cell added or changed by the learner, shown as text:*\n\n{fence}\n{text}\n{fence}"


def _plain(cell_type: str, source: str) -> nbformat.NotebookNode:
    if cell_type == "code":
        return nbformat.v4.new_code_cell(source)
    return nbformat.v4.new_markdown_cell(inert_markdown(source))


def _checks_text(part: str, result, limits: Limits) -> str:
    lines = []
    s = result.parts.get(part)
    if s is not None:
        lines.append(f"Hidden checks of {safe(part, 100)}: {s['score']:g} / {s['max_score']:g} points")
    first = {}  # a hint -> the title of the part's first check that gives it: said once, the others point to it
    for c in result.checks:
        if c.part != part:
            continue
        mark = "passed" if c.passed else ("GRADER ERROR" if c.grader_error else "FAILED")
        # a check's title is ours (its docstring), never cut below what its own line shows: the line that
        # points to it names it as that line does
        title = safe(c.title, limits.hint_chars)
        lines.append(f"  [{mark}] {title} ({c.points:g} / {c.max_points:g})")
        if not c.passed and c.hint and c.hint in first:
            lines.append(f"      hint: the same as for \"{first[c.hint]}\" above")
        elif not c.passed and c.hint:
            first[c.hint] = title
            lines.append(f"      hint: {safe(c.hint, limits.hint_chars)}")
    if result.status != "graded":
        lines.append(f"Not graded ({safe(result.status, 40)}): {safe(result.error, limits.error_chars)}")
    return "\n".join(lines) + "\n"


def autograded_notebook(release: nbformat.NotebookNode, data: bytes | None, result,
                        limits: Limits = DEFAULT) -> nbformat.NotebookNode:
    """The notebook formgrader shows for one submission (see the module docstring).

    The release notebook's cells keep their order; each learner cell matched by grade id, in
    order, places its source into a solution cell; the learner's other cells go where they stood
    (a cell whose source equals a release cell without nbgrader metadata is that release cell)."""
    rel_cells = release.cells
    by_gid = {c.metadata["nbgrader"]["grade_id"]: i for i, c in enumerate(rel_cells)
              if "nbgrader" in c.metadata and "grade_id" in c.metadata["nbgrader"]}
    plain_sources = {(c.cell_type, c.source): i for i, c in enumerate(rel_cells) if "nbgrader" not in c.metadata}
    cells, done = [], set()
    nxt = 0  # the next release cell not placed yet

    def place_release_until(j: int) -> None:
        nonlocal nxt
        while nxt < j:
            if nxt not in done and ("nbgrader" in rel_cells[nxt].metadata):
                cells.append(copy.deepcopy(rel_cells[nxt]))
                done.add(nxt)
            nxt += 1

    for lc in _learner_cells(data):
        j = by_gid.get(lc["grade_id"]) if lc["grade_id"] else None
        if j is not None and j not in done and j >= nxt:
            place_release_until(j)
            cell = copy.deepcopy(rel_cells[j])
            meta = cell.metadata["nbgrader"]
            if meta.get("solution") and not meta.get("locked") and lc["type"] == cell.cell_type:
                cell.source = lc["source"] if cell.cell_type == "code" else inert_markdown(lc["source"])
            cells.append(cell)
            done.add(j)
            nxt = j + 1
            continue
        k = plain_sources.get((lc["type"], lc["source"]))
        if k is not None and k not in done:
            cells.append(copy.deepcopy(rel_cells[k]))
            done.add(k)
            continue
        if lc["type"] == "raw" or not lc["source"].strip():
            continue  # a raw cell's HTML never reaches the page; empty cells say nothing
        cells.append(_plain(lc["type"], lc["source"]))
    place_release_until(len(rel_cells))

    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.pop("attachments", None)
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and cell.cell_type == "code":
            part = meta["grade_id"][len("test_"):] if meta["grade_id"].startswith("test_") else meta["grade_id"]
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=_checks_text(part, result, limits))]
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(release.metadata))
    nb.metadata.pop("widgets", None)
    return nb


def _beside(claim, name: str) -> bytes | None:
    """The small file `name` beside the submission's notebook, read as learner bytes are: at most
    TIMESTAMP_BYTES, never through a link; None when there is none or it is not a small regular file.
    Only in a student's own folder: beside a flat DIR/STUDENT.ipynb it would be everyone's."""
    if claim is None or len(claim.parts) < 2:
        return None
    got = read_regular(claim.base, tuple(claim.parts[:-1]) + (name,), TIMESTAMP_BYTES)
    if got.data is None or got.over(TIMESTAMP_BYTES):
        return None
    return got.data


def learners_timestamp(claim) -> bytes | None:
    """The submission's timestamp.txt as the learner's `nbgrader submit` left it (`_beside`): what
    nbgrader's formgrader reads in submitted/STUDENT/KEY/, never parsed here."""
    return _beside(claim, "timestamp.txt")


def timestamp_bytes(claim) -> bytes | None:
    """The submission's timestamp.txt (nbgrader's submit writes it; `_beside`), copied for nbgrader's tools
    only where it names a time that `deadlines.submission_time` accepts and nbgrader reads too (None
    otherwise: the file time is then written in nbgrader's format). A refused time (out of range, in the
    future, unreadable) never reaches formgrader or release_feedback, which read every learner's."""
    import datetime as dt

    from .deadlines import EARLIEST, FUTURE_SLACK, parse_timestamp

    stamp = _beside(claim, "timestamp.txt")
    if stamp is None:
        return None
    try:
        when = parse_timestamp(stamp.decode("utf-8")).astimezone(dt.timezone.utc)
        if not EARLIEST <= when <= dt.datetime.now(dt.timezone.utc) + FUTURE_SLACK:
            return None
        theirs = nbgrader_time(stamp)
        if theirs is not None and abs((theirs - when.replace(tzinfo=None)).total_seconds()) < 1:
            return stamp
        # nbgrader reads it otherwise (a zone name it drops) or not at all: the time we read, as nbgrader writes it
        return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC").encode()
    except Exception:  # noqa: BLE001 - learner bytes
        return None


def _one_line(data: bytes) -> str:
    return "".join(ch for ch in data.decode("utf-8", "replace") if ch.isprintable()).strip()


def write_feedback_companions(out: Path, key: str, student: str, claim, mtime: float | None) -> None:
    """timestamp.txt and submission_secret.txt beside the feedback page, where nbgrader's
    release_feedback reads them (it names the released page by a hash of the secret, which
    fetch_feedback finds again). A submission that did not come through the exchange gets its
    file time and the secret of the learner's earlier grade, else a fresh one, so that
    release_feedback runs for everyone."""
    import secrets as _secrets

    folder = out / "feedback" / student / key
    folder.mkdir(parents=True, exist_ok=True)
    stamp = timestamp_bytes(claim)
    if stamp is not None:
        stamp_text = _one_line(stamp)
    else:
        from .deadlines import file_time

        when = file_time(mtime or None)
        stamp_text = when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    secret = _beside(claim, "submission_secret.txt")
    secret_text = _one_line(secret) if secret is not None else ""
    if not secret_text:  # the secret of this learner's earlier grade (a regrade from a copy of the notebook
        # alone would otherwise change it, and release_feedback would publish where fetch_feedback never looks)
        kept = read_regular(out, ("feedback", student, key, "submission_secret.txt"), TIMESTAMP_BYTES)
        secret_text = _one_line(kept.data) if kept.data is not None and not kept.over(TIMESTAMP_BYTES) else ""
    if not secret_text:
        secret_text = _secrets.token_hex(16)
    _write_atomic(folder / "timestamp.txt", stamp_text)
    _write_atomic(folder / "submission_secret.txt", secret_text)


def nbgrader_time(stamp: bytes | None):
    """The time nbgrader reads from a timestamp.txt (`nbgrader.utils.parse_utc`: naive UTC), or None when
    there is none or nbgrader could not read it either: what the gradebook must hold for formgrader to
    count the submission as autograded."""
    if stamp is None:
        return None
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(stamp.decode("utf-8").strip())
    except Exception:  # noqa: BLE001 - learner bytes; dateutil raises several kinds
        return None


def write_autograded(out: Path, assignment: Assignment, student: str, data: bytes | None, result,
                     stamp: bytes | None = None, limits: Limits = DEFAULT,
                     release: nbformat.NotebookNode | None = None) -> Path:
    """OUT/autograded/STUDENT/KEY/KEY.ipynb, and its timestamp.txt when the submission had one (`stamp`,
    from `timestamp_bytes`)."""
    key = assignment.key
    folder = out / "autograded" / student / key
    folder.mkdir(parents=True, exist_ok=True)
    nb = autograded_notebook(release if release is not None else release_notebook(assignment), data, result, limits)
    path = folder / f"{key}.ipynb"
    _write_atomic(path, nbformat.writes(nb))
    target = folder / "timestamp.txt"
    if stamp is not None:
        _write_atomic(target, _one_line(stamp) + "\n")
    elif target.is_file() and not target.is_symlink():
        target.unlink()
    return path


SUMMARY = "course_summary"  # the metadata key of the summary cell (no learner cell keeps metadata)


def summary_cell(items: list[str], late: str = "") -> nbformat.NotebookNode:
    """The markdown cell at the top of an autograded notebook: the final score as the CSV and the
    feedback page have it, and what made it (`gradebook.account_items`)."""
    head, rest = items[0], items[1:]
    lines = [f"**Final score {head}** (the CSV's and the learner's feedback page's; formgrader's own "
             "totals leave out the late penalty)", ""]
    lines += [f"- {item}" for item in rest]
    if late:
        lines.append(f"- {late}")
    lines += ["", "*Written by the course's `grade` and `export`: run `export` after scoring by hand.*"]
    return nbformat.v4.new_markdown_cell("\n".join(lines), metadata={SUMMARY: True})


def write_summary(out: Path, key: str, student: str, cell: nbformat.NotebookNode) -> bool:
    """Put `cell` first in OUT/autograded/STUDENT/KEY/KEY.ipynb in place of the summary there (a file
    `grade` wrote: regular, not a link); whether the file changed."""
    path = out / "autograded" / student / key / f"{key}.ipynb"
    if path.is_symlink() or not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    cell = copy.deepcopy(cell)
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        cell["id"] = "course-summary"  # the same bytes each time: an unchanged summary is not rewritten
    else:
        cell.pop("id", None)
    nb.cells = [cell] + [c for c in nb.cells if not c.get("metadata", {}).get(SUMMARY)]
    new = nbformat.writes(nb)
    if new == text:
        return False
    _write_atomic(path, new)
    return True


__all__ = ["release_into", "summary_cell", "write_summary", "SUMMARY", "release_notebook", "write_release", "autograded_notebook", "inert_markdown", "timestamp_bytes",
           "nbgrader_time", "learners_timestamp", "write_autograded", "write_feedback_companions"]
