"""The similarity report's answers, normalised and fingerprinted (see `autograder.course.similarity`).

**Normalisation**, each step because a copier can change it without changing the code:

* comments and docstrings are dropped (parsing drops comments; docstrings are removed from
  every body): rewording them is the cheapest disguise;
* names are made canonical: arguments and local variables become ``v0, v1, ...`` in order of
  first appearance in each top-level definition, the learner's helpers ``h0, h1, ...`` and
  constants ``g0, ...`` in order of first use from the answer (so reordering the helpers in the
  file changes nothing). Kept as written: the exercise's names (the stubs, the set-up's
  imports), builtins, whatever the learner imports, attribute names (``.masked_fill``), method
  names (``forward``: attributes of the class) and keyword names (``dim=``): they are the
  library's API, and renaming them would make different library calls look alike;
* formatting is gone: the normalised tree is written back with ``ast.unparse``, and an answer
  is the part's definition followed by its helpers in that order. A cell that does not parse
  (an unclosed bracket, IPython syntax the grader would not run either) is compared as its
  token stream (`tokenize`, names renamed the same way), which shares k-grams but never
  equals the parsed form; the report says so.

An answer's normalised token stream is then cut into k-grams of `K` tokens, hashed, and
winnowed with a window of `WINDOW` hashes (`kgrams`, `winnow`); `Exercise` holds what every
submission shares (the parts, the given code and its k-grams, the reference's answers) and
makes each submission's `Answers`.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from ..core.notebook import ParsedNotebook, is_test_cell

K = 5
"""Tokens per k-gram: short enough that a one-line answer has a few, long enough that common
snippets such as ``, dim = - 1 )`` are not alone a match."""
WINDOW = 4
"""Winnowing window: a shared run of K + WINDOW - 1 = 8 tokens always shares a fingerprint."""
MAX_CODE_CHARS = 200_000
"""Code in one submission's cells beyond which it is not compared: the answers are a few KB."""
CELL_CACHE_CHARS = 20_000
"""Cells up to this size are parsed and normalised once per report, however many learners hand them in."""
CACHE_CHARS = 2_000_000
"""Code kept parsed for the whole report, at most (a parsed tree takes some 50 times its text)."""

_MAGIC = re.compile(r"^\s*[%!]|\?\s*$")
_BUILTINS = frozenset(dir(builtins))
_REFERENCE = "(reference)"


class NotCompared(Exception):
    """A submission that cannot be compared; the message is the one sentence the report shows."""


# --- normalisation --------------------------------------------------------------------------

def _code(source: str) -> str:
    """A cell's code with IPython's lines (%magic, !shell, name?) blanked: the grader does not run
    them either, and they would stop the cell from parsing."""
    return "\n".join("" if _MAGIC.search(line) else line for line in source.splitlines())


def _given_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Top-level names a statement defines (def, class, assignment targets)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    targets = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    out = []
    for t in targets:
        out += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    return out


