"""Usage errors: what a command was given that it cannot act on.

An unknown exercise key, a file that is not there, a flag that goes with another one, a
sandbox this machine cannot make: each is said in one sentence on stderr and ends the
command with exit code 2. A command raises `UsageError` wherever it finds the problem, and
`cli.run` alone turns it into that line and that code (argparse's own errors, a flag it
does not know or a value it cannot parse, exit 2 as well).
"""

from __future__ import annotations

EXIT_USAGE = 2


class UsageError(Exception):
    """A command's input cannot be acted on; the message is the one sentence shown."""


def known_assignment(key: str):
    """The `Assignment` of `key`, or a UsageError naming the known keys."""
    from .assignments import get_assignment

    try:
        return get_assignment(key)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def course_grader(key: str, **kw):
    """A `Grader` for `key` (keywords as `Grader`'s), or a UsageError when the key is unknown or the
    course's files for it are inconsistent."""
    from .grader import Grader, GraderConfigError

    assignment = known_assignment(key)
    try:
        return Grader(assignment, **kw)
    except GraderConfigError as exc:
        raise UsageError(f"the course's files for {key} are inconsistent: {exc}") from None


__all__ = ["EXIT_USAGE", "UsageError", "known_assignment", "course_grader"]
