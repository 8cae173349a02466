"""The grading worker: runs a learner's code in a process of its own.

The trusted grader starts this file as a script (``python -I worker.py REQ_FD REPLY_FD``),
inside the sandbox where one is used, and sends one request per line; the worker answers
each with one line (see `protocol`, which sits beside this file in the sandbox too).

The worker, not the trusted side, looks closely at the learner's source: it parses each
code cell with `ast` and runs only the top level's imports, functions, classes and
assignments (expressions such as plots and prints, loops, `with` blocks and asserts are
skipped), so a notebook built to be slow to parse costs only its own time limit.

A fresh worker imports NumPy and PyTorch (and runs the one-time set-up of autograd and the
device check that the checks need) before it reads the first request, so that this start-up
overlaps the trusted side's own, and so that it does not count against the loading of the
learner's code. No learner code runs before the load request.

Started as ``python -I worker.py --template CTRL_FD`` it is instead the warm start's
template (`warm_server.template_main`; the trusted side is `autograder.isolation.warm`): it imports NumPy
and PyTorch once, then, for each submission, forks a worker that runs `main` on the pipes the
trusted side passed over CTRL_FD.

This file depends on the standard library, NumPy and PyTorch (imported before the first request
with `--preload`, as the grader starts it; otherwise when the learner's code imports it), and on
the files copied beside it (`autograder.isolation.worker_files`), which it imports as top-level modules:
`protocol`, `device_check` (the device check's dispatch mode), and for a template `warm_server`.
"""

from __future__ import annotations

import ast
import gc
import os
import re
import sys
import traceback

if __name__ == "__main__":
    # No cyclic garbage collection while NumPy and PyTorch are imported: they make objects by the hundred
    # thousand, and three full collections took 150 ms of a worker's start. `main` freezes what was imported
    # (never collected, never scanned again) and collects as usual from there, before any learner's code runs.
    gc.disable()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import protocol as P  # noqa: E402
from device_check import device_check_mode, plain_checks_without_symbolic_shapes  # noqa: E402

# The grader's own modules beside this file that a check may build objects from in the learner's
# process (target {"grader": NAME}): optimizers that do not import PyTorch's compiler. Each is loaded
# from its file under a private name, so that a module of the learner's of the same name is not it.
GRADER_MODULES = ("optimizers",)
_GRADER_LOADED: dict = {}


def _grader_module(name: str):
    if name not in _GRADER_LOADED:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
        spec = importlib.util.spec_from_file_location(f"_grader_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _GRADER_LOADED[name] = module
    return _GRADER_LOADED[name]


KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
        ast.Assign, ast.AnnAssign, ast.AugAssign)
MAGIC_RE = re.compile(r"^\s*[%!]")
MESSAGE_CHARS = 500
REPORTED = 100  # load errors and notes sent back, each; the rest are counted


# --- arguments a call must leave as they were -------------------------------------------------
# A function must not change what its caller passed (the rule every exercise states). Before a call
# that asks for it ("unchanged": true), the worker notes what it can of the arguments cheaply: a
# tensor's version counter (every in-place operation bumps it), shape, strides and storage; a NumPy
# array's bytes; a list's or a dict's length and items, recursively; the value of an immutable item.
# Other objects (the learner's modules, handles) are not looked into. This is a check of honest
# mistakes, not a boundary: the learner's code runs in this process and could hide a change.
SNAPSHOT_ITEMS = 100_000  # items looked at per call; beyond them, the rest is not compared
ARRAY_BYTES = 1 << 24  # a NumPy argument larger than this is not compared
_SCALARS = (int, float, complex, bool, str, bytes, type(None))


