"""Hidden tests for exercise 06_transformer: LayerNorm, the feed-forward network, encoder and
decoder layers (post-LN and pre-LN, with a KV cache), masks, the model and greedy decoding.

The layers are graded holding the reference's weights and compared with the same
computation done here in float64. A layer calls the learner's own LayerNorm and FeedForward
(parts 1 and 2): when those are wrong, a layer that is right given them still earns its
part (the computation is redone here with the learner's parts), and a layer that is wrong
too is told to fix them first. The model (part 6) is judged the same way against the
learner's own layers, and greedy decoding (part 7) against the learner's own model: each
part earns its points for what it does itself. Never where that would pay for doing
nothing: own parts that return their input or zeros, and own layers whose skipping changes
nothing, are no yardstick, and a decoder is judged only on a model whose rows finish at
different steps, row 0 before the last, where each typical mistake changes the tokens. A decoder
right there is then run on the same model with eos made certain, then impossible: whether it
stops as soon as every row is finished, and takes max_len steps when none is, shows on every
seed (`_check_stopping`). The model is searched for among candidates (weights, sources and a bias on eos) decoded
in batches, each typical mistake's tokens cut from rows decoded without stopping (`_candidates`); the one chosen is
decoded again on its own. What the cached decoder feeds its model's decode is noted in the learner's process
(`DECODE_NOTER`, made there from source): its tokens right, a decoder that feeds the whole prefix still fails.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from autograder.hidden.support import (DEVICE_ERRORS, FIXED_DEVICE_HINT, Hint, broadcast_shape, close, diagnose, expect,
                                       expect_device_agnostic, expect_grads, learner_builtins, learner_grads,
                                       learner_module, made_in_learner, method, module, points, prepared, random_mask,
                                       submodule, tensor, vjp)
from autograder.isolation.errors import LearnerError, MissingName, NotImplementedRemote
from autograder.isolation.runner import RemoteObject

F32, F64 = torch.float32, torch.float64
PAD, SOS, EOS = 0, 1, 2

# --- hints ----------------------------------------------------------------------------------

LN_GENERIC = ("`LayerNorm` differs from nn.LayerNorm: subtract the mean over the last dimension, divide by "
              "sqrt(variance + eps), then multiply by weight and add bias.")
LN_UNBIASED = ("`LayerNorm` uses the unbiased variance (divided by D - 1): layer normalisation divides by D "
               "(x.var(-1, unbiased=False, keepdim=True), or the mean of the squared deviations).")
LN_EPS_OUTSIDE = "`LayerNorm` adds eps outside the square root: divide by sqrt(variance + eps)."
LN_EPS_CONST = ("`LayerNorm` uses an eps of its own instead of self.eps: divide by sqrt(variance + self.eps), "
                "the eps it was built with.")
LN_NO_EPS = "`LayerNorm` ignores eps: divide by sqrt(variance + self.eps)."
LN_NO_AFFINE = "`LayerNorm` does not apply its gain and shift: multiply by self.weight, then add self.bias."
LN_WRONG_DIM = "`LayerNorm` normalises over the wrong dimension: use the last one (dim=-1, keepdim=True)."
LN_GRAD = "`LayerNorm`'s gradients differ from nn.LayerNorm's: is part of it detached or computed outside PyTorch?"
LN_HALF = "`LayerNorm` is far from nn.LayerNorm in float16 or bfloat16, or changes the dtype of its input."

FF_GENERIC = "`FeedForward` differs from linear2(dropout(relu(linear1(x))))."
FF_NO_RELU = "`FeedForward` has no ReLU between linear1 and linear2."
FF_RELU_AFTER = "`FeedForward` applies ReLU after linear2 too: the output layer is linear."
FF_SWAPPED = "`FeedForward` applies ReLU before linear1: the order is linear1, ReLU, dropout, linear2."
FF_DROP_EVAL = "`FeedForward` drops units in eval mode: use self.dropout (an nn.Dropout), which eval() turns off."
FF_DROP_PLACE = ("`FeedForward` applies dropout in the wrong place: after the activation, before linear2 "
                 "(so that with p=1 only linear2's bias is left).")
FF_NO_DROP = "`FeedForward` never drops anything in training mode: apply self.dropout after the ReLU."

LAYER_GENERIC = "`{}` differs from the reference with the same weights ({})."
NORM_FIRST_IGNORED = ("`{}` computes the same thing whatever norm_first says: post-LN (norm_first=False) is "
                      "x = norm(x + sublayer(x)); pre-LN (norm_first=True) is x = x + sublayer(norm(x)).")
NORM_FIRST_INVERTED = "`{}` swaps the two norm placements: norm_first=True is pre-LN, x = x + sublayer(norm(x))."
PRE_RESIDUAL_NORMED = ("In pre-LN, `{}` adds the residual after the norm: the residual stream must be the "
                       "un-normalised x, x = x + sublayer(norm(x)), not norm(x) + sublayer(norm(x)).")
PRE_STREAM_NORMED = ("In pre-LN, `{}` also normalises the residual stream: only the sublayer's input is "
                     "normalised, x = x + sublayer(norm(x)), with no norm around the sum.")
POST_NORM_INSIDE = ("In post-LN, `{}` normalises the sublayer's input instead of the sum: post-LN is "
                    "x = norm(x + sublayer(x)).")
MASK_IGNORED = "`{}` ignores {}: pass it to the attention as its mask."
SELF_MASK_IN_CROSS = ("`DecoderLayer` uses the target mask in cross-attention: cross-attention takes "
                      "memory_mask (the source's padding), self-attention tgt_mask.")
CROSS_FROM_X = ("`DecoderLayer`'s cross-attention takes its keys and values from x: they come from memory, "
                "the queries from the target.")
NORMS_SWAPPED = "`DecoderLayer` uses its norms in the wrong order: norm1 for self-attention, norm2 for " \
                "cross-attention, norm3 for the feed-forward network."
ATTN_NO_DROPOUT = ("`DecoderLayer` never drops attention weights in training mode: pass "
                   "dropout_p=self_attn.dropout (0 in eval mode) to scaled_dot_product_attention.")
ATTN_DROP_EVAL = ("`DecoderLayer` drops the self-attention weights in eval mode: pass dropout_p=0.0 when not "
                  "self.training.")
ATTN_DROPOUT_GENERIC = ("`DecoderLayer` in training mode, with dropout only in self-attention, differs from the "
                        "reference: the attention weights are dropped with p = self_attn.dropout when self.training.")
RESID_DROP_EVAL = ("`{}` drops its sublayers' outputs in eval mode too: apply self.dropout (an nn.Dropout, which "
                   "eval() turns off) to each sublayer's output.")
RESID_NO_DROP = ("`{}` never applies its residual dropout in training mode: pass each sublayer's output through "
                 "self.dropout before adding it to x.")
RESID_DROP_GENERIC = ("`{}` in training mode, with dropout only on the sublayers' outputs, differs from the reference: "
                      "each sublayer's output goes through self.dropout before it is added to x.")
CACHE_AXIS = ("`DecoderLayer` grows the cache along the wrong axis: concatenate the earlier keys and values "
              "with the new ones along the positions, dim=2 of (B, H, T, d_head).")
CACHE_ORDER = "`DecoderLayer` puts the new keys and values before the cached ones: the earlier positions come first."
CACHE_IGNORED = ("`DecoderLayer` ignores the cache: the new positions must attend to the cached keys and values "
                 "of the earlier positions, concatenated before their own.")
CACHE_NOT_EXTENDED = ("`DecoderLayer` must return (x, (k_all, v_all)) with the cache extended: k_all holds the "
                      "cached keys followed by the new ones, (B, H, T_past + T_new, d_head).")
CACHE_VALUES = ("`DecoderLayer` returns the wrong keys or values in its cache: k_all = cat(k_past, k_new) with "
                "k_new = split_heads(self_attn.W_k(h)), h the self-attention sublayer's input.")
CAUSAL_LEAK = ("`DecoderLayer`'s output at position t changes when later target positions change under a causal "
               "mask: pass tgt_mask to the self-attention.")
PADDING_LEAK = ("`EncoderLayer`'s outputs at real positions change when the padded positions change: pass "
                "src_mask to the self-attention.")
FIX_PART = " Your {} (part {}) {} too: fix it first."

SRC_MASK_GENERIC = "`make_src_mask` must be True exactly where src != pad_id, shaped (B, 1, 1, S)."
SRC_MASK_INVERTED = "`make_src_mask` is inverted: True marks the real tokens, which may be attended to."
TGT_MASK_GENERIC = ("`make_tgt_mask` must be True where key j <= query i and key j is not padding, shaped "
                    "(B, 1, T, T).")
TGT_NO_PAD = "`make_tgt_mask` is causal but ignores padding: combine it (&) with the padding of the keys."
TGT_NO_CAUSAL = "`make_tgt_mask` masks padding but is not causal: combine it (&) with a lower-triangular mask."
TGT_UPPER = "`make_tgt_mask` is upper-triangular: query i may attend to keys j <= i (tril, not triu)."
TGT_PAD_QUERIES = "`make_tgt_mask` masks the padded queries (rows) instead of the padded keys (columns)."
MASK_PAD_ID = "`{}` ignores pad_id: compare with the pad_id it is given, not 0."

PADDING_CHANGES = ("Padding the source changes the logits: build src_mask with make_src_mask(src) and pass it to the "
                   "encoder layers and, as memory_mask, to the decoder layers.")
MODEL_GENERIC = "`Transformer.{}` differs from the reference with the same weights."
NO_SCALE = "The embeddings are not multiplied by sqrt(d_model) before the positions are added."
SCALE_AFTER = "The positions are scaled by sqrt(d_model) too: scale the embeddings, then add the positions."
FINAL_NORM_MISSING = "In pre-LN the stack's output is not normalised: apply enc_norm to the encoder's output " \
                     "and dec_norm to the decoder's output when norm_first is True."
FINAL_NORM_POST = "In post-LN the final enc_norm and dec_norm must not be applied: the layers end with a norm already."
NO_SRC_MASK_CROSS = "`decode` does not pass src_mask to the decoder layers (as memory_mask): padding leaks into " \
                    "cross-attention."
NO_SRC_MASK_ENC = "`encode` does not pass src_mask to the encoder layers: padding leaks into self-attention."
FWD_NO_CAUSAL = "`forward` does not mask future target positions: build tgt_mask with make_tgt_mask(tgt_in)."
OFFSET_IGNORED = ("`decode` ignores offset: the positions restart at 0 for each new token. Pass it on: "
                  "self.pos(..., offset=offset).")
CACHES_IGNORED = "`decode` does not give each decoder layer its cache: pass caches[i] to layer i."
DECODE_RETURN = "`decode` must return (logits (B, T, tgt_vocab), a list with one (k, v) cache per decoder layer)."
FIX_LAYERS = " Your {} (part {}) is wrong too: fix it first."

GR_TYPE = "`{}` must return a torch.long tensor of token ids (B, L), L <= max_len."
GR_GENERIC = ("`{}` differs from feeding back the argmax of the last position's logits at every step with your "
              "Transformer.")
GR_WITH_SOS = "`{}` returns the sos column: return only the generated tokens, as in exercise 01."
GR_NO_PAD = "`{}` does not fill the positions after a row's eos with pad."
GR_NO_STOP = "`{}` does not stop as soon as every row has produced eos."
GR_EOS_PADDED = ("`{}` replaces a row's eos itself with pad: pad the steps after the one where the row output eos "
                 "(mask with the rows finished before this step, then mark the rows that output eos now).")
GR_FORGETS = ("`{}` forgets that a row has finished: once a row has output eos it stays finished "
              "(finished = finished | (y == eos)), and every later token of it is pad.")
# (row 0 is always one that finishes first: this is also the hint of a decoder that stops when row 0 is finished)
GR_ANY_STOP = "`{}` stops when the first row produces eos: stop when every row has."
GR_STEPS = "`{}` takes one step too few or too many: at most max_len steps, one token each."
GR_FIRST_POS = "`{}` takes the argmax of the first position's logits: the next token comes from the last position."
GR_LEAKY_MASK = ("`{}` builds a causal mask that lets each position see the next one: keep the diagonal and "
                 "below, torch.ones(T, T, dtype=torch.bool).tril() (diagonal 0).")
GR_SPECIAL = "`{}` ignores its sos, eos or pad arguments: use the values passed."
GR_DEVICE = "`{}` gives other tokens on a GPU than on the CPU: create every tensor on src.device."
GR_OFFSET = ("`greedy_decode_cached` feeds every new token at position 0: pass offset=t, the position of the "
             "token fed at step t.")
GR_OFFSET_SHIFT = ("`greedy_decode_cached` feeds each new token one position too far: the token fed at step t "
                   "(sos at step 0) sits at position t: pass offset=t.")
GR_NO_CAUSAL = ("`{}` passes no causal mask: each position then sees the tokens after it, which changes the last "
                "position's logits in the layers after the first; pass tgt_mask = torch.ones(T, T, "
                "dtype=torch.bool).tril().")
GR_CAUSAL_EITHER = ("`{}` passes no causal mask, or one that lets each position see the next one (the two give "
                    "the same tokens here): pass tgt_mask = torch.ones(T, T, dtype=torch.bool).tril() (diagonal 0).")
GR_NO_CACHE = ("`greedy_decode_cached` does not pass the caches of the previous step back in: each step's new "
               "token must attend to the keys and values of all the earlier ones.")
GR_FIRST_CACHE = ("`greedy_decode_cached` passes the first step's caches at every step: pass back the caches that "
                  "the previous step returned, which hold the keys and values of every earlier token.")
GR_PREFIX = ("`greedy_decode_cached` feeds the decoder more than the newest token at a step (tokens of shape {}): "
             "feed only the last token, of shape (B, 1), with offset=t and the caches the previous step returned; "
             "recomputing the prefix is greedy_decode's way.")
GR_CALLS_GONE = ("The checks could not note the calls of your model's decode in the notebook's process: do not "
                 "rebind torch, builtins, setattr or the model's decode.")
GR_NO_SRC_MASK = ("`{}` ignores the source's padding: build src_mask = make_src_mask(src, pad), with the pad it is "
                  "given (the source is padded with pad, not always 0), and pass it to encode and decode.")
GR_UNJUDGED = ("`{}` cannot be judged yet: with your Transformer (part 6) the rows do not finish at different "
               "steps as they do with the reference's, so a decoder that ignores the model could not be told from "
               "a right one. Fix your Transformer first.")


# --- helpers ---------------------------------------------------------------------------------

def _randn(rng, *shape, scale=1.0):
    return torch.randn(*shape, generator=rng, dtype=F64) * scale


def _randint(rng, lo, hi):
    return int(torch.randint(lo, hi + 1, (), generator=rng))


def _tokens(rng, lo, hi, shape):
    return torch.randint(lo, hi + 1, shape, generator=rng)


def _r(t):
    """`t` rounded to float32 and back: the learner's float32 module then holds exactly these values."""
    return t.float().double()


