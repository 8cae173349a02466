"""``python -m autograder new KEY "Title"``: start a chapter with every file it needs.

A chapter is named by its key (``08_sparse_attention``) and lives in seven files: four written
by hand, started here with one small placeholder part that already passes every check of its
own, one line of ``_toc.yml``, and two generated from the master:

* ``exercises/source/KEY.md``: the master, in the generator's source format (the shared
  instructions, a locked set-up cell, a solution cell with its ``### BEGIN SOLUTION`` region,
  a visible-test cell with the part's points);
* ``autograder/hidden/test_KEY.py``: one hidden check for the part, which the reference passes
  and the untouched notebook fails;
* ``tests/chapters/chKEY.py``: the table of typical mistakes, four rows that the check sees;
* ``book/KEY.md``: the chapter's page, a MyST notebook that imports the reference and draws a
  figure, and its entry among the chapters of ``_toc.yml``;
* ``exercises/KEY.ipynb`` and ``solutions/chKEY.py``, written by ``python -m autograder
  generate KEY``, which `new_command` runs in the course folder.

Nothing is overwritten: a key that is malformed, taken (one of the files exists, the table of
contents lists it, or another chapter has its number) or a title that cannot be written into
these files is a usage error, and nothing is written. ``--root DIR`` writes into another copy
of the course (a test's, a fork's). autograder/hidden/README.md ("Adding a chapter") says what
to do next, and which rules the tests hold a chapter to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from string import Template

from ..core.assignments import KEY_RE, ROOT, Assignment
from ..core.usage import UsageError

TOC = "_toc.yml"
PART = "normalise"  # the placeholder part, and the function it asks for
CHECK = f"test_{PART}_matches_reference"
TITLE_RE = re.compile(r'^[^\x00-\x1f\x7f"\\]{1,100}$')  # one line; no quote or backslash (it goes into docstrings)
TOC_CHAPTERS_RE = re.compile(r"^\s*- caption:\s*Chapters\s*$")
TOC_CAPTION_RE = re.compile(r"^\s*- caption:")
TOC_CHAPTER_RE = re.compile(r"^(\s*)- file: book/(\d\d_[a-z0-9_]+)\s*$")


def chapter_paths(key: str) -> dict[str, Path]:
    """The chapter's files, relative to the course folder: what each holds -> path."""
    a = Assignment(key)
    rel = {name: path.relative_to(ROOT) for name, path in (
        ("master", a.master), ("hidden tests", a.hidden_tests), ("notebook", a.notebook), ("solutions", a.solutions))}
    return {"master": rel["master"], "hidden tests": rel["hidden tests"],
            "table": Path("tests") / "chapters" / f"ch{key}.py", "book page": Path("book") / f"{key}.md",
            "notebook": rel["notebook"], "solutions": rel["solutions"]}



# --- the placeholder chapter ------------------------------------------------------------------

MASTER = Template('''\
---
kernelspec:
  name: python3
  display_name: Python 3
---

# Exercise $number: $title

PLACEHOLDER: say in two or three sentences what the learner builds in this exercise, and which
chapter of the book explains it. Replace the part below by the exercise's own parts.

<!-- instructions -->

Conventions: shapes are written `(..., L, d)`.

```{code-cell} ipython3
:grader: locked setup
:tags: [export]
import math

import numpy as np
import torch
import torch.nn.functional as F
```

+++

## Part 1: rows that sum to one (2 points)

`$part(x)` takes a tensor `x` of positive numbers, of shape `(..., n)`, and divides each
row (the last axis) by its sum, so that every row of the result sums to 1. The result has
the shape and dtype of `x`.

```{code-cell} ipython3
:grader: solution $part
def $part(x):
    """`x` divided by its sum over the last axis: every row of the result sums to 1."""
    ### BEGIN SOLUTION
    return x / x.sum(dim=-1, keepdim=True)  # (..., n)
    ### END SOLUTION
```

```{code-cell} ipython3
:grader: tests $part 2
x = torch.tensor([[1.0, 3.0], [2.0, 2.0], [0.5, 1.5]])
w = $part(x)
assert w.shape == x.shape and w.dtype == x.dtype
assert torch.allclose(w.sum(-1), torch.ones(3))
assert torch.allclose(w[0], torch.tensor([0.25, 0.75]))
print("$part: visible checks passed")
```
''')

