"""Exercise 08_pronunciation: typical mistakes of the vocabularies, the batches, the error rates, the training
step and beam search, each with its score, the checks it loses and their hints."""

from chapters import Mistake

KEY = "08_pronunciation"
VOCAB = {"test_build_vocab_matches_reference", "test_build_vocab_special_strings_in_data"}
RATES = {"test_error_rates_match_reference", "test_error_rates_ties_take_the_first_alternative"}
DISTANCE = {"test_edit_distance_matches_levenshtein", "test_edit_distance_edge_cases_and_type"}
TRAIN = {"test_train_step_returns_the_loss", "test_train_step_sgd_step_with_clipping", "test_train_step_two_adam_steps",
         "test_train_step_padding_changes_nothing", "test_train_step_runs_on_any_device"}
# The beam checks that draw models on which returning too many or unsorted outputs shows (alpha > 0 in two).
BEAM_POLICY = {"test_beam_matches_reference", "test_beam_length_normalisation_changes_the_ranking",
               "test_beam_returns_sorted_outputs"}
# The beam checks with alpha > 0, where a score not divided by the length shows.
BEAM_NORMALISED = {"test_beam_size_one_is_greedy", "test_beam_matches_reference",
                   "test_beam_length_normalisation_changes_the_ranking"}
CUT = "batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]"
MASK = "mask = torch.arange(L)[None, :] < torch.tensor([len(seq) for seq in seqs], dtype=torch.long)[:, None]"
SHUFFLE_BATCHES = "return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]"


def _all(checks, words):
    return {c: words for c in checks}


