"""Hidden tests for exercise 04_self_attention: a self-attention layer, the sinusoidal table, a
positional-encoding module and rotary embeddings.

Each check compares the learner's code (through the `learner` proxy) with the reference on
fresh random inputs; modules are graded holding the reference's weights (`learner_module`).
A property the chapter teaches (permutation equivariance, relative positions, lengths kept)
is checked on inputs where the values are checked too, so that a function that has only the
property earns nothing. A wrong result is explained by the typical mistake it matches.

Parts stay apart: `SelfAttention` calls the locked `scaled_dot_product_attention` only, and
`PositionalEncoding` is graded holding the reference's table, so a wrong `sinusoidal_encoding`
(part 2) costs part 3 nothing; where the learner's part 2 cannot even build the sinusoidal
table, part 3 is graded on the learned kind, whose forward is the same.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from autograder.hidden.support import (DEVICE_ERRORS, FIXED_DEVICE_HINT, HALF, Hint, close, diagnose, expect,
                                       expect_accepts_cpu_tail, expect_device_agnostic, expect_grads, learner_grads,
                                       learner_module, module, pair, points, random_mask, tensor, vjp)
from autograder.isolation.errors import LearnerError, NotImplementedRemote

F32, F64 = torch.float32, torch.float64
SA, SIN, PE, ROPE = "SelfAttention", "sinusoidal_encoding", "PositionalEncoding", "apply_rope"


def _randn(rng, *shape, dtype=F32, scale=1.0, device="cpu"):
    return (torch.randn(*shape, generator=rng, dtype=F64) * scale).to(device, dtype)


def _cpu64(*xs):
    return tuple(None if x is None else x.detach().cpu().double() for x in xs)


@contextmanager
def _gpu_hint(name):
    """A learner's error that mixes devices (on a GPU) gets the hint naming that mistake."""
    try:
        yield
    except LearnerError as exc:
        expect(not any(s in exc.message for s in DEVICE_ERRORS), FIXED_DEVICE_HINT.format(name))
        raise


def _same(dtype):
    """How a result of `dtype` is matched against a typical mistake's (computed in float64)."""
    if dtype in HALF:
        return lambda a, b: close(a, b.to(a.dtype))
    return lambda a, b: close(a, b, rtol=1e-3, atol=1e-4)


# --- Part 1: a self-attention layer (8 points) ----------------------------------------------

SA_GENERIC = ("`SelfAttention`'s weights differ from softmax(Q K^T / sqrt(d_k)) with Q = x W^Q and "
              "K = source W^K (source = context if given, else x): use self.W_q, self.W_k and the "
              "scaled_dot_product_attention of the setup cell.")
SA_OUT_GENERIC = ("`SelfAttention`'s weights are right but its output is not weights @ V, with "
                  "V = self.W_v(source) (source = context if given, else x).")
QK_SWAPPED = ("The query and key projections are swapped: the queries are self.W_q(x), the keys "
              "self.W_k(source).")
NO_SCALE = ("The scores are not divided by sqrt(d_k): pass the projected q, k, v to the setup cell's "
            "scaled_dot_product_attention, which scales them.")
BY_D_MODEL = ("The scores are divided by sqrt(d_model), not by sqrt(d_k), the width of the queries and keys "
              "after projection.")
BY_D_K = "The scores are divided by d_k instead of sqrt(d_k)."
CONTEXT_IGNORED = ("Cross-attention ignores the context: when `context` is given, the keys and values must be "
                   "computed from it (self.W_k(context), self.W_v(context)), not from x.")
QUERIES_FROM_CONTEXT = ("The roles are reversed: the queries come from x, the keys and values from `context` "
                        "(the weights are (B, Tq, Tk)).")
CROSS_LENGTH = ("`SelfAttention` fails when the context is longer or shorter than x: the keys and the values must "
                "both come from the context, the queries from x.")
VALUES_FROM_X = "With a context, the values must come from it too: V = self.W_v(context), not self.W_v(x)."
VALUES_UNPROJECTED = "The values are not projected: V = self.W_v(source)."
VALUES_WITH_W_K = "The values are projected with W_k: V = self.W_v(source)."
MASK_INVERTED = ("The mask is inverted: True means the query MAY attend to that key, False means its weight "
                 "must be 0. Pass it to scaled_dot_product_attention as it is.")
MASK_IGNORED = "The mask is ignored: pass `mask` on to scaled_dot_product_attention."
OUT_ORDER = "`SelfAttention` returns its results in the wrong order: return (out, weights)."


