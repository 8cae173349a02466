"""Gradescope's autograder: grade the notebook in /autograder/submission into results.json, or package it.

Follows Gradescope's autograder specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip an instructor uploads holds `setup.sh` (run once, as root, when Gradescope builds the
image) and `run_autograder` (run for every submission, in /autograder); the zip's content is
unpacked into /autograder/source, the learner's files are in /autograder/submission, and
/autograder/results/results.json is what Gradescope reads: an overall `score`, `execution_time`,
`output`, `visibility`, `stdout_visibility` and `tests`, one per hidden check (`name`, `score`,
`max_score`, `status`, `output`, `visibility`); every text is marked plain text (`output_format`,
`test_output_format`, `test_name_format`, and each test's `output_format` and `name_format`:
"text"), never rendered as HTML or Markdown.

Visibility. When learners see each test is the instructor's choice in course.toml (`[gradescope]
visibility`, an exercise's `gradescope_visibility` and `gradescope_checks`, course_config.py), in
the spec's four values: the exercise's is the top-level `visibility`, and every test carries its
own (its check's entry, else its part's, else the exercise's). Gradescope hides the total while a
test worth points waits for the due date or for publishing, so the text above the tests then
leaves the score out too; a notebook that could not be graded is told so at once (top level
"visible"). `--package --config course.toml` writes these settings of the one exercise into the
zip (course/course.toml), and run_autograder grades with them.

The zip holds what grading its one exercise needs: the autograder package with that exercise's
hidden tests only, its reference module, its learner notebook and its master; no other
exercise's hidden tests, reference or notebook.

Isolation. In Gradescope's container the hidden tests and the reference sit beside the learner's
code, the whole runs as root, and a learner's code could write results.json itself. The learner's
worker therefore runs in the course's sandbox (bubblewrap, autograder/isolation/sandbox.py) where it works;
where bubblewrap cannot start there (a container without the rights it needs), it runs as an
unprivileged uid of its own (`UidIsolation`), with the course and the results folder closed to
other users, as the OOM killer's first choice, and with every process of its uid killed when it
ends; where neither is possible the notebook is not graded, and results.json says so.
`run_autograder` starts the grader isolated from the harness's environment (`python -I`, the
variables of `processes.ENV_NAMES` only), as every process the course starts.

`AUTOGRADER_ROOT` (default /autograder) moves the whole tree, so tests run `run_autograder` in a
temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ..core.text import safe
from ..core.usage import UsageError, known_assignment

NOT_YOURS = "This is not a mistake in your work: your instructor has been told and will regrade it."
MAX_DEPTH = 4  # folders searched below the submission folder


# --- results.json -------------------------------------------------------------------------------------

def write_results(path: Path, results: dict) -> None:
    """Write results.json atomically (Gradescope never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=True), encoding="utf-8")
    os.replace(tmp, path)


# Every text of results.json is shown as plain text: Gradescope's default for the output
# ("simple_format") lets HTML through, and "md" or "html" would render a learner's text (a hint
# quoting a value, a file name) as markup. Set on the top level and on every test.
PLAIN = {"output_format": "text", "test_output_format": "text", "test_name_format": "text"}
PLAIN_TEST = {"output_format": "text", "name_format": "text"}


def not_graded(sentence: str, start: float) -> dict:
    """A results.json for a submission that was not graded: 0 points and one sentence saying why."""
    return {"score": 0.0, "execution_time": int(time.monotonic() - start), "output": sentence, **PLAIN,
            "visibility": "visible", "stdout_visibility": "hidden", "tests": []}


# Tests shown later: Gradescope hides the total while one of them, worth points, is not shown yet
LATER = {"after_due_date": "after the due date", "after_published": "once your instructor publishes the grades"}


