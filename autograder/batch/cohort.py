"""Grading a batch on several processes or machines: the task, the jobs that run it, and where.

The coordinator (`grading_run.GradingRun`) scans the submissions, reads and hashes each
notebook, decides what needs grading, and alone writes the gradebook, the CSV, the result
records and the feedback pages. What it hands out is one *task* per submission, plain
data: the notebook's bytes as they were hashed, the assignment key, the student id, the
seed, the instructor's limit overrides and how to sandbox. `grade_task` grades it and
returns plain data too: the `Result` as a dict (JSON types only) and the log records the
grading wrote. Learner code runs only in the sandboxed worker that `Grader` starts, on the
machine that runs the task; nothing of it reaches the coordinator but that dict.

Where tasks run (`runner`):

* one job and no scheduler (`--jobs 1`, or a single submission to grade): in the
  coordinator's process, one after the other; nothing to start;
* otherwise on Dask: a `LocalCluster` of N single-threaded worker processes (`--jobs N`),
  or an existing cluster (`--scheduler ADDRESS`). Who may reach them is decided in
  `dask_cluster`: the local cluster speaks only TLS with credentials made for the batch,
  and an unauthenticated scheduler address is refused unless the instructor insists
  (`--insecure-scheduler`). A worker that dies mid-task loses
  nothing: the scheduler gives its tasks to another worker, and the coordinator records
  each task's result once, when its future completes.

Each job process builds its sandbox and its `Grader` once and reuses them for every task
it runs (a warm start, when the grader has one, pays off only that way). On a machine
where the grader runs as root, every grading process takes a *uid slot* (an flock on a
file, held while the process lives) and gives its sandboxed workers uids from that slot's
own share of the sandbox uids, so no two processes on one machine, whoever started them,
hand out the same uid at the same time (`autograder.isolation.uids`). The slot files live in the grader's
runtime folder (`autograder.isolation.runtime`: /run/autograder for root), a place no other local user can
create first.
Each worker's memory cgroup is named after its process id, so cgroups never collide either.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("autograder")

MIN_PER_JOB = 3  # without --jobs, at most one job per this many submissions to grade


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:
        return os.cpu_count() or 1


# --- the task ---------------------------------------------------------------------------

def new_grader(key: str, *, sandbox, overrides: dict | None, warm: bool):
    """A `Grader` for `key`; GraderConfigError if the course's files are inconsistent."""
    from ..core.assignments import get_assignment
    from ..grading.grader import Grader

    kw = {"warm": True} if warm else {}
    return Grader(get_assignment(key), sandbox=sandbox, overrides=overrides, **kw)


def make_task(tag: int, *, key: str, student: str, label: str, name: str, data: bytes, seed: int,
              overrides: dict | None, sandbox: dict, warm: bool) -> dict:
    """One submission to grade, as plain data.

    `sandbox` is {"use": bool, "cgroup": a cgroup folder, "auto" or None, "forbidden": [paths]}."""
    return {"tag": tag, "key": key, "student": student, "label": label, "name": name, "data": bytes(data),
            "seed": int(seed), "overrides": overrides, "sandbox": sandbox, "warm": bool(warm)}


class _JobState:
    """What a job process builds once and keeps: its sandbox and one Grader per assignment."""

    def __init__(self):
        self.lock = threading.Lock()  # a worker with several threads grades one task at a time
        self.sandboxes: dict[str, object] = {}
        self.graders: dict[str, object] = {}
        self.configured = False

    def grader(self, task: dict):
        cfg = task["sandbox"]
        skey = json.dumps(cfg, sort_keys=True)
        if not self.configured:
            import torch

            torch.set_num_threads(1)  # one job, one core: N jobs fill N cores without oversubscribing
            self.configured = True
        if skey not in self.sandboxes:
            from ..isolation.sandbox import make_sandbox

            self.sandboxes[skey] = make_sandbox(cfg["forbidden"], cfg["cgroup"]) if cfg["use"] else None
        gkey = json.dumps([task["key"], task["overrides"], skey, task["warm"]], sort_keys=True)
        if gkey not in self.graders:
            self.graders[gkey] = new_grader(task["key"], sandbox=self.sandboxes[skey], overrides=task["overrides"],
                                            warm=task["warm"])
        return self.graders[gkey]