def _snapshot(value, budget: list, depth: int = 0):
    """What can be compared after the call, or None where nothing is."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 20:
        return None
    t = type(value)
    if t in _SCALARS:
        return ("s", value)
    torch = sys.modules.get("torch")
    if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
        try:
            return ("t", id(value), value._version, tuple(value.shape), value.stride(), value.dtype,
                    value.device, value.untyped_storage().data_ptr() if value.device.type != "meta" else 0)
        except Exception:  # noqa: BLE001 - a tensor without strides or storage (sparse, nested)
            return None
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:
        if value.nbytes > ARRAY_BYTES or value.dtype.hasobject:
            return None
        return ("a", id(value), value.shape, value.dtype.str, value.tobytes())
    if t in (list, tuple):
        return (t.__name__, id(value), len(value), [_snapshot(v, budget, depth + 1) for v in value])
    if t is dict:
        return ("d", id(value), len(value), [(k, _snapshot(v, budget, depth + 1)) for k, v in value.items()])
    return None


def _same(before, value) -> bool:
    if before is None:
        return True
    kind = before[0]
    if kind == "s":
        a = before[1]
        return type(a) is type(value) and (a == value or (a != a and value != value))
    if kind == "t":
        now = _snapshot(value, [1])
        return now is not None and now == before
    if kind == "a":
        np = sys.modules["numpy"]
        return (type(value) is np.ndarray and (id(value), value.shape, value.dtype.str) == before[1:4]
                and value.tobytes() == before[4])
    if kind in ("list", "tuple"):
        return (type(value).__name__ == kind and id(value) == before[1] and len(value) == before[2]
                and all(_same(b, v) for b, v in zip(before[3], value)))
    return (type(value) is dict and id(value) == before[1] and len(value) == before[2]
            and all(k in value and _same(b, value[k]) for k, b in before[3]))


def _changed_argument(fn, args, kwargs, snaps) -> str | None:
    """The name of the first argument the call changed (a parameter's name where the function's
    signature gives one), or None. The signature is read only once a change is found (reading it
    took a third of a repeated call's own time)."""
    for i, (a, snap) in enumerate(zip(args, snaps[0])):
        if not _same(snap, a):
            names = _positional_names(fn)
            return names[i] if i < len(names) else f"argument {i + 1}"
    for k, snap in snaps[1].items():
        if not _same(snap, kwargs[k]):
            return str(k)
    return None


def _positional_names(fn) -> list:
    try:
        import inspect

        torch = sys.modules.get("torch")
        if torch is not None and isinstance(fn, torch.nn.Module):
            fn = fn.forward  # a module is called through its forward
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except Exception:  # noqa: BLE001 - no signature: positions only
        return []


def statements(cells: list) -> tuple[list[dict], list[str]]:
    """The statements to run, in notebook order, and notes on what was skipped."""
    out: list[dict] = []
    notes: list[str] = []
    for cell in cells:
        label, source = str(cell["label"]), str(cell["source"])
        # IPython magics and shell escapes are not Python: blank them, keeping line numbers.
        lines = ["" if MAGIC_RE.match(ln) else ln for ln in source.split("\n")]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError as exc:
            notes.append(f"{label} has a syntax error at line {exc.lineno}: {exc.msg}; nothing in it was run")
            continue
        except (ValueError, RecursionError, MemoryError):
            notes.append(f"{label} could not be parsed; nothing in it was run")
            continue
        spans = [(min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]), n.end_lineno)
                 for n in tree.body]
        # Statements that share a line with another: sorted spans make this one linear pass.
        shared = set()
        order = sorted(range(len(spans)), key=lambda i: spans[i])
        for a, b in zip(order, order[1:]):
            if spans[b][0] <= spans[a][1]:
                shared.update((a, b))
        for i, node in enumerate(tree.body):
            if not isinstance(node, KEPT):
                continue
            first, last = spans[i]
            # `x = 1; plot(x)` on one line: run only the assignment, rebuilt from the tree.
            text = ast.unparse(node) if i in shared else "\n".join(lines[first - 1: last])
            out.append({"cell": label, "line": first, "source": text})
    return out, notes


