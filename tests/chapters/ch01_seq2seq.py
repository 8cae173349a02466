"""Exercise 01_seq2seq: typical mistakes and what they must cost."""

from chapters import Mistake

KEY = "01_seq2seq"
ENCODER = {"test_encoder_matches_reference", "test_encoder_final_is_last_state", "test_encoder_gradients",
           "test_encoder_half_precision"}
BEAM_VALUES = {"test_beam_matches_exhaustive_search", "test_beam_scores_are_log_probabilities",
               "test_beam_returns_sorted_finished_outputs", "test_beam_matches_reference",
               "test_beam_runs_on_any_device"}
GREEDY_BOS = "y = torch.full((src.size(0),), sos, dtype=torch.long, device=src.device)  # (B,)"
BEAM_BOS = "y = torch.full((1,), sos, dtype=torch.long, device=src.device)  # (n,)"

MISTAKES = {
    # Teacher forcing feeds the token it should predict.
    "tf_current": Mistake(
        17, {"test_seq2seq_teacher_forcing_matches_reference", "test_seq2seq_default_is_deterministic_and_differentiable",
             "test_seq2seq_mixed_ratio_decides_per_step"},
        {"test_seq2seq_teacher_forcing_matches_reference": "CURRENT target token tgt[:, t]"},
        edits=(("y_prev = tgt[:, t - 1] if teacher", "y_prev = tgt[:, t] if teacher"),), one_hint=True),
    # Another random generator for the teacher-forcing draw (the master's random.random() is an example): one
    # draw per step for the whole batch is all the checks ask, so it loses nothing.
    "tf_torch_draw_ok": Mistake(
        20, set(), edits=(("teacher = random.random() < teacher_forcing_ratio",
                           "teacher = float(torch.rand(())) < teacher_forcing_ratio"),)),
    # Greedy decoding keeps writing argmax tokens after a row's eos.
    "greedy_no_pad": Mistake(
        16.5, {"test_greedy_matches_reference", "test_greedy_pads_after_eos", "test_greedy_honours_sos_eos_pad",
               "test_greedy_runs_on_any_device"},
        {"test_greedy_pads_after_eos": "must hold `pad`"},
        edits=(("y = logits.argmax(dim=-1).masked_fill(finished, pad)  # (B,)", "y = logits.argmax(dim=-1)  # (B,)"),),
        one_hint=True),
    # Greedy decoding creates its start tokens on the CPU: it fails on a GPU, and only there.
    "greedy_device": Mistake(
        19.5, {"test_greedy_runs_on_any_device"},
        {"test_greedy_runs_on_any_device": "`greedy_decode` would fail on a GPU"},
        edits=((GREEDY_BOS, GREEDY_BOS.replace(", device=src.device", "")),)),
    # Beam search ranks by summed raw logits instead of log-probabilities.
    "beam_logits": Mistake(
        15, BEAM_VALUES, {"test_beam_scores_are_log_probabilities": "raw logits"},
        edits=(("total = scores.unsqueeze(1) + F.log_softmax(logits, dim=-1)", "total = scores.unsqueeze(1) + logits"),),
        one_hint=True),
    # Beam search refills the beam with the next-best unfinished extensions: only the check that
    # targets the beam policy sees it (the others draw models on which the policies agree).
    "beam_refill": Mistake(
        19, {"test_beam_matches_reference"}, {"test_beam_matches_reference": "NOT replaced"},
        edits=(("top, idx = total.flatten().topk(min(beam_size, total.numel()))",
                "top, idx = total.flatten().sort(descending=True)"),
               ("        for score, b, tok in zip(top.tolist(), beams.tolist(), toks.tolist()):\n"
                "            seq = seqs[b] + [tok]\n"
                "            if tok == eos or step == max_len - 1:\n"
                "                finished.append((seq, score))",
                "        for rank, (score, b, tok) in enumerate(zip(top.tolist(), beams.tolist(), toks.tolist())):\n"
                "            if len(keep) == beam_size:\n"
                "                break\n"
                "            seq = seqs[b] + [tok]\n"
                "            if tok == eos or step == max_len - 1:\n"
                "                if rank < beam_size:\n"
                "                    finished.append((seq, score))")),
        one_hint=True),
    # Beam search starts from beam_size copies of the start hypothesis: duplicated outputs.
    "beam_copies": Mistake(
        15, BEAM_VALUES, {"test_beam_matches_reference": "ONE hypothesis"},
        edits=(("hidden = context  # (n, D)", "hidden = context.expand(beam_size, -1)  # (n, D)"),
               ("seqs = [[]]", "seqs = [[] for _ in range(beam_size)]"),
               ("scores = context.new_zeros(1)", "scores = context.new_zeros(beam_size)"),
               (BEAM_BOS, BEAM_BOS.replace("(1,)", "(beam_size,)"))),
        one_hint=True),
    # Beam search creates its start token on the CPU.
    "beam_device": Mistake(
        19.5, {"test_beam_runs_on_any_device"}, {"test_beam_runs_on_any_device": "`beam_search` would fail on a GPU"},
        edits=((BEAM_BOS, BEAM_BOS.replace(", device=src.device", "")),)),
    # The context is the state after the first source token; the later parts, graded with the
    # learner's own modules, lose nothing for it.
    "enc_first": Mistake(
        17, ENCODER, {"test_encoder_matches_reference": "after the FIRST source token"},
        edits=(("return outputs, h_n[-1]  # (B, S, D), (B, D)", "return outputs, outputs[:, 0]"),), one_hint=True),
    # The encoder's initial state is created on the CPU: its own device check fails, and the later
    # parts' device checks say to fix parts 1 and 2 first.
    "enc_device": Mistake(
        17, {"test_encoder_matches_reference", "test_seq2seq_teacher_forcing_matches_reference",
             "test_greedy_runs_on_any_device", "test_beam_runs_on_any_device"},
        {"test_encoder_matches_reference": "`Encoder` would fail on a GPU",
         "test_greedy_runs_on_any_device": "fix parts 1 and 2 first"},
        edits=(("outputs, h_n = self.rnn(self.embedding(src))",
                "emb = self.embedding(src)\n"
                "        h0 = torch.zeros(1, src.size(0), self.rnn.hidden_size, dtype=emb.dtype)\n"
                "        outputs, h_n = self.rnn(emb, h0)"),)),
}