def _state(rng, module):
    """Random float64 weights (float32 values) for `module`'s state dict (or for a state dict): norms near 1,
    everything else small."""
    sd = {}
    for n, p in (module if isinstance(module, dict) else module.state_dict()).items():
        if n.endswith("pe"):
            sd[n] = p.double()
        elif "norm" in n and n.endswith("weight"):
            sd[n] = 1.0 + _randn(rng, *p.shape, scale=0.3)
        elif p.dim() == 1:
            sd[n] = _randn(rng, *p.shape, scale=0.3)
        else:
            sd[n] = _randn(rng, *p.shape, scale=1.2 / math.sqrt(p.shape[-1]))
    return {n: _r(v) for n, v in sd.items()}


def _sub(sd, prefix):
    return {n[len(prefix):]: v for n, v in sd.items() if n.startswith(prefix)}


def _lin(sd, name, x):
    return F.linear(x, sd[f"{name}.weight"], sd[f"{name}.bias"])


class _Parts:
    """LayerNorm, FeedForward and attention for the computations done here: the reference's, or (`learner`
    given) the learner's LayerNorm and FeedForward, run in the worker in float64 with the given weights."""

    def __init__(self, reference, learner=None):
        self.reference, self.learner, self.handles = reference, learner, {}

    def _handle(self, cls, *args):
        key = (cls, *args)
        if key not in self.handles:
            h = getattr(self.learner, cls)(*args)
            h.to(F64)
            h.eval()
            self.handles[key] = h
        return self.handles[key]

    def norm(self, sd, name, x, *, unbiased=False):
        w, b = sd[f"{name}.weight"], sd[f"{name}.bias"]
        if self.learner is None:
            if unbiased:
                mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
                return (x - mean) / torch.sqrt(var + 1e-5) * w + b
            return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        h = self._handle("LayerNorm", x.shape[-1])
        h.load_state_dict({"weight": w, "bias": b})
        return tensor(h(x), "LayerNorm", shape=x.shape)

    def ff(self, sd, name, x):
        if self.learner is None:
            return _lin(sd, f"{name}.linear2", F.relu(_lin(sd, f"{name}.linear1", x)))
        w1 = sd[f"{name}.linear1.weight"]
        h = self._handle("FeedForward", w1.shape[1], w1.shape[0])
        h.load_state_dict(_sub(sd, f"{name}."))
        return tensor(h(x), "FeedForward", shape=x.shape)

    def project(self, sd, name, x, H):
        return self.reference.split_heads(_lin(sd, name, x), H)  # (B, H, T, d_head)

    def mha(self, sd, name, query, key, mask, H):
        q = self.project(sd, f"{name}.W_q", query, H)
        k = self.project(sd, f"{name}.W_k", key, H)
        v = self.project(sd, f"{name}.W_v", key, H)
        out, _ = self.reference.scaled_dot_product_attention(q, k, v, mask)
        return _lin(sd, f"{name}.W_o", self.reference.merge_heads(out))


def _at(mistake, i):
    """The mistake `name` or `name@i` as it applies to sublayer i (None where it does not)."""
    if mistake is None or "@" not in mistake:
        return mistake
    name, where = mistake.split("@")
    return name if where == str(i) else None


def _residual(parts, sd, x, norm, sublayer, norm_first, mistake, i=0):
    """One Add & Norm block around `sublayer` (a function of the normalised or raw input), sublayer `i`.

    The mistake "dropped" is the residual dropout with p = 1 applied: the sublayer adds nothing."""
    mistake = _at(mistake, i)
    n = lambda y: parts.norm(sd, norm, y, unbiased=mistake == "unbiased")  # noqa: E731
    if mistake == "dropped":
        sublayer = (lambda f: lambda h: torch.zeros_like(f(h)))(sublayer)
    pre = norm_first != (mistake == "inverted") if mistake != "ignored" else False
    if pre:
        h = n(x)
        if mistake == "pre_residual_normed":
            return h + sublayer(h)
        if mistake == "pre_stream_normed":
            return n(x + sublayer(h))
        return x + sublayer(h)
    if mistake == "post_norm_inside":
        return x + sublayer(n(x))
    return n(x + sublayer(x))


def _encoder(parts, sd, x, mask, H, norm_first, mistake=None):
    """The encoder layer, computed here; `mistake` names a typical mistake."""
    attn_mask = None if mistake == "mask_ignored" else mask
    x = _residual(parts, sd, x, "norm1", lambda h: parts.mha(sd, "self_attn", h, h, attn_mask, H), norm_first,
                  mistake, 0)
    return _residual(parts, sd, x, "norm2", lambda h: parts.ff(sd, "ff", h), norm_first, mistake, 1)


def _decoder(parts, sd, x, memory, tgt_mask, memory_mask, cache, H, norm_first, mistake=None):
    """(x, (k_all, v_all)) of the decoder layer, computed here; `mistake` names a typical mistake."""
    kv = {}

    def self_attn(h):
        q = parts.project(sd, "self_attn.W_q", h, H)
        k = parts.project(sd, "self_attn.W_k", h, H)
        v = parts.project(sd, "self_attn.W_v", h, H)
        if cache is not None and mistake != "cache_ignored":
            if mistake == "cache_order":
                k, v = torch.cat([k, cache[0]], 2), torch.cat([v, cache[1]], 2)
            else:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)  # (B, H, T_all, d_head)
        kv["k"], kv["v"] = k, v
        mask = None if mistake == "tgt_mask_ignored" else tgt_mask
        out, _ = parts.reference.scaled_dot_product_attention(q, k, v, mask)
        if mistake == "weights_dropped":  # dropout 1 on the attention weights: nothing reaches W_o but its bias
            out = torch.zeros_like(out)
        return _lin(sd, "self_attn.W_o", parts.reference.merge_heads(out))

    def cross_attn(h):
        mask = {"memory_mask_ignored": None, "self_mask_in_cross": tgt_mask}.get(mistake, memory_mask)
        source = h if mistake == "cross_from_x" else memory
        return parts.mha(sd, "cross_attn", h, source, mask, H)

    norms = ("norm2", "norm1", "norm3") if mistake == "norms_swapped" else ("norm1", "norm2", "norm3")
    x = _residual(parts, sd, x, norms[0], self_attn, norm_first, mistake, 0)
    x = _residual(parts, sd, x, norms[1], cross_attn, norm_first, mistake, 1)
    x = _residual(parts, sd, x, norms[2], lambda h: parts.ff(sd, "ff", h), norm_first, mistake, 2)
    return x, (kv["k"], kv["v"])


PLACEMENT = ["pre_residual_normed", "pre_stream_normed", "post_norm_inside"]
COMMON = (["ignored", "inverted"] + PLACEMENT + [f"{m}@{i}" for m in PLACEMENT for i in range(3)])
COMMON_HINTS = {"ignored": NORM_FIRST_IGNORED, "inverted": NORM_FIRST_INVERTED,
                "pre_residual_normed": PRE_RESIDUAL_NORMED, "pre_stream_normed": PRE_STREAM_NORMED,
                "post_norm_inside": POST_NORM_INSIDE, "unbiased": LN_UNBIASED, "dropped": RESID_DROP_EVAL}


WRONG, TRIVIAL = "is wrong", "does nothing (it returns its input, or zeros)"


def _parts_trouble(learner, reference, rng, D, d_ff):
    """[(name, part, what)] for the learner's LayerNorm and FeedForward that are wrong or cannot run.

    A wrong part is WRONG, or TRIVIAL where it returns its input or zeros: a layer is judged with the
    learner's own WRONG parts, never with TRIVIAL ones (a layer that skips them would give the same). The
    FeedForward is built with dropout 1 and run in eval mode: one that drops units in eval mode is wrong."""
    trouble = []
    x = _randn(rng, 2, 3, D)
    ln, ff = reference.LayerNorm(D), reference.FeedForward(D, d_ff)
    for cls, part, ref in (("LayerNorm", 1, ln), ("FeedForward", 2, ff)):
        sd = _state(rng, ref)
        ref.load_state_dict(sd)
        try:
            h = getattr(learner, cls)(*((D,) if cls == "LayerNorm" else (D, d_ff, 1.0)))
            if not isinstance(h, RemoteObject):
                trouble.append((cls, part, "does not build a module"))
                continue
            h.to(F64)
            h.eval()
            h.load_state_dict(sd)
            got = h(x)
        except NotImplementedRemote:
            trouble.append((cls, part, "is not implemented yet"))
            continue
        except (LearnerError, MissingName):
            trouble.append((cls, part, "fails"))
            continue
        if not close(got, ref.double()(x).detach()):
            trivial = close(got, x) or close(got, torch.zeros_like(x))
            trouble.append((cls, part, TRIVIAL if trivial else WRONG))
    return trouble


def _fix_parts(trouble):
    """The hint's ending that asks to fix the learner's wrong LayerNorm or FeedForward first."""
    return "".join(FIX_PART.format(n, p, w) for n, p, w in trouble if w in (WRONG, TRIVIAL))


class _Layer:
    """The learner's EncoderLayer or DecoderLayer (a handle, float64, eval mode) holding random weights that
    the computations here use too."""

    def __init__(self, learner, reference, rng, kind, D, H, d_ff, norm_first, dropout=0.0):
        self.kind, self.D, self.H, self.d_ff, self.norm_first = kind, D, H, d_ff, norm_first
        ref = getattr(reference, kind)(D, H, d_ff, dropout, norm_first)
        self.sd = _state(rng, ref)
        ref.load_state_dict(self.sd)
        self.mod = learner_module(learner, kind, ref, D, H, d_ff, dropout, norm_first)
        self.mod.to(F64)
        self.mod.eval()
        self.learner, self.reference, self.rng = learner, reference, rng
        self.trouble = None  # found when needed

    def compute(self, parts, *args, mistake=None):
        if self.kind == "EncoderLayer":
            return _encoder(parts, self.sd, *(args + (None,))[:2], self.H, self.norm_first, mistake)
        return _decoder(parts, self.sd, *args, self.H, self.norm_first, mistake)

    def _trouble(self):
        if self.trouble is None:
            self.trouble = _parts_trouble(self.learner, self.reference, self.rng, self.D, self.d_ff)
        return self.trouble

    def run(self, *args):
        """The learner's result, checked for type and shape; a failure caused by an unfinished part says so."""
        try:
            got = self.mod(*args)
        except (LearnerError, NotImplementedRemote) as failure:
            broken = [t for t in self._trouble() if t[2] not in (WRONG, TRIVIAL)]
            if broken:
                name, part, what = broken[0]
                if isinstance(failure, NotImplementedRemote) and what == "is not implemented yet":
                    raise Hint(f"`{self.kind}` cannot run: it, or your {name} (part {part}), which it uses, is not "
                               "implemented yet.") from None
                raise Hint(f"`{self.kind}` cannot run: your {name} (part {part}), which it uses, {what}. Fix it "
                           "first.") from None
            if (isinstance(failure, LearnerError) and self.kind == "DecoderLayer"
                    and self._runs_with_equal_lengths(*args)):
                raise Hint(SELF_MASK_IN_CROSS) from None
            raise
        x = args[0]
        if self.kind == "EncoderLayer":
            return tensor(got, "EncoderLayer", shape=x.shape, dtype=F64, what="its output (B, S, D)")
        expect(isinstance(got, (tuple, list)) and len(got) == 2, "`DecoderLayer` must return a pair (x, cache).")
        out, cache = got
        tensor(out, "DecoderLayer", shape=x.shape, dtype=F64, what="its output (B, T_new, D)")
        expect(isinstance(cache, (tuple, list)) and len(cache) == 2, CACHE_NOT_EXTENDED)
        return out, tuple(cache)

    def _runs_with_equal_lengths(self, x, memory, tgt_mask, memory_mask, cache):
        """Whether the failing call runs when memory is as long as the keys of self-attention (a target mask
        used in cross-attention fails only when the lengths differ)."""
        T_all = x.shape[1] + (0 if cache is None else cache[0].shape[2])
        if tgt_mask is None or memory.shape[1] == T_all:
            return False
        mem = _randn(self.rng, memory.shape[0], T_all, memory.shape[2])
        try:
            self.mod(x, mem, tgt_mask, None, cache)
        except (LearnerError, NotImplementedRemote):
            return False
        return True

    def check(self, *args, mistakes=(), got=None, what="its output", expected=None):
        """Pass when the learner's result is the reference's, or what the learner's own LayerNorm and
        FeedForward give; fail with the matching mistake's hint otherwise."""
        got = self.run(*args) if got is None else got
        ref_parts = _Parts(self.reference)
        expected = self.compute(ref_parts, *args) if expected is None else expected
        out = got if self.kind == "EncoderLayer" else got[0]
        exp_out = expected if self.kind == "EncoderLayer" else expected[0]
        if close(out, exp_out):
            return got
        trouble = [t for t in self._trouble() if t[2] == WRONG]
        parts = _Parts(self.reference, self.learner) if trouble else ref_parts
        if trouble:
            mine = self.compute(parts, *args)
            if close(out, mine if self.kind == "EncoderLayer" else mine[0]):
                return got
        also = _fix_parts(self._trouble())
        table = []
        for m in mistakes:
            if self.kind == "DecoderLayer" and not _applies(m, self.H, *args):
                continue
            hint = COMMON_HINTS.get(m.split("@")[0])
            hint = hint.format(self.kind) if hint and "{}" in hint else hint
            r = (lambda m=m: self.compute(parts, *args, mistake=m))
            table.append((hint or MISTAKE_HINTS[m], (lambda r=r: r() if self.kind == "EncoderLayer" else r()[0])))
        generic = LAYER_GENERIC.format(self.kind, what)
        raise Hint(diagnose(out, table, generic, same=lambda a, b: close(a, b, rtol=1e-6, atol=1e-8)) + also)


