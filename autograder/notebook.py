"""Read a learner's notebook safely and decide which of its code runs during grading.

Nothing here executes learner code: the notebook is parsed as JSON and each code cell
with Python's `ast`. What runs in the worker is the top level of each code cell, less
everything that does work rather than define something: imports, functions, classes and
assignments run; expressions (plots, prints, calls), loops, `with` blocks and asserts
are skipped. The notebook's own test cells (nbgrader grade cells) are skipped too:
the hidden tests decide the score.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .runner import LoadedCode

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
MAX_CELLS = 2000
KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
        ast.Assign, ast.AnnAssign, ast.AugAssign)
MAGIC_RE = re.compile(r"^\s*[%!]")


class NotebookError(ValueError):
    """The file is not a notebook the grader can read; the message says why."""


@dataclass
class ParsedNotebook:
    path: Path
    cells: list[dict]
    metadata: dict
    assignment: str | None = None
    notes: list[str] = field(default_factory=list)


def read_notebook(path: str | Path) -> ParsedNotebook:
    """Parse and check the structure of a notebook file, refusing what is not one."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise NotebookError(f"cannot read {path.name}: {exc.strerror}") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"{path.name} is {size / 2**20:.1f} MiB; notebooks over "
                            f"{MAX_NOTEBOOK_BYTES // 2**20} MiB are not graded (clear large outputs first)")
    try:
        raw = path.read_bytes()
        nb = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NotebookError(f"{path.name} is not UTF-8 text, so not a notebook") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{path.name} is not valid notebook JSON (line {exc.lineno}: {exc.msg}); "
                            "was it truncated or edited by hand?") from None
    except RecursionError:
        raise NotebookError(f"{path.name} is nested too deeply to be a notebook") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError(f"{path.name} has no list of cells, so it is not a Jupyter notebook")
    if nb.get("nbformat") != 4:
        raise NotebookError(f"{path.name} uses notebook format {nb.get('nbformat')!r}; only format 4 is graded "
                            "(save it from a current Jupyter, VS Code or Colab)")
    if len(nb["cells"]) > MAX_CELLS:
        raise NotebookError(f"{path.name} has {len(nb['cells'])} cells; at most {MAX_CELLS} are graded")
    cells = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise NotebookError(f"{path.name}: cell {i + 1} is malformed")
        src = cell.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        if not isinstance(src, str):
            raise NotebookError(f"{path.name}: cell {i + 1} has a malformed source")
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
    return f"cell {cell['index']}" + (f" ({gid})" if isinstance(gid, str) else "")


def code_to_run(nb: ParsedNotebook) -> LoadedCode:
    """The statements the worker executes, in notebook order, with notes on what was skipped."""
    statements: list[dict] = []
    notes: list[str] = []
    for cell in nb.cells:
        if cell["type"] != "code" or is_test_cell(cell):
            continue
        # IPython magics and shell escapes are not Python: blank them, keeping line numbers.
        lines = ["" if MAGIC_RE.match(ln) else ln for ln in cell["source"].split("\n")]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError as exc:
            notes.append(f"{cell_label(cell)} has a syntax error at line {exc.lineno}: {exc.msg}; "
                         "nothing in it was run")
            continue
        except (ValueError, RecursionError, MemoryError):
            notes.append(f"{cell_label(cell)} could not be parsed; nothing in it was run")
            continue
        spans = [(min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]), n.end_lineno)
                 for n in tree.body]
        for i, node in enumerate(tree.body):
            if not isinstance(node, KEPT):
                continue
            first, last = spans[i]
            shares_a_line = any(j != i and a <= last and b >= first for j, (a, b) in enumerate(spans))
            # `x = 1; plot(x)` on one line: run only the assignment, rebuilt from the tree.
            source = ast.unparse(node) if shares_a_line else "\n".join(lines[first - 1: last])
            statements.append({"cell": cell_label(cell), "line": first, "source": source})
    return LoadedCode(statements=statements, notes=notes)


@dataclass
class CellAudit:
    """What a submission did to the notebook's nbgrader cells, compared with the learner notebook.

    `rejected` is set for forged or duplicated grade cells (the submission is not graded,
    as nbgrader does); `notes` report edited or missing locked cells, which change nothing
    in the score (the hidden tests decide it) but are shown in the feedback.
    """

    notes: list[str] = field(default_factory=list)
    rejected: str = ""


def audit_cells(nb: ParsedNotebook, reference_path: str | Path) -> CellAudit:
    """Compare `nb`'s nbgrader cells with those of the learner notebook at `reference_path`."""
    import nbformat
    from nbgrader.utils import compute_checksum

    ref = read_notebook(reference_path)
    ref_cells = {}
    for cell in ref.cells:
        gid = _nbgrader(cell).get("grade_id")
        if isinstance(gid, str):
            ref_cells[gid] = cell
    audit = CellAudit()
    seen: dict[str, int] = {}
    forged, duplicated, edited = [], [], []
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
                f"{label} repeats the grade_id {gid!r} of an earlier cell")
            continue
        if rcell is None:
            if nbg.get("grade") or nbg.get("locked"):
                forged.append(f"{label} is a grade cell that is not part of the exercise")
            continue
        if nbg.get("grade") and not rnbg.get("grade"):
            forged.append(f"{label} was turned into a grade cell")
            continue
        if rnbg.get("locked") or rnbg.get("grade"):
            try:
                node = nbformat.from_dict({"cell_type": cell["type"], "source": cell["source"],
                                           "metadata": {"nbgrader": dict(nbg)}})
                checksum = compute_checksum(node)
            except Exception:  # noqa: BLE001 - a malformed cell is simply 'edited'
                checksum = None
            if checksum != rnbg.get("checksum"):
                edited.append(f"the locked cell {label} was edited (its checksum differs); "
                              "it plays no part in grading: the hidden tests decide the score")
    for gid, rcell in ref_cells.items():
        if gid not in seen and (_nbgrader(rcell).get("locked") or _nbgrader(rcell).get("grade")):
            edited.append(f"the locked cell {gid!r} is missing (deleted, or its metadata was removed); "
                          "it plays no part in grading: the hidden tests decide the score")
    audit.notes = edited
    problems = forged + duplicated
    if problems:
        audit.rejected = ("forged or duplicated grade cells: " + "; ".join(problems)
                          + ". Start again from the original notebook (or delete those cells) and resubmit")
    return audit
