"""Hidden tests for exercise 03_qkv: scaled dot-product attention and its masks.

Each test compares the learner's function (through the `learner` proxy) with the
reference on fresh random inputs, or checks a property that chapter 03 teaches. A failed
check explains itself by the likely mistake, found by comparing the learner's result
with the results of typical wrong variants.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.hidden.support import close, expect, points

SDPA = "scaled_dot_product_attention"


# --- helpers ---------------------------------------------------------------------------

def _pair(result, name):
    expect(isinstance(result, (tuple, list)) and len(result) == 2,
           f"`{name}` must return a pair (output, weights).")
    return result


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _qkv(rng, lead, lq, lk, dk, dv, dtype=torch.float32, scale=1.0):
    q = torch.randn(*lead, lq, dk, generator=rng, dtype=torch.float64) * scale
    k = torch.randn(*lead, lk, dk, generator=rng, dtype=torch.float64)
    v = torch.randn(*lead, lk, dv, generator=rng, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _random_mask(rng, shape, p_keep=0.7):
    """A boolean mask with at least one True in every row of the last axis."""
    m = torch.rand(*shape, generator=rng) < p_keep
    first = torch.zeros(shape, dtype=torch.bool)
    first[..., 0] = True
    return m | (first & ~m.any(-1, keepdim=True))


def _softmax_wrong_axis(scores):
    return torch.softmax(scores, dim=-2)


def _variants(reference, q, k, v, mask):
    """Weights that typical mistakes produce, as (hint, weights) pairs, in float64."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    m = None if mask is None else mask.cpu()
    d_k = q.shape[-1]
    out = [
        ("The scores are not divided by sqrt(d_k): the weights match softmax(Q K^T) without scaling.",
         reference.scaled_dot_product_attention(q * math.sqrt(d_k), k, v, m)[1]),
        ("The scores are divided by d_k instead of sqrt(d_k).",
         reference.scaled_dot_product_attention(q / math.sqrt(d_k), k, v, m)[1]),
    ]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if m is None:
        out.append(("The softmax runs over the wrong axis: for each query, the weights over the keys "
                    "(the last axis) must sum to 1.", _softmax_wrong_axis(scores)))
    else:
        out.append(("The mask is inverted: True means the query MAY attend to that key, "
                    "False means its weight must be 0.",
                    reference.scaled_dot_product_attention(q, k, v, ~m)[1]))
        out.append(("The mask is ignored: keys where the mask is False must get weight exactly 0.",
                    reference.scaled_dot_product_attention(q, k, v)[1]))
        out.append(("The softmax runs over the wrong axis: for each query, the weights over the keys "
                    "(the last axis) must sum to 1.",
                    _softmax_wrong_axis(scores.masked_fill(~m, float("-inf"))).nan_to_num(0.0)))
    return out


def _diagnose(reference, name, weights, q, k, v, mask=None, generic=None):
    """The hint for a learner whose weights differ from the reference's."""
    if weights is not None and (_is_tensor(weights) or isinstance(weights, np.ndarray)):
        w = torch.as_tensor(weights).detach().cpu().double()
        for hint, wrong in _variants(reference, torch.as_tensor(q), torch.as_tensor(k),
                                     torch.as_tensor(v), None if mask is None else torch.as_tensor(mask)):
            if tuple(w.shape) == tuple(wrong.shape) and torch.allclose(w, wrong, rtol=1e-3, atol=1e-5):
                return hint
        if tuple(w.shape) != tuple(q.shape[:-1]) + (k.shape[-2],):
            return (f"`{name}` returns weights of the wrong shape: they should be (..., Lq, Lk), "
                    "one row per query and one column per key.")
    return generic or (f"`{name}` differs from softmax(Q K^T / sqrt(d_k)) V: check the transpose of K, "
                       "the scaling, the softmax axis, and that the output is weights @ V.")