class _Attn:
    """A self-attention layer with random weights: the learner's (a handle, on `device` in `dtype`)
    and the reference's (float64, on the CPU), holding the same weights."""

    def __init__(self, learner, reference, rng, d_model, d_k=None, d_v=None, device="cpu", dtype=F32):
        ref = reference.SelfAttention(d_model, d_k, d_v)
        ref.load_state_dict({n: _randn(rng, *p.shape, scale=d_model ** -0.5) for n, p in ref.state_dict().items()})
        self.h = learner_module(learner, SA, ref, d_model, d_k, d_v)
        self.h.to(device, dtype)
        self.ref = ref.double()
        self.reference, self.learner, self.device, self.dtype = reference, learner, device, dtype
        self.d_model, self.d_k, self.d_v = d_model, ref.d_k, ref.d_v

    def inputs(self, rng, B, Tq, Tk=None):
        """x (B, Tq, d_model), and a context (B, Tk, d_model) when Tk is given."""
        x = _randn(rng, B, Tq, self.d_model, dtype=self.dtype, device=self.device)
        c = None if Tk is None else _randn(rng, B, Tk, self.d_model, dtype=self.dtype, device=self.device)
        return x, c

    def expected(self, x, mask=None, context=None):
        """The reference's (out, weights) in float64 on the CPU."""
        x, c = _cpu64(x, context)
        with torch.no_grad():
            return self.ref(x, None if mask is None else mask.cpu(), c)

    def run(self, x, mask=None, context=None):
        """The learner's (out, weights), checked for type, order, shapes, dtype and device."""
        args = (x,) if mask is None and context is None else (x, mask) if context is None else (x, mask, context)
        try:
            with _gpu_hint(SA):
                result = self.h(*args)
        except LearnerError:
            if context is not None and context.shape[1] != x.shape[1]:
                self.diagnose_cross(x)
            raise
        out, w = pair(result, SA)
        B, Tq = x.shape[:2]
        Tk = Tq if context is None else context.shape[1]
        if isinstance(w, torch.Tensor) and isinstance(out, torch.Tensor):
            shapes = (tuple(out.shape), tuple(w.shape))
            expect(shapes != ((B, Tq, Tk), (B, Tq, self.d_v)) or Tk == self.d_v, OUT_ORDER)
            expect(context is None or Tq == Tk or tuple(w.shape) != (B, Tq, Tq), CONTEXT_IGNORED)
            expect(context is None or Tq == Tk or tuple(w.shape) != (B, Tk, Tq), QUERIES_FROM_CONTEXT)
        tensor(out, SA, shape=(B, Tq, self.d_v), dtype=x.dtype, device=self.device, what="the output (B, Tq, d_v)")
        tensor(w, SA, shape=(B, Tq, Tk), dtype=x.dtype, device=self.device, what="the weights (B, Tq, Tk)")
        return out, w

    def diagnose_cross(self, x):
        """A call with a context of another length than x failed: name the mistake that a context of
        x's length shows, if any."""
        gen = torch.Generator().manual_seed(0)
        context = torch.randn(x.shape, generator=gen, dtype=F64).to(x.device, x.dtype)
        try:
            self.check(x, None, context)
        except (LearnerError, NotImplementedRemote):
            return
        raise Hint(CROSS_LENGTH)

    def weight_mistakes(self, x, mask, context):
        x, c = _cpu64(x, context)
        src = x if c is None else c
        m = None if mask is None else mask.cpu()
        Wq, Wk, Wv = (getattr(self.ref, n).weight.detach() for n in ("W_q", "W_k", "W_v"))
        sdpa = self.reference.scaled_dot_product_attention
        q, k, v = x @ Wq.T, src @ Wk.T, src @ Wv.T
        s = math.sqrt(self.d_k)
        table = [(QK_SWAPPED, lambda: sdpa(x @ Wk.T, src @ Wq.T, v, m)[1]),
                 (NO_SCALE, lambda: sdpa(q * s, k, v, m)[1])]
        if self.d_model != self.d_k:
            table.append((BY_D_MODEL, lambda: sdpa(q * s / math.sqrt(self.d_model), k, v, m)[1]))
        table.append((BY_D_K, lambda: sdpa(q / s, k, v, m)[1]))
        if c is not None and c.shape == x.shape:
            table.append((CONTEXT_IGNORED, lambda: sdpa(q, x @ Wk.T, v, m)[1]))
        if m is not None:
            table += [(MASK_INVERTED, lambda: sdpa(q, k, v, ~m)[1]), (MASK_IGNORED, lambda: sdpa(q, k, v)[1])]
        return table

    def output_mistakes(self, x, w, context):
        x, c, w = _cpu64(x, context, w)
        src = x if c is None else c
        Wk, Wv = self.ref.W_k.weight.detach(), self.ref.W_v.weight.detach()
        table = []
        if c is not None and c.shape == x.shape:
            table.append((VALUES_FROM_X, lambda: w @ (x @ Wv.T)))
        if self.d_v == self.d_model:
            table.append((VALUES_UNPROJECTED, lambda: w @ src))
        if self.d_v == self.d_k:
            table.append((VALUES_WITH_W_K, lambda: w @ (src @ Wk.T)))
        return table

    def judge(self, got, expected, x, mask=None, context=None):
        """Fail with the likely mistake unless the learner's (out, weights) are the reference's."""
        (out, w), (e_out, e_w) = got, expected
        dtype = x.dtype
        if not close(w, e_w.to(dtype), self.device):
            raise Hint(diagnose(w, self.weight_mistakes(x, mask, context), SA_GENERIC, same=_same(dtype)))
        if not close(out, e_out.to(dtype), self.device):
            raise Hint(diagnose(out, self.output_mistakes(x, w, context), SA_OUT_GENERIC, same=_same(dtype)))

    def check(self, x, mask=None, context=None):
        got = self.run(x, mask, context)
        self.judge(got, self.expected(x, mask, context), x, mask, context)
        return got


