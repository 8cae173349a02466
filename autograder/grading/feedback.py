"""What a learner and an instructor read: the text report of `check` and the feedback page.

Both show points, check titles and hints; never hidden test code, inputs or expected values.
Learner text in a result (messages, grade ids, notes, paths) is capped and made visible by
`bounded` before anything is written (see autograder/core/text.py); the page escapes it for HTML.
"""

from __future__ import annotations

import dataclasses
import html
import json

from ..core.limits import DEFAULT, Limits
from ..core.text import safe, safe_list
from .grader import GRADED, GRADER_ERROR, Result


def _num(x: float) -> str:
    return f"{x:g}"


def _bounded_once(result: Result, limits: Limits) -> Result:
    checks = [dataclasses.replace(c, title=safe(c.title, limits.hint_chars), hint=safe(c.hint, limits.hint_chars),
                                  name=safe(c.name, 200), part=safe(c.part, 200), stub=safe(c.stub, 200),
                                  missing=safe(c.missing, 200)) for c in result.checks]
    # A list already cut to `notes` items keeps its own last line ("… N more ..."): notes + 1.
    notes = result.notes if len(result.notes) <= limits.notes + 1 else result.notes[: limits.notes] + [
        f"… {len(result.notes) - limits.notes:,} more notes"]
    return dataclasses.replace(
        result, assignment=safe(result.assignment, 100), notebook=safe(result.notebook, limits.path_chars),
        student=safe(result.student, 100), status=safe(result.status, 40), error=safe(result.error, limits.error_chars),
        checks=checks, notes=[safe(n, limits.note_chars) for n in notes])


def _size(result: Result) -> int:
    """An upper bound of the bytes `result` takes in JSON (ASCII-escaped) or on the feedback page."""
    d = result.to_dict()
    return max(len(json.dumps(d)), len(html.escape(json.dumps(d, ensure_ascii=False)).encode()))


