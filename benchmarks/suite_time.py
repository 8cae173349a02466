"""Where the test suite's time goes: per test file, per expensive fixture, per book page.

Usage: OMP_NUM_THREADS=1 python benchmarks/suite_time.py [--load N] [--json FILE] [-- PYTEST ARGS]
       (default PYTEST ARGS: what `make test` passes, -n 2 --dist loadgroup --no-loadscope-reorder)
       python benchmarks/suite_time.py --report FILE [FILE ...]   # print saved runs (--json) again
       python benchmarks/suite_time.py --book                      # the built book's pages only

It runs pytest (the arguments after ``--``; by default the whole suite as ``make test`` runs
it, on two xdist workers) with this module as a plugin that records every test's setup, call and teardown
time and every fixture's own set-up time (pytest sets a fixture's dependencies up first, so a
fixture's time is its own: one sandboxed batch, one wheel, one venv, one kernel, one browser,
one Dask cluster). Then it prints, sorted by cost:

* the total per test file (setup + call + teardown, the number of tests, and the CPU seconds
  of the tests and of the processes they waited for: above the total, the file used both cores);
* the total per group (the tests a worker takes together, tests/conftest.py) and per worker;
* the fixtures whose set-up took over a second, with their scope and parameter;
* the CPU time of every process the run started, by kind (cold grading workers, warm
  templates, the pytest workers' own, kernels, Chromium, nbgrader's commands, ``python -m
  autograder`` commands...), sampled from /proc twice a second: the figures above count
  only a test's own process and the children it waited for;
* the slowest tests;
* the book's execution time per page, from the build's execution cache
  (``_build/.jupyter_cache``), when the book has been built.

``--load N`` starts N processes that only burn CPU beside the suite (a machine shared with
other work); the machine's load average is printed at the start and the end. Exit status:
pytest's own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What `make test` runs after building the book (keep the two in step).
MAKE_TEST_ARGS = ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "--durations=25"]


# --- the plugin: pytest loads this module with `-p suite_time` (in each xdist worker too) ------

_TESTS: dict[str, dict] = {}
_FIXTURES: list[dict] = []


def pytest_runtest_logreport(report):
    row = _TESTS.setdefault(report.nodeid, {"id": report.nodeid, "file": report.nodeid.split("::")[0],
                                            "group": _group(report.nodeid), "setup": 0.0, "call": 0.0,
                                            "teardown": 0.0, "outcome": "passed"})
    row[report.when] = round(report.duration, 3)
    if report.failed:
        row["outcome"] = "failed"
    elif report.skipped and row["outcome"] == "passed":
        row["outcome"] = "skipped"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, start, began = _cpu(), time.perf_counter(), time.time()
    yield
    row = _TESTS.get(item.nodeid)
    if row is not None:
        row.update(wall=round(time.perf_counter() - start, 3), cpu=round(_cpu() - cpu, 3), began=round(began, 3),
                   worker=os.environ.get("PYTEST_XDIST_WORKER", "main"))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    yield
    param = getattr(request, "param", None)
    _FIXTURES.append({"name": fixturedef.argname, "scope": fixturedef.scope,
                      "param": None if param is None else str(param)[:40],
                      "seconds": round(time.perf_counter() - start, 3), "first_test": request.node.nodeid})


def pytest_sessionfinish(session):
    folder = os.environ.get("SUITE_TIME_DIR")
    if folder:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder, f"{name}.json").write_text(json.dumps({"tests": list(_TESTS.values()), "fixtures": _FIXTURES}))


def _group(nodeid: str) -> str:
    """The xdist group of a test id (`...@GROUP` under --dist loadgroup), else its file."""
    tail = nodeid.rsplit("@", 1)
    if len(tail) == 2 and "]" not in tail[1] and "::" not in tail[1]:
        return tail[1]
    return nodeid.split("::")[0].rsplit("/", 1)[-1]


def _cpu() -> float:
    """CPU seconds of this process and of every child process it waited for."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, every core, from /proc/stat (jiffies)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0.0, 0.0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields) - idle, sum(fields))


# Kinds of process, by command line (the first pattern that matches): where the CPU time goes
# that the tests' own figures miss (a sandboxed worker, Chromium, a command nbgrader runs are not
# children that a test waits for).
PROCESS_KINDS = (
    ("this script, and its CPU burners (--load)", lambda c: "suite_time.py" in c),
    ("grading worker, cold (worker.py)", lambda c: "worker.py" in c and "--template" not in c),
    ("warm template and the workers it forks", lambda c: "worker.py" in c),
    ("nbgrader's alembic command", lambda c: "/alembic " in c),
    ("Jupyter kernel", lambda c: "ipykernel" in c),
    ("Chromium", lambda c: "chrom" in c.split(" ", 1)[0]),
    ("multiprocessing pool process (grade --jobs, seeds)", lambda c: "multiprocessing" in c),
    ("pip (wheels, venvs)", lambda c: " -m pip " in c or "pyproject_hooks" in c),
    ("pytest and its workers (tests and in-process grading)", lambda c: " -m pytest" in c
     or "exec(eval(sys.stdin.readline()))" in c),
)


