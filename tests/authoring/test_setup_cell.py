"""The set-up cell every exercise notebook opens with: where the course is missing (Colab, a bare
JupyterHub) it installs the course's learner set from the repository that _config.yml names, into
the running kernel; where the course is installed it does nothing; the grader never runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autograder.authoring import generate as gen
from autograder.core.assignments import ROOT, all_assignments
from autograder.core.notebook import code_cells, read_notebook
from autograder.isolation.worker import statements

ASSIGNMENTS = all_assignments()
KEYS = [a.key for a in ASSIGNMENTS]


def configured_archive() -> str:
    """The archive the set-up cell must install, built here from _config.yml (the oracle)."""
    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    return f"{repo['url'].rstrip('/')}/archive/refs/heads/{repo['branch']}.zip"


def setup_source(key: str = "03_qkv") -> str:
    """The set-up cell's code, as the generated notebook of exercise `key` holds it."""
    nb = json.loads((ROOT / "exercises" / f"{key}.ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code[0].get("id") == gen.SETUP_CELL_ID, f"{key}: the first code cell is not the set-up cell"
    return "".join(code[0]["source"])


# A stand-in kernel: runs the set-up cell in a namespace of its own, with every way of starting a
# process recorded (and refused), and says what the cell did.
RUNNER = r"""
import json, os, subprocess, sys
calls = []
def record(*args, **kwargs):
    calls.append([str(a) for a in (args[0] if args and isinstance(args[0], (list, tuple)) else args)])
    return subprocess.CompletedProcess(args, 1)
if os.environ.get("SETUP_RECORD"):
    subprocess.run = subprocess.call = subprocess.check_call = subprocess.Popen = os.system = record
if os.environ.get("SETUP_HIDE_COURSE"):
    sys.modules["autograder"] = None  # `import autograder` raises ModuleNotFoundError, as without the course
ns = {"__name__": "__main__"}
exec(compile(open(sys.argv[1]).read(), "<set-up cell>", "exec"), ns)
course = ns.get("autograder")
print(json.dumps({"calls": calls, "names": sorted(n for n in ns if not n.startswith("__")),
                  "file": getattr(course, "__file__", None), "check": callable(getattr(course, "check", None))}))
"""


def run_cell(python: Path | str, source: str, tmp_path: Path, **env: str) -> tuple[dict, str]:
    """Run `source` as the set-up cell under `python`, in a folder outside the checkout; its report
    and what it printed before."""
    cell, runner = tmp_path / "cell.py", tmp_path / "runner.py"
    cell.write_text(source, encoding="utf-8")
    runner.write_text(RUNNER, encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    proc = subprocess.run([str(python), str(runner), str(cell)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    *printed, report = proc.stdout.strip().splitlines()
    return json.loads(report), "\n".join(printed) + proc.stderr


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_every_notebook_installs_the_repository_that_config_names(assignment):
    """Does every exercise open with the set-up cell, installing the learner set from _config.yml's
    repository and branch, and do its instructions give the same install line?"""
    archive = configured_archive()
    assert archive.startswith("https://github.com/") and archive.endswith(".zip")
    source = setup_source(assignment.key)
    assert source == gen.SETUP_CELL.replace("{archive}", archive)
    assert f'"attention-course[learner] @ {archive}"' in source
    nb = json.loads(assignment.notebook.read_text(encoding="utf-8"))
    assert f'pip install "attention-course[learner] @ {archive}"' in "".join(nb["cells"][0]["source"])
    assert "{archive}" not in assignment.notebook.read_text(encoding="utf-8")


@pytest.mark.parametrize("url, branch, archive", [
    ("https://github.com/someone/attention-fork", "spring-2027",
     "https://github.com/someone/attention-fork/archive/refs/heads/spring-2027.zip"),
    ("https://github.com/someone/attention-fork.git/", "release/2.0",
     "https://github.com/someone/attention-fork/archive/refs/heads/release/2.0.zip"),
    ("https://gitlab.com/someone/attention-fork", "main", None),
    ("https://github.com/someone", "main", None),
    ("https://github.com/someone/attention-fork", "main; rm -rf", None),
])
def test_a_fork_gets_its_own_archive_or_a_clear_refusal(tmp_path, url, branch, archive):
    """Does a fork's _config.yml give the set-up cell the fork's archive, and a repository the cell
    cannot install from a refusal that names the file?"""
    config = tmp_path / "_config.yml"
    config.write_text(yaml.safe_dump({"title": "A fork", "repository": {"url": url, "branch": branch}}),
                      encoding="utf-8")
    if archive is None:
        with pytest.raises(gen.MasterError, match="_config.yml: repository url .* must name a GitHub repository"):
            gen.setup_cell(config)
    else:
        assert gen.archive_url(config) == archive
        assert f'"attention-course[learner] @ {archive}"' in gen.setup_cell(config).source
    config.unlink()
    with pytest.raises(gen.MasterError, match="cannot be read"):
        gen.archive_url(config)


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=KEYS)
def test_the_grader_runs_nothing_of_the_setup_cell(assignment):
    """Does the grader's loader keep no statement of the set-up cell (so it can never run pip), while
    it keeps the exercise's own set-up after it?"""
    cells = code_cells(read_notebook(assignment.notebook))
    kept, notes = statements(cells)
    setup_label = cells[0]["label"]
    assert cells[0]["source"] == setup_source(assignment.key)
    assert not notes
    assert [st for st in kept if st["cell"] == setup_label] == []
    assert any(st["cell"] == cells[1]["label"] for st in kept), "the exercise's own imports are not loaded"
    # ...whereas an install at the top level would be kept: the check above can fail.
    unguarded, _ = statements([{"label": "cell 2", "source": "import subprocess\nr = subprocess.run(['pip'])"}])
    assert [st["source"] for st in unguarded] == ["import subprocess", "r = subprocess.run(['pip'])"]


@pytest.mark.parametrize("hidden, calls, printed, names", [
    # the course is installed (this project's environment): nothing runs, nothing is printed
    (False, [], "", ["autograder"]),
    # the course is missing: one pip call with the kernel's own interpreter; here pip is refused,
    # so the cell says the course could not be installed, and leaves no name behind
    (True, [[sys.executable, "-m", "pip", "install", "--quiet", "attention-course[learner] @ ARCHIVE"]],
     "The course could not be installed (pip says why above): run this cell again.", []),
])
def test_the_setup_cell_calls_pip_only_where_the_course_is_missing(tmp_path, hidden, calls, printed, names):
    """Does the set-up cell, in a kernel that has the course, start no process at all, and in one
    without it run exactly one quiet pip install of the configured archive with the kernel's Python?"""
    env = {"SETUP_RECORD": "1"} | ({"SETUP_HIDE_COURSE": "1"} if hidden else {})
    report, out = run_cell(sys.executable, setup_source(), tmp_path, **env)
    archive = configured_archive()
    assert report["calls"] == [[a.replace("ARCHIVE", archive) for a in call] for call in calls]
    assert out.strip() == printed
    assert report["names"] == names
    if not hidden:
        assert report["file"] == str(ROOT / "autograder" / "__init__.py")


@pytest.mark.slow
def test_the_setup_cell_installs_the_course_into_a_running_kernel(tmp_path):
    """In a fresh environment without the course, does the set-up cell install the course from its
    archive (here the wheel built from this checkout, pip kept offline) so that `autograder` and its
    `check` import in the same process, with no restart?"""
    from wheel_support import build_wheel, learner_venv

    wheel = build_wheel(tmp_path / "dist")
    python = learner_venv(tmp_path / "learner", None)
    source = setup_source()
    assert configured_archive() in source
    source = source.replace(configured_archive(), wheel.as_uri())
    report, out = run_cell(python, source, tmp_path, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1")
    assert "Installed the course: check your work in a cell with `from autograder import check; check()`." in out
    assert report["names"] == ["autograder"], report
    assert report["file"] and Path(report["file"]).is_relative_to(tmp_path / "learner"), report["file"]
    assert report["check"], "autograder.check is missing from the installed course"
    # Run again in a new process: now the course is there, and the cell does nothing.
    again, out = run_cell(python, source, tmp_path, SETUP_RECORD="1")
    assert again["calls"] == [] and out.strip() == ""


@pytest.mark.slow
def test_a_fork_regenerates_notebooks_that_install_the_fork(tmp_path):
    """With _config.yml pointed at a fork, does `generate --check` fail naming every notebook, and
    `generate` rewrite each set-up cell and install line to the fork's archive (and nothing else)?
    And is a repository outside GitHub refused in one line?"""
    import shutil

    for folder in ("autograder", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    config = (ROOT / "_config.yml").read_text(encoding="utf-8")
    ours = yaml.safe_load(config)["repository"]
    fork = config.replace(f"url: {ours['url']}", "url: https://github.com/someone/attention-fork", 1)
    fork = fork.replace(f"branch: {ours['branch']}", "branch: spring-2027", 1)

    def generate(*args):
        return subprocess.run([sys.executable, "-m", "autograder", "generate", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    (tmp_path / "_config.yml").write_text(fork.replace("https://github.com/", "https://gitlab.com/"), encoding="utf-8")
    refused = generate("--check")  # a host the set-up cell cannot install from: one line, no traceback
    assert refused.returncode == 2 and refused.stderr.startswith("error: _config.yml: repository url")
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    (tmp_path / "_config.yml").write_text(fork, encoding="utf-8")
    stale = generate("--check")
    assert stale.returncode == 1
    assert all(f"exercises/{key}.ipynb is stale" in stale.stdout for key in KEYS), stale.stdout[-2000:]
    assert "solutions/ch" not in stale.stdout  # the reference modules do not depend on the repository
    assert generate().returncode == 0
    archive = "https://github.com/someone/attention-fork/archive/refs/heads/spring-2027.zip"
    for key in KEYS:
        ours_text = (ROOT / "exercises" / f"{key}.ipynb").read_text(encoding="utf-8")
        text = (tmp_path / "exercises" / f"{key}.ipynb").read_text(encoding="utf-8")
        assert configured_archive() not in text and text.count(archive) == 2  # the cell and the instructions
        assert text == ours_text.replace(configured_archive(), archive)


def test_the_pages_give_the_configured_install_line():
    """Do the learner's page on checking (and the README, where it gives one) give the install line
    of the repository _config.yml names?"""
    import re

    line = re.compile(r'pip install "attention-course\[learner\] @ (\S+)"')
    assert line.findall((ROOT / "book" / "checking.md").read_text(encoding="utf-8")) == [configured_archive()]
    assert set(line.findall((ROOT / "README.md").read_text(encoding="utf-8"))) <= {configured_archive()}