def bounded(result: Result, limits: Limits = DEFAULT) -> Result:
    """A copy of `result` whose every text is capped and free of control characters, small enough
    to write anywhere: with its flags, its results file and its feedback page stay under
    `limits.result_bytes` (64 KiB are kept for flags, indentation and the page's template; hints,
    notes and the reason are cut harder if characters that JSON or HTML escape to many bytes
    would make it larger)."""
    out = _bounded_once(result, limits)
    budget = limits.result_bytes - 64 * 1024
    while _size(out) > budget and limits.hint_chars > 40:
        limits = limits.replace(hint_chars=max(limits.hint_chars // 4, 40), note_chars=max(limits.note_chars // 4, 40),
                                error_chars=max(limits.error_chars // 4, 100), notes=max(limits.notes // 4, 2))
        out = _bounded_once(out, limits)
    return out


def bounded_flags(flags, limits: Limits = DEFAULT) -> list[str]:
    """The reasons a submission is flagged, as shown: at most `limits.flags`, then a count (a list
    already cut to `flags` items keeps its own last line)."""
    flags = list(flags)
    if len(flags) <= limits.flags + 1:
        return [safe(f, limits.path_chars + 200) for f in flags]
    return safe_list(flags, limits.flags, limits.path_chars + 200, "more reasons")


def hint_groups(checks) -> list[tuple[str, list]]:
    """The failed checks of `checks` grouped by their hint, in the order each hint first appears: one
    mistake that fails many checks (a missing 1/sqrt(d_k) fails every check of attention) is said once,
    under the checks it covers."""
    groups: dict[str, list] = {}
    for c in checks:
        if not c.passed:
            groups.setdefault(c.hint, []).append(c)
    return list(groups.items())


def _names(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def not_checked(result: Result, part_titles: dict | None = None, unrun=()) -> list[str]:
    """What the report could not check, one sentence each: the parts not attempted yet (every check
    of the part stopped at a definition that still raises NotImplementedError), then each definition
    the notebook lacks. `part_titles` names a part as the notebook does ("Part 3 (attention in
    PyTorch)"); parts under one heading share a line. `unrun`: the names that the notebook defines
    and a kernel has not run (check() in a notebook): those missing are said together, as cells to
    run, not as definitions to write."""
    titles = part_titles or {}
    stubs: dict[str, list[str]] = {}  # the heading of a part not attempted -> its stubs
    for part in result.parts:
        checks = [c for c in result.checks if c.part == part]
        if checks and all(not c.passed and c.stub for c in checks):
            names = stubs.setdefault(titles.get(part, part), [])
            for c in checks:
                if c.stub not in names:
                    names.append(c.stub)
    lines = [f"Not checked yet: {title}: {_names(names)} still "
             f"{'raises' if len(names) == 1 else 'raise'} NotImplementedError." for title, names in stubs.items()]
    missing: dict[str, list[str]] = {}  # a missing name -> the parts that need it
    for c in result.checks:
        if c.missing:
            where = missing.setdefault(c.missing, [])
            title = titles.get(c.part, c.part)
            if title not in where:
                where.append(title)
    unrun = set(unrun)
    lines += [f"Not checked: `{name}` is not defined in your notebook (needed by {', '.join(where)}); "
              "check its name, and that its cell ran without an error." for name, where in missing.items()
              if name not in unrun]
    not_run = [name for name in missing if name in unrun]
    if not_run:
        where = list(dict.fromkeys(w for name in not_run for w in missing[name]))
        one = len(not_run) == 1
        lines.append(f"Not checked: {_names(not_run)} (needed by {', '.join(where)}) {'is' if one else 'are'} in "
                     f"your notebook but {'has' if one else 'have'} not run in this kernel: run "
                     f"{'its cell' if one else 'their cells'} (Run All stops at the first cell that fails: fix or "
                     "skip that cell, then run the cells below it).")
    return lines


def format_text(result: Result, with_student: bool = False, limits: Limits = DEFAULT, *,
                part_titles: dict | None = None, replay: str | None = None, unrun=()) -> str:
    """The text report of `check` (and of `check()` in a notebook). `part_titles`: part -> how the
    notebook names it, for the lines on what could not be checked; `replay`: how to replay the
    checks' seed (default: the command line's `--seed S`); `unrun`: see `not_checked`."""
    result = bounded(result, limits)
    lines = []
    who = f" ({result.student})" if with_student and result.student else ""
    lines.append(f"Exercise {result.assignment}{who}: {result.notebook}")
    if result.status not in (GRADED, GRADER_ERROR):
        lines.append(f"  NOT GRADED: {result.error}")
        return "\n".join(lines)
    width = max([len(p) for p in result.parts] + [10])
    for part, s in result.parts.items():
        lines.append(f"  {safe(part, 100):<{width}}  {_num(s['score'])} / {_num(s['max_score'])}")
        # a hint the part's checks repeat (a GPU asked for, a missing scale) is said once, under its checks
        for hint, checks in hint_groups(c for c in result.checks if c.part == part):
            for c in checks:
                lines.append(f"      x {c.title} (0 / {_num(c.max_points)})")
            if hint and not checks[0].missing:  # a missing definition is said once, under "Not checked"
                lines.append(f"        hint{f' (the {len(checks)} checks above)' if len(checks) > 1 else ''}: {hint}")
    lines.append(f"  {'total':<{width}}  {_num(result.score)} / {_num(result.max_score)}")
    lines += [f"  {line}" for line in not_checked(result, part_titles, unrun)]
    if result.status == GRADER_ERROR:
        lines.append(f"  GRADER ERROR: {result.error}")
    for note in result.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  (checks seeded with {result.seed}; {replay or f'`--seed {result.seed}`'} replays them)")
    return "\n".join(lines)


def final_scores(result: Result, grades: dict | None) -> tuple[float, dict[str, str]]:
    """The score a learner is given (the gradebook's: an instructor's manual score replaces the grader's
    for its part) and, per part the instructor scored, the line that says so. `grades`:
    `gradebook.part_grades` (None: the grader's scores stand)."""
    if not grades:
        return result.score, {}
    total, said = 0.0, {}
    for part, s in result.parts.items():
        g = grades.get(part)
        if g is None or g.get("manual") is None:
            total += float(s["score"])
            continue
        total += float(g["score"])
        said[part] = f"set by your instructor: {_num(g['manual'])} (automatic: {_num(s['score'])})"
    return round(total, 4), said


def feedback_html(result: Result, flags=(), limits: Limits = DEFAULT, grades: dict | None = None,
                  late=None, comments: dict | None = None) -> str:
    """The learner's feedback page; `flags` are reasons the instructor will look at this submission;
    `grades` (`gradebook.part_grades`) brings the instructor's manual scores; `late`
    (`deadlines.Lateness`) the due date's sentence and the points it takes off; `comments`
    (`gradebook.part_comments`: part -> the instructor's comments, "" for those of no part) go under
    their part, the others below the table."""
    result = bounded(result, limits)
    flags = bounded_flags(flags, limits)
    comments = {str(k): [str(t) for t in v] for k, v in (comments or {}).items()}
    unplaced = [t for part, texts in comments.items() if part not in result.parts for t in texts]
    score, manual = final_scores(result, grades)
    penalty = float(late.penalty) if late is not None else 0.0
    score = round(max(0.0, score - penalty), 4)
    lateness = ""
    if late is not None and late.explanation:
        points = f" ({_num(round(penalty, 4))} points off)" if penalty else ""
        lateness = f"<p class='late'>{html.escape(late.explanation)}{points}</p>\n"

    def e(text) -> str:
        return html.escape(str(text), quote=True)

    rows = []
    for part, s in result.parts.items():
        shown = (f"{_num(grades[part]['score'])} / {_num(s['max_score'])}<div class='manual'>{e(manual[part])}</div>"
                 if part in manual else f"{_num(s['score'])} / {_num(s['max_score'])}")
        rows.append(f"<tr class='part'><th>{e(safe(part, 100))}</th><th>{shown}</th></tr>")
        rows += [f"<tr class='comment'><td colspan='2'><b>Your instructor:</b> <span class='said'>{e(text)}</span>"
                 "</td></tr>" for text in comments.get(part, ())]
        first = {}  # a hint -> the title of the part's first check that gives it: the others point to it
        for c in result.checks:
            if c.part != part:
                continue
            mark = "&#10003;" if c.passed else ("?" if c.grader_error else "&#10007;")
            hint = ""
            if not c.passed and c.hint in first:
                hint = f"<div class='hint'>The same hint as &ldquo;{e(first[c.hint])}&rdquo;.</div>"
            elif not c.passed:
                first[c.hint] = c.title
                hint = f"<div class='hint'>{e(c.hint)}</div>"
            rows.append(f"<tr><td>{mark} {e(c.title)}{hint}</td>"
                        f"<td>{_num(c.points)} / {_num(c.max_points)}</td></tr>")
    notes = "".join(f"<li>{e(n)}</li>" for n in result.notes)
    status = ""
    if result.status == GRADER_ERROR:
        status = ("<p class='error'>Some checks could not be run because of a fault in the grader, not in your "
                  "notebook; your instructor will regrade it.</p>")
    elif result.status != GRADED:
        status = f"<p class='error'>Not graded: {e(result.error)}</p>"
    if flags:
        status += ("<p class='error'>Your instructor will look at this submission: "
                   + "; ".join(e(f) for f in flags) + "</p>")
    said = "".join(f"<p class='said'>{e(t)}</p>" for t in unplaced)
    said = f"<h2>Comments from your instructor</h2>{said}" if said else ""
    seed = "" if result.seed is None else f"<p class='seed'>Checks seeded with {e(result.seed)}.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Feedback: {e(result.assignment)} ({e(result.student)})</title>
<style>body{{font-family:sans-serif;max-width:50em;margin:2em auto}}td,th{{padding:.3em .6em;text-align:left;vertical-align:top}}
tr.part th{{background:#eee}}.hint{{color:#8a3b00;margin-top:.2em}}.error{{color:#a00}}.seed{{color:#666;font-size:small}}
.manual{{font-weight:normal;font-size:small}}.said{{white-space:pre-wrap}}tr.comment td{{background:#f4f8ff}}</style></head>
<body><h1>Exercise {e(result.assignment)}</h1>
<p>Learner: <b>{e(result.student)}</b>. Score: <b>{_num(score)} / {_num(result.max_score)}</b></p>
{lateness}{status}<table>{''.join(rows)}</table>
{said}{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}
{seed}
</body></html>
"""
