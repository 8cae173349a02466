"""Run the grading worker under bubblewrap, as an unprivileged uid, with resource limits.

The trusted grader never runs learner code itself (see `autograder.runner`); this module
decides *where* the worker runs. `Sandbox.wrap` turns the worker's command line into::

    sh -c 'echo $$ > CGROUP/cgroup.procs && echo 1000 > /proc/self/oom_score_adj && exec "$@"'
    bwrap --unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try
          --die-with-parent --new-session --clearenv --setenv ...
          --seccomp FD                                  # autograder.seccomp: no namespaces,
                                                        # mounts, keyrings, ptrace, bpf...
          --perms 1777 --size 64M --tmpfs /tmp          # private, size-capped /tmp
          --ro-bind /usr /usr  (+ /lib, /bin symlinks, a few /etc files)
          --ro-bind PREFIX PREFIX ...                   # the Python installation(s), read-only
          --ro-bind-data FD /grader/worker.py           # copies of the worker script and
          --ro-bind-data FD /grader/protocol.py         # the wire protocol it imports
          --ro-bind-data FD /submission/NAME.ipynb      # a copy of this learner's notebook
          --proc /proc --dev /dev
          --perms 1777 --size 64M --tmpfs /dev/shm      # POSIX semaphores for multiprocessing
          --remount-ro / --chdir /tmp
      setpriv --reuid UID --regid UID --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs
      prlimit --nproc --as --fsize --nofile --cpu --core=0   # autograder.limits.Limits.sandbox_*
      python -I /grader/worker.py REQ_FD REPLY_FD

The `sh` line is the first process of the worker: it puts itself into the worker's own
memory cgroup (see `MemoryCgroups`) and makes itself the kernel OOM killer's first choice,
then becomes bubblewrap, so everything bubblewrap and the learner start is inside the
cgroup from its first instruction (moving bubblewrap's pid after `Popen` would leave out
the processes it forked before). Where no cgroup can be created the `echo $$` part is
left out and the per-process RLIMIT_AS (`prlimit --as`) is the only memory limit.

Run as root (the usual case on a grading server or in CI), bubblewrap sets up the
namespaces with root's rights, so it can bind a Python installation that lives under a
0700 folder such as /root, and then `setpriv` drops to an unprivileged uid before
`prlimit` sets the limits: RLIMIT_NPROC is not enforced for root. Each worker gets its own
uid from SANDBOX_UIDS (SANDBOX_UID, the base, up to SANDBOX_UID + SANDBOX_UID_COUNT - 1,
skipping 65534/65535 and any uid or gid named in /etc/passwd or /etc/group), so the
process limit and any uid-keyed kernel state are per worker. Run as an ordinary user,
bubblewrap uses a user namespace instead (`--unshare-user --disable-userns`: no nested
ones; the seccomp filter applies as well) and there is no `setpriv`.

Nothing of the repository is visible inside: no solutions, hidden tests, gradebook, or
other learners' files. `Sandbox.check_binds` refuses a set-up whose Python installation
would expose any of them.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import seccomp
from .limits import DEFAULT, Limits

SANDBOX_UID = int(os.environ.get("AUTOGRADER_SANDBOX_UID", "64123"))  # the base uid; no account needed
SANDBOX_UID_COUNT = int(os.environ.get("AUTOGRADER_SANDBOX_UID_COUNT", "1024"))
SANDBOX_UIDS = range(SANDBOX_UID, SANDBOX_UID + SANDBOX_UID_COUNT)
"""Every uid a sandboxed worker may run as (root mode): test a process's uid with `in`."""
# uids the kernel or NFS use for "nobody" / "invalid": never given to a worker
RESERVED_UIDS = frozenset({0, 65534, 65535, 2**32 - 2, 2**32 - 1})
# The sandbox's resource limits are fields of `autograder.limits.Limits` (sandbox_*).
INSTALL_HINT = "sudo apt-get install -y bubblewrap"

# A few files from /etc that the dynamic loader and Python use; nothing else of /etc.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "host.conf")

CGROUP_ENV = "AUTOGRADER_CGROUP_PARENT"  # a folder to create worker cgroups in, or "none"
CGROUP_PREFIX = "autograder-w"           # worker cgroups: autograder-w<pid>-<random>
CGROUP_STALE_SECONDS = 30.0              # an unlocked worker cgroup older than this is a dead grader's

class SandboxUnavailable(RuntimeError):
    """Bubblewrap is missing or does not work here; the message says what to do."""