def results_of(result, limits, titles: dict, start: float, settings=None) -> dict:
    """Gradescope's results.json of a `grader.Result`: one test per hidden check, each with the visibility
    `settings` (a `course_config.AssignmentSettings`; None: every test visible) gives it."""
    from ..grading.feedback import bounded
    from ..grading.grader import GRADED, GRADER_ERROR

    r = bounded(result, limits)
    tests = []
    for c in r.checks:
        part = titles.get(c.part) or c.part
        shown = settings.check_visibility(c.name, c.part) if settings is not None else "visible"
        tests.append({"name": safe(f"{part}: {c.title}", 300), "score": float(c.points),
                      "max_score": float(c.max_points), "status": "passed" if c.passed else "failed",
                      "output": "" if c.passed else c.hint, **PLAIN_TEST, "visibility": shown})
    later = [t for t in tests if t["visibility"] in LATER and t["max_score"] > 0]
    if later:  # the score would tell what the tests held back do
        when = " or ".join(LATER[v] for v in LATER if any(t["visibility"] == v for t in later))
        lines = [f"{r.assignment}: your score, and {len(later)} of the {len(tests)} checks, are shown {when}."]
    else:
        lines = [f"{r.assignment}: {r.score:g} / {r.max_score:g} points."]
    if r.status == GRADER_ERROR:
        lines.append(f"Some checks could not run: {NOT_YOURS}")
    elif r.status != GRADED:
        lines.append(f"Your notebook was not graded: {r.error}")
    lines += [f"Note: {n}" for n in r.notes]
    top = settings.gradescope_visibility if settings is not None and r.status in (GRADED, GRADER_ERROR) else "visible"
    return {"score": float(round(r.score, 4)), "execution_time": int(time.monotonic() - start),
            "output": "\n".join(lines), **PLAIN, "visibility": top, "stdout_visibility": "hidden",
            "tests": tests}


# --- the submission --------------------------------------------------------------------------------------

def find_notebook(folder: Path, max_bytes: int) -> tuple[Path | None, str]:
    """The one notebook in `folder` (its checkpoints left out), or (None, why not in one sentence)."""
    if not folder.is_dir() or folder.is_symlink():
        return None, "No submission folder was found: submit your notebook (one .ipynb file)."
    found, links = [], []
    for here, dirs, files in os.walk(folder):
        depth = len(Path(here).relative_to(folder).parts)
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files):
            if name.lower().endswith(".ipynb"):
                p = Path(here) / name
                (links if p.is_symlink() else found).append(p)
    if links and not found:
        return None, f"{safe(links[0].name, 100)} is a link, not a notebook: submit the notebook file itself."
    if not found:
        return None, "Your submission holds no notebook (.ipynb): submit the exercise's notebook."
    if len(found) > 1:
        names = ", ".join(safe(str(p.relative_to(folder)), 100) for p in found[:5])
        return None, f"Your submission holds {len(found)} notebooks ({names}): submit only the exercise's notebook."
    st = found[0].lstat()
    size = st.st_size
    if not stat.S_ISREG(st.st_mode):
        return None, (f"{safe(found[0].name, 100)} is not a regular file (a pipe, a device or a socket): submit the "
                      "notebook file itself.")
    if size > max_bytes:
        return None, (f"{safe(found[0].name, 100)} is larger than the grader accepts ({size:,} bytes, at most "
                      f"{max_bytes:,}): clear its outputs (Kernel, Restart and Clear Output) and submit it again.")
    return found[0], ""


def assignment_of(path: Path) -> str | None:
    """The exercise a notebook was generated for (its course metadata), else its name if that is a key."""
    from ..core.assignments import all_assignments
    from ..core.notebook import NotebookError, read_notebook

    try:
        key = read_notebook(path).assignment
    except NotebookError:
        key = None
    keys = {a.key for a in all_assignments()}
    return key if key in keys else (path.stem if path.stem in keys else None)


# --- isolation -----------------------------------------------------------------------------------------

