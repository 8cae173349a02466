"""Process groups and their output: how the trusted side ends a worker and keeps what it printed.

Every process the trusted side starts for learner code (a worker, a warm template) leads a
session of its own, so one signal to its process group reaches everything it started
(`kill_group`). Its stdout and stderr go to one pipe that a thread drains (`OutputDrain`),
keeping at most a fixed number of bytes: a process that prints without end never blocks on a
full pipe and never fills the grader's memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading


class OutputDrain:
    """Drains a pipe in a thread, keeping at most `cap` bytes."""

    def __init__(self, fd: int, cap: int):
        self.data = bytearray()
        self.dropped = 0
        self.cap = cap
        self.thread = threading.Thread(target=self._run, args=(fd,), daemon=True)
        self.thread.start()

    def _run(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    return
                room = max(self.cap - len(self.data), 0)
                self.data += chunk[:room]
                self.dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        s = self.data.decode("utf-8", "replace")
        return s + (f"\n[... {self.dropped} more bytes of output dropped]" if self.dropped else "")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL everything in the process group `proc` leads (it was started in a session of its
    own) and reap it, waiting at most 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
