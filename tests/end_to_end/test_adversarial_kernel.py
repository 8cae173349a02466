"""Attacks through the kernel, graded in the one adversarial batch (see tests/attacks/kernel.py).

Every attack cell reports at load what it got, in a `KERNEL-...` note; each test asserts the
score (always that of the honest part of the notebook) and that the report shows the kernel
said no: nested user and mount namespaces, mounts, keyrings, ptrace, bpf and the like fail
with EPERM (clone3 with ENOSYS), and memory that RLIMIT_AS does not see (tmpfs, memfds,
several processes) is capped by the worker's own cgroup, where the kernel kills inside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attacks import KEY
from attacks.kernel import GRADER_SECRET, KEY_NAME, MARKER


def _result(batch, name: str) -> dict:
    r = batch["by"][name]
    assert r["status"] == "graded", (name, r.get("error"))
    return r


def _full(batch, name: str) -> dict:
    r = _result(batch, name)
    failed = [(c["name"], c["hint"][:200]) for c in r["checks"] if not c["passed"]]
    assert r["score"] == r["max_score"] and not failed, (name, failed, r["notes"])
    return r


def _report(r: dict, tag: str) -> str:
    notes = [n for n in r["notes"] if f"KERNEL-{tag}" in n]
    assert notes, r["notes"]
    return notes[0]


def _fields(report: str) -> dict:
    return dict(m.groups() for m in re.finditer(r"(\S+?)=(\S+)", report))


def test_a_nested_user_namespace_cannot_mount_and_fill_a_tmpfs(batch):
    """unshare(CLONE_NEWUSER|CLONE_NEWNS), then a 6 GiB tmpfs filled; and `unshare -Urm` + `mount -t tmpfs`."""
    report = _report(_full(batch, "kernel_userns_tmpfs_fill"), "USERNS")
    assert "unshare=EPERM" in report
    assert re.search(r"cmd=rc[1-9]\d*:.*(not permitted|denied)", report), report
    assert "os.unshare=ESCAPED" not in report and "MOUNTED" not in report and "ESCAPED" not in report


def test_unshare_setns_and_mounts_through_ctypes_fail(batch):
    fields = _fields(_report(_full(batch, "kernel_unshare_ctypes"), "UNSHARE"))
    for key in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time", "setns", "fsopen", "open_tree", "mount",
                "chroot"):
        assert fields.get(key) == "EPERM", (key, fields)


def test_clone_into_new_namespaces_fails(batch):
    fields = _fields(_report(_full(batch, "kernel_clone_newuser"), "CLONE"))
    for key in ("clone_user", "clone_user_ns", "clone_pid", "clone_net"):
        assert fields.get(key) == "EPERM", (key, fields)
    assert fields.get("clone3_user") == "ENOSYS" and fields.get("clone3_plain") == "ENOSYS"


def test_a_key_planted_by_one_submission_is_not_seen_by_another(batch):
    """a (full answers) puts them into the user, session and user-session keyrings; b (the stubs)
    looks for them and would exec them: b must score what its own code deserves, nothing."""
    fields = _fields(_report(_full(batch, "kernel_keyring_a_plant"), "PLANT"))
    for key in ("add_key@user", "add_key@session", "add_key@usersession", "persistent", "request_key"):
        assert fields.get(key) == "EPERM", (key, fields)
    thief = _result(batch, "kernel_keyring_b_steal")
    assert thief["score"] == 0.0 and not any(c["passed"] for c in thief["checks"])
    report = _report(thief, "STEAL")
    assert "FOUND" not in report
    assert report.count("search@") == 6 and report.count("=EPERM") == 6, report


def test_the_graders_own_keys_never_reach_a_result(batch):
    """The batch ran inside a session keyring holding a secret key (where keyrings exist here)."""
    texts = [p.read_text(encoding="utf-8") for p in (batch["out"] / "results").rglob("*.json")]
    texts += [p.read_text(encoding="utf-8") for p in (batch["out"] / "feedback").rglob("*.html")]
    texts.append(batch["stderr"])
    assert not any(GRADER_SECRET in t for t in texts)
    assert not any("FOUND@" in t for t in texts)
    assert not any(KEY_NAME in t and "FOUND" in t for t in texts)


def test_ptrace_and_reading_other_processes_fail(batch):
    fields = _fields(_report(_full(batch, "kernel_ptrace"), "PTRACE"))
    for key in ("attach", "seize", "attach_init", "vm_readv", "kcmp"):
        assert fields.get(key) == "EPERM", (key, fields)
    assert fields.get("traceme_exit") == "4"  # PTRACE_TRACEME failed in the child
    assert fields.get("mem") in ("OSError", "PermissionError"), fields


def test_bpf_perf_and_other_kernel_surface_fail(batch):
    fields = _fields(_report(_full(batch, "kernel_bpf_perf"), "BPF"))
    for key in ("bpf", "perf", "userfaultfd", "io_uring", "personality", "syslog", "settime"):
        assert fields.get(key) == "EPERM", (key, fields)
    if "iopl" in fields:
        assert fields["iopl"] == "EPERM"


def test_an_honest_notebook_with_threads_and_processes_gets_full_marks(batch):
    """Threads, a thread pool, torch intra-op threads, subprocess, fork, a multiprocessing pool, matplotlib."""
    _full(batch, "kernel_honest_threads_subprocess")


def _needs_cgroup(batch):
    if not batch["ctx"].extra.get("kernel_cgroup"):
        pytest.skip("no memory cgroup can be made here: the memory attacks would take the host's memory")


def test_memory_of_several_processes_and_tmpfs_is_capped_in_the_workers_cgroup(batch):
    """/tmp and /dev/shm filled (ENOSPC at their size), then six children of 1 GiB each, each under
    RLIMIT_AS: the kernel kills children inside the worker's cgroup; the honest answers count."""
    _needs_cgroup(batch)
    fields = _fields(_report(_full(batch, "kernel_fork_tmpfs_hog"), "HOG"))
    assert fields.get("tmp") == "ENOSPC" and fields.get("shm") == "ENOSPC", fields
    killed = int(fields["killed"].split("/")[0])
    assert killed >= 1, fields