MISTAKES = {
    # Part 1: ids in the order the symbols come, not sorted.
    "vocab_unsorted": Mistake(18, VOCAB, _all(VOCAB, "in the order they first appear"), edits=(
        ("symbols = sorted({symbol for seq in sequences for symbol in seq} - set(SPECIALS))",
         "symbols = [s for s in dict.fromkeys(symbol for seq in sequences for symbol in seq) if s not in SPECIALS]"),)),
    # Part 1: a special's string in the data is numbered again with the other symbols.
    "vocab_special_twice": Mistake(19.5, {"test_build_vocab_special_strings_in_data"},
                                   {"test_build_vocab_special_strings_in_data": "gets a second id"}, edits=(
        ("symbols = sorted({symbol for seq in sequences for symbol in seq} - set(SPECIALS))",
         "symbols = sorted({symbol for seq in sequences for symbol in seq})"),)),
    "encode_key_error": Mistake(19, {"test_encode_maps_unknown_symbols_to_unk"},
                                {"test_encode_maps_unknown_symbols_to_unk": "raises KeyError"}, edits=(
        ("ids = [vocab.get(symbol, unk) for symbol in symbols]", "ids = [vocab[symbol] for symbol in symbols]"),)),
    # Part 2: True at the padding.
    "pad_mask_inverted": Mistake(18.5, {"test_pad_batch_matches_reference"},
                                 {"test_pad_batch_matches_reference": "mask is inverted"},
                                 edits=((MASK, MASK.replace("] < torch", "] >= torch")),)),
    # Part 2: only full batches are cut, so the last, smaller one is lost; the other bucketing checks use
    # lengths that fill every batch and lose nothing.
    "bucket_drops_last": Mistake(19, {"test_bucket_batches_is_a_partition"},
                                 {"test_bucket_batches_is_a_partition": "drops the last, smaller batch"},
                                 edits=((CUT, CUT.replace("range(0, len(order), batch_size)",
                                                          "range(0, len(order) - batch_size + 1, batch_size)")),)),
    # Part 2: the last batch is filled up with indices taken again from the start.
    "bucket_duplicates": Mistake(19, {"test_bucket_batches_is_a_partition"},
                                 {"test_bucket_batches_is_a_partition": "puts an index in two batches"},
                                 edits=((CUT, CUT + "\n    batches[-1] = (batches[-1] + order)[:batch_size]"),)),
    # Part 2: the batches come out shortest first.
    "bucket_not_shuffled": Mistake(19.5, {"test_bucket_batches_shuffles_the_batches"},
                                   {"test_bucket_batches_shuffles_the_batches": "sorted by length"},
                                   edits=((SHUFFLE_BATCHES, "return batches"),)),
    # Part 3: the first row of D starts at 1: every distance, and so both rates, are off.
    "edit_distance_off_by_one": Mistake(
        16, DISTANCE | RATES, {"test_edit_distance_matches_levenshtein": "wrong first row or column",
                               "test_error_rates_match_reference": "Fix edit_distance first",
                               "test_error_rates_ties_take_the_first_alternative": "Fix edit_distance first"},
        edits=(("previous = list(range(len(b) + 1))  # row i - 1 of D",
                "previous = list(range(1, len(b) + 2))  # row i - 1 of D"),)),
    # Part 3: PER as the average of the words' rates.
    "per_per_word": Mistake(18, RATES, _all(RATES, "average of per-word rates"), edits=(
        ("errors += distances[best]\n", "errors += distances[best] / len(alternatives[best])\n"),
        ("return errors / ref_len, wrong / len(hyps)", "return errors / len(hyps), wrong / len(hyps)"))),
    # Part 3: WER against the first alternative only (the ties check's words are never right: it passes).
    "wer_first_alternative": Mistake(18.5, {"test_error_rates_match_reference"},
                                     {"test_error_rates_match_reference": "FIRST alternative"}, edits=(
        ("wrong += distances[best] > 0", "wrong += distances[0] > 0"),)),
    # Part 4: padding counts in the loss, in every check of the part.
    "padding_in_loss": Mistake(16, TRAIN, _all(TRAIN, "Padding counts in the loss"), edits=(
        ("ignore_index=PAD, label_smoothing=label_smoothing", "label_smoothing=label_smoothing"),), one_hint=True),
    # Part 4: the decoder reads the targets themselves.
    "no_shift_right": Mistake(16, TRAIN, _all(TRAIN, "shifted right"), edits=(
        ("tgt_in = torch.cat([sos, tgt[:, :-1]], dim=1)  # (B, T): shifted right", "tgt_in = tgt"),), one_hint=True),
    # Part 4: only the SGD check clips (the others pass a clip no gradient reaches).
    "no_clipping": Mistake(19, {"test_train_step_sgd_step_with_clipping"},
                           {"test_train_step_sgd_step_with_clipping": "not clipped"}, edits=(
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n", ""),)),
    # Part 4: only the two-step check sees gradients that pile up (each other check makes one step).
    "grads_not_cleared": Mistake(19, {"test_train_step_two_adam_steps"},
                                 {"test_train_step_two_adam_steps": "adds the first step's gradients"}, edits=(
        ("    optimizer.zero_grad()\n", ""),)),
    # Part 4: SOS made on the CPU: right values here, a failure on a GPU.
    "train_sos_on_cpu": Mistake(19.5, {"test_train_step_runs_on_any_device"},
                                {"test_train_step_runs_on_any_device": "`train_step` would fail on a GPU"}, edits=(
        ("sos = torch.full_like(tgt[:, :1], SOS)  # (B, 1)", "sos = torch.full((tgt.size(0), 1), SOS)  # (B, 1)"),)),
    # Part 5: the scores are the plain log-probabilities: every check with alpha > 0 sees it.
    "beam_no_length_norm": Mistake(16, BEAM_NORMALISED, _all(BEAM_NORMALISED, "not length-normalised"), edits=(
        ("finished.append((seq, logp / len(seq) ** alpha))", "finished.append((seq, logp))"),), one_hint=True),
    "beam_unsorted": Mistake(16.5, BEAM_POLICY, _all(BEAM_POLICY, "not sorted best first"), edits=(
        ("    finished.sort(key=lambda pair: pair[1], reverse=True)\n", ""),), one_hint=True),
    "beam_too_many": Mistake(16.5, BEAM_POLICY, _all(BEAM_POLICY, "more than beam_size outputs"), edits=(
        ("return finished[:beam_size]", "return finished"),), one_hint=True),
    "beam_ys_on_cpu": Mistake(19.5, {"test_beam_runs_on_any_device"},
                              {"test_beam_runs_on_any_device": "`beam_search` would fail on a GPU"}, edits=(
        ("dtype=torch.long, device=src.device)  # (n, t+1)", "dtype=torch.long)  # (n, t+1)"),)),
}
