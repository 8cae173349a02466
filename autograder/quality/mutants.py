"""Mutation testing of the hidden tests: would they notice a wrong answer?

``python -m autograder mutants KEY`` takes each solution region of the exercise's master
(the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION``), makes *mutants* of it,
each one small change to one expression or statement, turns every mutant into a learner
notebook (the reference notebook with that one cell changed) and grades them all with the
real grader (one `GradingRun` in this process, the run of ``python -m autograder grade``:
sandboxed, in parallel). A mutant is *killed* when it scores below full marks; it
*survives* when it keeps every point.

The mutation operators (`autograder.quality.mutation_operators`) are the mistakes tensor code invites: the axis of a reduction or a
softmax, a transpose dropped, the 1/sqrt(d) scale dropped or squared, a mask inverted, a
fill value of -inf turned into 0, off-by-one comparisons, indices and ranges, tril <-> triu,
operands swapped in cat/stack/matmul/einsum, a term dropped from a sum, ``+=`` turned into
``=``, constants perturbed, an intermediate returned, max <-> min, exp dropped. Each is
applied to one AST node; only that node's text is rewritten (``ast.unparse``), the rest of
the cell stays byte-identical, and the result is checked to parse to exactly the intended
tree.

Each mutant has a stable id, ``CELL-OPERATOR-HASH``, the hash taken over the enclosing
function's name and the changed node's code before and after (``ast.unparse``: no comment, no
docstring, no layout), so it survives edits elsewhere, a reworded comment or a reflowed line.
A survivor that cannot change any output is marked *equivalent* in
``exercises/source/KEY.equivalent.toml``, one table per id with a one-line reason::

    [softmax-keepdim-0123abcd]
    reason = "the division broadcasts the same either way"

Marked mutants are left out of the score, killed / (all - marked equivalent), and listed
apart. A survivor that shows a real gap waits for a hidden check that kills it; until then
it may be listed in the same file with ``gap = "..."`` (what check would kill it): it still
counts against the score and is only left out of the CI sample. A mark whose id no longer
exists is reported as stale.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.assignments import Assignment, get_assignment
from .mutation_operators import OPERATOR_FUNCS, OPERATORS, contexts, locals_at

MARKER_RE = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
# Methods and functions whose first (method) or second (function) positional argument is an axis.


# --- mutants of a cell ------------------------------------------------------------------------------

@dataclass
class Mutant:
    id: str
    cell: str  # the solution cell's grade_id
    operator: str
    function: str  # the enclosing function (Class.method)
    line: int  # first changed line, 1-based within the cell
    before: str  # the changed line(s) as they were
    after: str  # and as the mutant has them
    source: str = field(repr=False, default="")  # the whole mutated cell


def _regions(source: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers strictly inside each BEGIN/END SOLUTION pair."""
    out, start = [], None
    for n, line in enumerate(source.splitlines(), 1):
        m = MARKER_RE.match(line)
        if m and m.group(1) == "BEGIN":
            start = n
        elif m and start is not None:
            out.append((start + 1, n - 1))
            start = None
    return out


def _parents(tree: ast.AST) -> dict[int, tuple[ast.AST, str, int | None]]:
    out = {}
    for parent in ast.walk(tree):
        for fname, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        out[id(item)] = (parent, fname, i)
            elif isinstance(value, ast.AST):
                out[id(value)] = (parent, fname, None)
    return out


def _replace_in_tree(tree: ast.AST, index: int, new: ast.AST) -> ast.AST:
    """A copy of `tree` with its `index`-th node (ast.walk order) replaced by `new`."""
    tree = copy.deepcopy(tree)
    target = list(ast.walk(tree))[index]
    parent, fname, i = _parents(tree)[id(target)]
    if i is None:
        setattr(parent, fname, copy.deepcopy(new))
    else:
        getattr(parent, fname)[i] = copy.deepcopy(new)
    return tree


def _splice(source: str, node: ast.AST, text: str) -> str:
    """`source` with `node`'s exact text (AST offsets are UTF-8 bytes) replaced by `text`."""
    lines = source.encode().split(b"\n")
    start = len(b"\n".join(lines[:node.lineno - 1])) + (1 if node.lineno > 1 else 0) + node.col_offset
    end = len(b"\n".join(lines[:node.end_lineno - 1])) + (1 if node.end_lineno > 1 else 0) + node.end_col_offset
    data = source.encode()
    return (data[:start] + text.encode() + data[end:]).decode()


def _function_of(tree: ast.AST, line: int) -> str:
    best = ""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.lineno <= line <= node.end_lineno:
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and sub.lineno <= line <= sub.end_lineno:
                    return f"{node.name}.{sub.name}"
        if isinstance(node, ast.FunctionDef) and node.lineno <= line <= node.end_lineno:
            best = node.name
    return best


