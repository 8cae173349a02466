"""Exercise 03_qkv: typical mistakes, and a few submissions that test the grader itself."""

from chapters import Mistake

KEY = "03_qkv"
SDPA_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)"
ALL_SDPA = {
    "test_sdpa_matches_reference_3d", "test_sdpa_heads_and_dtypes", "test_sdpa_matches_pytorch",
    "test_sdpa_rows_sum_to_one", "test_sdpa_masked_weights_are_zero", "test_sdpa_fully_masked_row",
    "test_sdpa_large_scores_stay_finite", "test_sdpa_causal_does_not_look_ahead",
    "test_sdpa_gradients_match", "test_sdpa_dropout",
}
NO_SCALE_FAILS = {"test_sdpa_matches_reference_3d", "test_sdpa_heads_and_dtypes", "test_sdpa_matches_pytorch",
                  "test_sdpa_masked_weights_are_zero", "test_sdpa_gradients_match", "test_sdpa_dropout"}
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

MISTAKES = {
    "no_scale": Mistake(16, NO_SCALE_FAILS, {"test_sdpa_matches_reference_3d": "not divided by sqrt(d_k)",
                                             "test_sdpa_heads_and_dtypes": "not divided by sqrt(d_k)"},
                        edits=NO_SCALE),
    "wrong_axis": Mistake(12, ALL_SDPA - {"test_sdpa_causal_does_not_look_ahead"},
                          {"test_sdpa_matches_reference_3d": "wrong axis", "test_sdpa_rows_sum_to_one": "dim=-1"},
                          edits=(("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),)),
    "inverted_mask": Mistake(
        16, {"test_sdpa_matches_pytorch", "test_sdpa_masked_weights_are_zero", "test_sdpa_fully_masked_row",
             "test_sdpa_large_scores_stay_finite", "test_sdpa_causal_does_not_look_ahead", "test_sdpa_gradients_match"},
        {"test_sdpa_masked_weights_are_zero": "inverted"},
        edits=(("scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
               ("weights.masked_fill(~mask, 0.0)", "weights.masked_fill(mask, 0.0)"))),
    # The no-scaling mistake with every comparison the learner can reach patched: no point gained.
    "allclose_cheat": Mistake(16, NO_SCALE_FAILS, {"test_sdpa_matches_reference_3d": "not divided by sqrt(d_k)"},
                              make=_with_cell(NO_SCALE, PATCH_COMPARISONS)),
    # Ending the process at load costs everything, and the rest of the batch is graded.
    "os_exit": Mistake(0, None, {"test_sdpa_matches_reference_3d": "ended the grading process"},
                       make=_stub_with_cell("import os\nstatus = os._exit(0)\n")),
    # A helper defined in a cell the learner added counts.
    "helper": Mistake(23, set(), make=_with_cell(((SDPA_SCORES, "scores = my_scores(q, k)  # a helper of my own"),),
                                                 "def my_scores(q, k):\n"
                                                 "    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n")),
}
