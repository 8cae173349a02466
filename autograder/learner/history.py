"""What `check()` grades of a kernel: the exercise as generated, and the kernel's history as cells.

Which history entries are graded, in execution order (`history_cells`):

* an entry whose source is exactly one of the exercise's visible-test cells is skipped, as the
  command line skips the notebook's test cells;
* an entry that only imports and calls check() is skipped (and in a grading worker check()
  does nothing, so ``r = check()`` cannot recurse);
* an entry is dropped when a later entry binds again every name it binds (the learner fixed a
  cell and ran it again), provided that it binds names only (no ``x.attr = ...``, no ``+=``)
  and that no entry up to that later one reads those names while it is loaded: then the
  later entry alone decides what those names hold, and the load notes list no error of a
  version the kernel no longer holds. Everything else is kept, in order.

Each entry is labelled ``In [n]``, as the learner sees it beside the cell; the command line
labels a cell ``cell N (grade_id)`` by its place in the file. Hints that name a place in the
learner's code differ by that label only.

A definition the checks need that the exercise's notebook holds but that no entry defines, nor
any entry of a cell below it (`not_run`: Run All stopped at a failing cell above it, or it was never
run), is reported as a cell to run in this kernel, not as a definition missing from the notebook.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

# The statements the worker runs of a cell's top level (autograder.isolation.worker.KEPT; a test keeps them equal).
KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
        ast.Assign, ast.AnnAssign, ast.AugAssign)
MAGIC_RE = re.compile(r"^\s*[%!]")  # as the worker's: IPython magics and shell escapes are blanked
HEADING_RE = re.compile(r"^##\s+Part\s+(\d+)\s*:\s*(.*?)\s*$", re.IGNORECASE)
POINTS_RE = re.compile(r"\s*\([^()]*\bpoints?\)\s*$")


class CheckRefused(Exception):
    """check() cannot go on; the message is the one sentence shown to the learner."""


# --- the exercise, as generated ------------------------------------------------------------

@dataclass
class Exercise:
    """What check() needs of an exercise's generated notebook."""

    key: str
    tests: set = field(default_factory=set)         # visible-test cell sources (trailing newlines cut)
    sources: set = field(default_factory=set)       # every code cell's source, for recognising the exercise
    solutions: list = field(default_factory=list)   # per solution cell, the functions and classes it defines
    # every code cell in order, as (source, trailing newlines cut; the names it binds at its top level, none
    # for a visible test): where a definition stands, and which cells below it a kernel has run
    code: list = field(default_factory=list)
    parts: list = field(default_factory=list)       # part ids (test_<part>), in notebook order
    headings: list = field(default_factory=list)    # (number, title, [part ids]) of each "## Part N: title"

    @property
    def defined(self) -> set:
        """Every name a code cell other than a visible test binds at its top level."""
        return set().union(*(names for _, names in self.code))

    @property
    def titles(self) -> dict:
        """part id -> how the notebook names it ("Part 3 (attention in PyTorch)")."""
        return {p: f"Part {n} ({title})" if title else f"Part {n}" for n, title, ids in self.headings for p in ids}

    def listing(self) -> str:
        """The parts as "Part 1 (softmax), ..., Part 4 (padding_mask, causal_mask)", then any outside a heading."""
        under = {p for _, _, ids in self.headings for p in ids}
        items = [f"Part {n} ({', '.join(ids)})" for n, _, ids in self.headings if ids]
        return ", ".join(items + [p for p in self.parts if p not in under])


