"""One notation across the book: every symbol a page defines is in book/notation.md, with the
meaning notation.md gives it.

book/notation.md lists each symbol once, in the first column of its tables, with its meaning.
These tests read the markdown sources (no build): the prose of every chapter page, without its
code cells, code blocks and inline code, and find the sentences that define a symbol, in the
forms the book uses:

* an apposition, a noun phrase and then the symbol: "the hidden size $D$", "the number of
  layers $N$", "the *update gate* $z$", "the **context vector** $c = h_S$". Only a phrase
  that starts with an article or a possessive and ends in a noun that names a quantity or an
  object (`HEADS`, or a term set in bold or italics, or "number of ...") counts, so that "the
  code uses $p_t$" is no definition;
* the symbol at the start of a clause, then "is", "denotes" or "stands for", an article and
  a phrase: "$L$ is the loss", "where $X$ denotes the ...".

Each definition must name a symbol of notation.md (the symbol, or for $X = \\dots$ its left
side; $O(T)$ is the symbol $O(\\cdot)$), and every word of its phrase, but for a few that carry
no meaning (`VAGUE`), must occur in that symbol's row. A page that gives a letter a second
meaning ("the depth $L$" where notation.md says $L$ is a length) therefore fails, as does one
that defines a symbol notation.md does not list. An indexed symbol ($y_{t-1}$) reads with
its sequence's row ($y$), a function named alone ($\\mathcal{L}$) with its row
($\\mathcal{L}(\\cdot)$). Failures name the page, the line, the symbol and the phrase.
"""
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
NOTATION = BOOK / "notation.md"

FENCE = re.compile(r"^(`{3,}|:{3,}|~{3,})\s*(\{[\w:-]+\})?")
ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # {footcite:p}`key`, {glue:text}`name`, {doc}`notation`
INLINE_CODE = re.compile(r"`[^`\n]*`")
MATH = re.compile(r"\$\$(.*?)\$\$|\$([^$]+?)\$", re.DOTALL)  # inline math may span lines

ATOM = r"(?:\\[A-Za-z]+\{[A-Za-z]\}|\\[A-Za-z]+|[A-Za-z])"  # \mathcal{V}, \alpha, x
SCRIPT = r"(?:[_^](?:\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}|\\[A-Za-z]+(?:\{[^{}]*\})?|[A-Za-z0-9]))"
ARGUMENT = r"\([^()]*\)"
NAME = r"(?:[A-Z]{2,3}|\\text\{[a-z]+\})"  # PE(p), \operatorname{softmax}(z): only with an argument
SYMBOL = re.compile(rf"(?:\|{ATOM}\||\\tilde{ATOM}|{ATOM})'?{SCRIPT}{{0,2}}(?:{ARGUMENT}{SCRIPT}{{0,2}})?"
                    rf"|{NAME}{ARGUMENT}{SCRIPT}{{0,2}}")

WORD = r"[*]{0,2}[A-Za-z][\w'-]*[*]{0,2}"
ARTICLES = frozenset("the a an its their our".split())
# "$X$ is the ...", "where $X$ denotes a ...": the symbol opens a clause.
STATEMENT = re.compile(rf"(?:^|[.;:(]\s+|\b[Ww]here\s+|\b[Hh]ere\s+)@(\d+)@\s+(?:is|denotes|stands for)\s+(?:the|an?)\s+"
                       rf"((?:{WORD}\s+){{0,5}}{WORD})", re.MULTILINE)
STOP = frozenset("""the a an of its their our each this that these those to in on at by with for from than as and
or is are be it which who whose all every any one two three some more most no not""".split())
# The nouns whose apposition with a symbol defines it.
HEADS = frozenset("""size width length depth dimension count number rate temperature penalty weight vector matrix
table state gate bias gain shift frequency loss compute probability mask score query key value input output
embedding token position step head layer block parameter sum maximum window rotation projection
deviation angle""".split())
# Words a definition may use that need not occur in the symbol's row.
VAGUE = frozenset("same new old previous current true fixed whole given usual learned real first last wanted".split())


def stem(word):
    word = word.strip("*'").lower()
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word


def words(text):
    return {stem(w) for w in re.findall(r"[A-Za-z][\w'-]*", text)}


def normalise(math):
    """One spelling per symbol: no spacing commands or spaces, \\lvert as |, \\mathrm and
    \\operatorname as \\text, braces around a one-character script dropped."""
    s = re.sub(r"\\[,;!: ]|\\q?quad\b", "", math)
    s = s.replace(r"\lvert", "|").replace(r"\rvert", "|")
    s = re.sub(r"\\(?:mathrm|text|operatorname|mathit)\s*\{([^}]*)\}", r"\\text{\1}", s)
    s = re.sub(r"\s+", "", s)
    return re.sub(r"([_^])\{(\\[A-Za-z]+|[A-Za-z0-9])\}", r"\1\2", s)


def symbol_of(math):
    """The symbol a piece of inline math names, or None: the whole of it ($d_{ff}$), or the left
    side of one equation ($c = h_S$); an argument in parentheses becomes (\\cdot): $O(T)$ is
    the symbol $O(\\cdot)$."""
    s = normalise(math)
    if s.count("=") == 1:
        s = s.split("=")[0]
    if not SYMBOL.fullmatch(s):
        return None
    return re.sub(r"\([^()]*\)", r"(\\cdot)", s, count=1)


def prose_lines(text):
    """The page's lines with code cells and code blocks blanked, so that line numbers stay."""
    out, fence = [], None
    for line in text.splitlines():
        if fence is not None:
            if line.strip() == fence:
                fence = None
            out.append("")
            continue
        start = FENCE.match(line)
        if start and start.group(2) in (None, "{code-cell}"):
            fence = start.group(1)
            out.append("")
            continue
        out.append(line)
    return out


