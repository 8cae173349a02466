"""Exercise 07_efficient_attention: typical mistakes of the online softmax, tiled attention, the
sliding-window mask and linear attention, each with its score, lost checks and hints."""

from chapters import Mistake

KEY = "07_efficient_attention"
OS = {"test_online_softmax_matches_softmax", "test_online_softmax_extreme_scores",
      "test_online_softmax_dtypes_and_devices"}
TILED_VALUES = {"test_tiled_attention_matches_exact", "test_tiled_attention_causal",
                "test_tiled_attention_dtypes_and_devices", "test_tiled_attention_causal_skips_future_blocks"}
CAUSAL = {"test_tiled_attention_causal", "test_tiled_attention_dtypes_and_devices",
          "test_tiled_attention_causal_skips_future_blocks"}
SKIPS = "test_tiled_attention_causal_skips_future_blocks"
BY_BLOCK = "test_tiled_attention_reads_keys_by_block"
MEMORY = "test_tiled_attention_memory"
WINDOW = {"test_sliding_window_mask_matches_definition", "test_sliding_window_mask_refuses_empty_window",
          "test_sliding_window_mask_device"}
LINEAR = {"test_linear_attention_matches_reference", "test_linear_attention_causal",
          "test_linear_attention_dtypes_and_devices"}
LINEAR_CAUSAL = {"test_linear_attention_causal", "test_linear_attention_dtypes_and_devices"}
SKIP = "if causal and j0 > i0:"
SKIP_BLOCK = ("            if causal and j0 > i0:\n"
              "                break  # this key block and all later ones lie wholly above the diagonal\n")
DIAGONAL = ("            if causal and j0 == i0:\n"
            "                # The diagonal block: key j0 + c is in the future of query i0 + r when c > r.\n"
            "                future = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=q.device).triu(1)\n")
# Every key block read, the future masked in each: right values, but the blocks above the diagonal are not skipped.
MASK_EVERY_BLOCK = ("            if causal:\n"
                    "                future = (torch.arange(j0, j1, device=q.device)[None, :]\n"
                    "                          > torch.arange(i0, i1, device=q.device)[:, None])\n")

# A tiled_attention that builds the whole score matrix: right values, causal as is_causal=True.
NAIVE = ("    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Lq, Lk)\n"
         "    if causal:\n"
         "        future = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).triu(1)\n"
         "        scores = scores.masked_fill(future, -math.inf)\n"
         "    return torch.softmax(scores, dim=-1) @ v\n")

# Plain softmax over all the keys, a block of queries at a time: right values in little memory (a 512 x 16384 block of
# scores is 32 MiB), and the keys of a causal block sliced up to its last query, so no future key block is read.
QUERY_BLOCK = "        qb = q[..., i0:i1, :]  # (..., nq, d)\n"
ALL_KEYS = ("        keys = min(i1, Lk) if causal else Lk  # the keys this query block may see\n"
            "        scores = qb @ kT[..., :keys]  # (..., nq, keys)\n"
            "        if causal:\n"
            "            future = torch.ones(i1 - i0, keys, dtype=torch.bool, device=q.device).triu(i0 + 1)\n"
            "            scores = scores.masked_fill(future, -math.inf)\n")
PLAIN_SOFTMAX = QUERY_BLOCK + ALL_KEYS + ("        out.append(torch.softmax(scores, dim=-1) @ v[..., :keys, :])\n"
                                          "        continue\n")
# the same, its softmax written out: the maximum and the sum taken over all the keys at once
PLAIN_EXP = QUERY_BLOCK + ALL_KEYS + ("        p = (scores - scores.amax(dim=-1, keepdim=True)).exp_()\n"
                                      "        out.append((p @ v[..., :keys, :]) / p.sum(dim=-1, keepdim=True))\n"
                                      "        continue\n")
RUNNING_OUT = "        o = q.new_zeros((*batch, i1 - i0, v.size(-1)))  # (..., nq, d_v) running output\n"
UPDATE = ("            # Every row has a finite score in its first key block (key 0 is never masked), "
          "so m_new is finite.\n"
          "            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
          "            alpha = torch.exp(m - m_new)  # (..., nq, 1) rescales what was summed under the old maximum\n"
          "            p = torch.exp(scores - m_new)  # (..., nq, nk)\n"
          "            s = s * alpha + p.sum(dim=-1, keepdim=True)\n"
          "            o = o * alpha + p @ v[..., j0:j1, :]\n"
          "            m = m_new\n")
# The key blocks' scores kept and concatenated, then one softmax over them all.
CONCATENATED = ((RUNNING_OUT, RUNNING_OUT + "        parts = []\n"), (UPDATE, "            parts.append(scores)\n"),
                ("        out.append(o / s)\n",
                 "        scores = torch.cat(parts, dim=-1)  # (..., nq, keys read)\n"
                 "        del parts\n"
                 "        out.append(torch.softmax(scores, dim=-1) @ v[..., :scores.size(-1), :])\n"))
