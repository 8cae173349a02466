"""Exercise 04_self_attention: typical mistakes, each with its score, the checks it loses and its hints."""

from chapters import Mistake

KEY = "04_self_attention"
SA_CALL = "return scaled_dot_product_attention(q, k, v, mask=mask)"
SA_ALL = {"test_self_attention_matches_reference", "test_self_attention_scaling",
          "test_self_attention_cross_attention", "test_self_attention_masks", "test_self_attention_gradients",
          "test_self_attention_permutation_equivariance", "test_self_attention_dtypes_and_devices"}
SIN_ALL = {"test_sinusoidal_matches_reference", "test_sinusoidal_base_and_long_tables", "test_sinusoidal_odd_width"}
PE_ALL = {"test_positional_encoding_matches_reference", "test_positional_encoding_decoding_and_max_len",
          "test_positional_encoding_dropout", "test_positional_encoding_kinds_dtypes_devices"}
ROPE_ALL = {"test_rope_matches_reference", "test_rope_positions", "test_rope_relative_positions_and_norms",
            "test_rope_dtypes_and_devices"}
SIN_STACK = "torch.stack([angles.sin(), angles.cos()], dim=-1)"
SIN_FREQ = "inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)"
SIN_CHECK = ('    if d_model % 2 != 0:\n'
             '        raise ValueError(f"d_model must be even for sinusoidal encodings, got {d_model}")\n')
PE_SLICE = "pe = self.pe[offset: offset + T].to(device=x.device, dtype=x.dtype)"
ROPE_PAIRS = "even, odd = pairs[..., 0], pairs[..., 1]"
ROPE_ROTATE = "even * cos - odd * sin, even * sin + odd * cos"

