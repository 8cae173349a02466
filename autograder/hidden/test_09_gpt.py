"""Hidden tests for exercise 09_gpt: byte-level BPE, GPT-2's block and model, GPT-2's weights from
`transformers`, sampling with a temperature, top-k and top-p, and generation with the KV cache.

Part 1 is plain Python on hidden texts drawn here (words of random letters, numbers, punctuation,
runs of spaces and newlines, accented letters, Chinese and emoji). The merges are compared exactly
with the reference's (the `tokenizers` library breaks ties otherwise, so it is no oracle here), the
ids of `encode` with the reference's on the reference's merges, and `decode` with Python's own
UTF-8 decoder (`errors="replace"`) on any bytes, invalid UTF-8 included; round trips hold for
every text. A wrong result is explained by the typical mistake it matches, computed here by a
small BPE of this module with that mistake; each text is tried here first, so that every mistake
a check names changes its result under every seed.

Part 2 runs the learner's modules holding weights drawn here (float32 numbers kept in float64, so
that both sides hold exactly the same model) and compares them with the reference's and with a
functional GPT of this module, which also computes the typical mistakes (post-LN, exact GELU,
a causal mask missing or not offset by the cache, positions not offset, ...). The initialisation
is judged by its statistics, with bounds far outside any sampling noise. Dropout is judged where no draw
matters (p = 1: every dropped tensor is zero) and, for the attention's 0 < p < 1, by a property that only dropout
on the attention weights has, whatever the draws and their order (F.scaled_dot_product_attention's dropout too):
with proj the identity, each output row of a head is a mix of value rows whose weights are each zeroed or scaled
by 1 / (1 - p).

Part 3 loads the state dict of a `transformers.GPT2LMHeadModel` (random small configs, its weights
drawn here so that every mistake shows) and compares the learner's parameters with the expected
ones and the learner's logits with the library's. The state dict and the library's logits are made
here without importing `transformers` (2.4 CPU seconds, more than the rest of a check): the
layout of GPT2LMHeadModel's state dict (`_hf_layout`) and its forward pass (`_hf_logits`: GPT-2
written out in float64, its head tied to the token embedding) are both compared with the pinned
`transformers` on this module's own cases, for many seeds, by tests/book/test_gpt.py.

Part 4 calls `sample` many times with a generator made in the learner's process and judges the
draws by their distribution: the support (nothing outside the top-k or the nucleus), and the
frequencies within a Bernstein bound whose false alarm probability is below 1e-12 per token. The
logits are chosen (tried here first) so that each typical mistake's distribution lies outside the
bound of the right one by more than its own bound: a verdict never depends on the seed. Where a rule shows
only on special logits, they are built or searched for here: logits tied with the k-th largest, equally likely
tokens for top-p's tie order (powers of two: every partial sum exact in float32), logits on which top-p before
top-k, or the filters before the temperature, keep other tokens (away from any rounding boundary), each case
chosen so that the mistakes other checks judge keep the right tokens there.

Part 5 runs `generate` on the learner's model holding drawn weights, in float64, and compares it
with greedy recomputation of the whole prefix by the same model, and, when sampling, with the
learner's own `sample` fed the recomputed logits and a generator seeded alike: generation is
judged apart from the model and the sampler, whose own checks are parts 2 and 4. Only a model
whose caches disagree with the whole sequence fails every generation check, with a hint that
says so, whatever tokens it happens to give (a verdict that does not hang on an argmax). What generate feeds
the model is noted in the learner's process by a forward pre-hook on the model (`RECORDER`, made there from
source: a function cannot cross): its mode and the gradient mode at each call, and the shapes of the ids, however
the call is written. So generating in training mode fails whatever dropout drew, the whole prefix fed at each step
fails though its tokens are right, and a model given in training mode may come back in either mode.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from autograder.hidden.support import (Hint, close, describe, diagnose, expect, expect_device_agnostic, learner_module,
                                       made_in_learner, method, module, odd_tensor, points, tensor)
from autograder.isolation.errors import LearnerError
from autograder.isolation.runner import RemoteObject

F64 = torch.float64
SPLIT = re.compile(rb" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")

# --- hints ------------------------------------------------------------------------------------

TORCH_GONE = ("The notebook's `torch` is not PyTorch any more (the checks build generators from it): do not "
              "rebind the name torch.")
CALLS_GONE = ("The checks could not note the calls of your model in the notebook's process: do not rebind torch, "
              "nor Python's own builtins.")

TB_TYPE = "`train_bpe` must return a list of merges, each a pair (a, b) of int ids."
TB_LARGEST = ("`train_bpe` breaks ties by the LARGEST pair: among pairs with the same count, pick the smallest "
              "one as a tuple (a, then b), e.g. min(pair for pair, n in counts.items() if n == top).")
TB_FIRST_SEEN = ("`train_bpe` breaks ties by the pair counted first (max(counts, key=counts.get) keeps the first "
                 "it meets): among pairs with the same count, pick the smallest one as a tuple (a, then b).")
TB_A_ONLY = ("`train_bpe` breaks ties by the first id a only: among pairs with the same count and the same a, the "
             "smaller b must win too. Compare whole pairs as tuples (a, then b), e.g. min(pair for pair, n in "
             "counts.items() if n == top).")
TB_OVERLAP = ("`train_bpe` does not count overlapping pairs: the chunk [a, a, a] holds the pair (a, a) twice; "
              "count every adjacent pair (zip(ids, ids[1:])).")
TB_SKIP_ONE = ("A merge replaces overlapping occurrences (or keeps the pair's second id): after replacing the "
               "pair at i, continue at i + 2, so that [a, a, a] becomes [n, a] and [a, b, c] becomes [n, c].")
TB_RIGHT_TO_LEFT = ("A merge replaces the occurrences from right to left: [a, a, a] must become [n, a]; replace "
                    "them left to right.")
TB_UNSPLIT = ("`train_bpe` merges across chunks: cut the data with pretokenize and count the pairs inside each "
              "chunk only.")
TB_UNWEIGHTED = ("`train_bpe` counts each distinct chunk once: a chunk that occurs n times adds n to the count of "
                 "each of its pairs.")
TB_ONE_MORE = "`train_bpe` makes one merge too many: it makes vocab_size - 256 merges (ids 256 .. vocab_size - 1)."
TB_ONE_LESS = "`train_bpe` makes one merge too few: it makes vocab_size - 256 merges (ids 256 .. vocab_size - 1)."
TB_GENERIC = ("`train_bpe` differs from the merges of the exercise: count every adjacent pair (overlapping) in "
              "every chunk, pick the most frequent, ties to the smallest pair, give it the next id and replace it "
              "left to right without overlap.")
TB_SMALL_VOCAB = "`train_bpe` must raise a ValueError for a vocab_size below 256 (the 256 bytes are the first ids)."
TB_NOT_EMPTY = ("`train_bpe` must return no merge for vocab_size = 256, or when no chunk holds two ids "
                "(empty data, or chunks of one byte each).")
TB_STOPS_EARLY = ("`train_bpe` stops while a chunk still holds two ids: merge until vocab_size is reached or no "
                  "chunk has a pair left, even when the best pair occurs only once.")
TB_RUNS_ON = ("`train_bpe` goes on when no chunk holds a pair any more: stop there (return fewer merges than "
              "vocab_size - 256).")
TB_PREFIX = ("`train_bpe(data, 256 + n)` must be the first n merges of a longer training: make exactly "
             "vocab_size - 256 merges, as long as there are pairs.")
MP_TYPE = "`merge_pair` must return the new list of ids, a list of int."
MP_GENERIC = ("`merge_pair(ids, pair, new_id)` must replace every occurrence of the pair in ids by new_id, left to "
              "right without overlap, and keep every other id in its place.")
TB_BAD_MERGE = ("`train_bpe` returns an invalid merge: each merge's ids must exist before it (below 256 + its "
                "index), and no pair is merged twice.")

EN_TYPE = "`encode` must return a Python list of int ids."
EN_REVERSE = ("`encode` applies the LATEST merges first: in each chunk, repeatedly merge the adjacent pair whose "
              "merge came EARLIEST in `merges` (the lowest rank).")
EN_LEFTMOST = ("`encode` merges the leftmost pair that is a merge: merge the pair whose merge came EARLIEST in "
               "`merges`, wherever it is in the chunk.")
EN_UNSPLIT = ("`encode` merges across chunks: cut the UTF-8 bytes with pretokenize and merge inside each chunk, "
              "as training did.")
EN_CODEPOINTS = ("`encode` starts from the characters' code points (ord), not the UTF-8 bytes: "
                 "list(text.encode('utf-8')).")
EN_GENERIC = ("`encode` differs from the exercise's: UTF-8 bytes, pretokenize, then in each chunk the earliest "
              "merge first, all its occurrences left to right, until no adjacent pair is a merge.")

DE_TYPE = "`decode` must return a str."
DE_RAISES = ("`decode` raises {} on invalid UTF-8: a model can emit half a character; decode the bytes with "
             "errors=\"replace\" (invalid bytes become U+FFFD), never raise.")
DE_IGNORE = ("`decode` drops invalid bytes (errors=\"ignore\"): replace each one by U+FFFD "
             "(errors=\"replace\").")
DE_PER_TOKEN = ("`decode` decodes each token on its own: a character whose bytes are split between tokens "
                "becomes U+FFFD; concatenate all the bytes first, then decode them once.")
DE_LATIN1 = "`decode` reads the bytes as Latin-1 (one character per byte): decode them as UTF-8."
DE_GENERIC = ("`decode` differs from the ids' bytes (a merge's bytes are its two parts' bytes), concatenated and "
              "decoded as UTF-8 with invalid bytes replaced by U+FFFD.")
DE_RANGE = "`decode` must raise a ValueError for an id outside 0 .. 255 + len(merges) (a negative one too)."
RT_GENERIC = ("decode(encode(text)) is not the text: every string (accents, Chinese, emoji, whitespace) must "
              "survive the round trip.")

MD_STATE = "`{}`'s state_dict() is not a dict of tensors."
MD_NOT_TIED = ("The head is not tied: self.head.weight must BE self.tok.weight (one parameter, "
               "self.head.weight = self.tok.weight), not a copy and not a second parameter.")
MD_MAX_LEN = "`GPT` must keep its max_len as self.max_len."
MD_INIT_STD = ("{} is not initialised as GPT-2: every Linear and Embedding weight from N(0, 0.02^2), biases 0, "
               "LayerNorms 1 and 0.")
MD_INIT_RESID = ("The residual projections (attn.proj and mlp.proj of each block) are not scaled by depth: draw "
                 "them from N(0, (0.02 / sqrt(2 * n_layers))^2).")
MD_INIT_BIAS = "{} is not initialised as GPT-2: biases start at 0, LayerNorm weights at 1 and their biases at 0."
POST_LN = ("The block is post-LN: GPT-2 is pre-LN, x = x + drop(attn(ln1(x))), then x = x + drop(mlp(ln2(x))); "
           "the LayerNorms act on each branch's input, not on the sum.")
GELU_EXACT = ("The MLP uses the exact GELU: GPT-2's is the tanh approximation, nn.GELU(approximate=\"tanh\").")
GELU_RELU = "The MLP uses ReLU: GPT-2's activation is GELU with the tanh approximation."
NO_MASK = ("The attention is not causal: token i must see the keys 0 .. i only (masked_fill the later ones with "
           "-inf before the softmax).")
MASK_NOT_OFFSET = ("The causal mask ignores the cache: with T_past cached tokens, the new token i sits at position "
                   "T_past + i and sees the keys 0 .. T_past + i (a (T, T_past + T) mask, tril(diagonal=T_past)).")
NO_SCALE = "The scores are not divided by sqrt(d / H), the width of one head."
SCALE_D = "The scores are divided by sqrt(d_model): divide by sqrt(d / H), the width of one head."
QKV_ORDER = ("The queries, keys and values are taken from qkv's output in another order: q, k, v in that order "
             "(qkv(x).split(d, dim=-1)).")
HEADS_SPLIT = ("The heads are split and merged without the transposes: view the queries, keys and values as (B, T, "
               "H, d / H), then transpose(1, 2) to (B, H, T, d / H); merge the output back with transpose(1, 2) "
               "before the reshape to (B, T, d).")
HEADS_SPLIT_ONLY = ("The heads are split without the transpose: view the queries, keys and values as (B, T, H, d / H), "
                    "then transpose(1, 2) to (B, H, T, d / H); a view or reshape straight to (B, H, T, d / H) mixes "
                    "the tokens.")
HEADS_MERGE_ONLY = ("The heads are merged back without the transpose: transpose the attention's output (B, H, T, "
                    "d / H) to (B, T, H, d / H) (transpose(1, 2)) before the reshape to (B, T, d).")
DROP_ATTN = ("The attention's dropout is not on the attention weights: in training mode, self.drop acts on "
             "softmax(scores) before the product with the values, and nowhere else in CausalSelfAttention.")
DROP_ATTN_OUTPUT = ("The attention's dropout is applied after weights @ v (on the attention's output, or after proj) "
                    "instead of on the attention weights: drop softmax(scores) itself, weights = "
                    "self.drop(softmax(scores)), then weights @ v; a dropped weight removes one value row from a "
                    "token's mix, it does not zero single numbers of the output.")
DROP_BLOCK = ("`GPTBlock`'s dropout is not on both residual branches: in training mode, x = x + drop(attn(ln1(x))), "
              "then x = x + drop(mlp(ln2(x))); nothing else of the block is dropped.")
DROP_GPT = ("`GPT`'s dropout is not on the sum of the embeddings: in training mode, x = drop(tok(ids) + "
            "pos(positions)) before the blocks, and the blocks drop their own branches.")
LN_EPS = ("The LayerNorms use another eps than GPT-2's: nn.LayerNorm(d) keeps PyTorch's default, eps = 1e-5, "
          "as GPT-2 does.")
NO_LN_F = "The final LayerNorm ln_f is missing before the head."
NO_POS = "The positions are missing: add self.pos(positions) to the token embeddings."
POS_NOT_OFFSET = ("The positions do not continue after the cache: tokens fed with T_past cached ones are at "
                  "positions T_past .. T_past + T - 1 (torch.arange(T_past, T_past + T)).")
CACHE_TYPE = "`{}` must return a pair (output, cache), the cache a pair (k, v) of tensors (B, H, T_past + T, d / H)."
CACHE_KV = ("The returned cache is not the keys and values of all T_past + T tokens: append the new keys and "
            "values to the cache's along the tokens (dim 2), after splitting the heads, before the projection.")
CACHE_LIST = "`GPT` must return (logits, caches): the caches a list with one (k, v) pair per block."
BL_GENERIC = ("`GPTBlock` differs from GPT-2's block: pre-LN, causal multi-head self-attention (q, k, v from qkv), "
              "then the MLP fc, tanh GELU, proj, each on a residual branch.")
AT_GENERIC = ("`CausalSelfAttention` with a cache differs from attending over the cached and the new keys, new "
              "token i seeing the keys 0 .. T_past + i.")
GPT_GENERIC = ("`GPT`'s logits differ: token plus learned position embeddings, the blocks, ln_f, and the head "
               "tied to tok.")
GPT_CACHE_GENERIC = ("Fed in pieces with the caches, `GPT` gives other logits than on the whole sequence at once: "
                     "positions and the causal mask must continue after the cache.")
TOO_LONG = ("`GPT` must raise a ValueError when T_past + T exceeds max_len (the learned positions stop there), "
            "and accept exactly max_len tokens.")

HF_RAISES = ("`load_hf_gpt2` raises {} on a complete GPT-2 state dict of a matching config: GPT-2's Conv1D "
             "layers store their weights as (in, out), so transpose c_attn, c_proj, c_fc and mlp.c_proj's weights "
             "into nn.Linear's (out, in); and ignore the keys your model does not need (attn.bias, lm_head.weight).")
HF_RETURN = "`load_hf_gpt2` must return the model it loaded (a module), not {}."
HF_NOT_TRANSPOSED = ("`load_hf_gpt2` copies {} without transposing it: GPT-2's Conv1D stores (in, out), nn.Linear "
                     "(out, in); transpose every Conv1D weight (attn.c_proj's is square, so its shape does not "
                     "tell).")
HF_UNCHANGED = "`load_hf_gpt2` does not copy {}: every parameter of the model comes from the state dict."
HF_QKV = ("`load_hf_gpt2` puts c_attn's queries, keys and values in another order: keep them in c_attn's order "
          "(transposed as a whole), the order qkv uses.")
HF_WRONG_KEY = "`load_hf_gpt2` copies {} from the wrong key of the state dict."
HF_GENERIC = "`load_hf_gpt2` leaves {} with other values than the state dict's (transposed for a Conv1D weight)."
HF_MODEL = ("The weights are loaded right, but your GPT's logits differ from GPT-2's ({}): fix part 2 first; "
            "GPT-2 is pre-LN, with the tanh GELU, learned positions, a final LayerNorm and a tied head.")
HF_HEAD = ("The weights are loaded, but the head is not tied to tok (part 2): GPT-2's lm_head is wte itself, so "
           "its logits read the loaded embedding.")
HF_MISSING = ("`load_hf_gpt2` must raise a ValueError naming the key when one that the model needs is missing "
              "(here {}).")
HF_SHAPE = ("`load_hf_gpt2` must raise a ValueError naming the key when a tensor does not fit its parameter "
            "(here {}, of another shape).")

SA_TYPE = "`sample` must return the drawn id as a Python int (int(...)), not {}."
SA_RANGE = "`sample` returns an id outside 0 .. V - 1: it must be the index of one of the logits."
SA_GREEDY = ("`sample` with temperature=0 must return the argmax of the logits (the lowest id on a tie, as "
             "torch.argmax), without drawing.")
SA_GREEDY_LAST = "On a tie, temperature=0 must return the LOWEST id among the largest logits, as torch.argmax."
SA_GREEDY_RAISES = ("`sample` raises {} at temperature=0: temperature 0 is greedy decoding, the argmax, with no "
                    "division by the temperature.")
SA_COLD = ("At a temperature close to 0, `sample` must almost always draw the argmax: divide the LOGITS by the "
           "temperature before the softmax.")
SA_AFTER_SOFTMAX = ("The temperature has no effect or the wrong one: divide the LOGITS by it before the softmax "
                    "(dividing the probabilities after the softmax changes nothing once they are renormalised).")
SA_TIMES = "The logits are multiplied by the temperature: divide them by it."
SA_NEGATIVE = "`sample` must raise a ValueError for a negative temperature."
SA_FILTERS_FIRST = ("`sample` applies top_k or top_p before the temperature: divide the logits by the temperature "
                    "FIRST, then filter (the nucleus of top_p depends on the temperature).")
SA_NOT_SEEDED = ("`sample` does not draw from `generator`: two generators seeded alike must give the same draws "
                 "(torch.multinomial(probs, 1, generator=generator)).")
SA_IGNORES_SEED = "`sample` gives the same draws whatever the generator's seed: draw with `generator`."
SA_OUTSIDE_K = "`sample` draws a token outside the top_k largest logits: set the others to -inf."
SA_K_MINUS = "`sample` keeps only top_k - 1 tokens: keep the top_k largest logits, the k-th included."
SA_K_PLUS = "`sample` keeps top_k + 1 tokens: keep exactly the top_k largest logits."
SA_K_SMALLEST = "`sample` keeps the top_k SMALLEST logits: keep the largest ones."
SA_K_ONE = "`sample` with top_k=1 must always draw the largest logit's token (k = 1 is a valid top_k)."
SA_K_TIES = ("`sample` drops logits tied with the k-th largest: keep every logit equal to the k-th largest too "
             "(set to -inf only the logits BELOW it), not exactly k indices.")
SA_K_BELOW_ONE = ("`sample` must raise a ValueError for top_k < 1 (top_k=0 included): only top_k=None disables "
                  "top-k.")
SA_K_ALL = ("`sample` fails when top_k >= V: then every token is kept (torch.topk needs k <= V, so skip the "
            "filter).")
SA_OUTSIDE_P = "`sample` draws a token outside the nucleus: keep only the smallest prefix reaching top_p."
SA_P_DROPS = ("`sample` drops the token that crosses top_p: keep the smallest prefix (by decreasing probability) "
              "whose cumulative probability REACHES top_p, the crossing token included.")
SA_P_UNSORTED = ("`sample` takes the cumulative probabilities in id order: sort the probabilities in decreasing "
                 "order first, then keep the prefix reaching top_p.")
SA_P_EXACT = ("`sample` keeps more than the smallest prefix reaching top_p: with four equally likely tokens and "
              "top_p = 0.5 only the first two (lowest ids first, a stable sort) are kept; keep a token while the "
              "mass BEFORE it is below top_p.")
SA_P_TIE_ORDER = ("`sample` keeps the wrong tokens among equally likely ones: on ties, the lower id comes first in "
                  "the decreasing order (a stable sort: torch.sort(probs, descending=True, stable=True)).")
SA_P_BEFORE_K = ("`sample` applies top_p before top_k: top_p acts on the probabilities that top_k left, "
                 "renormalised (temperature, then top_k, then top_p).")
SA_P_TOP = "`sample` must always keep the most probable token, even when top_p is below its probability."
SA_FREQ = ("The draws of `sample` do not follow the kept tokens' renormalised probabilities: softmax of "
           "logits / temperature, filtered by top_k, then top_p, renormalised, one torch.multinomial draw.")

GE_PROMPT = "The result of `generate` must start with the prompts themselves, unchanged."
GE_MODEL_CACHE = ("`generate` goes wrong because your GPT gives other logits fed token by token with its caches than "
                  "on the whole sequence at once: fix the model first (part 2's checks name the mistake).")
GE_SAMPLE = ("`generate` goes wrong because your `sample` with temperature=0 is not the argmax: fix sample "
             "first (part 4).")
GE_TRAIN_MODE = ("`generate` runs the model in training mode (dropout on): call model.eval() before generating "
                 "(afterwards, leaving it in eval mode or restoring the caller's mode are both fine).")
GE_MODE_AFTER = ("`generate` puts a model that was in eval mode into training mode: afterwards, leave it in eval "
                 "mode or restore the mode it had (was = model.training, ..., model.train(was)).")
GE_PREFIX = ("`generate` feeds the model more positions than the prompts and the new tokens: feed the prompts "
             "once, then only each new token, (B, 1), with the caches the model returned (one position a step, "
             "not the whole prefix).")
GE_GRAD = ("`generate` runs the model with gradients on: generate inside torch.no_grad() (or "
           "torch.inference_mode()).")
GE_GREEDY = ("`generate` at temperature 0 differs from greedy decoding recomputed on the whole prefix at each "
             "step: feed the prompts once, then each new token at the next position with the caches.")
GE_ROWS = ("`generate` draws the rows in another order: at each step draw row 0's token first, then row 1's, "
           "... (a shared generator gives its draws in that order).")
GE_SETTINGS = ("`generate` does not pass its {} on to `sample` (sample then uses its defaults): each row's "
               "token is sample(last_logits[b], temperature, top_k, top_p, generator), with every setting generate "
               "was given.")
GE_SAMPLED = ("`generate` with a generator differs from sample() on the last logits of each row, rows in order, "
              "step by step: one draw per row and step, from the model's logits at the last position.")
GE_SAMPLE_SEED = ("`generate` cannot follow the generator because your `sample` does not draw from it (two "
                  "generators seeded alike give other draws): fix sample first (part 4).")
GE_TOO_LONG = "`generate` must raise a ValueError when T + max_new_tokens exceeds the model's max_len."
GE_ZERO = "`generate` with max_new_tokens=0 must return the prompts unchanged."


# --- random inputs ---------------------------------------------------------------------------

def _randint(rng, lo, hi):
    """A random int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=rng))


