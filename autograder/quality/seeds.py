"""Seed robustness of the hidden tests: does any verdict depend on the seed?

``python -m autograder seeds KEY`` grades, under many seeds (default 20: 1 to 20), every row
of the exercise's table of typical mistakes (``tests/chapters/chKEY.py``, with the reference
and the untouched notebook) and every mutant of ``python -m autograder mutants KEY`` (the
ones marked equivalent included), and reports each one whose verdict changes with the seed:

* a table row whose score, or set of failed checks, is not the same under every seed (the
  scores per seed, the seeds that differ, and which checks flip), and a row that disagrees
  with its table (score, failed checks, hint words) at some seed;
* a mutant that is killed under some seeds and survives under others (a marked-equivalent
  mutant killed at some seed included: a correct answer losing points by luck);
* a hidden check that crashes (a grader error) under some seed.

A hidden check's choice of inputs must make its mistake show for every seed, not on
average; a seed is a submission's seed (``grade --seed N``), from which every check's own
seed is derived (``grader.check_seed``), so each seed reported here replays exactly.

It is a command of its own rather than ``mutants --seeds N`` because it grades more than
mutants (the mistake tables), judges a different thing (agreement between seeds, not
killed or not) and grades in a different way (below). The tables stay where
``tests/end_to_end/test_chapters.py`` reads them: they are the course's test data, built with the test
helpers (``tests/conftest.py``), so this command, a tool for course authors that needs a
checkout anyway (the masters, the tables), puts ``tests/`` on ``sys.path`` to read them.

What keeps it affordable:

* Grading is in process and unsandboxed by default (``--sandbox`` to isolate): every notebook
  graded here is the reference changed by the course's own tables and mutation operators.
* One worker per notebook across seeds: the worker is started and the notebook's code loaded
  once, then the checks of every seed run against it (each check reseeded as in a grade). A
  worker that died is replaced for the next seed. Whatever varies is then confirmed by fresh
  grades (a new worker per seed, exactly as ``grade --seed N``): a variation that fresh
  grades do not reproduce is reported apart, as depending on the worker's history.
* A mutant killed at the first seed is, at each further seed, graded only by the checks that
  killed it, in order, until one fails again (then it is killed at that seed too: its
  verdict is the same); only when none fails is it graded in full. The verdict is exact; the
  score of a killed mutant is not asked for (the table rows give scores in full).
* ``--jobs N`` grades N notebooks at once, one process each. Those processes end with the
  command, however it ends: each asks the kernel for a SIGTERM when the command dies (even by
  SIGKILL), and a SIGTERM to the command ends them before it ends; on SIGTERM a process of the
  pool ends its grading worker, then itself (`pool_initializer`).

Exit status: 0 when every verdict holds under every seed (and every row agrees with its
table), 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..core.assignments import ROOT, get_assignment

ROW, MUTANT = "row", "mutant"
KILLED, SURVIVED, GRADER_ERROR, NOT_GRADED = "killed", "survived", "grader_error", "not_graded"
DEFAULT_SEEDS = 20
TABLES = ROOT / "tests" / "chapters"


# --- what is graded -----------------------------------------------------------------------------------

@dataclass
class Item:
    """One notebook to grade under every seed: a table row or a mutant."""

    kind: str  # ROW or MUTANT
    name: str  # the row's name in its table, or the mutant's id
    notebook: str = field(repr=False)  # the notebook, as nbformat JSON text
    expected: dict | None = None  # a row's table entry: score, failed (or None), hints
    equivalent: str = ""  # a mutant's mark (reason) when it is marked equivalent
    label: str = ""  # a mutant's change, "before -> after"


def _tests_on_path() -> None:
    path = str(TABLES.parent)
    if path not in sys.path:
        sys.path.insert(0, path)


def table_rows(key: str, names=None) -> list[Item]:
    """The reference ("ref", full marks), the untouched notebook ("stub", zero) and every row of the
    chapter's table, as graded by tests/end_to_end/test_chapters.py; `names` keeps only those rows."""
    import nbformat

    _tests_on_path()
    from chapters import tables
    from conftest import chapter_batch

    table = tables()[key]
    grader_max = None
    items = []
    for name, make in chapter_batch(key).items():
        if names is not None and name not in names:
            continue
        if name == "ref":
            expected = {"score": grader_max, "failed": [], "hints": {}}
        elif name == "stub":
            expected = {"score": 0.0, "failed": None, "hints": {}}
        else:
            m = table.MISTAKES[name]
            expected = {"score": float(m.score), "failed": None if m.failed is None else sorted(m.failed),
                        "hints": dict(m.hints)}
        items.append(Item(ROW, name, nbformat.writes(make()), expected))
    unknown = set(names or ()) - {i.name for i in items}
    if unknown:
        raise KeyError(f"no such row in the table of {key}: {', '.join(sorted(unknown))}")
    return items


