"""Shared fixtures: submissions made from the reference, and the command line; and which tests
are slow (`make test-fast` runs the others: ``pytest -m "not slow"``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# `make test` runs the suite on two xdist workers (pytest -n 2). Each worker's sandboxes take
# uids of their own range, so that a test that looks for processes left behind by its own
# grading run (tests/attacks) never sees the other worker's sandboxes. Set before the grader
# is imported: autograder.isolation.uids reads it once.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit() and "AUTOGRADER_SANDBOX_UID" not in os.environ:
    os.environ["AUTOGRADER_SANDBOX_UID"] = str(64123 + 1024 * int(_WORKER[2:]))

import autograder  # noqa: F401 - first: it keeps nbformat's import cheap (autograder._skip_iri_grammars)
import nbformat
import pytest

from autograder.authoring.generate import read_master
from autograder.core.assignments import ROOT, get_assignment


def reference_notebook(key: str) -> nbformat.NotebookNode:
    """The master as a learner's notebook with every answer filled in (the solutions)."""
    nb = read_master(get_assignment(key))
    nb.metadata["course"] = {"assignment": key}  # as in the learner notebook it stands for
    return nb


def learner_notebook(key: str) -> nbformat.NotebookNode:
    """The untouched learner notebook, as a learner downloads it."""
    return nbformat.read(str(get_assignment(key).notebook), as_version=4)


def edit(nb: nbformat.NotebookNode, old: str, new: str) -> nbformat.NotebookNode:
    """Replace `old` by `new` in the notebook's code; the text must occur."""
    hits = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and old in cell.source:
            cell.source = cell.source.replace(old, new)
            hits += 1
    assert hits, f"{old!r} not found in the notebook: the fixture is out of date"
    return nb


def mistake(key: str, *pairs: tuple[str, str]):
    """A maker of the reference notebook of `key` with each (old, new) text edit applied."""
    def make() -> nbformat.NotebookNode:
        nb = reference_notebook(key)
        for old, new in pairs:
            edit(nb, old, new)
        return nb
    return make