def _lines(text: str, first: int, last: int) -> str:
    return "\n".join(text.splitlines()[first - 1:last])


def cell_mutants(cell_id: str, source: str, operators=OPERATORS) -> list[Mutant]:
    """Every mutant of the solution regions of one cell, in source order, deduplicated."""
    tree = ast.parse(source)
    regions = _regions(source)
    ctx = contexts(tree)
    nodes = list(ast.walk(tree))
    # An error message is not an answer: nothing in a `raise` or an f-string is mutated.
    messages = {id(sub) for node in nodes if isinstance(node, (ast.Raise, ast.JoinedStr)) for sub in ast.walk(node)}
    out, seen, ids = [], {ast.dump(tree)}, {}
    for index, node in enumerate(nodes):
        if not hasattr(node, "lineno") or not any(a <= node.lineno and node.end_lineno <= b for a, b in regions) \
                or id(node) in messages:
            continue
        ctx["locals"] = locals_at(tree, node.lineno)
        for op in operators:
            for new in OPERATOR_FUNCS[op](node, ctx):
                mutant = _make(cell_id, op, source, tree, index, node, new)
                if mutant is None:
                    continue
                dump = ast.dump(ast.parse(mutant.source))
                if dump in seen:
                    continue
                seen.add(dump)
                base = f"{mutant.function}|{ast.unparse(node)}|{ast.unparse(new)}"
                n = ids.get(base, 0)
                ids[base] = n + 1
                digest = hashlib.sha1(f"{base}|{n}".encode()).hexdigest()[:8]
                mutant.id = f"{cell_id}-{op}-{digest}"
                out.append(mutant)
    return out


def _make(cell_id, op, source, tree, index, node, new) -> Mutant | None:
    old_text, new_text = ast.unparse(node), ast.unparse(new)
    if old_text == new_text:
        return None
    expected = ast.dump(_replace_in_tree(tree, index, new))
    # Bare first; parenthesised where the node sits inside a tighter operator (the tree check tells).
    candidates = [new_text, f"({new_text})"] if isinstance(new, ast.expr) else [new_text]
    for text in candidates:
        mutated = _splice(source, node, text)
        try:
            if ast.dump(ast.parse(mutated)) != expected:
                continue
            compile(mutated, "<mutant>", "exec")
        except SyntaxError:
            continue
        first, last = node.lineno, node.end_lineno
        new_last = last + mutated.count("\n") - source.count("\n")
        return Mutant(id="", cell=cell_id, operator=op, function=_function_of(tree, node.lineno), line=first,
                      before=_lines(source, first, last), after=_lines(mutated, first, new_last), source=mutated)
    return None


# --- an exercise's mutants, notebooks and equivalent marks ----------------------------------------

def solution_cells(assignment: Assignment):
    """(grade_id, source) of the master's solution cells, in order."""
    from ..authoring.generate import read_master

    nb = read_master(assignment)
    return [(c.metadata["nbgrader"]["grade_id"], c.source) for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]


def mutants_of(assignment: Assignment, operators=OPERATORS) -> list[Mutant]:
    out = []
    for cell_id, source in solution_cells(assignment):
        out += cell_mutants(cell_id, source, operators)
    return out


