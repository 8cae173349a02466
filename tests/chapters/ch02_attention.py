"""Exercise 02_attention: typical mistakes and what they must cost."""

from chapters import Mistake

KEY = "02_attention"
DECODER_FORWARD = {"test_attn_decoder_matches_reference", "test_attn_decoder_mask",
                   "test_attn_decoder_gradients", "test_attn_decoder_dtypes_and_devices"}

MISTAKES = {
    "no_scale": Mistake(
        21, {"test_scaled_dot_score_matches_reference"},
        {"test_scaled_dot_score_matches_reference": "not divided by sqrt(d)"},
        edits=(("return dot_score(query, keys) / math.sqrt(query.size(-1))", "return dot_score(query, keys)"),)),
    "general_w_transposed": Mistake(
        16, {"test_general_score_matches_reference", "test_general_score_gradients"} | DECODER_FORWARD,
        {"test_general_score_matches_reference": "W is used transposed",
         "test_attn_decoder_matches_reference": "your general_score is wrong"},
        edits=(("projected = query @ W  #", "projected = query @ W.T  #"),)),
    "mask_filled_with_zero": Mistake(
        16, {"test_attention_context_weights_sum_to_one", "test_attention_context_mask",
             "test_attention_context_padding_does_not_leak", "test_attn_decoder_mask",
             "test_attn_decoder_padding_does_not_leak", "test_attn_decoder_gradients"},
        {"test_attention_context_mask": "set to 0 instead of -inf",
         "test_attention_context_padding_does_not_leak": "Padding leaks",
         "test_attn_decoder_mask": "your attention_context is wrong"},
        edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores.masked_fill(~mask, 0.0)"),)),
    "decoder_w_a_of_hidden": Mistake(
        18, DECODER_FORWARD,
        {"test_attn_decoder_matches_reference": "W_a transposed",
         "test_attn_decoder_dtypes_and_devices": "W_a transposed"},
        edits=(("scores = general_score(hidden, enc_outputs, self.W_a.weight)",
                "scores = dot_score(self.W_a(hidden), enc_outputs)"),)),
    "sigma_is_d": Mistake(
        19, {"test_local_attention_matches_reference", "test_local_attention_mask", "test_local_attention_gradients"},
        {"test_local_attention_matches_reference": "sigma = D: it must be sigma = D / 2",
         "test_local_attention_mask": "sigma = D: it must be sigma = D / 2"},
        edits=(("sigma = D / 2", "sigma = D"),)),
}
