"""Work done ahead (`autograder.grading.ahead`, `support.prepared`): a check gets what it would have
computed itself, a failing work is ours, and the thread is gone when grading ends."""

from __future__ import annotations

import dataclasses
import sys
import threading
import types

import numpy as np
import pytest
import torch

import autograder.grading.grader as grader_module
from autograder.core.assignments import get_assignment
from autograder.grading.grader import (GRADER_ERROR, Grader, GraderConfigError, HiddenCheck, check_seed,
                                       load_hidden_checks)
from autograder.hidden import support
from conftest import reference_notebook, write


def _check(name, fn, prepare=None):
    params = ("learner", "rng", "prepared") if prepare is not None else ("learner",)
    return HiddenCheck(name=name, part="softmax", points=1.0, title=name, fn=fn, params=params, prepare=prepare)


def test_a_check_gets_the_work_and_the_draws_it_would_have_made_itself(tmp_path):
    """The work runs in the grader's thread while the first check waits for the worker; the check then gets the
    work's value and a generator with the work's draws made: the same numbers as one thread drawing both."""
    seen = {}

    def first(learner):  # waits for the worker to start: the thread works meanwhile
        support.expect(learner.softmax(np.ones(3)) is not None, "no")

    def setup(reference):
        module = torch.nn.Linear(3, 3)  # drawn from the global generator: here, not in the thread

        def work(rng):
            seen["thread"] = threading.current_thread().name
            return module.weight.shape, torch.randn(4, generator=rng)
        return work

    def later(learner, rng, prepared):
        seen["prepared"], seen["after"] = prepared, torch.randn(3, generator=rng)

    with Grader(get_assignment("03_qkv")) as g:
        g.checks = [_check("first", first), _check("later", later, setup)]
        r = g.grade(write(reference_notebook("03_qkv"), tmp_path / "s.ipynb"), seed=7)
    assert [c.passed for c in r.checks] == [True, True], [c.hint for c in r.checks]
    own = torch.Generator().manual_seed(check_seed(7, "later"))
    drawn = torch.randn(4, generator=own)
    assert seen["prepared"][0] == (3, 3) and torch.equal(seen["prepared"][1], drawn)
    assert torch.equal(seen["after"], torch.randn(3, generator=own))
    assert seen["thread"] == "grader-ahead"
    assert not any(t.name == "grader-ahead" for t in threading.enumerate())
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_work_or_setup_that_raises_is_our_fault_never_the_learners(tmp_path):
    def plain(learner):
        learner.softmax(np.ones(3))

    def broken_work(reference):
        return lambda rng: 1 / 0

    def broken_setup(reference):
        raise KeyError("a bug in the setup")

    def uses(learner, rng, prepared):
        learner.softmax(np.ones(3))

    with Grader(get_assignment("03_qkv")) as g:
        g.checks = [_check("plain", plain), _check("work", uses, broken_work), _check("setup", uses, broken_setup)]
        r = g.grade(write(reference_notebook("03_qkv"), tmp_path / "s.ipynb"), seed=1)
    by = {c.name: c for c in r.checks}
    assert by["plain"].passed and not by["plain"].grader_error
    assert by["work"].grader_error and by["setup"].grader_error
    assert r.status == GRADER_ERROR and "work" in r.error and "setup" in r.error


def test_a_check_marked_prepared_must_take_the_fixture(monkeypatch):
    def setup(reference):
        return lambda rng: None

    @support.points(1, part="softmax")
    @support.prepared(setup)
    def test_without(learner):
        """A check that forgets the fixture."""

    fake = types.SimpleNamespace(test_without=test_without)
    monkeypatch.setattr(grader_module.importlib, "import_module", lambda name: fake)
    with pytest.raises(GraderConfigError, match="prepared"):
        load_hidden_checks(get_assignment("03_qkv"))


@pytest.mark.slow
def test_06_greedy_checks_choose_the_same_models_ahead_as_alone(tmp_path, monkeypatch):
    """Chapter 06's greedy checks search their model ahead: the models and sources they judge with are those
    the search gives when each check does it alone, at its start (the order of draws of one thread)."""
    from autograder.hidden import test_06_transformer as T06

    chosen = []
    original = T06._greedy_model

    def noted(*args, **kwargs):
        m, src = original(*args, **kwargs)
        chosen.append((src.clone(), {k: v.clone() for k, v in m.sd.items()}))
        return m, src

    monkeypatch.setattr(T06, "_greedy_model", noted)
    nb = write(reference_notebook("06_transformer"), tmp_path / "06.ipynb")
    runs = []
    with Grader(get_assignment("06_transformer")) as g:
        greedy = [c for c in g.checks if c.prepare is not None]
        assert len(greedy) == 3
        for alone in (False, True):
            if alone:  # no work ahead: each check searches at its start (`prepared` is None)
                g.checks = [dataclasses.replace(c, prepare=None) for c in g.checks]
            chosen.clear()
            r = g.grade(nb, seed=11, parts=[greedy[0].part])
            assert r.score == r.max_score
            runs.append(list(chosen))
    assert len(runs[0]) == len(runs[1]) >= 3
    for (src_a, sd_a), (src_b, sd_b) in zip(*runs):
        assert torch.equal(src_a, src_b)
        assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
