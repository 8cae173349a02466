"""One table per chapter for the harness in tests/end_to_end/test_chapters.py.

Each module `chKEY.py` defines `KEY` and `MISTAKES`: the submissions graded besides the
reference (full marks) and the untouched notebook (zero), each with the score it must get,
the checks it must fail (or None: not asserted), and words that those checks' hints must
contain. A submission is made by editing the reference's text (`edits`) or by a function
(`make`) that returns a notebook.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Mistake:
    score: float
    failed: frozenset | set | None = None
    hints: dict = field(default_factory=dict)  # check -> words its hint must contain
    edits: tuple = ()                          # (old, new) text edits of the reference
    make: Callable | None = None               # or a maker of the whole notebook
    one_hint: bool = False                     # every failed check gives the same hint


def tables() -> dict:
    """KEY -> the chapter's table module, for every module in this package."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out[mod.KEY] = mod
    return dict(sorted(out.items()))
