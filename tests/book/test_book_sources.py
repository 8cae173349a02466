"""Every number the prose of a page quotes is computed above it, read from the sources.

The book's promise (book/intro.md): a number in the text comes from a `glue(...)` in a code
cell above the sentence that quotes it, so a reader who runs the page top to bottom has seen
the code that produced it. Building checks only that a glued name exists somewhere on the
page; these tests check the order, without building. For each page book/**/*.md they read:

* its code cells (```{code-cell} ... ```) and the names each `glue(...)` call defines: a
  string literal; an f-string, whose `{...}` parts match anything (f"acc_{kind}" defines
  acc_gru, acc_attention, ...); or a variable, as in `for name, value in (("a", x), ...):
  glue(name, value)`, where the names are the string literals that open the cell's tuples;
* the uses in its prose: {glue}`name`, {glue:text}`name:.2f`, {glue:md}`name` and the
  {glue:figure}/{glue:math} directives; not those in inline code (`` {glue}`name` ``).

A use must come after the first cell that defines its name, on the same page; every name
used must be defined on the page. Failures name the page, the line and the name.
"""
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"

CELL_START = re.compile(r"^(`{3,}|:{3,})\{code-cell\}")
GLUE_CALL = re.compile(r"\bglue\(\s*")
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`([^`]+)`")
GLUE_DIRECTIVE = re.compile(r"^(?:`{3,}|:{3,})\{glue(?::[a-z]+)?\}\s+(\S+)")
INLINE_CODE = re.compile(r"``.*?``")  # a role shown as an example: `` {glue:text}`name` ``
TUPLE_NAME = re.compile(r"\(\s*([\"'])([A-Za-z_]\w*)\1\s*,")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Definition:
    """The names one glue call defines: `pattern` matches them; `line` is the cell's first."""

    pattern: re.Pattern
    text: str
    line: int


@dataclass(frozen=True)
class Use:
    name: str
    line: int


def pages():
    """Every page of the book, book/**/*.md."""
    return sorted(p for p in BOOK.rglob("*.md") if "_ext" not in p.parts)


def code_cells(text):
    """(first line number, source) of every code cell; line numbers start at 1."""
    cells, lines, number = [], text.splitlines(), 0
    while number < len(lines):
        start = CELL_START.match(lines[number])
        if not start:
            number += 1
            continue
        fence, body = start.group(1), []
        first = number + 1
        number += 1
        while number < len(lines) and lines[number].strip() != fence:
            body.append(lines[number])
            number += 1
        cells.append((first, "\n".join(body)))
        number += 1
    return cells


def literal_at(source, at):
    """The string literal (or f-string) starting at `at`: (is_f_string, body) or None.

    Braces are followed so that an f-string's expressions may hold quotes of the other
    kind: f"ln_{'pre' if nf else 'post'}".
    """
    f_string = source[at:at + 1] in ("f", "F")
    start = at + 1 if f_string else at
    quote = source[start:start + 1]
    if quote not in ("'", '"'):
        return None
    depth, position = 0, start + 1
    while position < len(source):
        char = source[position]
        if f_string and char == "{":
            depth += 1
        elif f_string and char == "}":
            depth -= 1
        elif char == quote and depth == 0:
            return f_string, source[start + 1:position]
        position += 1
    return None


def f_string_pattern(body):
    """f"acc_{kind}" -> a pattern matching acc_ followed by anything."""
    parts, depth, literal = [], 0, ""
    for char in body:
        if char == "{":
            if depth == 0:
                parts.append(re.escape(literal))
                literal = ""
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                parts.append(".+")
        elif depth == 0:
            literal += char
    parts.append(re.escape(literal))
    return re.compile("".join(parts))


def loop_names(source, variable):
    """The names a loop `for variable, value in (("a", x), ("b", y)):` hands to glue."""
    header = re.search(rf"\bfor\s+{variable}\s*,.*?\bin\b(.*?\))\s*:[ \t]*$", source, re.DOTALL | re.MULTILINE)
    return [name for _, name in TUPLE_NAME.findall(header.group(1) if header else source)]


def definitions(text):
    """Every name pattern defined by a glue call of the page, with its cell's first line."""
    found = []
    for line, source in code_cells(text):
        for call in GLUE_CALL.finditer(source):
            literal = literal_at(source, call.end())
            if literal is not None:
                f_string, body = literal
                pattern = f_string_pattern(body) if f_string else re.compile(re.escape(body))
                found.append(Definition(pattern, ("f" if f_string else "") + repr(body), line))
                continue
            variable = IDENTIFIER.match(source, call.end())
            if variable:  # glue(name, value) in a loop over ("name", value) tuples
                for name in loop_names(source, variable.group(0)):
                    found.append(Definition(re.compile(re.escape(name)), repr(name), line))
    return found


