"""The machine of a term: local users, nbgrader's exchange, and one JupyterHub.

Everything lives in one temporary folder under /tmp (world-traversable, unlike pytest's own
/tmp/pytest-of-root, which only root may enter): the users' homes, the exchange, the hub's
state. Every user is made with `useradd` and the comment MARK, so that a later run removes the
users an interrupted run left behind, and never touches a user of the same name it did not make.

The spawned servers run as the learners, with this checkout's Python (.venv/bin/python). Where
that Python lies below a folder other users may not enter (pyenv's /root/.pyenv behind /root,
mode 700), the hub is started in a mount namespace of its own (`unshare --mount`), in which
that folder is an empty tmpfs holding only the Python install, bound at its own path: the
learners' servers, their kernels and check()'s grading processes (all children of the hub)
find the interpreter, and nothing of the machine is changed. Where the Python is reachable
(a system Python, a runner's hosted tool cache) the hub is started as it is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent  # .venv/bin, not resolved: the venv's own scripts live there
HUB_CONFIG = Path(__file__).with_name("jupyterhub_config.py")
MARK = "attention-course term test"  # the comment (GECOS) of every user the scenario makes
COURSE_ID = "attention-term"


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def what_is_missing() -> str | None:
    """Why the term cannot run on this machine (one sentence), or None."""
    if os.geteuid() != 0:
        return "a term makes local users and starts JupyterHub as root: run the suite as root"
    needs = {
        "jupyterhub (pip install jupyterhub==5.5.4)": importlib.util.find_spec("jupyterhub") is not None,
        "configurable-http-proxy (npm install -g configurable-http-proxy@4.6.3)":
            shutil.which("configurable-http-proxy") is not None,
        "Chromium (apt-get install chromium, or $CHROMIUM)": find_chromium() is not None,
        "bubblewrap (apt-get install bubblewrap; the grader's sandbox)": shutil.which("bwrap") is not None,
        "useradd and userdel (passwd)": bool(shutil.which("useradd") and shutil.which("userdel")),
        "unshare and mount (util-linux)": bool(shutil.which("unshare") and shutil.which("mount")),
        "playwright (pip)": importlib.util.find_spec("playwright") is not None,
    }
    missing = [name for name, ok in needs.items() if not ok]
    return f"not installed: {', '.join(missing)}" if missing else None


# --- users ----------------------------------------------------------------------------------

def _processes_of(uid: int) -> list:
    import psutil

    out = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and uid in (p.info["uids"].real, p.info["uids"].effective):
                out.append(p)
        except psutil.Error:
            pass
    return out


def end_processes_of(uid: int) -> None:
    """SIGKILL, by pid, every process left running as `uid` (a user this scenario made)."""
    import psutil

    procs = _processes_of(uid)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def remove_user(name: str) -> None:
    """Remove a user this scenario made (MARK), its processes first; any other user is left alone."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return
    if entry.pw_gecos != MARK:
        raise RuntimeError(f"a local user {name!r} exists and was not made by this test: not touched")
    end_processes_of(entry.pw_uid)
    subprocess.run(["userdel", "--remove", name], capture_output=True, text=True)


def make_user(name: str, homes: Path) -> pwd.struct_passwd:
    remove_user(name)  # one an interrupted run left behind
    subprocess.run(["useradd", "--comment", MARK, "--create-home", "--home-dir", str(homes / name),
                    "--shell", "/bin/sh", "--user-group", name], check=True, capture_output=True, text=True)
    return pwd.getpwnam(name)


def give(path: Path, user: pwd.struct_passwd) -> None:
    """`path` (and everything below it) owned by `user`, as if they had written it."""
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        os.chown(p, user.pw_uid, user.pw_gid, follow_symlinks=False)


def write_as(user: pwd.struct_passwd, path: Path, text: str | bytes) -> Path:
    """Write a file in `user`'s home as `user` would: every folder made on the way and the file theirs."""
    home = Path(user.pw_dir)
    missing = [p for p in reversed(path.relative_to(home).parents) if not (home / p).exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in missing:
        os.chown(home / p, user.pw_uid, user.pw_gid)
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


# --- the Python the users' servers run --------------------------------------------------------

def _blocked_for_others(path: Path) -> Path | None:
    """The first folder on the way to `path` that a user other than its owner may not enter."""
    for folder in [*reversed(path.parents), path]:
        if folder.is_dir() and not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def hidden_paths() -> dict[Path, list[Path]]:
    """blocked folder -> the folders below it that the users' servers need: the Python install the
    venv's python links to, the venv, the checkout (the course is installed editable)."""
    needed = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), ROOT}
    out: dict[Path, list[Path]] = {}
    for path in sorted(needed):
        blocked = _blocked_for_others(path)
        if blocked is None:
            continue
        if blocked == path:
            raise RuntimeError(f"{path} itself may not be entered by other users: the learners' servers "
                               "cannot run this Python")
        out.setdefault(blocked, []).append(path)
    return out


