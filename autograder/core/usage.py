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


def require_checkout(command: str) -> None:
    """A UsageError unless the course runs from a clone of its repository (see `autograder.core.assignments`):
    `command` reads or writes files that an installed course does not have."""
    from .assignments import PACKAGE, in_checkout

    if not in_checkout():
        raise UsageError(f"`{command}` works in a clone of the course's repository, and this course is installed "
                         f"as a package ({PACKAGE}): clone the repository and run it there")


def require_modules(command: str, extra: str, modules: tuple[str, ...]) -> None:
    """A UsageError when one of `modules` is not installed in this Python: `command` needs the course's
    `extra` (pyproject.toml), which a learner's install leaves out."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"`{command}` needs {', '.join(missing)}, which this Python lacks: install the course with "
                         f"its {extra} extra (attention-course[{extra}]), or run `make install` in a clone")


__all__ = ["EXIT_USAGE", "UsageError", "known_assignment", "require_checkout", "require_modules"]
