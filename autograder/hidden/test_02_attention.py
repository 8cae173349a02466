"""Hidden tests for exercise 02_attention: score functions, the masked context vector, a
decoder step with attention, and Luong's local-p attention.

Each test compares the learner's code (through the `learner` proxy) with the reference on
fresh random inputs, shapes and weights, or checks a property that chapter 02 teaches. A
failed check explains itself by the likely mistake, found by comparing the learner's
result with the results of typical wrong variants computed here (in float64, on the CPU).
Inputs are tiny: this suite runs once per learner.
"""

from __future__ import annotations

import itertools
import math

import torch

from autograder.hidden.support import close, expect, points
from autograder.runner import LearnerError, MissingName, NotImplementedRemote

F32, F64 = torch.float32, torch.float64
DTYPES = (F32, F64)
DECODER = "AttnDecoder"
LOCAL = "local_attention_weights"
EDGE_HINT = ("Rows whose window reaches an end of the sequence are wrong: the window must be cut short at "
             "positions 0 and T - 1 (a slice with a negative start wraps around).")


# --- helpers ---------------------------------------------------------------------------

def _randn(rng, *shape, dtype=F32, scale=1.0):
    return (torch.randn(*shape, generator=rng, dtype=F64) * scale).to(dtype)


def _randint(rng, lo, hi):
    """An int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng))


def _mask(rng, B, T):
    """A boolean (B, T) mask, True at real tokens: every row has a real token and, if T > 1,
    a padded one (so that an inverted mask still leaves a real token)."""
    m = torch.rand(B, T, generator=rng) < 0.6
    for b in range(B):
        if not m[b].any():
            m[b, _randint(rng, 0, T - 1)] = True
        if T > 1 and m[b].all():
            m[b, _randint(rng, 0, T - 1)] = False
    return m


def _cpu64(*ts):
    return tuple(None if t is None else t.detach().cpu().double() if t.is_floating_point() else t.cpu()
                 for t in ts)


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _expect_tensor(x, name, shape, dtype, device, what):
    """Fail unless `x` is a tensor of `shape` and `dtype` on `device`; `what` names the result
    and its symbolic shape for the learner, e.g. "scores (B, T)"."""
    expect(_is_tensor(x), f"`{name}` must return torch tensors ({what}), not {type(x).__name__}.")
    shape = tuple(shape)
    if tuple(x.shape) != shape:
        same_sizes = [n for n in x.shape if n != 1] == [n for n in shape if n != 1]
        if same_sizes and x.dim() < len(shape):
            expect(False, f"`{name}` loses an axis of size 1 (a batch of one row, or a single position): "
                          f"a bare squeeze() drops every axis of size 1; squeeze only the axis you mean, "
                          f"e.g. squeeze(-1). Expected {what}.")
        if same_sizes:
            expect(False, f"`{name}` returns an extra axis of size 1: expected {what}.")
        expect(False, f"`{name}` returns {what.split(' (')[0]} of the wrong shape ({x.dim()} axes): "
                      f"expected {what}.")
    expect(x.dtype == dtype, f"`{name}` changes the dtype: {dtype} in, {x.dtype} out. Create new "
                             "tensors with the dtype of the inputs.")
    expect(x.device.type == torch.device(device).type,
           f"`{name}` returns its result on another device than its inputs: create every new tensor "
           "on the device of the inputs (device=x.device).")


def _diagnose(got, expected, variants, generic):
    """The hint of the first wrong variant that `got` matches (and the reference does not)."""
    g = got.detach().cpu().double().nan_to_num(0.0)
    e = expected.detach().cpu().double()
    for hint, wrong in variants:
        if wrong is None or tuple(wrong.shape) != tuple(g.shape):
            continue
        w = wrong.detach().cpu().double().nan_to_num(0.0)
        if torch.allclose(w, e, rtol=1e-3, atol=1e-5):
            continue  # this variant is not told apart by these inputs
        if torch.allclose(g, w, rtol=1e-3, atol=1e-5):
            return hint
    return generic


def _check(name, got, expected, device, what, variants, generic):
    """Fail with a diagnosis unless `got` is `expected` (type, shape, dtype, device, values).
    `variants` is a callable returning (hint, wrong result) pairs, evaluated only on failure."""
    _expect_tensor(got, name, expected.shape, expected.dtype, device, what)
    if not close(got, expected, device):
        expect(False, _diagnose(got, expected, variants(), generic))


def _tuple(result, name, n, what):
    expect(isinstance(result, (tuple, list)) and len(result) == n, f"`{name}` must return {what}.")
    return result


def _expect_order(got, expected, name, order, device="cpu"):
    """Fail with a clear hint when `got` holds the expected results in another order."""
    n = len(expected)
    for perm in itertools.permutations(range(n)):
        if perm != tuple(range(n)) and all(_is_tensor(got[perm[i]]) and close(got[perm[i]], expected[i], device)
                                           for i in range(n)):
            expect(False, f"`{name}` returns its results in the wrong order: return {order}.")


def _quietly(fn, *args, **kwargs):
    """A learner's helper called only to refine a hint: None if it fails."""
    try:
        return fn(*args, **kwargs)
    except (LearnerError, MissingName, NotImplementedRemote):
        return None


def _expect_grads(got, expected, names):
    """Gradients of a result already found right: a difference means autograd was side-stepped."""
    for name, g, e in zip(names, got, expected):
        expect(g is not None, f"No gradient reaches {name}: is something detached, or computed outside "
                              "PyTorch (NumPy, .item(), .data, a Python float)?")
        expect(close(g, e), f"The result is right but its gradient with respect to {name} is not: is part "
                            "of it computed outside autograd (.data, .detach(), NumPy) or in place?")


# --- Part 1: dot and scaled-dot scores (2 points) ----------------------------------------

def _dot64(q, k):
    return torch.einsum("bd,btd->bt", q.double(), k.double())


