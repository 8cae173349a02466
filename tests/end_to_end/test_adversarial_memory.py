"""Attacks on exercise 07's memory check, and the rule that a learner's `check` never shows more
than `grade` gives.

`test_tiled_attention_memory` pays 3 points when `tiled_attention` never holds the whole
Lq x Lk score matrix. Every attack below is the naive answer (the whole matrix, right values)
behind ballast: memory the notebook holds before the measured call and frees inside it, so
that a peak counted from the start of the call (the measure before this suite) would look
like tiles. The grader counts from the worker's memory before the notebook was loaded, so
each attack must lose exactly the 3 memory points, sandboxed with a memory cgroup (fresh and
warm workers) and, for the ballast a process can see, sandboxed without one (the per-process
measure); the reference keeps them everywhere.

Each notebook is graded by the real `Grader` on two checks only: a value check (the earlier
calls, as in a full grading run) and the memory check; the whole 07 harness is graded by
tests/end_to_end/test_chapters.py.
"""

from __future__ import annotations

import pytest

from autograder.core.assignments import get_assignment
from autograder.grading.grader import Grader
from autograder.hidden import test_07_efficient_attention as T
from autograder.isolation import memory_meters, remote
from autograder.isolation.cgroups import CGROUP_ENV
from autograder.isolation.sandbox import SandboxUnavailable, detect
from conftest import add_cell, reference_notebook, write

KEY = "07_efficient_attention"
CHECKS = ("test_tiled_attention_matches_exact", "test_tiled_attention_memory")
MEMORY = "test_tiled_attention_memory"
SEED = 424242
BALLAST_MIB = 2000  # more than the whole matrix minus the bound: freed in the call, it would hide it

PRELUDE = f'''
import ctypes, gc, os, signal, sys, time
MIB = 1 << 20
BALLAST = {BALLAST_MIB} * MIB
_honest_tiled = tiled_attention

def _naive(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v
'''

# Each attack: the code of a cell added at the end of the reference notebook. Small inputs (the
# value checks) get the honest function; the memory check's 16384 queries get the naive one.
ATTACKS = {
    # a buffer allocated when the notebook is loaded, freed inside the measured call
    "held_from_load": '''
_BALLAST = bytearray(BALLAST)

def tiled_attention(q, k, v, block_size=64, causal=False):
    global _BALLAST
    if q.size(-2) < 4096:
        return _honest_tiled(q, k, v, block_size, causal)
    _BALLAST = None
    return _naive(q, k, v)
''',
    # a buffer allocated by an earlier call (the value checks), freed inside the measured call
    "earlier_call": '''
_BALLAST = None

def tiled_attention(q, k, v, block_size=64, causal=False):
    global _BALLAST
    if q.size(-2) < 4096:
        if _BALLAST is None:
            _BALLAST = bytearray(BALLAST)
        return _honest_tiled(q, k, v, block_size, causal)
    _BALLAST = None
    return _naive(q, k, v)
''',
    # a child process started at load that holds the buffer, killed inside the measured call
    "child_process": '''
def _hold_in_child(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            held = bytearray(n)
            os.write(w, b"x")
            while True:
                time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return pid

_CHILD = _hold_in_child(BALLAST)

def tiled_attention(q, k, v, block_size=64, causal=False):
    if q.size(-2) < 4096:
        return _honest_tiled(q, k, v, block_size, causal)
    os.kill(_CHILD, signal.SIGKILL)
    os.waitpid(_CHILD, 0)
    return _naive(q, k, v)
''',
    # files in /dev/shm and /tmp (tmpfs: memory), then memfds for the rest, removed in the call
    "files_and_memfds": '''
def _fill(n):
    paths, fds, chunk = [], [], b"\\x01" * MIB
    for top in ("/dev/shm", "/tmp"):
        for i in range(3):
            path = f"{top}/ballast{i}"
            try:
                with open(path, "wb") as f:
                    for _ in range(16):  # 16 MiB: the largest file the sandbox allows
                        f.write(chunk)
            except OSError:
                break
            paths.append(path)
            n -= 16 * MIB
    while n > 0:
        fd = os.memfd_create("ballast")
        for _ in range(16):
            os.write(fd, chunk)
        fds.append(fd)
        n -= 16 * MIB
    return paths, fds

_FILES = _fill(BALLAST)

def tiled_attention(q, k, v, block_size=64, causal=False):
    if q.size(-2) < 4096:
        return _honest_tiled(q, k, v, block_size, causal)
    paths, fds = _FILES
    for p in paths:
        os.unlink(p)
    for fd in fds:
        os.close(fd)
    return _naive(q, k, v)
''',
    # no ballast: free what the worker held before the notebook was loaded (Python objects,
    # malloc's free lists, the page cache of torch's files) to make room under the baseline
    "release_the_baseline": '''
def _release():
    for name in [m for m in sys.modules if m.split(".")[0] in ("sympy", "mpmath")]:
        del sys.modules[name]
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    for root, _, files in os.walk(os.path.dirname(torch.__file__)):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            os.close(fd)

def tiled_attention(q, k, v, block_size=64, causal=False):
    if q.size(-2) < 4096:
        return _honest_tiled(q, k, v, block_size, causal)
    _release()
    return _naive(q, k, v)
''',
}
# ballast the per-process measure (no cgroup) sees: in the worker process itself
IN_PROCESS = ("held_from_load", "earlier_call")
# the ballast that a peak counted from the call's start would have missed (checked below)
HIDES_FROM_THE_CALL_START = {"held_from_load", "earlier_call", "child_process", "files_and_memfds"}


