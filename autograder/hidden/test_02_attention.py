"""Hidden tests for exercise 02_attention: score functions, the masked context vector, a
decoder step with attention, and Luong's local-p attention.

Each check compares the learner's code (through the `learner` proxy) with the reference
on fresh random inputs, in float32 and float64 on every device (the score functions and
attention_context also in float16 and bfloat16), and asks the toolkit whether the code
would run on a GPU. A wrong result is explained by the typical mistake it matches; a
property (weights sum to 1, padding does not leak, the window) is checked together with
the values, so that a function that only has the property earns nothing.

Parts stay apart: the decoder step (part 5) calls the learner's own general_score
(part 2) and attention_context (part 4), so its checks accept the step built from the
reference's layers and those two functions of the learner's, values and gradients
(chained through the learner's functions). A mistake of parts 2 or 4 therefore costs
part 5 nothing, except where it hides whether the decoder is right (an attention_context
that ignores the mask cannot show that the decoder passes one): there the hint says
which part to fix first.
"""

from __future__ import annotations

import math

import torch

from autograder.hidden.support import (DEVICE_ERRORS, FIXED_DEVICE_HINT, HALF, Hint, close, diagnose, expect,
                                       expect_accepts_cpu_tail, expect_close, expect_device_agnostic, expect_grads,
                                       learner_grads, learner_module, module, pair, points, random_mask,
                                       reference_grads, tensor, vjp)
from autograder.isolation.errors import LearnerError, MissingName, NotImplementedRemote

F32, F64 = torch.float32, torch.float64
DTYPES = (F32, F64)
DEC = "AttnDecoder"
LOCAL = "local_attention_weights"
PART_OF = {"general_score": "part 2", "attention_context": "part 4"}

OVERFLOW_HINT = ("`{}` fails in float16: its fill value for masked scores does not fit in float16 (-1e9 overflows: "
                 "float16's largest magnitude is 65504). Fill with float('-inf') or torch.finfo(scores.dtype).min.")
# The harness rejects hints holding "tensor(" (a tensor's repr): the toolkit's device hint, reworded.
# Drop this once the toolkit's hint says it so.
GRAD_HINT = ("The result is right but its gradient with respect to {} is not: is part of it computed outside "
             "autograd (.data, .detach(), NumPy) or in place?")


# --- helpers ---------------------------------------------------------------------------

def _randn(rng, *shape, dtype=F32, scale=1.0, device="cpu"):
    return (torch.randn(*shape, generator=rng, dtype=F64) * scale).to(device, dtype)


def _randint(rng, lo, hi):
    """An int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng))


def _mask(rng, B, T):
    """A boolean (B, T) mask, True at real tokens, with at least one in every row."""
    return random_mask(rng, (B, T), p_keep=0.6)


def _cases(devices, shapes):
    """(device, dtype, shape): float32 and float64 on every device, then float16 and bfloat16 on the CPU."""
    for device in devices:
        for dtype in DTYPES:
            for shape in shapes:
                yield device, dtype, shape
    for dtype in HALF:
        for shape in shapes:
            yield "cpu", dtype, shape


def _inputs(rng, dtype, device, *shapes):
    """Random tensors; half-precision ones smaller, so that their rounding stays within half tolerances."""
    scale = 0.5 if dtype in HALF else 1.0
    return tuple(_randn(rng, *s, dtype=dtype, scale=scale, device=device) for s in shapes)


def _cpu64(*ts):
    return tuple(None if t is None else t.detach().cpu().double() if t.is_floating_point() else t.cpu()
                 for t in ts)


def _reference(fn, *args, **kwargs):
    """The reference's result; for half-precision inputs, computed in float64 and rounded to their dtype."""
    dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
    if dtype not in HALF:
        return fn(*args, **kwargs)
    up = lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
    out = fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
    return tuple(o.to(dtype) for o in out) if isinstance(out, tuple) else out.to(dtype)


def _same(dtype):
    """How a wrong result is matched with a typical mistake's (computed in float64): loosely, NaN
    matching NaN, and at the tolerance of `dtype` for the half types."""
    if dtype in HALF:
        return lambda got, wrong: close(got, wrong.to(dtype), equal_nan=True)
    return lambda got, wrong: close(got, wrong, rtol=1e-3, atol=1e-4, equal_nan=True)


def _call(fn, *args, **kwargs):
    """The learner's `fn(*args)`; a device mix-up (on a GPU) or a float16 overflow gets the hint naming it."""
    try:
        return fn(*args, **kwargs)
    except LearnerError as exc:
        expect(not any(s in exc.message for s in DEVICE_ERRORS), FIXED_DEVICE_HINT.format(exc.name))
        expect("without overflow" not in exc.message, OVERFLOW_HINT.format(exc.name))
        raise


def _quietly(fn, *args, **kwargs):
    """A learner's function called only to refine a hint or to build on its result: None if it fails."""
    try:
        return fn(*args, **kwargs)
    except (LearnerError, MissingName, NotImplementedRemote):
        return None


def _usable(x, shape):
    """Whether a learner's value is a floating tensor of `shape` on the CPU, fit to compute with."""
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "cpu"
            and tuple(x.shape) == tuple(shape))


def _result(x, name, shape, dtype, device, what):
    """The toolkit's `tensor` check, after a hint for the commonest shape slip (a bare squeeze())."""
    if isinstance(x, torch.Tensor) and x.dim() < len(shape) and \
            [n for n in x.shape if n != 1] == [n for n in shape if n != 1]:
        raise Hint(f"`{name}` loses an axis of size 1 (a batch of one row, or a single position): a bare "
                   "squeeze() drops every axis of size 1; squeeze only the axis you mean, e.g. squeeze(-1).")
    return tensor(x, name, shape=shape, dtype=dtype, device=device, what=what)


def _order(result, shapes, name, order):
    """A hint when the results come in another order than `order` (told apart by their shapes)."""
    got = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in result]
    shapes = [tuple(s) for s in shapes]
    expect(got == shapes or len(set(shapes)) < len(shapes) or sorted(map(str, got)) != sorted(map(str, shapes)),
           f"`{name}` returns its results in the wrong order: return {order}.")


def _agree(got, expected, name, generic, mistakes=(), *, device="cpu", what="its scores (B, S)"):
    """Fail unless `got` is a tensor like `expected` (shape, dtype, device) and close to it; a
    wrong value is explained by the first typical mistake it matches."""
    _result(got, name, expected.shape, expected.dtype, device, what)
    expect_close(got, expected, generic, mistakes=mistakes, device=device, same=_same(expected.dtype))
    return got


def _arg_grads(res, n):
    """The first `n` argument gradients of a `with_grad` result, None where missing."""
    grads = list(res.arg_grads[:n])
    return grads + [None] * (n - len(grads))


def _expect_arg_grads(res, expected, names):
    for name, g, e in zip(names, _arg_grads(res, len(names)), expected):
        expect_grads([g], [e], [name], hint=GRAD_HINT.format(name))


