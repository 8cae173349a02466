"""The course's instructor configuration, ``course.toml``: due dates, late policies, LMS columns,
and what learners see of their Gradescope results.

One TOML file per course (read with `tomllib`), given by ``--config FILE`` or found as
OUT/course.toml. Every key is checked: a key we do not know (with the nearest one we do),
a value of the wrong type, an exercise the course does not have, a time zone that is not
an IANA name, a penalty outside 0-100, a negative grace, a due date that does not exist on
the clock of the course's time zone, a roster that is missing or malformed, a Gradescope
visibility that is not one of Gradescope's four, a part or check the exercise does not have: each is a
`ConfigError`, one sentence naming the file, the key and the problem, and the command
exits 2 before anything is graded. The whole schema, as an example, is in
book/instructors/grading.md ("Due dates and late work"); a test loads that example.
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import io
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from ..core.text import safe, student_id_problem
from ..core.usage import UsageError

FILE_NAME = "course.toml"
CONFIG_BYTES = 1 << 20        # a course file is a few hundred bytes; a larger one is a mistake
ROSTER_BYTES = 8 << 20        # about 100,000 learners
POLICIES = ("none", "zero", "per_hour", "per_day")
CANVAS_ID_COLUMNS = ("ID", "SIS User ID", "SIS Login ID")
MOODLE_ID_FIELDS = ("username", "email", "idnumber")
DEFAULT_CANVAS_ID_COLUMN = "SIS Login ID"
DEFAULT_MOODLE_ID_FIELD = "username"

# Gradescope's visibility of a test (https://gradescope-autograders.readthedocs.io/en/latest/specs/,
# "Controlling Test Case Visibility"): always shown, shown once the due date has passed, once the
# instructor publishes the grades, never shown to learners (instructors always see every test).
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")

TOP_KEYS = ("course", "late", "assignments", "lms", "gradescope")
COURSE_KEYS = ("timezone",)
LATE_KEYS = ("policy", "penalty", "grace_minutes", "cutoff_days")
ASSIGNMENT_KEYS = ("due", "late", "canvas_column", "moodle_item", "gradescope_visibility", "gradescope_checks")
LMS_KEYS = ("canvas_id_column", "moodle_id_field", "roster")
GRADESCOPE_KEYS = ("visibility",)


class ConfigError(UsageError):
    """The course configuration cannot be used; the message names the file, the key and the problem."""


@dataclass(frozen=True)
class LatePolicy:
    policy: str = "none"                  # one of POLICIES
    penalty_percent: float = 0.0          # per_hour / per_day: percent of the max score per started unit
    grace: dt.timedelta = dt.timedelta(0)  # late by at most this much counts as on time
    cutoff_after: dt.timedelta | None = None  # later than due + this: no credit


@dataclass(frozen=True)
class AssignmentSettings:
    key: str
    due: dt.datetime | None = None        # aware
    late: LatePolicy = LatePolicy()
    canvas_column: str | None = None
    moodle_item: str | None = None
    timezone: str = "UTC"                 # the course's, for showing the due date
    gradescope_visibility: str = "visible"  # when learners see a check's test on Gradescope (VISIBILITIES)
    gradescope_checks: dict = field(default_factory=dict)  # part or check name -> its own visibility

    def check_visibility(self, name: str, part: str) -> str:
        """The visibility of the check `name` of `part`: its own, else its part's, else the exercise's."""
        return self.gradescope_checks.get(name) or self.gradescope_checks.get(part) or self.gradescope_visibility


@dataclass(frozen=True)
class LmsSettings:
    canvas_id_column: str = DEFAULT_CANVAS_ID_COLUMN
    moodle_id_field: str = DEFAULT_MOODLE_ID_FIELD
    roster: dict = field(default_factory=dict)  # student_id -> {column: value} (the roster's row)


@dataclass(frozen=True)
class CourseConfig:
    path: Path | None = None              # None: no configuration file
    timezone: str = "UTC"
    lms: LmsSettings = LmsSettings()
    late: LatePolicy = LatePolicy()       # the default late policy ([late])
    assignments: dict = field(default_factory=dict)  # key -> AssignmentSettings (those in the file)
    gradescope_visibility: str = "visible"  # the default of every exercise ([gradescope] visibility)

    def assignment(self, key: str) -> AssignmentSettings:
        """The settings of exercise `key`: the file's, or the defaults (no due date) when it has none."""
        found = self.assignments.get(key)
        return found if found is not None else AssignmentSettings(key, late=self.late, timezone=self.timezone,
                                                                  gradescope_visibility=self.gradescope_visibility)

    @property
    def note(self) -> str:
        """One line for a command's output when there is no file ("" when there is one)."""
        if self.path is not None:
            return ""
        return ("no course configuration (course.toml): no due dates or late policies, default LMS settings; "
                "see `grade --config`")


