"""Chapter 08's analyses of the pronunciation models, the measurements its page makes.

Hand-written, not generated. The data come from ``g2p_data`` and the models from
``g2p_experiment``; this module only looks at them:

* ``padding_share``, ``random_batches``: how much of a batch is padding, with and without
  exercise 08's ``bucket_batches``;
* ``rates_by_length``: phoneme and word error rates of the words of each length;
* ``align``, ``closest``, ``confusions``: which phonemes a model writes in place of which,
  from an edit-distance alignment with a backtrace;
* ``cross_attention``: where a decoder looks in a word's spelling while it writes each phoneme;
* ``mcnemar``, ``spread``: whether two models' error rates on the same words differ by more than
  chance, and the mean and spread of a rate over the seeds of a model.

Every scored word is compared with all its pronunciations, and its errors with the closest
one (the first of equally close ones), as exercise 08's ``error_rates`` does.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

import torch

from coursebook import g2p_data
from coursebook.g2p_experiment import TransformerG2P, beam_decode
from solutions.ch06_transformer import make_src_mask
from solutions.ch08_pronunciation import EOS, PAD, SOS, SPECIALS, edit_distance, error_rates

# ARPAbet's 15 vowels (ER, the r-coloured vowel of "bird", among them); the other 24 are consonants.
VOWELS = frozenset("AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split())


# --- padding ---------------------------------------------------------------------------------------


def random_batches(n: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Indices 0..n-1 shuffled and cut into batches, lengths ignored: the baseline for bucketing."""
    order = torch.randperm(n, generator=generator).tolist()
    return [order[start:start + batch_size] for start in range(0, n, batch_size)]


def padding_share(batches, *lengths) -> float:
    """The share of padding among the positions of the padded batches.

    Each list of `lengths` is one padded tensor per batch (the letters, the phonemes), each as
    long as the longest of its batch: padded positions / all positions, over every tensor."""
    real = total = 0
    for lens in lengths:
        for batch in batches:
            real += sum(lens[i] for i in batch)
            total += len(batch) * max(lens[i] for i in batch)
    return 1 - real / total


# --- error rates ------------------------------------------------------------------------------------


def is_correct(hyp, prons) -> bool:
    """Whether the output is one of the word's pronunciations."""
    return tuple(hyp) in {tuple(p) for p in prons}


def length_group(n: int, low: int, high: int) -> int:
    """Word length n, with every length below `low` counted as `low` and above `high` as `high`."""
    return min(max(n, low), high)


def rates_by_length(words, hyps, lexicon=None, low=4, high=13) -> dict:
    """{length: (PER, WER, number of words)} for the words of each length (in letters).

    Lengths up to `low` form one group, keyed `low`, and lengths from `high` up another."""
    lex = lexicon or g2p_data.load()
    groups = {}
    for word, hyp in zip(words, hyps):
        groups.setdefault(length_group(len(word), low, high), []).append((word, hyp))
    out = {}
    for n in sorted(groups):
        ws, hs = zip(*groups[n])
        per, wer = error_rates([list(h) for h in hs], [[list(p) for p in lex.prons[w]] for w in ws])
        out[n] = (per, wer, len(ws))
    return out


# --- alignments and confusions ----------------------------------------------------------------------


def closest(hyp, prons):
    """The pronunciation nearest the output in edit distance; the first of equally near ones."""
    distances = [edit_distance(list(hyp), list(p)) for p in prons]
    return prons[distances.index(min(distances))]


