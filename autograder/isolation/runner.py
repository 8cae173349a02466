"""The trusted side of the process boundary: start a worker, talk to it, time it out.

`Submission` owns one learner's worker process (restarting it after a crash or a
timeout, within a budget); `RemoteObject` is a handle to an object in it, and `call` calls a
function there. `Learner` (in `remote`) is the proxy that hidden tests call. Only data
comes back (see `autograder.isolation.protocol`); a learner's objects never exist here.

The trusted side never blocks on the worker: both pipes are non-blocking, every write
and every read has a deadline (the call's limit, capped by what is left of the
submission's), and a worker that misses one is killed. Every reply is checked against
the protocol's schema; anything malformed is the learner's failure for that call.

With a warm start (`autograder.isolation.warm`), a worker is forked from a pre-imported template
instead of started; everything above holds for it the same way.

A fresh worker imports its libraries before it reads its first request. A learner's
self-check starts it first thing (`Submission.start_early`), so that this overlaps the
trusted side's own imports; the learner's code is still loaded only by the first request,
after the notebook's cells were audited, and the submission's time budget starts there.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..core.limits import DEFAULT, Limits
from . import protocol as P
from .errors import (ArgumentChanged, BoundaryError, CallTimeout, GradingError, LearnerError, MissingName,
                     NotImplementedRemote, WorkerDied)
from .memory_meters import cgroup_meter, cgroup_usage, proc_status, process_meter, sandboxed_worker_pid
from .processes import OutputDrain, kill_group
from .unavailable import TemplateUnavailable
from .worker_files import WORKER_FILES


def _argument_name(text: str) -> str:
    """An argument's name as the worker reported it, kept to what a parameter's name can be."""
    text = text[:60]
    return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|argument \d+", text) else "(one of them)"


def _str(x, n: int) -> str:
    return x[:n] if isinstance(x, str) else ""


class Submission:
    """One learner's code, running in a worker process that is restarted when needed.

    `cells` are the code cells to load, as ``{"label", "source"}`` dicts, in order.
    """

    def __init__(self, cells: list[dict], *, limits: Limits = DEFAULT, seed: int = 0, env: dict | None = None,
                 python: str = sys.executable, sandbox=None, notebook: str | Path | None = None, template=None,
                 self_check: bool = False):
        self.cells = cells
        # a learner's own check (`check`), not grading: a check that cannot measure what it grades
        # shows no points for it there (see MemoryUse.self_check)
        self.self_check = self_check
        # an autograder.isolation.warm.Template to fork workers from (the warm start), or None; it is
        # used only with the sandbox and without extra environment variables (a template has one
        # environment); the notebook is not shown in a warm worker, whose code comes in the load request
        self.template = template if sandbox is not None and not env else None
        self.limits = limits
        self.seed = seed
        self.deadline = time.monotonic() + limits.submission_seconds
        self.restarts_left = limits.max_restarts
        self.python = python
        self.extra_env = env or {}
        self.sandbox = sandbox  # an autograder.isolation.sandbox.Sandbox, or None to run unsandboxed
        self.notebook = notebook  # shown read-only inside the sandbox
        self.proc: subprocess.Popen | None = None
        self._release = None  # the sandbox's clean-up for the running worker (its cgroup)
        self._cgroup: str | None = None  # the running worker's memory cgroup, when it has one
        self._baseline: dict | None = None  # the worker's memory before the learner's code was loaded
        self._watch: list[int] = []  # a warm worker's pidfd
        self.generation = 0
        self._loaded = 0  # the generation whose worker has the learner's code loaded
        self.load_errors: list[dict] = []
        self.load_notes: list[str] = []
        self.load_dropped = 0  # load errors and notes not kept
        self.load_failure: GradingError | None = None
        self.outputs: list[str] = []
        self._next_id = 1
        self.meanwhile = None  # trusted work (a remote.Later) to do while the next request runs (Learner.meanwhile)
        self.devices_sent: set[str] = set()  # every device a request has sent a tensor or torch.device on
        self.last_returned: tuple | None = None  # (name, value) of the last value the learner's side returned
        # Whether a call leaves its arguments as they were is asked of each function once per part of the
        # exercise, until one call changes them (`ArgumentChanged`): the first check of the part that sees
        # it loses its points, the others judge the rest. The grader sets `part` and clears `changed`.
        self.part = ""
        self.changed: set = set()  # (function, part)
        self._tmp = tempfile.TemporaryDirectory(prefix="grade-worker-")

    # process management --------------------------------------------------------------
    @staticmethod
    def base_env(home: str = "/tmp") -> dict:
        """The worker's environment (also a warm template's, whose workers inherit it): these values
        only, nothing else of the grader's environment, for a worker started as `python -I`."""
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
        self._out = OutputDrain(out_r, self.limits.output_bytes)
        self.generation += 1

    def _kill(self) -> None:
        if self.proc is None:
            return
        if isinstance(self.proc, subprocess.Popen):
            kill_group(self.proc)
        # a warm worker (autograder.isolation.warm.Child) is not our child: its release kills its cgroup
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
        try:
            # A worker reads its first request only once it has imported its libraries: its memory
            # then, before any of the learner's code has run, is what every measurement of its
            # memory is taken against (see memory_meter).
            self._request({"op": P.OP_SEED, "seed": self.seed}, name="", timeout=self.limits.load_seconds)
            self._baseline = self._memory_baseline()
            if self.generation == 1:
                # the budget counts from the first load: a worker started early has run nothing yet
                self.deadline = time.monotonic() + self.limits.submission_seconds
            load = {"op": P.OP_LOAD, "cells": self.cells, "seed": self.seed,
                    "reply_bytes": self.limits.reply_bytes}
            result = self._request(load, name="", timeout=self.limits.load_seconds)
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
    def _memory_baseline(self) -> dict | None:
        """The running worker's memory now, read from the kernel: taken once per worker, after it
        has imported its libraries and before the load request, when no learner code has run in
        it (a warm worker: after it was moved into its own cgroup). None where it cannot be read."""
        try:
            if self._cgroup is not None:
                return {"generation": self.generation, "cgroup": self._cgroup, "bytes": cgroup_usage(self._cgroup)}
            if not isinstance(self.proc, subprocess.Popen):
                return None  # a warm worker is measured only through its cgroup
            # unsandboxed, the worker is our child; sandboxed, the Python process below bubblewrap
            pid = self.proc.pid if self.sandbox is None else sandboxed_worker_pid(self.proc.pid)
            if pid is not None:
                return {"generation": self.generation, "pid": pid, "bytes": proc_status(pid, "VmRSS")}
        except (OSError, ValueError, IndexError):
            pass
        return None

    def memory_meter(self):
        """Start measuring the running worker's memory; returns `stop`, which returns
        (peak, held, source): the most memory the worker used during the call and the memory it
        held when the call started, both in bytes above its baseline, or (None, None, None).

        The baseline is the worker's memory before the learner's code was loaded (see
        `ensure_started`), a level no learner code has influenced. So whatever the learner's
        code holds when the call starts (arrays kept since loading or from an earlier call,
        files in /tmp or /dev/shm, a child process) counts as the call's, and freeing it inside
        the call hides nothing. Everything is read by this (trusted) process from the kernel:
        * "cgroup": the worker's memory cgroup, all its processes together, tmpfs included.
          v1's max_usage_in_bytes, and v2's memory.peak for our own open descriptor (Linux
          6.12 and later), are reset when the call starts. Where v2 refuses that reset, only
          the cgroup's lifetime peak can be read: it is reported whole (at least the call's
          peak, and nothing the learner can lower), so it may count a peak from before the call.
        * "process": without a cgroup (a learner's `check`, or a sandbox where no cgroup can be
          made), the worker process's VmHWM, reset through /proc/PID/clear_refs when the call
          starts; the processes the learner's code starts are not counted there.
        """
        none = lambda: (None, None, None)  # noqa: E731
        base = self._baseline
        if self.proc is None or base is None or base["generation"] != self.generation:
            return none
        try:
            if "cgroup" in base:
                if base["cgroup"] != self._cgroup:
                    return none
                return cgroup_meter(self._cgroup, base["bytes"])
            return process_meter(base["pid"], base["bytes"])
        except (OSError, ValueError, IndexError):
            return none

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
        if self.meanwhile is not None:
            # the worker is busy with the request: this process does its own work meanwhile, and the
            # time it takes is not counted against the learner's call
            job, self.meanwhile = self.meanwhile, None
            started = time.monotonic()
            job.run()
            end += time.monotonic() - started
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
        if kind == P.KIND_CHANGED:
            self.changed.add((name, self.part))
            raise ArgumentChanged(name, _argument_name(message))
        raise LearnerError(name, etype, message)

    def request(self, req: dict, *, name: str):
        self.ensure_started()
        return self._request(req, name=name)

    def returned(self, name: str, value):
        """Note `value` as the last one the learner's side returned (see Grader._replay); return it."""
        self.last_returned = (name, value)
        return value

    def allowed_devices(self, sent=(), *, on_handle: bool = False, device_check: bool = False) -> frozenset:
        """The devices a reply to a request may hold tensors on: the CPU and the devices the request
        sent (`sent`, `device_key` names); for a call on a handle (a module the checks moved), every
        device sent so far; the meta device only where the request asked for it (a device check, or
        meta tensors sent)."""
        allowed = {"cpu", *sent}
        if on_handle:
            allowed |= self.devices_sent
        allowed.discard("meta")
        if device_check or "meta" in sent:
            allowed.add("meta")
        return frozenset(allowed)

    def decode(self, value, name: str = "", devices=None):
        """A reply's value as Python data; `devices`: see `allowed_devices` (default: the CPU and
        whatever was sent before, never meta). Whatever in it cannot be decoded is the learner's."""
        if devices is None:
            devices = self.allowed_devices(on_handle=True)
        decoder = P.Decoder(self._handle, max_depth=self.limits.reply_depth, max_dims=self.limits.array_dims,
                            devices=devices)
        try:
            return decoder(value)
        except P.CodecError as exc:
            raise BoundaryError(name, str(exc)) from None
        except GradingError:
            raise
        except Exception:  # noqa: BLE001 - decoding is a function of the worker's bytes only
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


