"""Hidden tests for exercise 08_pronunciation: the vocabularies and the encoding of a word, padded
and bucketed batches, the edit distance and the error rates, one training step, and beam search
with length normalisation.

Parts 1 to 3 are plain Python: their results are compared exactly with the reference (the edit
distance with rapidfuzz's Levenshtein distance, an independent oracle) on fresh random symbols,
words and lengths, plus fixed pairs of swapped neighbours (which a distance with transpositions
counts as one edit), and a wrong result is explained by the typical mistake it matches, computed
here. `bucket_batches` is judged by its properties, not by the reference's order (the spec fixes
no draw order): a partition into full batches but one, batches that are runs of the
length-sorted order, a shuffled batch order, the same batches for the same generator seed, and
words of one length grouped otherwise by other seeds (shuffled before the sort). Its generator,
like part 4's optimizers, is built in the learner's process from the notebook's own `torch`.

Parts 4 and 5 run the learner's code on the locked TinyTransformer holding weights drawn here
(float32 numbers kept in float64, so that both sides hold exactly the same model), and compare
with the reference's function run here on the same model: the loss and every parameter after
one SGD step and after two Adam steps, and the list of (tokens, score) of beam search, its scores
to float32's precision (a beam search may compute its log-probabilities in float32; every cut of
the beam that decides the result has a margin far above that precision). Every input on which a
typical mistake is named is chosen (tried here first) so that the mistake changes the result, and
each beam-search check either always or never sees each beam policy mistake, whatever the seed:
a verdict never depends on luck.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from rapidfuzz.distance import OSA, DamerauLevenshtein, Levenshtein

from autograder.hidden.support import (Hint, close, describe, diagnose, expect, expect_device_agnostic, learner_module,
                                       method, odd_tensor, points, tensor)
from autograder.isolation import optimizers
from autograder.isolation.errors import LearnerError
from autograder.isolation.runner import RemoteObject


PAD, SOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
F64 = torch.float64
LETTERS = list("abcdefghijklmnopqrstuvwxyz") + ["'", "-", "é", "ç", "A", "Z"]
PHONEMES = ["AA", "AE", "AH", "AH0", "AH1", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "ER0", "EY",
            "F", "G", "HH", "IH", "IY", "IY1", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
            "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH"]

# --- hints ------------------------------------------------------------------------------------

TS_NO_OPTIMIZER = "The grader could not build an optimizer in your notebook's process (did the notebook change torch?)."
TORCH_GONE = ("The notebook's `torch` is not PyTorch any more (the checks build generators "
              "from it): do not rebind the name torch.")

BV_TYPE = "`build_vocab` must return a dict from each symbol (a str) to its id (an int)."
BV_NO_SPECIALS = ("`build_vocab` leaves out the four special symbols: SPECIALS come first, with the ids 0 to 3, "
                  "and the symbols of the data from 4 on.")
BV_SPECIALS_LAST = "`build_vocab` puts the special symbols after the others: they take the ids 0 to 3."
BV_FIRST_SEEN = ("`build_vocab` numbers the symbols in the order they first appear: sort the distinct symbols, "
                 "so that the ids do not depend on the order of the words.")
BV_DESCENDING = "`build_vocab` sorts the symbols in descending order: sorted() gives the ascending order."
BV_GAPS = ("`build_vocab`'s ids have gaps or repeats: number the DISTINCT symbols (a set), one id each, "
           "consecutive from 4.")
BV_SPECIAL_TWICE = ("A symbol of the data equal to a special's string (such as '<unk>') gets a second id: a "
                    "special keeps its id 0 to 3; leave the specials out of the sorted symbols.")
BV_GENERIC = ("`build_vocab` differs from SPECIALS (ids 0 to 3) followed by the distinct symbols of the "
              "sequences in sorted order (ids from 4).")
EN_TYPE = "`encode` must return a Python list of int ids."
EN_KEY_ERROR = ("`encode` raises KeyError for a symbol the vocabulary does not have: such a symbol becomes "
                "UNK's id (vocab.get(symbol, unk)), never an error.")
EN_DROPS = "`encode` drops the symbols the vocabulary does not have: each one becomes UNK's id."
EN_NO_EOS = "`encode(..., add_eos=True)` does not end the list with EOS's id."
EN_ALWAYS_EOS = "`encode` appends EOS also when add_eos is False (the default): only add_eos=True appends it."
EN_SOS = "`encode` puts SOS's id first: the list holds the symbols' ids (and EOS's with add_eos) only."
EN_GENERIC = "`encode` differs from the ids of the symbols in the vocabulary (UNK's for an unknown one)."

PB_TYPE = "`pad_batch` must return a pair (ids, mask) of tensors."
PB_MASK_INVERTED = "`pad_batch`'s mask is inverted: True marks the real symbols, False the padding."
PB_PAD_IGNORED = "`pad_batch` ignores its `pad` argument: fill with the value passed, not with PAD."
PB_LEFT = "`pad_batch` pads on the left: each row holds its sequence first, then the padding."
PB_MASK_FROM_IDS = ("`pad_batch`'s mask compares the ids with the padding value: a real symbol can have that id; "
                    "build the mask from the sequences' lengths.")
PB_IDS_DTYPE = "`pad_batch` must return the ids as a torch.long tensor."
PB_MASK_DTYPE = "`pad_batch` must return the mask as a torch.bool tensor (True at the real symbols)."
PB_GENERIC = ("`pad_batch` differs from a (B, L) long tensor holding each sequence followed by `pad`, and a "
              "bool mask True at the real symbols, L the longest length.")

BK_TYPE = ("`bucket_batches` must return a list of batches, each a list of int indices into `lengths` "
           "(use .tolist() on tensors).")
BK_DROPS_LAST = ("`bucket_batches` drops the last, smaller batch: every index must appear once; the last batch "
                 "may hold fewer than batch_size.")
BK_DUPLICATES = ("`bucket_batches` puts an index in two batches (or twice in one): each index must appear "
                 "exactly once, and one batch may hold fewer than batch_size.")
BK_MISSING = "`bucket_batches` leaves indices out: every index from 0 to N - 1 must appear exactly once."
BK_RANGE = "`bucket_batches` returns an index outside 0 ... N - 1: the batches hold indices into `lengths`."
BK_SIZES = ("`bucket_batches`'s batches have the wrong sizes: each holds batch_size indices, except at most "
            "one, which holds fewer.")
BK_MIXED = ("`bucket_batches` puts words of very different lengths together: two batches' length ranges "
            "overlap. Sort the shuffled indices by length (stable) before cutting them into batches.")
BK_SORTED = ("`bucket_batches` returns the batches sorted by length, under every seed: shuffle the order of "
             "the batches with the generator after cutting them.")
BK_NOT_REPRODUCIBLE = ("`bucket_batches` gives other batches for two generators seeded alike: draw every "
                       "random number from `generator` (torch.randperm(..., generator=generator)), none from "
                       "the global random state.")
BK_IGNORES_SEED = ("`bucket_batches` gives the same batches whatever the generator's seed: shuffle the indices "
                   "and the batches with `generator`.")
BK_NOT_SHUFFLED_FIRST = ("`bucket_batches` puts the words of one length in the same batches whatever the generator: "
                         "shuffle the indices with `generator` BEFORE the stable sort by length, so that words of "
                         "equal length are grouped differently each time.")

ED_TYPE = "`edit_distance` must return a Python int (the number of edits), not {}."
ED_INIT = ("`edit_distance` starts from the wrong first row or column: D[i][0] = i and D[0][j] = j (turning "
           "a prefix into the empty sequence costs one deletion per symbol).")
ED_SUB_TWO = ("`edit_distance` counts a substitution as 2 (a deletion and an insertion): replacing one symbol "
              "by another is a single edit, cost [a_i != b_j].")
ED_NO_INSERT = "`edit_distance` never inserts: the minimum must include D[i][j-1] + 1."
ED_NO_DELETE = "`edit_distance` never deletes: the minimum must include D[i-1][j] + 1."
ED_SHORT = ("`edit_distance` stops one row or column short: the loops run over i = 1 ... len(a) and "
            "j = 1 ... len(b), and the answer is D[len(a)][len(b)].")
ED_SIMILARITY = ("`edit_distance` counts the matching symbols (a similarity), not the edits: the distance is "
                 "the least number of insertions, deletions and substitutions.")
ED_GENERIC = ("`edit_distance` differs from the Levenshtein distance: D[i][0] = i, D[0][j] = j, and D[i][j] the "
              "minimum of a deletion, an insertion and a substitution (cost 0 for equal symbols).")
ED_NOT_SYMMETRIC = "`edit_distance(a, b)` differs from `edit_distance(b, a)`: the distance is symmetric."
ED_TRANSPOSITION = ("`edit_distance` counts swapping two neighbouring symbols as one edit (the Damerau distance): "
                    "the Levenshtein distance knows insertions, deletions and substitutions only, so a swap "
                    "costs two edits.")

ER_TYPE = "`error_rates` must return a pair of floats (per, wer)."
ER_OWN_DISTANCE = ("`error_rates` is wrong because your `edit_distance` is: it gives other distances than the "
                   "Levenshtein distance on these pronunciations. Fix edit_distance first.")
ER_PER_PER_WORD = ("The phoneme error rate averages each word's rate (its distance divided by its length), so "
                   "that a short word weighs as much as a long one: divide the sum of the distances by the sum of "
                   "the lengths of the closest alternatives.")
ER_PER_FIRST = ("The phoneme error rate scores each word against its FIRST alternative: use the closest one, "
                "the alternative at the smallest edit distance.")
ER_PER_FIRST_LEN = ("The phoneme error rate divides by the length of each word's FIRST alternative: divide by the "
                    "length of the closest one, the alternative whose distance is counted.")
ER_PER_HYP_LEN = ("The phoneme error rate is divided by the lengths of the outputs: divide by the lengths of "
                  "the closest alternatives (the references).")
ER_PER_ALL_LEN = ("The phoneme error rate is divided by the lengths of every alternative: divide by the length "
                  "of each word's closest alternative only.")
ER_PER_SHORTEST = ("The phoneme error rate uses the length of the shortest alternative: the denominator is the "
                   "length of the closest one, the one whose distance is counted.")
ER_PER_TIES = ("When two alternatives are equally close, the phoneme error rate takes the last (or the longest) "
               "one: take the FIRST of them, as min() over the alternatives does.")
ER_WER_FIRST = ("The word error rate counts a word wrong unless it matches its FIRST alternative: a word is "
                "right when it matches any of them (the closest is at distance 0).")
ER_WER_ALL = ("The word error rate counts a word wrong unless it matches EVERY alternative: a word is right "
              "when it matches one of them.")
ER_WER_PHONEMES = ("The word error rate counts phoneme errors: it is the share of the words whose distance to "
                   "the closest alternative is not 0.")
ER_PER_GENERIC = ("The phoneme error rate differs from the sum over the words of the distance to the closest "
                  "alternative, divided by the sum of those alternatives' lengths.")
ER_WER_GENERIC = "The word error rate differs from the share of the words not equal to one of their alternatives."

TS_STUB_MODEL = ("`train_step` is graded with the locked TinyTransformer: the notebook's TinyTransformer does "
                 "not run as the locked cell does; restore that cell.")
TS_FLOAT = "`train_step` must return the loss as a Python float (loss.item()), not {}."
TS_NOT_SHIFTED = ("The decoder reads the targets it must predict: its input is tgt shifted right, SOS first and "
                  "then tgt[:, :-1], so that position t only sees the phonemes before target t.")
TS_DROPS_FIRST = ("The loss leaves out the first target: the decoder input is SOS followed by tgt[:, :-1], and "
                  "the loss covers every position of tgt (tgt holds no SOS).")
TS_PADDING = ("Padding counts in the loss: pass ignore_index=PAD to the cross-entropy, so that padded positions "
              "are neither learned nor averaged over.")
TS_NO_SMOOTHING = "The loss ignores `label_smoothing`: pass label_smoothing=label_smoothing to the cross-entropy."
TS_FIXED_SMOOTHING = ("The loss smooths the labels by a fixed amount: use the `label_smoothing` argument, not a "
                      "constant.")
TS_SUM = "The loss is a sum over the positions: take the mean over the non-padding positions (the default)."
TS_LOSS_GENERIC = ("The loss differs from the cross-entropy of model(src, tgt_in) against tgt, with "
                   "ignore_index=PAD and the given label smoothing, tgt_in being tgt shifted right after SOS.")
TS_NO_CLIP = ("The gradients are not clipped before the step: call torch.nn.utils.clip_grad_norm_(model."
              "parameters(), clip) after backward() and before optimizer.step().")
TS_CLIP_VALUE = ("The gradients are clipped entry by entry (clip_grad_value_ or a clamp), not by their global "
                 "norm: scale them so that their TOTAL norm is at most clip, "
                 "torch.nn.utils.clip_grad_norm_(model.parameters(), clip).")
TS_FIXED_CLIP = "The gradients are clipped to a fixed norm: use the `clip` argument."
TS_NO_UPDATE = ("The parameters do not change: call backward(), then optimizer.step(), and clear the gradients "
                "before backward(), not between backward() and step().")
TS_NOT_CLEARED = ("The second step adds the first step's gradients to its own: clear them (optimizer.zero_grad()) "
                  "before each backward().")
TS_UPDATE_GENERIC = ("After `train_step` the parameters differ from one step of the optimizer on the clipped "
                     "gradients of the loss.")
TS_PADDING_CHANGES = ("Padding changes the loss: more padding columns in src and tgt must give the same loss and "
                      "the same step (ignore_index=PAD; the model masks the source's padding itself).")

BM_LIST = "`beam_search` must return a list of (tokens, score) pairs."
BM_TOKENS = "The tokens of each output must be a Python list of int ids (use .tolist())."
BM_FLOAT = "The score of each output must be a Python float (use .item() or float())."
BM_TOO_MANY = ("`beam_search` returns more than beam_size outputs: return the beam_size best finished ones "
               "(finished[:beam_size] after sorting).")
BM_EMPTY = "`beam_search` returns no output: every output ends finished, at EOS or after max_len tokens."
BM_DUPLICATE = "`beam_search` returns the same output twice: the beam starts from one empty output."
BM_UNSORTED = ("The outputs are not sorted best first: sort ALL the finished outputs by score, highest first, "
               "then keep the first beam_size of them.")
BM_WITH_SOS = "The tokens start with SOS: return the generated tokens only, without SOS."
BM_NO_EOS = "An output shorter than max_len does not end with EOS: keep EOS as the last token of a finished output."
BM_AFTER_EOS = "An output goes on after EOS: an output that produces EOS is finished and leaves the beam."
BM_TOO_LONG = "An output is longer than max_len tokens."
BM_NOT_GREEDY = ("With beam_size=1, beam search must give the greedy output: the single best expansion at each "
                 "step, until EOS or max_len tokens.")
BM_NO_NORM = ("The scores are not length-normalised: a finished output's score is its log-probability divided "
              "by len(tokens) ** alpha.")
BM_LEN_NO_EOS = ("The length that normalises the score leaves EOS out: |y| counts every token of the output, "
                 "its EOS included.")
BM_NORM_PLUS_SOS = "The length that normalises the score counts SOS: |y| counts the output's tokens only."
BM_CARRY_NORM = ("The scores are normalised while pruning: the beam keeps the TOTAL log-probabilities of the "
                 "unfinished outputs and prunes by them; only a finished output's score is divided by its length.")
BM_COMPETE = ("Finished outputs stay in the beam and take the places of unfinished ones: move an output that ends "
              "with EOS out of the beam; the next beam holds the unfinished ones among the beam_size best.")
BM_REFILL = ("The beam is refilled: finished outputs leave the beam and are not replaced; the next beam holds "
             "only the unfinished ones AMONG the beam_size best expansions.")
BM_DROP_MAX = ("The outputs still unfinished after max_len tokens are dropped: at the last step they count as "
               "finished, with their score.")
BM_NO_PRUNE = "The beam is never pruned: keep only the beam_size best expansions at each step."
BM_LAST_ONLY = ("The scores are not accumulated: an output's log-probability adds each new token's "
                "log-probability to its prefix's.")
BM_RAW = "The scores add raw logits: use the log-softmax of the last position's logits."
BM_SCORE = ("A returned score is not the log-probability of its tokens (log-softmax of the decoder's last "
            "position, teacher forced from SOS) divided by len(tokens) ** alpha.")
BM_GENERIC = ("`beam_search` differs from the beam search of part 5: keep the beam_size best expansions by total "
              "log-probability, move those that end with EOS (or reach max_len) to the finished outputs, and "
              "return the beam_size best finished ones by normalised score.")


# --- random inputs ---------------------------------------------------------------------------

def _randint(rng, lo, hi):
    """A random int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=rng))