def _nbgrader(cell: dict) -> dict:
    meta = cell["metadata"].get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def exercise(assignment) -> Exercise:
    """The `Exercise` of an `Assignment`, read from its generated learner notebook."""
    from ..core.notebook import is_test_cell, read_notebook

    nb = read_notebook(assignment.notebook)
    ex = Exercise(assignment.key)
    heading = None
    for cell in nb.cells:
        source = cell["source"]
        if cell["type"] == "markdown":
            for line in source.splitlines():
                if line.startswith("## ") or line.startswith("# "):  # a new section ends the part before
                    m = HEADING_RE.match(line)
                    heading = (int(m.group(1)), POINTS_RE.sub("", m.group(2)), []) if m else None
                    if heading is not None:
                        ex.headings.append(heading)
            continue
        if cell["type"] != "code":
            continue
        ex.sources.add(source.rstrip("\n"))
        gid = _nbgrader(cell).get("grade_id")
        if is_test_cell(cell):
            ex.code.append((source.rstrip("\n"), frozenset()))
            ex.tests.add(source.rstrip("\n"))
            if isinstance(gid, str) and gid.startswith("test_"):
                ex.parts.append(gid[len("test_"):])
                if heading is not None:
                    heading[2].append(gid[len("test_"):])
        else:
            tree = _parse(source)
            ex.code.append((source.rstrip("\n"), frozenset(_binds(tree, lenient=True))))
            names = _defined(tree) if tree is not None and _nbgrader(cell).get("solution") else set()
            if names:
                ex.solutions.append(names)
    return ex


def resolve_part(ex: Exercise, text, example: str = 'check("part 1")') -> list[str]:
    """The part ids that `text` names: "part 3", "Part 3" or "3" (the parts under the notebook's
    heading "## Part 3: ..."), or a part's id ("softmax", or "test_softmax"); else CheckRefused."""
    t = str(text).strip().lower()
    m = re.fullmatch(r"(?:part\s*)?(\d+)", t)
    if m:
        for n, _, ids in ex.headings:
            if n == int(m.group(1)) and ids:
                return list(ids)
    else:
        by_lower = {p.lower(): p for p in ex.parts}
        t = t.removeprefix("test_")
        if t in by_lower:
            return [by_lower[t]]
    raise CheckRefused(f"Exercise {ex.key} has no part {str(text)[:60]!r}; its parts are {ex.listing()}: "
                       f"name one by its number or its name, e.g. {example}.")


# --- the kernel's history -------------------------------------------------------------------

def _parse(source: str) -> ast.Module | None:
    """The tree the worker would run of `source` (magic lines blanked), or None if it cannot parse it."""
    lines = ["" if MAGIC_RE.match(ln) else ln for ln in source.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _defined(tree: ast.Module) -> set[str]:
    """The functions and classes a cell defines at its top level."""
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _definition_re(name: str) -> re.Pattern:
    """A line that defines `name` (def, class) or assigns it at the top level."""
    n = re.escape(name)
    return re.compile(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{n}\b|^{n}[ \t]*(?::|=(?!=))", re.MULTILINE)


def not_run(entries, ex: Exercise) -> tuple[str, ...]:
    """The names the exercise's notebook `ex` defines whose cells have not run in this kernel (Run All
    stopped above them, or they were never run): no entry of the kernel's history `entries` defines
    them, and no entry is a cell of the exercise that stands below where they are defined (its
    visible test, as a rule, which learners leave as it is). A name the kernel went past is missing
    for another reason (renamed, or its cell failed), which the report says as it always did.

    An entry that cannot be parsed (a syntax error) counts as defining a name that a line of it
    defines or assigns at its start, so that its error, not its running, is what is said."""
    ran = {str(source).rstrip("\n") for _, source in entries}
    # the last cell of the exercise the kernel ran as it is: every definition above it was gone past
    last = max((i for i, (source, _) in enumerate(ex.code) if source in ran), default=-1)
    left = {n for i, (_, names) in enumerate(ex.code) if i >= last for n in names}
    left -= {n for i, (_, names) in enumerate(ex.code) if i < last for n in names}
    for _, source in entries:
        if not left:
            break
        source = str(source)
        tree = _parse(source)
        if tree is not None:
            left -= _binds(tree, lenient=True)
        else:
            left = {n for n in left if not _definition_re(n).search(source)}
    return tuple(sorted(left))


def _binds(tree: ast.Module | None, *, lenient: bool = False) -> set[str] | None:
    """The names the worker's statements of `tree` bind (functions, classes, imports, the names an
    assignment's targets hold), or None when one of them does more than bind plain names (an
    attribute or item assignment, `+=`, `import *`), or it cannot be parsed. `lenient`: every plain
    name they bind, whatever else they do (each name in an assignment's targets, an annotation's
    target without a value too), and none when it cannot be parsed."""
    if tree is None:
        return set() if lenient else None
    names: set[str] = set()
    for node in tree.body:
        if not isinstance(node, KEPT):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if any(a.name == "*" for a in node.names) and not lenient:
                return None
            names |= {a.asname or a.name for a in node.names if a.name != "*"}
        elif isinstance(node, ast.AugAssign) and not lenient:
            return None
        else:  # an assignment, annotated or augmented
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if lenient or not isinstance(node, ast.AnnAssign) or node.value else [])
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif not lenient and not isinstance(sub, (ast.Tuple, ast.List, ast.Starred, ast.expr_context)):
                        return None
    return names


def _load_reads(tree: ast.Module | None) -> set[str]:
    """The names the worker's statements of `tree` read while they are loaded (function bodies run
    later, when called, and are left out; decorators, defaults and class bodies are in)."""
    if tree is None:
        return set()
    reads: set[str] = set()
    todo = [n for n in tree.body if isinstance(n, KEPT)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)  # `x += 1` reads x first
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += [*node.decorator_list, node.args] + ([node.returns] if node.returns else [])
        elif isinstance(node, ast.Lambda):
            todo.append(node.args)
        else:
            todo += list(ast.iter_child_nodes(node))
    return reads


def _is_check_call(node) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "check") or (
        isinstance(func, ast.Attribute) and func.attr == "check" and isinstance(func.value, ast.Name)
        and func.value.id == "autograder")