@points(1, part="self_attention")
def test_self_attention_matches_reference(learner, reference, rng):
    """Without a mask, do the output and weights agree with the reference, given the same weights?"""
    for d_model, d_k, d_v, B, T in [(8, None, None, 2, 5), (12, 6, 10, 3, 4), (6, 9, 5, 1, 7)]:
        case = _Attn(learner, reference, rng, d_model, d_k, d_v)
        case.check(case.inputs(rng, B, T)[0])


@points(1, part="self_attention")
def test_self_attention_scaling(learner, reference, rng):
    """Are the scores scaled by sqrt(d_k), the width of the projected queries and keys, not of d_model?"""
    case = _Attn(learner, reference, rng, 32, 4, 8)
    case.check(case.inputs(rng, 2, 6)[0])


@points(2, part="self_attention")
def test_self_attention_cross_attention(learner, reference, rng):
    """Given a context, do the keys and values come from it (Tq != Tk, d_k != d_v) and agree with the reference?"""
    case = _Attn(learner, reference, rng, 8, 6, 5)
    for B, Tq, Tk in [(2, 3, 7), (3, 5, 2), (2, 4, 4)]:
        x, c = case.inputs(rng, B, Tq, Tk)
        case.check(x, None, c)
        mask = random_mask(rng, (B, 1, Tk))
        case.check(x, mask, c)