# --- Part 1: dot and scaled-dot scores (2 points) ----------------------------------------

DOT_GENERIC = "`dot_score` differs from the dot product of each key with its row's query."
SCALED_GENERIC = "`scaled_dot_score` differs from the dot score divided by sqrt(d)."


def _dot64(q, k):
    return torch.einsum("bd,btd->bt", q.double(), k.double())


def _dot_mistakes(q, k):
    q, k = _cpu64(q, k)
    return [
        ("`dot_score` divides by sqrt(d): the plain dot score is not scaled (that is scaled_dot_score).",
         lambda: _dot64(q, k) / math.sqrt(q.shape[-1])),
        ("`dot_score` mixes batch rows: the keys of row b must meet the query of row b only.",
         lambda: torch.einsum("cd,btd->bt", q, k)),
    ]


def _scaled_mistakes(q, k):
    q, k = _cpu64(q, k)
    e, d, T = _dot64(q, k), q.shape[-1], k.shape[-2]
    return [
        ("The scores are not divided by sqrt(d): scaled_dot_score returns the plain dot score.", e),
        ("The scores are divided by d instead of sqrt(d).", e / d),
        ("The scores are divided by the square root of the number of keys S, not of the vector size "
         "d: use query.size(-1).", e / math.sqrt(T)),
        ("The scores are multiplied by sqrt(d) instead of divided by it.", e * math.sqrt(d)),
    ]


@points(1, part="dot_scores")
def test_dot_score_matches_reference(learner, reference, rng, devices):
    """Does dot_score agree with the reference for any shape, in every dtype, and would it run on a GPU?"""
    for device, dtype, (B, T, d) in _cases(devices, [(1, 1, 3), (2, 5, 4), (3, 4, 7)]):
        q, k = _inputs(rng, dtype, device, (B, d), (B, T, d))
        _agree(_call(learner.dot_score, q, k), _reference(reference.dot_score, q, k), "dot_score", DOT_GENERIC,
               _dot_mistakes(q, k), device=device)
    expect_device_agnostic(learner, "dot_score", q, k)


@points(1, part="dot_scores")
def test_scaled_dot_score_matches_reference(learner, reference, rng, devices):
    """Is scaled_dot_score the dot score over sqrt(d), d the vectors' size, in every dtype and on any device?"""
    for device, dtype, (B, T, d) in _cases(devices, [(2, 3, 16), (1, 5, 9), (3, 1, 4)]):
        q, k = _inputs(rng, dtype, device, (B, d), (B, T, d))
        try:
            e = _call(learner.scaled_dot_score, q, k)
        except LearnerError:
            mine = _quietly(learner.dot_score, q, k)
            expect(close(mine, _reference(reference.dot_score, q, k), device), "`scaled_dot_score` fails, and "
                   "your dot_score, which it may call, is wrong too: fix dot_score first.")
            raise
        expected = _reference(reference.scaled_dot_score, q, k)
        if isinstance(e, torch.Tensor) and tuple(e.shape) == (B, T) and not close(e, expected, device):
            mine = _quietly(learner.dot_score, q, k)
            if isinstance(mine, torch.Tensor) and mine.is_floating_point() and tuple(mine.shape) == (B, T):
                expect(close(mine, _reference(reference.dot_score, q, k), device)
                       or not close(e, mine.detach() / math.sqrt(d), device),
                       "scaled_dot_score divides your dot_score by sqrt(d) correctly, but dot_score itself is "
                       "wrong: fix it first.")
        _agree(e, expected, "scaled_dot_score", SCALED_GENERIC, _scaled_mistakes(q, k), device=device)
    expect_device_agnostic(learner, "scaled_dot_score", q, k)


# --- Part 2: the general score (2 points) -------------------------------------------------

GENERAL_GENERIC = "`general_score` differs from s^T W h_j for each key h_j."


def _general_mistakes(q, k, W):
    q, k, W = _cpu64(q, k, W)
    out = []
    if W.shape[0] == W.shape[1]:
        out += [
            ("W is used transposed: the score is s^T W h_j with W of shape (d_q, d_k), so multiply the "
             "query by W (query @ W), not by W^T (which is what nn.Linear-style W @ s computes).",
             lambda: torch.einsum("bd,btd->bt", q @ W.T, k)),
            ("The score ignores W: the general score is s^T W h_j, not the dot score.", lambda: _dot64(q, k)),
        ]
    out.append(("The general score is not scaled: leave out the division by sqrt(d).",
                lambda: torch.einsum("bd,btd->bt", q @ W, k) / math.sqrt(k.shape[-1])))
    return out


@points(1, part="general_score")
def test_general_score_matches_reference(learner, reference, rng, devices):
    """Does general_score agree with the reference, also when d_q != d_k, in every dtype, and would it run on a GPU?"""
    # The square case first: there a transposed W still runs, so it can be named.
    for device, dtype, (B, T, dq, dk) in _cases(devices, [(2, 4, 5, 5), (3, 5, 4, 6), (1, 3, 7, 2)]):
        q, k, W = _inputs(rng, dtype, device, (B, dq), (B, T, dk), (dq, dk))
        _agree(_call(learner.general_score, q, k, W), _reference(reference.general_score, q, k, W),
               "general_score", GENERAL_GENERIC, _general_mistakes(q, k, W), device=device)
    expect_device_agnostic(learner, "general_score", q, k, W)


@points(1, part="general_score")
def test_general_score_gradients(learner, reference, rng):
    """Do the gradients with respect to the query, the keys and W match the reference's?"""
    args = (_randn(rng, 3, 5, dtype=F64), _randn(rng, 3, 4, 5, dtype=F64), _randn(rng, 5, 5, dtype=F64))
    _agree(_call(learner.general_score, *args), reference.general_score(*args), "general_score", GENERAL_GENERIC,
           _general_mistakes(*args))
    g = _randn(rng, 3, 4, dtype=F64)
    res = learner_grads(learner, "general_score", *args, cotangents=(g,), what="general_score")
    _expect_arg_grads(res, reference_grads(reference.general_score, args, (g,)), ("the query", "the keys", "W"))


# --- Part 3: the additive score (3 points) ------------------------------------------------

ADDITIVE_GENERIC = "`additive_score` differs from v^T tanh(W1 s + W2 h_j) for each key h_j."


