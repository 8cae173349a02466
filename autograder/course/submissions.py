"""Which notebook is whose: the rule of the submissions folder, and reading what it claims.

A folder given to `grade` (DIR) is read by depth, never following a link:

  DIR/STUDENT.ipynb                 flat (an LMS download, a folder of files)
  DIR/STUDENT/KEY.ipynb             one folder per student
  DIR/STUDENT/KEY/KEY.ipynb         nbgrader's submitted/ layout

STUDENT must be a student id (`text.student_id_problem`): names are never rewritten into
ids. A student's folder may hold the other assignments of the course beside KEY's
(STUDENT/OTHER/ or STUDENT/OTHER.ipynb, OTHER a chapter key): they are passed over, as they
are another run's. Regular files not named *.ipynb are never opened (nbgrader's timestamp.txt, a
README) and `.ipynb_checkpoints` folders are skipped; everything else that is not at one
of these places (hidden entries, deeper folders, other notebooks, links, FIFOs, sockets,
devices, names that are not ids) is rejected with a reason, and when it lies inside a
student's folder that student's submission is flagged. Two notebooks that claim one
student (or ids that differ only in case) are an error for that student: neither is graded.

`find_submissions` applies the rule; `read_claim` reads a claimed notebook again, the way
every notebook is read (`regular_file.read_regular`), when it is about to be graded.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..core.assignments import KEY_RE
from ..core.limits import DEFAULT, Limits
from ..core.regular_file import ERROR, LINK, kind_of, read_regular
from ..core.text import safe, student_id_problem

KIND_REASONS = {
    "link": "is a symbolic link (never followed)",
    "fifo": "is a FIFO (named pipe), not a file",
    "socket": "is a socket, not a file",
    "device": "is a device, not a file",
    "dir": "is a folder, not a notebook",
    "other": "is not a regular file",
}


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
        self.broken: dict[str, str] = {}  # student -> why their entry could not be scanned (`_guarded`)

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
                yield entry.name, st, kind_of(st.st_mode)

    def _ignored(self, name: str, st, kind: str) -> bool:
        """Entries that are silently passed over: other regular files, Jupyter's checkpoints, --out."""
        if kind == "file" and not name.lower().endswith(".ipynb"):
            return True  # never opened: nbgrader's timestamp.txt, a README, .DS_Store
        if kind == "dir" and (name == ".ipynb_checkpoints" or (st.st_dev, st.st_ino) in self.skip):
            return True
        return False

    def _another_assignment(self, name: str, kind: str) -> bool:
        """Whether an entry of a student's folder is that student's work for another assignment of the
        course (a folder or a notebook named by a chapter key other than KEY): a course folder holds
        every assignment side by side (nbgrader's submitted/STUDENT/KEY/), and grading one leaves the
        others alone. Anything else there is still rejected and flags the student."""
        other = name if kind == "dir" else name[: -len(".ipynb")] if kind == "file" and name.endswith(".ipynb") else ""
        return bool(KEY_RE.match(other)) and other != self.key

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
        """DIR: one STUDENT.ipynb or one STUDENT/ folder per student. Each entry is scanned under its own
        guard (`_guarded`): whatever one learner's entry holds, the others are scanned."""
        try:
            for name, st, kind in self._entries(fd):
                self._guarded(base, name, lambda: self._top_entry(base, fd, name, st, kind))
        except Exception as exc:  # noqa: BLE001 - the folder's listing itself broke off: say so, keep what was found
            self.reject(base, f"could not be read to the end ({type(exc).__name__}); entries may be missing")

    def _guarded(self, base: Path, name: str, scan) -> None:
        """Run `scan` (one entry of DIR); any exception in it costs only the student the entry names: that
        student's submission is not graded, with the reason, and nobody else's scan is touched."""
        try:
            scan()
        except Exception as exc:  # noqa: BLE001 - learner file and folder names and contents are hostile
            student = name[: -len(".ipynb")] if name.endswith(".ipynb") else name
            reason = f"could not be scanned ({type(exc).__name__}); not graded"
            try:
                an_id = bool(student) and not student_id_problem(student, self.key)
            except Exception:  # noqa: BLE001
                an_id = False
            if an_id:
                self.broken[student] = f"{self.show(base / name)} {reason}"
            else:
                self.reject(base / name, reason)

    def _top_entry(self, base: Path, fd: int, name: str, st, kind: str) -> None:
        if self._ignored(name, st, kind):
            return
        path = base / name
        if name.startswith("."):
            self.reject(path, self._why_not(name, kind, ""))
            return
        if kind == "dir":
            problem = student_id_problem(name, self.key)
            if problem:
                self.reject(path, f"is a folder whose name {problem}; not searched")
                return
            self.student_folder(base, name, fd)
            return
        if not name.endswith(".ipynb"):
            self.reject(path, KIND_REASONS.get(kind, "is not named *.ipynb") + "; not graded")
            return
        student = name[: -len(".ipynb")]
        problem = student_id_problem(student, self.key)
        if problem:
            self.reject(path, f"is a notebook whose name {problem}; not graded")
            return
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
                elif descend and self._another_assignment(name, kind):
                    continue  # DIR/STUDENT/OTHER/ or DIR/STUDENT/OTHER.ipynb: graded with OTHER, not here
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
            self.claim(student, path.parents[2], (student, key, name), kind_of(st.st_mode), st)
            return
        student = name[: -len(".ipynb")] if name.endswith(".ipynb") else path.stem
        problem = student_id_problem(student, key)
        if problem:
            self.reject(path, f"is a notebook whose name {problem}; not graded")
            return
        self.claim(student, path.parent, (name,), kind_of(st.st_mode), st)

    # the outcome ----------------------------------------------------------------------
    def result(self) -> Scan:
        groups: dict[str, list[Claim]] = defaultdict(list)
        for student, claims in self.claims.items():
            groups[student.lower()] += claims
        found = []
        for student in sorted(set(self.claims) | set(self.folders) | set(self.broken)):
            try:
                found.append(self._found(student, groups))
            except Exception as exc:  # noqa: BLE001 - one student's claims never stop the others'
                found.append(Found(student, None, f"{self.show(student)}'s submission could not be scanned "
                                   f"({type(exc).__name__}); not graded"))
        return Scan(found, sorted(self.rejected, key=lambda r: r.path), self.total)

    def _found(self, student: str, groups: dict) -> Found:
        flags = sorted(self.flags.get(student, []))
        more = self.flag_counts.get(student, 0) - len(flags)
        if flags:
            flags[0] = f"its folder holds entries that were not graded: {flags[0]}"
        if more > 0:
            flags.append(f"… {more:,} more entries of its folder not graded")
        if student in self.broken:
            return Found(student, None, self.broken[student], flags)
        claims = self.claims.get(student, [])
        group = groups.get(student.lower(), [])
        if len(group) > 1:
            names = [self.show(c.path) for c in group[: self.limits.flags]]
            if len(group) > self.limits.flags:
                names.append(f"… {len(group) - self.limits.flags} more")
            case = any(c.student != student for c in group)
            return Found(student, None, (
                f"{len(group)} notebooks claim the student id {student}"
                + (" (or an id that differs from it only in case)" if case else "")
                + ": " + ", ".join(names) + "; none of them is graded until only one is left"), flags)
        if claims and claims[0].kind != "file":
            return Found(student, claims[0], f"{self.show(claims[0].path)} {KIND_REASONS[claims[0].kind]}; "
                         "not graded: hand in the notebook file itself", flags)
        if claims:
            return Found(student, claims[0], "", flags)
        folder = self.show(self.folders[student])
        return Found(student, None, (
            f"no notebook in {folder} at {self.key}/{self.key}.ipynb or {self.key}.ipynb; nothing was graded"),
            flags)


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
        try:
            _scan_given(scanner, p, seen_dirs)
        except Exception as exc:  # noqa: BLE001 - one given path never stops the scan of the others
            scanner.reject(p, f"could not be scanned ({type(exc).__name__})")
    return scanner.result()


