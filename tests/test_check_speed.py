"""What makes a learner's `check` fast, kept from coming undone: the cell audit needs neither
nbgrader nor nbformat (and computes nbgrader's checksum byte for byte), the reader still refuses
what is not a notebook, `check` imports nothing that only `grade` needs, and its worker is
started before the trusted side imports torch. Timings themselves are measured by
benchmarks/check_speed.py, not asserted here."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import nbformat
import pytest
from nbgrader.utils import compute_checksum

from autograder.assignments import ROOT, all_assignments, get_assignment
from autograder.notebook import NotebookError, audit_cells, cell_checksum, read_notebook, reference_cells
from conftest import reference_notebook, write

KEY = "03_qkv"


def _nbgrader_checksum(cell_type: str, source: str, nbg: dict) -> str:
    return compute_checksum(nbformat.from_dict({"cell_type": cell_type, "source": source,
                                                "metadata": {"nbgrader": copy.deepcopy(nbg)}}))


@pytest.mark.parametrize("key", [a.key for a in all_assignments()])
def test_checksum_equals_nbgraders_for_every_generated_cell(key):
    """The audit's checksum is nbgrader's, for every nbgrader cell of every learner notebook, and it
    matches the checksum the generator stored there."""
    nb = read_notebook(get_assignment(key).notebook)
    seen = 0
    for cell in nb.cells:
        nbg = cell["metadata"].get("nbgrader")
        if not isinstance(nbg, dict) or "grade_id" not in nbg:
            continue
        ours = cell_checksum(cell["type"], cell["source"], nbg)
        assert ours == _nbgrader_checksum(cell["type"], cell["source"], nbg)
        if nbg.get("locked") or nbg.get("grade"):
            assert ours == nbg["checksum"], cell["index"]
        seen += 1
    assert seen > 0


@pytest.mark.parametrize("nbg", [
    {"grade_id": "a", "grade": True, "solution": False, "locked": True, "points": 3},
    {"grade_id": "b", "grade": False, "solution": True, "locked": False},
    {"grade_id": "c", "grade": False, "solution": False, "locked": True},
    {"grade_id": "d", "grade": True, "solution": True, "points": "2.5"},       # both, points as text
    {"grade_id": "e", "grade": 1, "points": 0},                                # truthy, not a bool
    {"grade_id": "f", "locked": "yes"},                                        # odd values, as written
    {"grade_id": "g", "solution": 0, "grade": 0, "locked": 1},
    {"grade_id": "h√ü ☃", "grade": True, "points": 1e-3, "locked": False},     # non-ASCII id
])
@pytest.mark.parametrize("source", ["", "x = 1\n", "def f():\n    return 'é'\n"])
@pytest.mark.parametrize("cell_type", ["code", "markdown"])
def test_checksum_equals_nbgraders_for_odd_metadata(nbg, source, cell_type):
    assert cell_checksum(cell_type, source, nbg) == _nbgrader_checksum(cell_type, source, nbg)


def test_checksum_fails_where_nbgraders_fails():
    """A grade cell without usable points: nbgrader raises, so does ours (the audit calls it edited)."""
    for nbg in ({"grade_id": "x", "grade": True}, {"grade_id": "x", "grade": True, "points": "many"}):
        with pytest.raises(Exception):
            _nbgrader_checksum("code", "", nbg)
        with pytest.raises((KeyError, ValueError, TypeError)):
            cell_checksum("code", "", nbg)


def test_audit_sees_an_edited_locked_cell_and_nothing_else(tmp_path):
    ref = reference_cells(read_notebook(get_assignment(KEY).notebook))
    nb = reference_notebook(KEY)
    assert audit_cells(read_notebook(write(nb, tmp_path / "ok.ipynb")), ref).notes == []
    locked = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("locked")
                  and not c.metadata["nbgrader"].get("solution"))
    locked.source += "\n# changed"
    audit = audit_cells(read_notebook(write(nb, tmp_path / "edited.ipynb")), ref)
    assert not audit.rejected and len(audit.notes) == 1 and "was edited" in audit.notes[0]


# --- the reader: a size-checked json.load and the structure the grader uses ------------------

def _valid() -> dict:
    return json.loads(get_assignment(KEY).notebook.read_text(encoding="utf-8"))


def _broken():
    """(name, notebook JSON text, words of our error): each is also refused by nbformat's validation."""
    def nb(**change):
        d = _valid()
        d.update(change)
        return d

    def cell0(**change):
        d = _valid()
        d["cells"][0].update(change)
        return d

    return [
        ("not json", "{\"cells\": [", "not valid notebook JSON"),
        ("a list", json.dumps([1, 2]), "no list of cells"),
        ("cells not a list", json.dumps(nb(cells={"a": 1})), "no list of cells"),
        ("format 3", json.dumps(nb(nbformat=3)), "only format 4"),
        ("format missing", json.dumps({k: v for k, v in _valid().items() if k != "nbformat"}), "only format 4"),
        ("cell not an object", json.dumps(nb(cells=[1])), "cell 1 is malformed"),
        ("unknown cell type", json.dumps(cell0(cell_type="python")), "cell 1 is malformed"),
        ("source a number", json.dumps(cell0(source=3)), "malformed source"),
        ("source a list of numbers", json.dumps(cell0(source=[1, 2])), "malformed source"),
    ]


