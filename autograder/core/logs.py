"""The grader's log: records that no learner text can forge, and the log file of a grading run.

Everything goes to the "autograder" logger. A record may quote what a learner controls (a
file name, an error message): `SafeFormatter` makes every control character visible and
indents continuation lines, so no text inside a record can pass for a record of its own.
`RunLog` sends the records of one grading run to OUT/logs/grade-KEY-TIME-PID.log while the
run lasts, and detaches again, so a process that grades several runs (the mutation tool)
writes each run's records to that run's file.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .text import visible

log = logging.getLogger("autograder")


class SafeFormatter(logging.Formatter):
    """Log records without control characters; continuation lines (tracebacks) are indented, so no
    text inside a record can pass for a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), keep="\n").replace("\n", "\n    ")


class RunLog:
    """The log file of one grading run in OUT/logs, receiving the grader's records (INFO and up)
    from `open()` until `close()`."""

    def __init__(self, out: Path, key: str):
        self.path = Path(out) / "logs" / f"grade-{key}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        self.handler: logging.Handler | None = None
        self.level = log.level

    def open(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.path, encoding="utf-8")
        self.handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s"))
        self.level = log.level
        log.addHandler(self.handler)
        log.setLevel(logging.INFO)
        return self.path

    def close(self) -> None:
        if self.handler is not None:
            log.removeHandler(self.handler)
            self.handler.close()
            self.handler = None
            log.setLevel(self.level)


__all__ = ["SafeFormatter", "RunLog", "log"]
