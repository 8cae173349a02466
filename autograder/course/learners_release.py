"""The learners' release: the course as graded learners get it, for a repository of its own.

`python -m autograder release --learners DIR --repository https://github.com/OWNER/NAME`
writes into DIR

* `site/`: the built book, its repository button, launch buttons and every chapter's
  exercise links pointing at the learners' repository, without the "For instructors"
  part (and without the page on `check()`, which needs the hidden tests);
* `exercises/KEY.ipynb`: the learner notebooks in their learners' variant (made from the
  masters by `generate`'s own code path, with instructions and a set-up cell that offer
  the visible tests only: the hidden tests are not there to run);
* `README.md`, `.github/workflows/pages.yml` (publishes `site/` as it is),
  `.binder/requirements.txt` and `runtime.txt` (the learner stack, without the course),
  and `RELEASE.json` (the source commit and every file written).

The book's pages import the reference modules to run their code, so the learners'
repository cannot rebuild the book: it carries the built site. The site is built from a
staged copy of the course (a temporary folder whose `_config.yml` and `_toc.yml` differ)
that reads the main build's execution cache, so after `make book` nothing is re-executed.

Before anything reaches DIR the release is searched (`release_search.verify`): no file may be or hold a
reference module, a hidden test, a master, a solution or hidden-test marker, or the
solution code of a master or a hidden test's code, whatever its layout, comments and local
names. A release that fails is deleted and DIR is left as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ..core.assignments import ROOT, all_assignments
from ..core.usage import UsageError
from .release_search import forbidden_content, verify

MARKER = "RELEASE.json"
KIND = "attention-course learners' release"
GITHUB_RE = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")
BRANCH_RE = re.compile(r"^[A-Za-z0-9_./-]+$")
LEARNERS_INSTRUCTIONS = ROOT / "exercises" / "source" / "_instructions_learners.md"
# Pages the learners' site leaves out: the instructors' part, and `check()`, which runs hidden tests.
DROPPED_CAPTIONS = ("For instructors",)
DROPPED_PAGES = ("book/checking",)
# Kept in DIR from an earlier release or a clone of the learners' repository.
KEPT = (".git",)
LEARNERS_SETUP = """\
# Set-up: the exercises run on PyTorch and NumPy (exercise 09 also on transformers). Colab and
# the course's Binder have them; on your own machine, install the course's list once, in a
# terminal: pip install -r {requirements}
import importlib.util
missing = [name for name in ("torch", "numpy") if importlib.util.find_spec(name) is None]
print(f"Missing: {', '.join(missing)}: install them (see above)." if missing else "Ready: PyTorch and NumPy are installed.")"""
PAGES_WORKFLOW = """\
# Publishes site/ (the course's built book) on GitHub Pages on every push to {branch}.
# Settings > Pages > Source: "GitHub Actions". Nothing is built here: the site comes built.
name: pages

on:
  push:
    branches: [{branch}]
  workflow_dispatch:

permissions:
  contents: read
  pages: write
  id-token: write

concurrency:
  group: pages
  cancel-in-progress: false

jobs:
  deploy:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    environment:
      name: github-pages
      url: ${{{{ steps.deployment.outputs.page_url }}}}
    steps:
      - uses: actions/checkout@v7
      - uses: actions/upload-pages-artifact@v5
        with:
          path: site
      - id: deployment
        uses: actions/deploy-pages@v5
"""
README = """\
# Attention and Transformers: the course for learners

This repository is the learners' release of the course: the book, built, in `site/` (published
on GitHub Pages), and the exercise notebooks in `exercises/`. Open a chapter in the book: the
box under its title opens the chapter's exercise in Colab or on Binder, or downloads it.

Each exercise notebook has a test cell under each part: a cell that runs without an error
means its visible checks pass. Your instructor grades your notebook with more checks on
fresh inputs, so test your code on your own examples too.

To work on your own machine: `pip install -r .binder/requirements.txt`, then open
`exercises/KEY.ipynb` in JupyterLab.

