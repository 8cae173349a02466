"""Command line: ``python -m autograder {generate,check,grade,export,release,similarity,gradescope,mutants,seeds,new}``,
also installed as
the ``attention-course`` script (`entry_point`).

Exit codes: 0 done; 1 `check`'s notebook could not be graded; 2 usage error (an unknown
exercise key, a bad flag, a missing file: one line on stderr); 3 a grader error (a fault of
ours, logged) needs the instructor's attention."""

from __future__ import annotations

import argparse
import atexit
import os
import sys

from .core.text import visible
from .core.usage import EXIT_USAGE, UsageError, known_assignment, require_checkout, require_modules


def _cmd_generate(args) -> int:
    require_checkout("generate")
    from .authoring.generate import MasterError, generate

    assignments = [known_assignment(k) for k in args.assignment] if args.assignment else None
    try:
        problems = generate(assignments, check=args.check)
    except MasterError as exc:  # a master, or _config.yml, breaks a rule: said in one line
        raise UsageError(str(exc)) from None
    for line in problems:
        print(line)
    if args.check:
        if problems:
            print(f"\n{len(problems)} generated file(s) out of date: run `python -m autograder generate`",
                  file=sys.stderr)
            return 1
        print("generated files are up to date")
    return 0


def _cmd_check(args) -> int:
    from .commands import check_command

    return check_command(args)


def _cmd_grade(args) -> int:
    require_modules("grade", "instructor", ("nbgrader", "dask", "distributed"))
    from .commands import grade_command

    return grade_command(args)


def _cmd_export(args) -> int:
    require_modules("export", "instructor", ("nbgrader",))
    from .course.export import export_command

    return export_command(args)


def _cmd_release(args) -> int:
    from .course.release import release_command

    return release_command(args)


def _cmd_similarity(args) -> int:
    from .course.similarity import similarity_command

    return similarity_command(args)


def _cmd_gradescope(args) -> int:
    from .course.gradescope import gradescope_command

    return gradescope_command(args)


def _cmd_mutants(args) -> int:
    require_checkout("mutants")
    from .quality.mutants import mutants_command

    return mutants_command(args)


def _cmd_seeds(args) -> int:
    require_checkout("seeds")
    from .quality.seeds import seeds_command

    return seeds_command(args)


def _cmd_new(args) -> int:
    require_checkout("new")
    from .authoring.scaffold import new_command

    return new_command(args)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return n