def _additive_mistakes(q, k, W1, W2, v):
    q, k, W1, W2, v = _cpu64(q, k, W1, W2, v)
    pre = (q @ W1.T).unsqueeze(-2) + k @ W2.T  # (B, T, d_a)
    out = [
        ("tanh is missing: the score is v^T tanh(W1 s + W2 h_j).", pre @ v),
        ("v is applied inside tanh: the score is v^T tanh(W1 s + W2 h_j), tanh first, then v.",
         lambda: torch.tanh(pre @ v)),
        ("The sum replaces v: the score is the dot product of v with tanh(W1 s + W2 h_j), not its sum.",
         lambda: torch.tanh(pre).sum(-1)),
    ]
    if W1.shape[0] == W1.shape[1] == W2.shape[1]:
        out += [
            ("W1 and W2 are used transposed: W1 has shape (d_a, d_q), so W1 s is query @ W1.T (and "
             "W2 h_j is keys @ W2.T).", lambda: torch.tanh((q @ W1).unsqueeze(-2) + k @ W2) @ v),
            ("W1 is used transposed: W1 has shape (d_a, d_q), so W1 s is query @ W1.T.",
             lambda: torch.tanh((q @ W1).unsqueeze(-2) + k @ W2.T) @ v),
            ("W2 is used transposed: W2 has shape (d_a, d_k), so W2 h_j is keys @ W2.T.",
             lambda: torch.tanh((q @ W1.T).unsqueeze(-2) + k @ W2) @ v),
            ("W1 and W2 are swapped: W1 maps the query, W2 maps the keys.",
             lambda: torch.tanh((q @ W2.T).unsqueeze(-2) + k @ W1.T) @ v),
        ]
    return out


def _check_additive(learner, reference, args, device="cpu"):
    return _agree(_call(learner.additive_score, *args), _reference(reference.additive_score, *args),
                  "additive_score", ADDITIVE_GENERIC, _additive_mistakes(*args), device=device)


def _additive_args(rng, B, T, dq, dk, da, dtype=F32, device="cpu"):
    return _inputs(rng, dtype, device, (B, dq), (B, T, dk), (da, dq), (da, dk), (da,))


@points(1, part="additive_score")
def test_additive_score_matches_reference(learner, reference, rng, devices):
    """Does additive_score agree with the reference when d_q, d_k and d_a differ, in every dtype, on a GPU too?"""
    for device, dtype, dims in _cases(devices, [(2, 4, 3, 5, 6), (1, 3, 6, 2, 4)]):
        args = _additive_args(rng, *dims, dtype=dtype, device=device)
        _check_additive(learner, reference, args, device)
    expect_device_agnostic(learner, "additive_score", *args)


@points(1, part="additive_score")
def test_additive_score_square_weights(learner, reference, rng):
    """With square weights, where a transposed or swapped matrix still runs, are W1 and W2 applied as asked?"""
    for B, T, d in [(2, 5, 4), (3, 2, 3)]:
        _check_additive(learner, reference, _additive_args(rng, B, T, d, d, d, dtype=F64))


@points(1, part="additive_score")
def test_additive_score_gradients(learner, reference, rng):
    """Do the gradients with respect to the query, the keys, W1, W2 and v match the reference's?"""
    args = _additive_args(rng, 2, 4, 3, 5, 6, dtype=F64)
    _check_additive(learner, reference, args)
    g = _randn(rng, 2, 4, dtype=F64)
    res = learner_grads(learner, "additive_score", *args, cotangents=(g,), what="additive_score")
    _expect_arg_grads(res, reference_grads(reference.additive_score, args, (g,)),
                      ("the query", "the keys", "W1", "W2", "v"))


# --- Part 4: the context vector, with a mask (4 points) -----------------------------------

CONTEXT_SUM_HINT = ("The weights are right but the context is not their weighted sum of the values, "
                    "sum_j weights[:, j] * values[:, j]: check the axis you sum over.")
CONTEXT_LEAK_HINT = ("Padding leaks into the context: changing the scores or values at padded positions changes "
                     "the result. Padded positions must get weight exactly 0 (fill their scores with -inf before "
                     "the softmax; True in the mask marks a real token).")


def _context_generic(mask):
    return ("The weights differ from the softmax of the scores over the source positions"
            + ("" if mask is None else ", with padded positions left out") + ".")


def _context_mistakes(scores, values, mask):
    """(hint, weights) of the typical mistakes, in float64."""
    raw, _ = _cpu64(scores, values)
    m = None if mask is None else mask.cpu()
    ninf = float("-inf")
    s = raw if m is None else raw.masked_fill(~m, ninf)
    out = []
    if m is not None:
        out += [
            ("The mask is inverted: True marks a real token, whose weight is kept; False marks padding, "
             "whose weight must be 0.", lambda: torch.softmax(raw.masked_fill(m, ninf), -1)),
            ("The mask is ignored: padded positions (mask False) must get weight exactly 0.",
             lambda: torch.softmax(raw, -1)),
            ("Padded scores are set to 0 instead of -inf, so padding still gets weight (exp(0) = 1): fill "
             "them with float('-inf') before the softmax.", lambda: torch.softmax(raw.masked_fill(~m, 0.0), -1)),
            ("The weights of padded positions are zeroed after the softmax without renormalising, so the "
             "real tokens' weights no longer sum to 1: fill the scores with -inf before the softmax.",
             lambda: torch.softmax(raw, -1) * m),
        ]
    out += [
        ("The softmax runs over the batch axis (dim=0): it must run over the source positions (dim=-1).",
         lambda: torch.softmax(s, 0).nan_to_num(0.0)),
        ("The weights are the raw scores: normalise them with a softmax over the source positions.",
         lambda: s.nan_to_num(0.0, neginf=0.0)),
        ("The scores are scaled before the softmax: attention_context takes the scores as they are (any "
         "scaling belongs to the score function).",
         lambda: torch.softmax(s / math.sqrt(s.shape[-1]), -1)),
    ]
    return out


def _context_result(result, values, dtype, device):
    """The learner's (context, weights), checked for order, type, shape, dtype and device."""
    B, T, dv = values.shape
    got = pair(result, "attention_context", what="a pair (context, weights)")
    _order(got, [(B, dv), (B, T)], "attention_context", "(context, weights)")
    context, weights = got
    _result(weights, "attention_context", (B, T), dtype, device, "its weights (B, S)")
    _result(context, "attention_context", (B, dv), dtype, device, "its context (B, d_v)")
    return context, weights


def _check_context(learner, reference, scores, values, mask, device="cpu"):
    """The learner's (context, weights); fail with a diagnosis unless they are the reference's."""
    kwargs = {} if mask is None else {"mask": mask}
    context, weights = _context_result(_call(learner.attention_context, scores, values, **kwargs), values,
                                       scores.dtype, device)
    ref_c, ref_w = _reference(reference.attention_context, scores, values, **kwargs)
    _agree(weights, ref_w, "attention_context", _context_generic(mask), _context_mistakes(scores, values, mask),
           device=device, what="its weights (B, S)")
    expect(close(context, ref_c, device), CONTEXT_SUM_HINT)
    return context, weights


@points(1, part="attention_context")
def test_attention_context_matches_reference(learner, reference, rng, devices):
    """Without a mask, are the context and weights the reference's in every dtype; would the code run on a GPU?"""
    for device, dtype, (B, T, dv) in _cases(devices, [(3, 5, 2), (1, 4, 3), (2, 1, 4)]):
        scores, values = _inputs(rng, dtype, device, (B, T), (B, T, dv))
        _check_context(learner, reference, scores * 2, values, None, device)
    scores, values = _randn(rng, 3, 5, scale=2), _randn(rng, 3, 5, 2)
    expect_device_agnostic(learner, "attention_context", scores, values)
    expect_device_agnostic(learner, "attention_context", scores, values, mask=_mask(rng, 3, 5))


