"""The `check` and `grade` commands: parse arguments into a `Grader`, then write its results.

Exit codes: 0 when every submission was graded (low scores and rejected notebooks
included: those are the learners'); 1 when `check`'s notebook could not be graded;
2 for a usage error (no such file, unknown assignment, no sandbox); 3 when any
submission ended in a grader error (a fault of ours that needs the instructor).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from .assignments import all_assignments, get_assignment

EXIT_OK, EXIT_NOT_GRADED, EXIT_USAGE, EXIT_GRADER_ERROR = 0, 1, 2, 3
NO_SANDBOX_WARNING = ("WARNING: --no-sandbox: learner code runs on this machine as you, with access to your "
                      "files, the solutions, the hidden tests and the gradebook. Grade this way only "
                      "notebooks you trust.")
SANDBOX_NOTE = ("The self-check runs your notebook's code on this machine, as you, without a sandbox; "
                "the instructor's grader runs the same checks in isolation.")
log = logging.getLogger("autograder")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _infer_assignment(path: Path, given: str | None) -> str | None:
    if given:
        return given
    from .notebook import NotebookError, read_notebook

    try:
        nb = read_notebook(path)
        if nb.assignment:
            return nb.assignment
    except NotebookError:
        pass
    keys = {a.key for a in all_assignments()}
    return path.stem if path.stem in keys else None


def _grader(key: str, **kw):
    """(Grader, None) or (None, exit code) after saying what is wrong."""
    from .grader import Grader, GraderConfigError

    try:
        assignment = get_assignment(key)
    except KeyError as exc:
        return None, _error(exc.args[0])
    try:
        return Grader(assignment, **kw), None
    except GraderConfigError as exc:
        return None, _error(f"the course's files for {key} are inconsistent: {exc}")


# --- check ------------------------------------------------------------------------------

def check_command(args) -> int:
    from .feedback import format_text
    from .grader import GRADED, GRADER_ERROR

    path = Path(args.notebook)
    if not path.exists():
        return _error(f"no such file: {path}")
    if path.is_dir():
        return _error(f"{path} is a folder; give the notebook file (.ipynb)")
    key = _infer_assignment(path, args.assignment)
    if key is None:
        known = ", ".join(a.key for a in all_assignments())
        return _error(f"cannot tell which exercise {path.name} is (it has no course metadata); "
                      f"pass --assignment KEY (known: {known})")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
    sandbox = None
    if args.sandbox:
        from .sandbox import SandboxUnavailable, detect

        try:
            sandbox = detect(forbidden=[path.resolve().parent])
        except SandboxUnavailable as exc:
            return _error(str(exc))
    grader, code = _grader(key, sandbox=sandbox)
    if grader is None:
        return code
    result = grader.grade(path, seed=args.seed)
    if args.json:
        print(json.dumps(dict(result.to_dict(), sandboxed=sandbox is not None), indent=2))
    else:
        print(SANDBOX_NOTE if sandbox is None else "The self-check ran your notebook's code in a sandbox.")
        print(format_text(result))
    if result.status == GRADER_ERROR:
        return EXIT_GRADER_ERROR
    return EXIT_OK if result.status == GRADED else EXIT_NOT_GRADED


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


def _open_log(out: Path, key: str) -> Path:
    """A log file for this run, OUT/logs/grade-KEY-TIME.log, that receives the grader's log records."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"grade-{key}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return path


