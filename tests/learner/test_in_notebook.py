"""`check()` in a notebook gives the points and hints of the command-line `check` on the saved notebook.

check() grades the code the kernel ran, read from IPython's input history, in a grading process of
its own (autograder/learner/in_notebook.py). Here a kernel that ran a notebook from top to bottom is
simulated by its history (the code cells' sources, execution counts 1..n, stored as IPython stores
them), and:

* for every row of every chapter's table of typical mistakes, the cells check() sends to the grader
  are those `code_cells` gives for the saved notebook, label for label (`In [n]` for `cell N`): the
  two paths grade the same code (fast, no worker);
* for a sample of rows, both are graded, check() and `python -m autograder check NB --json --seed S`:
  points per check, status and hints (the two label forms replaced by one placeholder) are equal.
  `AUTOGRADER_IN_NOTEBOOK_ALL_ROWS=1` grades every row of every table both ways (slow);
* one real IPython kernel (nbclient) runs the reference notebook of 03 with the learner's own
  `torch`, `F` and `check` reassigned and code planted for the grading process in its environment
  (PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD, a sitecustomize.py in its working folder), then check():
  its total is the command line's, the kernel's namespace gains no name, and nothing planted
  reaches the grading process or its worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.core.assignments import ROOT, all_assignments, get_assignment
from autograder.core.notebook import cell_label, code_cells, read_notebook
from autograder.grading.feedback import format_text
from autograder.grading.grader import CheckResult, Result
from autograder.learner import history as H
from autograder.learner import in_notebook as N
from chapters import tables
import conftest
from conftest import add_cell, chapter_batch, learner_notebook, mistake, write

KEY = "03_qkv"
SEED = 4242
ALL_ROWS = os.environ.get("AUTOGRADER_IN_NOTEBOOK_ALL_ROWS") == "1"
LABEL_RE = re.compile(r"\bcell \d+(?: \([^()]*\))?|\bIn \[\d+\]")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def history(nb) -> list[tuple[int, str]]:
    """What IPython's input history holds after a kernel ran `nb` (a parsed notebook) from top to
    bottom: each code cell's source as IPython stores it (trailing newlines cut), execution counts 1..n."""
    return [(n, c["source"].rstrip("\n")) for n, c in enumerate((c for c in nb.cells if c["type"] == "code"), 1)]


def kernel_labels(nb) -> dict[str, str]:
    """`In [n]` -> the command line's label of the code cell the kernel ran as its n-th."""
    return {f"In [{n}]": cell_label(c) for n, c in enumerate((c for c in nb.cells if c["type"] == "code"), 1)}


def unlabelled(text: str) -> str:
    return LABEL_RE.sub("<cell>", text)


@pytest.fixture(scope="module", autouse=True)
def _masters_read_once():
    """Each chapter's master read once (a read takes about a second): every row is made from a copy."""
    import copy

    import conftest

    read, cache = conftest.reference_notebook, {}

    def cached(key):
        if key not in cache:
            cache[key] = read(key)
        return copy.deepcopy(cache[key])

    mp = pytest.MonkeyPatch()
    mp.setattr(conftest, "reference_notebook", cached)
    yield
    mp.undo()


# --- 1. the same cells, for every row of every table (fast) ----------------------------------

ROWS = [(key, row) for key in tables() for row in chapter_batch(key)]
_EXERCISES: dict = {}


def _exercises() -> list:
    if not _EXERCISES:
        _EXERCISES.update({a.key: H.exercise(a) for a in all_assignments()})
    return list(_EXERCISES.values())


@pytest.mark.parametrize("key,row", ROWS, ids=[f"{k}-{r}" for k, r in ROWS])
def test_history_gives_the_cells_the_command_line_grades(key, row, tmp_path):
    """Are the cells check() grades of a kernel that ran the notebook those `check` grades of the file?"""
    nb = read_notebook(write(chapter_batch(key)[row](), tmp_path / f"{row}.ipynb"))
    entries = history(nb)
    assert H.infer_assignment(entries, _exercises()) == key
    plan = N.plan_check(entries, assignment=key)
    labels = kernel_labels(nb)
    sent = [{"label": labels[c["label"]], "source": c["source"]} for c in plan.cells]
    saved = [dict(c, source=c["source"].rstrip("\n")) for c in code_cells(nb)]  # as IPython stores them
    assert sent == saved