def _fits(mask, scores_shape):
    """Whether `mask` broadcasts to attention scores of `scores_shape` (B, H, T_q, T_k)."""
    if mask is None:
        return True
    try:
        return broadcast_shape(tuple(mask.shape), scores_shape) == tuple(scores_shape)
    except RuntimeError:
        return False


def _applies(mistake, H, x, memory=None, tgt_mask=None, memory_mask=None, cache=None):
    """Whether a typical mistake can run on these inputs: made with masks that do not fit its scores, it fails
    in the learner's code too, so there is nothing to compare with."""
    B, T = x.shape[0], x.shape[1]
    if mistake == "self_mask_in_cross":
        return _fits(tgt_mask, (B, H, T, memory.shape[1]))
    if mistake == "cross_from_x":
        return _fits(memory_mask, (B, H, T, T))
    if mistake == "cache_ignored":
        return _fits(tgt_mask, (B, H, T, T))
    return True


MISTAKE_HINTS = {
    "mask_ignored": MASK_IGNORED.format("EncoderLayer", "src_mask"),
    "tgt_mask_ignored": MASK_IGNORED.format("DecoderLayer", "tgt_mask in self-attention"),
    "memory_mask_ignored": MASK_IGNORED.format("DecoderLayer", "memory_mask in cross-attention"),
    "self_mask_in_cross": SELF_MASK_IN_CROSS,
    "cross_from_x": CROSS_FROM_X,
    "norms_swapped": NORMS_SWAPPED,
    "cache_order": CACHE_ORDER,
    "cache_ignored": CACHE_IGNORED,
    "weights_dropped": ATTN_DROP_EVAL,
}
ENC_MISTAKES = COMMON + ["mask_ignored"]
DEC_MISTAKES = COMMON + ["tgt_mask_ignored", "memory_mask_ignored", "self_mask_in_cross", "cross_from_x",
                         "norms_swapped", "weights_dropped"]


# --- Part 1: LayerNorm (3 points) ------------------------------------------------------------

def _ln_case(learner, reference, rng, D, dtype=F64, eps=None):
    args = (D,) if eps is None else (D, eps)
    ref = reference.LayerNorm(*args)
    sd = {"weight": _r(1.0 + _randn(rng, D, scale=0.3)), "bias": _r(_randn(rng, D, scale=0.3))}
    ref.load_state_dict(sd)
    h = learner_module(learner, "LayerNorm", ref, *args)
    h.to(dtype)
    return h, sd


def _ln_mistakes(x, w, b, eps=1e-5):
    D = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    # An eps of the learner's own (a constant written in place of self.eps).
    own_eps = [(LN_EPS_CONST, (lambda e=e: (x - mean) / torch.sqrt(var + e) * w + b))
               for e in (1e-5, 1e-6, 1e-8, 1e-12, 1e-3) if e != eps]
    return [
        (LN_UNBIASED, lambda: (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b),
        *own_eps,
        (LN_EPS_OUTSIDE, lambda: (x - mean) / (var.sqrt() + eps) * w + b),
        (LN_NO_EPS, lambda: (x - mean) / var.sqrt() * w + b),
        (LN_NO_AFFINE, lambda: F.layer_norm(x, (D,), eps=eps)),
        (LN_WRONG_DIM, lambda: ((x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, unbiased=False, keepdim=True)
                                                                            + eps) * w + b) if x.dim() > 1 else None),
    ]


def _ln_hint(got, x, sd, dtype=F64, eps=1e-5):
    """The hint for a LayerNorm output `got` of input `x` (float64, rounded to `dtype` for the learner).

    In float64 the eps mistakes differ from each other by about 1e-5 of the output: they are told apart
    at float64's tolerance; in float32 only the coarser mistakes can be."""
    x = x.to(dtype).double()
    same = (lambda a, b: close(a, b)) if dtype == F64 else (lambda a, b: close(a, b.to(a.dtype), rtol=1e-3,
                                                                               atol=1e-4))
    table = _ln_mistakes(x, sd["weight"], sd["bias"], eps)
    if dtype != F64:  # too close to the right result in float32 to be told apart from each other
        table = [(h, r) for h, r in table if h not in (LN_EPS_CONST, LN_EPS_OUTSIDE)]
    return diagnose(got, table, LN_GENERIC, same=same)


@points(1.5, part="layer_norm")
def test_layer_norm_matches_torch(learner, reference, rng):
    """Does LayerNorm compute what nn.LayerNorm computes, for any leading shape, in float32 and float64?"""
    for shape, dtype in (((2, 3, 8), F64), ((5, 16), F64), ((2, 2, 3, 4), F32), ((7, 6), F32)):
        D = shape[-1]
        h, sd = _ln_case(learner, reference, rng, D, dtype)
        # Features of very different sizes: the eps and the variance's divisor show.
        x = _randn(rng, *shape) * (0.05 + 3 * torch.rand(shape[:-1] + (1,), generator=rng, dtype=F64))
        x[..., 0] += 2.0
        got = tensor(h(x.to(dtype)), "LayerNorm", shape=shape, dtype=dtype, what="its output")
        expected = F.layer_norm(x, (D,), sd["weight"], sd["bias"], 1e-5)
        if not close(got, expected.to(dtype)):
            raise Hint(_ln_hint(got, x, sd, dtype))
    # A small variance: eps matters, the default one and one given to the constructor.
    for eps in (None, 1e-3):
        h, sd = _ln_case(learner, reference, rng, 4, eps=eps)
        x = 1e-3 * _randn(rng, 3, 4)
        got = tensor(h(x), "LayerNorm", shape=(3, 4), dtype=F64)
        expected = F.layer_norm(x, (4,), sd["weight"], sd["bias"], eps or 1e-5)
        if not close(got, expected):
            raise Hint(_ln_hint(got, x, sd, eps=eps or 1e-5))


@points(1, part="layer_norm")
def test_layer_norm_gradients(learner, reference, rng):
    """Do LayerNorm's gradients (input, weight, bias) match nn.LayerNorm's?"""
    D = 6
    h, sd = _ln_case(learner, reference, rng, D)
    x = _randn(rng, 3, 4, D, scale=2.0)
    got = tensor(h(x), "LayerNorm", shape=x.shape, dtype=F64)
    if not close(got, F.layer_norm(x, (D,), sd["weight"], sd["bias"], 1e-5)):
        raise Hint(_ln_hint(got, x, sd))
    cot = _randn(rng, *x.shape)
    res = learner_grads(learner, h, x, cotangents=(cot,), params=True, what="LayerNorm")
    xs = x.clone().requires_grad_(True)
    w, b = sd["weight"].clone().requires_grad_(True), sd["bias"].clone().requires_grad_(True)
    expected = vjp(F.layer_norm(xs, (D,), w, b, 1e-5), [xs, w, b], cot)
    got = [res.arg_grads[0] if res.arg_grads else None, res.param_grads.get("weight"), res.param_grads.get("bias")]
    expect_grads(got, expected, ["the input", "weight", "bias"], hint=LN_GRAD)


@points(0.5, part="layer_norm")
def test_layer_norm_half_precision_and_devices(learner, reference, rng):
    """Does LayerNorm keep float16 and bfloat16 inputs in their dtype, close to nn.LayerNorm, on any device?"""
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 6e-2)):
        h, sd = _ln_case(learner, reference, rng, 4, dtype)
        x = _randn(rng, 2, 5, 4).to(dtype)
        got = tensor(h(x), "LayerNorm", shape=(2, 5, 4), dtype=dtype, what="its output")
        expected = F.layer_norm(x.double(), (4,), sd["weight"].to(dtype).double(), sd["bias"].to(dtype).double(), 1e-5)
        expect(close(got, expected.to(dtype), rtol=tol, atol=tol), LN_HALF)
    on_meta = module(learner.LayerNorm(8), "LayerNorm")
    on_meta.to("meta")
    expect_device_agnostic(learner, on_meta, _randn(rng, 2, 5, 8).float())


# --- Part 2: FeedForward (2 points) ----------------------------------------------------------

def _ff_case(learner, reference, rng, D, d_ff, dropout=0.0):
    ref = reference.FeedForward(D, d_ff, dropout)
    sd = _state(rng, ref)
    ref.load_state_dict(sd)
    h = learner_module(learner, "FeedForward", ref, D, d_ff, dropout)
    h.to(F64)
    return h, sd


@points(1, part="feed_forward")
def test_feed_forward_matches_reference(learner, reference, rng):
    """Does FeedForward compute linear2(relu(linear1(x))) at every position, for any leading shape?"""
    for shape, d_ff in (((2, 3, 8), 16), ((4, 6), 12), ((2, 2, 2, 4), 8)):
        h, sd = _ff_case(learner, reference, rng, shape[-1], d_ff)
        h.eval()
        x = _randn(rng, *shape)
        got = tensor(h(x), "FeedForward", shape=shape, dtype=F64, what="its output")
        l1 = lambda y: _lin(sd, "linear1", y)  # noqa: E731
        l2 = lambda y: _lin(sd, "linear2", y)  # noqa: E731
        if not close(got, l2(F.relu(l1(x)))):
            raise Hint(diagnose(got, [(FF_NO_RELU, lambda: l2(l1(x))),
                                      (FF_RELU_AFTER, lambda: F.relu(l2(F.relu(l1(x))))),
                                      (FF_SWAPPED, lambda: l2(l1(F.relu(x))))], FF_GENERIC))


@points(1, part="feed_forward")
def test_feed_forward_dropout(learner, reference, rng):
    """Does FeedForward drop units after the activation in training mode only?"""
    D, d_ff = 6, 12
    h, sd = _ff_case(learner, reference, rng, D, d_ff, dropout=1.0)
    x = _randn(rng, 3, 4, D)
    h.eval()
    got = tensor(h(x), "FeedForward", shape=x.shape, dtype=F64)
    # In eval mode the values of the network itself (not only the same as with p = 0: a property of the
    # learner's own network would pay for a wrong one).
    l1 = lambda y: _lin(sd, "linear1", y)  # noqa: E731
    l2 = lambda y: _lin(sd, "linear2", y)  # noqa: E731
    if not close(got, l2(F.relu(l1(x)))):
        raise Hint(diagnose(got, [(FF_DROP_EVAL, sd["linear2.bias"].expand(x.shape)),
                                  (FF_NO_RELU, lambda: l2(l1(x))),
                                  (FF_RELU_AFTER, lambda: F.relu(l2(F.relu(l1(x))))),
                                  (FF_SWAPPED, lambda: l2(l1(F.relu(x))))], FF_GENERIC))
    # With p = 1 every hidden unit is dropped: only linear2's bias is left.
    h.train()
    got = tensor(h(x), "FeedForward", shape=x.shape, dtype=F64)
    if not close(got, sd["linear2.bias"].expand(x.shape)):
        raise Hint(diagnose(got, [(FF_NO_DROP, _lin(sd, "linear2", F.relu(_lin(sd, "linear1", x))))],
                            FF_DROP_PLACE))
    h2, sd2 = _ff_case(learner, reference, rng, D, d_ff, dropout=0.5)
    h2.train()
    a, b = h2(x), h2(x)
    expect(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not torch.equal(a, b), FF_NO_DROP)


# --- Part 3: EncoderLayer (5 points) ---------------------------------------------------------

def _pad_mask(rng, B, S):
    """A padding mask (B, 1, 1, S): every row keeps at least one position, some lose a tail."""
    lengths = [S] + [_randint(rng, 1, S) for _ in range(B - 1)]
    return torch.stack([torch.arange(S) < n for n in lengths])[:, None, None, :], lengths


@points(2, part="encoder_layer")
def test_encoder_layer_matches_reference(learner, reference, rng):
    """Does EncoderLayer compute post-LN and pre-LN Add & Norm around self-attention and the feed-forward network?"""
    for norm_first in (False, True):
        for D, H, d_ff in ((8, 2, 16), (12, 3, 20)):
            layer = _Layer(learner, reference, rng, "EncoderLayer", D, H, d_ff, norm_first)
            x = _randn(rng, 2, 5, D, scale=1.5)
            layer.check(x, mistakes=ENC_MISTAKES, what=f"norm_first={norm_first}, no mask")
            mask, _ = _pad_mask(rng, 3, 6)
            x = _randn(rng, 3, 6, D, scale=1.5)
            layer.check(x, mask, mistakes=ENC_MISTAKES, what=f"norm_first={norm_first}, padding mask")


@points(1, part="encoder_layer")
def test_encoder_layer_masks(learner, reference, rng):
    """Does EncoderLayer apply any mask broadcastable to (B, H, S, S), fully masked rows included?"""
    for norm_first in (False, True):
        layer = _Layer(learner, reference, rng, "EncoderLayer", 8, 2, 16, norm_first)
        x = _randn(rng, 2, 5, 8)
        for mask in (random_mask(rng, (2, 1, 5, 5), fully_masked=2), random_mask(rng, (2, 2, 5, 5), fully_masked=1),
                     random_mask(rng, (5, 5))):
            layer.check(x, mask, mistakes=ENC_MISTAKES, what="a mask with fully masked rows")


def _torch_encoder(rng, D, H, d_ff, norm_first):
    theirs = torch.nn.TransformerEncoderLayer(D, H, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first)
    theirs = theirs.double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(_randn(rng, *p.shape, scale=0.4))
        theirs.norm1.weight.add_(1.0)
        theirs.norm2.weight.add_(1.0)
    return theirs


def _ours_from_torch(theirs):
    """Their state dict under our parameter names."""
    a = theirs.self_attn
    sd = {}
    for name, w, b in zip(("W_q", "W_k", "W_v"), a.in_proj_weight.chunk(3), a.in_proj_bias.chunk(3)):
        sd[f"self_attn.{name}.weight"], sd[f"self_attn.{name}.bias"] = w, b
    sd["self_attn.W_o.weight"], sd["self_attn.W_o.bias"] = a.out_proj.weight, a.out_proj.bias
    for ours, mod in (("ff.linear1", theirs.linear1), ("ff.linear2", theirs.linear2), ("norm1", theirs.norm1),
                      ("norm2", theirs.norm2)):
        sd[f"{ours}.weight"], sd[f"{ours}.bias"] = mod.weight, mod.bias
    return {n: v.detach().clone() for n, v in sd.items()}