def prose_lines(text):
    """(line number, line) of every line outside code cells."""
    inside = set()
    lines = text.splitlines()
    for first, source in code_cells(text):
        inside.update(range(first - 1, first + source.count("\n") + 2))
    return [(number + 1, line) for number, line in enumerate(lines) if number not in inside]


def uses(text):
    """Every glued name the prose quotes, with its line."""
    found = []
    for number, line in prose_lines(text):
        for match in GLUE_ROLE.finditer(INLINE_CODE.sub("", line)):
            found.append(Use(match.group(1).split(":")[0].strip(), number))
        directive = GLUE_DIRECTIVE.match(line)
        if directive:
            found.append(Use(directive.group(1), number))
    return found


def first_definition(name, defined):
    """The line of the first cell that defines `name`, or None."""
    lines = [d.line for d in defined if d.pattern.fullmatch(name)]
    return min(lines) if lines else None


def order_problems(text):
    """Uses that come before the first cell defining their name: (line, name, defined at)."""
    defined = definitions(text)
    problems = []
    for use in uses(text):
        at = first_definition(use.name, defined)
        if at is not None and at > use.line:
            problems.append((use.line, use.name, at))
    return problems


def undefined_uses(text):
    """Uses whose name no glue call of the page defines: (line, name)."""
    defined = definitions(text)
    return [(use.line, use.name) for use in uses(text) if first_definition(use.name, defined) is None]


PAGES = [p.relative_to(ROOT) for p in pages()]


@pytest.mark.parametrize("page", PAGES, ids=str)
def test_glued_numbers_come_after_their_code(page):
    problems = order_problems((ROOT / page).read_text(encoding="utf-8"))
    assert not problems, f"{page}: a number quoted before the cell that glues it: " + "; ".join(
        f"line {line}: {name} (glued in the cell at line {at})" for line, name, at in problems)


@pytest.mark.parametrize("page", PAGES, ids=str)
def test_glued_names_are_defined_on_their_page(page):
    problems = undefined_uses((ROOT / page).read_text(encoding="utf-8"))
    assert not problems, f"{page}: quoted but never glued on this page: " + "; ".join(
        f"line {line}: {name}" for line, name in problems)


PAGE = """\
Intro {glue:text}`early:.2f`.

```{code-cell} ipython3
x = 1
glue("early", x, display=False)
for kind in ("a", "b"):
    glue(f"acc_{kind}", x, display=False)
glue(f"ln_{'pre' if x else 'post'}_{kind}", x, display=False)
for name, value in (("tupled", 1), ("other", 2)):
    glue(name, value, display=False)
```

Then {glue}`early`, {glue:text}`acc_b:.1%`, {glue:text}`ln_pre_a`, {glue:text}`tupled`
and {glue:text}`missing:.1f`. Written as code, `` {glue:text}`example` `` is no use.

```{glue:figure} acc_a
```
"""


def test_reader_finds_definitions_and_uses():
    names = {d.text for d in definitions(PAGE)}
    assert names == {"'early'", "f'acc_{kind}'", "f\"ln_{'pre' if x else 'post'}_{kind}\"", "'tupled'", "'other'"}
    assert [(u.line, u.name) for u in uses(PAGE)] == [
        (1, "early"), (13, "early"), (13, "acc_b"), (13, "ln_pre_a"), (13, "tupled"), (14, "missing"), (16, "acc_a")]
    assert order_problems(PAGE) == [(1, "early", 3)]
    assert undefined_uses(PAGE) == [(14, "missing")]


def test_the_execution_cache_exists_before_two_readers_open_it(tmp_path):
    """`make book` reads (executes) two pages at once, each reader opening the execution cache; on a build from
    nothing both would create its database's tables, and one failed ("table settings already exists"). The build
    creates it first (book/_ext/build_book.py, `ready_cache`): two processes that then open it at once both read it."""
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book" / "_ext"))
    from build_book import ready_cache

    ready_cache(tmp_path)
    cache = tmp_path / ".jupyter_cache"
    assert any(cache.glob("*.db"))
    opener = ("import sys; from jupyter_cache import get_cache; "
              "print(len(get_cache(sys.argv[1]).list_cache_records()))")
    readers = [subprocess.Popen([sys.executable, "-c", opener, str(cache)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0 and out.strip() == "0", err[-500:]
