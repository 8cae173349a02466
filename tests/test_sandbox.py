"""The sandbox itself: what a worker can see and do inside it (fast: no torch import)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.assignments import ROOT
from autograder.limits import DEFAULT
from autograder.runner import Learner, LearnerError, Submission
from autograder.sandbox import SANDBOX_UID, Sandbox, detect

MAX_FILE_SIZE, MAX_PROCESSES, TMP_BYTES = (DEFAULT.sandbox_file_size, DEFAULT.sandbox_processes,
                                           DEFAULT.sandbox_tmp_bytes)
from conftest import learner_notebook, run_cli, write

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

PROBE = r'''
import os, sys, json, socket
def probe():
    out = {"uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME")}
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


@pytest.fixture(scope="module")
def probe(sandbox, tmp_path_factory):
    import json

    nb = write(learner_notebook("03_qkv"), tmp_path_factory.mktemp("sb") / "mine.ipynb")
    src = f"REPO = {str(ROOT)!r}\nMAXP = {MAX_PROCESSES}\n" + PROBE
    with Submission(_code(src), sandbox=sandbox, notebook=nb, limits=DEFAULT.replace(submission_seconds=60)) as sub:
        return json.loads(Learner(sub).probe())


def test_runs_as_the_sandbox_uid(probe):
    if os.geteuid() == 0:
        assert probe["uid"] == SANDBOX_UID
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


def test_call_timeout_and_kill(sandbox):
    src = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ndef spin():\n    while True:\n        pass\n"
    with Submission(_code(src), sandbox=sandbox,
                    limits=DEFAULT.replace(call_seconds=2, submission_seconds=30)) as sub:
        t = time.monotonic()
        with pytest.raises(Exception) as info:
            Learner(sub).spin()
        assert "timed out" in str(info.value)
        assert time.monotonic() - t < 10
    time.sleep(0.5)
    out = subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
    assert str(SANDBOX_UID) not in out


def test_learner_error_crosses_as_data(sandbox):
    with Submission(_code("def f():\n    raise ValueError('nope')\n"), sandbox=sandbox) as sub:
        with pytest.raises(LearnerError, match="nope"):
            Learner(sub).f()


def test_python_installation_containing_the_repo_is_refused(tmp_path):
    from autograder.sandbox import SandboxUnavailable

    sb = Sandbox.__new__(Sandbox)
    sb.binds = [str(ROOT.parent)]
    with pytest.raises(SandboxUnavailable, match="would expose"):
        sb.check_binds([ROOT])


def test_grade_refuses_without_bubblewrap(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    env_path = os.path.dirname(sys.executable)  # no /usr/bin: no bwrap
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(nb), "--assignment", "03_qkv",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PATH=env_path), timeout=120)
    assert proc.returncode == 2
    assert "--no-sandbox" in proc.stderr and "apt-get install -y bubblewrap" in proc.stderr
    assert not (tmp_path / "out" / "gradebook.db").exists()


def test_no_sandbox_grades_with_a_warning(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    proc = run_cli("grade", str(nb), "--assignment", "03_qkv", "--out", str(tmp_path / "out"), "--no-sandbox")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --no-sandbox" in proc.stderr
    assert "a: 0 / 23" in proc.stderr


def test_check_says_it_is_unsandboxed(tmp_path):
    nb = write(learner_notebook("03_qkv"), tmp_path / "a.ipynb")
    proc = run_cli("check", str(nb))
    assert "without a sandbox" in proc.stdout
