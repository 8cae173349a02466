"""The trusted side of the process boundary: start a worker, talk to it, time it out.

`Submission` owns one learner's worker process (restarting it after a crash or a
timeout, within a budget) and `Learner` is the proxy that hidden tests call. Only data
comes back (see `autograder.worker` for the codec); a learner's objects never exist here.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import worker as codec

WORKER_SCRIPT = Path(codec.__file__).resolve()
OUTPUT_CAP = 64 * 1024  # bytes of the learner's stdout/stderr kept per worker


class GradingError(Exception):
    """Raised in a hidden test when the learner's side failed; becomes a hint."""

    def __init__(self, name: str, message: str = ""):
        super().__init__(message or name)
        self.name = name


class LearnerError(GradingError):
    """The learner's function raised an exception."""

    def __init__(self, name: str, etype: str, message: str):
        super().__init__(name, f"{etype}: {message}")
        self.etype, self.message = etype, message


class NotImplementedRemote(GradingError):
    """The learner's function is still the stub."""


class MissingName(GradingError):
    """The notebook does not define the name."""


class CallTimeout(GradingError):
    """The call did not finish in time; the worker was killed."""

    def __init__(self, name: str, seconds: float):
        super().__init__(name, f"timed out after {seconds:.0f} s")
        self.seconds = seconds


class WorkerDied(GradingError):
    """The learner's code ended the worker process (exit, os._exit, a crash)."""


class BoundaryError(GradingError):
    """The worker sent something that breaks the protocol, or too much of it."""


@dataclass
class LoadedCode:
    """What the worker runs from a notebook: top-level statements, with their cell and line."""

    statements: list[dict]
    notes: list[str] = field(default_factory=list)


class _Output:
    """Drains a pipe in a thread, keeping at most OUTPUT_CAP bytes."""

    def __init__(self, fd: int):
        self.data = bytearray()
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, args=(fd,), daemon=True)
        self.thread.start()

    def _run(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    return
                room = OUTPUT_CAP - len(self.data)
                self.data += chunk[: max(room, 0)]
                self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        s = self.data.decode("utf-8", "replace")
        return s + (f"\n[... {self.dropped} more bytes of output dropped]" if self.dropped else "")


class Submission:
    """One learner's code, running in a worker process that is restarted when needed."""

    def __init__(
        self,
        code: LoadedCode,
        *,
        call_timeout: float = 20.0,
        load_timeout: float = 60.0,
        total_timeout: float = 120.0,
        max_restarts: int = 3,
        env: dict | None = None,
        python: str = sys.executable,
        sandbox=None,
        notebook: str | Path | None = None,
    ):
        self.code = code
        self.call_timeout = call_timeout
        self.load_timeout = load_timeout
        self.deadline = time.monotonic() + total_timeout
        self.total_timeout = total_timeout
        self.restarts_left = max_restarts
        self.python = python
        self.extra_env = env or {}
        self.sandbox = sandbox  # an autograder.sandbox.Sandbox, or None to run unsandboxed
        self.notebook = notebook  # shown read-only inside the sandbox
        self.proc: subprocess.Popen | None = None
        self.generation = 0
        self.load_errors: list[dict] = []
        self.load_failure: GradingError | None = None
        self.outputs: list[str] = []
        self._next_id = 1
        self._tmp = tempfile.TemporaryDirectory(prefix="grade-worker-")

    # process management --------------------------------------------------------------
    def _env(self) -> dict:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self._tmp.name,
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(self.extra_env)
        return env

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        tail = [str(req_r), str(rep_w)]
        close_after: list[int] = []
        try:
            if self.sandbox is not None:
                w = self.sandbox.wrap(tail, worker_script=WORKER_SCRIPT, env=self._env(),
                                      notebook=self.notebook, extra_fds=(req_r, rep_w))
                close_after = w.close_fds
                argv, pass_fds, env, cwd = w.argv, w.pass_fds, w.env, w.cwd
            else:
                argv = [self.python, "-I", str(WORKER_SCRIPT), *tail]
                pass_fds, env, cwd = (req_r, rep_w), self._env(), self._tmp.name
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                pass_fds=pass_fds,
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own process group: one kill ends everything it started
            )
        except BaseException:
            for fd in (req_r, req_w, rep_r, rep_w, out_r, out_w, *close_after):
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise
        for fd in (req_r, rep_w, out_w, *close_after):
            os.close(fd)
        self._req = req_w
        self._rep = rep_r
        self._buf = b""
        self._out = _Output(out_r)
        self.generation += 1

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._req, self._rep):
            try:
                os.close(fd)
            except OSError:
                pass
        self._out.thread.join(timeout=2)
        self.outputs.append(self._out.text())
        self.proc = None

    def close(self) -> None:
        self._kill()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ensure_started(self) -> None:
        """A live worker with the learner's code loaded, or raise the reason there is none."""
        if self.load_failure is not None:
            raise self.load_failure
        if self.proc is not None:
            return
        if self.generation > 0:
            if self.restarts_left <= 0:
                self.load_failure = WorkerDied("", "the grading process had to be restarted too often")
                raise self.load_failure
            self.restarts_left -= 1
        self._start()
        try:
            result = self._request({"op": "load", "statements": self.code.statements},
                                   name="", timeout=self.load_timeout)
        except CallTimeout as exc:
            self.load_failure = CallTimeout("", exc.seconds)
            self.load_failure.during_load = True
            raise self.load_failure
        except WorkerDied:
            self.load_failure = WorkerDied("", "the notebook's code ended the grading process while loading")
            self.load_failure.during_load = True
            raise self.load_failure
        if self.generation == 1:
            self.load_errors = result.get("errors", []) if isinstance(result, dict) else []

    # requests --------------------------------------------------------------------------
    def _request(self, req: dict, *, name: str, timeout: float | None = None):
        req_id = self._next_id
        self._next_id += 1
        req = dict(req, id=req_id)
        data = json.dumps(req, allow_nan=False).encode() + b"\n"
        remaining = self.deadline - time.monotonic()
        limit = min(timeout or self.call_timeout, remaining)
        if limit <= 0:
            self._kill()
            self.load_failure = CallTimeout(name, self.total_timeout)
            raise self.load_failure
        try:
            os.write(self._req, data) if len(data) < 65536 else self._write_all(data)
        except (BrokenPipeError, OSError):
            self._kill()
            raise WorkerDied(name)
        end = time.monotonic() + limit
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                self._kill()
                raise CallTimeout(name, limit)
            ready, _, _ = select.select([self._rep], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._rep, 1 << 20)
            if not chunk:
                self._kill()
                raise WorkerDied(name)
            self._buf += chunk
            if len(self._buf) > codec.MAX_MESSAGE:
                self._kill()
                raise BoundaryError(name, "the reply was larger than the grader accepts")
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            self._kill()
            raise BoundaryError(name, "the grading process sent a malformed reply")
        if not isinstance(reply, dict) or reply.get("id") != req_id:
            self._kill()
            raise BoundaryError(name, "the grading process sent an unexpected reply")
        if reply.get("ok") is True:
            return reply.get("value")
        kind = reply.get("kind")
        etype, message = str(reply.get("type", "Error"))[:100], str(reply.get("message", ""))[:600]
        if kind == "notimplemented":
            raise NotImplementedRemote(name)
        if kind == "missing":
            raise MissingName(name)
        if kind == "codec":
            raise BoundaryError(name, message)
        raise LearnerError(name, etype, message)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._req, view)
            view = view[n:]

    def request(self, req: dict, *, name: str):
        self.ensure_started()
        value = self._request(req, name=name)
        return value

    def decode(self, value):
        gen = self.generation
        return codec.decode(value, from_handle=lambda h: RemoteObject(self, h, gen))

    def encode(self, value):
        def to_handle(obj):
            if isinstance(obj, RemoteObject):
                if obj._gen != self.generation:
                    raise BoundaryError(obj._label, "a handle from before a restart was used")
                return {"__handle__": {"id": obj._id}}
            raise codec.CodecError(f"a value of type {type(obj).__name__} cannot be sent")

        return codec.encode(value, to_handle)

    def output(self) -> str:
        parts = list(self.outputs)
        if self.proc is not None:
            parts.append(self._out.text())
        return "\n".join(p for p in parts if p)


