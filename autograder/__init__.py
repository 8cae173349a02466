"""The course's grader: generates learner notebooks from masters and grades submissions.

Learner code never runs in the process that decides a score: see `autograder.isolation.runner`
(the trusted side) and `autograder.isolation.worker` (the child process that runs learner code).
`check()` checks an exercise from a cell of its notebook (`autograder.learner.in_notebook`, which
grades in a process of its own); importing this package imports neither torch nor IPython.
"""


def _skip_iri_grammars() -> None:
    """Keep jsonschema from compiling grammars the course never uses.

    nbformat imports jsonschema, which, where the package `rfc3987_syntax` is installed
    (Jupyter's own requirements install it), imports it to check the "iri" format, and that
    import compiles 38 Lark grammars: about 1.1 CPU seconds in every process that reads a
    notebook, against 0.1 s for nbformat without it. Nothing of the course checks that format
    (nbformat validates without format checks). So the course's own processes (its commands,
    grading processes, the test suite) block that optional import, which jsonschema skips when
    it fails. A learner's kernel (IPython loaded) and a process that has imported jsonschema
    already are left as they are."""
    import sys

    if not {"jsonschema", "rfc3987_syntax", "IPython", "ipykernel"} & sys.modules.keys():
        sys.modules["rfc3987_syntax"] = None


_skip_iri_grammars()

from .core.assignments import Assignment, all_assignments, get_assignment  # noqa: E402


def check(part=None, *, assignment: str | None = None, seed: int | None = None) -> None:
    """Check this notebook's exercise from a cell, ``from autograder import check; check()``, or one
    part of it, ``check("part 3")``: the same hidden checks, points and hints as the command line's
    `check` gives the saved notebook. Prints the report and returns None."""
    import sys

    frame = sys._getframe(1)
    if frame.f_globals.get("__name__") == "__learner__":
        return None  # a grading worker loading a notebook that calls check(): nothing to do
    from .learner.in_notebook import check as run

    return run(part, assignment=assignment, seed=seed, _frame=frame)


__all__ = ["Assignment", "all_assignments", "get_assignment", "check"]
