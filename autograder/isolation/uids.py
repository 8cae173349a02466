"""The uids sandboxed workers run as (root mode): the pool, and each grading process's share of it.

A worker run by a root grader drops to a uid of its own, so that the process limit and any
uid-keyed kernel state are per worker. The uids come from SANDBOX_UIDS (AUTOGRADER_SANDBOX_UID,
the base, and AUTOGRADER_SANDBOX_UID_COUNT of them; no account is needed), never one in
RESERVED_UIDS or named in /etc/passwd or /etc/group (`account_ids`). A `UidPool` hands them
out to one grader's workers in turn, one uid to one worker at a time; when a worker ends,
everything of its uid is killed (`UidPool.end`), so nothing a learner started outlives it.

Several grading processes may run on one machine (a batch's jobs, other instructors' batches):
each takes a *uid slot* (`uid_slot`), an flock on a file in the grader's runtime folder held
while the process lives, and draws its workers' uids from that slot's own share of the range,
so no two processes hand out the same uid at the same time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading

from .processes import kill_uid
from .runtime import runtime_dir
from .unavailable import SandboxUnavailable

log = logging.getLogger("autograder")

SANDBOX_UID = int(os.environ.get("AUTOGRADER_SANDBOX_UID", "64123"))  # the base uid; no account needed
SANDBOX_UID_COUNT = int(os.environ.get("AUTOGRADER_SANDBOX_UID_COUNT", "1024"))
SANDBOX_UIDS = range(SANDBOX_UID, SANDBOX_UID + SANDBOX_UID_COUNT)
"""Every uid a sandboxed worker may run as (root mode): test a process's uid with `in`."""
# uids the kernel or NFS use for "nobody" / "invalid": never given to a worker
RESERVED_UIDS = frozenset({0, 65534, 65535, 2**32 - 2, 2**32 - 1})
UID_SLOTS = 64  # grading processes per machine that can hold a share of the sandbox uids at once
UID_SLOT_DIR = "uid-slots"  # in the runtime folder (`runtime_dir`)


# --- the pool ---------------------------------------------------------------------------------

def account_ids() -> set[int]:
    """uids and gids named in /etc/passwd and /etc/group: a worker never runs as one of them."""
    ids: set[int] = set()
    for name in ("/etc/passwd", "/etc/group"):
        try:
            with open(name, encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(":")
                    if len(parts) > 2 and parts[2].strip().isdigit():
                        ids.add(int(parts[2]))
        except OSError:
            pass
    return ids


class UidPool:
    """Hands out one uid per worker from `uids`, round robin from a random start.

    A uid is held from `take` until `give_back` (the worker, or the warm template and every
    worker forked from it, has ended and nothing of its uid is left). Two workers alive at the
    same time in one grader never share a uid: `take` skips the uids held, unless every uid of
    the pool is (then it hands one out again, round robin, and `alone` says so); a uid comes back
    only after the whole pool has been used.
    """

    def __init__(self, uids: range = SANDBOX_UIDS):
        taken = account_ids() | RESERVED_UIDS
        self.uids = [u for u in uids if u not in taken and 0 < u < 2**32 - 2]
        if not self.uids:
            raise SandboxUnavailable(f"no free uid in {uids.start}..{uids.stop - 1} for the sandbox "
                                     "(AUTOGRADER_SANDBOX_UID, AUTOGRADER_SANDBOX_UID_COUNT)")
        self._next = secrets.randbelow(len(self.uids))
        self._held: dict[int, int] = {}  # uid -> how many holders
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            n = len(self.uids)
            for i in range(n):
                uid = self.uids[(self._next + i) % n]
                if uid not in self._held:
                    break
            else:
                i, uid = 0, self.uids[self._next % n]  # all held: shared, as round robin gives it
            self._next += i + 1
            self._held[uid] = self._held.get(uid, 0) + 1
            return uid

    def give_back(self, uid: int) -> None:
        with self._lock:
            left = self._held.get(uid, 0) - 1
            if left > 0:
                self._held[uid] = left
            else:
                self._held.pop(uid, None)

    def alone(self, uid: int) -> bool:
        """Whether `uid` is held by one holder only (whose end may kill everything of that uid)."""
        with self._lock:
            return self._held.get(uid, 0) <= 1

    def end(self, uid: int) -> list[int]:
        """The holder of `uid` has ended (its worker, or its warm template, is dead): SIGKILL every
        process of that uid, unless another holder shares it, and give it back. Returns the pids
        still alive after that (`processes.kill_uid`): none, unless a process cannot die (stuck in
        the kernel); then the uid is never handed out again by this pool."""
        left = kill_uid(uid) if self.alone(uid) else []
        if left:
            log.warning("processes %s of sandbox uid %d did not die; that uid is no longer used", left[:10], uid)
        else:
            self.give_back(uid)
        return left

    def __contains__(self, uid) -> bool:
        return uid in self.uids

    def __str__(self) -> str:
        return f"{self.uids[0]}..{self.uids[-1]}" if len(self.uids) > 1 else str(self.uids[0])


_pools: dict[range, UidPool] = {}
_pools_lock = threading.Lock()


def ender(pool: "UidPool", uid: int | None, cleanup=None):
    """The function that ends a worker's uid once its first process has ended, however often it is
    called: every process left of `uid` is killed and the uid given back (`UidPool.end`), then
    `cleanup()` runs (a cgroup removed, a home folder deleted), even where the kill failed."""
    done = []

    def end() -> None:
        if done:
            return
        done.append(True)
        try:
            if uid is not None:
                pool.end(uid)
        finally:
            if cleanup is not None:
                cleanup()

    return end


def shared_pool(uids: range) -> UidPool:
    """This process's one pool of `uids`: every sandbox over the same range draws from it, so that
    no two workers of the process hold one uid at a time (whose end would kill the other)."""
    with _pools_lock:
        if uids not in _pools:
            _pools[uids] = UidPool(uids)
        return _pools[uids]


# --- uid slots: disjoint sandbox uids for every grading process of a machine ----------------

_held: dict[str, tuple[int, int]] = {}  # slot folder -> (slot, fd): held until the process ends
_held_lock = threading.Lock()


def uid_slot(count: int, slots: int = UID_SLOTS, folder: str | None = None) -> tuple[int, int]:
    """(first uid offset, uids in the share) of this process's slot, taken once per process.

    Slot k owns offsets [k * share, (k + 1) * share) of the sandbox uid range, share =
    count // slots. The lock is an flock on FOLDER/slot-k, so it ends with the process,
    however it ends (SIGKILL included), and the slot is free for the next one."""
    slots = max(min(slots, count), 1)
    share = count // slots
    with _held_lock:
        folder = folder or os.path.join(runtime_dir(), UID_SLOT_DIR)
        if folder in _held:
            return _held[folder][0] * share, share
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        # Someone else's folder could hold every slot locked, or swap a lock file under us.
        if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise SandboxUnavailable(f"{folder} must be a folder of uid {os.geteuid()} with mode 0700 "
                                     "(it holds the grading processes' uid slots)")
        for k in range(slots):
            fd = os.open(os.path.join(folder, f"slot-{k}"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            _held[folder] = (k, fd)
            return k * share, share
        raise SandboxUnavailable(f"all {slots} uid slots in {folder} are taken: more grading processes run on "
                                 "this machine than it has sandbox uids for (raise AUTOGRADER_SANDBOX_UID_COUNT)")
