"""The adversarial suite: attacks on the grader, one module per class, graded in ONE batch.

Each module here defines `build(ctx)`, which adds notebooks to `ctx.nbs` (written as
`SUBS/NAME.ipynb`), may create other entries under `ctx.subs` (folders, links), adds
files whose bytes must not change to `ctx.protected`, and registers clean-ups. The
session fixture `batch` in conftest.py builds every module, runs one sandboxed
`grade --json` over `ctx.subs`, and hands the outcome to the test modules
`tests/test_adversarial*.py`, which assert what each attack must cost.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

KEY = "03_qkv"
TIMEOUT = "60"  # seconds per submission: each endless loop costs this much; the memory hog
# alone takes 6-11 s to fill its cap on an idle 2-core machine, and an honest notebook of the
# batch took up to 36 s to load while the suite's other worker graded beside it


@dataclass
class Context:
    base: Path
    subs: Path
    out: Path
    nbs: dict = field(default_factory=dict)        # name -> notebook (NotebookNode or dict)
    protected: list = field(default_factory=list)  # files whose bytes must not change
    extra: dict = field(default_factory=dict)      # what a module keeps for its tests
    cleanups: list = field(default_factory=list)   # called after the grading run

    @property
    def gradebook(self) -> Path:
        return self.out / "gradebook.db"


def modules() -> list:
    """Every attack module, in name order."""
    return [importlib.import_module(f"{__name__}.{m.name}") for m in sorted(pkgutil.iter_modules(__path__),
                                                                          key=lambda m: m.name)]
