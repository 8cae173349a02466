"""The warm start: one pre-imported template process per grading job, forked per submission.

Starting Python and importing torch costs about a second per worker; a `Template` pays it
once. It is started in the sandbox exactly as a worker is (bubblewrap, the seccomp filter,
the sandbox uid, RLIMITs, a memory cgroup of its own), imports NumPy and torch, and waits on
a private socket (`warm_server.template_main`). For each submission the trusted side (this
module, in the grader's process) passes it the submission's three pipes with SCM_RIGHTS; the
template forks a worker, which:

* starts a session of its own and closes every descriptor but its pipes;
* loads a second seccomp filter (`seccomp.child_program`): no signal, pidfd, F_SETOWN or
  CLONE_PARENT can reach the template, and no SysV IPC object or POSIX message queue (which
  would outlive it) can be made;
* is not dumpable (the template made itself non-dumpable before forking): /proc/PID/mem,
  environ and ptrace of the template are refused to it;
* then blocks on its request pipe. Before sending the load request (the first moment any
  learner code runs) the trusted side moves the worker's host pid into a fresh memory cgroup
  of its own, so everything the learner starts is in that cgroup.

When the submission ends the trusted side kills that cgroup's processes and waits until it is
empty (else the template is thrown away: its PID namespace, and all in it, dies with it), so
nothing of one learner is alive when the next worker is forked. Then it cleans up after that
learner from outside the sandbox, as part of that learner's grading time (`Template.renew`):
a helper process (root, not in the sandbox, not a child of the template) enters the
template's mount namespace, unmounts /tmp and /dev/shm (which fails if anything still uses
them) and mounts new empty ones, and resets the PID namespace's last pid, so the next worker
gets the same pid whatever the learner before forked. The template itself never reads or
holds anything a learner produced (no listing, no wipe, no file of theirs): every worker is
forked from the same state.

The trusted side never trusts the template either: its replies are bounded, checked and
timed; one that is late, malformed, whose worker did not get the expected pid, whose
folders could not be replaced, or whose cgroup holds a process it should not, is killed and
replaced by a fresh one, and the time that takes is not counted against the learner being
graded.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from .processes import OutputDrain, kill_group
from .unavailable import TemplateUnavailable
from .worker_files import TEMPLATE_FILES

log = logging.getLogger("autograder")

SPAWN_SECONDS = 15.0   # a fork; a template that takes longer is replaced
RENEW_SECONDS = 30.0   # replacing /tmp and /dev/shm: kernel time that grows with the files left there
BUSY_SECONDS = 2.0     # how long an unmount may find /tmp busy (a process still ending) before it gives up
START_SECONDS = 120.0  # a template's start (Python and torch) on a loaded machine
EMPTY_SECONDS = 5.0    # how long a worker's cgroup may take to empty after it was killed
MESSAGE_BYTES = 4096
WRITABLE = ("/tmp", "/dev/shm")  # every place the sandbox lets learner code write to

# The renewal helper: `python -I -S -c RENEW PIDFD LAST_PID BUSY_SECONDS SPECS`, run by the
# trusted side as root, outside the sandbox. SPECS is JSON: [[PATH, SIZE, [KEEP...]], ...]. It
# enters the template's mount and PID namespaces through a pidfd of the template (which cannot
# be a recycled pid), replaces each PATH by a new empty tmpfs of SIZE bytes (as bubblewrap's
# --size/--perms 1777 --tmpfs), and sets the namespace's last pid to LAST_PID, so the next fork
# gets LAST_PID + 1. It reads nothing in the sandbox: unmounting frees whatever was there in one
# step, names unread. A KEEP is one of the sandbox's read-only mounts below PATH (a Python
# installation under /tmp): it is cloned first (open_tree), PATH is then detached with what is
# mounted below it, and the clone is attached at the same place in the new tmpfs, in folders
# the helper makes (root's, mode 0755, as bubblewrap made them).
RENEW = r'''
import ctypes, errno, json, os, sys, time
CLONE_NEWNS, CLONE_NEWPID, MS_NOSUID, MS_NODEV, UMOUNT_NOFOLLOW = 0x00020000, 0x20000000, 2, 4, 8
libc = ctypes.CDLL(None, use_errno=True)
def check(ok, what):
    if not ok:
        sys.stdout.write(f"{what}: {os.strerror(ctypes.get_errno())}")
        sys.exit(1)
pidfd, last, busy = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
# ns_last_pid acts on the PID namespace of the process that writes it: opened here, written by
# a child born in the template's namespace (/proc/sys is read-only inside the sandbox)
last_pid = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
check(libc.setns(pidfd, CLONE_NEWNS | CLONE_NEWPID) == 0, "setns")
OPEN_TREE_CLONE, AT_RECURSIVE, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH, MNT_DETACH = 1, 0x8000, -100, 4, 2
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same numbers on x86_64 and aarch64
libc.syscall.restype = ctypes.c_long
for path, size, keep in json.loads(sys.argv[4]):
    clones = []
    for k in keep:
        fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, k.encode(), OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
        check(fd >= 0, "open_tree " + k)
        clones.append((k, fd))
    deadline = time.monotonic() + busy
    if clones:
        # the mounts below keep PATH busy for ever: detach it; a dying process can no longer reach it
        check(libc.umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0, "umount " + path)
    else:
        while libc.umount2(path.encode(), UMOUNT_NOFOLLOW) != 0:  # EBUSY while a dying process still holds it
            check(ctypes.get_errno() == errno.EBUSY and time.monotonic() < deadline, "umount " + path)
            time.sleep(0.005)
    check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=%d,mode=1777" % size) == 0,
          "mount " + path)
    for k, fd in clones:
        os.makedirs(k, mode=0o755)
        check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, k.encode(), MOVE_MOUNT_F_EMPTY_PATH) == 0,
              "move_mount " + k)
        os.close(fd)
pid = os.fork()
if pid == 0:
    code = 1
    try:
        os.write(last_pid, b"%d" % last)
        code = 0
    finally:
        os._exit(code)
if os.waitpid(pid, 0)[1] != 0:
    sys.stdout.write("could not set the last pid")
    sys.exit(1)
sys.stdout.write("ok")
'''


class _Broken(Exception):
    """The template misbehaved (late, dead, malformed, dirty): replace it."""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(1 << 20)
    except OSError:
        return ""


def _procs(cgroup: str) -> set[int]:
    return {int(p) for p in _read(os.path.join(cgroup, "cgroup.procs")).split() if p.isdigit()}


def _status(pid: int) -> dict:
    out = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        k, _, v = line.partition(":")
        out[k] = v.split()
    return out


def _host_pid(cgroup: str, ns_pid: int, parent: int | None = None) -> int | None:
    """The pid, as this process sees it, of the process of `cgroup` whose pid in its own
    (innermost) PID namespace is `ns_pid` (and whose parent is `parent`, when given)."""
    for pid in sorted(_procs(cgroup)):
        st = _status(pid)
        nspid = st.get("NSpid", [])
        if len(nspid) >= 2 and nspid[-1] == str(ns_pid) and (parent is None or st.get("PPid") == [str(parent)]):
            return pid
    return None


class Child:
    """One submission's worker, forked from a template: what `Submission` keeps as its process."""

    def __init__(self, template: "Template", pid: int, pidfd: int, cgroup: str, generation: int):
        self.template, self.pid, self.pidfd, self.cgroup, self.generation = template, pid, pidfd, cgroup, generation
        self.ended = False

    def end(self) -> None:
        """Kill everything in the worker's cgroup, wait until it is empty, clean up after it
        (`Template.renew`: this learner's time, since the caller is still grading them), remove
        the cgroup. If it will not empty or the clean-up fails, the template (and its PID
        namespace, with whatever is stuck) is replaced."""
        if self.ended:
            return
        self.ended = True
        cgs = self.template.sandbox.cgroups
        deadline = time.monotonic() + EMPTY_SECONDS
        while _procs(self.cgroup) and time.monotonic() < deadline:
            cgs.kill_all(self.cgroup)
            time.sleep(0.002)
        empty = not _procs(self.cgroup)
        os.close(self.pidfd)
        if empty:
            self.template.renew(self.generation)  # before the release: the tmpfs pages are uncharged first
        if not cgs.release(self.cgroup) or not empty:
            log.warning("a warm worker's cgroup %s did not empty; starting a fresh template", self.cgroup)
            self.template.discard(self.generation)