class UidIsolation:
    """Runs the worker as an unprivileged uid of its own, without bubblewrap (root only).

    What protects the grade: the uid cannot read the course (hidden tests, reference) nor write
    the results folder, both closed to other users by `close` (mode 0700, owned by root); the
    worker gets no capabilities, no_new_privs, and the sandbox's process, file, CPU and memory
    limits (prlimit); it is the kernel OOM killer's first choice (oom_score_adj 1000, set as root
    before the uid is dropped, so that it cannot lower it), and when it ends every process of its
    uid is killed (`UidPool.end`): nothing it started outlives it. What this does not do, unlike
    bubblewrap: hide the rest of the file system (what other users may read stays readable), cut
    the network, filter system calls, or cap the memory of all its processes together."""

    def __init__(self, limits, python: str = sys.executable):
        from ..isolation.sandbox import Wrapped
        from ..isolation.uids import SANDBOX_UIDS, UidPool
        from ..isolation.unavailable import SandboxUnavailable

        self._wrapped = Wrapped
        if os.geteuid() != 0:
            raise SandboxUnavailable("running as another uid needs root")
        for tool in ("setpriv", "prlimit"):
            if not shutil.which(tool):
                raise SandboxUnavailable(f"`{tool}` (util-linux) is missing")
        self.limits, self.python = limits, python
        self.uids = UidPool(SANDBOX_UIDS)
        self.address_space_limit = True
        self.folder = Path(tempfile.mkdtemp(prefix="gradescope-worker-"))
        os.chmod(self.folder, 0o755)

    def close_to_others(self, paths) -> None:
        """Make each folder root's alone (0700), and refuse when one cannot be closed."""
        from ..isolation.unavailable import SandboxUnavailable

        for p in paths:
            p = Path(p)
            p.mkdir(parents=True, exist_ok=True)
            os.chown(p, 0, 0)
            os.chmod(p, 0o700)
            st = os.stat(p)
            if st.st_uid != 0 or st.st_mode & 0o077:
                raise SandboxUnavailable(f"{p} could not be closed to other users")

    def wrap(self, argv_tail, *, files, env, notebook=None, extra_fds=(), chdir="/tmp"):
        uid = self.uids.take()
        for f in files:
            target = self.folder / Path(f).name
            if not target.exists():
                shutil.copyfile(f, target)
                os.chmod(target, 0o444)
        home = Path(tempfile.mkdtemp(prefix="home-", dir=self.folder))
        os.chown(home, uid, uid)
        os.chmod(home, 0o700)
        lim = self.limits
        # the first process volunteers for the OOM killer as root (the uid could not lower it again)
        argv = ["sh", "-c", 'echo 1000 > /proc/self/oom_score_adj && exec "$@"', "autograder-worker",
                "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--",
                "prlimit", f"--nproc={lim.sandbox_processes}", f"--fsize={lim.sandbox_file_size}",
                f"--nofile={lim.sandbox_open_files}", f"--cpu={lim.sandbox_cpu_seconds}", "--core=0",
                f"--as={lim.sandbox_address_space}", "--",
                # sh stays the parent, so the worker is the one process below it (memory_meters)
                "sh", "-c", '"$@"; exit $?', "autograder-worker",
                self.python, "-I", str(self.folder / Path(files[0]).name), *argv_tail]
        inner = dict(env, HOME=str(home), TMPDIR=str(home), USER="learner", LOGNAME="learner")
        from ..isolation.uids import ender

        # once the worker's first process has ended: kill everything of its uid, then clean up
        release = ender(self.uids, uid, lambda: shutil.rmtree(home, ignore_errors=True))

        return self._wrapped(argv=argv, pass_fds=tuple(extra_fds), env=inner, cwd=str(home), uid=uid,
                             release=release)

    def probe(self) -> None:
        """Start Python once as a worker uid; SandboxUnavailable when it cannot (a Python installation
        that uid cannot read, say), so that a worker that cannot start is never the learner's 0."""
        from ..isolation.unavailable import SandboxUnavailable

        script = self.folder / "probe.py"
        script.write_text("import os, sys\nsys.stdout.write('ok %d' % os.getuid())\n", encoding="utf-8")
        os.chmod(script, 0o444)
        w = self.wrap([], files=[script], env={"PATH": "/usr/bin:/bin"})
        try:
            p = subprocess.run(w.argv, env=w.env, cwd=w.cwd, capture_output=True, text=True, timeout=60)
        finally:
            w.release()
        if p.returncode != 0 or p.stdout.strip() != f"ok {w.uid}":
            raise SandboxUnavailable(f"Python ({self.python}) does not start as uid {w.uid} "
                                     f"(exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]})")

    def describe(self) -> str:
        return "isolation: an unprivileged uid of its own (no bubblewrap), course and results closed to it"