def _check_attention(learner, reference, name, q, k, v, mask=None, device="cpu", numpy=False):
    """Call the learner's attention and fail with a diagnosis unless it matches the reference."""
    if numpy:
        args = [t.numpy() for t in (q, k, v)]
        margs = {} if mask is None else {"mask": mask.numpy()}
        out, w = _pair(getattr(learner, name)(*args, **margs), name)
        expect(isinstance(out, np.ndarray) and isinstance(w, np.ndarray),
               f"`{name}` must return NumPy arrays, not {type(out).__name__}.")
        ref_out, ref_w = reference.attention_numpy(*args, **margs)
    else:
        qd, kd, vd = (t.to(device) for t in (q, k, v))
        margs = {} if mask is None else {"mask": mask.to(device)}
        out, w = _pair(getattr(learner, name)(qd, kd, vd, **margs), name)
        expect(_is_tensor(out) and _is_tensor(w), f"`{name}` must return torch tensors.")
        expect(out.device.type == qd.device.type and w.device.type == qd.device.type,
               f"`{name}` returns its result on another device than its inputs: create no tensor "
               "on a fixed device.")
        expect(out.dtype == q.dtype, f"`{name}` changes the dtype: {q.dtype} in, {out.dtype} out.")
        ref_out, ref_w = reference.scaled_dot_product_attention(qd, kd, vd, **margs)
    if not (close(w, ref_w, device) and close(out, ref_out, device)):
        if close(w, ref_w, device):
            expect(False, f"`{name}`: the weights are right but the output is not weights @ V.")
        expect(False, _diagnose(reference, name, w, q, k, v, mask))
    return out, w


# --- Part 1: softmax (3 points) ----------------------------------------------------------

@points(1, part="softmax")
def test_softmax_matches_reference(learner, reference, rng):
    """Does softmax agree with the reference on random inputs (last axis)?"""
    for shape in [(7,), (3, 5), (2, 3, 4)]:
        for dtype in (np.float64, np.float32):
            x = (torch.randn(*shape, generator=rng, dtype=torch.float64) * 3).numpy().astype(dtype)
            p = learner.softmax(x)
            expect(isinstance(p, np.ndarray), "`softmax` must return a NumPy array.")
            expect(p.shape == x.shape, "`softmax` must return an array of the same shape as its input.")
            if not close(p, reference.softmax(x)):
                if len(shape) > 1 and close(p, reference.softmax(x, axis=0)):
                    expect(False, "`softmax` normalises over the wrong axis: use the `axis` argument "
                                  "(default -1, the last axis).")
                expect(np.all(p >= 0) and np.allclose(np.sum(p, axis=-1), 1, atol=1e-4),
                       "`softmax` does not normalise: every slice along `axis` must be positive and sum to 1.")
                expect(False, "`softmax` differs from exp(x) / sum(exp(x)) along the axis.")


@points(1, part="softmax")
def test_softmax_axis(learner, reference, rng):
    """Does softmax honour the `axis` argument?"""
    x = torch.randn(3, 4, 5, generator=rng, dtype=torch.float64).numpy()
    for axis in (0, 1, -2):
        p = learner.softmax(x, axis=axis)
        expect(close(p, reference.softmax(x, axis=axis)),
               "`softmax(x, axis=...)` ignores or misuses `axis`: reduce (max and sum) along that "
               "axis with keepdims=True.")


@points(1, part="softmax")
def test_softmax_is_stable(learner, reference, rng):
    """Does softmax stay finite and correct for scores in the thousands?"""
    for dtype in (np.float64, np.float32):
        x = (torch.randn(4, 6, generator=rng, dtype=torch.float64) * 5 + 1000).numpy().astype(dtype)
        x[1] -= 3000
        p = learner.softmax(x)
        expect(isinstance(p, np.ndarray) and np.all(np.isfinite(p)),
               "`softmax` overflows on large scores (inf or NaN): subtract the maximum along the "
               "axis before calling exp.")
        expect(close(p, reference.softmax(x)), "`softmax` loses accuracy on large scores: subtract "
                                               "the maximum along the axis (keepdims=True) before exp.")


# --- Part 2: attention in NumPy (4 points) -----------------------------------------------

@points(2, part="attention_numpy")
def test_attention_numpy_matches_reference(learner, reference, rng):
    """Does attention_numpy agree with the reference for any batch layout, Lq != Lk, d_v != d_k?"""
    for lead, lq, lk, dk, dv in [((), 3, 3, 4, 4), ((2,), 3, 5, 4, 6), ((2, 3), 4, 7, 8, 5)]:
        q, k, v = _qkv(rng, lead, lq, lk, dk, dv, torch.float64)
        _check_attention(learner, reference, "attention_numpy", q, k, v, numpy=True)


@points(1, part="attention_numpy")
def test_attention_numpy_mask(learner, reference, rng):
    """With a mask, are the masked weights exactly 0 and the rest right?"""
    q, k, v = _qkv(rng, (2, 3), 4, 6, 8, 5, torch.float64)
    for shape in [(6,), (2, 1, 1, 6), (4, 6)]:
        mask = _random_mask(rng, shape)
        _, w = _check_attention(learner, reference, "attention_numpy", q, k, v, mask=mask, numpy=True)
        expect(np.all(w[~np.broadcast_to(mask.numpy(), w.shape)] == 0),
               "`attention_numpy`: weights where the mask is False must be exactly 0.")


