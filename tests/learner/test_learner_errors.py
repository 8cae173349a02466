"""The learner's error messages, tried as a learner meets them: a notebook from an older release
of the course, a part's function renamed, a Python without torch, a GPU notebook checked on a
machine without a GPU. Each is one clear sentence, said once, with no traceback, on the command
line's `check` (stdout, stderr, exit code) and, where it applies, in the check from a notebook
cell (`autograder.learner.in_notebook`), which grades with the same grader and report.

The sentences themselves are tested through the audit and the grader directly (fast); a few
end-to-end checks (about 3 s each) run the command line as a learner does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.core import learner_errors
from autograder.core.assignments import ROOT, get_assignment
from autograder.core.learner_errors import gpu_hint, stack_problem
from autograder.core.notebook import audit_cells, cell_checksum, read_notebook, reference_cells
from autograder.grading.grader import hint_for, load_notes
from autograder.isolation.errors import LearnerError
from conftest import add_cell, learner_notebook, mistake, reference_notebook, run_cli, write

KEY = "03_qkv"
OLD = f"This notebook is from an older release of exercise {KEY}"
GPU = ("asks for a GPU ('cuda'), which this machine does not have: pick the device with "
       "`torch.device('cuda' if torch.cuda.is_available() else 'cpu')`, or take it from the inputs (`x.device`).")


# --- notebooks of an older release ---------------------------------------------------------------

def _gid(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _generate(cell) -> None:
    """Give a locked or grade cell the checksum of its content, as generating a release does."""
    nbg = cell.metadata["nbgrader"]
    nbg["checksum"] = cell_checksum(cell.cell_type, cell.source, nbg)


def older_release(change: str) -> nbformat.NotebookNode:
    """The reference answers in a notebook as an older release of the exercise generated it: one of
    its test cells had another grade id (`renamed`), a part came later (`dropped`: the current
    `test_causal_mask` is not there), one of its tests has gone since (`extra`), or a locked test
    read differently (`changed`)."""
    nb = reference_notebook(KEY)
    for cell in nb.cells:
        nbg = cell.metadata.get("nbgrader", {})
        if nbg.get("locked") or nbg.get("grade"):
            _generate(cell)
    cell = {c_gid: c for c in nb.cells if (c_gid := _gid(c))}
    if change == "renamed":
        cell["test_padding_mask"].metadata["nbgrader"]["grade_id"] = "test_padding"
        _generate(cell["test_padding_mask"])
    elif change == "dropped":
        nb.cells.remove(cell["test_causal_mask"])
    elif change == "extra":
        extra = nbformat.v4.new_code_cell("assert causal_mask(2).shape == (2, 2)")
        extra.metadata["nbgrader"] = dict(cell["test_causal_mask"].metadata["nbgrader"], grade_id="test_mask_shape",
                                          points=1)
        _generate(extra)
        nb.cells.insert(nb.cells.index(cell["test_causal_mask"]) + 1, extra)
    elif change == "changed":
        cell["test_softmax"].source += "\nassert p.sum() > 0"
        _generate(cell["test_softmax"])
    else:
        raise ValueError(change)
    return nb


@pytest.fixture(scope="module")
def generated():
    ref = read_notebook(get_assignment(KEY).notebook)
    return reference_cells(ref), ref.metadata["course"]


def _audit(nb, generated, tmp_path, **kw):
    ref_cells, course = generated
    return audit_cells(read_notebook(write(nb, tmp_path / "nb.ipynb")), ref_cells, key=KEY, ref_course=course, **kw)


@pytest.mark.parametrize("change, refused_by_grade, names", [
    ("renamed", True, ["'test_padding'", "'test_padding_mask'"]),
    ("extra", True, ["'test_mask_shape'"]),
    ("dropped", False, ["'test_causal_mask'"]),
    ("changed", False, ["'test_softmax'"]),
])
def test_an_older_release_is_said_once_and_still_checked(change, refused_by_grade, names, generated, tmp_path):
    """Is a notebook of an older release told apart from a forged one: one sentence naming the cells
    that differ, graded by a learner's check, and refused by `grade` only for grade cells it lacks?"""
    nb = older_release(change)
    mine = _audit(nb, generated, tmp_path, self_check=True)
    assert not mine.rejected
    assert len(mine.notes) == 1 and mine.notes[0].startswith(OLD), mine.notes
    assert all(name in mine.notes[0] for name in names), mine.notes[0]
    assert "copy your answers into the current notebook and check that one" in mine.notes[0]
    assert ("grader will refuse this one" in mine.notes[0]) == refused_by_grade
    assert "forged" not in mine.notes[0] and len(mine.notes[0]) <= 300  # one note, never cut

    theirs = _audit(nb, generated, tmp_path, self_check=False)
    if refused_by_grade:
        assert theirs.rejected.startswith(OLD) and "forged" not in theirs.rejected and theirs.notes == []
        assert "it was not graded: copy your answers into the current notebook and submit that one" in theirs.rejected
    else:
        assert not theirs.rejected and len(theirs.notes) == 1 and theirs.notes[0].startswith(OLD)


