"""Round two, classes 1-3 (tests/attacks/worker_io.py): a hostile worker's pipes and replies.

Each attack must cost exactly the checks it touches, within the submission's own time
limit; the rest of the batch is graded as if it had not been there, and no attack shows
up as a grader error (a learner must not be able to hide a grade behind a fake grader bug).

Also the grader's own environment (tests/attacks/environment.py): what a notebook or whoever
starts the grader plants in it (PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD, a sitecustomize.py in the
working folder) reaches none of the processes the grader starts; here a local Dask cluster's jobs.
"""

from __future__ import annotations

import os

import pytest

from attacks import TIMEOUT
from attacks.environment import Poison, planted_in
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


def test_a_notebook_that_plants_its_environment_before_check_is_graded_as_the_reference(batch):
    """The reference with a cell that sets PYTHONPATH, PYTHONSTARTUP and LD_PRELOAD, then calls check():
    `grade` gives it the reference's marks (in a learner's kernel, tests/learner/test_in_notebook.py shows the
    same for check()), and no note: the check cell runs in the sandbox, which has no copy of the course's
    package, without an error."""
    r = _ok(batch, "env_planted_then_check")
    assert r["score"] == _full(batch) and not r["error"]
    assert r["notes"] == []


@pytest.mark.slow
def test_the_jobs_of_a_local_cluster_start_isolated_from_the_graders_environment(tmp_path, monkeypatch):
    """`grade --jobs N` spawns its jobs through multiprocessing, which would give them the grading
    process's whole environment: do they start with `-I` and nothing planted, and is the grading process's
    environment as it was once the cluster is closed?"""
    from autograder.batch.dask_cluster import LocalGrading

    def started():  # run in the job; defined here, so that it travels by value (no test module imported there)
        import sys

        raw = open("/proc/self/environ", "rb").read().decode(errors="replace").split("\0")
        return {"isolated": sys.flags.isolated, "environ": dict(e.split("=", 1) for e in raw if "=" in e)}

    poison = Poison(tmp_path / "planted").apply(monkeypatch)
    cluster = LocalGrading(1)
    try:
        (seen,) = cluster.client.run(started).values()
    finally:
        cluster.close()
    assert seen["isolated"] == 1 and not planted_in(seen["environ"]), seen
    assert poison.ran() == []
    assert all(os.environ.get(k) == v for k, v in poison.env.items())  # put back for this process
