"""Exercise 05_multi_head: typical mistakes of splitting heads, multi-head attention, parity with PyTorch and GQA."""

from chapters import Mistake

KEY = "05_multi_head"
SPLIT = "return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)"
MERGE = "return x.transpose(1, 2).reshape(B, T, H * d_head)"
MHA_QK = ("q = split_heads(self.W_q(query), self.n_heads)  # (B, H, Lq, d_head)\n"
          "        k = split_heads(self.W_k(key), self.n_heads)")
MHA_SDPA = "out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p)"
RETURN_WO = "return self.W_o(merge_heads(out)), weights"
# Attention written inline instead of calling scaled_dot_product_attention (right, then with each typical mistake).
INLINE = ("scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n"
          "        if mask is not None:\n"
          "            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
          "        weights = torch.softmax(scores, dim=-1)\n"
          "        if mask is not None:\n"
          "            weights = weights.masked_fill(~mask, 0.0)\n"
          "        weights = F.dropout(weights, p=dropout_p)\n"
          "        out = weights @ v")
REPEAT = "return x[:, :, None].expand(B, H_kv, n_rep, T, d).reshape(B, H_kv * n_rep, T, d)"

PART1 = {"test_split_heads_matches_reference", "test_merge_heads_matches_reference", "test_split_merge_round_trip",
         "test_split_merge_dtypes_devices_gradients"}
MHA = {"test_mha_matches_reference", "test_mha_cross_attention", "test_mha_masks", "test_mha_fully_masked_rows",
       "test_mha_gradients", "test_mha_heads_are_independent", "test_mha_matches_torch", "test_mha_dropout",
       "test_mha_dtypes_and_devices"}
GQA = {"test_gqa_matches_reference", "test_gqa_masks", "test_gqa_is_mha_and_mqa", "test_gqa_gradients",
       "test_gqa_dtypes_and_devices"}
LOAD = {"test_load_torch_mha_copies_weights", "test_load_torch_mha_fills_ours_with_copies"}
TO_MASK = {"test_to_torch_attn_mask_values", "test_to_torch_attn_mask_agrees_with_pytorch"}
SPLIT_AXIS = "splits the heads along the wrong axis"
VIEW = ".view on the result of transpose"
FIX_MERGE = "fix merge_heads first (part 1)"


def _all(checks, words):
    return {c: words for c in checks}