# --- checking values ----------------------------------------------------------------------

class _Checker:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str) -> ConfigError:
        at = f" {where}" if where else ""
        return ConfigError(f"{safe(str(self.path), 300)}:{at} {problem}")

    def table(self, value, where: str, allowed: tuple, what: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table ({what}), not {_kind(value)}")
        for k in value:
            if k not in allowed:
                close = difflib.get_close_matches(k, allowed, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(allowed)})"
                raise self.fail(_join(where, k), f"is not a setting we know{hint}")
        return value

    def string(self, value, where: str, limit: int = 300) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, not {_kind(value)}")
        if not value.strip() or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise self.fail(where, f"must be 1 to {limit} characters on one line, without control characters")
        return value

    def number(self, value, where: str, low: float, high: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"must be a number, not {_kind(value)}")
        if value != value or value < low or (high is not None and value > high):
            bounds = f"between {low:g} and {high:g}" if high is not None else f"{low:g} or more"
            raise self.fail(where, f"must be {bounds}, not {value!r}")
        return float(value)

    def choice(self, value, where: str, allowed: tuple) -> str:
        if not isinstance(value, str) or value not in allowed:
            shown = repr(value) if isinstance(value, str) else _kind(value)
            raise self.fail(where, f"must be one of {', '.join(repr(a) for a in allowed)}, not {safe(shown, 80)}")
        return value