def test_forged_and_edited_cells_are_not_an_older_release(generated, tmp_path):
    """Are a grade cell without nbgrader's checksum (forged), a locked cell edited by hand (its
    checksum kept) and grade cells deleted still reported as before, by check and grade alike?"""
    nb = learner_notebook(KEY)
    forged = nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": {
        "grade": True, "grade_id": "test_bonus", "locked": True, "points": 100, "schema_version": 3,
        "solution": False}})
    nb.cells.append(forged)
    for self_check in (False, True):
        audit = _audit(nb, generated, tmp_path, self_check=self_check)
        assert audit.rejected.startswith("forged or duplicated grade cells") and "test_bonus" in audit.rejected
        assert not audit.old_release

    nb = learner_notebook(KEY)
    next(c for c in nb.cells if _gid(c) == "test_softmax").source = "pass"
    audit = _audit(nb, generated, tmp_path, self_check=True)
    assert not audit.rejected and not audit.old_release
    assert len(audit.notes) == 1 and "was edited" in audit.notes[0]

    nb = learner_notebook(KEY)
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]
    audit = _audit(nb, generated, tmp_path, self_check=True)
    assert not audit.old_release and audit.notes and all("is missing" in n for n in audit.notes)

    assert _audit(learner_notebook(KEY), generated, tmp_path, self_check=True).notes == []


def test_other_course_metadata_makes_missing_cells_an_older_release(generated, tmp_path):
    """A notebook whose course metadata is another release's, and which lacks an answer cell, is said
    to be of an older release; the same notebook with the current metadata is not."""
    nb = learner_notebook(KEY)
    nb.cells = [c for c in nb.cells if _gid(c) != "masks"]
    assert _audit(nb, generated, tmp_path, self_check=True).notes == []
    nb.metadata["course"]["generated"] = "GENERATED from exercises/source/03_qkv.md (an earlier edition)"
    audit = _audit(nb, generated, tmp_path, self_check=True)
    assert audit.notes == [audit.old_release] and "'masks'" in audit.old_release


# --- a Python without torch ------------------------------------------------------------------------

def test_this_python_has_the_stack():
    assert stack_problem() is None and stack_problem(try_import=False) is None


@pytest.mark.parametrize("clone, in_notebook, command", [
    (True, False, "run `make install` in the course's folder and `source .venv/bin/activate`"),
    (False, False, 'install the course\'s learner set with `pip install "attention-course[learner]"`'),
    (False, True, 'run `%pip install "attention-course[learner]"` in a cell and restart the kernel'),
    (True, True, "run `make install` in the course's folder and pick its `.venv` as this notebook's kernel"),
])
def test_a_missing_torch_gets_its_install_command(clone, in_notebook, command, monkeypatch):
    """Does the sentence name what is missing, the Python it is missing from, and the one command
    that installs it where the learner is (a clone or an install; a terminal or a notebook)?"""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    monkeypatch.setattr(learner_errors, "_in_clone", lambda: clone)
    problem = stack_problem(in_notebook=in_notebook)
    assert problem == (f"torch is not installed in this Python ({sys.executable}), and the course needs it: "
                       f"{command}, then try again.")