def _pick(rng, items):
    return items[_randint(rng, 0, len(items) - 1)]


def _sample(rng, items, k):
    """k distinct items of `items`, in random order."""
    return [items[i] for i in torch.randperm(len(items), generator=rng)[:k].tolist()]


def _shuffled(rng, items):
    return _sample(rng, list(items), len(items))


def _remote(x, hint):
    """`x` as a handle to an object of the learner's process, or the hint."""
    expect(isinstance(x, RemoteObject), hint)
    return x


def _torch_attr(learner, *path):
    """torch.<path> in the learner's process, as a handle (e.g. torch.Generator)."""
    obj = _remote(learner.attribute("torch", path[0]), TORCH_GONE)
    for attr in path[1:]:
        obj = _remote(getattr(obj, attr), TORCH_GONE)
    return obj


def _generator(learner, seed):
    """A torch.Generator seeded with `seed`, made in the learner's process."""
    gen = _remote(_torch_attr(learner, "Generator")(), TORCH_GONE)
    method(gen, "manual_seed", "torch.Generator")(int(seed))
    return gen


# --- Part 1: vocabularies and encoding (3 points) -------------------------------------------

def _words(rng, pool, n_words, max_len=6):
    """Random words over `pool`, with an empty word and a repeated one, in a random order in which the symbols
    do not first appear sorted (so that numbering them as they come is not sorting them)."""
    words = [[_pick(rng, pool) for _ in range(_randint(rng, 1, max_len))] for _ in range(n_words)]
    descending = [max(pool), min(pool)]
    words = _shuffled(rng, words + [[], list(words[0]), descending])
    first_seen = list(dict.fromkeys(s for w in words for s in w))
    if first_seen == sorted(first_seen):
        words.remove(descending)
        words.insert(0, descending)
    return words


def _vocab(symbols, *, specials_first=True, with_specials=True, start=0):
    table = list(SPECIALS) if with_specials else []
    table = table + symbols if specials_first else symbols + table
    return {s: i + start for i, s in enumerate(table)}