@points(1, part="attention_numpy")
def test_attention_numpy_rows_sum_to_one(learner, rng):
    """Do the weights of every query sum to 1 over the keys?"""
    q, k, v = _qkv(rng, (3,), 5, 4, 6, 2, torch.float64)
    _, w = _pair(learner.attention_numpy(q.numpy(), k.numpy(), v.numpy()), "attention_numpy")
    expect(isinstance(w, np.ndarray) and w.shape == (3, 5, 4), "`attention_numpy` returns weights of the "
                                                                "wrong shape: expected (..., Lq, Lk).")
    expect(np.allclose(w.sum(-1), 1.0) and np.all(w >= 0),
           "`attention_numpy`: each query's weights over the keys (last axis) must be positive and sum to 1.")


# --- Part 3: attention in PyTorch (12 points) --------------------------------------------

@points(1, part=SDPA)
def test_sdpa_matches_reference_3d(learner, reference, rng):
    """Does scaled_dot_product_attention agree with the reference on (B, L, d) inputs?"""
    for lq, lk, dk, dv in [(4, 4, 8, 8), (3, 6, 4, 5)]:
        q, k, v = _qkv(rng, (2,), lq, lk, dk, dv)
        _check_attention(learner, reference, SDPA, q, k, v)


@points(2, part=SDPA)
def test_sdpa_heads_and_dtypes(learner, reference, rng, devices):
    """Does it handle (B, H, Lq, d_k) heads, Lq != Lk, d_v != d_k, float32 and float64, on every device?"""
    for device in devices:
        for dtype in (torch.float32, torch.float64):
            q, k, v = _qkv(rng, (2, 3), 5, 7, 8, 6, dtype)
            _check_attention(learner, reference, SDPA, q, k, v, device=device)


@points(1, part=SDPA)
def test_sdpa_matches_pytorch(learner, rng, devices):
    """Does it agree with torch.nn.functional.scaled_dot_product_attention, with and without a mask?"""
    for device in devices:
        q, k, v = (t.to(device) for t in _qkv(rng, (2, 2), 4, 6, 8, 3))
        mask = _random_mask(rng, (2, 1, 4, 6)).to(device)
        for m in (None, mask):
            out, _ = _pair(learner.scaled_dot_product_attention(q, k, v, **({} if m is None else {"mask": m})), SDPA)
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            expect(close(out, expected, device),
                   "The output differs from PyTorch's F.scaled_dot_product_attention"
                   + (" when a mask is given: True must mean 'may attend'." if m is not None else "."))


@points(1, part=SDPA)
def test_sdpa_rows_sum_to_one(learner, rng):
    """Without a mask, are the weights positive, and does every query's row sum to 1?"""
    q, k, v = _qkv(rng, (2, 2), 5, 3, 4, 4)
    _, w = _pair(learner.scaled_dot_product_attention(q, k, v), SDPA)
    expect(_is_tensor(w) and tuple(w.shape) == (2, 2, 5, 3),
           "The weights have the wrong shape: expected (..., Lq, Lk).")
    expect(bool((w >= 0).all()) and torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5),
           "Each query's weights over the keys (the last axis) must be positive and sum to 1: "
           "is the softmax over dim=-1?")


@points(1, part=SDPA)
def test_sdpa_masked_weights_are_zero(learner, reference, rng, devices):
    """Are weights exactly 0 where a padding, causal or combined mask is False?"""
    for device in devices:
        q, k, v = _qkv(rng, (2, 2), 5, 5, 4, 4)
        pad = reference.padding_mask(torch.tensor([[4, 2, 7, 0, 0], [5, 1, 3, 8, 0]]))  # (B, 1, 1, T)
        causal = reference.causal_mask(5)
        for mask in (pad, causal, pad & causal):
            _, w = _check_attention(learner, reference, SDPA, q, k, v, mask=mask, device=device)
            expect(bool((w.cpu()[~mask.expand_as(w)] == 0).all()),
                   "Weights where the mask is False must be exactly 0 (fill the scores with -inf or the "
                   "dtype's minimum before the softmax).")