def _saved(path: Path, digest: str) -> dict | None:
    """The saved result of an unchanged, finished submission, or None (then it is graded again)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (isinstance(saved, dict) and digest and saved.get("sha256") == digest
            and saved.get("status") in ("graded", "error")
            and isinstance(saved.get("score"), (int, float)) and isinstance(saved.get("max_score"), (int, float))):
        return saved
    return None


def grade_command(args) -> int:
    from nbgrader.api import Gradebook

    from . import gradebook as gbk
    from .feedback import feedback_html
    from .grader import GRADER_ERROR

    # nbgrader runs the `alembic` command of its environment: make it findable when the
    # environment is not activated (e.g. `.venv/bin/python -m autograder grade ...`).
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    missing = [p for p in args.submissions if not Path(p).exists()]
    if missing:
        return _error("no such file or folder: " + ", ".join(missing))
    try:
        assignment = get_assignment(args.assignment)
    except KeyError as exc:
        return _error(exc.args[0])
    out = Path(args.out)
    submissions = find_submissions(args.submissions, assignment.key)
    if not submissions:
        return _error("no notebooks found in " + " ".join(args.submissions))
    # Learner code runs in bubblewrap unless the instructor explicitly says otherwise.
    sandbox = None
    if args.no_sandbox:
        _progress(NO_SANDBOX_WARNING)
    else:
        from .sandbox import SandboxUnavailable, detect

        try:
            sandbox = detect(forbidden=[out, *args.submissions])
        except SandboxUnavailable as exc:
            return _error(f"refusing to grade: {exc}")
        _progress(sandbox.describe())
    overrides = {"submission_seconds": args.timeout} if args.timeout else None
    grader, code = _grader(assignment.key, sandbox=sandbox, overrides=overrides)
    if grader is None:
        return code
    out.mkdir(parents=True, exist_ok=True)
    log_path = _open_log(out, assignment.key)
    log.info("grading %d submission(s) of %s into %s", len(submissions), assignment.key, out)
    url = args.gradebook or f"sqlite:///{(out / 'gradebook.db').resolve()}"
    results_dir = out / "results" / assignment.key
    reports = []
    seen: set[str] = set()
    with Gradebook(url) as gb:
        gbk.sync_assignment(gb, assignment)
        for student, path in submissions:
            if student in seen:
                msg = f"another submission in this batch already uses the student id {student!r}; not graded"
                reports.append({"student": student, "notebook": str(path), "status": "error", "error": msg,
                                "score": 0, "max_score": None, "checks": [], "skipped": True})
                _progress(f"{student}: {msg}")
                log.warning("%s: %s (%s)", student, msg, path)
                continue
            seen.add(student)
            digest = _sha256(path)
            saved_path = results_dir / f"{student}.json"
            saved = None if args.force else _saved(saved_path, digest)
            # Skipped only if the gradebook also has the row (it may be a new or restored one).
            if saved is not None and gbk.has_submission(gb, assignment, student):
                saved["skipped"] = True
                reports.append(saved)
                _progress(f"{student}: already graded ({saved['score']:g} / {saved['max_score']:g}); --force regrades")
                continue
            result = grader.grade(path, student=student, seed=args.seed)
            gbk.record(gb, assignment, student, result, timestamp=_mtime(path))
            fb = out / "feedback" / student / f"{assignment.key}.html"
            fb.parent.mkdir(parents=True, exist_ok=True)
            fb.write_text(feedback_html(result), encoding="utf-8")
            data = dict(result.to_dict(), sha256=digest, feedback=str(fb), skipped=False)
            # Written last: a run killed before this line regrades this learner next time.
            _write_json_atomic(saved_path, data)
            reports.append(data)
            line = (f"{student}: {result.score:g} / {result.max_score:g}"
                    + ("" if result.status == "graded" else f" ({result.status.upper()}: {result.error})")
                    + f" [{result.seconds:.1f} s, seed {result.seed}]")
            _progress(line)
            log.info("%s (%s): %s, status %s, seed %d, %.1f s", student, path, f"{result.score:g}/{result.max_score:g}",
                     result.status, result.seed, result.seconds)
        statuses = {}
        for f in sorted(results_dir.glob("*.json")):
            try:
                statuses[f.stem] = json.loads(f.read_text(encoding="utf-8"))
            except ValueError:
                pass
        table = gbk.rows(gb, assignment, statuses)
    csv_path = out / f"{assignment.key}_grades.csv"
    gbk.write_csv(csv_path, table)
    faults = [r for r in reports if r.get("status") == GRADER_ERROR]
    summary = {"assignment": assignment.key, "gradebook": url, "csv": str(csv_path), "log": str(log_path),
               "submissions": reports}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"gradebook: {url}\ncsv: {csv_path}\nfeedback: {out / 'feedback'}\nlog: {log_path}")
    if faults:
        _progress(f"{len(faults)} submission(s) hit a grader error (not the learners' fault): "
                  + ", ".join(str(r.get("student")) for r in faults) + f". Tracebacks: {log_path}")
        return EXIT_GRADER_ERROR
    return EXIT_OK


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
