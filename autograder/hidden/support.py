"""What hidden tests use to award points and explain failures."""

from __future__ import annotations

import numpy as np
import pytest
import torch


class Hint(AssertionError):
    """A failed check; the message is shown to the learner, so it names a mistake only."""


def points(n: float, part: str):
    """Mark a hidden test as worth `n` points of the exercise part `part`."""
    return pytest.mark.points(n, part=part)


def expect(condition, hint: str) -> None:
    """Fail the check with `hint` unless `condition` holds."""
    if not bool(condition):
        raise Hint(hint)


def _as_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    return None


def tolerances(dtype, device="cpu"):
    """(rtol, atol) for comparing results of `dtype` computed on `device`."""
    if dtype in (torch.float64, np.float64):
        return 1e-7, 1e-9
    if str(device).startswith("cuda"):
        return 2e-3, 2e-3  # TF32 matmuls may be on
    return 1e-4, 1e-5


def close(actual, expected, device="cpu", rtol=None, atol=None) -> bool:
    """True when `actual` is a tensor/array of `expected`'s shape with values allclose to it."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    if a is None or e is None or tuple(a.shape) != tuple(e.shape):
        return False
    a, e = a.detach().cpu(), e.detach().cpu()
    if a.dtype == torch.bool or e.dtype == torch.bool:
        return a.dtype == e.dtype and bool(torch.equal(a, e))
    r, t = tolerances(e.dtype, device)
    return bool(torch.allclose(a.to(torch.float64), e.to(torch.float64),
                               rtol=r if rtol is None else rtol, atol=t if atol is None else atol))