def _imported(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
    return out


_BODIES: dict[type, tuple] = {}  # node type -> its fields that hold statements
_FIELDS: dict[type, tuple] = {}  # node type -> its fields that may hold nodes
_RENAMED = (ast.Name, ast.arg, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal)


@dataclass
class _Statement:
    """A top-level statement of a learner's cell, read once (one walk) for every part and copy."""

    code: str                  # the cell's code
    index: int                 # the statement's place in it
    node: ast.stmt
    bound: list                # the names it defines
    loaded: list               # the names it reads or writes, in order of first appearance
    idents: frozenset          # every identifier the renaming may touch
    imported: set              # names its imports bind
    renamed: list = field(default_factory=list)  # the nodes that carry names, in source order
    holders: list = field(default_factory=list)  # (node, field) whose statements include a docstring or stub
    methods: list = field(default_factory=list)  # the methods of its classes (their names are kept)


def _children(node: ast.AST, t: type) -> list:
    """`ast.iter_child_nodes` as a list, without the expression contexts (Load, Store): the walk's
    inner loop, written out because it is most of the walk's time."""
    fields = _FIELDS.get(t)
    if fields is None:
        fields = _FIELDS[t] = tuple(f for f in t._fields if f != "ctx")
    out = []
    for f in fields:
        v = getattr(node, f, None)
        if type(v) is list:
            out.extend(x for x in v if isinstance(x, ast.AST))
        elif isinstance(v, ast.AST):
            out.append(v)
    return out


def _statement(code: str, index: int, stmt: ast.stmt) -> _Statement:
    """Walk a statement once (iteratively: no recursion limit) for what normalising it needs."""
    out = _Statement(code, index, stmt, _bound_names(stmt), [], frozenset(), set())
    seen: dict[str, None] = {}
    idents = set()
    methods: set[int] = set()
    stack = [stmt]
    while stack:
        node = stack.pop()
        t = type(node)
        if t is ast.Name:
            seen.setdefault(node.id)
            out.renamed.append(node)
            continue  # a leaf but for its context
        if t is ast.Constant:
            continue
        if t is ast.ClassDef:
            methods.update(id(x) for x in node.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)))
        if t is ast.arg:
            idents.add(node.arg)
        elif t in (ast.FunctionDef, ast.AsyncFunctionDef) and id(node) in methods:
            out.methods.append(node)  # a method's name is an attribute: the class's API, kept
        elif t in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            idents.add(node.name)
        elif t in (ast.Global, ast.Nonlocal):
            idents.update(node.names)
        elif t in (ast.Import, ast.ImportFrom):
            out.imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        if t in _RENAMED and not (out.methods and out.methods[-1] is node):
            out.renamed.append(node)
        bodies = _BODIES.get(t)
        if bodies is None:
            bodies = _BODIES[t] = tuple(a for a in ("body", "orelse", "finalbody") if a in t._fields)
        for attr in bodies:
            stmts = getattr(node, attr, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt) \
                    and any(_given_statement(x) for x in stmts):
                out.holders.append((node, attr))
        stack.extend(reversed(_children(node, t)))
    out.loaded, out.idents = list(seen), frozenset(idents.union(seen))
    return out


def _normalised(st: _Statement, kept: set[str], glob: dict[str, str]) -> str:
    """One top-level definition without docstrings, type annotations and ``raise NotImplementedError``,
    with canonical names (globals from `glob`, locals by first appearance), written by ``ast.unparse``.

    The tree is changed in place and restored afterwards (an undo log): a deep copy or a
    NodeTransformer per part cost most of the report's time, and the same parsed cell serves every
    part and every identical copy of it. (Names inside a removed statement still take their number:
    the same for everyone.)"""
    undo: list[tuple] = []
    local: dict[str, str] = {}

    def name(n: str) -> str:
        if n in kept:
            return n
        return glob.get(n) or local.setdefault(n, f"v{len(local)}")

    def put(node, attr, value):
        undo.append((node, attr, getattr(node, attr)))
        setattr(node, attr, value)

    try:
        for node, attr in st.holders:
            left = [x for x in getattr(node, attr) if not _given_statement(x)]
            put(node, attr, left or ([ast.Pass()] if attr == "body" else []))
        for node in st.methods:
            put(node, "returns", None)
        for node in st.renamed:
            t = type(node)
            if t is ast.Name:
                put(node, "id", name(node.id))
            elif t is ast.arg:
                put(node, "arg", name(node.arg))
                put(node, "annotation", None)
            elif t is ast.ClassDef:
                put(node, "name", name(node.name))
            elif t in (ast.Global, ast.Nonlocal):
                put(node, "names", [name(n) for n in node.names])
            else:
                put(node, "name", name(node.name))
                put(node, "returns", None)
        return ast.unparse(st.node)
    finally:
        for node, attr, value in reversed(undo):
            setattr(node, attr, value)


def _tokens(text: str, kept: set[str] | None = None, rename: bool = False) -> list[str]:
    """The token stream of code: comments and blank lines dropped; with `rename`, names that are not
    kept (nor keywords) renamed by first appearance (the fallback for code that does not parse)."""
    out, names = [], {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER, tokenize.ENCODING):
                continue
            s = tok.string
            if tok.type == tokenize.NAME and rename and not keyword.iskeyword(s) and s not in (kept or ()):
                prev = out[-1] if out else ""
                if prev != ".":
                    s = names.setdefault(s, f"v{len(names)}")
            elif tok.type == tokenize.INDENT:
                s = "<indent>"
            elif tok.type == tokenize.DEDENT:
                s = "<dedent>"
            elif tok.type == tokenize.NEWLINE:
                s = "<nl>"
            out.append(s)
    except (tokenize.TokenError, SyntaxError, ValueError):
        if not rename:
            raise
        # what tokenize could not read is compared as words and symbols
        out += re.findall(r"\w+|[^\w\s]", text[sum(len(t) for t in out):])
    return out