@points(1, part="attention_context")
def test_attention_context_weights_sum_to_one(learner, reference, rng):
    """Are the weights a softmax's: non-negative, summing to 1 over each row's real tokens, with or without a mask?"""
    B, T = 4, 6
    scores, values = _randn(rng, B, T, scale=2), _randn(rng, B, T, 3)
    mask = _mask(rng, B, T)
    for m in (None, mask):
        kwargs = {} if m is None else {"mask": m}
        _, w = _context_result(_call(learner.attention_context, scores, values, **kwargs), values, F32, "cpu")
        expect(bool(torch.isfinite(w).all()), "Some weights are NaN or infinite: use torch.softmax (which is "
                                              "stable) and fill padded scores with -inf, not multiply them.")
        real = torch.ones(B, T, dtype=torch.bool) if m is None else m
        if not (w >= 0).all():
            problem = "Some weights are negative: they must come from a softmax."
        elif not torch.allclose((w * real).sum(-1), torch.ones(B), atol=1e-5):
            problem = ("The weights of a row do not sum to 1: the softmax must run over the source positions "
                       "(dim=-1)." if m is None else
                       "With a mask, the weights of each row's real tokens must sum to 1 and padded positions "
                       "must get nothing: fill the padded scores with -inf before the softmax.")
        else:
            problem = _context_generic(m)
        expect_close(w, reference.attention_context(scores, values, **kwargs)[1], problem,
                     mistakes=_context_mistakes(scores, values, m), same=_same(F32))


@points(1, part="attention_context")
def test_attention_context_mask(learner, reference, rng):
    """With a mask, is padding's weight exactly 0 and are the results the reference's, in float16/bfloat16 too?"""
    for dtype in DTYPES + HALF:
        for B, T, dv in [(3, 6, 2), (2, 4, 5)]:
            scores, values = _inputs(rng, dtype, "cpu", (B, T), (B, T, dv))
            mask = _mask(rng, B, T)
            _, w = _check_context(learner, reference, scores * 2, values, mask)
            expect(bool((w[~mask] == 0).all()), "Padded positions must get a weight of exactly 0.")


@points(1, part="attention_context")
def test_attention_context_padding_does_not_leak(learner, reference, rng):
    """With a mask, does padding leave the context unchanged and get no gradient, all as in the reference?"""
    B, T, dv = 3, 7, 4
    scores, values = _randn(rng, B, T, dtype=F64, scale=2), _randn(rng, B, T, dv, dtype=F64)
    mask = random_mask(rng, (B, T), p_keep=0.5)
    base = _context_result(_call(learner.attention_context, scores, values, mask=mask), values, F64, "cpu")
    s2, v2 = scores.clone(), values.clone()
    s2[~mask] = _randn(rng, int((~mask).sum()), dtype=F64, scale=10)
    v2[~mask] = _randn(rng, int((~mask).sum()), dv, dtype=F64, scale=100)
    again = _context_result(_call(learner.attention_context, s2, v2, mask=mask), values, F64, "cpu")
    expect(all(close(a, b) for a, b in zip(again, base)), CONTEXT_LEAK_HINT)
    _check_context(learner, reference, scores, values, mask)
    cot = (_randn(rng, B, dv, dtype=F64), _randn(rng, B, T, dtype=F64))
    res = learner_grads(learner, "attention_context", scores, values, mask=mask, cotangents=cot,
                        what="attention_context")
    _expect_arg_grads(res, reference_grads(reference.attention_context, (scores, values), cot, mask=mask),
                      ("the scores", "the values"))


# --- Part 5: a decoder step with attention (5 points) -------------------------------------

DECODER_MISTAKES = (  # (hint, the mistake as keywords of _Case.step, the output that shows it first)
    ("The scores use W_a transposed: the score is s^T W_a h_j, e.g. general_score(hidden, enc_outputs, "
     "self.W_a.weight) or dot_score(hidden, self.W_a(enc_outputs)); self.W_a(hidden) computes W_a s, "
     "which gives h_j^T W_a s instead.", {"W": "WT"}, 2),
    ("The scores ignore W_a: use the general score s^T W_a h_j, with W = self.W_a.weight.", {"W": "I"}, 2),
    ("The scores are scaled: the decoder uses the general score, without dividing by sqrt(D).",
     {"scale": True}, 2),
    ("The source mask is ignored: pass src_mask to attention_context.", {"use_mask": False}, 2),
    ("The GRU cell's input is [context; embedding]: concatenate the embedding of y_prev first, then "
     "the context.", {"rnn_order": "ctx_emb"}, 1),
    ("The output layer gets [context; state]: concatenate the new state first, then the context.",
     {"out_order": "ctx_h"}, 0),
    ("The output layer uses the previous state s_{t-1}: feed it the new state s_t from the GRU cell.",
     {"out_state": "old"}, 0),
    ("The output layer uses the previous state, in the wrong order: feed it [s_t; c_t], the new state "
     "first.", {"out_state": "old", "out_order": "ctx_h"}, 0),
)
RETURNS_OLD_STATE = "The returned hidden state is the previous one: return the state the GRU cell computes."
DECODER_GENERIC = (  # by output: logits, state, weights
    "The weights and the new state are right but the logits are not self.out([s_t; c_t]).",
    "The weights are right but the new state is not GRUCell([e(y_prev); c_t], s_{t-1}) with self.embedding "
    "and self.rnn.",
    "The attention weights differ from softmax_j(s_{t-1}^T W_a h_j): compute them from the previous state, "
    "before the GRU cell.",
)
DECODER_LEAK_HINT = ("Padding leaks into the decoder: changing the encoder states at padded positions changes its "
                     "outputs. Pass src_mask to attention_context, whose padded weights must be exactly 0.")
DECODER_GRAD_HINT = ("The outputs are right but the gradient with respect to {} is not: is part of the step "
                     "computed outside autograd (.data, .detach(), NumPy) or in place?")
GRAD_LABELS = {"hidden": "the previous state", "enc": "the encoder states"}


class _Own:
    """The learner's own general_score and attention_context, called as the decoder calls them (on
    float64 CPU inputs); None where they fail or return something unusable. The reference module
    stands for the reference's."""

    def __init__(self, learner):
        self.learner = learner

    def general_score(self, h, enc, W):
        s = _quietly(self.learner.general_score, h, enc, W)
        return s.detach().double() if _usable(s, enc.shape[:2]) else None

    def attention_context(self, scores, enc, mask):
        r = _quietly(self.learner.attention_context, scores, enc, mask)
        B, T, H = enc.shape
        if isinstance(r, (tuple, list)) and len(r) == 2 and _usable(r[0], (B, H)) and _usable(r[1], (B, T)):
            return r[0].detach().double(), r[1].detach().double()
        return None