def _notebook(name: str, tmp_path):
    nb = reference_notebook(KEY)
    if name != "ref":
        add_cell(nb, PRELUDE + ATTACKS[name])
    return write(nb, tmp_path / f"{name}.ipynb")


@pytest.fixture(scope="module")
def sandbox():
    try:
        return detect()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def no_cgroup_sandbox():
    mp = pytest.MonkeyPatch()
    mp.setenv(CGROUP_ENV, "none")
    try:
        return detect()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    finally:
        mp.undo()


def _grader(sandbox, warm=False) -> Grader:
    g = Grader(get_assignment(KEY), sandbox=sandbox, warm=warm)
    g.checks = [c for c in g.checks if c.name in CHECKS]
    assert [c.name for c in g.checks] == list(CHECKS)
    return g


def _grade(grader, path, monkeypatch):
    """The memory check's result and the measurement it judged."""
    seen = []
    real = remote.Learner.memory_peak

    def spy(self, *args, **kwargs):
        seen.append(real(self, *args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(remote.Learner, "memory_peak", spy)
    result = grader.grade(path, seed=SEED)
    monkeypatch.undo()
    assert result.status == "graded", result.error
    checks = {c.name: c for c in result.checks}
    assert checks["test_tiled_attention_matches_exact"].passed, checks["test_tiled_attention_matches_exact"].hint
    assert len(seen) == 1
    return checks[MEMORY], seen[0]


def _judge(name, check, use, expect_source):
    assert use.source == expect_source, (name, use)
    if name == "ref":
        assert check.passed and check.points == check.max_points > 0, (name, check.hint, use)
        return
    assert not check.passed and check.points == 0, (name, use)
    assert "builds (nearly) the whole Lq x Lk" in check.hint, check.hint
    assert use.peak_bytes > T.MEM_L * T.MEM_L * 4 * 0.9, (name, use)
    if name in HIDES_FROM_THE_CALL_START and (expect_source == "cgroup" or name in IN_PROCESS):
        # the attack is real: counted from the call's start, the naive answer would have passed
        assert use.peak_bytes - use.held_bytes <= T.MEM_BOUND, (name, use)


CASES = ["ref", *ATTACKS]


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_ballast_cannot_hide_the_whole_matrix_from_the_cgroup(sandbox, name, tmp_path, monkeypatch):
    if sandbox.cgroups is None:
        pytest.skip(f"no memory cgroup here ({sandbox.cgroup_problem})")
    check, use = _grade(_grader(sandbox), _notebook(name, tmp_path), monkeypatch)
    _judge(name, check, use, "cgroup")


@pytest.fixture(scope="module")
def warm(sandbox):
    if sandbox.cgroups is None:
        pytest.skip(f"no memory cgroup here ({sandbox.cgroup_problem}): no warm start")
    g = _grader(sandbox, warm=True)
    assert g.template is not None, g.warm_problem
    yield g
    g.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_ballast_cannot_hide_the_whole_matrix_from_a_warm_worker(warm, name, tmp_path, monkeypatch):
    check, use = _grade(warm, _notebook(name, tmp_path), monkeypatch)
    _judge(name, check, use, "cgroup")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ref", *IN_PROCESS])
def test_ballast_cannot_hide_the_whole_matrix_without_a_cgroup(no_cgroup_sandbox, name, tmp_path, monkeypatch):
    """Sandboxed without a memory cgroup, the worker process's own peak is measured (not paid unmeasured)."""
    check, use = _grade(_grader(no_cgroup_sandbox), _notebook(name, tmp_path), monkeypatch)
    _judge(name, check, use, "process")


# --- the meters' arithmetic, on cgroup files written here (v2 cannot be mounted on every host) -----

def _files(folder, **values):
    for name, value in values.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{value}\n")


def test_v2_without_the_peak_reset_reports_the_lifetime_peak(tmp_path, monkeypatch):
    """Where memory.peak cannot be reset (Linux before 6.12), the lifetime peak is reported whole:
    ballast allocated at load raised it before the call, so a call that does not raise it again
    (the attack on the old `after > before` rule, which reported 0) still counts all of it."""
    MiB = 2**20
    _files(tmp_path, memory_current=2100 * MiB, memory_peak=2200 * MiB)
    real_open = memory_meters.os.open

    def refuse(path, flags, *a):
        if str(path).endswith("memory.peak") and flags & memory_meters.os.O_RDWR:
            raise PermissionError(13, "refused")
        return real_open(path, flags, *a)

    monkeypatch.setattr(memory_meters.os, "open", refuse)
    stop = memory_meters.cgroup_meter(str(tmp_path), 100 * MiB)
    _files(tmp_path, memory_current=150 * MiB)  # the ballast freed, the naive matrix under the old peak
    peak, held, source = stop()
    assert (peak, held, source) == (2100 * MiB, 2000 * MiB, "cgroup")


def test_v2_with_the_peak_reset_counts_from_the_baseline(tmp_path):
    MiB = 2**20
    _files(tmp_path, memory_current=2100 * MiB, memory_peak=9000 * MiB)
    stop = memory_meters.cgroup_meter(str(tmp_path), 100 * MiB)
    assert (tmp_path / "memory.peak").read_text().startswith("reset")  # our descriptor's peak was reset
    _files(tmp_path, memory_peak=2150 * MiB)  # what the kernel then shows that descriptor
    assert stop() == (2050 * MiB, 2000 * MiB, "cgroup")


def test_v1_counts_from_the_baseline(tmp_path):
    MiB = 2**20
    _files(tmp_path, memory_usage_in_bytes=2100 * MiB, memory_max_usage_in_bytes=9000 * MiB)
    stop = memory_meters.cgroup_meter(str(tmp_path), 100 * MiB)
    assert (tmp_path / "memory.max_usage_in_bytes").read_text() == "0"  # reset to the current usage
    _files(tmp_path, memory_max_usage_in_bytes=2150 * MiB)
    assert stop() == (2050 * MiB, 2000 * MiB, "cgroup")


def test_the_sandboxed_worker_is_the_one_leaf_below_bubblewrap(tmp_path):
    def proc(pid, ppid, name="python3"):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(f"{pid} ({name}) S {ppid} 1 1 0".encode())

    proc(10, 1, "sh")
    proc(11, 10, "bwrap")
    proc(12, 11, "bwrap")
    proc(13, 12, "x) S 11 (")  # a name built to look like another parent
    proc(20, 1)
    assert memory_meters.sandboxed_worker_pid(10, proc=str(tmp_path)) == 13
    proc(14, 12)  # two leaves: no guess
    assert memory_meters.sandboxed_worker_pid(10, proc=str(tmp_path)) is None
    assert memory_meters.sandboxed_worker_pid(20, proc=str(tmp_path)) is None  # nothing below