MISTAKES = {
    # A module that is right given the learner's own (wrong) split_heads loses nothing in parts 2 and 4:
    # the checks redo its computation with that split_heads, gradients included.
    "split_no_transpose": Mistake(20, PART1 - {"test_merge_heads_matches_reference"},
                                  _all(PART1 - {"test_merge_heads_matches_reference"}, SPLIT_AXIS),
                                  edits=((SPLIT, "return x.view(B, n_heads, T, D // n_heads)"),)),
    "merge_no_transpose": Mistake(20, PART1 - {"test_split_heads_matches_reference"},
                                  _all(PART1 - {"test_split_heads_matches_reference"}, "without transpose(1, 2)"),
                                  edits=((MERGE, "return x.reshape(B, T, H * d_head)"),)),
    # view after transpose raises: the modules, which call merge_heads, cannot run, and say which part to fix.
    "merge_view_after_transpose": Mistake(
        6, (PART1 - {"test_split_heads_matches_reference"}) | MHA | GQA,
        _all(PART1 - {"test_split_heads_matches_reference"}, VIEW) | _all(MHA | GQA, FIX_MERGE),
        edits=((MERGE, "return x.transpose(1, 2).view(B, T, H * d_head)"),)),
    "scale_by_sqrt_d_model": Mistake(14, MHA, _all(MHA, "sqrt(d_model) instead of sqrt(d_head)"), edits=(
        (MHA_SDPA, MHA_SDPA.replace("(q, k, v,", "(q / math.sqrt(self.n_heads), k, v,")),)),
    # The exercise offers scaled_dot_product_attention; computing it inline is as right, and has mistakes of its own.
    "inline_attention": Mistake(23, set(), edits=((MHA_SDPA, INLINE),)),
    "inline_no_scale": Mistake(14, MHA, _all(MHA, "not divided by sqrt(d_head)"), edits=(
        (MHA_SDPA, INLINE.replace(" / math.sqrt(self.d_head)", "")),)),
    "inline_scale_by_sqrt_d_model": Mistake(14, MHA, _all(MHA, "sqrt(d_model) instead of sqrt(d_head)"), edits=(
        (MHA_SDPA, INLINE.replace("math.sqrt(self.d_head)", "math.sqrt(self.n_heads * self.d_head)")),)),
    "inline_no_softmax": Mistake(14, MHA, _all(MHA, "apply a softmax over the keys"), edits=(
        (MHA_SDPA, INLINE.replace("torch.softmax(scores, dim=-1)", "scores")),)),
    "inline_softmax_over_queries": Mistake(14, MHA, _all(MHA, "softmax runs over the wrong axis"), edits=(
        (MHA_SDPA, INLINE.replace("dim=-1)", "dim=-2)")),)),
    "inline_scale_after_softmax": Mistake(14, MHA, _all(MHA, "divided by sqrt(d_head) after the softmax"), edits=(
        (MHA_SDPA, INLINE.replace(" / math.sqrt(self.d_head)", "").replace(
            "torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-1) / math.sqrt(self.d_head)")),)),
    "q_k_swapped": Mistake(14, MHA, _all(MHA, "query and key projections are swapped"), edits=(
        (MHA_QK, "q = split_heads(self.W_k(query), self.n_heads)  # (B, H, Lq, d_head)\n"
                 "        k = split_heads(self.W_q(key), self.n_heads)"),)),
    # Both modules share the return line: W_o is missing from both.
    "no_w_o": Mistake(9, MHA | GQA, _all(MHA | GQA, "W_o is missing"),
                      edits=((RETURN_WO, "return merge_heads(out), weights"),)),
    "dropout_in_eval": Mistake(22, {"test_mha_dropout"}, {"test_mha_dropout": "Dropout is applied in eval mode"},
                               edits=(("dropout_p = self.dropout if self.training else 0.0",
                                       "dropout_p = self.dropout"),)),
    "torch_mask_not_inverted": Mistake(21, TO_MASK, _all(TO_MASK, "True = may NOT attend"),
                                       edits=(("return ~mask.bool()", "return mask.bool()"),)),
    # Read as nn.MultiheadAttention's 3-D attn_mask: the leading dimensions flattened into one (B*H).
    "torch_mask_reshaped": Mistake(21, TO_MASK, _all(TO_MASK, "changes the mask's shape"),
                                   edits=(("return ~mask.bool()",
                                           "return (~mask.bool()).reshape(-1, *mask.shape[-2:])"),)),
    "in_proj_order_kqv": Mistake(21, LOAD, _all(LOAD, "chunks of in_proj_weight in the wrong order"), edits=(
        ("w_q, w_k, w_v = theirs.in_proj_weight.chunk(3, dim=0)",
         "w_k, w_q, w_v = theirs.in_proj_weight.chunk(3, dim=0)"),)),
    # nn.Parameter(chunk) shares the chunk's memory with theirs: right values, but not copies.
    "load_shares_tensors": Mistake(22, {"test_load_torch_mha_fills_ours_with_copies"},
                                   {"test_load_torch_mha_fills_ours_with_copies": "changing theirs changes ours"},
                                   edits=(("layer.weight.copy_(w)", "layer.weight = nn.Parameter(w)"),)),
    # .repeat tiles the heads; with one key/value head (multi-query) or n_rep = 1 the order does not matter.
    "repeat_tiled": Mistake(18, {"test_repeat_kv"} | GQA - {"test_gqa_is_mha_and_mqa"},
                            _all({"test_repeat_kv"} | GQA - {"test_gqa_is_mha_and_mqa"}, "repeated in the wrong order"),
                            edits=((REPEAT, "return x.repeat(1, n_rep, 1, 1)"),)),
}
