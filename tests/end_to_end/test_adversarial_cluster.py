"""Another local user attacks the grading run itself, not through a notebook: the parallel path's
Dask cluster and the grader's runtime state.

* A batch's local cluster (`grade --jobs N`, `cohort.OnDask`) listens only on TLS with credentials
  made for the batch: a second local user (uid 65534) who tries every listening port of the batch,
  over plain TCP and over TLS with a certificate of its own, with a Dask `Client` and with raw
  `run`/`broadcast` requests, never runs a task there; the same attacks do run code in a cluster
  without authentication (the control), and the grader's own client does run tasks in the batch.
* `--scheduler` refuses an address that authenticates nobody (exit 2) unless `--insecure-scheduler`
  is given; a tls:// scheduler is reached with the credentials of Dask's configuration.
* The folder of the uid slots cannot be taken first by another local user: `grade` still starts
  and two grading processes still get disjoint slots whatever that user planted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autograder.batch.cohort import OnDask
from autograder.core.assignments import ROOT
from autograder.isolation.runtime import runtime_dir
from autograder.isolation.sandbox import SandboxUnavailable
from conftest import reference_notebook, run_cli, write

KEY = "03_qkv"
NOBODY = 65534
ATTACKER = Path(__file__).with_name("cluster_attacker.py")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second local user needs root")


def _listening(procs) -> set[tuple[str, int]]:
    """(ip, port) of every listening TCP socket and every bound UDP socket of these processes."""
    out = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or c.type == 2:  # SOCK_DGRAM
                    out.add((c.laddr.ip, c.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return out


def _this_process_tree():
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.split("://")[-1].rsplit(":", 1)
    return host, int(port)


def _restart_one_worker(client, timeout: float = 120) -> None:
    """SIGKILL one job process and wait until its nanny has brought a new one in."""
    pids = client.run(os.getpid)
    os.kill(sorted(pids.values())[0], signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            now = client.run(os.getpid)
        except Exception:  # noqa: BLE001 - the scheduler may still list the dead worker
            continue
        if len(now) == len(pids) and set(now.values()) != set(pids.values()):
            return
    raise AssertionError("the killed job process was not restarted")


@as_root
def test_another_local_user_cannot_run_code_in_a_batch(tmp_path):
    """Can a second local user reach a batch's cluster (every listener, every way) and run code in it?"""
    from distributed import LocalCluster

    markers = tmp_path / "markers"
    markers.mkdir()
    before = _listening(_this_process_tree())
    path_before = list(sys.path)
    runner = OnDask(jobs=2)
    try:
        # A job process restarted by its nanny is locked down like the first ones.
        _restart_one_worker(runner.client)
        info = runner.client.scheduler_info()
        comms = {info["address"]} | set(info["workers"]) | {w["nanny"] for w in info["workers"].values()}
        listening = _listening(_this_process_tree()) - before
        # Nothing listens but the scheduler, the two nannies and the two workers (the HTTP servers
        # Dask starts beside them are stopped), all on TLS on the loopback address.
        assert sorted(listening) == sorted(_host_port(a) for a in comms)
        assert all(a.startswith("tls://127.0.0.1:") for a in comms), comms
        # The grader's own client runs tasks, on both workers: an attack that got as far would show.
        assert len(runner.client.run(os.getpid)) == 2
        runner.client.submit((markers / "grader").write_text, "ran", pure=False).result(timeout=60)
        scratch = runner.cluster.scratch
        assert os.stat(scratch).st_mode & 0o077 == 0
        # Every Dask node puts its scratch folder first on its sys.path (the scheduler in this
        # process too): all of them are inside the batch's private folder, none in a shared /tmp.
        paths = [*runner.client.run(lambda: __import__("sys").path).values(), sys.path]
        dask_paths = [p for path in paths for p in path if "dask-scratch-space" in p and p not in path_before]
        assert len(dask_paths) >= 4 and all(p.startswith(scratch + os.sep) for p in dask_paths), dask_paths
        # The control: a cluster that authenticates nobody, as the batch's was before.
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1",
                          dashboard_address=None) as control:
            control_addrs = [control.scheduler_address, *control.scheduler.workers]
            plan = {"targets": sorted(comms), "control": control_addrs, "markers": str(markers), "peek": [scratch]}
            proc = subprocess.run([sys.executable, str(ATTACKER), json.dumps(plan)], cwd=ROOT, capture_output=True,
                                  text=True, timeout=300,
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"})
    finally:
        runner.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["uid"] == NOBODY
    # Control: the attacks work as that user (a Client's task, a broadcast through the scheduler,
    # a `run` sent straight to a worker), so their failing below is the batch's doing.
    sched, worker = (a.split("://")[-1].replace(":", "_") for a in control_addrs)
    broke_in = {f"{sched}-tcp-submit", f"{sched}-tcp-broadcast", f"{worker}-tcp-run"}
    assert broke_in <= {k for k, v in report["control"].items() if v.startswith("answered")}, report["control"]
    # The batch: every attempt on every listener failed, at the connection or at the request,
    # never for a reason of the attacker's own making.
    assert len(report["targets"]) == 7 * len(comms)
    assert not {k: v for k, v in report["targets"].items() if v.startswith("answered")}, report["targets"]
    assert not [v for v in report["targets"].values() if "Import" in v or "Permission" in v], report["targets"]
    assert sorted(os.listdir(markers)) == sorted(["grader", *broke_in])  # nothing ran in the batch
    assert report["peek"] == {scratch: "PermissionError"}  # Dask's scratch folder (on sys.path) is private


@pytest.mark.parametrize("extra, says", [
    (["--scheduler", "tcp://127.0.0.1:9"], "a tcp:// address authenticates nobody"),
    (["--scheduler", "127.0.0.1:9"], "a tcp:// address authenticates nobody"),  # no scheme: Dask's tcp
    (["--scheduler", "ws://127.0.0.1:9"], "a ws:// address authenticates nobody"),
    (["--scheduler", "tls://127.0.0.1:9"], "needs the grader's TLS credentials"),  # none configured here
    (["--insecure-scheduler"], "--insecure-scheduler goes with --scheduler"),
])
def test_an_unauthenticated_scheduler_is_refused(tmp_path, extra, says):
    """Does `grade --scheduler` refuse, before grading anything, an address that authenticates nobody?"""
    write(reference_notebook(KEY), tmp_path / "subs" / "ref.ipynb")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "subs"), "--assignment", KEY,
                           "--out", str(out), *extra], cwd=ROOT, env=dict(env, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert says in proc.stderr
    if "authenticates nobody" in says:
        assert "--insecure-scheduler" in proc.stderr  # the way out is named
    assert not out.exists()  # nothing graded, no gradebook


def test_a_tls_scheduler_is_reached_with_the_configured_credentials(tmp_path):
    """Does `--scheduler tls://...` grade with the credentials named in Dask's configuration?"""
    from distributed import LocalCluster
    from distributed.security import Security

    sec = Security.temporary()
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    for name, text in (("ca.pem", sec.tls_ca_file), ("cert.pem", sec.tls_client_cert), ("key.pem", sec.tls_client_key)):
        (creds / name).write_text(text)
    write(reference_notebook(KEY), tmp_path / "subs" / "ref.ipynb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env.update(OMP_NUM_THREADS="1", DASK_DISTRIBUTED__COMM__TLS__CA_FILE=str(creds / "ca.pem"),
               DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=str(creds / "cert.pem"),
               DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=str(creds / "key.pem"))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, protocol="tls://", host="127.0.0.1",
                      security=sec, dashboard_address=None, memory_limit=0) as cluster:
        proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "subs"), "--assignment",
                               KEY, "--out", str(tmp_path / "out"), "--scheduler", cluster.scheduler_address, "--json"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sub,) = json.loads(proc.stdout)["submissions"]
    assert (sub["status"], sub["score"]) == ("graded", sub["max_score"])
    assert "insecure" not in proc.stderr