@points(1, part="encoder_layer")
def test_encoder_layer_matches_torch(learner, reference, rng):
    """Given the same weights, does EncoderLayer agree with nn.TransformerEncoderLayer (both norm placements)?"""
    D, H, d_ff = 8, 2, 16
    for norm_first in (False, True):
        theirs = _torch_encoder(rng, D, H, d_ff, norm_first)
        layer = _Layer(learner, reference, rng, "EncoderLayer", D, H, d_ff, norm_first)
        layer.sd = _ours_from_torch(theirs)
        layer.mod.load_state_dict(layer.sd)
        x = _randn(rng, 3, 6, D)
        mask, _ = _pad_mask(rng, 3, 6)
        for m in (None, mask):
            # The padding as their src_mask (True = may not attend), one (S, S) per batch row and head: the
            # same attention as src_key_padding_mask, whose check imports sympy on first use (0.3 s).
            kw = {} if m is None else {"src_mask": (~m[:, 0]).expand(-1, x.shape[1], -1).repeat_interleave(H, 0)}
            expected = theirs(x, **kw).detach()
            args = (x,) if m is None else (x, m)
            layer.check(*args, expected=expected, mistakes=ENC_MISTAKES,
                        what=f"nn.TransformerEncoderLayer, norm_first={norm_first}")


@points(0.5, part="encoder_layer")
def test_encoder_layer_padding_changes_nothing(learner, reference, rng):
    """Do the real positions' outputs stay the same whatever the padded positions hold?"""
    for norm_first in (False, True):
        layer = _Layer(learner, reference, rng, "EncoderLayer", 8, 2, 16, norm_first)
        mask, lengths = _pad_mask(rng, 3, 6)
        x = _randn(rng, 3, 6, 8)
        out = layer.check(x, mask, mistakes=ENC_MISTAKES, what="padding mask")
        x2 = x.clone()
        for i, n in enumerate(lengths):
            x2[i, n:] = _randn(rng, 6 - n, 8, scale=5.0)
        out2 = layer.run(x2, mask)
        for i, n in enumerate(lengths):
            expect(close(out2[i, :n], out[i, :n]), PADDING_LEAK)


def _check_residual_dropout(learner, reference, rng, kind, norm_first):
    """The layer built with dropout 1. In eval mode it must give the values of dropout 0. In training mode, with
    its attention and feed-forward modules kept in eval mode, self.dropout drops each sublayer's whole output:
    every sublayer adds nothing (the eval values come first: a layer that does nothing gives x in pre-LN)."""
    layer = _Layer(learner, reference, rng, kind, 8, 2, 16, norm_first, dropout=1.0)
    if kind == "EncoderLayer":
        mask, _ = _pad_mask(rng, 2, 5)
        args, mistakes, subs = (_randn(rng, 2, 5, 8, scale=1.5), mask), ENC_MISTAKES, ("self_attn", "ff")
    else:
        x, memory, mem_mask = _dec_inputs(rng, 2, 4, 3, 8)
        args, mistakes, subs = (x, memory, _causal(4), mem_mask, None), DEC_MISTAKES, ("self_attn", "cross_attn", "ff")
    layer.check(*args, mistakes=mistakes + ["dropped"], what="dropout=1.0 in eval mode")
    layer.mod.train()
    for name in subs:
        submodule(layer.mod, name, name=kind).eval()
    first = (lambda r: r) if kind == "EncoderLayer" else (lambda r: r[0])
    out = first(layer.run(*args))
    if close(out, first(layer.compute(_Parts(reference), *args, mistake="dropped"))):
        return
    trouble = [t for t in layer._trouble() if t[2] == WRONG]
    parts = _Parts(reference, learner) if trouble else _Parts(reference)
    if trouble and close(out, first(layer.compute(parts, *args, mistake="dropped"))):
        return
    # In training mode the decoder's self-attention weights are dropped too (p = 1): W_o's bias is left.
    undropped = "weights_dropped" if kind == "DecoderLayer" else None
    raise Hint(diagnose(out, [(RESID_NO_DROP.format(kind), lambda: first(layer.compute(parts, *args,
                                                                                       mistake=undropped)))],
                        RESID_DROP_GENERIC.format(kind), same=lambda a, b: close(a, b, rtol=1e-6, atol=1e-8))
               + _fix_parts(layer._trouble()))


@points(0.5, part="encoder_layer")
def test_encoder_layer_dropout(learner, reference, rng):
    """Does EncoderLayer drop its sublayers' outputs (self.dropout) in training mode, and only then?"""
    for norm_first in (False, True):
        _check_residual_dropout(learner, reference, rng, "EncoderLayer", norm_first)


# --- Part 4: DecoderLayer (6 points) ---------------------------------------------------------

def _causal(T, past=0):
    return torch.ones(T, past + T, dtype=torch.bool).tril(diagonal=past)  # (T, past + T)


def _leaky(T):
    """A causal mask with a typical mistake: each position also sees the next one (tril(diagonal=1))."""
    return torch.ones(T, T, dtype=torch.bool).tril(diagonal=1)


def _check_cache(layer, got, expected):
    """The returned cache must be the reference's (k_all, v_all), given that the output was right."""
    k, v = got[1]
    ek, ev = expected[1]
    for t, e in ((k, ek), (v, ev)):
        expect(isinstance(t, torch.Tensor), CACHE_NOT_EXTENDED)
        if tuple(t.shape) != tuple(e.shape):
            raise Hint(CACHE_AXIS if t.numel() == e.numel() else CACHE_NOT_EXTENDED)
    if close(k, ek) and close(v, ev):
        return
    # With the learner's own (wrong) LayerNorm in pre-LN the keys differ: accept what those give.
    raise Hint(CACHE_VALUES + _fix_parts(layer._trouble()))


def _dec_inputs(rng, B, T, S, D):
    x, memory = _randn(rng, B, T, D, scale=1.5), _randn(rng, B, S, D, scale=1.5)
    mem_mask, _ = _pad_mask(rng, B, S)
    return x, memory, mem_mask


def _cache_ok(layer, got, args):
    """Check the cache against the reference's, or against the one the learner's own parts give."""
    trouble = [t for t in layer._trouble() if t[2] == WRONG]
    parts = _Parts(layer.reference, layer.learner) if trouble else _Parts(layer.reference)
    if args[4] is not None:
        k, v = got[1]
        wrong = layer.compute(parts, *args, mistake="cache_order")[1]
        expect(not (close(k, wrong[0]) and close(v, wrong[1])), CACHE_ORDER)
    _check_cache(layer, got, layer.compute(parts, *args))


@points(1, part="decoder_layer")
def test_decoder_layer_matches_reference(learner, reference, rng):
    """Does DecoderLayer do self-attention, cross-attention and the feed-forward net with Add & Norm?"""
    for norm_first in (False, True):
        for D, H, d_ff, T, S in ((8, 2, 16, 5, 5), (12, 3, 20, 4, 6)):
            layer = _Layer(learner, reference, rng, "DecoderLayer", D, H, d_ff, norm_first)
            x, memory, mem_mask = _dec_inputs(rng, 2, T, S, D)
            # With T == S a target mask in cross-attention runs (and is caught); with T != S it fails.
            args = (x, memory, _causal(T), mem_mask if T != S else _causal(T) & mem_mask, None)
            got = layer.check(*args, mistakes=DEC_MISTAKES, what=f"norm_first={norm_first}, causal and padding masks")
            _cache_ok(layer, got, args)


def _check_attention_dropout(learner, reference, rng, norm_first):
    """In training mode with p = 1 every attention weight of self-attention is dropped, so that sublayer gives
    W_o's bias; the residual dropout, cross-attention and the feed-forward network are kept in eval mode so that
    only the self-attention's dropout shows."""
    layer = _Layer(learner, reference, rng, "DecoderLayer", 8, 2, 16, norm_first, dropout=1.0)
    layer.mod.train()
    for name in ("dropout", "cross_attn", "ff"):
        submodule(layer.mod, name, name="DecoderLayer").eval()
    x, memory, mem_mask = _dec_inputs(rng, 2, 4, 3, 8)
    args = (x, memory, _causal(4), mem_mask, None)
    out = layer.run(*args)[0]
    if close(out, layer.compute(_Parts(reference), *args, mistake="weights_dropped")[0]):
        return
    trouble = [t for t in layer._trouble() if t[2] == WRONG]
    parts = _Parts(reference, learner) if trouble else _Parts(reference)
    if trouble and close(out, layer.compute(parts, *args, mistake="weights_dropped")[0]):
        return
    raise Hint(diagnose(out, [(ATTN_NO_DROPOUT, lambda: layer.compute(parts, *args)[0])], ATTN_DROPOUT_GENERIC,
                        same=lambda a, b: close(a, b, rtol=1e-6, atol=1e-8)) + _fix_parts(layer._trouble()))


@points(1, part="decoder_layer")
def test_decoder_layer_dropout(learner, reference, rng):
    """Does DecoderLayer drop its sublayers' outputs and its self-attention weights in training mode, and only then?"""
    for norm_first in (False, True):
        _check_residual_dropout(learner, reference, rng, "DecoderLayer", norm_first)
        _check_attention_dropout(learner, reference, rng, norm_first)


@points(1, part="decoder_layer")
def test_decoder_layer_masks(learner, reference, rng):
    """Does DecoderLayer apply tgt_mask and memory_mask of any broadcastable shape, fully masked rows included?"""
    for norm_first in (False, True):
        layer = _Layer(learner, reference, rng, "DecoderLayer", 8, 2, 16, norm_first)
        x, memory, _ = _dec_inputs(rng, 2, 4, 6, 8)
        for tm, mm in ((random_mask(rng, (2, 1, 4, 4), fully_masked=2), random_mask(rng, (2, 1, 4, 6), fully_masked=1)),
                       (random_mask(rng, (4, 4)), random_mask(rng, (2, 2, 1, 6))), (None, None)):
            layer.check(x, memory, tm, mm, None, mistakes=DEC_MISTAKES, what="masks with fully masked rows")