# --- which history entries are graded (fast) -------------------------------------------------

def _sources(entries, tests=()) -> list[str]:
    return [c["source"] for c in H.history_cells(list(enumerate(entries, 1)), tests)]


def test_a_cell_fixed_and_run_again_replaces_the_earlier_run():
    """Is an earlier run of a cell dropped when a later one binds every name again, and only then?"""
    broken, fixed = "def f(x):\n    return x +\n", "def f(x):\n    return x + 1"
    assert _sources([broken, fixed]) == [broken, fixed]  # a syntax error binds nothing we can see
    assert _sources(["x = undefined\ndef f(): pass", "x = 1\ndef f(): return 2"]) == ["x = 1\ndef f(): return 2"]
    # a later entry reads the name while it loads: the earlier one stays
    assert _sources(["x = 1", "y = x + 1", "x = 2"]) == ["x = 1", "y = x + 1", "x = 2"]
    assert _sources(["x = 1", "x = x + 1"]) == ["x = 1", "x = x + 1"]
    assert _sources(["x = 1", "def g(a=x): pass", "x = 2"]) == ["x = 1", "def g(a=x): pass", "x = 2"]
    # a function body runs later: reading there does not keep it
    assert _sources(["x = 1", "def g(): return x", "x = 2"]) == ["def g(): return x", "x = 2"]
    # more than plain names bound, or only some of them again: kept
    patch = "import torch\ntorch.allclose = lambda *a, **k: True"
    assert _sources([patch, "import torch"]) == [patch, "import torch"]
    assert _sources(["a = 1\nb = 2", "a = 3"]) == ["a = 1\nb = 2", "a = 3"]
    assert _sources(["x = 1", "x += 1", "x = 5"]) == ["x = 1", "x += 1", "x = 5"]


def test_the_check_cells_and_visible_tests_are_not_graded():
    """Are the cells that call check() and the exercise's visible tests left out, as `check` leaves test cells?"""
    test = "assert softmax(x).shape == x.shape\n"
    entries = ["def softmax(x): return x", test.rstrip("\n"), "from autograder import check; check()",
               "import autograder\nr = autograder.check('part 1')", "check(seed=3)",
               "def helper(): pass\ncheck()"]
    assert _sources(entries, {test}) == ["def softmax(x): return x", "def helper(): pass\ncheck()"]
    cells = H.history_cells(list(enumerate(entries, 1)), {test})
    assert [c["label"] for c in cells] == ["In [1]", "In [6]"]