def _dot_variants(q, k):
    q, k = _cpu64(q, k)
    return [
        ("`dot_score` divides by sqrt(d): the plain dot score is not scaled (that is scaled_dot_score).",
         _dot64(q, k) / math.sqrt(q.shape[-1])),
        ("`dot_score` mixes batch rows: the keys of row b must meet the query of row b only.",
         torch.einsum("cd,btd->bt", q, k)),
    ]


def _scaled_variants(q, k):
    q, k = _cpu64(q, k)
    e, d, T = _dot64(q, k), q.shape[-1], k.shape[-2]
    return [
        ("The scores are not divided by sqrt(d): scaled_dot_score returns the plain dot score.", e),
        ("The scores are divided by d instead of sqrt(d).", e / d),
        ("The scores are divided by the square root of the number of keys T, not of the vector size "
         "d: use query.size(-1).", e / math.sqrt(T)),
        ("The scores are multiplied by sqrt(d) instead of divided by it.", e * math.sqrt(d)),
    ]


@points(1, part="dot_scores")
def test_dot_score_matches_reference(learner, reference, rng, devices):
    """Does dot_score agree with the reference for any batch size, length and width, in float32 and float64?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, d in [(1, 1, 3), (2, 5, 4), (3, 4, 7)]:
                q, k = _randn(rng, B, d, dtype=dtype).to(device), _randn(rng, B, T, d, dtype=dtype).to(device)
                _check("dot_score", learner.dot_score(q, k), reference.dot_score(q, k), device,
                       "scores (B, T), one per batch row and source position", lambda: _dot_variants(q, k),
                       "`dot_score` differs from the dot product of each key with its row's query.")


@points(1, part="dot_scores")
def test_scaled_dot_score_matches_reference(learner, reference, rng, devices):
    """Is scaled_dot_score the dot score divided by sqrt(d), with d the size of the vectors?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, d in [(2, 3, 16), (1, 5, 9), (3, 1, 4)]:
                q, k = _randn(rng, B, d, dtype=dtype).to(device), _randn(rng, B, T, d, dtype=dtype).to(device)
                e = learner.scaled_dot_score(q, k)
                expected = reference.scaled_dot_score(q, k)
                if _is_tensor(e) and tuple(e.shape) == (B, T) and not close(e, expected, device):
                    mine = _quietly(learner.dot_score, q, k)
                    if _is_tensor(mine) and not close(mine, reference.dot_score(q, k), device) \
                            and close(e, mine / math.sqrt(d), device):
                        expect(False, "scaled_dot_score divides your dot_score by sqrt(d) correctly, but "
                                      "dot_score itself is wrong: fix it first.")
                _check("scaled_dot_score", e, expected, device, "scores (B, T)",
                       lambda: _scaled_variants(q, k),
                       "`scaled_dot_score` differs from the dot score divided by sqrt(d).")


# --- Part 2: the general score (2 points) -------------------------------------------------

def _general_variants(q, k, W):
    q, k, W = _cpu64(q, k, W)
    out = []
    if W.shape[0] == W.shape[1]:
        out += [
            ("W is used transposed: the score is s^T W h_j with W of shape (d_q, d_k), so multiply the "
             "query by W (query @ W), not by W^T (which is what nn.Linear-style W @ s computes).",
             torch.einsum("bd,btd->bt", q @ W.T, k)),
            ("The score ignores W: the general score is s^T W h_j, not the dot score.", _dot64(q, k)),
        ]
    out.append(("The general score is not scaled: leave out the division by sqrt(d).",
                torch.einsum("bd,btd->bt", q @ W, k) / math.sqrt(k.shape[-1])))
    return out


@points(1, part="general_score")
def test_general_score_matches_reference(learner, reference, rng, devices):
    """Does general_score agree with the reference, also when d_q != d_k, float32 and float64, on every device?"""
    for device in devices:
        for dtype in DTYPES:
            # The square case first: there a transposed W still runs, so it can be named.
            for B, T, dq, dk in [(2, 4, 5, 5), (3, 5, 4, 6), (1, 3, 7, 2)]:
                q = _randn(rng, B, dq, dtype=dtype).to(device)
                k = _randn(rng, B, T, dk, dtype=dtype).to(device)
                W = _randn(rng, dq, dk, dtype=dtype).to(device)
                _check("general_score", learner.general_score(q, k, W), reference.general_score(q, k, W),
                       device, "scores (B, T)", lambda: _general_variants(q, k, W),
                       "`general_score` differs from s^T W h_j for each key h_j.")


@points(1, part="general_score")
def test_general_score_gradients(learner, reference, rng):
    """Do the gradients with respect to the query, the keys and W match the reference's?"""
    q, k, W = _randn(rng, 3, 4, dtype=F64), _randn(rng, 3, 5, 6, dtype=F64), _randn(rng, 4, 6, dtype=F64)
    _check("general_score", learner.general_score(q, k, W), reference.general_score(q, k, W), "cpu",
           "scores (B, T)", lambda: _general_variants(q, k, W), "`general_score` differs from s^T W h_j.")
    g = _randn(rng, 3, 5, dtype=F64)
    res = learner.with_grad("general_score", q, k, W, cotangents=(g,))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, W)]
    expected = torch.autograd.grad(reference.general_score(*leaves), leaves, g)
    _expect_grads(res.arg_grads[:3], expected, ("the query", "the keys", "W"))


# --- Part 3: the additive score (3 points) ------------------------------------------------

