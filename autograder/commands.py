"""The `check` and `grade` commands: parse arguments into a `Grader`, then write its results.

Exit codes: 0 when every submission was graded (low scores, rejected notebooks and
rejected entries of the submissions folder included: those are the learners'); 1 when
`check`'s notebook could not be graded; 2 for a usage error (no such file, unknown
assignment, no sandbox, nothing gradable found); 3 when any submission ended in a grader
error (a fault of ours that needs the instructor).

Everything a learner controls (file and folder names, messages, grade ids) is capped and
made visible (`autograder.text`) before it reaches the terminal, the log or a file; the
submissions folder is read by the rule of `find_submissions`, never following a link.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .assignments import all_assignments, get_assignment
from .limits import DEFAULT, Limits
from .notebook import read_at_most
from .text import safe, student_id_problem, visible

EXIT_OK, EXIT_NOT_GRADED, EXIT_USAGE, EXIT_GRADER_ERROR = 0, 1, 2, 3
NO_SANDBOX_WARNING = ("WARNING: --no-sandbox: learner code runs on this machine as you, with access to your "
                      "files, the solutions, the hidden tests and the gradebook. Grade this way only "
                      "notebooks you trust.")
SANDBOX_NOTE = ("The self-check runs your notebook's code on this machine, as you, without a sandbox; "
                "the instructor's grader runs the same checks in isolation.")
log = logging.getLogger("autograder")


def _error(message: str) -> int:
    print(f"error: {visible(message, keep=chr(10))}", file=sys.stderr)
    return EXIT_USAGE


def _progress(line: str) -> None:
    """One progress line on stderr. Learner text in it is already `safe`; this pass makes sure
    no control character at all reaches the terminal (newlines of our own messages kept)."""
    print(visible(line, keep="\n"), file=sys.stderr, flush=True)


class SafeFormatter(logging.Formatter):
    """Log records without control characters; continuation lines (tracebacks) are indented, so no
    text inside a record can pass for a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), keep="\n").replace("\n", "\n    ")


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
    """A learner's check: the worker is started before this process imports torch, the hidden
    checks and the reference (`Submission.start_early`), so the two start-ups overlap; nothing
    that only `grade` needs (nbgrader, nbformat, the gradebook) is imported."""
    path = Path(args.notebook)
    if not path.exists():
        return _error(f"no such file: {path}")
    if path.is_dir():
        return _error(f"{path} is a folder; give the notebook file (.ipynb)")
    key = _infer_assignment(path, args.assignment)
    if key is None:
        known = ", ".join(a.key for a in all_assignments())
        return _error(f"cannot tell which exercise {safe(path.name, 200)} is (it has no course metadata); "
                      f"pass --assignment KEY (known: {known})")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    sandbox = None
    if args.sandbox:
        from .sandbox import Sandbox, SandboxUnavailable

        try:
            sandbox = Sandbox(forbidden=[path.resolve().parent])
        except SandboxUnavailable as exc:
            return _error(str(exc))
    from .runner import Submission

    # self_check: a check that cannot measure what it grades (a memory peak) shows no points for
    # it, since grading may measure it; so a check never shows more than `grade` gives
    early = Submission([], sandbox=sandbox, notebook=path, self_check=True)
    try:
        early.start_early()
        if sandbox is not None:
            # Tried while the worker starts: the worker runs nothing of the learner's before the
            # load, which is sent only after this probe has passed.
            try:
                sandbox.probe()
            except SandboxUnavailable as exc:
                early.close()
                return _error(str(exc))
        from .feedback import bounded, format_text
        from .grader import GRADED, GRADER_ERROR

        grader, code = _grader(key, sandbox=sandbox)
    except BaseException:
        early.close()
        raise
    if grader is None:
        early.close()
        return code
    result = grader.grade(path, seed=args.seed, submission=early)
    if args.json:
        print(_dumps(dict(bounded(result, grader.limits).to_dict(), sandboxed=sandbox is not None)))
    else:
        print(SANDBOX_NOTE if sandbox is None else "The self-check ran your notebook's code in a sandbox.")
        print(format_text(result, limits=grader.limits))
    if result.status == GRADER_ERROR:
        return EXIT_GRADER_ERROR
    return EXIT_OK if result.status == GRADED else EXIT_NOT_GRADED