# --- the runtime folder --------------------------------------------------------------------

def _as_nobody(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)


PLANTS = {  # what another user can put where the grader's state might go: shell, given P
    "folder": 'mkdir "$P"',
    "folder-open-to-all": 'mkdir -m 777 "$P" && chmod 777 "$P"',
    "file": ': > "$P"',
    "symlink": 'ln -s / "$P"',
}

HOLD_SLOT = ("from autograder.isolation.uids import uid_slot; print(*uid_slot(1024), flush=True); "
             "__import__('sys').stdin.read()")


@as_root
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_another_user_cannot_take_the_uid_slot_folder_first(kind):
    """Whatever another user plants where the slots are or were kept, do two grading processes still
    take disjoint uid slots (the old /tmp folder made every grading run refuse to start)?"""
    old = f"/tmp/autograder-uid-slots-{os.geteuid()}"  # where the slots were kept: world-writable /tmp
    ours = runtime_dir()
    spots = [old, ours, os.path.join(ours, "uid-slots"), os.path.join(ours, "uid-slots", "slot-0"),
             os.path.join(os.path.dirname(ours), "autograder-new")]
    planted = []
    try:
        for spot in spots:
            if _as_nobody(f'P="{spot}"; {PLANTS[kind]}').returncode == 0:
                planted.append(spot)
        # Only the old /tmp folder can be planted (and only if no grader made it there before).
        assert set(planted) <= {old}, planted
        holders = []
        for _ in range(2):
            p = subprocess.Popen([sys.executable, "-c", HOLD_SLOT], cwd=ROOT, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            holders.append((p, p.stdout.readline().split()))
        try:
            shares = []
            for p, got in holders:
                assert len(got) == 2, p.stderr.read() if p.poll() is not None else got
                offset, share = map(int, got)
                shares.append(set(range(offset, offset + share)))
            assert not shares[0] & shares[1]
        finally:
            for p, _ in holders:
                p.stdin.close()
                p.wait(timeout=30)
    finally:
        for spot in planted:  # as root: the plants of this test only
            if os.path.isdir(spot) and not os.path.islink(spot):
                os.rmdir(spot)
            else:
                os.unlink(spot)


@as_root
def test_grading_starts_whatever_another_user_planted(tmp_path):
    """Does a sandboxed `grade` start and give full marks after another user planted every kind of
    thing at every place of the grader's runtime state it could reach?"""
    old = f"/tmp/autograder-uid-slots-{os.geteuid()}"
    planted = old if _as_nobody(f'P="{old}"; {PLANTS["folder-open-to-all"]}').returncode == 0 else None
    try:
        write(reference_notebook(KEY), tmp_path / "subs" / "ref.ipynb")
        proc = run_cli("grade", str(tmp_path / "subs"), "--assignment", KEY, "--out", str(tmp_path / "out"), "--json")
    finally:
        if planted:
            os.rmdir(planted)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sub,) = json.loads(proc.stdout)["submissions"]
    assert (sub["status"], sub["score"]) == ("graded", sub["max_score"])


