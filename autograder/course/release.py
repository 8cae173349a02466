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
    structure into OUT/gradebook.db, so formgrader lists it before anything is graded, and the
    course's block into OUT/nbgrader_config.py (`nbgrader_buttons`). Idempotent."""
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
    from .nbgrader_course import release_into

    url = f"sqlite:///{(out / 'gradebook.db').resolve()}"
    for line in release_into(out, assignments, url):
        print(visible(line))
    from .nbgrader_buttons import write_config

    path, written = write_config(out)
    print(visible(f"{'wrote' if written else 'kept'} {path} (formgrader's Generate, Autograde and Generate "
                  "Feedback buttons go through the course)"))
    print(visible(f"gradebook: {url}"))
    return 0