def mutant_items(key: str, sample: int | None = None, ids=None) -> list[Item]:
    """Every mutant of the exercise (marked-equivalent ones included), or a fixed sample of `sample`
    of them (chosen by id as `mutants --sample` does, marked ones left out), or those of `ids`."""
    import nbformat

    from . import mutants as mt
    assignment = get_assignment(key)
    equivalent, gaps = mt.read_marks(assignment)
    every = mt.mutants_of(assignment)
    if ids is not None:
        chosen = [m for m in every if m.id in ids]
        unknown = set(ids) - {m.id for m in chosen}
        if unknown:
            raise KeyError(f"no such mutant of {key}: {', '.join(sorted(unknown))}")
    elif sample:
        chosen = mt.sample(every, sample, exclude=set(equivalent) | set(gaps))
    else:
        chosen = every
    return [Item(MUTANT, m.id, nbformat.writes(mt.mutant_notebook(assignment, m)), equivalent=equivalent.get(m.id, ""),
                 label=f"{m.before.strip()} -> {m.after.strip()}") for m in chosen]


# --- grading one notebook under many seeds --------------------------------------------------------------

def _record(result) -> dict:
    """What this command keeps of one seed's `Result`."""
    failed = [c.name for c in result.checks if not c.passed]
    if result.status == "graded":
        verdict = KILLED if result.score < result.max_score else SURVIVED
    else:
        verdict = GRADER_ERROR if result.status == "grader_error" else NOT_GRADED
    return {"verdict": verdict, "score": round(result.score, 4), "max_score": result.max_score, "failed": failed,
            "hints": {c.name: c.hint for c in result.checks if not c.passed},
            "errors": [c.name for c in result.checks if c.grader_error] or ([result.error] if result.error else []),
            "full": True}


class ReusedWorker:
    """One notebook graded under several seeds by one worker (started and loaded once)."""

    def __init__(self, grader, path: Path):
        from ..core.notebook import NotebookError, audit_cells, code_cells, read_notebook

        self.grader, self.path, self.sub, self.cells = grader, path, None, None
        try:
            nb = read_notebook(path, grader.limits)
            if not audit_cells(nb, grader.ref_cells, grader.limits).rejected:
                self.cells = code_cells(nb)
        except NotebookError:
            pass  # graded by grader.grade, which says why

    def _submission(self, seed: int):
        from ..isolation.runner import Submission

        if self.sub is not None and self.sub.generation > 0 and self.sub.proc is None:
            self.sub.close()  # its worker died: the next seed gets a new one
            self.sub = None
        if self.sub is None:
            self.sub = Submission(self.cells, limits=self.grader.limits, seed=seed, sandbox=self.grader.sandbox,
                                  python=self.grader.python, notebook=self.path)
        # each seed has the whole budget of a grade
        self.sub.deadline = time.monotonic() + self.grader.limits.submission_seconds
        self.sub.restarts_left = self.grader.limits.max_restarts
        return self.sub

    def full(self, seed: int) -> dict:
        """Every check under `seed`."""
        if self.cells is None:
            return _record(self.grader.grade(self.path, seed=seed))
        result = self.grader.new_result(self.path, "", seed)
        try:
            self.grader.run_checks(self._submission(seed), result)
        except Exception as exc:  # noqa: BLE001 - reported as a grader error, as Grader.grade does
            result.status, result.error = "grader_error", f"{type(exc).__name__}: {exc}"
        result.score = float(sum(p["score"] for p in result.parts.values()))
        return _record(result)

    def first_failing(self, seed: int, names) -> str | None:
        """The first of the checks `names` (in the grader's order) that fails under `seed`, or None when
        all pass (or one crashes: then a full grade decides)."""
        from ..grading.grader import check_seed
        from ..hidden.support import Hint
        from ..isolation.errors import GradingError

        if self.cells is None:
            return None
        sub = self._submission(seed)
        for check in self.grader.checks:
            if check.name not in names:
                continue
            try:
                self.grader.call_check(check, sub, check_seed(seed, check.name))
            except (Hint, GradingError):
                return check.name
            except Exception:  # noqa: BLE001 - a crash: the full grade replays it as grade would
                return None
        return None

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close()


