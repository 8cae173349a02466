"""Run the grading worker under bubblewrap, as an unprivileged uid, with resource limits.

The trusted grader never runs learner code itself (see `autograder.runner`); this module
decides *where* the worker runs. `Sandbox.wrap` turns the worker's command line into::

    bwrap --unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try
          --die-with-parent --new-session --clearenv --setenv ...
          --perms 1777 --size 64M --tmpfs /tmp          # private, size-capped /tmp
          --ro-bind /usr /usr  (+ /lib, /bin symlinks, a few /etc files)
          --ro-bind PREFIX PREFIX ...                   # the Python installation(s), read-only
          --ro-bind-data FD /grader/worker.py           # copies of the worker script and
          --ro-bind-data FD /grader/protocol.py         # the wire protocol it imports
          --ro-bind-data FD /submission/NAME.ipynb      # a copy of this learner's notebook
          --proc /proc --dev /dev --remount-ro / --chdir /tmp
      setpriv --reuid UID --regid UID --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs
      prlimit --nproc --as --fsize --nofile --cpu --core=0   # autograder.limits.Limits.sandbox_*
      python -I /grader/worker.py REQ_FD REPLY_FD

Run as root (the usual case on a grading server or in CI), bubblewrap sets up the
namespaces with root's rights, so it can bind a Python installation that lives under a
0700 folder such as /root, and then `setpriv` drops to the unprivileged SANDBOX_UID
before `prlimit` sets the limits: RLIMIT_NPROC is not enforced for root. Run as an
ordinary user, bubblewrap uses a user namespace instead and there is no `setpriv`.

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

from .limits import DEFAULT, Limits

SANDBOX_UID = int(os.environ.get("AUTOGRADER_SANDBOX_UID", "64123"))  # no account needed
# The sandbox's resource limits are fields of `autograder.limits.Limits` (sandbox_*).
INSTALL_HINT = "sudo apt-get install -y bubblewrap"

# A few files from /etc that the dynamic loader and Python use; nothing else of /etc.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "host.conf")


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
    """How to run one worker in isolation; one object serves a whole grading run."""

    def __init__(self, *, python: str = sys.executable, bwrap: str | None = None, uid: int = SANDBOX_UID,
                 forbidden: list | tuple = (), limits: Limits = DEFAULT):
        self.limits = limits
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise SandboxUnavailable(
                "bubblewrap (`bwrap`) is not installed, so learner code cannot be isolated. "
                f"Install it ({INSTALL_HINT}), or pass --no-sandbox to grade without isolation "
                "(only for notebooks you trust).")
        self.root_mode = os.geteuid() == 0
        self.uid = uid
        self.python = python
        if self.root_mode:
            for tool in ("setpriv", "prlimit"):
                if not shutil.which(tool):
                    raise SandboxUnavailable(f"`{tool}` (util-linux) is missing; install util-linux")
        elif not shutil.which("prlimit"):
            raise SandboxUnavailable("`prlimit` (util-linux) is missing; install util-linux")
        self.gpu_devices = sorted(str(p) for p in Path("/dev").glob("nvidia*")) if Path("/dev").is_dir() else []
        self.binds = [p for p in _python_prefixes(python) if not _within(p, "/usr")]
        from .assignments import ROOT

        self.check_binds([ROOT, *forbidden])

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

    # ----------------------------------------------------------------------------------
    def wrap(self, argv_tail: list[str], *, files, env: dict,
             notebook: str | Path | None = None, extra_fds: tuple[int, ...] = ()) -> Wrapped:
        """The command line that runs `python -I /grader/FILES[0] *argv_tail` in the sandbox.

        Each of `files` (the worker script first) is copied read-only into /grader."""
        a: list[str] = [self.bwrap]
        if self.root_mode:
            a += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            a += ["--unshare-all", "--disable-userns"]
        a += ["--die-with-parent", "--new-session", "--clearenv"]
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
        close = []
        fds = list(extra_fds)
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
        for dev in self.gpu_devices:
            a += ["--dev-bind", dev, dev]
        if self.gpu_devices:
            a += ["--ro-bind", "/sys", "/sys"]
        a += ["--remount-ro", "/", "--chdir", "/tmp"]
        if self.root_mode:
            a += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        lim = self.limits
        limits = [f"--nproc={lim.sandbox_processes}", f"--fsize={lim.sandbox_file_size}",
                  f"--nofile={lim.sandbox_open_files}", f"--cpu={lim.sandbox_cpu_seconds}", "--core=0"]
        if not self.gpu_devices:  # RLIMIT_AS breaks CUDA
            limits.append(f"--as={lim.sandbox_address_space}")
        a += ["prlimit", *limits, "--"]
        a += [self.python, "-I", f"/grader/{Path(files[0]).name}", *argv_tail]
        return Wrapped(argv=a, pass_fds=tuple(fds + close), env={"PATH": "/usr/bin:/bin"}, cwd="/",
                       close_fds=close)

    def probe(self) -> None:
        """Run Python once in the sandbox; raise SandboxUnavailable with bwrap's words if it fails."""
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write("import sys, os\nsys.stdout.write('ok %d' % os.getuid())\n")
            f.flush()
            w = self.wrap([], files=[f.name], env={})
            try:
                p = subprocess.run(w.argv, pass_fds=w.pass_fds, env=w.env, cwd=w.cwd,
                                   capture_output=True, text=True, timeout=60)
            finally:
                for fd in w.close_fds:
                    os.close(fd)
        if p.returncode != 0 or not p.stdout.startswith("ok"):
            raise SandboxUnavailable(
                "bubblewrap is installed but could not start a sandbox here "
                f"(exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}). "
                "Unprivileged user namespaces may be disabled; run the grader as root, or pass "
                "--no-sandbox to grade without isolation (only for notebooks you trust).")
        if self.root_mode and p.stdout.strip() != f"ok {self.uid}":
            raise SandboxUnavailable(f"the sandbox did not drop to uid {self.uid}: {p.stdout!r}")

    def describe(self) -> str:
        who = f"uid {self.uid}" if self.root_mode else f"your uid {os.geteuid()} in a user namespace"
        lim = self.limits
        return (f"sandbox: bubblewrap as {who}, no network, private /tmp of {lim.sandbox_tmp_bytes // 2**20} MiB, "
                f"at most {lim.sandbox_processes} processes, {lim.sandbox_address_space // 2**30} GiB address space, "
                f"{lim.sandbox_cpu_seconds} s CPU per worker")


def detect(python: str = sys.executable, forbidden=(), limits: Limits = DEFAULT) -> Sandbox:
    """A working sandbox, or SandboxUnavailable saying why not and what to do."""
    sb = Sandbox(python=python, forbidden=forbidden, limits=limits)
    sb.probe()
    return sb