_STATE = _JobState()


class _Capture(logging.Handler):
    """The grading's log records, to be sent back to the coordinator's log."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[list] = []
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        if len(self.records) < 200:
            self.records.append([record.levelno, self.format(record)[:20000]])


def where() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def grade_task(task: dict, grader=None) -> dict:
    """Grade one task; {"result": Result as a dict, "log": [[level, text]], "worker": "host:pid"}.

    `grader` is the coordinator's own when it runs the task itself (its log records then go
    straight to the run's log); a job process uses the one it built for this assignment."""
    capture = None
    with _STATE.lock:
        if grader is None:
            capture = _Capture()
            log.addHandler(capture)
            log.setLevel(logging.INFO)
            log.propagate = False  # the records go back with the result, not to the worker's stderr
        copies = tempfile.mkdtemp(prefix="autograder-copy-")
        try:
            grader = grader or _STATE.grader(task)
            # The worker grades a private copy of the bytes the coordinator hashed; it never opens
            # the submission's path.
            path = Path(copies) / (task["name"] or "notebook.ipynb")
            path.write_bytes(task["data"])
            result = grader.grade(path, student=task["student"], seed=task["seed"], label=task["label"])
        finally:
            shutil.rmtree(copies, ignore_errors=True)
            if capture is not None:
                log.removeHandler(capture)
    # JSON types only: what crosses back is data, whatever a Result might hold by mistake.
    return {"result": json.loads(json.dumps(result.to_dict())), "log": capture.records if capture else [],
            "worker": where()}


def result_of(outcome, task: dict, grader):
    """The `Result` of a task: rebuilt from a worker's dict, or a grader error if the task failed
    (an exception: the worker could not grade; never the learner's loss)."""
    from ..grading.grader import GRADER_ERROR, Result

    if isinstance(outcome, dict) and isinstance(outcome.get("result"), dict):
        return Result.from_dict(outcome["result"])
    return Result.blank(task["key"], task["label"], grader.parts, student=task["student"], status=GRADER_ERROR,
                        error=(f"the grading job failed ({type(outcome).__name__}: {str(outcome)[:300]}); the details "
                               "are in the grading log. This is not the learner's fault: regrade"),
                        seed=task["seed"])


def prepare(task: dict) -> str:
    """Build this job's sandbox and grader before the first submission; what its sandbox is."""
    with _STATE.lock:
        grader = _STATE.grader(task)
    sb = grader.sandbox
    return sb.describe() if sb is not None else "no sandbox (--no-sandbox)"


# --- where tasks run ---------------------------------------------------------------------

def task_resources(uses_cuda: bool, workers: dict) -> dict | None:
    """Dask resources for an assignment's tasks: {"GPU": 1} when its hidden checks run on CUDA
    and some worker of the cluster declares a GPU (`dask worker --resources GPU=1`), so every
    submission of it is graded on the same kind of machine; else none (the checks run on the
    CPU, as they always do besides CUDA)."""
    if uses_cuda and any(float((w or {}).get("resources", {}).get("GPU", 0)) >= 1 for w in workers.values()):
        return {"GPU": 1}
    return None


def uses_cuda(grader) -> bool:
    """Whether any hidden check of the assignment runs on every available device."""
    return any("devices" in c.params for c in grader.checks)


class Serial:
    """Tasks in the coordinator's process, one after the other."""

    name = "1 job in this process"

    def __init__(self, grader):
        self.grader = grader

    def run(self, tasks):
        for task in tasks:
            try:
                yield task, grade_task(task, self.grader)
            except Exception as exc:  # noqa: BLE001 - Grader.grade never raises; anything else is ours
                log.error("grading %s failed in the coordinator", task["student"], exc_info=True)
                yield task, exc

    def close(self):
        close = getattr(self.grader, "close", None)
        if close is not None:  # ends a warm start's template
            close()