# Two passes over the keys: the running maximum and sum first, then the outputs with the final ones (every score
# computed twice, every key read twice).
TWO_PASSES = (("            o = o * alpha + p @ v[..., j0:j1, :]\n", ""),
              ("        out.append(o / s)\n",
               "        for j0 in range(0, Lk, block_size):\n"
               "            if causal and j0 > i0:\n"
               "                break\n"
               "            j1 = min(j0 + block_size, Lk)\n"
               "            scores = qb @ kT[..., j0:j1]\n"
               "            if causal and j0 == i0:\n"
               "                future = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=q.device).triu(1)\n"
               "                scores = scores.masked_fill(future, -math.inf)\n"
               "            o = o + torch.exp(scores - m) @ v[..., j0:j1, :]\n"
               "        out.append(o / s)\n"))
# A correct online softmax written another way: each key block's softmax merged into the running one through the
# log-sum-exps (m holds the running log-sum-exp, o the running output already normalised).
LSE_MERGE = ((UPDATE, "            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (..., nq, 1)\n"
                      "            new_lse = torch.logaddexp(m, block_lse)\n"
                      "            o = (o * torch.exp(m - new_lse)\n"
                      "                 + torch.softmax(scores, dim=-1) @ v[..., j0:j1, :]\n"
                      "                 * torch.exp(block_lse - new_lse))\n"
                      "            m = new_lse\n"),
             ("        out.append(o / s)\n", "        out.append(o)\n"))
# PyTorch's attention on the whole inputs: its CPU kernel in float32 (math) holds the whole score matrix, and reads
# every key block for a causal call.
SDPA = ("    work = torch.float32 if q.dtype in HALF else q.dtype\n"
        "    out = F.scaled_dot_product_attention(q.to(work), k.to(work), v.to(work), is_causal=causal)\n"
        "    return out.to(q.dtype)\n")
START = ("    if block_size < 1:\n        raise ValueError(f\"block_size must be at least 1, got {block_size}\")\n"
         "    Lq, d, Lk, dtype")


def _all(checks, words):
    return {c: words for c in checks}