def grade_item(grader, item: Item, seeds: list[int], work: Path) -> dict[int, dict]:
    """seed -> record of one notebook under every seed, one worker for all of them (see the module's
    docstring for the short cut taken for mutants killed at the first seed)."""
    path = work / f"{item.kind}-{zlib.crc32(item.name.encode()):08x}.ipynb"
    path.write_text(item.notebook, encoding="utf-8")
    out: dict[int, dict] = {}
    worker = ReusedWorker(grader, path)
    try:
        first = None
        for seed in seeds:
            if item.kind == MUTANT and first is not None and first["verdict"] == KILLED and first["failed"]:
                by = worker.first_failing(seed, set(first["failed"]))
                if by is not None:
                    out[seed] = {"verdict": KILLED, "score": None, "failed": [by], "hints": {}, "errors": [],
                                 "full": False}
                    continue
            out[seed] = worker.full(seed)
            first = first or out[seed]
    finally:
        worker.close()
        path.unlink(missing_ok=True)
    return out


def grade_fresh(grader, item: Item, seeds, work: Path) -> dict[int, dict]:
    """seed -> record of fresh grades (a new worker per seed), exactly as `grade --seed N`."""
    path = work / f"fresh-{zlib.crc32(item.name.encode()):08x}.ipynb"
    path.write_text(item.notebook, encoding="utf-8")
    try:
        return {s: _record(grader.grade(path, seed=s)) for s in seeds}
    finally:
        path.unlink(missing_ok=True)


# --- the process pool --------------------------------------------------------------------------------

_GRADERS: dict = {}


def make_grader(key: str, sandbox: bool = False):
    """A Grader of `key` (unsandboxed unless asked), one per process and key."""
    from ..grading.grader import Grader

    if (key, sandbox) not in _GRADERS:
        box = None
        if sandbox:
            from ..isolation.sandbox import Sandbox

            box = Sandbox(forbidden=[Path(tempfile.gettempdir())])
        _GRADERS[key, sandbox] = Grader(get_assignment(key), sandbox=box)
    return _GRADERS[key, sandbox]


def pool_initializer(parent: int) -> None:
    """Run first in each process of the pool: it dies with the command (pid `parent`), and a SIGTERM
    (from the kernel when the command died, or from the command) ends the notebook being graded, its
    worker included, before the process ends."""
    from ..isolation.processes import die_with_parent

    die_with_parent(parent, cleanup=_remove_work)
    signal.signal(signal.SIGTERM, _end_on_sigterm)


_WORK: set = set()  # the folders this process of the pool grades in now


def _remove_work() -> None:
    import shutil

    for path in list(_WORK):
        shutil.rmtree(path, ignore_errors=True)


class PoolWorkerEnded(SystemExit):
    """Raised in a process of the pool by a SIGTERM: unwinding the grading ends its worker and removes
    its files."""


def _end_on_sigterm(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # a second SIGTERM (kernel and command both send one) is ignored
    raise PoolWorkerEnded(128 + signum)


def _pool_task(key: str, item: Item, seeds: list[int], sandbox: bool) -> tuple[dict[int, dict], float]:
    logging.getLogger("autograder").setLevel(logging.CRITICAL)  # grader errors are in the records
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="seeds-") as tmp:
            _WORK.add(tmp)
            try:
                return grade_item(make_grader(key, sandbox), item, seeds, Path(tmp)), time.monotonic() - start
            finally:
                _WORK.discard(tmp)
    except PoolWorkerEnded as exc:  # end here: the pool would catch it and wait for more work
        os._exit(exc.code)