def _scan_given(scanner: _Scanner, p: Path, seen_dirs: set) -> None:
    if p.is_dir():  # a folder given on the command line is the instructor's: followed if a link
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            scanner.reject(p, f"could not be read ({exc.strerror})")
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) not in seen_dirs:
                seen_dirs.add((st.st_dev, st.st_ino))
                scanner.folder(p, fd)
        finally:
            os.close(fd)
    else:
        scanner.file(p)


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
    got = read_regular(claim.base, claim.parts, limit)
    if got.refused == LINK:
        return Read(None, problem="is a symbolic link, or lies under one (never followed); not graded")
    if got.refused == ERROR:
        return Read(None, problem=f"could not be read ({got.strerror}); not graded")
    if got.refused:
        return Read(None, problem=KIND_REASONS[got.refused] + "; not graded")
    h = hashlib.sha256(got.data)
    if got.over(limit):
        h.update(f"|{got.size}|{got.mtime_ns}".encode())
        size = max(got.size, len(got.data))
        return Read(None, h.hexdigest(), f"is {size / 2**20:.1f} MiB; notebooks over {limit / 2**20:g} MiB "
                    "are not graded (clear large outputs first)", got.mtime)
    return Read(got.data, h.hexdigest(), "", got.mtime)


__all__ = ["KIND_REASONS", "Claim", "Rejected", "Found", "Scan", "find_submissions", "Read", "read_claim"]
