"""Round three, class 3: values the learner's functions return that lie about what they are.

The worker is the learner's: a notebook can replace its encoder (`sys.modules["protocol"].encode`)
and so send back, for any call, any value the protocol's schema accepts, or hand the honest
encoder tensors no check expects. `ATTACK` does both from the top level of a correct notebook:
every other reply becomes the next kind of `KINDS`, in turn, so that one notebook shows every
chapter's checks each kind at different places. Whatever comes back, a check may fail (with a
hint naming what came back) but never crash in the grader (`grader_error`).

`build` adds this chapter's (03) version to the sandboxed adversarial batch; the test module
`tests/end_to_end/test_adversarial_values.py` grades every chapter's version.
"""

from __future__ import annotations

from conftest import add_cell, reference_notebook

KEY = "03_qkv"

# The kinds, in the order the attack cycles through them (the names are what the tests look for).
KINDS = ("meta", "cuda0", "mps", "meta_with_data", "cuda7", "float16", "bfloat16", "float64", "complex", "bool",
         "int64", "zero_d", "empty", "extra_dim", "nested_list", "dict", "none", "string", "handle", "nan",
         "sparse", "nested", "quantised", "subclass", "no_storage", "huge_int", "dtype_lie")

ATTACK = '''
import sys as _sys
import torch as _torch

_P = _sys.modules["protocol"]
_honest = _P.encode
_state = {"n": 0}
_KINDS = KINDS_HERE


class _Lying(_torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def _no_storage(t):
    t = t.detach().clone()
    t.untyped_storage().resize_(0)
    return t


_LEAF = {
    "meta": lambda t: _torch.empty(t.shape, dtype=t.dtype, device="meta"),
    "float16": lambda t: t.to(_torch.float16),
    "bfloat16": lambda t: t.to(_torch.bfloat16),
    "float64": lambda t: t.to(_torch.float64),
    "complex": lambda t: t.to(_torch.complex64),
    "bool": lambda t: t != 0,
    "int64": lambda t: t.long(),
    "zero_d": lambda t: t.sum(),
    "empty": lambda t: t.reshape(-1)[:0],
    "extra_dim": lambda t: t.unsqueeze(0),
    "nan": lambda t: _torch.full_like(t, float("nan")) if t.is_floating_point() else t,
    "sparse": lambda t: t.to_sparse() if t.dim() else t,
    "nested": lambda t: _torch.nested.nested_tensor([t.detach()]) if t.dim() else t,
    "quantised": lambda t: _torch.quantize_per_tensor(t.detach().float(), 0.1, 0, _torch.qint8),
    "subclass": lambda t: t.as_subclass(_Lying),
    "no_storage": _no_storage,
}
_WHOLE = {"nested_list": lambda v: [[v]], "dict": lambda v: {"out": v}, "none": lambda v: None,
          "string": lambda v: "nan", "handle": lambda v: object()}
_DEVICE = {"cuda0": "cuda:0", "mps": "mps", "meta_with_data": "meta", "cuda7": "cuda:7"}


def _leaves(v, fn):
    if isinstance(v, _torch.Tensor):
        return fn(v)
    if type(v) in (tuple, list):
        return type(v)(_leaves(x, fn) for x in v)
    if type(v) is dict:
        return {k: _leaves(x, fn) for k, x in v.items()}
    return v


def _forge(obj, fn):
    """The encoded value with fn applied to each tensor's payload."""
    if type(obj) is list:
        return [_forge(x, fn) for x in obj]
    if type(obj) is dict and len(obj) == 1:
        (tag, val), = obj.items()
        if tag == "__tensor__":
            return {tag: fn(val)}
        if tag == "__tuple__":
            return {tag: [_forge(x, fn) for x in val]}
        if tag == "__dict__":
            return {tag: [[k, _forge(x, fn)] for k, x in val]}
    return obj


def _encode(obj, to_handle=None, depth=0, max_depth=32):
    if depth:
        return _honest(obj, to_handle, depth, max_depth)
    _state["n"] += 1
    if _state["n"] % 2:
        return _honest(obj, to_handle, depth, max_depth)
    kind = _KINDS[(_state["n"] // 2) % len(_KINDS)]
    if kind in _LEAF:
        return _honest(_leaves(obj, _LEAF[kind]), to_handle, depth, max_depth)
    if kind in _WHOLE:
        return _honest(_WHOLE[kind](obj), to_handle, depth, max_depth)
    out = _honest(obj, to_handle, depth, max_depth)
    if kind in _DEVICE:
        return _forge(out, lambda p: dict(p, device=_DEVICE[kind]))
    if kind == "dtype_lie":
        return _forge(out, lambda p: dict(p, dtype="float16" if p["dtype"] != "float16" else "int64"))
    if kind == "huge_int":
        return 2 ** 80
    return out


_P.encode = _encode
'''


def attack_cell() -> str:
    return ATTACK.replace("KINDS_HERE", repr(KINDS))


def notebook(key: str):
    """The reference notebook of `key` with the attack added at its end."""
    return add_cell(reference_notebook(key), attack_cell())


def build(ctx) -> None:
    ctx.nbs["values_cycle"] = notebook(KEY)
