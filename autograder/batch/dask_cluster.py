"""The Dask side of parallel grading: who may reach the cluster that runs the grading jobs.

A grading job runs as the grader's user (root, on a grading server) and holds every
notebook, hidden test and result of its batch, so whoever can give it a task owns the
batch. Dask's comms run any pickled function they are sent: the scheduler runs tasks,
and workers and nannies answer a `run` request on their own ports. Hence:

* the local cluster of `grade --jobs N` (`local_cluster`) speaks only TLS with mutual
  authentication, on 127.0.0.1: a fresh key and self-signed certificate per batch
  (`Security.temporary()`), kept in the memory of the grading process and of the job
  processes it spawns (they receive it through the pipe that starts them). Every
  listener (scheduler, nannies, workers) requires a client certificate signed by that
  key, so another local user can open a TCP connection but cannot complete the
  handshake, and no task or request of theirs is read. The HTTP servers Dask starts
  beside each scheduler and worker (plain HTTP: metrics, task and worker pages) get no
  routes and are stopped once started, also on a worker its nanny restarts. Dask's
  scratch folder, which every Dask node puts first on its `sys.path` (the scheduler in
  the grading process too), is a fresh 0700 folder of the grading process, not the
  shared `/tmp/dask-scratch-space`, which any local user can create first and then swap
  a folder of its own for the node's. The job processes start as every helper process of
  the course does, isolated from the grading process's Python environment
  (`processes.isolate_spawned`: `-I`, and only the allow-listed variables);
* an existing cluster (`--scheduler ADDRESS`) is used only over TLS (`tls://`) with the
  credentials of Dask's configuration (`distributed.comm.tls.ca-file`,
  `distributed.comm.tls.client.cert` and `.key`); any other address (`tcp://`, `ws://`,
  `wss://`, `ucx://`, or no scheme) is refused unless the instructor passes
  `--insecure-scheduler`, and then a warning says what that exposes.

Nothing here is imported unless a batch runs on Dask (importing `distributed` costs about
half a second).
"""

from __future__ import annotations

import logging
import shutil
import tempfile

import dask
from distributed import Client, LocalCluster
from distributed.comm import parse_address
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.security import Security

from ..isolation.processes import isolate_spawned

TLS_SCHEMES = ("tls",)  # the Dask comm that authenticates both ends (Dask's TLS settings)
NO_HTTP = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


class SchedulerRefused(ValueError):
    """A `--scheduler` address the grader will not use as given; the message says why and what to do."""


def insecure_warning(address: str) -> str:
    return (f"warning: --insecure-scheduler: the Dask scheduler {address} authenticates nobody: any process that "
            "can reach it or its workers (other users of those machines, anyone on their network) can run code as "
            "the grading jobs, read every notebook and hidden test sent to them, and change the results they send "
            "back. Use it only where every such user is trusted")


def scheduler_security(address: str, insecure: bool = False) -> tuple[Security, str | None]:
    """How to reach the scheduler at ADDRESS: (the client's `Security`, a warning to print or None).

    A TLS address uses Dask's configuration, which must name a CA and the client's
    certificate and key (Dask's TLS contexts require and check the peer's certificate in
    both directions). Any other address is refused (SchedulerRefused) unless `insecure`."""
    try:
        scheme, _ = parse_address(address)
    except (ValueError, TypeError) as exc:
        raise SchedulerRefused(f"--scheduler {address}: not a Dask address ({exc})") from None
    if scheme in TLS_SCHEMES:
        security = Security(require_encryption=True)
        try:
            context = security.get_connection_args("client").get("ssl_context")
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise SchedulerRefused(f"--scheduler {address}: Dask's TLS configuration cannot be loaded: "
                                   f"{type(exc).__name__}: {exc}") from None
        if context is None:
            raise SchedulerRefused(
                f"--scheduler {address}: a {scheme}:// scheduler needs the grader's TLS credentials, and Dask's "
                "configuration names none: set distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
                "distributed.comm.tls.client.key (in ~/.config/dask/*.yaml, or the environment variables "
                "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and "
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY)")
        return security, None
    if not insecure:
        raise SchedulerRefused(
            f"refusing --scheduler {address}: a {scheme}:// address authenticates nobody, so anyone who can reach "
            "that cluster could run code in the grading jobs and change grades. Use a tls:// scheduler (its "
            "credentials come from Dask's configuration, distributed.comm.tls.*), or pass --insecure-scheduler if "
            "every user who can reach it and its workers is trusted")
    return Security(), insecure_warning(address)


def temporary_security() -> Security:
    """A fresh key and certificate, in memory, for one batch's local cluster."""
    try:
        return Security.temporary()
    except ImportError as exc:
        raise RuntimeError("the local Dask cluster needs the `cryptography` package for its temporary TLS "
                           "credentials (it is in requirements.txt): pip install -r requirements.txt") from exc


def _stop_http(dask_scheduler=None, dask_worker=None) -> bool:
    """Close the HTTP server Dask starts beside a scheduler or worker (run on that node's loop)."""
    node = dask_scheduler if dask_scheduler is not None else dask_worker
    server = getattr(node, "http_server", None)
    if server is not None:
        server.stop()
    return server is not None


class NoHTTP(WorkerPlugin):
    """Stops each worker's HTTP server; the scheduler applies it again to a worker that a
    nanny restarts."""

    idempotent = True

    def setup(self, worker):
        _stop_http(dask_worker=worker)


class LocalGrading:
    """A local cluster of `jobs` single-threaded worker processes that only this process can use."""

    def __init__(self, jobs: int):
        self.scratch = tempfile.mkdtemp(prefix="autograder-dask-")  # 0700, a fresh name: nobody else's
        self.cluster = self.client = None
        # Each job process (and any the nanny starts again) starts as `python -I` with the allow-listed
        # environment, not with this process's PYTHONPATH, LD_PRELOAD and the like, until close()
        self._isolated = isolate_spawned()
        try:
            self.security = temporary_security()
            # Read when each node starts (a nanny keeps this configuration for the workers it
            # restarts): no HTTP pages, and the scratch folder of every node, the scheduler in
            # this process included, in our private folder.
            with dask.config.set({**NO_HTTP, "temporary-directory": self.scratch}):
                # One thread per worker process: tasks set torch's global seeds, and a job is one core.
                self.cluster = LocalCluster(
                    n_workers=jobs, threads_per_worker=1, processes=True, protocol="tls://", host="127.0.0.1",
                    security=self.security, local_directory=self.scratch, memory_limit=0,
                    silence_logs=logging.ERROR, dashboard_address=None,
                    # a port of its own: the default 8787 taken by someone else would only print a warning
                    scheduler_kwargs={"dashboard_address": "127.0.0.1:0", "local_directory": self.scratch})
            self.client = Client(self.cluster, security=self.security, set_as_default=False)
            self.client.register_plugin(NoHTTP(), name="autograder-no-http")
            self.client.run_on_scheduler(_stop_http)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.close()
            finally:
                shutil.rmtree(self.scratch, ignore_errors=True)
                self._isolated()


def remote_client(address: str, security: Security, timeout: float) -> Client:
    return Client(address, security=security, timeout=timeout, set_as_default=False)
