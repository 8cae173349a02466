"""Hidden tests for exercise 03_qkv: softmax, attention in NumPy and PyTorch, and the masks.

The checks compare the learner's functions with the reference on fresh random inputs; a
property check (rows sum to one, masked weights are zero, no look-ahead) also requires
the reference's result on the same inputs, so that a constant attention earns nothing.
A wrong result is explained by the first typical mistake it matches (`_mistakes`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.hidden.support import (HALF, Hint, array, close, diagnose, expect, expect_device_agnostic, expect_grads,
                                       learner_grads, pair, points, random_mask, reference_grads, tensor)
from autograder.isolation.errors import LearnerError, NotImplementedRemote

SDPA = "scaled_dot_product_attention"
META = torch.device("meta")

# --- typical mistakes of attention: hints, and the weights each one gives ----------------

GENERIC = ("`{}` differs from softmax(Q K^T / sqrt(d_k)) V: check the transpose of K, the scaling, "
           "the softmax axis, and that the output is weights @ V.")
NO_SCALE = "The scores are not divided by sqrt(d_k): the weights match softmax(Q K^T) without scaling."
BY_D_K = "The scores are divided by d_k instead of sqrt(d_k)."
UNIFORM = ("The weights do not depend on the queries and keys: every allowed key gets the same weight. "
           "The scores must be Q K^T / sqrt(d_k).")
INVERTED = ("The mask is inverted: True means the query MAY attend to that key, "
            "False means its weight must be 0.")
IGNORED = "The mask is ignored: keys where the mask is False must get weight exactly 0."
WRONG_AXIS = ("The softmax runs over the wrong axis: for each query, the weights over the keys "
              "(the last axis) must sum to 1.")
OUTPUT_NOT_WV = "`{}`: the weights are right but the output is not weights @ V."
HALF_FILL = ("In float16 `scaled_dot_product_attention` fails: a fixed fill value such as -1e9 does not fit "
             "the dtype (float16 stops near -65504). Fill the masked scores with torch.finfo(scores.dtype).min.")
CAUSAL_DEVICE = "`causal_mask(size, device=...)` must create the mask on `device`."


def _mistakes(reference, q, k, v, mask):
    """The weights typical mistakes give on these inputs, as (hint, thunk) pairs for `diagnose`
    (computed in float64 on the CPU, from the reference)."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    m = None if mask is None else mask.cpu()
    sdpa = reference.scaled_dot_product_attention
    d_k = q.shape[-1]

    def wrong_axis():
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
        if m is not None:
            scores = scores.masked_fill(~m, float("-inf"))
        return torch.softmax(scores, dim=-2).nan_to_num(0.0)

    table = [(NO_SCALE, lambda: sdpa(q * math.sqrt(d_k), k, v, m)[1]),
             (BY_D_K, lambda: sdpa(q / math.sqrt(d_k), k, v, m)[1]),
             (UNIFORM, lambda: sdpa(q * 0.0, k, v, m)[1])]
    if m is not None:
        table += [(INVERTED, lambda: sdpa(q, k, v, ~m)[1]), (IGNORED, lambda: sdpa(q, k, v)[1])]
    return table + [(WRONG_AXIS, wrong_axis)]


# --- helpers ---------------------------------------------------------------------------

