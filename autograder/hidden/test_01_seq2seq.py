"""Hidden tests for exercise 01_seq2seq: a GRU encoder-decoder, teacher forcing, greedy
decoding and beam search.

The learner's modules are built in the worker with weights drawn here (`learner_module`),
so the Encoder and Decoder checks compare with the reference modules holding the same
weights: values, dtypes, devices and gradients.

The later parts (seq2seq_forward, greedy_decode, beam_search) are graded with the
learner's OWN Encoder and Decoder holding those weights: the expected result is the
reference algorithm driven step by step from here, through the proxy, by the learner's
modules. A mistake in a module therefore costs that module's points only; when the modules
are right, the expected result is exactly the reference's. A module that still raises, or
returns wrong shapes, leaves the later parts ungradable: their checks then say so. A wrong
result is explained by the typical mistake it matches (`diagnose`), computed here the same
way.

Every check that looks at a property (a form, a device, the scores) also compares the
result with the expected one, so no trivial output earns its points. The beam-search
checks draw models on which the beam-policy mistakes (refilling the beam, keeping finished
hypotheses in it, not sorting) show exactly where a check targets them and nowhere else, so
each such mistake costs the same checks whatever the seed.

Devices: each part's device check runs the function with its tensors on PyTorch's meta
device (`expect_device_agnostic`), so code that would fail on a GPU fails on a CPU-only
grader too, and runs the value checks on CUDA where present. Half precision applies to the
modules (nn.GRU and nn.GRUCell run in float16 and bfloat16 on the CPU); the later parts
create only integer tensors and are graded in float32/float64.

Float64 is used wherever a result depends on an argmax or a ranking (greedy decoding, beam
search, the ratio-0 path), so that no near-tie can flip a token between two runs of the
same model.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.hidden.support import (HALF, Hint, close, diagnose, expect, expect_close, expect_device_agnostic,
                                       expect_grads, learner_grads, learner_module, pair, points, tensor, vjp)
from autograder.isolation.errors import LearnerError, NotImplementedRemote

PAD, SOS, EOS = 0, 1, 2
F32, F64 = torch.float32, torch.float64
META = torch.device("meta")

# --- hints ---------------------------------------------------------------------------------

_GRADED_WITH_YOURS = "This part is graded with your own Encoder and Decoder (loaded with fixed weights), and "
MODULES_STUB = _GRADED_WITH_YOURS + "`{}` is not implemented yet: finish parts 1 and 2 first."
MODULES_SQUEEZE = (_GRADED_WITH_YOURS + "for a batch of one your Encoder's final state loses its batch axis "
                   "(squeeze()?): fix part 1 first.")
MODULES_RAISED = _GRADED_WITH_YOURS + "`{}` raised {}: {}. Finish parts 1 and 2 first."
MODULES_BROKEN = (_GRADED_WITH_YOURS + "they do not yet return (outputs (B, S, D), final (B, D)) and "
                  "(logits (B, V), hidden (B, D)) of the model's dtype and device: finish parts 1 and 2 first.")
MODULES_DEVICE = (_GRADED_WITH_YOURS + "they would fail on a GPU (they mix their inputs with a tensor created on "
                  "the CPU): fix parts 1 and 2 first.")

ENC = "Encoder.forward"
ENC_SWAPPED = "`Encoder.forward` returns (final, outputs): return (outputs, final), in that order."
ENC_NUM_LAYERS = ("`Encoder.forward`'s final state still has the num_layers axis: nn.GRU returns its last "
                  "state as (1, B, D); return h_n[-1] (or h_n.squeeze(0)), shape (B, D).")
ENC_SQUEEZE = ("With a batch of one, `Encoder.forward`'s final state loses its batch axis: squeeze() drops "
               "every axis of size 1; use h_n[-1] or h_n.squeeze(0).")
ENC_OUTPUTS = ("`Encoder.forward`'s outputs differ from the GRU's hidden states: embed src with self.embedding, "
               "run self.rnn over the embeddings from a zero initial state, and return its outputs unchanged.")
ENC_FIRST = ("`Encoder.forward`'s final state is the state after the FIRST source token: the context is the "
             "LAST state h_T (h_n[-1], which equals outputs[:, -1]).")
ENC_MEAN = ("`Encoder.forward`'s final state is an average of the states: the context is the last state h_T "
            "(h_n[-1]).")
ENC_FINAL = ("`Encoder.forward`'s final state is not the GRU's last hidden state: return h_n[-1] (equal to "
             "outputs[:, -1]).")

DEC = "Decoder.forward"
DEC_SWAPPED = "`Decoder.forward` returns (hidden, logits): return (logits, hidden), in that order."
DEC_GRU_INPUT = ("The GRU cell gets an input of the wrong size: it reads [embedding; context], E + D features; "
                 "is the context concatenated to the embedding (torch.cat along dim=-1)?")
DEC_OUT_INPUT = ("The output layer gets an input of the wrong size: it reads [new hidden; context], 2D features; "
                 "is the context concatenated to the new hidden state (torch.cat along dim=-1)?")
DEC_EMB_CTX = ("The GRU cell's input is concatenated in the wrong order: it must be [embedding; context], "
               "torch.cat([self.embedding(y_prev), context], dim=-1), embedding first.")
DEC_OUT_ORDER = ("The output layer's input is concatenated in the wrong order: it must be [new hidden; context], "
                 "hidden first.")
DEC_OLD_STATE = ("The logits are computed from the hidden state BEFORE the step: feed the output layer the new "
                 "state s_t returned by the GRU cell, concatenated with the context.")
DEC_CTX_STATE = ("The GRU cell is given the context as its state: its state argument must be `hidden` (s_{t-1}); "
                 "the context enters through the input.")
DEC_ZERO_STATE = ("The GRU cell starts from a zero state: pass `hidden` as its second argument, "
                  "self.rnn(x, hidden).")
DEC_SOFTMAX = "`Decoder.forward` returns probabilities: return the raw logits of the output layer, not a softmax."
DEC_LOG_SOFTMAX = "`Decoder.forward` returns log-probabilities: return the raw logits, without log_softmax."
DEC_GENERIC = ("`Decoder.forward` differs from s_t = GRUCell([e(y_prev); c], s_{t-1}), logits = out([s_t; c]): "
               "check what is concatenated, in which order, and which state each layer receives.")

TF_SHAPE = "`seq2seq_forward` must return logits of shape (B, T, V), one row of scores per target position."
TF_STACK = ("`seq2seq_forward` returns (T, B, V): stack the per-step logits along dim=1 so that "
            "logits[:, t] scores tgt[:, t].")
TF_DTYPE = "`seq2seq_forward` changes the dtype: the logits must have the model's dtype."
TF_CURRENT = ("Teacher forcing feeds the CURRENT target token tgt[:, t] at step t: feed the PREVIOUS one, "
              "tgt[:, t - 1] (sos at step 0), so that logits[:, t] predicts tgt[:, t] without seeing it.")
TF_NO_SOS = ("Step 0 feeds tgt[:, 0] instead of `sos`: the first step must read the start token, then step t "
             "reads tgt[:, t - 1].")
TF_IGNORES_SOS = "`seq2seq_forward` ignores its `sos` argument: step 0 must feed `sos`, not the constant SOS."
TF_OWN = ("With teacher_forcing_ratio=1.0 every step must be teacher forced, but the model reads its own "
          "predictions: feed tgt[:, t - 1] when random.random() < teacher_forcing_ratio.")
TF_ZERO_STATE = ("The decoder starts from a zero state: its initial hidden state must be the encoder's "
                 "final state.")
TF_CTX_STATE = ("The context passed at every step changes: it must stay the encoder's final state; don't pass "
                "the decoder's current hidden state as the context.")
TF_NOT_CARRIED = ("The decoder's hidden state is not carried from step to step: feed each step the hidden state "
                  "returned by the previous one.")
TF_PROBS = "`seq2seq_forward` returns probabilities: return the raw logits of every step, without softmax."
TF_LOGPROBS = "`seq2seq_forward` returns log-probabilities: return the raw logits, without log_softmax."
TF_GENERIC = ("`seq2seq_forward` differs from step-by-step teacher forcing with your Encoder and Decoder: "
              "encode src, use its final state as the first hidden state and as the context at every step, "
              "feed sos at step 0 and tgt[:, t - 1] at step t, and stack the logits.")
TF_NOT_DETERMINISTIC = ("With the default teacher_forcing_ratio (1.0) two calls give different logits: every "
                        "step must be teacher forced, so the result must not depend on chance.")
TF_DEFAULT = ("With the default teacher_forcing_ratio, `seq2seq_forward` is not fully teacher forced: the "
              "default ratio must be 1.0.")
FR_TEACHER = ("With teacher_forcing_ratio=0.0 the model is still teacher forced: with probability "
              "1 - ratio it must read its own previous prediction (the argmax of the previous step's logits).")
FR_GENERIC = ("With teacher_forcing_ratio=0.0, `seq2seq_forward` differs from feeding back the argmax of the "
              "previous step's logits (sos at step 0).")
MIX_NEITHER = ("With a teacher_forcing_ratio between 0 and 1, some step fed neither the previous target token "
               "tgt[:, t - 1] nor the previous prediction (the argmax of logits[:, t - 1]).")
MIX_PER_ROW = ("Teacher forcing is decided row by row: draw ONE number random.random() per step for the whole "
               "batch, so that all rows are teacher forced at a step, or none.")
MIX_PER_CALL = ("Teacher forcing is decided once per call: draw a new random.random() before every step "
                "t >= 1, so that one call mixes teacher-forced and free-running steps.")
MIX_NEVER = ("With teacher_forcing_ratio=0.5, every step of every call made the same choice (all teacher forced, "
             "or none): before each step t >= 1, teacher-force when random.random() < teacher_forcing_ratio.")

GR_TYPE = "`greedy_decode` must return a torch tensor of token ids of shape (B, T)."
GR_DTYPE = "`greedy_decode` must return torch.long token ids (the argmax gives them; don't convert to float)."
GR_SHAPE = "`greedy_decode` must return a tensor of shape (B, T), one row per source, with T <= max_len."
GR_DEVICE = "`greedy_decode` returns its tokens on another device than src: create new tensors on src.device."
GR_NO_PAD = ("Rows keep producing tokens after their eos: once a row has produced eos, every later position "
             "of that row must hold `pad`.")
GR_NO_STOP = ("Decoding goes on after every row has produced eos: stop as soon as all rows are finished "
              "(the output is then shorter than max_len).")
GR_ANY_STOP = ("Decoding stops when the FIRST row produces eos: continue until EVERY row has finished, or "
               "max_len steps.")
GR_WITH_SOS = "The output starts with sos: return only the generated tokens, not the start token."
GR_SPECIAL = ("`greedy_decode` ignores its sos/eos/pad arguments: use the values passed, not the constants "
              "SOS, EOS and PAD.")
GR_STEPS = ("`greedy_decode` takes one step too few or too many: run at most max_len decoder steps, one token "
            "per step.")
GR_MAX_LEN = ("`greedy_decode` does not take exactly max_len steps when no row ever produces eos: the output "
              "must then have max_len columns.")
GR_ALL_EOS = ("When every row produces eos at the first step, the output must be that single column of eos: "
              "stop as soon as all rows are finished.")
GR_GENERIC = ("`greedy_decode` differs from feeding back the argmax at every step with your Encoder and "
              "Decoder: start from sos, with the encoder's final state as first hidden state and as context, "
              "keep eos, pad after it, stop when all rows are finished or after max_len steps.")

BM_LIST = "`beam_search` must return a list of (tokens, log_prob) pairs."
BM_TOKENS = "The tokens of each output must be a Python list of ints (use .tolist())."
BM_FLOAT = "The log_prob of each output must be a Python float (use .item() or float())."
BM_TOO_MANY = "`beam_search` returns more than beam_size outputs: return the beam_size best finished ones."
BM_EMPTY = "`beam_search` returns no output at all: every hypothesis ends finished, at eos or at max_len."
BM_DUPLICATE = ("`beam_search` returns the same output twice: the beam starts from ONE hypothesis (the empty "
                "output after sos), not from beam_size copies of it, and each extension is kept once.")
BM_UNSORTED = "The outputs are not sorted best first: sort the finished outputs by log_prob, highest first."
BM_WITH_SOS = "The tokens start with sos: return only the generated tokens, without the start token."
BM_NO_EOS = ("An output shorter than max_len does not end in eos: keep eos as the last token of a finished "
             "output.")
BM_AFTER_EOS = ("An output goes on after eos: a hypothesis that produces eos is finished; move it out of the "
                "beam and never extend it.")
BM_TOO_LONG = "An output is longer than max_len tokens."
BM_NOT_GREEDY = ("With beam_size=1, beam search must give the greedy output: keep the single best extension at "
                 "each step and stop at eos (or after max_len tokens).")
BM_RAW = ("The scores add up raw logits: a hypothesis's score is the sum of the LOG-PROBABILITIES of its "
          "tokens, log_softmax of the logits over the vocabulary.")
BM_LENGTH_NORM = "The scores are divided by the length: the score is the plain sum of log-probabilities."
BM_LAST_ONLY = ("The scores are not accumulated: a hypothesis's score must add the log-probability of each new "
                "token to its prefix's score.")
BM_PROB = "The scores are probabilities: return the sum of log-probabilities (log_softmax), not a product."
BM_SCORE = ("A returned log_prob is not the sum of the log-softmax of your decoder's logits for that output's "
            "tokens (teacher forced from sos).")
BM_POSITIVE = "A returned log_prob is positive: a log-probability is never above 0."
BM_NOT_OUTPUT = "A returned output is not a possible output: check the tokens kept for each hypothesis."
BM_BEST = ("The best output (or its log_prob) differs from the most probable output found by trying every "
           "possible output: check the scores and that no candidate is lost.")
BM_EXHAUSTIVE = ("With a beam wide enough never to drop a hypothesis, the outputs must be exactly all possible "
                 "outputs, ranked by log-probability: some are missing, extra or misranked.")
BM_REFILL = ("The beam is refilled: finished hypotheses leave the beam and are NOT replaced; the next beam holds "
             "only the unfinished ones AMONG the beam_size best extensions, not beam_size unfinished ones.")
BM_COMPETE = ("Finished hypotheses stay in the beam and take its places: move an extension that ends in eos "
              "out of the beam into the finished list; the beam holds only unfinished hypotheses.")
BM_SPECIAL = "`beam_search` ignores its sos/eos arguments: use the values passed, not the constants SOS and EOS."
BM_GENERIC = ("`beam_search` differs from the beam search described in part 5, run with your Encoder and "
              "Decoder: start from one hypothesis, at each step keep the beam_size best extensions of the "
              "beam, move those that end in eos or reach max_len to the finished list (the others form the "
              "next beam), and return the beam_size best finished outputs.")


# --- models --------------------------------------------------------------------------------

def _randint(rng, lo, hi):
    """A random int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=rng))