HIDDEN = Template('''\
"""Hidden tests for exercise $key: $title.

PLACEHOLDER: one check for the master's placeholder part, `$part`. Replace it by the chapter's
checks (autograder/hidden/README.md says how to write them); the points of a part's checks add
up to its visible-test cell's points.
"""

from __future__ import annotations

import torch

from autograder.hidden.support import Hint, close, expect, points, tensor

WRONG_AXIS = ("`$part` divides by the sum over the wrong axis: each row, the last axis, must sum to 1 "
              "(x.sum(dim=-1, keepdim=True)).")
GENERIC = "`$part` differs from x divided by its sum over the last axis: every row must sum to 1."


@points(2, part="$part")
def $check(learner, reference, rng):
    """Does $part agree with the reference on random positive inputs of any batch shape?"""
    for shape in [(4, 6), (2, 3, 5)]:
        x = torch.rand(*shape, generator=rng, dtype=torch.float64) + 0.1
        got = tensor(learner.$part(x), "$part", shape=x.shape, dtype=x.dtype)
        if not close(got, reference.$part(x)):
            for axis in range(x.dim() - 1):
                expect(not close(got, x / x.sum(dim=axis, keepdim=True)), WRONG_AXIS)
            raise Hint(GENERIC)
''')

TABLE = Template('''\
"""Exercise $key: typical mistakes.

PLACEHOLDER rows for the scaffold's part, `$part`: replace them by the exercise's own. Each row
is the reference changed by text edits (`edits`, each old text must occur in the master's code)
or made by a function (`make`), with the score it must get, the checks it must fail and words
their hints must contain. The harness needs at least four rows made by edits.
"""

from chapters import Mistake

KEY = "$key"
CHECK = "$check"
SUM = "x.sum(dim=-1, keepdim=True)"

MISTAKES = {
    "wrong_axis": Mistake(0, {CHECK}, {CHECK: "wrong axis"}, edits=((SUM, "x.sum(dim=0, keepdim=True)"),)),
    # without keepdim the sums of shape (..., ) do not broadcast against x
    "no_keepdim": Mistake(0, {CHECK}, {CHECK: "raised RuntimeError"}, edits=((SUM, "x.sum(dim=-1)"),)),
    "not_divided": Mistake(0, {CHECK}, {CHECK: "differs from x divided"}, edits=((f"return x / {SUM}", "return x"),)),
    "multiplied": Mistake(0, {CHECK}, {CHECK: "differs from x divided"}, edits=((f"x / {SUM}", f"x * {SUM}"),)),
}
''')

PAGE = Template('''\
---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---

# $title

PLACEHOLDER: what this chapter explains, and what a reader will know by its end. Replace this
page by the chapter; its code imports the reference implementation of exercise $number from
`solutions/ch$key.py`, the functions the learner writes in the exercise at the end.

```{code-cell} ipython3
import matplotlib.pyplot as plt
import torch

from coursebook.claims import deterministic
from solutions.ch$key import $part

deterministic()  # one thread, deterministic kernels: a rebuild on this machine repeats every number
torch.manual_seed(0)
print("torch", torch.__version__)
```

## Rows that sum to one

Dividing each row of positive numbers by its sum gives weights: every row sums to 1.

```{code-cell} ipython3
x = torch.rand(4, 6) + 0.1
w = $part(x)
print(w.sum(-1))

fig, ax = plt.subplots(figsize=(5, 2.5))
ax.imshow(w, cmap="viridis")
ax.set_xlabel("position in the row")
ax.set_ylabel("row")
ax.set_title("Each row sums to 1")
plt.show()
```

## Exercise

The exercise for this chapter is the notebook `exercises/$key.ipynb`, which is not part of
this book: open it in Jupyter from the course repository. You will write `$part`. When the
visible tests pass, check your work from the repository root:

```bash
python -m autograder check exercises/$key.ipynb
```

It prints your points for each part, the total, and a hint for every check that failed.
''')


def render(key: str, title: str) -> dict[str, str]:
    """The text of each file `new` writes by hand (by what it holds)."""
    values = {"key": key, "title": title, "number": key[:2], "part": PART, "check": CHECK}
    return {"master": MASTER.substitute(values), "hidden tests": HIDDEN.substitute(values),
            "table": TABLE.substitute(values), "book page": PAGE.substitute(values)}


# --- the table of contents ----------------------------------------------------------------------

