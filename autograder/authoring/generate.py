"""Generate each learner notebook and reference module from its master.

The master (``exercises/source/KEY.md``) is a MyST markdown notebook in nbgrader's
source format: solution cells hold ``### BEGIN SOLUTION`` / ``### END SOLUTION``
regions, test cells carry ``grade: true`` and their points. Two shorthands keep it short:

* a code cell's option ``:grader: locked ID``, ``:grader: solution ID`` or
  ``:grader: tests PART POINTS`` expands to the full nbgrader metadata (see
  ``GRADER_FORMS``); the long ``nbgrader:`` YAML block still works;
* a line ``<!-- instructions -->`` is replaced by the shared learner instructions,
  ``exercises/source/_instructions.md``, with ``{key}`` set to the chapter key (and
  ``{archive}`` to the course's archive, see below);
* a code line ``# from exercise KEY: NAME`` is replaced by the reference definition of
  ``NAME`` (a function or class) from exercise KEY's master, so that a later exercise
  gives the learner an earlier answer, locked, without a second copy to keep in step.

Every exercise also gets the course's set-up cell (``SETUP_CELL``) as its first code cell:
where the course is not installed (Colab, a bare JupyterHub) it installs it from the
repository archive that ``_config.yml``'s ``repository: url`` and ``branch`` name, so a fork
that changes them and regenerates hands out notebooks that install the fork.

From it we write

* ``exercises/KEY.ipynb``: nbgrader's own preprocessors replace solutions by stubs,
  lock cells, clear outputs and hidden tests, and compute checksums;
* ``solutions/chKEY.py``: the cells tagged ``export`` and the solution cells, with the
  region markers removed, as an importable module.

Both are generated files: ``generate --check`` fails when a committed one is stale.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from pathlib import Path

import nbformat
from myst_nb.core.read import read_myst_markdown_notebook
from nbgrader import utils as nbgrader_utils
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearHiddenTests,
    ClearMarkScheme,
    ClearOutput,
    ClearSolutions,
    ComputeChecksums,
    LockCells,
)

from ..core.assignments import ROOT, Assignment, all_assignments

MARKER_RE = re.compile(r"^\s*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)\s*$")
INSTRUCTIONS = ROOT / "exercises" / "source" / "_instructions.md"
INCLUDE_RE = re.compile(r"^<!-- instructions -->[ \t]*\n?", flags=re.M)
REUSE_RE = re.compile(r"^# from exercise (\S+): (\S+)[ \t]*$", flags=re.M)
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
POINTS_RE = re.compile(r"^(?:\d+|\d*\.\d+)$")
# `:grader: FORM ARGS...` -> nbgrader metadata (the grade_id and points come from ARGS).
GRADER_FORMS = {
    "locked": ("ID", {"grade": False, "locked": True, "solution": False}),
    "solution": ("ID", {"grade": False, "locked": False, "solution": True}),
    "tests": ("PART POINTS", {"grade": True, "locked": True, "solution": False}),
}
CONFIG = ROOT / "_config.yml"
GITHUB_RE = re.compile(r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
BRANCH_RE = re.compile(r"^[A-Za-z0-9_./-]+$")
SETUP_CELL_ID = "course-setup"
# The first code cell of every exercise. The grader's loader runs only the top level's imports,
# definitions and assignments, so it skips this `try` whole and never runs pip; where the course
# is importable the cell does nothing. `importlib.invalidate_caches()` lets the running kernel
# find the package pip has just written, with no restart; `del` leaves no name behind but
# `autograder`. `{archive}` is the only value filled in. The cell carries no nbgrader
# metadata (it is not locked): it plays no part in grading, and a locked cell would have the audit
# report it edited or missing in every notebook made for another repository or an older release.
SETUP_CELL = """\
# Set-up: where the course is not installed (Colab, a bare JupyterHub), this installs it (in
# Colab, once per session); where it is (a clone, Binder, a laptop with the course), it does nothing.
try:
    import autograder
