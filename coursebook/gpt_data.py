"""Chapter 09's text: the Python documentation that ships with Python, split by document, and
what the classic compressors make of it.

Hand-written, not generated. ``pydoc_data.topics.topics`` is the help text of ``help("if")``,
``help("formatstrings")`` and the other keywords and topics of the language reference: 79
documents, about 466 kB of English prose with grammar rules and code examples between them,
installed with every CPython (it changes only between Python releases; ``data_hash`` tells).
Nothing is downloaded.

Many topics are sections of others (``help("for")`` is a part of ``help("compound")``,
``help("numeric-types")`` of ``help("specialnames")``): split as they are, a held-out section
would have been read in training inside its parent, and xz would "predict" it at 0.7 bits per
byte. So a document is dropped when at least half of its long lines (over 40 bytes, stripped)
appear in a longer document; 22 of the 79 go (92 kB), 57 documents (374 kB) are kept. The
docstrings of the standard library would add text, but they depend on the exact build of
Python and on which optional modules it was compiled with, so they are left out.

The split is by document, never inside one: the kept documents are taken in the order of the
SHA-256 of their topic names; each goes to ``test`` if the test text stays within 10 % of the
kept bytes with it, else to ``valid`` if that stays within 5 %, else to ``train``. Within a split the
documents are in the order of their names, joined by one newline (each already ends with one,
so a blank line separates them). The texts are bytes (UTF-8).

``compressor_bits_per_byte`` measures gzip -9, bzip2 -9 and xz -9e (Python's own modules) on a
held-out text after they have seen the training text: the conditional figure
8 (|C(train + test)| - |C(train)|) / |test|, the bits the compressor adds for the held-out bytes.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
from functools import lru_cache

SPLITS = ("train", "valid", "test")
SHARES = {"test": 0.10, "valid": 0.05}  # at most this share of the kept bytes, whole documents
SEPARATOR = b"\n"


def documents() -> dict[str, bytes]:
    """Topic name -> its text as UTF-8 bytes, every document of pydoc_data."""
    from pydoc_data.topics import topics
    return {name: text.encode("utf-8") for name, text in topics.items()}


LONG_LINE = 40  # bytes: shorter lines ("Examples:", "   pass") recur in unrelated documents


def long_lines(body: bytes) -> set[bytes]:
    return {line.strip() for line in body.split(b"\n") if len(line.strip()) > LONG_LINE}


@lru_cache(maxsize=1)
def sections() -> dict[str, str]:
    """Dropped topic name -> the longer document that holds at least half of its long lines."""
    docs = documents()
    lines = {n: long_lines(t) for n, t in docs.items()}
    dropped = {}
    for name in sorted(docs):
        for other in sorted(docs, key=lambda n: (-len(docs[n]), n)):
            if (other != name and len(docs[other]) > len(docs[name]) and lines[name]
                    and 2 * len(lines[name] & lines[other]) >= len(lines[name])):
                dropped[name] = other
                break
    return dropped


def name_hash(name: str) -> str:
    """The order documents are assigned in: the SHA-256 of the topic name, nothing else."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def assignment() -> dict[str, str]:
    """Kept topic name -> its split ("train", "valid" or "test")."""
    docs = {n: t for n, t in documents().items() if n not in sections()}
    total = sum(len(t) for t in docs.values())
    sides, held = {}, {"test": 0, "valid": 0}
    for name in sorted(docs, key=name_hash):
        size = len(docs[name])
        side = next((s for s in ("test", "valid") if held[s] + size <= SHARES[s] * total), "train")
        sides[name] = side
        if side != "train":
            held[side] += len(docs[name])
    return sides


def split_names(split: str) -> list[str]:
    """The topic names of one split, in sorted order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return sorted(n for n, s in assignment().items() if s == split)


@lru_cache(maxsize=None)
def text(split: str) -> bytes:
    """The documents of one split, in name order, joined by a newline."""
    docs = documents()
    return SEPARATOR.join(docs[n] for n in split_names(split))


@lru_cache(maxsize=1)
def data_hash() -> str:
    """A hash of every document and its side: changes when Python's documentation changes."""
    h = hashlib.sha256()
    for name, body in sorted(documents().items()):
        side = assignment().get(name, "dropped")
        h.update(f"{name}\t{side}\t{len(body)}\n".encode())
        h.update(body)
    return h.hexdigest()[:16]


# --- the classic compressors ------------------------------------------------------------------------

COMPRESSORS = {
    "gzip -9": lambda data: gzip.compress(data, compresslevel=9, mtime=0),
    "bzip2 -9": lambda data: bz2.compress(data, compresslevel=9),
    "xz -9e": lambda data: lzma.compress(data, preset=9 | lzma.PRESET_EXTREME),
}


def conditional_bits_per_byte(compress, train: bytes, test: bytes) -> float:
    """What one compressor adds for `test` once it has seen `train`, in bits per byte of `test`."""
    if not test:
        raise ValueError("the held-out text is empty")
    return 8 * (len(compress(train + test)) - len(compress(train))) / len(test)


def compressor_bits_per_byte(train: bytes, test: bytes) -> dict[str, float]:
    """{"gzip -9": ..., "bzip2 -9": ..., "xz -9e": ...}: each one's conditional bits per byte."""
    return {name: conditional_bits_per_byte(c, train, test) for name, c in COMPRESSORS.items()}
