"""Read a learner's notebook safely, and audit its nbgrader cells.

Nothing here executes or parses learner code: the file is read with a size cap (by the
one reader of learner files, `autograder.core.regular_file`, which never follows a link) and
parsed as JSON after a linear count of its containers, so reading costs time and memory
proportional to its (bounded) size. Deciding which statements of a cell run is the
worker's job, inside the sandbox (see `autograder.isolation.worker`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .limits import DEFAULT, Limits
from .regular_file import ERROR, LINK, read_file
from .text import safe, safe_list


# A JSON escape of a UTF-16 surrogate: valid JSON, but alone (not one of a pair) it is no character, and
# writing it out as UTF-8 (an autograded notebook, a page, the gradebook) fails.
_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class NotebookError(ValueError):
    """The file is not a notebook the grader can read; the message says why."""


@dataclass
class ParsedNotebook:
    path: Path
    cells: list[dict]
    metadata: dict
    assignment: str | None = None


def read_bytes(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, read as every learner's file is (`regular_file`):
    never through a link, never blocking on a FIFO, never from a device."""
    path = Path(path)
    got = read_file(path, limit)
    if got.refused == LINK:
        raise NotebookError(f"{path.name} is a symbolic link (never followed)")
    if got.refused == ERROR:
        raise NotebookError(f"cannot read {path.name}: {got.strerror}")
    if got.refused:
        raise NotebookError(f"{path.name} is not a regular file")
    if got.size > limit:
        raise NotebookError(f"{path.name} is {got.size / 2**20:.1f} MiB; notebooks over "
                            f"{limit / 2**20:g} MiB are not graded (clear large outputs first)")
    if got.over(limit):
        raise NotebookError(f"{path.name} grew past {limit / 2**20:g} MiB while it was read")
    return got.data


def read_notebook(path: str | Path, limits: Limits = DEFAULT) -> ParsedNotebook:
    """Read (`read_bytes`) and parse (`parse_notebook`) a notebook file, refusing what is not one
    with a `NotebookError`: whatever the file holds, no other exception comes out of here."""
    path = Path(path)
    try:
        raw = read_bytes(path, limits.notebook_bytes)
    except NotebookError:
        raise
    except Exception as exc:  # noqa: BLE001 - a learner's file: any failure is the learner's, said once
        raise NotebookError(f"{_name(path)} could not be read ({type(exc).__name__})") from None
    return parse_notebook(raw, path, limits)


def _name(path) -> str:
    return safe(Path(path).name, 120)


def parse_notebook(raw: bytes, path: str | Path, limits: Limits = DEFAULT) -> ParsedNotebook:
    """The notebook in `raw` (the bytes of the file `path`, which only names it in messages), its
    structure checked. This is the one parser of learner notebooks: `grade`, `check`, the Gradescope
    mode, `similarity` and the autograded notebooks all read through it.

    Anything that is not a notebook the grader can read is a `NotebookError` whose message says why in
    one phrase, and so is any other failure while parsing (valid JSON can still be refused by Python,
    e.g. an integer of thousands of digits): reading a learner's bytes can cost that learner's grade,
    never raise past the caller's guard for one submission."""
    try:
        return _parse(raw, Path(path), limits)
    except NotebookError:
        raise
    except Exception as exc:  # noqa: BLE001 - see above
        raise NotebookError(f"{_name(path)} could not be read as a notebook ({type(exc).__name__})") from None