@points(2, part="decoder_layer")
def test_decoder_layer_cache(learner, reference, rng):
    """With a cache, does DecoderLayer give the whole sequence's outputs and return the cache extended?"""
    for norm_first in (False, True):
        D, H, T, S = 8, 2, 5, 4
        layer = _Layer(learner, reference, rng, "DecoderLayer", D, H, 16, norm_first)
        x, memory, mem_mask = _dec_inputs(rng, 3, T, S, D)
        full = layer.check(x, memory, _causal(T), mem_mask, None, mistakes=DEC_MISTAKES, what="the whole sequence")
        _cache_ok(layer, full, (x, memory, _causal(T), mem_mask, None))
        # One position at a time, then the last two positions at once on top of a cache of three.
        cache, outs = None, []
        for t in range(T):
            args = (x[:, t:t + 1], memory, None, mem_mask, cache)
            try:
                got = layer.run(*args)
            except LearnerError:
                if t > 0:
                    raise Hint(CACHE_AXIS) from None
                raise
            layer.check(*args, got=got, mistakes=["cache_order", "cache_ignored"], what="one new position and a cache")
            _cache_ok(layer, got, args)
            cache = got[1]
            outs.append(got[0])
        expect(close(torch.cat(outs, 1), full[0]), CACHE_IGNORED)
        past = (full[1][0][:, :, :3].contiguous(), full[1][1][:, :, :3].contiguous())
        args = (x[:, 3:], memory, _causal(2, past=3), mem_mask, past)
        try:
            got = layer.run(*args)
        except LearnerError:
            raise Hint(CACHE_AXIS) from None
        layer.check(*args, got=got, mistakes=["cache_order", "cache_ignored"], what="two new positions and a cache")
        expect(close(got[0], full[0][:, 3:]), CACHE_IGNORED)
        expect(tuple(got[1][0].shape) == (3, H, T, D // H), CACHE_NOT_EXTENDED)


@points(1, part="decoder_layer")
def test_decoder_layer_is_causal(learner, reference, rng):
    """Under a causal mask, does the output at position t stay the same when later target positions change?"""
    for norm_first in (False, True):
        layer = _Layer(learner, reference, rng, "DecoderLayer", 8, 2, 16, norm_first)
        x, memory, mem_mask = _dec_inputs(rng, 2, 5, 4, 8)
        got = layer.check(x, memory, _causal(5), mem_mask, None, mistakes=DEC_MISTAKES, what="a causal mask")
        for t in (1, 3):
            x2 = x.clone()
            x2[:, t + 1:] = _randn(rng, 2, 4 - t, 8, scale=3.0)
            got2 = layer.run(x2, memory, _causal(5), mem_mask, None)
            expect(close(got2[0][:, :t + 1], got[0][:, :t + 1]), CAUSAL_LEAK)


# --- Part 5: masks (2 points) ----------------------------------------------------------------

def _padded_tokens(rng, B, T, pad=PAD, lo=3, hi=8, avoid=()):
    """Token ids (B, T): real ones drawn from lo .. hi but never pad nor an id of `avoid`, every row but the first
    padded from a random length on, the last one always."""
    real = torch.tensor([t for t in range(lo, hi + 1) if t != pad and t not in avoid])
    toks = real[torch.randint(len(real), (B, T), generator=rng)]
    for i in range(1, B):
        n = _randint(rng, 1, T - 1 if i == B - 1 and T > 1 else T)  # the last row is padded
        toks[i, n:] = pad
    return toks


@points(1, part="masks")
def test_make_src_mask(learner, reference, rng):
    """Does make_src_mask mark the real tokens True, shaped (B, 1, 1, S), for any pad_id?"""
    for B, S, pad in ((3, 5, 0), (1, 4, 0), (4, 6, 7)):
        src = _padded_tokens(rng, B, S, pad)
        kw = {} if pad == 0 else {"pad_id": pad}
        got = tensor(learner.make_src_mask(src, **kw), "make_src_mask", shape=(B, 1, 1, S), dtype=torch.bool,
                     what="the mask (B, 1, 1, S)")
        expected = reference.make_src_mask(src, pad)
        if not torch.equal(got, expected):
            raise Hint(diagnose(got, [(SRC_MASK_INVERTED, ~expected),
                                      (MASK_PAD_ID.format("make_src_mask"), reference.make_src_mask(src, 0))],
                                SRC_MASK_GENERIC, same=torch.equal))
    expect_device_agnostic(learner, "make_src_mask", src)


@points(1, part="masks")
def test_make_tgt_mask(learner, reference, rng):
    """Does make_tgt_mask combine the causal mask with the padding of the keys, shaped (B, 1, T, T)?"""
    for B, T, pad in ((3, 5, 0), (2, 1, 0), (4, 6, 7)):
        tgt = _padded_tokens(rng, B, T, pad)
        kw = {} if pad == 0 else {"pad_id": pad}
        got = tensor(learner.make_tgt_mask(tgt, **kw), "make_tgt_mask", shape=(B, 1, T, T), dtype=torch.bool,
                     what="the mask (B, 1, T, T)")
        expected = reference.make_tgt_mask(tgt, pad)
        if not torch.equal(got, expected):
            keys = (tgt != pad)[:, None, None, :]
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            raise Hint(diagnose(got, [
                (TGT_NO_PAD, causal.expand(B, 1, T, T)), (TGT_NO_CAUSAL, keys.expand(B, 1, T, T)),
                (TGT_UPPER, keys & causal.T), (TGT_PAD_QUERIES, (tgt != pad)[:, None, :, None] & causal),
                (MASK_PAD_ID.format("make_tgt_mask"), reference.make_tgt_mask(tgt, 0))],
                TGT_MASK_GENERIC, same=torch.equal))
    expect_device_agnostic(learner, "make_tgt_mask", tgt)


# --- Part 6: the model (4 points) ------------------------------------------------------------

SKIPS = ("skip_enc", "skip_dec")  # the model computed with its encoder's, or its decoder's, layers skipped


class _Model:
    """The learner's Transformer (a handle, float64, eval mode) holding random weights, and what the model
    computes, done here: with the reference's layers, or with the learner's own layers (handles reached through
    the learner's model), so that the model earns its points when its layers are what is wrong."""

    def __init__(self, learner, reference, rng, *, V=9, D=16, H=2, n_layers=2, d_ff=24, norm_first=False,
                 ):
        self.args = (V, V, D, H, n_layers, d_ff, 0.0, 64, norm_first)
        self.V, self.D, self.H, self.n_layers, self.norm_first = V, D, H, n_layers, norm_first
        ref = reference.Transformer(*self.args)
        self.sd = _state(rng, ref)
        for n in ("src_embed.weight", "tgt_embed.weight"):
            self.sd[n] = _r(_randn(rng, V, D, scale=1.0 / math.sqrt(D)))
        ref.load_state_dict(self.sd)
        self.mod = learner_module(learner, "Transformer", ref, *self.args)
        self.mod.to(F64)
        self.mod.eval()
        self.learner, self.reference, self.rng = learner, reference, rng
        self.pe = self.sd["pos.pe"]
        self._trouble = None

    # -- computed here --
    def _embed(self, name, tokens, offset=0, mistake=None):
        e = self.sd[f"{name}.weight"][tokens]
        T = tokens.shape[1]
        pe = self.pe[offset:offset + T] if mistake != "offset_ignored" else self.pe[:T]
        if mistake == "no_scale":
            return e + pe
        if mistake == "scale_after":
            return (e + pe) * math.sqrt(self.D)
        return e * math.sqrt(self.D) + pe

    def _final(self, parts, name, x, mistake):
        mistake = _at(mistake, name)
        use = self.norm_first != (mistake in ("final_norm_missing", "final_norm_post"))
        return parts.norm(self.sd, name, x) if use else x

    def encode(self, own, src, src_mask, mistake=None):
        parts = _Parts(self.reference, self.learner if own else None)
        x = self._embed("src_embed", src, mistake=mistake)
        m = None if mistake == "no_src_mask_enc" else src_mask
        for i in range(0 if mistake == "skip_enc" else self.n_layers):
            if own:
                x = tensor(self.layer("encoder", i)(x, m), "EncoderLayer", shape=x.shape, dtype=F64)
            else:
                x = _encoder(parts, _sub(self.sd, f"encoder.{i}."), x, m, self.H, self.norm_first)
        return self._final(parts, "enc_norm", x, mistake)

    def decode(self, own, tgt_in, memory, src_mask, tgt_mask, caches=None, offset=0, mistake=None):
        parts = _Parts(self.reference, self.learner if own else None)
        x = self._embed("tgt_embed", tgt_in, offset, mistake)
        mm = None if mistake == "no_src_mask_cross" else src_mask
        new = []
        for i in range(0 if mistake == "skip_dec" else self.n_layers):
            c = None if caches is None or mistake == "caches_ignored" else caches[i]
            if own:
                got = self.layer("decoder", i)(x, memory, tgt_mask, mm, c)
                expect(isinstance(got, (tuple, list)) and len(got) == 2,
                       "`DecoderLayer` must return a pair (x, cache).")
                x, c = tensor(got[0], "DecoderLayer", shape=x.shape, dtype=F64), got[1]
            else:
                x, c = _decoder(parts, _sub(self.sd, f"decoder.{i}."), x, memory, tgt_mask, mm, c, self.H,
                                self.norm_first)
            new.append(c)
        x = self._final(parts, "dec_norm", x, mistake)
        return _lin(self.sd, "out", x), new

    def masks(self, own, src, tgt_in):
        """The masks of forward: the reference's, or (own) those of the learner's make_src_mask and
        make_tgt_mask where they run and have the right shape."""
        src_mask = self.reference.make_src_mask(src)
        tgt_mask = self.reference.make_tgt_mask(tgt_in)
        if own:
            src_mask = _learner_mask(self.learner, "make_src_mask", src, src_mask)
            tgt_mask = _learner_mask(self.learner, "make_tgt_mask", tgt_in, tgt_mask)
        return src_mask, tgt_mask

    def forward(self, own, src, tgt_in, mistake=None):
        # (the learner's layers with the reference's masks: "ref_masks", or with layers skipped)
        src_mask, tgt_mask = self.masks(own and mistake not in ("ref_masks", *SKIPS), src, tgt_in)
        if mistake == "fwd_no_causal":
            tgt_mask = self.reference.make_src_mask(tgt_in)
        memory = self.encode(own, src, src_mask, mistake)
        return self.decode(own, tgt_in, memory, src_mask, tgt_mask, mistake=mistake)[0]

    def layer(self, stack, i):
        return submodule(self.mod, stack, str(i), name="Transformer")

    def trouble(self):
        """The learner's layers (or parts) that differ from the reference's, as (name, part)."""
        if self._trouble is None:
            self._trouble = []
            x = _randn(self.rng, 2, 4, self.D)
            mem = _randn(self.rng, 2, 5, self.D)
            sm, _ = _pad_mask(self.rng, 2, 5)
            tm = _causal(4)
            for name, part, stack, args in (("EncoderLayer", 3, "encoder", (x, sm[:, :, :, :4])),
                                            ("DecoderLayer", 4, "decoder", (x, mem, tm, sm, None))):
                sd = _sub(self.sd, f"{stack}.0.")
                parts = _Parts(self.reference)
                expected = (_encoder if stack == "encoder" else _decoder)(parts, sd, *args, self.H, self.norm_first)
                try:
                    got = self.layer(stack, 0)(*args)
                except (LearnerError, NotImplementedRemote):
                    self._trouble.append((name, part))
                    continue
                if stack == "decoder":
                    ok = (isinstance(got, (tuple, list)) and len(got) == 2 and close(got[0], expected[0])
                          and self._cache_works(sd, x, mem, sm, expected))
                else:
                    ok = close(got, expected)
                if not ok:
                    self._trouble.append((name, part))
            src = torch.tensor([[3, 4, 5, 6, 7], [3, 4, 0, 0, 0], [5, 0, 0, 0, 0]])
            tgt = torch.tensor([[1, 4, 5, 6], [1, 4, 0, 0], [1, 0, 0, 0]])
            for name, toks in (("make_src_mask", src), ("make_tgt_mask", tgt)):
                expected = getattr(self.reference, name)(toks)
                if not torch.equal(_learner_mask(self.learner, name, toks, ~expected), expected):
                    self._trouble.append((name, 5))
            parts = _Parts(self.reference, self.learner)
            try:
                ok = close(parts.norm(self.sd, "enc_norm", x), F.layer_norm(
                    x, (self.D,), self.sd["enc_norm.weight"], self.sd["enc_norm.bias"], 1e-5))
            except (LearnerError, NotImplementedRemote, Hint):
                ok = False
            if not ok:
                self._trouble.append(("LayerNorm", 1))
        return self._trouble

    def _cache_works(self, sd, x, mem, sm, expected):
        """Whether decoder layer 0, given the reference's cache of the first two positions, continues right."""
        k, v = expected[1]
        try:
            past = (k[:, :, :2].contiguous(), v[:, :, :2].contiguous())  # the first two positions
            got = self.layer("decoder", 0)(x[:, 2:], mem, None, sm, past)
        except (LearnerError, NotImplementedRemote):
            return False
        want = _decoder(_Parts(self.reference), sd, x[:, 2:], mem, None, sm, (k[:, :, :2], v[:, :, :2]), self.H,
                        self.norm_first)[0]
        return isinstance(got, (tuple, list)) and len(got) == 2 and close(got[0], want)

    def judge(self, got, compute, mistakes, generic):
        """Pass when `got` is the reference's result, or the one the learner's own layers give; else hint.

        `compute(own, mistake)` is the result computed here, with the learner's own layers or not. The learner's
        own layers are a yardstick only where skipping them changes the result as it changes the reference's
        (both with the reference's masks): layers that do nothing would let a model that never calls them pass."""
        expected = compute(False, None)
        if close(got, expected):
            return
        trouble = self.trouble()
        own = bool(trouble) and not any(
            close(compute(True, "ref_masks"), compute(True, skip)) and not close(expected, compute(False, skip))
            for skip in SKIPS)
        if own and close(got, compute(True, None)):
            return
        also = "".join(FIX_LAYERS.format(n, p) for n, p in trouble)
        raise Hint(diagnose(got, [(h, (lambda t=t: t(own))) for h, t in mistakes], generic,
                            same=lambda a, b: close(a, b, rtol=1e-6, atol=1e-8)) + also)


def _learner_mask(learner, name, tokens, fallback, pad=PAD):
    """The learner's mask for `tokens`, or `fallback` when it fails or has the wrong shape or dtype."""
    try:
        got = getattr(learner, name)(tokens, pad)
    except (LearnerError, NotImplementedRemote, MissingName):
        return fallback
    ok = isinstance(got, torch.Tensor) and got.dtype == torch.bool and tuple(got.shape) == tuple(fallback.shape)
    return got if ok else fallback


MODEL_MISTAKES = [("no_scale", NO_SCALE), ("scale_after", SCALE_AFTER), ("final_norm_missing", FINAL_NORM_MISSING),
                  ("final_norm_post", FINAL_NORM_POST), ("final_norm_missing@enc_norm", FINAL_NORM_MISSING),
                  ("final_norm_missing@dec_norm", FINAL_NORM_MISSING), ("final_norm_post@enc_norm", FINAL_NORM_POST),
                  ("final_norm_post@dec_norm", FINAL_NORM_POST), ("no_src_mask_cross", NO_SRC_MASK_CROSS),
                  ("no_src_mask_enc", NO_SRC_MASK_ENC), ("fwd_no_causal", FWD_NO_CAUSAL)]


def _run(m, what, fn, *args):
    """The learner's model (or decoder) called; when it fails and one of its parts is wrong, say which to fix."""
    try:
        return fn(*args)
    except (LearnerError, NotImplementedRemote) as failure:
        trouble = m.trouble()
        if not trouble:
            raise
        name, part = trouble[0]
        verb = "is not implemented yet" if isinstance(failure, NotImplementedRemote) else "fails"
        raise Hint(f"{what} {verb}, and your {name} (part {part}), which it uses, is wrong or fails: fix it "
                   "first.") from None


def _check_forward(m, src, tgt_in):
    B, T = tgt_in.shape
    got = tensor(_run(m, "`Transformer`", m.mod, src, tgt_in), "Transformer", shape=(B, T, m.V), dtype=F64,
                 what="its logits (B, T, tgt_vocab)")
    m.judge(got, lambda own, k: m.forward(own, src, tgt_in, k),
            [(h, (lambda own, k=k: m.forward(own, src, tgt_in, k))) for k, h in MODEL_MISTAKES],
            MODEL_GENERIC.format("forward"))
    return got


@points(2, part="transformer")
def test_transformer_forward_matches_reference(learner, reference, rng):
    """Does the Transformer (encode, decode, forward) give the reference's logits with the same weights?"""
    for norm_first in (False, True):
        m = _Model(learner, reference, rng, norm_first=norm_first)
        src, tgt_in = _padded_tokens(rng, 3, 6), _padded_tokens(rng, 3, 5)
        tgt_in[:, 0] = SOS
        _check_forward(m, src, tgt_in)
        # encode on its own.
        sm = reference.make_src_mask(src)
        got = tensor(_run(m, "`Transformer.encode`", m.mod.encode, src, sm), "Transformer.encode",
                     shape=(3, 6, m.D), dtype=F64, what="the memory (B, S, D)")
        m.judge(got, lambda own, k: m.encode(own, src, sm, k),
                [(h, (lambda own, k=k: m.encode(own, src, sm, k))) for k, h in MODEL_MISTAKES],
                MODEL_GENERIC.format("encode"))


def _learner_decode(m, *args, **kwargs):
    got = _run(m, "`Transformer.decode`", lambda: method(m.mod, "decode", "Transformer")(*args, **kwargs))
    expect(isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[1], (tuple, list))
           and len(got[1]) == m.n_layers, DECODE_RETURN)
    B, T = args[0].shape
    tensor(got[0], "Transformer.decode", shape=(B, T, m.V), dtype=F64, what="its logits (B, T, tgt_vocab)")
    return got


@points(1, part="transformer")
def test_transformer_decode_with_caches_and_offset(learner, reference, rng):
    """Does decode, fed one token at a time with its caches and offset, give the logits of the whole sequence?"""
    for norm_first in (False, True):
        m = _Model(learner, reference, rng, norm_first=norm_first)
        src, tgt_in = _padded_tokens(rng, 2, 5), _tokens(rng, 3, 8, (2, 5))
        tgt_in[:, 0] = SOS
        sm = reference.make_src_mask(src)
        memory = m.encode(False, src, sm)
        tm = _causal(5)
        full, _ = _learner_decode(m, tgt_in, memory, sm, tm)
        m.judge(full, lambda own, k: m.decode(own, tgt_in, memory, sm, tm, mistake=k)[0],
                [(h, (lambda own, k=k: m.decode(own, tgt_in, memory, sm, tm, mistake=k)[0]))
                 for k, h in MODEL_MISTAKES],
                MODEL_GENERIC.format("decode"))
        caches, steps = None, []
        for t in range(5):
            logits, caches = _learner_decode(m, tgt_in[:, t:t + 1], memory, sm, None, caches, t)
            steps.append(logits)
        got = torch.cat(steps, 1)
        if not close(got, full):
            own = bool(m.trouble())

            def cached(mistake):
                c, out = None, []
                for t in range(5):
                    lg, c = m.decode(own, tgt_in[:, t:t + 1], memory, sm, None, c, t, mistake=mistake)
                    out.append(lg)
                return torch.cat(out, 1)
            hint = diagnose(got, [(OFFSET_IGNORED, lambda: cached("offset_ignored")),
                                  (CACHES_IGNORED, lambda: cached("caches_ignored"))],
                            "`decode` fed one token at a time with its caches and offset differs from decoding the "
                            "whole sequence.")
            raise Hint(hint + "".join(FIX_LAYERS.format(n, p) for n, p in m.trouble() if n == "DecoderLayer"))


@points(1, part="transformer")
def test_transformer_causal_and_padding_properties(learner, reference, rng):
    """Do the logits at t ignore later target tokens, and does padding the source change nothing?"""
    for norm_first in (False, True):
        m = _Model(learner, reference, rng, norm_first=norm_first)
        src, tgt_in = _tokens(rng, 3, 8, (2, 4)), _tokens(rng, 3, 8, (2, 5))
        tgt_in[:, 0] = SOS
        got = _check_forward(m, src, tgt_in)
        tgt2 = tgt_in.clone()
        tgt2[:, 3:] = _tokens(rng, 3, 8, (2, 2))
        also = "".join(FIX_LAYERS.format(n, p) for n, p in m.trouble())
        got2 = tensor(m.mod(src, tgt2), "Transformer", shape=got.shape, dtype=F64)
        expect(close(got2[:, :3], got[:, :3]), FWD_NO_CAUSAL + also)
        padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1)
        got3 = tensor(m.mod(padded, tgt_in), "Transformer", shape=got.shape, dtype=F64)
        expect(close(got3, got), PADDING_CHANGES + also)


