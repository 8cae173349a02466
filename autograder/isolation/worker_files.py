"""The files the sandboxed side runs from: copied read-only into /grader, beside each other.

The trusted side starts `worker.py` as a script (``python -I /grader/worker.py ...``, or in place
without the sandbox). It puts its own folder first on sys.path and imports the files beside it
as top-level modules, never the `autograder` package: a fresh worker needs `protocol` and
`device_check`, and `optimizers` for the checks that build one in the learner's process; the warm start's template (``worker.py --template``) also `warm_server`, and
`seccomp` for its workers' filter. Each list here must hold every file its script imports,
directly or not (tests/test_structure.py reads the imports and checks it); the script comes
first, as `Sandbox.wrap` runs the first file.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

WORKER_FILES = tuple(HERE / name for name in ("worker.py", "protocol.py", "device_check.py", "optimizers.py"))
"""What a fresh worker runs from."""

TEMPLATE_FILES = (*WORKER_FILES, HERE / "warm_server.py", HERE / "seccomp.py")
"""What the warm start's template runs from (`autograder.isolation.warm`), and the workers it forks."""