def _additive_variants(q, k, W1, W2, v):
    q, k, W1, W2, v = _cpu64(q, k, W1, W2, v)
    pre = (q @ W1.T).unsqueeze(-2) + k @ W2.T  # (B, T, d_a)
    out = [
        ("tanh is missing: the score is v^T tanh(W1 s + W2 h_j).", pre @ v),
        ("v is applied inside tanh: the score is v^T tanh(W1 s + W2 h_j), tanh first, then v.",
         torch.tanh(pre @ v)),
        ("The sum replaces v: the score is the dot product of v with tanh(W1 s + W2 h_j), not its sum.",
         torch.tanh(pre).sum(-1)),
    ]
    if W1.shape[0] == W1.shape[1] == W2.shape[1]:
        out += [
            ("W1 and W2 are used transposed: W1 has shape (d_a, d_q), so W1 s is query @ W1.T (and "
             "W2 h_j is keys @ W2.T).", torch.tanh((q @ W1).unsqueeze(-2) + k @ W2) @ v),
            ("W1 is used transposed: W1 has shape (d_a, d_q), so W1 s is query @ W1.T.",
             torch.tanh((q @ W1).unsqueeze(-2) + k @ W2.T) @ v),
            ("W2 is used transposed: W2 has shape (d_a, d_k), so W2 h_j is keys @ W2.T.",
             torch.tanh((q @ W1.T).unsqueeze(-2) + k @ W2) @ v),
            ("W1 and W2 are swapped: W1 maps the query, W2 maps the keys.",
             torch.tanh((q @ W2.T).unsqueeze(-2) + k @ W1.T) @ v),
        ]
    return out


def _check_additive(learner, reference, B, T, dq, dk, da, rng, device, dtype):
    q = _randn(rng, B, dq, dtype=dtype).to(device)
    k = _randn(rng, B, T, dk, dtype=dtype).to(device)
    W1, W2 = _randn(rng, da, dq, dtype=dtype).to(device), _randn(rng, da, dk, dtype=dtype).to(device)
    v = _randn(rng, da, dtype=dtype).to(device)
    _check("additive_score", learner.additive_score(q, k, W1, W2, v), reference.additive_score(q, k, W1, W2, v),
           device, "scores (B, T)", lambda: _additive_variants(q, k, W1, W2, v),
           "`additive_score` differs from v^T tanh(W1 s + W2 h_j) for each key h_j.")


@points(1, part="additive_score")
def test_additive_score_matches_reference(learner, reference, rng, devices):
    """Does additive_score agree with the reference when d_q, d_k and d_a all differ, in float32 and float64?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, dq, dk, da in [(2, 4, 3, 5, 6), (1, 3, 6, 2, 4)]:
                _check_additive(learner, reference, B, T, dq, dk, da, rng, device, dtype)


@points(1, part="additive_score")
def test_additive_score_square_weights(learner, reference, rng):
    """With square weights, where a transposed or swapped matrix still runs, are W1 and W2 applied as asked?"""
    for B, T, d in [(2, 5, 4), (3, 2, 3)]:
        _check_additive(learner, reference, B, T, d, d, d, rng, "cpu", F64)


@points(1, part="additive_score")
def test_additive_score_gradients(learner, reference, rng):
    """Do the gradients with respect to the query, the keys, W1, W2 and v match the reference's?"""
    args = (_randn(rng, 2, 3, dtype=F64), _randn(rng, 2, 4, 5, dtype=F64), _randn(rng, 6, 3, dtype=F64),
            _randn(rng, 6, 5, dtype=F64), _randn(rng, 6, dtype=F64))
    _check("additive_score", learner.additive_score(*args), reference.additive_score(*args), "cpu",
           "scores (B, T)", lambda: _additive_variants(*args), "`additive_score` differs from "
           "v^T tanh(W1 s + W2 h_j).")
    g = _randn(rng, 2, 4, dtype=F64)
    res = learner.with_grad("additive_score", *args, cotangents=(g,))
    leaves = [t.clone().requires_grad_(True) for t in args]
    expected = torch.autograd.grad(reference.additive_score(*leaves), leaves, g)
    _expect_grads(res.arg_grads[:5], expected, ("the query", "the keys", "W1", "W2", "v"))


# --- Part 4: the context vector, with a mask (4 points) -----------------------------------

def _context_variants(scores, values, mask):
    s, v = _cpu64(scores, values)
    m = None if mask is None else mask.cpu()

    def ctx(w):
        return (w.unsqueeze(-1) * v).sum(-2), w

    ninf = float("-inf")
    out = []
    if m is not None:
        out += [
            ("The mask is inverted: True marks a real token, whose weight is kept; False marks padding, "
             "whose weight must be 0.", ctx(torch.softmax(s.masked_fill(m, ninf), -1))),
            ("The mask is ignored: padded positions (mask False) must get weight exactly 0.",
             ctx(torch.softmax(s, -1))),
            ("Padded scores are set to 0 instead of -inf, so padding still gets weight (exp(0) = 1): fill "
             "them with float('-inf') before the softmax.", ctx(torch.softmax(s.masked_fill(~m, 0.0), -1))),
            ("The weights of padded positions are zeroed after the softmax without renormalising, so the "
             "real tokens' weights no longer sum to 1: fill the scores with -inf before the softmax.",
             ctx(torch.softmax(s, -1) * m)),
        ]
        s = s.masked_fill(~m, ninf)
    out += [
        ("The softmax runs over the batch axis (dim=0): it must run over the source positions (dim=-1).",
         ctx(torch.softmax(s, 0).nan_to_num(0.0))),
        ("The weights are the raw scores: normalise them with a softmax over the source positions.",
         ctx(s.nan_to_num(0.0, neginf=0.0))),
    ]
    return out


def _check_context(learner, reference, scores, values, mask, device):
    kwargs = {} if mask is None else {"mask": mask}
    context, weights = _tuple(learner.attention_context(scores, values, **kwargs), "attention_context", 2,
                              "a pair (context, weights)")
    ref_c, ref_w = reference.attention_context(scores, values, **kwargs)
    _expect_order((context, weights), (ref_c, ref_w), "attention_context", "(context, weights)", device)
    B, T, dv = values.shape
    _expect_tensor(weights, "attention_context", (B, T), scores.dtype, device, "weights (B, T)")
    _expect_tensor(context, "attention_context", (B, dv), values.dtype, device, "context (B, d_v)")
    if not close(weights, ref_w, device):
        variants = [(h, w) for h, (_, w) in _context_variants(scores, values, mask)]
        expect(False, _diagnose(weights, ref_w, variants,
                                "The weights differ from the softmax of the scores over the source positions"
                                + ("" if mask is None else ", with padded positions left out") + "."))
    expect(close(context, ref_c, device),
           "The weights are right but the context is not their weighted sum of the values, "
           "sum_j weights[:, j] * values[:, j]: check the axis you sum over.")
    return context, weights