def test_the_report_names_every_cell_it_graded(tmp_path):
    """The report's banner names the cells graded, gaps included, so that checking the same cells twice
    (a second check() after the first) names them alike, and a rerun cell shows where it was taken from."""
    ref = read_notebook(write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    entries = history(ref)
    first = N.plan_check(entries, assignment=KEY)
    again = N.plan_check(entries + [(len(entries) + 1, "from autograder import check; check()"),
                                    (len(entries) + 2, "check()")], assignment=KEY)
    assert first.label == again.label and first.label.startswith(f"this kernel's history ({len(first.cells)} cells: ")
    numbers = [n for n, _ in entries]
    fixed = entries + [(max(numbers) + 5, first.cells[-1]["source"])]  # the last cell graded, run again later
    label = N.plan_check(fixed, assignment=KEY).label
    assert f"In [{max(numbers) + 5}]" in label and label != first.label
    assert N.Plan(KEY, [], None, {}, (1, 2, 3, 7, 9, 10)).label == (
        "this kernel's history (6 cells: In [1] to In [3], In [7], In [9] to In [10])")
    many = N.Plan(KEY, [], None, {}, tuple(range(1, 40, 2))).label
    assert many.endswith("In [9], … 15 more runs)") and "(20 cells: " in many


def test_the_loader_and_check_agree_on_what_runs():
    """Does check() reason about the statements the worker runs and the lines it blanks (autograder/isolation/worker.py's
    KEPT and MAGIC_RE; read from its source, since importing it changes sys.path)?"""
    import ast

    tree = ast.parse((ROOT / "autograder" / "isolation" / "worker.py").read_text())
    top = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    assert [e.attr for e in top["KEPT"].elts] == [t.__name__ for t in H.KEPT]
    assert top["MAGIC_RE"].args[0].value == H.MAGIC_RE.pattern


def test_the_exercise_is_told_from_the_cells_run_or_asked_for(tmp_path):
    """Is the exercise recognised from the cells the kernel ran, and asked for in one sentence when it cannot be?"""
    ref = read_notebook(write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    assert N.plan_check(history(ref)).key == KEY
    for entries in ([], [(1, "import torch")]):
        with pytest.raises(H.CheckRefused, match=r'cannot tell which exercise.*check\(assignment="01_seq2seq"\)'):
            N.plan_check(entries)
    with pytest.raises(H.CheckRefused, match="knows no exercise 'nope'"):
        N.plan_check(history(ref), assignment="nope")
    with pytest.raises(H.CheckRefused, match="has run none of the code of exercise 03_qkv"):
        N.plan_check([(1, "from autograder import check; check()")], assignment=KEY)


def test_parts_are_named_by_number_or_by_name():
    """Do "part 3", "Part 3", "3" and a part's name select its checks, and an unknown part list them all?"""
    ex = H.exercise(get_assignment(KEY))
    for text in ("part 3", "Part 3", " PART3 ", "3", 3):
        assert H.resolve_part(ex, text) == ["scaled_dot_product_attention"]
    assert H.resolve_part(ex, "part 4") == ["padding_mask", "causal_mask"]
    assert H.resolve_part(ex, "softmax") == H.resolve_part(ex, "test_Softmax") == ["softmax"]
    assert ex.titles["causal_mask"] == "Part 4 (masks)"
    assert ex.titles["softmax"] == "Part 1 (a numerically stable softmax)"
    for text in ("part 9", "attention", ""):
        with pytest.raises(H.CheckRefused) as info:
            H.resolve_part(ex, text)
        assert str(info.value).endswith(
            "its parts are Part 1 (softmax), Part 2 (attention_numpy), Part 3 (scaled_dot_product_attention), "
            'Part 4 (padding_mask, causal_mask): name one by its number or its name, e.g. check("part 1").')


def test_every_exercise_has_numbered_parts_covering_its_checks():
    """Can every part of every exercise be asked for by its number?"""
    for a in all_assignments():
        ex = H.exercise(a)
        under = [p for _, _, ids in ex.headings for p in ids]
        assert ex.parts and under == ex.parts, a.key
        assert [n for n, _, _ in ex.headings] == list(range(1, len(ex.headings) + 1)), a.key


def test_an_unknown_part_on_the_command_line_is_one_sentence(tmp_path):
    """Is `check --part` with a part the exercise lacks a usage error of one line, before any grading?"""
    path = write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb")
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--part", "part 9"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: Exercise 03_qkv has no part 'part 9'; its parts are Part 1 (softmax), Part 2 (attention_numpy), "
        "Part 3 (scaled_dot_product_attention), Part 4 (padding_mask, causal_mask): name one by its number or its "
        'name, e.g. --part "part 1".']


# --- check() itself, without a kernel (fast) -----------------------------------------------------

def test_outside_a_notebook_check_says_where_it_works():
    """In a plain script, does check() say in one sentence where it works, naming the terminal command? And does
    importing the package import neither torch nor IPython?"""
    code = "import sys\nfrom autograder import check\ncheck()\nprint(sorted({'torch', 'IPython'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines() == [N.NOT_IN_NOTEBOOK, "[]"]
    assert "`attention-course check NOTEBOOK.ipynb`" in N.NOT_IN_NOTEBOOK


def test_in_a_grading_worker_check_does_nothing(capsys):
    """A notebook loaded by the worker that runs `r = check()` gets None back, and nothing is printed."""
    ns = {"__name__": "__learner__"}
    exec(compile("from autograder import check\nr = check('part 1')", "<cell 9>", "exec"), ns)
    assert ns["r"] is None and capsys.readouterr().out == ""


class _Shell:
    """A stand-in for the running IPython shell: only its input history is read."""

    def __init__(self, sources):
        self.history_manager = type("H", (), {"input_hist_raw": [""] + list(sources)})()


def _fake_kernel(monkeypatch, nb) -> None:
    shell = _Shell(s for _, s in history(read_notebook(nb)))
    monkeypatch.setattr(N, "_shell", lambda: shell)


def test_a_kernel_without_torch_gets_the_sentence_that_fixes_it(monkeypatch, capsys, tmp_path):
    """torch missing in the kernel: autograder.core.learner_errors' one sentence, nothing graded."""
    import autograder.core.learner_errors as errors

    _fake_kernel(monkeypatch, write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    asked = []

    def problem(*, try_import=True, in_notebook=False):
        asked.append((try_import, in_notebook))
        return "torch is not installed in the Python that runs this check."

    monkeypatch.setattr(errors, "stack_problem", problem)
    monkeypatch.setattr(N, "grade_plan", lambda *a, **k: pytest.fail("graded without torch"))
    N.check()
    assert capsys.readouterr().out == "torch is not installed in the Python that runs this check.\n"
    assert asked == [(False, True)]  # asked without importing torch into the kernel


def test_the_stop_button_ends_the_check_and_its_grading_process(monkeypatch, capsys, tmp_path):
    """KeyboardInterrupt while grading (the kernel's stop button): one line, and the grading process is ended.

    The stop button is pressed once the grading process has its request and the check waits for
    the result (an event, not a delay: on a fast machine a check can finish within any fixed delay)."""
    _fake_kernel(monkeypatch, write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    started = []
    popen = subprocess.Popen

    def spy(*args, **kwargs):
        proc = popen(*args, **kwargs)
        started.append(proc)

        def communicate(input=None, timeout=None):
            proc.stdin.write(input)  # the request reaches the grading process, which starts grading
            proc.stdin.close()
            raise KeyboardInterrupt  # the stop button, pressed while the check waits for the result

        proc.communicate = communicate
        return proc

    monkeypatch.setattr(N.subprocess, "Popen", spy)
    assert N.check(seed=1) is None
    assert capsys.readouterr().out == N.INTERRUPTED + "\n"
    assert len(started) == 1 and started[0].returncode is not None
    started[0].stdout.close()


def test_a_fault_of_ours_is_one_sentence_and_a_log(monkeypatch, capsys, tmp_path):
    """A crash in check() itself: one sentence that says it is the course's fault and where the traceback is."""
    _fake_kernel(monkeypatch, write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))

    def broken(*args, **kwargs):
        raise RuntimeError("the course is broken")

    monkeypatch.setattr(N, "plan_check", broken)
    N.check()
    out = capsys.readouterr().out
    m = re.fullmatch(r"The check itself failed \(a fault of the course, not yours\): RuntimeError: the course is "
                     r"broken\. Please report it, with the details in (\S+)\.\n", out)
    assert m, out
    log = Path(m.group(1))
    assert "Traceback" in log.read_text() and "the course is broken" in log.read_text()
    log.unlink()


# --- 4. what could not be checked -------------------------------------------------------------

def test_the_report_says_which_parts_were_not_attempted_and_what_is_missing():
    """Does the text report list, after the checks, each part not attempted and each definition missing?"""
    def c(name, part, passed=False, stub="", missing=""):
        return CheckResult(name, part, "Title?", 1.0 if passed else 0.0, 1.0, passed, "" if passed else "hint",
                           stub=stub, missing=missing)

    parts = {p: {"score": 0.0, "max_score": 2.0} for p in ("a", "b", "c", "d", "e")}
    result = Result(KEY, "nb", parts=parts, seed=1, checks=[
        c("t1", "a", stub="f"), c("t2", "a", stub="f"),     # not attempted
        c("t3", "b", stub="g"), c("t4", "b", passed=True),  # attempted: one check passes
        c("t5", "c", stub="h"), c("t6", "d", stub="k"),     # two parts under one heading
        c("t7", "b", missing="helper"), c("t8", "e", missing="helper")])
    titles = {"a": "Part 1 (first)", "c": "Part 2 (second)", "d": "Part 2 (second)"}
    lines = [ln.strip() for ln in format_text(result, part_titles=titles).splitlines()]
    assert [ln for ln in lines if ln.startswith("Not checked")] == [
        "Not checked yet: Part 1 (first): `f` still raises NotImplementedError.",
        "Not checked yet: Part 2 (second): `h` and `k` still raise NotImplementedError.",
        "Not checked: `helper` is not defined in your notebook (needed by b, e); check its name, "
        "and that its cell ran without an error."]
    total = next(i for i, ln in enumerate(lines) if ln.startswith("total"))
    assert lines[total + 1].startswith("Not checked yet: Part 1 (first)")


def _stopped_at(nb, grade_id: str) -> list[tuple[int, str]]:
    """The history of a kernel whose Run All stopped at the cell `grade_id` (a visible test that failed):
    the code cells up to it ran, those below it never did."""
    code = [c for c in nb.cells if c["type"] == "code"]
    stop = next(i for i, c in enumerate(code) if (c["metadata"].get("nbgrader") or {}).get("grade_id") == grade_id)
    return history(nb)[: stop + 1]


def test_a_definition_whose_cell_has_not_run_is_told_from_one_that_is_missing(tmp_path):
    """Run All stopped at a failing cell: the names the notebook defines below it have not run in this kernel
    (not "not defined in your notebook"). A name the kernel went past (a cell of the exercise below it ran:
    the learner renamed it), or whose cell ran with a syntax error, is missing for another reason."""
    ex = H.exercise(get_assignment(KEY))
    assert {"softmax", "attention_numpy", "scaled_dot_product_attention", "padding_mask", "causal_mask"} <= ex.defined
    assert not {"p", "m", "tokens"} & ex.defined  # what the visible tests bind is not the exercise's
    ref = read_notebook(write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    assert N.plan_check(history(ref), assignment=KEY).unrun == ()
    stopped = _stopped_at(ref, "test_scaled_dot_product_attention")
    assert N.plan_check(stopped, assignment=KEY).unrun == ("causal_mask", "padding_mask")
    n = len(stopped)
    assert H.not_run(stopped + [(n + 1, "def padding_mask(tokens, pad_id=0):\n    return (\n")], ex) == (
        "causal_mask",)  # ran, with a syntax error: its note says so
    assert H.not_run(stopped + [(n + 1, "causal_mask = None\nx = 1; padding_mask: int = 2")], ex) == ()
    assert H.not_run(stopped + [(n + 1, "if padding_mask == None: (\ncausal_mask == 1")], ex) == (
        "causal_mask", "padding_mask")
    # renamed, then Run All stopped at the visible test that calls it: that name was gone past, not the masks
    sdpa = "def scaled_dot_product_attention("
    renamed = [(i, s.replace(sdpa, "def sdpa(")) for i, s in stopped]
    assert renamed != stopped and H.not_run(renamed, ex) == ("causal_mask", "padding_mask")
    # every cell run, the masks' renamed: below them, their visible tests ran
    masks = [(i, s.replace("def padding_mask(", "def pad_mask(")) for i, s in history(ref)]
    assert H.not_run(masks, ex) == ()


def test_the_report_says_which_definitions_have_not_run():
    """The names not run are said in one line, as cells to run; a name missing for another reason keeps its own."""
    def c(name, part, missing):
        return CheckResult(name, part, "Title?", 0.0, 1.0, False, "hint", missing=missing)

    parts = {p: {"score": 0.0, "max_score": 2.0} for p in ("a", "b", "c")}
    result = Result(KEY, "nb", parts=parts, seed=1, checks=[
        c("t1", "a", "padding_mask"), c("t2", "b", "causal_mask"), c("t3", "c", "helper"),
        c("t4", "b", "padding_mask")])
    titles = {"a": "Part 4 (masks)", "b": "Part 4 (masks)"}

    def said(unrun):
        return [ln.strip() for ln in format_text(result, part_titles=titles, unrun=unrun).splitlines()
                if ln.strip().startswith("Not checked")]

    assert said(("padding_mask", "causal_mask", "softmax")) == [
        "Not checked: `helper` is not defined in your notebook (needed by c); check its name, and that its cell ran "
        "without an error.",
        "Not checked: `padding_mask` and `causal_mask` (needed by Part 4 (masks)) are in your notebook but have not "
        "run in this kernel: run their cells (Run All stops at the first cell that fails: fix or skip that cell, "
        "then run the cells below it)."]
    assert said(("causal_mask",))[2:] == [
        "Not checked: `causal_mask` (needed by Part 4 (masks)) is in your notebook but has not run in this kernel: "
        "run its cell (Run All stops at the first cell that fails: fix or skip that cell, then run the cells below "
        "it)."]
    assert said(()) == said(("softmax",)) and len(said(())) == 3


def test_check_after_a_run_all_that_stopped_says_which_cells_have_not_run(monkeypatch, capsys, tmp_path):
    """check() in a kernel whose Run All stopped at part 3's visible test: part 4's functions are in the notebook
    but have not run, and the report says so (one grade of part 4 alone, in a grading process of its own)."""
    nb = read_notebook(write(conftest.reference_notebook(KEY), tmp_path / "ref.ipynb"))
    shell = _Shell(s for _, s in _stopped_at(nb, "test_scaled_dot_product_attention"))
    monkeypatch.setattr(N, "_shell", lambda: shell)
    N.check("part 4", seed=1)
    out = capsys.readouterr().out
    assert re.search(r"^  total +0 / 4$", out, re.MULTILINE), out
    assert ("  Not checked: `padding_mask` and `causal_mask` (needed by Part 4 (masks)) are in your notebook but "
            "have not run in this kernel: run their cells (Run All stops at the first cell that fails: fix or skip "
            "that cell, then run the cells below it).") in out.splitlines(), out
    assert "is not defined in your notebook" not in out


def test_the_untouched_notebook_is_reported_as_not_attempted(tmp_path):
    """The command line on the untouched notebook: one line per part not attempted, after the checks."""
    path = write(learner_notebook(KEY), tmp_path / "stub.ipynb")
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--seed", "1"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    summary = [ln.strip() for ln in lines if "Not checked" in ln]
    assert summary == [
        "Not checked yet: Part 1 (a numerically stable softmax): `softmax` still raises NotImplementedError.",
        "Not checked yet: Part 2 (attention in NumPy): `attention_numpy` still raises NotImplementedError.",
        "Not checked yet: Part 3 (attention in PyTorch): `scaled_dot_product_attention` still raises "
        "NotImplementedError.",
        "Not checked yet: Part 4 (masks): `padding_mask` and `causal_mask` still raise NotImplementedError."]
    total = next(i for i, ln in enumerate(lines) if ln.strip().startswith("total"))
    assert lines[total + 1].strip() == summary[0]


# --- 2. both ways, graded (slow) ----------------------------------------------------------------

def _raises(key: str):
    """The reference of 03 whose softmax raises on 3-D inputs, with a cell that fails as it loads: a hint and a
    note that name a place in the learner's code."""
    def make():
        nb = mistake(key, ("e = np.exp(shifted)", "e = np.exp(shifted)\n    if x.ndim > 2:\n"
                                                  "        raise ValueError(\"2-D scores only\")"))()
        return add_cell(nb, "broken = undefined_name + 1", after_grade_id="softmax")
    return make


def _sample() -> list[tuple[str, str]]:
    """A few rows whose hints matter (every row of every table with AUTOGRADER_IN_NOTEBOOK_ALL_ROWS=1): 03's
    unscaled scores, the row that patches numpy's and torch's comparisons, a learner's own exception; and a
    module of 05, reached through handles."""
    if ALL_ROWS:
        return ROWS + [(KEY, "raises")]
    return [(KEY, "no_scale"), (KEY, "allclose_cheat"), (KEY, "raises"), ("05_multi_head", "split_no_transpose")]


SAMPLE = _sample()


def _make(key, row):
    return _raises(key) if row == "raises" else chapter_batch(key)[row]


def _both_ways(path: Path, part: str | None = None) -> tuple[dict, dict]:
    """(the command line's --json result on the file, check()'s result on the history of a kernel that ran it),
    graded side by side with one seed."""
    args = ["check", str(path), "--json", "--seed", str(SEED)] + (["--part", part] if part else [])
    cli = subprocess.Popen([sys.executable, "-m", "autograder", *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        kernel = N.grade_plan(N.plan_check(history(read_notebook(path)), part), SEED)["result"]
        out, err = cli.communicate(timeout=600)
    finally:
        cli.kill()
    assert cli.returncode in (0, 1), err[-3000:]
    return json.loads(out), kernel


def _seen(result: dict) -> dict:
    """What a learner sees of a result, the cell labels made one placeholder: status, points, checks, and the
    notes that name a cell (errors while loading; the audit of the file's cells is the command line's alone)."""
    checks = [(c["name"], c["points"], c["passed"], c["grader_error"], c["stub"], c["missing"], unlabelled(c["hint"]))
              for c in result["checks"]]
    notes = [unlabelled(n) for n in result["notes"] if LABEL_RE.match(n)]
    return {"status": result["status"], "score": result["score"], "max_score": result["max_score"],
            "parts": result["parts"], "checks": checks, "notes": notes}


@pytest.mark.slow
@pytest.mark.parametrize("key,row", SAMPLE, ids=[f"{k}-{r}" for k, r in SAMPLE])
def test_check_in_the_notebook_gives_the_command_lines_points_and_hints(key, row, tmp_path):
    """Does check() on the kernel's history give the points, status and hints `check --json` gives the file?"""
    cli, kernel = _both_ways(write(_make(key, row)(), tmp_path / f"{row}.ipynb"))
    assert cli["status"] == "graded" and cli["seed"] == kernel["seed"] == SEED
    assert _seen(kernel) == _seen(cli)
    if row == "raises":
        # the learner's exception and the failed load name the cell, each in its own way: `In [n]` is the
        # n-th code cell the kernel ran, and the command line names that cell
        labels = kernel_labels(read_notebook(tmp_path / f"{row}.ipynb"))

        def relabel(text):
            return re.sub(r"In \[\d+\]", lambda m: labels[m.group()], text)

        assert [relabel(c["hint"]) for c in kernel["checks"]] == [c["hint"] for c in cli["checks"]]
        assert [relabel(n) for n in kernel["notes"]] == cli["notes"]
        soft = next(n for n, label in labels.items() if label.endswith("(softmax)"))
        broken = f"In [{int(soft[4:-1]) + 1}]"  # the cell added after it
        assert any(c["hint"].endswith(f"2-D scores only ({soft}, line 7)") for c in kernel["checks"])
        assert any(n.startswith(f"{broken}, line 1: NameError") for n in kernel["notes"])


@pytest.mark.slow
def test_one_part_keeps_the_points_of_the_full_check(tmp_path):
    """`--part "part 3"` and check("Part 3") grade part 3 alone, each check with its points in the full check."""
    path = write(chapter_batch(KEY)["inverted_mask"](), tmp_path / "inverted.ipynb")
    cli, kernel = _both_ways(path, "part 3")
    assert _seen(kernel) == _seen(cli)
    assert list(cli["parts"]) == ["scaled_dot_product_attention"] and cli["max_score"] == 15
    full = json.loads(subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--json", "--seed",
                                      str(SEED)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                     timeout=600).stdout)
    part3 = [c for c in full["checks"] if c["part"] == "scaled_dot_product_attention"]
    assert [(c["name"], c["points"]) for c in cli["checks"]] == [(c["name"], c["points"]) for c in part3]
    assert 0 < cli["score"] < 15


# --- 3. a real kernel (slow) ------------------------------------------------------------------------

RNG = "(_random.getstate(), _numpy.random.get_state()[1].tolist(), _torch.random.get_rng_state().tolist())"
NEW_NAMES = (f"_before = set(dir())\n_rng = {RNG}\ncheck(seed={{seed}})\n"
             f"print('RNG KEPT', _rng == {RNG})\n"
             "print('NEW NAMES', sorted(set(dir()) - _before - {{'_before', '_rng'}}))")


# A learner's cells that plant code for the grading process: PYTHONPATH (a sitecustomize.py that records
# the process it runs in), PYTHONSTARTUP, LD_PRELOAD (a library that does not exist) and a working folder
# with a sitecustomize.py of its own (tests/attacks/environment.py). Then, in the worker that loads the
# kernel's code (and only there: a top-level assignment runs in a worker, its condition is false in the
# kernel), what the worker and its parent, the grading process check() started, were started with.
PLANT = "import os, sys\nos.environ.update({env!r})\nos.chdir({cwd!r})"
STARTED = r'''def _started(folder):
    import json, os, sys
    def seen(pid):
        env = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace").split("\0")
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")[:-1]
        return {"environ": sorted(e.split("=", 1)[0] for e in env if "=" in e), "argv": argv}
    with open(os.path.join(folder, f"worker-{os.getpid()}.json"), "w") as f:
        json.dump({"worker": seen(os.getpid()), "grader": seen(os.getppid())}, f)
_record = _started(FOLDER) if os.path.basename(sys.argv[0]) == "worker.py" else None'''


@pytest.mark.slow
def test_check_in_a_real_kernel(tmp_path):
    """A kernel runs the reference of 03, plants code for the grading process in its environment
    (PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD, a sitecustomize.py in its working folder), then reassigns
    `torch`, `F` and `check`; check() still grades, with the command line's total on the saved notebook,
    adds no name, and keeps no output; one part, and an unknown part, too. Nothing planted reaches the
    grading process (`python -I`) or its worker."""
    from nbclient import NotebookClient

    from attacks.environment import Poison, planted_in

    poison, records = Poison(tmp_path / "planted"), tmp_path / "started"
    records.mkdir()
    nb = conftest.reference_notebook(KEY)
    for source in (PLANT.format(env=poison.env, cwd=str(poison.cwd)), STARTED.replace("FOLDER", repr(str(records))),
                   "import random as _random, numpy as _numpy, torch as _torch", "torch = 3\nF = None\ncheck = 5",
                   "from autograder import check",
                   NEW_NAMES.format(seed=SEED), 'check("part 1", seed=1)',
                   "print('OUT', get_ipython().execution_count - 1 in Out)", 'check("part 9")'):
        nb.cells.append(nbformat.v4.new_code_cell(source))
    path = write(nb, tmp_path / "mine.ipynb")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outs = ["".join(o.get("text", "") for o in c.outputs if o.output_type == "stream") for c in nb.cells[-5:]]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    started = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    assert len(started) == 2  # check(seed=...) and check("part 1"); the unknown part grades nothing
    for seen in started:
        assert seen["grader"]["argv"][1:4] == ["-I", "-c", N._CHILD], seen["grader"]["argv"]
        assert "-I" in seen["worker"]["argv"]
        assert not planted_in(dict.fromkeys(seen["grader"]["environ"] + seen["worker"]["environ"])), seen
    assert poison.ran() == []
    full, part1, out, unknown = outs[1], outs[2], outs[3], outs[4]
    assert "Traceback" not in "".join(outs)
    cli = json.loads(subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--json", "--seed",
                                     str(SEED)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                    timeout=600).stdout)
    total = re.search(r"^  total +(\S+) / (\S+)$", full, re.MULTILINE)
    assert total and (float(total.group(1)), float(total.group(2))) == (cli["score"], cli["max_score"]), full
    assert f"checks seeded with {SEED}; `check(seed={SEED})` replays them" in full
    assert full.rstrip().splitlines()[-2:] == ["RNG KEPT True", "NEW NAMES []"]
    assert re.search(r"^  softmax +3 / 3$", part1, re.MULTILINE) and "attention_numpy" not in part1
    assert re.search(r"^  total +3 / 3$", part1, re.MULTILINE)
    assert out.strip() == "OUT False"
    assert unknown.strip().splitlines() == [
        "Exercise 03_qkv has no part 'part 9'; its parts are Part 1 (softmax), Part 2 (attention_numpy), Part 3 "
        "(scaled_dot_product_attention), Part 4 (padding_mask, causal_mask): name one by its number or its name, "
        'e.g. check("part 1").']