def isolation(limits, forbidden, close):
    """(the sandbox to grade with, how it isolates) or (None, why grading is refused).
    `forbidden`: what the sandbox must not show; `close`: folders the uid fallback closes to others."""
    from ..isolation.sandbox import make_sandbox
    from ..isolation.unavailable import SandboxUnavailable

    try:
        sb = make_sandbox(forbidden=forbidden)
        return sb, "sandbox: bubblewrap"
    except SandboxUnavailable as exc:
        first = str(exc)
    try:
        if close is None:
            raise SandboxUnavailable("the course and the results are not under AUTOGRADER_ROOT's source and "
                                     "results folders, which it would close to other users")
        uid = UidIsolation(limits)
        uid.close_to_others(close)
        uid.probe()
        return uid, f"bubblewrap unavailable ({first}); the worker runs as an unprivileged uid"
    except (SandboxUnavailable, OSError) as exc:
        return None, (f"learner code cannot be isolated here, so the notebook was not graded: bubblewrap "
                      f"failed ({first}) and no other uid can be used ({exc})")


# --- the command --------------------------------------------------------------------------------------

def gradescope_command(args) -> int:
    if args.package:
        if not args.assignment:
            raise UsageError("--package needs --assignment KEY: the zip grades one exercise")
        from .course_config import CourseConfig, load_config

        config = load_config(args.config) if getattr(args, "config", None) else CourseConfig()
        path = package(args.assignment, Path(args.package), config)
        settings = config.assignment(known_assignment(args.assignment).key)
        own = ", ".join(f"{n}: {v}" for n, v in settings.gradescope_checks.items())
        print(f"wrote {path}: upload it as the autograder of a Gradescope programming assignment; learners see "
              f"its tests: {settings.gradescope_visibility}{f' ({own})' if own else ''}"
              f"{'' if config.path else ' (no --config: the default of course.toml [gradescope] visibility)'}")
        return 0
    return grade(args)


def grade(args) -> int:
    """Grade the submission into results.json; always writes it (0 and a sentence when not graded)."""
    start = time.monotonic()
    results_path = Path(args.results)
    from ..core.limits import DEFAULT

    try:
        from .course_config import CourseConfig, load_config

        # the instructor's settings, packaged with the zip (learners' bytes are never read for them)
        config = load_config(args.config) if getattr(args, "config", None) else CourseConfig()
        key = args.assignment
        assignment = known_assignment(key) if key else None
        nb, why = find_notebook(Path(args.submission), DEFAULT.notebook_bytes)
        if nb is None:
            write_results(results_path, not_graded(why, start))
            print(why)
            return 0
        if assignment is None:
            key = assignment_of(nb)
            if key is None:
                sentence = "Your notebook is not one of the course's exercises (it has no course metadata)."
                write_results(results_path, not_graded(sentence, start))
                print(sentence)
                return 0
            assignment = known_assignment(key)
        from ..core.assignments import ROOT

        # the uid fallback closes Gradescope's source and results folders, and only those
        tree = Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")).resolve()
        inside = all(str(p.resolve()).startswith(str(tree / sub) + "/")
                     for p, sub in ((ROOT, "source"), (results_path, "results")))
        sandbox, how = isolation(DEFAULT, forbidden=[ROOT, results_path.parent],
                                 close=[tree / "source", tree / "results"] if inside else None)
        print(how)
        if sandbox is None:
            write_results(results_path, not_graded(f"Your notebook could not be graded safely here. {NOT_YOURS}", start))
            return 3
        from ..grading.grader import course_grader
        from ..learner.history import exercise

        grader = course_grader(assignment.key, sandbox=sandbox)
        result = grader.grade(nb, seed=args.seed, label=nb.name)
        results = results_of(result, grader.limits, exercise(assignment).titles, start,
                             config.assignment(assignment.key))
        write_results(results_path, results)
        print(f"{assignment.key}: {results['score']:g} / {result.max_score:g} ({result.status}), seed {result.seed}")
        return 3 if result.status == "grader_error" else 0
    except UsageError as exc:
        write_results(results_path, not_graded(f"The autograder is misconfigured: {exc} {NOT_YOURS}", start))
        print(exc)
        return 2
    except Exception:  # noqa: BLE001 - ours: the learner sees a sentence, the instructor the traceback
        import traceback

        traceback.print_exc(file=sys.stdout)  # Gradescope shows stdout to the instructor only
        write_results(results_path, not_graded(f"The grader failed on this submission. {NOT_YOURS}", start))
        return 3