def _stop_pool(futures) -> None:
    """End a pool at once: its work not yet started is cancelled, its processes terminated."""
    import multiprocessing

    for fut in futures:
        fut.cancel()
    processes = multiprocessing.active_children()  # this process's only: the pool's
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + 5
    for p in processes:  # each ends its grading worker first
        p.join(max(deadline - time.monotonic(), 0))


def grade_all(key: str, items: list[Item], seeds: list[int], *, jobs: int = 1, grader=None, sandbox: bool = False,
              progress=None) -> dict[str, dict[int, dict]]:
    """item name -> seed -> record. With jobs == 1 everything runs here, on `grader` when one is given
    (a test can hand one whose checks it changed); else in `jobs` processes of their own."""
    out = {}
    done = 0

    def tell(item, seconds):
        nonlocal done
        done += 1
        if progress:
            progress(f"[{done}/{len(items)}] {key} {item.kind} {item.name}: {seconds:.1f} s")

    if jobs <= 1:
        grader = grader or make_grader(key, sandbox)
        with tempfile.TemporaryDirectory(prefix="seeds-") as tmp:
            for item in items:
                start = time.monotonic()
                out[item.name] = grade_item(grader, item, seeds, Path(tmp))
                tell(item, time.monotonic() - start)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from ..isolation.processes import isolate_spawned, on_sigterm

    futures: dict = {}
    restore = isolate_spawned()  # the pool's processes start with -I and the allow-listed environment
    try:
        with on_sigterm(lambda: _stop_pool(list(futures))), \
                ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                    initializer=pool_initializer, initargs=(os.getpid(),)) as pool:
            for item in items:
                futures[pool.submit(_pool_task, key, item, seeds, sandbox)] = item
            for fut in as_completed(futures):
                out[futures[fut].name], seconds = fut.result()
                tell(futures[fut], seconds)
    finally:
        restore()
    return out


# --- judging the records --------------------------------------------------------------------------------

def _outcome(item: Item, rec: dict):
    """What must be the same under every seed: a row's score and failed checks, a mutant's verdict."""
    if rec["verdict"] in (GRADER_ERROR, NOT_GRADED):
        return rec["verdict"]
    if item.kind == ROW:
        return (rec["score"], tuple(sorted(rec["failed"])))
    return rec["verdict"]


def _describe(item: Item, rec: dict) -> str:
    if rec["verdict"] in (GRADER_ERROR, NOT_GRADED):
        return rec["verdict"]
    if item.kind == ROW:
        return f"{rec['score']:g}"
    return rec["verdict"]


