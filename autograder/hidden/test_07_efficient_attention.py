"""Hidden tests for exercise 07_efficient_attention: the online softmax, tiled attention, the
sliding-window mask and linear attention.

Values are compared with exact computations done here in float64 (softmax, attention with
a top-left causal mask as `F.scaled_dot_product_attention(is_causal=True)`) or with the
reference, on random shapes: lengths that are not multiples of the block size, Lq != Lk,
zero to three leading dimensions, float32 and float64, and float16/bfloat16. A wrong result
is explained by the typical mistake it matches; those mistakes are recomputed here with a
blockwise implementation that can be told to make each one.

The text asks for float32 arithmetic on float16/bfloat16 inputs; the half-precision checks include
long inputs where computing in half precision fails by several times the tolerance, for any draw: a
softmax normaliser or attention's running sum kept in half precision loses the small terms of many
blocks (see HALF_STEP), and linear attention's sums over 2048 keys pass float16's largest value. A
result wrong there but right on the same values in float32 is told that it computes in half precision. A
tiled attention wrong in half precision is called again on the same values in float32: only when that is
right is it told to compute in float32; when that is wrong too, it gets the hint its float32 result gets
(the causal check's, for a causal mistake), or one that sends it to the value checks first.

The memory of tiled attention is measured by the trusted side (`learner.memory_peak`: the
worker's memory cgroup where it has one, the worker process's peak resident memory
otherwise), never reported by the learner's code, on sizes where one full score matrix is
far larger than honest blocks. The peak is taken against the worker's memory before the
learner's code was loaded, so what the notebook holds when the call starts (a buffer kept
since loading or from an earlier call, files in /tmp or /dev/shm, a child process) counts,
and freeing it inside the call hides nothing. That check, and the check of the method below, pay for any
result recognisable as tiled attention (right, or a rescaling or scaling mistake, which the value
checks already charge), so a naive but correct function keeps its value points and loses only
these, and a tiled function with a rescaling bug loses only the value points.

A function that takes, for each block of queries, a plain softmax of its scores against all the keys (or
against the key blocks' scores concatenated) gives exact values in little memory (a 512 x 16384 block of
scores is 32 MiB): only the way it computes them shows it. `test_tiled_attention_reads_keys_by_block` runs
the learner's function under a torch function mode made in the learner's process (NOTER below), which
notes the largest tensor that an exp, softmax, logsumexp or max operation meets (and the scores a fused
attention kernel would hold): with one block of 4 queries and 61 keys (fifteen blocks of 4 and one key), an
online softmax never meets more than a block of 4 x 4 scores per leading index (a column more where it
concatenates its running maximum to a block's scores), whatever its way of writing it (all queries at once,
padded blocks, a logsumexp merge, exp2); the bound is 32. A softmax over all the keys meets 61 scores per
query row, and 244 per block of queries. A function that works in key blocks, but not of block_size (it ignores the
argument: a fixed 64, say, holds all 61 keys), meets as much; it is run once more under the mode, on REC_LK_LONG =
1021 keys. A softmax over all the keys then meets 1021 scores per query row or more, about as many per key as
before; tiles of a fixed size meet fewer per key, as they no longer hold all the keys: those are told that their
blocks do not follow block_size. The same run adds up the multiply-adds of the matrix products that sum over the
queries' feature size d (matmul, @, bmm, einsum...): the scores. An online softmax computes each block of them
once, Lq x Lk x d per leading index; two passes over the keys (the maximum and the sum, then the outputs) compute
them twice. The bound is half again.

Causal tiled attention must skip the key blocks above the diagonal; that saves time, not
memory, and its values do not show it (a block processed too early or too late shows in them
only when it is not masked). What shows it without timing the learner's code: NaN values in
the last key block, which a skipped block never reads, reach the earlier query blocks as
0 * NaN = NaN when the block is read and masked (`test_tiled_attention_causal_skips_future_blocks`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.hidden.support import (DEVICE_ERRORS, HALF, Hint, broadcast_shape, close, diagnose, expect,
                                       expect_device_agnostic, made_in_learner, method, points, tensor)
from autograder.isolation.errors import LearnerError, NotImplementedRemote
from autograder.isolation.runner import RemoteObject

F32, F64 = torch.float32, torch.float64
OS, TILED, WINDOW, LINEAR = "online_softmax", "tiled_attention", "sliding_window_mask", "linear_attention"

# When `grade` cannot measure the worker's memory on this machine (no cgroup, and no /proc to
# read the worker process from), the memory check falls back to the value check on the same
# inputs and pays: a learner is not charged for what the grader cannot see. Set to False to pay
# nothing then. A learner's own `check` never pays what it could not measure (it cannot know
# whether the grading machine will), so it never shows more than grading gives.
UNMEASURED_MEMORY_PAYS = True

# The memory check's sizes: one float32 score matrix of 16384 x 16384 is 1 GiB, honest blocks of
# 512 x 512 are 1 MiB, the inputs 1 MiB each. A quarter of the full matrix is the bound. It is
# counted from the worker's memory before the notebook was loaded, so it also covers what an
# honest notebook holds and what torch sets up on first use (the reference peaks at 60 to 130
# MiB, fresh or warm, in a cgroup or per process; a whole matrix at 2 GiB); and a learner who
# freed every byte the worker held before that baseline (about 150 MiB of a fresh worker's, 6 MiB
# of a warm one's, 230 MiB of resident memory per process) would still be 500 MiB short of
# hiding one whole matrix.
MEM_L, MEM_D, MEM_BLOCK = 16384, 16, 512
MEM_BOUND = MEM_L * MEM_L * 4 // 4

# The method check's sizes: one block of queries (REC_LQ = REC_BLOCK) and REC_LK keys, fifteen full key blocks and
# a short one. An online softmax meets at most REC_BLOCK x REC_BLOCK scores per leading index in an exp, softmax or
# max operation, or a block and a column more (its running maximum or log-sum-exp concatenated to a block's scores):
# the bound is two blocks' worth, 32. A softmax over all the keys meets REC_LK = 61 scores per query row, and 244
# per block of queries.
REC_BLOCK, REC_LQ, REC_LK, REC_LEAD = 4, 4, 61, (2, 3)
REC_BOUND = 2 * REC_BLOCK * REC_BLOCK
# The second run, only for a result over the bound: with REC_LK_LONG keys a softmax over all of them meets at least
# REC_LK_LONG scores per query row (about the first run's share per key; a column more, concatenated, gives it 62/61
# then 1022/1021), tiles of a fixed size T meet T, under REC_SHARE of that share once the keys outnumber T by 4/3.
REC_LK_LONG, REC_SHARE = 1021, 0.75
# Each block of scores computed once costs REC_LQ x REC_LK x d multiply-adds per leading index (a last key block
# padded to a full one, 64/61 of it); two passes over the keys, twice that. The bound is half again.
REC_SCORES = 1.5

# Made in the learner's process (a check cannot send a function there): `noted(f, q, ...)` calls f under a
# torch function mode (a dispatch mode imports SymPy there on its first use: a second of every check) and returns
# (its result, {"largest", "op", "fused", "scores"}): the most elements of a tensor that an
# exp-like, softmax-like or max-like operation read or wrote (for a fused attention kernel, the scores it would
# hold: queries times keys), that operation's name, whether a fused attention kernel ran, and the multiply-adds of
# the matrix products (matmul, @, bmm, mm, einsum of two operands...) that sum over q's feature size d: the scores.
# Scores written out elementwise are not counted. It changes nothing.
NOTER = """
import torch
from torch.overrides import TorchFunctionMode

PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "mm", "baddbmm", "addmm", "addbmm", "einsum"}
WATCHED = {"exp", "exp_", "exp2", "exp2_", "special_exp2", "expm1", "expm1_", "softmax", "log_softmax", "_softmax",
           "_log_softmax", "_safe_softmax", "logsumexp", "amax", "max", "__rpow__"}
FUSED = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


def leaves(x, depth=0):
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 3 and isinstance(x, (list, tuple)):
        for y in x:
            yield from leaves(y, depth + 1)
    elif depth < 3 and isinstance(x, dict):
        for y in x.values():
            yield from leaves(y, depth + 1)


def einsum_product(args):  # (the size of what a two-operand einsum sums over, its multiply-adds), or None
    ops = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
    if not args or not isinstance(args[0], str) or len(ops) != 2 or not all(isinstance(t, torch.Tensor) for t in ops):
        return None
    lhs, arrow, rhs = args[0].replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    sizes, seen = {}, []
    for term, t in zip(terms, ops):
        head, dots, tail = term.partition("...")
        n = t.dim() - len(head) - len(tail) if dots else 0
        keys = list(head) + [("...", n - i) for i in range(n)] + list(tail)  # (ellipsis dimensions from the right)
        if n < 0 or len(keys) != t.dim():
            return None
        for key, size in zip(keys, t.shape):
            sizes[key] = max(sizes.get(key, 1), int(size))
        seen += [key for key in keys if isinstance(key, str)]
    kept = set(rhs) if arrow else {c for c in seen if seen.count(c) == 1}
    inner, total = 1, 1
    for key, size in sizes.items():
        total *= size
        if isinstance(key, str) and key not in kept:
            inner *= size
    return inner, total