@points(1, part="attention_context")
def test_attention_context_matches_reference(learner, reference, rng, devices):
    """Without a mask, do the context and the weights agree with the reference for any shape and dtype?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, dv in [(3, 5, 2), (1, 4, 3), (2, 1, 4)]:
                scores = _randn(rng, B, T, dtype=dtype, scale=2).to(device)
                values = _randn(rng, B, T, dv, dtype=dtype).to(device)
                _check_context(learner, reference, scores, values, None, device)


@points(1, part="attention_context")
def test_attention_context_weights_sum_to_one(learner, reference, rng):
    """Are the weights non-negative, and do they sum to 1 over the real tokens of every row, with and without a mask?"""
    B, T = 4, 6
    scores, values = _randn(rng, B, T, scale=2), _randn(rng, B, T, 3)
    mask = _mask(rng, B, T)
    for m in (None, mask):
        _, w = _tuple(learner.attention_context(scores, values, **({} if m is None else {"mask": m})),
                      "attention_context", 2, "a pair (context, weights)")
        expect(_is_tensor(w) and tuple(w.shape) == (B, T),
               "`attention_context` returns weights of the wrong shape: expected (B, T).")
        expect(bool(torch.isfinite(w).all()), "Some weights are NaN or infinite: use torch.softmax (which is "
                                              "stable) and fill padded scores with -inf, not multiply them.")
        expect(bool((w >= 0).all()), "Some weights are negative: they must come from a softmax.")
        if m is None:
            expect(torch.allclose(w.sum(-1), torch.ones(B), atol=1e-5),
                   "The weights of a row do not sum to 1: the softmax must run over the source positions "
                   "(dim=-1).")
        elif not torch.allclose((w * m).sum(-1), torch.ones(B), atol=1e-5):
            variants = [(h, v) for h, (_, v) in _context_variants(scores, values, m)]
            expect(False, _diagnose(w, reference.attention_context(scores, values, m)[1], variants,
                                    "With a mask, the weights of each row's real tokens must sum to 1 and "
                                    "padded positions must get nothing: fill the padded scores with -inf "
                                    "before the softmax."))


@points(1, part="attention_context")
def test_attention_context_mask(learner, reference, rng, devices):
    """With a mask, do padded positions get weight exactly 0, and the context and weights agree with the reference?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, dv in [(3, 6, 2), (2, 4, 5)]:
                scores = _randn(rng, B, T, dtype=dtype, scale=2).to(device)
                values = _randn(rng, B, T, dv, dtype=dtype).to(device)
                mask = _mask(rng, B, T).to(device)
                _, w = _check_context(learner, reference, scores, values, mask, device)
                expect(bool((w[~mask] == 0).all()), "Padded positions must get a weight of exactly 0.")


@points(1, part="attention_context")
def test_attention_context_padding_does_not_leak(learner, rng):
    """With a mask, does changing the scores and values at padded positions leave the context unchanged?"""
    B, T = 3, 7
    scores, values = _randn(rng, B, T, scale=2), _randn(rng, B, T, 4)
    mask = _mask(rng, B, T)
    base_c, base_w = _tuple(learner.attention_context(scores, values, mask), "attention_context", 2,
                            "a pair (context, weights)")
    s2, v2 = scores.clone(), values.clone()
    s2[~mask] = _randn(rng, int((~mask).sum()), scale=10)
    v2[~mask] = _randn(rng, int((~mask).sum()), 4, scale=100)
    c2, w2 = _tuple(learner.attention_context(s2, v2, mask), "attention_context", 2, "a pair (context, weights)")
    expect(_is_tensor(c2) and _is_tensor(base_c) and close(c2, base_c) and close(w2, base_w),
           "Padding leaks into the context: changing the scores or values at padded positions changes "
           "the result. Padded positions must get weight exactly 0 (fill their scores with -inf before "
           "the softmax; True in the mask marks a real token).")


# --- Part 5: a decoder step with attention (5 points) -------------------------------------

def _dims(rng):
    """(V, E, H), small, with E != H and H longer than every source (T) used here, so that a
    tensor of one shape is never taken for the other."""
    return _randint(rng, 5, 9), _randint(rng, 2, 4), _randint(rng, 7, 8)


def _state_dict(reference, rng, dims):
    """Random weights (of the reference's layers, whose names the locked base class fixes)."""
    return {name: _randn(rng, *p.shape, scale=0.5) for name, p in reference.AttnDecoder(*dims).state_dict().items()}


def _inputs(rng, dims, B, T, dtype=F32):
    V, _, H = dims
    y = torch.randint(0, V, (B,), generator=rng)
    return y, _randn(rng, B, H, dtype=dtype), _randn(rng, B, T, H, dtype=dtype)


def _decoders(learner, reference, dims, sd, device="cpu", dtype=F32):
    """The learner's decoder (a handle) and the reference's, with the same weights."""
    ref = reference.AttnDecoder(*dims).to(device, dtype)
    ref.load_state_dict(sd)
    dec = learner.AttnDecoder(*dims)
    dec.to(device, dtype)
    dec.load_state_dict(sd)
    return dec, ref


