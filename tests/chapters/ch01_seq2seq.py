"""Exercise 01_seq2seq: typical mistakes and what they must cost."""

from chapters import Mistake

KEY = "01_seq2seq"
ENCODER = {"test_encoder_matches_reference", "test_encoder_final_is_last_state", "test_encoder_gradients"}

MISTAKES = {
    # Teacher forcing feeds the token it should predict.
    "tf_current": Mistake(
        18, {"test_seq2seq_teacher_forcing_matches_reference", "test_seq2seq_mixed_ratio_decides_per_step"},
        {"test_seq2seq_teacher_forcing_matches_reference": "CURRENT target token tgt[:, t]"},
        edits=(("y_prev = tgt[:, t - 1] if teacher", "y_prev = tgt[:, t] if teacher"),), one_hint=True),
    # Greedy decoding keeps writing argmax tokens after a row's eos.
    "greedy_no_pad": Mistake(
        17, {"test_greedy_matches_reference", "test_greedy_pads_after_eos", "test_greedy_honours_sos_eos_pad"},
        {"test_greedy_pads_after_eos": "must hold `pad`"},
        edits=(("y = logits.argmax(dim=-1).masked_fill(finished, pad)  # (B,)", "y = logits.argmax(dim=-1)  # (B,)"),),
        one_hint=True),
    # Beam search ranks by summed raw logits instead of log-probabilities.
    "beam_logits": Mistake(
        16, {"test_beam_matches_exhaustive_search", "test_beam_scores_are_log_probabilities",
             "test_beam_matches_reference"},
        {"test_beam_scores_are_log_probabilities": "raw logits"},
        edits=(("total = scores.unsqueeze(1) + F.log_softmax(logits, dim=-1)", "total = scores.unsqueeze(1) + logits"),),
        one_hint=True),
    # The context is the state after the first source token; the later parts, graded with the
    # learner's own modules, lose nothing for it.
    "enc_first": Mistake(
        17, ENCODER, {"test_encoder_matches_reference": "after the FIRST source token"},
        edits=(("return outputs, h_n[-1]  # (B, T, H), (B, H)", "return outputs, outputs[:, 0]"),), one_hint=True),
}
