"""Round two, classes 1-3 (tests/attacks/worker_io.py): a hostile worker's pipes and replies.

Each attack must cost exactly the checks it touches, within the submission's own time
limit; the rest of the batch is graded as if it had not been there, and no attack shows
up as a grader error (a learner must not be able to hide a grade behind a fake grader bug).
"""

from __future__ import annotations

import pytest

from attacks import TIMEOUT
from attacks.worker_io import FORGED


def _part(batch, part):
    return batch["by"]["honest_reference"]["parts"][part]["max_score"]


def _full(batch):
    return batch["by"]["honest_reference"]["max_score"]


def _ok(batch, name):
    r = batch["by"][name]
    assert r["status"] == "graded", (name, r["status"], r["error"])
    assert not any(c["grader_error"] for c in r["checks"]), name
    assert r["seconds"] <= float(TIMEOUT) + 10, (name, r["seconds"])
    return r


def test_a_stopped_worker_with_a_full_pipe_costs_only_its_own_time(batch):
    """Does a worker that shrinks its pipe and stops itself (SIGSTOP) lose the later checks, within its
    own time limit, instead of freezing the grader inside a blocking write?"""
    r = _ok(batch, "io_stop_and_stall")
    parts = r["parts"]
    assert parts["softmax"]["score"] == _part(batch, "softmax")  # graded before the stall
    assert r["score"] < _full(batch)
    assert any("did not finish" in c["hint"] for c in r["checks"] if not c["passed"])


@pytest.mark.parametrize("name", ["io_half_reply", "io_endless_reply"])
def test_a_reply_that_never_ends_costs_its_checks(batch, name):
    """Does half a reply, or one that never ends, cost the softmax checks (and what the submission's
    time limit no longer covers), never more than the submission's own time?"""
    r = _ok(batch, name)
    assert r["parts"]["softmax"]["score"] == 0
    assert r["score"] <= _full(batch) - _part(batch, "softmax")


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_replies_cost_the_checks_never_a_grader_error(batch, name):
    """Does every reply with a wrong shape, type, nesting or size cost its checks (a 'cannot accept' or
    'malformed' hint), never an internal grader error, and nothing beyond the submission's own time?"""
    r = _ok(batch, name)
    assert r["score"] == 0
    hints = {c["hint"] for c in r["checks"]}
    assert all(("malformed" in h or "cannot accept" in h or "unexpected reply" in h or "lists or objects" in h
                or "does not match" in h or "restarted too often" in h or "ended the grading process" in h)
               for h in hints), hints
