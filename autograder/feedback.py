"""What a learner and an instructor read: the text report of `check` and the feedback page.

Both show points, check titles and hints; never hidden test code, inputs or expected values.
"""

from __future__ import annotations

import html

from .grader import GRADED, GRADER_ERROR, Result


def _num(x: float) -> str:
    return f"{x:g}"


def format_text(result: Result, with_student: bool = False) -> str:
    lines = []
    who = f" ({result.student})" if with_student and result.student else ""
    lines.append(f"Exercise {result.assignment}{who}: {result.notebook}")
    if result.status not in (GRADED, GRADER_ERROR):
        lines.append(f"  NOT GRADED: {result.error}")
        return "\n".join(lines)
    width = max([len(p) for p in result.parts] + [10])
    for part, s in result.parts.items():
        lines.append(f"  {part:<{width}}  {_num(s['score'])} / {_num(s['max_score'])}")
        for c in result.checks:
            if c.part == part and not c.passed:
                lines.append(f"      x {c.title} (0 / {_num(c.max_points)})")
                lines.append(f"        hint: {c.hint}")
    lines.append(f"  {'total':<{width}}  {_num(result.score)} / {_num(result.max_score)}")
    if result.status == GRADER_ERROR:
        lines.append(f"  GRADER ERROR: {result.error}")
    for note in result.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  (checks seeded with {result.seed}; `--seed {result.seed}` replays them)")
    return "\n".join(lines)


def feedback_html(result: Result) -> str:
    """The learner's feedback page."""
    e = html.escape
    rows = []
    for part, s in result.parts.items():
        rows.append(f"<tr class='part'><th>{e(part)}</th><th>{_num(s['score'])} / {_num(s['max_score'])}</th></tr>")
        for c in result.checks:
            if c.part != part:
                continue
            mark = "&#10003;" if c.passed else ("?" if c.grader_error else "&#10007;")
            hint = "" if c.passed else f"<div class='hint'>{e(c.hint)}</div>"
            rows.append(f"<tr><td>{mark} {e(c.title)}{hint}</td><td>{_num(c.points)} / {_num(c.max_points)}</td></tr>")
    notes = "".join(f"<li>{e(n)}</li>" for n in result.notes)
    status = ""
    if result.status == GRADER_ERROR:
        status = ("<p class='error'>Some checks could not be run because of a fault in the grader, not in your "
                  "notebook; your instructor will regrade it.</p>")
    elif result.status != GRADED:
        status = f"<p class='error'>Not graded: {e(result.error)}</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Feedback: {e(result.assignment)} ({e(result.student)})</title>
<style>body{{font-family:sans-serif;max-width:50em;margin:2em auto}}td,th{{padding:.3em .6em;text-align:left;vertical-align:top}}
tr.part th{{background:#eee}}.hint{{color:#8a3b00;margin-top:.2em}}.error{{color:#a00}}.seed{{color:#666;font-size:small}}</style></head>
<body><h1>Exercise {e(result.assignment)}</h1>
<p>Learner: <b>{e(result.student)}</b>. Score: <b>{_num(result.score)} / {_num(result.max_score)}</b></p>
{status}<table>{''.join(rows)}</table>
{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}
<p class='seed'>Checks seeded with {result.seed}.</p>
</body></html>
"""