def _pick(rng, items):
    return items[_randint(rng, 0, len(items) - 1)]


def _uniform(rng, lo, hi):
    return lo + (hi - lo) * float(torch.rand((), generator=rng, dtype=F64))


def _remote(x, hint):
    """`x` as a handle to an object of the learner's process, or the hint."""
    expect(isinstance(x, RemoteObject), hint)
    return x


def _generator(learner, seed):
    """A torch.Generator seeded with `seed`, made in the learner's process."""
    gen = _remote(_remote(learner.attribute("torch", "Generator"), TORCH_GONE)(), TORCH_GONE)
    method(gen, "manual_seed", "torch.Generator")(int(seed))
    return gen


# --- Part 1: byte-level BPE (6 points) -------------------------------------------------------

UNICODE = ["é", "ü", "ß", "naïve", "Ωμέγα", "中文", "日本語", "🎉", "👋🏽", "e\u0301", "€", "—"]
PUNCT = [".", ",", ";", "!", "?", "...", "'", "-", "(", ")", ":"]
SPACES = ["  ", "   ", "\n", "\n\n", "\t", " \n", "    "]


def _text(rng, n_words, *, letters=None, unicode=True):
    """A random text: words over a few letters (so that pairs repeat), numbers, punctuation, runs of
    whitespace, and (with `unicode`) accented letters, Chinese and emoji."""
    letters = letters or "".join(_pick(rng, "abcdefghijklmnopqrstuvwxyzAB") for _ in range(6))
    words = [("".join(_pick(rng, letters) for _ in range(_randint(rng, 1, 5)))) for _ in range(8)]
    out = []
    for _ in range(n_words):
        k = _randint(rng, 0, 12)
        if k <= 5:
            piece = _pick(rng, words)
        elif k == 6:
            piece = _pick(rng, letters) * _randint(rng, 3, 5)  # a run: overlapping pairs
        elif k == 7:
            piece = str(_randint(rng, 0, 999))
        elif k == 8:
            piece = _pick(rng, PUNCT)
        elif k == 9 and unicode:
            piece = _pick(rng, UNICODE)
        elif k in (9, 10):
            piece = _pick(rng, SPACES)
        else:
            piece = _pick(rng, words).upper()
        out.append(piece + (" " if _randint(rng, 0, 3) else ""))
    return "".join(out)


