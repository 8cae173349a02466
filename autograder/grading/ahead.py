"""Trusted work of the checks to come, done in a thread of the grader while it waits for the worker.

A check marked ``@prepared(setup)`` (see `autograder.hidden.support.prepared`) begins with work
that needs neither the learner nor anything the checks before it did: a search for inputs on
which every typical mistake shows, with the reference alone. `Ahead` runs that work for the
checks of one submission in a thread, in the checks' order, from the moment grading starts. The
grader's process spends most of a check waiting for the worker (in `select`, without the
interpreter's lock), and the worker starting up; the thread uses that time, so the search is
done, or nearly, when its check comes.

The result is the same as if the check did the work itself, at its start:

* ``setup(reference)`` runs here, in the grader's thread, before any check (it may build
  modules, which draws from the global generator: every check reseeds it);
* its ``work(rng)`` runs in the thread with the check's own `torch.Generator`, the one the check
  then gets as its ``rng``: the check's draws follow the work's, as they would in one thread.
  The work uses that generator and what ``setup`` made, nothing global;
* a check whose work the thread has not begun does the work itself; one whose work is under
  way waits for it. An exception in the work is raised in the check (a fault of ours).

A check replayed on the reference, or run outside `Grader.grade` (`Grader.call_check` without
an `Ahead`), does ``setup`` and ``work`` itself: the same values.
"""

from __future__ import annotations

import sys
import threading

import torch

# While the thread works, the interpreter hands its lock to the thread that waits for it after
# this long (Python's default: 5 ms). A reply from the worker wakes the grader's thread, which
# must not wait 5 ms behind the work at each of a check's several hundred calls.
SWITCH_SECONDS = 0.0002


class Ready:
    """One check's work: its generator, and its value once done. Made here, `setup` runs at once (an
    exception in it is raised by `value`, as the work's is); the work is done by whoever asks first:
    the thread (`Ahead`), or `value` (a check run on its own, a replay)."""

    def __init__(self, check, reference, seed: int):
        self.rng = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._started = False
        self._value = None
        self._error: BaseException | None = None
        try:
            self._work = check.prepare(reference)
        except BaseException as exc:  # noqa: BLE001 - raised in the check (`value`)
            self._work, self._error, self._started = None, exc, True
            self._done.set()

    def _run(self) -> None:
        try:
            self._value = self._work(self.rng)
        except BaseException as exc:  # noqa: BLE001 - raised in the check (`value`)
            self._error = exc
        finally:
            self._work = None
            self._done.set()

    def claim(self) -> bool:
        """Whether the caller is the one to do the work (nobody began it)."""
        with self._lock:
            if self._started:
                return False
            self._started = True
            return True

    def value(self):
        """The work's value: done here if the thread has not begun it, else waited for."""
        if self.claim():
            self._run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Ahead:
    """The work of `checks` (with their seeds), done in a thread in their order: ``with Ahead(...) as
    ahead:`` starts it; ``ahead.get(name)`` gives a check's `Ready` (None for a check without work);
    leaving the block stops the thread after the work it is doing, and waits for that: a process that
    ends while the thread is inside PyTorch aborts. (Every check asks for its value, so the thread has
    nothing left to do when grading ends but where it was interrupted.)"""

    def __init__(self, reference, checks):
        self._items = {check.name: Ready(check, reference, seed) for check, seed in checks}
        self._stop = threading.Event()
        self._thread = None
        self._interval = None

    def __enter__(self):
        if self._items:
            self._interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._interval, SWITCH_SECONDS))
            self._thread = threading.Thread(target=self._run, name="grader-ahead", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._interval is not None:
            sys.setswitchinterval(self._interval)

    def _run(self) -> None:
        for ready in self._items.values():
            if self._stop.is_set():
                return
            if ready.claim():
                ready._run()

    def get(self, name: str) -> Ready | None:
        return self._items.get(name)


__all__ = ["Ahead", "Ready", "SWITCH_SECONDS"]