class RemoteObject:
    """A handle to an object that lives in the worker (a module, a bound method...)."""

    def __init__(self, sub: Submission, info: dict, gen: int):
        if not isinstance(info, dict) or not isinstance(info.get("id"), int):
            raise BoundaryError("", "malformed handle")
        self._sub, self._id, self._gen = sub, info["id"], gen
        self._label = str(info.get("type", "object"))[:100]

    def _target(self):
        if self._gen != self._sub.generation:
            raise WorkerDied(self._label, "the object was lost when the grading process restarted")
        return {"handle": self._id}

    def __call__(self, *args, **kwargs):
        return _call(self._sub, self._target(), self._label, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = self._sub
        value = sub.request({"op": "getattr", "target": self._target(), "attr": attr}, name=f"{self._label}.{attr}")
        return sub.decode(value)

    def __repr__(self):
        return f"<remote {self._label}>"


@dataclass
class GradResult:
    output: object
    arg_grads: list
    param_grads: dict


def _call(sub: Submission, target: dict, name: str, args, kwargs):
    enc_args = sub.encode(tuple(args))["__tuple__"]
    enc_kwargs = sub.encode(dict(kwargs))["__dict__"]
    value = sub.request({"op": "call", "target": target, "args": enc_args, "kwargs": enc_kwargs}, name=name)
    return sub.decode(value)


class Learner:
    """The proxy hidden tests call: ``learner.NAME(...)`` runs NAME in the worker."""

    def __init__(self, sub: Submission):
        self._sub = sub

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        sub = self._sub

        def remote(*args, **kwargs):
            return _call(sub, {"name": name}, name, args, kwargs)

        remote.__name__ = name
        return remote

    def has(self, name: str) -> bool:
        return bool(self._sub.request({"op": "has", "name": name}, name=name))

    def with_grad(self, target, *args, cotangents=(), params=False, **kwargs) -> GradResult:
        sub = self._sub
        if isinstance(target, RemoteObject):
            tgt, label = target._target(), target._label
        else:
            tgt, label = {"name": str(target)}, str(target)
        req = {
            "op": "with_grad",
            "target": tgt,
            "args": sub.encode(tuple(args))["__tuple__"],
            "kwargs": sub.encode(dict(kwargs))["__dict__"],
            "cotangents": sub.encode(tuple(cotangents))["__tuple__"],
            "params": bool(params),
        }
        value = sub.request(req, name=label)
        if not isinstance(value, dict) or set(value) != {"output", "arg_grads", "param_grads"}:
            raise BoundaryError(label, "malformed gradient reply")
        return GradResult(
            sub.decode(value["output"]), sub.decode(value["arg_grads"]), sub.decode(value["param_grads"])
        )