def _only_checks(tree: ast.Module | None) -> bool:
    """Whether an entry only imports autograder and calls check() (the cell a learner checks with)."""
    if tree is None or not tree.body:
        return False
    for node in tree.body:
        if isinstance(node, ast.Import) and all(a.name.split(".")[0] == "autograder" for a in node.names):
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "autograder":
            continue
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) and _is_check_call(node.value):
            continue
        return False
    return True


def history_cells(entries, tests=frozenset(), *, drop_reruns: bool = True) -> list[dict]:
    """The cells to grade of a kernel's history `entries` ((execution count, source) pairs in
    execution order), as `notebook.code_cells` gives a saved notebook's: ``{"label", "source"}``
    with the label ``In [n]``. `tests`: the exercise's visible-test sources (skipped). See the
    module docstring for what is skipped and dropped."""
    tests = {t.rstrip("\n") for t in tests}
    kept = []
    for n, source in entries:
        source = str(source)
        if source.rstrip("\n") in tests:
            continue
        tree = _parse(source)
        if _only_checks(tree):
            continue
        kept.append((n, source, tree))
    drop = set()
    if drop_reruns:
        binds = [_binds(tree) for _, _, tree in kept]
        reads = [_load_reads(tree) for _, _, tree in kept]
        for i, names in enumerate(binds):
            if not names:
                continue
            for j in range(i + 1, len(kept)):
                if reads[j] & names:
                    break  # a later entry reads what this one bound: it must stay
                if binds[j] is not None and names <= binds[j]:
                    drop.add(i)
                    break
    return [{"label": f"In [{n}]", "source": source} for i, (n, source, _) in enumerate(kept) if i not in drop]


def infer_assignment(entries, exercises: list[Exercise]) -> str:
    """The key of the exercise whose generated cells the most history entries match (a code cell's
    source exactly, or a solution cell's functions and classes all defined), when it is the only one
    with that many and there is at least one; else CheckRefused asking for the key."""
    seen = []  # per entry: its source, and the functions and classes it defines
    for _, source in entries:
        tree = _parse(str(source))
        seen.append((str(source).rstrip("\n"), _defined(tree) if tree is not None else set()))
    counts = {ex.key: sum(1 for source, names in seen
                          if source in ex.sources or (names and any(s <= names for s in ex.solutions)))
              for ex in exercises}
    best = max(counts.values(), default=0)
    winners = [k for k, c in counts.items() if c == best]
    if best > 0 and len(winners) == 1:
        return winners[0]
    known = ", ".join(ex.key for ex in exercises) or "none"
    raise CheckRefused("check() cannot tell which exercise this notebook is from the cells it has run; "
                       f'name it, e.g. check(assignment="{exercises[0].key if exercises else "03_qkv"}") '
                       f"(known: {known}).")
