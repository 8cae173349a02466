"""Where each exercise's files live. One chapter key names all of them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY_RE = re.compile(r"^\d\d_[a-z0-9_]+$")


@dataclass(frozen=True)
class Assignment:
    """The files of one exercise, all named by its chapter key (e.g. ``03_qkv``)."""

    key: str

    @property
    def master(self) -> Path:
        """The single source: prose, stubs' solutions and visible tests (MyST markdown)."""
        return ROOT / "exercises" / "source" / f"{self.key}.md"

    @property
    def notebook(self) -> Path:
        """The learner notebook, generated from the master."""
        return ROOT / "exercises" / f"{self.key}.ipynb"

    @property
    def solutions(self) -> Path:
        """The reference module, generated from the master's solution cells."""
        return ROOT / "solutions" / f"ch{self.key}.py"

    @property
    def hidden_tests(self) -> Path:
        """The hidden checks (plain `test_*` functions with @points), run in the trusted process."""
        return ROOT / "autograder" / "hidden" / f"test_{self.key}.py"

    @property
    def solutions_module(self) -> str:
        return f"solutions.ch{self.key}"


def all_assignments() -> list[Assignment]:
    """Every exercise that has a master, in chapter order."""
    masters = sorted((ROOT / "exercises" / "source").glob("*.md"))
    return [Assignment(p.stem) for p in masters if KEY_RE.match(p.stem)]


def get_assignment(key: str) -> Assignment:
    for a in all_assignments():
        if a.key == key:
            return a
    known = ", ".join(a.key for a in all_assignments()) or "none"
    raise KeyError(f"unknown assignment {key!r} (known: {known})")
