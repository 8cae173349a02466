"""`check()` in a notebook: the hidden checks on the code the running kernel has run.

A learner in JupyterLab, Notebook 7, VS Code or Colab runs, in a cell,
``from autograder import check; check()`` (or one part: ``check("part 3")``). The notebook
file may not be on this disk (Colab), or may be older than what the kernel ran, so what is
graded is the code the kernel ran: IPython's input history (`history_manager.input_hist_raw`,
entry n being the cell shown as ``In [n]``), turned into the cell list that
`notebook.code_cells` gives for a saved notebook, and graded by the same `Grader` as the
command line's `check` (unsandboxed, as a self-check), with the same seeds.

Nothing is graded in the kernel's process. A grading process of its own (`_serve`, started with
this Python, isolated from the kernel's environment: `python -I` and only the variables of
`processes.ENV_NAMES`, so that a PYTHONPATH, PYTHONSTARTUP or LD_PRELOAD set by a cell runs
nothing there) runs the hidden checks and starts the worker that loads the learner's code
(`autograder.isolation.runner`), exactly as `python -m autograder check` does: a notebook that patched
`torch.allclose` in the kernel fools no check, and the kernel's namespace and random generators
are left as they were. check() adds no name to the learner's namespace and returns None (IPython
then keeps no `Out` entry); it prints the report, never a traceback.

Which history entries are graded, and which cells a kernel has not run, is `history`'s part.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass

from .history import CheckRefused, exercise, history_cells, infer_assignment, not_run, resolve_part

TERMINAL = "attention-course check NOTEBOOK.ipynb"
NOT_IN_NOTEBOOK = ("check() works in a cell of a notebook (Jupyter, VS Code, Colab); outside one, check the "
                   f"saved notebook from a terminal with `{TERMINAL}`.")
INTERRUPTED = "check interrupted: nothing was graded."
RESULT_MARK = "@@attention-course-result "


@dataclass
class Plan:
    """What one check() grades: the exercise, the cells, the parts (None: all)."""

    key: str
    cells: list
    parts: list | None
    titles: dict
    numbers: tuple = ()  # the execution counts of the entries graded, in order
    unrun: tuple = ()  # the names the exercise's notebook defines whose cells this kernel has not run (`not_run`)

    @property
    def label(self) -> str:
        """The cells graded, as the report names them: every one, runs of consecutive counts as
        ranges ("In [1] to In [4], In [7], In [9] to In [12]"), so that two checks of the same cells
        name them alike and a gap (an entry left out as rerun, or a test) shows."""
        runs: list[list[int]] = []
        for n in sorted(self.numbers):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        said = [f"In [{a}]" if a == b else f"In [{a}] to In [{b}]" for a, b in runs]
        if len(said) > 6:
            said = said[:5] + [f"… {len(said) - 5} more runs"]
        count = len(self.numbers)
        return f"this kernel's history ({count} cell{'s' if count != 1 else ''}: {', '.join(said)})"


def plan_check(entries, part=None, assignment: str | None = None) -> Plan:
    """What check(part, assignment=...) grades of the history `entries`; CheckRefused when it cannot."""
    from ..core.assignments import all_assignments, get_assignment

    entries = [(int(n), str(s)) for n, s in entries]
    if assignment is not None:
        try:
            chosen = get_assignment(str(assignment))
        except KeyError as exc:
            raise CheckRefused(f"check() knows no exercise {str(assignment)[:60]!r}: {exc.args[0]}.") from None
        ex = exercise(chosen)
    else:
        exercises = [exercise(a) for a in all_assignments()]
        key = infer_assignment(entries, exercises)
        ex = next(e for e in exercises if e.key == key)
    parts = None if part is None else resolve_part(ex, part)
    cells = history_cells(entries, ex.tests)
    if not cells:
        raise CheckRefused(f"This kernel has run none of the code of exercise {ex.key} yet: run its cells "
                           "(Run All, or each cell in order), then check() again.")
    return Plan(ex.key, cells, parts, ex.titles, tuple(int(c["label"][4:-1]) for c in cells),
                not_run(entries, ex))


# --- grading, in a process of its own --------------------------------------------------------

# -I leaves the course's folder off sys.path: the child puts it first itself
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from autograder.learner.in_notebook import _serve; _serve()")


def grade_plan(plan: Plan, seed: int, replay: str = "") -> dict:
    """Grade `plan` with `seed` in a grading process started with this Python, as the command line's
    `check` grades; {"result": Result.to_dict(), "text": the text report, "log": path or ""}.
    CheckRefused (one sentence) when that process fails; KeyboardInterrupt ends it cleanly."""
    from ..core.assignments import ROOT as root
    from ..isolation.processes import clean_env

    request = json.dumps({"assignment": plan.key, "cells": plan.cells, "parts": plan.parts, "seed": seed,
                          "titles": plan.titles, "replay": replay,
                          "label": plan.label, "unrun": list(plan.unrun)})
    fd, log = tempfile.mkstemp(prefix="attention-course-check-", suffix=".log")
    keep_log = True
    try:
        with tempfile.TemporaryDirectory(prefix="attention-course-check-") as cwd, os.fdopen(fd, "wb") as err:
            # Isolated from the kernel's Python environment (-I, the allow-listed variables): a cell
            # that set PYTHONPATH, PYTHONSTARTUP or LD_PRELOAD runs nothing here. Not the kernel's
            # plotting backend either (ipykernel sets one only a kernel can use).
            env = clean_env({"MPLBACKEND": "Agg"})
            proc = subprocess.Popen([sys.executable, "-I", "-c", _CHILD, str(root)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, cwd=cwd, env=env,
                                    start_new_session=True)  # its own group: the stop button reaches us only
            try:
                out, _ = proc.communicate(request.encode())
            except KeyboardInterrupt:
                keep_log = False  # the stop button: nothing to report
                _stop(proc)
                raise
            except BaseException:
                _stop(proc)
                raise
        lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.startswith(RESULT_MARK)]
        reply = json.loads(lines[-1][len(RESULT_MARK):]) if lines else {}
        if "refused" in reply:
            keep_log = False
            raise CheckRefused(str(reply["refused"]))
        if "error" in reply or "result" not in reply:
            why = reply.get("error") or f"the grading process ended with exit code {proc.returncode}"
            raise CheckRefused(f"The check itself failed (a fault of the course, not yours): {why}. "
                               f"Please report it, with the details in {log}.")
        keep_log = reply["result"].get("status") == "grader_error"
        return dict(reply, log=log if keep_log else "")
    finally:
        if not keep_log:
            try:
                os.unlink(log)
            except OSError:
                pass


def _stop(proc: subprocess.Popen) -> None:
    """End the grading process as the stop button ends a cell: it closes its worker on the way out."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _serve() -> None:
    """The grading process: a request (JSON) on stdin, one result line on stdout, the log on stderr."""
    import logging

    from ..core.logs import SafeFormatter

    signal.signal(signal.SIGINT, signal.default_int_handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        reply = _grade_request(json.loads(sys.stdin.read()))
    except Exception as exc:  # noqa: BLE001 - ours: one line back to the kernel, the traceback in the log
        traceback.print_exc()
        reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    sys.stdout.write(RESULT_MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()
    # As the command line's check: the exit handlers run, then the process ends without the interpreter's
    # teardown of PyTorch (0.3 to 0.5 s of the learner's wait); its worker was closed by the grade.
    import atexit

    atexit._run_exitfuncs()
    sys.stderr.flush()
    os._exit(0)


def _grade_request(req: dict) -> dict:
    """As the command line's `check` (commands.check_command): the worker is started before this process
    imports torch, the hidden checks and the reference, so that the two start-ups overlap."""
    from ..isolation.runner import Submission

    early = Submission([], self_check=True)
    try:
        early.start_early()
        try:
            from ..core.usage import UsageError
            from ..grading.feedback import bounded, format_text
            from ..grading.grader import course_grader
        except (ImportError, OSError):
            problem = _stack_problem(True)  # torch or numpy is there but cannot be imported
            if problem:
                early.close()
                return {"refused": problem}
            raise
        try:
            grader = course_grader(req["assignment"])
        except UsageError as exc:
            raise RuntimeError(str(exc)) from None
    except BaseException:
        early.close()
        raise
    result = grader.grade(req["label"], seed=req["seed"], submission=early, parts=req["parts"], cells=req["cells"])
    text = format_text(result, limits=grader.limits, part_titles=req["titles"], replay=req["replay"] or None,
                       unrun=req.get("unrun") or ())
    return {"result": bounded(result, grader.limits).to_dict(), "text": text}


# --- check() -----------------------------------------------------------------------------------

def _shell():
    """The running IPython shell, or None: read through IPython itself, never the learner's names."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; a plain script need not pay for it
    get = getattr(ipython, "get_ipython", None)
    try:
        return get() if callable(get) else None
    except Exception:  # noqa: BLE001 - no shell we can read
        return None


def _history(shell) -> list[tuple[int, str]]:
    try:
        raw = list(shell.history_manager.input_hist_raw)
    except Exception:  # noqa: BLE001 - a shell without IPython's history
        raise CheckRefused("This Python shell keeps no input history, which check() reads; check the saved "
                           f"notebook from a terminal with `{TERMINAL}`.") from None
    return [(n, s) for n, s in enumerate(raw) if n > 0 and isinstance(s, str)]


def _stack_problem(try_import: bool) -> str | None:
    """One sentence when this Python cannot import torch or numpy (autograder.core.learner_errors); the
    kernel asks without importing them (`try_import=False`), the grading process imports them."""
    try:
        from ..core.learner_errors import stack_problem
    except ImportError:
        return None
    try:
        return stack_problem(try_import=try_import, in_notebook=True)
    except TypeError:  # the plain signature
        return stack_problem()


def in_worker(frame) -> bool:
    """Whether check() was called from a grading worker loading a notebook (where it does nothing)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return (frame is not None and frame.f_globals.get("__name__") == "__learner__") or (
        os.path.basename(str(main)) == "worker.py" and "protocol" in sys.modules)


def _replay(part, assignment, seed: int) -> str:
    args = ([repr(str(part))] if part is not None else []) + (
        [f"assignment={str(assignment)!r}"] if assignment is not None else []) + [f"seed={seed}"]
    return f"`check({', '.join(args)})`"


def report(entries, part=None, *, assignment: str | None = None, seed: int | None = None) -> str:
    """What check() prints for the history `entries` ((execution count, source) pairs)."""
    plan = plan_check(entries, part, assignment)
    seed = secrets.randbelow(2**31) if seed is None else int(seed)
    reply = grade_plan(plan, seed, _replay(part, assignment, seed))
    lines = ["The self-check runs the code this kernel has run on this machine, as you, without a sandbox; the "
             "instructor's grader runs the same checks on your saved notebook, in isolation.", reply["text"]]
    if reply["log"]:
        lines.append(f"  (the grader's log: {reply['log']})")
    return "\n".join(lines)


def check(part=None, *, assignment: str | None = None, seed: int | None = None, _frame=None) -> None:
    """Check this notebook's exercise, or one part of it, from a cell; prints the report, returns None.

    `part`: "part 3" (also "Part 3", "3") or a part's name ("softmax"); `assignment`: the exercise's
    key when it cannot be told from the cells run; `seed`: replay the checks of an earlier report."""
    frame = _frame if _frame is not None else sys._getframe(1)
    if in_worker(frame):
        return None
    try:
        shell = _shell()
        if shell is None:
            text = NOT_IN_NOTEBOOK
        else:
            text = _stack_problem(False) or report(_history(shell), part, assignment=assignment, seed=seed)
    except KeyboardInterrupt:
        text = INTERRUPTED
    except CheckRefused as exc:
        text = str(exc)
    except Exception as exc:  # noqa: BLE001 - a fault of ours: one sentence, the traceback in a file
        text = (f"The check itself failed (a fault of the course, not yours): {type(exc).__name__}: "
                f"{str(exc)[:300]}. Please report it, with the details in {_log_traceback()}.")
    print(text)
    return None


def _log_traceback() -> str:
    try:
        fd, path = tempfile.mkstemp(prefix="attention-course-check-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        return path
    except OSError:
        return "(no log could be written)"
