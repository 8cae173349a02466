"""Binder's environment (.binder/requirements.txt) can check every chapter.

Binder builds from its own list (PyTorch's CPU build instead of the default one), so the
list can fall behind the course's: a chapter whose hidden checks import a package Binder
lacks would fail `python -m autograder check` there. Every third-party module that the
grader and the hidden checks import must come from a package on Binder's list, pinned as
in requirements.txt.
"""
import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s#]+)")


def pins(path):
    found = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            found[m.group(1).lower().replace("_", "-")] = m.group(2)
    return found


def imported_top_level(paths):
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_binder_pins_what_the_course_pins():
    course, binder = pins(ROOT / "requirements.txt"), pins(ROOT / ".binder" / "requirements.txt")
    assert binder, "no pins read from .binder/requirements.txt"
    for name, version in binder.items():
        assert name in course, f"{name} is on Binder's list but not in requirements.txt"
        assert version.split("+")[0] == course[name], f"{name}: Binder {version}, course {course[name]}"


# The instructor's side, never run on Binder: a cohort graded in parallel or on a cluster
# (dask), and the exercises generated from their sources (myst_nb).
INSTRUCTORS_ONLY = {"cohort.py", "dask_cluster.py", "generate.py"}


def installed_with(names):
    """The distributions `names` install, their dependencies included."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" not in req:
                todo.append(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-"))
    return seen


def test_binder_installs_every_package_the_checks_import():
    code = [p for p in (ROOT / "autograder").rglob("*.py") if p.name not in INSTRUCTORS_ONLY]
    code += list((ROOT / "solutions").glob("ch*.py"))
    modules = imported_top_level(code) - set(sys.stdlib_module_names) - {"autograder", "solutions"}
    dists = packages_distributions()
    binder = installed_with(pins(ROOT / ".binder" / "requirements.txt"))
    missing = []
    for module in sorted(modules):
        wanted = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        if not wanted:
            continue  # imported only where a package is optional (guarded imports)
        if not wanted & set(binder):
            missing.append(f"{module} (from {', '.join(sorted(wanted))})")
    assert not missing, "Binder's list lacks: " + "; ".join(missing)