def _kind(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table", dt.datetime: "a date and time", dt.date: "a date", dt.time: "a time"}
    return names.get(type(value), type(value).__name__)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _timezone(check: _Checker, value) -> str:
    name = check.string(value, "course.timezone", 100)
    try:
        if name not in available_timezones():
            raise ZoneInfoNotFoundError(name)
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        close = difflib.get_close_matches(name, sorted(available_timezones()), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else " (e.g. \"Europe/Berlin\", \"America/New_York\", \"UTC\")"
        raise check.fail("course.timezone", f"{safe(name, 100)!r} is not an IANA time zone name{hint}") from None
    return name


def _late(check: _Checker, value, where: str, base: LatePolicy | None = None) -> LatePolicy:
    table = check.table(value, where, LATE_KEYS, "policy, penalty, grace_minutes, cutoff_days")
    if "policy" not in table:
        raise check.fail(where, f"needs a policy ({', '.join(POLICIES)})")
    policy = check.choice(table["policy"], _join(where, "policy"), POLICIES)
    penalty = 0.0
    if policy in ("per_hour", "per_day"):
        if "penalty" not in table:
            raise check.fail(where, f"policy {policy!r} needs a penalty (percent of the maximum score per "
                                    f"started {'hour' if policy == 'per_hour' else 'day'})")
        penalty = check.number(table["penalty"], _join(where, "penalty"), 0, 100)
    elif "penalty" in table:
        raise check.fail(_join(where, "penalty"), f"goes with policy 'per_hour' or 'per_day', not {policy!r}")
    grace = check.number(table.get("grace_minutes", 0), _join(where, "grace_minutes"), 0)
    cutoff = None
    if "cutoff_days" in table:
        days = check.number(table["cutoff_days"], _join(where, "cutoff_days"), 0, 3660)
        cutoff = dt.timedelta(days=days)
        if cutoff <= dt.timedelta(minutes=grace):
            raise check.fail(_join(where, "cutoff_days"), "must be longer than the grace period")
    return LatePolicy(policy, penalty, dt.timedelta(minutes=grace), cutoff)


def _due(check: _Checker, value, where: str, zone: ZoneInfo) -> dt.datetime:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value
        # A local time in the course's zone: one that the clock skips (spring forward) is refused;
        # one that it shows twice (fall back) is the later of the two, in the learners' favour.
        later = value.replace(tzinfo=zone, fold=1)
        earlier = value.replace(tzinfo=zone, fold=0)
        for aware in (later, earlier):
            back = aware.astimezone(dt.timezone.utc).astimezone(zone).replace(tzinfo=None)
            if back != value:
                raise check.fail(where, f"{value.isoformat()} does not exist in {zone.key} (the clocks skip it "
                                        "when daylight saving time starts): give another time, or an offset")
        return later
    if isinstance(value, dt.date):
        raise check.fail(where, f"is a date without a time: write the time too, e.g. {value.isoformat()}T23:59:00")
    if isinstance(value, str):
        raise check.fail(where, "must be a TOML date and time without quotes, e.g. due = 2026-12-10T23:59:00")
    raise check.fail(where, f"must be a date and time (e.g. 2026-12-10T23:59:00), not {_kind(value)}")


def gradescope_names(key: str) -> tuple[list[str], list[str]]:
    """(parts, checks) of exercise `key` that `gradescope_checks` may name, read without importing its hidden
    tests (no torch): the parts from the learner notebook's test cells, the checks (the `test_*` functions of
    autograder/hidden/test_KEY.py, as the grader names them) from the file's syntax tree; ([], []) where the
    exercise's files are not there."""
    import ast

    from ..core.assignments import Assignment
    from ..core.notebook import NotebookError
    from ..learner.history import exercise

    a = Assignment(key)
    try:
        parts = list(exercise(a).parts)
        tree = ast.parse(a.hidden_tests.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, NotebookError):
        return [], []
    checks = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name.startswith("test_")]
    return parts, checks


def _gradescope_checks(check: _Checker, value, where: str, key: str) -> dict:
    if not isinstance(value, dict):
        raise check.fail(where, "must be a table of parts or checks and their visibility, e.g. "
                                f"{{ softmax = \"visible\" }}, not {_kind(value)}")
    parts, checks = gradescope_names(key) if value else ([], [])
    out = {}
    for name, visibility in value.items():
        at = _join(where, safe(name, 100))
        if name not in parts and name not in checks:
            close = difflib.get_close_matches(name, parts + checks, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close else
                    f"its parts: {', '.join(parts)}" if parts else "it has none this course can read")
            raise check.fail(at, f"is not a part or check of {key} ({hint})")
        out[name] = check.choice(visibility, at, VISIBILITIES)
    return out


def _read_text(check: _Checker, path: Path, where: str, limit: int, encoding: str, name: str = "",
               too_big: str = "") -> str:
    """The text of the file `path` (at most `limit` bytes, in `encoding`), or a ConfigError at `where` that
    starts with `name` (the file's name where the error is not about the configuration file itself)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise check.fail(where, f"{'cannot read ' + name if name else 'cannot be read '}({exc.strerror or exc})") from None
    if len(data) > limit:
        raise check.fail(where, f"{name}is over {limit >> 20} MiB{too_big}")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise check.fail(where, f"{name}is not UTF-8 text") from None


def _roster(check: _Checker, value) -> dict:
    name = check.string(value, "lms.roster", 1000)
    path = (check.path.parent / name) if check.path else Path(name)
    text = _read_text(check, path, "lms.roster", ROSTER_BYTES, "utf-8-sig", f"{safe(str(path), 300)} ")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fields = reader.fieldnames or []
    if "student_id" not in fields:
        raise check.fail("lms.roster", f"{safe(str(path), 300)} needs a header row with a student_id column "
                                       "(student_id,name,...)")
    roster, seen = {}, set()
    try:
        for line, row in enumerate(reader, start=2):
            if None in row:
                raise check.fail("lms.roster", f"{safe(str(path), 300)} line {line} has more cells than the header")
            sid = (row.get("student_id") or "").strip()
            problem = student_id_problem(sid)
            if problem:
                raise check.fail("lms.roster", f"{safe(str(path), 300)} line {line}: {problem}")
            if sid.lower() in seen:  # ids that differ only in case are one learner (as in `grade`)
                raise check.fail("lms.roster", f"{safe(str(path), 300)} line {line}: student {sid} is listed twice")
            seen.add(sid.lower())
            roster[sid] = {k: (v or "") for k, v in row.items()}
    except csv.Error as exc:
        raise check.fail("lms.roster", f"{safe(str(path), 300)} is not a CSV file ({exc})") from None
    return roster


# --- loading ------------------------------------------------------------------------------

def parse_config(text: str, path: Path, course_keys: list[str] | None = None) -> CourseConfig:
    """The configuration written in `text` (read from `path`); ConfigError when it breaks a rule.
    `course_keys`: the exercises of the course (default: every exercise with a master)."""
    check = _Checker(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise check.fail("", f"is not valid TOML: {exc}") from None
    check.table(data, "", TOP_KEYS, "the file")

    course = check.table(data.get("course", {}), "course", COURSE_KEYS, "timezone")
    timezone = _timezone(check, course["timezone"]) if "timezone" in course else "UTC"
    zone = ZoneInfo(timezone)
    late = _late(check, data["late"], "late") if "late" in data else LatePolicy()

    lms_table = check.table(data.get("lms", {}), "lms", LMS_KEYS, "canvas_id_column, moodle_id_field, roster")
    lms = LmsSettings(
        canvas_id_column=check.choice(lms_table.get("canvas_id_column", DEFAULT_CANVAS_ID_COLUMN),
                                      "lms.canvas_id_column", CANVAS_ID_COLUMNS),
        moodle_id_field=check.choice(lms_table.get("moodle_id_field", DEFAULT_MOODLE_ID_FIELD),
                                     "lms.moodle_id_field", MOODLE_ID_FIELDS),
        roster=_roster(check, lms_table["roster"]) if "roster" in lms_table else {})
    gradescope = check.table(data.get("gradescope", {}), "gradescope", GRADESCOPE_KEYS, "visibility")
    visibility = check.choice(gradescope.get("visibility", "visible"), "gradescope.visibility", VISIBILITIES)

    if course_keys is None:
        from ..core.assignments import all_assignments

        course_keys = [a.key for a in all_assignments()]
    table = data.get("assignments", {})
    if not isinstance(table, dict):
        raise check.fail("assignments", f"must be a table of exercises ([assignments.03_qkv]), not {_kind(table)}")
    assignments = {}
    for key, value in table.items():
        where = f"assignments.{key}"
        if key not in course_keys:
            close = difflib.get_close_matches(key, course_keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(course_keys) or 'none'}"
            raise check.fail(where, f"{safe(key, 100)!r} is not an exercise of the course ({hint})")
        entry = check.table(value, where, ASSIGNMENT_KEYS, "due, late, canvas_column, moodle_item, "
                                                           "gradescope_visibility, gradescope_checks")
        assignments[key] = AssignmentSettings(
            key=key,
            due=_due(check, entry["due"], f"{where}.due", zone) if "due" in entry else None,
            late=_late(check, entry["late"], f"{where}.late") if "late" in entry else late,
            canvas_column=check.string(entry["canvas_column"], f"{where}.canvas_column")
            if "canvas_column" in entry else None,
            moodle_item=check.string(entry["moodle_item"], f"{where}.moodle_item") if "moodle_item" in entry else None,
            timezone=timezone,
            gradescope_visibility=check.choice(entry["gradescope_visibility"], f"{where}.gradescope_visibility",
                                               VISIBILITIES) if "gradescope_visibility" in entry else visibility,
            gradescope_checks=_gradescope_checks(check, entry["gradescope_checks"], f"{where}.gradescope_checks",
                                                 key) if "gradescope_checks" in entry else {})
    return CourseConfig(path=path, timezone=timezone, lms=lms, late=late, assignments=assignments,
                        gradescope_visibility=visibility)


def load_config(path: str | Path | None, out: Path | None = None) -> CourseConfig:
    """The configuration in `path`; with None, OUT/course.toml when there is one, else the empty
    configuration (no due dates: `CourseConfig.note` says so). ConfigError when it cannot be used."""
    if path is None:
        if out is None or not (Path(out) / FILE_NAME).is_file():
            return CourseConfig()
        path = Path(out) / FILE_NAME
    path = Path(path)
    check = _Checker(path)
    text = _read_text(check, path, "", CONFIG_BYTES, "utf-8", "", ": not a course configuration")
    return parse_config(text, path)


__all__ = ["ConfigError", "LatePolicy", "AssignmentSettings", "LmsSettings", "CourseConfig", "load_config",
           "parse_config", "POLICIES", "CANVAS_ID_COLUMNS", "MOODLE_ID_FIELDS", "FILE_NAME", "VISIBILITIES",
           "gradescope_names"]
