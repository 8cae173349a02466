"""Binder's environment (.binder/) and the learner's set can check every chapter.

Binder builds from its own folder: runtime.txt pins Python, and requirements.txt installs
the learner's set (pyproject.toml's base and its `learner` extra: PyTorch's CPU build instead
of the default one) and the course, editable. Either can fall behind the course: a chapter
whose hidden checks import a package that the learner's set lacks fails `check` on Binder,
in Colab and on a learner's laptop. Every third-party module that `check` imports (the
grader, the hidden checks, the reference modules, the exercise notebooks) must come from a
package of that set; and Binder pins it as requirements.txt does. tests/end_to_end/test_package.py
proves the same by checking notebooks in an environment that holds this set alone.
"""
import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from wheel_support import closure, requirements

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / ".binder"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s#]+)")
# Modules that `check` never imports: grading a cohort (nbgrader's gradebook, dask), and the
# authors' commands, which need a clone (generate, new, mutants, seeds).
NOT_ON_THE_CHECK_PATH = {"cohort.py", "dask_cluster.py", "gradebook.py", "grading_run.py", "generate.py",
                         "scaffold.py", "mutants.py", "seeds.py",
                         # the instructor's commands: nbgrader's course folder, formgrader's buttons, exports,
                         # releases, similarity
                         "nbgrader_course.py", "export.py", "release.py", "learners_release.py", "lms.py",
                         "similarity.py", "fingerprints.py", "release_search.py", "nbgrader_buttons.py"}


def pins(path):
    found = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            found[canonicalize_name(m.group(1))] = m.group(2)
    return found


def imported_top_level(sources):
    names = set()
    for name, text in sources:
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def check_path_sources():
    """(name, Python source) of everything `check` runs: the grader's modules, the hidden checks,
    the reference modules, and the code cells of the exercise notebooks (their magics blanked)."""
    files = [p for p in (ROOT / "autograder").rglob("*.py") if p.name not in NOT_ON_THE_CHECK_PATH]
    files += list((ROOT / "solutions").glob("ch*.py"))
    out = [(str(p), p.read_text(encoding="utf-8")) for p in files]
    for nb in sorted((ROOT / "exercises").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                out.append((f"{nb.name} cell {i}", re.sub(r"(?m)^\s*[%!].*$", "", source)))
    return out


def test_binder_pins_what_the_course_pins():
    course, binder = pins(ROOT / "requirements.txt"), pins(BINDER / "requirements.txt")
    assert binder, "no pins read from .binder/requirements.txt"
    for name, version in binder.items():
        assert name in course, f"{name} is on Binder's list but not in requirements.txt"
        assert version.split("+")[0] == course[name], f"{name}: Binder {version}, course {course[name]}"


def test_binder_installs_the_course_with_the_learner_set_pinned():
    lines = [ln.strip() for ln in (BINDER / "requirements.txt").read_text().splitlines()]
    assert "-e .[learner]" in lines, "Binder no longer installs the course with its learner extra"
    binder = pins(BINDER / "requirements.txt")
    unpinned = [str(r) for r in requirements(("learner",)) if canonicalize_name(r.name) not in binder]
    assert not unpinned, f"Binder would take the newest of {unpinned}, not the course's pins"
    heavy = {canonicalize_name(r.name) for r in requirements(("instructor", "tests"))} - {
        canonicalize_name(r.name) for r in requirements(("learner",))}
    assert not heavy & set(binder), f"Binder installs more than the learner's set: {sorted(heavy & set(binder))}"


def test_binder_pins_a_python_the_course_supports():
    (line,) = [ln.strip() for ln in (BINDER / "runtime.txt").read_text().splitlines() if ln.strip()]
    m = re.fullmatch(r"python-(3\.\d+)", line)
    assert m, f"runtime.txt: {line!r} is not repo2docker's python-X.Y"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert SpecifierSet(project["requires-python"]).contains(f"{m.group(1)}.0")


def test_the_learner_set_provides_every_package_check_imports():
    modules = imported_top_level(check_path_sources()) - set(sys.stdlib_module_names)
    modules -= {"autograder", "solutions", "protocol", "device_check", "warm_server", "seccomp"}
    dists = packages_distributions()
    learner = set(closure(requirements(("learner",))))
    missing, unknown = [], []
    for module in sorted(modules):
        wanted = {canonicalize_name(d) for d in dists.get(module, [])}
        if not wanted:
            unknown.append(module)
        elif not wanted & learner:
            missing.append(f"{module} (from {', '.join(sorted(wanted))})")
    assert not missing, "the learner's set (pyproject.toml's base and learner extra) lacks: " + "; ".join(missing)
    assert not unknown, f"imported by the check path but installed by nothing here: {unknown}"


def test_the_check_path_is_read_where_it_should_be():
    """The scan above reads the hidden checks, a reference module and a notebook's cells, and finds
    the packages chapters 08 and 09 need (so it cannot pass by reading nothing)."""
    names = [n for n, _ in check_path_sources()]
    assert any(n.endswith("test_08_pronunciation.py") for n in names)
    assert any(n.startswith("09_gpt.ipynb") for n in names)
    assert {"rapidfuzz", "transformers", "torch", "numpy"} <= imported_top_level(check_path_sources())
