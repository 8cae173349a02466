"""The warm start (autograder/isolation/warm.py): workers forked from one pre-imported template per job.

Cross-learner attacks: learner A's notebook (the reference, full marks, plus an attack at
its top level) is graded by a warm `Grader`; then the next worker forked from the same
template must see nothing of A (no process, no file), and learner B (the reference) must
get exactly the result B gets when graded alone by a fresh worker. Plus: the template
survives A's signals and traces, a stopped or killed template is replaced without costing
B anything, and every chapter's harness batch grades the same warm as cold
(AUTOGRADER_WARM_CHAPTERS=all runs every chapter; by default one).
"""

from __future__ import annotations

import errno
import os
import secrets
import signal

import pytest

from autograder.core.assignments import get_assignment
from autograder.grading.grader import Grader
from autograder.isolation import seccomp as S
from autograder.isolation import warm as W
from autograder.isolation.errors import WorkerDied
from autograder.isolation.remote import Learner
from autograder.isolation.runner import Submission
from autograder.isolation.sandbox import SandboxUnavailable, detect
from attacks.environment import Poison, cmdline, environ, planted_in
from conftest import add_cell, chapter_batch, reference_notebook, write

KEY = "03_qkv"
SEED = 1234
MARKER = f"warmleft{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def sandbox():
    try:
        sb = detect()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    if sb.cgroups is None:
        pytest.skip(f"no memory cgroup here ({sb.cgroup_problem}): the warm start is off")
    return sb


@pytest.fixture(scope="module")
def warm(sandbox, tmp_path_factory):
    """A warm Grader, whose template was started (and renewed after its first worker) by a grader whose
    own environment was planted with PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD and a sitecustomize.py in its
    working folder (tests/attacks/environment.py); `STARTED` keeps what reached the template."""
    g = Grader(get_assignment(KEY), sandbox=sandbox, warm=True)
    assert g.template is not None, g.warm_problem
    with pytest.MonkeyPatch.context() as mp:
        poison = Poison(tmp_path_factory.mktemp("warm") / "planted").apply(mp)
        _clean(_spy(g))  # starts the template, forks a worker, renews the template after it
        t = g.template
        STARTED.update(outer=environ(t.proc.pid), inner=environ(t.host_pid), argv=cmdline(t.host_pid),
                       output=t.output(), ran=poison.ran(), loaded=poison.loaded(t.output()),
                       renewals=len(t.renew_seconds))
    assert g.template.starts == 1
    assert g.template.hello["threads"] == 1  # no thread pool is copied by the forks
    yield g
    g.close()


STARTED: dict = {}


def test_the_template_and_its_clean_up_start_isolated_from_the_graders_environment(warm):
    """Did the template (both sides of bubblewrap) and the helper that renews it after each worker start
    without anything planted in the grader's environment, the template as `python -I`? A helper that got
    the missing library would have printed so, failed the renewal and cost the template."""
    assert not planted_in(STARTED["outer"]) and set(STARTED["outer"]) <= {"PATH", "PWD"}
    assert not planted_in(STARTED["inner"]) and "-I" in STARTED["argv"]
    assert STARTED["ran"] == [] and not STARTED["loaded"], STARTED["output"]
    assert STARTED["renewals"] >= 2 and warm.template.starts == 1  # at its start and after the first worker


def _summary(r):
    return r.status, r.score, [(c.name, c.passed, c.hint) for c in r.checks], r.error


@pytest.fixture(scope="module")
def alone(sandbox, tmp_path_factory):
    """Learner B (the reference), graded by a fresh worker: what B must get after any A."""
    path = write(reference_notebook(KEY), tmp_path_factory.mktemp("alone") / "b.ipynb")
    result = Grader(get_assignment(KEY), sandbox=sandbox).grade(path, seed=SEED)
    assert result.status == "graded" and result.score == result.max_score > 0
    return path, _summary(result)


SPY = '''
import os
def seen():
    """What a worker sees: every other process in its PID namespace and every writable place."""
    me = os.getpid()
    procs = {}
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != me:
            try:
                procs[p] = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
            except OSError as exc:
                procs[p] = f"? {exc}"
    mounts = [line.split()[1] for line in open("/proc/self/mounts")]
    files = {}
    for top in ("/tmp", "/dev/shm", os.environ["HOME"], os.getcwd()):
        found = []
        for folder, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in mounts]  # not into read-only binds
            found += [os.path.join(folder, n) for n in dirs + names]
        files[top] = sorted(found)
    writable = sorted({m for m in mounts if os.path.isdir(m) and os.access(m, os.W_OK)})  # not /dev/null
    return {"procs": procs, "files": files, "writable": writable}
'''