def course_module():
    """The course's package as a notebook loaded here sees it: the learner's own check cell
    (``from autograder import check; check()``, ``import autograder; autograder.check("part 3")``,
    ``r = check()``) runs without an error, and check() does nothing, as the package's own check()
    does in a grading worker (and `check()` alone, an expression, is not even run). Nothing else of
    the package is here: any other use of it is the learner's code, and its error is reported.

    The sandbox holds no copy of the package, so without this every learner who checks from a cell,
    as the notebook tells them to, got a note that `autograder` cannot be imported."""
    import types

    module = types.ModuleType("autograder", "The course's package, as a grading worker offers it: check() only.")

    def check(part=None, *, assignment=None, seed=None):
        """In a grading worker, check() does nothing (autograder.check's signature)."""
        return None

    check.__module__ = "autograder"
    module.check = check
    return module


class _Reply(Exception):
    def __init__(self, kind: str, etype: str, message: str):
        self.kind, self.etype, self.message = kind, etype, message


def _learner_error(exc: BaseException, kind: str = P.KIND_LEARNER) -> _Reply:
    if isinstance(exc, NotImplementedError):
        kind = P.KIND_NOT_IMPLEMENTED
    try:
        message = str(exc)[:MESSAGE_CHARS]
    except BaseException:  # a hostile __str__
        message = "(message unavailable)"
    where = ""
    try:
        # a cell of the notebook file ("<cell 7 (softmax)>") or of a kernel's history ("<In [7]>")
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(("<cell", "<In ["))]
        if frames:
            where = f"{frames[-1].filename[1:-1]}, line {frames[-1].lineno}"
    except BaseException:
        pass
    try:
        etype = str(type(exc).__name__)[:100]
    except BaseException:
        etype = "Exception"
    return _Reply(kind, etype, (message + (f" ({where})" if where else "")).strip())