def _vocab_mistakes(words):
    flat = [s for w in words for s in w]
    distinct = sorted(set(flat) - set(SPECIALS))
    first_seen = [s for s in dict.fromkeys(flat) if s not in SPECIALS]
    gaps = {s: i for i, s in enumerate(list(SPECIALS) + sorted(s for s in flat if s not in SPECIALS))}
    return [
        (BV_SPECIAL_TWICE, _vocab(sorted(set(flat)))),
        (BV_NO_SPECIALS, _vocab(distinct, with_specials=False)),
        (BV_NO_SPECIALS, _vocab(distinct, with_specials=False, start=4)),
        (BV_SPECIALS_LAST, _vocab(distinct, specials_first=False)),
        (BV_FIRST_SEEN, _vocab(first_seen)),
        (BV_DESCENDING, _vocab(distinct[::-1])),
        (BV_GAPS, gaps),
    ]


def _learner_vocab(learner, words):
    got = learner.build_vocab(words)
    expect(isinstance(got, dict) and all(type(k) is str and type(v) is int for k, v in got.items()), BV_TYPE)
    return got


def _check_vocab(learner, reference, words):
    got = _learner_vocab(learner, words)
    expected = reference.build_vocab(words)
    if got != expected:
        raise Hint(diagnose(got, _vocab_mistakes(words), BV_GENERIC, same=lambda a, b: a == b))
    return got


@points(1.5, part="build_vocab")
def test_build_vocab_matches_reference(learner, reference, rng):
    """Does build_vocab give the specials ids 0 to 3, then the distinct symbols in sorted order, for letters and
    phonemes given in any order?"""
    for pool, n_words in ((LETTERS, 8), (PHONEMES, 6), (LETTERS[:5] + PHONEMES[:5], 5)):
        symbols = _sample(rng, pool, _randint(rng, 5, 9))
        words = _words(rng, symbols, n_words)
        vocab = _check_vocab(learner, reference, words)
        # The same words in another order: the same ids.
        expect(_learner_vocab(learner, _shuffled(rng, [w[::-1] for w in words])) == vocab, BV_FIRST_SEEN)


@points(0.5, part="build_vocab")
def test_build_vocab_special_strings_in_data(learner, reference, rng):
    """When the data holds a special's string (such as '<unk>'), does that symbol keep its special id?"""
    for specials in (("<unk>",), ("</s>", "<pad>")):
        words = _words(rng, _sample(rng, PHONEMES, 6), 5)
        words[_randint(rng, 0, len(words) - 1)] += list(specials)
        _check_vocab(learner, reference, words)


def _encode_mistakes(symbols, vocab, add_eos):
    ids = [vocab.get(s, UNK) for s in symbols]
    known = [vocab[s] for s in symbols if s in vocab]
    return [
        (EN_DROPS, known + ([EOS] if add_eos else [])),
        (EN_NO_EOS, ids if add_eos else None),
        (EN_ALWAYS_EOS, None if add_eos else ids + [EOS]),
        (EN_SOS, [SOS] + ids + ([EOS] if add_eos else [])),
    ]


def _encoded(learner, symbols, vocab, **kwargs):
    """The learner's encode(symbols, vocab, ...) as a list of ints, or a hint."""
    try:
        got = learner.encode(symbols, vocab, **kwargs)
    except LearnerError as exc:
        expect(exc.etype != "KeyError", EN_KEY_ERROR)
        raise
    expect(isinstance(got, list) and all(type(i) is int for i in got), EN_TYPE)
    return got


@points(1, part="build_vocab")
def test_encode_maps_unknown_symbols_to_unk(learner, reference, rng):
    """Does encode give each symbol's id, UNK's for a symbol the vocabulary lacks, and EOS's only with add_eos?"""
    for pool in (LETTERS, PHONEMES):
        known = _sample(rng, pool, 8)
        vocab = reference.build_vocab([known])
        unknown = [s for s in pool if s not in known]
        for add_eos in (None, False, True):
            symbols = [_pick(rng, known) for _ in range(_randint(rng, 3, 7))]
            for _ in range(_randint(rng, 1, 2)):
                symbols.insert(_randint(rng, 0, len(symbols)), _pick(rng, unknown))
            kwargs = {} if add_eos is None else {"add_eos": add_eos}
            got = _encoded(learner, symbols, vocab, **kwargs)
            expected = reference.encode(symbols, vocab, **kwargs)
            if got != expected:
                raise Hint(diagnose(got, _encode_mistakes(symbols, vocab, bool(add_eos)), EN_GENERIC,
                                    same=lambda a, b: a == b))
    expect(_encoded(learner, [], vocab, add_eos=True) == [EOS] and _encoded(learner, [], vocab) == [], EN_GENERIC)


# --- Part 2: padded batches of similar lengths (4 points) -------------------------------------

def _pad_mistakes(seqs, pad):
    B, L = len(seqs), max((len(s) for s in seqs), default=0)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    right = torch.arange(L)[None, :] < lengths[:, None]

    def ids(pad_value, left=False):
        out = torch.full((B, L), pad_value, dtype=torch.long)
        for i, s in enumerate(seqs):
            if s and left:
                out[i, L - len(s):] = torch.tensor(s)
            elif s:
                out[i, :len(s)] = torch.tensor(s)
        return out

    return [
        (PB_MASK_INVERTED, (ids(pad), ~right)),
        (PB_PAD_IGNORED, (ids(PAD), right)),
        (PB_LEFT, (ids(pad, left=True), right.flip(1))),
        (PB_MASK_FROM_IDS, (ids(pad), ids(pad) != pad)),
    ]


def _same_pair(a, b):
    return close(a[0], b[0]) and close(a[1], b[1])


@points(1, part="pad_batch")
def test_pad_batch_matches_reference(learner, reference, rng):
    """Does pad_batch give (B, L) long ids padded with `pad` and a bool mask True at the real symbols?"""
    for B, pad in ((4, None), (1, None), (5, 9), (3, 2)):
        seqs = [[_randint(rng, 4, 12) for _ in range(_randint(rng, 1, 7))] for _ in range(B)]
        if B > 2:
            seqs[_randint(rng, 0, B - 1)] = []  # an empty sequence: a row of padding only
        if pad is not None:
            seqs[0].append(pad)  # a real symbol whose id is the padding value
        kwargs = {} if pad is None else {"pad": pad}
        exp_ids, exp_mask = reference.pad_batch(seqs, **kwargs)
        got = learner.pad_batch(seqs, **kwargs)
        expect(isinstance(got, (tuple, list)) and len(got) == 2, PB_TYPE)
        ids, mask = got
        tensor(ids, "pad_batch", shape=exp_ids.shape, what="the ids")
        tensor(mask, "pad_batch", shape=exp_mask.shape, what="the mask")
        expect(ids.dtype == torch.long, PB_IDS_DTYPE)
        expect(mask.dtype == torch.bool, PB_MASK_DTYPE)
        if not (torch.equal(ids, exp_ids) and torch.equal(mask, exp_mask)):
            raise Hint(diagnose((ids, mask), _pad_mistakes(seqs, PAD if pad is None else pad), PB_GENERIC,
                                same=_same_pair))


def _lengths(rng, n, hi):
    return [_randint(rng, 1, hi) for _ in range(n)]


def _batches(got, N, batch_size):
    """The learner's batches as lists of ints, after checking that they are a partition of range(N) into batches
    of batch_size but at most one smaller; otherwise the hint naming the mistake."""
    expect(isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) and all(type(i) is int for i in b)
                                                  for b in got), BK_TYPE)
    batches = [list(b) for b in got]
    flat = [i for b in batches for i in b]
    expect(all(0 <= i < N for i in flat), BK_RANGE)
    if sorted(flat) != list(range(N)):
        expect(len(set(flat)) == len(flat), BK_DUPLICATES)
        missing = N - len(flat)
        expect(not (missing == N % batch_size and all(len(b) == batch_size for b in batches)), BK_DROPS_LAST)
        raise Hint(BK_MISSING)
    sizes = sorted(len(b) for b in batches)
    expect(all(s == batch_size for s in sizes[1:]) and 0 < sizes[0] <= batch_size, BK_SIZES)
    return batches


def _bucket(learner, lengths, batch_size, seed):
    return _batches(learner.bucket_batches(lengths, batch_size, _generator(learner, seed)), len(lengths), batch_size)


def _no_overlap(batches, lengths):
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    return all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))


@points(1, part="pad_batch")
def test_bucket_batches_is_a_partition(learner, reference, rng):
    """Does bucket_batches put every index in exactly one batch, each of batch_size but at most one smaller?"""
    for n, batch_size in ((_randint(rng, 20, 30), 4), (_randint(rng, 11, 17), 6), (12, 3), (7, 1), (5, 8)):
        if n % batch_size == 0 and batch_size in (4, 6):
            n += 1  # a last batch smaller than the others
        _bucket(learner, _lengths(rng, n, 9), batch_size, _randint(rng, 0, 10**6))


@points(0.5, part="pad_batch")
def test_bucket_batches_groups_similar_lengths(learner, reference, rng):
    """Are the batches runs of the length-sorted order, so that no two batches' length ranges overlap?"""
    # Full batches only (here and below): the checks of the partition's mistakes are the partition's own.
    for n, batch_size, hi in ((4 * _randint(rng, 6, 9), 4, 12), (5 * _randint(rng, 3, 4), 5, 4), (16, 2, 20)):
        lengths = _lengths(rng, n, hi)
        batches = _bucket(learner, lengths, batch_size, _randint(rng, 0, 10**6))
        expect(_no_overlap(batches, lengths), BK_MIXED)