def build_parser(prog: str = "python -m autograder") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="write learner notebooks and reference modules from the masters")
    p.add_argument("assignment", nargs="*", help="chapter keys (default: all)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("check", help="a learner's self-check of one notebook")
    p.add_argument("notebook", help="the learner's notebook (.ipynb)")
    p.add_argument("--assignment", help="chapter key (default: read from the notebook)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--sandbox", action="store_true",
                   help="run the notebook's code under bubblewrap, as the grader does (default: unsandboxed)")
    p.add_argument("--seed", type=int, help="seed the checks (replays a grade: its feedback names the seed)")
    p.add_argument("--part", metavar="PART",
                   help='check one part only: "part 3" (or "3"), or its name, e.g. "softmax" (default: every part)')
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("grade", help="grade submissions into an nbgrader gradebook and a CSV")
    p.add_argument("submissions", nargs="+", help="notebooks, or folders searched for *.ipynb")
    p.add_argument("--assignment", required=True, help="chapter key, e.g. 03_qkv")
    p.add_argument("--gradebook", help="nbgrader database URL (default: sqlite:///OUT/gradebook.db)")
    p.add_argument("--out", default="grading", help="folder for gradebook, CSV and feedback (default: grading)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--force", action="store_true", help="regrade submissions already in the gradebook")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per submission (default: the assignment's limit, 120 unless it sets one)")
    p.add_argument("--seed", type=int, help="seed the checks of every submission (default: a fresh one each)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run learner code without bubblewrap isolation (only for notebooks you trust)")
    p.add_argument("--jobs", type=_positive, default=None, metavar="N",
                   help="grade N submissions at once, each in its own sandbox and on one core "
                        "(default: the number of CPUs, at most one job per 3 submissions to grade)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on the workers of this Dask scheduler (tls://HOST:8786, with the TLS credentials of "
                        "Dask's configuration, distributed.comm.tls.*) instead of this machine")
    p.add_argument("--insecure-scheduler", action="store_true",
                   help="accept a --scheduler address without authentication (tcp://): anyone who can reach that "
                        "cluster can run code in the grading jobs and change grades")
    p.add_argument("--warm", action="store_true",
                   help="start each job's workers from a pre-imported template (when the grader has one)")
    p.add_argument("--config", metavar="FILE",
                   help="the course's instructor configuration: due dates, late policies, LMS columns "
                        "(default: OUT/course.toml when there is one)")
    p.set_defaults(func=_cmd_grade)

    p = sub.add_parser(
        "export", help="write the grades again from the gradebook: CSV, feedback pages, Canvas and Moodle files",
        description="Read the gradebook and the results of earlier `grade` runs in OUT (with the instructor's "
                    "manual scores from formgrader, and the late policy of the course configuration) and write "
                    "OUT/KEY_grades.csv, the feedback pages OUT/feedback/STUDENT/KEY/KEY.html, and the LMS "
                    "imports OUT/exports/KEY_canvas.csv and OUT/exports/KEY_moodle.csv. Grades nothing.")
    p.add_argument("--assignment", required=True, help="chapter key, e.g. 03_qkv")
    p.add_argument("--out", default="grading", help="the folder `grade` wrote (default: grading)")
    p.add_argument("--gradebook", help="nbgrader database URL (default: sqlite:///OUT/gradebook.db)")
    p.add_argument("--config", metavar="FILE", help="the course configuration (default: OUT/course.toml when there is one)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "release", help="write an exercise into an nbgrader course folder, or the learners' release of the course",
        description="With --out: write each exercise's nbgrader source and release notebooks, "
                    "OUT/source/KEY/KEY.ipynb and OUT/release/KEY/KEY.ipynb, so formgrader and nbgrader's "
                    "exchange (release_assignment, collect, release_feedback) work on the grades `grade` writes "
                    "there. With --learners: write the learner-facing course (the built book and the exercise "
                    "notebooks, without the solutions, the hidden tests or the masters) into DIR, ready to push "
                    "to the repository at --repository.")
    p.add_argument("assignment", nargs="*", help="chapter keys (default: all)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", metavar="DIR", help="the nbgrader course folder (the one `grade --out` writes)")
    where.add_argument("--learners", metavar="DIR", help="write the learners' release into DIR")
    p.add_argument("--repository", metavar="URL",
                   help="with --learners: the learners' repository (https://github.com/OWNER/NAME) that the site's "
                        "links and launch buttons point to")
    p.add_argument("--branch", default="main", help="with --learners: the learners' repository's branch (default main)")
    p.set_defaults(func=_cmd_release)

    p = sub.add_parser(
        "similarity", help="for the instructor: submissions whose answers equal the reference or each other",
        description="Compare the answer cells of the submissions (read by `grade`'s folder rule) with each "
                    "other and with the reference, after normalisation (comments, docstrings, names and "
                    "formatting removed), and report identical answers and near-duplicates. Writes "
                    "OUT/similarity/KEY.html, .txt and .json: for the instructor, never in a learner's feedback.")
    p.add_argument("submissions", nargs="+", help="notebooks, or folders searched for *.ipynb (as `grade`)")
    p.add_argument("--assignment", required=True, help="chapter key, e.g. 03_qkv")
    p.add_argument("--out", default="grading", help="folder for the report (default: grading)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_similarity)

    p = sub.add_parser(
        "gradescope", help="Gradescope's autograder: grade /autograder/submission into results.json, or package it",
        description="Inside Gradescope's container (run by the run_autograder script this command packages): "
                    "grade the one notebook in the submission folder and write Gradescope's results.json. "
                    "With --package ZIP: write the autograder zip an instructor uploads to Gradescope.")
    p.add_argument("--assignment", help="chapter key (default: read from the notebook)")
    p.add_argument("--submission", default="/autograder/submission", help="folder holding the learner's notebook")
    p.add_argument("--results", default="/autograder/results/results.json", help="where results.json is written")
    p.add_argument("--package", metavar="ZIP", help="write the autograder zip for --assignment instead of grading")
    p.add_argument("--seed", type=int, help="seed the checks (default: a fresh one)")
    p.add_argument("--config", metavar="FILE",
                   help="course.toml: with --package, the zip carries its Gradescope settings for --assignment (when "
                        "learners see each check); when grading, the file to read them from (run_autograder "
                        "passes the zip's)")
    p.set_defaults(func=_cmd_gradescope)

    p = sub.add_parser("mutants", help="grade mutants of the reference answers: would the hidden tests notice?")
    p.add_argument("assignment", help="chapter key, e.g. 03_qkv")
    p.add_argument("--jobs", type=_positive, default=None, metavar="N", help="grade N mutants at once (as `grade`)")
    p.add_argument("--sample", type=_positive, default=None, metavar="N",
                   help="grade only a fixed sample of N mutants (chosen by id; marked ones left out)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", metavar="DIR", help="write DIR/KEY.txt, DIR/KEY.json and the grading folder there")
    p.add_argument("--list", action="store_true", help="list the mutants with their ids; grade nothing")
    p.add_argument("--no-sandbox", action="store_true", help="grade without bubblewrap (faster; trusted code)")
    p.add_argument("--no-warm", action="store_true", help="start every worker fresh instead of from a template")
    p.add_argument("--seed", type=int, default=1, help="seed of the checks, the same for every mutant (default 1)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per mutant (default: the assignment's)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PCT",
                   help="exit 1 when the score is below PCT percent")
    p.set_defaults(func=_cmd_mutants)

    p = sub.add_parser(
        "seeds", help="grade the mistake table's rows and the mutants under many seeds: does a verdict vary?",
        description="Grade every row of the exercise's table of typical mistakes (tests/chapters/chKEY.py, with "
                    "the reference and the untouched notebook) and every mutant (`mutants`) under many seeds, and "
                    "report each one whose score or failed checks (a row), or whose killed/survived verdict (a "
                    "mutant), changes with the seed, with the seeds that differ and the checks that flip; also "
                    "rows that disagree with their table at some seed. A command of its own, not `mutants "
                    "--seeds`: it also grades the tables, and judges agreement between seeds. Graded in process, "
                    "unsandboxed (the notebooks are the reference changed by the course itself), one worker per "
                    "notebook across seeds; what varies is confirmed by fresh grades. Exit 1 when something "
                    "varies or disagrees.")
    p.add_argument("assignment", nargs="+", help="chapter keys, e.g. 03_qkv")
    p.add_argument("--seeds", type=_positive, default=20, metavar="N", help="grade under N seeds (default 20)")
    p.add_argument("--first-seed", type=int, default=1, metavar="S",
                   help="the seeds are S, S+1, ..., S+N-1 (default 1): each replays with `grade --seed`")
    p.add_argument("--jobs", type=_positive, default=1, metavar="N", help="grade N notebooks at once (default 1)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--table-only", action="store_true", help="grade the table's rows only, no mutants")
    which.add_argument("--mutants-only", action="store_true", help="grade the mutants only, no table rows")
    p.add_argument("--rows", metavar="NAME,...", help="only these rows of the table (ref and stub included)")
    p.add_argument("--sample", type=_positive, default=None, metavar="N",
                   help="only a fixed sample of N mutants (chosen by id as `mutants --sample`)")
    p.add_argument("--mutant", action="append", metavar="ID", help="only this mutant (repeatable)")
    p.add_argument("--sandbox", action="store_true", help="grade under bubblewrap, as `grade` does (slower)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", metavar="DIR", help="also write DIR/KEY.seeds.txt and DIR/KEY.seeds.json")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_cmd_seeds)

    p = sub.add_parser(
        "new", help="start a chapter: its master, hidden tests, mistake table, book page and _toc.yml entry",
        description="Write a new chapter's files, each with one small placeholder part (exercises/source/KEY.md, "
                    "autograder/hidden/test_KEY.py, tests/chapters/chKEY.py, book/KEY.md), list the page in "
                    "_toc.yml, then generate its notebook and reference module. Nothing is overwritten: an "
                    "invalid or taken key is a usage error (exit 2). autograder/hidden/README.md, \"Adding a "
                    "chapter\", says what comes next.")
    p.add_argument("key", help="the chapter's key: two digits, an underscore, lowercase words (e.g. 08_sparse_attention)")
    p.add_argument("title", help='its title, e.g. "Sparse attention"')
    p.add_argument("--root", metavar="DIR", help="the course folder to write into (default: this one)")
    p.set_defaults(func=_cmd_new)
    return parser


def run(args) -> int:
    """Run the parsed command `args`; its exit code. A usage error, wherever a command finds it, is
    said here, in one line on stderr, and exits 2 (as argparse's own errors do); so is a Python
    without torch or numpy, whichever command meets it (`learner_errors.stack_problem`)."""
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {visible(str(exc), keep=chr(10))}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        from .core.learner_errors import STACK, stack_problem

        problem = str(exc.name or "").partition(".")[0] in STACK and stack_problem(try_import=False)
        if not problem:
            raise
        print(f"error: {visible(problem)}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def entry_point(prog: str = "attention-course") -> None:
    """The command line as a program: the `attention-course` script, and `python -m autograder`
    (which passes its own `prog`). Runs the command and ends the process with its exit code."""
    args = build_parser(prog).parse_args()
    args.freeze_imports = args.command == "check"  # the process ends with the check (`check_command`)
    code = run(args)
    if args.command == "check":
        # The check has printed its report and ended its worker. What is left is the interpreter's
        # teardown of PyTorch, the checks and the reference (0.3 to 0.5 s, a fifth of a learner's
        # wait): the exit handlers run (the sandbox's cgroup clean-up), then the process ends.
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    raise SystemExit(code)