def _parse(raw: bytes, path: Path, limits: Limits) -> ParsedNotebook:
    name = _name(path)
    if not isinstance(raw, (bytes, bytearray)):
        raise NotebookError(f"{name} could not be read (no bytes)")
    if len(raw) > limits.notebook_bytes:
        raise NotebookError(f"{name} is {len(raw) / 2**20:.1f} MiB; notebooks over "
                            f"{limits.notebook_bytes / 2**20:g} MiB are not graded (clear large outputs first)")
    if raw.count(b"[") + raw.count(b"{") > limits.notebook_containers:
        raise NotebookError(f"{name} holds more than {limits.notebook_containers} JSON lists and "
                            "objects, far more than any notebook; it is not graded")
    try:
        nb = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NotebookError(f"{name} is not UTF-8 text, so not a notebook") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{name} is not valid notebook JSON (line {exc.lineno}: {exc.msg}); "
                            "was it truncated or edited by hand?") from None
    except RecursionError:
        raise NotebookError(f"{name} is nested too deeply to be a notebook") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc) or "digits" in str(exc):
            raise NotebookError(f"{name} holds a number of thousands of digits, which Python refuses to read; "
                                "no notebook Jupyter writes has one") from None
        raise NotebookError(f"{name} could not be read as notebook JSON ({type(exc).__name__})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError(f"{name} has no list of cells, so it is not a Jupyter notebook")
    if _LONE_SURROGATE.search(raw):  # only then the costlier check: a pair of escapes is one character
        try:
            json.dumps(nb, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise NotebookError(f"{name} holds text that is not valid Unicode (an escaped lone surrogate), which no "
                                "notebook Jupyter writes has") from None
    if nb.get("nbformat") != 4:
        raise NotebookError(f"{name} uses notebook format {str(nb.get('nbformat'))[:20]!r}; only format 4 "
                            "is graded (save it from a current Jupyter, VS Code or Colab)")
    if len(nb["cells"]) > limits.notebook_cells:
        raise NotebookError(f"{name} has {len(nb['cells'])} cells; at most {limits.notebook_cells} are graded")
    cells = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise NotebookError(f"{name}: cell {i + 1} is malformed")
        src = cell.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        if not isinstance(src, str):
            raise NotebookError(f"{name}: cell {i + 1} has a malformed source")
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        cells.append({"index": i + 1, "type": cell["cell_type"], "source": src, "metadata": meta})
    metadata = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    course = metadata.get("course") if isinstance(metadata.get("course"), dict) else {}
    assignment = course.get("assignment") if isinstance(course.get("assignment"), str) else None
    return ParsedNotebook(path=path, cells=cells, metadata=metadata, assignment=assignment)


def _nbgrader(cell: dict) -> dict:
    meta = cell["metadata"].get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def is_test_cell(cell: dict) -> bool:
    nbg = _nbgrader(cell)
    return bool(nbg.get("grade")) and not nbg.get("solution")


def cell_label(cell: dict) -> str:
    gid = _nbgrader(cell).get("grade_id")
    return f"cell {cell['index']}" + (f" ({gid[:60]})" if isinstance(gid, str) else "")


def code_cells(nb: ParsedNotebook) -> list[dict]:
    """The code cells whose top level the worker loads: all but the notebook's own test cells."""
    return [{"label": cell_label(c), "source": c["source"]} for c in nb.cells
            if c["type"] == "code" and not is_test_cell(c)]


@dataclass
class CellAudit:
    """What a submission did to the notebook's nbgrader cells, compared with the learner notebook.

    `rejected` is set for forged or duplicated grade cells (the submission is not graded,
    as nbgrader does); `notes` report edited or missing locked cells, which change nothing
    in the score (the hidden tests decide it) but are shown in the feedback. `old_release`
    is set when the cells that differ are those of another release of the exercise (see
    `audit_cells`); it is then the first note, or the reason for the rejection.
    """

    notes: list[str] = field(default_factory=list)
    rejected: str = ""
    old_release: str = ""


def reference_cells(reference: ParsedNotebook) -> dict[str, dict]:
    """grade_id -> cell of the learner notebook as generated (what submissions are audited against)."""
    out = {}
    for cell in reference.cells:
        gid = _nbgrader(cell).get("grade_id")
        if isinstance(gid, str):
            out[gid] = cell
    return out


def cell_checksum(cell_type: str, source: str, nbg: dict) -> str:
    """nbgrader's checksum of a cell (`nbgrader.utils.compute_checksum`), byte for byte, from the
    fields it reads; computed here so that auditing a notebook needs neither nbgrader nor nbformat
    (their imports cost a learner's check more than a second). A test compares the two."""
    grade, solution = nbg.get("grade", False), nbg.get("solution", False)
    locked = False if solution else (True if grade else nbg.get("locked", False))
    parts = [source, cell_type, str(grade), str(solution), str(locked), nbg["grade_id"]]
    if grade:
        parts.append(str(float(nbg["points"])))
    m = hashlib.md5()
    for part in parts:
        m.update(part.encode("utf-8"))
    return m.hexdigest()


def _generated(nbg: dict) -> bool:
    """Whether a cell's nbgrader metadata carries what nbgrader writes when it generates a notebook
    (a checksum, the schema's version): the cell came from some release of the exercise."""
    checksum = nbg.get("checksum")
    return (isinstance(checksum, str) and len(checksum) == 32 and all(c in "0123456789abcdef" for c in checksum)
            and "schema_version" in nbg)


def _ids(gids: list[str], shown: int = 3) -> str:
    names = ", ".join(repr(g[:40]) for g in gids[:shown])
    return names + (f" and {len(gids) - shown} more" if len(gids) > shown else "")


def _release_sentence(key: str, unknown: list[str], missing: list[str], changed: list[str], *,
                      refused: bool, self_check: bool) -> str:
    """The one sentence saying that the notebook was made for an older release of exercise `key`
    (under `limits.note_chars` when its lists of cells are short): how it differs, what to do."""
    differs = []
    if unknown:
        differs.append(f"cells not in the current exercise: {_ids(unknown)}")
    if missing:
        differs.append(f"cells it lacks: {_ids(missing)}")
    if changed:
        differs.append(f"locked cells changed since: {_ids(changed)}")
    what = f"This notebook is from an older release of exercise {key[:60]} ({'; '.join(differs)})"
    if self_check:
        return what + (": copy your answers into the current notebook and check that one"
                       + (", as the instructor's grader will refuse this one." if refused else "."))
    if refused:
        return what + ", so it was not graded: copy your answers into the current notebook and submit that one."
    return what + "; the current exercise's checks graded it all the same."


def audit_cells(nb: ParsedNotebook, ref_cells: dict[str, dict], limits: Limits = DEFAULT, *, key: str = "",
                self_check: bool = False, ref_course: dict | None = None) -> CellAudit:
    """Compare `nb`'s nbgrader cells with the generated notebook's (`reference_cells`).

    A notebook made for another release of the exercise (`old_release`) is told from one whose
    cells were forged or edited by what its differing cells carry: a grade id the exercise does
    not have on a cell with nbgrader's generated metadata (a checksum), a locked cell generated
    with another checksum than the current one's (a learner's edit keeps the checksum), locked
    cells missing from a notebook whose other nbgrader cells are intact, or cells missing from one
    whose course metadata (`ref_course`: the generated notebook's) differs. Its unknown grade
    cells are still refused by the instructor's grade; a learner's check (`self_check`) grades
    it, and says so once (`key` names the exercise in that sentence). A checksum is public, so
    this tells an honest mistake from a forgery only for the sentence shown, never for the grade.

    Each reference cell's checksum is computed at most once, so the cost is linear in the
    notebook's size."""
    audit = CellAudit()
    seen: dict[str, int] = {}
    forged, duplicated, edited = [], [], []
    unknown, unknown_grade, changed = [], [], []  # what another release of the exercise would show
    for cell in nb.cells:
        nbg = _nbgrader(cell)
        gid = nbg.get("grade_id")
        if not nbg:
            continue
        label = cell_label(cell)
        if not isinstance(gid, str):
            if nbg.get("grade") or nbg.get("locked"):
                forged.append(f"{label} is marked as a grade or locked cell but has no valid grade_id")
            continue
        seen[gid] = seen.get(gid, 0) + 1
        rcell = ref_cells.get(gid)
        rnbg = _nbgrader(rcell) if rcell else {}
        if seen[gid] > 1:
            (duplicated if (nbg.get("grade") or rnbg.get("grade")) else edited).append(
                f"{label} repeats the grade_id {gid[:60]!r} of an earlier cell")
            continue
        if rcell is None:
            if nbg.get("grade") or nbg.get("locked"):
                if _generated(nbg):
                    unknown.append(gid)
                    if nbg.get("grade"):
                        unknown_grade.append(f"{label} is a grade cell that is not part of the exercise")
                else:
                    forged.append(f"{label} is a grade cell that is not part of the exercise")
            elif nbg.get("solution"):
                unknown.append(gid)
            continue
        if nbg.get("grade") and not rnbg.get("grade"):
            forged.append(f"{label} was turned into a grade cell")
            continue
        if rnbg.get("locked") or rnbg.get("grade"):
            try:
                checksum = cell_checksum(cell["type"], cell["source"], nbg)
            except Exception:  # noqa: BLE001 - a malformed cell is simply 'edited'
                checksum = None
            if checksum != rnbg.get("checksum"):
                if _generated(nbg) and nbg["checksum"] != rnbg.get("checksum"):
                    changed.append(gid)  # generated with other content: a learner's edit keeps the checksum
                else:
                    edited.append(f"the locked cell {label} was edited (its checksum differs); "
                                  "it plays no part in grading: the hidden tests decide the score")
    missing = [gid for gid in ref_cells if gid not in seen]
    mine = nb.metadata.get("course") if isinstance(nb.metadata.get("course"), dict) else {}
    other_course = any(k != "assignment" and k in mine and mine[k] != v for k, v in (ref_course or {}).items())
    missing_locked = [gid for gid in missing if _nbgrader(ref_cells[gid]).get("locked")
                      or _nbgrader(ref_cells[gid]).get("grade")]
    # every release has grade cells: a notebook without any lost them, it was not made without them
    intact = (any(_nbgrader(ref_cells[gid]).get("grade") for gid in seen if gid in ref_cells)
              and not (edited or forged or duplicated))
    if unknown or changed or (missing_locked and intact) or (missing and other_course):
        audit.old_release = _release_sentence(key, unknown, missing, changed, refused=bool(unknown_grade),
                                              self_check=self_check)
    else:
        edited += [f"the locked cell {gid!r} is missing (deleted, or its metadata was removed); "
                   "it plays no part in grading: the hidden tests decide the score" for gid in missing_locked]
    problems = cap(forged + duplicated, limits, "problems")
    if problems:
        audit.rejected = ("forged or duplicated grade cells: " + "; ".join(problems)
                          + ". Start again from the original notebook (or delete those cells) and resubmit")
    elif unknown_grade and not self_check:
        audit.rejected = audit.old_release  # the instructor's grade refuses grade cells it does not know
    if audit.old_release and not audit.rejected:
        edited.insert(0, audit.old_release)
    audit.notes = cap(edited, limits, "notes about edited cells")
    return audit


def cap(items: list[str], limits: Limits, what: str = "notes", dropped: int = 0) -> list[str]:
    """At most `limits.notes` items of at most `limits.note_chars` characters (escaped), and a
    count of the rest (plus `dropped`, items already left out before)."""
    return safe_list(items, limits.notes, limits.note_chars, f"more {what}", dropped)