def _tokens(rng, lo, hi, shape):
    return torch.randint(lo, hi + 1, shape, generator=rng)


class _Model:
    """Reference modules with fresh weights drawn here, and the learner's modules holding them.

    The weights are float32 numbers (stored in float64), so that the learner's modules, built in
    float32 and loaded before they are moved to the model's dtype, hold exactly the same values."""

    def __init__(self, reference, rng, V, E, H, *, scale=1.5, out_scale=1.0, bias=None):
        self.V, self.E, self.H = V, E, H
        self.ref_enc, self.ref_dec = reference.Encoder(V, E, H), reference.Decoder(V, E, H)
        bound = scale / math.sqrt(H)
        with torch.no_grad():
            for mod in (self.ref_enc, self.ref_dec):
                for name, p in mod.named_parameters():
                    if name.startswith("embedding"):
                        p.copy_(torch.randn(p.shape, generator=rng))
                    else:
                        p.copy_((torch.rand(p.shape, generator=rng) * 2 - 1) * bound)
            self.ref_dec.out.weight.mul_(out_scale)
            for tok, b in (bias or {}).items():
                self.ref_dec.out.bias[tok] += b
        self.enc = self.dec = self.learner = None
        self.to("cpu", F64)

    def to(self, device="cpu", dtype=F64):
        """Move the reference modules (here) to `device` and `dtype`."""
        self.ref_enc.to(device=device, dtype=dtype)
        self.ref_dec.to(device=device, dtype=dtype)
        self.device, self.dtype = device, dtype
        return self

    def load(self, learner):
        """Build the learner's modules in the worker, with these weights, on this device and dtype."""
        self.learner = learner
        self.enc = learner_module(learner, "Encoder", self.ref_enc, self.V, self.E, self.H)
        self.dec = learner_module(learner, "Decoder", self.ref_dec, self.V, self.E, self.H)
        for h in (self.enc, self.dec):
            h.to(device=torch.device(self.device), dtype=self.dtype)
        return self

    def to_meta(self):
        """Move the learner's modules to the meta device (for the device checks, after every value check)."""
        for h in (self.enc, self.dec):
            h.to(device=META)
        return self