@points(1, part="self_attention")
def test_self_attention_masks(learner, reference, rng):
    """With (T, T), (B, 1, T) and (B, T, T) masks, are masked weights 0, and does a query with no allowed key give 0?"""
    case = _Attn(learner, reference, rng, 8, 4, 6)
    B, T = 3, 5
    x, _ = case.inputs(rng, B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for mask in (causal, random_mask(rng, (B, 1, T)), random_mask(rng, (B, T, T), fully_masked=2)):
        out, w = case.check(x, mask)
        full = mask.expand(B, T, T)
        expect(bool((w[~full] == 0).all()), "Weights where the mask is False must be exactly 0.")
        dead = ~full.any(-1)
        expect(bool((out[dead] == 0).all()), "A query with no allowed key must give an output of exactly 0.")


@points(1, part="self_attention")
def test_self_attention_gradients(learner, reference, rng):
    """Do the gradients for W_q, W_k, W_v, x and the context match, zero for a query with no allowed key?"""
    case = _Attn(learner, reference, rng, 6, 4, 5, dtype=F64)
    B, Tq, Tk = 2, 3, 4
    for context in (False, True):
        x, c = case.inputs(rng, B, Tq, Tk if context else None)
        Tk_ = Tk if context else Tq
        mask = random_mask(rng, (B, Tq, Tk_), fully_masked=1)
        case.check(x, mask, c)
        cot = (_randn(rng, B, Tq, case.d_v, dtype=F64), _randn(rng, B, Tq, Tk_, dtype=F64))
        args = (x, mask) if c is None else (x, mask, c)
        res = learner_grads(learner, case.h, *args, cotangents=cot, params=True, what=SA)
        leaves = {n: p for n, p in case.ref.named_parameters()}
        xr = x.detach().clone().requires_grad_(True)
        cr = None if c is None else c.detach().clone().requires_grad_(True)
        out = case.ref(xr, mask, cr)
        inputs = [*leaves.values(), xr] + ([] if cr is None else [cr])
        expected = vjp(out, inputs, cot, allow_unused=True)
        names = [*leaves, "x"] + ([] if cr is None else ["the context"])
        got = [res.param_grads.get(n) for n in leaves] + list(res.arg_grads[:1])
        if cr is not None:
            got.append(res.arg_grads[2] if len(res.arg_grads) > 2 else None)
        expect_grads(got, expected, names,
                     hint="The gradients differ from the reference's: is part of the computation detached, done "
                          "outside autograd, or are the weights copied instead of used through the layers?")


@points(1, part="self_attention")
def test_self_attention_permutation_equivariance(learner, reference, rng):
    """Without positions, does shuffling the tokens shuffle the outputs and weights alike (and are they right)?"""
    case = _Attn(learner, reference, rng, 8, 6, 8)
    B, T = 2, 6
    x, _ = case.inputs(rng, B, T)
    out, w = case.check(x)
    perm = torch.randperm(T, generator=rng)
    out_p, w_p = case.check(x[:, perm])
    expect(close(out_p, out[:, perm]) and close(w_p, w[:, perm][:, :, perm]),
           "Shuffling the tokens must shuffle the outputs (and the rows and columns of the weights) the same "
           "way: self-attention without positions cannot see order.")


@points(1, part="self_attention")
def test_self_attention_dtypes_and_devices(learner, reference, rng, devices):
    """Does it work in float64, float16 and bfloat16, on every device, creating nothing on a fixed one?"""
    for device in devices:
        for dtype in (F32, F64):
            case = _Attn(learner, reference, rng, 8, 4, 6, device=device, dtype=dtype)
            x, c = case.inputs(rng, 2, 3, 5)
            case.check(x, random_mask(rng, (2, 3, 5), fully_masked=1).to(device), c)
    for dtype in HALF:
        case = _Attn(learner, reference, rng, 8, 4, 6, dtype=dtype)
        x, _ = case.inputs(rng, 2, 4)
        case.check(x, random_mask(rng, (2, 4, 4), fully_masked=1))
    case = _Attn(learner, reference, rng, 8, 4, 6)
    x, c = case.inputs(rng, 2, 3, 5)
    mask = random_mask(rng, (2, 3, 5))
    case.check(x, mask, c)
    on_meta = module(learner.SelfAttention(8, 4, 6), SA)
    on_meta.to("meta")
    expect_device_agnostic(learner, on_meta, x, mask, c)


# --- Part 2: the sinusoidal encoding (4 points) ---------------------------------------------

SIN_GENERIC = ("`sinusoidal_encoding` differs from PE[p, 2i] = sin(p / base^(2i/d_model)), "
               "PE[p, 2i+1] = cos(p / base^(2i/d_model)).")
SIN_COS_SWAPPED = "sin and cos are swapped: even columns (2i) hold the sines, odd columns (2i+1) the cosines."
NOT_INTERLEAVED = ("The sines and cosines are in two halves: they must alternate, sin in column 2i and cos in "
                   "column 2i+1 of the same frequency.")
EXPONENT_I = ("The exponent uses i instead of 2i: the pair (2i, 2i+1) has the frequency 1 / base^(2i/d_model), "
              "so frequencies run from 1 down to almost 1/base.")
EXPONENT_COLUMN = ("The cosine columns use their own column index in the exponent: columns 2i and 2i+1 share one "
                   "frequency, 1 / base^(2i/d_model).")
EXPONENT_D_MINUS_1 = "The exponent divides by d_model - 1: the frequency of pair i is 1 / base^(2i/d_model)."
MULTIPLIED = "The positions are multiplied by base^(2i/d_model) instead of divided by it."
FROM_ONE = "The positions start at 1: row p of the table is position p, starting at 0."
BASE_IGNORED = "`base` is ignored: use the argument, not a fixed 10000."


def _sin_table(L, d, base, *, expo="2i", swap=False, halves=False, start=0):
    """A sinusoidal table in float64 with one of the typical mistakes."""
    pos = torch.arange(start, start + L, dtype=F64).unsqueeze(-1)  # (L, 1)
    i = torch.arange(d // 2, dtype=F64)
    if expo == "column":
        even, odd = pos / base ** (2 * i / d), pos / base ** ((2 * i + 1) / d)
    else:
        e = {"2i": 2 * i / d, "i": i / d, "d-1": 2 * i / max(d - 1, 1), "mul": -2 * i / d}[expo]
        even = odd = pos / base ** e  # (L, d/2)
    a, b = (even.cos(), odd.sin()) if swap else (even.sin(), odd.cos())
    return torch.cat([a, b], -1) if halves else torch.stack([a, b], -1).flatten(-2)  # (L, d)


def _sin_mistakes(L, d, base):
    table = [(SIN_COS_SWAPPED, lambda: _sin_table(L, d, base, swap=True)),
             (NOT_INTERLEAVED, lambda: _sin_table(L, d, base, halves=True)),
             (EXPONENT_I, lambda: _sin_table(L, d, base, expo="i")),
             (EXPONENT_COLUMN, lambda: _sin_table(L, d, base, expo="column")),
             (EXPONENT_D_MINUS_1, lambda: _sin_table(L, d, base, expo="d-1")),
             (MULTIPLIED, lambda: _sin_table(L, d, base, expo="mul")),
             (FROM_ONE, lambda: _sin_table(L, d, base, start=1))]
    if base != 10000.0:
        table.append((BASE_IGNORED, lambda: _sin_table(L, d, 10000.0)))
    return table


def _sin_atol(L):
    """float32 rounding of the angles grows with the position (about 1e-7 of it)."""
    return 1e-5 + 1.5e-7 * L


def _check_sin(learner, reference, L, d, base=None):
    kwargs = {} if base is None else {"base": base}
    pe = tensor(learner.sinusoidal_encoding(L, d, **kwargs), SIN, shape=(L, d), what="its table")
    expect(pe.dtype == F32, f"`sinusoidal_encoding` must return a float32 table, not {pe.dtype}.")
    expected = reference.sinusoidal_encoding(L, d, **kwargs)
    if not close(pe, expected, rtol=1e-4, atol=_sin_atol(L)):
        b = 10000.0 if base is None else float(base)
        raise Hint(diagnose(pe, _sin_mistakes(L, d, b), SIN_GENERIC,
                            same=lambda a, e: close(a, e, rtol=1e-3, atol=1e-4 + _sin_atol(L))))
    return pe


@points(2, part="sinusoidal_encoding")
def test_sinusoidal_matches_reference(learner, reference, rng):
    """Is the table right (sines in even columns, cosines in odd ones, the right frequencies), float32?"""
    for L, d in [(16, 8), (50, 32), (7, 2), (33, 6)]:
        _check_sin(learner, reference, L, d)


@points(1, part="sinusoidal_encoding")
def test_sinusoidal_base_and_long_tables(learner, reference, rng):
    """Does it honour `base`, and stay right (to float32 rounding) for tables thousands of positions long?"""
    for L, d, base in [(20, 8, 100.0), (12, 4, 3.5)]:
        _check_sin(learner, reference, L, d, base)
    _check_sin(learner, reference, 3000, 64)


@points(1, part="sinusoidal_encoding")
def test_sinusoidal_odd_width(learner, reference, rng):
    """Does an odd d_model raise a ValueError, while an even one gives the right table?"""
    _check_sin(learner, reference, 40, 10)
    for d in (7, 1):
        try:
            learner.sinusoidal_encoding(10, d)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", f"An odd d_model must raise a ValueError, not a {exc.etype}.")
            continue
        raise Hint("`sinusoidal_encoding` accepts an odd d_model: raise a ValueError (sines and cosines come "
                   "in pairs).")


# --- Part 3: a positional-encoding module (4 points) -----------------------------------------

PE_GENERIC = "`PositionalEncoding` differs from dropout(x + pe[offset : offset + T])."
OFFSET_IGNORED = ("The offset is ignored: the token at index t of x gets the encoding of position offset + t, "
                  "so use pe[offset : offset + T].")
ONE_ROW = "Every token gets the same encoding: token t gets row offset + t of the table, not row offset."
NOT_ADDED = "The encoding is not added: return x + pe[offset : offset + T]."
X_DROPPED = "x is dropped: the encodings are added to the embeddings, x + pe[offset : offset + T]."
X_SCALED = ("x is scaled by sqrt(d_model) here: this module only adds the encodings (the scaling belongs to the "
            "embedding layer).")
NO_MAX_LEN = ("Positions past max_len are accepted: when offset + T > max_len, raise a ValueError naming max_len "
              "(a slice past the end of the table silently returns fewer rows).")
DROPOUT_IN_EVAL = ("Dropout is applied in eval mode: use self.dropout (an nn.Dropout, which module.eval() turns "
                   "off), not F.dropout without training=self.training.")
NO_DROPOUT = "No dropout in training mode: apply self.dropout to the sum x + pe."
DROPOUT_ON_PE = "Dropout must apply to the sum x + pe, not to the encodings alone."


class _PE:
    """A positional-encoding module: the learner's (a handle) holding the reference's table, and the
    reference's table in float64. With kind "sinusoidal", when the learner's part 2 cannot build the
    table, the learned kind stands in (its forward is the same)."""

    def __init__(self, learner, reference, rng, d_model, max_len, kind="learned", dropout=0.0,
                 device="cpu", dtype=F32):
        ref = reference.PositionalEncoding(d_model, max_len, kind=kind, dropout=dropout)
        if kind == "learned":
            ref.load_state_dict({"pe": _randn(rng, max_len, d_model)})
        args = (d_model, max_len)
        if kind == "sinusoidal":
            try:
                self.h = learner_module(learner, PE, ref, *args, kind=kind, dropout=dropout)
            except (LearnerError, NotImplementedRemote, Hint):
                kind = "learned"
        if kind == "learned":
            self.h = learner_module(learner, PE, ref, *args, kind=kind, dropout=dropout)
        self.h.to(device)
        self.table = ref.pe.detach().double()
        self.d_model, self.max_len, self.device, self.dtype = d_model, max_len, device, dtype

    def inputs(self, rng, B, T):
        return _randn(rng, B, T, self.d_model, dtype=self.dtype, device=self.device)

    def expected(self, x, offset=0):
        T = x.shape[-2]
        return _cpu64(x)[0] + self.table[offset: offset + T]

    def mistakes(self, x, offset):
        x, T, pe = _cpu64(x)[0], x.shape[-2], self.table
        table = [(OFFSET_IGNORED, lambda: x + pe[:T]) if offset else (None, None),
                 (ONE_ROW, lambda: x + pe[offset]) if T > 1 else (None, None),
                 (NOT_ADDED, x), (X_DROPPED, lambda: pe[offset: offset + T].expand_as(x)),
                 (X_SCALED, lambda: x * math.sqrt(self.d_model) + pe[offset: offset + T])]
        return [(h, m) for h, m in table if h is not None]

    def run(self, x, offset=None):
        with _gpu_hint(PE):
            out = self.h(x) if offset is None else self.h(x, offset)
        return tensor(out, PE, shape=x.shape, dtype=x.dtype, device=self.device, what="x plus the encodings")

    def check(self, x, offset=None):
        out = self.run(x, offset)
        if not close(out, self.expected(x, offset or 0).to(x.dtype), self.device):
            raise Hint(diagnose(out, self.mistakes(x, offset or 0), PE_GENERIC, same=_same(x.dtype)))
        return out


@points(1, part="positional_encoding")
def test_positional_encoding_matches_reference(learner, reference, rng):
    """Does it return x + pe[offset : offset + T], for offsets 0 and more, given the same table?"""
    case = _PE(learner, reference, rng, 8, 20)
    for B, T, offset in [(2, 5, None), (3, 4, 7), (1, 6, 0), (2, 1, 13)]:
        case.check(case.inputs(rng, B, T), offset)


@points(1, part="positional_encoding")
def test_positional_encoding_decoding_and_max_len(learner, reference, rng):
    """Does one token at a time (offset=t) match the whole sequence, up to max_len, and past it raise a ValueError?"""
    max_len = 9
    case = _PE(learner, reference, rng, 6, max_len, kind="sinusoidal")
    x = case.inputs(rng, 2, max_len)
    full = case.check(x)
    for t in range(max_len):
        step = case.check(x[:, t: t + 1], t)
        expect(close(step, full[:, t: t + 1]), OFFSET_IGNORED)
    for T, offset in [(3, max_len - 2), (1, max_len), (max_len + 1, 0)]:
        try:
            case.run(case.inputs(rng, 2, T), offset)
        except LearnerError as exc:
            expect(exc.etype == "ValueError", f"Past max_len, raise a ValueError (got a {exc.etype}); "
                                              "check offset + T > max_len before slicing the table.")
            expect("max_len" in exc.message or str(max_len) in exc.message,
                   "The ValueError past max_len must name max_len in its message.")
            continue
        except Hint:
            pass
        raise Hint(NO_MAX_LEN)


@points(1, part="positional_encoding")
def test_positional_encoding_dropout(learner, reference, rng):
    """Is dropout applied to x + pe in training mode only, scaled by 1/(1-p)?"""
    p = 0.5
    case = _PE(learner, reference, rng, 16, 64, dropout=p)
    x = case.inputs(rng, 4, 64)
    case.h.eval()
    out = case.run(x)
    expect(bool((out != 0).all()) or close(out, case.expected(x).float()), DROPOUT_IN_EVAL)
    case.check(x)
    case.check(x[:, 3:9], 3)
    case.h.train()
    out = case.run(x)
    kept = out != 0
    expect(not close(out, case.expected(x).float()), NO_DROPOUT)
    expect(0.35 < kept.double().mean().item() < 0.65, NO_DROPOUT + f" (about {p:.0%} of the entries are zeroed)")
    expect(close(out[kept], case.expected(x).float()[kept] / (1 - p)), DROPOUT_ON_PE)


@points(1, part="positional_encoding")
def test_positional_encoding_kinds_dtypes_devices(learner, reference, rng, devices):
    """With both kinds, does it keep x's dtype (float16 too), pass gradients to x and a learned table, on any device?"""
    for device in devices:
        for kind in ("sinusoidal", "learned"):
            case = _PE(learner, reference, rng, 8, 16, kind=kind, device=device, dtype=F64)
            case.check(case.inputs(rng, 2, 5), 3)
    for dtype in HALF:
        case = _PE(learner, reference, rng, 8, 16, dtype=dtype)
        case.check(case.inputs(rng, 2, 5), 2)
    case = _PE(learner, reference, rng, 6, 10)
    x = case.inputs(rng, 2, 4)
    case.check(x, 5)
    g = _randn(rng, 2, 4, 6)
    res = learner_grads(learner, case.h, x, 5, cotangents=(g,), params=True, what=PE)
    e_pe = torch.zeros(10, 6)
    e_pe[5:9] = g.sum(0)
    expect_grads([res.arg_grads[0] if res.arg_grads else None, res.param_grads.get("pe")], [g, e_pe],
                 ["x", "the learned table pe"],
                 hint="The gradients are wrong: the gradient of x + pe[offset : offset + T] reaches x unchanged "
                      "and rows offset .. offset + T - 1 of a learned table; is the table detached or copied?")
    on_meta = module(learner.PositionalEncoding(6, 10, kind="learned"), PE)
    on_meta.to("meta")
    expect_device_agnostic(learner, on_meta, x, 5)


# --- Part 4: rotary position embeddings (5 points) ---------------------------------------------

ROPE_GENERIC = ("`apply_rope` differs from rotating each pair (x[..., 2i], x[..., 2i+1]) by the angle "
                "position * base^(-2i/d).")
HALF_SPLIT = ("The wrong pairs are rotated: this is the half-split convention (dimension i with i + d/2); here "
              "the pairs are neighbours, (x[..., 2i], x[..., 2i+1]).")
WRONG_DIRECTION = ("The rotation goes the wrong way (the sign of sin): x'_2i = x_2i cos - x_2i+1 sin, "
                   "x'_2i+1 = x_2i sin + x_2i+1 cos.")
ROPE_EXPONENT_I = "The exponent uses i instead of 2i: the pair i turns by position * base^(-2i/d)."
ROPE_SIN_COS = "sin and cos are swapped in the rotation: x'_2i = x_2i cos - x_2i+1 sin."
ROPE_FROM_ONE = "The positions start at 1: by default the T vectors are at positions 0 .. T - 1."
POSITIONS_IGNORED = "`positions` is ignored: the vector at index t is at positions[t], not at t."
ROPE_BASE_IGNORED = "`base` is ignored: use the argument, not a fixed 10000."
ROPE_POSITIONS_DEVICE = ("`apply_rope` would fail on a GPU when `positions` come on the CPU and `x` is on the GPU: "
                         "move the positions to x's device before computing the angles.")
HALF_ANGLES = ("In float16 or bfloat16 the result is wrong: compute the angles (and the rotation) in float32, "
               "then cast the result back to x's dtype.")
F64_ANGLES = ("For a float64 x, the rotation is only as precise as float32: compute the angles (and the rotation) "
              "in float64 when x is float64 (float32 angles are off by 1e-5 and more at positions in the thousands).")


def _rope64(x, positions=None, base=10000.0, *, expo="2i", sign=1.0, pairs="interleaved", swap=False):
    """RoPE in float64 on the CPU, with one of the typical mistakes."""
    x = _cpu64(x)[0]
    T, d = x.shape[-2:]
    pos = torch.arange(T, dtype=F64) if positions is None else positions.cpu().double()
    i = torch.arange(d // 2, dtype=F64)
    angles = pos.unsqueeze(-1) * base ** (-(2 * i if expo == "2i" else i) / d)  # (T, d/2)
    cos, sin = angles.cos(), sign * angles.sin()
    if swap:
        cos, sin = sin, cos
    a, b = (x[..., 0::2], x[..., 1::2]) if pairs == "interleaved" else (x[..., : d // 2], x[..., d // 2:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.stack([ra, rb], -1).flatten(-2) if pairs == "interleaved" else torch.cat([ra, rb], -1)


def _rope_mistakes(x, positions, base):
    b = 10000.0 if base is None else base
    table = [(HALF_SPLIT, lambda: _rope64(x, positions, b, pairs="half")),
             (WRONG_DIRECTION, lambda: _rope64(x, positions, b, sign=-1.0)),
             (ROPE_EXPONENT_I, lambda: _rope64(x, positions, b, expo="i")),
             (ROPE_SIN_COS, lambda: _rope64(x, positions, b, swap=True))]
    T = x.shape[-2]
    if positions is None:
        table.append((ROPE_FROM_ONE, lambda: _rope64(x, torch.arange(1, T + 1), b)))
    else:
        table.append((POSITIONS_IGNORED, lambda: _rope64(x, None, b)))
    if b != 10000.0:
        table.append((ROPE_BASE_IGNORED, lambda: _rope64(x, positions, 10000.0)))
    return table


def _rope_call(learner, x, positions=None, base=None):
    kwargs = {} if base is None else {"base": base}
    args = (x,) if positions is None else (x, positions)
    return learner.apply_rope(*args, **kwargs)


def _check_rope(learner, x, positions=None, base=None, device="cpu"):
    """The learner's rotated x, checked against float64 RoPE (float64 inputs are held to float32's
    tolerance: angles in float32 are allowed)."""
    with _gpu_hint(ROPE):
        r = _rope_call(learner, x, positions, base)
    r = tensor(r, ROPE, shape=x.shape, dtype=x.dtype, device=device,
               what="the rotated tensor")
    if x.dtype in HALF:
        expected = _rope64(x.float(), positions, 10000.0 if base is None else base).to(x.dtype)
        ok = close(r, expected)
    else:
        expected = _rope64(x, positions, 10000.0 if base is None else base)
        ok = close(r, expected, device, rtol=1e-4, atol=1e-5)
    if not ok:
        generic = HALF_ANGLES if x.dtype in HALF else ROPE_GENERIC
        raise Hint(diagnose(r, _rope_mistakes(x, positions, base), generic, same=_same(x.dtype)))
    return r


@points(2, part="apply_rope")
def test_rope_matches_reference(learner, reference, rng):
    """Are the neighbouring pairs rotated by position * base^(-2i/d), counter-clockwise, for any leading shape?"""
    for shape, dtype in [((5, 8), F32), ((2, 6, 4), F32), ((2, 3, 7, 16), F64), ((1, 2), F64)]:
        _check_rope(learner, _randn(rng, *shape, dtype=dtype))
    _check_rope(learner, _randn(rng, 2, 5, 6), base=100.0)


@points(1, part="apply_rope")
def test_rope_positions(learner, reference, rng):
    """Given positions (in any order, far from 0), is each vector rotated by the angle of its own position?"""
    x = _randn(rng, 2, 2, 5, 8)
    _check_rope(learner, x, torch.tensor([7, 0, 300, 3, 42]))
    _check_rope(learner, x[..., :1, :], torch.tensor([11]))


@points(1, part="apply_rope")
def test_rope_relative_positions_and_norms(learner, reference, rng):
    """Does it keep every vector's length, and does a rotated query-key score depend only on m - n?"""
    d = 16
    q, k = _randn(rng, d, dtype=F64), _randn(rng, d, dtype=F64)
    pos = torch.tensor([0, 3, 9, 20, 101])
    rq = _check_rope(learner, q.expand(len(pos), d).clone(), pos)
    rk = _check_rope(learner, k.expand(len(pos), d).clone(), pos)
    # The values are checked above; the properties below are asked of positions never checked for values.
    for shift in (17, 1000):
        sq, sk = (tensor(_rope_call(learner, t.expand(len(pos), d).clone(), pos + shift), ROPE, shape=(len(pos), d),
                         dtype=F64, what="the rotated tensor") for t in (q, k))
        expect(close(sq.norm(dim=-1), q.norm().expand(len(pos)), rtol=1e-5, atol=1e-5)
               and close(sk.norm(dim=-1), k.norm().expand(len(pos)), rtol=1e-5, atol=1e-5),
               "A rotation keeps lengths: the norm of each vector must not change, at any position.")
        expect(close(sq @ sk.T, rq @ rk.T, rtol=1e-4, atol=2e-3),
               "The score of a rotated query at m with a rotated key at n must depend only on m - n: shifting "
               "both positions by the same amount must not change it.")
    g = _randn(rng, len(pos), d, dtype=F64)
    res = learner_grads(learner, ROPE, q.expand(len(pos), d).clone(), pos, cotangents=(g,), what=ROPE)
    # RoPE is a rotation, so its gradient is the same rotation backwards. (Compared at float32's tolerance, as
    # the values are: whether float64 angles are float64 is test_rope_dtypes_and_devices's question.)
    expect_grads(res.arg_grads[:1], [_rope64(g, -pos).float()], ["x"],
                 hint="The rotation is right but its gradient is not: is part of it computed outside autograd?")


@points(1, part="apply_rope")
def test_rope_dtypes_and_devices(learner, reference, rng, devices):
    """Are the angles float32 for float16 and bfloat16 and float64 for float64, thousands of positions far, on any
    device?"""
    for dtype in HALF:
        _check_rope(learner, _randn(rng, 2, 4, 8, dtype=dtype))
        _check_rope(learner, _randn(rng, 3, 8, dtype=dtype), torch.tensor([1000, 2047, 3001]))
    # float64 at float64's tolerance: fixed vectors of ones, where float32 angles (rounded by up to 1e-4
    # radians at these positions) miss by far more than that tolerance, whatever the seed.
    far, ones = torch.tensor([1000, 2047, 3001, 4999]), torch.ones(4, 16, dtype=F64)
    with _gpu_hint(ROPE):
        r = tensor(_rope_call(learner, ones, far), ROPE, shape=ones.shape, dtype=F64, what="the rotated tensor")
    exact = _rope64(ones, far)
    if not close(r, exact):
        expect(not close(r, exact, rtol=0.0, atol=5e-3), F64_ANGLES)
        _check_rope(learner, ones, far)  # another mistake, named there
        raise Hint(ROPE_GENERIC)
    for device in devices:
        x = _randn(rng, 2, 3, 8, dtype=F64, device=device)
        _check_rope(learner, x, device=device)
        _check_rope(learner, x, torch.tensor([9, 2, 5], device=device), device=device)
    x = _randn(rng, 2, 3, 8)
    _check_rope(learner, x)
    expect_device_agnostic(learner, ROPE, x)
    expect_device_agnostic(learner, ROPE, x, torch.tensor([4, 1, 2]))
    # Positions built without device= (torch.arange(T)) reach a GPU model on the CPU.
    expect_accepts_cpu_tail(learner, ROPE, (x,), (torch.tensor([4, 1, 2]),), ROPE_POSITIONS_DEVICE)