MISTAKES = {
    "softmax_sum_not_rescaled": Mistake(18, OS, _all(OS - {"test_online_softmax_dtypes_and_devices"},
                                                     "does not rescale the running sum"), edits=(
        ("s = s * torch.exp(m - shift) + torch.exp(block - shift)", "s = s + torch.exp(block - shift)"),)),
    # -inf - (-inf) on a row whose first blocks are all -inf: only the extreme-score check sees it.
    "softmax_no_neg_inf_guard": Mistake(21, {"test_online_softmax_extreme_scores"},
                                        {"test_online_softmax_extreme_scores": "-inf - (-inf) is NaN"}, edits=(
        ("shift = m_new.masked_fill(m_new == -math.inf, 0.0)", "shift = m_new"),)),
    # A tiled function with a rescaling bug still holds only blocks: it keeps the memory points.
    "tiled_output_not_rescaled": Mistake(15, TILED_VALUES, _all(TILED_VALUES, "rescales the running output"),
                                         edits=(("o = o * alpha + p @ v[..., j0:j1, :]",
                                                 "o = o + p @ v[..., j0:j1, :]"),)),
    "tiled_sum_not_rescaled": Mistake(15, TILED_VALUES, _all(TILED_VALUES, "does not rescale the running sum"),
                                      edits=(("s = s * alpha + p.sum(dim=-1, keepdim=True)",
                                              "s = s + p.sum(dim=-1, keepdim=True)"),)),
    "causal_skip_too_early": Mistake(18, CAUSAL, _all(CAUSAL, "skips key blocks too early"), edits=(
        (SKIP, "if causal and j0 >= i0:"),)),
    "causal_skip_too_late": Mistake(18, CAUSAL, _all(CAUSAL, "past the diagonal without masking"), edits=(
        (SKIP, "if causal and j0 > i0 + block_size:"),)),
    # The blocks above the diagonal skipped, the one on it never masked: its queries see the keys after them. The
    # half-precision check calls it again in float32, wrong there too: the causal hint, not "compute in float32".
    "causal_diagonal_block_unmasked": Mistake(18, CAUSAL, _all(CAUSAL, "does not mask the key block on the diagonal"),
                                              edits=(("if causal and j0 == i0:",
                                                      "if causal and j0 == i0 and False:"),)),
    # The diagonal counted from the end of both sequences (j <= i + Lk - Lq) in the diagonal block, the skipping
    # right: right when Lq == Lk (the skip check), wrong on the Lq != Lk inputs of the causal and dtype checks.
    "causal_bottom_right_in_blocks": Mistake(19, CAUSAL - {SKIPS},
                                             _all(CAUSAL - {SKIPS}, "aligns the mask to the end of the keys"), edits=(
        ("dtype=torch.bool, device=q.device).triu(1)", "dtype=torch.bool, device=q.device).triu(1 + Lk - Lq)"),)),
    # block_size ignored (a fixed 64, more than the checks' keys): right values, but the causal skip check's keys
    # are read in one block, and the method check sees tiles that do not follow block_size.
    "tiled_ignores_block_size": Mistake(20, {SKIPS, BY_BLOCK},
                                        {SKIPS: "in blocks larger than block_size",
                                         BY_BLOCK: "does not split the keys into blocks of block_size"},
                                        edits=((START, START.replace("    Lq, d, Lk, dtype",
                                                                     "    block_size = 64\n    Lq, d, Lk, dtype")),)),
    # Right values from the whole Lq x Lk matrix: the memory check, measured by the grader, sees it, the skip check
    # (its causal weights of 0 meet every value) and the method check (a softmax over all the keys at once).
    "tiled_builds_full_matrix": Mistake(19, {MEMORY, SKIPS, BY_BLOCK},
                                        {MEMORY: "builds (nearly) the whole Lq x Lk",
                                         SKIPS: "reads the key blocks that lie wholly above the diagonal",
                                         BY_BLOCK: "takes a plain softmax over all the keys at once"},
                                        edits=((START, NAIVE + "    Lq, d, Lk, dtype"),)),
    # A plain softmax of each query block's scores against all the keys: right values, in little memory, reading no
    # future key block; only the method check sees it, whichever way the softmax or the scores are written.
    "tiled_plain_softmax_per_query_block": Mistake(21, {BY_BLOCK},
                                                   {BY_BLOCK: "takes a plain softmax over all the keys"},
                                                   edits=((QUERY_BLOCK, PLAIN_SOFTMAX),)),
    "tiled_plain_softmax_written_out": Mistake(21, {BY_BLOCK}, {BY_BLOCK: "takes a plain softmax over all the keys"},
                                               edits=((QUERY_BLOCK, PLAIN_EXP),)),
    "tiled_key_blocks_concatenated": Mistake(21, {BY_BLOCK}, {BY_BLOCK: "the key blocks' scores concatenated"},
                                             edits=CONCATENATED),
    "tiled_calls_pytorch_attention": Mistake(19, {MEMORY, SKIPS, BY_BLOCK},
                                             {BY_BLOCK: "hands a block of queries and all the keys to "
                                                        "F.scaled_dot_product_attention",
                                              MEMORY: "builds (nearly) the whole Lq x Lk"},
                                             edits=((START, SDPA + "    Lq, d, Lk, dtype"),)),
    # Right values, blocks of scores only: the scores computed twice show.
    "tiled_two_passes": Mistake(21, {BY_BLOCK}, {BY_BLOCK: "computes each block of scores more than once"},
                                edits=TWO_PASSES),
    # The online softmax merged through log-sum-exps (a softmax of each key block): full marks.
    "tiled_logsumexp_merge_correct": Mistake(22, set(), {}, edits=LSE_MERGE),
    # Blocks above the diagonal read and masked rather than skipped: right values, and the same memory.
    "tiled_causal_no_skip": Mistake(21, {SKIPS}, {SKIPS: "reads the key blocks that lie wholly above"},
                                    edits=((SKIP_BLOCK, ""), (DIAGONAL, MASK_EVERY_BLOCK))),
    "window_no_value_error": Mistake(21.5, {"test_sliding_window_mask_refuses_empty_window"},
                                     {"test_sliding_window_mask_refuses_empty_window": "must raise a ValueError"},
                                     edits=(("    if window < 1:\n        raise ValueError("
                                             "f\"window must be at least 1, got {window}\")\n", ""),)),
    "window_off_by_one": Mistake(19, WINDOW, _all(WINDOW, "off by one"), edits=(
        ("return (offset >= 0) & (offset < window)", "return (offset >= 0) & (offset <= window)"),
        ("return offset.abs() < window", "return offset.abs() <= window"))),
    "linear_phi_without_plus_one": Mistake(16, LINEAR, _all(LINEAR, "phi(x) = elu(x):"), edits=(
        ("phi_q = F.elu(q.to(work)) + 1", "phi_q = F.elu(q.to(work))"),
        ("phi_k = F.elu(k.to(work)) + 1", "phi_k = F.elu(k.to(work))"))),
    "linear_causal_full_sums": Mistake(18, LINEAR_CAUSAL, _all(LINEAR_CAUSAL, "uses the sums over all keys"), edits=(
        ("    if not causal:\n        kv = phi_k", "    if True:\n        kv = phi_k"),)),
    # Computing in the inputs' float16/bfloat16 instead of float32: right on short inputs, wrong on the long ones
    # of the dtype checks (a running sum that loses its small terms; linear attention's sums past 65504).
    "softmax_in_half": Mistake(21, {"test_online_softmax_dtypes_and_devices"},
                               {"test_online_softmax_dtypes_and_devices": "keeps its running sum in half precision"},
                               edits=(("work = x.to(torch.float32) if x.dtype in HALF else x", "work = x"),)),
    "tiled_in_half": Mistake(21, {"test_tiled_attention_dtypes_and_devices"},
                             {"test_tiled_attention_dtypes_and_devices": "running sum and output in half precision"},
                             edits=(("work = torch.float32 if dtype in HALF else dtype", "work = dtype"),)),
    "linear_in_half": Mistake(21, {"test_linear_attention_dtypes_and_devices"},
                              {"test_linear_attention_dtypes_and_devices": "pass float16's largest value"},
                              edits=(("work = torch.float32 if q.dtype in HALF else q.dtype", "work = q.dtype"),)),
}
