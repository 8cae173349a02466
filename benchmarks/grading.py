"""Grading throughput, side by side in one run: the import-torch floor, nbgrader autograde, and
our `grade` with one job and with every CPU (and with --warm, where the grader has a warm start).

Usage: OMP_NUM_THREADS=1 python benchmarks/grading.py [--n 6] [--assignment 03_qkv]
       [--mistake NAME] [--jobs N] [--skip-nbgrader] [--json]

It builds N copies of the exercise's reference notebook and N of a typical mistake (the first
of the chapter's harness table, tests/chapters/chKEY.py, or --mistake), then times:

* the floor: 2N fresh `python -c "import torch"`, one after the other: what any grader that
  starts a fresh process per notebook pays at least;
* `nbgrader autograde` of the same notebooks, set up as an nbgrader course in a temporary
  folder (the reference as source, `nbgrader generate_assignment`, the copies as submitted/);
  it runs the notebooks' visible tests in a kernel, without a sandbox;
* our `python -m autograder grade` (hidden tests, sandboxed) with `--jobs 1` and with every
  CPU, each into a fresh output folder, start-up included.

It prints seconds per notebook, notebooks per second and the ratios against the targets of
the course's grading at scale: ours with every CPU at least 3x nbgrader's throughput; ours
with one job at or below the floor per notebook; scaling at least 0.8 of linear. Machines
shared with other work give noisy times: compare ratios, and rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the harness's notebook makers (conftest) and mistake tables

TARGET_VS_NBGRADER = 3.0   # ours at every CPU / nbgrader autograde, throughput
TARGET_VS_FLOOR = 1.0      # ours at one job / the import-torch floor, seconds per notebook
TARGET_SCALING = 0.8       # (throughput at C jobs / throughput at 1 job) / C


def build(key: str, n: int, mistake_name: str | None, folder: Path) -> tuple[str, float]:
    """N correct and N wrong notebooks in `folder` (correct_i.ipynb, wrong_i.ipynb); the mistake's name
    and the score it should get."""
    import nbformat
    from chapters import tables
    from conftest import mistake, reference_notebook

    table = tables()[key]
    name = mistake_name or next(iter(table.MISTAKES))
    m = table.MISTAKES[name]
    make = m.make or mistake(key, *m.edits)
    folder.mkdir(parents=True, exist_ok=True)
    correct, wrong = reference_notebook(key), make()
    for i in range(n):
        nbformat.write(correct, str(folder / f"correct_{i}.ipynb"))
        nbformat.write(wrong, str(folder / f"wrong_{i}.ipynb"))
    return name, float(m.score)


def env() -> dict:
    bindir = str(Path(sys.executable).parent)
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PATH=bindir + os.pathsep + os.environ["PATH"])


def timed(cmd: list[str], cwd: Path, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, proc


def floor(count: int) -> float:
    total = 0.0
    for _ in range(count):
        total += timed([sys.executable, "-c", "import torch"], ROOT)[0]
    return total


def nbgrader(key: str, subs: Path, course: Path) -> float:
    """Seconds of `nbgrader autograde` over the notebooks of `subs`, in a fresh course folder."""
    import nbformat
    from conftest import reference_notebook

    source = course / "source" / key
    source.mkdir(parents=True)
    nbformat.write(reference_notebook(key), str(source / f"{key}.ipynb"))
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.root = %r\nc.ExecutePreprocessor.timeout = 300\n" % str(course))
    exe = str(Path(sys.executable).parent / "nbgrader")
    timed([exe, "generate_assignment", key, "--force"], course)
    for nb in sorted(subs.glob("*.ipynb")):
        dest = course / "submitted" / nb.stem / key
        dest.mkdir(parents=True)
        shutil.copy(nb, dest / f"{key}.ipynb")
    seconds, _ = timed([exe, "autograde", key, "--force"], course)
    return seconds


def ours(key: str, subs: Path, out: Path, jobs: int, warm: bool, expected: dict) -> float:
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--assignment", key, "--out", str(out),
           "--jobs", str(jobs), "--json"] + (["--warm"] if warm else [])
    seconds, proc = timed(cmd, ROOT)
    scores = {s["student"]: s["score"] for s in json.loads(proc.stdout)["submissions"]}
    wrong = {s: (scores.get(s), want) for s, want in expected.items() if scores.get(s) != want}
    if wrong:
        raise SystemExit(f"grade --jobs {jobs}{' --warm' if warm else ''} gave unexpected scores: {wrong}")
    return seconds


def main(argv=None) -> int:
    from autograder.batch.cohort import default_jobs
    from autograder.core.assignments import get_assignment

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=6, help="copies of each notebook (2N notebooks; default 6)")
    p.add_argument("--assignment", default="03_qkv")
    p.add_argument("--mistake", help="the harness table's mistake to copy (default: its first)")
    p.add_argument("--jobs", type=int, default=default_jobs(), help="'every CPU' (default: the CPUs here)")
    p.add_argument("--skip-nbgrader", action="store_true")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = p.parse_args(argv)
    key, count, cpus = args.assignment, 2 * args.n, args.jobs
    from autograder.core.notebook import read_notebook, reference_cells
    from autograder.grading.grader import part_points

    max_score = sum(part_points(reference_cells(read_notebook(get_assignment(key).notebook))).values())
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        tmp = Path(tmp)
        name, wrong_score = build(key, args.n, args.mistake, tmp / "subs")
        expected = {f"correct_{i}": max_score for i in range(args.n)} | {f"wrong_{i}": wrong_score for i in range(args.n)}
        rows = {"import torch (floor)": floor(count)}
        if not args.skip_nbgrader:
            rows["nbgrader autograde"] = nbgrader(key, tmp / "subs", tmp / "course")
        modes = (False, True)
        for warm in modes:
            for jobs in (1, cpus):
                label = f"ours, {jobs} job{'s' if jobs > 1 else ''}" + (", warm" if warm else "")
                rows[label] = ours(key, tmp / "subs", tmp / f"out-{jobs}-{warm}", jobs, warm, expected)
    import torch

    per = {k: v / count for k, v in rows.items()}
    report = {"assignment": key, "notebooks": count, "mistake": name, "cpus": cpus, "torch": torch.__version__,
              "seconds": rows, "seconds_per_notebook": per, "notebooks_per_second": {k: count / v for k, v in rows.items()},
              "targets": {}}
    for warm in modes:
        tag = ", warm" if warm else ""
        one, many = rows[f"ours, 1 job{tag}"], rows[f"ours, {cpus} job{'s' if cpus > 1 else ''}{tag}"]
        t = {"vs_floor": per[f"ours, 1 job{tag}"] / per["import torch (floor)"],
             "scaling": (one / many) / cpus if cpus > 1 else 1.0}
        if "nbgrader autograde" in rows:
            t["vs_nbgrader"] = rows["nbgrader autograde"] / many
        report["targets"]["warm" if warm else "cold"] = t
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"grading benchmark: {key}, {count} notebooks ({args.n} correct, {args.n} with the mistake {name}), "
          f"{cpus} CPUs, torch {torch.__version__}")
    print(f"{'':28s}{'total s':>9s}{'s / notebook':>14s}{'notebooks / s':>15s}")
    for k, v in rows.items():
        print(f"{k:28s}{v:9.1f}{v / count:14.2f}{count / v:15.2f}")
    for mode, t in report["targets"].items():
        print(f"targets ({mode} start):")
        if "vs_nbgrader" in t:
            ok = "met" if t["vs_nbgrader"] >= TARGET_VS_NBGRADER else "MISSED"
            print(f"  ours at {cpus} jobs vs nbgrader autograde: {t['vs_nbgrader']:.2f}x the throughput "
                  f"(target >= {TARGET_VS_NBGRADER:g}x): {ok}")
        ok = "met" if t["vs_floor"] <= TARGET_VS_FLOOR else "MISSED"
        print(f"  ours at 1 job vs the import-torch floor: {t['vs_floor']:.2f}x the floor per notebook "
              f"(target <= {TARGET_VS_FLOOR:g}x): {ok}")
        ok = "met" if t["scaling"] >= TARGET_SCALING else "MISSED"
        print(f"  scaling from 1 to {cpus} jobs: {t['scaling']:.2f} of linear (target >= {TARGET_SCALING:g}): {ok}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
