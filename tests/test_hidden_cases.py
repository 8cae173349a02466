"""The hidden tests' own case builders, checked against slower oracles of their own."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("B, max_len, norm_first, special", [
    (5, 7, False, {}), (6, 8, True, {}), (4, 6, False, {"sos": 3, "eos": 4, "pad": 5}), (1, 4, True, {})])
def test_exercise_06s_batched_search_finds_what_one_decoding_at_a_time_finds(B, max_len, norm_first, special):
    """Exercise 06's greedy checks choose their model among candidates decoded in one batch, each typical mistake's
    tokens cut from never-stopped rows (`_candidates`). Every candidate it keeps must show, decoded on its own with
    the mistake made (`_ref_greedy`), the very tokens it derived, all different from each other."""
    from autograder.hidden import test_06_transformer as hidden
    from solutions import ch06_transformer as reference

    sos, eos, pad = special.get("sos", hidden.SOS), special.get("eos", hidden.EOS), special.get("pad", hidden.PAD)
    shown = hidden.SHOWN if B > 1 else ("offset_zero",)
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
        ref.load_state_dict(sd)
        found = hidden._candidates(reference, ref, srcs, deltas, B, max_len, sos, eos, pad, shown)
        for k, j, order, toks in found[:2]:
            one = dict(sd, **{"out.bias": sd["out.bias"].clone()})
            one["out.bias"][eos] += deltas[j]
            ref.load_state_dict(one)
            src = srcs[k][order]
            assert torch.equal(toks[0], reference.greedy_decode(ref, src, max_len, sos, eos, pad)), seed
            for mistake, derived in zip(shown, toks[2:]):
                assert torch.equal(derived, hidden._ref_greedy(reference, ref, src, max_len, sos, eos, pad, mistake)), \
                    (seed, mistake)
            assert len(toks) == 2 + len(shown)
            assert not any(torch.equal(a, b) for i, a in enumerate(toks) for b in toks[:i]), seed
            if B > 1:
                assert hidden._row0_early(toks[0], eos), seed
            kept += 1
        ref.load_state_dict(sd)
    assert kept >= 4  # (about one weight set in four has candidates)
