"""The bibliography and the citations of the book agree, read from the sources (no build).

Pages cite with sphinxcontrib-bibtex's roles, {footcite:t}`key` and {footcite:p}`key`
(several keys comma-separated), and every page that cites ends with

    ## References

    ```{footbibliography}
    ```

`references.bib` holds one entry per cited work. These tests check, page by page and entry by
entry: every key cited has an entry; every entry is cited by some page (book/references.md
lists all of them with `:all:`, which does not count as citing); every entry names its
authors, title, year and venue and carries a DOI or an arXiv id, so a reader can find it;
keys follow the course's convention (first author's surname, year, first title word) and
are unique. Two works were published with neither a DOI nor an arXiv id; they carry the url
of the publisher's copy instead and are named in URL_ONLY, so that no other entry can
quietly go without an identifier. Pages write no MyST footnotes ([^label]): the build's
footnote warnings are silenced for {footcite}'s sake (_config.yml).
"""
import re
import unicodedata
from pathlib import Path

import pybtex.errors
import pytest
from pybtex.database import parse_file
from pybtex.richtext import Text

ROOT = Path(__file__).resolve().parents[2]
BIB = ROOT / "references.bib"
BOOK = ROOT / "book"

# The role of every citation form sphinxcontrib-bibtex offers (cite:p, footcite:t, cite:ts, ...).
CITE = re.compile(r"\{(?:foot)?cite(?::[a-z]+)?\}`([^`]*)`")
ENTRY_START = re.compile(r"^\s*@(\w+)\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
INLINE_CODE = re.compile(r"``.*?``")
REFERENCES_END = "## References\n\n```{footbibliography}\n```\n"

VENUE_FIELDS = ("journal", "booktitle", "publisher", "institution")
DOI = re.compile(r"^10\.\d{4,9}/\S+$")
ARXIV_ID = re.compile(r"^\d{4}\.\d{4,5}$")
KEY = re.compile(r"^([a-z]+)(\d{4})([a-z0-9]+)$")
# Works published with neither a DOI nor an arXiv id: the publisher's copy, by url.
URL_ONLY = {
    "glorot2010understanding": "https://proceedings.mlr.press/",
    "radford2019language": "https://cdn.openai.com/",
}
# Words a key's last part skips when it is the title's first word.
SKIPPED_TITLE_WORDS = {"a", "an", "the", "on", "of", "in", "to", "for", "and", "is", "are"}


def pages():
    """Every page of the book, book/**/*.md, as a path relative to the repository root."""
    return sorted(p.relative_to(ROOT) for p in BOOK.rglob("*.md") if "_ext" not in p.parts)


def prose(text):
    """The page's text with its code blanked: code cells and plain code blocks hold no
    citations. Directives (```{footbibliography}, ```{math}) stay. Lines keep their numbers."""
    out, closing = [], None
    for line in text.splitlines(keepends=True):
        fence = FENCE.match(line.rstrip("\n"))
        if closing is None:
            if fence and (not fence.group(2).startswith("{") or fence.group(2).startswith("{code-cell}")):
                closing = fence.group(1)
                out.append("\n")
                continue
            out.append(line)
        else:
            if fence and fence.group(1) == closing and not fence.group(2).strip():
                closing = None
            out.append("\n")
    return "".join(out)


def citations(text):
    """(line, key) of every citation in a page's text, code excluded (inline code too:
    a role shown as an example is written in double backticks, `` {footcite:t}`key` ``)."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), start=1):
        for match in CITE.finditer(INLINE_CODE.sub("", line)):
            for key in match.group(1).split(","):
                found.append((number, key.strip()))
    return found


def cited_keys():
    """{key: [page:line, ...]} over the whole book."""
    keys = {}
    for page in pages():
        for number, key in citations((ROOT / page).read_text(encoding="utf-8")):
            keys.setdefault(key, []).append(f"{page}:{number}")
    return keys


def entry_keys(bib_text):
    """Every key declared in the .bib text, in order, duplicates kept."""
    return [key for kind, key in ENTRY_START.findall(bib_text) if kind.lower() not in ("comment", "preamble", "string")]


def duplicates(keys):
    """Keys declared more than once; BibTeX keys are case-insensitive."""
    seen, twice = set(), []
    for key in keys:
        if key.lower() in seen:
            twice.append(key)
        seen.add(key.lower())
    return twice


def ascii_letters(text, digits=False):
    """'Delétang' -> 'deletang': accents dropped, only the letters a-z (and digits) kept."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]" if digits else r"[^a-z]", "", plain.lower())


