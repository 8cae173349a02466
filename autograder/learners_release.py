"""The learners' release: the course as graded learners get it, for a repository of its own.

`python -m autograder release --learners DIR --repository https://github.com/OWNER/NAME`
writes into DIR

* `site/`: the built book, its repository button, launch buttons and every chapter's
  exercise links pointing at the learners' repository, without the "For instructors"
  part (and without the page on `check()`, which needs the hidden tests);
* `exercises/KEY.ipynb`: the learner notebooks in their learners' variant (made from the
  masters by `generate`'s own code path, with instructions and a set-up cell that offer
  the visible tests only: the hidden tests are not there to run);
* `README.md`, `.github/workflows/pages.yml` (publishes `site/` as it is),
  `.binder/requirements.txt` and `runtime.txt` (the learner stack, without the course),
  and `RELEASE.json` (the source commit and every file written).

The book's pages import the reference modules to run their code, so the learners'
repository cannot rebuild the book: it carries the built site. The site is built from a
staged copy of the course (a temporary folder whose `_config.yml` and `_toc.yml` differ)
that reads the main build's execution cache, so after `make book` nothing is re-executed.

Before anything reaches DIR the release is searched (`verify`): no file may be or hold a
reference module, a hidden test, a master, a solution or hidden-test marker, or the
solution code of a master or a hidden test's code, whatever its layout, comments and local
names. A release that fails is deleted and DIR is left as it was.
"""

from __future__ import annotations

import ast
import base64
import builtins
import hashlib
import html
import itertools
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from .assignments import ROOT, all_assignments
from .usage import UsageError

MARKER = "RELEASE.json"
KIND = "attention-course learners' release"
GITHUB_RE = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")
BRANCH_RE = re.compile(r"^[A-Za-z0-9_./-]+$")
LEARNERS_INSTRUCTIONS = ROOT / "exercises" / "source" / "_instructions_learners.md"
# Pages the learners' site leaves out: the instructors' part, and `check()`, which runs hidden tests.
DROPPED_CAPTIONS = ("For instructors",)
DROPPED_PAGES = ("book/checking",)
# Kept in DIR from an earlier release or a clone of the learners' repository.
KEPT = (".git",)
LEARNERS_SETUP = """\
# Set-up: the exercises run on PyTorch and NumPy (exercise 09 also on transformers). Colab and
# the course's Binder have them; on your own machine, install the course's list once, in a
# terminal: pip install -r {requirements}
import importlib.util
missing = [name for name in ("torch", "numpy") if importlib.util.find_spec(name) is None]
print(f"Missing: {', '.join(missing)}: install them (see above)." if missing else "Ready: PyTorch and NumPy are installed.")"""
PAGES_WORKFLOW = """\
# Publishes site/ (the course's built book) on GitHub Pages on every push to {branch}.
# Settings > Pages > Source: "GitHub Actions". Nothing is built here: the site comes built.
name: pages

on:
  push:
    branches: [{branch}]
  workflow_dispatch:

permissions:
  contents: read
  pages: write
  id-token: write

concurrency:
  group: pages
  cancel-in-progress: false

jobs:
  deploy:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    environment:
      name: github-pages
      url: ${{{{ steps.deployment.outputs.page_url }}}}
    steps:
      - uses: actions/checkout@v7
      - uses: actions/upload-pages-artifact@v5
        with:
          path: site
      - id: deployment
        uses: actions/deploy-pages@v5
"""
README = """\
# Attention and Transformers: the course for learners

This repository is the learners' release of the course: the book, built, in `site/` (published
on GitHub Pages), and the exercise notebooks in `exercises/`. Open a chapter in the book: the
box under its title opens the chapter's exercise in Colab or on Binder, or downloads it.

Each exercise notebook has a test cell under each part: a cell that runs without an error
means its visible checks pass. Your instructor grades your notebook with more checks on
fresh inputs, so test your code on your own examples too.

To work on your own machine: `pip install -r .binder/requirements.txt`, then open
`exercises/KEY.ipynb` in JupyterLab.

Written by `python -m autograder release --learners` from the course's commit {commit};
do not edit it here: the next release replaces it.
"""