@dataclass
class Answers:
    """One submission's normalised answers, part by part."""

    who: str
    path: str = ""
    text: dict = field(default_factory=dict)       # part -> normalised code (answered parts only)
    tokens: dict = field(default_factory=dict)     # part -> answer tokens beyond the stub
    fingerprints: dict = field(default_factory=dict)  # part -> set of hashes (given code's removed)
    notes: list = field(default_factory=list)      # "softmax compared as tokens: cell 5 does not parse"

    @property
    def key(self) -> tuple:
        return tuple(sorted(self.text.items()))

    def all_fingerprints(self) -> set:
        return set().union(*self.fingerprints.values()) if self.fingerprints else set()


def _hash(part: str, gram: tuple) -> int:
    return int.from_bytes(hashlib.blake2b("\x00".join((part, *gram)).encode(), digest_size=8).digest(), "big")


def kgrams(part: str, tokens: list[str]) -> list[int]:
    """The hashes of every K-gram of a part's tokens (a shorter stream is one gram)."""
    if len(tokens) < K:
        return [_hash(part, tuple(tokens))] if tokens else []
    return [_hash(part, tuple(tokens[i:i + K])) for i in range(len(tokens) - K + 1)]


def winnow(hashes: list[int]) -> set[int]:
    """The minimum hash of every window of WINDOW consecutive k-gram hashes."""
    if len(hashes) <= WINDOW:
        return set(hashes[:1] and [min(hashes)])
    return {min(hashes[i:i + WINDOW]) for i in range(len(hashes) - WINDOW + 1)}


