"""Where one exercise's check spends its time: each hidden check's wall and trusted CPU seconds.

Usage: OMP_NUM_THREADS=1 python benchmarks/check_times.py KEY [--seeds 8] [--match TEXT] [--root DIR]

Grades the reference-completed notebook of KEY (the master with every answer filled in, as the
test suite builds it) in this process, unsandboxed, under seeds 1..N, and prints for each check
(or those whose name contains TEXT) the mean and the largest of its wall time and of the CPU time
of this process (the grader's own work: the worker running the learner's code is another
process, whose time shows in the wall time only). `--root` grades with another checkout's
autograder and hidden tests (e.g. a `git worktree` of an earlier commit), to compare two
versions on the same machine in one sitting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("key")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--match", default="")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    root = Path(args.root).resolve()
    sys.path[:0] = [str(root / "tests"), str(root)]
    os.chdir(root)
    import conftest
    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader

    with tempfile.TemporaryDirectory() as folder:
        notebook = conftest.write(conftest.reference_notebook(args.key), Path(folder) / f"{args.key}.ipynb")
        grader = Grader(get_assignment(args.key))
        call = grader.call_check
        times: dict[str, list[tuple[float, float]]] = {}

        def timed(check, sub, seed, *ready):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return call(check, sub, seed, *ready)
            finally:
                if args.match in check.name:
                    times.setdefault(check.name, []).append((time.perf_counter() - wall, time.process_time() - cpu))

        grader.call_check = timed
        scores = {grader.grade(str(notebook), seed=seed).score for seed in range(1, args.seeds + 1)}
    print(f"{args.key} at {root}: scores {sorted(scores)} under seeds 1-{args.seeds}")
    print(f"{'check':60} {'wall mean':>9} {'max':>6} {'cpu mean':>9} {'max':>6}")
    for name, pairs in sorted(times.items(), key=lambda kv: -statistics.mean(w for w, _ in kv[1])):
        walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
        print(f"{name:60} {statistics.mean(walls):9.3f} {max(walls):6.3f} {statistics.mean(cpus):9.3f} {max(cpus):6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
