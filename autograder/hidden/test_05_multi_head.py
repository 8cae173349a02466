"""Hidden tests for exercise 05_multi_head: heads, multi-head attention, parity with PyTorch, GQA.

The modules are graded holding the reference's weights (`learner_module`) and compared with
the same computation done here in float64 from those weights. `MultiHeadAttention` and
`GroupedQueryAttention` call the learner's `split_heads` and `merge_heads` (part 1): when
those are wrong, a module that is right given them still earns its part, and a module they
break is told to fix part 1 first. A wrong result is explained by the first typical mistake
it matches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.hidden.support import (HALF, Hint, close, diagnose, expect, expect_device_agnostic, expect_grads,
                                       learner_grads, learner_module, module, pair, points, random_mask, tensor, vjp)
from autograder.isolation.errors import LearnerError, MissingName, NotImplementedRemote
from autograder.isolation.runner import RemoteObject

F32, F64 = torch.float32, torch.float64
MHA, GQA = "MultiHeadAttention", "GroupedQueryAttention"
PART_OF = {"split_heads": "part 1", "merge_heads": "part 1"}
# Half-precision modules run four matrix products in a row: compare them with the exact result more loosely.
HALF_TOL = {torch.float16: (2e-2, 2e-2), torch.bfloat16: (8e-2, 8e-2)}

# --- hints ----------------------------------------------------------------------------------

SPLIT_GENERIC = ("`split_heads` puts the wrong features in the heads: head h of position t must hold "
                 "features h * d_head to (h + 1) * d_head - 1 of x[:, t].")
SPLIT_NO_TRANSPOSE = ("`split_heads` splits the heads along the wrong axis: viewing (B, T, D) directly as "
                      "(B, H, T, d_head) cuts the sequence of positions, not each position's features. View as "
                      "(B, T, H, d_head), then transpose(1, 2).")
SPLIT_INTERLEAVED = ("`split_heads` splits the features in the wrong order, as (d_head, H): head h must take "
                     "one contiguous block of d_head features. View as (B, T, H, d_head), then transpose(1, 2).")
MERGE_GENERIC = ("`merge_heads` is not the inverse of split_heads: position t must get head 0's features, "
                 "then head 1's...")
MERGE_NO_TRANSPOSE = ("`merge_heads` reshapes (B, H, T, d_head) to (B, T, D) without transpose(1, 2) first: the "
                      "heads and the positions get mixed up.")
MERGE_INTERLEAVED = ("`merge_heads` puts the features in the order (d_head, H): each head's d_head features "
                     "must stay one block, heads in order.")
MERGE_VIEW = ("`merge_heads` calls .view on the result of transpose, which is not contiguous in memory: use "
              ".reshape(...), or .contiguous().view(...).")
NOT_INVERSE = "`merge_heads(split_heads(x, n_heads))` does not give x back: the two must be inverses."
NO_VALUE_ERROR = "`split_heads` must raise ValueError when D is not divisible by n_heads."
OTHER_ERROR = ("`split_heads` must raise ValueError itself when D is not divisible by n_heads (check "
               "D % n_heads first), not fail with another error.")

MODULE_GENERIC = {"weights": "`{}`'s weights differ from softmax(Q_h K_h^T / sqrt(d_head)) for each head h.",
                  "output": "`{}`'s weights are right but its output is not W_o(merge_heads(weights @ V_h))."}
SCALE_D = "The scores are divided by sqrt(d_model) instead of sqrt(d_head), the width each head works in."
NO_SCALE = ("The scores are not divided by sqrt(d_head): the weights match softmax(Q_h K_h^T) without "
            "scaling. Divide by sqrt(d_head), the width each head works in.")
NO_SOFTMAX = ("The weights are the scaled scores themselves: apply a softmax over the keys (the last axis), so "
              "that each query's weights are positive and sum to 1.")
SOFTMAX_AXIS = ("The softmax runs over the wrong axis: for each head and each query, the weights over the keys "
                "(the last axis) must sum to 1.")
SCALE_AFTER_SOFTMAX = ("The weights are divided by sqrt(d_head) after the softmax: divide the scores before it, "
                       "so that each query's weights still sum to 1.")
SWAP_QK = ("The query and key projections are swapped: queries come from W_q applied to `query`, keys from "
           "W_k applied to `key`.")
SWAP_KV = "The key and value projections are swapped: keys come from W_k, values from W_v."
NO_WO = "The output projection W_o is missing: apply self.W_o to the merged heads."
MOD_SPLIT = ("The heads are split along the wrong axis inside the module: view (B, T, D) as (B, T, H, d_head) "
             "and transpose(1, 2) (use split_heads).")
MOD_MERGE = ("The heads are merged in the wrong order inside the module: transpose(1, 2) back to "
             "(B, T, H, d_head) before reshaping to (B, T, D) (use merge_heads).")
MASK_INVERTED = "The mask is inverted: True means the query MAY attend to that key."
MASK_IGNORED = "The mask is ignored: pass it on to the attention, where False must give weight exactly 0."
TILED = ("The key/value heads are repeated in the wrong order: each must be repeated n_rep times in a row "
         "(0, 0, 1, 1), so that query head h uses key/value head h // n_rep; torch's .repeat tiles them "
         "(0, 1, 0, 1). Use repeat_interleave(n_rep, dim=1), or expand and reshape.")
MODULE_GRAD = "`{}`'s gradients with respect to {} differ from the reference's: is part of it detached or recomputed?"
DROPOUT_IN_EVAL = ("Dropout is applied in eval mode: drop weights only while training "
                   "(dropout_p = self.dropout if self.training else 0.0).")
NO_DROPOUT = ("In training mode with dropout=0.5 about half the weights should be zeroed: pass "
              "dropout_p=self.dropout to scaled_dot_product_attention while self.training.")
DROPOUT_SCALE = ("In training mode the weights that survive dropout must be the softmax weights scaled by "
                 "1 / (1 - p), as F.dropout does: drop the weights, not the scores or the output.")
DROPOUT_OUTPUT = "With dropout, the output must be computed from the dropped-out weights that are returned."

ORDER = ("`load_torch_mha` takes the chunks of in_proj_weight in the wrong order: its rows hold the query "
         "projection first, then the key's, then the value's.")
TRANSPOSED = ("`load_torch_mha` copies a transposed matrix: in_proj_weight's chunks and out_proj.weight are "
              "(out_features, in_features) already, like nn.Linear.weight.")
BIAS = "`load_torch_mha` does not copy the biases right: W_q, W_k, W_v take the three chunks of in_proj_bias."
OUT_PROJ = "`load_torch_mha` does not copy out_proj (weight and bias) into W_o."
LOAD_GENERIC = "`load_torch_mha` leaves {} with other values than theirs: copy each chunk of in_proj_weight."
NOT_IN_PLACE = "`load_torch_mha` must copy the weights into `ours` itself (and return it), not into a new module."
SHARED = ("After `load_torch_mha`, changing theirs changes ours: copy the values (layer.weight.copy_(w) under "
          "torch.no_grad()), do not share tensors.")
NOT_MODULE = "`load_torch_mha` must return `ours`, the module it filled."
NO_TORCH_MHA = ("The locked cell that defines `torch_mha` is missing or was changed: restore it (it builds "
                "PyTorch's module for the checks).")
NOT_INVERTED = ("`to_torch_attn_mask` returns the mask unchanged: nn.MultiheadAttention's boolean attn_mask "
                "means the opposite, True = may NOT attend. Invert it.")
MASK_GENERIC = "`to_torch_attn_mask` must return the logical NOT of our mask, element by element."
MASK_SHAPE = ("`to_torch_attn_mask` changes the mask's shape: return the inverted mask in the shape it was given "
              "(a (Lq, Lk) mask stays (Lq, Lk), a (B, Lk) padding mask stays (B, Lk)), not expanded or reshaped "
              "into the (B*H, Lq, Lk) form that attn_mask also accepts.")
TORCH_PARITY = ("With `to_torch_attn_mask`'s mask, nn.MultiheadAttention does not agree with our attention "
                "under the same mask: True in its attn_mask and key_padding_mask means 'may not attend'.")


# --- helpers ---------------------------------------------------------------------------------

def _randn(rng, *shape, dtype=F64, scale=1.0):
    return (torch.randn(*shape, generator=rng, dtype=F64) * scale).to(dtype)


def _cpu64(*ts):
    return tuple(None if t is None else t.detach().cpu().double() for t in ts)


def _usable(x, shape):
    return isinstance(x, torch.Tensor) and tuple(x.shape) == tuple(shape) and x.is_floating_point()


def _kw(mask):
    return {} if mask is None else {"mask": mask}


class _Broken(Exception):
    """The learner's split_heads or merge_heads cannot be used (our own signal, never shown)."""

    def __init__(self, name, what):
        super().__init__(name)
        self.name, self.what = name, what


