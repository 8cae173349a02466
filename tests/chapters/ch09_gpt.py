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
TEMPERATURE = "test_sample_temperature_and_generator"
TOP_K = "test_sample_keeps_exactly_the_top_k"
TOP_P = "test_sample_keeps_the_token_that_crosses_top_p"
GREEDY = "test_generate_greedy_matches_recomputation"
FEEDS = "test_generate_feeds_one_position_a_step"
GENERATE = {GREEDY, FEEDS, "test_generate_samples_rows_in_order_with_the_generator", "test_generate_stops_at_max_len"}
# The model's mistakes that every check comparing the model with the reference sees (the cached one too).
MODEL = {BLOCK, LOGITS, CACHED, HF_LOGITS}
DROP_WEIGHTS = "test_attention_drops_its_weights"
SAMPLED = "test_generate_samples_rows_in_order_with_the_generator"

TIES = "best = min(pair for pair, n in pairs.items() if n == top)  # ties: the smallest pair"
# The reference's counting, kept up to date from merge to merge, and a learner's, recounted at every step.
COUNT_KEPT = ("    pairs = {}  # pair -> its count over the whole text\n"
              "    where = {}  # pair -> the indices of the chunks that hold it (or held it once)\n"
              "\n"
              "    def count(i, sign):\n"
              "        for pair in zip(chunks[i], chunks[i][1:]):\n"
              "            pairs[pair] = pairs.get(pair, 0) + sign * weights[i]\n"
              "            if pairs[pair] == 0:\n"
              "                del pairs[pair]\n"
              "            where.setdefault(pair, set()).add(i)\n"
              "\n"
              "    for i in range(len(chunks)):\n"
              "        count(i, +1)\n"
              "    merges = []\n"
              "    for new_id in range(256, vocab_size):\n"
              "        if not pairs:\n"
              "            break\n"
              "        top = max(pairs.values())\n"
              "        " + TIES + "\n"
              "        merges.append(best)\n"
              "        for i in where.pop(best):  # only the chunks that hold `best` change\n"
              "            count(i, -1)\n"
              "            chunks[i] = merge_pair(chunks[i], best, new_id)\n"
              "            count(i, +1)\n"
              "    return merges\n")
COUNT_EACH_STEP = ("    merges = []\n"
                   "    for new_id in range(256, vocab_size):\n"
                   "        pairs = {}  # pair -> its count, recounted at every step\n"
                   "        for ids, n in zip(chunks, weights):\n"
                   "            for pair in zip(ids, ids[1:]):\n"
                   "                pairs[pair] = pairs.get(pair, 0) + n\n"
                   "        if not pairs:\n"
                   "            break\n"
                   "        top = max(pairs.values())\n"
                   "        " + TIES + "\n"
                   "        merges.append(best)\n"
                   "        chunks = [merge_pair(ids, best, new_id) for ids in chunks]\n"
                   "    return merges\n")
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
SAMPLE_CHANGED = {"test_sample_is_greedy_at_temperature_zero", "test_generate_samples_rows_in_order_with_the_generator"}
CACHE_CHANGED = {CACHED, "test_generate_greedy_matches_recomputation"}
ROWS = "new = [sample(last[b], temperature, top_k, top_p, generator) for b in range(B)]"
SPLIT_HEADS = "q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))"
MERGE_HEADS = "y = (weights @ v).transpose(1, 2).reshape(B, T, d)"
TOP_K_MASK = KTH + '\n            logits = logits.masked_fill(logits < kth, float("-inf"))'
TEMPERATURE_STEP = "    logits = logits / temperature\n"
DRAW = "    return int(torch.multinomial(probs, 1, generator=generator))"
NUCLEUS_KEPT = "        probs = probs.masked_fill(~keep, 0.0)\n        probs = probs / probs.sum()\n"
STABLE_SORT = "sorted_probs, order = torch.sort(probs, descending=True, stable=True)"
EVAL = "    model.eval()\n    with torch.no_grad():"
RETURN_IDS = "    return torch.cat(out, dim=1)\n"