def _model(learner, reference, rng, V, E, H, *, device="cpu", dtype=F64, **kw):
    return _Model(reference, rng, V, E, H, **kw).to(device, dtype).load(learner)


class _Checked:
    """The learner's decoder as the drivers here call it: a result of the wrong form is MODULES_BROKEN."""

    def __init__(self, m):
        self.m = m

    def __call__(self, y, hidden, context):
        n, m = y.shape[0], self.m
        res = m.dec(y, hidden, context)
        expect(isinstance(res, (tuple, list)) and len(res) == 2, MODULES_BROKEN)
        for x, shape in zip(res, ((n, m.V), (n, m.H))):
            expect(isinstance(x, torch.Tensor) and tuple(x.shape) == shape and x.dtype == m.dtype
                   and x.device.type == y.device.type, MODULES_BROKEN)
        return res[0], res[1]


PART_ARITY = {"seq2seq_forward": 4, "greedy_decode": 4, "beam_search": 5}


def _usable(m, src, part):
    """The learner's encoder's final state for src, after checking that both modules give the right forms.

    When a module is still the stub, the part cannot be graded: say so, unless the part's own
    function is a stub too (found by calling it with placeholder arguments: a stub raises
    NotImplementedError before it reads them), which is then the more useful thing to say."""
    B, H = src.shape[0], m.H
    try:
        res = m.enc(src)
        final = res[1] if isinstance(res, (tuple, list)) and len(res) == 2 else None
        ok = (isinstance(final, torch.Tensor) and tuple(final.shape) == (B, H) and final.dtype == m.dtype
              and final.device.type == src.device.type)
        step = _Checked(m)(torch.full((B,), SOS, dtype=torch.long, device=src.device), final, final) if ok else None
    except (NotImplementedRemote, LearnerError) as exc:
        try:
            getattr(m.learner, part)(*[None] * PART_ARITY[part])
        except LearnerError:
            pass  # implemented: it failed on the placeholders, as it should
        if isinstance(exc, NotImplementedRemote):
            expect(False, MODULES_STUB.format(exc.name))
        expect(False, MODULES_RAISED.format(exc.name, exc.etype, exc.message))
    expect(ok or not (B == 1 and isinstance(final, torch.Tensor) and tuple(final.shape) == (H,)), MODULES_SQUEEZE)
    expect(ok and step is not None, MODULES_BROKEN)
    return final


def _device_agnostic(learner, target, *args, **kwargs):
    """`expect_device_agnostic` (a name kept short for the calls below)."""
    return expect_device_agnostic(learner, target, *args, **kwargs)


def _part_on_meta(learner, m, part, *args, **kwargs):
    """`expect_device_agnostic` for a later part, with the learner's modules moved to the meta device.

    The modules are checked on the meta device first: when they would fail on a GPU themselves,
    the part cannot be judged, and the hint says to fix parts 1 and 2."""
    m.to_meta()
    src = args[0] if args[0].dim() == 2 else args[0].unsqueeze(0)
    try:
        out = _device_agnostic(learner, m.enc, src)
        if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], torch.Tensor):
            y = torch.full((src.shape[0],), SOS, dtype=torch.long)
            _device_agnostic(learner, m.dec, y, out[1], out[1])
    except Hint:
        raise Hint(MODULES_DEVICE) from None
    return _device_agnostic(learner, part, m.enc, m.dec, *args, **kwargs)


# --- Part 1: the encoder (3 points) ----------------------------------------------------------

def _check_encoder(m, src, device):
    B, T = src.shape
    H = m.H
    outputs, final = pair(m.enc(src), ENC, what="a pair of tensors (outputs, final)")
    tensor(outputs, ENC, what="its outputs")
    tensor(final, ENC, what="its final state")
    expect(not (tuple(outputs.shape) == (B, H) and tuple(final.shape) == (B, T, H)), ENC_SWAPPED)
    expect(tuple(final.shape) != (1, B, H), ENC_NUM_LAYERS)
    expect(not (B == 1 and tuple(final.shape) == (H,)), ENC_SQUEEZE)
    tensor(outputs, ENC, shape=(B, T, H), dtype=m.dtype, device=device, what="its outputs")
    tensor(final, ENC, shape=(B, H), dtype=m.dtype, device=device, what="its final state")
    with torch.no_grad():
        ref_out, ref_final = m.ref_enc(src)
    expect_close(outputs, ref_out, ENC_OUTPUTS, device=device)
    o = ref_out.detach().cpu().double()
    expect_close(final, ref_final, ENC_FINAL, device=device, mistakes=((ENC_FIRST, o[:, 0]), (ENC_MEAN, o.mean(1))))
    return outputs, final


def _encoder_setup(learner, reference, rng, B, T, device="cpu", dtype=F64):
    V, E, H = _randint(rng, 5, 9), _randint(rng, 2, 6), _randint(rng, 3, 8)
    return _model(learner, reference, rng, V, E, H, device=device, dtype=dtype), _tokens(rng, 0, V - 1, (B, T))


@points(1, part="encoder")
def test_encoder_matches_reference(learner, reference, rng, devices):
    """Does the Encoder give the reference's states (all of them, and the final one) for any sizes, on any device?"""
    for device in devices:
        for dtype in (F32, F64):
            m, src = _encoder_setup(learner, reference, rng, _randint(rng, 2, 4), _randint(rng, 2, 6), device, dtype)
            _check_encoder(m, src.to(device), device)
    _device_agnostic(learner, m.to_meta().enc, src)


@points(0.5, part="encoder")
def test_encoder_final_is_last_state(learner, reference, rng):
    """Is `final` the last of the states, shape (B, H), also for one source or one token?"""
    for B, T in ((1, 5), (3, 1), (1, 1), (4, 6)):
        m, src = _encoder_setup(learner, reference, rng, B, T)
        outputs, final = _check_encoder(m, src, "cpu")
        expect(torch.allclose(final, outputs[:, -1]), ENC_FINAL)


@points(1, part="encoder")
def test_encoder_gradients(learner, reference, rng):
    """Do a loss's gradients reach every parameter of the Encoder, as in the reference?"""
    B, T = 3, _randint(rng, 2, 6)
    m, src = _encoder_setup(learner, reference, rng, B, T)
    g_out, g_final = torch.randn(B, T, m.H, generator=rng, dtype=F64), torch.randn(B, m.H, generator=rng, dtype=F64)
    _check_encoder(m, src, "cpu")
    res = learner_grads(learner, m.enc, src, cotangents=(g_out, g_final), params=True, what=ENC)
    names, params = zip(*m.ref_enc.named_parameters())
    expected = vjp(m.ref_enc(src), params, (g_out, g_final))
    expect_grads([res.param_grads.get(n) for n in names], expected,
                 [f"the encoder's parameter {n}" for n in names])


@points(0.5, part="encoder")
def test_encoder_half_precision(learner, reference, rng):
    """Does the Encoder work in float16 and bfloat16, keeping the model's dtype?"""
    for dtype in HALF:
        # Two tokens or more: with one, the first state is the last, and a wrong final state cannot show.
        m, src = _encoder_setup(learner, reference, rng, _randint(rng, 1, 4), _randint(rng, 2, 6), dtype=dtype)
        _check_encoder(m, src, "cpu")


