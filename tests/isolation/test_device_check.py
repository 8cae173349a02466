"""The device check that stands in for a GPU on a CPU-only grader, and the gradients the checks compare.

The device check (`autograder/isolation/device_check.py`, `device_check_mode`) runs a learner's call with its
tensors on PyTorch's meta device, fails every operation that mixes them with a CPU tensor as
CUDA does, and computes each operation on CPU stand-ins instead of the meta device's kernels
(many are written in Python, and the first of them imports PyTorch's compiler: 0.7 s of every
check). Its oracles: the meta device's own kernels for what each operation returns, CUDA's
rule for what mixes, and `torch.autograd.grad` for the gradients."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from autograder.hidden.support import vjp
from autograder.isolation.errors import LearnerError
from autograder.isolation.remote import Learner
from autograder.isolation.runner import Submission

from autograder.isolation.device_check import device_check_mode
from conftest import ROOT

META = torch.device("meta")


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device=META)


def _checked(fn, *args, **kwargs):
    with device_check_mode()():
        return fn(*args, **kwargs)


x, y, w = _meta(2, 5, 8), _meta(2, 5, 8), _meta(4, 8)
mask = _meta(2, 1, 5, dtype=torch.bool)
tokens = _meta(2, 5, dtype=torch.long)
table = _meta(10, 8)

OPS = {
    "linear": lambda: F.linear(x, w, _meta(4)),
    "scaled scores": lambda: (x @ y.transpose(-1, -2)) / math.sqrt(8),
    "masked softmax": lambda: torch.softmax((x @ y.mT).masked_fill(~mask, float("-inf")), -1),
    "layer norm": lambda: F.layer_norm(x, (8,)),
    "embedding": lambda: F.embedding(tokens, table),
    "cat and stack": lambda: torch.stack([torch.cat([x, y], -1), torch.cat([y, x], -1)]),
    "contiguous transpose": lambda: x.transpose(0, 1).contiguous(),
    "reductions": lambda: (x.sum(-1), x.mean(1, keepdim=True), x.amax(-1, keepdim=True)),
    "argmax": lambda: x.argmax(-1),
    "where": lambda: torch.where(mask, x @ y.mT, 0.0),
    "tril of ones on the device": lambda: torch.ones(5, 5, dtype=torch.bool, device=x.device).tril(),
    "arange and zeros on the device": lambda: (torch.arange(5, device=x.device), torch.zeros(2, 3, device=x.device)),
    "new_full and ones_like": lambda: (x.new_full((3, 1), -math.inf), torch.ones_like(tokens)),
    "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(x[:, None], y[:, None], y[:, None],
                                                                          is_causal=True),
    "gather": lambda: torch.gather(x, -1, _meta(2, 5, 1, dtype=torch.long)),
    "expand and broadcast": lambda: x[:, :1].expand(2, 5, 8) * y,
    "cumsum and divide": lambda: x.cumsum(1) / 3,
    "cross entropy": lambda: F.cross_entropy(x.reshape(10, 8), tokens.reshape(10)),
    "dropout in training": lambda: F.dropout(x, 0.3, training=True),
    "index with a CPU long tensor": lambda: x[:, torch.tensor([0, 2])],
    "index_put with a CPU index": lambda: x.clone().index_put_((torch.tensor([1]),), _meta(5, 8)),
    "a view that keeps an offset": lambda: x[:, 1:].unflatten(-1, (2, 4)).permute(0, 2, 1, 3),
}


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", OPS)
def test_results_are_what_the_meta_devices_own_kernels_give(name):
    expected, got = _flat(OPS[name]()), _flat(_checked(OPS[name]))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.device == META, name
        assert (g.shape, g.dtype) == (e.shape, e.dtype), name
        if e.is_contiguous():
            assert g.is_contiguous(), name


@pytest.mark.parametrize("fn", [
    lambda: x + torch.ones(8),                              # a CPU vector
    lambda: x @ torch.ones(8, 3),                           # missed by the meta device's own matmul
    lambda: torch.gather(x, -1, torch.zeros(2, 5, 1, dtype=torch.long)),
    lambda: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).tril()[:, :1].expand(5, 8), 0.0),
    lambda: torch.cat([tokens, torch.full((2, 1), 3)], 1),  # a decoder's <sos> made on the CPU
])
def test_mixing_with_a_cpu_tensor_fails_as_on_cuda(fn):
    with pytest.raises(RuntimeError, match="same device"):
        _checked(fn)


def test_what_cuda_accepts_from_the_cpu_is_accepted():
    out = _checked(lambda: (x * torch.tensor(2.0), x[:, torch.tensor([1, 3])], torch.ones(3).to(x.device),
                            x.new_zeros(3).copy_(torch.ones(3))))
    assert all(t.device == META for t in out)


def test_in_place_operations_return_the_callers_tensor():
    a, b, o = _meta(3, 4), _meta(3, 4), _meta(3, 4)
    assert _checked(lambda: a.add_(b)) is a
    assert _checked(lambda: a.masked_fill_(_meta(3, 4, dtype=torch.bool), 0.0)) is a
    assert _checked(lambda: torch.add(a, b, out=o)) is o
    assert _checked(lambda: a.unsqueeze_(0)) is a and a.shape == (1, 3, 4)
    assert _checked(lambda: a.resize_(5, 2)) is a and a.shape == (5, 2)


@pytest.mark.parametrize("fn", [
    lambda: x.sum().item(),
    lambda: bool((tokens == 2).all()),
    lambda: (x @ y.mT)[mask.expand(2, 5, 5)],
    lambda: torch.nonzero(tokens),
])
def test_steps_that_need_values_raise_not_implemented_as_on_the_meta_device(fn):
    with pytest.raises(NotImplementedError):
        _checked(fn)


CODE = '''
import sys
import torch
import torch.nn.functional as F

def attend(q, k, v, mask):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool, device=q.device).tril(), -1e9)
    return F.dropout(torch.softmax(s.masked_fill(~mask, -1e9), -1), 0.5, training=True) @ v

def fixed(q):
    return q + torch.ones(q.shape[-1])

def draw():
    return torch.rand(4)

def two(a, b):
    h = torch.tanh(a @ b)
    return h, (h * a.sum()).cumsum(-1)

def padded():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)  # training mode: MultiheadAttention's checks
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[0, 2] = True
    return list(layer(torch.randn(2, 3, 8), src_key_padding_mask=mask).shape)

def loaded():
    return sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules)
'''


@pytest.fixture(scope="module")
def learner():
    with Submission([{"label": "cell 1", "source": CODE}]) as sub:
        yield Learner(sub), sub


def test_a_device_checked_call_runs_without_the_compiler_or_sympy(learner):
    lrn, _ = learner
    q = torch.empty(2, 3, 4, device=META)
    out = lrn.device_checked("attend", q, q, q, torch.empty(2, 1, 3, dtype=torch.bool, device=META))
    assert out.device == META and out.shape == (2, 3, 4)
    with pytest.raises(LearnerError, match="same device"):
        lrn.device_checked("fixed", q)
    a, b = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    lrn.with_grad("two", a, b, cotangents=(torch.ones(3, 3, dtype=torch.float64),) * 2)
    assert lrn.padded() == [2, 3, 8]
    # the worker's one-time set-up and these calls (a Transformer layer given a padding mask too) left
    # PyTorch's compiler and SymPy unimported
    assert lrn.loaded() == []


PLAIN_CHECKS = """
import sys, torch
layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0)
x, mask = torch.randn(2, 3, 8), torch.tensor([[False, False, True], [False, False, False]])
from autograder.isolation.device_check import plain_checks_without_symbolic_shapes
plain_checks_without_symbolic_shapes()
plain_checks_without_symbolic_shapes()  # once only: not wrapped twice
fast = layer(x, src_key_padding_mask=mask)
print("sympy" in sys.modules, torch._check_with.__wrapped__.__name__)
for call in (lambda: torch._check(False, lambda: "a false condition"),
             lambda: layer(x, src_key_padding_mask=mask[:, :2])):
    try:
        call()
    except Exception as exc:
        print(type(exc).__name__, str(exc)[:60])