@points(2, part=SDPA)
def test_sdpa_fully_masked_row(learner, rng):
    """Does a query with no allowed key get zero weights and a zero output, not NaN?"""
    for dtype in (torch.float32, torch.float64):
        q, k, v = _qkv(rng, (2,), 4, 5, 8, 3, dtype)
        mask = _random_mask(rng, (2, 4, 5))
        mask[0, 1] = False
        mask[1, 3] = False
        out, w = _pair(learner.scaled_dot_product_attention(q, k, v, mask=mask), SDPA)
        expect(_is_tensor(out) and not torch.isnan(out).any() and not torch.isnan(w).any(),
               "A query row whose keys are all masked gives NaN: softmax of a row of -inf is 0/0. "
               "Make such rows' weights (and so their output) exactly 0.")
        expect(bool((w[0, 1] == 0).all() and (w[1, 3] == 0).all()),
               "A query row whose keys are all masked must get weights of exactly 0, not a uniform row.")
        expect(bool((out[0, 1] == 0).all() and (out[1, 3] == 0).all()),
               "A query row whose keys are all masked must give an output of exactly 0.")
        expect(torch.allclose(w[0, 0].sum(), torch.ones((), dtype=dtype)),
               "Rows that still have allowed keys must keep summing to 1.")


@points(1, part=SDPA)
def test_sdpa_large_scores_stay_finite(learner, reference, rng):
    """Do scores around +-1e4 still give finite, correct results?"""
    for dtype in (torch.float32, torch.float64):
        q, k, v = _qkv(rng, (2,), 4, 6, 16, 4, dtype, scale=1e4)
        out, w = _pair(learner.scaled_dot_product_attention(q, k, v, mask=reference.causal_mask(6)[:4]), SDPA)
        expect(_is_tensor(out) and bool(torch.isfinite(out).all() and torch.isfinite(w).all()),
               "Very large scores give inf or NaN: use torch.softmax (which is stable) or subtract the "
               "row maximum, and fill masked scores with -inf or the dtype's minimum, not with a product.")
        ref_out, _ = reference.scaled_dot_product_attention(q, k, v, mask=reference.causal_mask(6)[:4])
        expect(close(out, ref_out, atol=1e-3, rtol=1e-3), "Very large scores give wrong results.")


@points(1, part=SDPA)
def test_sdpa_causal_does_not_look_ahead(learner, reference, rng):
    """Under a causal mask, does the output at position t ignore every input after t?"""
    T = 6
    q, k, v = _qkv(rng, (2,), T, T, 4, 4)
    mask = reference.causal_mask(T)
    base, _ = _pair(learner.scaled_dot_product_attention(q, k, v, mask=mask), SDPA)
    for t in range(T - 1):
        k2, v2 = k.clone(), v.clone()
        k2[:, t + 1:] += torch.randn(k2[:, t + 1:].shape, generator=rng)
        v2[:, t + 1:] += torch.randn(v2[:, t + 1:].shape, generator=rng)
        out, _ = _pair(learner.scaled_dot_product_attention(q, k2, v2, mask=mask), SDPA)
        expect(torch.allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6),
               "Under a causal mask, changing later keys or values changes earlier outputs: "
               "the future leaks (is the mask applied, and True on and below the diagonal?).")


@points(1, part=SDPA)
def test_sdpa_gradients_match(learner, reference, rng):
    """Do the gradients with respect to q, k and v match the reference?"""
    q, k, v = _qkv(rng, (2, 2), 3, 5, 4, 6, torch.float64)
    mask = _random_mask(rng, (2, 1, 3, 5))
    g_out = torch.randn(2, 2, 3, 6, generator=rng, dtype=torch.float64)
    res = learner.with_grad(SDPA, q, k, v, mask=mask, cotangents=(g_out, None))
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, _ = reference.scaled_dot_product_attention(qr, kr, vr, mask=mask)
    expected = torch.autograd.grad(out, (qr, kr, vr), g_out)
    got = res.arg_grads[:3]
    expect(all(g is not None for g in got), "No gradient reaches q, k or v: is something detached, "
                                            "or computed outside PyTorch (NumPy, .item())?")
    for name, g, e in zip("qkv", got, expected):
        expect(close(g, e), f"The gradient with respect to {name} differs from the reference's; "
                            "the forward pass is probably wrong too.")


