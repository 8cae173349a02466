"""Grade every exercise's reference, untouched notebook and typical mistakes on a GPU machine,
and check that each gets the score and fails the checks it gets on a CPU.

On a machine with CUDA the hidden checks that take `devices` run on the GPU as well as on
the CPU, so this is how we know a learner's correct notebook scores the same there.

Two steps, because a GPU machine may lack the book's stack (myst-nb, nbgrader):

    python benchmarks/cuda_check.py prepare DIR        # here: the notebooks and what each must get
    python benchmarks/cuda_check.py run DIR [--sandbox] [--json FILE]   # on the GPU machine

`prepare` writes DIR/KEY/NAME.ipynb for every chapter's harness batch (tests/chapters/) and
DIR/manifest.json with each one's expected score and failed checks. `run` grades them all
(chapters in parallel processes, each notebook in its own worker, seed fixed), prints a
table and exits 1 on any disagreement. `--sandbox` grades each chapter's reference in the
bubblewrap sandbox too, with the GPU passed through.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261129


def prepare(out: Path) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import nbformat
    from conftest import chapter_batch
    from chapters import tables

    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader

    manifest = {}
    for key, table in tables().items():
        grader = Grader(get_assignment(key))
        expected = {"ref": (grader.max_score, set()), "stub": (0.0, None)}
        expected |= {n: (float(m.score), m.failed) for n, m in table.MISTAKES.items()}
        folder = out / key
        folder.mkdir(parents=True, exist_ok=True)
        entries = {}
        for name, make in chapter_batch(key).items():
            nbformat.write(make(), str(folder / f"{name}.ipynb"))
            score, failed = expected[name]
            entries[name] = {"score": score, "failed": None if failed is None else sorted(failed)}
        manifest[key] = entries
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {sum(len(v) for v in manifest.values())} notebooks of {len(manifest)} chapters to {out}")


def _grade_chapter(args) -> dict:
    key, folder, entries, sandboxed = args
    sys.path.insert(0, str(ROOT))
    import torch

    from autograder.core.assignments import get_assignment
    from autograder.grading.grader import Grader

    sandbox = None
    info = {"key": key, "cuda": torch.cuda.is_available(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "sandboxed": sandboxed, "rows": []}
    if sandboxed:
        from autograder.isolation.sandbox import SandboxUnavailable, detect

        try:
            sandbox = detect(forbidden=[folder])
        except SandboxUnavailable as exc:
            return info | {"unavailable": str(exc)}
    grader = Grader(get_assignment(key), sandbox=sandbox)
    rows = []
    names = ["ref"] if sandboxed else list(entries)
    for name in names:
        res = grader.grade(Path(folder) / f"{name}.ipynb", student=name, seed=SEED)
        checks = res.to_dict()["checks"]
        failed = sorted(c["name"] for c in checks if not c["passed"])
        want = entries[name]
        ok = (res.status == "graded" and res.score == want["score"]
              and (want["failed"] is None or failed == want["failed"]))
        rows.append({"key": key, "name": name, "status": res.status, "score": res.score,
                     "expected": want["score"], "failed": failed, "expected_failed": want["failed"],
                     "seconds": round(res.seconds, 2), "agree": ok,
                     "hints": {c["name"]: c["hint"] for c in checks if not c["passed"]} if not ok else {}})
    return info | {"rows": rows}


def run(folder: Path, sandbox: bool, json_out: str | None) -> int:
    import multiprocessing as mp

    manifest = json.loads((folder / "manifest.json").read_text())
    jobs = [(k, str(folder / k), v, False) for k, v in manifest.items()]
    if sandbox:
        jobs += [(k, str(folder / k), v, True) for k, v in manifest.items()]
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=len(jobs), mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(_grade_chapter, jobs))
    wall = time.monotonic() - start
    bad = 0
    for r in results:
        if "unavailable" in r:
            bad += 1
            print(f"{r['key']:<22} sandboxed: no sandbox here: {r['unavailable']}")
            continue
        n_ok = sum(x["agree"] for x in r["rows"])
        per = sum(x["seconds"] for x in r["rows"]) / max(1, len(r["rows"]))
        print(f"{r['key']:<22} {'sandboxed' if r['sandboxed'] else 'direct':<9} {r['device']} (torch {r['torch']}): "
              f"{n_ok}/{len(r['rows'])} agree with the CPU table, {per:.1f} s per notebook")
        for x in r["rows"]:
            if not x["agree"]:
                bad += 1
                print(f"   DIFFERS {x['name']}: {x['status']} {x['score']} (CPU table: {x['expected']}); "
                      f"failed {x['failed']} vs {x['expected_failed']}")
                for c, h in x["hints"].items():
                    print(f"      {c}: {h[:300]}")
    print(f"{sum(len(r['rows']) for r in results)} gradings in {wall:.0f} s wall; {bad} disagree")
    if json_out:
        Path(json_out).write_text(json.dumps({"wall_seconds": wall, "results": results}, indent=1))
    return 1 if bad or not all(r["cuda"] for r in results) else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare").add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--sandbox", action="store_true")
    r.add_argument("--json")
    args = p.parse_args()
    if args.cmd == "prepare":
        prepare(args.dir)
        return 0
    return run(args.dir, args.sandbox, args.json)


if __name__ == "__main__":
    sys.exit(main())