def _dumps(data) -> str:
    """JSON for stdout: ASCII only (json escapes C0, C1 and bidi characters), DEL escaped too."""
    return json.dumps(data, indent=2).replace("\x7f", "\\u007f")


# --- which notebook is whose: the submissions folder ------------------------------------------
#
# A folder argument DIR is read by depth, never following a link:
#
#   DIR/STUDENT.ipynb                 flat (an LMS download, a folder of files)
#   DIR/STUDENT/KEY.ipynb             one folder per student
#   DIR/STUDENT/KEY/KEY.ipynb         nbgrader's submitted/ layout
#
# STUDENT must be a student id (`text.student_id_problem`): names are never rewritten into
# ids. Regular files not named *.ipynb are never opened (nbgrader's timestamp.txt, a
# README) and `.ipynb_checkpoints` folders are skipped; everything else that is not at one
# of these places (hidden entries, deeper folders, other notebooks, links, FIFOs, sockets,
# devices, names that are not ids) is rejected with a reason, and when it lies inside a
# student's folder that student's submission is flagged. Two notebooks that claim one
# student (or ids that differ only in case) are an error for that student: neither is graded.

KIND_REASONS = {
    "link": "is a symbolic link (never followed)",
    "fifo": "is a FIFO (named pipe), not a file",
    "socket": "is a socket, not a file",
    "device": "is a device, not a file",
    "dir": "is a folder, not a notebook",
    "other": "is not a regular file",
}


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


@dataclass
class Claim:
    """A notebook at one of the layout's places, and the student id its place gives it."""

    student: str
    base: Path               # the folder it was found in as given (the instructor's), or a file's folder
    parts: tuple             # the components below `base`, each opened without following a link
    kind: str                # "file", or why it is no notebook (see KIND_REASONS)
    ident: tuple = ()        # (device, inode): the same file reached twice is one claim

    @property
    def path(self) -> Path:
        return self.base.joinpath(*self.parts)


@dataclass
class Rejected:
    path: str                # as shown: `safe`
    reason: str
    student: str | None = None  # the student whose folder it lies in

    def to_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason, "student": self.student}


@dataclass
class Found:
    """One student's submission: the notebook to grade, or why there is none to grade."""

    student: str
    claim: Claim | None
    problem: str = ""        # not graded because ... (ambiguous, a link, no notebook)
    flags: list = field(default_factory=list)


@dataclass
class Scan:
    found: list              # of Found, by student id
    rejected: list           # of Rejected: the first `limits.rejected_shown`
    rejected_total: int = 0