class ProcessSampler:
    """Every process's CPU time, read from /proc every `interval` seconds in a thread, summed per
    kind of process (`PROCESS_KINDS`; ``python -m autograder CMD`` by its command). A process that
    lives less than one interval may be missed, so the sum is a lower bound."""

    def __init__(self, interval: float = 0.5):
        import threading

        self.interval, self.seen, self.base = interval, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._hz = os.sysconf("SC_CLK_TCK")

    def _scan(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                key, ticks = (name, fields[19]), int(fields[11]) + int(fields[12])
                if key not in self.seen:
                    cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.seen[key] = [ticks, cmd[:400]]
                else:
                    self.seen[key][0] = ticks
            except (OSError, IndexError, ValueError):
                continue

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._scan()

    def start(self) -> None:
        self._scan()
        self.base = {k: v[0] for k, v in self.seen.items()}  # what ran before the suite
        self._thread.start()

    def stop(self) -> list[list]:
        """[kind, CPU seconds, processes], costliest first."""
        self._stop.set()
        self._thread.join()
        self._scan()
        kinds: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for key, (ticks, cmd) in self.seen.items():
            cpu = (ticks - self.base.get(key, 0)) / self._hz
            if cpu <= 0:
                continue
            words = cmd.split()
            if "worker.py" not in cmd and "-m" in words and "autograder" in words[:-1]:
                kind = f"python -m autograder {words[words.index('autograder') + 1]}"
            else:
                kind = next((k for k, match in PROCESS_KINDS if match(cmd)), "other")
            kinds[kind][0] += cpu
            kinds[kind][1] += 1
        return sorted(([k, round(c, 1), n] for k, (c, n) in kinds.items()), key=lambda r: -r[1])


def book_pages() -> list[tuple[str, float]]:
    """(page, seconds of execution) from the book's execution cache, slowest first (read as
    `make book` reads it to order the pages: book/_ext/build_book.py)."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from build_book import recorded_seconds
    finally:
        sys.path.pop(0)
    seconds = recorded_seconds(ROOT / "_build")
    return sorted(((Path(name).name + ".md", took) for name, took in seconds.items()), key=lambda r: -r[1])


def summarise(run: dict) -> str:
    lines = [f"suite: {run['wall']:.0f} s wall, {len(run['tests'])} tests, exit {run['exit']}, "
             f"{run['cpus']} CPUs, {run['load']} burning processes, load average {run['load_before']:.2f} "
             f"before, {run['load_after']:.2f} after"
             + (f"; the machine's CPUs were busy {run['machine_busy']:.0%} of the time" if run.get("machine_busy") else "")]
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0, 0.0])
    for t in run["tests"]:
        f = per_file[t["file"]]
        f[0] += t["setup"]
        f[1] += t["call"]
        f[2] += t["teardown"]
        f[3] += 1
        f[4] += t.get("cpu", 0.0)
    lines += ["", "per test file (s; cpu: CPU seconds of the tests and the processes they waited for)",
              f"  {'file':<38} {'total':>7} {'setup':>7} {'call':>7} {'teardown':>8} {'tests':>6} {'cpu':>7}"]
    for name, (s, c, d, n, cpu) in sorted(per_file.items(), key=lambda kv: -sum(kv[1][:3])):
        lines.append(f"  {name:<38} {s + c + d:7.1f} {s:7.1f} {c:7.1f} {d:8.1f} {n:6d} {cpu:7.1f}")
    total = sum(sum(v[:3]) for v in per_file.values())
    lines.append(f"  {'all':<38} {total:7.1f} {'':7} {'':7} {'':8} {len(run['tests']):6d} "
                 f"{sum(v[4] for v in per_file.values()):7.1f}")
    big = sorted((f for f in run["fixtures"] if f["seconds"] >= 1.0), key=lambda f: -f["seconds"])
    lines += ["", "fixtures over 1 s (own set-up, s)"]
    for f in big:
        param = f"[{f['param']}]" if f["param"] is not None else ""
        lines.append(f"  {f['seconds']:7.1f}  {f['name'] + param:<40} {f['scope']:<8} first for {f['first_test']}")
    per_group: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0, ""])
    for t in run["tests"]:
        g = per_group[t.get("group", t["file"])]
        g[0] += t["setup"] + t["call"] + t["teardown"]
        g[1] += 1
        g[2] += t.get("cpu", 0.0)
        g[3] = t.get("worker", "")
    lines += ["", "per group (the unit a worker takes; s)", f"  {'group':<38} {'total':>7} {'tests':>6} {'cpu':>7}  worker"]
    for name, (tot, n, cpu, worker) in sorted(per_group.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {name:<38} {tot:7.1f} {n:6d} {cpu:7.1f}  {worker}")
    per_worker: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for t in run["tests"]:
        w = per_worker[t.get("worker", "main")]
        w[0] += t["setup"] + t["call"] + t["teardown"]
        w[1] += 1
    lines += ["", "per worker (s busy in tests)"]
    lines += [f"  {name:<8} {busy:7.1f} s, {n} tests" for name, (busy, n) in sorted(per_worker.items())]
    if run.get("processes"):
        sampled = sum(c for _, c, _ in run["processes"])
        lines += ["", f"CPU by kind of process (s, sampled from /proc: {sampled:.0f} s in all, "
                      f"{run.get('machine_cpu', 0):.0f} s of the machine's)"]
        lines += [f"  {cpu:7.1f} {n:5d}  {kind}" for kind, cpu, n in run["processes"]]
    slow = sorted(run["tests"], key=lambda t: -(t["setup"] + t["call"] + t["teardown"]))[:25]
    lines += ["", "slowest tests (s, setup+call+teardown)"]
    for t in slow:
        lines.append(f"  {t['setup'] + t['call'] + t['teardown']:7.1f}  {t['id']}")
    failed = [t["id"] for t in run["tests"] if t["outcome"] == "failed"]
    if failed:
        lines += ["", f"failed ({len(failed)})"] + [f"  {t}" for t in failed]
    if run.get("book"):
        total = sum(s for _, s in run["book"])
        lines += ["", f"book pages executed (s, from the execution cache; {total:.0f} s in all)"]
        lines += [f"  {s:7.1f}  {page}" for page, s in run["book"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--load", type=int, default=0, help="extra processes that only burn CPU")
    parser.add_argument("--json", metavar="FILE", help="also save the run as JSON")
    parser.add_argument("--report", nargs="+", metavar="FILE", help="print saved runs; run nothing")
    parser.add_argument("--book", action="store_true", help="print the book's page times only")
    args = parser.parse_args(argv)

    if args.report:
        for path in args.report:
            print(f"== {path}")
            print(summarise(json.loads(Path(path).read_text())))
        return 0
    if args.book:
        pages = book_pages()
        print("\n".join(f"{s:7.1f}  {p}" for p, s in pages) or "no executed pages: build the book first")
        return 0

    burners = []
    if args.load:  # the same load as the claims' (benchmarks/claims.py)
        from claims import burn

        stop_at = time.time() + 4 * 3600
        burners = [multiprocessing.Process(target=burn, args=(stop_at,), daemon=True) for _ in range(args.load)]
        for b in burners:
            b.start()
    load_before = os.getloadavg()[0]
    cpu_before = _machine_cpu()
    sampler = ProcessSampler()
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="suite-time-") as folder:
        env = dict(os.environ, SUITE_TIME_DIR=folder,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")])))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        start = time.perf_counter()
        try:
            code = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_time", *(pytest_args or MAKE_TEST_ARGS)], cwd=ROOT,
                                   env=env)
        finally:
            for b in burners:
                b.terminate()
        wall = time.perf_counter() - start
        processes = sampler.stop()
        busy, total = (a - b for a, b in zip(_machine_cpu(), cpu_before))
        parts = {p.stem: json.loads(p.read_text()) for p in Path(folder).glob("*.json")}
    workers = {k: v for k, v in parts.items() if k != "main"} or parts
    tests = [t for part in workers.values() for t in part["tests"]]
    fixtures = [f for part in workers.values() for f in part["fixtures"]]
    run = {"wall": wall, "machine_busy": round(busy / total, 3) if total else None, "exit": int(code), "cpus": os.cpu_count(), "load": args.load,
           "load_before": load_before, "load_after": os.getloadavg()[0], "argv": pytest_args,
           "processes": processes, "machine_cpu": round(busy / os.sysconf("SC_CLK_TCK"), 1),
           "tests": tests, "fixtures": fixtures, "book": book_pages()}
    if args.json:
        Path(args.json).write_text(json.dumps(run, indent=1))
    print()
    print(summarise(run))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