def _chunks(data, split=True):
    """The distinct chunks of `data` as id lists, with their numbers of occurrences, in order of appearance."""
    counts = {}
    for c in (SPLIT.findall(data) if split else [data] if data else []):
        counts[c] = counts.get(c, 0) + 1
    return [list(c) for c in counts], list(counts.values())


def _merge(ids, pair, new, mode="left"):
    """`ids` with `pair` replaced by `new`: left to right without overlap, or with a typical mistake."""
    if mode == "right":
        return _merge(ids[::-1], pair[::-1], new)[::-1]
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new)
            i += 1 if mode == "skip1" else 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _pairs(ids, overlap=True):
    if overlap:
        return list(zip(ids, ids[1:]))
    out, j = [], 0
    while j + 1 < len(ids):
        out.append((ids[j], ids[j + 1]))
        j += 2 if ids[j] == ids[j + 1] and j + 2 < len(ids) and ids[j + 2] == ids[j] else 1
    return out


def _train(data, vocab_size, *, tie="smallest", overlap=True, mode="left", split=True, weighted=True, extra=0):
    """BPE training as the exercise asks, or with one typical mistake."""
    chunks, weights = _chunks(data, split)
    merges = []
    for new in range(256, vocab_size + extra):
        counts = {}
        for c, w in zip(chunks, weights):
            for p in _pairs(c, overlap):
                counts[p] = counts.get(p, 0) + (w if weighted else 1)
        if not counts:
            break
        top = max(counts.values())
        if tie == "first":
            best = max(counts, key=counts.get)
        elif tie == "a_only":  # the smallest a, then (min keeps the first it meets) the pair counted first
            best = min((p for p, n in counts.items() if n == top), key=lambda p: p[0])
        else:
            best = (max if tie == "largest" else min)(p for p, n in counts.items() if n == top)
        merges.append(best)
        chunks = [_merge(c, best, new, mode) for c in chunks]
    return merges


TRAIN_VARIANTS = {
    "largest": ({"tie": "largest"}, TB_LARGEST), "first": ({"tie": "first"}, TB_FIRST_SEEN),
    "a_only": ({"tie": "a_only"}, TB_A_ONLY),
    "overlap": ({"overlap": False}, TB_OVERLAP), "skip1": ({"mode": "skip1"}, TB_SKIP_ONE),
    "right": ({"mode": "right"}, TB_RIGHT_TO_LEFT), "unsplit": ({"split": False}, TB_UNSPLIT),
    "unweighted": ({"weighted": False}, TB_UNWEIGHTED), "one_more": ({"extra": 1}, TB_ONE_MORE),
    "one_less": ({"extra": -1}, TB_ONE_LESS),
}


def _merges(got):
    """The learner's merges as a list of (int, int) tuples, or a hint."""
    expect(isinstance(got, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(type(i) is int for i in p) for p in got), TB_TYPE)
    return [tuple(p) for p in got]


def _train_case(rng, n_words, vocab_size, shows, **text_kw):
    """Data (tried here first) on which each mistake of `shows` changes the merges, each in its own way (so that
    the hint names the right one)."""
    for _ in range(300):
        data = _text(rng, n_words, **text_kw).encode("utf-8")
        seen = [_train(data, vocab_size)]
        for s in shows:
            merges = _train(data, vocab_size, **TRAIN_VARIANTS[s][0])
            if merges in seen:
                break
            seen.append(merges)
        else:
            return data
    raise RuntimeError("no text found on which the training mistakes show")


def _ties_by_a_only(merges, data, vocab_size):
    """Whether `merges` are a training as the exercise asks except that ties go to the smallest first id a, whatever
    the b (in whichever order the pairs were counted): at each step, a pair of the highest count whose a is the
    smallest a among them."""
    chunks, weights = _chunks(data)
    made = 0
    for new in range(256, vocab_size):
        counts = {}
        for c, w in zip(chunks, weights):
            for p in _pairs(c):
                counts[p] = counts.get(p, 0) + w
        if not counts:
            break
        top = max(counts.values())
        smallest_a = min(p[0] for p, n in counts.items() if n == top)
        if made == len(merges) or counts.get(merges[made]) != top or merges[made][0] != smallest_a:
            return False
        chunks = [_merge(c, merges[made], new) for c in chunks]
        made += 1
    return made == len(merges)


def _judge_train(learner, reference, data, vocab_size):
    got = _merges(learner.train_bpe(data, vocab_size))
    expected = [tuple(p) for p in reference.train_bpe(data, vocab_size)]
    if got != expected:
        mistakes = [(hint, lambda kw=kw: _train(data, vocab_size, **kw)) for kw, hint in TRAIN_VARIANTS.values()]
        mistakes.append((TB_A_ONLY, lambda: got if _ties_by_a_only(got, data, vocab_size) else None))
        raise Hint(diagnose(got, mistakes, TB_GENERIC, same=lambda a, b: a == b))


@points(2, part="train_bpe")
def test_train_bpe_matches_reference(learner, reference, rng):
    """Does train_bpe learn exactly the reference's merges on hidden texts (accents, Chinese, emoji, spaces)?"""
    cases = ((_randint(rng, 60, 90), 256 + _randint(rng, 25, 40), ("largest", "first", "a_only", "overlap", "skip1")),
             (_randint(rng, 60, 90), 256 + _randint(rng, 25, 40), ("unsplit", "unweighted", "right")),
             (_randint(rng, 30, 50), 256 + _randint(rng, 10, 20), ("one_more", "one_less")))
    for n_words, vocab_size, shows in cases:
        data = _train_case(rng, n_words, vocab_size, shows)
        _judge_train(learner, reference, data, vocab_size)


def _merge_pair_cases(rng):
    """(ids, pair, new_id) cases of merge_pair: runs of one id (overlapping pairs), a pair at either end, next to
    its own second id, absent, and an empty list."""
    a, b, c = (int(i) for i in torch.randperm(256, generator=rng)[:3])
    new = 256 + _randint(rng, 0, 40)
    return [([a, a, a], (a, a), new), ([b, a, a, a, a], (a, a), new), ([a, b, c, a, b], (a, b), new),
            ([c, a, b, b, a, b], (a, b), new), ([a, c, b], (a, b), new), ([a], (a, a), new), ([], (a, b), new)]


def _ties_case(rng):
    """A text whose first merge alone tells the tie rules apart, whatever order a training counts its pairs in: a
    word of four letters x < y < z < w, "yxzxxw", repeated. Its five pairs are counted as often; the smallest,
    (x, x), is neither the first counted (y, x) nor the largest (z, x), and comes between the other two that start
    with x: ties by the first id a alone give (x, z) or (x, w), taking the first or the last of them counted."""
    x, y, z, w = sorted(chr(ord("a") + int(i)) for i in torch.randperm(26, generator=rng)[:4])
    return " ".join([y + x + z + x + x + w] * _randint(rng, 2, 3)).encode()


@points(1, part="train_bpe")
def test_train_bpe_ties_and_overlapping_pairs(learner, reference, rng):
    """Does merge_pair replace left to right without overlap, and on short texts where the tie rule and
    overlapping pairs decide, are the merges the reference's?"""
    cases = _merge_pair_cases(rng)
    got = [learner.merge_pair(list(ids), pair, new) for ids, pair, new in cases]
    for (ids, pair, new), g in zip(cases, got):
        g = _ids(g, MP_TYPE)
        if g != _merge(ids, pair, new):
            raise Hint(diagnose(g, [(TB_SKIP_ONE, _merge(ids, pair, new, "skip1")),
                                    (TB_RIGHT_TO_LEFT, _merge(ids, pair, new, "right"))], MP_GENERIC,
                                same=lambda x, y: x == y))
    _judge_train(learner, reference, _ties_case(rng), 256 + _randint(rng, 2, 4))
    for shows in (("largest", "first", "a_only"), ("overlap", "skip1", "right"), ("largest", "first", "overlap")):
        letters = "".join(_pick(rng, "abcxyz") for _ in range(3))
        vocab_size = 256 + _randint(rng, 4, 8)
        data = _train_case(rng, _randint(rng, 5, 9), vocab_size, shows, letters=letters, unicode=False)
        _judge_train(learner, reference, data, vocab_size)


@points(0.5, part="train_bpe")
def test_train_bpe_stops_and_rejects_small_vocabularies(learner, reference, rng):
    """Does train_bpe raise a ValueError below 256, return no merge at 256, and stop when no pair is left?"""
    for v in (255, 0, -_randint(rng, 1, 50)):
        try:
            learner.train_bpe(b"abc", v)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", TB_SMALL_VOCAB)
        else:
            raise Hint(TB_SMALL_VOCAB)
    for data, v in ((_text(rng, 10).encode(), 256), (b"", 300), (b"a.1 ", 300)):
        expect(_merges(learner.train_bpe(data, v)) == [], TB_NOT_EMPTY)
    data = _text(rng, _randint(rng, 10, 20), unicode=False).encode()
    chunks, _ = _chunks(data)
    most = sum(len(c) - 1 for c in chunks)  # no training makes more merges than this
    big = 256 + most + 20
    full = _merges(learner.train_bpe(data, big))
    seen, ends = set(), []
    for i, (a, b) in enumerate(full):
        expect(0 <= a < 256 + i and 0 <= b < 256 + i and (a, b) not in seen, TB_BAD_MERGE)
        seen.add((a, b))
    for c in chunks:  # training ends when every chunk is one id
        for i, pair in enumerate(full):
            c = _merge(c, pair, 256 + i)
        ends.append(len(c))
    if max(ends) > 1 or len(full) > most:
        mistakes = [(hint, lambda kw=kw: _train(data, big, **kw)) for kw, hint in TRAIN_VARIANTS.values()]
        raise Hint(diagnose(full, mistakes, TB_STOPS_EARLY if max(ends) > 1 else TB_RUNS_ON, same=lambda a, b: a == b))
    n = _randint(rng, 2, max(len(full) - 1, 2))
    expect(_merges(learner.train_bpe(data, 256 + n)) == full[:n], TB_PREFIX)


def _encode(text, merges, *, order="rank", split=True, codepoints=False, mode="left"):
    """BPE encoding as the exercise asks, or with one typical mistake."""
    rank = {tuple(p): i for i, p in enumerate(merges)}
    data = text.encode("utf-8")
    out = []
    if codepoints:
        chunks = [[ord(ch) for ch in c.decode("utf-8", errors="replace")] for c in SPLIT.findall(data)]
    else:
        chunks = [list(c) for c in (SPLIT.findall(data) if split else [data] if data else [])]
    for ids in chunks:
        while len(ids) > 1:
            present = [p for p in zip(ids, ids[1:]) if p in rank]
            if not present:
                break
            best = {"rank": lambda: min(present, key=rank.__getitem__),
                    "reverse": lambda: max(present, key=rank.__getitem__),
                    "leftmost": lambda: present[0]}[order]()
            ids = _merge(ids, best, 256 + rank[best], mode)
            if mode != "left" and len(ids) > 4 * len(text) + 8:
                break  # a merge that does not shrink the chunk: stop, the result is wrong anyway
        out += ids
    return out


ENCODE_VARIANTS = (({"order": "reverse"}, EN_REVERSE), ({"order": "leftmost"}, EN_LEFTMOST),
                   ({"split": False}, EN_UNSPLIT), ({"codepoints": True}, EN_CODEPOINTS),
                   ({"mode": "skip1"}, TB_SKIP_ONE))


def _ids(got, hint=EN_TYPE):
    expect(isinstance(got, list) and all(type(i) is int for i in got), hint)
    return got


@points(1.5, part="train_bpe")
def test_encode_matches_reference(learner, reference, rng):
    """With the reference's merges, does encode give the reference's ids on hidden texts, non-ASCII included?"""
    for shows in (("reverse", "leftmost"), ("unsplit",), ("reverse", "leftmost")):
        for _ in range(200):
            data = _text(rng, _randint(rng, 60, 90)).encode()
            merges = [tuple(p) for p in reference.train_bpe(data, 256 + _randint(rng, 40, 60))]
            texts = [_text(rng, _randint(rng, 10, 20)) for _ in range(3)]
            texts.append(data.decode() + _pick(rng, UNICODE))
            variants = {k: [_encode(t, merges, **kw) for t in texts]
                        for k, kw in (("reverse", {"order": "reverse"}), ("leftmost", {"order": "leftmost"}),
                                      ("unsplit", {"split": False}))}
            right = [_encode(t, merges) for t in texts]
            if all(variants[s] != right for s in shows):
                break
        else:
            raise RuntimeError("no text found on which the encoding mistakes show")
        got = [_ids(learner.encode(t, merges)) for t in texts]
        expected = [reference.encode(t, merges) for t in texts]
        if got != expected:
            mistakes = [(hint, lambda kw=kw: [_encode(t, merges, **kw) for t in texts]) for kw, hint in ENCODE_VARIANTS]
            raise Hint(diagnose(got, mistakes, EN_GENERIC, same=lambda a, b: a == b))


def _vocab(merges):
    table = [bytes([b]) for b in range(256)]
    for a, b in merges:
        table.append(table[a] + table[b])
    return table