@points(1, part=SDPA)
def test_sdpa_dropout(learner, reference, rng):
    """Is dropout applied to the weights only when dropout_p > 0, and scaled by 1/(1-p)?"""
    q, k, v = _qkv(rng, (2,), 32, 48, 8, 4, torch.float64)
    a, _ = _pair(learner.scaled_dot_product_attention(q, k, v, dropout_p=0.0), SDPA)
    b, _ = _pair(learner.scaled_dot_product_attention(q, k, v, dropout_p=0.0), SDPA)
    expect(torch.equal(a, b), "With dropout_p=0 the result must be deterministic: apply dropout only "
                              "when dropout_p > 0.")
    p = 0.5
    out, w = _pair(learner.scaled_dot_product_attention(q, k, v, dropout_p=p), SDPA)
    _, ref_w = reference.scaled_dot_product_attention(q, k, v)
    dropped = w == 0
    frac = dropped.double().mean().item()
    expect(0.35 < frac < 0.65, "With dropout_p=0.5 about half the weights should be zeroed: is dropout "
                               "applied to the weights (F.dropout(weights, p=dropout_p))?")
    expect(torch.allclose(w[~dropped], ref_w[~dropped] / (1 - p)),
           "The weights that survive dropout must be the softmax weights scaled by 1/(1-p) "
           "(F.dropout does this); return the weights after dropout.")
    expect(torch.allclose(out, w @ v), "With dropout, the output must be the dropped-out weights @ V.")


# --- Part 4: masks (4 points) ----------------------------------------------------------

@points(1, part="padding_mask")
def test_padding_mask_marks_real_tokens(learner, reference, rng):
    """Is the padding mask boolean, (B, 1, 1, T), True exactly at real tokens?"""
    tokens = torch.randint(1, 9, (3, 7), generator=rng)
    tokens[0, 5:] = 0
    tokens[2, 2:] = 0
    m = learner.padding_mask(tokens)
    expect(_is_tensor(m) and m.dtype == torch.bool, "`padding_mask` must return a boolean tensor.")
    expect(tuple(m.shape) == (3, 1, 1, 7), "`padding_mask` must have shape (B, 1, 1, T), so that it "
                                           "broadcasts over heads and query positions.")
    if not torch.equal(m, reference.padding_mask(tokens)):
        expect(not torch.equal(m, ~reference.padding_mask(tokens)),
               "`padding_mask` is inverted: True must mark real tokens (may attend), False padding.")
        expect(False, "`padding_mask` marks the wrong positions: compare tokens with pad_id.")


@points(1, part="padding_mask")
def test_padding_mask_pad_id_and_device(learner, reference, rng, devices):
    """Does padding_mask honour pad_id and keep the tokens' device?"""
    for device in devices:
        tokens = torch.randint(0, 9, (2, 6), generator=rng)
        tokens[:, 4:] = 3
        m = learner.padding_mask(tokens.to(device), pad_id=3)
        expect(_is_tensor(m) and m.device.type == torch.device(device).type,
               "`padding_mask` must return its mask on the tokens' device.")
        expect(torch.equal(m.cpu(), reference.padding_mask(tokens, pad_id=3)),
               "`padding_mask(tokens, pad_id)` ignores `pad_id`: compare with it, not with 0.")


@points(1, part="causal_mask")
def test_causal_mask_values(learner, reference):
    """Is the causal mask boolean (T, T), True on and below the diagonal?"""
    for size in (1, 4, 7):
        m = learner.causal_mask(size)
        expect(_is_tensor(m) and m.dtype == torch.bool, "`causal_mask` must return a boolean tensor.")
        expect(tuple(m.shape) == (size, size), "`causal_mask(size)` must have shape (size, size).")
        ref = reference.causal_mask(size)
        if not torch.equal(m, ref):
            expect(not torch.equal(m, ~ref), "`causal_mask` is inverted: True must mean 'may attend', "
                                             "i.e. on and below the diagonal (the past and the present).")
            expect(not torch.equal(m, ref.triu()), "`causal_mask` allows the future: True must be on and "
                                                   "below the diagonal, use tril, not triu.")
            expect(not torch.equal(m, ref.tril(-1)), "`causal_mask` forbids the diagonal: a position must "
                                                     "be allowed to attend to itself.")
            expect(False, "`causal_mask` marks the wrong positions.")


@points(1, part="causal_mask")
def test_causal_mask_device(learner, reference, devices):
    """Does causal_mask build its mask on the requested device?"""
    for device in devices + [None]:
        kwargs = {} if device is None else {"device": torch.device(device)}
        m = learner.causal_mask(5, **kwargs)
        want = torch.device(device or "cpu").type
        expect(_is_tensor(m) and m.device.type == want,
               "`causal_mask(size, device=...)` must create the mask on `device`.")
        expect(torch.equal(m.cpu(), reference.causal_mask(5)), "`causal_mask` marks the wrong positions.")