def _qkv(rng, lead, lq, lk, dk, dv, dtype=torch.float32, scale=1.0):
    q = torch.randn(*lead, lq, dk, generator=rng, dtype=torch.float64) * scale
    k = torch.randn(*lead, lk, dk, generator=rng, dtype=torch.float64)
    v = torch.randn(*lead, lk, dv, generator=rng, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _float_array(x, name, shape, what="its result"):
    """`x` as a floating-point NumPy array of `shape`, or a hint (`array` plus the dtype kind)."""
    array(x, name, shape=shape, what=what)
    expect(x.dtype.kind == "f", f"`{name}` must return {what} as floating-point numbers, not {x.dtype}.")
    return x


def _call(learner, name, q, k, v, mask=None, *, device="cpu", numpy=False):
    """The learner's (output, weights) for these inputs: tensors on `device`, or NumPy arrays."""
    args = [t.numpy() if numpy else t.to(device) for t in (q, k, v)]
    kwargs = {} if mask is None else {"mask": mask.numpy() if numpy else mask.to(device)}
    return pair(getattr(learner, name)(*args, **kwargs), name)


def _expected(reference, q, k, v, mask=None, *, numpy=False, upcast=False):
    """The reference's (output, weights) on the CPU, in q's dtype (computed in float64 if `upcast`)."""
    if numpy:
        return reference.attention_numpy(q.numpy(), k.numpy(), v.numpy(),
                                         **({} if mask is None else {"mask": mask.numpy()}))
    args = [t.double() if upcast else t for t in (q, k, v)]
    return tuple(t.to(q.dtype) for t in reference.scaled_dot_product_attention(*args, mask=mask))


def _validated(name, got, expected, dtype, device="cpu", numpy=False):
    """The learner's (output, weights) with the reference's shapes, as arrays or as tensors of
    `dtype` on `device`; otherwise a hint."""
    for x, e, what in zip(got, expected, ("the output", "the weights")):
        if numpy:
            _float_array(x, name, e.shape, what)
        else:
            tensor(x, name, shape=e.shape, dtype=dtype, device=device, what=what)
    return got


def _judge(name, got, expected, mistakes, device="cpu", rtol=None, atol=None):
    """Fail with the matching mistake's hint unless the validated (output, weights) are close to the
    reference's (half precision results are matched against the mistakes at their own tolerances)."""
    (out, w), (ref_out, ref_w) = got, expected
    if not close(w, ref_w, device, rtol=rtol, atol=atol):
        half = isinstance(w, torch.Tensor) and w.dtype in HALF
        raise Hint(diagnose(w, mistakes, GENERIC.format(name),
                            same=(lambda a, b: close(a, b.to(a.dtype))) if half else None))
    expect(close(out, ref_out, device, rtol=rtol, atol=atol), OUTPUT_NOT_WV.format(name))


def _attention(learner, reference, name, q, k, v, mask=None, *, device="cpu", numpy=False):
    """The learner's validated (output, weights); fails with the likely mistake unless they match the
    reference's on the same inputs."""
    expected = _expected(reference, q, k, v, mask, numpy=numpy)
    got = _validated(name, _call(learner, name, q, k, v, mask, device=device, numpy=numpy), expected,
                     q.dtype, device, numpy)
    _judge(name, got, expected, _mistakes(reference, q, k, v, mask), device)
    return got


# --- Part 1: softmax (3 points) ----------------------------------------------------------

@points(1, part="softmax")
def test_softmax_matches_reference(learner, reference, rng):
    """Does softmax agree with the reference on random inputs (last axis)?"""
    for shape in [(7,), (3, 5), (2, 3, 4)]:
        for dtype in (np.float64, np.float32):
            x = (torch.randn(*shape, generator=rng, dtype=torch.float64) * 3).numpy().astype(dtype)
            p = _float_array(learner.softmax(x), "softmax", x.shape)
            if not close(p, reference.softmax(x)):
                expect(len(shape) == 1 or not close(p, reference.softmax(x, axis=0)),
                       "`softmax` normalises over the wrong axis: use the `axis` argument (default -1, the last axis).")
                expect(np.all(p >= 0) and np.allclose(np.sum(p, axis=-1), 1, atol=1e-4),
                       "`softmax` does not normalise: every slice along `axis` must be positive and sum to 1.")
                raise Hint("`softmax` differs from exp(x) / sum(exp(x)) along the axis.")


@points(1, part="softmax")
def test_softmax_axis(learner, reference, rng):
    """Does softmax honour the `axis` argument?"""
    x = torch.randn(3, 4, 5, generator=rng, dtype=torch.float64).numpy()
    for axis in (0, 1, -2):
        p = _float_array(learner.softmax(x, axis=axis), "softmax", x.shape)
        expect(close(p, reference.softmax(x, axis=axis)),
               "`softmax(x, axis=...)` ignores or misuses `axis`: reduce (max and sum) along that "
               "axis with keepdims=True.")


@points(1, part="softmax")
def test_softmax_is_stable(learner, reference, rng):
    """Does softmax stay finite and correct for scores in the thousands?"""
    for dtype in (np.float64, np.float32):
        x = (torch.randn(4, 6, generator=rng, dtype=torch.float64) * 5 + 1000).numpy().astype(dtype)
        x[1] -= 3000
        p = _float_array(learner.softmax(x), "softmax", x.shape)
        expect(np.all(np.isfinite(p)), "`softmax` overflows on large scores (inf or NaN): subtract the maximum "
                                       "along the axis before calling exp.")
        expect(close(p, reference.softmax(x)), "`softmax` loses accuracy on large scores: subtract "
                                               "the maximum along the axis (keepdims=True) before exp.")


# --- Part 2: attention in NumPy (4 points) -----------------------------------------------

@points(2, part="attention_numpy")
def test_attention_numpy_matches_reference(learner, reference, rng):
    """Does attention_numpy agree with the reference for any batch layout, Lq != Lk, d_v != d_k?"""
    for lead, lq, lk, dk, dv in [((), 3, 3, 4, 4), ((2,), 3, 5, 4, 6), ((2, 3), 4, 7, 8, 5)]:
        q, k, v = _qkv(rng, lead, lq, lk, dk, dv, torch.float64)
        _attention(learner, reference, "attention_numpy", q, k, v, numpy=True)


def _two_sided_mask(rng, shape):
    """`random_mask` with at least one False in every row as well as one True: inverted (~mask), it still leaves
    every query a key. An inverted mask then gives the weights of attention under ~mask in every row, and its hint,
    under every seed: a row that ~mask leaves empty would give NaN (softmax of a row of -inf) or, with a finite
    fill, the unmasked weights, and the generic hint."""
    m = random_mask(rng, shape)
    drop = torch.randint(0, shape[-1], (*shape[:-1], 1), generator=rng)  # a key to mask in the rows with none
    off = torch.zeros(shape, dtype=torch.bool).scatter(-1, drop, True)
    return m & ~(off & m.all(-1, keepdim=True))


@points(1, part="attention_numpy")
def test_attention_numpy_mask(learner, reference, rng):
    """With a mask, are the masked weights exactly 0 and the rest right?"""
    q, k, v = _qkv(rng, (2, 3), 4, 6, 8, 5, torch.float64)
    for shape in [(6,), (2, 1, 1, 6), (4, 6)]:
        mask = _two_sided_mask(rng, shape)
        _, w = _attention(learner, reference, "attention_numpy", q, k, v, mask, numpy=True)
        expect(np.all(w[~np.broadcast_to(mask.numpy(), w.shape)] == 0),
               "`attention_numpy`: weights where the mask is False must be exactly 0.")


NUMPY_OVERFLOW = ("`attention_numpy` overflows on large scores (inf or NaN): compute the weights with your stable "
                  "softmax, which subtracts each row's maximum before exp.")


@points(1, part="attention_numpy")
def test_attention_numpy_rows_sum_to_one(learner, reference, rng):
    """Do the weights of every query sum to 1 over the keys, for scores near 1000 too (and are they right)?"""
    q, k, v = _qkv(rng, (3,), 5, 4, 6, 2, torch.float64)
    expected = _expected(reference, q, k, v, numpy=True)
    got = _validated("attention_numpy", _call(learner, "attention_numpy", q, k, v, numpy=True), expected,
                     q.dtype, numpy=True)
    expect(np.allclose(got[1].sum(-1), 1.0) and np.all(got[1] >= 0),
           "`attention_numpy`: each query's weights over the keys (last axis) must be positive and sum to 1.")
    _judge("attention_numpy", got, expected, _mistakes(reference, q, k, v, None))
    # Every score about 1000 (exp overflows past 709 in float64), a few units apart: weights far from one-hot.
    q, k, v = _qkv(rng, (2,), 4, 6, 16, 3, torch.float64)
    q[..., 0] = k[..., 0] = math.sqrt(4000.0)
    expected = _expected(reference, q, k, v, numpy=True)
    got = _validated("attention_numpy", _call(learner, "attention_numpy", q, k, v, numpy=True), expected,
                     q.dtype, numpy=True)
    expect(np.all(np.isfinite(got[0])) and np.all(np.isfinite(got[1])), NUMPY_OVERFLOW)
    _judge("attention_numpy", got, expected, _mistakes(reference, q, k, v, None))


# --- Part 3: attention in PyTorch (15 points) --------------------------------------------

@points(1, part=SDPA)
def test_sdpa_matches_reference_3d(learner, reference, rng):
    """Does scaled_dot_product_attention agree with the reference on (B, L, d) inputs?"""
    for lq, lk, dk, dv in [(4, 4, 8, 8), (3, 6, 4, 5)]:
        _attention(learner, reference, SDPA, *_qkv(rng, (2,), lq, lk, dk, dv))


@points(2, part=SDPA)
def test_sdpa_heads_and_dtypes(learner, reference, rng, devices):
    """Does it handle (B, H, Lq, d_k) heads, Lq != Lk, d_v != d_k, float32 and float64, on every device?"""
    for device in devices:
        for dtype in (torch.float32, torch.float64):
            _attention(learner, reference, SDPA, *_qkv(rng, (2, 3), 5, 7, 8, 6, dtype), device=device)


@points(1, part=SDPA)
def test_sdpa_half_precision(learner, reference, rng):
    """Does it work in float16 and bfloat16 too, with and without a mask?"""
    for dtype in HALF:
        q, k, v = _qkv(rng, (2, 2), 5, 7, 8, 6, dtype)
        for mask in (None, random_mask(rng, (2, 1, 5, 7), fully_masked=1)):
            expected = _expected(reference, q, k, v, mask, upcast=True)
            try:
                got = _call(learner, SDPA, q, k, v, mask)
            except LearnerError as exc:
                expect("without overflow" not in exc.message, HALF_FILL)
                raise
            _judge(SDPA, _validated(SDPA, got, expected, dtype), expected, _mistakes(reference, q, k, v, mask))


@points(1, part=SDPA)
def test_sdpa_matches_pytorch(learner, reference, rng, devices):
    """Does it agree with torch.nn.functional.scaled_dot_product_attention, with and without a mask?"""
    for device in devices:
        q, k, v = (t.to(device) for t in _qkv(rng, (2, 2), 4, 6, 8, 3))
        mask = random_mask(rng, (2, 1, 4, 6)).to(device)
        for m in (None, mask):
            out, w = pair(learner.scaled_dot_product_attention(q, k, v, **({} if m is None else {"mask": m})), SDPA)
            tensor(out, SDPA, shape=(2, 2, 4, 3), dtype=q.dtype, device=device, what="the output")
            tensor(w, SDPA, shape=(2, 2, 4, 6), dtype=q.dtype, device=device, what="the weights")
            if not close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=m), device):
                generic = "The output differs from PyTorch's F.scaled_dot_product_attention" + (
                    "." if m is None else " when a mask is given: True must mean 'may attend'.")
                raise Hint(diagnose(w, _mistakes(reference, q, k, v, m), generic))


