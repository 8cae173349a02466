"""The learner's code as the hidden checks see it: `Learner`, whose attributes call the learner's
functions in the worker (`learner.attention(q, k, v)`), with the gradient, memory and device
checks a check may ask for, and trusted work done meanwhile (`Learner.meanwhile`).

Every call goes through `runner.call` to the `Submission`'s worker; only data comes back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from . import protocol as P
from .errors import BoundaryError
from .runner import RemoteObject, Submission, call, sent_devices


class Later:
    """Trusted work (a reference's result) done while the worker runs the next request: see
    `Learner.meanwhile`. `result()` gives its value, doing the work now if no request came."""

    def __init__(self, fn):
        self._fn, self._done, self._value, self._error = fn, False, None, None

    def run(self) -> None:
        if not self._done:
            self._done = True
            try:
                self._value = self._fn()
            except Exception as exc:  # noqa: BLE001 - raised where the check asks for the result
                self._error = exc

    def result(self):
        self.run()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class MemoryUse:
    output: object
    # the most memory the worker used during the call, above its memory before the learner's
    # code was loaded; None when it cannot be measured here
    peak_bytes: int | None
    source: str | None      # "cgroup", "process", or None when it cannot be measured here
    held_bytes: int | None = None  # of that, what the worker already held when the call started
    self_check: bool = False  # a learner's own check: what cannot be measured here shows no points


@dataclass
class GradResult:
    output: object
    arg_grads: list
    param_grads: dict


class Learner:
    """The proxy hidden tests call: ``learner.NAME(...)`` runs NAME in the worker."""

    def __init__(self, sub: Submission):
        self._sub = sub

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        sub = self._sub

        def remote(*args, **kwargs):
            return call(sub, {"name": name}, name, args, kwargs)

        def repeat(n: int, *args, **kwargs) -> list:
            """NAME(*args, **kwargs) called n times in a row in the worker, in one request: the list of
            what the n calls return, as n calls of `remote` would give it (the arguments decoded anew for
            each; the first call that raises raises here)."""
            return call(sub, {"name": name}, name, args, kwargs, repeat=n)

        remote.__name__ = name
        remote.repeat = repeat
        return remote

    def has(self, name: str) -> bool:
        value = self._sub.request({"op": P.OP_HAS, "name": name}, name=name)
        if type(value) is not bool:
            raise BoundaryError(name, "the grading process sent a malformed reply")
        return value

    def attribute(self, name: str, attr: str):
        """`NAME.attr` of the learner's namespace (e.g. "torch", "optim"), as data or a handle: how a
        check builds an object the notebook's own modules provide, such as an optimizer."""
        sub, label = self._sub, f"{name}.{attr}"
        value = sub.request({"op": P.OP_GETATTR, "target": {"name": str(name)}, "attr": str(attr)}, name=label)
        return sub.returned(label, sub.decode(value, label))

    @contextlib.contextmanager
    def meanwhile(self, fn):
        """``with learner.meanwhile(fn) as later:`` calls ``fn()`` (trusted work such as the
        reference's result, which must not depend on the learner's) while the worker runs the next
        request inside the block, so that the two use both cores; ``later.result()`` is its value
        (computed then if no request was made). A learner's call that fails meanwhile fails as it
        would have; its time limit does not count ``fn``'s time."""
        later = Later(fn)
        self._sub.meanwhile = later
        try:
            yield later
        finally:
            if self._sub.meanwhile is later:
                self._sub.meanwhile = None

    def grader_attribute(self, module: str, attr: str):
        """`attr` of one of the grader's own modules copied beside the worker (`worker.GRADER_MODULES`,
        e.g. "optimizers", "SGD"), as a handle in the learner's process: how a check builds there an
        object that the learner's code is given, without depending on the notebook's names."""
        sub, label = self._sub, f"{module}.{attr}"
        value = sub.request({"op": P.OP_GETATTR, "target": {"grader": str(module)}, "attr": str(attr)}, name=label)
        return sub.returned(label, sub.decode(value, label))

    @staticmethod
    def _target(target):
        if isinstance(target, RemoteObject):
            return target._target(), target._label
        return {"name": str(target)}, str(target)

    def device_checked(self, target, *args, **kwargs):
        """Call `target` (a name or a handle) with every operation that mixes a meta tensor with a
        CPU tensor of one or more dimensions failing, as CUDA fails with CPU tensors."""
        tgt, label = self._target(target)
        return call(self._sub, tgt, label, args, kwargs, device_check=True)

    def memory_peak(self, target, *args, **kwargs) -> MemoryUse:
        """Call `target` and measure, from this process, the worker's peak memory during the
        call (all of its processes where it has a cgroup) above its memory before the learner's
        code was loaded; see `Submission.memory_meter`."""
        sub = self._sub
        tgt, label = self._target(target)
        sub.ensure_started()
        stop = sub.memory_meter()
        try:
            output = call(sub, tgt, label, args, kwargs)
        except BaseException:
            stop()
            raise
        peak, held, source = stop()
        return MemoryUse(output, peak, source, held, sub.self_check)

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
        allowed = sent_devices(sub, tgt, args, kwargs, cotangents)
        value = sub.request(req, name=label)
        if type(value) is not dict or set(value) != {"output", "arg_grads", "param_grads"}:
            raise BoundaryError(label, "malformed gradient reply")
        arg_grads = sub.decode(value["arg_grads"], label, allowed)
        param_grads = sub.decode(value["param_grads"], label, allowed)
        if type(arg_grads) is not list or type(param_grads) is not dict:
            raise BoundaryError(label, "malformed gradient reply")
        out = GradResult(sub.decode(value["output"], label, allowed), arg_grads, param_grads)
        sub.returned(label, out.output)
        return out
