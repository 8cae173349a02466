"""The hash that ties the kept weights to their code covers what runs, not what is read: docstrings,
comments, blank lines and trailing spaces may change without making the weights stale."""

import hashlib

from coursebook import kept_weights
from coursebook.kept_weights import strip_comments_and_docstrings as strip

SOURCE = '''\
class Decoder(Base):
    """One step: (B,), (B, H) -> (B, V)."""

    def forward(self, y, hidden):
        """Advance by one token."""
        x = self.embedding(y)  # (B, E)
        return self.out(x), hidden  # (B, V), (B, H)
'''

REWORDED = '''\
class Decoder(Base):
    """One step of the decoder:
    (B,), (B, D) -> (B, V), in the book's notation."""
    def forward(self, y, hidden):   
        # the previous token's embedding first
        x = self.embedding(y)  # (B, E), é
        return self.out(x), hidden
'''


def test_docstrings_comments_and_blank_lines_do_not_count():
    assert strip(SOURCE) == strip(REWORDED) == (
        "class Decoder(Base):\n"
        "    def forward(self, y, hidden):\n"
        "        x = self.embedding(y)\n"
        "        return self.out(x), hidden\n")


def test_a_change_to_the_code_counts():
    assert strip(SOURCE) != strip(SOURCE.replace("self.out(x)", "self.out(x * 2)"))


def test_strings_that_are_not_docstrings_are_kept():
    source = ('def f(x):\n'
              '    """Doc."""\n'
              '    "a bare string after the first statement is code"\n'
              '    return x + "# not a comment"  # a comment\n')
    assert strip(source) == ('def f(x):\n'
                             '    "a bare string after the first statement is code"\n'
                             '    return x + "# not a comment"\n')


def test_columns_after_non_ascii_text_on_the_same_line():
    source = 'def f():\n    é = 1; """not first: kept"""\n    return é  # ünïcode\n'
    assert strip(source) == 'def f():\n    é = 1; """not first: kept"""\n    return é\n'
    assert strip('def g(): """Dö."""; return 1  # ∑\n') == "def g(): ; return 1\n"


def test_module_docstring_and_indented_source():
    assert strip('"""Module."""\n\nimport os\n') == "import os\n"
    assert strip('    def m(self):\n        """Doc."""\n        return 1\n') == "def m(self):\n    return 1\n"


def sample(x):
    """A function whose source the hash reads."""
    return x + 1  # a comment


def test_source_hash_reads_objects_and_takes_strings_as_they_are():
    code = "def sample(x):\n    return x + 1\n"
    pattern = "[a-z]+  # kept: a str is hashed as it is"
    expected = hashlib.sha256((code + pattern).encode()).hexdigest()[:16]
    assert kept_weights.source_hash([sample, pattern]) == expected


def test_the_hash_follows_the_code_not_its_module_or_folder(tmp_path, monkeypatch):
    """The same file, imported under two module names from two folders, hashes the same: moving an
    experiment (solutions/ to coursebook/, say) keeps its weights current."""
    import importlib.util
    import sys

    source = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n\n\nclass Disc:\n    r = 1.0\n"
    hashes = []
    for folder, name in (("one", "first_name"), ("two/deeper", "second_name")):
        path = tmp_path / folder / f"{name}.py"
        path.parent.mkdir(parents=True)
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)  # where inspect finds a class's file
        spec.loader.exec_module(module)
        hashes.append(kept_weights.source_hash([module.area, module.Disc, module]))
    assert hashes[0] == hashes[1]
