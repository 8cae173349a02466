"""The course's grader: generates learner notebooks from masters and grades submissions.

Learner code never runs in the process that decides a score: see `autograder.runner`
(the trusted side) and `autograder.worker` (the child process that runs learner code).
`check()` checks an exercise from a cell of its notebook (`autograder.in_notebook`, which
grades in a process of its own); importing this package imports neither torch nor IPython.
"""

from .assignments import Assignment, all_assignments, get_assignment


def check(part=None, *, assignment: str | None = None, seed: int | None = None) -> None:
    """Check this notebook's exercise from a cell, ``from autograder import check; check()``, or one
    part of it, ``check("part 3")``: the same hidden checks, points and hints as the command line's
    `check` gives the saved notebook. Prints the report and returns None."""
    import sys

    frame = sys._getframe(1)
    if frame.f_globals.get("__name__") == "__learner__":
        return None  # a grading worker loading a notebook that calls check(): nothing to do
    from .in_notebook import check as run

    return run(part, assignment=assignment, seed=seed, _frame=frame)


__all__ = ["Assignment", "all_assignments", "get_assignment", "check"]