# --- what a release must not hold --------------------------------------------------------------
#
# Solution code (the code between a master's solution markers, and every hidden test) is compared
# with what a release's files hold as streams of tokens, so that layout, comments and the names of
# local variables do not hide a copy:
#
# * text is cut into tokens leniently, by a regular expression (a release's pages and prose are not
#   Python, and `tokenize` stops at the first stray quote): names, numbers, operators and single
#   symbols. Whitespace, quotes, backticks, parentheses, backslashes and trailing commas are no
#   tokens, so a copy re-indented, re-wrapped (inside brackets of its own or not), or with its
#   strings' quotes changed reads the same; numbers are read as Python reads them (1e-5 is 1e-05).
#   Comments are cut out and read as a stream of their own: a comment added to or dropped from a
#   copy breaks nothing, and code commented out is still searched. A page is read as its text
#   without tags, a notebook as its cells and their outputs.
# * names are renamed: every name becomes one placeholder except Python's keywords and builtins,
#   attribute names (after `.`) and the names the course's code imports from libraries or its
#   public notebooks define (`torch`, `np`, `F`, `softmax`): the library's and the exercises' API,
#   which a copier keeps and which tells different code apart. Keyword arguments' names (`dim=`)
#   become a second placeholder: `device=device` and `device=dev` read alike. A match also needs the
#   renamed names to repeat at the same places (`a = a + b` is not `a = b + b`), so a copy whose
#   local variables were renamed consistently matches and code that merely calls the same
#   functions does not.
# * solution code is cut into units: every run of WINDOW consecutive tokens; every statement (and
#   every line of a statement over several) of MIN_TOKENS tokens or more that holds a name of the
#   API: one line of a master, copied alone; and every statement or line of over MIN_LINE
#   characters, compared with its names as written (what the earlier line-by-line check found).
#   A unit of prose (a docstring is dropped, a message's words are names) or of names and commas
#   alone tells nothing and is dropped, and so is every unit that the public course shows
#   learners on purpose (`_public_texts`).
#
# A file holds solution code when it holds one unit of a master's, and a hidden test when units of
# that test cover HIDDEN_TOKENS of its tokens. Units are found by hashing: each is indexed by the
# hash of its most telling run of anchor tokens (`_ANCHOR`), every run of as many tokens of a file
# is hashed at once (NumPy), and only where a hash is indexed are the tokens compared. Files equal
# to a file of the packages that build the site (its scripts, styles and MathJax: most of a
# release's bytes) are not searched.

WINDOW = 20
"""Tokens in a run of solution code that a file may not hold: two or three statements (the body of
exercise 03's softmax holds 37 tokens, its attention_numpy 62); short enough that a copy with a
changed token every few lines still matches somewhere, long enough that no page of the course does
(16 would still find none in the built book and its vendored scripts; 12 finds runs of hidden
tests in minified JavaScript)."""
MIN_TOKENS = 10
"""Tokens from which a single statement of solution code is a unit of its own, names renamed
(``weights = torch.softmax(scores, dim=-1)`` holds 11)."""
MIN_LINE = 20
"""Characters (without whitespace and comments) over which a statement or line is also a unit with
its names as written, however short or plain: ``return weights @ v, weights`` or
``for i in range(0, n, step):`` (lines the line-by-line check found); ``return x`` tells nothing."""
HIDDEN_TOKENS = 30
"""Tokens of one hidden test, at least, that a file must hold to hold its source (about three lines)."""
CODE_SHARE = 0.25
"""Share of a unit's tokens (names renamed) that must be symbols or numbers: prose (a message's
words, renamed) is mostly names, and would match any prose of as many words."""
MIN_DISTINCT = 6
"""Distinct tokens besides renamed names that a unit (names renamed) must hold: a run of names and
commas (an argument list, a dict or list of strings, which minified JavaScript is full of) or a
sentence of prose tells no code from other code (with 4, MathJax's scripts hold "hidden tests")."""
THIRD_PARTY = ("sphinx", "pydata-sphinx-theme", "jupyter-book", "myst")
"""The packages (by the start of their names) that build the book and copy their files into the site."""
_PLACEHOLDERS = ("\x00name", "\x00argument")  # what renamed names and keyword arguments become (no token is either)
# The ids of the placeholders, and of ".", "(", ",", "=" and a line's end.
_RENAMED, _ARGUMENT, _DOT, _PAREN, _COMMA, _EQUALS, _NEWLINE = range(7)
_P = np.uint64(0x9E3779B97F4A7C15)  # the rolling hash's multiplier
_ANCHOR = {True: MIN_TOKENS, False: 2}  # tokens hashed to index a unit, names renamed (True) or not
_BITMAP_BITS = 24  # the hashes' low bits that a first filter looks up
_LOW_BITS = np.uint64((1 << _BITMAP_BITS) - 1)
_TOKEN = re.compile(r"""
    (?![rRbBfFuU]{1,2}["'])[^\W\d]\w*                        # a name, but not a string's prefix
  | (?:\d\w*(?:\.\w*)?|\.\d\w*)(?:(?<=[eE])[-+]\d\w*)?     # a number
  | \*\*=?|//=?|>>=?|<<=?|->|:=|\.\.\.|[-+*/%@&|^=!<>]=     # an operator of two or three symbols
  | [^\s\w"'`]                                             # any other symbol
  | \n                                                     # a line's end
""", re.X)
_NAME = re.compile(r"[^\W\d]")
_COMMENT = re.compile(r"#[^\n]*")
_TAG = re.compile(r"<[^>]+>")
_BLOCK_TAG = re.compile(  # a tag that ends a line of the page's text
    r"</?(?:p|div|pre|br|li|ul|ol|dl|dt|dd|h[1-6]|table|tr|td|th|section|article|main|nav|aside|header|footer"
    r"|figure|figcaption|blockquote|details|summary|body|head|title|script|style)\b[^>]*>", re.I)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PYTHON = frozenset(keyword.kwlist) | frozenset(dir(builtins))  # names that any Python code uses
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_DROPPED = frozenset("()\\")  # parentheses and line continuations, which re-wrapping adds or removes