class Worker:
    warm = False  # torch was imported before the load request (preloaded, or a warm template's fork)

    def __init__(self):
        self.ns: dict = {"__name__": "__learner__", "__builtins__": __builtins__}
        self.handles: dict[int, object] = {}
        self.decode = P.Decoder(self.from_handle, int_keys=True)
        self.reply_bytes = 64 * 2**20  # the load request says the grader's own (Limits.reply_bytes)
        self.sized = 0  # what the last value encoded takes in a reply (P.payload_bytes)

    # handles ---------------------------------------------------------------------------
    def to_handle(self, obj):
        hid = len(self.handles) + 1
        self.handles[hid] = obj
        try:
            tname = str(type(obj).__name__)[:100]
        except BaseException:
            tname = "object"
        return {P.TAG_HANDLE: {"id": hid, "type": tname}}

    def from_handle(self, val):
        hid = val.get("id") if isinstance(val, dict) else None
        if hid not in self.handles:
            raise P.CodecError("unknown handle")
        return self.handles[hid]

    def enc(self, value, used: int = 0):
        """`value` encoded, refused before it is encoded where its reply would be over the grader's limit
        (`used`: what the same reply already holds; `self.sized` is then what this value adds to it)."""
        left = self.reply_bytes - used
        size = self.sized = P.payload_bytes(value, left)
        if size > left:
            most = self.reply_bytes
            most = f"{most // 2**20} MiB" if most >= 2**20 else f"{most} bytes"
            raise P.CodecError(f"the result is too large to send (over {most}, the most one reply may hold)")
        return P.encode(value, self.to_handle)

    def target(self, req):
        t = req.get("target")
        if isinstance(t, dict) and "name" in t:
            name = t["name"]
            if name not in self.ns:
                raise _Reply(P.KIND_MISSING, "NameError", f"{name} is not defined")
            return self.ns[name]
        if isinstance(t, dict) and "handle" in t:
            return self.from_handle({"id": t["handle"]})
        if isinstance(t, dict) and t.get("grader") in GRADER_MODULES:
            return _grader_module(t["grader"])
        raise P.CodecError("malformed target")

    # operations ------------------------------------------------------------------------
    def op_load(self, req):
        self.op_seed(req)
        if self.warm:
            # Without a preload, torch is imported by the learner's top level, which then meets
            # torch's import-time seed (random, from the OS); a preloaded or warm worker's learner
            # meets the same kind of seed, not the load's.
            sys.modules["torch"].seed()
        if type(req.get("reply_bytes")) is int and req["reply_bytes"] > 0:
            self.reply_bytes = req["reply_bytes"]
        todo, notes = statements(req["cells"])
        # the course's package for the learner's check cell, unless the real one was imported (a test
        # that runs the worker in its own process); where the course is installed, whether it is
        # importable or not (the sandbox), the notebook meets the same module
        sys.modules.setdefault("autograder", course_module())
        errors = []
        for st in todo:
            code_text = "\n" * (st["line"] - 1) + st["source"]
            try:
                exec(compile(code_text, f"<{st['cell']}>", "exec"), self.ns)
            except BaseException as exc:  # the learner's error, reported as data
                if isinstance(exc, KeyboardInterrupt):
                    raise
                e = _learner_error(exc)
                errors.append({"cell": st["cell"], "line": st["line"], "error": f"{e.etype}: {e.message}"})
        # The grader keeps a few of each; the rest only as a count (a reply stays small).
        more = max(len(errors) - REPORTED, 0) + max(len(notes) - REPORTED, 0)
        return {"errors": errors[:REPORTED], "notes": notes[:REPORTED], "more": more}

    def op_seed(self, req):
        import random

        import numpy as np

        seed = int(req["seed"]) % 2**32
        random.seed(seed)
        np.random.seed(seed)
        if "torch" in sys.modules:
            sys.modules["torch"].manual_seed(seed)
        return None

    def op_has(self, req):
        return req["name"] in self.ns

    def op_call(self, req):
        fn = self.target(req)
        repeat = req.get("repeat")
        if repeat is not None and (type(repeat) is not int or not 1 <= repeat <= P.MAX_REPEAT):
            raise P.CodecError("malformed repeat")
        # a repeated call's arguments are decoded anew for each call, from copies of their first decoding
        self.decode.memo = {} if repeat is not None else None
        try:
            return self._calls(req, fn, repeat)
        finally:
            self.decode.memo = None

    def _calls(self, req, fn, repeat):
        values, used = [], 0
        for _ in range(1 if repeat is None else repeat):  # as that many calls: arguments decoded anew each time
            args = self.decode({P.TAG_TUPLE: req["args"]})
            kwargs = self.decode({P.TAG_DICT: req["kwargs"]})
            if req.get("unchanged") is True:
                budget = [SNAPSHOT_ITEMS]
                snaps = ([_snapshot(a, budget) for a in args], {k: _snapshot(v, budget) for k, v in kwargs.items()})
            try:
                if req.get("device_check"):
                    # the CPU stand-ins of random operations draw numbers, which meta tensors do not
                    with sys.modules["torch"].random.fork_rng(devices=[]), device_check_mode()():
                        result = fn(*args, **kwargs)
                else:
                    result = fn(*args, **kwargs)
            except _Reply:
                raise
            except BaseException as exc:
                raise _learner_error(exc)
            if req.get("unchanged") is True:
                try:
                    changed = _changed_argument(fn, args, kwargs, snaps)
                except BaseException as exc:  # a hostile __eq__ of an argument the learner changed
                    raise _learner_error(exc)
                if changed is not None:
                    raise _Reply(P.KIND_CHANGED, "ArgumentChanged", changed)
            values.append(self.enc(result, used))
            used += self.sized
        return values[0] if repeat is None else values

    def op_getattr(self, req):
        obj = self.target(req)
        try:
            value = getattr(obj, req["attr"])
        except BaseException as exc:
            raise _learner_error(exc)
        return self.enc(value)

    def op_with_grad(self, req):
        import torch

        fn = self.target(req)
        args = list(self.decode({P.TAG_TUPLE: req["args"]}))
        kwargs = self.decode({P.TAG_DICT: req["kwargs"]})
        cotangents = self.decode({P.TAG_TUPLE: req["cotangents"]})
        leaves = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                args[i] = a.detach().requires_grad_(True)
                leaves.append(i)
        module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
        module = module if isinstance(module, torch.nn.Module) else None
        try:
            if module is not None:
                module.zero_grad(set_to_none=True)
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(o, g) for o, g in zip(outs, cotangents) if g is not None]
            if not pairs or not all(isinstance(o, torch.Tensor) and o.requires_grad for o, _ in pairs):
                raise _Reply(P.KIND_LEARNER, "RuntimeError", "the output does not depend differentiably on the inputs")
            for o, g in pairs:
                if o.shape != g.shape:
                    raise RuntimeError(f"Mismatch in shape: grad_output has a shape of {tuple(g.shape)} and "
                                       f"output has a shape of {tuple(o.shape)}")
            # The gradients of sum(o * g) are exactly those of backward(o, g) (the product's own
            # gradient is g * 1), without the symbolic-shape machinery that given output
            # gradients import on their first use (0.3 s).
            sum((o * g.to(o.device, o.dtype)).sum() for o, g in pairs).backward()
        except _Reply:
            raise
        except BaseException as exc:
            raise _learner_error(exc)
        arg_grads = [args[i].grad if i in leaves else None for i in range(len(args))]
        param_grads = {}
        if req.get("params") and module is not None:
            param_grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        return {"output": self.enc(out), "arg_grads": self.enc(arg_grads), "param_grads": self.enc(param_grads)}

    def handle(self, req):
        op = req.get("op") if isinstance(req, dict) else None
        if op not in P.OPS:
            raise P.CodecError("unknown op")
        return getattr(self, f"op_{op}")(req)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _error(req_id, kind, etype, message) -> dict:
    return {"id": req_id, "ok": False, "kind": kind, "type": etype, "message": message}


