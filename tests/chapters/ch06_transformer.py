"""Exercise 06_transformer: typical mistakes of the Transformer's parts, each with its score, lost checks and hints."""

from chapters import Mistake

KEY = "06_transformer"
LN = {"test_layer_norm_matches_torch", "test_layer_norm_gradients", "test_layer_norm_half_precision_and_devices"}
FF = {"test_feed_forward_matches_reference", "test_feed_forward_dropout"}
ENC = {"test_encoder_layer_matches_reference", "test_encoder_layer_masks", "test_encoder_layer_matches_torch",
       "test_encoder_layer_padding_changes_nothing", "test_encoder_layer_dropout"}
DEC = {"test_decoder_layer_matches_reference", "test_decoder_layer_dropout", "test_decoder_layer_masks",
       "test_decoder_layer_cache", "test_decoder_layer_is_causal"}
MODEL = {"test_transformer_forward_matches_reference", "test_transformer_decode_with_caches_and_offset",
         "test_transformer_causal_and_padding_properties"}
GREEDY = {"test_greedy_decode_matches_reference", "test_greedy_decode_cached_equals_recomputation",
          "test_greedy_decode_honours_sos_eos_pad"}
GREEDY_OF_DECODE = {"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"}
CACHE_CAT = (("k = torch.cat([cache[0], k], dim=2)", "v = torch.cat([cache[1], v], dim=2)"))
FIX_DEC = "your DecoderLayer (part 4), which it uses, is wrong or fails: fix it first"
ENC_DROPOUT = ("x = x + self.dropout(self.self_attn(h, h, h, mask=src_mask)[0])",
               "return x + self.dropout(self.ff(self.norm2(x)))",
               "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask=src_mask)[0]))",
               "return self.norm2(x + self.dropout(self.ff(x)))")
DEC_DROPOUT = ("x = x + self.dropout(a)",
               "x = x + self.dropout(self.cross_attn(h, memory, memory, mask=memory_mask)[0])",
               "x = x + self.dropout(self.ff(self.norm3(x)))", "x = self.norm1(x + self.dropout(a))",
               "x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, mask=memory_mask)[0]))",
               "x = self.norm3(x + self.dropout(self.ff(x)))")
ENCODE_LOOP = "        for layer in self.encoder:\n            x = layer(x, src_mask)\n"
DECODE_LAYER = ("            x, cache = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask,\n"
                "                             cache=None if caches is None else caches[i])")
ENC_FORWARD = "        if self.norm_first:\n            h = self.norm1(x)\n"
DEC_FORWARD = "        attn = self.self_attn\n        h = self.norm1(x) if self.norm_first else x\n"
GREEDY_START = "    src_mask = make_src_mask(src, pad)\n    memory = model.encode(src, src_mask)  # (B, S, D)\n"


def _all(checks, words):
    return {c: words for c in checks}


def _f_dropout(line):
    """`line` with self.dropout(E) written F.dropout(E, self.dropout.p): dropout that stays on in eval mode."""
    start = line.index("self.dropout(") + len("self.dropout(")
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        end += 1
    return line[:start - len("self.dropout(")] + "F.dropout(" + line[start:end - 1] + ", self.dropout.p)" + line[end:]