class OnDask:
    """Tasks on a Dask cluster: a LocalCluster of `jobs` processes that only this process can
    reach (TLS with credentials made for the batch, `dask_cluster.LocalGrading`), or the one at
    `address`, over TLS, or unauthenticated only if `insecure` (`dask_cluster.scheduler_security`)."""

    def __init__(self, *, jobs: int | None = None, address: str | None = None, insecure: bool = False,
                 connect_timeout: float = 30):
        from . import dask_cluster
        self.cluster = None
        self.warning = None
        if address:
            # SchedulerRefused for an address that authenticates nobody, unless `insecure`
            security, self.warning = dask_cluster.scheduler_security(address, insecure)
            self.client = dask_cluster.remote_client(address, security, connect_timeout)
            self.name = f"Dask scheduler {address}"
        else:
            self.cluster = dask_cluster.LocalGrading(jobs)
            self.client = self.cluster.client
            self.name = f"{jobs} jobs (a local Dask cluster)"
        self.resources = None

    def workers(self) -> dict:
        return self.client.scheduler_info().get("workers", {})

    def prepare(self, task: dict) -> dict:
        """Each worker's sandbox, built before the batch: {worker: description or the exception}."""
        futures = {addr: self.client.submit(prepare, task, workers=[addr], allow_other_workers=False, pure=False)
                   for addr in self.workers()}
        out = {}
        for addr, fut in futures.items():
            try:
                out[addr] = fut.result()
            except Exception as exc:  # noqa: BLE001 - reported to the instructor with the worker's name
                out[addr] = exc
        return out

    def slots(self) -> int:
        return max(sum(int(w.get("nthreads", 1)) for w in self.workers().values()), 1)

    def run(self, tasks):
        """(task, outcome) as tasks complete; at most a few per worker thread in flight."""
        from distributed import as_completed

        window = 2 * self.slots() + 2
        tasks = iter(tasks)
        pending: dict = {}

        def submit_next():
            task = next(tasks, None)
            if task is None:
                return None
            fut = self.client.submit(grade_task, task, pure=False, resources=self.resources,
                                     key=f"grade-{task['key']}-{task['tag']}-{os.urandom(4).hex()}")
            pending[fut.key] = task
            return fut

        first = []
        while len(first) < window and (fut := submit_next()) is not None:
            first.append(fut)
        if not first:
            return
        done = as_completed(first, loop=self.client.loop)
        for fut in done:
            task = pending.pop(fut.key)
            try:
                outcome = fut.result()
            except Exception as exc:  # noqa: BLE001 - a lost or failing job: a grader error for this one
                log.error("grading %s failed on the cluster: %s: %s", task["student"], type(exc).__name__, exc)
                outcome = exc
            fut.release()
            nxt = submit_next()
            if nxt is not None:
                done.add(nxt)
            yield task, outcome

    def close(self):
        if self.cluster is not None:
            self.cluster.close()
        else:
            self.client.close()


def replay_log(outcome) -> None:
    """The log records a job sent back, into this run's log."""
    if isinstance(outcome, dict):
        for level, text in outcome.get("log", [])[:200]:
            log.log(int(level) if isinstance(level, int) else logging.ERROR, "[job %s] %s", outcome.get("worker"),
                    str(text))


class Progress:
    """The tail of each learner's progress line: done / total, failures, estimated time left."""

    def __init__(self, total: int, done: int = 0):
        self.total, self.done, self.failed = total, done, 0
        self.graded, self.to_grade = 0, 0
        self.start = time.monotonic()

    def restart(self) -> None:
        self.start = time.monotonic()

    def dropped(self) -> None:
        """A submission that could not be read again: done, failed, not graded."""
        self.done += 1
        self.failed += 1
        self.to_grade -= 1

    def add(self, status: str, graded: bool) -> str:
        self.done += 1
        self.failed += status != "graded"
        self.graded += graded
        left = self.to_grade - self.graded
        if self.graded and left > 0:
            eta = (time.monotonic() - self.start) / self.graded * left
            when = f"ETA {eta:.0f} s" if eta < 90 else f"ETA {eta / 60:.0f} min"
        else:
            when = "ETA 0 s"
        return f" ({self.done}/{self.total} done, {self.failed} failed, {when})"