Written by `python -m autograder release --learners` from the course's commit {commit};
do not edit it here: the next release replaces it.
"""


def _repository(url: str | None, branch: str) -> tuple[str, str]:
    url = (url or "").strip().rstrip("/").removesuffix(".git")
    if not GITHUB_RE.match(url):
        raise UsageError(f"--repository {url!r} must be a GitHub repository, https://github.com/OWNER/NAME: "
                         "the learners' site and launch links point there")
    if not BRANCH_RE.match(branch):
        raise UsageError(f"--branch {branch!r} is not a branch name (letters, digits, '_', '.', '/', '-')")
    return url, branch


def check_destination(dest: Path) -> None:
    """A UsageError unless DIR is missing, empty (but for KEPT), or an earlier release."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--learners {dest} is a file, not a folder")
    if not dest.exists():
        return
    foreign = [p.name for p in dest.iterdir() if p.name not in KEPT]
    if not foreign:
        return
    try:
        marker = json.loads((dest / MARKER).read_text(encoding="utf-8"))
        earlier = marker.get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise UsageError(f"--learners {dest} holds files ({', '.join(sorted(foreign)[:3])}, ...) and no {MARKER} of "
                         "an earlier learners' release: give an empty folder, a fresh clone, or an earlier release")


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def learners_notebooks(url: str, branch: str) -> dict[str, str]:
    """KEY -> the learners' variant of each exercise notebook, from its master."""
    import nbformat

    from ..authoring import generate as gen
    requirements = f"https://raw.githubusercontent.com/{url[len('https://github.com/'):]}/{branch}/.binder/requirements.txt"
    setup = nbformat.v4.new_code_cell(LEARNERS_SETUP.replace("{requirements}", requirements))
    setup["id"] = gen.SETUP_CELL_ID
    return {a.key: gen.learner_notebook(a, gen.read_master(a, instructions=LEARNERS_INSTRUCTIONS, setup=setup))
            for a in all_assignments() if a.notebook.exists()}