def in_namespace(cmd: list[str], hidden: dict[Path, list[Path]], stage: Path) -> list[str]:
    """`cmd` run in a mount namespace of its own in which each blocked folder is a tmpfs (mode 755)
    holding only the folders below it that are needed, bound at their own paths (read only)."""
    if not hidden:
        return cmd
    q = shlex.quote
    first, then = ["set -e"], []
    for i, (blocked, paths) in enumerate(hidden.items()):
        for j, path in enumerate(paths):
            spot = stage / f"{i}-{j}"
            spot.mkdir(parents=True)
            first.append(f"mount --bind {q(str(path))} {q(str(spot))}")
            then += [f"mkdir -p {q(str(path))}", f"mount --bind {q(str(spot))} {q(str(path))}",
                     f"mount -o remount,bind,ro {q(str(path))}"]
        first.append(f"mount -t tmpfs -o mode=0755,size=1m attention-term {q(str(blocked))}")
        first += then
        then = []
    script = "\n".join([*first, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *cmd]


# --- the hub ----------------------------------------------------------------------------------

def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Hub:
    """One JupyterHub for the whole term, started as root (in a mount namespace where needed)."""

    def __init__(self, base: Path, users: list[str]):
        self.state = base / "hub"
        self.state.mkdir(mode=0o700)
        self.password = secrets.token_urlsafe(12)
        self.users = users
        self.proc: subprocess.Popen | None = None
        port, hub_port, api_port = _free_ports(3)
        self.url = f"http://127.0.0.1:{port}"
        self.settings = {"dir": str(self.state), "port": port, "hub_port": hub_port, "api_port": api_port,
                         "password": self.password, "users": users, "venv_bin": str(VENV_BIN),
                         "proxy": shutil.which("configurable-http-proxy")}
        self.log_path = self.state / "jupyterhub.log"

    def start(self, timeout: float = 120) -> None:
        settings = self.state / "settings.json"
        settings.write_text(json.dumps(self.settings), encoding="utf-8")
        env = dict(os.environ, ATTENTION_TERM_HUB=str(settings), OMP_NUM_THREADS="1",
                   PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("AUTOGRADER_SANDBOX_UID", None)
        cmd = in_namespace([sys.executable, "-m", "jupyterhub", "-f", str(HUB_CONFIG)], hidden_paths(),
                           self.state / "stage")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.state, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterHub exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"JupyterHub did not answer in {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the hub (it stops the users' servers and the proxy it started), its process group if it
        does not end in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


# --- the term's folder ------------------------------------------------------------------------

def nbgrader_config(exchange: Path, *extra: str) -> str:
    return "\n".join(["c = get_config()  # noqa: F821", f"c.CourseDirectory.course_id = {COURSE_ID!r}",
                      f"c.Exchange.root = {str(exchange)!r}", *extra, ""])


# A learner's JupyterLab without the instructor's parts of nbgrader (its documentation's advice):
# no formgrader, no course list, no "create assignment" toolbar; the Assignments panel stays.
LEARNER_LAB_CONFIG = {"disabledExtensions": {"@jupyter/nbgrader:formgrader": True,
                                             "@jupyter/nbgrader:course-list": True,
                                             "@jupyter/nbgrader:create-assignment": True}}
# Every cell of a notebook in the page, not only those in view (JupyterLab 4 windows long notebooks):
# what the scenario reads of a cell (its prompt, its output) is then there wherever the cell is.
NOTEBOOK_SETTINGS = {"windowingMode": "none"}
NO_NEWS = {"fetchNews": "false", "checkForUpdates": False}  # no question about Jupyter's news feed
LEARNER_SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": False,
                                                                "nbgrader.server_extensions.course_list": False}}}


class Term:
    """The temporary folder, the users with their configuration, the exchange, the course folder."""

    def __init__(self, learners: list[str], instructor: str):
        self.base = Path(tempfile.mkdtemp(prefix="attention-term-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        self.homes = self.base / "home"
        self.homes.mkdir(mode=0o755)
        self.exchange = self.base / "exchange"
        self.exchange.mkdir()
        os.chmod(self.exchange, 0o777 | stat.S_ISVTX)  # nbgrader's exchange: world-writable, sticky
        self.learner_names, self.instructor_name = learners, instructor
        self.users: dict[str, pwd.struct_passwd] = {}
        self.hub: Hub | None = None

    def make_users(self) -> None:
        for name in [*self.learner_names, self.instructor_name]:
            user = self.users[name] = make_user(name, self.homes)
            settings = Path(user.pw_dir) / ".jupyter" / "lab" / "user-settings" / "@jupyterlab"
            write_as(user, settings / "notebook-extension" / "tracker.jupyterlab-settings",
                     json.dumps(NOTEBOOK_SETTINGS))
            write_as(user, settings / "apputils-extension" / "notification.jupyterlab-settings", json.dumps(NO_NEWS))
        for name in self.learner_names:
            user = self.users[name]
            jupyter = Path(user.pw_dir) / ".jupyter"
            write_as(user, jupyter / "nbgrader_config.py", nbgrader_config(self.exchange))
            write_as(user, jupyter / "labconfig" / "page_config.json", json.dumps(LEARNER_LAB_CONFIG))
            write_as(user, jupyter / "jupyter_server_config.json", json.dumps(LEARNER_SERVER_CONFIG))

    @property
    def course(self) -> Path:
        """The instructor's course folder, in their home (formgrader wants it below the server's root)."""
        return Path(self.users[self.instructor_name].pw_dir) / "course"

    def configure_instructor(self) -> None:
        """The instructor's nbgrader configuration: the course folder (formgrader's course), whose own
        nbgrader_config.py is read too, so that formgrader's buttons behave as in that folder."""
        user = self.users[self.instructor_name]
        own = self.course / "nbgrader_config.py"
        write_as(user, Path(user.pw_dir) / ".jupyter" / "nbgrader_config.py", nbgrader_config(
            self.exchange, f"c.CourseDirectory.root = {str(self.course)!r}", f"load_subconfig({str(own)!r})"))

    def home(self, name: str) -> Path:
        return Path(self.users[name].pw_dir)

    def start_hub(self) -> Hub:
        self.hub = Hub(self.base, [*self.learner_names, self.instructor_name])
        self.hub.start()
        return self.hub

    def close(self) -> None:
        try:
            if self.hub is not None:
                self.hub.stop()
        finally:
            for name in [*self.learner_names, self.instructor_name]:
                remove_user(name)
            shutil.rmtree(self.base, ignore_errors=True)