except ModuleNotFoundError:
    import importlib, subprocess, sys
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "attention-course[learner] @ {archive}"])
    importlib.invalidate_caches()  # so that this kernel sees the new package without a restart
    del importlib, subprocess, sys
    try:
        import autograder
        print("Installed the course: check your work in a cell with `from autograder import check; check()`.")
    except ModuleNotFoundError:
        print("The course could not be installed (pip says why above): run this cell again.")"""
GENERATED_NOTE = (
    "GENERATED from {master} by `python -m autograder generate`; do not edit. "
    "Edit the master and regenerate."
)


class MasterError(ValueError):
    """The master notebook breaks a rule of the source format."""


def read_master(assignment: Assignment, _including: tuple[str, ...] = (), *, instructions: Path | None = None,
                setup: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The master as an nbformat notebook with deterministic cell ids. ``instructions`` and
    ``setup`` replace the shared instructions and the set-up cell (the learners' release,
    ``autograder.course.learners_release``, has its own)."""
    text = include_instructions(assignment, assignment.master.read_text(encoding="utf-8"), instructions)
    nb = read_myst_markdown_notebook(text)
    seen: set[str] = set()
    for i, cell in enumerate(nb.cells):
        if "grader" in cell.metadata:
            expand_grader_option(assignment, i, cell)
        if cell.cell_type == "code" and REUSE_RE.search(cell.source):
            cell.source = include_definitions(assignment, cell.source, (*_including, assignment.key))
        meta = cell.metadata.get("nbgrader")
        cell_id = meta["grade_id"] if meta and "grade_id" in meta else f"cell-{i:03d}"
        if cell_id in seen:
            raise MasterError(f"{assignment.master}: duplicate grade_id {cell_id!r}")
        seen.add(cell_id)
        cell["id"] = cell_id.replace("_", "-")
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)
    if first_code is not None:
        nb.cells.insert(first_code, copy.deepcopy(setup) if setup is not None else setup_cell())
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def archive_url(config: Path | None = None) -> str:
    """The zip archive of the course's branch on GitHub, from ``_config.yml``'s ``repository``
    (``url`` and ``branch``): what the set-up cell installs."""
    import yaml

    path = config or CONFIG
    try:
        repo = yaml.safe_load(path.read_text(encoding="utf-8")).get("repository") or {}
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise MasterError(f"{_rel(path)} cannot be read ({exc}): the set-up cell needs its repository url and branch") from None
    url = str(repo.get("url") or "").strip().rstrip("/").removesuffix(".git")
    branch = str(repo.get("branch") or "main").strip()
    if not GITHUB_RE.match(url) or not BRANCH_RE.match(branch):
        raise MasterError(f"{_rel(path)}: repository url {url!r} and branch {branch!r} must name a GitHub "
                          "repository (https://github.com/OWNER/REPO) and one of its branches: the set-up cell "
                          "installs the course from that branch's archive")
    return f"{url}/archive/refs/heads/{branch}.zip"


def setup_cell(config: Path | None = None) -> nbformat.NotebookNode:
    """The course's set-up cell (``SETUP_CELL``) for the repository named in ``_config.yml``."""
    cell = nbformat.v4.new_code_cell(SETUP_CELL.replace("{archive}", archive_url(config)))
    cell["id"] = SETUP_CELL_ID
    return cell


def include_instructions(assignment: Assignment, text: str, instructions: Path | None = None) -> str:
    """The master's text with each ``<!-- instructions -->`` line replaced by the shared
    instructions, their ``{key}`` set to the chapter key and ``{archive}`` to the course's
    archive (``archive_url``)."""
    if not INCLUDE_RE.search(text):
        return text
    instructions = instructions or INSTRUCTIONS
    if not instructions.exists():
        raise MasterError(f"{assignment.master}: includes the instructions, but {_rel(instructions)} is missing")
    shared = instructions.read_text(encoding="utf-8").replace("{key}", assignment.key)
    if "{archive}" in shared:
        shared = shared.replace("{archive}", archive_url())
    if not shared.endswith("\n"):
        shared += "\n"
    return INCLUDE_RE.sub(lambda _: shared, text)


def include_definitions(assignment: Assignment, source: str, including: tuple[str, ...]) -> str:
    """A code cell's text with each ``# from exercise KEY: NAME`` line replaced by the reference
    definition of NAME in exercise KEY (its solution markers removed)."""
    from ..core.assignments import get_assignment

    modules: dict[str, str] = {}  # key -> its reference module, read once for all of the cell's lines

    def definition(match: re.Match) -> str:
        key, name = match.group(1), match.group(2)
        where = f"{assignment.master}: '# from exercise {key}: {name}'"
        if key in including:
            raise MasterError(f"{where}: exercises include each other ({' -> '.join((*including, key))})")
        try:
            other = get_assignment(key)
        except KeyError as exc:
            raise MasterError(f"{where}: {exc.args[0]}") from None
        if key not in modules:
            modules[key] = solutions_module(other, read_master(other, including))
        module = modules[key]
        for node in ast.parse(module).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = module.splitlines()[first - 1: node.end_lineno]
                return (f"# Exercise {key}'s reference `{name}`, included from {_rel(other.master)}.\n"
                        + "\n".join(lines))
        raise MasterError(f"{where}: exercise {key} defines no function or class {name!r}")

    return REUSE_RE.sub(definition, source)