# --- Part 2: one decoder step (3 points) ----------------------------------------------------

def _decoder_mistakes(ref_dec, y, h, c):
    d = copy.deepcopy(ref_dec).cpu().double()
    y, h, c = y.cpu(), h.detach().cpu().double(), c.detach().cpu().double()

    def run(first, state, out_order=False, new=True):
        with torch.no_grad():
            s = d.rnn(first, state) if state is not None else d.rnn(first)
            return d.out(torch.cat([c, s] if out_order else [s if new else h, c], -1)), s

    with torch.no_grad():
        e = d.embedding(y)
    x = torch.cat([e, c], -1)
    right = lambda: run(x, h)  # noqa: E731
    return [
        (DEC_EMB_CTX, lambda: run(torch.cat([c, e], -1), h)),
        (DEC_OUT_ORDER, lambda: run(x, h, out_order=True)),
        (DEC_OLD_STATE, lambda: run(x, h, new=False)),
        (DEC_CTX_STATE, lambda: run(x, c)),
        (DEC_ZERO_STATE, lambda: run(x, None)),
        (DEC_SOFTMAX, lambda: (right()[0].softmax(-1), right()[1])),
        (DEC_LOG_SOFTMAX, lambda: (right()[0].log_softmax(-1), right()[1])),
    ]


def _call_decoder(thunk):
    """thunk() (a call of the learner's decoder), explaining the layer-size errors of a missing concatenation."""
    try:
        return thunk()
    except LearnerError as exc:
        if "inconsistent input_size" in exc.message:
            expect(False, DEC_GRU_INPUT)
        if "shapes cannot be multiplied" in exc.message:
            expect(False, DEC_OUT_INPUT)
        raise


def _same_pair(a, b):
    return close(a[0], b[0], rtol=1e-3, atol=1e-4) and close(a[1], b[1], rtol=1e-3, atol=1e-4)


def _check_decoder(m, y, h, c, device):
    B, V, H = y.shape[0], m.V, m.H
    logits, hidden = pair(_call_decoder(lambda: m.dec(y, h, c)), DEC, what="a pair of tensors (logits, hidden)")
    tensor(logits, DEC, what="its logits")
    tensor(hidden, DEC, what="its new hidden state")
    expect(not (V != H and tuple(logits.shape) == (B, H) and tuple(hidden.shape) == (B, V)), DEC_SWAPPED)
    tensor(logits, DEC, shape=(B, V), dtype=m.dtype, device=device, what="its logits")
    tensor(hidden, DEC, shape=(B, H), dtype=m.dtype, device=device, what="its new hidden state")
    with torch.no_grad():
        expected = m.ref_dec(y, h, c)
    if not (close(logits, expected[0], device) and close(hidden, expected[1], device)):
        raise Hint(diagnose((logits, hidden), _decoder_mistakes(m.ref_dec, y, h, c), DEC_GENERIC, same=_same_pair))
    return logits, hidden


def _decoder_setup(learner, reference, rng, B, device="cpu", dtype=F64):
    V, E, H = _randint(rng, 5, 9), _randint(rng, 2, 6), _randint(rng, 3, 8)
    m = _model(learner, reference, rng, V, E, H, device=device, dtype=dtype)
    y = _tokens(rng, 0, m.V - 1, (B,))
    h = torch.randn(B, m.H, generator=rng, dtype=F64) * 0.5
    c = torch.randn(B, m.H, generator=rng, dtype=F64)
    return m, y.to(device), h.to(device, dtype), c.to(device, dtype)


@points(1, part="decoder")
def test_decoder_matches_reference(learner, reference, rng, devices):
    """Does one Decoder step give the reference's logits and new state, for any sizes, on any device?"""
    for device in devices:
        for _ in range(2):
            m, y, h, c = _decoder_setup(learner, reference, rng, _randint(rng, 2, 5), device, F32)
            _check_decoder(m, y, h, c, device)
    _device_agnostic(learner, m.to_meta().dec, y, h, c)


@points(0.5, part="decoder")
def test_decoder_float64_and_batch_of_one(learner, reference, rng):
    """Does the Decoder work in float64 and for a batch of one, keeping the dtype?"""
    for B in (1, 3):
        _check_decoder(*_decoder_setup(learner, reference, rng, B), "cpu")


@points(1, part="decoder")
def test_decoder_gradients(learner, reference, rng):
    """Do the gradients reach the hidden state, the context and every parameter, as in the reference?"""
    B = 3
    m, y, h, c = _decoder_setup(learner, reference, rng, B)
    g_l, g_h = torch.randn(B, m.V, generator=rng, dtype=F64), torch.randn(B, m.H, generator=rng, dtype=F64)
    _check_decoder(m, y, h, c, "cpu")
    res = learner_grads(learner, m.dec, y, h, c, cotangents=(g_l, g_h), params=True, what=DEC)
    names, params = zip(*m.ref_dec.named_parameters())
    hr, cr = h.clone().requires_grad_(True), c.clone().requires_grad_(True)
    expected = vjp(m.ref_dec(y, hr, cr), (hr, cr) + params, (g_l, g_h))
    got = list(res.arg_grads[1:3]) + [res.param_grads.get(n) for n in names]
    expect_grads(got, expected, ["`hidden`", "`context`"] + [f"the decoder's parameter {n}" for n in names])


@points(0.5, part="decoder")
def test_decoder_half_precision(learner, reference, rng):
    """Does the Decoder work in float16 and bfloat16, keeping the model's dtype?"""
    for dtype in HALF:
        _check_decoder(*_decoder_setup(learner, reference, rng, _randint(rng, 1, 4), dtype=dtype), "cpu")


# --- Part 3: teacher forcing (4 points) ------------------------------------------------------

def _unroll(final, dec, n_steps, feed, *, hidden0=None, ctx_is_state=False, carry=True):
    """The decoder's logits (B, n_steps, V), run from here; feed(t, logits so far) gives step t's input."""
    hidden = final if hidden0 is None else hidden0
    steps = []
    for t in range(n_steps):
        logits, new = dec(feed(t, steps), hidden, hidden if ctx_is_state else final)
        steps.append(logits)
        if carry:
            hidden = new
    return torch.stack(steps, 1)


def _teacher(tgt, sos, current=False, no_sos=False):
    start = torch.full_like(tgt[:, 0], sos)

    def feed(t, steps):
        if no_sos:
            return tgt[:, t]
        return start if t == 0 else tgt[:, t if current else t - 1]

    return feed


def _own(sos, B, device):
    start = torch.full((B,), sos, dtype=torch.long, device=device)
    return lambda t, steps: start if t == 0 else steps[-1].argmax(-1)


def _check_logits_shape(got, B, T_out, m):
    expect(isinstance(got, torch.Tensor), TF_SHAPE)
    expect(not (tuple(got.shape) == (T_out, B, m.V) and B != T_out), TF_STACK)
    expect(tuple(got.shape) == (B, T_out, m.V), TF_SHAPE)
    expect(got.dtype == m.dtype, TF_DTYPE)


def _teacher_mistakes(final, dec, tgt, sos, expected):
    B, T_out = tgt.shape
    return [
        (TF_IGNORES_SOS, (lambda: _unroll(final, dec, T_out, _teacher(tgt, SOS))) if sos != SOS else None),
        (TF_CURRENT, lambda: _unroll(final, dec, T_out, _teacher(tgt, sos, current=True))),
        (TF_NO_SOS, lambda: _unroll(final, dec, T_out, _teacher(tgt, sos, no_sos=True))),
        (TF_OWN, lambda: _unroll(final, dec, T_out, _own(sos, B, tgt.device))),
        (TF_ZERO_STATE, lambda: _unroll(final, dec, T_out, _teacher(tgt, sos), hidden0=torch.zeros_like(final))),
        (TF_CTX_STATE, lambda: _unroll(final, dec, T_out, _teacher(tgt, sos), ctx_is_state=True)),
        (TF_NOT_CARRIED, lambda: _unroll(final, dec, T_out, _teacher(tgt, sos), carry=False)),
        (TF_PROBS, lambda: expected.softmax(-1)),
        (TF_LOGPROBS, lambda: expected.log_softmax(-1)),
    ]


