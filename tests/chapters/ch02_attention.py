"""Exercise 02_attention: typical mistakes and what they must cost."""

from chapters import Mistake

KEY = "02_attention"
DECODER = {"test_attn_decoder_matches_reference", "test_attn_decoder_mask", "test_attn_decoder_padding_does_not_leak",
           "test_attn_decoder_gradients", "test_attn_decoder_dtypes_and_devices"}
CONTEXT_WITH_MASK = {"test_attention_context_weights_sum_to_one", "test_attention_context_mask",
                     "test_attention_context_padding_does_not_leak"}
MASKED_DECODER = {"test_attn_decoder_mask", "test_attn_decoder_padding_does_not_leak", "test_attn_decoder_gradients"}
LOCAL_VALUES = {"test_local_attention_matches_reference", "test_local_attention_window", "test_local_attention_mask",
                "test_local_attention_gradients"}

MISTAKES = {
    "no_scale": Mistake(
        21, {"test_scaled_dot_score_matches_reference"},
        {"test_scaled_dot_score_matches_reference": "not divided by sqrt(d)"},
        edits=(("return dot_score(query, keys) / math.sqrt(query.size(-1))", "return dot_score(query, keys)"),)),
    # Part 5 builds on the learner's own general_score: the decoder that calls it is not charged again.
    "general_w_transposed": Mistake(
        20, {"test_general_score_matches_reference", "test_general_score_gradients"},
        {"test_general_score_matches_reference": "W is used transposed",
         "test_general_score_gradients": "W is used transposed"},
        edits=(("projected = query @ W  #", "projected = query @ W.T  #"),)),
    # ... nor for the learner's own attention_context, wrong with a mask.
    "mask_filled_with_zero": Mistake(
        19, CONTEXT_WITH_MASK,
        {"test_attention_context_weights_sum_to_one": "set to 0 instead of -inf",
         "test_attention_context_mask": "set to 0 instead of -inf",
         "test_attention_context_padding_does_not_leak": "Padding leaks"},
        edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores.masked_fill(~mask, 0.0)"),)),
    # Right in float32 and float64; float16 cannot hold -1e9.
    "mask_filled_with_minus_1e9": Mistake(
        21, {"test_attention_context_mask"},
        {"test_attention_context_mask": "-1e9 overflows"},
        edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores.masked_fill(~mask, -1e9)"),)),
    # Has every property (weights >= 0 summing to 1, padding at exactly 0, no leak) but the wrong values.
    "context_rescales_scores": Mistake(
        18, {"test_attention_context_matches_reference"} | CONTEXT_WITH_MASK,
        {"test_attention_context_weights_sum_to_one": "scaled before the softmax",
         "test_attention_context_padding_does_not_leak": "scaled before the softmax"},
        edits=(("weights = torch.softmax(scores, dim=-1)  # (B, S)",
                "weights = torch.softmax(scores / math.sqrt(scores.size(-1)), dim=-1)  # (B, S)"),)),
    # An attention_context that ignores the mask hides whether the decoder passes one: the one cost
    # of part 4 that part 5 cannot avoid, and it says so.
    "context_ignores_mask": Mistake(
        16, CONTEXT_WITH_MASK | MASKED_DECODER,
        {"test_attention_context_mask": "The mask is ignored",
         "test_attn_decoder_mask": "fix attention_context first",
         "test_attn_decoder_gradients": "fix attention_context first"},
        one_hint=False,
        edits=(('scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) is exactly 0', "pass"),)),
    "decoder_w_a_of_hidden": Mistake(
        17, DECODER,
        {"test_attn_decoder_matches_reference": "W_a transposed",
         "test_attn_decoder_padding_does_not_leak": "W_a transposed",
         "test_attn_decoder_dtypes_and_devices": "W_a transposed"},
        edits=(("scores = general_score(hidden, enc_outputs, self.W_a.weight)",
                "scores = dot_score(self.W_a(hidden), enc_outputs)"),)),
    # The window property holds; the values do not, so the window check does not pay either.
    "sigma_is_d": Mistake(
        18, LOCAL_VALUES,
        {"test_local_attention_matches_reference": "sigma = D: it must be sigma = D / 2",
         "test_local_attention_window": "sigma = D: it must be sigma = D / 2",
         "test_local_attention_mask": "sigma = D: it must be sigma = D / 2"},
        edits=(("sigma = D / 2", "sigma = D"),)),
    # The window's centre rounds halves up (floor(p + 0.5)), not to even as torch.round does: the same
    # window for every p but one exactly halfway between two positions, which only the window check draws.
    "local_round_half_up": Mistake(
        21, {"test_local_attention_window"}, {"test_local_attention_window": "halves to the even integer"},
        edits=(("window = (positions - torch.round(p).unsqueeze(-1)).abs() <= D",
                "window = (positions - torch.floor(p + 0.5).unsqueeze(-1)).abs() <= D"),)),
    # W applied once per key instead of once per query: slower, equally right, full marks.
    "general_w_per_key_ok": Mistake(22, set(), edits=(
        ("    projected = query @ W  # (B, d_k)\n    return (keys * projected.unsqueeze(-2)).sum(dim=-1)  # (B, S)",
         "    return ((keys @ W.T) * query.unsqueeze(-2)).sum(dim=-1)  # (B, S)"),)),
    # Right on the CPU, fails on a GPU: caught through the meta device on a CPU-only grader.
    "local_positions_on_cpu": Mistake(
        21, {"test_local_attention_matches_reference"},
        {"test_local_attention_matches_reference": "would fail on a GPU"},
        edits=(("positions = torch.arange(scores.size(-1), device=scores.device, dtype=scores.dtype)",
                "positions = torch.arange(scores.size(-1), dtype=scores.dtype)"),)),
}
