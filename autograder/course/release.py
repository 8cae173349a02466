"""The `release` command: an exercise into an nbgrader course folder, or the learners' release.

`release KEY... --out DIR` writes nbgrader's source and release notebooks (see
`release_nbgrader_command`); `release --learners DIR --repository URL` writes the learner-facing
course (`autograder.course.learners_release`).
"""

from __future__ import annotations

from pathlib import Path

from ..core.text import safe, visible


def release_command(args) -> int:
    if args.learners:
        from .learners_release import learners_release_command

        return learners_release_command(args)
    return release_nbgrader_command(args)


def release_nbgrader_command(args) -> int:
    """Write each exercise's source and release notebooks into the course folder OUT and its
    structure into OUT/gradebook.db, so formgrader lists it before anything is graded. Idempotent."""
    from ..core.assignments import all_assignments
    from ..core.usage import UsageError, known_assignment

    if getattr(args, "repository", None):
        raise UsageError("--repository goes with --learners DIR, not with --out")
    keys = args.assignment or [a.key for a in all_assignments()]
    assignments = [known_assignment(k) for k in dict.fromkeys(keys)]
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {safe(out, 300)} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    from . import gradebook as gbk
    from .nbgrader_course import write_release

    url = f"sqlite:///{(out / 'gradebook.db').resolve()}"
    with gbk.open_gradebook(url) as gb:
        for a in assignments:
            for path in write_release(out, a):
                print(visible(f"wrote {path}"))
            gbk.sync_assignment(gb, a)
    print(visible(f"gradebook: {url}"))
    return 0
