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
template (see `autograder.warm`): it imports NumPy and PyTorch once, then, for each
submission, forks a worker that runs `main` on the pipes the trusted side passed over
CTRL_FD. The template never runs learner code, and never reads what learner code left
behind: the trusted side cleans the sandbox's writable folders from outside.

This file depends on the standard library, NumPy and PyTorch only (imported before the first
request with `--preload`, as the grader starts it; otherwise when the learner's code imports it).
"""

from __future__ import annotations

import ast
import os
import re
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import protocol as P  # noqa: E402

KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
        ast.Assign, ast.AnnAssign, ast.AugAssign)
MAGIC_RE = re.compile(r"^\s*[%!]")
MESSAGE_CHARS = 500
REPORTED = 100  # load errors and notes sent back, each; the rest are counted


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


def _device_check_mode():
    """A dispatch mode that stands in for a GPU on a CPU-only grader, through the meta device.

    Every operation that mixes a meta tensor with a CPU tensor of one or more dimensions
    fails, as CUDA does with CPU tensors (0-dim CPU tensors mix, as on CUDA; device copies and
    index tensors are allowed): the meta device's own kernels miss some of these (a matmul, a
    gather), so the mode checks every operation itself.

    The operations themselves do not run on the meta device's kernels: many of those are
    written in Python and their first call imports PyTorch's compiler (about 0.7 s, more than
    most checks take). Views (in place too), device copies and detaches run on the meta tensors;
    every other operation on meta tensors runs on CPU stand-ins of the same shape, strides and
    dtype (ones for floating point, zeros otherwise), and its results come back as meta
    tensors, or as the caller's own tensors where the operation writes in place. What depends
    on the values (.item(), `if mask.any():`, a boolean mask's selection) raises
    NotImplementedError, as the meta device cannot run it either: such code gets no verdict."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    aten = torch.ops.aten
    allowed = {aten._to_copy, aten.copy_, aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_,
               aten.lift_fresh, aten.lift_fresh_copy, aten.detach, aten.alias}
    direct = {aten._to_copy, aten.copy_, aten.detach, aten.alias, aten.lift_fresh, aten.lift_fresh_copy,
              aten.resize_}  # metadata and device copies: the meta device's own kernels are C++
    data_dependent = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.equal, aten.is_nonzero,
                      aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.bincount,
                      aten.argwhere, aten.nonzero_numpy}
    by_mask = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}

    def on_meta(a) -> bool:
        return isinstance(a, torch.Tensor) and a.device.type == "meta"

    def stand_in(a):
        if isinstance(a, torch.device) and a.type == "meta":
            return torch.device("cpu")
        if not on_meta(a):
            return a
        size, stride, offset = a.size(), a.stride(), a.storage_offset()
        n = 0 if 0 in size else 1 + sum((s - 1) * st for s, st in zip(size, stride))
        fill = 1 if (a.is_floating_point() or a.is_complex()) else 0
        return torch.full((offset + n,), fill, dtype=a.dtype).as_strided(size, stride, offset)

    def as_meta(o):
        if isinstance(o, torch.Tensor):
            return torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device="meta")
        return o

    def written(func, args, kwargs, i):
        """The caller's argument that return `i` of `func` writes in place (x.add_(y), out=), or None."""
        schema = func._schema
        ret = schema.returns[i].alias_info if i < len(schema.returns) else None
        if ret is None or not ret.is_write:
            return None
        given = dict(zip([a.name for a in schema.arguments], args))
        given.update(kwargs)
        for a in schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write and set(a.alias_info.before_set) & set(
                    ret.before_set):
                return given.get(a.name)
        return None

    class DeviceCheck(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # PyTorch wraps a mode's __torch_dispatch__ so that its compiler skips it, which
            # imports the compiler on the first call; nothing here is ever compiled
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            packet = func.overloadpacket
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            meta = any(t.device.type == "meta" for t in tensors)
            if meta and packet not in allowed and any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                                   f"devices, meta and cpu! (in {packet.__name__})")
            to_meta = meta or any(isinstance(v, torch.device) and v.type == "meta" for v in kwargs.values())
            if not to_meta or packet in direct or func.is_view or torch.Tag.inplace_view in func.tags:
                return func(*args, **kwargs)
            if packet in data_dependent or (packet in by_mask and any(
                    on_meta(i) and i.dtype in (torch.bool, torch.uint8) for i in tree_leaves(args[1:2]))) or (
                    packet is aten.repeat_interleave and any(on_meta(a) for a in args[1:2])):
                raise NotImplementedError(f"{packet.__name__} depends on the values of a tensor on the meta "
                                          "device, which has none")
            out = func(*tree_map(stand_in, args), **tree_map(stand_in, kwargs))
            outs = out if isinstance(out, tuple) else (out,)
            back = []
            for i, o in enumerate(outs):
                mine = written(func, args, kwargs, i)
                back.append(mine if mine is not None else tree_map(as_meta, o))
            return tuple(back) if isinstance(out, tuple) else back[0]

    return DeviceCheck


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
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell")]
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

    def enc(self, value):
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
        raise P.CodecError("malformed target")

    # operations ------------------------------------------------------------------------
    def op_load(self, req):
        self.op_seed(req)
        if self.warm:
            # Without a preload, torch is imported by the learner's top level, which then meets
            # torch's import-time seed (random, from the OS); a preloaded or warm worker's learner
            # meets the same kind of seed, not the load's.
            sys.modules["torch"].seed()
        todo, notes = statements(req["cells"])
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
        args = self.decode({P.TAG_TUPLE: req["args"]})
        kwargs = self.decode({P.TAG_DICT: req["kwargs"]})
        try:
            if req.get("device_check"):
                # the CPU stand-ins of random operations draw numbers, which meta tensors do not
                with sys.modules["torch"].random.fork_rng(devices=[]), _device_check_mode()():
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
        except _Reply:
            raise
        except BaseException as exc:
            raise _learner_error(exc)
        return self.enc(result)

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
    x = torch.ones(2, 2, requires_grad=True)
    (x @ x).sum().backward()
    m = torch.ones(2, 2, device="meta")
    with torch.random.fork_rng(devices=[]), _device_check_mode()():
        torch.softmax(m @ m / 2, -1)


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--template"]:
        return template_main(int(argv[2]))
    req_fd, reply_fd = int(argv[1]), int(argv[2])
    if argv[3:4] == ["--preload"]:
        try:
            preload()
        except Exception:  # noqa: BLE001 - the learner's own import of torch then reports it
            pass
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


