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
SHUFFLE = "order = torch.randperm(len(lengths), generator=generator).tolist()"
CELL = "current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))"
CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n"
NORMALISE = "finished.append((seq, logp / len(seq) ** alpha))"


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
    "pad_mask_inverted": Mistake(19, {"test_pad_batch_matches_reference"},
                                 {"test_pad_batch_matches_reference": "mask is inverted"},
                                 edits=((MASK, MASK.replace("] < torch", "] >= torch")),)),
    # Part 2: the caller's lists padded in place (right ids and mask): the first check of the part that sees
    # it loses its points (every exercise's rule: a function leaves its arguments as they were).
    "pad_batch_pads_the_callers_lists": Mistake(19, {"test_pad_batch_matches_reference"},
                                                {"test_pad_batch_matches_reference": "changed its argument `seqs`"},
                                                edits=((
        "    ids = torch.full((len(seqs), L), pad, dtype=torch.long)  # (B, L)\n"
        "    for i, seq in enumerate(seqs):\n"
        "        ids[i, :len(seq)] = torch.as_tensor(seq, dtype=torch.long)\n"
        "    mask = torch.arange(L)[None, :] < torch.tensor([len(seq) for seq in seqs], dtype=torch.long)[:, None]\n",
        "    lengths = [len(seq) for seq in seqs]\n"
        "    for seq in seqs:\n"
        "        seq += [pad] * (L - len(seq))\n"
        "    ids = torch.tensor(seqs, dtype=torch.long).reshape(len(seqs), L)\n"
        "    mask = torch.arange(L)[None, :] < torch.tensor(lengths, dtype=torch.long)[:, None]\n"),)),
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
    # Part 2: no shuffle before the sort: words of one length are always cut into the same batches (only the order
    # of the batches follows the generator); only the check with many words of each length sees it, under every seed.
    "bucket_no_shuffle_before_sort": Mistake(
        19.5, {"test_bucket_batches_shuffles_before_sorting"},
        {"test_bucket_batches_shuffles_before_sorting": "BEFORE the stable sort"},
        edits=((SHUFFLE, "order = list(range(len(lengths)))"),)),
    # Part 2, right: another shuffle drawn from the generator (the spec fixes no draw order), and torch's stable sort.
    "bucket_other_shuffle_ok": Mistake(20, set(), edits=(
        (SHUFFLE, "order = torch.rand(len(lengths), generator=generator).argsort().tolist()"),
        ("order.sort(key=lambda i: lengths[i])  # list.sort is stable",
         "order = [order[k] for k in torch.sort(torch.tensor([lengths[i] for i in order]), stable=True)[1].tolist()]"),
    )),
    # Part 3: the first row of D starts at 1: every distance, and so both rates, are off.
    "edit_distance_off_by_one": Mistake(
        16, DISTANCE | RATES, {"test_edit_distance_matches_levenshtein": "wrong first row or column",
                               "test_error_rates_match_reference": "Fix edit_distance first",
                               "test_error_rates_ties_take_the_first_alternative": "Fix edit_distance first"},
        edits=(("previous = list(range(len(b) + 1))  # row i - 1 of D",
                "previous = list(range(1, len(b) + 2))  # row i - 1 of D"),)),
    # Part 3: a swap of two neighbours counted as one edit (the Damerau distance, restricted): the distance check holds
    # fixed swapped pairs; the error-rate checks draw no pair where it matters, so they pass.
    "edit_distance_transposition": Mistake(
        18.5, {"test_edit_distance_matches_levenshtein"},
        {"test_edit_distance_matches_levenshtein": "swapping two neighbouring symbols as one edit"}, edits=(
            (CELL, CELL + "\n            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:"
                          "\n                current[j] = min(current[j], before[j - 2] + 1)"),
            ("        previous = current\n", "        before, previous = previous, current\n"))),
    # Part 3: PER as the average of the words' rates (the blind trial's 08_w06).
    "per_per_word": Mistake(18, RATES, _all(RATES, "averages each word's rate"), edits=(
        ("errors += distances[best]\n", "errors += distances[best] / len(alternatives[best])\n"),
        ("return errors / ref_len, wrong / len(hyps)", "return errors / len(hyps), wrong / len(hyps)"))),
    # Part 3: PER's distance to the closest alternative divided by the length of the FIRST one (the blind trial's
    # 08_w07); in the ties check the first alternative is one of the closest, so that check passes.
    "per_length_of_first_alternative": Mistake(18.5, {"test_error_rates_match_reference"},
                                               {"test_error_rates_match_reference":
                                                "divides by the length of each word's FIRST alternative"}, edits=(
        ("ref_len += len(alternatives[best])", "ref_len += len(alternatives[0])"),)),
    # Part 3: of two equally close alternatives, PER takes the last one's length (the blind trial's 08_w18): only the
    # ties check sees it; the other check's words have closest alternatives of one length, under every seed.
    "per_ties_take_the_last": Mistake(
        19.5, {"test_error_rates_ties_take_the_first_alternative"},
        {"test_error_rates_ties_take_the_first_alternative": "takes the last (or the longest) one"}, edits=(
            ("best = min(range(len(alternatives)), key=lambda k: distances[k])  # min keeps the first of ties",
             "best = max(range(len(alternatives)), key=lambda k: (-distances[k], k))"),)),
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
    # Part 4: the gradients clipped entry by entry, not by their total norm (the clipping check's clip is below the
    # largest entries); the same with a clamp.
    "clip_by_value": Mistake(19, {"test_train_step_sgd_step_with_clipping"},
                             {"test_train_step_sgd_step_with_clipping": "clipped entry by entry"}, edits=(
        (CLIP, CLIP.replace("clip_grad_norm_", "clip_grad_value_")),)),
    "clip_by_clamp": Mistake(19, {"test_train_step_sgd_step_with_clipping"},
                             {"test_train_step_sgd_step_with_clipping": "clipped entry by entry"}, edits=(
        (CLIP, "    for p in model.parameters():\n        p.grad.clamp_(-clip, clip)\n"),)),
    # Part 4, right: the total norm clipped by hand, without clip_grad_norm_'s 1e-6 in the denominator.
    "clip_by_hand_ok": Mistake(20, set(), edits=(
        (CLIP, "    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))\n"
               "    for p in model.parameters():\n        p.grad.mul_(min(1.0, clip / norm.item()))\n"),)),
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
        (NORMALISE, "finished.append((seq, logp))"),), one_hint=True),
    # Part 5: the length that normalises leaves EOS out: each check with alpha > 0 draws a model on which this differs
    # from no normalisation at all (in the beam-1 check, a greedy output of 3 tokens or more ending with EOS).
    "beam_length_without_eos": Mistake(16, BEAM_NORMALISED, _all(BEAM_NORMALISED, "leaves EOS out"), edits=(
        (NORMALISE, "finished.append((seq, logp / max(len(seq) - (seq[-1] == EOS), 1) ** alpha))"),), one_hint=True),
    "beam_unsorted": Mistake(16.5, BEAM_POLICY, _all(BEAM_POLICY, "not sorted best first"), edits=(
        ("    finished.sort(key=lambda pair: pair[1], reverse=True)\n", ""),), one_hint=True),
    "beam_too_many": Mistake(16.5, BEAM_POLICY, _all(BEAM_POLICY, "more than beam_size outputs"), edits=(
        ("return finished[:beam_size]", "return finished"),), one_hint=True),
    # Part 5, right: the log-probabilities computed in float32 (the log-softmax of the logits cast to float32, the
    # running totals in float32, the blind trial's 08_c3): the scores are right to float32's precision.
    "beam_float32_scores_ok": Mistake(20, set(), edits=(
        ("total = totals[:, None] + F.log_softmax(logits[:, -1], dim=-1)  # (n, V)",
         "total = totals[:, None] + F.log_softmax(logits[:, -1].float(), dim=-1)  # (n, V)"),)),
    # Part 5, right: pruning by the normalised score (the blind trial's 08_w11). The unfinished outputs of a step all
    # have the same length, so dividing their totals by one length ** alpha keeps the same beam_size best: the same
    # search as pruning by the total log-probability, as the spec says.
    "beam_prune_by_normalised_ok": Mistake(20, set(), edits=(
        ("top, idx = total.flatten().topk(min(beam_size, total.numel()))",
         "_, idx = (total / (step + 1) ** alpha).flatten().topk(min(beam_size, total.numel()))\n"
         "            top = total.flatten()[idx]"),)),
    "beam_ys_on_cpu": Mistake(19.5, {"test_beam_runs_on_any_device"},
                              {"test_beam_runs_on_any_device": "`beam_search` would fail on a GPU"}, edits=(
        ("dtype=torch.long, device=src.device)  # (n, t+1)", "dtype=torch.long)  # (n, t+1)"),)),
}
