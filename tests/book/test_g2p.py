"""Chapter 08's data pipeline and experiment: the split, the batched beam search against exercise
08's own, and the kept weights against the code that trained them."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from coursebook import g2p_data, g2p_experiment
from coursebook.g2p_analysis import is_correct, mcnemar, spread
from solutions import ch06_transformer
from solutions.ch08_pronunciation import EOS, beam_search, error_rates, pad_batch

ARPABET_39 = set("AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH "
                 "UH UW V W Y Z ZH".split())


@pytest.fixture(scope="module")
def lexicon():
    return g2p_data.load()


def test_split_is_by_word_and_sized_as_documented(lexicon):
    """Every kept word falls on one side, decided by its spelling; the sides have the documented shares."""
    sides = {s: set(lexicon.words(s)) for s in g2p_data.SPLITS}
    assert sum(len(v) for v in sides.values()) == len(lexicon.prons)
    assert not (sides["train"] & sides["test"]) and not (sides["valid"] & sides["test"])
    n = len(lexicon.prons)
    for side, share in (("test", 0.10), ("valid", 0.05), ("train", 0.85)):
        assert abs(len(sides[side]) / n - share) < 0.01, side
    # The same word always lands on the same side, wherever it is asked from.
    assert all(g2p_data.split_of(w) == "test" for w in list(sides["test"])[:50])


def test_kept_entries_are_letters_and_stress_free_phonemes(lexicon):
    assert all(re.fullmatch(r"[a-z]+", w) for w in lexicon.prons)
    phonemes = {ph for prons in lexicon.prons.values() for p in prons for ph in p}
    assert phonemes == ARPABET_39
    # several pronunciations are kept, distinct after the stress is gone
    assert lexicon.prons["either"] == (("IY", "DH", "ER"), ("AY", "DH", "ER"))
    assert all(len(set(p)) == len(p) for p in lexicon.prons.values())
    assert lexicon.dropped["apostrophe"] > 0 and "aaron's" not in lexicon.prons


def _tiny_transformer(seed):
    torch.manual_seed(seed)
    return g2p_experiment.TransformerG2P(12, 10, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32).eval()


@pytest.mark.parametrize("beam_size,alpha", [(1, 1.0), (3, 0.0), (3, 1.0), (4, 0.6)])
def test_batched_beam_agrees_with_the_exercise(beam_size, alpha):
    """The book decodes many words at once; each word's output is exercise 08's beam_search's best."""
    g = torch.Generator().manual_seed(beam_size)
    words = [torch.randint(4, 12, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (12,), generator=g)]
    for seed in range(3):
        model = _tiny_transformer(seed)
        batched = g2p_experiment.beam_decode(model, words, beam_size, max_len=7, alpha=alpha, batch_size=5)
        for word, got in zip(words, batched):
            best = beam_search(model, torch.tensor(word), beam_size, 7, alpha)[0][0]
            assert got == (best[:-1] if best[-1] == EOS else best)


def test_beam_of_one_is_chapter_06_greedy_decoding():
    model = _tiny_transformer(5)
    g = torch.Generator().manual_seed(0)
    words = [torch.randint(4, 12, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (16,), generator=g)]
    src, _ = pad_batch(words)
    greedy = ch06_transformer.greedy_decode(model, src, 6, pad=0).tolist()
    for got, row in zip(g2p_experiment.beam_decode(model, words, 1, max_len=6), greedy):
        want = row[:row.index(EOS)] if EOS in row else row
        assert got == want


@pytest.mark.parametrize("seed", g2p_experiment.SEEDS)
@pytest.mark.parametrize("kind", g2p_experiment.KINDS)
def test_kept_weights_match_the_code_that_trained_them(kind, seed):
    """The book loads the kept weights only while their manifest matches the current code, data and
    settings; an edit to the training code must come with `make train`."""
    config = dataclasses.replace(g2p_experiment.BUDGETS["full"], seed=seed)
    assert g2p_experiment.load(kind, config) is not None, (
        f"coursebook/g2p_weights/{g2p_experiment.weights_name(kind, seed)}.pt is stale or missing: run make train")


def test_mcnemar_counts_the_words_only_one_model_gets_wrong():
    """10 words only A gets wrong, 2 only B, 12 on which they agree: p = 2 P(X <= 2) for X ~
    Binomial(12, 1/2), 2 * 79 / 4096; the agreeing words change nothing, and swapping the models
    swaps the counts."""
    a = [True] * 10 + [False] * 2 + [True] * 5 + [False] * 7
    b = [False] * 10 + [True] * 2 + [True] * 5 + [False] * 7
    assert mcnemar(a, b) == (10, 2, pytest.approx(2 * 79 / 4096))
    assert mcnemar(b, a) == (2, 10, pytest.approx(2 * 79 / 4096))
    assert mcnemar(a, a) == (0, 0, 1.0)
    with pytest.raises(ValueError):
        mcnemar(a, b[:-1])