# --- Part 7: greedy decoding (4 points) ------------------------------------------------------

def _greedy_here(m, src, max_len, sos=SOS, eos=EOS, pad=PAD, *, cached=False, offset_ignored=False,
                 no_cache=False, first_cache=False, mask=True, early=True, any_stop=False,
                 with_sos=False, first_pos=False, no_src_mask=False, leaky_mask=False, no_causal=False,
                 offset_shift=0, sm=None, eos_padded=False, forget=False):
    """Greedy decoding run from here with the learner's own model (its encode and decode); flags make mistakes."""
    sm = (src != pad)[:, None, None, :] if sm is None else sm
    sm = None if no_src_mask else sm
    memory = method(m.mod, "encode", "Transformer")(src, sm)
    tensor(memory, "Transformer.encode", shape=(*src.shape, m.D), dtype=F64, what="the memory (B, S, D)")
    B = src.shape[0]
    ys = torch.full((B, 1), sos, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    caches, toks = None, []
    for t in range(max_len):
        if cached:
            inp, tm, off = ys[:, -1:], None, (0 if offset_ignored else t + offset_shift)
            logits, c = _learner_decode(m, inp, memory, sm, tm, None if no_cache else caches, off)
            caches = caches if first_cache and caches is not None else c
        else:
            T = ys.shape[1]
            tm = None if no_causal else _leaky(T) if leaky_mask else _causal(T)
            logits, _ = _learner_decode(m, ys, memory, sm, tm)
        y = logits[:, 0 if first_pos else -1].argmax(-1)
        if eos_padded:  # (the rows that output eos now marked finished before the padding)
            finished = finished | (y == eos)
        if mask:
            y = y.masked_fill(finished, pad)
        toks.append(y)
        if not eos_padded:
            finished = (y == eos) if forget else finished | (y == eos)
        if early and bool(finished.any() if any_stop else finished.all()):
            break
        ys = torch.cat([ys, y[:, None]], 1)
    out = torch.stack(toks, 1)
    if with_sos:
        out = torch.cat([torch.full((B, 1), sos, dtype=torch.long), out], 1)
    return out


# The typical mistakes of greedy decoding that the chosen model and source must show (`_ref_greedy`).
CACHED_MISTAKES = ("offset_zero", "first_cache", "no_cache", "offset_plus_one")
SHOWN = CACHED_MISTAKES + ("no_pad", "no_src_mask", "row0_stop", "first_pos", "leaky_mask")


def _ref_greedy(reference, ref, src, max_len, sos, eos, pad, mistake=None):
    """The reference model's greedy decoding, as the chosen model and source must show it (tests/hidden/test_hidden_cases.py
    compares it with the tokens `_candidates` derives from its batches), with one typical mistake: of the cached
    decoder, "offset_zero" (every token fed at position 0), "first_cache" (the first step's caches passed at every
    step), "no_cache", "offset_plus_one" (each token fed one position too far);
    of either, "no_pad" (rows go on after their eos, never padded), "no_src_mask" (no source mask), "row0_stop"
    (stop when row 0 is finished), "forget" (`finished` set anew at each step, not kept), "first_pos" (the argmax
    of the first position's logits), "leaky_mask" (a
    causal mask through which each position sees the next one: the last position's logits change only through
    the earlier positions' outputs, in the layers after the first), "no_causal" (no causal mask at all)."""
    sm = None if mistake == "no_src_mask" else reference.make_src_mask(src, pad)
    memory = ref.encode(src, sm)
    B = src.shape[0]
    ys = torch.full((B, 1), sos, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    caches, toks = None, []
    for t in range(max_len):
        if mistake in CACHED_MISTAKES:
            logits, new = ref.decode(ys[:, -1:], memory, sm, None, None if mistake == "no_cache" else caches,
                                     offset=0 if mistake == "offset_zero" else t + (mistake == "offset_plus_one"))
            caches = caches if mistake == "first_cache" and caches is not None else new
        else:
            T = ys.shape[1]
            tm = None if mistake == "no_causal" else _leaky(T) if mistake == "leaky_mask" else _causal(T)
            logits, _ = ref.decode(ys, memory, sm, tm)
        y = logits[:, 0 if mistake == "first_pos" else -1].argmax(-1)
        if mistake != "no_pad":
            y = y.masked_fill(finished, pad)
        toks.append(y)
        finished = (y == eos) if mistake == "forget" else finished | (y == eos)
        if bool(finished[0] if mistake == "row0_stop" else finished.all()):
            break
        ys = torch.cat([ys, y[:, None]], 1)
    return torch.stack(toks, 1)


def _eos_steps(out, eos):
    """The step at which each row first outputs eos (the output's length where it never does)."""
    L = out.shape[1]
    return [row.index(eos) if eos in row else L for row in out.tolist()]


def _finishes_unevenly(out, eos):
    firsts = _eos_steps(out, eos)
    # Rows end at different steps, and one runs at least three: a prefix longer than one token
    # is decoded, where a mask of the wrong shape no longer broadcasts by chance.
    return min(firsts) < max(firsts) and max(firsts) >= 2


def _forgetting_shows(out, eos, max_len):
    """Whether a decoder that sets `finished` anew at each step (`finished = y == eos`) gives other tokens than `out`,
    the right ones: a row that finished is fed pad at the next step, is then no longer finished and goes on, so it
    shows where decoding stops before max_len (it would not stop there), or two steps after a row's eos."""
    L = out.shape[1]
    return L < max_len or min(_eos_steps(out, eos)) <= L - 3


def _row0_early(out, eos):
    """Whether row 0 finishes before another row: a decoder that stops when row 0 is finished stops too early."""
    firsts = _eos_steps(out, eos)
    return _finishes_unevenly(out, eos) and firsts[0] < max(firsts)


class _Fast:
    """The reference model (its float64 state dict `sd`, `H` heads), written again here with fewer operations, for
    the model search of the greedy checks alone: packed projections, the memory's keys and values computed once,
    and, for decoding with a cache, rows that each make their own typical mistake in one batch. Its tokens are the
    reference's but for float rounding (tests/hidden/test_hidden_cases.py compares them with `_ref_greedy`), and the
    model chosen is decoded again with the reference itself."""

    def __init__(self, sd, H, norm_first):
        pair = lambda n: (sd[f"{n}.weight"], sd[f"{n}.bias"])  # noqa: E731
        packed = lambda p, cs: tuple(torch.cat(t) for t in zip(*(pair(f"{p}.W_{c}") for c in cs)))  # noqa: E731
        self.D = sd["tgt_embed.weight"].shape[1]
        self.H, self.nf = H, norm_first
        self.embed = {n: sd[f"{n}_embed.weight"] * math.sqrt(self.D) for n in ("src", "tgt")}
        self.pe = sd["pos.pe"]
        n_enc = len({n.split(".")[1] for n in sd if n.startswith("encoder.")})
        n_dec = len({n.split(".")[1] for n in sd if n.startswith("decoder.")})
        self.encoders = [{"qkv": packed(f"encoder.{i}.self_attn", "qkv"), "so": pair(f"encoder.{i}.self_attn.W_o"),
                          "f1": pair(f"encoder.{i}.ff.linear1"), "f2": pair(f"encoder.{i}.ff.linear2"),
                          "norms": [pair(f"encoder.{i}.norm{j}") for j in (1, 2)]} for i in range(n_enc)]
        self.layers = [{"qkv": packed(f"decoder.{i}.self_attn", "qkv"), "so": pair(f"decoder.{i}.self_attn.W_o"),
                        "cq": pair(f"decoder.{i}.cross_attn.W_q"), "ckv": packed(f"decoder.{i}.cross_attn", "kv"),
                        "co": pair(f"decoder.{i}.cross_attn.W_o"), "f1": pair(f"decoder.{i}.ff.linear1"),
                        "f2": pair(f"decoder.{i}.ff.linear2"),
                        "norms": [pair(f"decoder.{i}.norm{j}") for j in (1, 2, 3)]} for i in range(n_dec)]
        self.enc_final = pair("enc_norm") if norm_first else None
        self.final, self.out = pair("dec_norm") if norm_first else None, pair("out")

    def encode(self, src, seen):
        """The memory (N, S, D) of the source tokens (N, S), `seen` (N, 1, 1, S) True where a key is seen, or None."""
        x = self.embed["src"][src] + self.pe[:src.shape[1]]
        for L in self.encoders:
            n1, n2 = L["norms"]
            h = self._norm(x, n1) if self.nf else x
            a = F.linear(self._attend(*(self._heads(p) for p in F.linear(h, *L["qkv"]).split(self.D, -1)), seen),
                         *L["so"])
            x = x + a if self.nf else self._norm(x + a, n1)
            h = self._norm(x, n2) if self.nf else x
            f = F.linear(F.relu(F.linear(h, *L["f1"])), *L["f2"])
            x = x + f if self.nf else self._norm(x + f, n2)
        return self._norm(x, self.enc_final) if self.nf else x

    def _heads(self, x):  # (N, T, D) -> (N, H, T, d_head)
        return x.reshape(*x.shape[:2], self.H, -1).transpose(1, 2)

    def _attend(self, q, k, v, seen):  # seen: True where a key is seen, broadcastable to (N, H, Lq, Lk)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if seen is not None:
            s = s.masked_fill(~seen, float("-inf"))
        out = torch.softmax(s, -1) @ v
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], self.D)

    def _norm(self, x, p):
        return F.layer_norm(x, (self.D,), p[0], p[1], 1e-5)

    def cross(self, memory):
        """Each layer's keys and values of the memory (N, S, D)."""
        return [tuple(self._heads(t) for t in F.linear(memory, *L["ckv"]).split(self.D, -1)) for L in self.layers]

    def _layer(self, i, x, ckv, mseen, seen, cache=None, t=0):
        """Decoder layer i on x (N, T, D): self-attention over x's positions, or, with a cache (keys and values
        (N, H, max_len, d_head)), over the positions up to t, x's keys and values written at t."""
        L = self.layers[i]
        n1, n2, n3 = L["norms"]
        h = self._norm(x, n1) if self.nf else x
        q, k, v = (self._heads(p) for p in F.linear(h, *L["qkv"]).split(self.D, -1))
        if cache is not None:
            cache[0][:, :, t:t + 1], cache[1][:, :, t:t + 1] = k, v
            k, v = cache[0][:, :, :t + 1], cache[1][:, :, :t + 1]
        a = F.linear(self._attend(q, k, v, seen), *L["so"])
        x = x + a if self.nf else self._norm(x + a, n1)
        h = self._norm(x, n2) if self.nf else x
        c = F.linear(self._attend(self._heads(F.linear(h, *L["cq"])), *ckv, mseen), *L["co"])
        x = x + c if self.nf else self._norm(x + c, n2)
        h = self._norm(x, n3) if self.nf else x
        f = F.linear(F.relu(F.linear(h, *L["f1"])), *L["f2"])
        return x + f if self.nf else self._norm(x + f, n3)

    def _next(self, x, eos, delta):
        """The argmax of the last position's logits, `delta` (N,) added to eos's."""
        x = x[:, -1]
        z = F.linear(self._norm(x, self.final) if self.nf else x, *self.out)
        z[:, eos] += delta
        return z.argmax(-1)

    def cached(self, memory, mseen, max_len, sos, eos, delta, mistakes):
        """Never-stopped greedy tokens (N, max_len) decoded one token a step with a cache: never padded, never
        stopped, `delta` (N,) added to each row's eos logit (the eos bias its candidate is decoded with). Row n
        makes the typical mistake mistakes[n] of cached decoding ("offset_zero", "first_cache", "no_cache",
        "offset_plus_one"), or none (None, or "no_src_mask", whose memory and `mseen` are made without the mask).
        Every row keeps every position's keys and values; where a decoder with the mistake would not pass them on,
        the row does not see them. Rows are independent: a row's tokens up to its first eos are those that any
        decoding of its batch outputs (after it, a decoder pads, or, with "no_pad", goes on as here), so one batch
        holds many candidates' rows and `_stopped` cuts out what a decoder of one candidate would output."""
        N, T = memory.shape[0], max_len
        zero = torch.tensor([m == "offset_zero" for m in mistakes])
        shift = torch.tensor([int(m == "offset_plus_one") for m in mistakes])
        every = torch.tensor([m not in ("first_cache", "no_cache") for m in mistakes])[:, None]
        first = torch.tensor([m == "first_cache" for m in mistakes])[:, None]
        ckvs = self.cross(memory)
        d_head = self.D // self.H
        caches = [(memory.new_empty(N, self.H, T, d_head), memory.new_empty(N, self.H, T, d_head))
                  for _ in self.layers]
        y, toks = torch.full((N,), sos, dtype=torch.long), []
        for t in range(T):
            x = (self.embed["tgt"][y] + self.pe[torch.where(zero, 0, t + shift)])[:, None]  # (N, 1, D)
            j = torch.arange(t + 1)[None]
            seen = (every | (j == t) | (first & (j == 0)))[:, None, None]  # (N, 1, 1, t + 1)
            for i, (ckv, cache) in enumerate(zip(ckvs, caches)):
                x = self._layer(i, x, ckv, mseen, seen, cache, t)
            y = self._next(x, eos, delta)
            toks.append(y)
        return torch.stack(toks, 1)

    def recomputed(self, memory, mseen, max_len, sos, eos, delta, tgt_mask):
        """Never-stopped greedy tokens (N, max_len), the whole prefix decoded at each step under tgt_mask(T)."""
        ckvs = self.cross(memory)
        ys = torch.full((memory.shape[0], 1), sos, dtype=torch.long)
        for _ in range(max_len):
            T = ys.shape[1]
            x, seen = self.embed["tgt"][ys] + self.pe[:T], tgt_mask(T)
            for i, ckv in enumerate(ckvs):
                x = self._layer(i, x, ckv, mseen, seen)
            ys = torch.cat([ys, self._next(x, eos, delta)[:, None]], 1)
        return ys[:, 1:]


