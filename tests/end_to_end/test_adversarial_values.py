"""Round three, class 3: a value the learner's code returns never makes a check crash in the grader.

Whatever a learner's function returns (and the worker, being the learner's, can send any reply
the protocol accepts), the trusted side either refuses it at the boundary or fails the check
with a hint naming it: it never ends as a `grader_error`. Checked three ways:

* every chapter's hidden checks, run in this process against the reference's code in an
  in-process worker (the real worker's code and encoder) whose replies are replaced, one call
  position at a time, by each adversarial kind in turn, with the grader's replay of crashed
  checks turned off: the boundary and the checks' helpers alone must hold;
* every chapter's reference notebook with `attacks.values.ATTACK` at its end (the worker's
  encoder replaced: every other reply is the next kind), graded without the sandbox, and the
  chapter-03 one in the sandboxed adversarial batch;
* the grader's replay: a check that crashes only on the learner's values is the learner's
  failed check; one that crashes on the reference's too stays a grader error.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys

import numpy as np
import pytest
import torch

from attacks import values as V
from autograder.core.assignments import all_assignments, get_assignment
from autograder.core.notebook import code_cells, read_notebook
from autograder.grading.grader import GRADER_ERROR, Grader, HiddenCheck
from autograder.hidden import support
from autograder.isolation import protocol as P
from autograder.isolation.runner import Submission, sent_devices
from autograder.isolation.sandbox import SandboxUnavailable, detect
from conftest import add_cell, reference_notebook, write

CHAPTERS = [a.key for a in all_assignments()]


# --- an in-process worker: the real worker's code, the reference's notebook, replies replaced ------

def _load_worker():
    """autograder/isolation/worker.py as its own module (it imports its protocol as the top-level `protocol`)."""
    path = os.path.join(os.path.dirname(P.__file__), "worker.py")
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("_values_worker", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


HONEST = object()


class InProcess(Submission):
    """A submission whose worker runs here, answering through the protocol's framing and checks.

    `plan(check_number, call_number, value, encode)` returns the reply value for the call_number-th
    value the worker encodes during the check, or HONEST."""

    def __init__(self, worker, cells, limits, plan):
        super().__init__(cells, limits=limits, seed=0)
        self.W, self.w = worker, worker.Worker()
        honest = self.w.enc
        self.check_number, self.calls, self.counts = -1, 0, {}

        def enc(value, used=0):
            self.calls += 1
            self.counts[self.check_number] = self.calls
            out = plan(self.check_number, self.calls, value, honest)
            return honest(value, used) if out is HONEST else out
        self.w.enc = enc
        self.generation = 1

    def ensure_started(self):
        if self._loaded != 1:
            self._loaded = 1
            self._request({"op": P.OP_LOAD, "cells": self.cells, "seed": self.seed}, name="")

    def reseed(self, seed):
        self.check_number += 1
        self.calls = 0
        self.w.op_seed({"seed": seed})

    def _request(self, req, *, name, timeout=None):
        W, req_id = self.W, self._next_id
        self._next_id += 1
        req = json.loads(P.frame(dict(req, id=req_id)))
        try:
            reply = {"id": req_id, "ok": True, "value": self.w.handle(req)}
        except W._Reply as r:
            reply = W._error(req_id, r.kind, r.etype, r.message)
        except W.P.CodecError as exc:
            reply = W._error(req_id, P.KIND_CODEC, "CodecError", str(exc))
        except Exception as exc:  # noqa: BLE001 - as the worker's main loop: the learner's doing
            r = W._learner_error(exc)
            reply = W._error(req_id, r.kind, r.etype, r.message)
        try:
            data = W.P.frame(reply)
        except Exception as exc:  # noqa: BLE001
            data = W.P.frame(W._error(req_id, P.KIND_CODEC, "CodecError", f"not encodable: {type(exc).__name__}"))
        return self._check_reply(P.parse_frame(data[:-1], max_containers=self.limits.reply_containers), req_id, name)

    def close(self):
        self._tmp.cleanup()


def _leaves(v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if type(v) in (tuple, list):
        return type(v)(_leaves(x, fn) for x in v)
    if type(v) is dict:
        return {k: _leaves(x, fn) for k, x in v.items()}
    return v


def _forge(obj, fn):
    if type(obj) is list:
        return [_forge(x, fn) for x in obj]
    if type(obj) is dict and len(obj) == 1:
        (tag, val), = obj.items()
        if tag == P.TAG_TENSOR:
            return fn(val)
        if tag == P.TAG_TUPLE:
            return {tag: [_forge(x, fn) for x in val]}
        if tag == P.TAG_DICT:
            return {tag: [[k, _forge(x, fn)] for k, x in val]}
    return obj


def _leaf(fn):
    return lambda v, enc: enc(_leaves(v, fn))


def _wire(fn):
    return lambda v, enc: _forge(enc(v), fn)


def _whole(make):
    return lambda v, enc: enc(make(v))


class _Lying(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


# Every kind of reply a check may meet. _wire kinds are what only a forged reply carries.
KINDS = {
    "meta": _wire(lambda p: {P.TAG_META: {"dtype": p["dtype"], "shape": p["array"]["shape"]}}),
    "meta_encoded": _leaf(lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")),
    "meta_huge": _wire(lambda p: {P.TAG_META: {"dtype": p["dtype"], "shape": [2**39] * 3}}),
    "cuda0": _wire(lambda p: {P.TAG_TENSOR: dict(p, device="cuda:0")}),
    "cuda7": _wire(lambda p: {P.TAG_TENSOR: dict(p, device="cuda:7")}),
    "mps": _wire(lambda p: {P.TAG_TENSOR: dict(p, device="mps")}),
    "meta_with_data": _wire(lambda p: {P.TAG_TENSOR: dict(p, device="meta")}),
    "dtype_lie": _wire(lambda p: {P.TAG_TENSOR: dict(p, dtype="float16" if p["dtype"] != "float16" else "int64")}),
    "float16": _leaf(lambda t: t.to(torch.float16)),
    "bfloat16": _leaf(lambda t: t.to(torch.bfloat16)),
    "float64": _leaf(lambda t: t.to(torch.float64)),
    "float32": _leaf(lambda t: t.to(torch.float32)),
    "complex": _leaf(lambda t: t.to(torch.complex64)),
    "bool": _leaf(lambda t: t != 0),
    "int64": _leaf(lambda t: t.long()),
    "uint8": _leaf(lambda t: t.to(torch.uint8)),
    "zero_d": _leaf(lambda t: t.sum()),
    "empty": _leaf(lambda t: t.reshape(-1)[:0]),
    "empty_last_axis": _leaf(lambda t: t[..., :0] if t.dim() else t.reshape(1)[:0]),
    "extra_dim": _leaf(lambda t: t.unsqueeze(0)),
    "transposed": _leaf(lambda t: t.transpose(0, -1) if t.dim() else t),
    "numpy": _leaf(lambda t: (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()),
    "tolist": _leaf(lambda t: t.tolist()),
    "nan": _leaf(lambda t: torch.full_like(t, float("nan")) if t.is_floating_point() else t),
    "inf": _leaf(lambda t: torch.full_like(t, float("inf")) if t.is_floating_point() else t),
    "sparse": _leaf(lambda t: t.to_sparse() if t.dim() else t),
    "nested": _leaf(lambda t: torch.nested.nested_tensor([t.detach()]) if t.dim() else t),
    "quantised": _leaf(lambda t: torch.quantize_per_tensor(t.detach().float(), 0.1, 0, torch.qint8)),
    "subclass": _leaf(lambda t: t.as_subclass(_Lying)),
    "none": _whole(lambda v: None),
    "string": _whole(lambda v: "nan"),
    "int": _whole(lambda v: 3),
    "huge_int": lambda v, enc: 2**80,
    "float_nan": _whole(lambda v: float("nan")),
    "bool_value": _whole(lambda v: True),
    "dict": _whole(lambda v: {"out": v}),
    "nested_list": _whole(lambda v: [[v]]),
    "empty_tuple": _whole(lambda v: ()),
    "triple": _whole(lambda v: (v, v, v)),
    "handle": _whole(lambda v: object()),
    "unknown_handle": lambda v, enc: {P.TAG_HANDLE: {"id": 10**6, "type": "Tensor"}},
    "tensor_for_module": _whole(lambda v: torch.zeros(2)),
    "dtype_value": _whole(lambda v: torch.float32),
    "device_value": lambda v, enc: {P.TAG_DEVICE: "cuda:7"},
}
NAMES = sorted(KINDS)
# the call positions replaced in each check (a check makes from 1 to about 150 calls)
POSITIONS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 19, 24, 30, 38, 48, 60, 76, 96, 120, 150)


@pytest.fixture(scope="module")
def worker_module():
    return _load_worker()


@pytest.fixture(autouse=True)
def _quiet_grader_log():
    logger = logging.getLogger("autograder")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # crashes are asserted on below, not printed
    yield
    logger.setLevel(level)


@pytest.mark.slow
@pytest.mark.parametrize("key", CHAPTERS)
def test_no_returned_kind_makes_any_check_crash(key, worker_module, tmp_path, monkeypatch):
    """Call position k of every check of the chapter replaced, each check by a different kind in
    turn, with the replay turned off: the boundary and the helpers alone keep every check from
    crashing; an honest run first grades to full marks."""
    monkeypatch.setattr(Grader, "_replay", lambda *a, **k: None)  # a crash would stay a grader error
    g = Grader(get_assignment(key))
    checks = list(g.checks)
    cells = code_cells(read_notebook(write(reference_notebook(key), tmp_path / f"{key}.ipynb"), g.limits))

    def grade(plan, chosen):
        g.checks = chosen
        sub = InProcess(worker_module, cells, g.limits, plan)
        res = g.new_result("ref", "ref", 1234)
        g.run_checks(sub, res)
        return sub, res

    sub, res = grade(lambda c, n, v, e: HONEST, checks)
    assert res.status == "graded" and all(c.passed for c in res.checks), [c.hint for c in res.checks if not c.passed]
    counts = sub.counts
    crashed, failed, ran = [], 0, 0
    for k in POSITIONS:
        chosen = [c for i, c in enumerate(checks) if counts.get(i, 0) >= k]
        if not chosen:
            break

        def plan(c, n, v, e, k=k):
            return KINDS[NAMES[(c * 7 + k) % len(NAMES)]](v, e) if n == k else HONEST
        _, res = grade(plan, chosen)
        for i, c in enumerate(res.checks):
            ran += 1
            failed += not c.passed
            if c.grader_error:
                crashed.append((NAMES[(i * 7 + k) % len(NAMES)], k, c.name))
    assert not crashed, crashed
    assert failed > ran / 5  # the replaced values did reach the checks (some kinds are harmless to some values)


def _graded(key: str, nb, tmp_path):
    with Grader(get_assignment(key)) as g:
        return g.grade(write(nb, tmp_path / f"{key}.ipynb"), seed=7)


@pytest.mark.slow
def test_every_chapter_grades_a_notebook_of_lying_values_without_a_grader_error(tmp_path):
    """The attack notebook of every chapter (no sandbox: the sandboxed run is the batch's)."""
    hints = []
    for key in CHAPTERS:
        r = _graded(key, V.notebook(key), tmp_path)
        assert r.status == "graded", (key, r.status, r.error)
        assert not any(c.grader_error for c in r.checks), key
        assert r.score < r.max_score / 2, (key, r.score)
        hints += [c.hint for c in r.checks if not c.passed]
    text = "\n".join(hints)
    # the main kinds are named in the hints they cause
    for words in ("meta device", "cuda:0", "mps", "sparse", "nested tensor", "quantised", "storage",
                  "more than 63 bits", "dtype", "shape"):
        assert words in text, words


def test_the_sandboxed_batch_grades_the_lying_values(batch):
    r = batch["by"]["values_cycle"]
    assert r["status"] == "graded", r
    assert not any(c.get("grader_error") for c in r["checks"])
    assert r["score"] < r["max_score"] / 2


# --- the replay: what counts as the learner's, what stays ours -------------------------------------

def _check(name, fn):
    return HiddenCheck(name=name, part="softmax", points=1.0, title=name, fn=fn, params=("learner",))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["plain", "sandboxed, warm"])