def _bare_venv(path: Path) -> Path:
    """A fresh virtual environment without torch or numpy (no pip either) that imports this checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "course.pth").write_text(str(ROOT) + "\n")
    return python


def _one_line_usage_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_check_in_a_python_without_torch(tmp_path):
    """`python -m autograder check` in a venv without torch and numpy: one line, exit 2; its help
    still shows (nothing on that path imports torch)."""
    python = _bare_venv(tmp_path / "venv")
    notebook = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    run = lambda *args: subprocess.run([str(python), "-m", "autograder", *args], cwd=tmp_path, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    line = _one_line_usage_error(run("check", str(notebook)))
    assert line == (f"error: torch and numpy are not installed in this Python ({python}), and the course needs "
                    "them: run `make install` in the course's folder and `source .venv/bin/activate`, then try again.")
    helped = run("check", "--help")
    assert helped.returncode == 0 and "usage:" in helped.stdout
    # an instructor's command there is a usage error too (what it says is the instructor's set's)
    proc = run("grade", str(notebook), "--assignment", KEY, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_check_with_a_broken_torch(tmp_path):
    """A torch that is installed but fails to import (a shared library missing): one line, exit 2."""
    fake = tmp_path / "broken" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise OSError("libtorch_cpu.so: cannot open shared object file")\n')
    notebook = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(fake.parent))
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", str(notebook)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    line = _one_line_usage_error(proc)
    assert line.startswith(f"error: torch is installed in this Python ({sys.executable}) but cannot be imported "
                           "(OSError: libtorch_cpu.so: cannot open shared object file): reinstall"), line


# --- a GPU asked for on a machine without one ------------------------------------------------------

def _torch_no_gpu_message() -> str:
    """What this machine's torch raises for a tensor asked on 'cuda'."""
    try:
        torch.zeros(1, device="cuda")
    except Exception as exc:  # noqa: BLE001 - the message is what we test
        return str(exc)
    pytest.skip("this machine has a GPU")


@pytest.mark.parametrize("etype, message", [
    ("AssertionError", None),  # this torch's own, on this machine
    ("AssertionError", "Torch not compiled with CUDA enabled"),  # a CPU-only build
    ("RuntimeError", "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
                     "a driver from http://www.nvidia.com/Download/index.aspx"),  # a CUDA build, no driver
    ("RuntimeError", "No CUDA GPUs are available"),  # a CUDA build, CUDA_VISIBLE_DEVICES empty
    ("TypeError", "type torch.cuda.FloatTensor not available. Torch not compiled with CUDA enabled."),
])
def test_a_gpu_asked_for_gets_the_device_agnostic_hint(etype, message):
    message = message or _torch_no_gpu_message()
    where = " (cell 11 (scaled_dot_product_attention), line 2)"
    hint = hint_for(LearnerError("scaled_dot_product_attention", etype, message + where))
    assert hint == ("`scaled_dot_product_attention` asks for a GPU ('cuda') at cell 11 (scaled_dot_product_attention), "
                    "line 2, which this machine does not have: pick the device with "
                    "`torch.device('cuda' if torch.cuda.is_available() else 'cpu')`, or take it from the inputs "
                    "(`x.device`).")


def test_other_errors_keep_their_own_message():
    assert hint_for(LearnerError("softmax", "ValueError", "boom (cell 4 (softmax), line 3)")) == (
        "`softmax` raised ValueError: boom (cell 4 (softmax), line 3)")
    assert gpu_hint("`f`", "CUDA out of memory. Tried to allocate 2.00 GiB") is None


def test_a_gpu_asked_for_at_the_top_level_is_one_note():
    no_gpu = "AssertionError: Torch not compiled with CUDA enabled"
    errors = [{"cell": "cell 3", "line": 2, "error": f"{no_gpu} (cell 3, line 2)"},
              {"cell": "cell 3", "line": 3, "error": "NameError: name 'x0' is not defined (cell 3, line 3)"},
              {"cell": "cell 5", "line": 1, "error": f"{no_gpu} (cell 5, line 1)"}]
    assert load_notes(errors) == [f"cell 3, line 2: your code {GPU}",
                                  "cell 3, line 3: NameError: name 'x0' is not defined",
                                  "cell 5, line 1: asks for a GPU as well (see above)"]


def test_a_note_names_its_place_once():
    """An error raised while the top level loads names its place once when it was raised by the statement
    itself, both places when it was raised elsewhere (a line further down, in a function defined in the cell or
    in another); a message with no place of its own keeps the statement's."""
    errors = [{"cell": "cell 18", "line": 1, "error": "ModuleNotFoundError: No module named 'foo' (cell 18, line 1)"},
              {"cell": "cell 4 (softmax)", "line": 3, "error": "ValueError: shape (2, 3) (cell 4 (softmax), line 5)"},
              {"cell": "cell 7", "line": 1, "error": "ValueError: boom (cell 4 (softmax), line 2)"},
              {"cell": "cell 1", "line": 2, "error": "ValueError: boom (cell 12, line 2)"},
              {"cell": "In [9]", "line": 1, "error": "NameError: name 'x' is not defined (In [9], line 1)"},
              {"cell": "cell 2", "line": 4, "error": "KeyError: 'x'"}]
    assert load_notes(errors) == ["cell 18, line 1: ModuleNotFoundError: No module named 'foo'",
                                  "cell 4 (softmax), line 3: ValueError: shape (2, 3) (cell 4 (softmax), line 5)",
                                  "cell 7, line 1: ValueError: boom (cell 4 (softmax), line 2)",
                                  "cell 1, line 2: ValueError: boom (cell 12, line 2)",
                                  "In [9], line 1: NameError: name 'x' is not defined",
                                  "cell 2, line 4: KeyError: 'x'"]