def _decoder_step(reference, dims, sd, y, h, enc, mask, *, W="W", scale=False, use_mask=True,
                  rnn_order="emb_ctx", out_order="h_ctx", out_state="new"):
    """The reference step and its typical wrong variants, in float64 on the CPU."""
    m = reference.AttnDecoder(*dims).double()
    m.load_state_dict(sd)
    y, h, enc = _cpu64(y, h, enc)
    mask = None if mask is None or not use_mask else mask.cpu()
    Wa = {"W": m.W_a.weight, "WT": m.W_a.weight.T, "I": None}[W]
    with torch.no_grad():
        scores = _dot64(h, enc) if Wa is None else reference.general_score(h, enc, Wa)
        if scale:
            scores = scores / math.sqrt(h.shape[-1])
        c, w = reference.attention_context(scores, enc, mask)
        e = m.embedding(y)
        s = m.rnn(torch.cat([e, c] if rnn_order == "emb_ctx" else [c, e], -1), h)
        s_out = s if out_state == "new" else h
        logits = m.out(torch.cat([s_out, c] if out_order == "h_ctx" else [c, s_out], -1))
    return logits, s, w


def _weights_variants(reference, dims, sd, y, h, enc, mask):
    step = lambda **kw: _decoder_step(reference, dims, sd, y, h, enc, mask, **kw)[2]  # noqa: E731
    out = [
        ("The scores use W_a transposed: the score is s^T W_a h_j, e.g. general_score(hidden, enc_outputs, "
         "self.W_a.weight) or dot_score(hidden, self.W_a(enc_outputs)); self.W_a(hidden) computes W_a s, "
         "which gives h_j^T W_a s instead.", step(W="WT")),
        ("The scores ignore W_a: use the general score s^T W_a h_j, with W = self.W_a.weight.", step(W="I")),
        ("The scores are scaled: the decoder uses the general score, without dividing by sqrt(H).",
         step(scale=True)),
    ]
    if mask is not None:
        out.append(("The source mask is ignored: pass src_mask to attention_context.", step(use_mask=False)))
    return out


def _state_variants(reference, dims, sd, y, h, enc, mask):
    step = lambda **kw: _decoder_step(reference, dims, sd, y, h, enc, mask, **kw)  # noqa: E731
    return [
        ("The GRU cell's input is [context; embedding]: concatenate the embedding of y_prev first, then "
         "the context.", step(rnn_order="ctx_emb")[1]),
        ("The returned hidden state is the previous one: return the state the GRU cell computes.", h),
    ]


def _logits_variants(reference, dims, sd, y, h, enc, mask):
    step = lambda **kw: _decoder_step(reference, dims, sd, y, h, enc, mask, **kw)[0]  # noqa: E731
    return [
        ("The output layer gets [context; state]: concatenate the new state first, then the context.",
         step(out_order="ctx_h")),
        ("The output layer uses the previous state s_{t-1}: feed it the new state s_t from the GRU cell.",
         step(out_state="old")),
        ("The output layer uses the previous state, in the wrong order: feed it [s_t; c_t], the new state "
         "first.", step(out_state="old", out_order="ctx_h")),
    ]


def _check_decoder(learner, reference, dec, ref, dims, sd, y, h, enc, mask, device="cpu"):
    """Run one step of the learner's decoder and fail with a diagnosis unless it matches the reference."""
    args = (y, h, enc) if mask is None else (y, h, enc, mask)
    logits, new_h, w = _tuple(dec(*args), DECODER, 3, "a triple (logits, hidden, weights)")
    with torch.no_grad():
        r_logits, r_h, r_w = ref(*args)
    _expect_order((logits, new_h, w), (r_logits, r_h, r_w), DECODER, "(logits, hidden, weights)", device)
    B, T, H = enc.shape
    _expect_tensor(w, DECODER, (B, T), h.dtype, device, "weights (B, T)")
    _expect_tensor(new_h, DECODER, (B, H), h.dtype, device, "hidden (B, H)")
    _expect_tensor(logits, DECODER, (B, dims[0]), h.dtype, device, "logits (B, V)")
    if not close(w, r_w, device):
        # First: are the learner's own pieces to blame?
        Wa = ref.W_a.weight.detach()
        with torch.no_grad():
            ref_scores = reference.general_score(h, enc, Wa)
        mine = _quietly(learner.general_score, h, enc, Wa)
        expect(not (_is_tensor(mine) and not close(mine, ref_scores, device)),
               "The attention weights are wrong because your general_score is wrong (see part 2).")
        mine = _quietly(learner.attention_context, ref_scores, enc, mask)
        if isinstance(mine, (tuple, list)) and len(mine) == 2 and _is_tensor(mine[1]):
            expect(close(mine[1], r_w, device),
                   "The attention weights are wrong because your attention_context is wrong (see part 4).")
        expect(False, _diagnose(w, r_w, _weights_variants(reference, dims, sd, y, h, enc, mask),
                                "The attention weights differ from softmax_j(s_{t-1}^T W_a h_j): compute "
                                "them from the previous state, before the GRU cell."))
    if not close(new_h, r_h, device):
        expect(False, _diagnose(new_h, r_h, _state_variants(reference, dims, sd, y, h, enc, mask),
                                "The weights are right but the new state is not GRUCell([e(y_prev); c_t], "
                                "s_{t-1}) with self.embedding and self.rnn."))
    if not close(logits, r_logits, device):
        expect(False, _diagnose(logits, r_logits, _logits_variants(reference, dims, sd, y, h, enc, mask),
                                "The weights and the new state are right but the logits are not "
                                "self.out([s_t; c_t])."))
    return logits, new_h, w


@points(1, part="attn_decoder")
def test_attn_decoder_matches_reference(learner, reference, rng):
    """Without a mask, do the logits, new state and weights agree with the reference, given the same weights?"""
    dims = _dims(rng)
    sd = _state_dict(reference, rng, dims)
    dec, ref = _decoders(learner, reference, dims, sd)
    for B, T in [(3, 5), (2, 4)]:
        y, h, enc = _inputs(rng, dims, B, T)
        _check_decoder(learner, reference, dec, ref, dims, sd, y, h, enc, None)


@points(1, part="attn_decoder")
def test_attn_decoder_mask(learner, reference, rng):
    """With a source mask, do padded positions get weight exactly 0, and do the outputs agree with the reference?"""
    dims = _dims(rng)
    sd = _state_dict(reference, rng, dims)
    dec, ref = _decoders(learner, reference, dims, sd)
    B, T = 4, 6
    y, h, enc = _inputs(rng, dims, B, T)
    mask = _mask(rng, B, T)
    _, _, w = _check_decoder(learner, reference, dec, ref, dims, sd, y, h, enc, mask)
    expect(bool((w[~mask] == 0).all()), "Padded source positions must get a weight of exactly 0.")