def product(name, args, out):  # (the size of the dimension a matrix product sums over, its multiply-adds), or None
    if name == "einsum":
        return einsum_product(args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    tensors = tensors[1:] if name.startswith("add") or name == "baddbmm" else tensors
    tensors = tensors[::-1] if name == "__rmatmul__" else tensors
    if len(tensors) < 2 or tensors[0].dim() == 0 or not isinstance(out, torch.Tensor):
        return None
    return int(tensors[0].size(-1)), out.numel() * int(tensors[0].size(-1))


class Noted(TorchFunctionMode):
    def __init__(self, d):
        super().__init__()
        self.largest, self.op, self.fused, self.d, self.scores = 0, "", False, d, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(getattr(func, "__name__", ""))
        found = list(leaves((args, kwargs or {}, out)))
        n = 0
        if any(f in name for f in FUSED):
            self.fused = True
            if len(found) >= 2 and found[0].dim() >= 2 and found[1].dim() >= 2:
                n = found[0].numel() // max(found[0].size(-1), 1) * found[1].size(-2)
        elif name in WATCHED or (name == "pow" and args and not isinstance(args[0], torch.Tensor)):
            n = max((t.numel() for t in found), default=0)
        elif name in PRODUCTS:
            made = product(name, args, out)
            if made is not None and made[0] == self.d:  # queries times keys: scores
                self.scores += made[1]
        if n > self.largest:
            self.largest, self.op = int(n), name
        return out


def noted(f, *args, **kwargs):
    mode = Noted(int(args[0].size(-1)))  # the queries' feature size: what a product of scores sums over
    with mode:
        out = f(*args, **kwargs)
    return out, {"largest": mode.largest, "op": mode.op, "fused": mode.fused, "scores": mode.scores}
"""
# evaluated in the learner's process, with its builtins: NOTER run in a fresh namespace, and its `noted`
MAKE_NOTER = "(lambda g: (exec(SRC, g), g['noted'])[1])({'__builtins__': __builtins__})"

# Half precision over long inputs. A sum kept in float16 or bfloat16 stops growing once what is added to it
# falls below half its rounding step: below HALF_STEP of a sum near 1. The long checks' scores put each row's
# largest in the first block (the normaliser starts near 1) and make every later block add half of HALF_STEP
# to it (within a factor 1.3): in float32 the LONG_BLOCKS blocks add 6 % (float16) or 50 % (bfloat16) to the
# normaliser, kept in half precision every one of them is rounded away, and the largest weight and its output
# are off by 6 to 33 %: six times the half-precision tolerance or more for every draw, where the reference
# stays under a tenth of it.
HALF_STEP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
LONG_BLOCK, LONG_BLOCKS = 2, 256
# Linear attention's sums over the keys grow with their number: with every entry of q and k in [0.5, 1.5],
# phi(q) . phi(k) >= 32 * 1.5**2 = 72 for each of 2048 keys, and the denominator passes 147000, more than
# twice float16's largest value (65504).
LONG_L, LONG_D = 2048, 32

# --- hints ----------------------------------------------------------------------------------

OS_GENERIC = ("`online_softmax` differs from torch.softmax(x, -1): keep per row the running maximum m and "
              "the running sum s of exp(x - m) over the blocks read so far, and return exp(x - m) / s.")
OS_NO_RESCALE = ("`online_softmax` does not rescale the running sum when the maximum grows: "
                 "s = s * exp(m_old - m_new) + sum(exp(block - m_new)).")
OS_OVERFLOW = ("`online_softmax` overflows (inf or NaN) on large scores: subtract the running maximum before "
               "every exp, in the sum and in the final normalisation.")
OS_NEG_INF = ("`online_softmax` gives NaN on a row whose first blocks hold only -inf: -inf - (-inf) is NaN. "
              "While the running maximum is still -inf, shift by 0 instead (exp(-inf) is then 0).")
OS_HALF = ("`online_softmax` is far from softmax in float16 or bfloat16, or changes the dtype of its input: "
           "compute in float32 and return x's dtype.")
OS_HALF_SUM = ("`online_softmax` is right in float32 but not in float16 or bfloat16 on a long row: it keeps its "
               "running sum in half precision, where the small terms each block adds fall below the sum's rounding "
               "step and are lost. Compute in float32 (x.float()) and return x's dtype.")

T_GENERIC = ("`tiled_attention` differs from softmax(q k^T / sqrt(d)) v: for each block of queries keep the "
             "running maximum m, sum s and output o, rescale s and o by exp(m_old - m_new) for every key "
             "block, and return o / s.")
T_NO_OUT_RESCALE = ("`tiled_attention` rescales the running output with the wrong factor (or not at all): "
                    "when the maximum grows, o = o * exp(m_old - m_new) + exp(scores - m_new) @ v_block.")
T_NO_SUM_RESCALE = ("`tiled_attention` does not rescale the running sum when the maximum grows: "
                    "s = s * exp(m_old - m_new) + exp(scores - m_new).sum(-1).")
T_NO_SCALE = "`tiled_attention` does not divide the scores by sqrt(d), the width of q and k."
T_NAN = ("`tiled_attention` returns NaN or inf: a rescaling factor exp(m_new - m_old) (inverted), an exp "
         "without the maximum subtracted, or a query row with no key at all (-inf - (-inf) is NaN).")
T_SKIP_EARLY = ("Causal `tiled_attention` skips key blocks too early: the block on the diagonal (the keys "
                "j0 ... j0 + block_size - 1 with j0 = the query block's start) must be processed, masked "
                "where key j > query i.")
T_SKIP_LATE = ("Causal `tiled_attention` processes a key block past the diagonal without masking it: every "
               "key block that starts after the query block's start lies wholly in its future; skip it.")
T_DIAG_MASKED = "Causal `tiled_attention` masks each query's own key: query i may attend to keys j <= i."
T_NOT_CAUSAL = "`tiled_attention` ignores causal=True: query i may attend to keys j <= i only."
T_DIAG_UNMASKED = ("Causal `tiled_attention` does not mask the key block on the diagonal: it skips the blocks above "
                   "it, but the block that straddles the diagonal (the keys j0 ... j0 + block_size - 1 with j0 = the "
                   "query block's start) holds keys j > i for its queries i: set their scores to -inf there.")
T_BOTTOM_RIGHT = ("Causal `tiled_attention` aligns the mask to the end of the keys when Lq != Lk: as in "
                  "F.scaled_dot_product_attention(is_causal=True), query i may attend to keys j <= i, counted "
                  "from the start of both sequences.")
T_HALF = ("`tiled_attention` is far from exact attention in float16 or bfloat16, or changes the dtype of its "
          "input: compute in float32 and return q's dtype.")
T_HALF_WRONG = ("`tiled_attention` is wrong in float16 or bfloat16, and wrong in float32 too on the same values: "
                "the precision is not the cause. Make the value checks (exact and causal attention) pass first.")
T_HALF_SUM = ("`tiled_attention` is right in float32 but not in float16 or bfloat16 over many key blocks: it keeps "
              "its running sum and output in half precision, where the small terms each key block adds fall below "
              "their rounding step and are lost. Compute in float32 and return q's dtype.")
T_MEMORY = ("`tiled_attention` used up to {} MiB of memory for 16384 queries and keys with block_size=512 "
            "(counted from before your notebook was loaded: {} MiB of it were already held when the call "
            "started): it builds (nearly) the whole Lq x Lk score matrix, or a softmax over the whole key axis "
            "at once. Only a (block_size x block_size) block of scores may exist at a time, and what your "
            "notebook keeps (large tensors at the top level or from earlier calls) counts too.")
T_MEMORY_OUT = ("`tiled_attention` ran out of memory for 16384 queries and keys with block_size=512 ({}): it "
                "builds the whole Lq x Lk score matrix. Only a (block_size x block_size) block of scores may "
                "exist at a time.")
T_UNMEASURED_CHECK = ("The memory of `tiled_attention` cannot be measured on this machine, so this self-check "
                      "does not count these points; the grader measures it when it grades.")
T_UNMEASURED = "The grader cannot measure memory on this machine."
T_NO_SKIP = ("Causal `tiled_attention` reads the key blocks that lie wholly above the diagonal (masked, or "
             "with every query at once, or in blocks larger than block_size): skip every key block that starts "
             "after the query block's last query. "
             "Values there must not reach the earlier queries at all (a NaN value does, as 0 * NaN).")
T_MEMORY_WRONG = ("`tiled_attention`'s memory is judged only when its result is attention: it is neither right "
                  "nor a recognisable rescaling or scaling mistake on a long input. Fix the value checks first.")

T_PLAIN_SOFTMAX = ("`tiled_attention` takes a plain softmax over all the keys at once: for a block of queries it "
                   "holds the scores against every key (computed at once, or the key blocks' scores concatenated) "
                   "and normalises them together. Read the keys one block of block_size at a time and keep, per "
                   "query row, the running maximum m, sum s and output o, rescaled by exp(m_old - m_new) for each "
                   "new key block: only an (n_q, n_k) block of scores may exist at a time.")
T_PLAIN_FUSED = ("`tiled_attention` hands a block of queries and all the keys to F.scaled_dot_product_attention: "
                 "that is PyTorch's attention, not yours. Read the keys one block of block_size at a time and keep, "
                 "per query row, the running maximum m, sum s and output o, rescaled by exp(m_old - m_new) for each "
                 "new key block.")
T_SCORES_TWICE = ("`tiled_attention` computes each block of scores more than once (q k^T of the same queries and keys "
                  "again: a first pass over the keys for the maximum and the sum, then a second for the outputs?). "
                  "One pass is enough: keep the running output o beside m and s, and rescale it by exp(m_old - m_new) "
                  "as each key block comes in.")
T_BLOCK_SIZE = ("`tiled_attention` does not split the keys into blocks of block_size: with block_size=4 it still "
                "normalises a block of queries' scores against far more keys at once (its tiles have a size of "
                "their own, or block_size is ignored). Use block_size for both the query and the key blocks: only "
                "an (n_q, n_k) block of scores, n_q and n_k at most block_size, may exist at a time.")
T_METHOD_WRONG = ("`tiled_attention`'s way of computing is judged only when its result is attention: it is neither "
                  "right nor a recognisable rescaling or scaling mistake. Fix the value checks first.")
NOTES_GONE = ("The checks could not note the operations of `tiled_attention` in the notebook's process: do not "
              "rebind torch, nor Python's own builtins.")

W_GENERIC = ("`sliding_window_mask` must be True where 0 <= i - j < window (causal) or |i - j| < window "
             "(not causal), with i the row (query) and j the column (key), shaped (size, size).")
W_OFF_BY_ONE = ("`sliding_window_mask`'s window is off by one: a window of w lets query i see the keys with "
                "i - j < w (causal: itself and the w - 1 before it), not <= w or < w - 1.")
W_INVERTED = "`sliding_window_mask` is inverted: True marks the keys a query may attend to."
W_TRANSPOSED = ("`sliding_window_mask` is transposed: rows are queries, columns keys, and a causal query sees "
                "the keys before it (j <= i).")
W_CAUSAL_IGNORED = "`sliding_window_mask` ignores causal: causal=True (the default) keeps only 0 <= i - j < window."
W_ALWAYS_CAUSAL = "`sliding_window_mask` is causal even when causal=False: then |i - j| < window."
W_NO_ERROR = ("`sliding_window_mask` must raise a ValueError when window < 1: such a window leaves a query "
              "nothing to attend to.")
W_OTHER_ERROR = ("`sliding_window_mask` must raise a ValueError itself when window < 1 (check the window first), "
                 "not a {}.")
W_DEVICE = ("`sliding_window_mask` does not create its mask on the device it is given: pass device= to the "
            "tensors it builds (torch.arange(size, device=device)).")

L_GENERIC = ("`linear_attention` differs from phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j) + eps) with "
             "phi(x) = elu(x) + 1.")
L_NO_PLUS_ONE = ("`linear_attention` uses phi(x) = elu(x): the feature map is elu(x) + 1, positive everywhere, "
                 "so that every similarity and the denominator are positive.")
L_RELU = "`linear_attention` uses another feature map: phi(x) = elu(x) + 1 (F.elu(x) + 1), not relu or exp."
L_NO_DENOM = ("`linear_attention` does not normalise: divide phi(q) (phi(k)^T v) by phi(q) . sum_j phi(k_j) "
              "(plus eps).")
L_SCALED = "`linear_attention` scales by 1/sqrt(d): linear attention has no such scaling."
L_SOFTMAX = "`linear_attention` computes softmax attention: replace exp(q . k) by phi(q) . phi(k)."
L_FULL_SUMS = ("Causal `linear_attention` uses the sums over all keys: query i may only see keys j <= i, so "
               "both sums must be running (cumulative) sums over the positions.")
L_EXCLUSIVE = ("Causal `linear_attention` leaves out each query's own key: the running sums must include "
               "position i (cumsum, not the sum of the positions before i).")
L_NO_EPS = ("`linear_attention` gives NaN or inf when every phi(k_j) underflows to 0 (very negative keys): "
            "add eps to the denominator, phi(q) . sum_j phi(k_j) + eps.")
L_LENGTHS = ("Causal `linear_attention` accepts a number of queries different from the number of keys: "
             "compare q.size(-2) with k.size(-2) and raise a ValueError when they differ.")
L_LENGTHS_OTHER = ("Causal `linear_attention` must raise a ValueError itself when q.size(-2) != k.size(-2) (check "
                   "the lengths first), not a {}.")
L_HALF = ("`linear_attention` is far from the reference in float16 or bfloat16, or changes the dtype of its "
          "input: compute in float32 and return q's dtype.")
L_HALF_SUM = ("`linear_attention` is right in float32 but not in float16 over a long sequence: it computes in half "
              "precision, where its sums over the keys pass float16's largest value (65504) and become inf. "
              "Compute in float32 and return q's dtype.")


# --- helpers ---------------------------------------------------------------------------------

def _randn(rng, *shape, dtype=F32, scale=1.0, device="cpu"):
    return (torch.randn(*shape, generator=rng, dtype=F64) * scale).to(device, dtype)


def _randint(rng, lo, hi):
    return int(torch.randint(lo, hi + 1, (), generator=rng))


def _lead(rng, n):
    """n leading dimensions of sizes 1 to 3."""
    return tuple(_randint(rng, 1, 3) for _ in range(n))


def _cpu64(*xs):
    return tuple(x.detach().cpu().double() for x in xs)


def _same(dtype):
    """How a result of `dtype` is matched against a typical mistake's (computed in float64); NaN matches NaN."""
    if dtype in HALF:
        return lambda a, b: close(a, b.to(a.dtype), equal_nan=True)
    return lambda a, b: close(a, b, rtol=1e-3, atol=1e-4, equal_nan=True)


def _finite(x):
    return isinstance(x, torch.Tensor) and bool(torch.isfinite(x.detach().cpu().double()).all())


def _uniform(rng, *shape, lo=-1.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(*shape, generator=rng, dtype=F64)


def _peaked(rng, lead, dtype):
    """Scores (*lead, LONG_BLOCK * LONG_BLOCKS) in float64 relative to their row's largest, 0, which lies in the
    first block, and the position of that largest (*lead, 1); every other score is log(w) +- 0.2, w such that a
    block of them weighs half of HALF_STEP[dtype] against the largest's 1."""
    w = HALF_STEP[dtype] / (2 * LONG_BLOCK)
    x = math.log(w) + _uniform(rng, *lead, LONG_BLOCK * LONG_BLOCKS, lo=-0.2, hi=0.2)
    top = torch.randint(0, LONG_BLOCK, (*lead, 1), generator=rng)
    return x.scatter(-1, top, 0.0), top


def _right_in_float32(call, expected):
    """Whether the learner's function, called on the same values in float32 (`call`), gives `expected`: then a
    wrong result in half precision comes from computing in half precision."""
    return close(call(), expected.float())


# --- Part 1: the online softmax (4 points) --------------------------------------------------

def _online(x, block_size, rescale=True):
    """The blockwise softmax in float64, with the running sum rescaled or not."""
    x = x.double()
    m = torch.full((*x.shape[:-1], 1), -math.inf, dtype=F64)
    s = torch.zeros_like(m)
    for j0 in range(0, x.size(-1), block_size):
        block = x[..., j0:j0 + block_size]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        shift = m_new.masked_fill(m_new == -math.inf, 0.0)
        s = (s * torch.exp(m - shift) if rescale else s) + torch.exp(block - shift).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m.masked_fill(m == -math.inf, 0.0)) / s


def _check_online(learner, x, block_size, device="cpu", extreme=False, long=False):
    got = tensor(learner.online_softmax(x, block_size), OS, shape=x.shape, dtype=x.dtype, device=device)
    x64, = _cpu64(x)
    expected = torch.softmax(x64, -1)
    if close(got, expected.to(x.dtype), device):
        return
    if long and _right_in_float32(lambda: learner.online_softmax(x.float(), block_size), expected):
        raise Hint(OS_HALF_SUM)
    if not _finite(got):
        raise Hint(OS_NEG_INF if bool(torch.isinf(x64).any()) else OS_OVERFLOW if extreme else OS_GENERIC)
    raise Hint(diagnose(got, [(OS_NO_RESCALE, lambda: _online(x64, block_size, rescale=False))],
                        OS_HALF if x.dtype in HALF else OS_GENERIC, same=_same(x.dtype)))


@points(2, part="online_softmax")
def test_online_softmax_matches_softmax(learner, reference, rng):
    """Does online_softmax equal torch.softmax over the last axis, for any block size and shape?"""
    for n_lead, dtype in ((0, F32), (1, F64), (2, F32), (3, F64)):
        L = _randint(rng, 9, 40)
        x = _randn(rng, *_lead(rng, n_lead), 4, L, dtype=dtype, scale=3.0)
        for block_size in (1, _randint(rng, 2, 8), L, L + 5):
            _check_online(learner, x, block_size)


@points(1, part="online_softmax")
def test_online_softmax_extreme_scores(learner, reference, rng):
    """Does it stay exact for scores of +-1e4, and for rows that start with blocks of -inf?"""
    x = _randn(rng, 6, 23, scale=1e4)
    _check_online(learner, x, 4, extreme=True)
    _check_online(learner, x.double(), 5, extreme=True)
    y = _randn(rng, 5, 17, scale=3.0)
    y[0, :9] = -math.inf  # the first blocks all -inf
    y[1, ::2] = -math.inf
    y[2, 1:] = -math.inf  # a single finite score
    y[3, 10:] = -math.inf
    _check_online(learner, y, 4, extreme=True)


@points(1, part="online_softmax")
def test_online_softmax_dtypes_and_devices(learner, reference, rng, devices):
    """Does it keep float16 and bfloat16 (summing in float32, as long rows need) and run on every device?"""
    for dtype in HALF:
        _check_online(learner, _randn(rng, 3, 30, dtype=dtype, scale=4.0), 7)
        scores, _ = _peaked(rng, (3,), dtype)
        _check_online(learner, (scores + _uniform(rng, 3, 1, lo=-2.0, hi=2.0)).to(dtype), LONG_BLOCK, long=True)
    for device in devices:
        _check_online(learner, _randn(rng, 2, 3, 19, dtype=F64, device=device), 4, device=device)
    expect_device_agnostic(learner, OS, _randn(rng, 2, 3, 19), 4)


# --- Part 2: tiled attention (9 points) -----------------------------------------------------

def _exact(q, k, v, causal=False, bottom_right=False):
    """softmax(q k^T / sqrt(d)) v in float64; causal top-left (j <= i) or, for the mistake, bottom-right."""
    q, k, v = _cpu64(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        Lq, Lk = q.size(-2), k.size(-2)
        allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq if bottom_right else 0)
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, -1) @ v


