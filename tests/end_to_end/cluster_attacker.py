"""Another local user attacks a grading batch's Dask cluster (run by tests/end_to_end/test_adversarial_cluster.py).

Run as `python tests/end_to_end/cluster_attacker.py PLAN_JSON` by root: it imports everything it needs,
then drops to uid/gid 65534 with no groups and no capabilities, and only then attacks; so it
is that user for every connection it makes, even where that user could not read the Python
installation (an environment under /root, which `setpriv` alone would need). PLAN_JSON is
{"targets": [address, ...], "control": [address, ...], "markers": folder, "peek": [path, ...]}.
Every address is attacked in every way below, and the report (JSON on stdout) says, per
attempt, "answered: ..." (its request got a reply) or where it failed and with which
exception. An attempt whose code runs in the cluster writes MARKERS/NAME, which the attacker
itself cannot write: the test looks for those files, not only at this report. `control` are
addresses of a cluster without authentication, which the plain TCP attempts must break into:
proof that the attacker works as that user.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from functools import partial

import distributed.comm.tcp  # noqa: F401 - tcp:// and tls://, imported while the files are readable
from distributed import Client
from distributed.comm import connect
from distributed.core import send_recv
from distributed.protocol.pickle import dumps
from distributed.security import Security

NOBODY = 65534
PLAN = json.loads(sys.argv[1])


def mark(folder: str, name: str) -> int:
    """Runs inside the attacked cluster, if an attack gets that far."""
    with open(os.path.join(folder, name), "w") as f:
        f.write(f"uid {os.getuid()}\n")
    return os.getpid()


def drop_privileges() -> None:
    # The TLS machinery loads lazily: make a context now (credentials of our own, not the batch's).
    own = Security.temporary()
    own.get_connection_args("client")
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    assert os.getuid() == os.geteuid() == NOBODY and os.getgroups() == [], "still privileged"
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, "capabilities left"
    os.chdir("/")


WAYS = {
    "tcp": lambda: {},  # plain TCP, no credentials
    "tls-own-cert": lambda: Security.temporary().get_connection_args("client"),  # a certificate of its own
}


def _name(addr: str, way: str, how: str) -> str:
    return f"{addr.split('://')[-1].replace(':', '_')}-{way}-{how}"


async def raw(addr: str, way: str, op: str, timeout: float) -> str:
    """One Dask request on the wire: `run` (workers, nannies) or `broadcast` of a `run` (scheduler)."""
    scheme = "tcp" if way == "tcp" else "tls"
    fn = dumps(partial(mark, PLAN["markers"], _name(addr, way, op)))
    msg = {"op": "run", "function": fn, "wait": True}
    if op == "broadcast":
        msg = {"op": "broadcast", "msg": msg}
    try:
        comm = await connect(f"{scheme}://{addr.split('://')[-1]}", timeout=timeout, **WAYS[way]())
    except BaseException as exc:  # noqa: BLE001 - reported
        return f"connect: {type(exc).__name__}"
    try:
        reply = await asyncio.wait_for(send_recv(comm, reply=True, **msg), timeout)
        return f"answered: {str(reply)[:200]}"
    except BaseException as exc:  # noqa: BLE001
        return f"request: {type(exc).__name__}"
    finally:
        comm.abort()


async def client(addr: str, way: str, timeout: float) -> str:
    """A plain `distributed.Client`: connect, then submit a task."""
    scheme = "tcp" if way == "tcp" else "tls"
    security = Security.temporary() if way != "tcp" else Security()
    try:
        c = await Client(f"{scheme}://{addr.split('://')[-1]}", security=security, asynchronous=True,
                         timeout=timeout, set_as_default=False)
    except BaseException as exc:  # noqa: BLE001
        return f"connect: {type(exc).__name__}"
    try:
        fut = c.submit(mark, PLAN["markers"], _name(addr, way, "submit"), pure=False)
        return f"answered: {await asyncio.wait_for(fut, timeout)}"
    except BaseException as exc:  # noqa: BLE001
        return f"request: {type(exc).__name__}"
    finally:
        await c.close()


async def attack(addresses: list[str], timeout: float) -> dict:
    jobs = {}
    for addr in addresses:
        for way in WAYS:
            jobs[_name(addr, way, "run")] = raw(addr, way, "run", timeout)
            jobs[_name(addr, way, "broadcast")] = raw(addr, way, "broadcast", timeout)
            jobs[_name(addr, way, "submit")] = client(addr, way, timeout)
        # a Client over TLS that holds no credentials at all
        jobs[_name(addr, "tls-none", "submit")] = _no_credentials(addr, timeout)
    results = await asyncio.gather(*(_bounded(j, 5 * timeout) for j in jobs.values()))
    return dict(zip(jobs, results))


async def _bounded(job, seconds: float) -> str:
    try:
        return await asyncio.wait_for(job, seconds)
    except asyncio.TimeoutError:
        return "timed out"


async def _no_credentials(addr: str, timeout: float) -> str:
    try:
        c = await Client(f"tls://{addr.split('://')[-1]}", security=Security(), asynchronous=True, timeout=timeout,
                         set_as_default=False)
    except BaseException as exc:  # noqa: BLE001
        return f"connect: {type(exc).__name__}"
    await c.close()
    return "answered: connected"


def peek(paths: list[str]) -> dict:
    """Can this user list or read the batch's private files (scratch folder, keys)?"""
    out = {}
    for p in paths:
        try:
            out[p] = f"read: {os.listdir(p)[:5]}" if os.path.isdir(p) else f"read: {len(open(p, 'rb').read())} bytes"
        except OSError as exc:
            out[p] = type(exc).__name__
    return out


if __name__ == "__main__":
    drop_privileges()
    report = {"uid": os.getuid(), "peek": peek(PLAN["peek"]),
              "targets": asyncio.run(attack(PLAN["targets"], 3.0)),
              "control": asyncio.run(attack(PLAN["control"], 3.0))}
    print(json.dumps(report))