@points(0.5, part="pad_batch")
def test_bucket_batches_shuffles_the_batches(learner, reference, rng):
    """Is the order of the batches shuffled, not sorted by length?"""
    n, batch_size = 4 * _randint(rng, 10, 12), 4
    lengths = _lengths(rng, n, 15)
    orders = []
    for _ in range(3):
        batches = _bucket(learner, lengths, batch_size, _randint(rng, 0, 10**6))
        expect(_no_overlap(batches, lengths), BK_MIXED)
        keys = [min(lengths[i] for i in b) for b in batches]
        orders.append(keys == sorted(keys) or keys == sorted(keys, reverse=True))
    expect(not all(orders), BK_SORTED)


@points(0.5, part="pad_batch")
def test_bucket_batches_follows_the_generator(learner, reference, rng):
    """Do generators seeded alike give the same batches, and other seeds other batches?"""
    n, batch_size = 3 * _randint(rng, 10, 13), 3
    lengths = _lengths(rng, n, 6)
    seed = _randint(rng, 0, 10**6)
    first = _bucket(learner, lengths, batch_size, seed)
    expect(_bucket(learner, lengths, batch_size, seed) == first, BK_NOT_REPRODUCIBLE)
    others = [_bucket(learner, lengths, batch_size, seed + k) for k in (1, 2)]
    expect(any(o != first for o in others), BK_IGNORES_SEED)


@points(0.5, part="pad_batch")
def test_bucket_batches_shuffles_before_sorting(learner, reference, rng):
    """Are the indices shuffled before the sort, so that other generators put words of one length in other batches?"""
    # Two lengths, twelve words each, at random places: without the shuffle, the sort keeps the words of one length
    # in index order and cuts them into the same batches whatever the generator (only the batches' order changes).
    # With it, three seeds giving one grouping has a chance of about 1e-15; the draw order itself is not fixed.
    short_len, long_len = _sample(rng, list(range(1, 10)), 2)
    lengths = _shuffled(rng, [short_len] * 12 + [long_len] * 12)
    seed = _randint(rng, 0, 10**6)
    groupings = []
    for k in range(3):
        batches = _bucket(learner, lengths, 4, seed + k)
        expect(_no_overlap(batches, lengths), BK_MIXED)
        groupings.append({frozenset(b) for b in batches})
    expect(groupings[1] != groupings[0] or groupings[2] != groupings[0], BK_NOT_SHUFFLED_FIRST)


# --- Part 3: the edit distance and the error rates (4 points) ---------------------------------

def _dp(a, b, *, row0=lambda j: j, col0=lambda i: i, sub=1, ins=True, dele=True, short=(0, 0)):
    """The edit distance's table with the given changes (the typical mistakes); D[len(a)-s0][len(b)-s1]."""
    D = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for j in range(len(b) + 1):
        D[0][j] = row0(j)
    for i in range(1, len(a) + 1):
        D[i][0] = col0(i)
        for j in range(1, len(b) + 1):
            options = [D[i - 1][j - 1] + (sub if a[i - 1] != b[j - 1] else 0)]
            if dele:
                options.append(D[i - 1][j] + 1)
            if ins:
                options.append(D[i][j - 1] + 1)
            D[i][j] = min(options)
    return D[max(len(a) - short[0], 0)][max(len(b) - short[1], 0)]


def _lcs(a, b):
    D = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            D[i][j] = D[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(D[i - 1][j], D[i][j - 1])
    return D[len(a)][len(b)]


def _distance_mistakes(pairs):
    def each(**kw):
        return lambda: [_dp(a, b, **kw) for a, b in pairs]

    inits = [each(row0=r, col0=c) for r in (lambda j: j, lambda j: 0, lambda j: j + 1)
             for c in (lambda i: i, lambda i: 0, lambda i: i + 1)][1:]
    return ([(ED_INIT, f) for f in inits]
            + [(ED_SUB_TWO, each(sub=2)), (ED_NO_INSERT, each(ins=False)), (ED_NO_DELETE, each(dele=False))]
            + [(ED_SHORT, each(short=s)) for s in ((1, 0), (0, 1), (1, 1))]
            + [(ED_SIMILARITY, lambda: [_lcs(a, b) for a, b in pairs])]
            + [(ED_TRANSPOSITION, lambda d=d: [d.distance(a, b) for a, b in pairs])
               for d in (OSA, DamerauLevenshtein)])


def _seq(rng, alphabet, lo, hi):
    return [_pick(rng, alphabet) for _ in range(_randint(rng, lo, hi))]


# Pairs of neighbours swapped (the random pairs seldom hold one): Levenshtein counts a swap as two edits, a distance
# with transpositions (restricted, OSA, or not) as one, under every seed; in the last pair the two differ.
SWAPS = [("ab", "ba"), (["K", "AE", "T"], ["AE", "K", "T"]), (["S", "T", "AA", "P"], ["S", "AA", "T", "P"]),
         ("abcd", "badc"), ("ca", "abc")]


def _distance_pairs(rng):
    """Pairs of phoneme lists and of strings, similar enough that matches, insertions and deletions all happen,
    then the swaps."""
    pairs = []
    for _ in range(10):
        alphabet = _sample(rng, PHONEMES, _randint(rng, 3, 5))
        a = _seq(rng, alphabet, 0, 8)
        b = list(a)
        for _ in range(_randint(rng, 1, 4)):  # a few random edits of a
            k = _randint(rng, 0, 2)
            if k == 0 or not b:
                b.insert(_randint(rng, 0, len(b)), _pick(rng, alphabet))
            elif k == 1:
                del b[_randint(rng, 0, len(b) - 1)]
            else:
                b[_randint(rng, 0, len(b) - 1)] = _pick(rng, alphabet)
        pairs.append((a, b))
    for _ in range(4):
        pairs.append(("".join(_seq(rng, "abcd", 0, 9)), "".join(_seq(rng, "abcd", 0, 9))))
    pairs += [([], _seq(rng, PHONEMES, 1, 4)), (_seq(rng, PHONEMES, 1, 4), []), ("kitten", "sitting")]
    return pairs + SWAPS


def _as_int(d):
    """A number the learner returned as an int, or None (for the value checks, which do not grade the type)."""
    if type(d) is int:
        return d
    if isinstance(d, np.integer):
        return int(d)
    if isinstance(d, torch.Tensor) and not odd_tensor(d) and d.dim() == 0 and not d.is_floating_point():
        return int(d.item())
    if isinstance(d, (float, np.floating)) and float(d).is_integer():
        return int(d)
    return None


@points(1.5, part="edit_distance")
def test_edit_distance_matches_levenshtein(learner, reference, rng):
    """Does edit_distance agree with the Levenshtein distance on phoneme lists and strings, empty ones included?"""
    pairs = _distance_pairs(rng)
    got = []
    for a, b in pairs:
        d = learner.edit_distance(a, b)
        expect(_as_int(d) is not None, ED_TYPE.format(describe(d)))
        got.append(_as_int(d))
    truth = [Levenshtein.distance(a, b) for a, b in pairs]
    if got != truth:
        raise Hint(diagnose(got, _distance_mistakes(pairs), ED_GENERIC, same=lambda x, y: x == y))


@points(0.5, part="edit_distance")
def test_edit_distance_edge_cases_and_type(learner, reference, rng):
    """Is the distance an int, 0 between equal sequences, the length against an empty one, and symmetric?"""
    word = _seq(rng, PHONEMES, 2, 6)
    other = list(word)
    other[_randint(rng, 0, len(other) - 1)] = "XX"
    pairs = [([], []), (word, word), ([], word), (word, []), (word, other), ("".join(word), ""), (word[1:], word),
             (other, word), (word, other[::-1]), (other[::-1], word)]
    distances = []
    for a, b in pairs:
        d = learner.edit_distance(a, b)
        expect(type(d) is int, ED_TYPE.format(describe(d)))
        distances.append(d)
    expect(distances[-1] == distances[-2], ED_NOT_SYMMETRIC)
    expect(distances[:-2] == [Levenshtein.distance(a, b) for a, b in pairs[:-2]], ED_GENERIC)


def _closest(hyp, alternatives, pick="first"):
    distances = [Levenshtein.distance(hyp, r) for r in alternatives]
    best = min(distances)
    tied = [k for k, d in enumerate(distances) if d == best]
    k = {"first": tied[0], "last": tied[-1], "longest": max(tied, key=lambda k: len(alternatives[k])),
         "shortest": min(tied, key=lambda k: len(alternatives[k]))}[pick]
    return distances[k], alternatives[k]


def _per(hyps, refs, *, which="closest", denominator="ref", pick="first"):
    errors = total = 0
    rates = []
    for hyp, alternatives in zip(hyps, refs):
        if which == "first":
            d, ref = Levenshtein.distance(hyp, alternatives[0]), alternatives[0]
        else:
            d, ref = _closest(hyp, alternatives, pick)
        n = {"ref": len(ref), "hyp": len(hyp), "all": sum(len(r) for r in alternatives),
             "shortest": min(len(r) for r in alternatives), "first": len(alternatives[0])}[denominator]
        errors, total = errors + d, total + n
        rates.append(d / max(len(ref), 1))
    return sum(rates) / len(rates) if which == "per_word" else errors / max(total, 1)


def _wer(hyps, refs, *, rule="closest"):
    wrong = 0
    for hyp, alternatives in zip(hyps, refs):
        distances = [Levenshtein.distance(hyp, r) for r in alternatives]
        wrong += {"closest": min(distances) > 0, "first": distances[0] > 0,
                  "all": any(d > 0 for d in distances), "phonemes": min(distances)}[rule]
    return wrong / len(hyps)


def _per_mistakes(hyps, refs):
    return [(ER_PER_PER_WORD, _per(hyps, refs, which="per_word")), (ER_PER_FIRST, _per(hyps, refs, which="first")),
            (ER_PER_FIRST_LEN, _per(hyps, refs, denominator="first")),
            (ER_PER_HYP_LEN, _per(hyps, refs, denominator="hyp")),
            (ER_PER_ALL_LEN, _per(hyps, refs, denominator="all")),
            (ER_PER_SHORTEST, _per(hyps, refs, denominator="shortest")),
            (ER_PER_TIES, _per(hyps, refs, pick="last")), (ER_PER_TIES, _per(hyps, refs, pick="longest"))]


def _wer_mistakes(hyps, refs):
    return [(ER_WER_FIRST, _wer(hyps, refs, rule="first")), (ER_WER_ALL, _wer(hyps, refs, rule="all")),
            (ER_WER_PHONEMES, _wer(hyps, refs, rule="phonemes"))]


def _mutate(rng, seq, alphabet, n):
    out = list(seq)
    for _ in range(n):
        k = _randint(rng, 0, 2)
        if k == 0 or len(out) < 2:
            out.insert(_randint(rng, 0, len(out)), _pick(rng, alphabet))
        elif k == 1:
            del out[_randint(rng, 0, len(out) - 1)]
        else:
            out[_randint(rng, 0, len(out) - 1)] = _pick(rng, alphabet)
    return out


def _apart(table):
    """Whether the values of a table of (hint, value) differ by more than 1e-6 wherever their hints differ."""
    return all(abs(v - w) > 1e-6 for k, (h, v) in enumerate(table) for g, w in table[k + 1:] if g != h)


def _rate_data(rng, *, ties=False):
    """Outputs and references (2 or 3 alternatives per word) on which every typical mistake of error_rates
    changes the result, tried here first. With `ties`, every word has two alternatives equally close to its
    output, of different lengths, the first shorter in some words and longer in others; without, the closest
    alternatives of a word all have one length, so that how ties are broken changes nothing (under every seed)."""
    for _ in range(500):
        alphabet = _sample(rng, PHONEMES, 6)
        hyps, refs = [], []
        for w in range(_randint(rng, 5, 8)):
            base = _seq(rng, alphabet, 2, 8)
            if ties:
                longer = base + [_pick(rng, alphabet)]
                alts = [base, longer] if w % 2 else [longer, base]
                hyp = base[:-1] + longer[-1:]  # one edit from each
                if Levenshtein.distance(hyp, base) != Levenshtein.distance(hyp, longer):
                    break
            else:
                alts = [_mutate(rng, base, alphabet, _randint(rng, 1, 3)) for _ in range(_randint(rng, 1, 2))]
                alts.insert(_randint(rng, 0, len(alts)), base)
                hyp = base if _randint(rng, 0, 2) == 0 else _mutate(rng, base, alphabet, _randint(rng, 1, 2))
            hyps.append(hyp)
            refs.append(alts)
        else:
            if any(DamerauLevenshtein.distance(h, r) != Levenshtein.distance(h, r)
                   for h, alternatives in zip(hyps, refs) for r in alternatives):
                continue  # a swap of neighbours: an edit distance with transpositions is graded by its own check
            if not ties and any(len(_closest(h, alts, "shortest")[1]) != len(_closest(h, alts, "longest")[1])
                                for h, alts in zip(hyps, refs)):
                continue  # closest alternatives of different lengths: how ties are broken is graded by its own check
            per, wer = _per(hyps, refs), _wer(hyps, refs)
            wrong = _per_mistakes(hyps, refs)[-2:] if ties else _per_mistakes(hyps, refs)[:-2]
            wrong_wer = [] if ties else _wer_mistakes(hyps, refs)
            # Each mistake changes the rate, and two mistakes of different hints give different rates (the first
            # that matches names the mistake).
            if _apart([(None, per)] + wrong) and _apart([(None, wer)] + wrong_wer):
                return hyps, refs
    raise RuntimeError("no error-rate data found on which every typical mistake shows")


def _rates(got):
    expect(isinstance(got, (tuple, list)) and len(got) == 2, ER_TYPE)
    out = []
    for x in got:
        if isinstance(x, torch.Tensor) and not odd_tensor(x) and x.dim() == 0:
            x = x.item()
        expect(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool), ER_TYPE)
        out.append(float(x))
    return out


