"""The hidden tests' own case builders, checked against slower oracles of their own."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("B, max_len, norm_first, special, uncached", [
    (5, 7, False, {}, True), (6, 8, True, {}, False), (4, 6, False, {"sos": 3, "eos": 4, "pad": 5}, True)])
def test_exercise_06s_batched_search_finds_what_one_decoding_at_a_time_finds(B, max_len, norm_first, special,
                                                                               uncached):
    """Exercise 06's greedy checks choose their model among candidates decoded in one batch, each typical mistake's
    tokens cut from never-stopped rows (`_candidates`). Every candidate it keeps must show, decoded on its own with
    the mistake made (`_ref_greedy`), the very tokens it derived, all different from each other, and, for the checks
    of the decoder without a cache, other tokens than the right ones with no causal mask at all; other tokens with
    `finished` set anew at each step (with B > 1); and each row that
    the checks of a batch of one may take must show, alone, a decoder that feeds every token at position 0
    (`_one_row`)."""
    from autograder.hidden import test_06_transformer as hidden
    from solutions import ch06_transformer as reference

    sos, eos, pad = special.get("sos", hidden.SOS), special.get("eos", hidden.EOS), special.get("pad", hidden.PAD)
    shown = hidden.SHOWN if B > 1 else ("offset_zero",)
    differ = hidden.UNCACHED_MISTAKES if uncached else ()
    kept = 0
    for seed in range(30):
        if kept >= 4:
            break
        rng = torch.Generator().manual_seed(seed)
        ref = reference.Transformer(9, 9, 16, 2, 2, 24, 0.0, 64, norm_first).eval().double()
        sd = hidden._state(rng, ref)
        for n in ("src_embed.weight", "tgt_embed.weight"):
            sd[n] = hidden._r(hidden._randn(rng, 9, 16, scale=0.15))
        avoid = (sos, eos) + ((hidden.PAD,) if pad != hidden.PAD else ())
        srcs = [hidden._padded_tokens(rng, B, 4, pad=pad, lo=0, avoid=avoid) for _ in range(8)]
        deltas = [-1.0 + 5.0 * j / 6 for j in range(6)]
        found = hidden._candidates(reference, sd, 2, norm_first, srcs, deltas, B, max_len, sos, eos, pad, shown,
                                   differ)
        for k, j, order, toks in found[:2]:
            one = dict(sd, **{"out.bias": sd["out.bias"].clone()})
            one["out.bias"][eos] += deltas[j]
            ref.load_state_dict(one)
            src = srcs[k][order]
            mask = reference.make_src_mask(src, pad)
            for seen in (mask, None):  # the search's own encoder is the reference's
                assert torch.allclose(hidden._Fast(sd, 2, norm_first).encode(src, seen), ref.encode(src, seen),
                                      rtol=1e-12, atol=1e-12)
            assert torch.equal(toks[0], reference.greedy_decode(ref, src, max_len, sos, eos, pad)), seed
            for mistake, derived in zip(shown, toks[2:]):
                assert torch.equal(derived, hidden._ref_greedy(reference, ref, src, max_len, sos, eos, pad, mistake)), \
                    (seed, mistake)
            for mistake in differ:
                assert not torch.equal(toks[0], hidden._ref_greedy(reference, ref, src, max_len, sos, eos, pad,
                                                                   mistake)), (seed, mistake)
            assert len(toks) == 2 + len(shown)
            assert not any(torch.equal(a, b) for i, a in enumerate(toks) for b in toks[:i]), seed
            if B > 1:
                assert hidden._row0_early(toks[0], eos), seed
                # a decoder that forgets which rows finished decodes other tokens
                assert not torch.equal(toks[0], hidden._ref_greedy(reference, ref, src, max_len, sos, eos, pad,
                                                                   "forget")), seed
                # Each row the one-row checks may take: alone, the position of the tokens fed decides its tokens.
                rows = hidden._one_row(src, toks, eos)
                assert rows, seed
                for row in rows:
                    alone = reference.greedy_decode(ref, row, max_len, sos, eos, pad)
                    assert not torch.equal(alone, hidden._ref_greedy(reference, ref, row, max_len, sos, eos, pad,
                                                                     "offset_zero")), seed
            kept += 1
        ref.load_state_dict(sd)
    assert kept >= 4  # (about one weight set in four has candidates)


def test_exercise_09s_ties_text_tells_every_tie_rule_apart_at_its_first_merge():
    """Exercise 09's ties check trains on one repeated word (`_ties_case`) whose first merge differs under each way of
    breaking a tie among the most frequent pairs: the smallest pair (right), the largest, the first counted, and the
    smallest first id a with the first or the last of its pairs counted. At the first merge every training counts
    the pairs in the order of the text, however it keeps its counts, so no such rule escapes on any seed."""
    from autograder.hidden import test_09_gpt as hidden

    for seed in range(20):
        data = hidden._ties_case(torch.Generator().manual_seed(seed))
        chunks, weights = hidden._chunks(data)
        counts = {}
        for c, w in zip(chunks, weights):
            for p in hidden._pairs(c):
                counts[p] = counts.get(p, 0) + w
        top = max(counts.values())
        tied = [p for p, n in counts.items() if n == top]  # in the order counted
        a = min(p[0] for p in tied)
        firsts = [min(tied), max(tied), tied[0], [p for p in tied if p[0] == a][0], [p for p in tied if p[0] == a][-1]]
        assert len(set(firsts)) == 5, (seed, data)
        assert hidden._train(data, 257) == [min(tied)]


@pytest.mark.parametrize("shape, p_keep, fully_masked", [((3, 5), 0.6, 0), ((2, 1, 3, 4), 0.7, 1), ((4, 1), 0.7, 0),
                                                         ((1, 2), 0.99, 0)])
def test_random_masks_hide_something_and_leave_every_row_something(shape, p_keep, fully_masked):
    """A mask check that draws a mask hiding nothing cannot fail code that ignores the mask (exercise 02's
    decoder checks drew one now and then): every draw hides something where a row has room, and every row
    but the fully masked ones keeps a position. p_keep=0.99 draws the all-True case nearly always."""
    from autograder.hidden.support import random_mask

    for seed in range(300):
        m = random_mask(torch.Generator().manual_seed(seed), shape, p_keep=p_keep, fully_masked=fully_masked)
        assert m.shape == shape and m.dtype == torch.bool
        rows = m.reshape(-1, shape[-1])
        assert int((~rows.any(-1)).sum()) == fully_masked
        assert shape[-1] == 1 or not bool(m.all())