def _decoded(learner, ids, merges):
    """The learner's decode(ids, merges) as a str, or a hint (decode must never raise on invalid UTF-8)."""
    try:
        got = learner.decode(ids, merges)
    except LearnerError as exc:
        expect(exc.etype not in ("UnicodeDecodeError", "UnicodeError"), DE_RAISES.format(exc.etype))
        raise
    expect(isinstance(got, str), DE_TYPE)
    return got


@points(0.5, part="train_bpe")
def test_decode_round_trips_and_checks_ids(learner, reference, rng):
    """Is decode(encode(text)) the text for hidden texts (emoji, Chinese, whitespace), and an unknown id an error?"""
    data = _text(rng, _randint(rng, 60, 90)).encode()
    merges = [tuple(p) for p in reference.train_bpe(data, 256 + _randint(rng, 40, 60))]
    texts = [_text(rng, _randint(rng, 10, 25)) for _ in range(4)] + ["", "".join(UNICODE), "\x00\x7f \t\n",
                                                                     data.decode()]
    for t in texts:
        ids = reference.encode(t, merges)
        got = _decoded(learner, ids, merges)
        if got != t:
            table = _vocab(merges)
            raise Hint(diagnose(got, [(DE_PER_TOKEN, "".join(table[i].decode("utf-8", "replace") for i in ids)),
                                      (DE_LATIN1, b"".join(table[i] for i in ids).decode("latin-1"))], DE_GENERIC,
                                same=lambda a, b: a == b))
        expect(_decoded(learner, _ids(learner.encode(t, merges)), merges) == t, RT_GENERIC)
    for bad in ([256 + len(merges)], [_randint(rng, 0, 255), -1], [10**6]):
        try:
            learner.decode(bad, merges)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", DE_RANGE)
        else:
            raise Hint(DE_RANGE)


@points(0.5, part="train_bpe")
def test_decode_replaces_invalid_utf8(learner, reference, rng):
    """On any bytes, invalid UTF-8 included (a character cut between tokens too), does decode replace, not raise?"""
    data = _text(rng, _randint(rng, 60, 90)).encode()
    merges = [tuple(p) for p in reference.train_bpe(data, 256 + _randint(rng, 30, 50))]
    table = _vocab(merges)
    cut = "中".encode()
    cases = [[0xFF], [_randint(rng, 0x80, 0xBF), 104, 105], [104, cut[0], cut[1]], list(cut[:2]) + [32] + list(cut),
             [104, 0xC3], [_randint(rng, 0xF5, 0xFF), _randint(rng, 0x80, 0xBF)]]
    for _ in range(4):
        cases.append([_randint(rng, 0, 255 + len(merges)) for _ in range(_randint(rng, 3, 12))])
    for ids in cases:
        got = _decoded(learner, ids, merges)
        raw = b"".join(table[i] for i in ids)
        if got != raw.decode("utf-8", errors="replace"):
            raise Hint(diagnose(got, [(DE_IGNORE, raw.decode("utf-8", errors="ignore")),
                                      (DE_PER_TOKEN, "".join(table[i].decode("utf-8", "replace") for i in ids)),
                                      (DE_LATIN1, raw.decode("latin-1"))], DE_GENERIC, same=lambda a, b: a == b))


# --- Part 2: the model (6 points) ------------------------------------------------------------

def _ln(x, sd, p, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], sd[p + "weight"], sd[p + "bias"], eps)


def _linear(x, sd, p):
    return x @ sd[p + "weight"].T + sd[p + "bias"]


