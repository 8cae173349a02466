"""Every sentence of an exercise's spec next to the hidden checks that test it.

A master (`exercises/source/KEY.md`) states what the learner's code must do in prose; the hidden
checks (`autograder/hidden/test_KEY.py`) test it. A sentence that no check tests is a promise
the grade does not keep: a learner who ignores it loses nothing. This module holds the two
together through one file beside the master, `exercises/source/KEY.spec.toml`:

    [[sentence]]
    quote = "a negative temperature raises a `ValueError`"   # verbatim, whitespace runs as one space
    checks = ["test_sample_temperature_and_generator"]      # checks that fail when it is not done
                                                             # ("every call": the grader's rule that a call
                                                             # leaves its arguments as they were)

    [[sentence]]
    quote = "The model gives logits"
    none = "background"                                      # a sentence that asks nothing of the code

The master's text is its markdown outside code cells (headings, `+++` and comment lines left
out), split into sentences at list items and after `.`, `?` or `!` followed by a space and a
capital letter, a backtick or `$` (never inside a code span or math, never after "e.g.").
Every sentence must overlap a quote; every quote must occur once in that text; every check
must be a hidden check of the exercise. The shared instructions that every notebook carries
(`exercises/source/_instructions.md`) have their own file, `_instructions.spec.toml`, whose
checks may be any exercise's.

`python -m autograder.authoring.spec_table [KEY ...]` lists what breaks these rules (exit 1 if anything
does); `python -m autograder generate` writes each exercise's table as
`book/instructors/spec/KEY.md`, which the page "How strong are the hidden tests?" includes, and
`tests/authoring/test_spec_table.py` holds every exercise to the rules.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from autograder.core.assignments import ROOT, SOURCE, Assignment, all_assignments, get_assignment

INSTRUCTIONS = "_instructions"
# Not a check but every call: a function that changes an argument the grader passed fails the first
# check of the part that sees it (autograder/isolation/runner.py, ArgumentChanged).
EVERY_CALL = "every call"
TABLES = ROOT / "book" / "instructors" / "spec"
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_ITEM = re.compile(r"^\s*(?:[*+-]|\d+[.)])\s+")
_NO_SPLIT_AFTER = ("e.g.", "i.e.", "cf.", "vs.", "etc.)")


@dataclass
class Sentence:
    text: str
    start: int  # span in the whole normalised text
    end: int
    section: str  # the heading above it
    quotes: list = field(default_factory=list)  # indices of the quotes that overlap it


@dataclass
class Report:
    key: str
    sentences: list
    quotes: list  # the TOML's [[sentence]] tables
    problems: list

    @property
    def untested(self) -> list:
        return [s for s in self.sentences if not s.quotes]


def spec_file(key: str) -> Path:
    return SOURCE / f"{key}.spec.toml"


def _master(key: str) -> Path:
    return SOURCE / f"{INSTRUCTIONS}.md" if key == INSTRUCTIONS else get_assignment(key).master


def _units(markdown: str):
    """(section heading, paragraph or list item) of the prose, in order, as raw text."""
    lines = markdown.splitlines()
    if lines and lines[0].strip() == "---":  # front matter
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
        lines = lines[end + 1:]
    section, unit, fence = "", [], None
    for line in lines:
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        m = _FENCE.match(stripped)
        if m:
            fence = m.group(1)
            if unit:
                yield section, " ".join(unit)
                unit = []
            continue
        heading = stripped.startswith("#")
        if heading or not stripped or stripped == "+++" or stripped.startswith("<!--"):
            if unit:
                yield section, " ".join(unit)
                unit = []
            if heading:
                section = stripped.lstrip("#").strip()
            continue
        if _ITEM.match(line) and unit:
            yield section, " ".join(unit)
            unit = []
        unit.append(_ITEM.sub("", line, count=1) if not unit else stripped)
    if unit:
        yield section, " ".join(unit)


def _split(text: str) -> list[tuple[int, int]]:
    """Sentence spans of one whitespace-normalised unit."""
    spans, start, code, math = [], 0, False, False
    for i, ch in enumerate(text):
        if ch == "`" and not math:
            code = not code
        elif ch == "$" and not code:
            math = not math
        elif ch in ".?!" and not code and not math and text[i + 1:i + 2] == " " and i + 2 < len(text):
            nxt = text[i + 2]
            if (nxt.isupper() or nxt in "`$") and not any(text[:i + 1].endswith(a) for a in _NO_SPLIT_AFTER):
                spans.append((start, i + 1))
                start = i + 2
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def normalise(text: str) -> str:
    return " ".join(text.split())


def sentences(markdown: str) -> tuple[str, list[Sentence]]:
    """The whole normalised prose and its sentences."""
    whole, out = "", []
    for section, unit in _units(markdown):
        unit = normalise(unit)
        if not unit:
            continue
        if whole:
            whole += " "
        base = len(whole)
        whole += unit
        out += [Sentence(unit[a:b], base + a, base + b, section) for a, b in _split(unit)]
    return whole, out


def hidden_checks(key: str) -> dict[str, str]:
    """Check name -> title (its docstring's first paragraph) of one exercise, read without importing it."""
    tree = ast.parse(get_assignment(key).hidden_tests.read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            doc = ast.get_docstring(node) or ""
            out[node.name] = normalise(doc.split("\n\n")[0])
    return out


def _all_checks() -> dict[str, str]:
    out = {}
    for a in all_assignments():
        out.update(hidden_checks(a.key))
    return out


def match(markdown: str, quotes: list, known, name: str = "spec") -> tuple[list, list]:
    """The sentences of `markdown`, each with the indices of the `quotes` (the spec file's [[sentence]]
    tables) that overlap it, and the problems: a quote not found once, a check not in `known`, a
    sentence no quote covers."""
    whole, sents = sentences(markdown)
    problems = []
    for i, q in enumerate(quotes):
        text = normalise(str(q.get("quote", "")))
        checks, none = q.get("checks", []), q.get("none")
        label = f"{name}, quote {i + 1} ({text[:50]!r})"
        if not text:
            problems.append(f"{label}: no quote")
            continue
        if bool(checks) == bool(none):
            problems.append(f"{label}: give either checks = [...] or none = \"why\", not both or neither")
        for c in checks:
            if c not in known and c != EVERY_CALL:
                problems.append(f"{label}: {c} is not a hidden check of this exercise")
        n = whole.count(text)
        if n != 1:
            problems.append(f"{label}: occurs {n} times in the master's prose (must be once)")
            continue
        a = whole.index(text)
        for s in sents:
            if s.start < a + len(text) and a < s.end:
                s.quotes.append(i)
    problems += [f"untested sentence ({s.section}): {s.text}" for s in sents if not s.quotes]
    return sents, problems


def report(key: str) -> Report:
    """The sentences of KEY's master (or of the shared instructions), matched with its spec file."""
    markdown = _master(key).read_text(encoding="utf-8")
    path = spec_file(key)
    if not path.exists():
        return Report(key, sentences(markdown)[1], [], [f"{path.name} is missing"])
    try:
        quotes = tomllib.loads(path.read_text(encoding="utf-8")).get("sentence", [])
    except tomllib.TOMLDecodeError as e:
        return Report(key, sentences(markdown)[1], [], [f"{path.name}: {e}"])
    known = _all_checks() if key == INSTRUCTIONS else hidden_checks(key)
    sents, problems = match(markdown, quotes, known, path.name)
    return Report(key, sents, quotes, problems)


def _cell(text: str) -> str:
    """A sentence as one cell of a Markdown table: a display formula ($$...$$) inline, pipes escaped."""
    return text.replace("$$", "$").replace("|", "\\|")


def markdown(key: str) -> str:
    """The table of one exercise: each sentence and the checks that test it (or why none needs to)."""
    r = report(key)
    lines = [f"<!-- GENERATED from exercises/source/{key}.md and {key}.spec.toml by "
             "`python -m autograder generate`; do not edit. -->", "",
             "| sentence of the spec | tested by |", "|---|---|"]
    for s in r.sentences:
        checks, nones = [], []
        for i in s.quotes:
            q = r.quotes[i]
            checks += [c for c in q.get("checks", []) if c not in checks]
            if q.get("none"):
                nones.append(str(q["none"]))
        tested = ", ".join("every call of a function (it must not change its arguments)" if c == EVERY_CALL
                           else f"`{c}`" for c in checks) or ("*(asks nothing: " + "; ".join(dict.fromkeys(nones))
                                                            + ")*" if nones else "**untested**")
        lines.append(f"| {_cell(s.text)} | {_cell(tested)} |")
    counts = (f"{sum(1 for s in r.sentences if any(r.quotes[i].get('checks') for i in s.quotes))} of "
              f"{len(r.sentences)} sentences state a requirement with its checks; "
              f"{len(r.untested)} untested.")
    return "\n".join(lines[:2] + [counts, ""] + lines[2:]) + "\n"


def outputs(key: str) -> dict[Path, str]:
    """The generated table of one exercise, where it has a spec file."""
    return {TABLES / f"{key}.md": markdown(key)} if spec_file(key).exists() else {}


def main(argv: list[str] | None = None) -> int:
    keys = (argv if argv is not None else sys.argv[1:]) or [INSTRUCTIONS] + [a.key for a in all_assignments()]
    bad = 0
    for key in keys:
        r = report(key)
        tested = sum(1 for s in r.sentences if s.quotes)
        print(f"{key}: {len(r.sentences)} sentences, {tested} covered, {len(r.problems)} problems")
        for p in r.problems:
            print(f"  {p}")
        bad += bool(r.problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