@points(1, part="attn_decoder")
def test_attn_decoder_padding_does_not_leak(learner, reference, rng):
    """Does changing the encoder states at padded positions leave the logits, state and weights unchanged?"""
    dims = _dims(rng)
    dec, _ = _decoders(learner, reference, dims, _state_dict(reference, rng, dims))
    B, T = 3, 6
    y, h, enc = _inputs(rng, dims, B, T)
    mask = _mask(rng, B, T)
    base = _tuple(dec(y, h, enc, mask), DECODER, 3, "a triple (logits, hidden, weights)")
    changed = enc.clone()
    changed[~mask] = _randn(rng, int((~mask).sum()), dims[2], scale=100)
    again = _tuple(dec(y, h, changed, mask), DECODER, 3, "a triple (logits, hidden, weights)")
    expect(all(_is_tensor(a) and close(a, b) for a, b in zip(again, base)),
           "Padding leaks into the decoder: changing the encoder states at padded positions changes its "
           "outputs. Pass src_mask to attention_context, whose padded weights must be exactly 0.")


@points(1, part="attn_decoder")
def test_attn_decoder_gradients(learner, reference, rng):
    """With a mask, do the gradients for every layer's weights, the state and the encoder states match?"""
    dims = _dims(rng)
    sd = {k: v.double() for k, v in _state_dict(reference, rng, dims).items()}
    dec, ref = _decoders(learner, reference, dims, sd, dtype=F64)
    B, T = 3, 5
    y, h, enc = _inputs(rng, dims, B, T, dtype=F64)
    mask = _mask(rng, B, T)
    _check_decoder(learner, reference, dec, ref, dims, sd, y, h, enc, mask)
    cot = (_randn(rng, B, dims[0], dtype=F64), _randn(rng, B, dims[2], dtype=F64), _randn(rng, B, T, dtype=F64))
    res = learner.with_grad(dec, y, h, enc, mask, cotangents=cot, params=True)
    hr, er = h.clone().requires_grad_(True), enc.clone().requires_grad_(True)
    params = dict(ref.named_parameters())
    grads = torch.autograd.grad(ref(y, hr, er, mask), [hr, er, *params.values()], cot)
    expected = dict(zip(params, grads[2:]))
    for name, e in expected.items():
        g = res.param_grads.get(name) if isinstance(res.param_grads, dict) else None
        expect(g is not None, f"No gradient reaches {name}: is that layer used, and used without "
                              "detaching its output or copying its weight (use self.W_a.weight itself)?")
        expect(close(g, e), f"The outputs are right but the gradient with respect to {name} is not: is part "
                            "of the step computed outside autograd (.data, .detach(), NumPy) or in place?")
    _expect_grads(res.arg_grads[1:3], grads[:2], ("the previous state", "the encoder states"))


@points(1, part="attn_decoder")
def test_attn_decoder_dtypes_and_devices(learner, reference, rng, devices):
    """Does the decoder work in float32 and float64, also for a batch of one row and a source of one token?"""
    dims = _dims(rng)
    sd = _state_dict(reference, rng, dims)
    for device in devices:
        for dtype in DTYPES:
            dec, ref = _decoders(learner, reference, dims, sd, device, dtype)
            for B, T in [(1, 4), (2, 1)]:
                y, h, enc = (t.to(device) for t in _inputs(rng, dims, B, T, dtype))
                _check_decoder(learner, reference, dec, ref, dims, sd, y, h, enc, None, device)


# --- Part 6: local attention, the predicted position (2 points) ---------------------------

def _position_variants(reference, hidden, W_p, v_p, src_len):
    h, Wp, vp = _cpu64(hidden, W_p, v_p)
    S = src_len.cpu().double() if _is_tensor(src_len) else float(src_len)
    out = [
        ("p is S * sigmoid(...): we count positions from 0, so p_t = (S - 1) * sigmoid(...), in [0, S - 1].",
         reference.predict_position(h, Wp, vp, S + 1)),
        ("tanh is missing: p_t = (S - 1) * sigmoid(v_p^T tanh(W_p s_t)).",
         (S - 1) * torch.sigmoid((h @ Wp.T) @ vp)),
        ("The sigmoid is missing: p_t = (S - 1) * sigmoid(v_p^T tanh(W_p s_t)), which keeps p in [0, S - 1].",
         (S - 1) * (torch.tanh(h @ Wp.T) @ vp)),
    ]
    if Wp.shape[0] == Wp.shape[1]:
        out.append(("W_p is used transposed: W_p has shape (d_p, H), so W_p s_t is hidden @ W_p.T.",
                    reference.predict_position(h, Wp.T, vp, S)))
    if _is_tensor(src_len):
        out.append(("Every row uses the same length: with a (B,) tensor of lengths, row b uses its own length.",
                    reference.predict_position(h, Wp, vp, float(src_len.max()))))
    return out


@points(1, part="predict_position")
def test_predict_position_matches_reference(learner, reference, rng, devices):
    """Does predict_position agree with the reference for an int length and for a tensor of lengths?"""
    for device in devices:
        for dtype in DTYPES:
            for B, H, dp in [(3, 4, 4), (2, 5, 3)]:
                h = _randn(rng, B, H, dtype=dtype).to(device)
                W_p, v_p = _randn(rng, dp, H, dtype=dtype).to(device), _randn(rng, dp, dtype=dtype).to(device)
                lengths = torch.randint(1, 12, (B,), generator=rng).to(device)
                for src_len in (_randint(rng, 2, 12), lengths):
                    _check("predict_position", learner.predict_position(h, W_p, v_p, src_len),
                           reference.predict_position(h, W_p, v_p, src_len), device, "p (B,)",
                           lambda: _position_variants(reference, h, W_p, v_p, src_len),
                           "`predict_position` differs from (S - 1) * sigmoid(v_p^T tanh(W_p s_t)).")