@points(1, part=SDPA)
def test_sdpa_rows_sum_to_one(learner, reference, rng):
    """Without a mask, are the weights positive, does every query's row sum to 1, and are they right?"""
    q, k, v = _qkv(rng, (2, 2), 5, 3, 4, 4)
    expected = _expected(reference, q, k, v)
    out, w = _validated(SDPA, _call(learner, SDPA, q, k, v), expected, q.dtype)
    expect(bool((w >= 0).all()) and close(w.sum(-1), torch.ones(2, 2, 5)),
           "Each query's weights over the keys (the last axis) must be positive and sum to 1: "
           "is the softmax over dim=-1?")
    _judge(SDPA, (out, w), expected, _mistakes(reference, q, k, v, None))


@points(1, part=SDPA)
def test_sdpa_masked_weights_are_zero(learner, reference, rng, devices):
    """Are weights exactly 0 where a padding, causal or combined mask is False?"""
    for device in devices:
        q, k, v = _qkv(rng, (2, 2), 5, 5, 4, 4)
        pad = reference.padding_mask(torch.tensor([[4, 2, 7, 0, 0], [5, 1, 3, 8, 0]]))  # (B, 1, 1, T)
        causal = reference.causal_mask(5)
        for mask in (pad, causal, pad & causal):
            _, w = _attention(learner, reference, SDPA, q, k, v, mask, device=device)
            expect(bool((w.cpu()[~mask.expand_as(w)] == 0).all()),
                   "Weights where the mask is False must be exactly 0 (fill the scores with -inf or the "
                   "dtype's minimum before the softmax).")