@dataclass
class Unit:
    """A run of solution code: its tokens' ids (names renamed, or as written when `pattern` is None)."""

    tokens: tuple
    pattern: tuple | None  # where the renamed names repeat: each one's index in order of first appearance
    anchor: int = 0        # the hash of the _ANCHOR[pattern is not None] tokens it is indexed by...
    offset: int = 0        # ... which start at this token of it
    sources: list = field(default_factory=list)  # the course files that hold it


@dataclass
class Match:
    unit: Unit
    stream: str     # the text searched: a file's code, or its comments
    comments: bool  # whether `stream` is the comments
    start: int      # the index of its first token among the stream's (kept) tokens
    span: tuple     # the indices of its first and last token among all the stream's tokens


class Forbidden:
    """What no file of a learners' release may be or hold: the course's hidden files (their hashes),
    and the units of their solution code, with the token ids they are written in."""

    def __init__(self, kept: set[str] = frozenset()):
        self.hashes: dict[str, str] = {}       # sha256 -> the course file it is
        self.third_party: set[str] = set()     # sha256 of the files of the packages that build the site
        self.hidden: set[str] = set()          # the sources that are hidden tests
        self.modules: dict[str, str] = {}      # master -> its reference module
        self.kept = frozenset(kept) | _PYTHON
        self.vocab: dict[str, int] = {}  # token -> id (numbers written alike share one: 1e-5, 1e-05)
        self._size = 0
        self._strings: list[str] = []  # id -> token
        self._name, self._renamable, self._specific, self._symbol, self._dropped, self._closing = (
            np.zeros(0, dtype=bool) for _ in range(6))
        for t in (*_PLACEHOLDERS, ".", "(", ",", "=", "\n"):
            self._new_id(t)
        self._units: dict[tuple, Unit] = {}
        self._index: dict[bool, dict] = {}  # renamed? -> anchor hash -> length -> tokens -> units
        self._bitmap: dict[bool, np.ndarray] = {}

    # -- tokens --

    def _new_id(self, token: str) -> int:
        i = self.vocab[token] = self._size
        self._size += 1
        self._strings.append(token)
        if self._size > len(self._renamable):
            for name in ("_name", "_renamable", "_specific", "_symbol", "_dropped", "_closing"):
                setattr(self, name, np.resize(getattr(self, name), max(2 * self._size, 1024)))
        name = token not in _PLACEHOLDERS and _NAME.match(token) is not None
        self._name[i] = name
        self._renamable[i] = name and token not in self.kept
        self._specific[i] = name and token not in _PYTHON
        self._symbol[i] = not name and token not in _PLACEHOLDERS
        self._dropped[i] = token in _DROPPED
        self._closing[i] = token in _CLOSE
        return i

    def _add_tokens(self, tokens: list[str]) -> None:
        for t in tokens:
            if t not in self.vocab:
                same = _number(t) if t[0].isdigit() or t[0] == "." and t[1:2].isdigit() else t
                self.vocab[t] = self.vocab[same] if same in self.vocab else self._new_id(same)

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of the text's tokens, as written and with names renamed, less line ends,
        parentheses, backslashes and trailing commas; and where each is among all its tokens."""
        tokens = _TOKEN.findall(text)
        new = set(tokens).difference(self.vocab)
        if new:
            self._add_tokens(sorted(new))
        every = np.fromiter(map(self.vocab.__getitem__, tokens), dtype=np.int64, count=len(tokens))
        lines = np.flatnonzero(every != _NEWLINE)
        raw = every[lines]
        renamed = self._renamable[raw]
        argument = np.zeros(len(raw), dtype=bool)
        dropped = self._dropped[raw]
        if len(raw) > 1:
            # an attribute: after a "." on the same line (a sentence's full stop ends a line)
            renamed[1:] &= (raw[:-1] != _DOT) | (np.diff(lines) > 1)
            dropped[:-1] |= (raw[:-1] == _COMMA) & self._closing[raw[1:]]  # a trailing comma
        if len(raw) > 2:  # a keyword argument, `(name=` or `, name=` (or the last target of `a, b =`)
            after = (raw[:-2] == _PAREN) | (raw[:-2] == _COMMA)
            argument[1:-1] = self._name[raw[1:-1]] & after & (raw[2:] == _EQUALS)
        coarse = np.where(argument, _ARGUMENT, np.where(renamed, _RENAMED, raw))
        kept = np.flatnonzero(~dropped)
        return raw[kept], coarse[kept], lines[kept]

    # -- units --

    def add_code(self, code: str, source: str) -> None:
        """Cut solution code into units (see above)."""
        code = _COMMENT.sub("", _unescaped(_without_docstrings(code)))
        raw, coarse, where = self.encode(code)
        n = len(raw)
        anchors = {True: _hashes(coarse, _ANCHOR[True]).tolist(), False: _hashes(raw, _ANCHOR[False]).tolist()}
        symbols = [0, *np.cumsum(self._symbol[raw]).tolist()]
        specific = [0, *np.cumsum(self._specific[coarse]).tolist()]
        raw, coarse = raw.tolist(), coarse.tolist()
        # how telling the run of anchor tokens from each position is: the characters of its distinct tokens
        weights = {renamed: [sum(len(self._strings[t]) for t in set(ids[i:i + _ANCHOR[renamed]]) if t > _ARGUMENT)
                             for i in range(n)] for renamed, ids in ((True, coarse), (False, raw))}

        def add(s: int, e: int, renamed: bool) -> bool:
            if e - s < _ANCHOR[renamed] or renamed and symbols[e] - symbols[s] < CODE_SHARE * (e - s):
                return False
            tokens = tuple((coarse if renamed else raw)[s:e])
            if renamed and (len(set(tokens) - {_RENAMED, _ARGUMENT}) < MIN_DISTINCT
                            or e - s < WINDOW and specific[e] == specific[s]):
                return False
            key = (tokens, _pattern(raw[s:e], coarse[s:e]) if renamed else None)
            unit = self._units.get(key)
            if unit is None:
                # indexed by its most telling run of anchor tokens: `a, b, c, d` would be found everywhere
                candidates = weights[renamed][s:e - _ANCHOR[renamed] + 1]
                offset = candidates.index(max(candidates))
                unit = self._units[key] = Unit(*key, anchor=anchors[renamed][s + offset], offset=offset)
            if source not in unit.sources:
                unit.sources.append(source)
            return True

        for i in range(n - WINDOW + 1):
            add(i, i + WINDOW, True)
        if n < WINDOW:
            add(0, n, True)
        for first, end, chars in _statements(code):
            s, e = np.searchsorted(where, (first, end)).tolist()  # among the kept tokens
            if MIN_TOKENS <= e - s < WINDOW:
                add(s, e, True)
            if chars > MIN_LINE:
                add(s, e, False)  # as written too, as the line-by-line check found it

    def index(self, public: list[str]) -> None:
        """Index the units, less those that the public texts hold."""
        units = list(self._units.values())
        self._build(units)
        shown = {id(m.unit) for text in public for m in self.find(text)}
        self._build([u for u in units if id(u) not in shown])

    def _build(self, units: list[Unit]) -> None:
        self._index = {True: {}, False: {}}
        for u in units:
            by_place = self._index[u.pattern is not None].setdefault(u.anchor, {})
            by_place.setdefault((u.offset, len(u.tokens)), {}).setdefault(u.tokens, []).append(u)
        self._bitmap = {}
        for renamed, index in self._index.items():
            bitmap = self._bitmap[renamed] = np.zeros(1 << _BITMAP_BITS, dtype=bool)
            bitmap[(np.fromiter(index, dtype=np.uint64, count=len(index)) & _LOW_BITS).astype(np.intp)] = True

    @property
    def units(self) -> int:
        """How many units are searched for."""
        return sum(len(units) for index in self._index.values() for by_length in index.values()
                   for by_tokens in by_length.values() for units in by_tokens.values())

    # -- search --

    def find(self, text: str) -> list[Match]:
        """Every unit that a text holds, where it holds it (its code, then its comments)."""
        found = []
        text = _unescaped(text)
        streams = (_COMMENT.sub("", text), "\n".join(c[1:] for c in _COMMENT.findall(text)))
        for comments, stream in enumerate(streams):
            raw, coarse, where = self.encode(stream)
            for renamed, index in self._index.items():
                if not index:
                    continue
                ids = coarse if renamed else raw
                hashes = _hashes(ids, _ANCHOR[renamed])
                hits = np.flatnonzero(self._bitmap[renamed][(hashes & _LOW_BITS).astype(np.intp)])
                for hit, h in zip(hits.tolist(), hashes[hits].tolist()):
                    for (offset, length), by_tokens in index.get(h, {}).items():
                        i = hit - offset
                        units = by_tokens.get(tuple(ids[i:i + length].tolist())) if i >= 0 else None
                        if not units:
                            continue
                        pattern = _pattern(raw[i:i + length].tolist(), coarse[i:i + length].tolist()) if renamed else None
                        span = (int(where[i]), int(where[i + length - 1]))
                        found += [Match(u, stream, bool(comments), i, span) for u in units if u.pattern == pattern]
        return found


def _unescaped(text: str) -> str:
    """Text with the escapes of line ends and tabs as the characters: code kept in a string of JSON
    or JavaScript is laid out as code (and code's own strings are read alike)."""
    return text.replace("\\n", "\n").replace("\\r", "\r").replace("\\t", "\t")


def _number(token: str) -> str:
    """A number as Python writes it (1e-05 for 1e-5 and 1E-5, 1.0 for 1., 16 for 0x10)."""
    if token.isdigit() and (token[0] != "0" or token == "0"):
        return token
    for read in (lambda t: int(t, 0), float, complex):
        try:
            return repr(read(token))
        except ValueError:
            pass
    return token


def _hashes(ids: np.ndarray, length: int) -> np.ndarray:
    """The hash of every run of `length` consecutive ids (a polynomial hash, modulo 2**64)."""
    n = len(ids) - length + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    values = ids.astype(np.uint64)
    h = values[:n].copy()
    for j in range(1, length):
        h *= _P
        h += values[j:j + n]
    return h


def _pattern(raw: list[int], coarse: list[int]) -> tuple:
    """Where the renamed names of a run repeat: each one's index in order of first appearance."""
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(r, len(seen)) for r, c in zip(raw, coarse) if c == _RENAMED)


