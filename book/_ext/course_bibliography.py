"""The bibliography's look: entries sorted by author and year, labelled "Vaswani et al., 2017".

sphinxcontrib-bibtex formats references.bib with a pybtex style. The course registers one
here, `authoryear`: pybtex's `unsrt` formatting (which links each entry's doi and arXiv id),
sorted by first author, year and title, with an author-year label instead of a number.
Two works with the same label get "2017a", "2017b". `_config.yml` selects it with
`bibtex_default_style: authoryear`; chapters cite with {footcite:t}/{footcite:p}, whose
footnotes keep their numbers.
"""
from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle

STYLE_NAME = "authoryear"


def surname(person):
    """A person's last name(s) as plain text, LaTeX accents resolved ("Delétang")."""
    return " ".join(part.render_as("text") for part in person.rich_last_names)


def author_year(entry):
    """The label of one entry without its disambiguating letter: "Press and Wolf, 2017"."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [surname(person) for person in people]
    if not names:
        who = entry.fields.get("institution", entry.fields.get("publisher", "Anonymous"))
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """Labels "Surname, year", "A and B, year" or "Surname et al., year"; repeats get a, b, ..."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year(entry) for entry in entries]
        counts = Counter(labels)
        seen = Counter()
        for label in labels:
            if counts[label] > 1:
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label]]
                seen[label] += 1
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    """pybtex's unsrt entries, sorted by author, year and title, with author-year labels."""

    default_label_style = AuthorYearLabels
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.formatting", STYLE_NAME, AuthorYearStyle, force=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