class Exercise:
    """What the release notebook gives, and the reference's answers: what submissions are compared with."""

    def __init__(self, release: ParsedNotebook, reference_cells: list[dict] | None):
        self._cells: dict[str, object] = {}   # cell code -> what _parse found
        self._cached_chars = 0
        self._texts: dict[tuple, str] = {}    # (cell code, statement, its globals, its kept names) -> normalised
        self._grams: dict[tuple, tuple] = {}  # (part, normalised text) -> (tokens, fingerprints)
        self.given_cells = set()
        self.parts: list[str] = []       # names the solution cells define, in order
        self.part_cell: dict[str, str] = {}  # part -> grade_id of its solution cell
        self.kept = set(_BUILTINS)
        for cell in release.cells:
            if cell["type"] != "code":
                continue
            nbg = cell["metadata"].get("nbgrader") if isinstance(cell["metadata"].get("nbgrader"), dict) else {}
            try:
                tree = ast.parse(_code(cell["source"]))
            except SyntaxError:
                tree = ast.Module(body=[], type_ignores=[])
            self.kept |= _imported(tree)
            if nbg.get("solution"):
                for stmt in tree.body:
                    for n in _bound_names(stmt):
                        if n not in self.parts:
                            self.parts.append(n)
                            self.part_cell[n] = nbg.get("grade_id", "")
            else:
                self.given_cells.add(cell["source"].strip())
                if not is_test_cell(cell):  # the visible tests' variables (q, x) are no API
                    self.kept |= {n for stmt in tree.body for n in _bound_names(stmt)}
        self.kept |= set(self.parts)
        stub = self.answers(release, "(release notebook)", stub=True)
        self.stub_text = stub.text
        self.stub_tokens = {p: len(_tokens(t)) for p, t in stub.text.items()}
        self.given_hashes = set()
        for part, text in stub.text.items():
            self.given_hashes |= set(kgrams(part, _tokens(text)))
        self.reference = None
        if reference_cells is not None:
            ref = ParsedNotebook(path=Path(_REFERENCE), cells=reference_cells, metadata={})
            self.reference = self.answers(ref, _REFERENCE)

    def answers(self, nb: ParsedNotebook, who: str, stub: bool = False) -> Answers:
        """The normalised answers of a notebook (NotCompared when it cannot be compared)."""
        out = Answers(who, str(nb.path))
        cells = [c for c in nb.cells if c["type"] == "code" and not is_test_cell(c)
                 and c["source"].strip() not in self.given_cells]
        if sum(len(c["source"]) for c in cells) > MAX_CODE_CHARS:
            raise NotCompared(f"its code cells hold more than {MAX_CODE_CHARS:,} characters")
        defs: dict[str, _Statement] = {}
        kept = set(self.kept)
        unparsed: dict[str, tuple[str, str]] = {}  # grade_id -> (label, source) of solution cells that do not parse
        for cell in cells:
            code = _code(cell["source"])
            parsed = self._parse(code)
            if isinstance(parsed, str):
                nbg = cell["metadata"].get("nbgrader") if isinstance(cell["metadata"].get("nbgrader"), dict) else {}
                gid = nbg.get("grade_id")
                if isinstance(gid, str) and nbg.get("solution"):
                    unparsed[gid] = (f"cell {cell['index']}", cell["source"], parsed)
                else:
                    out.notes.append(f"cell {cell['index']}: {parsed}; its definitions are not compared")
                continue
            imported, stmts = parsed
            kept |= imported
            for st in stmts:
                for n in st.bound:
                    defs[n] = st  # the last definition is the one in force
        for part in self.parts:
            gid = self.part_cell[part]
            if part not in defs and gid in unparsed:
                label, source, why = unparsed[gid]
                toks = _tokens(_code(source), kept, rename=True)
                out.notes.append(f"{part}: {label} {why}; compared as tokens")
                self._add(out, part, " ".join(toks), toks, stub)
                continue
            if part not in defs:
                continue
            try:
                text = self._normalise(part, defs, kept)
            except (RecursionError, MemoryError, ValueError):
                raise NotCompared(f"its answer to {part} is nested too deeply to be compared") from None
            self._add(out, part, text, None, stub)
        return out

    def _parse(self, code: str):
        """A cell's (imported names, [(statement, names bound, names read, identifiers)]), or why it
        cannot be read; kept for identical cells, which are common in a class (up to `CACHE_CHARS`)."""
        got = self._cells.get(code)
        if got is not None:
            return got
        try:
            stmts = [_statement(code, i, stmt) for i, stmt in enumerate(ast.parse(code).body)]
            got = (set().union(*(st.imported for st in stmts)), stmts)
        except (RecursionError, MemoryError):
            got = "it is nested too deeply"
        except (SyntaxError, ValueError):
            got = "it does not parse"
        if len(code) <= CELL_CACHE_CHARS and self._cached_chars + len(code) <= CACHE_CHARS:
            self._cells[code] = got
            self._cached_chars += len(code)
        return got

    def _add(self, out: Answers, part: str, text: str, toks: list[str] | None, stub: bool) -> None:
        if not stub and text == self.stub_text.get(part):
            return  # not answered: the stub as given
        got = self._grams.get((part, text)) if toks is None else None
        if got is None:
            toks = _tokens(text) if toks is None else toks
            got = (len(toks), frozenset(winnow(kgrams(part, toks))))
            if len(text) <= CELL_CACHE_CHARS:
                self._grams[(part, text)] = got
        out.text[part] = text
        out.tokens[part] = max(got[0] - (0 if stub else self.stub_tokens.get(part, 0)), 0)
        if not stub:
            out.fingerprints[part] = got[1] - self.given_hashes

    def _normalise(self, part: str, defs: dict, kept: set[str]) -> str:
        """The part's definition and the learner's helpers it uses, normalised (see the module's docstring)."""
        glob: dict[str, str] = {}
        order, queue, done = [], [part], set()
        while queue:
            st = defs[queue.pop(0)]
            if id(st) in done:
                continue
            done.add(id(st))
            order.append(st)
            for n in st.loaded:
                if n in defs and n not in kept and n not in glob:
                    is_def = isinstance(defs[n].node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    glob[n] = f"{'h' if is_def else 'g'}{len(glob)}"
                    queue.append(n)
        kept = kept | {part}
        texts = []
        for st in order:
            key = (st.code, st.index, tuple(sorted((n, glob[n]) for n in st.idents if n in glob)),
                   frozenset(st.idents & kept))
            text = self._texts.get(key)
            if text is None:
                text = _normalised(st, kept, glob)
                if len(st.code) <= CELL_CACHE_CHARS:
                    self._texts[key] = text
            texts.append(text)
        return "\n".join(texts)