def _made_by_nobody(path: Path, kind: str) -> None:
    """A thing at PATH as another user would leave it (made here, then given to uid 65534)."""
    if kind == "folder":
        path.mkdir()
    elif kind == "folder-open-to-all":
        path.mkdir()
        path.chmod(0o777)
    elif kind == "file":
        path.write_text("")
    elif kind == "symlink":
        path.symlink_to(path.parent)
    os.lchown(path, NOBODY, NOBODY)


@as_root
@pytest.mark.parametrize("case", [
    "parent open to all", "parent sticky and open to all", "parent of another user", "parent is a link",
    "taken: folder", "taken: folder-open-to-all", "taken: file", "taken: symlink", "ours with mode 0755",
])
def test_the_runtime_folder_is_never_one_another_user_could_make(tmp_path, case):
    """Is a place for the runtime state skipped (and the next one used) whenever another user could
    have created it, or could rename or replace a folder on the way to it?"""
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o755)
    bad = parent / "autograder"
    if case == "parent open to all":
        parent.chmod(0o777)
    elif case == "parent sticky and open to all":
        parent.chmod(0o1777)  # as /tmp: others cannot move our entries, but can take a name first
    elif case == "parent of another user":
        os.chown(parent, NOBODY, NOBODY)
    elif case == "parent is a link":
        real = tmp_path / "real"
        real.mkdir(mode=0o755)
        parent.rmdir()
        parent.symlink_to(real)
    elif case.startswith("taken: "):
        _made_by_nobody(bad, case.removeprefix("taken: "))
    elif case == "ours with mode 0755":
        bad.mkdir()
        bad.chmod(0o755)
    good = tmp_path / "home" / ".cache" / "autograder"  # missing folders on the way are made, 0700
    assert runtime_dir([str(bad), str(good)]) == str(good)
    assert (good.stat().st_mode & 0o777, good.stat().st_uid) == (0o700, os.geteuid())
    with pytest.raises(SandboxUnavailable, match="no private folder"):
        runtime_dir([str(bad)])