def plain_text(person_part):
    """A name or title part with its LaTeX resolved ({\\'e} -> é, braces dropped)."""
    return Text.from_latex(person_part).render_as("text")


def entry_problems(key, entry):
    """What a reader would miss in one entry: a list of sentences, empty when it is complete."""
    fields = {name.lower(): value for name, value in entry.fields.items()}
    problems = []
    if not entry.persons.get("author"):
        problems.append("no author")
    for name in ("title", "year"):
        if not fields.get(name, "").strip():
            problems.append(f"no {name}")
    if not any(fields.get(name, "").strip() for name in VENUE_FIELDS):
        problems.append(f"no venue (one of {', '.join(VENUE_FIELDS)})")
    doi, eprint = fields.get("doi", "").strip(), fields.get("eprint", "").strip()
    if doi and not DOI.match(doi):
        problems.append(f"doi {doi!r} is not of the form 10.NNNN/...")
    if eprint:
        if not ARXIV_ID.match(eprint):
            problems.append(f"eprint {eprint!r} is not an arXiv id (YYMM.NNNNN)")
        if fields.get("archiveprefix", "").lower() != "arxiv":
            problems.append("an eprint needs archiveprefix = {arXiv}")
    if key in URL_ONLY:
        if doi or eprint:
            problems.append("has a doi or eprint: remove it from URL_ONLY")
        if not fields.get("url", "").startswith(URL_ONLY[key]):
            problems.append(f"needs a url at {URL_ONLY[key]}")
    elif not (doi or eprint):
        problems.append("neither a doi nor an arXiv eprint")
    return problems


def key_problems(key, entry):
    """Does the key read first author's surname + year + first significant title word?

    A title word keeps its hyphenated parts and digits ("Self-Attention" -> selfattention,
    "FlashAttention-2" -> flashattention2); the key may shorten it ("GPT-NeoX-20B" -> gptneox).
    """
    match = KEY.match(key)
    if not match:
        return [f"key {key!r} is not surname + year + word, lowercase letters (and digits)"]
    surname, year, word = match.groups()
    problems = []
    authors = entry.persons.get("author") or []
    if authors:
        wanted = ascii_letters(plain_text(" ".join(authors[0].last_names)))
        if surname != wanted:
            problems.append(f"key starts with {surname!r}, the first author's surname is {wanted!r}")
    if year != entry.fields.get("year", "").strip():
        problems.append(f"key's year {year} is not the entry's year {entry.fields.get('year')}")
    words = [ascii_letters(w, digits=True) for w in re.split(r"[\s:,.?]+", plain_text(entry.fields.get("title", "")))]
    significant = [w for w in words if w and w not in SKIPPED_TITLE_WORDS]
    if significant and not significant[0].startswith(word):
        problems.append(f"key ends with {word!r}, the title's first significant word is {significant[0]!r}")
    return problems


def references_end_problem(text):
    """None when a page ends with its References section and footbibliography, else why not."""
    if text.rstrip("\n") + "\n" != text:
        return "the page must end with exactly one newline"
    if not text.endswith(REFERENCES_END):
        return "does not end with '## References' and an empty ```{footbibliography}``` block"
    return None


@pytest.fixture(scope="module")
def bib_text():
    return BIB.read_text(encoding="utf-8")


def parse_bib():
    """The parsed bibliography and the errors the parser met, collected instead of raised
    (a repeated key would otherwise stop every test here with the same error)."""
    with pybtex.errors.capture() as errors:
        data = parse_file(str(BIB), bib_format="bibtex")
    return data, list(errors)