class _Pieces:
    """split_heads, merge_heads and repeat_kv for the computations done here: the reference's, or
    (`own`) the learner's split_heads and merge_heads, with `trouble` set to (name, what) when
    they differ from the reference's on the inputs met."""

    def __init__(self, reference, learner=None):
        self.reference, self.learner, self.trouble = reference, learner, None

    def _remote(self, name, x, *args, shape):
        try:
            got = getattr(self.learner, name)(x, *args)
        except NotImplementedRemote:
            raise _Broken(name, "is not implemented yet") from None
        except (LearnerError, MissingName):
            raise _Broken(name, "fails") from None
        if not (_usable(got, shape) and got.dtype == x.dtype):
            raise _Broken(name, "returns a result of the wrong type, shape or dtype")
        expected = getattr(self.reference, name)(x, *args)
        if not close(got, expected) and self.trouble is None:
            self.trouble = (name, "is wrong")
        return got

    def split(self, x, n_heads):
        if self.learner is None:
            return self.reference.split_heads(x, n_heads)
        B, T, D = x.shape
        return self._remote("split_heads", x, n_heads, shape=(B, n_heads, T, D // n_heads))

    def merge(self, x):
        if self.learner is None:
            return self.reference.merge_heads(x)
        B, H, T, d = x.shape
        return self._remote("merge_heads", x, shape=(B, T, H * d))

    def repeat(self, x, n_rep):
        return self.reference.repeat_kv(x, n_rep)


class _Rearranging(_Pieces):
    """The learner's split_heads and merge_heads as the rearrangements they do (read off by applying
    them to position numbers), so that gradients can flow through them here."""

    def __init__(self, reference, learner):
        super().__init__(reference)
        self.learner, self.index = learner, {}

    def _map(self, name, shape, *args, out_shape):
        numbers = torch.arange(math.prod(shape), dtype=F64).reshape(shape)
        try:
            got = getattr(self.learner, name)(numbers, *args)
        except (LearnerError, NotImplementedRemote, MissingName):
            return False
        if not (_usable(got, out_shape) and got.dtype == F64 and bool((got == got.round()).all())
                and bool(((got >= 0) & (got < numbers.numel())).all())):
            return False
        self.index[(name, tuple(shape))] = got.long()
        return True

    def maps(self, B, Lq, Lk, D, H, H_kv):
        """Whether every rearrangement the module needs could be read; each is kept."""
        d = D // H
        return (self._map("split_heads", (B, Lq, D), H, out_shape=(B, H, Lq, d))
                and self._map("split_heads", (B, Lk, H_kv * d), H_kv, out_shape=(B, H_kv, Lk, d))
                and self._map("merge_heads", (B, H, Lq, d), out_shape=(B, Lq, D)))

    def _apply(self, name, x):
        return x.reshape(-1)[self.index[(name, tuple(x.shape))]]

    def split(self, x, n_heads):
        return self._apply("split_heads", x)

    def merge(self, x):
        return self._apply("merge_heads", x)


def _split_no_transpose(x, n_heads):
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)


def _merge_no_transpose(x):
    B, H, T, d = x.shape
    return x.reshape(B, T, H * d)


def _inline_attention(q, k, v, mask, *, softmax_dim=-1, scale_after=False):
    """(output, weights) of attention written inline with a misplaced softmax, as learners who do not call
    scaled_dot_product_attention write it: `softmax_dim` None leaves the softmax out, another axis
    normalises the wrong weights, `scale_after` divides by sqrt(d_head) after the softmax, not before."""
    scores = q @ k.transpose(-2, -1)
    if not scale_after:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores if softmax_dim is None else torch.softmax(scores, dim=softmax_dim)
    if scale_after:
        weights = weights / math.sqrt(q.shape[-1])
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def _attend(sd, query, key, value, mask, n_heads, n_kv_heads, pieces, *, scale_by=None, swap_qk=False,
            swap_kv=False, no_wo=False, split=None, merge=None, tiled=False, weights=None, attention=None):
    """(output, weights) of (grouped-query) multi-head attention in float64 on the CPU, from the
    state dict `sd`, with `pieces`' split and merge; the keywords make the typical mistakes (`scale_by`
    the width the scores are scaled by, `attention` (mask -> (output, weights)) an attention of
    their own), and `weights` replaces the attention weights (the dropped-out ones of a training-mode call)."""
    def lin(x, name):
        return F.linear(x, sd[f"{name}.weight"], sd.get(f"{name}.bias"))

    split = split or pieces.split
    merge = merge or pieces.merge
    names = {"q": "W_q", "k": "W_k", "v": "W_v"}
    if swap_qk:
        names["q"], names["k"] = "W_k", "W_q"
    if swap_kv:
        names["k"], names["v"] = "W_v", "W_k"
    q = split(lin(query, names["q"]), n_heads)  # (B, H, Lq, d_head)
    k = split(lin(key, names["k"]), n_kv_heads)  # (B, H_kv, Lk, d_head)
    v = split(lin(value, names["v"]), n_kv_heads)  # (B, H_kv, Lk, d_head)
    n_rep = n_heads // n_kv_heads
    if n_rep > 1:
        k, v = ((t.repeat(1, n_rep, 1, 1) if tiled else pieces.repeat(t, n_rep)) for t in (k, v))
    if scale_by is not None:
        q = q * math.sqrt(q.shape[-1]) / math.sqrt(scale_by)
    attention = attention or pieces.reference.scaled_dot_product_attention
    out, w = attention(q, k, v, mask)
    if weights is not None:
        w = weights
        out = w @ v
    out = merge(out)  # (B, Lq, D)
    return (out if no_wo else lin(out, "W_o")), w


class _Case:
    """The learner's module (a handle, on `device` in `dtype`) holding random weights that the
    checks here use too (in float64 on the CPU)."""

    def __init__(self, learner, reference, rng, D, H, n_kv=None, *, device="cpu", dtype=F32, dropout=0.0,
                 state=None):
        self.gqa = n_kv is not None
        self.name = GQA if self.gqa else MHA
        self.D, self.H, self.H_kv = D, H, (n_kv if self.gqa else H)
        args = (D, H, n_kv) if self.gqa else (D, H, dropout)
        ref = getattr(reference, self.name)(*args)
        if state is None:
            state = {n: _randn(rng, *p.shape, scale=1.5 / math.sqrt(D)) for n, p in ref.state_dict().items()}
        ref.load_state_dict(state)
        self.mod = learner_module(learner, self.name, ref, *args)
        self.mod.to(device, dtype)
        self.sd = {n: p.detach().double() for n, p in ref.state_dict().items()}
        self.learner, self.reference, self.device, self.dtype = learner, reference, device, dtype

    def inputs(self, rng, B, Lq, Lk=None, *, cross=True):
        """query (B, Lq, D), key and value (B, Lk, D): three different tensors, or x, x, x."""
        D = self.D
        q = _randn(rng, B, Lq, D, dtype=self.dtype).to(self.device)
        if not cross:
            return q, q, q
        Lk = Lq if Lk is None else Lk
        return (q, _randn(rng, B, Lk, D, dtype=self.dtype).to(self.device),
                _randn(rng, B, Lk, D, dtype=self.dtype).to(self.device))

    def run(self, query, key, value, mask=None):
        """The learner's (out, weights), checked for type, shapes, dtype and device."""
        try:
            out = self.mod(query, key, value, **_kw(None if mask is None else mask.to(self.device)))
        except (LearnerError, NotImplementedRemote) as failure:
            try:
                self.attend(_Pieces(self.reference, self.learner), query, key, value, mask)
            except _Broken as exc:
                if exc.what == "is not implemented yet" and isinstance(failure, NotImplementedRemote):
                    raise Hint(f"`{self.name}` cannot run: it, or `{exc.name}`, which it needs "
                               f"({PART_OF[exc.name]}), is not implemented yet.") from None
                if exc.what == "is not implemented yet":
                    raise Hint(f"`{self.name}` cannot run yet: `{exc.name}`, which it needs, is not implemented "
                               f"yet. Finish {PART_OF[exc.name]} first.") from None
                raise Hint(f"`{self.name}` fails, and your {exc.name}, which it calls, {exc.what}: fix "
                           f"{exc.name} first ({PART_OF[exc.name]}).") from None
            raise
        got = pair(out, self.name, 2, "a pair (out, weights)")
        B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
        tensor(got[0], self.name, shape=(B, Lq, self.D), dtype=self.dtype, device=self.device,
               what="its output (B, Lq, D)")
        tensor(got[1], self.name, shape=(B, self.H, Lq, Lk), dtype=self.dtype, device=self.device,
               what="its weights (B, H, Lq, Lk)")
        return got

    def attend(self, pieces, query, key, value, mask, **kw):
        q, k, v = _cpu64(query, key, value)
        return _attend(self.sd, q, k, v, None if mask is None else mask.cpu(), self.H, self.H_kv, pieces, **kw)

    def near(self, got, expected):
        if expected is None:
            return False
        rtol, atol = HALF_TOL.get(self.dtype, (None, None))
        return close(got, expected.to(self.dtype), self.device, rtol=rtol, atol=atol)

    def _mistakes(self, pieces, query, key, value, mask, i):
        """(hint, thunk) for the typical mistakes of a module, result `i` (0 output, 1 weights)."""
        def make(**kw):
            return lambda: self.attend(pieces, query, key, value, mask, **kw)[i]

        def inline(**kw):
            return make(attention=lambda q, k, v, m: _inline_attention(q, k, v, m, **kw))
        # Attention written inline (not by calling scaled_dot_product_attention) has mistakes of its own.
        table = [(SCALE_D, make(scale_by=self.D)), (NO_SCALE, make(scale_by=1)),
                 (NO_SOFTMAX, inline(softmax_dim=None)), (SOFTMAX_AXIS, inline(softmax_dim=-2)),
                 (SOFTMAX_AXIS, inline(softmax_dim=1)), (SCALE_AFTER_SOFTMAX, inline(scale_after=True)),
                 (MOD_SPLIT, make(split=_split_no_transpose))]
        if self.H == self.H_kv:
            table += [(SWAP_QK, make(swap_qk=True)), (SWAP_KV, make(swap_kv=True))]
        if self.H != self.H_kv:
            table.append((TILED, make(tiled=True)))
        if mask is not None:
            table += [(MASK_INVERTED, lambda: self.attend(pieces, query, key, value, ~mask)[i]),
                      (MASK_IGNORED, lambda: self.attend(pieces, query, key, value, None)[i])]
        if i == 0:
            table += [(NO_WO, make(no_wo=True)), (MOD_MERGE, make(merge=_merge_no_transpose))]
        return table

    def check(self, query, key, value, mask=None, *, got=None, expected=None):
        """The learner's (out, weights), and whether they were accepted as built from the learner's own
        (wrong) split_heads or merge_heads. Fails with the likely mistake unless they are the
        reference's (or `expected`), or what the learner's own split and merge give."""
        got = self.run(query, key, value, mask) if got is None else got
        ref = self.attend(_Pieces(self.reference), query, key, value, mask) if expected is None else expected
        if all(self.near(g, e) for g, e in zip(got, ref)):
            return got, False
        own = _Pieces(self.reference, self.learner)
        try:
            mine = self.attend(own, query, key, value, mask)
        except _Broken as exc:
            raise Hint(f"`{self.name}` is wrong, and your {exc.name}, which it uses, {exc.what}: fix {exc.name} "
                       f"first ({PART_OF[exc.name]}).") from None
        if own.trouble is not None and all(self.near(g, e) for g, e in zip(got, mine)):
            return got, True
        pieces = own if own.trouble is not None else _Pieces(self.reference)
        base = mine if own.trouble is not None else self.attend(pieces, query, key, value, mask)
        also = "" if own.trouble is None else (f" Your {own.trouble[0]} {own.trouble[1]} too: fix it first "
                                               f"({PART_OF[own.trouble[0]]}).")
        rtol, atol = HALF_TOL.get(self.dtype, (1e-3, 1e-4))

        def same(a, b):
            return close(a, b.to(a.dtype), rtol=rtol, atol=atol)

        for i, what in ((1, "weights"), (0, "output")):
            if not self.near(got[i], base[i]):
                hint = diagnose(got[i], self._mistakes(pieces, query, key, value, mask, i),
                                MODULE_GENERIC[what].format(self.name), same=same)
                raise Hint(hint + also)
        raise Hint(MODULE_GENERIC["weights"].format(self.name) + also)

    def grads(self, rng, query, key, value, mask):
        """Fail unless the gradients of the learner's module (inputs and parameters, float64) match the
        reference's, the module's forward being checked first."""
        _, own = self.check(query, key, value, mask)
        B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
        cot = (_randn(rng, B, Lq, self.D), _randn(rng, B, self.H, Lq, Lk))
        res = learner_grads(self.learner, self.mod, query, key, value, **_kw(mask), cotangents=cot, params=True,
                            what=self.name)
        pieces = _Pieces(self.reference)
        if own:
            pieces = _Rearranging(self.reference, self.learner)
            expect(pieces.maps(query.shape[0], query.shape[1], key.shape[1], self.D, self.H, self.H_kv),
                   f"`{self.name}`'s gradients cannot be checked while split_heads or merge_heads is wrong: "
                   "fix part 1 first.")
        params = {n: p.detach().clone().requires_grad_(True) for n, p in self.sd.items()}
        ins = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
        out = _attend(params, *ins, mask, self.H, self.H_kv, pieces)
        expected = vjp(out, [*ins, *params.values()], cot)
        got = list(res.arg_grads[:3]) + [None] * (3 - len(res.arg_grads[:3]))
        got += [res.param_grads.get(n) for n in params]
        names = ["query", "key", "value"] + [f"the parameter {n}" for n in params]
        # query, key and value are the same tensor in self-attention: the gradients then add up.
        for name, g, e in zip(names, got, expected):
            expect_grads([g], [e], [name], hint=MODULE_GRAD.format(self.name, name))


def _pieces_device_agnostic(learner, x, n_heads):
    try:
        expect_device_agnostic(learner, "split_heads", x, n_heads)
        B, T, D = x.shape
        expect_device_agnostic(learner, "merge_heads", x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2))
    except (Hint, LearnerError, NotImplementedRemote, MissingName):
        return False
    return True


