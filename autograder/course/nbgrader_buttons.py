"""formgrader's Generate, Autograde and Generate Feedback buttons in a course folder of this course.

nbgrader's own converters would damage the folder that `grade` writes: *Generate*
(`nbgrader generate_assignment`) replaces every answer cell of the released notebook with
nbgrader's stub (its starter code, `def` line and docstring gone); *Autograde* runs learners'
code outside the grader's sandbox, replaces the hidden checks' scores with nbgrader's and
resets manual scores; *Generate Feedback* rewrites our feedback pages from the notebooks and
deletes the `submission_secret.txt` that `release_feedback` needs.

`release` therefore writes a block into the course folder's ``nbgrader_config.py``
(`write_config`), which calls `configure` wherever nbgrader reads that file (formgrader, and
the `nbgrader` commands run in that folder). For this course's assignments (a chapter key),
and for no other assignment of the folder:

- Generate runs the course's `release` (the release notebook and the gradebook's cells);
- Generate Feedback runs the course's `export` (every feedback page, the CSV and the LMS files,
  from the gradebook: an instructor's manual scores and comments included);
- Autograde is refused with one sentence naming the command to run, before anything is
  touched: grading runs learner code, and only `python -m autograder grade` isolates it.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

BEGIN = "# >>> the attention course's grader (written by `python -m autograder release`; rewritten there)"
END = "# <<< the attention course's grader"

BLOCK = f"""{BEGIN}
# formgrader's Generate runs the course's `release`, Generate Feedback its `export`, and Autograde
# is refused (it would run learners' code outside the grader's sandbox): see the instructors' pages.
try:
    from autograder.course.nbgrader_buttons import configure
except ImportError:
    import sys
    print("nbgrader_config.py: the course's grader (autograder) is not importable in this Python: "
          "do not use formgrader's Generate, Autograde or Generate Feedback here", file=sys.stderr)
else:
    configure()
{END}
"""

HEADER = """# nbgrader's configuration of this course folder.
c = get_config()  # noqa: F821
# The exchange (the same two lines go into each learner's own nbgrader_config.py):
# c.CourseDirectory.course_id = "attention"
# c.Exchange.root = "/srv/nbgrader/exchange"

"""

AUTOGRADE_REFUSED = ("formgrader's Autograde (nbgrader autograde) is not used for {keys}: it would run the "
                     "learner's code outside the grader's sandbox and replace the hidden checks' scores. "
                     "Nothing was changed. Grade with: python -m autograder grade --assignment {key} "
                     "submitted/ --out {root}  (manual scores are kept)")


def write_config(out: Path) -> tuple[Path, bool]:
    """OUT/nbgrader_config.py with the course's block (added, or replaced between its two marker
    lines; the rest of the file as it was). (path, whether it was written)."""
    path = out / "nbgrader_config.py"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = HEADER
    start, end = text.find(BEGIN), text.find(END)
    if start != -1 and end > start:
        stop = text.find("\n", end)
        stop = len(text) if stop == -1 else stop + 1
        new = text[:start] + BLOCK + text[stop:]
    else:
        new = text + ("" if text.endswith("\n") or not text else "\n") + ("\n" if text.strip() else "") + BLOCK
    if new == text:
        return path, False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return path, True


def _our_keys(coursedir) -> list[str]:
    """The course's assignments a converter run concerns: its assignment id when that is a chapter key,
    or, for a pattern (nbgrader's "*" or an id left empty), the chapter keys in the course folder's
    source/ that it matches."""
    from ..core.assignments import all_assignments

    keys = {a.key for a in all_assignments()}
    wanted = str(getattr(coursedir, "assignment_id", "") or "*")
    if wanted in keys:
        return [wanted]
    if not any(ch in wanted for ch in "*?["):
        return []
    source = Path(coursedir.root) / str(getattr(coursedir, "source_directory", "source") or "source")
    present = {p.name for p in source.iterdir()} if source.is_dir() else set()
    return sorted(k for k in keys & present if fnmatch.fnmatchcase(k, wanted))


def _export_args(coursedir, key: str) -> list[str]:
    root = Path(coursedir.root).resolve()
    args = [sys.executable, "-m", "autograder", "export", "--assignment", key, "--out", str(root)]
    url = str(getattr(coursedir, "db_url", "") or "")
    if url and url != f"sqlite:///{root / 'gradebook.db'}":
        args += ["--gradebook", url]
    return args


def _generate(self, keys: list[str]) -> None:
    from ..core.usage import known_assignment
    from .nbgrader_course import release_into

    root = Path(self.coursedir.root).resolve()
    for line in release_into(root, [known_assignment(k) for k in keys], self.coursedir.db_url):
        self.log.info("%s", line)
    self.log.info("the course's release wrote %s (nbgrader's generate_assignment would replace the starter "
                  "code of every answer cell)", ", ".join(keys))


def _feedback(self, keys: list[str]) -> None:
    from nbgrader.converters.base import NbGraderException

    for key in keys:
        args = _export_args(self.coursedir, key)
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.run(args, cwd=str(Path(self.coursedir.root).resolve()), env=env, capture_output=True,
                              text=True, timeout=3600)
        for line in (proc.stdout + proc.stderr).splitlines():
            self.log.info("%s", line[:2000])
        if proc.returncode != 0:
            message = f"the course's export of {key} failed (exit {proc.returncode}): see the log above"
            self.log.error("%s", message)
            raise NbGraderException(message)
        self.log.info("the course's export rewrote every feedback page of %s from the gradebook (manual "
                      "scores and comments included)", key)


def _autograde(self, keys: list[str]) -> None:
    from nbgrader.converters.base import NbGraderException

    root = Path(self.coursedir.root).resolve()
    message = AUTOGRADE_REFUSED.format(keys=", ".join(keys), key=keys[0], root=root)
    self.log.error("%s", message)
    raise NbGraderException(message)


def configure(c=None) -> None:
    """Route nbgrader's three converters through the course for its assignments (see the module
    docstring). Idempotent: nbgrader reads its configuration again for every formgrader request."""
    from nbgrader.converters import Autograde, GenerateAssignment, GenerateFeedback

    for cls, action in ((GenerateAssignment, _generate), (Autograde, _autograde), (GenerateFeedback, _feedback)):
        if getattr(cls.start, "_course_routed", False):
            continue
        original = cls.start

        def start(self, _original=original, _action=action):
            keys = _our_keys(self.coursedir)
            if not keys:
                return _original(self)
            return _action(self, keys)

        start._course_routed = True
        cls.start = start


__all__ = ["BEGIN", "END", "BLOCK", "write_config", "configure"]
