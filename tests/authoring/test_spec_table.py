"""Every sentence of every exercise's spec names the hidden checks that test it (autograder/authoring/spec_table.py).

The tables in book/instructors/hidden-tests.md are generated from the masters, their
`KEY.spec.toml` files and the hidden tests; `generate --check` (tests/authoring/test_generate.py) keeps them
current, and these tests keep them complete: no sentence without a quote, no quote the master no
longer holds, no check that does not exist.
"""

from __future__ import annotations

import pytest

from autograder.authoring import spec_table as T
from autograder.core.assignments import all_assignments

KEYS = [T.INSTRUCTIONS] + [a.key for a in all_assignments()]

MASTER = """---
kernelspec:
  name: python3
---

# Exercise 99: a title is not a sentence

Intro text. It says `a. B` inside code and $x. Y$ inside math, e.g. `f`, and goes on.

<!-- instructions -->

```{code-cell} ipython3
:grader: solution f
def f(x):
    \"\"\"Not prose. Not a sentence.\"\"\"
```

+++

## Part 1: f (1 point)

`f(x)` returns x doubled:

* a negative `x` raises a `ValueError`;
* ties go to the lower id. Always.
"""


def test_the_master_is_split_into_its_sentences():
    """Code cells, headings, comments and front matter are not prose; a sentence ends at a full stop
    followed by a capital, a backtick or `$`, never inside code or math or after "e.g."; list items are sentences."""
    _, sents = T.sentences(MASTER)
    assert [s.text for s in sents] == [
        "Intro text.", "It says `a. B` inside code and $x. Y$ inside math, e.g. `f`, and goes on.",
        "`f(x)` returns x doubled:", "a negative `x` raises a `ValueError`;", "ties go to the lower id.", "Always."]
    assert sents[-1].section == "Part 1: f (1 point)"


def test_a_sentence_without_its_check_is_reported():
    """Each rule of the spec file fails when broken: a sentence no quote covers, a quote the master does not
    hold (or holds twice), a check that does not exist, a quote with neither checks nor a reason."""
    known = {"test_f_doubles", "test_f_raises"}
    quotes = [{"quote": "Intro text. It says", "none": "background"},
              {"quote": "`f(x)` returns x doubled", "checks": ["test_f_doubles"]},
              {"quote": "a negative `x` raises a `ValueError`", "checks": ["test_f_raises"]},
              {"quote": "ties go to the lower id. Always.", "checks": ["test_f_doubles", T.EVERY_CALL]}]
    sents, problems = T.match(MASTER, quotes, known)
    assert problems == [] and all(s.quotes for s in sents)
    _, problems = T.match(MASTER, quotes[:2] + quotes[3:], known)
    assert problems == ["untested sentence (Part 1: f (1 point)): a negative `x` raises a `ValueError`;"]
    bad = [{"quote": "a negative x raises", "checks": ["test_f_raises"]},
           {"quote": "`f(x)` returns x doubled", "checks": ["test_f_halves"]},
           {"quote": "inside", "none": "twice"},
           {"quote": "Always."}]
    _, problems = T.match(MASTER, quotes + bad, known)
    assert any("'a negative x raises'" in p and "occurs 0 times" in p for p in problems)
    assert any("test_f_halves is not a hidden check" in p for p in problems)
    assert any("'inside'" in p and "occurs 2 times" in p for p in problems)
    assert any("'Always.'" in p and "either checks" in p for p in problems)


@pytest.mark.parametrize("key", KEYS)
def test_every_sentence_of_the_spec_names_its_checks(key):
    """Does every sentence of the master (or of the shared instructions) name the hidden checks that fail
    when it is not done, or say why it asks nothing, with every quote found once and every check real?"""
    report = T.report(key)
    assert report.problems == [], "\n".join(report.problems)


def test_the_book_includes_every_table():
    """Does the instructors' page include the generated table of every exercise and of the instructions?"""
    page = (T.ROOT / "book" / "instructors" / "hidden-tests.md").read_text(encoding="utf-8")
    for key in KEYS:
        assert f"```{{include}} spec/{key}.md\n```" in page, key
        assert (T.TABLES / f"{key}.md").read_text(encoding="utf-8") == T.markdown(key)