def add_cell(nb: nbformat.NotebookNode, source: str, after_grade_id: str | None = None) -> nbformat.NotebookNode:
    """Add a code cell the learner wrote (no nbgrader metadata), after a given cell or at the end."""
    cell = nbformat.v4.new_code_cell(source)
    index = len(nb.cells)
    if after_grade_id:
        index = next(i for i, c in enumerate(nb.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == after_grade_id) + 1
    nb.cells.insert(index, cell)
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m autograder ARGS`, as a user runs it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args[:1] == ("grade",) and os.environ.get("AUTOGRADER_WARM") == "1":
        args = (*args, "--warm")  # the adversarial suite and the chapter harness, graded warm
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_json(*args: str, **kw) -> dict:
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def wait_until(condition, timeout: float = 60.0) -> bool:
    """Whether `condition()` came to hold, polled until it does: a test waits for an event this way
    (a process gone, a file written), never for a guessed delay. `timeout` only ends a wait on a
    broken run; it is no estimate of how long the event takes, and no machine is that slow."""
    import time

    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return bool(condition())
        time.sleep(0.05)
    return True


@pytest.fixture
def root() -> Path:
    return ROOT


# --- the fast target: what `pytest -m "not slow"` leaves out ----------------------------------
# A test is slow when it uses one of these fixtures (each an end-to-end run of minutes, shared by
# the tests that read it), when its whole file is slow, or when it says so itself
# (`@pytest.mark.slow`: end-to-end grading through the command line, notebooks executed, mutants
# or seeds graded).

SLOW_FIXTURES = {
    "batch": "the adversarial suite: every attack graded in one sandboxed batch",
    "graded_chapter": "one sandboxed grading run per chapter over its harness batch",
    "site": "the built book (built first when missing)",
    "browser": "a Chromium driving the built book",
}
SLOW_FILES = {
    "test_browser.py": "the built book in a browser",
    "test_check_matches_grade.py": "every chapter's harness graded by `grade`, `check` and `check --sandbox`",
    "test_cohort.py": "batches graded on local Dask clusters",
    "test_adversarial_cluster.py": "Dask clusters attacked by a second local user",
    "test_reliability.py": "a grading run killed mid-batch and resumed",
}


# --- two workers: which tests run together, and in what order -------------------------------
# `make test` runs `pytest -n 2 --dist loadgroup --no-loadscope-reorder`: each worker takes a
# group of tests at a time, and a group's tests share its session and module fixtures, so no
# fixture is built twice. A test that uses one of SHARED_FIXTURES joins that fixture's group
# (every adversarial test one batch, every chapter test the chapter harness); any other test
# joins the group of its file. The groups start in the order of HEAVY_FIRST (the costliest
# first, measured by benchmarks/suite_time.py; see "What a test costs" in
# book/instructors/authoring.md), then the others in file order, so that the last group to
# finish is a short one.

SHARED_FIXTURES = {
    "batch": "adversarial-batch",
    "graded_chapter": "chapter-harness",
    "site": "built-book",
    "browser": "built-book",
}
HEAVY_FIRST = ("chapter-harness", "adversarial-batch", "test_term.py", "test_mutants.py", "test_check_matches_grade.py",
               "test_reliability.py", "built-book", "test_generate.py", "test_cohort.py",
               "test_nbgrader_workflow.py", "test_warm_start.py", "test_grade_cli.py")


def group_of(item) -> str:
    """The group a test runs in (see above)."""
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in SHARED_FIXTURES.items():
        if fixture in names:
            return group
    return item.path.name


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark slow every test of a file in SLOW_FILES and every test that uses a fixture of SLOW_FIXTURES;
    give each test its group, and put the heavy groups first (a stable sort: within a group, and
    among the others, the collection order stays)."""
    rank = {group: i for i, group in enumerate(HEAVY_FIRST)}
    groups = {}
    for item in items:
        if item.path.name in SLOW_FILES or SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        groups[item.nodeid] = group_of(item)
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: rank.get(groups[item.nodeid], len(rank)))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_group_ids(config, items):
    """On an xdist worker under --dist loadgroup, make sure each test id carries its group.

    xdist tells the controller a test's group by appending `@GROUP` to its id; xdist 3.8 does
    it by setting `item._nodeid`, which pytest 9 no longer reads (a node's id is `item._id`),
    so every test would be scheduled alone and each worker would build every shared fixture.
    This appends it where xdist's own attempt did not take."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers
        return
    from _pytest.nodeid import NodeId

    for item in items:
        group = group_of(item)
        if not item.nodeid.endswith("@" + group):
            item._id = NodeId.parse(f"{item.nodeid}@{group}")


# --- the chapter harness: one sandboxed grading run per chapter, shared by every test ------

def chapter_batch(key: str) -> dict:
    """student -> notebook maker for a chapter's harness run: reference, stub and its table's mistakes."""
    from chapters import tables

    table = tables()[key]
    batch = {"ref": lambda: reference_notebook(key), "stub": lambda: learner_notebook(key)}
    for name, m in table.MISTAKES.items():
        batch[name] = m.make or mistake(key, *m.edits)
    return batch


CHAPTER_LANES = 2  # chapter runs graded at once, each `grade --jobs 1 --warm` (one core each)
# The chapters whose harness runs take longest (06: 28 notebooks of a Transformer), started
# first so that a long run does not end the harness alone.
CHAPTERS_LONGEST = ("06_transformer", "07_efficient_attention", "09_gpt", "08_pronunciation")
HARNESS_TIMEOUT = 600  # seconds per submission in the harness runs (see ChapterHarness._start)


class ChapterHarness:
    """The chapter harness's `grade` runs, one per chapter, started ahead of the tests that read
    them: CHAPTER_LANES at a time, the longest first, so that while one chapter's tests run the
    next chapters are being graded. A chapter a test asks for that has not started starts at once."""

    def __init__(self, tmp_path_factory, keys: list[str]):
        self.factory = tmp_path_factory
        keys = list(dict.fromkeys(keys))
        self.todo = [k for k in CHAPTERS_LONGEST if k in keys] + [k for k in keys if k not in CHAPTERS_LONGEST]
        self.running: dict = {}
        self.done: dict = {}

    def _start(self, key: str) -> None:
        if key in self.todo:
            self.todo.remove(key)
        base = self.factory.mktemp(f"grading{key}")
        for student, make in chapter_batch(key).items():
            write(make(), base / "submitted" / f"{student}.ipynb")
        out = base / "out"
        # As an instructor runs it (sandboxed), warm, on one core: two runs share the two cores
        # without paying a local cluster's start each; --jobs N is graded by tests/batch/test_cohort.py
        # and the adversarial batch. No row of a table is an endless loop, so the submission's
        # time budget is raised from 120 s to HARNESS_TIMEOUT: a loaded or slow machine never
        # turns a row's lost checks into a time-out (one row takes 15-30 s on an idle machine).
        args = [sys.executable, "-m", "autograder", "grade", "--assignment", key, str(base / "submitted"),
                "--out", str(out), "--json", "--jobs", "1", "--warm", "--timeout", str(HARNESS_TIMEOUT)]
        with open(base / "grade.out", "wb") as stdout, open(base / "grade.err", "wb") as stderr:
            proc = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                    stdout=stdout, stderr=stderr)
        self.running[key] = (base, out, proc)

    def _fill(self) -> None:
        """Start chapters while fewer than CHAPTER_LANES runs are still grading."""
        while self.todo and sum(p.poll() is None for _, _, p in self.running.values()) < CHAPTER_LANES:
            self._start(self.todo[0])

    def get(self, key: str):
        import time

        if key not in self.done:
            if key not in self.running:
                self._start(key)
            base, out, proc = self.running[key]
            deadline = time.monotonic() + 900
            while proc.poll() is None and time.monotonic() < deadline:
                self._fill()  # a lane that another chapter's run freed starts the next chapter
                time.sleep(0.2)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            del self.running[key]
            self._fill()
            stderr = (base / "grade.err").read_text(errors="replace")
            assert proc.returncode in (0, 1), stderr[-3000:]
            summary = json.loads((base / "grade.out").read_text())
            self.done[key] = (base, out, summary, {s["student"]: s for s in summary["submissions"]})
        return self.done[key]

    def close(self) -> None:
        for _, _, proc in self.running.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.running.clear()


def harness_keys(session) -> list[str]:
    """The chapters whose harness the collected tests read, in the order they will ask for them."""
    keys = []
    for item in session.items:
        if "graded_chapter" in getattr(item, "fixturenames", ()):
            key = getattr(getattr(item, "callspec", None), "params", {}).get("chapter")
            if isinstance(key, str):
                keys.append(key)
    return keys


@pytest.fixture(scope="session")
def graded_chapter(request, tmp_path_factory):
    """A function KEY -> (base folder, out folder, JSON summary, {student: submission}) from one
    `grade` run per chapter over its harness batch, as an instructor runs it (sandboxed), cached
    for the session (`ChapterHarness`)."""
    harness = ChapterHarness(tmp_path_factory, harness_keys(request.session))
    yield harness.get
    harness.close()


# --- the adversarial suite: every attack module's submissions in one sandboxed batch -------
# The batch is graded warm (`grade --warm`: each learner's worker forked from a template that
# imported torch once): the path with the most to defend, a template every learner of a job is
# forked from, where one learner's leftovers could reach the next, and with the second seccomp
# filter, the fork and the renewal of /tmp that only it has. The sandbox both paths share
# (bubblewrap, the first filter, the uid, the memory cgroup) is attacked here through it; the fresh
# worker that `grade` starts by default is tested directly by tests/isolation/test_sandbox.py and graded cold
# end to end by test_grade_cli.py, test_cohort.py, test_reliability.py, test_check_matches_grade.py
# and the memory attacks (test_adversarial_memory.py, cold and warm). Cold, the batch's 108
# notebooks started about 160 fresh workers, each importing torch: about 120 CPU seconds more.
# `ADVERSARIAL_COLD=1 make test` grades the batch with fresh workers (it passes both ways).

@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """One `grade` run over every attack of tests/attacks/, with what the tests need to judge it."""
    import hashlib
    import sqlite3

    from attacks import KEY, TIMEOUT, Context, modules
    from attacks.cheats_and_escapes import procs_left

    base = tmp_path_factory.mktemp("adversarial")
    ctx = Context(base=base, subs=base / "subs", out=base / "out")
    ctx.subs.mkdir()
    for module in modules():
        module.build(ctx)
    for name, nb in ctx.nbs.items():
        path = ctx.subs / f"{name}.ipynb"
        if isinstance(nb, dict):
            path.write_text(json.dumps(nb, separators=(",", ":")), encoding="utf-8")
        else:
            write(nb, path)

    def sha(p):
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    before = {str(p): sha(p) for p in ctx.protected}
    before_subs = {str(p.relative_to(ctx.subs)): sha(p) for p in ctx.subs.rglob("*")
                   if p.is_file() and not p.is_symlink()}
    start = () if os.environ.get("ADVERSARIAL_COLD") == "1" else ("--warm",)  # see BATCH_START
    proc = run_cli("grade", str(ctx.subs), "--assignment", KEY, "--out", str(ctx.out), "--timeout", TIMEOUT, "--json",
                   *start)
    for clean in ctx.cleanups:
        clean()
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    con = sqlite3.connect(str(ctx.gradebook))
    yield {
        "ctx": ctx, "data": data, "by": {r["student"]: r for r in data["submissions"]}, "out": ctx.out,
        "subs": ctx.subs, "gradebook": ctx.gradebook, "listener": ctx.extra.get("listener"), "before": before,
        "before_subs": before_subs, "protected": ctx.protected, "con": con,
        "csv": (ctx.out / f"{KEY}_grades.csv").read_text().splitlines(), "stderr": proc.stderr,
        "leftover": procs_left(),
    }
    con.close()
