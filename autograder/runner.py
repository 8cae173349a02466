"""The trusted side of the process boundary: start a worker, talk to it, time it out.

`Submission` owns one learner's worker process (restarting it after a crash or a
timeout, within a budget) and `Learner` is the proxy that hidden tests call. Only data
comes back (see `autograder.protocol`); a learner's objects never exist here.

The trusted side never blocks on the worker: both pipes are non-blocking, every write
and every read has a deadline (the call's limit, capped by what is left of the
submission's), and a worker that misses one is killed. Every reply is checked against
the protocol's schema; anything malformed is the learner's failure for that call.

With a warm start (`autograder.warm`), a worker is forked from a pre-imported template
instead of started; everything above holds for it the same way.

A fresh worker imports its libraries before it reads its first request. A learner's
self-check starts it first thing (`Submission.start_early`), so that this overlaps the
trusted side's own imports; the learner's code is still loaded only by the first request,
after the notebook's cells were audited, and the submission's time budget starts there.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import protocol as P
from .limits import DEFAULT, Limits

WORKER_FILES = tuple(Path(__file__).resolve().parent / name for name in ("worker.py", "protocol.py"))


class GradingError(Exception):
    """A failure on the learner's side of a call; the grader turns it into a hint."""

    def __init__(self, name: str, message: str = ""):
        super().__init__(message or name)
        self.name = name
        self.during_load = False


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