@dataclass
class Wrapped:
    """A command line ready for `subprocess.Popen`, and the descriptors it needs."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    env: dict
    cwd: str
    close_fds: list[int] = field(default_factory=list)  # close these in the parent after Popen
    uid: int | None = None                               # the uid the worker runs as (root mode)
    cgroup: str | None = None                            # the worker's own memory cgroup, if any
    release: Callable[[], None] = lambda: None           # call once the worker has ended


# --- uids -------------------------------------------------------------------------------------

def _account_ids() -> set[int]:
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
        taken = _account_ids() | RESERVED_UIDS
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


# --- memory cgroups ---------------------------------------------------------------------------

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


def _cgroup_dirs(proc: str = "/proc") -> dict:
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
            dirs = _cgroup_dirs(proc)
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
            self._kill_all(path)
            if time.monotonic() >= end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @staticmethod
    def _kill_all(path: str) -> None:
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


def _python_prefixes(python: str) -> list[str]:
    """The folders of a Python installation (venv and base interpreter), resolved."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    else:
        out = subprocess.run([python, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, "
                              "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))"],
                             capture_output=True, text=True, timeout=60, check=True)
        paths = json.loads(out.stdout)
    paths.append(str(Path(python).parent))
    paths.append(str(Path(os.path.realpath(python)).parent))
    result = []
    for p in paths:
        for q in (os.path.abspath(p), os.path.realpath(p)):
            if q not in result:
                result.append(q)
    return result