class _Scanner:
    def __init__(self, key: str, limits: Limits, skip: set):
        self.key, self.limits, self.skip = key, limits, skip
        self.claims: dict[str, list[Claim]] = defaultdict(list)
        self.folders: dict[str, Path] = {}
        self.flags: dict[str, list[str]] = defaultdict(list)
        self.flag_counts: dict[str, int] = defaultdict(int)
        self.rejected: list[Rejected] = []
        self.total = 0

    def show(self, path) -> str:
        return safe(str(path), self.limits.path_chars)

    def reject(self, path, reason: str, student: str | None = None) -> None:
        """Count a rejected entry; list it unless `rejected_shown` are listed, or (inside a student's
        folder) `flags` of that folder are: one learner's thousands of entries hide no one else's."""
        self.total += 1
        shown = self.show(path)
        listed = student is None or self.flag_counts[student] < self.limits.flags
        if listed and len(self.rejected) < self.limits.rejected_shown:
            self.rejected.append(Rejected(shown, reason, student))
        if student is not None:
            self.flag_counts[student] += 1
            if len(self.flags[student]) < self.limits.flags:
                self.flags[student].append(f"{shown} {reason}")

    def claim(self, student: str, base: Path, parts: tuple, kind: str, st) -> None:
        ident = (st.st_dev, st.st_ino) if st is not None else ()
        if ident and any(c.ident == ident and c.student == student for c in self.claims[student]):
            return  # the same file given twice (a folder and a file in it)
        self.claims[student].append(Claim(student, base, parts, kind, ident))

    # the three places ---------------------------------------------------------------
    def _entries(self, fd: int):
        """(name, lstat, kind) of a folder's entries; never follows a link."""
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    yield entry.name, None, "other"
                    continue
                yield entry.name, st, _kind(st.st_mode)

    def _ignored(self, name: str, st, kind: str) -> bool:
        """Entries that are silently passed over: other regular files, Jupyter's checkpoints, --out."""
        if kind == "file" and not name.lower().endswith(".ipynb"):
            return True  # never opened: nbgrader's timestamp.txt, a README, .DS_Store
        if kind == "dir" and (name == ".ipynb_checkpoints" or (st.st_dev, st.st_ino) in self.skip):
            return True
        return False

    def _why_not(self, name: str, kind: str, where: str) -> str:
        if name.startswith("."):
            what = "a hidden folder" if kind == "dir" else "a hidden entry"
            return f"is {what} (its name starts with '.'); not searched or graded"
        if kind == "dir":
            return f"is a folder below the layout ({where}); not searched"
        if kind != "file":
            return KIND_REASONS[kind] + "; not graded"
        return f"is a notebook that is not at the layout's place ({where}); not graded"

    def folder(self, base: Path, fd: int) -> None:
        """DIR: one STUDENT.ipynb or one STUDENT/ folder per student."""
        for name, st, kind in self._entries(fd):
            if self._ignored(name, st, kind):
                continue
            path = base / name
            if name.startswith("."):
                self.reject(path, self._why_not(name, kind, ""))
                continue
            if kind == "dir":
                problem = student_id_problem(name, self.key)
                if problem:
                    self.reject(path, f"is a folder whose name {problem}; not searched")
                    continue
                self.student_folder(base, name, fd)
                continue
            if not name.endswith(".ipynb"):
                self.reject(path, KIND_REASONS.get(kind, "is not named *.ipynb") + "; not graded")
                continue
            student = name[: -len(".ipynb")]
            problem = student_id_problem(student, self.key)
            if problem:
                self.reject(path, f"is a notebook whose name {problem}; not graded")
                continue
            self.claim(student, base, (name,), kind, st)

    def student_folder(self, base: Path, student: str, parent_fd: int) -> None:
        """DIR/STUDENT/: KEY.ipynb, or KEY/KEY.ipynb (nbgrader)."""
        self.folders.setdefault(student, base / student)
        self._folder(base, student, (student,), parent_fd, f"{student}/{self.key}/{self.key}.ipynb or "
                     f"{student}/{self.key}.ipynb", descend=True)

    def key_folder(self, base: Path, student: str, parent_fd: int) -> None:
        """DIR/STUDENT/KEY/: KEY.ipynb only."""
        self._folder(base, student, (student, self.key), parent_fd, f"{student}/{self.key}/{self.key}.ipynb",
                     descend=False)

    def _folder(self, base: Path, student: str, rel: tuple, parent_fd: int, where: str, descend: bool) -> None:
        """Claim `rel`/KEY.ipynb for `student` (and, with `descend`, search `rel`/KEY/); reject the rest."""
        try:
            fd = os.open(rel[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        except OSError as exc:
            self.reject(base.joinpath(*rel), f"could not be read ({exc.strerror}); not searched", student)
            return
        try:
            for name, st, kind in self._entries(fd):
                if self._ignored(name, st, kind):
                    continue
                if name == f"{self.key}.ipynb":
                    self.claim(student, base, (*rel, name), kind, st)
                elif descend and name == self.key and kind == "dir":
                    self.key_folder(base, student, fd)
                else:
                    self.reject(base.joinpath(*rel, name), self._why_not(name, kind, where), student)
        finally:
            os.close(fd)

    def file(self, path: Path) -> None:
        """A notebook given on the command line: its stem is the id, or the student folder of
        nbgrader's layout (STUDENT/KEY/KEY.ipynb); a link or a non-regular file is refused."""
        try:
            st = os.lstat(path)
        except OSError as exc:
            self.reject(path, f"could not be read ({exc.strerror})")
            return
        name, key = path.name, self.key
        if name == f"{key}.ipynb" and path.parent.name == key and path.parent.parent.name:
            student = path.parent.parent.name
            problem = student_id_problem(student, key)
            if problem:
                self.reject(path, f"is in a folder whose name {problem}; not graded")
                return
            self.claim(student, path.parents[2], (student, key, name), _kind(st.st_mode), st)
            return
        student = name[: -len(".ipynb")] if name.endswith(".ipynb") else path.stem
        problem = student_id_problem(student, key)
        if problem:
            self.reject(path, f"is a notebook whose name {problem}; not graded")
            return
        self.claim(student, path.parent, (name,), _kind(st.st_mode), st)

    # the outcome ----------------------------------------------------------------------
    def result(self) -> Scan:
        groups: dict[str, list[Claim]] = defaultdict(list)
        for student, claims in self.claims.items():
            groups[student.lower()] += claims
        found = []
        for student in sorted(set(self.claims) | set(self.folders)):
            flags = sorted(self.flags.get(student, []))
            more = self.flag_counts.get(student, 0) - len(flags)
            if flags:
                flags[0] = f"its folder holds entries that were not graded: {flags[0]}"
            if more > 0:
                flags.append(f"… {more:,} more entries of its folder not graded")
            claims = self.claims.get(student, [])
            group = groups.get(student.lower(), [])
            if len(group) > 1:
                names = [self.show(c.path) for c in group[: self.limits.flags]]
                if len(group) > self.limits.flags:
                    names.append(f"… {len(group) - self.limits.flags} more")
                case = any(c.student != student for c in group)
                found.append(Found(student, None, (
                    f"{len(group)} notebooks claim the student id {student}"
                    + (" (or an id that differs from it only in case)" if case else "")
                    + ": " + ", ".join(names) + "; none of them is graded until only one is left"), flags))
            elif claims and claims[0].kind != "file":
                found.append(Found(student, claims[0], f"{self.show(claims[0].path)} {KIND_REASONS[claims[0].kind]}; "
                                   "not graded: hand in the notebook file itself", flags))
            elif claims:
                found.append(Found(student, claims[0], "", flags))
            else:
                folder = self.show(self.folders[student])
                found.append(Found(student, None, (
                    f"no notebook in {folder} at {self.key}/{self.key}.ipynb or {self.key}.ipynb; nothing was graded"),
                    flags))
        return Scan(found, sorted(self.rejected, key=lambda r: r.path), self.total)


def find_submissions(paths: list[str], key: str, limits: Limits = DEFAULT, out: Path | None = None) -> Scan:
    """The submissions in `paths` (folders, read by the layout rule above, and notebook files),
    one per student, and the entries rejected on the way, each with its reason."""
    skip = set()
    if out is not None:
        try:
            st = os.stat(out)
            skip.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    scanner = _Scanner(key, limits, skip)
    seen_dirs = set()
    for p in map(Path, paths):
        if p.is_dir():  # a folder given on the command line is the instructor's: followed if a link
            try:
                fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                scanner.reject(p, f"could not be read ({exc.strerror})")
                continue
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) not in seen_dirs:
                    seen_dirs.add((st.st_dev, st.st_ino))
                    scanner.folder(p, fd)
            finally:
                os.close(fd)
        else:
            scanner.file(p)
    return scanner.result()


@dataclass
class Read:
    data: bytes | None       # None: not graded, see `problem`
    digest: str = ""
    problem: str = ""        # "is ..." (follows the notebook's path)
    mtime: float | None = None


def read_claim(claim: Claim, limit: int) -> Read:
    """The bytes of a claimed notebook, opened without following a link in any component below
    the folder it was found in, and only if it is a regular file (a FIFO does not block). At
    most `limit` bytes are read; a larger file gives a problem (and a digest of its size and head)."""
    fds = []
    try:
        fd = os.open(claim.base if str(claim.base) else ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.append(fd)
        for part in claim.parts[:-1]:
            fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            fds.append(fd)
        fd = os.open(claim.parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        fds.append(fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return Read(None, problem="is a symbolic link, or lies under one (never followed); not graded")
        return Read(None, problem=f"could not be read ({exc.strerror}); not graded")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Read(None, problem=KIND_REASONS[_kind(st.st_mode)] + "; not graded")
        h = hashlib.sha256()
        data = read_at_most(fd, limit)
        total = len(data)
        h.update(data)
        if total > limit:
            h.update(f"|{st.st_size}|{st.st_mtime_ns}".encode())
            size = max(st.st_size, total)
            return Read(None, h.hexdigest(), f"is {size / 2**20:.1f} MiB; notebooks over {limit / 2**20:g} MiB "
                        "are not graded (clear large outputs first)", st.st_mtime)
        return Read(data, h.hexdigest(), "", st.st_mtime)
    finally:
        for f in fds:
            os.close(f)


# --- grade ------------------------------------------------------------------------------

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
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return path


def _saved(path: Path, digest: str, flags: list) -> dict | None:
    """The saved result of an unchanged, finished submission with the same flags, or None (then
    it is graded again)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (isinstance(saved, dict) and digest and saved.get("sha256") == digest
            and saved.get("status") in ("graded", "error") and saved.get("flags", []) == flags
            and isinstance(saved.get("score"), (int, float)) and isinstance(saved.get("max_score"), (int, float))):
        return saved
    return None


def _progress_line(student: str, result, limits: Limits, flags: list) -> str:
    line = f"{student}: {result.score:g} / {result.max_score:g}"
    if result.status != "graded":
        line += f" ({result.status.upper()}: {safe(result.error, limits.progress_chars)})"
    if result.seed is not None:
        line += f" [{result.seconds:.1f} s, seed {result.seed}]"
    if flags:
        line += f" FLAGGED: {safe('; '.join(flags), limits.progress_chars)}"
    return line


def _grade_batch(args, todo, reports, grader, sandbox, forbidden, overrides, warm, limits, not_graded, finish,
                 total) -> int | None:
    """Grade `todo` ((index, Found) pairs) in this process, on a local Dask cluster (--jobs N) or on
    --scheduler's, writing each result as it arrives; None, or an exit code if grading could not start.

    Each notebook is read again here and its task carries exactly the bytes that were hashed for
    it (what is graded and recorded is what was read, whatever the folder holds meanwhile)."""
    import secrets

    from . import cohort

    scheduler = getattr(args, "scheduler", None)
    # Unasked, a local cluster is started only when each job gets a few submissions: its few seconds
    # to start and stop would cost more than they save on a handful.
    asked = getattr(args, "jobs", None)
    jobs = max(1, min(asked, len(todo)) if asked else min(cohort.default_jobs(), len(todo) // cohort.MIN_PER_JOB))
    cgroup = "auto" if scheduler else (sandbox.cgroups.parent if sandbox is not None and sandbox.cgroups else None)
    cfg = {"use": not args.no_sandbox, "forbidden": forbidden, "cgroup": cgroup}
    progress = cohort.Progress(total, done=total - len(todo))
    progress.to_grade = len(todo)
    by_tag = {}

    def tasks():
        for i, found in todo:
            claim = found.claim
            shown = safe(str(claim.path), limits.path_chars)
            read = read_claim(claim, limits.notebook_bytes)
            if read.data is None:
                progress.dropped()
                reports[i] = not_graded(found, f"{shown} {read.problem}", shown, read.digest)
                continue
            seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
            by_tag[i] = (found, read.digest, read.mtime)
            yield cohort.make_task(i, key=grader.assignment.key, student=found.student, label=str(claim.path),
                                   name=claim.parts[-1], data=read.data, seed=seed, overrides=overrides,
                                   sandbox=cfg, warm=warm)

    if scheduler or jobs > 1:
        try:
            runner = cohort.OnDask(jobs=jobs, address=scheduler, insecure=getattr(args, "insecure_scheduler", False))
        except Exception as exc:  # noqa: BLE001 - no cluster: say why, grade nothing
            where = f"reach the Dask scheduler at {safe(scheduler, 200)}" if scheduler else f"start {jobs} local jobs"
            return _error(f"cannot {where}: {type(exc).__name__}: {exc}")
        if runner.warning:  # an unauthenticated scheduler, asked for: on record in the run's log
            log.warning("%s", runner.warning)
        try:
            probe = cohort.make_task(-1, key=grader.assignment.key, student="", label="", name="", data=b"", seed=0,
                                     overrides=overrides, sandbox=cfg, warm=warm)
            ready = runner.prepare(probe)
            failed = {w: r for w, r in ready.items() if isinstance(r, BaseException)}
            if not ready or failed:
                runner.close()
                if not ready:
                    return _error(f"refusing to grade: the Dask scheduler {safe(scheduler, 200)} has no workers")
                return _error("refusing to grade: " + "; ".join(
                    f"worker {safe(w, 200)}: {type(r).__name__}: {r}" for w, r in sorted(failed.items())[:5]))
            if scheduler:
                for desc in sorted(set(ready.values())):
                    n = sum(1 for d in ready.values() if d == desc)
                    _progress(f"{n} worker(s): {desc}")
            runner.resources = cohort.task_resources(cohort.uses_cuda(grader), runner.workers())
        except BaseException:
            runner.close()
            raise
    else:
        # A warm start only where this process grades: its template is of no use to a cluster's run.
        runner = cohort.Serial(cohort.new_grader(grader.assignment.key, sandbox=sandbox, overrides=overrides,
                                                 warm=True) if warm else grader)
    _progress(f"grading {len(todo)} submission(s) with {runner.name}"
              + (" on GPU workers" if getattr(runner, "resources", None) else ""))
    log.info("grading %d submission(s) with %s", len(todo), runner.name)
    progress.restart()
    try:
        for task, outcome in runner.run(tasks()):
            found, digest, mtime = by_tag.pop(task["tag"])
            cohort.replay_log(outcome)
            result = cohort.result_of(outcome, task, grader)
            reports[task["tag"]] = finish(found, result, digest, mtime, progress.add(result.status, graded=True))
    finally:
        runner.close()
    return None


def grade_command(args) -> int:
    scheduler = getattr(args, "scheduler", None)
    if getattr(args, "insecure_scheduler", False) and not scheduler:
        return _error("--insecure-scheduler goes with --scheduler ADDRESS")
    if scheduler:
        # First of all: a cluster that authenticates nobody is refused unless asked for.
        from .dask_cluster import SchedulerRefused, scheduler_security

        try:
            _, warning = scheduler_security(scheduler, getattr(args, "insecure_scheduler", False))
        except SchedulerRefused as exc:
            return _error(str(exc))
        if warning:
            _progress(warning)
    from nbgrader.api import Gradebook

    from . import gradebook as gbk
    from .feedback import bounded, bounded_flags, feedback_html
    from .grader import ERROR, GRADER_ERROR, Result

    # nbgrader runs the `alembic` command of its environment: make it findable when the
    # environment is not activated (e.g. `.venv/bin/python -m autograder grade ...`).
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    missing = [p for p in args.submissions if not os.path.lexists(p)]
    if missing:
        return _error("no such file or folder: " + ", ".join(safe(p, DEFAULT.path_chars) for p in missing))
    try:
        assignment = get_assignment(args.assignment)
    except KeyError as exc:
        return _error(exc.args[0])
    out = Path(args.out)
    scan = find_submissions(args.submissions, assignment.key, DEFAULT, out=out)
    shown = DEFAULT.rejected_shown
    for r in scan.rejected:
        _progress(f"rejected: {r.path} {r.reason}" + (f" (in {r.student}'s folder)" if r.student else ""))
    if scan.rejected_total > len(scan.rejected):
        _progress(f"rejected: … {scan.rejected_total - len(scan.rejected):,} more entries (only the first {shown} "
                  "are listed, here and in the log)")
    if not scan.found:
        given = " ".join(safe(p, DEFAULT.path_chars) for p in args.submissions)
        return _error(f"no notebooks to grade found in {given}"
                      + (f" ({scan.rejected_total} rejected entries, listed above)" if scan.rejected_total else ""))
    # Learner code runs in bubblewrap unless the instructor explicitly says otherwise.
    # On a cluster (--scheduler) each worker builds and checks its own sandbox (`_grade_batch`).
    sandbox = None
    scheduler = getattr(args, "scheduler", None)
    forbidden = [os.path.abspath(p) for p in (out, *args.submissions)]
    if args.no_sandbox:
        _progress(NO_SANDBOX_WARNING)
    elif not scheduler:
        from .cohort import make_sandbox
        from .sandbox import SandboxUnavailable

        try:
            sandbox = make_sandbox(forbidden=forbidden)
        except SandboxUnavailable as exc:
            return _error(f"refusing to grade: {exc}")
        _progress(sandbox.describe())
    overrides = {"submission_seconds": args.timeout} if args.timeout else None
    warm = bool(getattr(args, "warm", False))
    from .cohort import supports_warm

    if warm and not supports_warm():
        _progress("--warm: this grader has no warm start; every submission starts a fresh worker")
        warm = False
    grader, code = _grader(assignment.key, sandbox=sandbox, overrides=overrides)
    if grader is None:
        return code
    limits = grader.limits
    out.mkdir(parents=True, exist_ok=True)
    log_path = _open_log(out, assignment.key)
    log.info("grading %d submission(s) of %s into %s", len(scan.found), assignment.key, safe(out, limits.path_chars))
    for r in scan.rejected:
        log.warning("rejected: %s %s%s", r.path, r.reason, f" (in {r.student}'s folder)" if r.student else "")
    if scan.rejected_total > len(scan.rejected):
        log.warning("rejected: … %d more entries not listed", scan.rejected_total - len(scan.rejected))
    url = args.gradebook or f"sqlite:///{(out / 'gradebook.db').resolve()}"
    results_dir = out / "results" / assignment.key
    reports = []

    def not_graded(found: Found, reason: str, path: str, digest: str = "") -> dict:
        """A flagged `error` row for a submission that is not graded at all (ambiguous, a link, ...)."""
        result = Result(assignment=assignment.key, notebook=path, student=found.student, status=ERROR, error=reason,
                        max_score=grader.max_score, seed=None,
                        parts={p: {"score": 0.0, "max_score": m} for p, m in grader.parts.items()})
        return finish(found, result, digest)

    def finish(found: Found, result, digest: str, timestamp: float | None = None, tail: str = "") -> dict:
        flags = bounded_flags(found.flags, limits)
        result = bounded(result, limits)
        gbk.record(gb, assignment, found.student, result, timestamp=timestamp, flagged=bool(flags))
        fb = out / "feedback" / found.student / f"{assignment.key}.html"
        fb.parent.mkdir(parents=True, exist_ok=True)
        fb.write_text(feedback_html(result, flags, limits), encoding="utf-8")
        data = dict(result.to_dict(), sha256=digest, feedback=str(fb), skipped=False, flags=flags)
        # Written last: a run killed before this line regrades this learner next time.
        _write_json_atomic(results_dir / f"{found.student}.json", data)
        _progress(_progress_line(found.student, result, limits, flags) + tail)
        log.info("%s (%s): %s, status %s, seed %s, %.1f s%s", found.student, result.notebook,
                 f"{result.score:g}/{result.max_score:g}", result.status, result.seed, result.seconds,
                 f", flagged: {'; '.join(flags)}" if flags else "")
        if result.status == ERROR and result.seed is None:
            log.warning("%s: not graded: %s", found.student, result.error)
        return data

    with Gradebook(url) as gb:
        gbk.sync_assignment(gb, assignment)
        todo = []  # (index, found) of the submissions to grade, in scan order
        for found in scan.found:
            i, student, claim = len(reports), found.student, found.claim
            reports.append(None)
            shown_path = safe(str(claim.path), limits.path_chars) if claim else ""
            if found.problem:
                reports[i] = not_graded(found, found.problem, shown_path)
                continue
            read = read_claim(claim, limits.notebook_bytes)
            if read.data is None:
                reports[i] = not_graded(found, f"{shown_path} {read.problem}", shown_path, read.digest)
                continue
            flags = bounded_flags(found.flags, limits)
            saved = None if args.force else _saved(results_dir / f"{student}.json", read.digest, flags)
            # Skipped only if the gradebook also has the row (it may be a new or restored one).
            if saved is not None and gbk.has_submission(gb, assignment, student):
                saved["skipped"] = True
                reports[i] = saved
                flagged = f" FLAGGED: {safe('; '.join(flags), limits.progress_chars)}" if flags else ""
                _progress(f"{student}: already graded ({saved['score']:g} / {saved['max_score']:g}); "
                          f"--force regrades{flagged}")
                continue
            todo.append((i, found))
        if todo:
            code = _grade_batch(args, todo, reports, grader, sandbox, forbidden, overrides, warm, limits,
                                not_graded, finish, len(scan.found))
            if code is not None:
                return code
        statuses = {}
        for f in sorted(results_dir.glob("*.json")):
            try:
                statuses[f.stem] = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
        table = gbk.rows(gb, assignment, statuses, limits)
    csv_path = out / f"{assignment.key}_grades.csv"
    gbk.write_csv(csv_path, table, limits)
    faults = [r for r in reports if r.get("status") == GRADER_ERROR]
    summary = {"assignment": assignment.key, "gradebook": url, "csv": str(csv_path), "log": str(log_path),
               "submissions": reports, "rejected": [r.to_dict() for r in scan.rejected],
               "rejected_total": scan.rejected_total}
    if args.json:
        print(_dumps(summary))
    else:
        print(visible(f"gradebook: {url}\ncsv: {csv_path}\nfeedback: {out / 'feedback'}\nlog: {log_path}", keep="\n"))
    if faults:
        _progress(f"{len(faults)} submission(s) hit a grader error (not the learners' fault): "
                  + ", ".join(str(r.get("student")) for r in faults) + f". Tracebacks: {log_path}")
        return EXIT_GRADER_ERROR
    return EXIT_OK