def _stopped(raw, eos, pad, *, masked=True, row0=False):
    """What a greedy decoder outputs, given its rows' never-stopped tokens (`_Fast`): padded after each
    row's first eos (unless not `masked`) and stopped at the step where every row (or row 0) is finished."""
    L = raw.shape[1]
    first = [row.index(eos) if eos in row else L for row in raw.tolist()]
    n = min((first[0] if row0 else max(first)) + 1, L)
    out = raw[:, :n]
    if masked:
        out = out.masked_fill(torch.arange(n)[None, :] > torch.tensor(first)[:, None], pad)
    return out


# Each typical mistake's tokens, from which never-stopped run (its own, or the right one's) and how cut. With
# "first_pos", the first position's logits are the first step's at every step (it sees sos alone): the first token,
# repeated.
_CUT = {"no_pad": ("right", {"masked": False}), "row0_stop": ("right", {"row0": True}),
        "first_pos": ("first", {})}
N_SOURCES, N_BIASES = 8, 6
# The mistakes decoded by recomputing the whole prefix at each step, under this target mask (T -> mask or None).
RECOMPUTED = {"leaky_mask": _leaky, "no_causal": lambda T: None}
# What the greedy checks of the decoder without a cache must show besides SHOWN: no causal mask at all. Its tokens
# often equal those of a leaky one (the hint names both then), so they need only differ from the right ones.
UNCACHED_MISTAKES = ("no_causal",)


def _candidates(reference, sd, H, norm_first, srcs, deltas, B, max_len, sos, eos, pad, shown, differ=()):
    """Of the candidates (a source of `srcs`, an eos bias of `deltas`) on the reference model (its float64 state dict
    `sd`, `H` heads, `norm_first`): those whose greedy outputs finish unevenly, with the row that finishes first
    moved to row 0 (where B > 1), and differ from all pad and from each typical mistake's of `shown`, which all
    differ from each other, and from each mistake's of `differ` (which may equal another mistake's: "no_causal",
    whose hint names "leaky_mask" too where the two agree). The candidates are decoded with `_Fast`: every one right, with the cache; those still
    in, with the mistakes of the cache, the offset and the source mask in one batch, then recomputing the prefix
    under a leaky causal mask. Returns, for each, (source index, delta index, row order, [right tokens, all pad,
    each mistake's tokens]): tests/hidden/test_hidden_cases.py compares them with `_ref_greedy`."""
    K = len(srcs)
    cands = [(k, j) for j in range(len(deltas)) for k in range(K)]
    src_all = torch.cat([srcs[k] for k, _ in cands])
    R = src_all.shape[0]
    delta_all = torch.tensor([float(deltas[j]) for _, j in cands], dtype=F64).repeat_interleave(B)
    sm_all = reference.make_src_mask(src_all, pad)
    fast = _Fast(sd, H, norm_first)
    memory = fast.encode(src_all, sm_all)
    right = fast.cached(memory, sm_all, max_len, sos, eos, delta_all, [None] * R)
    alive = []
    for c, (k, j) in enumerate(cands):
        out = _stopped(right[c * B:(c + 1) * B], eos, pad)
        order = list(range(B))
        if B > 1:
            if not (_finishes_unevenly(out, eos) and _forgetting_shows(out, eos, max_len)):
                continue
            firsts = _eos_steps(out, eos)
            i = firsts.index(min(firsts))
            order = [i] + [r for r in range(B) if r != i]
            out = out[order]
        if torch.equal(out, torch.full((B, max_len), pad)):
            continue
        alive.append((c, k, j, order, [out, torch.full((B, max_len), pad)]))
    # Each run never stopped, as {candidate: its rows}: the right one's, and each typical mistake's, decoded when
    # first needed for the candidates still in. The mistakes of the cache, the offset and the source mask are decoded
    # together in one batch (a mistake's tokens are what any greedy decoder that makes it outputs, with the cache or
    # not, but for float rounding).
    runs = {"right": {c: right[c * B:(c + 1) * B] for c in range(len(cands))}}
    runs["first"] = {c: t[:, :1].expand(-1, max_len) for c, t in runs["right"].items()}
    together = [m for m in shown if m in CACHED_MISTAKES or m == "no_src_mask"]
    for mistake in (*shown, *differ):
        source, cut = _CUT.get(mistake, (mistake, {}))
        if source not in runs and alive:
            rows = torch.cat([torch.arange(c * B, (c + 1) * B) for c, *_ in alive])
            n = len(rows)
            if source in RECOMPUTED:
                made = [source], fast.recomputed(memory[rows], sm_all[rows], max_len, sos, eos, delta_all[rows],
                                                 RECOMPUTED[source])
            else:
                unmasked = fast.encode(src_all[rows], None) if "no_src_mask" in together else None
                made = together, fast.cached(
                    torch.cat([unmasked if m == "no_src_mask" else memory[rows] for m in together]),
                    torch.cat([torch.ones_like(sm_all[rows]) if m == "no_src_mask" else sm_all[rows]
                               for m in together]),
                    max_len, sos, eos, delta_all[rows].repeat(len(together)), [m for m in together for _ in range(n)])
            for g, m in enumerate(made[0]):
                runs[m] = {c: made[1][g * n + i * B:g * n + (i + 1) * B] for i, (c, *_) in enumerate(alive)}
        still = []
        for c, k, j, order, toks in alive:
            new = _stopped(runs[source][c][order], eos, pad, **cut)
            if mistake in differ:
                if not torch.equal(new, toks[0]):
                    still.append((c, k, j, order, toks))
            elif not any(torch.equal(new, t) for t in toks):
                toks.append(new)
                still.append((c, k, j, order, toks))
        alive = still
    return [(k, j, order, toks) for c, k, j, order, toks in alive]


def _same_rows(out, src):
    """Whether every row of the tokens is the same, though the sources' rows are not all the same."""
    return bool((out == out[:1]).all()) and not bool((src == src[:1]).all())


def _early_row_first(src, out, eos):
    """`src` with its rows reordered so that row 0 is one that finishes first in `out`."""
    firsts = _eos_steps(out, eos)
    i = firsts.index(min(firsts))
    return src[[i] + [r for r in range(src.shape[0]) if r != i]]


def _own_uneven(m, src, max_len, sos, eos, pad, own):
    """The greedy tokens of the learner's own (wrong) model, its extra bias on eos moved as the reference's was
    (a bisection) until its rows finish unevenly, where they do not yet."""
    sd, lo, hi, shift = m.sd, -4.0, 4.0, 0.0
    base = sd["out.bias"][eos].clone()
    for _ in range(5):
        if _finishes_unevenly(own, eos):
            break
        lo, hi = (lo, shift) if max(_eos_steps(own, eos)) < 2 else (shift, hi)
        shift = (lo + hi) / 2
        sd = dict(sd, **{"out.bias": sd["out.bias"].clone()})
        sd["out.bias"][eos] = _r(base + shift)
        m.mod.load_state_dict(sd)
        m.sd = sd
        own = _greedy_here(m, src, max_len, sos, eos, pad)
    return own


def _one_row(src, toks, eos):
    """The rows of `src`, each a source (1, S), that a decoder feeding every token at position 0 decodes alone
    otherwise than the reference, given the chosen candidate's tokens `toks` (`_candidates`: the right ones, all pad,
    then those of SHOWN's mistakes, "offset_zero" first). A row decoded alone outputs its tokens in the batch up to
    its first eos: with B > 1 the mistake changes the batch's tokens, so it changes at least one row's."""
    assert SHOWN[0] == "offset_zero"
    cut = lambda row: row[:row.index(eos) + 1] if eos in row else row  # noqa: E731
    return [src[r:r + 1] for r, (a, b) in enumerate(zip(toks[0].tolist(), toks[2].tolist())) if cut(a) != cut(b)]


def _reference_cases(reference, rng, ref, B, max_len, norm_first, sos, eos, pad, uncached=True):
    """Models and sources on which the reference's greedy outputs finish at different steps, row 0 before the last,
    and every typical mistake of SHOWN (with B > 1), and of UNCACHED_MISTAKES where `uncached` (a check of the decoder
    without a cache), changes them: for each, (state dict, source, the reference's
    tokens), found with the reference alone (`ref`, a reference Transformer of `norm_first`, whose weights each is
    checked with) and drawn from `rng` alone, at most 60 tries in all. Being the learner's, the greedy checks do
    the first search ahead (`_prepare_greedy`)."""
    # Each try draws new weights, 8 sources and 6 extra biases on eos (which decide when rows stop, spread over
    # -1 .. 4), and decodes the 48 candidates in one batch (`_candidates`): about one candidate in 20 shows every
    # mistake where it is hardest (B = 4, max_len = 6), and about one try in 12 has none; 60 tries never run out.
    shown = SHOWN if B > 1 else ("offset_zero",)
    differ = UNCACHED_MISTAKES if uncached and B > 1 else ()
    names = ref.state_dict()
    for _ in range(60):
        sd = _state(rng, names)
        for n in ("src_embed.weight", "tgt_embed.weight"):
            sd[n] = _r(_randn(rng, 9, 16, scale=0.6 / math.sqrt(16)))
        # Real tokens are never sos or eos (nor pad): the source's padding is where it holds pad. With a pad other
        # than 0 they are never 0 either: a mask built with the padding id 0 (not pad) is then no mask at all,
        # which every model chosen here shows ("no_src_mask").
        avoid = (sos, eos) + ((PAD,) if pad != PAD else ())
        S = _randint(rng, 3, 6)
        srcs = [_padded_tokens(rng, B, S, pad=pad, lo=0, avoid=avoid) for _ in range(N_SOURCES)]
        # The model never outputs pad (a row's real tokens are never pad, as a trained model's): a decoder that masks
        # the pad keys of its prefix, with make_tgt_mask, then decodes what one with a causal mask alone does.
        sd["out.bias"][pad] = _r(sd["out.bias"][pad] - 30.0)
        base = sd["out.bias"][eos].clone()
        biases = [_r(base - 1.0 + 5.0 * (j + float(torch.rand((), generator=rng))) / N_BIASES) for j in range(N_BIASES)]
        with torch.inference_mode():
            found = _candidates(reference, sd, 2, norm_first, srcs, [b - base for b in biases], B, max_len, sos, eos,
                                pad, shown, differ)
        if not found:
            continue
        # The first candidate found, in an order of the rng's, decoded again on its own as a check of the batch.
        k, j, order, toks = found[int(torch.randint(len(found), (), generator=rng))]
        src = srcs[k][order]
        sd["out.bias"][eos] = biases[j]
        ref.double()  # (the learner's copy leaves the check's own `ref` in float32)
        ref.load_state_dict(sd)
        with torch.inference_mode():
            if not torch.equal(reference.greedy_decode(ref, src, max_len, sos, eos, pad), toks[0]):
                continue  # (a near tie decided otherwise in a batch of another size: not seen yet)
        yield sd, src, toks


def _prepare_greedy(B, max_len, *, norm_first=False, sos=SOS, eos=EOS, pad=PAD, uncached=True):
    """A greedy check's first search for a model (`_reference_cases`), to be done ahead (`support.prepared`):
    the case found and the search, which the check goes on with where the learner's model needs another one."""
    def setup(reference):
        ref = reference.Transformer(9, 9, 16, 2, 2, 24, 0.0, 64, norm_first).eval()

        def work(rng):
            cases = _reference_cases(reference, rng, ref, B, max_len, norm_first, sos, eos, pad, uncached)
            return list(itertools.islice(cases, 1)), cases
        return work
    return setup


