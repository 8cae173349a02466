"""Exercise 09_gpt: typical mistakes of the byte-level BPE, GPT-2's block and model, the loader of
`transformers`' weights, the sampler and generation with the cache, each with its score, the checks it
loses and their hints."""

from chapters import Mistake

KEY = "09_gpt"
TRAIN = {"test_train_bpe_matches_reference", "test_train_bpe_ties_and_overlapping_pairs"}
ENCODE = "test_encode_matches_reference"
BLOCK = "test_block_matches_reference"
ATTN = "test_attention_with_a_cache_of_several_tokens"
LOGITS = "test_gpt_logits_match_reference"
CACHED = "test_gpt_with_caches_continues_the_positions"
HF = {"test_load_hf_gpt2_copies_every_weight", "test_load_hf_gpt2_logits_match_transformers",
      "test_load_hf_gpt2_rejects_missing_and_misshapen_keys"}
HF_LOGITS = "test_load_hf_gpt2_logits_match_transformers"
TOP_K = "test_sample_keeps_exactly_the_top_k"
TOP_P = "test_sample_keeps_the_token_that_crosses_top_p"
GENERATE = {"test_generate_greedy_matches_recomputation", "test_generate_samples_rows_in_order_with_the_generator",
            "test_generate_stops_at_max_len"}
# The model's mistakes that every check comparing the model with the reference sees (the cached one too).
MODEL = {BLOCK, LOGITS, CACHED, HF_LOGITS}

TIES = "best = min(pair for pair, n in pairs.items() if n == top)  # ties: the smallest pair"
COUNT = ("        for pair in zip(chunks[i], chunks[i][1:]):\n"
         "            pairs[pair] = pairs.get(pair, 0) + sign * weights[i]\n")
# Counting without overlap: a run a a a counts (a, a) once, a a a a twice.
COUNT_NO_OVERLAP = ("        ids, j = chunks[i], 0\n"
                    "        while j + 1 < len(ids):\n"
                    "            pair = (ids[j], ids[j + 1])\n"
                    "            j += 2 if ids[j] == ids[j + 1] and j + 2 < len(ids) and ids[j + 2] == ids[j] else 1\n"
                    "            pairs[pair] = pairs.get(pair, 0) + sign * weights[i]\n")
MERGE_STEP = "            out.append(new_id)\n            i += 2\n"
RANK = "pair = min(zip(part, part[1:]), key=lambda p: rank.get(p, len(merges)))"
DECODE = 'return b"".join(pieces).decode("utf-8", errors="replace")'
NUCLEUS = "keep_sorted = before < top_p  # the token that crosses top_p has less than top_p before it"
KTH = "kth = torch.topk(logits, top_k).values[-1]  # the k-th largest logit"
TRANSPOSE = "value = hf_state_dict[key].t() if transpose else hf_state_dict[key]"
POSITIONS = "positions = torch.arange(past, past + T, device=ids.device)  # (T,)"
ALLOWED = "allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)"
PRE_LN = ("        a, cache = self.attn(self.ln1(x), cache)\n"
          "        x = x + self.drop(a)\n"
          "        x = x + self.drop(self.mlp(self.ln2(x)))\n")
POST_LN = ("        a, cache = self.attn(x, cache)\n"
           "        x = self.ln1(x + self.drop(a))\n"
           "        x = self.ln2(x + self.drop(self.mlp(x)))\n")
RESIDUAL_INIT = ("        for block in self.blocks:  # the residual projections, scaled by depth\n"
                 "            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))\n"
                 "            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))\n")
ROWS = "new = [sample(last[b], temperature, top_k, top_p, generator) for b in range(B)]"


def _all(checks, words):
    return {c: words for c in checks}


