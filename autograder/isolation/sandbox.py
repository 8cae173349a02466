"""Run the grading worker under bubblewrap, as an unprivileged uid, with resource limits.

The trusted grader never runs learner code itself (see `autograder.isolation.runner`); this module
decides *where* the worker runs. `Sandbox.wrap` turns the worker's command line into::

    sh -c 'echo $$ > CGROUP/cgroup.procs && echo 1000 > /proc/self/oom_score_adj && exec "$@"'
    bwrap --unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try
          --die-with-parent --new-session --clearenv --setenv ...
          --seccomp FD                                  # autograder.isolation.seccomp: no namespaces,
                                                        # mounts, keyrings, ptrace, bpf...
          --perms 1777 --size 64M --tmpfs /tmp          # private, size-capped /tmp
          --ro-bind /usr /usr  (+ /lib, /bin symlinks, a few /etc files)
          --ro-bind PREFIX PREFIX ...                   # the Python installation(s), read-only
          --ro-bind-data FD /grader/worker.py           # copies of the worker script and
          --ro-bind-data FD /grader/protocol.py ...     # the files it imports (autograder.isolation.worker_files)
          --ro-bind-data FD /submission/NAME.ipynb      # a copy of this learner's notebook
          --proc /proc --dev /dev
          --perms 1777 --size 64M --tmpfs /dev/shm      # POSIX semaphores for multiprocessing
          --remount-ro / --chdir /tmp
      setpriv --reuid UID --regid UID --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs
      prlimit --nproc --as --fsize --nofile --cpu --core=0   # autograder.core.limits.Limits.sandbox_*
      python -I /grader/worker.py REQ_FD REPLY_FD

The `sh` line is the first process of the worker: it puts itself into the worker's own
memory cgroup (see `autograder.isolation.cgroups`) and makes itself the kernel OOM killer's first choice,
then becomes bubblewrap, so everything bubblewrap and the learner start is inside the
cgroup from its first instruction (moving bubblewrap's pid after `Popen` would leave out
the processes it forked before). Where no cgroup can be created the `echo $$` part is
left out and the per-process RLIMIT_AS (`prlimit --as`) is the only memory limit.

Run as root (the usual case on a grading server or in CI), bubblewrap sets up the
namespaces with root's rights, so it can bind a Python installation that lives under a
0700 folder such as /root, and then `setpriv` drops to an unprivileged uid before
`prlimit` sets the limits: RLIMIT_NPROC is not enforced for root. Each worker gets its own
uid from SANDBOX_UIDS (SANDBOX_UID, the base, up to SANDBOX_UID + SANDBOX_UID_COUNT - 1,
skipping 65534/65535 and any uid or gid named in /etc/passwd or /etc/group; see
`autograder.isolation.uids`), so the process limit and any uid-keyed kernel state are per worker, and
when the worker ends every process left of its uid is killed (`Wrapped.release`; the worker's PID
namespace has usually ended them already). Run as an ordinary user, bubblewrap uses a user namespace instead (`--unshare-user
--disable-userns`: no nested ones; the seccomp filter applies as well) and there is no
`setpriv`.

Nothing of the repository is visible inside: no solutions, hidden tests, gradebook, or
other learners' files. `Sandbox.check_binds` refuses a set-up whose Python installation
would expose any of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core.limits import DEFAULT, Limits
from . import seccomp
from .cgroups import CGROUP_ENV, MemoryCgroups
from .processes import clean_env
from .uids import SANDBOX_UID, SANDBOX_UID_COUNT, ender, shared_pool, uid_slot
from .unavailable import SandboxUnavailable

# The sandbox's resource limits are fields of `autograder.core.limits.Limits` (sandbox_*).
INSTALL_HINT = "sudo apt-get install -y bubblewrap"

# A few files from /etc that the dynamic loader and Python use; nothing else of /etc.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "host.conf")


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


def _python_prefixes(python: str) -> list[str]:
    """The folders of a Python installation (venv and base interpreter), resolved."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    else:
        out = subprocess.run([python, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, "
                              "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))"],
                             capture_output=True, text=True, timeout=60, check=True, env=clean_env(), cwd="/")
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

    `uid` is the base of the worker uids (root mode) and `uid_count` how many there are (by
    default this process's share of SANDBOX_UIDS, `uid_slot`); the sandboxes of a process over
    one range share one `UidPool`;
    `memory_cgroup` is "auto" (find a place for per-worker memory cgroups, see
    `MemoryCgroups.find`), a folder to create them in, or None (none: RLIMIT_AS only).
    """

    def __init__(self, *, python: str = sys.executable, bwrap: str | None = None, uid: int | None = None,
                 uid_count: int | None = None, forbidden: list | tuple = (), limits: Limits = DEFAULT,
                 memory_cgroup: str | None = "auto", use_seccomp: bool = True):
        self.limits = limits
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise SandboxUnavailable(
                "bubblewrap (`bwrap`) is not installed, so learner code cannot be isolated. "
                f"Install it ({INSTALL_HINT}), or pass --no-sandbox to grade without isolation "
                "(only for notebooks you trust).")
        self.root_mode = os.geteuid() == 0
        if uid is None and self.root_mode:
            # this process's share of the sandbox uids (`uid_slot`): no other grading process of the
            # machine hands them out, so killing everything of a worker's uid when it ends is safe
            offset, share = uid_slot(SANDBOX_UID_COUNT)
            uid, uid_count = SANDBOX_UID + offset, share
        uid = SANDBOX_UID if uid is None else uid
        uid_count = SANDBOX_UID_COUNT if uid_count is None else uid_count
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
        self.uids = shared_pool(range(uid, uid + uid_count)) if self.root_mode else None
        self.seccomp = None
        if use_seccomp:
            if seccomp.host_arch() is None:
                raise SandboxUnavailable(f"no seccomp system-call table for this machine ({os.uname().machine}); "
                                         "the sandbox supports x86_64 and aarch64")
            self.seccomp = seccomp.program()
        self.gpu_devices = sorted(str(p) for p in Path("/dev").glob("nvidia*")) if Path("/dev").is_dir() else []
        self.binds = [p for p in _python_prefixes(python) if not _within(p, "/usr")]
        from ..core.assignments import ROOT, in_checkout

        if not in_checkout() and any(_within(os.path.realpath(ROOT), p) for p in self.binds):
            raise SandboxUnavailable(
                f"the course is installed inside the Python installation that the sandbox shows to learner code "
                f"({ROOT}), which would expose its hidden tests and reference solutions: run it from a clone of the "
                "course's repository, or without the sandbox for notebooks you trust")
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
        release = self._release(uid, cgroup)
        return Wrapped(argv=a, pass_fds=tuple(list(extra_fds) + close), env={"PATH": "/usr/bin:/bin"}, cwd="/",
                       close_fds=close, uid=uid, cgroup=cgroup, release=release)

    def _release(self, uid: int | None, cgroup: str | None) -> Callable[[], None]:
        """What ends a worker's sandbox, once its first process has ended: every process left of its
        uid is killed (root mode; the PID namespace has usually taken them already) and the uid
        given back, then its cgroup is emptied and removed (`uids.ender`). Safe to call twice."""
        return ender(self.uids, uid, (lambda: self.cgroups.release(cgroup)) if cgroup is not None else None)

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


def make_sandbox(forbidden=(), memory_cgroup: str | None = "auto") -> Sandbox:
    """A probed sandbox for this process; in root mode its uids are this process's slot's share
    (`autograder.isolation.uids.uid_slot`, as every `Sandbox` not given its uids), so that no two grading
    processes on a machine share a uid."""
    sandbox = Sandbox(forbidden=list(forbidden), memory_cgroup=memory_cgroup)
    sandbox.probe()
    return sandbox