_FRESH: dict = {}


def _spy(grader) -> dict:
    """What a warm worker sees, and (as "fresh_files") what a worker started fresh in the same
    sandbox sees: the folders bubblewrap makes to hold its mounts (a Python installation under
    /tmp, say) are in both."""
    key = id(grader.sandbox)
    if key not in _FRESH:
        with Submission([{"label": "spy", "source": SPY}], sandbox=grader.sandbox) as sub:
            _FRESH[key] = Learner(sub).seen()["files"]
    with Submission([{"label": "spy", "source": SPY}], sandbox=grader.sandbox, template=grader.template) as sub:
        assert sub.template is not None
        seen = Learner(sub).seen()
        assert sub.generation == 1
    seen["fresh_files"] = _FRESH[key]
    return seen


def _clean(seen: dict) -> None:
    others = {p: cmd for p, cmd in seen["procs"].items() if not (p == "1" or "--template" in cmd)}
    assert others == {}, others  # only the namespace's init (bubblewrap) and the template
    assert all(MARKER not in cmd for cmd in seen["procs"].values())
    assert seen["files"] == seen["fresh_files"], (seen["files"], seen["fresh_files"])
    assert seen["writable"] == ["/dev/shm", "/tmp"]  # the places renewed after each worker are all there are


def _attacker(tmp_path, source: str):
    nb = reference_notebook(KEY)
    add_cell(nb, source.replace("MARKER", MARKER))
    return write(nb, tmp_path / "a.ipynb")


def _after(warm, alone, attacker):
    """Grade A, look with a spy, grade A again, then B: B's result must be B's alone."""
    starts = warm.template.starts
    a = warm.grade(attacker, seed=SEED)
    assert a.status == "graded", a.error
    _clean(_spy(warm))
    warm.grade(attacker, seed=SEED)
    b = warm.grade(alone[0], seed=SEED)
    assert _summary(b) == alone[1]
    return a, warm.template.starts - starts


# --- the worker's second seccomp filter, decision by decision (a BPF interpreter, both architectures) ---

@pytest.mark.parametrize("arch", [S.AUDIT_ARCH_X86_64, S.AUDIT_ARCH_AARCH64])
def test_child_filter_decisions(arch):
    prog, t = S.child_program([1, 2]), S.TABLES[arch]
    allow, eperm = S.SECCOMP_RET_ALLOW, S.SECCOMP_RET_ERRNO | errno.EPERM
    run = lambda name, *args: S.evaluate(prog, arch=arch, nr=t[name], args=args)  # noqa: E731
    for pid in (1, 2, -1, -2, 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFF00000002):
        assert run("kill", pid, 9) == eperm, pid
    for pid in (0, 3, 40, -3, -40):  # its own process group, its own processes and groups
        assert run("kill", pid, 9) == allow, pid
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open"):
        assert run(name, 2, 2, 9) == eperm and run(name, 7, 7, 9) == allow, name
    for name in ("tkill", "pidfd_send_signal", "shmget", "semget", "msgget", "mq_open"):
        assert run(name, 7, 9) == eperm, name
    for cmd in (S.F_SETOWN, S.F_SETSIG, S.F_SETOWN_EX):
        assert run("fcntl", 3, cmd, 2) == eperm
    assert run("fcntl", 3, 3) == allow and run("fcntl", 3, 4, 0o4000) == allow  # F_GETFL, F_SETFL
    assert run("ioctl", 3, S.FIOSETOWN) == eperm and run("ioctl", 3, 0x5401) == allow  # TCGETS
    assert run("clone", 0x01200011) == allow and run("clone", 0x3D0F00) == allow  # fork, a thread
    assert run("clone", 0x01200011 | S.CLONE_PARENT) == eperm
    # no Internet socket: the network namespace (its TIME_WAIT ports, its counters) is the next learner's too
    assert run("socket", 2, 1) == eperm and run("socket", 10, 2) == eperm and run("socket", 1, 1) == allow
    assert S.evaluate(prog, arch=arch, nr=t["clone3"]) == allow  # the first filter answers ENOSYS
    assert S.evaluate(prog, arch=0x40000003, nr=37) == S.SECCOMP_RET_KILL_PROCESS  # i386