def toc_with_chapter(text: str, key: str) -> str:
    """`_toc.yml`'s text with `book/KEY` among the chapters (the part captioned "Chapters"), in key
    order, and every other line as it was; a UsageError where there is no such part."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if TOC_CHAPTERS_RE.match(ln)), None)
    if start is None:
        raise UsageError(f"{TOC} has no part captioned Chapters: add book/{key} to it by hand")
    end = next((i for i in range(start + 1, len(lines)) if TOC_CAPTION_RE.match(lines[i])), len(lines))
    entries = [(i, m) for i in range(start + 1, end) if (m := TOC_CHAPTER_RE.match(lines[i]))]
    if not entries:
        raise UsageError(f"{TOC} lists no chapter under Chapters: add book/{key} to it by hand")
    before = [i for i, m in entries if m.group(2) < key]
    at = before[-1] + 1 if before else entries[0][0]
    if lines[at - 1] and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    lines.insert(at, f"{entries[0][1].group(1)}- file: book/{key}\n")
    return "".join(lines)


def toc_chapters(text: str) -> list[str]:
    """The keys of the chapters `_toc.yml`'s text lists under Chapters, in order."""
    import yaml

    toc = yaml.safe_load(text) or {}
    return [c["file"].removeprefix("book/") for part in toc.get("parts", []) if part.get("caption") == "Chapters"
            for c in part.get("chapters", [])]


# --- checks, then writing ------------------------------------------------------------------------

def check_new(root: Path, key: str, title: str) -> None:
    """A UsageError unless `key` names a chapter that `root` does not have yet and `title` can be
    written into its files."""
    if not KEY_RE.match(key):
        raise UsageError(f"{key!r} is not a chapter key: two digits, an underscore, then lowercase letters, "
                         "digits or underscores (e.g. 08_sparse_attention)")
    if not TITLE_RE.match(title) or title != title.strip():
        raise UsageError(f"{title!r} cannot be a title: one line of at most 100 characters, without double "
                         "quotes, backslashes or spaces at either end")
    if not root.is_dir() or not (root / TOC).is_file() or not (root / "exercises" / "source").is_dir():
        raise UsageError(f"{root} is not a copy of the course (it needs {TOC} and exercises/source/)")
    for what, rel in chapter_paths(key).items():
        if (root / rel).exists():
            raise UsageError(f"chapter {key} already exists: its {what}, {rel}, is there")
    if key in toc_chapters((root / TOC).read_text(encoding="utf-8")):
        raise UsageError(f"chapter {key} already exists: {TOC} lists book/{key}")
    taken = sorted(p.stem for p in (root / "exercises" / "source").glob(f"{key[:2]}_*.md") if KEY_RE.match(p.stem))
    if taken:
        raise UsageError(f"chapter number {key[:2]} is taken by {taken[0]}: choose another number for {key}")


def write_chapter(root: Path, key: str, title: str) -> list[Path]:
    """Write the chapter's hand-written files and its `_toc.yml` entry into `root` (never over a
    file); the paths written, relative to `root`."""
    check_new(root, key, title)
    toc = toc_with_chapter((root / TOC).read_text(encoding="utf-8"), key)
    paths = chapter_paths(key)
    written = []
    for what, text in render(key, title).items():
        path = root / paths[what]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
        written.append(paths[what])
    (root / TOC).write_text(toc, encoding="utf-8")
    return written + [Path(TOC)]


def generate_in(root: Path, key: str) -> subprocess.CompletedProcess | None:
    """`python -m autograder generate KEY` run with `root`'s own package and reference modules first
    on the path; None where `root` has no autograder package to run."""
    if not (root / "autograder" / "__main__.py").is_file():
        return None
    path = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-m", "autograder", "generate", key], cwd=root, env=env,
                          capture_output=True, text=True)


def next_steps(key: str, where: str = "") -> list[str]:
    """What to do after `new`, in order (autograder/hidden/README.md, "Adding a chapter", has why)."""
    paths = chapter_paths(key)
    return [
        f"Next{where}, in this order (autograder/hidden/README.md, \"Adding a chapter\", has the rules):",
        f"  1. write the master {paths['master']}: the parts, their solutions and visible tests",
        f"  2. python -m autograder generate {key}",
        f"  3. write the hidden checks {paths['hidden tests']}",
        f"  4. write the table of typical mistakes {paths['table']}",
        f"  5. python -m pytest tests/end_to_end/test_chapters.py -k {key}",
        f"  6. python -m autograder mutants {key} --jobs 2   (95 % or more)",
        f"  7. python -m autograder seeds {key} --jobs 2",
        f"  8. write the book page {paths['book page']}, then make book",
    ]


def new_command(args) -> int:
    """`python -m autograder new KEY TITLE [--root DIR]`."""
    root = Path(args.root).resolve() if args.root else ROOT
    for rel in write_chapter(root, args.key, args.title):
        print(f"wrote {rel}")
    proc = generate_in(root, args.key)
    where = "" if root == ROOT else f" (in {root})"
    if proc is None:
        print(f"{root} has no autograder package: run `python -m autograder generate {args.key}` there")
    elif proc.returncode != 0:
        print(proc.stdout, end="")
        print(f"`python -m autograder generate {args.key}` failed{where}:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return 1
    else:
        print(proc.stdout, end="")
    print("\n".join(next_steps(args.key, where)))
    return 0
