"""How long the similarity report takes on 300 submissions, against merely reading them.

For 03_qkv and 06_transformer, writes 300 notebooks into a temporary folder, a cohort as a class
hands it in: a tenth copy the reference, a tenth copy another learner (a few copied pairs), and the
rest answer each part independently: for 03_qkv with one of three implementations written apart
(the reference and the two of tests/course/test_similarity.py), for 06_transformer with the reference and
one of the chapter's typical mistakes (tests/chapters/chKEY.py); every copy has its local names
renamed and comments added at random. Times reading them by `grade`'s folder rule (the baseline)
and the whole report (reading included), and prints both and their ratio, in wall-clock and CPU
time (the CPU time moves less with the machine's load).

    OMP_NUM_THREADS=1 python benchmarks/similarity_bench.py [--n 300]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "course")]

from autograder.core.assignments import get_assignment  # noqa: E402
from autograder.authoring.generate import read_master  # noqa: E402
from autograder.core.limits import DEFAULT  # noqa: E402
from autograder.course.similarity import parse_notebook, similarity_report  # noqa: E402
from autograder.course.submissions import find_submissions, read_claim  # noqa: E402

WORDS = ["tmp", "val", "res", "out", "acc", "buf", "mat", "vec", "aux", "item"]


def local_names(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})


def disguise(code: str, rng: random.Random) -> str:
    """Rename some local names and add comments, at random."""
    for name in local_names(code):
        if rng.random() < 0.5:
            code = re.sub(rf"\b{name}\b", f"{rng.choice(WORDS)}_{name}", code)
    lines = [line + ("  # " + rng.choice(WORDS) if rng.random() < 0.3 and line.strip() else "")
             for line in code.splitlines()]
    return "\n".join(lines)


def write_cohort(key: str, folder: Path, n: int, seed: int = 0) -> None:
    from chapters import tables

    rng = random.Random(seed)
    edits = [m.edits for m in tables()[key].MISTAKES.values() if m.edits] + [()]
    reference = read_master(get_assignment(key))
    template = json.loads(get_assignment(key).notebook.read_text())
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in reference.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    versions = {gid: [src] for gid, src in answers.items()}
    if key == "03_qkv":
        from test_similarity import LOGSUMEXP, THROUGH_TORCH

        for other in (LOGSUMEXP, THROUGH_TORCH):
            for gid, src in other.items():
                versions[gid].append(src)
    handed: list[dict] = []
    for i in range(n):
        luck = rng.random()
        if luck < 0.1:
            chosen = dict(answers)  # the reference, copied
        elif luck < 0.2 and handed:
            chosen = dict(rng.choice(handed))  # another learner's, copied
        else:
            chosen = {gid: rng.choice(srcs) for gid, srcs in versions.items()}
            for old, new in rng.choice(edits):
                chosen = {g: s.replace(old, new) for g, s in chosen.items()}
        handed.append(chosen)
        nb = json.loads(json.dumps(template))
        for cell in nb["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in chosen:
                cell["source"] = disguise(chosen[gid], rng)
        (folder / f"s{i:03d}.ipynb").write_text(json.dumps(nb))


def read_only(folder: Path, key: str) -> int:
    scan = find_submissions([str(folder)], key)
    count = 0
    for found in scan.found:
        got = read_claim(found.claim, DEFAULT.notebook_bytes)
        parse_notebook(got.data, str(found.claim.path))
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    for key in ("03_qkv", "06_transformer"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_cohort(key, folder, args.n)
            t0, c0 = time.perf_counter(), time.process_time()
            read_only(folder, key)
            t1, c1 = time.perf_counter(), time.process_time()
            report = similarity_report([str(folder)], key)
            t2, c2 = time.perf_counter(), time.process_time()
            print(f"{key}: {args.n} submissions; reading {t1 - t0:.2f} s, similarity report {t2 - t1:.2f} s "
                  f"({(t2 - t1) / (t1 - t0):.1f}x reading; CPU {c1 - c0:.2f} s and {c2 - c1:.2f} s); "
                  f"{report['compared']} compared, "
                  f"{len(report['identical'])} identical groups, {report['near_pairs_total']} near-duplicate pairs, "
                  f"{report['shared_pairs_total']} pairs sharing parts")


if __name__ == "__main__":
    main()
