"""`check()` in a notebook: the hidden checks on the code the running kernel has run.

A learner in JupyterLab, Notebook 7, VS Code or Colab runs, in a cell,
``from autograder import check; check()`` (or one part: ``check("part 3")``). The notebook
file may not be on this disk (Colab), or may be older than what the kernel ran, so what is
graded is the code the kernel ran: IPython's input history (`history_manager.input_hist_raw`,
entry n being the cell shown as ``In [n]``), turned into the cell list that
`notebook.code_cells` gives for a saved notebook, and graded by the same `Grader` as the
command line's `check` (unsandboxed, as a self-check), with the same seeds.

Nothing is graded in the kernel's process. A grading process of its own (`_serve`, started with
this Python, isolated from the kernel's environment: `python -I` and only the variables of
`processes.ENV_NAMES`, so that a PYTHONPATH, PYTHONSTARTUP or LD_PRELOAD set by a cell runs
nothing there) runs the hidden checks and starts the worker that loads the learner's code
(`autograder.runner`), exactly as `python -m autograder check` does: a notebook that patched
`torch.allclose` in the kernel fools no check, and the kernel's namespace and random generators
are left as they were. check() adds no name to the learner's namespace and returns None (IPython
then keeps no `Out` entry); it prints the report, never a traceback.

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
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

TERMINAL = "attention-course check NOTEBOOK.ipynb"
NOT_IN_NOTEBOOK = ("check() works in a cell of a notebook (Jupyter, VS Code, Colab); outside one, check the "
                   f"saved notebook from a terminal with `{TERMINAL}`.")
INTERRUPTED = "check interrupted: nothing was graded."
RESULT_MARK = "@@attention-course-result "
# The statements the worker runs of a cell's top level (autograder.worker.KEPT; a test keeps them equal).
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
    from .notebook import is_test_cell, read_notebook

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


@dataclass
class Plan:
    """What one check() grades: the exercise, the cells, the parts (None: all)."""

    key: str
    cells: list
    parts: list | None
    titles: dict
    numbers: tuple = ()  # the execution counts of the entries graded, in order
    unrun: tuple = ()  # the names the exercise's notebook defines whose cells this kernel has not run (`not_run`)

    @property
    def label(self) -> str:
        """The cells graded, as the report names them: every one, runs of consecutive counts as
        ranges ("In [1] to In [4], In [7], In [9] to In [12]"), so that two checks of the same cells
        name them alike and a gap (an entry left out as rerun, or a test) shows."""
        runs: list[list[int]] = []
        for n in sorted(self.numbers):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        said = [f"In [{a}]" if a == b else f"In [{a}] to In [{b}]" for a, b in runs]
        if len(said) > 6:
            said = said[:5] + [f"… {len(said) - 5} more runs"]
        count = len(self.numbers)
        return f"this kernel's history ({count} cell{'s' if count != 1 else ''}: {', '.join(said)})"


def plan_check(entries, part=None, assignment: str | None = None) -> Plan:
    """What check(part, assignment=...) grades of the history `entries`; CheckRefused when it cannot."""
    from .assignments import all_assignments, get_assignment

    entries = [(int(n), str(s)) for n, s in entries]
    if assignment is not None:
        try:
            chosen = get_assignment(str(assignment))
        except KeyError as exc:
            raise CheckRefused(f"check() knows no exercise {str(assignment)[:60]!r}: {exc.args[0]}.") from None
        ex = exercise(chosen)
    else:
        exercises = [exercise(a) for a in all_assignments()]
        key = infer_assignment(entries, exercises)
        ex = next(e for e in exercises if e.key == key)
    parts = None if part is None else resolve_part(ex, part)
    cells = history_cells(entries, ex.tests)
    if not cells:
        raise CheckRefused(f"This kernel has run none of the code of exercise {ex.key} yet: run its cells "
                           "(Run All, or each cell in order), then check() again.")
    return Plan(ex.key, cells, parts, ex.titles, tuple(int(c["label"][4:-1]) for c in cells),
                not_run(entries, ex))


# --- grading, in a process of its own --------------------------------------------------------

# -I leaves the course's folder off sys.path: the child puts it first itself
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from autograder.in_notebook import _serve; _serve()")


def grade_plan(plan: Plan, seed: int, replay: str = "") -> dict:
    """Grade `plan` with `seed` in a grading process started with this Python, as the command line's
    `check` grades; {"result": Result.to_dict(), "text": the text report, "log": path or ""}.
    CheckRefused (one sentence) when that process fails; KeyboardInterrupt ends it cleanly."""
    from .processes import clean_env

    root = Path(__file__).resolve().parent.parent
    request = json.dumps({"assignment": plan.key, "cells": plan.cells, "parts": plan.parts, "seed": seed,
                          "titles": plan.titles, "replay": replay,
                          "label": plan.label, "unrun": list(plan.unrun)})
    fd, log = tempfile.mkstemp(prefix="attention-course-check-", suffix=".log")
    keep_log = True
    try:
        with tempfile.TemporaryDirectory(prefix="attention-course-check-") as cwd, os.fdopen(fd, "wb") as err:
            # Isolated from the kernel's Python environment (-I, the allow-listed variables): a cell
            # that set PYTHONPATH, PYTHONSTARTUP or LD_PRELOAD runs nothing here. Not the kernel's
            # plotting backend either (ipykernel sets one only a kernel can use).
            env = clean_env({"MPLBACKEND": "Agg"})
            proc = subprocess.Popen([sys.executable, "-I", "-c", _CHILD, str(root)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, cwd=cwd, env=env,
                                    start_new_session=True)  # its own group: the stop button reaches us only
            try:
                out, _ = proc.communicate(request.encode())
            except KeyboardInterrupt:
                keep_log = False  # the stop button: nothing to report
                _stop(proc)
                raise
            except BaseException:
                _stop(proc)
                raise
        lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.startswith(RESULT_MARK)]
        reply = json.loads(lines[-1][len(RESULT_MARK):]) if lines else {}
        if "refused" in reply:
            keep_log = False
            raise CheckRefused(str(reply["refused"]))
        if "error" in reply or "result" not in reply:
            why = reply.get("error") or f"the grading process ended with exit code {proc.returncode}"
            raise CheckRefused(f"The check itself failed (a fault of the course, not yours): {why}. "
                               f"Please report it, with the details in {log}.")
        keep_log = reply["result"].get("status") == "grader_error"
        return dict(reply, log=log if keep_log else "")
    finally:
        if not keep_log:
            try:
                os.unlink(log)
            except OSError:
                pass


def _stop(proc: subprocess.Popen) -> None:
    """End the grading process as the stop button ends a cell: it closes its worker on the way out."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _serve() -> None:
    """The grading process: a request (JSON) on stdin, one result line on stdout, the log on stderr."""
    import logging

    from .logs import SafeFormatter

    signal.signal(signal.SIGINT, signal.default_int_handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        reply = _grade_request(json.loads(sys.stdin.read()))
    except Exception as exc:  # noqa: BLE001 - ours: one line back to the kernel, the traceback in the log
        traceback.print_exc()
        reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    sys.stdout.write(RESULT_MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()
    # As the command line's check: the exit handlers run, then the process ends without the interpreter's
    # teardown of PyTorch (0.3 to 0.5 s of the learner's wait); its worker was closed by the grade.
    import atexit

    atexit._run_exitfuncs()
    sys.stderr.flush()
    os._exit(0)


def _grade_request(req: dict) -> dict:
    """As the command line's `check` (commands.check_command): the worker is started before this process
    imports torch, the hidden checks and the reference, so that the two start-ups overlap."""
    from .runner import Submission

    early = Submission([], self_check=True)
    try:
        early.start_early()
        try:
            from .feedback import bounded, format_text
            from .usage import UsageError, course_grader
        except (ImportError, OSError):
            problem = _stack_problem(True)  # torch or numpy is there but cannot be imported
            if problem:
                early.close()
                return {"refused": problem}
            raise
        try:
            grader = course_grader(req["assignment"])
        except UsageError as exc:
            raise RuntimeError(str(exc)) from None
    except BaseException:
        early.close()
        raise
    result = grader.grade(req["label"], seed=req["seed"], submission=early, parts=req["parts"], cells=req["cells"])
    text = format_text(result, limits=grader.limits, part_titles=req["titles"], replay=req["replay"] or None,
                       unrun=req.get("unrun") or ())
    return {"result": bounded(result, grader.limits).to_dict(), "text": text}


# --- check() -----------------------------------------------------------------------------------

def _shell():
    """The running IPython shell, or None: read through IPython itself, never the learner's names."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; a plain script need not pay for it
    get = getattr(ipython, "get_ipython", None)
    try:
        return get() if callable(get) else None
    except Exception:  # noqa: BLE001 - no shell we can read
        return None


def _history(shell) -> list[tuple[int, str]]:
    try:
        raw = list(shell.history_manager.input_hist_raw)
    except Exception:  # noqa: BLE001 - a shell without IPython's history
        raise CheckRefused("This Python shell keeps no input history, which check() reads; check the saved "
                           f"notebook from a terminal with `{TERMINAL}`.") from None
    return [(n, s) for n, s in enumerate(raw) if n > 0 and isinstance(s, str)]


def _stack_problem(try_import: bool) -> str | None:
    """One sentence when this Python cannot import torch or numpy (autograder.learner_errors); the
    kernel asks without importing them (`try_import=False`), the grading process imports them."""
    try:
        from .learner_errors import stack_problem
    except ImportError:
        return None
    try:
        return stack_problem(try_import=try_import, in_notebook=True)
    except TypeError:  # the plain signature
        return stack_problem()


def in_worker(frame) -> bool:
    """Whether check() was called from a grading worker loading a notebook (where it does nothing)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return (frame is not None and frame.f_globals.get("__name__") == "__learner__") or (
        os.path.basename(str(main)) == "worker.py" and "protocol" in sys.modules)


def _replay(part, assignment, seed: int) -> str:
    args = ([repr(str(part))] if part is not None else []) + (
        [f"assignment={str(assignment)!r}"] if assignment is not None else []) + [f"seed={seed}"]
    return f"`check({', '.join(args)})`"


def report(entries, part=None, *, assignment: str | None = None, seed: int | None = None) -> str:
    """What check() prints for the history `entries` ((execution count, source) pairs)."""
    plan = plan_check(entries, part, assignment)
    seed = secrets.randbelow(2**31) if seed is None else int(seed)
    reply = grade_plan(plan, seed, _replay(part, assignment, seed))
    lines = ["The self-check runs the code this kernel has run on this machine, as you, without a sandbox; the "
             "instructor's grader runs the same checks on your saved notebook, in isolation.", reply["text"]]
    if reply["log"]:
        lines.append(f"  (the grader's log: {reply['log']})")
    return "\n".join(lines)


def check(part=None, *, assignment: str | None = None, seed: int | None = None, _frame=None) -> None:
    """Check this notebook's exercise, or one part of it, from a cell; prints the report, returns None.

    `part`: "part 3" (also "Part 3", "3") or a part's name ("softmax"); `assignment`: the exercise's
    key when it cannot be told from the cells run; `seed`: replay the checks of an earlier report."""
    frame = _frame if _frame is not None else sys._getframe(1)
    if in_worker(frame):
        return None
    try:
        shell = _shell()
        if shell is None:
            text = NOT_IN_NOTEBOOK
        else:
            text = _stack_problem(False) or report(_history(shell), part, assignment=assignment, seed=seed)
    except KeyboardInterrupt:
        text = INTERRUPTED
    except CheckRefused as exc:
        text = str(exc)
    except Exception as exc:  # noqa: BLE001 - a fault of ours: one sentence, the traceback in a file
        text = (f"The check itself failed (a fault of the course, not yours): {type(exc).__name__}: "
                f"{str(exc)[:300]}. Please report it, with the details in {_log_traceback()}.")
    print(text)
    return None


def _log_traceback() -> str:
    try:
        fd, path = tempfile.mkstemp(prefix="attention-course-check-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        return path
    except OSError:
        return "(no log could be written)"
