"""When a notebook was handed in, and what the course's late policy makes of it.

`submission_time` reads nbgrader's ``timestamp.txt`` beside the notebook (written by the
learner's own ``nbgrader submit``, so it can be forged: it is read like every learner file,
bounded and without following a link, and a time that cannot be one, in the future or
before 2000, is refused); when it is absent or refused, the notebook's file time is the
submission time, and the reason is noted.

`assess` applies an exercise's `course_config.LatePolicy` to a score:

* ``none``: lateness is recorded, nothing is taken off;
* ``zero``: late work gets no credit;
* ``per_hour`` / ``per_day``: PENALTY percent of the maximum score per started hour (day)
  after the due date;
* ``cutoff_after``: later than that after the due date, no credit whatever the policy.

Late by at most the grace period counts as on time (the started hours or days of a late
submission are counted from the due date, not from the end of the grace period). The
penalty never takes a score below 0. `late_for` does the same from a saved result file, so
that `export` applies the configuration of the day (a due date moved after grading).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from ..core.regular_file import ERROR, LINK, read_regular
from ..core.text import safe

TIMESTAMP_FILE = "timestamp.txt"
TIMESTAMP_BYTES = 200
FROM_TIMESTAMP, FROM_FILE_TIME = "timestamp.txt", "file time"
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
FUTURE_SLACK = dt.timedelta(minutes=5)  # clocks of the exchange and of this machine may differ a little
UTC_NAMES = {"UTC", "GMT", "Z", "UT"}
# Abbreviations that `strftime("%Z")` writes (nbgrader's exchange in a zone other than UTC) and that are no
# IANA key; only unambiguous ones (not BST, IST, CST): hours east of UTC.
ABBREVIATIONS = {"CEST": 2, "EEST": 3, "WEST": 1, "MSK": 3, "EDT": -4, "CDT": -5, "MDT": -6, "PDT": -7,
                 "AKDT": -8, "AKST": -9, "HST": -10, "AEST": 10, "AEDT": 11, "ACST": 9.5, "ACDT": 10.5,
                 "AWST": 8, "NZST": 12, "NZDT": 13, "JST": 9, "KST": 9, "SGT": 8}

_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d(?::\d\d(?:\.\d{1,6})?)?)"
                    r"\s*(Z|[+-]\d\d:?\d\d|[A-Za-z][A-Za-z0-9_+/-]{0,40})?")


def parse_timestamp(text: str) -> dt.datetime:
    """The aware UTC time `text` names, in the forms nbgrader writes and reads (`nbgrader.utils.parse_utc`):
    "2026-12-01 15:31:15.123456 UTC", ISO 8601 with an offset ("2026-12-01T15:31:15+01:00", "...Z"), a zone
    name that is an IANA key ("Europe/Berlin", "CET"); without a zone it is UTC, as nbgrader takes it.
    ValueError (one phrase) when it is none of these, and for any other failure: `text` is a learner's
    bytes (a time at the edge of the representable range overflows when it is moved to UTC)."""
    try:
        return _parse_timestamp(text)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - OverflowError and whatever else the calendar raises
        raise ValueError(f"is not a time this grader can represent ({type(exc).__name__})") from None


def file_time(mtime: float | None, now: dt.datetime | None = None) -> dt.datetime:
    """The aware UTC time of a file time (`st_mtime`), or `now` where there is none or it is out of the
    calendar's range (a learner's archive can carry any file time)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if mtime is None:
        return now
    try:
        return dt.datetime.fromtimestamp(mtime, dt.timezone.utc)
    except (OverflowError, OSError, ValueError, TypeError):
        return now


def _parse_timestamp(text: str) -> dt.datetime:
    m = _STAMP.fullmatch(text.strip())
    if not m:
        raise ValueError("is not a date and time")
    day, clock, zone = m.groups()
    try:
        naive = dt.datetime.fromisoformat(f"{day}T{clock}")
    except ValueError:
        raise ValueError("is not a valid date and time") from None
    if zone is None or zone.upper() in UTC_NAMES:
        return naive.replace(tzinfo=dt.timezone.utc)
    if zone[0] in "+-":
        digits = zone[1:].replace(":", "")
        offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        if offset > dt.timedelta(hours=18):
            raise ValueError("has an offset of more than 18 hours")
        tz = dt.timezone(offset if zone[0] == "+" else -offset)
        return naive.replace(tzinfo=tz).astimezone(dt.timezone.utc)
    if zone.upper() in ABBREVIATIONS:
        tz = dt.timezone(dt.timedelta(hours=ABBREVIATIONS[zone.upper()]))
        return naive.replace(tzinfo=tz).astimezone(dt.timezone.utc)
    if zone not in available_timezones():
        raise ValueError(f"names a time zone we do not know ({safe(zone, 40)})")
    try:
        return naive.replace(tzinfo=ZoneInfo(zone)).astimezone(dt.timezone.utc)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"names a time zone we do not know ({safe(zone, 40)})") from None