# --- a process left behind ------------------------------------------------------------------

LEAVE = '''
import os, sys
DAEMON = """
import os, signal, sys, time
first = set(os.listdir("/proc"))
while True:  # plant a file, and kill every process that appeared after it started (the next worker)
    try:
        open("/tmp/planted-MARKER", "w").close()
    except OSError:
        pass
    for p in os.listdir("/proc"):
        if p.isdigit() and p not in first:
            try:
                os.kill(int(p), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.002)
"""
def _leave():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", DAEMON, "MARKER"])
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
_left = _leave()
'''


def test_a_process_left_behind_does_not_reach_the_next_learner(warm, alone, tmp_path):
    a, replaced = _after(warm, alone, _attacker(tmp_path, LEAVE))
    assert a.score == a.max_score  # the daemon lives as long as A's grading, and no longer
    assert replaced == 0


# --- files for the next learner -----------------------------------------------------------------

FILES = '''
import os
def _plant():
    for top in ("/tmp", "/dev/shm", os.environ["HOME"], os.getcwd()):
        with open(os.path.join(top, "planted-MARKER.py"), "w") as f:
            f.write("print('MARKER')")
    os.makedirs("/tmp/deep/er/MARKER", exist_ok=True)
    open("/tmp/deep/er/MARKER/x", "w").close()
    os.chmod("/tmp/deep/er", 0)      # unreadable, unwritable, still ours
    os.mkfifo("/tmp/fifo-MARKER")
    os.symlink("/grader", "/tmp/link-MARKER")
    os.symlink("/tmp/link-MARKER", "/dev/shm/.hidden-MARKER")
    with open("/dev/shm/big-MARKER", "wb") as f:
        f.write(b"x" * (8 << 20))
    return 1
_planted = _plant()
'''


def test_files_are_not_found_by_the_next_learner(warm, alone, tmp_path):
    a, replaced = _after(warm, alone, _attacker(tmp_path, FILES))
    assert a.score == a.max_score and replaced == 0


# --- the template: signals, traces, its memory ---------------------------------------------------

TEMPLATE_ATTACK = '''
import ctypes, errno, fcntl, os, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def _try(f):
    ctypes.set_errno(0)
    try:
        r = f()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    if isinstance(r, int) and r == -1:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    return "ok"
def _template():
    for p in os.listdir("/proc"):
        if p.isdigit() and b"--template" in open(f"/proc/{p}/cmdline", "rb").read():
            return int(p)
def attack():
    t = _template()
    L = ctypes.c_long
    r, w = os.pipe()
    out = {
        "template_found": t is not None,
        "kill_stop": _try(lambda: os.kill(t, signal.SIGSTOP)),
        "kill_kill": _try(lambda: os.kill(t, signal.SIGKILL)),
        "kill_init": _try(lambda: os.kill(1, signal.SIGKILL)),
        "kill_all": _try(lambda: os.kill(-1, signal.SIGKILL)),
        "killpg_template": _try(lambda: os.killpg(os.getpgid(t), signal.SIGKILL)),
        "tgkill": _try(lambda: libc.syscall(L(234), L(t), L(t), L(signal.SIGKILL))),
        "tkill": _try(lambda: libc.syscall(L(200), L(t), L(signal.SIGKILL))),
        "sigqueue": _try(lambda: libc.syscall(L(129), L(t), L(signal.SIGKILL), ctypes.create_string_buffer(128))),
        "pidfd_open": _try(lambda: os.pidfd_open(t)),
        "pidfd_proc_dir": _try(lambda: signal.pidfd_send_signal(os.open(f"/proc/{t}", os.O_RDONLY), signal.SIGKILL)),
        "f_setown": _try(lambda: fcntl.fcntl(r, fcntl.F_SETOWN, t)),
        "ptrace": _try(lambda: libc.ptrace(L(16), L(t), None, None)),
        "proc_mem": _try(lambda: open(f"/proc/{t}/mem", "rb").read(1)),
        "proc_environ": _try(lambda: open(f"/proc/{t}/environ", "rb").read()),
        "proc_fd": _try(lambda: os.listdir(f"/proc/{t}/fd")),
        "sysv_shm": _try(lambda: libc.shmget(L(0), L(4096), L(0o1666))),
    }
    child = subprocess.Popen(["sleep", "30"])  # an ordinary child of one's own can still be signalled
    out["own_child"] = _try(lambda: child.kill())
    child.wait()
    return out
_report = attack()
'''