def _tiled(q, k, v, block_size, causal=False, *, rescale_out=True, rescale_sum=True, scale=True,
           skip_after=0, diagonal=1):
    """Tiled attention in float64, making one typical mistake on request: the running output or sum not
    rescaled, no 1/sqrt(d), key blocks skipped when j0 > i0 + skip_after (0 is right; -1 skips the diagonal
    block too, block_size processes one unmasked block past it), the diagonal block masked with triu(diagonal)
    (1 is right; 0 masks each query's own key, 1 + Lk - Lq aligns the mask to the end of the keys) or, with
    diagonal None, not masked at all."""
    q, k, v = _cpu64(q, k, v)
    Lq, Lk = q.size(-2), k.size(-2)
    if scale:
        q = q / math.sqrt(q.size(-1))
    batch = broadcast_shape(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = []
    for i0 in range(0, Lq, block_size):
        i1 = min(i0 + block_size, Lq)
        m = torch.full((*batch, i1 - i0, 1), -math.inf, dtype=F64)
        s = torch.zeros_like(m)
        o = torch.zeros((*batch, i1 - i0, v.size(-1)), dtype=F64)
        for j0 in range(0, Lk, block_size):
            if causal and j0 > i0 + skip_after:
                break
            j1 = min(j0 + block_size, Lk)
            scores = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            if causal and j0 == i0 and diagonal is not None:
                scores = scores.masked_fill(torch.ones(i1 - i0, j1 - j0, dtype=torch.bool).triu(diagonal),
                                            -math.inf)
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new)
            s = (s * alpha if rescale_sum else s) + p.sum(-1, keepdim=True)
            o = (o * alpha if rescale_out else o) + p @ v[..., j0:j1, :]
            m = m_new
        out.append(o / s)
    return torch.cat(out, dim=-2)