@points(1, part="predict_position")
def test_predict_position_range_and_gradients(learner, reference, rng):
    """Does p stay within [0, S - 1] of its own row, and do the right gradients reach the state, W_p and v_p?"""
    B, H, dp = 6, 5, 4
    lengths = torch.tensor([1, 2, 7, 7, 10, 3])
    for scale in (1.0, 50.0):
        h = _randn(rng, B, H, scale=scale)
        p = learner.predict_position(h, _randn(rng, dp, H), _randn(rng, dp), lengths)
        _expect_tensor(p, "predict_position", (B,), F32, "cpu", "p (B,)")
        expect(bool(torch.isfinite(p).all() and (p >= 0).all() and (p <= (lengths - 1) * (1 + 1e-6)).all()),
               "Some p lie outside [0, S - 1] of their row: p_t = (S - 1) * sigmoid(...), with each row's "
               "own length S.")
        expect(bool((p[0] == 0).all()), "A row of length 1 has a single position, 0: p must be exactly 0 there.")
    args = (_randn(rng, 3, H, dtype=F64), _randn(rng, dp, H, dtype=F64), _randn(rng, dp, dtype=F64))
    lengths, g = torch.tensor([4, 9, 6]), _randn(rng, 3, dtype=F64)
    _check("predict_position", learner.predict_position(*args, lengths), reference.predict_position(*args, lengths),
           "cpu", "p (B,)", lambda: _position_variants(reference, *args, lengths),
           "`predict_position` differs from (S - 1) * sigmoid(v_p^T tanh(W_p s_t)).")
    res = learner.with_grad("predict_position", *args, lengths, cotangents=(g,))
    leaves = [t.clone().requires_grad_(True) for t in args]
    expected = torch.autograd.grad(reference.predict_position(*leaves, lengths), leaves, g)
    _expect_grads(res.arg_grads[:3], expected, ("the state", "W_p", "v_p"))


# --- Part 7: local attention weights (4 points) -------------------------------------------

def _local(scores, p, D, mask=None, *, sigma=None, gauss_at="p", window_at="round", softmax_over="window",
           gauss=True, renorm=False, extra=0):
    """Local-p weights and their typical wrong variants, in float64."""
    s, p = _cpu64(scores, p)
    T = s.shape[-1]
    pos = torch.arange(T, dtype=F64)
    centre = torch.round(p) if window_at == "round" else p
    window = (pos - centre.unsqueeze(-1)).abs() <= D + extra
    real = torch.ones_like(window) if mask is None else mask.cpu()
    window = window & real
    ninf = float("-inf")
    if softmax_over == "window":
        align = torch.softmax(s.masked_fill(~window, ninf), -1)
    elif softmax_over == "all":  # over every position, then cut to the window
        align = torch.softmax(s, -1) * window
    elif softmax_over == "all_real":  # over every real position, then cut to the window
        align = torch.softmax(s.masked_fill(~real, ninf), -1) * window
    else:  # "zero": outside scores set to 0, so they keep weight
        align = torch.softmax(s.masked_fill(~window, 0.0), -1)
    sigma = D / 2 if sigma is None else sigma
    c = p if gauss_at == "p" else torch.round(p)
    w = align * torch.exp(-(pos - c.unsqueeze(-1)) ** 2 / (2 * sigma ** 2)) if gauss else align
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    return w


def _local_variants(scores, p, D, mask):
    v = lambda **kw: _local(scores, p, D, kw.pop("mask", mask), **kw)  # noqa: E731
    out = [
        ("The Gaussian uses sigma = D: it must be sigma = D / 2.", v(sigma=float(D))),
        ("The Gaussian has the wrong width: with sigma = D / 2 the factor is exp(-(j - p)^2 / (2 sigma^2)).",
         v(sigma=D / 2 / math.sqrt(2))),
        ("The Gaussian has the wrong width: with sigma = D / 2 the factor is exp(-(j - p)^2 / (2 sigma^2)).",
         v(sigma=D / math.sqrt(2))),
        ("The Gaussian is centred on the rounded position: use the real-valued p there (the window uses "
         "round(p)).", v(gauss_at="round")),
        ("The window is centred on the real-valued p: it is the positions j with |j - round(p)| <= D "
         "(torch.round).", v(window_at="p")),
        ("The window is one position too wide on each side: it holds the 2D + 1 positions with "
         "|j - round(p)| <= D.", v(extra=1)),
        ("The window is one position too narrow on each side: |j - round(p)| <= D includes both ends, "
         "2D + 1 positions.", v(extra=-1)),
        ("The softmax runs over every position and is cut to the window afterwards: run it over the "
         "positions inside the window only (fill the others' scores with -inf).", v(softmax_over="all")),
        ("The softmax runs over every real position and is cut to the window afterwards: run it over the "
         "positions inside the window only (fill the others' scores with -inf).", v(softmax_over="all_real")),
        ("Positions outside the window get weight: fill their scores with -inf, not 0, before the softmax.",
         v(softmax_over="zero")),
        ("The Gaussian factor is missing: multiply the windowed softmax by exp(-(j - p)^2 / (2 sigma^2)).",
         v(gauss=False)),
        ("The weights are renormalised after the Gaussian factor: they must not be (they sum to at most 1).",
         v(renorm=True)),
    ]
    if mask is not None:
        out += [
            ("The mask is ignored: padded positions (mask False) are outside the window.", v(mask=None)),
            ("The mask is inverted: True marks a real token, False padding (outside the window).",
             _local(scores, p, D, ~mask.cpu())),
        ]
    return out


def _positions(rng, B, T, D, dtype=F32):
    """Real-valued centres: the first two rows near the ends (where windows are cut), the others
    where the whole window fits (so that a mistake at the ends only can be told apart)."""
    p = D + torch.rand(B, generator=rng, dtype=F64) * (T - 1 - 2 * D)
    p[0] = torch.rand((), generator=rng, dtype=F64) * 0.8
    p[1] = T - 1 - torch.rand((), generator=rng, dtype=F64) * 0.8
    return p.to(dtype)


