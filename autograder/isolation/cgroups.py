"""Memory cgroups: one per sandboxed worker, so that all its processes share one memory limit.

`MemoryCgroups.find` chooses where the grader may create them (a delegated cgroup v2 folder,
or a cgroup v1 memory folder), `create` makes one per worker with the memory limit set (swap
off), `release` kills what is left in it and removes it, and `sweep` removes those a killed
grader left behind. The sandbox (`autograder.isolation.sandbox`) moves each worker's first process into
its cgroup before bubblewrap starts; the warm start (`autograder.isolation.warm`) moves each forked
worker into a fresh one. How much memory a worker used is read from its cgroup by
`autograder.isolation.memory_meters`.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import re
import secrets
import signal
import threading
import time

CGROUP_ENV = "AUTOGRADER_CGROUP_PARENT"  # a folder to create worker cgroups in, or "none"
CGROUP_PREFIX = "autograder-w"           # worker cgroups: autograder-w<pid>-<random>
CGROUP_STALE_SECONDS = 30.0              # an unlocked worker cgroup older than this is a dead grader's


def _unescape(path: str) -> str:
    """A mountinfo path field (spaces and such are octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _read(path, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def _write(path, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def cgroup_dirs(proc: str = "/proc") -> dict:
    """This process's cgroup folders: {"v2": path} and/or {"v1": path of the memory hierarchy}."""
    mine = {}
    for line in _read(f"{proc}/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            hid, ctrls, path = parts
            if hid == "0" and ctrls == "":
                mine["v2"] = path
            elif "memory" in ctrls.split(","):
                mine["v1"] = path
    out = {}
    for line in _read(f"{proc}/self/mountinfo").splitlines():
        try:
            left, right = line.split(" - ", 1)
            fields, (fstype, _, superopts) = left.split(), right.split()[:3]
            root, mnt = _unescape(fields[3]), _unescape(fields[4])
        except ValueError:
            continue
        key = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "memory" in superopts.split(",") \
            else None
        if key is None or key in out or key not in mine:
            continue
        path = mine[key]
        if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
            continue  # our cgroup is not visible under this mount
        rel = path[len(root):] if root != "/" else path
        out[key] = os.path.join(mnt, rel.lstrip("/")).rstrip("/") or mnt
    return out


class MemoryCgroups:
    """Where the grader creates one memory cgroup per worker, and how.

    `find` looks, in order, at: the folder named by $AUTOGRADER_CGROUP_PARENT ("none" turns
    cgroups off); our own cgroup v2 folder when it delegates the memory controller to its
    children; our own cgroup v2 folder when we are its only process (we move into a leaf,
    ``autograder-grader``, and enable the memory controller for its children, as systemd's
    Delegate=yes expects); our own cgroup v1 memory folder. Each candidate must be writable
    and pass a trial (create a child, set its limit, remove it).

    `create` makes ``PARENT/autograder-w<pid>-<random>``, holds an flock on it while it
    lives (so another grader never takes it for stale), and sets the limit: v2 memory.max,
    memory.swap.max = 0; v1 memory.limit_in_bytes and memory.memsw.limit_in_bytes (or
    memory.swappiness = 0 where swap is not accounted). Beyond the limit the kernel kills
    the worker's largest process, as on both versions by default (memory.oom.group stays
    off, so that a learner's helper process, not the whole worker, pays for its own hog).
    `release` kills whatever is left in it and removes it. A worker cgroup left by a grader
    that was killed (unlocked and older than CGROUP_STALE_SECONDS) is removed by the next
    grader that starts there.
    """

    def __init__(self, parent: str, version: int, how: str):
        self.parent, self.version, self.how = parent, version, how
        self._lock = threading.Lock()
        self._live: dict[str, int] = {}   # path -> locked directory fd
        self._pending: set[str] = set()   # released, but could not be removed yet
        atexit.register(self.close)

    # finding a parent ---------------------------------------------------------------------
    @classmethod
    def find(cls, limit: int, *, proc: str = "/proc", env=None) -> tuple["MemoryCgroups | None", str]:
        """A usable parent folder, or (None, why not)."""
        env = os.environ if env is None else env
        explicit = env.get(CGROUP_ENV, "").strip()
        if explicit.lower() in ("none", "off", "0"):
            return None, f"cgroups turned off (${CGROUP_ENV}={explicit})"
        tried: list[str] = []
        candidates: list[tuple[str, int, str]] = []
        if explicit:
            version = 2 if os.path.exists(os.path.join(explicit, "cgroup.subtree_control")) else 1
            candidates.append((explicit, version, f"${CGROUP_ENV}"))
        else:
            dirs = cgroup_dirs(proc)
            if "v2" in dirs:
                candidates.append((dirs["v2"], 2, "own cgroup v2"))
            if "v1" in dirs:
                candidates.append((dirs["v1"], 1, "own cgroup v1 memory"))
            if not dirs:
                tried.append("no cgroup memory controller is mounted")
        for path, version, how in candidates:
            why = cls._prepare(path, version, explicit=bool(explicit))
            if why:
                tried.append(f"{path}: {why}")
                continue
            cg = cls(path, version, how)
            try:
                cg.release(cg.create(limit))  # the trial
            except OSError as exc:
                atexit.unregister(cg.close)
                tried.append(f"{path}: {exc.strerror or exc}")
                continue
            cg.sweep()
            return cg, ""
        return None, "; ".join(tried) or "no cgroup found"

    @staticmethod
    def _prepare(path: str, version: int, explicit: bool) -> str:
        """'' when worker cgroups can be made under `path`, else why not."""
        if not os.path.isdir(path):
            return "no such folder"
        if not os.access(path, os.W_OK):
            return "not writable"
        if version == 1:
            return "" if os.path.exists(os.path.join(path, "memory.limit_in_bytes")) else "no memory controller"
        if "memory" not in _read(os.path.join(path, "cgroup.controllers")).split():
            return "the memory controller is not delegated here"
        sub = os.path.join(path, "cgroup.subtree_control")
        if "memory" in _read(sub).split():
            return ""
        procs = _read(os.path.join(path, "cgroup.procs")).split()
        try:
            if procs and not explicit:
                if procs != [str(os.getpid())]:
                    return "other processes share it (give a delegated folder in $%s)" % CGROUP_ENV
                leaf = os.path.join(path, "autograder-grader")
                os.makedirs(leaf, exist_ok=True)
                _write(os.path.join(leaf, "cgroup.procs"), os.getpid())
            _write(sub, "+memory")
        except OSError as exc:
            return f"cannot enable the memory controller for children ({exc.strerror or exc})"
        return ""

    # one cgroup per worker ----------------------------------------------------------------
    def create(self, limit: int) -> str:
        """A new, empty, locked cgroup with the memory limit set; its folder."""
        self.retry_pending()
        # No counter in the name: a warm worker sees its cgroup's name (/proc/self/cgroup, relative
        # to the template's), and a count would tell it how many workers were started before it.
        name = f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        path = os.path.join(self.parent, name)
        os.mkdir(path, 0o755)
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self.version == 2:
                _write(os.path.join(path, "memory.max"), limit)
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), 0)
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), limit)
                memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    _write(memsw, limit)
                elif os.path.exists(os.path.join(path, "memory.swappiness")):
                    _write(os.path.join(path, "memory.swappiness"), 0)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            self._remove(path)
            raise
        with self._lock:
            self._live[path] = fd
        return path

    def release(self, path: str) -> bool:
        """Kill what is left in the worker's cgroup and remove it; False if it is still busy
        (then it is retried at the next `create` and at exit)."""
        with self._lock:
            fd = self._live.pop(path, None)
        done = self._remove(path)
        if fd is not None:
            os.close(fd)
        if not done:
            with self._lock:
                self._pending.add(path)
        return done

    def retry_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        for path in pending:
            if not self._remove(path, wait=0.0):
                with self._lock:
                    self._pending.add(path)

    def _remove(self, path: str, wait: float = 2.0) -> bool:
        end = time.monotonic() + wait
        delay = 0.0005
        while True:
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    return False
            self.kill_all(path)
            if time.monotonic() >= end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @staticmethod
    def kill_all(path: str) -> None:
        """SIGKILL every process in the cgroup at `path` (in one step through cgroup.kill where the
        kernel has it); it does not wait for them to end."""
        kill = os.path.join(path, "cgroup.kill")  # cgroup v2, Linux 5.14+
        if os.path.exists(kill):
            try:
                _write(kill, 1)
                return
            except OSError:
                pass
        for pid in _read(os.path.join(path, "cgroup.procs")).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def live(self) -> list[str]:
        """The folders of this grader's worker cgroups that exist now."""
        with self._lock:
            return list(self._live)

    def sweep(self, older_than: float = CGROUP_STALE_SECONDS) -> list[str]:
        """Remove worker cgroups that a grader killed before it could: unlocked, and older than
        `older_than` seconds (a live grader holds a lock on each of its own, from just after
        it creates it); kill what is left in them. The folders removed."""
        removed = []
        try:
            names = [n for n in os.listdir(self.parent) if n.startswith(CGROUP_PREFIX)]
        except OSError:
            return removed
        for name in names:
            path = os.path.join(self.parent, name)
            if path in self._live:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if time.time() - os.fstat(fd).st_ctime < older_than:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # locked: its grader is alive
            finally:
                os.close(fd)
            if self._remove(path):
                removed.append(path)
        return removed

    def close(self) -> None:
        """Remove every worker cgroup of ours that is left (at exit)."""
        with self._lock:
            live = list(self._live)
        for path in live:
            self.release(path)
        self.retry_pending()

    def describe(self, limit: int) -> str:
        return (f"{limit / 2**30:g} GiB of memory per worker, tmpfs included (cgroup v{self.version} "
                f"under {self.parent})")