# --- Part 1: split and merge heads (4 points) ------------------------------------------------

SHAPES = [(2, 5, 12, 3), (3, 4, 8, 2), (1, 3, 8, 8), (2, 2, 6, 1)]  # (B, T, D, H)


def _split(learner, reference, x, H, device="cpu"):
    B, T, D = x.shape
    got = tensor(learner.split_heads(x.to(device), H), "split_heads", shape=(B, H, T, D // H), dtype=x.dtype,
                 device=device, what="the heads (B, H, T, d_head)")
    if not close(got, reference.split_heads(x, H)):
        x64 = x.double()
        raise Hint(diagnose(got, [(SPLIT_NO_TRANSPOSE, lambda: _split_no_transpose(x64, H)),
                                  (SPLIT_INTERLEAVED, lambda: x64.reshape(B, T, D // H, H).permute(0, 3, 1, 2))],
                            SPLIT_GENERIC))
    return got


def _merge(learner, reference, h, device="cpu"):
    B, H, T, d = h.shape
    try:
        got = learner.merge_heads(h.to(device))
    except LearnerError as exc:
        expect("view size is not compatible" not in exc.message, MERGE_VIEW)
        raise
    tensor(got, "merge_heads", shape=(B, T, H * d), dtype=h.dtype, device=device, what="the merged heads (B, T, D)")
    if not close(got, reference.merge_heads(h)):
        h64 = h.double()
        raise Hint(diagnose(got, [(MERGE_NO_TRANSPOSE, lambda: _merge_no_transpose(h64)),
                                  (MERGE_INTERLEAVED, lambda: h64.permute(0, 2, 3, 1).reshape(B, T, H * d))],
                            MERGE_GENERIC))
    return got


@points(1, part="split_merge")
def test_split_heads_matches_reference(learner, reference, rng):
    """Does split_heads give head h the features h * d_head ... (h + 1) * d_head - 1, as (B, H, T, d_head)?"""
    for B, T, D, H in SHAPES:
        _split(learner, reference, _randn(rng, B, T, D, dtype=F32), H)


@points(1, part="split_merge")
def test_merge_heads_matches_reference(learner, reference, rng):
    """Does merge_heads put the heads back in order, (B, H, T, d_head) to (B, T, H * d_head)?"""
    for B, T, D, H in SHAPES:
        _merge(learner, reference, _randn(rng, B, H, T, D // H, dtype=F32))


@points(1, part="split_merge")
def test_split_merge_round_trip(learner, reference, rng):
    """Is merge_heads(split_heads(x)) == x (both right), and does split_heads refuse an indivisible D?"""
    for B, T, D, H in SHAPES:
        x = _randn(rng, B, T, D, dtype=F32)
        heads = _split(learner, reference, x, H)
        back = _merge(learner, reference, heads)
        expect(torch.equal(back, x), NOT_INVERSE)
    x = _randn(rng, 2, 3, 12, dtype=F32)
    try:
        learner.split_heads(x, 5)
    except LearnerError as exc:
        expect(exc.etype == "ValueError", OTHER_ERROR)
    else:
        raise Hint(NO_VALUE_ERROR)


@points(1, part="split_merge")
def test_split_merge_dtypes_devices_gradients(learner, reference, rng, devices):
    """Do split_heads and merge_heads keep any dtype and device, pass gradients, and avoid fixed devices?"""
    for device in devices:
        for dtype in (F64, *HALF):
            x = _randn(rng, 2, 3, 8, dtype=dtype)
            _split(learner, reference, x, 4, device)
            _merge(learner, reference, reference.split_heads(x, 2), device)
    x, g = _randn(rng, 2, 3, 12), _randn(rng, 2, 3, 3, 4)
    res = learner_grads(learner, "split_heads", x, 3, cotangents=(g,), what="split_heads")
    expect_grads(res.arg_grads[:1], [reference.merge_heads(g)], ["x"])
    res = learner_grads(learner, "merge_heads", g, cotangents=(x,), what="merge_heads")
    expect_grads(res.arg_grads[:1], [reference.split_heads(x, 3)], ["x"])
    expect_device_agnostic(learner, "split_heads", x, 3)
    expect_device_agnostic(learner, "merge_heads", g)


# --- Part 2: multi-head attention (9 points) -------------------------------------------------

DIMS = [(8, 2), (12, 3), (8, 1)]


@points(1, part="multi_head_attention")
def test_mha_matches_reference(learner, reference, rng):
    """Does self-attention agree with the reference for several head counts, given the same weights?"""
    for D, H in DIMS:
        case = _Case(learner, reference, rng, D, H)
        case.check(*case.inputs(rng, 2, 5, cross=False))


@points(1, part="multi_head_attention")
def test_mha_cross_attention(learner, reference, rng):
    """With Lq != Lk and different query, key and value tensors, does it agree with the reference?"""
    for D, H in DIMS[:2]:
        case = _Case(learner, reference, rng, D, H)
        case.check(*case.inputs(rng, 2, 3, 6))


@points(1, part="multi_head_attention")
def test_mha_masks(learner, reference, rng):
    """Do a padding mask (B, 1, 1, Lk), a causal mask (Lq, Lk) and a per-head mask zero the right weights?"""
    case = _Case(learner, reference, rng, 12, 3)
    q, k, v = case.inputs(rng, 2, 5, 5)
    pad = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]  # (B, 1, 1, Lk)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    for mask in (pad, causal, pad & causal, random_mask(rng, (2, 3, 5, 5))):
        (_, w), _ = case.check(q, k, v, mask)
        expect(bool((w[~mask.expand_as(w)] == 0).all()), "Weights where the mask is False must be exactly 0.")


@points(1, part="multi_head_attention")
def test_mha_fully_masked_rows(learner, reference, rng):
    """Does a query with no allowed key get zero weights, and the output W_o(0) (its bias), never NaN?"""
    case = _Case(learner, reference, rng, 8, 2)
    q, k, v = case.inputs(rng, 2, 4, 6)
    mask = random_mask(rng, (2, 2, 4, 6), fully_masked=3)
    (out, w), _ = case.check(q, k, v, mask)
    expect(not torch.isnan(out).any() and not torch.isnan(w).any(),
           "A query whose keys are all masked gives NaN: its weights must be exactly 0.")


@points(1, part="multi_head_attention")
def test_mha_gradients(learner, reference, rng):
    """With a mask (one row fully masked), do the gradients for query, key, value and every weight match?"""
    case = _Case(learner, reference, rng, 12, 3, dtype=F64)
    q, k, v = case.inputs(rng, 2, 4, 5)
    case.grads(rng, q, k, v, random_mask(rng, (2, 1, 4, 5), fully_masked=1))


@points(1, part="multi_head_attention")
def test_mha_heads_are_independent(learner, reference, rng):
    """Does changing head h's slice of W_q change head h's weights only (and are the weights right)?"""
    D, H, h = 12, 3, 1
    case = _Case(learner, reference, rng, D, H)
    q, k, v = case.inputs(rng, 2, 4, 5)
    (_, before), own = case.check(q, k, v)
    state = {n: t.float() for n, t in case.sd.items()}
    d = D // H
    state["W_q.weight"][h * d:(h + 1) * d] = _randn(rng, d, D, dtype=F32, scale=1.5 / math.sqrt(D))
    state["W_q.bias"][h * d:(h + 1) * d] = _randn(rng, d, dtype=F32)
    changed = _Case(learner, reference, rng, D, H, state=state)
    (_, after), own2 = changed.check(q, k, v)
    if own or own2:
        return  # right given the learner's own split_heads and merge_heads, which part 1 grades
    others = [i for i in range(H) if i != h]
    independent = close(after[:, others], before[:, others]) and not close(after[:, h], before[:, h])
    expect(independent, "Changing head h's rows of W_q changes other heads' weights: each head must use its own "
                        "block of d_head features (split along the features, not the positions).")


@points(1, part="multi_head_attention")
def test_mha_matches_torch(learner, reference, rng):
    """Given the same weights, does it agree with torch.nn.MultiheadAttention (output, per-head and averaged
    weights), with and without masks?"""
    D, H, B, Lq, Lk = 12, 3, 2, 4, 6
    theirs = reference.torch_mha(D, H).eval()  # float32 weights, as ours hold, computing in float64
    theirs.load_state_dict({n: _randn(rng, *p.shape, scale=1.5 / math.sqrt(D)) for n, p in theirs.state_dict().items()})
    ref = reference.load_torch_mha(reference.MultiHeadAttention(D, H), theirs)
    theirs.double()
    case = _Case(learner, reference, rng, D, H, dtype=F64, state=ref.state_dict())
    q, k, v = case.inputs(rng, B, Lq, Lk)
    attn = random_mask(rng, (Lq, Lk))
    pad = torch.ones(B, Lk, dtype=torch.bool)
    pad[1, 4:] = False
    for mask, kw in ((None, {}), (attn, {"attn_mask": ~attn}), (pad[:, None, None, :], {"key_padding_mask": ~pad})):
        with torch.no_grad():
            their_out, their_w = theirs(q, k, v, need_weights=True, average_attn_weights=False, **kw)
            _, their_avg = theirs(q, k, v, need_weights=True, average_attn_weights=True, **kw)
        (out, w), own = case.check(q, k, v, mask, expected=(their_out, their_w))
        expect(own or close(w.mean(dim=1), their_avg), "The weights averaged over the heads differ from PyTorch's.")


@points(1, part="multi_head_attention")
def test_mha_dropout(learner, reference, rng):
    """Is dropout applied to the weights in training mode only, scaled by 1/(1-p)?"""
    p, B, L = 0.5, 2, 24
    case = _Case(learner, reference, rng, 8, 2, dropout=p, dtype=F64)
    q, k, v = case.inputs(rng, B, L, cross=False)
    case.mod.eval()
    got = case.run(q, k, v)
    ref = case.attend(_Pieces(reference), q, k, v, None)
    if not close(got[1], ref[1]):
        dropped = got[1] == 0
        expect(not (0.3 < dropped.double().mean().item() < 0.7), DROPOUT_IN_EVAL)
    _, own = case.check(q, k, v, got=got)
    again = case.run(q, k, v)
    expect(torch.equal(again[0], got[0]), DROPOUT_IN_EVAL)
    case.mod.train()
    out, w = case.run(q, k, v)
    dropped = w == 0
    expect(0.35 < dropped.double().mean().item() < 0.65, NO_DROPOUT)
    pieces = _Pieces(reference, learner) if own else _Pieces(reference)
    _, plain = case.attend(pieces, q, k, v, None)
    expect(close(w[~dropped], plain[~dropped] / (1 - p)), DROPOUT_SCALE)
    expect(close(out, case.attend(pieces, q, k, v, None, weights=w)[0]), DROPOUT_OUTPUT)


@points(1, part="multi_head_attention")
def test_mha_dtypes_and_devices(learner, reference, rng, devices):
    """Does it work in float64, float16 and bfloat16, on every device, creating nothing on a fixed device?"""
    for device in devices:
        for dtype in (F64, *HALF):
            case = _Case(learner, reference, rng, 8, 2, device=device, dtype=dtype)
            q, k, v = case.inputs(rng, 2, 3, 4)
            case.check(q, k, v, random_mask(rng, (2, 1, 3, 4), fully_masked=1))
    case = _Case(learner, reference, rng, 8, 2)
    q, k, v = case.inputs(rng, 2, 3, 4)
    mask = random_mask(rng, (2, 1, 3, 4))
    case.check(q, k, v, mask)
    if _pieces_device_agnostic(learner, q, 2):
        on_meta = module(learner.MultiHeadAttention(8, 2), "MultiHeadAttention")
        on_meta.to("meta")
        expect_device_agnostic(learner, on_meta, q, k, v)
        expect_device_agnostic(learner, on_meta, q, k, v, mask=mask)


# --- Part 3: parity with torch.nn.MultiheadAttention (4 points) --------------------------------

def _theirs_state(rng, D):
    return {"in_proj_weight": _randn(rng, 3 * D, D, dtype=F32), "in_proj_bias": _randn(rng, 3 * D, dtype=F32),
            "out_proj.weight": _randn(rng, D, D, dtype=F32), "out_proj.bias": _randn(rng, D, dtype=F32)}


def _expected_load(reference, D, H, state):
    theirs = reference.torch_mha(D, H)
    theirs.load_state_dict(state)
    return reference.load_torch_mha(reference.MultiHeadAttention(D, H), theirs).state_dict()


def _their_handle(learner, D, H, state):
    expect(learner.has("torch_mha"), NO_TORCH_MHA)
    theirs = learner.torch_mha(D, H)
    expect(isinstance(theirs, RemoteObject), NO_TORCH_MHA)
    theirs.load_state_dict(state)
    return theirs


def _state_of(module, name):
    sd = module.state_dict()
    expect(isinstance(sd, dict) and all(isinstance(t, torch.Tensor) for t in sd.values()),
           f"`{name}`'s state_dict() is not a dict of tensors.")
    return sd


def _judge_load(sd, expected, state):
    """Fail with the likely mistake unless the state dict `sd` is `expected`."""
    missing = sorted(set(expected) - set(sd))
    expect(not missing, f"`load_torch_mha` returns a module without {', '.join(missing[:3])}: return `ours`.")
    D = state["out_proj.weight"].shape[0]
    chunks = state["in_proj_weight"].split(D)
    for name, e in expected.items():
        g = sd[name]
        if close(g, e):
            continue
        expect(tuple(g.shape) == tuple(e.shape), LOAD_GENERIC.format(name))
        if name.startswith("W_o"):
            raise Hint(OUT_PROJ)
        if name.endswith("bias"):
            raise Hint(BIAS)
        own = "qkv".index(name[2])
        expect(not close(g, chunks[own].T), TRANSPOSED)
        expect(not any(close(g, c) for i, c in enumerate(chunks) if i != own), ORDER)
        raise Hint(LOAD_GENERIC.format(name))


@points(1, part="torch_parity")
def test_load_torch_mha_copies_weights(learner, reference, rng):
    """Does load_torch_mha copy in_proj_weight's q, k, v chunks, in_proj_bias and out_proj into W_q, W_k, W_v, W_o?"""
    for D, H in ((8, 2), (12, 3)):
        state = _theirs_state(rng, D)
        theirs = _their_handle(learner, D, H, state)
        res = learner.load_torch_mha(learner.MultiHeadAttention(D, H), theirs)
        expect(isinstance(res, RemoteObject), NOT_MODULE)
        _judge_load(_state_of(res, "load_torch_mha"), _expected_load(reference, D, H, state), state)


@points(1, part="torch_parity")
def test_load_torch_mha_fills_ours_with_copies(learner, reference, rng):
    """Does load_torch_mha fill `ours` itself, with copies that later changes to theirs leave alone?"""
    D, H = 8, 2
    state = _theirs_state(rng, D)
    expected = _expected_load(reference, D, H, state)
    theirs = _their_handle(learner, D, H, state)
    ours = learner.MultiHeadAttention(D, H)
    res = learner.load_torch_mha(ours, theirs)
    expect(isinstance(res, RemoteObject), NOT_MODULE)
    _judge_load(_state_of(res, "load_torch_mha"), expected, state)
    sd = _state_of(ours, MHA)
    expect(all(close(sd.get(n), e) for n, e in expected.items()), NOT_IN_PLACE)
    theirs.load_state_dict(_theirs_state(rng, D))
    sd = _state_of(ours, MHA)
    expect(all(close(sd.get(n), e) for n, e in expected.items()), SHARED)


def _converted(learner, mask, device="cpu"):
    got = tensor(learner.to_torch_attn_mask(mask.to(device)), "to_torch_attn_mask", device=device, what="its mask")
    expect(tuple(got.shape) == tuple(mask.shape), MASK_SHAPE)
    expect(got.dtype == torch.bool, "`to_torch_attn_mask` must return a boolean mask (dtype torch.bool).")
    if not torch.equal(got.cpu(), ~mask):
        expect(not torch.equal(got.cpu(), mask), NOT_INVERTED)
        raise Hint(MASK_GENERIC)
    return got


@points(1, part="torch_parity")
def test_to_torch_attn_mask_values(learner, reference, rng, devices):
    """Does to_torch_attn_mask turn our masks (True = may attend) into PyTorch's (True = may not), keeping any shape?"""
    for device in devices:
        for shape in ((4, 6), (6, 4, 6), (2, 6), (2, 1, 1, 6)):
            _converted(learner, random_mask(rng, shape), device)
    expect_device_agnostic(learner, "to_torch_attn_mask", random_mask(rng, (4, 6)))


@points(1, part="torch_parity")
def test_to_torch_attn_mask_agrees_with_pytorch(learner, reference, rng):
    """With the converted masks as attn_mask and key_padding_mask, does nn.MultiheadAttention agree with ours?"""
    D, H, B, Lq, Lk = 8, 2, 2, 4, 6
    theirs = reference.torch_mha(D, H).eval()  # float32 weights, as ours hold, computing in float64
    theirs.load_state_dict({n: _randn(rng, *p.shape, scale=1.5 / math.sqrt(D)) for n, p in theirs.state_dict().items()})
    ours = reference.load_torch_mha(reference.MultiHeadAttention(D, H), theirs).double()
    theirs.double()
    q, k, v = _randn(rng, B, Lq, D), _randn(rng, B, Lk, D), _randn(rng, B, Lk, D)
    attn = random_mask(rng, (Lq, Lk))
    pad = torch.ones(B, Lk, dtype=torch.bool)
    pad[0, 3:] = False
    for mask, kw in ((attn, "attn_mask"), (pad, "key_padding_mask")):
        converted = _converted(learner, mask)
        with torch.no_grad():
            out, w = theirs(q, k, v, average_attn_weights=False, **{kw: converted})
            ref_out, ref_w = ours(q, k, v, mask=mask if kw == "attn_mask" else mask[:, None, None, :])
        expect(close(out, ref_out) and close(w, ref_w), TORCH_PARITY)


# --- Part 4: grouped-query attention (6 points) -----------------------------------------------

GQA_DIMS = [(12, 6, 2), (8, 4, 1), (8, 2, 2)]  # (D, H, H_kv)


@points(1, part="grouped_query")
def test_repeat_kv(learner, reference, rng, devices):
    """Does repeat_kv repeat each key/value head n_rep times in a row, keeping dtype and device?"""
    for device in devices:
        for shape, n_rep, dtype in (((2, 2, 5, 4), 3, F32), ((1, 1, 3, 2), 4, F64), ((2, 3, 4, 2), 1, F32),
                                    ((2, 2, 3, 4), 2, torch.bfloat16)):
            x = _randn(rng, *shape, dtype=dtype)
            B, H_kv, T, d = shape
            got = tensor(learner.repeat_kv(x.to(device), n_rep), "repeat_kv", shape=(B, H_kv * n_rep, T, d),
                         dtype=dtype, device=device, what="the repeated heads (B, H_kv * n_rep, T, d)")
            if not close(got, reference.repeat_kv(x, n_rep)):
                raise Hint(diagnose(got, [(TILED, lambda: x.double().repeat(1, n_rep, 1, 1))],
                                    "`repeat_kv` gives the wrong heads: head h must be key/value head h // n_rep.",
                                    same=lambda a, b: close(a, b.to(a.dtype))))
    expect_device_agnostic(learner, "repeat_kv", _randn(rng, 2, 2, 3, 4, dtype=F32), 2)


@points(1, part="grouped_query")
def test_gqa_matches_reference(learner, reference, rng):
    """Does grouped-query attention agree with the reference (several head counts, Lq != Lk)?"""
    for D, H, H_kv in GQA_DIMS:
        case = _Case(learner, reference, rng, D, H, H_kv)
        case.check(*case.inputs(rng, 2, 3, 5))


@points(1, part="grouped_query")
def test_gqa_masks(learner, reference, rng):
    """With padding, causal and per-head masks (some rows fully masked), are the weights and outputs right?"""
    case = _Case(learner, reference, rng, 12, 6, 2)
    q, k, v = case.inputs(rng, 2, 5, 5)
    pad = torch.tensor([[True] * 5, [True, True, False, False, False]])[:, None, None, :]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    for mask in (pad, causal, random_mask(rng, (2, 6, 5, 5), fully_masked=2)):
        (out, w), _ = case.check(q, k, v, mask)
        expect(bool((w[~mask.expand_as(w)] == 0).all()) and not torch.isnan(out).any(),
               "Weights where the mask is False must be exactly 0, and no output NaN.")


@points(1, part="grouped_query")
def test_gqa_is_mha_and_mqa(learner, reference, rng):
    """With n_kv_heads == n_heads is it multi-head attention, and with n_kv_heads = 1 multi-query attention?"""
    D, H = 12, 3
    mha = reference.MultiHeadAttention(D, H)
    mha.load_state_dict({n: _randn(rng, *p.shape, dtype=F32, scale=1.5 / math.sqrt(D))
                         for n, p in mha.state_dict().items()})
    case = _Case(learner, reference, rng, D, H, H, state=mha.state_dict())
    q, k, v = case.inputs(rng, 2, 4, 5)
    with torch.no_grad():
        expected = tuple(t.double() for t in mha.double()(*_cpu64(q, k, v)))
    case.check(q, k, v, expected=expected)
    case = _Case(learner, reference, rng, D, H, 1)
    q, k, v = case.inputs(rng, 2, 4, 5)
    sd = case.sd
    q64, k64, v64 = _cpu64(q, k, v)
    heads_q = reference.split_heads(F.linear(q64, sd["W_q.weight"], sd["W_q.bias"]), H)  # (B, H, Lq, d)
    shared_k = F.linear(k64, sd["W_k.weight"], sd["W_k.bias"])[:, None]  # (B, 1, Lk, d): one head for all
    shared_v = F.linear(v64, sd["W_v.weight"], sd["W_v.bias"])[:, None]  # (B, 1, Lk, d)
    out, w = reference.scaled_dot_product_attention(heads_q, shared_k, shared_v)
    case.check(q, k, v, expected=(F.linear(reference.merge_heads(out), sd["W_o.weight"], sd["W_o.bias"]), w))


@points(1, part="grouped_query")
def test_gqa_gradients(learner, reference, rng):
    """With a mask, do the gradients for query, key, value and every weight match the reference's?"""
    case = _Case(learner, reference, rng, 8, 4, 2, dtype=F64)
    q, k, v = case.inputs(rng, 2, 3, 5)
    case.grads(rng, q, k, v, random_mask(rng, (2, 1, 3, 5), fully_masked=1))


@points(1, part="grouped_query")
def test_gqa_dtypes_and_devices(learner, reference, rng, devices):
    """Does it work in float64, float16 and bfloat16, on every device, creating nothing on a fixed device?"""
    for device in devices:
        for dtype in (F64, *HALF):
            case = _Case(learner, reference, rng, 8, 4, 2, device=device, dtype=dtype)
            q, k, v = case.inputs(rng, 2, 3, 4)
            case.check(q, k, v, random_mask(rng, (2, 1, 3, 4)))
    case = _Case(learner, reference, rng, 8, 4, 2)
    q, k, v = case.inputs(rng, 2, 3, 4)
    mask = random_mask(rng, (2, 1, 3, 4))
    case.check(q, k, v, mask)
    if _pieces_device_agnostic(learner, q, 4):
        on_meta = module(learner.GroupedQueryAttention(8, 4, 2), "GroupedQueryAttention")
        on_meta.to("meta")
        expect_device_agnostic(learner, on_meta, q, k, v, mask=mask)