def _tiled_mistakes(q, k, v, block_size, causal):
    table = [(T_NO_OUT_RESCALE, lambda: _tiled(q, k, v, block_size, causal, rescale_out=False)),
             (T_NO_SUM_RESCALE, lambda: _tiled(q, k, v, block_size, causal, rescale_sum=False)),
             (T_NO_SCALE, lambda: _tiled(q, k, v, block_size, causal, scale=False))]
    if causal:
        table += [(T_NOT_CAUSAL, lambda: _exact(q, k, v)),
                  (T_SKIP_EARLY, lambda: _tiled(q, k, v, block_size, True, skip_after=-1)),
                  (T_SKIP_LATE, lambda: _tiled(q, k, v, block_size, True, skip_after=block_size)),
                  (T_DIAG_MASKED, lambda: _tiled(q, k, v, block_size, True, diagonal=0))]
        if q.size(-2) != k.size(-2):
            # before the unmasked diagonal block: with Lk - Lq >= block_size the two give the same values
            table += [(T_BOTTOM_RIGHT, lambda: _exact(q, k, v, True, bottom_right=True)),
                      (T_BOTTOM_RIGHT, lambda: _tiled(q, k, v, block_size, True,
                                                      diagonal=1 + k.size(-2) - q.size(-2)))]
        table.append((T_DIAG_UNMASKED, lambda: _tiled(q, k, v, block_size, True, diagonal=None)))
    return table


def _tiled_shape(q, k, v):
    return (*broadcast_shape(q.shape[:-2], k.shape[:-2], v.shape[:-2]), q.size(-2), v.size(-1))


def _check_tiled(learner, q, k, v, block_size, causal=False, device="cpu", long=False):
    got = tensor(learner.tiled_attention(q, k, v, block_size=block_size, causal=causal), TILED,
                 shape=_tiled_shape(q, k, v), dtype=q.dtype, device=device)
    expected = _exact(q, k, v, causal)
    if close(got, expected.to(q.dtype), device):
        return
    if q.dtype in HALF:
        _check_tiled_half(learner, got, q, k, v, block_size, causal, expected, long)
    generic = T_GENERIC if _finite(got) else T_NAN
    raise Hint(diagnose(got, _tiled_mistakes(q, k, v, block_size, causal), generic, same=_same(q.dtype)))


def _check_tiled_half(learner, got, q, k, v, block_size, causal, expected, long):
    """Fails with the hint for `got`, wrong in half precision, after calling the learner's function on the same
    values in float32. Right there, it computes in half precision; wrong there too, its float32 result's mistake
    is named (the hint a float32 check gives), or the value checks come first."""
    try:
        got32 = learner.tiled_attention(q.float(), k.float(), v.float(), block_size=block_size, causal=causal)
        got32 = tensor(got32, TILED, shape=_tiled_shape(q, k, v), dtype=F32)
    except (LearnerError, Hint):
        got32 = None  # nothing to compare: the half-precision hint
    if got32 is None or close(got32, expected.float()):
        if long and got32 is not None:
            raise Hint(T_HALF_SUM)
        raise Hint(diagnose(got, _tiled_mistakes(q, k, v, block_size, causal), T_HALF, same=_same(q.dtype)))
    generic = T_HALF_WRONG if _finite(got32) else T_NAN
    raise Hint(diagnose(got32, _tiled_mistakes(q, k, v, block_size, causal), generic, same=_same(F32)))


def _qkv(rng, lead, Lq, Lk, d, d_v, dtype=F32, device="cpu"):
    return (_randn(rng, *lead, Lq, d, dtype=dtype, scale=1.5, device=device),
            _randn(rng, *lead, Lk, d, dtype=dtype, scale=1.5, device=device),
            _randn(rng, *lead, Lk, d_v, dtype=dtype, device=device))