def _trouble(learner, reference, h, enc, W, mask, *, values=True):
    """(name, what is wrong with it) for the first of the learner's general_score and attention_context
    that fails, returns something unusable or (with `values`) a wrong result on the decoder's
    inputs (on the CPU), each given the reference's inputs; None when both are right."""
    h, enc, W = (t.detach().cpu().to(h.dtype) for t in (h, enc, W))
    mask = None if mask is None else mask.cpu()
    scores = reference.general_score(h, enc, W)
    for name, args, expected in (("general_score", (h, enc, W), (scores,)),
                                 ("attention_context", (scores, enc, mask),
                                  reference.attention_context(scores, enc, mask))):
        try:
            got = getattr(learner, name)(*args)
        except NotImplementedRemote:
            return name, "is not implemented yet"
        except (LearnerError, MissingName):
            return name, "fails"
        got = (got,) if name == "general_score" else got
        if not (isinstance(got, (tuple, list)) and len(got) == len(expected)
                and all(_usable(g, e.shape) and g.dtype == e.dtype for g, e in zip(got, expected))):
            return name, "returns a result of the wrong type, shape or dtype"
        if values and not all(close(g, e, rtol=1e-3, atol=1e-4) for g, e in zip(got, expected)):
            return name, "is wrong"
    return None


def _alike(a, b):
    return a is not None and all(close(x, y, rtol=1e-3, atol=1e-4) for x, y in zip(a, b))


class _Case:
    """A decoder with random weights: the learner's (a handle, on `device` in `dtype`) and the
    reference's (in float64 on the CPU), holding the same weights."""

    def __init__(self, learner, reference, rng, device="cpu", dtype=F32):
        # V > H > every source length T used here, and E != H: outputs of one kind are never taken for another.
        self.dims = (_randint(rng, 9, 12), _randint(rng, 2, 4), _randint(rng, 7, 8))
        ref = reference.AttnDecoder(*self.dims)
        ref.load_state_dict({n: _randn(rng, *p.shape, scale=0.5) for n, p in ref.state_dict().items()})
        self.dec = learner_module(learner, DEC, ref, *self.dims)
        self.dec.to(device, dtype)
        self.ref = ref.double()
        self.W = self.ref.W_a.weight.detach()
        self.learner, self.reference, self.device, self.dtype = learner, reference, device, dtype

    def inputs(self, rng, B, T):
        # The state and the encoder outputs at half scale keep the scores s^T W_a h_j near unit
        # size (W_a's entries are 0.5 N(0, 1)): at full scale they reach 10 and more, the softmax
        # puts all its weight on one position, and then W_a and W_a^T (or a score scaled by
        # 1/sqrt(D)) give the same step, so a decoder mistake could not be told apart.
        V, _, H = self.dims
        y = torch.randint(0, V, (B,), generator=rng).to(self.device)
        return (y, _randn(rng, B, H, dtype=self.dtype, device=self.device, scale=0.5),
                _randn(rng, B, T, H, dtype=self.dtype, device=self.device, scale=0.5))

    def step(self, pieces, y, h, enc, mask, *, W="W", scale=False, use_mask=True, rnn_order="emb_ctx",
             out_order="h_ctx", out_state="new"):
        """(logits, new state, weights) of one step in float64 on the CPU: the reference's layers
        with `pieces`' general_score and attention_context (None where they give none); the
        keywords make the typical mistakes."""
        m = self.ref
        y, h, enc = _cpu64(y, h, enc)
        mask = mask.cpu() if mask is not None and use_mask else None
        Wa = {"W": self.W, "WT": self.W.T.contiguous(), "I": torch.eye(self.W.shape[0], dtype=F64)}[W]
        with torch.no_grad():
            scores = pieces.general_score(h, enc, Wa)
            if scores is None:
                return None
            if scale:
                scores = scores / math.sqrt(h.shape[-1])
            cw = pieces.attention_context(scores, enc, mask)
            if cw is None:
                return None
            c, w = cw
            e = m.embedding(y)
            s = m.rnn(torch.cat([e, c] if rnn_order == "emb_ctx" else [c, e], -1), h)
            s_out = s if out_state == "new" else h
            logits = m.out(torch.cat([s_out, c] if out_order == "h_ctx" else [c, s_out], -1))
        return logits, s, w

    def run(self, y, h, enc, mask):
        """The learner's step, checked for type, order, shapes, dtype and device."""
        args = (y, h, enc) if mask is None else (y, h, enc, mask)
        try:
            out = _call(self.dec, *args)
        except (LearnerError, NotImplementedRemote):
            t = _trouble(self.learner, self.reference, h, enc, self.W, mask, values=False)
            if t is None:
                raise
            name, what = t
            if what == "is not implemented yet":
                raise Hint(f"`AttnDecoder` cannot run yet: `{name}`, which it needs, is not implemented yet. "
                           f"Finish {PART_OF[name]} first.") from None
            raise Hint(f"`AttnDecoder` fails, and your {name}, which it calls, {what}: fix {name} first "
                       f"({PART_OF[name]}).") from None
        got = pair(out, DEC, 3, "a triple (logits, hidden, weights)")
        (V, _, H), (B, T) = self.dims, enc.shape[:2]
        shapes = [(B, V), (B, H), (B, T)]
        _order(got, shapes, DEC, "(logits, hidden, weights)")
        for x, shape, what in zip(got, shapes, ("its logits (B, V)", "its new state (B, D)", "its weights (B, S)")):
            _result(x, DEC, shape, h.dtype, self.device, what)
        return got

    def _near(self, got, expected):
        """Whether a learner's output is `expected`'s (NaN where the learner's own functions give NaN)."""
        return close(got, expected.to(self.dtype), self.device, equal_nan=True)

    def _close(self, got, expected):
        return expected is not None and all(self._near(g, e) for g, e in zip(got, expected))

    def check(self, y, h, enc, mask, *, fail_hint=None, twins=True):
        """The learner's step and whether it was accepted as built from the learner's own (wrong)
        general_score or attention_context. Fail with a diagnosis (or `fail_hint`) unless it is
        the reference's step, or the step built from those two functions of the learner's and no
        decoder mistake gives the same result with them (looked for when `twins`)."""
        got = self.run(y, h, enc, mask)
        ref = self.step(self.reference, y, h, enc, mask)
        if self._close(got, ref):
            return got, False
        own_pieces = _Own(self.learner)
        own = self.step(own_pieces, y, h, enc, mask)
        trouble = _trouble(self.learner, self.reference, h, enc, self.W, mask)
        mistakes = [(hint, kw, out) for hint, kw, out in DECODER_MISTAKES if mask is not None or "use_mask" not in kw]
        if self._close(got, own):
            # Right given the learner's general_score and attention_context, unless a decoder mistake
            # would give the same result with them (e.g. an attention_context that ignores the mask).
            if trouble is not None and twins:
                name, what = trouble
                expect(not any(_alike(self.step(own_pieces, y, h, enc, mask, **kw), own) for _, kw, _ in mistakes),
                       f"Your {name} {what} ({PART_OF[name]}), and with it this check cannot tell whether your "
                       f"decoder is right: fix {name} first.")
            return got, trouble is not None
        expect(fail_hint is None, fail_hint)
        pieces, base = (own_pieces, own) if trouble is not None and own is not None else (self.reference, ref)
        also = "" if trouble is None else f" Your {trouble[0]} {trouble[1]} too: fix it first ({PART_OF[trouble[0]]})."
        for i in (2, 1, 0):  # the weights first, then the new state, then the logits
            if not self._near(got[i], base[i]):
                typical = [(hint, lambda kw=kw, i=i: (lambda r: None if r is None else r[i])(
                    self.step(pieces, y, h, enc, mask, **kw))) for hint, kw, out in mistakes if out == i]
                if i == 1:
                    typical.append((RETURNS_OLD_STATE, _cpu64(h)[0]))
                raise Hint(diagnose(got[i], typical, DECODER_GENERIC[i], same=_same(F64)) + also)
        raise Hint(DECODER_GENERIC[2] + also)

    def ref_grads(self, y, h, enc, mask, cot):
        """The reference step's gradients: parameter name (or "hidden", "enc") -> gradient."""
        hr, er = h.detach().clone().requires_grad_(True), enc.detach().clone().requires_grad_(True)
        params = dict(self.ref.named_parameters())
        grads = vjp(self.ref(y, hr, er, mask), [*params.values(), hr, er], cot)
        return dict(zip([*params, "hidden", "enc"], grads))

    def own_grads(self, y, h, enc, mask, cot):
        """(gradients, None) of the step built from the learner's own general_score and
        attention_context, chained through their own gradients; (None, name) when one of them
        gives no usable gradient, (None, None) when they give no usable values."""
        m, own = self.ref, _Own(self.learner)
        scores = own.general_score(h, enc, self.W)
        cw = None if scores is None else own.attention_context(scores, enc, mask)
        if cw is None:
            return None, None
        B, T, H = enc.shape
        c, hr = cw[0].clone().requires_grad_(True), h.detach().clone().requires_grad_(True)
        layers = {n: p for n, p in m.named_parameters() if n != "W_a.weight"}
        s = m.rnn(torch.cat([m.embedding(y), c], -1), hr)
        logits = m.out(torch.cat([s, c], -1))
        g_c, g_h, *g_layers = vjp([logits, s], [c, hr, *layers.values()], cot[:2])
        res = _quietly(self.learner.with_grad, "attention_context", scores, enc, mask, cotangents=(g_c, cot[2]))
        g_s, g_enc = _arg_grads(res, 2) if res is not None else (None, None)
        if not (_usable(g_s, (B, T)) and _usable(g_enc, (B, T, H))):
            return None, "attention_context"
        res = _quietly(self.learner.with_grad, "general_score", h, enc, self.W, cotangents=(g_s,))
        g_h2, g_enc2, g_W = _arg_grads(res, 3) if res is not None else (None, None, None)
        if not (_usable(g_h2, (B, H)) and _usable(g_enc2, (B, T, H)) and _usable(g_W, self.W.shape)):
            return None, "general_score"
        return {**dict(zip(layers, g_layers)), "W_a.weight": g_W, "hidden": g_h + g_h2, "enc": g_enc + g_enc2}, None