torch._check_with = torch._check_with.__wrapped__
print(torch.equal(fast, layer(x, src_key_padding_mask=mask)), "sympy" in sys.modules)
"""


def test_pytorchs_checks_on_true_booleans_skip_sympy_and_decide_as_pytorch_does():
    """`torch._check_with` imports the symbolic-shape module and SymPy on its first call (0.35 CPU s of a
    check of exercise 08, whose models give Transformer layers a padding mask). With the course's shortcut,
    as the grader's side runs it, a Transformer layer given a padding mask imports neither, gives PyTorch's
    own output, and a false condition or a mask of the wrong shape raises PyTorch's own error."""
    proc = subprocess.run([sys.executable, "-c", PLAIN_CHECKS], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "False _check_with",
        "RuntimeError a false condition",
        "AssertionError Expected key_padded_mask.shape[1] to be 3, but got 2",
        "True True",  # the same output with PyTorch's own function, which then imports SymPy
    ]


def test_a_device_checked_call_leaves_the_random_numbers_as_they_were(learner):
    lrn, sub = learner
    sub.reseed(7)
    first = lrn.draw()
    sub.reseed(7)
    q = torch.empty(2, 3, 4, device=META)
    lrn.device_checked("attend", q, q, q, torch.empty(2, 1, 3, dtype=torch.bool, device=META))
    assert torch.equal(lrn.draw(), first)


def test_the_workers_gradients_are_autograds_to_the_last_bit(learner):
    lrn, _ = learner
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 4, generator=gen, dtype=torch.float64), torch.randn(4, 4, generator=gen, dtype=torch.float64)
    cot = (torch.randn(4, 4, generator=gen, dtype=torch.float64), torch.randn(4, 4, generator=gen, dtype=torch.float64))
    res = lrn.with_grad("two", a, b, cotangents=cot)
    ar, br = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    h = torch.tanh(ar @ br)
    expected = torch.autograd.grad((h, (h * ar.sum()).cumsum(-1)), (ar, br), cot)
    assert all(torch.equal(g, e) for g, e in zip(res.arg_grads, expected))
    with pytest.raises(LearnerError, match="Mismatch in shape"):
        lrn.with_grad("two", a, b, cotangents=(cot[0][:2], cot[1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vjp_is_autograd_grad_to_the_last_bit(dtype):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3, 5, generator=gen, dtype=dtype, requires_grad=True)
    b = torch.randn(5, 2, generator=gen, dtype=dtype, requires_grad=True)
    outs = (torch.softmax(a @ b, -1), (a.exp() @ b).sum(0))
    cot = tuple(torch.randn(o.shape, generator=gen, dtype=dtype) for o in outs)
    expected = torch.autograd.grad(outs, (a, b), cot, retain_graph=True)
    got = vjp(outs, (a, b), cot)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    with pytest.raises(ValueError):
        vjp(outs, (a, b), cot[:1])
    with pytest.raises(ValueError):
        vjp(outs[0], (a, b), cot[1])