def _without_docstrings(code: str) -> str:
    """Code without the lines of its bare strings (docstrings): prose, which says nothing of the code."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return code
    lines = code.split("\n")
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines[node.lineno - 1:node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    return "\n".join(lines)


def _statements(code: str) -> list[tuple[int, int, int]]:
    """The statements of code (without comments), and its lines that hold part of one, as (first
    token, end, characters without whitespace), counting every token: a statement ends at a line's
    end outside brackets, or at `;`."""
    found, start, line, depth, newline, prev = set(), None, None, 0, False, ""
    matches = list(_TOKEN.finditer(code))
    for t, m in enumerate(matches):
        tok = m.group()
        if tok == "\n":
            newline = True
            continue
        if start is None:
            start = line = t
        elif newline or prev == ";":
            found.add((line, t))
            line = t
            if depth == 0 and prev != "\\":
                found.add((start, t))
                start = t
        depth = max(0, depth + (tok in _OPEN) - (tok in _CLOSE))
        newline, prev = False, tok
    if start is not None:
        found |= {(start, len(matches)), (line, len(matches))}
    return [(s, e, len(re.sub(r"\s+", "", code[matches[s].start():matches[e - 1].end()]))) for s, e in sorted(found)]


def _public_texts() -> list[str]:
    """What the public course shows learners on purpose: the book's pages, the files they include,
    and the exercise notebooks (later exercises hand out earlier answers, locked). A release may
    hold them."""
    texts = []
    for page in sorted((ROOT / "book").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        texts.append(text)
        for included in re.findall(r"^```+\{literalinclude\}\s+(\S+)", text, flags=re.M):
            path = (page.parent / included).resolve()
            if path.is_file() and path.is_relative_to(ROOT):
                texts.append(path.read_text(encoding="utf-8"))
    for a in all_assignments():
        if a.notebook.exists():
            texts.append(_reader_text(a.notebook, a.notebook.read_bytes()) or "")
    return texts


_COURSE = ("autograder", "solutions")  # the course's own packages: their helpers are no library's API


def _api_names(code: str, definitions: bool = False) -> set[str]:
    """The names that code imports from libraries (and with `definitions` the functions and classes
    it defines at its top level)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] not in _COURSE:
            names |= {a.asname or a.name for a in node.names}
    if definitions:
        names |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return names


