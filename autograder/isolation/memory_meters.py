"""Reading a worker's memory from the kernel, from the trusted side.

Nothing here trusts the worker: every number is read by the grader's own process from the
kernel, in the worker's memory cgroup or in /proc.

* `cgroup_usage` and `cgroup_meter`: the worker's memory cgroup (see `autograder.isolation.cgroups`), all
  its processes together, tmpfs included. A meter resets the cgroup's high-water mark when it
  starts: v1's max_usage_in_bytes, and v2's memory.peak for our own open descriptor (Linux 6.12
  and later). Where v2 refuses that reset, only the cgroup's lifetime peak can be read: it is
  reported whole (at least the call's peak, and nothing the learner can lower).
* `proc_status`, `process_meter` and `sandboxed_worker_pid`: one process, where there is no
  cgroup: its VmRSS, and its VmHWM reset through /proc/PID/clear_refs when a meter starts (the
  processes it starts are not counted there). Sandboxed, the process to measure is the worker's
  Python below bubblewrap, found by its place in the process tree.

A meter is a function that starts measuring and returns `stop`; `stop()` gives (peak, held,
source): the most memory used since the start and the memory held at the start, both in bytes
above a baseline the caller took before any learner code ran (see
`autograder.isolation.runner.Submission.memory_meter`).
"""

from __future__ import annotations

import os


def read_int(path: str) -> int:
    """The first number in a kernel file (a cgroup counter)."""
    with open(path, "rb") as f:
        return int(f.read(64).split()[0])


def cgroup_usage(path: str) -> int:
    """A memory cgroup's current usage in bytes (v2's memory.current, v1's memory.usage_in_bytes)."""
    current = os.path.join(path, "memory.current")
    return read_int(current if os.path.exists(current) else os.path.join(path, "memory.usage_in_bytes"))


def proc_status(pid: int, field: str) -> int:
    """A size field (in kB there) of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f.read(1 << 16).splitlines():
            if line.startswith(field.encode() + b":"):
                return int(line.split()[1]) * 1024
    raise ValueError(field)


def sandboxed_worker_pid(root: int, proc: str = "/proc") -> int | None:
    """The host pid of a sandboxed worker's Python process: the one process below `root` (the
    sandbox's first process: bubblewrap, then its init in the worker's PID namespace) that has
    no child. Looked up before the learner's code is loaded, when no other process is there;
    None unless there is exactly one."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                data = f.read(4096)
            ppid = int(data[data.rindex(b")") + 2:].split()[1])  # the name in parentheses may hold anything
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    leaves, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        kids = children.get(pid, [])
        if not kids and pid != root:
            leaves.append(pid)
        todo.extend(kids)
    return leaves[0] if len(leaves) == 1 else None


def cgroup_meter(path: str, base: int):
    """Start measuring the memory cgroup at `path`; `stop()` returns (peak, held, "cgroup"), in
    bytes above `base`, or (None, None, None) where it cannot be read. See the module's docstring
    for which peak each cgroup version gives."""
    def read(name: str) -> int:
        return read_int(os.path.join(path, name))

    def above(n: int) -> int:
        return max(n - base, 0)

    failed = (None, None, None)
    peak_file = os.path.join(path, "memory.peak")
    if os.path.exists(peak_file):  # cgroup v2
        fd = -1
        try:
            fd = os.open(peak_file, os.O_RDWR | os.O_CLOEXEC)
            os.write(fd, b"reset\n")
        except OSError:
            if fd >= 0:
                os.close(fd)
            fd = -1
        try:
            start = read("memory.current")
        except (OSError, ValueError, IndexError):
            if fd >= 0:
                os.close(fd)
            raise
        if fd >= 0:
            def stop():
                try:
                    return above(int(os.pread(fd, 64, 0).split()[0])), above(start), "cgroup"
                except (OSError, ValueError, IndexError):
                    return failed
                finally:
                    os.close(fd)
            return stop

        def stop_lifetime():
            try:
                return above(read("memory.peak")), above(start), "cgroup"
            except (OSError, ValueError, IndexError):
                return failed
        return stop_lifetime
    # cgroup v1: the trusted side may reset the high-water mark to the current usage
    with open(os.path.join(path, "memory.max_usage_in_bytes"), "w") as f:
        f.write("0")
    start = read("memory.usage_in_bytes")

    def stop_v1():
        try:
            return above(read("memory.max_usage_in_bytes")), above(start), "cgroup"
        except (OSError, ValueError, IndexError):
            return failed
    return stop_v1


def process_meter(pid: int, base: int):
    """Start measuring process `pid`; `stop()` returns (peak, held, "process"), its VmHWM (reset
    now) and its resident set now, in bytes above `base`, or (None, None, None)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # the peak resident set becomes the current one
    start = proc_status(pid, "VmRSS")

    def stop():
        try:
            return max(proc_status(pid, "VmHWM") - base, 0), max(start - base, 0), "process"
        except (OSError, ValueError, IndexError):
            return None, None, None
    return stop
