"""The `check` and `grade` commands: run the scoring, then report, record and export."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import sys
from pathlib import Path

from .assignments import get_assignment
from .scoring import Result, grade_notebook

NO_SANDBOX_WARNING = ("WARNING: --no-sandbox: learner code runs on this machine as you, with access to your "
                      "files, the solutions, the hidden tests and the gradebook. Grade this way only "
                      "notebooks you trust.")
SANDBOX_NOTE = ("The self-check runs your notebook's code on this machine, as you, without a sandbox; "
                "the instructor's grader runs the same checks in isolation.")


# --- check ------------------------------------------------------------------------------

def format_text(result: Result, with_student: bool = False) -> str:
    lines = []
    who = f" ({result.student})" if with_student and result.student else ""
    lines.append(f"Exercise {result.assignment}{who}: {result.notebook}")
    if result.status != "graded":
        lines.append(f"  NOT GRADED: {result.error}")
        return "\n".join(lines)
    width = max([len(p) for p in result.parts] + [10])
    for part, s in result.parts.items():
        lines.append(f"  {part:<{width}}  {_num(s['score'])} / {_num(s['max_score'])}")
        for c in result.checks:
            if c.part == part and not c.passed:
                lines.append(f"      x {c.title} (0 / {_num(c.max_points)})")
                lines.append(f"        hint: {c.hint}")
    lines.append(f"  {'total':<{width}}  {_num(result.score)} / {_num(result.max_score)}")
    for note in result.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:g}"


def _infer_assignment(path: Path, given: str | None) -> str:
    if given:
        return given
    from .notebook import NotebookError, read_notebook

    try:
        nb = read_notebook(path)
        if nb.assignment:
            return nb.assignment
    except NotebookError:
        pass
    return path.stem


def _audited_grade(assignment, path: Path, **kw) -> Result:
    """Check the notebook's nbgrader cells, then grade it (unless they were forged).

    Never raises: an unexpected failure becomes a result with status "error" and a reason."""
    from .notebook import NotebookError, audit_cells, read_notebook
    from .scoring import part_points

    notes: list[str] = []
    try:
        try:
            audit = audit_cells(read_notebook(path), assignment.notebook)
        except NotebookError:
            audit = None  # grade_notebook reports the unreadable notebook itself
        if audit is not None and audit.rejected:
            parts = part_points(assignment)
            return Result(assignment=assignment.key, notebook=str(path), status="error", error=audit.rejected,
                          max_score=float(sum(parts.values())), notes=audit.notes,
                          parts={p: {"score": 0.0, "max_score": m} for p, m in parts.items()})
        notes = audit.notes if audit is not None else []
        result = grade_notebook(assignment, path, **kw)
    except Exception as exc:  # noqa: BLE001 - a grader fault must not lose the submission
        try:
            parts = part_points(assignment)
        except Exception:  # noqa: BLE001
            parts = {}
        return Result(assignment=assignment.key, notebook=str(path), status="error",
                      error=f"internal grader error ({type(exc).__name__}: {str(exc)[:300]}); please report it",
                      max_score=float(sum(parts.values())),
                      parts={p: {"score": 0.0, "max_score": m} for p, m in parts.items()})
    result.notes = notes + result.notes
    return result


def check_command(args) -> int:
    path = Path(args.notebook)
    try:
        assignment = get_assignment(_infer_assignment(path, args.assignment))
    except KeyError as exc:
        print(f"error: {exc.args[0]}; pass --assignment KEY", file=sys.stderr)
        return 2
    sandbox = None
    if getattr(args, "sandbox", False):
        from .sandbox import SandboxUnavailable, detect

        try:
            sandbox = detect(forbidden=[path.resolve().parent])
        except SandboxUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    result = _audited_grade(assignment, path, sandbox=sandbox)
    if args.json:
        print(json.dumps(dict(result.to_dict(), sandboxed=sandbox is not None), indent=2))
    else:
        print(SANDBOX_NOTE if sandbox is None else "The self-check ran your notebook's code in a sandbox.")
        print(format_text(result))
    return 0 if result.status == "graded" else 1


# --- grade ------------------------------------------------------------------------------

STUDENT_RE = re.compile(r"[^A-Za-z0-9_.@-]")


def find_submissions(paths: list[str], key: str) -> list[tuple[str, Path]]:
    """(student id, notebook) pairs. A folder is searched for notebooks; the student id is
    the folder in nbgrader's layout (``STUDENT/KEY/KEY.ipynb``), else the file's name."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(x for x in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in x.parts)
        else:
            found.append(p)
    out = []
    for nb in found:
        if nb.parent.name == key and nb.parent.parent.name:
            student = nb.parent.parent.name
        else:
            student = nb.stem
        out.append((STUDENT_RE.sub("_", student)[:100] or "unnamed", nb))
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return ""
    return h.hexdigest()


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def feedback_html(result: Result) -> str:
    """The learner's feedback: points, check titles and hints; never hidden code or expected values."""
    e = html.escape
    rows = []
    for part, s in result.parts.items():
        rows.append(f"<tr class='part'><th>{e(part)}</th><th>{_num(s['score'])} / {_num(s['max_score'])}</th></tr>")
        for c in result.checks:
            if c.part != part:
                continue
            mark = "&#10003;" if c.passed else "&#10007;"
            hint = "" if c.passed else f"<div class='hint'>{e(c.hint)}</div>"
            rows.append(f"<tr><td>{mark} {e(c.title)}{hint}</td><td>{_num(c.points)} / {_num(c.max_points)}</td></tr>")
    notes = "".join(f"<li>{e(n)}</li>" for n in result.notes)
    status = (f"<p class='error'>Not graded: {e(result.error)}</p>" if result.status != "graded" else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Feedback: {e(result.assignment)} ({e(result.student)})</title>
<style>body{{font-family:sans-serif;max-width:50em;margin:2em auto}}td,th{{padding:.3em .6em;text-align:left;vertical-align:top}}
tr.part th{{background:#eee}}.hint{{color:#8a3b00;margin-top:.2em}}.error{{color:#a00}}</style></head>
<body><h1>Exercise {e(result.assignment)}</h1>
<p>Learner: <b>{e(result.student)}</b>. Score: <b>{_num(result.score)} / {_num(result.max_score)}</b></p>
{status}<table>{''.join(rows)}</table>
{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}
</body></html>
"""


def grade_command(args) -> int:
    from nbgrader.api import Gradebook

    from . import gradebook as gbk

    # nbgrader runs the `alembic` command of its environment: make it findable when the
    # environment is not activated (e.g. `.venv/bin/python -m autograder grade ...`).
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    try:
        assignment = get_assignment(args.assignment)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    submissions = find_submissions(args.submissions, assignment.key)
    if not submissions:
        print("error: no notebooks found in " + " ".join(args.submissions), file=sys.stderr)
        return 2
    # Learner code runs in bubblewrap unless the instructor explicitly says otherwise.
    sandbox = None
    if getattr(args, "no_sandbox", False):
        print(NO_SANDBOX_WARNING, file=sys.stderr, flush=True)
    else:
        from .sandbox import SandboxUnavailable, detect

        try:
            sandbox = detect(forbidden=[out, *args.submissions])
        except SandboxUnavailable as exc:
            print(f"error: refusing to grade: {exc}", file=sys.stderr)
            return 2
        _progress(args, sandbox.describe())
    out.mkdir(parents=True, exist_ok=True)
    url = args.gradebook or f"sqlite:///{(out / 'gradebook.db').resolve()}"
    results_dir = out / "results" / assignment.key
    timeout = args.timeout or 120.0
    reports = []
    seen: set[str] = set()
    with Gradebook(url) as gb:
        gbk.sync_assignment(gb, assignment)
        for student, path in submissions:
            if student in seen:
                msg = f"another submission in this batch already uses the student id {student!r}; not graded"
                reports.append({"student": student, "notebook": str(path), "status": "error", "error": msg,
                                "score": 0, "max_score": None, "checks": [], "skipped": True})
                _progress(args, f"{student}: {msg}")
                continue
            seen.add(student)
            digest = _sha256(path)
            saved_path = results_dir / f"{student}.json"
            if saved_path.exists() and not args.force:
                try:
                    saved = json.loads(saved_path.read_text(encoding="utf-8"))
                except ValueError:
                    saved = {}
                # Skipped only if the gradebook also has the row (it may be a new or restored one).
                if (isinstance(saved, dict) and saved.get("sha256") == digest and digest
                        and isinstance(saved.get("score"), (int, float))
                        and isinstance(saved.get("max_score"), (int, float))
                        and gbk.has_submission(gb, assignment, student)):
                    saved["skipped"] = True
                    reports.append(saved)
                    _progress(args, f"{student}: already graded ({saved['score']:g} / {saved['max_score']:g}); "
                                    "--force regrades")
                    continue
            result = _audited_grade(assignment, path, total_timeout=timeout, sandbox=sandbox)
            result.student = student
            gbk.record(gb, assignment, student, result, timestamp=_mtime(path))
            fb = out / "feedback" / student / f"{assignment.key}.html"
            fb.parent.mkdir(parents=True, exist_ok=True)
            fb.write_text(feedback_html(result), encoding="utf-8")
            data = dict(result.to_dict(), sha256=digest, feedback=str(fb), skipped=False)
            # Written last: a run killed before this line regrades this learner next time.
            _write_json_atomic(saved_path, data)
            reports.append(data)
            _progress(args, f"{student}: {result.score:g} / {result.max_score:g}"
                            + ("" if result.status == "graded" else f" (NOT GRADED: {result.error})")
                            + f" [{result.seconds:.1f} s]")
        statuses = {}
        for f in sorted(results_dir.glob("*.json")):
            try:
                statuses[f.stem] = json.loads(f.read_text(encoding="utf-8"))
            except ValueError:
                pass
        table = gbk.rows(gb, assignment, statuses)
    csv_path = out / f"{assignment.key}_grades.csv"
    gbk.write_csv(csv_path, table)
    summary = {"assignment": assignment.key, "gradebook": url, "csv": str(csv_path), "submissions": reports}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"gradebook: {url}\ncsv: {csv_path}\nfeedback: {out / 'feedback'}")
    return 0


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _progress(args, line: str) -> None:
    # With --json, stdout carries only the JSON document; progress goes to stderr.
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