def preload() -> None:
    """Import NumPy and PyTorch and run, once, the lazy set-up that the first checks would
    otherwise pay for: a backward pass and an operation under the device check."""
    import numpy as np  # noqa: F401
    import torch

    Worker.warm = True
    torch.set_num_threads(1)
    plain_checks_without_symbolic_shapes()
    x = torch.ones(2, 2, requires_grad=True)
    (x @ x).sum().backward()
    m = torch.ones(2, 2, device="meta")
    with torch.random.fork_rng(devices=[]), device_check_mode()():
        torch.softmax(m @ m / 2, -1)


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--template"]:
        import warm_server

        return warm_server.template_main(int(argv[2]), preload=preload, serve=main)
    req_fd, reply_fd = int(argv[1]), int(argv[2])
    if argv[3:4] == ["--preload"]:
        try:
            preload()
        except Exception:  # noqa: BLE001 - the learner's own import of torch then reports it
            pass
    gc.freeze()
    gc.enable()
    # Learner code sees /dev/null as stdin; requests and replies use private descriptors.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    requests = os.fdopen(req_fd, "rb", buffering=0)
    os.set_inheritable(reply_fd, False)
    w = Worker()
    buf = bytearray()
    while True:
        while b"\n" not in buf:
            chunk = requests.read(1 << 20)
            if not chunk:
                return 0
            buf += chunk
        end = buf.index(b"\n")
        line, buf = bytes(buf[:end]), buf[end + 1:]
        req_id = None
        try:
            req = P.parse_frame(line, max_containers=10**7)
            req_id = req.get("id") if isinstance(req, dict) else None
            reply = {"id": req_id, "ok": True, "value": w.handle(req)}
        except _Reply as r:
            reply = _error(req_id, r.kind, r.etype, r.message)
        except P.CodecError as exc:
            reply = _error(req_id, P.KIND_CODEC, "CodecError", str(exc))
        except BaseException as exc:  # anything else is the learner's doing
            r = _learner_error(exc)
            reply = _error(req_id, r.kind, r.etype, r.message)
        try:
            data = P.frame(reply)
        except BaseException as exc:
            data = P.frame(_error(req_id, P.KIND_CODEC, "CodecError",
                                  f"the result could not be encoded: {type(exc).__name__}"))
        _write(reply_fd, data)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