# --- end to end: the command line, and the check from a notebook cell ------------------------------

SDPA = "def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):\n"
CASES = {
    # a part's function renamed: the checks that call it are not run, and that is said once
    "renamed": mistake(KEY, (SDPA, SDPA.replace("scaled_dot_product_attention", "sdpa"))),
    # a GPU asked for inside a function, and at the top level
    "cuda_in_function": mistake(KEY, (SDPA, SDPA + "    q, k, v = q.cuda(), k.to('cuda'), "
                                                   "v.to(torch.device('cuda'))\n")),
    "cuda_at_top_level": lambda: add_cell(reference_notebook(KEY), 'device = torch.device("cuda")\n'
                                          "x0 = torch.zeros(2).to(device)", after_grade_id="setup"),
    "older_release": lambda: older_release("renamed"),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """name -> the text report of the command-line `check` of CASES[name] (seed 7), each made once."""
    done: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in done:
            path = write(CASES[name](), tmp_path_factory.mktemp("check") / f"{name}.ipynb")
            proc = run_cli("check", str(path), "--seed", "7", timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "Traceback" not in proc.stdout + proc.stderr and proc.stderr == "", proc.stderr[-3000:]
            done[name] = proc.stdout
        return done[name]
    return get


@pytest.mark.parametrize("name", list(CASES))
def test_the_learners_check_says_it_once(name, checked):
    """What the command-line check prints for each case: one clear sentence, said once, no traceback."""
    out = checked(name)
    if name == "renamed":
        assert out.count("is not defined in your notebook") == 1
        assert "Not checked: `scaled_dot_product_attention` is not defined in your notebook" in out
        assert "total                         11 / 26" in out
    elif name == "cuda_in_function":
        assert out.count("asks for a GPU ('cuda') at cell") == 1 and "Torch not compiled" not in out
        assert out.count("hint (the 13 checks above): ") == 1  # the part's 13 checks, one sentence
    elif name == "cuda_at_top_level":
        assert re.search(rf"note: cell \d+, line 2: your code {re.escape(GPU)}", out)
        assert "Torch not compiled" not in out
        assert "total                         26 / 26" in out
    else:
        assert out.count(OLD) == 1 and "forged" not in out and "NOT GRADED" not in out
        assert "total                         26 / 26" in out  # graded all the same


def test_grade_refuses_an_older_release_and_a_forgery_each_with_its_reason(tmp_path):
    """The instructor's grader keeps refusing grade cells it does not know, and says which is which."""
    from autograder.grading.grader import ERROR, Grader

    nb = reference_notebook(KEY)
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": {
        "grade": True, "grade_id": "test_bonus", "locked": True, "points": 100, "schema_version": 3,
        "solution": False}}))
    grader = Grader(get_assignment(KEY))
    old = grader.grade(write(older_release("renamed"), tmp_path / "old.ipynb"), seed=1)
    forger = grader.grade(write(nb, tmp_path / "forger.ipynb"), seed=1)
    assert old.status == ERROR and old.error.startswith(OLD) and "forged" not in old.error
    assert forger.status == ERROR and "forged" in forger.error and OLD not in forger.error


@pytest.mark.parametrize("name", ["renamed", "cuda_in_function"])
def test_the_check_in_a_notebook_says_the_same(name, checked):
    """The check from a notebook cell (a kernel's history of the same cells) prints the same hints."""
    in_notebook = pytest.importorskip("autograder.learner.in_notebook")
    nb = CASES[name]()
    entries = [(i + 1, c.source) for i, c in enumerate(c for c in nb.cells if c.cell_type == "code")]
    text = in_notebook.report(entries, seed=7)
    assert "Traceback" not in text

    def hints(report: str) -> list[str]:
        return [ln.strip() for ln in report.splitlines() if ln.strip().startswith(("hint:", "Not checked", "x "))]

    if name == "renamed":
        assert hints(text) == hints(checked(name)) and text.count("is not defined in your notebook") == 1
    else:
        assert re.search(r"`scaled_dot_product_attention` asks for a GPU \('cuda'\)( at In \[\d+\], line 2)?, "
                         "which this machine does not have", text), text
        assert text.count("asks for a GPU") == 1 and text.count(GPU.split(": ", 1)[1]) == 1
        assert text.count("hint (the 13 checks above): ") == 1 and "Torch not compiled" not in text