@pytest.mark.parametrize("only_a,only_b", [(230, 170), (1100, 1000), (60, 40)])
def test_mcnemar_agrees_with_the_normal_approximation_on_many_words(only_a, only_b):
    """On hundreds of discordant words the exact p-value is close to the continuity-corrected
    normal approximation, erfc(z / sqrt 2) with z = (|b - c| - 1) / sqrt(b + c)."""
    a = [True] * only_a + [False] * only_b
    b = [False] * only_a + [True] * only_b
    z = (abs(only_a - only_b) - 1) / math.sqrt(only_a + only_b)
    assert mcnemar(a, b)[2] == pytest.approx(math.erfc(z / math.sqrt(2)), rel=0.08)


def test_stored_word_outcomes_give_the_error_rates_of_the_exercise(lexicon):
    """The manifest keeps each model's test outcomes as (edit distance, reference length) per word,
    packed; unpacked, they give `error_rates`' PER and WER and the words McNemar's test pairs,
    for words with several pronunciations too, and for outputs longer than any reference."""
    words = [w for w in lexicon.words("valid") if len(lexicon.prons[w]) > 1][:40] + lexicon.words("valid")[:60]
    hyps = [lexicon.prons[w][-1][:-1] if i % 3 == 0 else lexicon.prons[w][0] if i % 3 == 1
            else lexicon.prons[w][0] * 3 for i, w in enumerate(words)]
    outcomes = g2p_experiment.word_outcomes(words, hyps, lexicon)
    again = g2p_experiment.unpack_outcomes(g2p_experiment.pack_outcomes(outcomes))
    assert again == outcomes
    per, wer = error_rates([list(h) for h in hyps], [[list(p) for p in lexicon.prons[w]] for w in words])
    assert g2p_experiment.rates(again) == (pytest.approx(per), pytest.approx(wer))
    assert [d > 0 for d, _ in again] == [not is_correct(h, lexicon.prons[w]) for w, h in zip(words, hyps)]


def test_spread_is_the_mean_and_sample_standard_deviation():
    assert spread([0.30, 0.32, 0.34]) == (pytest.approx(0.32), pytest.approx(0.02))
    assert spread([0.3]) == (0.3, 0.0)


@pytest.mark.parametrize("bfloat16", [True, False])
def test_training_computes_the_products_in_the_precision_its_settings_name(monkeypatch, bfloat16):
    """`Config.bfloat16` is what the page and the manifest report as the training's precision: under
    it every kind's output layer computes in bfloat16 while its weights stay float32; without it,
    in float32."""
    seen = []
    build = g2p_experiment.build

    def watched(kind, config, vocabs=None):
        model = build(kind, config, vocabs)
        out = model.out if kind == "transformer" else model.decoder.out
        out.register_forward_hook(lambda mod, args, out: seen.append((kind, out.dtype, mod.weight.dtype)))
        return model

    monkeypatch.setattr(g2p_experiment, "build", watched)
    config = dataclasses.replace(g2p_experiment.BUDGETS["small"], epochs=0.1, bfloat16=bfloat16)
    for kind in g2p_experiment.KINDS:
        _, record = g2p_experiment.train(kind, config)
        assert all(math.isfinite(loss) for loss in record["losses"])
    want = torch.bfloat16 if bfloat16 else torch.float32
    assert {kind for kind, _, _ in seen} == set(g2p_experiment.KINDS)
    assert all(out == want and weight == torch.float32 for _, out, weight in seen)


@pytest.mark.slow
def test_small_budget_pipeline_end_to_end(tmp_path, monkeypatch):
    """Data, vocabularies, bucketed batches, training, decoding and scoring, for every kind, in minutes:
    the pipeline that `make train` runs at full budget cannot rot unnoticed."""
    monkeypatch.setattr(g2p_experiment, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(g2p_experiment, "MANIFEST", tmp_path / "manifest.json")
    config = g2p_experiment.BUDGETS["small"]
    words = g2p_data.load().words("valid")[:300]
    for kind in g2p_experiment.KINDS:
        model, record = g2p_experiment.train(kind, config)
        assert record["losses"][-1] < record["losses"][0]
        per, wer, hyps = g2p_experiment.evaluate(model, words, beam_size=2)
        assert 0 < per <= 2 and 0 < wer <= 1 and len(hyps) == len(words)
        packed = g2p_experiment.test_outcomes(model, beam_size=2, words=words)
        assert g2p_experiment.rates(g2p_experiment.unpack_outcomes(packed["beam"])) == (
            pytest.approx(per), pytest.approx(wer))
        g2p_experiment.save(kind, config, model, record, {"valid_per": per})
        assert g2p_experiment.load(kind, config) is not None