def _long_qkv(rng, dtype, lead=(2,), d=16, d_v=4):
    """q (*lead, LONG_BLOCK, d), k and v (*lead, LONG_BLOCK * LONG_BLOCKS, .) in `dtype`, every query's scores
    _peaked's plus one offset: q[..., 0] = sqrt(d), k[..., 0] the scores, the other entries of q within +-0.05.
    The values of each row's largest-weighted key are 1 to 1.9 in magnitude, the others within +-1, so that
    the output's error is the normaliser's."""
    scores, top = _peaked(rng, lead, dtype)
    Lk = scores.size(-1)
    k = _uniform(rng, *lead, Lk, d)
    k[..., 0] = scores + _uniform(rng, *lead, 1, lo=-2.0, hi=2.0)
    q = _uniform(rng, *lead, LONG_BLOCK, d, lo=-0.05, hi=0.05)
    q[..., 0] = math.sqrt(d)
    v = _uniform(rng, *lead, Lk, d_v)
    sign = torch.where(torch.rand(*lead, 1, d_v, generator=rng) < 0.5, -1.0, 1.0).to(F64)
    v.scatter_(-2, top[..., None].expand(*lead, 1, d_v), _uniform(rng, *lead, 1, d_v, lo=1.0, hi=1.9) * sign)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@points(3, part="tiled_attention")
def test_tiled_attention_matches_exact(learner, reference, rng):
    """Does tiled_attention equal exact attention, for any lengths, block sizes and leading dimensions?"""
    for n_lead, dtype in ((0, F32), (1, F64), (2, F32), (3, F64)):
        bs = _randint(rng, 3, 8)
        Lq, Lk = _randint(rng, 2 * bs + 1, 5 * bs), _randint(rng, 2 * bs + 1, 5 * bs)
        q, k, v = _qkv(rng, _lead(rng, n_lead), Lq, Lk, _randint(rng, 4, 12), _randint(rng, 3, 9), dtype)
        _check_tiled(learner, q, k, v, bs)
    q, k, v = _qkv(rng, (2,), 11, 6, 8, 5)
    _check_tiled(learner, q, k, v, 1)
    _check_tiled(learner, q, k, v, 64)  # one block holds everything
    # Two leading dimensions of different sizes, whatever the seed drew above: the batch shape is all of
    # them, (2, 3), never a part of it.
    q, k, v = _qkv(rng, (2, 3), 11, 9, 8, 5)
    _check_tiled(learner, q, k, v, 4)


@points(2, part="tiled_attention")
def test_tiled_attention_causal(learner, reference, rng):
    """With causal=True, does it equal F.scaled_dot_product_attention(is_causal=True), also when Lq != Lk?"""
    bs = _randint(rng, 3, 6)
    L = _randint(rng, 3 * bs + 1, 5 * bs - 1)
    for n_lead, (Lq, Lk), dtype in ((2, (L, L), F32), (1, (L - bs - 1, L), F64), (1, (L, L - bs - 1), F32),
                                    (0, (4 * bs, 4 * bs), F64)):
        q, k, v = _qkv(rng, _lead(rng, n_lead), Lq, Lk, _randint(rng, 4, 10), _randint(rng, 3, 8), dtype)
        _check_tiled(learner, q, k, v, bs, causal=True)


@points(1, part="tiled_attention")
def test_tiled_attention_dtypes_and_devices(learner, reference, rng, devices):
    """Does it keep float16 and bfloat16 (summing in float32, as many key blocks need) and run on every device?"""
    for dtype in HALF:
        q, k, v = _qkv(rng, (2,), 13, 10, 8, 8, dtype)
        _check_tiled(learner, q, k, v, 4)
        _check_tiled(learner, q, k, v, 4, causal=True)
        _check_tiled(learner, *_long_qkv(rng, dtype), LONG_BLOCK, long=True)
    for device in devices:
        q, k, v = _qkv(rng, (2, 2), 9, 9, 6, 4, F64, device)
        _check_tiled(learner, q, k, v, 4, causal=True, device=device)
    q, k, v = _qkv(rng, (2,), 9, 7, 6, 4)
    expect_device_agnostic(learner, TILED, q, k, v, block_size=4, causal=True)
    expect_device_agnostic(learner, TILED, q, k, v, block_size=4)


@points(1, part="tiled_attention")
def test_tiled_attention_causal_skips_future_blocks(learner, reference, rng):
    """With causal=True, does it skip the key blocks above the diagonal, never reading their values?"""
    bs, L = 4, 14  # key blocks start at 0, 4, 8 and 12: the queries 0 ... 11 never need the last one
    q, k, v = _qkv(rng, (2,), L, L, 8, 5)
    _check_tiled(learner, q, k, v, bs, causal=True)  # right on these values first
    last = (L - 1) // bs * bs
    expected = _exact(q, k, v, True)[..., :last, :]  # the queries before the last key block, which they never see
    v[..., last:, :] = math.nan
    got = tensor(learner.tiled_attention(q, k, v, block_size=bs, causal=True), TILED, shape=(2, L, 5), dtype=F32)
    early = got[..., :last, :]
    expect(_finite(early), T_NO_SKIP)
    expect(close(early, expected.float()), T_GENERIC)


def _recognised_tiled(got, q, k, v, block_size):
    """Whether `got` (float32) is tiled attention on q, k, v (float32, not causal), or one of its rescaling or
    scaling mistakes: what the checks of the method and the memory judge."""
    if close(got, _exact(q, k, v).float()):
        return True
    blocks = [lambda: _tiled(q, k, v, block_size, rescale_out=False),
              lambda: _tiled(q, k, v, block_size, rescale_sum=False),
              lambda: _tiled(q, k, v, block_size, scale=False)]
    return any(_same(F32)(got, make()) for make in blocks)


def _noter(learner):
    """`noted` (see NOTER), made in the learner's process, as a handle."""
    made = made_in_learner(learner, MAKE_NOTER, NOTES_GONE, SRC=NOTER)
    expect(isinstance(made, RemoteObject), NOTES_GONE)
    return made