def _seq2seq_setup(learner, reference, rng, device="cpu", dtype=F64, B=None, T_out=None, V=None):
    V = V or _randint(rng, 6, 9)
    m = _model(learner, reference, rng, V, _randint(rng, 2, 6), _randint(rng, 3, 8), device=device, dtype=dtype)
    B, T, T_out = B or _randint(rng, 2, 4), _randint(rng, 2, 5), T_out or _randint(rng, 3, 6)
    src = _tokens(rng, 3, V - 1, (B, T)).to(device)
    tgt = _tokens(rng, 3, V - 1, (B, T_out)).to(device)
    return m, src, tgt, _usable(m, src, "seq2seq_forward")


def _expect_teacher_forced(got, m, final, tgt, sos=SOS, device="cpu"):
    """`got` must be the teacher-forced logits of the learner's modules; name the mistake if not."""
    _check_logits_shape(got, *tgt.shape, m)
    expected = _unroll(final, _Checked(m), tgt.shape[1], _teacher(tgt, sos))
    expect_close(got, expected, TF_GENERIC, device=device,
                 mistakes=_teacher_mistakes(final, _Checked(m), tgt, sos, expected))


@points(1, part="seq2seq_forward")
def test_seq2seq_teacher_forcing_matches_reference(learner, reference, rng, devices):
    """With teacher_forcing_ratio=1.0, are the logits those of teacher forcing, on any device, for any target length?"""
    for device in devices:
        for dtype, sos in ((F32, None), (F64, 4)):
            m, src, tgt, final = _seq2seq_setup(learner, reference, rng, device, dtype)
            kwargs = {"teacher_forcing_ratio": 1.0, **({} if sos is None else {"sos": sos})}
            got = learner.seq2seq_forward(m.enc, m.dec, src, tgt, **kwargs)
            _expect_teacher_forced(got, m, final, tgt, SOS if sos is None else sos, device)
    # A one-token target: the first input is sos alone, and no column of tgt past the first exists.
    m1, src1, tgt1, final1 = _seq2seq_setup(learner, reference, rng, T_out=1)
    _expect_teacher_forced(learner.seq2seq_forward(m1.enc, m1.dec, src1, tgt1, teacher_forcing_ratio=1.0),
                           m1, final1, tgt1)
    _part_on_meta(learner, m, "seq2seq_forward", src.cpu(), tgt.cpu(), teacher_forcing_ratio=1.0)


@points(1, part="seq2seq_forward")
def test_seq2seq_default_is_deterministic_and_differentiable(learner, reference, rng):
    """With the default ratio, are the logits the teacher-forced ones, the same every time, and differentiable?"""
    m, src, tgt, final = _seq2seq_setup(learner, reference, rng)
    a = learner.seq2seq_forward(m.enc, m.dec, src, tgt)
    b = learner.seq2seq_forward(m.enc, m.dec, src, tgt)
    _check_logits_shape(a, *tgt.shape, m)
    expect(isinstance(b, torch.Tensor) and torch.equal(a, b), TF_NOT_DETERMINISTIC)
    forced = learner.seq2seq_forward(m.enc, m.dec, src, tgt, teacher_forcing_ratio=1.0)
    _check_logits_shape(forced, *tgt.shape, m)
    if not torch.equal(a, forced):  # the default is not 1.0, or ratio 1.0 is not fully teacher forced
        _expect_teacher_forced(forced, m, final, tgt)
        expect(False, TF_DEFAULT)
    _expect_teacher_forced(a, m, final, tgt)
    g = torch.randn(a.shape, generator=rng, dtype=F64)
    res = learner_grads(learner, "seq2seq_forward", m.enc, m.dec, src, tgt, cotangents=(g,), what="seq2seq_forward")
    expect(isinstance(res.output, torch.Tensor) and torch.equal(res.output, a), TF_NOT_DETERMINISTIC)


@points(1, part="seq2seq_forward")
def test_seq2seq_free_running(learner, reference, rng):
    """With teacher_forcing_ratio=0.0, does the model read its own previous prediction at every step?"""
    for _ in range(2):
        m, src, tgt, final = _seq2seq_setup(learner, reference, rng)
        B, T_out = tgt.shape
        dec, own = _Checked(m), _own(SOS, B, src.device)
        got = learner.seq2seq_forward(m.enc, m.dec, src, tgt, teacher_forcing_ratio=0.0)
        _check_logits_shape(got, B, T_out, m)
        expect_close(got, _unroll(final, dec, T_out, own), FR_GENERIC, mistakes=[
            (FR_TEACHER, lambda: _unroll(final, dec, T_out, _teacher(tgt, SOS))),
            (TF_ZERO_STATE, lambda: _unroll(final, dec, T_out, own, hidden0=torch.zeros_like(final))),
            (TF_CTX_STATE, lambda: _unroll(final, dec, T_out, own, ctx_is_state=True)),
            (TF_NOT_CARRIED, lambda: _unroll(final, dec, T_out, own, carry=False)),
        ])


def _rows_close(a, b):
    """Per row of the first axis: is `a` close to `b`?"""
    return [close(x, y) for x, y in zip(a, b)]


@points(1, part="seq2seq_forward")
def test_seq2seq_mixed_ratio_decides_per_step(learner, reference, rng):
    """With ratio 0.5, does each step feed either the true or the predicted previous token, for the whole batch?"""
    m, src, tgt, final = _seq2seq_setup(learner, reference, rng, B=4, T_out=8, V=9)
    B, T_out = tgt.shape
    dec = _Checked(m)
    # A teacher-forced call must be right first (else what follows cannot say which input a step fed).
    _expect_teacher_forced(learner.seq2seq_forward(m.enc, m.dec, src, tgt, teacher_forcing_ratio=1.0), m, final, tgt)
    start = torch.full((B,), SOS, dtype=torch.long)
    mixed_calls, seen = 0, set()
    for _ in range(6):
        got = learner.seq2seq_forward(m.enc, m.dec, src, tgt, teacher_forcing_ratio=0.5)
        _check_logits_shape(got, B, T_out, m)
        logits, hidden = dec(start, final, final)
        expect_close(got[:, :1], logits.unsqueeze(1), TF_GENERIC,
                     mistakes=_teacher_mistakes(final, dec, tgt[:, :1], SOS, logits.unsqueeze(1)))
        # Follow each row's possible paths: (row, decoder state, what each step fed). A row has one path,
        # unless the learner's decoder made two inputs give the same logits; a later step then tells.
        paths = [(i, hidden[i], ()) for i in range(B)]
        for t in range(1, T_out):
            a, b = tgt[:, t - 1], got[:, t - 1].argmax(-1)
            rows = [i for i, _, _ in paths]
            y = torch.cat([a[rows], b[rows]])
            lg, new = dec(y, torch.stack([h for _, h, _ in paths] * 2), final[rows + rows])
            match = _rows_close(lg, got[rows + rows, t])
            n, nxt = len(paths), []
            for k in range(2 * n):
                i, _, fed = paths[k % n]
                same = bool(a[i] == b[i])
                if match[k] and not (same and k >= n) and sum(j == i for j, _, _ in nxt) < 16:
                    nxt.append((i, new[k], fed + (None if same else "teacher" if k < n else "own",)))
            if {i for i, _, _ in nxt} != set(range(B)):
                current, _ = dec(tgt[rows, t], torch.stack([h for _, h, _ in paths]), final[rows])
                expect(not any(_rows_close(current, got[rows, t])), TF_CURRENT)
                expect(False, MIX_NEITHER)
            paths = nxt
        kinds = set()
        for t in range(T_out - 1):
            decided = set()
            for i in range(B):
                fed = {f[t] for j, _, f in paths if j == i}
                if len(fed) == 1 and None not in fed:
                    decided |= fed
            expect(len(decided) < 2, MIX_PER_ROW)
            kinds |= decided
        seen |= kinds
        mixed_calls += len(kinds) == 2
    expect(len(seen) == 2, MIX_NEVER)
    expect(mixed_calls > 0, MIX_PER_CALL)


