"""The cell audit's checksum is nbgrader's, byte for byte, computed without nbgrader or nbformat.

`check` audits a learner's cells (a locked cell edited, a grade cell forged) with its own
`cell_checksum`, so that a learner's self-check loads neither nbgrader nor nbformat (see
tests/learner/test_check_command.py). These tests hold that checksum to nbgrader's `compute_checksum`
for every generated cell and for odd metadata, and the audit to what it must report.
"""

from __future__ import annotations

import copy

import nbformat
import pytest
from nbgrader.utils import compute_checksum

from autograder.core.assignments import all_assignments, get_assignment
from autograder.core.notebook import audit_cells, cell_checksum, read_notebook, reference_cells
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