def _check_rates(learner, hyps, refs):
    per, wer = _rates(learner.error_rates(hyps, refs))
    exp_per, exp_wer = _per(hyps, refs), _wer(hyps, refs)
    if abs(per - exp_per) <= 1e-9 and abs(wer - exp_wer) <= 1e-9:
        return
    pairs = [(h, r) for h, alternatives in zip(hyps, refs) for r in alternatives]
    own = [_as_int(learner.edit_distance(h, r)) for h, r in pairs]
    expect(own == [Levenshtein.distance(h, r) for h, r in pairs], ER_OWN_DISTANCE)
    same = lambda a, b: abs(a - b) <= 1e-9  # noqa: E731
    if abs(per - exp_per) > 1e-9:
        raise Hint(diagnose(per, _per_mistakes(hyps, refs), ER_PER_GENERIC, same=same))
    raise Hint(diagnose(wer, _wer_mistakes(hyps, refs), ER_WER_GENERIC, same=same))


@points(1.5, part="edit_distance")
def test_error_rates_match_reference(learner, reference, rng):
    """Are PER and WER computed against each word's closest alternative, PER per phoneme of the whole set?"""
    for _ in range(2):
        hyps, refs = _rate_data(rng)
        _check_rates(learner, hyps, refs)


@points(0.5, part="edit_distance")
def test_error_rates_ties_take_the_first_alternative(learner, reference, rng):
    """When two alternatives are equally close, does PER count the first one's length?"""
    hyps, refs = _rate_data(rng, ties=True)
    _check_rates(learner, hyps, refs)


# --- models (parts 4 and 5) -------------------------------------------------------------------

D_MODEL, MAX_POS = 16, 16


def _tiny_args(V_src, V_tgt):
    return (V_src, V_tgt), {"d_model": D_MODEL, "n_heads": 2, "d_ff": 2 * D_MODEL, "max_len": MAX_POS}


def _tiny(reference, rng, V_src, V_tgt, *, out_scale=1.0, eos_bias=0.0, reuse=None):
    """The reference's TinyTransformer with weights drawn from `rng` (float32 numbers), in float64. `reuse`, such a
    model of the same sizes that nothing holds any more, gets the new weights in place: building a model costs more
    than drawing its weights, and the searches for a model worth checking draw dozens."""
    args, kwargs = _tiny_args(V_src, V_tgt)
    m = reuse if reuse is not None else reference.TinyTransformer(*args, **kwargs).double().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            noise = torch.randn(p.shape, generator=rng, dtype=F64)
            if "norm" in name:
                value = ((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise).float()
            else:
                value = (noise / math.sqrt(p.shape[-1] if p.dim() > 1 else D_MODEL)).float()
            if name == "out.weight":
                value.mul_(out_scale)  # in float32, then kept exactly in float64
            elif name == "out.bias":
                value[EOS] += eos_bias
            p.copy_(value)
    return m


def _learner_tiny(learner, ref, V_src, V_tgt, device="cpu"):
    """The learner's TinyTransformer holding `ref`'s weights, in float64 on `device`."""
    args, kwargs = _tiny_args(V_src, V_tgt)
    h = learner_module(learner, "TinyTransformer", ref, *args, **kwargs)
    h.to(device=torch.device(device), dtype=F64)
    return h


# --- Part 4: one training step (4 points) ------------------------------------------------------

# The learner's train_step and the reference's both step the grader's SGD and Adam (autograder.isolation.optimizers): torch's
# update rules, as torch.optim.Optimizer subclasses, without the import of PyTorch's compiler that torch.optim's
# own pay when built (1.3 s, during which a worker that imports it does nothing else).
OPTIMIZERS = {"SGD": optimizers.SGD, "Adam": optimizers.Adam}


def _padded(rng, B, lo, hi, V, *, eos):
    """(B, L) ids in [4, V) of random lengths from lo to hi (one row of each), then EOS (if `eos`), then PAD."""
    lengths = [_randint(rng, lo, hi) for _ in range(B)]
    longest, shortest = _sample(rng, list(range(B)), 2)
    lengths[longest], lengths[shortest] = hi, lo
    L = hi + eos
    out = torch.full((B, L), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, V, (n,), generator=rng)
        if eos:
            out[i, n] = EOS
    return out


def _loss_here(model, src, tgt, ls, *, shift="right", ignore_pad=True, smoothing="arg", reduction="mean"):
    if shift == "drop_first":
        tgt_in, target = tgt[:, :-1], tgt[:, 1:]
    else:
        sos = torch.full_like(tgt[:, :1], SOS)
        tgt_in, target = (tgt if shift == "none" else torch.cat([sos, tgt[:, :-1]], 1)), tgt
    logits = model(src, tgt_in)
    smooth = {"arg": ls, "none": 0.0, "fixed": 0.1}[smoothing]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction=reduction,
                           ignore_index=PAD if ignore_pad else -100, label_smoothing=smooth)