def _timestamp_parts(notebook_path: Path, base: Path | None) -> tuple[Path, tuple] | None:
    """(trusted folder, parts below it) of the timestamp.txt that belongs to this notebook, or None.

    nbgrader's layout DIR/STUDENT/KEY/KEY.ipynb keeps it in DIR/STUDENT/KEY/; the one-folder-per-student
    layout DIR/STUDENT/KEY.ipynb in DIR/STUDENT/. A flat DIR/STUDENT.ipynb has none (a DIR/timestamp.txt
    would be everyone's)."""
    notebook_path = Path(notebook_path)
    if base is None:
        return notebook_path.parent, (TIMESTAMP_FILE,)
    try:
        rel = notebook_path.relative_to(base).parts
    except ValueError:
        return None
    if len(rel) < 2:
        return None
    return Path(base), (*rel[:-1], TIMESTAMP_FILE)


def submission_time(notebook_path: Path, mtime: float | None, *, base: Path | None = None,
                    notes: list | None = None, now: dt.datetime | None = None) -> tuple[dt.datetime, str]:
    """(when, from where): the time in nbgrader's timestamp.txt beside the notebook (aware UTC,
    "timestamp.txt"), else the notebook's file time `mtime` ("file time").

    `base`: the folder the submissions were found in, trusted; nothing below it is followed if a
    link (without it, the notebook's own folder). Why a timestamp.txt that is there was not used
    is appended to `notes` (a phrase for the instructor); its absence is no note."""
    now = now or dt.datetime.now(dt.timezone.utc)
    when_file = file_time(mtime, now)
    try:
        problem = _timestamp_problem(notebook_path, base, now)
    except Exception as exc:  # noqa: BLE001 - a learner's file: whatever goes wrong, the file time is used
        problem = f"could not be read ({type(exc).__name__})"
    if isinstance(problem, dt.datetime):
        return problem, FROM_TIMESTAMP
    if problem and notes is not None:
        notes.append(f"{TIMESTAMP_FILE} {problem}: the file time is the submission time")
    return when_file, FROM_FILE_TIME


def _timestamp_problem(notebook_path, base, now: dt.datetime):
    """The time in the notebook's timestamp.txt, or why it was not used ("": there is none)."""
    where = _timestamp_parts(Path(notebook_path), base)
    if where is None:
        return ""
    got = read_regular(where[0], where[1], TIMESTAMP_BYTES)
    problem = ""
    if got.refused == ERROR:
        if "No such file" not in got.strerror:
            problem = f"could not be read ({got.strerror})"
    elif got.refused == LINK:
        problem = "is a symbolic link, or lies under one (never followed)"
    elif got.refused:
        problem = f"is not a regular file (a {got.refused})"
    elif got.over(TIMESTAMP_BYTES):
        problem = f"is over {TIMESTAMP_BYTES} bytes"
    else:
        try:
            text = got.data.decode("utf-8")
            when = parse_timestamp(text)
        except UnicodeDecodeError:
            problem = "is not UTF-8 text"
        except ValueError as exc:
            problem = f"{safe(got.data.decode('utf-8', 'replace').strip(), 60)!r} {exc}"
        else:
            if when > now + FUTURE_SLACK:
                problem = f"says {when:%Y-%m-%d %H:%M} UTC, which is in the future"
            elif when < EARLIEST:
                problem = f"says {when:%Y-%m-%d %H:%M} UTC, which is before 2000"
            else:
                return when
    return problem


# --- the late policy ----------------------------------------------------------------------

@dataclass
class Lateness:
    submitted: dt.datetime | None       # aware UTC (None: not known)
    source: str                         # FROM_TIMESTAMP | FROM_FILE_TIME | ""
    due: dt.datetime | None             # aware
    seconds_late: float = 0.0           # 0 when on time (or within the grace period)
    penalty: float = 0.0                # points taken off (never more than the score)
    zeroed: bool = False                # no credit (policy "zero", or past the cutoff)
    explanation: str = ""               # one sentence for the learner ("" without a due date)

    @property
    def late(self) -> bool:
        return self.seconds_late > 0

    def to_dict(self) -> dict:
        return {"submitted_at": iso_utc(self.submitted), "submitted_from": self.source,
                "due": iso_utc(self.due), "seconds_late": round(self.seconds_late, 3),
                "late_penalty": round(self.penalty, 4), "zeroed": self.zeroed, "explanation": self.explanation}