@points(1, part="tiled_attention")
def test_tiled_attention_reads_keys_by_block(learner, reference, rng):
    """Does tiled_attention read the keys one block at a time (the online softmax), never normalising a block of
    queries' scores against all the keys at once, and computing each block of scores once?"""
    q, k, v = _qkv(rng, REC_LEAD, REC_LQ, REC_LK, 8, 5)
    got = tensor(learner.tiled_attention(q, k, v, block_size=REC_BLOCK), TILED, shape=(*REC_LEAD, REC_LQ, 5),
                 dtype=F32)
    expect(_recognised_tiled(got, q, k, v, REC_BLOCK), T_METHOD_WRONG)
    noted = _noter(learner)
    function = learner.attribute(TILED, "__call__")
    expect(isinstance(function, RemoteObject), NOTES_GONE)
    notes = _notes(noted, function, q, k, v)
    if notes is None:
        return  # it ran without the function mode and not under it: what it does cannot be seen, no verdict
    per_index = notes["largest"] / math.prod(REC_LEAD)
    fused = notes["fused"] or notes["op"] == "_safe_softmax"  # (the math kernel of F.scaled_dot_product_attention)
    if per_index <= REC_BOUND:
        expect(notes["scores"] <= REC_SCORES * REC_LQ * REC_LK * q.size(-1) * math.prod(REC_LEAD), T_SCORES_TWICE)
        return
    expect(not fused, T_PLAIN_FUSED)
    # Blocks of a size of their own, or a softmax over all the keys: more keys tell them apart (REC_LK_LONG).
    q, k, v = _qkv(rng, REC_LEAD, REC_LQ, REC_LK_LONG, 8, 5)
    longer = _notes(noted, function, q, k, v)
    expect(longer is not None and not longer["fused"], T_PLAIN_SOFTMAX)
    share = per_index / REC_LK  # per key, with REC_LK keys
    expect(longer["largest"] / math.prod(REC_LEAD) / REC_LK_LONG >= REC_SHARE * share, T_BLOCK_SIZE)
    raise Hint(T_PLAIN_SOFTMAX)


def _notes(noted, function, q, k, v):
    """What `noted` saw of the learner's function on q, k, v with block_size=REC_BLOCK: the dict of NOTER's `noted`,
    checked, or None when the call raised under the mode."""
    try:
        reply = noted(function, q, k, v, block_size=REC_BLOCK)
    except (LearnerError, NotImplementedRemote):
        return None
    expect(isinstance(reply, (tuple, list)) and len(reply) == 2 and isinstance(reply[1], dict), NOTES_GONE)
    notes = reply[1]
    expect(set(notes) == {"largest", "op", "fused", "scores"} and type(notes["largest"]) is int
           and type(notes["op"]) is str and type(notes["fused"]) is bool and type(notes["scores"]) is int, NOTES_GONE)
    return notes


