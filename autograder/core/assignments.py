"""Where each exercise's files live. One chapter key names all of them.

The course runs from a clone of its repository or from an installed wheel, and finds its
files by one rule: the exercises (the masters in ``source/`` and the learner notebooks) are
the wheel's copy inside this package, ``autograder/exercises/``, where there is one, and
otherwise the clone's ``exercises/``, beside the ``autograder/`` folder. A clone never has
the former: its editable install (``pip install -e .``) leaves every file where it is.
The hidden tests (``autograder/hidden/``) and the reference modules (``solutions/``, beside
``autograder/``) are packages, in the same place relative to this file in both.

What only authors do (``generate``, ``new``, ``mutants``, ``seeds``) writes or reads files
that a wheel does not carry, and needs a clone: `usage.require_checkout` says so in one sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # autograder/, this file being autograder/core/assignments.py
ROOT = PACKAGE.parent  # the clone, or the site-packages folder of an installed wheel
PACKAGED_EXERCISES = PACKAGE / "exercises"
EXERCISES = PACKAGED_EXERCISES if PACKAGED_EXERCISES.is_dir() else ROOT / "exercises"
SOURCE = EXERCISES / "source"
KEY_RE = re.compile(r"^\d\d_[a-z0-9_]+$")


def in_checkout() -> bool:
    """Whether the course runs from a clone of its repository (not from an installed wheel)."""
    return EXERCISES == ROOT / "exercises"


@dataclass(frozen=True)
class Assignment:
    """The files of one exercise, all named by its chapter key (e.g. ``03_qkv``)."""

    key: str

    @property
    def master(self) -> Path:
        """The single source: prose, stubs' solutions and visible tests (MyST markdown)."""
        return SOURCE / f"{self.key}.md"

    @property
    def notebook(self) -> Path:
        """The learner notebook, generated from the master."""
        return EXERCISES / f"{self.key}.ipynb"

    @property
    def solutions(self) -> Path:
        """The reference module, generated from the master's solution cells."""
        return ROOT / "solutions" / f"ch{self.key}.py"

    @property
    def hidden_tests(self) -> Path:
        """The hidden checks (plain `test_*` functions with @points), run in the trusted process."""
        return PACKAGE / "hidden" / f"test_{self.key}.py"

    @property
    def solutions_module(self) -> str:
        return f"solutions.ch{self.key}"


def all_assignments() -> list[Assignment]:
    """Every exercise that has a master, in chapter order."""
    masters = sorted(SOURCE.glob("*.md"))
    return [Assignment(p.stem) for p in masters if KEY_RE.match(p.stem)]


def get_assignment(key: str) -> Assignment:
    for a in all_assignments():
        if a.key == key:
            return a
    known = ", ".join(a.key for a in all_assignments()) or "none"
    # `key` may come from a learner's notebook (its course metadata): shown escaped and cut
    shown = repr(key)
    shown = shown if len(shown) <= 80 else shown[:80] + f"… ({len(shown) - 80:,} more characters)"
    raise KeyError(f"unknown assignment {shown} (known: {known})")