@pytest.mark.parametrize("name,text,words", _broken(), ids=[b[0] for b in _broken()])
def test_reader_refuses_what_nbformat_refuses(tmp_path, name, text, words):
    path = tmp_path / "nb.ipynb"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(NotebookError, match=words):
        read_notebook(path)
    with pytest.raises(Exception):  # nbformat refuses it too (a read error or a validation error)
        nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def test_reader_reads_what_nbformat_reads():
    for a in all_assignments():
        ours = read_notebook(a.notebook)
        theirs = nbformat.read(str(a.notebook), as_version=4)
        assert [c["source"] for c in ours.cells] == [c.source for c in theirs.cells]
        assert [c["type"] for c in ours.cells] == [c.cell_type for c in theirs.cells]
        assert ours.assignment == a.key


# --- what `check` does, in order ---------------------------------------------------------------

SPY = textwrap.dedent("""
    import json, sys
    import autograder.runner as R
    seen = {}
    start = R.Submission.start_early
    def start_early(self):
        seen["torch_when_started"] = "torch" in sys.modules
        start(self)
        seen["started"] = self.proc is not None
    R.Submission.start_early = start_early
    from autograder.cli import main
    code = main(["check", "--json", sys.argv[1]])
    heavy = ("nbgrader", "nbformat", "jsonschema", "sqlalchemy", "dask", "distributed", "autograder.gradebook")
    seen["imported"] = sorted(m for m in heavy if m in sys.modules)
    print("SPY" + json.dumps(dict(seen, code=code)), file=sys.stderr)
""")


def test_check_starts_the_worker_first_and_imports_nothing_grade_needs(tmp_path):
    path = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    proc = subprocess.run([sys.executable, "-c", SPY, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    spy = json.loads(next(ln for ln in proc.stderr.splitlines() if ln.startswith("SPY"))[3:])
    assert spy["code"] == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["score"] == result["max_score"] == 26
    assert spy["started"] and spy["torch_when_started"] is False
    assert spy["imported"] == []


def test_an_early_worker_ends_with_a_rejected_notebook(tmp_path):
    """A notebook refused by the audit never has its code loaded, and its early worker is ended."""
    from autograder.grader import ERROR, Grader
    from autograder.runner import Submission

    nb = reference_notebook(KEY)
    forged = nbformat.v4.new_code_cell("x = 1")
    forged.metadata["nbgrader"] = {"grade": True, "grade_id": "forged", "points": 100, "locked": True,
                                   "solution": False}
    nb.cells.append(forged)
    path = write(nb, tmp_path / "forged.ipynb")
    early = Submission([], notebook=path)
    early.start_early()
    assert early.proc is not None
    result = Grader(get_assignment(KEY)).grade(path, seed=1, submission=early)
    assert result.status == ERROR and "forged" in result.error
    assert early.proc is None and early._loaded == 0


def test_configure_is_refused_after_the_code_is_loaded():
    from autograder.limits import DEFAULT
    from autograder.runner import Learner, Submission

    with Submission([{"label": "a", "source": "def f():\n    return 2\n"}]) as sub:
        assert Learner(sub).f() == 2
        with pytest.raises(RuntimeError):
            sub.configure([], limits=DEFAULT, seed=0)


def _sandbox_problem() -> str:
    from autograder.sandbox import SandboxUnavailable, detect

    try:
        detect()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def test_sandboxed_check_gives_the_same_marks(tmp_path):
    """`check --sandbox` probes the sandbox while its worker starts, then grades as usual."""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(problem)
    from conftest import run_json

    data = run_json("check", "--sandbox", str(write(reference_notebook(KEY), tmp_path / "ref.ipynb")))
    assert data["score"] == data["max_score"] == 26 and data["sandboxed"] is True


FAILING_PROBE = textwrap.dedent("""
    import os, sys
    import autograder.runner as R
    import autograder.sandbox as S
    workers = []
    start = R.Submission.start_early
    def start_early(self):
        start(self)
        workers.append(self)
    R.Submission.start_early = start_early
    def probe(self):
        raise S.SandboxUnavailable("no sandbox today")
    S.Sandbox.probe = probe
    from autograder.cli import main
    code = main(["check", "--sandbox", sys.argv[1]])
    print("SPY", code, [w.proc is None for w in workers], "torch" in sys.modules, file=sys.stderr)
""")


def test_a_failing_sandbox_probe_ends_the_early_worker(tmp_path):
    """A sandbox that fails its probe: exit 2 with the reason, the early worker ended, nothing graded."""
    problem = _sandbox_problem()
    if problem:
        pytest.skip(problem)
    path = write(reference_notebook(KEY), tmp_path / "mine.ipynb")
    proc = subprocess.run([sys.executable, "-c", FAILING_PROBE, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert "no sandbox today" in proc.stderr
    assert "SPY 2 [True] False" in proc.stderr, proc.stderr[-2000:]