@points(2, part=SDPA)
def test_sdpa_fully_masked_row(learner, reference, rng):
    """Does a query with no allowed key get zero weights and a zero output, not NaN?"""
    for dtype in (torch.float32, torch.float64):
        q, k, v = _qkv(rng, (2,), 4, 5, 8, 3, dtype)
        mask = random_mask(rng, (2, 4, 5), fully_masked=2)
        dead = ~mask.any(-1)
        expected = _expected(reference, q, k, v, mask)
        out, w = _validated(SDPA, _call(learner, SDPA, q, k, v, mask), expected, dtype)
        expect(not torch.isnan(out).any() and not torch.isnan(w).any(),
               "A query row whose keys are all masked gives NaN: softmax of a row of -inf is 0/0. "
               "Make such rows' weights (and so their output) exactly 0.")
        expect(bool((w[dead] == 0).all()),
               "A query row whose keys are all masked must get weights of exactly 0, not a uniform row.")
        expect(bool((out[dead] == 0).all()), "A query row whose keys are all masked must give an output of exactly 0.")
        _judge(SDPA, (out, w), expected, _mistakes(reference, q, k, v, mask))


def _expect_sdpa_grads(learner, reference, q, k, v, mask, g_out, hint):
    """The learner's gradients with respect to q, k and v (for the output's cotangent `g_out`) must be
    finite where the reference's are, and close to them; otherwise `hint`."""
    res = learner_grads(learner, SDPA, q, k, v, mask=mask, cotangents=(g_out, None), what=SDPA)
    expect(len(res.arg_grads) == 3, f"`{SDPA}`'s gradients could not be read back.")
    expected = reference_grads(reference.scaled_dot_product_attention, [q, k, v], (g_out, None), mask=mask)
    expect_grads(res.arg_grads[:3], expected, ("q", "k", "v"), hint=hint)