# --- the warm start's template ---------------------------------------------------------------

PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 4, 22, 36, 38, 2


def _prctl(*args) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _load_filter(prog: bytes) -> None:
    import ctypes

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)


def _shared_writable_mappings() -> int:
    """Writable shared mappings would be shared with every forked worker: there must be none."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            perms = line.split()[1]
            if perms[1] == "w" and perms[3] == "s":
                n += 1
    return n


def _child(fds: list[int], ctrl, prog: bytes) -> None:
    """In the forked worker: become the submission's worker on the passed pipes. Never returns."""
    import signal

    code = 70
    try:
        os.setsid()  # its own session and process group: kill(0) and killpg reach only its own
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        req_fd, reply_fd, out_fd = fds
        ctrl.close()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = {0, 1, 2, req_fd, reply_fd}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.chdir("/tmp")
        _load_filter(prog)
        code = main([sys.argv[0], str(req_fd), str(reply_fd)])
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code if isinstance(code, int) else 70)


def template_main(ctrl_fd: int) -> int:
    """The warm start's template: import once, then fork one worker per request on CTRL_FD.

    Messages are JSON on a SOCK_SEQPACKET socket. The trusted side sends ``{"op": "spawn"}``
    with three descriptors (requests, replies, output); the template forks and answers
    ``{"pid"}``, the worker's pid in the sandbox.

    The template never reads or holds anything a learner produced: it looks at no file,
    folder or process a worker could have touched, and the only message it reads is the
    trusted side's. What a learner leaves behind is removed from outside (`autograder.warm`):
    the trusted side replaces /tmp and /dev/shm with new empty tmpfs mounts and resets the
    PID namespace's last pid before each fork. So the template's memory, and every worker
    forked from it, is the same whatever the learners before did."""
    import json
    import signal
    import socket
    import time

    import numpy as np
    import torch

    preload()  # its lazy set-up too, once, before any fork: not again in every learner's worker
    torch.ones(8, 8) @ torch.ones(8, 8), np.ones(8) @ np.ones(8)
    import seccomp as S

    _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/PID/mem, environ and ptrace of us need CAP_SYS_PTRACE now
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    # A learner's orphans come to us, not to the namespace's init, and are reaped by the kernel
    # at once (SIGCHLD ignored): no process's counters (the CPU time of reaped children, context
    # switches) keep a trace of what a learner ran, for the next one to read in /proc.
    _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Hold nothing of /tmp (bubblewrap started us there): the trusted side unmounts it after
    # every worker, which a process whose working folder it is would keep busy.
    os.chdir("/")
    me = os.getpid()
    prog = S.child_program(sorted({1, me, os.getpgid(0), os.getsid(0)}))
    Worker.warm = True
    ctrl = socket.socket(fileno=ctrl_fd)
    hello = {"ready": True, "pid": me, "threads": len(os.listdir("/proc/self/task")),
             "shared": _shared_writable_mappings()}
    ctrl.send(json.dumps(hello).encode())
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 3)
        except OSError:
            return 1
        if not msg:
            return 0
        try:
            req = json.loads(msg)
        except ValueError:
            req = None
        if not isinstance(req, dict) or req.get("op") != "spawn" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            ctrl.send(json.dumps({"error": "bad request"}).encode())
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = -1
        for attempt in range(50):
            try:
                pid = os.fork()
                break
            except BlockingIOError:
                # EAGAIN: the previous worker's processes are dead but not all reaped yet, and
                # they still count against the uid's process limit
                time.sleep(0.02 * (attempt + 1))
        if pid == 0:
            _child(fds, ctrl, prog)
        for fd in fds:
            os.close(fd)
        ctrl.send(json.dumps({"pid": pid} if pid > 0 else {"error": "fork failed"}).encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