class _Output:
    """Drains a pipe in a thread, keeping at most `cap` bytes."""

    def __init__(self, fd: int, cap: int):
        self.data = bytearray()
        self.dropped = 0
        self.cap = cap
        self.thread = threading.Thread(target=self._run, args=(fd,), daemon=True)
        self.thread.start()

    def _run(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    return
                room = max(self.cap - len(self.data), 0)
                self.data += chunk[:room]
                self.dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        s = self.data.decode("utf-8", "replace")
        return s + (f"\n[... {self.dropped} more bytes of output dropped]" if self.dropped else "")


def _str(x, n: int) -> str:
    return x[:n] if isinstance(x, str) else ""


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL everything in the process group `proc` leads (it was started in a session of its
    own) and reap it, waiting at most 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Submission:
    """One learner's code, running in a worker process that is restarted when needed.

    `cells` are the code cells to load, as ``{"label", "source"}`` dicts, in order.
    """

    def __init__(self, cells: list[dict], *, limits: Limits = DEFAULT, seed: int = 0, env: dict | None = None,
                 python: str = sys.executable, sandbox=None, notebook: str | Path | None = None, template=None):
        self.cells = cells
        # an autograder.warm.Template to fork workers from (the warm start), or None; it is
        # used only with the sandbox and without extra environment variables (a template has one
        # environment); the notebook is not shown in a warm worker, whose code comes in the load request
        self.template = template if sandbox is not None and not env else None
        self.limits = limits
        self.seed = seed
        self.deadline = time.monotonic() + limits.submission_seconds
        self.restarts_left = limits.max_restarts
        self.python = python
        self.extra_env = env or {}
        self.sandbox = sandbox  # an autograder.sandbox.Sandbox, or None to run unsandboxed
        self.notebook = notebook  # shown read-only inside the sandbox
        self.proc: subprocess.Popen | None = None
        self._release = None  # the sandbox's clean-up for the running worker (its cgroup)
        self._cgroup: str | None = None  # the running worker's memory cgroup, when it has one
        self._watch: list[int] = []  # a warm worker's pidfd
        self.generation = 0
        self._loaded = 0  # the generation whose worker has the learner's code loaded
        self.load_errors: list[dict] = []
        self.load_notes: list[str] = []
        self.load_dropped = 0  # load errors and notes not kept
        self.load_failure: GradingError | None = None
        self.outputs: list[str] = []
        self._next_id = 1
        self._tmp = tempfile.TemporaryDirectory(prefix="grade-worker-")
        self._decode = P.Decoder(self._handle, max_depth=limits.reply_depth, max_dims=limits.array_dims)

    # process management --------------------------------------------------------------
    @staticmethod
    def base_env(home: str = "/tmp") -> dict:
        """The worker's environment (also a warm template's, whose workers inherit it)."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def _env(self) -> dict:
        env = self.base_env(self._tmp.name)
        env.update(self.extra_env)
        return env

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        tail = [str(req_r), str(rep_w), "--preload"]
        close_after: list[int] = []
        release = None
        cgroup = None
        child = None
        if self.template is not None:
            from .warm import TemplateUnavailable

            t0 = time.monotonic()
            try:
                child = self.template.spawn(req_r, rep_w, out_w)
            except TemplateUnavailable:
                child = None  # graded by a fresh worker, as without the warm start
            # starting or replacing a template is the grader's cost, never the learner's
            self.deadline += time.monotonic() - t0
        try:
            if child is not None:
                self.proc, release, cgroup = child, child.end, child.cgroup
            elif self.sandbox is not None:
                w = self.sandbox.wrap(tail, files=WORKER_FILES, env=self._env(),
                                      notebook=self.notebook, extra_fds=(req_r, rep_w))
                close_after, release = w.close_fds, getattr(w, "release", None)
                cgroup = getattr(w, "cgroup", None)
                argv, pass_fds, env, cwd = w.argv, w.pass_fds, w.env, w.cwd
            else:
                argv = [self.python, "-I", str(WORKER_FILES[0]), *tail]
                pass_fds, env, cwd = (req_r, rep_w), self._env(), self._tmp.name
            if child is None:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=pass_fds, cwd=cwd, env=env,
                    start_new_session=True,  # its own process group: one kill ends everything it started
                )
        except BaseException:
            for fd in (req_r, req_w, rep_r, rep_w, out_r, out_w, *close_after):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if release is not None:
                release()
            raise
        self._release = release
        self._cgroup = cgroup
        self._watch = [child.pidfd] if child is not None else []  # readable once the warm worker has ended
        for fd in (req_r, rep_w, out_w, *close_after):
            os.close(fd)
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        self._req, self._rep = req_w, rep_r
        self._buf = bytearray()
        self._out = _Output(out_r, self.limits.output_bytes)
        self.generation += 1

    def _kill(self) -> None:
        if self.proc is None:
            return
        if isinstance(self.proc, subprocess.Popen):
            kill_group(self.proc)
        # a warm worker (autograder.warm.Child) is not our child: its release kills its cgroup
        # and waits until it is empty
        if self._release is not None:
            self._release()
            self._release = None
        self._cgroup = None
        self._watch = []
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

    def start_early(self) -> None:
        """Start the worker now, before anything is asked of it: it imports its libraries while
        this process does its own start-up. Nothing of the learner's runs until the first request
        loads the code (see `configure` for what is not known yet)."""
        if self.proc is None and self.generation == 0 and self.load_failure is None:
            self._start()

    def configure(self, cells: list[dict], *, limits: Limits, seed: int) -> None:
        """The cells, limits and seed of a submission started early, set before its code is loaded."""
        if self._loaded:
            raise RuntimeError("configure() after the learner's code was loaded")
        self.cells, self.limits, self.seed = cells, limits, seed
        self.restarts_left = limits.max_restarts
        self._decode = P.Decoder(self._handle, max_depth=limits.reply_depth, max_dims=limits.array_dims)
        if self.proc is not None:
            self._out.cap = limits.output_bytes

    def ensure_started(self) -> None:
        """A live worker with the learner's code loaded, or raise the reason there is none."""
        if self.load_failure is not None:
            raise self.load_failure
        if self.proc is not None and self._loaded == self.generation:
            return
        if self.proc is None:
            if self.generation > 0:
                if self.restarts_left <= 0:
                    self.load_failure = WorkerDied("", "the grading process had to be restarted too often")
                    raise self.load_failure
                self.restarts_left -= 1
            self._start()
        if self.generation == 1:
            # the budget counts from the first load: a worker started early has run nothing yet
            self.deadline = time.monotonic() + self.limits.submission_seconds
        try:
            result = self._request({"op": P.OP_LOAD, "cells": self.cells, "seed": self.seed},
                                   name="", timeout=self.limits.load_seconds)
        except GradingError as exc:
            if isinstance(exc, CallTimeout):
                exc = CallTimeout("", exc.seconds)
            elif isinstance(exc, WorkerDied):
                exc = WorkerDied("", "the notebook's code ended the grading process while loading")
            exc.during_load = True
            self._kill()
            self.load_failure = exc
            raise exc
        self._loaded = self.generation
        if self.generation == 1:
            self.load_errors, self.load_notes = self._load_report(result)

    def _load_report(self, value) -> tuple[list[dict], list[str]]:
        """The load reply's errors and notes, checked and cut to the limits; `load_dropped` counts the rest."""
        n, chars = self.limits.notes, self.limits.note_chars
        if type(value) is not dict or set(value) != {"errors", "notes", "more"} or type(value["more"]) is not int \
                or type(value["errors"]) is not list or type(value["notes"]) is not list:
            return [], ["the grading process sent a malformed report of loading your code"]
        errors = []
        for e in value["errors"][:n]:
            if type(e) is dict and type(e.get("line")) is int:
                errors.append({"cell": _str(e.get("cell"), 100), "line": e["line"], "error": _str(e.get("error"), chars)})
        notes = [_str(x, chars) for x in value["notes"][:n]]
        self.load_dropped = (max(value["more"], 0) + len(value["errors"]) - len(errors)
                             + len(value["notes"]) - len(notes))
        return errors, notes

    # memory ----------------------------------------------------------------------------
    def memory_meter(self):
        """Start measuring the running worker's memory; returns `stop`, which returns
        (peak bytes above the usage at the start, source) or (None, None).

        Everything is read by this (trusted) process from the kernel, never from the worker:
        * "cgroup": the worker's memory cgroup, all its processes together. cgroup v2's
          memory.peak is reset for our own open descriptor (Linux 6.12 and later), so the
          peak is the call's alone; where that write is refused, the peak can only be seen
          when the call raises the cgroup's lifetime peak, and a rise is what is reported
          (a lower bound: never more than the call used). v1's max_usage_in_bytes is reset.
        * "process": without a sandbox (a learner checking their own work), the worker
          process's VmHWM, reset through /proc/PID/clear_refs; processes the learner's code
          starts are not counted there.
        """
        none = lambda: (None, None)  # noqa: E731
        if self.proc is None:
            return none
        try:
            if self._cgroup is not None:
                return self._cgroup_meter(self._cgroup)
            if self.sandbox is None:
                return self._process_meter(self.proc.pid)
        except (OSError, ValueError):
            pass
        return none

    @staticmethod
    def _cgroup_meter(path: str):
        def read(name: str) -> int:
            with open(os.path.join(path, name), "rb") as f:
                return int(f.read(64).split()[0])

        peak_file = os.path.join(path, "memory.peak")
        if os.path.exists(peak_file):
            try:
                fd = os.open(peak_file, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    os.write(fd, b"reset\n")
                except OSError:
                    os.close(fd)
                    fd = -1
            start = read("memory.current")
            if fd >= 0:
                def stop():
                    try:
                        return max(int(os.pread(fd, 64, 0).split()[0]) - start, 0), "cgroup"
                    except (OSError, ValueError, IndexError):
                        return None, None
                    finally:
                        os.close(fd)
                return stop
            before = read("memory.peak")

            def stop_lifetime():
                try:
                    after = read("memory.peak")
                except (OSError, ValueError, IndexError):
                    return None, None
                return (max(after - start, 0) if after > before else 0), "cgroup"
            return stop_lifetime
        # cgroup v1: the trusted side may reset the high-water mark
        _write_int = os.path.join(path, "memory.max_usage_in_bytes")
        with open(_write_int, "w") as f:
            f.write("0")
        start = read("memory.usage_in_bytes")

        def stop_v1():
            try:
                return max(read("memory.max_usage_in_bytes") - start, 0), "cgroup"
            except (OSError, ValueError, IndexError):
                return None, None
        return stop_v1

    @staticmethod
    def _process_meter(pid: int):
        def status(field: str) -> int:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f.read(1 << 16).splitlines():
                    if line.startswith(field.encode() + b":"):
                        return int(line.split()[1]) * 1024
            raise ValueError(field)

        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # the peak resident set becomes the current one
        start = status("VmRSS")

        def stop():
            try:
                return max(status("VmHWM") - start, 0), "process"
            except (OSError, ValueError, IndexError):
                return None, None
        return stop

    # requests --------------------------------------------------------------------------
    def _request(self, req: dict, *, name: str, timeout: float | None = None):
        """Write `req`, then read the reply, all within the call's limit."""
        req_id = self._next_id
        self._next_id += 1
        data = P.frame(dict(req, id=req_id))
        remaining = self.deadline - time.monotonic()
        limit = min(timeout or self.limits.call_seconds, remaining)
        if limit <= 0:
            self._kill()
            self.load_failure = CallTimeout(name, self.limits.submission_seconds)
            raise self.load_failure
        end = time.monotonic() + limit
        view = memoryview(data)
        while view:
            left = end - time.monotonic()
            if left <= 0:
                self._kill()
                raise CallTimeout(name, limit)
            dead, ready, _ = select.select(self._watch, [self._req], [], left)
            if dead and not ready:
                self._kill()
                raise WorkerDied(name)
            if not ready:
                continue
            try:
                view = view[os.write(self._req, view):]
            except BlockingIOError:
                continue
            except OSError:
                self._kill()
                raise WorkerDied(name)
        cap = self.limits.reply_bytes
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                break
            left = end - time.monotonic()
            if left <= 0:
                self._kill()
                raise CallTimeout(name, limit)
            ready, _, _ = select.select([self._rep, *self._watch], [], [], left)
            if not ready:
                continue
            if self._rep not in ready:
                # A warm worker is not its PID namespace's first process: its death does not end the
                # processes it started, which may hold the reply pipe open. It died: so does the rest.
                self._kill()
                raise WorkerDied(name)
            try:
                chunk = os.read(self._rep, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                self._kill()
                raise WorkerDied(name)
            self._buf += chunk
            if len(self._buf) > cap:
                self._kill()
                raise BoundaryError(name, "the reply was larger than the grader accepts")
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]
        try:
            reply = P.parse_frame(line, max_containers=self.limits.reply_containers)
        except P.CodecError as exc:
            self._kill()
            raise BoundaryError(name, f"the grading process sent a malformed reply ({exc})")
        return self._check_reply(reply, req_id, name)

    def _check_reply(self, reply, req_id: int, name: str):
        """The reply's value, or the learner-side error it reports; anything malformed is the learner's."""
        if type(reply) is not dict or reply.get("id") != req_id or type(reply.get("id")) is not int:
            self._kill()
            raise BoundaryError(name, "the grading process sent an unexpected reply")
        if reply.get("ok") is True and set(reply) == {"id", "ok", "value"}:
            return reply["value"]
        if (reply.get("ok") is not False or set(reply) != {"id", "ok", "kind", "type", "message"}
                or reply["kind"] not in P.KINDS or type(reply["type"]) is not str
                or type(reply["message"]) is not str):
            self._kill()
            raise BoundaryError(name, "the grading process sent a malformed reply")
        kind, etype, message = reply["kind"], reply["type"][:100], reply["message"][: self.limits.note_chars * 2]
        if kind == P.KIND_NOT_IMPLEMENTED:
            raise NotImplementedRemote(name)
        if kind == P.KIND_MISSING:
            raise MissingName(name)
        if kind == P.KIND_CODEC:
            raise BoundaryError(name, message)
        raise LearnerError(name, etype, message)

    def request(self, req: dict, *, name: str):
        self.ensure_started()
        return self._request(req, name=name)

    def decode(self, value, name: str = ""):
        try:
            return self._decode(value)
        except P.CodecError as exc:
            raise BoundaryError(name, str(exc)) from None
        except (ValueError, TypeError, MemoryError, RecursionError):
            raise BoundaryError(name, "the grading process sent a malformed value") from None

    def _handle(self, info):
        if type(info) is not dict or set(info) != {"id", "type"} or type(info["id"]) is not int \
                or type(info["type"]) is not str:
            raise P.CodecError("malformed handle")
        return RemoteObject(self, info["id"], info["type"][:100], self.generation)

    def encode(self, value):
        def to_handle(obj):
            if isinstance(obj, RemoteObject):
                if obj._gen != self.generation:
                    raise WorkerDied(obj._label, "the object was lost when the grading process restarted")
                return {P.TAG_HANDLE: {"id": obj._id}}
            raise P.CodecError(f"a value of type {type(obj).__name__} cannot be sent")

        return P.encode(value, to_handle)

    def reseed(self, seed: int) -> None:
        """Seed the worker's random generators (a no-op until the learner's code is loaded)."""
        if self.proc is not None and self._loaded == self.generation:
            self._request({"op": P.OP_SEED, "seed": seed}, name="")

    def output(self) -> str:
        parts = list(self.outputs)
        if self.proc is not None:
            parts.append(self._out.text())
        return "\n".join(p for p in parts if p)


class RemoteObject:
    """A handle to an object that lives in the worker (a module, a bound method...)."""

    def __init__(self, sub: Submission, hid: int, label: str, gen: int):
        self._sub, self._id, self._label, self._gen = sub, hid, label, gen

    def _target(self):
        if self._gen != self._sub.generation:
            raise WorkerDied(self._label, "the object was lost when the grading process restarted")
        return {"handle": self._id}

    def __call__(self, *args, **kwargs):
        return _call(self._sub, self._target(), self._label, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub, label = self._sub, f"{self._label}.{attr}"
        return sub.decode(sub.request({"op": P.OP_GETATTR, "target": self._target(), "attr": attr}, name=label), label)

    def __repr__(self):
        return f"<remote {self._label}>"


@dataclass
class MemoryUse:
    output: object
    peak_bytes: int | None  # the call's peak above the worker's usage when it started
    source: str | None      # "cgroup", "process", or None when it cannot be measured here


@dataclass
class GradResult:
    output: object
    arg_grads: list
    param_grads: dict


def _call(sub: Submission, target: dict, name: str, args, kwargs, device_check: bool = False):
    req = {"op": P.OP_CALL, "target": target, "args": sub.encode(tuple(args))[P.TAG_TUPLE],
           "kwargs": sub.encode(dict(kwargs))[P.TAG_DICT]}
    if device_check:
        req["device_check"] = True
    return sub.decode(sub.request(req, name=name), name)


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
        value = self._sub.request({"op": P.OP_HAS, "name": name}, name=name)
        if type(value) is not bool:
            raise BoundaryError(name, "the grading process sent a malformed reply")
        return value

    @staticmethod
    def _target(target):
        if isinstance(target, RemoteObject):
            return target._target(), target._label
        return {"name": str(target)}, str(target)

    def device_checked(self, target, *args, **kwargs):
        """Call `target` (a name or a handle) with every operation that mixes a meta tensor with a
        CPU tensor of one or more dimensions failing, as CUDA fails with CPU tensors."""
        tgt, label = self._target(target)
        return _call(self._sub, tgt, label, args, kwargs, device_check=True)

    def memory_peak(self, target, *args, **kwargs) -> MemoryUse:
        """Call `target` and measure, from this process, the worker's peak memory during the
        call (all of its processes where it has a cgroup); see `Submission.memory_meter`."""
        sub = self._sub
        tgt, label = self._target(target)
        sub.ensure_started()
        stop = sub.memory_meter()
        try:
            output = _call(sub, tgt, label, args, kwargs)
        except BaseException:
            stop()
            raise
        peak, source = stop()
        return MemoryUse(output, peak, source)

    def with_grad(self, target, *args, cotangents=(), params=False, **kwargs) -> GradResult:
        sub = self._sub
        tgt, label = self._target(target)
        req = {
            "op": P.OP_WITH_GRAD,
            "target": tgt,
            "args": sub.encode(tuple(args))[P.TAG_TUPLE],
            "kwargs": sub.encode(dict(kwargs))[P.TAG_DICT],
            "cotangents": sub.encode(tuple(cotangents))[P.TAG_TUPLE],
            "params": bool(params),
        }
        value = sub.request(req, name=label)
        if type(value) is not dict or set(value) != {"output", "arg_grads", "param_grads"}:
            raise BoundaryError(label, "malformed gradient reply")
        arg_grads, param_grads = sub.decode(value["arg_grads"], label), sub.decode(value["param_grads"], label)
        if type(arg_grads) is not list or type(param_grads) is not dict:
            raise BoundaryError(label, "malformed gradient reply")
        return GradResult(sub.decode(value["output"], label), arg_grads, param_grads)