def _greedy_model(learner, reference, rng, B, max_len, *, norm_first=False, sos=SOS, eos=EOS, pad=PAD,
                  prepared=None, uncached=True):
    """A model whose greedy outputs finish at different steps, row 0 before the last, and sources.

    The outputs are computed with the reference, where every typical mistake of SHOWN (with B > 1) must change
    them (`_reference_cases`, whose first case `prepared` may hold, searched ahead: `_prepare_greedy`), and then
    with the learner's own model, whose decoding the greedy checks judge. A learner's model whose rows do not
    finish so (a wrong one may stop every row at once, or never) would let a decoder that does not even call it
    pass: a few more models are tried, and where none does, the decoder is not judged (`unjudged`): it is told to
    fix its model first."""
    m, own_tries, same_rows, fails = None, 0, 0, False
    ref = reference.Transformer(9, 9, 16, 2, 2, 24, 0.0, 64, norm_first).eval()  # each case's weights, in turn
    if prepared is None:
        cases = _reference_cases(reference, rng, ref, B, max_len, norm_first, sos, eos, pad, uncached)
    else:
        first, rest = prepared
        cases = itertools.chain(first, rest)
    for sd, src, toks in cases:
        out = toks[0]
        ref.double()
        ref.load_state_dict(sd)
        m = _learner_model(learner, reference, rng, ref, sd, norm_first)
        if B > 1:  # one row, alone a source on which the token's position decides (`_one_row`)
            rows = _one_row(src, toks, eos)
            m.one_row = rows[int(torch.randint(len(rows), (), generator=rng))]
        own_tries += 1
        if B == 1:
            break
        try:
            own = _greedy_here(m, src, max_len, sos, eos, pad)
            if not torch.equal(own, out):  # the learner's model is wrong, yet it is the one judged with
                own = _own_uneven(m, src, max_len, sos, eos, pad, own)
                if _finishes_unevenly(own, eos):
                    src = _early_row_first(src, own, eos)
                    own = _greedy_here(m, src, max_len, sos, eos, pad)
        except (LearnerError, NotImplementedRemote, Hint):
            fails = True
            break  # the learner's model fails: the checks say which part to fix
        if _row0_early(own, eos):
            m.own = (src, max_len, sos, eos, pad, own)  # what _check_greedy expects of this source, done once
            break
        # Every row the same tokens from different sources, even after the bisection on eos: a model whose
        # tokens do not depend on the source (layers that never read it, constant logits) gives every row the
        # same tokens on any weights, so further models cannot make its rows finish unevenly. Two such tries
        # end the search (each costs a second of the grader's time, and eight of them half a minute).
        same_rows += _same_rows(own, src)
        if own_tries == 8 or same_rows == 2:
            break
    if m is None:  # a fault of ours, not the learner's: a verdict on any other model could be luck
        raise RuntimeError("no model found whose greedy outputs show every typical mistake")
    if B > 1 and not fails and not hasattr(m, "own"):
        m.unjudged = True
    return m, src


def _learner_model(learner, reference, rng, ref, sd, norm_first):
    m = _Model.__new__(_Model)
    m.args = (9, 9, 16, 2, 2, 24, 0.0, 64, norm_first)
    m.V, m.D, m.H, m.n_layers, m.norm_first = 9, 16, 2, 2, norm_first
    m.sd, m.pe, m.learner, m.reference, m.rng, m._trouble = sd, sd["pos.pe"], learner, reference, rng, None
    m.mod = learner_module(learner, "Transformer", ref.float(), *m.args)
    m.mod.to(F64)
    m.mod.eval()
    return m


def _once(make):
    """`make`, computed on its first call only."""
    done = []
    return lambda: done[0] if done else done.append(make()) or done[0]


def _check_greedy(learner, m, src, max_len, name, **special):
    sos, eos, pad = special.get("sos", SOS), special.get("eos", EOS), special.get("pad", PAD)
    got = _run(m, f"`{name}`", lambda: getattr(learner, name)(m.mod, src, max_len, **special))
    expect(isinstance(got, torch.Tensor) and got.dtype == torch.long, GR_TYPE.format(name))
    if getattr(m, "unjudged", False):
        raise Hint(GR_UNJUDGED.format(name) + "".join(FIX_LAYERS.format(n, p) for n, p in m.trouble()))
    own = getattr(m, "own", None)
    if own is not None and own[0] is src and own[1:5] == (max_len, sos, eos, pad):
        expected = own[5]
    else:
        expected = _greedy_here(m, src, max_len, sos, eos, pad)
    if close(got, expected):
        return got
    # The learner's make_src_mask, if it differs from the reference's: greedy decoding that uses it is right.
    ref_sm = m.reference.make_src_mask(src, pad)
    sm = _learner_mask(learner, "make_src_mask", src, ref_sm, pad)
    if not torch.equal(sm, ref_sm) and close(got, _greedy_here(m, src, max_len, sos, eos, pad, sm=sm)):
        return got
    run = lambda **kw: lambda: _greedy_here(m, src, kw.pop("max_len", max_len), sos, eos, pad, **kw)  # noqa: E731
    table = []
    if name == "greedy_decode_cached":
        # Right given the learner's own cached decoding (decode with caches and offset), even where that is wrong.
        if close(got, _greedy_here(m, src, max_len, sos, eos, pad, cached=True)):
            return got
        # A decoder that feeds more than the newest token is told so, whatever its tokens happen to match.
        _check_one_token_a_step(learner, m, src, max_len, **special)
        table += [(GR_OFFSET, run(cached=True, offset_ignored=True)), (GR_NO_CACHE, run(cached=True, no_cache=True)),
                  (GR_FIRST_CACHE, run(cached=True, first_cache=True)),
                  (GR_OFFSET_SHIFT, run(cached=True, offset_shift=1))]
    else:
        # No causal mask and one that lets each position see the next often give the same tokens (the search does
        # not keep them apart: it would cost a third more tries): where they do, the hint names both.
        nc, leaky = _once(run(no_causal=True)), _once(run(leaky_mask=True))
        both = lambda: nc() if torch.equal(nc(), leaky()) else None  # noqa: E731
        table += [(GR_CAUSAL_EITHER, both), (GR_NO_CAUSAL, nc), (GR_LEAKY_MASK, leaky)]
    table += [(GR_NO_PAD, run(mask=False)), (GR_NO_PAD, run(mask=False, early=False)),
              (GR_NO_STOP, run(early=False)), (GR_ANY_STOP, run(any_stop=True)),
              (GR_EOS_PADDED, run(eos_padded=True)), (GR_FORGETS, run(forget=True)),
              (GR_WITH_SOS, run(with_sos=True)), (GR_WITH_SOS, run(with_sos=True, early=False)),
              (GR_NO_SRC_MASK, run(no_src_mask=True)), (GR_FIRST_POS, run(first_pos=True)),
              (GR_STEPS, run(max_len=max_len - 1) if max_len > 1 else None), (GR_STEPS, run(max_len=max_len + 1))]
    if special:
        table.append((GR_SPECIAL, lambda: _greedy_here(m, src, max_len)))
    shaped = got.dim() == 2 and got.shape[0] == src.shape[0] and got.shape[1] <= max_len
    raise Hint(diagnose(got, [(h.format(name), r) for h, r in table],
                        GR_GENERIC.format(name) if shaped else GR_TYPE.format(name), same=torch.equal))


def _check_stopping(learner, m, src, max_len, name, **special):
    """The decoder, right on the model `m`, on the same model with the bias of eos moved far up, then far down
    (and sos's too): every row then finishes at the first step, where decoding must stop (one column of eos),
    and then no row ever finishes, where it must take exactly max_len steps. Whether the weights make rows
    finish early or late no longer decides whether a decoder that never stops early, or takes one step too few
    or too many, is seen. Only the length is judged here (the tokens were, on `m`), so nothing is decoded here:
    where the learner's own model is not ruled by such a bias (its first tokens are not all eos, or eos comes
    although it is made impossible), there is no verdict."""
    sd, eos, sos = m.sd, special.get("eos", EOS), special.get("sos", SOS)
    B = src.shape[0]
    for shift, ids in ((1e3, [eos]), (-1e3, [eos, sos])):  # (no row says sos: the sos column is told apart)
        bias = sd["out.bias"].clone()
        bias[ids] += shift
        m.mod.load_state_dict({"out.bias": bias}, strict=False)  # (the bias alone: a whole state dict took 9 ms)
        got = _run(m, f"`{name}`", lambda: getattr(learner, name)(m.mod, src, max_len, **special))
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.long, GR_TYPE.format(name))
        tensor(got, name, dtype=torch.long, what="its tokens")
        expect(got.dim() == 2 and got.shape[0] == B and got.shape[1] >= 1, GR_TYPE.format(name))
        L = got.shape[1]
        expect(not (bool((got[:, 0] == sos).all()) and L == (2 if shift > 0 else max_len + 1)),
               GR_WITH_SOS.format(name))
        if shift > 0:
            if bool((got[:, 0] == eos).all()):  # (else the learner's own model is not ruled by the bias)
                expect(L == 1, GR_NO_STOP.format(name))
        elif not bool((got == eos).any()):
            expect(L == max_len, GR_STEPS.format(name))
    m.mod.load_state_dict({"out.bias": sd["out.bias"]}, strict=False)


def _check_greedy_on_devices(learner, reference, rng, devices, name):
    """The decoder, right on the CPU, run with its model and source on every other device: the same tokens, on
    that device. Tokens, flags or masks created on the CPU fail there at any step; on the meta device
    (`_greedy_on_meta`), only in the steps before decoding needs values."""
    for device in devices:
        if device == "cpu":
            continue
        m, src = _greedy_model(learner, reference, rng, 4, 6)
        want = _check_greedy(learner, m, src, 6, name)
        m.mod.to(device)
        try:
            got = getattr(learner, name)(m.mod, src.to(device), 6)
        except LearnerError as exc:
            expect(not any(s in exc.message for s in DEVICE_ERRORS), FIXED_DEVICE_HINT.format(name))
            raise
        tensor(got, name, dtype=torch.long, device=device, what="its tokens")
        expect(torch.equal(got.cpu(), want), GR_DEVICE.format(name))


def _greedy_on_meta(learner, m, src, name):
    """The decoder run with its model and source on the meta device, a GPU to a CPU-only grader (after the
    value checks: the model stays there). Tokens, flags or masks it creates on the CPU meet the meta tensors
    in the first step, before decoding needs values, which the meta device does not have: from there on the
    run gives no verdict."""
    m.mod.to("meta")
    expect_device_agnostic(learner, name, m.mod, src, 4)


# A wrapper made in the learner's process around its model's decode (a check cannot send a function there), and the
# reader of what it noted: for each call, the shape of the tokens fed (tgt_in, by position or by name). It holds no
# tensor and changes nothing.
DECODE_NOTER = ("(lambda calls, torch: (lambda f: (lambda *a, **k: (calls.append([tuple(x.shape) for x in "
                "(a[:1] or [k.get('tgt_in')]) if isinstance(x, torch.Tensor)]), f(*a, **k))[1]), calls.copy))"
                "([], __import__('torch'))")


def _decode_noted(learner, m, run):
    """`run()` with the learner's model's decode wrapped, on this model only, to note the shape of the tokens each
    call is fed, however the call is written: (its result, [[shape of tgt_in] per call])."""
    builtins = learner_builtins(learner, GR_CALLS_GONE)
    made = made_in_learner(learner, DECODE_NOTER, GR_CALLS_GONE, builtins)
    expect(isinstance(made, tuple) and len(made) == 2 and all(isinstance(f, RemoteObject) for f in made),
           GR_CALLS_GONE)
    wrap, read = made
    wrapped = wrap(method(m.mod, "decode", "Transformer"))
    expect(isinstance(wrapped, RemoteObject), GR_CALLS_GONE)
    method(builtins, "setattr", "builtins")(m.mod, "decode", wrapped)
    try:
        got = run()
    finally:
        method(builtins, "delattr", "builtins")(m.mod, "decode")
    calls = read()
    expect(isinstance(calls, list) and all(
        isinstance(c, list) and all(isinstance(s, tuple) and all(type(n) is int for n in s) for s in c)
        for c in calls), GR_CALLS_GONE)
    return got, calls


def _check_one_token_a_step(learner, m, src, max_len, **special):
    """The cached decoder run again on `m` with its model's decode noted: every call fed one position."""
    name = "greedy_decode_cached"
    _, calls = _decode_noted(learner, m, lambda: _run(m, f"`{name}`", lambda: learner.greedy_decode_cached(
        m.mod, src, max_len, **special)))
    for shapes in calls:
        for shape in shapes:
            expect(len(shape) != 2 or shape[1] == 1, GR_PREFIX.format(shape))


@points(1.5, part="greedy_decode")
@prepared(_prepare_greedy(5, 7))
def test_greedy_decode_matches_reference(learner, reference, rng, devices, prepared):
    """Does greedy_decode feed back the argmax at every step, pad after eos and stop when every row is done?"""
    m, src = _greedy_model(learner, reference, rng, 5, 7, prepared=prepared)
    _check_greedy(learner, m, src, 7, "greedy_decode")
    _check_stopping(learner, m, src, 7, "greedy_decode")
    _check_greedy(learner, m, m.one_row, 7, "greedy_decode")  # a batch of one
    _check_greedy_on_devices(learner, reference, rng, devices, "greedy_decode")
    _greedy_on_meta(learner, m, src, "greedy_decode")


@points(2, part="greedy_decode")
@prepared(_prepare_greedy(6, 8, norm_first=True, uncached=False))
def test_greedy_decode_cached_equals_recomputation(learner, reference, rng, devices, prepared):
    """Does greedy_decode_cached give exactly greedy_decode's tokens when rows end at different steps, feeding the
    decoder one token a step?"""
    m, src = _greedy_model(learner, reference, rng, 6, 8, norm_first=True, prepared=prepared, uncached=False)
    _check_greedy(learner, m, src, 8, "greedy_decode_cached")
    _check_one_token_a_step(learner, m, src, 8)
    _check_stopping(learner, m, src, 8, "greedy_decode_cached")
    _check_greedy(learner, m, m.one_row, 8, "greedy_decode_cached")  # a batch of one, where the offset decides
    _check_greedy_on_devices(learner, reference, rng, devices, "greedy_decode_cached")
    _greedy_on_meta(learner, m, src, "greedy_decode_cached")


@points(0.5, part="greedy_decode")
@prepared(_prepare_greedy(4, 6, sos=3, eos=4, pad=5))
def test_greedy_decode_honours_sos_eos_pad(learner, reference, rng, prepared):
    """Do both decoders use the sos, eos and pad ids they are given?"""
    special = {"sos": 3, "eos": 4, "pad": 5}
    m, src = _greedy_model(learner, reference, rng, 4, 6, **special, prepared=prepared)
    for name in ("greedy_decode", "greedy_decode_cached"):
        _check_greedy(learner, m, src, 6, name, **special)
        _check_stopping(learner, m, src, 6, name, **special)