def _within(path: str, folder: str) -> bool:
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class Sandbox:
    """How to run one worker in isolation; one object serves a whole grading run.

    `uid` is the base of the worker uids (root mode) and `uid_count` how many there are;
    `memory_cgroup` is "auto" (find a place for per-worker memory cgroups, see
    `MemoryCgroups.find`), a folder to create them in, or None (none: RLIMIT_AS only).
    """

    def __init__(self, *, python: str = sys.executable, bwrap: str | None = None, uid: int = SANDBOX_UID,
                 uid_count: int = SANDBOX_UID_COUNT, forbidden: list | tuple = (), limits: Limits = DEFAULT,
                 memory_cgroup: str | None = "auto", use_seccomp: bool = True):
        self.limits = limits
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise SandboxUnavailable(
                "bubblewrap (`bwrap`) is not installed, so learner code cannot be isolated. "
                f"Install it ({INSTALL_HINT}), or pass --no-sandbox to grade without isolation "
                "(only for notebooks you trust).")
        self.root_mode = os.geteuid() == 0
        self.uid = uid  # the base; each worker gets its own from self.uids
        self.python = python
        if self.root_mode:
            for tool in ("setpriv", "prlimit"):
                if not shutil.which(tool):
                    raise SandboxUnavailable(f"`{tool}` (util-linux) is missing; install util-linux")
        elif not shutil.which("prlimit"):
            raise SandboxUnavailable("`prlimit` (util-linux) is missing; install util-linux")
        self.sh = shutil.which("sh", path="/usr/bin:/bin")
        if not self.sh:
            raise SandboxUnavailable("no `sh` in /usr/bin or /bin")
        self.uids = UidPool(range(uid, uid + uid_count)) if self.root_mode else None
        self.seccomp = None
        if use_seccomp:
            if seccomp.host_arch() is None:
                raise SandboxUnavailable(f"no seccomp system-call table for this machine ({os.uname().machine}); "
                                         "the sandbox supports x86_64 and aarch64")
            self.seccomp = seccomp.program()
        self.gpu_devices = sorted(str(p) for p in Path("/dev").glob("nvidia*")) if Path("/dev").is_dir() else []
        self.binds = [p for p in _python_prefixes(python) if not _within(p, "/usr")]
        from .assignments import ROOT

        self.check_binds([ROOT, *forbidden])
        self.cgroups: MemoryCgroups | None = None
        self.cgroup_problem = "not asked for"
        if memory_cgroup == "auto":
            self.cgroups, self.cgroup_problem = MemoryCgroups.find(limits.sandbox_memory_bytes)
        elif memory_cgroup:
            self.cgroups, self.cgroup_problem = MemoryCgroups.find(limits.sandbox_memory_bytes,
                                                                   env={CGROUP_ENV: str(memory_cgroup)})

    def check_binds(self, forbidden) -> None:
        """Refuse to run if a bound folder contains (or is inside) something that must stay hidden."""
        for p in self.binds:
            if p == "/":
                raise SandboxUnavailable("the Python installation is at /; it cannot be isolated")
            for f in forbidden:
                f = os.path.realpath(str(f))
                if _within(f, p):
                    raise SandboxUnavailable(
                        f"the Python installation {p} would expose {f} inside the sandbox: "
                        "use an environment outside that folder (or REPO/.venv)")

    @property
    def address_space_limit(self) -> bool:
        """Whether RLIMIT_AS is set: always, except where a GPU is passed through (it breaks CUDA).
        It is kept beside the cgroup: a single huge allocation then fails with MemoryError,
        which the learner's code can see and the grader can report, instead of an OOM kill."""
        return not self.gpu_devices

    # ----------------------------------------------------------------------------------
    def wrap(self, argv_tail: list[str], *, files, env: dict,
             notebook: str | Path | None = None, extra_fds: tuple[int, ...] = (), chdir: str = "/tmp") -> Wrapped:
        """The command line that runs `python -I /grader/FILES[0] *argv_tail` in the sandbox.

        Each of `files` (the worker script first) is copied read-only into /grader. Call the
        result's `release` once the process has ended (it removes the worker's cgroup).
        `chdir` is the working folder of the sandbox's processes, bubblewrap's own included (the
        warm start's template asks for "/": it must hold nothing of /tmp)."""
        close: list[int] = []
        cgroup = None
        try:
            if self.cgroups is not None:
                cgroup = self.cgroups.create(self.limits.sandbox_memory_bytes)
            a, uid = self._argv(argv_tail, files, env, notebook, close, cgroup, chdir)
        except BaseException:
            for fd in close:
                os.close(fd)
            if cgroup is not None:
                self.cgroups.release(cgroup)
            raise
        release = (lambda: self.cgroups.release(cgroup)) if cgroup is not None else (lambda: None)
        return Wrapped(argv=a, pass_fds=tuple(list(extra_fds) + close), env={"PATH": "/usr/bin:/bin"}, cwd="/",
                       close_fds=close, uid=uid, cgroup=cgroup, release=release)

    def _argv(self, argv_tail, files, env, notebook, close: list[int], cgroup: str | None,
              chdir: str = "/tmp") -> tuple[list, int | None]:
        # The first process: join the worker's cgroup, volunteer for the OOM killer, become bwrap.
        if cgroup is not None:
            a: list = [self.sh, "-c", 'echo $$ > "$1" && echo 1000 > /proc/self/oom_score_adj && shift && exec "$@"',
                       "autograder-worker", os.path.join(cgroup, "cgroup.procs")]
        else:
            a = [self.sh, "-c", 'echo 1000 > /proc/self/oom_score_adj && exec "$@"', "autograder-worker"]
        a.append(self.bwrap)
        if self.root_mode:
            a += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            # --disable-userns needs an explicit --unshare-user (bubblewrap 0.8 refuses it otherwise)
            a += ["--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--die-with-parent", "--new-session", "--clearenv"]
        if self.seccomp is not None:
            fd = _data_fd(self.seccomp)
            close.append(fd)
            a += ["--seccomp", str(fd)]
        inner_env = dict(env, HOME="/tmp", TMPDIR="/tmp", USER="learner", LOGNAME="learner",
                         PATH="/usr/local/bin:/usr/bin:/bin")
        for k, v in inner_env.items():
            a += ["--setenv", str(k), str(v)]
        a += ["--perms", "1777", "--size", str(self.limits.sandbox_tmp_bytes), "--tmpfs", "/tmp"]
        a += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
            p = Path("/") / link
            if p.is_symlink():
                a += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                a += ["--ro-bind", str(p), str(p)]
        a += ["--perms", "0755", "--dir", "/etc"]
        for name in ETC_FILES:
            p = Path("/etc") / name
            if p.exists():
                a += ["--ro-bind", os.path.realpath(p), str(p)]
        made = {"/", "/tmp", "/etc", "/usr"}
        for p in sorted(self.binds, key=len):
            if any(_within(p, m) for m in made if m not in ("/", "/tmp", "/etc")):
                continue
            parts = Path(p).parts
            for i in range(2, len(parts)):
                anc = str(Path(*parts[:i]))
                if anc not in made:
                    a += ["--perms", "0755", "--dir", anc]
                    made.add(anc)
            a += ["--ro-bind", os.path.realpath(p), p]
            made.add(p)
        a += ["--perms", "0755", "--dir", "/grader"]
        for f in files:
            fd = os.open(str(f), os.O_RDONLY | os.O_CLOEXEC)
            close.append(fd)
            a += ["--perms", "0444", "--ro-bind-data", str(fd), f"/grader/{Path(f).name}"]
        if notebook is not None:
            try:
                nfd = os.open(str(notebook), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                nfd = None
            if nfd is not None:
                close.append(nfd)
                name = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(notebook).name)[:100]
                a += ["--perms", "0755", "--dir", "/submission", "--perms", "0444", "--ro-bind-data", str(nfd),
                      f"/submission/{name or 'notebook.ipynb'}"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        for masked in ("/proc/keys", "/proc/key-users"):  # key descriptions of the grader's keyrings
            if os.path.exists(masked):
                a += ["--ro-bind", "/dev/null", masked]
        # POSIX semaphores (multiprocessing's locks) live in /dev/shm: a small one of its own
        a += ["--perms", "1777", "--size", str(self.limits.sandbox_shm_bytes), "--tmpfs", "/dev/shm"]
        for dev in self.gpu_devices:
            a += ["--dev-bind", dev, dev]
        if self.gpu_devices:
            a += ["--ro-bind", "/sys", "/sys"]
        a += ["--remount-ro", "/", "--chdir", chdir]
        uid = None
        if self.root_mode:
            uid = self.uids.take()
            a += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        lim = self.limits
        limits = [f"--nproc={lim.sandbox_processes}", f"--fsize={lim.sandbox_file_size}",
                  f"--nofile={lim.sandbox_open_files}", f"--cpu={lim.sandbox_cpu_seconds}", "--core=0"]
        if self.address_space_limit:
            limits.append(f"--as={lim.sandbox_address_space}")
        a += ["prlimit", *limits, "--"]
        a += [self.python, "-I", f"/grader/{Path(files[0]).name}", *argv_tail]
        return a, uid

    def probe(self) -> None:
        """Run Python once in the sandbox; raise SandboxUnavailable with bwrap's words if it fails."""
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write("import sys, os\nst = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
                    "sys.stdout.write('ok %d %s %s' % (os.getuid(), st['Seccomp'].strip(), st['NoNewPrivs'].strip()))\n")
            f.flush()
            w = self.wrap([], files=[f.name], env={})
            try:
                p = subprocess.run(w.argv, pass_fds=w.pass_fds, env=w.env, cwd=w.cwd,
                                   capture_output=True, text=True, timeout=60)
            finally:
                for fd in w.close_fds:
                    os.close(fd)
                w.release()
        if p.returncode != 0 or not p.stdout.startswith("ok"):
            raise SandboxUnavailable(
                "bubblewrap is installed but could not start a sandbox here "
                f"(exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}). "
                "Unprivileged user namespaces may be disabled; run the grader as root, or pass "
                "--no-sandbox to grade without isolation (only for notebooks you trust).")
        _, uid, mode, nnp = p.stdout.split()
        if self.root_mode and int(uid) != w.uid:
            raise SandboxUnavailable(f"the sandbox did not drop to uid {w.uid}: {p.stdout!r}")
        if self.seccomp is not None and mode != "2":
            raise SandboxUnavailable(f"bubblewrap did not load the seccomp filter (Seccomp: {mode})")
        if nnp != "1":
            raise SandboxUnavailable("the sandbox runs without no_new_privs")

    def describe(self) -> str:
        who = f"uids {self.uids} (one per worker)" if self.root_mode else f"your uid {os.geteuid()} in a user namespace"
        lim = self.limits
        if self.cgroups is not None:
            memory = self.cgroups.describe(lim.sandbox_memory_bytes)
            if self.address_space_limit:
                memory += f" and {lim.sandbox_address_space / 2**30:g} GiB of address space per process"
        elif self.address_space_limit:
            memory = (f"{lim.sandbox_address_space / 2**30:g} GiB of address space per process only "
                      f"(RLIMIT_AS; no memory cgroup: {self.cgroup_problem})")
        else:
            memory = f"NO memory limit (GPU passed through, and no memory cgroup: {self.cgroup_problem})"
        filt = (f"seccomp filter ({len(seccomp.blocked_names())} system calls and namespace flags denied)"
                if self.seccomp is not None else "NO seccomp filter")
        return (f"sandbox: bubblewrap as {who}, no network, {filt}, private /tmp of "
                f"{lim.sandbox_tmp_bytes // 2**20} MiB, at most {lim.sandbox_processes} processes, memory: {memory}, "
                f"{lim.sandbox_cpu_seconds} s CPU per worker")


def _data_fd(data: bytes) -> int:
    """A descriptor to read `data` from, at offset 0 (a memfd; a pipe where there is none)."""
    try:
        fd = os.memfd_create("autograder-seccomp", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        r, w = os.pipe()
        os.set_inheritable(r, False)
        try:
            os.write(w, data)  # about 1 KiB: fits in the pipe's buffer
        finally:
            os.close(w)
        return r
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def detect(python: str = sys.executable, forbidden=(), limits: Limits = DEFAULT) -> Sandbox:
    """A working sandbox, or SandboxUnavailable saying why not and what to do."""
    sb = Sandbox(python=python, forbidden=forbidden, limits=limits)
    sb.probe()
    return sb