def seed_ranges(seeds) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    seeds, out, i = sorted(seeds), [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        out.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ", ".join(out)


def flipping_checks(records: dict[int, dict]) -> dict[str, dict]:
    """check -> {"fails": seeds, "passes": seeds} for every check that fails under some fully graded seeds
    and passes under others."""
    full = {s: r for s, r in records.items() if r["full"] and r["verdict"] in (KILLED, SURVIVED)}
    names = {n for r in full.values() for n in r["failed"]}
    out = {}
    for name in sorted(names):
        fails = [s for s, r in full.items() if name in r["failed"]]
        if len(fails) < len(full):
            out[name] = {"fails": fails, "passes": sorted(set(full) - set(fails))}
    return out


def table_disagreements(item: Item, records: dict[int, dict], max_score: float) -> dict[int, list[str]]:
    """seed -> what a row's grade under that seed says against its table (score, failed checks, hints)."""
    exp = item.expected or {}
    out = {}
    for seed, rec in records.items():
        problems = []
        score = max_score if exp.get("score") is None and item.name == "ref" else exp.get("score")
        if score is not None and rec["score"] != score:
            problems.append(f"score {rec['score']:g}, the table says {score:g}")
        if exp.get("failed") is not None and sorted(rec["failed"]) != sorted(exp["failed"]):
            more, less = set(rec["failed"]) - set(exp["failed"]), set(exp["failed"]) - set(rec["failed"])
            problems.append("checks " + "; ".join(
                ([f"also failed: {', '.join(sorted(more))}"] if more else [])
                + ([f"passed: {', '.join(sorted(less))}"] if less else [])))
        for check, words in exp.get("hints", {}).items():
            if words not in rec["hints"].get(check, ""):
                problems.append(f"{check}'s hint lacks {words!r}")
        if problems:
            out[seed] = problems
    return out


def judge(key: str, items: list[Item], records: dict[str, dict[int, dict]], seeds: list[int], max_score: float,
          fresh: dict[str, dict[int, dict]] | None = None, seconds: float = 0.0) -> dict:
    """The JSON report: every item's outcomes per seed, what varies, what disagrees with its table."""
    fresh = fresh or {}
    rows = []
    for item in items:
        recs = {s: records[item.name][s] for s in seeds}
        outcomes = {s: _outcome(item, r) for s, r in recs.items()}
        varies = len(set(outcomes.values())) > 1
        errors = sorted(s for s, r in recs.items() if r["verdict"] in (GRADER_ERROR, NOT_GRADED))
        row = {"kind": item.kind, "name": item.name, "label": item.label, "equivalent": item.equivalent,
               "per_seed": {str(s): _describe(item, r) for s, r in recs.items()},
               "varies": varies, "error_seeds": errors}
        if varies:
            common = Counter(outcomes.values()).most_common(1)[0][0]
            row["differing_seeds"] = sorted(s for s, o in outcomes.items() if o != common)
            row["flipping_checks"] = flipping_checks(recs)
            if item.name in fresh:
                confirmed = {s: _outcome(item, r) for s, r in fresh[item.name].items()}
                row["fresh"] = {str(s): _describe(item, r) for s, r in fresh[item.name].items()}
                row["confirmed"] = len(set(confirmed.values())) > 1 or any(
                    confirmed[s] != outcomes[s] for s in confirmed)
        if item.kind == ROW:
            row["table"] = {str(s): p for s, p in table_disagreements(item, recs, max_score).items()}
        elif item.equivalent and any(r["verdict"] == KILLED for r in recs.values()):
            row["marked_equivalent_killed"] = sorted(s for s, r in recs.items() if r["verdict"] == KILLED)
        rows.append(row)
    unstable = [r for r in rows if (r["varies"] and r.get("confirmed", True)) or r["error_seeds"]]
    history = [r for r in rows if r["varies"] and not r.get("confirmed", True)]
    table = [r for r in rows if r.get("table")]
    mutants = [r for r in rows if r["kind"] == MUTANT]
    return {"assignment": key, "seeds": seeds, "rows": sum(r["kind"] == ROW for r in rows), "mutants": len(mutants),
            "killed_every_seed": sum(set(r["per_seed"].values()) == {KILLED} for r in mutants),
            "survived_every_seed": sum(set(r["per_seed"].values()) == {SURVIVED} for r in mutants),
            "unstable": [r["name"] for r in unstable], "worker_history": [r["name"] for r in history],
            "table_disagreements": [r["name"] for r in table], "stable": not unstable,
            "seconds": round(seconds, 1), "results": rows}


def format_report(rep: dict) -> str:
    seeds = rep["seeds"]
    verdict = ("verdicts stable across seeds" if rep["stable"]
               else f"{len(rep['unstable'])} verdict(s) vary with the seed")
    out = [f"{rep['assignment']}: {rep['rows']} table rows and {rep['mutants']} mutants under {len(seeds)} seeds "
           f"({seed_ranges(seeds)}): {verdict}"
           + (f"; mutants killed under every seed {rep['killed_every_seed']}, surviving under every seed "
              f"{rep['survived_every_seed']}" if rep["mutants"] else "") + f"; {rep['seconds']:.0f} s"]
    by_name = {r["name"]: r for r in rep["results"]}
    for title, names in (("verdicts that vary with the seed", rep["unstable"]),
                         ("varying only with a reused worker (fresh grades agree at every seed tried)",
                          rep["worker_history"])):
        if not names:
            continue
        out.append(f"\n{title}:")
        for name in names:
            r = by_name[name]
            what = f"row {name}" if r["kind"] == ROW else f"mutant [{name}] {r['label']}"
            if r["equivalent"]:
                what += f" (marked equivalent: {r['equivalent']})"
            out.append(f"  {what}")
            groups: dict[str, list[int]] = {}
            for s, v in r["per_seed"].items():
                groups.setdefault(v, []).append(int(s))
            out.append("      " + "; ".join(f"{v} at seeds {seed_ranges(ss)}" for v, ss in groups.items()))
            if r["error_seeds"]:
                out.append(f"      grader error or not graded at seeds {seed_ranges(r['error_seeds'])}")
            for check, sides in r.get("flipping_checks", {}).items():
                out.append(f"      {check} fails at seeds {seed_ranges(sides['fails'])}, "
                           f"passes at {seed_ranges(sides['passes'])}")
            if "fresh" in r:
                out.append("      fresh grades: " + ", ".join(f"seed {s}: {v}" for s, v in r["fresh"].items()))
    if rep["table_disagreements"]:
        out.append("\nrows that disagree with their table:")
        for name in rep["table_disagreements"]:
            r = by_name[name]
            problems: dict[str, list[int]] = {}
            for s, ps in r["table"].items():
                for p in ps:
                    problems.setdefault(p, []).append(int(s))
            for p, ss in problems.items():
                out.append(f"  row {name}: {p} (seeds {seed_ranges(ss)})")
    return "\n".join(out) + "\n"


# --- the command ---------------------------------------------------------------------------------------

def run(key: str, *, seeds: list[int], jobs: int = 1, rows=True, mutants=True, row_names=None,
        mutant_sample: int | None = None, mutant_ids=None, sandbox: bool = False, grader=None, confirm: bool = True,
        progress=None) -> dict:
    """Grade the chosen rows and mutants of `key` under `seeds`; confirm what varies by fresh grades."""
    start = time.monotonic()
    items = (table_rows(key, row_names) if rows else []) \
        + (mutant_items(key, mutant_sample, mutant_ids) if mutants else [])
    records = grade_all(key, items, seeds, jobs=jobs, grader=grader, sandbox=sandbox, progress=progress)
    grader = grader or make_grader(key, sandbox)
    fresh = {}
    if confirm:
        with tempfile.TemporaryDirectory(prefix="seeds-fresh-") as tmp:
            for item in items:
                outcomes = {s: _outcome(item, records[item.name][s]) for s in seeds}
                if len(set(outcomes.values())) > 1:
                    common = Counter(outcomes.values()).most_common(1)[0][0]
                    odd = [s for s in seeds if outcomes[s] != common]
                    usual = [s for s in seeds if outcomes[s] == common][:1]
                    if progress:
                        progress(f"{key} {item.kind} {item.name} varies: fresh grades at seeds "
                                 f"{seed_ranges(odd + usual)}")
                    fresh[item.name] = grade_fresh(grader, item, sorted(odd + usual), Path(tmp))
    return judge(key, items, records, seeds, grader.max_score, fresh, time.monotonic() - start)


def seeds_command(args) -> int:
    from ..core.usage import UsageError, known_assignment

    keys = args.assignment
    for key in keys:
        known_assignment(key)  # else a usage error
    if (args.rows or args.mutant) and len(keys) != 1:
        raise UsageError("--rows and --mutant name the rows or mutants of one exercise")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    reports, status = [], 0
    for key in keys:
        try:
            rep = run(key, seeds=seeds, jobs=args.jobs, rows=not args.mutants_only, mutants=not args.table_only,
                      row_names=args.rows.split(",") if args.rows else None, mutant_sample=args.sample,
                      mutant_ids=args.mutant or None, sandbox=args.sandbox, progress=progress)
        except KeyError as exc:  # a row or mutant that does not exist
            raise UsageError(exc.args[0]) from None
        reports.append(rep)
        text = format_report(rep)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{key}.seeds.txt").write_text(text, encoding="utf-8")
            (out / f"{key}.seeds.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
        if not args.json:
            print(text, end="", flush=True)
        if not rep["stable"] or rep["table_disagreements"]:
            status = 1
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=1))
    return status