def test_the_template_cannot_be_signalled_traced_or_read(warm, alone, tmp_path):
    source = TEMPLATE_ATTACK
    with Submission([{"label": "a", "source": source}], sandbox=warm.sandbox, template=warm.template) as sub:
        report = Learner(sub).attack()
    assert report.pop("template_found") is True and report.pop("own_child") == "ok"
    assert all(v != "ok" for v in report.values()), report
    assert report["proc_mem"] == "EACCES" and report["ptrace"] == "EPERM" and report["kill_stop"] == "EPERM"
    a, replaced = _after(warm, alone, _attacker(tmp_path, source))
    assert a.score == a.max_score and replaced == 0


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_stopped_or_killed_template_is_replaced_without_costing_the_learner(sandbox, alone, monkeypatch, sig):
    """If a signal reached the template anyway, the next spawn notices (a deadline, or the end of
    its socket), starts a fresh template, and B's grade and time budget are untouched."""
    monkeypatch.setattr(W, "SPAWN_SECONDS", 2.0)
    # B's whole budget is less than a template's restart plus the spawn deadline on this machine
    g = Grader(get_assignment(KEY), sandbox=sandbox, warm=True, overrides={"submission_seconds": 4.0})
    try:
        _clean(_spy(g))
        os.kill(g.template.host_pid, sig)
        b = g.grade(alone[0], seed=SEED)
        assert _summary(b) == alone[1]
        assert g.template.starts == 2
        _clean(_spy(g))
    finally:
        g.close()


ORPHANS = '''
import os, time
def leave_and_die():
    if os.fork() == 0:  # holds the reply pipe open
        time.sleep(60)
        os._exit(0)
    os._exit(3)
'''


def test_a_warm_worker_that_dies_is_reported_at_once_though_its_children_live_on(warm):
    """A fresh worker's PID namespace dies with it; a warm worker's children must not keep the
    call waiting for its whole time limit instead."""
    with Submission([{"label": "o", "source": ORPHANS}], sandbox=warm.sandbox, template=warm.template) as sub:
        with pytest.raises(WorkerDied):
            Learner(sub).leave_and_die()
        assert sub.proc is None
    _clean(_spy(warm))


# --- the same grades, warm or cold ---------------------------------------------------------------

CHAPTERS = os.environ.get("AUTOGRADER_WARM_CHAPTERS", KEY)


def _chapter_keys():
    from chapters import tables

    keys = list(tables())
    return keys if CHAPTERS == "all" else [k for k in CHAPTERS.split(",") if k in keys]


@pytest.mark.slow
@pytest.mark.parametrize("key", _chapter_keys())
def test_a_chapters_harness_batch_grades_the_same_warm_and_cold(sandbox, key, tmp_path):
    cold = Grader(get_assignment(key), sandbox=sandbox)
    with Grader(get_assignment(key), sandbox=sandbox, warm=True) as hot:
        for i, (student, make) in enumerate(chapter_batch(key).items()):
            path = write(make(), tmp_path / f"{student}.ipynb")
            want, got = cold.grade(path, seed=SEED + i), hot.grade(path, seed=SEED + i)
            assert _summary(got) == _summary(want), student
            assert got.notes == want.notes, student
        assert hot.template.starts == 1


# --- the trusted side's memory measurement reads the warm worker's own cgroup ----------------------

HOG = '''
import os
def small():
    return bytearray(1 << 20)[:1]
def big_in_child():
    pid = os.fork()
    if pid == 0:
        bytearray(300 << 20)
        os._exit(0)
    os.waitpid(pid, 0)
    return b"x"
'''