@points(1, part=SDPA)
def test_sdpa_fully_masked_row_gradients(learner, reference, rng):
    """Does a query with no allowed key get zero gradients, never NaN, with respect to q, k and v?"""
    q, k, v = _qkv(rng, (2, 2), 4, 5, 8, 3, torch.float64)
    mask = random_mask(rng, (2, 2, 4, 5), fully_masked=3)
    _attention(learner, reference, SDPA, q, k, v, mask)
    _expect_sdpa_grads(learner, reference, q, k, v, mask, torch.randn(2, 2, 4, 3, generator=rng, dtype=q.dtype),
                       "A query row whose keys are all masked must get zero gradients: make its weights a "
                       "constant 0 (masked_fill, torch.where), not a softmax result repaired afterwards.")


def _large_scores(rng, dtype):
    """Inputs whose scores spread over +-1e4 (near one-hot weights), then inputs whose scores are all
    about 1000 and differ by a few units (exp overflows, and the weights are far from one-hot)."""
    yield _qkv(rng, (2,), 4, 6, 16, 4, dtype, scale=1e4)
    q, k, v = _qkv(rng, (2,), 4, 6, 16, 4, torch.float64)
    q[..., 0] = k[..., 0] = math.sqrt(4000.0)
    yield q.to(dtype), k.to(dtype), v.to(dtype)


@points(1, part=SDPA)
def test_sdpa_large_scores_stay_finite(learner, reference, rng):
    """Do very large scores (1e3 to 1e4) still give finite, correct results?"""
    for dtype in (torch.float32, torch.float64):
        for q, k, v in _large_scores(rng, dtype):
            mask = reference.causal_mask(6)[:4]
            expected = _expected(reference, q, k, v, mask)
            out, w = _validated(SDPA, _call(learner, SDPA, q, k, v, mask), expected, dtype)
            expect(bool(torch.isfinite(out).all() and torch.isfinite(w).all()),
                   "Very large scores give inf or NaN: use torch.softmax (which is stable) or subtract the "
                   "row maximum, and fill masked scores with -inf or the dtype's minimum, not with a product.")
            _judge(SDPA, (out, w), expected, _mistakes(reference, q, k, v, mask), rtol=1e-3, atol=1e-3)


