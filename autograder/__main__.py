"""``python -m autograder``: the same command line as the `attention-course` script (`autograder.cli`)."""

from .cli import entry_point

entry_point("python -m autograder")