def test_memory_peak_reads_the_warm_workers_own_cgroup(warm):
    with Submission([{"label": "hog", "source": HOG}], sandbox=warm.sandbox, template=warm.template) as sub:
        learner = Learner(sub)
        small = learner.memory_peak("small")
        assert isinstance(sub.proc, W.Child) and sub._cgroup == sub.proc.cgroup != warm.template.cgroup
        assert small.source == "cgroup" and small.peak_bytes < 50 << 20
        big = learner.memory_peak("big_in_child")
        assert big.source == "cgroup" and big.peak_bytes > 0.9 * (300 << 20), big


# --- nothing passes from one learner to the next ----------------------------------------------------
#
# The template never reads anything a learner produced, and the trusted side gives every worker
# the same sandbox: new /tmp and /dev/shm mounts (not wiped ones), the same pid, no process that
# reaped the learner's orphans. Learner A tries to pass data to the next learner through every
# shared thing; learner B looks for it, and reports what it saw through its grade.

OBSERVE = r'''
import hashlib, os, re
def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return repr(exc).encode()
def _stat(pid, keep):
    fields = _read(f"/proc/{pid}/stat").decode(errors="replace").rsplit(")", 1)[-1].split()
    return [fields[i] for i in keep if i < len(fields)]
def observe():
    """Everything shared with the learner before that this worker can read without timing."""
    me = os.getpid()
    out = {"pid": me, "uid": os.getuid(), "cgroup": re.sub(r"[0-9a-f]{6,}", "X", _read("/proc/self/cgroup").decode())}
    for top in ("/tmp", "/dev/shm"):
        vfs, st = os.statvfs(top), os.stat(top)
        out[top] = [sorted(os.listdir(top)), vfs.f_bfree, vfs.f_ffree, st.st_mode, st.st_uid, st.st_nlink, st.st_size]
        path = os.path.join(top, ".observe")
        with open(path, "w") as f:
            out[top].append(os.fstat(f.fileno()).st_ino)  # tmpfs numbers its inodes in order of creation
        os.unlink(path)
    out["mounts"] = [" ".join(l.split()[4:]) for l in _read("/proc/self/mountinfo").decode().splitlines()]
    procs = sorted(p for p in os.listdir("/proc") if p.isdigit() and int(p) != me)
    out["procs"] = procs
    for p in procs:
        # faults, CPU times of the process and of its reaped children, threads, start time
        keep = range(7, 20) if p == "1" else (8, 10, 13, 14, 17, 19)  # the template's own CPU time runs
        out[f"stat {p}"] = _stat(p, keep)
        out[f"cmdline {p}"] = _read(f"/proc/{p}/cmdline").decode(errors="replace")
    out["init"] = [_read("/proc/1/schedstat"), [l for l in _read("/proc/1/status").decode().splitlines() if "ctxt" in l]]
    out["init"][0] = out["init"][0].decode(errors="replace")
    for name in ("snmp", "netstat", "dev", "tcp", "tcp6", "udp", "udp6", "unix", "raw"):
        out["net " + name] = hashlib.sha256(_read(f"/proc/net/{name}")).hexdigest()
    for name in ("shm", "sem", "msg"):
        out["sysv " + name] = _read(f"/proc/sysvipc/{name}").decode(errors="replace")
    return out
def fingerprint():
    return hashlib.sha256(repr(observe()).encode()).hexdigest()
'''

PASS_ON = r'''
import ctypes, os, socket, time
def pass_on(secret=0b1011011):
    made = []
    for top in ("/tmp", "/dev/shm"):              # names, contents, sizes, inode counts, folder times
        for i in range(secret):
            with open(os.path.join(top, f"bit{i}-MARKER"), "w") as f:
                f.write("MARKER" * i)
        os.makedirs(os.path.join(top, "d", *["MARKER"] * 20), exist_ok=True)
        for i in range(500):
            os.link(os.path.join(top, "bit1-MARKER"), os.path.join(top, f"link{i}"))
            os.unlink(os.path.join(top, f"link{i}"))  # the inode numbers go on counting
    for i in range(secret):                       # pids handed out in the namespace
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    pid = os.fork()                               # an orphan that burns CPU, reaped by someone else
    if pid == 0:
        if os.fork() == 0:
            end = time.process_time() + 0.2
            while time.process_time() < end:
                pass
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
    tried = {}
    for name, make in (("tcp", lambda: socket.socket()), ("udp", lambda: socket.socket(type=socket.SOCK_DGRAM)),
                       ("tcp6", lambda: socket.socket(socket.AF_INET6))):
        try:
            s = make()
            s.bind(("127.0.0.1" if s.family == socket.AF_INET else "::1", 40000 + secret))
            tried[name] = "ok"
        except OSError as exc:
            tried[name] = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    tried["shm"] = libc.shmget(0, 4096, 0o1666)
    return tried
_tried = pass_on()
'''