# --- Part 4: greedy decoding (4 points) ------------------------------------------------------

def _greedy(final, dec, max_len, sos=SOS, eos=EOS, pad=PAD, *, mask=True, early=True, any_stop=False,
            with_sos=False):
    """Greedy decoding run from here with `dec` (a module or the learner's, checked); flags make mistakes."""
    B = final.shape[0]
    y = torch.full((B,), sos, dtype=torch.long, device=final.device)
    finished = torch.zeros(B, dtype=torch.bool, device=final.device)
    hidden, toks = final, []
    for _ in range(max_len):
        logits, hidden = dec(y, hidden, final)
        y = logits.argmax(-1)
        if mask:
            y = y.masked_fill(finished, pad)
        toks.append(y)
        finished = finished | (y == eos)
        if early and bool(finished.any() if any_stop else finished.all()):
            break
    out = torch.stack(toks, 1)
    if with_sos:
        out = torch.cat([torch.full((B, 1), sos, dtype=torch.long, device=out.device), out], 1)
    return out


def _finishes_unevenly(out, eos):
    """True when some row has produced eos while another is still going (so that padding shows)."""
    L = out.shape[1]
    firsts = [row.index(eos) if eos in row else L for row in out.tolist()]
    return min(firsts) < L - 1


def _greedy_model(learner, reference, rng, B, max_len, *, device="cpu", dtype=F64, sos=SOS, eos=EOS, V=None):
    """A model (tried here first) whose greedy outputs finish at different steps, and its sources (B, T).

    With several rows, padding must show: some row ends before the others, and what the model
    would write after its end differs from the padding (about 1 draw in 100 ends unevenly yet
    writes the padding token there anyway, and a decoder that forgets to pad would pass)."""
    for _ in range(40):
        V = V or _randint(rng, 6, 9)
        m = _Model(reference, rng, V, _randint(rng, 2, 6), _randint(rng, 3, 8), out_scale=2.0,
                   bias={eos: float(torch.rand((), generator=rng)) * 3})
        src = _tokens(rng, 3, V - 1, (B, _randint(rng, 2, 5)))
        with torch.no_grad():
            _, final = m.ref_enc(src)
            out = _greedy(final, m.ref_dec, max_len, sos, eos)
            if B == 1 or (_finishes_unevenly(out, eos)
                          and not torch.equal(out, _greedy(final, m.ref_dec, max_len, sos, eos, mask=False))):
                break
    return m.to(device, dtype).load(learner), src.to(device)


def _check_greedy(learner, m, src, max_len, device, **special):
    sos, eos, pad = special.get("sos", SOS), special.get("eos", EOS), special.get("pad", PAD)
    final, dec = _usable(m, src, "greedy_decode"), _Checked(m)
    got = learner.greedy_decode(m.enc, m.dec, src, max_len, **special)
    expect(isinstance(got, torch.Tensor), GR_TYPE)
    expect(got.dtype == torch.long, GR_DTYPE)
    expect(got.device.type == torch.device(device).type, GR_DEVICE)
    shaped = got.dim() == 2 and got.shape[0] == src.shape[0] and got.shape[1] <= max_len
    run = lambda *a, **kw: lambda: _greedy(final, dec, *a, **kw)  # noqa: E731
    expect_close(got, _greedy(final, dec, max_len, sos, eos, pad), GR_GENERIC if shaped else GR_SHAPE, mistakes=[
        (GR_NO_PAD, run(max_len, sos, eos, pad, mask=False)),
        (GR_NO_PAD, run(max_len, sos, eos, pad, mask=False, early=False)),
        (GR_NO_STOP, run(max_len, sos, eos, pad, early=False)),
        (GR_ANY_STOP, run(max_len, sos, eos, pad, any_stop=True)),
        (GR_WITH_SOS, run(max_len, sos, eos, pad, with_sos=True)),
        (GR_WITH_SOS, run(max_len, sos, eos, pad, with_sos=True, early=False)),
        *[(GR_SPECIAL, run(max_len, **{"sos": sos, "eos": eos, "pad": pad, **fixed}) if special else None)
          for fixed in ({"sos": SOS, "eos": EOS, "pad": PAD}, {"sos": SOS}, {"eos": EOS}, {"pad": PAD})],
        (GR_STEPS, run(max_len - 1, sos, eos, pad) if max_len > 1 else None),
        (GR_STEPS, run(max_len + 1, sos, eos, pad)),
    ])
    return got


@points(1, part="greedy_decode")
def test_greedy_matches_reference(learner, reference, rng):
    """Does greedy_decode give the argmax path of the model, row by row, for any batch?"""
    for B, max_len, dtype in ((5, 6, F64), (1, 4, F64), (6, 5, F32)):
        m, src = _greedy_model(learner, reference, rng, B, max_len, dtype=dtype)
        _check_greedy(learner, m, src, max_len, "cpu")


@points(1, part="greedy_decode")
def test_greedy_pads_after_eos(learner, reference, rng):
    """Does each row keep its eos and hold only pad after it, while other rows go on?"""
    for _ in range(2):
        m, src = _greedy_model(learner, reference, rng, 6, 6)
        got = _check_greedy(learner, m, src, 6, "cpu")
        for row in got.tolist():
            if EOS in row:
                expect(all(t == PAD for t in row[row.index(EOS) + 1:]), GR_NO_PAD)


@points(0.5, part="greedy_decode")
def test_greedy_max_len_and_early_stop(learner, reference, rng):
    """Does it take exactly max_len steps when no row ends, and stop at once when every row does?"""
    for max_len in (1, 2, 5):
        V = _randint(rng, 6, 9)
        m = _model(learner, reference, rng, V, _randint(rng, 2, 6), _randint(rng, 3, 8), bias={EOS: -50.0})
        src = _tokens(rng, 3, V - 1, (3, 4))
        got = _check_greedy(learner, m, src, max_len, "cpu")
        expect(tuple(got.shape) == (3, max_len), GR_MAX_LEN)
    m = _model(learner, reference, rng, V, _randint(rng, 2, 6), _randint(rng, 3, 8), bias={EOS: 50.0})
    _usable(m, src, "greedy_decode")
    got = learner.greedy_decode(m.enc, m.dec, src, 5)
    expect(isinstance(got, torch.Tensor) and got.tolist() == [[EOS]] * 3, GR_ALL_EOS)


@points(1, part="greedy_decode")
def test_greedy_honours_sos_eos_pad(learner, reference, rng):
    """Does greedy_decode use the sos, eos and pad ids it is given?"""
    for special in ({"sos": 3, "eos": 4, "pad": 5}, {"sos": 2, "eos": 1, "pad": 6}):
        m, src = _greedy_model(learner, reference, rng, 5, 6, sos=special["sos"], eos=special["eos"], V=8)
        _check_greedy(learner, m, src, 6, "cpu", **special)


@points(0.5, part="greedy_decode")
def test_greedy_runs_on_any_device(learner, reference, rng, devices):
    """Does greedy_decode run on every device (a GPU too), creating its tensors on the input's device?"""
    for device in devices:
        m, src = _greedy_model(learner, reference, rng, 4, 5, device=device)
        _check_greedy(learner, m, src, 5, device)
    _part_on_meta(learner, m, "greedy_decode", src.cpu(), 5)


# --- Part 5: beam search (6 points) ----------------------------------------------------------

def _plain(x):
    """Tensors, arrays and NumPy scalars as Python numbers and lists (for the checks that do not grade the form)."""
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        return x.tolist()
    if isinstance(x, list):
        return [_plain(t) for t in x]
    return x


