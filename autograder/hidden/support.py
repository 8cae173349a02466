"""The hidden-test toolkit: what every chapter's hidden checks are built from.

A chapter's hidden tests should be its checks and its table of typical mistakes, nothing
else. This module gives them:

* points and hints: `points`, `Hint`, `expect`;
* validating what the learner returned: `tensor`, `array`, `pair` (a wrong type or shape
  becomes a hint, never a crash in our code);
* comparing with dtype- and device-aware tolerances: `tolerances`, `close`;
* explaining a wrong result by the typical mistake it matches: `diagnose`, `expect_close`;
* gradients: `learner_grads`, `reference_grads`, `expect_grads`, and `vjp` (torch.autograd.grad
  with output gradients, without its first-use cost);
* modules that hold the reference's weights: `learner_module`;
* masks, including fully masked rows: `random_mask`;
* devices: `devices` (every available one), `expect_device_agnostic` (code that would
  fail on a GPU is caught on a CPU-only grader, through the meta device), and the half
  precision dtypes `HALF`.

A failed check must raise `Hint` (through `expect`) or let a learner-side error
(`LearnerError`, `NotImplementedRemote`...) propagate. Any other exception is a bug in
the hidden test: the grader reports it as a grader error, never as the learner's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from autograder.isolation.errors import LearnerError, NotImplementedRemote
from autograder.isolation.remote import GradResult
from autograder.isolation.runner import RemoteObject

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, torch.float64)


class Hint(AssertionError):
    """A failed check; the message is shown to the learner, so it names a mistake only."""


@dataclass(frozen=True)
class Points:
    n: float
    part: str


def points(n: float, part: str):
    """Mark a hidden test as worth `n` points of the exercise part `part`."""
    def mark(fn):
        fn.points = Points(float(n), part)
        return fn
    return mark


def prepared(setup):
    """Mark a hidden test whose first work needs neither the learner nor the checks before it (a search for
    inputs with the reference alone), so that the grader may do it ahead, in a thread, while it waits for the
    learner's worker (`autograder.grading.ahead`). ``setup(reference)`` returns ``work(rng)``; the check takes the
    fixture ``prepared``, the value of ``work`` called with the check's own ``rng``, which the check then gets
    with the work's draws already made, as if it had done the work itself first. `work` must use `rng` and what
    `setup` made alone: no global generator (module constructors draw from it: build modules in `setup`), no
    global torch setting."""
    def mark(fn):
        fn.prepare = setup
        return fn
    return mark


def expect(condition, hint: str) -> None:
    """Fail the check with `hint` unless `condition` holds."""
    if not bool(condition):
        raise Hint(hint)


# --- what the learner returned ----------------------------------------------------------------

def _dev_type(device) -> str:
    return torch.device(device).type if device is not None else "cpu"


PLAIN = (torch.Tensor, torch.nn.Parameter)


def odd_tensor(x, *, meta: bool = False) -> str:
    """What makes the tensor `x` unusable as data (the hint's words), or "" for a plain dense tensor
    with storage; `meta`: a tensor on the meta device is what the check asked for."""
    if type(x) not in PLAIN:
        return f"a tensor subclass ({type(x).__name__[:40]})"
    if x.is_nested:
        return "a nested tensor"
    if x.is_quantized:
        return "a quantised tensor"
    if x.layout != torch.strided:
        return f"a sparse tensor ({str(x.layout).replace('torch.', '')})"
    if x.device.type == "meta" and not meta:
        return "a tensor without data (on the meta device)"
    return ""


def describe(x) -> str:
    """A value the learner returned, as a hint names it: its type, and a tensor's dtype and device."""
    if isinstance(x, torch.Tensor):
        return odd_tensor(x) or f"a {str(x.dtype).replace('torch.', '')} tensor on {x.device.type}"
    if isinstance(x, np.ndarray):
        return f"a NumPy array of {x.dtype}"
    if x is None:
        return "None"
    name = type(x).__name__[:40]
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def tensor(x, name: str, *, shape=None, dtype=None, device=None, what: str = "its result", floating: bool = False,
           meta: bool = False):
    """`x` as a plain torch tensor with data, of the given shape, dtype and device type, or a hint
    saying what is off. A tensor without data (meta device) passes only where `device` is "meta"
    or `meta` is true (the result of a device check); a sparse, nested, quantised or subclassed
    one never does. `floating`: a floating-point dtype, whatever its width, where no `dtype` is
    asked for."""
    expect(isinstance(x, torch.Tensor), f"`{name}` must return {what} as a torch tensor, not {describe(x)}.")
    odd = odd_tensor(x, meta=meta or (device is not None and _dev_type(device) == "meta"))
    expect(not odd, f"`{name}` returns {what} as {odd}: return a plain dense tensor.")
    if shape is not None:
        expect(tuple(x.shape) == tuple(shape), f"`{name}` returns {what} of shape {tuple(x.shape)}; "
                                               f"expected {tuple(shape)}.")
    if dtype is not None:
        expect(x.dtype == dtype, f"`{name}` changes the dtype of {what}: {dtype} in, {x.dtype} out.")
    if floating and dtype is None:
        expect(x.is_floating_point(), f"`{name}` returns {what} as {describe(x)}: a floating-point tensor is expected.")
    if device is not None:
        expect(x.device.type == _dev_type(device),
               f"`{name}` returns {what} on {x.device.type}, not on its inputs' device ({_dev_type(device)}): "
               "create no tensor on a fixed device.")
    return x


def array(x, name: str, *, shape=None, what: str = "its result"):
    """`x` as a NumPy array of the given shape, or a hint."""
    expect(isinstance(x, np.ndarray), f"`{name}` must return {what} as a NumPy array, not {describe(x)}.")
    if shape is not None:
        expect(tuple(x.shape) == tuple(shape), f"`{name}` returns {what} of shape {tuple(x.shape)}; "
                                               f"expected {tuple(shape)}.")
    return x


def pair(result, name: str, n: int = 2, what: str = "a pair (output, weights)"):
    """`result` as a tuple of `n` items, or a hint."""
    expect(isinstance(result, (tuple, list)) and len(result) == n, f"`{name}` must return {what}.")
    return tuple(result)


# --- comparing ------------------------------------------------------------------------------

def tolerances(dtype, device="cpu") -> tuple[float, float]:
    """(rtol, atol) for comparing a result of `dtype` computed on `device` with an exact one."""
    if dtype in (torch.float64, np.float64, torch.complex128):
        return 1e-7, 1e-9
    if dtype == torch.bfloat16:
        return 3e-2, 3e-2
    if dtype in (torch.float16, np.float16):
        return 5e-3, 5e-3
    if _dev_type(device) == "cuda":
        return 2e-3, 2e-3  # TF32 matmuls may be on
    return 1e-4, 1e-5


def _as_tensor(x):
    """`x` as a plain tensor with data, or None where it is not one (a meta, sparse, nested,
    quantised or subclassed tensor, an array of a dtype torch does not take, anything else)."""
    if isinstance(x, torch.Tensor):
        return None if odd_tensor(x) else x
    if isinstance(x, np.ndarray) and x.dtype != object:
        try:
            return torch.from_numpy(np.ascontiguousarray(x))
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def broadcast_shape(*shapes) -> tuple:
    """The shape that `shapes` broadcast to, as torch.broadcast_shapes gives it, or a RuntimeError where they do
    not. Plain Python: torch.broadcast_shapes imports PyTorch's symbolic shapes and SymPy on its first call (a third
    of a second of a check)."""
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for shape in shapes:
        for i, d in enumerate(tuple(shape)[::-1]):
            d = int(d)
            if d < 0:
                raise RuntimeError(f"shape {tuple(shape)} has a negative size")
            j = n - 1 - i
            if out[j] == 1:
                out[j] = d
            elif d != 1 and d != out[j]:
                raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
    return tuple(out)


def close(actual, expected, device=None, rtol=None, atol=None, equal_nan=False) -> bool:
    """True when `actual` is a tensor/array of `expected`'s shape, allclose to it.

    Tolerances follow `expected`'s dtype (pass the reference's result cast to a half type to
    compare a half-precision result) and the device; booleans and integers must be equal.
    Either may be a value the learner returned (a property check compares two of them): what
    is not a plain tensor or array with data is simply not close."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    if a is None or e is None or tuple(a.shape) != tuple(e.shape):
        return False
    a, e = a.detach().cpu(), e.detach().cpu()
    if not (a.is_floating_point() or a.is_complex()) or not (e.is_floating_point() or e.is_complex()):
        return a.dtype == e.dtype and bool(torch.equal(a, e))
    r, t = tolerances(e.dtype, device or "cpu")
    wide = torch.complex128 if (a.is_complex() or e.is_complex()) else torch.float64
    return bool(torch.allclose(a.to(wide), e.to(wide), rtol=r if rtol is None else rtol,
                               atol=t if atol is None else atol, equal_nan=equal_nan))


def diagnose(got, mistakes, generic: str, *, same=None) -> str:
    """The hint of the first typical mistake whose result `got` matches, else `generic`.

    `mistakes` is a sequence of (hint, result) pairs, where result is a value or a
    zero-argument callable computed only when needed (and None to skip that mistake).
    Building a mistake's result is our code: if it raises, that is a grader bug and it
    propagates (it is never taken for "no match")."""
    same = same or (lambda a, b: close(a, b, rtol=1e-3, atol=1e-4))
    for hint, wrong in mistakes:
        value = wrong() if callable(wrong) else wrong
        if value is not None and same(got, value):
            return hint
    return generic


def expect_close(got, expected, generic: str, *, mistakes=(), device=None, rtol=None, atol=None, same=None):
    """Pass when `got` is close to `expected`; otherwise fail with the matching mistake's hint."""
    if not close(got, expected, device, rtol=rtol, atol=atol):
        raise Hint(diagnose(got, mistakes, generic, same=same))


# --- randomness -----------------------------------------------------------------------------

def random_mask(rng: torch.Generator, shape, p_keep: float = 0.7, fully_masked: int = 0) -> torch.Tensor:
    """A boolean mask (True = may attend) with at least one True in every row of the last axis,
    except `fully_masked` randomly chosen rows that are entirely False, and at least one False
    wherever a row has room for it: a mask that hides nothing would let a learner's code that
    ignores the mask pass a check of masking (small shapes draw one now and then)."""
    m = torch.rand(*shape, generator=rng) < p_keep
    first = torch.zeros(shape, dtype=torch.bool)
    first[..., 0] = True
    m = m | (first & ~m.any(-1, keepdim=True))
    if bool(m.all()) and shape[-1] > 1:
        flat = m.reshape(-1)
        flat[int(torch.randint(0, flat.numel(), (1,), generator=rng))] = False
        m = flat.reshape(shape)
    if fully_masked:
        rows = m.reshape(-1, shape[-1])
        pick = torch.randperm(rows.shape[0], generator=rng)[:fully_masked]
        rows[pick] = False
        m = rows.reshape(shape)
    return m


# --- gradients ------------------------------------------------------------------------------

NOT_DIFFERENTIABLE = ("`{}`'s result carries no gradient: is something detached, or computed outside "
                      "PyTorch (NumPy, .item(), .data, a Python float)?")


def learner_grads(learner, target, *args, cotangents, what: str = "", params: bool = False, **kwargs) -> GradResult:
    """`learner.with_grad(...)`, failing with a clear hint when the result carries no gradient."""
    try:
        return learner.with_grad(target, *args, cotangents=cotangents, params=params, **kwargs)
    except LearnerError as exc:
        if "does not depend differentiably" in exc.message:
            raise Hint(NOT_DIFFERENTIABLE.format(what or exc.name)) from None
        raise


def vjp(outputs, inputs, cotangents, *, allow_unused: bool = False) -> tuple:
    """`torch.autograd.grad(outputs, inputs, cotangents)`, computed as the gradients of
    sum(o * g): the same numbers to the last bit (the product's own gradient is g * 1), without
    the symbolic-shape machinery that given output gradients import on their first use (0.3 s
    of a learner's check). The worker computes the learner's gradients the same way."""
    outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    cotangents = tuple(cotangents) if isinstance(cotangents, (tuple, list)) else (cotangents,)
    if len(outputs) != len(cotangents):
        raise ValueError(f"{len(outputs)} outputs but {len(cotangents)} cotangents")
    total = 0
    for o, g in zip(outputs, cotangents):
        if o.shape != g.shape:
            raise ValueError(f"cotangent of shape {tuple(g.shape)} for an output of shape {tuple(o.shape)}")
        total = total + (o * g.to(o.device, o.dtype)).sum()
    return torch.autograd.grad(total, inputs, allow_unused=allow_unused)


def reference_grads(fn, args, cotangents, **kwargs) -> list:
    """Gradients of sum(out_i * g_i) with respect to each floating tensor in `args` (None for the others)."""
    args = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a for a in args]
    out = fn(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    pairs = [(o, g) for o, g in zip(outs, cotangents) if g is not None]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = vjp([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    it = iter(grads)
    return [next(it) if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args]


def expect_grads(got, expected, names, *, device=None, hint: str = ""):
    """Each gradient present, finite where the reference's is, and close to it."""
    for name, g, e in zip(names, got, expected):
        if e is None:
            continue
        expect(g is not None, f"No gradient reaches {name}: is something detached, or computed outside "
                              "PyTorch (NumPy, .item(), .data, a Python float)?")
        tensor(g, "the gradient", what=f"the gradient with respect to {name}")
        expect(not torch.isnan(g).any() or torch.isnan(e).any(),
               f"The gradient with respect to {name} contains NaN: a masked -inf reached the backward pass "
               "(fill with -inf and fix the result afterwards, e.g. with nan_to_num, still back-propagates NaN).")
        expect(close(g, e, device), hint or f"The gradient with respect to {name} differs from the reference's.")


# --- modules --------------------------------------------------------------------------------

def module(h, name: str):
    """`h`, what the learner's `name(...)` returned, as a handle to the module it built, or a hint."""
    expect(isinstance(h, RemoteObject), f"`{name}(...)` must build a module, not return {describe(h)}.")
    return h


def learner_builtins(learner, hint: str):
    """The builtins module of the learner's process (through its torch), as a handle, or `hint`."""
    builtins = learner.attribute("torch", "builtins")
    expect(isinstance(builtins, RemoteObject), hint)
    return builtins


def made_in_learner(learner, expression: str, hint: str, builtins=None, **names):
    """The value of `expression` evaluated in the learner's process, with its own builtins and `names` (a check
    cannot send a function there: a recorder or a wrapper is made there from source), or `hint` where the
    notebook's torch no longer leads to them."""
    builtins = builtins if builtins is not None else learner_builtins(learner, hint)
    # (globals that hold __builtins__ already: eval leaves them as they are, an argument it does not change)
    return method(builtins, "eval", "builtins")(expression, {"__builtins__": builtins, **names})


def method(h, attr: str, name: str = ""):
    """The method `attr` of the learner's object `h` (a handle), or a hint when it is not one.
    (torch.nn.Module's own methods, such as eval or to, are checked this way by the proxy itself.)"""
    return _member(h, (attr,), "a method", name)


def submodule(h, *path: str, name: str = ""):
    """The learner's submodule `h.path[0].path[1]...` (a handle), or a hint when one step is not a module."""
    return _member(h, path, "a module", name)


def _member(h, path, what: str, name: str):
    label = name or getattr(h, "_label", "the object")
    for attr in path:
        h = getattr(h, attr)
        label = f"{label}.{attr}"
        expect(isinstance(h, RemoteObject), f"`{label}` must be {what}, not {describe(h)}.")
    return h


def learner_module(learner, class_name: str, ref_module: torch.nn.Module, *args, **kwargs):
    """The learner's `class_name(*args, **kwargs)`, holding `ref_module`'s weights (a remote handle).

    Fails with a hint when the learner's parameters do not have the reference's names and shapes. The weights
    are loaded at once (strictly, as `load_state_dict` does by default); only where that fails is the learner's
    state dict read, to say which name or shape is wrong (reading it first took a quarter of the time a module
    of chapter 06 took to build, on every module)."""
    h = module(getattr(learner, class_name)(*args, **kwargs), class_name)
    ref_sd = ref_module.state_dict()
    try:
        h.load_state_dict({k: v.detach().clone() for k, v in ref_sd.items()})
    except LearnerError:
        _state_dict_fits(h, class_name, ref_sd)
        raise  # names and shapes are right: the learner's load_state_dict fails otherwise
    return h


def _state_dict_fits(h, class_name: str, ref_sd: dict) -> None:
    """A hint where the learner's module `h` has other parameter names or shapes than `ref_sd`."""
    sd = h.state_dict()
    expect(isinstance(sd, dict), f"`{class_name}`'s state_dict() is not a dict of tensors.")
    missing = sorted(set(ref_sd) - set(sd))
    extra = sorted(set(sd) - set(ref_sd))
    expect(not missing and not extra,
           f"`{class_name}` has other parameters than the exercise asks for"
           + (f"; missing: {', '.join(missing[:5])}" if missing else "")
           + (f"; unexpected: {', '.join(str(x)[:40] for x in extra[:5])}" if extra else "")
           + ". Keep the names the locked base class creates.")
    for k, v in ref_sd.items():
        expect(isinstance(sd[k], torch.Tensor) and tuple(sd[k].shape) == tuple(v.shape),
               f"`{class_name}`'s parameter {k} has the wrong shape: expected {tuple(v.shape)}.")


# --- devices --------------------------------------------------------------------------------

def devices() -> list[str]:
    """Every device the grader can run a check on: the CPU, and CUDA where present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def to_meta(value):
    """`value` with every tensor replaced by an empty tensor of the same shape and dtype on the meta device."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: to_meta(v) for k, v in value.items()}
    return value


def _leaves(value):
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


DEVICE_ERRORS = ("on the same device", "not at the same device",  # the latter: nn.GRU/nn.LSTM's own check
                 "is not on the expected device", "can't convert meta device type tensor")
FIXED_DEVICE_HINT = ("`{}` would fail on a GPU: it mixes its inputs with a tensor created on the CPU "
                     "(torch.zeros, torch.ones, torch.full, torch.arange or torch.tensor without device=, or "
                     ".numpy()/.cpu()). "
                     "Create tensors on the inputs' device (device=x.device, torch.zeros_like, x.new_zeros) or use "
                     "Python numbers.")


def expect_device_agnostic(learner, target, *args, **kwargs):
    """Fail when the learner's code would fail, or leave the inputs' device, on a GPU.

    The call runs with every tensor argument moved to PyTorch's meta device (shapes and
    dtypes, no data) and every operation that mixes a meta tensor with a CPU tensor of
    one or more dimensions failing, as CUDA does: a CPU-only grader sees what a GPU would
    (0-dim CPU tensors mix with CUDA ones and pass here too). Code the meta device cannot
    run (data-dependent steps such as .item() or `if mask.any():`) gets no verdict and
    passes. Run a value check first: this one does not look at values."""
    name = target if isinstance(target, str) else getattr(target, "_label", "the function")
    return _device_verdict(learner, target, to_meta(list(args)), to_meta(kwargs), FIXED_DEVICE_HINT.format(name),
                           f"`{name}` returns a result on {{}} whatever its inputs' device: create tensors "
                           "on the inputs' device and do not call .cpu() on the result.")


def expect_accepts_cpu_tail(learner, target, on_gpu, on_cpu, hint: str):
    """`target(*on_gpu, *on_cpu)` with `on_gpu` on the meta device (a GPU, as `expect_device_agnostic`
    sees one) and `on_cpu` left on the CPU, as callers leave lengths or positions: fail with `hint`
    when the call mixes the devices or leaves the GPU."""
    return _device_verdict(learner, target, [*to_meta(list(on_gpu)), *on_cpu], {}, hint, hint)


def _device_verdict(learner, target, args, kwargs, hint: str, left_hint: str):
    try:
        out = learner.device_checked(target, *args, **kwargs)
    except LearnerError as exc:
        expect(not any(s in exc.message for s in DEVICE_ERRORS), hint)
        return None  # something the meta device cannot run: no verdict
    except NotImplementedRemote:
        return None  # e.g. copying data out of a meta tensor: no verdict
    for t in _leaves(out):
        if isinstance(t, torch.Tensor):
            expect(t.device.type == "meta", left_hint.replace("{}", t.device.type))
    return out