def forbidden_content() -> Forbidden:
    """The reference modules, hidden tests and masters, and the units of their solution code."""
    from nbgrader import utils as nbgrader_utils

    from . import generate as gen

    masters, kept = {}, set()
    for a in all_assignments():
        masters[a] = gen.read_master(a)
        for cell in masters[a].cells:
            if cell.cell_type == "code":
                kept |= _api_names(cell.source)
        if a.hidden_tests.exists():
            kept |= _api_names(a.hidden_tests.read_text(encoding="utf-8"))
        if a.notebook.exists():
            for cell in json.loads(a.notebook.read_text(encoding="utf-8"))["cells"]:
                if cell["cell_type"] == "code":
                    kept |= _api_names("".join(cell["source"]), definitions=True)
    found = Forbidden(kept)
    for folder in (ROOT / "solutions", ROOT / "autograder" / "hidden", ROOT / "exercises" / "source"):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.hashes[hashlib.sha256(path.read_bytes()).hexdigest()] = str(path.relative_to(ROOT))
    for a, master in masters.items():
        source = str(a.master.relative_to(ROOT))
        found.modules[source] = str(a.solutions.relative_to(ROOT))
        for cell in master.cells:
            if cell.cell_type != "code" or not nbgrader_utils.is_solution(cell):
                continue
            inside, lines = False, []
            for line in cell.source.splitlines() + ["### END SOLUTION"]:
                if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                    if inside and lines:
                        found.add_code("\n".join(lines), source)
                    inside, lines = "BEGIN" in line, []
                elif inside:
                    lines.append(line)
    for a in masters:  # after the masters: code that both hold is reported as the master's
        if a.hidden_tests.exists():
            test = str(a.hidden_tests.relative_to(ROOT))
            found.hidden.add(test)
            found.add_code(a.hidden_tests.read_text(encoding="utf-8"), test)
    found.index(_public_texts())
    found.third_party = _third_party_hashes()
    return found


