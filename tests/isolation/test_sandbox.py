"""The sandbox itself: what a worker can see and do inside it (fast: no torch import).

Also its kernel-facing limits: the seccomp filter (no nested namespaces, mounts, keyrings,
ptrace, bpf...), one uid per worker, and the per-worker memory cgroup (tmpfs included).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.core.assignments import ROOT
from autograder.core.limits import DEFAULT
from autograder.isolation import seccomp
from autograder.isolation.cgroups import MemoryCgroups, cgroup_dirs
from autograder.isolation.errors import LearnerError, WorkerDied
from autograder.isolation.remote import Learner
from autograder.isolation.runner import Submission
from autograder.isolation.sandbox import Sandbox, detect
from autograder.isolation.uids import RESERVED_UIDS, SANDBOX_UIDS, UidPool

MAX_FILE_SIZE, MAX_PROCESSES, TMP_BYTES = (DEFAULT.sandbox_file_size, DEFAULT.sandbox_processes,
                                           DEFAULT.sandbox_tmp_bytes)
from attacks.environment import Poison, cmdline, environ, planted_in
from conftest import learner_notebook, run_cli, wait_until, write

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

PROBE = r'''
import os, sys, json, socket
def probe():
    out = {"uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"), "environ": sorted(os.environ),
           "isolated": sys.flags.isolated}
    def tryit(key, fn):
        try:
            out[key] = fn()
        except BaseException as e:
            out[key] = "ERR " + type(e).__name__
    tryit("solutions_import", lambda: __import__("solutions").__file__)
    tryit("autograder_import", lambda: __import__("autograder").__file__)
    tryit("repo", lambda: os.listdir(REPO))
    tryit("hidden", lambda: open(REPO + "/autograder/hidden/test_03_qkv.py").read(20))
    tryit("shadow", lambda: open("/etc/shadow").read(5))
    tryit("write_usr", lambda: open("/usr/pwned", "w").write("x"))
    tryit("write_root", lambda: open("/pwned", "w").write("x"))
    tryit("write_tmp", lambda: open("/tmp/ok", "w").write("x"))
    tryit("net", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2) and "connected")
    tryit("visible_root", lambda: sorted(os.listdir("/")))
    tryit("submission", lambda: os.listdir("/submission"))
    def big():
        with open("/tmp/big", "wb") as f:
            for _ in range(64):
                f.write(b"0" * 2**20)
        return "wrote"
    tryit("fsize", big)
    def forks():
        pids = []
        try:
            for _ in range(10 * MAXP):
                pid = os.fork()
                if pid == 0:
                    import time; time.sleep(30); os._exit(0)
                pids.append(pid)
        except OSError as e:
            return len(pids)
        return len(pids)
    tryit("forks", forks)
    return json.dumps(out)
'''


def _code(src: str) -> list[dict]:
    return [{"label": "cell 1", "source": src}]


@pytest.fixture(scope="module")
def sandbox():
    return detect()


def _worker_below(root: int) -> int:
    """The host pid of the sandboxed worker's Python started below `root`: the topmost process that
    runs /grader/worker.py (the processes it forked run it too)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_bytes()
                parents[int(d.name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError):
                continue

    def below(pid):
        while pid in parents and pid != root:
            pid = parents[pid]
        return pid == root

    runs = {pid for pid in parents if below(pid) and "/grader/worker.py" in cmdline(pid)}
    (top,) = [pid for pid in runs if parents[pid] not in runs]
    return top


@pytest.fixture(scope="module")
def probe(sandbox, tmp_path_factory):
    """What a sandboxed worker sees, started by a grader whose own environment was planted with
    PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD and a sitecustomize.py in its working folder (tests/attacks/
    environment.py): `started` says what reached the worker's processes on both sides of bubblewrap."""
    import json

    base = tmp_path_factory.mktemp("sb")
    nb = write(learner_notebook("03_qkv"), base / "mine.ipynb")
    src = f"REPO = {str(ROOT)!r}\nMAXP = {MAX_PROCESSES}\n" + PROBE
    with pytest.MonkeyPatch.context() as mp:
        poison = Poison(base / "planted").apply(mp)
        with Submission(_code(src), sandbox=sandbox, notebook=nb,
                        limits=DEFAULT.replace(submission_seconds=60)) as sub:
            out = json.loads(Learner(sub).probe())
            inner = _worker_below(sub.proc.pid)
            out["started"] = {"outer": sorted(environ(sub.proc.pid)), "inner": sorted(environ(inner)),
                              "inner_argv": cmdline(inner)}
        out["started"]["output"] = "".join(sub.outputs)
        out["started"]["ran"] = poison.ran()
        out["started"]["loaded"] = poison.loaded(out["started"]["output"])
    return out


def test_the_worker_starts_isolated_from_the_graders_environment(probe):
    """Do PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD and a sitecustomize.py in the grader's working folder
    reach neither the sandbox's first process (outside, root's) nor the worker (inside), which runs
    `python -I`?"""
    started = probe["started"]
    assert set(started["outer"]) <= {"PATH", "PWD"}  # bubblewrap's, as the `sh` before it left it
    assert not planted_in(dict.fromkeys(started["inner"])) and "-I" in started["inner_argv"]
    assert started["ran"] == [] and not started["loaded"], started
    assert probe["isolated"] == 1 and not planted_in(dict.fromkeys(probe["environ"]))


def test_runs_as_the_sandbox_uid(probe):
    if os.geteuid() == 0:
        assert probe["uid"] in SANDBOX_UIDS and probe["uid"] not in RESERVED_UIDS
    assert probe["cwd"] == "/tmp" and probe["home"] == "/tmp"


def test_repository_is_invisible(probe):
    assert probe["solutions_import"].startswith("ERR")
    assert probe["autograder_import"].startswith("ERR")
    # Either the repository is absent, or only its .venv (bound read-only) is there.
    repo = probe["repo"]
    assert (isinstance(repo, str) and repo.startswith("ERR")) or (
        isinstance(repo, list) and ".venv" in repo and "solutions" not in repo and "autograder" not in repo)
    assert probe["hidden"].startswith("ERR")
    assert probe["shadow"].startswith("ERR")


def test_only_tmp_is_writable(probe):
    assert probe["write_usr"].startswith("ERR") and probe["write_root"].startswith("ERR")
    assert probe["write_tmp"] == 1


def test_no_network(probe):
    assert probe["net"].startswith("ERR")


def test_only_own_notebook_is_visible(probe):
    assert probe["submission"] == ["mine.ipynb"]
    # Only the Python environment's own folders are bound (here the venv may live under /work).
    allowed = {Path(p).resolve().parts[1] for p in (sys.prefix, sys.base_prefix, sys.executable)}
    assert not ({"work", "home", "root", "srv"} - allowed) & set(probe["visible_root"])


def test_file_size_and_processes_are_capped(probe):
    assert probe["fsize"] == "ERR OSError"  # EFBIG at MAX_FILE_SIZE
    assert MAX_FILE_SIZE < TMP_BYTES
    if os.geteuid() == 0:
        assert probe["forks"] < MAX_PROCESSES


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (exited, or a zombie waiting for its parent)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def _uids_running() -> set[int]:
    out = subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
    return {int(u) for u in out}


def test_call_timeout_and_kill(sandbox):
    src = ("import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ndef whoami():\n    return os.getuid()\n"
           "def spin():\n    if os.fork() == 0:\n        os.setsid()\n    while True:\n        pass\n")
    with Submission(_code(src), sandbox=sandbox,
                    limits=DEFAULT.replace(call_seconds=2, submission_seconds=30)) as sub:
        uid = Learner(sub).whoami()
        t = time.monotonic()
        with pytest.raises(Exception) as info:
            Learner(sub).spin()
        assert "timed out" in str(info.value)
        # the call's limit (2 s) ended it, not the submission's (30 s), however slow the machine
        assert time.monotonic() - t < 20
    # Other graders may run workers at the same time, with other uids of SANDBOX_UIDS: look for this one's.
    if os.geteuid() == 0:
        assert wait_until(lambda: uid not in _uids_running()), f"a process of uid {uid} outlived its worker"


def test_learner_error_crosses_as_data(sandbox):
    with Submission(_code("def f():\n    raise ValueError('nope')\n"), sandbox=sandbox) as sub:
        with pytest.raises(LearnerError, match="nope"):
            Learner(sub).f()


def test_python_installation_containing_the_repo_is_refused(tmp_path):
    from autograder.isolation.sandbox import SandboxUnavailable

    sb = Sandbox.__new__(Sandbox)
    sb.binds = [str(ROOT.parent)]
    with pytest.raises(SandboxUnavailable, match="would expose"):
        sb.check_binds([ROOT])


@pytest.mark.slow
def test_grade_refuses_without_bubblewrap(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    env_path = os.path.dirname(sys.executable)  # no /usr/bin: no bwrap
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(nb), "--assignment", "03_qkv",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PATH=env_path), timeout=120)
    assert proc.returncode == 2
    assert "--no-sandbox" in proc.stderr and "apt-get install -y bubblewrap" in proc.stderr
    assert not (tmp_path / "out" / "gradebook.db").exists()


