"""How far each claim of the book is from failing: every page rerun under several seeds.

The book checks what its prose says about trained and measured results with
``coursebook.claims.claim(name, value, op, threshold)``. A threshold set just under one
machine's value fails on the next machine, whose floating-point training takes another
path, or whose timings differ. This script measures each claim's spread instead: it
executes each chapter page as the build does (a Jupyter kernel, the page's folder as
the working directory), once per seed, and prints for every claim its threshold, its
value under each seed, and its smallest margin.

Seed s shifts every seed the page sets by 1000 * s: ``torch.manual_seed(k)``,
``torch.Generator().manual_seed(k)``, ``np.random.default_rng(k)`` and
``random.seed(k)`` all receive k + 1000 * s, so the data, the initial weights and the
batches all change, and seed 0 is the build's own run. Timing and memory claims are
repeats under load: ``--jobs 2`` runs two pages at once on the two cores, and ``--load N``
adds N processes that only burn CPU.

    OMP_NUM_THREADS=1 python benchmarks/claims.py                      # 5 seeds, every page
    OMP_NUM_THREADS=1 python benchmarks/claims.py --pages 02 06 --seeds 8 --json claims.json

Exit status 1 when a claim failed under some seed or a page stopped with an error.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from coursebook.claims import machine, margin  # noqa: E402

BOOK = ROOT / "book"
SEED_STEP = 1000

# Runs before the page's first cell. Every seed the page sets is shifted by OFFSET, and
# the trained-model cache of chapters 01-02 goes to a folder of this run alone (its key
# does not see the shift, so the build's cache would hand back the unshifted models).
PROLOGUE = """\
import pathlib as _pathlib
import random as _random
import numpy as _np
import torch as _torch
import coursebook.seq2seq_experiment as _experiment

_OFFSET = {offset}
_experiment.CACHE_DIR = _pathlib.Path({cache!r})
if _OFFSET:
    _torch_seed, _np_rng, _np_seed, _py_seed = (
        _torch.manual_seed, _np.random.default_rng, _np.random.seed, _random.seed)

    def _shift(seed):
        return seed + _OFFSET if isinstance(seed, int) else seed

    class _Generator(_torch.Generator):
        def manual_seed(self, seed):
            return super().manual_seed(_shift(int(seed)))

    _torch.manual_seed = _torch.random.manual_seed = lambda seed: _torch_seed(_shift(int(seed)))
    _torch.Generator = _Generator
    _np.random.default_rng = lambda seed=None, *a, **k: _np_rng(_shift(seed), *a, **k)
    _np.random.seed = lambda seed=None: _np_seed(_shift(seed))
    _random.seed = lambda a=None, *args, **kw: _py_seed(_shift(a), *args, **kw)