def binder_requirements() -> str:
    """The course's Binder list without the course itself (the learners' repository has no package)."""
    lines = (ROOT / ".binder" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    kept, comment = [], []
    while lines and lines[0].startswith("#"):  # the course's own header, which speaks of the package
        lines.pop(0)
    for line in lines:
        if line.startswith("#"):
            comment.append(line)
            continue
        if line.startswith("-e "):
            comment = []
            continue
        kept += comment + [line]
        comment = []
    kept[0:0] = ["# The learners' stack: what the exercise notebooks import (written by the course's release)."]
    return "\n".join(kept) + "\n"


def staged_config(url: str, branch: str) -> tuple[str, str]:
    """The staged book's _config.yml and _toc.yml."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["repository"] = {**config.get("repository", {}), "url": url, "branch": branch}
    config.setdefault("launch_buttons", {})["jupyterhub_url"] = ""
    # Pages keep what holds only where the hidden tests exist in {only} not learners_release blocks.
    config.setdefault("sphinx", {}).setdefault("config", {})["course_learners_release"] = True
    # The main build's executed outputs: a page whose code is unchanged is not run again.
    config.setdefault("execute", {})["cache"] = str(ROOT / "_build" / ".jupyter_cache")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    parts = []
    for part in toc.get("parts", []):
        if part.get("caption") in DROPPED_CAPTIONS:
            continue
        chapters = [c for c in part.get("chapters", []) if c.get("file") not in DROPPED_PAGES]
        if chapters:
            parts.append({**part, "chapters": chapters})
    toc["parts"] = parts
    return yaml.safe_dump(config, sort_keys=False), yaml.safe_dump(toc, sort_keys=False)


def _jupyter_book() -> str:
    """The jupyter-book command of this Python (its module has no `-m` entry)."""
    script = Path(sys.executable).parent / "jupyter-book"
    if script.exists():
        return str(script)
    found = shutil.which("jupyter-book")
    if found is None:
        raise UsageError("jupyter-book is not installed in this Python: run `make install` first")
    return found


def build_site(stage: Path, notebooks: dict[str, str], url: str, branch: str) -> tuple[Path, str]:
    """Build the book from a staged copy of the course; the built site and the build's log."""
    for name in ("book", "solutions", "coursebook", "benchmarks", "autograder", "references.bib"):
        (stage / name).symlink_to(ROOT / name)
    config, toc = staged_config(url, branch)
    (stage / "_config.yml").write_text(config, encoding="utf-8")
    (stage / "_toc.yml").write_text(toc, encoding="utf-8")
    (stage / "exercises").mkdir()
    for key, text in notebooks.items():
        (stage / "exercises" / f"{key}.ipynb").write_text(text, encoding="utf-8")
    out = stage / "out"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # No -W: links from the kept pages to the dropped ones become plain text, with a warning each.
    proc = subprocess.run([_jupyter_book(), "build", str(stage), "--path-output", str(out),
                           "-n", "--keep-going"], capture_output=True, text=True, env=env, cwd=stage)
    log = proc.stdout + proc.stderr
    site = out / "_build" / "html"
    if proc.returncode != 0 or not (site / "index.html").exists():
        tail = "\n".join(log.splitlines()[-15:])
        raise UsageError(f"the learners' site did not build (jupyter-book exit {proc.returncode}); its last lines:\n{tail}")
    return site, log


def assemble(tree: Path, site: Path, notebooks: dict[str, str], url: str, branch: str, commit: str) -> None:
    shutil.copytree(site, tree / "site", ignore=shutil.ignore_patterns(".buildinfo", ".doctrees"))
    (tree / "exercises").mkdir()
    for key, text in notebooks.items():
        (tree / "exercises" / f"{key}.ipynb").write_text(text, encoding="utf-8")
    (tree / "README.md").write_text(README.format(commit=commit), encoding="utf-8")
    (tree / ".github" / "workflows").mkdir(parents=True)
    (tree / ".github" / "workflows" / "pages.yml").write_text(PAGES_WORKFLOW.format(branch=branch), encoding="utf-8")
    (tree / ".binder").mkdir()
    (tree / ".binder" / "requirements.txt").write_text(binder_requirements(), encoding="utf-8")
    runtime = ROOT / ".binder" / "runtime.txt"
    if runtime.exists():
        shutil.copy2(runtime, tree / ".binder" / "runtime.txt")
    files = sorted("/".join(p.relative_to(tree).parts) for p in tree.rglob("*") if p.is_file())
    (tree / MARKER).write_text(json.dumps({"kind": KIND, "source_commit": commit, "repository": url, "branch": branch,
                                           "files": files}, indent=1) + "\n", encoding="utf-8")


def replace_into(dest: Path, tree: Path) -> None:
    """DIR's earlier release (all but KEPT) replaced by `tree`'s files."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():
        if p.name in KEPT:
            continue
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in tree.iterdir():
        shutil.move(str(p), str(dest / p.name))


def learners_release_command(args) -> int:
    started = time.monotonic()
    url, branch = _repository(args.repository, args.branch)
    if args.assignment:
        raise UsageError("--learners releases the whole course: give no chapter keys")
    dest = Path(args.learners).resolve()
    check_destination(dest)
    if not (ROOT / "_build" / "html" / "index.html").exists():
        raise UsageError("the learners' release reuses the book's build and there is none: run `make book` first")
    notebooks = learners_notebooks(url, branch)
    forbidden = forbidden_content()
    with tempfile.TemporaryDirectory(prefix="learners-release-") as tmp:
        stage, tree = Path(tmp) / "stage", Path(tmp) / "release"
        stage.mkdir()
        tree.mkdir()
        site, log = build_site(stage, notebooks, url, branch)
        assemble(tree, site, notebooks, url, branch, _commit())
        problems = verify(tree, forbidden, skip=KEPT)
        if problems:
            # The temporary folder, the partial release with it, goes; DIR is untouched.
            raise UsageError(f"the learners' release would give away what it must hide, so nothing was written to "
                             f"{dest}: " + "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
        replace_into(dest, tree)
    warnings = sum("WARNING" in line for line in log.splitlines())
    print(f"Wrote the learners' release to {dest} in {time.monotonic() - started:.0f} s: site/ "
          f"({len(notebooks)} exercise notebooks; links to {url}, branch {branch}; {warnings} build warnings, "
          "links to the instructors' pages left as text). Push it to that repository; its Pages workflow publishes site/.")
    return 0