def _observe(grader) -> dict:
    with Submission([{"label": "observe", "source": OBSERVE}], sandbox=grader.sandbox, template=grader.template) as sub:
        return Learner(sub).observe()


def _fingerprint(grader) -> str:
    with Submission([{"label": "observe", "source": OBSERVE}], sandbox=grader.sandbox, template=grader.template) as sub:
        return Learner(sub).fingerprint()


def _b_that_looks(expected: str):
    """The reference, plus a first cell that looks at the sandbox before anything else runs and,
    if it differs from what a worker sees after an honest learner, breaks every function."""
    import nbformat

    nb = reference_notebook(KEY)
    nb.cells.insert(0, nbformat.v4.new_code_cell(OBSERVE + "\n_seen = fingerprint()\n"))
    add_cell(nb, f'''
def _broken(*args, **kwargs):
    raise ValueError("this worker saw what the learner before left")
_names = [n for n, v in list(globals().items()) if callable(v) and getattr(v, "__module__", "") == "__learner__"
          and not n.startswith("_")]
_ = [globals().__setitem__(n, _broken) for n in _names] if _seen != {expected!r} else None
''')
    return nb


def test_a_learner_cannot_pass_anything_to_the_next_through_the_sandbox(warm, alone, tmp_path):
    honest = write(reference_notebook(KEY), tmp_path / "honest.ipynb")
    warm.grade(honest, seed=SEED)
    base = _observe(warm)
    # empty but for the folders that hold the sandbox's own mounts (a Python installation under /tmp)
    own = {top: sorted({p[len(top) + 1:].split("/")[0] for p in warm.template.keep[top]}) for top in ("/tmp", "/dev/shm")}
    assert base["pid"] == warm.template.hello["pid"] + 1 and base["/tmp"][0] == own["/tmp"] \
        and base["/dev/shm"][0] == own["/dev/shm"]
    expected = _fingerprint(warm)
    assert _observe(warm) == base  # the same after any honest worker

    starts = warm.template.starts
    attacker = _attacker(tmp_path, PASS_ON)
    a = warm.grade(attacker, seed=SEED)
    assert a.status == "graded" and a.score == a.max_score, a
    after = _observe(warm)
    assert after == base, {k: (base.get(k), v) for k, v in after.items() if base.get(k) != v}

    # the same, seen by a learner through its grade: B's points do not depend on A
    b = write(_b_that_looks(expected), tmp_path / "b.ipynb")
    assert _summary(warm.grade(b, seed=SEED)) == alone[1]  # after an honest worker (the observation above)
    warm.grade(attacker, seed=SEED)
    assert _summary(warm.grade(b, seed=SEED)) == alone[1]
    assert warm.template.starts == starts  # no restart was needed, nor forced

    # and the check can fail: a B that finds what A left (here, told to expect another sandbox) loses points
    fooled = write(_b_that_looks("0" * 64), tmp_path / "fooled.ipynb")
    r = warm.grade(fooled, seed=SEED)
    assert r.score == 0 and "saw what the learner before left" in " ".join(c.hint for c in r.checks)


def test_the_internet_sockets_a_learner_tries_are_refused_in_a_warm_worker(warm):
    with Submission([{"label": "a", "source": PASS_ON.replace("MARKER", MARKER)}], sandbox=warm.sandbox,
                    template=warm.template) as sub:
        tried = Learner(sub).pass_on(3)
    assert tried == {"tcp": errno.EPERM, "udp": errno.EPERM, "tcp6": errno.EPERM, "shm": -1}, tried


# --- the template's memory holds nothing of a learner ----------------------------------------------

LEAVE_NAMES = '''
import os
def leave():
    for top in ("/tmp", "/dev/shm"):
        for i in range(3000):  # more names than the next worker's own start-up reuses the memory of
            open(os.path.join(top, f"xk7left-SECRET-{i}"), "w").close()
        os.makedirs(os.path.join(top, "xk7left-SECRET-dir", "xk7left-SECRET-sub"), exist_ok=True)
    return 1
_left = leave()
'''