def _hyps(result, beam_size, strict=False):
    """The learner's beam search result as [(tokens tuple, float)], checking its form (leniently unless strict)."""
    expect(isinstance(result, (list, tuple)), BM_LIST)
    out = []
    for item in result:
        toks, score = pair(item, "beam_search", what="a list of (tokens, log_prob) pairs")
        if not strict:
            toks, score = _plain(toks), _plain(score)
            score = score[0] if isinstance(score, list) and len(score) == 1 else score
            score = float(score) if type(score) is int else score
        expect(isinstance(toks, list) and all(type(t) is int for t in toks), BM_TOKENS)
        expect(type(score) is float, BM_FLOAT)
        out.append((tuple(toks), score))
    expect(len(out) <= beam_size, BM_TOO_MANY)
    expect(len(out) > 0, BM_EMPTY)
    return out


def _beam(context, dec, beam_size, max_len, sos=SOS, eos=EOS, *, raw=False, accumulate=True, refill=False,
          sort=True):
    """Beam search run from here with `dec` (a module or the learner's, checked); flags make mistakes."""
    hidden, seqs, device = context, [()], context.device
    scores = torch.zeros(1, dtype=F64)
    y = torch.full((1,), sos, dtype=torch.long, device=device)
    finished = []
    for step in range(max_len):
        n = len(seqs)
        logits, hidden = dec(y, hidden, context.expand(n, -1))
        lg = logits.detach().cpu().double()
        step_scores = lg if raw else F.log_softmax(lg, dim=-1)
        total = (scores.unsqueeze(1) if accumulate else 0) + step_scores
        V = lg.shape[-1]
        keep = []
        for rank, i in enumerate(total.flatten().argsort(descending=True).tolist()):
            b, tok = divmod(i, V)
            seq, score = seqs[b] + (tok,), float(total[b, tok])
            done = tok == eos or step == max_len - 1
            if rank < beam_size:
                (finished.append((seq, score)) if done else keep.append((seq, b, tok)))
            elif refill and not done and len(keep) < beam_size:
                keep.append((seq, b, tok))
            elif not refill or len(keep) >= beam_size:
                break
        if not keep:
            break
        rows = torch.tensor([b for _, b, _ in keep], device=device)
        seqs = [s for s, _, _ in keep]
        hidden = hidden[rows]
        scores = torch.tensor([float(total[b, t]) for _, b, t in keep], dtype=F64)
        y = torch.tensor([t for _, _, t in keep], dtype=torch.long, device=device)
    if sort:
        finished.sort(key=lambda p: p[1], reverse=True)
    return finished[:beam_size]


def _beam_compete(context, dec, beam_size, max_len, sos=SOS, eos=EOS):
    """The mistake of keeping finished hypotheses in the beam, where they take the place of live ones."""
    beam = [((), 0.0, False, None)]  # (seq, score, done, row of `hidden`)
    hidden, device = context, context.device
    for step in range(max_len):
        live = [e for e in beam if not e[2]]
        if not live:
            break
        rows = torch.tensor([e[3] or 0 for e in live], device=device)
        y = torch.tensor([e[0][-1] if e[0] else sos for e in live], dtype=torch.long, device=device)
        logits, new = dec(y, hidden[rows], context.expand(len(live), -1))
        logp = F.log_softmax(logits.detach().cpu().double(), -1)
        cands = [e for e in beam if e[2]]
        for i, (seq, score, _, _) in enumerate(live):
            for tok in range(logp.shape[1]):
                cands.append((seq + (tok,), score + float(logp[i, tok]), tok == eos or step == max_len - 1, i))
        cands.sort(key=lambda e: e[1], reverse=True)
        beam, hidden = cands[:beam_size], new
    return [(s, sc) for s, sc, _, _ in sorted(beam, key=lambda e: e[1], reverse=True) if s][:beam_size]


def _beam_policies(ctx, dec, beam_size, max_len, sos=SOS, eos=EOS):
    """name -> thunk of the beam-policy mistakes, which the checks either target or keep out of sight."""
    return {"refill": lambda: _beam(ctx, dec, beam_size, max_len, sos, eos, refill=True),
            "compete": lambda: _beam_compete(ctx, dec, beam_size, max_len, sos, eos),
            "unsorted": lambda: _beam(ctx, dec, beam_size, max_len, sos, eos, sort=False)}


def _beam_mistakes(ctx, dec, beam_size, max_len, sos, eos, special):
    policy = _beam_policies(ctx, dec, beam_size, max_len, sos, eos)
    return [
        (BM_RAW, lambda: _beam(ctx, dec, beam_size, max_len, sos, eos, raw=True)),
        (BM_LAST_ONLY, lambda: _beam(ctx, dec, beam_size, max_len, sos, eos, accumulate=False)),
        (BM_REFILL, policy["refill"]),
        (BM_COMPETE, policy["compete"]),
        (BM_UNSORTED, policy["unsorted"]),
        *[(BM_SPECIAL, (lambda s=s, e=e: _beam(ctx, dec, beam_size, max_len, s, e)) if special else None)
          for s, e in ((SOS, EOS), (SOS, eos), (sos, EOS))],
    ]


def _same_hyps(got, expected, tol=1e-6):
    return len(got) == len(expected) and all(
        a == c and abs(b - d) <= tol * (1 + abs(d)) for (a, b), (c, d) in zip(got, expected))


def _enumerate(context, dec, max_len, sos=SOS, eos=EOS):
    """Every possible output -> (sum of log-softmax, sum of raw logits, last log-softmax), by brute force."""
    frontier, hidden, device = [((), 0.0, 0.0)], context, context.device
    y = torch.full((1,), sos, dtype=torch.long, device=device)
    table = {}
    for step in range(max_len):
        logits, hidden = dec(y, hidden, context.expand(len(frontier), -1))
        lg = logits.detach().cpu().double()
        logp = F.log_softmax(lg, -1)
        nxt, rows = [], []
        for i, (seq, lp, ls) in enumerate(frontier):
            for tok in range(lg.shape[1]):
                entry = (seq + (tok,), lp + float(logp[i, tok]), ls + float(lg[i, tok]))
                if tok == eos or step == max_len - 1:
                    table[entry[0]] = (entry[1], entry[2], float(logp[i, tok]))
                else:
                    nxt.append(entry)
                    rows.append(i)
        if not nxt:
            break
        hidden = hidden[torch.tensor(rows, device=device)]
        y = torch.tensor([s[-1] for s, _, _ in nxt], dtype=torch.long, device=device)
        frontier = nxt
    return table


def _ranked(table):
    return sorted(((s, v[0]) for s, v in table.items()), key=lambda p: p[1], reverse=True)


def _check_well_formed(hyps, max_len, sos=SOS, eos=EOS):
    if any(len(t) > max_len for t, _ in hyps) and all(t[:1] == (sos,) for t, _ in hyps):
        expect(False, BM_WITH_SOS)
    for toks, _ in hyps:
        expect(len(toks) <= max_len, BM_TOO_LONG)
        expect(eos not in toks[:-1], BM_AFTER_EOS)
        expect(len(toks) == max_len or (toks and toks[-1] == eos), BM_NO_EOS)
    expect(len(set(t for t, _ in hyps)) == len(hyps), BM_DUPLICATE)
    scores = [s for _, s in hyps]
    expect(all(a >= b - 1e-9 * (1 + abs(b)) for a, b in zip(scores, scores[1:])), BM_UNSORTED)


def _same_score(a, b):
    return abs(a - b) <= 1e-5 * (1 + abs(b))


def _check_scores(hyps, table, max_len, sos=SOS, eos=EOS):
    """Each returned score must be its output's true log-probability; name the mistake if not."""
    for toks, s in hyps:
        if toks not in table:
            expect(not (toks[:1] == (sos,) and toks[1:] in table), BM_WITH_SOS)
            expect(not (len(toks) < max_len and toks + (eos,) in table), BM_NO_EOS)
            _check_well_formed([(toks, s)], max_len, sos, eos)
            expect(False, BM_NOT_OUTPUT)
        logp, logit_sum, last = table[toks]
        if not abs(s - logp) <= 1e-6 * (1 + abs(logp)):
            raise Hint(diagnose(s, [
                (BM_WITH_SOS, table[toks[1:]][0] if toks[:1] == (sos,) and toks[1:] in table else None),
                (BM_RAW, logit_sum), (BM_LENGTH_NORM, logp / len(toks)), (BM_LAST_ONLY, last),
                (BM_PROB, math.exp(logp))], BM_POSITIVE if s > 1e-9 else BM_SCORE, same=_same_score))