def test_a_crash_only_on_the_learners_values_is_the_learners_and_one_on_the_references_is_ours(how, tmp_path):
    def uses_the_value(learner):
        out = learner.softmax(np.ones(3))
        support.expect(float(out[0]) > 0, "no")  # float() of what the learner returned, unchecked

    def our_bug(learner):
        learner.softmax(np.ones(3))
        raise KeyError("a bug in the check")

    def before_any_call(learner):
        raise ZeroDivisionError

    nb = add_cell(reference_notebook("03_qkv"), "def softmax(x, axis=-1):\n    return 'soft'\n")
    kw = {}
    if how != "plain":
        try:
            kw = {"sandbox": detect(), "warm": True}
        except SandboxUnavailable as exc:
            pytest.skip(str(exc))
    with Grader(get_assignment("03_qkv"), **kw) as g:
        g.checks = [_check("uses", uses_the_value), _check("bug", our_bug), _check("early", before_any_call)]
        r = g.grade(write(nb, tmp_path / "s.ipynb"), seed=3)
        by = {c.name: c for c in r.checks}
        assert not by["uses"].passed and not by["uses"].grader_error
        assert "ValueError" in by["uses"].hint and "`softmax`" in by["uses"].hint and "a str" in by["uses"].hint
        assert by["bug"].grader_error and by["early"].grader_error
        assert r.status == GRADER_ERROR and "bug" in r.error and "uses" not in r.error
        # the honest notebook passes the value check: the replay only ever reruns crashed checks
        r = g.grade(write(reference_notebook("03_qkv"), tmp_path / "ref.ipynb"), seed=3)
        assert {c.name: c.passed for c in r.checks}["uses"]


