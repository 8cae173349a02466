"""The course as a learner installs it: its wheel, and a fresh environment outside the checkout.

`build_wheel` builds the wheel offline from a copy of the checkout's sources, so the build
leaves nothing in the checkout (no build/, no *.egg-info) and no stale file of an earlier
build can slip into the wheel. `learner_venv` makes a virtual environment that sees only the
pinned distributions of this project's environment that the course's base and its learner
extra need (their dependencies included), never the checkout: the network is not needed,
and a module that `check` imports without declaring it fails there as it would for a learner.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# What the wheel is built from; tests/, book/ and benchmarks/ are not among them.
SOURCES = ("pyproject.toml", "README.md", "autograder", "solutions", "exercises")
NOT_SOURCES = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info", "build",
                                     ".lock", "*.tmp")


def build_wheel(dest: Path) -> Path:
    """The course's wheel, built offline into `dest` (``pip wheel --no-deps --no-build-isolation``)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="course-src-") as tmp:
        src = Path(tmp) / "attention-course"
        src.mkdir()
        for name in SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name, ignore=NOT_SOURCES)
            else:
                shutil.copy2(ROOT / name, src / name)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                               "--quiet", str(src), "-w", str(dest)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    wheels = sorted(dest.glob("attention_course-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one attention_course wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject.toml's base requirements and those of `extras`."""
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


def closure(reqs: list[Requirement]) -> list[str]:
    """The distributions installed here that `reqs` need, their dependencies (and the extras they
    ask for) included; a requirement that nothing here installs is left out (pip then says so)."""
    seen: set[tuple[str, frozenset]] = set()
    names: set[str] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        key = (name, frozenset(req.extras))
        if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        names.add(name)
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (*req.extras, "")):
                todo.append(Requirement(str(sub).split(";")[0]))
    return sorted(names)


def _expose(dists: list[str], farm: Path) -> None:
    """Link each top-level file and folder of `dists` (their modules, data and metadata) into `farm`."""
    farm.mkdir(parents=True)
    for name in dists:
        dist = distribution(name)
        base = Path(dist.locate_file(""))
        for top in sorted({f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}):
            if top == "__pycache__" or top.endswith(".pth") or (farm / top).exists():
                continue
            if (base / top).exists():
                (farm / top).symlink_to(base / top)


def learner_venv(path: Path, wheel: Path | None, *, extras: tuple[str, ...] = ("learner",)) -> Path:
    """A fresh virtual environment at `path` (outside the checkout) that sees, through a folder of
    links named in a .pth file, this project's pinned distributions that the course's base and
    `extras` need, and pip; not the checkout, nor the rest of the project's environment. With
    `wheel`, the course is installed into it from that file with ``pip install --no-index``, its
    `extras` asked for: every dependency it declares must then be met by what it sees. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    _expose([*closure(requirements(extras)), "pip"], path / "course-stack")
    (purelib / "course-stack.pth").write_text(f"{path / 'course-stack'}\n", encoding="utf-8")
    if wheel is not None:
        spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
        proc = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                               "--disable-pip-version-check", "--quiet", spec],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install {spec} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return python