@pytest.mark.slow
def test_no_sandbox_grades_with_a_warning(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    proc = run_cli("grade", str(nb), "--assignment", "03_qkv", "--out", str(tmp_path / "out"), "--no-sandbox")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --no-sandbox" in proc.stderr
    assert re.search(r"\ba: 0 / \d+", proc.stderr), proc.stderr


def test_check_says_it_is_unsandboxed(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    proc = run_cli("check", str(nb))
    assert "without a sandbox" in proc.stdout


# --- the seccomp filter ------------------------------------------------------------------------

def _header_table(path: str) -> dict[str, int]:
    table = {}
    for m in re.finditer(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", Path(path).read_text(), re.M):
        table[m.group(1)] = int(m.group(2))
    return table


@pytest.mark.parametrize("header,table", [
    ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", seccomp.X86_64),
    ("/usr/include/asm-generic/unistd.h", seccomp.AARCH64),
])
def test_syscall_tables_match_the_kernel_headers(header, table):
    """Are the hard-coded numbers those of the kernel's headers (where this machine has them)?"""
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed")
    known = _header_table(header)
    checked = [name for name in table if name in known]
    assert len(checked) >= len(table) - 2  # only calls newer than the headers (open_tree_attr) are missing
    assert {n: table[n] for n in checked} == {n: known[n] for n in checked}
    for name in seccomp.blocked_names():  # a call that exists on this arch is in its table
        if name in known:
            assert name in table, name


@pytest.mark.parametrize("arch", [seccomp.AUDIT_ARCH_X86_64, seccomp.AUDIT_ARCH_AARCH64])
def test_filter_decisions(arch):
    """What the filter returns for each kind of call, on both architectures (a BPF interpreter)."""
    prog, t = seccomp.program(), seccomp.TABLES[arch]
    allow, eperm = seccomp.SECCOMP_RET_ALLOW, seccomp.SECCOMP_RET_ERRNO | errno.EPERM
    run = lambda name, *args: seccomp.evaluate(prog, arch=arch, nr=t[name], args=args)  # noqa: E731
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    for name in seccomp.blocked_names():
        if name in t:
            assert run(name) == eperm, name
    assert run("clone3") == seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS
    thread_flags, fork_flags, vfork_flags = 0x3D0F00, 0x01200011, 0x4111
    for flags in (thread_flags, fork_flags, vfork_flags, 0xFFFFFFFF00000011):  # high bits are ignored by the kernel
        assert run("clone", flags) == allow, hex(flags)
    for bit in (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80):
        assert run("clone", fork_flags | bit) == eperm, hex(bit)
    assert run("personality", 0xFFFFFFFF) == allow and run("personality", 0) == allow
    assert run("personality", 0x0040000) == eperm  # ADDR_NO_RANDOMIZE
    for other in (0, 1, 39, 59, 200):  # read, write, getpid, execve... are allowed
        if other not in t.values():
            assert seccomp.evaluate(prog, arch=arch, nr=other) == allow
    if arch == seccomp.AUDIT_ARCH_X86_64:
        assert seccomp.evaluate(prog, arch=arch, nr=0x40000000 + 39) == eperm  # the x32 ABI
    assert seccomp.evaluate(prog, arch=0x40000003, nr=1) == seccomp.SECCOMP_RET_KILL_PROCESS  # i386
    assert seccomp.evaluate(prog, arch=0xC00000B7 ^ 0x80000000, nr=1) == seccomp.SECCOMP_RET_KILL_PROCESS


KERNEL_PROBE = r'''
import ctypes, errno, json, os, subprocess, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def sysc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *[L(a) if isinstance(a, int) else a for a in args])
    return "ok" if r >= 0 else err()
def raw_clone(flags):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR["clone"]), L(flags | 17), L(0), L(0), L(0), L(0))
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return "ok"
    return err()
def probe():
    out = {}
    def tryit(key, fn):
        try:
            out[key] = fn()
        except BaseException as e:
            out[key] = "ERR " + type(e).__name__ + " " + str(e)[:80]
    NEWUSER, NEWNS = 0x10000000, 0x20000
    tryit("unshare_user", lambda: (libc.unshare(NEWUSER), err())[1])
    tryit("unshare_user_mount", lambda: (libc.unshare(NEWUSER | NEWNS), err())[1])
    tryit("unshare_net", lambda: (libc.unshare(0x40000000), err())[1])
    if hasattr(os, "unshare"):
        tryit("os_unshare", lambda: os.unshare(os.CLONE_NEWUSER))
    def cmd(*a):
        p = subprocess.run(list(a), capture_output=True, text=True, timeout=20)
        return [p.returncode, (p.stderr or p.stdout).strip()[-120:]]
    tryit("unshare_cmd", lambda: cmd("unshare", "-Ur", "true"))
    tryit("unshare_mount_tmpfs_cmd", lambda: cmd("unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=6g none /tmp"))
    tryit("mount_tmpfs_cmd", lambda: cmd("mount", "-t", "tmpfs", "none", "/tmp"))
    os.makedirs("/tmp/m", exist_ok=True)
    tryit("mount", lambda: (libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None), err())[1])
    tryit("fsopen", lambda: sysc(NR["fsopen"], b"tmpfs", 0))
    tryit("open_tree_attr", lambda: sysc(NR["open_tree_attr"], -1, None, 0, None, 0))
    tryit("clone_newuser", lambda: raw_clone(NEWUSER))
    tryit("clone_newns", lambda: raw_clone(NEWNS))
    tryit("clone_plain", lambda: raw_clone(0))
    tryit("clone3", lambda: sysc(NR["clone3"], None, 0))
    fd = os.open("/proc/self/ns/user", os.O_RDONLY)
    tryit("setns", lambda: sysc(NR["setns"], fd, 0))
    tryit("keyctl_session", lambda: sysc(NR["keyctl"], 0, -3, 0))
    tryit("keyctl_user", lambda: sysc(NR["keyctl"], 0, -4, 0))
    tryit("add_key", lambda: sysc(NR["add_key"], b"user", b"planted", b"x", 1, -4))
    tryit("request_key", lambda: sysc(NR["request_key"], b"user", b"planted", None, 0))
    tryit("proc_keys", lambda: open("/proc/keys").read()[:200])
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    tryit("ptrace_attach", lambda: sysc(NR["ptrace"], 16, child, 0, 0))
    tryit("ptrace_traceme", lambda: sysc(NR["ptrace"], 0, 0, 0, 0))
    tryit("process_vm_readv", lambda: sysc(NR["process_vm_readv"], child, None, 0, None, 0, 0))
    os.kill(child, 9)
    os.waitpid(child, 0)
    tryit("bpf", lambda: sysc(NR["bpf"], 0, None, 0))
    tryit("perf_event_open", lambda: sysc(NR["perf_event_open"], None, 0, -1, -1, 0))
    tryit("userfaultfd", lambda: sysc(NR["userfaultfd"], 0))
    tryit("io_uring_setup", lambda: sysc(NR["io_uring_setup"], 1, None))
    tryit("personality_query", lambda: sysc(NR["personality"], 0xFFFFFFFF))
    tryit("personality_norandom", lambda: sysc(NR["personality"], 0x0040000))
    if "iopl" in NR:
        tryit("x32", lambda: sysc(0x40000000 + 39))
    # what learner code does need
    def threads():
        res = []
        ts = [threading.Thread(target=lambda i=i: res.append(i * i)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        return sorted(res)
    tryit("threads", threads)
    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitpid(pid, 0)[1] >> 8
    tryit("fork", fork)
    tryit("subprocess", lambda: subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                                               text=True, timeout=30).stdout.strip())
    def pool(kind):
        import multiprocessing as mp
        with mp.get_context(kind).Pool(2) as p:
            return p.map(abs, [-1, -2, -3])
    tryit("pool_fork", lambda: pool("fork"))
    tryit("pool_spawn", lambda: pool("spawn"))
    st = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    out["seccomp_mode"] = st["Seccomp"].strip()
    out["no_new_privs"] = st["NoNewPrivs"].strip()
    out["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()
    out["uid"] = os.getuid()
    return json.dumps(out)
'''


@pytest.fixture(scope="module")
def kernel(sandbox):
    nrs = seccomp.TABLES[seccomp.host_arch()]
    src = f"NR = {nrs!r}\n" + KERNEL_PROBE
    with Submission(_code(src), sandbox=sandbox, limits=DEFAULT.replace(submission_seconds=90, call_seconds=60)) as sub:
        return json.loads(Learner(sub).probe())


def test_the_filter_is_loaded(kernel):
    assert kernel["seccomp_mode"] == "2" and kernel["no_new_privs"] == "1"


def test_nested_namespaces_and_mounts_fail(kernel):
    for key in ("unshare_user", "unshare_user_mount", "unshare_net", "clone_newuser", "clone_newns", "setns",
                "fsopen", "open_tree_attr", "mount"):
        assert kernel[key] == "EPERM", (key, kernel[key])
    if "os_unshare" in kernel:
        assert kernel["os_unshare"].startswith("ERR PermissionError")
    for key in ("unshare_cmd", "unshare_mount_tmpfs_cmd", "mount_tmpfs_cmd"):
        rc, why = kernel[key]
        assert rc != 0 and ("not permitted" in why or "superuser" in why or "denied" in why), (key, why)
    assert kernel["clone3"] == "ENOSYS"


def test_keyrings_are_out_of_reach(kernel):
    for key in ("keyctl_session", "keyctl_user", "add_key", "request_key"):
        assert kernel[key] == "EPERM", (key, kernel[key])
    assert kernel["proc_keys"].startswith("ERR") or kernel["proc_keys"] == ""


def test_tracing_bpf_and_the_rest_fail(kernel):
    for key in ("ptrace_attach", "ptrace_traceme", "process_vm_readv", "bpf", "perf_event_open", "userfaultfd",
                "io_uring_setup", "personality_norandom"):
        assert kernel[key] == "EPERM", (key, kernel[key])
    if "x32" in kernel:
        assert kernel["x32"] == "EPERM"


def test_processes_and_threads_still_work(kernel):
    assert kernel["threads"] == [0, 1, 4, 9]
    assert kernel["fork"] == 7 and kernel["clone_plain"] == "ok"
    assert kernel["subprocess"] == "42"
    assert kernel["pool_fork"] == [1, 2, 3] and kernel["pool_spawn"] == [1, 2, 3]
    assert kernel["personality_query"] == "ok"


def test_the_worker_is_the_oom_killers_first_choice(kernel):
    assert kernel["oom_score_adj"] == "1000"


# --- keyrings and uids ---------------------------------------------------------------------------

KEYCTL_JOIN_SESSION_KEYRING, KEY_SPEC_SESSION_KEYRING = 1, -3


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def test_the_graders_session_keyring_is_out_of_reach(sandbox):
    """A grader running inside a session keyring with a secret key: the learner cannot read or list it."""
    ctypes, libc = _libc()
    nr = seccomp.TABLES[seccomp.host_arch()]
    L = ctypes.c_long
    if libc.syscall(L(nr["keyctl"]), L(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_char_p(b"autograder-test")) < 0:
        pytest.skip("keyrings are not available here")
    secret = b"GRADER-KEY-SECRET-5521"
    key = libc.syscall(L(nr["add_key"]), ctypes.c_char_p(b"user"), ctypes.c_char_p(b"grader-secret"),
                       ctypes.c_char_p(secret), L(len(secret)), L(KEY_SPEC_SESSION_KEYRING))
    assert key > 0
    src = f"NR = {nr!r}\n" + r'''
import ctypes, os
def steal():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long
    buf = ctypes.create_string_buffer(4096)
    out = []
    for spec in (-3, -4, -5):  # session, user, user-session keyrings
        r = libc.syscall(L(NR["keyctl"]), L(11), L(spec), buf, L(4096))  # KEYCTL_READ: the key ids in it
        out.append((r, ctypes.get_errno()))
    r = libc.syscall(L(NR["keyctl"]), L(11), L(KEY), buf, L(4096))
    out.append((r, ctypes.get_errno(), buf.raw[:max(r, 0)].decode(errors="replace")))
    try:
        out.append(open("/proc/keys").read())
    except OSError as e:
        out.append(type(e).__name__)
    return repr(out)
'''.replace("KEY)", f"{key})")
    try:
        with Submission(_code(src), sandbox=sandbox) as sub:
            seen = Learner(sub).steal()
    finally:
        libc.syscall(L(nr["keyctl"]), L(3), L(key))  # KEYCTL_REVOKE
    assert secret.decode() not in seen and "grader-secret" not in seen
    assert seen.count(f", {errno.EPERM}") >= 4, seen


@pytest.mark.skipif(os.geteuid() != 0, reason="one uid per worker is the root mode's")
def test_each_worker_has_its_own_uid(sandbox):
    src = "import os\ndef whoami():\n    return os.getuid()\n"
    with Submission(_code(src), sandbox=sandbox) as a, Submission(_code(src), sandbox=sandbox) as b:
        ua, ub = Learner(a).whoami(), Learner(b).whoami()
    assert ua != ub and ua in SANDBOX_UIDS and ub in SANDBOX_UIDS


def test_uid_pool_skips_reserved_and_known_ids():
    pool = UidPool(range(65530, 65540))
    assert 65534 not in pool.uids and 65535 not in pool.uids and 65530 in pool.uids
    got = [pool.take() for _ in range(2 * len(pool.uids))]
    assert sorted(set(got)) == pool.uids  # round robin: every uid before any comes back
    assert len(set(got[: len(pool.uids)])) == len(pool.uids)
    from autograder.isolation.sandbox import SandboxUnavailable
    from autograder.isolation.uids import account_ids

    low = UidPool(range(0, 200))
    assert 0 not in low.uids and not set(low.uids) & account_ids()
    with pytest.raises(SandboxUnavailable, match="no free uid"):
        UidPool(range(65534, 65536))
    # a uid held by a live worker is never handed out to another, until the worker ends and gives it back
    three = UidPool(range(65530, 65533))
    a, b = three.take(), three.take()
    three.give_back(a)
    assert b not in (three.take(), three.take())  # a and the third: b is still held
    three.give_back(b)
    assert three.take() == b  # the only one free


# --- the memory cgroup -----------------------------------------------------------------------------

def _cg_file(path: str, *names: str) -> str:
    for n in names:
        try:
            return Path(path, n).read_text()
        except OSError:
            continue
    return ""


def _cg_stat(path: str, key: str) -> int:
    text = _cg_file(path, "memory.stat")
    m = re.search(rf"^{key} (\d+)$", text, re.M)
    return int(m.group(1)) if m else 0


def _cg_oom_kills(path: str) -> int:
    m = re.search(r"^oom_kill (\d+)$", _cg_file(path, "memory.events", "memory.oom_control"), re.M)
    return int(m.group(1)) if m else 0


def _needs_cgroup(sandbox):
    if sandbox.cgroups is None:
        pytest.skip(f"no memory cgroup here ({sandbox.cgroup_problem}): RLIMIT_AS only")


def test_describe_names_the_memory_limit_in_force(sandbox):
    text = sandbox.describe()
    assert "seccomp filter" in text
    if sandbox.cgroups is not None:
        assert f"cgroup v{sandbox.cgroups.version}" in text and "tmpfs included" in text
    else:
        assert "RLIMIT_AS" in text and "no memory cgroup" in text


def test_without_a_cgroup_rlimit_as_stays(tmp_path):
    sb = Sandbox(memory_cgroup=None)
    assert sb.cgroups is None and "RLIMIT_AS" in sb.describe()
    w = sb.wrap([], files=[__file__], env={})
    for fd in w.close_fds:
        os.close(fd)
    assert any(a.startswith("--as=") for a in w.argv) and w.cgroup is None
    assert w.argv[:2] == [sb.sh, "-c"] and "oom_score_adj" in w.argv[2]


def test_the_worker_runs_in_its_own_memory_cgroup_and_tmpfs_is_charged(sandbox):
    """Is each worker in a cgroup of its own with the limit set, is what it writes to /tmp and
    /dev/shm charged to it, and is the cgroup gone once the worker has ended?"""
    _needs_cgroup(sandbox)
    src = ("import os\ndef fill():\n    for d, n in (('/tmp', 3), ('/dev/shm', 1)):\n"
           "        for i in range(n):\n            with open(f'{d}/f{i}', 'wb') as f:\n"
           "                f.write(b'x' * (15 * 2**20))\n    return os.getpid()\n")
    before = set(sandbox.cgroups.live())
    with Submission(_code(src), sandbox=sandbox) as sub:
        Learner(sub).fill()
        (path,) = set(sandbox.cgroups.live()) - before
        limit = int(_cg_file(path, "memory.max", "memory.limit_in_bytes"))
        assert limit == sandbox.limits.sandbox_memory_bytes
        procs = _cg_file(path, "cgroup.procs").split()
        assert str(sub.proc.pid) in procs and len(procs) >= 3  # bwrap, its init, the worker
        shmem = _cg_stat(path, "shmem") or _cg_stat(path, "total_shmem")
        assert shmem >= 60 * 2**20, shmem
    assert not os.path.exists(path)


def _small(memory: int, tmp: int) -> Sandbox:
    return Sandbox(limits=DEFAULT.replace(sandbox_memory_bytes=memory, sandbox_tmp_bytes=tmp,
                                          sandbox_file_size=tmp))


def _recording(sb: Sandbox) -> dict:
    """Record each worker cgroup's OOM kills and peak use just before it is removed."""
    seen: dict = {}
    release = sb.cgroups.release

    def rec(path):
        seen[path] = {"oom_kills": _cg_oom_kills(path),
                      "peak": int(_cg_file(path, "memory.peak", "memory.max_usage_in_bytes") or 0)}
        return release(path)
    sb.cgroups.release = rec
    return seen


def test_a_tmpfs_hog_beyond_the_limit_is_oom_killed_in_its_cgroup():
    """A /tmp as large as 2 GiB but a memory limit of 192 MiB: filling /tmp ends the worker (tmpfs is
    charged to its cgroup), and the grader goes on."""
    probe_sb = Sandbox()
    _needs_cgroup(probe_sb)
    limit = 192 * 2**20
    sb = _small(limit, 2 * 2**30)
    seen = _recording(sb)
    src = ("def fill():\n    n = 0\n    while n < 1500:\n        with open(f'/tmp/f{n}', 'wb') as f:\n"
           "            f.write(b'x' * 2**20)\n        n += 1\n    return n\n")
    avail = int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    with Submission(_code(src), sandbox=sb, limits=DEFAULT.replace(call_seconds=60)) as sub:
        with pytest.raises(WorkerDied):
            Learner(sub).fill()
    (stats,) = seen.values()
    assert stats["oom_kills"] >= 1 and stats["peak"] <= limit, stats
    after = int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    assert after > avail - 512 * 2**20  # the tmpfs went with the worker


def test_memory_of_several_processes_is_capped_together():
    """RLIMIT_AS is per process: four children of 240 MiB each stay under it, but not under the
    worker's cgroup limit of 768 MiB (a fresh worker holds about 300 MiB of PyTorch before the
    load); the kernel kills inside the worker only."""
    probe_sb = Sandbox()
    _needs_cgroup(probe_sb)
    sb = _small(768 * 2**20, 64 * 2**20)
    seen = _recording(sb)
    src = r'''
import os, time
def hog():
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            b = bytearray(240 * 2**20)
            time.sleep(3)
            os._exit(0)
        pids.append(pid)
    return [os.waitpid(p, 0)[1] & 0x7F for p in pids]
'''
    with Submission(_code(src), sandbox=sb, limits=DEFAULT.replace(call_seconds=60)) as sub:
        signals = Learner(sub).hog()  # the children are larger than the worker: they are killed
    assert signal.SIGKILL in signals, signals
    assert sum(s["oom_kills"] for s in seen.values()) >= 1


def test_a_stale_cgroup_of_a_killed_grader_is_removed(sandbox, tmp_path):
    _needs_cgroup(sandbox)
    cg = sandbox.cgroups
    script = tmp_path / "dead_grader.py"
    script.write_text(f"""
import os, subprocess, sys, time
sys.path.insert(0, {str(ROOT)!r})
from autograder.isolation.cgroups import MemoryCgroups
cg = MemoryCgroups({cg.parent!r}, {cg.version}, "test")
path = cg.create(64 * 2**20)
p = subprocess.Popen(["sh", "-c", 'echo $$ > "$0"/cgroup.procs && exec sleep 60', path])
while not open(path + "/cgroup.procs").read().strip():
    time.sleep(0.01)
print(path, p.pid, flush=True)
time.sleep(60)
""")
    grader = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    path, sleeper = grader.stdout.readline().split()
    assert path not in cg.sweep(older_than=0)  # locked while its grader lives
    assert os.path.exists(path)
    grader.kill()
    grader.wait()
    assert path in cg.sweep(older_than=0)
    assert not os.path.exists(path)
    assert wait_until(lambda: _gone(int(sleeper))), "the stale cgroup's process outlived the sweep"


def test_cgroup_folders_are_found_from_mountinfo(tmp_path):
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("4:memory:/process_api/abc\n0::/user.slice/me\n")
    (proc / "mountinfo").write_text(
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n")
    assert cgroup_dirs(str(tmp_path / "proc")) == {"v1": "/sys/fs/cgroup/memory/process_api/abc",
                                                    "v2": "/sys/fs/cgroup/unified/user.slice/me"}
    (proc / "cgroup").write_text("0::/docker/xyz/sub\n")
    (proc / "mountinfo").write_text("31 25 0:27 /docker/xyz /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert cgroup_dirs(str(tmp_path / "proc")) == {"v2": "/sys/fs/cgroup/sub"}
    # a v2 folder whose memory controller is not delegated is refused, with the reason
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu io\n")
    (v2 / "cgroup.subtree_control").write_text("")
    assert "not delegated" in MemoryCgroups._prepare(str(v2), 2, explicit=True)
    cg, why = MemoryCgroups.find(2**30, env={"AUTOGRADER_CGROUP_PARENT": "none"})
    assert cg is None and "off" in why


# --- the trusted side's memory measurement (exercise 07's tiled attention relies on it) ---

HOGS = '''
import os
def small():
    return bytearray(1 << 20)[:1]
def big():
    return bytearray(MiB * (1 << 20))[:1]  # touched: bytearray zero-fills
def big_then_reset():
    b = bytearray(MiB * (1 << 20))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # a learner resetting its own peak to hide it
    except OSError:
        pass
    return b[:1]
def big_in_child():
    pid = os.fork()
    if pid == 0:
        bytearray(MiB * (1 << 20))
        os._exit(0)
    os.waitpid(pid, 0)
    return b"x"
'''


@pytest.mark.parametrize("sandboxed", [False, True], ids=["process", "sandbox"])
def test_memory_peak_is_measured_by_the_trusted_side(sandbox, sandboxed):
    if sandboxed:
        _needs_cgroup(sandbox)
    mib, MiB = 300, 2**20
    with Submission(_code(f"MiB = {mib}\n" + HOGS), sandbox=sandbox if sandboxed else None) as sub:
        learner = Learner(sub)
        small = learner.memory_peak("small")
        assert small.source == ("cgroup" if sandboxed else "process")
        assert small.peak_bytes is not None and small.peak_bytes < 50 * MiB
        for name in ("big", "big_then_reset", "big_in_child", "small"):
            use = learner.memory_peak(name)
            if name == "small":
                assert use.peak_bytes < 50 * MiB, "a large earlier call must not count against a later small one"
            elif name in ("big_in_child", "big_then_reset") and not sandboxed:
                continue  # without a cgroup the learner's own process can hide its peak (documented)
            else:
                assert use.peak_bytes > 0.9 * mib * MiB, (name, use)