def mutant_notebook(assignment: Assignment, mutant: Mutant):
    """The reference notebook (every answer filled in), the mutant's one cell changed."""
    from ..authoring.generate import read_master

    nb = read_master(assignment)
    nb.metadata["course"] = {"assignment": assignment.key}
    hits = [c for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade_id") == mutant.cell]
    assert len(hits) == 1, mutant.cell
    hits[0].source = mutant.source
    return nb


def equivalent_file(assignment: Assignment) -> Path:
    return assignment.master.with_name(f"{assignment.key}.equivalent.toml")


def read_marks(assignment: Assignment) -> tuple[dict[str, str], dict[str, str]]:
    """(id -> reason of the mutants marked equivalent, id -> note of the survivors kept as known gaps).

    A known gap (``gap = "..."``) is a real survivor waiting for a hidden check: it still counts
    against the score; it is only left out of the CI sample. ValueError unless every entry has
    exactly one of `reason` and `gap`, on one line."""
    path = equivalent_file(assignment)
    if not path.exists():
        return {}, {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    marks: dict[str, dict[str, str]] = {"reason": {}, "gap": {}}
    for mid, entry in data.items():
        fields = [f for f in ("reason", "gap") if isinstance(entry, dict) and f in entry]
        text = entry.get(fields[0]) if len(fields) == 1 else None
        if not isinstance(text, str) or not text.strip() or "\n" in text.strip() or len(entry) != 1:
            raise ValueError(f"{path.name}: [{mid}] needs reason = \"...\" (equivalent) or gap = \"...\" "
                             "(a known gap), one of them, on one line")
        marks[fields[0]][mid] = text.strip()
    return marks["reason"], marks["gap"]


def read_equivalent(assignment: Assignment) -> dict[str, str]:
    """id -> reason of the mutants an author marked equivalent."""
    return read_marks(assignment)[0]


def sample(mutants: list[Mutant], n: int, exclude=()) -> list[Mutant]:
    """A fixed sample of `n` mutants, chosen by the hash of their ids (not by their order)."""
    pool = [m for m in mutants if m.id not in exclude]
    pool.sort(key=lambda m: hashlib.sha1(m.id.encode()).hexdigest())
    return sorted(pool[:n], key=lambda m: mutants.index(m))


# --- grading ------------------------------------------------------------------------------------------

def _write_notebooks(assignment, mutants, folder: Path) -> dict[str, Mutant]:
    import nbformat

    if folder.exists():
        shutil.rmtree(folder)  # notebooks of an earlier run would be graded too
    folder.mkdir(parents=True)
    by_student = {}
    for i, m in enumerate(mutants):
        student = f"m{i:04d}"
        nbformat.write(mutant_notebook(assignment, m), str(folder / f"{student}.ipynb"))
        by_student[student] = m
    return by_student


def grade_batch(assignment, mutants, work: Path, *, jobs: int | None = None, sandbox: bool = True,
                warm: bool = True, seed: int = 1, timeout: float | None = None) -> dict[str, dict]:
    """mutant id -> its grading record, from one grading run in this process: the run of
    `python -m autograder grade WORK/submitted --out WORK/out --force --seed SEED` (`GradingRun`),
    sandboxed unless `sandbox` is False, on `jobs` jobs, warm if `warm`, silent on stderr. The
    checks run on one thread, as they did in a `grade` process of their own, unless
    OMP_NUM_THREADS says otherwise."""
    import torch

    from ..batch.grading_run import GradingRun, quiet

    by_student = _write_notebooks(assignment, mutants, work / "submitted")
    run = GradingRun(assignment.key, [work / "submitted"], work / "out", force=True, seed=seed, jobs=jobs or None,
                     sandbox=sandbox, warm=warm, timeout=timeout or None, progress=quiet)
    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    try:
        summary = run.run()
    finally:
        torch.set_num_threads(threads)
    return {by_student[s["student"]].id: s for s in summary["submissions"]}


def grade_in_process(grader, mutants, work: Path, *, seed: int = 1) -> dict[str, dict]:
    """mutant id -> its grading record, graded one after the other by a `Grader` of this process
    (a test can hand one whose hidden checks it has changed)."""
    by_student = _write_notebooks(grader.assignment, mutants, work / "submitted")
    return {m.id: grader.grade(work / "submitted" / f"{s}.ipynb", student=s, seed=seed).to_dict()
            for s, m in by_student.items()}


KILLED, SURVIVED, EQUIVALENT = "killed", "survived", "equivalent"
GRADER_ERROR, NOT_GRADED = "grader_error", "not_graded"


def outcome(record: dict) -> tuple[str, list[str], list[str]]:
    """(killed/survived/grader_error/not_graded, parts that lost points, hints) of one grading record."""
    if record["status"] == "grader_error":
        return GRADER_ERROR, [], [record.get("error", "")]
    if record["status"] != "graded":
        return NOT_GRADED, [], [record.get("error", "")]
    lost = [p for p, v in record["parts"].items() if v["score"] < v["max_score"]]
    hints = []
    for c in record["checks"]:
        if not c["passed"] and c["hint"] not in hints:
            hints.append(c["hint"])
    return (KILLED if record["score"] < record["max_score"] else SURVIVED), lost, hints


def report(key: str, mutants: list[Mutant], records: dict[str, dict], equivalent: dict[str, str],
           seconds: float = 0.0, all_ids: set | None = None, gaps: dict | None = None) -> dict:
    """The JSON report: every mutant's outcome, the score and the stale marks."""
    rows = []
    for m in mutants:
        row = {k: v for k, v in asdict(m).items() if k != "source"}
        if m.id in records:
            status, lost, hints = outcome(records[m.id])
            row.update(score=records[m.id].get("score"), max_score=records[m.id].get("max_score"))
        else:
            status, lost, hints = "not_run", [], []
        if m.id in equivalent and status != KILLED:
            row["reason"] = equivalent[m.id]
            status = EQUIVALENT
        if m.id in (gaps or {}):
            row["gap"] = gaps[m.id]
        row.update(status=status, lost_parts=lost, hints=hints)
        rows.append(row)
    count = {s: sum(r["status"] == s for r in rows) for s in (KILLED, SURVIVED, EQUIVALENT, GRADER_ERROR, NOT_GRADED)}
    counted = len(rows) - count[EQUIVALENT]
    ids = all_ids if all_ids is not None else {m.id for m in mutants}
    return {"assignment": key, "mutants": len(rows), **count,
            "score": round(count[KILLED] / counted, 4) if counted else 1.0,
            "marked_killed": [r["id"] for r in rows if r["id"] in equivalent and r["status"] == KILLED],
            "gap_killed": [r["id"] for r in rows if "gap" in r and r["status"] == KILLED],
            "stale_marks": sorted((set(equivalent) | set(gaps or {})) - ids), "seconds": round(seconds, 1),
            "results": rows}


def format_report(rep: dict) -> str:
    out = [f"{rep['assignment']}: {rep['mutants']} mutants, {rep['killed']} killed, {rep['survived']} survived, "
           f"{rep['equivalent']} marked equivalent, {rep['grader_error']} grader errors"
           + (f", {rep['not_graded']} not graded" if rep["not_graded"] else "")
           + f"; score {100 * rep['score']:.1f} % (killed / (all - equivalent)); {rep['seconds']:.0f} s"]
    groups = [(SURVIVED, "survivors (mark equivalent with a reason, or add a hidden check that kills them)"),
              (GRADER_ERROR, "grader errors (a hidden check crashed: fix the check)"),
              (NOT_GRADED, "not graded"), (EQUIVALENT, "marked equivalent"), (KILLED, "killed")]
    for status, title in groups:
        rows = [r for r in rep["results"] if r["status"] == status]
        if not rows:
            continue
        out.append(f"\n{title}:")
        for r in rows:
            out.append(f"  [{r['id']}] {r['function']}, line {r['line']} of cell {r['cell']}")
            if status == KILLED:
                hint = (r["hints"] or [""])[0]
                out.append(f"      lost: {', '.join(r['lost_parts'])}; hint: {hint[:140]}")
                continue
            out.append("      - " + r["before"].strip().replace("\n", "\n        "))
            out.append("      + " + r["after"].strip().replace("\n", "\n        "))
            if status == EQUIVALENT:
                out.append(f"      reason: {r['reason']}")
            elif "gap" in r:
                out.append(f"      known gap: {r['gap']}")
            elif status in (GRADER_ERROR, NOT_GRADED):
                out.append(f"      {(r['hints'] or [''])[0][:200]}")
    if rep["marked_killed"]:
        out.append("\nmarked equivalent but killed (remove the mark): " + ", ".join(rep["marked_killed"]))
    if rep.get("gap_killed"):
        out.append("\nknown gaps now killed (remove the gap mark): " + ", ".join(rep["gap_killed"]))
    if rep["stale_marks"]:
        out.append("\nstale marks (no such mutant any more; remove them): " + ", ".join(rep["stale_marks"]))
    return "\n".join(out) + "\n"


def run(key: str, *, jobs: int | None = None, sample_size: int | None = None, sandbox: bool = True,
        warm: bool = True, seed: int = 1, timeout: float | None = None, work: Path | None = None) -> dict:
    assignment = get_assignment(key)
    equivalent, gaps = read_marks(assignment)
    every = mutants_of(assignment)
    chosen = sample(every, sample_size, exclude=set(equivalent) | set(gaps)) if sample_size else every
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutants-{key}-") as tmp:
        records = grade_batch(assignment, chosen, Path(work or tmp), jobs=jobs, sandbox=sandbox, warm=warm,
                              seed=seed, timeout=timeout) if chosen else {}
    return report(key, chosen, records, equivalent, time.monotonic() - start, all_ids={m.id for m in every},
                  gaps=gaps)


def mutants_command(args) -> int:
    from ..core.usage import known_assignment

    assignment = known_assignment(args.assignment)  # else a usage error
    if args.list:
        for m in mutants_of(assignment):
            print(f"{m.id}  {m.function}:{m.line}\n    - {m.before.strip()}\n    + {m.after.strip()}")
        return 0
    out = Path(args.out) if args.out else None
    work = out / f"{args.assignment}-grading" if out else None
    rep = run(args.assignment, jobs=args.jobs, sample_size=args.sample, sandbox=not args.no_sandbox,
              warm=not args.no_warm, seed=args.seed, timeout=args.timeout, work=work)
    text = format_report(rep)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.assignment}.txt").write_text(text, encoding="utf-8")
        (out / f"{args.assignment}.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    print(json.dumps(rep, indent=1) if args.json else text, end="" if not args.json else "\n")
    if args.fail_under is not None and 100 * rep["score"] < args.fail_under:
        return 1
    return 0