"""


def chapter_pages() -> dict[str, Path]:
    """{'02': book/02_attention.md, ...}: every chapter page that states a claim."""
    pages = {}
    for path in sorted(BOOK.glob("[0-9][0-9]_*.md")):
        if "claim(" in path.read_text(encoding="utf-8"):
            pages[path.name[:2]] = path
    return pages


def run_page(page: Path, seed: int, timeout: int) -> dict:
    """Execute one page with its seeds shifted; -> {"seconds", "error"}. The claims go to
    the file named by COURSE_CLAIMS_LOG."""
    import nbformat
    from myst_nb.core.read import read_myst_markdown_notebook
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = read_myst_markdown_notebook(page.read_text(encoding="utf-8"), path=page)
    with tempfile.TemporaryDirectory(prefix="claims-cache-") as cache:
        prologue = PROLOGUE.format(offset=SEED_STEP * seed, cache=cache)
        nb.cells.insert(0, nbformat.v4.new_code_cell(prologue))
        client = NotebookClient(nb, kernel_name="python3", timeout=timeout,
                                resources={"metadata": {"path": str(page.parent)}})
        start = time.perf_counter()
        error = ""
        try:
            client.execute()
        except CellExecutionError as exc:
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # the traceback's colours
            lines = [line for line in text.splitlines() if line.strip()]
            error = lines[-1] if lines else "error"
        return {"seconds": time.perf_counter() - start, "error": error}


def _child(args) -> int:
    """One (page, seed) run in a process of its own, so that runs cannot share state."""
    os.environ["COURSE_CLAIMS_LOG"] = args.log
    # The kernel runs in the page's folder: it finds coursebook/ (not installed) as the build's do.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = run_page(Path(args.page), args.seed, args.timeout)
    print(json.dumps(result))
    return 0


def burn(stop_at: float) -> None:
    """Load for timing claims: keep one core busy until stop_at."""
    while time.time() < stop_at:
        sum(i * i for i in range(10_000))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", nargs="*", help="chapter numbers (02 06) or keys; default: every page with claims")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per page (default 5; 0 is the build's)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="pages executed at once (default 2)")
    parser.add_argument("--load", type=int, default=0, help="extra processes that only burn CPU")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--json", help="write every run and claim to this file")
    parser.add_argument("--report", nargs="+", metavar="JSON",
                        help="run nothing: print the report of earlier --json files (later files win)")
    parser.add_argument("--_child", nargs=3, metavar=("PAGE", "SEED", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        args.page, seed, args.log = args._child
        args.seed = int(seed)
        return _child(args)

    if args.report:
        runs, pages = {}, {}
        for path in args.report:
            saved = json.loads(Path(path).read_text())
            pages.update({k: Path(p) for k, p in saved["pages"].items()})
            runs.update({(r["page"], r["seed"]): r for r in saved["runs"]})
        seeds = sorted({s for _, s in runs})
        pages = dict(sorted(pages.items()))
        if any((k, s) not in runs for k in pages for s in seeds):
            parser.error("the files do not cover the same seeds for every page")
        return report(pages, seeds, runs)

    pages = chapter_pages()
    if args.pages:
        wanted = {p[:2] for p in args.pages}
        unknown = wanted - set(pages)
        if unknown:
            parser.error(f"no page with claims for {sorted(unknown)}; pages: {sorted(pages)}")
        pages = {k: v for k, v in pages.items() if k in wanted}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))

    print(f"{machine()}; {len(pages)} pages x {len(seeds)} seeds, {args.jobs} at once, "
          f"{args.load} burning processes", flush=True)

    burners = []
    if args.load:
        stop_at = time.time() + 6 * 3600
        burners = [multiprocessing.Process(target=burn, args=(stop_at,), daemon=True) for _ in range(args.load)]
        for b in burners:
            b.start()

    work = [(key, seed) for seed in seeds for key in pages]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="claims-") as tmp:
        def one(item):
            key, seed = item
            log = Path(tmp) / f"{key}-{seed}.jsonl"
            log.touch()
            cmd = [sys.executable, __file__, "--_child", str(pages[key]), str(seed), str(log),
                   "--timeout", str(args.timeout)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            try:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                result = {"seconds": None, "error": (proc.stderr.strip().splitlines() or ["crashed"])[-1]}
            result["claims"] = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            runs[key, seed] = result
            status = result["error"] or "ok"
            print(f"  page {key} seed {seed}: {len(result['claims'])} claims, "
                  f"{result['seconds'] or 0:.0f} s, {status}", flush=True)
            return result

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(one, work))
    for b in burners:
        b.terminate()

    return report(pages, seeds, runs, args.json)


def margin_over_spread(values, op, threshold) -> float:
    """How many times the spread between seeds fits between the worst seed and the
    threshold. Under 1, another machine need not stray further than the seeds already do
    to fail the claim. Positive quantities (accuracies, ratios, error sizes) vary by
    factors, so they are compared on a log scale; differences on a linear one."""
    if threshold > 0 and min(values) > 0:
        values, threshold = [math.log(v) for v in values], math.log(threshold)
    least = min(margin(v, op, threshold) for v in values)
    spread = max(values) - min(values)
    return least / spread if spread > 0 else (float("inf") if least >= 0 else float("-inf"))


def report(pages, seeds, runs, json_path=None) -> int:
    failed = 0
    table, thin = [], []
    print()
    for key in pages:
        names = []
        for seed in seeds:
            for c in runs[key, seed]["claims"]:
                if c["name"] not in names:
                    names.append(c["name"])
        seconds = [runs[key, s]["seconds"] for s in seeds if runs[key, s]["seconds"]]
        print(f"## {pages[key].name}: {len(names)} claims, "
              f"{min(seconds, default=0):.0f}-{max(seconds, default=0):.0f} s per run")
        for seed in seeds:
            if runs[key, seed]["error"]:
                failed += 1
                print(f"   seed {seed} stopped: {runs[key, seed]['error']}")
        print(f"   {'claim':<44} {'needs':>10}  " + " ".join(f"{'seed ' + str(s):>9}" for s in seeds)
              + f"  {'min margin':>10} {'margin/spread':>13}")
        for name in names:
            by_seed = {}
            for seed in seeds:
                for c in runs[key, seed]["claims"]:
                    if c["name"] == name:
                        by_seed.setdefault(seed, c)
            first = next(iter(by_seed.values()))
            margins = [c["margin"] for c in by_seed.values()]
            bad = [s for s, c in by_seed.items() if not c["holds"]]
            missing = [s for s in seeds if s not in by_seed and not runs[key, s]["error"]]
            failed += len(bad) + len(missing)
            cells = " ".join(f"{by_seed[s]['value']:>9.4g}" if s in by_seed else f"{'-':>9}" for s in seeds)
            values = [c["value"] for c in by_seed.values()]
            spread = max(values) - min(values)
            headroom = margin_over_spread(values, first["op"], first["threshold"])
            thin.extend([name] if not bad and headroom < 1 else [])
            flag = "  FAILS" if bad else ("  MISSING" if missing else ("  thin" if headroom < 1 else ""))
            print(f"   {name:<44} {first['op']:>2} {first['threshold']:<7.4g}  {cells}  {min(margins):>10.4g}"
                  f" {headroom:>13.3g}{flag}")
            table.append({"page": pages[key].name, "name": name, "op": first["op"],
                          "threshold": first["threshold"],
                          "values": {s: by_seed[s]["value"] for s in by_seed},
                          "min_margin": min(margins), "spread": spread, "margin_over_spread": headroom,
                          "failed_seeds": bad})
        print()
    total = sum(len(runs[k, s]["claims"]) for k in pages for s in seeds)
    print(f"{len(table)} claims, {total} checks over {len(seeds)} seeds: "
          + ("every claim holds under every seed" if not failed else f"{failed} failures")
          + (f"; margin under one spread: {', '.join(thin)}" if thin else "; every margin exceeds the spread"))
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"seeds": seeds, "pages": {k: str(p) for k, p in pages.items()}, "claims": table,
             "runs": [{"page": k, "seed": s, **r} for (k, s), r in runs.items()]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
