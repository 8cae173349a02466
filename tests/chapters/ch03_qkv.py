"""Exercise 03_qkv: typical mistakes, and a few submissions that test the grader itself."""

from chapters import Mistake

KEY = "03_qkv"
SDPA_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)"
SDPA_FILL = "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"
SDPA_ZERO = "weights = weights.masked_fill(~mask, 0.0)"
NUMPY_MASK = "scores = np.where(mask, scores, -np.inf)"
ALL_SDPA = {
    "test_sdpa_matches_reference_3d", "test_sdpa_heads_and_dtypes", "test_sdpa_half_precision",
    "test_sdpa_matches_pytorch", "test_sdpa_rows_sum_to_one", "test_sdpa_masked_weights_are_zero",
    "test_sdpa_fully_masked_row", "test_sdpa_fully_masked_row_gradients", "test_sdpa_large_scores_stay_finite",
    "test_sdpa_causal_does_not_look_ahead", "test_sdpa_gradients_match", "test_sdpa_dropout",
    "test_sdpa_runs_on_any_device",
}
PATCH_COMPARISONS = ("import numpy, torch\n"
                     "numpy.allclose = lambda *a, **k: True\n"
                     "torch.allclose = lambda *a, **k: True\n"
                     "torch.equal = lambda *a, **k: True\n"
                     "torch.testing.assert_close = lambda *a, **k: None\n")


def _with_cell(base, source, after="setup"):
    def make():
        from conftest import add_cell, mistake

        return add_cell(mistake(KEY, *base)(), source, after_grade_id=after)
    return make


def _stub_with_cell(source):
    def make():
        from conftest import add_cell, learner_notebook

        return add_cell(learner_notebook(KEY), source)
    return make


NO_SCALE = ((SDPA_SCORES, "scores = q @ k.transpose(-2, -1)"),)
NOT_ON_KEYS = "do not depend on the queries and keys"
GPU = "would fail on a GPU"
SOFTMAX_NAN_TO_NUM = ("weights = torch.softmax(scores, dim=-1)",
                      "weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)")

