"""How long a learner waits for `python -m autograder check`, against starting Python with torch.

Usage: OMP_NUM_THREADS=1 python benchmarks/check_speed.py [--n 5] [--assignment KEY ...]
       [--no-sandbox] [--json]

For each published exercise it writes the reference-completed notebook (the master with every
answer filled in, as the test suite builds it) to a temporary folder, then runs, N times and
interleaved so that a busy machine slows all of them alike:

* ``python -c "import torch"``: the floor, what any check that uses torch pays at least;
* ``python -m autograder check NOTEBOOK``: a fresh process, as a learner runs it (no sandbox);
* ``python -m autograder check --sandbox NOTEBOOK``: the same checks under bubblewrap;
* ``check()`` from a cell (`autograder.learner.in_notebook`), timed in this process as in a kernel that
  has run the notebook's code cells top to bottom (their sources are its input history): what a
  learner waits for after running the check's cell.

Every check must give full marks (a check that fails early would look fast). It prints the
median seconds of each and the ratios against the floor; the targets are check <= 2x and
check --sandbox <= 2.5x for every exercise. Timings on a shared machine are noisy: the
medians of interleaved runs are the numbers to compare, and a rerun on a quiet machine the
way to confirm them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the suite's notebook maker (conftest.reference_notebook)

TARGET_CHECK = 2.0     # check / import torch
TARGET_SANDBOX = 2.5   # check --sandbox / import torch


def build(keys: list[str], folder: Path) -> dict[str, Path]:
    from conftest import reference_notebook, write

    return {key: write(reference_notebook(key), folder / f"{key}.ipynb") for key in keys}


def timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, proc


def run_check(notebook: Path, env: dict, sandbox: bool) -> float:
    argv = [sys.executable, "-m", "autograder", "check", "--json", str(notebook)]
    if sandbox:
        argv.insert(4, "--sandbox")
    seconds, proc = timed(argv, env)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {}
    if proc.returncode != 0 or result.get("score") != result.get("max_score") or not result.get("max_score"):
        raise SystemExit(f"{' '.join(argv[2:])} did not give full marks (exit {proc.returncode}):\n"
                         f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    if result.get("sandboxed") is not sandbox:
        raise SystemExit(f"{' '.join(argv[2:])}: sandboxed is {result.get('sandboxed')!r}")
    return seconds


def run_in_cell(notebook: Path) -> float:
    """check() from a cell, in this process (the kernel), on the history of a top-to-bottom run."""
    from autograder.learner.in_notebook import grade_plan, plan_check

    cells = [c for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    entries = [(n, "".join(c["source"])) for n, c in enumerate(cells, start=1)]
    start = time.perf_counter()
    reply = grade_plan(plan_check(entries), seed=1)
    seconds = time.perf_counter() - start
    result = reply["result"]
    if result["score"] != result["max_score"] or not result["max_score"]:
        raise SystemExit(f"check() in a cell did not give {notebook.name} full marks: {reply['text'][-1500:]}")
    return seconds


def sandbox_problem() -> str:
    """Why `check --sandbox` cannot run here ('' when it can)."""
    from autograder.isolation.sandbox import SandboxUnavailable, detect

    try:
        detect()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def main() -> int:
    from autograder.core.assignments import all_assignments

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5, help="runs of each command per exercise (default 5)")
    parser.add_argument("--assignment", nargs="*", help="chapter keys (default: every published exercise)")
    parser.add_argument("--no-sandbox", action="store_true", help="skip `check --sandbox`")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args()

    keys = args.assignment or [a.key for a in all_assignments()]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    use_sandbox = not args.no_sandbox
    if use_sandbox and (problem := sandbox_problem()):
        print(f"no sandbox here, `check --sandbox` is not timed: {problem}", file=sys.stderr)
        use_sandbox = False
    floor_argv = [sys.executable, "-c", "import torch"]
    times: dict[str, dict[str, list[float]]] = {k: {"torch": [], "check": [], "sandbox": [], "cell": []} for k in keys}
    with tempfile.TemporaryDirectory(prefix="check-speed-") as tmp:
        notebooks = build(keys, Path(tmp))
        for i in range(args.n):
            for key in keys:
                t = times[key]
                t["torch"].append(timed(floor_argv, env)[0])
                t["check"].append(run_check(notebooks[key], env, sandbox=False))
                t["cell"].append(run_in_cell(notebooks[key]))
                if use_sandbox:
                    t["sandbox"].append(run_check(notebooks[key], env, sandbox=True))
            print(f"round {i + 1}/{args.n} done", file=sys.stderr, flush=True)

    rows = []
    for key in keys:
        t = times[key]
        floor = statistics.median(t["torch"])
        check = statistics.median(t["check"])
        sandbox = statistics.median(t["sandbox"]) if t["sandbox"] else None
        cell = statistics.median(t["cell"])
        rows.append({"assignment": key, "import_torch_s": round(floor, 2), "check_s": round(check, 2),
                     "check_ratio": round(check / floor, 2),
                     "sandbox_s": None if sandbox is None else round(sandbox, 2),
                     "sandbox_ratio": None if sandbox is None else round(sandbox / floor, 2),
                     "in_cell_s": round(cell, 2), "in_cell_ratio": round(cell / floor, 2)})
    ok = all(r["check_ratio"] <= TARGET_CHECK and (r["sandbox_ratio"] is None or r["sandbox_ratio"] <= TARGET_SANDBOX)
             for r in rows)
    if args.json:
        print(json.dumps({"n": args.n, "rows": rows, "targets_met": ok}, indent=2))
        return 0
    print(f"medians of {args.n} interleaved runs; targets: check <= {TARGET_CHECK:g}x, "
          f"check --sandbox <= {TARGET_SANDBOX:g}x the import-torch time\n")
    print("| exercise | import torch s | check s | ratio | check --sandbox s | ratio | check() in a cell s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sb = ("n/a", "n/a") if r["sandbox_s"] is None else (f"{r['sandbox_s']:.2f}", f"{r['sandbox_ratio']:.2f}x")
        print(f"| {r['assignment']} | {r['import_torch_s']:.2f} | {r['check_s']:.2f} | {r['check_ratio']:.2f}x "
              f"| {sb[0]} | {sb[1]} | {r['in_cell_s']:.2f} | {r['in_cell_ratio']:.2f}x |")
    print(f"\nevery exercise within the targets: {'yes' if ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