# --- the zip -----------------------------------------------------------------------------------------

SETUP_SH = r"""#!/usr/bin/env bash
# Run once by Gradescope, as root, when it builds the autograder's image (Ubuntu).
# Installs Python 3.11 where the image lacks it, bubblewrap and util-linux (the sandbox), and the
# course's learner stack with PyTorch's CPU build into /opt/attention-course, outside the course.
set -euo pipefail
SOURCE="${AUTOGRADER_ROOT:-/autograder}/source"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y bubblewrap util-linux
if ! command -v python3.11 >/dev/null; then
    apt-get install -y software-properties-common
    apt-get install -y python3.11 python3.11-venv || {
        add-apt-repository -y ppa:deadsnakes/ppa && apt-get update && apt-get install -y python3.11 python3.11-venv; }
fi
python3.11 -m venv /opt/attention-course
/opt/attention-course/bin/pip install --upgrade pip
/opt/attention-course/bin/pip install "torch==__TORCH__" --index-url https://download.pytorch.org/whl/cpu
/opt/attention-course/bin/pip install -r "$SOURCE/requirements-gradescope.txt"
# the course (hidden tests, reference) is root's alone: the learner's code never runs as root
chmod 0700 "$SOURCE"
chmod 0755 "$SOURCE/run_autograder"
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Run by Gradescope for every submission, as root, in /autograder.
set -uo pipefail
# The grader starts isolated from this shell's environment, as every process the course starts:
# only these variables reach it (autograder/isolation/processes.py, ENV_NAMES), and Python runs with -I.
keep=()
for name in $(compgen -e); do
    case "$name" in
        __KEEP__) keep+=("$name=${!name}") ;;
        *) unset "$name" 2>/dev/null ;;
    esac
done
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-/opt/attention-course/bin/python3.11}"
mkdir -p "$ROOT/results"
cd "$ROOT/source/course" || exit 3
exec env -i "${keep[@]}" OMP_NUM_THREADS=1 "$PYTHON" -I -c "$LAUNCH" "$PWD" gradescope --assignment __KEY__ \
    --config "$PWD/course.toml" --submission "$ROOT/submission" --results "$ROOT/results/results.json"
"""
# `python -I -m autograder` would not find the course (-I leaves the working folder off sys.path)
LAUNCH = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from autograder.cli import entry_point; "
          'entry_point("python -m autograder")')


def run_autograder(key: str) -> str:
    """The run_autograder script of exercise `key`."""
    from ..isolation.processes import ENV_NAMES, ENV_PREFIXES

    keep = "|".join([*sorted(ENV_NAMES), *(f"{p}*" for p in ENV_PREFIXES)])
    return (RUN_AUTOGRADER.replace("__KEEP__", keep).replace("__KEY__", key)
            .replace('"$LAUNCH"', "'" + LAUNCH + "'"))


NOTES = """# The autograder of __KEY__ for Gradescope

Made by `python -m autograder gradescope --assignment __KEY__ --package ZIP --config course.toml`.

1. In Gradescope: Create Assignment, Programming Assignment; total points __POINTS__.
2. Configure Autograder: Ubuntu base image (22.04 or later), upload this zip, Update Autograder.
   `setup.sh` installs Python 3.11, bubblewrap and the course's CPU stack (a few minutes).
3. Test Autograder with the exercise's notebook: learners submit `__KEY__.ipynb` only.

Each hidden check is one test in Gradescope (its name, points and, when failed, its hint).
When learners see them (`course/course.toml`, from the instructor's course.toml): __SHOWN__.
The learner's code runs in bubblewrap where the container allows it, else as an unprivileged
uid that can read neither the course nor the results; where neither works the submission
gets 0 with a sentence saying it was not graded, and the autograder's output (instructors
only) says why. Specification followed: https://gradescope-autograders.readthedocs.io/en/latest/specs/
"""

