"""The warm start's template, inside the sandbox: import once, then fork one worker per submission.

Started as ``python -I /grader/worker.py --template CTRL_FD`` (worker.py hands over to
`template_main`), in the sandbox exactly as a worker is. It imports NumPy and PyTorch and runs
the worker's one-time set-up once, makes itself non-dumpable and the reaper of its workers'
orphans, and then, for each submission, forks a worker on the three pipes the trusted side
passed over CTRL_FD. Each forked worker starts a session of its own, keeps only its pipes,
loads a second seccomp filter (`seccomp.child_program`: nothing it does can reach the
template) and runs the worker's `main`.

The template never runs learner code, and never reads what learner code left behind: the
trusted side (`autograder.isolation.warm`) cleans the sandbox's writable folders from outside.

This file runs inside the sandbox, beside worker.py, and is found there as worker.py finds its
other files (see `autograder.isolation.worker_files`); it depends on the standard library, NumPy,
PyTorch and the `seccomp` file beside it, and on nothing of the worker but the two functions
worker.py passes to `template_main`.
"""

from __future__ import annotations

import os
import sys
import traceback

PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 4, 22, 36, 38, 2


def _prctl(*args) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _load_filter(prog: bytes) -> None:
    import ctypes

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)


def _shared_writable_mappings() -> int:
    """Writable shared mappings would be shared with every forked worker: there must be none."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            perms = line.split()[1]
            if perms[1] == "w" and perms[3] == "s":
                n += 1
    return n


def _child(fds: list[int], ctrl, prog: bytes, serve) -> None:
    """In the forked worker: become the submission's worker on the passed pipes (`serve`, the
    worker's `main`). Never returns."""
    import signal

    code = 70
    try:
        os.setsid()  # its own session and process group: kill(0) and killpg reach only its own
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        req_fd, reply_fd, out_fd = fds
        ctrl.close()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = {0, 1, 2, req_fd, reply_fd}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.chdir("/tmp")
        _load_filter(prog)
        code = serve([sys.argv[0], str(req_fd), str(reply_fd)])
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code if isinstance(code, int) else 70)


def template_main(ctrl_fd: int, *, preload, serve) -> int:
    """The warm start's template: import once, then fork one worker per request on CTRL_FD.

    `preload` and `serve` are the worker's (worker.py, the script that was started): its one-time
    set-up, run here before any fork, and its `main`, run in each forked worker.

    Messages are JSON on a SOCK_SEQPACKET socket. The trusted side sends ``{"op": "spawn"}``
    with three descriptors (requests, replies, output); the template forks and answers
    ``{"pid"}``, the worker's pid in the sandbox.

    The template never reads or holds anything a learner produced: it looks at no file,
    folder or process a worker could have touched, and the only message it reads is the
    trusted side's. What a learner leaves behind is removed from outside (`autograder.isolation.warm`):
    the trusted side replaces /tmp and /dev/shm with new empty tmpfs mounts and resets the
    PID namespace's last pid before each fork. So the template's memory, and every worker
    forked from it, is the same whatever the learners before did."""
    import json
    import signal
    import socket
    import time

    import numpy as np
    import torch

    preload()  # its lazy set-up too, once, before any fork: not again in every learner's worker
    torch.ones(8, 8) @ torch.ones(8, 8), np.ones(8) @ np.ones(8)
    import seccomp as S

    _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/PID/mem, environ and ptrace of us need CAP_SYS_PTRACE now
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    # A learner's orphans come to us, not to the namespace's init, and are reaped by the kernel
    # at once (SIGCHLD ignored): no process's counters (the CPU time of reaped children, context
    # switches) keep a trace of what a learner ran, for the next one to read in /proc.
    _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Hold nothing of /tmp (bubblewrap started us there): the trusted side unmounts it after
    # every worker, which a process whose working folder it is would keep busy.
    os.chdir("/")
    me = os.getpid()
    prog = S.child_program(sorted({1, me, os.getpgid(0), os.getsid(0)}))
    ctrl = socket.socket(fileno=ctrl_fd)
    hello = {"ready": True, "pid": me, "threads": len(os.listdir("/proc/self/task")),
             "shared": _shared_writable_mappings()}
    ctrl.send(json.dumps(hello).encode())
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 3)
        except OSError:
            return 1
        if not msg:
            return 0
        try:
            req = json.loads(msg)
        except ValueError:
            req = None
        if not isinstance(req, dict) or req.get("op") != "spawn" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            ctrl.send(json.dumps({"error": "bad request"}).encode())
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = -1
        for attempt in range(50):
            try:
                pid = os.fork()
                break
            except BlockingIOError:
                # EAGAIN: the previous worker's processes are dead but not all reaped yet, and
                # they still count against the uid's process limit
                time.sleep(0.02 * (attempt + 1))
        if pid == 0:
            _child(fds, ctrl, prog, serve)
        for fd in fds:
            os.close(fd)
        ctrl.send(json.dumps({"pid": pid} if pid > 0 else {"error": "fork failed"}).encode())