def expand_grader_option(assignment: Assignment, index: int, cell: nbformat.NotebookNode) -> None:
    """Replace a cell's ``:grader:`` option by the nbgrader metadata it stands for."""
    value = cell.metadata.pop("grader")
    first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
    where = f"{assignment.master}: cell {index} ({first[:60]!r})"
    words = value.split() if isinstance(value, str) else []
    form = GRADER_FORMS.get(words[0]) if words else None
    if cell.cell_type != "code":
        raise MasterError(f"{where}: only code cells take a :grader: option")
    if "nbgrader" in cell.metadata:
        raise MasterError(f"{where}: give either :grader: or an nbgrader: block, not both")
    args = words[1:]
    if (form is None or len(args) != len(form[0].split()) or not NAME_RE.match(args[0])
            or (words[0] == "tests" and not (POINTS_RE.match(args[1]) and float(args[1]) > 0))):
        usage = "; ".join(f"':grader: {name} {arg}'" for name, (arg, _) in GRADER_FORMS.items())
        raise MasterError(f"{where}: malformed option ':grader: {value}'. Expected one of {usage}, "
                          "where ID and PART are letters, digits, '_' or '-', and POINTS a positive number")
    meta = {**form[1], "schema_version": 3}
    if words[0] == "tests":
        meta["grade_id"] = f"test_{args[0]}"
        meta["points"] = int(args[1]) if args[1].isdigit() else float(args[1])
    else:
        meta["grade_id"] = args[0]
    cell.metadata["nbgrader"] = meta


def grade_cells(nb: nbformat.NotebookNode) -> dict[str, float]:
    """grade_id -> points of every graded cell in a notebook."""
    return {
        c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"].get("points", 0))
        for c in nb.cells
        if nbgrader_utils.is_grade(c)
    }


def learner_notebook(assignment: Assignment, master: nbformat.NotebookNode | None = None) -> str:
    """The learner notebook's text, made by nbgrader's own preprocessors."""
    nb = copy.deepcopy(master if master is not None else read_master(assignment))
    resources: dict = {}
    # The same chain as `nbgrader generate_assignment`, less the database steps.
    for pre in (
        LockCells(),
        ClearSolutions(),
        ClearOutput(),
        CheckCellMetadata(),
        ComputeChecksums(),
        ClearHiddenTests(),
        ClearMarkScheme(),
        ComputeChecksums(),
        CheckCellMetadata(),
    ):
        nb, resources = pre.preprocess(nb, resources)
    nb.metadata["course"] = {
        "assignment": assignment.key,
        "generated": GENERATED_NOTE.format(master=_rel(assignment.master)),
    }
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def solutions_module(assignment: Assignment, master: nbformat.NotebookNode | None = None) -> str:
    """The reference module's text: exported and solution cells, markers removed."""
    nb = master if master is not None else read_master(assignment)
    header = [
        f"# AUTOGENERATED! DO NOT EDIT! File to edit: {_rel(assignment.master)}",
        "# Regenerate with: python -m autograder generate",
        f'"""Reference solutions for exercise {assignment.key}."""',
        "",
    ]
    chunks = []
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        exported = "export" in cell.metadata.get("tags", [])
        if not (exported or nbgrader_utils.is_solution(cell)):
            continue
        if "### BEGIN HIDDEN TESTS" in cell.source:
            raise MasterError(f"{assignment.master}: hidden tests belong in {_rel(assignment.hidden_tests)}")
        lines = [ln for ln in cell.source.splitlines() if not MARKER_RE.match(ln)]
        chunks.append("\n".join(lines).strip("\n"))
        names += re.findall(r"^(?:def|class) (\w+)", cell.source, flags=re.M)
    all_line = "__all__ = [" + ", ".join(repr(n) for n in names) + "]"
    return "\n".join(header) + "\n\n\n".join(chunks) + "\n\n\n" + all_line + "\n"


def outputs(assignment: Assignment) -> dict[Path, str]:
    """Every generated file of one assignment and its expected text."""
    from .spec_table import outputs as spec_tables

    master = read_master(assignment)
    return {
        assignment.notebook: learner_notebook(assignment, master),
        assignment.solutions: solutions_module(assignment, master),
        **spec_tables(assignment.key),
    }


def generate(assignments: list[Assignment] | None = None, check: bool = False) -> list[str]:
    """Write (or, with check, compare) every generated file; returns the problems found."""
    from .spec_table import INSTRUCTIONS, spec_file
    from .spec_table import outputs as spec_tables

    files = [(path, text, a.master) for a in assignments or all_assignments() for path, text in outputs(a).items()]
    if not assignments:  # the shared instructions' table, with every exercise
        files += [(path, text, spec_file(INSTRUCTIONS)) for path, text in spec_tables(INSTRUCTIONS).items()]
    problems = []
    for path, text, source in files:
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            diff = difflib.unified_diff(
                (current or "").splitlines(), text.splitlines(),
                f"{_rel(path)} (committed)", f"{_rel(path)} (from master)", lineterm="", n=1,
            )
            excerpt = "\n".join(list(diff)[:30])
            problems.append(f"{_rel(path)} is stale: regenerate it from {_rel(source)}\n{excerpt}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            problems.append(f"wrote {_rel(path)}")
    return problems


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