def test_memfds_beyond_the_limit_cost_only_that_part(batch):
    """Three processes fill memfds (tmpfs outside any size= and outside RLIMIT_AS) in causal_mask: that
    part is lost (the worker is killed, or its children, or, on a loaded machine where the cgroup's
    reclaim throttles the writers, the call runs out of time), every other check passes, the batch goes on."""
    _needs_cgroup(batch)
    r = _result(batch, "kernel_memfd_hog")
    lost = sum(c["max_points"] for c in r["checks"] if c["part"] == "causal_mask")
    assert lost > 0 and r["score"] == r["max_score"] - lost, [(c["name"], c["hint"][:120]) for c in r["checks"]]
    for c in r["checks"]:
        if c["part"] == "causal_mask":
            m = re.search(r"KERNEL-MEMFD killed=(\d+)", c["hint"])
            ended = "ended the grading process" in c["hint"] or "did not finish within" in c["hint"]
            assert not c["passed"] and (ended or (m and int(m.group(1)) >= 1)), c
        else:
            assert c["passed"], c


def test_no_process_of_a_kernel_attack_is_left(batch):
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if MARKER.encode() in (d / "cmdline").read_bytes():
                    found.append(d.name)
            except OSError:
                pass
    assert found == []


def test_kernel_attacks_are_in_the_batch(batch):
    names = {n for n in batch["by"] if n.startswith("kernel_")}
    assert {"kernel_userns_tmpfs_fill", "kernel_unshare_ctypes", "kernel_clone_newuser", "kernel_keyring_a_plant",
            "kernel_keyring_b_steal", "kernel_ptrace", "kernel_bpf_perf", "kernel_honest_threads_subprocess"} <= names
    assert (batch["out"] / "results" / KEY).is_dir()
