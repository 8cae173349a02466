"""The `check` and `grade` commands: arguments in, a report out, and the exit code.

Exit codes: 0 when every submission was graded (low scores, rejected notebooks and
rejected entries of the submissions folder included: those are the learners'); 1 when
`check`'s notebook could not be graded; 2 for a usage error (`usage.UsageError`: no such
file, unknown assignment, no sandbox, nothing gradable found, a Python without torch or
numpy); 3 when any submission ended in a grader error (a fault of ours that needs the
instructor).

`check` grades one learner's notebook here and prints the report; `grade` is a
`grading_run.GradingRun` made of its arguments (the folder rule, the gradebook, the CSV,
the feedback pages and the log are that run's), whose summary it prints.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from .core.assignments import all_assignments
from .core.learner_errors import stack_problem
from .core.logs import SafeFormatter
from .core.text import json_for_stdout, safe, visible
from .core.usage import UsageError, known_assignment

EXIT_OK, EXIT_NOT_GRADED, EXIT_GRADER_ERROR = 0, 1, 3
SANDBOX_NOTE = ("The self-check runs your notebook's code on this machine, as you, without a sandbox; "
                "the instructor's grader runs the same checks in isolation.")


def _infer_assignment(path: Path, given: str | None, stem: str) -> str | None:
    if given:
        return given
    from .core.notebook import NotebookError, read_notebook

    try:
        nb = read_notebook(path)
        if nb.assignment:
            return nb.assignment
    except NotebookError:
        pass
    keys = {a.key for a in all_assignments()}
    return stem if stem in keys else None


# --- check ------------------------------------------------------------------------------

@contextmanager
def _stack_imports():
    """Around imports that bring in torch or numpy: one that fails because they are installed but
    broken is the learner's environment, said in one sentence (a usage error); any other is ours."""
    try:
        yield
    except Exception:
        problem = stack_problem()
        if problem:
            raise UsageError(problem) from None
        raise


def check_command(args) -> int:
    """A learner's check: the worker is started before this process imports torch, the hidden
    checks and the reference (`Submission.start_early`), so the two start-ups overlap; nothing
    that only `grade` needs (nbgrader, nbformat, the gradebook) is imported.

    No cyclic garbage collection runs while PyTorch, the checks and the reference are imported:
    full collections of their hundreds of thousands of objects took a tenth of a second. It runs
    as usual from grading on; where the process ends with the check (the command line, not a
    caller in the same process: `freeze_imports`), what the imports made is frozen first, never
    scanned again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(args)
    finally:
        if enabled:
            gc.enable()


def _check(args) -> int:
    path = Path(args.notebook)
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give the notebook file (.ipynb)")
    # Asked before anything imports torch or numpy, without importing them (the worker must start
    # first): a Python that lacks them gets one sentence and its install command, not a traceback.
    problem = stack_problem(try_import=False)
    if problem:
        raise UsageError(problem)
    # Every reader refuses a link (`regular_file`); the learner's own link to their notebook, given
    # here by name, is followed once, and the report still names the notebook as it was given.
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    key = _infer_assignment(real, args.assignment, path.stem)
    if key is None:
        known = ", ".join(a.key for a in all_assignments())
        raise UsageError(f"cannot tell which exercise {safe(path.name, 200)} is (it has no course metadata); "
                         f"pass --assignment KEY (known: {known})")
    assignment = known_assignment(key)  # before any worker starts
    parts = None
    if getattr(args, "part", None) is not None:  # `--part "part 3"`: its checks only, with their points
        from .learner.history import CheckRefused, exercise, resolve_part

        try:
            parts = resolve_part(exercise(assignment), args.part, example='--part "part 1"')
        except CheckRefused as exc:
            raise UsageError(str(exc)) from None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    sandbox = None
    if args.sandbox:
        from .isolation.sandbox import Sandbox, SandboxUnavailable

        try:
            sandbox = Sandbox(forbidden=[path.resolve().parent])
        except SandboxUnavailable as exc:
            raise UsageError(str(exc)) from None
    with _stack_imports():
        from .isolation.runner import Submission

    # self_check: a check that cannot measure what it grades (a memory peak) shows no points for
    # it, since grading may measure it; so a check never shows more than `grade` gives
    early = Submission([], sandbox=sandbox, notebook=real, self_check=True)
    try:
        early.start_early()
        if sandbox is not None:
            # Tried while the worker starts: the worker runs nothing of the learner's before the
            # load, which is sent only after this probe has passed.
            try:
                sandbox.probe()
            except SandboxUnavailable as exc:
                raise UsageError(str(exc)) from None
        with _stack_imports():
            from .grading.feedback import bounded, format_text
            from .grading.grader import GRADED, GRADER_ERROR, course_grader

        grader = course_grader(key, sandbox=sandbox)
    except BaseException:
        early.close()
        raise
    if getattr(args, "freeze_imports", False):
        gc.freeze()
    gc.enable()
    result = grader.grade(real, seed=args.seed, submission=early, label=str(path) if real is not path else "",
                          parts=parts)
    if args.json:
        print(json_for_stdout(dict(bounded(result, grader.limits).to_dict(), sandboxed=sandbox is not None)))
    else:
        print(SANDBOX_NOTE if sandbox is None else "The self-check ran your notebook's code in a sandbox.")
        from .learner.history import exercise

        print(format_text(result, limits=grader.limits, part_titles=exercise(assignment).titles))
    if result.status == GRADER_ERROR:
        return EXIT_GRADER_ERROR
    return EXIT_OK if result.status == GRADED else EXIT_NOT_GRADED


# --- grade ------------------------------------------------------------------------------

def grade_command(args) -> int:
    from .batch.grading_run import GradingRun, to_stderr

    run = GradingRun(args.assignment, args.submissions, args.out, gradebook=args.gradebook, force=args.force,
                     timeout=args.timeout, seed=args.seed, sandbox=not args.no_sandbox,
                     jobs=getattr(args, "jobs", None), scheduler=getattr(args, "scheduler", None),
                     insecure_scheduler=getattr(args, "insecure_scheduler", False),
                     warm=bool(getattr(args, "warm", False)), config=getattr(args, "config", None))
    summary = run.run()
    if args.json:
        print(json_for_stdout(summary))
    else:
        print(visible(f"gradebook: {summary['gradebook']}\ncsv: {summary['csv']}\nfeedback: {run.out / 'feedback'}\n"
                      f"log: {summary['log']}", keep="\n"))
        for line in run.final_lines:
            print(visible(line))
    faults = run.faults
    if faults:
        to_stderr(f"{len(faults)} submission(s) hit a grader error (not the learners' fault): "
                  + ", ".join(str(r.get("student")) for r in faults) + f". Tracebacks: {run.log_path}")
        return EXIT_GRADER_ERROR
    return EXIT_OK
