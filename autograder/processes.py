"""Process groups and their output: how the trusted side ends a worker and keeps what it printed.

Every process the trusted side starts for learner code (a worker, a warm template) leads a
session of its own, so one signal to its process group reaches everything it started
(`kill_group`). Its stdout and stderr go to one pipe that a thread drains (`OutputDrain`),
keeping at most a fixed number of bytes: a process that prints without end never blocks on a
full pipe and never fills the grader's memory.

A process the trusted side starts to grade beside it (a process of `seeds --jobs N`) ends with
the process that started it: `die_with_parent` asks the kernel (Linux) to send it SIGTERM when
its parent dies, however the parent died, and a watchdog thread ends it (and what it started)
a few seconds later if that signal did not; `on_sigterm` lets the parent end such processes first
when it is itself asked to end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


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


def die_with_parent(parent: int, sig: int = signal.SIGTERM, *, grace: float = 5.0, cleanup=None) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux's prctl; nothing where
    there is none), and end at once if the parent, `parent` (its pid), died before that took effect.

    The signal asks for an orderly end, which runs in the main thread and can be lost: it may arrive
    while the main thread is in code that cannot be interrupted for long, or be handled and the
    process carry on. So a watchdog thread also looks at the parent every quarter second; once it
    is gone, the process has `grace` seconds to end by itself; then the watchdog calls `cleanup()`
    (best effort), kills every process this one started (each as a whole process group where it
    leads one) and ends the process: an orphan never outlives its parent by more than grace + 1 s."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(sig),
                                                    ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        except (OSError, AttributeError):
            pass  # no prctl to call: as without it
    if os.getppid() != parent:  # orphaned already: the signal would never come
        os._exit(128 + sig)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.25)
        time.sleep(grace)
        try:
            if cleanup is not None:
                cleanup()
        except BaseException:  # noqa: BLE001 - ending matters more than tidying
            pass
        kill_children()
        os._exit(128 + sig)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def kill_children() -> None:
    """SIGKILL every process whose parent is this one (Linux: read from /proc), its whole process
    group where it leads one (a grading worker leads a session of its own)."""
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != me:
            continue
        pid = int(name)
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@contextlib.contextmanager
def on_sigterm(action):
    """While inside, a SIGTERM to this process first calls `action()` (which ends what this process
    started), then takes its usual course: the handler that was there before is called, or the
    process dies of the signal. Only in the main thread, and only where SIGTERM is not ignored;
    elsewhere nothing changes."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, previous)  # a second SIGTERM takes its usual course at once
        try:
            action()
        finally:
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