def _third_party_hashes() -> set[str]:
    """The sha256 of every file of the installed packages that build the book (from their wheels'
    records): the site's scripts, styles and MathJax are copies of them, most of a release's bytes,
    and hold no course code. A file equal to one is not searched for solution code."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower().replace("_", "-").startswith(THIRD_PARTY):
            for f in dist.files or ():
                if f.hash is not None and f.hash.mode == "sha256":
                    found.add(base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex())
    return found


def _reader_text(path: Path, data: bytes) -> str | None:
    """The text a reader of the file sees, or None for a binary file: a notebook's cells and
    outputs, a page's text without its tags."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if path.suffix == ".ipynb":
        try:
            parts = []
            for cell in json.loads(text).get("cells", []):
                parts.append("".join(cell.get("source", "")))
                for out in cell.get("outputs", []) or []:
                    shown = [out.get("text"), *(v for k, v in (out.get("data") or {}).items() if k.startswith("text/"))]
                    for value in shown:  # a string, or a list of lines that end with their line ends
                        parts.append("".join(value) if isinstance(value, list) else str(value or ""))
                    parts.append(_ANSI.sub("", "\n".join(out.get("traceback") or [])))
            text = "\n".join(parts)
        except (ValueError, AttributeError, TypeError):
            pass
    elif path.suffix in (".html", ".htm"):
        text = html.unescape(_TAG.sub("", _BLOCK_TAG.sub("\n", text)))
    return text


def _excerpt(match: Match) -> str:
    """The text of a match, its whitespace collapsed, at most 80 characters."""
    first, last = match.span
    tokens = list(itertools.islice(_TOKEN.finditer(match.stream), first, last + 1))
    text = re.sub(r"\s+", " ", match.stream[tokens[0].start():tokens[-1].end()])
    return text if len(text) <= 80 else text[:77] + "..."