class Template:
    """A pre-imported worker template for one `Grader` (one grading job).

    `spawn` returns a `Child` running in a cgroup of its own, or raises TemplateUnavailable
    (the caller then starts a fresh worker as without a warm start)."""

    def __init__(self, sandbox, limits, env: dict):
        if sandbox is None or sandbox.cgroups is None:
            raise TemplateUnavailable("the warm start needs the sandbox and a memory cgroup per worker")
        if not sandbox.root_mode:
            # cleaning up after a learner means replacing the template's tmpfs mounts from outside
            raise TemplateUnavailable("the warm start needs the grader to run as root")
        # The sandbox's own read-only mounts below /tmp or /dev/shm (a Python installation under
        # /tmp): the renewal carries them over to each new tmpfs. Nested ones travel with theirs.
        tops = sorted({os.path.abspath(p) for p in (*sandbox.binds, *sandbox.gpu_devices)}, key=len)
        outer = [p for i, p in enumerate(tops) if not any(p.startswith(q.rstrip("/") + "/") for q in tops[:i])]
        self.keep = {top: [p for p in outer if p.startswith(top + "/")] for top in WRITABLE}
        self.sandbox, self.limits, self.env = sandbox, limits, dict(env)
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.cgroup: str | None = None
        self.host_pid: int | None = None
        self.known: set[int] = set()   # the template cgroup's processes after the template started
        self.generation = 0            # which template a Child came from
        self.starts = 0                # templates started (a test sees replacements here)
        self.start_seconds: list[float] = []
        self.renew_seconds: list[float] = []  # each clean-up after a worker (a test reads the worst)
        self.fresh = False             # /tmp, /dev/shm and the last pid are as new since the last fork
        self.pidfd: int | None = None  # the template's, for the renewal helper
        self.hello: dict = {}
        self._release = None
        self._out = None
        self._lock = threading.RLock()
        atexit.register(self.close)

    # life cycle ------------------------------------------------------------------------------
    def _launch(self) -> None:
        t0 = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        w = None
        try:
            w = self.sandbox.wrap(["--template", str(theirs.fileno())], files=TEMPLATE_FILES, env=self.env,
                                  extra_fds=(theirs.fileno(),), chdir="/")  # nothing of ours keeps /tmp busy
            self.proc = subprocess.Popen(w.argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                                         pass_fds=w.pass_fds, cwd=w.cwd, env=w.env, start_new_session=True)
        except BaseException:
            ours.close()
            os.close(out_r)
            if w is not None:
                w.release()
            raise
        finally:
            theirs.close()
            os.close(out_w)
            for fd in (w.close_fds if w is not None else ()):
                os.close(fd)
        self.sock, self.cgroup, self._release = ours, w.cgroup, w.release
        self._out = OutputDrain(out_r, 1 << 16)
        self.generation += 1
        self.starts += 1
        hello = self._recv(START_SECONDS)
        if (set(hello) != {"ready", "pid", "threads", "shared"} or hello["ready"] is not True
                or type(hello["pid"]) is not int or type(hello["shared"]) is not int):
            raise _Broken("malformed greeting")
        if hello["shared"]:
            # a writable shared mapping made before the fork would be shared by every learner's worker
            raise _Broken(f"the template has {hello['shared']} writable shared mappings")
        self.hello = hello
        if hello["threads"] != 1:
            log.warning("warm start: the template has %s threads when it forks", hello["threads"])
        self.host_pid = _host_pid(self.cgroup, hello["pid"])
        if self.host_pid is None:
            raise _Broken("the template's process was not found in its cgroup")
        self.pidfd = os.pidfd_open(self.host_pid)
        self.known = _procs(self.cgroup)
        self._renew()  # so that even the first worker gets folders and a pid that the trusted side made
        self.start_seconds.append(time.monotonic() - t0)

    def discard(self, generation: int | None = None) -> None:
        """Kill the template (its PID namespace dies with it), every process of its uid (its workers
        share it) and its cgroup; the next spawn starts a fresh one."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self.fresh = False
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            if self.proc is not None:
                kill_group(self.proc)
                self.proc = None
            if self._release is not None:
                self._release()
                self._release = None
            if self._out is not None:
                self._out.thread.join(timeout=2)
                self._out = None
            self.cgroup = self.host_pid = None
            self.known = set()

    close = discard

    def output(self) -> str:
        return self._out.text() if self._out is not None else ""

    # the conversation ------------------------------------------------------------------------
    def _recv(self, seconds: float) -> dict:
        ready, _, _ = select.select([self.sock], [], [], seconds)
        if not ready:
            raise _Broken(f"no answer within {seconds:.0f} s")
        try:
            data = self.sock.recv(MESSAGE_BYTES + 1)
        except OSError as exc:
            raise _Broken(f"connection lost ({exc})")
        if not data:
            raise _Broken("the template ended")
        if len(data) > MESSAGE_BYTES:
            raise _Broken("oversized answer")
        try:
            msg = json.loads(data)
        except ValueError:
            raise _Broken("malformed answer")
        if type(msg) is not dict:
            raise _Broken("malformed answer")
        return msg

    def _spawn(self, fds: tuple[int, int, int]) -> Child:
        if self.proc is None:
            self._launch()
        if _procs(self.cgroup) != self.known:
            raise _Broken("the template's cgroup holds a process it should not")
        if not self.fresh:
            self._renew()  # the last worker's clean-up failed or never ran: the grader's time, not a learner's
        self.fresh = False
        try:
            socket.send_fds(self.sock, [json.dumps({"op": "spawn"}).encode()], list(fds))
        except OSError as exc:
            raise _Broken(f"connection lost ({exc})")
        reply = self._recv(SPAWN_SECONDS)
        if set(reply) != {"pid"} or type(reply["pid"]) is not int:
            raise _Broken("malformed answer")
        if reply["pid"] != self.hello["pid"] + 1:
            # every worker gets the same pid (the renewal reset the last pid); another one would
            # tell the learner how many processes were made in the namespace before
            raise _Broken(f"the forked worker got pid {reply['pid']}, not {self.hello['pid'] + 1}")
        pid = _host_pid(self.cgroup, reply["pid"], parent=self.host_pid)
        if pid is None:
            raise _Broken("the forked worker was not found")
        pidfd = os.pidfd_open(pid)
        cgs = self.sandbox.cgroups
        cg = None
        try:
            if _host_pid(self.cgroup, reply["pid"], parent=self.host_pid) != pid:
                raise _Broken("the forked worker ended before it was moved")  # and its pid may be reused
            cg = cgs.create(self.limits.sandbox_memory_bytes)
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            if _procs(cg) != {pid} or _procs(self.cgroup) != self.known:
                raise _Broken("the forked worker could not be moved into its own cgroup")
        except BaseException:
            if cg is not None:
                cgs.kill_all(cg)
                cgs.release(cg)
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(pidfd)
            raise
        return Child(self, pid, pidfd, cg, self.generation)

    def _renew(self) -> None:
        """Replace /tmp and /dev/shm by new empty tmpfs mounts and reset the last pid of the
        template's PID namespace (the helper `RENEW`, outside the sandbox), or raise _Broken.

        Called when no worker of the template is alive. Unmounting, unlike a wipe, reads no
        name, and resets what a wipe leaves: the tmpfs's inode numbers (a new file's would
        count the files made before), its free space and inode counts, the folders' times.
        Its cost is kernel time that grows with what was left there, bounded by the worker's
        memory limit (inodes are kernel memory charged to its cgroup); past RENEW_SECONDS
        the template is replaced instead."""
        t0 = time.monotonic()
        lim = self.sandbox.limits
        specs = [["/tmp", lim.sandbox_tmp_bytes, self.keep["/tmp"]],
                 ["/dev/shm", lim.sandbox_shm_bytes, self.keep["/dev/shm"]]]
        argv = [sys.executable, "-I", "-S", "-c", RENEW, str(self.pidfd), str(self.hello["pid"]), str(BUSY_SECONDS),
                json.dumps(specs)]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    pass_fds=(self.pidfd,), cwd="/", env={"PATH": "/usr/bin:/bin"})
        except OSError as exc:
            raise _Broken(f"the clean-up helper could not start ({exc})")
        try:
            out, _ = proc.communicate(timeout=RENEW_SECONDS + 5)
        except subprocess.TimeoutExpired:
            proc.kill()  # it ends when the kernel has finished; nobody waits for it here
            threading.Thread(target=proc.wait, daemon=True).start()
            raise _Broken(f"cleaning up after the last worker took more than {RENEW_SECONDS:.0f} s")
        if proc.returncode != 0 or out != b"ok":
            raise _Broken(f"cleaning up after the last worker failed: {out[-300:].decode(errors='replace')}")
        self.fresh = True
        self.renew_seconds.append(time.monotonic() - t0)

    def renew(self, generation: int) -> None:
        """Clean up after a worker of template `generation` that has ended (and whose cgroup is
        empty); a template that cannot be cleaned is replaced."""
        with self._lock:
            if generation != self.generation or self.proc is None:
                return
            try:
                self._renew()
            except (_Broken, OSError) as exc:
                log.warning("warm start: replacing the template (%s)", exc)
                self.discard()

    def spawn(self, req_r: int, rep_w: int, out_w: int) -> Child:
        """A worker forked for one submission, in its own cgroup, waiting for its load request.
        A template that fails is replaced once; then TemplateUnavailable."""
        with self._lock:
            why = ""
            for _ in range(2):
                try:
                    return self._spawn((req_r, rep_w, out_w))
                except (_Broken, OSError) as exc:
                    why = str(exc)
                    log.warning("warm start: replacing the template (%s)%s", why,
                                f"; its output: {self.output()[-500:]}" if self.output() else "")
                    self.discard()
            raise TemplateUnavailable(why)