MISTAKES = {
    # Part 1: every check compares the values, so a wrong layer loses the whole part (13 = 21 - 8).
    "qk_swapped": Mistake(13, SA_ALL, {"test_self_attention_matches_reference": "projections are swapped",
                                       "test_self_attention_scaling": "projections are swapped"}, edits=(
        ("q = self.W_q(x)", "q = self.W_k(x)"), ("k = self.W_k(source)", "k = self.W_q(source)"))),
    # Keys and values from x: a context of another length than x fails in the setup cell's attention,
    # and one of x's length shows which mistake it is.
    "context_ignored": Mistake(17, {"test_self_attention_cross_attention", "test_self_attention_gradients",
                                    "test_self_attention_dtypes_and_devices"},
                               {"test_self_attention_cross_attention": "ignores the context"},
                               edits=(("source = x if context is None else context", "source = x"),)),
    "values_from_x": Mistake(17, {"test_self_attention_cross_attention", "test_self_attention_gradients",
                                  "test_self_attention_dtypes_and_devices"},
                             {"test_self_attention_cross_attention": "values must come from it too"},
                             edits=(("v = self.W_v(source)", "v = self.W_v(x)"),)),
    # Attention written out without the scale (as if the setup cell's function did not scale).
    "no_scale": Mistake(13, SA_ALL, {"test_self_attention_matches_reference": "not divided by sqrt(d_k)",
                                     "test_self_attention_scaling": "not divided by sqrt(d_k)"}, edits=(
        (SA_CALL, "return scaled_dot_product_attention(q * math.sqrt(self.d_k), k, v, mask=mask)"),)),
    "scale_by_d_model": Mistake(13, SA_ALL, {"test_self_attention_scaling": "sqrt(d_model)"}, edits=(
        (SA_CALL, "return scaled_dot_product_attention(q * math.sqrt(self.d_k / self.d_model), k, v, mask=mask)"),)),
    "mask_inverted": Mistake(16, {"test_self_attention_cross_attention", "test_self_attention_masks",
                                  "test_self_attention_gradients", "test_self_attention_dtypes_and_devices"},
                             {"test_self_attention_masks": "inverted"}, edits=(
        (SA_CALL, "return scaled_dot_product_attention(q, k, v, mask=None if mask is None else ~mask)"),)),
    # Attention written out instead of calling the setup cell's function (which the master offers, ready to
    # use), fully masked rows zeroed too: full marks.
    "own_attention_ok": Mistake(21, set(), edits=((SA_CALL, (
        "s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
        "        if mask is not None:\n"
        "            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)\n"
        "        w = torch.softmax(s, -1)\n"
        "        if mask is not None:\n"
        "            w = w.masked_fill(~mask, 0.0)\n"
        "        return w @ v, w")),)),
    # Part 2.
    "sin_cos_swapped": Mistake(17, SIN_ALL, {"test_sinusoidal_matches_reference": "sin and cos are swapped"},
                               edits=((SIN_STACK, "torch.stack([angles.cos(), angles.sin()], dim=-1)"),)),
    "exponent_i": Mistake(17, SIN_ALL, {"test_sinusoidal_matches_reference": "uses i instead of 2i"}, edits=(
        (SIN_FREQ, "inv_freq = base ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)"),)),
    "sin_cos_in_halves": Mistake(17, SIN_ALL, {"test_sinusoidal_matches_reference": "must alternate"}, edits=(
        (SIN_STACK + ".flatten(-2)", "torch.cat([angles.sin(), angles.cos()], dim=-1)"),)),
    # float32 throughout loses nothing: long tables are compared to float32's rounding.
    "sin_float32_ok": Mistake(21, set(), edits=(
        ("positions = torch.arange(max_len, dtype=torch.float64)", "positions = torch.arange(max_len).float()"),
        (SIN_FREQ, "inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(base) / d_model))"))),
    "odd_width_accepted": Mistake(20, {"test_sinusoidal_odd_width"},
                                  {"test_sinusoidal_odd_width": "accepts an odd d_model"}, edits=((SIN_CHECK, ""),)),
    # Part 3 is graded holding the reference's table: an unfinished part 2 costs it nothing.
    "part2_unfinished": Mistake(17, SIN_ALL, {"test_sinusoidal_matches_reference": "not implemented yet"}, edits=(
        (SIN_CHECK, "    raise NotImplementedError()\n"),)),
    # Part 3.
    "offset_ignored": Mistake(17, PE_ALL, {"test_positional_encoding_matches_reference": "offset is ignored",
                                           "test_positional_encoding_decoding_and_max_len": "offset is ignored"},
                              edits=((PE_SLICE, "pe = self.pe[:T].to(device=x.device, dtype=x.dtype)"),)),
    "dropout_in_eval": Mistake(20, {"test_positional_encoding_dropout"},
                               {"test_positional_encoding_dropout": "eval mode"},
                               edits=(("return self.dropout(x + pe)", "return F.dropout(x + pe, p=self.dropout.p)"),)),
    "no_max_len_check": Mistake(20, {"test_positional_encoding_decoding_and_max_len"},
                                {"test_positional_encoding_decoding_and_max_len": "raise a ValueError"},
                                edits=(("        if offset + T > self.max_len:\n", "        if False:\n"),)),
    "table_dtype_kept": Mistake(20, {"test_positional_encoding_kinds_dtypes_devices"},
                                {"test_positional_encoding_kinds_dtypes_devices": "changes the dtype"},
                                edits=((PE_SLICE, "pe = self.pe[offset: offset + T]"),)),
    # Part 4.
    "rope_half_split": Mistake(16, ROPE_ALL, {"test_rope_matches_reference": "half-split"}, edits=(
        (ROPE_PAIRS, "even, odd = x.to(work).chunk(2, dim=-1)"),
        ("return rotated.flatten(-2).to(x.dtype)", "return torch.cat(rotated.unbind(-1), dim=-1).to(x.dtype)"))),
    "rope_wrong_direction": Mistake(16, ROPE_ALL, {"test_rope_matches_reference": "wrong way"}, edits=(
        (ROPE_ROTATE, "even * cos + odd * sin, -even * sin + odd * cos"),)),
    "rope_half_precision_angles": Mistake(20, {"test_rope_dtypes_and_devices"},
                                          {"test_rope_dtypes_and_devices": "float32"}, edits=(
        ("work = torch.float64 if x.dtype == torch.float64 else torch.float32", "work = x.dtype"),)),
    # Angles in float32 for a float64 x: right to float32's precision only, which the float64 case of the
    # dtype check sees (the other checks hold float64 to float32's tolerance).
    "rope_float32_angles_for_float64": Mistake(
        20, {"test_rope_dtypes_and_devices"}, {"test_rope_dtypes_and_devices": "in float64 when x is float64"},
        edits=(("work = torch.float64 if x.dtype == torch.float64 else torch.float32", "work = torch.float32"),)),
    "rope_fixed_device": Mistake(20, {"test_rope_dtypes_and_devices"},
                                 {"test_rope_dtypes_and_devices": "would fail on a GPU"}, edits=(
        ("torch.arange(0, d, 2, device=x.device, dtype=work)", "torch.arange(0, d, 2, dtype=work)"),)),
}