SEARCH_MEMORY = r'''
import ctypes, hashlib, os, re
def search(digest, own):
    """How many strings xk7left-<32 hex> in this process's writable memory hash to `digest`, how
    many to `own` (a name this worker listed itself: the search works), and how many bytes were read.
    A forked worker is not dumpable, so /proc/self/mem is closed to it: the kernel copies each
    region into a memfd instead (a region unmapped meanwhile fails with EFAULT, not a crash)."""
    open(os.path.join("/tmp", "xk7left-" + own), "w").close()
    listed = os.listdir("/tmp")
    os.unlink(os.path.join("/tmp", "xk7left-" + own))
    own = hashlib.sha256(own.encode()).hexdigest()
    pattern = re.compile(rb"xk7left-([0-9a-f]{32})")
    found = {digest: 0, own: 0}
    scanned, step = 0, 4 << 20
    fd = os.memfd_create("scan")
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        if fields[1][:2] != "rw" or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        for start in range(lo, hi, step):
            try:
                n = os.pwrite(fd, (ctypes.c_char * min(step + 64, hi - start)).from_address(start), 0)
            except OSError:
                continue
            chunk = os.pread(fd, n, 0)
            scanned += n
            for m in pattern.finditer(chunk):
                h = hashlib.sha256(m.group(1)).hexdigest()
                if h in found:
                    found[h] += 1
    os.close(fd)
    return [found[digest], found[own], scanned, sum(n.startswith("xk7left-") for n in listed)]
'''


def test_the_template_never_holds_a_name_a_learner_left(warm):
    """A leaves files and folders whose names carry a random marker; the next worker forked from
    the same template searches its own memory (a copy of the template's) for the marker."""
    import hashlib

    secret, own = secrets.token_hex(16), secrets.token_hex(16)
    with Submission([{"label": "a", "source": LEAVE_NAMES.replace("SECRET", secret)}], sandbox=warm.sandbox,
                    template=warm.template) as sub:
        assert Learner(sub).leave() == 1
    generation = warm.template.generation
    with Submission([{"label": "b", "source": SEARCH_MEMORY}], sandbox=warm.sandbox, template=warm.template) as sub:
        found, control, scanned, listed = Learner(sub).search(hashlib.sha256(secret.encode()).hexdigest(), own)
    assert warm.template.generation == generation  # forked from the template A's worker came from
    assert control >= 1 and scanned > 20 << 20 and listed == 1  # the search sees a name in the heap
    assert found == 0


# --- a learner who fills /tmp pays for the clean-up, and the next learner does not ------------------

FILL = '''
import os
def _fill():
    n = 0
    for top in ("/tmp", "/dev/shm"):
        for i in range(5):                     # data up to the tmpfs's size (64 MiB, files of 16 MiB at most)
            try:
                with open(os.path.join(top, f"data{i}"), "wb") as f:
                    f.write(b"x" * (16 << 20))
            except OSError:
                break
        folder = top
        for i in range(100):                   # deeper than anything walks
            folder = os.path.join(folder, "d")
            os.mkdir(folder)
        for i in range(10000):                 # inodes: kernel memory, not counted in the 64 MiB
            os.close(os.open(os.path.join(top, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o600))
            n += 1
        os.chmod(os.path.join(top, "d"), 0)
    return n
_n = _fill()
'''


def test_a_learner_who_fills_tmp_is_cleaned_up_after_in_its_own_time(warm, alone, tmp_path):
    """The clean-up after A happens while A is graded (so it is in A's seconds), and the next
    spawn has nothing left to clean: B's budget never pays for it, and no template is replaced."""
    starts, renewals = warm.template.starts, warm.template.renew_seconds
    n = len(renewals)
    a = warm.grade(_attacker(tmp_path, FILL), seed=SEED)
    assert a.status == "graded" and a.score == a.max_score, a
    assert len(renewals) == n + 1  # during A's grading, after A's worker ended
    _clean(_spy(warm))
    b = warm.grade(alone[0], seed=SEED)
    assert _summary(b) == alone[1]
    assert len(renewals) == n + 3 and warm.template.starts == starts  # one after each worker, nothing more