def _all(checks, words):
    return {c: words for c in checks}


MISTAKES = {
    # Part 1: encode merges the latest merge first; training and decoding are right.
    "encode_latest_merge_first": Mistake(18.5, {ENCODE}, {ENCODE: "LATEST merges first"}, edits=(
        (RANK, "pair = max(zip(part, part[1:]), key=lambda p: rank.get(p, -1))"),)),
    # Part 1: ties go to the largest pair.
    "ties_to_the_largest_pair": Mistake(17, TRAIN, _all(TRAIN, "LARGEST pair"), edits=(
        (TIES, TIES.replace("min(", "max(")),), one_hint=True),
    # Part 1, right: the pairs recounted at every step (slower than the reference, as right): full marks.
    "train_bpe_recounts_every_step": Mistake(20, set(), {}, edits=((COUNT_KEPT, COUNT_EACH_STEP),)),
    # Part 1: ties broken by the first id only (the smallest a, then the pair counted first), a learner's
    # max(pairs, key=lambda pair: (pairs[pair], -pair[0])).
    "ties_by_the_first_id_only": Mistake(17, TRAIN, _all(TRAIN, "ties by the first id a only"), edits=(
        (COUNT_KEPT, COUNT_EACH_STEP.replace(
            TIES, "best = max(pairs, key=lambda pair: (pairs[pair], -pair[0]))  # ties: the smallest a")),),
        one_hint=True),
    # The same with the running counts (a pair whose count falls to 0 is deleted, and comes back last): the random
    # short texts of the ties check showed it on 6 seeds in 8. Its text of one repeated word (`_ties_case`) shows it at
    # the first merge, where every way of counting meets the pairs in the same order, on every seed; and so it shows
    # ties to the smallest a, then to the pair met last.
    "ties_by_the_first_id_running_counts": Mistake(17, TRAIN, _all(TRAIN, "ties by the first id a only"), edits=(
        (TIES, "best = max(pairs, key=lambda pair: (pairs[pair], -pair[0]))  # ties: the smallest a"),)),
    "ties_by_the_first_id_then_the_last_pair": Mistake(17, TRAIN, _all(TRAIN, "ties by the first id a only"), edits=(
        (TIES, "tops = [pair for pair, n in pairs.items() if n == top]\n"
               "        best = [p for p in tops if p[0] == min(q[0] for q in tops)][-1]  # ties: the smallest a"),)),
    # Part 1: overlapping pairs counted once per run.
    "no_overlapping_counts": Mistake(17, TRAIN, _all(TRAIN, "does not count overlapping pairs"), edits=(
        (COUNT, COUNT_NO_OVERLAP),), one_hint=True),
    # Part 1: the merge goes on at i + 1, replacing overlapping occurrences and keeping the pair's second id:
    # training, its early stop, encoding (which merges the same way) and the round trip all go wrong.
    "merge_replaces_overlaps": Mistake(14.5, TRAIN | {ENCODE, "test_train_bpe_stops_and_rejects_small_vocabularies",
                                                      "test_decode_round_trips_and_checks_ids"},
                                       _all(TRAIN | {ENCODE}, "continue at i + 2"), edits=(
        (MERGE_STEP, MERGE_STEP.replace("i += 2", "i += 1")),)),
    # Part 1: merge_pair left as the stub, the merging written inline in train_bpe and encode.
    "merge_pair_left_unwritten": Mistake(19, {"test_train_bpe_ties_and_overlapping_pairs"},
                                         {"test_train_bpe_ties_and_overlapping_pairs": "merge_pair"}, edits=(
        ("def merge_pair(ids, pair, new_id):", "def _merged(ids, pair, new_id):"),
        ("def train_bpe(data, vocab_size):",
         "def merge_pair(ids, pair, new_id):\n    raise NotImplementedError\n\n\ndef train_bpe(data, vocab_size):"),
        ("merge_pair(chunks[i], best, new_id)", "_merged(chunks[i], best, new_id)"),
        ("merge_pair(part, pair, 256 + rank[pair])", "_merged(part, pair, 256 + rank[pair])"))),
    # Part 1: invalid UTF-8 raises.
    "decode_raises_on_invalid_utf8": Mistake(
        19.5, {"test_decode_replaces_invalid_utf8"}, {"test_decode_replaces_invalid_utf8": "raises UnicodeDecodeError"},
        edits=((DECODE, 'return b"".join(pieces).decode("utf-8")'),)),
    # Part 2: post-LN blocks.
    "post_ln": Mistake(15.5, MODEL, {BLOCK: "post-LN", LOGITS: "post-LN", HF_LOGITS: "post-LN"}, edits=(
        (PRE_LN, POST_LN),)),
    # Part 2: the exact GELU instead of GPT-2's tanh approximation.
    "exact_gelu": Mistake(15.5, MODEL, {BLOCK: "exact GELU", LOGITS: "exact GELU", HF_LOGITS: "exact GELU"}, edits=(
        ('act=nn.GELU(approximate="tanh"),', "act=nn.GELU(),"),)),
    # Part 2: no causal mask at all.
    "no_causal_mask": Mistake(12.5, MODEL | {ATTN} | GENERATE, _all(MODEL | {ATTN} - {HF_LOGITS}, "not causal")
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
    # Part 2: the heads split by a reshape straight to (B, H, T, d / H), without the transpose: right for one token
    # (generation's steps), wrong for several; the model's checks name it, generation's say to fix the model.
    "heads_split_without_transpose": Mistake(
        12.5, MODEL | {ATTN} | GENERATE, _all(MODEL | {ATTN}, "split without the transpose")
        | _all(GENERATE, "fix the model first"), edits=(
            (SPLIT_HEADS, "q, k, v = (t.reshape(B, H, T, d // H) for t in (q, k, v))"),)),
    # Part 2: the heads merged back by a reshape without the transpose.
    "heads_merged_without_transpose": Mistake(
        12.5, MODEL | {ATTN} | GENERATE, _all(MODEL | {ATTN}, "merged back without the transpose")
        | _all(GENERATE, "fix the model first"), edits=(
            (MERGE_HEADS, "y = (weights @ v).reshape(B, T, d)"),)),
    # Part 2: every LayerNorm with eps 1e-6.
    "layer_norm_eps": Mistake(15.5, MODEL, _all(MODEL, "another eps"), edits=(
        ("nn.LayerNorm(d_model)", "nn.LayerNorm(d_model, eps=1e-6)"),)),
    # Part 2: the attention's dropout on its output (after proj) instead of its weights: with p = 1 the output is
    # zero, not proj's bias.
    "attention_dropout_on_the_output": Mistake(19.5, {DROP_WEIGHTS}, {DROP_WEIGHTS: "after proj"}, edits=(
        ("weights = self.drop(F.softmax(scores, dim=-1))", "weights = F.softmax(scores, dim=-1)"),
        ("return self.proj(y), (k, v)", "return self.drop(self.proj(y)), (k, v)"))),
    # Part 2: the attention's dropout on weights @ v, before proj: the same as on the weights for p = 0 or 1, but
    # for 0 < p < 1 it zeroes single numbers of a token's mix, not whole value rows.
    "attention_dropout_after_weights_at_v": Mistake(19.5, {DROP_WEIGHTS}, {DROP_WEIGHTS: "after weights @ v"}, edits=(
        ("weights = self.drop(F.softmax(scores, dim=-1))", "weights = F.softmax(scores, dim=-1)"),
        (MERGE_HEADS, "y = self.drop((weights @ v).transpose(1, 2).reshape(B, T, d))"))),
    # Part 2, right: the attention and its dropout by F.scaled_dot_product_attention (dropout_p in training mode),
    # whose random draws are not nn.Dropout's: full marks.
    "attention_by_sdpa_with_dropout": Mistake(20, set(), {}, edits=(
        ('        scores = q @ k.transpose(-2, -1) / math.sqrt(d // H)  # (B, H, T, T_past + T)\n', ""),
        ("        allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)\n"
         '        scores = scores.masked_fill(~allowed, float("-inf"))\n'
         "        weights = self.drop(F.softmax(scores, dim=-1))\n",
         "        allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)\n"),
        (MERGE_HEADS, "y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, "
                      "dropout_p=self.drop.p if self.training else 0.0).transpose(1, 2).reshape(B, T, d)"))),
    # Part 2: the MLP branch not dropped (charged to the block only, not again to the GPT).
    "mlp_branch_not_dropped": Mistake(19, {BLOCK}, {BLOCK: "not on both residual branches"}, edits=(
        ("x = x + self.drop(self.mlp(self.ln2(x)))", "x = x + self.mlp(self.ln2(x))"),)),
    # Part 2: no dropout on the sum of the embeddings.
    "no_embedding_dropout": Mistake(18.5, {LOGITS}, {LOGITS: "not on the sum of the embeddings"}, edits=(
        ("x = self.drop(self.tok(ids) + self.pos(positions))", "x = self.tok(ids) + self.pos(positions)"),)),
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
    # Part 4: a negative temperature accepted (the distribution reversed) instead of a ValueError.
    "negative_temperature_accepted": Mistake(19.5, {TEMPERATURE}, {TEMPERATURE: "negative temperature"}, edits=(
        ('    if temperature < 0:\n        raise ValueError(f"temperature must be 0 or more, got {temperature}")\n',
         ""),)),
    # Part 4: top-k and top-p on the raw logits, the temperature only on what they kept: top-k alone is the same
    # (a positive temperature keeps the order), but top-p's nucleus depends on the temperature.
    "filters_before_temperature": Mistake(19.5, {TEMPERATURE}, {TEMPERATURE: "before the temperature"}, edits=(
        (TEMPERATURE_STEP, ""),
        (NUCLEUS_KEPT, '        logits = logits.masked_fill(~keep, float("-inf"))\n'),
        (DRAW, "    probs = F.softmax(logits / temperature, dim=-1)\n" + DRAW))),
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
    # Part 4: top-k keeps exactly k indices (torch.topk's), dropping the logits tied with the k-th largest.
    "top_k_drops_ties": Mistake(19, {TOP_K}, {TOP_K: "tied with the k-th largest"}, edits=(
        (TOP_K_MASK, "idx = torch.topk(logits, top_k).indices\n"
                     '            logits = torch.full_like(logits, float("-inf")).scatter(0, idx, logits[idx])'),)),
    # Part 4: top_k = 0 taken for "no top-k" instead of a ValueError.
    "top_k_zero_accepted": Mistake(19, {TOP_K}, {TOP_K: "top_k < 1"}, edits=(
        ('        if top_k < 1:\n            raise ValueError(f"top_k must be at least 1, got {top_k}")\n', ""),
        ("    if top_k is not None:\n", "    if top_k:\n"))),
    # Part 4: top-p on the whole distribution, top-k applied to what it kept afterwards.
    "top_p_before_top_k": Mistake(19, {TOP_P}, {TOP_P: "applies top_p before top_k"}, edits=(
        (TEMPERATURE_STEP, TEMPERATURE_STEP + "    k_out = torch.zeros_like(logits, dtype=torch.bool)\n"),
        ('logits = logits.masked_fill(logits < kth, float("-inf"))', "k_out = logits < kth"),
        (DRAW, "    probs = probs.masked_fill(k_out, 0.0)\n" + DRAW))),
    # Part 4: ties of top-p's sort go to the highest ids (a descending order made by flipping an ascending one).
    "top_p_ties_highest_ids_first": Mistake(19, {TOP_P}, {TOP_P: "wrong tokens among equally likely ones"}, edits=(
        (STABLE_SORT, "sorted_probs, order = torch.sort(probs, stable=True)\n"
                      "        sorted_probs, order = sorted_probs.flip(0), order.flip(0)"),)),
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
    # Part 4: the caller's logits divided in place (right draws): the first check of each part that sees it
    # loses its points, here one of sampling's and one of generation's, whose check calls sample itself
    # (every exercise's rule: a function leaves its arguments as they were).
    "sample_divides_the_callers_logits": Mistake(19, SAMPLE_CHANGED, _all(SAMPLE_CHANGED, "changed its argument `logits`"),
                                                 edits=((TEMPERATURE_STEP, "    logits /= temperature\n"),)),
    # Part 2: the model fills the cache list it was given instead of a new one (right logits and caches): the
    # first check of each part that passes it caches loses its points (the model's, and generation's).
    "forward_fills_the_callers_caches": Mistake(
        18.5, CACHE_CHANGED, _all(CACHE_CHANGED, "changed its argument `caches`"), edits=(
            ("        new_caches = []\n", "        new_caches = caches if caches else []\n"),
            ("            new_caches.append(cache)\n",
             "            if caches:\n                new_caches[i] = cache\n            else:\n"
             "                new_caches.append(cache)\n"))),
    # Part 5: generate calls sample without its top_k and top_p (the temperature and the generator passed on).
    "generate_drops_top_k_and_top_p": Mistake(19.5, {SAMPLED}, {SAMPLED: "does not pass its top_k and top_p"}, edits=(
        (ROWS, "new = [sample(last[b], temperature, generator=generator) for b in range(B)]"),)),
    # Part 5: no model.eval(): dropout stays on.
    "generate_in_train_mode": Mistake(19.5, {GREEDY}, {GREEDY: "runs the model in training mode"}, edits=(
        ("    model.eval()\n", ""),)),
    # Part 5, right: the caller's mode restored after generating in eval mode, full marks.
    "generate_restores_the_callers_mode": Mistake(20, set(), {}, edits=(
        (EVAL, "    was = model.training\n" + EVAL), (RETURN_IDS, "    model.train(was)\n" + RETURN_IDS))),
    # Part 5, right: the model called with its ids and caches by name, full marks (the checks note the calls
    # however they are written).
    "generate_calls_the_model_by_keyword": Mistake(20, set(), {}, edits=(
        ("logits, caches = model(ids)  # the prompts, once", "logits, caches = model(ids=ids)  # the prompts, once"),
        ("logits, caches = model(out[-1], caches)", "logits, caches = model(ids=out[-1], caches=caches)"))),
    # Part 5: model.train() at the end, whatever the mode the model came in.
    "generate_ends_in_train_mode": Mistake(19.5, {FEEDS}, {FEEDS: "into training mode"}, edits=(
        (RETURN_IDS, "    model.train()\n" + RETURN_IDS),)),
    # Part 5: the whole prefix fed at every step, without the caches: the same tokens, one step's cost each time.
    "generate_feeds_the_whole_prefix": Mistake(19.5, {FEEDS}, {FEEDS: "not the whole prefix"}, edits=(
        ("            if step > 0:\n                logits, caches = model(out[-1], caches)",
         "            if step > 0:\n                logits, caches = model(torch.cat(out, dim=1))"),)),
    # Part 5: no torch.no_grad(): the model runs with gradients on.
    "generate_with_gradients": Mistake(19.5, {FEEDS}, {FEEDS: "gradients on"}, edits=(
        ("    with torch.no_grad():\n        out = [ids]", "    if True:\n        out = [ids]"),)),
}