@points(1, part="attn_decoder")
def test_attn_decoder_matches_reference(learner, reference, rng):
    """Without a mask, do the logits, new state and weights agree with the reference, given the same weights?"""
    case = _Case(learner, reference, rng)
    for B, T in [(3, 5), (2, 4)]:
        case.check(*case.inputs(rng, B, T), None)


@points(1, part="attn_decoder")
def test_attn_decoder_mask(learner, reference, rng):
    """With a source mask, do padded positions get weight exactly 0, and do the outputs agree with the reference?"""
    case = _Case(learner, reference, rng)
    B, T = 4, 6
    y, h, enc = case.inputs(rng, B, T)
    mask = _mask(rng, B, T)
    (_, _, w), own = case.check(y, h, enc, mask)
    expect(own or bool((w[~mask] == 0).all()), "Padded source positions must get a weight of exactly 0.")


@points(1, part="attn_decoder")
def test_attn_decoder_padding_does_not_leak(learner, reference, rng):
    """Are the outputs right, and do they stay so when the encoder states at padded positions change?"""
    case = _Case(learner, reference, rng)
    B, T = 3, 6
    y, h, enc = case.inputs(rng, B, T)
    mask = random_mask(rng, (B, T), p_keep=0.5)
    case.check(y, h, enc, mask)
    changed = enc.clone()
    changed[~mask] = _randn(rng, int((~mask).sum()), case.dims[2], scale=100)
    # Huge states may make padded scores so negative that a missing mask shows no more: the twins
    # of a decoder mistake are looked for on the first inputs only.
    case.check(y, h, changed, mask, fail_hint=DECODER_LEAK_HINT, twins=False)


@points(1, part="attn_decoder")
def test_attn_decoder_gradients(learner, reference, rng):
    """With a mask, do the gradients for every layer's weights, the state and the encoder states match?"""
    case = _Case(learner, reference, rng, dtype=F64)
    B, T = 3, 5
    y, h, enc = case.inputs(rng, B, T)
    mask = _mask(rng, B, T)
    case.check(y, h, enc, mask)
    V, _, H = case.dims
    cot = (_randn(rng, B, V, dtype=F64), _randn(rng, B, H, dtype=F64), _randn(rng, B, T, dtype=F64))
    res = learner_grads(learner, case.dec, y, h, enc, mask, cotangents=cot, params=True, what=DEC)
    expected = case.ref_grads(y, h, enc, mask, cot)
    got = {n: res.param_grads.get(n) for n in expected}
    got["hidden"], got["enc"] = _arg_grads(res, 3)[1:]
    if all(close(got[n], e) for n, e in expected.items()):
        return
    own, failing = case.own_grads(y, h, enc, mask, cot)
    if own is not None and all(close(got[n], e, equal_nan=True) for n, e in own.items()):
        return
    expect(failing is None, f"The decoder's gradients are wrong, and your {failing}, which it calls, gives no "
                            f"usable gradient: fix {failing} first ({PART_OF.get(failing)}); is part of it computed "
                            "outside autograd (.data, .detach(), NumPy)?")
    for name, e in (own or expected).items():
        label = GRAD_LABELS.get(name, name)
        expect(got[name] is not None or name in GRAD_LABELS,
               f"No gradient reaches {name}: is that layer used, and used without detaching its output or "
               "copying its weight (use self.W_a.weight itself)?")
        expect_grads([got[name]], [e], [label], hint=DECODER_GRAD_HINT.format(label))
    raise Hint(DECODER_GRAD_HINT.format("some of its inputs or weights"))