def _expect_beam(hyps, m, ctx, beam_size, max_len, sos=SOS, eos=EOS, special=False):
    """`hyps` must be the beam search of the learner's modules; name the mistake if not."""
    dec = _Checked(m)
    if _same_hyps(hyps, _beam(ctx, dec, beam_size, max_len, sos, eos)):
        return
    hint = diagnose(hyps, _beam_mistakes(ctx, dec, beam_size, max_len, sos, eos, special), "",
                    same=lambda a, b: _same_hyps(a, b, tol=1e-5))
    expect(not hint, hint)
    _check_well_formed(hyps, max_len, sos, eos)
    _check_scores(hyps, _enumerate(ctx, dec, max_len, sos, eos), max_len, sos, eos)
    expect(False, BM_GENERIC)


def _beam_model(reference, rng, V, max_len, *, sos=SOS, eos=EOS, out_scale=4.0, best_not_greedy=True,
                beam_size=1, shows=(), hides=()):
    """A model, tried here first, on which a beam of `beam_size` is worth checking: the beam-policy mistakes
    in `shows` change its result and those in `hides` do not, and (with `best_not_greedy`, for a tiny
    vocabulary) the greedy output is not the most probable one and no two outputs are near-tied."""
    for _ in range(200):
        m = _Model(reference, rng, V, _randint(rng, 2, 5), _randint(rng, 3, 6), out_scale=out_scale,
                   bias={eos: 1 + float(torch.rand((), generator=rng)) * 2})
        src = _tokens(rng, 3, V - 1, (_randint(rng, 2, 5),))
        with torch.no_grad():
            _, ctx = m.ref_enc(src.unsqueeze(0))
            right = _beam(ctx, m.ref_dec, beam_size, max_len, sos, eos)
            policy = _beam_policies(ctx, m.ref_dec, beam_size, max_len, sos, eos)
            differs = {name: not _same_hyps(policy[name](), right) for name in set(shows) | set(hides)}
            if not (all(differs[n] for n in shows) and not any(differs[n] for n in hides)):
                continue
            if best_not_greedy:
                ranked = _ranked(_enumerate(ctx, m.ref_dec, max_len, sos, eos))
                greedy = _greedy(ctx, m.ref_dec, max_len, sos, eos)[0].tolist()
                greedy = tuple(greedy[:greedy.index(eos) + 1] if eos in greedy else greedy)
                if ranked[0][0] == greedy or min(a[1] - b[1] for a, b in zip(ranked, ranked[1:])) <= 1e-6:
                    continue
            break
    return m, src


POLICIES = ("refill", "compete", "unsorted")


@points(1, part="beam_search")
def test_beam_size_one_is_greedy(learner, reference, rng):
    """With beam_size=1, is the single output the greedy output?"""
    for V, max_len in ((5, 3), (6, 4), (4, 1)):
        m, src = _beam_model(reference, rng, V, max_len, best_not_greedy=max_len > 1)
        m.load(learner)
        final = _usable(m, src.unsqueeze(0), "beam_search")
        greedy = _greedy(final, _Checked(m), max_len)[0].tolist()
        greedy = tuple(greedy[:greedy.index(EOS) + 1] if EOS in greedy else greedy)
        toks = _hyps(learner.beam_search(m.enc, m.dec, src, 1, max_len), 1)[0][0]
        if toks != greedy:
            expect(toks != (SOS,) + greedy, BM_WITH_SOS)
            expect(toks + (EOS,) != greedy, BM_NO_EOS)
            expect(False, BM_NOT_GREEDY)


@points(2, part="beam_search")
def test_beam_matches_exhaustive_search(learner, reference, rng):
    """With a beam that never drops a hypothesis, are the outputs exactly every possible output, best first?"""
    for V, max_len in ((4, 3), (5, 3)):
        m, src = _beam_model(reference, rng, V, max_len)
        m.load(learner)
        table = _enumerate(_usable(m, src.unsqueeze(0), "beam_search"), _Checked(m), max_len)
        truth = _ranked(table)
        beam_size = V ** max_len
        hyps = _hyps(learner.beam_search(m.enc, m.dec, src, beam_size, max_len), beam_size)
        _check_well_formed(hyps, max_len)
        _check_scores(hyps, table, max_len)
        (best, best_score), (tbest, tscore) = hyps[0], truth[0]
        expect(best == tbest and abs(best_score - tscore) <= 1e-6 * (1 + abs(tscore)), BM_BEST)
        expect(len(hyps) == len(truth) and all(abs(a[1] - b[1]) <= 1e-6 * (1 + abs(b[1]))
                                               for a, b in zip(hyps, truth)), BM_EXHAUSTIVE)


@points(1, part="beam_search")
def test_beam_scores_are_log_probabilities(learner, reference, rng):
    """Is each returned log_prob the sum of the log-softmax of the logits for that output's tokens?"""
    for V, max_len, beam_size in ((5, 3, 3), (4, 4, 2)):
        m, src = _beam_model(reference, rng, V, max_len, beam_size=beam_size, best_not_greedy=False, hides=POLICIES)
        m.load(learner)
        ctx = _usable(m, src.unsqueeze(0), "beam_search")
        hyps = _hyps(learner.beam_search(m.enc, m.dec, src, beam_size, max_len), beam_size)
        _check_scores(hyps, _enumerate(ctx, _Checked(m), max_len), max_len)
        _expect_beam(hyps, m, ctx, beam_size, max_len)


@points(0.5, part="beam_search")
def test_beam_returns_sorted_finished_outputs(learner, reference, rng):
    """Does it return at most beam_size (list of ints, float) pairs, finished at eos or max_len, best first?"""
    for dtype in (F32, F64):
        m, src = _beam_model(reference, rng, 5, 4, out_scale=3.0, beam_size=5, best_not_greedy=False,
                             shows=("unsorted",), hides=("refill", "compete"))
        m.to("cpu", dtype).load(learner)
        ctx = _usable(m, src.unsqueeze(0), "beam_search")
        hyps = _hyps(learner.beam_search(m.enc, m.dec, src, 5, 4), 5, strict=True)
        _check_well_formed(hyps, 4)
        if dtype == F64:  # float32 scores may rank near-ties differently: there, the form only
            _expect_beam(hyps, m, ctx, 5, 4)


@points(1, part="beam_search")
def test_beam_matches_reference(learner, reference, rng):
    """With a beam of 3 on larger vocabularies, and with other sos/eos ids, are the outputs the reference's?"""
    for V, max_len, sos, eos, mistake in ((7, 4, SOS, EOS, "refill"), (8, 4, SOS, EOS, "compete"),
                                          (7, 4, 4, 3, "unsorted")):
        m, src = _beam_model(reference, rng, V, max_len, sos=sos, eos=eos, out_scale=1.5 + (mistake == "unsorted") / 2,
                             beam_size=3, best_not_greedy=False, shows=(mistake,))
        m.load(learner)
        ctx = _usable(m, src.unsqueeze(0), "beam_search")
        special = {} if (sos, eos) == (SOS, EOS) else {"sos": sos, "eos": eos}
        hyps = _hyps(learner.beam_search(m.enc, m.dec, src, 3, max_len, **special), 3)
        _expect_beam(hyps, m, ctx, 3, max_len, sos, eos, special=bool(special))


@points(0.5, part="beam_search")
def test_beam_runs_on_any_device(learner, reference, rng, devices):
    """Does beam_search run on every device (a GPU too), creating its tensors on the input's device?"""
    for device in devices:
        m, src = _beam_model(reference, rng, 6, 4, out_scale=2.0, beam_size=3, best_not_greedy=False, hides=POLICIES)
        m.to(device).load(learner)
        src = src.to(device)
        ctx = _usable(m, src.unsqueeze(0), "beam_search")
        _expect_beam(_hyps(learner.beam_search(m.enc, m.dec, src, 3, 4), 3), m, ctx, 3, 4)
    _part_on_meta(learner, m, "beam_search", src.cpu(), 3, 4)