MISTAKES = {
    # Part 1: encode merges the latest merge first; training and decoding are right.
    "encode_latest_merge_first": Mistake(18.5, {ENCODE}, {ENCODE: "LATEST merges first"}, edits=(
        (RANK, "pair = max(zip(part, part[1:]), key=lambda p: rank.get(p, -1))"),)),
    # Part 1: ties go to the largest pair.
    "ties_to_the_largest_pair": Mistake(17, TRAIN, _all(TRAIN, "LARGEST pair"), edits=(
        (TIES, TIES.replace("min(", "max(")),), one_hint=True),
    # Part 1: overlapping pairs counted once per run.
    "no_overlapping_counts": Mistake(17, TRAIN, _all(TRAIN, "does not count overlapping pairs"), edits=(
        (COUNT, COUNT_NO_OVERLAP),), one_hint=True),
    # Part 1: the merge goes on at i + 1, replacing overlapping occurrences and keeping the pair's second id:
    # training, its early stop, encoding (which merges the same way) and the round trip all go wrong.
    "merge_replaces_overlaps": Mistake(14.5, TRAIN | {ENCODE, "test_train_bpe_stops_and_rejects_small_vocabularies",
                                                      "test_decode_round_trips_and_checks_ids"},
                                       _all(TRAIN | {ENCODE}, "continue at i + 2"), edits=(
        (MERGE_STEP, MERGE_STEP.replace("i += 2", "i += 1")),)),
    # Part 1: invalid UTF-8 raises.
    "decode_raises_on_invalid_utf8": Mistake(
        19.5, {"test_decode_replaces_invalid_utf8"}, {"test_decode_replaces_invalid_utf8": "raises UnicodeDecodeError"},
        edits=((DECODE, 'return b"".join(pieces).decode("utf-8")'),)),
    # Part 2: post-LN blocks.
    "post_ln": Mistake(15, MODEL, {BLOCK: "post-LN", LOGITS: "post-LN", HF_LOGITS: "post-LN"}, edits=(
        (PRE_LN, POST_LN),)),
    # Part 2: the exact GELU instead of GPT-2's tanh approximation.
    "exact_gelu": Mistake(15, MODEL, {BLOCK: "exact GELU", LOGITS: "exact GELU", HF_LOGITS: "exact GELU"}, edits=(
        ('act=nn.GELU(approximate="tanh"),', "act=nn.GELU(),"),)),
    # Part 2: no causal mask at all.
    "no_causal_mask": Mistake(12, MODEL | {ATTN} | GENERATE, _all(MODEL | {ATTN} - {HF_LOGITS}, "not causal")
                              | {HF_LOGITS: "fix part 2 first"} | _all(GENERATE, "fix the model first"), edits=(
        ('        scores = scores.masked_fill(~allowed, float("-inf"))\n', ""),)),
    # Part 2: a causal mask that ignores the cache: fine without a cache, wrong for every token fed with one.
    "mask_not_offset": Mistake(16, {ATTN, CACHED} | GENERATE,
                               _all({ATTN, CACHED}, "ignores the cache") | _all(GENERATE, "fix the model first"),
                               edits=(
        (ALLOWED, ALLOWED.replace(".tril(diagonal=past)", ".tril()")),)),
    # Part 2: positions restart at 0 with a cache; generation, which feeds tokens with the cache, goes wrong.
    "positions_not_offset": Mistake(17, {CACHED} | GENERATE,
                                    {CACHED: "do not continue after the cache"} | _all(GENERATE, "fix the model first"),
                                    edits=((POSITIONS, "positions = torch.arange(T, device=ids.device)  # (T,)"),)),
    # Part 2: the head is a second parameter: right once weights are loaded from a state dict that holds both,
    # wrong after loading GPT-2's, whose lm_head is wte.
    "untied_head": Mistake(18.5, {"test_gpt_has_the_locked_parameters_and_a_tied_head", HF_LOGITS},
                           {"test_gpt_has_the_locked_parameters_and_a_tied_head": "not tied",
                            HF_LOGITS: "not tied to tok"}, edits=(
        ("        self.head.weight = self.tok.weight  # tied: one parameter\n", ""),)),
    # Part 2: the residual projections drawn as the other weights.
    "residual_init_not_scaled": Mistake(19.5, {"test_gpt_initialisation_is_gpt2s"},
                                        {"test_gpt_initialisation_is_gpt2s": "not scaled by depth"},
                                        edits=((RESIDUAL_INIT, ""),)),
    # Part 3: Conv1D weights copied as they are: the shapes do not fit, and every check of the part fails.
    "conv1d_not_transposed": Mistake(17, HF, _all(HF, "transpose"), edits=(
        (TRANSPOSE, "value = hf_state_dict[key]"),), one_hint=True),
    # Part 4: the temperature divides the probabilities, which renormalising undoes.
    "temperature_after_softmax": Mistake(19, {"test_sample_is_greedy_at_temperature_zero",
                                              "test_sample_temperature_and_generator"},
                                         {"test_sample_is_greedy_at_temperature_zero": "divide the LOGITS",
                                          "test_sample_temperature_and_generator": "no effect"}, edits=(
        ("    logits = logits / temperature\n", ""),
        ("    probs = F.softmax(logits, dim=-1)\n", "    probs = F.softmax(logits, dim=-1) / temperature\n"))),
    # Part 4: top-k keeps one token more.
    "top_k_plus_one": Mistake(19, {TOP_K}, {TOP_K: "keeps top_k + 1"}, edits=(
        (KTH, "kth = torch.topk(logits, min(top_k + 1, logits.numel())).values[-1]"),)),
    # Part 4: top-k keeps one token fewer.
    "top_k_minus_one": Mistake(19, {TOP_K}, {TOP_K: "keeps only top_k - 1"}, edits=(
        (KTH, "kth = torch.topk(logits, max(top_k - 1, 1)).values[-1]"),)),
    # Part 4: the token that crosses top_p is dropped.
    "top_p_drops_the_crossing_token": Mistake(19, {TOP_P}, {TOP_P: "drops the token that crosses top_p"}, edits=(
        (NUCLEUS, "keep_sorted = cumulative < top_p"),)),
    # Part 4, right: the mass before each token as cumsum - probs (a form several codebases use), full marks.
    "top_p_mass_before_by_subtraction": Mistake(20, set(), {}, edits=(
        ("before = torch.cat([cumulative.new_zeros(1), cumulative[:-1]])", "before = cumulative - sorted_probs"),)),
    # Part 4: the generator is not used: draws from the global generator.
    "sample_ignores_the_generator": Mistake(
        19, {"test_sample_temperature_and_generator", "test_generate_samples_rows_in_order_with_the_generator"},
        {"test_sample_temperature_and_generator": "does not draw from `generator`",
         "test_generate_samples_rows_in_order_with_the_generator": "fix sample first"}, edits=(
            ("return int(torch.multinomial(probs, 1, generator=generator))",
             "return int(torch.multinomial(probs, 1))"),)),
    # Part 5: the rows drawn last to first.
    "generate_rows_reversed": Mistake(
        19.5, {"test_generate_samples_rows_in_order_with_the_generator"},
        {"test_generate_samples_rows_in_order_with_the_generator": "draws the rows in another order"}, edits=(
            (ROWS, ROWS.replace("for b in range(B)]", "for b in reversed(range(B))][::-1]")),)),
    # Part 5: no model.eval(): dropout stays on.
    "generate_in_train_mode": Mistake(
        19, {"test_generate_greedy_matches_recomputation"},
        {"test_generate_greedy_matches_recomputation": "training mode"}, edits=(("    model.eval()\n", ""),)),
}