def verify(root: Path, forbidden: Forbidden) -> list[str]:
    """One sentence per file of `root` that a learners' release must not hold, and per course file it
    holds code of."""
    problems = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.parts[0] in KEPT:
            continue
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        name = "/".join(rel.parts)
        if re.search(r"(^|/)(solutions|autograder/hidden|exercises/source)/", name):
            problems.append(f"{name} lies in a folder of the full course that learners must not get")
        if digest in forbidden.hashes:
            problems.append(f"{name} is a copy of {forbidden.hashes[digest]}")
        for marker in (b"BEGIN SOLUTION", b"BEGIN HIDDEN TESTS", b"END SOLUTION"):
            if marker in data:
                problems.append(f"{name} holds the marker {marker.decode()!r} of a master")
                break
        text = None if digest in forbidden.third_party else _reader_text(path, data)
        if text is None:
            continue
        by_source: dict[str, list[Match]] = {}
        for m in forbidden.find(text):
            by_source.setdefault(m.unit.sources[0], []).append(m)
        for source in sorted(by_source, key=lambda s: (s in forbidden.hidden, s)):
            matches = sorted(by_source[source], key=lambda m: (m.comments, m.start))
            covered = len({(m.comments, i) for m in matches for i in range(m.start, m.start + len(m.unit.tokens))})
            example = _excerpt(matches[0])
            if source in forbidden.hidden:
                if covered >= HIDDEN_TOKENS:
                    problems.append(f"{name} holds {covered} tokens of the hidden test {source}, e.g. {example!r}")
            else:
                module = forbidden.modules.get(source)
                problems.append(f"{name} holds solution code from {source}"
                                + (f" (the reference module {module})" if module else "")
                                + f": {covered} of its tokens, whatever their layout and names, e.g. {example!r}")
    return problems


def _repository(url: str | None, branch: str) -> tuple[str, str]:
    url = (url or "").strip().rstrip("/").removesuffix(".git")
    if not GITHUB_RE.match(url):
        raise UsageError(f"--repository {url!r} must be a GitHub repository, https://github.com/OWNER/NAME: "
                         "the learners' site and launch links point there")
    if not BRANCH_RE.match(branch):
        raise UsageError(f"--branch {branch!r} is not a branch name (letters, digits, '_', '.', '/', '-')")
    return url, branch


def check_destination(dest: Path) -> None:
    """A UsageError unless DIR is missing, empty (but for KEPT), or an earlier release."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--learners {dest} is a file, not a folder")
    if not dest.exists():
        return
    foreign = [p.name for p in dest.iterdir() if p.name not in KEPT]
    if not foreign:
        return
    try:
        marker = json.loads((dest / MARKER).read_text(encoding="utf-8"))
        earlier = marker.get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise UsageError(f"--learners {dest} holds files ({', '.join(sorted(foreign)[:3])}, ...) and no {MARKER} of "
                         "an earlier learners' release: give an empty folder, a fresh clone, or an earlier release")


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def learners_notebooks(url: str, branch: str) -> dict[str, str]:
    """KEY -> the learners' variant of each exercise notebook, from its master."""
    import nbformat

    from . import generate as gen

    requirements = f"https://raw.githubusercontent.com/{url[len('https://github.com/'):]}/{branch}/.binder/requirements.txt"
    setup = nbformat.v4.new_code_cell(LEARNERS_SETUP.replace("{requirements}", requirements))
    setup["id"] = gen.SETUP_CELL_ID
    return {a.key: gen.learner_notebook(a, gen.read_master(a, instructions=LEARNERS_INSTRUCTIONS, setup=setup))
            for a in all_assignments() if a.notebook.exists()}