# --- the boundary and the helpers, kind by kind ------------------------------------------------------

def _tensor_reply(**fields):
    payload = P.encode(torch.ones(2, 3))[P.TAG_TENSOR]
    return {P.TAG_TENSOR: dict(payload, **fields)}


@pytest.mark.parametrize("reply, devices, words", [
    (_tensor_reply(device="cuda:0"), {"cpu"}, "cuda:0 device"),
    (_tensor_reply(device="mps"), {"cpu"}, "mps device"),
    (_tensor_reply(device="meta"), {"cpu", "meta"}, "meta device cannot carry data"),
    (_tensor_reply(dtype="float16"), {"cpu"}, "float16 tensor whose data is float32"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2, 3]}}, {"cpu"}, "meta device"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2**39] * 3}}, {"cpu", "meta"}, "more elements"),
    ([1, 2**70], {"cpu"}, "more than 63 bits"),
])
def test_the_boundary_refuses_what_the_request_cannot_get_back(reply, devices, words):
    with pytest.raises(P.CodecError, match=words):
        P.Decoder(devices=devices)(reply)


def test_the_boundary_accepts_what_the_request_sent():
    assert P.Decoder(devices={"cpu", "meta"})({P.TAG_META: {"dtype": "float32", "shape": [2]}}).device.type == "meta"
    assert P.Decoder(devices={"cpu"})(_tensor_reply()).dtype == torch.float32
    assert P.Decoder()([2**62, -(2**62)]) == [2**62, -(2**62)]