LEARNER_STACK = ("numpy", "matplotlib", "rapidfuzz", "transformers", "tokenizers")


def _pins(root: Path) -> dict:
    pins = {}
    for line in (root / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def course_files(root: Path, key: str) -> list[tuple[Path, str]]:
    """(file, path in the zip) of what grading exercise `key` needs: the autograder package with `key`'s
    hidden tests and no other exercise's (nor the hidden tests' authoring guide, README.md), the reference
    package with `key`'s module only (the references import no other), `key`'s learner notebook and its
    master (which the grader reads); nothing built."""
    hidden = root / "autograder" / "hidden"
    out = []
    for p in sorted((root / "autograder").rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or p.is_symlink() or "__pycache__" in rel.parts or p.suffix == ".pyc":
            continue
        if p.parent == hidden and ((p.name.startswith("test_") and p.name != f"test_{key}.py") or p.suffix == ".md"):
            continue
        out.append((p, f"course/{rel.as_posix()}"))
    for rel in ("solutions/__init__.py", f"solutions/ch{key}.py", f"exercises/{key}.ipynb",
                f"exercises/source/{key}.md"):
        out.append((root / rel, f"course/{rel}"))
    return out


def settings_toml(key: str, settings) -> str:
    """The course.toml the zip carries: exercise `key`'s Gradescope settings (`AssignmentSettings`), which
    `course_config.load_config` reads back inside Gradescope (the instructor's file, with its other
    exercises and its roster, stays home)."""
    def string(text: str) -> str:  # a TOML basic string: JSON's escapes are TOML's
        return json.dumps(text, ensure_ascii=True)

    checks = ", ".join(f"{string(n)} = {string(v)}" for n, v in settings.gradescope_checks.items())
    return (f"# The Gradescope settings of {key}, written by `python -m autograder gradescope --package`\n"
            f"[assignments.{key}]\ngradescope_visibility = {string(settings.gradescope_visibility)}\n"
            f"gradescope_checks = {{ {checks} }}\n")


def package(key: str, zip_path: Path, config=None) -> Path:
    """Write the autograder zip of `key` with the Gradescope settings of `config` (a `CourseConfig`; None:
    the defaults); nothing is downloaded here: setup.sh installs at image build."""
    from ..core.assignments import ROOT, in_checkout
    from .course_config import CourseConfig

    assignment = known_assignment(key)
    key = assignment.key
    settings = (config or CourseConfig()).assignment(key)
    if not in_checkout():
        raise UsageError("`gradescope --package` works in a clone of the course's repository")
    pins = _pins(ROOT)
    from ..core.notebook import read_notebook, reference_cells
    from ..grading.grader import part_points

    points = sum(part_points(reference_cells(read_notebook(assignment.notebook))).values())
    requirements = "".join(f"{n}=={pins[n]}\n" for n in LEARNER_STACK if n in pins)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = zip_path.with_name(zip_path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        def add(name: str, text: str, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)

        add("setup.sh", SETUP_SH.replace("__TORCH__", pins.get("torch", "2.13.0")), 0o755)
        add("run_autograder", run_autograder(key), 0o755)
        shown = settings.gradescope_visibility + "".join(f"; {n}: {v}" for n, v in settings.gradescope_checks.items())
        add("README.md", NOTES.replace("__KEY__", key).replace("__POINTS__", f"{points:g}").replace("__SHOWN__", shown))
        add("requirements-gradescope.txt", requirements)
        add("course/course.toml", settings_toml(key, settings))
        for path, name in course_files(ROOT, key):
            add(name, path.read_bytes())
    os.replace(tmp, zip_path)
    return zip_path


__all__ = ["gradescope_command", "package", "find_notebook", "results_of", "not_graded", "UidIsolation",
           "course_files", "settings_toml"]