def _pieces_device_agnostic(learner, h, enc, W, mask):
    """Whether the learner's general_score and attention_context would run on a GPU (they are
    checked in their own parts; the decoder calls them)."""
    try:
        expect_device_agnostic(learner, "general_score", h, enc, W)
        expect_device_agnostic(learner, "attention_context", enc[..., 0], enc, mask)
    except Hint:
        return False
    return True


@points(1, part="attn_decoder")
def test_attn_decoder_dtypes_and_devices(learner, reference, rng, devices):
    """Does the decoder work in float32 and float64, for one row and for one source token, and on a GPU?"""
    for device in devices:
        for dtype in DTYPES:
            case = _Case(learner, reference, rng, device, dtype)
            for B, T in [(1, 4), (2, 1)]:
                case.check(*case.inputs(rng, B, T), None)
    case = _Case(learner, reference, rng)
    y, h, enc = case.inputs(rng, 3, 5)
    mask = _mask(rng, 3, 5)
    if _pieces_device_agnostic(learner, h, enc, case.W.float(), mask):
        on_meta = module(learner.AttnDecoder(*case.dims), "AttnDecoder")
        on_meta.to("meta")
        expect_device_agnostic(learner, on_meta, y, h, enc)
        expect_device_agnostic(learner, on_meta, y, h, enc, mask)


# --- Part 6: local attention, the predicted position (2 points) ---------------------------

POSITION_GENERIC = "`predict_position` differs from (S - 1) * sigmoid(v_p^T tanh(W_p s_t))."


def _position_mistakes(reference, hidden, W_p, v_p, src_len):
    h, Wp, vp = _cpu64(hidden, W_p, v_p)
    S = src_len.cpu().double() if isinstance(src_len, torch.Tensor) else float(src_len)
    out = [
        ("p is S * sigmoid(...): we count positions from 0, so p_t = (S - 1) * sigmoid(...), in [0, S - 1].",
         lambda: reference.predict_position(h, Wp, vp, S + 1)),
        ("tanh is missing: p_t = (S - 1) * sigmoid(v_p^T tanh(W_p s_t)).",
         lambda: (S - 1) * torch.sigmoid((h @ Wp.T) @ vp)),
        ("The sigmoid is missing: p_t = (S - 1) * sigmoid(v_p^T tanh(W_p s_t)), which keeps p in [0, S - 1].",
         lambda: (S - 1) * (torch.tanh(h @ Wp.T) @ vp)),
    ]
    if Wp.shape[0] == Wp.shape[1]:
        out.append(("W_p is used transposed: W_p has shape (d_p, D), so W_p s_t is hidden @ W_p.T.",
                    lambda: reference.predict_position(h, Wp.T, vp, S)))
    if isinstance(src_len, torch.Tensor):
        out.append(("Every row uses the same length: with a (B,) tensor of lengths, row b uses its own length.",
                    lambda: reference.predict_position(h, Wp, vp, float(src_len.max()))))
    return out


def _check_position(learner, reference, h, W_p, v_p, src_len, device="cpu"):
    return _agree(_call(learner.predict_position, h, W_p, v_p, src_len),
                  reference.predict_position(h, W_p, v_p, src_len), "predict_position", POSITION_GENERIC,
                  _position_mistakes(reference, h, W_p, v_p, src_len), device=device, what="p (B,)")


LENGTHS_DEVICE = ("`predict_position` would fail on a GPU when `src_len` is a tensor of lengths on the CPU (where "
                  "lengths often stay) and `hidden` is on the GPU: move the lengths to hidden's device.")


@points(1, part="predict_position")
def test_predict_position_matches_reference(learner, reference, rng, devices):
    """Does predict_position agree with the reference for int and tensor lengths, and would it run on a GPU?"""
    for device in devices:
        for dtype in DTYPES:
            for B, H, dp in [(3, 4, 4), (2, 5, 3)]:
                h, W_p, v_p = _inputs(rng, dtype, device, (B, H), (dp, H), (dp,))
                lengths = torch.randint(1, 12, (B,), generator=rng).to(device)
                for src_len in (_randint(rng, 2, 12), lengths):
                    _check_position(learner, reference, h, W_p, v_p, src_len, device)
    h, W_p, v_p = (t.cpu() for t in (h, W_p, v_p))
    expect_device_agnostic(learner, "predict_position", h, W_p, v_p, 7)
    expect_device_agnostic(learner, "predict_position", h, W_p, v_p, lengths.cpu())
    # Lengths often stay on the CPU (pack_padded_sequence wants them there) while the states are on a GPU.
    expect_accepts_cpu_tail(learner, "predict_position", (h, W_p, v_p), (lengths.cpu(),), LENGTHS_DEVICE)


@points(1, part="predict_position")
def test_predict_position_range_and_gradients(learner, reference, rng):
    """Does p stay in [0, S - 1] of its own row, as the reference's, with the right gradients for s_t, W_p, v_p?"""
    B, H, dp = 6, 5, 4
    lengths = torch.tensor([1, 2, 7, 7, 10, 3])
    for scale in (1.0, 50.0):
        h, W_p, v_p = _randn(rng, B, H, scale=scale), _randn(rng, dp, H), _randn(rng, dp)
        p = _result(_call(learner.predict_position, h, W_p, v_p, lengths), "predict_position", (B,), F32, "cpu",
                    "p (B,)")
        expect(bool(torch.isfinite(p).all() and (p >= 0).all() and (p <= (lengths - 1) * (1 + 1e-6)).all()),
               "Some p lie outside [0, S - 1] of their row: p_t = (S - 1) * sigmoid(...), with each row's "
               "own length S.")
        expect(bool((p[0] == 0).all()), "A row of length 1 has a single position, 0: p must be exactly 0 there.")
        _check_position(learner, reference, h, W_p, v_p, lengths)
    args = (_randn(rng, 3, H, dtype=F64), _randn(rng, dp, H, dtype=F64), _randn(rng, dp, dtype=F64))
    lengths, g = torch.tensor([4, 9, 6]), _randn(rng, 3, dtype=F64)
    _check_position(learner, reference, *args, lengths)
    res = learner_grads(learner, "predict_position", *args, lengths, cotangents=(g,), what="predict_position")
    _expect_arg_grads(res, reference_grads(reference.predict_position, (*args, lengths), (g,)),
                      ("the state", "W_p", "v_p"))


# --- Part 7: local attention weights (4 points) -------------------------------------------

HALF_UP_HINT = ("A p halfway between two positions rounds up here: round as torch.round does, halves to the even "
                "integer (2.5 gives 2, 3.5 gives 4), not floor(p + 0.5).")
EDGE_HINT = ("Rows whose window reaches an end of the sequence are wrong: the window must be cut short at "
             "positions 0 and S - 1 (a slice with a negative start wraps around).")
