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

Every helper process the course starts (a worker, a warm template and its clean-up helper, the
sandbox's probes, `check()`'s grading process in a notebook, a Dask job, Gradescope's grader)
starts isolated from its caller's Python environment: Python with `-I` (no PYTHON* variable, no
user site-packages, neither the working folder nor the script's folder on `sys.path`) and an
environment built from an allow-list (`clean_env`), so that a PYTHONPATH, PYTHONSTARTUP or
LD_PRELOAD set by whoever started the grader (say a notebook cell before `check()`) runs nothing
in it. Dask starts its jobs with multiprocessing, whose command line and environment it builds
itself: `isolate_spawned` makes those start the same way.

A worker that runs as a uid of its own ends with everything of that uid (`kill_uid`): a process
the learner's code left behind (a double fork into a session of its own) is killed with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1

# The variables a helper process inherits from its caller; every other one (PYTHON*, LD_*, ...) is
# dropped. A worker gets an environment of its own on top (`runner.Submission.base_env`).
ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "XDG_RUNTIME_DIR",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
})
ENV_PREFIXES = ("LC_", "AUTOGRADER_")  # the locale's categories, and the grader's own settings


def env_allowed(name: str) -> bool:
    """Whether a helper process inherits the variable `name` (see ENV_NAMES)."""
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def clean_env(extra: dict | None = None, source=None) -> dict:
    """The environment a helper process starts with: the allow-listed variables of `source`
    (default: this process's environment), then `extra`."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if env_allowed(k)}
    env.update(extra or {})
    return env


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


# --- processes that multiprocessing spawns (Dask's jobs) ---------------------------------------

_spawn_lock = threading.Lock()
_spawn_users = 0
_spawn_removed: dict[str, str] = {}
_spawn_flags = None


def isolate_spawned():
    """Until the function it returns is called, every process that multiprocessing's "spawn" start
    method starts from this process (a local Dask cluster's jobs, multiprocessing's resource
    tracker) starts as the course's other helpers do: with `-I`, and with the allow-listed
    environment (ENV_NAMES).

    multiprocessing builds that command line and environment itself (the interpreter's flags of
    this process, and its whole environment), and Dask starts a job again whenever one dies, so
    for as long as it lasts: the flags multiprocessing adds get `-I`
    (`multiprocessing.util._args_from_interpreter_flags`), and the variables that are not allowed
    are taken out of this process's environment; they are put back (where nothing set them again)
    when the last user ends. A spawned process gets its `sys.path` from this one anyway.
    Nested uses share one such state."""
    global _spawn_users, _spawn_flags
    import multiprocessing.util  # here: 10 ms that only a Dask batch needs

    with _spawn_lock:
        if _spawn_users == 0:
            for name in list(os.environ):
                if not env_allowed(name):
                    _spawn_removed[name] = os.environ.pop(name)
            flags = getattr(multiprocessing.util, "_args_from_interpreter_flags", None)
            if callable(flags):
                _spawn_flags = flags

                def isolated() -> list[str]:
                    args = [a for a in flags() if a not in ("-E", "-s", "-P")]  # -I implies them
                    return args if "-I" in args else [*args, "-I"]

                multiprocessing.util._args_from_interpreter_flags = isolated
        _spawn_users += 1
    ended = []

    def end() -> None:
        global _spawn_users, _spawn_flags
        with _spawn_lock:
            if ended:
                return
            ended.append(True)
            _spawn_users -= 1
            if _spawn_users:
                return
            if _spawn_flags is not None:
                multiprocessing.util._args_from_interpreter_flags = _spawn_flags
                _spawn_flags = None
            for name, value in _spawn_removed.items():
                os.environ.setdefault(name, value)
            _spawn_removed.clear()

    return end


# --- everything of a uid -------------------------------------------------------------------------

def uid_processes(uid: int, proc: str = "/proc") -> list[int]:
    """The live processes (zombies left out) whose real or effective uid is `uid` (Linux: /proc;
    a process's status is read, not the owner of its folder, which a process that made itself
    non-dumpable hands to root)."""
    out = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return out
    want = str(uid).encode()
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/status", "rb") as f:
                status = f.read(8192)
        except OSError:
            continue
        state, uids = b"", []
        for line in status.splitlines():
            if line.startswith(b"State:"):
                state = line[6:].strip()[:1]
            elif line.startswith(b"Uid:"):
                uids = line.split()[1:3]
                break
        if want in uids and state != b"Z":
            out.append(int(name))
    return out


def _signal_all_as(uid: int) -> int | None:
    """kill(-1, SIGKILL) from a short-lived process running as `uid` alone: the kernel signals every
    process of that uid at once (one that forks meanwhile cannot escape: the fork fails or its
    child is signalled too), in every PID namespace. 0: something was signalled (zombies count);
    1: nothing of the uid was there; None: the helper could not run."""
    setpriv, sh = shutil.which("setpriv"), shutil.which("sh", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not setpriv or not sh:
        return None
    try:
        out = subprocess.run([setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                              sh, "-c", "kill -9 -1 2>/dev/null; echo $?"], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {b"0": 0, b"1": 1}.get(out)  # nothing printed: setpriv failed before the shell ran


def kill_uid(uid: int, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process of `uid` (root only), again until none is alive; the pids still alive
    after `timeout` seconds (none, unless a process cannot die: one stuck in the kernel).

    Called once a worker that ran as a uid of its own has ended, so that nothing the learner's code
    started (a daemon that double-forked into a session of its own) outlives it. That uid must be
    the worker's alone (`uids.UidPool` hands out a uid only to one worker at a time)."""
    deadline = time.monotonic() + timeout
    while True:
        signalled = _signal_all_as(uid)
        if signalled == 1:
            return []  # nothing of the uid, not even a zombie
        if signalled is None:  # no helper: one by one, as root
            for pid in uid_processes(uid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        left = uid_processes(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)