@pytest.mark.parametrize("value, words", [
    (torch.empty(2, 3, device="meta"), "without data"),
    (torch.ones(2, 3).to_sparse(), "sparse"),
    (torch.nested.nested_tensor([torch.ones(2, 3)]), "nested tensor"),
    (torch.quantize_per_tensor(torch.ones(2, 3), 0.1, 0, torch.qint8), "quantised"),
    (torch.ones(2, 3).as_subclass(_Lying), "subclass"),
    ("soft", "not a str"),
    (None, "not None"),
    (torch.ones(2, 3, dtype=torch.long), "floating-point"),
])
def test_tensor_names_what_was_returned_and_close_is_false(value, words):
    with pytest.raises(support.Hint, match=words):
        support.tensor(value, "f", floating=True)
    assert support.close(value, torch.ones(2, 3)) is False
    assert support.close(torch.ones(2, 3), value) is False


def test_the_worker_encoder_names_tensors_that_carry_no_data():
    t = torch.ones(2, 3)
    t.untyped_storage().resize_(0)
    for value, words in [(t, "storage"), (torch.ones(2, 3).to_sparse_csr(), "sparse"),
                         (torch.nested.nested_tensor([torch.ones(2)]), "nested")]:
        with pytest.raises(P.CodecError, match=words):
            P.encode(value)


def test_a_reply_may_hold_tensors_only_on_devices_its_request_sent():
    with Submission([], seed=0) as sub:
        assert sent_devices(sub, {"name": "f"}, (torch.ones(2),), {}) == {"cpu"}
        assert sent_devices(sub, {"name": "f"}, (), {"device": "cuda"}) == {"cpu", "cuda:0"}  # a device asked for by name
        assert sent_devices(sub, {"name": "f"}, (), {}) == {"cpu"}
        assert sent_devices(sub, {"handle": 1}, (), {}) == {"cpu", "cuda:0"}  # a module the check moved there
        assert sent_devices(sub, {"name": "f"}, (), {}, device_check=True) == {"cpu", "meta"}
        assert sent_devices(sub, {"name": "f"}, (torch.empty(2, device="meta"),), {}) == {"cpu", "meta"}
        assert "meta" not in sent_devices(sub, {"handle": 1}, (), {})  # meta only where this request asked for it