_MODULE_METHODS: frozenset | None = None


def _module_methods() -> frozenset:
    """The public methods of torch.nn.Module (eval, train, to, state_dict, forward...)."""
    global _MODULE_METHODS
    if _MODULE_METHODS is None:
        import torch

        _MODULE_METHODS = frozenset(n for n in dir(torch.nn.Module)
                                    if not n.startswith("_") and callable(getattr(torch.nn.Module, n, None)))
    return _MODULE_METHODS


class RemoteObject:
    """A handle to an object that lives in the worker (a module, a bound method...).

    An attribute read through it that torch.nn.Module defines as a method (eval, to, state_dict...)
    must come back as a method (a handle): a check calls it, and data there is refused as the
    learner's (a BoundaryError), never a crash in the check."""

    def __init__(self, sub: Submission, hid: int, label: str, gen: int):
        self._sub, self._id, self._label, self._gen = sub, hid, label, gen

    def _target(self):
        if self._gen != self._sub.generation:
            raise WorkerDied(self._label, "the object was lost when the grading process restarted")
        return {"handle": self._id}

    def __call__(self, *args, **kwargs):
        return call(self._sub, self._target(), self._label, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub, label = self._sub, f"{self._label}.{attr}"
        value = sub.decode(sub.request({"op": P.OP_GETATTR, "target": self._target(), "attr": attr}, name=label), label)
        if attr in _module_methods() and not isinstance(value, RemoteObject):
            # a check that reads .eval, .to, .state_dict... calls it: data there is the learner's doing
            raise BoundaryError(label, f"`{label}` is a {type(value).__name__}, not the method torch.nn.Module has")
        return sub.returned(label, value)

    def __repr__(self):
        return f"<remote {self._label}>"


def devices_in(value, depth: int = 0) -> set:
    """The devices (`protocol.device_key` names) of every tensor, torch.device and device name
    ("cuda", "cuda:1", "meta"...) in a value the trusted side sends (tuples, lists and dicts walked)."""
    if isinstance(value, str):
        return {P.device_key(value)} if P.DEVICE_RE.match(value) else set()
    torch = sys.modules.get("torch")
    if torch is None or depth > 32:
        return set()
    if isinstance(value, torch.Tensor):
        return {P.device_key(value.device)}
    if isinstance(value, torch.device):
        return {P.device_key(value)}
    if isinstance(value, (tuple, list)):
        return set().union(*(devices_in(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return set().union(*(devices_in(v, depth + 1) for v in value.values()))
    return set()


def sent_devices(sub: Submission, target: dict, *values, device_check: bool = False) -> frozenset:
    """Note the devices a request sends; the devices its reply may hold tensors on."""
    sent = devices_in(values)
    sub.devices_sent |= sent
    return sub.allowed_devices(sent, on_handle="handle" in target, device_check=device_check)


def call(sub: Submission, target: dict, name: str, args, kwargs, device_check: bool = False,
          repeat: int | None = None):
    req = {"op": P.OP_CALL, "target": target, "args": sub.encode(tuple(args))[P.TAG_TUPLE],
           "kwargs": sub.encode(dict(kwargs))[P.TAG_DICT]}
    if device_check:
        req["device_check"] = True
    if (name, sub.part) not in sub.changed:
        req["unchanged"] = True
    if repeat is not None:
        # All the calls share the time limit of one call (Limits.call_seconds): a repeated call is for
        # calls that take a small part of it, such as draws of a sampler. A call that hangs is stopped
        # as soon as it would be alone, and the checks after it go on in a new worker.
        if type(repeat) is not int or not 1 <= repeat <= P.MAX_REPEAT:
            raise ValueError(f"repeat must be an int from 1 to {P.MAX_REPEAT}, not {repeat!r}")  # a check's bug
        req["repeat"] = repeat
    allowed = sent_devices(sub, target, args, kwargs, device_check=device_check)
    value = sub.decode(sub.request(req, name=name), name, allowed)
    if repeat is not None and (type(value) is not list or len(value) != repeat):
        raise BoundaryError(name, f"the grading process sent something else than the {repeat} values of a repeated call")
    return sub.returned(name, value)