def definitions(text):
    """(line, symbol, phrase) for every definition of a symbol in a page's prose."""
    prose = "\n".join(prose_lines(text))
    prose = INLINE_CODE.sub(" X ", ROLE.sub(" X ", prose))
    maths = []

    def placeholder(match):
        if match.group(1) is not None:  # display math: a sentence boundary, its newlines kept
            return " ; " + "\n" * match.group(0).count("\n")
        maths.append(match.group(2).replace("\n", " "))
        return f"@{len(maths) - 1}@" + "\n" * match.group(0).count("\n")

    prose = MATH.sub(placeholder, prose)
    found = []

    def add(at, index, phrase):
        symbol = symbol_of(maths[int(index)])
        if symbol and phrase:
            found.append((prose[:at].count("\n") + 1, symbol, " ".join(phrase)))

    for match in re.finditer(r"@(\d+)@", prose):
        before = re.split(r"[^\w\s*'-]", prose[max(0, match.start() - 120):match.start()])[-1].split()
        phrase = []  # the words between the symbol and the nearest article before it
        while before and stem(before[-1]) not in ARTICLES:
            phrase.insert(0, before.pop())
        if not before or not phrase:
            continue
        counted = [stem(word) for word in phrase[:2]] == ["number", "of"]
        inner = phrase[2:] if counted else phrase
        if any(stem(word) in STOP for word in inner) or len(inner) > 3 or "X" in phrase:
            continue
        if any(word.startswith("*") for word in phrase) or stem(phrase[-1]) in HEADS or counted:
            add(match.start(), match.group(1), phrase)
    for match in STATEMENT.finditer(prose):
        phrase = []
        for word in match.group(2).split():
            if stem(word) in STOP and stem(word) != "of":
                break
            phrase.append(word)
        while phrase and stem(phrase[-1]) == "of":
            phrase.pop()
        add(match.start(1), match.group(1), phrase)
    return sorted(found)


def notation_rows(text):
    """[(symbol, row text, line)] for every symbol in the first column of notation.md's tables."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("| $"):
            continue
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        first = cells[0]
        for math in re.findall(r"\$([^$]+)\$", first):
            symbol = symbol_of(math)
            assert symbol, f"notation.md:{number}: {math!r} is not read as a symbol"
            rows.append((symbol, line, number))
    return rows


INDEX = re.compile(r"_(?:\{[tjikSTn0-9+\- ]+\}|[tjikSTn0-9])")  # s_t, y_{t-1}, x_{S-1-t}


def entry(symbol, table):
    """The rows of `table` that a page's symbol reads with: its own; for an indexed symbol
    ($y_{t-1}$, $s_{t-1}$) those of the sequence ($y$) or of another index ($s_t$); for a
    function named without its argument ($\\mathcal{L}$) those of $\\mathcal{L}(\\cdot)$."""
    if symbol in table:
        return table[symbol]
    if symbol + "(\\cdot)" in table:
        return table[symbol + "(\\cdot)"]
    bare = INDEX.sub("", symbol)
    if bare != symbol:
        return [row for key, rows in table.items() if INDEX.sub("", key) == bare for row in rows]
    return []


@lru_cache
def notation():
    """symbol -> (row text, line) from notation.md."""
    table = {}
    for symbol, line, number in notation_rows(NOTATION.read_text(encoding="utf-8")):
        table.setdefault(symbol, []).append((line, number))
    return table


def problems(text, table=None):
    """What is wrong with one page's definitions, one message each."""
    table = notation() if table is None else table
    found = []
    for line, symbol, phrase in definitions(text):
        rows = entry(symbol, table)
        if not rows:
            found.append(f"line {line}: ${symbol}$ ({phrase!r}) is not in notation.md")
            continue
        row = set().union(*(words(text) for text, _ in rows))
        missing = [w for w in phrase.split() if stem(w) not in STOP | VAGUE and stem(w) not in row]
        if missing:
            found.append(f"line {line}: ${symbol}$ is defined as {phrase!r}, but notation.md:"
                         f"{rows[0][1]} gives it another meaning (no {', '.join(missing)})")
    return found


def chapters():
    return sorted(BOOK.glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize("page", chapters(), ids=lambda p: p.stem)
def test_page_defines_symbols_as_notation_does(page):
    found = problems(page.read_text(encoding="utf-8"))
    assert not found, f"{page.name}:\n" + "\n".join(found)


@pytest.mark.parametrize("sentence, problem", [
    ("The model stacks blocks; the depth $L$ sets its size.", "another meaning (no depth)"),
    ("Each id selects a row of an embedding table $E$.", "another meaning (no table)"),
    ("Here $V$ is the vocabulary size of the model.", "another meaning (no vocabulary, size)"),
    ("Scores are divided by the length raised to the length penalty $\\alpha$.", "is not in notation.md"),
    ("The loss falls with the number of training tokens $D$.", "another meaning (no number, training)"),
])
def test_a_second_meaning_or_an_unlisted_symbol_is_found(sentence, problem):
    found = problems(f"# A page\n\nSome prose.\n{sentence}\n")
    assert len(found) == 1 and found[0].startswith("line 4:") and problem in found[0], found


def test_uses_and_code_are_not_definitions():
    text = """# A page

The hidden size $D$ and the number of heads $H$ agree with notation.md; so does
$h_j$, and a sum over $j$ such as $\\sum_j \\alpha_{tj} h_j$.

```{code-cell} ipython3
print("the depth $L$")  # code: not read
```

Inline code such as `the depth $L$` is not read either.
"""
    assert problems(text) == []