def align(ref, hyp) -> list[tuple]:
    """A cheapest alignment of ref with hyp: pairs (r, h), with None for the missing side.

    (r, h) with r == h is a match, with r != h a substitution; (r, None) a deletion, (None, h)
    an insertion. The number of non-matches is the edit distance. Where several alignments
    are equally cheap, the backtrace prefers a match or substitution, then a deletion."""
    n, m = len(ref), len(hyp)
    D = [[0] * (m + 1) for _ in range(n + 1)]  # D[i][j]: distance between ref[:i] and hyp[:j]
    for i in range(n + 1):
        D[i][0] = i
    for j in range(m + 1):
        D[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            D[i][j] = min(D[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]), D[i - 1][j] + 1, D[i][j - 1] + 1)
    pairs, i, j = [], n, m
    while i or j:
        if i and j and D[i][j] == D[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            pairs.append((ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and D[i][j] == D[i - 1][j] + 1:
            pairs.append((ref[i - 1], None))
            i -= 1
        else:
            pairs.append((None, hyp[j - 1]))
            j -= 1
    return pairs[::-1]


def confusions(words, hyps, lexicon=None) -> dict:
    """The errors of the outputs, each aligned with its word's closest pronunciation.

    Returns {"substitution": Counter((ref, hyp)), "deletion": Counter(ref),
    "insertion": Counter(hyp), "examples": {key: [word, ...]}}, the keys of the counters
    being those of the examples, in the order of `words`."""
    lex = lexicon or g2p_data.load()
    out = {"substitution": Counter(), "deletion": Counter(), "insertion": Counter(), "examples": {}}
    for word, hyp in zip(words, hyps):
        for r, h in align(closest(hyp, lex.prons[word]), hyp):
            if r == h:
                continue
            kind, key = ("deletion", r) if h is None else ("insertion", h) if r is None else ("substitution", (r, h))
            out[kind][key] += 1
            seen = out["examples"].setdefault((kind, key), [])
            if not seen or seen[-1] != word:
                seen.append(word)
    return out


# --- attention over a spelling ------------------------------------------------------------------------


@torch.no_grad()
def cross_attention(model, word: str, layer: int = -1, vocabs=None):
    """(letters, phonemes, weights (T, S)): the model's greedy output for `word` and the weight
    each output step gives each letter, the last step being the one that writes EOS.

    The attention GRU returns its weights from each decoder step. The Transformer's are read
    from the cross-attention of decoder layer `layer` (its forward returns (out, weights
    (B, H, T, S))) with a forward hook, averaged over the heads; its decoder is run once over
    the whole output with a causal mask, which gives every step the weights it had when decoding."""
    if not isinstance(model, TransformerG2P) and getattr(model, "kind", None) != "attention":
        raise ValueError("only the attention GRU and the Transformer have attention weights")
    v = vocabs or g2p_data.vocabs()
    ids = g2p_data.encode_words([word], v)
    out = beam_decode(model, ids, beam_size=1)[0]
    src = torch.tensor(ids)  # (1, S)
    inputs = torch.tensor([[SOS] + out])  # (1, T): what each step reads
    if isinstance(model, TransformerG2P):
        src_mask = make_src_mask(src, PAD)  # (1, 1, 1, S)
        causal = torch.ones(inputs.size(1), inputs.size(1), dtype=torch.bool).tril()  # (T, T)
        seen = []
        hook = model.decoder[layer].cross_attn.register_forward_hook(lambda mod, args, result: seen.append(result[1]))
        try:
            model.decode(inputs, model.encode(src, src_mask), src_mask, causal)
        finally:
            hook.remove()
        weights = seen[0][0].mean(dim=0)  # (T, S): heads averaged
    else:
        enc, hidden = model.start(src)
        rows = torch.tensor([0])
        steps = []
        for t in range(inputs.size(1)):
            _, hidden, w = model.step(enc, rows, inputs[:, t], hidden)  # w (1, S)
            steps.append(w[0])
        weights = torch.stack(steps)  # (T, S)
    names = v.phoneme_of
    return list(word), [names[i] for i in out] + [SPECIALS[EOS]], weights.numpy()


# --- comparing models ------------------------------------------------------------------------------


def mcnemar(wrong_a, wrong_b) -> tuple[int, int, float]:
    """The exact McNemar test of two models scored on the same words (one bool per word, True where
    the model got the word wrong): (words only A gets wrong, words only B gets wrong, two-sided p).

    Words both get right or both get wrong say nothing about which is better. Under the null
    hypothesis that the two are equally good, each of the n discordant words is A's error or B's
    with probability 1/2, so the smaller count is binomial(n, 1/2) and p is twice its lower tail."""
    if len(wrong_a) != len(wrong_b):
        raise ValueError("the two models must be scored on the same words")
    only_a = sum(1 for a, b in zip(wrong_a, wrong_b) if a and not b)
    only_b = sum(1 for a, b in zip(wrong_a, wrong_b) if b and not a)
    n, k = only_a + only_b, min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return only_a, only_b, min(1.0, 2 * tail / 2 ** n)


def spread(values) -> tuple[float, float]:
    """(mean, sample standard deviation) of a rate over seeds (0 for a single value)."""
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