@pytest.fixture(scope="module")
def bibliography():
    return parse_bib()[0]


def test_bib_parses_cleanly():
    errors = parse_bib()[1]
    assert not errors, "references.bib: " + "; ".join(str(error) for error in errors)


def test_no_duplicate_keys(bib_text):
    twice = duplicates(entry_keys(bib_text))
    assert not twice, f"references.bib declares these keys more than once: {twice}"


def test_every_citation_has_an_entry(bibliography):
    known = set(bibliography.entries.keys())
    missing = {key: where for key, where in cited_keys().items() if key not in known}
    assert not missing, "cited but not in references.bib: " + "; ".join(
        f"{key} ({', '.join(where)})" for key, where in sorted(missing.items()))


def test_every_entry_is_cited(bibliography):
    cited = set(cited_keys())
    uncited = sorted(key for key in bibliography.entries.keys() if key not in cited)
    assert not uncited, f"in references.bib but cited by no page (remove them or cite them): {uncited}"


def test_every_entry_is_complete(bibliography):
    problems = {key: entry_problems(key, entry) for key, entry in bibliography.entries.items()}
    problems = {key: p for key, p in problems.items() if p}
    assert not problems, "incomplete entries: " + "; ".join(
        f"{key}: {', '.join(p)}" for key, p in sorted(problems.items()))


def test_url_only_entries_exist(bibliography):
    stale = sorted(set(URL_ONLY) - set(bibliography.entries.keys()))
    assert not stale, f"URL_ONLY names entries that references.bib lacks: {stale}"


def test_keys_follow_the_convention(bibliography):
    problems = {key: key_problems(key, entry) for key, entry in bibliography.entries.items()}
    problems = {key: p for key, p in problems.items() if p}
    assert not problems, "keys off the convention: " + "; ".join(
        f"{key}: {', '.join(p)}" for key, p in sorted(problems.items()))


def test_citing_pages_end_with_their_references():
    wrong = {}
    for page in pages():
        text = (ROOT / page).read_text(encoding="utf-8")
        if citations(text):
            problem = references_end_problem(text)
            if problem:
                wrong[str(page)] = problem
        elif re.search(r"^`{3,}\{footbibliography\}", text, re.MULTILINE):
            wrong[str(page)] = "has a footbibliography but cites nothing"
    assert not wrong, "; ".join(f"{page}: {problem}" for page, problem in sorted(wrong.items()))


def test_no_myst_footnotes():
    """_config.yml silences MyST's footnote warnings, which every {footcite} raises; that is
    safe only while the book writes no MyST footnotes ([^label]) of its own."""
    found = [f"{page}:{number}" for page in pages()
             for number, line in enumerate(prose((ROOT / page).read_text(encoding="utf-8")).splitlines(), start=1)
             if re.search(r"\[\^[^\]]+\]", line)]
    assert not found, f"MyST footnotes, which the build would not check: {found}; cite with {{footcite}} instead"


def test_bibliography_page_lists_every_entry():
    text = (BOOK / "references.md").read_text(encoding="utf-8")
    assert re.search(r"^```\{bibliography\}\n:all:\n```$", text, re.MULTILINE), \
        "book/references.md must hold a ```{bibliography}``` block with :all:"


@pytest.mark.parametrize("text, expected", [
    ("See {footcite:t}`a2020x`.\n", [(1, "a2020x")]),
    ("Two {footcite:p}`a2020x, b2021y` and {cite:t}`c2019z`.\n", [(1, "a2020x"), (1, "b2021y"), (1, "c2019z")]),
    ("```{code-cell} ipython3\nprint('{footcite:t}`in2020code`')\n```\nAfter {footcite}`d2018w`\n",
     [(4, "d2018w")]),
    ("```bash\necho {footcite:t}`in2020block`\n```\n", []),
    ("Write `` {footcite:t}`key` `` to cite.\n", []),
])
def test_citations_are_read_from_prose_only(text, expected):
    assert citations(text) == expected
