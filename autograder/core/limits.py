"""Every bound the grader enforces, in one place, with the reason for each default.

A chapter whose checks need more (a full Transformer calls slower functions than a
softmax) overrides fields in its hidden-test module::

    LIMITS = {"call_seconds": 40.0}

and `Limits.for_assignment` applies them. Nothing else in the grader hard-codes a bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Limits:
    # --- time (wall clock, seconds) ------------------------------------------------------
    submission_seconds: float = 120.0
    """Everything one notebook may cost: loading its code and every hidden check."""
    call_seconds: float = 20.0
    """One call into learner code; a softmax takes milliseconds, an endless loop forever."""
    load_seconds: float = 60.0
    """Parsing the notebook's cells and running their top level (imports, definitions) in the worker."""
    max_restarts: int = 3
    """Worker restarts after a crash or a timed-out call; each restart reloads the notebook."""

    # --- what the trusted side reads from a learner ---------------------------------------
    notebook_bytes: int = 20 * MiB
    """Largest notebook file graded: far above any exercise with its outputs."""
    notebook_cells: int = 2000
    """Cells in one notebook; the exercises have about 30."""
    notebook_containers: int = 1_000_000
    """`[` and `{` in the notebook file: bounds the memory `json.loads` can be made to use
    (about 100 MiB at worst) while leaving room for any honest notebook's code."""
    reply_bytes: int = 64 * MiB
    """One reply from the worker: a tensor result as raw bytes, base64-encoded."""
    reply_containers: int = 100_000
    """Lists and objects in one reply; honest replies carry arrays as strings and need few."""
    reply_depth: int = 32
    """Nesting of values in a reply (tuples of dicts of tensors...)."""
    array_dims: int = 16
    """Dimensions of one array in a reply."""
    output_bytes: int = 64 * 1024
    """The learner's stdout and stderr kept per worker; the rest is counted and dropped."""

    # --- what a learner can put into the instructor's outputs ------------------------------
    notes: int = 20
    """Notes (errors while loading, skipped cells) kept per submission; the rest are summarised."""
    note_chars: int = 300
    """Characters kept of one note or one learner error message."""

    # --- the instructor's outputs: feedback pages, results, --json, CSV, terminal, log ------
    # Learner text (messages, grade ids, file names) is capped again where it is written, so
    # that no path from a notebook or a folder into an output is unbounded (see autograder/core/text.py).
    hint_chars: int = 700
    """Characters kept of one check's hint: an honest hint is one or two sentences; a learner's
    exception message arrives already cut to 600 by the worker protocol."""
    error_chars: int = 4000
    """Characters kept of a submission's reason (`error`), as in the CSV's `reason` column: room
    for the 20 problems of a forged-cell rejection (`notes` of `note_chars`), cut beyond."""
    path_chars: int = 300
    """Characters kept of a path in any output (a notebook, a rejected entry)."""
    progress_chars: int = 300
    """Characters of learner-derived text on one progress line (stderr); the full reason is in the
    results, the CSV and the feedback page."""
    rejected_shown: int = 50
    """Rejected entries of the submissions folder listed in the progress output, the log and
    `--json`; the rest are counted ("… N more")."""
    flags: int = 5
    """Reasons listed per flagged submission (rejected entries in the learner's folder); the rest are counted."""
    result_bytes: int = 256 * 1024
    """A submission's results file, its `--json` entry and its feedback page stay under this: the caps
    above give about 15 KB, but a character can escape to 12 bytes (JSON) or 6 (HTML), so notes,
    hints and the reason are cut harder when they would make it larger (`feedback.bounded`)."""

    # --- the sandbox (see autograder/isolation/sandbox.py) -------------------------------------------
    sandbox_tmp_bytes: int = 64 * MiB
    """The worker's private /tmp (tmpfs)."""
    sandbox_processes: int = 64
    """RLIMIT_NPROC: processes and threads of the sandbox uid; stops a fork bomb."""
    sandbox_address_space: int = 4 * 2**30
    """RLIMIT_AS in bytes; not set where a GPU is passed through (it breaks CUDA)."""
    sandbox_memory_bytes: int = 4 * 2**30
    """The memory cgroup limit of one worker, all its processes together, tmpfs (/tmp, /dev/shm)
    and kernel memory included; the kernel OOM-kills inside the worker beyond it. Where no
    cgroup can be created only RLIMIT_AS applies. RLIMIT_AS is kept beside it (without a GPU):
    one oversized allocation then fails with a MemoryError the learner's code and the grader's
    report can see, instead of an OOM kill. 4 GiB: a torch worker uses about 0.5 GiB."""
    sandbox_shm_bytes: int = 64 * MiB
    """The worker's private /dev/shm (tmpfs), where multiprocessing keeps its semaphores."""
    sandbox_file_size: int = 16 * MiB
    """RLIMIT_FSIZE: the largest file the worker may write."""
    sandbox_open_files: int = 256
    """RLIMIT_NOFILE."""
    sandbox_cpu_seconds: int = 180
    """RLIMIT_CPU per worker process; the wall-clock limits above come first."""

    def replace(self, **changes) -> "Limits":
        """A copy with some fields changed; unknown names are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown limit(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return dataclasses.replace(self, **changes)

    def for_assignment(self, overrides: dict | None) -> "Limits":
        """These limits with an assignment's `LIMITS` overrides applied."""
        return self.replace(**(overrides or {}))


DEFAULT = Limits()