@points(1, part=SDPA)
def test_sdpa_causal_does_not_look_ahead(learner, reference, rng):
    """Under a causal mask, does the output at position t ignore every input after t (and is it right)?"""
    T = 6
    q, k, v = _qkv(rng, (2,), T, T, 4, 4)
    mask = reference.causal_mask(T)
    expected = _expected(reference, q, k, v, mask)
    base, w = _validated(SDPA, _call(learner, SDPA, q, k, v, mask), expected, q.dtype)
    for t in range(T - 1):
        k2, v2 = k.clone(), v.clone()
        k2[:, t + 1:] += torch.randn(k2[:, t + 1:].shape, generator=rng)
        v2[:, t + 1:] += torch.randn(v2[:, t + 1:].shape, generator=rng)
        out, _ = _validated(SDPA, _call(learner, SDPA, q, k2, v2, mask), expected, q.dtype)
        expect(close(out[:, : t + 1], base[:, : t + 1], atol=1e-6),
               "Under a causal mask, changing later keys or values changes earlier outputs: "
               "the future leaks (is the mask applied, and True on and below the diagonal?).")
    _judge(SDPA, (base, w), expected, _mistakes(reference, q, k, v, mask))


@points(1, part=SDPA)
def test_sdpa_gradients_match(learner, reference, rng):
    """Do the gradients with respect to q, k and v match the reference?"""
    q, k, v = _qkv(rng, (2, 2), 3, 5, 4, 6, torch.float64)
    mask = random_mask(rng, (2, 1, 3, 5))
    _attention(learner, reference, SDPA, q, k, v, mask)
    _expect_sdpa_grads(learner, reference, q, k, v, mask, torch.randn(2, 2, 3, 6, generator=rng, dtype=q.dtype),
                       "The gradients with respect to q, k or v differ from the reference's: is part of the "
                       "computation detached, or done outside PyTorch?")


@points(1, part=SDPA)
def test_sdpa_dropout(learner, reference, rng):
    """Is dropout applied to the weights only when dropout_p > 0, and scaled by 1/(1-p)?"""
    q, k, v = _qkv(rng, (2,), 32, 48, 8, 4, torch.float64)
    ref_out, ref_w = _expected(reference, q, k, v)

    def run(p):
        got = pair(learner.scaled_dot_product_attention(q, k, v, dropout_p=p), SDPA)
        return _validated(SDPA, got, (ref_out, ref_w), q.dtype)

    (a, wa), (b, _) = run(0.0), run(0.0)
    _judge(SDPA, (a, wa), (ref_out, ref_w), _mistakes(reference, q, k, v, None))
    expect(torch.equal(a, b), "With dropout_p=0 the result must be deterministic: apply dropout only "
                              "when dropout_p > 0.")
    # Two rates: F.dropout's default p is 0.5, so a dropout that ignores dropout_p passes at 0.5 alone.
    for p in (0.5, 0.2):
        out, w = run(p)
        dropped = w == 0
        expect(abs(dropped.double().mean().item() - p) < 0.15 * (1 - p),
               "The share of weights zeroed by dropout does not follow dropout_p: is dropout applied to "
               "the weights with the given rate (F.dropout(weights, p=dropout_p))?")
        expect(close(w[~dropped], ref_w[~dropped] / (1 - p)),
               "The weights that survive dropout must be the softmax weights scaled by 1/(1-p) "
               "(F.dropout does this); return the weights after dropout.")
        expect(close(out, w @ v), "With dropout, the output must be the dropped-out weights @ V.")


@points(1, part=SDPA)
def test_sdpa_runs_on_any_device(learner, reference, rng):
    """Does it create no tensor on a fixed device, so that it runs on a GPU too, with and without a mask?"""
    q, k, v = _qkv(rng, (2, 2), 4, 6, 8, 3)
    mask = random_mask(rng, (2, 1, 4, 6), fully_masked=1)
    for m in (None, mask):
        _attention(learner, reference, SDPA, q, k, v, m)
        expect_device_agnostic(learner, SDPA, q, k, v, **({} if m is None else {"mask": m}))


# --- Part 4: masks (4 points) ----------------------------------------------------------