def _attention(x, sd, p, H, cache=None, *, mask="causal", scale="head", order=(0, 1, 2), heads="right"):
    """CausalSelfAttention written out, or with one typical mistake; -> (y, (k, v)). `heads`: "right", or the
    heads split ("split"), merged ("merge") or both ("wrong") by a reshape without the transpose."""
    B, T, d = x.shape
    parts = _linear(x, sd, p + "qkv.").split(d, dim=-1)
    q, k, v = (parts[i] for i in order)
    if heads in ("right", "merge"):
        q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
    else:
        q, k, v = (t.reshape(B, H, T, d // H) for t in (q, k, v))
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    S = k.size(2)
    s = q @ k.transpose(-2, -1) / {"head": math.sqrt(d // H), "none": 1.0, "model": math.sqrt(d)}[scale]
    if mask != "none":
        allowed = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T if mask == "causal" else 0)
        s = s.masked_fill(~allowed, float("-inf"))
    y = s.softmax(-1) @ v
    y = y.transpose(1, 2).reshape(B, T, d) if heads in ("right", "split") else y.reshape(B, T, d)
    return _linear(y, sd, p + "proj."), (k, v)


def _block(x, sd, p, H, cache=None, *, post_ln=False, act="tanh", eps=1e-5, **attn):
    """GPTBlock written out, or with one typical mistake (`eps`: its LayerNorms'); -> (x, cache)."""
    def mlp(h):
        h = _linear(h, sd, p + "mlp.fc.")
        h = {"tanh": lambda: F.gelu(h, approximate="tanh"), "exact": lambda: F.gelu(h),
             "relu": lambda: F.relu(h)}[act]()
        return _linear(h, sd, p + "mlp.proj.")

    if post_ln:
        a, cache = _attention(x, sd, p + "attn.", H, cache, **attn)
        x = _ln(x + a, sd, p + "ln1.", eps)
        return _ln(x + mlp(x), sd, p + "ln2.", eps), cache
    a, cache = _attention(_ln(x, sd, p + "ln1.", eps), sd, p + "attn.", H, cache, **attn)
    x = x + a
    return x + mlp(_ln(x, sd, p + "ln2.", eps)), cache


def _gpt(sd, ids, H, L, caches=None, *, positions="offset", ln_f=True, **block):
    """GPT written out, or with one typical mistake; -> (logits, caches)."""
    T = ids.size(1)
    past = caches[0][0].size(2) if caches else 0
    x = sd["tok.weight"][ids]
    if positions != "none":
        start = past if positions == "offset" else 0
        x = x + sd["pos.weight"][start:start + T]
    new = []
    for i in range(L):
        x, c = _block(x, sd, f"blocks.{i}.", H, caches[i] if caches else None, **block)
        new.append(c)
    if ln_f:
        x = _ln(x, sd, "ln_f.", block.get("eps", 1e-5))
    return x @ sd["head.weight"].T, new


BLOCK_VARIANTS = (({"post_ln": True}, POST_LN), ({"act": "exact"}, GELU_EXACT), ({"act": "relu"}, GELU_RELU),
                  ({"mask": "none"}, NO_MASK), ({"mask": "not_offset"}, MASK_NOT_OFFSET),
                  ({"scale": "none"}, NO_SCALE), ({"scale": "model"}, SCALE_D),
                  ({"order": (1, 0, 2)}, QKV_ORDER), ({"order": (0, 2, 1)}, QKV_ORDER),
                  ({"order": (2, 1, 0)}, QKV_ORDER),
                  ({"heads": "wrong"}, HEADS_SPLIT), ({"heads": "split"}, HEADS_SPLIT_ONLY),
                  ({"heads": "merge"}, HEADS_MERGE_ONLY), ({"eps": 1e-6}, LN_EPS), ({"eps": 1e-12}, LN_EPS))
GPT_VARIANTS = BLOCK_VARIANTS + (({"positions": "none"}, NO_POS), ({"positions": "zero"}, POS_NOT_OFFSET),
                                 ({"ln_f": False}, NO_LN_F))


def _redraw(m, rng, scale=1.0):
    """Give the reference module `m` weights drawn from `rng` (float32 numbers), large enough that every typical
    mistake shows; return it in float64, eval mode."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            noise = torch.randn(p.shape, generator=rng, dtype=F64)
            if ".ln" in name or name.startswith("ln"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(scale * noise / math.sqrt(p.shape[-1]))
    return m.double().eval()


def _sd(m):
    return {k: v.detach() for k, v in m.state_dict().items()}


def _learner(learner, name, ref, *args):
    """The learner's `name(*args)` holding `ref`'s weights, in float64, eval mode."""
    h = learner_module(learner, name, ref, *args)
    h.to(dtype=F64)
    method(h, "eval", name)()
    return h


def _cache_pair(c, name, shape):
    expect(isinstance(c, (tuple, list)) and len(c) == 2, CACHE_TYPE.format(name))
    return tuple(tensor(t, name, shape=shape, dtype=F64, what="the cached keys or values") for t in c)


def _run_block(h, x, name, cache=None):
    out = h(x) if cache is None else h(x, cache)
    expect(isinstance(out, (tuple, list)) and len(out) == 2, CACHE_TYPE.format(name))
    return tensor(out[0], name, shape=x.shape, dtype=F64, what="its output"), out[1]


def _same(a, b):
    return close(a, b, rtol=1e-6, atol=1e-8)


@points(0.5, part="gpt")
def test_gpt_has_the_locked_parameters_and_a_tied_head(learner, reference, rng):
    """Does GPT have the locked parameter names and shapes, max_len, and a head that IS the token embedding?"""
    V, max_len, d, L, H = _randint(rng, 20, 40), _randint(rng, 8, 16), 8 * _randint(rng, 1, 3), 2, 2
    ref = reference.GPT(V, max_len, d, L, H)
    h = learner_module(learner, "GPT", ref, V, max_len, d, L, H)
    expect(type(h.max_len) is int and h.max_len == max_len, MD_MAX_LEN)
    sd = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    sd["tok.weight"] = torch.randn(V, d, generator=rng)
    sd["head.weight"] = torch.randn(V, d, generator=rng)
    h.load_state_dict(sd)
    got = h.state_dict()
    expect(isinstance(got, dict) and all(isinstance(got.get(k), torch.Tensor) and not odd_tensor(got[k])
                                         for k in ("tok.weight", "head.weight")), MD_STATE.format("GPT"))
    expect(torch.equal(got["tok.weight"], got["head.weight"]), MD_NOT_TIED)


def _stat_ok(t, std, n_sigma=8.0):
    """True when the entries of `t` look drawn from N(0, std^2): the sample std within 12 %, the mean within
    n_sigma standard errors (bounds no sampling noise reaches)."""
    t = t.detach().to(F64).flatten()
    n = t.numel()
    return abs(float(t.std()) / std - 1) < 0.12 and abs(float(t.mean())) < n_sigma * std / math.sqrt(n)


@points(0.5, part="gpt")
def test_gpt_initialisation_is_gpt2s(learner, reference, rng):
    """Are the weights drawn from N(0, 0.02^2), the residual projections from N(0, (0.02/sqrt(2L))^2), biases 0?"""
    V, max_len, d, L, H = 300, 64, 48, _randint(rng, 2, 3), 4
    h = module(learner.GPT(V, max_len, d, L, H), "GPT")
    sd = h.state_dict()
    ref = reference.GPT(V, max_len, d, L, H).state_dict()
    expect(isinstance(sd, dict) and set(sd) == set(ref) and all(
        isinstance(sd[k], torch.Tensor) and not odd_tensor(sd[k]) and sd[k].shape == ref[k].shape for k in ref),
        "`GPT` has other parameters than the exercise asks for: keep the locked names.")
    resid = 0.02 / math.sqrt(2 * L)
    for k, v in sd.items():
        if k.endswith("bias"):
            expect(bool((v == 0).all()), MD_INIT_BIAS.format(k))
        elif ".ln" in k or k.startswith("ln"):
            expect(bool((v == 1).all()), MD_INIT_BIAS.format(k))
    for k in ("tok.weight", "pos.weight") + tuple(f"blocks.{i}.{n}.weight" for i in range(L)
                                                for n in ("attn.qkv", "mlp.fc")):
        expect(_stat_ok(sd[k], 0.02), MD_INIT_STD.format(k))
    for n in ("attn.proj", "mlp.proj"):
        w = torch.cat([sd[f"blocks.{i}.{n}.weight"].flatten() for i in range(L)])
        if not _stat_ok(w, resid):
            expect(not _stat_ok(w, 0.02), MD_INIT_RESID)
            expect(False, MD_INIT_STD.format(n + ".weight"))


def _dropped(learner, name, ref, x, *args):
    """The learner's `name(*args)` holding `ref`'s weights, in training mode, on x: (output, the reference's output
    in training mode). Every dropout of these modules has p = 1, so that each dropped tensor is zero and the
    result does not depend on any draw."""
    h = _learner(learner, name, ref, *args)
    method(h, "train", name)()
    got, _ = _run_block(h, x, name)
    with torch.no_grad():
        expected = ref.train()(x)[0]
    return got, expected


@points(1, part="gpt")
def test_block_matches_reference(learner, reference, rng):
    """Does GPTBlock (pre-LN, causal attention, tanh GELU) give the reference's output and cache, and in training
    mode drop both residual branches?"""
    for d, H, B, T in ((8 * _randint(rng, 2, 3), 2, 2, _randint(rng, 5, 8)), (12, 3, 1, _randint(rng, 3, 6)),
                       (16, 4, 3, _randint(rng, 4, 7))):
        ref = _redraw(reference.GPTBlock(d, H), rng)
        sd = _sd(ref)
        h = _learner(learner, "GPTBlock", ref, d, H)
        x = torch.randn(B, T, d, generator=rng, dtype=F64)
        y, cache = _run_block(h, x, "GPTBlock")
        with torch.no_grad():
            ey, (ek, ev) = ref(x)
        if not _same(y, ey):
            mistakes = [(hint, lambda kw=kw: _block(x, sd, "", H, **kw)[0]) for kw, hint in BLOCK_VARIANTS]
            raise Hint(diagnose(y, mistakes, BL_GENERIC, same=_same))
        k, v = _cache_pair(cache, "GPTBlock", ek.shape)
        expect(_same(k, ek) and _same(v, ev), CACHE_KV)
    d, H = 8 * _randint(rng, 1, 2), 2
    x = torch.randn(2, _randint(rng, 3, 6), d, generator=rng, dtype=F64)
    ref = _redraw(reference.GPTBlock(d, H, 1.0), rng)  # both branches dropped: y = x
    expect(_same(*_dropped(learner, "GPTBlock", ref, x, d, H, 1.0)), DROP_BLOCK)


def _weights_and_values(ref, x, H):
    """The softmax weights (B, H, T, T) and the values (B, H, T, d / H) of the reference attention `ref` on x."""
    B, T, d = x.shape
    with torch.no_grad():
        q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in ref.qkv(x).split(d, dim=-1))
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    s = (q @ k.transpose(-2, -1) / math.sqrt(d // H)).masked_fill(~allowed, float("-inf")).softmax(-1)
    return s, v


def _near(a, b):
    return (a - b).abs() <= 1e-8 + 1e-6 * b.abs()


def _weights_dropped(z, s, v, p):
    """True when every row of every head of z (B, H, T, d / H) is sum over a subset S of its keys 0 .. i of
    s_ij / (1 - p) * v_j: each attention weight zeroed or kept and scaled, on its own, whatever the draws."""
    for i in range(z.size(2)):
        n = i + 1
        subsets = ((torch.arange(2 ** n)[:, None] >> torch.arange(n)) & 1).to(F64)  # (2^n, n): every subset
        sums = torch.einsum("sn,bhn,bhnd->bhsd", subsets, s[:, :, i, :n] / (1 - p), v[:, :, :n])
        if not bool(_near(z[:, :, i, None], sums).all(-1).any(-1).all()):
            return False
    return True


@points(0.5, part="gpt")
def test_attention_drops_its_weights(learner, reference, rng):
    """In training mode, does CausalSelfAttention drop attention weights (each zeroed, or kept and scaled by
    1 / (1 - p)), before the product with the values, and nothing else?"""
    d, H, B, T = 16, 2, 2, _randint(rng, 4, 6)  # a head's width 8 > T: the values of a row's keys are independent
    p = _uniform(rng, 0.3, 0.6)
    ref = _redraw(reference.CausalSelfAttention(d, H, p), rng)
    with torch.no_grad():  # proj the identity: the output is the heads' weights @ v, merged
        ref.proj.weight.copy_(torch.eye(d, dtype=F64))
        ref.proj.bias.zero_()
    x = torch.randn(B, T, d, generator=rng, dtype=F64)
    h = _learner(learner, "CausalSelfAttention", ref, d, H, p)
    y, _ = _run_block(h, x, "CausalSelfAttention")
    with torch.no_grad():
        expected = ref(x)[0]
    if not _same(y, expected):
        return  # the attention itself is wrong: the block's and the cache's checks name that, not this one
    # all dropped (p = 1): y = proj's bias, which dropping the output (before or after proj) would not give
    d1, T1 = 8 * _randint(rng, 1, 2), _randint(rng, 3, 6)
    ref1 = _redraw(reference.CausalSelfAttention(d1, H, 1.0), rng)
    x1 = torch.randn(2, T1, d1, generator=rng, dtype=F64)
    got, want = _dropped(learner, "CausalSelfAttention", ref1, x1, d1, H, 1.0)
    if not _same(got, want):
        raise Hint(DROP_ATTN_OUTPUT if _same(got, torch.zeros_like(want)) else DROP_ATTN)
    # 0 < p < 1: each output row of a head is a mix of the value rows with weights zeroed or scaled by 1 / (1 - p)
    method(h, "train", "CausalSelfAttention")()
    y, _ = _run_block(h, x, "CausalSelfAttention")
    z = y.reshape(B, T, H, d // H).transpose(1, 2)
    s, v = _weights_and_values(ref, x, H)
    if _weights_dropped(z, s, v, p):
        return
    u = (s @ v) / (1 - p)  # dropout on weights @ v: each number zeroed or scaled on its own
    raise Hint(DROP_ATTN_OUTPUT if bool((_near(z, torch.zeros_like(z)) | _near(z, u)).all()) else DROP_ATTN)


@points(1, part="gpt")
def test_attention_with_a_cache_of_several_tokens(learner, reference, rng):
    """Fed several new tokens after a cache, does CausalSelfAttention give the rows of the whole sequence?"""
    for d, H, B, past, T in ((16, 2, 2, _randint(rng, 2, 4), _randint(rng, 3, 5)), (12, 3, 1, 0, 5),
                             (8, 1, 2, _randint(rng, 3, 5), 2)):
        ref = _redraw(reference.CausalSelfAttention(d, H), rng)
        sd = _sd(ref)
        h = _learner(learner, "CausalSelfAttention", ref, d, H)
        x = torch.randn(B, past + T, d, generator=rng, dtype=F64)
        with torch.no_grad():
            full, (fk, fv) = ref(x)
            _, cache = ref(x[:, :past]) if past else (None, None)
        y, new = _run_block(h, x[:, past:], "CausalSelfAttention", cache)
        if not _same(y, full[:, past:]):
            mistakes = [(hint, lambda kw=kw: _attention(x[:, past:], sd, "", H, cache, **kw)[0])
                        for kw, hint in BLOCK_VARIANTS if not {"post_ln", "act", "eps"} & set(kw)]
            raise Hint(diagnose(y, mistakes, AT_GENERIC, same=_same))
        k, v = _cache_pair(new, "CausalSelfAttention", fk.shape)
        expect(_same(k, fk) and _same(v, fv), CACHE_KV)


def _gpt_case(reference, rng, V, max_len, d, L, H, dropout=0.0):
    ref = _redraw(reference.GPT(V, max_len, d, L, H, dropout), rng, scale=2.0)
    return ref, _sd(ref)


def _logits(h, ids, V, caches=None):
    out = h(ids) if caches is None else h(ids, caches)
    expect(isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], (list, tuple)), CACHE_LIST)
    return tensor(out[0], "GPT", shape=(*ids.shape, V), dtype=F64, what="the logits"), list(out[1])


@points(1.5, part="gpt")
def test_gpt_logits_match_reference(learner, reference, rng):
    """Does GPT give the reference's logits (learned positions, blocks, ln_f, tied head) and one cache per block,
    and in training mode drop the sum of the embeddings?"""
    for V, max_len, d, L, H, B in ((_randint(rng, 20, 40), 12, 16, 2, 2, 2), (_randint(rng, 20, 40), 9, 12, 1, 3, 3),
                                   (_randint(rng, 20, 40), 10, 8, 3, 1, 1)):
        ref, sd = _gpt_case(reference, rng, V, max_len, d, L, H)
        h = _learner(learner, "GPT", ref, V, max_len, d, L, H)
        ids = torch.randint(0, V, (B, max_len - _randint(rng, 0, 2)), generator=rng)
        got, caches = _logits(h, ids, V)
        with torch.no_grad():
            expected, ecaches = ref(ids)
        if not _same(got, expected):
            mistakes = [(hint, lambda kw=kw: _gpt(sd, ids, H, L, **kw)[0]) for kw, hint in GPT_VARIANTS]
            raise Hint(diagnose(got, mistakes, GPT_GENERIC, same=_same))
        expect(len(caches) == L, CACHE_LIST)
        for c, (ek, ev) in zip(caches, ecaches):
            k, v = _cache_pair(c, "GPT", ek.shape)
            expect(_same(k, ek) and _same(v, ev), CACHE_KV)
    # in training mode with dropout 1 every position's logits are head(ln_f(0)): dropped embeddings, dropped branches
    V, max_len, d, L, H = _randint(rng, 20, 40), 8, 8, 2, 2
    ref, _ = _gpt_case(reference, rng, V, max_len, d, L, H, 1.0)
    h = _learner(learner, "GPT", ref, V, max_len, d, L, H, 1.0)
    method(h, "train", "GPT")()
    ids = torch.randint(0, V, (2, max_len), generator=rng)
    got, _ = _logits(h, ids, V)
    with torch.no_grad():
        expected = ref.train()(ids)[0]
    if not _same(got, expected):
        # a block that drops the wrong things is the block check's mistake: charged there, not twice
        block = _redraw(reference.GPTBlock(d, H, 1.0), rng)
        x = torch.randn(2, max_len, d, generator=rng, dtype=F64)
        expect(not _same(*_dropped(learner, "GPTBlock", block, x, d, H, 1.0)), DROP_GPT)


@points(1, part="gpt")
def test_gpt_with_caches_continues_the_positions(learner, reference, rng):
    """Fed in pieces with the caches, does GPT give the logits of the whole sequence, and stop at max_len?"""
    for L, H in ((1, 4), (2, 2)):  # one block too: the caches are a list of one
        V, max_len, d, B = _randint(rng, 20, 40), _randint(rng, 10, 14), 16, 2
        ref, sd = _gpt_case(reference, rng, V, max_len, d, L, H)
        h = _learner(learner, "GPT", ref, V, max_len, d, L, H)
        ids = torch.randint(0, V, (B, max_len), generator=rng)
        with torch.no_grad():
            expected = ref(ids)[0]
        a, b = _randint(rng, 3, 4), _randint(rng, 2, 3)  # a != H: the cache's length is not read on the heads' axis
        pieces, caches, got = [(0, a), (a, a + b)] + [(t, t + 1) for t in range(a + b, max_len)], None, []
        for start, end in pieces:
            out, caches = _logits(h, ids[:, start:end], V, caches)
            got.append(out)
        got = torch.cat(got, dim=1)
        if not _same(got, expected):
            def variant(kw):
                cs, outs = None, []
                for start, end in pieces:
                    o, cs = _gpt(sd, ids[:, start:end], H, L, cs, **kw)
                    outs.append(o)
                return torch.cat(outs, dim=1)
            raise Hint(diagnose(got, [(hint, lambda kw=kw: variant(kw)) for kw, hint in GPT_VARIANTS],
                                GPT_CACHE_GENERIC, same=_same))
    for call in (lambda: h(ids[:, :1], caches), lambda: h(torch.zeros(1, max_len + 1, dtype=torch.long))):
        try:
            call()
        except LearnerError as exc:
            expect(exc.etype == "ValueError", TOO_LONG)
        else:
            raise Hint(TOO_LONG)
    h.to(device=torch.device("meta"))
    _, first = reference.GPT(V, max_len, d, L, H).double()(ids[:, :3])
    expect_device_agnostic(learner, h, ids[:, 3:5], [tuple(t.detach() for t in c) for c in first])


# --- Part 3: GPT-2's weights from transformers (3 points) ---------------------------------------

CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
OURS = {"ln_1": "ln1", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj", "ln_2": "ln2", "mlp.c_fc": "mlp.fc",
        "mlp.c_proj": "mlp.proj"}


def _hf_layout(V, n, d, L):
    """The parameters of a GPT2LMHeadModel(vocab_size=V, n_positions=n, n_embd=d, n_layer=L), (name, shape), in
    the order of its `named_parameters()` (the head, tied to the token embedding, is not listed there). Conv1D
    weights are stored (in, out). tests/book/test_gpt.py compares this with the pinned `transformers`."""
    layout = [("transformer.wte.weight", (V, d)), ("transformer.wpe.weight", (n, d))]
    for i in range(L):
        p = f"transformer.h.{i}."
        layout += [(p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
                   (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
                   (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
                   (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
                   (p + "mlp.c_fc.weight", (d, 4 * d)), (p + "mlp.c_fc.bias", (4 * d,)),
                   (p + "mlp.c_proj.weight", (4 * d, d)), (p + "mlp.c_proj.bias", (d,))]
    return layout + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def _hf_case(rng, min_heads=1):
    """The state dict of a random small GPT2LMHeadModel (gelu_new, no dropout), as its `state_dict()` gives it
    plus the causal-mask buffers a checkpoint also holds, with weights drawn from `rng` (float32), and the
    matching GPT arguments (V, n, d, L, H), with at least `min_heads` heads."""
    H = _randint(rng, min_heads, 4)
    d, L = H * 4 * _randint(rng, 1, 2), _randint(rng, 1, 3)
    V, n = _randint(rng, 30, 80), _randint(rng, 8, 16)
    sd = {}
    for name, shape in _hf_layout(V, n, d, L):
        noise = torch.randn(shape, generator=rng)
        if ".ln_" in name:
            sd[name] = (1.0 if name.endswith("weight") else 0.0) + 0.2 * noise
        elif name.endswith("bias"):
            sd[name] = 0.2 * noise
        else:
            sd[name] = noise / math.sqrt(shape[0] if any(c in name for c in CONV1D) else shape[-1])
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    for i in range(L):
        sd[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, n, n).tril()
    return sd, (V, n, d, L, H)


def _hf_logits(sd, args, ids):
    """GPT2LMHeadModel's logits (B, T, V) for the state dict `sd` and the ids, in float64: GPT-2 written out
    (pre-LN blocks, gelu_new, LayerNorm eps 1e-5, attention scaled by the head size, the head tied to the token
    embedding). tests/book/test_gpt.py compares them with the pinned `transformers`' own, on this module's cases."""
    V, n, d, L, H = args
    ours = {k: v.double() for k, v in {**_expected_params(sd, L), "head.weight": sd["transformer.wte.weight"]}.items()}
    return _gpt(ours, ids, H, L)[0]


def _expected_params(sd, L):
    """Our parameters (name -> tensor) from a GPT-2 state dict, written out here."""
    out = {"tok.weight": sd["transformer.wte.weight"], "pos.weight": sd["transformer.wpe.weight"],
           "ln_f.weight": sd["transformer.ln_f.weight"], "ln_f.bias": sd["transformer.ln_f.bias"]}
    for i in range(L):
        for theirs, ours in OURS.items():
            w = sd[f"transformer.h.{i}.{theirs}.weight"]
            out[f"blocks.{i}.{ours}.weight"] = w.t() if theirs in CONV1D else w
            out[f"blocks.{i}.{ours}.bias"] = sd[f"transformer.h.{i}.{theirs}.bias"]
    return out


def _load(learner, sd, args):
    """The learner's GPT(*args) after load_hf_gpt2(model, sd), with its state dict before and after."""
    h = module(learner.GPT(*args), "GPT")
    before = h.state_dict()
    try:
        ret = learner.load_hf_gpt2(h, sd)
    except LearnerError as exc:
        raise Hint(HF_RAISES.format(exc.etype)) from None
    expect(isinstance(ret, RemoteObject), HF_RETURN.format(describe(ret)))
    after = h.state_dict()
    expect(isinstance(before, dict) and isinstance(after, dict), MD_STATE.format("GPT"))
    return h, before, after


def _judge_params(got, before, sd, L):
    """Every loaded parameter must hold the state dict's value; name the mistake otherwise."""
    expected = _expected_params(sd, L)
    for name, e in expected.items():
        g = got.get(name)
        if isinstance(g, torch.Tensor) and not odd_tensor(g) and g.shape == e.shape and torch.equal(g, e):
            continue
        if isinstance(g, torch.Tensor) and not odd_tensor(g):
            b = before.get(name)
            expect(not (e.dim() == 2 and g.shape == e.t().shape and torch.equal(g, e.t())),
                   HF_NOT_TRANSPOSED.format(name))
            expect(not (isinstance(b, torch.Tensor) and not odd_tensor(b) and g.shape == b.shape
                        and torch.equal(g, b)), HF_UNCHANGED.format(name))
            if name.endswith("qkv.weight") or name.endswith("qkv.bias"):
                parts = e.chunk(3, dim=0)
                for order in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)):
                    expect(not (g.shape == e.shape and torch.equal(g, torch.cat([parts[i] for i in order]))), HF_QKV)
            expect(not any(g.shape == o.shape and torch.equal(g, o) for o in expected.values()),
                   HF_WRONG_KEY.format(name))
        raise Hint(HF_GENERIC.format(name))


@points(1.5, part="load_hf_gpt2")
def test_load_hf_gpt2_copies_every_weight(learner, reference, rng):
    """After load_hf_gpt2, does every parameter hold GPT-2's weight (the Conv1D ones transposed), extra keys ignored?"""
    for _ in range(2):
        sd, args = _hf_case(rng)
        _, before, after = _load(learner, sd, args)
        _judge_params(after, before, sd, args[3])


@points(1, part="load_hf_gpt2")
def test_load_hf_gpt2_logits_match_transformers(learner, reference, rng):
    """With GPT-2's weights loaded, do your GPT's logits agree with transformers' GPT2LMHeadModel's?"""
    for min_heads in (1, 2):  # (with one head, heads split without a transpose give the right logits)
        sd, args = _hf_case(rng, min_heads)
        V, n, d, L, H = args
        h, before, after = _load(learner, sd, args)
        _judge_params(after, before, sd, L)
        method(h, "eval", "GPT")()
        ids = torch.randint(0, V, (2, n), generator=rng)
        expected = _hf_logits(sd, args, ids)
        out = h(ids)
        expect(isinstance(out, (tuple, list)) and len(out) == 2, CACHE_LIST)
        got = tensor(out[0], "GPT", shape=expected.shape, what="the logits")
        if not close(got, expected, rtol=1e-4, atol=1e-4):
            head = after.get("head.weight")
            expect(isinstance(head, torch.Tensor) and not odd_tensor(head) and head.shape == after["tok.weight"].shape
                   and torch.equal(head, after["tok.weight"]), HF_HEAD)
            ours = {**_expected_params(sd, L), "head.weight": sd["transformer.wte.weight"]}
            ours = {k: v.double() for k, v in ours.items()}
            raise Hint(HF_MODEL.format(diagnose(got.double(), [(hint, lambda kw=kw: _gpt(ours, ids, H, L, **kw)[0])
                                                               for kw, hint in GPT_VARIANTS],
                                                "see part 2's checks", same=_same_f32)))


def _same_f32(a, b):
    return close(a, b, rtol=1e-4, atol=1e-4)


@points(0.5, part="load_hf_gpt2")
def test_load_hf_gpt2_rejects_missing_and_misshapen_keys(learner, reference, rng):
    """Does load_hf_gpt2 raise a ValueError naming the key when a needed key is missing or misshapen?"""
    sd, args = _hf_case(rng)
    h, before, after = _load(learner, sd, args)
    _judge_params(after, before, sd, args[3])
    needed = sorted(k for k in sd if not k.endswith("attn.bias") and k != "lm_head.weight")
    for kind in ("missing", "shape"):
        key = _pick(rng, needed)
        bad = dict(sd)
        if kind == "missing":
            del bad[key]
        else:
            shape = list(sd[key].shape)
            shape[0] += 1
            bad[key] = torch.zeros(shape)
        h = module(learner.GPT(*args), "GPT")
        before = h.state_dict()
        hint = (HF_MISSING if kind == "missing" else HF_SHAPE).format(key)
        try:
            learner.load_hf_gpt2(h, bad)
        except LearnerError as exc:
            expect(exc.etype == "ValueError" and key in exc.message, hint)
        else:
            raise Hint(hint)


# --- Part 4: sampling (3 points) ---------------------------------------------------------------

TAIL = math.log(2 / 1e-12)  # a Bernstein bound's log(2 / delta): one false alarm in 1e12 per token


def _slack(n, p):
    """The largest |count - n p| that n draws of probability p reach with probability above 1e-12 (Bernstein)."""
    if p <= 0 or p >= 1:
        return 0.0  # a token of probability 0 (or 1) is never (always) drawn
    var = n * p * (1 - p)
    return TAIL / 3 + math.sqrt((TAIL / 3) ** 2 + 2 * TAIL * var)


def _probs(logits, temperature=1.0, top_k=None, top_p=1.0, *, temp="divide", k_shift=0, k_small=False,
           p_rule="reach", p_sorted=True, order="kp", filters_first=False):
    """The distribution `sample` draws from, computed here in float64, or with one typical mistake: `order="pk"`
    applies top-p (to the whole distribution) before top-k; `filters_first` applies both to the logits before the
    temperature, which then scales the kept ones."""
    if filters_first:
        kept = _probs(logits, 1.0, top_k, top_p, k_shift=k_shift, k_small=k_small, p_rule=p_rule, p_sorted=p_sorted,
                      order=order) > 0
        q = (logits.to(F64) / temperature).softmax(-1) * kept
        return q / q.sum()
    z = logits.to(F64)
    V = z.numel()
    if temp == "divide":
        z = z / temperature
    elif temp == "times":
        z = z * temperature

    def nucleus(z):
        p = z.softmax(-1)
        if top_p >= 1.0:
            return p
        order = torch.argsort(p, descending=True, stable=True) if p_sorted else torch.arange(V)
        sp = p[order]
        cum = sp.cumsum(0)
        keep = {"reach": cum - sp < top_p, "drop": cum < top_p, "drop_eq": cum <= top_p}[p_rule]
        if p_rule == "reach":
            keep[0] = True
        out = torch.zeros(V, dtype=F64)
        out[order[keep]] = sp[keep]
        return out / out.sum() if out.sum() > 0 else out

    def top(z):
        if top_k is None:
            return z
        k = top_k + k_shift
        if k >= V:
            return z
        if k <= 0:
            return torch.full_like(z, float("-inf"))
        kth = torch.topk(-z if k_small else z, k).values[-1]
        return z.masked_fill((-z if k_small else z) < kth, float("-inf"))

    if order == "pk":  # the nucleus of the whole distribution, then the top k of what it kept
        q = z.softmax(-1) * ((nucleus(z) > 0) & (top(z) > float("-inf")))
        return q / q.sum()
    return nucleus(top(z))


def _drawn(x, V):
    """A value the learner's sample returned, as an id in 0 .. V - 1, or a hint."""
    expect(type(x) is int, SA_TYPE.format(describe(x)))
    expect(0 <= x < V, SA_RANGE)
    return x


def _draws(learner, logits, n, seed, **kw):
    """n draws of the learner's sample with one generator seeded with `seed`, made in one request."""
    gen = _generator(learner, seed)
    return [_drawn(x, len(logits)) for x in learner.sample.repeat(n, logits, generator=gen, **kw)]


def _separated(p, q, n):
    """True when n draws from q fall outside the bounds of p with probability above 1 - 1e-12, whatever the seed."""
    for pi, qi in zip(p.tolist(), q.tolist()):
        if pi == 0 and qi > 0 and (1 - qi) ** n < 1e-12:
            return True
        if abs(pi - qi) * n > _slack(n, pi) + _slack(n, qi):
            return True
    return False


def _sample_case(rng, V, n, settings, shows, shape=None):
    """Logits (tried here first) on which the distribution of each mistake in `shows` is told apart from the right
    one by n draws, whatever the seed (at temperature 2.5 and n = 600, about 45 tries on average)."""
    for _ in range(3000):
        logits = (shape(rng, V) if shape else torch.randn(V, generator=rng, dtype=F64) * 1.5).to(torch.float32)
        right = _probs(logits, **settings)
        wrong = [_probs(logits, **{**settings, **kw}) for kw in shows]
        if all(_separated(right, q, n) for q in wrong) and all(
                _visible(q) for q in wrong if _support(q) != _support(right)):
            return logits
    raise RuntimeError("no logits found on which the sampling mistakes show")


SEEN = 0.05  # a token of probability 0.05 or more shows in 600 draws but with probability below 1e-13


def _fits(draws, counts, q, n):
    """True when the draws look drawn from q: none outside its support, every token of probability SEEN or more
    drawn, and every count within its bound."""
    V = len(q)
    drawn = set(draws)
    return (all(0 <= x < V and q[x] > 0 for x in drawn) and all(i in drawn for i in range(V) if q[i] >= SEEN)
            and all(abs(int(c) - n * qi) <= _slack(n, qi) for c, qi in zip(counts.tolist(), q.tolist())))


def _support(q):
    return frozenset(i for i, x in enumerate(q.tolist()) if x > 0)


def _visible(q):
    """True when each token q may draw is likely enough to show in the draws (so its support tells it apart)."""
    return all(x == 0 or x >= SEEN for x in q.tolist())


def _sample_settings(settings):
    return {k: v for k, v in settings.items() if not k.startswith("_")}


def _check_sampling(learner, rng, V, n, settings, variants, shows, shape=None):
    """Draw n times from the learner's sample on logits chosen for `shows`; judge the draws by their support and
    their frequencies; name the mistake whose distribution fits them."""
    clean = _sample_settings(settings)
    logits = _sample_case(rng, V, n, clean, shows, shape)
    _judge_draws(_draws(learner, logits, n, _randint(rng, 0, 10**6), **clean), logits, settings, variants)


def _judge_draws(draws, logits, settings, variants):
    """Pass when the draws (ids) follow the distribution of `sample` on `logits` with `settings`; else name the
    mistake of `variants` whose distribution they fit."""
    clean = _sample_settings(settings)
    n, V = len(draws), len(logits)
    counts = torch.bincount(torch.tensor(draws, dtype=torch.long).clamp(0, V), minlength=V + 1)[:V]
    p = _probs(logits, **clean)
    outside = any(not (0 <= x < V) or p[x] == 0 for x in draws)
    if not outside and all(abs(int(c) - n * pi) <= _slack(n, pi) for c, pi in zip(counts.tolist(), p.tolist())):
        return
    if all(0 <= x < V for x in draws):
        for kw, hint in variants:  # the mistake whose distribution the draws fit
            if _fits(draws, counts, _probs(logits, **{**clean, **kw}), n):
                raise Hint(hint)
    raise Hint(settings.get("_outside", SA_FREQ) if outside else SA_FREQ)


@points(0.5, part="sample")
def test_sample_is_greedy_at_temperature_zero(learner, reference, rng):
    """At temperature 0, is the result the argmax (the lowest id on a tie), and near 0 almost always the argmax?"""
    for V in (_randint(rng, 5, 12), _randint(rng, 30, 60)):
        logits = torch.randn(V, generator=rng)
        i, j = sorted(torch.randperm(V, generator=rng)[:2].tolist())
        logits[i] = logits[j] = logits.max() + 0.5  # a tie for the largest logit
        for kw in ({}, {"top_k": 3, "top_p": 0.5}):
            try:
                got = learner.sample(logits, temperature=0, **kw)
            except LearnerError as exc:
                raise Hint(SA_GREEDY_RAISES.format(exc.etype)) from None
            expect(type(got) is int, SA_TYPE.format(describe(got)))
            expect(got != j, SA_GREEDY_LAST)
            expect(got == i, SA_GREEDY)
    logits = torch.randn(_randint(rng, 8, 12), generator=rng) * 0.3  # flat: at temperature 1 the best is rare
    best = int(logits.argmax())
    logits[best] += 0.5  # a margin of at least 0.5: at temperature 0.01, any other token has odds below e^-50
    expect(all(x == best for x in _draws(learner, logits, 20, _randint(rng, 0, 10**6), temperature=0.01)), SA_COLD)


def _spread(rng, V):
    """Logits whose temperature-scaled distributions differ a lot: a few large logits, the others small."""
    z = torch.randn(V, generator=rng, dtype=F64) * 0.3
    top = torch.randperm(V, generator=rng)[:3]
    z[top] += torch.tensor([2.0, 1.2, 0.6], dtype=F64) + 0.3 * torch.rand(3, generator=rng, dtype=F64)
    return z


TEMP_VARIANTS = (({"temp": "none"}, SA_AFTER_SOFTMAX), ({"temp": "times"}, SA_TIMES))


def _clear_of(z, top_p, sizes, margin=0.02):
    """True when, for the distribution softmax(z) cut to its `K` largest and renormalised, for each K of `sizes`,
    no cumulative probability (in decreasing order) lies within `margin` of top_p: whether a token is kept never
    hangs on rounding."""
    sp = z.to(F64).softmax(-1).sort(descending=True).values
    return all(bool(((sp[:K].cumsum(0) / sp[:K].sum()) - top_p).abs().min() >= margin) for K in sizes)


def _temperature_first_case(rng):
    """Logits (float32, the argmax at id 0), a temperature below 1 and a top_p (tried here first) where the nucleus
    of softmax(logits / T) is the argmax alone and that of softmax(logits) is larger: filtering before the
    temperature draws another token with probability 0.2 or more per draw. (The argmax at id 0: top_p cumulated in
    id order, or dropping the crossing token but the first, keeps it alone here too; the top-p check judges those.)"""
    for _ in range(3000):
        V = _randint(rng, 6, 10)
        z = torch.randn(V, generator=rng, dtype=F64).float()
        z[0] = z.max() + _uniform(rng, 0.05, 0.6)
        settings = {"temperature": _uniform(rng, 0.3, 0.7), "top_p": _uniform(rng, 0.4, 0.8)}
        hot, raw = (z.to(F64) / settings["temperature"]).softmax(-1), z.to(F64).softmax(-1)
        if not (hot[0] - settings["top_p"] > 0.03 and settings["top_p"] - raw[0] > 0.03):
            continue
        first = _probs(z, **settings, filters_first=True)
        if (all(x == 0 or x >= 0.2 for x in first.tolist()) and _clear_of(z / settings["temperature"],
                                                                           settings["top_p"], (V,))
                and _clear_of(z, settings["top_p"], (V,))):
            return z, settings
    raise RuntimeError("no logits found on which filtering before the temperature shows")


@points(0.5, part="sample")
def test_sample_temperature_and_generator(learner, reference, rng):
    """Do the draws follow softmax(logits / temperature), the temperature applied before top-k and top-p, a negative
    temperature raise a ValueError, and the draws follow the generator (the same seed, the same draws)?"""
    for temperature in (0.5, 2.5):
        _check_sampling(learner, rng, _randint(rng, 6, 10), 600, {"temperature": temperature}, TEMP_VARIANTS,
                        [kw for kw, _ in TEMP_VARIANTS], _spread)
    for temperature in (-1.0, -_uniform(rng, 0.05, 0.5)):
        try:
            learner.sample(torch.randn(_randint(rng, 3, 8), generator=rng), temperature=temperature)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", SA_NEGATIVE)
        else:
            raise Hint(SA_NEGATIVE)
    # the temperature before the filters: the right draws are the argmax alone (150 draws of a mistake that draws
    # another token with probability 0.2 all miss it with probability below 1e-14)
    logits, settings = _temperature_first_case(rng)
    _check_sampling(learner, rng, len(logits), 150, {**settings, "_outside": SA_FILTERS_FIRST},
                    (({"filters_first": True}, SA_FILTERS_FIRST),) + TEMP_VARIANTS, [], lambda r, v, z=logits: z)
    logits = torch.randn(_randint(rng, 8, 12), generator=rng) * 0.3  # no token above 1/4: sequences rarely agree
    seed = _randint(rng, 0, 10**6)
    first = _draws(learner, logits, 30, seed)
    expect(_draws(learner, logits, 30, seed) == first, SA_NOT_SEEDED)
    expect(_draws(learner, logits, 30, seed + 1) != first, SA_IGNORES_SEED)


TOP_K_VARIANTS = (({"k_shift": -1}, SA_K_MINUS), ({"k_shift": 1}, SA_K_PLUS), ({"k_small": True}, SA_K_SMALLEST),
                  ({"top_k": None}, SA_OUTSIDE_K), ({"temp": "none"}, SA_AFTER_SOFTMAX))


def _flat(rng, V):
    """Logits close to each other, so that the tokens just outside the top k are as likely as those in it."""
    return torch.randn(V, generator=rng, dtype=F64) * 0.4


@points(1, part="sample")
def test_sample_keeps_exactly_the_top_k(learner, reference, rng):
    """With top_k, is nothing outside the k largest logits (and those equal to the k-th) ever drawn, the kept ones
    with renormalised frequencies, and top_k < 1 a ValueError?"""
    shows = [{"k_shift": -1}, {"k_shift": 1}]
    for V, k in ((_randint(rng, 8, 12), 3), (_randint(rng, 8, 12), _randint(rng, 2, 5))):
        _check_sampling(learner, rng, V, 600, {"top_k": k, "_outside": SA_OUTSIDE_K}, TOP_K_VARIANTS, shows, _flat)
    V = _randint(rng, 4, 6)
    try:
        _check_sampling(learner, rng, V, 400, {"top_k": V + _randint(rng, 0, 3)}, (), [], _flat)
    except LearnerError as exc:
        raise Hint(SA_K_ALL) from exc
    logits = _flat(rng, _randint(rng, 5, 9)).float()
    best = int(logits.argmax())
    expect(all(x == best for x in _draws(learner, logits, 20, _randint(rng, 0, 10**6), top_k=1)), SA_K_ONE)
    for k in (0, -_randint(rng, 1, 5)):
        try:
            learner.sample(logits, top_k=k)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", SA_K_BELOW_ONE)
        else:
            raise Hint(SA_K_BELOW_ONE)
    # logits tied with the k-th largest are all kept: k - 1 larger logits, 2 or 3 equal to the k-th (4 kept at
    # most), the rest far below; every kept token has a probability above 0.2, so 150 draws miss one with
    # probability below 1e-14
    k = _randint(rng, 2, 3)
    m = 2 if k == 3 else _randint(rng, 2, 3)
    V = k - 1 + m + _randint(rng, 2, 4)
    values = [0.15 * (k - 1 - i) for i in range(k - 1)] + [0.0] * m
    values += [-3.0 - _uniform(rng, 0.0, 1.0) for _ in range(V - len(values))]
    logits = torch.tensor(values)[torch.randperm(V, generator=rng)]
    draws = _draws(learner, logits, 150, _randint(rng, 0, 10**6), top_k=k)
    kept = {i for i in range(V) if logits[i] >= 0}
    expect(not (set(draws) < kept and len(set(draws)) == k), SA_K_TIES)
    _judge_draws(draws, logits, {"top_k": k, "_outside": SA_OUTSIDE_K}, TOP_K_VARIANTS)


TOP_P_VARIANTS = (({"p_rule": "drop"}, SA_P_DROPS), ({"p_rule": "drop_eq"}, SA_P_DROPS),
                  ({"p_sorted": False}, SA_P_UNSORTED), ({"top_p": 1.0}, SA_OUTSIDE_P))


def _nucleus_case(rng, V, settings, shows, n):
    """Logits (tried here first) whose nucleus is crossed by a large token, well clear of top_p, and on which n
    draws tell each mistake of `shows` apart from the right distribution, whatever the seed."""
    top_p = settings["top_p"]
    for _ in range(3000):
        z = (torch.randn(V, generator=rng, dtype=F64) * 1.2).float()
        sp = _probs(z, **{**settings, "top_p": 1.0}).sort(descending=True).values  # what top_p acts on
        cum = sp.cumsum(0)
        i = int((cum - sp < top_p).sum()) - 1  # the crossing token's rank
        if not (i >= 1 and sp[i] > 0.12 and cum[i] - top_p > 0.03 and top_p - (cum[i] - sp[i]) > 0.03):
            continue
        right = _probs(z, **settings)
        wrong = [_probs(z, **{**settings, **kw}) for kw in shows]
        supports = {_support(q) for q in [right] + wrong}
        if (all(_separated(right, q, n) for q in wrong) and all(_visible(q) for q in [right] + wrong)
                and len(supports) == 1 + len(wrong)):
            return z
    raise RuntimeError("no logits found on which the top-p mistakes show")


def _nucleus_size(sp, top_p):
    """How many of the probabilities `sp` (sorted, decreasing; renormalised here) top_p keeps."""
    total, mass, n = sum(sp), 0.0, 0
    for p in sp:
        if n and mass / total >= top_p:
            break
        mass, n = mass + p, n + 1
    return n


def _order_case(rng, n):
    """Logits (float32), top_k and top_p (tried here first) on which applying top_p before top_k keeps other tokens
    than the exercise's order (top_k, then top_p on what it kept, renormalised), while top_k +- 1 keeps the same ones
    (a mistake of top-k is the top-k check's), every kept token of either order of probability 0.2 or more (n = 150
    draws miss one with probability below 1e-14)."""
    for _ in range(3000):
        V, k = _randint(rng, 8, 12), _randint(rng, 4, 6)
        z = (torch.randn(V, generator=rng, dtype=F64) * 1.2).float()
        settings = {"top_k": k, "top_p": _uniform(rng, 0.5, 0.85)}
        sp = sorted(z.to(F64).softmax(-1).tolist(), reverse=True)
        kept = {K: _nucleus_size(sp[:K], settings["top_p"]) for K in (k - 1, k, k + 1, V)}
        m, w = kept[k], min(k, kept[V])  # the right order keeps m tokens, the wrong one w
        smallest = min(sp[m - 1] / sum(sp[:m]), sp[w - 1] / sum(sp[:w]))
        if not (2 <= m == kept[k - 1] == kept[k + 1] < w) or smallest < 0.2:
            continue  # (a quick look first; the distributions below decide)
        right, wrong = _probs(z, **settings), _probs(z, **settings, order="pk")
        if (_separated(right, wrong, n) and all(x == 0 or x >= 0.2 for q in (right, wrong) for x in q.tolist())
                and all(_support(_probs(z, **settings, k_shift=s)) == _support(right) for s in (1, -1))
                and _clear_of(z, settings["top_p"], (k - 1, k, k + 1, V))):
            return z, settings
    raise RuntimeError("no logits found on which the order of top-k and top-p shows")


@points(1, part="sample")
def test_sample_keeps_the_token_that_crosses_top_p(learner, reference, rng):
    """With top_p, is the smallest prefix reaching top_p drawn (its crossing token too, the lower id first on ties)
    and nothing outside it, top_p acting on what top_k kept?"""
    # (top_k is left out but in the last case, where its own mistakes keep the right tokens: the top-k check judges
    # them, and each check sees the mistakes of its own filter only; the last case shows top_p's own mistakes too)
    for V, top_p in ((_randint(rng, 6, 10), _uniform(rng, 0.5, 0.8)), (_randint(rng, 6, 10), _uniform(rng, 0.6, 0.85))):
        settings = {"top_p": top_p}
        logits = _nucleus_case(rng, V, settings, [{"p_rule": "drop"}], 600)
        _check_sampling(learner, rng, V, 600, {**settings, "_outside": SA_OUTSIDE_P}, TOP_P_VARIANTS, [],
                        lambda r, v, z=logits: z)
    # probabilities 1/n each, n a power of two: top_p = 2/n is reached by the first two (the lowest ids first),
    # not three. Every partial sum of 1/n is exact in float32, so the mass before the third token is exactly
    # top_p however it is computed (a shifted cumsum, or cumsum - probs): with n = 12 the rounding of
    # 3/12 - 1/12 decided whether a right answer kept a third token.
    n = 2 ** _randint(rng, 2, 4)
    drawn = set(_draws(learner, torch.zeros(n), 100, _randint(rng, 0, 10**6), top_p=2 / n))
    if drawn != {0, 1}:  # two kept tokens drawn 100 times both show, but with probability 2^-99
        expect(len(drawn) != 2, SA_P_TIE_ORDER)  # two tokens, not the two lowest ids
        raise Hint(SA_P_EXACT if len(drawn) > 2 else SA_P_DROPS)
    # the top token alone when top_p is below its probability: the runner-up is close, never drawn
    logits = torch.randn(_randint(rng, 5, 8), generator=rng) - 3
    best, second = torch.randperm(len(logits), generator=rng)[:2].tolist()
    logits[best], logits[second] = 1.0, 0.8
    draws = _draws(learner, logits, 60, _randint(rng, 0, 10**6), top_p=float(logits.softmax(-1)[best]) / 2)
    expect(all(x == best for x in draws), SA_P_TOP)
    # top_k first, then top_p on the renormalised rest: here applying top_p first keeps more tokens
    logits, settings = _order_case(rng, 150)
    _check_sampling(learner, rng, len(logits), 150, {**settings, "_outside": SA_P_BEFORE_K},
                    (({"order": "pk"}, SA_P_BEFORE_K),) + TOP_P_VARIANTS, [], lambda r, v, z=logits: z)


# --- Part 5: generation with the cache (2 points) ---------------------------------------------

def _generate_case(reference, rng, learner, *, dropout=0.0):
    """A model (weights drawn here, float64) and prompts on which greedy decoding has clear argmax margins."""
    V, d, L, H = _randint(rng, 20, 40), 16, 2, 2
    B, T, new = 3, _randint(rng, 2, 4), _randint(rng, 4, 7)
    max_len = T + new
    for _ in range(100):
        ref = _redraw(reference.GPT(V, max_len, d, L, H), rng, scale=2.0)
        prompt = torch.randint(0, V, (B, T), generator=rng)
        seq, margins = prompt, []
        with torch.no_grad():
            for _ in range(new):
                last = ref(seq)[0][:, -1]
                top2 = last.topk(2).values
                margins.append(float((top2[:, 0] - top2[:, 1]).min()))
                seq = torch.cat([seq, last.argmax(-1, keepdim=True)], dim=1)
        if min(margins) > 1e-6:
            break
    h = learner_module(learner, "GPT", ref, V, max_len, d, L, H, dropout)  # ref's weights: float32 numbers
    h.to(dtype=F64)
    method(h, "eval", "GPT")()
    # generation reads the model through its caches: with caches that disagree with the whole sequence, no
    # generation is right (part 2's mistake, named here whatever tokens it happens to give)
    _model_cache_first(h, prompt, torch.cat([prompt, torch.randint(0, V, (B, new), generator=rng)], dim=1), V)
    return ref, h, prompt, new, seq


def _recompute(h, prompt, new, V, pick):
    """The tokens of generation recomputed here on the whole prefix at every step, by the learner's model in eval
    mode; `pick(last_logits)` chooses each row's token, rows in order."""
    method(h, "eval", "GPT")()
    seq = prompt
    for _ in range(new):
        logits, _ = _logits(h, seq, V)
        seq = torch.cat([seq, torch.tensor([[pick(logits[b, -1])] for b in range(seq.size(0))], device=seq.device)],
                        dim=1)
    return seq


def _generated(learner, h, prompt, new, **kw):
    got = learner.generate(h, prompt, new, **kw)
    tensor(got, "generate", shape=(prompt.size(0), prompt.size(1) + new), dtype=torch.long, what="the ids",
           device=prompt.device)
    expect(torch.equal(got[:, :prompt.size(1)], prompt), GE_PROMPT)
    return got


# A forward pre-hook made in the learner's process (a check cannot send a function there), and the reader of what
# it noted: for each call of the model it is registered on, whether the model was in training mode, whether
# gradients were on, and the shape of each integer matrix among the arguments (the ids, given by position or by
# name; the caches are lists). It holds no tensor and changes nothing: it returns None.
RECORDER = ("(lambda calls, torch: (lambda m, a, k: calls.append((m.training is True, torch.is_grad_enabled(), "
            "[tuple(x.shape) for x in (*a, *k.values()) if isinstance(x, torch.Tensor) and x.dim() == 2 "
            "and not x.is_floating_point()])), calls.copy))([], __import__('torch'))")


def _generate_noted(learner, h, prompt, new, **kw):
    """`generate` on the learner's model `h` with a hook noting each call of the model, however generate makes it
    (ids and caches by position or by name): (the result, the calls as (training, grad enabled, [ids shapes]))."""
    made = made_in_learner(learner, RECORDER, TORCH_GONE)
    expect(isinstance(made, tuple) and len(made) == 2 and all(isinstance(f, RemoteObject) for f in made), CALLS_GONE)
    hook, read = made
    method(h, "register_forward_pre_hook", "GPT")(hook, with_kwargs=True)  # on this check's model only
    got = _generated(learner, h, prompt, new, **kw)
    calls = read()
    expect(isinstance(calls, list) and all(
        isinstance(c, tuple) and len(c) == 3 and type(c[0]) is bool and type(c[1]) is bool and isinstance(c[2], list)
        and all(isinstance(s, tuple) and len(s) == 2 and all(type(n) is int for n in s) for s in c[2])
        for c in calls), CALLS_GONE)
    return got, calls


def _judge_greedy(learner, h, prompt, new, expected, got, V):
    """Pass when `got` is greedy decoding, by the reference's model or the learner's own recomputed on the whole
    prefix (the model's own errors are part 2's); else name the part to fix."""
    if torch.equal(got, expected):
        return
    own = _recompute(h, prompt, new, V, lambda z: int(z.argmax()))  # the learner's model, recomputed
    if torch.equal(got, own):
        return  # generation is right; the model's own errors are part 2's
    _model_cache_first(h, prompt, own, V)
    logits, _ = _logits(h, prompt, V)
    for b in range(prompt.size(0)):
        expect(_drawn(learner.sample(logits[b, -1], temperature=0), V) == int(logits[b, -1].argmax()), GE_SAMPLE)
    raise Hint(GE_GREEDY)


@points(0.5, part="generate")
def test_generate_greedy_matches_recomputation(learner, reference, rng):
    """At temperature 0, does generate give greedy decoding recomputed on the whole prefix, up to max_len, the model
    in eval mode (dropout off) even when the caller left it in training mode?"""
    ref, h, prompt, new, expected = _generate_case(reference, rng, learner, dropout=0.3)
    V = ref.tok.weight.shape[0]
    method(h, "train", "GPT")()
    got, calls = _generate_noted(learner, h, prompt, new, temperature=0)
    # afterwards the model may be in either mode: left in eval mode, or the caller's (training) mode restored
    expect(not any(training for training, _, _ in calls), GE_TRAIN_MODE)
    expect(calls or torch.equal(got, expected) or h.training is False, GE_TRAIN_MODE)  # (model.forward called)
    _judge_greedy(learner, h, prompt, new, expected, got, V)


@points(0.5, part="generate")
def test_generate_feeds_one_position_a_step(learner, reference, rng):
    """Does generate feed the prompts once, then one position a step with the caches, without gradients, and
    leave a model it was given in eval mode in eval mode?"""
    ref, h, prompt, new, expected = _generate_case(reference, rng, learner)
    V = ref.tok.weight.shape[0]
    got, calls = _generate_noted(learner, h, prompt, new, temperature=0)
    _judge_greedy(learner, h, prompt, new, expected, got, V)
    expect(not any(grad for _, grad, _ in calls), GE_GRAD)
    B, T = prompt.shape
    fed = sum(n * t for _, _, shapes in calls for n, t in shapes)  # positions times rows, however the rows go
    expect(fed <= B * (T + new), GE_PREFIX)  # the prompts, then one position a step (one more, unused, is fine)
    expect(h.training is False, GE_MODE_AFTER)


def _model_cache_first(h, prompt, seq, V):
    """Fail with GE_MODEL_CACHE when the learner's model gives other logits fed token by token with its caches
    than on the whole of `seq` (its own output) at once: generation cannot be right before the model is."""
    T = prompt.size(1)
    logits, caches = _logits(h, seq[:, :T], V)
    steps = [logits[:, -1:]]
    for t in range(T, seq.size(1) - 1):
        step, caches = _logits(h, seq[:, t:t + 1], V, caches)
        steps.append(step)
    full, _ = _logits(h, seq[:, :-1], V)
    expect(_same(torch.cat(steps, dim=1), full[:, T - 1:]), GE_MODEL_CACHE)


# The settings a generate may forget to pass on to sample, the likeliest first.
DROPPED_SETTINGS = (("top_k", "top_p"), ("temperature", "top_k", "top_p"), ("top_k",), ("top_p",), ("temperature",),
                    ("temperature", "top_k"), ("temperature", "top_p"))


def _telling_seed(reference, ref, prompt, new, settings, rng, tries=50):
    """A generator seed under which the reference's sampling with `settings` draws other tokens than with any
    of them left out (DROPPED_SETTINGS): a generate that forgets one is then told apart whatever the checks'
    seed (with some seeds, top_k and top_p change none of the few tokens drawn)."""
    def run(seed, kept):
        gen = torch.Generator().manual_seed(seed)
        seq = prompt
        with torch.no_grad():
            for _ in range(new):
                last = ref(seq)[0][:, -1]
                seq = torch.cat([seq, torch.tensor([[int(reference.sample(last[b], generator=gen, **kept))]
                                                    for b in range(seq.size(0))])], dim=1)
        return seq

    for _ in range(tries):
        seed = _randint(rng, 0, 10**6)
        full = run(seed, settings)
        if all(not torch.equal(full, run(seed, {k: v for k, v in settings.items() if k not in dropped}))
               for dropped in DROPPED_SETTINGS):
            return seed
    return seed


@points(0.5, part="generate")
def test_generate_samples_rows_in_order_with_the_generator(learner, reference, rng):
    """Sampling with a generator, is each new token sample() on its row's last logits, rows in order, step by step?"""
    ref, h, prompt, new, _ = _generate_case(reference, rng, learner)
    V = ref.tok.weight.shape[0]
    settings = {"temperature": _uniform(rng, 0.7, 1.3), "top_k": _randint(rng, 5, 10),
                "top_p": _uniform(rng, 0.8, 0.95)}
    seed = _telling_seed(reference, ref, prompt, new, settings, rng)
    got = _generated(learner, h, prompt, new, generator=_generator(learner, seed), **settings)
    gen = _generator(learner, seed)
    expected = _recompute(h, prompt, new, V, lambda z: _drawn(learner.sample(z, generator=gen, **settings), V))
    if torch.equal(got, expected):
        return
    _model_cache_first(h, prompt, expected, V)
    gen = _generator(learner, seed)
    rows_reversed = prompt
    for _ in range(new):
        logits, _ = _logits(h, rows_reversed, V)
        picks = {b: _drawn(learner.sample(logits[b, -1], generator=gen, **settings), V)
                 for b in reversed(range(prompt.size(0)))}
        rows_reversed = torch.cat([rows_reversed, torch.tensor([[picks[b]] for b in range(prompt.size(0))])], dim=1)
    expect(not torch.equal(got, rows_reversed), GE_ROWS)
    # settings left out of the call of sample (which then uses its defaults): the likeliest first, top_k and top_p
    for dropped in DROPPED_SETTINGS:
        kept = {name: value for name, value in settings.items() if name not in dropped}

        def pick(z, gen=_generator(learner, seed), kept=kept):
            return _drawn(learner.sample(z, generator=gen, **kept), V)

        fewer = _recompute(h, prompt, new, V, pick)
        names = ", ".join(dropped[:-1]) + " and " * (len(dropped) > 1) + dropped[-1]
        expect(not torch.equal(got, fewer), GE_SETTINGS.format(names))
    logits = torch.randn(V, generator=rng) * 0.3
    gens = (_generator(learner, seed), _generator(learner, seed))
    draws = [[_drawn(learner.sample(logits, generator=g), V) for _ in range(20)] for g in gens]
    expect(draws[0] == draws[1], GE_SAMPLE_SEED)
    raise Hint(GE_SAMPLED)


@points(0.5, part="generate")
def test_generate_stops_at_max_len(learner, reference, rng, devices):
    """Does generate raise a ValueError past max_len, return the prompts alone for max_new_tokens=0, and fill
    exactly max_len positions on every device?"""
    ref, h, prompt, new, expected = _generate_case(reference, rng, learner)
    for extra in (1, _randint(rng, 2, 5)):
        try:
            learner.generate(h, prompt, new + extra, temperature=0)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", GE_TOO_LONG)
        else:
            raise Hint(GE_TOO_LONG)
    got = learner.generate(h, prompt, 0)
    expect(isinstance(got, torch.Tensor) and not odd_tensor(got) and got.shape == prompt.shape
           and torch.equal(got, prompt), GE_ZERO)
    V = ref.tok.weight.shape[0]
    for device in devices:  # exactly max_len tokens, on every device
        h.to(device=torch.device(device))
        short = prompt[:, :-1].to(device)
        first = _generated(learner, h, short, new + 1, temperature=0)
        own = _recompute(h, short, new + 1, V, lambda z: int(z.argmax()))
        if not torch.equal(first.cpu(), own.cpu()):
            _model_cache_first(h, short, own, V)
            raise Hint(GE_GREEDY)
