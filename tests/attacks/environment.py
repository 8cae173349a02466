"""The caller's Python environment: code planted through PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD or a
`sitecustomize.py` in the working folder must run in none of the helper processes the grader starts.

Whoever starts the grader controls its environment: an instructor's shell, Gradescope's harness, or
a learner's own kernel, where a cell can set `os.environ["PYTHONPATH"]` before `check()` (the
grading process `check()` starts would then run the learner's code and could show full marks where
`grade` gives 0). Every helper therefore starts with `python -I` and an allow-listed environment
(`autograder.isolation.processes`). `Poison` builds such an environment for the tests that start each kind of
helper (tests/isolation/test_sandbox.py, test_warm_start.py, test_in_notebook.py, test_gradescope.py,
test_adversarial_worker.py); `build` adds to the batch a notebook that sets those variables in a
cell and then calls `check()`: `grade` gives it the reference's marks.
"""

from __future__ import annotations

from pathlib import Path

from conftest import add_cell, reference_notebook

KEY = "03_qkv"
NAMES = ("PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD")

# Appends the command line of the process it runs in to MARKS: planted as a sitecustomize.py and as
# the PYTHONSTARTUP script. No helper may ever run it.
RECORD = '''
with open(MARKS, "a") as _f:
    _f.write(open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace") + "\\n")
'''


class Poison:
    """A planted Python environment under `folder`: `env` (PYTHONPATH to a folder whose
    sitecustomize.py records the process it runs in, PYTHONSTARTUP to a script that does the same,
    LD_PRELOAD to a library that does not exist, whose path the dynamic loader of any process that
    gets it prints on stderr), and `cwd`, a working folder with such a sitecustomize.py of its own."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.marks = folder / "marks.txt"
        code = f"MARKS = {str(self.marks)!r}\n" + RECORD
        path, self.cwd = folder / "pythonpath", folder / "cwd"
        for place in (path, self.cwd):
            place.mkdir(exist_ok=True)
            (place / "sitecustomize.py").write_text(code)
        (folder / "startup.py").write_text(code)
        self.library = folder / "missing-preload.so"  # never created
        self.env = {"PYTHONPATH": str(path), "PYTHONSTARTUP": str(folder / "startup.py"),
                    "LD_PRELOAD": str(self.library)}

    def apply(self, monkeypatch) -> "Poison":
        """Plant it in this process (its environment and working folder) until `monkeypatch` is undone."""
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(self.cwd)
        return self

    def ran(self) -> list[str]:
        """The command lines of the processes that ran the planted code."""
        return self.marks.read_text().splitlines() if self.marks.exists() else []

    def loaded(self, text: str) -> bool:
        """Whether `text` (a process's output) shows that the loader was given the planted library."""
        return str(self.library) in text


def environ(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with (/proc/PID/environ)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def planted_in(env: dict) -> list[str]:
    """The planted variables, and any other of the dynamic loader's (LD_*), in an environment."""
    return sorted(k for k in env if k in NAMES or k.startswith("LD_"))


# A learner's cells: the environment poisoned in the kernel, then check(). In a grading worker the
# assignments run too (they change nothing there) and check() does nothing.
POISON_CELL = '''import os
os.environ["PYTHONPATH"] = "/tmp/planted-by-the-notebook"
os.environ["PYTHONSTARTUP"] = "/tmp/planted-by-the-notebook/startup.py"
os.environ["LD_PRELOAD"] = "/tmp/planted-by-the-notebook/missing.so"'''


def build(ctx) -> None:
    nb = reference_notebook(KEY)
    add_cell(nb, POISON_CELL)
    add_cell(nb, "from autograder import check\ncheck()")
    ctx.nbs["env_planted_then_check"] = nb