PAD_SHAPE = "(B, 1, 1, T), so that it broadcasts over heads and query positions"


def _mask(m, name, shape, shape_hint, device="cpu"):
    """`m` as a boolean tensor of `shape` on `device`, or a hint."""
    tensor(m, name, device=device, what="its mask")
    expect(m.dtype == torch.bool, f"`{name}` must return a boolean tensor.")
    expect(tuple(m.shape) == tuple(shape), f"`{name}` must have shape {shape_hint}.")
    return m


@points(1, part="padding_mask")
def test_padding_mask_marks_real_tokens(learner, reference, rng):
    """Is the padding mask boolean, (B, 1, 1, T), True exactly at real tokens?"""
    tokens = torch.randint(1, 9, (3, 7), generator=rng)
    tokens[0, 5:] = 0
    tokens[2, 2:] = 0
    m = _mask(learner.padding_mask(tokens), "padding_mask", (3, 1, 1, 7), PAD_SHAPE)
    ref = reference.padding_mask(tokens)
    if not torch.equal(m, ref):
        expect(not torch.equal(m, ~ref),
               "`padding_mask` is inverted: True must mark real tokens (may attend), False padding.")
        raise Hint("`padding_mask` marks the wrong positions: compare tokens with pad_id.")


@points(1, part="padding_mask")
def test_padding_mask_pad_id_and_device(learner, reference, rng, devices):
    """Does padding_mask honour pad_id, keep the tokens' device, and create nothing on a fixed device?"""
    tokens = torch.randint(0, 9, (2, 6), generator=rng)
    tokens[:, 4:] = 3
    for device in devices:
        m = _mask(learner.padding_mask(tokens.to(device), pad_id=3), "padding_mask", (2, 1, 1, 6), PAD_SHAPE, device)
        expect(torch.equal(m.cpu(), reference.padding_mask(tokens, pad_id=3)),
               "`padding_mask(tokens, pad_id)` ignores `pad_id`: compare with it, not with 0.")
    expect_device_agnostic(learner, "padding_mask", tokens, pad_id=3)


@points(1, part="causal_mask")
def test_causal_mask_values(learner, reference):
    """Is the causal mask boolean (T, T), True on and below the diagonal?"""
    for size in (1, 4, 7):
        m = _mask(learner.causal_mask(size), "causal_mask", (size, size), "(size, size)")
        ref = reference.causal_mask(size)
        if not torch.equal(m, ref):
            expect(not torch.equal(m, ~ref), "`causal_mask` is inverted: True must mean 'may attend', "
                                             "i.e. on and below the diagonal (the past and the present).")
            expect(not torch.equal(m, ref.triu()), "`causal_mask` allows the future: True must be on and "
                                                   "below the diagonal, use tril, not triu.")
            expect(not torch.equal(m, ref.tril(-1)), "`causal_mask` forbids the diagonal: a position must "
                                                     "be allowed to attend to itself.")
            raise Hint("`causal_mask` marks the wrong positions.")


@points(1, part="causal_mask")
def test_causal_mask_device(learner, reference, devices):
    """Does causal_mask build its mask on the requested device, creating nothing on a fixed one?"""
    for device in devices:
        m = tensor(learner.causal_mask(5, device=torch.device(device)), "causal_mask", what="its mask")
        expect(m.device.type == device, CAUSAL_DEVICE)
        m = _mask(m, "causal_mask", (5, 5), "(size, size)", device)
        expect(torch.equal(m.cpu(), reference.causal_mask(5)), "`causal_mask` marks the wrong positions.")
    # The meta device stands for a GPU: the mask must be made there, with nothing from the CPU mixed in.
    try:
        m = learner.device_checked("causal_mask", 5, device=META)
    except NotImplementedRemote:  # it ran above: here it copied data out of the mask (.cpu(), .tolist())
        raise Hint(CAUSAL_DEVICE + " Keep it there: no .cpu(), .tolist() or .numpy().") from None
    except LearnerError:
        m = None  # judged just below, where an error a GPU would share gets its hint
    if m is not None:
        m = tensor(m, "causal_mask", what="its mask", meta=True)
        expect(m.device.type == "meta", CAUSAL_DEVICE)
    expect_device_agnostic(learner, "causal_mask", 5, device=META)
