"""Round four, classes 1 and 2: bytes that are valid where they stand but that Python cannot turn into
values. Each used to raise an exception nobody expected: a timestamp.txt at the edge of the calendar
stopped `grade` while it scanned (no learner graded, no CSV), a notebook holding an integer of
thousands of digits became a standing grader error. Now each costs at most its own learner's grade.

Every notebook here is refused by the reader before any code runs, so the batch spends no worker on
them; their timestamp.txt files are read before that, during the scan.
"""

from __future__ import annotations

import json
import os

from autograder.core.assignments import get_assignment

KEY = "03_qkv"
HUGE = "9" * 5000  # Python refuses to read an integer of more than 4,300 digits


def _with(path: list, value: str) -> str:
    """The learner notebook as JSON text, with `value` (raw JSON) at `path`."""
    nb = json.loads(get_assignment(KEY).notebook.read_text(encoding="utf-8"))
    target = nb
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@@VALUE@@"
    return json.dumps(nb).replace('"@@VALUE@@"', value)


# name -> (the notebook's JSON text, words of the learner's error)
NOTEBOOKS = {
    "bytes_bigint_metadata": (_with(["metadata", "widgets"], HUGE), "thousands of digits"),
    "bytes_bigint_execution_count": (_with(["cells", 1, "execution_count"], "-" + HUGE), "thousands of digits"),
    "bytes_bigint_nbformat_minor": (_with(["nbformat_minor"], HUGE), "thousands of digits"),
    "bytes_lone_surrogate": (_with(["cells", 1, "source"], '"x = \\ud800"'), "not valid Unicode"),
}
# nbgrader's layout, a timestamp.txt beside each notebook: name -> (timestamp, words of its flag)
STAMPED = {
    "bytes_time_9999_west": ("9999-12-31 23:59:59.999999-05:00", "not a time this grader can represent"),
    "bytes_time_0001_east": ("0001-01-01 00:00:00+05:00", "not a time this grader can represent"),
    "bytes_time_9999_abbrev": ("9999-12-31 23:00:00 EDT", "not a time this grader can represent"),
    "bytes_time_0001_abbrev": ("0001-01-01 00:30:00 NZDT", "not a time this grader can represent"),
}


def build(ctx) -> None:
    for name, (text, _) in NOTEBOOKS.items():
        (ctx.subs / f"{name}.ipynb").write_text(text, encoding="utf-8")
    for name, (stamp, _) in STAMPED.items():
        folder = ctx.subs / name / KEY
        folder.mkdir(parents=True)
        nb = folder / f"{KEY}.ipynb"
        nb.write_text(NOTEBOOKS["bytes_bigint_metadata"][0], encoding="utf-8")
        (folder / "timestamp.txt").write_text(stamp, encoding="utf-8")
    # a file time past what the calendar holds (an archive can carry one): the scan must not fail on it
    try:
        os.utime(ctx.subs / "bytes_time_9999_west" / KEY / f"{KEY}.ipynb", (2**40, 2**40))
    except (OSError, OverflowError):
        pass
    ctx.extra["learner_bytes"] = {"notebooks": NOTEBOOKS, "stamped": STAMPED}
