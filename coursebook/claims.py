"""The book's checked claims: what the prose says about a trained or measured result.

A page states a result ("at length 24, attention is ahead by ...") and then checks it on
the run that the build just made::

    claim("02/attention-minus-plain-24", gap, ">", 0.4)

``claim`` compares one measured number with one threshold. When the comparison holds it
returns nothing; when it fails it raises :class:`ClaimFailed`, whose message is one line
with the claim's name, the measured value, the threshold and the machine, so that a
reader whose build stops can report exactly what their machine measured.

Trained and timed results differ between processors and library builds (floating-point
sums run in another order, another kernel is chosen, the machine is busy), so a threshold
is never set just under one machine's value. Each claim's spread is measured by
``benchmarks/claims.py``, which reruns every page with its seeds shifted and prints each
claim's value per seed, its threshold and its margin; the thresholds leave room for all
of them.

With the environment variable ``COURSE_CLAIMS_LOG`` set to a file, ``claim`` appends one
JSON line per claim to it and does not raise, so that one run reports every claim of a
page; ``benchmarks/claims.py`` uses this.
"""

from __future__ import annotations

import json
import math
import os
import platform

import torch

__all__ = ["ClaimFailed", "claim", "deterministic", "machine"]

OPS = {
    ">": lambda value, threshold: value > threshold,
    ">=": lambda value, threshold: value >= threshold,
    "<": lambda value, threshold: value < threshold,
    "<=": lambda value, threshold: value <= threshold,
}


class ClaimFailed(AssertionError):
    """A result the prose relies on did not hold on this machine."""


def machine() -> str:
    """The build's processor and PyTorch, for the numbers a page prints."""
    cpu = platform.processor() or platform.machine()
    return f"torch {torch.__version__}, {platform.system()} {cpu}, {torch.get_num_threads()} thread(s)"


def margin(value: float, op: str, threshold: float) -> float:
    """How far the value is on the right side of the threshold (negative: failed)."""
    return value - threshold if op in (">", ">=") else threshold - value


def claim(name: str, value, op: str, threshold: float) -> None:
    """Check ``value OP threshold`` for the claim ``name``.

    ``value`` is a number (a Python or NumPy scalar, a one-element tensor, a bool).
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)}, not {op!r}")
    number = float(value.item() if hasattr(value, "item") else value)
    holds = not math.isnan(number) and OPS[op](number, threshold)
    log = os.environ.get("COURSE_CLAIMS_LOG")
    if log:
        record = {"name": name, "value": number, "op": op, "threshold": threshold,
                  "holds": holds, "margin": margin(number, op, threshold)}
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return
    if not holds:
        raise ClaimFailed(
            f"claim {name!r} does not hold on this machine: measured {number:.6g}, "
            f"the text needs {op} {threshold:g} ({machine()}). "
            "Please report this line as an issue of the course's repository.")


def deterministic(threads: int = 1) -> None:
    """One thread and PyTorch's deterministic algorithms: a page's results repeat bit for
    bit on one machine and one PyTorch build (not across processors: see ``claim``)."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