def _train_here(ref, make_opt, batches, ls, clip, *, clip_mode="norm", clear=True, zero_late=False, **loss_kw):
    """(losses, state_dict) of `ref` (copied) trained with one step per batch, with the given mistakes."""
    model = copy.deepcopy(ref).train()
    opt = make_opt(model.parameters())
    losses = []
    for src, tgt in batches:
        loss = _loss_here(model, src, tgt, ls, **loss_kw)
        if clear and not zero_late:
            opt.zero_grad()
        loss.backward()
        if zero_late:
            opt.zero_grad()
        if clip_mode == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        elif clip_mode == "fixed":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        elif clip_mode == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


LOSS_MISTAKES = ((TS_NOT_SHIFTED, {"shift": "none"}), (TS_DROPS_FIRST, {"shift": "drop_first"}),
                 (TS_PADDING, {"ignore_pad": False}), (TS_NO_SMOOTHING, {"smoothing": "none"}),
                 (TS_FIXED_SMOOTHING, {"smoothing": "fixed"}), (TS_SUM, {"reduction": "sum"}))
STEP_MISTAKES = ((TS_NO_CLIP, {"clip_mode": "none"}), (TS_CLIP_VALUE, {"clip_mode": "value"}),
                 (TS_FIXED_CLIP, {"clip_mode": "fixed"}), (TS_NOT_CLEARED, {"clear": False}),
                 (TS_NO_UPDATE, {"zero_late": True}))


class _TrainCase:
    """A model and batches drawn here; the learner's train_step run on a copy of the model in the learner's
    process, and the reference's (or a typical mistake's) run here, each with a fresh optimizer."""

    def __init__(self, learner, reference, rng, n_batches=1, *, out_scale=2.0, device="cpu"):
        self.learner, self.reference = learner, reference
        self.V_src, self.V_tgt = _randint(rng, 7, 10), _randint(rng, 7, 10)
        self.ref = _tiny(reference, rng, self.V_src, self.V_tgt, out_scale=out_scale)
        B = _randint(rng, 3, 4)
        self.batches = [(_padded(rng, B, 2, _randint(rng, 4, 6), self.V_src, eos=False),
                         _padded(rng, B, 1, _randint(rng, 3, 5), self.V_tgt, eos=True)) for _ in range(n_batches)]
        self.device = device

    def grad_sizes(self, ls):
        """The total norm and the largest absolute entry of the gradients of the first batch's loss."""
        model = copy.deepcopy(self.ref).train()
        src, tgt = self.batches[0]
        _loss_here(model, src, tgt, ls).backward()
        grads = [p.grad for p in model.parameters()]
        return (float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))),
                max(float(g.abs().max()) for g in grads))

    def learner_optimizer(self, h, opt):
        name, kwargs = opt
        params = method(h, "parameters", "TinyTransformer")()
        return _remote(_remote(self.learner.grader_attribute("optimizers", name), TS_NO_OPTIMIZER)(params, **kwargs),
                       TS_NO_OPTIMIZER)

    def run(self, opt, ls, clip, batches=None, pass_ls=True):
        """The learner's losses and state_dict after train_step on each batch."""
        h = _learner_tiny(self.learner, self.ref, self.V_src, self.V_tgt, self.device)
        optimizer = self.learner_optimizer(h, opt)
        losses = []
        for src, tgt in batches or self.batches:
            kwargs = {"clip": clip, **({"label_smoothing": ls} if pass_ls else {})}
            losses.append(self.learner.train_step(h, optimizer, src.to(self.device), tgt.to(self.device), **kwargs))
        sd = h.state_dict()
        expect(isinstance(sd, dict) and set(sd) == set(self.ref.state_dict()), TS_STUB_MODEL)
        for k, v in self.ref.state_dict().items():
            tensor(sd[k], "TinyTransformer.state_dict", shape=v.shape, what=f"the parameter {k}")
        return losses, {k: v.cpu() for k, v in sd.items()}

    def here(self, opt, ls, clip, batches=None, **flags):
        """(losses, state_dict) of a typical mistake's train_step, run here."""
        make = lambda params: OPTIMIZERS[opt[0]](params, **opt[1])  # noqa: E731
        return _train_here(self.ref, make, batches or self.batches, ls, clip, **flags)

    def expected(self, opt, ls, clip, batches=None):
        """(losses, state_dict) of the reference's train_step, run here."""
        model = copy.deepcopy(self.ref).train()
        optimizer = OPTIMIZERS[opt[0]](model.parameters(), **opt[1])
        losses = [self.reference.train_step(model, optimizer, src, tgt, label_smoothing=ls, clip=clip)
                  for src, tgt in batches or self.batches]
        return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}

    def judge(self, got, opt, ls, clip, mistakes, batches=None, loss_only=False, atol=None):
        """The learner's (losses, state_dict) must be the reference's (the parameters to `atol`, by default the
        float64 tolerance); name the mistake otherwise."""
        losses, sd = got
        values = [_loss_value(x) for x in losses]
        for x, v in zip(losses, values):
            expect(v is not None, TS_FLOAT.format(describe(x)))
        expected = self.expected(opt, ls, clip, batches)
        table = [(hint, lambda f=f: self.here(opt, ls, clip, batches, **f)) for hint, f in mistakes]
        if not _same_losses(values, expected[0], 1e-7):
            raise Hint(diagnose(values, [(h, lambda t=t: t()[0]) for h, t in table], TS_LOSS_GENERIC,
                                same=lambda a, b: _same_losses(a, b, 1e-6)))
        same_state = lambda a, b: _same_state(a, b, atol)  # noqa: E731
        if not (loss_only or same_state(sd, expected[1])):
            raise Hint(diagnose(sd, [(h, lambda t=t: t()[1]) for h, t in table], TS_UPDATE_GENERIC,
                                same=same_state))


def _loss_value(x):
    """A loss the learner returned, as a float (leniently: the type is graded by its own check), or None."""
    if type(x) is float:
        return x
    if isinstance(x, torch.Tensor) and not odd_tensor(x) and x.numel() == 1 and x.is_floating_point():
        return float(x.reshape(()).item())
    if isinstance(x, (np.floating, int)) and not isinstance(x, bool):
        return float(x)
    return None