MISTAKES = {
    # Only LayerNorm's own checks fail: the layers are judged with the learner's own LayerNorm.
    "unbiased_variance": Mistake(23, LN, {"test_layer_norm_matches_torch": "unbiased variance",
                                          "test_layer_norm_gradients": "unbiased variance"}, edits=(
        ("var = (x - mean).pow(2).mean(dim=-1, keepdim=True)", "var = x.var(dim=-1, keepdim=True)"),)),
    # A parameter of its own in FeedForward, or a layer of another size: every module built with the reference's
    # weights says which name or shape is wrong (the weights are loaded first; the state dict is read on failure).
    "ff_extra_parameter": Mistake(5, FF | ENC | DEC | MODEL | GREEDY, {
        **_all(FF, "unexpected: scale"), **_all(ENC | DEC, "unexpected: ff.scale"),
        **_all(MODEL | GREEDY, "unexpected: decoder.0.ff.scale")}, edits=(
        ("class FeedForward(FeedForwardBase):\n    def forward(self, x):",
         "class FeedForward(FeedForwardBase):\n    def __init__(self, *args, **kwargs):\n"
         "        super().__init__(*args, **kwargs)\n        self.scale = nn.Parameter(torch.ones(1))\n\n"
         "    def forward(self, x):"),)),
    "ff_wrong_size": Mistake(5, FF | ENC | DEC | MODEL | GREEDY, {
        **_all(FF, "linear1.weight has the wrong shape"), **_all(ENC | DEC, "ff.linear1.weight has the wrong shape"),
        **_all(MODEL | GREEDY, "encoder.0.ff.linear1.weight has the wrong shape")}, edits=(
        ("class FeedForward(FeedForwardBase):\n    def forward(self, x):",
         "class FeedForward(FeedForwardBase):\n    def __init__(self, d_model, d_ff, dropout=0.0):\n"
         "        super().__init__(d_model, d_ff + 1, dropout)\n\n    def forward(self, x):"),)),
    # The dropout check judges the values in eval mode too: a wrong network loses it as well.
    "ff_no_relu": Mistake(24, FF, _all(FF, "no ReLU between linear1 and linear2"), edits=(
        ("return self.linear2(self.dropout(F.relu(self.linear1(x))))",
         "return self.linear2(self.dropout(self.linear1(x)))"),)),
    # Pre-LN self-attention sublayer whose residual is the normalised x.
    "pre_ln_residual_after_norm": Mistake(21, ENC, _all(ENC, "adds the residual after the norm"), edits=(
        ("h = self.norm1(x)\n            x = x + self.dropout(self.self_attn(h, h, h, mask=src_mask)[0])",
         "x = self.norm1(x)\n            x = x + self.dropout(self.self_attn(x, x, x, mask=src_mask)[0])"),)),
    # Pre-LN feed-forward sublayer that normalises the sum as well as its input.
    "pre_ln_stream_normed": Mistake(21, ENC, _all(ENC, "also normalises the residual stream"), edits=(
        ("return x + self.dropout(self.ff(self.norm2(x)))",
         "return self.norm2(x + self.dropout(self.ff(self.norm2(x))))"),)),
    "decoder_norm_first_ignored": Mistake(20, DEC, _all(DEC, "whatever norm_first says"), edits=(
        ("        if self.norm_first:\n            x = x + self.dropout(a)",
         "        if False:\n            x = x + self.dropout(a)"),
        ("h = self.norm1(x) if self.norm_first else x", "h = x"))),
    # The target mask in cross-attention only runs when memory is as long as the target: every decoder check
    # names it, and the model and decoding, which cannot run, say which part to fix.
    "self_mask_in_cross": Mistake(12, DEC | MODEL | GREEDY,
                                  _all(DEC, "uses the target mask in cross-attention")
                                  | _all(MODEL - {"test_transformer_decode_with_caches_and_offset"} | GREEDY, FIX_DEC),
                                  edits=(("mask=memory_mask)[0])", "mask=tgt_mask)[0])"),)),
    # Heads axis: the cache still has the right number of numbers but the next step cannot attend.
    "cache_wrong_axis": Mistake(20.5, {"test_decoder_layer_cache", "test_transformer_decode_with_caches_and_offset",
                                       "test_greedy_decode_cached_equals_recomputation",
                                       "test_greedy_decode_honours_sos_eos_pad"},
                                {"test_decoder_layer_cache": "grows the cache along the wrong axis",
                                 "test_transformer_decode_with_caches_and_offset": FIX_DEC,
                                 "test_greedy_decode_cached_equals_recomputation": FIX_DEC},
                                edits=tuple((old, old.replace("dim=2", "dim=1")) for old in CACHE_CAT)),
    # One new position attends to every key whatever their order: only the returned cache shows it.
    "cache_new_first": Mistake(24, {"test_decoder_layer_cache"},
                               {"test_decoder_layer_cache": "new keys and values before the cached ones"},
                               edits=(("k = torch.cat([cache[0], k], dim=2)", "k = torch.cat([k, cache[0]], dim=2)"),
                                      ("v = torch.cat([cache[1], v], dim=2)", "v = torch.cat([v, cache[1]], dim=2)"))),
    # The model and decoding are judged with the learner's own masks; only the padding property shows it.
    "src_mask_inverted": Mistake(24, {"test_make_src_mask", "test_transformer_causal_and_padding_properties"},
                                 {"test_make_src_mask": "is inverted",
                                  "test_transformer_causal_and_padding_properties": "Padding the source changes"},
                                 edits=(("return (src != pad_id)[:, None, None, :]  # (B, 1, 1, S)",
                                         "return (src == pad_id)[:, None, None, :]"),)),
    "tgt_mask_no_pad": Mistake(25, {"test_make_tgt_mask"}, {"test_make_tgt_mask": "ignores padding"}, edits=(
        ("return (tgt != pad_id)[:, None, None, :] & causal  # (B, 1, T, T)",
         "return causal.expand(tgt.size(0), 1, T, T)"),)),
    "embedding_not_scaled": Mistake(22, MODEL, _all(MODEL, "not multiplied by sqrt(d_model)"), edits=(
        ("x = self.pos(self.src_embed(src) * math.sqrt(self.d_model))", "x = self.pos(self.src_embed(src))"),
        ("x = self.pos(self.tgt_embed(tgt_in) * math.sqrt(self.d_model), offset=offset)",
         "x = self.pos(self.tgt_embed(tgt_in), offset=offset)"))),
    "enc_norm_missing": Mistake(23, MODEL - {"test_transformer_decode_with_caches_and_offset"},
                                _all(MODEL - {"test_transformer_decode_with_caches_and_offset"},
                                     "stack's output is not normalised"),
                                edits=(("return self.enc_norm(x) if self.norm_first else x", "return x"),)),
    # Positions restarting at 0 in decode: greedy_decode_cached, right given this decode, loses nothing.
    "decode_offset_ignored": Mistake(25, {"test_transformer_decode_with_caches_and_offset"},
                                     {"test_transformer_decode_with_caches_and_offset": "ignores offset"}, edits=(
        ("x = self.pos(self.tgt_embed(tgt_in) * math.sqrt(self.d_model), offset=offset)",
         "x = self.pos(self.tgt_embed(tgt_in) * math.sqrt(self.d_model))"),)),
    "greedy_cached_offset_zero": Mistake(23.5, {"test_greedy_decode_cached_equals_recomputation",
                                                "test_greedy_decode_honours_sos_eos_pad"},
                                         _all({"test_greedy_decode_cached_equals_recomputation",
                                               "test_greedy_decode_honours_sos_eos_pad"},
                                              "feeds every new token at position 0"),
                                         edits=(("caches, offset=t)", "caches, offset=0)"),)),
    "greedy_no_pad_after_eos": Mistake(22, GREEDY, _all(GREEDY, "does not fill the positions after a row's eos"),
                                       edits=((".masked_fill(finished, pad)", ""),)),
    # Written from the spec alone by a learner: the eos itself padded (the rows that output it marked finished
    # before the padding), and `finished` set anew at each step instead of kept.
    "greedy_eos_padded": Mistake(22, GREEDY, _all(GREEDY, "replaces a row's eos itself with pad"), edits=(
        ("        y = logits[:, -1].argmax(dim=-1).masked_fill(finished, pad)  # (B,)\n        tokens.append(y)\n"
         "        finished = finished | (y == eos)\n",
         "        y = logits[:, -1].argmax(dim=-1)  # (B,)\n        finished = finished | (y == eos)\n"
         "        y = y.masked_fill(finished, pad)\n        tokens.append(y)\n"),)),
    "greedy_finished_reassigned": Mistake(22, GREEDY, _all(GREEDY, "forgets that a row has finished"), edits=(
        ("        finished = finished | (y == eos)\n", "        finished = y == eos\n"),)),
    "greedy_with_sos": Mistake(24, {"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
                               _all({"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
                                    "returns the sos column"), edits=(
        ("        ys = torch.cat([ys, y[:, None]], dim=1)  # (B, T + 1)\n    return torch.stack(tokens, dim=1)",
         "        ys = torch.cat([ys, y[:, None]], dim=1)  # (B, T + 1)\n"
         "    return torch.cat([ys[:, :1], torch.stack(tokens, dim=1)], dim=1)"),)),
    # eps written as a constant: the eps mistakes are told apart in float64.
    "ln_eps_constant": Mistake(23.5, LN - {"test_layer_norm_half_precision_and_devices"},
                               _all(LN - {"test_layer_norm_half_precision_and_devices"}, "uses an eps of its own"),
                               edits=(("torch.sqrt(var + self.eps)", "torch.sqrt(var + 1e-6)"),)),
    # Hidden units in another order: linear2 then pairs them with the wrong weights, in eval mode too.
    "ff_permuted": Mistake(24, FF, _all(FF, "differs from linear2(dropout(relu(linear1(x))))"), edits=(
        ("return self.linear2(self.dropout(F.relu(self.linear1(x))))",
         "return self.linear2(self.dropout(F.relu(self.linear1(x))).flip(-1))"),)),
    # F.dropout without training=self.training drops in eval mode too.
    "enc_dropout_in_eval": Mistake(25.5, {"test_encoder_layer_dropout"},
                                   {"test_encoder_layer_dropout": "drops its sublayers' outputs in eval mode"},
                                   edits=tuple((line, _f_dropout(line)) for line in ENC_DROPOUT)),
    "dec_no_residual_dropout": Mistake(25, {"test_decoder_layer_dropout"},
                                       {"test_decoder_layer_dropout": "never applies its residual dropout"},
                                       edits=tuple((line, line.replace("self.dropout(", "(")) for line in DEC_DROPOUT)),
    # Identity layers, and a model that never calls them: judging the model by the learner's own layers would
    # pay it; the decoders, on a model whose rows never finish unevenly, cannot be judged.
    "identity_layers_skipped": Mistake(
        7, ENC | DEC | MODEL | GREEDY,
        _all(MODEL, "Your EncoderLayer (part 3) is wrong too") | _all(GREEDY, "cannot be judged yet"),
        edits=((ENC_FORWARD, "        return x\n" + ENC_FORWARD),
               (DEC_FORWARD, "        return x, (None, None)\n" + DEC_FORWARD),
               (ENCODE_LOOP, ""), (DECODE_LAYER, "            cache = None"))),
    # Constant logits, and decoders that return pad everywhere without calling the model.
    "greedy_zeros_constant_model": Mistake(
        18, MODEL | GREEDY, _all(GREEDY, "cannot be judged yet"), edits=(
            ("return self.out(x), new_caches  # (B, T, tgt_vocab)", "return self.out(x) * 0, new_caches"),
            (GREEDY_START, "    return torch.zeros(src.size(0), max_len, dtype=torch.long, device=src.device)\n"))),
    # Row 0 finishes before the last row in every model the decoders are judged on.
    "greedy_stops_at_row_0": Mistake(22, GREEDY, _all(GREEDY, "stops when the first row produces eos"), edits=(
        ("if bool(finished.all()):", "if bool(finished[0]):"),)),
    # The first step's caches passed at every step: the model's output depends on the tokens before.
    "greedy_cached_first_cache": Mistake(
        23.5, {"test_greedy_decode_cached_equals_recomputation", "test_greedy_decode_honours_sos_eos_pad"},
        _all({"test_greedy_decode_cached_equals_recomputation", "test_greedy_decode_honours_sos_eos_pad"},
             "passes the first step's caches"), edits=((
                 "logits, caches = model.decode(y[:, None], memory, src_mask, None, caches, offset=t)  # (B, 1, V)",
                 "logits, new = model.decode(y[:, None], memory, src_mask, None, caches, offset=t)  # (B, 1, V)\n"
                 "        caches = new if caches is None else caches"),)),
    # Each position also sees the next one: in a two-layer decoder the last position's logits change too.
    "greedy_leaky_causal_mask": Mistake(
        24, {"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
        _all({"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
             "lets each position see the next one"), edits=(
            ("device=src.device).tril()  # (T, T)", "device=src.device).tril(diagonal=1)  # (T, T)"),)),
    "greedy_no_src_mask": Mistake(22, GREEDY, _all(GREEDY, "ignores the source's padding"), edits=(
        ("    src_mask = make_src_mask(src, pad)\n", "    src_mask = None\n"),)),
    # The default padding id 0 rather than pad: seen where pad is another id, and the real tokens are never 0.
    "greedy_src_mask_pad_0": Mistake(
        25.5, {"test_greedy_decode_honours_sos_eos_pad"},
        {"test_greedy_decode_honours_sos_eos_pad": "make_src_mask(src, pad), with the pad"},
        edits=((GREEDY_START + "    ys", GREEDY_START.replace("(src, pad)", "(src)") + "    ys"),)),
    # max_len steps whatever the rows: seen where every row finishes at the first step (eos made certain).
    "greedy_no_early_stop": Mistake(
        24, GREEDY_OF_DECODE, _all(GREEDY_OF_DECODE, "does not stop as soon as every row"),
        edits=(("        if bool(finished.all()):\n            break\n        ys = torch.cat",
                "        ys = torch.cat"),)),
    # One step too many: seen where no row ever finishes (eos made impossible).
    "greedy_one_step_too_many": Mistake(
        24, GREEDY_OF_DECODE, _all(GREEDY_OF_DECODE, "one step too few or too many"),
        edits=(("    tokens = []\n    for _ in range(max_len):",
                "    tokens = []\n    for _ in range(max_len + 1):"),)),
    # The cached decoder that recomputes the prefix: its tokens are right; what it feeds the decoder is noted.
    "greedy_cached_recomputes": Mistake(
        24, {"test_greedy_decode_cached_equals_recomputation"},
        {"test_greedy_decode_cached_equals_recomputation": "feeds the decoder more than the newest token"}, edits=(
            ("    y = torch.full((src.size(0),), sos, dtype=torch.long, device=src.device)  # (B,)\n",
             "    return greedy_decode(model, src, max_len, sos, eos, pad)\n"
             "    y = torch.full((src.size(0),), sos, dtype=torch.long, device=src.device)  # (B,)\n"),)),
    # The cached decoder calling decode by keywords, and running finished rows on: right.
    "greedy_cached_by_keywords": Mistake(26, set(), {}, edits=(
        ("logits, caches = model.decode(y[:, None], memory, src_mask, None, caches, offset=t)  # (B, 1, V)",
         "logits, caches = model.decode(tgt_in=y.unsqueeze(1), memory=memory, src_mask=src_mask, caches=caches,\n"
         "                                      offset=t)  # (B, 1, V)"),)),
    # Offsets one too far; greedy decoding with no causal mask: each hint names the mistake.
    "greedy_cached_offset_plus_one": Mistake(
        23.5, {"test_greedy_decode_cached_equals_recomputation", "test_greedy_decode_honours_sos_eos_pad"},
        _all({"test_greedy_decode_cached_equals_recomputation", "test_greedy_decode_honours_sos_eos_pad"},
             "one position too far"), edits=(("caches, offset=t)", "caches, offset=t + 1)"),)),
    "greedy_no_causal_mask": Mistake(
        24, {"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
        _all({"test_greedy_decode_matches_reference", "test_greedy_decode_honours_sos_eos_pad"},
             "passes no causal mask"), edits=(
            ("logits, _ = model.decode(ys, memory, src_mask, causal)", "logits, _ = model.decode(ys, memory, src_mask)"),)),
    # The prefix's pad keys masked too (make_tgt_mask): the models judged never output pad, so it decodes the same.
    "greedy_with_make_tgt_mask": Mistake(26, set(), {}, edits=(
        ("causal = torch.ones(T, T, dtype=torch.bool, device=src.device).tril()  # (T, T)",
         "causal = make_tgt_mask(ys, pad)"),)),
}
