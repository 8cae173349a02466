"""What a learner who fills /tmp costs the warm start, and who pays for it.

Usage: OMP_NUM_THREADS=1 python benchmarks/warm_cleanup.py [--seconds 50] [--assignment 03_qkv]

Needs root, bubblewrap and a memory cgroup (the warm start's own requirements). It grades, with
one warm `Grader`: the reference notebook (an honest learner), then a hostile one whose top level
spends SECONDS (less than the load limit) making as many entries as it can in /tmp and /dev/shm
(empty files with 200-character names, 1000 to a folder, after filling each tmpfs with data),
then the reference again. After each worker ends the trusted side replaces /tmp and /dev/shm
with new tmpfs mounts (`Template.renew`), inside the ending learner's grading time. It prints
the entries made, each renewal's seconds, each learner's grading seconds and score, and how
many templates were started: the hostile learner's renewal is in its own seconds, the next
learner's seconds are those of an honest one, and no template is replaced.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

FILL = '''
import os, time
def _fill(seconds):
    end = time.monotonic() + seconds
    n = 0
    for top in ("/tmp", "/dev/shm"):
        for i in range(5):
            try:
                with open(os.path.join(top, f"data{i}"), "wb") as f:
                    f.write(b"x" * (16 << 20))
            except OSError:
                break
    folder, made = None, 0
    try:
        while time.monotonic() < end:
            if made % 1000 == 0:
                folder = os.path.join(("/tmp", "/dev/shm")[(made // 1000) % 2], f"d{made // 1000}")
                os.mkdir(folder)
            os.close(os.open(os.path.join(folder, f"{made:0200d}"), os.O_CREAT | os.O_WRONLY, 0o600))
            made += 1
    except OSError:
        pass
    return made
ENTRIES = _fill(SECONDS)
def entries():
    return ENTRIES
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=50.0)
    ap.add_argument("--assignment", default="03_qkv")
    args = ap.parse_args()

    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader
    from autograder.isolation.errors import GradingError
    from autograder.isolation.remote import Learner
    from autograder.isolation.runner import Submission
    from autograder.isolation.sandbox import detect
    from conftest import add_cell, reference_notebook, write

    sandbox = detect()
    key = args.assignment
    with tempfile.TemporaryDirectory() as tmp, Grader(get_assignment(key), sandbox=sandbox, warm=True) as g:
        if g.template is None:
            print(f"no warm start here: {g.warm_problem}")
            return 2
        honest = write(reference_notebook(key), Path(tmp) / "honest.ipynb")
        fill = FILL.replace("SECONDS", repr(args.seconds))
        hostile = write(add_cell(reference_notebook(key), fill), Path(tmp) / "hostile.ipynb")
        rows = []
        for name in ("honest", "honest", "hostile", "next", "next"):
            before = len(g.template.renew_seconds)
            if name == "hostile":  # as `grade` runs it, to read how many entries it made
                t0 = time.monotonic()
                with Submission([{"label": "fill", "source": fill}], sandbox=sandbox, template=g.template) as sub:
                    try:
                        made = Learner(sub).entries()
                    except GradingError as exc:  # the memory limit's kill, most likely: its entries stay
                        made = f"? ({type(exc).__name__})"
                score, max_score, seconds = None, None, time.monotonic() - t0
            else:
                r = g.grade(honest, seed=1)
                score, max_score, seconds = r.score, r.max_score, r.seconds
            rows.append((name, score, max_score, seconds, g.template.renew_seconds[before:]))
        for name, score, max_score, seconds, renewals in rows:
            what = f"score {score:g}/{max_score:g}" if score is not None else f"{made} entries"
            print(f"{name:8s} {what:22s} graded in {seconds:6.2f} s; clean-ups while it was graded: "
                  f"{', '.join(f'{s:.3f} s' for s in renewals) or '-'}")
        honest_renewals = [s for row in rows if row[0] != "hostile" for s in row[4]]
        print(f"clean-up after an honest worker: median {statistics.median(honest_renewals):.3f} s, "
              f"worst {max(honest_renewals):.3f} s; after the hostile one: {max(rows[2][4]):.3f} s")
        print(f"templates started: {g.template.starts} (1 expected: no replacement)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