@points(1, part="tiled_attention")
def test_tiled_attention_memory(learner, reference, rng):
    """Does tiled_attention never hold the whole Lq x Lk score matrix (its peak memory, measured by the grader)?"""
    q, k, v = _qkv(rng, (1,), MEM_L, MEM_L, MEM_D, MEM_D)
    # Whole-matrix attention here would take 1 GiB and seconds. PyTorch's own attention (its CPU kernel
    # works in blocks, as the reference does) gives the exact result in a third of the reference's time,
    # computed here while the worker runs the learner's function.
    with learner.meanwhile(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None])[0]) as later:
        try:
            use = learner.memory_peak(TILED, q, k, v, block_size=MEM_BLOCK, causal=False)
        except LearnerError as exc:
            # the sandbox's 4 GiB, which two whole float64 matrices exceed
            if exc.etype == "MemoryError" or "allocate" in exc.message:
                raise Hint(T_MEMORY_OUT.format(f"{exc.etype}: {exc.message}"[:200])) from None
            raise
    got = tensor(use.output, TILED, shape=(1, MEM_L, MEM_D), dtype=F32)
    expected = later.result()  # (B, H, L, d): its fused kernel
    if not close(got, expected.to(F32)):
        blocks = [lambda: _tiled(q, k, v, MEM_BLOCK, rescale_out=False),
                  lambda: _tiled(q, k, v, MEM_BLOCK, rescale_sum=False),
                  lambda: _tiled(q, k, v, MEM_BLOCK, scale=False)]
        expect(any(_same(F32)(got, make()) for make in blocks), T_MEMORY_WRONG)
    if use.peak_bytes is None:
        expect(not use.self_check, T_UNMEASURED_CHECK)
        expect(UNMEASURED_MEMORY_PAYS, T_UNMEASURED)
        return
    expect(use.peak_bytes <= MEM_BOUND, T_MEMORY.format(use.peak_bytes // 2**20, (use.held_bytes or 0) // 2**20))


# --- Part 3: the sliding-window mask (3 points) ---------------------------------------------

def _window(size, window, causal, *, extra=0, transposed=False):
    pos = torch.arange(size)
    offset = pos[:, None] - pos[None, :]
    if transposed:
        offset = -offset
    if causal:
        return (offset >= 0) & (offset < window + extra)
    return offset.abs() < window + extra


def _check_window(learner, size, window, causal, device="cpu", default_causal=False):
    args = (size, window) if default_causal else (size, window, causal)
    kwargs = {} if device == "cpu" else {"device": device}
    got = tensor(learner.sliding_window_mask(*args, **kwargs), WINDOW, shape=(size, size), dtype=torch.bool,
                 device=device, what="the mask")
    expected = _window(size, window, causal)
    if close(got, expected):
        return
    got = got.cpu()
    mistakes = [(W_OFF_BY_ONE, _window(size, window, causal, extra=1)),
                (W_OFF_BY_ONE, _window(size, window, causal, extra=-1)),
                (W_INVERTED, ~expected),
                (W_TRANSPOSED, _window(size, window, causal, transposed=True)),
                (W_CAUSAL_IGNORED if causal else W_ALWAYS_CAUSAL, _window(size, window, not causal))]
    raise Hint(diagnose(got, [(h, m) for h, m in mistakes if not torch.equal(m, expected)], W_GENERIC,
                        same=close))


@points(1.5, part="sliding_window_mask")
def test_sliding_window_mask_matches_definition(learner, reference, rng):
    """Is the mask True exactly where 0 <= i - j < window (causal, the default) or |i - j| < window?"""
    for _ in range(2):
        size = _randint(rng, 7, 16)
        window = _randint(rng, 2, size - 3)
        _check_window(learner, size, window, True, default_causal=True)
        _check_window(learner, size, window, False)
        _check_window(learner, size, window, True)
    _check_window(learner, 6, 1, True)
    _check_window(learner, 6, 1, False)
    _check_window(learner, 5, 9, True)  # a window longer than the sequence: the causal mask
    _check_window(learner, 5, 9, False)


@points(0.5, part="sliding_window_mask")
def test_sliding_window_mask_refuses_empty_window(learner, reference, rng):
    """Does a window below 1 raise a ValueError (and is a window of 1 the diagonal)?"""
    _check_window(learner, 6, 1, True)  # a function that builds masks first
    _check_window(learner, 6, 1, False)
    for window in (0, -2):
        try:
            learner.sliding_window_mask(6, window, True)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", W_OTHER_ERROR.format(exc.etype))
            continue
        raise Hint(W_NO_ERROR)


@points(1, part="sliding_window_mask")
def test_sliding_window_mask_device(learner, reference, rng, devices):
    """Is the mask created on the device it is asked for?"""
    for device in devices:
        _check_window(learner, 9, 3, True, device=device)
        _check_window(learner, 9, 3, False, device=device)
    for causal in (True, False):
        # Only the meta device is asked for here: a mask built anywhere else did not honour device=.
        try:
            out = learner.device_checked(WINDOW, 9, 3, causal, device="meta")
        except LearnerError as exc:
            expect(not any(s in exc.message for s in DEVICE_ERRORS), W_DEVICE)
            return  # something the meta device cannot run: no verdict, as in expect_device_agnostic
        except NotImplementedRemote:
            return
        expect(isinstance(out, torch.Tensor) and out.device.type == "meta", W_DEVICE)
        tensor(out, WINDOW, shape=(9, 9), dtype=torch.bool, what="the mask", meta=True)


# --- Part 4: linear attention (6 points) ----------------------------------------------------

def _linear(q, k, v, causal=False, *, phi=lambda x: F.elu(x) + 1, denom=True, scale=1.0, exclusive=False,
            eps=1e-6):
    """Linear attention in float64 through the quadratic form, with one typical mistake on request."""
    q, k, v = _cpu64(q, k, v)
    sim = phi(q * scale) @ phi(k).transpose(-2, -1)  # (..., Lq, Lk)
    if causal:
        sim = sim * torch.ones(q.size(-2), k.size(-2), dtype=F64).tril(-1 if exclusive else 0)
    if not denom:
        return sim @ v
    return (sim @ v) / (sim.sum(-1, keepdim=True) + eps)


def _linear_mistakes(q, k, v, causal):
    d = q.size(-1)
    table = [(L_NO_PLUS_ONE, lambda: _linear(q, k, v, causal, phi=F.elu)),
             (L_RELU, lambda: _linear(q, k, v, causal, phi=F.relu)),
             (L_RELU, lambda: _linear(q, k, v, causal, phi=torch.exp)),
             (L_NO_DENOM, lambda: _linear(q, k, v, causal, denom=False)),
             (L_SCALED, lambda: _linear(q, k, v, causal, scale=1 / math.sqrt(d))),
             (L_SOFTMAX, lambda: _exact(q, k, v, causal)),
             (L_SOFTMAX, lambda: _exact(q * math.sqrt(d), k, v, causal))]
    if causal:
        table = [(L_FULL_SUMS, lambda: _linear(q, k, v)),
                 (L_EXCLUSIVE, lambda: _linear(q, k, v, True, exclusive=True))] + table
    return table


def _check_linear(learner, q, k, v, causal=False, device="cpu", long=False, expected=None):
    kwargs = {"causal": True} if causal else {}
    got = tensor(learner.linear_attention(q, k, v, **kwargs), LINEAR, shape=_tiled_shape(q, k, v),
                 dtype=q.dtype, device=device)
    expected = _linear(q, k, v, causal) if expected is None else expected
    if close(got, expected.to(q.dtype), device):
        return
    if long and _right_in_float32(lambda: learner.linear_attention(q.float(), k.float(), v.float(), **kwargs),
                                  expected):
        raise Hint(L_HALF_SUM)
    raise Hint(diagnose(got, _linear_mistakes(q, k, v, causal), L_HALF if q.dtype in HALF else L_GENERIC,
                        same=_same(q.dtype)))


@points(2, part="linear_attention")
def test_linear_attention_matches_reference(learner, reference, rng):
    """Does linear_attention equal phi(q) (phi(k)^T v) / (phi(q) . sum phi(k) + eps), phi = elu + 1, eps included?"""
    for n_lead, dtype in ((0, F32), (1, F64), (2, F32), (3, F64)):
        q, k, v = _qkv(rng, _lead(rng, n_lead), _randint(rng, 3, 20), _randint(rng, 3, 20), _randint(rng, 3, 9),
                       _randint(rng, 2, 7), dtype)
        _check_linear(learner, q, k, v)
    # Keys so negative that phi(k) = elu(k) + 1 is 0 in floating point: only eps keeps the denominator from 0.
    for dtype in (F32, F64):
        q, k, v = _qkv(rng, (2,), 5, 7, 4, 3, dtype)
        k[0] = k[0] * 0.1 - 100.0
        got = tensor(learner.linear_attention(q, k, v), LINEAR, shape=(2, 5, 3), dtype=dtype)
        expect(_finite(got), L_NO_EPS)
        _check_linear(learner, q, k, v)
    # Keys whose phi(k) is about 3e-7: the denominators are a few eps, so eps added on the wrong side, or
    # left out, changes the result by far more than the tolerance, under every seed.
    q, k, v = _qkv(rng, (2,), 5, 7, 4, 3, F64)
    _check_linear(learner, q, k * 0.1 - 15.0, v)


def _expect_length_error(learner, Lq, Lk, rng):
    """Causal linear attention with Lq != Lk must raise a ValueError of its own."""
    q, k, v = _qkv(rng, (2,), Lq, Lk, 4, 3)
    try:
        learner.linear_attention(q, k, v, causal=True)
    except LearnerError as exc:
        expect(exc.etype == "ValueError", L_LENGTHS_OTHER.format(exc.etype))
        return
    raise Hint(L_LENGTHS)


@points(3, part="linear_attention")
def test_linear_attention_causal(learner, reference, rng):
    """With causal=True, does query i see only keys j <= i, through running sums, and do Lq != Lk raise a ValueError?"""
    for n_lead, dtype in ((1, F32), (2, F64), (0, F64), (3, F32)):
        L = _randint(rng, 5, 24)
        q, k, v = _qkv(rng, _lead(rng, n_lead), L, L, _randint(rng, 3, 9), _randint(rng, 2, 7), dtype)
        _check_linear(learner, q, k, v, causal=True)
    _expect_length_error(learner, 6, 9, rng)
    _expect_length_error(learner, 9, 6, rng)


@points(1, part="linear_attention")
def test_linear_attention_dtypes_and_devices(learner, reference, rng, devices):
    """Does it keep float16 and bfloat16 (summing in float32, as long sequences need) and run on every device?"""
    for dtype in HALF:
        q, k, v = _qkv(rng, (2,), 12, 12, 8, 8, dtype)
        _check_linear(learner, q, k, v)
        _check_linear(learner, q, k, v, causal=True)
    q, k, v = (_uniform(rng, 1, LONG_L, n, lo=0.5, hi=1.5).to(torch.float16) for n in (LONG_D, LONG_D, 4))
    _check_linear(learner, q[:, :8], k, v, long=True)
    # The reference in float64 (running sums) rather than the quadratic form: a 2048 x 2048 product is slow.
    _check_linear(learner, q, k, v, causal=True, long=True,
                  expected=reference.linear_attention(*_cpu64(q, k, v), causal=True))
    for device in devices:
        q, k, v = _qkv(rng, (2, 3), 10, 10, 6, 5, F64, device)
        _check_linear(learner, q, k, v, device=device)
        _check_linear(learner, q, k, v, causal=True, device=device)
    q, k, v = _qkv(rng, (2,), 10, 10, 6, 5)
    expect_device_agnostic(learner, LINEAR, q, k, v)
    expect_device_agnostic(learner, LINEAR, q, k, v, causal=True)