MISTAKES = {
    # Every check of the PyTorch part also requires the reference's result on its inputs, so a wrong
    # computation loses the whole part (11 = 26 - 15), each check naming the mistake where it can.
    "no_scale": Mistake(11, ALL_SDPA, {"test_sdpa_matches_reference_3d": "not divided by sqrt(d_k)",
                                       "test_sdpa_heads_and_dtypes": "not divided by sqrt(d_k)",
                                       "test_sdpa_rows_sum_to_one": "not divided by sqrt(d_k)"},
                        edits=NO_SCALE),
    "wrong_axis": Mistake(11, ALL_SDPA, {"test_sdpa_matches_reference_3d": "wrong axis",
                                         "test_sdpa_rows_sum_to_one": "dim=-1",
                                         "test_sdpa_causal_does_not_look_ahead": "wrong axis"},
                          edits=(("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),)),
    "inverted_mask": Mistake(
        16, {"test_sdpa_half_precision", "test_sdpa_matches_pytorch", "test_sdpa_masked_weights_are_zero",
             "test_sdpa_fully_masked_row", "test_sdpa_fully_masked_row_gradients", "test_sdpa_large_scores_stay_finite",
             "test_sdpa_causal_does_not_look_ahead", "test_sdpa_gradients_match", "test_sdpa_runs_on_any_device"},
        {"test_sdpa_masked_weights_are_zero": "inverted", "test_sdpa_causal_does_not_look_ahead": "the future leaks"},
        edits=(("scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
               (SDPA_ZERO, "weights = weights.masked_fill(mask, 0.0)"))),
    # Uniform weights over the allowed keys satisfy every property (rows sum to 1, masked weights 0,
    # no look-ahead, fully masked rows 0): they must still earn nothing in the PyTorch part.
    "uniform_attention": Mistake(11, ALL_SDPA, {"test_sdpa_rows_sum_to_one": NOT_ON_KEYS,
                                                "test_sdpa_masked_weights_are_zero": NOT_ON_KEYS,
                                                "test_sdpa_fully_masked_row": NOT_ON_KEYS,
                                                "test_sdpa_causal_does_not_look_ahead": NOT_ON_KEYS},
                                 edits=((SDPA_SCORES, "scores = (q @ k.transpose(-2, -1)) * 0.0"),)),
    # An additive -inf mask repaired with nan_to_num: every forward value is right, the gradients are NaN.
    "nan_gradients": Mistake(25, {"test_sdpa_fully_masked_row_gradients"},
                             {"test_sdpa_fully_masked_row_gradients": "contains NaN"}, edits=(
        (SDPA_FILL, 'scores = scores + torch.zeros_like(scores).masked_fill(~mask, float("-inf"))'),
        SOFTMAX_NAN_TO_NUM)),
    # masked_fill(-inf) then nan_to_num is right, gradients included: masked_fill's backward zeroes
    # the masked positions, so no NaN reaches q or k.
    "minus_inf_masked_fill_ok": Mistake(26, set(), edits=(
        (SDPA_FILL, 'scores = scores.masked_fill(~mask, float("-inf"))'), SOFTMAX_NAN_TO_NUM)),
    # attention_numpy with its mask inverted (True taken as "masked"): the mask check names it under every seed, its
    # masks leaving every query a key either way round; with -inf or with a large finite penalty.
    "numpy_inverted_mask": Mistake(25, {"test_attention_numpy_mask"}, {"test_attention_numpy_mask": "mask is inverted"},
                                   edits=((NUMPY_MASK, "scores = np.where(mask, -np.inf, scores)"),)),
    "numpy_inverted_mask_finite": Mistake(25, {"test_attention_numpy_mask"},
                                          {"test_attention_numpy_mask": "mask is inverted"},
                                          edits=((NUMPY_MASK, "scores = scores - 1e9 * mask"),)),
    # attention_numpy with an exp of its own instead of the stable softmax: right until the scores pass 709.
    "numpy_unstable_softmax": Mistake(
        25, {"test_attention_numpy_rows_sum_to_one"}, {"test_attention_numpy_rows_sum_to_one": "stable softmax"},
        edits=(("weights = softmax(scores, axis=-1)  # (..., Lq, Lk)",
                "weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)  # (..., Lq, Lk)"),)),
    # attention_numpy scales the caller's q in place (right values, the caller's array changed): the first
    # check of the part that sees it loses its points, the part's other checks judge the values (the rule
    # of every exercise's instructions: a function leaves its arguments as they were).
    "numpy_scales_q_in_place": Mistake(
        24, {"test_attention_numpy_matches_reference"},
        {"test_attention_numpy_matches_reference": "changed its argument `q` in place"},
        edits=(("    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # (..., Lq, Lk)",
                "    q /= np.sqrt(d_k)\n    scores = q @ np.swapaxes(k, -1, -2)  # (..., Lq, Lk)"),)),
    # Dropout written by hand (the master names F.dropout as one way): the same statistics, full marks.
    "own_dropout_ok": Mistake(26, set(), edits=(
        ("weights = F.dropout(weights, p=dropout_p)",
         "weights = weights * (torch.rand_like(weights) >= dropout_p) / (1 - dropout_p)"),)),
    "fill_minus_1e9": Mistake(25, {"test_sdpa_half_precision"},
                              {"test_sdpa_half_precision": "fixed fill value such as -1e9"},
                              edits=((SDPA_FILL, "scores = scores.masked_fill(~mask, -1e9)"),)),
    "fixed_device": Mistake(25, {"test_sdpa_runs_on_any_device"}, {"test_sdpa_runs_on_any_device": GPU}, edits=(
        (SDPA_ZERO, "weights = torch.where(mask, weights, torch.zeros(weights.shape, dtype=weights.dtype))"),)),
    # 0-dim CPU tensors mix with CUDA tensors: this runs on a GPU and loses nothing.
    "scalar_tensor_ok": Mistake(26, set(), edits=(
        (SDPA_SCORES, "scores = q @ k.transpose(-2, -1) / torch.tensor(d_k, dtype=torch.float64).sqrt()"),
        (SDPA_ZERO, "weights = torch.where(mask, weights, torch.tensor(0.0, dtype=weights.dtype))"))),
    "padding_fixed_device": Mistake(25, {"test_padding_mask_pad_id_and_device"},
                                    {"test_padding_mask_pad_id_and_device": GPU}, edits=(
        ("return (tokens != pad_id)[:, None, None, :]",
         "return ((tokens != pad_id) & torch.ones(tokens.shape, dtype=torch.bool))[:, None, None, :]"),)),
    "causal_ignores_device": Mistake(25, {"test_causal_mask_device"},
                                     {"test_causal_mask_device": "must create the mask on `device`"}, edits=(
        ("torch.ones(size, size, dtype=torch.bool, device=device)", "torch.ones(size, size, dtype=torch.bool)"),)),
    # .cpu() on the mask: right on a CPU, wrong on a GPU; the meta device shows it.
    "causal_mask_to_cpu": Mistake(25, {"test_causal_mask_device"}, {"test_causal_mask_device": "no .cpu()"}, edits=(
        ("torch.ones(size, size, dtype=torch.bool, device=device).tril()",
         "torch.ones(size, size, dtype=torch.bool, device=device).tril().cpu()"),)),
    # The no-scaling mistake with every comparison the learner can reach patched: no point gained.
    "allclose_cheat": Mistake(11, ALL_SDPA, {"test_sdpa_matches_reference_3d": "not divided by sqrt(d_k)"},
                              make=_with_cell(NO_SCALE, PATCH_COMPARISONS)),
    # Ending the process at load costs everything, and the rest of the batch is graded.
    "os_exit": Mistake(0, None, {"test_sdpa_matches_reference_3d": "ended the grading process"},
                       make=_stub_with_cell("import os\nstatus = os._exit(0)\n")),
    # A helper defined in a cell the learner added counts.
    "helper": Mistake(26, set(), make=_with_cell(((SDPA_SCORES, "scores = my_scores(q, k)  # a helper of my own"),),
                                                 "def my_scores(q, k):\n"
                                                 "    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n")),
}