def _same_losses(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


def _same_state(a, b, atol=None):
    return all(close(a[k], b[k], atol=atol) for k in b)


SGD, ADAM = ("SGD", {"lr": 0.5}), ("Adam", {"lr": 0.01})
NO_CLIP = 1e6  # a clip no gradient norm reaches


@points(1, part="train_step")
def test_train_step_returns_the_loss(learner, reference, rng):
    """Is the returned loss a float, the label-smoothed cross-entropy of the shifted targets without padding?"""
    case = _TrainCase(learner, reference, rng)
    for ls in (0.25, 0.0, None):
        losses, _ = case.run(SGD, 0.1 if ls is None else ls, NO_CLIP, pass_ls=ls is not None)
        expect(type(losses[0]) is float, TS_FLOAT.format(describe(losses[0])))
        case.judge((losses, None), SGD, 0.1 if ls is None else ls, NO_CLIP, LOSS_MISTAKES, loss_only=True)


@points(1, part="train_step")
def test_train_step_sgd_step_with_clipping(learner, reference, rng):
    """After one SGD step, with gradients larger than `clip`, are the parameters the reference's?"""
    # A clip far below the 1.0 of a clip that ignores its argument, and below both the total norm and the largest
    # entries of the gradients, so that clipping by norm, by value (entry by entry), and not at all all differ.
    for _ in range(100):
        case = _TrainCase(learner, reference, rng, out_scale=4.0)
        clip = round(0.3 + 0.3 * float(torch.rand((), generator=rng)), 3)
        norm, largest = case.grad_sizes(0.1)
        if norm > 3 * clip and largest > 2 * clip:
            break
    # clip_grad_norm_ scales by clip / (norm + 1e-6): a norm clipped by hand, clip / norm, moves the parameters by a
    # few 1e-9 more, past the float64 tolerance; the mistakes move them by 1e-3 or more.
    case.judge(case.run(SGD, 0.1, clip), SGD, 0.1, clip, LOSS_MISTAKES + STEP_MISTAKES, atol=1e-6)


@points(1, part="train_step")
def test_train_step_two_adam_steps(learner, reference, rng):
    """After two Adam steps on two batches, are both losses and the parameters the reference's?"""
    case = _TrainCase(learner, reference, rng, n_batches=2)
    case.judge(case.run(ADAM, 0.1, NO_CLIP), ADAM, 0.1, NO_CLIP, LOSS_MISTAKES + STEP_MISTAKES)


@points(0.5, part="train_step")
def test_train_step_padding_changes_nothing(learner, reference, rng):
    """Do extra padding columns in src and tgt leave the loss and the step unchanged?"""
    case = _TrainCase(learner, reference, rng)
    src, tgt = case.batches[0]
    wider = [(F.pad(src, (0, _randint(rng, 1, 3)), value=PAD), F.pad(tgt, (0, _randint(rng, 2, 3)), value=PAD))]
    got = case.run(SGD, 0.1, NO_CLIP, batches=wider)
    expected = case.expected(SGD, 0.1, NO_CLIP)
    values = [_loss_value(x) for x in got[0]]
    if not (values[0] is not None and _same_losses(values, expected[0], 1e-7) and _same_state(got[1], expected[1])):
        case.judge(got, SGD, 0.1, NO_CLIP, LOSS_MISTAKES, batches=wider)
        raise Hint(TS_PADDING_CHANGES)


@points(0.5, part="train_step")
def test_train_step_runs_on_any_device(learner, reference, rng, devices):
    """Does train_step run on every device (a GPU too), creating its tensors on the inputs' device?"""
    for device in devices:
        case = _TrainCase(learner, reference, rng, device=device)
        case.judge(case.run(SGD, 0.1, NO_CLIP), SGD, 0.1, NO_CLIP, LOSS_MISTAKES + STEP_MISTAKES)
    h = _learner_tiny(learner, case.ref, case.V_src, case.V_tgt, "meta")
    expect_device_agnostic(learner, "train_step", h, case.learner_optimizer(h, SGD), *case.batches[0])


# --- Part 5: beam search with length normalisation (5 points) --------------------------------

class _Search:
    """The next-token log-probabilities of a model for one source, per output prefix, computed once each."""

    def __init__(self, model, src):
        self.model = model
        with torch.no_grad():
            self.src = src[None]
            self.mask = torch.ones_like(self.src, dtype=torch.bool)[:, None, None, :]
            self.memory = model.encode(self.src, self.mask)
        self.cache, self.raw = {}, {}

    def logp(self, prefixes, raw=False):
        """The log-softmax (or, with `raw`, the logits) of the next token after each prefix, as lists."""
        todo = {}
        for p in prefixes:
            if p not in self.cache:
                todo.setdefault(len(p), {})[p] = None
        for L, group in todo.items():
            group = list(group)
            n = len(group)
            ys = torch.tensor([[SOS, *p] for p in group], dtype=torch.long)
            causal = torch.ones(L + 1, L + 1, dtype=torch.bool).tril()
            with torch.no_grad():
                logits = self.model.decode(ys, self.memory.expand(n, -1, -1), self.mask.expand(n, -1, -1, -1),
                                           causal)[0][:, -1]
            for p, row, lg in zip(group, F.log_softmax(logits.double(), -1).tolist(), logits.double().tolist()):
                self.cache[p], self.raw[p] = row, lg
        return [(self.raw if raw else self.cache)[p] for p in prefixes]

    def total(self, tokens):
        """The log-probability of an output (tokens after SOS)."""
        rows = self.logp([tuple(tokens[:t]) for t in range(len(tokens))])
        return sum(row[tok] for row, tok in zip(rows, tokens))

    def greedy(self, max_len):
        seq = ()
        for _ in range(max_len):
            row = self.logp([seq])[0]
            seq += (max(range(len(row)), key=row.__getitem__),)
            if seq[-1] == EOS:
                break
        return seq


def _beam(search, beam_size, max_len, alpha, *, norm="eos", carry=False, compete=False, refill=False,
          truncate=True, order="score", finish_at_max=True, accumulate=True, prune=True, raw=False, gaps=None):
    """Beam search run here on `search`'s model, with the given typical mistakes; `gaps` collects the pairs of
    values that decide the result, with the number of tokens they sum (the totals on either side of each cut of the
    beam, and the scores on either side of the cut of the finished outputs to beam_size)."""
    def length(seq):
        return max(len(seq) - (norm == "no_eos" and seq[-1] == EOS) + (norm == "sos"), 1)

    def score(seq, total):
        return total if norm == "none" else total / length(seq) ** alpha

    if compete:
        beam = [((), 0.0, False)]
        for step in range(max_len):
            live = [b for b in beam if not b[2]]
            if not live:
                break
            cands = [b for b in beam if b[2]]
            for (s, t, _), row in zip(live, search.logp([s for s, _, _ in live])):
                cands += [(s + (tok,), t + lp, tok == EOS or step == max_len - 1) for tok, lp in enumerate(row)]
            cands.sort(key=lambda c: score(c[0], c[1]), reverse=True)
            beam = cands[:beam_size]
        return sorted(((s, score(s, t)) for s, t, _ in beam), key=lambda p: p[1], reverse=True)
    alive, finished = [((), 0.0)], []
    for step in range(max_len):
        rows = search.logp([s for s, _ in alive], raw)
        cands = [(s + (tok,), (t + lp) if accumulate else lp)
                 for (s, t), row in zip(alive, rows) for tok, lp in enumerate(row)]
        cands.sort(key=lambda c: c[1], reverse=True)
        if gaps is not None and len(cands) > beam_size:
            gaps.append((cands[beam_size - 1][1], cands[beam_size][1], step + 1))
        last, keep = step == max_len - 1, []
        for rank, (seq, total) in enumerate(cands if (refill or not prune) else cands[:beam_size]):
            done = seq[-1] == EOS or last
            if refill and rank >= beam_size:
                if len(keep) >= beam_size:
                    break
                if not done:
                    keep.append((seq, total))
            elif done:
                if seq[-1] == EOS or finish_at_max:
                    finished.append((seq, score(seq, total)))
            elif not refill or len(keep) < beam_size:
                keep.append((seq, score(seq, total) if carry else total))
        if not keep:
            break
        alive = keep
    if order == "score":
        finished.sort(key=lambda p: p[1], reverse=True)
    elif order == "tokens":
        finished.sort(key=lambda p: p[0], reverse=True)
    if gaps is not None and len(finished) > beam_size:
        gaps.append((finished[beam_size - 1][1], finished[beam_size][1], max_len))
    return finished[:beam_size] if truncate else finished


BEAM_VARIANTS = {"none": {"norm": "none"}, "no_eos": {"norm": "no_eos"}, "sos": {"norm": "sos"},
                 "carry": {"carry": True}, "compete": {"compete": True}, "refill": {"refill": True},
                 "drop_max": {"finish_at_max": False}, "no_prune": {"prune": False}, "last": {"accumulate": False},
                 "raw": {"raw": True},
                 "all": {"truncate": False}, "unsorted": {"order": "finished"}, "by_tokens": {"order": "tokens"}}
BEAM_HINTS = (("all", BM_TOO_MANY), ("unsorted", BM_UNSORTED), ("none", BM_NO_NORM), ("no_eos", BM_LEN_NO_EOS),
              ("sos", BM_NORM_PLUS_SOS), ("carry", BM_CARRY_NORM),
              ("compete", BM_COMPETE), ("refill", BM_REFILL), ("drop_max", BM_DROP_MAX), ("no_prune", BM_NO_PRUNE),
              ("last", BM_LAST_ONLY), ("raw", BM_RAW))
# The mistakes of the length that normalises: where one is shown, no mistake named before it gives its result.
LENGTH_MISTAKES = ("none", "no_eos", "sos", "carry")
# The beam-policy mistakes that the table's rows make: each check shows them on every model it draws, or on none.
POLICIES = ("all", "unsorted")


# A correct beam search may compute its log-probabilities in float32 (the log-softmax of logits cast to float32,
# running totals kept in float32): each of an output's n tokens then adds an error of a few float32 epsilons,
# relative to the values summed. Measured on the models drawn here, the error of a score stays below
# 1.6 * n * eps * (1 + |score|); a score is right within five times that. The typical mistakes change a score by
# far more (a factor len(tokens) ** alpha, a token's log-probability) or change the tokens: `_worth_it` keeps only
# the models on which each mistake checked for moves a result by 100 tolerances or more, and on which every cut
# that decides the result (of the beam, of the finished outputs to beam_size) has a margin of 4 tolerances.
F32_EPS = torch.finfo(torch.float32).eps
SHOWN = 100  # a mistake shown must move a result by this many tolerances
MARGIN = 4  # the margin, in tolerances, of every cut that decides the result


def _tol(value, n_tokens):
    """How far a score (or a running total) of n_tokens tokens computed in float32 may be from float64's."""
    return 8 * max(n_tokens, 1) * F32_EPS * (1 + abs(value))


def _same_hyps(got, expected, tol=None, scale=1.0):
    """The same outputs with the same scores: within `tol` * (1 + |score|) where given, else within `scale` float32
    tolerances. Two outputs whose expected scores are within two tolerances of each other may come in either
    order: rounding can swap them."""
    def margin(d, n):
        return tol * (1 + abs(d)) if tol is not None else scale * _tol(d, n)

    if len(got) != len(expected):
        return False
    where = {tuple(c): k for k, (c, _) in enumerate(expected)}
    matched = set()
    for i, (a, b) in enumerate(got):
        k = where.get(tuple(a)) if len(where) == len(expected) else i
        if k is None or tuple(expected[k][0]) != tuple(a) or k in matched:
            return False
        matched.add(k)
        c, d = expected[k]
        if not (abs(b - d) <= margin(d, len(c)) and abs(expected[i][1] - d) <= 2 * margin(d, len(c))):
            return False  # (written so that a NaN score is never the same)
    return True


class _BeamCase:
    """A model and a source word (tried here first) on which beam search of these settings is worth checking."""

    def __init__(self, reference, rng, beam_size, max_len, alpha, *, shows=(), hides=(), greedy_ends=None):
        self.beam_size, self.max_len, self.alpha = beam_size, max_len, alpha
        models = {}  # V_tgt -> the model of a draw turned down, to be drawn anew
        for _ in range(300):
            self.V_src, self.V_tgt = 9, _randint(rng, 6, 8)
            out_scale = 1.0 + float(torch.rand((), generator=rng))
            eos_bias = 0.5 + 2.0 * float(torch.rand((), generator=rng))  # outputs that end at different steps
            self.ref = models[self.V_tgt] = _tiny(reference, rng, self.V_src, self.V_tgt, out_scale=out_scale,
                                                  eos_bias=eos_bias, reuse=models.get(self.V_tgt))
            self.src = torch.randint(4, self.V_src, (_randint(rng, 2, 5),), generator=rng)
            if self._worth_it(reference, shows, hides, greedy_ends):
                return
        raise RuntimeError("no model found on which beam search shows the mistakes it is checked for")

    def _worth_it(self, reference, shows, hides, greedy_ends):
        self.search = _Search(self.ref, self.src)
        gaps = []
        right = self.variant(gaps=gaps)
        if any(abs(a - b) < MARGIN * _tol(max(abs(a), abs(b)), n) for a, b, n in gaps):
            return False  # a near-tie: the result must not hang on rounding (float32's included)
        if greedy_ends is not None:
            # With alpha > 0, a greedy output that ends with EOS has 3 tokens or more: its score divided by its
            # length without EOS then differs from its plain log-probability, and each mistake gets its own hint.
            greedy = self.search.greedy(self.max_len)
            if len(greedy) < 2 + (greedy_ends and self.alpha > 0) or (greedy[-1] == EOS) != greedy_ends:
                return False
        results = {}
        for name in set(shows) | set(hides):
            if name == "none_tokens":
                differs = [t for t, _ in self.variant(**BEAM_VARIANTS["none"])] != [t for t, _ in right]
            else:
                results[name] = self.variant(**BEAM_VARIANTS[name])
                # shown: far from the right result, so that a float32 computation of it cannot pass; hidden: the
                # right result itself, so that the mistake passes.
                differs = (not _same_hyps(results[name], right, scale=SHOWN) if name in shows
                           else not _same_hyps(results[name], right))
            if differs != (name in shows):
                return False
        # Each length mistake shown must not give the result of a mistake named before it, whose hint it would get.
        for k, (name, hint) in enumerate(BEAM_HINTS):
            if name in shows and name in LENGTH_MISTAKES:
                for before, other in BEAM_HINTS[:k]:
                    if other != hint:
                        if before not in results:
                            results[before] = self.variant(**BEAM_VARIANTS[before])
                        if _same_hyps(results[before], results[name], scale=SHOWN):
                            return False
        with torch.no_grad():
            self.expected = [(tuple(t), s) for t, s in reference.beam_search(self.ref, self.src, self.beam_size,
                                                                             self.max_len, self.alpha)]
        return _same_hyps(self.expected, right, tol=1e-9)  # two float64 computations of the same search

    def variant(self, **flags):
        return _beam(self.search, self.beam_size, self.max_len, self.alpha, **flags)

    def run(self, learner, device="cpu", strict=False):
        h = _learner_tiny(learner, self.ref, self.V_src, self.V_tgt, device)
        method(h, "eval", "TinyTransformer")()
        self.h = h
        got = learner.beam_search(h, self.src.to(device), self.beam_size, self.max_len, alpha=self.alpha)
        return _hyps(got, strict)

    def judge(self, got):
        """`got` must be the reference's outputs, with its scores to float32's precision; name the mistake
        otherwise."""
        if _same_hyps(got, self.expected):
            return
        _check_form(got, self.beam_size, self.max_len, self.expected)
        mistakes = [(hint, lambda n=name: self.variant(**BEAM_VARIANTS[n])) for name, hint in BEAM_HINTS]
        hint = diagnose(got, mistakes, "", same=_same_hyps)
        expect(not hint, hint)
        expect(len(got) <= self.beam_size, BM_TOO_MANY)
        scores = [s for _, s in got]
        expect(all(a >= b for a, b in zip(scores, scores[1:])), BM_UNSORTED)
        self.check_scores(got)
        raise Hint(BM_GENERIC)

    def check_scores(self, got):
        """Each score must be its tokens' log-probability, normalised; name the mistake otherwise."""
        for toks, s in got:
            if any(not 0 <= t < self.V_tgt for t in toks) or not toks:
                continue
            total = self.search.total(toks)
            n = len(toks)
            right = total / n ** self.alpha
            if not abs(s - right) <= _tol(right, n):
                raise Hint(diagnose(s, [(BM_NO_NORM, total if self.alpha else None),
                                        (BM_LEN_NO_EOS,
                                         total / max(n - 1, 1) ** self.alpha if toks[-1] == EOS else None),
                                        (BM_NORM_PLUS_SOS, total / (n + 1) ** self.alpha)], BM_SCORE,
                                    same=lambda a, b: abs(a - b) <= _tol(b, n)))


def _plain(x):
    if isinstance(x, np.ndarray) or (isinstance(x, torch.Tensor) and not odd_tensor(x)):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return [_plain(t) for t in x]
    return x


def _hyps(result, strict=False):
    """The learner's beam search result as [(tokens tuple, float)], checking its form (leniently unless strict)."""
    expect(isinstance(result, (list, tuple)), BM_LIST)
    out = []
    for item in result:
        expect(isinstance(item, (list, tuple)) and len(item) == 2, BM_LIST)
        toks, score = item
        if not strict:
            toks, score = _plain(toks), _plain(score)
            score = score[0] if isinstance(score, list) and len(score) == 1 else score
            score = float(score) if type(score) is int else score
        expect(isinstance(toks, list) and all(type(t) is int for t in toks), BM_TOKENS)
        expect(type(score) is float, BM_FLOAT)
        out.append((tuple(toks), score))
    expect(len(out) > 0, BM_EMPTY)
    return out


def _check_form(got, beam_size, max_len, expected=()):
    if all(t[:1] == (SOS,) for t, _ in got):
        expect(not any(len(t) > max_len for t, _ in got), BM_WITH_SOS)
        expect([t[1:] for t, _ in got] != [t for t, _ in expected], BM_WITH_SOS)
    for toks, _ in got:
        expect(len(toks) <= max_len, BM_TOO_LONG)
        expect(EOS not in toks[:-1], BM_AFTER_EOS)
        expect(len(toks) == max_len or toks[-1:] == (EOS,), BM_NO_EOS)
    expect(len(set(t for t, _ in got)) == len(got), BM_DUPLICATE)


@points(1, part="beam_search")
def test_beam_size_one_is_greedy(learner, reference, rng):
    """With beam_size=1, is the output the greedy one, scored by its normalised log-probability?"""
    for max_len, alpha, ends in ((4, 1.0, True), (3, 0.6, False), (5, 0.0, True)):
        case = _BeamCase(reference, rng, 1, max_len, alpha, greedy_ends=ends)
        got = case.run(learner)
        greedy = case.search.greedy(max_len)
        if len(got) > 1:
            _check_form(got, 1, max_len)
            expect(False, BM_TOO_MANY)
        toks = got[0][0]
        if toks != greedy:
            expect(toks != (SOS,) + greedy, BM_WITH_SOS)
            expect(toks + (EOS,) != greedy, BM_NO_EOS)
            expect(False, BM_NOT_GREEDY)
        case.judge(got)


@points(2, part="beam_search")
def test_beam_matches_reference(learner, reference, rng):
    """With beams of 2 to 5 and alpha 0, 0.6 and 1, are the outputs and their scores exactly the reference's?"""
    for beam_size, max_len, alpha, shows in ((3, 4, 0.6, ("no_eos", "carry", "all", "by_tokens")),
                                             (4, 4, 1.0, ("refill", "drop_max", "unsorted")),
                                             (2, 3, 0.0, ("compete", "no_prune")),
                                             (5, 5, 1.0, ("sos",))):
        case = _BeamCase(reference, rng, beam_size, max_len, alpha, shows=shows)
        case.judge(case.run(learner))


@points(1, part="beam_search")
def test_beam_length_normalisation_changes_the_ranking(learner, reference, rng):
    """Where dividing by len(tokens) ** alpha changes which outputs win, are the outputs the reference's?"""
    for beam_size, max_len, alpha in ((3, 4, 1.0), (4, 5, 0.6)):
        case = _BeamCase(reference, rng, beam_size, max_len, alpha, shows=("none_tokens", "no_eos", "carry") + POLICIES)
        case.judge(case.run(learner))


@points(0.5, part="beam_search")
def test_beam_returns_sorted_outputs(learner, reference, rng):
    """Does it return at most beam_size (list of ints, float) pairs, finished at EOS or max_len, best first?"""
    case = _BeamCase(reference, rng, 4, 4, 0.0, shows=POLICIES + ("by_tokens",))
    got = case.run(learner, strict=True)
    _check_form(got, 4, 4)
    expect(len(got) <= 4, BM_TOO_MANY)
    scores = [s for _, s in got]
    expect(all(a >= b for a, b in zip(scores, scores[1:])), BM_UNSORTED)
    case.judge(got)


@points(0.5, part="beam_search")
def test_beam_runs_on_any_device(learner, reference, rng, devices):
    """Does beam_search run on every device (a GPU too), creating its tensors on the input's device?"""
    for device in devices:
        case = _BeamCase(reference, rng, 3, 4, 0.0, hides=POLICIES)
        case.judge(case.run(learner, device))
    case.h.to(device=torch.device("meta"))
    expect_device_agnostic(learner, "beam_search", case.h, case.src, 3, 4, alpha=0.0)