LOCAL_GENERIC = ("The weights differ from softmax over the window of the scores, times exp(-(j - p)^2 / "
                 "(2 sigma^2)) with sigma = D / 2.")


def _local(scores, p, D, mask=None, *, sigma=None, gauss_at="p", window_at="round", softmax_over="window",
           gauss=True, renorm=False, extra=0):
    """Local-p weights and their typical wrong variants, in float64."""
    s, p = _cpu64(scores, p)
    T = s.shape[-1]
    pos = torch.arange(T, dtype=F64)
    centre = {"round": torch.round(p), "half_up": torch.floor(p + 0.5), "p": p}[window_at]
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


def _local_mistakes(scores, p, D, mask):
    def v(**kw):
        m = kw.pop("mask", mask)
        return lambda: _local(scores, p, D, m, **kw)
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
        (HALF_UP_HINT, v(window_at="half_up")),
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
             v(mask=~mask.cpu())),
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


def _edge_only(w, expected, p, D, device):
    """Whether `w` is right where the window lies inside the sequence and wrong only where it reaches an end."""
    T, r = expected.shape[-1], torch.round(p.cpu())
    inner = (r - D >= 0) & (r + D <= T - 1)
    return bool(inner.any() and (~inner).any() and close(w.cpu()[inner], expected.cpu()[inner], device))


def _check_local(learner, reference, scores, p, D, mask, device="cpu", problem=None):
    """The learner's weights; fail with a diagnosis (`problem` first among the generic ones) unless
    they are the reference's."""
    kwargs = {} if mask is None else {"mask": mask}
    w = _call(learner.local_attention_weights, scores, p, D, **kwargs)
    expected = reference.local_attention_weights(scores, p, D, **kwargs)
    _result(w, LOCAL, expected.shape, expected.dtype, device, "its weights (B, S)")
    if not close(w, expected, device):
        hint = diagnose(w, _local_mistakes(scores, p, D, mask), None, same=_same(F64))
        edge = EDGE_HINT if _edge_only(w, expected, p, D, device) else None
        raise Hint(hint or edge or problem or LOCAL_GENERIC)
    return w


@points(1, part="local_attention_weights")
def test_local_attention_matches_reference(learner, reference, rng, devices):
    """Without a mask, are the weights the reference's for several D, windows cut at both ends; run on a GPU?"""
    for device in devices:
        for dtype in DTYPES:
            for B, T, D in [(4, 9, 2), (3, 7, 1), (3, 12, 3)]:
                scores = _randn(rng, B, T, dtype=dtype, device=device)
                p = _positions(rng, B, T, D, dtype).to(device)
                _check_local(learner, reference, scores, p, D, None, device)
    scores, p = _randn(rng, 4, 9), _positions(rng, 4, 9, 2)
    expect_device_agnostic(learner, LOCAL, scores, p, 2)
    expect_device_agnostic(learner, LOCAL, scores, p, 2, mask=_local_mask(rng, p, 9))


def _window_problem(w, window, inside, mask):
    """What is wrong with local weights `w` as a property (most telling first), or None."""
    if not bool(torch.isfinite(w).all()):
        return (f"`{LOCAL}` returns NaN or infinite weights: fill the scores outside the window with -inf "
                "and use torch.softmax.")
    if not bool((w[~window] == 0).all()):
        return ("Positions outside the window |j - round(p)| <= D must get a weight of exactly 0 (fill their "
                "scores with -inf before the softmax).")
    if mask is not None and not bool((w[~mask] == 0).all()):
        return "Padded positions (mask False) must get a weight of exactly 0: they are outside the window."
    if not bool((w[inside] > 0).all()):
        return ("Some real positions inside the window get no weight: the window is |j - round(p)| <= D, "
                "both ends included, 2D + 1 positions (fewer at the ends of the sequence).")
    if not bool((w.sum(-1) <= 1 + 1e-5).all()):
        return ("The weights of a row sum to more than 1: a softmax over the window times a Gaussian factor "
                "of at most 1 cannot.")
    return None


# Centres exactly halfway between two positions: torch.round takes the even one (2.5 -> 2, 5.5 -> 6,
# 0.5 -> 0, 8.5 -> 8), floor(p + 0.5) the upper one, a window one position off in rows 0, 2 and 4.
HALVES = (2.5, 5.5, 0.5, 7.5, 8.5)


@points(1, part="local_attention_weights")
def test_local_attention_window(learner, reference, rng):
    """Are the weights right, 0 outside the window (p at halves rounded to even) and at padding, positive inside?"""
    B, T, D = 5, 11, 2
    scores, p = _randn(rng, B, T), _positions(rng, B, T, D)
    mask = _local_mask(rng, p, T)
    window = (torch.arange(T) - torch.round(p).unsqueeze(-1)).abs() <= D
    halves = torch.tensor(HALVES)
    cases = ((p, None, window), (p, mask, window),
             (halves, None, (torch.arange(T) - torch.round(halves).unsqueeze(-1)).abs() <= D))
    for p, m, window in cases:
        w = _result(_call(learner.local_attention_weights, scores, p, D, **({} if m is None else {"mask": m})),
                    LOCAL, (B, T), F32, "cpu", "its weights (B, S)")
        problem = _window_problem(w, window, window if m is None else window & m, m)
        _check_local(learner, reference, scores, p, D, m, problem=problem)
        expect(problem is None, problem)


@points(1, part="local_attention_weights")
def test_local_attention_mask(learner, reference, rng):
    """With a mask, do the weights agree with the reference, padded positions being outside the window?"""
    for dtype in DTYPES:
        for B, T, D in [(4, 8, 2), (3, 10, 3)]:
            scores = _randn(rng, B, T, dtype=dtype)
            p = _positions(rng, B, T, D, dtype)
            _check_local(learner, reference, scores, p, D, _local_mask(rng, p, T))


@points(1, part="local_attention_weights")
def test_local_attention_gradients(learner, reference, rng):
    """Do gradients reach the scores and the real-valued p, and match the reference's?"""
    B, T, D = 4, 9, 2
    scores, p = _randn(rng, B, T, dtype=F64), _positions(rng, B, T, D, F64)
    mask = _local_mask(rng, p, T)
    for m in (None, mask):
        _check_local(learner, reference, scores, p, D, m)
    g = _randn(rng, B, T, dtype=F64)
    res = learner_grads(learner, LOCAL, scores, p, D, mask=mask, cotangents=(g,), what=LOCAL)
    gp = _arg_grads(res, 2)[1]
    expect(isinstance(gp, torch.Tensor) and gp.is_floating_point() and bool(gp.abs().sum() > 0),
           "No gradient reaches p: the Gaussian factor must use the real-valued p (a rounded p, a "
           "detached p, or a number taken out with .item(), has no gradient).")
    _expect_arg_grads(res, reference_grads(reference.local_attention_weights, (scores, p, D), (g,), mask=mask),
                      ("the scores", "p"))