def binder_requirements() -> str:
    """The course's Binder list without the course itself (the learners' repository has no package)."""
    lines = (ROOT / ".binder" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    kept, comment = [], []
    while lines and lines[0].startswith("#"):  # the course's own header, which speaks of the package
        lines.pop(0)
    for line in lines:
        if line.startswith("#"):
            comment.append(line)
            continue
        if line.startswith("-e "):
            comment = []
            continue
        kept += comment + [line]
        comment = []
    kept[0:0] = ["# The learners' stack: what the exercise notebooks import (written by the course's release)."]
    return "\n".join(kept) + "\n"


def staged_config(url: str, branch: str) -> tuple[str, str]:
    """The staged book's _config.yml and _toc.yml."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["repository"] = {**config.get("repository", {}), "url": url, "branch": branch}
    config.setdefault("launch_buttons", {})["jupyterhub_url"] = ""
    # Pages keep what holds only where the hidden tests exist in {only} not learners_release blocks.
    config.setdefault("sphinx", {}).setdefault("config", {})["course_learners_release"] = True
    # The main build's executed outputs: a page whose code is unchanged is not run again.
    config.setdefault("execute", {})["cache"] = str(ROOT / "_build" / ".jupyter_cache")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    parts = []
    for part in toc.get("parts", []):
        if part.get("caption") in DROPPED_CAPTIONS:
            continue
        chapters = [c for c in part.get("chapters", []) if c.get("file") not in DROPPED_PAGES]
        if chapters:
            parts.append({**part, "chapters": chapters})
    toc["parts"] = parts
    return yaml.safe_dump(config, sort_keys=False), yaml.safe_dump(toc, sort_keys=False)


def _jupyter_book() -> str:
    """The jupyter-book command of this Python (its module has no `-m` entry)."""
    script = Path(sys.executable).parent / "jupyter-book"
    if script.exists():
        return str(script)
    found = shutil.which("jupyter-book")
    if found is None:
        raise UsageError("jupyter-book is not installed in this Python: run `make install` first")
    return found


def build_site(stage: Path, notebooks: dict[str, str], url: str, branch: str) -> tuple[Path, str]:
    """Build the book from a staged copy of the course; the built site and the build's log."""
    for name in ("book", "solutions", "coursebook", "benchmarks", "autograder", "references.bib"):
        (stage / name).symlink_to(ROOT / name)
    config, toc = staged_config(url, branch)
    (stage / "_config.yml").write_text(config, encoding="utf-8")
    (stage / "_toc.yml").write_text(toc, encoding="utf-8")
    (stage / "exercises").mkdir()
    for key, text in notebooks.items():
        (stage / "exercises" / f"{key}.ipynb").write_text(text, encoding="utf-8")
    out = stage / "out"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # No -W: links from the kept pages to the dropped ones become plain text, with a warning each.
    proc = subprocess.run([_jupyter_book(), "build", str(stage), "--path-output", str(out),
                           "-n", "--keep-going"], capture_output=True, text=True, env=env, cwd=stage)
    log = proc.stdout + proc.stderr
    site = out / "_build" / "html"
    if proc.returncode != 0 or not (site / "index.html").exists():
        tail = "\n".join(log.splitlines()[-15:])
        raise UsageError(f"the learners' site did not build (jupyter-book exit {proc.returncode}); its last lines:\n{tail}")
    return site, log


def assemble(tree: Path, site: Path, notebooks: dict[str, str], url: str, branch: str, commit: str) -> None:
    shutil.copytree(site, tree / "site", ignore=shutil.ignore_patterns(".buildinfo", ".doctrees"))
    (tree / "exercises").mkdir()
    for key, text in notebooks.items():
        (tree / "exercises" / f"{key}.ipynb").write_text(text, encoding="utf-8")
    (tree / "README.md").write_text(README.format(commit=commit), encoding="utf-8")
    (tree / ".github" / "workflows").mkdir(parents=True)
    (tree / ".github" / "workflows" / "pages.yml").write_text(PAGES_WORKFLOW.format(branch=branch), encoding="utf-8")
    (tree / ".binder").mkdir()
    (tree / ".binder" / "requirements.txt").write_text(binder_requirements(), encoding="utf-8")
    runtime = ROOT / ".binder" / "runtime.txt"
    if runtime.exists():
        shutil.copy2(runtime, tree / ".binder" / "runtime.txt")
    files = sorted("/".join(p.relative_to(tree).parts) for p in tree.rglob("*") if p.is_file())
    (tree / MARKER).write_text(json.dumps({"kind": KIND, "source_commit": commit, "repository": url, "branch": branch,
                                           "files": files}, indent=1) + "\n", encoding="utf-8")


def replace_into(dest: Path, tree: Path) -> None:
    """DIR's earlier release (all but KEPT) replaced by `tree`'s files."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():
        if p.name in KEPT:
            continue
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in tree.iterdir():
        shutil.move(str(p), str(dest / p.name))


def learners_release_command(args) -> int:
    started = time.monotonic()
    url, branch = _repository(args.repository, args.branch)
    if args.assignment:
        raise UsageError("--learners releases the whole course: give no chapter keys")
    dest = Path(args.learners).resolve()
    check_destination(dest)
    if not (ROOT / "_build" / "html" / "index.html").exists():
        raise UsageError("the learners' release reuses the book's build and there is none: run `make book` first")
    notebooks = learners_notebooks(url, branch)
    forbidden = forbidden_content()
    with tempfile.TemporaryDirectory(prefix="learners-release-") as tmp:
        stage, tree = Path(tmp) / "stage", Path(tmp) / "release"
        stage.mkdir()
        tree.mkdir()
        site, log = build_site(stage, notebooks, url, branch)
        assemble(tree, site, notebooks, url, branch, _commit())
        problems = verify(tree, forbidden)
        if problems:
            # The temporary folder, the partial release with it, goes; DIR is untouched.
            raise UsageError(f"the learners' release would give away what it must hide, so nothing was written to "
                             f"{dest}: " + "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
        replace_into(dest, tree)
    warnings = sum("WARNING" in line for line in log.splitlines())
    print(f"Wrote the learners' release to {dest} in {time.monotonic() - started:.0f} s: site/ "
          f"({len(notebooks)} exercise notebooks; links to {url}, branch {branch}; {warnings} build warnings, "
          "links to the instructors' pages left as text). Push it to that repository; its Pages workflow publishes site/.")
    return 0