def iso_utc(when: dt.datetime | None) -> str:
    """ISO 8601 in UTC with a Z ("" for None)."""
    if when is None:
        return ""
    return when.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """'1 day 3 hours', '2 hours 5 minutes', '12 minutes', 'less than a minute': the two largest units."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "less than a minute"
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    units = [(days, "day"), (hours, "hour"), (mins, "minute")]
    first = next(i for i, (n, _) in enumerate(units) if n)
    shown = [f"{n} {u}{'s' if n != 1 else ''}" for n, u in units[first:first + 2] if n]
    return " ".join(shown)


def _show_due(due: dt.datetime, timezone: str) -> str:
    try:
        local = due.astimezone(ZoneInfo(timezone))
    except (ZoneInfoNotFoundError, ValueError):
        local = due
    return f"{local:%Y-%m-%d %H:%M} {local.tzname() or ''}".strip()


def _pct(x: float) -> str:
    return f"{x:.4g}"


def assess(settings, submitted: dt.datetime | None, source: str, score: float, max_score: float) -> Lateness:
    """The lateness of a submission of the exercise `settings` (`course_config.AssignmentSettings`)
    handed in at `submitted`, and the points its policy takes off a score of `score` out of `max_score`."""
    due = settings.due
    result = Lateness(submitted, source, due)
    if due is None or submitted is None:
        return result
    policy = settings.late
    shown = _show_due(due, getattr(settings, "timezone", "UTC"))
    # In UTC: Python subtracts two times of one zone by their wall clocks, which is an hour off across a
    # change of daylight saving time.
    late = (submitted.astimezone(dt.timezone.utc) - due.astimezone(dt.timezone.utc)).total_seconds()
    if late <= 0:
        result.explanation = f"Handed in on time (due {shown})."
        return result
    if late <= policy.grace.total_seconds():
        result.explanation = (f"Handed in {duration(late)} after the due date ({shown}), within the grace period "
                              f"of {duration(policy.grace.total_seconds())}: on time.")
        return result
    result.seconds_late = late
    head = f"Handed in {duration(late)} after the due date ({shown})"
    score = max(float(score), 0.0)
    if policy.cutoff_after is not None and late > policy.cutoff_after.total_seconds():
        result.zeroed, result.penalty = True, score
        result.explanation = f"{head}: no credit (later than {duration(policy.cutoff_after.total_seconds())} after it)."
    elif policy.policy == "zero":
        result.zeroed, result.penalty = True, score
        result.explanation = f"{head}: no credit (late work gets none in this course)."
    elif policy.policy in ("per_hour", "per_day"):
        unit = 3600 if policy.policy == "per_hour" else 86400
        started = math.ceil(late / unit)
        percent = min(100.0, started * policy.penalty_percent)
        result.penalty = min(score, percent / 100 * float(max_score))
        result.zeroed = result.penalty >= score and score > 0
        word = "hour" if unit == 3600 else "day"
        result.explanation = f"{head}: -{_pct(percent)} % ({_pct(policy.penalty_percent)} % per started {word})."
    else:
        result.explanation = f"{head}: no penalty in this course."
    return result


def from_iso(text) -> dt.datetime | None:
    """The aware time of an ISO 8601 text (`iso_utc`'s), or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def late_for(config, key: str, result: dict, score: float | None = None) -> Lateness:
    """The lateness of a saved result (OUT/results/KEY/STUDENT.json: its submitted_at and submitted_from)
    under the configuration `config` of now; `score` is the score before the penalty (default: the
    result's), e.g. the instructor's manual score."""
    submitted = from_iso(result.get("submitted_at"))
    source = result.get("submitted_from") if isinstance(result.get("submitted_from"), str) else ""
    raw = score if score is not None else result.get("score", 0)
    raw = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 0.0
    top = result.get("max_score", 0)
    top = float(top) if isinstance(top, (int, float)) and not isinstance(top, bool) else 0.0
    return assess(config.assignment(key), submitted, source, raw, top)


__all__ = ["submission_time", "parse_timestamp", "file_time", "Lateness", "assess", "late_for", "iso_utc", "from_iso",
           "duration", "FROM_TIMESTAMP", "FROM_FILE_TIME", "TIMESTAMP_FILE"]