def _local_mask(rng, p, T):
    """A mask whose every window holds a real token (the one at round(p))."""
    m = _mask(rng, p.shape[0], T)
    m[torch.arange(p.shape[0]), torch.round(p).long()] = True
    return m


def _check_local(learner, reference, scores, p, D, mask, device):
    kwargs = {} if mask is None else {"mask": mask}
    w = learner.local_attention_weights(scores, p, D, **kwargs)
    expected = reference.local_attention_weights(scores, p, D, **kwargs)
    _expect_tensor(w, LOCAL, expected.shape, expected.dtype, device, "weights (B, T)")
    if close(w, expected, device):
        return w
    hint = _diagnose(w, expected, _local_variants(scores, p, D, mask), None)
    if hint is None:
        # Right where the window lies inside the sequence, wrong where it reaches an end?
        T, r = scores.shape[-1], torch.round(p.cpu())
        inner = (r - D >= 0) & (r + D <= T - 1)
        wc, ec = w.cpu(), expected.cpu()
        if inner.any() and (~inner).any() and close(wc[inner], ec[inner], device):
            hint = EDGE_HINT
    expect(False, hint or "The weights differ from softmax over the window of the scores, times "
                          "exp(-(j - p)^2 / (2 sigma^2)) with sigma = D / 2.")


@points(1, part="local_attention_weights")
def test_local_attention_matches_reference(learner, reference, rng, devices):
    """Without a mask, do the weights agree with the reference for several D, with windows cut at both ends?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, D in [(4, 9, 2), (3, 7, 1), (3, 12, 3)]:
                scores = _randn(rng, B, T, dtype=dtype).to(device)
                p = _positions(rng, B, T, D, dtype).to(device)
                _check_local(learner, reference, scores, p, D, None, device)


def _window_problems(w, window, inside, mask):
    """What is wrong with local weights `w`, property by property (most telling first)."""
    if not bool(torch.isfinite(w).all()):
        return [f"`{LOCAL}` returns NaN or infinite weights: fill the scores outside the window with -inf "
                "and use torch.softmax."]
    out = []
    if not bool((w[~window] == 0).all()):
        out.append("Positions outside the window |j - round(p)| <= D must get a weight of exactly 0 (fill their "
                   "scores with -inf before the softmax).")
    if mask is not None and not bool((w[~mask] == 0).all()):
        out.append("Padded positions (mask False) must get a weight of exactly 0: they are outside the window.")
    if not bool((w[inside] > 0).all()):
        out.append("Some real positions inside the window get no weight: the window is |j - round(p)| <= D, "
                   "both ends included, 2D + 1 positions (fewer at the ends of the sequence).")
    if not bool((w.sum(-1) <= 1 + 1e-5).all()):
        out.append("The weights of a row sum to more than 1: a softmax over the window times a Gaussian factor "
                   "of at most 1 cannot.")
    return out


@points(1, part="local_attention_weights")
def test_local_attention_window(learner, reference, rng):
    """Are the weights 0 outside the window and at padding, positive inside it, and at most 1 in sum?"""
    B, T, D = 5, 11, 2
    scores, p = _randn(rng, B, T), _positions(rng, B, T, D)
    mask = _local_mask(rng, p, T)
    r = torch.round(p)
    window = (torch.arange(T) - r.unsqueeze(-1)).abs() <= D
    edge = (r - D < 0) | (r + D > T - 1)
    for m in (None, mask):
        w = learner.local_attention_weights(scores, p, D, **({} if m is None else {"mask": m}))
        _expect_tensor(w, LOCAL, (B, T), scores.dtype, "cpu", "weights (B, T)")
        inside = window if m is None else window & m
        problems = _window_problems(w, window, inside, m)
        if problems:
            bad = ((w != 0) & ~inside).any(-1) | ((w <= 0) & inside).any(-1)
            if m is None and bad.any() and not bad[~edge].any():
                expect(False, EDGE_HINT)
            expected = reference.local_attention_weights(scores, p, D, **({} if m is None else {"mask": m}))
            expect(False, _diagnose(w, expected, _local_variants(scores, p, D, m), problems[0]))


@points(1, part="local_attention_weights")
def test_local_attention_mask(learner, reference, rng, devices):
    """With a mask, do the weights agree with the reference, padded positions being outside the window?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, D in [(4, 8, 2), (3, 10, 3)]:
                scores = _randn(rng, B, T, dtype=dtype).to(device)
                p = _positions(rng, B, T, D, dtype)
                mask = _local_mask(rng, p, T).to(device)
                _check_local(learner, reference, scores, p.to(device), D, mask, device)


@points(1, part="local_attention_weights")
def test_local_attention_gradients(learner, reference, rng):
    """Do gradients reach the scores and the real-valued p, and match the reference's?"""
    B, T, D = 4, 9, 2
    scores, p = _randn(rng, B, T, dtype=F64), _positions(rng, B, T, D, F64)
    mask = _local_mask(rng, p, T)
    for m in (None, mask):
        _check_local(learner, reference, scores, p, D, m, "cpu")
    g = _randn(rng, B, T, dtype=F64)
    res = learner.with_grad(LOCAL, scores, p, D, mask=mask, cotangents=(g,))
    sr, pr = scores.clone().requires_grad_(True), p.clone().requires_grad_(True)
    expected = torch.autograd.grad(reference.local_attention_weights(sr, pr, D, mask=mask), (sr, pr), g)
    gp = res.arg_grads[1]
    expect(gp is not None and bool(gp.abs().sum() > 0),
           "No gradient reaches p: the Gaussian factor must use the real-valued p (a rounded p, a "
           "detached p, or a number taken out with .item(), has no gradient).")
    _expect_grads(res.arg_grads[:2], expected, ("the scores", "p"))
