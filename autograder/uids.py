"""The uids sandboxed workers run as (root mode): the pool, and each grading process's share of it.

A worker run by a root grader drops to a uid of its own, so that the process limit and any
uid-keyed kernel state are per worker. The uids come from SANDBOX_UIDS (AUTOGRADER_SANDBOX_UID,
the base, and AUTOGRADER_SANDBOX_UID_COUNT of them; no account is needed), never one in
RESERVED_UIDS or named in /etc/passwd or /etc/group (`account_ids`). A `UidPool` hands them
out to one grader's workers in turn.

Several grading processes may run on one machine (a batch's jobs, other instructors' batches):
each takes a *uid slot* (`uid_slot`), an flock on a file in the grader's runtime folder held
while the process lives, and draws its workers' uids from that slot's own share of the range,
so no two processes hand out the same uid at the same time.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import threading

from .runtime import runtime_dir
from .unavailable import SandboxUnavailable

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

    Two workers alive at the same time in one grader never share a uid (unless more than
    the pool's size run at once); a uid comes back only after the whole pool has been used.
    """

    def __init__(self, uids: range = SANDBOX_UIDS):
        taken = account_ids() | RESERVED_UIDS
        self.uids = [u for u in uids if u not in taken and 0 < u < 2**32 - 2]
        if not self.uids:
            raise SandboxUnavailable(f"no free uid in {uids.start}..{uids.stop - 1} for the sandbox "
                                     "(AUTOGRADER_SANDBOX_UID, AUTOGRADER_SANDBOX_UID_COUNT)")
        self._next = secrets.randbelow(len(self.uids))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            uid = self.uids[self._next % len(self.uids)]
            self._next += 1
            return uid

    def __contains__(self, uid) -> bool:
        return uid in self.uids

    def __str__(self) -> str:
        return f"{self.uids[0]}..{self.uids[-1]}" if len(self.uids) > 1 else str(self.uids[0])


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
